//! Tests of the sans-I/O analyzer over crafted segment sequences with exact expected values.
//! The capture point is in front of the server: server packets are seen as they leave, client
//! packets a full round trip after the server packet that triggered them.

use std::net::IpAddr;

use mimic_core::packet::{TcpFlags, TcpOptions, TcpSegment};
use mimic_core::{SeqNum, Timestamp, VlanStack};

use crate::analyzer::Analyzer;
use crate::config::Config;
use crate::record::*;

const MS: i64 = 1_000_000;
const US: i64 = 1_000;

/// Drives an analyzer with one client (10.0.0.1:40000) and one server (10.0.0.2:80).
struct Wire {
    an: Analyzer,
    no: u64,
    cport: u16,
    payload: Vec<u8>,
    ip_id: Option<u16>,
}

struct P {
    client: bool,
    seq: u32,
    ack: u32,
    flags: u16,
    len: u32,
    win: u16,
    opts: TcpOptions,
}

fn p(client: bool, seq: u32, ack: u32, flags: u16, len: u32) -> P {
    P {
        client,
        seq,
        ack,
        flags,
        len,
        win: 65535,
        opts: TcpOptions::default(),
    }
}

const S: u16 = TcpFlags::SYN;
const A: u16 = TcpFlags::ACK;
const F: u16 = TcpFlags::FIN;
const R: u16 = TcpFlags::RST;
const PA: u16 = TcpFlags::PSH | TcpFlags::ACK;

fn syn_opts(mss: u16, ws: u8) -> TcpOptions {
    TcpOptions {
        mss: Some(mss),
        wscale: Some(ws),
        sack_permitted: true,
        timestamp: None,
        ..TcpOptions::default()
    }
}

impl Wire {
    fn new() -> Wire {
        Wire {
            an: Analyzer::new(Config::default()),
            no: 0,
            cport: 40000,
            payload: Vec::new(),
            ip_id: None,
        }
    }

    fn send(&mut self, t_ns: i64, p: P) {
        let c: IpAddr = "10.0.0.1".parse().unwrap();
        let s: IpAddr = "10.0.0.2".parse().unwrap();
        let (src, dst, sport, dport) = if p.client {
            (c, s, self.cport, 80)
        } else {
            (s, c, 80, self.cport)
        };
        self.no += 1;
        let seg = TcpSegment {
            vlan: VlanStack::NONE,
            src,
            dst,
            sport,
            dport,
            seq: SeqNum(p.seq),
            ack: SeqNum(p.ack),
            flags: TcpFlags(p.flags),
            window: p.win,
            options: p.opts,
            payload_len: p.len,
            payload: &self.payload[..self.payload.len().min(p.len as usize)],
            ip_ecn: 0,
            hdr_len: 40,
            ip_id: self.ip_id,
        };
        self.an.handle_segment(
            self.no,
            Timestamp::from_nanos(1_700_000_000 * 1_000_000_000 + t_ns),
            &seg,
        );
    }

    fn finish(mut self) -> Vec<ConnectionRecord> {
        self.an.finish();
        let mut v = Vec::new();
        while let Some(r) = self.an.poll_record() {
            v.push(r);
        }
        v
    }

    /// SYN at `t`, SYN-ACK 0.1 ms later, the client's ACK one RTT after the SYN-ACK.
    fn handshake(&mut self, t: i64, rtt: i64, cisn: u32, sisn: u32) -> i64 {
        let mut syn = p(true, cisn, 0, S, 0);
        syn.opts = syn_opts(1460, 7);
        syn.win = 64240;
        self.send(t, syn);
        let mut sa = p(false, sisn, cisn.wrapping_add(1), S | A, 0);
        sa.opts = syn_opts(1460, 7);
        self.send(t + 100 * US, sa);
        self.send(
            t + 100 * US + rtt,
            p(true, cisn.wrapping_add(1), sisn.wrapping_add(1), A, 0),
        );
        t + 100 * US + rtt
    }
}

#[test]
fn handshake_rtt_exchange_and_fin() {
    let mut w = Wire::new();
    w.payload = b"GET /index.html HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
    let rtt = 50 * MS;
    let t = w.handshake(0, rtt, 1000, 5000);
    // request: one segment right after the handshake ACK, window 1026 << 7
    let mut req = p(true, 1001, 5001, PA, 300);
    req.win = 1026;
    w.send(t + MS, req);
    w.payload = b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n".to_vec();
    // server ACKs the request 0.2 ms later and answers 5 ms after the request
    w.send(t + MS + 200 * US, p(false, 5001, 1301, A, 0));
    w.send(t + 6 * MS, p(false, 5001, 1301, PA, 1000));
    // the client ACKs one RTT later, then closes
    w.send(t + 6 * MS + rtt, p(true, 1301, 6001, A, 0));
    w.send(t + 10 * MS + rtt, p(true, 1301, 6001, F | A, 0));
    w.send(t + 10 * MS + rtt + 100 * US, p(false, 6001, 1302, F | A, 0));
    w.send(t + 10 * MS + 2 * rtt + 100 * US, p(true, 1302, 6002, A, 0));
    let recs = w.finish();
    assert_eq!(recs.len(), 1);
    let r = &recs[0];
    assert!(r.complete(), "{:?}", r.prune);
    assert_eq!(r.server_port, 80);
    assert_eq!(r.server_by, ServerBy::Syn);
    // SYN → client's ACK of the SYN-ACK: 0.1 ms + 50 ms
    assert_eq!(r.hs_rtt_us, Some(50_100));
    // min RTT: the client part (response → ACK, 50 ms) plus the server part (SYN → SYN-ACK
    // 0.1 ms, below the request → ACK 0.2 ms)
    assert_eq!(r.min_rtt_us, Some(50_100));
    assert_eq!(r.mss_client, Some(1460));
    assert_eq!(r.wscale_client, Some(7));
    assert_eq!(r.sack_ok, Some(true));
    assert_eq!(r.rwin_bytes, Some(1026 << 7));
    assert_eq!(r.rwin_syn_bytes, Some(64240));
    assert_eq!(r.termination, Termination::Fin);
    assert_eq!(r.closed_by, Some("client"));
    assert_eq!(r.exchanges.len(), 1);
    let e = &r.exchanges[0];
    assert_eq!(e.req_bytes, 300);
    assert_eq!(e.resp_bytes, 1000);
    assert_eq!(e.response_delay_us, Some(5_000));
    assert_eq!(e.method, Some("GET"));
    assert_eq!(e.status, Some(200));
    // one response segment: no split, the whole response is "header"
    assert_eq!(e.query_delay_us, Some(0));
    assert_eq!(e.header_bytes, Some(1000));
    assert_eq!(r.response_time_us, Some(5_000));
    assert_eq!(r.data_pkts_down, 1);
    assert_eq!(r.data_bytes_down, 1000);
    assert_eq!(r.data_bytes_up, 300);
    assert_eq!(r.retx_down, 0);
    assert_eq!(r.loss_rate_down, Some(0.0));
}

#[test]
fn handshake_options_of_each_side() {
    let ts = |v| TcpOptions {
        timestamp: Some((v, 0)),
        ..syn_opts(1460, 7)
    };
    // client: MSS 1460, wscale 7, SACK, timestamps, ECN setup (ECE+CWR); server: MSS 1400,
    // wscale 9, SACK, timestamps, ECN accepted (ECE)
    let mut w = Wire::new();
    let mut syn = p(true, 1000, 0, S | TcpFlags::ECE | TcpFlags::CWR, 0);
    syn.opts = ts(1);
    w.send(0, syn);
    let mut sa = p(false, 5000, 1001, S | A | TcpFlags::ECE, 0);
    sa.opts = TcpOptions {
        mss: Some(1400),
        wscale: Some(9),
        ..ts(2)
    };
    w.send(100 * US, sa);
    w.send(10 * MS, p(true, 1001, 5001, A, 0));
    w.send(11 * MS, p(true, 1001, 5001, F | A, 0));
    w.send(11 * MS + 100 * US, p(false, 5001, 1002, F | A, 0));
    let r = &w.finish()[0];
    assert_eq!((r.mss_client, r.mss_server), (Some(1460), Some(1400)));
    assert_eq!((r.wscale_client, r.wscale_server), (Some(7), Some(9)));
    assert_eq!(
        (r.sack_ok, r.ts_ok, r.ecn_ok),
        (Some(true), Some(true), Some(true))
    );

    // the server answers without timestamps and without ECN: neither is on
    let mut w = Wire::new();
    let mut syn = p(true, 1000, 0, S | TcpFlags::ECE | TcpFlags::CWR, 0);
    syn.opts = ts(1);
    w.send(0, syn);
    let mut sa = p(false, 5000, 1001, S | A, 0);
    sa.opts = syn_opts(1400, 9);
    w.send(100 * US, sa);
    w.send(10 * MS, p(true, 1001, 5001, A, 0));
    let r = &w.finish()[0];
    assert_eq!((r.ts_ok, r.ecn_ok), (Some(false), Some(false)));
    // no SYN seen at all: not known
    let mut w = Wire::new();
    w.send(0, p(true, 1001, 5001, PA, 10));
    let r = &w.finish()[0];
    assert_eq!((r.sack_ok, r.ts_ok, r.ecn_ok), (None, None, None));
}

#[test]
fn reset_before_the_response_is_an_abort_and_a_hole_is_pruned() {
    // the client resets after its request, with no response: rst_abort
    let mut w = Wire::new();
    let t = w.handshake(0, 10 * MS, 1000, 5000);
    w.send(t + MS, p(true, 1001, 5001, PA, 100));
    w.send(t + 2 * MS, p(true, 1101, 5001, R, 0));
    let r = &w.finish()[0];
    assert_eq!(r.termination, Termination::RstAbort);
    assert!(r.complete(), "{:?}", r.prune);

    // server data with a range never captured (the tap missed it), acknowledged all the same
    let mut w = Wire::new();
    let t = w.handshake(0, 10 * MS, 1000, 5000);
    w.send(t + MS, p(true, 1001, 5001, PA, 100));
    w.send(t + 2 * MS, p(false, 5001, 1101, A, 1000));
    w.send(t + 2 * MS + 20 * US, p(false, 7001, 1101, A, 1000));
    w.send(t + 12 * MS, p(true, 1101, 8001, A, 0));
    w.send(t + 13 * MS, p(true, 1101, 8001, F | A, 0));
    w.send(t + 13 * MS + 100 * US, p(false, 8001, 1102, F | A, 0));
    let r = &w.finish()[0];
    assert_eq!(r.termination, Termination::Fin);
    assert!(r.prune.contains(&PruneReason::SeqHoles), "{:?}", r.prune);
    assert_eq!(r.holes_down, 1);
    assert!(!r.complete());
}

/// Request, then `n` full segments of response sent back to back, starting at `t`.
fn burst(w: &mut Wire, t: i64, first_seq: u32, n: u32, mss: u32) {
    for k in 0..n {
        w.send(
            t + k as i64 * 10 * US,
            p(false, first_seq + k * mss, 1101, A, mss),
        );
    }
}

#[test]
fn spurious_retransmission_by_early_ack() {
    let mut w = Wire::new();
    let rtt = 100 * MS;
    let t = w.handshake(0, rtt, 1000, 5000);
    w.send(t + MS, p(true, 1001, 5001, PA, 100));
    // server sends 2 segments; the client's ACK is held up (in the network) past the RTO
    burst(&mut w, t + 2 * MS, 5001, 2, 1000);
    // RTO fires at +300 ms: the first segment is resent
    w.send(t + 302 * MS, p(false, 5001, 1101, A, 1000));
    // the ACK of both originals arrives 10 ms after the resend: far too soon to answer it
    w.send(t + 312 * MS, p(true, 1101, 7001, A, 0));
    // and the client answers the duplicate with a duplicate ACK one RTT after the resend
    w.send(t + 402 * MS, p(true, 1101, 7001, A, 0));
    w.send(t + 403 * MS, p(true, 1101, 7001, R, 0));
    let r = &w.finish()[0];
    assert_eq!(r.retx_down, 1);
    assert_eq!(r.spurious_retx_down, 1);
    assert_eq!(r.spurious_by, Some("dupack"));
    assert_eq!(r.data_pkts_down, 3);
    assert_eq!(r.loss_rate_down, Some(0.0));
    assert_eq!(r.termination, Termination::RstAfterResponse);
}

#[test]
fn spurious_retransmission_by_a_duplicate_ack_answering_it() {
    // Monkey's heuristic proper: the ACK of the originals comes too late to rule the resend
    // out by itself (80 ms after it, RTT 100 ms), but the client then answers the resend with a
    // duplicate ACK, one round trip after it was sent; without that duplicate ACK the same
    // resend counts as a loss
    for (dupack, spurious, loss) in [(true, 1, 0.0), (false, 0, 1.0 / 3.0)] {
        let mut w = Wire::new();
        let rtt = 100 * MS;
        let t = w.handshake(0, rtt, 1000, 5000);
        w.send(t + MS, p(true, 1001, 5001, PA, 100));
        burst(&mut w, t + 2 * MS, 5001, 2, 1000);
        w.send(t + 302 * MS, p(false, 5001, 1101, A, 1000));
        w.send(t + 382 * MS, p(true, 1101, 7001, A, 0));
        if dupack {
            w.send(t + 402 * MS, p(true, 1101, 7001, A, 0));
        }
        w.send(t + 450 * MS, p(true, 1101, 7001, F | A, 0));
        w.send(t + 451 * MS, p(false, 7001, 1102, F | A, 0));
        let r = &w.finish()[0];
        assert_eq!(r.retx_down, 1);
        assert_eq!(r.spurious_retx_down, spurious, "duplicate ACK: {dupack}");
        assert_eq!(r.spurious_by, Some("dupack"));
        assert_eq!(r.loss_rate_down, Some(loss));
    }
}

#[test]
fn a_needed_resend_is_not_made_spurious_by_the_duplicate_acks_of_a_later_hole() {
    // six segments, the 2nd and the 5th lost; the resend of the 2nd is answered by a partial
    // ACK up to the 5th, and the segment sent right after the resend draws a duplicate ACK of
    // that later hole about a round trip after the resend
    let mut w = Wire::new();
    let rtt = 40 * MS;
    let t = w.handshake(0, rtt, 1000, 5000);
    w.send(t + MS, p(true, 1001, 5001, PA, 100));
    burst(&mut w, t + 2 * MS, 5001, 6, 1000);
    let back = t + 2 * MS + rtt;
    w.send(back, p(true, 1101, 6001, A, 0));
    for k in 0..3 {
        w.send(back + (20 + 10 * k) * US, p(true, 1101, 6001, A, 0));
    }
    let rx = back + 100 * US;
    w.send(rx, p(false, 6001, 1101, A, 1000));
    w.send(rx + 100 * US, p(false, 11001, 1101, A, 1000));
    w.send(rx + rtt, p(true, 1101, 9001, A, 0));
    w.send(rx + 100 * US + rtt, p(true, 1101, 9001, A, 0));
    // the 5th resent and acknowledged with everything
    w.send(rx + rtt + 200 * US, p(false, 9001, 1101, A, 1000));
    w.send(rx + 2 * rtt + 200 * US, p(true, 1101, 12001, A, 0));
    w.send(rx + 2 * rtt + MS, p(true, 1101, 12001, F | A, 0));
    w.send(rx + 2 * rtt + 2 * MS, p(false, 12001, 1102, F | A, 0));
    let r = &w.finish()[0];
    assert_eq!(r.retx_down, 2);
    assert_eq!(r.spurious_retx_down, 0);
    assert_eq!(r.loss_rate_down, Some(2.0 / 9.0));
}

#[test]
fn genuine_loss_and_dsack() {
    // 1) a real loss: the client's ACKs stop at the lost segment, the resend is needed
    let mut w = Wire::new();
    let rtt = 40 * MS;
    let t = w.handshake(0, rtt, 1000, 5000);
    w.send(t + MS, p(true, 1001, 5001, PA, 100));
    burst(&mut w, t + 2 * MS, 5001, 4, 1000);
    // segment 2 lost downstream: ACK for seg 1, then dupacks
    w.send(t + 2 * MS + rtt, p(true, 1101, 6001, A, 0));
    w.send(t + 2 * MS + rtt + 20 * US, p(true, 1101, 6001, A, 0));
    w.send(t + 2 * MS + rtt + 30 * US, p(true, 1101, 6001, A, 0));
    w.send(t + 2 * MS + rtt + 100 * US, p(false, 6001, 1101, A, 1000));
    w.send(t + 2 * MS + 2 * rtt + 100 * US, p(true, 1101, 9001, A, 0));
    w.send(t + 3 * MS + 2 * rtt, p(true, 1101, 9001, F | A, 0));
    w.send(
        t + 3 * MS + 2 * rtt + 100 * US,
        p(false, 9001, 1102, F | A, 0),
    );
    let r = &w.finish()[0];
    assert_eq!(r.retx_down, 1);
    assert_eq!(r.spurious_retx_down, 0);
    assert_eq!(r.loss_rate_down, Some(1.0 / 5.0));

    // 2) the same resend reported as a duplicate by D-SACK
    let mut w = Wire::new();
    let t = w.handshake(0, rtt, 1000, 5000);
    w.send(t + MS, p(true, 1001, 5001, PA, 100));
    burst(&mut w, t + 2 * MS, 5001, 2, 1000);
    w.send(t + 250 * MS, p(false, 5001, 1101, A, 1000));
    let mut d = p(true, 1101, 7001, A, 0);
    d.opts.sack[0] = (SeqNum(5001), SeqNum(6001));
    d.opts.sack_len = 1;
    w.send(t + 250 * MS + rtt, d);
    let r = &w.finish()[0];
    assert_eq!(r.retx_down, 1);
    assert_eq!(r.spurious_retx_down, 1);
    assert_eq!(r.spurious_by, Some("dsack"));
}

#[test]
fn delayed_ack_client() {
    let mut w = Wire::new();
    let rtt = 60 * MS;
    let t = w.handshake(0, rtt, 1000, 5000);
    w.send(t + MS, p(true, 1001, 5001, PA, 100));
    // 6 segments leave back to back; a 10 Mbit/s bottleneck spaces them 832 µs apart and the
    // client ACKs every second one as it arrives
    let tb = 832 * US;
    let t0 = t + 2 * MS;
    burst(&mut w, t0, 5001, 6, 1000);
    for k in 1..=3i64 {
        w.send(
            t0 + rtt + 2 * k * tb,
            p(true, 1101, 5001 + (2 * k as u32) * 1000, A, 0),
        );
    }
    // 100 ms later one more segment goes out alone: the client holds its ACK for its 200 ms
    // delayed-ACK timer
    let t7 = t0 + 100 * MS;
    w.send(t7, p(false, 11001, 1101, A, 1000));
    w.send(t7 + rtt + 200 * MS, p(true, 1101, 12001, A, 0));
    let r = &w.finish()[0];
    assert_eq!(r.delack_policy, DelackPolicy::Delayed);
    assert_eq!(r.acks_per_seg, Some(4.0 / 7.0));
    // the min RTT is the handshake's (it includes the server's 0.1 ms before its SYN-ACK), so
    // the timer shows as 200 ms less that 0.1 ms
    assert_eq!(r.min_rtt_us, Some(60_100));
    assert_eq!(r.delack_timeout_us, Some(199_900));
    // ACK pairs within the burst give the bottleneck; the pair ending at the lone segment's
    // delayed ACK does not qualify as a sample
    assert_eq!(r.bw_samples.len(), 2, "{:?}", r.bw_samples);
    for s in &r.bw_samples {
        assert!(s.used);
        assert_eq!(s.bytes, 2 * 1040);
        assert_eq!(s.gap_us, 1664);
    }
    let bw = r.bw_bps.unwrap();
    assert!((bw - 10e6).abs() < 1.0, "{bw}");
}

#[test]
fn quick_ack_client_and_bandwidth() {
    let mut w = Wire::new();
    let rtt = 30 * MS;
    let t = w.handshake(0, rtt, 1000, 5000);
    w.send(t + MS, p(true, 1001, 5001, PA, 100));
    // 10 segments leave back to back; a 10 Mbit/s bottleneck spaces them 1040*8/10e6 = 832 µs
    let t0 = t + 2 * MS;
    burst(&mut w, t0, 5001, 10, 1000);
    for k in 1..=10i64 {
        w.send(
            t0 + rtt + k * 832 * US,
            p(true, 1101, 5001 + k as u32 * 1000, A, 0),
        );
    }
    let r = &w.finish()[0];
    assert_eq!(r.delack_policy, DelackPolicy::Quick);
    assert_eq!(r.acks_per_seg, Some(1.0));
    let bw = r.bw_bps.unwrap();
    assert!((bw - 10e6).abs() < 1e3, "{bw}");
    // nine pairs; the last ACK covers the flight's lone final segment and does not qualify
    assert_eq!(r.bw_samples.len(), 8);
    assert!(r.bw_samples.iter().all(|s| s.used && s.gap_us == 832));
    assert_eq!(r.delack_timeout_us, None);
}

/// A quick-ACKing client behind a 128 kbit/s link (a full segment every 65 ms): the server's
/// tail-loss probe leaves 4 ms after its burst, before any ACK is back. Counting the burst's
/// segments as sent (and no ACK before that first retransmission) read this client as
/// delayed-ACKing (0 ACKs per segment), and the replay then thinned its ACKs to every other
/// segment, which on such a link outlasts the server's RTO.
#[test]
fn tail_loss_probe_before_the_first_ack_is_not_a_delayed_ack_client() {
    let mut w = Wire::new();
    let t = w.handshake(0, 100 * US, 1000, 5000);
    w.send(t + MS, p(true, 1001, 5001, PA, 100));
    let t0 = t + 2 * MS;
    burst(&mut w, t0, 5001, 6, 1000);
    // the probe: the last segment again
    w.send(t0 + 4 * MS, p(false, 10001, 1101, A, 1000));
    for k in 1..=6i64 {
        w.send(
            t0 + k * 65 * MS,
            p(true, 1101, 5001 + k as u32 * 1000, A, 0),
        );
    }
    let r = &w.finish()[0];
    assert_eq!(r.retx_down, 1);
    assert_ne!(r.delack_policy, DelackPolicy::Delayed);
    assert_ne!(r.acks_per_seg, Some(0.0));
}

/// A keep-alive client on a slow link: the server's 8 segments leave in 1 ms, reach the client
/// over 520 ms, and the client asks for the next object 1 ms after its last ACK. The think time
/// is that 1 ms, not the 520 ms the response was still on its way.
#[test]
fn think_time_on_a_slow_link_starts_when_the_client_has_the_response() {
    let mut w = Wire::new();
    let t = w.handshake(0, 100 * US, 1000, 5000);
    w.send(t + MS, p(true, 1001, 5001, PA, 100));
    let t0 = t + 2 * MS;
    burst(&mut w, t0, 5001, 8, 1000);
    for k in 1..=8i64 {
        w.send(
            t0 + k * 65 * MS,
            p(true, 1101, 5001 + k as u32 * 1000, A, 0),
        );
    }
    let t1 = t0 + 8 * 65 * MS + MS;
    w.send(t1, p(true, 1101, 13001, PA, 100));
    w.send(t1 + MS, p(false, 13001, 1201, PA, 500));
    w.send(t1 + 40 * MS, p(true, 1201, 13501, A, 0));
    let r = &w.finish()[0];
    assert_eq!(r.exchanges.len(), 2);
    assert_eq!(r.exchanges[1].think_time_us, Some(1_000));
}

/// A client that stops reading: its window closes after half the response and reopens 300 ms
/// later (window probes answered with zero windows meanwhile), and the server sends the rest
/// only then; that response's exchange records the 300 ms and the 4,000 bytes acknowledged
/// when it closed. The next response is all sent before the window closes (the client reads
/// it later): no server byte waited, so nothing is recorded for it.
#[test]
fn a_receiver_that_stops_reading_records_how_long_its_window_stayed_closed() {
    let mut w = Wire::new();
    let t = w.handshake(0, 100 * US, 1000, 5000);
    w.send(t + MS, p(true, 1001, 5001, PA, 100));
    let t0 = t + 2 * MS;
    burst(&mut w, t0, 5001, 4, 1000);
    let mut closed = p(true, 1101, 9001, A, 0);
    closed.win = 0;
    w.send(t0 + MS, closed);
    // the server's window probe, answered with the window still closed
    w.send(t0 + 201 * MS, p(false, 9000, 1101, A, 0));
    let mut still = p(true, 1101, 9001, A, 0);
    still.win = 0;
    w.send(t0 + 201 * MS + 100 * US, still);
    // the window update, then the rest
    w.send(t0 + 301 * MS, p(true, 1101, 9001, A, 0));
    burst(&mut w, t0 + 301 * MS + 100 * US, 9001, 4, 1000);
    w.send(t0 + 303 * MS, p(true, 1101, 13001, A, 0));
    // second exchange: all sent, then the client's window closes on the last byte
    let t1 = t0 + 400 * MS;
    w.send(t1, p(true, 1101, 13001, PA, 100));
    w.send(t1 + MS, p(false, 13001, 1201, PA, 1000));
    w.send(t1 + MS + 10 * US, p(false, 14001, 1201, PA, 1000));
    let mut full = p(true, 1201, 15001, A, 0);
    full.win = 0;
    w.send(t1 + 2 * MS, full);
    w.send(t1 + 100 * MS, p(true, 1201, 15001, A, 0));
    let r = &w.finish()[0];
    assert_eq!(r.zero_window, 3);
    assert_eq!(r.exchanges.len(), 2);
    let e = &r.exchanges[0];
    assert_eq!(e.resp_bytes, 8000);
    assert_eq!(e.zero_window_us, Some(300_000));
    assert_eq!(e.zero_window_at_bytes, Some(4000));
    assert_eq!(e.zero_window_stalls, vec![(4000, 300_000)]);
    let e = &r.exchanges[1];
    assert_eq!((e.zero_window_us, e.zero_window_at_bytes), (Some(0), None));
    assert!(e.zero_window_stalls.is_empty());
    assert_eq!(e.read_rate_bps, None);
}

/// A client that stops reading twice in one response: its window closes after 4,000 of
/// 12,000 bytes for 300 ms, then after 8,000 for 200 ms. Each stall is recorded at its place
/// with its own duration (a replay pauses at each), their sum is the exchange's closed time,
/// and the window that closed gives the response a read rate.
#[test]
fn several_stalls_in_one_response_are_each_recorded_where_they_happened() {
    let mut w = Wire::new();
    let t = w.handshake(0, 100 * US, 1000, 5000);
    w.send(t + MS, p(true, 1001, 5001, PA, 100));
    let t0 = t + 2 * MS;
    burst(&mut w, t0, 5001, 4, 1000);
    let mut closed = p(true, 1101, 9001, A, 0);
    closed.win = 0;
    w.send(t0 + MS, closed);
    w.send(t0 + 301 * MS, p(true, 1101, 9001, A, 0));
    let t1 = t0 + 301 * MS + 100 * US;
    burst(&mut w, t1, 9001, 4, 1000);
    let mut closed = p(true, 1101, 13001, A, 0);
    closed.win = 0;
    w.send(t1 + MS, closed);
    w.send(t1 + 201 * MS, p(true, 1101, 13001, A, 0));
    burst(&mut w, t1 + 201 * MS + 100 * US, 13001, 4, 1000);
    w.send(t1 + 203 * MS, p(true, 1101, 17001, A, 0));
    let r = &w.finish()[0];
    assert_eq!(r.exchanges.len(), 1);
    let e = &r.exchanges[0];
    assert_eq!(e.resp_bytes, 12000);
    assert_eq!(e.zero_window_stalls, vec![(4000, 300_000), (8000, 200_000)]);
    assert_eq!(e.zero_window_us, Some(500_000));
    assert_eq!(e.zero_window_at_bytes, Some(4000));
    assert!(e.read_rate_bps.is_some(), "{e:?}");
}

/// One response of 16 full segments, one every 10 ms as the client's ACKs let the server
/// send: the ACK of segment k (1 ms after segment k + 1 left) advertises `win(k)` (raw); the
/// request advertised `req_win`. Returns the connection's one exchange.
fn sixteen_segments(req_win: u16, win: impl Fn(u32) -> u16) -> Exchange {
    let mut w = Wire::new();
    let t = w.handshake(0, 100 * US, 1000, 5000);
    let mut req = p(true, 1001, 5001, PA, 100);
    req.win = req_win;
    w.send(t + MS, req);
    let t0 = t + 2 * MS;
    let seg = |k: u32| p(false, 5001 + k * 1460, 1101, A, 1460);
    w.send(t0, seg(0));
    for k in 0..16u32 {
        let ts = t0 + k as i64 * 10 * MS;
        // the ACK of segment k comes after segment k + 1 left
        if k < 15 {
            w.send(ts + 10 * MS, seg(k + 1));
        }
        let mut ack = p(true, 1101, 5001 + (k + 1) * 1460, A, 0);
        ack.win = win(k);
        w.send(ts + 11 * MS, ack);
    }
    let r = w.finish().remove(0);
    assert_eq!(r.exchanges.len(), 1);
    r.exchanges[0].clone()
}

/// A client that reads slower than its path without ever closing its window: the server
/// sends a full segment every 10 ms as the window lets it, and each ACK (1 ms after the next
/// segment left) advertises 3,500 bytes less, down to 7,500 of 60,000 (the buffer filling
/// with what the client has not read). The exchange records the rate it read at: 16 x 1,460
/// bytes in the 150 ms from the first to the last segment (1.246 Mbit/s). The same transfer
/// with the window staying open records none: a client that reads at once shows nothing of
/// its reading, whatever the path's pace; nor does one whose window grows from 7,500 to
/// 60,000 (receive-buffer autotuning: small against the connection's largest, never against
/// the largest so far).
#[test]
fn a_client_that_reads_slowly_without_closing_its_window_gets_its_read_rate() {
    #[derive(Clone, Copy, PartialEq)]
    enum Win {
        Drain,
        Open,
        Grow,
    }
    fn run(mode: Win) -> Exchange {
        let req_win = if mode == Win::Grow { 7500 } else { 60000 };
        sixteen_segments(req_win, |k| match mode {
            Win::Drain => (60000 - k * 3500) as u16,
            Win::Open => 60000,
            Win::Grow => (7500 + k * 3500) as u16,
        })
    }
    let slow = run(Win::Drain);
    assert_eq!(slow.resp_bytes, 16 * 1460);
    assert_eq!(slow.query_delay_us, Some(0));
    assert_eq!(slow.zero_window_us, Some(0));
    assert!(slow.zero_window_stalls.is_empty());
    let rate = slow
        .read_rate_bps
        .expect("a draining window gives a read rate");
    let want = 16.0 * 1460.0 * 8.0 / 0.150;
    assert!((rate - want).abs() < 1.0, "{rate} against {want}");
    let fast = run(Win::Open);
    assert_eq!(fast.read_rate_bps, None, "{fast:?}");
    let grown = run(Win::Grow);
    assert_eq!(grown.read_rate_bps, None, "{grown:?}");
}

/// A slow-start burst into a 1 Mbit/s bottleneck's queue: each ACK comes one serialization
/// (8.32 ms) later, so the samples grow with the queue. Beyond the first rows, the largest
/// sample is kept (a replay sizes its queue by it) — but not the last segment's, which nothing
/// followed and whose ACK waited on the client's delayed-ACK timer.
#[test]
fn the_deepest_queue_sample_is_kept_and_a_timer_held_ack_is_not_it() {
    let mut w = Wire::new();
    let rtt = 20 * MS;
    let t = w.handshake(0, rtt, 1000, 5000);
    w.send(t + MS, p(true, 1001, 5001, PA, 100));
    let t0 = t + 2 * MS;
    let tx = 8_320 * US;
    burst(&mut w, t0, 5001, 20, 1000);
    for k in 1..=19i64 {
        w.send(
            t0 + rtt + k * tx,
            p(true, 1101, 5001 + k as u32 * 1000, A, 0),
        );
    }
    w.send(t0 + rtt + 20 * tx + 200 * MS, p(true, 1101, 25001, A, 0));
    let r = &w.finish()[0];
    let max = r
        .rtt_samples
        .iter()
        .filter(|s| s.kind == crate::record::RttKind::Data)
        .map(|s| s.rtt_us)
        .max();
    // segment 19 left 180 us after the first and was ACKed 19 serializations after it
    assert_eq!(max, Some((rtt + 19 * tx - 180 * US) / 1000));
}

#[test]
fn two_burst_response_with_query_delay() {
    let mut w = Wire::new();
    let rtt = 20 * MS;
    let t = w.handshake(0, rtt, 1000, 5000);
    w.send(t + MS, p(true, 1001, 5001, PA, 500));
    // response delay 3 ms: an 800-byte header, then after a 150 ms query the results
    let t1 = t + 4 * MS;
    w.send(t1, p(false, 5001, 1501, PA, 800));
    w.send(t1 + rtt, p(true, 1501, 5801, A, 0));
    burst(&mut w, t1 + 150 * MS, 5801, 3, 1448);
    w.send(t1 + 150 * MS + rtt, p(true, 1501, 5801 + 3 * 1448, A, 0));
    let r = &w.finish()[0];
    let e = &r.exchanges[0];
    assert_eq!(e.response_delay_us, Some(3_000));
    assert_eq!(e.query_delay_us, Some(150_000));
    assert_eq!(e.header_bytes, Some(800));
    assert_eq!(e.resp_bytes, 800 + 3 * 1448);
    assert_eq!(r.response_time_us, Some(3_000 + 150_000 + 20));
}

#[test]
fn query_delay_when_header_was_acked_before_results() {
    // full-sized header segments, so only the "acknowledged before the next send" test applies
    let mut w = Wire::new();
    let rtt = 20 * MS;
    let t = w.handshake(0, rtt, 1000, 5000);
    w.send(t + MS, p(true, 1001, 5001, PA, 500));
    let t1 = t + 2 * MS;
    burst(&mut w, t1, 5001, 2, 1448);
    w.send(t1 + rtt + 20 * US, p(true, 1501, 5001 + 2 * 1448, A, 0));
    burst(&mut w, t1 + 100 * MS, 5001 + 2 * 1448, 2, 1448);
    let r = &w.finish()[0];
    let e = &r.exchanges[0];
    assert_eq!(e.query_delay_us, Some(100_000));
    assert_eq!(e.header_bytes, Some(2 * 1448));
}

#[test]
fn sequence_wraparound() {
    let mut w = Wire::new();
    let rtt = 10 * MS;
    let cisn = u32::MAX - 50;
    let sisn = u32::MAX - 1500;
    let t = w.handshake(0, rtt, cisn, sisn);
    w.send(
        t + MS,
        p(true, cisn.wrapping_add(1), sisn.wrapping_add(1), PA, 100),
    );
    // 3000 response bytes crossing 2^32
    for k in 0..3u32 {
        w.send(
            t + 2 * MS + k as i64 * 10 * US,
            p(
                false,
                sisn.wrapping_add(1 + k * 1000),
                cisn.wrapping_add(101),
                A,
                1000,
            ),
        );
    }
    w.send(
        t + 2 * MS + rtt,
        p(true, cisn.wrapping_add(101), sisn.wrapping_add(3001), A, 0),
    );
    w.send(
        t + 3 * MS + rtt,
        p(
            true,
            cisn.wrapping_add(101),
            sisn.wrapping_add(3001),
            F | A,
            0,
        ),
    );
    w.send(
        t + 3 * MS + rtt + 100 * US,
        p(
            false,
            sisn.wrapping_add(3001),
            cisn.wrapping_add(102),
            F | A,
            0,
        ),
    );
    let r = &w.finish()[0];
    assert!(r.complete(), "{:?}", r.prune);
    assert_eq!(r.data_bytes_down, 3000);
    assert_eq!(r.retx_down, 0);
    assert_eq!(r.holes_down, 0);
    assert_eq!(r.exchanges[0].resp_bytes, 3000);
    assert_eq!(r.min_rtt_us, Some(10_000 - 20 + 100));
}

#[test]
fn port_reuse_starts_a_new_connection() {
    let mut w = Wire::new();
    let rtt = 5 * MS;
    for (i, isn) in [1000u32, 900_000].into_iter().enumerate() {
        let t0 = i as i64 * 100 * MS;
        let t = w.handshake(t0, rtt, isn, 5000 + i as u32);
        w.send(t + MS, p(true, isn + 1, 5001 + i as u32, PA, 10));
        w.send(t + 2 * MS, p(false, 5001 + i as u32, isn + 11, PA, 20));
        w.send(t + 3 * MS, p(true, isn + 11, 5021 + i as u32, F | A, 0));
        w.send(
            t + 3 * MS + 100 * US,
            p(false, 5021 + i as u32, isn + 12, F | A, 0),
        );
    }
    let recs = w.finish();
    assert_eq!(recs.len(), 2);
    assert!(recs.iter().all(|r| r.complete() && r.exchanges.len() == 1));
    assert_ne!(recs[0].id, recs[1].id);
    // a retransmitted SYN (same ISN) is not a new connection
    let mut w = Wire::new();
    let mut syn = p(true, 77, 0, S, 0);
    syn.opts = syn_opts(1460, 0);
    w.send(0, syn);
    let mut syn = p(true, 77, 0, S, 0);
    syn.opts = syn_opts(1460, 0);
    w.send(1000 * MS, syn);
    let recs = w.finish();
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].syn_retx, 1);
}

#[test]
fn persistent_connection_think_time() {
    let mut w = Wire::new();
    let rtt = 10 * MS;
    let t = w.handshake(0, rtt, 1000, 5000);
    let mut cs = 1001u32;
    let mut ss = 5001u32;
    for k in 0..3i64 {
        let tk = t + MS + k * 500 * MS;
        w.send(tk, p(true, cs, ss, PA, 200));
        cs += 200;
        w.send(tk + 2 * MS, p(false, ss, cs, PA, 700));
        ss += 700;
        w.send(tk + 2 * MS + rtt, p(true, cs, ss, A, 0));
    }
    let r = &w.finish()[0];
    assert_eq!(r.exchanges.len(), 3);
    // before the first request: 1 ms after the handshake completed
    assert_eq!(r.exchanges[0].think_time_us, Some(1_000));
    // from the client's ACK of the previous response (it had the response then), not from
    // the response's last byte leaving the server one round trip earlier
    assert_eq!(r.exchanges[1].think_time_us, Some(488_000));
    assert_eq!(r.exchanges[2].think_time_us, Some(488_000));
    assert_eq!(r.response_time_us, Some(1_002_000));
    assert_eq!(r.termination, Termination::None);
    assert_eq!(r.prune, vec![PruneReason::NoTermination]);
}

#[test]
fn no_handshake_uses_server_port_hint() {
    let cfg = Config {
        server_ports: vec![40000],
        ..Config::default()
    };
    let mut w = Wire::new();
    w.an = Analyzer::new(cfg);
    w.send(0, p(false, 100, 200, PA, 50));
    let r = &w.finish()[0];
    assert_eq!(r.server_by, ServerBy::Port);
    assert_eq!(r.server_port, 40000);
    let mut w = Wire::new();
    w.send(0, p(false, 100, 200, PA, 50));
    let r = &w.finish()[0];
    assert_eq!(r.server_by, ServerBy::Guess);
    assert_eq!(r.server_port, 80);
    assert!(r.prune.contains(&PruneReason::NoHandshake));
    assert!(r.prune.contains(&PruneReason::OneDirection));
}

#[test]
fn idle_connections_are_closed_in_capture_time() {
    let cfg = Config {
        idle_timeout_ns: 10 * 1_000 * MS,
        ..Config::default()
    };
    let mut w = Wire::new();
    w.an = Analyzer::new(cfg);
    w.send(0, p(true, 1, 1, PA, 10));
    // a different connection 20 s later pushes capture time past the first one's timeout
    w.cport = 40001;
    w.send(20_000 * MS, p(true, 1, 1, PA, 10));
    let first =
        w.an.poll_record()
            .expect("first connection closed by the idle timer");
    assert_eq!(first.client_port, 40000);
    assert_eq!(w.an.stats().idle_closed, 1);
}

/// The public corpus's captures (`$MIMIC_TRACES`, else `shared/traces/public` beside the
/// checkout), or `None` when it is absent (or `MIMIC_CORPUS=generated`); fails when it is
/// required (`CI=true` or `MIMIC_CORPUS=required`) and absent.
pub(crate) fn public_captures() -> Option<Vec<Vec<u8>>> {
    let mode = std::env::var("MIMIC_CORPUS").unwrap_or_default();
    let required = mode == "required"
        || (mode != "generated" && std::env::var("CI").is_ok_and(|v| v == "true"));
    let root = match std::env::var_os("MIMIC_TRACES").filter(|v| !v.is_empty()) {
        Some(d) => std::path::PathBuf::from(d),
        None => std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/traces/public"),
    };
    if mode == "generated" || !root.is_dir() {
        assert!(
            !required,
            "the public corpus is required (CI=true or MIMIC_CORPUS=required) but {} is absent; scripts/corpus.sh fetches it",
            root.display()
        );
        return None;
    }
    let mut files = Vec::new();
    let mut stack = vec![root];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_none_or(|x| x != "md") {
                files.push(p);
            }
        }
    }
    files.sort();
    assert!(files.len() > 100, "only {} public captures", files.len());
    Some(files.iter().map(|f| std::fs::read(f).unwrap()).collect())
}

/// Says on stderr, and in `$MIMIC_CORPUS_LOG` (which scripts/test.sh counts), that `test` ran
/// on generated captures because the public corpus is absent.
pub(crate) fn note_generated(test: &str) {
    use std::io::Write;
    let line = format!(
        "public corpus absent: {test} runs on generated captures for every format and link type"
    );
    let _ = writeln!(std::io::stderr(), "{line}");
    if let Some(log) = std::env::var_os("MIMIC_CORPUS_LOG").filter(|v| !v.is_empty()) {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
        {
            let _ = writeln!(f, "{line}");
        }
    }
}

/// Captures of every format and link type the reader knows, written from scripted
/// conversations with losses, for runs without the public corpus.
pub(crate) fn generated_captures() -> Vec<Vec<u8>> {
    use mimic_core::testcap::{capture_bytes, Capture, Close, Conn, Exchange, Format, Link};
    let mut conns = Vec::new();
    for (i, (c, sv)) in [
        ("10.0.0.1:40000", "10.0.0.2:80"),
        ("[2001:db8::1]:40001", "[2001:db8::2]:443"),
        ("10.0.0.3:40002", "10.0.0.2:80"),
    ]
    .iter()
    .enumerate()
    {
        let mut k = Conn::new(
            c.parse().unwrap(),
            sv.parse().unwrap(),
            1_700_000_000_000_000_000 + i as i64 * 1_000_000,
        );
        k.exchanges
            .push(Exchange::http_get("/a", 9_000, 0, 2_000_000));
        k.exchanges
            .push(Exchange::http_get("/b", 3_000, 5_000_000, 1_000_000));
        k.lose = vec![2];
        k.handshake = i != 2;
        k.close = [Close::Fin, Close::Rst, Close::None][i];
        conns.push(k);
    }
    let mut out = Vec::new();
    for format in [
        Format::Pcap {
            big_endian: false,
            nanos: false,
        },
        Format::Pcap {
            big_endian: true,
            nanos: true,
        },
        Format::Pcapng { nanos: false },
    ] {
        for link in [
            Link::Ethernet { vlans: vec![] },
            Link::Ethernet {
                vlans: vec![10, 20],
            },
            Link::RawIp,
            Link::Null,
            Link::LinuxSll,
            Link::Nflog,
        ] {
            for snaplen in [262_144, 60] {
                out.push(capture_bytes(
                    &Capture {
                        format,
                        link: link.clone(),
                        snaplen,
                    },
                    &conns,
                ));
            }
        }
    }
    out
}

/// A deterministic, in-suite version of the fuzz targets: every public capture (the malformed
/// ones included), cut and mutated, through the trace reader, the frame decoder and the
/// analyzer. None may panic. Without the public corpus, the same over generated captures of
/// every format and link type (said on stderr).
#[test]
fn fuzz_smoke_over_mutated_public_captures() {
    let inputs = public_captures().unwrap_or_else(|| {
        note_generated("fuzz_smoke_over_mutated_public_captures");
        generated_captures()
    });
    let mut rng = 0x9e3779b97f4a7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for mut bytes in inputs {
        bytes.truncate(48 * 1024);
        crate::fuzzing::analyze_trace(&bytes);
        for _ in 0..40 {
            let mut m = bytes.clone();
            let n = 1 + next() as usize % 16;
            for _ in 0..n {
                if m.is_empty() {
                    break;
                }
                let i = next() as usize % m.len();
                match next() % 4 {
                    0 => m[i] ^= 1 << (next() % 8),
                    1 => m[i] = next() as u8,
                    2 => m.truncate(i),
                    _ => m[i] = [0u8, 0xff, 0x7f, 0x80][next() as usize % 4],
                }
            }
            crate::fuzzing::analyze_trace(&m);
            let start = next() as usize % m.len().max(1);
            let end = (start + 1 + next() as usize % 200).min(m.len());
            if start < end {
                crate::fuzzing::decode_frame(&m[start..end]);
                crate::fuzzing::analyze_frames(&m[start..]);
            }
        }
    }
}

/// Slow start overflows the bottleneck queue long before the flight exceeds the path's
/// capacity: 61 segments leave back to back into a 10 Mbit/s, 100 ms path whose queue holds 40
/// packets (its rate class). One segment is lost at random early in the burst (the queue held 9
/// packets then); the last 20 meet a full queue. Only the first is random loss: a replay's
/// emulated queue drops the others by itself. (A flight-size test would call all 21 random:
/// 61 kB in flight is far below the 165 kB the path and its queue hold.)
#[test]
fn slow_start_queue_overflow_is_not_random_loss() {
    let mut w = Wire::new();
    let rtt = 100 * MS;
    let tx = 832 * US; // 1040 IP bytes at 10 Mbit/s
    let t = w.handshake(0, rtt, 1000, 5000);
    w.send(t + MS, p(true, 1001, 5001, PA, 100));
    let seq = |k: u32| 5001 + (k - 1) * 1000; // start of segment k (1-based)
    let t0 = t + 2 * MS;
    let mut ev: Vec<(i64, P)> = Vec::new();
    for k in 1..=61u32 {
        ev.push((
            t0 + (k as i64 - 1) * 10 * US,
            p(false, seq(k), 1101, A, 1000),
        ));
    }
    // delivered: 1..9 and 11..41, one per serialization time; the client ACKs each
    let delivered: Vec<u32> = (1..=9).chain(11..=41).collect();
    for (i, &k) in delivered.iter().enumerate() {
        let ack = if k <= 9 { seq(k + 1) } else { seq(10) };
        ev.push((t0 + rtt + (i as i64 + 1) * tx, p(true, 1101, ack, A, 0)));
    }
    // fast retransmit of segment 10 after the third duplicate ACK; its ACK covers up to 41
    let t10 = t0 + rtt + 12 * tx + 50 * US;
    ev.push((t10, p(false, seq(10), 1101, A, 1000)));
    let ta = t10 + tx + rtt;
    ev.push((ta, p(true, 1101, seq(42), A, 0)));
    // the partial ACK triggers the resend of 42..61, each ACKed as it arrives
    let tr = ta + 50 * US;
    for j in 0..20u32 {
        ev.push((
            tr + j as i64 * 10 * US,
            p(false, seq(42 + j), 1101, A, 1000),
        ));
        ev.push((
            tr + rtt + (j as i64 + 1) * tx,
            p(true, 1101, seq(43 + j), A, 0),
        ));
    }
    let tf = tr + rtt + 21 * tx;
    ev.push((tf, p(true, 1101, seq(62), F | A, 0)));
    ev.push((tf + 100 * US, p(false, seq(62), 1102, F | A, 0)));
    ev.sort_by_key(|e| e.0);
    for (t, pk) in ev {
        w.send(t, pk);
    }
    let r = &w.finish()[0];
    let bw = r.bw_bps.unwrap();
    assert!((bw - 10e6).abs() < 1e4, "{bw}");
    assert_eq!(r.data_pkts_down, 82);
    assert_eq!(r.retx_down, 21);
    assert_eq!(r.spurious_retx_down, 0);
    assert_eq!(r.loss_rate_down, Some(21.0 / 82.0));
    assert_eq!(r.loss_random_down, Some(1.0 / 82.0));
    // 40 packets queued (the one being sent included) when the last delivered one joined
    assert_eq!(r.queue_down_pkts, Some(40));
    assert_eq!(r.queue_down_full, Some(true));
}

/// A bottleneck queue shorter than its rate class's: 30 segments leave back to back into a
/// 10 Mbit/s, 100 ms path (class: 40 packets) whose queue holds 21 packets, the one being sent
/// included (the independent testbed's dial-up and ISDN links hold 20-30 where their class says
/// 30). Segment 5 is lost at random (4 packets queued ahead of it); 23..30 meet the full queue.
/// A model capped at the class's 40 packets never fills, and called all 9 losses random: a
/// replay then lost them twice, once to its queue and once at random. The uncapped model finds
/// the queue 21 deep where the drops began, bounded from above by them; the client's window,
/// which grew while the data arrived, is recorded at its largest as well.
#[test]
fn overflow_of_a_queue_shorter_than_its_class_is_not_random_loss_and_sizes_the_queue() {
    let mut w = Wire::new();
    let rtt = 100 * MS;
    let tx = 832 * US; // 1040 IP bytes at 10 Mbit/s
    let t = w.handshake(0, rtt, 1000, 5000);
    let mut req = p(true, 1001, 5001, PA, 100);
    req.win = 500;
    w.send(t + MS, req);
    let seq = |k: u32| 5001 + (k - 1) * 1000; // start of segment k (1-based)
    let t0 = t + 2 * MS;
    let mut ev: Vec<(i64, P)> = Vec::new();
    for k in 1..=30u32 {
        ev.push((
            t0 + (k as i64 - 1) * 10 * US,
            p(false, seq(k), 1101, A, 1000),
        ));
    }
    // delivered: 1..4 and 6..22, one per serialization time; the client ACKs each, its window
    // growing by 16 units (2 kB) an ACK
    let delivered: Vec<u32> = (1..=4).chain(6..=22).collect();
    let mut win = 500u16;
    let mut ack = |t: i64, a: u32, ev: &mut Vec<(i64, P)>| {
        win += 16;
        let mut pk = p(true, 1101, a, A, 0);
        pk.win = win;
        ev.push((t, pk));
    };
    for (i, &k) in delivered.iter().enumerate() {
        let a = if k <= 4 { seq(k + 1) } else { seq(5) };
        ack(t0 + rtt + (i as i64 + 1) * tx, a, &mut ev);
    }
    // fast retransmit of segment 5 after the third duplicate ACK; its ACK covers up to 22
    let t5 = t0 + rtt + 8 * tx + 50 * US;
    ev.push((t5, p(false, seq(5), 1101, A, 1000)));
    let ta = t5 + tx + rtt;
    ack(ta, seq(23), &mut ev);
    // the partial ACK triggers the resend of 23..30, each ACKed as it arrives
    let tr = ta + 50 * US;
    for j in 0..8u32 {
        ev.push((
            tr + j as i64 * 10 * US,
            p(false, seq(23 + j), 1101, A, 1000),
        ));
        ack(tr + rtt + (j as i64 + 1) * tx, seq(24 + j), &mut ev);
    }
    let tf = tr + rtt + 9 * tx;
    let mut fin = p(true, 1101, seq(31), F | A, 0);
    fin.win = 500 + 30 * 16;
    ev.push((tf, fin));
    ev.push((tf + 100 * US, p(false, seq(31), 1102, F | A, 0)));
    ev.sort_by_key(|e| e.0);
    for (t, pk) in ev {
        w.send(t, pk);
    }
    let r = &w.finish()[0];
    let bw = r.bw_bps.unwrap();
    assert!((bw - 10e6).abs() < 1e4, "{bw}");
    assert_eq!(r.data_pkts_down, 39);
    assert_eq!(r.retx_down, 9);
    assert_eq!(r.spurious_retx_down, 0);
    assert_eq!(r.loss_rate_down, Some(9.0 / 39.0));
    assert_eq!(r.loss_random_down, Some(1.0 / 39.0));
    assert_eq!(r.queue_down_pkts, Some(21));
    assert_eq!(r.queue_down_full, Some(true));
    assert_eq!(r.rwin_bytes, Some(500 << 7));
    assert_eq!(r.rwin_max_bytes, Some((500 + 30 * 16) << 7));
}

/// The writer's multi-row statements: 150 exchanges and as many RTT rows go through two full
/// 64-row statements and 22 single-row ones each; every row must come back in order, whole.
#[test]
fn store_round_trip_across_statement_chunks() {
    let cfg = Config {
        rtt_rows: 1000,
        ..Config::default()
    };
    let mut w = Wire::new();
    w.an = Analyzer::new(cfg);
    let rtt = 10 * MS;
    let t = w.handshake(0, rtt, 1000, 5000);
    let (mut cs, mut ss) = (1001u32, 5001u32);
    for k in 0..150i64 {
        let tk = t + MS + k * 50 * MS;
        let (req, resp) = (100 + k as u32, 500 + 3 * k as u32);
        w.send(tk, p(true, cs, ss, PA, req));
        cs += req;
        w.send(tk + 2 * MS, p(false, ss, cs, PA, resp));
        ss += resp;
        w.send(tk + 2 * MS + rtt, p(true, cs, ss, A, 0));
    }
    let r = w.finish().remove(0);
    assert_eq!(r.exchanges.len(), 150);
    let rtts = r.rtt_samples.len();
    assert!(rtts > 150, "{rtts} RTT rows");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flows.db");
    let mut store = crate::store::RecordStore::create(&path).unwrap();
    let id = r.id as i64;
    let want: Vec<(i64, i64, i64, Option<i64>)> = r
        .exchanges
        .iter()
        .map(|e| {
            (
                e.seq as i64,
                e.req_bytes as i64,
                e.resp_bytes as i64,
                e.t_req_first.map(|t| t.as_micros()),
            )
        })
        .collect();
    let want_rtt: Vec<(i64, i64, String)> = r
        .rtt_samples
        .iter()
        .map(|s| (s.t.as_micros(), s.rtt_us, s.kind.as_str().to_string()))
        .collect();
    // the kinds are stored as their names: the handshake's and data's here
    for k in [
        crate::record::RttKind::Handshake,
        crate::record::RttKind::Data,
    ] {
        assert!(
            want_rtt.iter().any(|w| w.2 == k.as_str()),
            "no {k:?} sample"
        );
    }
    store.insert(r).unwrap();
    store.commit().unwrap();
    let db = rusqlite::Connection::open(&path).unwrap();
    let got: Vec<(i64, i64, i64, Option<i64>)> = db
        .prepare("SELECT seq, req_bytes, resp_bytes, t_req_first FROM exchanges WHERE conn_id = ? ORDER BY rowid")
        .unwrap()
        .query_map([id], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(got, want);
    assert_eq!(want[149], (149, 249, 947, want[149].3));
    let got_rtt: Vec<(i64, i64, String)> = db
        .prepare("SELECT t_us, rtt_us, kind FROM rtt_samples WHERE conn_id = ? ORDER BY rowid")
        .unwrap()
        .query_map([id], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(got_rtt, want_rtt);
    let n: i64 = db
        .query_row(
            "SELECT exchanges FROM connections WHERE id = ?",
            [id],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(n, 150);
}

#[test]
fn a_full_table_closes_a_tenth_terminated_first_and_flags_only_open_ones() {
    let cfg = Config {
        max_connections: 20,
        ..Config::default()
    };
    let mut w = Wire::new();
    w.an = Analyzer::new(cfg);
    // 20 connections: the first ten finish (FIN both ways) and linger, the other ten stay open;
    // the open ones are older, so by idleness alone they would go first
    for i in 0..20u16 {
        w.cport = 41000 + i;
        let t = w.handshake(i as i64 * MS, 10 * MS, 1000, 5000);
        if i < 10 {
            w.send(t + 20 * MS, p(true, 1001, 5001, F | A, 0));
            w.send(t + 21 * MS, p(false, 5001, 1002, F | A, 0));
            w.send(t + 31 * MS, p(true, 1002, 5002, A, 0));
        }
    }
    assert!(w.an.poll_record().is_none());
    // the 21st makes room: exactly a tenth (two), terminated ones, not flagged
    w.cport = 42000;
    w.handshake(100 * MS, 10 * MS, 1000, 5000);
    let mut out = Vec::new();
    while let Some(r) = w.an.poll_record() {
        out.push(r);
    }
    assert_eq!(out.len(), 2);
    assert_eq!(w.an.stats().evicted, 2);
    for r in &out {
        assert!(
            r.client_port < 41010,
            "an open connection went first: {}",
            r.client_port
        );
        assert!(r.complete(), "{:?}", r.prune);
        assert_eq!(r.termination, Termination::Fin);
    }
    // once no terminated one is left, open ones go and are flagged
    for i in 0..10u16 {
        w.cport = 43000 + i;
        w.handshake(200 * MS + i as i64 * MS, 10 * MS, 1000, 5000);
    }
    let rest: Vec<_> = w.finish();
    let evicted: Vec<_> = rest
        .iter()
        .filter(|r| r.prune.contains(&PruneReason::Evicted))
        .collect();
    assert!(!evicted.is_empty());
    assert!(evicted.iter().all(|r| r.termination == Termination::None));
}

#[test]
fn one_frame_stamped_in_the_future_does_not_stop_idle_closing() {
    let cfg = Config {
        idle_timeout_ns: 10 * 1_000 * MS,
        linger_ns: 1_000 * MS,
        ..Config::default()
    };
    let mut w = Wire::new();
    w.an = Analyzer::new(cfg);
    // a stray frame three years ahead, then 500 short connections one second apart
    w.cport = 39999;
    w.send(3 * 365 * 86_400 * 1_000 * MS, p(true, 1, 1, A, 0));
    for i in 0..500u16 {
        w.cport = 40000 + i;
        let t = w.handshake(i as i64 * 1_000 * MS, 10 * MS, 1000, 5000);
        w.send(t + MS, p(true, 1001, 5001, F | A, 0));
        w.send(t + 2 * MS, p(false, 5001, 1002, F | A, 0));
        w.send(t + 12 * MS, p(true, 1002, 5002, A, 0));
    }
    // they are closed as capture time passes them, not all kept to the end
    assert!(
        w.an.stats().peak_connections < 10,
        "peak {}",
        w.an.stats().peak_connections
    );
    assert_eq!(w.finish().len(), 501);
}

/// What the trace reader notes of frames it still passes on (a sub-second field of a second or
/// more, a frame without a timestamp) and the drops a pcapng capture reports were counted by
/// the reader but reached neither the summary nor the `meta` table.
#[test]
fn reader_notes_reach_the_summary_and_meta() {
    let le32 = |v: &mut Vec<u8>, xs: &[u32]| {
        for x in xs {
            v.extend(x.to_le_bytes());
        }
    };
    // classic pcap (little-endian, µs): one frame stamped 10 s + 1,500,000 µs
    let mut pcap = Vec::new();
    le32(&mut pcap, &[0xa1b2_c3d4, 0x0004_0002, 0, 0, 65535, 1]);
    le32(&mut pcap, &[10, 1_500_000, 4, 4]);
    pcap.extend(b"abcd");
    // pcapng (little-endian): section, Ethernet interface, a Simple Packet Block (no
    // timestamp), interface statistics with isb_ifdrop = 7
    let block = |v: &mut Vec<u8>, block_type: u32, body: &[u32]| {
        let len = 12 + 4 * body.len() as u32;
        le32(v, &[block_type, len]);
        le32(v, body);
        le32(v, &[len]);
    };
    let mut ng = Vec::new();
    block(&mut ng, 0x0a0d_0d0a, &[0x1a2b_3c4d, 1, u32::MAX, u32::MAX]);
    block(&mut ng, 1, &[1, 65535]);
    block(&mut ng, 3, &[4, u32::from_le_bytes(*b"abcd")]);
    block(&mut ng, 5, &[0, 0, 0, 5 | (8 << 16), 7, 0, 0]);

    let dir = tempfile::tempdir().unwrap();
    for (name, bytes, want) in [("f.pcap", pcap, [1, 0, 0]), ("s.pcapng", ng, [0, 1, 7])] {
        let input = dir.path().join(name);
        std::fs::write(&input, bytes).unwrap();
        let out = dir.path().join(format!("{name}.db"));
        let s = crate::driver::analyze_file(&input, &out).unwrap();
        assert!(s.input_issues.is_empty(), "{name}: {:?}", s.input_issues);
        assert_eq!(s.frames, 1, "{name}");
        let got = [s.ts_invalid_fraction, s.ts_missing, s.capture_dropped];
        assert_eq!(got, want, "{name}");
        let db = rusqlite::Connection::open(&out).unwrap();
        for (key, w) in ["ts_invalid_fraction", "ts_missing", "capture_dropped"]
            .iter()
            .zip(want)
        {
            let v = mimic_core::db::get_meta(&db, key).unwrap();
            assert_eq!(v, Some(w.to_string()), "{name}: meta {key}");
        }
    }
}

/// Where a test's frames go: (frame number, time, segment).
type FrameSink<'a> = dyn FnMut(u64, Timestamp, &TcpSegment) + 'a;

/// Runs frames through an analyzer with compact half-open entries and one without (every
/// connection a full `Conn` from its first packet, as before they existed): records (their
/// Debug text, so NaN equals NaN) and counters must be the same. Returns the records, how
/// many connections started as a half-open entry, and the counters.
fn same_with_and_without_half_open(
    cfg: &Config,
    frames: &mut dyn FnMut(&mut FrameSink),
) -> (Vec<ConnectionRecord>, u64, crate::AnalyzerStats) {
    let mut with = Analyzer::new(cfg.clone());
    let mut without = Analyzer::new(cfg.clone()).without_half_open();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    frames(&mut |no, t, seg| {
        with.handle_segment(no, t, seg);
        without.handle_segment(no, t, seg);
        while let Some(r) = with.poll_record() {
            a.push(r);
        }
        while let Some(r) = without.poll_record() {
            b.push(r);
        }
    });
    with.finish();
    without.finish();
    a.extend(std::iter::from_fn(|| with.poll_record()));
    b.extend(std::iter::from_fn(|| without.poll_record()));
    assert_eq!(a.len(), b.len(), "number of records");
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(format!("{x:?}"), format!("{y:?}"), "connection {}", y.id);
    }
    assert_eq!(with.stats(), without.stats());
    (a, with.half_opened, with.stats().clone())
}

/// One scripted packet: (time in ms, from the client, seq, ack, flags, payload, IPv4 id,
/// options).
type Step = (i64, bool, u32, u32, u16, u32, Option<u16>, TcpOptions);

fn run_script(cfg: &Config, script: &[Step]) -> (Vec<ConnectionRecord>, u64) {
    let (recs, half, _) = run_frames(cfg, script);
    (recs, half)
}

fn run_frames(cfg: &Config, script: &[Step]) -> (Vec<ConnectionRecord>, u64, crate::AnalyzerStats) {
    let c: IpAddr = "10.0.0.1".parse().unwrap();
    let s: IpAddr = "10.0.0.2".parse().unwrap();
    same_with_and_without_half_open(cfg, &mut |sink| {
        for (no, &(t, client, seq, ack, flags, len, ip_id, opts)) in script.iter().enumerate() {
            let (src, dst, sport, dport) = if client {
                (c, s, 40000, 80)
            } else {
                (s, c, 80, 40000)
            };
            let payload = [b'G'; 64];
            let seg = TcpSegment {
                vlan: VlanStack::NONE,
                src,
                dst,
                sport,
                dport,
                seq: SeqNum(seq),
                ack: SeqNum(ack),
                flags: TcpFlags(flags),
                window: 64240,
                options: opts,
                payload_len: len,
                payload: &payload[..len.min(64) as usize],
                ip_ecn: 0,
                hdr_len: 40,
                ip_id,
            };
            let t = Timestamp::from_nanos(1_700_000_000 * 1_000_000_000 + t * MS);
            sink(no as u64 + 1, t, &seg);
        }
    })
}

/// Connections that start with SYNs and then go every way a half-open entry has to give up
/// (or keep) its compact form produce the same records with and without the entry.
#[test]
fn half_open_entries_change_no_record() {
    let o = syn_opts(1460, 7);
    let ts = TcpOptions {
        timestamp: Some((7, 0)),
        ..o
    };
    let n = TcpOptions::default();
    let ecn = S | TcpFlags::ECE | TcpFlags::CWR;
    let id = Some;
    let handshake_and_request: Vec<Step> = vec![
        (3100, false, 900, 1001, S | A, 0, id(50), o),
        (3150, true, 1001, 901, A, 0, id(13), n),
        (3160, true, 1001, 901, PA, 40, id(14), n),
        (3200, false, 901, 1041, PA, 200, id(51), n),
        (3250, true, 1041, 1101, F | A, 0, id(15), n),
        (3260, false, 1101, 1042, F | A, 0, id(52), n),
    ];
    let with = |head: &[Step]| -> Vec<Step> {
        head.iter().chain(&handshake_and_request).copied().collect()
    };
    let cfg = Config::default();
    let scripts: Vec<(&str, Vec<Step>, u64)> = vec![
        ("a SYN alone", vec![(0, true, 1000, 0, S, 0, id(10), ts)], 1),
        (
            "completes",
            with(&[(0, true, 1000, 0, S, 0, id(10), ts)]),
            1,
        ),
        (
            "two retransmissions, ECN dropped, then completes",
            with(&[
                (0, true, 1000, 0, ecn, 0, id(10), ts),
                (1000, true, 1000, 0, S, 0, id(11), ts),
                (3000, true, 1000, 0, S, 0, id(12), ts),
            ]),
            1,
        ),
        (
            "a captured-twice SYN (same IP id)",
            with(&[
                (0, true, 1000, 0, S, 0, id(10), o),
                (0, true, 1000, 0, S, 0, id(10), o),
            ]),
            1,
        ),
        (
            "three retransmissions (one past the entry)",
            vec![
                (0, true, 1000, 0, S, 0, id(10), o),
                (1000, true, 1000, 0, S, 0, id(11), o),
                (3000, true, 1000, 0, S, 0, id(12), o),
                (7000, true, 1000, 0, S, 0, id(13), o),
            ],
            1,
        ),
        (
            "a retransmission 5 s later",
            vec![
                (0, true, 1000, 0, S, 0, None, o),
                (5000, true, 1000, 0, S, 0, None, o),
            ],
            1,
        ),
        (
            "a new ISN, then completes",
            with(&[
                (0, true, 77, 0, S, 0, id(10), o),
                (1000, true, 1000, 0, S, 0, id(11), o),
            ]),
            1,
        ),
        (
            "a retransmission with other options",
            vec![
                (0, true, 1000, 0, S, 0, id(10), ts),
                (1000, true, 1000, 0, S, 0, id(11), o),
            ],
            1,
        ),
        (
            "a SYN then time steps back",
            vec![
                (10, true, 1000, 0, S, 0, id(10), o),
                (5, true, 1000, 0, S, 0, id(11), o),
            ],
            1,
        ),
        (
            "a SYN answered by a RST",
            vec![
                (0, true, 1000, 0, S, 0, id(10), o),
                (1, false, 0, 1001, R | A, 0, id(90), n),
            ],
            1,
        ),
        (
            "simultaneous open",
            vec![
                (0, true, 1000, 0, S, 0, id(10), o),
                (1, false, 900, 0, S, 0, id(90), o),
            ],
            1,
        ),
        (
            "data with no SYN-ACK seen",
            vec![
                (0, true, 1000, 0, S, 0, id(10), o),
                (50, true, 1001, 901, PA, 40, id(11), n),
            ],
            1,
        ),
        (
            "a SYN with data (fast open): a full Conn from the start",
            vec![(0, true, 1000, 0, S, 20, id(10), o)],
            0,
        ),
        (
            "mid-stream: no SYN",
            vec![(0, true, 1000, 5, PA, 20, id(10), n)],
            0,
        ),
    ];
    for (what, script, half) in &scripts {
        let (recs, opened) = run_script(&cfg, script);
        assert_eq!(recs.len(), 1, "{what}: records");
        assert_eq!(opened, *half, "{what}: half-open entries");
    }
    // port reuse after a completed connection, then a fresh attempt on the same 4-tuple
    let mut reuse = with(&[(0, true, 1000, 0, S, 0, id(10), o)]);
    reuse.push((10_000, true, 5000, 0, S, 0, id(20), o));
    reuse.push((11_000, true, 5000, 0, S, 0, id(21), o));
    let (recs, _, stats) = run_frames(&cfg, &reuse);
    assert_eq!(recs.len(), 2);
    assert_eq!(stats.port_reuse, 1);
    // closed by eviction from a table of one (other clients' SYNs and data), and by the idle
    // timeout (their packets moving time on)
    let short = Config {
        idle_timeout_ns: 100 * 1_000 * MS,
        max_connections: 1,
        ..Config::default()
    };
    for (gap, evicted, idle) in [(10 * MS, 3, 0), (400_000 * MS, 0, 3)] {
        let (recs, _, stats) = same_with_and_without_half_open(&short, &mut |sink| {
            let c: IpAddr = "10.0.0.1".parse().unwrap();
            let s: IpAddr = "10.0.0.2".parse().unwrap();
            for k in 0..4u16 {
                let seg = TcpSegment {
                    vlan: VlanStack::NONE,
                    src: c,
                    dst: s,
                    sport: 40000 + k,
                    dport: 80,
                    seq: SeqNum(1000),
                    ack: SeqNum(0),
                    flags: TcpFlags(if k == 2 { PA } else { S }),
                    window: 64240,
                    options: o,
                    payload_len: if k == 2 { 10 } else { 0 },
                    payload: &[],
                    ip_ecn: 0,
                    hdr_len: 40,
                    ip_id: Some(k),
                };
                let t = Timestamp::from_nanos(1_700_000_000 * 1_000_000_000 + k as i64 * gap);
                sink(k as u64 + 1, t, &seg);
            }
        });
        let flagged = recs
            .iter()
            .filter(|r| r.prune.contains(&PruneReason::Evicted))
            .count();
        assert_eq!(recs.len(), 4);
        assert_eq!(flagged, evicted, "{recs:?}");
        assert_eq!(stats.evicted, evicted as u64);
        assert_eq!(stats.idle_closed, idle);
    }
}

/// The same on every public capture (the malformed ones read up to their fault), with the
/// default table and with a small one (eviction and idle closing of half-open entries among
/// full connections). Without the public corpus, the same over generated captures of every
/// format and link type (said on stderr).
#[test]
fn half_open_entries_change_no_record_on_the_public_captures() {
    let (inputs, corpus) = match public_captures() {
        Some(c) => (c, true),
        None => {
            note_generated("half_open_entries_change_no_record_on_the_public_captures");
            (generated_captures(), false)
        }
    };
    let small = Config {
        max_connections: 16,
        idle_timeout_ns: 5 * 1_000 * MS,
        linger_ns: 1_000 * MS,
        ..Config::default()
    };
    let (mut conns, mut half) = (0, 0);
    for (i, bytes) in inputs.iter().enumerate() {
        for cfg in [&Config::default(), &small] {
            let Ok(mut r) =
                mimic_core::trace::TraceReader::from_bytes(format!("capture {i}"), bytes.clone())
            else {
                continue;
            };
            let (recs, opened, _) = same_with_and_without_half_open(cfg, &mut |sink| {
                let mut no = 0;
                while let Ok(Some(fr)) = r.next_frame() {
                    no += 1;
                    if let Ok(seg) = mimic_core::packet::decode(fr.link, fr.data) {
                        sink(no, fr.ts, &seg);
                    }
                }
            });
            conns += recs.len();
            half += opened;
        }
    }
    // the corpus holds thousands of connections, most of them opened by a SYN; the generated
    // captures 3 connections each, two of them with a handshake (174 and 108 over both tables)
    eprintln!(
        "{} captures, {conns} connections, {half} opened by a half-open entry",
        inputs.len()
    );
    let (min_conns, min_half) = if corpus { (5_000, 3_000) } else { (150, 90) };
    assert!(
        conns > min_conns && half > min_half,
        "{conns} connections, {half} half-open"
    );
}

/// What a half-open connection costs in the table, and that a SYN scan fills the compact
/// table only. A `Conn` with its first allocations is about 2.4 kB; an entry is the key and
/// 56 bytes (plus the hash table's free buckets: 1.15–2.3×).
#[test]
fn a_syn_scan_costs_a_compact_entry_per_connection() {
    use crate::halfopen::HalfOpen;
    assert!(
        std::mem::size_of::<(mimic_core::FlowKey, HalfOpen)>() <= 104,
        "a half-open entry grew: {} bytes",
        std::mem::size_of::<(mimic_core::FlowKey, HalfOpen)>()
    );
    let mut an = Analyzer::new(Config::default());
    let dst: IpAddr = "198.19.255.1".parse().unwrap();
    for i in 0..200_000u32 {
        let src = IpAddr::from([198, 18, (i >> 16) as u8, (i >> 8) as u8]);
        let seg = TcpSegment {
            vlan: VlanStack::NONE,
            src,
            dst,
            sport: 1024 + (i & 0xff) as u16,
            dport: 80,
            seq: SeqNum(i.wrapping_mul(2_654_435_761)),
            ack: SeqNum(0),
            flags: TcpFlags(S),
            window: 64240,
            options: syn_opts(1460, 7),
            payload_len: 0,
            payload: &[],
            ip_ecn: 0,
            hdr_len: 60,
            ip_id: Some(i as u16),
        };
        let t = Timestamp::from_nanos(1_700_000_000 * 1_000_000_000 + i as i64 * 10 * US);
        an.handle_segment(i as u64 + 1, t, &seg);
        assert!(an.poll_record().is_none());
    }
    assert_eq!(an.half.len(), 200_000);
    assert_eq!(an.table.len(), 0, "no SYN needed a full Conn");
    an.finish();
    let mut n = 0;
    while let Some(r) = an.poll_record() {
        assert_eq!(r.syn_retx, 0);
        n += 1;
    }
    assert_eq!(n, 200_000);
}

/// `Config::shard`: the records of N shard analyzers, each fed every frame, are exactly the
/// unsharded analyzer's (compared whole, by id), also with idle timeouts and a linger short
/// enough that sweeps close connections mid-capture (a shard's clock moves with the other
/// shards' frames too, or its sweeps would fall elsewhere); each connection is in one shard.
#[test]
fn shards_partition_the_records_exactly() {
    use mimic_core::community_id::Shard;
    let inputs = public_captures().unwrap_or_else(|| {
        note_generated("shards_partition_the_records_exactly");
        generated_captures()
    });
    let short = Config {
        idle_timeout_ns: 2 * 1_000 * MS,
        linger_ns: 500 * MS,
        ..Config::default()
    };
    let n = 3u32;
    let (mut conns, mut spread) = (0, 0);
    for (i, bytes) in inputs.iter().enumerate() {
        for cfg in [&Config::default(), &short] {
            let Ok(mut r) =
                mimic_core::trace::TraceReader::from_bytes(format!("capture {i}"), bytes.clone())
            else {
                continue;
            };
            let mut whole = Analyzer::new(cfg.clone());
            let mut parts: Vec<Analyzer> = (1..=n)
                .map(|k| {
                    Analyzer::new(Config {
                        shard: Some(Shard::new(k, n).unwrap()),
                        ..cfg.clone()
                    })
                })
                .collect();
            let (mut a, mut b) = (Vec::new(), Vec::new());
            let mut no = 0;
            while let Ok(Some(fr)) = r.next_frame() {
                no += 1;
                let (t, link, data) = (fr.ts, fr.link, fr.data);
                let _ = whole.handle_frame(no, t, link, data);
                a.extend(std::iter::from_fn(|| whole.poll_record()));
                for p in parts.iter_mut() {
                    let _ = p.handle_frame(no, t, link, data);
                    b.extend(std::iter::from_fn(|| p.poll_record()));
                }
            }
            whole.finish();
            a.extend(std::iter::from_fn(|| whole.poll_record()));
            let mut per = Vec::new();
            for p in parts.iter_mut() {
                p.finish();
                b.extend(std::iter::from_fn(|| p.poll_record()));
                per.push(p.stats().connections);
            }
            a.sort_by_key(|r| r.id);
            b.sort_by_key(|r| r.id);
            assert_eq!(a.len(), b.len(), "capture {i}: records");
            for (x, y) in a.iter().zip(&b) {
                assert_eq!(
                    format!("{x:?}"),
                    format!("{y:?}"),
                    "capture {i}: connection {}",
                    x.id
                );
            }
            let w = whole.stats();
            let seg: u64 = parts.iter().map(|p| p.stats().tcp_segments).sum();
            assert_eq!(seg, w.tcp_segments, "capture {i}");
            for p in &parts {
                let s = p.stats();
                assert_eq!(s.frames, w.frames, "capture {i}");
                assert_eq!(s.tcp_segments + s.other_shard_segments, w.tcp_segments);
                assert_eq!(s.time_backwards, w.time_backwards, "capture {i}");
                assert_eq!(s.skipped, w.skipped, "capture {i}");
            }
            conns += a.len();
            spread += (per.iter().filter(|&&c| c > 0).count() > 1) as usize;
        }
    }
    eprintln!(
        "{} captures, {conns} connections, split among {n} shards",
        inputs.len()
    );
    assert!(
        conns > 100 && spread > 4,
        "{conns} connections, {spread} captures split"
    );
}

mod coarse;

/// A response through a 128 kbit/s bottleneck behind 200 ms of propagation, as a token bucket
/// (`bucket`: each packet leaves at the start of its transmission slot, htb) or a
/// store-and-forward link (at its end) delivers it: a 300-byte header and ten 1000-byte
/// segments sent back to back (nginx writes the header first), each acknowledged as it arrives;
/// then, after a pause, a second response of four segments.
fn shaped_response(bucket: bool) -> ConnectionRecord {
    let mut w = Wire::new();
    let prop = 200 * MS;
    let ns_per_byte = 8e9 / 128e3;
    let ser = |wire: u32| (wire as f64 * ns_per_byte) as i64;
    // the handshake: the SYN-ACK (40 IP bytes) serializes on a link, not through a bucket
    let t = w.handshake(0, prop + if bucket { 0 } else { ser(40) }, 1000, 5000);
    let mut ev: Vec<(i64, P)> = Vec::new();
    let mut busy = 0i64;
    let mut seq = 5001u32;
    let mut req_seq = 1001u32;
    for (t_req, lens) in [
        (
            t + MS,
            vec![
                300u32, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000,
            ],
        ),
        (t + 6000 * MS, vec![300, 1000, 1000, 1000]),
    ] {
        ev.push((t_req, p(true, req_seq, seq, PA, 100)));
        req_seq += 100;
        let t0 = t_req + 5 * MS;
        for (k, len) in lens.into_iter().enumerate() {
            let ts = t0 + k as i64 * 10 * US;
            ev.push((ts, p(false, seq, req_seq, A, len)));
            let start = busy.max(ts);
            busy = start + ser(len + 40);
            seq += len;
            let delivered = if bucket { start } else { busy };
            ev.push((delivered + prop, p(true, req_seq, seq, A, 0)));
        }
    }
    let tf = busy + prop + 10 * MS;
    ev.push((tf, p(true, req_seq, seq, F | A, 0)));
    ev.push((tf + 100 * US, p(false, seq, req_seq + 1, F | A, 0)));
    ev.push((tf + 100 * US + prop, p(true, req_seq + 1, seq + 1, A, 0)));
    ev.sort_by_key(|e| e.0);
    for (t, pk) in ev {
        w.send(t, pk);
    }
    w.finish().remove(0)
}

/// The kind of shaper behind propagation delay: through htb's token bucket the packets that met
/// a short queue come back one serialization (65 ms a segment) sooner than a serializing link
/// at the same rate would have returned them, and `shaper_lead_down` says about 1; through a
/// store-and-forward link about 0. The handshake alone (200 ms against the SYN-ACK's 2.5 ms of
/// serialization) cannot tell them apart. The nginx-style header segment in front of the body
/// does not make a link look like a bucket.
#[test]
fn a_token_bucket_is_told_from_a_serializing_link_behind_propagation_delay() {
    let b = shaped_response(true);
    let bw = b.bw_bps.expect("a rate");
    assert!((bw - 128e3).abs() < 128e3 * 0.05, "{bw}");
    let lead = b.shaper_lead_down.expect("a lead");
    assert!(lead > 0.8, "token bucket: lead {lead}");
    let s = shaped_response(false);
    let bw = s.bw_bps.expect("a rate");
    assert!((bw - 128e3).abs() < 128e3 * 0.05, "{bw}");
    let lead = s.shaper_lead_down.expect("a lead");
    assert!(lead < 0.2, "serializing link: lead {lead}");
    // with no rate there is nothing to measure against
    let mut w = Wire::new();
    let t = w.handshake(0, 200 * MS, 1000, 5000);
    w.send(t + MS, p(true, 1001, 5001, PA, 100));
    w.send(t + 5 * MS, p(false, 5001, 1101, A, 1000));
    w.send(t + 5 * MS + 200 * MS, p(true, 1101, 6001, A, 0));
    assert_eq!(w.finish()[0].shaper_lead_down, None);
}

/// A client whose window shrinks while it reads (from 60,000 by 2,000 an ACK to 42,000, then
/// back up by 5,000 an ACK to 62,000; raw, before its window scale), the server sending a segment per ACK: the exchange's
/// window profile has the first window and each that moved by 1/8 or more from the last
/// point, at the response bytes acknowledged with it. The last ACK, with nothing left
/// outstanding, adds none.
#[test]
fn a_window_that_shrinks_and_grows_within_a_response_is_its_profile() {
    let e = sixteen_segments(60000, |k| {
        let raw = if k < 10 {
            60000 - k * 2000
        } else {
            (42000 + (k - 9) * 5000).min(62000)
        };
        raw as u16
    });
    // in bytes: the client's window scale is 7
    let want: Vec<(u64, u64)> = [
        (1460, 60000),
        (7300, 52000),
        (13140, 44000),
        (17520, 52000),
        (20440, 62000),
    ]
    .into_iter()
    .map(|(at, w)| (at, w << 7))
    .collect();
    assert_eq!(e.rwin_profile, want);
    // no read rate: the window never fell below a quarter of its largest
    assert_eq!(e.read_rate_bps, None);
}
