//! Captures written from scripted TCP conversations: the test suite's own pcap and pcapng files.
//!
//! A [`Conn`] is one TCP connection as a tap in front of the server sees it: the handshake, the
//! client's requests, the server's delays and responses sent at a given rate, the client's
//! ACKs (every second segment, a delayed ACK after 40 ms, an immediate duplicate ACK with a SACK
//! block for a segment that arrives out of order), server segments lost after the tap and
//! retransmitted on the third duplicate ACK (or after a retransmission timeout), and the close.
//! [`write_capture`] merges connections in time order into a file of the chosen [`Format`] and
//! [`Link`] type, optionally cut to a snap length. Packets are built with etherparse (checksums
//! included); files with pcap-parser's serializer, byte-swapped for big-endian pcap.
//!
//! These files are the ones the tests generate when the public corpus is absent; they are
//! ordinary captures that Wireshark, tcptrace and tshark read.

use std::collections::{BTreeMap, BinaryHeap};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use etherparse::{PacketBuilder, TcpOptionElement};
use pcap_parser::{
    EnhancedPacketBlock, InterfaceDescriptionBlock, LegacyPcapBlock, Linktype, PcapHeader,
    SectionHeaderBlock, ToVec,
};

/// The container the frames are written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Classic pcap; `nanos` writes the nanosecond variant (magic a1b23c4d).
    Pcap { big_endian: bool, nanos: bool },
    /// pcapng, one section and one interface (little-endian); `nanos` sets if_tsresol 9.
    Pcapng { nanos: bool },
}

/// The link layer in front of each IP packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Link {
    /// Ethernet II with this stack of 802.1Q tags (outermost first; empty for none).
    Ethernet { vlans: Vec<u16> },
    /// LINKTYPE_RAW: the IP packet alone.
    RawIp,
    /// BSD loopback (DLT_NULL): a 4-byte address family in the file's byte order.
    Null,
    /// Linux cooked capture (SLL).
    LinuxSll,
    /// Linux NFLOG: a 4-byte header and the packet in an NFULA_PAYLOAD attribute.
    Nflog,
}

/// What a file looks like: container, link type, and the snap length frames are cut to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capture {
    pub format: Format,
    pub link: Link,
    /// Frames longer than this are stored cut (caplen < wire length); 262,144 keeps them whole.
    pub snaplen: u32,
}

impl Default for Capture {
    fn default() -> Capture {
        Capture {
            format: Format::Pcap {
                big_endian: false,
                nanos: false,
            },
            link: Link::Ethernet { vlans: Vec::new() },
            snaplen: 262_144,
        }
    }
}

/// How a connection ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Close {
    /// The client sends FIN, the server answers FIN-ACK, the client ACKs.
    Fin,
    /// The client resets the connection.
    Rst,
    /// The capture ends with the connection still open.
    None,
}

/// One request and its response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exchange {
    /// The client's delay before sending the request (after the handshake or the previous
    /// response).
    pub think_ns: i64,
    pub request: Vec<u8>,
    /// The server's delay between the last request byte and the first response byte.
    pub server_delay_ns: i64,
    pub response: Vec<u8>,
    /// The response travels and is acknowledged but the tap never saw it.
    pub response_not_captured: bool,
}

impl Exchange {
    /// An HTTP/1.1 GET of `path` answered by `200 OK` with a body of `body` bytes.
    pub fn http_get(path: &str, body: usize, think_ns: i64, server_delay_ns: i64) -> Exchange {
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: example.test\r\nUser-Agent: mimic-test\r\n\r\n")
                .into_bytes();
        let mut response = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {body}\r\nContent-Type: text/plain\r\n\r\n"
        )
        .into_bytes();
        response.extend((0..body).map(|i| b'a' + (i % 26) as u8));
        Exchange {
            think_ns,
            request,
            server_delay_ns,
            response,
            response_not_captured: false,
        }
    }
}

/// One TCP connection as a tap in front of the server sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conn {
    pub client: SocketAddr,
    pub server: SocketAddr,
    /// When the client's SYN passes the tap (ns since the epoch).
    pub start_ns: i64,
    /// Round trip between the tap and the client.
    pub rtt_ns: i64,
    /// The rate at which the server's segments leave (IP bytes), which sets their spacing.
    pub rate_bps: u64,
    pub mss: u16,
    /// false: the capture starts after the handshake (no SYN, no SYN-ACK).
    pub handshake: bool,
    pub exchanges: Vec<Exchange>,
    pub close: Close,
    /// Server data segments (0-based, counted over the connection's first transmissions)
    /// lost between the tap and the client.
    pub lose: Vec<usize>,
    pub isn_client: u32,
    pub isn_server: u32,
}

impl Conn {
    /// A connection with a handshake, no exchanges yet, 20 ms RTT, 10 Mbit/s, MSS 1460, closed
    /// with FIN.
    pub fn new(client: SocketAddr, server: SocketAddr, start_ns: i64) -> Conn {
        let seed = client.port() as u32 ^ (start_ns as u32).rotate_left(7);
        Conn {
            client,
            server,
            start_ns,
            rtt_ns: 20_000_000,
            rate_bps: 10_000_000,
            mss: 1460,
            handshake: true,
            exchanges: Vec::new(),
            close: Close::Fin,
            lose: Vec::new(),
            isn_client: seed.wrapping_mul(2_654_435_761),
            isn_server: seed.wrapping_mul(40_503).wrapping_add(12_345_678),
        }
    }
}

/// One IP packet as the tap saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    pub t_ns: i64,
    /// The IP packet (IPv4 or IPv6 header, TCP header, payload).
    pub ip: Vec<u8>,
}

struct Seg {
    from_client: bool,
    seq: u32,
    ack: u32,
    flags: u8,
    payload: Vec<u8>,
    sack: Option<(u32, u32)>,
}

const F_FIN: u8 = 1;
const F_SYN: u8 = 2;
const F_RST: u8 = 4;
const F_PSH: u8 = 8;
const F_ACK: u8 = 16;

const DELACK_NS: i64 = 40_000_000;
const GAP_NS: i64 = 20_000;

impl Conn {
    /// Every packet of the connection that the tap saw, in time order.
    pub fn packets(&self) -> Vec<Packet> {
        let mut out: Vec<(i64, Seg)> = Vec::new();
        let half = self.rtt_ns / 2;
        let mut t = self.start_ns;
        let (mut cseq, mut sseq) = (self.isn_client, self.isn_server);
        if self.handshake {
            out.push((t, seg(true, cseq, 0, F_SYN, Vec::new())));
            out.push((
                t + GAP_NS,
                seg(false, sseq, cseq.wrapping_add(1), F_SYN | F_ACK, vec![]),
            ));
            t += GAP_NS + self.rtt_ns;
            out.push((
                t,
                seg(
                    true,
                    cseq.wrapping_add(1),
                    sseq.wrapping_add(1),
                    F_ACK,
                    vec![],
                ),
            ));
        }
        cseq = cseq.wrapping_add(1);
        sseq = sseq.wrapping_add(1);
        let mss = self.mss as usize;
        let spacing =
            |len: usize| ((len as i64 + 40) * 8 * 1_000_000_000) / self.rate_bps.max(1) as i64;
        let mut seg_index = 0usize;
        for ex in &self.exchanges {
            t += ex.think_ns;
            // the request, in MSS-sized segments back to back
            for (i, chunk) in ex.request.chunks(mss.max(1)).enumerate() {
                if i > 0 {
                    t += spacing(chunk.len());
                }
                out.push((t, seg(true, cseq, sseq, F_PSH | F_ACK, chunk.to_vec())));
                cseq = cseq.wrapping_add(chunk.len() as u32);
            }
            if ex.server_delay_ns >= 10_000_000 || ex.response.is_empty() {
                out.push((t + GAP_NS, seg(false, sseq, cseq, F_ACK, Vec::new())));
            }
            let mut last = t + GAP_NS;
            if !ex.response.is_empty() {
                // first transmissions: (tap time, seq, payload, lost, captured)
                let mut send_t = t + ex.server_delay_ns.max(GAP_NS);
                let mut sends: Vec<(i64, u32, Vec<u8>, bool)> = Vec::new();
                for chunk in ex.response.chunks(mss.max(1)) {
                    let lost = self.lose.contains(&seg_index);
                    sends.push((send_t, sseq, chunk.to_vec(), lost));
                    sseq = sseq.wrapping_add(chunk.len() as u32);
                    send_t += spacing(chunk.len());
                    seg_index += 1;
                }
                last = last.max(self.client_acks(&mut out, ex, &sends, cseq, half));
            }
            t = last;
        }
        match self.close {
            Close::Fin => {
                t += 10_000_000;
                out.push((t, seg(true, cseq, sseq, F_FIN | F_ACK, Vec::new())));
                out.push((
                    t + GAP_NS,
                    seg(false, sseq, cseq.wrapping_add(1), F_FIN | F_ACK, vec![]),
                ));
                out.push((
                    t + GAP_NS + self.rtt_ns,
                    seg(
                        true,
                        cseq.wrapping_add(1),
                        sseq.wrapping_add(1),
                        F_ACK,
                        Vec::new(),
                    ),
                ));
            }
            Close::Rst => {
                out.push((t + 10_000_000, seg(true, cseq, 0, F_RST, Vec::new())));
            }
            Close::None => {}
        }
        out.sort_by_key(|(t, _)| *t);
        out.into_iter()
            .map(|(t_ns, s)| Packet {
                t_ns,
                ip: self.build(&s),
            })
            .collect()
    }

    /// Simulates the client receiving the response segments `sends` and the server
    /// retransmitting lost ones; pushes what the tap sees and returns the time of the last
    /// packet.
    fn client_acks(
        &self,
        out: &mut Vec<(i64, Seg)>,
        ex: &Exchange,
        sends: &[(i64, u32, Vec<u8>, bool)],
        cseq: u32,
        half: i64,
    ) -> i64 {
        // arrivals at the client: (time, index into sends, lost on the way)
        let mut heap: BinaryHeap<std::cmp::Reverse<(i64, usize, bool)>> = BinaryHeap::new();
        for (i, (st, _, _, lost)) in sends.iter().enumerate() {
            if !ex.response_not_captured {
                out.push((*st, self.data_seg(sends, i)));
            }
            heap.push(std::cmp::Reverse((st + half, i, *lost)));
        }
        let base = sends[0].1;
        let off = |seq: u32| seq.wrapping_sub(base) as u64;
        let mut rcv_next = base;
        let mut ooo: BTreeMap<u64, u64> = BTreeMap::new(); // offset → end offset
        let mut unacked = 0u32;
        let mut delack_due: Option<i64> = None;
        let mut dupacks: BTreeMap<u32, u32> = BTreeMap::new();
        let mut retransmitted = vec![false; sends.len()];
        let mut last = 0i64;
        let rto = (3 * self.rtt_ns).max(200_000_000);
        let ack_at = |out: &mut Vec<(i64, Seg)>, at: i64, ack: u32, sack: Option<(u32, u32)>| {
            let mut s = seg(true, cseq, ack, F_ACK, Vec::new());
            s.sack = sack;
            out.push((at, s));
        };
        loop {
            let Some(std::cmp::Reverse((arr, i, lost))) = heap.pop() else {
                // lost segments the duplicate ACKs never recovered: retransmission timeout
                let pending: Vec<usize> = (0..sends.len())
                    .filter(|&i| sends[i].3 && !retransmitted[i])
                    .collect();
                if pending.is_empty() {
                    break;
                }
                for i in pending {
                    retransmitted[i] = true;
                    let at = (sends[i].0 + rto).max(last + 1_000_000);
                    out.push((at, self.data_seg(sends, i)));
                    heap.push(std::cmp::Reverse((at + half, i, false)));
                }
                continue;
            };
            if let Some(due) = delack_due {
                if due < arr {
                    ack_at(out, due + half, rcv_next, None);
                    last = last.max(due + half);
                    delack_due = None;
                    unacked = 0;
                }
            }
            if lost {
                continue;
            }
            let (s, e) = (off(sends[i].1), off(sends[i].1) + sends[i].2.len() as u64);
            let next = off(rcv_next);
            let tap = arr + half;
            if s > next {
                ooo.insert(s, e);
                let block = ooo
                    .iter()
                    .find(|(a, b)| **a <= s && s < **b)
                    .map(|(a, b)| (base.wrapping_add(*a as u32), base.wrapping_add(*b as u32)));
                ack_at(out, tap, rcv_next, block);
                last = last.max(tap);
                let n = dupacks.entry(rcv_next).or_insert(0);
                *n += 1;
                if *n == 3 {
                    if let Some(j) = sends.iter().position(|x| x.1 == rcv_next) {
                        if !retransmitted[j] {
                            retransmitted[j] = true;
                            let at = tap + GAP_NS;
                            out.push((at, self.data_seg(sends, j)));
                            heap.push(std::cmp::Reverse((at + half, j, false)));
                        }
                    }
                }
                continue;
            }
            if e <= next {
                // a duplicate: ACK at once
                ack_at(out, tap, rcv_next, None);
                last = last.max(tap);
                continue;
            }
            let filled_hole = !ooo.is_empty();
            let mut n = e;
            while let Some((&a, &b)) = ooo.iter().next() {
                if a > n {
                    break;
                }
                n = n.max(b);
                ooo.remove(&a);
            }
            rcv_next = base.wrapping_add(n as u32);
            unacked += 1;
            if filled_hole || unacked >= 2 {
                ack_at(out, tap, rcv_next, None);
                last = last.max(tap);
                unacked = 0;
                delack_due = None;
            } else {
                delack_due = Some(arr + DELACK_NS);
            }
        }
        if let Some(due) = delack_due {
            ack_at(out, due + half, rcv_next, None);
            last = last.max(due + half);
        }
        last
    }

    fn data_seg(&self, sends: &[(i64, u32, Vec<u8>, bool)], i: usize) -> Seg {
        let flags = if i + 1 == sends.len() {
            F_PSH | F_ACK
        } else {
            F_ACK
        };
        // the client's sequence number is the same for the whole response
        let cseq = self.client_seq_for(sends);
        seg(false, sends[i].1, cseq, flags, sends[i].2.clone())
    }

    /// The client's next sequence number while a response is sent: recomputed from the
    /// exchanges (requests are the only client data).
    fn client_seq_for(&self, sends: &[(i64, u32, Vec<u8>, bool)]) -> u32 {
        let first = sends[0].1;
        let mut c = self.isn_client.wrapping_add(1);
        let mut s = self.isn_server.wrapping_add(1);
        for ex in &self.exchanges {
            c = c.wrapping_add(ex.request.len() as u32);
            if s == first {
                return c;
            }
            s = s.wrapping_add(ex.response.len() as u32);
        }
        c
    }

    fn build(&self, s: &Seg) -> Vec<u8> {
        let (src, dst) = if s.from_client {
            (self.client, self.server)
        } else {
            (self.server, self.client)
        };
        let win = 65_535;
        let b = match (src.ip(), dst.ip()) {
            (IpAddr::V4(a), IpAddr::V4(b)) => PacketBuilder::ipv4(a.octets(), b.octets(), 64),
            (IpAddr::V6(a), IpAddr::V6(b)) => PacketBuilder::ipv6(a.octets(), b.octets(), 64),
            _ => panic!("testcap: a connection between IPv4 and IPv6 addresses"),
        };
        let mut b = b.tcp(src.port(), dst.port(), s.seq, win);
        if s.flags & F_SYN != 0 {
            b = b.syn();
        }
        if s.flags & F_FIN != 0 {
            b = b.fin();
        }
        if s.flags & F_RST != 0 {
            b = b.rst();
        }
        if s.flags & F_PSH != 0 {
            b = b.psh();
        }
        if s.flags & F_ACK != 0 {
            b = b.ack(s.ack);
        }
        let mut opts = Vec::new();
        if s.flags & F_SYN != 0 {
            opts.push(TcpOptionElement::MaximumSegmentSize(self.mss));
            opts.push(TcpOptionElement::Noop);
            opts.push(TcpOptionElement::Noop);
            opts.push(TcpOptionElement::SelectiveAcknowledgementPermitted);
        }
        if let Some(block) = s.sack {
            opts.push(TcpOptionElement::Noop);
            opts.push(TcpOptionElement::Noop);
            opts.push(TcpOptionElement::SelectiveAcknowledgement(block, [None; 3]));
        }
        if !opts.is_empty() {
            b = b.options(&opts).expect("TCP options fit");
        }
        let mut v = Vec::with_capacity(b.size(s.payload.len()));
        b.write(&mut v, &s.payload).expect("writing to a Vec");
        v
    }
}

fn seg(from_client: bool, seq: u32, ack: u32, flags: u8, payload: Vec<u8>) -> Seg {
    Seg {
        from_client,
        seq,
        ack,
        flags,
        payload,
        sack: None,
    }
}

/// The link-layer header for one IP packet.
fn link_header(link: &Link, ip: &[u8], big_endian: bool, from_client: bool) -> Vec<u8> {
    let v6 = ip.first().is_some_and(|b| b >> 4 == 6);
    let ethertype: u16 = if v6 { 0x86dd } else { 0x0800 };
    match link {
        Link::Ethernet { vlans } => {
            let (a, b) = ([0x02, 0, 0, 0, 0, 0x01], [0x02, 0, 0, 0, 0, 0x02]);
            let (src, dst) = if from_client { (a, b) } else { (b, a) };
            let mut h = Vec::with_capacity(14 + 4 * vlans.len());
            h.extend_from_slice(&dst);
            h.extend_from_slice(&src);
            for v in vlans {
                h.extend_from_slice(&0x8100u16.to_be_bytes());
                h.extend_from_slice(&(v & 0x0fff).to_be_bytes());
            }
            h.extend_from_slice(&ethertype.to_be_bytes());
            h
        }
        Link::RawIp => Vec::new(),
        Link::Null => {
            let af: u32 = if v6 { 24 } else { 2 };
            if big_endian {
                af.to_be_bytes().to_vec()
            } else {
                af.to_le_bytes().to_vec()
            }
        }
        Link::LinuxSll => {
            let mut h = Vec::with_capacity(16);
            h.extend_from_slice(&(if from_client { 0u16 } else { 4 }).to_be_bytes());
            h.extend_from_slice(&1u16.to_be_bytes());
            h.extend_from_slice(&6u16.to_be_bytes());
            h.extend_from_slice(&[0x02, 0, 0, 0, 0, if from_client { 1 } else { 2 }, 0, 0]);
            h.extend_from_slice(&ethertype.to_be_bytes());
            h
        }
        Link::Nflog => {
            // family, version 0, resource id; then the payload attribute's length and type
            // (host byte order, little-endian here), the packet following it
            let mut h = vec![if v6 { 10 } else { 2 }, 0, 0, 0];
            h.extend_from_slice(&((4 + ip.len()) as u16).to_le_bytes());
            h.extend_from_slice(&9u16.to_le_bytes());
            h
        }
    }
}

fn linktype(link: &Link) -> Linktype {
    match link {
        Link::Ethernet { .. } => Linktype::ETHERNET,
        Link::RawIp => Linktype::RAW,
        Link::Null => Linktype::NULL,
        Link::LinuxSll => Linktype::LINUX_SLL,
        Link::Nflog => Linktype::NFLOG,
    }
}

/// The bytes of a capture holding every packet of `conns`, merged in time order.
pub fn capture_bytes(cap: &Capture, conns: &[Conn]) -> Vec<u8> {
    let mut frames: Vec<(i64, Vec<u8>)> = Vec::new();
    for c in conns {
        for p in c.packets() {
            let from_client = is_from(&p.ip, c.client);
            let mut f = link_header(
                &cap.link,
                &p.ip,
                matches!(
                    cap.format,
                    Format::Pcap {
                        big_endian: true,
                        ..
                    }
                ),
                from_client,
            );
            f.extend_from_slice(&p.ip);
            if cap.link == Link::Nflog {
                // attributes are padded to 4 bytes
                f.resize(f.len().next_multiple_of(4), 0);
            }
            frames.push((p.t_ns, f));
        }
    }
    frames.sort_by_key(|(t, _)| *t);
    write_frames(cap, &frames)
}

/// Whether an IP packet's source is `addr`.
fn is_from(ip: &[u8], addr: SocketAddr) -> bool {
    match addr.ip() {
        IpAddr::V4(a) => ip.get(12..16) == Some(&a.octets()[..]),
        IpAddr::V6(a) => ip.get(8..24) == Some(&a.octets()[..]),
    }
}

/// Writes whole frames `(t_ns, bytes)` (already in the link type of `cap`) as a capture file's
/// bytes, cutting each to the snap length.
pub fn write_frames(cap: &Capture, frames: &[(i64, Vec<u8>)]) -> Vec<u8> {
    let mut v = Vec::new();
    match cap.format {
        Format::Pcap { big_endian, nanos } => {
            let mut hdr = PcapHeader::new();
            hdr.network = linktype(&cap.link);
            hdr.snaplen = cap.snaplen;
            if nanos {
                hdr.magic_number = 0xa1b2_3c4d;
            }
            let mut h = hdr.to_vec_raw().expect("pcap header");
            if big_endian {
                swap_fields(&mut h, &[4, 2, 2, 4, 4, 4, 4]);
            }
            v.extend(h);
            for (t, f) in frames {
                let caplen = f.len().min(cap.snaplen as usize);
                let sub = if nanos { 1_000_000_000 } else { 1_000_000 };
                let frac = t.rem_euclid(1_000_000_000) / (1_000_000_000 / sub);
                let rec = LegacyPcapBlock {
                    ts_sec: t.div_euclid(1_000_000_000) as u32,
                    ts_usec: frac as u32,
                    caplen: caplen as u32,
                    origlen: f.len() as u32,
                    data: &f[..caplen],
                };
                let mut r = rec.to_vec_raw().expect("pcap record");
                if big_endian {
                    swap_fields(&mut r[..16], &[4, 4, 4, 4]);
                }
                v.extend(r);
            }
        }
        Format::Pcapng { nanos } => {
            let mut shb = SectionHeaderBlock {
                block_type: 0,
                block_len1: 0,
                bom: 0,
                major_version: 1,
                minor_version: 0,
                section_len: -1,
                options: Vec::new(),
                block_len2: 0,
            };
            v.extend(shb.to_vec().expect("SHB"));
            let mut idb = InterfaceDescriptionBlock {
                block_type: 0,
                block_len1: 0,
                linktype: linktype(&cap.link),
                reserved: 0,
                snaplen: cap.snaplen,
                options: Vec::new(),
                block_len2: 0,
                if_tsresol: if nanos { 9 } else { 6 },
                if_tsoffset: 0,
            };
            v.extend(idb.to_vec().expect("IDB"));
            for (t, f) in frames {
                let caplen = f.len().min(cap.snaplen as usize);
                let ts = if nanos {
                    *t as u64
                } else {
                    (*t / 1_000) as u64
                };
                let mut epb = EnhancedPacketBlock {
                    block_type: 0,
                    block_len1: 0,
                    if_id: 0,
                    ts_high: (ts >> 32) as u32,
                    ts_low: ts as u32,
                    caplen: caplen as u32,
                    origlen: f.len() as u32,
                    data: &f[..caplen],
                    options: Vec::new(),
                    block_len2: 0,
                };
                v.extend(epb.to_vec().expect("EPB"));
            }
        }
    }
    v
}

/// Reverses the bytes of consecutive fields of the given widths (little- to big-endian).
fn swap_fields(b: &mut [u8], widths: &[usize]) {
    let mut at = 0;
    for w in widths {
        b[at..at + w].reverse();
        at += w;
    }
}

/// Writes [`capture_bytes`] to `path`.
pub fn write_capture(path: &Path, cap: &Capture, conns: &[Conn]) -> std::io::Result<()> {
    std::fs::write(path, capture_bytes(cap, conns))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::TraceReader;

    fn conn() -> Conn {
        let mut c = Conn::new(
            "10.1.0.1:40000".parse().unwrap(),
            "10.2.0.1:80".parse().unwrap(),
            1_600_000_000_000_000_000,
        );
        c.exchanges
            .push(Exchange::http_get("/a", 20_000, 5_000_000, 3_000_000));
        c.lose = vec![4];
        c
    }

    fn frames(bytes: Vec<u8>) -> Vec<(i64, usize)> {
        let mut r = TraceReader::from_bytes("mem", bytes).unwrap();
        let mut v = Vec::new();
        while let Some(f) = r.next_frame().unwrap() {
            v.push((f.ts.as_nanos(), f.data.len()));
        }
        v
    }

    #[test]
    fn every_format_reads_back_the_same_frames() {
        let c = conn();
        let n = c.packets().len();
        let base = frames(capture_bytes(&Capture::default(), std::slice::from_ref(&c)));
        assert_eq!(base.len(), n);
        for format in [
            Format::Pcap {
                big_endian: true,
                nanos: false,
            },
            Format::Pcap {
                big_endian: false,
                nanos: true,
            },
            Format::Pcapng { nanos: false },
            Format::Pcapng { nanos: true },
        ] {
            let cap = Capture {
                format,
                ..Capture::default()
            };
            assert_eq!(
                frames(capture_bytes(&cap, std::slice::from_ref(&c))),
                base,
                "{format:?}"
            );
        }
    }

    #[test]
    fn a_lost_segment_is_sent_twice_and_acknowledged_in_order() {
        let c = conn();
        let p = c.packets();
        assert!(
            p.windows(2).all(|w| w[0].t_ns <= w[1].t_ns),
            "time goes back"
        );
        let seq = |x: &Packet| u32::from_be_bytes(x.ip[24..28].try_into().unwrap());
        let ack = |x: &Packet| u32::from_be_bytes(x.ip[28..32].try_into().unwrap());
        // the server's data segments (IPv4 + TCP without options: 40 bytes of headers; not
        // the SYN-ACK, whose options make it longer)
        let data: Vec<&Packet> = p
            .iter()
            .filter(|x| x.ip[12..16] == [10, 2, 0, 1] && x.ip.len() > 40 && x.ip[33] & 2 == 0)
            .collect();
        let mut firsts: Vec<u32> = data.iter().map(|x| seq(x)).collect();
        firsts.sort_unstable();
        firsts.dedup();
        // segment 4 was lost after the tap: sent once more, and only that one
        assert_eq!(data.len(), firsts.len() + 1);
        let resent = seq(data.last().unwrap());
        assert_eq!(resent, firsts[4], "the retransmission is the lost segment");
        // three duplicate ACKs (with a SACK block: 12 bytes of options) ask for the hole
        let dupacks = p
            .iter()
            .filter(|x| x.ip[12..16] == [10, 1, 0, 1] && x.ip.len() == 40 + 12)
            .filter(|x| ack(x) == firsts[4])
            .count();
        assert!(dupacks >= 3, "{dupacks} duplicate ACKs");
        // the client's ACK numbers never go backwards
        let acks: Vec<u32> = p
            .iter()
            .filter(|x| x.ip[12..16] == [10, 1, 0, 1] && x.ip[33] & 2 == 0)
            .map(ack)
            .collect();
        assert!(
            acks.windows(2).all(|w| w[1].wrapping_sub(w[0]) < 1 << 31),
            "{acks:?}"
        );
    }
}
