//! Running a capture: worker threads (one per source queue) decode, sample, cut and anonymize
//! into batches; one writer thread merges the batches in timestamp order and writes the
//! rotating pcapng files; the calling thread watches the stop conditions (signal flag,
//! `--duration`, `--count`, end of input, a failed write) and reports statistics once per
//! interval.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use mimic_core::{LinkType, Timestamp};

use crate::key::CaptureKey;
use crate::output::{FileCounters, Output, OutputConfig, OutputError};
use crate::pcapng::IfStats;
use crate::process::{Counters, NonTcp, Processor, Settings, Verdict};
use crate::sample::Rule;
use crate::source::{self, Drops, OpenOptions, Poll, Queue, SourceError, SourceSpec};

/// Batches in flight between the workers and the writer (per worker). When the writer falls
/// behind, workers wait and the source's own buffer (kernel ring, NIC descriptors) absorbs
/// the burst, and counts what it could not hold as dropped.
const QUEUE_BATCHES: usize = 64;
const BATCH_BYTES: usize = 256 * 1024;
const BATCH_RECORDS: usize = 2048;
/// The writer flushes its buffer at least this often.
const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// How long a live worker holds a partly filled batch.
const BATCH_AGE: Duration = Duration::from_millis(50);

#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Output(#[from] OutputError),
    #[error("{0}")]
    Other(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    EndOfInput,
    Signal,
    Duration,
    Count,
    DiskFull,
    WriteError,
    SourceError,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::EndOfInput => "end of input",
            StopReason::Signal => "signal",
            StopReason::Duration => "duration reached",
            StopReason::Count => "packet count reached",
            StopReason::DiskFull => "disk full",
            StopReason::WriteError => "write error",
            StopReason::SourceError => "source error",
        }
    }
}

/// Where the per-interval statistics go.
pub struct StatsSink {
    /// Human-readable line on stderr.
    pub text: bool,
    /// One JSON object per line.
    pub json: Option<Box<dyn Write + Send>>,
    pub interval: Duration,
}

pub struct CaptureConfig {
    pub source: SourceSpec,
    pub settings: Settings,
    pub key: CaptureKey,
    /// Where the key came from, for the file comments (never the key itself).
    pub key_origin: String,
    pub dir: PathBuf,
    pub prefix: String,
    pub rotate_bytes: Option<u64>,
    pub rotate_time: Option<Duration>,
    /// Retention ring: keep at most this many files (tcpdump `-W`).
    pub max_files: Option<usize>,
    pub duration: Option<Duration>,
    /// Stop after this many packets were kept.
    pub count: Option<u64>,
    pub workers: usize,
    pub filter: Option<String>,
    pub promisc: bool,
    pub buffer_bytes: usize,
    pub stats: StatsSink,
    /// Set from outside (SIGINT / SIGTERM) to stop the capture cleanly.
    pub stop: Arc<AtomicBool>,
    /// Called once the source is capturing and the first output file is open.
    pub on_ready: Option<Box<dyn FnOnce() + Send>>,
    /// Filled once the capture runs, so another thread (the `/metrics` endpoint) can read the
    /// counters while it does.
    pub probe: Option<Arc<CaptureProbe>>,
}

/// Every counter of a capture at one moment: what the exit summary reports and what
/// `/metrics` exposes, both from [`Shared::totals_now`].
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Totals {
    #[serde(flatten)]
    pub counters: Counters,
    /// Dropped by the kernel / NIC because the capture buffer was full.
    pub kernel_dropped: u64,
    /// Dropped by the interface or driver.
    pub interface_dropped: u64,
    /// Accepted but lost inside mimic (unwritten at a disk-full stop).
    pub capture_dropped: u64,
    /// Packets written to files.
    pub written: u64,
    /// Files closed complete (the ring may have deleted some of them since).
    pub files_closed: u64,
    /// Files closed because they reached the `--rotate` size / time.
    pub files_rotated_size: u64,
    pub files_rotated_time: u64,
    /// Closed files the retention ring (`--ring`) deleted.
    pub files_deleted: u64,
    /// Bytes written to the files (including those of files deleted since).
    pub bytes_written: u64,
}

/// A running capture's counters for other threads.
#[derive(Default)]
pub struct CaptureProbe(OnceLock<Arc<Shared>>);

impl CaptureProbe {
    pub fn new() -> Arc<CaptureProbe> {
        Arc::new(CaptureProbe::default())
    }
    /// The counters now; None before the capture has started.
    pub fn totals(&self) -> Option<Totals> {
        self.0.get().map(|s| s.totals_now())
    }
}

/// Written as `capture-summary.json` ([`crate::spec::write_summary`]) and read back from it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CaptureSummary {
    pub source: String,
    pub stop_reason: StopReason,
    pub elapsed_secs: f64,
    #[serde(flatten)]
    pub totals: Totals,
    /// The closed files still on disk, oldest first.
    pub files: Vec<PathBuf>,
    /// An input error that ended a file source early (frames before it were kept).
    pub input_error: Option<String>,
    /// Corrupt records a file source skipped, the reading going on after them (how many,
    /// where, and what ended the reading if something did after them).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub input_skipped: Option<String>,
    /// The write error that stopped the capture, if any.
    pub output_error: Option<String>,
    /// Per-port counters of a source with several ports (DPDK: received, NIC and kernel
    /// drops, bursts, merge counters).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub ports: Option<serde_json::Value>,
}

impl CaptureSummary {
    /// Every packet the capture point saw that is not in the files, for any reason other
    /// than the sampling and policy the user asked for.
    pub fn lost(&self) -> u64 {
        let t = &self.totals;
        t.kernel_dropped + t.interface_dropped + t.capture_dropped
    }
}

#[derive(Clone, Copy)]
struct Rec {
    ts: Timestamp,
    wire_len: u32,
    link: LinkType,
    off: u32,
    len: u32,
}

struct Batch {
    worker: usize,
    data: Vec<u8>,
    recs: Vec<Rec>,
    /// The worker will send nothing older than this afterwards.
    watermark: i64,
    last: bool,
}

#[derive(Default)]
struct WorkerState {
    counters: Counters,
    drops: Drops,
}

struct Shared {
    workers: Vec<Mutex<WorkerState>>,
    files: Arc<FileCounters>,
    kept_total: AtomicU64,
    written: AtomicU64,
    capture_dropped: AtomicU64,
    global_dropped: AtomicU64,
    first_ts: AtomicI64,
    last_ts: AtomicI64,
    stop: Arc<AtomicBool>,
    stop_reason: Mutex<Option<StopReason>>,
    input_error: Mutex<Option<String>>,
    input_skipped: Mutex<Option<String>>,
    output_error: Mutex<Option<String>>,
}

impl Shared {
    fn stop_with(&self, r: StopReason) {
        let mut g = self.stop_reason.lock().expect("lock");
        if g.is_none() {
            *g = Some(r);
        }
        self.stop.store(true, Ordering::SeqCst);
    }
    fn totals(&self) -> (Counters, Drops) {
        let mut c = Counters::default();
        let mut d = Drops::default();
        for w in &self.workers {
            let g = w.lock().expect("lock");
            c.add(&g.counters);
            d.dropped += g.drops.dropped;
            d.if_dropped += g.drops.if_dropped;
        }
        d.dropped += self.global_dropped.load(Ordering::Relaxed);
        (c, d)
    }
    fn totals_now(&self) -> Totals {
        let (c, d) = self.totals();
        let f = &self.files;
        Totals {
            counters: c,
            kernel_dropped: d.dropped,
            interface_dropped: d.if_dropped,
            capture_dropped: self.capture_dropped.load(Ordering::Relaxed),
            written: self.written.load(Ordering::Relaxed),
            files_closed: FileCounters::get(&f.closed),
            files_rotated_size: FileCounters::get(&f.rotated_size),
            files_rotated_time: FileCounters::get(&f.rotated_time),
            files_deleted: FileCounters::get(&f.deleted),
            bytes_written: FileCounters::get(&f.bytes),
        }
    }
    fn if_stats(&self) -> IfStats {
        let (c, d) = self.totals();
        let first = self.first_ts.load(Ordering::Relaxed);
        let last = self.last_ts.load(Ordering::Relaxed);
        let now = source::now();
        IfStats {
            start: if first == i64::MAX {
                now
            } else {
                Timestamp::from_nanos(first)
            },
            end: if last == i64::MIN {
                now
            } else {
                Timestamp::from_nanos(last)
            },
            received: c.received + d.dropped + d.if_dropped,
            dropped: d.dropped + d.if_dropped,
            accepted: c.kept,
            os_dropped: self.capture_dropped.load(Ordering::Relaxed),
            delivered: self.written.load(Ordering::Relaxed),
        }
    }
}

fn settings_comments(cfg: &CaptureConfig, opened: &source::Opened) -> Vec<String> {
    let s = &cfg.settings;
    let rule = match &s.rule {
        Rule::Keyed => "keyed SipHash-2-4 of the canonical 5-tuple + VLAN stack".to_string(),
        Rule::LastOctet { server_ports } if server_ports.is_empty() => {
            "last octet of the client address (client = higher port)".into()
        }
        Rule::LastOctet { server_ports } => {
            format!("last octet of the client address (server ports {server_ports:?})")
        }
    };
    let json = serde_json::json!({
        "tool": format!("mimic {}", env!("CARGO_PKG_VERSION")),
        "source": cfg.source.to_string(),
        "sampling_rate": s.rate.to_string(),
        "sampling_rule": s.rule.name(),
        "key_fingerprint": cfg.key.fingerprint(),
        "payload_policy": match s.payload { crate::PayloadPolicy::Bytes(k) => serde_json::json!(k), crate::PayloadPolicy::All => serde_json::json!("all") },
        "snaplen": s.source_snaplen(),
        "anonymized": s.anonymize,
        "anonymization": if s.anonymize { "crypto-pan-aes128 ipv4+ipv6, keyed mac pseudonyms, checksums adjusted (rfc1624)" } else { "none" },
        "non_tcp": match s.non_tcp { NonTcp::Drop => "drop", NonTcp::Keep => "keep" },
        "filter": cfg.filter,
        "workers": opened.queues.len(),
        "rotate_bytes": cfg.rotate_bytes,
        "rotate_seconds": cfg.rotate_time.map(|d| d.as_secs_f64()),
        "ring_files": cfg.max_files,
        "timestamps": opened.timestamps.as_deref().unwrap_or(if opened.hw_timestamps { "source" } else { "host clock (kernel receive time)" }),
    });
    vec![
        format!("mimic capture {} — source {} ({})", env!("CARGO_PKG_VERSION"), cfg.source, opened.description),
        format!(
            "sampling: {} of connections, rule: {rule}; both directions of a connection are kept together; key fingerprint {} ({})",
            s.rate,
            cfg.key.fingerprint(),
            cfg.key_origin
        ),
        format!("payload policy: {}; wire lengths preserved; non-TCP frames: {}", s.payload.describe(), match s.non_tcp { NonTcp::Drop => "dropped", NonTcp::Keep => "kept (cut to the transport header)" }),
        if s.anonymize {
            "anonymized: yes — IPv4/IPv6 addresses prefix-preserving (Crypto-PAn, AES-128), MAC addresses keyed pseudonyms; IP/TCP/UDP/ICMPv6 checksums adjusted incrementally (valid stays valid)".to_string()
        } else {
            "anonymized: no (real addresses)".to_string()
        },
        format!("mimic-capture-settings: {json}"),
    ]
}

/// Runs a capture to completion.
pub fn run_capture(mut cfg: CaptureConfig) -> Result<CaptureSummary, CaptureError> {
    let started = Instant::now();
    let start_ts = source::now();
    let opts = OpenOptions {
        workers: cfg.workers.max(1),
        snaplen: cfg.settings.source_snaplen(),
        filter: cfg.filter.clone(),
        promisc: cfg.promisc,
        buffer_bytes: cfg.buffer_bytes,
    };
    let mut opened = source::open(&cfg.source, &opts)?;
    let nworkers = opened.queues.len();
    let shared = Arc::new(Shared {
        workers: (0..nworkers)
            .map(|_| Mutex::new(WorkerState::default()))
            .collect(),
        files: Arc::new(FileCounters::default()),
        kept_total: AtomicU64::new(0),
        written: AtomicU64::new(0),
        capture_dropped: AtomicU64::new(0),
        global_dropped: AtomicU64::new(0),
        first_ts: AtomicI64::new(i64::MAX),
        last_ts: AtomicI64::new(i64::MIN),
        stop: cfg.stop.clone(),
        stop_reason: Mutex::new(None),
        input_error: Mutex::new(None),
        input_skipped: Mutex::new(None),
        output_error: Mutex::new(None),
    });

    let out_cfg = OutputConfig {
        dir: cfg.dir.clone(),
        prefix: cfg.prefix.clone(),
        rotate_bytes: cfg.rotate_bytes,
        rotate_nanos: cfg
            .rotate_time
            .map(|d| d.as_nanos().min(i64::MAX as u128) as i64),
        max_files: cfg.max_files,
        snaplen: cfg.settings.source_snaplen(),
        if_name: opened.if_name.clone(),
        if_description: opened.description.clone(),
        filter: cfg.filter.clone(),
        comments: settings_comments(&cfg, &opened),
        user_appl: format!("mimic {}", env!("CARGO_PKG_VERSION")),
    };
    let sh = shared.clone();
    let provider = Box::new(move || {
        let s = sh.if_stats();
        let (c, _) = sh.totals();
        let comment = format!(
            "counters for the whole capture so far: received {} (seen by mimic), kernel/NIC dropped {}, sampled out {}, non-TCP dropped {}, malformed {}, unanonymizable {}, kept {}, lost in mimic {}",
            c.received, s.dropped, c.sampled_out, c.non_tcp_dropped, c.malformed, c.unanonymizable, c.kept, s.os_dropped
        );
        (s, comment)
    });
    let mut output = Output::new(out_cfg, start_ts, provider)?;
    output.count_into(shared.files.clone());
    if let Some(p) = &cfg.probe {
        let _ = p.0.set(shared.clone());
    }
    if let Some(link) = opened.link {
        output.open_now(link)?;
    }

    // writer
    let (tx, rx) = mpsc::sync_channel::<Batch>(QUEUE_BATCHES * nworkers);
    let (recycle_tx, recycle_rx) = mpsc::channel::<Batch>();
    let recycle_rx = Arc::new(Mutex::new(recycle_rx));
    let sh = shared.clone();
    let writer = thread::Builder::new()
        .name("capture-writer".into())
        .spawn(move || writer_loop(output, rx, recycle_tx, nworkers, sh))
        .map_err(|e| CaptureError::Other(format!("starting the writer thread: {e}")))?;

    // workers
    let mut handles = Vec::new();
    let hw_ts = opened.hw_timestamps;
    for (i, queue) in opened.queues.drain(..).enumerate() {
        let mut proc = Processor::new(cfg.settings.clone(), &cfg.key);
        let tx = tx.clone();
        let recycle = recycle_rx.clone();
        let sh = shared.clone();
        let count = cfg.count;
        let h = thread::Builder::new()
            .name(format!("capture-w{i}"))
            .spawn(move || worker_loop(i, queue, &mut proc, tx, recycle, sh, count, hw_ts))
            .map_err(|e| CaptureError::Other(format!("starting a worker thread: {e}")))?;
        handles.push(h);
    }
    drop(tx);
    if let Some(f) = cfg.on_ready.take() {
        f();
    }

    // watch and report
    let mut global_drops = opened.global_drops.take();
    let mut last_report = Instant::now();
    let mut last_totals = Counters::default();
    let mut last_drop_total = 0u64;
    loop {
        thread::sleep(Duration::from_millis(20));
        let all_done = handles.iter().all(|h| h.is_finished());
        if all_done {
            break;
        }
        if let Some(d) = cfg.duration {
            if started.elapsed() >= d {
                shared.stop_with(StopReason::Duration);
            }
        }
        if cfg.stop.load(Ordering::SeqCst) {
            shared.stop_with(StopReason::Signal);
        }
        if last_report.elapsed() >= cfg.stats.interval {
            let secs = last_report.elapsed().as_secs_f64();
            last_report = Instant::now();
            if let Some(g) = &mut global_drops {
                let (c, _) = shared.totals();
                shared
                    .global_dropped
                    .store(g(c.received), Ordering::Relaxed);
            }
            let (c, d) = shared.totals();
            let drops = d.dropped + d.if_dropped;
            report(
                &mut cfg.stats,
                started.elapsed().as_secs_f64(),
                secs,
                &c,
                &last_totals,
                drops,
                drops - last_drop_total.min(drops),
                &shared,
            );
            last_totals = c;
            last_drop_total = drops;
        }
    }
    for h in handles {
        if h.join().is_err() {
            shared.stop_with(StopReason::SourceError);
            *shared.input_error.lock().expect("lock") = Some("a capture worker panicked".into());
        }
    }
    if let Some(g) = &mut global_drops {
        let (c, _) = shared.totals();
        shared
            .global_dropped
            .store(g(c.received), Ordering::Relaxed);
    }
    let files = match writer.join() {
        Ok((files, err)) => {
            if let Some(e) = err {
                *shared.output_error.lock().expect("lock") = Some(e.to_string());
            }
            files
        }
        Err(_) => return Err(CaptureError::Other("the writer thread panicked".into())),
    };
    let totals = shared.totals_now();
    let (c, d) = (
        totals.counters,
        (totals.kernel_dropped, totals.interface_dropped),
    );
    // the signal handler sets the flag the workers stop on without a reason: a file source
    // stopped that way has not reached its end (the watch loop may have seen the workers
    // finish before the flag)
    let stop_reason =
        shared
            .stop_reason
            .lock()
            .expect("lock")
            .unwrap_or(if cfg.stop.load(Ordering::SeqCst) {
                StopReason::Signal
            } else {
                StopReason::EndOfInput
            });
    let summary = CaptureSummary {
        source: cfg.source.to_string(),
        stop_reason,
        elapsed_secs: started.elapsed().as_secs_f64(),
        totals,
        files,
        input_error: shared.input_error.lock().expect("lock").clone(),
        input_skipped: shared.input_skipped.lock().expect("lock").clone(),
        output_error: shared.output_error.lock().expect("lock").clone(),
        ports: opened.ports_report.as_ref().map(|r| r()),
    };
    let secs = last_report.elapsed().as_secs_f64().max(1e-3);
    let drops = d.0 + d.1;
    report(
        &mut cfg.stats,
        summary.elapsed_secs,
        secs,
        &c,
        &last_totals,
        drops,
        drops - last_drop_total.min(drops),
        &shared,
    );
    Ok(summary)
}

#[allow(clippy::too_many_arguments)]
fn report(
    sink: &mut StatsSink,
    t: f64,
    secs: f64,
    c: &Counters,
    prev: &Counters,
    drops: u64,
    new_drops: u64,
    shared: &Shared,
) {
    let pps = (c.received - prev.received) as f64 / secs;
    let bps = (c.received_bytes - prev.received_bytes) as f64 / secs;
    let kept_ps = (c.kept - prev.kept) as f64 / secs;
    let seen = c.received + drops;
    let drop_share = if seen > 0 {
        drops as f64 / seen as f64
    } else {
        0.0
    };
    let written = shared.written.load(Ordering::Relaxed);
    let lost = shared.capture_dropped.load(Ordering::Relaxed);
    if sink.text {
        eprintln!(
            "mimic capture: {t:7.1}s {pps:9.0} pkt/s {:8.2} MB/s | kept {} ({kept_ps:.0}/s) sampled-out {} non-tcp {} malformed {} | dropped {drops} (+{new_drops}, {:.3}%) lost {lost} | written {written}",
            bps / 1e6,
            c.kept,
            c.sampled_out,
            c.non_tcp_dropped,
            c.malformed + c.unanonymizable,
            drop_share * 100.0
        );
    }
    if let Some(j) = &mut sink.json {
        let v = serde_json::json!({
            "t": t, "pkts_per_s": pps, "bytes_per_s": bps, "kept_per_s": kept_ps,
            "received": c.received, "kept": c.kept, "sampled_out": c.sampled_out,
            "non_tcp_dropped": c.non_tcp_dropped, "malformed": c.malformed, "unanonymizable": c.unanonymizable,
            "dropped": drops, "drop_share": drop_share, "capture_dropped": lost, "written": written,
        });
        let _ = writeln!(j, "{v}");
        let _ = j.flush();
    }
}

#[allow(clippy::too_many_arguments)]
fn worker_loop(
    id: usize,
    mut queue: Box<dyn Queue>,
    proc: &mut Processor,
    tx: SyncSender<Batch>,
    recycle: Arc<Mutex<Receiver<Batch>>>,
    sh: Arc<Shared>,
    count: Option<u64>,
    hw_ts: bool,
) {
    let new_batch = |recycle: &Arc<Mutex<Receiver<Batch>>>| -> Batch {
        if let Ok(mut b) = recycle.lock().expect("lock").try_recv() {
            b.data.clear();
            b.recs.clear();
            b.worker = id;
            b.last = false;
            return b;
        }
        Batch {
            worker: id,
            data: Vec::with_capacity(BATCH_BYTES + 65_536),
            recs: Vec::with_capacity(BATCH_RECORDS),
            watermark: i64::MIN,
            last: false,
        }
    };
    let mut batch = new_batch(&recycle);
    let mut batch_started = Instant::now();
    let mut last_drops = Instant::now();
    let mut last_ts = i64::MIN;
    // set when --count is reached: stop reading at once
    let mut count_reached = false;
    // live sources, once asked to stop, first drain what the kernel already holds
    let mut drain_rounds: Option<u32> = None;
    let mut pending: Vec<Batch> = Vec::new();
    loop {
        if sh.stop.load(Ordering::Relaxed) && drain_rounds.is_none() {
            drain_rounds = Some(0);
        }
        let stop_now = count_reached || (drain_rounds.is_some() && hw_ts);
        let mut full = Vec::new();
        let res = {
            let mut sink = |ts: Timestamp, link: LinkType, wire_len: u32, data: &[u8]| {
                if count_reached {
                    return;
                }
                let off = batch.data.len();
                if let Verdict::Keep(n) = proc.process(link, data, wire_len, &mut batch.data) {
                    if let Some(limit) = count {
                        let prev = sh.kept_total.fetch_add(1, Ordering::SeqCst);
                        if prev >= limit {
                            // another worker took the last slot: as if never received
                            batch.data.truncate(off);
                            proc.counters.kept -= 1;
                            proc.counters.kept_bytes -= n as u64;
                            proc.counters.received -= 1;
                            proc.counters.received_bytes -= wire_len as u64;
                            count_reached = true;
                            sh.stop_with(StopReason::Count);
                            return;
                        }
                        if prev + 1 == limit {
                            count_reached = true;
                            sh.stop_with(StopReason::Count);
                        }
                    }
                    batch.recs.push(Rec {
                        ts,
                        wire_len,
                        link,
                        off: off as u32,
                        len: n as u32,
                    });
                    last_ts = last_ts.max(ts.as_nanos());
                    if batch.data.len() >= BATCH_BYTES || batch.recs.len() >= BATCH_RECORDS {
                        let mut b = std::mem::replace(&mut batch, new_batch(&recycle));
                        b.watermark = last_ts;
                        full.push(b);
                    }
                }
            };
            if stop_now {
                // what a merge buffer still holds goes out before the end
                queue.flush(&mut sink);
                Ok(Poll::End)
            } else {
                queue.poll(&mut sink)
            }
        };
        pending.extend(full);
        let idle = matches!(res, Ok(Poll::Idle));
        let mut ended = match res {
            Ok(Poll::End) => true,
            Ok(_) => false,
            Err(SourceError::Skipped(e)) => {
                *sh.input_skipped.lock().expect("lock") = Some(e.to_string());
                true
            }
            Err(e) => {
                *sh.input_error.lock().expect("lock") = Some(e.to_string());
                if !matches!(e, SourceError::Trace(_)) {
                    sh.stop_with(StopReason::SourceError);
                }
                true
            }
        };
        if let Some(r) = drain_rounds.as_mut() {
            *r += 1;
            if idle || *r > 100 {
                ended = true;
            }
        }
        if last_drops.elapsed() >= Duration::from_millis(500) || ended {
            last_drops = Instant::now();
            let d = queue.drops();
            sh.workers[id].lock().expect("lock").drops = d;
        }
        sh.workers[id].lock().expect("lock").counters = proc.counters;
        if ended || batch_started.elapsed() >= BATCH_AGE {
            // live sources: the kernel hands packets over within its block timeout, so
            // nothing older than (now - 200 ms) can still arrive
            let wm = if hw_ts {
                last_ts
            } else {
                last_ts.max(source::now().as_nanos() - 200_000_000)
            };
            let mut b = std::mem::replace(&mut batch, new_batch(&recycle));
            b.watermark = wm;
            b.last = ended;
            pending.push(b);
            batch_started = Instant::now();
        }
        for b in pending.drain(..) {
            if tx.send(b).is_err() {
                // the writer has stopped (write error): nothing more can be written
                return;
            }
        }
        if ended {
            return;
        }
    }
}

fn writer_loop(
    mut output: Output,
    rx: Receiver<Batch>,
    recycle: mpsc::Sender<Batch>,
    nworkers: usize,
    sh: Arc<Shared>,
) -> (Vec<PathBuf>, Option<OutputError>) {
    let mut queues: Vec<std::collections::VecDeque<(Batch, usize)>> =
        (0..nworkers).map(|_| Default::default()).collect();
    let mut watermark = vec![i64::MIN; nworkers];
    let mut finished = vec![false; nworkers];
    let mut failed: Option<OutputError> = None;
    let mut last_flush = Instant::now();
    let write = |output: &mut Output, b: &Batch, r: &Rec, failed: &mut Option<OutputError>| {
        if failed.is_some() {
            sh.capture_dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let data = &b.data[r.off as usize..(r.off + r.len) as usize];
        match output.write(r.link, r.ts, r.wire_len, data) {
            Ok(()) => {
                let t = r.ts.as_nanos();
                sh.first_ts.fetch_min(t, Ordering::Relaxed);
                sh.last_ts.fetch_max(t, Ordering::Relaxed);
                sh.written
                    .store(output.packets_written(), Ordering::Relaxed);
            }
            Err(e) => {
                // packets buffered in the failed file, this one, and all later ones are lost
                sh.capture_dropped
                    .fetch_add(e.lost() + 1, Ordering::Relaxed);
                *sh.output_error.lock().expect("lock") = Some(e.to_string());
                sh.stop_with(if e.is_disk_full() {
                    StopReason::DiskFull
                } else {
                    StopReason::WriteError
                });
                *failed = Some(e);
            }
        }
    };
    loop {
        let got = rx.recv_timeout(Duration::from_millis(200));
        // Buffered packets reach the disk within FLUSH_EVERY even while a live source keeps
        // sending small batches (so `written` is what is on disk, and a crash loses little).
        let idle = matches!(got, Err(RecvTimeoutError::Timeout));
        if (idle || last_flush.elapsed() >= FLUSH_EVERY) && failed.is_none() {
            last_flush = Instant::now();
            if let Err(e) = output.flush() {
                sh.capture_dropped.fetch_add(e.lost(), Ordering::Relaxed);
                *sh.output_error.lock().expect("lock") = Some(e.to_string());
                sh.stop_with(if e.is_disk_full() {
                    StopReason::DiskFull
                } else {
                    StopReason::WriteError
                });
                failed = Some(e);
            }
            sh.written
                .store(output.packets_written(), Ordering::Relaxed);
        }
        match got {
            Ok(b) => {
                let w = b.worker;
                watermark[w] = watermark[w].max(b.watermark);
                if b.last {
                    finished[w] = true;
                }
                if nworkers == 1 {
                    for r in &b.recs {
                        write(&mut output, &b, r, &mut failed);
                    }
                    let _ = recycle.send(b);
                } else if b.recs.is_empty() {
                    let _ = recycle.send(b);
                } else {
                    queues[w].push_back((b, 0));
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                finished.iter_mut().for_each(|f| *f = true);
            }
        }
        if nworkers > 1 {
            // k-way merge: emit the oldest head while no other worker can still send older
            let all_done = finished.iter().all(|&f| f);
            let backlog: usize = queues.iter().map(|q| q.len()).sum();
            loop {
                let mut best: Option<(usize, i64)> = None;
                for (w, q) in queues.iter().enumerate() {
                    if let Some((b, i)) = q.front() {
                        let t = b.recs[*i].ts.as_nanos();
                        if best.is_none_or(|(_, bt)| t < bt) {
                            best = Some((w, t));
                        }
                    }
                }
                let Some((w, t)) = best else { break };
                let safe = all_done
                    || backlog > QUEUE_BATCHES * nworkers
                    || (0..nworkers).all(|o| {
                        o == w || finished[o] || !queues[o].is_empty() || watermark[o] >= t
                    });
                if !safe {
                    break;
                }
                let (b, i) = queues[w].front_mut().expect("head");
                let r = b.recs[*i];
                write(&mut output, b, &r, &mut failed);
                *i += 1;
                if *i >= b.recs.len() {
                    let (b, _) = queues[w].pop_front().expect("head");
                    let _ = recycle.send(b);
                }
            }
            // drop empty batches at the heads
            for q in queues.iter_mut() {
                while q.front().is_some_and(|(b, i)| *i >= b.recs.len()) {
                    let (b, _) = q.pop_front().expect("head");
                    let _ = recycle.send(b);
                }
            }
        }
        if finished.iter().all(|&f| f) && queues.iter().all(|q| q.is_empty()) {
            // drain anything still queued (after a disconnect)
            while let Ok(b) = rx.try_recv() {
                for r in &b.recs {
                    write(&mut output, &b, r, &mut failed);
                }
            }
            break;
        }
    }
    let closed = output.close();
    sh.written
        .store(output.packets_written(), Ordering::Relaxed);
    let files = output.closed_files();
    match closed {
        Ok(()) => (files, failed),
        Err(e) => (files, Some(failed.unwrap_or(e))),
    }
}

/// A stop flag set by SIGINT or SIGTERM (a second SIGINT exits at once with status 130).
pub fn stop_on_signals() -> std::io::Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register_conditional_shutdown(
        signal_hook::consts::SIGINT,
        130,
        stop.clone(),
    )?;
    signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone())?;
    signal_hook::flag::register(signal_hook::consts::SIGTERM, stop.clone())?;
    Ok(stop)
}

/// Parses a size such as `1GiB`, `500MB`, `64k` or `1000000` (bytes).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num.parse().map_err(|_| {
        format!("size {s:?}: expected a number with an optional unit (k, M, G, KiB, MiB, GiB, B)")
    })?;
    let mult: f64 = match unit.trim() {
        "" | "B" | "b" => 1.0,
        "k" | "K" | "KB" | "kB" => 1e3,
        "M" | "MB" => 1e6,
        "G" | "GB" => 1e9,
        "T" | "TB" => 1e12,
        "KiB" | "Ki" => 1024.0,
        "MiB" | "Mi" => 1024.0 * 1024.0,
        "GiB" | "Gi" => 1024.0 * 1024.0 * 1024.0,
        "TiB" | "Ti" => 1024.0f64.powi(4),
        u => {
            return Err(format!(
                "size {s:?}: unknown unit {u:?} (use k, M, G, KiB, MiB, GiB)"
            ))
        }
    };
    let b = v * mult;
    if !b.is_finite() || b < 1.0 {
        return Err(format!("size {s:?} must be at least one byte"));
    }
    Ok(b as u64)
}

/// Parses a duration such as `10m`, `30s`, `1h`, `250ms` or `1.5` (seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("duration {s:?}: expected a number with a unit (ms, s, m, h, d)"))?;
    let secs = v * match unit.trim() {
        "" | "s" | "sec" => 1.0,
        "ms" => 1e-3,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        "d" => 86_400.0,
        u => {
            return Err(format!(
                "duration {s:?}: unknown unit {u:?} (use ms, s, m, h, d)"
            ))
        }
    };
    if !secs.is_finite() || secs <= 0.0 {
        return Err(format!("duration {s:?} must be positive"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// A `--rotate` value: a size or a time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rotate {
    Size(u64),
    Time(Duration),
}

pub fn parse_rotate(s: &str) -> Result<Rotate, String> {
    let unit: String = s
        .trim()
        .chars()
        .skip_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    match unit.trim() {
        "ms" | "s" | "sec" | "m" | "min" | "h" | "d" => parse_duration(s).map(Rotate::Time),
        "" => Err(format!(
            "--rotate {s:?}: give a unit, a size (100MB, 1GiB) or a time (10m, 1h)"
        )),
        _ => parse_size(s).map(Rotate::Size),
    }
}

#[cfg(test)]
mod parse_tests {
    use super::*;

    #[test]
    fn sizes_times_rotate() {
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("500MB").unwrap(), 500_000_000);
        assert_eq!(parse_size("64k").unwrap(), 64_000);
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("0").is_err());
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert!(parse_duration("-1s").is_err());
        assert_eq!(parse_rotate("1GiB").unwrap(), Rotate::Size(1 << 30));
        assert_eq!(
            parse_rotate("10m").unwrap(),
            Rotate::Time(Duration::from_secs(600))
        );
        assert!(parse_rotate("10").is_err());
    }
}
