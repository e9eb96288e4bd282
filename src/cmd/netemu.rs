//! `mimic netemu`: run the per-flow emulator in the foreground, talk to a running one, or
//! render a pipe table for tc/netem or ipfw/dummynet.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};

use anyhow::{bail, Context};
use clap::Subcommand;
use mimic_netemu::control::{self, Client, ControlAddr, ControllerTls, RoleTls, RunStats};
use mimic_netemu::datapath::{self, Datapath, DatapathConfig, Job, SpinRule, Waker};
use mimic_netemu::engine::{Engine, Limits, PipeCounters, PipeOwner, PipeTable};
use mimic_netemu::lab::{self, LabInfo};
use mimic_netemu::render::{self, AckPolicies, ApplyOptions, Backend, Leaf, RenderOptions};
use mimic_netemu::spec::{self, Bridge, DefaultPipes, EmulatorSpec};
use mimic_netemu::PipeConfig;
use mimic_replay::orchestrate::{self, QueueOverride};
use mimic_replay::workload::Select;

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
    #[arg(long, value_parser = PipeArg)]
    default: Option<PipeConfig>,
    /// Default pipe for client->server only (with --default-down).
    #[arg(long, value_parser = PipeArg, conflicts_with = "default", requires = "default_down")]
    default_up: Option<PipeConfig>,
    /// Default pipe for server->client only (with --default-up).
    #[arg(long, value_parser = PipeArg, conflicts_with = "default", requires = "default_up")]
    default_down: Option<PipeConfig>,
}

/// The parser of a pipe spec on the command line. clap's own would quote the whole value in
/// its message, ahead of the spec's error quoting it again: here both are bounded
/// (`units::quote`), so a runaway variable gives a line, not three copies of itself.
#[derive(Clone)]
struct PipeArg;

impl clap::builder::TypedValueParser for PipeArg {
    type Value = PipeConfig;
    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<PipeConfig, clap::Error> {
        let arg = arg.map_or_else(|| "...".to_string(), |a| a.to_string());
        let fail = |msg: String| {
            clap::Error::raw(clap::error::ErrorKind::ValueValidation, msg).format(&mut cmd.clone())
        };
        let s = value
            .to_str()
            .ok_or_else(|| fail(format!("invalid value for '{arg}': it is not UTF-8")))?;
        s.parse().map_err(|e| {
            fail(format!(
                "invalid value '{}' for '{arg}': {e}",
                mimic_netemu::units::quote(s)
            ))
        })
    }
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
    /// Lab whose emulator to reach (its default control socket and PKI).
    #[arg(long)]
    lab: Option<String>,
    /// Control address: unix:PATH or tcp:HOST:PORT.
    #[arg(long)]
    control: Option<ControlAddr>,
    /// Directory of the control channel's certificates (`mimic pki init`): ca.crt, and
    /// netemu.crt/.key for `run`, controller.crt/.key for the commands that talk to it.
    #[arg(long, value_name = "DIR")]
    pki: Option<PathBuf>,
}

impl Connect {
    fn resolve(&self) -> anyhow::Result<(ControlAddr, PathBuf)> {
        let info = self.lab.as_deref().map(LabInfo::for_name).transpose()?;
        let addr = match (&self.control, &info) {
            (Some(a), _) => a.clone(),
            (None, Some(i)) => i.control.parse().map_err(anyhow::Error::msg)?,
            (None, None) => bail!("give --lab NAME or --control ADDR"),
        };
        let pki = match (&self.pki, &info) {
            (Some(t), _) => t.clone(),
            (None, Some(i)) => i.pki_dir.clone(),
            (None, None) => bail!("give --pki DIR (or --lab NAME)"),
        };
        Ok((addr, pki))
    }
    fn client(&self) -> anyhow::Result<Client> {
        let (addr, pki) = self.resolve()?;
        let tls = ControllerTls::load(&pki)?;
        Ok(Client::connect(&addr, &tls)?)
    }
}

/// `mimic netemu run`'s flags; [`RunArgs::into_spec`] maps them to the role's
/// [`EmulatorSpec`], which owns its command line.
#[derive(clap::Args)]
pub struct RunArgs {
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
    #[arg(long, default_value_t = spec::DEFAULT_SPIN_US,
          value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    spin_us: u64,
    /// What limits the busy-waiting: `fixed`, at most half of every 10 ms, for a router that
    /// only forwards; `load`, less as the rest of the machine gets busy, for a datapath
    /// sharing its machine with emulated clients and servers (`mimic replay --lab` starts its
    /// router so); `always`, busy-polling without a break at normal priority, for a datapath
    /// given a CPU of its own (`--cpu N`), which it then keeps fully busy.
    #[arg(long, default_value_t = SpinRule::ROUTER, value_name = "fixed|load|always")]
    spin_rule: SpinRule,
    /// SCHED_FIFO priority of the datapath thread (0 = normal scheduling).
    #[arg(long, default_value_t = spec::DEFAULT_RT_PRIORITY,
          value_parser = clap::value_parser!(i32).range(0..=99))]
    rt_priority: i32,
    /// Pin the datapath thread to this CPU (keep the emulated hosts' timer threads off
    /// it: `mimic serve --timer-cpus`); `mimic replay --lab` does this by itself.
    #[arg(long, value_name = "N", value_parser = online_cpu)]
    cpu: Option<usize>,
    /// Frame buffers for packets inside pipes (2 KiB each).
    #[arg(long, default_value_t = spec::DEFAULT_BUFFERS,
          value_parser = clap::value_parser!(u32).range(1..))]
    buffers: u32,
    /// Most flow rules at once.
    #[arg(long, default_value_t = spec::DEFAULT_MAX_FLOWS, value_parser = at_least_one)]
    max_flows: usize,
    /// Base of the seeds of pipes that name none.
    #[arg(long, default_value_t = spec::DEFAULT_SEED)]
    seed: u64,
    /// Counters at exit as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics (bound in the namespace the
    /// command starts in, like --control), e.g. 127.0.0.1:9465.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
    /// What carries the pipes: `mimic` (mimic's own datapath) or `netem` (no datapath: the
    /// kernel's htb + netem, installed with `tc -batch` per connection as the controller asks
    /// over the control channel, e.g. `mimic replay --emulator netem --netemu ADDR`;
    /// needs --client-if/--server-if and a kernel with sch_netem).
    #[arg(long, default_value = "mimic", value_name = "mimic|netem")]
    backend: spec::RouterBackend,
    /// --backend netem: replace a root qdisc mimic did not install on --client-if/--server-if
    /// (without it such a qdisc is an error; mimic's own is always replaced).
    #[arg(long)]
    force: bool,
}

impl RunArgs {
    pub fn into_spec(self) -> anyhow::Result<EmulatorSpec> {
        let bridge = match (self.connect.lab, self.client_if, self.server_if) {
            (Some(name), _, _) => Bridge::Lab(name),
            (None, Some(client_if), Some(server_if)) => {
                // frames would go back out where they came in, and a kernel router's second
                // root qdisc would replace its first
                if client_if == server_if {
                    bail!("--client-if and --server-if are both {client_if}: the emulator sits between two interfaces, one towards the clients and one towards the servers; name two");
                }
                Bridge::Interfaces {
                    client_if,
                    server_if,
                }
            }
            _ => bail!("give --lab NAME, or --client-if and --server-if"),
        };
        let t = self.tables;
        let default = match (t.default, t.default_up, t.default_down) {
            (Some(d), _, _) => DefaultPipes::Both(d),
            (None, Some(up), Some(down)) => DefaultPipes::Split { up, down },
            _ => DefaultPipes::None,
        };
        Ok(EmulatorSpec {
            bridge,
            control: self.connect.control,
            pki: self.connect.pki,
            pipes: t.pipes,
            default,
            spin_us: self.spin_us,
            spin_rule: self.spin_rule,
            rt_priority: self.rt_priority,
            cpu: self.cpu,
            buffers: self.buffers,
            max_flows: self.max_flows,
            seed: self.seed,
            json: self.json,
            metrics: self.metrics,
            backend: self.backend,
            force: self.force,
        })
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the emulator in the foreground, bridging the lab's emu interfaces (or two given
    /// interfaces); stops on SIGINT/SIGTERM or a control `shutdown` and prints its counters.
    Run(RunArgs),
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
    /// Turn a pipe table, or the per-connection pipes a replay of a flows.db would register,
    /// into tc (htb + netem + hashed u32) or ipfw (dummynet) commands; print, apply or tear
    /// them down.
    Render(RenderArgs),
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    match args.cmd {
        Cmd::Run(r) => run_emulator(r.into_spec()?),
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
        Cmd::Render(r) => run_render(r),
    }
}

#[derive(clap::Args)]
struct RenderArgs {
    /// netem or dummynet (or by the tool each is installed with: tc, ipfw).
    #[arg(long, value_name = "netem|dummynet")]
    backend: Backend,
    #[command(flatten)]
    tables: Tables,
    /// Add the per-connection pipes a replay of this flows.db would register (the same
    /// mapping as `mimic replay`: one-way delay, rate, random loss, queue by rate class),
    /// keyed by the client address and port each connection gets in the replay.
    #[arg(long, value_name = "FLOWS_DB")]
    from: Option<PathBuf>,
    /// With --from: the replay's client addresses (repeatable; default the lab's pool,
    /// 198.19.0.1 and up, as `mimic replay --lab` uses).
    #[arg(long, value_name = "IP", requires = "from", value_parser = super::client_addr)]
    client_addr: Vec<Ipv4Addr>,
    /// With --from: the server's address and port in the replay (default the lab's,
    /// 198.18.0.1:80).
    #[arg(long, value_name = "ADDR", requires = "from", value_parser = super::server_addr)]
    server: Option<SocketAddr>,
    /// With --from: which connections (complete or all), as `mimic replay --select`.
    #[arg(long, default_value = "complete", value_parser = parse_select, requires = "from")]
    select: Select,
    /// With --from: only the first N connections, as `mimic replay --limit`.
    #[arg(long, value_name = "N", requires = "from")]
    limit: Option<usize>,
    /// With --from: queue lengths instead of the rate classes, as `mimic replay --queue`.
    #[arg(long, value_name = "N|up=N,down=M", value_parser = parse_queue, requires = "from")]
    queue: Option<QueueOverride>,
    /// With --from: what a connection without a bandwidth estimate gets, as `mimic replay
    /// --unestimated` (pooled, pooled-class, skip, unshaped).
    #[arg(
        long,
        value_name = "pooled|pooled-class|skip|unshaped",
        default_value = "pooled",
        requires = "from"
    )]
    unestimated: orchestrate::Unestimated,
    /// With --from: the seed `mimic replay --seed` would use (only mimic's datapath uses it).
    #[arg(long, default_value_t = 1, requires = "from")]
    seed: u64,
    /// Interface towards the clients (downstream pipes shape its egress); printing defaults
    /// to eth0, --apply needs it named.
    #[arg(long, value_name = "IF")]
    client_if: Option<String>,
    /// Interface towards the servers (upstream pipes shape its egress); printing defaults to
    /// eth1, --apply needs it named.
    #[arg(long, value_name = "IF")]
    server_if: Option<String>,
    /// Print the commands for one `tc -batch FILE` (or `ipfw -q FILE`) process instead of a
    /// shell script.
    #[arg(long, conflicts_with = "apply")]
    batch: bool,
    /// Run the commands (netem: one `tc -batch`, after checking that the kernel has netem and
    /// that the root qdiscs are the kernel's default or mimic's; dummynet: ipfw must exist).
    #[arg(long)]
    apply: bool,
    /// Remove what mimic installed (its root qdisc / its ipfw rule set and pipes) and nothing
    /// else, instead of installing.
    #[arg(long)]
    teardown: bool,
    /// With --apply: replace a root qdisc mimic did not install.
    #[arg(long, requires = "apply")]
    force: bool,
    /// Testing only: pfifo leaves in place of netem (classes and filters without the
    /// emulation), to time or check the install on a kernel without sch_netem.
    #[arg(long, hide = true)]
    test_pfifo_leaves: bool,
}

fn parse_select(s: &str) -> Result<Select, String> {
    s.parse()
}
fn parse_queue(s: &str) -> Result<QueueOverride, String> {
    s.parse()
}

/// A pipe that cannot be rendered, named with where it came from: the `--pipes` file, the
/// database `--from` read, or the command line's `--default*`.
fn name_the_source(e: render::RenderError, a: &RenderArgs, file_flows: usize) -> anyhow::Error {
    if let render::RenderError::TooMany { .. } = &e {
        // too many in all: every source of flows is named
        let sources: Vec<String> = a
            .tables
            .pipes
            .iter()
            .filter(|_| file_flows > 0)
            .chain(a.from.iter())
            .map(|p| p.display().to_string())
            .collect();
        return if sources.is_empty() {
            e.into()
        } else {
            anyhow::anyhow!("{}: {e}", sources.join(" + "))
        };
    }
    let render::RenderError::Unsupported { what, .. } = &e else {
        return e.into();
    };
    let file = a.tables.pipes.as_ref().map(|p| p.display().to_string());
    let cli_default = a.tables.default.is_some()
        || (a.tables.default_up.is_some() && a.tables.default_down.is_some());
    let source = if let Some(n) = what.strip_prefix("flow #") {
        let n: usize = n
            .split(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        if n > file_flows {
            a.from.as_ref().map(|d| d.display().to_string())
        } else {
            file
        }
    } else if what.starts_with("default") && cli_default {
        Some(
            if a.tables.default.is_some() {
                "--default"
            } else {
                "--default-up/--default-down"
            }
            .to_string(),
        )
    } else {
        file
    };
    match source {
        Some(s) => anyhow::anyhow!("{s}: {e}"),
        None => e.into(),
    }
}

/// The interfaces `render` prints for when none is named.
const RENDER_CLIENT_IF: &str = "eth0";
const RENDER_SERVER_IF: &str = "eth1";

fn run_render(a: RenderArgs) -> anyhow::Result<ExitCode> {
    let client_if = a.client_if.as_deref().unwrap_or(RENDER_CLIENT_IF);
    let server_if = a.server_if.as_deref().unwrap_or(RENDER_SERVER_IF);
    if client_if == server_if {
        // render refuses it too; here the options (and a default) are named
        let which = match (&a.client_if, &a.server_if) {
            (Some(_), None) => {
                format!("--client-if {client_if} is the interface --server-if defaults to")
            }
            (None, Some(_)) => {
                format!("--server-if {server_if} is the interface --client-if defaults to")
            }
            _ => format!("--client-if and --server-if are both {client_if}"),
        };
        bail!("{which}: each side's pipes need an interface of their own (on one, the downstream pipes would replace the upstream ones); name two interfaces");
    }
    let mut table = a.tables.load()?;
    let file_flows = table.flows.len();
    if let Some(db) = &a.from {
        let mut wl = mimic_replay::workload::load(db, a.select, a.limit)?;
        // the rates a replay with the same --unestimated would give
        let rates = orchestrate::rates::assign(&mut wl, a.unestimated)?;
        if rates.left_out > 0 {
            // a replay would leave them out too, and say so: a render must not drop them unsaid
            eprintln!(
                "mimic netemu render: {}: {} connections left out: no bandwidth estimate of their own and none to pool under --unestimated {} (--unestimated unshaped renders them without a rate)",
                db.display(),
                rates.left_out,
                a.unestimated
            );
        }
        let addrs: Vec<Ipv4Addr> = if a.client_addr.is_empty() {
            let info = LabInfo::for_name("render")?;
            (0..info.pool_len())
                .filter_map(|i| info.pool_addr(i))
                .collect()
        } else {
            a.client_addr.clone()
        };
        let server = a
            .server
            .unwrap_or_else(|| SocketAddr::new(lab::SERVER_ADDR.into(), 80));
        let mut rules =
            orchestrate::flow_rules(&wl, &addrs, server, a.seed, a.queue.unwrap_or_default())
                .with_context(|| format!("{}", db.display()))?;
        let waits = orchestrate::plan::strip_handshake_waits(&mut rules);
        if waits > 0 {
            eprintln!(
                "mimic netemu render: {}: {waits} connections' handshake waits left out (kernel pipes cannot hold one packet; mimic's own emulator does)",
                db.display()
            );
        }
        if rules.is_empty() {
            bail!(
                "{}: no connection to render (--select {:?})",
                db.display(),
                a.select
            );
        }
        let in_file = table.flows.len();
        table.flows.extend(rules);
        // a connection with the client and server of a flow of the file: a packet takes the
        // first rule's pipes, so the second's would never be used (two of the database's own
        // are left to the renderer's check, which names them)
        if let (Some(p), Some((j, i))) = (&a.tables.pipes, table.duplicate_flow()) {
            if j < in_file {
                let r = &table.flows[i];
                bail!(
                    "{}: a connection from {} to {} has the client and server of {}'s [[flow]] #{}: one rule per connection (give --client-addr or --server other addresses)",
                    db.display(),
                    r.client,
                    r.server,
                    p.display(),
                    j + 1
                );
            }
        }
    }
    if a.apply && (a.client_if.is_none() || a.server_if.is_none()) {
        bail!("--apply changes the interfaces' root qdiscs: name both with --client-if and --server-if");
    }
    let opts = RenderOptions {
        client_if: client_if.into(),
        server_if: server_if.into(),
        leaf: if a.test_pfifo_leaves {
            Leaf::Pfifo
        } else {
            Leaf::Netem
        },
        ack_policies: if a.from.is_some() {
            AckPolicies::LeaveOut
        } else {
            AckPolicies::Refuse
        },
        // a workload's one-way delays are microseconds; a hand-written table is refused
        dummynet_round_delays: a.from.is_some(),
    };
    let empty = table.default.is_none() && table.prefixes.is_empty() && table.flows.is_empty();
    if a.teardown {
        let t = (!empty).then_some(&table);
        if a.apply {
            let r = render::apply_teardown(a.backend, t, &opts, &ApplyOptions::default())?;
            if a.backend == Backend::Netem && r.replaced.is_empty() {
                eprintln!(
                    "mimic: nothing of mimic's on {} or {}",
                    opts.server_if, opts.client_if
                );
            } else if a.backend == Backend::Netem {
                eprintln!(
                    "mimic: removed mimic's root qdisc ({}) from {}",
                    render::TC_HANDLE,
                    r.replaced.join(" and ")
                );
            } else {
                eprintln!(
                    "mimic: removed mimic's rule set and pipes ({} commands)",
                    r.commands
                );
            }
        } else {
            let s = render::teardown(a.backend, t, &opts)?;
            print!("{}", if a.batch { s.to_batch() } else { s.to_shell() });
        }
        return Ok(ExitCode::SUCCESS);
    }
    if empty {
        if let Some(p) = &a.tables.pipes {
            bail!(
                "{}: holds no pipes (a [default] table, [[prefix]] or [[flow]] entries; netemu/README.md has the format)",
                p.display()
            );
        }
        bail!("no pipes to render: give --pipes FILE, --default PIPE, --default-up/--default-down, or --from FLOWS_DB");
    }
    let script =
        render::render(a.backend, &table, &opts).map_err(|e| name_the_source(e, &a, file_flows))?;
    if script.ack_policies_left_out > 0 {
        eprintln!(
            "mimic: warning: {} connections' delayed-ACK shaping left out ({} cannot thin ACKs; mimic's datapath can)",
            script.ack_policies_left_out,
            if a.backend == Backend::Netem { "netem" } else { "dummynet" }
        );
    }
    if script.delays_rounded > 0 {
        eprintln!(
            "mimic: note: {} pipes' delays rounded to whole milliseconds (dummynet's resolution)",
            script.delays_rounded
        );
    }
    if a.apply {
        let t0 = std::time::Instant::now();
        let r = render::apply(
            a.backend,
            &script,
            &opts,
            &ApplyOptions {
                netns: None,
                force: a.force,
            },
        )?;
        for d in &r.forced {
            eprintln!("mimic: replaced a root qdisc mimic did not install on {d} (--force)");
        }
        eprintln!(
            "mimic: applied {} commands in {:.2} s{}",
            r.commands,
            t0.elapsed().as_secs_f64(),
            if r.replaced.is_empty() {
                String::new()
            } else {
                format!(
                    " (replacing mimic's previous pipes on {})",
                    r.replaced.join(", ")
                )
            }
        );
    } else if a.batch {
        print!("{}", script.to_batch());
    } else {
        print!("{}", script.to_shell());
    }
    Ok(ExitCode::SUCCESS)
}

fn run_emulator(spec: EmulatorSpec) -> anyhow::Result<ExitCode> {
    if spec.backend == spec::RouterBackend::Netem {
        return run_kernel_router(spec);
    }
    let table = spec.pipe_table()?;
    let info = spec.lab()?;
    let (cif, sif) = match (&info, &spec.bridge) {
        (Some(i), _) => (i.emu_cli_if.clone(), i.emu_srv_if.clone()),
        (
            None,
            Bridge::Interfaces {
                client_if,
                server_if,
            },
        ) => (client_if.clone(), server_if.clone()),
        (None, Bridge::Lab(_)) => unreachable!("a lab bridge has its LabInfo"),
    };
    if let Some(i) = &info {
        if !mimic_netemu::netns::exists(&i.ns_emu) {
            bail!("lab {} is not up (run `mimic lab up {}`)", i.name, i.name);
        }
        // The veths there are joined to a guest's taps: a datapath on them would forward
        // every frame a second time.
        if mimic_netemu::guest::load_record(&i.runtime_dir, "emu").is_some() {
            bail!(
                "lab {0}'s router host is a QEMU guest (lab up --kernel): install pipes in it with `mimic lab exec {0} emu -- mimic netemu render --backend netem ... --client-if {1} --server-if {2} --apply`",
                i.name,
                i.emu_cli_if,
                i.emu_srv_if
            );
        }
    }
    let (addr, pki) = spec.control_and_pki()?;
    let tls = RoleTls::load(&pki, control::ROLE)?;
    let EmulatorSpec {
        spin_us,
        spin_rule,
        rt_priority,
        cpu,
        buffers,
        max_flows,
        seed,
        json,
        metrics,
        ..
    } = spec;
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
    let bound = super::bound_control(&listener, &addr);
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
        spin_rule,
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
            .spawn(move || control::serve(listener, tls, jtx, waker, stop))?
    };
    eprintln!("mimic: netemu bridging {cif} <-> {sif}; control {bound}");
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
        let d = &stats.datapath;
        println!(
            "spin rule {spin_rule}: budget cut in {} windows of 10 ms; machine busy {:.2} cores on average, the datapath thread {:.2} (busy-waiting {:.2}); its CPU given to another task {} times, page faults {}",
            d.spin_reduced_windows, d.machine_busy_cores, d.datapath_cores, d.spin_cores, d.preempted, d.page_faults
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `mimic netemu run --backend netem`: no datapath; serves the control channel, installing and
/// removing kernel pipes as the controller asks, until SIGINT/SIGTERM or `shutdown`; removes
/// everything it installed on the way out.
fn run_kernel_router(spec: EmulatorSpec) -> anyhow::Result<ExitCode> {
    let (cif, sif) = match &spec.bridge {
        Bridge::Interfaces {
            client_if,
            server_if,
        } => (client_if.clone(), server_if.clone()),
        Bridge::Lab(name) => bail!(
            "--backend netem takes --client-if and --server-if, not --lab: a lab replays through kernel pipes with `mimic replay --lab {name} --emulator netem` (its router host on a kernel with netem: `mimic lab up {name} --kernel IMAGE`)"
        ),
    };
    if spec.pipes.is_some() || spec.default != DefaultPipes::None {
        bail!("--backend netem installs only the pipes the controller sends (no --pipes or --default*); render a table for the kernel with `mimic netemu render --backend netem --apply`");
    }
    if spec.metrics.is_some() {
        bail!("--backend netem has no --metrics (the kernel's counters: `tc -s class show dev {cif}`)");
    }
    let (addr, pki) = spec.control_and_pki()?;
    let tls = RoleTls::load(&pki, control::ROLE)?;
    let signal_fd = datapath::block_stop_signals().context("blocking SIGINT/SIGTERM")?;
    let router = mimic_netemu::kernel_router::KernelRouter::open(&cif, &sif, spec.force)
        .with_context(|| format!("kernel pipes on {cif} and {sif}"))?;
    let info = router.info();
    let router = Arc::new(std::sync::Mutex::new(router));
    let listener = control::Listener::bind(&addr)
        .with_context(|| format!("binding control channel {addr}"))?;
    let bound = super::bound_control(&listener, &addr);
    let stop = Arc::new(AtomicBool::new(false));
    let ctl = {
        let (stop, router) = (stop.clone(), router.clone());
        std::thread::Builder::new()
            .name("netemu-control".into())
            .spawn(move || control::serve_kernel(listener, tls, router, stop))?
    };
    eprintln!(
        "mimic: netemu kernel pipes (netem, kernel {}) on {cif} (downstream) and {sif} (upstream){}; control {bound}",
        info.kernel,
        if info.forced { "; a foreign root qdisc was replaced (--force)" } else { "" }
    );
    let mut pfd = libc::pollfd {
        fd: signal_fd,
        events: libc::POLLIN,
        revents: 0,
    };
    while !stop.load(Ordering::Relaxed) {
        // SAFETY: one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, 200) };
        if n > 0 {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let _ = ctl.join();
    let mut r = router.lock().unwrap_or_else(|p| p.into_inner());
    let torn = r.teardown();
    let info = r.info();
    if spec.json {
        println!("{}", serde_json::to_string_pretty(&info)?);
    } else {
        println!(
            "kernel pipes: {} connections installed, {} removed, {} tc batches (longest {:.1} ms), {} with delayed-ACK shaping left out; mimic's root qdiscs removed from {cif} and {sif}",
            info.installs, info.removes, info.batches, info.max_batch_ms, info.ack_left_out
        );
    }
    torn.context("removing the kernel pipes")?;
    Ok(ExitCode::SUCCESS)
}

/// The engine's and datapath's counters now, read on the datapath thread between packets
/// (as `mimic netemu counters` does); None once the datapath has stopped.
fn run_stats(jobs: &mpsc::Sender<Job>, waker: Waker) -> Option<RunStats> {
    let (tx, rx) = mpsc::sync_channel::<RunStats>(1);
    let job: Job = Box::new(move |ctx| {
        let _ = tx.send(RunStats {
            engine: ctx.engine.stats(),
            datapath: ctx.stats.snapshot(),
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
        "departure lateness: p50 {:.1}us p99 {:.1}us max {:.1}us (wake-ups {} us late p99, {} max, of {} timed sleeps); flow rules {}, pipes {}",
        d.late_p50_ns as f64 / 1e3,
        d.late_p99_ns as f64 / 1e3,
        d.late_max_ns as f64 / 1e3,
        d.wake_late_p99_ns / 1_000,
        d.wake_late_max_ns / 1_000,
        d.timed_sleeps,
        e.flow_rules,
        e.pipes
    );
}

/// `--cpu N`: a CPU that is online here (one that is not would only warn when the datapath
/// starts, and run unpinned).
fn online_cpu(s: &str) -> Result<usize, String> {
    let c: usize = s
        .parse()
        .map_err(|_| format!("`{s}` is not a CPU number"))?;
    match mimic_core::cpu::online_cpus() {
        Some(on) if !on.contains(&c) => Err(format!(
            "CPU {c} is not online on this machine (online: {})",
            mimic_core::cpu::format_list(&on)
        )),
        _ => Ok(c),
    }
}

/// A count that must be at least 1 (`--max-flows`: with 0 no connection's pipes fit).
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("`{s}` is not a count")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(spec: &EmulatorSpec) -> EmulatorSpec {
        match crate::cmd::parse_role_args(spec.to_args()) {
            crate::Command::Netemu(Args { cmd: Cmd::Run(r) }) => r.into_spec().unwrap(),
            _ => panic!("{:?} is not `mimic netemu run`", spec.to_args()),
        }
    }

    /// The spec's command line, parsed by the real parser and mapped back, is the spec.
    #[test]
    fn spec_survives_its_command_line() {
        let every_field = EmulatorSpec {
            bridge: Bridge::Interfaces {
                client_if: "eth0".into(),
                server_if: "eth1".into(),
            },
            control: Some("tcp:10.9.0.2:7002".parse().unwrap()),
            pki: Some("/etc/mimic/pki".into()),
            pipes: Some("/etc/mimic/pipes.toml".into()),
            default: DefaultPipes::Split {
                up: "delay=10ms,queue=20".parse().unwrap(),
                down: "delay=10ms,rate=2mbit,loss=1%,queue=30,seed=5"
                    .parse()
                    .unwrap(),
            },
            spin_us: 25,
            spin_rule: SpinRule::FollowLoad,
            rt_priority: 0,
            // a CPU of this machine (`--cpu` refuses one that is not online)
            cpu: mimic_core::cpu::online_cpus().and_then(|c| c.last().copied()),
            buffers: 4096,
            max_flows: 1000,
            seed: 77,
            json: true,
            metrics: Some("127.0.0.1:9465".parse().unwrap()),
            backend: spec::RouterBackend::Netem,
            force: true,
        };
        assert_eq!(round_trip(&every_field), every_field);

        let mut lab = every_field.clone();
        lab.bridge = Bridge::Lab("t1".into());
        lab.default = DefaultPipes::Both("delay=1ms,rate=100mbit,ack_every=2".parse().unwrap());
        assert_eq!(round_trip(&lab), lab);
        let defaults = EmulatorSpec::new(Bridge::Lab("t1".into()));
        assert_eq!(round_trip(&defaults), defaults);
    }
}
