//! A hashed timing wheel for packet departures: 65,536 slots of 1.024 µs (a 67 ms horizon),
//! a two-level bitmap to find the next busy slot quickly, and a heap for deadlines beyond the
//! horizon. Entries due in the same slot come out in (deadline, insertion) order, so packets
//! of one pipe never overtake each other. Pure: time is an argument.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use crate::units::Nanos;

const TICK_SHIFT: u32 = 10;
const SLOT_BITS: u32 = 16;
const NSLOTS: usize = 1 << SLOT_BITS;
const MASK: u64 = NSLOTS as u64 - 1;
const WORDS: usize = NSLOTS / 64;

struct Far<T> {
    deadline: Nanos,
    seq: u64,
    item: T,
}
impl<T> PartialEq for Far<T> {
    fn eq(&self, o: &Self) -> bool {
        (self.deadline, self.seq) == (o.deadline, o.seq)
    }
}
impl<T> Eq for Far<T> {}
impl<T> PartialOrd for Far<T> {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl<T> Ord for Far<T> {
    fn cmp(&self, o: &Self) -> Ordering {
        (self.deadline, self.seq).cmp(&(o.deadline, o.seq))
    }
}

pub struct TimingWheel<T> {
    slots: Vec<Vec<(Nanos, u64, T)>>,
    bits: Vec<u64>,
    summary: [u64; WORDS / 64],
    /// Tick of the earliest slot that may still hold entries.
    cur_tick: u64,
    far: BinaryHeap<Reverse<Far<T>>>,
    seq: u64,
    len: usize,
    scratch: Vec<(Nanos, u64, T)>,
}

impl<T> Default for TimingWheel<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> TimingWheel<T> {
    pub fn new() -> Self {
        TimingWheel {
            slots: (0..NSLOTS).map(|_| Vec::new()).collect(),
            bits: vec![0; WORDS],
            summary: [0; WORDS / 64],
            cur_tick: 0,
            far: BinaryHeap::new(),
            seq: 0,
            len: 0,
            scratch: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn mark(&mut self, slot: usize) {
        self.bits[slot / 64] |= 1 << (slot % 64);
        self.summary[slot / 4096] |= 1 << ((slot / 64) % 64);
    }

    fn unmark(&mut self, slot: usize) {
        self.bits[slot / 64] &= !(1 << (slot % 64));
        if self.bits[slot / 64] == 0 {
            self.summary[slot / 4096] &= !(1 << ((slot / 64) % 64));
        }
    }

    fn place(&mut self, deadline: Nanos, seq: u64, item: T) {
        let tick = (deadline >> TICK_SHIFT).max(self.cur_tick);
        if tick - self.cur_tick < NSLOTS as u64 {
            let slot = (tick & MASK) as usize;
            self.slots[slot].push((deadline, seq, item));
            self.mark(slot);
        } else {
            self.far.push(Reverse(Far {
                deadline,
                seq,
                item,
            }));
        }
    }

    /// Schedules `item` at `deadline` (a deadline in the past is due at once).
    pub fn insert(&mut self, deadline: Nanos, item: T) {
        let seq = self.seq;
        self.seq += 1;
        self.len += 1;
        self.place(deadline, seq, item);
    }

    /// First busy slot at or after `from` (circularly), as an offset in slots from `from`.
    fn next_busy_offset(&self, from: usize) -> Option<usize> {
        // Same word, at or after `from`.
        let w = from / 64;
        let here = self.bits[w] & (!0u64 << (from % 64));
        if here != 0 {
            return Some(w * 64 + here.trailing_zeros() as usize - from);
        }
        // Following words, through the summary, wrapping once.
        let nw = WORDS;
        let mut wi = (w + 1) % nw;
        let mut scanned = 0;
        while scanned < nw {
            let sw = wi / 64;
            let sbits = self.summary[sw] & (!0u64 << (wi % 64));
            if sbits != 0 {
                let word = sw * 64 + sbits.trailing_zeros() as usize;
                let slot = word * 64 + self.bits[word].trailing_zeros() as usize;
                return Some((slot + NSLOTS - from) % NSLOTS);
            }
            let step = 64 - wi % 64;
            scanned += step;
            wi = (wi + step) % nw;
        }
        // Only the part of the starting word before `from` is left.
        let before = self.bits[w] & !(!0u64 << (from % 64));
        if before != 0 {
            return Some((w * 64 + before.trailing_zeros() as usize + NSLOTS - from) % NSLOTS);
        }
        None
    }

    /// The earliest deadline scheduled, if any.
    pub fn next_deadline(&self) -> Option<Nanos> {
        let near = self
            .next_busy_offset((self.cur_tick & MASK) as usize)
            .map(|off| {
                let slot = ((self.cur_tick + off as u64) & MASK) as usize;
                self.slots[slot]
                    .iter()
                    .map(|e| e.0)
                    .min()
                    .unwrap_or(Nanos::MAX)
            });
        let far = self.far.peek().map(|r| r.0.deadline);
        match (near, far) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Moves every entry due at or before `now` to `out`, in (deadline, insertion) order.
    pub fn pop_due(&mut self, now: Nanos, out: &mut Vec<(Nanos, T)>) {
        let now_tick = now >> TICK_SHIFT;
        let mut due = std::mem::take(&mut self.scratch);
        while self.cur_tick <= now_tick {
            let Some(off) = self.next_busy_offset((self.cur_tick & MASK) as usize) else {
                self.cur_tick = now_tick;
                break;
            };
            let tick = self.cur_tick + off as u64;
            if tick > now_tick {
                self.cur_tick = now_tick;
                break;
            }
            let slot = (tick & MASK) as usize;
            let entries = &mut self.slots[slot];
            if tick < now_tick {
                due.append(entries);
            } else {
                let mut i = 0;
                while i < entries.len() {
                    if entries[i].0 <= now {
                        due.push(entries.swap_remove(i));
                    } else {
                        i += 1;
                    }
                }
            }
            if self.slots[slot].is_empty() {
                self.unmark(slot);
            }
            if tick == now_tick {
                self.cur_tick = now_tick;
                break;
            }
            self.cur_tick = tick + 1;
        }
        // Bring far entries that are now within the horizon into the wheel (or out, if due).
        while let Some(top) = self.far.peek() {
            let d = top.0.deadline;
            if (d >> TICK_SHIFT).saturating_sub(self.cur_tick) >= NSLOTS as u64 {
                break;
            }
            let Reverse(f) = self.far.pop().unwrap();
            if f.deadline <= now {
                due.push((f.deadline, f.seq, f.item));
            } else {
                self.place(f.deadline, f.seq, f.item);
            }
        }
        if !due.is_empty() {
            due.sort_unstable_by_key(|e| (e.0, e.1));
            self.len -= due.len();
            out.extend(due.drain(..).map(|(d, _, t)| (d, t)));
        }
        self.scratch = due;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_in_deadline_then_insertion_order() {
        let mut w = TimingWheel::new();
        w.insert(5_000, 'c');
        w.insert(1_000, 'a');
        w.insert(1_000, 'b');
        w.insert(1_500, 'x');
        assert_eq!(w.next_deadline(), Some(1_000));
        let mut out = Vec::new();
        w.pop_due(999, &mut out);
        assert!(out.is_empty());
        w.pop_due(1_200, &mut out);
        assert_eq!(out, vec![(1_000, 'a'), (1_000, 'b')]);
        out.clear();
        assert_eq!(w.next_deadline(), Some(1_500));
        w.pop_due(10_000, &mut out);
        assert_eq!(out, vec![(1_500, 'x'), (5_000, 'c')]);
        assert!(w.is_empty());
        assert_eq!(w.next_deadline(), None);
    }

    #[test]
    fn far_deadlines_and_wraparound() {
        let mut w = TimingWheel::new();
        let base = 3_000_000_000u64; // starts far from zero: everything is "far" at first
        w.insert(base + 200_000_000, 2);
        w.insert(base, 1);
        w.insert(base + 5_000_000_000, 3);
        let mut out = Vec::new();
        let mut t = 0;
        // Step a virtual clock in irregular strides; nothing may come out early or be lost.
        let mut steps = 0;
        while !w.is_empty() {
            let next = w.next_deadline().unwrap();
            t = t.max(next);
            w.pop_due(t, &mut out);
            steps += 1;
            assert!(steps < 100, "no progress");
        }
        assert_eq!(
            out,
            vec![
                (base, 1),
                (base + 200_000_000, 2),
                (base + 5_000_000_000, 3)
            ]
        );
    }

    #[test]
    fn many_random_deadlines_come_out_sorted_and_on_time() {
        let mut r = crate::rng::Rng::new(5);
        let mut w = TimingWheel::new();
        let mut expect = Vec::new();
        for i in 0..50_000u64 {
            let d = 1_000_000 + r.next_u64() % 300_000_000;
            w.insert(d, i);
            expect.push((d, i));
        }
        expect.sort();
        let mut out = Vec::new();
        let mut now = 0;
        while !w.is_empty() {
            now += 1 + r.next_u64() % 3_000_000;
            let before = out.len();
            w.pop_due(now, &mut out);
            for e in &out[before..] {
                assert!(e.0 <= now);
            }
            if let Some(n) = w.next_deadline() {
                assert!(n > now);
            }
        }
        assert_eq!(out, expect);
    }
}
