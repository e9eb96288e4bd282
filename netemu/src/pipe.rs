//! One emulated link direction: loss on arrival, a drop-tail queue in front of a serializer of
//! the configured rate, then a propagation delay (plus optional jitter). Pure: time comes in as
//! an argument and the pipe answers with the instant the packet leaves, so one timing wheel can
//! serve any number of pipes.
//!
//! The model is dummynet's: a packet arriving at `now` is lost with the loss model's
//! probability; otherwise, if the queue (the packets not yet fully serialized, including the
//! one on the wire) is at its limit, it is dropped (drop-tail); otherwise it starts
//! serializing when the previous one ends, takes `(ip_len + overhead) * 8 / rate` and then
//! travels for `delay (+ jitter)`.
//!
//! With a `burst` of B bytes the serializer is a token bucket of depth B (tbf's, dummynet's
//! `burst`): a packet leaves B bytes' serialization time before it would have finished
//! serializing, but never before it arrived (the generic cell rate algorithm, which is a token
//! bucket). An idle pipe lets B bytes through at once; a backlog still leaves at the rate.
//! Queue occupancy counts the packets that have not left.

use std::collections::VecDeque;

use serde::Serialize;

use crate::config::{LossModel, PipeConfig, QueueLimit};
use crate::rng::Rng;
use crate::units::Nanos;

/// What happened to a packet offered to a pipe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offer {
    /// Leaves the pipe at this instant.
    Deliver(Nanos),
    Dropped(DropReason),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DropReason {
    Loss,
    Queue,
}

/// Per-pipe counters. `packets`/`bytes` count packets accepted into the pipe (they leave it
/// after the delay; `in_flight` of them have not yet); drops are counted apart. Bytes are IP
/// bytes (no Ethernet header).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Counters {
    pub packets: u64,
    pub bytes: u64,
    pub queue_drops: u64,
    pub loss_drops: u64,
    /// Largest queue seen by an arriving packet (packets / bytes waiting or on the wire).
    pub max_queue_packets: u64,
    pub max_queue_bytes: u64,
    /// Accepted packets that have not left the pipe yet.
    pub in_flight: u64,
}

#[derive(Debug)]
pub struct Pipe {
    cfg: PipeConfig,
    rng: Rng,
    ge_bad: bool,
    /// When the serializer becomes free.
    busy_until: Nanos,
    /// Remainder (in bit·ns units below one nanosecond) carried between packets so the
    /// long-run rate is exact.
    carry: u128,
    /// Serialization end times and lengths of the packets still in the queue.
    backlog: VecDeque<(Nanos, u32)>,
    backlog_bytes: u64,
    last_departure: Nanos,
    pub counters: Counters,
}

impl Pipe {
    /// `default_seed` is used when the config gives no seed.
    pub fn new(cfg: PipeConfig, default_seed: u64) -> Pipe {
        let seed = cfg.seed.unwrap_or(default_seed);
        Pipe {
            rng: Rng::new(seed),
            cfg,
            ge_bad: false,
            busy_until: 0,
            carry: 0,
            backlog: VecDeque::new(),
            backlog_bytes: 0,
            last_departure: 0,
            counters: Counters::default(),
        }
    }

    pub fn config(&self) -> &PipeConfig {
        &self.cfg
    }

    /// Changes the configuration in place; packets already scheduled keep their times, the
    /// generator is reseeded only if the new config names a different seed.
    pub fn reconfigure(&mut self, cfg: PipeConfig) {
        if let Some(seed) = cfg.seed.filter(|&s| Some(s) != self.cfg.seed) {
            self.rng = Rng::new(seed);
        }
        self.cfg = cfg;
    }

    fn lost(&mut self) -> bool {
        match self.cfg.loss {
            LossModel::None => false,
            LossModel::Iid(p) => self.rng.chance(p),
            LossModel::GilbertElliott {
                p_good_to_bad,
                p_bad_to_good,
                loss_bad,
                loss_good,
            } => {
                // Transition first, then lose with the new state's probability (netem's order).
                if self.ge_bad {
                    if self.rng.chance(p_bad_to_good) {
                        self.ge_bad = false;
                    }
                } else if self.rng.chance(p_good_to_bad) {
                    self.ge_bad = true;
                }
                self.rng
                    .chance(if self.ge_bad { loss_bad } else { loss_good })
            }
        }
    }

    /// Queue occupancy an arrival at `now` sees.
    fn drain_backlog(&mut self, now: Nanos) {
        while let Some(&(end, len)) = self.backlog.front() {
            if end > now {
                break;
            }
            self.backlog.pop_front();
            self.backlog_bytes -= len as u64;
        }
    }

    /// Offers a packet of `ip_len` IP bytes arriving at `now`.
    pub fn offer(&mut self, now: Nanos, ip_len: u32) -> Offer {
        if self.lost() {
            self.counters.loss_drops += 1;
            return Offer::Dropped(DropReason::Loss);
        }
        let tx_end = if self.cfg.rate_bps == 0 {
            now
        } else {
            self.drain_backlog(now);
            let full = match self.cfg.queue {
                QueueLimit::Packets(n) => self.backlog.len() as u64 >= n as u64,
                QueueLimit::Bytes(b) => self.backlog_bytes + ip_len as u64 > b,
            };
            if full {
                self.counters.queue_drops += 1;
                return Offer::Dropped(DropReason::Queue);
            }
            let start = self.busy_until.max(now);
            let bits_ns =
                (ip_len as u128 + self.cfg.overhead as u128) * 8 * 1_000_000_000 + self.carry;
            let rate = self.cfg.rate_bps as u128;
            let tx = (bits_ns / rate) as Nanos;
            self.carry = bits_ns % rate;
            // the token bucket lets the packet leave up to `burst` bytes' time early
            let early = if self.cfg.burst == 0 {
                0
            } else {
                (self.cfg.burst as u128 * 8 * 1_000_000_000 / rate) as Nanos
            };
            self.busy_until = start + tx;
            let end = (start + tx).saturating_sub(early).max(now);
            self.backlog.push_back((end, ip_len));
            self.backlog_bytes += ip_len as u64;
            self.counters.max_queue_packets = self
                .counters
                .max_queue_packets
                .max(self.backlog.len() as u64);
            self.counters.max_queue_bytes = self.counters.max_queue_bytes.max(self.backlog_bytes);
            end
        };
        let mut depart = tx_end + self.cfg.delay;
        if self.counters.packets == 0 {
            depart += self.cfg.first_delay;
        }
        if self.cfg.jitter > 0 {
            let j = self.cfg.jitter as f64;
            let off = (self.rng.next_f64() * 2.0 - 1.0) * j;
            depart = ((depart as f64) + off).max(tx_end as f64) as Nanos;
        }
        if !self.cfg.reorder {
            depart = depart.max(self.last_departure);
        }
        self.last_departure = self.last_departure.max(depart);
        self.counters.packets += 1;
        self.counters.bytes += ip_len as u64;
        self.counters.in_flight += 1;
        Offer::Deliver(depart)
    }

    /// The engine calls this when a packet accepted by [`offer`](Self::offer) leaves.
    pub fn departed(&mut self) {
        self.counters.in_flight = self.counters.in_flight.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;

    fn pipe(spec: &str) -> Pipe {
        Pipe::new(spec.parse().unwrap(), 1)
    }

    #[test]
    fn delay_only() {
        let mut p = pipe("delay=20ms");
        assert_eq!(p.offer(5 * MS, 1500), Offer::Deliver(25 * MS));
        assert_eq!(p.offer(5 * MS, 1500), Offer::Deliver(25 * MS));
        assert_eq!(p.counters.packets, 2);
    }

    #[test]
    fn rate_serializes_back_to_back_and_is_exact_over_time() {
        // 1500 bytes at 10 Mbit/s = 1.2 ms each.
        let mut p = pipe("delay=10ms,rate=10mbit,queue=1000");
        assert_eq!(p.offer(0, 1500), Offer::Deliver(1_200_000 + 10 * MS));
        assert_eq!(p.offer(0, 1500), Offer::Deliver(2_400_000 + 10 * MS));
        // A rate that does not divide evenly keeps no drift: 3 bytes at 7 bit/s... use 1000
        // packets of 1 byte at 3 bit/s: each 8/3 s; after 3 packets exactly 8 s.
        let mut p = pipe("rate=3bit,queue=1000");
        let mut last = 0;
        for _ in 0..3 {
            if let Offer::Deliver(t) = p.offer(0, 1) {
                last = t;
            }
        }
        assert_eq!(last, 8_000_000_000);
    }

    #[test]
    fn overhead_counts_toward_the_rate() {
        let mut p = pipe("rate=8mbit,overhead=14");
        // (1486 + 14) bytes * 8 / 8 Mbit/s = 1.5 ms
        assert_eq!(p.offer(0, 1486), Offer::Deliver(1_500_000));
    }

    #[test]
    fn burst_larger_than_queue_drops_exactly_the_excess() {
        let mut p = pipe("rate=1mbit,queue=30");
        let mut drops = 0;
        for i in 0..100 {
            if let Offer::Dropped(r) = p.offer(i * 1_000, 1000) {
                assert_eq!(r, DropReason::Queue);
                drops += 1;
            }
        }
        assert_eq!(drops, 70);
        assert_eq!(p.counters.queue_drops, 70);
        assert_eq!(p.counters.max_queue_packets, 30);
        // Once the first packet has been serialized (8 ms), one slot frees up.
        assert!(matches!(p.offer(8 * MS, 1000), Offer::Deliver(_)));
        assert!(matches!(
            p.offer(8 * MS, 1000),
            Offer::Dropped(DropReason::Queue)
        ));
    }

    #[test]
    fn a_token_bucket_lets_an_idle_pipes_first_packet_through_then_keeps_the_rate() {
        // 1500 bytes at 128 kbit/s = 93.75 ms of serialization
        let tx = 93_750_000;
        let mut p = pipe("delay=10ms,rate=128kbit,burst=1500,queue=100");
        assert_eq!(p.offer(0, 1500), Offer::Deliver(10 * MS), "leaves at once");
        assert_eq!(p.offer(0, 1500), Offer::Deliver(tx + 10 * MS));
        assert_eq!(p.offer(0, 1500), Offer::Deliver(2 * tx + 10 * MS));
        // 25 small packets fit the bucket of an idle pipe; the 26th waits
        let mut p = pipe("rate=128kbit,burst=1500,queue=100");
        for _ in 0..25 {
            assert_eq!(p.offer(0, 60), Offer::Deliver(0));
        }
        assert_eq!(p.offer(0, 60), Offer::Deliver(3_750_000));
        // after a pause longer than the bucket's fill time it is full again, not fuller
        let t = 10_000 * MS;
        assert_eq!(p.offer(t, 1500), Offer::Deliver(t));
        assert_eq!(p.offer(t, 1500), Offer::Deliver(t + tx));
        // the queue counts packets that have not left: one left at once, so a queue of 2
        // takes three back to back and drops the fourth
        let mut p = pipe("rate=128kbit,burst=1500,queue=2");
        for _ in 0..3 {
            assert!(matches!(p.offer(0, 1500), Offer::Deliver(_)));
        }
        assert_eq!(p.offer(0, 1500), Offer::Dropped(DropReason::Queue));
        // without a burst the same pipe is store-and-forward: the first packet pays too
        let mut p = pipe("rate=128kbit,queue=2");
        assert_eq!(p.offer(0, 1500), Offer::Deliver(tx));
    }

    #[test]
    fn a_first_delay_holds_only_the_first_packet_and_what_would_overtake_it() {
        // a SYN-ACK that waited 150 ms behind another connection's tail at the original's
        // shaper: the replay's pipe holds its first packet that much longer
        let mut p = pipe("delay=10ms,first_delay=150ms");
        assert_eq!(p.offer(0, 60), Offer::Deliver(160 * MS));
        // packets never overtake: one right behind it leaves with it, a later one on time
        assert_eq!(p.offer(MS, 60), Offer::Deliver(160 * MS));
        assert_eq!(p.offer(200 * MS, 1500), Offer::Deliver(210 * MS));
        // behind a rate: the hold comes on top of the first packet's serialization, and the
        // serializer itself is not held (the next packet is not charged the hold again)
        let mut p = pipe("rate=1mbit,first_delay=50ms,queue=10");
        assert_eq!(p.offer(0, 125), Offer::Deliver(MS + 50 * MS));
        assert_eq!(p.offer(100 * MS, 125), Offer::Deliver(101 * MS));
        // without it the first packet is like any other
        let mut p = pipe("delay=10ms");
        assert_eq!(p.offer(0, 60), Offer::Deliver(10 * MS));
    }

    #[test]
    fn byte_queue_limit() {
        let mut p = pipe("rate=1mbit,queue=3000b");
        assert!(matches!(p.offer(0, 1500), Offer::Deliver(_)));
        assert!(matches!(p.offer(0, 1500), Offer::Deliver(_)));
        assert!(matches!(p.offer(0, 100), Offer::Dropped(DropReason::Queue)));
        assert_eq!(p.counters.max_queue_bytes, 3000);
    }

    #[test]
    fn iid_loss_rate_and_determinism() {
        let fates = |seed: u64| -> Vec<bool> {
            let mut p = Pipe::new(format!("loss=1%,seed={seed}").parse().unwrap(), 0);
            (0..20_000)
                .map(|i| matches!(p.offer(i, 100), Offer::Dropped(_)))
                .collect()
        };
        let a = fates(42);
        let lost = a.iter().filter(|&&x| x).count();
        assert!((160..=240).contains(&lost), "{lost}");
        assert_eq!(a, fates(42));
        assert_ne!(a, fates(43));
    }

    #[test]
    fn gilbert_elliott_losses_come_in_bursts() {
        let mut p = pipe("ge=1%/25%/100%/0%,seed=3");
        let fates: Vec<bool> = (0..100_000)
            .map(|i| matches!(p.offer(i, 100), Offer::Dropped(_)))
            .collect();
        let lost = fates.iter().filter(|&&x| x).count() as f64;
        // Stationary P(bad) = p/(p+r) = 0.01/0.26 ≈ 3.85 %; mean burst length 1/r = 4.
        assert!((2_800.0..4_900.0).contains(&lost), "{lost}");
        let bursts = fates.windows(2).filter(|w| !w[0] && w[1]).count() as f64;
        let mean_burst = lost / bursts;
        assert!((3.0..5.0).contains(&mean_burst), "{mean_burst}");
    }

    #[test]
    fn jitter_never_reorders_unless_asked() {
        let mut p = pipe("delay=10ms,jitter=5ms,seed=1");
        let mut last = 0;
        let mut spread = (Nanos::MAX, 0);
        for i in 0..1000 {
            let now = i * 100_000;
            let Offer::Deliver(t) = p.offer(now, 100) else {
                panic!()
            };
            assert!(t >= last);
            last = t;
        }
        // Sparse packets (further apart than the jitter range) see the whole range.
        for i in 0..1000 {
            let now = 1_000 * MS + i * 20 * MS;
            let Offer::Deliver(t) = p.offer(now, 100) else {
                panic!()
            };
            spread = (spread.0.min(t - now), spread.1.max(t - now));
        }
        assert!(spread.0 < 6 * MS && spread.1 > 14 * MS, "{spread:?}");
        let mut p = pipe("delay=10ms,jitter=5ms,seed=1,reorder=1");
        let times: Vec<Nanos> = (0..1000)
            .map(|i| match p.offer(i * 100_000, 100) {
                Offer::Deliver(t) => t,
                _ => unreachable!(),
            })
            .collect();
        assert!(times.windows(2).any(|w| w[1] < w[0]));
    }
}
