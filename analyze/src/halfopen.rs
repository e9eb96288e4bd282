//! A connection that has sent nothing but SYNs: the compact entry that keeps a SYN scan or
//! flood from costing a full [`Conn`] per source.
//!
//! A [`Conn`] is about 2 KiB with its first allocations, almost all of it for data that a
//! connection attempt never has. A `HalfOpen` keeps only what `Conn::handle` reads from a pure
//! SYN (no ACK, FIN, RST or payload) — the first SYN and up to [`RETRIES`] retransmissions of
//! it — and becomes a full `Conn` by replaying those SYNs through `Conn::handle`, on the first
//! packet it cannot hold (the SYN-ACK, any data, a SYN with a new ISN or other options, a
//! fourth SYN, one more than 4.29 s after the first) or when the connection is closed. The
//! replay is the same sequence of calls a `Conn` would have had from the start, so every
//! record is the same as without this entry (`tests::half_open_entries_change_no_record`).

use mimic_core::packet::{TcpFlags, TcpOptions, TcpSegment};
use mimic_core::{FlowKey, SeqNum, Timestamp};

use crate::config::Config;
use crate::conn::{Conn, Dir};

/// SYN retransmissions a half-open entry holds (Linux resends an unanswered SYN after 1 s and
/// 3 s, nmap once); the next packet makes it a full `Conn`.
pub(crate) const RETRIES: usize = 2;

// bits of `HalfOpen::bits`
const SIDE1: u8 = 1;
const IP_ID: u8 = 2;
const MSS: u8 = 4;
const WSCALE: u8 = 8;
const SACK_OK: u8 = 16;
const TS: u8 = 32;

/// A SYN retransmission: what differs from the first SYN.
#[derive(Clone, Copy, Debug, Default)]
struct Retry {
    /// Nanoseconds after the first SYN.
    after: u32,
    ip_id: u16,
    flags: u16,
}

/// The SYNs of a connection attempt, as `Conn::handle` would read them.
#[derive(Clone, Debug)]
pub(crate) struct HalfOpen {
    /// The connection's id: the number of its first frame.
    pub id: u64,
    t: Timestamp,
    seq: u32,
    ack: u32,
    ip_id: u16,
    flags: u16,
    window: u16,
    mss: u16,
    hdr_len: u16,
    wscale: u8,
    bits: u8,
    retries: u8,
    retry: [Retry; RETRIES],
}

/// A SYN with no ACK, FIN, RST or payload: all a half-open entry holds.
fn pure_syn(seg: &TcpSegment) -> bool {
    let f = seg.flags;
    f.syn() && !f.ack() && !f.fin() && !f.rst() && seg.payload_len == 0
}

fn option_bits(o: &TcpOptions) -> u8 {
    (if o.mss.is_some() { MSS } else { 0 })
        | (if o.wscale.is_some() { WSCALE } else { 0 })
        | (if o.sack_permitted { SACK_OK } else { 0 })
        | (if o.timestamp.is_some() { TS } else { 0 })
}

impl HalfOpen {
    /// The entry for a connection whose first packet (`id`, from `side`, at `t`) is `seg`, if
    /// that packet is a pure SYN.
    pub fn new(id: u64, side: Dir, t: Timestamp, seg: &TcpSegment) -> Option<HalfOpen> {
        if !pure_syn(seg) {
            return None;
        }
        let o = &seg.options;
        Some(HalfOpen {
            id,
            t,
            seq: seg.seq.0,
            ack: seg.ack.0,
            ip_id: seg.ip_id.unwrap_or(0),
            flags: seg.flags.0,
            window: seg.window,
            mss: o.mss.unwrap_or(0),
            hdr_len: seg.hdr_len,
            wscale: o.wscale.unwrap_or(0),
            bits: (if side == Dir::Rev { SIDE1 } else { 0 })
                | (if seg.ip_id.is_some() { IP_ID } else { 0 })
                | option_bits(o),
            retries: 0,
            retry: [Retry::default(); RETRIES],
        })
    }

    fn side(&self) -> Dir {
        Dir::of_swapped(self.bits & SIDE1 != 0)
    }

    /// Time of the latest SYN (as `Conn::t_last`: never before the first).
    pub fn t_last(&self) -> Timestamp {
        let after = self.retry[..self.retries as usize]
            .iter()
            .map(|r| r.after)
            .max()
            .unwrap_or(0);
        Timestamp::from_nanos(self.t.as_nanos() + after as i64)
    }

    /// Takes `seg` (from `side`, at `t`) if it is a retransmission of the first SYN that this
    /// entry can hold; false: the connection needs a full `Conn` for it.
    pub fn absorb(&mut self, side: Dir, t: Timestamp, seg: &TcpSegment) -> bool {
        let n = self.retries as usize;
        let after = t.as_nanos().checked_sub(self.t.as_nanos());
        let same = pure_syn(seg)
            && side == self.side()
            && seg.seq.0 == self.seq
            && seg.ack.0 == self.ack
            && seg.window == self.window
            && seg.hdr_len == self.hdr_len
            && seg.ip_id.is_some() == (self.bits & IP_ID != 0)
            && option_bits(&seg.options) == self.bits & !(SIDE1 | IP_ID)
            && seg.options.mss.unwrap_or(0) == self.mss
            && seg.options.wscale.unwrap_or(0) == self.wscale;
        match after {
            Some(a) if same && n < RETRIES && (0..=u32::MAX as i64).contains(&a) => {
                self.retry[n] = Retry {
                    after: a as u32,
                    ip_id: seg.ip_id.unwrap_or(0),
                    flags: seg.flags.0,
                };
                self.retries += 1;
                true
            }
            _ => false,
        }
    }

    /// The full connection: a new `Conn` given the same SYNs.
    pub fn promote(&self, cfg: &Config, key: FlowKey) -> Box<Conn> {
        let side = self.side();
        let (src, dst) = match side {
            Dir::Fwd => (key.src, key.dst),
            Dir::Rev => (key.dst, key.src),
        };
        let mut options = TcpOptions {
            mss: (self.bits & MSS != 0).then_some(self.mss),
            wscale: (self.bits & WSCALE != 0).then_some(self.wscale),
            sack_permitted: self.bits & SACK_OK != 0,
            ..TcpOptions::default()
        };
        // only its presence is read from a SYN without ACK (the values are not kept)
        if self.bits & TS != 0 {
            options.timestamp = Some((0, 0));
        }
        let mut seg = TcpSegment {
            vlan: key.vlan,
            src: src.addr,
            dst: dst.addr,
            sport: src.port,
            dport: dst.port,
            seq: SeqNum(self.seq),
            ack: SeqNum(self.ack),
            flags: TcpFlags(self.flags),
            window: self.window,
            options,
            payload_len: 0,
            payload: &[],
            ip_ecn: 0,
            hdr_len: self.hdr_len,
            ip_id: (self.bits & IP_ID != 0).then_some(self.ip_id),
        };
        let mut c = Box::new(Conn::new(self.id, key, self.t));
        c.handle(cfg, side, self.t, &seg);
        for r in &self.retry[..self.retries as usize] {
            seg.flags = TcpFlags(r.flags);
            seg.ip_id = (self.bits & IP_ID != 0).then_some(r.ip_id);
            let t = Timestamp::from_nanos(self.t.as_nanos() + r.after as i64);
            c.handle(cfg, side, t, &seg);
        }
        c
    }
}
