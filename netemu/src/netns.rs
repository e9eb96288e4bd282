//! Running things inside named network namespaces (the `ip netns` kind, under /run/netns).

use std::ffi::OsStr;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Command;

/// `ip netns exec NS PROGRAM ARGS...` as a [`Command`] ready to spawn.
pub fn command<I, S>(ns: &str, program: impl AsRef<OsStr>, args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).arg(program).args(args);
    c
}

/// The index of network interface `name` in the calling thread's network namespace, or `None`
/// when it has none of that name.
pub fn interface_index(name: &str) -> Option<u32> {
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: a valid NUL-terminated string.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (i != 0).then_some(i)
}

/// Whether the named namespace exists.
pub fn exists(ns: &str) -> bool {
    Path::new("/run/netns").join(ns).exists()
}

/// Moves the calling thread into the named network namespace. Threads spawned afterwards
/// inherit it; sockets opened afterwards belong to it.
pub fn enter(ns: &str) -> io::Result<()> {
    let path = Path::new("/run/netns").join(ns);
    let f = std::fs::File::open(&path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    // SAFETY: setns on a valid namespace file descriptor we own; it only changes this
    // thread's network namespace.
    let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    if r != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("entering network namespace {ns}: {e}"),
        ));
    }
    Ok(())
}

/// Pids of the processes whose network namespace is `ns` (from `ip netns pids`).
pub fn pids(ns: &str) -> Vec<i32> {
    let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}
