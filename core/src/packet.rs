//! Decoding a captured frame down to a TCP segment.
//!
//! The link layers etherparse does not cover (SLL with non-Ethernet hardware types, SLL2, BSD NULL/LOOP, NFLOG, MPLS label stacks,
//! VLAN stacks deeper than two, PPPoE) are peeled here; IP (v4 and v6 with extension headers)
//! and the TCP header are parsed with etherparse. Nothing here panics on untrusted bytes: every
//! way a frame can be unusable is a [`DecodeError`] value that callers count by reason.
//!
//! Payload length comes from the IP length fields, not from the captured bytes, so a frame cut
//! by a snaplen still reports the segment's real size; `payload` holds only what was captured.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use etherparse::{
    err::ip::LaxHeaderSliceError, Ethernet2HeaderSlice, IpNumber, LaxIpSlice, TcpOptionElement,
    TcpOptionReadError, TcpOptionsIterator, TcpSlice,
};

use crate::flow::{Endpoint, FlowKey, VlanStack};
use crate::seq::SeqNum;

/// Link-layer header types (the pcap LINKTYPE_* registry) that mimic decodes.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum LinkType {
    Null,
    Ethernet,
    Raw,
    Loop,
    LinuxSll,
    LinuxSll2,
    Ipv4,
    Ipv6,
    Nflog,
    Unknown(u32),
}

impl LinkType {
    pub fn from_u32(v: u32) -> LinkType {
        match v {
            0 => LinkType::Null,
            1 => LinkType::Ethernet,
            // LINKTYPE_RAW is 101; some BSDs wrote DLT_RAW as 12 or 14 into files.
            101 | 12 | 14 => LinkType::Raw,
            108 => LinkType::Loop,
            113 => LinkType::LinuxSll,
            276 => LinkType::LinuxSll2,
            228 => LinkType::Ipv4,
            229 => LinkType::Ipv6,
            239 => LinkType::Nflog,
            other => LinkType::Unknown(other),
        }
    }
    pub fn to_u32(self) -> u32 {
        match self {
            LinkType::Null => 0,
            LinkType::Ethernet => 1,
            LinkType::Raw => 101,
            LinkType::Loop => 108,
            LinkType::LinuxSll => 113,
            LinkType::LinuxSll2 => 276,
            LinkType::Ipv4 => 228,
            LinkType::Ipv6 => 229,
            LinkType::Nflog => 239,
            LinkType::Unknown(v) => v,
        }
    }
}

/// Why a frame yielded no TCP segment. Small and `Copy` so the hot path can count it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DecodeError {
    UnsupportedLinkType,
    TruncatedLinkHeader,
    /// ARP, LLC, LLDP, … — a valid frame that carries no IP.
    NotIp,
    TruncatedIpHeader,
    BadIpHeader,
    /// A fragment of a fragmented IP datagram (TCP is not reassembled from fragments).
    IpFragment,
    /// UDP, ICMP, … — a valid IP packet that is not TCP.
    NotTcp,
    TruncatedTcpHeader,
    BadTcpHeader,
}

impl DecodeError {
    pub const ALL: [DecodeError; 9] = [
        DecodeError::UnsupportedLinkType,
        DecodeError::TruncatedLinkHeader,
        DecodeError::NotIp,
        DecodeError::TruncatedIpHeader,
        DecodeError::BadIpHeader,
        DecodeError::IpFragment,
        DecodeError::NotTcp,
        DecodeError::TruncatedTcpHeader,
        DecodeError::BadTcpHeader,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            DecodeError::UnsupportedLinkType => "unsupported_link_type",
            DecodeError::TruncatedLinkHeader => "truncated_link_header",
            DecodeError::NotIp => "not_ip",
            DecodeError::TruncatedIpHeader => "truncated_ip_header",
            DecodeError::BadIpHeader => "bad_ip_header",
            DecodeError::IpFragment => "ip_fragment",
            DecodeError::NotTcp => "not_tcp",
            DecodeError::TruncatedTcpHeader => "truncated_tcp_header",
            DecodeError::BadTcpHeader => "bad_tcp_header",
        }
    }
    /// True for frames that are well-formed but simply not TCP (not an error in the capture).
    pub fn is_benign(self) -> bool {
        matches!(self, DecodeError::NotIp | DecodeError::NotTcp)
    }
}

/// TCP control flags.
#[derive(Copy, Clone, Default, PartialEq, Eq, Hash)]
pub struct TcpFlags(pub u16);

impl TcpFlags {
    pub const FIN: u16 = 0x001;
    pub const SYN: u16 = 0x002;
    pub const RST: u16 = 0x004;
    pub const PSH: u16 = 0x008;
    pub const ACK: u16 = 0x010;
    pub const URG: u16 = 0x020;
    pub const ECE: u16 = 0x040;
    pub const CWR: u16 = 0x080;
    #[inline]
    pub fn fin(self) -> bool {
        self.0 & Self::FIN != 0
    }
    #[inline]
    pub fn syn(self) -> bool {
        self.0 & Self::SYN != 0
    }
    #[inline]
    pub fn rst(self) -> bool {
        self.0 & Self::RST != 0
    }
    #[inline]
    pub fn psh(self) -> bool {
        self.0 & Self::PSH != 0
    }
    #[inline]
    pub fn ack(self) -> bool {
        self.0 & Self::ACK != 0
    }
    #[inline]
    pub fn ece(self) -> bool {
        self.0 & Self::ECE != 0
    }
    #[inline]
    pub fn cwr(self) -> bool {
        self.0 & Self::CWR != 0
    }
}

impl std::fmt::Debug for TcpFlags {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names = [
            (Self::SYN, 'S'),
            (Self::FIN, 'F'),
            (Self::RST, 'R'),
            (Self::PSH, 'P'),
            (Self::ACK, '.'),
            (Self::URG, 'U'),
            (Self::ECE, 'E'),
            (Self::CWR, 'W'),
        ];
        for (bit, c) in names {
            if self.0 & bit != 0 {
                write!(f, "{c}")?;
            }
        }
        Ok(())
    }
}

/// The TCP options mimic uses. Unknown options (MPTCP, TCP-AO, Fast Open, …) are skipped by
/// their length byte; a malformed option list sets `malformed` and keeps what parsed before it.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct TcpOptions {
    pub mss: Option<u16>,
    pub wscale: Option<u8>,
    pub sack_permitted: bool,
    /// SACK blocks as (left edge, right edge); `sack_len` of them are valid.
    pub sack: [(SeqNum, SeqNum); 4],
    pub sack_len: u8,
    /// (TSval, TSecr)
    pub timestamp: Option<(u32, u32)>,
    pub malformed: bool,
}

impl TcpOptions {
    pub fn sack_blocks(&self) -> &[(SeqNum, SeqNum)] {
        &self.sack[..self.sack_len as usize]
    }

    pub fn parse(mut bytes: &[u8]) -> TcpOptions {
        let mut o = TcpOptions::default();
        // fast path for the two layouts that make up nearly every segment: no options, and
        // NOP NOP TS (RFC 7323 appendix A)
        if bytes.is_empty() {
            return o;
        }
        if bytes.len() == 12 && bytes[..4] == [1, 1, 8, 10] {
            let v = u32::from_be_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
            let e = u32::from_be_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
            o.timestamp = Some((v, e));
            return o;
        }
        'outer: loop {
            let mut it = TcpOptionsIterator::from_slice(bytes);
            loop {
                let before = it.rest();
                match it.next() {
                    None => break 'outer,
                    Some(Ok(e)) => o.apply(e),
                    Some(Err(TcpOptionReadError::UnknownId(_))) => {
                        // skip an option etherparse does not know by its own length byte
                        let len = before.get(1).copied().unwrap_or(0) as usize;
                        if len < 2 || len > before.len() {
                            o.malformed = true;
                            break 'outer;
                        }
                        bytes = &before[len..];
                        continue 'outer;
                    }
                    Some(Err(_)) => {
                        o.malformed = true;
                        break 'outer;
                    }
                }
            }
        }
        o
    }

    fn apply(&mut self, e: TcpOptionElement) {
        match e {
            TcpOptionElement::Noop => {}
            TcpOptionElement::MaximumSegmentSize(m) => self.mss = Some(m),
            TcpOptionElement::WindowScale(w) => self.wscale = Some(w),
            TcpOptionElement::SelectiveAcknowledgementPermitted => self.sack_permitted = true,
            TcpOptionElement::SelectiveAcknowledgement(first, rest) => {
                self.sack[0] = (SeqNum(first.0), SeqNum(first.1));
                let mut n = 1;
                for (l, r) in rest.iter().flatten() {
                    self.sack[n] = (SeqNum(*l), SeqNum(*r));
                    n += 1;
                }
                self.sack_len = n as u8;
            }
            TcpOptionElement::Timestamp(v, e) => self.timestamp = Some((v, e)),
        }
    }
}

/// One decoded TCP segment, borrowing the captured payload bytes.
#[derive(Clone, Debug)]
pub struct TcpSegment<'a> {
    pub vlan: VlanStack,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub sport: u16,
    pub dport: u16,
    pub seq: SeqNum,
    pub ack: SeqNum,
    pub flags: TcpFlags,
    /// Raw (unscaled) window field.
    pub window: u16,
    pub options: TcpOptions,
    /// Payload length declared by the IP header (the real segment size, even when truncated).
    pub payload_len: u32,
    /// Captured payload bytes (a prefix of the payload, possibly empty).
    pub payload: &'a [u8],
    /// ECN codepoint of the IP header (0 = not ECT, 3 = CE).
    pub ip_ecn: u8,
    /// Bytes of IP header (with extension headers) plus TCP header: what the segment adds on
    /// the wire at the IP layer beyond its payload.
    pub hdr_len: u16,
    /// IPv4 identification (None for IPv6): the same datagram captured twice carries the same
    /// value, a retransmission normally a new one.
    pub ip_id: Option<u16>,
}

impl TcpSegment<'_> {
    #[inline]
    pub fn flow_key(&self) -> FlowKey {
        FlowKey {
            vlan: self.vlan,
            src: Endpoint::new(self.src, self.sport),
            dst: Endpoint::new(self.dst, self.dport),
        }
    }
    /// The same segment without its payload bytes (e.g. to move it to another thread).
    pub fn without_payload(&self) -> TcpSegment<'static> {
        TcpSegment {
            vlan: self.vlan,
            src: self.src,
            dst: self.dst,
            sport: self.sport,
            dport: self.dport,
            seq: self.seq,
            ack: self.ack,
            flags: self.flags,
            window: self.window,
            options: self.options,
            payload_len: self.payload_len,
            payload: &[],
            ip_ecn: self.ip_ecn,
            hdr_len: self.hdr_len,
            ip_id: self.ip_id,
        }
    }

    /// Sequence space the segment occupies: payload plus one each for SYN and FIN.
    #[inline]
    pub fn seq_len(&self) -> u32 {
        self.payload_len + self.flags.syn() as u32 + self.flags.fin() as u32
    }
}

const ETH_IPV4: u16 = 0x0800;
const ETH_IPV6: u16 = 0x86dd;
const ETH_VLAN: u16 = 0x8100;
const ETH_QINQ: u16 = 0x88a8;
const ETH_QINQ_OLD: u16 = 0x9100;
const ETH_MPLS_UC: u16 = 0x8847;
const ETH_MPLS_MC: u16 = 0x8848;
const ETH_PPPOE_SESSION: u16 = 0x8864;

/// Decodes one captured frame of link type `link` down to its TCP segment.
pub fn decode(link: LinkType, frame: &[u8]) -> Result<TcpSegment<'_>, DecodeError> {
    let mut vlan = VlanStack::NONE;
    let ip = match link {
        LinkType::Ethernet => {
            let eth = Ethernet2HeaderSlice::from_slice(frame)
                .map_err(|_| DecodeError::TruncatedLinkHeader)?;
            let rest = &frame[eth.slice().len()..];
            walk_ethertype(eth.ether_type().0, rest, &mut vlan)?
        }
        LinkType::LinuxSll => {
            // pkttype(2) hatype(2) addrlen(2) addr(8) protocol(2). Peeled by hand: etherparse's
            // SLL slice rejects valid hardware types such as ARPHRD_PPP.
            if frame.len() < 16 {
                return Err(DecodeError::TruncatedLinkHeader);
            }
            let proto = u16::from_be_bytes([frame[14], frame[15]]);
            walk_ethertype(proto, &frame[16..], &mut vlan)?
        }
        LinkType::LinuxSll2 => {
            // protocol(2) reserved(2) ifindex(4) hatype(2) pkttype(1) addrlen(1) addr(8)
            if frame.len() < 20 {
                return Err(DecodeError::TruncatedLinkHeader);
            }
            let proto = u16::from_be_bytes([frame[0], frame[1]]);
            walk_ethertype(proto, &frame[20..], &mut vlan)?
        }
        LinkType::Null | LinkType::Loop => {
            if frame.len() < 4 {
                return Err(DecodeError::TruncatedLinkHeader);
            }
            // NULL stores the address family in the capturing host's byte order, LOOP in
            // network order; accept either.
            let be = u32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]);
            let family = if be > 0xffff { be.swap_bytes() } else { be };
            match family {
                2 => ip_only(&frame[4..], 4)?,
                10 | 24 | 28 | 30 => ip_only(&frame[4..], 6)?,
                _ => return Err(DecodeError::NotIp),
            }
        }
        LinkType::Raw => ip_by_version(frame)?,
        LinkType::Ipv4 => ip_only(frame, 4)?,
        LinkType::Ipv6 => ip_only(frame, 6)?,
        LinkType::Nflog => nflog_payload(frame)?,
        LinkType::Unknown(_) => return Err(DecodeError::UnsupportedLinkType),
    };
    decode_ip(ip, vlan)
}

fn ip_by_version(b: &[u8]) -> Result<&[u8], DecodeError> {
    match b.first().map(|v| v >> 4) {
        Some(4) | Some(6) => Ok(b),
        Some(_) => Err(DecodeError::NotIp),
        None => Err(DecodeError::TruncatedIpHeader),
    }
}

fn ip_only(b: &[u8], version: u8) -> Result<&[u8], DecodeError> {
    match b.first() {
        None => Err(DecodeError::TruncatedIpHeader),
        Some(v) if v >> 4 == version => Ok(b),
        Some(_) => Err(DecodeError::BadIpHeader),
    }
}

/// Follows VLAN tags, MPLS labels and PPPoE to the IP header.
fn walk_ethertype<'a>(
    mut et: u16,
    mut rest: &'a [u8],
    vlan: &mut VlanStack,
) -> Result<&'a [u8], DecodeError> {
    // bounded: each step consumes at least four bytes
    loop {
        match et {
            ETH_IPV4 => return ip_only(rest, 4),
            ETH_IPV6 => return ip_only(rest, 6),
            ETH_VLAN | ETH_QINQ | ETH_QINQ_OLD => {
                let tag = etherparse::SingleVlanHeaderSlice::from_slice(rest)
                    .map_err(|_| DecodeError::TruncatedLinkHeader)?;
                vlan.push(tag.vlan_identifier().value());
                et = tag.ether_type().0;
                rest = &rest[4..];
            }
            ETH_MPLS_UC | ETH_MPLS_MC => {
                loop {
                    if rest.len() < 4 {
                        return Err(DecodeError::TruncatedLinkHeader);
                    }
                    let bottom = rest[2] & 0x01 != 0;
                    rest = &rest[4..];
                    if bottom {
                        break;
                    }
                }
                // After the label stack: IP directly, or an Ethernet pseudowire (optionally
                // with a zero control word) — decided by the first nibble.
                match rest.first().map(|b| b >> 4) {
                    Some(4) | Some(6) => return ip_by_version(rest),
                    Some(0) if rest.len() >= 4 + 14 && rest[..4] == [0, 0, 0, 0] => {
                        let eth = Ethernet2HeaderSlice::from_slice(&rest[4..])
                            .map_err(|_| DecodeError::TruncatedLinkHeader)?;
                        et = eth.ether_type().0;
                        rest = &rest[4 + 14..];
                    }
                    Some(_) => {
                        let eth = Ethernet2HeaderSlice::from_slice(rest)
                            .map_err(|_| DecodeError::TruncatedLinkHeader)?;
                        et = eth.ether_type().0;
                        rest = &rest[14..];
                    }
                    None => return Err(DecodeError::TruncatedIpHeader),
                }
            }
            ETH_PPPOE_SESSION => {
                if rest.len() < 8 {
                    return Err(DecodeError::TruncatedLinkHeader);
                }
                let ppp = u16::from_be_bytes([rest[6], rest[7]]);
                rest = &rest[8..];
                et = match ppp {
                    0x0021 => ETH_IPV4,
                    0x0057 => ETH_IPV6,
                    _ => return Err(DecodeError::NotIp),
                };
            }
            _ => return Err(DecodeError::NotIp),
        }
    }
}

/// NFLOG: a 4-byte header then TLVs (length and type in host byte order, little-endian on
/// every capture we know of); the packet is TLV type 9 (NFULA_PAYLOAD).
fn nflog_payload(frame: &[u8]) -> Result<&[u8], DecodeError> {
    if frame.len() < 4 {
        return Err(DecodeError::TruncatedLinkHeader);
    }
    let family = frame[0];
    let mut off = 4usize;
    while off + 4 <= frame.len() {
        let len = u16::from_le_bytes([frame[off], frame[off + 1]]) as usize;
        let ty = u16::from_le_bytes([frame[off + 2], frame[off + 3]]);
        if len < 4 {
            return Err(DecodeError::TruncatedLinkHeader);
        }
        if ty == 9 {
            let end = (off + len).min(frame.len());
            let payload = &frame[off + 4..end];
            return match family {
                2 => ip_only(payload, 4),
                10 => ip_only(payload, 6),
                _ => ip_by_version(payload),
            };
        }
        off += (len + 3) & !3;
    }
    Err(DecodeError::TruncatedLinkHeader)
}

fn decode_ip(ip: &[u8], vlan: VlanStack) -> Result<TcpSegment<'_>, DecodeError> {
    let (sliced, _ext_err) = LaxIpSlice::from_slice(ip).map_err(|e| match e {
        LaxHeaderSliceError::Len(_) => DecodeError::TruncatedIpHeader,
        LaxHeaderSliceError::Content(_) => DecodeError::BadIpHeader,
    })?;
    let (src, dst, ecn, declared_total, payload, ip_id) = match &sliced {
        LaxIpSlice::Ipv4(v4) => {
            let h = v4.header();
            let total = h.total_len() as usize;
            (
                IpAddr::V4(Ipv4Addr::from(h.source())),
                IpAddr::V4(Ipv4Addr::from(h.destination())),
                h.ecn().value(),
                total,
                v4.payload(),
                Some(h.identification()),
            )
        }
        LaxIpSlice::Ipv6(v6) => {
            let h = v6.header();
            (
                IpAddr::V6(Ipv6Addr::from(h.source())),
                IpAddr::V6(Ipv6Addr::from(h.destination())),
                h.ecn().value(),
                40 + h.payload_length() as usize,
                v6.payload(),
                None,
            )
        }
    };
    if payload.fragmented {
        return Err(DecodeError::IpFragment);
    }
    if payload.ip_number != IpNumber::TCP {
        return Err(DecodeError::NotTcp);
    }
    // Bytes of IP header + extension headers before the TCP header.
    let ip_hdr_len = payload.payload.as_ptr() as usize - ip.as_ptr() as usize;
    // The declared IP payload length: from the header when the capture was cut short
    // (snaplen), from the captured bytes when the header's length field is unusable
    // (0 for TSO / BIG TCP super-frames) or when the header was honoured.
    let ip_payload_len = if payload.incomplete {
        declared_total.saturating_sub(ip_hdr_len)
    } else {
        payload.payload.len()
    };
    let bytes = payload.payload;
    // A snaplen that cuts a SYN inside its options still leaves the fixed header whole: its
    // fields are read from a copy that declares no options, and the options that were
    // captured are parsed as far as they go (`options.malformed` marks the cut).
    let declared_hdr = bytes.get(12).map_or(0, |b| (b >> 4) as usize * 4);
    let options_cut = payload.incomplete && bytes.len() >= 20 && declared_hdr > bytes.len();
    let mut fixed = [0u8; 20];
    let tcp_bytes: &[u8] = if options_cut {
        fixed.copy_from_slice(&bytes[..20]);
        fixed[12] = (5 << 4) | (fixed[12] & 0x0f);
        &fixed
    } else {
        bytes
    };
    let tcp = TcpSlice::from_slice(tcp_bytes).map_err(|e| match e {
        etherparse::err::tcp::HeaderSliceError::Len(_) => DecodeError::TruncatedTcpHeader,
        etherparse::err::tcp::HeaderSliceError::Content(_) => DecodeError::BadTcpHeader,
    })?;
    let (hdr_len, options) = if options_cut {
        let mut o = TcpOptions::parse(&bytes[20..]);
        o.malformed = true;
        (declared_hdr, o)
    } else {
        (tcp.header_len(), TcpOptions::parse(tcp.options()))
    };
    let payload_len = ip_payload_len
        .checked_sub(hdr_len)
        .ok_or(DecodeError::BadTcpHeader)?;
    let mut flags = 0u16;
    for (set, bit) in [
        (tcp.fin(), TcpFlags::FIN),
        (tcp.syn(), TcpFlags::SYN),
        (tcp.rst(), TcpFlags::RST),
        (tcp.psh(), TcpFlags::PSH),
        (tcp.ack(), TcpFlags::ACK),
        (tcp.urg(), TcpFlags::URG),
        (tcp.ece(), TcpFlags::ECE),
        (tcp.cwr(), TcpFlags::CWR),
    ] {
        if set {
            flags |= bit;
        }
    }
    let captured = &bytes[hdr_len.min(bytes.len())..];
    Ok(TcpSegment {
        vlan,
        src,
        dst,
        sport: tcp.source_port(),
        dport: tcp.destination_port(),
        seq: SeqNum(tcp.sequence_number()),
        ack: SeqNum(tcp.acknowledgment_number()),
        flags: TcpFlags(flags),
        window: tcp.window_size(),
        options,
        payload_len: payload_len as u32,
        payload: &captured[..captured.len().min(payload_len)],
        ip_ecn: ecn,
        hdr_len: (ip_hdr_len + hdr_len).min(u16::MAX as usize) as u16,
        ip_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ethernet + IPv4 + TCP SYN with MSS 1460, SACK-permitted, TS, NOP, WS 7.
    fn eth_ipv4_syn() -> Vec<u8> {
        let mut f = vec![
            0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0x08, 0x00, // ethernet
            0x45, 0x02, 0, 60, 0, 1, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0,
            2, // ipv4, ECT(0)
            0x9c, 0x40, 0, 80, 0, 0, 0, 100, 0, 0, 0, 0, 0xa0, 0x02, 0xfa, 0xf0, 0, 0, 0,
            0, // tcp, doff 10
            2, 4, 0x05, 0xb4, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 3, 7,
        ];
        f.truncate(14 + 60);
        f
    }

    #[test]
    fn ethernet_ipv4_syn_options() {
        let f = eth_ipv4_syn();
        let s = decode(LinkType::Ethernet, &f).unwrap();
        assert_eq!(s.src, "10.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(s.dport, 80);
        assert_eq!(s.sport, 40000);
        assert!(s.flags.syn() && !s.flags.ack());
        assert_eq!(s.seq, SeqNum(100));
        assert_eq!(s.options.mss, Some(1460));
        assert_eq!(s.options.wscale, Some(7));
        assert!(s.options.sack_permitted);
        assert_eq!(s.options.timestamp, Some((1, 0)));
        assert_eq!(s.payload_len, 0);
        assert_eq!(s.seq_len(), 1);
        assert_eq!(s.ip_ecn, 2);
        assert_eq!(s.hdr_len, 60);
        assert_eq!(s.ip_id, Some(1));
    }

    #[test]
    fn vlan_stack_and_mpls() {
        let syn = eth_ipv4_syn();
        // three stacked tags: 802.1ad 100, 802.1Q 200, 802.1Q 300
        let mut f = syn[..12].to_vec();
        f.extend_from_slice(&[
            0x88, 0xa8, 0x00, 100, 0x81, 0x00, 0x00, 200, 0x81, 0x00, 0x01, 0x2c, 0x08, 0x00,
        ]);
        f.extend_from_slice(&syn[14..]);
        let s = decode(LinkType::Ethernet, &f).unwrap();
        assert_eq!(s.vlan.iter().collect::<Vec<_>>(), vec![100, 200, 300]);
        // two MPLS labels then IPv4
        let mut m = syn[..12].to_vec();
        m.extend_from_slice(&[0x88, 0x47, 0x00, 0x01, 0x00, 0x40, 0x00, 0x02, 0x01, 0x40]);
        m.extend_from_slice(&syn[14..]);
        let s = decode(LinkType::Ethernet, &m).unwrap();
        assert_eq!(s.dport, 80);
    }

    #[test]
    fn truncated_frame_keeps_declared_length() {
        let syn = eth_ipv4_syn();
        // turn it into a 1000-byte data segment of which only the headers were captured
        let mut f = syn.clone();
        f[16] = (1060u16 >> 8) as u8;
        f[17] = (1060u16 & 0xff) as u8;
        f[14 + 20 + 13] = 0x10; // ACK only
        let s = decode(LinkType::Ethernet, &f).unwrap();
        assert_eq!(s.payload_len, 1000);
        assert!(s.payload.is_empty());
        // cut inside the TCP header
        assert_eq!(
            decode(LinkType::Ethernet, &f[..14 + 20 + 10]).unwrap_err(),
            DecodeError::TruncatedTcpHeader
        );
        // cut inside the SYN's options: the header's fields and the whole options before the
        // cut are kept (MSS, SACK-permitted), the one cut (timestamps) is not
        let s = decode(LinkType::Ethernet, &syn[..14 + 20 + 20 + 10]).unwrap();
        assert!(s.flags.syn());
        assert_eq!((s.seq, s.window, s.dport), (SeqNum(100), 0xfaf0, 80));
        assert_eq!(s.options.mss, Some(1460));
        assert!(s.options.sack_permitted);
        assert_eq!(s.options.timestamp, None);
        assert!(s.options.malformed);
        assert_eq!((s.hdr_len, s.payload_len, s.payload.len()), (60, 0, 0));
        // a header that declares more bytes than its packet holds is still refused
        let mut bad = syn.clone();
        bad[16] = 0;
        bad[17] = 50;
        assert!(decode(LinkType::Ethernet, &bad[..14 + 50]).is_err());
        assert_eq!(
            decode(LinkType::Ethernet, &f[..14 + 10]).unwrap_err(),
            DecodeError::TruncatedIpHeader
        );
        assert_eq!(
            decode(LinkType::Ethernet, &f[..10]).unwrap_err(),
            DecodeError::TruncatedLinkHeader
        );
    }

    #[test]
    fn pppoe_session() {
        let syn = eth_ipv4_syn();
        // PPPoE session header (version/type 0x11, code 0, session 0x1234, length) and PPP
        // protocol 0x0021 (IPv4) between Ethernet and IP, on VLAN 7
        let mut f = syn[..12].to_vec();
        f.extend_from_slice(&[0x81, 0x00, 0x00, 7, 0x88, 0x64, 0x11, 0x00, 0x12, 0x34]);
        f.extend_from_slice(&((syn.len() - 14 + 2) as u16).to_be_bytes());
        f.extend_from_slice(&[0x00, 0x21]);
        f.extend_from_slice(&syn[14..]);
        let s = decode(LinkType::Ethernet, &f).unwrap();
        assert_eq!((s.sport, s.dport, s.seq), (40000, 80, SeqNum(100)));
        assert_eq!(s.vlan.outer(), Some(7));
        assert_eq!(s.options.mss, Some(1460));
        // a PPP frame that is not IP (LCP, 0xc021) is no IP packet
        let n = f.len();
        let ppp = n - (syn.len() - 14) - 2;
        f[ppp] = 0xc0;
        assert_eq!(
            decode(LinkType::Ethernet, &f).unwrap_err(),
            DecodeError::NotIp
        );
        // cut inside the PPPoE header
        assert_eq!(
            decode(LinkType::Ethernet, &f[..12 + 4 + 2 + 5]).unwrap_err(),
            DecodeError::TruncatedLinkHeader
        );
    }

    #[test]
    fn other_link_types() {
        let syn = eth_ipv4_syn();
        let ip = &syn[14..];
        assert_eq!(decode(LinkType::Raw, ip).unwrap().dport, 80);
        assert_eq!(decode(LinkType::Ipv4, ip).unwrap().dport, 80);
        let mut null = vec![2, 0, 0, 0];
        null.extend_from_slice(ip);
        assert_eq!(decode(LinkType::Null, &null).unwrap().dport, 80);
        let mut lo = vec![0, 0, 0, 2];
        lo.extend_from_slice(ip);
        assert_eq!(decode(LinkType::Loop, &lo).unwrap().dport, 80);
        let mut sll2 = vec![
            0x08, 0x00, 0, 0, 0, 0, 0, 1, 0, 1, 0, 6, 1, 2, 3, 4, 5, 6, 0, 0,
        ];
        sll2.extend_from_slice(ip);
        assert_eq!(decode(LinkType::LinuxSll2, &sll2).unwrap().dport, 80);
        // NFLOG: header, a prefix TLV (type 10, len 8), then the payload TLV (type 9)
        let mut nf = vec![2, 0, 0, 0, 8, 0, 10, 0, b'a', b'b', b'c', 0];
        let l = (4 + ip.len()) as u16;
        nf.extend_from_slice(&l.to_le_bytes());
        nf.extend_from_slice(&[9, 0]);
        nf.extend_from_slice(ip);
        assert_eq!(decode(LinkType::Nflog, &nf).unwrap().dport, 80);
        assert_eq!(
            decode(LinkType::Unknown(147), ip).unwrap_err(),
            DecodeError::UnsupportedLinkType
        );
    }

    #[test]
    fn timestamp_fast_path_matches_general_parse() {
        let b = [1, 1, 8, 10, 0, 0, 1, 0, 0, 0, 0, 7];
        let fast = TcpOptions::parse(&b);
        let mut general = TcpOptions::default();
        for e in TcpOptionsIterator::from_slice(&b) {
            general.apply(e.unwrap());
        }
        assert_eq!(fast, general);
        assert_eq!(fast.timestamp, Some((256, 7)));
    }

    #[test]
    fn unknown_options_are_skipped() {
        // MPTCP (kind 30, len 4), then MSS
        let o = TcpOptions::parse(&[30, 4, 0, 0, 2, 4, 0x05, 0xb4]);
        assert_eq!(o.mss, Some(1460));
        assert!(!o.malformed);
        let bad = TcpOptions::parse(&[2, 4, 0x05, 0xb4, 30, 40]);
        assert_eq!(bad.mss, Some(1460));
        assert!(bad.malformed);
    }

    #[test]
    fn non_tcp_is_benign() {
        let mut f = eth_ipv4_syn();
        f[14 + 9] = 17; // UDP
        assert_eq!(
            decode(LinkType::Ethernet, &f).unwrap_err(),
            DecodeError::NotTcp
        );
        let mut arp = f.clone();
        arp[12] = 0x08;
        arp[13] = 0x06;
        assert_eq!(
            decode(LinkType::Ethernet, &arp).unwrap_err(),
            DecodeError::NotIp
        );
    }
}
