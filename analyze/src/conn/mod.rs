//! One TCP connection as seen at the capture point.
//!
//! Both directions are tracked the same way (a [`Side`] per sender, named by [`Dir`]), and which
//! side is the client is decided only when the record is built, so a handshake captured late,
//! or a hint from `--server-port`, can still set it. Every per-connection list is bounded.
//!
//! This module keeps each direction's sequence space (what was sent, resent and acknowledged,
//! the handshake, termination, duplicated frames, windows) and hands each packet to the
//! estimators, one module each, every one with its per-packet hooks and a finish step that
//! contributes its fields to the record:
//!
//! | module | estimates |
//! |---|---|
//! | [`rtt`] | handshake RTT, minimum RTT, RTT samples |
//! | [`delack`] | delayed-ACK policy, ACKs per segment, delayed-ACK timer |
//! | [`loss`] | retransmissions, spurious ones, loss rate, its random part |
//! | [`bw`] | bottleneck bandwidth and its samples |
//! | [`exchanges`] | request/response exchanges, response and query delays, think times |

mod bw;
mod delack;
pub(crate) mod dir;
mod exchanges;
mod loss;
mod rtt;
mod shaper;

use std::collections::VecDeque;

use mimic_core::time::dur;
use mimic_core::{FlowKey, SeqNum, TcpSegment, Timestamp};

use crate::config::Config;
use crate::ranges::RangeSet;
use crate::record::*;

pub(crate) use dir::{Dir, PerDir};

/// (seq, ack, payload length, flags, window) of a packet.
type Sig = (u32, u32, u32, u16, u16);
const RECENT: usize = 8;

/// A data segment as first sent (at the capture point).
#[derive(Clone, Debug)]
struct Seg {
    start: i64,
    end: i64,
    t: Timestamp,
    retx: bool,
    burst: u32,
    /// IP-layer bytes (payload plus IP and TCP headers).
    wire: u32,
    /// Bytes in flight (unacknowledged, this segment included) when it was sent.
    flight: u32,
    /// Index in `Side::sends` of this segment's latest transmission (`NO_LOG`: not logged).
    log: u32,
}

/// A packet a side sent (data, new or resent, and pure ACKs, SYN, FIN: all take a place in the
/// bottleneck queue), in send order, for replaying that queue once the bandwidth is known.
#[derive(Clone, Copy, Debug)]
struct Send {
    t: Timestamp,
    wire: u32,
}

/// Transmissions logged per direction; later ones fall back to the flight-size test.
const MAX_SENDS: usize = 1 << 16;
/// Zero-window intervals kept per direction.
const MAX_ZERO_WINDOWS: usize = 1024;
const NO_LOG: u32 = u32::MAX;

#[derive(Clone, Debug, Default)]
struct SynInfo {
    seen: bool,
    isn: SeqNum,
    count: u32,
    t_first: Timestamp,
    t_last: Timestamp,
    mss: Option<u16>,
    wscale: Option<u8>,
    sack_perm: bool,
    ts: bool,
    /// SYN: ECE and CWR set; SYN-ACK: ECE set.
    ecn: bool,
    window: u16,
    with_ack: bool,
}

/// One direction: the data this side sends, what the other side's ACKs say about it, and the
/// estimators' state of this direction.
#[derive(Clone, Debug, Default)]
struct Side {
    syn: SynInfo,
    packets: u64,
    base: Option<SeqNum>,
    /// Highest relative sequence end sent so far.
    hi: i64,
    covered: RangeSet,
    data_pkts: u64,
    max_seg: u32,
    segs: VecDeque<Seg>,
    segs_dropped: u64,
    /// Every packet this side sent, in order (up to `MAX_SENDS`).
    sends: Vec<Send>,
    burst: u32,
    last_data_t: Option<Timestamp>,
    first_retx_t: Option<Timestamp>,
    /// IPv4 ids, and TCP header fields and times, of recent packets, to spot duplicated
    /// frames (the ids apart: one comparison of all eight rules out nearly every packet).
    recent_ids: [u16; RECENT],
    recent: [(Sig, Timestamp); RECENT],
    recent_next: u8,
    recent_any: Option<(Sig, Timestamp)>,
    dup_frames: u64,
    /// Data segments sent into the receiver's zero window (window probes), and the range of
    /// the last one.
    zwnd_probes: u64,
    probe: Option<(i64, i64)>,
    fin_retx: u64,
    /// Last window this side advertised (raw), for spotting window probes by the other side.
    last_window: Option<u16>,
    // acknowledgements of this side's data by the other side
    ack_seen: bool,
    acked: i64,
    // this side as a receiver
    window_at_first_data: Option<u16>,
    /// Largest window advertised (raw) from the first data on.
    max_window_after_data: Option<u16>,
    zero_window: u32,
    /// The window this side advertised is closed now: since when, and how much of the other
    /// side's data it had acknowledged then.
    zw_open: Option<(Timestamp, i64)>,
    /// Intervals its window stayed closed (up to `MAX_ZERO_WINDOWS`; later ones are added to
    /// the last one's duration, so the closed time is kept whole).
    zw_closed: Vec<exchanges::ZeroWindow>,
    fin_t: Option<Timestamp>,
    rst_t: Option<Timestamp>,
    // the estimators, on this side's data
    rtt: rtt::RttSide,
    delack: delack::Delack,
    loss: loss::Loss,
    bw: bw::Bandwidth,
    shaper: shaper::Shaper,
}

impl Side {
    /// The window this side advertised reopened at `t_open` after closing at `t_closed` with
    /// the other side's data acknowledged up to `acked`.
    fn close_zero_window(&mut self, t_closed: Timestamp, t_open: Timestamp, acked: i64) {
        let w = exchanges::ZeroWindow {
            t_closed,
            t_open,
            acked,
        };
        let full = self.zw_closed.len() >= MAX_ZERO_WINDOWS;
        match self.zw_closed.last_mut() {
            Some(last) if full => {
                // the limit: keep the closed time, attributed to the last kept interval
                last.t_open = last.t_open.add_nanos(t_open.nanos_since(t_closed).max(0));
            }
            _ => push_sized(&mut self.zw_closed, w, 4),
        }
    }

    /// Relative (unwrapped) offset of `seq` in this side's sequence space.
    #[inline]
    fn rel(&self, seq: SeqNum) -> i64 {
        match self.base {
            Some(b) => self.hi + seq.diff(b.wrapping_add(self.hi as u32)) as i64,
            None => 0,
        }
    }

    /// Before this side's first retransmission (slow start, for the delayed-ACK ratio).
    #[inline]
    fn in_slow_start(&self) -> bool {
        self.first_retx_t.is_none()
    }
}

/// Pushes onto a vector whose first allocation holds `first` elements (std's holds 4), then
/// doubles: a connection's logs are short but rarely tiny, and each growth step is a
/// reallocation and a copy (growth was 7% of the analyzer's instructions on the web captures;
/// starting larger saves about a fifth of that).
#[inline]
fn push_sized<T>(v: &mut Vec<T>, x: T, first: usize) {
    if v.len() == v.capacity() {
        v.reserve(if v.capacity() == 0 {
            first
        } else {
            v.capacity()
        });
    }
    v.push(x);
}

#[derive(Debug)]
pub(crate) struct Conn {
    pub id: u64,
    /// Canonical key: `Dir::Fwd` sent from `key.src`, `Dir::Rev` from `key.dst`.
    pub key: FlowKey,
    pub t_first: Timestamp,
    pub t_last: Timestamp,
    frames: u64,
    s: PerDir<Side>,
    /// Time the client's ACK of the SYN-ACK was seen.
    hs_ack: Option<Timestamp>,
    exchanges: exchanges::Exchanges,
    last_dir: Option<Dir>,
    pub evicted: bool,
    rtt_hint: rtt::RttHint,
}

impl Conn {
    pub fn new(id: u64, key: FlowKey, t: Timestamp) -> Conn {
        Conn {
            id,
            key,
            t_first: t,
            t_last: t,
            frames: 0,
            s: PerDir::default(),
            hs_ack: None,
            exchanges: exchanges::Exchanges::default(),
            last_dir: None,
            evicted: false,
            rtt_hint: rtt::RttHint::default(),
        }
    }

    /// FIN from both sides, or a RST: the connection is over (late packets may still come).
    pub fn terminated(&self) -> bool {
        let [a, b] = &self.s.0;
        (a.fin_t.is_some() && b.fin_t.is_some()) || a.rst_t.is_some() || b.rst_t.is_some()
    }

    /// Whether a SYN sent in direction `d` starts a new connection on this 4-tuple (port
    /// reuse) rather than belonging to this one.
    pub fn is_reuse(&self, d: Dir, seg: &TcpSegment) -> bool {
        if !seg.flags.syn() || seg.flags.ack() {
            return false;
        }
        let me = &self.s[d];
        if self.terminated() || me.fin_t.is_some() {
            return !(me.syn.seen && me.syn.isn == seg.seq && me.hi <= 1);
        }
        // a SYN with a new ISN after this connection carried data or completed its handshake
        me.syn.seen
            && me.syn.isn != seg.seq
            && (self.hs_ack.is_some() || me.hi > 1 || self.s[d.other()].hi > 1)
    }

    /// Takes a segment sent in direction `d` at `t`.
    pub fn handle(&mut self, cfg: &Config, d: Dir, t: Timestamp, seg: &TcpSegment) {
        let o = d.other();
        self.frames += 1;
        if t > self.t_last {
            self.t_last = t;
        }
        let flags = seg.flags;
        self.s[d].packets += 1;

        // duplicated frames (a capture artefact: a tap or SPAN port that copies a packet more
        // than once): the same IPv4 datagram (same id and TCP header) seen again within a
        // second; without an IP id only a data segment repeated right after itself can be told
        // from a genuine retransmission or duplicate ACK
        let sig = (
            seg.seq.0,
            seg.ack.0,
            seg.payload_len,
            seg.flags.0,
            seg.window,
        );
        let dup = match seg.ip_id {
            Some(id) if id != 0 => {
                let side = &self.s[d];
                // (no early exit: eight compares at once)
                side.recent_ids
                    .iter()
                    .fold(false, |any, &i0| any | (i0 == id))
                    && side
                        .recent_ids
                        .iter()
                        .zip(&side.recent)
                        .any(|(&i0, &(s0, t0))| {
                            i0 == id && s0 == sig && t.nanos_since(t0).abs() < dur::SEC
                        })
            }
            _ => {
                seg.payload_len > 0
                    && self.last_dir == Some(d)
                    && self.s[d]
                        .recent_any
                        .is_some_and(|(s0, t0)| s0 == sig && t.nanos_since(t0).abs() < 2 * dur::MS)
            }
        };
        if dup {
            self.s[d].dup_frames += 1;
            return;
        }
        {
            let side = &mut self.s[d];
            if let Some(id) = seg.ip_id {
                side.recent_ids[side.recent_next as usize] = id;
                side.recent[side.recent_next as usize] = (sig, t);
                side.recent_next = (side.recent_next + 1) % RECENT as u8;
            }
            side.recent_any = Some((sig, t));
        }
        self.last_dir = Some(d);
        // every packet of this side takes its place in the bottleneck queue
        let log = {
            let sends = &mut self.s[d].sends;
            if sends.len() < MAX_SENDS {
                push_sized(
                    sends,
                    Send {
                        t,
                        wire: seg.payload_len + seg.hdr_len as u32,
                    },
                    32,
                );
                (sends.len() - 1) as u32
            } else {
                NO_LOG
            }
        };

        if flags.syn() {
            self.on_syn(d, t, seg);
        }
        if self.s[d].base.is_none() {
            // no SYN seen from this side: its first sequence number is relative zero
            self.s[d].base = Some(seg.seq);
        }

        // acknowledgement of the other side's data
        if flags.ack() && self.s[o].base.is_some() {
            self.on_ack(cfg, d, t, seg);
        }

        // this side's data (and FIN)
        let start = self.s[d].rel(seg.seq) + flags.syn() as i64;
        if seg.payload_len > 0 {
            self.on_data(cfg, d, t, seg, start, log);
        }
        if flags.fin() {
            let fin_at = start + seg.payload_len as i64;
            let side = &mut self.s[d];
            side.covered.insert(fin_at, fin_at + 1);
            side.hi = side.hi.max(fin_at + 1);
            if side.fin_t.is_none() {
                side.fin_t = Some(t);
            } else {
                side.fin_retx += 1;
            }
        }
        if flags.rst() && self.s[d].rst_t.is_none() {
            self.s[d].rst_t = Some(t);
        }

        // receive window advertised by this side
        if !flags.syn() && !flags.rst() {
            let acked = self.s[o].acked;
            self.exchanges.on_window(o, seg.window, acked);
            let side = &mut self.s[d];
            if seg.window == 0 {
                side.zero_window += 1;
                side.zw_open.get_or_insert((t, acked));
            } else if let Some((t_closed, at)) = side.zw_open.take() {
                side.close_zero_window(t_closed, t, at);
            }
            side.last_window = Some(seg.window);
        }
        if seg.payload_len > 0 && self.s[d].window_at_first_data.is_none() {
            self.s[d].window_at_first_data = Some(seg.window);
        }
        if self.s[d].window_at_first_data.is_some() && !flags.syn() && !flags.rst() {
            let m = &mut self.s[d].max_window_after_data;
            *m = Some(m.map_or(seg.window, |w| w.max(seg.window)));
        }
    }

    fn on_syn(&mut self, d: Dir, t: Timestamp, seg: &TcpSegment) {
        let side = &mut self.s[d];
        let syn = &mut side.syn;
        if syn.seen && syn.isn == seg.seq {
            syn.count += 1;
            syn.t_last = t;
            return;
        }
        *syn = SynInfo {
            seen: true,
            isn: seg.seq,
            count: 1,
            t_first: t,
            t_last: t,
            mss: seg.options.mss,
            wscale: seg.options.wscale,
            sack_perm: seg.options.sack_permitted,
            ts: seg.options.timestamp.is_some(),
            ecn: if seg.flags.ack() {
                seg.flags.ece()
            } else {
                seg.flags.ece() && seg.flags.cwr()
            },
            window: seg.window,
            with_ack: seg.flags.ack(),
        };
        side.base = Some(seg.seq);
        side.hi = side.hi.max(1);
        side.covered.insert(0, 1);
    }

    /// Data sent in direction `d`. `log`: this packet's index in the side's `sends`.
    fn on_data(
        &mut self,
        cfg: &Config,
        d: Dir,
        t: Timestamp,
        seg: &TcpSegment,
        start: i64,
        log: u32,
    ) {
        let len = seg.payload_len as i64;
        let end = start + len;
        // a window probe: one byte sent while the receiver's window is closed (not a
        // retransmission even when repeated). Larger segments into a zero window are data the
        // sender sent before it learned of the closed window (the tap may sit near the
        // receiver) and count as usual.
        if len == 1
            && self.s[d.other()].last_window == Some(0)
            && !seg.flags.syn()
            && !seg.flags.fin()
        {
            let side = &mut self.s[d];
            side.zwnd_probes += 1;
            side.covered.insert(start, end);
            side.probe = Some((start, end));
            side.hi = side.hi.max(end);
            return;
        }
        let ins = self.s[d].covered.insert(start, end);
        let burst_gap = self.burst_gap();
        let side = &mut self.s[d];
        side.loss.on_data(t);
        side.data_pkts += 1;
        side.max_seg = side.max_seg.max(seg.payload_len);
        let wire = seg.payload_len + seg.hdr_len as u32;
        // bytes seen before only as a window probe do not make this a retransmission
        let probed = side
            .probe
            .map_or(0, |(ps, pe)| (end.min(pe) - start.max(ps)).max(0));
        let is_retx = ins.old_bytes > probed;
        if is_retx {
            if side.first_retx_t.is_none() {
                side.first_retx_t = Some(t);
            }
            let mut orig_flight = 0;
            let mut orig_log = NO_LOG;
            for s in side.segs.iter_mut().rev() {
                if s.end <= start {
                    break;
                }
                if s.start < end {
                    s.retx = true;
                    orig_flight = orig_flight.max(s.flight);
                    // the latest transmission (of the earliest segment) this one repeats:
                    // a lost retransmission is what its own resend replaces
                    orig_log = s.log;
                    s.log = log;
                }
            }
            side.loss.on_resend(loss::Resend {
                start,
                end,
                t,
                orig_flight,
                orig_log,
                // data the receiver had already acknowledged when it was resent
                already_acked: side.ack_seen && side.acked >= end,
            });
        }
        if ins.new_bytes > 0 {
            // a new burst starts after a pause in this side's sending
            let new_burst = side
                .last_data_t
                .is_none_or(|lt| t.nanos_since(lt) > burst_gap);
            if new_burst {
                side.burst += 1;
            }
            side.last_data_t = Some(t);
            if side.segs.len() >= cfg.max_outstanding_segments {
                side.segs.pop_front();
                side.segs_dropped += 1;
            }
            side.segs.push_back(Seg {
                start,
                end,
                t,
                retx: is_retx,
                burst: side.burst,
                wire,
                log,
                flight: (end - if side.ack_seen { side.acked } else { 0 }).clamp(0, u32::MAX as i64)
                    as u32,
            });
            side.hi = side.hi.max(end);
            self.exchanges
                .on_new_data(cfg, d, t, start, end, ins.new_bytes as u64, seg.payload);
        } else if is_retx {
            self.exchanges.on_resend(d, t, start, end);
        }
    }

    /// Inter-segment pause that separates two bursts of one sender.
    fn burst_gap(&self) -> i64 {
        match self.rtt_hint.get() {
            Some(r) => (r / 8).clamp(100 * dur::US, 5 * dur::MS),
            None => dur::MS,
        }
    }

    /// An ACK sent in direction `d`: it acknowledges the other direction's data.
    fn on_ack(&mut self, cfg: &Config, d: Dir, t: Timestamp, seg: &TcpSegment) {
        let o = d.other();
        let a = self.s[o].rel(seg.ack);
        let pure = seg.payload_len == 0 && !seg.flags.syn() && !seg.flags.fin() && !seg.flags.rst();

        // handshake completion: the SYN sender acknowledges the SYN-ACK
        if self.hs_ack.is_none()
            && self.s[d].syn.seen
            && !self.s[d].syn.with_ack
            && self.s[o].syn.seen
            && self.s[o].syn.with_ack
            && a >= 1
            && !seg.flags.syn()
        {
            self.hs_ack = Some(t);
            let rtt = t.nanos_since(self.s[d].syn.t_last);
            self.rtt_hint.note(rtt);
        }

        // D-SACK: a first SACK block below the cumulative ACK, or inside the second block
        let blocks = seg.options.sack_blocks();
        if let Some(&(l, r)) = blocks.first() {
            let (lr, rr) = (self.s[o].rel(l), self.s[o].rel(r));
            let dsack = rr <= a
                || blocks.get(1).is_some_and(|&(l2, r2)| {
                    let (l2, r2) = (self.s[o].rel(l2), self.s[o].rel(r2));
                    l2 <= lr && rr <= r2
                });
            if dsack && rr > lr {
                self.s[o].loss.on_dsack(lr, rr);
            }
        }

        let rtt_hint = self.rtt_hint.get();
        let advanced = !self.s[o].ack_seen || a > self.s[o].acked;
        if advanced {
            let (_, data) = self.s.pair_mut(d);
            let prev_acked = if data.ack_seen { data.acked } else { i64::MIN };
            let mut sample: Option<i64> = None;
            let mut exact: Option<(Timestamp, u32)> = None;
            // Karn: a sample from the newest segment the ACK covers, if never retransmitted
            let mut any_retx = false;
            let mut newly: u32 = 0;
            let mut isolated: Option<Timestamp> = None;
            let mut followed = false;
            // the sampled segment's transmission, payload and flight, for the shaper test
            let mut sampled: Option<(u32, i64, u32)> = None;
            // segments are kept in sending order, which is sequence order but for gap fills
            let upto = data.segs.partition_point(|s| s.end <= a);
            for s in data.segs.range(..upto).rev() {
                if s.end <= prev_acked {
                    break;
                }
                newly += 1;
                any_retx |= s.retx;
                if exact.is_none() {
                    exact = Some((s.t, s.burst));
                    if !s.retx && t >= s.t {
                        sample = Some(t.nanos_since(s.t));
                        followed = s.end < data.hi;
                        sampled = Some((s.log, s.end - s.start, s.flight));
                    }
                    // the only segment in flight, nothing sent after it, nothing
                    // unacknowledged before it when it was sent (the last segment of a
                    // flight waited in the bottleneck queue behind the others)
                    if s.start == prev_acked
                        && s.end == data.hi
                        && s.flight as i64 == s.end - s.start
                    {
                        isolated = Some(s.t);
                    }
                }
            }
            if any_retx {
                sample = None;
            }
            if let Some(r) = sample {
                data.rtt.on_sample(cfg, t, r, followed);
                if let Some((log, len, flight)) = sampled {
                    data.shaper.on_sample(r, log, len, flight);
                }
            }
            let ss = data.in_slow_start();
            data.delack.on_ack(t, ss, newly, isolated, any_retx);
            data.bw.on_advance(
                cfg,
                &bw::Advance {
                    t,
                    ack: a,
                    pure,
                    segs: &data.segs,
                    upto,
                    newly,
                    exact,
                    hi: data.hi,
                },
            );
            data.loss.on_advance(t, a, rtt_hint);
            data.acked = a;
            data.ack_seen = true;
            // keep the segment ending at the cumulative ACK for the next pair
            while data.segs.len() > 1 && data.segs[1].end <= a {
                data.segs.pop_front();
            }
            if let Some(sample) = sample {
                // data→ACK samples tighten the thresholds only when the handshake gave none
                if self.hs_ack.is_none() {
                    self.rtt_hint.note(sample);
                }
            }
            self.exchanges.on_advance(o, t, a);
        } else if a == self.s[o].acked
            && pure
            // a window update is no duplicate
            && self.s[d].last_window.is_none_or(|w| w == seg.window)
        {
            let data = &mut self.s[o];
            let outstanding = data.hi > a;
            data.loss.on_dupack(t, outstanding, rtt_hint);
        }
    }

    /// The client's direction and how it was decided.
    fn roles(&self, cfg: &Config) -> (Dir, ServerBy) {
        let s = &self.s;
        for d in Dir::BOTH {
            if s[d].syn.seen && !s[d].syn.with_ack {
                return (d, ServerBy::Syn);
            }
        }
        for d in Dir::BOTH {
            if s[d].syn.seen && s[d].syn.with_ack {
                return (d.other(), ServerBy::Synack);
            }
        }
        let port = |d: Dir| match d {
            Dir::Fwd => self.key.src.port,
            Dir::Rev => self.key.dst.port,
        };
        let addr = |d: Dir| match d {
            Dir::Fwd => self.key.src.addr,
            Dir::Rev => self.key.dst.addr,
        };
        for d in Dir::BOTH {
            if cfg.server_ports.contains(&port(d)) && !cfg.server_ports.contains(&port(d.other())) {
                return (d.other(), ServerBy::Port);
            }
        }
        for d in Dir::BOTH {
            let inside = |d: Dir| cfg.server_nets.iter().any(|n| n.contains(&addr(d)));
            if inside(d) && !inside(d.other()) {
                return (d.other(), ServerBy::Net);
            }
        }
        // well-known port, else the lower port, serves
        let wk = |p: u16| p < 1024 || matches!(p, 1080 | 3128 | 8000 | 8008 | 8080 | 8443 | 8888);
        let server = match (wk(port(Dir::Fwd)), wk(port(Dir::Rev))) {
            (true, false) => Dir::Fwd,
            (false, true) => Dir::Rev,
            _ => {
                if port(Dir::Fwd) <= port(Dir::Rev) {
                    Dir::Fwd
                } else {
                    Dir::Rev
                }
            }
        };
        (server.other(), ServerBy::Guess)
    }

    /// Builds the record. `cfg` decides roles for connections without a handshake.
    pub fn to_record(&self, cfg: &Config) -> ConnectionRecord {
        let (cd, server_by) = self.roles(cfg);
        let sd = cd.other();
        let c = &self.s[cd];
        let sv = &self.s[sd];
        let (client, server) = match cd {
            Dir::Fwd => (self.key.src, self.key.dst),
            Dir::Rev => (self.key.dst, self.key.src),
        };

        let handshake = c.syn.seen && !c.syn.with_ack && sv.syn.seen && sv.syn.with_ack;
        let rtt = rtt::finish(handshake, self.hs_ack, (&c.syn, &c.rtt), (&sv.syn, &sv.rtt));

        let both = |f: fn(&SynInfo) -> bool| {
            if c.syn.seen && sv.syn.seen {
                Some(f(&c.syn) && f(&sv.syn))
            } else {
                None
            }
        };
        let sack_ok = both(|s| s.sack_perm);
        let ts_ok = both(|s| s.ts);
        let ecn_ok = both(|s| s.ecn);
        let wscale_on =
            c.syn.seen && sv.syn.seen && c.syn.wscale.is_some() && sv.syn.wscale.is_some();
        let scale = if wscale_on {
            c.syn.wscale.unwrap_or(0).min(14)
        } else {
            0
        };
        // client's receive window at its first request segment (Monkey: not the SYN's)
        let rwin = c.window_at_first_data.map(|w| (w as u64) << scale);
        // and the largest it advertised after that (a window that grew: Linux autotuning)
        let rwin_max = c.max_window_after_data.map(|w| (w as u64) << scale);
        let rwin_syn = c.syn.seen.then_some(c.syn.window as u64);

        let loss = sv.loss.finish(sv.data_pkts);
        // bandwidth from the client's ACKs of server data
        let (bw, bw_source, bw_samples) = sv.bw.finish(cfg);
        let (policy, aps, delack_timeout) = sv.delack.finish(rtt.min_rtt);

        // exchanges
        let mss_eff = {
            let opt = c
                .syn
                .mss
                .map(|m| m as u32 - if ts_ok == Some(true) { 12 } else { 0 });
            match opt {
                Some(m) if sv.max_seg > m || sv.max_seg == 0 => m,
                _ => sv.max_seg,
            }
        };
        // the client's window still closed when the trace ends: closed until its last packet
        let mut closed = c.zw_closed.clone();
        if let Some((t_closed, acked)) = c.zw_open {
            closed.push(exchanges::ZeroWindow {
                t_closed,
                t_open: self.t_last,
                acked,
            });
        }
        let mut exchanges = self.exchanges.finish(
            cd,
            mss_eff,
            scale,
            if handshake { self.hs_ack } else { None },
            &closed,
        );
        exchanges::ack_clock_rates(
            &mut exchanges,
            bw,
            rtt.min_rtt.map(dur::ns_to_us),
            mss_eff,
            sv.loss.retx_pkts <= loss.spurious,
        );
        // the bottleneck's queue model, once: the loss split and the shaper's lead read it
        let arrivals = sv.loss.arrivals(&sv.sends, bw);
        let (loss_random, queue_down) =
            sv.loss
                .random_loss(&loss, &arrivals, sv.data_pkts, bw, rtt.min_rtt, mss_eff);
        let response_time = exchanges::response_time(&exchanges);
        let shaper_lead = sv
            .shaper
            .finish(&sv.sends, &arrivals, bw, rtt.down_part)
            .map(|(lead, _)| lead.clamp(0.0, shaper::MAX_LEAD));

        // termination
        let rst = [c.rst_t, sv.rst_t];
        let fin = [c.fin_t, sv.fin_t];
        let first_rst = rst.iter().flatten().min().copied();
        let both_fin = fin[0].zip(fin[1]).map(|(a, b)| a.max(b));
        let termination = match (first_rst, both_fin, fin[0].or(fin[1])) {
            (Some(r), Some(bf), _) if r > bf => Termination::Fin,
            (Some(r), _, _) => {
                let last_server_data = self.exchanges.last_data_t(sd);
                let all_acked = sv.ack_seen && sv.acked >= sv.hi - fin[1].is_some() as i64;
                match last_server_data {
                    Some(ld) if r >= ld && all_acked => Termination::RstAfterResponse,
                    _ => Termination::RstAbort,
                }
            }
            (None, _, Some(_)) => Termination::Fin,
            _ => Termination::None,
        };
        let closer = |s: &Side| [s.fin_t, s.rst_t].into_iter().flatten().min();
        let closed_by = match (closer(c), closer(sv)) {
            (Some(a), Some(b)) => Some(if a <= b { "client" } else { "server" }),
            (Some(_), None) => Some("client"),
            (None, Some(_)) => Some("server"),
            (None, None) => None,
        };

        // completeness
        let holes = |s: &Side| {
            let mut h = s.covered.gaps();
            if s.syn.seen && s.covered.first().is_some_and(|f| f > 0) {
                h += 1;
            }
            // the receiver acknowledged data the capture never saw
            if s.ack_seen && s.acked > s.hi {
                h += 1;
            }
            h
        };
        let holes_down = holes(sv);
        let holes_up = holes(c);
        let mut prune = Vec::new();
        if !handshake {
            prune.push(PruneReason::NoHandshake);
        }
        if termination == Termination::None {
            prune.push(PruneReason::NoTermination);
        }
        if holes_down + holes_up > 0 {
            prune.push(PruneReason::SeqHoles);
        }
        if self.evicted {
            prune.push(PruneReason::Evicted);
        }
        if c.packets == 0 || sv.packets == 0 {
            prune.push(PruneReason::OneDirection);
        }

        ConnectionRecord {
            id: self.id,
            client_ip: client.addr,
            client_port: client.port,
            server_ip: server.addr,
            server_port: server.port,
            vlan: self.key.vlan.outer(),
            t_syn: c
                .syn
                .seen
                .then_some(c.syn.t_first)
                .filter(|_| !c.syn.with_ack),
            t_first: self.t_first,
            t_end: self.t_last,
            prune,
            server_by,
            min_rtt_us: rtt.min_rtt.map(dur::ns_to_us),
            hs_rtt_us: rtt.hs_rtt.map(dur::ns_to_us),
            rtt_sample_count: rtt.count,
            mss_client: c.syn.mss,
            mss_server: sv.syn.mss,
            wscale_client: c.syn.wscale,
            wscale_server: sv.syn.wscale,
            sack_ok,
            ts_ok,
            ecn_ok,
            syn_retx: c.syn.count.saturating_sub(1),
            synack_retx: sv.syn.count.saturating_sub(1),
            rwin_bytes: rwin,
            rwin_syn_bytes: rwin_syn,
            rwin_max_bytes: rwin_max,
            queue_down_pkts: queue_down.map(|q| q.packets),
            queue_down_full: queue_down.map(|q| q.overflowed),
            shaper_lead_down: shaper_lead,
            zero_window: c.zero_window,
            data_pkts_down: sv.data_pkts,
            data_bytes_down: data_bytes(sv),
            retx_down: sv.loss.retx_pkts,
            spurious_retx_down: loss.spurious,
            spurious_by: loss.spurious_by,
            loss_rate_down: loss.loss,
            loss_random_down: loss_random,
            data_pkts_up: c.data_pkts,
            data_bytes_up: data_bytes(c),
            retx_up: c.loss.retx_pkts,
            fin_retx: c.fin_retx + sv.fin_retx,
            zwnd_probes: c.zwnd_probes + sv.zwnd_probes,
            dup_frames: c.dup_frames + sv.dup_frames,
            bw_bps: bw,
            bw_source,
            delack_policy: policy,
            acks_per_seg: aps,
            delack_timeout_us: delack_timeout,
            termination,
            closed_by,
            response_time_us: response_time,
            holes_down,
            holes_up,
            frames: self.frames,
            exchanges,
            rtt_samples: rtt.samples,
            bw_samples,
        }
    }

    /// What the per-connection bounds dropped: segments no longer tracked for RTT and pairs,
    /// samples beyond the limit, data units beyond the exchange limit, sequence ranges merged
    /// across a gap.
    pub fn dropped(&self) -> [u64; 4] {
        let [a, b] = &self.s.0;
        [
            a.segs_dropped + b.segs_dropped,
            a.bw.samples_dropped + b.bw.samples_dropped,
            self.exchanges.dropped,
            (a.covered.forced_merges + b.covered.forced_merges) as u64,
        ]
    }

    pub fn dup_frames(&self) -> u64 {
        self.s.iter().map(|s| s.dup_frames).sum()
    }
}

/// Unique payload bytes a side sent (SYN and FIN excluded).
fn data_bytes(s: &Side) -> u64 {
    let mut t = s.covered.total();
    if s.syn.seen {
        t -= 1;
    }
    if s.fin_t.is_some() {
        t -= 1;
    }
    t.max(0) as u64
}
