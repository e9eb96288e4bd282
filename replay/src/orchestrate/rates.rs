//! The rate each replayed connection gets, and why: no connection is replayed at a rate nobody
//! chose. A connection with a bandwidth estimate of its own keeps it; one without gets, by
//! `--unestimated`:
//!
//! * `pooled` (the default): the median estimate of the other connections of the same client
//!   address in the workload; else it is left out (not replayed, as Monkey did).
//! * `pooled-class`: as `pooled`, but a connection whose client has no estimate gets the median
//!   of the connections in its RTT class (minimum RTT below 10 ms, 10–50 ms, 50–200 ms, 200 ms
//!   and over) before it is left out.
//!
//! Measured on the independent testbed (bench/independent.sh, 2,000 connections from 256
//! client addresses, each address one configured class): the client's median of the *other*
//! connections is within 20% of the configured rate for 96–99% of the connections with an
//! estimate (three runs), the RTT class's median for 14%: classes of different rates share RTTs.
//! Hence the client pool by default and the class pool only when asked for.
//! * `skip`: left out.
//! * `unshaped`: replayed without a rate limit (only when asked for).
//!
//! An estimate of its own that rests on one or two samples and is more than twice or less than
//! half the median of at least three other connections of the same client address, at least
//! half of which agree with that median within 20%, is overruled by that median (counted as
//! `overruled_by_client`): on the independent testbed's 56 kbit/s class, 40 connections of 4-8
//! small segments had one or two pair samples of 0.16-0.97 Mbit/s, and their replays ran at
//! that rate (24 of the class's misses); the rule took the client's median for 42 connections
//! of the 2,000, every one of them closer to the configured rate, and for no connection whose
//! own estimate was right.
//!
//! The counts per source go to the replay summary and the replay database's `meta`. The same
//! step defaults delayed-ACK timeouts the emulator cannot hold (over 2 s, the pipe's maximum:
//! no real timer is that long, RFC 1122 bounds it at 500 ms; the analyzer infers such values
//! from a client that ACKed late) as unmeasured, counted, instead of refusing the whole
//! workload; then every unmeasured timeout of a connection with ACK shaping is pooled from its
//! client's or the workload's measured ones, else [`DEFAULT_DELACK_TIMEOUT_US`]
//! (`super::delack`).

use std::collections::HashMap;

use mimic_core::stats::median;
use serde::Serialize;

use super::ReplayError;
use crate::workload::{ConnSpec, Workload, DEFAULT_DELACK_TIMEOUT_US};

/// The longest delayed-ACK timeout a pipe holds (`ack_timeout` in (0, 2 s]).
pub const MAX_DELACK_TIMEOUT_US: i64 = 2_000_000;

/// Upper bounds (µs, exclusive) of the RTT classes used for pooling; the last class is open.
pub const RTT_CLASS_BOUNDS_US: [i64; 3] = [10_000, 50_000, 200_000];

/// What a connection without a bandwidth estimate of its own gets (`--unestimated`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Unestimated {
    /// The median of its client address's estimates, else left out.
    #[default]
    Pooled,
    /// The median of its client address's estimates, else of its RTT class's, else left out.
    PooledClass,
    /// Left out of the replay.
    Skip,
    /// Replayed without a rate limit.
    Unshaped,
}

impl std::str::FromStr for Unestimated {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "pooled" => Ok(Unestimated::Pooled),
            "pooled-class" => Ok(Unestimated::PooledClass),
            "skip" => Ok(Unestimated::Skip),
            "unshaped" => Ok(Unestimated::Unshaped),
            _ => Err(format!(
                "'{s}': --unestimated takes pooled, pooled-class, skip or unshaped"
            )),
        }
    }
}

impl std::fmt::Display for Unestimated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Unestimated::Pooled => "pooled",
            Unestimated::PooledClass => "pooled-class",
            Unestimated::Skip => "skip",
            Unestimated::Unshaped => "unshaped",
        })
    }
}

/// Where a connection's downstream rate came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RateSource {
    Estimated,
    /// Its own estimate, from one or two samples, overruled by its client's median.
    OverruledByClient,
    PooledByClient,
    PooledByClass,
    UnshapedByRequest,
    LeftOut,
}

/// Connections counted by the source of their rate, and the delayed-ACK timeouts defaulted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RateSources {
    pub unestimated: Unestimated,
    pub estimated: u64,
    /// Own estimates of one or two samples overruled by their client's median (see the module).
    pub overruled_by_client: u64,
    pub pooled_by_client: u64,
    pub pooled_by_class: u64,
    pub unshaped_by_request: u64,
    /// Not replayed: no estimate and none to pool (or `--unestimated skip`).
    pub left_out: u64,
    /// Inferred delayed-ACK timeouts over [`MAX_DELACK_TIMEOUT_US`], not held: pooled as
    /// unmeasured ones (`super::delack`).
    pub delack_timeout_defaulted: u64,
    /// Connections whose client pauses its reads where the original's window stayed at zero
    /// (`exchanges.zero_window_us`).
    pub paused_reads: u64,
    /// Connections whose client reads some response at the original's pace, where the original
    /// read it clearly slower than its path (`exchanges.read_rate_bps`).
    pub paced_reads: u64,
    /// Of those, the clients paced on the evidence of the original's ACK clock (its window
    /// stayed open but its ACKs fell behind its path: `exchanges.read_rate_by` `ack_clock`).
    pub paced_reads_ack_clock: u64,
    /// Connections whose client holds its window to the original's across some response
    /// (`exchanges.rwin_profile`; not those that pause or pace their reads).
    pub window_profiles: u64,
    /// Where each connection's downstream queue came from (`super::queues`).
    pub queues: super::queues::QueueSources,
    /// Where each connection's downstream shaper came from (`super::shapers`).
    pub shapers: super::shapers::ShaperSources,
    /// Where the delayed-ACK timeout of each connection with ACK shaping came from
    /// (`super::delack`).
    pub delack: super::delack::DelackSources,
}

impl RateSources {
    fn count(&mut self, s: RateSource) {
        *match s {
            RateSource::Estimated => &mut self.estimated,
            RateSource::OverruledByClient => &mut self.overruled_by_client,
            RateSource::PooledByClient => &mut self.pooled_by_client,
            RateSource::PooledByClass => &mut self.pooled_by_class,
            RateSource::UnshapedByRequest => &mut self.unshaped_by_request,
            RateSource::LeftOut => &mut self.left_out,
        } += 1;
    }

    /// The `meta` rows of the replay database that carry these counts.
    pub fn meta(&self) -> Vec<(&'static str, String)> {
        vec![
            ("unestimated", self.unestimated.to_string()),
            ("rate_estimated", self.estimated.to_string()),
            (
                "rate_overruled_by_client",
                self.overruled_by_client.to_string(),
            ),
            ("rate_pooled_by_client", self.pooled_by_client.to_string()),
            ("rate_pooled_by_class", self.pooled_by_class.to_string()),
            (
                "rate_unshaped_by_request",
                self.unshaped_by_request.to_string(),
            ),
            ("rate_left_out", self.left_out.to_string()),
            (
                "delack_timeout_defaulted",
                self.delack_timeout_defaulted.to_string(),
            ),
            ("clients_pausing_reads", self.paused_reads.to_string()),
            ("clients_reading_slowly", self.paced_reads.to_string()),
            (
                "clients_reading_slowly_ack_clock",
                self.paced_reads_ack_clock.to_string(),
            ),
            ("clients_following_window", self.window_profiles.to_string()),
            ("queue_own_overflow", self.queues.own_overflow.to_string()),
            (
                "queue_client_overflow",
                self.queues.client_overflow.to_string(),
            ),
            ("queue_lower_bound", self.queues.lower_bound.to_string()),
            ("queue_unknown", self.queues.unknown.to_string()),
            ("queue_given", self.queues.given.to_string()),
            ("shaper_bucket_own", self.shapers.bucket_own.to_string()),
            (
                "shaper_bucket_client",
                self.shapers.bucket_client.to_string(),
            ),
            ("shaper_serializing", self.shapers.serializing.to_string()),
            ("delack_timeout_own", self.delack.own.to_string()),
            ("delack_timeout_client", self.delack.client.to_string()),
            ("delack_timeout_workload", self.delack.workload.to_string()),
            ("delack_timeout_default", self.delack.default.to_string()),
        ]
    }

    /// One line for the text summary.
    pub fn describe(&self) -> String {
        format!(
            "rates (--unestimated {}): {} estimated{}, {} pooled by client, {} pooled by RTT class, {} unshaped, {} left out (no estimate to pool){}{}{}{}",
            self.unestimated,
            self.estimated,
            if self.overruled_by_client > 0 {
                format!(
                    " ({} more whose one or two samples their client's median overruled)",
                    self.overruled_by_client
                )
            } else {
                String::new()
            },
            self.pooled_by_client,
            self.pooled_by_class,
            self.unshaped_by_request,
            self.left_out,
            if self.delack_timeout_defaulted > 0 {
                format!(
                    "; {} delayed-ACK timeouts over 2 s not held (pooled as unmeasured ones)",
                    self.delack_timeout_defaulted,
                )
            } else {
                String::new()
            },
            if self.paused_reads > 0 {
                format!(
                    "; {} clients pause their reads where the original's window was closed",
                    self.paused_reads
                )
            } else {
                String::new()
            },
            if self.paced_reads > 0 {
                format!(
                    "; {} clients read at the original's pace, slower than their path ({} of \
                     them shown by its ACK clock, its window open)",
                    self.paced_reads, self.paced_reads_ack_clock
                )
            } else {
                String::new()
            },
            if self.window_profiles > 0 {
                format!(
                    "; {} clients hold their window to the original's across a response",
                    self.window_profiles
                )
            } else {
                String::new()
            },
        ) + &if self.queues.given > 0 {
            format!("\nqueues: {} from --queue", self.queues.given)
        } else {
            format!(
                "\nqueues: {} as the original overflowed it, {} as its client's other connections did, {} at least what they showed, {} by rate class",
                self.queues.own_overflow,
                self.queues.client_overflow,
                self.queues.lower_bound,
                self.queues.unknown
            )
        } + &format!(
            "\nshapers: {} token buckets as the original's own packets showed, {} as its client's other connections' did, {} serializing links",
            self.shapers.bucket_own,
            self.shapers.bucket_client,
            self.shapers.serializing
        ) + &format!(
            "\ndelayed-ACK timeouts: {} measured, {} as its client's other connections', {} as the workload's, {} the default {} ms",
            self.delack.own,
            self.delack.client,
            self.delack.workload,
            self.delack.default,
            DEFAULT_DELACK_TIMEOUT_US / 1000
        )
    }
}

/// The RTT class of a connection (index into [`RTT_CLASS_BOUNDS_US`], the last one open);
/// None without a measured RTT.
pub fn rtt_class(min_rtt_us: Option<i64>) -> Option<usize> {
    let r = min_rtt_us.filter(|r| *r > 0)?;
    Some(
        RTT_CLASS_BOUNDS_US
            .iter()
            .position(|b| r < *b)
            .unwrap_or(RTT_CLASS_BOUNDS_US.len()),
    )
}

fn has_estimate(c: &ConnSpec) -> bool {
    c.bw_bps.is_some_and(|b| b.is_finite() && b > 0.0)
}

/// Own estimates resting on at most this many samples may be overruled by their client's.
pub const FEW_BW_SAMPLES: u32 = 2;

/// The median of the other connections of `c`'s client (`peers`: every connection of that
/// address with an estimate, `c` among them) where it overrules `c`'s own estimate: `c`'s rests
/// on 1 to [`FEW_BW_SAMPLES`] samples and is more than twice or less than half of that median,
/// which comes from at least three other connections, at least half of them within 20% of it.
fn overruling_median(c: &ConnSpec, peers: &[(i64, f64)]) -> Option<f64> {
    let own = c.bw_bps.filter(|b| b.is_finite() && *b > 0.0)?;
    if !(1..=FEW_BW_SAMPLES).contains(&c.bw_samples) {
        return None;
    }
    let mut others: Vec<f64> = peers
        .iter()
        .filter(|(id, _)| *id != c.orig_id)
        .map(|(_, b)| *b)
        .collect();
    if others.len() < 3 {
        return None;
    }
    let m = median(&mut others)?;
    let agree = others.iter().filter(|b| (*b - m).abs() <= 0.2 * m).count();
    (2 * agree >= others.len() && (own > 2.0 * m || own < 0.5 * m)).then_some(m)
}

/// The rate source of each connection of `conns` under `mode`, with the rate pooled
/// connections get (only connections with an estimate of their own are pooled from).
pub fn decide(conns: &[ConnSpec], mode: Unestimated) -> Vec<(RateSource, Option<f64>)> {
    // the own estimates (connection, rate) by client address, and the rates by RTT class
    let mut own_by_client: HashMap<&str, Vec<(i64, f64)>> = HashMap::new();
    let mut by_class: HashMap<usize, Vec<f64>> = HashMap::new();
    for c in conns.iter().filter(|c| has_estimate(c)) {
        let bw = c.bw_bps.unwrap_or_default();
        if let Some(ip) = c.client_ip.as_deref() {
            own_by_client.entry(ip).or_default().push((c.orig_id, bw));
        }
        if let Some(k) = rtt_class(c.min_rtt_us) {
            by_class.entry(k).or_default().push(bw);
        }
    }
    let client_median: HashMap<&str, f64> = own_by_client
        .iter()
        .filter_map(|(&k, v)| {
            let mut rates: Vec<f64> = v.iter().map(|&(_, bw)| bw).collect();
            median(&mut rates).map(|m| (k, m))
        })
        .collect();
    let class_median: HashMap<usize, f64> = by_class
        .into_iter()
        .filter_map(|(k, mut v)| median(&mut v).map(|m| (k, m)))
        .collect();
    conns
        .iter()
        .map(|c| {
            if has_estimate(c) {
                let peers = c.client_ip.as_deref().and_then(|ip| own_by_client.get(ip));
                if let Some(m) = peers.and_then(|p| overruling_median(c, p)) {
                    return (RateSource::OverruledByClient, Some(m));
                }
                return (RateSource::Estimated, c.bw_bps);
            }
            match mode {
                Unestimated::Unshaped => (RateSource::UnshapedByRequest, None),
                Unestimated::Skip => (RateSource::LeftOut, None),
                Unestimated::Pooled | Unestimated::PooledClass => {
                    if let Some(m) = c.client_ip.as_deref().and_then(|ip| client_median.get(ip)) {
                        (RateSource::PooledByClient, Some(*m))
                    } else if let Some(m) = rtt_class(c.min_rtt_us)
                        .filter(|_| mode == Unestimated::PooledClass)
                        .and_then(|k| class_median.get(&k))
                    {
                        (RateSource::PooledByClass, Some(*m))
                    } else {
                        (RateSource::LeftOut, None)
                    }
                }
            }
        })
        .collect()
}

/// Gives every connection of `wl` its rate under `mode` (pooled rates written into `bw_bps`,
/// connections left out removed, unshaped ones with `bw_bps` None), defaults the delayed-ACK
/// timeouts a pipe cannot hold, and counts both. Err when nothing is left to replay.
pub fn assign(wl: &mut Workload, mode: Unestimated) -> Result<RateSources, ReplayError> {
    let mut counts = RateSources {
        unestimated: mode,
        ..RateSources::default()
    };
    let decisions = decide(&wl.conns, mode);
    let conns = std::mem::take(&mut wl.conns);
    for (mut c, (source, bw)) in conns.into_iter().zip(decisions) {
        counts.count(source);
        if source == RateSource::LeftOut {
            continue;
        }
        c.bw_bps = bw;
        if source == RateSource::OverruledByClient {
            // what the analyzer measured against the discarded rate — the shaper's lead (in
            // units of a packet's serialization at it) and the queue its model inferred — is
            // as wrong as the rate: the client's peers at the new rate fill them in
            // (`queues::pool`, `shapers::pool` below)
            c.shaper_lead_down = None;
            c.queue_down_pkts = None;
            c.queue_down_full = false;
        }
        if c.delack_timeout_us
            .is_some_and(|t| t > MAX_DELACK_TIMEOUT_US)
        {
            c.delack_timeout_us = None;
            counts.delack_timeout_defaulted += 1;
        }
        if c.exchanges.iter().any(|e| !e.stalls.is_empty()) {
            counts.paused_reads += 1;
        }
        if crate::client::reads_slowly(&c) {
            counts.paced_reads += 1;
            counts.paced_reads_ack_clock += crate::client::reads_slowly_by_ack_clock(&c) as u64;
        }
        counts.window_profiles += crate::client::follows_window(&c) as u64;
        wl.conns.push(c);
    }
    // the queues after the rates: pooled ones are matched by rate too
    counts.queues = super::queues::pool(&mut wl.conns);
    counts.shapers = super::shapers::pool(&mut wl.conns);
    counts.delack = super::delack::pool(&mut wl.conns);
    if wl.conns.is_empty() {
        return Err(ReplayError::Invalid(format!(
            "{}: none of its {} connections has a bandwidth estimate or one to pool under --unestimated {mode}; \
             --unestimated unshaped replays them without a rate limit",
            wl.source, counts.left_out
        )));
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(id: i64, ip: &str, rtt_ms: i64, bw: Option<f64>) -> ConnSpec {
        ConnSpec {
            client_ip: Some(ip.to_string()),
            t_start_us: id,
            min_rtt_us: Some(rtt_ms * 1000),
            bw_bps: bw,
            ..ConnSpec::bare(id)
        }
    }

    fn workload(conns: Vec<ConnSpec>) -> Workload {
        Workload {
            source: "test.db".into(),
            role: None,
            conns,
            skipped: 0,
        }
    }

    #[test]
    fn pooled_takes_the_clients_median_and_pooled_class_then_the_rtt_class() {
        let conns = vec![
            conn(1, "10.0.0.1", 40, Some(1e6)),
            conn(2, "10.0.0.1", 40, Some(3e6)),
            conn(3, "10.0.0.1", 40, Some(2e6)),
            conn(4, "10.0.0.1", 300, None), // same client: its median, not the class's
            conn(5, "10.0.0.2", 45, None),  // 10–50 ms class: median of 1, 3, 2 and 6
            conn(6, "10.0.0.3", 20, Some(6e6)),
            conn(7, "10.0.0.4", 3, None), // < 10 ms: nobody to pool from
            conn(8, "10.0.0.5", 0, None), // no RTT, no client estimate
        ];
        let d = decide(&conns, Unestimated::PooledClass);
        assert_eq!(d[0], (RateSource::Estimated, Some(1e6)));
        assert_eq!(d[3], (RateSource::PooledByClient, Some(2e6)));
        assert_eq!(d[4], (RateSource::PooledByClass, Some(2.5e6)));
        assert_eq!(d[6], (RateSource::LeftOut, None));
        assert_eq!(d[7], (RateSource::LeftOut, None));
        // the default pools by client only: the class's median is left to pooled-class
        let d = decide(&conns, Unestimated::Pooled);
        assert_eq!(d[3], (RateSource::PooledByClient, Some(2e6)));
        assert_eq!(d[4], (RateSource::LeftOut, None));

        let counts_of = |c: &RateSources| {
            (
                c.estimated,
                c.pooled_by_client,
                c.pooled_by_class,
                c.unshaped_by_request,
                c.left_out,
            )
        };
        let mut wl = workload(conns.clone());
        let counts = assign(&mut wl, Unestimated::PooledClass).unwrap();
        assert_eq!(counts_of(&counts), (4, 1, 1, 0, 2));
        assert_eq!(wl.conns.len(), 6);
        assert!(
            wl.conns.iter().all(|c| c.bw_bps.is_some_and(|b| b > 0.0)),
            "pooled-class: every replayed connection has a rate"
        );
        assert_eq!(wl.conns[3].bw_bps, Some(2e6));

        let mut wl = workload(conns);
        let counts = assign(&mut wl, Unestimated::Pooled).unwrap();
        assert_eq!(counts_of(&counts), (4, 1, 0, 0, 3));
        assert!(wl.conns.iter().all(|c| c.bw_bps.is_some_and(|b| b > 0.0)));
    }

    #[test]
    fn an_estimate_of_one_or_two_samples_far_from_its_clients_is_overruled() {
        // a 56 kbit/s household: four connections agree; a fifth of 6 small segments had one
        // pair sample of 0.97 Mbit/s (the testbed's dial-up class)
        let mut conns: Vec<ConnSpec> = [56_001.0, 55_996.0, 56_010.0, 56_003.0]
            .iter()
            .enumerate()
            .map(|(i, bw)| ConnSpec {
                bw_samples: 6,
                ..conn(i as i64 + 1, "10.0.0.1", 30, Some(*bw))
            })
            .collect();
        let odd = |samples: u32, bw: f64| ConnSpec {
            bw_samples: samples,
            // measured against its own (wrong) rate: a serializing link's lead at 17x the
            // rate, and a queue overflow the model placed at 3 packets
            shaper_lead_down: Some(0.05),
            queue_down_pkts: Some(3),
            queue_down_full: true,
            ..conn(9, "10.0.0.1", 30, Some(bw))
        };
        conns.push(odd(1, 967_976.0));
        let d = decide(&conns, Unestimated::Pooled);
        assert_eq!(d[4], (RateSource::OverruledByClient, Some(56_002.0)));
        assert!(d[..4].iter().all(|s| s.0 == RateSource::Estimated));
        let mut wl = workload(conns.clone());
        let counts = assign(&mut wl, Unestimated::Pooled).unwrap();
        assert_eq!((counts.estimated, counts.overruled_by_client), (4, 1));
        assert_eq!(wl.conns[4].bw_bps, Some(56_002.0));
        // its lead and queue were measured against the overruled rate: none of its own kept
        assert_ne!(wl.conns[4].shaper_lead_down, Some(0.05));
        assert_ne!(
            (wl.conns[4].queue_down_pkts, wl.conns[4].queue_down_full),
            (Some(3), true)
        );
        assert!(counts
            .describe()
            .contains("1 more whose one or two samples"));
        assert!(counts
            .meta()
            .contains(&("rate_overruled_by_client", "1".to_string())));
        // too low by more than half, two samples: overruled too
        conns[4] = odd(2, 20_000.0);
        assert_eq!(
            decide(&conns, Unestimated::Pooled)[4].0,
            RateSource::OverruledByClient
        );
        // within a factor of two, or three samples, or unknown samples (0): its own
        for c in [odd(1, 100_000.0), odd(3, 967_976.0), odd(0, 967_976.0)] {
            conns[4] = c;
            assert_eq!(
                decide(&conns, Unestimated::Pooled)[4].0,
                RateSource::Estimated
            );
        }
        // fewer than three others, or others that do not agree among themselves: its own
        conns[4] = odd(1, 967_976.0);
        let few = conns[2..].to_vec();
        assert_eq!(
            decide(&few, Unestimated::Pooled)[2].0,
            RateSource::Estimated
        );
        conns[1].bw_bps = Some(500_000.0);
        conns[2].bw_bps = Some(2e6);
        assert_eq!(
            decide(&conns, Unestimated::Pooled)[4].0,
            RateSource::Estimated
        );
    }

    #[test]
    fn unshaped_only_when_asked_and_skip_leaves_out() {
        let conns = vec![
            conn(1, "10.0.0.1", 40, Some(1e6)),
            conn(2, "10.0.0.1", 40, None),
            conn(3, "10.0.0.9", 900, None),
        ];
        let mut wl = workload(conns.clone());
        let c = assign(&mut wl, Unestimated::Unshaped).unwrap();
        assert_eq!((c.estimated, c.unshaped_by_request, c.left_out), (1, 2, 0));
        assert_eq!(wl.conns.iter().filter(|c| c.bw_bps.is_none()).count(), 2);

        let mut wl = workload(conns.clone());
        let c = assign(&mut wl, Unestimated::Skip).unwrap();
        assert_eq!((c.estimated, c.left_out, c.pooled_by_client), (1, 2, 0));
        assert_eq!(wl.conns.len(), 1);

        // nothing estimated anywhere: pooled leaves everything out and says how to go on
        let mut wl = workload(vec![conn(1, "10.0.0.1", 40, None)]);
        let e = assign(&mut wl, Unestimated::Pooled)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("test.db") && e.contains("--unestimated unshaped"),
            "{e}"
        );
    }

    #[test]
    fn delack_timeouts_over_the_pipes_maximum_are_pooled_as_unmeasured_and_counted() {
        let mut a = conn(1, "10.0.0.1", 40, Some(1e6));
        a.delack_every = Some(2);
        a.delack_timeout_us = Some(4_700_000);
        let mut b = a.clone();
        b.delack_timeout_us = Some(MAX_DELACK_TIMEOUT_US);
        let mut other = conn(3, "10.0.0.2", 40, Some(1e6));
        other.delack_every = Some(2);
        let mut wl = workload(vec![a, b, other]);
        let c = assign(&mut wl, Unestimated::Pooled).unwrap();
        assert_eq!(c.delack_timeout_defaulted, 1);
        // its client's other connection's, the longest a pipe holds
        assert_eq!(wl.conns[0].delack_timeout_us, Some(MAX_DELACK_TIMEOUT_US));
        assert_eq!(wl.conns[1].delack_timeout_us, Some(MAX_DELACK_TIMEOUT_US));
        // one measured timeout is too few to stand for the workload: the default
        assert_eq!(wl.conns[2].delack_timeout_us, None);
        let meta: HashMap<_, _> = c.meta().into_iter().collect();
        assert_eq!(meta["delack_timeout_defaulted"], "1");
        assert_eq!(meta["delack_timeout_own"], "1");
        assert_eq!(meta["delack_timeout_client"], "1");
        assert_eq!(meta["delack_timeout_default"], "1");
        assert_eq!(meta["rate_estimated"], "3");
        assert_eq!(meta["unestimated"], "pooled");
    }

    #[test]
    fn rtt_classes_and_flag_values() {
        assert_eq!(rtt_class(Some(9_999)), Some(0));
        assert_eq!(rtt_class(Some(10_000)), Some(1));
        assert_eq!(rtt_class(Some(199_999)), Some(2));
        assert_eq!(rtt_class(Some(5_000_000)), Some(3));
        assert_eq!(rtt_class(None), None);
        for m in ["pooled", "pooled-class", "skip", "unshaped"] {
            assert_eq!(m.parse::<Unestimated>().unwrap().to_string(), m);
        }
        assert!("none".parse::<Unestimated>().is_err());
    }
}
