//! Bottleneck bandwidth of one direction, from the spacing of the receiver's ACKs.
//!
//! * Packet pairs: two ACKs that advanced over this direction's data, only over segments sent
//!   in one burst, none retransmitted, spaced wider than they were sent, and not a lone
//!   delayed-ACK tail; the second one covers at least one segment (a bare FIN's ACK, which
//!   comes a round trip of the close later, ends no pair). Combined by `--bw-method`
//!   (`crate::bandwidth`). ACKs that come less than `BUNCHED` (100 µs) after a pair's first
//!   ACK are bunched with it, not spaced by the bottleneck: a late timer in the emulator
//!   (the testbed's QEMU router guest releases packets 60-170 µs late, four or five at a
//!   time at 50 Mbit/s), interrupt coalescing, GRO or ACK compression let several through
//!   back to back, then a gap. They are folded into the pair, which then reads the rate from
//!   the first ACK of one bunch to the first ACK of a later one (the bytes of every ACK after
//!   the first over the time between). Read pair by pair, the ACKs inside a bunch gave
//!   1-5 Gbit/s and the gap after it too little: on the
//!   testbed's fibre-50m class (h-gfast-3) 86 of 250 estimates were more than 20% high
//!   (median of the misses ~1.5 Gbit/s); folded, 3 high and 34 low. A pair's resolution is
//!   thereby 100 µs: above 120 Mbit/s (1500 bytes in 100 µs) a pair spans several segments.
//! * Trains: the ACKs of a run of such segments (one burst, none retransmitted, pure ACKs, no
//!   lone delayed-ACK tail), first to last: the IP bytes the ACKs after the first one covered
//!   over the time between the first and the last. A pair's spacing is one or two segments'
//!   transmission time, which a 1 ms timestamp tick (an emulator's clock, interrupt
//!   coalescing) or ACKs compressed on the way back (held and released together) distort by
//!   as much as the spacing itself; a train's span is many of them, so a train counts only if
//!   it spans at least `MIN_TRAIN_SPAN` (10 ticks of 1 ms: at most 10% from the tick) and its
//!   segments were sent in less than half that time (the bottleneck, not the sender, spaced
//!   them), and no single spacing of two of its ACKs makes more than half of its span (a
//!   stretch ACK or a delayed one would make a train a pair). A train that grows past that
//!   (ACK-clocked segments sent as fast as they are acknowledged) keeps its longest prefix
//!   that qualified. ACKs that arrive together (gap 0) are fine inside a train. A train never
//!   starts at a burst's first ACK: a shaper's token bucket lets a busy period's first packets
//!   through at once (bench/independent.sh's htb classes up to 10 Mbit/s: trains from a
//!   burst's first ACK put 14 of 213 estimates more than 20% high, from its second none, on
//!   the capture as taken and with its timestamps floored to 1 ms).
//!
//! The estimate is the pairs' (`BwSource::Pairs`) where the ACKs' timing is fine; the median of
//! the trains (`BwSource::Trains`) where it is coarse (half of the ACKs stamped within 20 µs of
//! a millisecond boundary: 4% by chance) or compressed (a quarter of them less than 100 µs
//! after the previous one), and where no pair qualified. On fine timestamps a pair is the finer
//! instrument (its median ignores the odd stretched or bunched spacing). The trains also
//! outvote the pairs where they agree among themselves (more than half of them, and two or
//! more, within 30% of each other — one stray train does not veto — or one of at least four
//! times the least span) and their median is more than 15% from the pairs': a
//! shaper's tick that is not the tap's millisecond (a HZ=250 router releasing two or three
//! packets every 4 ms, spread by its forwarding) blurs the pairs, and neither the grid nor the
//! bunching test sees it.

use std::collections::VecDeque;

use mimic_core::time::dur;
use mimic_core::Timestamp;

use super::Seg;
use crate::bandwidth::{self, Pair};
use crate::config::Config;
use crate::record::{BwKind, BwSample, BwSource};

/// A train counts only if its first and last ACK are at least this far apart.
const MIN_TRAIN_SPAN: i64 = 10 * dur::MS;
/// ... and it covered at least this many segments after its first ACK.
const MIN_TRAIN_SEGS: u32 = 3;
/// An ACK stamped this close to a millisecond boundary is "on the grid" (by chance: 4%).
const GRID_SLACK: i64 = 20 * dur::US;
/// An ACK this soon after the previous one came bunched with it (compressed); one this soon
/// after a pair's first ACK is folded into the pair.
const BUNCHED: i64 = 100 * dur::US;

/// A packet pair that qualified as a bandwidth sample.
#[derive(Clone, Copy, Debug)]
struct BwPair {
    t: Timestamp,
    bps: f64,
    wire: u64,
    gap: i64,
    delay_sum: i64,
}

/// A train being followed: the ACKs of segments of one burst since its first ACK.
#[derive(Clone, Copy, Debug)]
struct Train {
    burst: u32,
    /// Its first ACK.
    t0: Timestamp,
    /// Send times of the first and last segment acknowledged after `t0`.
    send_first: Option<Timestamp>,
    send_last: Option<Timestamp>,
    /// IP bytes and segments acknowledged after `t0`.
    wire: u64,
    segs: u32,
    /// Its first ACK is the burst's first one: the next one becomes its first (a token
    /// bucket lets a busy period's first packets through at once).
    head: bool,
    /// Its latest ACK, and the widest spacing of two of its consecutive ACKs.
    t_last: Timestamp,
    max_gap: i64,
    /// The longest prefix that qualified: (last ACK, IP bytes, span).
    best: Option<(Timestamp, u64, i64)>,
}

impl Train {
    fn sample(&self) -> Option<BwPair> {
        self.best.map(|(t, wire, span)| BwPair {
            t,
            bps: wire as f64 * 8.0 / (span as f64 / 1e9),
            wire,
            gap: span,
            delay_sum: i64::MAX,
        })
    }
}

/// The previous ACK that advanced over this direction's data.
#[derive(Clone, Copy, Debug)]
struct AdvAck {
    t: Timestamp,
    ack: i64,
    /// Send time and burst of the segment that ended exactly at `ack` (if any).
    seg_t: Option<Timestamp>,
    seg_burst: Option<u32>,
    pure: bool,
}

/// An ACK that advanced over this direction's data, as the data path saw it.
pub(super) struct Advance<'a> {
    pub t: Timestamp,
    /// The new cumulative ACK (relative).
    pub ack: i64,
    /// No payload, SYN, FIN or RST.
    pub pure: bool,
    /// The direction's segments in flight, in sending order; those before `upto` end at or
    /// below `ack`.
    pub segs: &'a VecDeque<Seg>,
    pub upto: usize,
    /// Segments the ACK newly covered.
    pub newly: u32,
    /// Send time and burst of the newest segment it covered.
    pub exact: Option<(Timestamp, u32)>,
    /// Highest sequence end the direction sent.
    pub hi: i64,
}

/// What a pair's sample has covered since its first ACK (`Bandwidth::start`).
#[derive(Clone, Copy, Debug)]
struct Pending {
    /// IP bytes acknowledged after the first ACK.
    wire: u64,
    /// Pure ACKs over segments none of which was retransmitted.
    clean: bool,
    /// All of them of the first ACK's segment's burst.
    same_burst: bool,
    /// Latest send time of a segment acknowledged after the first ACK.
    last_t: Option<Timestamp>,
}

#[derive(Clone, Debug, Default)]
pub(super) struct Bandwidth {
    adv: Option<AdvAck>,
    /// The first ACK of the pair being read, and what the ACKs since then covered.
    start: Option<AdvAck>,
    acc: Option<Pending>,
    pairs: Vec<BwPair>,
    train: Option<Train>,
    trains: Vec<BwPair>,
    /// How coarse the ACKs' timing is: advancing ACKs that followed another, how many of them
    /// were stamped within 20 µs of a millisecond boundary, and how many came less than
    /// 100 µs after the previous one.
    acks: u32,
    acks_on_grid: u32,
    acks_bunched: u32,
    pub samples_dropped: u64,
}

impl Bandwidth {
    /// Per-ACK hook: a packet pair on the spacing of this ACK and the previous advancing one.
    pub fn on_advance(&mut self, cfg: &Config, x: &Advance) {
        let t = x.t;
        let here = AdvAck {
            t,
            ack: x.ack,
            seg_t: x.exact.map(|e| e.0),
            seg_burst: x.exact.map(|e| e.1),
            pure: x.pure,
        };
        // the first segment past the previous advancing ACK: where this ACK's pair and the
        // train's step begin (searched once for both)
        let from_prev = self.adv.map(|p| x.segs.partition_point(|s| s.end <= p.ack));
        if let Some(prev) = self.adv {
            let sub_ms = t.as_nanos().rem_euclid(dur::MS);
            self.acks += 1;
            self.acks_on_grid += (sub_ms <= GRID_SLACK || sub_ms >= dur::MS - GRID_SLACK) as u32;
            self.acks_bunched += (t.nanos_since(prev.t) < BUNCHED) as u32;
        }
        // the pair's sample runs from `self.start` (an earlier advancing ACK) to this one; ACKs
        // that come less than `BUNCHED` after the start are bunched with it (released together
        // by a late timer, interrupt coalescing, GRO) and are folded into the sample, which then
        // reads the rate from the first ACK of one bunch to the first ACK of a later one
        if let Some(st) = self.start {
            let from = from_prev.unwrap_or(x.upto);
            if from >= x.upto {
                // it covered no segment (a bare FIN's ACK, or one into the middle of a
                // segment): its spacing is not the bottleneck's, so the pair stays open for
                // the next ACK that covers data. Closed here, a bunch's bytes read over the
                // round trip of the close gave 0.3-7 Mbit/s for 34-157 Mbit/s (the TCG guest's
                // replays, where a short response's ACKs all come in one bunch).
                self.adv = Some(here);
                self.follow_train(cfg, x, from_prev);
                return;
            }
            let acc = self.acc.get_or_insert(Pending {
                wire: 0,
                clean: st.pure && st.seg_t.is_some(),
                same_burst: st.seg_burst.is_some(),
                last_t: None,
            });
            acc.clean &= x.pure;
            for s in x.segs.range(from..x.upto.max(from)) {
                acc.wire += s.wire as u64;
                acc.clean &= !s.retx;
                acc.same_burst &= Some(s.burst) == st.seg_burst;
                acc.last_t = Some(acc.last_t.map_or(s.t, |lt: Timestamp| lt.max(s.t)));
            }
            let gap = t.nanos_since(st.t);
            let bunched = gap < BUNCHED;
            if bunched && acc.clean && acc.same_burst {
                // still inside the start's bunch: keep reading
                self.adv = Some(here);
                self.follow_train(cfg, x, from_prev);
                return;
            }
            let acc = self.acc.take().expect("set above");
            if !bunched && acc.wire > 0 {
                let bps = acc.wire as f64 * 8.0 / (gap as f64 / 1e9);
                let send_gap = match (st.seg_t, acc.last_t) {
                    (Some(p), Some(l)) => l.nanos_since(p),
                    _ => i64::MAX,
                };
                // a lone segment at the end of a flight may have waited for the
                // receiver's delayed-ACK timer: its ACK's spacing says nothing
                let lone_tail = x.newly == 1 && x.ack >= x.hi;
                let valid =
                    acc.clean && acc.same_burst && !lone_tail && send_gap.saturating_mul(2) < gap;
                if valid {
                    let delay_sum = match (st.seg_t, x.exact) {
                        (Some(p), Some((et, _))) => st.t.nanos_since(p) + t.nanos_since(et),
                        _ => i64::MAX,
                    };
                    if self.pairs.len() < cfg.max_samples {
                        self.pairs.push(BwPair {
                            t,
                            bps,
                            wire: acc.wire,
                            gap,
                            delay_sum,
                        });
                    } else {
                        self.samples_dropped += 1;
                    }
                }
            }
        }
        self.follow_train(cfg, x, from_prev);
        self.adv = Some(here);
        self.start = Some(here);
    }

    /// Per-ACK step of the train: extends it with this ACK, or closes it and starts the next.
    /// `from_prev`: the first segment past the previous advancing ACK, if there was one.
    fn follow_train(&mut self, cfg: &Config, x: &Advance, from_prev: Option<usize>) {
        let from = from_prev.unwrap_or(x.upto);
        // a lone segment at the end of its burst may have waited for the delayed-ACK timer
        let lone_tail = x.newly == 1
            && (x.ack >= x.hi
                || x.segs
                    .get(x.upto)
                    .is_none_or(|n| Some(n.burst) != x.exact.map(|e| e.1)));
        let extends = match &self.train {
            Some(tr) => {
                x.pure
                    && !lone_tail
                    && from < x.upto
                    && x.segs
                        .range(from..x.upto.max(from))
                        .all(|s| !s.retx && s.burst == tr.burst)
            }
            None => false,
        };
        if extends {
            let tr = self.train.as_mut().expect("checked");
            if tr.head {
                tr.head = false;
                tr.t0 = x.t;
                tr.t_last = x.t;
                return;
            }
            for s in x.segs.range(from..x.upto.max(from)) {
                tr.wire += s.wire as u64;
                tr.segs += 1;
                tr.send_first = Some(tr.send_first.map_or(s.t, |f| f.min(s.t)));
                tr.send_last = Some(tr.send_last.map_or(s.t, |l| l.max(s.t)));
            }
            tr.max_gap = tr.max_gap.max(x.t.nanos_since(tr.t_last));
            tr.t_last = x.t;
            let span = x.t.nanos_since(tr.t0);
            let sent_in = match (tr.send_first, tr.send_last) {
                (Some(f), Some(l)) => l.nanos_since(f),
                _ => i64::MAX,
            };
            if span >= MIN_TRAIN_SPAN
                && tr.segs >= MIN_TRAIN_SEGS
                && sent_in.saturating_mul(2) < span
                && tr.max_gap.saturating_mul(2) <= span
            {
                tr.best = Some((x.t, tr.wire, span));
            }
            return;
        }
        self.close_train(cfg);
        // a train starts at a pure ACK that ends exactly at a segment of a burst
        self.train = match x.exact {
            Some((_, burst)) if x.pure && !lone_tail => Some(Train {
                burst,
                t0: x.t,
                send_first: None,
                send_last: None,
                wire: 0,
                segs: 0,
                head: true,
                t_last: x.t,
                max_gap: 0,
                best: None,
            }),
            _ => None,
        };
    }

    fn close_train(&mut self, cfg: &Config) {
        if let Some(sample) = self.train.take().and_then(|tr| tr.sample()) {
            if self.trains.len() < cfg.max_samples {
                self.trains.push(sample);
            } else {
                self.samples_dropped += 1;
            }
        }
    }

    /// Finish step: the estimate (IP-layer bits/s), where it came from, and the samples behind
    /// it (pairs, then trains).
    pub fn finish(&self, cfg: &Config) -> (Option<f64>, BwSource, Vec<BwSample>) {
        let as_pairs = |v: &[BwPair]| -> Vec<Pair> {
            v.iter()
                .map(|b| Pair {
                    bps: b.bps,
                    delay_sum_ns: b.delay_sum,
                })
                .collect()
        };
        // the train still open counts as closed here
        let mut trains = self.trains.clone();
        if trains.len() < cfg.max_samples {
            trains.extend(self.train.and_then(|tr| tr.sample()));
        }
        let (train_bw, train_used) =
            bandwidth::combine(crate::config::BwMethod::Median, &as_pairs(&trains));
        let (pair_bw, pair_used) = bandwidth::combine(cfg.bw_method, &as_pairs(&self.pairs));
        // where the ACKs' timing is coarse (half of them on a 1 ms grid) or compressed (a
        // quarter of them bunched), the pairs' spacings cannot be trusted; elsewhere a pair is
        // the finer instrument (a shaper's token bucket lets a train's first packets through
        // at once, which a train's span takes in)
        let coarse = self.acks > 0
            && (self.acks_on_grid * 2 >= self.acks || self.acks_bunched * 4 >= self.acks);
        // trains that agree among themselves ([`trains_agree`]) but not with the pairs (more
        // than 15% apart): the pairs' spacings were blurred by something the two rules above
        // do not see, such as a shaper's tick that is not the tap's millisecond (one train
        // alone counts where it spans four times a train's least span)
        let trains_outvote = match (train_bw, pair_bw) {
            (Some(t), Some(p)) if (t / p - 1.0).abs() > 0.15 => match trains.as_slice() {
                [one] => one.gap >= 4 * MIN_TRAIN_SPAN,
                [] => false,
                many => trains_agree(&many.iter().map(|x| x.bps).collect::<Vec<_>>()),
            },
            _ => false,
        };
        let (bw, source) = match (train_bw, pair_bw) {
            (Some(b), _) if coarse || trains_outvote => (Some(b), BwSource::Trains),
            (_, Some(b)) => (Some(b), BwSource::Pairs),
            (Some(b), None) => (Some(b), BwSource::Trains),
            (None, None) => (None, BwSource::None),
        };
        let (pair_used, train_used) = match source {
            BwSource::Trains => (vec![false; self.pairs.len()], train_used),
            _ => (pair_used, vec![false; trains.len()]),
        };
        let sample = |kind: BwKind| {
            move |(b, used): (&BwPair, bool)| BwSample {
                t: b.t,
                bps: b.bps,
                bytes: b.wire,
                gap_us: dur::ns_to_us(b.gap),
                used,
                kind,
            }
        };
        let samples = self
            .pairs
            .iter()
            .zip(pair_used)
            .map(sample(BwKind::Pair))
            .chain(trains.iter().zip(train_used).map(sample(BwKind::Train)))
            .collect();
        (bw, source, samples)
    }
}

/// Whether trains of these rates agree among themselves: more than half of them, and at least
/// two, within 30% of each other. One stray train (a tick's release caught at a train's edge)
/// does not veto the rest.
fn trains_agree(bps: &[f64]) -> bool {
    let mut v = bps.to_vec();
    v.sort_unstable_by(f64::total_cmp);
    let (mut lo, mut best) = (0, 0);
    for hi in 0..v.len() {
        while v[hi] > v[lo] * 1.3 {
            lo += 1;
        }
        best = best.max(hi + 1 - lo);
    }
    best >= 2 && best * 2 > v.len()
}

#[cfg(test)]
mod tests {
    use super::trains_agree;

    #[test]
    fn trains_agree_by_a_majority_within_30_percent() {
        // a 4 Mbit/s DSL connection of the coarse-tick guest capture: four trains at 3.3-3.7
        // Mbit/s and one of 16 ms at 5.1 that caught a tick's release; with all five required
        // to agree, the pairs' 2.69 Mbit/s was replayed and the response ran 53% long
        assert!(trains_agree(&[3.28e6, 3.67e6, 3.72e6, 3.73e6, 5.09e6]));
        assert!(
            !trains_agree(&[3.28e6, 5.09e6]),
            "two must agree with each other"
        );
        assert!(trains_agree(&[3.28e6, 3.73e6]));
        // half is not more than half
        assert!(!trains_agree(&[3.0e6, 3.1e6, 6.0e6, 6.1e6]));
        assert!(!trains_agree(&[1e6, 2e6, 4e6, 8e6, 16e6]));
        assert!(!trains_agree(&[3e6]), "one train is not agreement");
        assert!(!trains_agree(&[]));
    }
}
