//! The replay's capture at the server host, run by `mimic serve` and driven over its control
//! channel, so that a remote replay is measured where an original from a tap is (at the
//! server) and not one round trip away on the client host.
//!
//! * [`CaptureService`] (serve's side): `capture_start` runs the role's capture
//!   ([`replay_capture`], the [`CaptureSpec`] the lab's capture uses too) in a thread of
//!   serve's process, on `--capture-iface` or else on the interface that holds serve's listen
//!   address, with the BPF filter `tcp port PORT` (only the replay port's traffic is kept on a
//!   production host); `capture_stop` ends it and lists its pcapng files with their size and
//!   SHA-256; `capture_read` hands out a file in chunks (base64 inside the JSON line);
//!   `capture_discard` removes it. A new `capture_start` discards a capture a vanished
//!   controller left behind, and serve removes its captures when it exits.
//! * [`fetch`] (the controller's side): copies the listed files in chunks into a local
//!   directory and checks each file's size and SHA-256 before it is used; the controller then
//!   analyzes them exactly as a lab replay's capture is analyzed.
//!
//! Why the capture and not the analysis crosses the wire: one analysis path for lab and remote
//! replays (the replay database is the same code's output either way), and the pcapng files
//! stay available for `--keep-capture`. The capture keeps the first 64 payload bytes per
//! packet, so it is small: a 300-connection synth replay is 20,150 packets in 2.7 MB of pcapng
//! (docker/lan-test.sh), 1 MiB per `capture_read`.

use std::io::{Read, Seek, SeekFrom, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use base64::Engine;
use mimic_capture::source::SourceSpec;
use mimic_capture::spec::RunHooks;
use mimic_capture::{CaptureRunError, CaptureSpec, CaptureSummary, PayloadPolicy, Rate};
use serde::{Deserialize, Serialize};

/// The most bytes one `capture_read` returns (base64 makes the line a third longer).
pub const MAX_CHUNK: u64 = 4 << 20;
/// The chunk the controller asks for.
pub const CHUNK: u64 = 1 << 20;
/// How long `capture_start` waits for the capture to be capturing.
const READY_WITHIN: Duration = Duration::from_secs(15);

/// The capture of a replay: every packet, real addresses, the first 64 payload bytes (the
/// request preamble), into `dir`. The lab's capture process and serve's capture run this spec.
pub fn replay_capture(source: SourceSpec, dir: &Path) -> CaptureSpec {
    let mut c = CaptureSpec::new(source, dir);
    c.settings.rate = Rate::ALL;
    c.settings.anonymize = false;
    c.settings.payload = PayloadPolicy::Bytes(64);
    c
}

/// What `capture_start` answers: where serve captures.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CaptureStarted {
    /// The source, as `mimic capture --source` writes it (`iface:eth0`).
    pub source: String,
    /// The interface name (empty for a file source).
    pub iface: String,
    /// The BPF filter in force, if any.
    pub filter: Option<String>,
}

/// One closed capture file on the server host.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct CaptureFile {
    /// A plain file name (no directory).
    pub name: String,
    pub bytes: u64,
    /// SHA-256 of the whole file, lowercase hex.
    pub sha256: String,
}

/// What `capture_stop` answers: the capture's summary and its files, in time order.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CaptureStopped {
    pub summary: CaptureSummary,
    pub files: Vec<CaptureFile>,
}

/// What bringing a capture from the server host cost (in the replay's summary).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CaptureFetch {
    pub files: usize,
    pub bytes: u64,
    /// Stopping the capture, copying and checking the files, discarding them there.
    pub seconds: f64,
}

/// Why serve could not do what the controller asked (sent back as the refusal's text).
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("no interface of this host holds the listen address {0}: start `mimic serve` with --capture-iface IF")]
    NoIface(IpAddr),
    #[error("--capture-iface {0}: no such network interface on this host (`ip link` lists them)")]
    NoSuchIface(String),
    #[error("no capture is running or stopped here (capture_start first)")]
    NoCapture,
    #[error("the capture is still running (capture_stop first)")]
    Running,
    #[error("`{0}` is not a file of this capture")]
    UnknownFile(String),
    #[error("the capture did not start within {0:?}")]
    NotReady(Duration),
    #[error("the capture ended at once: {0}")]
    Failed(String),
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Capture(#[from] CaptureRunError),
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> ServiceError {
    let path = path.to_path_buf();
    move |source| ServiceError::Io { what, path, source }
}

enum State {
    Idle,
    Running {
        dir: PathBuf,
        stop: Arc<AtomicBool>,
        thread: JoinHandle<Result<CaptureSummary, CaptureRunError>>,
    },
    Stopped {
        dir: PathBuf,
        done: Box<CaptureStopped>,
    },
}

/// serve's capture of the replays it answers: one at a time, in a directory of its own.
pub struct CaptureService {
    /// Where to capture: `--capture-iface`, else the interface that holds `listen`'s address
    /// (looked up at each start); a file in tests.
    source: Option<SourceSpec>,
    listen: SocketAddr,
    /// Each capture gets a directory under this one.
    root: PathBuf,
    /// The root was made by this service and is removed with it.
    own_root: bool,
    next: AtomicU64,
    state: Mutex<State>,
}

impl CaptureService {
    /// A service for a serve listening on `listen`; `iface` is `--capture-iface`; captures go
    /// under `root` (`--capture-dir`; default: a directory of this process under the
    /// temporary directory, removed when the service is dropped).
    pub fn new(
        listen: SocketAddr,
        iface: Option<String>,
        root: Option<PathBuf>,
    ) -> Result<CaptureService, ServiceError> {
        Self::with_source(listen, iface.map(SourceSpec::Iface), root)
    }

    /// As [`CaptureService::new`], with any capture source (a file, in tests).
    pub fn with_source(
        listen: SocketAddr,
        source: Option<SourceSpec>,
        root: Option<PathBuf>,
    ) -> Result<CaptureService, ServiceError> {
        // checked now: the capture starts only when a replay asks for it, over the control
        // channel, and a misspelt interface would fail that replay rather than this command
        if let Some(SourceSpec::Iface(name)) = &source {
            if mimic_netemu::netns::interface_index(name).is_none() {
                return Err(ServiceError::NoSuchIface(name.clone()));
            }
        }
        if let Some(r) = root.as_ref().filter(|r| r.exists() && !r.is_dir()) {
            return Err(ServiceError::Io {
                what: "--capture-dir",
                path: r.clone(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotADirectory,
                    "not a directory (it names the directory the captures go under)",
                ),
            });
        }
        let (root, own_root) = match root {
            Some(r) => (r, false),
            None => (
                std::env::temp_dir().join(format!("mimic-serve-{}", std::process::id())),
                true,
            ),
        };
        Ok(CaptureService {
            source,
            listen,
            root,
            own_root,
            next: AtomicU64::new(1),
            state: Mutex::new(State::Idle),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts a capture (discarding one left behind) and returns once it is capturing.
    pub fn start(&self) -> Result<CaptureStarted, ServiceError> {
        let mut st = self.state();
        if matches!(*st, State::Running { .. }) {
            tracing::warn!(
                "capture_start: discarding the running capture an earlier controller left behind"
            );
        }
        discard(&mut st);
        let source = match &self.source {
            Some(s) => s.clone(),
            None => SourceSpec::Iface(
                iface_of(self.listen.ip()).ok_or(ServiceError::NoIface(self.listen.ip()))?,
            ),
        };
        let dir = self.root.join(format!(
            "capture-{}",
            self.next.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).map_err(io("creating", &dir))?;
        let mut spec = replay_capture(source.clone(), &dir);
        if matches!(source, SourceSpec::Iface(_)) {
            spec.filter = Some(format!("tcp port {}", self.listen.port()));
        }
        spec.validate()?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (spec, stop) = (spec.clone(), stop.clone());
            std::thread::Builder::new()
                .name("serve-capture".into())
                .spawn(move || {
                    spec.run(RunHooks {
                        quiet: true,
                        stop,
                        probe: None,
                    })
                })
                .map_err(io("starting a thread for", &dir))?
        };
        let until = Instant::now() + READY_WITHIN;
        loop {
            if spec.ready().is_some() {
                break;
            }
            if thread.is_finished() {
                let why = match thread.join() {
                    Ok(Err(e)) => e.to_string(),
                    Ok(Ok(s)) => format!("stopped ({:?})", s.stop_reason),
                    Err(_) => "the capture thread panicked".into(),
                };
                let _ = std::fs::remove_dir_all(&dir);
                return Err(ServiceError::Failed(why));
            }
            if Instant::now() > until {
                stop.store(true, Ordering::Relaxed);
                let _ = thread.join();
                let _ = std::fs::remove_dir_all(&dir);
                return Err(ServiceError::NotReady(READY_WITHIN));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let started = CaptureStarted {
            source: source.to_string(),
            iface: match &source {
                SourceSpec::Iface(i) => i.clone(),
                _ => String::new(),
            },
            filter: spec.filter.clone(),
        };
        tracing::info!(
            "capturing the replay on {} ({})",
            started.source,
            started.filter.as_deref().unwrap_or("no filter")
        );
        *st = State::Running { dir, stop, thread };
        Ok(started)
    }

    /// Stops the capture and lists its files (again, if it was stopped already).
    pub fn stop(&self) -> Result<CaptureStopped, ServiceError> {
        let mut st = self.state();
        match std::mem::replace(&mut *st, State::Idle) {
            State::Idle => Err(ServiceError::NoCapture),
            State::Stopped { dir, done } => {
                let out = (*done).clone();
                *st = State::Stopped { dir, done };
                Ok(out)
            }
            State::Running { dir, stop, thread } => {
                stop.store(true, Ordering::Relaxed);
                let summary = match thread.join() {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        let _ = std::fs::remove_dir_all(&dir);
                        return Err(e.into());
                    }
                    Err(_) => {
                        let _ = std::fs::remove_dir_all(&dir);
                        return Err(ServiceError::Failed("the capture thread panicked".into()));
                    }
                };
                let files = match list(&dir) {
                    Ok(f) => f,
                    Err(e) => {
                        let _ = std::fs::remove_dir_all(&dir);
                        return Err(e);
                    }
                };
                let done = CaptureStopped { summary, files };
                *st = State::Stopped {
                    dir,
                    done: Box::new(done.clone()),
                };
                Ok(done)
            }
        }
    }

    /// Up to `len` bytes (at most [`MAX_CHUNK`]) of the stopped capture's file `name` from
    /// `offset`; fewer at its end.
    pub fn read(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>, ServiceError> {
        let st = self.state();
        let (dir, done) = match &*st {
            State::Stopped { dir, done } => (dir, done),
            State::Running { .. } => return Err(ServiceError::Running),
            State::Idle => return Err(ServiceError::NoCapture),
        };
        // only a listed name: nothing else on this host can be read this way
        if !done.files.iter().any(|f| f.name == name) {
            return Err(ServiceError::UnknownFile(name.to_string()));
        }
        let path = dir.join(name);
        let mut f = std::fs::File::open(&path).map_err(io("opening", &path))?;
        f.seek(SeekFrom::Start(offset))
            .map_err(io("seeking in", &path))?;
        let mut buf = Vec::new();
        f.take(len.min(MAX_CHUNK))
            .read_to_end(&mut buf)
            .map_err(io("reading", &path))?;
        Ok(buf)
    }

    /// Stops a running capture and removes its files.
    pub fn discard(&self) {
        discard(&mut self.state());
    }
}

fn discard(st: &mut State) {
    match std::mem::replace(st, State::Idle) {
        State::Idle => {}
        State::Running { dir, stop, thread } => {
            stop.store(true, Ordering::Relaxed);
            let _ = thread.join();
            let _ = std::fs::remove_dir_all(dir);
        }
        State::Stopped { dir, .. } => {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl Drop for CaptureService {
    fn drop(&mut self) {
        discard(&mut self.state());
        if self.own_root {
            let _ = std::fs::remove_dir(&self.root);
        }
    }
}

/// The capture's pcapng files in name order (time order), with their size and SHA-256.
fn list(dir: &Path) -> Result<Vec<CaptureFile>, ServiceError> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map_err(io("reading", dir))?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "pcapng"))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let p = dir.join(&name);
            let (bytes, sha256) = digest_file(&p).map_err(io("reading", &p))?;
            Ok(CaptureFile {
                name,
                bytes,
                sha256,
            })
        })
        .collect()
}

/// A file's length and SHA-256 (lowercase hex).
pub fn digest_file(p: &Path) -> std::io::Result<(u64, String)> {
    let mut f = std::fs::File::open(p)?;
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 1 << 16];
    let mut n = 0u64;
    loop {
        let k = f.read(&mut buf)?;
        if k == 0 {
            break;
        }
        ctx.update(&buf[..k]);
        n += k as u64;
    }
    Ok((n, hex(ctx.finish().as_ref())))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The interface that holds `addr` on this host (None: none does, or it is unspecified).
pub fn iface_of(addr: IpAddr) -> Option<String> {
    if addr.is_unspecified() {
        return None;
    }
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills ifap with a list we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut ifap) } != 0 {
        return None;
    }
    let mut found = None;
    let mut p = ifap;
    while !p.is_null() {
        // SAFETY: p is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_addr points to a sockaddr whose family says how long it is.
        let fam = unsafe { (*ifa.ifa_addr).sa_family } as i32;
        let a: Option<IpAddr> = match fam {
            libc::AF_INET => {
                // SAFETY: an AF_INET address is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                Some(IpAddr::from(
                    u32::from_be(sin.sin_addr.s_addr).to_be_bytes(),
                ))
            }
            libc::AF_INET6 => {
                // SAFETY: an AF_INET6 address is a sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                Some(IpAddr::from(sin6.sin6_addr.s6_addr))
            }
            _ => None,
        };
        if a == Some(addr) {
            // SAFETY: ifa_name is a NUL-terminated string owned by the list.
            let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
            found = Some(name.to_string_lossy().into_owned());
            break;
        }
    }
    // SAFETY: freeing the list getifaddrs allocated, once; nothing points into it any more.
    unsafe { libc::freeifaddrs(ifap) };
    found
}

/// Why a capture could not be brought over.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error(transparent)]
    Control(#[from] mimic_control::ControlError),
    #[error("capture file `{0}`: not a plain file name")]
    BadName(String),
    #[error("capture file {name}: {why}")]
    Corrupt { name: String, why: String },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Copies the capture files `files` from serve (`read` asks for one chunk: name, offset,
/// length) into `dir`, each written under a temporary name and renamed once its size and
/// SHA-256 match the listing. Returns the local paths in the listing's order.
pub fn fetch(
    files: &[CaptureFile],
    dir: &Path,
    mut read: impl FnMut(&str, u64, u64) -> Result<Vec<u8>, mimic_control::ControlError>,
) -> Result<Vec<PathBuf>, FetchError> {
    let mut out = Vec::new();
    for f in files {
        let plain = Path::new(&f.name)
            .file_name()
            .is_some_and(|n| n == f.name.as_str())
            && !f.name.starts_with('.');
        if !plain {
            return Err(FetchError::BadName(f.name.clone()));
        }
        let dest = dir.join(&f.name);
        let part = dir.join(format!(".{}.part", f.name));
        let ioe = |path: &Path| {
            let path = path.to_path_buf();
            move |source| FetchError::Io { path, source }
        };
        let mut w = std::fs::File::create(&part).map_err(ioe(&part))?;
        let mut off = 0u64;
        while off < f.bytes {
            let chunk = read(&f.name, off, CHUNK.min(f.bytes - off))?;
            if chunk.is_empty() {
                let _ = std::fs::remove_file(&part);
                return Err(FetchError::Corrupt {
                    name: f.name.clone(),
                    why: format!("ends at {off} bytes, {} listed", f.bytes),
                });
            }
            w.write_all(&chunk).map_err(ioe(&part))?;
            off += chunk.len() as u64;
        }
        w.sync_all().map_err(ioe(&part))?;
        drop(w);
        let (n, sha) = digest_file(&part).map_err(ioe(&part))?;
        if n != f.bytes || sha != f.sha256 {
            let _ = std::fs::remove_file(&part);
            return Err(FetchError::Corrupt {
                name: f.name.clone(),
                why: format!(
                    "{n} bytes with SHA-256 {sha} arrived, {} bytes with SHA-256 {} listed",
                    f.bytes, f.sha256
                ),
            });
        }
        std::fs::rename(&part, &dest).map_err(ioe(&dest))?;
        out.push(dest);
    }
    Ok(out)
}

/// base64 for a chunk inside a JSON line.
pub(crate) fn encode(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

pub(crate) fn decode(s: &str) -> Result<Vec<u8>, String> {
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .map_err(|e| format!("capture chunk: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::{self, ControlAddr, ControllerTls, Listener, RoleTls, ServeClient};
    use crate::server::{AllowList, Stats};
    use mimic_core::testcap::{write_capture, Capture, Conn, Exchange};

    /// A serve control channel (no data port) with `capture`, on a unix socket in `dir`.
    fn serve_control(
        dir: &Path,
        capture: Option<Arc<CaptureService>>,
    ) -> (control::ControlServer, ControlAddr, ControllerTls) {
        let pki = dir.join("pki");
        mimic_control::pki::init(&pki, &Default::default()).unwrap();
        let addr = ControlAddr::Unix(dir.join("serve.sock"));
        let (stop_tx, _stop_rx) = tokio::sync::watch::channel(false);
        let ctl = control::spawn(
            Listener::bind(&addr).unwrap(),
            RoleTls::load(&pki, control::ROLE).unwrap(),
            Stats::default(),
            AllowList::anyone(),
            capture,
            stop_tx,
        )
        .unwrap();
        (ctl, addr, ControllerTls::load(&pki).unwrap())
    }

    /// The server host's capture, started, stopped and brought to the controller over the
    /// real control channel (TLS, JSON lines, base64 chunks): the controller's copy is the
    /// server's file byte for byte, and the server's copy is gone afterwards.
    #[test]
    fn a_capture_at_the_server_reaches_the_controller_intact() {
        let tmp = tempfile::Builder::new()
            .prefix("mimic-serve-cap-")
            .tempdir()
            .unwrap();
        let d = tmp.path();
        let server: SocketAddr = "198.18.1.1:80".parse().unwrap();
        let conns: Vec<Conn> = (0..40)
            .map(|i| {
                let mut c = Conn::new(
                    format!("198.19.0.{}:{}", 1 + i % 4, 40000 + i)
                        .parse()
                        .unwrap(),
                    server,
                    1_700_000_000_000_000_000 + i as i64 * 3_000_000,
                );
                c.exchanges
                    .push(Exchange::http_get("/x", 20_000, 0, 5_000_000));
                c
            })
            .collect();
        let trace = d.join("tap.pcap");
        write_capture(&trace, &Capture::default(), &conns).unwrap();
        let root = d.join("serve-captures");
        let service = Arc::new(
            CaptureService::with_source(
                server,
                Some(SourceSpec::File(trace.clone())),
                Some(root.clone()),
            )
            .unwrap(),
        );
        let (ctl, addr, tls) = serve_control(d, Some(service.clone()));
        let mut c = ServeClient::connect(&addr, &tls).unwrap();

        // nothing to stop or read before a start
        let e = c.capture_stop().unwrap_err().to_string();
        assert!(e.contains("capture_start first"), "{e}");

        let started = c.capture_start().unwrap();
        assert_eq!(started.source, format!("pcap:{}", trace.display()));
        assert_eq!(started.filter, None, "a file source takes no BPF filter");
        let e = c.capture_read("x.pcapng", 0, 10).unwrap_err().to_string();
        assert!(e.contains("still running"), "{e}");

        let stopped = c.capture_stop().unwrap();
        assert!(!stopped.files.is_empty());
        let packets: usize = conns.iter().map(|c| c.packets().len()).sum();
        assert_eq!(
            stopped.summary.totals.written, packets as u64,
            "{:?}",
            stopped.summary
        );
        // only the listed files can be read: no path leads elsewhere on the server host
        for bad in ["../tap.pcap", "capture.key", "/etc/passwd"] {
            let e = c.capture_read(bad, 0, 10).unwrap_err().to_string();
            assert!(e.contains("not a file of this capture"), "{bad}: {e}");
        }
        let server_dir = root.join("capture-1");
        let originals: Vec<Vec<u8>> = stopped
            .files
            .iter()
            .map(|f| std::fs::read(server_dir.join(&f.name)).unwrap())
            .collect();

        let here = d.join("here");
        std::fs::create_dir_all(&here).unwrap();
        let (again, files) = c.capture_collect(&here).unwrap();
        assert_eq!(again, stopped, "a second stop answers the same");
        assert_eq!(files.len(), stopped.files.len());
        for ((f, listed), orig) in files.iter().zip(&stopped.files).zip(&originals) {
            assert_eq!(&std::fs::read(f).unwrap(), orig, "{}", f.display());
            assert_eq!(
                digest_file(f).unwrap(),
                (listed.bytes, listed.sha256.clone())
            );
        }
        assert!(!server_dir.exists(), "the server's copy is discarded");
        let e = c.capture_stop().unwrap_err().to_string();
        assert!(e.contains("capture_start first"), "{e}");

        // a second replay's capture replaces one a vanished controller left running
        c.capture_start().unwrap();
        c.capture_start().unwrap();
        assert!(
            !root.join("capture-2").exists(),
            "the stale capture is gone"
        );
        assert!(root.join("capture-3").exists());
        drop(c);
        ctl.stop();
        drop(service);
        assert!(
            !root.join("capture-3").exists(),
            "serve removes its captures at exit"
        );
    }

    /// A file that arrives other than listed (short, or another SHA-256) is refused by name and
    /// leaves nothing behind; chunks shorter than asked for are put together.
    #[test]
    fn a_fetched_file_is_checked_by_size_and_hash() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        let src = d.join("a.pcapng");
        let body: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        std::fs::write(&src, &body).unwrap();
        let (bytes, sha256) = digest_file(&src).unwrap();
        // SHA-256 of the empty string, the published value
        std::fs::write(d.join("empty"), b"").unwrap();
        assert_eq!(
            digest_file(&d.join("empty")).unwrap().1,
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        let listed = CaptureFile {
            name: "a.pcapng".into(),
            bytes,
            sha256: sha256.clone(),
        };
        // served 1000 bytes at a time
        let read = |_: &str, off: u64, len: u64| {
            let e = (off + len.min(1000)).min(body.len() as u64);
            Ok(body[off as usize..e as usize].to_vec())
        };
        let out = d.join("out");
        std::fs::create_dir_all(&out).unwrap();
        let got = fetch(std::slice::from_ref(&listed), &out, read).unwrap();
        assert_eq!(std::fs::read(&got[0]).unwrap(), body);

        let leftovers = |dir: &Path| std::fs::read_dir(dir).unwrap().count();
        let out2 = d.join("out2");
        std::fs::create_dir_all(&out2).unwrap();
        let mut wrong = listed.clone();
        wrong.sha256 = "00".repeat(32);
        let e = fetch(&[wrong], &out2, read).unwrap_err().to_string();
        assert!(e.contains("a.pcapng") && e.contains("SHA-256"), "{e}");
        let mut longer = listed.clone();
        longer.bytes += 5;
        let e = fetch(&[longer], &out2, read).unwrap_err().to_string();
        assert!(e.contains("ends at 10000 bytes, 10005 listed"), "{e}");
        assert_eq!(leftovers(&out2), 0, "no partial file is left");
        for bad in ["../a.pcapng", ".hidden", "x/y.pcapng"] {
            let mut f = listed.clone();
            f.name = bad.into();
            assert!(
                matches!(fetch(&[f], &out2, read), Err(FetchError::BadName(_))),
                "{bad}"
            );
        }
    }

    /// A serve without a capture service says so; the listen address's interface is found.
    #[test]
    fn capture_needs_a_service_and_an_interface() {
        let tmp = tempfile::tempdir().unwrap();
        let (ctl, addr, tls) = serve_control(tmp.path(), None);
        let e = ServeClient::connect(&addr, &tls)
            .unwrap()
            .capture_start()
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not capture"), "{e}");
        ctl.stop();
        assert_eq!(
            iface_of("127.0.0.1".parse().unwrap()).as_deref(),
            Some("lo")
        );
        assert_eq!(iface_of("0.0.0.0".parse().unwrap()), None);
        assert_eq!(iface_of("203.0.113.77".parse().unwrap()), None);
        let s = CaptureService::new(
            "203.0.113.77:80".parse().unwrap(),
            None,
            Some(tmp.path().join("c")),
        )
        .unwrap();
        let e = s.start().unwrap_err().to_string();
        assert!(e.contains("--capture-iface"), "{e}");
        // a named interface that does not exist is refused when serve starts, not when a
        // replay asks for the capture
        let e = CaptureService::new(
            "127.0.0.1:80".parse().unwrap(),
            Some("nosuchif0".into()),
            Some(tmp.path().join("c")),
        )
        .err()
        .expect("an interface that does not exist is refused")
        .to_string();
        assert!(
            e.contains("--capture-iface nosuchif0: no such network interface"),
            "{e}"
        );
        // a --capture-dir that is a file: refused at start too
        let file = tmp.path().join("f");
        std::fs::write(&file, "x").unwrap();
        let e = CaptureService::new("127.0.0.1:80".parse().unwrap(), None, Some(file))
            .err()
            .expect("a file as --capture-dir is refused")
            .to_string();
        assert!(
            e.contains("--capture-dir") && e.contains("not a directory"),
            "{e}"
        );
        CaptureService::new(
            "127.0.0.1:80".parse().unwrap(),
            Some("lo".into()),
            Some(tmp.path().join("c")),
        )
        .unwrap();
    }
}
