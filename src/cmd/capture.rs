//! `mimic capture --source SRC -o DIR [options]` and `mimic capture keygen FILE`.
//!
//! Output directory layout:
//! * `capture-YYYYmmddTHHMMSSZ-NNNNN.pcapng` — closed, complete files (written as `….part`
//!   and renamed when closed); with `--ring N` only the newest N remain (lowest number =
//!   oldest);
//! * `capture.key` — the key generated when `--key` was not given (mode 0600);
//! * `capture.ready` — written once the source is capturing (callers wait for it);
//! * `capture-summary.json` — the final counters, written when the capture ends.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use mimic_capture::capture::{self, parse_duration, parse_rotate, Rotate, StatsSink};
use mimic_capture::source::SourceSpec;
use mimic_capture::{
    CaptureConfig, CaptureKey, CaptureProbe, NonTcp, PayloadPolicy, Rate, Rule, Settings,
    StopReason, Totals,
};

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Sub>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(clap::Subcommand)]
pub enum Sub {
    /// Make a new secret key file (mode 0600) for sampling and anonymization; refuses to overwrite.
    Keygen {
        /// The key file to create.
        file: PathBuf,
    },
}

#[derive(clap::Args)]
pub struct RunArgs {
    /// Packet source: pcap:FILE (pcap/pcapng/gz), iface:NAME (libpcap live) or dpdk:"EAL ARGS" (build with --features dpdk; every port the EAL is given, e.g. both ports of a tap, merged in time order).
    #[arg(long, value_name = "SRC", required = true, value_parser = parse_source)]
    pub source: Option<SourceSpec>,
    /// Output directory (created if missing).
    #[arg(short, long, value_name = "DIR", required = true)]
    pub output: Option<PathBuf>,
    /// Keep K of every N connections (both directions together), e.g. 1/90.
    #[arg(long, value_name = "K/N", default_value = "1/1", value_parser = parse_rate)]
    pub sample: Rate,
    /// Sampling rule: keyed (SipHash of the 5-tuple) or last-octet (Monkey's: by the client address's last byte).
    #[arg(long, value_name = "RULE", default_value = "keyed", value_parser = ["keyed", "last-octet"])]
    pub sample_rule: String,
    /// A server port, so the last-octet rule knows which end is the client (repeatable).
    #[arg(long = "server-port", value_name = "P")]
    pub server_ports: Vec<u16>,
    /// Secret key file (from `mimic capture keygen`); without it a new key is written to DIR/capture.key.
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// Payload bytes kept per TCP segment after its headers (0 = headers only; `all` = everything).
    #[arg(long, value_name = "K|all", default_value = "0", value_parser = parse_payload)]
    pub payload_bytes: PayloadPolicy,
    /// Keep real addresses (default: prefix-preserving keyed anonymization).
    #[arg(long)]
    pub no_anonymize: bool,
    /// Non-TCP frames: drop (default) or keep (sampled by their own 5-tuple, cut to the transport header).
    #[arg(long, value_name = "POLICY", default_value = "drop", value_parser = ["drop", "keep"])]
    pub non_tcp: String,
    /// BPF filter applied in the kernel (iface: sources only).
    #[arg(long, value_name = "EXPR")]
    pub filter: Option<String>,
    /// Start a new file by size (100MB, 1GiB) or by time (30s, 10m, 1h); may be given once for each.
    #[arg(long, value_name = "SIZE|TIME", value_parser = parse_rotate_arg)]
    pub rotate: Vec<Rotate>,
    /// Retention ring: keep at most N files of this capture (the one being written included),
    /// deleting the oldest when a new one starts (tcpdump -W); needs --rotate.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub ring: Option<u32>,
    /// Serve Prometheus metrics at http://ADDR/metrics while capturing (e.g. 127.0.0.1:9464).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<std::net::SocketAddr>,
    /// Stop after this long (e.g. 30s, 10m).
    #[arg(long, value_name = "TIME", value_parser = parse_duration_arg)]
    pub duration: Option<std::time::Duration>,
    /// Stop after this many packets were kept.
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
    /// Worker threads / receive queues (iface: PACKET_FANOUT by the kernel's symmetric hash;
    /// dpdk: RX queue q of every port per worker, give the PMD as many, e.g. qpairs=N for net_af_packet).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub workers: u16,
    /// Do not put the interface into promiscuous mode.
    #[arg(long)]
    pub no_promisc: bool,
    /// Kernel capture ring per worker (iface: sources).
    #[arg(long, value_name = "SIZE", default_value = "64MiB", value_parser = parse_size_arg)]
    pub buffer: u64,
    /// Also write the per-second statistics as JSON lines to FILE (`-` for stdout).
    #[arg(long, value_name = "FILE")]
    pub stats_json: Option<PathBuf>,
    /// Seconds between statistics lines.
    #[arg(long, value_name = "SECS", default_value_t = 1.0, value_parser = super::positive_number)]
    pub stats_interval: f64,
    /// File name prefix of the pcapng files.
    #[arg(long, value_name = "NAME", default_value = "capture")]
    pub prefix: String,
    /// Exit with status 1 when any packet was lost (kernel/NIC drops or a write failure).
    #[arg(long)]
    pub fail_on_drop: bool,
}

fn parse_source(s: &str) -> Result<SourceSpec, String> {
    s.parse()
}
fn parse_rate(s: &str) -> Result<Rate, String> {
    s.parse()
}
fn parse_payload(s: &str) -> Result<PayloadPolicy, String> {
    if s == "all" {
        return Ok(PayloadPolicy::All);
    }
    s.parse::<u32>()
        .map(PayloadPolicy::Bytes)
        .map_err(|_| format!("{s:?}: expected a byte count or `all`"))
}
fn parse_rotate_arg(s: &str) -> Result<Rotate, String> {
    parse_rotate(s)
}
fn parse_duration_arg(s: &str) -> Result<std::time::Duration, String> {
    parse_duration(s)
}
fn parse_size_arg(s: &str) -> Result<u64, String> {
    capture::parse_size(s)
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    match a.command {
        Some(Sub::Keygen { file }) => keygen(&file),
        None => run_capture(a.run),
    }
}

fn keygen(file: &Path) -> anyhow::Result<ExitCode> {
    let key = CaptureKey::generate().context("reading /dev/urandom")?;
    key.save_new(file)?;
    if !crate::progress::quiet() {
        eprintln!(
            "mimic capture: wrote key {} (fingerprint {}); keep it secret",
            file.display(),
            key.fingerprint()
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn run_capture(a: RunArgs) -> anyhow::Result<ExitCode> {
    // validate everything before touching the system
    let source = a.source.clone().context("--source is required")?;
    let dir = a.output.clone().context("-o DIR is required")?;
    if a.filter.is_some() && !matches!(source, SourceSpec::Iface(_)) {
        anyhow::bail!("--filter applies to iface: sources only");
    }
    let mut rotate_bytes = None;
    let mut rotate_time = None;
    for r in &a.rotate {
        match r {
            Rotate::Size(b) if rotate_bytes.is_none() => rotate_bytes = Some(*b),
            Rotate::Time(t) if rotate_time.is_none() => rotate_time = Some(*t),
            _ => anyhow::bail!("--rotate: give at most one size and one time"),
        }
    }
    if rotate_bytes.is_some_and(|b| b < 4096) {
        anyhow::bail!("--rotate size must be at least 4KiB");
    }
    if a.ring.is_some() && a.rotate.is_empty() {
        anyhow::bail!("--ring needs --rotate SIZE and/or --rotate TIME (with one file there is nothing to delete)");
    }
    if a.count == Some(0) {
        anyhow::bail!("--count must be at least 1");
    }
    if a.prefix.is_empty() || a.prefix.contains('/') {
        anyhow::bail!("--prefix must be a plain file name prefix");
    }
    if let SourceSpec::File(p) = &source {
        if !p.is_file() {
            anyhow::bail!("{}: no such file", p.display());
        }
    }
    let rule = match a.sample_rule.as_str() {
        "last-octet" => Rule::LastOctet {
            server_ports: a.server_ports.clone(),
        },
        _ => Rule::Keyed,
    };
    let settings = Settings {
        rate: a.sample,
        rule,
        payload: a.payload_bytes,
        non_tcp: if a.non_tcp == "keep" {
            NonTcp::Keep
        } else {
            NonTcp::Drop
        },
        anonymize: !a.no_anonymize,
    };
    let key_given = match &a.key {
        Some(p) => Some(CaptureKey::load(p)?),
        None => None,
    };
    // a taken port fails here, before anything is written
    let metrics = a.metrics.map(mimic_metrics::bind).transpose()?;

    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let ready = dir.join("capture.ready");
    let summary_path = dir.join("capture-summary.json");
    for stale in [&ready, &summary_path] {
        match std::fs::remove_file(stale) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing stale {}", stale.display())),
        }
    }
    // Space for the summary, held from the start: a capture that fills its disk still has
    // room to say what it wrote and lost. Released just before the summary is written.
    let reserve = SummaryReserve::create(&dir)?;
    let (key, key_origin) = match key_given {
        Some(k) => (
            k,
            format!("key file {}", a.key.as_ref().expect("given").display()),
        ),
        None => {
            let p = dir.join("capture.key");
            if p.exists() {
                anyhow::bail!(
                    "{} exists from an earlier capture: pass --key {} to reuse it, or remove it",
                    p.display(),
                    p.display()
                );
            }
            let k = CaptureKey::generate().context("reading /dev/urandom")?;
            k.save_new(&p)?;
            (k, "key generated for this capture".to_string())
        }
    };

    let quiet = crate::progress::quiet();
    let json: Option<Box<dyn std::io::Write + Send>> = match &a.stats_json {
        None => None,
        Some(p) if p.as_os_str() == "-" => Some(Box::new(std::io::stdout())),
        Some(p) => Some(Box::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
    };
    let stop = capture::stop_on_signals().context("installing SIGINT/SIGTERM handlers")?;
    let ready_path = ready.clone();
    let src_text = source.to_string();
    let on_ready: Box<dyn FnOnce() + Send> = Box::new(move || {
        let text = format!("pid {}\nsource {src_text}\n", std::process::id());
        if let Err(e) = mimic_core::db::write_atomic(&ready_path, text.as_bytes()) {
            eprintln!(
                "mimic capture: warning: could not write {}: {e}",
                ready_path.display()
            );
        }
        if !quiet {
            eprintln!("mimic capture: ready ({src_text})");
        }
    });
    let probe = CaptureProbe::new();
    if let Some(m) = metrics {
        let p = probe.clone();
        let addr = m.serve(mimic_metrics::registry_with(move |f| {
            if let Some(t) = p.totals() {
                capture_metrics(&t, f);
            }
        }))?;
        if !quiet {
            eprintln!("mimic capture: metrics at http://{addr}/metrics");
        }
    }
    let cfg = CaptureConfig {
        source,
        settings,
        key,
        key_origin,
        dir: dir.clone(),
        prefix: a.prefix.clone(),
        rotate_bytes,
        rotate_time,
        max_files: a.ring.map(|n| n as usize),
        duration: a.duration,
        count: a.count,
        workers: a.workers as usize,
        filter: a.filter.clone(),
        promisc: !a.no_promisc,
        buffer_bytes: a.buffer as usize,
        stats: StatsSink {
            text: !quiet,
            json,
            interval: std::time::Duration::from_secs_f64(a.stats_interval),
        },
        stop: Arc::clone(&stop),
        on_ready: Some(on_ready),
        probe: Some(probe),
    };
    let summary = mimic_capture::run_capture(cfg)?;
    let text = serde_json::to_string_pretty(&summary)? + "\n";
    drop(reserve);
    if let Err(e) = mimic_core::db::write_atomic(&summary_path, text.as_bytes()) {
        eprintln!(
            "mimic capture: warning: could not write {}: {e}",
            summary_path.display()
        );
    }
    if let Some(e) = &summary.input_error {
        eprintln!("mimic capture: warning: input ended early: {e}");
    }
    if !quiet {
        let t = &summary.totals;
        let c = &t.counters;
        let ring = if t.files_deleted > 0 {
            format!(" ({} older deleted by the ring)", t.files_deleted)
        } else {
            String::new()
        };
        eprintln!(
            "mimic capture: stopped ({}) after {:.1}s: received {}, kept {} ({} sampled out, {} non-TCP dropped, {} malformed, {} unanonymizable), kernel/NIC dropped {}, lost in capture {}, written {} to {} file(s){ring} in {}",
            summary.stop_reason.as_str(),
            summary.elapsed_secs,
            c.received,
            c.kept,
            c.sampled_out,
            c.non_tcp_dropped,
            c.malformed,
            c.unanonymizable,
            t.kernel_dropped + t.interface_dropped,
            t.capture_dropped,
            t.written,
            summary.files.len(),
            dir.display()
        );
    }
    match summary.stop_reason {
        StopReason::DiskFull | StopReason::WriteError | StopReason::SourceError => {
            let what = summary
                .output_error
                .clone()
                .or(summary.input_error.clone())
                .unwrap_or_default();
            anyhow::bail!("capture stopped: {what}");
        }
        _ => {}
    }
    if a.fail_on_drop && summary.lost() > 0 {
        eprintln!(
            "mimic capture: {} packets were lost (--fail-on-drop)",
            summary.lost()
        );
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// The `/metrics` families of a capture, from the same totals the summary reports.
fn capture_metrics(t: &Totals, f: &mut mimic_metrics::Families) {
    use mimic_metrics::Unit;
    let c = &t.counters;
    f.counter(
        "mimic_capture_received_packets",
        "Packets mimic received from the source (kernel/NIC drops not included).",
        None,
        c.received,
    );
    f.counter(
        "mimic_capture_received",
        "Wire bytes of the packets received.",
        Some(Unit::Bytes),
        c.received_bytes,
    );
    f.counter(
        "mimic_capture_kept_packets",
        "Packets kept (sampled in, cut and anonymized) for the files.",
        None,
        c.kept,
    );
    f.counter(
        "mimic_capture_kept",
        "Bytes of the kept packets after cutting.",
        Some(Unit::Bytes),
        c.kept_bytes,
    );
    f.counter_by(
        "mimic_capture_dropped_packets",
        "Packets not written, by cause: capture_buffer (kernel ring / NIC descriptors full), interface (interface or driver), write_failed (accepted, lost to a write error), and by policy: sampled_out, non_tcp, malformed, unanonymizable.",
        None,
        "cause",
        &[
            ("capture_buffer", t.kernel_dropped),
            ("interface", t.interface_dropped),
            ("write_failed", t.capture_dropped),
            ("sampled_out", c.sampled_out),
            ("non_tcp", c.non_tcp_dropped),
            ("malformed", c.malformed),
            ("unanonymizable", c.unanonymizable),
        ],
    );
    f.counter_by(
        "mimic_capture_connections",
        "Connection openings seen (TCP SYN without ACK; a retransmitted SYN counts again) by sampling decision.",
        None,
        "decision",
        &[
            ("kept", c.connections_kept),
            ("sampled_out", c.connections_sampled_out),
        ],
    );
    f.counter(
        "mimic_capture_written_packets",
        "Packets written to the pcapng files.",
        None,
        t.written,
    );
    f.counter(
        "mimic_capture_written",
        "Bytes written to the pcapng files (including files the ring deleted since).",
        Some(Unit::Bytes),
        t.bytes_written,
    );
    f.counter(
        "mimic_capture_files_closed",
        "Files closed complete (renamed from .part).",
        None,
        t.files_closed,
    );
    f.counter_by(
        "mimic_capture_files_rotated",
        "Files closed because they reached the --rotate limit, by trigger.",
        None,
        "trigger",
        &[
            ("size", t.files_rotated_size),
            ("time", t.files_rotated_time),
        ],
    );
    f.counter(
        "mimic_capture_files_deleted",
        "Closed files the retention ring (--ring) deleted.",
        None,
        t.files_deleted,
    );
    f.gauge(
        "mimic_capture_files",
        "Closed files of this capture on disk now.",
        None,
        t.files_closed.saturating_sub(t.files_deleted),
    );
}

/// A file of zeros that holds disk space for `capture-summary.json` while the capture runs, so
/// a full disk cannot leave the capture without its summary. Removed when dropped.
struct SummaryReserve(PathBuf);

impl SummaryReserve {
    /// Larger than the summary of a capture with a few hundred rotated files.
    const BYTES: usize = 64 * 1024;

    fn create(dir: &Path) -> anyhow::Result<Self> {
        use std::io::Write;
        let p = dir.join(".capture-summary.reserve");
        let r = SummaryReserve(p.clone());
        // written, not fallocated: every filesystem counts written blocks
        std::fs::File::create(&p)
            .and_then(|mut f| f.write_all(&[0u8; Self::BYTES]).and_then(|()| f.sync_all()))
            .with_context(|| format!("reserving space for the summary in {}", p.display()))?;
        Ok(r)
    }
}

impl Drop for SummaryReserve {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
