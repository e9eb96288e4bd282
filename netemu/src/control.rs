//! The control channel of a running emulator: newline-delimited JSON over a unix socket
//! (`unix:PATH`) or TCP (`tcp:HOST:PORT`), authenticated by a shared token.
//!
//! Every connection starts with `{"op":"hello","token":"..."}`; anything else, or a wrong
//! token, gets an error and the connection is closed. Then each request line gets one response
//! line: `{"ok":true,"result":...}` or `{"ok":false,"error":"..."}`. Requests:
//! `add_flows {rules}`, `update_flow {id, up?, down?}`, `remove_flows {ids}`, `counters`,
//! `stats`, `set_default {up, down}` (null clears), `add_prefix {rule}`, `shutdown`.
//! Requests run on the datapath thread between packets; a batch of flow rules is added all
//! or none.

use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::config::PipeConfig;
use crate::datapath::{DatapathStats, Job, Waker};
use crate::engine::{EngineStats, FlowRule, PipeCounters, PrefixRule, RuleId};
use crate::pipe::Counters;

/// Where a control channel listens: `unix:/run/mimic/lab/netemu.sock` or `tcp:127.0.0.1:7070`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControlAddr {
    Unix(PathBuf),
    Tcp(String),
}

impl FromStr for ControlAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return Err("unix: needs a path".into());
            }
            Ok(ControlAddr::Unix(p.into()))
        } else if let Some(a) = s.strip_prefix("tcp:") {
            if !a.contains(':') {
                return Err(format!("`{s}`: write tcp:HOST:PORT"));
            }
            Ok(ControlAddr::Tcp(a.into()))
        } else {
            Err(format!(
                "`{s}` is not a control address (unix:PATH or tcp:HOST:PORT)"
            ))
        }
    }
}

impl fmt::Display for ControlAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControlAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            ControlAddr::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("control channel {addr}: {err}")]
    Io { addr: String, err: io::Error },
    #[error("control channel: the emulator refused: {0}")]
    Refused(String),
    #[error("control channel: bad response: {0}")]
    Protocol(String),
}

#[derive(Serialize, Deserialize, Debug)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Request {
    Hello {
        token: String,
    },
    AddFlows {
        rules: Vec<FlowRule>,
    },
    UpdateFlow {
        id: RuleId,
        up: Option<PipeConfig>,
        down: Option<PipeConfig>,
    },
    RemoveFlows {
        ids: Vec<RuleId>,
    },
    Counters,
    Stats,
    SetDefault {
        up: Option<PipeConfig>,
        down: Option<PipeConfig>,
    },
    AddPrefix {
        rule: PrefixRule,
    },
    Shutdown,
}

/// Final counters of a removed flow rule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RemovedFlow {
    pub id: RuleId,
    pub up: Counters,
    pub down: Counters,
}

/// Engine and datapath counters of a running emulator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunStats {
    pub engine: EngineStats,
    pub datapath: DatapathStats,
}

enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
        })
    }
    fn set_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_read_timeout(t),
            Stream::Tcp(s) => s.set_read_timeout(t),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(b),
            Stream::Tcp(s) => s.read(b),
        }
    }
}
impl Write for Stream {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(b),
            Stream::Tcp(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.flush(),
            Stream::Tcp(s) => s.flush(),
        }
    }
}

/// A blocking client of a running emulator (`mimic netemu run`).
pub struct Client {
    addr: String,
    w: Stream,
    r: BufReader<Stream>,
}

impl Client {
    /// Connects and authenticates with `token`.
    pub fn connect(addr: &ControlAddr, token: &str) -> Result<Client, ControlError> {
        let name = addr.to_string();
        let ioe = |err: io::Error| ControlError::Io {
            addr: name.clone(),
            err,
        };
        let s = match addr {
            ControlAddr::Unix(p) => Stream::Unix(UnixStream::connect(p).map_err(ioe)?),
            ControlAddr::Tcp(a) => {
                let t = TcpStream::connect(a).map_err(ioe)?;
                let _ = t.set_nodelay(true);
                Stream::Tcp(t)
            }
        };
        let r = BufReader::new(s.try_clone().map_err(ioe)?);
        let mut c = Client {
            addr: name.clone(),
            w: s,
            r,
        };
        c.call(&Request::Hello {
            token: token.into(),
        })?;
        Ok(c)
    }

    fn call(&mut self, req: &Request) -> Result<Value, ControlError> {
        let mut line =
            serde_json::to_vec(req).map_err(|e| ControlError::Protocol(e.to_string()))?;
        line.push(b'\n');
        let addr = self.addr.clone();
        let ioe = |err: io::Error| ControlError::Io {
            addr: addr.clone(),
            err,
        };
        self.w.write_all(&line).map_err(ioe)?;
        self.w.flush().map_err(ioe)?;
        let mut resp = String::new();
        let n = self.r.read_line(&mut resp).map_err(ioe)?;
        if n == 0 {
            return Err(ControlError::Refused(
                "the emulator closed the connection".into(),
            ));
        }
        let v: Value = serde_json::from_str(&resp)
            .map_err(|e| ControlError::Protocol(format!("{e}: {resp}")))?;
        if v.get("ok") == Some(&Value::Bool(true)) {
            Ok(v.get("result").cloned().unwrap_or(Value::Null))
        } else {
            Err(ControlError::Refused(
                v.get("error")
                    .and_then(|e| e.as_str())
                    .unwrap_or("unknown error")
                    .to_string(),
            ))
        }
    }

    fn decode<T: for<'de> Deserialize<'de>>(v: Value) -> Result<T, ControlError> {
        serde_json::from_value(v).map_err(|e| ControlError::Protocol(e.to_string()))
    }

    /// Adds flow rules in one batch (all or none); returns their ids in order.
    pub fn add_flows(&mut self, rules: &[FlowRule]) -> Result<Vec<RuleId>, ControlError> {
        let v = self.call(&Request::AddFlows {
            rules: rules.to_vec(),
        })?;
        Self::decode(v)
    }

    /// Changes a rule's pipes in place (`None` leaves that direction as it is).
    pub fn update_flow(
        &mut self,
        id: RuleId,
        up: Option<&PipeConfig>,
        down: Option<&PipeConfig>,
    ) -> Result<(), ControlError> {
        self.call(&Request::UpdateFlow {
            id,
            up: up.cloned(),
            down: down.cloned(),
        })
        .map(|_| ())
    }

    /// Removes rules; returns the final counters of those that existed.
    pub fn remove_flows(&mut self, ids: &[RuleId]) -> Result<Vec<RemovedFlow>, ControlError> {
        let v = self.call(&Request::RemoveFlows { ids: ids.to_vec() })?;
        Self::decode(v)
    }

    pub fn counters(&mut self) -> Result<Vec<PipeCounters>, ControlError> {
        let v = self.call(&Request::Counters)?;
        Self::decode(v)
    }

    pub fn stats(&mut self) -> Result<RunStats, ControlError> {
        let v = self.call(&Request::Stats)?;
        Self::decode(v)
    }

    /// Replaces the default pipes (`None` for both: unmatched traffic passes unshaped).
    pub fn set_default(
        &mut self,
        up: Option<&PipeConfig>,
        down: Option<&PipeConfig>,
    ) -> Result<(), ControlError> {
        self.call(&Request::SetDefault {
            up: up.cloned(),
            down: down.cloned(),
        })
        .map(|_| ())
    }

    pub fn add_prefix(&mut self, rule: &PrefixRule) -> Result<usize, ControlError> {
        let v = self.call(&Request::AddPrefix { rule: rule.clone() })?;
        Self::decode(v)
    }

    /// Asks the emulator to stop (it prints its counters and exits 0).
    pub fn shutdown(&mut self) -> Result<(), ControlError> {
        self.call(&Request::Shutdown).map(|_| ())
    }
}

/// A bound control listener.
pub enum Listener {
    Unix(UnixListener, PathBuf),
    Tcp(TcpListener),
}

impl Listener {
    /// Binds `addr`. A stale unix socket file is replaced; its directory is created.
    pub fn bind(addr: &ControlAddr) -> io::Result<Listener> {
        match addr {
            ControlAddr::Unix(p) => {
                if let Some(d) = p.parent() {
                    std::fs::create_dir_all(d)?;
                }
                if UnixStream::connect(p).is_ok() {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        format!("{}: another emulator is listening there", p.display()),
                    ));
                }
                let _ = std::fs::remove_file(p);
                let l = UnixListener::bind(p)
                    .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", p.display())))?;
                use std::os::unix::fs::PermissionsExt;
                let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600));
                Ok(Listener::Unix(l, p.clone()))
            }
            ControlAddr::Tcp(a) => TcpListener::bind(a)
                .map(Listener::Tcp)
                .map_err(|e| io::Error::new(e.kind(), format!("{a}: {e}"))),
        }
    }

    fn accept(&self) -> io::Result<Stream> {
        match self {
            Listener::Unix(l, _) => l.accept().map(|(s, _)| Stream::Unix(s)),
            Listener::Tcp(l) => l.accept().map(|(s, _)| {
                let _ = s.set_nodelay(true);
                Stream::Tcp(s)
            }),
        }
    }

    fn set_nonblocking(&self, nb: bool) -> io::Result<()> {
        match self {
            Listener::Unix(l, _) => l.set_nonblocking(nb),
            Listener::Tcp(l) => l.set_nonblocking(nb),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, p) = self {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

const MAX_CONNECTIONS: usize = 64;
const MAX_LINE: usize = 64 << 20;

/// Serves the control channel until `stop` is set: one thread per connection (at most 64),
/// each request run on the datapath thread as a [`Job`].
pub fn serve(
    listener: Listener,
    token: String,
    jobs: Sender<Job>,
    waker: Waker,
    stop: Arc<AtomicBool>,
) {
    let _ = listener.set_nonblocking(true);
    let active = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok(s) => {
                if active.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
                    let mut s = s;
                    let _ = writeln!(
                        s,
                        "{}",
                        json!({"ok": false, "error": "too many control connections"})
                    );
                    continue;
                }
                let (token, jobs, stop, active) =
                    (token.clone(), jobs.clone(), stop.clone(), active.clone());
                active.fetch_add(1, Ordering::Relaxed);
                std::thread::Builder::new()
                    .name("netemu-control".into())
                    .spawn(move || {
                        let _ = connection(s, &token, &jobs, waker, &stop);
                        active.fetch_sub(1, Ordering::Relaxed);
                    })
                    .ok();
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

fn connection(
    s: Stream,
    token: &str,
    jobs: &Sender<Job>,
    waker: Waker,
    stop: &AtomicBool,
) -> io::Result<()> {
    // Blocking, with a read timeout so the thread notices a stop.
    if let Stream::Unix(u) = &s {
        u.set_nonblocking(false)?;
    }
    if let Stream::Tcp(t) = &s {
        t.set_nonblocking(false)?;
    }
    s.set_timeout(Some(Duration::from_millis(500)))?;
    let mut w = s.try_clone()?;
    let mut r = BufReader::new(s);
    let mut authed = false;
    let mut line = Vec::new();
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        match r
            .by_ref()
            .take(MAX_LINE as u64)
            .read_until(b'\n', &mut line)
        {
            Ok(0) => return Ok(()),
            Ok(_) if line.last() != Some(&b'\n') && line.len() >= MAX_LINE => {
                writeln!(
                    w,
                    "{}",
                    json!({"ok": false, "error": "request line too long"})
                )?;
                return Ok(());
            }
            Ok(_) if line.last() != Some(&b'\n') => continue, // partial line (timeout mid-line)
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) => return Err(e),
        }
        let req: Result<Request, _> = serde_json::from_slice(&line);
        line.clear();
        let resp = match req {
            Err(e) => json!({"ok": false, "error": format!("bad request: {e}")}),
            Ok(Request::Hello { token: t }) => {
                if ct_eq(t.as_bytes(), token.as_bytes()) {
                    authed = true;
                    json!({"ok": true})
                } else {
                    writeln!(w, "{}", json!({"ok": false, "error": "wrong token"}))?;
                    return Ok(());
                }
            }
            Ok(_) if !authed => {
                writeln!(
                    w,
                    "{}",
                    json!({"ok": false, "error": "authenticate first: {\"op\":\"hello\",\"token\":...}"})
                )?;
                return Ok(());
            }
            Ok(req) => run_on_datapath(req, jobs, waker),
        };
        let mut out = serde_json::to_vec(&resp).unwrap_or_default();
        out.push(b'\n');
        w.write_all(&out)?;
    }
}

fn run_on_datapath(req: Request, jobs: &Sender<Job>, waker: Waker) -> Value {
    let (tx, rx) = mpsc::sync_channel::<Value>(1);
    let job: Job = Box::new(move |ctx| {
        let r: Result<Value, String> = match req {
            Request::Hello { .. } => Ok(Value::Null),
            Request::AddFlows { rules } => ctx
                .engine
                .add_flows(&rules)
                .map(|ids| json!(ids))
                .map_err(|e| e.to_string()),
            Request::UpdateFlow { id, up, down } => ctx
                .engine
                .update_flow(id, up, down, ctx.now)
                .map(|_| Value::Null)
                .map_err(|e| e.to_string()),
            Request::RemoveFlows { ids } => {
                let v: Vec<RemovedFlow> = ctx
                    .engine
                    .remove_flows(&ids, ctx.now)
                    .into_iter()
                    .map(|(id, up, down)| RemovedFlow { id, up, down })
                    .collect();
                Ok(json!(v))
            }
            Request::Counters => Ok(json!(ctx.engine.counters())),
            Request::Stats => {
                let mut d = ctx.stats.clone();
                d.finish();
                Ok(json!(RunStats {
                    engine: ctx.engine.stats(),
                    datapath: d
                }))
            }
            Request::SetDefault { up, down } => match (up, down) {
                (Some(u), Some(d)) => ctx
                    .engine
                    .set_default(Some((u, d)))
                    .map(|_| Value::Null)
                    .map_err(|e| e.to_string()),
                (None, None) => ctx
                    .engine
                    .set_default(None)
                    .map(|_| Value::Null)
                    .map_err(|e| e.to_string()),
                _ => Err("set_default needs both up and down (or neither)".into()),
            },
            Request::AddPrefix { rule } => ctx
                .engine
                .add_prefix(rule)
                .map(|i| json!(i))
                .map_err(|e| e.to_string()),
            Request::Shutdown => {
                *ctx.stop = true;
                Ok(Value::Null)
            }
        };
        let _ = tx.send(match r {
            Ok(v) => json!({"ok": true, "result": v}),
            Err(e) => json!({"ok": false, "error": e}),
        });
    });
    if jobs.send(job).is_err() {
        return json!({"ok": false, "error": "the datapath has stopped"});
    }
    waker.wake();
    rx.recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| json!({"ok": false, "error": "the datapath did not answer"}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(
            "unix:/run/x.sock".parse::<ControlAddr>(),
            Ok(ControlAddr::Unix("/run/x.sock".into()))
        );
        assert_eq!(
            "tcp:127.0.0.1:7070".parse::<ControlAddr>(),
            Ok(ControlAddr::Tcp("127.0.0.1:7070".into()))
        );
        assert!("127.0.0.1:7070".parse::<ControlAddr>().is_err());
        assert!("tcp:7070".parse::<ControlAddr>().is_err());
    }

    /// The whole channel against an engine driven by a thread standing in for the datapath.
    #[test]
    fn token_is_required_and_requests_reach_the_engine() {
        use crate::engine::{Engine, Limits, PipeTable};
        let tmp = tempfile::Builder::new()
            .prefix("mimic-ctl-")
            .tempdir()
            .unwrap();
        let dir = tmp.path();
        let addr = ControlAddr::Unix(dir.join("c.sock"));
        let listener = Listener::bind(&addr).unwrap();
        let (jtx, jrx) = mpsc::channel::<Job>();
        let waker = Waker::new().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let srv = std::thread::spawn(move || serve(listener, "sesame".into(), jtx, waker, s2));
        let s3 = stop.clone();
        let dp = std::thread::spawn(move || {
            let mut engine: Engine<u32> =
                Engine::new(&PipeTable::default(), Limits::default(), 1).unwrap();
            let stats = DatapathStats::default();
            let mut halt = false;
            while !halt && !s3.load(Ordering::Relaxed) {
                if let Ok(job) = jrx.recv_timeout(Duration::from_millis(50)) {
                    job(&mut crate::datapath::Ctx {
                        engine: &mut engine,
                        stats: &stats,
                        now: 0,
                        stop: &mut halt,
                    });
                }
            }
            halt
        });
        assert!(
            matches!(Client::connect(&addr, "wrong"), Err(ControlError::Refused(e)) if e.contains("wrong token"))
        );
        let mut c = Client::connect(&addr, "sesame").unwrap();
        let rules: Vec<FlowRule> = (0..10_000u16)
            .map(|p| FlowRule {
                client: std::net::SocketAddr::new([198, 19, 0, 1].into(), 1024 + p),
                server: "198.18.0.1:80".parse().unwrap(),
                up: "delay=10ms".parse().unwrap(),
                down: "delay=10ms,rate=1mbit".parse().unwrap(),
            })
            .collect();
        let ids = c.add_flows(&rules).unwrap();
        assert_eq!(ids.len(), 10_000);
        assert!(
            matches!(c.add_flows(&rules[..1]), Err(ControlError::Refused(e)) if e.contains("already has rule"))
        );
        c.update_flow(ids[0], Some(&"delay=1ms".parse().unwrap()), None)
            .unwrap();
        let counters = c.counters().unwrap();
        assert_eq!(counters.len(), 20_000);
        assert_eq!(counters[0].config.delay, 1_000_000);
        let removed = c.remove_flows(&ids[..10]).unwrap();
        assert_eq!(removed.len(), 10);
        assert_eq!(c.stats().unwrap().engine.flow_rules, 9_990);
        c.shutdown().unwrap();
        assert!(dp.join().unwrap(), "shutdown reached the datapath");
        stop.store(true, Ordering::Relaxed);
        srv.join().unwrap();
    }
}
