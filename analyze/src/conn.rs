//! One TCP connection as seen at the capture point.
//!
//! Both directions are tracked the same way (a [`Side`] per sender), and which side is the
//! client is decided only when the record is built, so a handshake captured late, or a hint
//! from `--server-port`, can still set it. Every per-connection list is bounded.

use std::collections::VecDeque;

use mimic_core::time::dur;
use mimic_core::{FlowKey, SeqNum, TcpSegment, Timestamp};

use crate::bandwidth::{self, Pair};
use crate::config::Config;
use crate::http;
use crate::ranges::RangeSet;
use crate::record::*;

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
const NO_LOG: u32 = u32::MAX;

/// A packet pair that qualified as a bandwidth sample.
#[derive(Clone, Copy, Debug)]
struct BwPair {
    t: Timestamp,
    bps: f64,
    wire: u64,
    gap: i64,
    delay_sum: i64,
}

/// A retransmission waiting for evidence on whether it was needed.
#[derive(Clone, Debug)]
struct Retx {
    start: i64,
    end: i64,
    t: Timestamp,
    spurious: bool,
    /// No further evidence will be looked for.
    decided: bool,
    /// Bytes in flight when the lost original was sent (0: not known).
    orig_flight: u32,
    /// Index in `Side::sends` of the transmission this one replaces (`NO_LOG`: not logged).
    orig_log: u32,
    /// The other side acknowledged this data too late for the original to explain it alone:
    /// a duplicate ACK answering this resend may still show that it was not needed.
    covered: bool,
    /// When this side next sent data after this resend (an ACK before that time plus a round
    /// trip cannot answer anything sent later).
    next_send: Option<Timestamp>,
}

/// The previous ACK that advanced over this side's data (for packet pairs).
#[derive(Clone, Copy, Debug)]
struct AdvAck {
    t: Timestamp,
    ack: i64,
    /// Send time and burst of the segment that ended exactly at `ack` (if any).
    seg_t: Option<Timestamp>,
    seg_burst: Option<u32>,
    pure: bool,
}

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

/// One direction: the data this side sends, and what the other side's ACKs say about it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Side {
    syn: SynInfo,
    packets: u64,
    base: Option<SeqNum>,
    /// Highest relative sequence end sent so far.
    hi: i64,
    covered: RangeSet,
    data_pkts: u64,
    retx_pkts: u64,
    max_seg: u32,
    segs: VecDeque<Seg>,
    segs_dropped: u64,
    /// Every packet this side sent, in order (up to `MAX_SENDS`).
    sends: Vec<Send>,
    burst: u32,
    last_data_t: Option<Timestamp>,
    /// TCP header fields, IPv4 id and time of recent packets, to spot duplicated frames.
    recent: [(Sig, u16, Timestamp); RECENT],
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
    adv: Option<AdvAck>,
    dupacks: u64,
    retx: VecDeque<Retx>,
    dsack_seen: bool,
    spurious_dsack: u64,
    spurious_heur: u64,
    first_retx_t: Option<Timestamp>,
    // slow start delayed-ACK accounting (before this side's first retransmission)
    ss_segs: u32,
    ss_acks: u32,
    /// Send→ACK delays of isolated segments (a round trip plus any delayed-ACK wait).
    delack_delays: Vec<i64>,
    // this side as a receiver
    window_at_first_data: Option<u16>,
    zero_window: u32,
    fin_t: Option<Timestamp>,
    rst_t: Option<Timestamp>,
    // samples of this side's data: the first ones (kept as rows), the minimum and the count
    rtt: Vec<(Timestamp, i64)>,
    rtt_min: Option<(Timestamp, i64)>,
    /// The largest sample of a segment that had more data sent after it (so the receiver
    /// acknowledged it on the next segment's arrival, not on its delayed-ACK timer): the
    /// deepest queue the bottleneck showed.
    rtt_max: Option<(Timestamp, i64)>,
    rtt_count: u32,
    bw: Vec<BwPair>,
    samples_dropped: u64,
}

impl Side {
    /// Relative (unwrapped) offset of `seq` in this side's sequence space.
    #[inline]
    fn rel(&self, seq: SeqNum) -> i64 {
        match self.base {
            Some(b) => self.hi + seq.diff(b.wrapping_add(self.hi as u32)) as i64,
            None => 0,
        }
    }
}

/// One application data unit: a maximal run of new data in one direction.
#[derive(Clone, Debug)]
struct Adu {
    side: u8,
    t_first: Timestamp,
    t_last: Timestamp,
    bytes: u64,
    start: i64,
    end: i64,
    /// This unit's first transmissions are `Conn::adu_segs[seg_start..seg_start + seg_len]`.
    seg_start: u32,
    seg_len: u32,
    /// Segments before this index (into `Conn::adu_segs`) have their ACK time set.
    acked_upto: u32,
    prefix: [u8; 16],
    prefix_len: u8,
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

/// Whether a duplicate ACK at `t` can no longer be the receiver's answer to the resend `rx`
/// (Monkey §3.2: "any duplicate acknowledgment sent in response to a retransmission indicates
/// that the retransmission was spurious"). The answer comes a round trip after the resend; from
/// three quarters of the minimum round trip after the next data sent, an ACK may answer that
/// data instead (a hole further on), so the window closes then, and two round trips after the
/// resend in any case. This errs towards calling a resend needed. Without an RTT estimate
/// nothing can be told apart.
fn dupack_window_closed(rx: &Retx, t: Timestamp, rtt_hint: Option<i64>) -> bool {
    let Some(r) = rtt_hint else {
        return true;
    };
    let after_next = rx.next_send.is_some_and(|s| t.nanos_since(s) >= r * 3 / 4);
    t.nanos_since(rx.t) >= 2 * r || after_next
}

/// Retransmissions remembered per direction (for spurious and congestion tests).
const MAX_RETX: usize = 4096;

/// A data unit's first transmission: time, sequence range, and when the other side's ACK
/// covered it.
type AduSeg = (Timestamp, i64, i64, Option<Timestamp>);

/// Segments remembered per data unit (the query-delay test looks at the first ones), and per
/// connection in all.
const ADU_SEGS: u32 = 256;
const CONN_ADU_SEGS: usize = 1 << 16;

#[derive(Debug)]
pub(crate) struct Conn {
    pub id: u64,
    /// Canonical key: side 0 sent from `key.src`, side 1 from `key.dst`.
    pub key: FlowKey,
    pub t_first: Timestamp,
    pub t_last: Timestamp,
    frames: u64,
    s: [Side; 2],
    /// Time the client's ACK of the SYN-ACK was seen.
    hs_ack: Option<Timestamp>,
    adus: Vec<Adu>,
    adu_segs: Vec<AduSeg>,
    adus_dropped: u64,
    last_side: Option<u8>,
    pub evicted: bool,
    min_rtt_hint: Option<i64>,
}

impl Conn {
    pub fn new(id: u64, key: FlowKey, t: Timestamp) -> Conn {
        Conn {
            id,
            key,
            t_first: t,
            t_last: t,
            frames: 0,
            s: [Side::default(), Side::default()],
            hs_ack: None,
            adus: Vec::new(),
            adu_segs: Vec::new(),
            adus_dropped: 0,
            last_side: None,
            evicted: false,
            min_rtt_hint: None,
        }
    }

    /// FIN from both sides, or a RST: the connection is over (late packets may still come).
    pub fn terminated(&self) -> bool {
        (self.s[0].fin_t.is_some() && self.s[1].fin_t.is_some())
            || self.s[0].rst_t.is_some()
            || self.s[1].rst_t.is_some()
    }

    /// Whether a SYN from `side` starts a new connection on this 4-tuple (port reuse) rather
    /// than belonging to this one.
    pub fn is_reuse(&self, side: usize, seg: &TcpSegment) -> bool {
        if !seg.flags.syn() || seg.flags.ack() {
            return false;
        }
        let me = &self.s[side];
        if self.terminated() || me.fin_t.is_some() {
            return !(me.syn.seen && me.syn.isn == seg.seq && me.hi <= 1);
        }
        // a SYN with a new ISN after this connection carried data or completed its handshake
        me.syn.seen
            && me.syn.isn != seg.seq
            && (self.hs_ack.is_some() || me.hi > 1 || self.s[1 - side].hi > 1)
    }

    fn pair(&mut self, d: usize) -> (&mut Side, &mut Side) {
        let (a, b) = self.s.split_at_mut(1);
        if d == 0 {
            (&mut a[0], &mut b[0])
        } else {
            (&mut b[0], &mut a[0])
        }
    }

    /// Current best RTT estimate (handshake or data samples), for thresholds.
    fn rtt_hint(&self) -> Option<i64> {
        self.min_rtt_hint
    }

    fn note_rtt(&mut self, ns: i64) {
        if ns > 0 {
            self.min_rtt_hint = Some(self.min_rtt_hint.map_or(ns, |m| m.min(ns)));
        }
    }

    pub fn handle(&mut self, cfg: &Config, d: usize, t: Timestamp, seg: &TcpSegment) {
        let o = 1 - d;
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
            Some(id) if id != 0 => self.s[d]
                .recent
                .iter()
                .any(|&(s0, i0, t0)| s0 == sig && i0 == id && t.nanos_since(t0).abs() < dur::SEC),
            _ => {
                seg.payload_len > 0
                    && self.last_side == Some(d as u8)
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
                side.recent[side.recent_next as usize] = (sig, id, t);
                side.recent_next = (side.recent_next + 1) % RECENT as u8;
            }
            side.recent_any = Some((sig, t));
        }
        self.last_side = Some(d as u8);
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
            if seg.window == 0 {
                self.s[d].zero_window += 1;
            }
            self.s[d].last_window = Some(seg.window);
        }
        if seg.payload_len > 0 && self.s[d].window_at_first_data.is_none() {
            self.s[d].window_at_first_data = Some(seg.window);
        }
    }

    fn on_syn(&mut self, d: usize, t: Timestamp, seg: &TcpSegment) {
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

    /// `log`: this packet's index in the side's `sends`.
    fn on_data(
        &mut self,
        cfg: &Config,
        d: usize,
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
        if len == 1 && self.s[1 - d].last_window == Some(0) && !seg.flags.syn() && !seg.flags.fin()
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
        // the resends before this segment learn when data was next sent after them (each
        // once: those that know it already are older than the rest)
        for rx in side.retx.iter_mut().rev() {
            if rx.next_send.is_some() {
                break;
            }
            rx.next_send = Some(t);
        }
        side.data_pkts += 1;
        side.max_seg = side.max_seg.max(seg.payload_len);
        let wire = seg.payload_len + seg.hdr_len as u32;
        // bytes seen before only as a window probe do not make this a retransmission
        let probed = side
            .probe
            .map_or(0, |(ps, pe)| (end.min(pe) - start.max(ps)).max(0));
        let is_retx = ins.old_bytes > probed;
        if is_retx {
            side.retx_pkts += 1;
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
            if side.retx.len() >= MAX_RETX {
                side.retx.pop_front();
            }
            // data the receiver had already acknowledged when it was resent
            let already = side.ack_seen && side.acked >= end;
            if already {
                side.spurious_heur += 1;
            }
            side.retx.push_back(Retx {
                start,
                end,
                t,
                spurious: already,
                decided: already,
                orig_flight,
                orig_log,
                covered: false,
                next_send: None,
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
            self.on_new_data(cfg, d, t, start, end, ins.new_bytes as u64, seg.payload);
        } else if is_retx {
            // a pure retransmission still extends its exchange's last-packet time
            for a in self.adus.iter_mut().rev() {
                if a.side == d as u8 && a.start < end && start < a.end {
                    a.t_last = a.t_last.max(t);
                    break;
                }
            }
        }
    }

    /// Inter-segment pause that separates two bursts of one sender.
    fn burst_gap(&self) -> i64 {
        match self.rtt_hint() {
            Some(r) => (r / 8).clamp(100 * dur::US, 5 * dur::MS),
            None => dur::MS,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn on_new_data(
        &mut self,
        cfg: &Config,
        d: usize,
        t: Timestamp,
        start: i64,
        end: i64,
        new_bytes: u64,
        payload: &[u8],
    ) {
        let room = self.adu_segs.len() < CONN_ADU_SEGS;
        if let Some(a) = self.adus.last_mut() {
            if a.side == d as u8 {
                a.t_last = a.t_last.max(t);
                a.bytes += new_bytes;
                a.end = a.end.max(end);
                if a.seg_len < ADU_SEGS && room {
                    push_sized(&mut self.adu_segs, (t, start, end, None), 32);
                    a.seg_len += 1;
                }
                return;
            }
        }
        if self.adus.len() >= cfg.max_exchanges * 2 {
            self.adus_dropped += 1;
            return;
        }
        let mut prefix = [0u8; 16];
        let n = payload.len().min(16);
        prefix[..n].copy_from_slice(&payload[..n]);
        push_sized(
            &mut self.adus,
            Adu {
                side: d as u8,
                t_first: t,
                t_last: t,
                bytes: new_bytes,
                start,
                end,
                seg_start: self.adu_segs.len() as u32,
                seg_len: room as u32,
                acked_upto: self.adu_segs.len() as u32,
                prefix,
                prefix_len: n as u8,
            },
            16,
        );
        if room {
            push_sized(&mut self.adu_segs, (t, start, end, None), 32);
        }
    }

    fn on_ack(&mut self, cfg: &Config, d: usize, t: Timestamp, seg: &TcpSegment) {
        let o = 1 - d;
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
            self.note_rtt(rtt);
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
                let side = &mut self.s[o];
                side.dsack_seen = true;
                if let Some(rx) = side
                    .retx
                    .iter_mut()
                    .find(|x| !x.spurious && x.start < rr && lr < x.end)
                {
                    rx.spurious = true;
                    rx.decided = true;
                    side.spurious_dsack += 1;
                }
            }
        }

        let rtt_hint = self.rtt_hint();
        let advanced = !self.s[o].ack_seen || a > self.s[o].acked;
        if advanced {
            let (_, data) = self.pair(d);
            let prev_acked = if data.ack_seen { data.acked } else { i64::MIN };
            let mut sample: Option<i64> = None;
            let mut exact: Option<(Timestamp, u32)> = None;
            // Karn: a sample from the newest segment the ACK covers, if never retransmitted
            let mut any_retx = false;
            let mut newly: u32 = 0;
            let mut isolated: Option<(Timestamp, i64)> = None;
            let mut followed = false;
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
                    }
                    // the only segment in flight, nothing sent after it
                    if s.start == prev_acked && s.end == data.hi {
                        isolated = Some((s.t, s.end));
                    }
                }
            }
            if any_retx {
                sample = None;
            }
            if let Some(r) = sample {
                data.rtt_count += 1;
                if data.rtt_min.is_none_or(|(_, m)| r < m) {
                    data.rtt_min = Some((t, r));
                }
                if followed && data.rtt_max.is_none_or(|(_, m)| r > m) {
                    data.rtt_max = Some((t, r));
                }
                if data.rtt.len() < cfg.rtt_rows {
                    push_sized(&mut data.rtt, (t, r), cfg.rtt_rows.min(16));
                }
            }
            // delayed-ACK accounting in slow start (before the first retransmission)
            // (segments counted as they are acknowledged, not as they are sent: a tail-loss
            // probe before the first ACK would otherwise leave a quick-ACKing client with
            // segments and no ACKs, read as delayed ACKs)
            if data.first_retx_t.is_none() && newly > 0 {
                data.ss_acks += 1;
                data.ss_segs += newly;
            }
            // an isolated segment (the only one in flight, nothing sent after it) reveals the
            // receiver's delayed-ACK timer
            if let Some((st, _)) = isolated {
                if newly == 1 && !any_retx && data.delack_delays.len() < 1024 {
                    data.delack_delays.push(t.nanos_since(st));
                }
            }
            // packet pair on the spacing of two consecutive advancing ACKs
            if let Some(prev) = data.adv {
                let bytes = a - prev.ack;
                let gap = t.nanos_since(prev.t);
                if bytes > 0 && gap > 0 && prev.seg_t.is_some() {
                    let mut wire: u64 = 0;
                    let mut same_burst = prev.seg_burst.is_some();
                    let mut last_t = None;
                    let mut clean = pure && prev.pure;
                    let from = data.segs.partition_point(|s| s.end <= prev.ack);
                    for s in data.segs.range(from..upto.max(from)) {
                        wire += s.wire as u64;
                        clean &= !s.retx;
                        same_burst &= Some(s.burst) == prev.seg_burst;
                        last_t = Some(last_t.map_or(s.t, |lt: Timestamp| lt.max(s.t)));
                    }
                    if wire > 0 {
                        let bps = wire as f64 * 8.0 / (gap as f64 / 1e9);
                        let send_gap = match (prev.seg_t, last_t) {
                            (Some(p), Some(l)) => l.nanos_since(p),
                            _ => i64::MAX,
                        };
                        // a lone segment at the end of a flight may have waited for the
                        // receiver's delayed-ACK timer: its ACK's spacing says nothing
                        let lone_tail = newly == 1 && a >= data.hi;
                        let valid =
                            clean && same_burst && !lone_tail && send_gap.saturating_mul(2) < gap;
                        if valid {
                            let delay_sum = match (prev.seg_t, exact) {
                                (Some(p), Some((et, _))) => {
                                    prev.t.nanos_since(p) + t.nanos_since(et)
                                }
                                _ => i64::MAX,
                            };
                            if data.bw.len() < cfg.max_samples {
                                data.bw.push(BwPair {
                                    t,
                                    bps,
                                    wire,
                                    gap,
                                    delay_sum,
                                });
                            } else {
                                data.samples_dropped += 1;
                            }
                        }
                    }
                }
            }
            data.adv = Some(AdvAck {
                t,
                ack: a,
                seg_t: exact.map(|e| e.0),
                seg_burst: exact.map(|e| e.1),
                pure,
            });
            // retransmissions: an ACK covering them too soon after they were sent was caused by
            // the original (the resend was spurious)
            for rx in data.retx.iter_mut().filter(|x| !x.decided) {
                if !rx.covered && rx.end <= a {
                    let soon = rtt_hint.is_some_and(|r| t.nanos_since(rx.t) < r * 3 / 4);
                    if soon {
                        rx.spurious = true;
                        data.spurious_heur += 1;
                        rx.decided = true;
                    } else {
                        // this ACK may answer the original or the resend: Monkey's test waits
                        // for a duplicate ACK answering the resend (below)
                        rx.covered = true;
                    }
                }
                if rx.covered && dupack_window_closed(rx, t, rtt_hint) {
                    rx.decided = true;
                }
            }
            data.acked = a;
            data.ack_seen = true;
            // keep the segment ending at the cumulative ACK for the next pair
            while data.segs.len() > 1 && data.segs[1].end <= a {
                data.segs.pop_front();
            }
            if let Some(sample) = sample {
                // data→ACK samples tighten the thresholds only when the handshake gave none
                if self.hs_ack.is_none() {
                    self.note_rtt(sample);
                }
            }
            // ACK times of response segments, for the query-delay test
            for adu in self
                .adus
                .iter_mut()
                .rev()
                .take(4)
                .filter(|x| x.side == o as u8)
            {
                let end = adu.seg_start + adu.seg_len;
                while adu.acked_upto < end && self.adu_segs[adu.acked_upto as usize].2 <= a {
                    self.adu_segs[adu.acked_upto as usize].3 = Some(t);
                    adu.acked_upto += 1;
                }
            }
        } else if a == self.s[o].acked
            && pure
            // a window update is no duplicate
            && self.s[d].last_window.is_none_or(|w| w == seg.window)
        {
            let data = &mut self.s[o];
            if data.hi > a {
                data.dupacks += 1;
            }
            // Monkey's heuristic: a duplicate ACK answering a retransmission of data the
            // receiver already holds means the retransmission was spurious (with nothing
            // outstanding any more, the answer repeats the cumulative ACK all the same)
            for rx in data.retx.iter_mut().filter(|x| !x.decided) {
                let answered = rtt_hint.is_none_or(|r| t.nanos_since(rx.t) >= r * 3 / 4);
                if !answered {
                    continue;
                }
                if rx.covered && !dupack_window_closed(rx, t, rtt_hint) {
                    // the receiver already held this data when the resend reached it
                    rx.spurious = true;
                    data.spurious_heur += 1;
                }
                rx.decided = true;
            }
        }
    }

    /// Which side is the client (index) and how that was decided.
    fn roles(&self, cfg: &Config) -> (usize, ServerBy) {
        let s = &self.s;
        if s[0].syn.seen && !s[0].syn.with_ack {
            return (0, ServerBy::Syn);
        }
        if s[1].syn.seen && !s[1].syn.with_ack {
            return (1, ServerBy::Syn);
        }
        if s[0].syn.seen && s[0].syn.with_ack {
            return (1, ServerBy::Synack);
        }
        if s[1].syn.seen && s[1].syn.with_ack {
            return (0, ServerBy::Synack);
        }
        let ports = [self.key.src.port, self.key.dst.port];
        let addrs = [self.key.src.addr, self.key.dst.addr];
        for side in 0..2 {
            if cfg.server_ports.contains(&ports[side])
                && !cfg.server_ports.contains(&ports[1 - side])
            {
                return (1 - side, ServerBy::Port);
            }
        }
        for side in 0..2 {
            let inside = |i: usize| cfg.server_nets.iter().any(|n| n.contains(&addrs[i]));
            if inside(side) && !inside(1 - side) {
                return (1 - side, ServerBy::Net);
            }
        }
        // well-known port, else the lower port, serves
        let wk = |p: u16| p < 1024 || matches!(p, 1080 | 3128 | 8000 | 8008 | 8080 | 8443 | 8888);
        let server = match (wk(ports[0]), wk(ports[1])) {
            (true, false) => 0,
            (false, true) => 1,
            _ => {
                if ports[0] <= ports[1] {
                    0
                } else {
                    1
                }
            }
        };
        (1 - server, ServerBy::Guess)
    }

    /// Builds the record. `cfg` decides roles for connections without a handshake.
    pub fn to_record(&self, cfg: &Config) -> ConnectionRecord {
        let (ci, server_by) = self.roles(cfg);
        let si = 1 - ci;
        let c = &self.s[ci];
        let sv = &self.s[si];
        let (client, server) = if ci == 0 {
            (self.key.src, self.key.dst)
        } else {
            (self.key.dst, self.key.src)
        };

        let handshake = c.syn.seen && !c.syn.with_ack && sv.syn.seen && sv.syn.with_ack;
        // The round trip at the tap is the tap→client→tap part plus the tap→server→tap part.
        // The first shows from the SYN-ACK to the client's ACK and from server data to the
        // client's ACKs; the second from the SYN to the SYN-ACK and from client data to the
        // server's ACKs. The minimum of each part, added, is the path's minimum RTT wherever the
        // tap sits (in front of the server the second part is the server's own turnaround).
        // Karn: a retransmitted SYN or SYN-ACK makes its part of the handshake ambiguous.
        let hs_down = (handshake && sv.syn.count == 1)
            .then_some(self.hs_ack)
            .flatten()
            .map(|t| t.nanos_since(sv.syn.t_last))
            .filter(|r| *r >= 0);
        let hs_up = (handshake && c.syn.count == 1)
            .then(|| sv.syn.t_first.nanos_since(c.syn.t_first))
            .filter(|r| *r >= 0);
        let hs_rtt = hs_down.zip(hs_up).map(|(d, u)| d + u);
        // rows: the handshake, then each direction's first samples, its minimum and maximum
        let mut rtt_samples: Vec<RttSample> = Vec::with_capacity(3 + sv.rtt.len() + c.rtt.len());
        if let (Some(r), Some(t)) = (hs_rtt, self.hs_ack) {
            rtt_samples.push(RttSample {
                t,
                rtt_us: dur::ns_to_us(r),
                kind: RttKind::Handshake,
            });
        }
        for (side, kind) in [(sv, RttKind::Data), (c, RttKind::Upstream)] {
            rtt_samples.extend(side.rtt.iter().map(|(t, r)| RttSample {
                t: *t,
                rtt_us: dur::ns_to_us(*r),
                kind,
            }));
            let max = side.rtt_max.filter(|m| side.rtt_min != Some(*m));
            for (t, r) in side.rtt_min.into_iter().chain(max) {
                if !side.rtt.contains(&(t, r)) {
                    rtt_samples.push(RttSample {
                        t,
                        rtt_us: dur::ns_to_us(r),
                        kind,
                    });
                }
            }
        }
        let down_part = hs_down
            .into_iter()
            .chain(sv.rtt_min.map(|x| x.1))
            .filter(|r| *r >= 0)
            .min();
        let up_part = hs_up
            .into_iter()
            .chain(c.rtt_min.map(|x| x.1))
            .filter(|r| *r >= 0)
            .min();
        let min_rtt_ns = match (down_part, up_part) {
            (Some(d), Some(u)) => Some(d + u),
            (Some(d), None) => Some(d),
            _ => None,
        }
        .filter(|r| *r > 0);

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
        let rwin_syn = c.syn.seen.then_some(c.syn.window as u64);

        // spurious retransmissions: D-SACK where the receiver uses it, else the heuristics
        let (spurious, spurious_by) = if sv.dsack_seen {
            (sv.spurious_dsack, Some("dsack"))
        } else if sv.retx_pkts > 0 {
            (sv.spurious_heur.min(sv.retx_pkts), Some("dupack"))
        } else {
            (0, None)
        };
        let loss = (sv.data_pkts > 0)
            .then(|| (sv.retx_pkts.saturating_sub(spurious)) as f64 / sv.data_pkts as f64);

        // bandwidth from the client's ACKs of server data
        let pairs: Vec<Pair> = sv
            .bw
            .iter()
            .map(|b| Pair {
                bps: b.bps,
                delay_sum_ns: b.delay_sum,
            })
            .collect();
        let (bw, used) = bandwidth::combine(cfg.bw_method, &pairs);
        let bw_samples: Vec<BwSample> = sv
            .bw
            .iter()
            .zip(used)
            .map(|(b, used)| BwSample {
                t: b.t,
                bps: b.bps,
                bytes: b.wire,
                gap_us: dur::ns_to_us(b.gap),
                used,
            })
            .collect();

        // delayed-ACK policy in slow start
        let (policy, aps) = if sv.ss_segs >= 2 {
            let r = sv.ss_acks as f64 / sv.ss_segs as f64;
            (
                if r >= 0.75 {
                    DelackPolicy::Quick
                } else {
                    DelackPolicy::Delayed
                },
                Some(r),
            )
        } else {
            (DelackPolicy::Unknown, None)
        };
        let delack_timeout = {
            let rtt = min_rtt_ns.unwrap_or(0);
            let mut v: Vec<i64> = sv
                .delack_delays
                .iter()
                .map(|d| d - rtt)
                .filter(|x| *x > dur::MS)
                .collect();
            v.sort_unstable();
            (!v.is_empty() && policy != DelackPolicy::Quick).then(|| dur::ns_to_us(v[v.len() / 2]))
        };

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
        let exchanges = build_exchanges(
            &self.adus,
            &self.adu_segs,
            ci as u8,
            mss_eff,
            if handshake { self.hs_ack } else { None },
        );
        // Losses the bottleneck queue explains: a replay's emulated queue drops those by
        // itself, so only the rest is replayed as random loss. The server's transmissions, as
        // seen at the tap, are fed through a drop-tail queue of the inferred rate and the
        // (class-based) queue length: a lost original that met a full queue is congestive.
        // Originals beyond the send log fall back to a flight-size test (more in flight than
        // the path holds plus its queue).
        let loss_random = loss.map(|all| match (bw, min_rtt_ns) {
            (Some(bw), Some(rtt)) if sv.data_pkts > 0 => {
                let (_, q) = mimic_core::model::queue_packets(Some(bw));
                let mss = mss_eff.max(536) as f64;
                let capacity = bw / 8.0 * rtt as f64 / 1e9 + q as f64 * mss;
                let full_at = queue_full_at(&sv.sends, &sv.retx, bw, q);
                let tracked = sv.retx.iter().filter(|r| !r.spurious).count() as u64;
                let congestive = sv
                    .retx
                    .iter()
                    .filter(|r| {
                        !r.spurious
                            && match full_at.get(r.orig_log as usize) {
                                Some(&full) => full,
                                None => r.orig_flight as f64 > capacity,
                            }
                    })
                    .count() as u64;
                let untracked = sv
                    .retx_pkts
                    .saturating_sub(spurious)
                    .saturating_sub(tracked);
                (tracked - congestive + untracked) as f64 / sv.data_pkts as f64
            }
            _ => all,
        });
        let first_req = exchanges.iter().find_map(|e| e.t_req_first);
        let last_resp = exchanges.iter().rev().find_map(|e| e.t_resp_last);
        let response_time = match (first_req, last_resp) {
            (Some(a), Some(b)) if b >= a => Some(dur::ns_to_us(b.nanos_since(a))),
            _ => None,
        };

        // termination
        let rst = [c.rst_t, sv.rst_t];
        let fin = [c.fin_t, sv.fin_t];
        let first_rst = rst.iter().flatten().min().copied();
        let both_fin = fin[0].zip(fin[1]).map(|(a, b)| a.max(b));
        let termination = match (first_rst, both_fin, fin[0].or(fin[1])) {
            (Some(r), Some(bf), _) if r > bf => Termination::Fin,
            (Some(r), _, _) => {
                let last_server_data = self
                    .adus
                    .iter()
                    .rev()
                    .find(|a| a.side == si as u8)
                    .map(|a| a.t_last);
                let all_acked = sv.ack_seen && sv.acked >= sv.hi - fin[1].is_some() as i64;
                match last_server_data {
                    Some(ld) if r >= ld && all_acked => Termination::RstAfterResponse,
                    _ => Termination::RstAbort,
                }
            }
            (None, _, Some(_)) => Termination::Fin,
            _ => Termination::None,
        };
        let closer = |side: usize| {
            [self.s[side].fin_t, self.s[side].rst_t]
                .into_iter()
                .flatten()
                .min()
        };
        let closed_by = match (closer(ci), closer(si)) {
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
            min_rtt_us: min_rtt_ns.map(dur::ns_to_us),
            hs_rtt_us: hs_rtt.map(dur::ns_to_us),
            rtt_sample_count: hs_rtt.is_some() as u32 + sv.rtt_count + c.rtt_count,
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
            zero_window: c.zero_window,
            data_pkts_down: sv.data_pkts,
            data_bytes_down: data_bytes(sv),
            retx_down: sv.retx_pkts,
            spurious_retx_down: spurious,
            spurious_by,
            loss_rate_down: loss,
            loss_random_down: loss_random,
            data_pkts_up: c.data_pkts,
            data_bytes_up: data_bytes(c),
            retx_up: c.retx_pkts,
            fin_retx: c.fin_retx + sv.fin_retx,
            zwnd_probes: c.zwnd_probes + sv.zwnd_probes,
            dup_frames: c.dup_frames + sv.dup_frames,
            bw_bps: bw,
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
            rtt_samples,
            bw_samples,
        }
    }

    /// What the per-connection bounds dropped: segments no longer tracked for RTT and pairs,
    /// samples beyond the limit, data units beyond the exchange limit, sequence ranges merged
    /// across a gap.
    pub fn dropped(&self) -> [u64; 4] {
        let (a, b) = (&self.s[0], &self.s[1]);
        [
            a.segs_dropped + b.segs_dropped,
            a.samples_dropped + b.samples_dropped,
            self.adus_dropped,
            (a.covered.forced_merges + b.covered.forced_merges) as u64,
        ]
    }

    pub fn dup_frames(&self) -> u64 {
        self.s[0].dup_frames + self.s[1].dup_frames
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

/// Pairs request and response data units into exchanges and runs the query-delay test.
///
/// Think time is the client's pause before a request: after the previous response, or for the
/// first request after the handshake completed (`connected`).
fn build_exchanges(
    adus: &[Adu],
    segs: &[AduSeg],
    client: u8,
    mss: u32,
    connected: Option<Timestamp>,
) -> Vec<Exchange> {
    let mut out: Vec<Exchange> = Vec::with_capacity(adus.len().div_ceil(2));
    let mut i = 0;
    let mut prev_resp_last: Option<Timestamp> = connected;
    while i < adus.len() {
        // data units alternate sides: a request is followed by its response, if any;
        // data the server sent first is a response without a request
        let (req, resp) = if adus[i].side == client {
            let resp = adus.get(i + 1);
            i += 1 + resp.is_some() as usize;
            (Some(&adus[i - 1 - resp.is_some() as usize]), resp)
        } else {
            i += 1;
            (None, Some(&adus[i - 1]))
        };
        let method = req.and_then(|r| http::request_method(&r.prefix[..r.prefix_len as usize]));
        let status = resp.and_then(|r| http::response_status(&r.prefix[..r.prefix_len as usize]));
        let (query_delay, header) = match resp {
            Some(r) => query_delay(
                r,
                &segs[r.seg_start as usize..(r.seg_start + r.seg_len) as usize],
                mss,
            ),
            None => (None, None),
        };
        let think = match (prev_resp_last, req) {
            (Some(p), Some(r)) => Some(dur::ns_to_us(r.t_first.nanos_since(p))),
            _ => None,
        };
        let response_delay = match (req, resp) {
            (Some(q), Some(r)) => Some(dur::ns_to_us(r.t_first.nanos_since(q.t_last))),
            _ => None,
        };
        if let Some(r) = resp {
            // the client had the response when it acknowledged the last byte (seen here after
            // the same upstream delay as its next request), not when the server sent it: on a
            // slow link those are a transfer time apart, and a think time from the latter
            // makes a replay's client wait that long again
            let acked = r
                .seg_len
                .checked_sub(1)
                .and_then(|i| segs.get((r.seg_start + i) as usize))
                .filter(|s| s.2 >= r.end)
                .and_then(|s| s.3);
            prev_resp_last = Some(acked.map_or(r.t_last, |a| a.max(r.t_last)));
        }
        out.push(Exchange {
            seq: out.len() as u32,
            t_req_first: req.map(|r| r.t_first),
            t_req_last: req.map(|r| r.t_last),
            req_bytes: req.map_or(0, |r| r.bytes),
            t_resp_first: resp.map(|r| r.t_first),
            t_resp_last: resp.map(|r| r.t_last),
            resp_bytes: resp.map_or(0, |r| r.bytes),
            response_delay_us: response_delay,
            query_delay_us: query_delay,
            header_bytes: header,
            think_time_us: think,
            method,
            status,
        });
    }
    out
}

/// Monkey's query-delay algorithm (§3.3.3), applied to one response: walk the response's
/// segments in sending order; the first segment `c` sent after its predecessor `p` was
/// acknowledged (the server had room but no data), or following a sub-MSS `p` (the end of
/// what the server had written), begins the part that waited on the query. Returns the delay
/// from the first response segment to `c` and the bytes sent before `c`; (0, all bytes) when
/// no such split exists.
fn query_delay(r: &Adu, segs: &[AduSeg], mss: u32) -> (Option<i64>, Option<u64>) {
    let Some(&(t0, s0, _, _)) = segs.first() else {
        return (None, None);
    };
    for w in segs.windows(2) {
        let (pt, ps, pe, pack) = w[0];
        let (ct, cs, _, _) = w[1];
        let acked_before = pack.is_some_and(|a| ct > a) && ct > pt;
        let short = mss > 0 && ((pe - ps) as u32) < mss;
        if acked_before || short {
            return (
                Some(dur::ns_to_us(ct.nanos_since(t0))),
                Some((cs - s0).max(0) as u64),
            );
        }
    }
    (Some(0), Some(r.bytes))
}

/// Replays a direction's transmissions through a drop-tail queue of `q` packets in front of a
/// `bw_bps` serializer (netemu's pipe model, rate on IP bytes) and says, per logged
/// transmission, whether the queue was full when it arrived. Originals that were lost (repeated
/// by a retransmission that was not spurious) do not enter the queue; a transmission that got
/// through although the model's queue was full does not either (the model caps the queue).
fn queue_full_at(sends: &[Send], retx: &VecDeque<Retx>, bw_bps: f64, q: u32) -> Vec<bool> {
    let mut lost = vec![false; sends.len()];
    for r in retx.iter().filter(|r| !r.spurious) {
        if let Some(l) = lost.get_mut(r.orig_log as usize) {
            *l = true;
        }
    }
    let ns_per_byte = 8e9 / bw_bps;
    let mut backlog: VecDeque<f64> = VecDeque::new();
    let mut busy_until = f64::MIN;
    let Some(t0) = sends.first().map(|s| s.t) else {
        return Vec::new();
    };
    sends
        .iter()
        .zip(lost)
        .map(|(s, lost)| {
            let now = s.t.nanos_since(t0) as f64;
            while backlog.front().is_some_and(|&end| end <= now) {
                backlog.pop_front();
            }
            let full = backlog.len() >= q as usize;
            if !lost && !full {
                let end = busy_until.max(now) + s.wire as f64 * ns_per_byte;
                busy_until = end;
                backlog.push_back(end);
            }
            full
        })
        .collect()
}
