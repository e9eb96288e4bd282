//! The plan of a replay: each connection's two pipes, its 4-tuple, when its SYN leaves and how
//! long it may take. Pure: a workload and the options in, flow rules and plans out.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mimic_core::model::MAX_BUCKET_PACKETS;
use mimic_netemu::config::{AckPolicy, LossModel, PipeConfig, QueueLimit};
use mimic_netemu::engine::FlowRule;
use serde::Serialize;

use super::ReplayError;
use crate::client::Planned;
use crate::workload::{ConnSpec, RequestTiming, Workload, DEFAULT_DELACK_TIMEOUT_US};

/// Queue lengths (packets) given on the command line instead of Monkey's rate classes
/// (`mimic_core::model::queue_packets`); a direction left `None` keeps its class's length.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct QueueOverride {
    pub up: Option<u32>,
    pub down: Option<u32>,
}

impl std::str::FromStr for QueueOverride {
    type Err = String;

    /// `N` (both directions) or `up=N`, `down=N`, `up=N,down=M`.
    fn from_str(s: &str) -> Result<Self, String> {
        let packets = |v: &str| -> Result<u32, String> {
            match v.parse::<u32>() {
                Ok(n) if n >= 1 => Ok(n),
                _ => Err(format!(
                    "queue length `{v}` is not a whole number of packets >= 1"
                )),
            }
        };
        let s = s.trim();
        if !s.contains('=') {
            let n = packets(s)?;
            return Ok(QueueOverride {
                up: Some(n),
                down: Some(n),
            });
        }
        let mut q = QueueOverride::default();
        for (k, v) in mimic_netemu::units::key_values(s)? {
            match k {
                "up" => q.up = Some(packets(v)?),
                "down" => q.down = Some(packets(v)?),
                _ => return Err(format!("unknown queue direction `{k}` (up, down)")),
            }
        }
        Ok(q)
    }
}

impl QueueOverride {
    /// The `--queue` value that parses back to this override (None: the rate classes).
    pub fn to_arg(&self) -> Option<String> {
        match (self.up, self.down) {
            (None, None) => None,
            (Some(u), Some(d)) if u == d => Some(u.to_string()),
            (u, d) => Some(
                [("up", u), ("down", d)]
                    .iter()
                    .filter_map(|(k, v)| v.map(|n| format!("{k}={n}")))
                    .collect::<Vec<_>>()
                    .join(","),
            ),
        }
    }
}

impl std::fmt::Display for QueueOverride {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let side = |n: Option<u32>| n.map_or("by rate class".to_string(), |n| n.to_string());
        write!(f, "up={},down={}", side(self.up), side(self.down))
    }
}

/// IP bytes of a SYN-ACK with the usual options (20 + 20 + 20).
const SYNACK_IP_BYTES: f64 = 60.0;

/// Token bucket depth a connection shaped by a token bucket gets at least: one full-size
/// packet.
pub const SHAPER_BURST_BYTES: u32 = 1500;

/// The token bucket depth (bytes) of a connection's downstream pipe: none where
/// [`token_bucket_evident`] says a serializing link; else the analyzer's lead in full-size
/// packets (`shaper_lead_down` measures a deeper bucket's depth: the packets of a busy period
/// that met 2-7 ahead lead by it), at least one packet.
pub fn shaper_burst_bytes(c: &ConnSpec) -> u32 {
    if !token_bucket_evident(c) {
        return 0;
    }
    let lead = c.shaper_lead_down.filter(|l| l.is_finite()).unwrap_or(1.0);
    (lead.clamp(1.0, f64::from(MAX_BUCKET_PACKETS)) * f64::from(SHAPER_BURST_BYTES)).round() as u32
}

/// Whether the connection's bottleneck was a token-bucket shaper rather than a
/// store-and-forward link. A token bucket (tc htb/tbf, dummynet's burst, a cable modem) lets
/// each packet of a busy period leave at the start of its transmission slot, a serializing link
/// at its end; a replay pipe without a bucket delivers every packet one serialization time
/// later than the original's shaper did (the ACK clock runs that much behind), which on the
/// independent testbed's slow classes was 94 ms (128 kbit/s) to 228 ms (56 kbit/s) per
/// multi-window response. Two pieces of evidence, either suffices:
///
/// * the analyzer's `shaper_lead_down` ([`ConnSpec::shaper_lead_down`]): packets that met a
///   short queue were acknowledged sooner than a serializing link at the estimated rate would
///   have let them, by at least half their own serialization time
///   ([`TOKEN_BUCKET_LEAD`]). It compares each packet's round trip with the handshake's, so it
///   holds on paths with propagation delay;
/// * without propagation delay: a minimum RTT shorter than the SYN-ACK's serialization at the
///   estimated rate (the bucket let the idle link's first packet through at once).
///
/// Such a connection's downstream pipe gets a bucket ([`shaper_burst_bytes`]) of one
/// full-size packet, or as many as the lead says. Where neither says so (a measured lead
/// below one half, or nothing measured on a path with delay) the pipe stays a serializing
/// link.
pub fn token_bucket_evident(c: &ConnSpec) -> bool {
    if c.shaper_lead_down.is_some_and(|l| l >= TOKEN_BUCKET_LEAD) && c.bw_bps.is_some() {
        return true;
    }
    match (c.bw_bps, c.min_rtt_us) {
        (Some(bw), Some(rtt)) if bw.is_finite() && bw > 0.0 && rtt >= 0 => {
            (rtt as f64) / 1e6 < SYNACK_IP_BYTES * 8.0 / bw
        }
        _ => false,
    }
}

/// The `shaper_lead_down` at and above which the original's bottleneck is taken for a token
/// bucket (shared with the analyzer, which measures a deeper bucket's depth past it).
pub use mimic_core::model::TOKEN_BUCKET_LEAD;

/// The least extra wait of a handshake that the replay reproduces (below it the difference is
/// the capture host's scheduling, not a queue).
pub const MIN_HANDSHAKE_WAIT_US: i64 = 1_000;

/// The longest handshake wait the replay reproduces (a SYN-ACK held longer than this was
/// not queued behind a link's traffic).
pub const MAX_HANDSHAKE_WAIT_US: i64 = 2_000_000;

/// How much longer the original's handshake took than the replay's path gives it: the
/// handshake's round trip (`hs_rtt_us`) less the minimum RTT and, on a serializing link, the
/// SYN-ACK's serialization at the estimated rate. A SYN-ACK that waited behind other traffic
/// of its link — on the independent testbed's 56 kbit/s class, the previous connection's
/// last packets and the token debt they left at the household's htb class, 60-760 ms — gave
/// the original server a first RTT sample that long, and its tail-loss probe and
/// retransmission timer followed from it. The replay's own pipe, with no such traffic, gave
/// its server 30-40 ms: the probe fired before the first ACK could cross the link (214 ms
/// per full-size packet at 56 kbit/s) and resent what had arrived, moving the tap's last
/// response byte by up to 440 ms (27 of dial-up's 68 misses). The downstream pipe holds its
/// first packet (the SYN-ACK) this much longer. None below [`MIN_HANDSHAKE_WAIT_US`] or
/// without a handshake RTT.
pub fn handshake_wait_us(c: &ConnSpec) -> Option<i64> {
    let (hs, min) = (c.hs_rtt_us?, c.min_rtt_us?);
    let synack_us = match c.bw_bps {
        Some(bw) if bw.is_finite() && bw > 0.0 && !token_bucket_evident(c) => {
            (SYNACK_IP_BYTES * 8.0 / bw * 1e6) as i64
        }
        _ => 0,
    };
    let wait = hs - min.max(0) - synack_us;
    (wait >= MIN_HANDSHAKE_WAIT_US).then(|| wait.min(MAX_HANDSHAKE_WAIT_US))
}

/// Takes the handshake waits ([`handshake_wait_us`]) out of `rules`, for emulators that cannot
/// hold one packet (kernel pipes); returns how many connections had one.
pub fn strip_handshake_waits(rules: &mut [FlowRule]) -> usize {
    let mut n = 0;
    for r in rules {
        if r.down.first_delay > 0 || r.up.first_delay > 0 {
            n += 1;
            r.down.first_delay = 0;
            r.up.first_delay = 0;
        }
    }
    n
}

/// IP bytes of a full-size packet, the unit of a queue length in packets.
const FULL_PACKET_BYTES: f64 = 1500.0;

/// The downstream queue the original's RTT samples show, in full-size packets: its largest
/// data RTT sample less its minimum RTT is time spent queued at the bottleneck, at the
/// estimated rate (samples the client's delayed-ACK timer held are not kept as the largest;
/// see the analyzer). A lower bound of the real queue — it held at least that much — so a
/// replay queue shorter than it drops what the original's did not. On the independent
/// testbed's 1 Mbit/s class (50-packet queues against the rate class's 30) the replay dropped
/// 2-46 packets where the original lost none.
pub fn observed_queue_packets(c: &ConnSpec) -> Option<u32> {
    let (bw, min, max) = (c.bw_bps?, c.min_rtt_us?, c.max_rtt_us?);
    if !(bw.is_finite() && bw > 0.0) || max <= min {
        return None;
    }
    let q = ((max - min) as f64 / 1e6 * bw / 8.0 / FULL_PACKET_BYTES).floor();
    (q >= 1.0).then(|| q.min(MAX_OBSERVED_QUEUE as f64) as u32)
}

/// Cap of an observed queue (packets): RTT samples inflated by something else than the queue
/// (a stalled receiver's host) must not make an unbounded buffer.
pub const MAX_OBSERVED_QUEUE: u32 = 1000;

/// The downstream queue (packets, the one being sent included) a replayed connection gets
/// when `--queue` does not say. Where the original's queue (or its client's: see
/// `orchestrate::queues`) overflowed, the length it overflowed at: a drop at a full queue bounds
/// it from above as well as below, and a longer queue (the rate class's, say) would hold what
/// the original lost. Else the rate class's length (Monkey), or the deeper queue the original
/// showed (its transmissions' model, [`ConnSpec::queue_down_pkts`], or its RTT samples,
/// [`observed_queue_packets`]), which is only a lower bound. On the independent testbed's
/// 1 Mbit/s class (50-packet queues against the class's 30) the lower bound of one connection
/// alone left 55 of 250 replays dropping packets their original had not.
///
/// The analyzer's model serializes every packet, as a store-and-forward link does; a pipe
/// with a token bucket ([`token_bucket_evident`]) lets each packet of a busy period leave one
/// serialization earlier, so at the same load it holds one packet fewer, and gets a queue one
/// shorter than the model's.
pub fn down_queue_packets(c: &ConnSpec) -> u32 {
    let (_, class) = mimic_core::model::queue_packets(c.bw_bps);
    let bucket = u32::from(token_bucket_evident(c));
    let analyzed = c.queue_down_pkts.map(|q| q.saturating_sub(bucket).max(1));
    match analyzed {
        Some(q) if c.queue_down_full => q,
        own => class
            .max(own.unwrap_or(0))
            .max(observed_queue_packets(c).unwrap_or(0)),
    }
}

/// How long the replay's SYN-ACK takes to serialize in the connection's downstream pipe (µs):
/// [`SYNACK_IP_BYTES`] at the estimated rate; 0 without a rate, or where the pipe gets a token
/// bucket (the idle bucket lets it through at once).
pub fn synack_serialization_us(c: &ConnSpec) -> f64 {
    match c.bw_bps {
        Some(bw) if bw.is_finite() && bw > 0.0 && !token_bucket_evident(c) => {
            SYNACK_IP_BYTES * 8.0 / bw * 1e6
        }
        _ => 0.0,
    }
}

/// The one-way delay of a connection's two pipes (µs): half of what is left of its minimum RTT
/// once the SYN-ACK's serialization at the bottleneck is taken out. The tap's handshake RTT
/// holds that serialization already (the SYN-ACK crossed the client's link at its rate), and
/// the downstream pipe serializes the replay's SYN-ACK again: with half the RTT each way, a
/// 33 kbit/s connection's replayed handshake came out 14.5 ms (10%) longer than its original's
/// (a 60-byte SYN-ACK; 8.6 ms at 56 kbit/s, 0.5 ms at 1 Mbit/s), and so did every round trip
/// after it. Never below 0.
pub fn pipe_one_way_us(c: &ConnSpec) -> i64 {
    let rtt = c.min_rtt_us.unwrap_or(0).max(0) as f64;
    ((rtt - synack_serialization_us(c)).max(0.0) / 2.0) as i64
}

/// The two pipes of one replayed connection.
pub fn pipes_for(c: &ConnSpec, seed: u64, queue: QueueOverride) -> (PipeConfig, PipeConfig) {
    let owd_ns = pipe_one_way_us(c) as u64 * 1000;
    let (class_up, _) = mimic_core::model::queue_packets(c.bw_bps);
    let (q_up, q_down) = (
        queue.up.unwrap_or(class_up),
        queue.down.unwrap_or_else(|| down_queue_packets(c)),
    );
    let up = PipeConfig {
        delay: owd_ns,
        queue: QueueLimit::Packets(q_up),
        ack: c.delack_every.map(|every| AckPolicy {
            every,
            timeout: c
                .delack_timeout_us
                .filter(|t| *t > 0 && *t <= super::rates::MAX_DELACK_TIMEOUT_US)
                .unwrap_or(DEFAULT_DELACK_TIMEOUT_US) as u64
                * 1000,
        }),
        seed: Some(seed),
        ..PipeConfig::default()
    };
    let down = PipeConfig {
        delay: owd_ns,
        rate_bps: c.bw_bps.map_or(0, |b| b.round().max(1.0) as u64),
        burst: shaper_burst_bytes(c),
        queue: QueueLimit::Packets(q_down),
        loss: if c.loss_rate_down > 0.0 {
            LossModel::Iid(c.loss_rate_down)
        } else {
            LossModel::None
        },
        seed: Some(seed ^ 0x5bd1_e995),
        first_delay: handshake_wait_us(c).map_or(0, |us| us as u64 * 1000),
        ..PipeConfig::default()
    };
    (up, down)
}

/// The flow rules of a replay of `wl`: connection `i` (in the workload's order) from
/// [`local_addr`]`(client_addrs, i)` to `server` with its two pipes ([`pipes_for`], seeded from
/// `seed` and the original connection id). This is what [`run`] registers with the emulator
/// before each SYN, and what `mimic netemu render --from` renders for tc or ipfw.
pub fn flow_rules(
    wl: &Workload,
    client_addrs: &[Ipv4Addr],
    server: SocketAddr,
    seed: u64,
    queue: QueueOverride,
) -> Result<Vec<FlowRule>, ReplayError> {
    if client_addrs.is_empty() {
        return Err(ReplayError::Invalid(
            "a replay needs at least one client address".into(),
        ));
    }
    let locals: Vec<SocketAddrV4> = (0..wl.conns.len())
        .map(|i| local_addr(client_addrs, i))
        .collect::<Result<_, _>>()?;
    flow_rules_at(wl, &locals, server, seed, queue)
}

/// [`flow_rules`] with each connection's source address and port given (`locals[i]` for
/// connection `i`; a replay over client agents takes them from the agent of each).
pub fn flow_rules_at(
    wl: &Workload,
    locals: &[SocketAddrV4],
    server: SocketAddr,
    seed: u64,
    queue: QueueOverride,
) -> Result<Vec<FlowRule>, ReplayError> {
    if locals.len() != wl.conns.len() {
        return Err(ReplayError::Invalid(format!(
            "{} source addresses for {} connections",
            locals.len(),
            wl.conns.len()
        )));
    }
    wl.conns
        .iter()
        .zip(locals)
        .map(|(c, &local)| {
            let (up, down) = pipes_for(
                c,
                seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ c.orig_id as u64,
                queue,
            );
            Ok(FlowRule {
                client: SocketAddr::V4(local),
                server,
                up,
                down,
            })
        })
        .collect()
}

/// How long a connection may take before it is recorded as timed out.
fn time_limit(c: &ConnSpec) -> Duration {
    let rtt = c.min_rtt_us.unwrap_or(0).max(0) as f64 / 1e6;
    let mut est = 4.0 * rtt;
    for e in &c.exchanges {
        est += (e.think_time_us + e.response_delay_us + e.query_delay_us) as f64 / 1e6 + 4.0 * rtt;
        if let Some(bw) = c.bw_bps {
            est += (e.resp_bytes + e.req_bytes) as f64 * 8.0 * 1.1 / bw;
        }
    }
    // retransmission timeouts back off: allow more time on lossy paths
    Duration::from_secs_f64(3.0 * est * (1.0 + 20.0 * c.loss_rate_down) + 30.0)
}

/// Source addresses and ports: connection `i` gets address `i mod n`, port 20000 + `i div n`,
/// so every replayed 4-tuple is distinct and known before its SYN.
fn local_addr(addrs: &[Ipv4Addr], i: usize) -> Result<SocketAddrV4, ReplayError> {
    let port = 20_000 + i / addrs.len();
    if port > 65_000 {
        return Err(ReplayError::Invalid(format!(
            "{i} connections do not fit the {} client addresses (20000-65000 ports each)",
            addrs.len()
        )));
    }
    Ok(SocketAddrV4::new(addrs[i % addrs.len()], port as u16))
}

/// When each connection starts and how long it may take: its SYN leaves `lead` after the
/// replay begins plus its recorded offset from the first connection (scaled by `time_scale`),
/// less one one-way delay (the SYN left the client that long before the capture point saw it).
pub(super) fn plans(
    wl: &Workload,
    rules: &[FlowRule],
    time_scale: f64,
    request_timing: RequestTiming,
) -> Result<Vec<Planned>, ReplayError> {
    let t_first = wl.conns.iter().map(|c| c.t_start_us).min().unwrap_or(0);
    let max_owd = wl.conns.iter().map(pipe_one_way_us).max().unwrap_or(0);
    let lead = Duration::from_secs(1) + Duration::from_micros(max_owd.max(0) as u64);
    let mut planned = Vec::with_capacity(wl.conns.len());
    for (c, r) in wl.conns.iter().zip(rules) {
        let SocketAddr::V4(local) = r.client else {
            return Err(ReplayError::Invalid(format!(
                "client address {} is not IPv4",
                r.client
            )));
        };
        // the SYN left the client one one-way delay (its pipe's) before the capture point saw it
        let rel_us = ((c.t_start_us - t_first) as f64 * time_scale) as i64 - pipe_one_way_us(c);
        planned.push((local, r.server, rel_us, time_limit(c)));
    }
    let t0 = Instant::now() + lead;
    Ok(wl
        .conns
        .iter()
        .zip(planned)
        .enumerate()
        .map(|(i, (c, (local, server, rel_us, limit)))| Planned {
            index: i,
            spec: Arc::new(c.clone()),
            local,
            server,
            start: if rel_us >= 0 {
                t0 + Duration::from_micros(rel_us as u64)
            } else {
                t0 - Duration::from_micros((-rel_us) as u64)
            },
            limit,
            request_timing,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(bw_bps: Option<f64>, loss: f64, delack: Option<u32>) -> ConnSpec {
        ConnSpec {
            min_rtt_us: Some(40_000),
            bw_bps,
            loss_rate_down: loss,
            delack_every: delack,
            ..ConnSpec::bare(7)
        }
    }

    #[test]
    fn pipes_follow_the_connection_and_monkeys_queue_classes() {
        let (up, down) = pipes_for(&conn(Some(1e6), 0.02, Some(2)), 9, QueueOverride::default());
        // 40 ms less the SYN-ACK's 0.48 ms at 1 Mbit/s, halved
        assert_eq!(up.delay, 19_760_000);
        assert_eq!(down.delay, 19_760_000);
        assert_eq!(up.rate_bps, 0, "upstream is not rate-limited");
        assert_eq!(down.rate_bps, 1_000_000);
        assert_eq!(up.queue, QueueLimit::Packets(10));
        assert_eq!(down.queue, QueueLimit::Packets(30));
        assert!(matches!(up.loss, LossModel::None), "no upstream loss");
        assert!(matches!(down.loss, LossModel::Iid(p) if p == 0.02));
        let ack = up.ack.expect("delayed-ACK shaping");
        assert_eq!(ack.every, 2);
        assert_eq!(ack.timeout, DEFAULT_DELACK_TIMEOUT_US as u64 * 1000);

        let (up, down) = pipes_for(&conn(Some(28e3), 0.0, None), 9, QueueOverride::default());
        assert_eq!(
            (up.queue, down.queue),
            (QueueLimit::Packets(5), QueueLimit::Packets(5))
        );
        assert!(up.ack.is_none() && matches!(down.loss, LossModel::None));
        // an inferred timeout the pipe cannot hold (> 2 s) gets the default, never an error
        let mut late = conn(Some(1e6), 0.0, Some(2));
        late.delack_timeout_us = Some(4_700_000);
        let (up, _) = pipes_for(&late, 9, QueueOverride::default());
        assert_eq!(
            up.ack.map(|a| a.timeout),
            Some(DEFAULT_DELACK_TIMEOUT_US as u64 * 1000)
        );
        let (up, down) = pipes_for(&conn(None, 0.0, None), 9, QueueOverride::default());
        assert_eq!(
            down.rate_bps, 0,
            "no rate (only with --unestimated unshaped, see rates)"
        );
        assert_eq!(
            (up.queue, down.queue),
            (QueueLimit::Packets(40), QueueLimit::Packets(40))
        );
    }

    #[test]
    fn the_pipes_delay_leaves_out_the_synacks_serialization_the_tap_rtt_holds() {
        // a 33.1 kbit/s connection whose tap saw a 140.7 ms handshake: the lab's guest router
        // replayed it at 155.6 ms with half the RTT each way (the 60-byte SYN-ACK serialized
        // twice: once inside the tap's RTT, once in the pipe)
        let mut c = conn(Some(33_103.0), 0.0, None);
        c.min_rtt_us = Some(140_724);
        let ser = synack_serialization_us(&c);
        assert!((ser - 14_500.2).abs() < 1.0, "{ser}");
        let owd = pipe_one_way_us(&c);
        assert_eq!(owd, 63_111, "(140,724 - 14,500.2) / 2");
        let (up, down) = pipes_for(&c, 1, QueueOverride::default());
        assert_eq!(
            (up.delay, down.delay),
            (owd as u64 * 1000, owd as u64 * 1000)
        );
        // the replayed handshake: both delays and the SYN-ACK's serialization in the pipe
        let replayed =
            (up.delay + down.delay) as f64 / 1e3 + 60.0 * 8.0 / down.rate_bps as f64 * 1e6;
        assert!((replayed - 140_724.0).abs() < 2.0, "{replayed}");
        // no rate, or a token bucket that lets the SYN-ACK through at once: half the RTT
        c.bw_bps = None;
        assert_eq!(pipe_one_way_us(&c), 140_724 / 2);
        let mut t = conn(Some(128e3), 0.0, None);
        t.min_rtt_us = Some(50);
        assert!(token_bucket_evident(&t));
        assert_eq!(pipe_one_way_us(&t), 25);
        // an RTT shorter than the serialization is a token bucket's: half of it, never less
        let mut z = conn(Some(33_103.0), 0.0, None);
        z.min_rtt_us = Some(14_000);
        assert_eq!(pipe_one_way_us(&z), 7_000);
    }

    #[test]
    fn a_handshake_faster_than_the_synacks_serialization_gets_a_token_bucket() {
        // 128 kbit/s: a 60-byte SYN-ACK takes 3.75 ms to serialize; the independent testbed's
        // htb let it through at once and the tap saw a 50 µs handshake
        let mut c = conn(Some(128e3), 0.0, None);
        c.min_rtt_us = Some(50);
        assert!(token_bucket_evident(&c));
        let (up, down) = pipes_for(&c, 1, QueueOverride::default());
        assert_eq!(down.burst, SHAPER_BURST_BYTES);
        assert_eq!(up.burst, 0, "upstream is not rate-limited");
        // a handshake that took longer than the serialization: a serializing link (or one
        // cannot tell), and the pipe stays one
        c.min_rtt_us = Some(3_800);
        assert!(!token_bucket_evident(&c));
        assert_eq!(pipes_for(&c, 1, QueueOverride::default()).1.burst, 0);
        // at 50 Mbit/s the SYN-ACK takes 9.6 µs: a 50 µs LAN handshake is no evidence
        let mut c = conn(Some(50e6), 0.0, None);
        c.min_rtt_us = Some(50);
        assert!(!token_bucket_evident(&c));
        // no rate, no RTT: nothing to go on
        let mut c = conn(None, 0.0, None);
        c.min_rtt_us = Some(50);
        assert!(!token_bucket_evident(&c));
        let mut c = conn(Some(128e3), 0.0, None);
        c.min_rtt_us = None;
        assert!(!token_bucket_evident(&c));
    }

    #[test]
    fn a_deeper_lead_gets_a_bucket_that_many_packets_deep() {
        let mut c = conn(Some(4e6), 0.0, None);
        c.min_rtt_us = Some(40_000);
        for (lead, burst) in [
            (0.93, SHAPER_BURST_BYTES),
            (1.0, 1500),
            (2.46, 3690),
            (8.0, 12_000),
            (30.0, 12_000),
        ] {
            c.shaper_lead_down = Some(lead);
            assert_eq!(shaper_burst_bytes(&c), burst, "lead {lead}");
            assert_eq!(pipes_for(&c, 1, QueueOverride::default()).1.burst, burst);
        }
        // a serializing link's lead, or none: no bucket however the handshake went
        for lead in [Some(0.3), None] {
            c.shaper_lead_down = lead;
            assert_eq!(shaper_burst_bytes(&c), 0, "lead {lead:?}");
        }
    }

    #[test]
    fn a_lead_of_half_a_packet_or_more_gets_a_token_bucket_behind_propagation_delay() {
        // 56 kbit/s behind 150 ms of propagation: the handshake (150 ms) says nothing against
        // the SYN-ACK's 8.6 ms of serialization; the analyzer's lead says a token bucket
        let mut c = conn(Some(56e3), 0.0, None);
        c.min_rtt_us = Some(150_500);
        assert!(
            !token_bucket_evident(&c),
            "the handshake alone says nothing"
        );
        c.shaper_lead_down = Some(0.93);
        assert!(token_bucket_evident(&c));
        let (up, down) = pipes_for(&c, 1, QueueOverride::default());
        assert_eq!(down.burst, SHAPER_BURST_BYTES);
        assert_eq!(up.burst, 0, "upstream is not rate-limited");
        c.shaper_lead_down = Some(TOKEN_BUCKET_LEAD);
        assert!(token_bucket_evident(&c));
        // a serializing link's lead (about 0), or one not measured: no bucket
        for lead in [Some(0.04), Some(0.49), None] {
            c.shaper_lead_down = lead;
            assert!(!token_bucket_evident(&c), "lead {lead:?}");
            assert_eq!(pipes_for(&c, 1, QueueOverride::default()).1.burst, 0);
        }
        // a lead without a rate shapes nothing
        let mut c = conn(None, 0.0, None);
        c.shaper_lead_down = Some(1.0);
        assert!(!token_bucket_evident(&c));
        // the handshake's evidence still holds where the lead is low or missing
        let mut c = conn(Some(128e3), 0.0, None);
        c.min_rtt_us = Some(50);
        c.shaper_lead_down = Some(0.1);
        assert!(token_bucket_evident(&c));
    }

    #[test]
    fn a_handshake_that_waited_at_the_original_shaper_holds_the_replays_synack() {
        // 56 kbit/s dial-up, store-and-forward (min RTT 25 ms is over the SYN-ACK's 8.6 ms):
        // the original's handshake took 169 ms behind the previous connection's tail
        let mut c = conn(Some(56e3), 0.0, None);
        c.min_rtt_us = Some(25_000);
        c.hs_rtt_us = Some(169_000);
        assert!(!token_bucket_evident(&c));
        // 169 - 25 - 8.571 ms (60 bytes at 56 kbit/s) that the pipe serializes anyway
        assert_eq!(handshake_wait_us(&c), Some(135_429));
        let (up, down) = pipes_for(&c, 1, QueueOverride::default());
        assert_eq!(down.first_delay, 135_429_000);
        assert_eq!(up.first_delay, 0, "the wait is the SYN-ACK's, downstream");
        // behind a token bucket the SYN-ACK is not serialized: the whole excess is the wait
        c.min_rtt_us = Some(500);
        assert!(token_bucket_evident(&c));
        assert_eq!(handshake_wait_us(&c), Some(168_500));
        // a handshake as fast as the path (or within the host's scheduling noise) adds nothing
        c.hs_rtt_us = Some(1_400);
        assert_eq!(handshake_wait_us(&c), None);
        assert_eq!(pipes_for(&c, 1, QueueOverride::default()).1.first_delay, 0);
        // no handshake RTT (a SYN-ACK sent again, or none seen): nothing to reproduce
        c.hs_rtt_us = None;
        assert_eq!(handshake_wait_us(&c), None);
        // no rate: the excess over the minimum RTT alone; and a cap
        let mut c = conn(None, 0.0, None);
        c.min_rtt_us = Some(100);
        c.hs_rtt_us = Some(5_100);
        assert_eq!(handshake_wait_us(&c), Some(5_000));
        c.hs_rtt_us = Some(60_000_000);
        assert_eq!(handshake_wait_us(&c), Some(MAX_HANDSHAKE_WAIT_US));
        // kernel pipes cannot hold one packet: the waits come out, counted
        let mut rules = vec![FlowRule {
            client: "198.18.1.1:20000".parse().unwrap(),
            server: "198.18.0.1:80".parse().unwrap(),
            up: PipeConfig::default(),
            down: pipes_for(&c, 1, QueueOverride::default()).1,
        }];
        assert_eq!(strip_handshake_waits(&mut rules), 1);
        assert_eq!(rules[0].down.first_delay, 0);
        assert_eq!(strip_handshake_waits(&mut rules), 0);
    }

    #[test]
    fn a_queue_the_original_showed_deeper_than_its_class_is_replayed() {
        // 1 Mbit/s: 12 ms per full packet; 600 ms of queueing = 50 packets, the class has 30
        let mut c = conn(Some(1e6), 0.0, None);
        c.min_rtt_us = Some(100);
        c.max_rtt_us = Some(600_100);
        assert_eq!(observed_queue_packets(&c), Some(50));
        let (_, down) = pipes_for(&c, 1, QueueOverride::default());
        assert_eq!(down.queue, QueueLimit::Packets(50));
        // a shallower one keeps the class's (the real queue may well be longer)
        c.max_rtt_us = Some(120_100);
        assert_eq!(observed_queue_packets(&c), Some(10));
        assert_eq!(
            pipes_for(&c, 1, QueueOverride::default()).1.queue,
            QueueLimit::Packets(30)
        );
        // --queue still wins
        c.max_rtt_us = Some(600_100);
        let q: QueueOverride = "down=7".parse().unwrap();
        assert_eq!(pipes_for(&c, 1, q).1.queue, QueueLimit::Packets(7));
        // nothing to go on, and a cap on what a stalled host can make of it
        c.max_rtt_us = None;
        assert_eq!(observed_queue_packets(&c), None);
        c.max_rtt_us = Some(3_600_000_000);
        assert_eq!(observed_queue_packets(&c), Some(MAX_OBSERVED_QUEUE));
        c.bw_bps = None;
        assert_eq!(observed_queue_packets(&c), None);
    }

    #[test]
    fn a_queue_the_original_overflowed_is_replayed_at_that_length() {
        // 56 kbit/s: the class says 30 packets; the original overflowed a 21-packet queue
        let mut c = conn(Some(56e3), 0.0, None);
        c.queue_down_pkts = Some(21);
        c.queue_down_full = true;
        assert_eq!(down_queue_packets(&c), 21);
        assert_eq!(
            pipes_for(&c, 1, QueueOverride::default()).1.queue,
            QueueLimit::Packets(21)
        );
        // a token bucket's pipe holds one fewer than the serializing model at the same load
        c.min_rtt_us = Some(100);
        assert!(token_bucket_evident(&c));
        assert_eq!(down_queue_packets(&c), 20);
        c.min_rtt_us = Some(40_000);
        // and a deeper one than the class's, even where the RTT samples showed less
        c.bw_bps = Some(1e6);
        c.queue_down_pkts = Some(51);
        c.min_rtt_us = Some(1_000);
        c.max_rtt_us = Some(301_000);
        assert_eq!(down_queue_packets(&c), 51);
        // never overflowed: a lower bound, the class's where that is deeper
        c.queue_down_full = false;
        c.queue_down_pkts = Some(12);
        assert_eq!(down_queue_packets(&c), 30);
        c.queue_down_pkts = Some(44);
        assert_eq!(down_queue_packets(&c), 44);
        // --queue still wins
        let q: QueueOverride = "down=7".parse().unwrap();
        assert_eq!(pipes_for(&c, 1, q).1.queue, QueueLimit::Packets(7));
    }

    #[test]
    fn queue_override_replaces_the_class_per_direction() {
        let c = conn(Some(1e6), 0.0, None);
        let q: QueueOverride = "100".parse().unwrap();
        let (up, down) = pipes_for(&c, 1, q);
        assert_eq!(
            (up.queue, down.queue),
            (QueueLimit::Packets(100), QueueLimit::Packets(100))
        );
        let q: QueueOverride = "down=64".parse().unwrap();
        let (up, down) = pipes_for(&c, 1, q);
        assert_eq!(
            (up.queue, down.queue),
            (QueueLimit::Packets(10), QueueLimit::Packets(64))
        );
        assert_eq!(q.to_string(), "up=by rate class,down=64");
        let q: QueueOverride = " up=3 , down=4 ".parse().unwrap();
        assert_eq!((q.up, q.down), (Some(3), Some(4)));
        for q in ["7", "up=3", "down=64", "up=3,down=4"] {
            let parsed: QueueOverride = q.parse().unwrap();
            assert_eq!(parsed.to_arg().as_deref(), Some(q));
        }
        assert_eq!(QueueOverride::default().to_arg(), None);
        for bad in ["0", "-1", "x", "up=0", "side=3", "up=3,up=4", "up"] {
            assert!(bad.parse::<QueueOverride>().is_err(), "{bad} accepted");
        }
    }
}
