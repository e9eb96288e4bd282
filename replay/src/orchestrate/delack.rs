//! The delayed-ACK timeout each replayed connection's ACK shaping holds, pooled where the
//! original's own was not measured.
//!
//! The analyzer infers a client's delayed-ACK timeout (`connections.delack_timeout_us`) only
//! where an odd segment was left unacknowledged long enough to show the timer; on most
//! connections it sees the policy (one ACK per two segments) but no timeout. The emulator's ACK
//! shaping needs one: it holds the odd ACK that long. The timer is the client host's (its
//! operating system's), so a connection without one takes, in order:
//!
//! * the median of the timeouts measured on the other connections of its client address;
//! * else the median of those measured anywhere in the workload, where at least
//!   [`WORKLOAD_MIN_MEASURED`] connections measured one and at least half of them agree with
//!   that median within [`WORKLOAD_AGREEMENT`] (the clients behind one server share a few
//!   stacks; no such agreement, no pooling);
//! * else [`DEFAULT_DELACK_TIMEOUT_US`](crate::workload::DEFAULT_DELACK_TIMEOUT_US) (RFC 1122's bound).
//!
//! Measured on the independent testbed's rate-only capture (Linux clients, whose timer is
//! 40 ms): 1,111 connections delayed their ACKs, 64 of them showed the timer (37–48 ms for 56
//! of them), 1,047 did not and were replayed with 200 ms. Where such a connection's last
//! segments were lost at the queue, the replay's shaper held the client's last ACK 200 ms, the
//! server's tail-loss probe and retransmission timer ran from that late ACK, and the replay
//! came in hundreds of ms slower than an original whose client had ACKed after 40 ms (on the
//! 4–6 Mbit/s classes a 200 ms hold in 12 of their 58 misses' replays against 58 of 442
//! replays within ±20%).

use std::collections::HashMap;

use serde::Serialize;

use super::queues::median;
use super::rates::MAX_DELACK_TIMEOUT_US;
use crate::workload::ConnSpec;

/// The fewest measured timeouts the workload's median needs before it stands for the others.
pub const WORKLOAD_MIN_MEASURED: usize = 5;

/// How close (relative) to the workload's median a measured timeout must be to agree with it.
pub const WORKLOAD_AGREEMENT: f64 = 0.25;

/// Where the delayed-ACK timeouts of the connections with ACK shaping came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DelackSources {
    /// Its own, as the analyzer measured it.
    pub own: u64,
    /// The median of its client address's other connections.
    pub client: u64,
    /// The median of the workload's measured ones.
    pub workload: u64,
    /// None measured to pool: [`DEFAULT_DELACK_TIMEOUT_US`](crate::workload::DEFAULT_DELACK_TIMEOUT_US).
    pub default: u64,
}

fn usable(t: Option<i64>) -> Option<i64> {
    t.filter(|t| *t > 0 && *t <= MAX_DELACK_TIMEOUT_US)
}

/// The workload's median measured timeout, where enough were measured and they agree (see the
/// module's documentation).
fn workload_median(measured: &[i64]) -> Option<i64> {
    if measured.len() < WORKLOAD_MIN_MEASURED {
        return None;
    }
    let m = median(&mut measured.to_vec())?;
    let agree = measured
        .iter()
        .filter(|t| (**t - m).abs() as f64 <= WORKLOAD_AGREEMENT * m as f64)
        .count();
    (2 * agree >= measured.len()).then_some(m)
}

/// Writes a delayed-ACK timeout into every connection whose client delayed its ACKs
/// (`delack_every`) but whose timeout was not measured (see the module's documentation), and
/// counts where each came from. Connections without ACK shaping are left alone and not counted.
pub fn pool(conns: &mut [ConnSpec]) -> DelackSources {
    let mut by_client: HashMap<String, Vec<i64>> = HashMap::new();
    let mut measured = Vec::new();
    for c in conns.iter().filter(|c| c.delack_every.is_some()) {
        if let Some(t) = usable(c.delack_timeout_us) {
            measured.push(t);
            if let Some(ip) = &c.client_ip {
                by_client.entry(ip.clone()).or_default().push(t);
            }
        }
    }
    let client_median: HashMap<String, i64> = by_client
        .into_iter()
        .filter_map(|(ip, mut v)| median(&mut v).map(|m| (ip, m)))
        .collect();
    let workload = workload_median(&measured);
    let mut counts = DelackSources::default();
    for c in conns.iter_mut().filter(|c| c.delack_every.is_some()) {
        if usable(c.delack_timeout_us).is_some() {
            counts.own += 1;
        } else if let Some(m) = c.client_ip.as_ref().and_then(|ip| client_median.get(ip)) {
            c.delack_timeout_us = Some(*m);
            counts.client += 1;
        } else if let Some(m) = workload {
            c.delack_timeout_us = Some(m);
            counts.workload += 1;
        } else {
            c.delack_timeout_us = None;
            counts.default += 1;
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(id: i64, ip: &str, timeout_us: Option<i64>) -> ConnSpec {
        ConnSpec {
            client_ip: Some(ip.to_string()),
            delack_every: Some(2),
            delack_timeout_us: timeout_us,
            ..ConnSpec::bare(id)
        }
    }

    #[test]
    fn an_unmeasured_timeout_takes_its_clients_median_before_the_workloads() {
        let mut conns = vec![
            conn(1, "198.19.0.1", Some(40_000)),
            conn(2, "198.19.0.1", Some(44_000)),
            conn(3, "198.19.0.1", Some(100_000)),
            conn(4, "198.19.0.1", None),
            conn(5, "198.19.0.2", Some(200_000)),
            conn(6, "198.19.0.2", None),
        ];
        let counts = pool(&mut conns);
        // its own client's median, not the workload's (44 ms of 40, 44, 100, 200)
        assert_eq!(conns[3].delack_timeout_us, Some(44_000));
        assert_eq!(conns[5].delack_timeout_us, Some(200_000));
        assert_eq!(conns[0].delack_timeout_us, Some(40_000));
        assert_eq!(
            counts,
            DelackSources {
                own: 4,
                client: 2,
                workload: 0,
                default: 0
            }
        );
    }

    #[test]
    fn the_workloads_median_stands_in_only_where_enough_agree() {
        // five Linux-like clients at 40-48 ms, one at 200 ms, and one without a measurement
        let mut conns: Vec<ConnSpec> = [40_000, 41_000, 43_000, 45_000, 48_000, 200_000]
            .iter()
            .enumerate()
            .map(|(i, t)| conn(i as i64, &format!("198.19.1.{i}"), Some(*t)))
            .collect();
        conns.push(conn(9, "198.19.2.1", None));
        let counts = pool(&mut conns);
        assert_eq!(conns[6].delack_timeout_us, Some(43_000));
        assert_eq!(counts.workload, 1);

        // four measured: too few to stand for the workload, the RFC default instead
        let mut few: Vec<ConnSpec> = (0..4)
            .map(|i| conn(i, &format!("198.19.1.{i}"), Some(40_000)))
            .collect();
        few.push(conn(9, "198.19.2.1", None));
        let counts = pool(&mut few);
        assert_eq!(few[4].delack_timeout_us, None);
        assert_eq!(counts.default, 1);

        // six measured that do not agree (half of them more than 25% from the median)
        let mut spread: Vec<ConnSpec> = [10_000, 40_000, 45_000, 100_000, 200_000, 400_000]
            .iter()
            .enumerate()
            .map(|(i, t)| conn(i as i64, &format!("198.19.1.{i}"), Some(*t)))
            .collect();
        spread.push(conn(9, "198.19.2.1", None));
        assert_eq!(pool(&mut spread).default, 1);
        assert_eq!(spread[6].delack_timeout_us, None);
    }

    #[test]
    fn connections_without_ack_shaping_and_timeouts_a_pipe_cannot_hold_are_not_pooled_from() {
        let mut conns = vec![
            // no ACK shaping: its timeout is not evidence for the others' (and is not counted)
            ConnSpec {
                client_ip: Some("198.19.0.1".into()),
                delack_timeout_us: Some(40_000),
                ..ConnSpec::bare(1)
            },
            conn(2, "198.19.0.1", Some(MAX_DELACK_TIMEOUT_US + 1)),
            conn(3, "198.19.0.1", None),
        ];
        let counts = pool(&mut conns);
        assert_eq!(conns[2].delack_timeout_us, None);
        assert_eq!(conns[1].delack_timeout_us, None);
        assert_eq!(conns[0].delack_timeout_us, Some(40_000));
        assert_eq!(
            counts,
            DelackSources {
                own: 0,
                client: 0,
                workload: 0,
                default: 2
            }
        );
    }
}
