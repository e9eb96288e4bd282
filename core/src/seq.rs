//! TCP sequence numbers: 32-bit values compared and subtracted modulo 2^32 (RFC 793 / 1982).

use std::cmp::Ordering;
use std::fmt;

#[derive(Copy, Clone, Default, PartialEq, Eq, Hash)]
pub struct SeqNum(pub u32);

impl SeqNum {
    /// Signed distance `self - other`, valid while the two are within 2^31 of each other.
    #[inline]
    pub fn diff(self, other: SeqNum) -> i32 {
        self.0.wrapping_sub(other.0) as i32
    }
    #[inline]
    pub fn wrapping_add(self, n: u32) -> SeqNum {
        SeqNum(self.0.wrapping_add(n))
    }
    #[inline]
    pub fn lt(self, other: SeqNum) -> bool {
        self.diff(other) < 0
    }
    #[inline]
    pub fn le(self, other: SeqNum) -> bool {
        self.diff(other) <= 0
    }
    #[inline]
    pub fn gt(self, other: SeqNum) -> bool {
        self.diff(other) > 0
    }
    #[inline]
    pub fn ge(self, other: SeqNum) -> bool {
        self.diff(other) >= 0
    }
    /// The later of two sequence numbers (modulo comparison).
    #[inline]
    pub fn max(self, other: SeqNum) -> SeqNum {
        if self.ge(other) {
            self
        } else {
            other
        }
    }
    #[inline]
    pub fn min(self, other: SeqNum) -> SeqNum {
        if self.le(other) {
            self
        } else {
            other
        }
    }
}

impl PartialOrd for SeqNum {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.diff(*other).cmp(&0))
    }
}

impl fmt::Debug for SeqNum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SeqNum({})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps() {
        let a = SeqNum(u32::MAX - 10);
        let b = a.wrapping_add(20);
        assert_eq!(b, SeqNum(9));
        assert!(a.lt(b));
        assert!(b.gt(a));
        assert_eq!(b.diff(a), 20);
        assert_eq!(a.diff(b), -20);
        assert_eq!(a.max(b), b);
        assert!(a < b);
    }
}
