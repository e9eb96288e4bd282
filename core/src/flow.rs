//! Flow keys: the VLAN tag stack plus the TCP 4-tuple, and a canonical (direction-free) form so
//! both directions of a connection find the same table entry.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;

/// Up to five 12-bit VLAN ids packed with their count (outermost first). Part of the flow key:
/// the same 4-tuple seen untagged and on VLAN 42 is two different connections.
#[derive(Copy, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VlanStack(u64);

impl VlanStack {
    pub const MAX_TAGS: usize = 5;
    pub const NONE: VlanStack = VlanStack(0);

    /// Adds the next (inner) tag; returns false when the stack is full (the tag is then ignored).
    pub fn push(&mut self, vid: u16) -> bool {
        let n = self.len();
        if n >= Self::MAX_TAGS {
            return false;
        }
        self.0 |= ((vid as u64) & 0xfff) << (12 * n);
        self.0 = (self.0 & !(0xf << 60)) | (((n + 1) as u64) << 60);
        true
    }
    pub fn len(&self) -> usize {
        (self.0 >> 60) as usize
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn get(&self, i: usize) -> Option<u16> {
        (i < self.len()).then(|| ((self.0 >> (12 * i)) & 0xfff) as u16)
    }
    /// The outermost tag, which the database stores in `connections.vlan`.
    pub fn outer(&self) -> Option<u16> {
        self.get(0)
    }
    pub fn iter(&self) -> impl Iterator<Item = u16> + '_ {
        (0..self.len()).filter_map(|i| self.get(i))
    }
}

impl fmt::Debug for VlanStack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Endpoint {
    pub addr: IpAddr,
    pub port: u16,
}

impl Endpoint {
    pub fn new(addr: IpAddr, port: u16) -> Self {
        Endpoint { addr, port }
    }
    /// Address and port packed into one integer (IPv4 and IPv6 never collide): cheap to hash
    /// and to compare.
    #[inline]
    fn packed(&self) -> (u128, u32) {
        match self.addr {
            IpAddr::V4(a) => (u32::from(a) as u128, self.port as u32),
            IpAddr::V6(a) => (u128::from(a), self.port as u32 | 1 << 16),
        }
    }
}

impl Hash for Endpoint {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        let (a, p) = self.packed();
        state.write_u64(a as u64);
        state.write_u64((a >> 64) as u64 ^ (p as u64) << 40);
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.addr {
            IpAddr::V4(a) => write!(f, "{a}:{}", self.port),
            IpAddr::V6(a) => write!(f, "[{a}]:{}", self.port),
        }
    }
}

/// A directed flow key: `src` sent the packet to `dst`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct FlowKey {
    pub vlan: VlanStack,
    pub src: Endpoint,
    pub dst: Endpoint,
}

impl FlowKey {
    /// The same key with both ends in a fixed order, and whether this packet's direction was
    /// swapped to get there. Both directions of a connection map to one canonical key.
    #[inline]
    pub fn canonical(&self) -> (FlowKey, bool) {
        if self.src.packed() <= self.dst.packed() {
            (*self, false)
        } else {
            (self.reversed(), true)
        }
    }
    #[inline]
    pub fn reversed(&self) -> FlowKey {
        FlowKey {
            vlan: self.vlan,
            src: self.dst,
            dst: self.src,
        }
    }
    /// A direction-independent 64-bit hash (same for both directions), for sharding work by flow.
    pub fn symmetric_hash(&self) -> u64 {
        let (c, _) = self.canonical();
        let mut h = rustc_hash::FxHasher::default();
        c.hash(&mut h);
        // FxHash's low bits are weak on structured input; finish with a 64-bit mixer.
        let mut x = h.finish();
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51afd7ed558ccd);
        x ^= x >> 33;
        x
    }
}

impl Hash for FlowKey {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.vlan.0);
        self.src.hash(state);
        self.dst.hash(state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(s: &str, p: u16) -> Endpoint {
        Endpoint::new(s.parse().unwrap(), p)
    }

    #[test]
    fn canonical_is_direction_free() {
        let k = FlowKey {
            vlan: VlanStack::NONE,
            src: ep("10.0.0.2", 80),
            dst: ep("10.0.0.1", 5555),
        };
        let (c1, s1) = k.canonical();
        let (c2, s2) = k.reversed().canonical();
        assert_eq!(c1, c2);
        assert_ne!(s1, s2);
        assert_eq!(k.symmetric_hash(), k.reversed().symmetric_hash());
    }

    #[test]
    fn vlan_stack() {
        let mut v = VlanStack::NONE;
        assert!(v.is_empty());
        assert!(v.push(42));
        assert!(v.push(7));
        assert_eq!(v.len(), 2);
        assert_eq!(v.outer(), Some(42));
        assert_eq!(v.get(1), Some(7));
        for _ in 0..3 {
            assert!(v.push(1));
        }
        assert!(!v.push(1));
        assert_eq!(v.len(), 5);
        assert_ne!(VlanStack::NONE, {
            let mut z = VlanStack::NONE;
            z.push(0);
            z
        });
    }
}
