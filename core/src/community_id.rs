//! The Community ID v1 flow hash (the `community_id` column of `connections`, the identifier
//! Zeek, Suricata, Arkime and Elastic emit, so flows join across tools), and the shards of
//! `mimic analyze --shard K/N`, which are drawn from the same hash.
//!
//! Community ID v1 (corelight/community-id-spec): SHA-1 over
//!
//! | bytes | field |
//! |---|---|
//! | 2 | seed, big-endian (0 unless configured) |
//! | 4 or 16 | the lesser endpoint's address (network byte order) |
//! | 4 or 16 | the other endpoint's address |
//! | 1 | IP protocol number (6 for TCP) |
//! | 1 | zero padding |
//! | 2 | the lesser endpoint's port, big-endian |
//! | 2 | the other endpoint's port, big-endian |
//!
//! where the lesser endpoint is the one whose address bytes compare lower, or, with equal
//! addresses, whose port is lower: both directions of a flow give the same hash. The ID is
//! `1:` followed by the standard base64 (with padding) of the 20-byte digest. The VLAN tags are
//! not part of it.
//!
//! A shard is the digest's first eight bytes read as a big-endian unsigned integer, modulo the
//! number of shards N, plus one: shard K of N (1-based) holds the flows whose value is K - 1.
//! It depends on nothing but the flow's addresses and ports (no per-process or per-host hash
//! seed), so every version of mimic on every host puts a connection in the same shard.

use std::fmt;
use std::net::IpAddr;

use base64::Engine;
use sha1::{Digest, Sha1};

use crate::flow::{Endpoint, FlowKey};

/// The seed mimic hashes with: the spec's default, which the other tools use unless configured.
pub const SEED: u16 = 0;
/// IP protocol number of TCP.
pub const PROTO_TCP: u8 = 6;

fn addr_bytes(a: &IpAddr) -> ([u8; 16], usize) {
    let mut b = [0u8; 16];
    match a {
        IpAddr::V4(v4) => {
            b[..4].copy_from_slice(&v4.octets());
            (b, 4)
        }
        IpAddr::V6(v6) => {
            b.copy_from_slice(&v6.octets());
            (b, 16)
        }
    }
}

/// The SHA-1 digest of Community ID v1 for a flow between `a` and `b` (in either order) over
/// IP protocol `proto` with ports (TCP, UDP, SCTP; ICMP's type/code mapping is not provided).
pub fn digest_v1(seed: u16, proto: u8, a: &Endpoint, b: &Endpoint) -> [u8; 20] {
    let (ab, al) = addr_bytes(&a.addr);
    let (bb, bl) = addr_bytes(&b.addr);
    let (a_addr, b_addr) = (&ab[..al], &bb[..bl]);
    let ordered = a_addr < b_addr || (a_addr == b_addr && a.port <= b.port);
    let ((lo, lo_port), (hi, hi_port)) = if ordered {
        ((a_addr, a.port), (b_addr, b.port))
    } else {
        ((b_addr, b.port), (a_addr, a.port))
    };
    let mut h = Sha1::new();
    h.update(seed.to_be_bytes());
    h.update(lo);
    h.update(hi);
    h.update([proto, 0]);
    h.update(lo_port.to_be_bytes());
    h.update(hi_port.to_be_bytes());
    h.finalize().into()
}

/// The Community ID v1 string (`1:` + base64 of [`digest_v1`]).
pub fn community_id_v1(seed: u16, proto: u8, a: &Endpoint, b: &Endpoint) -> String {
    let d = digest_v1(seed, proto, a, b);
    format!("1:{}", base64::engine::general_purpose::STANDARD.encode(d))
}

/// The Community ID of a TCP connection, with the default seed: the `community_id` column.
pub fn tcp_community_id(a: &Endpoint, b: &Endpoint) -> String {
    community_id_v1(SEED, PROTO_TCP, a, b)
}

/// One of N shards of the connections, numbered 1..=N (`--shard K/N`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Shard {
    index: u32,
    count: u32,
}

/// The most shards a run may be split into.
pub const MAX_SHARDS: u32 = 65_536;

impl Shard {
    /// Shard `index` (1-based) of `count`.
    pub fn new(index: u32, count: u32) -> Result<Shard, String> {
        if count == 0 || count > MAX_SHARDS {
            return Err(format!(
                "the shard count must be 1..={MAX_SHARDS}, not {count}"
            ));
        }
        if index == 0 || index > count {
            return Err(format!(
                "shard {index}/{count}: the shard number must be 1..={count} (shards are numbered from 1)"
            ));
        }
        Ok(Shard { index, count })
    }
    /// 1-based.
    pub fn index(&self) -> u32 {
        self.index
    }
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The shard (1-based) of `count` that the TCP flow between `a` and `b` belongs to.
    pub fn of(a: &Endpoint, b: &Endpoint, count: u32) -> u32 {
        let d = digest_v1(SEED, PROTO_TCP, a, b);
        let v = u64::from_be_bytes(d[..8].try_into().expect("8 bytes"));
        (v % count.max(1) as u64) as u32 + 1
    }

    /// Whether the connection of `key` (either direction; VLAN tags do not count) is in this
    /// shard.
    pub fn contains(&self, key: &FlowKey) -> bool {
        self.count == 1 || Shard::of(&key.src, &key.dst, self.count) == self.index
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl std::str::FromStr for Shard {
    type Err = String;
    fn from_str(s: &str) -> Result<Shard, String> {
        let bad = || format!("'{s}': a shard is K/N, shard K (1..=N) of N, such as 1/4");
        let (k, n) = s.split_once('/').ok_or_else(bad)?;
        let (k, n) = (k.trim(), n.trim());
        let whole = |x: &str| !x.is_empty() && x.bytes().all(|b| b.is_ascii_digit());
        if !whole(k) || !whole(n) {
            return Err(bad());
        }
        // a whole number too large for u32 is out of range, not malformed
        let (Ok(k), Ok(n)) = (
            u32::try_from(k.parse::<u128>().unwrap_or(u128::MAX)),
            u32::try_from(n.parse::<u128>().unwrap_or(u128::MAX)),
        ) else {
            return Err(format!(
                "'{s}': out of range (the shard count must be 1..={MAX_SHARDS}, the shard number 1..=count)"
            ));
        };
        Shard::new(k, n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(a: &str, p: u16) -> Endpoint {
        Endpoint::new(a.parse().unwrap(), p)
    }

    /// The spec's published baseline (corelight/community-id-spec, baseline/README.md and
    /// baseline_deflt.json): each flow in both directions.
    #[test]
    fn published_test_vectors() {
        let cases: &[(u16, u8, &str, u16, &str, u16, &str)] = &[
            // default seed
            (
                0,
                6,
                "1.2.3.4",
                1122,
                "5.6.7.8",
                3344,
                "1:wCb3OG7yAFWelaUydu0D+125CLM=",
            ),
            (
                0,
                17,
                "1.2.3.4",
                1122,
                "5.6.7.8",
                3344,
                "1:0Mu9InQx6z4ZiCZM/7HXi2WMhOg=",
            ),
            (
                0,
                132,
                "1.2.3.4",
                1122,
                "5.6.7.8",
                3344,
                "1:EKt4MsxuyaE6mL+hmrEkQ9csDD8=",
            ),
            (
                0,
                6,
                "2001:470:e5bf:dead:4957:2174:e82c:4887",
                63943,
                "2607:f8b0:400c:c03::1a",
                25,
                "1:/qFaeAR+gFe1KYjMzVDsMv+wgU4=",
            ),
            (
                0,
                6,
                "128.232.110.120",
                34855,
                "66.35.250.204",
                80,
                "1:LQU9qZlK+B5F3KDmev6m5PMibrg=",
            ),
            (
                0,
                17,
                "192.168.1.52",
                54585,
                "8.8.8.8",
                53,
                "1:d/FP5EW3wiY1vCndhwleRRKHowQ=",
            ),
            (
                0,
                132,
                "192.168.170.8",
                7,
                "192.168.170.56",
                7,
                "1:MP2EtRCAUIZvTw6MxJHLV7N7JDs=",
            ),
            // seed 1
            (
                1,
                6,
                "1.2.3.4",
                1122,
                "5.6.7.8",
                3344,
                "1:HhA1B+6CoLbiKPEs5nhNYN4XWfk=",
            ),
            (
                1,
                17,
                "1.2.3.4",
                1122,
                "5.6.7.8",
                3344,
                "1:OShq+iKDAMVouh/4bMxB9Sz4amw=",
            ),
            (
                1,
                132,
                "1.2.3.4",
                1122,
                "5.6.7.8",
                3344,
                "1:uitchpn5MMGAQKBJh7bIr/bAr7s=",
            ),
        ];
        for &(seed, proto, a, ap, b, bp, want) in cases {
            let (x, y) = (ep(a, ap), ep(b, bp));
            assert_eq!(community_id_v1(seed, proto, &x, &y), want, "{x} -> {y}");
            assert_eq!(community_id_v1(seed, proto, &y, &x), want, "{y} -> {x}");
        }
        // the baseline without base64: the digest itself
        let d = digest_v1(0, 6, &ep("5.6.7.8", 3344), &ep("1.2.3.4", 1122));
        let hex: String = d.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "c026f7386ef200559e95a53276ed03fb5db908b3");
        assert_eq!(
            tcp_community_id(&ep("1.2.3.4", 1122), &ep("5.6.7.8", 3344)),
            "1:wCb3OG7yAFWelaUydu0D+125CLM="
        );
    }

    /// The shard of a flow is fixed by the digest: these values are part of the documented,
    /// stable contract (a change here moves connections between shards of old and new runs).
    #[test]
    fn shards_are_stable_and_symmetric() {
        let (a, b) = (ep("1.2.3.4", 1122), ep("5.6.7.8", 3344));
        // digest c026f7386ef20055...: 0xc026f7386ef20055 % 4 = 1, % 7 = ...
        let v: u64 = 0xc026_f738_6ef2_0055;
        for n in [1u32, 2, 3, 4, 7, 16, 1000] {
            assert_eq!(Shard::of(&a, &b, n), (v % n as u64) as u32 + 1);
            assert_eq!(Shard::of(&b, &a, n), Shard::of(&a, &b, n));
        }
        assert_eq!(Shard::of(&a, &b, 4), 2);
        let key = FlowKey {
            vlan: crate::VlanStack::NONE,
            src: b,
            dst: a,
        };
        let shards: Vec<Shard> = (1..=4).map(|k| Shard::new(k, 4).unwrap()).collect();
        assert_eq!(shards.iter().filter(|s| s.contains(&key)).count(), 1);
        assert!(shards[1].contains(&key) && shards[1].contains(&key.reversed()));
        // flows spread over the shards
        let mut per = [0u32; 4];
        for port in 1024..5120u16 {
            per[Shard::of(&ep("10.0.0.1", port), &ep("10.0.0.2", 80), 4) as usize - 1] += 1;
        }
        assert!(per.iter().all(|&n| n > 900), "{per:?}");
    }

    #[test]
    fn parses_k_of_n() {
        assert_eq!("2/4".parse::<Shard>().unwrap(), Shard::new(2, 4).unwrap());
        assert_eq!(Shard::new(1, 1).unwrap().to_string(), "1/1");
        for bad in [
            "0/4", "5/4", "1/0", "4", "a/b", "1/4/2", "-1/4", "1/70000", "+1/4",
        ] {
            assert!(bad.parse::<Shard>().is_err(), "{bad}");
        }
        // too large is out of range, not malformed
        for big in ["1/4294967296", "99999999999999999999/4", "1/70000"] {
            let e = big.parse::<Shard>().unwrap_err();
            assert!(!e.contains("a shard is K/N"), "{big}: {e}");
        }
    }
}
