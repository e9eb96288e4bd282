//! The engine: classifier, pipes, ACK shapers and one timing wheel, driven by time passed in.
//! It never sees packet bytes beyond the headers it parses, and never reads the clock; the
//! datapath (or a test) hands it frames with their arrival time and an opaque token (a buffer
//! index), and collects departures with [`Engine::poll`].
//!
//! Frames come in on a [`Side`]: from the client side they go through the upstream pipe and
//! out to the server side, and the reverse. A TCP frame matching an exact flow rule (client
//! ip:port, server ip:port — in either direction) uses that rule's pipes; otherwise the first
//! prefix rule whose client and server prefixes match; otherwise the default pipes; otherwise
//! it passes unshaped. Frames that are not IP (ARP...) always pass unshaped.

use std::net::SocketAddr;

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::ack::{AckCounters, AckShaper, Current, Previous};
use crate::classify::{parse_frame, ConnKey, IpNet, L4};
use crate::config::PipeConfig;
use crate::pipe::{Counters, DropReason, Offer, Pipe};
use crate::rng::mix_seed;
use crate::units::Nanos;
use crate::wheel::TimingWheel;

/// The side of the emulator a frame arrived on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Side {
    Client,
    Server,
}

impl Side {
    pub fn other(self) -> Side {
        match self {
            Side::Client => Side::Server,
            Side::Server => Side::Client,
        }
    }
}

/// Direction of a pipe: upstream carries client→server packets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    Up,
    Down,
}

/// Identifies a flow rule for as long as the engine runs (never reused).
pub type RuleId = u64;

/// An exact TCP connection and the pipes for each of its directions.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FlowRule {
    pub client: SocketAddr,
    pub server: SocketAddr,
    /// Client → server.
    pub up: PipeConfig,
    /// Server → client.
    pub down: PipeConfig,
}

/// Packets between a client prefix and a server prefix (any protocol).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PrefixRule {
    pub client: IpNet,
    pub server: IpNet,
    pub up: PipeConfig,
    pub down: PipeConfig,
}

/// Everything a run starts with (the `--pipes` file and `--default`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PipeTable {
    pub default: Option<(PipeConfig, PipeConfig)>,
    #[serde(default)]
    pub prefixes: Vec<PrefixRule>,
    #[serde(default)]
    pub flows: Vec<FlowRule>,
}

impl PipeTable {
    /// The first two flow rules of one client and server, as (earlier, later) indices: a
    /// connection's packets take the first one's pipes, so the later one would never be used.
    /// The one check behind the pipe file's parser, `netemu render --pipes F --from DB` and
    /// the renderers.
    pub fn duplicate_flow(&self) -> Option<(usize, usize)> {
        let mut first = std::collections::HashMap::with_capacity(self.flows.len());
        self.flows
            .iter()
            .enumerate()
            .find_map(|(i, f)| first.insert((f.client, f.server), i).map(|j| (j, i)))
    }
}

/// Limits on what the engine holds; what they refuse is counted or reported.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_flow_rules: usize,
    pub max_prefix_rules: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_flow_rules: 262_144,
            max_prefix_rules: 4_096,
        }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RuleError {
    #[error("flow {client} -> {server} already has rule {existing}")]
    Duplicate {
        client: SocketAddr,
        server: SocketAddr,
        existing: RuleId,
    },
    #[error("flow {client} -> {server} is listed twice in the batch")]
    DuplicateInBatch {
        client: SocketAddr,
        server: SocketAddr,
    },
    #[error("the flow table is full ({limit} rules); remove finished flows first")]
    TableFull { limit: usize },
    #[error("the prefix table is full ({limit} rules)")]
    PrefixTableFull { limit: usize },
    #[error("client and server of {client} -> {server} are of different IP versions")]
    MixedFamilies {
        client: SocketAddr,
        server: SocketAddr,
    },
    #[error("ACK policy (ack_every) is for the client's ACKs: set it on the upstream pipe only ({what})")]
    AckOnDownstream { what: String },
    #[error("ACK policy needs per-connection state: use it in flow rules, not in {what}")]
    AckNeedsFlowRule { what: String },
    #[error("no flow rule {0}")]
    NoSuchRule(RuleId),
}

/// Engine-wide counters (per-pipe counters are in [`PipeCounters`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineStats {
    /// Frames forwarded without a pipe because they are not IP (ARP...).
    pub not_ip: u64,
    /// IP frames no rule or default matched, forwarded unshaped.
    pub unmatched: u64,
    pub flow_rules: u64,
    pub prefix_rules: u64,
    pub pipes: u64,
    /// Packets scheduled in the wheel right now.
    pub scheduled: u64,
    /// What every pipe of each direction did since the start, removed pipes included
    /// (what `netemu run` prints at exit and exposes on `/metrics`).
    #[serde(default)]
    pub up: DirectionTotals,
    #[serde(default)]
    pub down: DirectionTotals,
}

/// The counters of all pipes of one direction, summed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirectionTotals {
    /// Packets (and their IP bytes) that entered a pipe: not dropped by it.
    pub packets: u64,
    pub bytes: u64,
    pub queue_drops: u64,
    pub loss_drops: u64,
}

impl DirectionTotals {
    /// Counts what a pipe did with one packet, as [`Pipe::offer`] counts it in the pipe.
    fn tally(&mut self, ip_len: u32, offer: &Offer) {
        match offer {
            Offer::Deliver(_) => {
                self.packets += 1;
                self.bytes += ip_len as u64;
            }
            Offer::Dropped(DropReason::Queue) => self.queue_drops += 1,
            Offer::Dropped(DropReason::Loss) => self.loss_drops += 1,
        }
    }

    /// Adds one pipe's counters (the tests' sum of what the pipes themselves counted).
    #[cfg(test)]
    fn add(&mut self, c: &Counters) {
        self.packets += c.packets;
        self.bytes += c.bytes;
        self.queue_drops += c.queue_drops;
        self.loss_drops += c.loss_drops;
    }
}

/// What the engine did with a frame handed to [`Engine::handle`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Not shaped: send it to the other side now.
    Forward,
    /// Queued; it comes out of [`Engine::poll`] at this instant.
    Scheduled(Nanos),
    /// Held by the ACK shaper; it comes out of `poll` later (or is discarded there).
    Held,
    /// Dropped by the pipe: the caller frees the token.
    Dropped(DropReason),
}

/// Output of [`Engine::poll`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action<T> {
    /// Send the frame to `out` (it was due at `due`).
    Send { token: T, out: Side, due: Nanos },
    /// The frame will never be sent (a thinned ACK): free it.
    Discard { token: T },
}

/// Which pipe a counter row is about.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum PipeOwner {
    Default,
    Prefix {
        index: usize,
        client: IpNet,
        server: IpNet,
    },
    Flow {
        rule: RuleId,
        client: SocketAddr,
        server: SocketAddr,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PipeCounters {
    pub owner: PipeOwner,
    pub direction: Direction,
    pub config: PipeConfig,
    #[serde(flatten)]
    pub counters: Counters,
    /// ACK shaping on this (upstream, flow-rule) pipe.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub ack: Option<AckCounters>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct PipeId(u32);

struct PipeSlot {
    pipe: Pipe,
    retired: bool,
}

struct FlowEntry<T> {
    id: RuleId,
    key: ConnKey,
    up: PipeId,
    down: PipeId,
    ack: Option<AckShaper<T>>,
}

#[derive(Clone, Copy)]
enum Ev<T> {
    Depart {
        token: T,
        pipe: PipeId,
        out: Side,
    },
    AckTimer {
        slot: u32,
        rule: RuleId,
        generation: u32,
    },
}

pub struct Engine<T> {
    pipes: Vec<Option<PipeSlot>>,
    free: Vec<u32>,
    default: Option<(PipeId, PipeId)>,
    prefixes: Vec<(PrefixRule, PipeId, PipeId)>,
    /// Connection → slot in `flows` (one hash lookup per packet).
    by_key: FxHashMap<ConnKey, u32>,
    /// Rule id → slot in `flows` (control operations).
    rules: FxHashMap<RuleId, u32>,
    flows: Vec<Option<FlowEntry<T>>>,
    free_flows: Vec<u32>,
    next_rule: RuleId,
    wheel: TimingWheel<Ev<T>>,
    due: Vec<(Nanos, Ev<T>)>,
    limits: Limits,
    stats: EngineStats,
    /// What every pipe did since the start, by direction (up, down), kept as packets are
    /// offered: reading them costs nothing at any number of pipes (summing 131,072 pipes'
    /// counters took 7.5 ms, a stall of the datapath thread at every `/metrics` scrape).
    totals: [DirectionTotals; 2],
    seed_base: u64,
}

fn check_no_ack(cfg: &PipeConfig, what: &str) -> Result<(), RuleError> {
    if cfg.ack.is_some() {
        return Err(RuleError::AckNeedsFlowRule { what: what.into() });
    }
    Ok(())
}

impl<T: Copy> Engine<T> {
    /// An engine with the table's default, prefix and flow rules. `seed_base` feeds the seeds
    /// of pipes whose config names none (each pipe gets its own, derived from its identity).
    pub fn new(table: &PipeTable, limits: Limits, seed_base: u64) -> Result<Engine<T>, RuleError> {
        let mut e = Engine {
            pipes: Vec::new(),
            free: Vec::new(),
            default: None,
            prefixes: Vec::new(),
            by_key: FxHashMap::default(),
            rules: FxHashMap::default(),
            flows: Vec::new(),
            free_flows: Vec::new(),
            next_rule: 1,
            wheel: TimingWheel::new(),
            due: Vec::new(),
            limits,
            stats: EngineStats::default(),
            totals: [DirectionTotals::default(); 2],
            seed_base,
        };
        if let Some((up, down)) = &table.default {
            e.set_default(Some((up.clone(), down.clone())))?;
        }
        for p in &table.prefixes {
            e.add_prefix(p.clone())?;
        }
        e.add_flows(&table.flows)?;
        Ok(e)
    }

    fn new_pipe(&mut self, cfg: PipeConfig, seed_parts: &[u64]) -> PipeId {
        let mut parts = vec![self.seed_base];
        parts.extend_from_slice(seed_parts);
        let pipe = Pipe::new(cfg, mix_seed(&parts));
        let slot = PipeSlot {
            pipe,
            retired: false,
        };
        self.stats.pipes += 1;
        if let Some(i) = self.free.pop() {
            self.pipes[i as usize] = Some(slot);
            PipeId(i)
        } else {
            self.pipes.push(Some(slot));
            PipeId(self.pipes.len() as u32 - 1)
        }
    }

    fn pipe(&mut self, id: PipeId) -> &mut Pipe {
        &mut self.pipes[id.0 as usize]
            .as_mut()
            .expect("live pipe id")
            .pipe
    }

    /// Takes a pipe out of service (freed once its last packet left); its packets stay in
    /// the direction's totals.
    fn retire(&mut self, id: PipeId) -> Counters {
        let slot = self.pipes[id.0 as usize].as_mut().expect("live pipe id");
        let c = slot.pipe.counters;
        if c.in_flight == 0 {
            self.pipes[id.0 as usize] = None;
            self.free.push(id.0);
            self.stats.pipes -= 1;
        } else {
            slot.retired = true;
        }
        c
    }

    /// Replaces the default pipes (`None`: unmatched IP packets pass unshaped).
    pub fn set_default(&mut self, d: Option<(PipeConfig, PipeConfig)>) -> Result<(), RuleError> {
        if let Some((up, down)) = &d {
            check_no_ack(up, "the default pipe")?;
            check_no_ack(down, "the default pipe")?;
        }
        if let Some((u, dn)) = self.default.take() {
            self.retire(u);
            self.retire(dn);
        }
        if let Some((up, down)) = d {
            let u = self.new_pipe(up, &[0, 0]);
            let dn = self.new_pipe(down, &[0, 1]);
            self.default = Some((u, dn));
        }
        Ok(())
    }

    /// Appends a prefix rule (rules are tried in order).
    pub fn add_prefix(&mut self, rule: PrefixRule) -> Result<usize, RuleError> {
        if self.prefixes.len() >= self.limits.max_prefix_rules {
            return Err(RuleError::PrefixTableFull {
                limit: self.limits.max_prefix_rules,
            });
        }
        check_no_ack(&rule.up, "a prefix rule")?;
        check_no_ack(&rule.down, "a prefix rule")?;
        let i = self.prefixes.len() as u64;
        let u = self.new_pipe(rule.up.clone(), &[1, i, 0]);
        let d = self.new_pipe(rule.down.clone(), &[1, i, 1]);
        self.prefixes.push((rule, u, d));
        self.stats.prefix_rules += 1;
        Ok(self.prefixes.len() - 1)
    }

    /// Adds flow rules, all or none: on any error nothing is added.
    pub fn add_flows(&mut self, rules: &[FlowRule]) -> Result<Vec<RuleId>, RuleError> {
        if self.rules.len() + rules.len() > self.limits.max_flow_rules {
            return Err(RuleError::TableFull {
                limit: self.limits.max_flow_rules,
            });
        }
        let mut batch = rustc_hash::FxHashSet::default();
        for r in rules {
            if r.client.is_ipv4() != r.server.is_ipv4() {
                return Err(RuleError::MixedFamilies {
                    client: r.client,
                    server: r.server,
                });
            }
            if r.down.ack.is_some() {
                return Err(RuleError::AckOnDownstream {
                    what: format!("flow {} -> {}", r.client, r.server),
                });
            }
            let key = ConnKey {
                client: r.client,
                server: r.server,
            };
            if let Some(&slot) = self.by_key.get(&key) {
                let existing = self.flows[slot as usize].as_ref().expect("indexed flow").id;
                return Err(RuleError::Duplicate {
                    client: r.client,
                    server: r.server,
                    existing,
                });
            }
            if !batch.insert(key) {
                return Err(RuleError::DuplicateInBatch {
                    client: r.client,
                    server: r.server,
                });
            }
        }
        let mut ids = Vec::with_capacity(rules.len());
        for r in rules {
            let id = self.next_rule;
            self.next_rule += 1;
            let key = ConnKey {
                client: r.client,
                server: r.server,
            };
            let h = key_hash(&key);
            let up = self.new_pipe(r.up.clone(), &[2, h, 0]);
            let down = self.new_pipe(r.down.clone(), &[2, h, 1]);
            let ack = r.up.ack.map(AckShaper::new);
            let entry = FlowEntry {
                id,
                key,
                up,
                down,
                ack,
            };
            let slot = match self.free_flows.pop() {
                Some(s) => {
                    self.flows[s as usize] = Some(entry);
                    s
                }
                None => {
                    self.flows.push(Some(entry));
                    self.flows.len() as u32 - 1
                }
            };
            self.rules.insert(id, slot);
            self.by_key.insert(key, slot);
            ids.push(id);
        }
        self.stats.flow_rules = self.rules.len() as u64;
        Ok(ids)
    }

    /// Changes the pipes of a flow rule in place (counters and scheduled packets stay).
    pub fn update_flow(
        &mut self,
        id: RuleId,
        up: Option<PipeConfig>,
        down: Option<PipeConfig>,
        now: Nanos,
    ) -> Result<(), RuleError> {
        let slot = *self.rules.get(&id).ok_or(RuleError::NoSuchRule(id))? as usize;
        let e = self.flows[slot].as_ref().expect("indexed flow");
        if down.as_ref().is_some_and(|d| d.ack.is_some()) {
            return Err(RuleError::AckOnDownstream {
                what: format!("rule {id}"),
            });
        }
        let (u, d) = (e.up, e.down);
        if let Some(up) = up {
            let policy = up.ack;
            self.pipe(u).reconfigure(up);
            let e = self.flows[slot].as_mut().expect("indexed flow");
            match (policy, e.ack.as_mut()) {
                (Some(p), Some(s)) => s.policy = p,
                (Some(p), None) => e.ack = Some(AckShaper::new(p)),
                (None, Some(_)) => {
                    // Policy removed: let a held ACK go now.
                    if let Some(h) = e.ack.take().and_then(|mut s| s.flush()) {
                        self.enqueue_release(u, h.token, h.ip_len, now);
                    }
                }
                (None, None) => {}
            }
        }
        if let Some(down) = down {
            self.pipe(d).reconfigure(down);
        }
        Ok(())
    }

    /// Removes flow rules; returns the final counters of each (up, down). Unknown ids are
    /// skipped. A held ACK is sent; packets already scheduled still leave on time.
    pub fn remove_flows(
        &mut self,
        ids: &[RuleId],
        now: Nanos,
    ) -> Vec<(RuleId, Counters, Counters)> {
        let mut out = Vec::new();
        for &id in ids {
            let Some(slot) = self.rules.remove(&id) else {
                continue;
            };
            let mut e = self.flows[slot as usize].take().expect("indexed flow");
            self.free_flows.push(slot);
            self.by_key.remove(&e.key);
            if let Some(h) = e.ack.as_mut().and_then(|s| s.flush()) {
                self.enqueue_release(e.up, h.token, h.ip_len, now);
            }
            let cu = self.retire(e.up);
            let cd = self.retire(e.down);
            out.push((id, cu, cd));
        }
        self.stats.flow_rules = self.rules.len() as u64;
        out
    }

    pub fn stats(&self) -> EngineStats {
        let mut s = self.stats;
        s.scheduled = self.wheel.len() as u64;
        [s.up, s.down] = self.totals;
        s
    }

    /// Counters of every live pipe: default, prefix rules, flow rules (by rule id).
    pub fn counters(&self) -> Vec<PipeCounters> {
        let mut v = Vec::new();
        let row = |owner: PipeOwner, dir: Direction, id: PipeId, ack: Option<AckCounters>| {
            let p = &self.pipes[id.0 as usize].as_ref().expect("live").pipe;
            PipeCounters {
                owner,
                direction: dir,
                config: p.config().clone(),
                counters: p.counters,
                ack,
            }
        };
        if let Some((u, d)) = self.default {
            v.push(row(PipeOwner::Default, Direction::Up, u, None));
            v.push(row(PipeOwner::Default, Direction::Down, d, None));
        }
        for (i, (r, u, d)) in self.prefixes.iter().enumerate() {
            let owner = PipeOwner::Prefix {
                index: i,
                client: r.client,
                server: r.server,
            };
            v.push(row(owner.clone(), Direction::Up, *u, None));
            v.push(row(owner, Direction::Down, *d, None));
        }
        let mut ids: Vec<(&RuleId, &u32)> = self.rules.iter().collect();
        ids.sort();
        for (id, slot) in ids {
            let e = self.flows[*slot as usize].as_ref().expect("indexed flow");
            let owner = PipeOwner::Flow {
                rule: *id,
                client: e.key.client,
                server: e.key.server,
            };
            v.push(row(
                owner.clone(),
                Direction::Up,
                e.up,
                e.ack.as_ref().map(|s| s.counters),
            ));
            v.push(row(owner, Direction::Down, e.down, None));
        }
        v
    }

    /// Offers a packet to a pipe and counts the outcome in the direction's totals.
    fn offer_counted(&mut self, pipe: PipeId, dir: Direction, at: Nanos, ip_len: u32) -> Offer {
        let o = self.pipe(pipe).offer(at, ip_len);
        self.totals[(dir == Direction::Down) as usize].tally(ip_len, &o);
        o
    }

    fn enqueue_release(&mut self, pipe: PipeId, token: T, ip_len: u32, at: Nanos) -> Verdict {
        // a held ACK goes upstream
        match self.offer_counted(pipe, Direction::Up, at, ip_len) {
            Offer::Deliver(t) => {
                self.wheel.insert(
                    t,
                    Ev::Depart {
                        token,
                        pipe,
                        out: Side::Server,
                    },
                );
                Verdict::Scheduled(t)
            }
            Offer::Dropped(r) => {
                // A released ACK lost in the pipe: nobody else holds the token, so discard it
                // through poll like a thinned one.
                self.wheel.insert(
                    at,
                    Ev::Depart {
                        token,
                        pipe: PipeId(u32::MAX),
                        out: Side::Server,
                    },
                );
                Verdict::Dropped(r)
            }
        }
    }

    /// A frame of the given bytes arrived on `side` at `now`.
    pub fn handle(&mut self, now: Nanos, side: Side, frame: &[u8], token: T) -> Verdict {
        let Some(meta) = parse_frame(frame) else {
            self.stats.not_ip += 1;
            return Verdict::Forward;
        };
        let (client_ip, server_ip) = match side {
            Side::Client => (meta.src, meta.dst),
            Side::Server => (meta.dst, meta.src),
        };
        // Exact TCP flow rule?
        if let L4::Tcp(tcp) = meta.l4 {
            let (cport, sport) = match side {
                Side::Client => (tcp.sport, tcp.dport),
                Side::Server => (tcp.dport, tcp.sport),
            };
            let key = ConnKey {
                client: SocketAddr::new(client_ip, cport),
                server: SocketAddr::new(server_ip, sport),
            };
            if let Some(&slot) = self.by_key.get(&key) {
                let e = self.flows[slot as usize].as_mut().expect("indexed flow");
                let rule = e.id;
                let (up, down) = (e.up, e.down);
                match side {
                    Side::Server => {
                        if let Some(s) = e.ack.as_mut() {
                            s.on_server(&tcp);
                        }
                        return self.offer(down, now, meta.ip_len, token, Side::Client);
                    }
                    Side::Client => {
                        let Some(s) = e.ack.as_mut() else {
                            return self.offer(up, now, meta.ip_len, token, Side::Server);
                        };
                        let d = s.on_client(now, &tcp, token, meta.ip_len);
                        match d.previous {
                            Some(Previous::Send(t, len)) => {
                                self.enqueue_release(up, t, len, now);
                            }
                            Some(Previous::Discard(t)) => {
                                self.wheel.insert(
                                    now,
                                    Ev::Depart {
                                        token: t,
                                        pipe: PipeId(u32::MAX),
                                        out: Side::Server,
                                    },
                                );
                            }
                            None => {}
                        }
                        return match d.current {
                            Current::Pass => self.offer(up, now, meta.ip_len, token, Side::Server),
                            Current::Hold(timer) => {
                                if let Some((deadline, generation)) = timer {
                                    self.wheel.insert(
                                        deadline,
                                        Ev::AckTimer {
                                            slot,
                                            rule,
                                            generation,
                                        },
                                    );
                                }
                                Verdict::Held
                            }
                        };
                    }
                }
            }
        }
        let pair = self
            .prefixes
            .iter()
            .find(|(r, _, _)| r.client.contains(client_ip) && r.server.contains(server_ip))
            .map(|(_, u, d)| (*u, *d))
            .or(self.default);
        let Some((up, down)) = pair else {
            self.stats.unmatched += 1;
            return Verdict::Forward;
        };
        match side {
            Side::Client => self.offer(up, now, meta.ip_len, token, Side::Server),
            Side::Server => self.offer(down, now, meta.ip_len, token, Side::Client),
        }
    }

    fn offer(&mut self, pipe: PipeId, now: Nanos, ip_len: u32, token: T, out: Side) -> Verdict {
        // a packet that leaves towards the client went down
        let dir = if out == Side::Client {
            Direction::Down
        } else {
            Direction::Up
        };
        match self.offer_counted(pipe, dir, now, ip_len) {
            Offer::Deliver(t) => {
                self.wheel.insert(t, Ev::Depart { token, pipe, out });
                Verdict::Scheduled(t)
            }
            Offer::Dropped(r) => Verdict::Dropped(r),
        }
    }

    /// The next instant something is due (a departure or an ACK timer).
    pub fn next_deadline(&self) -> Option<Nanos> {
        self.wheel.next_deadline()
    }

    /// Everything due at or before `now`, in departure order.
    pub fn poll(&mut self, now: Nanos, out: &mut Vec<Action<T>>) {
        loop {
            let mut due = std::mem::take(&mut self.due);
            self.wheel.pop_due(now, &mut due);
            if due.is_empty() {
                self.due = due;
                return;
            }
            for (at, ev) in due.drain(..) {
                match ev {
                    Ev::Depart {
                        token,
                        pipe,
                        out: side,
                    } => {
                        if pipe.0 == u32::MAX {
                            out.push(Action::Discard { token });
                            continue;
                        }
                        let slot = self.pipes[pipe.0 as usize]
                            .as_mut()
                            .expect("pipe of a scheduled packet");
                        slot.pipe.departed();
                        if slot.retired && slot.pipe.counters.in_flight == 0 {
                            self.pipes[pipe.0 as usize] = None;
                            self.free.push(pipe.0);
                            self.stats.pipes -= 1;
                        }
                        out.push(Action::Send {
                            token,
                            out: side,
                            due: at,
                        });
                    }
                    Ev::AckTimer {
                        slot,
                        rule,
                        generation,
                    } => {
                        let Some(e) = self
                            .flows
                            .get_mut(slot as usize)
                            .and_then(|e| e.as_mut())
                            .filter(|e| e.id == rule)
                        else {
                            continue;
                        };
                        let up = e.up;
                        if let Some(h) = e.ack.as_mut().and_then(|s| s.on_timer(generation)) {
                            // Released at its deadline, so the pipe sees the exact instant.
                            self.enqueue_release(up, h.token, h.ip_len, at);
                        }
                    }
                }
            }
            self.due = due;
        }
    }
}

fn key_hash(k: &ConnKey) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = rustc_hash::FxHasher::default();
    k.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::tests::{tcp_frame, udp_frame};
    use crate::classify::{TCP_ACK, TCP_PSH, TCP_SYN};

    const MS: Nanos = 1_000_000;
    const CLI: [u8; 4] = [198, 19, 0, 5];
    const SRV: [u8; 4] = [198, 18, 0, 1];

    fn drain(e: &mut Engine<u32>, until: Nanos) -> Vec<Action<u32>> {
        let mut out = Vec::new();
        let mut steps = 0;
        while let Some(t) = e.next_deadline() {
            if t > until {
                break;
            }
            e.poll(t, &mut out);
            steps += 1;
            assert!(steps < 1_000_000, "engine makes no progress");
        }
        out
    }

    fn table(default: &str) -> PipeTable {
        PipeTable {
            default: Some((default.parse().unwrap(), default.parse().unwrap())),
            ..Default::default()
        }
    }

    #[test]
    fn default_pipe_delays_both_ways_and_arp_passes() {
        let mut e: Engine<u32> = Engine::new(&table("delay=20ms"), Limits::default(), 1).unwrap();
        let f = udp_frame(CLI, SRV, 10);
        assert_eq!(
            e.handle(0, Side::Client, &f, 1),
            Verdict::Scheduled(20 * MS)
        );
        let back = udp_frame(SRV, CLI, 10);
        assert_eq!(
            e.handle(20 * MS, Side::Server, &back, 2),
            Verdict::Scheduled(40 * MS)
        );
        let mut arp = vec![0u8; 42];
        arp[12] = 8;
        arp[13] = 6;
        assert_eq!(e.handle(0, Side::Client, &arp, 3), Verdict::Forward);
        let acts = drain(&mut e, u64::MAX);
        assert_eq!(
            acts,
            vec![
                Action::Send {
                    token: 1,
                    out: Side::Server,
                    due: 20 * MS
                },
                Action::Send {
                    token: 2,
                    out: Side::Client,
                    due: 40 * MS
                }
            ]
        );
        let c = e.counters();
        assert_eq!(c[0].counters.packets, 1);
        assert_eq!(c[0].counters.in_flight, 0);
        assert_eq!(e.stats().not_ip, 1);
    }

    #[test]
    fn flow_rules_match_both_directions_and_beat_the_default() {
        let mut e: Engine<u32> = Engine::new(&table("delay=50ms"), Limits::default(), 1).unwrap();
        let ids = e
            .add_flows(&[
                FlowRule {
                    client: "198.19.0.5:4000".parse().unwrap(),
                    server: "198.18.0.1:80".parse().unwrap(),
                    up: "delay=10ms".parse().unwrap(),
                    down: "delay=11ms".parse().unwrap(),
                },
                FlowRule {
                    client: "198.19.0.5:4001".parse().unwrap(),
                    server: "198.18.0.1:80".parse().unwrap(),
                    up: "delay=30ms".parse().unwrap(),
                    down: "delay=31ms".parse().unwrap(),
                },
            ])
            .unwrap();
        assert_eq!(ids, vec![1, 2]);
        let a = tcp_frame(CLI, 4000, SRV, 80, TCP_SYN, 0, 0, 0, false);
        let b = tcp_frame(CLI, 4001, SRV, 80, TCP_SYN, 0, 0, 0, false);
        let a_back = tcp_frame(SRV, 80, CLI, 4000, TCP_SYN | TCP_ACK, 0, 1, 0, false);
        let other = tcp_frame(CLI, 4002, SRV, 80, TCP_SYN, 0, 0, 0, false);
        assert_eq!(
            e.handle(0, Side::Client, &a, 1),
            Verdict::Scheduled(10 * MS)
        );
        assert_eq!(
            e.handle(0, Side::Client, &b, 2),
            Verdict::Scheduled(30 * MS)
        );
        assert_eq!(
            e.handle(0, Side::Server, &a_back, 3),
            Verdict::Scheduled(11 * MS)
        );
        assert_eq!(
            e.handle(0, Side::Client, &other, 4),
            Verdict::Scheduled(50 * MS)
        );
        // Duplicates are refused, all or nothing.
        let dup = e.add_flows(&[
            FlowRule {
                client: "198.19.0.5:4009".parse().unwrap(),
                server: "198.18.0.1:80".parse().unwrap(),
                up: PipeConfig::default(),
                down: PipeConfig::default(),
            },
            FlowRule {
                client: "198.19.0.5:4000".parse().unwrap(),
                server: "198.18.0.1:80".parse().unwrap(),
                up: PipeConfig::default(),
                down: PipeConfig::default(),
            },
        ]);
        assert!(matches!(dup, Err(RuleError::Duplicate { existing: 1, .. })));
        assert_eq!(e.stats().flow_rules, 2);
        let c = e.counters();
        let flow1: Vec<_> = c
            .iter()
            .filter(|r| matches!(r.owner, PipeOwner::Flow { rule: 1, .. }))
            .collect();
        assert_eq!(
            (flow1[0].counters.packets, flow1[1].counters.packets),
            (1, 1)
        );
        // the direction totals are the sum of the pipes
        let before = e.stats();
        let sum = |dir: Direction| -> u64 {
            c.iter()
                .filter(|r| r.direction == dir)
                .map(|r| r.counters.packets)
                .sum()
        };
        assert_eq!(
            (before.up.packets, before.down.packets),
            (sum(Direction::Up), sum(Direction::Down))
        );
        // Removal returns the final counters; pipes with packets in flight live until they leave.
        let removed = e.remove_flows(&[1, 77], 0);
        assert_eq!(removed.len(), 1);
        assert_eq!(removed[0].1.packets, 1);
        // a removed flow's packets stay in the totals (counters never go back)
        assert_eq!((e.stats().up, e.stats().down), (before.up, before.down));
        assert_eq!(
            e.handle(0, Side::Client, &a, 5),
            Verdict::Scheduled(50 * MS)
        );
        let acts = drain(&mut e, u64::MAX);
        assert_eq!(acts.len(), 5);
        assert_eq!(e.stats().up.packets, before.up.packets + 1);
        assert_eq!(e.stats().down, before.down);
        assert_eq!(e.stats().pipes, 4); // default pair + rule 2
    }

    /// The direction totals are kept as packets are offered (so reading them costs nothing
    /// at 65,536 pipes); they must still be what the pipes' own counters add up to, with
    /// losses, queue drops, held ACKs released by removal and a replaced default pipe.
    #[test]
    fn direction_totals_equal_the_pipes_counters_through_drops_and_removals() {
        let mut e: Engine<u32> =
            Engine::new(&table("delay=1ms,loss=10%"), Limits::default(), 7).unwrap();
        let rules: Vec<FlowRule> = (0..40u16)
            .map(|i| FlowRule {
                client: std::net::SocketAddr::new(CLI.into(), 5000 + i),
                server: "198.18.0.1:80".parse().unwrap(),
                up: "delay=5ms,loss=5%,ack_every=4,ack_timeout=200ms"
                    .parse()
                    .unwrap(),
                down: "delay=5ms,rate=1mbit,queue=3,loss=2%".parse().unwrap(),
            })
            .collect();
        let ids = e.add_flows(&rules).unwrap();
        let sum = |rows: &[PipeCounters], dir: Direction| {
            let mut t = DirectionTotals::default();
            for r in rows.iter().filter(|r| r.direction == dir) {
                t.add(&r.counters);
            }
            t
        };
        let mut token = 0u32;
        let mut traffic = |e: &mut Engine<u32>, from: Nanos| {
            for round in 0..30u32 {
                let now = from + round as Nanos * MS;
                for i in 0..40u16 {
                    let data = tcp_frame(
                        SRV,
                        80,
                        CLI,
                        5000 + i,
                        TCP_ACK | TCP_PSH,
                        round * 1448,
                        1,
                        1448,
                        false,
                    );
                    let ack = tcp_frame(
                        CLI,
                        5000 + i,
                        SRV,
                        80,
                        TCP_ACK,
                        1,
                        (round + 1) * 1448,
                        0,
                        false,
                    );
                    let stray = udp_frame(CLI, SRV, 100 + i as usize);
                    for (side, f) in [
                        (Side::Server, &data),
                        (Side::Client, &ack),
                        (Side::Client, &stray),
                    ] {
                        token += 1;
                        e.handle(now, side, f, token);
                    }
                }
                drain(e, now);
            }
        };
        traffic(&mut e, 0);
        let st = e.stats();
        let rows = e.counters();
        assert_eq!(
            (st.up, st.down),
            (sum(&rows, Direction::Up), sum(&rows, Direction::Down))
        );
        assert!(st.down.queue_drops > 0 && st.down.loss_drops > 0 && st.up.loss_drops > 0);
        // Remove half the flows (their held ACKs are released into their pipes first) and
        // replace the default pipes: what they did stays in the totals.
        let removed = e.remove_flows(&ids[..20], 31 * MS);
        e.set_default(Some((
            "delay=2ms".parse().unwrap(),
            "delay=2ms".parse().unwrap(),
        )))
        .unwrap();
        let gone = |dir_down: bool| {
            let mut t = DirectionTotals::default();
            for (_, up, down) in &removed {
                t.add(if dir_down { down } else { up });
            }
            t
        };
        let (old_up, old_down) = {
            let d = rows
                .iter()
                .find(|r| r.owner == PipeOwner::Default && r.direction == Direction::Up)
                .unwrap();
            let dd = rows
                .iter()
                .find(|r| r.owner == PipeOwner::Default && r.direction == Direction::Down)
                .unwrap();
            (d.counters, dd.counters)
        };
        drain(&mut e, u64::MAX); // the last held ACKs leave at 200 ms after their data
        traffic(&mut e, 1_000 * MS);
        drain(&mut e, u64::MAX);
        let st = e.stats();
        let live = e.counters();
        let (mut want_up, mut want_down) = (sum(&live, Direction::Up), sum(&live, Direction::Down));
        for (w, g, d) in [
            (&mut want_up, gone(false), old_up),
            (&mut want_down, gone(true), old_down),
        ] {
            w.packets += g.packets + d.packets;
            w.bytes += g.bytes + d.bytes;
            w.queue_drops += g.queue_drops + d.queue_drops;
            w.loss_drops += g.loss_drops + d.loss_drops;
        }
        assert_eq!((st.up, st.down), (want_up, want_down));
    }

    #[test]
    fn prefix_rules_in_order_then_unmatched_passes() {
        let mut e: Engine<u32> = Engine::new(&PipeTable::default(), Limits::default(), 1).unwrap();
        e.add_prefix(PrefixRule {
            client: "198.19.0.0/24".parse().unwrap(),
            server: "198.18.0.0/24".parse().unwrap(),
            up: "delay=1ms".parse().unwrap(),
            down: "delay=2ms".parse().unwrap(),
        })
        .unwrap();
        e.add_prefix(PrefixRule {
            client: "198.19.0.0/16".parse().unwrap(),
            server: "0.0.0.0/0".parse().unwrap(),
            up: "delay=3ms".parse().unwrap(),
            down: "delay=4ms".parse().unwrap(),
        })
        .unwrap();
        assert_eq!(
            e.handle(0, Side::Client, &udp_frame(CLI, SRV, 1), 1),
            Verdict::Scheduled(MS)
        );
        assert_eq!(
            e.handle(0, Side::Server, &udp_frame(SRV, CLI, 1), 2),
            Verdict::Scheduled(2 * MS)
        );
        assert_eq!(
            e.handle(
                0,
                Side::Client,
                &udp_frame([198, 19, 9, 9], [1, 1, 1, 1], 1),
                3
            ),
            Verdict::Scheduled(3 * MS)
        );
        assert_eq!(
            e.handle(0, Side::Client, &udp_frame([10, 0, 0, 1], SRV, 1), 4),
            Verdict::Forward
        );
        assert_eq!(e.stats().unmatched, 1);
    }

    #[test]
    fn ack_policy_thins_client_acks_in_the_upstream_pipe() {
        let mut e: Engine<u32> = Engine::new(&PipeTable::default(), Limits::default(), 1).unwrap();
        e.add_flows(&[FlowRule {
            client: "198.19.0.5:4000".parse().unwrap(),
            server: "198.18.0.1:80".parse().unwrap(),
            up: "delay=5ms,ack_every=4,ack_timeout=100ms".parse().unwrap(),
            down: "delay=5ms".parse().unwrap(),
        }])
        .unwrap();
        let ack = |a: u32| tcp_frame(CLI, 4000, SRV, 80, TCP_ACK, 1, a, 0, false);
        // Server data segments of 1000 bytes teach the MSS.
        let data = tcp_frame(SRV, 80, CLI, 4000, TCP_ACK | TCP_PSH, 1, 1, 1000, false);
        e.handle(0, Side::Server, &data, 100);
        assert_eq!(
            e.handle(MS, Side::Client, &ack(1), 1),
            Verdict::Scheduled(6 * MS)
        );
        assert_eq!(e.handle(2 * MS, Side::Client, &ack(2001), 2), Verdict::Held);
        assert_eq!(
            e.handle(3 * MS, Side::Client, &ack(4001), 3),
            Verdict::Scheduled(8 * MS)
        );
        assert_eq!(e.handle(4 * MS, Side::Client, &ack(5001), 4), Verdict::Held);
        let acts = drain(&mut e, u64::MAX);
        assert!(acts.contains(&Action::Discard { token: 2 }));
        // Token 4 is released by the 100 ms timeout (deadline 104 ms) plus 5 ms of delay.
        assert!(
            acts.contains(&Action::Send {
                token: 4,
                out: Side::Server,
                due: 109 * MS
            }),
            "{acts:?}"
        );
        let up = e
            .counters()
            .into_iter()
            .find(|r| r.direction == Direction::Up)
            .unwrap();
        assert_eq!(up.ack.unwrap().thinned, 1);
        assert_eq!(up.ack.unwrap().timeouts, 1);
        // Policy errors are clear.
        let bad = e.add_flows(&[FlowRule {
            client: "198.19.0.6:1".parse().unwrap(),
            server: "198.18.0.1:80".parse().unwrap(),
            up: PipeConfig::default(),
            down: "ack_every=2".parse().unwrap(),
        }]);
        assert!(matches!(bad, Err(RuleError::AckOnDownstream { .. })));
        assert!(e
            .set_default(Some((
                "ack_every=2".parse().unwrap(),
                PipeConfig::default()
            )))
            .is_err());
    }

    #[test]
    fn two_flows_in_two_pipes_do_not_share_queues() {
        let mut e: Engine<u32> = Engine::new(&PipeTable::default(), Limits::default(), 1).unwrap();
        e.add_flows(&[
            FlowRule {
                client: "198.19.0.5:1".parse().unwrap(),
                server: "198.18.0.1:80".parse().unwrap(),
                up: "rate=1mbit,queue=5".parse().unwrap(),
                down: PipeConfig::default(),
            },
            FlowRule {
                client: "198.19.0.5:2".parse().unwrap(),
                server: "198.18.0.1:80".parse().unwrap(),
                up: "rate=100mbit,queue=100".parse().unwrap(),
                down: PipeConfig::default(),
            },
        ])
        .unwrap();
        let mut dropped = [0, 0];
        for i in 0..20u32 {
            for (k, port) in [1u16, 2].iter().enumerate() {
                let f = tcp_frame(CLI, *port, SRV, 80, TCP_ACK, i, 0, 1000, false);
                if let Verdict::Dropped(_) = e.handle(0, Side::Client, &f, i) {
                    dropped[k] += 1;
                }
            }
        }
        assert_eq!(dropped, [15, 0]);
    }

    #[test]
    fn table_limit_is_enforced() {
        let mut e: Engine<u32> = Engine::new(
            &PipeTable::default(),
            Limits {
                max_flow_rules: 2,
                max_prefix_rules: 1,
            },
            1,
        )
        .unwrap();
        let r = |p: u16| FlowRule {
            client: SocketAddr::new([198, 19, 0, 1].into(), p),
            server: "198.18.0.1:80".parse().unwrap(),
            up: PipeConfig::default(),
            down: PipeConfig::default(),
        };
        assert!(e.add_flows(&[r(1), r(2)]).is_ok());
        assert!(matches!(
            e.add_flows(&[r(3)]),
            Err(RuleError::TableFull { limit: 2 })
        ));
    }
}
