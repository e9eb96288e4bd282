//! Small socket calls the socket crates do not wrap.

use std::os::fd::RawFd;

/// setsockopt with an `int` value.
pub(crate) fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> std::io::Result<()> {
    // SAFETY: setsockopt reads one c_int of the size passed from a live local; the caller keeps
    // `fd` open.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &value as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
