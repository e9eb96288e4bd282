//! `mimic capture --source SRC -o DIR [options]` and `mimic capture keygen FILE`.
//!
//! Output directory layout:
//! * `capture-YYYYmmddTHHMMSSZ-NNNNN.pcapng` — closed, complete files (written as `….part`
//!   and renamed when closed); with `--ring N` only the newest N remain (lowest number =
//!   oldest);
//! * `capture.key` — the key generated when `--key` was not given (mode 0600);
//! * `capture.ready` — written once the source is capturing (callers wait for it);
//! * `capture-summary.json` — the final counters, written when the capture ends.
//!
//! The flags map to a [`CaptureSpec`] ([`RunArgs::into_spec`]), which runs the capture and
//! owns those two files and the command line (`mimic_capture::spec`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use mimic_capture::capture::{self, parse_duration, parse_rotate, Rotate};
use mimic_capture::source::SourceSpec;
use mimic_capture::spec::RunHooks;
use mimic_capture::{
    CaptureKey, CaptureProbe, CaptureSpec, NonTcp, PayloadPolicy, Rate, Rule, Settings, StopReason,
    Totals,
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
    /// Keep K of every N connections (both directions together), e.g. 1/90; N alone is 1/N.
    #[arg(long, value_name = "K/N", default_value = "1/1", value_parser = parse_rate)]
    pub sample: Rate,
    /// Sampling rule: keyed (SipHash of the 5-tuple) or last-octet (Monkey's: by the client address's last byte).
    #[arg(long, value_name = "RULE", default_value = "keyed", value_parser = ["keyed", "last-octet"])]
    pub sample_rule: String,
    /// A server port, so the last-octet rule knows which end is the client (repeatable).
    #[arg(long = "server-port", value_name = "P", value_parser = super::server_port)]
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
    match s.parse::<u64>() {
        Ok(n) => u32::try_from(n).map(PayloadPolicy::Bytes).map_err(|_| {
            format!("{n} bytes: more than 4294967295 (and than any packet carries); give a byte count or `all`")
        }),
        Err(_) => Err(format!("{s:?}: expected a byte count or `all`")),
    }
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

impl RunArgs {
    /// The capture these flags describe (checked against each other; nothing is touched).
    pub fn into_spec(self) -> anyhow::Result<CaptureSpec> {
        let source = self.source.context("--source is required")?;
        let dir = self.output.context("-o DIR is required")?;
        let mut rotate_bytes = None;
        let mut rotate_time = None;
        for r in &self.rotate {
            match r {
                Rotate::Size(b) if rotate_bytes.is_none() => rotate_bytes = Some(*b),
                Rotate::Time(t) if rotate_time.is_none() => rotate_time = Some(*t),
                _ => anyhow::bail!("--rotate: give at most one size and one time"),
            }
        }
        let rule = match self.sample_rule.as_str() {
            "last-octet" => Rule::LastOctet {
                server_ports: self.server_ports,
            },
            _ => Rule::Keyed,
        };
        let spec = CaptureSpec {
            source,
            dir,
            settings: Settings {
                rate: self.sample,
                rule,
                payload: self.payload_bytes,
                non_tcp: if self.non_tcp == "keep" {
                    NonTcp::Keep
                } else {
                    NonTcp::Drop
                },
                anonymize: !self.no_anonymize,
            },
            key: self.key,
            filter: self.filter,
            rotate_bytes,
            rotate_time,
            ring: self.ring,
            metrics: self.metrics,
            duration: self.duration,
            count: self.count,
            workers: self.workers,
            promisc: !self.no_promisc,
            buffer_bytes: self.buffer,
            stats_json: self.stats_json,
            stats_interval_secs: self.stats_interval,
            prefix: self.prefix,
            fail_on_drop: self.fail_on_drop,
        };
        spec.validate()?;
        Ok(spec)
    }
}

fn run_capture(a: RunArgs) -> anyhow::Result<ExitCode> {
    // validate everything before touching the system
    let spec = a.into_spec()?;
    spec.check_source()?;
    // a taken port fails here, before anything is written
    let metrics = spec.metrics.map(mimic_metrics::bind).transpose()?;
    let quiet = crate::progress::quiet();
    let stop = capture::stop_on_signals().context("installing SIGINT/SIGTERM handlers")?;
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
    let summary = spec.run(RunHooks {
        quiet,
        stop: Arc::clone(&stop),
        probe: Some(probe),
    })?;
    if let Some(e) = &summary.input_skipped {
        eprintln!(
            "mimic capture: warning: corrupt records skipped, the reading went on after them: {e}"
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
            spec.dir.display()
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
    if spec.fail_on_drop && summary.lost() > 0 {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use std::time::Duration;

    /// The spec's command line, parsed by the real parser and mapped back, is the spec.
    fn round_trip(spec: &CaptureSpec) -> CaptureSpec {
        match crate::cmd::parse_role_args(spec.to_args()) {
            crate::Command::Capture(Args { command: None, run }) => run.into_spec().unwrap(),
            _ => panic!("{:?} is not `mimic capture`", spec.to_args()),
        }
    }

    #[test]
    fn spec_survives_its_command_line() {
        let every_field = CaptureSpec {
            source: SourceSpec::Iface("eth7".into()),
            dir: "/srv/cap dir".into(),
            settings: Settings {
                rate: Rate { keep: 3, of: 90 },
                rule: Rule::LastOctet {
                    server_ports: vec![80, 8443],
                },
                payload: PayloadPolicy::Bytes(64),
                non_tcp: NonTcp::Keep,
                anonymize: false,
            },
            key: Some("/etc/mimic/capture.key".into()),
            filter: Some("tcp port 80".into()),
            rotate_bytes: Some(1 << 30),
            rotate_time: Some(Duration::from_secs(600)),
            ring: Some(200),
            metrics: Some("127.0.0.1:9464".parse::<SocketAddr>().unwrap()),
            duration: Some(Duration::from_millis(90_500)),
            count: Some(1_000_000),
            workers: 4,
            promisc: false,
            buffer_bytes: 128 << 20,
            stats_json: Some("-".into()),
            stats_interval_secs: 0.25,
            prefix: "tap".into(),
            fail_on_drop: true,
        };
        assert_eq!(round_trip(&every_field), every_field);

        let mut other = every_field.clone();
        other.source = SourceSpec::Dpdk("-l 0 --vdev=net_pcap0,iface=eth0".into());
        other.filter = None;
        other.settings.rule = Rule::Keyed;
        other.settings.payload = PayloadPolicy::All;
        other.rotate_bytes = None;
        assert_eq!(round_trip(&other), other);

        let defaults = CaptureSpec::new(SourceSpec::File("/x.pcapng".into()), "out");
        assert_eq!(round_trip(&defaults), defaults);
    }
}
