//! ACK-policy shaping: hold and thin a client's pure ACKs so that a fast-ACKing Linux client
//! looks like a delayed-ACK client (ACK every k segments, or after a timeout). Monkey's replay
//! error came mostly from Linux clients ACKing faster than the traced Windows clients; this
//! removes that cause in the network, without patching the client's kernel.
//!
//! Per connection, pure: the engine feeds it the client's segments and the server's data
//! segments with the time, and it answers what to do with the packet (and with an ACK it held
//! earlier). Rules:
//! * the first ACK (the handshake's), ACKs carrying SACK, duplicate ACKs, window-only
//!   updates and ACKs that close the window (zero) pass at once (they are loss or
//!   flow-control signals), releasing a held ACK first;
//! * any other pure ACK passes once it acknowledges `every` segments (bytes / the largest
//!   server segment seen) beyond the last ACK that passed; otherwise it is held, replacing
//!   (thinning) an ACK held before, and released when the first held ACK has waited `timeout`;
//! * a client segment with data, SYN, FIN or RST passes; an ACK held before it is dropped if
//!   the segment acknowledges as much (it piggybacks the ACK), else sent just before it.

use crate::classify::{TcpMeta, TCP_ACK};
use crate::config::AckPolicy;
use crate::units::Nanos;

/// MSS assumed until a server data segment has been seen.
pub const DEFAULT_MSS: u32 = 1448;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held<T> {
    pub token: T,
    pub ip_len: u32,
    pub ack: u32,
    pub deadline: Nanos,
}

/// What to do with an ACK held earlier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Previous<T> {
    /// Send it now, before the current packet.
    Send(T, u32),
    /// Superseded: drop it.
    Discard(T),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Current {
    Pass,
    /// Held; arm a timer for this deadline (with this generation) if `Some`.
    Hold(Option<(Nanos, u32)>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision<T> {
    pub previous: Option<Previous<T>>,
    pub current: Current,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AckCounters {
    /// Pure ACKs dropped because a later ACK superseded them.
    pub thinned: u64,
    /// Pure ACKs held at least once.
    pub held: u64,
    /// Held ACKs released by the timeout.
    pub timeouts: u64,
}

#[derive(Clone, Debug)]
pub struct AckShaper<T> {
    pub policy: AckPolicy,
    mss: u32,
    last_passed: Option<u32>,
    last_seen: Option<(u32, u16)>,
    held: Option<Held<T>>,
    generation: u32,
    pub counters: AckCounters,
}

fn seq_ge(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) >= 0
}

impl<T: Copy> AckShaper<T> {
    pub fn new(policy: AckPolicy) -> Self {
        AckShaper {
            policy,
            mss: 0,
            last_passed: None,
            last_seen: None,
            held: None,
            generation: 0,
            counters: AckCounters::default(),
        }
    }

    pub fn held(&self) -> Option<&Held<T>> {
        self.held.as_ref()
    }

    /// A server segment went by: learn the segment size.
    pub fn on_server(&mut self, tcp: &TcpMeta) {
        self.mss = self.mss.max(tcp.payload_len);
    }

    fn take_previous(&mut self, discard: bool) -> Option<Previous<T>> {
        self.held.take().map(|h| {
            if discard {
                self.counters.thinned += 1;
                Previous::Discard(h.token)
            } else {
                Previous::Send(h.token, h.ip_len)
            }
        })
    }

    /// A client segment arrived at `now`.
    pub fn on_client(&mut self, now: Nanos, tcp: &TcpMeta, token: T, ip_len: u32) -> Decision<T> {
        let has_ack = tcp.flags & TCP_ACK != 0;
        if !tcp.is_pure_ack() {
            let piggybacks = has_ack && self.held.as_ref().is_some_and(|h| seq_ge(tcp.ack, h.ack));
            let previous = self.take_previous(piggybacks);
            if has_ack {
                self.note_passed(tcp.ack);
                self.last_seen = Some((tcp.ack, tcp.window));
            }
            return Decision {
                previous,
                current: Current::Pass,
            };
        }
        let signal = match (self.last_passed, self.last_seen) {
            (None, _) => true,
            (_, Some((a, w))) if a == tcp.ack => {
                let _ = w;
                true // duplicate ACK or window update
            }
            // a closed window: the server must stop now, not a timeout later
            _ => tcp.sack || tcp.window == 0,
        };
        let behind = self.last_passed.is_some_and(|p| !seq_ge(tcp.ack, p));
        self.last_seen = Some((tcp.ack, tcp.window));
        if signal || behind {
            let previous = self.take_previous(false);
            self.note_passed(tcp.ack);
            return Decision {
                previous,
                current: Current::Pass,
            };
        }
        let mss = if self.mss == 0 { DEFAULT_MSS } else { self.mss };
        let acked = tcp.ack.wrapping_sub(self.last_passed.unwrap_or(tcp.ack));
        let segments = acked.div_ceil(mss);
        if segments >= self.policy.every {
            let previous = self.take_previous(true);
            self.note_passed(tcp.ack);
            return Decision {
                previous,
                current: Current::Pass,
            };
        }
        self.counters.held += 1;
        match self.held.as_mut() {
            Some(h) => {
                let old = h.token;
                h.token = token;
                h.ip_len = ip_len;
                h.ack = tcp.ack;
                self.counters.thinned += 1;
                Decision {
                    previous: Some(Previous::Discard(old)),
                    current: Current::Hold(None),
                }
            }
            None => {
                self.generation = self.generation.wrapping_add(1);
                let deadline = now + self.policy.timeout;
                self.held = Some(Held {
                    token,
                    ip_len,
                    ack: tcp.ack,
                    deadline,
                });
                Decision {
                    previous: None,
                    current: Current::Hold(Some((deadline, self.generation))),
                }
            }
        }
    }

    /// The timer armed for `generation` fired: the held ACK to send, if it is still held.
    pub fn on_timer(&mut self, generation: u32) -> Option<Held<T>> {
        if generation != self.generation {
            return None;
        }
        let h = self.held.take()?;
        self.counters.timeouts += 1;
        self.note_passed(h.ack);
        Some(h)
    }

    /// Releases a held ACK unconditionally (the rule is going away).
    pub fn flush(&mut self) -> Option<Held<T>> {
        self.held.take()
    }

    fn note_passed(&mut self, ack: u32) {
        self.last_passed = Some(match self.last_passed {
            Some(p) if !seq_ge(ack, p) => p,
            _ => ack,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::{TCP_PSH, TCP_SYN};

    fn seg(flags: u8, ack: u32, payload: u32, sack: bool) -> TcpMeta {
        TcpMeta {
            sport: 1,
            dport: 2,
            flags,
            seq: 0,
            ack,
            window: 100,
            payload_len: payload,
            sack,
        }
    }
    fn ack(a: u32) -> TcpMeta {
        seg(TCP_ACK, a, 0, false)
    }
    const MS: Nanos = 1_000_000;

    fn shaper(every: u32) -> AckShaper<u32> {
        let mut s = AckShaper::new(AckPolicy {
            every,
            timeout: 200 * MS,
        });
        s.on_server(&seg(TCP_ACK, 0, 1000, false));
        s
    }

    #[test]
    fn linux_ack_every_two_becomes_ack_every_four() {
        let mut s = shaper(4);
        // Handshake ACK passes.
        assert_eq!(s.on_client(0, &ack(1), 0, 40).current, Current::Pass);
        // Linux ACKs every 2 segments: 2001, 4001, 6001, 8001...
        let d = s.on_client(MS, &ack(2001), 1, 40);
        assert_eq!(
            d,
            Decision {
                previous: None,
                current: Current::Hold(Some((201 * MS, 1)))
            }
        );
        let d = s.on_client(2 * MS, &ack(4001), 2, 40);
        assert_eq!(
            d,
            Decision {
                previous: Some(Previous::Discard(1)),
                current: Current::Pass
            }
        );
        let d = s.on_client(3 * MS, &ack(6001), 3, 40);
        assert!(matches!(d.current, Current::Hold(Some(_))));
        let d = s.on_client(4 * MS, &ack(8001), 4, 40);
        assert_eq!(d.previous, Some(Previous::Discard(3)));
        assert_eq!(d.current, Current::Pass);
        assert_eq!(s.counters.thinned, 2);
    }

    /// A client that stops reading closes its window with an ACK that also acknowledges new
    /// data; held, the server would send into a window that is gone until the timeout.
    #[test]
    fn an_ack_that_closes_the_window_passes_at_once() {
        let mut s = shaper(4);
        assert_eq!(s.on_client(0, &ack(1), 0, 40).current, Current::Pass);
        assert!(matches!(
            s.on_client(MS, &ack(1001), 1, 40).current,
            Current::Hold(Some(_))
        ));
        let mut closed = ack(2001);
        closed.window = 0;
        let d = s.on_client(2 * MS, &closed, 2, 40);
        assert_eq!(
            d,
            Decision {
                previous: Some(Previous::Send(1, 40)),
                current: Current::Pass
            }
        );
    }

    #[test]
    fn timeout_releases_the_latest_held_ack() {
        let mut s = shaper(4);
        s.on_client(0, &ack(1), 0, 40);
        let Current::Hold(Some((deadline, generation))) =
            s.on_client(MS, &ack(1001), 1, 40).current
        else {
            panic!()
        };
        // A newer ACK replaces the held one but keeps the deadline.
        let d = s.on_client(2 * MS, &ack(2001), 2, 40);
        assert_eq!(
            d,
            Decision {
                previous: Some(Previous::Discard(1)),
                current: Current::Hold(None)
            }
        );
        assert_eq!(deadline, 201 * MS);
        let h = s.on_timer(generation).unwrap();
        assert_eq!((h.token, h.ack), (2, 2001));
        assert_eq!(s.on_timer(generation), None);
        // The released ACK counts as passed: two more segments are not yet four.
        assert!(matches!(
            s.on_client(300 * MS, &ack(4001), 3, 40).current,
            Current::Hold(Some(_))
        ));
    }

    #[test]
    fn loss_signals_pass_at_once_and_release_the_held_ack_first() {
        let mut s = shaper(4);
        s.on_client(0, &ack(1), 0, 40);
        s.on_client(MS, &ack(1001), 1, 40);
        // Duplicate of the held ACK with SACK: send held first, then this one.
        let d = s.on_client(2 * MS, &seg(TCP_ACK, 1001, 0, true), 2, 52);
        assert_eq!(
            d,
            Decision {
                previous: Some(Previous::Send(1, 40)),
                current: Current::Pass
            }
        );
        // Plain duplicate ACK passes too.
        assert_eq!(
            s.on_client(3 * MS, &ack(1001), 3, 40).current,
            Current::Pass
        );
    }

    #[test]
    fn data_from_the_client_piggybacks_a_held_ack() {
        let mut s = shaper(4);
        s.on_client(0, &ack(1), 0, 40);
        s.on_client(MS, &ack(1001), 1, 40);
        let d = s.on_client(2 * MS, &seg(TCP_ACK | TCP_PSH, 1001, 300, false), 2, 340);
        assert_eq!(
            d,
            Decision {
                previous: Some(Previous::Discard(1)),
                current: Current::Pass
            }
        );
        // A SYN (no ACK flag) in front of a held ACK sends the held ACK first.
        s.on_client(3 * MS, &ack(2001), 3, 40);
        let d = s.on_client(4 * MS, &seg(TCP_SYN, 0, 0, false), 4, 60);
        assert_eq!(d.previous, Some(Previous::Send(3, 40)));
    }
}
