//! Exchanges: request and response data units, their times and sizes, the response delay,
//! Monkey's query delay (§3.3.3) on every response, and the client's think time.

use mimic_core::time::dur;
use mimic_core::Timestamp;

use super::dir::Dir;
use super::push_sized;
use crate::config::Config;
use crate::http;
use crate::record::Exchange;

/// Segments remembered per data unit (the query-delay test looks at the first ones), and per
/// connection in all.
const ADU_SEGS: u32 = 256;
const CONN_ADU_SEGS: usize = 1 << 16;

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
        }
    }

    /// Per-segment hook: the side opposite to `d` advertised `window` (raw) with `d`'s data
    /// acknowledged up to `acked`; while the latest unit (of direction `d`) has data it has not
    /// acknowledged, a window below a quarter of the largest so far marks it drained (the
    /// receiver fell behind reading).
    #[inline]
    pub fn on_window(&mut self, d: Dir, window: u16, acked: i64) {
        let max = &mut self.max_window[d as usize];
        if let Some(a) = self.adus.last_mut() {
            if a.dir == d && acked >= a.start && acked < a.end && (window as u32) * 4 < *max as u32
            {
                a.drained = true;
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
    pub fn finish(
        &self,
        client: Dir,
        mss: u32,
        connected: Option<Timestamp>,
        closed: &[ZeroWindow],
    ) -> Vec<Exchange> {
        let adus = &self.adus;
        let mut out: Vec<Exchange> = Vec::with_capacity(adus.len().div_ceil(2));
        let mut i = 0;
        let mut prev_resp_last: Option<Timestamp> = connected;
        while i < adus.len() {
            // data units alternate sides: a request is followed by its response, if any;
            // data the server sent first is a response without a request
            let (req, resp) = if adus[i].dir == client {
                let resp = adus.get(i + 1);
                i += 1 + resp.is_some() as usize;
                (Some(&adus[i - 1 - resp.is_some() as usize]), resp)
            } else {
                i += 1;
                (None, Some(&adus[i - 1]))
            };
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
