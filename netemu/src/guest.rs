//! Lab hosts on a kernel you name: QEMU guests that boot a Linux kernel image, mount the host's
//! `/` read-only over virtio-9p (so the same `mimic`, `tc`, `ip`, `iperf3` run inside) and sit
//! where a lab namespace's veths were.
//!
//! ```text
//!  NAME-cli ── NAME-c ══ NAME-ec ─mirred─ NAME-tc ══ [guest: NAME-ec ─ br0 ─ NAME-es] ══ NAME-ts ─mirred─ NAME-es ══ NAME-s ── NAME-srv
//!                        (in NAME-emu: the veth ends and the guest's taps, redirected both ways)
//! ```
//!
//! * The kernel: any bzImage (checked: the boot-protocol header `HdrS` and the version string
//!   in it). Its modules come from `lib/modules/VERSION` beside it (`IMAGE/../../lib/modules`,
//!   the layout of an extracted Debian package) or from a directory you name.
//!   [`fetch_debian_kernel`] gets Debian's stock kernel with `apt-get download` + `dpkg-deb -x`
//!   into `/var/cache/mimic/kernels/VERSION` (never `/boot`).
//! * The initramfs (built once per kernel version and cached): Debian's static busybox, the
//!   modules the guest needs (virtio, 9p, bridge, sch_netem, sch_htb, cls_u32, ... with their
//!   dependencies from each module's `depends=` field, loaded in dependency order) and a small
//!   `/init` that mounts the host's root, puts tmpfs on `/run` and an overlay (the host's files
//!   below, a tmpfs above) on `/tmp`, and `chroot`s into it
//!   to run `mimic lab guest-agent` as the guest's PID 1.
//! * The command channel: a virtio-serial port (`mimic.agent`) on a unix socket in the lab's
//!   runtime dir; one JSON line per request (argv, timeout) and one per reply (exit status,
//!   stdout, stderr). `mimic lab exec` uses it.
//! * Acceleration: KVM only where a probe boot of the same kernel reaches userspace within a
//!   few seconds (on some machines `/dev/kvm` opens but a guest spins forever); TCG otherwise.
//!   The probe's result is kept for the host's boot (`/run/mimic/accel.json`).

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// The modules the guest loads (with their dependencies), in this order. Those built into the
/// kernel (listed in `modules.builtin`) are skipped.
pub const GUEST_MODULES: &[&str] = &[
    "virtio_pci",
    "virtio_net",
    "virtio_console",
    "9pnet_virtio",
    "9p",
    "bridge",
    "veth",
    "sch_netem",
    "sch_htb",
    "sch_tbf",
    "sch_ingress",
    "cls_u32",
    "cls_flower",
    "cls_matchall",
    "act_mirred",
    "overlay",
];

/// The 9p mount tag of the host's root.
const ROOT_TAG: &str = "mimichost";
/// The virtio-serial port name of the command channel.
pub const AGENT_PORT: &str = "mimic.agent";
/// Marker the probe boot prints when it reaches userspace.
const PROBE_MARK: &str = "MIMIC-GUEST-PROBE-OK";
/// Environment variable naming the QEMU binary (default: `qemu-system-x86_64` on PATH).
pub const QEMU_ENV: &str = "MIMIC_QEMU";
/// Environment variable forcing the accelerator (`kvm` or `tcg`), skipping the probe.
pub const ACCEL_ENV: &str = "MIMIC_QEMU_ACCEL";
/// Root of mimic's caches (kernels, initramfs images).
pub const CACHE_ENV: &str = "MIMIC_CACHE_DIR";
const DEFAULT_CACHE: &str = "/var/cache/mimic";
const BUSYBOX: &str = "/bin/busybox";
const PROBE_TIMEOUT: Duration = Duration::from_secs(6);

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GuestError {
    #[error("{path}: not a Linux kernel image: {why}")]
    NotAKernel { path: String, why: String },
    #[error("{path}: {why}")]
    Modules { path: String, why: String },
    #[error("QEMU not found: {0}")]
    QemuMissing(String),
    #[error("{0}")]
    Initramfs(String),
    #[error(
        "guest {host} did not come up within {secs:.1} s (console {console}, last lines: {tail})"
    )]
    BootTimeout {
        host: String,
        secs: f64,
        console: String,
        tail: String,
    },
    #[error("guest {host} stopped while booting (console {console}, last lines: {tail})")]
    BootDied {
        host: String,
        console: String,
        tail: String,
    },
    #[error("qemu for {host} failed to start: {stderr}")]
    QemuFailed { host: String, stderr: String },
    #[error("guest {host}: command channel: {why}")]
    Agent { host: String, why: String },
    #[error("fetching the kernel: {0}")]
    Fetch(String),
    #[error("{0}")]
    Io(String),
    #[error("--kernel-cmdline {line:?}: {why}")]
    Cmdline { line: String, why: String },
}

fn io_err(path: &Path, e: impl std::fmt::Display) -> GuestError {
    GuestError::Io(format!("{}: {e}", path.display()))
}

/// A checked kernel image and where its modules are.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelImage {
    pub image: PathBuf,
    /// The release, as `uname -r` will print it in the guest (from the image's header).
    pub version: String,
    /// `lib/modules/VERSION` of this kernel.
    pub modules: PathBuf,
}

/// Reads the release string out of a bzImage (x86 boot protocol ≥ 2.00: `HdrS` at 0x202, the
/// version string's offset − 0x200 at 0x20E).
pub fn kernel_version(bytes: &[u8]) -> Result<String, String> {
    if bytes.len() < 0x240 {
        return Err(format!(
            "{} bytes is too short for a bzImage (no x86 boot sector and setup header)",
            bytes.len()
        ));
    }
    if bytes[0x1FE..0x200] != [0x55, 0xAA] {
        return Err("no x86 boot sector signature 55 AA at offset 0x1FE".into());
    }
    if &bytes[0x202..0x206] != b"HdrS" {
        return Err("no Linux boot protocol header `HdrS` at offset 0x202".into());
    }
    let off = u16::from_le_bytes([bytes[0x20E], bytes[0x20F]]) as usize + 0x200;
    let tail = bytes
        .get(off..)
        .filter(|t| !t.is_empty())
        .ok_or("the header's kernel_version offset points past the end of the file")?;
    let end = tail
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(tail.len().min(256));
    let s = std::str::from_utf8(&tail[..end.min(256)])
        .map_err(|_| "the header's version string is not text")?;
    let v = s.split_whitespace().next().unwrap_or("");
    if v.is_empty()
        || !v
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-+~".contains(c))
    {
        return Err(format!(
            "the header's version string `{s}` is not a release"
        ));
    }
    Ok(v.to_string())
}

/// Checks `image` and finds its modules: `modules` if given (either `lib/modules` or
/// `lib/modules/VERSION`), else `IMAGE/../../lib/modules/VERSION`, else
/// `/lib/modules/VERSION`.
pub fn inspect_kernel(image: &Path, modules: Option<&Path>) -> Result<KernelImage, GuestError> {
    let mut head = Vec::new();
    let f = std::fs::File::open(image).map_err(|e| io_err(image, e))?;
    if f.metadata().map(|m| m.is_dir()).unwrap_or(false) {
        return Err(GuestError::NotAKernel {
            path: image.display().to_string(),
            why: "it is a directory".into(),
        });
    }
    f.take(64 * 1024)
        .read_to_end(&mut head)
        .map_err(|e| io_err(image, e))?;
    let version = kernel_version(&head).map_err(|why| GuestError::NotAKernel {
        path: image.display().to_string(),
        why,
    })?;
    let image = std::fs::canonicalize(image).map_err(|e| io_err(image, e))?;
    let mut tried = Vec::new();
    let candidates: Vec<PathBuf> = match modules {
        Some(m) => vec![m.join(&version), m.to_path_buf()],
        None => {
            let mut v = Vec::new();
            if let Some(root) = image.parent().and_then(|b| b.parent()) {
                v.push(root.join("lib/modules").join(&version));
            }
            v.push(Path::new("/lib/modules").join(&version));
            v
        }
    };
    for c in candidates {
        if c.join("kernel").is_dir() {
            return Ok(KernelImage {
                image,
                version,
                modules: c,
            });
        }
        tried.push(c.display().to_string());
    }
    Err(GuestError::Modules {
        path: image.display().to_string(),
        why: format!(
            "no modules for kernel {version} (looked in {}; extract the kernel package there or name them with --modules)",
            tried.join(", ")
        ),
    })
}

pub fn cache_root() -> PathBuf {
    std::env::var_os(CACHE_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CACHE))
}

fn run_cmd(mut c: Command) -> Result<String, String> {
    let desc = format!("{c:?}").replace('"', "");
    let out = c.output().map_err(|e| format!("`{desc}`: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`{desc}` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Fetches a Debian kernel package (`linux-image-amd64` follows its dependency to the
/// versioned `linux-image-VERSION-amd64`) with `apt-get download` and extracts it with
/// `dpkg-deb -x` into `CACHE/kernels/VERSION/`. An extraction already there is reused.
pub fn fetch_debian_kernel(package: &str) -> Result<KernelImage, GuestError> {
    let fe = GuestError::Fetch;
    let mut pkg = package.to_string();
    // Follow a meta package (no vmlinuz of its own) to the image it depends on.
    let mut c = Command::new("apt-cache");
    c.args(["depends", "--no-recommends", "--no-suggests", &pkg]);
    let deps = run_cmd(c).map_err(fe)?;
    if let Some(d) = deps
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .find(|d| versioned_image(d))
    {
        if !versioned_image(&pkg) {
            pkg = d.trim().to_string();
        }
    }
    let root = cache_root().join("kernels");
    let dir = root.join(pkg.trim_start_matches("linux-image-"));
    let boot = dir.join("boot");
    if let Some(img) = find_vmlinuz(&boot) {
        return inspect_kernel(&img, None);
    }
    let dl = root.join(format!(".download-{}", std::process::id()));
    std::fs::create_dir_all(&dl).map_err(|e| io_err(&dl, e))?;
    let result = (|| {
        let mut c = Command::new("apt-get");
        c.current_dir(&dl).args(["download", "-q", &pkg]);
        run_cmd(c).map_err(fe)?;
        let deb = std::fs::read_dir(&dl)
            .map_err(|e| io_err(&dl, e))?
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "deb"))
            .ok_or_else(|| GuestError::Fetch(format!("apt-get download {pkg} left no .deb")))?;
        let tmp = root.join(format!(".extract-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let mut c = Command::new("dpkg-deb");
        c.arg("-x").arg(&deb).arg(&tmp);
        run_cmd(c).map_err(fe)?;
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::rename(&tmp, &dir).map_err(|e| io_err(&dir, e))?;
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&dl);
    result?;
    let img = find_vmlinuz(&boot)
        .ok_or_else(|| GuestError::Fetch(format!("package {pkg} has no boot/vmlinuz-* image")))?;
    inspect_kernel(&img, None)
}

/// `linux-image-6.1.0-56-amd64` (an image), not `linux-image-amd64` (a meta package).
fn versioned_image(pkg: &str) -> bool {
    pkg.strip_prefix("linux-image-")
        .is_some_and(|v| v.starts_with(|c: char| c.is_ascii_digit()))
}

fn find_vmlinuz(boot: &Path) -> Option<PathBuf> {
    std::fs::read_dir(boot)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vmlinuz-"))
        })
}

/// The QEMU binary: `$MIMIC_QEMU` if set (it must exist), else `qemu-system-x86_64` on PATH.
pub fn qemu_binary() -> Result<PathBuf, GuestError> {
    if let Some(p) = std::env::var_os(QEMU_ENV) {
        let p = PathBuf::from(p);
        if is_executable(&p) {
            return Ok(p);
        }
        return Err(GuestError::QemuMissing(format!(
            "{QEMU_ENV}={} is not an executable file",
            p.display()
        )));
    }
    find_on_path("qemu-system-x86_64").ok_or_else(|| {
        GuestError::QemuMissing(
            "`qemu-system-x86_64` is not on PATH (install Debian's qemu-system-x86, or set MIMIC_QEMU to the binary)"
                .into(),
        )
    })
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

/// Module name → (file, dependencies), from a `lib/modules/VERSION` tree: the `depends=`
/// field of each module's `.modinfo` (the same field depmod reads), found by its text.
fn module_index(modules: &Path) -> Result<std::collections::HashMap<String, PathBuf>, GuestError> {
    let mut idx = std::collections::HashMap::new();
    let mut stack = vec![modules.join("kernel")];
    while let Some(d) = stack.pop() {
        let rd = std::fs::read_dir(&d).map_err(|e| io_err(&d, e))?;
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Some(n) = p.file_name().and_then(|n| n.to_str()) {
                if let Some(m) = n.strip_suffix(".ko") {
                    idx.insert(m.replace('-', "_"), p.clone());
                } else if n.ends_with(".ko.xz") || n.ends_with(".ko.zst") || n.ends_with(".ko.gz") {
                    return Err(GuestError::Modules {
                        path: p.display().to_string(),
                        why: "compressed modules are not supported (busybox insmod loads plain .ko files)".into(),
                    });
                }
            }
        }
    }
    Ok(idx)
}

/// The `depends=` list of a module file.
pub fn module_depends(ko: &[u8]) -> Vec<String> {
    const KEY: &[u8] = b"\0depends=";
    let Some(at) = ko.windows(KEY.len()).position(|w| w == KEY) else {
        return Vec::new();
    };
    let rest = &ko[at + KEY.len()..];
    let end = rest.iter().position(|&b| b == 0).unwrap_or(0);
    String::from_utf8_lossy(&rest[..end])
        .split(',')
        .map(|s| s.trim().replace('-', "_"))
        .filter(|s| !s.is_empty())
        .collect()
}

/// The modules to load, dependencies first. A wanted module that is neither a file nor
/// built in is an error naming it.
fn resolve_modules(kernel: &KernelImage) -> Result<Vec<(String, PathBuf)>, GuestError> {
    let idx = module_index(&kernel.modules)?;
    let builtin =
        std::fs::read_to_string(kernel.modules.join("modules.builtin")).unwrap_or_default();
    let is_builtin = |m: &str| {
        builtin.lines().any(|l| {
            Path::new(l)
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".ko"))
                .is_some_and(|n| n.replace('-', "_") == m)
        })
    };
    let mut order: Vec<(String, PathBuf)> = Vec::new();
    fn visit(
        m: &str,
        idx: &std::collections::HashMap<String, PathBuf>,
        is_builtin: &dyn Fn(&str) -> bool,
        order: &mut Vec<(String, PathBuf)>,
        path: &mut Vec<String>,
        kernel: &KernelImage,
    ) -> Result<(), GuestError> {
        if order.iter().any(|(n, _)| n == m) || path.iter().any(|p| p == m) {
            return Ok(());
        }
        let Some(f) = idx.get(m) else {
            if is_builtin(m) {
                return Ok(());
            }
            return Err(GuestError::Modules {
                path: kernel.modules.display().to_string(),
                why: format!(
                    "kernel {} has no module {m} (neither a .ko nor built in)",
                    kernel.version
                ),
            });
        };
        let bytes = std::fs::read(f).map_err(|e| io_err(f, e))?;
        path.push(m.to_string());
        for d in module_depends(&bytes) {
            visit(&d, idx, is_builtin, order, path, kernel)?;
        }
        path.pop();
        order.push((m.to_string(), f.clone()));
        Ok(())
    }
    for m in GUEST_MODULES {
        visit(m, &idx, &is_builtin, &mut order, &mut Vec::new(), kernel)?;
    }
    Ok(order)
}

/// The guest's `/init` (run by busybox sh): load the modules, mount the host's root
/// read-only, tmpfs where the guest writes, then become the agent. `mimic_probe=1` on the
/// kernel command line only prints the probe mark and powers off.
fn init_script(modules: &[(String, PathBuf)]) -> String {
    let list: Vec<&str> = modules.iter().map(|(m, _)| m.as_str()).collect();
    format!(
        r#"#!/bin/busybox sh
# mimic guest init (generated; see netemu/src/guest.rs)
B=/bin/busybox
$B mount -t proc proc /proc
$B mount -t sysfs sys /sys
$B mount -t devtmpfs dev /dev
if [ "$mimic_probe" = 1 ]; then
  echo {PROBE_MARK}
  $B poweroff -f
fi
fail() {{ echo "mimic-guest: $*"; $B sleep 1; $B poweroff -f; }}
for m in {mods}; do
  $B insmod /modules/$m.ko || fail "loading module $m failed"
done
$B mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144,cache=loose {ROOT_TAG} /newroot \
  || fail "mounting the host's root over 9p failed"
$B mount -t proc proc /newroot/proc
$B mount -t sysfs sys /newroot/sys
$B mount -t devtmpfs dev /newroot/dev
# /run and /var/log: the guest's own. /tmp, /var/tmp and /root: the host's files seen through
# an overlay whose writable upper layer is a tmpfs, so a binary or file under the host's /tmp
# (a checkout there, cargo's target/tmp) is found at the same path and the guest's writes stay
# in the guest.
for d in /run /var/log; do
  [ -d /newroot$d ] && $B mount -t tmpfs -o mode=1777 tmpfs /newroot$d
done
$B mkdir -p /overlay && $B mount -t tmpfs -o mode=0755 tmpfs /overlay
for d in /tmp /var/tmp /root; do
  [ -d /newroot$d ] || continue
  $B mkdir -p /overlay$d/upper /overlay$d/work
  $B chmod 1777 /overlay$d/upper
  $B mount -t overlay overlay -o lowerdir=/newroot$d,upperdir=/overlay$d/upper,workdir=/overlay$d/work /newroot$d \
    || fail "mounting an overlay on $d failed"
done
$B mkdir -p /newroot/run/netns
[ -x "/newroot$mimic_agent" ] || fail "the agent $mimic_agent is not executable in the host's files"
$B hostname "$mimic_host"
echo "mimic-guest: starting the agent $mimic_agent"
exec $B chroot /newroot "$mimic_agent" lab guest-agent
"#,
        mods = list.join(" ")
    )
}

/// Builds (or reuses) the initramfs for `kernel`: `CACHE/initramfs/VERSION-HASH.cpio`, where
/// HASH covers the init script, the module files and busybox, so a changed input builds anew.
pub fn initramfs(kernel: &KernelImage) -> Result<PathBuf, GuestError> {
    let busybox = Path::new(BUSYBOX);
    if !busybox.is_file() {
        return Err(GuestError::Initramfs(format!(
            "{BUSYBOX} is missing (install Debian's busybox-static)"
        )));
    }
    let mods = resolve_modules(kernel)?;
    let init = init_script(&mods);
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |b: &[u8]| {
        for &x in b {
            h ^= x as u64;
            h = h.wrapping_mul(0x100_0000_01b3);
        }
    };
    feed(init.as_bytes());
    for (m, p) in &mods {
        feed(m.as_bytes());
        let len = std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        feed(&len.to_le_bytes());
    }
    feed(
        &std::fs::metadata(busybox)
            .map(|m| m.len())
            .unwrap_or(0)
            .to_le_bytes(),
    );
    let dir = cache_root().join("initramfs");
    let out = dir.join(format!("{}-{h:016x}.cpio", kernel.version));
    if out.is_file() {
        return Ok(out);
    }
    std::fs::create_dir_all(&dir).map_err(|e| io_err(&dir, e))?;
    let stage = dir.join(format!(".stage-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&stage);
    let res = (|| {
        for d in ["bin", "proc", "sys", "dev", "newroot", "modules"] {
            std::fs::create_dir_all(stage.join(d)).map_err(|e| io_err(&stage, e))?;
        }
        std::fs::copy(busybox, stage.join("bin/busybox")).map_err(|e| io_err(busybox, e))?;
        for (m, p) in &mods {
            std::fs::copy(p, stage.join("modules").join(format!("{m}.ko")))
                .map_err(|e| io_err(p, e))?;
        }
        {
            use std::os::unix::fs::PermissionsExt;
            let ip = stage.join("init");
            std::fs::write(&ip, &init).map_err(|e| io_err(&ip, e))?;
            std::fs::set_permissions(&ip, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| io_err(&ip, e))?;
        }
        let mut names = vec![".".to_string()];
        for d in ["bin", "proc", "sys", "dev", "newroot", "modules"] {
            names.push(d.into());
        }
        names.push("bin/busybox".into());
        names.push("init".into());
        for (m, _) in &mods {
            names.push(format!("modules/{m}.ko"));
        }
        let tmp = dir.join(format!(".initramfs-{}.tmp", std::process::id()));
        let outf = std::fs::File::create(&tmp).map_err(|e| io_err(&tmp, e))?;
        let mut child = Command::new("cpio")
            .args(["-o", "-H", "newc", "--quiet"])
            .current_dir(&stage)
            .stdin(Stdio::piped())
            .stdout(outf)
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                GuestError::Initramfs(format!("running cpio: {e} (install Debian's cpio)"))
            })?;
        child
            .stdin
            .take()
            .expect("piped")
            .write_all((names.join("\n") + "\n").as_bytes())
            .map_err(|e| GuestError::Initramfs(format!("cpio: {e}")))?;
        let o = child
            .wait_with_output()
            .map_err(|e| GuestError::Initramfs(format!("cpio: {e}")))?;
        if !o.status.success() {
            let _ = std::fs::remove_file(&tmp);
            return Err(GuestError::Initramfs(format!(
                "cpio failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            )));
        }
        std::fs::rename(&tmp, &out).map_err(|e| io_err(&out, e))
    })();
    let _ = std::fs::remove_dir_all(&stage);
    res.map(|_| out)
}

/// Which accelerator QEMU gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    Kvm,
    Tcg,
}

impl std::fmt::Display for Accel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        })
    }
}

#[derive(Serialize, Deserialize)]
struct ProbeRecord {
    boot_id: String,
    accel: Accel,
    why: String,
}

/// Why a KVM probe boot may spin here: `/dev/kvm` served by PVM (the `kvm_pvm` module, nested
/// virtualization by page tables, as on this project's VMs) runs only guest kernels built as
/// PVM guests, which Debian's stock kernel is not. Empty where `modules` (`/sys/module`) has
/// no `kvm_pvm`.
fn pvm_note(modules: &Path) -> &'static str {
    if modules.join("kvm_pvm").exists() {
        "; this host's KVM is PVM (module kvm_pvm), which runs only guest kernels built as PVM \
         guests, and a stock distribution kernel is not one"
    } else {
        ""
    }
}

/// KVM if it really runs a guest here, TCG otherwise, and why. `$MIMIC_QEMU_ACCEL` decides
/// when set; no usable `/dev/kvm` means TCG; else a probe boot of `kernel` with KVM must print
/// its mark within 6 s (it is killed otherwise). The result is kept for this host boot.
pub fn choose_accel(
    qemu: &Path,
    kernel: &KernelImage,
    initrd: &Path,
) -> Result<(Accel, String), GuestError> {
    if let Some(v) = std::env::var_os(ACCEL_ENV) {
        return match v.to_str() {
            Some("kvm") => Ok((Accel::Kvm, format!("{ACCEL_ENV}=kvm"))),
            Some("tcg") => Ok((Accel::Tcg, format!("{ACCEL_ENV}=tcg"))),
            _ => Err(GuestError::Io(format!(
                "{ACCEL_ENV}={} (use kvm or tcg)",
                v.to_string_lossy()
            ))),
        };
    }
    let kvm_ok = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok();
    if !kvm_ok {
        return Ok((Accel::Tcg, "/dev/kvm cannot be opened".into()));
    }
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .unwrap_or_default()
        .trim()
        .to_string();
    let rec_path = Path::new("/run/mimic/accel.json");
    if let Ok(t) = std::fs::read_to_string(rec_path) {
        if let Ok(r) = serde_json::from_str::<ProbeRecord>(&t) {
            if r.boot_id == boot_id && !boot_id.is_empty() {
                return Ok((
                    r.accel,
                    format!("{} (probed earlier in this host boot)", r.why),
                ));
            }
        }
    }
    let t0 = Instant::now();
    let mut child = Command::new(qemu)
        .args(["-accel", "kvm", "-cpu", "host", "-m", "256", "-smp", "1"])
        .args([
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-serial",
            "stdio",
        ])
        .args(["-no-reboot", "-kernel"])
        .arg(&kernel.image)
        .arg("-initrd")
        .arg(initrd)
        .args(["-append", "console=ttyS0 panic=-1 quiet mimic_probe=1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| GuestError::QemuMissing(format!("{}: {e}", qemu.display())))?;
    let out = child.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).split(b'\n').map_while(Result::ok) {
            if String::from_utf8_lossy(&l).contains(PROBE_MARK) {
                let _ = tx.send(());
                return;
            }
        }
    });
    let seen = rx.recv_timeout(PROBE_TIMEOUT).is_ok();
    let _ = child.kill();
    let _ = child.wait();
    let (accel, why) = if seen {
        (
            Accel::Kvm,
            format!(
                "a KVM probe boot reached userspace in {:.2} s",
                t0.elapsed().as_secs_f64()
            ),
        )
    } else {
        (
            Accel::Tcg,
            format!(
                "/dev/kvm opens but a KVM probe boot did not reach userspace within {} s (killed){}",
                PROBE_TIMEOUT.as_secs(),
                pvm_note(Path::new("/sys/module"))
            ),
        )
    };
    let _ = std::fs::create_dir_all("/run/mimic");
    let rec = ProbeRecord {
        boot_id,
        accel,
        why: why.clone(),
    };
    let tmp = rec_path.with_extension("tmp");
    if std::fs::write(&tmp, serde_json::to_vec(&rec).unwrap_or_default()).is_ok() {
        let _ = std::fs::rename(&tmp, rec_path);
    }
    Ok((accel, why))
}

/// One guest NIC: the tap QEMU creates in the host namespace, and the name and MAC it gets in
/// the guest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestNic {
    pub tap: String,
    pub guest_name: String,
    pub mac: String,
}

/// What to boot.
#[derive(Clone, Debug)]
pub struct GuestSpec {
    /// The lab host it replaces (`emu` or `srv`).
    pub role: String,
    /// The namespace QEMU runs in (its taps appear there).
    pub netns: String,
    pub kernel: KernelImage,
    pub nics: Vec<GuestNic>,
    pub memory_mb: u32,
    pub boot_timeout: Duration,
    pub runtime_dir: PathBuf,
    /// SCHED_FIFO priority for QEMU's threads once the guest is up (None: normal scheduling).
    pub fifo_priority: Option<i32>,
    /// Extra kernel command-line words (checked by [`parse_cmdline`]), appended after the
    /// lab's own.
    pub cmdline: Vec<String>,
}

/// A running guest, as recorded in `RUNTIME_DIR/guest-ROLE.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GuestRecord {
    pub role: String,
    pub netns: String,
    pub kernel: KernelImage,
    pub accel: Accel,
    pub accel_why: String,
    pub pid: i32,
    pub agent: PathBuf,
    pub console: PathBuf,
    pub nics: Vec<GuestNic>,
    /// Seconds from starting QEMU to the agent's first answer.
    pub boot_secs: f64,
    /// The extra kernel command-line words it was booted with (`lab up --kernel-cmdline`).
    #[serde(default)]
    pub cmdline: Vec<String>,
}

/// Kernel parameters the lab sets itself (or that would take PID 1 from the agent): an extra
/// command line may not name them. The kernel reads `-` and `_` in a parameter's name alike.
const OWN_PARAMS: &[&str] = &["console", "panic", "init", "rdinit", "root"];

/// Checks `--kernel-cmdline`'s text and splits it into words: printable characters only (no
/// newline, tab or other control character, no quotes: a word is whitespace-delimited), none
/// of the lab's own keys (`console=`, `panic=`, `init=`, `rdinit=`, `root=`, any `mimic_*`)
/// and no `--` (what follows it would go to the agent as arguments).
pub fn parse_cmdline(line: &str) -> Result<Vec<String>, GuestError> {
    let bad = |why: String| GuestError::Cmdline {
        line: line.to_string(),
        why,
    };
    if let Some(c) = line.chars().find(|c| c.is_control()) {
        return Err(bad(format!(
            "control character {c:?}: give the words on one line, separated by spaces"
        )));
    }
    if line.contains('"') || line.contains('\'') {
        return Err(bad(
            "quotes are not supported: give plain words such as highres=off nohz=off".into(),
        ));
    }
    let mut words = Vec::new();
    for w in line.split_whitespace() {
        if w == "--" {
            return Err(bad(
                "`--` would pass what follows to the guest's PID 1 (mimic's agent)".into(),
            ));
        }
        let key = w.split('=').next().unwrap_or(w).replace('-', "_");
        if key.starts_with("mimic_") || OWN_PARAMS.contains(&key.as_str()) {
            return Err(bad(format!(
                "{w}: the lab sets `{key}` itself (console=ttyS0 panic=-1, mimic_agent=, \
                 mimic_host=; the initramfs's /init runs the agent)"
            )));
        }
        words.push(w.to_string());
    }
    Ok(words)
}

/// The guest's kernel command line: the lab's own parameters, then `extra` (already checked
/// by [`parse_cmdline`]).
pub fn kernel_append(agent: &str, netns: &str, extra: &[String]) -> String {
    let mut s = format!("console=ttyS0 panic=-1 quiet mimic_agent={agent} mimic_host={netns}");
    for w in extra {
        s.push(' ');
        s.push_str(w);
    }
    s
}

pub fn record_path(runtime_dir: &Path, role: &str) -> PathBuf {
    runtime_dir.join(format!("guest-{role}.json"))
}

pub fn pid_path(runtime_dir: &Path, role: &str) -> PathBuf {
    runtime_dir.join(format!("guest-{role}.pid"))
}

/// The guest recorded for `role` in the lab's runtime dir, if any.
pub fn load_record(runtime_dir: &Path, role: &str) -> Option<GuestRecord> {
    let t = std::fs::read_to_string(record_path(runtime_dir, role)).ok()?;
    serde_json::from_str(&t).ok()
}

/// Whether `pid` runs. A zombie does not (a daemonized QEMU that was killed stays one until
/// whoever adopted it reaps it), nor does a process that is exiting: a killed QEMU frees its
/// guest's memory before it becomes a zombie, and for that while its state is still R or D
/// (its command line already reads empty) — the kernel's PF_EXITING flag says so.
pub fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    if pid <= 0 || unsafe { libc::kill(pid, 0) } != 0 {
        return false;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let mut fields = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace())
        .into_iter()
        .flatten();
    let state = fields.next().unwrap_or("");
    // after the state: ppid, pgrp, session, tty_nr, tpgid, then flags
    let flags: u64 = fields.nth(5).and_then(|f| f.parse().ok()).unwrap_or(0);
    const PF_EXITING: u64 = 0x4;
    !matches!(state, "Z" | "X" | "") && flags & PF_EXITING == 0
}

/// Kills the guest of `role` (SIGKILL: a guest keeps nothing worth a clean shutdown) and waits
/// until it is gone; returns its pid if one was running.
pub fn kill(runtime_dir: &Path, role: &str) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(pid_path(runtime_dir, role))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    if !alive(pid) || !is_qemu(pid) {
        return None;
    }
    // SAFETY: the pid is QEMU's, from the pid file QEMU wrote, checked by its command name.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    Some(pid)
}

/// Puts every thread of `pid` at SCHED_FIFO `prio`. A TCG guest's timers (netem's delay
/// line) fire only when its vCPU thread runs: on a loaded host a normally scheduled QEMU made
/// a 40 ms round trip 41–484 ms (avg 84), at FIFO 10 41.1–43.4 ms (avg 41.6). The kernel's RT
/// throttling still leaves 5% of each second to others if the guest spins. The default, 20,
/// is above mimic's own datapath thread (10), which other labs on the same machine may run.
pub fn set_fifo(pid: i32, prio: i32) -> Result<(), String> {
    let dir = format!("/proc/{pid}/task");
    let tasks = std::fs::read_dir(&dir).map_err(|e| format!("{dir}: {e}"))?;
    for t in tasks.flatten() {
        let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let p = libc::sched_param {
            sched_priority: prio,
        };
        // SAFETY: sched_setscheduler on a thread id of the QEMU we started, with a valid param.
        if unsafe { libc::sched_setscheduler(tid, libc::SCHED_FIFO, &p) } != 0 {
            return Err(format!(
                "setting SCHED_FIFO {prio} on QEMU thread {tid}: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

fn is_qemu(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.starts_with("qemu"))
}

fn console_tail(p: &Path) -> String {
    let t = std::fs::read(p).unwrap_or_default();
    let t = String::from_utf8_lossy(&t);
    let lines: Vec<&str> = t
        .lines()
        .map(|l| l.trim_matches(|c: char| c.is_control() || c.is_whitespace()))
        .filter(|l| !l.is_empty())
        .collect();
    let n = lines.len();
    if n == 0 {
        return "(none: the kernel stopped before printing anything; a truncated image, or one for another machine?)".into();
    }
    lines[n.saturating_sub(3)..].join(" | ")
}

/// Boots the guest: QEMU daemonized inside `spec.netns` with its taps there, then waits until
/// the agent answers (or QEMU exits, or `spec.boot_timeout` passes: then QEMU is killed and the
/// error carries the console's last lines). `wire` runs once QEMU is up (its taps exist),
/// before the wait, so the host side can be wired while the guest boots.
pub fn boot(
    spec: &GuestSpec,
    wire: &mut dyn FnMut() -> Result<(), String>,
) -> Result<GuestRecord, GuestError> {
    let qemu = qemu_binary()?;
    let initrd = initramfs(&spec.kernel)?;
    let (accel, accel_why) = choose_accel(&qemu, &spec.kernel, &initrd)?;
    let agent_bin = std::env::current_exe()
        .map_err(|e| GuestError::Io(format!("finding mimic's own binary: {e}")))?;
    let agent_s = agent_bin.to_str().unwrap_or("");
    if agent_s.is_empty() || agent_s.contains(char::is_whitespace) || agent_s.contains('"') {
        return Err(GuestError::Io(format!(
            "mimic's binary path {} cannot be passed on a kernel command line (spaces or quotes)",
            agent_bin.display()
        )));
    }
    let rd = &spec.runtime_dir;
    std::fs::create_dir_all(rd).map_err(|e| io_err(rd, e))?;
    let role = &spec.role;
    let agent = rd.join(format!("guest-{role}.agent"));
    let console = rd.join(format!("guest-{role}.console"));
    let pidf = pid_path(rd, role);
    let _ = std::fs::remove_file(&agent);
    let _ = std::fs::remove_file(&pidf);
    let mut c = crate::netns::command(&spec.netns, &qemu, Vec::<&str>::new());
    c.args(["-name", &format!("mimic-{}", spec.netns)]);
    match accel {
        Accel::Kvm => c.args(["-accel", "kvm", "-cpu", "host"]),
        // `max`: every feature TCG emulates (the host binaries may use SSE4 and up).
        Accel::Tcg => c.args(["-accel", "tcg", "-cpu", "max"]),
    };
    c.args(["-m", &spec.memory_mb.to_string(), "-smp", "1"])
        .args([
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-no-reboot",
        ])
        .arg("-kernel")
        .arg(&spec.kernel.image)
        .arg("-initrd")
        .arg(&initrd)
        .arg("-append")
        .arg(kernel_append(agent_s, &spec.netns, &spec.cmdline))
        .arg("-serial")
        .arg(format!("file:{}", console.display()))
        .arg("-virtfs")
        .arg(format!(
            "local,path=/,mount_tag={ROOT_TAG},security_model=none,readonly=on,multidevs=remap"
        ))
        .args(["-device", "virtio-serial-pci"])
        .arg("-chardev")
        .arg(format!(
            "socket,id=agent,path={},server=on,wait=off",
            agent.display()
        ))
        .args([
            "-device",
            &format!("virtserialport,chardev=agent,name={AGENT_PORT}"),
        ]);
    for (i, n) in spec.nics.iter().enumerate() {
        c.arg("-netdev")
            .arg(format!(
                "tap,id=n{i},ifname={},script=no,downscript=no",
                n.tap
            ))
            .arg("-device")
            .arg(format!("virtio-net-pci,netdev=n{i},mac={}", n.mac));
    }
    c.arg("-daemonize").arg("-pidfile").arg(&pidf);
    let t0 = Instant::now();
    let out = c.output().map_err(|e| GuestError::QemuFailed {
        host: spec.netns.clone(),
        stderr: e.to_string(),
    })?;
    if !out.status.success() {
        kill(rd, role);
        return Err(GuestError::QemuFailed {
            host: spec.netns.clone(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    let pid: i32 = std::fs::read_to_string(&pidf)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| GuestError::QemuFailed {
            host: spec.netns.clone(),
            stderr: format!("no pid in {}", pidf.display()),
        })?;
    let fail = |e: GuestError| {
        kill(rd, role);
        Err(e)
    };
    if let Err(e) = wire() {
        return fail(GuestError::Io(e));
    }
    let deadline = t0 + spec.boot_timeout;
    // the console of a boot that failed, kept where the lab's cleanup (which removes the
    // runtime directory) leaves it, for the error to point at
    let kept_console = || {
        let keep = std::env::temp_dir().join(format!("mimic-{}.console", spec.netns));
        match std::fs::copy(&console, &keep) {
            Ok(_) => keep.display().to_string(),
            Err(_) => console.display().to_string(),
        }
    };
    let mut client = None;
    while client.is_none() {
        if !alive(pid) {
            return fail(GuestError::BootDied {
                host: spec.netns.clone(),
                console: kept_console(),
                tail: console_tail(&console),
            });
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            // stopped first, so that the kept copy is all it printed
            kill(rd, role);
            return fail(GuestError::BootTimeout {
                host: spec.netns.clone(),
                secs: spec.boot_timeout.as_secs_f64(),
                console: kept_console(),
                tail: console_tail(&console),
            });
        }
        let wait = left.min(Duration::from_millis(500));
        match Agent::connect(&agent, &spec.netns) {
            Ok(mut a) => match a.call(&["true"], None, Some(wait)) {
                Ok(r) if r.status == Some(0) => client = Some(a),
                _ => {}
            },
            Err(_) => std::thread::sleep(Duration::from_millis(50).min(wait)),
        }
    }
    if let Some(prio) = spec.fifo_priority {
        if let Err(e) = set_fifo(pid, prio) {
            return fail(GuestError::Io(format!("{}: {e}", spec.netns)));
        }
    }
    let rec = GuestRecord {
        role: role.clone(),
        netns: spec.netns.clone(),
        kernel: spec.kernel.clone(),
        accel,
        accel_why,
        pid,
        agent,
        console,
        nics: spec.nics.clone(),
        boot_secs: t0.elapsed().as_secs_f64(),
        cmdline: spec.cmdline.clone(),
    };
    let rp = record_path(rd, role);
    let tmp = rp.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&rec).unwrap_or_default())
        .and_then(|_| std::fs::rename(&tmp, &rp))
        .map_err(|e| io_err(&rp, e))?;
    Ok(rec)
}

/// A request to the agent.
#[derive(Serialize, Deserialize, Debug)]
pub struct ExecRequest {
    pub id: u64,
    pub argv: Vec<String>,
    /// Killed after this long (ms); none: no limit.
    pub timeout_ms: Option<u64>,
}

/// The agent's reply: the exit status (None when killed by a signal), stdout and stderr
/// (bytes that are not UTF-8 are replaced).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ExecReply {
    pub id: u64,
    pub status: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// Set when the command could not be started.
    pub error: Option<String>,
}

impl ExecReply {
    /// The exit code a shell would report (128 + signal when killed).
    pub fn code(&self) -> i32 {
        match (self.status, self.signal) {
            (Some(s), _) => s,
            (None, Some(sig)) => 128 + sig,
            _ => 127,
        }
    }
}

/// The host's end of a guest's command channel. One caller at a time per guest (an exclusive
/// lock on `AGENT.lock` is held while connected).
pub struct Agent {
    stream: BufReader<UnixStream>,
    _lock: std::fs::File,
    host: String,
    next_id: u64,
}

impl Agent {
    pub fn connect(sock: &Path, host: &str) -> Result<Agent, GuestError> {
        Self::connect_within(sock, host, None)
    }

    /// Like [`Agent::connect`], but waits at most `wait` for a caller before us to finish
    /// (None: as long as it takes).
    pub fn connect_within(
        sock: &Path,
        host: &str,
        wait: Option<Duration>,
    ) -> Result<Agent, GuestError> {
        use std::os::fd::AsRawFd;
        let lp = sock.with_extension("lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lp)
            .map_err(|e| io_err(&lp, e))?;
        let deadline = wait.map(|w| Instant::now() + w);
        loop {
            let how = if deadline.is_some() {
                libc::LOCK_EX | libc::LOCK_NB
            } else {
                libc::LOCK_EX
            };
            // SAFETY: flock on a file descriptor we own.
            if unsafe { libc::flock(lock.as_raw_fd(), how) } == 0 {
                break;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(GuestError::Agent {
                    host: host.into(),
                    why: "busy with another command (lab exec) for too long".into(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let s = UnixStream::connect(sock).map_err(|e| GuestError::Agent {
            host: host.into(),
            why: format!("{}: {e}", sock.display()),
        })?;
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        Ok(Agent {
            stream: BufReader::new(s),
            _lock: lock,
            host: host.into(),
            next_id: seed ^ ((std::process::id() as u64) << 32),
        })
    }

    /// Runs `argv` in the guest; `wait` bounds how long to wait for the reply (None: until
    /// the command ends).
    pub fn call(
        &mut self,
        argv: &[&str],
        timeout: Option<Duration>,
        wait: Option<Duration>,
    ) -> Result<ExecReply, GuestError> {
        let err = |why: String| GuestError::Agent {
            host: self.host.clone(),
            why,
        };
        self.next_id = self.next_id.wrapping_add(1);
        let id = self.next_id;
        let req = ExecRequest {
            id,
            argv: argv.iter().map(|s| s.to_string()).collect(),
            timeout_ms: timeout.map(|t| t.as_millis() as u64),
        };
        let mut line = serde_json::to_vec(&req).map_err(|e| err(e.to_string()))?;
        line.push(b'\n');
        self.stream
            .get_mut()
            .write_all(&line)
            .map_err(|e| err(format!("sending: {e}")))?;
        let deadline = wait.map(|w| Instant::now() + w);
        loop {
            let left = match deadline {
                Some(d) => {
                    let l = d.saturating_duration_since(Instant::now());
                    if l.is_zero() {
                        return Err(err("no reply in time".into()));
                    }
                    Some(l)
                }
                None => None,
            };
            self.stream
                .get_ref()
                .set_read_timeout(left)
                .map_err(|e| err(e.to_string()))?;
            let mut buf = String::new();
            match self.stream.read_line(&mut buf) {
                Ok(0) => return Err(err("the guest closed the channel (did it stop?)".into())),
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(err("no reply in time".into()))
                }
                Err(e) => return Err(err(format!("reading: {e}"))),
            }
            // Replies to requests of an earlier, abandoned connection are skipped.
            if let Ok(r) = serde_json::from_str::<ExecReply>(buf.trim()) {
                if r.id == id {
                    return Ok(r);
                }
            }
        }
    }
}

/// Runs `argv` on the guest recorded in `rec` and returns its reply.
pub fn exec(
    rec: &GuestRecord,
    argv: &[&str],
    timeout: Option<Duration>,
) -> Result<ExecReply, GuestError> {
    if !alive(rec.pid) {
        return Err(GuestError::Agent {
            host: rec.netns.clone(),
            why: format!(
                "QEMU (pid {}) is not running; `mimic lab down` and up again",
                rec.pid
            ),
        });
    }
    let mut a = Agent::connect(&rec.agent, &rec.netns)?;
    a.call(argv, timeout, timeout.map(|t| t + Duration::from_secs(5)))
}

/// Like [`exec`], but a non-zero exit is an error carrying its stderr. Gives up after
/// `limit` (waiting for another caller included).
pub fn exec_ok_within(
    rec: &GuestRecord,
    argv: &[&str],
    limit: Duration,
) -> Result<String, GuestError> {
    if !alive(rec.pid) {
        return Err(GuestError::Agent {
            host: rec.netns.clone(),
            why: format!("QEMU (pid {}) is not running", rec.pid),
        });
    }
    let t0 = Instant::now();
    let mut a = Agent::connect_within(&rec.agent, &rec.netns, Some(limit))?;
    let left = limit
        .saturating_sub(t0.elapsed())
        .max(Duration::from_millis(100));
    let r = a.call(argv, Some(left), Some(left))?;
    check_ok(rec, argv, r)
}

/// Like [`exec`], but a non-zero exit is an error carrying its stderr.
pub fn exec_ok(rec: &GuestRecord, argv: &[&str]) -> Result<String, GuestError> {
    let r = exec(rec, argv, Some(Duration::from_secs(120)))?;
    check_ok(rec, argv, r)
}

fn check_ok(rec: &GuestRecord, argv: &[&str], r: ExecReply) -> Result<String, GuestError> {
    if let Some(e) = r.error {
        return Err(GuestError::Agent {
            host: rec.netns.clone(),
            why: format!("`{}`: {e}", argv.join(" ")),
        });
    }
    if r.code() != 0 {
        return Err(GuestError::Agent {
            host: rec.netns.clone(),
            why: format!(
                "`{}` exited {}: {}",
                argv.join(" "),
                r.code(),
                r.stderr.trim()
            ),
        });
    }
    Ok(r.stdout)
}

/// The guest side: finds the `mimic.agent` virtio-serial port and serves requests on it one
/// at a time, forever (it is the guest's PID 1: it must never return).
pub fn agent_main() -> ! {
    std::env::set_var(
        "PATH",
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    );
    std::env::set_var("HOME", "/root");
    loop {
        match find_port().and_then(|p| serve_port(&p)) {
            Ok(()) => {}
            Err(e) => eprintln!("mimic guest agent: {e}"),
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn find_port() -> Result<PathBuf, String> {
    let dir = Path::new("/sys/class/virtio-ports");
    for e in std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .flatten()
    {
        let name = std::fs::read_to_string(e.path().join("name")).unwrap_or_default();
        if name.trim() == AGENT_PORT {
            return Ok(Path::new("/dev").join(e.file_name()));
        }
    }
    Err(format!("no virtio-serial port named {AGENT_PORT}"))
}

fn serve_port(port: &Path) -> Result<(), String> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(port)
        .map_err(|e| format!("{}: {e}", port.display()))?;
    let mut w = f.try_clone().map_err(|e| e.to_string())?;
    let mut r = BufReader::new(f);
    let mut line = String::new();
    loop {
        line.clear();
        match r.read_line(&mut line) {
            // No host connected: the port reads as closed until one is. Look again every
            // 100 ms (a `lab exec` waits that much at most): each wake-up costs a TCG guest
            // host CPU, and a busier guest delays its own timers (netem's).
            Ok(0) => {
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
            Ok(_) => {}
            Err(e) => {
                eprintln!("mimic guest agent: reading {}: {e}", port.display());
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        }
        let Ok(req) = serde_json::from_str::<ExecRequest>(line.trim()) else {
            continue;
        };
        let reply = run_request(&req);
        let mut out = serde_json::to_vec(&reply).unwrap_or_default();
        out.push(b'\n');
        // A host that went away loses its reply; the next caller skips it by id.
        let _ = w.write_all(&out).and_then(|_| w.flush());
    }
}

fn run_request(req: &ExecRequest) -> ExecReply {
    use std::os::unix::process::ExitStatusExt;
    let mut reply = ExecReply {
        id: req.id,
        status: None,
        signal: None,
        stdout: String::new(),
        stderr: String::new(),
        error: None,
    };
    let Some((prog, args)) = req.argv.split_first() else {
        reply.error = Some("empty command".into());
        return reply;
    };
    let child = Command::new(prog)
        .args(args)
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            reply.error = Some(format!("{prog}: {e}"));
            reply.status = Some(127);
            return reply;
        }
    };
    let mut so = child.stdout.take().expect("piped");
    let mut se = child.stderr.take().expect("piped");
    let to = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = so.read_to_end(&mut v);
        v
    });
    let te = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = se.read_to_end(&mut v);
        v
    });
    let deadline = req
        .timeout_ms
        .map(|ms| Instant::now() + Duration::from_millis(ms));
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) => {}
            Err(_) => break None,
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            let _ = child.kill();
            break child.wait().ok();
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    reply.stdout = String::from_utf8_lossy(&to.join().unwrap_or_default()).into_owned();
    reply.stderr = String::from_utf8_lossy(&te.join().unwrap_or_default()).into_owned();
    if let Some(s) = status {
        reply.status = s.code();
        reply.signal = s.signal();
    }
    reply
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_that_spins_on_pvm_says_why() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(pvm_note(d.path()), "");
        std::fs::create_dir(d.path().join("kvm_pvm")).unwrap();
        assert!(pvm_note(d.path()).contains("PVM (module kvm_pvm)"));
    }

    #[test]
    fn extra_cmdline_is_checked_and_appended() {
        let w = parse_cmdline("  highres=off\tnohz=off").unwrap_err();
        assert!(w.to_string().contains("control character"), "{w}");
        let w = parse_cmdline("highres=off  nohz=off ").unwrap();
        assert_eq!(w, vec!["highres=off", "nohz=off"]);
        assert_eq!(
            kernel_append("/usr/bin/mimic", "lab1-emu", &w),
            "console=ttyS0 panic=-1 quiet mimic_agent=/usr/bin/mimic mimic_host=lab1-emu highres=off nohz=off"
        );
        assert_eq!(
            kernel_append("/m", "x-emu", &[]),
            "console=ttyS0 panic=-1 quiet mimic_agent=/m mimic_host=x-emu"
        );
        assert!(parse_cmdline("").unwrap().is_empty());
        for (line, needle) in [
            ("highres=off\nconsole=tty0", "control character"),
            ("console=tty0", "`console`"),
            ("highres=off mimic_agent=/bin/sh", "`mimic_agent`"),
            ("mimic-host=x", "`mimic_host`"),
            ("rdinit=/bin/sh", "`rdinit`"),
            ("panic=0", "`panic`"),
            ("foo=\"a b\"", "quotes"),
            ("highres=off -- x", "`--`"),
        ] {
            let e = parse_cmdline(line).expect_err(line).to_string();
            assert!(e.contains(needle), "{line}: {e}");
            assert!(e.starts_with("--kernel-cmdline"), "{e}");
        }
    }

    fn fake_bzimage(version: &str) -> Vec<u8> {
        let mut b = vec![0u8; 0x1000];
        b[0x1FE] = 0x55;
        b[0x1FF] = 0xAA;
        b[0x202..0x206].copy_from_slice(b"HdrS");
        let off: u16 = 0x600 - 0x200;
        b[0x20E..0x210].copy_from_slice(&off.to_le_bytes());
        let s = format!("{version} (someone@example) #1 SMP\0");
        b[0x600..0x600 + s.len()].copy_from_slice(s.as_bytes());
        b
    }

    #[test]
    fn reads_the_release_from_a_bzimage_header() {
        assert_eq!(
            kernel_version(&fake_bzimage("6.1.0-56-amd64")).unwrap(),
            "6.1.0-56-amd64"
        );
    }

    #[test]
    fn a_file_that_is_not_a_kernel_says_why() {
        assert!(kernel_version(b"hello").unwrap_err().contains("too short"));
        let mut b = fake_bzimage("6.1.0");
        b[0x202] = b'X';
        assert!(kernel_version(&b).unwrap_err().contains("HdrS"));
        let mut b = fake_bzimage("6.1.0");
        b[0x1FE] = 0;
        assert!(kernel_version(&b).unwrap_err().contains("55 AA"));
        let mut b = fake_bzimage("6.1.0");
        b[0x20E..0x210].copy_from_slice(&0xFFF0u16.to_le_bytes());
        assert!(kernel_version(&b).unwrap_err().contains("past the end"));
    }

    #[test]
    fn inspect_names_the_file_and_finds_modules_beside_the_image() {
        let d = tempfile::tempdir().unwrap();
        let bad = d.path().join("notakernel");
        std::fs::write(&bad, vec![7u8; 4096]).unwrap();
        let e = inspect_kernel(&bad, None).unwrap_err().to_string();
        assert!(
            e.contains("notakernel") && e.contains("not a Linux kernel image"),
            "{e}"
        );
        std::fs::create_dir_all(d.path().join("boot")).unwrap();
        std::fs::create_dir_all(d.path().join("lib/modules/6.9.9-test/kernel")).unwrap();
        let img = d.path().join("boot/vmlinuz-6.9.9-test");
        std::fs::write(&img, fake_bzimage("6.9.9-test")).unwrap();
        let k = inspect_kernel(&img, None).unwrap();
        assert_eq!(k.version, "6.9.9-test");
        assert!(k.modules.ends_with("lib/modules/6.9.9-test"));
        let e = inspect_kernel(&img, Some(&d.path().join("nowhere")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no modules for kernel 6.9.9-test"), "{e}");
    }

    #[test]
    fn module_dependencies_come_from_the_depends_field() {
        let ko = b"\x7fELF....\0license=GPL\0depends=virtio_ring,virtio\0retpoline=Y\0";
        assert_eq!(module_depends(ko), vec!["virtio_ring", "virtio"]);
        assert!(module_depends(b"\0depends=\0").is_empty());
        assert!(module_depends(b"nothing").is_empty());
    }

    #[test]
    fn init_loads_modules_in_the_order_given_and_starts_the_agent() {
        let s = init_script(&[("a".into(), "x".into()), ("b".into(), "y".into())]);
        assert!(s.contains("for m in a b; do"));
        assert!(s.contains("lab guest-agent"));
        assert!(s.contains("readonly") || s.contains(",ro,"));
    }
}
