//! Retransmissions and loss of one direction's data.
//!
//! Spurious retransmissions are told by D-SACK where the receiver sends it, else by ACKs that
//! covered a resend too soon after it was sent and by Monkey's duplicate-ACK test (§3.2). Loss
//! is (retransmissions − spurious) / data segments; the random part of it is what the
//! bottleneck queue does not explain. The queue's length is inferred from the same model: the
//! deepest a delivered packet found it, bounded from above too where an original was lost there
//! ([`QueueFit`]).

use std::collections::VecDeque;

use mimic_core::Timestamp;

use super::Send;

/// Retransmissions remembered per direction (for spurious and congestion tests).
const MAX_RETX: usize = 4096;

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

/// A resend as the data path saw it: its range and time, what it replaces, and whether the
/// receiver had already acknowledged all of it.
pub(super) struct Resend {
    pub start: i64,
    pub end: i64,
    pub t: Timestamp,
    pub orig_flight: u32,
    pub orig_log: u32,
    pub already_acked: bool,
}

#[derive(Clone, Debug, Default)]
pub(super) struct Loss {
    /// Data segments that repeated bytes sent before.
    pub retx_pkts: u64,
    retx: VecDeque<Retx>,
    dupacks: u64,
    dsack_seen: bool,
    spurious_dsack: u64,
    spurious_heur: u64,
}

/// What the loss estimator contributes to the record.
pub(super) struct LossEstimate {
    pub spurious: u64,
    pub spurious_by: Option<&'static str>,
    pub loss: Option<f64>,
}

impl Loss {
    /// Per-segment hook: data sent at `t` (new or resent). The resends before it learn when
    /// data was next sent after them (each once: those that know it already are older than
    /// the rest).
    #[inline]
    pub fn on_data(&mut self, t: Timestamp) {
        for rx in self.retx.iter_mut().rev() {
            if rx.next_send.is_some() {
                break;
            }
            rx.next_send = Some(t);
        }
    }

    /// Per-segment hook: a retransmission.
    pub fn on_resend(&mut self, r: Resend) {
        self.retx_pkts += 1;
        if self.retx.len() >= MAX_RETX {
            self.retx.pop_front();
        }
        if r.already_acked {
            self.spurious_heur += 1;
        }
        self.retx.push_back(Retx {
            start: r.start,
            end: r.end,
            t: r.t,
            spurious: r.already_acked,
            decided: r.already_acked,
            orig_flight: r.orig_flight,
            orig_log: r.orig_log,
            covered: false,
            next_send: None,
        });
    }

    /// Per-ACK hook: a D-SACK block `[l, r)` (relative) reported this data as received twice.
    pub fn on_dsack(&mut self, l: i64, r: i64) {
        self.dsack_seen = true;
        if let Some(rx) = self
            .retx
            .iter_mut()
            .find(|x| !x.spurious && x.start < r && l < x.end)
        {
            rx.spurious = true;
            rx.decided = true;
            self.spurious_dsack += 1;
        }
    }

    /// Per-ACK hook: the cumulative ACK advanced to `a` at `t`. An ACK covering a resend too
    /// soon after it was sent was caused by the original (the resend was spurious).
    pub fn on_advance(&mut self, t: Timestamp, a: i64, rtt_hint: Option<i64>) {
        for rx in self.retx.iter_mut().filter(|x| !x.decided) {
            if !rx.covered && rx.end <= a {
                let soon = rtt_hint.is_some_and(|r| t.nanos_since(rx.t) < r * 3 / 4);
                if soon {
                    rx.spurious = true;
                    self.spurious_heur += 1;
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
    }

    /// Per-ACK hook: a duplicate ACK at `t` (`outstanding`: data beyond it was in flight).
    /// Monkey's heuristic: a duplicate ACK answering a retransmission of data the receiver
    /// already holds means the retransmission was spurious (with nothing outstanding any more,
    /// the answer repeats the cumulative ACK all the same).
    pub fn on_dupack(&mut self, t: Timestamp, outstanding: bool, rtt_hint: Option<i64>) {
        if outstanding {
            self.dupacks += 1;
        }
        for rx in self.retx.iter_mut().filter(|x| !x.decided) {
            let answered = rtt_hint.is_none_or(|r| t.nanos_since(rx.t) >= r * 3 / 4);
            if !answered {
                continue;
            }
            if rx.covered && !dupack_window_closed(rx, t, rtt_hint) {
                // the receiver already held this data when the resend reached it
                rx.spurious = true;
                self.spurious_heur += 1;
            }
            rx.decided = true;
        }
    }

    /// Finish step: spurious resends (D-SACK where the receiver uses it, else the heuristics)
    /// and the loss rate over `data_pkts` data segments.
    pub fn finish(&self, data_pkts: u64) -> LossEstimate {
        let (spurious, spurious_by) = if self.dsack_seen {
            (self.spurious_dsack, Some("dsack"))
        } else if self.retx_pkts > 0 {
            (self.spurious_heur.min(self.retx_pkts), Some("dupack"))
        } else {
            (0, None)
        };
        let loss = (data_pkts > 0)
            .then(|| (self.retx_pkts.saturating_sub(spurious)) as f64 / data_pkts as f64);
        LossEstimate {
            spurious,
            spurious_by,
            loss,
        }
    }

    /// The direction's transmissions fed through the bottleneck's queue model at `bw` (one
    /// [`Arrival`] per logged transmission, [`queue_arrivals`]); empty without a usable rate.
    /// Computed once per direction: the loss split ([`Self::random_loss`]) and the shaper's
    /// lead (`shaper::Shaper::finish`) read the same model.
    pub fn arrivals(&self, sends: &[Send], bw: Option<f64>) -> Vec<Arrival> {
        match bw {
            Some(bw) if bw.is_finite() && bw > 0.0 => {
                queue_arrivals(sends, &lost_originals(sends.len(), &self.retx), bw)
            }
            _ => Vec::new(),
        }
    }

    /// Finish step, after the bandwidth: the losses the bottleneck queue does not explain, and
    /// the queue itself. A replay's emulated queue drops the others by itself, so only the rest
    /// is replayed as random loss. The direction's transmissions, as seen at the tap in front of
    /// the bottleneck, are fed through a drop-tail queue of the inferred rate with no limit:
    /// every packet that got through joined it, every lost original did not (`arrivals`, from
    /// [`Self::arrivals`]).
    /// The deepest a delivered packet found it is the queue's length as far as this connection
    /// shows it ([`QueueFit`]); a lost original that found the queue that deep (within
    /// [`QUEUE_SLACK`]) met a full queue and is congestive, one that found it shallower was lost
    /// at random. Originals beyond the send log fall back to a flight-size test (more in flight
    /// than the path holds plus its queue).
    pub fn random_loss(
        &self,
        est: &LossEstimate,
        arrivals: &[Arrival],
        data_pkts: u64,
        bw: Option<f64>,
        min_rtt: Option<i64>,
        mss: u32,
    ) -> (Option<f64>, Option<QueueFit>) {
        let Some(all) = est.loss else {
            return (None, None);
        };
        let (Some(bw), Some(rtt)) = (bw, min_rtt) else {
            return (Some(all), None);
        };
        if data_pkts == 0 || !(bw.is_finite() && bw > 0.0) {
            return (Some(all), None);
        }
        let deepest = arrivals
            .iter()
            .filter(|a| !a.lost)
            .map(|a| a.ahead + 1)
            .max()
            .unwrap_or(0);
        let overflow_at = deepest.saturating_sub(QUEUE_SLACK).max(MIN_QUEUE);
        let (_, class_q) = mimic_core::model::queue_packets(Some(bw));
        let mss = mss.max(536) as f64;
        let capacity = bw / 8.0 * rtt as f64 / 1e9 + deepest.max(class_q) as f64 * mss;
        let tracked = self.retx.iter().filter(|r| !r.spurious).count() as u64;
        let mut overflowed = false;
        let congestive = self
            .retx
            .iter()
            .filter(|r| {
                !r.spurious
                    && match arrivals.get(r.orig_log as usize) {
                        Some(a) => {
                            let full = a.ahead >= overflow_at;
                            overflowed |= full;
                            full
                        }
                        None => r.orig_flight as f64 > capacity,
                    }
            })
            .count() as u64;
        let untracked = self
            .retx_pkts
            .saturating_sub(est.spurious)
            .saturating_sub(tracked);
        let random = (tracked - congestive + untracked) as f64 / data_pkts as f64;
        let fit = (deepest > 0).then_some(QueueFit {
            packets: deepest,
            overflowed,
        });
        (Some(random), fit)
    }
}

/// The bottleneck queue of one direction as its transmissions show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueFit {
    /// Packets the queue held (the one being sent included) when the deepest delivered packet
    /// had joined it: the queue holds at least that many.
    pub packets: u32,
    /// An original was lost to the queue at that depth (an overflow): it holds no more either,
    /// so `packets` is its length, not only a lower bound.
    pub overflowed: bool,
}

/// No queue holds fewer packets than this: a loss with fewer ahead of it is random.
const MIN_QUEUE: u32 = 2;

/// How much shallower than the deepest delivered packet a lost original may find the model's
/// queue and still count as meeting a full one: one packet, for the estimated rate's error and
/// a packet that left between the drop and the arrival before it. No more: a random loss near
/// the top of a slow-start burst finds the queue about as deep as the packets after it, and a
/// slack of 1 + depth/10 called a third of the own lab's random losses congestive (41 inferred
/// against 57.7 configured).
const QUEUE_SLACK: u32 = 1;

/// Which logged transmissions are originals that were lost (repeated by a retransmission that
/// was not spurious).
fn lost_originals(n: usize, retx: &VecDeque<Retx>) -> Vec<bool> {
    let mut lost = vec![false; n];
    for r in retx.iter().filter(|r| !r.spurious) {
        if let Some(l) = lost.get_mut(r.orig_log as usize) {
            *l = true;
        }
    }
    lost
}

/// One logged transmission's arrival at the bottleneck's queue model ([`queue_arrivals`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Arrival {
    /// Packets in the queue when it arrived (the one being sent included).
    pub ahead: u32,
    /// How long (ns) it waited for the serializer to be free.
    pub wait_ns: f64,
    /// A lost original: it never joined the queue.
    pub lost: bool,
}

/// Feeds a direction's transmissions through a drop-tail queue with no limit in front of a
/// `bw_bps` serializer (netemu's pipe model, rate on IP bytes) and says, per logged
/// transmission, how many packets were in it (the one being sent included) when it arrived and
/// how long it waited. Lost originals (`lost`, from [`lost_originals`]) do not join it; every
/// other packet does, because it got through. With no limit the model's depth does not depend
/// on a guessed queue length (a model capped at the rate class's length let the packets a
/// deeper real queue held leave early, and the drops that followed looked random).
pub(super) fn queue_arrivals(sends: &[Send], lost: &[bool], bw_bps: f64) -> Vec<Arrival> {
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
            let arrival = Arrival {
                ahead: backlog.len() as u32,
                wait_ns: (busy_until - now).max(0.0),
                lost: *lost,
            };
            if !lost {
                let end = busy_until.max(now) + s.wire as f64 * ns_per_byte;
                busy_until = end;
                backlog.push_back(end);
            }
            arrival
        })
        .collect()
}
