//! Keyed prefix-preserving address anonymization (Crypto-PAn, Xu, Fan, Ammar and Moon 2002)
//! for IPv4 and IPv6, MAC-address pseudonyms, and in-place rewriting of a frame with its
//! checksums adjusted.
//!
//! Crypto-PAn maps an n-bit address `a` to `a XOR otp(a)`, where bit i of the one-time pad is
//! the first bit of AES_K(first i bits of `a` ‖ the rest of a secret pad). Bit i of the output
//! depends only on bits 0..=i of the input, so two addresses that share a k-bit prefix map to
//! two addresses that share exactly a k-bit prefix, and the map is a bijection (its inverse is
//! [`CryptoPan::deanonymize_v4`]). The same key gives the same map in every file and run.
//!
//! Checksums: the IPv4 header checksum and the TCP / UDP / ICMPv6 checksums (whose pseudo
//! header covers the addresses) are adjusted incrementally (RFC 1624), so a checksum that was
//! valid stays valid and one that was wrong (or offloaded) stays just as wrong, whether or not
//! the payload was cut. Not rewritten (documented limits): addresses inside ICMP error payloads
//! or IPv6 routing headers (non-TCP payloads are cut to the transport header when anonymizing,
//! which removes the former), and addresses in application payload kept with `--payload-bytes`.

use std::hash::Hasher;

use aes::cipher::{generic_array::GenericArray, BlockEncrypt, KeyInit};
use aes::Aes128;
use mimic_core::LinkType;
use rustc_hash::FxHashMap;
use siphasher::sip::SipHasher24;

use crate::layers::{locate, Layers};

/// Bound of each per-family address cache (entries); the cache is cleared when full.
const CACHE_LIMIT: usize = 1 << 20;

pub struct CryptoPan {
    cipher: Aes128,
    pad: u128,
}

impl CryptoPan {
    /// `key`: 16 bytes of AES-128 key then 16 bytes from which the pad is made (as in the
    /// reference implementation, the pad is the encryption of those bytes).
    pub fn new(key: &[u8; 32]) -> CryptoPan {
        let cipher = Aes128::new(GenericArray::from_slice(&key[..16]));
        let mut pad = GenericArray::clone_from_slice(&key[16..]);
        cipher.encrypt_block(&mut pad);
        CryptoPan {
            cipher,
            pad: u128::from_be_bytes(pad.into()),
        }
    }

    /// The one-time pad for the first `bits` bits of `a` (left-aligned in 128 bits).
    fn otp(&self, a: u128, bits: u32) -> u128 {
        let mut blocks = [GenericArray::default(); 128];
        for i in 0..bits {
            let mask = if i == 0 { 0 } else { !0u128 << (128 - i) };
            blocks[i as usize] =
                GenericArray::from(((a & mask) | (self.pad & !mask)).to_be_bytes());
        }
        self.cipher.encrypt_blocks(&mut blocks[..bits as usize]);
        let mut otp = 0u128;
        for i in 0..bits {
            otp |= ((blocks[i as usize][0] >> 7) as u128) << (127 - i);
        }
        otp
    }

    fn first_bit(&self, prefix: u128, i: u32) -> u128 {
        let mask = if i == 0 { 0 } else { !0u128 << (128 - i) };
        let mut b = GenericArray::from(((prefix & mask) | (self.pad & !mask)).to_be_bytes());
        self.cipher.encrypt_block(&mut b);
        (b[0] >> 7) as u128
    }

    pub fn anonymize_v4(&self, a: u32) -> u32 {
        let x = (a as u128) << 96;
        ((x ^ self.otp(x, 32)) >> 96) as u32
    }
    pub fn anonymize_v6(&self, a: u128) -> u128 {
        a ^ self.otp(a, 128)
    }

    fn invert(&self, b: u128, bits: u32) -> u128 {
        let mut a = 0u128;
        for i in 0..bits {
            let bit = ((b >> (127 - i)) & 1) ^ self.first_bit(a, i);
            a |= bit << (127 - i);
        }
        a
    }
    /// The inverse map (needs the key): proves the map is a bijection, and lets an operator who
    /// holds the key resolve a pseudonym.
    pub fn deanonymize_v4(&self, b: u32) -> u32 {
        (self.invert((b as u128) << 96, 32) >> 96) as u32
    }
    pub fn deanonymize_v6(&self, b: u128) -> u128 {
        self.invert(b, 128)
    }
}

/// Counters of what the anonymizer did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AnonStats {
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub cache_resets: u64,
}

/// Crypto-PAn with address caches, plus MAC pseudonyms: rewrites frames in place.
pub struct Anonymizer {
    pan: CryptoPan,
    mac_k0: u64,
    mac_k1: u64,
    v4: FxHashMap<u32, u32>,
    v6: FxHashMap<u128, u128>,
    pub stats: AnonStats,
}

impl Anonymizer {
    pub fn new(pan_key: &[u8; 32], mac_key: [u8; 16]) -> Anonymizer {
        Anonymizer {
            pan: CryptoPan::new(pan_key),
            mac_k0: u64::from_le_bytes(mac_key[..8].try_into().expect("8")),
            mac_k1: u64::from_le_bytes(mac_key[8..].try_into().expect("8")),
            v4: FxHashMap::default(),
            v6: FxHashMap::default(),
            stats: AnonStats::default(),
        }
    }

    pub fn v4(&mut self, a: u32) -> u32 {
        if let Some(&b) = self.v4.get(&a) {
            self.stats.cache_hits += 1;
            return b;
        }
        self.stats.cache_misses += 1;
        if self.v4.len() >= CACHE_LIMIT {
            self.v4.clear();
            self.stats.cache_resets += 1;
        }
        let b = self.pan.anonymize_v4(a);
        self.v4.insert(a, b);
        b
    }

    pub fn v6(&mut self, a: u128) -> u128 {
        if let Some(&b) = self.v6.get(&a) {
            self.stats.cache_hits += 1;
            return b;
        }
        self.stats.cache_misses += 1;
        if self.v6.len() >= CACHE_LIMIT {
            self.v6.clear();
            self.stats.cache_resets += 1;
        }
        let b = self.pan.anonymize_v6(a);
        self.v6.insert(a, b);
        b
    }

    /// A keyed pseudonym for a hardware address. Unicast addresses become locally
    /// administered unicast addresses; multicast keeps its first three bytes (the group
    /// prefix) and its multicast bit; broadcast stays broadcast.
    pub fn mac(&self, m: [u8; 6]) -> [u8; 6] {
        if m == [0xff; 6] {
            return m;
        }
        let mut h = SipHasher24::new_with_keys(self.mac_k0, self.mac_k1);
        h.write(&m);
        let x = h.finish().to_be_bytes();
        if m[0] & 1 == 1 {
            [m[0], m[1], m[2], x[0], x[1], x[2]]
        } else {
            [(x[0] & 0xfc) | 0x02, x[1], x[2], x[3], x[4], x[5]]
        }
    }

    /// Rewrites the addresses of `frame` in place. Returns false (frame untouched) when the
    /// frame's addresses cannot be found (an unsupported link type such as NFLOG, or a frame
    /// too short to hold its IP header); callers must then not keep the frame.
    pub fn rewrite(&mut self, link: LinkType, frame: &mut [u8]) -> bool {
        let Layers { macs, ip } = locate(link, frame);
        let Some(ip) = ip else {
            return false;
        };
        for off in macs.into_iter().flatten() {
            let old: [u8; 6] = frame[off..off + 6]
                .try_into()
                .expect("locate checked the length");
            frame[off..off + 6].copy_from_slice(&self.mac(old));
        }
        let l4_csum = |proto: u8, v6: bool| -> Option<usize> {
            match proto {
                6 => Some(16),
                17 | 136 => Some(6),
                58 if v6 => Some(2),
                _ => None,
            }
        };
        let (addr_off, addr_len) = if ip.v6 {
            (ip.off + 8, 32)
        } else {
            (ip.off + 12, 8)
        };
        let old: [u8; 32] = {
            let mut b = [0u8; 32];
            b[..addr_len].copy_from_slice(&frame[addr_off..addr_off + addr_len]);
            b
        };
        let mut new = [0u8; 32];
        if ip.v6 {
            let s = self.v6(u128::from_be_bytes(old[..16].try_into().expect("16")));
            let d = self.v6(u128::from_be_bytes(old[16..32].try_into().expect("16")));
            new[..16].copy_from_slice(&s.to_be_bytes());
            new[16..].copy_from_slice(&d.to_be_bytes());
        } else {
            let s = self.v4(u32::from_be_bytes(old[..4].try_into().expect("4")));
            let d = self.v4(u32::from_be_bytes(old[4..8].try_into().expect("4")));
            new[..4].copy_from_slice(&s.to_be_bytes());
            new[4..8].copy_from_slice(&d.to_be_bytes());
            let c = ip.off + 10;
            let sum = u16::from_be_bytes([frame[c], frame[c + 1]]);
            frame[c..c + 2].copy_from_slice(&csum_adjust(sum, &old[..8], &new[..8]).to_be_bytes());
        }
        frame[addr_off..addr_off + addr_len].copy_from_slice(&new[..addr_len]);
        if let (Some(l4), Some(rel)) = (ip.l4(), l4_csum(ip.proto, ip.v6)) {
            let c = l4 + rel;
            if c + 2 <= frame.len() {
                let sum = u16::from_be_bytes([frame[c], frame[c + 1]]);
                let udp = ip.proto == 17 || ip.proto == 136;
                // an IPv4 UDP checksum of zero means "none": leave it so
                if !(udp && !ip.v6 && sum == 0) {
                    let mut adj = csum_adjust(sum, &old[..addr_len], &new[..addr_len]);
                    if udp && adj == 0 {
                        adj = 0xffff;
                    }
                    frame[c..c + 2].copy_from_slice(&adj.to_be_bytes());
                }
            }
        }
        true
    }
}

/// RFC 1624 incremental update: the checksum after 16-bit words `old` became `new`.
pub fn csum_adjust(csum: u16, old: &[u8], new: &[u8]) -> u16 {
    let mut sum: u32 = (!csum) as u32;
    for w in old.chunks_exact(2) {
        sum += (!u16::from_be_bytes([w[0], w[1]])) as u32;
    }
    for w in new.chunks_exact(2) {
        sum += u16::from_be_bytes([w[0], w[1]]) as u32;
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pan(seed: u8) -> CryptoPan {
        let mut k = [0u8; 32];
        for (i, b) in k.iter_mut().enumerate() {
            *b = seed.wrapping_add(i as u8).wrapping_mul(7);
        }
        CryptoPan::new(&k)
    }

    fn common_prefix(a: u128, b: u128) -> u32 {
        (a ^ b).leading_zeros()
    }

    proptest! {
        #[test]
        fn v4_prefix_preserving(a in any::<u32>(), b in any::<u32>(), seed in any::<u8>()) {
            let p = pan(seed);
            let (x, y) = (p.anonymize_v4(a), p.anonymize_v4(b));
            prop_assert_eq!((a ^ b).leading_zeros(), (x ^ y).leading_zeros());
        }

        #[test]
        fn v4_shared_prefix_pairs(a in any::<u32>(), k in 0u32..32, flip in any::<u32>(), seed in any::<u8>()) {
            // b shares exactly k bits with a
            let p = pan(seed);
            let below = if k == 31 { 0 } else { (1u32 << (31 - k)) - 1 };
            let b = (a ^ (1u32 << (31 - k))) ^ (flip & below);
            prop_assert_eq!((a ^ b).leading_zeros(), k);
            prop_assert_eq!((p.anonymize_v4(a) ^ p.anonymize_v4(b)).leading_zeros(), k);
        }

        #[test]
        fn v4_bijection(a in any::<u32>(), b in any::<u32>(), seed in any::<u8>()) {
            let p = pan(seed);
            prop_assert_eq!(p.deanonymize_v4(p.anonymize_v4(a)), a);
            prop_assert_eq!(p.anonymize_v4(p.deanonymize_v4(b)), b);
        }

        #[test]
        fn v6_prefix_preserving_and_bijection(a in any::<u128>(), k in 0u32..128, flip in any::<u128>(), seed in any::<u8>()) {
            let p = pan(seed);
            let below = if k == 127 { 0 } else { (1u128 << (127 - k)) - 1 };
            let b = (a ^ (1u128 << (127 - k))) ^ (flip & below);
            let (x, y) = (p.anonymize_v6(a), p.anonymize_v6(b));
            prop_assert_eq!(common_prefix(a, b), k);
            prop_assert_eq!(common_prefix(x, y), k);
            prop_assert_eq!(p.deanonymize_v6(x), a);
            prop_assert_eq!(p.deanonymize_v6(y), b);
        }
    }

    #[test]
    fn small_prefix_is_a_permutation() {
        // every address of a /16 maps into one /16 and no two collide
        let p = pan(9);
        let base = 0xc6120000u32;
        let mut seen = std::collections::HashSet::new();
        let first = p.anonymize_v4(base) & 0xffff0000;
        for i in 0..=0xffffu32 {
            let x = p.anonymize_v4(base | i);
            assert_eq!(x & 0xffff0000, first);
            assert!(seen.insert(x));
        }
    }

    #[test]
    fn keys_differ() {
        assert_ne!(
            pan(1).anonymize_v4(0x0a000001),
            pan(2).anonymize_v4(0x0a000001)
        );
    }

    fn tcp_v4_frame(payload: &[u8]) -> Vec<u8> {
        let b = etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv4([198, 18, 0, 1], [198, 19, 0, 2], 64)
            .tcp(40000, 80, 1000, 65535)
            .ack(1)
            .psh();
        let mut v = Vec::new();
        b.write(&mut v, payload).unwrap();
        v
    }

    fn checksums_valid(frame: &[u8]) -> bool {
        let p = etherparse::SlicedPacket::from_ethernet(frame).unwrap();
        match (p.net, p.transport) {
            (Some(etherparse::NetSlice::Ipv4(ip)), Some(etherparse::TransportSlice::Tcp(tcp))) => {
                let h = ip.header().to_header();
                h.calc_header_checksum() == h.header_checksum
                    && tcp
                        .calc_checksum_ipv4(ip.header().source(), ip.header().destination())
                        .unwrap()
                        == tcp.checksum()
            }
            (Some(etherparse::NetSlice::Ipv6(ip)), Some(etherparse::TransportSlice::Udp(udp))) => {
                udp.to_header()
                    .calc_checksum_ipv6(&ip.header().to_header(), udp.payload())
                    .unwrap()
                    == udp.checksum()
            }
            _ => panic!("unexpected frame"),
        }
    }

    #[test]
    fn rewrite_keeps_checksums_valid() {
        let mut a = Anonymizer::new(&[5u8; 32], [6u8; 16]);
        let mut f = tcp_v4_frame(b"GET / HTTP/1.1\r\n\r\n");
        assert!(checksums_valid(&f));
        let orig = f.clone();
        assert!(a.rewrite(LinkType::Ethernet, &mut f));
        assert!(checksums_valid(&f));
        assert_ne!(f[26..34], orig[26..34]);
        assert_ne!(f[0..12], orig[0..12]);
        assert_eq!(f[0] & 3, 2, "locally administered unicast");
        // same key, same result; addresses map consistently
        let mut g = orig.clone();
        Anonymizer::new(&[5u8; 32], [6u8; 16]).rewrite(LinkType::Ethernet, &mut g);
        assert_eq!(f, g);

        let b = etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [0x33, 0x33, 0, 0, 0, 1])
            .ipv6(
                [0x20, 1, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
                [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
                64,
            )
            .udp(53, 5353);
        let mut v6 = Vec::new();
        b.write(&mut v6, b"hello").unwrap();
        assert!(checksums_valid(&v6));
        assert!(a.rewrite(LinkType::Ethernet, &mut v6));
        assert!(checksums_valid(&v6));
        assert_eq!(&v6[0..3], &[0x33, 0x33, 0], "multicast group prefix kept");
    }

    #[test]
    fn csum_adjust_matches_recompute() {
        // a checksum over words [a, b] recomputed after b changes
        let sum = |ws: &[u16]| {
            let mut s: u32 = ws.iter().map(|&w| w as u32).sum();
            while s >> 16 != 0 {
                s = (s & 0xffff) + (s >> 16);
            }
            !(s as u16)
        };
        let c = sum(&[0x1234, 0xfedc]);
        assert_eq!(
            csum_adjust(c, &0xfedcu16.to_be_bytes(), &0x0001u16.to_be_bytes()),
            sum(&[0x1234, 0x0001])
        );
    }
}
