//! Where the link-layer addresses, the IP header and the transport header sit inside a frame,
//! as byte offsets, so the anonymizer can rewrite them in place and the payload policy can cut
//! non-TCP frames. Never panics: every offset returned lies inside the frame.

use mimic_core::LinkType;

/// Offsets of one frame's rewritable fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Layers {
    /// Offsets of 6-byte hardware addresses (Ethernet dst/src, the SLL source address).
    pub macs: [Option<usize>; 2],
    pub ip: Option<IpLoc>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpLoc {
    pub off: usize,
    pub v6: bool,
    /// Transport protocol number (after IPv6 extension headers).
    pub proto: u8,
    /// Offset just past the IP header and its extension headers.
    pub hdr_end: usize,
    /// False for a non-first fragment (no transport header in this frame).
    pub first_fragment: bool,
}

impl IpLoc {
    /// Offset of the transport header, when this frame carries one.
    pub fn l4(&self) -> Option<usize> {
        self.first_fragment.then_some(self.hdr_end)
    }
}

const ETH_IPV4: u16 = 0x0800;
const ETH_IPV6: u16 = 0x86dd;

fn be16(b: &[u8], i: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(i)?, *b.get(i + 1)?]))
}

/// Finds the layers of `frame`. `ip` is `None` for frames that carry no (complete) IP header.
pub fn locate(link: LinkType, frame: &[u8]) -> Layers {
    let mut l = Layers::default();
    let ip_off = match link {
        LinkType::Ethernet => {
            if frame.len() < 14 {
                return l;
            }
            l.macs = [Some(0), Some(6)];
            ethertype_walk(frame, 12)
        }
        LinkType::LinuxSll => {
            if frame.len() < 16 {
                return l;
            }
            if be16(frame, 4) == Some(6) {
                l.macs[0] = Some(6);
            }
            ethertype_walk(frame, 14)
        }
        LinkType::LinuxSll2 => {
            if frame.len() < 20 {
                return l;
            }
            if frame[11] == 6 {
                l.macs[0] = Some(12);
            }
            // the protocol field sits first; walk as if it were an ethertype at offset 0 whose
            // payload starts at 20
            match be16(frame, 0) {
                Some(ETH_IPV4) | Some(ETH_IPV6) => Some(20),
                _ => None,
            }
        }
        LinkType::Null | LinkType::Loop => {
            if frame.len() < 4 {
                return l;
            }
            Some(4)
        }
        LinkType::Raw | LinkType::Ipv4 | LinkType::Ipv6 => Some(0),
        LinkType::Nflog | LinkType::Unknown(_) => None,
    };
    l.ip = ip_off.and_then(|o| parse_ip(frame, o));
    l
}

/// Follows the ethertype at `et_off` through VLAN tags, MPLS labels and PPPoE; returns the IP offset.
fn ethertype_walk(frame: &[u8], mut et_off: usize) -> Option<usize> {
    for _ in 0..16 {
        let et = be16(frame, et_off)?;
        let next = et_off + 2;
        match et {
            ETH_IPV4 | ETH_IPV6 => return Some(next),
            0x8100 | 0x88a8 | 0x9100 => et_off = next + 2,
            0x8847 | 0x8848 => {
                let mut o = next;
                loop {
                    let bottom = frame.get(o + 2)? & 1 != 0;
                    o += 4;
                    if bottom {
                        break;
                    }
                }
                return matches!(frame.get(o)? >> 4, 4 | 6).then_some(o);
            }
            0x8864 => {
                // PPPoE session header (6) then the PPP protocol (2)
                return match be16(frame, next + 6)? {
                    0x0021 | 0x0057 => Some(next + 8),
                    _ => None,
                };
            }
            _ => return None,
        }
    }
    None
}

fn parse_ip(frame: &[u8], off: usize) -> Option<IpLoc> {
    let b = frame.get(off..)?;
    match b.first()? >> 4 {
        4 => {
            let ihl = (b[0] & 0x0f) as usize * 4;
            if ihl < 20 || b.len() < ihl {
                return None;
            }
            let frag_off = be16(b, 6)? & 0x1fff;
            Some(IpLoc {
                off,
                v6: false,
                proto: b[9],
                hdr_end: off + ihl,
                first_fragment: frag_off == 0,
            })
        }
        6 => {
            if b.len() < 40 {
                return None;
            }
            let mut nh = b[6];
            let mut o = 40usize;
            let mut first = true;
            for _ in 0..8 {
                match nh {
                    0 | 43 | 60 => {
                        let len = (*b.get(o + 1)? as usize + 1) * 8;
                        nh = *b.get(o)?;
                        o += len;
                    }
                    51 => {
                        let len = (*b.get(o + 1)? as usize + 2) * 4;
                        nh = *b.get(o)?;
                        o += len;
                    }
                    44 => {
                        let frag = be16(b, o + 2)? >> 3;
                        first = frag == 0;
                        nh = *b.get(o)?;
                        o += 8;
                    }
                    _ => break,
                }
            }
            if o > b.len() {
                return None;
            }
            Some(IpLoc {
                off,
                v6: true,
                proto: nh,
                hdr_end: off + o,
                first_fragment: first,
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ethernet_vlan_ipv4() {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&[0x81, 0x00, 0, 5, 0x08, 0x00]);
        f.extend_from_slice(&[
            0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ]);
        f.extend_from_slice(&[0u8; 20]);
        let l = locate(LinkType::Ethernet, &f);
        assert_eq!(l.macs, [Some(0), Some(6)]);
        let ip = l.ip.unwrap();
        assert_eq!(
            (ip.off, ip.proto, ip.hdr_end, ip.v6, ip.l4()),
            (18, 6, 38, false, Some(38))
        );
        // truncated IP header
        assert_eq!(locate(LinkType::Ethernet, &f[..30]).ip, None);
        // a non-first fragment has no transport header
        f[18 + 6] = 0x00;
        f[18 + 7] = 0x10;
        assert_eq!(locate(LinkType::Ethernet, &f).ip.unwrap().l4(), None);
    }

    #[test]
    fn ipv6_extension_headers() {
        let mut p = vec![0x60, 0, 0, 0, 0, 16, 0, 64];
        p.extend_from_slice(&[0u8; 32]);
        // hop-by-hop (8 bytes) -> fragment (first) -> TCP
        p.extend_from_slice(&[44, 0, 0, 0, 0, 0, 0, 0]);
        p.extend_from_slice(&[6, 0, 0, 1, 0, 0, 0, 9]);
        let ip = locate(LinkType::Raw, &p).ip.unwrap();
        assert_eq!((ip.proto, ip.hdr_end, ip.first_fragment), (6, 56, true));
        assert_eq!(locate(LinkType::Raw, &p[..50]).ip, None);
        assert_eq!(locate(LinkType::Raw, &[0x20]).ip, None);
        assert_eq!(locate(LinkType::Nflog, &p).ip, None);
    }
}
