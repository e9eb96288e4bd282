//! A bounded set of half-open sequence ranges `[start, end)` (relative, unwrapped offsets):
//! what part of one direction's byte stream the capture has seen.

#[derive(Clone, Debug, Default)]
pub(crate) struct RangeSet {
    ranges: Vec<(i64, i64)>,
    /// Times two ranges had to be merged across a gap because the set was full.
    pub forced_merges: u32,
}

/// What inserting a range found.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Insert {
    /// Bytes of the range not seen before.
    pub new_bytes: i64,
    /// Bytes of the range already seen.
    pub old_bytes: i64,
}

impl RangeSet {
    const MAX_RANGES: usize = 512;

    pub fn insert(&mut self, start: i64, end: i64) -> Insert {
        if end <= start {
            return Insert {
                new_bytes: 0,
                old_bytes: 0,
            };
        }
        // fast path: in-order data extends the last range or starts a new one after it
        if let Some(last) = self.ranges.last_mut() {
            if start >= last.0 && start <= last.1 && end >= last.1 {
                let old = last.1 - start;
                last.1 = end;
                return Insert {
                    new_bytes: (end - start) - old,
                    old_bytes: old,
                };
            }
            if start > last.1 && self.ranges.len() < Self::MAX_RANGES {
                self.ranges.push((start, end));
                return Insert {
                    new_bytes: end - start,
                    old_bytes: 0,
                };
            }
        } else {
            self.ranges.push((start, end));
            return Insert {
                new_bytes: end - start,
                old_bytes: 0,
            };
        }
        // ranges are sorted by start and disjoint (adjacent ones merged)
        let i = self.ranges.partition_point(|r| r.1 < start);
        let mut j = i;
        let mut old = 0i64;
        let mut lo = start;
        let mut hi = end;
        while j < self.ranges.len() && self.ranges[j].0 <= end {
            let (a, b) = self.ranges[j];
            old += (b.min(end) - a.max(start)).max(0);
            lo = lo.min(a);
            hi = hi.max(b);
            j += 1;
        }
        self.ranges.splice(i..j, std::iter::once((lo, hi)));
        if self.ranges.len() > Self::MAX_RANGES {
            self.merge_closest();
        }
        Insert {
            new_bytes: (end - start) - old,
            old_bytes: old,
        }
    }

    fn merge_closest(&mut self) {
        let mut best = 1usize;
        let mut gap = i64::MAX;
        for k in 1..self.ranges.len() {
            let g = self.ranges[k].0 - self.ranges[k - 1].1;
            if g < gap {
                gap = g;
                best = k;
            }
        }
        let (_, b) = self.ranges.remove(best);
        self.ranges[best - 1].1 = b;
        self.forced_merges += 1;
    }

    /// True when every byte of `[start, end)` was seen.
    #[cfg(test)]
    pub fn covers(&self, start: i64, end: i64) -> bool {
        let i = self.ranges.partition_point(|r| r.1 < end);
        i < self.ranges.len() && self.ranges[i].0 <= start && self.ranges[i].1 >= end
    }

    pub fn first(&self) -> Option<i64> {
        self.ranges.first().map(|r| r.0)
    }
    /// Gaps between the ranges (sequence holes), plus any the set had to paper over.
    pub fn gaps(&self) -> u32 {
        self.ranges.len().saturating_sub(1) as u32 + self.forced_merges
    }
    pub fn total(&self) -> i64 {
        self.ranges.iter().map(|r| r.1 - r.0).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_and_overlap() {
        let mut r = RangeSet::default();
        assert_eq!(
            r.insert(0, 10),
            Insert {
                new_bytes: 10,
                old_bytes: 0
            }
        );
        assert_eq!(
            r.insert(20, 30),
            Insert {
                new_bytes: 10,
                old_bytes: 0
            }
        );
        assert_eq!(r.gaps(), 1);
        assert_eq!(
            r.insert(5, 25),
            Insert {
                new_bytes: 10,
                old_bytes: 10
            }
        );
        assert_eq!(r.gaps(), 0);
        assert!(r.covers(0, 30));
        assert!(!r.covers(0, 31));
        assert_eq!(
            r.insert(0, 30),
            Insert {
                new_bytes: 0,
                old_bytes: 30
            }
        );
        // adjacent ranges merge
        r.insert(30, 40);
        assert_eq!(r.gaps(), 0);
        assert_eq!(r.total(), 40);
    }

    #[test]
    fn bounded() {
        let mut r = RangeSet::default();
        for k in 0..2000 {
            r.insert(k * 10, k * 10 + 5);
        }
        assert!(r.ranges.len() <= RangeSet::MAX_RANGES);
        assert_eq!(r.gaps(), 1999);
    }
}
