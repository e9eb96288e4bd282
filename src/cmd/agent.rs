//! `mimic agent --control ADDR --pki DIR --client-addr IP|CIDR…`: a client agent. It serves
//! the control channel (role `agent`); `mimic replay --agents` hands it its share of the
//! connections and a start instant, and it opens them from its own addresses with the same
//! client engine as a local replay. The flags map to the role's spec ([`Args::into_spec`] →
//! [`AgentSpec`]), which owns its command line.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use mimic_netemu::classify::IpNet;
use mimic_replay::agent::{self, Agent, ControlAddr, Listener, RoleTls};
use mimic_replay::spec::AgentSpec;

use super::parse_control;

#[derive(clap::Args)]
pub struct Args {
    /// Control channel the controller reaches it on: tcp:HOST:PORT or unix:PATH.
    #[arg(long, value_name = "ADDR", value_parser = parse_control)]
    pub control: ControlAddr,
    /// Directory with this role's control-channel files from `mimic pki init`: ca.crt,
    /// agent.crt, agent.key (mode 0600).
    #[arg(long, value_name = "DIR")]
    pub pki: PathBuf,
    /// Source address for replayed connections, or a prefix of them (its host addresses),
    /// e.g. 198.19.32.0/19 (repeatable, at least one). They must be local to this host and
    /// routed back to it through the network emulator; no two agents may share one.
    #[arg(long, value_name = "IP|CIDR", required = true)]
    pub client_addr: Vec<IpNet>,
    /// Keep the client's timer thread on these CPUs, e.g. `0` or `0,2-3`.
    #[arg(long, value_name = "LIST")]
    pub timer_cpus: Option<String>,
}

impl Args {
    /// The agent these flags describe (checked; nothing is touched).
    pub fn into_spec(self) -> anyhow::Result<AgentSpec> {
        let timer_cpus = super::timer_cpus(self.timer_cpus.as_deref())?;
        let spec = AgentSpec {
            control: self.control,
            pki: self.pki,
            client_addrs: self.client_addr,
            timer_cpus,
        };
        spec.addresses().map_err(anyhow::Error::msg)?;
        Ok(spec)
    }
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    run_spec(a.into_spec()?)
}

/// Runs the agent `a` describes until SIGINT, SIGTERM or a control `shutdown`.
pub fn run_spec(a: AgentSpec) -> anyhow::Result<ExitCode> {
    let addrs = a.addresses().map_err(anyhow::Error::msg)?;
    agent::check_local(&addrs).map_err(anyhow::Error::msg)?;
    let tls = RoleTls::load(&a.pki, agent::ROLE)?;
    let listener = Listener::bind(&a.control)
        .with_context(|| format!("binding control channel {}", a.control))?;
    if let Some(cpus) = &a.timer_cpus {
        super::pin_timer_thread(cpus)?;
    }
    let exit = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGTERM, exit.clone())
        .context("installing a SIGTERM handler")?;
    signal_hook::flag::register(signal_hook::consts::SIGINT, exit.clone())
        .context("installing a SIGINT handler")?;
    let n = addrs.len();
    let bound = super::bound_control(&listener, &a.control);
    let server = Agent::new(addrs, a.timer_cpus.clone(), exit.clone())
        .spawn(listener, tls, stop.clone())
        .context("starting the control channel")?;
    if !crate::progress::quiet() {
        eprintln!("mimic agent: serving the control channel on {bound} with {n} client addresses");
    }
    while !exit.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::Relaxed);
    let _ = server.join();
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(spec: &AgentSpec) -> AgentSpec {
        match crate::cmd::parse_role_args(spec.to_args()) {
            crate::Command::Agent(a) => a.into_spec().unwrap(),
            _ => panic!("{:?} is not `mimic agent`", spec.to_args()),
        }
    }

    /// The spec's command line, parsed by the real parser and mapped back, is the spec.
    #[test]
    fn spec_survives_its_command_line() {
        let full = AgentSpec {
            control: "tcp:10.9.0.7:7300".parse().unwrap(),
            pki: "/etc/mimic/pki".into(),
            client_addrs: vec![
                "198.19.32.0/19".parse().unwrap(),
                "10.1.0.7".parse().unwrap(),
            ],
            timer_cpus: Some(vec![0, 2, 3]),
        };
        assert_eq!(round_trip(&full), full);
        let plain = AgentSpec::new(
            "unix:/run/mimic/a.sock".parse().unwrap(),
            "p".into(),
            vec!["10.1.0.7".parse().unwrap()],
        );
        assert_eq!(round_trip(&plain), plain);
    }
}
