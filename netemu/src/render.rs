//! Backends for routers that have a kernel emulator: the same [`PipeTable`] rendered as `tc`
//! commands (an htb class per pipe with a netem leaf, u32 filters) or as `ipfw` dummynet pipes
//! and rules.
//!
//! Mapping and its limits (a feature a backend cannot express is an error, never silently
//! dropped):
//! * Upstream pipes shape the egress of the server-side interface, downstream pipes the egress
//!   of the client-side interface. Flow rules become exact 5-tuple filters (priority 1), prefix
//!   rules address filters in order (priority 2), the default pipe the htb default class (netem)
//!   or a final `in recv IF` rule (dummynet).
//! * Rate: mimic counts IP bytes (+ `overhead`). htb counts Ethernet frames, so the root qdisc
//!   gets `stab overhead -14` and each class `overhead N`; dummynet counts IP bytes already and
//!   has no overhead setting (`overhead` is an error there).
//! * Queue: netem's `limit` counts every packet inside netem, including those in the delay line,
//!   so it is rendered as queue + the packets the pipe holds in flight at full rate with
//!   1500-byte packets. Byte queues have no netem equivalent (error); dummynet takes them.
//! * Loss: netem `loss random` / `loss gemodel`; dummynet `plr` (no Gilbert–Elliott: error).
//!   Neither backend takes a seed (noted in a comment).
//! * Jitter: netem `delay D J` (netem may reorder jittered packets); dummynet has none (error).
//!   ACK policies need mimic's datapath (error in both).

use std::fmt::Write as _;
use std::process::Command;
use std::str::FromStr;

use crate::classify::IpNet;
use crate::config::{LossModel, PipeConfig, QueueLimit};
use crate::engine::PipeTable;
use crate::units::{fmt_duration, fmt_prob};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Netem,
    Dummynet,
}

impl FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "netem" | "tc" => Ok(Backend::Netem),
            "dummynet" | "ipfw" => Ok(Backend::Dummynet),
            _ => Err(format!("`{s}` is not a backend (netem or dummynet)")),
        }
    }
}

#[derive(Clone, Debug)]
pub struct RenderOptions {
    pub client_if: String,
    pub server_if: String,
}

#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("{what}: {why}")]
    Unsupported { what: String, why: String },
    #[error("too many pipes for {backend}: {n} (at most {max})")]
    TooMany {
        backend: &'static str,
        n: usize,
        max: usize,
    },
    #[error("this kernel has no netem qdisc ({0}); use mimic's own datapath (`mimic netemu run`) instead")]
    NoNetem(String),
    #[error("{0} is not installed")]
    NoTool(String),
    #[error("`{cmd}` failed: {err} (commands before it were applied)")]
    Apply { cmd: String, err: String },
}

/// Rendered commands, each an argv, with comment lines interleaved.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Script {
    pub lines: Vec<Line>,
    pub commands: Vec<Vec<String>>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Line {
    Comment(String),
    Command(usize),
}

impl Script {
    fn comment(&mut self, c: impl Into<String>) {
        self.lines.push(Line::Comment(c.into()));
    }
    fn cmd(&mut self, s: &str) {
        self.commands
            .push(s.split_whitespace().map(String::from).collect());
        self.lines.push(Line::Command(self.commands.len() - 1));
    }
    /// A shell script (`sh -e` runnable).
    pub fn to_shell(&self) -> String {
        let mut out = String::from("#!/bin/sh -e\n");
        for l in &self.lines {
            match l {
                Line::Comment(c) => {
                    let _ = writeln!(out, "# {c}");
                }
                Line::Command(i) => {
                    let _ = writeln!(out, "{}", self.commands[*i].join(" "));
                }
            }
        }
        out
    }
}

fn unsupported(what: &str, why: &str) -> RenderError {
    RenderError::Unsupported {
        what: what.into(),
        why: why.into(),
    }
}

pub fn render(
    backend: Backend,
    table: &PipeTable,
    opts: &RenderOptions,
) -> Result<Script, RenderError> {
    match backend {
        Backend::Netem => render_netem(table, opts),
        Backend::Dummynet => render_dummynet(table, opts),
    }
}

struct PipeRef<'a> {
    what: String,
    cfg: &'a PipeConfig,
}

/// (up pipes, down pipes) with a description each, plus matchers.
enum Match {
    Default,
    Prefix {
        src: IpNet,
        dst: IpNet,
    },
    Flow {
        src: std::net::SocketAddr,
        dst: std::net::SocketAddr,
    },
}

fn pipes(table: &PipeTable) -> Vec<(PipeRef<'_>, Match, bool)> {
    // (pipe, how to match packets of its direction, upstream?)
    let mut v = Vec::new();
    for (i, f) in table.flows.iter().enumerate() {
        v.push((
            PipeRef {
                what: format!("flow #{} {} -> {} up", i + 1, f.client, f.server),
                cfg: &f.up,
            },
            Match::Flow {
                src: f.client,
                dst: f.server,
            },
            true,
        ));
        v.push((
            PipeRef {
                what: format!("flow #{} {} -> {} down", i + 1, f.client, f.server),
                cfg: &f.down,
            },
            Match::Flow {
                src: f.server,
                dst: f.client,
            },
            false,
        ));
    }
    for (i, p) in table.prefixes.iter().enumerate() {
        v.push((
            PipeRef {
                what: format!("prefix #{} {} -> {} up", i + 1, p.client, p.server),
                cfg: &p.up,
            },
            Match::Prefix {
                src: p.client,
                dst: p.server,
            },
            true,
        ));
        v.push((
            PipeRef {
                what: format!("prefix #{} {} -> {} down", i + 1, p.client, p.server),
                cfg: &p.down,
            },
            Match::Prefix {
                src: p.server,
                dst: p.client,
            },
            false,
        ));
    }
    if let Some((u, d)) = &table.default {
        v.push((
            PipeRef {
                what: "default up".into(),
                cfg: u,
            },
            Match::Default,
            true,
        ));
        v.push((
            PipeRef {
                what: "default down".into(),
                cfg: d,
            },
            Match::Default,
            false,
        ));
    }
    v
}

fn common_checks(p: &PipeRef<'_>) -> Result<(), RenderError> {
    if p.cfg.ack.is_some() {
        return Err(unsupported(
            &p.what,
            "ACK policies need mimic's datapath (`mimic netemu run`)",
        ));
    }
    Ok(())
}

fn tc_rate(bps: u64) -> String {
    if bps == 0 {
        "10gbit".into()
    } else if bps.is_multiple_of(1_000_000) {
        format!("{}mbit", bps / 1_000_000)
    } else if bps.is_multiple_of(1_000) {
        format!("{}kbit", bps / 1_000)
    } else {
        format!("{bps}bit")
    }
}

fn tc_time(ns: u64) -> String {
    if ns.is_multiple_of(1_000_000) {
        format!("{}ms", ns / 1_000_000)
    } else {
        format!("{}us", ns.div_ceil(1_000))
    }
}

fn render_netem(table: &PipeTable, opts: &RenderOptions) -> Result<Script, RenderError> {
    let all = pipes(table);
    if all.len() > 0xfff0 {
        return Err(RenderError::TooMany {
            backend: "tc/htb (class ids)",
            n: all.len(),
            max: 0xfff0,
        });
    }
    let mut s = Script::default();
    s.comment("mimic netemu render --backend netem: htb class + netem leaf per pipe, u32 filters");
    s.comment(format!(
        "upstream pipes on {} egress, downstream pipes on {} egress",
        opts.server_if, opts.client_if
    ));
    s.comment("netem has no seed: loss patterns differ from mimic's datapath run to run");
    let has_default = table.default.is_some();
    for (dev, up) in [(&opts.server_if, true), (&opts.client_if, false)] {
        s.comment(format!(
            "--- {dev} ({})",
            if up {
                "client -> server"
            } else {
                "server -> client"
            }
        ));
        s.cmd(&format!(
            "tc qdisc replace dev {dev} root handle 1: stab overhead -14 htb default {}",
            if has_default { "2" } else { "1" }
        ));
        s.cmd(&format!(
            "tc class add dev {dev} parent 1: classid 1:1 htb rate 10gbit"
        ));
        let mut minor = 0x10u32;
        let mut prefix_prio = 2;
        for (p, m, is_up) in all.iter().filter(|x| x.2 == up) {
            let _ = is_up;
            common_checks(p)?;
            let c = p.cfg;
            let limit = match c.queue {
                QueueLimit::Packets(n) => {
                    let in_flight = if c.rate_bps == 0 {
                        0
                    } else {
                        (c.rate_bps as u128 * c.delay as u128 / 8 / 1500 / 1_000_000_000) as u64 + 1
                    };
                    n as u64 + in_flight
                }
                QueueLimit::Bytes(_) => {
                    return Err(unsupported(
                        &p.what,
                        "netem has no byte queue limit; give the queue in packets",
                    ))
                }
            };
            let id = if matches!(m, Match::Default) {
                2
            } else {
                let id = minor;
                minor += 1;
                id
            };
            s.comment(format!("{}: {}", p.what, c));
            let ov = if c.overhead > 0 {
                format!(" overhead {}", c.overhead)
            } else {
                String::new()
            };
            s.cmd(&format!(
                "tc class add dev {dev} parent 1: classid 1:{id:x} htb rate {r} ceil {r}{ov}",
                r = tc_rate(c.rate_bps)
            ));
            let mut netem = format!("tc qdisc add dev {dev} parent 1:{id:x} handle {id:x}: netem limit {limit} delay {}", tc_time(c.delay));
            if c.jitter > 0 {
                let _ = write!(netem, " {}", tc_time(c.jitter));
            }
            match c.loss {
                LossModel::None => {}
                LossModel::Iid(pr) => {
                    let _ = write!(netem, " loss random {}", fmt_prob(pr));
                }
                LossModel::GilbertElliott {
                    p_good_to_bad,
                    p_bad_to_good,
                    loss_bad,
                    loss_good,
                } => {
                    let _ = write!(
                        netem,
                        " loss gemodel {} {} {} {}",
                        fmt_prob(p_good_to_bad),
                        fmt_prob(p_bad_to_good),
                        fmt_prob(loss_bad),
                        fmt_prob(loss_good)
                    );
                }
            }
            s.cmd(&netem);
            match m {
                Match::Default => {}
                Match::Flow { src, dst } => {
                    let (proto, fam) = if src.is_ipv4() {
                        ("ip", "ip")
                    } else {
                        ("ipv6", "ip6")
                    };
                    s.cmd(&format!(
                        "tc filter add dev {dev} parent 1: protocol {proto} prio 1 u32 match {fam} protocol 6 0xff match {fam} src {} match {fam} dst {} match {fam} sport {} 0xffff match {fam} dport {} 0xffff flowid 1:{id:x}",
                        IpNet { addr: src.ip(), prefix: if src.is_ipv4() { 32 } else { 128 } },
                        IpNet { addr: dst.ip(), prefix: if dst.is_ipv4() { 32 } else { 128 } },
                        src.port(),
                        dst.port()
                    ));
                }
                Match::Prefix { src, dst } => {
                    let (proto, fam) = if src.addr.is_ipv4() {
                        ("ip", "ip")
                    } else {
                        ("ipv6", "ip6")
                    };
                    s.cmd(&format!("tc filter add dev {dev} parent 1: protocol {proto} prio {prefix_prio} u32 match {fam} src {src} match {fam} dst {dst} flowid 1:{id:x}"));
                    prefix_prio += 1;
                }
            }
        }
    }
    Ok(s)
}

fn render_dummynet(table: &PipeTable, opts: &RenderOptions) -> Result<Script, RenderError> {
    let all = pipes(table);
    if all.len() > 65_534 {
        return Err(RenderError::TooMany {
            backend: "dummynet",
            n: all.len(),
            max: 65_534,
        });
    }
    let mut s = Script::default();
    s.comment("mimic netemu render --backend dummynet: one dummynet pipe per mimic pipe, ipfw rules in table order");
    s.comment("dummynet counts IP bytes for bw, as mimic does; plr is not seeded");
    s.cmd("sysctl net.inet.ip.fw.one_pass=1");
    for (rule, (i, (p, m, up))) in (1000..).zip(all.iter().enumerate()) {
        common_checks(p)?;
        let c = p.cfg;
        let n = i + 1;
        if c.delay % 1_000_000 != 0 {
            return Err(unsupported(
                &p.what,
                &format!(
                    "dummynet delays are whole milliseconds (got {})",
                    fmt_duration(c.delay)
                ),
            ));
        }
        if c.jitter > 0 {
            return Err(unsupported(&p.what, "dummynet has no jitter"));
        }
        if c.overhead > 0 {
            return Err(unsupported(
                &p.what,
                "dummynet has no per-packet overhead setting",
            ));
        }
        let plr = match c.loss {
            LossModel::None => String::new(),
            LossModel::Iid(pr) => format!(" plr {}", trim_float(pr)),
            LossModel::GilbertElliott { .. } => {
                return Err(unsupported(
                    &p.what,
                    "dummynet has no Gilbert-Elliott loss (only plr)",
                ))
            }
        };
        let bw = if c.rate_bps == 0 {
            "0".to_string()
        } else {
            dn_rate(c.rate_bps)
        };
        let queue = match c.queue {
            QueueLimit::Packets(q) => format!("{q}"),
            QueueLimit::Bytes(b) => format!("{b}bytes"),
        };
        s.comment(format!("{}: {}", p.what, c));
        s.cmd(&format!(
            "ipfw -q pipe {n} config bw {bw} delay {} queue {queue}{plr}",
            c.delay / 1_000_000
        ));
        let m = match m {
            Match::Flow { src, dst } => format!(
                "tcp from {} {} to {} {} in",
                src.ip(),
                src.port(),
                dst.ip(),
                dst.port()
            ),
            Match::Prefix { src, dst } => format!("ip from {src} to {dst} in"),
            Match::Default => format!(
                "ip from any to any in recv {}",
                if *up {
                    &opts.client_if
                } else {
                    &opts.server_if
                }
            ),
        };
        s.cmd(&format!("ipfw -q add {rule} pipe {n} {m}"));
    }
    Ok(s)
}

fn trim_float(p: f64) -> String {
    let s = format!("{p:.6}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn dn_rate(bps: u64) -> String {
    if bps.is_multiple_of(1_000_000) {
        format!("{}Mbit/s", bps / 1_000_000)
    } else if bps.is_multiple_of(1_000) {
        format!("{}Kbit/s", bps / 1_000)
    } else {
        format!("{bps}bit/s")
    }
}

/// Whether the kernel has netem: tries one in a throwaway network namespace.
pub fn probe_netem() -> Result<(), RenderError> {
    let ns = format!("mimic-netem-probe-{}", std::process::id());
    let run = |args: &[&str]| Command::new(args[0]).args(&args[1..]).output();
    let created = run(&["ip", "netns", "add", &ns])
        .map_err(|_| RenderError::NoTool("ip (iproute2)".into()))?;
    if !created.status.success() {
        return Err(RenderError::Apply {
            cmd: format!("ip netns add {ns}"),
            err: String::from_utf8_lossy(&created.stderr).trim().into(),
        });
    }
    let r = run(&[
        "tc", "-n", &ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms",
    ]);
    let _ = run(&["ip", "netns", "del", &ns]);
    let out = r.map_err(|_| RenderError::NoTool("tc (iproute2)".into()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(RenderError::NoNetem(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ))
    }
}

/// Runs a rendered script. The netem backend first checks that the kernel has netem, so it
/// stops before changing anything when it does not.
pub fn apply(backend: Backend, script: &Script) -> Result<(), RenderError> {
    match backend {
        Backend::Netem => probe_netem()?,
        Backend::Dummynet => {
            let ok = Command::new("sh")
                .args(["-c", "command -v ipfw"])
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false);
            if !ok {
                return Err(RenderError::NoTool(
                    "ipfw (dummynet: FreeBSD, or Linux with the ipfw3 module)".into(),
                ));
            }
        }
    }
    for c in &script.commands {
        let out = Command::new(&c[0])
            .args(&c[1..])
            .output()
            .map_err(|e| RenderError::Apply {
                cmd: c.join(" "),
                err: e.to_string(),
            })?;
        if !out.status.success() {
            return Err(RenderError::Apply {
                cmd: c.join(" "),
                err: String::from_utf8_lossy(&out.stderr).trim().into(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::FlowRule;

    fn opts() -> RenderOptions {
        RenderOptions {
            client_if: "eth0".into(),
            server_if: "eth1".into(),
        }
    }

    #[test]
    fn unsupported_features_are_errors() {
        let t = PipeTable {
            default: Some((
                "delay=1500us".parse().unwrap(),
                "delay=1ms".parse().unwrap(),
            )),
            ..Default::default()
        };
        assert!(render(Backend::Dummynet, &t, &opts())
            .unwrap_err()
            .to_string()
            .contains("whole milliseconds"));
        assert!(render(Backend::Netem, &t, &opts()).is_ok());
        let t = PipeTable {
            flows: vec![FlowRule {
                client: "198.19.0.1:1000".parse().unwrap(),
                server: "198.18.0.1:80".parse().unwrap(),
                up: "ack_every=2".parse().unwrap(),
                down: PipeConfig::default(),
            }],
            ..Default::default()
        };
        for b in [Backend::Netem, Backend::Dummynet] {
            assert!(render(b, &t, &opts())
                .unwrap_err()
                .to_string()
                .contains("ACK policies"));
        }
        let t = PipeTable {
            default: Some(("queue=10kb".parse().unwrap(), PipeConfig::default())),
            ..Default::default()
        };
        assert!(render(Backend::Netem, &t, &opts())
            .unwrap_err()
            .to_string()
            .contains("byte queue"));
        assert!(render(Backend::Dummynet, &t, &opts()).is_ok());
    }
}
