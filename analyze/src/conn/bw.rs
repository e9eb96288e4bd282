//! Bottleneck bandwidth of one direction, from the spacing of the receiver's ACKs.
//!
//! Packet pairs: two consecutive ACKs that advanced over this direction's data, only over
//! segments sent in one burst, none retransmitted, spaced wider than they were sent, and not a
//! lone delayed-ACK tail. The samples are combined by `--bw-method` (`crate::bandwidth`).

use std::collections::VecDeque;

use mimic_core::time::dur;
use mimic_core::Timestamp;

use super::Seg;
use crate::bandwidth::{self, Pair};
use crate::config::Config;
use crate::record::BwSample;

/// A packet pair that qualified as a bandwidth sample.
#[derive(Clone, Copy, Debug)]
struct BwPair {
    t: Timestamp,
    bps: f64,
    wire: u64,
    gap: i64,
    delay_sum: i64,
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

#[derive(Clone, Debug, Default)]
pub(super) struct Bandwidth {
    adv: Option<AdvAck>,
    pairs: Vec<BwPair>,
    pub samples_dropped: u64,
}

impl Bandwidth {
    /// Per-ACK hook: a packet pair on the spacing of this ACK and the previous advancing one.
    pub fn on_advance(&mut self, cfg: &Config, x: &Advance) {
        let t = x.t;
        if let Some(prev) = self.adv {
            let bytes = x.ack - prev.ack;
            let gap = t.nanos_since(prev.t);
            if bytes > 0 && gap > 0 && prev.seg_t.is_some() {
                let mut wire: u64 = 0;
                let mut same_burst = prev.seg_burst.is_some();
                let mut last_t = None;
                let mut clean = x.pure && prev.pure;
                let from = x.segs.partition_point(|s| s.end <= prev.ack);
                for s in x.segs.range(from..x.upto.max(from)) {
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
                    let lone_tail = x.newly == 1 && x.ack >= x.hi;
                    let valid =
                        clean && same_burst && !lone_tail && send_gap.saturating_mul(2) < gap;
                    if valid {
                        let delay_sum = match (prev.seg_t, x.exact) {
                            (Some(p), Some((et, _))) => prev.t.nanos_since(p) + t.nanos_since(et),
                            _ => i64::MAX,
                        };
                        if self.pairs.len() < cfg.max_samples {
                            self.pairs.push(BwPair {
                                t,
                                bps,
                                wire,
                                gap,
                                delay_sum,
                            });
                        } else {
                            self.samples_dropped += 1;
                        }
                    }
                }
            }
        }
        self.adv = Some(AdvAck {
            t,
            ack: x.ack,
            seg_t: x.exact.map(|e| e.0),
            seg_burst: x.exact.map(|e| e.1),
            pure: x.pure,
        });
    }

    /// Finish step: the estimate (IP-layer bits/s) and the samples behind it.
    pub fn finish(&self, cfg: &Config) -> (Option<f64>, Vec<BwSample>) {
        let pairs: Vec<Pair> = self
            .pairs
            .iter()
            .map(|b| Pair {
                bps: b.bps,
                delay_sum_ns: b.delay_sum,
            })
            .collect();
        let (bw, used) = bandwidth::combine(cfg.bw_method, &pairs);
        let samples = self
            .pairs
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
        (bw, samples)
    }
}
