//! A whole replay (`mimic replay`): the server emulator, the network emulator and a capture of
//! the server side run as separate processes (in the lab's namespaces, or on remote hosts
//! reached over their authenticated control channels); every replayed connection gets its own
//! pair of pipes, registered before its SYN; the client emulator runs here; at the end the
//! capture is analyzed into the replay database, with `replay_map` pairing each replayed
//! connection with the original.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mimic_analyze::driver::{self as analysis, RunOptions, Summary as AnalysisSummary};
use mimic_core::cpu;
use mimic_core::db::{set_meta, DbError};
use mimic_core::schema::{ReplayMapRow, ReplayPipeRow, TableRow, Text};
use mimic_netemu::config::{AckPolicy, LossModel, PipeConfig, QueueLimit};
use mimic_netemu::control::{
    Client as NetemuClient, ControlAddr, ControlError as NetemuError, RunStats,
};
use mimic_netemu::engine::{FlowRule, RuleId};
use mimic_netemu::lab::{self, LabError, LabInfo, LabOptions};
use mimic_netemu::netns;
use mimic_netemu::stack::{self, StackProfile};
use serde::Serialize;

use crate::client::{self, Outcome, Planned};
use crate::control::{ControlError as ServeError, ServeClient};
use crate::hrtimer::HrTimer;
use crate::server::ServerStats;
use crate::workload::{
    self, ConnSpec, RequestTiming, Select, Workload, WorkloadError, DEFAULT_DELACK_TIMEOUT_US,
};

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    #[error(transparent)]
    Lab(#[from] LabError),
    #[error(transparent)]
    Netemu(#[from] NetemuError),
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("analysis of the replay capture: {0}")]
    Analysis(String),
    #[error("{role} did not start: {why}")]
    Role { role: &'static str, why: String },
    #[error("{0}")]
    Io(String),
    #[error("{0}")]
    Invalid(String),
    #[error("interrupted")]
    Interrupted,
}

/// Where the roles run.
#[derive(Clone, Debug)]
pub enum Target {
    /// In the lab `name` (built for the replay and torn down after if it did not exist).
    Lab { name: String, keep: bool },
    /// Roles already running elsewhere; the client runs here and the capture is taken on a
    /// local interface on the path to the server.
    Remote {
        server: SocketAddr,
        server_control: ControlAddr,
        netemu: ControlAddr,
        token_file: PathBuf,
        capture_iface: String,
        client_addrs: Vec<Ipv4Addr>,
    },
}

#[derive(Clone, Debug)]
pub struct ReplayOptions {
    pub input: PathBuf,
    pub output: PathBuf,
    pub target: Target,
    pub stack: Option<StackProfile>,
    /// Queue lengths that replace Monkey's rate classes (either direction or both).
    pub queue: QueueOverride,
    pub request_timing: RequestTiming,
    pub select: Select,
    pub limit: Option<usize>,
    /// Multiplies the gaps between connection starts (2 = half the arrival rate).
    pub time_scale: f64,
    pub seed: u64,
    /// The server emulator's port.
    pub server_port: u16,
    /// Keep the capture files in this directory.
    pub keep_capture: Option<PathBuf>,
    /// In the lab: the datapath on a CPU of its own, the timer threads on the others.
    pub cpu_split: bool,
    /// The mimic executable that runs the roles.
    pub exe: PathBuf,
}

/// Live counters for a progress display.
#[derive(Debug, Default)]
pub struct Progress {
    pub total: AtomicU64,
    pub done: AtomicU64,
    pub failed: AtomicU64,
    pub in_flight: AtomicU64,
    /// Most connections open at once.
    pub max_in_flight: AtomicU64,
    pub stage: Mutex<String>,
}

impl Progress {
    fn stage(&self, s: &str) {
        *self.stage.lock().unwrap_or_else(|p| p.into_inner()) = s.to_string();
    }
}

#[derive(Debug, Serialize)]
pub struct ReplaySummary {
    pub input: String,
    pub output: String,
    pub lab: Option<String>,
    pub connections: u64,
    pub ok: u64,
    pub failed: u64,
    pub failures: BTreeMap<String, u64>,
    /// Replayed without error but not found in the capture.
    pub missing: u64,
    pub skipped_by_select: u64,
    /// How late connections started compared with the plan (p50, p99, max; µs).
    pub start_lateness_us: [u64; 3],
    /// The 99.9th percentile of that lateness (µs), and the connections that started more
    /// than 1 ms late.
    pub start_lateness_p999_us: u64,
    pub starts_over_1ms: u64,
    /// Whether the client emulator's timer thread ran real-time within its budget (None: it
    /// never started).
    pub client_timer_realtime: Option<bool>,
    /// Most replayed connections open at once.
    pub max_concurrent: u64,
    pub server: ServerStats,
    pub netemu: Option<RunStats>,
    pub capture: serde_json::Value,
    pub stack: Option<StackProfile>,
    /// In the lab: the CPU the network emulator's datapath had to itself, and the CPUs the
    /// client and server emulators' timer threads were kept on (None: `--no-cpu-split`, a
    /// remote replay, or a single CPU).
    pub cpu_split: Option<CpuSplit>,
    pub analysis: AnalysisSummary,
    pub duration_s: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct CpuSplit {
    pub datapath: usize,
    /// Written as a CPU list (`0,2-3`), the form `mimic serve --timer-cpus` takes.
    #[serde(serialize_with = "cpu_list")]
    pub timers: Vec<usize>,
}

fn cpu_list<S: serde::Serializer>(cpus: &[usize], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&cpu::format_list(cpus))
}

/// Child processes that are stopped (TERM, then KILL) when dropped.
struct Roles {
    children: Vec<(&'static str, Child)>,
}

impl Roles {
    fn spawn(
        &mut self,
        role: &'static str,
        mut cmd: Command,
        log: &Path,
    ) -> Result<(), ReplayError> {
        let f = std::fs::File::create(log)
            .map_err(|e| ReplayError::Io(format!("{}: {e}", log.display())))?;
        let f2 = f.try_clone().map_err(|e| ReplayError::Io(e.to_string()))?;
        cmd.stdin(Stdio::null()).stdout(f).stderr(f2);
        let child = cmd.spawn().map_err(|e| ReplayError::Role {
            role,
            why: e.to_string(),
        })?;
        self.children.push((role, child));
        Ok(())
    }

    fn alive(&mut self, role: &str) -> bool {
        self.children
            .iter_mut()
            .find(|(r, _)| *r == role)
            .is_some_and(|(_, c)| matches!(c.try_wait(), Ok(None)))
    }

    /// Sends SIGTERM to `role` and waits for it (KILL after `grace`).
    fn stop(&mut self, role: &str, grace: Duration) {
        if let Some(i) = self.children.iter().position(|(r, _)| *r == role) {
            let (_, mut c) = self.children.remove(i);
            terminate(&mut c, grace);
        }
    }
}

fn terminate(c: &mut Child, grace: Duration) {
    // SAFETY: sending SIGTERM to a child we spawned and have not reaped.
    unsafe {
        libc::kill(c.id() as i32, libc::SIGTERM);
    }
    let until = Instant::now() + grace;
    while Instant::now() < until {
        if let Ok(Some(_)) = c.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = c.kill();
    let _ = c.wait();
}

impl Drop for Roles {
    fn drop(&mut self) {
        for (_, c) in self.children.iter_mut() {
            terminate(c, Duration::from_secs(2));
        }
    }
}

/// Tears the lab down when a replay that built it ends (however it ends).
struct LabGuard(Option<String>);

impl Drop for LabGuard {
    fn drop(&mut self) {
        if let Some(n) = self.0.take() {
            if let Err(e) = lab::down(&n) {
                tracing::warn!("tearing down lab {n}: {e}");
            }
        }
    }
}

/// Removes the working directory when dropped.
struct WorkDir(PathBuf);

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `Err(Interrupted)` once Ctrl-C (or SIGTERM) has set `stop`.
fn interrupted(stop: &AtomicBool) -> Result<(), ReplayError> {
    if stop.load(Ordering::Relaxed) {
        return Err(ReplayError::Interrupted);
    }
    Ok(())
}

/// Polls `f` until it yields a value: `Ok(None)` means not yet, an error ends the wait (and so
/// does Ctrl-C).
fn wait_for<T>(
    what: &'static str,
    limit: Duration,
    stop: &AtomicBool,
    mut alive: impl FnMut() -> bool,
    mut f: impl FnMut() -> Result<Option<T>, ReplayError>,
) -> Result<T, ReplayError> {
    let until = Instant::now() + limit;
    loop {
        interrupted(stop)?;
        if let Some(v) = f()? {
            return Ok(v);
        }
        if !alive() {
            return Err(ReplayError::Role {
                role: what,
                why: "it exited (see its log)".into(),
            });
        }
        if Instant::now() > until {
            return Err(ReplayError::Role {
                role: what,
                why: format!("not ready within {limit:?}"),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn log_tail(p: &Path) -> String {
    let s = std::fs::read_to_string(p).unwrap_or_default();
    let lines: Vec<&str> = s.lines().rev().take(5).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

/// Queue lengths (packets) given on the command line instead of Monkey's rate classes
/// (`mimic_core::model::queue_packets`); a direction left `None` keeps its class's length.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct QueueOverride {
    pub up: Option<u32>,
    pub down: Option<u32>,
}

impl std::str::FromStr for QueueOverride {
    type Err = String;

    /// `N` (both directions) or `up=N`, `down=N`, `up=N,down=M`.
    fn from_str(s: &str) -> Result<Self, String> {
        let packets = |v: &str| -> Result<u32, String> {
            match v.parse::<u32>() {
                Ok(n) if n >= 1 => Ok(n),
                _ => Err(format!(
                    "queue length `{v}` is not a whole number of packets >= 1"
                )),
            }
        };
        let s = s.trim();
        if !s.contains('=') {
            let n = packets(s)?;
            return Ok(QueueOverride {
                up: Some(n),
                down: Some(n),
            });
        }
        let mut q = QueueOverride::default();
        for (k, v) in mimic_netemu::units::key_values(s)? {
            match k {
                "up" => q.up = Some(packets(v)?),
                "down" => q.down = Some(packets(v)?),
                _ => return Err(format!("unknown queue direction `{k}` (up, down)")),
            }
        }
        Ok(q)
    }
}

impl std::fmt::Display for QueueOverride {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let side = |n: Option<u32>| n.map_or("by rate class".to_string(), |n| n.to_string());
        write!(f, "up={},down={}", side(self.up), side(self.down))
    }
}

/// The two pipes of one replayed connection.
pub fn pipes_for(c: &ConnSpec, seed: u64, queue: QueueOverride) -> (PipeConfig, PipeConfig) {
    let owd_ns = c.one_way_us() as u64 * 1000;
    let (class_up, class_down) = mimic_core::model::queue_packets(c.bw_bps);
    let (q_up, q_down) = (
        queue.up.unwrap_or(class_up),
        queue.down.unwrap_or(class_down),
    );
    let up = PipeConfig {
        delay: owd_ns,
        queue: QueueLimit::Packets(q_up),
        ack: c.delack_every.map(|every| AckPolicy {
            every,
            timeout: c
                .delack_timeout_us
                .filter(|t| *t > 0)
                .unwrap_or(DEFAULT_DELACK_TIMEOUT_US) as u64
                * 1000,
        }),
        seed: Some(seed),
        ..PipeConfig::default()
    };
    let down = PipeConfig {
        delay: owd_ns,
        rate_bps: c.bw_bps.map_or(0, |b| b.round().max(1.0) as u64),
        queue: QueueLimit::Packets(q_down),
        loss: if c.loss_rate_down > 0.0 {
            LossModel::Iid(c.loss_rate_down)
        } else {
            LossModel::None
        },
        seed: Some(seed ^ 0x5bd1_e995),
        ..PipeConfig::default()
    };
    (up, down)
}

/// The flow rules of a replay of `wl`: connection `i` (in the workload's order) from
/// [`local_addr`]`(client_addrs, i)` to `server` with its two pipes ([`pipes_for`], seeded from
/// `seed` and the original connection id). This is what [`run`] registers with the emulator
/// before each SYN, and what `mimic netemu render --from` renders for tc or ipfw.
pub fn flow_rules(
    wl: &Workload,
    client_addrs: &[Ipv4Addr],
    server: SocketAddr,
    seed: u64,
    queue: QueueOverride,
) -> Result<Vec<FlowRule>, ReplayError> {
    if client_addrs.is_empty() {
        return Err(ReplayError::Invalid(
            "a replay needs at least one client address".into(),
        ));
    }
    wl.conns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let local = local_addr(client_addrs, i)?;
            let (up, down) = pipes_for(
                c,
                seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ c.orig_id as u64,
                queue,
            );
            Ok(FlowRule {
                client: SocketAddr::V4(local),
                server,
                up,
                down,
            })
        })
        .collect()
}

/// How long a connection may take before it is recorded as timed out.
fn time_limit(c: &ConnSpec) -> Duration {
    let rtt = c.min_rtt_us.unwrap_or(0).max(0) as f64 / 1e6;
    let mut est = 4.0 * rtt;
    for e in &c.exchanges {
        est += (e.think_time_us + e.response_delay_us + e.query_delay_us) as f64 / 1e6 + 4.0 * rtt;
        if let Some(bw) = c.bw_bps {
            est += (e.resp_bytes + e.req_bytes) as f64 * 8.0 * 1.1 / bw;
        }
    }
    // retransmission timeouts back off: allow more time on lossy paths
    Duration::from_secs_f64(3.0 * est * (1.0 + 20.0 * c.loss_rate_down) + 30.0)
}

/// Source addresses and ports: connection `i` gets address `i mod n`, port 20000 + `i div n`,
/// so every replayed 4-tuple is distinct and known before its SYN.
fn local_addr(addrs: &[Ipv4Addr], i: usize) -> Result<SocketAddrV4, ReplayError> {
    let port = 20_000 + i / addrs.len();
    if port > 65_000 {
        return Err(ReplayError::Invalid(format!(
            "{i} connections do not fit the {} client addresses (20000-65000 ports each)",
            addrs.len()
        )));
    }
    Ok(SocketAddrV4::new(addrs[i % addrs.len()], port as u16))
}

pub fn run(
    opts: &ReplayOptions,
    progress: &Progress,
    stop: &AtomicBool,
) -> Result<ReplaySummary, ReplayError> {
    let started = Instant::now();
    if !opts.time_scale.is_finite() || opts.time_scale <= 0.0 {
        return Err(ReplayError::Invalid(
            "--time-scale must be a positive number".into(),
        ));
    }
    progress.stage("load");
    let wl = workload::load(&opts.input, opts.select, opts.limit)?;
    progress
        .total
        .store(wl.conns.len() as u64, Ordering::Relaxed);

    let out_dir = opts
        .output
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_path_buf();
    let work = WorkDir(out_dir.join(format!(".mimic-replay-{}", std::process::id())));
    let capdir = work.0.join("capture");
    std::fs::create_dir_all(&capdir)
        .map_err(|e| ReplayError::Io(format!("{}: {e}", capdir.display())))?;

    let mut roles = Roles {
        children: Vec::new(),
    };
    let mut lab_guard = LabGuard(None);
    let exe = opts.exe.as_os_str();

    // ---- roles ----
    progress.stage("lab");
    let mut cpu_split: Option<CpuSplit> = None;
    let (server, netemu_addr, serve_addr, token, client_addrs, client_ns, lab_name, stack_in_force) =
        match &opts.target {
            Target::Lab { name, keep } => {
                let info = LabInfo::for_name(name)?;
                if !netns::exists(&info.ns_cli) {
                    let (_, notes) = lab::up(
                        name,
                        &LabOptions {
                            stack: opts.stack.clone(),
                        },
                    )?;
                    for n in notes {
                        tracing::info!("{n}");
                    }
                    if !keep {
                        lab_guard.0 = Some(name.clone());
                    }
                } else if let Some(p) = &opts.stack {
                    for n in stack::apply(name, p)? {
                        tracing::info!("{n}");
                    }
                }
                let stack_in_force = stack::read_back(name).ok();
                let token = info.token()?;
                let serve_ctl: ControlAddr =
                    format!("unix:{}", info.runtime_dir.join("serve.sock").display())
                        .parse()
                        .map_err(ReplayError::Invalid)?;
                let netemu_ctl: ControlAddr = info.control.parse().map_err(ReplayError::Invalid)?;
                let server = SocketAddr::new(IpAddr::V4(info.server_addr), opts.server_port);
                progress.stage("roles");
                let tf = info.token_file.display().to_string();
                // the real-time datapath gets a CPU of its own, the timer threads the others
                cpu_split = opts
                    .cpu_split
                    .then(cpu::allowed_cpus)
                    .and_then(Result::ok)
                    .and_then(|a| cpu::lab_split(&a))
                    .map(|(datapath, timers)| CpuSplit { datapath, timers });
                let mut emu_args: Vec<String> = [
                    "-q",
                    "netemu",
                    "run",
                    "--lab",
                    name,
                    "--control",
                    &netemu_ctl.to_string(),
                    "--token-file",
                    &tf,
                ]
                .map(String::from)
                .into();
                let mut serve_args: Vec<String> = [
                    "-q",
                    "serve",
                    "--listen",
                    &server.to_string(),
                    "--control",
                    &serve_ctl.to_string(),
                    "--token-file",
                    &tf,
                ]
                .map(String::from)
                .into();
                if let Some(c) = &cpu_split {
                    emu_args.extend(["--cpu".into(), c.datapath.to_string()]);
                    serve_args.extend(["--timer-cpus".into(), cpu::format_list(&c.timers)]);
                }
                roles.spawn(
                    "network emulator",
                    netns::command(&info.ns_emu, exe, emu_args),
                    &work.0.join("netemu.log"),
                )?;
                roles.spawn(
                    "server emulator",
                    netns::command(&info.ns_srv, exe, serve_args),
                    &work.0.join("serve.log"),
                )?;
                let cd = capdir.display().to_string();
                roles.spawn(
                    "capture",
                    netns::command(
                        &info.ns_srv,
                        exe,
                        [
                            "-q",
                            "capture",
                            "--source",
                            &format!("iface:{}", info.srv_if),
                            "--no-anonymize",
                            "--sample",
                            "1/1",
                            "--payload-bytes",
                            "64",
                            "-o",
                            &cd,
                        ],
                    ),
                    &work.0.join("capture.log"),
                )?;
                let pool: Vec<Ipv4Addr> = (0..info.pool_len())
                    .filter_map(|i| info.pool_addr(i))
                    .collect();
                (
                    server,
                    netemu_ctl,
                    serve_ctl,
                    token,
                    pool,
                    Some(info.ns_cli.clone()),
                    Some(name.clone()),
                    stack_in_force,
                )
            }
            Target::Remote {
                server,
                server_control,
                netemu,
                token_file,
                capture_iface,
                client_addrs,
            } => {
                let token = lab::read_token(token_file)?;
                if client_addrs.is_empty() {
                    return Err(ReplayError::Invalid(
                        "a remote replay needs at least one --client-addr".into(),
                    ));
                }
                let cd = capdir.display().to_string();
                let mut c = Command::new(exe);
                c.args([
                    "-q",
                    "capture",
                    "--source",
                    &format!("iface:{capture_iface}"),
                    "--no-anonymize",
                    "--sample",
                    "1/1",
                    "--payload-bytes",
                    "64",
                    "-o",
                    &cd,
                ]);
                roles.spawn("capture", c, &work.0.join("capture.log"))?;
                (
                    *server,
                    netemu.clone(),
                    server_control.clone(),
                    token,
                    client_addrs.clone(),
                    None,
                    None,
                    None,
                )
            }
        };

    // a refused handshake (wrong token) ends the wait at once; an absent listener is retried
    let remote = opts.target_is_remote();
    let mut netemu = wait_for(
        "network emulator",
        Duration::from_secs(15),
        stop,
        || roles.alive("network emulator") || remote,
        || match NetemuClient::connect(&netemu_addr, &token) {
            Ok(c) => Ok(Some(c)),
            Err(e @ NetemuError::Refused(_)) => Err(e.into()),
            Err(_) => Ok(None),
        },
    )
    .map_err(|e| annotate(e, &work.0.join("netemu.log")))?;
    let mut serve = wait_for(
        "server emulator",
        Duration::from_secs(15),
        stop,
        || roles.alive("server emulator") || remote,
        || match ServeClient::connect(&serve_addr, &token) {
            Ok(c) => Ok(Some(c)),
            Err(e @ ServeError::Refused(_)) => Err(e.into()),
            Err(_) => Ok(None),
        },
    )
    .map_err(|e| annotate(e, &work.0.join("serve.log")))?;
    let ready = capdir.join("capture.ready");
    wait_for(
        "capture",
        Duration::from_secs(15),
        stop,
        || roles.alive("capture"),
        || Ok(ready.exists().then_some(())),
    )
    .map_err(|e| annotate(e, &work.0.join("capture.log")))?;
    serve.reset_stats()?;

    // ---- plan and pipes ----
    progress.stage("pipes");
    let t_first = wl.conns.iter().map(|c| c.t_start_us).min().unwrap_or(0);
    let max_owd = wl.conns.iter().map(|c| c.one_way_us()).max().unwrap_or(0);
    let lead = Duration::from_secs(1) + Duration::from_micros(max_owd.max(0) as u64);
    let mut planned = Vec::with_capacity(wl.conns.len());
    let rules = flow_rules(&wl, &client_addrs, server, opts.seed, opts.queue)?;
    for (c, r) in wl.conns.iter().zip(&rules) {
        let SocketAddr::V4(local) = r.client else {
            return Err(ReplayError::Invalid(format!(
                "client address {} is not IPv4",
                r.client
            )));
        };
        // the SYN left the client one one-way delay before the capture point saw it
        let rel_us = ((c.t_start_us - t_first) as f64 * opts.time_scale) as i64 - c.one_way_us();
        planned.push((local, rel_us, time_limit(c)));
    }
    let configs: Vec<(PipeConfig, PipeConfig)> = rules
        .iter()
        .map(|r| (r.up.clone(), r.down.clone()))
        .collect();
    let mut rule_ids: Vec<RuleId> = Vec::with_capacity(rules.len());
    for batch in rules.chunks(2000) {
        rule_ids.extend(netemu.add_flows(batch)?);
        interrupted(stop)?;
    }

    // ---- replay ----
    progress.stage("replay");
    let t0 = Instant::now() + lead;
    let plans: Vec<Planned> = wl
        .conns
        .iter()
        .zip(planned)
        .enumerate()
        .map(|(i, (c, (local, rel_us, limit)))| Planned {
            index: i,
            spec: Arc::new(c.clone()),
            local,
            server,
            start: if rel_us >= 0 {
                t0 + Duration::from_micros(rel_us as u64)
            } else {
                t0 - Duration::from_micros((-rel_us) as u64)
            },
            limit,
            request_timing: opts.request_timing,
        })
        .collect();
    let timer_cpus = cpu_split.as_ref().map(|c| c.timers.clone());
    let outcomes = run_clients(plans, client_ns, timer_cpus, progress, stop)?;
    interrupted(stop)?;

    // ---- wind down: trailing packets, role statistics, capture closed ----
    progress.stage("collect");
    std::thread::sleep(Duration::from_millis(500));
    let server_stats = serve.stats()?;
    let netemu_stats = netemu.stats().ok();
    let mut pipe_counters = std::collections::HashMap::new();
    for ids in rule_ids.chunks(2000) {
        for f in netemu.remove_flows(ids)? {
            pipe_counters.insert(f.id, (f.up, f.down));
        }
    }
    let pipes: Vec<PipeRecord> = configs
        .into_iter()
        .zip(&rule_ids)
        .map(|((up, down), id)| PipeRecord {
            up,
            down,
            counters: pipe_counters.remove(id),
        })
        .collect();
    if let Target::Lab { .. } = opts.target {
        let _ = serve.shutdown();
        let _ = netemu.shutdown();
    }
    roles.stop("capture", Duration::from_secs(30));
    let capture_summary: serde_json::Value =
        std::fs::read_to_string(capdir.join("capture-summary.json"))
            .ok()
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or(serde_json::Value::Null);
    roles.stop("server emulator", Duration::from_secs(5));
    roles.stop("network emulator", Duration::from_secs(5));
    interrupted(stop)?;

    // ---- analysis into the replay database ----
    progress.stage("analysis");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&capdir)
        .map_err(|e| ReplayError::Io(format!("{}: {e}", capdir.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "pcapng"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(ReplayError::Role {
            role: "capture",
            why: format!(
                "no capture file ({})",
                log_tail(&work.0.join("capture.log"))
            ),
        });
    }
    let staged = work.0.join("replay.db");
    let analysis = analysis::run(&RunOptions {
        inputs: files.clone(),
        output: staged.clone(),
        config: mimic_analyze::Config {
            server_ports: vec![opts.server_port],
            ..mimic_analyze::Config::default()
        },
        threads: 1,
        progress: None,
        meta: Vec::new(),
        filter: None,
        cancel: None,
    })
    .map_err(|e| ReplayError::Analysis(e.to_string()))?;
    // the analysis is not cut short; a Ctrl-C during it still leaves no output
    interrupted(stop)?;

    let summary = finish_db(
        &staged,
        opts,
        &wl,
        &outcomes,
        &pipes,
        server,
        stack_in_force.as_ref(),
        lab_name.as_deref(),
    )?;
    if let Some(keep) = &opts.keep_capture {
        std::fs::create_dir_all(keep)
            .map_err(|e| ReplayError::Io(format!("{}: {e}", keep.display())))?;
        for f in &files {
            let to = keep.join(f.file_name().unwrap_or_default());
            std::fs::rename(f, &to)
                .or_else(|_| std::fs::copy(f, &to).map(|_| ()))
                .map_err(|e| ReplayError::Io(format!("{}: {e}", to.display())))?;
        }
    }
    std::fs::rename(&staged, &opts.output)
        .map_err(|e| ReplayError::Io(format!("{}: {e}", opts.output.display())))?;
    drop(roles);
    drop(lab_guard);

    let mut late: Vec<u64> = outcomes
        .iter()
        .map(|o| o.start_lateness.as_micros() as u64)
        .collect();
    late.sort_unstable();
    let q = |f: f64| {
        late.get(((late.len() as f64 - 1.0) * f).round() as usize)
            .copied()
            .unwrap_or(0)
    };
    let mut failures = BTreeMap::new();
    for o in &outcomes {
        if let Err(f) = &o.result {
            *failures.entry(f.as_str()).or_default() += 1;
        }
    }
    Ok(ReplaySummary {
        input: opts.input.display().to_string(),
        output: opts.output.display().to_string(),
        lab: lab_name,
        connections: outcomes.len() as u64,
        ok: outcomes.iter().filter(|o| o.result.is_ok()).count() as u64,
        failed: outcomes.iter().filter(|o| o.result.is_err()).count() as u64,
        failures,
        missing: summary.missing,
        skipped_by_select: wl.skipped,
        start_lateness_us: [q(0.5), q(0.99), late.last().copied().unwrap_or(0)],
        start_lateness_p999_us: q(0.999),
        starts_over_1ms: late.iter().filter(|&&l| l > 1000).count() as u64,
        client_timer_realtime: HrTimer::realtime(),
        max_concurrent: progress.max_in_flight.load(Ordering::Relaxed),
        server: server_stats,
        netemu: netemu_stats,
        capture: capture_summary,
        stack: stack_in_force,
        cpu_split,
        analysis,
        duration_s: started.elapsed().as_secs_f64(),
    })
}

impl ReplayOptions {
    fn target_is_remote(&self) -> bool {
        matches!(self.target, Target::Remote { .. })
    }
}

fn annotate(e: ReplayError, log: &Path) -> ReplayError {
    match e {
        ReplayError::Role { role, why } => ReplayError::Role {
            role,
            why: format!("{why}; log: {}", log_tail(log)),
        },
        other => other,
    }
}

/// Runs every planned connection (in the client namespace when given) and returns the
/// outcomes in plan order.
fn run_clients(
    plans: Vec<Planned>,
    ns: Option<String>,
    timer_cpus: Option<Vec<usize>>,
    progress: &Progress,
    stop: &AtomicBool,
) -> Result<Vec<Outcome>, ReplayError> {
    let n = plans.len();
    let stop_flag = Arc::new(AtomicBool::new(false));
    let counters = Arc::new([
        AtomicU64::new(0),
        AtomicU64::new(0),
        AtomicU64::new(0),
        AtomicU64::new(0),
    ]);
    let handle = {
        let stop_flag = stop_flag.clone();
        let counters = counters.clone();
        std::thread::Builder::new()
            .name("mimic-clients".into())
            .spawn(move || -> Result<Vec<Outcome>, ReplayError> {
                if let Some(ns) = &ns {
                    // threads started from here (the runtime's workers) inherit the namespace
                    netns::enter(ns).map_err(|e| ReplayError::Io(e.to_string()))?;
                }
                raise_fd_limit();
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .map_err(|e| ReplayError::Io(format!("client runtime: {e}")))?;
                rt.block_on(async move {
                    let timer = HrTimer::global();
                    if let Some(c) = &timer_cpus {
                        if let Err(e) = timer.pin(c) {
                            tracing::warn!(
                                "keeping the client timer thread on CPUs {}: {e}",
                                cpu::format_list(c)
                            );
                        }
                    }
                    let mut set = tokio::task::JoinSet::new();
                    for p in plans {
                        let counters = counters.clone();
                        set.spawn(async move {
                            tokio::time::sleep_until((p.start - Duration::from_millis(5)).into())
                                .await;
                            let now = counters[2].fetch_add(1, Ordering::Relaxed) + 1;
                            counters[3].fetch_max(now, Ordering::Relaxed);
                            let o = client::run(p, timer).await;
                            counters[2].fetch_sub(1, Ordering::Relaxed);
                            counters[if o.result.is_ok() { 0 } else { 1 }]
                                .fetch_add(1, Ordering::Relaxed);
                            o
                        });
                    }
                    let mut outcomes: Vec<Outcome> = Vec::with_capacity(n);
                    loop {
                        tokio::select! {
                            r = set.join_next() => match r {
                                Some(Ok(o)) => outcomes.push(o),
                                // tasks aborted by Ctrl-C are expected, not worth a warning
                                Some(Err(e)) if e.is_cancelled() => {}
                                Some(Err(e)) => tracing::warn!("client task: {e}"),
                                None => break,
                            },
                            _ = tokio::time::sleep(Duration::from_millis(100)) => {
                                if stop_flag.load(Ordering::Relaxed) {
                                    set.abort_all();
                                }
                            }
                        }
                    }
                    outcomes.sort_by_key(|o| o.index);
                    Ok(outcomes)
                })
            })
            .map_err(|e| ReplayError::Io(e.to_string()))?
    };
    let publish = || {
        let c = |k: usize| counters[k].load(Ordering::Relaxed);
        progress.done.store(c(0), Ordering::Relaxed);
        progress.failed.store(c(1), Ordering::Relaxed);
        progress.in_flight.store(c(2), Ordering::Relaxed);
        progress.max_in_flight.store(c(3), Ordering::Relaxed);
    };
    while !handle.is_finished() {
        publish();
        if stop.load(Ordering::Relaxed) {
            stop_flag.store(true, Ordering::Relaxed);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    publish();
    handle
        .join()
        .map_err(|_| ReplayError::Io("client thread panicked".into()))?
}

fn raise_fd_limit() {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 && l.rlim_cur < l.rlim_max {
            l.rlim_cur = l.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        }
    }
}

struct Finished {
    missing: u64,
}

/// A connection's pipes and what the emulator counted on them.
struct PipeRecord {
    up: PipeConfig,
    down: PipeConfig,
    counters: Option<(mimic_netemu::pipe::Counters, mimic_netemu::pipe::Counters)>,
}

/// Adds `replay_map` and the replay's metadata to the analysis of the capture.
#[allow(clippy::too_many_arguments)]
fn finish_db(
    path: &Path,
    opts: &ReplayOptions,
    wl: &Workload,
    outcomes: &[Outcome],
    pipes: &[PipeRecord],
    server: SocketAddr,
    stack: Option<&StackProfile>,
    lab: Option<&str>,
) -> Result<Finished, ReplayError> {
    let sq = |source| DbError::Sqlite {
        path: path.to_path_buf(),
        source,
    };
    let mut c = rusqlite::Connection::open(path).map_err(sq)?;
    let tx = c.transaction().map_err(sq)?;
    let mut missing = 0u64;
    {
        let mut find = tx
            .prepare("SELECT id FROM connections WHERE client_ip = ?1 AND client_port = ?2 AND server_port = ?3 ORDER BY id DESC LIMIT 1")
            .map_err(sq)?;
        for o in outcomes {
            let spec = &wl.conns[o.index];
            let local = o.local;
            let found: Option<i64> = find
                .query_row(
                    rusqlite::params![local.ip().to_string(), local.port(), server.port()],
                    |r| r.get(0),
                )
                .ok();
            let (status, failure) = match (&o.result, found) {
                (Ok(()), Some(_)) => ("ok", None),
                (Ok(()), None) => {
                    missing += 1;
                    ("missing", Some("not in the capture".to_string()))
                }
                (Err(f), _) => ("failed", Some(f.as_str())),
            };
            ReplayMapRow {
                orig_conn_id: spec.orig_id,
                replay_conn_id: if status == "ok" { found } else { None },
                status: status.into(),
                failure: failure.map(Text::Owned),
                client_ip: Some(Text::Owned(local.ip().to_string())),
                client_port: Some(local.port().into()),
                server_ip: Some(Text::Owned(server.ip().to_string())),
                server_port: Some(server.port().into()),
            }
            .insert(&tx)
            .map_err(sq)?;
        }
        for (c, p) in wl.conns.iter().zip(pipes) {
            let q = |l: &QueueLimit| match l {
                QueueLimit::Packets(n) => *n as i64,
                QueueLimit::Bytes(b) => *b as i64,
            };
            let loss = match p.down.loss {
                LossModel::Iid(x) => x,
                _ => 0.0,
            };
            let (u, d) = match &p.counters {
                Some((u, d)) => (Some(u), Some(d)),
                None => (None, None),
            };
            ReplayPipeRow {
                orig_conn_id: c.orig_id,
                one_way_delay_us: (p.down.delay / 1000) as i64,
                down_rate_bps: (p.down.rate_bps > 0).then_some(p.down.rate_bps as f64),
                down_loss: loss,
                queue_up: q(&p.up.queue),
                queue_down: q(&p.down.queue),
                ack_every: p.up.ack.map(|a| a.every.into()),
                ack_timeout_us: p.up.ack.map(|a| (a.timeout / 1000) as i64),
                up_packets: u.map(|c| c.packets as i64),
                up_queue_drops: u.map(|c| c.queue_drops as i64),
                up_loss_drops: u.map(|c| c.loss_drops as i64),
                down_packets: d.map(|c| c.packets as i64),
                down_bytes: d.map(|c| c.bytes as i64),
                down_queue_drops: d.map(|c| c.queue_drops as i64),
                down_loss_drops: d.map(|c| c.loss_drops as i64),
                down_max_queue: d.map(|c| c.max_queue_packets as i64),
            }
            .insert(&tx)
            .map_err(sq)?;
        }
    }
    let meta = [
        ("role", "replay".to_string()),
        ("replay_of", opts.input.display().to_string()),
        ("replay_of_role", wl.role.clone().unwrap_or_default()),
        ("select", format!("{:?}", opts.select).to_lowercase()),
        ("time_scale", opts.time_scale.to_string()),
        ("seed", opts.seed.to_string()),
        ("queue", opts.queue.to_string()),
        ("request_timing", opts.request_timing.to_string()),
        ("lab", lab.unwrap_or("").to_string()),
        (
            "stack",
            stack
                .map(|s| serde_json::to_string(s).unwrap_or_default())
                .unwrap_or_default(),
        ),
        (
            "stack_spec",
            stack.map(|s| s.to_string()).unwrap_or_default(),
        ),
        ("replayed", outcomes.len().to_string()),
        (
            "replay_failed",
            outcomes
                .iter()
                .filter(|o| o.result.is_err())
                .count()
                .to_string(),
        ),
    ];
    for (k, v) in meta {
        set_meta(&tx, k, &v).map_err(sq)?;
    }
    tx.commit().map_err(sq)?;
    Ok(Finished { missing })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Close;

    fn conn(bw_bps: Option<f64>, loss: f64, delack: Option<u32>) -> ConnSpec {
        ConnSpec {
            orig_id: 7,
            t_start_us: 0,
            min_rtt_us: Some(40_000),
            bw_bps,
            loss_rate_down: loss,
            delack_every: delack,
            delack_timeout_us: None,
            rwin_bytes: None,
            mss_client: None,
            server_port: 80,
            close: Close::ClientFin,
            exchanges: Vec::new(),
        }
    }

    #[test]
    fn pipes_follow_the_connection_and_monkeys_queue_classes() {
        let (up, down) = pipes_for(&conn(Some(1e6), 0.02, Some(2)), 9, QueueOverride::default());
        assert_eq!(up.delay, 20_000_000);
        assert_eq!(down.delay, 20_000_000);
        assert_eq!(up.rate_bps, 0, "upstream is not rate-limited");
        assert_eq!(down.rate_bps, 1_000_000);
        assert_eq!(up.queue, QueueLimit::Packets(10));
        assert_eq!(down.queue, QueueLimit::Packets(30));
        assert!(matches!(up.loss, LossModel::None), "no upstream loss");
        assert!(matches!(down.loss, LossModel::Iid(p) if p == 0.02));
        let ack = up.ack.expect("delayed-ACK shaping");
        assert_eq!(ack.every, 2);
        assert_eq!(ack.timeout, DEFAULT_DELACK_TIMEOUT_US as u64 * 1000);

        let (up, down) = pipes_for(&conn(Some(28e3), 0.0, None), 9, QueueOverride::default());
        assert_eq!(
            (up.queue, down.queue),
            (QueueLimit::Packets(5), QueueLimit::Packets(5))
        );
        assert!(up.ack.is_none() && matches!(down.loss, LossModel::None));
        let (up, down) = pipes_for(&conn(None, 0.0, None), 9, QueueOverride::default());
        assert_eq!(down.rate_bps, 0, "unknown bandwidth: no rate limit");
        assert_eq!(
            (up.queue, down.queue),
            (QueueLimit::Packets(40), QueueLimit::Packets(40))
        );
    }

    #[test]
    fn queue_override_replaces_the_class_per_direction() {
        let c = conn(Some(1e6), 0.0, None);
        let q: QueueOverride = "100".parse().unwrap();
        let (up, down) = pipes_for(&c, 1, q);
        assert_eq!(
            (up.queue, down.queue),
            (QueueLimit::Packets(100), QueueLimit::Packets(100))
        );
        let q: QueueOverride = "down=64".parse().unwrap();
        let (up, down) = pipes_for(&c, 1, q);
        assert_eq!(
            (up.queue, down.queue),
            (QueueLimit::Packets(10), QueueLimit::Packets(64))
        );
        assert_eq!(q.to_string(), "up=by rate class,down=64");
        let q: QueueOverride = " up=3 , down=4 ".parse().unwrap();
        assert_eq!((q.up, q.down), (Some(3), Some(4)));
        for bad in ["0", "-1", "x", "up=0", "side=3", "up=3,up=4", "up"] {
            assert!(bad.parse::<QueueOverride>().is_err(), "{bad} accepted");
        }
    }
}
