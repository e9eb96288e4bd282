//! The role's side: a listener, a TLS handshake that authenticates the controller, then one
//! thread per connection reading request lines and handing them to the role's handler.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::{ServerConnection, StreamOwned};
use serde_json::{json, Value};

use crate::{explain, tls_error, ControlAddr, RoleTls, Stream, CALL_TIMEOUT, HANDSHAKE_TIMEOUT};

/// What a role does with an authenticated request: the whole request object (its `op` and
/// arguments) in, the `result` or an error message out. It runs on the connection's thread.
pub type Handler = Arc<dyn Fn(Value) -> Result<Value, String> + Send + Sync>;

/// A bound control listener.
pub enum Listener {
    /// The socket, its path, and the directories made for it (deepest first), removed with
    /// it when empty.
    Unix(UnixListener, PathBuf, Vec<PathBuf>),
    Tcp(TcpListener),
}

impl Listener {
    /// Binds `addr`. A stale unix socket file is replaced (a live one is an error, and so is
    /// anything there that is not a socket: a file given by mistake would be deleted); its
    /// directory is created (and removed with the socket, if it was made here and is empty
    /// then); the socket is made mode 0600.
    pub fn bind(addr: &ControlAddr) -> io::Result<Listener> {
        match addr {
            ControlAddr::Unix(p) => {
                use std::os::unix::fs::FileTypeExt;
                // sockaddr_un's path holds 107 bytes and a NUL: refused before any directory
                // is made for it
                const SUN_PATH: usize = 107;
                let len = p.as_os_str().len();
                if len > SUN_PATH {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!(
                            "{}: a unix socket path holds at most {SUN_PATH} bytes, this one has {len}: name a shorter path",
                            p.display()
                        ),
                    ));
                }
                if let Ok(m) = std::fs::symlink_metadata(p) {
                    if !m.file_type().is_socket() {
                        return Err(io::Error::new(
                            io::ErrorKind::AlreadyExists,
                            format!(
                                "{}: exists and is not a socket (not replacing it): name a path for the control socket",
                                p.display()
                            ),
                        ));
                    }
                }
                let made: Vec<PathBuf> = p
                    .ancestors()
                    .skip(1)
                    .filter(|a| !a.as_os_str().is_empty())
                    .take_while(|a| !a.exists())
                    .map(Path::to_path_buf)
                    .collect();
                let remove_made = |made: &[PathBuf]| {
                    for d in made {
                        let _ = std::fs::remove_dir(d);
                    }
                };
                if let Some(d) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(d).map_err(|e| {
                        remove_made(&made);
                        io::Error::new(
                            e.kind(),
                            format!("{}: making its directory {}: {e}", p.display(), d.display()),
                        )
                    })?;
                }
                if UnixStream::connect(p).is_ok() {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        format!("{}: another role is listening there", p.display()),
                    ));
                }
                let _ = std::fs::remove_file(p);
                let l = UnixListener::bind(p).map_err(|e| {
                    remove_made(&made);
                    io::Error::new(e.kind(), format!("{}: {e}", p.display()))
                })?;
                use std::os::unix::fs::PermissionsExt;
                let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600));
                Ok(Listener::Unix(l, p.clone(), made))
            }
            ControlAddr::Tcp(a) => TcpListener::bind(a)
                .map(Listener::Tcp)
                .map_err(|e| io::Error::new(e.kind(), format!("{a}: {e}"))),
        }
    }

    /// The address it listens on (a TCP port 0 resolved).
    pub fn local_addr(&self) -> io::Result<ControlAddr> {
        match self {
            Listener::Unix(_, p, _) => Ok(ControlAddr::Unix(p.clone())),
            Listener::Tcp(l) => Ok(ControlAddr::Tcp(l.local_addr()?.to_string())),
        }
    }

    fn accept(&self) -> io::Result<(Stream, String)> {
        match self {
            Listener::Unix(l, p, _) => l
                .accept()
                .map(|(s, _)| (Stream::Unix(s), format!("unix:{}", p.display()))),
            Listener::Tcp(l) => l.accept().map(|(s, peer)| {
                let _ = s.set_nodelay(true);
                (Stream::Tcp(s), peer.to_string())
            }),
        }
    }

    fn set_nonblocking(&self, nb: bool) -> io::Result<()> {
        match self {
            Listener::Unix(l, _, _) => l.set_nonblocking(nb),
            Listener::Tcp(l) => l.set_nonblocking(nb),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, p, made) = self {
            let _ = std::fs::remove_file(p);
            for d in made.iter() {
                let _ = std::fs::remove_dir(d);
            }
        }
    }
}

/// What the server has seen, for tests, logs and metrics.
#[derive(Debug, Default)]
pub struct ServerCounters {
    /// Connections that completed the handshake (authenticated controllers).
    pub authenticated: AtomicU64,
    /// Connections refused during the handshake (no, wrong or misused certificate; not TLS;
    /// a replayed handshake; too slow).
    pub refused: AtomicU64,
    /// Requests handed to the role's handler.
    pub requests: AtomicU64,
}

const MAX_CONNECTIONS: usize = 64;
const MAX_LINE: usize = 64 << 20;

/// A role's control server.
pub struct Server {
    listener: Listener,
    tls: RoleTls,
    handler: Handler,
    stop: Arc<AtomicBool>,
    counters: Arc<ServerCounters>,
}

impl Server {
    /// `handler` runs every request but `hello`, which the server answers with the role's
    /// name and version. The server runs until `stop` is set.
    pub fn new(
        listener: Listener,
        tls: RoleTls,
        handler: Handler,
        stop: Arc<AtomicBool>,
    ) -> Server {
        Server {
            listener,
            tls,
            handler,
            stop,
            counters: Arc::default(),
        }
    }

    pub fn counters(&self) -> Arc<ServerCounters> {
        self.counters.clone()
    }

    /// Serves on a thread of its own (`mimic-control`).
    pub fn spawn(self) -> io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new()
            .name("mimic-control".into())
            .spawn(move || self.run())
    }

    /// Serves until `stop` is set: one thread per connection (at most 64).
    pub fn run(self) {
        let _ = self.listener.set_nonblocking(true);
        let active = Arc::new(AtomicUsize::new(0));
        while !self.stop.load(Ordering::Relaxed) {
            match self.listener.accept() {
                Ok((s, peer)) => {
                    if active.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
                        tracing::warn!("control channel: too many connections; closed {peer}");
                        continue;
                    }
                    let conn = Conn {
                        role: self.tls.role().to_string(),
                        tls: self.tls.config(),
                        handler: self.handler.clone(),
                        stop: self.stop.clone(),
                        counters: self.counters.clone(),
                        peer,
                    };
                    let active = active.clone();
                    active.fetch_add(1, Ordering::Relaxed);
                    let spawned = std::thread::Builder::new()
                        .name("mimic-control-conn".into())
                        .spawn({
                            let active = active.clone();
                            move || {
                                conn.run(s);
                                active.fetch_sub(1, Ordering::Relaxed);
                            }
                        });
                    if spawned.is_err() {
                        active.fetch_sub(1, Ordering::Relaxed);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => {
                    tracing::warn!("control channel: accept: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }
}

struct Conn {
    role: String,
    tls: Arc<rustls::ServerConfig>,
    handler: Handler,
    stop: Arc<AtomicBool>,
    counters: Arc<ServerCounters>,
    peer: String,
}

impl Conn {
    fn run(self, s: Stream) {
        let refuse = |why: String| {
            self.counters.refused.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("control channel: refused {}: {why}", self.peer);
        };
        let mut s = s;
        // blocking with a short read timeout, so the thread notices a stop; a controller that
        // reads no answers, or whose host went away, ends the connection rather than holding
        // its thread for ever
        if s.set_nonblocking(false).is_err()
            || s.set_read_timeout(Some(Duration::from_millis(500)))
                .is_err()
            || s.set_write_timeout(Some(CALL_TIMEOUT)).is_err()
            || s.watch_peer().is_err()
        {
            return;
        }
        let mut tls = match ServerConnection::new(self.tls.clone()) {
            Ok(c) => c,
            Err(e) => return refuse(e.to_string()),
        };
        let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
        while tls.is_handshaking() {
            if self.stop.load(Ordering::Relaxed) {
                return;
            }
            if Instant::now() > deadline {
                return refuse(format!(
                    "no TLS handshake within {} s",
                    HANDSHAKE_TIMEOUT.as_secs()
                ));
            }
            match tls.complete_io(&mut s) {
                Ok((0, 0)) if tls.is_handshaking() => {
                    return refuse("closed during the handshake".into())
                }
                Ok(_) => {}
                Err(e) if is_timeout(&e) => {}
                Err(e) => {
                    return refuse(match tls_error(&e) {
                        Some(t) => explain(t),
                        None if e.kind() == io::ErrorKind::UnexpectedEof => {
                            "the peer gave up during the handshake (it does not trust this role's certificate: another PKI's CA, or it expected another role)".into()
                        }
                        None => format!("handshake: {e}"),
                    })
                }
            }
        }
        self.counters.authenticated.fetch_add(1, Ordering::Relaxed);
        tracing::debug!("control channel: {} authenticated", self.peer);
        if let Err(e) = self.serve(StreamOwned::new(tls, s)) {
            tracing::debug!("control channel {}: {e}", self.peer);
        }
    }

    fn serve(&self, stream: StreamOwned<ServerConnection, Stream>) -> io::Result<()> {
        let mut r = BufReader::new(stream);
        let mut line = Vec::new();
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            match r
                .by_ref()
                .take(MAX_LINE as u64)
                .read_until(b'\n', &mut line)
            {
                Ok(0) => return Ok(()),
                Ok(_) if line.last() != Some(&b'\n') && line.len() >= MAX_LINE => {
                    let w = r.get_mut();
                    writeln!(
                        w,
                        "{}",
                        json!({"ok": false, "error": "request line too long"})
                    )?;
                    return w.flush();
                }
                Ok(_) if line.last() != Some(&b'\n') => continue, // partial line (timeout mid-line)
                Ok(_) => {}
                Err(e) if is_timeout(&e) => continue,
                Err(e) => return Err(e),
            }
            let resp = match serde_json::from_slice::<Value>(&line) {
                Err(e) => json!({"ok": false, "error": format!("bad request: {e}")}),
                Ok(v) if !v.is_object() || !v.get("op").is_some_and(Value::is_string) => {
                    json!({"ok": false, "error": "bad request: not an object with an \"op\""})
                }
                Ok(v) if v["op"] == "hello" => json!({"ok": true, "result": {
                    "role": self.role,
                    "server": format!("mimic {}", self.role),
                    "version": env!("CARGO_PKG_VERSION"),
                }}),
                Ok(v) => {
                    self.counters.requests.fetch_add(1, Ordering::Relaxed);
                    match (self.handler)(v) {
                        Ok(result) => json!({"ok": true, "result": result}),
                        Err(e) => json!({"ok": false, "error": e}),
                    }
                }
            };
            line.clear();
            let mut out = serde_json::to_vec(&resp).unwrap_or_default();
            out.push(b'\n');
            let w = r.get_mut();
            w.write_all(&out)?;
            w.flush()?;
        }
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}
