//! The downstream queue each replayed connection gets, pooled over its client's connections.
//!
//! The analyzer infers one connection's bottleneck queue from its own transmissions
//! (`connections.queue_down_pkts`): the deepest a delivered packet found it, which is the
//! queue's length where an original was lost there (`queue_down_full`), and only a lower bound
//! where none was. A server-side tap sees many connections per client address, and the
//! connections of one address at one rate went through one access link, with one queue. So
//! before a replay each connection takes what its client's connections at the same rate (within
//! [`SAME_LINK_TOLERANCE`]) show together:
//!
//! * where any of them overflowed, the median length they overflowed at (the link's queue; a
//!   connection that itself filled a deeper one keeps its own depth), marked full;
//! * else the deepest lower bound among them, not marked full (the replay takes the rate
//!   class's length where that is deeper, `plan::down_queue_packets`).
//!
//! Measured on the independent testbed's 1 Mbit/s class (one 50-packet queue per client
//! address, about eight connections each): a connection that never filled its queue showed
//! 30-45 packets alone, and its replay overflowed the shorter queue that gave it 55 times in
//! 250 where the original lost nothing.

use std::collections::HashMap;

use crate::workload::ConnSpec;

/// Relative difference within which two rates of one client address count as one link.
pub const SAME_LINK_TOLERANCE: f64 = 0.10;

/// How the downstream queues of a workload were decided, counted per connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct QueueSources {
    /// Its own transmissions overflowed the queue: its length is known.
    pub own_overflow: u64,
    /// Another connection of its client (same rate) overflowed it: its length is known.
    pub client_overflow: u64,
    /// No overflow anywhere on its link: the deepest the client's connections showed (or the
    /// rate class's, where deeper), a lower bound.
    pub lower_bound: u64,
    /// Nothing known (no rate, or a database before migration 6): the rate class's length, or
    /// the queue its RTT samples show.
    pub unknown: u64,
    /// Set by `--queue` (down=N or N): every connection's, whatever its original showed.
    pub given: u64,
}

impl QueueSources {
    /// Every one of `conns` connections' downstream queue comes from `--queue` when it names
    /// that direction; else these counts stand.
    pub fn overridden(self, down: Option<u32>, conns: usize) -> QueueSources {
        match down {
            Some(_) => QueueSources {
                given: conns as u64,
                ..QueueSources::default()
            },
            None => self,
        }
    }
}

/// The lower median (of an even count the smaller middle one: a value one of them had), sorting
/// `v`; also the delayed-ACK pool's (`super::delack`).
pub(super) fn median<T: Ord + Copy>(v: &mut [T]) -> Option<T> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    Some(v[(v.len() - 1) / 2])
}

fn same_link(a: f64, b: f64) -> bool {
    (a - b).abs() <= SAME_LINK_TOLERANCE * a.max(b)
}

/// What the connections of each client address showed, with the rate each was measured at:
/// the evidence the per-link pools (queues here, shapers in `super::shapers`) draw on.
pub(super) struct ClientLinks<T>(HashMap<String, Vec<(f64, T)>>);

impl<T: Copy> ClientLinks<T> {
    /// `value` of every connection that has a client address, a rate and a value.
    pub(super) fn gather(conns: &[ConnSpec], value: impl Fn(&ConnSpec) -> Option<T>) -> Self {
        let mut by_client: HashMap<String, Vec<(f64, T)>> = HashMap::new();
        for c in conns {
            if let (Some(ip), Some(bw), Some(v)) = (c.client_ip.as_ref(), c.bw_bps, value(c)) {
                by_client.entry(ip.clone()).or_default().push((bw, v));
            }
        }
        ClientLinks(by_client)
    }

    /// The values of client `ip`'s connections on the link of rate `bw` (within
    /// [`SAME_LINK_TOLERANCE`]), in workload order.
    pub(super) fn on_link(&self, ip: &str, bw: f64) -> Vec<T> {
        self.0
            .get(ip)
            .into_iter()
            .flatten()
            .filter(|(b, _)| same_link(*b, bw))
            .map(|&(_, v)| v)
            .collect()
    }
}

/// Writes into each connection's `queue_down_pkts` / `queue_down_full` what its client's
/// connections at the same rate show together (see the module's documentation), and counts
/// where each came from.
pub fn pool(conns: &mut [ConnSpec]) -> QueueSources {
    // (queue, overflowed) of the connections with a queue, by client address and rate
    let links = ClientLinks::gather(conns, |c| c.queue_down_pkts.map(|q| (q, c.queue_down_full)));
    let mut counts = QueueSources::default();
    for c in conns.iter_mut() {
        if c.queue_down_full && c.queue_down_pkts.is_some() {
            counts.own_overflow += 1;
            continue;
        }
        let bw = c.bw_bps.filter(|b| b.is_finite() && *b > 0.0);
        let peers: Vec<(u32, bool)> = match (bw, c.client_ip.as_ref()) {
            (Some(bw), Some(ip)) => links.on_link(ip, bw),
            _ => Vec::new(),
        };
        let mut overflowed: Vec<u32> = peers.iter().filter(|p| p.1).map(|p| p.0).collect();
        if let Some(link) = median(&mut overflowed) {
            c.queue_down_pkts = Some(link.max(c.queue_down_pkts.unwrap_or(0)));
            c.queue_down_full = true;
            counts.client_overflow += 1;
        } else if let Some(deepest) = peers.iter().map(|p| p.0).max() {
            c.queue_down_pkts = Some(deepest.max(c.queue_down_pkts.unwrap_or(0)));
            counts.lower_bound += 1;
        } else {
            counts.unknown += 1;
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(ip: &str, bw: Option<f64>, q: Option<u32>, full: bool) -> ConnSpec {
        ConnSpec {
            client_ip: Some(ip.into()),
            min_rtt_us: Some(100),
            bw_bps: bw,
            queue_down_pkts: q,
            queue_down_full: full,
            ..ConnSpec::bare(1)
        }
    }

    /// `--queue down=N` (or N) sets every connection's downstream queue: the counts, the
    /// summary and the meta say so instead of the pooling they would have reported.
    #[test]
    fn a_queue_given_on_the_command_line_is_counted_as_such() {
        let pooled = QueueSources {
            own_overflow: 2,
            unknown: 8,
            ..QueueSources::default()
        };
        assert_eq!(
            pooled.overridden(None, 10),
            pooled,
            "--queue up=N leaves down alone"
        );
        let given = pooled.overridden(Some(100), 10);
        assert_eq!(
            given,
            QueueSources {
                given: 10,
                ..QueueSources::default()
            }
        );
        let r = super::super::RateSources {
            queues: given,
            ..Default::default()
        };
        assert!(
            r.describe().contains("\nqueues: 10 from --queue\n"),
            "{}",
            r.describe()
        );
        let meta = r.meta();
        let m = |k: &str| meta.iter().find(|(n, _)| *n == k).unwrap().1.clone();
        assert_eq!(
            (m("queue_given"), m("queue_unknown")),
            ("10".into(), "0".into())
        );
    }

    #[test]
    fn a_clients_overflow_sizes_the_queue_of_its_other_connections() {
        // one 1 Mbit/s client: two connections overflowed its 51-packet queue, two never
        // filled it (36 and 44 packets alone); another client, another rate, another queue
        let mut conns = vec![
            conn("198.19.3.1", Some(1.0e6), Some(51), true),
            conn("198.19.3.1", Some(0.99e6), Some(36), false),
            conn("198.19.3.1", Some(1.01e6), Some(52), true),
            conn("198.19.3.1", Some(1.0e6), Some(44), false),
            conn("198.19.3.1", Some(4.0e6), Some(12), false),
            conn("198.19.3.2", Some(1.0e6), Some(20), false),
            conn("198.19.3.2", Some(1.0e6), Some(25), false),
            conn("198.19.3.3", None, None, false),
        ];
        let counts = pool(&mut conns);
        let q: Vec<(Option<u32>, bool)> = conns
            .iter()
            .map(|c| (c.queue_down_pkts, c.queue_down_full))
            .collect();
        assert_eq!(
            q,
            vec![
                (Some(51), true),
                (Some(51), true),
                (Some(52), true),
                (Some(51), true),
                // a different rate is a different link: its own lower bound
                (Some(12), false),
                // no overflow on this client's link: the deepest either showed
                (Some(25), false),
                (Some(25), false),
                (None, false),
            ]
        );
        assert_eq!(
            counts,
            QueueSources {
                own_overflow: 2,
                client_overflow: 2,
                lower_bound: 3,
                unknown: 1,
                given: 0
            }
        );
    }
}
