//! The I/O around the analyzer: read trace files (several merged in time order), feed the
//! frames to one analyzer (or, with `threads > 1`, to analyzer shards by flow), and write the
//! records to the database atomically.

use std::collections::{BTreeMap, BinaryHeap};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mimic_core::db::DbError;
use mimic_core::packet::{decode, DecodeError, LinkType, TcpSegment};
use mimic_core::trace::{TraceError, TraceReader};
use mimic_core::Timestamp;
use serde::Serialize;

use crate::analyzer::{Analyzer, AnalyzerStats};
use crate::config::Config;
use crate::filter::{CaptureFilter, FilterError};
use crate::record::{ConnectionRecord, PruneReason};
use crate::store::{Output, OutputError, OutputFormat};

#[derive(Debug, thiserror::Error)]
pub enum AnalyzeError {
    #[error("no input files")]
    NoInputs,
    #[error(transparent)]
    Trace(#[from] TraceError),
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Output(#[from] OutputError),
    #[error("interrupted: nothing was written")]
    Interrupted,
    #[error("standard input (`-`) can be read only once")]
    StdinTwice,
    #[error(transparent)]
    Filter(#[from] FilterError),
    /// Every input ended in an error before its first frame: there is nothing to analyze.
    #[error("{0}; no frame could be read, so nothing was written")]
    NoFrames(String),
    /// Frames were read, and not one of them could be decoded (every one of a link type mimic
    /// does not decode, or of a pcapng interface never described): nothing was analyzed.
    #[error("{0}: none of the {1} frames read could be decoded ({2}); nothing was written")]
    NothingDecodable(String, u64, String),
}

/// A run that read frames and could decode none of them (a capture of a link type mimic does
/// not decode, such as PPP): an error, not an empty result. A run whose frames decoded but
/// carried no TCP (only UDP, say) is analyzed as such.
/// (`rejected`: frames the capture filter turned away, which decoded, or were of a link type
/// it compiled for, and count as read.)
fn undecodable_only(
    stats: &AnalyzerStats,
    rejected: u64,
    labels: &[String],
) -> Result<(), AnalyzeError> {
    let count = |k: &str| stats.skipped.get(k).copied().unwrap_or(0);
    let (link, iface) = (count("unsupported_link_type"), count("unknown_interface"));
    if stats.frames == 0 || stats.tcp_segments > 0 || rejected > 0 || link + iface < stats.frames {
        return Ok(());
    }
    let mut why = Vec::new();
    if link > 0 {
        why.push(format!(
            "{link} of a link type mimic does not decode; it decodes Ethernet, Linux cooked (SLL, SLL2), raw IP, IPv4, IPv6, BSD null/loopback and NFLOG"
        ));
    }
    if iface > 0 {
        why.push(format!(
            "{iface} of a pcapng interface the file never described"
        ));
    }
    Err(AnalyzeError::NothingDecodable(
        labels.join(", "),
        stats.frames,
        why.join("; "),
    ))
}

/// How an input path of `-` (standard input) is named in messages.
pub const STDIN_LABEL: &str = "standard input";

/// Whether an input path means standard input.
pub fn is_stdin(p: &Path) -> bool {
    p.as_os_str() == "-"
}

pub struct RunOptions {
    pub inputs: Vec<PathBuf>,
    pub output: PathBuf,
    pub config: Config,
    /// Analyzer shards; 1 analyzes on the calling thread.
    pub threads: usize,
    /// Incremented with the bytes read from the inputs, for a progress bar.
    pub progress: Option<Arc<AtomicU64>>,
    /// Extra `meta` rows (e.g. the command line).
    pub meta: Vec<(String, String)>,
    /// A BPF capture filter (tcpdump's syntax): only the frames it accepts are analyzed.
    pub filter: Option<String>,
    /// Set (e.g. by SIGINT/SIGTERM) to stop reading: the run then ends with
    /// [`AnalyzeError::Interrupted`] and leaves neither the database nor its temporary file.
    pub cancel: Option<Arc<AtomicBool>>,
}

/// A problem with one input that did not stop the run.
#[derive(Debug, Clone, Serialize)]
pub struct InputIssue {
    pub file: String,
    pub reason: &'static str,
    pub message: String,
    /// Frames read from this input before the problem (0: none could be read); where the
    /// reading went on after it (`resumed`), the frames read from the whole input.
    pub frames_before: u64,
    /// The reader went on after the problem: corrupt records skipped (the message says how
    /// many, where, and where it resumed), or a damaged container (a gzip trailer) whose
    /// content was all read.
    pub resumed: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub output: String,
    pub inputs: Vec<String>,
    pub frames: u64,
    pub tcp_segments: u64,
    /// Frames not analyzed, by reason (decode failures and unreadable records).
    pub skipped: BTreeMap<String, u64>,
    pub connections: u64,
    pub complete: u64,
    /// Connections flagged incomplete, by reason (a connection can have several).
    pub pruned: BTreeMap<String, u64>,
    pub exchanges: u64,
    pub with_bandwidth: u64,
    pub duplicate_frames: u64,
    pub port_reuse: u64,
    pub evicted: u64,
    pub peak_connections: u64,
    /// What per-connection bounds dropped, by table (see `Config`).
    pub limit_drops: BTreeMap<String, u64>,
    /// Frames stamped earlier than a frame before them, and the largest step back in seconds.
    pub time_backwards: u64,
    pub max_time_backwards_s: f64,
    /// Frames analyzed whose sub-second timestamp field was a second or more (carried into the
    /// seconds).
    pub ts_invalid_fraction: u64,
    /// Frames analyzed that carried no timestamp (pcapng Simple Packet Blocks), given the
    /// previous frame's.
    pub ts_missing: u64,
    /// Packets the capturing interface reported dropping (pcapng interface statistics): never
    /// in the input, so not counted as frames.
    pub capture_dropped: u64,
    /// The capture filter (`--filter`), if one was given.
    pub filter: Option<String>,
    /// Frames the capture filter rejected: read, but not analyzed and not counted in `frames`.
    pub filter_rejected: u64,
    pub input_issues: Vec<InputIssue>,
    /// `--shard K/N`: the shard analyzed, as `K/N`.
    pub shard: Option<String>,
    /// With a shard: TCP segments of the other shards' connections (in `frames`, not in
    /// `tcp_segments`).
    pub other_shard_segments: u64,
    pub threads: usize,
    pub elapsed_s: f64,
    pub frames_per_s: f64,
}

/// Total size of the inputs on disk, for a progress bar (standard input counts as 0).
pub fn input_bytes(inputs: &[PathBuf]) -> u64 {
    inputs
        .iter()
        .filter(|p| !is_stdin(p))
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

/// A frame copied out of its reader, for merging several files.
struct Owned {
    ts: Timestamp,
    link: LinkType,
    wire_len: u32,
    data: Vec<u8>,
    src: usize,
}

impl PartialEq for Owned {
    fn eq(&self, o: &Self) -> bool {
        self.ts == o.ts && self.src == o.src
    }
}
impl Eq for Owned {}
impl PartialOrd for Owned {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Owned {
    // min-heap on (time, file index)
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        o.ts.cmp(&self.ts).then(o.src.cmp(&self.src))
    }
}

/// Reads every frame of the inputs in time order (files merged; frames within a file in file
/// order) and hands them to `sink` with their 1-based index.
struct FrameSource {
    readers: Vec<TraceReader>,
    issues: Vec<InputIssue>,
    unreadable: AnalyzerStats,
    progress: Option<Arc<AtomicU64>>,
    last_bytes: Vec<u64>,
    cancel: Option<Arc<AtomicBool>>,
    /// Reading stopped because `cancel` was set.
    interrupted: bool,
    /// Each input's name in messages.
    labels: Vec<String>,
    select: Select,
}

/// The capture filter between the readers and the analysis.
#[derive(Default)]
struct Select {
    filter: Option<CaptureFilter>,
    /// Frames the filter rejected.
    rejected: u64,
    /// What stopped the reading short of the inputs' end (a filter that cannot apply).
    fatal: Option<AnalyzeError>,
}

impl Select {
    /// Whether the filter (if any) accepts a frame of the input named `file`; a rejected
    /// frame is counted, and a filter that cannot apply to the frame's link type is fatal.
    fn accept(&mut self, file: &str, link: LinkType, data: &[u8], wire_len: u32) -> bool {
        let Some(f) = &mut self.filter else {
            return true;
        };
        match f.matches(file, link, data, wire_len) {
            Ok(true) => true,
            Ok(false) => {
                self.rejected += 1;
                false
            }
            Err(e) => {
                self.fatal = Some(e.into());
                false
            }
        }
    }
}

impl FrameSource {
    fn open(
        inputs: &[PathBuf],
        progress: Option<Arc<AtomicU64>>,
        cancel: Option<Arc<AtomicBool>>,
    ) -> Result<FrameSource, AnalyzeError> {
        let mut readers = Vec::new();
        for p in inputs {
            readers.push(if is_stdin(p) {
                if io::IsTerminal::is_terminal(&io::stdin()) {
                    return Err(AnalyzeError::Trace(TraceError::Io {
                        path: STDIN_LABEL.into(),
                        source: io::Error::other(
                            "is a terminal: pipe a capture into it (tcpdump -w - | mimic analyze -)",
                        ),
                    }));
                }
                let stdin =
                    StdinStream::spawn(cancel.clone()).map_err(|source| TraceError::Io {
                        path: STDIN_LABEL.into(),
                        source,
                    })?;
                TraceReader::from_reader(STDIN_LABEL, Box::new(stdin))?
            } else {
                TraceReader::open(p)?
            });
        }
        let labels = inputs
            .iter()
            .map(|p| {
                if is_stdin(p) {
                    STDIN_LABEL.to_string()
                } else {
                    p.display().to_string()
                }
            })
            .collect();
        Ok(FrameSource::with_readers(readers, labels, progress, cancel))
    }

    /// The frames of `readers` (input `i` named `labels[i]` in messages).
    fn with_readers(
        readers: Vec<TraceReader>,
        labels: Vec<String>,
        progress: Option<Arc<AtomicU64>>,
        cancel: Option<Arc<AtomicBool>>,
    ) -> FrameSource {
        let n = readers.len();
        FrameSource {
            readers,
            issues: Vec::new(),
            unreadable: AnalyzerStats::default(),
            progress,
            last_bytes: vec![0; n],
            cancel,
            interrupted: false,
            labels,
            select: Select::default(),
        }
    }

    /// Records read from input `i` so far, frames the reader skipped included.
    fn records_read(&self, i: usize) -> u64 {
        let s = &self.readers[i].stats;
        s.frames + s.ts_out_of_range + s.unknown_interface
    }

    /// Whether the run was asked to stop (checked with the progress, every 4096 frames).
    fn cancelled(&mut self) -> bool {
        self.interrupted |= self
            .cancel
            .as_ref()
            .is_some_and(|c| c.load(Ordering::Relaxed));
        self.interrupted
    }

    fn report_progress(&mut self, i: usize) {
        if let Some(p) = &self.progress {
            let now = self.readers[i].bytes_read_counter().load(Ordering::Relaxed);
            p.fetch_add(now - self.last_bytes[i], Ordering::Relaxed);
            self.last_bytes[i] = now;
        }
    }

    fn note_error(&mut self, i: usize, e: TraceError) {
        if self.cancelled() {
            // standard input ends where an interrupt stopped it: not a problem of the input
            return;
        }
        // corrupt records the reader skipped, going on after them, come as one report at the
        // end of the input (it names the first, counts the others)
        let skipped = self.readers[i].stats.corrupt_records;
        let skips = matches!(e, TraceError::Corrupt { .. }) && skipped > 0;
        // an error that ended the reading after the skips: counted too, and not "went on"
        let fatal = self.readers[i].ended_early_after_skips().filter(|_| skips);
        let resumed = skips && fatal.is_none();
        *self.unreadable.skipped.entry(e.reason()).or_default() += if skips { skipped } else { 1 };
        if let Some(reason) = fatal {
            *self.unreadable.skipped.entry(reason).or_default() += 1;
        }
        self.issues.push(InputIssue {
            file: e.path().display().to_string(),
            reason: e.reason(),
            message: e.to_string(),
            frames_before: self.records_read(i),
            resumed,
        });
    }

    /// What the readers noted of damage they read past without losing a frame (a gzip
    /// member's trailer that does not match its content, bytes after the gzip stream).
    fn note_warnings(&mut self) {
        for i in 0..self.readers.len() {
            let frames = self.records_read(i);
            let path = self.readers[i].path().display().to_string();
            for w in self.readers[i].warnings().to_vec() {
                self.issues.push(InputIssue {
                    file: path.clone(),
                    reason: "damaged_container",
                    message: w,
                    frames_before: frames,
                    resumed: true,
                });
            }
        }
    }

    fn run(&mut self, mut sink: impl FnMut(u64, Timestamp, LinkType, &[u8])) {
        let mut frame_no = 0u64;
        if self.readers.len() == 1 {
            loop {
                let r = &mut self.readers[0];
                match r.next_frame() {
                    Ok(Some(f)) => {
                        frame_no += 1;
                        if self
                            .select
                            .accept(&self.labels[0], f.link, f.data, f.wire_len)
                        {
                            sink(frame_no, f.ts, f.link, f.data);
                        } else if self.select.fatal.is_some() {
                            break;
                        }
                        if frame_no & 0xfff == 0 {
                            self.report_progress(0);
                            if self.cancelled() {
                                break;
                            }
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        self.note_error(0, e);
                        break;
                    }
                }
            }
            self.report_progress(0);
            self.note_warnings();
            return;
        }
        let mut heap = BinaryHeap::new();
        for i in 0..self.readers.len() {
            if let Some(f) = self.pull(i) {
                heap.push(f);
            }
        }
        while let Some(f) = heap.pop() {
            frame_no += 1;
            if self
                .select
                .accept(&self.labels[f.src], f.link, &f.data, f.wire_len)
            {
                sink(frame_no, f.ts, f.link, &f.data);
            } else if self.select.fatal.is_some() {
                break;
            }
            let src = f.src;
            if let Some(next) = self.pull_reuse(src, f.data) {
                heap.push(next);
            }
            if frame_no & 0xfff == 0 {
                self.report_progress(src);
                if self.cancelled() {
                    break;
                }
            }
        }
        for i in 0..self.readers.len() {
            self.report_progress(i);
        }
        self.note_warnings();
    }

    fn pull(&mut self, i: usize) -> Option<Owned> {
        self.pull_reuse(i, Vec::new())
    }

    fn pull_reuse(&mut self, i: usize, mut buf: Vec<u8>) -> Option<Owned> {
        match self.readers[i].next_frame() {
            Ok(Some(f)) => {
                buf.clear();
                buf.extend_from_slice(f.data);
                Some(Owned {
                    ts: f.ts,
                    link: f.link,
                    wire_len: f.wire_len,
                    data: buf,
                    src: i,
                })
            }
            Ok(None) => None,
            Err(e) => {
                self.note_error(i, e);
                None
            }
        }
    }

    /// What the readers noted of frames they still passed on, and the capture's own drops:
    /// (invalid sub-second timestamps, missing timestamps, packets the interface dropped).
    fn reader_notes(&self) -> (u64, u64, u64) {
        self.readers.iter().fold((0, 0, 0), |(f, m, d), r| {
            let s = &r.stats;
            (
                f + s.ts_invalid_fraction,
                m + s.ts_missing,
                d + s.if_dropped,
            )
        })
    }

    /// Frames the readers skipped (out-of-range timestamps, unknown interfaces).
    fn reader_skips(&self) -> BTreeMap<&'static str, u64> {
        let mut m = BTreeMap::new();
        for r in &self.readers {
            let s = &r.stats;
            for (k, v) in [
                ("timestamp_out_of_range", s.ts_out_of_range),
                ("unknown_interface", s.unknown_interface),
            ] {
                if v > 0 {
                    *m.entry(k).or_default() += v;
                }
            }
        }
        m
    }
}

/// Analyzes the inputs into the SQLite database `opts.output`.
pub fn run(opts: &RunOptions) -> Result<Summary, AnalyzeError> {
    run_to(opts, OutputFormat::Sqlite)
}

/// Analyzes the inputs into `opts.output` in `format`: a SQLite database, or (Parquet) the
/// directory of a dataset of which this run writes shard K (`--shard K/N`; 1 unsharded).
pub fn run_to(opts: &RunOptions, format: OutputFormat) -> Result<Summary, AnalyzeError> {
    if opts.inputs.is_empty() {
        return Err(AnalyzeError::NoInputs);
    }
    if opts.inputs.iter().filter(|p| is_stdin(p)).count() > 1 {
        return Err(AnalyzeError::StdinTwice);
    }
    // a mistake in the filter is reported before anything is read
    let filter = opts.filter.as_deref().map(CaptureFilter::new).transpose()?;
    check_output(&opts.output, &opts.inputs, format)?;
    let started = Instant::now();
    let mut source = FrameSource::open(&opts.inputs, opts.progress.clone(), opts.cancel.clone())?;
    source.select.filter = filter;
    let shard = opts.config.shard.map_or((1, 1), |s| (s.index(), s.count()));
    let store = Output::create(&opts.output, format, shard)?;
    // the database is loaded on its own thread while the analysis goes on
    let (tx, rx) = mpsc::sync_channel::<Vec<ConnectionRecord>>(8);
    let writer = std::thread::Builder::new().name("mimic-db".into()).spawn(
        move || -> Result<Output, OutputError> {
            let mut store = store;
            // how long the writer waited for records (it kept up with the analysis) and how
            // long it wrote (RUST_LOG=mimic_analyze=debug prints both)
            let mut idle = Duration::ZERO;
            let t0 = Instant::now();
            loop {
                let batch = match rx.try_recv() {
                    Ok(b) => b,
                    Err(mpsc::TryRecvError::Disconnected) => break,
                    Err(mpsc::TryRecvError::Empty) => {
                        // idle: write what is queued rather than leave it for the end
                        store.flush()?;
                        let w = Instant::now();
                        let next = rx.recv();
                        idle += w.elapsed();
                        match next {
                            Ok(b) => b,
                            Err(_) => break,
                        }
                    }
                };
                for r in batch {
                    store.insert(r)?;
                }
            }
            store.flush()?;
            tracing::debug!(
                writing_s = (t0.elapsed() - idle).as_secs_f64(),
                waiting_for_records_s = idle.as_secs_f64(),
                "writer thread"
            );
            Ok(store)
        },
    );
    let writer = writer.map_err(|e| {
        AnalyzeError::Db(DbError::Io {
            path: opts.output.clone(),
            source: e,
        })
    })?;
    let mut sink = Sink {
        tx,
        batch: Vec::with_capacity(SINK_BATCH),
        totals: Totals::default(),
        blocked: Duration::ZERO,
    };

    let stats = if opts.threads <= 1 {
        // with a core for each of the three busy threads (reading and decoding, the analysis,
        // the writer), reading overlaps the analysis (the connections are still analyzed on
        // one thread); with two, the writer already has the second core, and the hand-over
        // made runs slower (bench/README.md, "Reading on a thread of its own")
        let pipelined = std::thread::available_parallelism().is_ok_and(|n| n.get() >= PIPE_CORES);
        let mode = if pipelined {
            Reading::Pipelined {
                batch: PIPE_BATCH,
                depth: PIPE_DEPTH,
            }
        } else {
            Reading::Inline
        };
        run_single(&mut source, &opts.config, &mut sink, mode)
    } else {
        run_sharded(&mut source, opts, &mut sink)
    };
    tracing::debug!(
        elapsed_s = started.elapsed().as_secs_f64(),
        waiting_for_writer_s = sink.blocked.as_secs_f64(),
        "analysis done"
    );
    let totals = sink.finish();
    let store = match writer.join() {
        Ok(r) => r?,
        Err(_) => {
            return Err(AnalyzeError::Db(DbError::Io {
                path: opts.output.clone(),
                source: std::io::Error::other("database writer failed"),
            }))
        }
    };

    tracing::debug!(elapsed_s = started.elapsed().as_secs_f64(), "writer done");
    if source.cancelled() {
        // the store's temporary file goes with it
        return Err(AnalyzeError::Interrupted);
    }
    if let Some(e) = source.select.fatal.take() {
        return Err(e);
    }
    // every input cut short (or corrupt) before its first frame: an error, not an empty result
    let read: u64 = (0..source.readers.len())
        .map(|i| source.records_read(i))
        .sum();
    if read == 0 && !source.issues.is_empty() {
        let what: Vec<String> = source.issues.iter().map(|i| i.message.clone()).collect();
        return Err(AnalyzeError::NoFrames(what.join("; ")));
    }
    let mut stats = stats;
    stats.merge(&source.unreadable);
    for (k, v) in source.reader_skips() {
        *stats.skipped.entry(k).or_default() += v;
        stats.frames += v;
    }
    undecodable_only(&stats, source.select.rejected, &source.labels)?;
    let (ts_invalid_fraction, ts_missing, capture_dropped) = source.reader_notes();
    let elapsed = started.elapsed().as_secs_f64();
    let summary = Summary {
        output: opts.output.display().to_string(),
        inputs: opts
            .inputs
            .iter()
            .map(|p| p.display().to_string())
            .collect(),
        filter: opts.filter.clone(),
        filter_rejected: source.select.rejected,
        frames: stats.frames,
        tcp_segments: stats.tcp_segments,
        skipped: stats
            .skipped
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect(),
        connections: totals.connections,
        complete: totals.complete,
        pruned: totals
            .pruned
            .iter()
            .map(|(k, v)| (k.as_str().to_string(), *v))
            .collect(),
        exchanges: totals.exchanges,
        with_bandwidth: totals.with_bw,
        duplicate_frames: stats.duplicate_frames,
        port_reuse: stats.port_reuse,
        evicted: stats.evicted,
        peak_connections: stats.peak_connections,
        limit_drops: stats
            .limit_drops
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect(),
        time_backwards: stats.time_backwards,
        max_time_backwards_s: stats.max_backwards_ns as f64 / 1e9,
        ts_invalid_fraction,
        ts_missing,
        capture_dropped,
        input_issues: source.issues.clone(),
        shard: opts.config.shard.map(|s| s.to_string()),
        other_shard_segments: stats.other_shard_segments,
        threads: opts.threads.max(1),
        elapsed_s: elapsed,
        frames_per_s: if elapsed > 0.0 {
            stats.frames as f64 / elapsed
        } else {
            0.0
        },
    };
    let mut store = store;
    write_meta(&mut store, opts, &summary)?;
    store.commit()?;
    // the time includes building the indexes and committing the database
    let mut summary = summary;
    summary.elapsed_s = started.elapsed().as_secs_f64();
    summary.frames_per_s = if summary.elapsed_s > 0.0 {
        summary.frames as f64 / summary.elapsed_s
    } else {
        0.0
    };
    Ok(summary)
}

/// Refuses an output that cannot be written or would replace an input, before any work is
/// done: a database output gets the checks every database output gets
/// ([`mimic_core::db::check_db_output`]: an input under another name, a directory, a device,
/// a capture, a missing directory); a Parquet dataset must be a directory, and no input.
fn check_output(
    output: &Path,
    inputs: &[PathBuf],
    format: OutputFormat,
) -> Result<(), AnalyzeError> {
    let inputs: Vec<&Path> = inputs
        .iter()
        .filter(|p| !is_stdin(p))
        .map(PathBuf::as_path)
        .collect();
    match format {
        OutputFormat::Sqlite => Ok(mimic_core::db::check_db_output(output, &inputs)?),
        OutputFormat::Parquet => {
            let io = |source| {
                AnalyzeError::Db(DbError::Io {
                    path: output.to_path_buf(),
                    source,
                })
            };
            if std::fs::metadata(output).is_ok_and(|m| !m.is_dir()) {
                return Err(io(std::io::Error::other(
                    "exists and is not a directory (Parquet output is a directory)",
                )));
            }
            mimic_core::db::refuse_an_input(output, &inputs)?;
            mimic_core::db::check_output_dir(output).map_err(io)
        }
    }
}

#[derive(Default)]
struct Totals {
    connections: u64,
    complete: u64,
    exchanges: u64,
    with_bw: u64,
    pruned: BTreeMap<PruneReason, u64>,
}

const SINK_BATCH: usize = 256;

/// Counts records and hands them, in batches, to the database writer thread.
struct Sink {
    tx: mpsc::SyncSender<Vec<ConnectionRecord>>,
    batch: Vec<ConnectionRecord>,
    totals: Totals,
    /// Time spent handing batches over while the writer's queue was full.
    blocked: Duration,
}

impl Sink {
    fn push(&mut self, r: ConnectionRecord) {
        let t = &mut self.totals;
        t.connections += 1;
        t.complete += r.complete() as u64;
        t.exchanges += r.exchanges.len() as u64;
        t.with_bw += r.bw_bps.is_some() as u64;
        for p in &r.prune {
            *t.pruned.entry(*p).or_default() += 1;
        }
        self.batch.push(r);
        if self.batch.len() >= SINK_BATCH {
            // a send fails only when the writer stopped on an error, reported at its join
            let full = std::mem::replace(&mut self.batch, Vec::with_capacity(SINK_BATCH));
            if let Err(mpsc::TrySendError::Full(full)) = self.tx.try_send(full) {
                let t = Instant::now();
                let _ = self.tx.send(full);
                self.blocked += t.elapsed();
            }
        }
    }

    fn finish(self) -> Totals {
        if !self.batch.is_empty() {
            let _ = self.tx.send(self.batch);
        }
        self.totals
    }
}

fn write_meta(store: &mut Output, opts: &RunOptions, s: &Summary) -> Result<(), OutputError> {
    let cfg = &opts.config;
    let mut rows: Vec<(String, String)> = vec![
        ("role".into(), "original".into()),
        ("inputs".into(), json(&s.inputs)),
        ("frames".into(), s.frames.to_string()),
        ("tcp_segments".into(), s.tcp_segments.to_string()),
        ("connections".into(), s.connections.to_string()),
        ("complete".into(), s.complete.to_string()),
        ("exchanges".into(), s.exchanges.to_string()),
        ("duplicate_frames".into(), s.duplicate_frames.to_string()),
        ("port_reuse".into(), s.port_reuse.to_string()),
        ("evicted".into(), s.evicted.to_string()),
        ("peak_connections".into(), s.peak_connections.to_string()),
        ("time_backwards".into(), s.time_backwards.to_string()),
        (
            "max_time_backwards_s".into(),
            s.max_time_backwards_s.to_string(),
        ),
        (
            "ts_invalid_fraction".into(),
            s.ts_invalid_fraction.to_string(),
        ),
        ("ts_missing".into(), s.ts_missing.to_string()),
        ("capture_dropped".into(), s.capture_dropped.to_string()),
        ("filter_rejected".into(), s.filter_rejected.to_string()),
        ("server_ports".into(), json(&cfg.server_ports)),
        (
            "server_nets".into(),
            json(
                &cfg.server_nets
                    .iter()
                    .map(|n| format!("{}/{}", n.addr, n.len))
                    .collect::<Vec<_>>(),
            ),
        ),
        (
            "idle_timeout_s".into(),
            (cfg.idle_timeout_ns as f64 / 1e9).to_string(),
        ),
        ("bw_method".into(), format!("{:?}", cfg.bw_method)),
        (
            "bw_unit".into(),
            "IP-layer bits per second (payload plus IP and TCP headers)".into(),
        ),
        ("input_issues".into(), json(&s.input_issues)),
    ];
    for (k, v) in &s.skipped {
        rows.push((format!("skipped.{k}"), v.to_string()));
    }
    for (k, v) in &s.pruned {
        rows.push((format!("pruned.{k}"), v.to_string()));
    }
    for (k, v) in &s.limit_drops {
        rows.push((format!("limit_drops.{k}"), v.to_string()));
    }
    if let Some(f) = &s.filter {
        rows.push(("filter".into(), f.clone()));
    }
    if let Some(shard) = &s.shard {
        rows.push(("shard".into(), shard.clone()));
        rows.push(("shard_hash".into(), SHARD_HASH.into()));
        rows.push((
            "other_shard_segments".into(),
            s.other_shard_segments.to_string(),
        ));
    }
    rows.extend(opts.meta.iter().cloned());
    for (k, v) in rows {
        store.set_meta(&k, &v)?;
    }
    Ok(())
}

/// meta `shard_hash` of a shard's database: how its connections were chosen (`mimic merge`
/// refuses shards drawn by another rule).
pub const SHARD_HASH: &str =
    "community_id_v1 seed 0: first 8 digest bytes, big-endian, mod N, plus 1";

fn json<T: Serialize + ?Sized>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

/// A decoded segment moved between threads: the header fields and the first payload bytes
/// (all the analyzer reads of a payload).
struct Moved {
    frame_no: u64,
    ts: Timestamp,
    seg: TcpSegment<'static>,
    prefix: [u8; 16],
    prefix_len: u8,
}

impl Moved {
    fn new(frame_no: u64, ts: Timestamp, seg: &TcpSegment) -> Moved {
        let mut prefix = [0u8; 16];
        let k = seg.payload.len().min(16);
        prefix[..k].copy_from_slice(&seg.payload[..k]);
        Moved {
            frame_no,
            ts,
            seg: seg.without_payload(),
            prefix,
            prefix_len: k as u8,
        }
    }

    /// Hands the segment, its payload's first bytes restored, to `an`.
    fn handle(&self, an: &mut Analyzer) {
        let seg = TcpSegment {
            payload: &self.prefix[..self.prefix_len as usize],
            ..self.seg
        };
        an.handle_segment(self.frame_no, self.ts, &seg);
    }
}

/// A frame as the reading thread hands it to the analysis thread (`--threads 1` on
/// `PIPE_CORES` cores or more).
enum Decoded {
    Segment(Moved),
    /// A frame that is no TCP segment: counted by reason, and it moves the analyzer's clock.
    Undecodable(Timestamp, DecodeError),
}

/// How `--threads 1` reads its frames.
#[derive(Copy, Clone, Debug)]
enum Reading {
    /// Read, decode and analyze each frame in turn on the calling thread.
    Inline,
    /// Read and decode on the calling thread, analyze on a thread of its own: `batch` decoded
    /// frames per hand-over, at most `depth` batches waiting (the batches' buffers circulate
    /// between the two threads, so nothing is allocated per frame or per batch).
    Pipelined { batch: usize, depth: usize },
}

/// Decoded frames per hand-over from the reading thread to the analysis thread (about
/// 200 kB: a batch stays in the second level cache between the two).
const PIPE_BATCH: usize = 1024;
/// Batches the reading thread may be ahead of the analysis.
const PIPE_DEPTH: usize = 4;
/// Cores from which `--threads 1` reads on a thread of its own.
const PIPE_CORES: usize = 3;

/// `--threads 1`: one analyzer takes every frame in order and hands its records to `sink`;
/// the connections are analyzed on one thread either way, and the records are the same
/// (`tests::pipelined_reading_changes_no_record`).
fn run_single(
    source: &mut FrameSource,
    cfg: &Config,
    sink: &mut Sink,
    reading: Reading,
) -> AnalyzerStats {
    let mut an = Analyzer::new(cfg.clone());
    match reading {
        Reading::Inline => source.run(|no, ts, link, data| {
            let _ = an.handle_frame(no, ts, link, data);
            while let Some(r) = an.poll_record() {
                sink.push(r);
            }
        }),
        Reading::Pipelined { batch, depth } => {
            if !pipeline(source, &mut an, sink, batch, depth) {
                return run_single(source, cfg, sink, Reading::Inline);
            }
        }
    }
    // an interrupted run writes nothing: the connections still open are not closed out
    if !source.interrupted {
        an.finish();
    }
    while let Some(r) = an.poll_record() {
        sink.push(r);
    }
    an.stats().clone()
}

/// Reads and decodes the frames on this thread while `an` analyzes them on another, in
/// batches of `batch` through a queue of `depth`. False (nothing read) when no thread could
/// be started.
fn pipeline(
    source: &mut FrameSource,
    an: &mut Analyzer,
    sink: &mut Sink,
    batch: usize,
    depth: usize,
) -> bool {
    let batch = batch.max(1);
    let (full_tx, full_rx) = mpsc::sync_channel::<Vec<Decoded>>(depth);
    // empty buffers go back to the reader: `depth` queued, one being analyzed, one filled
    let (free_tx, free_rx) = mpsc::sync_channel::<Vec<Decoded>>(depth + 2);
    for _ in 0..depth + 2 {
        let _ = free_tx.send(Vec::with_capacity(batch));
    }
    std::thread::scope(|scope| {
        let analysis = std::thread::Builder::new()
            .name("mimic-analysis".into())
            .spawn_scoped(scope, move || {
                let mut idle = Duration::ZERO;
                loop {
                    let w = Instant::now();
                    let Ok(mut frames) = full_rx.recv() else {
                        break;
                    };
                    idle += w.elapsed();
                    // read in place (a frame is ~200 bytes: not moved out again)
                    for d in &frames {
                        match d {
                            Decoded::Segment(m) => m.handle(an),
                            Decoded::Undecodable(ts, e) => an.handle_undecodable(*ts, *e),
                        }
                        while let Some(r) = an.poll_record() {
                            sink.push(r);
                        }
                    }
                    frames.clear();
                    // the reader has gone when this fails: nothing more will come
                    let _ = free_tx.send(frames);
                }
                tracing::debug!(waiting_for_frames_s = idle.as_secs_f64(), "analysis thread");
            });
        let analysis = match analysis {
            Ok(h) => h,
            Err(e) => {
                // no thread to be had: the caller reads inline, as on one core
                tracing::debug!(error = %e, "no analysis thread; reading inline");
                return false;
            }
        };
        let mut waited = Duration::ZERO;
        let mut take_free = || {
            let w = Instant::now();
            // fails only when the analysis thread has ended (a panic, raised at its join)
            let b = free_rx.recv().unwrap_or_default();
            waited += w.elapsed();
            b
        };
        let mut frames = take_free();
        frames.reserve(batch);
        source.run(|no, ts, link, data| {
            frames.push(match decode(link, data) {
                Ok(seg) => Decoded::Segment(Moved::new(no, ts, &seg)),
                Err(e) => Decoded::Undecodable(ts, e),
            });
            if frames.len() >= batch {
                let next = take_free();
                let _ = full_tx.send(std::mem::replace(&mut frames, next));
            }
        });
        if !frames.is_empty() {
            let _ = full_tx.send(frames);
        }
        drop(full_tx);
        tracing::debug!(
            waiting_for_analysis_s = waited.as_secs_f64(),
            "reading thread"
        );
        if let Err(panic) = analysis.join() {
            std::panic::resume_unwind(panic);
        }
        true
    })
}

const BATCH: usize = 1024;

/// `--threads N`: this thread reads and decodes; N analyzer shards each own the connections
/// whose direction-free flow hash falls to them; records come back here to be written.
fn run_sharded(source: &mut FrameSource, opts: &RunOptions, sink: &mut Sink) -> AnalyzerStats {
    let n = opts.threads;
    let (rec_tx, rec_rx) = mpsc::sync_channel::<Vec<ConnectionRecord>>(64);
    let mut txs = Vec::new();
    let mut handles = Vec::new();
    for _ in 0..n {
        let (tx, rx) = mpsc::sync_channel::<Vec<Moved>>(16);
        txs.push(tx);
        let rec_tx = rec_tx.clone();
        let cfg = opts.config.clone();
        handles.push(std::thread::spawn(move || {
            let mut an = Analyzer::new(cfg);
            let mut out = Vec::new();
            for batch in rx {
                for m in batch {
                    m.handle(&mut an);
                    while let Some(r) = an.poll_record() {
                        out.push(r);
                    }
                }
                if out.len() >= 64 {
                    let _ = rec_tx.send(std::mem::take(&mut out));
                }
            }
            an.finish();
            while let Some(r) = an.poll_record() {
                out.push(r);
            }
            let _ = rec_tx.send(out);
            an.stats().clone()
        }));
    }
    drop(rec_tx);

    let mut reader_stats = AnalyzerStats::default();
    let mut batches: Vec<Vec<Moved>> = (0..n).map(|_| Vec::with_capacity(BATCH)).collect();
    {
        let drain = |sink: &mut Sink| {
            while let Ok(recs) = rec_rx.try_recv() {
                for r in recs {
                    sink.push(r);
                }
            }
        };
        source.run(|no, ts, link, data| match decode(link, data) {
            Ok(seg) => {
                let shard = (seg.flow_key().symmetric_hash() % n as u64) as usize;
                batches[shard].push(Moved::new(no, ts, &seg));
                if batches[shard].len() >= BATCH {
                    let full = std::mem::replace(&mut batches[shard], Vec::with_capacity(BATCH));
                    let _ = txs[shard].send(full);
                    drain(sink);
                }
            }
            Err(e) => {
                reader_stats.frames += 1;
                *reader_stats.skipped.entry(e.as_str()).or_default() += 1;
            }
        });
    }
    for (i, b) in batches.into_iter().enumerate() {
        if !b.is_empty() {
            let _ = txs[i].send(b);
        }
    }
    drop(txs);
    // the shards emit their last records once their input channels close
    let mut pending: Vec<ConnectionRecord> = Vec::new();
    for recs in rec_rx {
        pending.extend(recs);
    }
    pending.sort_by_key(|r| r.id);
    for r in pending {
        sink.push(r);
    }
    let mut stats = reader_stats;
    for h in handles {
        if let Ok(s) = h.join() {
            stats.merge(&s);
        }
    }
    stats
}

/// Convenience for tests and tools: analyze one file with default settings into `out`.
pub fn analyze_file(input: &Path, out: &Path) -> Result<Summary, AnalyzeError> {
    run(&RunOptions {
        inputs: vec![input.to_path_buf()],
        output: out.to_path_buf(),
        config: Config::default(),
        threads: 1,
        progress: None,
        meta: Vec::new(),
        filter: None,
        cancel: None,
    })
}

/// Standard input, read on a thread of its own so that an interrupt ends the reading even
/// while no data arrives (a quiet `tcpdump -w - | mimic analyze -`): the stream waits for
/// data in short steps and ends when the run is cancelled.
struct StdinStream {
    rx: mpsc::Receiver<io::Result<Vec<u8>>>,
    buf: Vec<u8>,
    at: usize,
    cancel: Option<Arc<AtomicBool>>,
}

impl StdinStream {
    fn spawn(cancel: Option<Arc<AtomicBool>>) -> io::Result<StdinStream> {
        let (tx, rx) = mpsc::sync_channel::<io::Result<Vec<u8>>>(16);
        std::thread::Builder::new()
            .name("mimic-stdin".into())
            .spawn(move || {
                let mut stdin = io::stdin().lock();
                loop {
                    let mut b = vec![0u8; 1 << 16];
                    let r = match stdin.read(&mut b) {
                        Ok(0) => break,
                        Ok(n) => {
                            b.truncate(n);
                            Ok(b)
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => Err(e),
                    };
                    let failed = r.is_err();
                    if tx.send(r).is_err() || failed {
                        break;
                    }
                }
            })?;
        Ok(StdinStream {
            rx,
            buf: Vec::new(),
            at: 0,
            cancel,
        })
    }
}

impl Read for StdinStream {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.at == self.buf.len() {
            if self
                .cancel
                .as_ref()
                .is_some_and(|c| c.load(Ordering::Relaxed))
            {
                return Ok(0);
            }
            match self.rx.recv_timeout(Duration::from_millis(100)) {
                Ok(Ok(b)) => {
                    self.buf = b;
                    self.at = 0;
                }
                Ok(Err(e)) => return Err(e),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(0),
            }
        }
        let n = out.len().min(self.buf.len() - self.at);
        out[..n].copy_from_slice(&self.buf[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nothing decodable is an error only where every frame read was skipped for its link
    /// type or interface: a frame that decoded, a TCP segment, or a frame the filter turned
    /// away (read, and not counted in `frames`) makes a run an answer.
    #[test]
    fn only_a_run_of_undecodable_frames_is_refused() {
        let stats = |frames: u64, tcp: u64, link: u64, iface: u64| AnalyzerStats {
            frames,
            tcp_segments: tcp,
            skipped: [
                ("unsupported_link_type", link),
                ("unknown_interface", iface),
            ]
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .collect(),
            ..AnalyzerStats::default()
        };
        let inputs = ["a.pcap".to_string(), STDIN_LABEL.to_string()];
        let e = undecodable_only(&stats(8, 0, 5, 3), 0, &inputs).unwrap_err();
        assert_eq!(
            e.to_string(),
            "a.pcap, standard input: none of the 8 frames read could be decoded (5 of a link type \
             mimic does not decode; it decodes Ethernet, Linux cooked (SLL, SLL2), raw IP, IPv4, \
             IPv6, BSD null/loopback and NFLOG; 3 of a pcapng interface the file never \
             described); nothing was written"
        );
        for (s, rejected) in [
            (stats(0, 0, 0, 0), 0),     // nothing read: another check's
            (stats(8, 1, 5, 2), 0),     // one TCP segment
            (stats(8, 0, 5, 2), 0),     // one frame that decoded (UDP, say)
            (stats(3, 0, 0, 3), 1_000), // the filter took the rest
        ] {
            assert!(undecodable_only(&s, rejected, &inputs).is_ok(), "{s:?}");
        }
    }

    /// Records and counters of one capture analyzed by `run_single` in the way `reading`
    /// says.
    fn single(
        bytes: &[u8],
        cfg: &Config,
        reading: Reading,
    ) -> (Vec<ConnectionRecord>, AnalyzerStats) {
        let reader = TraceReader::from_bytes("capture", bytes.to_vec()).expect("a capture");
        let mut source =
            FrameSource::with_readers(vec![reader], vec!["capture".into()], None, None);
        // room for every batch: nothing reads the queue until the run is over
        let (tx, rx) = mpsc::sync_channel(1 << 20);
        let mut sink = Sink {
            tx,
            batch: Vec::new(),
            totals: Totals::default(),
            blocked: Duration::ZERO,
        };
        let stats = run_single(&mut source, cfg, &mut sink, reading);
        sink.finish();
        (rx.into_iter().flatten().collect(), stats)
    }

    /// Reading and decoding on one thread and analyzing on another (`--threads 1` on two or
    /// more cores) writes the same records in the same order, with the same counters, as
    /// doing both on one thread: on every public capture (undecodable frames, clock steps
    /// back and idle sweeps among them), with batches of three and of 64 frames through
    /// queues of one and two (every hand-over exercised), and with a table of 16 connections
    /// (evictions).
    #[test]
    fn pipelined_reading_changes_no_record() {
        let (inputs, corpus) = match crate::tests::public_captures() {
            Some(c) => (c, true),
            None => {
                crate::tests::note_generated("pipelined_reading_changes_no_record");
                (crate::tests::generated_captures(), false)
            }
        };
        let small = Config {
            max_connections: 16,
            idle_timeout_ns: 5_000_000_000,
            linger_ns: 1_000_000_000,
            ..Config::default()
        };
        let (mut conns, mut skipped, mut compared) = (0usize, 0u64, 0usize);
        for (i, bytes) in inputs.iter().enumerate() {
            if TraceReader::from_bytes("capture", bytes.clone()).is_err() {
                continue;
            }
            for cfg in [&Config::default(), &small] {
                let (want, want_stats) = single(bytes, cfg, Reading::Inline);
                for (batch, depth) in [(3, 1), (64, 2)] {
                    let (got, got_stats) = single(bytes, cfg, Reading::Pipelined { batch, depth });
                    assert_eq!(got.len(), want.len(), "capture {i}: number of records");
                    for (x, y) in got.iter().zip(&want) {
                        assert_eq!(
                            format!("{x:?}"),
                            format!("{y:?}"),
                            "capture {i}, connection {}",
                            y.id
                        );
                    }
                    assert_eq!(got_stats, want_stats, "capture {i}: counters");
                }
                conns += want.len();
                skipped += want_stats.skipped.values().sum::<u64>();
            }
            compared += 1;
        }
        eprintln!("{compared} captures, {conns} records, {skipped} undecodable frames compared");
        let (min_conns, min_skipped) = if corpus { (5_000, 1_000) } else { (150, 0) };
        assert!(
            conns > min_conns && skipped >= min_skipped,
            "{conns} records, {skipped} undecodable frames"
        );
    }
}
