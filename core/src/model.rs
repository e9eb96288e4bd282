//! Modelling choices shared by the analyzer and the replay, so both sides of a replay agree.

/// Packet queue lengths (upstream, downstream) of an emulated bottleneck, by its rate — Monkey
/// §3.3.1 after dummynet's advice: 5 each way below 56 kbit/s, 10 up and 30 down to
/// 6 Mbit/s, 40 above (and when the rate is unknown). A boundary is a common link rate, and
/// estimates of such a link scatter on both sides of it (56 kbit/s modems measured 55,997 to
/// 56,011 bit/s on the independent testbed, half of them getting 5-packet queues that dropped
/// what the real 20-packet one held): an estimate within [`CLASS_TOLERANCE`] of a boundary
/// counts as the boundary's own rate.
/// Relative estimation error within which a rate counts as a class boundary's rate.
pub const CLASS_TOLERANCE: f64 = 0.02;

/// The shaper lead (`connections.shaper_lead_down`, in full-size packets' serialization) at
/// and above which a downstream bottleneck is taken for a token bucket: halfway between a
/// serializing link's 0 and a one-packet bucket's 1. The analyzer measures a deeper bucket's
/// depth only past it (or past a deep lead of its own); replay gives a bucket only past it.
pub const TOKEN_BUCKET_LEAD: f64 = 0.5;

/// The deepest token bucket, in full-size packets, the analyzer reports (its deep samples met
/// at most one fewer ahead) and a replay gives.
pub const MAX_BUCKET_PACKETS: u32 = 8;

pub fn queue_packets(bw_bps: Option<f64>) -> (u32, u32) {
    match bw_bps {
        Some(b) if b < 56_000.0 * (1.0 - CLASS_TOLERANCE) => (5, 5),
        Some(b) if b <= 6_000_000.0 * (1.0 + CLASS_TOLERANCE) => (10, 30),
        _ => (40, 40),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert_eq!(queue_packets(Some(28e3)), (5, 5));
        assert_eq!(queue_packets(Some(54_000.0)), (5, 5));
        // a 56 kbit/s link measured a little under its rate is still a 56 kbit/s link
        assert_eq!(queue_packets(Some(55_997.0)), (10, 30));
        assert_eq!(queue_packets(Some(6_010_000.0)), (10, 30));
        assert_eq!(queue_packets(Some(6_200_000.0)), (40, 40));
        assert_eq!(queue_packets(Some(1e6)), (10, 30));
        assert_eq!(queue_packets(Some(6e6)), (10, 30));
        assert_eq!(queue_packets(Some(100e6)), (40, 40));
        assert_eq!(queue_packets(None), (40, 40));
    }
}
