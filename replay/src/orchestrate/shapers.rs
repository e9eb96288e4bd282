//! Which replayed connections get a token-bucket pipe, with the shaper's evidence pooled over
//! each client's connections.
//!
//! The analyzer measures per connection how much sooner than a serializing link the
//! bottleneck returned its packets (`connections.shaper_lead_down`, see
//! `plan::token_bucket_evident`). A connection whose own packets gave no measure (a rate
//! pooled from its client's other connections, a response too small) but whose client address
//! has connections at the same rate (within `queues::SAME_LINK_TOLERANCE`: one access link)
//! that did, takes the median of theirs: one link, one shaper. The independent testbed's
//! dial-up class had 12 of 334 connections with no lead of their own (their rates pooled).

use super::plan::token_bucket_evident;
use super::queues::ClientLinks;
use crate::workload::ConnSpec;

/// How the downstream pipes' shapers were decided, counted per connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ShaperSources {
    /// A token bucket by its own evidence (its lead, or its handshake).
    pub bucket_own: u64,
    /// A token bucket by the lead of its client's other connections at the same rate.
    pub bucket_client: u64,
    /// A serializing link (no evidence of a bucket, or a lead below one half).
    pub serializing: u64,
}

/// Fills in `shaper_lead_down` of connections without one from their client's connections at
/// the same rate (the median of theirs), and counts where each pipe's shaper came from.
pub fn pool(conns: &mut [ConnSpec]) -> ShaperSources {
    // the leads of the connections with one, by client address and rate
    let links = ClientLinks::gather(conns, |c| c.shaper_lead_down);
    let mut counts = ShaperSources::default();
    for c in conns.iter_mut() {
        if token_bucket_evident(c) {
            counts.bucket_own += 1;
            continue;
        }
        if c.shaper_lead_down.is_none() {
            if let (Some(ip), Some(bw)) = (&c.client_ip, c.bw_bps) {
                let mut leads = links.on_link(ip, bw);
                if !leads.is_empty() {
                    leads.sort_by(f64::total_cmp);
                    c.shaper_lead_down = Some(leads[(leads.len() - 1) / 2]);
                    if token_bucket_evident(c) {
                        counts.bucket_client += 1;
                        continue;
                    }
                }
            }
        }
        counts.serializing += 1;
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(ip: &str, bw: Option<f64>, lead: Option<f64>) -> ConnSpec {
        ConnSpec {
            client_ip: Some(ip.into()),
            min_rtt_us: Some(150_000),
            bw_bps: bw,
            shaper_lead_down: lead,
            ..ConnSpec::bare(1)
        }
    }

    #[test]
    fn a_connection_without_a_lead_takes_its_clients_at_the_same_rate() {
        let mut conns = vec![
            conn("198.19.1.1", Some(56e3), Some(0.95)),
            conn("198.19.1.1", Some(56.5e3), Some(0.9)),
            conn("198.19.1.1", Some(57e3), Some(0.2)),
            // no lead of its own: the median of its client's three (0.9)
            conn("198.19.1.1", Some(56e3), None),
            // same client, another rate (another link): nothing to pool
            conn("198.19.1.1", Some(1e6), None),
            // another client with no leads at all
            conn("198.19.1.2", Some(56e3), None),
            // a serializing link's low lead is kept, not replaced by the client's
            conn("198.19.1.3", Some(56e3), Some(0.05)),
            conn("198.19.1.3", Some(56e3), None),
        ];
        let counts = pool(&mut conns);
        assert_eq!(conns[3].shaper_lead_down, Some(0.9));
        assert!(token_bucket_evident(&conns[3]));
        assert_eq!(conns[4].shaper_lead_down, None);
        assert_eq!(conns[5].shaper_lead_down, None);
        assert_eq!(conns[6].shaper_lead_down, Some(0.05));
        assert_eq!(conns[7].shaper_lead_down, Some(0.05));
        assert!(!token_bucket_evident(&conns[7]));
        assert_eq!(
            counts,
            ShaperSources {
                bucket_own: 2,
                bucket_client: 1,
                serializing: 5,
            }
        );
    }
}
