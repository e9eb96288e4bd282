//! Delayed-ACK policy and timer of the receiver of one direction's data.
//!
//! The policy is the ratio of ACKs that advanced to the data segments they acknowledged in slow
//! start (before the direction's first retransmission): `quick` at 0.75 and above. The timer shows on isolated
//! segments (nothing else unacknowledged when one was sent, nothing sent after it before its
//! ACK; the last segment of a flight does not count: it waited in the bottleneck queue behind
//! the others): their send→ACK delay less the minimum RTT, above 1 ms.

use mimic_core::time::dur;
use mimic_core::Timestamp;

use crate::record::DelackPolicy;

/// Isolated-segment delays remembered per direction.
const MAX_DELAYS: usize = 1024;

#[derive(Clone, Debug, Default)]
pub(super) struct Delack {
    ss_segs: u32,
    ss_acks: u32,
    /// Send→ACK delays of isolated segments (a round trip plus any delayed-ACK wait).
    delays: Vec<i64>,
}

impl Delack {
    /// Per-ACK hook for an ACK at `t` that advanced over `newly` segments; `isolated`: the send
    /// time of the one it covered if that was the only segment in flight with nothing sent
    /// after it; `any_retx`: it covered a retransmitted segment.
    #[inline]
    pub fn on_ack(
        &mut self,
        t: Timestamp,
        in_slow_start: bool,
        newly: u32,
        isolated: Option<Timestamp>,
        any_retx: bool,
    ) {
        // segments counted as they are acknowledged, not as they are sent: a tail-loss probe
        // before the first ACK would otherwise leave a quick-ACKing client with segments and
        // no ACKs, read as delayed ACKs
        if in_slow_start && newly > 0 {
            self.ss_acks += 1;
            self.ss_segs += newly;
        }
        if let Some(st) = isolated {
            if newly == 1 && !any_retx && self.delays.len() < MAX_DELAYS {
                self.delays.push(t.nanos_since(st));
            }
        }
    }

    /// Finish step: the policy, ACKs per segment, and the timer (µs) given the minimum RTT.
    pub fn finish(&self, min_rtt: Option<i64>) -> (DelackPolicy, Option<f64>, Option<i64>) {
        let (policy, aps) = if self.ss_segs >= 2 {
            let r = self.ss_acks as f64 / self.ss_segs as f64;
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
        let timeout = {
            let rtt = min_rtt.unwrap_or(0);
            let mut v: Vec<i64> = self
                .delays
                .iter()
                .map(|d| d - rtt)
                .filter(|x| *x > dur::MS)
                .collect();
            v.sort_unstable();
            (!v.is_empty() && policy != DelackPolicy::Quick).then(|| dur::ns_to_us(v[v.len() / 2]))
        };
        (policy, aps, timeout)
    }
}
