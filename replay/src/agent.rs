//! A client agent (`mimic agent`): the client emulator on another host, driven over the
//! control channel (role `agent`, TLS 1.3 with mutual certificates, like `serve` and
//! `netemu`). The controller (`mimic replay --agents`) hands each agent its share of the
//! connections (each one's script: exchanges, sizes, think times, its source address and port,
//! its start offset), then one start instant on the wall clock; the agent runs them with the
//! same client engine as a local replay ([`crate::orchestrate`]'s client stage) and returns one
//! result per connection, with how late its SYN left.
//!
//! Ops, each answered `{"ok":true,"result":...}` or `{"ok":false,"error":...}`:
//! * `info` → [`AgentInfo`] (host, kernel, version, the source addresses it may use);
//! * `load {first, request_timing, conns}` → the number loaded so far (`first` drops an
//!   earlier load; a share is sent in batches to keep lines short);
//! * `start {t0_unix_ns}` → starts the loaded connections: connection *i* leaves at
//!   `t0 + offset_ns` (the agent turns the wall-clock instant into its own monotonic clock
//!   once, so only the hosts' clock offset at that moment matters: keep them synchronised);
//! * `status` → [`AgentStatus`]; `results` → [`AgentResults`] once finished;
//! * `abort` → the running connections are stopped; `shutdown` → the agent exits.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

pub use mimic_control::{ControlAddr, ControlError, ControllerTls, Listener, RoleTls};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::client::{Failure, Outcome, Planned};
use crate::orchestrate::Progress;
use crate::workload::{ConnSpec, RequestTiming};

/// The agent's role name: its certificate is `agent.crt` / `agent.key`.
pub const ROLE: &str = "agent";

/// How far from the agent's clock a start instant may be before it is refused (the hosts'
/// clocks are not synchronised, or the controller took too long).
const MAX_START_SKEW: Duration = Duration::from_secs(300);

/// One connection of an agent's share.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct AgentConn {
    /// Its index in the whole replay.
    pub index: usize,
    pub spec: ConnSpec,
    pub local: SocketAddrV4,
    pub server: SocketAddr,
    /// When its SYN leaves, relative to the start instant (ns; negative: before it).
    pub offset_ns: i64,
    /// Given up (a timeout) this long after its start.
    pub limit_ms: u64,
}

/// What an agent says about itself.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct AgentInfo {
    pub hostname: String,
    pub kernel: String,
    pub version: String,
    /// The source addresses its connections may use (`--client-addr`).
    pub client_addrs: Vec<Ipv4Addr>,
}

/// Where an agent is.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct AgentStatus {
    /// `idle`, `loaded`, `running`, `finished` or `failed`.
    pub phase: String,
    pub loaded: u64,
    pub done: u64,
    pub failed: u64,
    pub in_flight: u64,
    pub max_in_flight: u64,
    pub error: Option<String>,
}

/// One connection's result, as an agent returns it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct AgentOutcome {
    pub index: usize,
    pub local: SocketAddrV4,
    /// None: replayed without error.
    pub failure: Option<Failure>,
    pub start_lateness_ns: u64,
    pub exchanges_done: usize,
    pub response_time_ns: Option<u64>,
}

impl From<&Outcome> for AgentOutcome {
    fn from(o: &Outcome) -> Self {
        AgentOutcome {
            index: o.index,
            local: o.local,
            failure: o.result.clone().err(),
            start_lateness_ns: o.start_lateness.as_nanos() as u64,
            exchanges_done: o.exchanges_done,
            response_time_ns: o.response_time.map(|d| d.as_nanos() as u64),
        }
    }
}

impl From<AgentOutcome> for Outcome {
    fn from(o: AgentOutcome) -> Self {
        Outcome {
            index: o.index,
            local: o.local,
            result: o.failure.map_or(Ok(()), Err),
            start_lateness: Duration::from_nanos(o.start_lateness_ns),
            exchanges_done: o.exchanges_done,
            response_time: o.response_time_ns.map(Duration::from_nanos),
        }
    }
}

/// What a finished run returns.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AgentResults {
    pub outcomes: Vec<AgentOutcome>,
    /// Whether the agent's timer thread ran real-time (None: it never started).
    pub timer_realtime: Option<bool>,
    /// How far the start instant was from the agent's clock when `start` arrived (ns;
    /// positive: in the future, as it should be).
    pub start_lead_ns: i64,
}

#[derive(Serialize, Deserialize, Debug)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Request {
    Info,
    Load {
        first: bool,
        request_timing: RequestTiming,
        conns: Vec<AgentConn>,
    },
    Start {
        t0_unix_ns: i64,
    },
    Status,
    Results,
    Abort,
    Shutdown,
}

enum Phase {
    Idle,
    Loaded,
    Running,
    Finished(Result<Vec<Outcome>, String>),
}

struct State {
    conns: Vec<AgentConn>,
    request_timing: RequestTiming,
    phase: Phase,
    progress: Arc<Progress>,
    abort: Arc<AtomicBool>,
    start_lead_ns: i64,
}

/// The agent: its addresses, what it was loaded with, and its run.
pub struct Agent {
    info: AgentInfo,
    /// `info.client_addrs`, for checking a share's addresses.
    own: std::collections::HashSet<Ipv4Addr>,
    timer_cpus: Option<Vec<usize>>,
    state: Arc<Mutex<State>>,
    /// Set by `shutdown`.
    exit: Arc<AtomicBool>,
}

fn unix_ns(t: SystemTime) -> i64 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i64,
        Err(e) => -(e.duration().as_nanos() as i64),
    }
}

/// Checks that every source address an agent was given is an address of this host (assigned,
/// or inside a local route such as `ip route add local 198.19.32.0/19 dev lo`): the kernel
/// refuses to bind any other, so a connection from one would fail only when the replay opens it.
pub fn check_local(addrs: &[Ipv4Addr]) -> Result<(), String> {
    let mut foreign = Vec::new();
    let mut count = 0usize;
    for &a in addrs {
        match std::net::UdpSocket::bind(SocketAddrV4::new(a, 0)) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) => {
                count += 1;
                if foreign.len() < 3 {
                    foreign.push(a.to_string());
                }
            }
            Err(e) => return Err(format!("--client-addr {a}: binding it: {e}")),
        }
    }
    if count == 0 {
        return Ok(());
    }
    let more = if count > foreign.len() {
        format!(" and {} more", count - foreign.len())
    } else {
        String::new()
    };
    Err(format!(
        "--client-addr: {}{more} {} not an address of this host (assign it, e.g. `ip addr add {}/32 dev lo`, or route its prefix here with `ip route add local PREFIX dev lo`, and route replies to it back through the network emulator)",
        foreign.join(", "),
        if count == 1 { "is" } else { "are" },
        foreign[0]
    ))
}

/// Now on the wall clock, in ns since the Unix epoch (what `start` takes).
pub fn now_unix_ns() -> i64 {
    unix_ns(SystemTime::now())
}

fn shifted(t: Instant, ns: i64) -> Instant {
    if ns >= 0 {
        t + Duration::from_nanos(ns as u64)
    } else {
        t.checked_sub(Duration::from_nanos(ns.unsigned_abs()))
            .unwrap_or(t)
    }
}

impl Agent {
    /// An agent that may use `client_addrs` as source addresses; `exit` is set when the
    /// controller asks it to shut down.
    pub fn new(
        client_addrs: Vec<Ipv4Addr>,
        timer_cpus: Option<Vec<usize>>,
        exit: Arc<AtomicBool>,
    ) -> Agent {
        let host = crate::control::HostInfo::local(None);
        Agent {
            own: client_addrs.iter().copied().collect(),
            info: AgentInfo {
                hostname: host.hostname,
                kernel: host.kernel,
                version: env!("CARGO_PKG_VERSION").to_string(),
                client_addrs,
            },
            timer_cpus,
            state: Arc::new(Mutex::new(State {
                conns: Vec::new(),
                request_timing: RequestTiming::default(),
                phase: Phase::Idle,
                progress: Arc::default(),
                abort: Arc::default(),
                start_lead_ns: 0,
            })),
            exit,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs one request (the control channel's handler).
    pub fn handle(&self, v: Value) -> Result<Value, String> {
        match serde_json::from_value::<Request>(v).map_err(|e| format!("bad request: {e}"))? {
            Request::Info => Ok(json!(self.info)),
            Request::Load {
                first,
                request_timing,
                conns,
            } => {
                let mut st = self.lock();
                if matches!(st.phase, Phase::Running) {
                    return Err("a replay is running (abort it first)".into());
                }
                for c in &conns {
                    if !self.own.contains(c.local.ip()) {
                        return Err(format!(
                            "connection {}: source address {} is not one of this agent's (--client-addr)",
                            c.index,
                            c.local.ip()
                        ));
                    }
                }
                if first || !matches!(st.phase, Phase::Loaded) {
                    st.conns.clear();
                }
                st.conns.extend(conns);
                st.request_timing = request_timing;
                st.phase = Phase::Loaded;
                Ok(json!(st.conns.len()))
            }
            Request::Start { t0_unix_ns } => self.start(t0_unix_ns),
            Request::Status => Ok(json!(self.status())),
            Request::Results => {
                let st = self.lock();
                match &st.phase {
                    Phase::Finished(Ok(o)) => Ok(json!(AgentResults {
                        outcomes: o.iter().map(AgentOutcome::from).collect(),
                        timer_realtime: crate::hrtimer::HrTimer::realtime(),
                        start_lead_ns: st.start_lead_ns,
                    })),
                    Phase::Finished(Err(e)) => Err(format!("the replay failed: {e}")),
                    _ => Err("no finished replay (see status)".into()),
                }
            }
            Request::Abort => {
                self.lock().abort.store(true, Ordering::Relaxed);
                Ok(Value::Null)
            }
            Request::Shutdown => {
                self.lock().abort.store(true, Ordering::Relaxed);
                self.exit.store(true, Ordering::Relaxed);
                Ok(Value::Null)
            }
        }
    }

    fn status(&self) -> AgentStatus {
        let st = self.lock();
        let c = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let (phase, error) = match &st.phase {
            Phase::Idle => ("idle", None),
            Phase::Loaded => ("loaded", None),
            Phase::Running => ("running", None),
            Phase::Finished(Ok(_)) => ("finished", None),
            Phase::Finished(Err(e)) => ("failed", Some(e.clone())),
        };
        AgentStatus {
            phase: phase.into(),
            loaded: st.conns.len() as u64,
            done: c(&st.progress.done),
            failed: c(&st.progress.failed),
            in_flight: c(&st.progress.in_flight),
            max_in_flight: c(&st.progress.max_in_flight),
            error,
        }
    }

    /// Plans the loaded connections on this host's monotonic clock and runs them on a
    /// thread of their own.
    fn start(&self, t0_unix_ns: i64) -> Result<Value, String> {
        let mut st = self.lock();
        if !matches!(st.phase, Phase::Loaded) {
            return Err("nothing loaded to start".into());
        }
        // the wall-clock instant on this host's monotonic clock, read once
        let (now_i, now_ns) = (Instant::now(), now_unix_ns());
        let lead = t0_unix_ns.saturating_sub(now_ns);
        if lead.unsigned_abs() > MAX_START_SKEW.as_nanos() as u64 {
            return Err(format!(
                "the start instant is {:.1} s from this host's clock (more than {} s): are the controller's and the agents' clocks synchronised (NTP, PTP)?",
                lead as f64 / 1e9,
                MAX_START_SKEW.as_secs()
            ));
        }
        let t0 = shifted(now_i, lead);
        let plans: Vec<Planned> = st
            .conns
            .iter()
            .map(|c| Planned {
                index: c.index,
                spec: Arc::new(c.spec.clone()),
                local: c.local,
                server: c.server,
                start: shifted(t0, c.offset_ns),
                limit: Duration::from_millis(c.limit_ms),
                request_timing: st.request_timing,
            })
            .collect();
        let progress = Arc::new(Progress::default());
        let abort = Arc::new(AtomicBool::new(false));
        st.progress = progress.clone();
        st.abort = abort.clone();
        st.start_lead_ns = lead;
        st.phase = Phase::Running;
        let (state, cpus) = (self.state.clone(), self.timer_cpus.clone());
        std::thread::Builder::new()
            .name("mimic-agent-run".into())
            .spawn(move || {
                let r = crate::orchestrate::run_clients(plans, None, cpus, None, &progress, &abort)
                    .map_err(|e| e.to_string());
                let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
                st.phase = Phase::Finished(r);
            })
            .map_err(|e| format!("starting the replay thread: {e}"))?;
        Ok(json!({"start_lead_ns": lead}))
    }

    /// Serves the control channel on a thread of its own until `stop` is set.
    pub fn spawn(
        self,
        listener: Listener,
        tls: RoleTls,
        stop: Arc<AtomicBool>,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        let agent = Arc::new(self);
        let handler: mimic_control::Handler = Arc::new(move |v| agent.handle(v));
        mimic_control::Server::new(listener, tls, handler, stop).spawn()
    }
}

/// How long the controller waits for an agent's answer to any call unless told otherwise
/// (`mimic replay --agent-timeout`). An agent answers every call from memory (`status`, polled
/// every 200 ms, `abort`, `start`) or after a little work on what it was sent (`load` in
/// batches of [`LOAD_BATCH`] connections, a few milliseconds); one that takes this long is busy
/// beyond use or hung, and the call fails rather than hold the replay.
pub const DEFAULT_LIMIT: Duration = Duration::from_secs(30);

/// Connections per `load` call.
pub const LOAD_BATCH: usize = 1000;

/// A blocking client of a running agent (the controller's side).
pub struct AgentClient {
    c: mimic_control::Client,
    limit: Duration,
}

impl AgentClient {
    /// Connects to the agent at `addr` and authenticates both sides; its calls wait
    /// [`DEFAULT_LIMIT`] for an answer.
    pub fn connect(addr: &ControlAddr, tls: &ControllerTls) -> Result<AgentClient, ControlError> {
        mimic_control::Client::connect(addr, tls, ROLE).map(|c| AgentClient {
            c,
            limit: DEFAULT_LIMIT,
        })
    }

    /// How long every later call waits for the agent's answer (`results` waits a little more
    /// for each connection it returns).
    pub fn set_limit(&mut self, limit: Duration) {
        self.limit = limit;
    }

    pub fn addr(&self) -> &str {
        self.c.addr()
    }

    fn call<T: serde::de::DeserializeOwned>(&mut self, r: &Request) -> Result<T, ControlError> {
        self.call_within(r, self.limit)
    }

    fn call_within<T: serde::de::DeserializeOwned>(
        &mut self,
        r: &Request,
        limit: Duration,
    ) -> Result<T, ControlError> {
        serde_json::from_value(self.c.call_within(r, limit)?)
            .map_err(|e| ControlError::Protocol(e.to_string()))
    }

    pub fn info(&mut self) -> Result<AgentInfo, ControlError> {
        self.call(&Request::Info)
    }

    /// Loads a share in batches of [`LOAD_BATCH`]; returns how many the agent holds.
    pub fn load(
        &mut self,
        conns: &[AgentConn],
        request_timing: RequestTiming,
    ) -> Result<u64, ControlError> {
        let mut n = 0;
        for (i, batch) in conns.chunks(LOAD_BATCH).enumerate() {
            n = self.call(&Request::Load {
                first: i == 0,
                request_timing,
                conns: batch.to_vec(),
            })?;
        }
        if conns.is_empty() {
            n = self.call(&Request::Load {
                first: true,
                request_timing,
                conns: Vec::new(),
            })?;
        }
        Ok(n)
    }

    pub fn start(&mut self, t0_unix_ns: i64) -> Result<(), ControlError> {
        self.c
            .call_within(&Request::Start { t0_unix_ns }, self.limit)
            .map(|_| ())
    }

    /// Where its replay stands, answered from memory.
    pub fn status(&mut self) -> Result<AgentStatus, ControlError> {
        self.call(&Request::Status)
    }

    /// The outcomes of a finished replay of `connections`: the limit, plus a second per 1,000
    /// connections for an answer that grows with the share.
    pub fn results(&mut self, connections: usize) -> Result<AgentResults, ControlError> {
        let limit = self.limit + Duration::from_millis(connections as u64);
        self.call_within(&Request::Results, limit)
    }

    pub fn abort(&mut self) -> Result<(), ControlError> {
        self.c.call_within(&Request::Abort, self.limit).map(|_| ())
    }

    pub fn shutdown(&mut self) -> Result<(), ControlError> {
        self.c
            .call_within(&Request::Shutdown, self.limit)
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preamble::Preamble;
    use crate::workload::{Close, ExchangeSpec};
    use std::io::{Read, Write};

    /// A temporary directory with a fresh PKI in its `pki` folder.
    fn temp_pki() -> (tempfile::TempDir, std::path::PathBuf) {
        let tmp = tempfile::Builder::new()
            .prefix("mimic-agent-")
            .tempdir()
            .unwrap();
        let pki = tmp.path().join("pki");
        mimic_control::pki::init(&pki, &Default::default()).unwrap();
        (tmp, pki)
    }

    /// A controller drives an agent over the real control channel: the agent refuses a
    /// connection whose source address is not its own, runs what it was loaded with against
    /// a small server on loopback at the instant it was given, and returns one result per
    /// connection with its lateness; a controller from another PKI is refused.
    #[test]
    fn an_agent_runs_its_share_at_the_start_instant_and_reports_each_connection() {
        let (tmp, pki) = temp_pki();
        // a server answering each request's preamble with the bytes it asks for, then FIN
        let srv = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let server = srv.local_addr().unwrap();
        std::thread::spawn(move || {
            for s in srv.incoming() {
                let Ok(mut s) = s else { continue };
                std::thread::spawn(move || {
                    let mut b = [0u8; crate::preamble::LEN];
                    if s.read_exact(&mut b).is_ok() {
                        if let Ok(p) = Preamble::decode(&b) {
                            let _ = s.write_all(&vec![0u8; p.resp_bytes as usize]);
                        }
                    }
                });
            }
        });
        let addr = ControlAddr::Unix(tmp.path().join("agent.sock"));
        let stop = Arc::new(AtomicBool::new(false));
        let exit = Arc::new(AtomicBool::new(false));
        let me: Ipv4Addr = "127.0.0.1".parse().unwrap();
        let t = Agent::new(vec![me], None, exit.clone())
            .spawn(
                Listener::bind(&addr).unwrap(),
                RoleTls::load(&pki, ROLE).unwrap(),
                stop.clone(),
            )
            .unwrap();

        let conn = |index: usize, ip: Ipv4Addr, offset_ms: i64| AgentConn {
            index,
            spec: ConnSpec {
                server_port: server.port(),
                close: Close::ServerFin,
                exchanges: vec![ExchangeSpec {
                    header_bytes: 3000,
                    ..ExchangeSpec::bare(3000)
                }],
                ..ConnSpec::bare(index as i64)
            },
            local: SocketAddrV4::new(ip, 0),
            server,
            offset_ns: offset_ms * 1_000_000,
            limit_ms: 10_000,
        };

        let other = tmp.path().join("other");
        mimic_control::pki::init(&other, &Default::default()).unwrap();
        std::fs::copy(pki.join("ca.crt"), other.join("ca.crt")).unwrap();
        let e = AgentClient::connect(
            &addr,
            &ControllerTls::load_identity(&other, "controller").unwrap(),
        )
        .err()
        .expect("a controller from another PKI is refused");
        assert!(matches!(e, ControlError::Auth { .. }), "{e}");

        let mut c = AgentClient::connect(&addr, &ControllerTls::load(&pki).unwrap()).unwrap();
        let info = c.info().unwrap();
        assert_eq!(info.client_addrs, vec![me]);
        let e = c
            .load(
                &[conn(0, "127.0.0.9".parse().unwrap(), 0)],
                RequestTiming::Recorded,
            )
            .unwrap_err();
        assert!(e.to_string().contains("not one of this agent's"), "{e}");
        assert!(c.start(now_unix_ns()).is_err(), "nothing loaded");
        let share: Vec<AgentConn> = (0..5).map(|i| conn(10 + i, me, 20 * i as i64)).collect();
        assert_eq!(c.load(&share, RequestTiming::Recorded).unwrap(), 5);
        let e = c.start(now_unix_ns() - 3_600_000_000_000).unwrap_err();
        assert!(e.to_string().contains("synchronised"), "{e}");
        // 2 s ahead: the start request reaches the agent well before, even on a loaded host
        let t0 = now_unix_ns() + 2_000_000_000;
        c.start(t0).unwrap();
        assert!(c.results(5).is_err(), "results before the end");
        let until = Instant::now() + Duration::from_secs(20);
        let st = loop {
            let st = c.status().unwrap();
            if st.phase != "running" || Instant::now() > until {
                break st;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_eq!(st.phase, "finished", "{st:?}");
        assert_eq!((st.done, st.failed), (5, 0), "{st:?}");
        // the last SYN was planned 2 s + 80 ms after start was sent
        assert!(now_unix_ns() >= t0 + 80_000_000);
        let r = c.results(5).unwrap();
        assert!(r.start_lead_ns > 1_000_000_000, "{}", r.start_lead_ns);
        let idx: Vec<usize> = r.outcomes.iter().map(|o| o.index).collect();
        assert_eq!(idx, [10, 11, 12, 13, 14]);
        for o in &r.outcomes {
            assert_eq!(o.failure, None, "{o:?}");
            assert_eq!(o.exchanges_done, 1);
            assert!(o.start_lateness_ns < 200_000_000, "{o:?}");
            let back: Outcome = o.clone().into();
            assert!(back.result.is_ok());
        }
        c.shutdown().unwrap();
        assert!(exit.load(Ordering::Relaxed));
        stop.store(true, Ordering::Relaxed);
        t.join().unwrap();
    }

    /// An agent that does not answer `load` (hung, or stopped with SIGSTOP while its host
    /// still acknowledges) fails the call after the client's limit, naming the call, instead
    /// of holding the controller for the control channel's ten minutes; the connection is
    /// closed, so a late answer is never taken for the next call's.
    #[test]
    fn a_load_the_agent_does_not_answer_fails_after_the_limit_naming_it() {
        let (tmp, pki) = temp_pki();
        let addr = ControlAddr::Unix(tmp.path().join("agent.sock"));
        let stop = Arc::new(AtomicBool::new(false));
        let release = Arc::new(AtomicBool::new(false));
        let r2 = release.clone();
        let handler: mimic_control::Handler = Arc::new(move |v: Value| {
            if v["op"] == "load" {
                while !r2.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            Ok(json!(1))
        });
        let t = mimic_control::Server::new(
            Listener::bind(&addr).unwrap(),
            RoleTls::load(&pki, ROLE).unwrap(),
            handler,
            stop.clone(),
        )
        .spawn()
        .unwrap();
        let mut c = AgentClient::connect(&addr, &ControllerTls::load(&pki).unwrap()).unwrap();
        c.set_limit(Duration::from_secs(1));
        let share = vec![AgentConn {
            index: 0,
            spec: ConnSpec::bare(0),
            local: SocketAddrV4::new(Ipv4Addr::LOCALHOST, 20000),
            server: SocketAddr::from((Ipv4Addr::LOCALHOST, 80)),
            offset_ns: 0,
            limit_ms: 1000,
        }];
        let t0 = Instant::now();
        let e = c.load(&share, RequestTiming::Recorded).unwrap_err();
        let waited = t0.elapsed();
        release.store(true, Ordering::Relaxed);
        match &e {
            ControlError::Timeout { op, secs, .. } => assert_eq!((op.as_str(), *secs), ("load", 1)),
            other => panic!("expected a timeout, got {other}"),
        }
        assert!(
            e.to_string().contains("did not answer `load` within 1 s"),
            "{e}"
        );
        // not the channel's ten-minute default (a guard against a hang, not a timing figure)
        assert!(waited < Duration::from_secs(120), "{waited:?}");
        let again = c.status().unwrap_err().to_string();
        assert!(again.contains("connection is closed"), "{again}");
        stop.store(true, Ordering::Relaxed);
        t.join().unwrap();
    }

    #[test]
    fn source_addresses_must_be_local() {
        check_local(&["127.0.0.1".parse().unwrap(), "127.3.2.1".parse().unwrap()]).unwrap();
        // TEST-NET-2 and -3 (this machine's own network is in TEST-NET-1)
        let e = check_local(&[
            "127.0.0.1".parse().unwrap(),
            "198.51.100.77".parse().unwrap(),
            "203.0.113.9".parse().unwrap(),
        ])
        .unwrap_err();
        assert!(
            e.contains("198.51.100.77, 203.0.113.9 are not an address of this host")
                && e.contains("ip addr add 198.51.100.77/32 dev lo"),
            "{e} (net.ipv4.ip_nonlocal_bind must be 0 here)"
        );
    }
}
