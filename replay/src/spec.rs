//! The launch contracts of the two roles this crate plays: the server emulator
//! ([`ServeSpec`], `mimic serve`) and the client with its controller ([`ReplayOptions`],
//! `mimic replay`). Each holds every setting of its command, typed, and its `to_args` is the one
//! place that writes that command line; the CLI maps its flags to these specs, and the replay
//! starts roles from specs ([`crate::orchestrate`]), never from flag strings of its own.
//!
//! The server emulator tells its starter that it is up by answering on its control channel
//! ([`crate::control::ServeClient::connect`]) and reports its statistics over it; it writes no
//! ready file.

use std::ffi::OsString;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use mimic_core::cpu;
use mimic_netemu::classify::IpNet;
use mimic_netemu::control::ControlAddr;
use mimic_netemu::stack::StackProfile;

use crate::orchestrate::rates::Unestimated;
use crate::orchestrate::QueueOverride;
use crate::workload::{RequestTiming, Select};

/// Everything `mimic serve` is told on its command line, typed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServeSpec {
    /// `--listen`: where replayed connections arrive.
    pub listen: SocketAddr,
    /// `--control`: the control channel (needs `pki`).
    pub control: Option<ControlAddr>,
    /// `--pki DIR`: this role's control-channel certificates (`mimic pki init`).
    pub pki: Option<PathBuf>,
    /// `--allow CIDR` (repeatable): serve replay connections only from these client ranges.
    pub allow: Vec<IpNet>,
    /// `--timer-cpus`: keep the timer thread on these CPUs.
    pub timer_cpus: Option<Vec<usize>>,
    /// `--json`: statistics at exit as JSON.
    pub json: bool,
    /// `--metrics ADDR`.
    pub metrics: Option<SocketAddr>,
}

impl ServeSpec {
    /// `mimic serve --listen ADDR` with every other setting at its default.
    pub fn new(listen: SocketAddr) -> ServeSpec {
        ServeSpec {
            listen,
            control: None,
            pki: None,
            allow: Vec::new(),
            timer_cpus: None,
            json: false,
            metrics: None,
        }
    }

    /// The command line after the program name (`serve --listen ADDR …`).
    pub fn to_args(&self) -> Vec<OsString> {
        let mut a = ArgList::new("serve");
        a.value("--listen", self.listen.to_string());
        if let Some(c) = &self.control {
            a.value("--control", c.to_string());
        }
        if let Some(t) = &self.pki {
            a.value("--pki", t);
        }
        for n in &self.allow {
            a.value("--allow", n.to_string());
        }
        if let Some(c) = &self.timer_cpus {
            a.value("--timer-cpus", cpu::format_list(c));
        }
        if self.json {
            a.flag("--json");
        }
        if let Some(m) = self.metrics {
            a.value("--metrics", m.to_string());
        }
        a.0
    }

    /// Settings that cannot work together.
    pub fn validate(&self) -> Result<(), String> {
        if self.control.is_some() && self.pki.is_none() {
            return Err("--control needs --pki".into());
        }
        if self.timer_cpus.as_ref().is_some_and(|c| c.is_empty()) {
            return Err("--timer-cpus: an empty CPU list".into());
        }
        Ok(())
    }
}

/// Where the roles run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// In the lab `name` (built for the replay and torn down after if it did not exist).
    Lab { name: String, keep: bool },
    /// Roles already running elsewhere; the client runs here and the capture is taken on a
    /// local interface on the path to the server.
    Remote {
        server: SocketAddr,
        server_control: ControlAddr,
        netemu: ControlAddr,
        /// The controller's PKI files (`mimic pki init`): ca.crt, controller.crt, controller.key.
        pki_dir: PathBuf,
        capture_iface: String,
        client_addrs: Vec<Ipv4Addr>,
    },
}

/// Which emulator carries a replay's per-connection pipes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Emulator {
    /// mimic's own userspace datapath (`mimic netemu run`): every pipe feature, delayed-ACK
    /// shaping included.
    #[default]
    Mimic,
    /// Kernel pipes: htb + netem leaves + hashed u32 filters installed with `tc` on the
    /// router host (needs sch_netem there); no delayed-ACK shaping.
    Netem,
    /// Kernel pipes with `ipfw` dummynet (needs `ipfw` on the router host).
    Dummynet,
}

impl Emulator {
    pub fn as_str(self) -> &'static str {
        match self {
            Emulator::Mimic => "mimic",
            Emulator::Netem => "netem",
            Emulator::Dummynet => "dummynet",
        }
    }
}

impl std::fmt::Display for Emulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Emulator {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "mimic" => Ok(Emulator::Mimic),
            "netem" | "tc" => Ok(Emulator::Netem),
            "dummynet" | "ipfw" => Ok(Emulator::Dummynet),
            _ => Err(format!(
                "`{s}` is not an emulator (mimic, netem or dummynet)"
            )),
        }
    }
}

/// Everything `mimic replay` is told on its command line, typed: the client role and the
/// controller that starts (in the lab) or reaches (remote) the other roles.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayOptions {
    pub input: PathBuf,
    pub output: PathBuf,
    pub target: Target,
    pub stack: Option<StackProfile>,
    /// Queue lengths that replace Monkey's rate classes (either direction or both).
    pub queue: QueueOverride,
    pub request_timing: RequestTiming,
    /// What a connection without a bandwidth estimate gets (pooled, skip, unshaped).
    pub unestimated: Unestimated,
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
    /// Which emulator carries the pipes (`--emulator`).
    pub emulator: Emulator,
    /// The mimic executable that runs the roles (not a flag: the running one).
    pub exe: PathBuf,
}

pub const DEFAULT_TIME_SCALE: f64 = 1.0;
pub const DEFAULT_SEED: u64 = 1;
pub const DEFAULT_SERVER_PORT: u16 = 80;

impl ReplayOptions {
    /// A replay of `input` into `output` on `target`, every other setting at its default.
    pub fn new(input: PathBuf, output: PathBuf, target: Target, exe: PathBuf) -> ReplayOptions {
        ReplayOptions {
            input,
            output,
            target,
            stack: None,
            queue: QueueOverride::default(),
            request_timing: RequestTiming::default(),
            unestimated: Unestimated::default(),
            select: Select::Complete,
            limit: None,
            time_scale: DEFAULT_TIME_SCALE,
            seed: DEFAULT_SEED,
            server_port: DEFAULT_SERVER_PORT,
            keep_capture: None,
            cpu_split: true,
            emulator: Emulator::Mimic,
            exe,
        }
    }

    /// The command line after the program name (`replay INPUT -o OUTPUT …`) that replays
    /// these options (`exe` is the program itself, not an argument).
    pub fn to_args(&self) -> Vec<OsString> {
        let mut a = ArgList::new("replay");
        a.0.push(self.input.clone().into());
        a.value("-o", &self.output);
        match &self.target {
            Target::Lab { name, keep } => {
                a.value("--lab", name);
                if *keep {
                    a.flag("--keep-lab");
                }
            }
            Target::Remote {
                server,
                server_control,
                netemu,
                pki_dir,
                capture_iface,
                client_addrs,
            } => {
                a.value("--server", server.to_string());
                a.value("--server-control", server_control.to_string());
                a.value("--netemu", netemu.to_string());
                a.value("--pki", pki_dir);
                a.value("--capture-iface", capture_iface);
                for c in client_addrs {
                    a.value("--client-addr", c.to_string());
                }
            }
        }
        if let Some(s) = &self.stack {
            a.value("--stack", s.to_string());
        }
        if let Some(q) = self.queue.to_arg() {
            a.value("--queue", q);
        }
        if self.request_timing != RequestTiming::default() {
            a.value("--request-timing", self.request_timing.to_string());
        }
        if self.unestimated != Unestimated::default() {
            a.value("--unestimated", self.unestimated.to_string());
        }
        if self.select != Select::Complete {
            a.value("--select", self.select.to_string());
        }
        if let Some(n) = self.limit {
            a.value("--limit", n.to_string());
        }
        if self.time_scale != DEFAULT_TIME_SCALE {
            a.value("--time-scale", self.time_scale.to_string());
        }
        if self.seed != DEFAULT_SEED {
            a.value("--seed", self.seed.to_string());
        }
        if self.server_port != DEFAULT_SERVER_PORT {
            a.value("--server-port", self.server_port.to_string());
        }
        if let Some(k) = &self.keep_capture {
            a.value("--keep-capture", k);
        }
        if !self.cpu_split {
            a.flag("--no-cpu-split");
        }
        if self.emulator != Emulator::Mimic {
            a.value("--emulator", self.emulator.as_str());
        }
        a.0
    }

    pub(crate) fn target_is_remote(&self) -> bool {
        matches!(self.target, Target::Remote { .. })
    }
}

/// A command line under construction.
struct ArgList(Vec<OsString>);

impl ArgList {
    fn new(command: &str) -> ArgList {
        ArgList(vec![command.into()])
    }
    fn flag(&mut self, flag: &str) {
        self.0.push(flag.into());
    }
    fn value(&mut self, flag: &str, v: impl AsRef<std::ffi::OsStr>) {
        self.0.push(flag.into());
        self.0.push(v.as_ref().to_os_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(a: Vec<OsString>) -> Vec<String> {
        a.into_iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn serve_defaults_and_checks() {
        let mut s = ServeSpec::new("198.18.0.1:80".parse().unwrap());
        assert_eq!(text(s.to_args()), ["serve", "--listen", "198.18.0.1:80"]);
        s.control = Some("unix:/run/x.sock".parse().unwrap());
        assert!(s.validate().unwrap_err().contains("--pki"));
        s.pki = Some("/t".into());
        s.timer_cpus = Some(vec![0, 2, 3]);
        s.validate().unwrap();
        assert_eq!(
            text(s.to_args())[3..],
            [
                "--control",
                "unix:/run/x.sock",
                "--pki",
                "/t",
                "--timer-cpus",
                "0,2-3"
            ]
        );
    }

    #[test]
    fn replay_defaults_write_only_what_is_needed() {
        let o = ReplayOptions::new(
            "in.db".into(),
            "out.db".into(),
            Target::Lab {
                name: "t".into(),
                keep: false,
            },
            "/bin/mimic".into(),
        );
        assert_eq!(
            text(o.to_args()),
            ["replay", "in.db", "-o", "out.db", "--lab", "t"]
        );
    }

    #[test]
    fn emulator_names_parse_and_print_back() {
        for e in [Emulator::Mimic, Emulator::Netem, Emulator::Dummynet] {
            assert_eq!(e.to_string().parse::<Emulator>(), Ok(e));
        }
        assert_eq!("tc".parse::<Emulator>(), Ok(Emulator::Netem));
        assert_eq!("ipfw".parse::<Emulator>(), Ok(Emulator::Dummynet));
        let e = "netemu".parse::<Emulator>().unwrap_err();
        assert!(
            e.contains("`netemu`") && e.contains("mimic, netem or dummynet"),
            "{e}"
        );
    }
}
