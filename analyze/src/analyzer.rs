//! The connection table: frames in (with their capture time), connection records out.
//!
//! Sans-I/O: the analyzer never reads a clock or a file. Time only moves with the frames it
//! is given, which drive idle timeouts; `finish` closes what is left at the end of the input.

use std::collections::{BTreeMap, VecDeque};

use foldhash::fast::FixedState;
use mimic_core::packet::{decode, DecodeError, LinkType};
use mimic_core::{FlowKey, TcpSegment, Timestamp};
use serde::Serialize;

use crate::config::Config;
use crate::conn::{Conn, Dir};
use crate::halfopen::HalfOpen;
use crate::record::ConnectionRecord;

/// Counters of what the analyzer did with its input.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct AnalyzerStats {
    pub frames: u64,
    pub tcp_segments: u64,
    /// Frames that did not decode to a TCP segment, by reason.
    pub skipped: BTreeMap<&'static str, u64>,
    /// Identical data segments captured twice in a row (a capture artefact), ignored.
    pub duplicate_frames: u64,
    pub connections: u64,
    /// Connections closed early because the table was full.
    pub evicted: u64,
    /// Connections closed by the idle timeout.
    pub idle_closed: u64,
    /// New connections on a 4-tuple still in the table (port reuse).
    pub port_reuse: u64,
    /// Most connections tracked at once.
    pub peak_connections: u64,
    /// What per-connection bounds dropped (segments tracked, samples, data units, sequence
    /// ranges merged): each a limit of `Config`.
    pub limit_drops: BTreeMap<&'static str, u64>,
    /// Frames whose time was earlier than a frame before them, and the largest step back.
    pub time_backwards: u64,
    pub max_backwards_ns: i64,
    /// `--shard K/N`: TCP segments of connections in other shards (counted in `frames`, not in
    /// `tcp_segments`, and not analyzed).
    pub other_shard_segments: u64,
}

impl AnalyzerStats {
    pub fn merge(&mut self, o: &AnalyzerStats) {
        self.frames += o.frames;
        self.tcp_segments += o.tcp_segments;
        for (k, v) in &o.skipped {
            *self.skipped.entry(k).or_default() += v;
        }
        self.duplicate_frames += o.duplicate_frames;
        self.connections += o.connections;
        self.evicted += o.evicted;
        self.idle_closed += o.idle_closed;
        self.port_reuse += o.port_reuse;
        self.peak_connections += o.peak_connections;
        for (k, v) in &o.limit_drops {
            *self.limit_drops.entry(k).or_default() += v;
        }
        self.time_backwards += o.time_backwards;
        self.max_backwards_ns = self.max_backwards_ns.max(o.max_backwards_ns);
        self.other_shard_segments += o.other_shard_segments;
    }
}

/// The connection tables' map: foldhash with a fixed seed (deterministic). Lookups took fewer
/// instructions with it than with FxHash (callgrind: `get_mut` 35.9 M against 30.5 M on the
/// benchmark trace's first 300,000 frames). Nothing depends on the tables' iteration order.
type FlowMap<V> = std::collections::HashMap<FlowKey, V, FixedState>;

pub struct Analyzer {
    cfg: Config,
    pub(crate) table: FlowMap<Box<Conn>>,
    /// Connections that have sent only SYNs (a scan's or a flood's): a compact entry each
    /// until their first other packet (see `halfopen`). Together with `table` they are the
    /// connections tracked, bounded by `max_connections`.
    pub(crate) half: FlowMap<HalfOpen>,
    /// Connections that started as a half-open entry (for tests).
    pub(crate) half_opened: u64,
    /// Every connection gets a full `Conn` from its first packet (as before half-open
    /// entries): for tests proving that the entries change no record.
    no_half: bool,
    /// Connections closed, in output order, not yet made into records: a record is built when
    /// it is polled, so closing many at once (an eviction, the end of the input) holds their
    /// compact entries, not millions of records.
    out: VecDeque<Closing>,
    stats: AnalyzerStats,
    now: Timestamp,
    last_sweep: Timestamp,
    /// With a shard: which recently seen flows (canonical key) are in it, so a flow's hash is
    /// computed about once, not once per segment. Direct-mapped and fixed in size.
    shard_cache: Vec<Option<(FlowKey, bool)>>,
}

/// Entries of the shard cache (a power of two).
const SHARD_CACHE: usize = 1 << 14;

impl Analyzer {
    pub fn new(cfg: Config) -> Analyzer {
        Analyzer {
            cfg,
            table: FlowMap::default(),
            half: FlowMap::default(),
            half_opened: 0,
            no_half: false,
            out: VecDeque::new(),
            stats: AnalyzerStats::default(),
            now: Timestamp::from_nanos(i64::MIN),
            last_sweep: Timestamp::from_nanos(i64::MIN),
            shard_cache: Vec::new(),
        }
    }

    /// Whether the connection of canonical key `key` belongs to this analyzer's shard.
    fn in_shard(&mut self, key: &FlowKey) -> bool {
        let Some(shard) = self.cfg.shard else {
            return true;
        };
        if shard.count() == 1 {
            return true;
        }
        if self.shard_cache.is_empty() {
            self.shard_cache = vec![None; SHARD_CACHE];
        }
        let slot = {
            use std::hash::{BuildHasher, BuildHasherDefault};
            BuildHasherDefault::<rustc_hash::FxHasher>::default().hash_one(key) as usize
                & (SHARD_CACHE - 1)
        };
        match self.shard_cache[slot] {
            Some((k, inside)) if k == *key => inside,
            _ => {
                let inside = shard.contains(key);
                self.shard_cache[slot] = Some((*key, inside));
                inside
            }
        }
    }

    /// Tracks every connection with a full `Conn` from its first packet, as before compact
    /// half-open entries existed (for tests comparing the two: the records are the same).
    #[doc(hidden)]
    pub fn without_half_open(mut self) -> Analyzer {
        self.no_half = true;
        self
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub fn stats(&self) -> &AnalyzerStats {
        &self.stats
    }

    /// Connections currently tracked.
    pub fn open_connections(&self) -> usize {
        self.table.len() + self.half.len()
    }

    /// Counts a frame that never reached the analyzer (e.g. unreadable), by reason.
    pub fn count_skipped(&mut self, reason: &'static str, n: u64) {
        self.stats.frames += n;
        *self.stats.skipped.entry(reason).or_default() += n;
    }

    /// Decodes one captured frame and handles it. `frame_no` numbers the frames of the whole
    /// input (1-based, in time order); a connection's id is the number of its first frame.
    pub fn handle_frame(
        &mut self,
        frame_no: u64,
        t: Timestamp,
        link: LinkType,
        data: &[u8],
    ) -> Result<(), DecodeError> {
        match decode(link, data) {
            Ok(seg) => {
                self.handle_segment(frame_no, t, &seg);
                Ok(())
            }
            Err(e) => {
                self.handle_undecodable(t, e);
                Err(e)
            }
        }
    }

    /// A frame captured at `t` that did not decode to a TCP segment (decoded elsewhere, e.g.
    /// on a reading thread): counted by reason, and it moves the clock like any frame.
    pub fn handle_undecodable(&mut self, t: Timestamp, e: DecodeError) {
        self.count_skipped(e.as_str(), 1);
        self.advance(t);
    }

    fn advance(&mut self, t: Timestamp) {
        if t < self.now {
            let back = self.now.nanos_since(t);
            self.stats.time_backwards += 1;
            self.stats.max_backwards_ns = self.stats.max_backwards_ns.max(back);
            if back <= self.cfg.idle_timeout_ns {
                return;
            }
            // A step back longer than the idle timeout is no reordering: the time before it was
            // wrong (one frame stamped years ahead, say). Capture time goes on from this frame,
            // or no connection would be closed for idleness again and the table would grow
            // with the trace. Connections stamped in that future wait for the end or eviction.
            self.last_sweep = t;
        }
        self.now = t;
        let interval = (self.cfg.linger_ns.min(self.cfg.idle_timeout_ns) / 4).max(1);
        if self.now.nanos_since(self.last_sweep) >= interval {
            self.last_sweep = self.now;
            self.sweep();
        }
    }

    /// Closes connections that have been idle past their timeout.
    fn sweep(&mut self) {
        let now = self.now;
        let (idle, linger) = (self.cfg.idle_timeout_ns, self.cfg.linger_ns);
        let mut closed: Vec<Closing> = self
            .table
            .extract_if(|_, c| {
                let quiet = now.nanos_since(c.t_last);
                quiet >= idle || (c.terminated() && quiet >= linger)
            })
            .map(|(_, c)| Closing::Full(c))
            .collect();
        // a half-open connection has not terminated
        closed.extend(
            self.half
                .extract_if(|_, h| now.nanos_since(h.t_last()) >= idle)
                .map(|(k, h)| Closing::Half(k, h, false)),
        );
        closed.sort_by_key(Closing::id);
        for c in closed {
            if !c.terminated() {
                self.stats.idle_closed += 1;
            }
            self.out.push_back(c);
        }
    }

    pub fn handle_segment(&mut self, frame_no: u64, t: Timestamp, seg: &TcpSegment) {
        self.stats.frames += 1;
        // Every frame moves the clock, in other shards' connections too: the idle sweeps then
        // run at the same moments as in an unsharded run, so the records are the same.
        self.advance(t);
        let (key, swapped) = seg.flow_key().canonical();
        if self.cfg.shard.is_some()
            && !self.table.contains_key(&key)
            && !self.half.contains_key(&key)
            && !self.in_shard(&key)
        {
            self.stats.other_shard_segments += 1;
            return;
        }
        self.stats.tcp_segments += 1;
        let side = Dir::of_swapped(swapped);
        let old = if let Some(c) = self.table.get_mut(&key) {
            if !c.is_reuse(side, seg) {
                c.handle(&self.cfg, side, t, seg);
                return;
            }
            self.table.remove(&key)
        } else if let Some(mut h) = self.half.remove(&key) {
            // (taken out first: one lookup when it needs a full connection, the common case)
            if h.absorb(side, t, seg) {
                self.half.insert(key, h);
                return;
            }
            // the first packet that needs a full connection
            let mut c = h.promote(&self.cfg, key);
            if !c.is_reuse(side, seg) {
                c.handle(&self.cfg, side, t, seg);
                self.table.insert(key, c);
                return;
            }
            Some(c)
        } else {
            None
        };
        if let Some(old) = old {
            self.stats.port_reuse += 1;
            self.out.push_back(Closing::Full(old));
        }
        if self.open_connections() >= self.cfg.max_connections {
            self.evict();
        }
        self.stats.connections += 1;
        match HalfOpen::new(frame_no, side, t, seg).filter(|_| !self.no_half) {
            Some(h) => {
                self.half_opened += 1;
                self.half.insert(key, h);
            }
            None => {
                let mut c = Box::new(Conn::new(frame_no, key, t));
                c.handle(&self.cfg, side, t, seg);
                self.table.insert(key, c);
            }
        }
        self.stats.peak_connections = self
            .stats
            .peak_connections
            .max(self.open_connections() as u64);
    }

    /// Makes room in a full table: closes a tenth of the connections (at least one), those
    /// already terminated first (they only linger for late packets), then the longest idle.
    /// Only a connection that had not terminated is flagged `evicted`: it may have gone on.
    fn evict(&mut self) {
        // (open, last packet, id) orders the connections (ids are unique); the keys are not
        // copied: with millions of entries that would be a second table
        let mut order: Vec<(bool, Timestamp, u64)> = self
            .table
            .values()
            .map(|c| (!c.terminated(), c.t_last, c.id))
            .chain(self.half.values().map(|h| (true, h.t_last(), h.id)))
            .collect();
        if order.is_empty() {
            return;
        }
        let k = (order.len() / 10).max(1);
        let last = *order.select_nth_unstable(k - 1).1;
        drop(order);
        let mut gone: Vec<Closing> = self
            .table
            .extract_if(|_, c| (!c.terminated(), c.t_last, c.id) <= last)
            .map(|(_, mut c)| {
                c.evicted = !c.terminated();
                Closing::Full(c)
            })
            .collect();
        gone.extend(
            self.half
                .extract_if(|_, h| (true, h.t_last(), h.id) <= last)
                .map(|(k, h)| Closing::Half(k, h, true)),
        );
        gone.sort_unstable_by_key(Closing::id);
        self.stats.evicted += gone.len() as u64;
        self.out.extend(gone);
    }

    /// The record of a closed connection; counts what its bounds dropped.
    fn emit(&mut self, c: Closing) -> ConnectionRecord {
        let c = match c {
            Closing::Full(c) => c,
            Closing::Half(k, h, evicted) => {
                let mut c = h.promote(&self.cfg, k);
                c.evicted = evicted;
                c
            }
        };
        self.stats.duplicate_frames += c.dup_frames();
        for (name, n) in ["segments", "samples", "exchanges", "sequence_ranges"]
            .into_iter()
            .zip(c.dropped())
        {
            if n > 0 {
                *self.stats.limit_drops.entry(name).or_default() += n;
            }
        }
        c.to_record(&self.cfg)
    }

    /// The next finished connection, if any. (The counters of duplicated frames and of limit
    /// drops include a connection once its record has been polled.)
    pub fn poll_record(&mut self) -> Option<ConnectionRecord> {
        let c = self.out.pop_front()?;
        Some(self.emit(c))
    }

    /// End of input: closes every connection still open.
    pub fn finish(&mut self) {
        let mut rest: Vec<Closing> = self.table.drain().map(|(_, c)| Closing::Full(c)).collect();
        rest.extend(self.half.drain().map(|(k, h)| Closing::Half(k, h, false)));
        // the tables' memory goes back before the records are built
        self.table = FlowMap::default();
        self.half = FlowMap::default();
        rest.sort_unstable_by_key(Closing::id);
        self.out.extend(rest);
    }
}

/// A connection leaving the table (a half-open one with whether it was evicted).
enum Closing {
    Full(Box<Conn>),
    Half(FlowKey, HalfOpen, bool),
}

impl Closing {
    fn id(&self) -> u64 {
        match self {
            Closing::Full(c) => c.id,
            Closing::Half(_, h, _) => h.id,
        }
    }

    fn terminated(&self) -> bool {
        match self {
            Closing::Full(c) => c.terminated(),
            Closing::Half(..) => false,
        }
    }
}
