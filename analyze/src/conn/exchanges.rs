//! Exchanges: request and response data units, their times and sizes, the response delay,
//! Monkey's query delay (§3.3.3) on every response, and the client's think time.

use mimic_core::time::dur;
use mimic_core::Timestamp;

use super::dir::Dir;
use super::push_sized;
use crate::config::Config;
use crate::http;
use crate::record::{Exchange, ReadRateBy};

/// Segments remembered per data unit (the query-delay test looks at the first ones), and per
/// connection in all.
const ADU_SEGS: u32 = 256;
const CONN_ADU_SEGS: usize = 1 << 16;
/// Points of the client's window profile remembered per response, and per connection in all.
const ADU_WIN_POINTS: u8 = 64;
const CONN_WIN_POINTS: usize = 1 << 12;
/// A window that moved by at least 1/this of the last point's is a new point of the profile:
/// smaller moves (a segment's worth of a large window, rounding to the window scale) are not.
const WIN_STEP: u32 = 8;

/// A data unit's first transmission: time, sequence range, and when the other side's ACK
/// covered it.
type AduSeg = (Timestamp, i64, i64, Option<Timestamp>);

/// An interval the client's advertised receive window stayed at zero, as the tap saw it: its
/// first zero-window segment, its next segment with an open window, and the server data it had
/// acknowledged when it closed (relative offset).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ZeroWindow {
    pub t_closed: Timestamp,
    pub t_open: Timestamp,
    pub acked: i64,
}

/// One application data unit: a maximal run of new data in one direction.
#[derive(Clone, Debug)]
struct Adu {
    dir: Dir,
    t_first: Timestamp,
    t_last: Timestamp,
    bytes: u64,
    start: i64,
    end: i64,
    /// This unit's first transmissions are `Exchanges::segs[seg_start..seg_start + seg_len]`.
    seg_start: u32,
    seg_len: u32,
    /// Segments before this index (into `Exchanges::segs`) have their ACK time set.
    acked_upto: u32,
    prefix: [u8; 16],
    prefix_len: u8,
    /// Whether the other side's window (raw), while this unit had data it had not acknowledged
    /// yet, fell below a quarter of the largest it had advertised before: its reader fell
    /// behind. Against the largest so far, not the connection's largest: a window that grows
    /// (receive-buffer autotuning) is not one that drained.
    drained: bool,
    /// How many points of the other side's window profile this unit has in
    /// `Exchanges::wins` (see [`Exchanges::on_window`]).
    win_points: u8,
    /// Since when the other side had acknowledged everything this unit sent so far (the
    /// sender idle, not waiting on the path or the receiver), and the total of such intervals
    /// that more of this unit followed.
    idle_since: Option<Timestamp>,
    idle_ns: i64,
}

/// The connection's data units in order, both directions.
#[derive(Clone, Debug, Default)]
pub(super) struct Exchanges {
    adus: Vec<Adu>,
    segs: Vec<AduSeg>,
    pub dropped: u64,
    /// The largest window (raw) each side advertised so far once the connection carried data,
    /// by the direction of the data it acknowledged.
    max_window: [u16; 2],
    /// The other side's window profile of each data unit, in order: (the unit's index, the
    /// unit's bytes acknowledged, the window advertised then, raw).
    wins: Vec<(u32, u32, u16)>,
}

impl Exchanges {
    /// Per-segment hook: `new_bytes` of new data in `[start, end)` sent in direction `d` at
    /// `t`; `payload`'s first bytes name an HTTP method or status.
    #[allow(clippy::too_many_arguments)]
    pub fn on_new_data(
        &mut self,
        cfg: &Config,
        d: Dir,
        t: Timestamp,
        start: i64,
        end: i64,
        new_bytes: u64,
        payload: &[u8],
    ) {
        let room = self.segs.len() < CONN_ADU_SEGS;
        if let Some(a) = self.adus.last_mut() {
            if a.dir == d {
                if let Some(since) = a.idle_since.take() {
                    a.idle_ns += t.nanos_since(since).max(0);
                }
                a.t_last = a.t_last.max(t);
                a.bytes += new_bytes;
                a.end = a.end.max(end);
                if a.seg_len < ADU_SEGS && room {
                    push_sized(&mut self.segs, (t, start, end, None), 32);
                    a.seg_len += 1;
                }
                return;
            }
        }
        if self.adus.len() >= cfg.max_exchanges * 2 {
            self.dropped += 1;
            return;
        }
        let mut prefix = [0u8; 16];
        let n = payload.len().min(16);
        prefix[..n].copy_from_slice(&payload[..n]);
        push_sized(
            &mut self.adus,
            Adu {
                dir: d,
                t_first: t,
                t_last: t,
                bytes: new_bytes,
                start,
                end,
                seg_start: self.segs.len() as u32,
                seg_len: room as u32,
                acked_upto: self.segs.len() as u32,
                prefix,
                prefix_len: n as u8,
                drained: false,
                win_points: 0,
                idle_since: None,
                idle_ns: 0,
            },
            16,
        );
        if room {
            push_sized(&mut self.segs, (t, start, end, None), 32);
        }
    }

    /// Per-segment hook: a pure retransmission of `[start, end)` in direction `d` at `t` still
    /// extends its data unit's last-packet time.
    pub fn on_resend(&mut self, d: Dir, t: Timestamp, start: i64, end: i64) {
        for a in self.adus.iter_mut().rev() {
            if a.dir == d && a.start < end && start < a.end {
                a.t_last = a.t_last.max(t);
                break;
            }
        }
    }

    /// Per-ACK hook: the other side acknowledged direction `d`'s data up to `a` at `t` (the ACK
    /// times of response segments, for the query-delay test).
    #[inline]
    pub fn on_advance(&mut self, d: Dir, t: Timestamp, a: i64) {
        for adu in self.adus.iter_mut().rev().take(4).filter(|x| x.dir == d) {
            let end = adu.seg_start + adu.seg_len;
            while adu.acked_upto < end && self.segs[adu.acked_upto as usize].2 <= a {
                self.segs[adu.acked_upto as usize].3 = Some(t);
                adu.acked_upto += 1;
            }
            if a >= adu.end {
                adu.idle_since.get_or_insert(t);
            }
        }
    }

    /// Per-segment hook: the side opposite to `d` advertised `window` (raw) with `d`'s data
    /// acknowledged up to `acked`; while the latest unit (of direction `d`) has data it has not
    /// acknowledged, a window below a quarter of the largest so far marks it drained (the
    /// receiver fell behind reading).
    ///
    /// The same windows, while the unit has data outstanding, make its window profile: a point
    /// where the window is first seen, and where it moved by 1/[`WIN_STEP`] or more from the
    /// last point (a zero window is a stall, kept apart; at most [`ADU_WIN_POINTS`] a unit).
    #[inline]
    pub fn on_window(&mut self, d: Dir, window: u16, acked: i64) {
        let max = &mut self.max_window[d as usize];
        let n = self.adus.len();
        if let Some(a) = self.adus.last_mut() {
            if a.dir == d && acked >= a.start && acked < a.end {
                if (window as u32) * 4 < *max as u32 {
                    a.drained = true;
                }
                // a unit with points of its own has the last one (only the latest unit
                // gets points)
                let moved = match self.wins.last() {
                    Some(&(_, _, w)) if a.win_points > 0 => {
                        (window as u32).abs_diff(w as u32) * WIN_STEP >= w as u32
                    }
                    _ => true,
                };
                if window > 0
                    && moved
                    && a.win_points < ADU_WIN_POINTS
                    && self.wins.len() < CONN_WIN_POINTS
                {
                    let at = (acked - a.start).min(u32::MAX as i64) as u32;
                    push_sized(&mut self.wins, ((n - 1) as u32, at, window), 8);
                    a.win_points += 1;
                }
            }
        }
        // the largest so far counts from the first data unit on, as the connection's largest
        // window after data does (a handshake's last ACK can offer more than the buffer the
        // reader then keeps)
        if !self.adus.is_empty() {
            *max = (*max).max(window);
        }
    }

    /// Last-packet time of direction `d`'s latest data unit.
    pub fn last_data_t(&self, d: Dir) -> Option<Timestamp> {
        self.adus
            .iter()
            .rev()
            .find(|a| a.dir == d)
            .map(|a| a.t_last)
    }

    /// Finish step: pairs request and response data units into exchanges and runs the
    /// query-delay test. Think time is the client's pause before a request: after the previous
    /// response, or for the first request after the handshake completed (`connected`).
    /// `closed`: the intervals the client's window stayed at zero, in order.
    /// `scale`: the client's window scale (0 where scaling is off), for the window profiles.
    pub fn finish(
        &self,
        client: Dir,
        mss: u32,
        scale: u8,
        connected: Option<Timestamp>,
        closed: &[ZeroWindow],
    ) -> Vec<Exchange> {
        let adus = &self.adus;
        let mut wins = self.wins.iter().peekable();
        let mut out: Vec<Exchange> = Vec::with_capacity(adus.len().div_ceil(2));
        let mut i = 0;
        let mut prev_resp_last: Option<Timestamp> = connected;
        while i < adus.len() {
            // data units alternate sides: a request is followed by its response, if any;
            // data the server sent first is a response without a request
            let (req, resp_idx) = if adus[i].dir == client {
                let has_resp = i + 1 < adus.len();
                i += 1 + has_resp as usize;
                (
                    Some(&adus[i - 1 - has_resp as usize]),
                    has_resp.then_some(i - 1),
                )
            } else {
                i += 1;
                (None, Some(i - 1))
            };
            let resp = resp_idx.map(|k| &adus[k]);
            let method = req.and_then(|r| http::request_method(&r.prefix[..r.prefix_len as usize]));
            let status =
                resp.and_then(|r| http::response_status(&r.prefix[..r.prefix_len as usize]));
            let (query_delay, header) = match resp {
                Some(r) => query_delay(
                    r,
                    &self.segs[r.seg_start as usize..(r.seg_start + r.seg_len) as usize],
                    mss,
                ),
                None => (None, None),
            };
            let think = match (prev_resp_last, req) {
                (Some(p), Some(r)) => Some(dur::ns_to_us(r.t_first.nanos_since(p))),
                _ => None,
            };
            let response_delay = match (req, resp) {
                (Some(q), Some(r)) => Some(dur::ns_to_us(r.t_first.nanos_since(q.t_last))),
                _ => None,
            };
            let stalls = resp.map(|r| stalled(r, closed)).unwrap_or_default();
            let (zero_window_us, zero_window_at_bytes) = match resp {
                Some(_) => (
                    Some(stalls.iter().map(|s| s.1).sum::<i64>()),
                    stalls.first().map(|s| s.0),
                ),
                None => (None, None),
            };
            let read_rate_bps = resp.and_then(|r| read_rate(r, closed, query_delay.unwrap_or(0)));
            // the response's window profile: its unit's points, in bytes
            let mut rwin_profile = Vec::new();
            while let Some(&&(k, at, w)) = wins.peek() {
                match resp_idx {
                    Some(ri) if k as usize <= ri => {
                        if k as usize == ri {
                            rwin_profile.push((at as u64, (w as u64) << scale.min(14)));
                        }
                        wins.next();
                    }
                    _ => break,
                }
            }
            if let Some(r) = resp {
                // the client had the response when it acknowledged the last byte (seen here
                // after the same upstream delay as its next request), not when the server sent
                // it: on a slow link those are a transfer time apart, and a think time from the
                // latter makes a replay's client wait that long again
                let acked = r
                    .seg_len
                    .checked_sub(1)
                    .and_then(|i| self.segs.get((r.seg_start + i) as usize))
                    .filter(|s| s.2 >= r.end)
                    .and_then(|s| s.3);
                prev_resp_last = Some(acked.map_or(r.t_last, |a| a.max(r.t_last)));
            }
            out.push(Exchange {
                seq: out.len() as u32,
                t_req_first: req.map(|r| r.t_first),
                t_req_last: req.map(|r| r.t_last),
                req_bytes: req.map_or(0, |r| r.bytes),
                t_resp_first: resp.map(|r| r.t_first),
                t_resp_last: resp.map(|r| r.t_last),
                resp_bytes: resp.map_or(0, |r| r.bytes),
                response_delay_us: response_delay,
                query_delay_us: query_delay,
                header_bytes: header,
                think_time_us: think,
                method,
                status,
                zero_window_us,
                zero_window_at_bytes,
                zero_window_stalls: stalls,
                read_rate_bps,
                read_rate_by: read_rate_bps.map(|_| ReadRateBy::Window),
                rwin_profile,
                server_idle_us: resp.map(|r| dur::ns_to_us(r.idle_ns)),
            });
        }
        out
    }
}

/// The intervals the client's window stayed closed while the server still had response `r`
/// to send, in order, each as the response bytes it had acknowledged when it closed and how
/// long it stayed closed (µs): those that closed inside the response (acknowledged at least
/// its first byte and less than all of it) before the server sent its last byte. A window
/// that closes only once the whole response is out (the client reads it later) holds no
/// server byte back.
fn stalled(r: &Adu, closed: &[ZeroWindow]) -> Vec<(u64, i64)> {
    closed
        .iter()
        .filter(|w| w.acked >= r.start && w.acked < r.end && w.t_closed < r.t_last)
        .map(|w| {
            (
                (w.acked - r.start) as u64,
                dur::ns_to_us(w.t_open.nanos_since(w.t_closed).max(0)),
            )
        })
        .collect()
}

/// The rate (TCP payload bits per second) the client read response `r` at while its window
/// was open, where the window showed that it read slower than the data came: it closed
/// (`closed`, the intervals inside the response), or fell below a quarter of the largest the
/// client had advertised before, while response data was outstanding (`Adu::drained`). The response's bytes
/// over the time from its first to its last packet less the closed intervals and the server's
/// own pause (`query_delay_us`, where it is not a closed interval already: a server held back
/// by a closed window looks like one that paused). None where the window never showed it: a
/// client that reads at once keeps its window open whatever the path does, so the path's rate
/// is not taken for the client's.
fn read_rate(r: &Adu, closed: &[ZeroWindow], query_delay_us: i64) -> Option<f64> {
    let inside = || {
        closed
            .iter()
            .filter(|w| w.acked >= r.start && w.acked < r.end && w.t_closed < r.t_last)
    };
    if inside().next().is_none() && !r.drained {
        return None;
    }
    // the time the server was held back: the closed intervals and the query delay, their
    // overlap once
    let q_end = r.t_first.add_nanos(query_delay_us.max(0) * 1000);
    let mut held_ns = q_end.nanos_since(r.t_first);
    for w in inside() {
        let overlap = w
            .t_open
            .min(q_end)
            .nanos_since(w.t_closed.max(r.t_first))
            .max(0);
        held_ns += w.t_open.nanos_since(w.t_closed).max(0) - overlap;
    }
    let open_ns = r.t_last.nanos_since(r.t_first) - held_ns;
    (open_ns > 0 && r.bytes > 0).then(|| r.bytes as f64 * 8.0 * 1e9 / open_ns as f64)
}

/// How much longer than its path allows a response must take before the client's ACK clock
/// counts as slower than the path: the open time over this times the path's time ...
const ACK_CLOCK_SLOWER: f64 = 1.2;
/// ... plus this (µs): a LAN slow start, timer and ACK granularity.
const ACK_CLOCK_SLACK_US: f64 = 5_000.0;

/// Finish step, once the bottleneck rate is known: the read rate of responses whose client's
/// window stayed open but whose ACKs fell behind what its path delivered (`ReadRateBy::AckClock`).
/// A response that took longer, first to last packet less the server's pause (its query
/// delay, or the time it had all it sent acknowledged and sent nothing, whichever is longer),
/// than
/// [`ACK_CLOCK_SLOWER`] x (its IP bytes at the bottleneck rate `bw_bps` plus one `min_rtt_us`
/// per slow-start round) + [`ACK_CLOCK_SLACK_US`] was held back by something outside the
/// network and the server: on a connection without real loss (`lossless`), with the client's
/// window never closed, the server sent as its client's ACKs came, and those came late (a busy
/// client host: ACKs silent for tens of ms, spurious tail-loss probes). That client read the
/// response at `resp_bytes / open time`, as a window-drained one does. A client whose ACK
/// clock followed its bottleneck took about the path's time and gets none; responses with a
/// read rate (or a closed window) already keep theirs.
///
/// Slow-start rounds: from one segment, growing by half per round (a delayed-ACK receiver),
/// until the response is out: generous, so that a server with a small initial window (the
/// change a prediction judges) is not taken for a slow client.
pub(super) fn ack_clock_rates(
    exchanges: &mut [Exchange],
    bw_bps: Option<f64>,
    min_rtt_us: Option<i64>,
    mss: u32,
    lossless: bool,
) {
    let Some(bw) = bw_bps.filter(|b| b.is_finite() && *b > 0.0) else {
        return;
    };
    if !lossless || mss == 0 {
        return;
    }
    let rtt_us = min_rtt_us.unwrap_or(0).max(0) as f64;
    for e in exchanges.iter_mut() {
        if e.read_rate_bps.is_some() || e.zero_window_us.unwrap_or(0) > 0 || e.resp_bytes == 0 {
            continue;
        }
        let (Some(first), Some(last)) = (e.t_resp_first, e.t_resp_last) else {
            continue;
        };
        // the server's own pauses: its query delay, or the time it had everything it sent
        // acknowledged and sent nothing (a server writing in chunks), whichever is longer
        let held_us = e
            .query_delay_us
            .unwrap_or(0)
            .max(e.server_idle_us.unwrap_or(0));
        let open_us = dur::ns_to_us(last.nanos_since(first)) as f64 - held_us as f64;
        let segs = e.resp_bytes.div_ceil(mss as u64) as f64;
        // TCP/IP headers with timestamps: 52 bytes a segment
        let ip_bytes = e.resp_bytes as f64 + 52.0 * segs;
        let rounds = ((segs + 1.0).ln() / 1.5f64.ln()).ceil();
        let path_us = ip_bytes * 8.0 / bw * 1e6 + rounds * rtt_us;
        if open_us > ACK_CLOCK_SLOWER * path_us + ACK_CLOCK_SLACK_US {
            e.read_rate_bps = Some(e.resp_bytes as f64 * 8.0 * 1e6 / open_us);
            e.read_rate_by = Some(ReadRateBy::AckClock);
        }
    }
}

/// First request byte → last response byte (Monkey §5.1), µs.
pub(super) fn response_time(exchanges: &[Exchange]) -> Option<i64> {
    let first_req = exchanges.iter().find_map(|e| e.t_req_first);
    let last_resp = exchanges.iter().rev().find_map(|e| e.t_resp_last);
    match (first_req, last_resp) {
        (Some(a), Some(b)) if b >= a => Some(dur::ns_to_us(b.nanos_since(a))),
        _ => None,
    }
}

/// Monkey's query-delay algorithm (§3.3.3), applied to one response: walk the response's
/// segments in sending order; the first segment `c` sent after its predecessor `p` was
/// acknowledged (the server had room but no data), or following a sub-MSS `p` (the end of
/// what the server had written), begins the part that waited on the query. Returns the delay
/// from the first response segment to `c` and the bytes sent before `c`; (0, all bytes) when
/// no such split exists.
fn query_delay(r: &Adu, segs: &[AduSeg], mss: u32) -> (Option<i64>, Option<u64>) {
    let Some(&(t0, s0, _, _)) = segs.first() else {
        return (None, None);
    };
    for w in segs.windows(2) {
        let (pt, ps, pe, pack) = w[0];
        let (ct, cs, _, _) = w[1];
        let acked_before = pack.is_some_and(|a| ct > a) && ct > pt;
        let short = mss > 0 && ((pe - ps) as u32) < mss;
        if acked_before || short {
            return (
                Some(dur::ns_to_us(ct.nanos_since(t0))),
                Some((cs - s0).max(0) as u64),
            );
        }
    }
    (Some(0), Some(r.bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One response of `bytes` whose first and last packets are `span_ms` apart (whole
    /// milliseconds: a tap with a coarse clock), the server's pause `qd_us`.
    fn response(bytes: u64, span_ms: i64, qd_us: i64) -> Exchange {
        let t0 = Timestamp::from_nanos(1_700_000_000_000_000_000);
        Exchange {
            seq: 0,
            t_req_first: Some(t0),
            t_req_last: Some(t0),
            req_bytes: 100,
            t_resp_first: Some(t0.add_nanos(1_000_000)),
            t_resp_last: Some(t0.add_nanos((1 + span_ms) * 1_000_000)),
            resp_bytes: bytes,
            response_delay_us: Some(1000),
            query_delay_us: Some(qd_us),
            header_bytes: Some(bytes),
            think_time_us: Some(0),
            method: None,
            status: None,
            zero_window_us: Some(0),
            zero_window_at_bytes: None,
            zero_window_stalls: Vec::new(),
            read_rate_bps: None,
            read_rate_by: None,
            rwin_profile: Vec::new(),
            server_idle_us: Some(0),
        }
    }

    fn rate(mut e: Exchange, bw: Option<f64>, rtt_us: i64, lossless: bool) -> Exchange {
        ack_clock_rates(
            std::slice::from_mut(&mut e),
            bw,
            Some(rtt_us),
            1448,
            lossless,
        );
        e
    }

    /// 300,000 bytes behind a 50 Mbit/s bottleneck at a 50 µs RTT need about 50 ms (their
    /// IP bytes at the rate, 14 slow-start rounds of 50 µs): taking 100 ms with the window
    /// open and no loss, the client's ACKs fell behind its path, and it read at 24 Mbit/s.
    /// 60 ms is within 1.2 x + 5 ms of the path's time: nothing. The pacing evidence is
    /// named (`ack_clock`), and a window-drained read rate already there is kept.
    #[test]
    fn a_response_slower_than_its_path_with_the_window_open_gets_an_ack_clock_rate() {
        let e = rate(response(300_000, 100, 0), Some(50e6), 50, true);
        let want = 300_000.0 * 8.0 / 0.100;
        let got = e.read_rate_bps.expect("slower than its path: a read rate");
        assert!((got - want).abs() < 1.0, "{got} against {want}");
        assert_eq!(e.read_rate_by, Some(ReadRateBy::AckClock));
        // within the path's time (and slack): none
        let e = rate(response(300_000, 60, 0), Some(50e6), 50, true);
        assert_eq!((e.read_rate_bps, e.read_rate_by), (None, None));
        // the server's own pause is not the client's: 100 ms with 45 ms of query delay, or
        // with 45 ms in which it had all it sent acknowledged (a server writing in chunks)
        let e = rate(response(300_000, 100, 45_000), Some(50e6), 50, true);
        assert_eq!(e.read_rate_bps, None);
        let mut chunked = response(300_000, 100, 0);
        chunked.server_idle_us = Some(45_000);
        assert_eq!(rate(chunked, Some(50e6), 50, true).read_rate_bps, None);
        // a read rate the window showed stays, with its evidence
        let mut w = response(300_000, 100, 0);
        w.read_rate_bps = Some(7e6);
        w.read_rate_by = Some(ReadRateBy::Window);
        let w = rate(w, Some(50e6), 50, true);
        assert_eq!(
            (w.read_rate_bps, w.read_rate_by),
            (Some(7e6), Some(ReadRateBy::Window))
        );
    }

    /// What explains a slow response is not the client's ACK clock: real loss on the
    /// connection, a window that closed (replayed as stalls), no bottleneck estimate, or slow
    /// start on a long path (100 ms RTT: 14 rounds from one segment are 1.4 s, so a server
    /// with a small initial window is not taken for a slow client).
    #[test]
    fn loss_a_closed_window_no_estimate_or_slow_start_give_no_ack_clock_rate() {
        let slow = || response(300_000, 100, 0);
        assert_eq!(rate(slow(), Some(50e6), 50, false).read_rate_bps, None);
        let mut zw = slow();
        zw.zero_window_us = Some(20_000);
        assert_eq!(rate(zw, Some(50e6), 50, true).read_rate_bps, None);
        assert_eq!(rate(slow(), None, 50, true).read_rate_bps, None);
        let long = response(300_000, 300, 0);
        assert_eq!(rate(long, Some(50e6), 100_000, true).read_rate_bps, None);
        // the same 300 ms at a LAN RTT: the client's
        let lan = response(300_000, 300, 0);
        assert!(rate(lan, Some(50e6), 100, true).read_rate_bps.is_some());
    }
}
