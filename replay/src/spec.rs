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
use std::time::Duration;

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
    /// `--capture-iface IF`: where a controller's `capture_start` captures (default: the
    /// interface that holds the listen address).
    pub capture_iface: Option<String>,
    /// `--capture-dir DIR`: where those captures are kept until the controller fetched them
    /// (default: a directory of serve's under the temporary directory).
    pub capture_dir: Option<PathBuf>,
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
            capture_iface: None,
            capture_dir: None,
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
        if let Some(i) = &self.capture_iface {
            a.value("--capture-iface", i);
        }
        if let Some(d) = &self.capture_dir {
            a.value("--capture-dir", d);
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
        if (self.capture_iface.is_some() || self.capture_dir.is_some()) && self.control.is_none() {
            return Err(
                "--capture-iface and --capture-dir need --control (a controller starts the capture)"
                    .into(),
            );
        }
        if self.metrics.is_some_and(|m| {
            m.port() == self.listen.port()
                && m.port() != 0
                && (m.ip() == self.listen.ip()
                    || m.ip().is_unspecified()
                    || self.listen.ip().is_unspecified())
        }) {
            return Err(format!(
                "--metrics and --listen both name port {}: give the metrics another port",
                self.listen.port()
            ));
        }
        Ok(())
    }
}

/// Where the roles run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// In the lab `name` (built for the replay and torn down after if it did not exist).
    Lab { name: String, keep: bool },
    /// Roles already running elsewhere; the client runs here.
    Remote {
        server: SocketAddr,
        server_control: ControlAddr,
        netemu: ControlAddr,
        /// The controller's PKI files (`mimic pki init`): ca.crt, controller.crt, controller.key.
        pki_dir: PathBuf,
        /// Where the replay is captured.
        capture: RemoteCapture,
        client_addrs: Vec<Ipv4Addr>,
    },
}

/// Where a remote replay is captured (`--vantage`).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum RemoteCapture {
    /// `--vantage server` (the default): `mimic serve` captures on its own host and hands the
    /// files over its control channel, so the replay is measured where an original from a
    /// tap in front of the server is.
    #[default]
    Server,
    /// `--vantage client --capture-iface IF`: captured on this (the client) host; response
    /// times carry about one more round trip than at the server.
    Client { iface: String },
}

impl RemoteCapture {
    /// `server` or `client`, as `meta.capture_vantage` writes it.
    pub fn vantage(&self) -> &'static str {
        match self {
            RemoteCapture::Server => "server",
            RemoteCapture::Client { .. } => "client",
        }
    }
}

/// When kernel pipes are installed (`--kernel-pipes`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PipeMode {
    /// All at once for short workloads (at most [`AUTO_ALL_AT_ONCE_MAX`] connections),
    /// per connection for longer ones.
    #[default]
    Auto,
    /// Every connection's pipes before the first SYN, removed after the last connection.
    All,
    /// Each connection's pipes ahead of its SYN, removed after it closes.
    PerConnection,
}

/// The most connections `--kernel-pipes auto` installs all at once.
pub const AUTO_ALL_AT_ONCE_MAX: usize = 2_000;

impl PipeMode {
    pub fn as_str(self) -> &'static str {
        match self {
            PipeMode::Auto => "auto",
            PipeMode::All => "all",
            PipeMode::PerConnection => "per-connection",
        }
    }
}

impl std::str::FromStr for PipeMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(PipeMode::Auto),
            "all" => Ok(PipeMode::All),
            "per-connection" => Ok(PipeMode::PerConnection),
            _ => Err(format!(
                "`{s}` is not a kernel pipe mode (auto, all or per-connection)"
            )),
        }
    }
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

/// The replay LAN's own round trip through the router host, unshaped (`--lan-rtt`): half of
/// it is taken off each direction's pipe delay, so that a replayed path's round trip is the
/// original's and not the original's plus the LAN's. mimic's datapath on a host adds 0.05-0.1
/// ms; a router guest under TCG 0.6-2.6 ms (this project's VMs), which put the analyzed min
/// RTT of a replay through netem pipes in the guest outside 10% or 2 ms for 12.5% of 200
/// connections.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LanRtt {
    /// Measured before the replay where mimic runs the client in a lab whose server host is a
    /// namespace (the minimum of 20 pings from the client host to the server through the
    /// router, unshaped); 0 elsewhere (remote roles, a server guest).
    #[default]
    Auto,
    /// Given (µs); 0 takes nothing off.
    Fixed(u64),
}

impl std::fmt::Display for LanRtt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LanRtt::Auto => f.write_str("auto"),
            LanRtt::Fixed(us) => f.write_str(&mimic_netemu::units::fmt_duration(*us * 1000)),
        }
    }
}

impl std::str::FromStr for LanRtt {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(LanRtt::Auto),
            "0" => Ok(LanRtt::Fixed(0)),
            d => mimic_netemu::units::parse_duration(d)
                .map(|ns| LanRtt::Fixed((ns + 500) / 1000))
                .map_err(|e| {
                    format!("`{d}` is not a round trip (auto, 0 or a duration such as 1.5ms): {e}")
                }),
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
    /// `--agents`: the client agents that open the connections instead of this process (none:
    /// the client runs here).
    pub agents: Vec<AgentTarget>,
    /// How long each call to an agent waits for its answer (`--agent-timeout`).
    pub agent_timeout: Duration,
    /// Which emulator carries the pipes (`--emulator`).
    pub emulator: Emulator,
    /// With kernel pipes: all at once or per connection (`--kernel-pipes`).
    pub kernel_pipes: PipeMode,
    /// The LAN's own round trip taken off the pipes' delays (`--lan-rtt`).
    pub lan_rtt: LanRtt,
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
            agents: Vec::new(),
            agent_timeout: crate::agent::DEFAULT_LIMIT,
            emulator: Emulator::Mimic,
            kernel_pipes: PipeMode::Auto,
            lan_rtt: LanRtt::Auto,
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
                capture,
                client_addrs,
            } => {
                a.value("--server", server.to_string());
                a.value("--server-control", server_control.to_string());
                a.value("--netemu", netemu.to_string());
                a.value("--pki", pki_dir);
                if let RemoteCapture::Client { iface } = capture {
                    a.value("--vantage", "client");
                    a.value("--capture-iface", iface);
                }
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
        if !self.agents.is_empty() {
            let list: Vec<String> = self.agents.iter().map(|t| t.to_string()).collect();
            a.value("--agents", list.join(","));
        }
        if self.agent_timeout != crate::agent::DEFAULT_LIMIT {
            a.value("--agent-timeout", self.agent_timeout.as_secs().to_string());
        }
        if self.emulator != Emulator::Mimic {
            a.value("--emulator", self.emulator.as_str());
        }
        if self.kernel_pipes != PipeMode::Auto {
            a.value("--kernel-pipes", self.kernel_pipes.as_str());
        }
        if self.lan_rtt != LanRtt::Auto {
            a.value("--lan-rtt", self.lan_rtt.to_string());
        }
        a.0
    }

    pub(crate) fn target_is_remote(&self) -> bool {
        matches!(self.target, Target::Remote { .. })
    }
}

/// A client agent of a replay (`--agents`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AgentTarget {
    /// A client host of the replay's lab (`cli`, `cli2`, …): the replay starts `mimic agent`
    /// there, on the host's address pool, and stops it at the end.
    LabHost(String),
    /// An agent already running (`mimic agent --control ADDR`): `HOST:PORT` (TCP),
    /// `tcp:HOST:PORT` or `unix:PATH`.
    Remote(ControlAddr),
}

impl std::str::FromStr for AgentTarget {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let lab_host = s == "cli"
            || s.strip_prefix("cli")
                .is_some_and(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()));
        if lab_host {
            return Ok(AgentTarget::LabHost(s.to_string()));
        }
        if s.starts_with("unix:") || s.starts_with("tcp:") {
            return s.parse().map(AgentTarget::Remote);
        }
        match s.rsplit_once(':') {
            Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok() => {
                Ok(AgentTarget::Remote(ControlAddr::Tcp(s.to_string())))
            }
            _ => Err(format!(
                "`{s}` is not an agent: HOST:PORT, tcp:HOST:PORT, unix:PATH, or a lab client host (cli, cli2, …)"
            )),
        }
    }
}

impl std::fmt::Display for AgentTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AgentTarget::LabHost(h) => f.write_str(h),
            AgentTarget::Remote(a) => write!(f, "{a}"),
        }
    }
}

/// Everything `mimic agent` (a client agent) is told on its command line, typed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentSpec {
    /// `--control`: where the controller reaches it.
    pub control: ControlAddr,
    /// `--pki DIR`: ca.crt, agent.crt, agent.key from `mimic pki init`.
    pub pki: PathBuf,
    /// `--client-addr IP|CIDR` (repeatable): the source addresses its connections may use
    /// (a prefix stands for its host addresses); they must be local to its host and routed
    /// back to it through the emulator.
    pub client_addrs: Vec<IpNet>,
    /// `--timer-cpus`: keep the client's timer thread on these CPUs.
    pub timer_cpus: Option<Vec<usize>>,
}

/// Why `a` cannot be the source of a TCP connection (the unspecified address, broadcast,
/// multicast), or `None` when it can.
pub fn unusable_source(a: Ipv4Addr) -> Option<&'static str> {
    if a.is_unspecified() {
        Some("the unspecified address (any address)")
    } else if a.is_broadcast() {
        Some("the broadcast address")
    } else if a.is_multicast() {
        Some("a multicast address")
    } else {
        None
    }
}

/// The most source addresses an agent takes (a /16).
pub const MAX_AGENT_ADDRS: usize = 65_536;

impl AgentSpec {
    pub fn new(control: ControlAddr, pki: PathBuf, client_addrs: Vec<IpNet>) -> AgentSpec {
        AgentSpec {
            control,
            pki,
            client_addrs,
            timer_cpus: None,
        }
    }

    /// The command line after the program name (`agent --control ADDR …`).
    pub fn to_args(&self) -> Vec<OsString> {
        let mut a = ArgList::new("agent");
        a.value("--control", self.control.to_string());
        a.value("--pki", &self.pki);
        for n in &self.client_addrs {
            a.value("--client-addr", n.to_string());
        }
        if let Some(c) = &self.timer_cpus {
            a.value("--timer-cpus", cpu::format_list(c));
        }
        a.0
    }

    /// The source addresses `client_addrs` stands for, in order (a prefix shorter than /31
    /// without its network and broadcast addresses).
    pub fn addresses(&self) -> Result<Vec<Ipv4Addr>, String> {
        let out = self.expand()?;
        if let Some((a, why)) = out
            .iter()
            .find_map(|&a| unusable_source(a).map(|why| (a, why)))
        {
            return Err(format!(
                "--client-addr {a} is {why}: no TCP connection comes from it; give addresses this host holds"
            ));
        }
        Ok(out)
    }

    fn expand(&self) -> Result<Vec<Ipv4Addr>, String> {
        let mut out = Vec::new();
        for n in &self.client_addrs {
            let std::net::IpAddr::V4(base) = n.addr else {
                return Err(format!("--client-addr {n}: only IPv4 is supported"));
            };
            let size = 1u64 << (32 - n.prefix as u32);
            if out.len() as u64 + size > MAX_AGENT_ADDRS as u64 + 2 {
                return Err(format!(
                    "--client-addr: more than {MAX_AGENT_ADDRS} addresses"
                ));
            }
            let first = u32::from(base) as u64 & !(size - 1);
            let (lo, hi) = if size > 2 {
                (first + 1, first + size - 2)
            } else {
                (first, first + size - 1)
            };
            out.extend((lo..=hi).map(|a| Ipv4Addr::from(a as u32)));
        }
        out.dedup();
        if out.is_empty() {
            return Err("an agent needs at least one --client-addr".into());
        }
        Ok(out)
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
        s.capture_iface = Some("eth1".into());
        s.validate().unwrap();
        assert_eq!(
            text(s.to_args())[9..],
            ["--capture-iface", "eth1"],
            "serve's capture interface"
        );
        s.control = None;
        s.pki = None;
        assert!(s.validate().unwrap_err().contains("--control"));
    }

    #[test]
    fn agents_are_lab_hosts_or_control_addresses() {
        let t = |s: &str| s.parse::<AgentTarget>();
        assert_eq!(t("cli"), Ok(AgentTarget::LabHost("cli".into())));
        assert_eq!(t("cli2"), Ok(AgentTarget::LabHost("cli2".into())));
        assert_eq!(
            t("10.0.0.5:7300"),
            Ok(AgentTarget::Remote("tcp:10.0.0.5:7300".parse().unwrap()))
        );
        assert_eq!(
            t("unix:/run/a.sock").unwrap().to_string(),
            "unix:/run/a.sock"
        );
        for bad in ["clix", "host", "10.0.0.5", "h:port", "unix:"] {
            assert!(t(bad).is_err(), "{bad}");
        }
        let mut a = AgentSpec::new(
            "tcp:0.0.0.0:7300".parse().unwrap(),
            "/p".into(),
            vec!["10.1.0.0/30".parse().unwrap(), "10.2.0.9".parse().unwrap()],
        );
        assert_eq!(
            a.addresses().unwrap(),
            [
                "10.1.0.1".parse::<Ipv4Addr>().unwrap(),
                "10.1.0.2".parse().unwrap(),
                "10.2.0.9".parse().unwrap()
            ]
        );
        a.client_addrs = vec!["10.0.0.0/8".parse().unwrap()];
        assert!(a.addresses().unwrap_err().contains("more than"));
        a.client_addrs.clear();
        assert!(a.addresses().is_err());
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
