//! Kernel pipes (`mimic replay --emulator netem|dummynet`): the replay's per-connection pipes,
//! the same [`FlowRule`]s mimic's own emulator would get, rendered by the netem/dummynet
//! renderer ([`mimic_netemu::render`]: an htb class + netem leaf per pipe, hashed u32 filters
//! keyed by the client address each connection will use) and installed with `tc` on the lab's
//! router host before the first SYN, removed after the last connection (and on any early end:
//! [`KernelPipes`] removes them when dropped).
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

use std::time::{Duration, Instant};

use mimic_netemu::engine::{FlowRule, PipeTable};
use mimic_netemu::guest::{self, GuestRecord};
use mimic_netemu::lab::LabInfo;
use mimic_netemu::render::{
    self, AckPolicies, ApplyOptions, Backend, Leaf, RenderError, RenderOptions, RootQdisc,
    TC_HANDLE,
};

use super::ReplayError;
use crate::spec::Emulator;

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
    /// Wall time of the teardown, seconds (None: not torn down yet).
    pub teardown_s: Option<f64>,
}

impl KernelInstall {
    /// The `meta` rows of a replay through kernel pipes.
    pub fn meta(&self) -> Vec<(&'static str, String)> {
        vec![
            ("emulator_router", self.router.clone()),
            ("emulator_pipes", self.pipes.to_string()),
            ("emulator_install_s", format!("{:.3}", self.install_s)),
            ("emulator_install_execs", self.execs.to_string()),
        ]
    }

    /// `delack:N connections`, or empty when nothing was left out.
    pub fn unsupported(&self) -> String {
        if self.delack_left_out == 0 {
            String::new()
        } else {
            format!("delack:{} connections", self.delack_left_out)
        }
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
    pub report: KernelInstall,
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
        };
        Ok(KernelPipes {
            backend,
            router,
            ropts,
            table: None,
            installed: false,
            report: KernelInstall {
                backend: emulator.as_str(),
                router: where_,
                ..KernelInstall::default()
            },
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
                let mut execs = 0;
                let mut group: Vec<&str> = Vec::new();
                let mut bytes = 0;
                for l in lines {
                    if bytes + l.len() > GUEST_BATCH_BYTES && !group.is_empty() {
                        self.run_group(script, &group)?;
                        execs += 1;
                        group.clear();
                        bytes = 0;
                    }
                    group.push(l);
                    bytes += l.len() + 1;
                }
                self.run_group(script, &group)?;
                Ok(execs + 1)
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

    /// Installs the pipes of `rules` (one pair per connection) in one go: the router's root
    /// qdiscs must be the kernel's default or mimic's (a previous installation, replaced).
    pub fn install(&mut self, rules: &[FlowRule]) -> Result<(), ReplayError> {
        let t0 = Instant::now();
        let table = PipeTable {
            flows: rules.to_vec(),
            ..PipeTable::default()
        };
        let script = render::render(self.backend, &table, &self.ropts).map_err(render_err)?;
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
        if r.delack_left_out > 0 {
            tracing::warn!(
                "{} of {} connections replayed WITHOUT their delayed-ACK shaping: {} cannot thin ACKs (mimic's own emulator can); recorded in meta as emulator_unsupported",
                r.delack_left_out,
                rules.len(),
                r.backend
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

#[cfg(test)]
mod tests {
    use super::*;

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
