//! What kind of shaper the downstream bottleneck is: a token bucket (tc htb/tbf, dummynet with
//! a burst, a cable modem) or a store-and-forward link that serializes every packet.
//!
//! The two send a busy period's packets at the same rate, but a token bucket lets each packet
//! leave at the start of its transmission slot (the tokens it takes are paid back while the
//! next one waits), where a serializing link delivers it at the end: one serialization time of
//! that packet later. The tap in front of the bottleneck sees the difference in the data→ACK
//! round trips of packets that met a short queue, measured against the handshake's: through a
//! serializing link such a packet's round trip is the handshake's plus its wait behind the
//! packets ahead plus its own serialization (less the SYN-ACK's, which the handshake's round
//! trip holds); through a bucket, the handshake's plus the wait only. Propagation delay adds
//! the same to both, so this works where the handshake alone cannot tell them apart (a minimum
//! RTT shorter than the SYN-ACK's serialization is evidence only on a path with no delay).
//!
//! Per sample the *lead* is how much earlier than a serializing link would have delivered it
//! the ACK came, in units of the packet's own serialization time at the estimated rate: about
//! 0 through a serializing link, about 1 through a token bucket. A sample counts only where
//! the serialization is long enough to measure (`MIN_SERIALIZATION`), the packet met at most
//! one packet ahead of it in the model's queue (a longer wait would carry the rate estimate's
//! error into the lead), and the segment was never retransmitted (Karn). The connection's lead
//! is the median of its samples: an ACK the client's delayed-ACK timer held, or a queue
//! elsewhere on the path, makes a sample's lead smaller, never larger, and the median of
//! several ignores the odd one.
//!
//! A bucket deeper than one packet (htb's burst of one timer tick at the rate on a kernel
//! with a coarse tick, a cable modem's burst) lets the first `b` packets of a busy period
//! leave at once, and every later packet of it `b` serializations before a serializing link
//! would deliver it: the packet with `k` packets ahead in the model's queue leads by
//! `min(k + 1, b)`. Where the short-queue samples say "token bucket", the samples that met 2
//! to [`DEEP_AHEAD_MAX`] packets ahead measure `b` (their median, where there are at least
//! [`MIN_DEEP_SAMPLES`] and it is above the short-queue lead); a replay gives the pipe a
//! bucket of that many full-size packets. Deep samples leading by [`DEEP_ALONE_LEAD`] or
//! more say token bucket on their own. A rate estimate low by a tenth overstates a deep
//! sample's lead by a tenth of its `k + 1`, which is why the deep samples stop at a few
//! packets ahead.

use mimic_core::model::{MAX_BUCKET_PACKETS, TOKEN_BUCKET_LEAD};
use mimic_core::stats::median;
use mimic_core::time::dur;

use super::loss::Arrival;
use super::{Send, NO_LOG};

/// Samples kept per connection (the first ones that may qualify).
const MAX_LEAD_SAMPLES: usize = 128;
/// The most packets ahead in the model's queue a sample may have met to measure a bucket's
/// depth (7: a deep sample leads by at most `DEEP_AHEAD_MAX + 1`, the deepest bucket).
const DEEP_AHEAD_MAX: u32 = MAX_BUCKET_PACKETS - 1;
/// Deep samples needed before their median is read as the bucket's depth.
const MIN_DEEP_SAMPLES: usize = 4;
/// The deep samples' lead that says token bucket on its own, whatever the short-queue
/// samples say: a serializing link's deep samples lead by 0, by about 0.5 where the rate
/// estimate is a tenth low.
const DEEP_ALONE_LEAD: f64 = 1.5;
/// The largest lead reported: a deep sample leads by at most `DEEP_AHEAD_MAX + 1`.
pub(super) const MAX_LEAD: f64 = MAX_BUCKET_PACKETS as f64;
/// A packet whose serialization at the estimated rate is shorter than this says nothing (a
/// millisecond of jitter at the tap or on the path would be most of it).
const MIN_SERIALIZATION: i64 = 2 * dur::MS;
/// IP bytes of the SYN-ACK the handshake's round trip serialized on a store-and-forward link.
const SYNACK_WIRE: f64 = 60.0;

/// One data→ACK sample that may qualify: the round trip (ns) and the sampled segment's
/// transmission (index in `Side::sends`).
#[derive(Clone, Copy, Debug)]
struct LeadSample {
    rtt: i64,
    log: u32,
}

/// Per-direction state: the samples of segments sent with little in flight ahead of them.
#[derive(Clone, Debug, Default)]
pub(super) struct Shaper {
    samples: Vec<LeadSample>,
}

impl Shaper {
    /// Per-sample hook: a Karn-valid round trip `rtt` (ns) of the segment sent as transmission
    /// `log`, `len` payload bytes, with `flight` bytes in flight when it was sent (itself
    /// included). Only a segment with at most [`DEEP_AHEAD_MAX`] full-size packets' worth
    /// ahead of it in flight can have met a queue that short, so only those are kept.
    #[inline]
    pub fn on_sample(&mut self, rtt: i64, log: u32, len: i64, flight: u32) {
        if log != NO_LOG
            && self.samples.len() < MAX_LEAD_SAMPLES
            && i64::from(flight) - len <= i64::from(DEEP_AHEAD_MAX) * 1500
        {
            self.samples.push(LeadSample { rtt, log });
        }
    }

    /// Finish step, after the bandwidth: the connection's lead and how many samples it rests
    /// on (`None` with no short-queue sample): the median lead of the samples that met at most
    /// one packet ahead, or, where that says token bucket and enough samples met 2 to
    /// [`DEEP_AHEAD_MAX`] ahead, their median lead where it is larger (the bucket's depth in
    /// packets). `sends`: the direction's transmissions; `arrivals`: the same fed through the
    /// bottleneck's queue model at `bw_bps`, the estimated rate (`loss::Loss::arrivals`: how
    /// many packets each found ahead and how long it waited); `base`: the round trip of the
    /// handshake's part on this side of the tap (the SYN-ACK's to the client's ACK), or a data
    /// sample's where that was shorter.
    pub fn finish(
        &self,
        sends: &[Send],
        arrivals: &[Arrival],
        bw_bps: Option<f64>,
        base: Option<i64>,
    ) -> Option<(f64, u32)> {
        let (bw, base) = (bw_bps?, base?);
        if self.samples.is_empty() || !(bw.is_finite() && bw > 0.0) || base <= 0 {
            return None;
        }
        let ns_per_byte = 8e9 / bw;
        let mut short: Vec<f64> = Vec::with_capacity(self.samples.len());
        let mut deep: Vec<f64> = Vec::new();
        for w in &self.samples {
            let (Some(s), Some(a)) = (sends.get(w.log as usize), arrivals.get(w.log as usize))
            else {
                continue;
            };
            let ser = s.wire as f64 * ns_per_byte;
            if a.ahead > DEEP_AHEAD_MAX || ser < MIN_SERIALIZATION as f64 {
                continue;
            }
            // a serializing link: the handshake's round trip less the SYN-ACK's
            // serialization, plus the wait and this packet's own serialization
            let serial = base as f64 - SYNACK_WIRE * ns_per_byte + a.wait_ns + ser;
            let lead = (serial - w.rtt as f64) / ser;
            if a.ahead <= 1 {
                short.push(lead);
            } else {
                deep.push(lead);
            }
        }
        let lead = median(&mut short)?;
        if deep.len() >= MIN_DEEP_SAMPLES {
            let depth = median(&mut deep).unwrap_or(lead);
            // a bucket by the short-queue lead, or one so deep that the deep samples alone
            // say so (a release held to the next timer tick cuts the short-queue samples'
            // lead: from 1 to 0.33 on average at a 4 ms tick and 4 Mbit/s)
            if depth > lead && (lead >= TOKEN_BUCKET_LEAD || depth >= DEEP_ALONE_LEAD) {
                return Some((depth, (short.len() + deep.len()) as u32));
            }
        }
        Some((lead, short.len() as u32))
    }
}

#[cfg(test)]
mod tests {
    use super::super::loss::queue_arrivals;
    use super::*;
    use mimic_core::Timestamp;

    /// A logged transmission at `t` of `wire` IP bytes.
    fn send(t: Timestamp, wire: u32) -> Send {
        Send { t, wire }
    }

    /// [`Shaper::finish`] over `sends` fed through the queue model at `bw` (nothing lost).
    fn lead_of(
        sh: &Shaper,
        sends: &[Send],
        bw: Option<f64>,
        base: Option<i64>,
    ) -> Option<(f64, u32)> {
        let arrivals = bw
            .map(|bw| queue_arrivals(sends, &vec![false; sends.len()], bw))
            .unwrap_or_default();
        sh.finish(sends, &arrivals, bw, base)
    }

    const MS: i64 = dur::MS;

    fn at(ms: f64) -> Timestamp {
        Timestamp::from_nanos((ms * 1e6) as i64)
    }

    /// 56 kbit/s, 150 ms of propagation both ways together: a 1500-byte packet serializes in
    /// 214.3 ms, the SYN-ACK in 8.6 ms.
    const BW: f64 = 56e3;
    const PROP: f64 = 150.0;

    fn ser(bytes: f64) -> f64 {
        bytes * 8.0 / BW * 1e3
    }

    /// A handshake, a 300-byte response header and two full-size segments sent back to back at
    /// 10 ms, as a serializing link (`bucket` false) or a token bucket delivers them.
    fn flight(bucket: bool) -> (Vec<Send>, Shaper, i64) {
        let sends = vec![
            send(at(0.0), 60),
            send(at(10.0), 300),
            send(at(10.1), 1500),
            send(at(10.2), 1500),
        ];
        let hs = PROP + if bucket { 0.0 } else { ser(60.0) };
        // when each packet's delivery starts and ends at the bottleneck
        let mut busy = 10.0;
        let mut sh = Shaper::default();
        let mut flight_bytes = 0;
        for (i, wire) in [(1u32, 300.0), (2, 1500.0), (3, 1500.0)] {
            let start = busy;
            busy += ser(wire);
            let delivered = if bucket { start } else { busy };
            let ack = delivered + PROP;
            let rtt = ack - sends[i as usize].t.as_nanos() as f64 / 1e6;
            flight_bytes += wire as u32 - 52;
            sh.on_sample((rtt * 1e6) as i64, i, wire as i64 - 52, flight_bytes);
        }
        (sends, sh, (hs * 1e6) as i64)
    }

    #[test]
    fn a_serializing_link_leads_by_nothing_and_a_token_bucket_by_a_packet() {
        let (sends, sh, base) = flight(false);
        let (lead, n) = lead_of(&sh, &sends, Some(BW), Some(base)).expect("samples");
        // the header and the first body segment met at most one packet ahead; the second
        // body segment met two and does not count
        assert_eq!(n, 2);
        assert!(lead.abs() < 0.1, "serializing link: lead {lead}");
        assert!(lead < TOKEN_BUCKET_LEAD);

        let (sends, sh, base) = flight(true);
        let (lead, n) = lead_of(&sh, &sends, Some(BW), Some(base)).expect("samples");
        assert_eq!(n, 2);
        // 1 less the SYN-ACK's share of the header's serialization
        assert!(lead > 0.75 && lead < 1.0, "token bucket: lead {lead}");
        assert!(lead >= TOKEN_BUCKET_LEAD);
    }

    #[test]
    fn a_rate_estimate_off_by_a_tenth_does_not_turn_a_link_into_a_bucket() {
        for bw in [BW * 0.9, BW * 1.1] {
            let (sends, sh, base) = flight(false);
            let (lead, _) = lead_of(&sh, &sends, Some(bw), Some(base)).expect("samples");
            assert!(lead < TOKEN_BUCKET_LEAD, "bw {bw}: lead {lead}");
            let (sends, sh, base) = flight(true);
            let (lead, _) = lead_of(&sh, &sends, Some(bw), Some(base)).expect("samples");
            assert!(lead >= TOKEN_BUCKET_LEAD, "bw {bw}: lead {lead}");
        }
    }

    #[test]
    fn a_delayed_ack_makes_a_sample_lead_less_and_the_median_ignores_one() {
        // three lone full-size segments into an idle token bucket, one ACK held 40 ms
        let mut sends = vec![send(at(0.0), 60)];
        let mut sh = Shaper::default();
        for (k, held) in [0.0, 40.0, 0.0].into_iter().enumerate() {
            let t = 1000.0 * (k as f64 + 1.0);
            sends.push(send(at(t), 1500));
            sh.on_sample(((PROP + held) * 1e6) as i64, k as u32 + 1, 1448, 1448);
        }
        let (lead, n) = lead_of(&sh, &sends, Some(BW), Some((PROP * 1e6) as i64)).expect("samples");
        assert_eq!(n, 3);
        assert!(lead > 0.9, "lead {lead}");
    }

    #[test]
    fn nothing_to_go_on_says_nothing() {
        let (sends, sh, base) = flight(true);
        assert_eq!(lead_of(&sh, &sends, None, Some(base)), None);
        assert_eq!(lead_of(&sh, &sends, Some(BW), None), None);
        assert_eq!(lead_of(&sh, &[], Some(BW), Some(base)), None);
        // at 50 Mbit/s a full packet serializes in 240 µs: too short to measure
        assert_eq!(lead_of(&sh, &sends, Some(50e6), Some(base)), None);
        // a segment sent behind more than DEEP_AHEAD_MAX packets in flight is never kept
        let mut sh = Shaper::default();
        sh.on_sample(200 * MS, 1, 1448, 9 * 1448);
        assert_eq!(lead_of(&sh, &sends, Some(BW), Some(base)), None);
        // nor one beyond the send log
        sh.on_sample(200 * MS, NO_LOG, 1448, 1448);
        assert!(sh.samples.is_empty());
    }

    /// `n` full-size segments sent back to back 10 ms after the handshake into an idle
    /// bottleneck at [`BW`] that is a token bucket of `depth` full-size packets (0: a
    /// serializing link), each ACKed at once.
    fn busy_period(depth: f64, n: usize) -> (Vec<Send>, Shaper, i64) {
        let mut sends = vec![send(at(0.0), 60)];
        let mut sh = Shaper::default();
        let full = ser(1500.0);
        for j in 0..n {
            let t = 10.0 + 0.01 * j as f64;
            sends.push(send(at(t), 1500));
            let delivered = 10.0 + (j as f64 + 1.0 - depth).max(0.0) * full;
            let rtt = delivered + PROP - t;
            sh.on_sample(
                (rtt * 1e6) as i64,
                j as u32 + 1,
                1448,
                (j as u32 + 1) * 1448,
            );
        }
        let hs = PROP + if depth > 0.0 { 0.0 } else { ser(60.0) };
        (sends, sh, (hs * 1e6) as i64)
    }

    #[test]
    fn a_deeper_bucket_leads_by_its_depth_in_packets() {
        for (depth, lo, hi) in [
            (0.0, -0.1, 0.1),
            (1.0, 0.9, 1.1),
            (2.5, 2.3, 2.7),
            (4.0, 3.8, 4.2),
        ] {
            let (sends, sh, base) = busy_period(depth, 10);
            let (lead, n) = lead_of(&sh, &sends, Some(BW), Some(base)).expect("samples");
            assert!(
                lead >= lo && lead <= hi,
                "depth {depth}: lead {lead} ({n} samples)"
            );
            assert_eq!(lead >= TOKEN_BUCKET_LEAD, depth > 0.0, "depth {depth}");
        }
        // too few samples beyond one packet ahead: the short-queue lead alone (min(k + 1, 4)
        // of the two samples with 0 and 1 ahead)
        let (sends, sh, base) = busy_period(4.0, 5);
        let (lead, n) = lead_of(&sh, &sends, Some(BW), Some(base)).expect("samples");
        assert_eq!(n, 2);
        assert!((lead - 1.5).abs() < 0.1, "lead {lead}");
    }

    #[test]
    fn deep_samples_say_bucket_alone_where_the_short_queue_ones_were_held() {
        // the two short-queue samples' ACKs came 1.2 serializations late (a release held to a
        // timer tick): their lead says serializing link (median 0.3), the deep samples 2.5
        let (sends, mut sh, base) = busy_period(2.5, 10);
        let late = (1.2 * ser(1500.0) * 1e6) as i64;
        for w in sh.samples.iter_mut().take(2) {
            w.rtt += late;
        }
        let (lead, n) = lead_of(&sh, &sends, Some(BW), Some(base)).expect("samples");
        assert_eq!(n, 8);
        assert!((lead - 2.46).abs() < 0.1, "lead {lead}");
        // deep samples leading by less than 1.5 do not overrule the short-queue ones
        let (sends, mut sh, base) = busy_period(1.2, 10);
        for w in sh.samples.iter_mut().take(2) {
            w.rtt += late;
        }
        let (lead, n) = lead_of(&sh, &sends, Some(BW), Some(base)).expect("samples");
        assert_eq!(n, 2);
        assert!(lead < TOKEN_BUCKET_LEAD, "lead {lead}");
    }

    #[test]
    fn a_rate_estimate_off_by_a_tenth_misreads_a_deep_bucket_by_less_than_a_packet() {
        for bw in [BW * 0.9, BW * 1.1] {
            let (sends, sh, base) = busy_period(4.0, 10);
            let (lead, _) = lead_of(&sh, &sends, Some(bw), Some(base)).expect("samples");
            assert!((lead - 4.0).abs() < 1.0, "bw {bw}: lead {lead}");
            // and a serializing link stays one
            let (sends, sh, base) = busy_period(0.0, 10);
            let (lead, _) = lead_of(&sh, &sends, Some(bw), Some(base)).expect("samples");
            assert!(lead < TOKEN_BUCKET_LEAD, "bw {bw}: lead {lead}");
        }
    }
}
