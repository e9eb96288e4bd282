//! Kernel pipes (`mimic replay --emulator netem|dummynet`): the replay's per-connection pipes,
//! the same [`FlowRule`]s mimic's own emulator would get, rendered by the netem/dummynet
//! renderer ([`mimic_netemu::render`]: an htb class + netem leaf per pipe, hashed u32 filters
//! keyed by the client address each connection will use) and installed with `tc` on the
//! router host — the lab's, or a remote router running `mimic netemu run --backend netem`
//! reached over the control channel (`--netemu ADDR`; it renders and applies the pipes itself,
//! [`mimic_netemu::kernel_router`]) — and removed at the end (and on any early end:
//! [`KernelPipes`] removes them when dropped).
//!
//! Two modes (`--kernel-pipes`, recorded in `meta` as `emulator_pipe_mode`): `all` installs
//! every pipe in one batch before the first SYN; `per-connection` ([`KernelPipes::run_per_connection`])
//! installs the pipes of the connections whose SYN is due within a lead time, in batches per
//! time slice, and removes a connection's pipes once it has closed, so a long replay holds only
//! the connections open around now. The lead time covers the install time measured (three
//! times the slowest batch so far, the skeleton's install on a lab router included, at least
//! [`LEAD_MIN`]); an install that completes after its
//! connection's SYN was due is counted (`emulator_late_installs`), never silent, and that SYN
//! waits for it ([`PipeGate`]): no connection crosses the router before its pipes are in; the
//! wait shows as the connection's start lateness and is counted (`emulator_syn_waits`).
//!
//! The router host is a QEMU guest on a kernel with sch_netem (`mimic lab up NAME --kernel
//! IMAGE`: commands go over the guest's command channel, one `tc -batch` per group of lines),
//! or the lab's emu namespace when this machine's kernel has netem (its two veths then joined
//! by a bridge of mimic's). All pipes are installed in one batch ahead of the replay, not one
//! `tc` exec per connection: one exec on a TCG guest costs tens of milliseconds (the
//! `emulator_install_s` meta row and the guide's measurements), more than the gap between
//! SYNs of a busy workload.
//!
//! What kernel pipes cannot do is reported, never dropped silently: delayed-ACK shaping (the
//! ACK thinning of mimic's datapath) is left out of the rendered pipes, warned about and
//! counted in `meta` (`emulator_unsupported`).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use mimic_netemu::control::{Client as NetemuClient, ControlAddr, ControllerTls};
use mimic_netemu::engine::{FlowRule, PipeTable};
use mimic_netemu::guest::{self, GuestRecord};
use mimic_netemu::kernel_router::{PipeId, SlotPipes};
use mimic_netemu::lab::LabInfo;
use mimic_netemu::render::{
    self, AckPolicies, ApplyOptions, Backend, Leaf, RenderError, RenderOptions, RootQdisc,
    TC_HANDLE,
};

use super::ReplayError;
use crate::spec::{Emulator, PipeMode, AUTO_ALL_AT_ONCE_MAX};

/// The least lead time of a per-connection install ahead of its SYN.
pub const LEAD_MIN: Duration = Duration::from_millis(500);
/// How often the per-connection scheduler looks for installs and removals due.
const SLICE: Duration = Duration::from_millis(50);
/// How long after a connection closed its pipes are removed (trailing FIN/ACKs; plus the
/// connection's two one-way delays).
const LINGER: Duration = Duration::from_secs(1);
/// Rules per `install_pipes` request in all-at-once mode on a remote router.
const REMOTE_CHUNK: usize = 2_000;

/// Most bytes of `tc -batch` lines sent in one guest command (the argument list of one
/// `execve` is limited to a few MiB; one argument to 128 KiB, a line is far shorter).
const GUEST_BATCH_BYTES: usize = 512 * 1024;
/// How long one guest command may take.
const GUEST_CMD_LIMIT: Duration = Duration::from_secs(120);

fn render_err(e: RenderError) -> ReplayError {
    ReplayError::Invalid(e.to_string())
}

/// Where the kernel pipes go.
enum Router {
    /// The lab's router host is a QEMU guest.
    Guest(Box<GuestRecord>),
    /// The lab's emu namespace (this machine's kernel), its veths bridged by `bridge`.
    Namespace { ns: String, bridge: Option<String> },
    /// A router running `mimic netemu run --backend netem`, over its control channel; the
    /// pipe ids this replay installed there.
    Remote {
        client: Box<NetemuClient>,
        ids: HashSet<PipeId>,
    },
}

/// What the install did, for the summary and `meta`.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct KernelInstall {
    /// `netem` or `dummynet`.
    pub backend: &'static str,
    /// Where: `guest NS (kernel VERSION)` or `namespace NS`.
    pub router: String,
    /// Pipes installed (two per connection).
    pub pipes: usize,
    /// `tc` commands run.
    pub commands: usize,
    /// Guest commands (or `tc` processes) the install took.
    pub execs: usize,
    /// Wall time of the install, seconds.
    pub install_s: f64,
    /// Connections whose delayed-ACK shaping was left out.
    pub delack_left_out: usize,
    /// Connections whose handshake wait (a SYN-ACK held as long as the original's waited,
    /// `plan::handshake_wait_us`) was left out: kernel pipes cannot hold one packet.
    pub handshake_wait_left_out: usize,
    /// Wall time of the teardown, seconds (None: not torn down yet).
    pub teardown_s: Option<f64>,
    /// `all` or `per-connection`.
    pub mode: &'static str,
    /// Per connection: installs that completed after their connection's SYN was due.
    pub late_installs: u64,
    /// Per connection: SYNs held past their due time until their pipes were in, and the
    /// longest hold (ms).
    pub syn_waits: u64,
    pub syn_wait_max_ms: f64,
    /// Per connection: the most connections whose pipes were installed at once.
    pub max_installed: usize,
    /// Per connection: install batches, the slowest (ms), and the lead time at the end (ms).
    pub batches: u64,
    pub batch_max_ms: f64,
    pub lead_ms: f64,
    /// Per connection: removals that failed (their pipes go with the teardown).
    pub remove_errors: u64,
    /// Per connection: install batch times p50 / p99 (ms, nearest rank).
    pub install_batch_ms: [f64; 2],
    /// Per connection: removal batches, their times p50 / p99 / max (ms).
    pub remove_batches: u64,
    pub remove_batch_ms: [f64; 3],
    /// Per connection: how long a connection's pipes stayed past the time they were due to go
    /// (its close plus the linger), p99 and max (ms): removal lagging behind.
    pub remove_lag_ms: [f64; 2],
    /// Router commands (guest execs, `tc` processes or router requests) per connection mode.
    pub router_calls: u64,
    /// Per connection: connections whose pipes went in before the clients started
    /// ([`KernelPipes::prime`]; their batches count among `batches`).
    pub primed: u64,
}

/// Router calls the lead time looks back over.
const LEAD_WINDOW: usize = 16;

/// Install batches [`KernelPipes::prime`] runs at most.
const PRIME_ROUNDS: usize = 3;

/// How much longer a router call may take once the replay's traffic crosses the router than
/// the same call before it: a TCG guest's batches went from 0.35–0.6 s before the replay to
/// 0.7–1.3 s in its first seconds, and its pipes came late while the lead grew towards that.
const LOADED: u32 = 2;

/// The lead time of per-connection installs: three times the slowest of the last
/// [`LEAD_WINDOW`] router calls (at least `floor`), reached step by step: it grows by at most
/// the last call's time (or a slice) per call, since a lead that jumps makes the next batch
/// take every connection due within the new lead at once — a batch larger and slower than
/// the one that raised it, whose time then raises the lead again (a replay of 2,000
/// connections at 100/s in a TCG guest went from 0.6 s batches to a 12 s one and a 36 s lead,
/// 1,892 installs late). A slow call that is past the window lets the lead come down again.
#[derive(Debug)]
struct LeadTime {
    floor: Duration,
    recent: VecDeque<Duration>,
    lead: Duration,
}

impl LeadTime {
    fn new(floor: Duration) -> LeadTime {
        LeadTime {
            floor,
            recent: VecDeque::new(),
            lead: floor,
        }
    }

    fn now(&self) -> Duration {
        self.lead
    }

    /// The router calls before the replay began took `took`, and their pipes cover the
    /// connections due within `covered` of the first SYN: each call counts as [`LOADED`] times
    /// its time (the router is idle until the replay's traffic starts), and the lead starts at
    /// `covered` (at least the floor) — the window already installed, so the first batch
    /// takes in only what is due past it — and climbs from there as [`LeadTime::observe`]
    /// climbs.
    fn seed(&mut self, took: &[Duration], covered: Duration) {
        for t in took {
            if self.recent.len() == LEAD_WINDOW {
                self.recent.pop_front();
            }
            self.recent.push_back(*t * LOADED);
        }
        self.lead = self.floor.max(covered);
    }

    /// One router call took `took`.
    fn observe(&mut self, took: Duration) {
        if self.recent.len() == LEAD_WINDOW {
            self.recent.pop_front();
        }
        self.recent.push_back(took);
        let slowest = self.recent.iter().max().copied().unwrap_or_default();
        let target = self.floor.max(slowest * 3);
        self.lead = if target > self.lead {
            target.min(self.lead + took.max(SLICE))
        } else {
            target
        };
    }
}

/// Batch and lag samples of a per-connection run (ms), summed up into [`KernelInstall`].
#[derive(Default)]
struct Samples {
    install: Vec<f64>,
    remove: Vec<f64>,
    lag: Vec<f64>,
}

impl Samples {
    fn summarize(mut self, r: &mut KernelInstall) {
        for v in [&mut self.install, &mut self.remove, &mut self.lag] {
            v.sort_by(f64::total_cmp);
        }
        let q = |v: &[f64], q: f64| super::health::quantile(v, q).unwrap_or(0.0);
        r.install_batch_ms = [q(&self.install, 0.5), q(&self.install, 0.99)];
        r.remove_batches = self.remove.len() as u64;
        r.remove_batch_ms = [
            q(&self.remove, 0.5),
            q(&self.remove, 0.99),
            self.remove.last().copied().unwrap_or(0.0),
        ];
        r.remove_lag_ms = [q(&self.lag, 0.99), self.lag.last().copied().unwrap_or(0.0)];
    }
}

impl KernelInstall {
    /// The `meta` rows of a replay through kernel pipes.
    pub fn meta(&self) -> Vec<(&'static str, String)> {
        let mut v = vec![
            ("emulator_router", self.router.clone()),
            ("emulator_pipes", self.pipes.to_string()),
            ("emulator_install_s", format!("{:.3}", self.install_s)),
            ("emulator_install_execs", self.execs.to_string()),
        ];
        if !self.mode.is_empty() {
            v.push(("emulator_pipe_mode", self.mode.to_string()));
        }
        if self.mode == "per-connection" {
            v.push(("emulator_late_installs", self.late_installs.to_string()));
            v.push(("emulator_syn_waits", self.syn_waits.to_string()));
            v.push((
                "emulator_syn_wait_max_ms",
                format!("{:.1}", self.syn_wait_max_ms),
            ));
            v.push(("emulator_max_installed", self.max_installed.to_string()));
            v.push(("emulator_install_batches", self.batches.to_string()));
            v.push((
                "emulator_install_batch_max_ms",
                format!("{:.1}", self.batch_max_ms),
            ));
            v.push(("emulator_install_lead_ms", format!("{:.0}", self.lead_ms)));
            v.push(("emulator_primed", self.primed.to_string()));
            v.push(("emulator_remove_errors", self.remove_errors.to_string()));
            v.push((
                "emulator_install_batch_ms",
                format!(
                    "p50 {:.1} p99 {:.1}",
                    self.install_batch_ms[0], self.install_batch_ms[1]
                ),
            ));
            v.push(("emulator_remove_batches", self.remove_batches.to_string()));
            v.push((
                "emulator_remove_batch_ms",
                format!(
                    "p50 {:.1} p99 {:.1} max {:.1}",
                    self.remove_batch_ms[0], self.remove_batch_ms[1], self.remove_batch_ms[2]
                ),
            ));
            v.push((
                "emulator_remove_lag_ms",
                format!(
                    "p99 {:.0} max {:.0}",
                    self.remove_lag_ms[0], self.remove_lag_ms[1]
                ),
            ));
        }
        v
    }

    /// What kernel pipes left out, `delack:N connections` and `handshake_wait:N connections`
    /// joined by commas, or empty when nothing was.
    pub fn unsupported(&self) -> String {
        let mut v = Vec::new();
        if self.delack_left_out > 0 {
            v.push(format!("delack:{} connections", self.delack_left_out));
        }
        if self.handshake_wait_left_out > 0 {
            v.push(format!(
                "handshake_wait:{} connections",
                self.handshake_wait_left_out
            ));
        }
        v.join(",")
    }
}

/// Kernel pipes on a lab's router host; removed when dropped.
pub(super) struct KernelPipes {
    backend: Backend,
    router: Router,
    ropts: RenderOptions,
    /// dummynet: the table installed (its teardown deletes the pipes it numbers).
    table: Option<PipeTable>,
    installed: bool,
    /// Per connection on a lab router: the slot layout rendered here.
    slots: Option<SlotPipes>,
    /// Per connection: the time one batch took before the replay (the skeleton's), which the
    /// first lead time covers three times.
    first_batch: Duration,
    /// Per connection: the pipes [`KernelPipes::prime`] installed before the clients started.
    primed: Primed,
    pub report: KernelInstall,
}

/// The connections whose pipes went in before the replay began, and the batches that took.
#[derive(Default)]
struct Primed {
    /// (connection index, its pipes), in the order of their SYNs.
    ids: Vec<(usize, PipeId)>,
    batches: Vec<Duration>,
    /// Every connection due within this of the first SYN has its pipes.
    covered: Duration,
}

/// Per connection: which connections' pipes are in. The scheduler opens a connection's gate
/// once its install returned; the client holds that connection's SYN until then (a router
/// that stalls past the lead time delays starts instead of letting SYNs through unshaped)
/// and counts the SYNs it held past their due time.
pub struct PipeGate {
    open: Vec<AtomicBool>,
    /// Woken once per install batch: the SYNs held look at their gates again.
    opened: tokio::sync::Notify,
    waits: AtomicU64,
    wait_max_us: AtomicU64,
}

impl PipeGate {
    /// A gate for connection indexes below `n`, every one closed.
    pub fn new(n: usize) -> PipeGate {
        PipeGate {
            open: (0..n).map(|_| AtomicBool::new(false)).collect(),
            opened: tokio::sync::Notify::new(),
            waits: AtomicU64::new(0),
            wait_max_us: AtomicU64::new(0),
        }
    }

    /// The pipes of the connections `indexes` are in: their gates open, and the SYNs held
    /// look again. (An index past the gate's size has no gate.)
    pub fn open(&self, indexes: impl IntoIterator<Item = usize>) {
        for i in indexes {
            if let Some(g) = self.open.get(i) {
                g.store(true, Ordering::Release);
            }
        }
        self.opened.notify_waiters();
    }

    /// Every gate opens: the scheduler ended with an error or is unwinding, and the clients
    /// are being stopped; none of them may wait for it.
    pub fn open_all(&self) {
        self.open(0..self.open.len());
    }

    pub fn is_open(&self, index: usize) -> bool {
        self.open
            .get(index)
            .is_none_or(|g| g.load(Ordering::Acquire))
    }

    /// Waits until connection `index`'s gate is open: woken by [`PipeGate::open`], and looks
    /// again at least every `poll`.
    pub async fn wait(&self, index: usize, poll: Duration) {
        loop {
            // (registered before the look: an open between the two still wakes it)
            let woken = self.opened.notified();
            if self.is_open(index) {
                return;
            }
            let _ = tokio::time::timeout(poll, woken).await;
        }
    }

    /// A SYN was held `late` past its due time.
    pub fn held(&self, late: Duration) {
        self.waits.fetch_add(1, Ordering::Relaxed);
        self.wait_max_us
            .fetch_max(late.as_micros() as u64, Ordering::Relaxed);
    }

    /// SYNs held past their due time, and the longest hold.
    pub fn waits(&self) -> (u64, Duration) {
        (
            self.waits.load(Ordering::Relaxed),
            Duration::from_micros(self.wait_max_us.load(Ordering::Relaxed)),
        )
    }
}

/// Stops the clients and lets every held SYN go when the per-connection scheduler ends with
/// an error or unwinds (a panic) — unless `ok` says it finished: no client waits for a gate
/// nobody will open.
struct Release<'a> {
    gate: &'a PipeGate,
    abort: &'a AtomicBool,
    ok: bool,
}

impl Drop for Release<'_> {
    fn drop(&mut self) {
        if !self.ok {
            self.abort.store(true, Ordering::Relaxed);
            self.gate.open_all();
        }
    }
}

/// One connection for the per-connection scheduler: its index, when its SYN is due, its rule.
pub struct Due {
    pub index: usize,
    pub start: Instant,
    pub rule: FlowRule,
}

impl KernelPipes {
    /// Finds the lab's router host and checks it can take `emulator`'s pipes, before any role
    /// starts: dummynet needs `ipfw`, netem on a namespace router needs sch_netem in this
    /// machine's kernel (a one-line error naming the missing qdisc otherwise).
    pub fn prepare(emulator: Emulator, info: &LabInfo) -> Result<KernelPipes, ReplayError> {
        let backend = match emulator {
            Emulator::Netem => Backend::Netem,
            Emulator::Dummynet => Backend::Dummynet,
            Emulator::Mimic => {
                return Err(ReplayError::Invalid(
                    "kernel pipes: mimic's own emulator is not a kernel backend".into(),
                ))
            }
        };
        let rec = guest::load_record(&info.runtime_dir, "emu");
        if backend == Backend::Dummynet {
            // dummynet needs ipfw on the router: Linux guests and namespaces here have none
            let has = match &rec {
                Some(r) => guest::exec_ok(r, &["sh", "-c", "command -v ipfw"]).is_ok(),
                None => render::ensure_ipfw().is_ok(),
            };
            if !has {
                return Err(ReplayError::Invalid(format!(
                    "--emulator dummynet: ipfw is not installed on lab {}'s router host (dummynet needs FreeBSD, or Linux with the ipfw3 module); render the pipes instead: `mimic netemu render --backend dummynet --from FLOWS_DB`",
                    info.name
                )));
            }
        }
        let ropts = RenderOptions {
            client_if: info.emu_cli_if.clone(),
            server_if: info.emu_srv_if.clone(),
            leaf: Leaf::Netem,
            ack_policies: AckPolicies::LeaveOut,
            // a workload's one-way delays are microseconds
            dummynet_round_delays: true,
        };
        let router = match rec {
            Some(r) => Router::Guest(Box::new(r)),
            None => {
                if backend == Backend::Netem {
                    render::probe_netem().map_err(|e| {
                        ReplayError::Invalid(format!(
                            "--emulator netem: lab {}'s router host is a namespace of this machine, whose kernel has no sch_netem qdisc ({}); boot the router on a kernel that has it: `mimic lab up {} --kernel IMAGE` (see `mimic lab fetch-kernel`)",
                            info.name,
                            match e {
                                RenderError::NoNetem(why) => why,
                                other => other.to_string(),
                            },
                            info.name
                        ))
                    })?;
                }
                Router::Namespace {
                    ns: info.ns_emu.clone(),
                    bridge: None,
                }
            }
        };
        let where_ = match &router {
            Router::Guest(r) => format!("guest {} (kernel {})", r.netns, r.kernel.version),
            Router::Namespace { ns, .. } => format!("namespace {ns}"),
            Router::Remote { .. } => unreachable!("prepare_remote builds remote routers"),
        };
        Ok(KernelPipes {
            backend,
            router,
            ropts,
            table: None,
            installed: false,
            slots: None,
            first_batch: Duration::ZERO,
            primed: Primed::default(),
            report: KernelInstall {
                backend: emulator.as_str(),
                router: where_,
                ..KernelInstall::default()
            },
        })
    }

    /// A remote router (`mimic netemu run --backend netem` at `addr`): connects and asks what
    /// it is. A router running mimic's datapath, or `--emulator dummynet`, is refused.
    pub fn prepare_remote(
        emulator: Emulator,
        addr: &ControlAddr,
        tls: &ControllerTls,
    ) -> Result<KernelPipes, ReplayError> {
        if emulator != Emulator::Netem {
            return Err(ReplayError::Invalid(format!(
                "--emulator {emulator}: a remote router takes kernel pipes only as netem (`mimic netemu run --backend netem`); dummynet pipes can be rendered: `mimic netemu render --backend dummynet --from FLOWS_DB`"
            )));
        }
        let mut client = NetemuClient::connect(addr, tls).map_err(|e| ReplayError::Role {
            role: "netemu",
            why: format!("the router at {addr}: {e}"),
        })?;
        let info = client.kernel_info().map_err(|e| ReplayError::Role {
            role: "netemu",
            why: format!("the router at {addr} does not take kernel pipes: {e}"),
        })?;
        Ok(KernelPipes {
            backend: Backend::Netem,
            ropts: RenderOptions {
                client_if: info.client_if.clone(),
                server_if: info.server_if.clone(),
                leaf: Leaf::Netem,
                ack_policies: AckPolicies::LeaveOut,
                dummynet_round_delays: true,
            },
            router: Router::Remote {
                client: Box::new(client),
                ids: HashSet::new(),
            },
            table: None,
            installed: false,
            slots: None,
            first_batch: Duration::ZERO,
            primed: Primed::default(),
            report: KernelInstall {
                backend: "netem",
                router: format!(
                    "remote {addr} (kernel {}, {} <-> {})",
                    info.kernel, info.client_if, info.server_if
                ),
                ..KernelInstall::default()
            },
        })
    }

    /// The mode `requested` comes to for `conns` connections: dummynet and client agents
    /// (whose connections this process does not see close) install all at once (`auto`), and
    /// refuse `per-connection`.
    pub fn mode(
        &self,
        requested: PipeMode,
        conns: usize,
        agents: bool,
    ) -> Result<PipeMode, ReplayError> {
        let only_all = if self.backend == Backend::Dummynet {
            Some("dummynet pipes")
        } else if agents {
            Some("--agents (this process does not see their connections close)")
        } else {
            None
        };
        Ok(match (requested, only_all) {
            (PipeMode::PerConnection, Some(why)) => {
                return Err(ReplayError::Invalid(format!(
                    "--kernel-pipes per-connection: not with {why}; use --kernel-pipes all"
                )))
            }
            (_, Some(_)) => PipeMode::All,
            (PipeMode::Auto, None) if conns > AUTO_ALL_AT_ONCE_MAX => PipeMode::PerConnection,
            (PipeMode::Auto, None) => PipeMode::All,
            (m, None) => m,
        })
    }

    /// Runs `argv` on the router host; its stdout.
    fn run(&self, argv: &[&str]) -> Result<String, ReplayError> {
        match &self.router {
            Router::Guest(r) => guest::exec_ok_within(r, argv, GUEST_CMD_LIMIT)
                .map_err(|e| ReplayError::Invalid(format!("router host: {e}"))),
            Router::Namespace { ns, .. } => {
                let out = mimic_netemu::netns::command(ns, argv[0], &argv[1..])
                    .output()
                    .map_err(|e| ReplayError::Io(format!("{}: {e}", argv[0])))?;
                if !out.status.success() {
                    return Err(ReplayError::Invalid(format!(
                        "router host {ns}: `{}` failed: {}",
                        argv.join(" "),
                        String::from_utf8_lossy(&out.stderr).trim()
                    )));
                }
                Ok(String::from_utf8_lossy(&out.stdout).into_owned())
            }
            Router::Remote { .. } => Err(ReplayError::Invalid(format!(
                "`{}`: a remote router runs no commands (it renders the pipes itself)",
                argv.join(" ")
            ))),
        }
    }

    /// Runs the lines of a `tc -batch` on the router host; the number of execs it took.
    fn run_batch(&self, lines: &[String]) -> Result<usize, ReplayError> {
        if lines.is_empty() {
            return Ok(0);
        }
        match &self.router {
            Router::Namespace { ns, .. } => {
                let mut text = lines.join("\n");
                text.push('\n');
                render::run_tc_batch(
                    &text,
                    &ApplyOptions {
                        netns: Some(ns.clone()),
                        force: false,
                    },
                )
                .map_err(render_err)?;
                Ok(1)
            }
            _ => {
                // the lines as arguments, printed one a line into the tool's standard input
                let script = "printf '%s\\n' \"$@\" | tc -batch -";
                let chunks = guest_chunks(lines);
                for r in &chunks {
                    let group: Vec<&str> = lines[r.clone()].iter().map(String::as_str).collect();
                    self.run_group(script, &group)?;
                }
                Ok(chunks.len())
            }
        }
    }

    fn run_group(&self, script: &str, group: &[&str]) -> Result<(), ReplayError> {
        let mut argv = vec!["sh", "-c", script, "sh"];
        argv.extend_from_slice(group);
        self.run(&argv).map(|_| ())
    }

    /// The root qdisc of `dev` on the router host.
    fn root_qdisc(&self, dev: &str) -> Result<RootQdisc, ReplayError> {
        let json = self.run(&["tc", "-j", "qdisc", "show", "dev", dev])?;
        render::parse_root_qdisc(&json)
            .map_err(|why| ReplayError::Invalid(format!("router host, {dev}: {why}")))
    }

    /// A lab router made ready for mimic's netem pipes: its interfaces bridged, its root
    /// qdiscs the kernel's default (mimic's previous installation removed; another is an
    /// error). The execs it took.
    fn ready_router(&mut self) -> Result<usize, ReplayError> {
        let mut execs = 0;
        if self.backend == Backend::Netem {
            if let Router::Namespace { ns, bridge } = &mut self.router {
                // the veths of the emu namespace, joined as mimic's datapath would join them
                let br = format!("{}-br", ns.trim_end_matches("-emu"));
                let sh = format!(
                    "ip link add {br} type bridge stp_state 0 forward_delay 0 && ip link set {c} master {br} && ip link set {s} master {br} && ip link set {br} up",
                    c = self.ropts.client_if,
                    s = self.ropts.server_if
                );
                let out = mimic_netemu::netns::command(ns, "sh", ["-c", &sh])
                    .output()
                    .map_err(|e| ReplayError::Io(format!("sh: {e}")))?;
                *bridge = Some(br);
                if !out.status.success() {
                    return Err(ReplayError::Invalid(format!(
                        "bridging the router's interfaces: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    )));
                }
            }
            if let Router::Guest(_) = &self.router {
                // the guest's NICs on its bridge (as `lab up` left them; a replay through
                // mimic's emulator that was killed may have left them off it)
                let (c, s) = (&self.ropts.client_if, &self.ropts.server_if);
                self.run(&[
                    "sh",
                    "-ec",
                    &format!("ip addr flush dev {c}; ip link set {c} master br0; ip link set {s} master br0"),
                ])?;
                execs += 1;
            }
            for dev in [&self.ropts.server_if, &self.ropts.client_if] {
                match self.root_qdisc(dev)? {
                    RootQdisc::KernelDefault(_) => {}
                    RootQdisc::Mimic => {
                        self.run(&[
                            "tc", "qdisc", "del", "dev", dev, "root", "handle", TC_HANDLE,
                        ])?;
                        execs += 1;
                    }
                    RootQdisc::Other { kind, handle } => {
                        return Err(render_err(RenderError::ForeignRoot {
                            dev: dev.clone(),
                            kind,
                            handle,
                        }))
                    }
                }
                execs += 1;
            }
        }
        Ok(execs)
    }

    /// Installs the pipes of `rules` (one pair per connection) in one go: the router's root
    /// qdiscs must be the kernel's default or mimic's (a previous installation, replaced).
    pub fn install(&mut self, rules: &[FlowRule]) -> Result<(), ReplayError> {
        let t0 = Instant::now();
        self.report.mode = PipeMode::All.as_str();
        if let Router::Remote { client, ids } = &mut self.router {
            self.installed = true;
            let mut execs = 0;
            for chunk in rules.chunks(REMOTE_CHUNK) {
                let got = client
                    .install_pipes(chunk)
                    .map_err(|e| ReplayError::Invalid(format!("router: {e}")))?;
                ids.extend(got);
                execs += 1;
            }
            let r = &mut self.report;
            r.pipes = rules.len() * 2;
            r.execs = execs;
            r.install_s = t0.elapsed().as_secs_f64();
            self.note_delack(rules);
            return Ok(());
        }
        let table = PipeTable {
            flows: rules.to_vec(),
            ..PipeTable::default()
        };
        let script = render::render(self.backend, &table, &self.ropts).map_err(render_err)?;
        let mut execs = self.ready_router()?;
        self.installed = true;
        match self.backend {
            Backend::Netem => {
                let lines: Vec<String> = script.commands.iter().map(|c| c[1..].join(" ")).collect();
                execs += self.run_batch(&lines)?;
            }
            Backend::Dummynet => {
                for c in &script.cleanup {
                    let argv: Vec<&str> = c.iter().map(String::as_str).collect();
                    let _ = self.run(&argv);
                    execs += 1;
                }
                for c in &script.commands {
                    let argv: Vec<&str> = c.iter().map(String::as_str).collect();
                    self.run(&argv)?;
                    execs += 1;
                }
                self.table = Some(table);
            }
        }
        let r = &mut self.report;
        r.pipes = rules.len() * 2;
        r.commands = script.commands.len();
        r.execs = execs;
        r.install_s = t0.elapsed().as_secs_f64();
        r.delack_left_out = script.ack_policies_left_out;
        self.warn_delack(rules.len());
        Ok(())
    }

    /// Counts the connections whose delayed-ACK shaping the kernel pipes leave out, and warns.
    fn note_delack(&mut self, rules: &[FlowRule]) {
        self.report.delack_left_out = rules
            .iter()
            .filter(|r| r.up.ack.is_some() || r.down.ack.is_some())
            .count();
        self.warn_delack(rules.len());
    }

    fn warn_delack(&self, n: usize) {
        let r = &self.report;
        if r.delack_left_out > 0 {
            tracing::warn!(
                "{} of {} connections replayed WITHOUT their delayed-ACK shaping: {} cannot thin ACKs (mimic's own emulator can); recorded in meta as emulator_unsupported",
                r.delack_left_out,
                n,
                r.backend
            );
        }
    }

    /// Per connection: readies the router (a lab router gets mimic's root qdiscs and hash
    /// tables; a remote router has them).
    pub fn begin_per_connection(&mut self, rules: &[FlowRule]) -> Result<(), ReplayError> {
        let t0 = Instant::now();
        self.report.mode = PipeMode::PerConnection.as_str();
        if self.backend != Backend::Netem {
            return Err(ReplayError::Invalid(
                "--kernel-pipes per-connection: only netem pipes are installed per connection"
                    .into(),
            ));
        }
        if !matches!(self.router, Router::Remote { .. }) {
            let mut execs = self.ready_router()?;
            let slots = SlotPipes::new(&self.ropts.client_if, &self.ropts.server_if);
            self.installed = true;
            let t = Instant::now();
            execs += self.run_batch(&slots.skeleton())?;
            self.first_batch = t.elapsed();
            self.slots = Some(slots);
            self.report.execs = execs;
        }
        self.installed = true;
        self.report.install_s = t0.elapsed().as_secs_f64();
        self.note_delack(rules);
        Ok(())
    }

    /// Per connection: installs the pipes of `rules` in one batch; their ids.
    fn install_slots(&mut self, rules: &[FlowRule]) -> Result<Vec<PipeId>, ReplayError> {
        if let Router::Remote { client, ids } = &mut self.router {
            let got = client
                .install_pipes(rules)
                .map_err(|e| ReplayError::Invalid(format!("router: {e}")))?;
            ids.extend(got.iter().copied());
            if got.len() != rules.len() {
                // (a connection without its pipe ids would never have its SYN let through)
                return Err(ReplayError::Invalid(format!(
                    "router: {} pipe ids for {} connections installed",
                    got.len(),
                    rules.len()
                )));
            }
            return Ok(got);
        }
        let slots = self.slots.as_mut().expect("begin_per_connection first");
        let (ids, lines) = slots.install(rules).map_err(render_err)?;
        if let Err(e) = self.run_batch(&lines) {
            if let Some(slots) = self.slots.as_mut() {
                slots.remove(&ids);
            }
            return Err(e);
        }
        Ok(ids)
    }

    /// Per connection, one slice's router call: removes the pipes `gone` and installs those of
    /// `rules` (their ids, in order). On a lab router both go in one `tc -force -batch`, the
    /// removals first (a freed slot can be taken again in the same batch), and tc's
    /// `Command failed -:N` lines say which line failed: a failed removal is returned beside
    /// the ids (its pipes go with the teardown), a failed install is the error (what of it got
    /// installed is removed again). A remote router gets two requests.
    fn apply_slice(
        &mut self,
        gone: &[PipeId],
        rules: &[FlowRule],
    ) -> Result<(Vec<PipeId>, Option<ReplayError>), ReplayError> {
        if matches!(self.router, Router::Remote { .. }) {
            let remove_err = if gone.is_empty() {
                None
            } else {
                self.remove_slots(gone).err()
            };
            let ids = if rules.is_empty() {
                Vec::new()
            } else {
                self.install_slots(rules)?
            };
            return Ok((ids, remove_err));
        }
        let slots = self.slots.as_mut().expect("begin_per_connection first");
        let (mut lines, _) = slots.remove(gone);
        let n_del = lines.len();
        let (ids, add) = match slots.install(rules) {
            Ok(x) => x,
            Err(e) => {
                let _ = self.run_batch_forced(&lines);
                return Err(render_err(e));
            }
        };
        lines.extend(add);
        let failed = self.run_batch_forced(&lines)?;
        let why = |(i, e): &(usize, String)| {
            ReplayError::Invalid(format!("router host: `tc {}`: {e}", lines[*i]))
        };
        if let Some(f) = failed.iter().find(|f| f.0 >= n_del) {
            let e = why(f);
            if let Some(slots) = self.slots.as_mut() {
                let (undo, _) = slots.remove(&ids);
                let _ = self.run_batch_forced(&undo);
            }
            return Err(e);
        }
        Ok((ids, failed.first().map(why)))
    }

    /// Runs `lines` with `tc -force -batch -` on a lab router (on past a failing line); the
    /// lines that failed (0-based) with tc's message. An error only when tc itself could not
    /// run or said nothing of which line failed.
    fn run_batch_forced(&self, lines: &[String]) -> Result<Vec<(usize, String)>, ReplayError> {
        if lines.is_empty() {
            return Ok(Vec::new());
        }
        let mut failed = Vec::new();
        match &self.router {
            Router::Namespace { ns, .. } => {
                let mut text = lines.join("\n");
                text.push('\n');
                let opts = ApplyOptions {
                    netns: Some(ns.clone()),
                    force: false,
                };
                let (code, stderr) =
                    render::tc_batch_status(&text, &opts, true).map_err(render_err)?;
                collect_failures(code, &stderr, 0, lines.len(), &mut failed)?;
            }
            Router::Guest(rec) => {
                let script = "printf '%s\\n' \"$@\" | tc -force -batch -";
                for r in guest_chunks(lines) {
                    let mut argv = vec!["sh", "-c", script, "sh"];
                    argv.extend(lines[r.clone()].iter().map(String::as_str));
                    let reply = guest_call(rec, &argv)?;
                    if let Some(e) = reply.error {
                        return Err(ReplayError::Invalid(format!("router host: tc -batch: {e}")));
                    }
                    collect_failures(reply.code(), &reply.stderr, r.start, r.len(), &mut failed)?;
                }
            }
            Router::Remote { .. } => unreachable!("a remote router runs no tc of ours"),
        }
        Ok(failed)
    }

    /// Per connection: removes pipes.
    fn remove_slots(&mut self, ids: &[PipeId]) -> Result<(), ReplayError> {
        if let Router::Remote { client, ids: mine } = &mut self.router {
            client
                .remove_pipes(ids)
                .map_err(|e| ReplayError::Invalid(format!("router: {e}")))?;
            for id in ids {
                mine.remove(id);
            }
            return Ok(());
        }
        let slots = self.slots.as_mut().expect("begin_per_connection first");
        let (lines, _) = slots.remove(ids);
        // every line is tried: one whose object is gone already fails alone
        match self.run_batch_forced(&lines)?.first() {
            None => Ok(()),
            Some((i, e)) => Err(ReplayError::Invalid(format!(
                "router host: `tc {}`: {e}",
                lines[*i]
            ))),
        }
    }

    /// Per connection, before the clients start: installs the pipes of the connections due
    /// first — those within the first lead time after the first SYN — in one batch, and again
    /// for the connections a longer lead takes in while three times a batch's time as if the
    /// router were loaded ([`LOADED`]) exceeds the lead (at most [`PRIME_ROUNDS`] batches; the
    /// replay's lead starts at the window covered); sorts `due` by start and returns how long
    /// it took, or stops at `stop`. The caller delays every start by that, so these pipes are in before their SYNs
    /// however slow a batch is, and the replay's lead starts from install batches measured on
    /// this router rather than from the skeleton's (a TCG guest's install batches took
    /// 0.3–1.4 s against its skeleton's 0.4 s, and 8–14 of the first 100 connections' pipes
    /// came late while the lead grew towards them).
    pub fn prime(&mut self, due: &mut [Due], stop: &AtomicBool) -> Result<Duration, ReplayError> {
        let t = Instant::now();
        due.sort_by_key(|d| d.start);
        let Some(first) = due.first().map(|d| d.start) else {
            return Ok(Duration::ZERO);
        };
        let mut lead = LEAD_MIN.max(self.first_batch * 3);
        let mut next = 0;
        for _ in 0..PRIME_ROUNDS {
            if stop.load(Ordering::Relaxed) {
                return Err(ReplayError::Interrupted);
            }
            let end = next + due[next..].partition_point(|d| d.start <= first + lead);
            self.primed.covered = lead;
            if end == next {
                break;
            }
            let rules: Vec<FlowRule> = due[next..end].iter().map(|d| d.rule.clone()).collect();
            let tb = Instant::now();
            let (got, _) = self.apply_slice(&[], &rules)?;
            let took = tb.elapsed();
            tracing::debug!(
                "kernel pipes: {} installs before the replay in {:.0} ms (lead {:.0} ms)",
                end - next,
                took.as_secs_f64() * 1e3,
                lead.as_secs_f64() * 1e3
            );
            self.report.router_calls += 1;
            self.primed.batches.push(took);
            self.primed
                .ids
                .extend(due[next..end].iter().map(|d| d.index).zip(got));
            next = end;
            // the lead the replay will start from: this batch as if the router were loaded
            let want = took * LOADED * 3;
            if want <= lead {
                break;
            }
            lead = want;
        }
        Ok(t.elapsed())
    }

    /// Per connection: installs each connection's pipes ahead of its SYN (batches of the
    /// connections due within the lead time, once a slice) and removes them [`LINGER`] after
    /// `done` says the connection closed; returns when `done` is closed (every client has
    /// finished) and everything it installed is removed, or `stop` is set. An install or
    /// removal that fails sets `abort` (the clients stop) and ends it with the error.
    pub fn run_per_connection(
        &mut self,
        mut due: Vec<Due>,
        done: Receiver<usize>,
        gate: &PipeGate,
        stop: &AtomicBool,
        abort: &AtomicBool,
    ) -> Result<(), ReplayError> {
        let mut release = Release {
            gate,
            abort,
            ok: false,
        };
        let r = self.schedule(&mut due, done, gate, stop);
        release.ok = r.is_ok();
        r
    }

    fn schedule(
        &mut self,
        due: &mut [Due],
        done: Receiver<usize>,
        gate: &PipeGate,
        stop: &AtomicBool,
    ) -> Result<(), ReplayError> {
        due.sort_by_key(|d| d.start);
        let linger: HashMap<usize, Duration> = due
            .iter()
            .map(|d| {
                let owd = Duration::from_nanos(d.rule.up.delay + d.rule.down.delay);
                (d.index, LINGER + owd)
            })
            .collect();
        let mut ids: HashMap<usize, PipeId> = HashMap::new();
        let mut removals: VecDeque<(Instant, usize)> = VecDeque::new();
        let mut lead = LeadTime::new(LEAD_MIN.max(self.first_batch * 3));
        let mut clients_done = false;
        let mut samples = Samples::default();
        // what `prime` installed: the first connections in SYN order
        let primed = std::mem::take(&mut self.primed);
        let mut next = primed.ids.len();
        debug_assert!(due[..next]
            .iter()
            .zip(&primed.ids)
            .all(|(d, (i, _))| d.index == *i));
        if !primed.batches.is_empty() {
            lead.seed(&primed.batches, primed.covered);
        }
        for took in &primed.batches {
            let ms = took.as_secs_f64() * 1e3;
            samples.install.push(ms);
            self.report.batches += 1;
            self.report.batch_max_ms = self.report.batch_max_ms.max(ms);
        }
        self.report.primed = next as u64;
        self.report.pipes += next * 2;
        gate.open(primed.ids.iter().map(|(i, _)| *i));
        ids.extend(primed.ids);
        self.report.max_installed = ids.len();
        let t_all = Instant::now();
        loop {
            if stop.load(Ordering::Relaxed) {
                return Err(ReplayError::Interrupted);
            }
            let now = Instant::now();
            // connections closed: their pipes go after a linger
            loop {
                match done.try_recv() {
                    Ok(i) => {
                        removals.push_back((now + linger.get(&i).copied().unwrap_or(LINGER), i))
                    }
                    Err(std::sync::mpsc::TryRecvError::Empty) => break,
                    Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                        clients_done = true;
                        break;
                    }
                }
            }
            let mut gone = Vec::new();
            let mut still = VecDeque::new();
            for (at, i) in removals.drain(..) {
                if at <= now {
                    if let Some(id) = ids.remove(&i) {
                        gone.push(id);
                        samples.lag.push((now - at).as_secs_f64() * 1e3);
                    }
                } else {
                    still.push_back((at, i));
                }
            }
            removals = still;
            // installs due within the lead time (and this slice)
            let horizon = now + lead.now() + SLICE;
            let end = next + due[next..].partition_point(|d| d.start <= horizon);
            if end > next || !gone.is_empty() {
                let rules: Vec<FlowRule> = due[next..end].iter().map(|d| d.rule.clone()).collect();
                // one router call for both: the removals first, so their slots can be taken
                let t = Instant::now();
                let (got, remove_err) = self.apply_slice(&gone, &rules)?;
                let at = Instant::now();
                let took = at - t;
                let ms = took.as_secs_f64() * 1e3;
                lead.observe(took);
                // how long before its SYN the batch's first connection got its pipes
                // (negative: after)
                let slack_ms = due[next..end].first().map_or(f64::NAN, |d| {
                    if d.start >= at {
                        (d.start - at).as_secs_f64() * 1e3
                    } else {
                        -(at - d.start).as_secs_f64() * 1e3
                    }
                });
                tracing::debug!(
                    "kernel pipes: {} removals, {} installs in {ms:.0} ms (first SYN {slack_ms:.0} ms after); lead {:.0} ms",
                    gone.len(),
                    end - next,
                    lead.now().as_secs_f64() * 1e3
                );
                let r = &mut self.report;
                r.router_calls += 1;
                if !gone.is_empty() {
                    samples.remove.push(ms);
                    if let Some(e) = remove_err {
                        r.remove_errors += gone.len() as u64;
                        tracing::warn!("removing {} connections' kernel pipes: {e}", gone.len());
                    }
                }
                if end > next {
                    samples.install.push(ms);
                    r.batches += 1;
                    r.batch_max_ms = r.batch_max_ms.max(ms);
                    for (d, id) in due[next..end].iter().zip(got) {
                        if at > d.start {
                            r.late_installs += 1;
                        }
                        ids.insert(d.index, id);
                    }
                    r.pipes += (end - next) * 2;
                    r.max_installed = r.max_installed.max(ids.len());
                    gate.open(due[next..end].iter().map(|d| d.index));
                    next = end;
                }
            }
            if clients_done && removals.is_empty() {
                // the connections that never reported (failed to start) go too
                let rest: Vec<PipeId> = ids.drain().map(|(_, id)| id).collect();
                if !rest.is_empty() {
                    if let Err(e) = self.remove_slots(&rest) {
                        self.report.remove_errors += rest.len() as u64;
                        tracing::warn!("removing {} connections' kernel pipes: {e}", rest.len());
                    }
                }
                break;
            }
            match done.recv_timeout(SLICE) {
                Ok(i) => removals.push_back((
                    Instant::now() + linger.get(&i).copied().unwrap_or(LINGER),
                    i,
                )),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    clients_done = true;
                    if next < due.len() {
                        // the clients ended before every connection was due (interrupted)
                        next = due.len();
                    }
                }
            }
        }
        self.report.lead_ms = lead.now().as_secs_f64() * 1e3;
        let (waits, wait_max) = gate.waits();
        self.report.syn_waits = waits;
        self.report.syn_wait_max_ms = wait_max.as_secs_f64() * 1e3;
        samples.summarize(&mut self.report);
        tracing::info!(
            "kernel pipes per connection: {} connections in {} batches ({} before the replay began; slowest {:.1} ms, lead {:.0} ms), at most {} at once, {} installed after their SYN was due ({} SYNs held for them, at most {:.1} ms), over {:.1} s",
            self.report.pipes / 2,
            self.report.batches,
            self.report.primed,
            self.report.batch_max_ms,
            self.report.lead_ms,
            self.report.max_installed,
            self.report.late_installs,
            self.report.syn_waits,
            self.report.syn_wait_max_ms,
            t_all.elapsed().as_secs_f64()
        );
        if self.report.late_installs > 0 {
            tracing::warn!(
                "{} connections' kernel pipes were installed after their SYN was due; {} SYNs waited for them, up to {:.1} ms late (their start lateness); recorded in meta as emulator_late_installs and emulator_syn_waits",
                self.report.late_installs,
                self.report.syn_waits,
                self.report.syn_wait_max_ms
            );
        }
        Ok(())
    }

    /// Removes what [`KernelPipes::install`] put on the router host (only mimic's root qdisc,
    /// its bridge; dummynet: its rule set and pipes).
    pub fn remove(&mut self) -> Result<(), ReplayError> {
        if !self.installed {
            return Ok(());
        }
        let t0 = Instant::now();
        self.installed = false;
        let mut first_err = None;
        if let Router::Remote { client, ids } = &mut self.router {
            let all: Vec<PipeId> = ids.drain().collect();
            for chunk in all.chunks(REMOTE_CHUNK) {
                if let Err(e) = client.remove_pipes(chunk) {
                    first_err.get_or_insert(ReplayError::Invalid(format!("router: {e}")));
                }
            }
            self.report.teardown_s = Some(t0.elapsed().as_secs_f64());
            return match first_err {
                Some(e) => Err(e),
                None => Ok(()),
            };
        }
        self.slots = None;
        match self.backend {
            Backend::Netem => {
                for dev in [self.ropts.server_if.clone(), self.ropts.client_if.clone()] {
                    if let Ok(RootQdisc::Mimic) = self.root_qdisc(&dev) {
                        if let Err(e) = self.run(&[
                            "tc", "qdisc", "del", "dev", &dev, "root", "handle", TC_HANDLE,
                        ]) {
                            first_err.get_or_insert(e);
                        }
                    }
                }
            }
            Backend::Dummynet => {
                let s = render::teardown(self.backend, self.table.as_ref(), &self.ropts);
                if let Ok(s) = s {
                    for c in &s.cleanup {
                        let argv: Vec<&str> = c.iter().map(String::as_str).collect();
                        let _ = self.run(&argv);
                    }
                }
            }
        }
        if let Router::Namespace {
            ns,
            bridge: Some(br),
        } = &self.router
        {
            let _ = mimic_netemu::netns::command(ns, "ip", ["link", "del", br.as_str()]).output();
        }
        self.report.teardown_s = Some(t0.elapsed().as_secs_f64());
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for KernelPipes {
    fn drop(&mut self) {
        if let Err(e) = self.remove() {
            tracing::warn!("removing the kernel pipes: {e}");
        }
    }
}

/// Runs `argv` on a router guest (waiting at most [`GUEST_CMD_LIMIT`], for another caller of
/// its command channel included); its reply, whatever the exit status.
fn guest_call(rec: &GuestRecord, argv: &[&str]) -> Result<guest::ExecReply, ReplayError> {
    let err = |e: guest::GuestError| ReplayError::Invalid(format!("router host: {e}"));
    if !guest::alive(rec.pid) {
        return Err(ReplayError::Invalid(format!(
            "router host: QEMU (pid {}) is not running",
            rec.pid
        )));
    }
    let t0 = Instant::now();
    let mut a =
        guest::Agent::connect_within(&rec.agent, &rec.netns, Some(GUEST_CMD_LIMIT)).map_err(err)?;
    let left = GUEST_CMD_LIMIT
        .saturating_sub(t0.elapsed())
        .max(Duration::from_millis(100));
    a.call(argv, Some(left), Some(left)).map_err(err)
}

/// The failed lines of one `tc -force -batch` run of `n` lines (the first of them line `from`
/// of the whole), 0-based in the whole, into `failed`. A run that failed without naming a
/// line (tc missing, killed) is an error.
/// `lines` cut into consecutive runs of at most [`GUEST_BATCH_BYTES`] (one line a run where a
/// line alone is longer), each one guest command's arguments; at least one run.
fn guest_chunks(lines: &[String]) -> Vec<std::ops::Range<usize>> {
    let mut chunks = Vec::new();
    let (mut from, mut bytes) = (0, 0);
    for (i, l) in lines.iter().enumerate() {
        if bytes + l.len() > GUEST_BATCH_BYTES && i > from {
            chunks.push(from..i);
            (from, bytes) = (i, 0);
        }
        bytes += l.len() + 1;
    }
    chunks.push(from..lines.len());
    chunks
}

fn collect_failures(
    code: i32,
    stderr: &str,
    from: usize,
    n: usize,
    failed: &mut Vec<(usize, String)>,
) -> Result<(), ReplayError> {
    if code == 0 {
        return Ok(());
    }
    let f = mimic_netemu::kernel_router::batch_failures(stderr);
    if f.is_empty() {
        return Err(ReplayError::Invalid(format!(
            "router host: tc -force -batch exited {code}: {}",
            stderr.trim()
        )));
    }
    failed.extend(
        f.into_iter()
            .filter(|(line, _)| (1..=n).contains(line))
            .map(|(line, why)| (from + line - 1, why)),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_chunks_stay_under_the_byte_limit_and_cover_every_line_once() {
        let line = "x".repeat(1000);
        let lines = vec![line; 1200]; // about 1.2 MB: three runs of at most 512 KiB
        let chunks = guest_chunks(&lines);
        assert_eq!(chunks.len(), 3);
        assert_eq!(chunks.first().unwrap().start, 0);
        assert_eq!(chunks.last().unwrap().end, lines.len());
        for w in chunks.windows(2) {
            assert_eq!(w[0].end, w[1].start);
        }
        for r in &chunks {
            assert!(
                lines[r.clone()].iter().map(|l| l.len() + 1).sum::<usize>()
                    <= GUEST_BATCH_BYTES + 1
            );
        }
        // a line longer than the limit goes alone
        let long = vec!["y".repeat(GUEST_BATCH_BYTES + 1), "z".into()];
        assert_eq!(guest_chunks(&long), vec![0..1, 1..2]);
    }

    fn pipes(backend: Backend) -> KernelPipes {
        KernelPipes {
            backend,
            router: Router::Namespace {
                ns: "t-emu".into(),
                bridge: None,
            },
            ropts: RenderOptions::new("c", "s"),
            table: None,
            installed: false,
            slots: None,
            first_batch: Duration::ZERO,
            primed: Primed::default(),
            report: KernelInstall::default(),
        }
    }

    /// The 2,000-connection run of the lead rule's documentation: one 12 s call raised the
    /// lead to 36 s at once; now it climbs by at most a call's time per call, and a slow call
    /// past the window lets it come down.
    #[test]
    fn the_lead_time_follows_recent_calls_and_never_jumps() {
        let ms = Duration::from_millis;
        let mut l = LeadTime::new(LEAD_MIN);
        assert_eq!(l.now(), LEAD_MIN);
        l.observe(ms(100));
        assert_eq!(l.now(), LEAD_MIN, "three fast calls stay below the floor");
        l.observe(ms(400));
        assert_eq!(
            l.now(),
            ms(900),
            "grows by one call's time toward 3 x 400 ms"
        );
        l.observe(ms(300));
        assert_eq!(l.now(), ms(1200), "3 x the slowest of the window");
        l.observe(ms(12_000));
        assert_eq!(l.now(), ms(13_200), "not 36 s at once");
        l.observe(ms(500));
        assert_eq!(l.now(), ms(13_700));
        for _ in 0..LEAD_WINDOW - 1 {
            l.observe(ms(500));
        }
        assert_eq!(l.now(), ms(1500), "the slow call is out of the window");
        // a slow first batch (the skeleton's) sets the floor
        let l = LeadTime::new(LEAD_MIN.max(ms(400) * 3));
        assert_eq!(l.now(), ms(1200));
    }

    #[test]
    fn batches_before_the_replay_start_the_lead_at_what_they_covered_and_count_as_loaded() {
        let ms = Duration::from_millis;
        let mut l = LeadTime::new(LEAD_MIN);
        l.seed(&[ms(500), ms(300)], ms(3000));
        assert_eq!(
            l.now(),
            ms(3000),
            "the window already installed, no jump past it"
        );
        // a fast call: the seeds (as loaded, 1,000 ms) keep the target at 3 s
        l.observe(ms(100));
        assert_eq!(l.now(), ms(3000));
        // what prime could not cover is climbed to step by step
        let mut l = LeadTime::new(LEAD_MIN);
        l.seed(&[ms(2000)], ms(1500));
        assert_eq!(l.now(), ms(1500));
        l.observe(ms(200));
        assert_eq!(l.now(), ms(1700), "one call's time at a time toward 12 s");
        // the replay's own fast calls bring it down once the seeds are out of the window
        let mut l = LeadTime::new(LEAD_MIN);
        l.seed(&[ms(500), ms(300)], ms(3000));
        for _ in 0..LEAD_WINDOW - 2 {
            l.observe(ms(100));
        }
        assert_eq!(l.now(), ms(500) * LOADED * 3);
        l.observe(ms(100));
        assert_eq!(l.now(), ms(300) * LOADED * 3);
        l.observe(ms(100));
        assert_eq!(l.now(), LEAD_MIN);
    }

    #[test]
    fn a_forced_batch_names_the_lines_that_failed_in_the_whole() {
        let err = "RTNETLINK answers: No such file or directory\nCommand failed -:2\nWarning: something\nError: Exclusivity flag on, cannot modify.\nCommand failed -:5\n";
        let mut f = Vec::new();
        collect_failures(0, "", 0, 5, &mut f).unwrap();
        assert!(f.is_empty(), "exit 0: nothing failed");
        collect_failures(1, err, 10, 5, &mut f).unwrap();
        assert_eq!(
            f,
            [
                (
                    11,
                    "RTNETLINK answers: No such file or directory".to_string()
                ),
                (14, "Error: Exclusivity flag on, cannot modify.".to_string())
            ]
        );
        // tc missing or killed: no line named, an error
        let e = collect_failures(127, "sh: tc: not found", 0, 3, &mut f).unwrap_err();
        assert!(e.to_string().contains("tc: not found"), "{e}");
    }

    #[test]
    fn auto_installs_short_workloads_at_once_and_long_ones_per_connection() {
        let k = pipes(Backend::Netem);
        let m = |req, n, agents| k.mode(req, n, agents);
        assert_eq!(m(PipeMode::Auto, 200, false).unwrap(), PipeMode::All);
        assert_eq!(
            m(PipeMode::Auto, AUTO_ALL_AT_ONCE_MAX, false).unwrap(),
            PipeMode::All
        );
        assert_eq!(
            m(PipeMode::Auto, AUTO_ALL_AT_ONCE_MAX + 1, false).unwrap(),
            PipeMode::PerConnection
        );
        assert_eq!(
            m(PipeMode::PerConnection, 5, false).unwrap(),
            PipeMode::PerConnection
        );
        assert_eq!(m(PipeMode::All, 70_000, false).unwrap(), PipeMode::All);
        // agents: all at once, and per-connection asked for is an error naming why
        assert_eq!(m(PipeMode::Auto, 70_000, true).unwrap(), PipeMode::All);
        let e = m(PipeMode::PerConnection, 10, true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--agents"), "{e}");
        let d = pipes(Backend::Dummynet);
        assert_eq!(
            d.mode(PipeMode::Auto, 70_000, false).unwrap(),
            PipeMode::All
        );
        let e = d
            .mode(PipeMode::PerConnection, 10, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("dummynet"), "{e}");
    }

    #[test]
    fn per_connection_meta_names_the_mode_and_the_late_installs() {
        let k = KernelInstall {
            backend: "netem",
            mode: "per-connection",
            late_installs: 3,
            syn_waits: 2,
            syn_wait_max_ms: 412.04,
            max_installed: 84,
            batches: 45,
            batch_max_ms: 224.51,
            lead_ms: 673.5,
            ..KernelInstall::default()
        };
        let m: std::collections::HashMap<_, _> = k.meta().into_iter().collect();
        assert_eq!(m["emulator_pipe_mode"], "per-connection");
        assert_eq!(m["emulator_late_installs"], "3");
        assert_eq!(m["emulator_syn_waits"], "2");
        assert_eq!(m["emulator_syn_wait_max_ms"], "412.0");
        assert_eq!(m["emulator_max_installed"], "84");
        assert_eq!(m["emulator_install_batch_max_ms"], "224.5");
        assert_eq!(m["emulator_install_lead_ms"], "674");
        assert_eq!(m["emulator_remove_errors"], "0");
        let all = KernelInstall {
            mode: "all",
            ..KernelInstall::default()
        };
        let m: std::collections::HashMap<_, _> = all.meta().into_iter().collect();
        assert_eq!(m["emulator_pipe_mode"], "all");
        assert!(!m.contains_key("emulator_late_installs"));
        assert!(!m.contains_key("emulator_syn_waits"));
    }

    #[test]
    fn a_pipe_gate_opens_per_connection_and_counts_the_syns_it_held() {
        let g = PipeGate::new(3);
        assert!(!g.is_open(0) && !g.is_open(2));
        g.open([2]);
        assert!(g.is_open(2) && !g.is_open(1));
        // an index the gate was not made for has no gate
        assert!(g.is_open(7));
        g.open([7]);
        g.held(Duration::from_micros(1_500));
        g.held(Duration::from_micros(900));
        assert_eq!(g.waits(), (2, Duration::from_micros(1_500)));
        g.open_all();
        assert!((0..3).all(|i| g.is_open(i)));
    }

    #[test]
    fn a_held_syn_goes_when_its_gate_opens_not_at_the_next_poll() {
        let g = std::sync::Arc::new(PipeGate::new(2));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let w = {
                let g = g.clone();
                tokio::spawn(async move {
                    let t = Instant::now();
                    g.wait(1, Duration::from_secs(30)).await;
                    t.elapsed()
                })
            };
            tokio::time::sleep(Duration::from_millis(20)).await;
            // another connection's gate: still held
            g.open([0]);
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert!(!w.is_finished());
            // opened from the scheduler's thread
            let opener = std::thread::spawn({
                let g = g.clone();
                move || g.open([1])
            });
            let waited = tokio::time::timeout(Duration::from_secs(10), w)
                .await
                .expect("woken by the open, long before its 30 s poll")
                .unwrap();
            opener.join().unwrap();
            assert!(waited >= Duration::from_millis(40), "{waited:?}");
        });
    }

    #[test]
    fn a_scheduler_that_fails_or_panics_lets_every_held_syn_go_and_stops_the_clients() {
        // a panic inside the scheduler
        let g = PipeGate::new(4);
        let abort = AtomicBool::new(false);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _release = Release {
                gate: &g,
                abort: &abort,
                ok: false,
            };
            panic!("the scheduler panicked");
        }));
        assert!(r.is_err());
        assert!(abort.load(Ordering::Relaxed));
        assert!((0..4).all(|i| g.is_open(i)));
        // a scheduler that finished leaves the gates and the clients alone
        let g = PipeGate::new(4);
        let abort = AtomicBool::new(false);
        drop(Release {
            gate: &g,
            abort: &abort,
            ok: true,
        });
        assert!(!abort.load(Ordering::Relaxed));
        assert!(!g.is_open(0));
    }

    #[test]
    fn what_kernel_pipes_left_out_is_named_in_meta() {
        let mut k = KernelInstall {
            backend: "netem",
            router: "guest t-emu (kernel 6.1.0-56-amd64)".into(),
            pipes: 400,
            install_s: 0.9984,
            execs: 3,
            ..KernelInstall::default()
        };
        assert_eq!(k.unsupported(), "");
        k.handshake_wait_left_out = 4;
        assert_eq!(k.unsupported(), "handshake_wait:4 connections");
        k.handshake_wait_left_out = 0;
        k.delack_left_out = 103;
        assert_eq!(k.unsupported(), "delack:103 connections");
        assert_eq!(
            k.meta(),
            [
                (
                    "emulator_router",
                    "guest t-emu (kernel 6.1.0-56-amd64)".to_string()
                ),
                ("emulator_pipes", "400".to_string()),
                ("emulator_install_s", "0.998".to_string()),
                ("emulator_install_execs", "3".to_string()),
            ]
        );
    }
}
