//! `mimic replay flows.db -o replay.db --lab NAME`: replays a workload through per-flow pipes
//! against the server emulator, captures the server side and analyzes it into replay.db.
//! The flags map to the client's spec ([`Args::into_spec`] → [`ReplayOptions`]); the replay
//! starts the other roles from their own crates' specs.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use mimic_netemu::control::ControlAddr;
use mimic_netemu::stack::StackProfile;
use mimic_replay::orchestrate::{
    self, Progress, QueueOverride, ReplayError, ReplayOptions, ReplaySummary, Target, Unestimated,
};
use mimic_replay::spec::{self, AgentTarget, Emulator, RemoteCapture};
use mimic_replay::workload::{RequestTiming, Select};

use super::parse_control;

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["lab", "server"])))]
pub struct Args {
    /// The workload: a database from mimic analyze, mimic synth or an earlier replay.
    pub input: PathBuf,
    /// The replay database to write (same schema, role replay, with replay_map).
    #[arg(short, long, value_name = "FILE", value_parser = super::file_output)]
    pub output: PathBuf,
    /// Replay in this lab (built for the replay and torn down after unless it exists already).
    #[arg(long, value_name = "NAME")]
    pub lab: Option<String>,
    /// Keep a lab the replay had to build.
    #[arg(long, requires = "lab")]
    pub keep_lab: bool,
    /// Server stack profile for the replay, e.g. initcwnd=10,cc=cubic (see mimic lab stack).
    /// Lab only: with --server, set the stack on the server host itself (mimic lab stack, sysctl).
    #[arg(long, value_name = "PROFILE", value_parser = parse_stack, conflicts_with = "server")]
    pub stack: Option<StackProfile>,
    /// Queue lengths in packets instead of Monkey's rate classes (5 below 56 kbit/s, 10 up /
    /// 30 down to 6 Mbit/s, 40 above): N for both directions, or up=N,down=M.
    #[arg(long, value_name = "N|up=N,down=M", value_parser = parse_queue)]
    pub queue: Option<QueueOverride>,
    /// When requests leave: recorded (open loop: at the recorded time within the connection,
    /// never before the previous response plus its think time) or think (the recorded think
    /// time after the previous response).
    #[arg(long, value_name = "recorded|think", default_value = "recorded")]
    pub request_timing: RequestTiming,
    /// What a connection without a bandwidth estimate of its own gets: pooled (the median
    /// estimate of the same client address's connections, else it is left out), pooled-class
    /// (else the median of its RTT class: <10, 10-50, 50-200, >=200 ms, before leaving it out),
    /// skip (left out) or unshaped (no rate limit).
    #[arg(
        long,
        value_name = "pooled|pooled-class|skip|unshaped",
        default_value = "pooled"
    )]
    pub unestimated: Unestimated,
    /// Which connections: complete (handshake, termination, no holes) or all.
    #[arg(long, default_value = "complete", value_parser = parse_select)]
    pub select: Select,
    /// Replay only the first N connections (in start order).
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// Multiply the gaps between connection starts by X (2 = half the arrival rate).
    #[arg(long, value_name = "X", default_value_t = spec::DEFAULT_TIME_SCALE, value_parser = super::positive_number)]
    pub time_scale: f64,
    /// Seed of the pipes' loss models.
    #[arg(long, default_value_t = spec::DEFAULT_SEED)]
    pub seed: u64,
    /// Port of the server emulator.
    #[arg(long, default_value_t = spec::DEFAULT_SERVER_PORT, value_parser = super::server_port)]
    pub server_port: u16,
    /// Keep the replay's capture files in DIR.
    #[arg(long, value_name = "DIR")]
    pub keep_capture: Option<PathBuf>,
    /// In the lab, leave CPU placement to the scheduler (by default the network emulator's
    /// real-time datapath gets the last CPU to itself and the timer threads the others).
    #[arg(long)]
    pub no_cpu_split: bool,
    /// What carries the per-connection pipes: mimic's own datapath, or kernel pipes
    /// installed on the router host (see --kernel-pipes): `netem` (tc htb + netem + u32; the
    /// router must have sch_netem: a `lab up --kernel` guest, or a remote router running
    /// `mimic netemu run --backend netem`, given as --netemu) or `dummynet` (needs ipfw; lab
    /// only). Kernel pipes cannot shape delayed ACKs: that is warned about and recorded in meta.
    #[arg(long, value_name = "mimic|netem|dummynet", default_value = "mimic")]
    pub emulator: Emulator,
    /// With kernel pipes: `all` installs every connection's pipes before the first SYN and
    /// removes them after the last; `per-connection` installs each connection's ahead of its
    /// SYN (by a lead time that follows the measured install time) and removes them after it
    /// closes, so a long replay never holds them all; `auto`: all at once up to 2,000
    /// connections, per connection above (dummynet and --agents: always all). Installs that
    /// come after their SYN are counted in the summary and meta.
    #[arg(long, value_name = "auto|all|per-connection", default_value = "auto")]
    pub kernel_pipes: spec::PipeMode,
    /// The replay LAN's own round trip, half of it taken off each direction's pipe delay so a
    /// replayed path's RTT is the original's: `auto` measures it in a lab whose server host is
    /// a namespace (the minimum of 20 pings from the client host through the router, before
    /// the pipes; a TCG router guest adds 0.6-2.6 ms, mimic's own datapath 0.05-0.1 ms), 0
    /// elsewhere; or give it (`0`, `1.5ms`). Recorded in meta `lan_rtt_us`.
    #[arg(long, value_name = "auto|DURATION", default_value = "auto")]
    pub lan_rtt: spec::LanRtt,
    /// Remote server emulator (mimic serve) instead of a lab: its data address.
    #[arg(long, value_name = "ADDR", conflicts_with = "lab", requires_all = ["server_control", "netemu", "pki"], value_parser = super::server_addr)]
    pub server: Option<SocketAddr>,
    /// Control channel of the remote server emulator (unix:PATH or tcp:HOST:PORT).
    #[arg(long, value_name = "ADDR", value_parser = parse_control)]
    pub server_control: Option<ControlAddr>,
    /// Control channel of the remote network emulator.
    #[arg(long, value_name = "ADDR", value_parser = parse_control)]
    pub netemu: Option<ControlAddr>,
    /// Directory with the controller's control-channel files from `mimic pki init`
    /// (ca.crt, controller.crt, controller.key).
    #[arg(long, value_name = "DIR")]
    pub pki: Option<PathBuf>,
    /// Where a remote replay is captured: `server` (mimic serve captures on its host and
    /// hands the files over the control channel, as an original from a tap in front of the
    /// server is measured) or `client` (on this host, --capture-iface: response times then
    /// carry about one more round trip). Recorded in meta `capture_vantage`.
    #[arg(
        long,
        value_name = "SIDE",
        value_enum,
        default_value = "server",
        requires = "server",
        conflicts_with = "lab"
    )]
    pub vantage: VantageArg,
    /// With --vantage client: the local interface on the path to the server, where the replay
    /// is captured.
    #[arg(long, value_name = "IF", requires = "server", conflicts_with = "lab")]
    pub capture_iface: Option<String>,
    /// Local source addresses for replayed connections (repeatable; with --server and
    /// without --agents, at least one).
    #[arg(long, value_name = "IP", conflicts_with = "agents", value_parser = super::client_addr)]
    pub client_addr: Vec<Ipv4Addr>,
    /// Open the connections from these client agents instead of this process, split by the
    /// Community ID of each original connection (agent K gets `analyze --shard K/N`'s
    /// connections), started on one wall-clock instant: HOST:PORT or tcp:HOST:PORT or
    /// unix:PATH of a running `mimic agent`, or, with --lab, a lab client host (cli, cli2, …;
    /// the replay starts an agent there on the host's address pool). Comma-separated.
    #[arg(long, value_name = "AGENT,...", value_delimiter = ',', value_parser = parse_agent)]
    pub agents: Vec<AgentTarget>,
    /// How long each call to an agent waits for its answer, in seconds (answered from memory:
    /// longer means the agent is hung or its host overloaded, and the replay fails naming it;
    /// raise it for agents across a slow or lossy link).
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = mimic_replay::agent::DEFAULT_LIMIT.as_secs(),
        value_parser = clap::value_parser!(u64).range(1..=3600),
        requires = "agents"
    )]
    pub agent_timeout: u64,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `--vantage`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum VantageArg {
    Server,
    Client,
}

fn parse_stack(s: &str) -> Result<StackProfile, String> {
    s.parse()
        .map_err(|e: mimic_netemu::stack::ProfileError| e.to_string())
}
fn parse_queue(s: &str) -> Result<QueueOverride, String> {
    s.parse()
}
fn parse_select(s: &str) -> Result<Select, String> {
    s.parse()
}
fn parse_agent(s: &str) -> Result<AgentTarget, String> {
    s.parse()
}

impl Args {
    /// The replay these flags describe; `exe` is the mimic executable that runs the roles.
    pub fn into_spec(self, exe: PathBuf) -> anyhow::Result<ReplayOptions> {
        // (clap's `requires` is not checked against --server, which conflicts with --lab)
        if self.no_cpu_split && self.lab.is_none() {
            anyhow::bail!("--no-cpu-split is for a lab replay (--lab): a remote replay places nothing on the other hosts' CPUs");
        }
        let target = match (self.lab, self.server) {
            (Some(name), _) => Target::Lab {
                name,
                keep: self.keep_lab,
            },
            (None, Some(server)) => Target::Remote {
                server,
                server_control: self
                    .server_control
                    .context("--server needs --server-control")?,
                netemu: self.netemu.context("--server needs --netemu")?,
                pki_dir: self.pki.context("--server needs --pki")?,
                capture: match (self.vantage, self.capture_iface) {
                    (VantageArg::Server, None) => RemoteCapture::Server,
                    (VantageArg::Client, Some(iface)) => RemoteCapture::Client { iface },
                    (VantageArg::Client, None) => anyhow::bail!(
                        "--vantage client needs --capture-iface IF (the local interface on the path to the server)"
                    ),
                    (VantageArg::Server, Some(_)) => anyhow::bail!(
                        "--capture-iface captures on this (the client) host: add --vantage client, or leave it out to capture at the server (the default)"
                    ),
                },
                client_addrs: {
                    if self.client_addr.is_empty() && self.agents.is_empty() {
                        anyhow::bail!("--server needs --client-addr (or --agents)");
                    }
                    self.client_addr
                },
            },
            (None, None) => anyhow::bail!("give --lab NAME or --server ADDR"),
        };
        Ok(ReplayOptions {
            input: self.input,
            output: self.output,
            target,
            stack: self.stack,
            queue: self.queue.unwrap_or_default(),
            request_timing: self.request_timing,
            unestimated: self.unestimated,
            select: self.select,
            limit: self.limit,
            time_scale: self.time_scale,
            seed: self.seed,
            server_port: self.server_port,
            keep_capture: self.keep_capture,
            cpu_split: !self.no_cpu_split,
            agents: self.agents,
            agent_timeout: std::time::Duration::from_secs(self.agent_timeout),
            emulator: self.emulator,
            kernel_pipes: self.kernel_pipes,
            lan_rtt: self.lan_rtt,
            exe,
        })
    }
}

/// What this host must have for the replay `opts` describes, checked before any role is
/// started or dialled (a remote replay used to wait 15 s for its emulator and then blame it,
/// and a `--keep-capture` file failed after the whole replay, losing it).
fn check_here(opts: &ReplayOptions) -> anyhow::Result<()> {
    if let Some(k) = opts
        .keep_capture
        .as_ref()
        .filter(|k| k.exists() && !k.is_dir())
    {
        anyhow::bail!(
            "--keep-capture {}: not a directory (it names the directory the capture files are kept in)",
            k.display()
        );
    }
    if let Target::Remote {
        client_addrs,
        capture,
        ..
    } = &opts.target
    {
        // this host opens the connections from them
        mimic_replay::agent::check_local(client_addrs).map_err(anyhow::Error::msg)?;
        if let RemoteCapture::Client { iface } = capture {
            if mimic_netemu::netns::interface_index(iface).is_none() {
                anyhow::bail!(
                    "--capture-iface {iface}: no such network interface on this host (`ip link` lists them)"
                );
            }
        }
    }
    Ok(())
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    // SAFETY: geteuid has no preconditions.
    if a.lab.is_some() && unsafe { libc::geteuid() } != 0 {
        anyhow::bail!(
            "a lab replay needs root (it runs processes in network namespaces); run it with sudo"
        );
    }
    let json = a.json;
    let opts = a.into_spec(std::env::current_exe()?)?;
    check_here(&opts)?;
    let summary = match replay_with_progress(&opts) {
        Ok(s) => s,
        Err(ReplayError::Interrupted) => {
            eprintln!(
                "mimic: replay interrupted; its processes are stopped and nothing was written"
            );
            return Ok(ExitCode::from(130));
        }
        Err(e) => return Err(e.into()),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print_summary(&summary);
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs a replay with a progress bar (connections done / failed / in flight) and Ctrl-C
/// stopping it cleanly.
pub fn replay_with_progress(opts: &ReplayOptions) -> Result<ReplaySummary, ReplayError> {
    let stop = Arc::new(AtomicBool::new(false));
    let _ = signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone());
    let _ = signal_hook::flag::register(signal_hook::consts::SIGTERM, stop.clone());
    let progress = Arc::new(Progress::default());
    let pb = crate::progress::count(0, "replay");
    let ticker = {
        let (progress, pb) = (progress.clone(), pb.clone());
        crate::progress::Ticker::spawn(std::time::Duration::from_millis(200), move || {
            let stage = progress.stage.lock().map(|s| s.clone()).unwrap_or_default();
            pb.set_length(progress.total.load(Ordering::Relaxed));
            pb.set_position(
                progress.done.load(Ordering::Relaxed) + progress.failed.load(Ordering::Relaxed),
            );
            pb.set_message(format!(
                "{stage}: {} done, {} failed, {} in flight",
                progress.done.load(Ordering::Relaxed),
                progress.failed.load(Ordering::Relaxed),
                progress.in_flight.load(Ordering::Relaxed)
            ));
        })
    };
    let r = orchestrate::run(opts, &progress, &stop);
    ticker.stop();
    pb.finish_and_clear();
    r
}

/// What kernel pipes left out of delayed-ACK shaping, as a suffix of the pipes line.
fn delack_note(k: &mimic_replay::orchestrate::kernel::KernelInstall) -> String {
    if k.delack_left_out > 0 {
        format!(
            "; WITHOUT delayed-ACK shaping for {} connections",
            k.delack_left_out
        )
    } else {
        String::new()
    }
}

fn print_summary(s: &ReplaySummary) {
    println!(
        "replayed {} connections{} in {:.1} s (at most {} at once): {} ok, {} failed{}",
        s.connections,
        s.lab
            .as_ref()
            .map(|l| format!(" in lab {l}"))
            .unwrap_or_default(),
        s.duration_s,
        s.max_concurrent,
        s.ok,
        s.failed,
        if s.failures.is_empty() {
            String::new()
        } else {
            format!(
                " ({})",
                s.failures
                    .iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    );
    println!("{}", s.rate_sources.describe());
    println!(
        "LAN round trip taken off the pipes: {:.3} ms ({}){}",
        s.lan_rtt.us as f64 / 1000.0,
        s.lan_rtt.source,
        if s.lan_rtt.short_paths > 0 {
            format!(
                "; {} connections' paths shorter than it keep an RTT above the original's",
                s.lan_rtt.short_paths
            )
        } else {
            String::new()
        }
    );
    if let Some(st) = &s.stack {
        println!("server stack: {st}");
    }
    println!(
        "timing: connections started p50 {} µs / p99 {} µs late ({} more than 1 ms); server delays kept to p50 {} µs / p99 {} µs late ({} more than 1 ms)",
        s.start_lateness_us[0],
        s.start_lateness_us[1],
        s.starts_over_1ms,
        s.server.response_delay_error.p50_us,
        s.server.response_delay_error.p99_us,
        s.server.response_delay_error.over_1ms + s.server.query_delay_error.over_1ms
    );
    println!("{}", s.timing.describe());
    if s.timing.distorted() {
        eprintln!("mimic: warning: {}", s.timing.describe());
    }
    for a in &s.agents {
        println!(
            "agent {} ({}, {} addresses): {} connections, {} ok, {} failed; started p50 {} µs / p99 {} µs / max {} µs late; start instant {:.0} ms ahead",
            a.agent,
            a.host,
            a.client_addrs,
            a.connections,
            a.ok,
            a.failed,
            a.start_lateness_us[0],
            a.start_lateness_us[1],
            a.start_lateness_us[2],
            a.start_lead_ms
        );
    }
    if let Some(k) = s
        .kernel_pipes
        .as_ref()
        .filter(|k| k.mode == "per-connection")
    {
        println!(
            "pipes: {} {} pipes on {}, per connection: {} install batches (p50 {:.1} / p99 {:.1} / max {:.1} ms, lead {:.0} ms), {} removal batches (p50 {:.1} / p99 {:.1} ms, lag p99 {:.0} ms), at most {} connections at once, {} installed after their SYN was due ({} SYNs held for them, at most {:.1} ms late){}{}",
            k.pipes,
            k.backend,
            k.router,
            k.batches,
            k.install_batch_ms[0],
            k.install_batch_ms[1],
            k.batch_max_ms,
            k.lead_ms,
            k.remove_batches,
            k.remove_batch_ms[0],
            k.remove_batch_ms[1],
            k.remove_lag_ms[0],
            k.max_installed,
            k.late_installs,
            k.syn_waits,
            k.syn_wait_max_ms,
            if k.remove_errors > 0 {
                format!("; {} removals failed (torn down at the end)", k.remove_errors)
            } else {
                String::new()
            },
            delack_note(k)
        );
    } else if let Some(k) = &s.kernel_pipes {
        println!(
            "pipes: {} {} pipes on {}, installed in {:.2} s ({} commands, {} execs){}",
            k.pipes,
            k.backend,
            k.router,
            k.install_s,
            k.commands,
            k.execs,
            delack_note(k)
        );
    }
    if let Some(c) = &s.cpu_split {
        println!(
            "cpus: network emulator datapath on CPU {}, timer threads on {}",
            c.datapath,
            mimic_core::cpu::format_list(&c.timers)
        );
    }
    if s.missing > 0 {
        println!(
            "warning: {} replayed connections are missing from the capture",
            s.missing
        );
    }
    println!(
        "analysis: {} connections ({} complete), {} exchanges; wrote {}",
        s.analysis.connections, s.analysis.complete, s.analysis.exchanges, s.output
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(spec: &ReplayOptions) -> ReplayOptions {
        match crate::cmd::parse_role_args(spec.to_args()) {
            crate::Command::Replay(a) => a.into_spec(spec.exe.clone()).unwrap(),
            _ => panic!("{:?} is not `mimic replay`", spec.to_args()),
        }
    }

    /// The spec's command line, parsed by the real parser and mapped back, is the spec.
    #[test]
    fn spec_survives_its_command_line() {
        let remote = ReplayOptions {
            input: "flows.db".into(),
            output: "out/replay.db".into(),
            target: Target::Remote {
                server: "10.0.0.1:8080".parse().unwrap(),
                server_control: "tcp:10.9.0.1:7001".parse().unwrap(),
                netemu: "tcp:10.9.0.2:7002".parse().unwrap(),
                pki_dir: "/etc/mimic/pki".into(),
                capture: RemoteCapture::Client {
                    iface: "eth3".into(),
                },
                client_addrs: vec!["10.1.0.1".parse().unwrap(), "10.1.0.2".parse().unwrap()],
            },
            // --stack is refused with --server: see the lab case below
            stack: None,
            queue: QueueOverride {
                up: Some(7),
                down: Some(64),
            },
            request_timing: RequestTiming::Think,
            unestimated: Unestimated::Unshaped,
            select: Select::All,
            limit: Some(500),
            time_scale: 2.5,
            seed: 42,
            server_port: 8080,
            keep_capture: Some("caps".into()),
            // --no-cpu-split is the lab's (below)
            cpu_split: true,
            agents: Vec::new(),
            agent_timeout: mimic_replay::agent::DEFAULT_LIMIT,
            emulator: Emulator::Netem,
            kernel_pipes: spec::PipeMode::PerConnection,
            lan_rtt: spec::LanRtt::Fixed(1500),
            exe: "/usr/bin/mimic".into(),
        };
        assert_eq!(round_trip(&remote), remote);
        // the default vantage: captured by serve at the server host
        let mut at_server = remote.clone();
        if let Target::Remote { capture, .. } = &mut at_server.target {
            *capture = RemoteCapture::Server;
        }
        assert!(!at_server
            .to_args()
            .iter()
            .any(|a| a == "--vantage" || a == "--capture-iface"));
        assert_eq!(round_trip(&at_server), at_server);
        let mut with_agents = remote.clone();
        if let Target::Remote { client_addrs, .. } = &mut with_agents.target {
            client_addrs.clear();
        }
        with_agents.agents = vec![
            "10.2.0.1:7300".parse().unwrap(),
            "unix:/run/a2.sock".parse().unwrap(),
        ];
        assert_eq!(round_trip(&with_agents), with_agents);
        with_agents.agent_timeout = std::time::Duration::from_secs(45);
        assert_eq!(round_trip(&with_agents), with_agents);

        let mut lab = remote.clone();
        lab.target = Target::Lab {
            name: "t9".into(),
            keep: true,
        };
        lab.cpu_split = false;
        lab.stack = Some("initcwnd=10,cc=cubic,sack=0,rto_min=50ms".parse().unwrap());
        lab.queue = QueueOverride {
            up: None,
            down: Some(100),
        };
        lab.unestimated = Unestimated::PooledClass;
        lab.emulator = Emulator::Dummynet;
        assert_eq!(round_trip(&lab), lab);
        lab.agents = vec!["cli".parse().unwrap(), "cli2".parse().unwrap()];
        assert_eq!(round_trip(&lab), lab);
        let defaults = ReplayOptions::new(
            "a.db".into(),
            "b.db".into(),
            Target::Lab {
                name: "t".into(),
                keep: false,
            },
            "/usr/bin/mimic".into(),
        );
        assert_eq!(round_trip(&defaults), defaults);
    }
}
