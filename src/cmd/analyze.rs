//! `mimic analyze TRACE... -o flows.db`: trace files to a per-connection database.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::Context;
use mimic_analyze::driver::{self, RunOptions, Summary};
use mimic_analyze::store::OutputFormat;
use mimic_analyze::{BwMethod, Cidr, Config};
use mimic_core::community_id::Shard;

#[derive(clap::Args)]
pub struct Args {
    /// Trace files: pcap or pcapng, optionally gzip-compressed; several are merged in time order.
    /// `-` reads one from standard input (e.g. `tcpdump -w - | mimic analyze - -o flows.db`).
    #[arg(required = true, value_name = "TRACE")]
    pub inputs: Vec<PathBuf>,
    /// The database to write (replaced atomically when the run succeeds); with `--format
    /// parquet`, the dataset directory (created if missing) that gets
    /// `table=NAME/shard=K/part-0.parquet` per table (K of `--shard K/N`, 1 unsharded).
    #[arg(short, long, value_name = "FILE|DIR", value_parser = super::file_output)]
    pub output: PathBuf,
    /// Output format: `sqlite` (one database) or `parquet` (a Hive-partitioned directory
    /// that DuckDB, Spark and Trino read as one table per name, the shards of one run
    /// together; see GUIDE.md).
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = Format::Sqlite)]
    pub format: Format,
    /// A server port, for connections whose handshake was not captured (repeatable).
    #[arg(long = "server-port", value_name = "P", value_parser = super::server_port)]
    pub server_ports: Vec<u16>,
    /// A server prefix such as 10.0.0.0/8, for connections whose handshake was not captured (repeatable).
    #[arg(long = "server-net", value_name = "CIDR", value_parser = parse_cidr)]
    pub server_nets: Vec<Cidr>,
    /// Analyzer threads (connections are sharded by flow; frames are read on a thread of their
    /// own when N > 1, and with 1 on a machine of three or more cores).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub threads: u16,
    /// Analyze only the frames this capture filter accepts: BPF as tcpdump takes it
    /// ('tcp port 443', 'host 10.0.0.1 and not port 22'), compiled by libpcap for each input's
    /// link type. Rejected frames are counted, not analyzed.
    #[arg(long, value_name = "EXPR", value_parser = parse_filter)]
    pub filter: Option<String>,
    /// Analyze only shard K of N (1 <= K <= N): the connections whose Community ID hash falls
    /// in it (both directions of a connection in one shard; the hash is documented in GUIDE.md
    /// and stable across versions and hosts). Run all N, on any hosts, and join the databases
    /// with `mimic merge`.
    #[arg(long, value_name = "K/N")]
    pub shard: Option<Shard>,
    /// Where the trace was captured: `server` (on the server or a tap on its segment, the
    /// convention for originals), `client` (on the client host: response times then carry
    /// about one more round trip) or `unknown`. Written to meta `capture_vantage`; `mimic
    /// compare` warns when two databases were captured at different or unknown points.
    #[arg(long, value_enum, value_name = "WHERE", default_value_t = Vantage::Server)]
    pub vantage: Vantage,
    /// Print the summary as JSON on stdout instead of text.
    #[arg(long)]
    pub json: bool,
    /// Close a connection after this many seconds without packets (capture time).
    #[arg(long, value_name = "SECS", default_value_t = 300.0)]
    pub idle_timeout: f64,
    /// Most connections tracked at once; beyond it the longest-idle are closed early (and flagged).
    #[arg(long, value_name = "N", default_value_t = 2_000_000)]
    pub max_connections: usize,
    /// RTT samples stored per direction of a connection (the first N plus the minimum; every
    /// sample still counts for min RTT), or `all`.
    #[arg(long, value_name = "N|all", default_value = "16", value_parser = parse_rows)]
    pub rtt_samples: usize,
    /// How packet-pair samples are combined: median (the most accurate against the lab's truth,
    /// bench/bw-methods.sh), mode (histogram, papers/004) or capprobe (minimum delay sum, papers/001).
    #[arg(long, value_name = "METHOD", default_value = "median", value_parser = parse_bw)]
    pub bw_method: BwMethod,
}

/// `--format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Sqlite,
    Parquet,
}

impl From<Format> for OutputFormat {
    fn from(f: Format) -> OutputFormat {
        match f {
            Format::Sqlite => OutputFormat::Sqlite,
            Format::Parquet => OutputFormat::Parquet,
        }
    }
}

/// Where a trace was captured (meta `capture_vantage`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Vantage {
    Server,
    Client,
    Unknown,
}

impl Vantage {
    pub fn as_str(self) -> &'static str {
        match self {
            Vantage::Server => "server",
            Vantage::Client => "client",
            Vantage::Unknown => "unknown",
        }
    }
}

fn parse_cidr(s: &str) -> Result<Cidr, String> {
    s.parse()
}

fn parse_rows(s: &str) -> Result<usize, String> {
    match s {
        "all" => Ok(usize::MAX),
        n => n.parse().map_err(|_| format!("'{s}': a number or `all`")),
    }
}

fn parse_bw(s: &str) -> Result<BwMethod, String> {
    s.parse()
}

/// Checks the filter (compiled for Ethernet, unoptimized), so that a mistake in it is refused
/// with the other flags, before anything is read; the analysis compiles it for good.
fn parse_filter(s: &str) -> Result<String, String> {
    mimic_analyze::filter::CaptureFilter::check(s)
        .map(|_| s.to_string())
        .map_err(|e| e.to_string())
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    // below a millisecond every pause inside a connection would end it (1e-300 became 0 ns:
    // each packet a connection of its own)
    if a.idle_timeout.is_nan() || a.idle_timeout < 0.001 {
        anyhow::bail!(
            "--idle-timeout {:?}: must be at least 0.001 s (a millisecond)",
            a.idle_timeout
        );
    }
    if a.max_connections == 0 {
        anyhow::bail!("--max-connections must be at least 1");
    }
    let config = Config {
        server_ports: a.server_ports.clone(),
        server_nets: a.server_nets.clone(),
        idle_timeout_ns: (a.idle_timeout * 1e9) as i64,
        max_connections: a.max_connections,
        bw_method: a.bw_method,
        rtt_rows: a.rtt_samples,
        shard: a.shard,
        ..Config::default()
    };
    // Ctrl-C or SIGTERM stops the reading and removes the unfinished database; a second one
    // ends the process at once
    let cancel = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register_conditional_shutdown(sig, 130, Arc::clone(&cancel))
            .and_then(|_| signal_hook::flag::register(sig, Arc::clone(&cancel)))
            .context("installing SIGINT/SIGTERM handlers")?;
    }
    let summary = match analyze_inputs(
        a.inputs.clone(),
        a.output.clone(),
        config,
        a.threads as usize,
        vec![("capture_vantage".into(), a.vantage.as_str().into())],
        a.filter.clone(),
        a.format.into(),
        Some(cancel),
    ) {
        Ok(s) => s,
        Err(e) if matches!(e.downcast_ref(), Some(driver::AnalyzeError::Interrupted)) => {
            eprintln!("mimic: analysis interrupted; nothing was written");
            return Ok(ExitCode::from(130));
        }
        Err(e) => return Err(e),
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print_summary(&summary);
    }
    // warnings go to stderr unless --quiet (the JSON summary carries them too)
    if crate::progress::quiet() {
        return Ok(ExitCode::SUCCESS);
    }
    for i in &summary.input_issues {
        if i.resumed {
            eprintln!(
                "mimic: warning: {} (reading went on: {} frames of the file analyzed)",
                i.message,
                group(i.frames_before)
            );
        } else if i.frames_before == 0 {
            eprintln!(
                "mimic: warning: {} (no frame of it could be read)",
                i.message
            );
        } else {
            eprintln!(
                "mimic: warning: {} (the {} frames before it were analyzed)",
                i.message,
                group(i.frames_before)
            );
        }
    }
    // Small steps back are normal (multi-queue capture); a long one means overlapping inputs.
    if summary.max_time_backwards_s > 1.0 {
        // one input: named; several are merged in time order, so a step back is within one
        let input = match a.inputs.as_slice() {
            [one] => format!("{}: ", one.display()),
            _ => String::new(),
        };
        // a sub-second part of a second or more is carried into the seconds: a corrupt
        // fraction (0xffffffff µs) is a step of up to 71 minutes that no overlap explains
        let fraction = if summary.ts_invalid_fraction > 0 {
            format!(
                ", or its {} timestamps with a sub-second part of a second or more are corrupt",
                group(summary.ts_invalid_fraction)
            )
        } else {
            String::new()
        };
        eprintln!(
            "mimic: warning: {input}capture time goes back by up to {:.1} s ({} frames): the input may hold overlapping or repeated captures (merge them with mergecap, or pass them as separate files){fraction}",
            summary.max_time_backwards_s, summary.time_backwards
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs the analysis with a progress bar of input bytes on a terminal.
pub fn analyze_with_progress(
    inputs: Vec<PathBuf>,
    output: PathBuf,
    config: Config,
    threads: usize,
    extra_meta: Vec<(String, String)>,
    cancel: Option<Arc<AtomicBool>>,
) -> anyhow::Result<Summary> {
    analyze_inputs(
        inputs,
        output,
        config,
        threads,
        extra_meta,
        None,
        OutputFormat::Sqlite,
        cancel,
    )
}

/// [`analyze_with_progress`] with a capture filter and an output format.
#[allow(clippy::too_many_arguments)]
fn analyze_inputs(
    inputs: Vec<PathBuf>,
    output: PathBuf,
    config: Config,
    threads: usize,
    extra_meta: Vec<(String, String)>,
    filter: Option<String>,
    format: OutputFormat,
    cancel: Option<Arc<AtomicBool>>,
) -> anyhow::Result<Summary> {
    let total = driver::input_bytes(&inputs);
    let counter = Arc::new(AtomicU64::new(0));
    let pb = crate::progress::bytes(total, "analyze");
    if inputs.iter().any(|p| driver::is_stdin(p)) {
        // how much standard input holds is not known ahead: bytes read and their rate
        pb.unset_length();
        pb.set_style(
            indicatif::ProgressStyle::with_template("{prefix:>10} {bytes} {bytes_per_sec} {msg}")
                .expect("static template"),
        );
    }
    let ticker = {
        let (counter, pb) = (counter.clone(), pb.clone());
        crate::progress::Ticker::spawn(std::time::Duration::from_millis(100), move || {
            pb.set_position(counter.load(Ordering::Relaxed))
        })
    };
    let cmdline: Vec<String> = std::env::args().collect();
    let opts = RunOptions {
        inputs,
        output: output.clone(),
        config,
        threads,
        progress: Some(counter),
        meta: std::iter::once(("command".into(), cmdline.join(" ")))
            .chain(extra_meta)
            .collect(),
        filter,
        cancel,
    };
    let result = driver::run_to(&opts, format);
    ticker.stop();
    pb.finish_and_clear();
    result.with_context(|| format!("analysis into {} failed", output.display()))
}

fn group(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn print_summary(s: &Summary) {
    let files = s.inputs.len();
    println!(
        "analyzed {} file{}: {} frames ({} TCP) in {:.2} s, {:.2} M frames/s{}",
        files,
        if files == 1 { "" } else { "s" },
        group(s.frames),
        group(s.tcp_segments),
        s.elapsed_s,
        s.frames_per_s / 1e6,
        if s.threads > 1 {
            format!(" with {} threads", s.threads)
        } else {
            String::new()
        }
    );
    if let Some(shard) = &s.shard {
        println!(
            "shard {shard}: {} TCP segments of other shards' connections counted, not analyzed",
            group(s.other_shard_segments)
        );
    }
    let pruned: Vec<String> = s
        .pruned
        .iter()
        .map(|(k, v)| format!("{k} {}", group(*v)))
        .collect();
    println!(
        "connections: {} kept, {} complete{}",
        group(s.connections),
        group(s.complete),
        if pruned.is_empty() {
            String::new()
        } else {
            format!(
                "; pruned (flagged, kept in the table): {}",
                pruned.join(", ")
            )
        }
    );
    println!(
        "exchanges: {}; connections with a bandwidth estimate: {}",
        group(s.exchanges),
        group(s.with_bandwidth)
    );
    let mut extra = Vec::new();
    if s.port_reuse > 0 {
        extra.push(format!("port reuse {}", group(s.port_reuse)));
    }
    if s.duplicate_frames > 0 {
        extra.push(format!(
            "duplicated frames ignored {}",
            group(s.duplicate_frames)
        ));
    }
    if s.evicted > 0 {
        // every connection moved out to make room counts here; only those still open then
        // are flagged `evicted` (the "pruned" count above): the rest had ended already
        let flagged = s
            .pruned
            .iter()
            .find(|(k, _)| k.as_str() == "evicted")
            .map_or(0, |(_, v)| *v);
        let ended = s.evicted.saturating_sub(flagged);
        extra.push(if ended > 0 {
            format!(
                "moved out of the full connection table {} ({} still open, flagged evicted; {} had ended)",
                group(s.evicted),
                group(flagged),
                group(ended)
            )
        } else {
            format!(
                "moved out of the full connection table {} (all still open, flagged evicted)",
                group(s.evicted)
            )
        });
    }
    for (k, v) in &s.limit_drops {
        extra.push(format!("{k} beyond per-connection limits {}", group(*v)));
    }
    if s.ts_invalid_fraction > 0 {
        extra.push(format!(
            "timestamps with a sub-second part of a second or more (carried into the seconds) {}",
            group(s.ts_invalid_fraction)
        ));
    }
    if s.ts_missing > 0 {
        extra.push(format!(
            "frames without a timestamp (given the previous frame's) {}",
            group(s.ts_missing)
        ));
    }
    if s.capture_dropped > 0 {
        extra.push(format!(
            "packets the capturing interface reported dropping {}",
            group(s.capture_dropped)
        ));
    }
    if !extra.is_empty() {
        println!("noted: {}", extra.join(", "));
    }
    if let Some(f) = &s.filter {
        println!(
            "capture filter {}: {} frames rejected (not analyzed, not counted above)",
            mimic_analyze::filter::brief(f),
            group(s.filter_rejected)
        );
    }
    if !s.skipped.is_empty() {
        let sk: Vec<String> = s
            .skipped
            .iter()
            .map(|(k, v)| format!("{k} {}", group(*v)))
            .collect();
        println!("frames not analyzed: {}", sk.join(", "));
    }
    println!("wrote {}", s.output);
}
