//! The connection table: frames in (with their capture time), connection records out.
//!
//! Sans-I/O: the analyzer never reads a clock or a file. Time only moves with the frames it
//! is given, which drive idle timeouts; `finish` closes what is left at the end of the input.

use std::collections::{BTreeMap, VecDeque};

use mimic_core::packet::{decode, DecodeError, LinkType};
use mimic_core::{FlowKey, TcpSegment, Timestamp};
use rustc_hash::FxHashMap;
use serde::Serialize;

use crate::config::Config;
use crate::conn::Conn;
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
    }
}

pub struct Analyzer {
    cfg: Config,
    table: FxHashMap<FlowKey, Box<Conn>>,
    out: VecDeque<ConnectionRecord>,
    stats: AnalyzerStats,
    now: Timestamp,
    last_sweep: Timestamp,
}

impl Analyzer {
    pub fn new(cfg: Config) -> Analyzer {
        Analyzer {
            cfg,
            table: FxHashMap::default(),
            out: VecDeque::new(),
            stats: AnalyzerStats::default(),
            now: Timestamp::from_nanos(i64::MIN),
            last_sweep: Timestamp::from_nanos(i64::MIN),
        }
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub fn stats(&self) -> &AnalyzerStats {
        &self.stats
    }

    /// Connections currently tracked.
    pub fn open_connections(&self) -> usize {
        self.table.len()
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
                self.count_skipped(e.as_str(), 1);
                self.advance(t);
                Err(e)
            }
        }
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
        let mut closed: Vec<Box<Conn>> = self
            .table
            .extract_if(|_, c| {
                let quiet = now.nanos_since(c.t_last);
                quiet >= idle || (c.terminated() && quiet >= linger)
            })
            .map(|(_, c)| c)
            .collect();
        closed.sort_by_key(|c| c.id);
        for c in closed {
            if !c.terminated() {
                self.stats.idle_closed += 1;
            }
            self.emit(c);
        }
    }

    pub fn handle_segment(&mut self, frame_no: u64, t: Timestamp, seg: &TcpSegment) {
        self.stats.frames += 1;
        self.stats.tcp_segments += 1;
        self.advance(t);
        let (key, swapped) = seg.flow_key().canonical();
        let side = swapped as usize;
        if let Some(c) = self.table.get_mut(&key) {
            if !c.is_reuse(side, seg) {
                c.handle(&self.cfg, side, t, seg);
                return;
            }
            let old = self.table.remove(&key).expect("present");
            self.stats.port_reuse += 1;
            self.emit(old);
        }
        if self.table.len() >= self.cfg.max_connections {
            self.evict();
        }
        let mut c = Box::new(Conn::new(frame_no, key, t));
        c.handle(&self.cfg, side, t, seg);
        self.stats.connections += 1;
        self.table.insert(key, c);
        self.stats.peak_connections = self.stats.peak_connections.max(self.table.len() as u64);
    }

    /// Makes room in a full table: closes a tenth of the connections (at least one), those
    /// already terminated first (they only linger for late packets), then the longest idle.
    /// Only a connection that had not terminated is flagged `evicted`: it may have gone on.
    fn evict(&mut self) {
        let mut order: Vec<(bool, Timestamp, u64, FlowKey)> = self
            .table
            .iter()
            .map(|(k, c)| (!c.terminated(), c.t_last, c.id, *k))
            .collect();
        let k = (order.len() / 10).max(1);
        if k < order.len() {
            order.select_nth_unstable_by_key(k - 1, |&(open, t, id, _)| (open, t, id));
        }
        order.truncate(k);
        order.sort_unstable_by_key(|&(_, _, id, _)| id);
        for (open, _, _, key) in order {
            if let Some(mut c) = self.table.remove(&key) {
                c.evicted = open;
                self.stats.evicted += 1;
                self.emit(c);
            }
        }
    }

    fn emit(&mut self, c: Box<Conn>) {
        self.stats.duplicate_frames += c.dup_frames();
        for (name, n) in ["segments", "samples", "exchanges", "sequence_ranges"]
            .into_iter()
            .zip(c.dropped())
        {
            if n > 0 {
                *self.stats.limit_drops.entry(name).or_default() += n;
            }
        }
        self.out.push_back(c.to_record(&self.cfg));
    }

    /// The next finished connection, if any.
    pub fn poll_record(&mut self) -> Option<ConnectionRecord> {
        self.out.pop_front()
    }

    /// End of input: closes every connection still open.
    pub fn finish(&mut self) {
        let mut rest: Vec<Box<Conn>> = self.table.drain().map(|(_, c)| c).collect();
        rest.sort_by_key(|c| c.id);
        for c in rest {
            self.emit(c);
        }
    }
}
