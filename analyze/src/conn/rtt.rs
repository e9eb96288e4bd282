//! Round-trip time: the handshake's two halves and Karn-valid data→ACK samples per direction.
//!
//! The round trip at the tap is the tap→client→tap part plus the tap→server→tap part. The
//! first shows from the SYN-ACK to the client's ACK and from server data to the client's ACKs;
//! the second from the SYN to the SYN-ACK and from client data to the server's ACKs. The
//! minimum of each part, added, is the path's minimum RTT wherever the tap sits (in front of
//! the server the second part is the server's own turnaround). Karn: a retransmitted SYN or
//! SYN-ACK makes its part of the handshake ambiguous, and a sample is taken only from an ACK
//! that covers no retransmitted segment.

use mimic_core::time::dur;
use mimic_core::Timestamp;

use super::{push_sized, SynInfo};
use crate::config::Config;
use crate::record::{RttKind, RttSample};

/// Send→ACK samples of one direction's data: the first ones (kept as rows), the minimum, the
/// maximum of the followed ones and the count.
#[derive(Clone, Debug, Default)]
pub(super) struct RttSide {
    rows: Vec<(Timestamp, i64)>,
    min: Option<(Timestamp, i64)>,
    /// The largest sample of a segment that had more data sent after it (so the receiver
    /// acknowledged it on the next segment's arrival, not on its delayed-ACK timer): the
    /// deepest queue the bottleneck showed.
    max: Option<(Timestamp, i64)>,
    count: u32,
}

impl RttSide {
    /// Per-ACK hook: a Karn-valid sample `r` (ns) taken by the ACK at `t`; `followed`: the
    /// sampled segment had more data sent after it.
    #[inline]
    pub fn on_sample(&mut self, cfg: &Config, t: Timestamp, r: i64, followed: bool) {
        self.count += 1;
        if self.min.is_none_or(|(_, m)| r < m) {
            self.min = Some((t, r));
        }
        if followed && self.max.is_none_or(|(_, m)| r > m) {
            self.max = Some((t, r));
        }
        if self.rows.len() < cfg.rtt_rows {
            push_sized(&mut self.rows, (t, r), cfg.rtt_rows.min(16));
        }
    }
}

/// The connection's running minimum RTT (handshake, else data samples), for the thresholds of
/// the other estimators (burst gaps, the spurious-retransmission windows).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct RttHint(Option<i64>);

impl RttHint {
    #[inline]
    pub fn get(self) -> Option<i64> {
        self.0
    }

    #[inline]
    pub fn note(&mut self, ns: i64) {
        if ns > 0 {
            self.0 = Some(self.0.map_or(ns, |m| m.min(ns)));
        }
    }
}

/// What the RTT estimator contributes to the record.
pub(super) struct RttEstimate {
    pub hs_rtt: Option<i64>,
    pub min_rtt: Option<i64>,
    /// The tap→client→tap part of the minimum RTT (the handshake's, or a data sample's where
    /// that was shorter).
    pub down_part: Option<i64>,
    pub samples: Vec<RttSample>,
    pub count: u32,
}

/// Finish step. `handshake`: both SYNs seen with the client's SYN first; `hs_ack`: when the
/// client's ACK of the SYN-ACK was seen; `c`/`sv`: the client's and the server's SYNs and
/// data samples.
pub(super) fn finish(
    handshake: bool,
    hs_ack: Option<Timestamp>,
    (c_syn, c): (&SynInfo, &RttSide),
    (sv_syn, sv): (&SynInfo, &RttSide),
) -> RttEstimate {
    let hs_down = (handshake && sv_syn.count == 1)
        .then_some(hs_ack)
        .flatten()
        .map(|t| t.nanos_since(sv_syn.t_last))
        .filter(|r| *r >= 0);
    let hs_up = (handshake && c_syn.count == 1)
        .then(|| sv_syn.t_first.nanos_since(c_syn.t_first))
        .filter(|r| *r >= 0);
    let hs_rtt = hs_down.zip(hs_up).map(|(d, u)| d + u);
    // rows: the handshake, then each direction's first samples, its minimum and maximum
    let mut samples: Vec<RttSample> = Vec::with_capacity(3 + sv.rows.len() + c.rows.len());
    if let (Some(r), Some(t)) = (hs_rtt, hs_ack) {
        samples.push(RttSample {
            t,
            rtt_us: dur::ns_to_us(r),
            kind: RttKind::Handshake,
        });
    }
    for (side, kind) in [(sv, RttKind::Data), (c, RttKind::Upstream)] {
        samples.extend(side.rows.iter().map(|(t, r)| RttSample {
            t: *t,
            rtt_us: dur::ns_to_us(*r),
            kind,
        }));
        let max = side.max.filter(|m| side.min != Some(*m));
        for (t, r) in side.min.into_iter().chain(max) {
            if !side.rows.contains(&(t, r)) {
                samples.push(RttSample {
                    t,
                    rtt_us: dur::ns_to_us(r),
                    kind,
                });
            }
        }
    }
    let down_part = hs_down
        .into_iter()
        .chain(sv.min.map(|x| x.1))
        .filter(|r| *r >= 0)
        .min();
    let up_part = hs_up
        .into_iter()
        .chain(c.min.map(|x| x.1))
        .filter(|r| *r >= 0)
        .min();
    let min_rtt = match (down_part, up_part) {
        (Some(d), Some(u)) => Some(d + u),
        (Some(d), None) => Some(d),
        _ => None,
    }
    .filter(|r| *r > 0);
    RttEstimate {
        hs_rtt,
        min_rtt,
        down_part,
        samples,
        count: hs_rtt.is_some() as u32 + sv.count + c.count,
    }
}
