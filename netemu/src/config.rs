//! What a pipe does, as data: [`PipeConfig`] and its parts, with a one-line text syntax
//! (`delay=20ms,rate=10mbit,loss=1%,queue=50`) used on the command line, in pipe files and on
//! the control channel.
//!
//! Keys (all optional; unknown keys and impossible values are errors):
//!
//! | key | meaning | default |
//! |---|---|---|
//! | `delay=20ms` | one-way propagation delay, added after serialization | 0 |
//! | `rate=10mbit` | bottleneck rate in bit/s; counts the **IP packet** (IP header + transport header + payload, no Ethernet header) plus `overhead` bytes; `rate=unlimited` for none (`rate=0` is an error, as `0bit` is) | unlimited |
//! | `overhead=14` | bytes added to each packet's length for the rate (14 = Ethernet header, 38 = Ethernet on the wire with preamble, FCS and gap) | 0 |
//! | `burst=1500` | token bucket depth in bytes in front of the serializer: an idle pipe lets this many bytes leave at once, each later packet leaves when the bucket (refilled at `rate`) holds its length — a shaper (tc tbf/htb, dummynet's `burst`, a cable modem's token bucket) rather than a store-and-forward link, whose packets leave only when fully serialized | 0 |
//! | `queue=50` / `queue=64kb` | drop-tail queue limit in packets, or in bytes with a size unit; the packet being serialized counts | 50 packets |
//! | `loss=1%` | i.i.d. random loss on arrival | 0 |
//! | `ge=P/R/BAD/GOOD` | Gilbert–Elliott loss: P = P(good→bad), R = P(bad→good), BAD/GOOD = loss probability in each state (netem's `gemodel p r 1-h 1-k`) | off |
//! | `seed=42` | seed of the pipe's loss and jitter generator (same seed, same packets, same fate) | derived from the pipe's identity |
//! | `jitter=2ms` | extra delay uniform in [-J, +J] (total never below 0) | 0 |
//! | `reorder=1` | let jitter reorder packets (by default a packet never overtakes an earlier one) | 0 |
//! | `ack_every=4` | ACK policy (upstream pipes only): pass the client's pure ACKs only once they acknowledge this many segments... | off |
//! | `ack_timeout=200ms` | ...or once the oldest held ACK has waited this long | 200ms when `ack_every` is set |

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::units::{self, Nanos};

/// Queue limit of a pipe (drop-tail).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueLimit {
    Packets(u32),
    Bytes(u64),
}

/// Loss model, applied to each packet as it arrives at the pipe.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LossModel {
    None,
    /// Independent loss with this probability.
    Iid(f64),
    /// Two-state Markov chain (Gilbert–Elliott).
    GilbertElliott {
        p_good_to_bad: f64,
        p_bad_to_good: f64,
        loss_bad: f64,
        loss_good: f64,
    },
}

/// Delayed-ACK emulation for the client's pure ACKs (upstream pipes only): an ACK is passed
/// once it acknowledges `every` segments since the last ACK passed, or when the oldest held
/// ACK has waited `timeout`; a newer ACK supersedes (thins) a held one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckPolicy {
    pub every: u32,
    pub timeout: Nanos,
}

/// Everything a pipe does. Build one with [`PipeConfig::from_str`] or field by field.
#[derive(Clone, Debug, PartialEq)]
pub struct PipeConfig {
    pub delay: Nanos,
    /// Bits per second; 0 = no rate limit (and then no queueing).
    pub rate_bps: u64,
    /// Bytes added to each packet's IP length when charging the rate.
    pub overhead: u32,
    /// Token bucket depth (bytes) in front of the serializer; 0 = a store-and-forward link.
    pub burst: u32,
    pub queue: QueueLimit,
    pub loss: LossModel,
    pub seed: Option<u64>,
    pub jitter: Nanos,
    pub reorder: bool,
    pub ack: Option<AckPolicy>,
    /// Extra delay of the pipe's first packet only (and, as packets never overtake, of what
    /// follows it closely): a connection's SYN-ACK that waited behind other traffic of its
    /// link (a previous connection's tail) before the handshake. 0 = none.
    pub first_delay: Nanos,
}

pub const DEFAULT_QUEUE_PACKETS: u32 = 50;
pub const DEFAULT_ACK_TIMEOUT: Nanos = 200_000_000;

impl Default for PipeConfig {
    fn default() -> Self {
        PipeConfig {
            delay: 0,
            rate_bps: 0,
            overhead: 0,
            burst: 0,
            queue: QueueLimit::Packets(DEFAULT_QUEUE_PACKETS),
            loss: LossModel::None,
            seed: None,
            jitter: 0,
            reorder: false,
            ack: None,
            first_delay: 0,
        }
    }
}

/// A bad pipe specification; the message names the key and the value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("pipe spec `{}`: {msg}", units::quote(.spec))]
pub struct SpecError {
    pub spec: String,
    pub msg: String,
}

impl FromStr for PipeConfig {
    type Err = SpecError;

    fn from_str(spec: &str) -> Result<Self, SpecError> {
        let err = |msg: String| SpecError {
            spec: spec.to_string(),
            msg,
        };
        let mut c = PipeConfig::default();
        let mut ack_every: Option<u32> = None;
        let mut ack_timeout: Option<Nanos> = None;
        let mut loss_set = false;
        let pairs = units::key_values(spec).map_err(err)?;
        if pairs.is_empty() {
            // most often an unset shell variable (`--default "$PIPE"`): a pipe that only
            // forwards is spelled out
            return Err(err(
                "empty: give at least one KEY=VALUE (`delay=0ms` for a pipe that only forwards)"
                    .into(),
            ));
        }
        for (k, v) in pairs {
            let kv = |m: String| err(format!("{k}: {m}"));
            let qv = units::quote(v);
            match k {
                "delay" => c.delay = units::parse_duration(v).map_err(kv)?,
                "rate" | "bw" => c.rate_bps = units::parse_rate(v).map_err(kv)?,
                "overhead" => {
                    c.overhead = v.parse::<u32>().ok().filter(|&o| o <= 1000).ok_or_else(|| kv(format!("`{qv}` is not a byte count in 0..=1000")))?
                }
                "burst" => {
                    let b = units::parse_bytes(v).map_err(kv)?;
                    if b > 1 << 30 {
                        return Err(kv(format!("`{qv}`: a token bucket holds 0 to 1 GiB")));
                    }
                    c.burst = b as u32;
                }
                "queue" | "limit" => {
                    let t = v.to_ascii_lowercase();
                    c.queue = if let Some(n) = t.strip_suffix("pkts").or_else(|| t.strip_suffix("pkt")).or_else(|| t.strip_suffix('p')).or(Some(&t)).filter(|n| n.chars().all(|ch| ch.is_ascii_digit()) && !n.is_empty()) {
                        let n: u32 = n.parse().map_err(|_| kv(format!("`{qv}` is too large")))?;
                        if n == 0 || n > 1_000_000 {
                            return Err(kv(format!("`{qv}`: a queue holds 1 to 1,000,000 packets")));
                        }
                        QueueLimit::Packets(n)
                    } else {
                        let b = units::parse_bytes(v).map_err(kv)?;
                        if !(64..=1 << 30).contains(&b) {
                            return Err(kv(format!("`{qv}`: a byte queue holds 64 B to 1 GiB")));
                        }
                        QueueLimit::Bytes(b)
                    }
                }
                "loss" | "plr" => {
                    if loss_set {
                        return Err(err("give either loss= or ge=, not both".into()));
                    }
                    loss_set = true;
                    let p = units::parse_prob(v).map_err(kv)?;
                    c.loss = if p == 0.0 { LossModel::None } else { LossModel::Iid(p) };
                }
                "ge" => {
                    if loss_set {
                        return Err(err("give either loss= or ge=, not both".into()));
                    }
                    loss_set = true;
                    let f: Vec<&str> = v.split('/').collect();
                    if f.len() != 4 {
                        return Err(kv(format!("`{qv}` is not P/R/BAD/GOOD (e.g. ge=1%/30%/100%/0%)")));
                    }
                    let p: Vec<f64> = f.iter().map(|x| units::parse_prob(x)).collect::<Result<_, _>>().map_err(kv)?;
                    if p[1] == 0.0 {
                        return Err(kv("R (bad→good) of 0 would stay in the bad state forever".into()));
                    }
                    c.loss = LossModel::GilbertElliott { p_good_to_bad: p[0], p_bad_to_good: p[1], loss_bad: p[2], loss_good: p[3] };
                }
                "seed" => c.seed = Some(v.parse().map_err(|_| kv(format!("`{qv}` is not an unsigned integer")))?),
                "jitter" => c.jitter = units::parse_duration(v).map_err(kv)?,
                "first_delay" => c.first_delay = units::parse_duration(v).map_err(kv)?,
                "reorder" => {
                    c.reorder = match v {
                        "1" | "yes" | "true" | "on" => true,
                        "0" | "no" | "false" | "off" => false,
                        _ => return Err(kv(format!("`{qv}` is not 0 or 1"))),
                    }
                }
                "ack_every" => {
                    let n: u32 = v.parse().map_err(|_| kv(format!("`{qv}` is not a segment count")))?;
                    if !(1..=64).contains(&n) {
                        return Err(kv(format!("`{qv}`: ACK every 1 to 64 segments")));
                    }
                    ack_every = Some(n);
                }
                "ack_timeout" => {
                    let t = units::parse_duration(v).map_err(kv)?;
                    if t == 0 || t > 2_000_000_000 {
                        return Err(kv(format!("`{qv}`: the delayed-ACK timeout must be in (0, 2s]")));
                    }
                    ack_timeout = Some(t);
                }
                _ => {
                    return Err(err(format!(
                        "unknown key `{}` (known: delay, rate, overhead, burst, queue, loss, ge, seed, jitter, first_delay, reorder, ack_every, ack_timeout)",
                        units::quote(k)
                    )))
                }
            }
        }
        match (ack_every, ack_timeout) {
            (Some(every), t) => {
                c.ack = Some(AckPolicy {
                    every,
                    timeout: t.unwrap_or(DEFAULT_ACK_TIMEOUT),
                })
            }
            (None, Some(_)) => return Err(err("ack_timeout needs ack_every".into())),
            (None, None) => {}
        }
        Ok(c)
    }
}

impl fmt::Display for PipeConfig {
    /// The canonical spec string; parsing it gives back an equal config.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = vec![format!("delay={}", units::fmt_duration(self.delay))];
        parts.push(format!("rate={}", units::fmt_rate(self.rate_bps)));
        if self.overhead != 0 {
            parts.push(format!("overhead={}", self.overhead));
        }
        if self.burst != 0 {
            parts.push(format!("burst={}", self.burst));
        }
        parts.push(match self.queue {
            QueueLimit::Packets(n) => format!("queue={n}"),
            QueueLimit::Bytes(b) => format!("queue={b}b"),
        });
        match self.loss {
            LossModel::None => {}
            LossModel::Iid(p) => parts.push(format!("loss={}", units::fmt_prob(p))),
            LossModel::GilbertElliott {
                p_good_to_bad,
                p_bad_to_good,
                loss_bad,
                loss_good,
            } => parts.push(format!(
                "ge={}/{}/{}/{}",
                units::fmt_prob(p_good_to_bad),
                units::fmt_prob(p_bad_to_good),
                units::fmt_prob(loss_bad),
                units::fmt_prob(loss_good)
            )),
        }
        if let Some(s) = self.seed {
            parts.push(format!("seed={s}"));
        }
        if self.jitter != 0 {
            parts.push(format!("jitter={}", units::fmt_duration(self.jitter)));
        }
        if self.first_delay != 0 {
            parts.push(format!(
                "first_delay={}",
                units::fmt_duration(self.first_delay)
            ));
        }
        if self.reorder {
            parts.push("reorder=1".into());
        }
        if let Some(a) = self.ack {
            parts.push(format!("ack_every={}", a.every));
            parts.push(format!("ack_timeout={}", units::fmt_duration(a.timeout)));
        }
        f.write_str(&parts.join(","))
    }
}

impl Serialize for PipeConfig {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for PipeConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_issue_example() {
        let c: PipeConfig = "delay=20ms,rate=10mbit,loss=1%,queue=50".parse().unwrap();
        assert_eq!(c.delay, 20_000_000);
        assert_eq!(c.rate_bps, 10_000_000);
        assert_eq!(c.loss, LossModel::Iid(0.01));
        assert_eq!(c.queue, QueueLimit::Packets(50));
        assert_eq!(c.to_string().parse::<PipeConfig>().unwrap(), c);
    }

    #[test]
    fn round_trips_every_key() {
        let s = "delay=1500us,rate=1500kbit,overhead=14,burst=1514,queue=64000b,ge=1%/30%/100%/0%,seed=7,jitter=1ms,first_delay=150ms,reorder=1,ack_every=4,ack_timeout=150ms";
        let c: PipeConfig = s.parse().unwrap();
        assert_eq!(c.to_string(), s);
        assert_eq!(
            c.ack,
            Some(AckPolicy {
                every: 4,
                timeout: 150_000_000
            })
        );
    }

    #[test]
    fn rejects_bad_input_with_the_key() {
        let e = "delay=20ms,colour=red".parse::<PipeConfig>().unwrap_err();
        assert!(e.to_string().contains("unknown key `colour`"), "{e}");
        let e = "queue=0".parse::<PipeConfig>().unwrap_err();
        assert!(e.to_string().contains("queue"), "{e}");
        assert!("loss=2".parse::<PipeConfig>().is_err());
        assert!("loss=1%,ge=1%/1%/1%/1%".parse::<PipeConfig>().is_err());
        assert!("ack_timeout=10ms".parse::<PipeConfig>().is_err());
        assert!("delay=20ms,delay=10ms".parse::<PipeConfig>().is_err());
        assert!("delay".parse::<PipeConfig>().is_err());
        for empty in ["", " ", ",", " , "] {
            let e = empty.parse::<PipeConfig>().unwrap_err();
            assert!(e.to_string().contains("empty"), "{e}");
        }
        assert!("queue=10kb".parse::<PipeConfig>().is_ok());
        assert_eq!("burst=1.5kb".parse::<PipeConfig>().unwrap().burst, 1500);
        let e = "burst=2gb".parse::<PipeConfig>().unwrap_err();
        assert!(e.to_string().contains("burst"), "{e}");
        // rate=0 is not "unlimited" (which has its own name), as 0bit is not
        for zero in ["rate=0", "delay=5ms,rate=0,queue=10", "bw=0"] {
            let e = zero.parse::<PipeConfig>().unwrap_err().to_string();
            assert!(e.contains("write `unlimited`"), "{e}");
        }
        assert_eq!("rate=unlimited".parse::<PipeConfig>().unwrap().rate_bps, 0);
    }

    /// A spec of megabytes (a file pasted into a variable) gives a message of a line: the spec
    /// and the part at fault each quoted by their head and length, not in full, twice.
    #[test]
    fn a_huge_spec_is_quoted_by_its_head() {
        let junk = "x".repeat(5_000_000);
        for (spec, part) in [
            (format!("delay=1ms,{junk}"), "`xxxx"),
            (format!("delay=1ms,{junk}=1"), "unknown key `xxxx"),
            (format!("delay=1ms,seed={junk}"), "seed: `xxxx"),
        ] {
            let e = spec.parse::<PipeConfig>().unwrap_err().to_string();
            assert!(e.len() < 500, "{} bytes: {}", e.len(), &e[..500]);
            assert!(
                e.starts_with("pipe spec `delay=1ms,")
                    && e.contains(&format!("… ({} bytes)`", spec.len()))
                    && e.contains(part)
                    && e.contains(" bytes)"),
                "{e}"
            );
        }
        // a short one is quoted as it is
        let e = "delay=1ms,colour=red".parse::<PipeConfig>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "pipe spec `delay=1ms,colour=red`: unknown key `colour` (known: delay, rate, overhead, burst, queue, loss, ge, seed, jitter, first_delay, reorder, ack_every, ack_timeout)"
        );
    }
}
