//! A whole replay (`mimic replay`): the server emulator, the network emulator and a capture of
//! the server side run as separate processes (in the lab's namespaces, or on remote hosts
//! reached over their authenticated control channels); every replayed connection gets its own
//! pair of pipes, registered before its SYN; the client emulator runs here; at the end the
//! capture is analyzed into the replay database, with `replay_map` pairing each replayed
//! connection with the original.
//!
//! By stage: [`plan`] (pipes, 4-tuples, start times), `roles` (starting the other roles from
//! their specs, waiting for them, stopping them), `clients` (the replay), `db` (the replay
//! database), [`error`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use mimic_analyze::driver::Summary as AnalysisSummary;
use mimic_capture::CaptureSummary;
use mimic_core::cpu;
use mimic_netemu::config::PipeConfig;
use mimic_netemu::control::RunStats;
use mimic_netemu::engine::RuleId;
use mimic_netemu::stack::StackProfile;
use serde::Serialize;

use crate::hrtimer::HrTimer;
use crate::server::ServerStats;
use crate::workload;

pub mod agents;
mod clients;
mod db;
pub mod delack;
pub mod error;
mod guest_emu;
mod guest_serve;
pub mod health;
pub mod kernel;
pub mod lan;
pub mod plan;
pub mod queues;
pub mod rates;
mod roles;
pub mod shapers;

pub use crate::spec::{Emulator, PipeMode, ReplayOptions, Target};
pub use clients::run_clients;
pub use error::ReplayError;
pub use plan::{flow_rules, pipes_for, QueueOverride};
pub use rates::{RateSources, Unestimated};

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
    /// Connections by the source of their downstream rate (`--unestimated`), and the
    /// delayed-ACK timeouts defaulted; the connections left out are not in `connections`.
    pub rate_sources: RateSources,
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
    /// What carried the pipes (`--emulator`: mimic, netem, dummynet).
    pub emulator: &'static str,
    /// With kernel pipes: where and how fast they were installed, what was left out.
    pub kernel_pipes: Option<kernel::KernelInstall>,
    /// What the capture reported when it stopped (None: it wrote no summary).
    pub capture: Option<CaptureSummary>,
    /// Captured at the server host by `mimic serve`: what bringing the files here cost.
    pub capture_fetch: Option<crate::serve_capture::CaptureFetch>,
    pub stack: Option<StackProfile>,
    /// Where the replay was captured: `server` (the lab, or remote by `mimic serve` at its
    /// host) or `client` (remote, `--vantage client`: `--capture-iface` on the client host;
    /// response times then carry about one more RTT than an original captured at the server).
    pub capture_vantage: &'static str,
    /// The server host's kernel and stack as `mimic serve` reported them (None: it did not
    /// answer `info`).
    pub server_host: Option<crate::control::HostInfo>,
    /// In the lab: the CPU the network emulator's datapath had to itself, and the CPUs the
    /// client and server emulators' timer threads were kept on (None: `--no-cpu-split`, a
    /// remote replay, or a single CPU).
    pub cpu_split: Option<CpuSplit>,
    pub analysis: AnalysisSummary,
    /// Whether the replay's timing was what it was asked to be (health.rs; also in `meta`).
    pub timing: health::TimingHealth,
    pub duration_s: f64,
    /// With `--agents`: how each agent's share went (empty: the client ran here).
    pub agents: Vec<agents::AgentRun>,
    /// The LAN's own round trip taken off the pipes' delays (`--lan-rtt`).
    pub lan_rtt: LanRttUsed,
}

/// The LAN's round trip a replay took off its pipes' delays, and where the figure came from.
#[derive(Clone, Debug, Serialize)]
pub struct LanRttUsed {
    pub us: u64,
    /// `measured` (ping through the router in the lab), `given` (`--lan-rtt`), or why it was
    /// neither (`not measured: ...`, then 0).
    pub source: String,
    /// Connections with a pipe delay shorter than half of it: their pipes got 0 there and
    /// their replayed RTT stays above the original's (the timing health, which adds the LAN's
    /// round trip back, does not see that; this count and a warning do).
    pub short_paths: usize,
}

impl LanRttUsed {
    /// `--lan-rtt`'s figure: given, or measured where this process runs the client in a lab
    /// whose server host is a namespace (a server guest answers pings later than the tap on
    /// its host side sees its TCP replies).
    fn decide(opts: &ReplayOptions, ep: &roles::Endpoints) -> LanRttUsed {
        let not = |why: &str| LanRttUsed {
            us: 0,
            source: format!("not measured: {why}"),
            short_paths: 0,
        };
        match (opts.lan_rtt, &ep.client_ns) {
            (crate::spec::LanRtt::Fixed(us), _) => {
                if us > 10_000 {
                    tracing::warn!(
                        "--lan-rtt {} ms is more than a LAN's round trip: half of it comes off every pipe's delay",
                        us as f64 / 1000.0
                    );
                }
                LanRttUsed {
                    us,
                    source: "given".into(),
                    short_paths: 0,
                }
            }
            (_, _) if ep.lab.is_none() => not("not a lab (give --lan-rtt)"),
            (_, _) if ep.serve_ns.is_some() => not("the server host is a guest"),
            (_, None) => not("no client host in the lab"),
            (_, Some(ns)) => match lan::measure(ns, ep.server.ip()) {
                Ok(us) => LanRttUsed {
                    us,
                    source: "measured".into(),
                    short_paths: 0,
                },
                Err(e) => {
                    tracing::warn!("the LAN's round trip was not measured, taken as 0: {e}");
                    not(&e)
                }
            },
        }
    }

    fn meta(&self) -> Vec<(&'static str, String)> {
        vec![
            ("lan_rtt_us", self.us.to_string()),
            ("lan_rtt_source", self.source.clone()),
            ("lan_rtt_short_paths", self.short_paths.to_string()),
        ]
    }
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

/// The `meta` rows of the emulator, in every mode: `emulator` and `emulator_unsupported`
/// (what the pipes could not do, e.g. `delack:12 connections`; empty when nothing), and with
/// kernel pipes where and how fast they were installed.
fn emulator_meta(
    e: crate::spec::Emulator,
    kernel: Option<&kernel::KernelInstall>,
) -> Vec<(&'static str, String)> {
    let mut v = vec![
        ("emulator", e.as_str().to_string()),
        (
            "emulator_unsupported",
            kernel.map(|k| k.unsupported()).unwrap_or_default(),
        ),
    ];
    if let Some(k) = kernel {
        v.extend(k.meta());
    }
    v
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

pub fn run(
    opts: &ReplayOptions,
    progress: &Progress,
    stop: &AtomicBool,
) -> Result<ReplaySummary, ReplayError> {
    let started = Instant::now();
    let steal_before = health::steal_now();
    if !opts.time_scale.is_finite() || opts.time_scale <= 0.0 {
        return Err(ReplayError::Invalid(
            "--time-scale must be a positive number".into(),
        ));
    }
    if opts.emulator == crate::spec::Emulator::Mimic && opts.kernel_pipes != PipeMode::Auto {
        return Err(ReplayError::Invalid(format!(
            "--kernel-pipes {}: only kernel pipes (--emulator netem|dummynet) are installed that way; mimic's emulator registers each connection's pipes over its control channel",
            opts.kernel_pipes.as_str()
        )));
    }
    if opts.target_is_remote() && opts.emulator == crate::spec::Emulator::Dummynet {
        return Err(ReplayError::Invalid(
            "--emulator dummynet: a remote router takes kernel pipes only as netem (`mimic netemu run --backend netem`, then `--emulator netem`); dummynet pipes can be rendered: `mimic netemu render --backend dummynet --from FLOWS_DB`".into(),
        ));
    }
    // the output is only renamed into place after the whole replay: refuse now what that
    // rename would fail on, or replace that it must not (the workload itself, a device)
    mimic_core::db::check_db_output(&opts.output, &[opts.input.as_path()])?;
    progress.stage("load");
    let mut wl = workload::load(&opts.input, opts.select, opts.limit)?;
    let mut rate_sources = rates::assign(&mut wl, opts.unestimated)?;
    rate_sources.queues = rate_sources
        .queues
        .overridden(opts.queue.down, wl.conns.len());
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

    // ---- client agents (before the roles: a lab may get client hosts) ----
    let mut agents = if opts.agents.is_empty() {
        None
    } else {
        progress.stage("agents");
        Some(start_agents(opts, &work.0, stop)?)
    };
    // a remote replay's client addresses are the agents' then
    let with_agents;
    let opts = match (&agents, &opts.target) {
        (Some(a), Target::Remote { .. }) => {
            let mut o = opts.clone();
            if let Target::Remote { client_addrs, .. } = &mut o.target {
                *client_addrs = a.client_addrs();
            }
            with_agents = o;
            &with_agents
        }
        _ => opts,
    };

    // ---- roles ----
    progress.stage("lab");
    let mut roles = roles::Roles::start(opts, &work.0, &capdir, progress)?;
    let mut ctl = roles.connect(opts.target_is_remote(), stop)?;
    let client_addrs = match &agents {
        Some(a) => a.client_addrs(),
        None => roles.endpoints.client_addrs.clone(),
    };
    // the replay port serves only the client addresses this replay uses
    ctl.serve.allow(&crate::control::ranges_of(&client_addrs))?;
    ctl.serve.reset_stats()?;
    // the server host's kernel and stack, as serve sees them (the route towards the clients)
    let server_host = match ctl.serve.info(client_addrs.first().map(|&a| a.into())) {
        Ok(h) => {
            if let Some(e) = &h.stack_error {
                tracing::warn!("the server's stack could not be read: {e}");
            }
            Some(h)
        }
        Err(e) => {
            tracing::warn!("the server emulator did not report its host: {e}");
            None
        }
    };
    let ep = &roles.endpoints;
    let server = ep.server;

    // ---- plan and pipes ----
    progress.stage("pipes");
    let (rules, owner) = match &agents {
        Some(a) => {
            let (locals, owner) = a.assign(&wl, &opts.input)?;
            let rules = plan::flow_rules_at(&wl, &locals, server, opts.seed, opts.queue)?;
            (rules, owner)
        }
        None => (
            flow_rules(&wl, &ep.client_addrs, server, opts.seed, opts.queue)?,
            Vec::new(),
        ),
    };
    let mut rules = rules;
    // the router's own round trip comes off the pipes (lan.rs), measured before they go in
    let mut lan_rtt = LanRttUsed::decide(opts, &roles.endpoints);
    lan_rtt.short_paths = lan::take_off(&mut rules, lan_rtt.us);
    tracing::info!(
        "the LAN's own round trip: {} µs ({}), half of it off each pipe's delay",
        lan_rtt.us,
        lan_rtt.source
    );
    if lan_rtt.short_paths > 0 {
        tracing::warn!(
            "{} of {} connections had a one-way delay shorter than half the LAN's round trip ({} µs): their pipes add nothing there and their replayed RTT stays above the original's; recorded in meta as lan_rtt_short_paths",
            lan_rtt.short_paths,
            rules.len(),
            lan_rtt.us
        );
    }
    if let (None, Some(k)) = (&ctl.netemu, &mut roles.kernel) {
        // kernel pipes cannot hold a connection's first packet: its handshake wait is left
        // out, counted in meta (emulator_unsupported) and warned about
        k.report.handshake_wait_left_out = plan::strip_handshake_waits(&mut rules);
        if k.report.handshake_wait_left_out > 0 {
            tracing::warn!(
                "{} of {} connections replayed WITHOUT their handshake wait (the SYN-ACK held as long as the original's waited): {} pipes cannot hold one packet (mimic's own emulator can); recorded in meta as emulator_unsupported",
                k.report.handshake_wait_left_out,
                rules.len(),
                k.report.backend
            );
        }
    }
    let configs: Vec<(PipeConfig, PipeConfig)> = rules
        .iter()
        .map(|r| (r.up.clone(), r.down.clone()))
        .collect();
    let mut rule_ids: Vec<RuleId> = Vec::with_capacity(rules.len());
    let mut per_connection = false;
    match (&mut ctl.netemu, &mut roles.kernel) {
        (Some(netemu), _) => {
            for batch in rules.chunks(2000) {
                rule_ids.extend(netemu.add_flows(batch)?);
                interrupted(stop)?;
            }
        }
        (None, Some(k)) => match k.mode(opts.kernel_pipes, rules.len(), agents.is_some())? {
            PipeMode::PerConnection => {
                k.begin_per_connection(&rules)?;
                per_connection = true;
                tracing::info!(
                    "kernel pipes ({}) on {}: installed per connection ahead of its SYN, removed after it closes",
                    k.report.backend,
                    k.report.router
                );
            }
            _ => {
                k.install(&rules)?;
                tracing::info!(
                    "{} pipes installed with {} on {}: {} commands in {} execs, {:.2} s",
                    k.report.pipes,
                    k.report.backend,
                    k.report.router,
                    k.report.commands,
                    k.report.execs,
                    k.report.install_s
                );
            }
        },
        (None, None) => unreachable!("a replay has an emulator or kernel pipes"),
    }

    // ---- replay ----
    progress.stage("replay");
    let plans = plan::plans(&wl, &rules, opts.time_scale, opts.request_timing)?;
    let timer_cpus = ep.cpu_split.as_ref().map(|c| c.timers.clone());
    let (outcomes, agent_runs) = match (&mut agents, &mut roles.kernel) {
        (Some(a), _) => a.run(plans, &owner, opts.request_timing, progress, stop)?,
        (None, Some(k)) if per_connection => {
            let mut plans = plans;
            let mut due: Vec<kernel::Due> = plans
                .iter()
                .zip(&rules)
                .map(|(p, r)| kernel::Due {
                    index: p.index,
                    start: p.start,
                    rule: r.clone(),
                })
                .collect();
            // the first connections' pipes go in first; the replay's clock waits for them
            let primed = k.prime(&mut due, stop)?;
            for p in &mut plans {
                p.start += primed;
            }
            for d in &mut due {
                d.start += primed;
            }
            interrupted(stop)?;
            let client_ns = ep.client_ns.clone();
            // the clients stop when the pipes cannot be installed, or on Ctrl-C
            let abort = AtomicBool::new(false);
            let (tx, rx) = std::sync::mpsc::channel();
            // each SYN waits for its pipes
            let gate = std::sync::Arc::new(kernel::PipeGate::new(
                plans.iter().map(|p| p.index + 1).max().unwrap_or(0),
            ));
            let hooks = clients::PipeHooks {
                done: tx,
                gate: gate.clone(),
            };
            let (outcomes, pipes) = std::thread::scope(|s| {
                // (it sets `abort` when it ends with an error, Ctrl-C included)
                let sched = s.spawn(|| k.run_per_connection(due, rx, &gate, stop, &abort));
                let outcomes = clients::run_clients(
                    plans,
                    client_ns,
                    timer_cpus,
                    Some(hooks),
                    progress,
                    &abort,
                );
                let pipes = sched
                    .join()
                    .unwrap_or_else(|_| Err(ReplayError::Io("the pipe scheduler panicked".into())));
                (outcomes, pipes)
            });
            pipes?;
            (outcomes?, Vec::new())
        }
        _ => (
            clients::run_clients(
                plans,
                ep.client_ns.clone(),
                timer_cpus,
                None,
                progress,
                stop,
            )?,
            Vec::new(),
        ),
    };
    if let Some(a) = agents.take() {
        a.stop();
    }
    interrupted(stop)?;

    // ---- wind down: trailing packets, role statistics, capture closed ----
    progress.stage("collect");
    std::thread::sleep(Duration::from_millis(500));
    let server_stats = ctl.serve.stats()?;
    let mut netemu_stats = None;
    let mut pipe_counters = std::collections::HashMap::new();
    if let Some(netemu) = &mut ctl.netemu {
        netemu_stats = netemu.stats().ok();
        for ids in rule_ids.chunks(2000) {
            for f in netemu.remove_flows(ids)? {
                pipe_counters.insert(f.id, (f.up, f.down));
            }
        }
    }
    let kernel = match &mut roles.kernel {
        Some(k) => {
            k.remove()?;
            Some(k.report.clone())
        }
        None => None,
    };
    let pipes: Vec<db::PipeRecord> = configs
        .into_iter()
        .enumerate()
        .map(|(i, (up, down))| db::PipeRecord {
            up,
            down,
            counters: rule_ids.get(i).and_then(|id| pipe_counters.remove(id)),
        })
        .collect();
    let capture_summary = roles.stop(ctl, !opts.target_is_remote())?;
    interrupted(stop)?;

    // ---- analysis into the replay database ----
    progress.stage("analysis");
    let files = roles.capture_files()?;
    let staged = work.0.join("replay.db");
    let analysis = db::analyze(&files, &staged, opts.server_port)?;
    // the analysis is not cut short; a Ctrl-C during it still leaves no output
    interrupted(stop)?;

    let ep = &roles.endpoints;
    let finished = db::finish_db(
        &staged,
        opts,
        &wl,
        &outcomes,
        &pipes,
        server,
        ep.stack_in_force.as_ref(),
        ep.lab.as_deref(),
        &db::Vantage {
            capture: ep.capture_vantage,
            iface: &ep.capture_iface,
            server_host: server_host.as_ref(),
            agents: (!agent_runs.is_empty())
                .then(|| serde_json::to_string(&agent_runs).unwrap_or_default()),
        },
        &rate_sources,
        &emulator_meta(opts.emulator, kernel.as_ref())
            .into_iter()
            .chain(lan_rtt.meta())
            .collect::<Vec<_>>(),
    )?;
    // was the replay's timing what it was asked to be? (health.rs)
    let mut late: Vec<u64> = outcomes
        .iter()
        .map(|o| o.start_lateness.as_micros() as u64)
        .collect();
    late.sort_unstable();
    let q = |f: f64| health::quantile(&late, f).unwrap_or(0);
    let at_server = ep.capture_vantage == "server";
    let rtts = if at_server {
        health::rtt_pairs(&staged, &wl, &pipes, lan_rtt.us)?
    } else {
        Vec::new()
    };
    let timing = health::judge(&health::Measured {
        rtts: &rtts,
        rtt_judged: at_server,
        start_late_p99_us: (!late.is_empty()).then(|| q(0.99)),
        server: Some(&server_stats),
        netemu: netemu_stats.as_ref(),
        load: health::loadavg(),
        stolen: health::stolen_since(steal_before, started.elapsed()),
    });
    health::write_meta(&staged, &timing)?;
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
    let lab = ep.lab.clone();
    let stack_in_force = ep.stack_in_force.clone();
    let cpu_split = ep.cpu_split.clone();
    let capture_vantage = ep.capture_vantage;
    let capture_fetch = roles.fetched.clone();
    drop(roles);

    let mut failures = BTreeMap::new();
    for o in &outcomes {
        if let Err(f) = &o.result {
            *failures.entry(f.as_str()).or_default() += 1;
        }
    }
    Ok(ReplaySummary {
        input: opts.input.display().to_string(),
        output: opts.output.display().to_string(),
        lab,
        connections: outcomes.len() as u64,
        ok: outcomes.iter().filter(|o| o.result.is_ok()).count() as u64,
        failed: outcomes.iter().filter(|o| o.result.is_err()).count() as u64,
        failures,
        missing: finished.missing,
        skipped_by_select: wl.skipped,
        rate_sources,
        start_lateness_us: [q(0.5), q(0.99), late.last().copied().unwrap_or(0)],
        start_lateness_p999_us: q(0.999),
        starts_over_1ms: late.iter().filter(|&&l| l > 1000).count() as u64,
        client_timer_realtime: if agent_runs.is_empty() {
            HrTimer::realtime()
        } else {
            agent_runs
                .iter()
                .map(|r| r.timer_realtime)
                .try_fold(true, |all, r| r.map(|r| all && r))
        },
        max_concurrent: progress.max_in_flight.load(Ordering::Relaxed),
        server: server_stats,
        netemu: netemu_stats,
        emulator: opts.emulator.as_str(),
        kernel_pipes: kernel,
        capture: capture_summary,
        capture_fetch,
        stack: stack_in_force,
        capture_vantage,
        server_host,
        cpu_split,
        analysis,
        timing,
        duration_s: started.elapsed().as_secs_f64(),
        agents: agent_runs,
        lan_rtt,
    })
}

/// Connects the replay's client agents (starting those on lab client hosts) with the
/// controller's side of the control channel: the lab's, or `--pki`'s.
fn start_agents(
    opts: &ReplayOptions,
    work: &Path,
    stop: &AtomicBool,
) -> Result<agents::Agents, ReplayError> {
    let (tls, timer_cpus) = match &opts.target {
        Target::Lab { name, .. } => {
            let info = mimic_netemu::lab::LabInfo::for_name(name)?;
            if !mimic_netemu::netns::exists(&info.ns_cli) {
                return Err(ReplayError::Invalid(format!(
                    "--agents: lab {name} is not up (`mimic lab up {name} --clients N` first: its control channel's PKI is what the agents use)"
                )));
            }
            // as the local client's: the timer threads off the datapath's CPU
            let timers = opts
                .cpu_split
                .then(cpu::allowed_cpus)
                .and_then(Result::ok)
                .and_then(|a| cpu::lab_split(&a))
                .map(|(_, timers)| timers);
            (info.controller_tls()?, timers)
        }
        Target::Remote { pki_dir, .. } => (
            crate::control::ControllerTls::load(pki_dir)
                .map_err(mimic_netemu::control::ControlError::from)?,
            None,
        ),
    };
    agents::Agents::start(opts, &tls, work, timer_cpus, stop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Emulator;

    #[test]
    fn every_replay_records_its_emulator() {
        assert_eq!(
            emulator_meta(Emulator::Mimic, None),
            [
                ("emulator", "mimic".to_string()),
                ("emulator_unsupported", String::new())
            ]
        );
        let k = kernel::KernelInstall {
            backend: "netem",
            delack_left_out: 2,
            ..Default::default()
        };
        let m = emulator_meta(Emulator::Netem, Some(&k));
        assert_eq!(m[0], ("emulator", "netem".to_string()));
        assert_eq!(
            m[1],
            ("emulator_unsupported", "delack:2 connections".to_string())
        );
        assert!(m.iter().any(|(k, _)| *k == "emulator_install_s"));
    }
}
