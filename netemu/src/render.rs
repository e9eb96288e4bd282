//! Backends for routers that have a kernel emulator: the same [`PipeTable`] rendered as `tc`
//! commands (an htb class per pipe with a netem leaf, hashed u32 filters) or as `ipfw`
//! dummynet pipes and rules, plus the teardown of what they install and a safe `apply`.
//!
//! Mapping and its limits (a feature a backend cannot express is an error, never silently
//! dropped):
//! * Upstream pipes shape the egress of the server-side interface, downstream pipes the egress
//!   of the client-side interface. IPv4 flow rules become exact 5-tuple u32 filters in a
//!   256-bucket hash table keyed on the last octet of the client address (priority 1, so a
//!   packet is compared with the flows of its bucket only), IPv6 flow rules plain u32 filters
//!   (priority 2), prefix rules address filters in order (priority 3 and up), the default pipe
//!   the htb default class (netem) or a final `in recv IF` rule (dummynet).
//! * What mimic installs is its own and nothing else: the netem backend's root qdisc has the
//!   handle [`TC_HANDLE`] (`6d69:`, "mi"), everything else hangs below it; the dummynet backend
//!   puts its rules in set [`DN_SET`] and numbers its pipes from [`DN_PIPE_BASE`]. Rendering
//!   first removes mimic's previous installation, so applying twice gives the same state;
//!   [`teardown`] removes exactly that, and [`apply`] refuses a root qdisc mimic did not install.
//! * Rate: a store-and-forward pipe (mimic's default) gets netem's own `rate R [OVERHEAD]`
//!   below an unlimited htb class: netem computes each departure on arrival exactly as mimic's
//!   pipe does (see `RateIn`). A pipe with a token bucket (`burst`) gets an htb class at the
//!   rate with the bucket mimic's has ([`htb_burst`]). mimic counts IP bytes (+ `overhead`);
//!   the root qdisc's `stab overhead -14` makes htb and netem (which read the length the root
//!   computed) count them too, plus each class's `overhead N` or netem's OVERHEAD; dummynet
//!   counts IP bytes already and has no overhead setting (`overhead` is an error there). A pipe
//!   without a rate gets an htb class at [`UNLIMITED_TC_RATE_BPS`].
//! * Queue: netem's `limit` counts every packet inside netem, including those in the delay line
//!   (delay + jitter), so it is rendered as queue + the packets that can be in the delay line:
//!   at the pipe's rate with 1500-byte packets, or, for a pipe without a rate, at the class's
//!   10 Gbit/s with minimum-size (64-byte) frames, so netem never drops a packet that mimic's
//!   unlimited pipe would pass (see [`netem_limit`]). Byte queues have no netem equivalent
//!   (error); dummynet takes them.
//! * Loss: netem `loss random` / `loss gemodel`; dummynet `plr` (no Gilbert–Elliott: error).
//!   Neither backend takes a seed (noted in a comment).
//! * Jitter: netem `delay D J` (netem may reorder jittered packets); dummynet has none (error).
//!   ACK policies need mimic's datapath: an error in both, unless the caller asks to leave them
//!   out ([`AckPolicies::LeaveOut`]), which the script then says in a comment and counts.

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::str::FromStr;

use crate::classify::IpNet;
use crate::config::{LossModel, PipeConfig, QueueLimit};
use crate::engine::PipeTable;
use crate::units::{fmt_duration, fmt_prob};

/// Major number of the root qdisc the netem backend installs ("mi"); its marker.
pub const TC_MAJOR: u32 = 0x6d69;
/// The handle of mimic's root qdisc as `tc` writes it.
pub const TC_HANDLE: &str = "6d69:";
/// First class minor of a pipe (1 is the catch-all class, 2 the default pipe).
const TC_FIRST_MINOR: u32 = 0x10;
/// Last class minor of a pipe.
const TC_LAST_MINOR: u32 = 0xfffe;
/// Class and leaf numbers an interface has: 0x10..=0xfffe without 0x6d69, whose leaf handle
/// would be the root's.
const TC_IDS_PER_IF: usize = (TC_LAST_MINOR - TC_FIRST_MINOR + 1) as usize - 1;
/// The most pipes one htb qdisc holds. Adding a class makes the kernel walk every class of its
/// qdisc (`tc_bind_tclass`), so N classes in one qdisc install in O(N^2): 32,768 took about
/// ten minutes. An interface with more pipes puts them in groups of this many, each group an
/// htb qdisc of its own below a class of mimic's root (two levels of filters), which installs
/// in O(N).
pub const TC_GROUP_PIPES: usize = 256;
/// The most pipes one interface can take: each pipe and each group of
/// [`TC_GROUP_PIPES`] uses one of the interface's class numbers.
pub const TC_MAX_PIPES_PER_IF: usize = max_pipes_per_if();

const fn max_pipes_per_if() -> usize {
    let mut n = TC_IDS_PER_IF;
    while n + n.div_ceil(TC_GROUP_PIPES) > TC_IDS_PER_IF {
        n -= 1;
    }
    n
}

/// Class numbers `pipes` pipes of one interface use (their own and their groups').
fn tc_ids_needed(pipes: usize) -> usize {
    if pipes > TC_GROUP_PIPES {
        pipes + pipes.div_ceil(TC_GROUP_PIPES)
    } else {
        pipes
    }
}
/// Handle of the u32 hash table of IPv4 flow rules.
const TC_FLOW_HT: u32 = 0x100;
/// The htb rate of a pipe without a rate limit (and of the catch-all class).
pub const UNLIMITED_TC_RATE_BPS: u64 = 10_000_000_000;
/// The smallest Ethernet frame: the packet size the delay-line bound of an unlimited pipe
/// assumes.
const MIN_FRAME_BYTES: u128 = 64;
/// ipfw rule set holding all of mimic's rules (`ipfw delete set 29` removes them).
pub const DN_SET: u32 = 29;
/// First dummynet pipe number mimic uses; pipes run up to [`DN_PIPE_LAST`].
pub const DN_PIPE_BASE: u32 = 32_768;
/// Last dummynet pipe number mimic uses.
pub const DN_PIPE_LAST: u32 = 65_534;
/// Rule number of the flow rules (their order does not matter: they are exact 5-tuples).
const DN_RULE_FLOWS: u32 = 50_000;
/// Rule number of the default pipes (after every prefix rule).
const DN_RULE_DEFAULT: u32 = 59_999;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Netem,
    Dummynet,
}

impl FromStr for Backend {
    type Err = String;
    /// `netem` or `dummynet`, or the tool each is installed with, `tc` or `ipfw` (aliases, as
    /// `mimic replay --emulator` takes them).
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "netem" | "tc" => Ok(Backend::Netem),
            "dummynet" | "ipfw" => Ok(Backend::Dummynet),
            _ => Err(format!(
                "`{}` is not a backend (netem or dummynet; tc and ipfw are their aliases)",
                crate::units::quote(s)
            )),
        }
    }
}

/// The leaf qdisc of each pipe's htb class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Leaf {
    /// netem: the real thing.
    #[default]
    Netem,
    /// `pfifo limit N` in place of netem, same classes and filters: for timing and testing the
    /// install on a kernel without sch_netem (it does not delay or drop at random).
    Pfifo,
}

/// What to do with a pipe's ACK policy, which neither backend can express.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AckPolicies {
    /// An error naming the pipe.
    #[default]
    Refuse,
    /// Render the pipe without it; the script says so and [`Script::ack_policies_left_out`]
    /// counts them.
    LeaveOut,
}

#[derive(Clone, Debug)]
pub struct RenderOptions {
    pub client_if: String,
    pub server_if: String,
    pub leaf: Leaf,
    pub ack_policies: AckPolicies,
    /// dummynet: round delays to whole milliseconds (its resolution) instead of refusing
    /// them; the script says how many and [`Script::delays_rounded`] counts them.
    pub dummynet_round_delays: bool,
}

impl RenderOptions {
    /// netem leaves, ACK policies refused.
    pub fn new(client_if: impl Into<String>, server_if: impl Into<String>) -> Self {
        RenderOptions {
            client_if: client_if.into(),
            server_if: server_if.into(),
            leaf: Leaf::Netem,
            ack_policies: AckPolicies::Refuse,
            dummynet_round_delays: false,
        }
    }
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
    #[error("{dev}: {why}")]
    Interface { dev: String, why: String },
    #[error("{dev} has a root qdisc mimic did not install ({kind} {handle}); remove it first, or give --force to replace it")]
    ForeignRoot {
        dev: String,
        kind: String,
        handle: String,
    },
    #[error("{0}")]
    Invalid(String),
}

/// Rendered commands, each an argv, with comment lines interleaved. `cleanup` commands remove
/// mimic's previous installation and may fail when there is none.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Script {
    pub lines: Vec<Line>,
    pub commands: Vec<Vec<String>>,
    pub cleanup: Vec<Vec<String>>,
    /// The script installs netem qdiscs (applying it needs a kernel with sch_netem).
    pub needs_netem: bool,
    /// Pipes rendered without their ACK policy ([`AckPolicies::LeaveOut`]).
    pub ack_policies_left_out: usize,
    /// dummynet pipes whose delay was rounded to whole milliseconds.
    pub delays_rounded: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Line {
    Comment(String),
    Command(usize),
    Cleanup(usize),
}

impl Script {
    fn comment(&mut self, c: impl Into<String>) {
        self.lines.push(Line::Comment(c.into()));
    }
    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }
    fn cmd(&mut self, s: &str) {
        self.commands.push(Self::argv(s));
        self.lines.push(Line::Command(self.commands.len() - 1));
    }
    fn cleanup(&mut self, s: &str) {
        self.cleanup.push(Self::argv(s));
        self.lines.push(Line::Cleanup(self.cleanup.len() - 1));
    }
    /// A shell script (`sh -e` runnable). Cleanup lines tolerate failure (nothing of mimic's
    /// installed yet); every other command stops the script when it fails.
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
                Line::Cleanup(i) => {
                    let _ = writeln!(out, "{} 2>/dev/null || true", self.cleanup[*i].join(" "));
                }
            }
        }
        out
    }
    /// The commands for one `tc -batch FILE` (netem backend) or `ipfw -q FILE` (dummynet)
    /// process: each line without the program name, comments kept (both tools skip `#`
    /// lines). Cleanup commands are left out: a batch stops at the first error, so removing
    /// the previous installation is [`apply`]'s job (or run [`teardown`] first).
    pub fn to_batch(&self) -> String {
        let mut out = String::new();
        for l in &self.lines {
            match l {
                Line::Comment(c) => {
                    let _ = writeln!(out, "# {c}");
                }
                Line::Command(i) => {
                    let _ = writeln!(out, "{}", self.commands[*i][1..].join(" "));
                }
                Line::Cleanup(_) => {}
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

/// Checks an interface name the scripts will carry: what Linux accepts as one (1 to 15
/// bytes, not `.` or `..`, no `/`, `:` or white space) and only characters no shell reads as
/// anything but themselves (letters, digits, `-`, `_`, `.`, `@`, `+`), so that a rendered
/// script run as root does what it says.
pub fn check_interface(dev: &str) -> Result<(), RenderError> {
    let bad = |why: &str| {
        Err(RenderError::Interface {
            dev: format!("interface name {dev:?}"),
            why: why.into(),
        })
    };
    if dev.is_empty() {
        return bad("it is empty");
    }
    if dev.len() > 15 {
        return bad("longer than Linux's 15 bytes");
    }
    if dev == "." || dev == ".." {
        return bad("not a name Linux allows");
    }
    if let Some(c) = dev
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "-_.@+".contains(*c)))
    {
        return bad(&format!(
            "{c:?} is not allowed (letters, digits, `-`, `_`, `.`, `@` and `+` are)"
        ));
    }
    Ok(())
}

/// Both interface names ([`check_interface`]), and that they are two: each side's pipes hang
/// below a root qdisc of its own interface (netem), and the default pipes are told apart by
/// the interface a packet came in on (dummynet), so on one interface the downstream root
/// would replace the upstream one, or the upstream default take both directions.
pub fn check_interfaces(opts: &RenderOptions) -> Result<(), RenderError> {
    check_interface(&opts.client_if)?;
    check_interface(&opts.server_if)?;
    if opts.client_if == opts.server_if {
        return Err(RenderError::Interface {
            dev: opts.client_if.clone(),
            why: "given as both the client-side and the server-side interface: each side's pipes need an interface of their own (on one, the downstream pipes would replace the upstream ones); name two interfaces".into(),
        });
    }
    Ok(())
}

/// Two flow rules of one client and server: a connection's packets match the first one's
/// filters, so the second's pipes would never be used.
fn check_duplicate_flows(table: &PipeTable) -> Result<(), RenderError> {
    match table.duplicate_flow() {
        Some((j, i)) => {
            let f = &table.flows[i];
            Err(unsupported(
                &format!("flow #{} {} -> {}", i + 1, f.client, f.server),
                &format!(
                    "the same client and server as flow #{}: its filters would never match (one rule per connection)",
                    j + 1
                ),
            ))
        }
        None => Ok(()),
    }
}

/// A flow or prefix rule whose client and server are of different address families matches
/// no packet, and no backend can write a filter for it.
fn check_families(table: &PipeTable) -> Result<(), RenderError> {
    for (p, m, _) in pipes(table) {
        let mixed = match m {
            Match::Flow { src, dst } => src.is_ipv4() != dst.is_ipv4(),
            Match::Prefix { src, dst } => src.addr.is_ipv4() != dst.addr.is_ipv4(),
            Match::Default => false,
        };
        if mixed {
            return Err(unsupported(
                &p.what,
                "its client and server are of different address families (IPv4 and IPv6): no packet matches it",
            ));
        }
    }
    Ok(())
}

pub fn render(
    backend: Backend,
    table: &PipeTable,
    opts: &RenderOptions,
) -> Result<Script, RenderError> {
    check_interfaces(opts)?;
    check_families(table)?;
    check_duplicate_flows(table)?;
    match backend {
        Backend::Netem => render_netem(table, opts),
        Backend::Dummynet => render_dummynet(table, opts),
    }
}

/// The commands that remove what mimic installed, and nothing else. The netem backend needs
/// no table (everything hangs below mimic's root handle); the dummynet backend deletes mimic's
/// rule set and the pipes the table numbers (give it the table that was applied).
pub fn teardown(
    backend: Backend,
    table: Option<&PipeTable>,
    opts: &RenderOptions,
) -> Result<Script, RenderError> {
    check_interfaces(opts)?;
    let mut s = Script::default();
    match backend {
        Backend::Netem => {
            s.comment(format!(
                "mimic netemu render --backend netem --teardown: removes mimic's root qdisc (handle {TC_HANDLE}) and all below it"
            ));
            s.comment("a root qdisc with another handle is not mimic's: it is left alone");
            for dev in [&opts.server_if, &opts.client_if] {
                s.cleanup(&format!("tc qdisc del dev {dev} root handle {TC_HANDLE}"));
            }
        }
        Backend::Dummynet => {
            let Some(table) = table else {
                return Err(RenderError::Invalid(
                    "the dummynet teardown deletes the pipes of the table that was applied: give the same --pipes/--default/--from".into(),
                ));
            };
            let n = pipes(table).len();
            s.comment(format!(
                "mimic netemu render --backend dummynet --teardown: deletes rule set {DN_SET} and pipes {DN_PIPE_BASE}-{}",
                DN_PIPE_BASE as usize + n.max(1) - 1
            ));
            s.cleanup(&format!("ipfw -q delete set {DN_SET}"));
            for i in 0..n {
                s.cleanup(&format!(
                    "ipfw -q pipe {} delete",
                    DN_PIPE_BASE as usize + i
                ));
            }
        }
    }
    Ok(s)
}

struct PipeRef<'a> {
    what: String,
    cfg: &'a PipeConfig,
}

/// How the packets of one pipe's direction are matched.
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

/// Checks what no backend can express; returns whether an ACK policy is left out.
fn common_checks(p: &PipeRef<'_>, opts: &RenderOptions) -> Result<bool, RenderError> {
    if p.cfg.first_delay > 0 {
        return Err(unsupported(
            &p.what,
            "a first-packet delay (first_delay) needs mimic's datapath (`mimic netemu run`)",
        ));
    }
    if p.cfg.ack.is_some() {
        return match opts.ack_policies {
            AckPolicies::Refuse => Err(unsupported(
                &p.what,
                "ACK policies need mimic's datapath (`mimic netemu run`)",
            )),
            AckPolicies::LeaveOut => Ok(true),
        };
    }
    Ok(false)
}

pub(crate) fn tc_rate(bps: u64) -> String {
    let bps = if bps == 0 { UNLIMITED_TC_RATE_BPS } else { bps };
    if bps.is_multiple_of(1_000_000_000) {
        format!("{}gbit", bps / 1_000_000_000)
    } else if bps.is_multiple_of(1_000_000) {
        format!("{}mbit", bps / 1_000_000)
    } else if bps.is_multiple_of(1_000) {
        format!("{}kbit", bps / 1_000)
    } else {
        format!("{bps}bit")
    }
}

pub(crate) fn tc_time(ns: u64) -> String {
    if ns.is_multiple_of(1_000_000) {
        format!("{}ms", ns / 1_000_000)
    } else {
        format!("{}us", ns.div_ceil(1_000))
    }
}

/// netem's `limit` for a pipe with a packet queue of `queue`: netem counts the packets in its
/// delay line too, so the limit is the queue plus the packets that can be inside the delay
/// line (`delay + jitter` long): at the pipe's rate in 1500-byte packets (+1 for the one being
/// sent), or — a pipe without a rate, where mimic's queue never fills — at the htb class's
/// [`UNLIMITED_TC_RATE_BPS`] in minimum-size 64-byte frames, the most packets the class can
/// pass in that time. The limit only caps netem's queue; it reserves no memory.
pub fn netem_limit(c: &PipeConfig, queue: u32) -> u64 {
    let line_ns = c.delay as u128 + c.jitter as u128;
    let in_line = if c.rate_bps == 0 {
        (UNLIMITED_TC_RATE_BPS as u128 * line_ns).div_ceil(8 * MIN_FRAME_BYTES * 1_000_000_000)
    } else {
        c.rate_bps as u128 * line_ns / 8 / 1500 / 1_000_000_000 + 1
    };
    (queue as u128 + in_line).min(u32::MAX as u128) as u64
}

/// Where a rate-limited pipe's rate is rendered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RateIn {
    /// netem's `rate` (a pipe without `burst`; htb's class is unlimited). netem gives each
    /// packet its departure time when it arrives: the later of its arrival + delay and the
    /// previous packet's departure, plus its own serialization time at the rate — exactly
    /// mimic's store-and-forward pipe (serialize, then delay). A timer that fires late sends
    /// the packets that are due together and the schedule does not slip, as a link's does not.
    Netem,
    /// htb's class rate with a token bucket (`burst` > 0, which netem's `rate` has not; or the
    /// pfifo test leaf, which has no rate). htb sends when its timer fires and charges from
    /// then on, so a late timer delays every later packet of the busy period too.
    Htb,
}

impl RateIn {
    fn of(c: &PipeConfig, leaf: Leaf) -> Self {
        if c.rate_bps > 0 && c.burst == 0 && leaf == Leaf::Netem {
            RateIn::Netem
        } else {
            RateIn::Htb
        }
    }
}

/// The largest IP packet a pipe's class is assumed to pass (the lab's and Ethernet's MTU).
const MTU_IP_BYTES: u64 = 1500;

/// The htb `burst` (= `cburst`, bytes) of a rate-limited pipe's class, so that htb lets packets
/// go when mimic's pipe would (None: a pipe without a rate keeps htb's default).
///
/// htb sends a class's packet whenever the class's tokens are not negative and charges it
/// afterwards, so an idle class lets its bucket **plus one packet** through back to back: tc's
/// default bucket (rate / HZ + 1600 bytes, at least one MTU) sent the first two packets of
/// every busy period together, where mimic's store-and-forward pipe (`burst=0`) spaces them by
/// a packet's serialization time — compressed pairs at the start of every flight, which a
/// packet-pair estimator reads as a far higher rate (netemu/README.md, "netem rate"). mimic's
/// `burst=B` lets a packet leave B bytes' time before it finishes serializing, which is htb's
/// bucket of B minus one full packet (its length counted as htb counts it: the IP packet plus
/// `overhead`). tc's `burst 0` means "default", so an empty bucket is rendered as one byte
/// (below a tick of htb's clock at most rates). Only pipes whose rate stays htb's use it
/// (see `RateIn`).
pub fn htb_burst(c: &PipeConfig) -> Option<u64> {
    if c.rate_bps == 0 {
        return None;
    }
    let packet = MTU_IP_BYTES + c.overhead as u64;
    Some((c.burst as u64).saturating_sub(packet).max(1))
}

/// The arguments of one pipe's htb class (after `htb`) and of its netem leaf (from `netem`),
/// for a queue of `limit` packets. A store-and-forward pipe's rate is netem's own (see
/// [`RateIn`]); a token bucket (`burst`), or the pfifo test leaf, keeps it in htb's class.
/// Both renderings of kernel pipes use it: the script of [`render`] and the per-connection
/// pipes of a kernel router ([`crate::kernel_router`]).
pub(crate) fn pipe_args(c: &PipeConfig, leaf: Leaf, limit: u64) -> (String, String) {
    let rate_in = RateIn::of(c, leaf);
    let mut class = String::new();
    let class_rate = match rate_in {
        RateIn::Netem => 0,
        RateIn::Htb => c.rate_bps,
    };
    let _ = write!(
        class,
        "rate {r} ceil {r} quantum 1514",
        r = tc_rate(class_rate)
    );
    if rate_in == RateIn::Htb {
        if c.overhead > 0 {
            let _ = write!(class, " overhead {}", c.overhead);
        }
        if let Some(b) = htb_burst(c) {
            let _ = write!(class, " burst {b}b cburst {b}b");
        }
    }
    let mut netem = format!("netem limit {limit} delay {}", tc_time(c.delay));
    if c.jitter > 0 {
        let _ = write!(netem, " {}", tc_time(c.jitter));
    }
    if rate_in == RateIn::Netem {
        let _ = write!(netem, " rate {}", tc_rate(c.rate_bps));
        if c.overhead > 0 {
            let _ = write!(netem, " {}", c.overhead);
        }
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
    (class, netem)
}

/// The u32 hash table of flow filters on qdisc `parent` (256 buckets by the client address's
/// last octet) and the filter that hashes into it, as `tc -batch` lines without the `tc`: the
/// client is the source upstream (offset 12), the destination downstream (16). Both the
/// rendered script and the kernel router's per-connection pipes use it.
pub(crate) fn flow_hash_table(dev: &str, parent: &str, upstream: bool) -> [String; 2] {
    let at = if upstream { 12 } else { 16 };
    [
        format!("filter add dev {dev} parent {parent} prio 1 handle {TC_FLOW_HT:x}: protocol ip u32 divisor 256"),
        format!("filter add dev {dev} parent {parent} prio 1 protocol ip u32 ht 800:: match ip protocol 6 0xff hashkey mask 0x000000ff at {at} link {TC_FLOW_HT:x}:"),
    ]
}

/// The next class minor, skipping the one whose leaf handle would be mimic's root handle.
fn next_minor(m: &mut u32) -> u32 {
    if *m == TC_MAJOR {
        *m += 1;
    }
    let id = *m;
    *m += 1;
    id
}

fn host(addr: std::net::IpAddr) -> IpNet {
    IpNet {
        addr,
        prefix: if addr.is_ipv4() { 32 } else { 128 },
    }
}

fn render_netem(table: &PipeTable, opts: &RenderOptions) -> Result<Script, RenderError> {
    let all = pipes(table);
    let per_if = all.iter().filter(|p| p.2).count().max(all.len() / 2);
    if tc_ids_needed(per_if) > TC_IDS_PER_IF {
        return Err(RenderError::TooMany {
            backend: "tc/htb (class ids per interface)",
            n: per_if,
            max: TC_MAX_PIPES_PER_IF,
        });
    }
    let mut s = Script {
        needs_netem: opts.leaf == Leaf::Netem,
        ..Script::default()
    };
    s.comment(
        "mimic netemu render --backend netem: htb class + netem leaf per pipe, hashed u32 filters",
    );
    s.comment(format!(
        "upstream pipes on {} egress, downstream pipes on {} egress",
        opts.server_if, opts.client_if
    ));
    s.comment(format!(
        "mimic's root qdisc is handle {TC_HANDLE} (re-applying replaces it); another root qdisc makes `qdisc add` fail: remove it, or use `mimic netemu render --apply --force`"
    ));
    s.comment("netem has no seed: loss patterns differ from mimic's datapath run to run");
    if opts.leaf == Leaf::Pfifo {
        s.comment(
            "TEST LEAF: pfifo in place of netem (no delay, no loss): classes and filters only",
        );
    }
    let has_default = table.default.is_some();
    let mut left_out = 0usize;
    for (dev, up) in [(&opts.server_if, true), (&opts.client_if, false)] {
        s.comment(format!(
            "--- {dev} ({})",
            if up {
                "client -> server"
            } else {
                "server -> client"
            }
        ));
        s.cleanup(&format!("tc qdisc del dev {dev} root handle {TC_HANDLE}"));
        s.cmd(&format!(
            "tc qdisc add dev {dev} root handle {TC_HANDLE} stab overhead -14 htb default {}",
            if has_default { "2" } else { "1" }
        ));
        s.cmd(&format!(
            "tc class add dev {dev} parent {TC_HANDLE} classid {TC_HANDLE}1 htb rate {r} ceil {r} quantum 1514",
            r = tc_rate(0)
        ));
        let mine: Vec<_> = all.iter().filter(|x| x.2 == up).collect();
        let shaped = mine
            .iter()
            .filter(|(_, m, _)| !matches!(m, Match::Default))
            .count();
        let v4_flows = mine
            .iter()
            .filter(|(_, m, _)| matches!(m, Match::Flow { src, .. } if src.is_ipv4()))
            .count();
        let flow_table = |s: &mut Script, parent: &str| {
            for l in flow_hash_table(dev, parent, up) {
                s.cmd(&format!("tc {l}"));
            }
        };
        let mut minor = TC_FIRST_MINOR;
        // Groups (see TC_GROUP_PIPES): root class 6d69:G, whose htb qdisc has the handle G:.
        let groups: Vec<u32> = if shaped > TC_GROUP_PIPES {
            (0..shaped.div_ceil(TC_GROUP_PIPES))
                .map(|_| next_minor(&mut minor))
                .collect()
        } else {
            Vec::new()
        };
        if !groups.is_empty() {
            s.comment(format!(
                "{shaped} pipes: {} groups of at most {TC_GROUP_PIPES}, each an htb qdisc G: below class {TC_HANDLE}G (the kernel adds a class in time linear in its qdisc's classes); mimic's filters send a packet to its group, the group's to its pipe",
                groups.len()
            ));
            for g in &groups {
                s.cmd(&format!(
                    "tc class add dev {dev} parent {TC_HANDLE} classid {TC_HANDLE}{g:x} htb rate {r} ceil {r} quantum 1514",
                    r = tc_rate(0)
                ));
                s.cmd(&format!(
                    "tc qdisc add dev {dev} parent {TC_HANDLE}{g:x} handle {g:x}: htb"
                ));
            }
        }
        if v4_flows > 0 {
            s.comment(format!(
                "IPv4 flow rules: u32 hash table {TC_FLOW_HT:x}: with 256 buckets keyed on the last octet of the client address"
            ));
            flow_table(&mut s, TC_HANDLE);
        }
        let mut group_has_table = vec![false; groups.len()];
        let mut prefix_prio = 3;
        let mut nth = 0usize;
        for (p, m, _) in mine {
            if common_checks(p, opts)? {
                left_out += 1;
            }
            let c = p.cfg;
            let limit = match c.queue {
                QueueLimit::Packets(n) => netem_limit(c, n),
                QueueLimit::Bytes(_) => {
                    return Err(unsupported(
                        &p.what,
                        "netem has no byte queue limit; give the queue in packets",
                    ))
                }
            };
            // (the qdisc the pipe's class is in, the class, its group's index)
            let (parent, class, group) = if matches!(m, Match::Default) {
                (TC_HANDLE.to_string(), format!("{TC_HANDLE}2"), None)
            } else if groups.is_empty() {
                let id = next_minor(&mut minor);
                (TC_HANDLE.to_string(), format!("{TC_HANDLE}{id:x}"), None)
            } else {
                let g = nth / TC_GROUP_PIPES;
                let k = nth % TC_GROUP_PIPES + 1;
                nth += 1;
                let gm = groups[g];
                (format!("{gm:x}:"), format!("{gm:x}:{k:x}"), Some(g))
            };
            let leaf = if matches!(m, Match::Default) {
                2
            } else if groups.is_empty() {
                minor - 1
            } else {
                next_minor(&mut minor)
            };
            s.comment(format!("{}: {}", p.what, c));
            let (class_args, netem_args) = pipe_args(c, opts.leaf, limit);
            s.cmd(&format!(
                "tc class add dev {dev} parent {parent} classid {class} htb {class_args}"
            ));
            match opts.leaf {
                Leaf::Netem => s.cmd(&format!(
                    "tc qdisc add dev {dev} parent {class} handle {leaf:x}: {netem_args}"
                )),
                Leaf::Pfifo => s.cmd(&format!(
                    "tc qdisc add dev {dev} parent {class} handle {leaf:x}: pfifo limit {limit}"
                )),
            }
            // The filter of this pipe's match, on the qdisc `at_qdisc`, to class `to`.
            let filter = |at_qdisc: &str, to: &str| -> Option<String> {
                match m {
                    Match::Default => None,
                    Match::Flow { src, dst } if src.is_ipv4() => {
                        let client = if up { src.ip() } else { dst.ip() };
                        let bucket = match client {
                            std::net::IpAddr::V4(a) => a.octets()[3],
                            std::net::IpAddr::V6(_) => unreachable!("checked is_ipv4"),
                        };
                        Some(format!(
                            "tc filter add dev {dev} parent {at_qdisc} prio 1 protocol ip u32 ht {TC_FLOW_HT:x}:{bucket:x}: match ip protocol 6 0xff match ip src {} match ip dst {} match ip sport {} 0xffff match ip dport {} 0xffff flowid {to}",
                            host(src.ip()),
                            host(dst.ip()),
                            src.port(),
                            dst.port()
                        ))
                    }
                    Match::Flow { src, dst } => Some(format!(
                        "tc filter add dev {dev} parent {at_qdisc} protocol ipv6 prio 2 u32 match ip6 protocol 6 0xff match ip6 src {} match ip6 dst {} match ip6 sport {} 0xffff match ip6 dport {} 0xffff flowid {to}",
                        host(src.ip()),
                        host(dst.ip()),
                        src.port(),
                        dst.port()
                    )),
                    Match::Prefix { src, dst } => {
                        let (proto, fam) = if src.addr.is_ipv4() {
                            ("ip", "ip")
                        } else {
                            ("ipv6", "ip6")
                        };
                        Some(format!("tc filter add dev {dev} parent {at_qdisc} protocol {proto} prio {prefix_prio} u32 match {fam} src {src} match {fam} dst {dst} flowid {to}"))
                    }
                }
            };
            match group {
                None => {
                    if let Some(f) = filter(TC_HANDLE, &class) {
                        s.cmd(&f);
                    }
                }
                Some(g) => {
                    let gm = groups[g];
                    if let Some(f) = filter(TC_HANDLE, &format!("{TC_HANDLE}{gm:x}")) {
                        s.cmd(&f);
                    }
                    if matches!(m, Match::Flow { src, .. } if src.is_ipv4()) && !group_has_table[g]
                    {
                        flow_table(&mut s, &parent);
                        group_has_table[g] = true;
                    }
                    if let Some(f) = filter(&parent, &class) {
                        s.cmd(&f);
                    }
                }
            }
            if matches!(m, Match::Prefix { .. }) {
                prefix_prio += 1;
            }
        }
    }
    note_left_out(&mut s, left_out);
    Ok(s)
}

fn note_left_out(s: &mut Script, left_out: usize) {
    s.ack_policies_left_out = left_out;
    if left_out > 0 {
        // at the top, after the title lines
        s.lines.insert(
            1,
            Line::Comment(format!(
                "WARNING: {left_out} pipes rendered WITHOUT their ACK policy (delayed-ACK shaping needs mimic's datapath)"
            )),
        );
    }
}

fn render_dummynet(table: &PipeTable, opts: &RenderOptions) -> Result<Script, RenderError> {
    let all = pipes(table);
    let max = (DN_PIPE_LAST - DN_PIPE_BASE + 1) as usize;
    if all.len() > max {
        return Err(RenderError::TooMany {
            backend: "dummynet (pipe numbers 32768-65534)",
            n: all.len(),
            max,
        });
    }
    let mut s = Script::default();
    s.comment("mimic netemu render --backend dummynet: one dummynet pipe per mimic pipe, ipfw rules in table order");
    s.comment(format!(
        "mimic's rules are in set {DN_SET} (flows {DN_RULE_FLOWS}, prefixes from {}, default {DN_RULE_DEFAULT}), its pipes numbered from {DN_PIPE_BASE}; re-applying replaces them",
        DN_RULE_FLOWS + 1
    ));
    s.comment("dummynet counts IP bytes for bw, as mimic does; plr is not seeded");
    s.cleanup(&format!("ipfw -q delete set {DN_SET}"));
    s.cmd("sysctl net.inet.ip.fw.one_pass=1");
    let mut left_out = 0usize;
    let mut rounded = 0usize;
    let mut prefix_rule = DN_RULE_FLOWS + 1;
    for (i, (p, m, up)) in all.iter().enumerate() {
        if common_checks(p, opts)? {
            left_out += 1;
        }
        let c = p.cfg;
        let n = DN_PIPE_BASE as usize + i;
        let mut delay_ms = c.delay / 1_000_000;
        if c.delay % 1_000_000 != 0 && opts.dummynet_round_delays {
            delay_ms = (c.delay + 500_000) / 1_000_000;
            rounded += 1;
        } else if c.delay % 1_000_000 != 0 {
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
            "ipfw -q pipe {n} config bw {bw} delay {delay_ms} queue {queue}{plr}{burst}",
            burst = if c.burst > 0 {
                format!(" burst {}", c.burst)
            } else {
                String::new()
            }
        ));
        let (rule, m) = match m {
            Match::Flow { src, dst } => (
                DN_RULE_FLOWS,
                format!(
                    "tcp from {} {} to {} {} in",
                    src.ip(),
                    src.port(),
                    dst.ip(),
                    dst.port()
                ),
            ),
            Match::Prefix { src, dst } => {
                let r = prefix_rule;
                prefix_rule += 1;
                (r, format!("ip from {src} to {dst} in"))
            }
            Match::Default => (
                DN_RULE_DEFAULT,
                format!(
                    "ip from any to any in recv {}",
                    if *up {
                        &opts.client_if
                    } else {
                        &opts.server_if
                    }
                ),
            ),
        };
        s.cmd(&format!("ipfw -q add {rule} set {DN_SET} pipe {n} {m}"));
    }
    note_left_out(&mut s, left_out);
    s.delays_rounded = rounded;
    if rounded > 0 {
        s.lines.insert(
            1,
            Line::Comment(format!(
                "NOTE: {rounded} pipes' delays rounded to whole milliseconds (dummynet's resolution)"
            )),
        );
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

/// Where [`apply`] runs its commands.
#[derive(Clone, Debug, Default)]
pub struct ApplyOptions {
    /// Run `tc` inside this network namespace (`tc -n NS`).
    pub netns: Option<String>,
    /// Replace a root qdisc mimic did not install.
    pub force: bool,
}

/// What one interface's root qdisc is, read back with `tc -j qdisc show`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RootQdisc {
    /// The kernel's default (handle `0:`: noqueue, pfifo_fast, fq_codel, mq …): nobody
    /// installed it.
    KernelDefault(String),
    /// mimic's ([`TC_HANDLE`]).
    Mimic,
    /// Someone else's: kind and handle.
    Other { kind: String, handle: String },
}

fn tc(opts: &ApplyOptions) -> Command {
    let mut c = Command::new("tc");
    if let Some(ns) = &opts.netns {
        c.args(["-n", ns]);
    }
    c
}

fn tc_run(opts: &ApplyOptions, args: &[&str]) -> Result<String, RenderError> {
    let out = tc(opts)
        .args(args)
        .output()
        .map_err(|_| RenderError::NoTool("tc (iproute2)".into()))?;
    if !out.status.success() {
        return Err(RenderError::Apply {
            cmd: format!("tc {}", args.join(" ")),
            err: String::from_utf8_lossy(&out.stderr).trim().into(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Parses `tc -j qdisc show dev DEV` output: the root qdisc's kind and handle.
pub fn parse_root_qdisc(json: &str) -> Result<RootQdisc, String> {
    let v: serde_json::Value = serde_json::from_str(json.trim())
        .map_err(|e| format!("unreadable `tc -j qdisc show` output: {e}"))?;
    let arr = v
        .as_array()
        .ok_or("`tc -j qdisc show` did not give a list")?;
    let root = arr
        .iter()
        .find(|q| q.get("root").and_then(|r| r.as_bool()) == Some(true))
        .ok_or("no root qdisc in `tc -j qdisc show`")?;
    let kind = root
        .get("kind")
        .and_then(|k| k.as_str())
        .unwrap_or("?")
        .to_string();
    let handle = root
        .get("handle")
        .and_then(|k| k.as_str())
        .unwrap_or("?")
        .to_string();
    Ok(if handle == TC_HANDLE && kind == "htb" {
        RootQdisc::Mimic
    } else if handle == "0:" {
        RootQdisc::KernelDefault(kind)
    } else {
        RootQdisc::Other { kind, handle }
    })
}

/// The root qdisc of `dev` (an error naming the interface when it does not exist).
pub fn root_qdisc(dev: &str, opts: &ApplyOptions) -> Result<RootQdisc, RenderError> {
    let out = tc(opts)
        .args(["-j", "qdisc", "show", "dev", dev])
        .output()
        .map_err(|_| RenderError::NoTool("tc (iproute2)".into()))?;
    if !out.status.success() {
        return Err(RenderError::Interface {
            dev: dev.into(),
            why: String::from_utf8_lossy(&out.stderr).trim().into(),
        });
    }
    parse_root_qdisc(&String::from_utf8_lossy(&out.stdout)).map_err(|why| RenderError::Interface {
        dev: dev.into(),
        why,
    })
}

/// The root qdiscs of `devs` that netem pipes will replace, read before anything is changed:
/// the interfaces first (a missing one is named as such, not blamed on a kernel without
/// netem), then netem itself where `needs_netem`; a root qdisc mimic did not install is
/// refused unless `opts.force`. What `render --apply` and the kernel router both check.
pub fn roots_to_replace<'a>(
    devs: [&'a str; 2],
    opts: &ApplyOptions,
    needs_netem: bool,
) -> Result<Vec<(&'a str, RootQdisc)>, RenderError> {
    let roots = devs
        .into_iter()
        .map(|dev| root_qdisc(dev, opts).map(|r| (dev, r)))
        .collect::<Result<Vec<_>, _>>()?;
    if needs_netem {
        probe_netem()?;
    }
    for (dev, r) in &roots {
        if let RootQdisc::Other { kind, handle } = r {
            if !opts.force {
                return Err(RenderError::ForeignRoot {
                    dev: dev.to_string(),
                    kind: kind.clone(),
                    handle: handle.clone(),
                });
            }
        }
    }
    Ok(roots)
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

/// What [`apply`] or [`apply_teardown`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApplyReport {
    /// Interfaces whose previous mimic installation was removed.
    pub replaced: Vec<String>,
    /// Interfaces whose foreign root qdisc was replaced (`--force`).
    pub forced: Vec<String>,
    /// Commands run (in the batch for netem).
    pub commands: usize,
}

/// Whether `ipfw` (dummynet) is installed on this machine; an error naming it if not.
pub fn ensure_ipfw() -> Result<(), RenderError> {
    let ok = Command::new("sh")
        .args(["-c", "command -v ipfw"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if ok {
        Ok(())
    } else {
        Err(RenderError::NoTool(
            "ipfw (dummynet: FreeBSD, or Linux with the ipfw3 module)".into(),
        ))
    }
}

fn run_argv(c: &[String], tolerant: bool) -> Result<(), RenderError> {
    let out = Command::new(&c[0])
        .args(&c[1..])
        .output()
        .map_err(|e| RenderError::Apply {
            cmd: c.join(" "),
            err: e.to_string(),
        })?;
    if !out.status.success() && !tolerant {
        return Err(RenderError::Apply {
            cmd: c.join(" "),
            err: String::from_utf8_lossy(&out.stderr).trim().into(),
        });
    }
    Ok(())
}

/// Installs a rendered script. netem: checks that the kernel has netem (when the script needs
/// it), that both interfaces exist and that neither has a root qdisc mimic did not install
/// (unless `force`) — all before changing anything —, removes mimic's previous installation,
/// then runs every command in one `tc -batch` process. dummynet: removes mimic's rule set and
/// runs the commands one by one.
pub fn apply(
    backend: Backend,
    script: &Script,
    ropts: &RenderOptions,
    opts: &ApplyOptions,
) -> Result<ApplyReport, RenderError> {
    check_interfaces(ropts)?;
    let mut report = ApplyReport::default();
    match backend {
        Backend::Netem => {
            let devs = [ropts.server_if.as_str(), ropts.client_if.as_str()];
            for (dev, r) in roots_to_replace(devs, opts, script.needs_netem)? {
                match r {
                    RootQdisc::KernelDefault(_) => {}
                    RootQdisc::Mimic => {
                        tc_run(
                            opts,
                            &["qdisc", "del", "dev", dev, "root", "handle", TC_HANDLE],
                        )?;
                        report.replaced.push(dev.to_string());
                    }
                    RootQdisc::Other { .. } => {
                        tc_run(opts, &["qdisc", "del", "dev", dev, "root"])?;
                        report.forced.push(dev.to_string());
                    }
                }
            }
            run_tc_batch(&script.to_batch(), opts)?;
            report.commands = script.commands.len();
        }
        Backend::Dummynet => {
            ensure_ipfw()?;
            for c in &script.cleanup {
                run_argv(c, true)?;
            }
            for c in &script.commands {
                run_argv(c, false)?;
            }
            report.commands = script.commands.len();
        }
    }
    Ok(report)
}

/// Runs `tc -batch -` with `batch` on its standard input; a failure names the line.
pub fn run_tc_batch(batch: &str, opts: &ApplyOptions) -> Result<(), RenderError> {
    tc_batch_with(batch, opts, false)
}

/// Runs `batch` through `tc [-force] -batch -` (in `opts.netns`) and returns its exit code and
/// standard error, whatever they are: the caller reads the failed lines (`Command failed -:N`).
pub fn tc_batch_status(
    batch: &str,
    opts: &ApplyOptions,
    force: bool,
) -> Result<(i32, String), RenderError> {
    let args = tc_batch_args(force);
    let mut child = tc(opts)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|_| RenderError::NoTool("tc (iproute2)".into()))?;
    let mut stdin = child.stdin.take().expect("piped");
    let text = batch.to_string();
    let writer = std::thread::spawn(move || stdin.write_all(text.as_bytes()));
    let out = child.wait_with_output().map_err(|e| RenderError::Apply {
        cmd: format!("tc {}", args.join(" ")),
        err: e.to_string(),
    })?;
    let _ = writer.join();
    Ok((
        out.status.code().unwrap_or(128),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

fn tc_batch_args(force: bool) -> &'static [&'static str] {
    if force {
        &["-force", "-batch", "-"]
    } else {
        &["-batch", "-"]
    }
}

/// The lines a `tc [-force] -batch` run says failed: `(N, why)` for each `Command failed
/// FILE:N` on its standard error (N counted from 1, as tc counts), `why` the messages tc
/// printed before it (warnings left out).
pub fn batch_failures(stderr: &str) -> Vec<(usize, String)> {
    let mut v = Vec::new();
    let mut why: Vec<&str> = Vec::new();
    for l in stderr.lines() {
        if let Some(rest) = l.strip_prefix("Command failed ") {
            if let Some(n) = rest.rsplit(':').next().and_then(|n| n.trim().parse().ok()) {
                v.push((n, why.join("; ")));
            }
            why.clear();
        } else if !l.trim().is_empty() && !l.starts_with("Warning:") {
            why.push(l.trim());
        }
    }
    v
}

/// [`run_tc_batch`], with `force` tc's `-force`: on past a failing line (for removals whose
/// objects may be gone already); the error then names the first line that failed.
pub(crate) fn tc_batch_with(
    batch: &str,
    opts: &ApplyOptions,
    force: bool,
) -> Result<(), RenderError> {
    let args = tc_batch_args(force);
    let (code, err) = tc_batch_status(batch, opts, force)?;
    if code != 0 {
        // "Command failed -:N": name the first failed line itself
        let failures = batch_failures(&err);
        let line = failures
            .first()
            .and_then(|(n, _)| batch.lines().nth(n.saturating_sub(1)))
            .map(|l| format!("tc {l}"))
            .unwrap_or_else(|| format!("tc {}", args.join(" ")));
        let why = match failures.first() {
            Some((_, why)) => why.clone(),
            None => err
                .lines()
                .filter(|l| !l.trim().is_empty() && !l.starts_with("Warning:"))
                .map(str::trim)
                .collect::<Vec<_>>()
                .join("; "),
        };
        return Err(RenderError::Apply {
            cmd: line,
            err: why,
        });
    }
    Ok(())
}

/// Removes what mimic installed and nothing else: the netem backend deletes a root qdisc only
/// when it is mimic's (read back by handle); the dummynet backend runs [`teardown`]'s commands.
/// Returns the interfaces (netem) it removed mimic's qdiscs from.
pub fn apply_teardown(
    backend: Backend,
    table: Option<&PipeTable>,
    ropts: &RenderOptions,
    opts: &ApplyOptions,
) -> Result<ApplyReport, RenderError> {
    check_interfaces(ropts)?;
    let mut report = ApplyReport::default();
    match backend {
        Backend::Netem => {
            for dev in [&ropts.server_if, &ropts.client_if] {
                if root_qdisc(dev, opts)? == RootQdisc::Mimic {
                    tc_run(
                        opts,
                        &["qdisc", "del", "dev", dev, "root", "handle", TC_HANDLE],
                    )?;
                    report.replaced.push(dev.clone());
                    report.commands += 1;
                }
            }
        }
        Backend::Dummynet => {
            let s = teardown(backend, table, ropts)?;
            ensure_ipfw()?;
            for c in &s.cleanup {
                run_argv(c, true)?;
            }
            report.commands = s.cleanup.len();
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::FlowRule;

    fn opts() -> RenderOptions {
        RenderOptions::new("eth0", "eth1")
    }

    fn default_table(up: &str, down: &str) -> PipeTable {
        PipeTable {
            default: Some((up.parse().unwrap(), down.parse().unwrap())),
            ..Default::default()
        }
    }

    /// One interface for both sides: the downstream root qdisc would replace the upstream
    /// one. Refused by every entry point, before anything runs (no tc is needed here; the
    /// name is one no machine has, so that a regression touches nothing).
    #[test]
    fn one_interface_for_both_sides_is_refused() {
        let t = default_table("delay=1ms", "delay=2ms");
        let o = RenderOptions::new("mimic-t0", "mimic-t0");
        let check = |e: RenderError| {
            let e = e.to_string();
            assert!(
                e.starts_with(
                    "mimic-t0: given as both the client-side and the server-side interface"
                ),
                "{e}"
            );
        };
        for b in [Backend::Netem, Backend::Dummynet] {
            check(render(b, &t, &o).unwrap_err());
            check(teardown(b, Some(&t), &o).unwrap_err());
            let script = render(b, &t, &opts()).unwrap();
            check(apply(b, &script, &o, &ApplyOptions::default()).unwrap_err());
            check(apply_teardown(b, Some(&t), &o, &ApplyOptions::default()).unwrap_err());
        }
    }

    /// Two flow rules of one connection (a table built by hand, or --from with a file): the
    /// second's filters would never match.
    #[test]
    fn a_connection_with_two_flow_rules_is_refused() {
        let rule = |client: &str, server: &str, up: &str| FlowRule {
            client: client.parse().unwrap(),
            server: server.parse().unwrap(),
            up: up.parse().unwrap(),
            down: "delay=1ms".parse().unwrap(),
        };
        let mut t = PipeTable {
            flows: vec![
                rule("198.19.0.7:40000", "198.18.0.1:80", "delay=1ms"),
                rule("198.19.0.7:40001", "198.18.0.1:80", "delay=1ms"),
                rule("198.18.0.1:80", "198.19.0.7:40000", "delay=1ms"),
            ],
            ..Default::default()
        };
        for b in [Backend::Netem, Backend::Dummynet] {
            render(b, &t, &opts()).unwrap();
        }
        t.flows
            .push(rule("198.19.0.7:40000", "198.18.0.1:80", "delay=5ms"));
        for b in [Backend::Netem, Backend::Dummynet] {
            let e = render(b, &t, &opts()).unwrap_err().to_string();
            assert_eq!(
                e,
                "flow #4 198.19.0.7:40000 -> 198.18.0.1:80: the same client and server as flow #1: its filters would never match (one rule per connection)"
            );
        }
    }

    #[test]
    fn backends_by_name_and_by_tool() {
        assert_eq!("netem".parse(), Ok(Backend::Netem));
        assert_eq!("tc".parse(), Ok(Backend::Netem));
        assert_eq!("dummynet".parse(), Ok(Backend::Dummynet));
        assert_eq!("ipfw".parse(), Ok(Backend::Dummynet));
        let e = "mimic".parse::<Backend>().unwrap_err();
        assert!(
            e.contains("`mimic` is not a backend (netem or dummynet"),
            "{e}"
        );
    }

    #[test]
    fn interface_names_a_shell_could_misread_are_refused() {
        let t = default_table("delay=1ms", "delay=1ms");
        for bad in [
            "eth0; touch /tmp/pwned",
            "",
            "a-name-of-16-chr",
            "eth 0",
            "$(id)",
            "eth0`x`",
            "a/b",
            "a:b",
            "..",
            "eth0\n",
        ] {
            for (c, s) in [(bad, "eth1"), ("eth0", bad)] {
                let o = RenderOptions::new(c, s);
                for b in [Backend::Netem, Backend::Dummynet] {
                    let e = render(b, &t, &o).unwrap_err().to_string();
                    assert!(e.contains("interface name"), "{bad:?}: {e}");
                }
                let e = teardown(Backend::Netem, None, &o).unwrap_err().to_string();
                assert!(e.contains("interface name"), "{bad:?}: {e}");
            }
        }
        for good in [
            "eth0",
            "veth-a_b.10",
            "wlp3s0",
            "bond0.100",
            "a@b",
            "x+",
            "abcdefghijklmno",
        ] {
            render(Backend::Netem, &t, &RenderOptions::new(good, "eth1"))
                .unwrap_or_else(|e| panic!("{good}: {e}"));
        }
    }

    #[test]
    fn rules_across_address_families_are_refused_not_rendered() {
        let flow = |client: &str, server: &str| PipeTable {
            flows: vec![FlowRule {
                client: client.parse().unwrap(),
                server: server.parse().unwrap(),
                up: "delay=1ms".parse().unwrap(),
                down: "delay=1ms".parse().unwrap(),
            }],
            ..Default::default()
        };
        for t in [
            flow("[2001:db8::1]:40000", "198.18.0.1:80"),
            flow("198.19.0.7:40000", "[2001:db8::2]:80"),
        ] {
            for b in [Backend::Netem, Backend::Dummynet] {
                let e = render(b, &t, &opts()).unwrap_err().to_string();
                assert!(
                    e.contains("flow #1") && e.contains("different address families"),
                    "{e}"
                );
            }
        }
        let t = PipeTable {
            prefixes: vec![crate::engine::PrefixRule {
                client: "198.19.0.0/24".parse().unwrap(),
                server: "2001:db8::/64".parse().unwrap(),
                up: "delay=1ms".parse().unwrap(),
                down: "delay=1ms".parse().unwrap(),
            }],
            ..Default::default()
        };
        let e = render(Backend::Netem, &t, &opts()).unwrap_err().to_string();
        assert!(
            e.contains("prefix #1") && e.contains("different address families"),
            "{e}"
        );
        render(
            Backend::Netem,
            &flow("[2001:db8::1]:40000", "[2001:db8::2]:80"),
            &opts(),
        )
        .unwrap();
    }

    #[test]
    fn unsupported_features_are_errors() {
        let t = default_table("delay=1500us", "delay=1ms");
        assert!(render(Backend::Dummynet, &t, &opts())
            .unwrap_err()
            .to_string()
            .contains("whole milliseconds"));
        assert!(render(Backend::Netem, &t, &opts()).is_ok());
        // a first-packet delay (a replay's handshake wait) is mimic's datapath's alone
        let t = default_table("delay=1ms", "delay=1ms,first_delay=150ms");
        for b in [Backend::Netem, Backend::Dummynet] {
            assert!(render(b, &t, &opts())
                .unwrap_err()
                .to_string()
                .contains("first_delay"));
        }
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
            // asked to leave them out: rendered, counted and said at the top of the script
            let o = RenderOptions {
                ack_policies: AckPolicies::LeaveOut,
                ..opts()
            };
            let s = render(b, &t, &o).unwrap();
            assert_eq!(s.ack_policies_left_out, 1);
            assert!(s
                .to_shell()
                .lines()
                .nth(2)
                .unwrap()
                .contains("1 pipes rendered WITHOUT their ACK policy"));
        }
        let t = default_table("queue=10kb", "rate=unlimited");
        assert!(render(Backend::Netem, &t, &opts())
            .unwrap_err()
            .to_string()
            .contains("byte queue"));
        assert!(render(Backend::Dummynet, &t, &opts()).is_ok());
    }

    /// Regression (issue 22): a pipe without a rate rendered `netem limit 10 delay 50ms`, so
    /// netem dropped every packet beyond the tenth inside the 50 ms delay line — ACKs that
    /// mimic's own unlimited pipe (whose queue never fills) passes.
    #[test]
    fn netem_limit_of_a_pipe_without_rate_counts_the_delay_line() {
        let t = default_table("delay=50ms,queue=10", "delay=50ms,queue=10");
        let sh = render(Backend::Netem, &t, &opts()).unwrap().to_shell();
        assert!(!sh.contains("netem limit 10 delay"), "{sh}");
        // 10 Gbit/s of 64-byte frames for 50 ms: 976,562.5 -> 976,563, plus the queue
        assert!(sh.contains("netem limit 976573 delay 50ms"), "{sh}");
        // a rate-limited pipe: 10 Mbit/s of 1500-byte packets for 20 ms (16.7 -> 16) + 1 + 50
        let c: PipeConfig = "delay=20ms,rate=10mbit,queue=50".parse().unwrap();
        assert_eq!(netem_limit(&c, 50), 67);
        // jitter lengthens the delay line
        let c: PipeConfig = "delay=20ms,jitter=10ms,rate=10mbit".parse().unwrap();
        assert_eq!(netem_limit(&c, 50), 50 + 25 + 1);
        let c: PipeConfig = "delay=0ms".parse().unwrap();
        assert_eq!(netem_limit(&c, 7), 7);
    }

    /// Regression (issue 22, netem column of the guest replay): a rate-limited pipe was an htb
    /// class at the rate with tc's default bucket, which lets an idle class send two packets
    /// back to back (its bucket plus one packet): every bandwidth miss of two 200-connection
    /// replays in a TCG guest (78 and 77) was an over-estimate. A store-and-forward pipe's rate is now
    /// netem's own (departures computed on arrival, as mimic's pipe does), htb's class
    /// unlimited; a token bucket stays htb's, with the bucket mimic's pipe has.
    #[test]
    fn store_and_forward_rates_are_netems_and_token_buckets_htbs_less_one_packet() {
        let sh = render(
            Backend::Netem,
            &default_table("delay=5ms", "delay=20ms,rate=10mbit,overhead=14,queue=50"),
            &opts(),
        )
        .unwrap()
        .to_shell();
        assert!(
            sh.contains("classid 6d69:2 htb rate 10gbit ceil 10gbit quantum 1514\n"),
            "{sh}"
        );
        assert!(
            sh.contains("handle 2: netem limit 67 delay 20ms rate 10mbit 14\n"),
            "{sh}"
        );
        assert!(!sh.contains("htb rate 10mbit"), "{sh}");
        assert!(!sh.contains("overhead 14"), "{sh}");
        // a token bucket of mimic's: htb, whose bucket is one full packet smaller
        let sh = render(
            Backend::Netem,
            &default_table("delay=5ms", "delay=20ms,rate=10mbit,burst=4500,queue=50"),
            &opts(),
        )
        .unwrap()
        .to_shell();
        assert!(
            sh.contains("htb rate 10mbit ceil 10mbit quantum 1514 burst 3000b cburst 3000b\n"),
            "{sh}"
        );
        assert!(sh.contains("netem limit 67 delay 20ms\n"), "{sh}");
        let c = |s: &str| s.parse::<PipeConfig>().unwrap();
        assert_eq!(htb_burst(&c("rate=10mbit,burst=1500")), Some(1), "empty");
        assert_eq!(
            htb_burst(&c("rate=10mbit,burst=1552,overhead=38")),
            Some(14)
        );
        assert_eq!(htb_burst(&c("rate=10mbit")), Some(1));
        assert_eq!(htb_burst(&c("delay=1ms")), None);
        // the pfifo test leaf cannot shape: the rate stays htb's
        let o = RenderOptions {
            leaf: Leaf::Pfifo,
            ..opts()
        };
        let sh = render(
            Backend::Netem,
            &default_table("delay=5ms", "rate=10mbit"),
            &o,
        )
        .unwrap()
        .to_shell();
        assert!(
            sh.contains("htb rate 10mbit ceil 10mbit quantum 1514 burst 1b cburst 1b"),
            "{sh}"
        );
    }

    #[test]
    fn ipv4_flows_go_to_the_hash_bucket_of_the_client_address() {
        let t = PipeTable {
            flows: vec![FlowRule {
                client: "198.19.3.200:20000".parse().unwrap(),
                server: "198.18.0.1:80".parse().unwrap(),
                up: "delay=5ms".parse().unwrap(),
                down: "delay=5ms,rate=1mbit".parse().unwrap(),
            }],
            ..Default::default()
        };
        let sh = render(Backend::Netem, &t, &opts()).unwrap().to_shell();
        // upstream: the client is the source (offset 12); downstream the destination (16)
        assert!(sh.contains("dev eth1 parent 6d69: prio 1 protocol ip u32 ht 800:: match ip protocol 6 0xff hashkey mask 0x000000ff at 12 link 100:"));
        assert!(sh.contains("dev eth0 parent 6d69: prio 1 protocol ip u32 ht 800:: match ip protocol 6 0xff hashkey mask 0x000000ff at 16 link 100:"));
        assert!(sh.contains("dev eth1 parent 6d69: prio 1 protocol ip u32 ht 100:c8: match ip protocol 6 0xff match ip src 198.19.3.200/32 match ip dst 198.18.0.1/32 match ip sport 20000 0xffff match ip dport 80 0xffff flowid 6d69:10"));
        assert!(sh.contains("dev eth0 parent 6d69: prio 1 protocol ip u32 ht 100:c8: match ip protocol 6 0xff match ip src 198.18.0.1/32 match ip dst 198.19.3.200/32 match ip sport 80 0xffff match ip dport 20000 0xffff flowid 6d69:10"));
    }

    #[test]
    fn class_ids_skip_the_root_major_and_stop_at_the_last_minor() {
        let mut m = TC_FIRST_MINOR;
        let ids: Vec<u32> = std::iter::from_fn(|| (m <= TC_LAST_MINOR).then(|| next_minor(&mut m)))
            .filter(|id| *id <= TC_LAST_MINOR)
            .collect();
        assert_eq!(ids.len(), TC_IDS_PER_IF);
        assert!(!ids.contains(&TC_MAJOR));
        // every pipe and every group takes one number, and the largest table fills them
        assert_eq!(tc_ids_needed(TC_MAX_PIPES_PER_IF), TC_IDS_PER_IF);
        assert!(tc_ids_needed(TC_MAX_PIPES_PER_IF + 1) > TC_IDS_PER_IF);
        let flows = |n: usize| PipeTable {
            flows: (0..n)
                .map(|i| FlowRule {
                    client: std::net::SocketAddr::new(
                        std::net::Ipv4Addr::from(0xc613_0000u32 + i as u32).into(),
                        20_000,
                    ),
                    server: "198.18.0.1:80".parse().unwrap(),
                    up: PipeConfig::default(),
                    down: PipeConfig::default(),
                })
                .collect(),
            ..Default::default()
        };
        let s = render(Backend::Netem, &flows(TC_MAX_PIPES_PER_IF), &opts()).unwrap();
        let sh = s.to_shell();
        // groups first (6d69:10...), then the pipes' leaves up to the last number
        assert!(sh.contains("classid 6d69:10 "));
        assert!(sh.contains(" handle fffe: "));
        assert!(!sh.contains("classid 6d69:6d69 "));
        assert!(!sh.contains(" handle 6d69: htb\n"));
        assert!(!sh.contains(" handle 6d69: pfifo"));
        assert!(matches!(
            render(Backend::Netem, &flows(TC_MAX_PIPES_PER_IF + 1), &opts()),
            Err(RenderError::TooMany { .. })
        ));
    }

    #[test]
    fn more_pipes_than_a_group_go_into_nested_htb_qdiscs_with_two_filters_each() {
        let flow = |i: u32| FlowRule {
            client: std::net::SocketAddr::new(
                std::net::Ipv4Addr::from(0xc613_0000u32 + i).into(),
                20_000,
            ),
            server: "198.18.0.1:80".parse().unwrap(),
            up: "delay=5ms".parse().unwrap(),
            down: "delay=5ms".parse().unwrap(),
        };
        // one group's worth renders flat, as before
        let flat = PipeTable {
            flows: (0..TC_GROUP_PIPES as u32).map(flow).collect(),
            ..Default::default()
        };
        let sh = render(Backend::Netem, &flat, &opts()).unwrap().to_shell();
        assert!(!sh.contains("groups of"));
        assert!(sh.contains("parent 6d69: classid 6d69:10f htb"));
        // one more: two groups, 6d69:10 and 6d69:11, holding 256 and 1 pipes
        let t = PipeTable {
            flows: (0..=TC_GROUP_PIPES as u32).map(flow).collect(),
            ..Default::default()
        };
        let sh = render(Backend::Netem, &t, &opts()).unwrap().to_shell();
        let dev = |d: &str| -> Vec<String> {
            sh.lines()
                .filter(|l| l.contains(&format!("dev {d} ")) && !l.starts_with('#'))
                .map(String::from)
                .collect()
        };
        let up = dev("eth1");
        let count = |what: &str| up.iter().filter(|l| l.contains(what)).count();
        assert_eq!(count("parent 6d69: classid 6d69:"), 3); // catch-all + 2 groups
        assert!(up.contains(&"tc qdisc add dev eth1 parent 6d69:10 handle 10: htb".into()));
        assert!(up.contains(&"tc qdisc add dev eth1 parent 6d69:11 handle 11: htb".into()));
        assert_eq!(count("parent 10: classid 10:"), TC_GROUP_PIPES);
        assert_eq!(count("parent 11: classid 11:1 "), 1);
        // leaves take the numbers after the groups
        assert!(up
            .iter()
            .any(|l| l.contains("parent 10:1 handle 12: netem")));
        assert!(up
            .iter()
            .any(|l| l.contains("parent 11:1 handle 112: netem")));
        // the last flow (198.19.1.0) is filtered to its group at the root and to its class
        // in the group, each level with its hash table
        assert!(sh.contains("tc filter add dev eth1 parent 6d69: prio 1 protocol ip u32 ht 100:0: match ip protocol 6 0xff match ip src 198.19.1.0/32 match ip dst 198.18.0.1/32 match ip sport 20000 0xffff match ip dport 80 0xffff flowid 6d69:11\n"));
        assert!(sh.contains("tc filter add dev eth1 parent 11: prio 1 protocol ip u32 ht 100:0: match ip protocol 6 0xff match ip src 198.19.1.0/32 match ip dst 198.18.0.1/32 match ip sport 20000 0xffff match ip dport 80 0xffff flowid 11:1\n"));
        for parent in ["6d69:", "10:", "11:"] {
            assert_eq!(
                count(&format!(
                    "parent {parent} prio 1 handle 100: protocol ip u32 divisor 256"
                )),
                1,
                "{parent}"
            );
        }
        assert_eq!(count("filter add"), 2 * (TC_GROUP_PIPES + 1) + 3 * 2);
        // the class walk the kernel does per new class stays within a group
        let classes_per_qdisc = |q: &str| count(&format!("parent {q} classid"));
        assert!(["6d69:", "10:", "11:"]
            .iter()
            .all(|q| classes_per_qdisc(q) <= TC_GROUP_PIPES));
    }

    #[test]
    fn batch_drops_the_program_name_and_the_cleanup() {
        let t = default_table("delay=1ms", "delay=1ms");
        let s = render(Backend::Netem, &t, &opts()).unwrap();
        let b = s.to_batch();
        assert!(b
            .lines()
            .all(|l| l.starts_with('#') || l.starts_with("qdisc ") || l.starts_with("class ")));
        assert_eq!(
            b.lines().filter(|l| !l.starts_with('#')).count(),
            s.commands.len()
        );
        assert!(!b.contains(" del "));
        assert!(s
            .to_shell()
            .contains("tc qdisc del dev eth1 root handle 6d69: 2>/dev/null || true\ntc qdisc add dev eth1 root handle 6d69: "));
    }

    #[test]
    fn teardown_removes_only_mimics_handles_and_rule_set() {
        let sh = teardown(Backend::Netem, None, &opts()).unwrap().to_shell();
        let cmds: Vec<&str> = sh.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            cmds,
            [
                "tc qdisc del dev eth1 root handle 6d69: 2>/dev/null || true",
                "tc qdisc del dev eth0 root handle 6d69: 2>/dev/null || true"
            ]
        );
        assert!(teardown(Backend::Dummynet, None, &opts()).is_err());
        let t = default_table("delay=1ms", "delay=1ms");
        let sh = teardown(Backend::Dummynet, Some(&t), &opts())
            .unwrap()
            .to_shell();
        let cmds: Vec<&str> = sh.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            cmds,
            [
                "ipfw -q delete set 29 2>/dev/null || true",
                "ipfw -q pipe 32768 delete 2>/dev/null || true",
                "ipfw -q pipe 32769 delete 2>/dev/null || true"
            ]
        );
    }

    #[test]
    fn root_qdisc_is_told_by_its_handle() {
        let j = r#"[{"kind":"noqueue","handle":"0:","root":true,"refcnt":2,"options":{}}]"#;
        assert_eq!(
            parse_root_qdisc(j).unwrap(),
            RootQdisc::KernelDefault("noqueue".into())
        );
        let j = r#"[{"kind":"htb","handle":"6d69:","root":true,"options":{}},{"kind":"pfifo","handle":"10:","parent":"6d69:10"}]"#;
        assert_eq!(parse_root_qdisc(j).unwrap(), RootQdisc::Mimic);
        let j = r#"[{"kind":"tbf","handle":"5:","root":true}]"#;
        assert_eq!(
            parse_root_qdisc(j).unwrap(),
            RootQdisc::Other {
                kind: "tbf".into(),
                handle: "5:".into()
            }
        );
        // someone else's htb at 1: is not mimic's
        let j = r#"[{"kind":"htb","handle":"1:","root":true}]"#;
        assert!(matches!(
            parse_root_qdisc(j).unwrap(),
            RootQdisc::Other { .. }
        ));
        assert!(parse_root_qdisc("nonsense").is_err());
        assert!(parse_root_qdisc("[]").is_err());
    }
}
