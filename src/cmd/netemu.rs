//! `mimic netemu`: run the per-flow emulator in the foreground, talk to a running one, or
//! render a pipe table for tc/netem or ipfw/dummynet.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};

use anyhow::{bail, Context};
use clap::Subcommand;
use mimic_netemu::control::{self, Client, ControlAddr, RunStats};
use mimic_netemu::datapath::{self, Datapath, DatapathConfig, Job, Waker};
use mimic_netemu::engine::{Engine, Limits, PipeCounters, PipeOwner, PipeTable};
use mimic_netemu::lab::{self, LabInfo};
use mimic_netemu::render::{self, Backend, RenderOptions};
use mimic_netemu::PipeConfig;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args, Clone)]
struct Tables {
    /// Pipe table (TOML: [default], [[prefix]], [[flow]]; see netemu/README.md).
    #[arg(long)]
    pipes: Option<PathBuf>,
    /// Default pipe for each direction, e.g. "delay=20ms,rate=10mbit,loss=1%,queue=50".
    #[arg(long)]
    default: Option<PipeConfig>,
    /// Default pipe for client->server only (with --default-down).
    #[arg(long, conflicts_with = "default", requires = "default_down")]
    default_up: Option<PipeConfig>,
    /// Default pipe for server->client only (with --default-up).
    #[arg(long, conflicts_with = "default", requires = "default_up")]
    default_down: Option<PipeConfig>,
}

impl Tables {
    fn load(&self) -> anyhow::Result<PipeTable> {
        let mut t = match &self.pipes {
            Some(p) => mimic_netemu::table::load(p)?,
            None => PipeTable::default(),
        };
        if let Some(d) = &self.default {
            t.default = Some((d.clone(), d.clone()));
        }
        if let (Some(u), Some(d)) = (&self.default_up, &self.default_down) {
            t.default = Some((u.clone(), d.clone()));
        }
        Ok(t)
    }
}

#[derive(clap::Args, Clone)]
struct Connect {
    /// Lab whose emulator to reach (its default control socket and token).
    #[arg(long)]
    lab: Option<String>,
    /// Control address: unix:PATH or tcp:HOST:PORT.
    #[arg(long)]
    control: Option<ControlAddr>,
    /// File holding the control token.
    #[arg(long)]
    token_file: Option<PathBuf>,
}

impl Connect {
    fn resolve(&self) -> anyhow::Result<(ControlAddr, PathBuf)> {
        let info = self.lab.as_deref().map(LabInfo::for_name).transpose()?;
        let addr = match (&self.control, &info) {
            (Some(a), _) => a.clone(),
            (None, Some(i)) => i.control.parse().map_err(anyhow::Error::msg)?,
            (None, None) => bail!("give --lab NAME or --control ADDR"),
        };
        let token = match (&self.token_file, &info) {
            (Some(t), _) => t.clone(),
            (None, Some(i)) => i.token_file.clone(),
            (None, None) => bail!("give --token-file FILE (or --lab NAME)"),
        };
        Ok((addr, token))
    }
    fn client(&self) -> anyhow::Result<Client> {
        let (addr, token_file) = self.resolve()?;
        let token = lab::read_token(&token_file)?;
        Ok(Client::connect(&addr, &token)?)
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the emulator in the foreground, bridging the lab's emu interfaces (or two given
    /// interfaces); stops on SIGINT/SIGTERM or a control `shutdown` and prints its counters.
    Run {
        #[command(flatten)]
        connect: Connect,
        /// Client-side interface (instead of --lab).
        #[arg(long, conflicts_with = "lab", requires = "server_if")]
        client_if: Option<String>,
        /// Server-side interface (instead of --lab).
        #[arg(long, conflicts_with = "lab", requires = "client_if")]
        server_if: Option<String>,
        #[command(flatten)]
        tables: Tables,
        /// Busy-wait this many microseconds before each departure instead of sleeping.
        #[arg(long, default_value_t = 100)]
        spin_us: u64,
        /// SCHED_FIFO priority of the datapath thread (0 = normal scheduling).
        #[arg(long, default_value_t = 10)]
        rt_priority: i32,
        /// Pin the datapath thread to this CPU (keep the emulated hosts' timer threads off
        /// it: `mimic serve --timer-cpus`); `mimic replay --lab` does this by itself.
        #[arg(long, value_name = "N")]
        cpu: Option<usize>,
        /// Frame buffers for packets inside pipes (2 KiB each).
        #[arg(long, default_value_t = 65_536)]
        buffers: u32,
        /// Most flow rules at once.
        #[arg(long, default_value_t = 262_144)]
        max_flows: usize,
        /// Base of the seeds of pipes that name none.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Counters at exit as JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Serve Prometheus metrics at http://ADDR/metrics (bound in the namespace the
        /// command starts in, like --control), e.g. 127.0.0.1:9465.
        #[arg(long, value_name = "ADDR")]
        metrics: Option<std::net::SocketAddr>,
    },
    /// Print the per-pipe counters of a running emulator.
    Counters {
        #[command(flatten)]
        connect: Connect,
        #[arg(long)]
        json: bool,
    },
    /// Stop a running emulator.
    Shutdown {
        #[command(flatten)]
        connect: Connect,
    },
    /// Turn a pipe table into tc (htb + netem + u32) or ipfw (dummynet) commands.
    Render {
        /// netem or dummynet.
        #[arg(long)]
        backend: Backend,
        #[command(flatten)]
        tables: Tables,
        /// Interface towards the clients (downstream pipes shape its egress).
        #[arg(long, default_value = "eth0")]
        client_if: String,
        /// Interface towards the servers (upstream pipes shape its egress).
        #[arg(long, default_value = "eth1")]
        server_if: String,
        /// Run the commands (tc or ipfw must exist; netem needs a kernel with netem).
        #[arg(long)]
        apply: bool,
    },
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    match args.cmd {
        Cmd::Run {
            connect,
            client_if,
            server_if,
            tables,
            spin_us,
            rt_priority,
            cpu,
            buffers,
            max_flows,
            seed,
            json,
            metrics,
        } => {
            let table = tables.load()?;
            run_emulator(
                connect,
                client_if,
                server_if,
                table,
                spin_us,
                rt_priority,
                cpu,
                buffers,
                max_flows,
                seed,
                json,
                metrics,
            )
        }
        Cmd::Counters { connect, json } => {
            let mut c = connect.client()?;
            let rows = c.counters()?;
            let stats = c.stats()?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(
                        &serde_json::json!({"pipes": rows, "stats": stats})
                    )?
                );
            } else {
                print_counters(&rows, &stats);
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Shutdown { connect } => {
            connect.client()?.shutdown()?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Render {
            backend,
            tables,
            client_if,
            server_if,
            apply,
        } => {
            let table = tables.load()?;
            let opts = RenderOptions {
                client_if,
                server_if,
            };
            let script = render::render(backend, &table, &opts)?;
            if apply {
                render::apply(backend, &script)?;
                eprintln!("mimic: applied {} commands", script.commands.len());
            } else {
                print!("{}", script.to_shell());
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn run_emulator(
    connect: Connect,
    client_if: Option<String>,
    server_if: Option<String>,
    table: PipeTable,
    spin_us: u64,
    rt_priority: i32,
    cpu: Option<usize>,
    buffers: u32,
    max_flows: usize,
    seed: u64,
    json: bool,
    metrics: Option<std::net::SocketAddr>,
) -> anyhow::Result<ExitCode> {
    let info = connect.lab.as_deref().map(LabInfo::for_name).transpose()?;
    let (cif, sif) = match (&info, client_if, server_if) {
        (Some(i), _, _) => (i.emu_cli_if.clone(), i.emu_srv_if.clone()),
        (None, Some(c), Some(s)) => (c, s),
        _ => bail!("give --lab NAME, or --client-if and --server-if"),
    };
    if let Some(i) = &info {
        if !mimic_netemu::netns::exists(&i.ns_emu) {
            bail!("lab {} is not up (run `mimic lab up {}`)", i.name, i.name);
        }
    }
    let (addr, token_file) = connect.resolve()?;
    let token = lab::read_token(&token_file)?;
    let engine: Engine<u32> = Engine::new(
        &table,
        Limits {
            max_flow_rules: max_flows,
            ..Limits::default()
        },
        seed,
    )?;
    // The listener is bound in the namespace we start in (so tcp: is reachable from there);
    // then the process enters the lab's emu namespace for the datapath.
    let listener = control::Listener::bind(&addr)
        .with_context(|| format!("binding control channel {addr}"))?;
    let metrics = metrics.map(mimic_metrics::bind).transpose()?;
    if let Some(i) = &info {
        if !mimic_netemu::netns::exists(&i.ns_emu) {
            bail!("lab {} is not up (run `mimic lab up {}`)", i.name, i.name);
        }
        mimic_netemu::netns::enter(&i.ns_emu)?;
    }
    let signal_fd = datapath::block_stop_signals().context("blocking SIGINT/SIGTERM")?;
    let dp = Datapath::open(DatapathConfig {
        client_if: cif.clone(),
        server_if: sif.clone(),
        buffers,
        spin_ns: spin_us * 1_000,
        rt_priority: (rt_priority > 0).then_some(rt_priority),
        cpu,
        ..Default::default()
    })
    .with_context(|| format!("opening {cif} and {sif}"))?;
    let pid_file = info.as_ref().map(|i| i.runtime_dir.join("netemu.pid"));
    if let Some(p) = &pid_file {
        std::fs::write(p, format!("{}\n", std::process::id()))
            .with_context(|| format!("writing {}", p.display()))?;
    }
    let (jtx, jrx) = mpsc::channel::<Job>();
    let waker = Waker::new()?;
    let stop = Arc::new(AtomicBool::new(false));
    if let Some(m) = metrics {
        let (jobs, waker) = (jtx.clone(), waker);
        let at = m.serve(mimic_metrics::registry_with(move |f| {
            if let Some(s) = run_stats(&jobs, waker) {
                netemu_metrics(&s, f);
            }
        }))?;
        eprintln!("mimic: netemu metrics at http://{at}/metrics");
    }
    let ctl = {
        let stop = stop.clone();
        std::thread::Builder::new()
            .name("netemu-control".into())
            .spawn(move || control::serve(listener, token, jtx, waker, stop))?
    };
    eprintln!("mimic: netemu bridging {cif} <-> {sif}; control {addr}");
    let dpt = std::thread::Builder::new()
        .name("netemu-datapath".into())
        .spawn(move || dp.run(engine, jrx, waker, Some(signal_fd)))?;
    let fin = dpt
        .join()
        .map_err(|_| anyhow::anyhow!("the datapath thread panicked"))?;
    stop.store(true, Ordering::Relaxed);
    let _ = ctl.join();
    if let Some(p) = &pid_file {
        let _ = std::fs::remove_file(p);
    }
    let rows = fin.engine.counters();
    let stats = RunStats {
        engine: fin.engine.stats(),
        datapath: fin.stats,
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({"pipes": rows, "stats": stats}))?
        );
    } else {
        print_counters(&rows, &stats);
    }
    Ok(ExitCode::SUCCESS)
}

/// The engine's and datapath's counters now, read on the datapath thread between packets
/// (as `mimic netemu counters` does); None once the datapath has stopped.
fn run_stats(jobs: &mpsc::Sender<Job>, waker: Waker) -> Option<RunStats> {
    let (tx, rx) = mpsc::sync_channel::<RunStats>(1);
    let job: Job = Box::new(move |ctx| {
        let mut d = ctx.stats.clone();
        d.finish();
        let _ = tx.send(RunStats {
            engine: ctx.engine.stats(),
            datapath: d,
        });
    });
    jobs.send(job).ok()?;
    waker.wake();
    rx.recv_timeout(std::time::Duration::from_secs(5)).ok()
}

/// The `/metrics` families of `netemu run`, from the same counters its exit summary prints.
fn netemu_metrics(s: &RunStats, f: &mut mimic_metrics::Families) {
    use mimic_metrics::Unit;
    let (e, d) = (&s.engine, &s.datapath);
    f.counter_by(
        "mimic_netemu_shaped_packets",
        "Packets that entered a pipe (not dropped by it), by direction (up = client to server), removed pipes included.",
        None,
        "direction",
        &[("up", e.up.packets), ("down", e.down.packets)],
    );
    f.counter_by(
        "mimic_netemu_shaped",
        "IP bytes of the packets that entered a pipe, by direction.",
        Some(Unit::Bytes),
        "direction",
        &[("up", e.up.bytes), ("down", e.down.bytes)],
    );
    let lbl = |dir: &str, cause: &str| {
        vec![
            ("direction".to_string(), dir.to_string()),
            ("cause".to_string(), cause.to_string()),
        ]
    };
    f.counter_labeled(
        "mimic_netemu_dropped_packets",
        "Packets a pipe dropped, by direction and cause (queue = the pipe's queue was full, loss = its loss model).",
        None,
        vec![
            (lbl("up", "queue"), e.up.queue_drops),
            (lbl("up", "loss"), e.up.loss_drops),
            (lbl("down", "queue"), e.down.queue_drops),
            (lbl("down", "loss"), e.down.loss_drops),
        ],
    );
    f.gauge("mimic_netemu_pipes", "Pipes in service now.", None, e.pipes);
    f.gauge(
        "mimic_netemu_flow_rules",
        "Per-connection flow rules now.",
        None,
        e.flow_rules,
    );
    f.gauge(
        "mimic_netemu_scheduled_packets",
        "Packets waiting in the timing wheel now.",
        None,
        e.scheduled,
    );
    f.counter_by(
        "mimic_netemu_received_frames",
        "Frames the datapath received, by side (client = the client-side interface).",
        None,
        "side",
        &[("client", d.rx_frames[0]), ("server", d.rx_frames[1])],
    );
    f.counter_by(
        "mimic_netemu_sent_frames",
        "Frames the datapath sent out of each side.",
        None,
        "side",
        &[("client", d.tx_frames[0]), ("server", d.tx_frames[1])],
    );
    f.counter_by(
        "mimic_netemu_unshaped_frames",
        "Frames forwarded without a pipe, by reason (not_ip: ARP and the like; unmatched: no rule or default).",
        None,
        "reason",
        &[("not_ip", e.not_ip), ("unmatched", e.unmatched)],
    );
    f.counter_by(
        "mimic_netemu_datapath_dropped_frames",
        "Frames the datapath itself lost, by cause (no_buffer: no frame buffer free; ring: receive ring overrun; oversize: larger than a ring slot; tx_error: the send failed).",
        None,
        "cause",
        &[
            ("no_buffer", d.no_buffer),
            ("ring", d.ring_drops),
            ("oversize", d.oversize),
            ("tx_error", d.tx_errors),
        ],
    );
    f.counter(
        "mimic_netemu_thinned_acks",
        "Client ACKs the delayed-ACK shaping discarded.",
        None,
        d.discarded,
    );
}

fn print_counters(rows: &[PipeCounters], stats: &RunStats) {
    println!(
        "{:<44} {:>4} {:>10} {:>12} {:>8} {:>8} {:>6}  config",
        "pipe", "dir", "packets", "bytes", "q_drops", "loss", "max_q"
    );
    for r in rows {
        let owner = match &r.owner {
            PipeOwner::Default => "default".to_string(),
            PipeOwner::Prefix {
                index,
                client,
                server,
            } => format!("prefix#{index} {client}->{server}"),
            PipeOwner::Flow {
                rule,
                client,
                server,
            } => format!("flow#{rule} {client}->{server}"),
        };
        let dir = match r.direction {
            mimic_netemu::Direction::Up => "up",
            mimic_netemu::Direction::Down => "down",
        };
        let c = &r.counters;
        println!(
            "{:<44} {:>4} {:>10} {:>12} {:>8} {:>8} {:>6}  {}",
            owner,
            dir,
            c.packets,
            c.bytes,
            c.queue_drops,
            c.loss_drops,
            c.max_queue_packets,
            r.config
        );
    }
    let d = &stats.datapath;
    let e = &stats.engine;
    for (dir, t) in [("up", &e.up), ("down", &e.down)] {
        println!(
            "total {dir:<4}: packets {} bytes {} queue drops {} loss drops {} (every pipe of this direction, removed ones included)",
            t.packets, t.bytes, t.queue_drops, t.loss_drops
        );
    }
    println!(
        "datapath: rx {}/{} tx {}/{} (client/server side), unshaped {} (not IP {}, unmatched {}), no-buffer drops {}, ring drops {}, tx errors {}, thinned ACKs {}",
        d.rx_frames[0], d.rx_frames[1], d.tx_frames[0], d.tx_frames[1], d.forwarded_unshaped, e.not_ip, e.unmatched, d.no_buffer, d.ring_drops, d.tx_errors, d.discarded
    );
    println!(
        "departure lateness: p50 {:.1}us p99 {:.1}us max {:.1}us; flow rules {}, pipes {}",
        d.late_p50_ns as f64 / 1e3,
        d.late_p99_ns as f64 / 1e3,
        d.late_max_ns as f64 / 1e3,
        e.flow_rules,
        e.pipes
    );
}
