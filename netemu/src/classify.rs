//! What the engine needs to know about a frame, and which pipes it belongs to.
//!
//! [`parse_frame`] reads an Ethernet frame (optionally 802.1Q/802.1ad tagged) down to the IP
//! addresses, the IP length (what the rate charges) and, for TCP, ports, flags, sequence
//! numbers and payload length. It validates each length before reading, so no input can make it
//! panic; frames it cannot use (ARP, LLDP, truncated or fragmented IP...) return `None` and the
//! datapath forwards them unshaped.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_PSH: u8 = 0x08;
pub const TCP_ACK: u8 = 0x10;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpMeta {
    pub sport: u16,
    pub dport: u16,
    pub flags: u8,
    pub seq: u32,
    pub ack: u32,
    pub window: u16,
    pub payload_len: u32,
    /// The segment carries a SACK option (a loss signal the ACK shaper never delays).
    pub sack: bool,
}

impl TcpMeta {
    /// An ACK without data, SYN, FIN or RST.
    pub fn is_pure_ack(&self) -> bool {
        self.flags & (TCP_SYN | TCP_FIN | TCP_RST) == 0
            && self.flags & TCP_ACK != 0
            && self.payload_len == 0
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum L4 {
    Tcp(TcpMeta),
    Udp { sport: u16, dport: u16 },
    Other(u8),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacketMeta {
    pub src: IpAddr,
    pub dst: IpAddr,
    /// Bytes of the IP packet (header + payload), as the IP header states it.
    pub ip_len: u32,
    pub l4: L4,
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}
fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Parses an Ethernet frame; `None` for anything that is not an unfragmented IPv4/IPv6 packet.
pub fn parse_frame(frame: &[u8]) -> Option<PacketMeta> {
    let mut ethertype = be16(frame, 12)?;
    let mut off = 14;
    for _ in 0..2 {
        if ethertype == 0x8100 || ethertype == 0x88a8 {
            ethertype = be16(frame, off + 2)?;
            off += 4;
        }
    }
    let ip = frame.get(off..)?;
    match ethertype {
        0x0800 => parse_ipv4(ip),
        0x86dd => parse_ipv6(ip),
        _ => None,
    }
}

fn parse_ipv4(ip: &[u8]) -> Option<PacketMeta> {
    let vihl = *ip.first()?;
    if vihl >> 4 != 4 {
        return None;
    }
    let ihl = (vihl & 0x0f) as usize * 4;
    let total = be16(ip, 2)? as usize;
    if ihl < 20 || total < ihl || total > ip.len() {
        return None;
    }
    let frag = be16(ip, 6)?;
    let proto = *ip.get(9)?;
    let src = IpAddr::V4(Ipv4Addr::from(be32(ip, 12)?));
    let dst = IpAddr::V4(Ipv4Addr::from(be32(ip, 16)?));
    // A non-first fragment has no transport header; a first fragment's header is incomplete
    // as a flow description only if ports are missing, which `l4` checks.
    let l4 = if frag & 0x1fff != 0 {
        L4::Other(proto)
    } else {
        parse_l4(proto, &ip[ihl..total])
    };
    Some(PacketMeta {
        src,
        dst,
        ip_len: total as u32,
        l4,
    })
}

fn parse_ipv6(ip: &[u8]) -> Option<PacketMeta> {
    if *ip.first()? >> 4 != 6 {
        return None;
    }
    let plen = be16(ip, 4)? as usize;
    let next = *ip.get(6)?;
    let src: [u8; 16] = ip.get(8..24)?.try_into().ok()?;
    let dst: [u8; 16] = ip.get(24..40)?.try_into().ok()?;
    if 40 + plen > ip.len() {
        return None;
    }
    // Extension headers are not walked: such packets are classified by address only.
    let l4 = parse_l4(next, &ip[40..40 + plen]);
    Some(PacketMeta {
        src: IpAddr::V6(Ipv6Addr::from(src)),
        dst: IpAddr::V6(Ipv6Addr::from(dst)),
        ip_len: 40 + plen as u32,
        l4,
    })
}

fn parse_l4(proto: u8, seg: &[u8]) -> L4 {
    match proto {
        6 => parse_tcp(seg).map(L4::Tcp).unwrap_or(L4::Other(proto)),
        17 => match (be16(seg, 0), be16(seg, 2)) {
            (Some(sport), Some(dport)) => L4::Udp { sport, dport },
            _ => L4::Other(proto),
        },
        p => L4::Other(p),
    }
}

fn parse_tcp(seg: &[u8]) -> Option<TcpMeta> {
    let doff = (*seg.get(12)? >> 4) as usize * 4;
    if doff < 20 || doff > seg.len() {
        return None;
    }
    let mut sack = false;
    let mut opts = &seg[20..doff];
    while let Some(&kind) = opts.first() {
        match kind {
            0 => break,
            1 => opts = &opts[1..],
            _ => {
                let len = *opts.get(1)? as usize;
                if len < 2 || len > opts.len() {
                    break;
                }
                if kind == 5 {
                    sack = true;
                }
                opts = &opts[len..];
            }
        }
    }
    Some(TcpMeta {
        sport: be16(seg, 0)?,
        dport: be16(seg, 2)?,
        seq: be32(seg, 4)?,
        ack: be32(seg, 8)?,
        flags: *seg.get(13)?,
        window: be16(seg, 14)?,
        payload_len: (seg.len() - doff) as u32,
        sack,
    })
}

/// An IP prefix such as `198.19.0.0/19` (a bare address is a /32 or /128).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IpNet {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl IpNet {
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.addr.is_ipv4() == ip.is_ipv4()
            && masked(self.addr, self.prefix) == masked(ip, self.prefix)
    }

    /// The prefix as the set of addresses it holds: its address without the host bits
    /// (`198.19.0.9/24` and `198.19.0.0/24` are one network).
    pub fn network(self) -> IpNet {
        IpNet {
            addr: masked(self.addr, self.prefix),
            prefix: self.prefix,
        }
    }
}

/// `a` with all but its first `prefix` bits cleared.
#[inline]
fn masked(a: IpAddr, prefix: u8) -> IpAddr {
    match a {
        IpAddr::V4(a) => {
            let m = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4((u32::from(a) & m).into())
        }
        IpAddr::V6(a) => {
            let m = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6((u128::from(a) & m).into())
        }
    }
}

impl FromStr for IpNet {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.contains(',') {
            return Err(format!(
                "`{}`: one prefix per value (repeat the flag for more)",
                crate::units::quote(s)
            ));
        }
        let (a, p) = s
            .split_once('/')
            .map(|(a, p)| (a, Some(p)))
            .unwrap_or((s, None));
        let addr: IpAddr = a.trim().parse().map_err(|_| {
            format!(
                "`{}` is not an IP prefix (e.g. 198.19.0.0/19)",
                crate::units::quote(s)
            )
        })?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            None => max,
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|&p| p <= max)
                .ok_or_else(|| {
                    format!(
                        "`{}`: prefix length must be 0..={max}",
                        crate::units::quote(s)
                    )
                })?,
        };
        Ok(IpNet { addr, prefix })
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl Serialize for IpNet {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for IpNet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// The exact connection a flow rule names: client ip:port and server ip:port (TCP).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnKey {
    pub client: SocketAddr,
    pub server: SocketAddr,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An Ethernet + IPv4 + TCP frame with `payload` bytes of zeros (and a SACK option if asked).
    #[allow(clippy::too_many_arguments)]
    pub fn tcp_frame(
        src: [u8; 4],
        sport: u16,
        dst: [u8; 4],
        dport: u16,
        flags: u8,
        seq: u32,
        ack: u32,
        payload: usize,
        sack: bool,
    ) -> Vec<u8> {
        let opt_len = if sack { 12 } else { 0 };
        let total = 20 + 20 + opt_len + payload;
        let mut f = vec![0u8; 14 + total];
        f[12] = 0x08;
        f[13] = 0x00;
        let ip = &mut f[14..];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        ip[8] = 64;
        ip[9] = 6;
        ip[12..16].copy_from_slice(&src);
        ip[16..20].copy_from_slice(&dst);
        let t = &mut ip[20..];
        t[0..2].copy_from_slice(&sport.to_be_bytes());
        t[2..4].copy_from_slice(&dport.to_be_bytes());
        t[4..8].copy_from_slice(&seq.to_be_bytes());
        t[8..12].copy_from_slice(&ack.to_be_bytes());
        t[12] = (((20 + opt_len) / 4) as u8) << 4;
        t[13] = flags;
        t[14..16].copy_from_slice(&512u16.to_be_bytes());
        if sack {
            t[20..22].copy_from_slice(&[1, 1]);
            t[22..24].copy_from_slice(&[5, 10]);
        }
        f
    }

    pub fn udp_frame(src: [u8; 4], dst: [u8; 4], payload: usize) -> Vec<u8> {
        let total = 28 + payload;
        let mut f = vec![0u8; 14 + total];
        f[12] = 0x08;
        let ip = &mut f[14..];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        ip[9] = 17;
        ip[12..16].copy_from_slice(&src);
        ip[16..20].copy_from_slice(&dst);
        ip[20..22].copy_from_slice(&9u16.to_be_bytes());
        ip[22..24].copy_from_slice(&9u16.to_be_bytes());
        f
    }

    #[test]
    fn parses_tcp_with_sack() {
        let f = tcp_frame(
            [198, 19, 0, 1],
            40000,
            [198, 18, 0, 1],
            80,
            TCP_ACK,
            1,
            1000,
            0,
            true,
        );
        let m = parse_frame(&f).unwrap();
        assert_eq!(m.ip_len, 52);
        let L4::Tcp(t) = m.l4 else { panic!() };
        assert!(t.sack && t.is_pure_ack());
        assert_eq!((t.sport, t.dport, t.ack), (40000, 80, 1000));
    }

    #[test]
    fn never_panics_on_truncations_or_garbage() {
        let f = tcp_frame([1, 2, 3, 4], 1, [5, 6, 7, 8], 2, TCP_SYN, 0, 0, 100, true);
        for n in 0..f.len() {
            let _ = parse_frame(&f[..n]);
        }
        let mut r = crate::rng::Rng::new(1);
        for _ in 0..20_000 {
            let mut g = f.clone();
            let i = (r.next_u64() as usize) % g.len();
            g[i] = r.next_u64() as u8;
            let _ = parse_frame(&g);
        }
        // ARP is not IP.
        let mut arp = vec![0u8; 42];
        arp[12] = 0x08;
        arp[13] = 0x06;
        assert_eq!(parse_frame(&arp), None);
    }

    #[test]
    fn prefixes() {
        let n: IpNet = "198.19.0.0/19".parse().unwrap();
        assert!(n.contains("198.19.31.254".parse().unwrap()));
        assert!(!n.contains("198.19.32.1".parse().unwrap()));
        assert!(!n.contains("::1".parse().unwrap()));
        assert!("198.19.0.0/33".parse::<IpNet>().is_err());
        let e = "10.0.0.0/8,10.1.0.0/16".parse::<IpNet>().unwrap_err();
        assert!(e.contains("one prefix per value"), "{e}");
        assert_eq!("10.0.0.1".parse::<IpNet>().unwrap().prefix, 32);
    }
}
