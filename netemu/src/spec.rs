//! The network emulator role's launch contract: [`EmulatorSpec`] holds every setting of
//! `mimic netemu run`, and [`EmulatorSpec::to_args`] is the one place that writes its command
//! line. `mimic netemu run` maps its flags to this spec and runs it; `mimic replay` builds one
//! and starts a process from it.
//!
//! The emulator tells its starter that it is up by answering on its control channel
//! ([`crate::control::Client::connect`]), and reports its counters over it
//! ([`crate::control::Client::stats`]); it writes no ready file.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;

use crate::config::PipeConfig;
use crate::control::ControlAddr;
use crate::datapath::SpinRule;
use crate::engine::PipeTable;
use crate::lab::{LabError, LabInfo};
use crate::table::TableError;

/// Which interfaces the emulator bridges.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Bridge {
    /// `--lab NAME`: the lab's emu host's two interfaces; the process enters its namespace
    /// after binding the control channel. The lab also gives the default control address
    /// and PKI directory.
    Lab(String),
    /// `--client-if IF --server-if IF`: two interfaces of the namespace it starts in.
    Interfaces {
        client_if: String,
        server_if: String,
    },
}

/// The pipe that applies to traffic no prefix or flow rule matches.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum DefaultPipes {
    /// No default: unmatched traffic is forwarded unshaped.
    #[default]
    None,
    /// `--default PIPE`: the same pipe settings each way.
    Both(PipeConfig),
    /// `--default-up PIPE --default-down PIPE`.
    Split { up: PipeConfig, down: PipeConfig },
}

/// What carries the pipes (`--backend`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RouterBackend {
    /// mimic's own userspace datapath.
    #[default]
    Mimic,
    /// Kernel pipes (tc htb + netem) installed on request over the control channel; no
    /// datapath ([`crate::kernel_router`]).
    Netem,
}

impl std::str::FromStr for RouterBackend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "mimic" => Ok(RouterBackend::Mimic),
            "netem" => Ok(RouterBackend::Netem),
            other => Err(format!(
                "unknown router backend `{other}` (mimic or netem; dummynet pipes can only be rendered: `mimic netemu render --backend dummynet`)"
            )),
        }
    }
}

/// Everything `mimic netemu run` is told on its command line, typed.
#[derive(Clone, Debug, PartialEq)]
pub struct EmulatorSpec {
    pub bridge: Bridge,
    /// `--control`: where the control channel listens (default: the lab's socket).
    pub control: Option<ControlAddr>,
    /// `--pki DIR`: the control channel's certificates (default: the lab's PKI).
    pub pki: Option<PathBuf>,
    /// `--pipes FILE.toml`.
    pub pipes: Option<PathBuf>,
    pub default: DefaultPipes,
    /// `--spin-us`: busy-wait this long before each departure.
    pub spin_us: u64,
    /// `--spin-rule`: what limits the busy-waiting ([`SpinRule`]; `mimic replay` chooses
    /// [`SpinRule::BESIDE_HOSTS`] for the lab's router).
    pub spin_rule: SpinRule,
    /// `--rt-priority`: SCHED_FIFO priority of the datapath (0 = normal scheduling).
    pub rt_priority: i32,
    /// `--cpu`: pin the datapath thread.
    pub cpu: Option<usize>,
    /// `--buffers`: frame buffers for packets inside pipes.
    pub buffers: u32,
    /// `--max-flows`.
    pub max_flows: usize,
    /// `--seed`: base of the seeds of pipes that name none.
    pub seed: u64,
    /// `--json`: counters at exit as JSON.
    pub json: bool,
    /// `--metrics ADDR`.
    pub metrics: Option<SocketAddr>,
    /// `--backend`: mimic's datapath or kernel pipes.
    pub backend: RouterBackend,
    /// `--force`: kernel pipes may replace a root qdisc mimic did not install.
    pub force: bool,
}

/// A spec that cannot run, or a lab or pipe table it names that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum EmulatorSpecError {
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Lab(#[from] LabError),
    #[error(transparent)]
    Table(#[from] TableError),
}

pub const DEFAULT_SPIN_US: u64 = 100;
pub const DEFAULT_RT_PRIORITY: i32 = 10;
pub const DEFAULT_BUFFERS: u32 = 65_536;
pub const DEFAULT_MAX_FLOWS: usize = 262_144;
pub const DEFAULT_SEED: u64 = 1;

impl EmulatorSpec {
    /// `mimic netemu run` bridging `bridge`, every other setting at its default.
    pub fn new(bridge: Bridge) -> EmulatorSpec {
        EmulatorSpec {
            bridge,
            control: None,
            pki: None,
            pipes: None,
            default: DefaultPipes::None,
            spin_us: DEFAULT_SPIN_US,
            spin_rule: SpinRule::ROUTER,
            rt_priority: DEFAULT_RT_PRIORITY,
            cpu: None,
            buffers: DEFAULT_BUFFERS,
            max_flows: DEFAULT_MAX_FLOWS,
            seed: DEFAULT_SEED,
            json: false,
            metrics: None,
            backend: RouterBackend::Mimic,
            force: false,
        }
    }

    /// The command line after the program name (`netemu run …`) that makes `mimic netemu
    /// run` run this spec; settings at their default are left out.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = vec!["netemu".into(), "run".into()];
        let mut push = |flag: &str, v: Option<OsString>| {
            a.push(flag.into());
            a.extend(v);
        };
        match &self.bridge {
            Bridge::Lab(name) => push("--lab", Some(name.into())),
            Bridge::Interfaces {
                client_if,
                server_if,
            } => {
                push("--client-if", Some(client_if.into()));
                push("--server-if", Some(server_if.into()));
            }
        }
        if let Some(c) = &self.control {
            push("--control", Some(c.to_string().into()));
        }
        if let Some(t) = &self.pki {
            push("--pki", Some(t.into()));
        }
        if let Some(p) = &self.pipes {
            push("--pipes", Some(p.into()));
        }
        match &self.default {
            DefaultPipes::None => {}
            DefaultPipes::Both(p) => push("--default", Some(p.to_string().into())),
            DefaultPipes::Split { up, down } => {
                push("--default-up", Some(up.to_string().into()));
                push("--default-down", Some(down.to_string().into()));
            }
        }
        if self.spin_us != DEFAULT_SPIN_US {
            push("--spin-us", Some(self.spin_us.to_string().into()));
        }
        if self.spin_rule != SpinRule::ROUTER {
            push("--spin-rule", Some(self.spin_rule.to_string().into()));
        }
        if self.rt_priority != DEFAULT_RT_PRIORITY {
            push("--rt-priority", Some(self.rt_priority.to_string().into()));
        }
        if let Some(c) = self.cpu {
            push("--cpu", Some(c.to_string().into()));
        }
        if self.buffers != DEFAULT_BUFFERS {
            push("--buffers", Some(self.buffers.to_string().into()));
        }
        if self.max_flows != DEFAULT_MAX_FLOWS {
            push("--max-flows", Some(self.max_flows.to_string().into()));
        }
        if self.seed != DEFAULT_SEED {
            push("--seed", Some(self.seed.to_string().into()));
        }
        if self.json {
            push("--json", None);
        }
        if let Some(m) = self.metrics {
            push("--metrics", Some(m.to_string().into()));
        }
        if self.backend == RouterBackend::Netem {
            push("--backend", Some("netem".into()));
        }
        if self.force {
            push("--force", None);
        }
        a
    }

    /// The lab it bridges, if any.
    pub fn lab(&self) -> Result<Option<LabInfo>, EmulatorSpecError> {
        match &self.bridge {
            Bridge::Lab(name) => Ok(Some(LabInfo::for_name(name)?)),
            Bridge::Interfaces { .. } => Ok(None),
        }
    }

    /// The control address and PKI directory: the ones given, else the lab's.
    pub fn control_and_pki(&self) -> Result<(ControlAddr, PathBuf), EmulatorSpecError> {
        let info = self.lab()?;
        let addr = match (&self.control, &info) {
            (Some(a), _) => a.clone(),
            (None, Some(i)) => i.control.parse().map_err(EmulatorSpecError::Invalid)?,
            (None, None) => {
                return Err(EmulatorSpecError::Invalid(
                    "give --lab NAME or --control ADDR".into(),
                ))
            }
        };
        let pki = match (&self.pki, &info) {
            (Some(t), _) => t.clone(),
            (None, Some(i)) => i.pki_dir.clone(),
            (None, None) => {
                return Err(EmulatorSpecError::Invalid(
                    "give --pki DIR (or --lab NAME)".into(),
                ))
            }
        };
        Ok((addr, pki))
    }

    /// The pipe table it starts with: `--pipes`, then the default pipes over its default.
    pub fn pipe_table(&self) -> Result<PipeTable, EmulatorSpecError> {
        let mut t = match &self.pipes {
            Some(p) => crate::table::load(p)?,
            None => PipeTable::default(),
        };
        match &self.default {
            DefaultPipes::None => {}
            DefaultPipes::Both(d) => t.default = Some((d.clone(), d.clone())),
            DefaultPipes::Split { up, down } => t.default = Some((up.clone(), down.clone())),
        }
        Ok(t)
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
    fn defaults_write_only_the_bridge() {
        let s = EmulatorSpec::new(Bridge::Lab("t1".into()));
        assert_eq!(text(s.to_args()), ["netemu", "run", "--lab", "t1"]);
        let s = EmulatorSpec::new(Bridge::Interfaces {
            client_if: "eth0".into(),
            server_if: "eth1".into(),
        });
        assert_eq!(
            text(s.to_args()),
            [
                "netemu",
                "run",
                "--client-if",
                "eth0",
                "--server-if",
                "eth1"
            ]
        );
        assert!(s.control_and_pki().is_err(), "no control address");
    }

    #[test]
    fn default_pipes_fill_the_table() {
        let mut s = EmulatorSpec::new(Bridge::Lab("t1".into()));
        let up: PipeConfig = "delay=5ms".parse().unwrap();
        let down: PipeConfig = "delay=7ms,rate=1mbit".parse().unwrap();
        s.default = DefaultPipes::Split {
            up: up.clone(),
            down: down.clone(),
        };
        assert_eq!(s.pipe_table().unwrap().default, Some((up, down)));
        let (addr, pki) = s.control_and_pki().unwrap();
        let info = LabInfo::for_name("t1").unwrap();
        assert_eq!(addr.to_string(), info.control);
        assert_eq!(pki, info.pki_dir);
    }
}
