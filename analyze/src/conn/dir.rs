//! The two directions of a connection, named.
//!
//! Which end is the client is decided only when the record is built (a handshake captured late,
//! or a `--server-port` hint, can still set it), so while packets come in a direction is named
//! by the end that sends it: [`Dir::Fwd`] from the canonical key's `src`, [`Dir::Rev`] from its
//! `dst`. [`PerDir`] holds one value per direction, indexed by a `Dir`.

use std::ops::{Index, IndexMut};

/// A direction of a connection, named by its sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Dir {
    /// Sent from the canonical flow key's `src`.
    Fwd = 0,
    /// Sent from the canonical flow key's `dst`.
    Rev = 1,
}

impl Dir {
    /// Both directions, `Fwd` first.
    pub const BOTH: [Dir; 2] = [Dir::Fwd, Dir::Rev];

    /// The direction of a segment whose flow key had to be swapped to become canonical
    /// (`FlowKey::canonical`): it was sent from the canonical `dst`.
    #[inline]
    pub fn of_swapped(swapped: bool) -> Dir {
        if swapped {
            Dir::Rev
        } else {
            Dir::Fwd
        }
    }

    /// The opposite direction (the receiver's data, the sender's ACKs).
    #[inline]
    pub fn other(self) -> Dir {
        match self {
            Dir::Fwd => Dir::Rev,
            Dir::Rev => Dir::Fwd,
        }
    }
}

/// One value per direction.
#[derive(Clone, Debug, Default)]
pub(crate) struct PerDir<T>(pub [T; 2]);

impl<T> PerDir<T> {
    /// The value of `d` and of the other direction, both mutable.
    #[inline]
    pub fn pair_mut(&mut self, d: Dir) -> (&mut T, &mut T) {
        let [a, b] = &mut self.0;
        match d {
            Dir::Fwd => (a, b),
            Dir::Rev => (b, a),
        }
    }

    /// Both values, `Fwd` first.
    #[inline]
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.0.iter()
    }
}

impl<T> Index<Dir> for PerDir<T> {
    type Output = T;
    #[inline]
    fn index(&self, d: Dir) -> &T {
        &self.0[d as usize]
    }
}

impl<T> IndexMut<Dir> for PerDir<T> {
    #[inline]
    fn index_mut(&mut self, d: Dir) -> &mut T {
        &mut self.0[d as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_and_indexing_agree() {
        let mut v = PerDir([10, 20]);
        assert_eq!(Dir::Fwd.other(), Dir::Rev);
        assert_eq!(Dir::Rev.other(), Dir::Fwd);
        assert_eq!(Dir::of_swapped(false), Dir::Fwd);
        assert_eq!(Dir::of_swapped(true), Dir::Rev);
        assert_eq!((v[Dir::Fwd], v[Dir::Rev]), (10, 20));
        let (me, other) = v.pair_mut(Dir::Rev);
        *me += 1;
        *other += 2;
        assert_eq!(v.0, [12, 21]);
    }
}
