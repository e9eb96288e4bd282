//! The capture role's launch contract: [`CaptureSpec`] holds every setting of `mimic capture`,
//! [`CaptureSpec::to_args`] is the one place that writes its command line, [`CaptureSpec::run`]
//! runs it in this process, and the files through which a capture tells whoever started it
//! how it is doing are written and read here only:
//!
//! * `capture.ready` ([`READY_FILE`]) — written once the source is capturing: `pid N` and
//!   `source SRC` lines ([`Ready`]); removed at start if stale (a capture whose process still
//!   runs is not: the new one is refused);
//! * `capture-summary.json` ([`SUMMARY_FILE`]) — the [`CaptureSummary`] when the capture ends,
//!   with space for it held from the start so that a full disk cannot leave it unwritten.

use std::ffi::OsString;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use crate::capture::{run_capture, CaptureConfig, CaptureError, StatsSink};
use crate::key::{CaptureKey, KeyError};
use crate::process::{NonTcp, PayloadPolicy, Settings};
use crate::sample::{Rate, Rule};
use crate::source::SourceSpec;
use crate::{CaptureProbe, CaptureSummary};

/// Written into the output directory once the source is capturing.
pub const READY_FILE: &str = "capture.ready";
/// Written into the output directory when the capture ends.
pub const SUMMARY_FILE: &str = "capture-summary.json";
/// Holds the summary's disk space while the capture runs.
const RESERVE_FILE: &str = ".capture-summary.reserve";

/// Everything `mimic capture` is told on its command line, typed.
#[derive(Clone, Debug, PartialEq)]
pub struct CaptureSpec {
    /// `--source`.
    pub source: SourceSpec,
    /// `-o`: the output directory (created if missing).
    pub dir: PathBuf,
    /// `--sample`, `--sample-rule` / `--server-port`, `--payload-bytes`, `--non-tcp`,
    /// `--no-anonymize`.
    pub settings: Settings,
    /// `--key`: the secret key file; None writes a new key to `DIR/capture.key`.
    pub key: Option<PathBuf>,
    /// `--filter`: a BPF expression (iface: sources only).
    pub filter: Option<String>,
    /// `--rotate SIZE`.
    pub rotate_bytes: Option<u64>,
    /// `--rotate TIME`.
    pub rotate_time: Option<Duration>,
    /// `--ring N`: keep at most N files.
    pub ring: Option<u32>,
    /// `--metrics ADDR`.
    pub metrics: Option<SocketAddr>,
    /// `--duration`.
    pub duration: Option<Duration>,
    /// `--count`: stop after this many packets were kept.
    pub count: Option<u64>,
    /// `--workers`.
    pub workers: u16,
    /// Not `--no-promisc`.
    pub promisc: bool,
    /// `--buffer`: kernel ring bytes per worker.
    pub buffer_bytes: u64,
    /// `--stats-json FILE` (`-` = stdout).
    pub stats_json: Option<PathBuf>,
    /// `--stats-interval` in seconds.
    pub stats_interval_secs: f64,
    /// `--prefix`: the pcapng files' name prefix.
    pub prefix: String,
    /// `--fail-on-drop`.
    pub fail_on_drop: bool,
}

/// A capture's settings that cannot work, found before anything touches the system.
#[derive(Debug, thiserror::Error)]
pub enum CaptureRunError {
    #[error("{0}")]
    Invalid(String),
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    Summary {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error(transparent)]
    Capture(#[from] CaptureError),
}

impl CaptureSpec {
    /// `mimic capture --source SOURCE -o DIR` with every other setting at its default.
    pub fn new(source: SourceSpec, dir: impl Into<PathBuf>) -> CaptureSpec {
        CaptureSpec {
            source,
            dir: dir.into(),
            settings: Settings {
                rate: Rate::ALL,
                rule: Rule::Keyed,
                payload: PayloadPolicy::Bytes(0),
                non_tcp: NonTcp::Drop,
                anonymize: true,
            },
            key: None,
            filter: None,
            rotate_bytes: None,
            rotate_time: None,
            ring: None,
            metrics: None,
            duration: None,
            count: None,
            workers: 1,
            promisc: true,
            buffer_bytes: 64 << 20,
            stats_json: None,
            stats_interval_secs: 1.0,
            prefix: "capture".into(),
            fail_on_drop: false,
        }
    }

    /// The command line after the program name (`capture --source … -o DIR …`) that makes
    /// `mimic capture` run this spec; settings at their default are left out.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut a = Args::default();
        a.flag_value("capture", None::<&str>);
        a.flag_value("--source", Some(self.source.to_string()));
        a.flag_value("-o", Some(&self.dir));
        let s = &self.settings;
        if s.rate != Rate::ALL {
            a.flag_value("--sample", Some(s.rate.to_string()));
        }
        if let Rule::LastOctet { server_ports } = &s.rule {
            a.flag_value("--sample-rule", Some("last-octet"));
            for p in server_ports {
                a.flag_value("--server-port", Some(p.to_string()));
            }
        }
        if let Some(k) = &self.key {
            a.flag_value("--key", Some(k));
        }
        match s.payload {
            PayloadPolicy::Bytes(0) => {}
            PayloadPolicy::Bytes(k) => a.flag_value("--payload-bytes", Some(k.to_string())),
            PayloadPolicy::All => a.flag_value("--payload-bytes", Some("all")),
        }
        if !s.anonymize {
            a.flag_value("--no-anonymize", None::<&str>);
        }
        if s.non_tcp == NonTcp::Keep {
            a.flag_value("--non-tcp", Some("keep"));
        }
        if let Some(f) = &self.filter {
            a.flag_value("--filter", Some(f));
        }
        if let Some(b) = self.rotate_bytes {
            a.flag_value("--rotate", Some(format!("{b}B")));
        }
        if let Some(t) = self.rotate_time {
            a.flag_value("--rotate", Some(duration_arg(t)));
        }
        if let Some(n) = self.ring {
            a.flag_value("--ring", Some(n.to_string()));
        }
        if let Some(m) = self.metrics {
            a.flag_value("--metrics", Some(m.to_string()));
        }
        if let Some(t) = self.duration {
            a.flag_value("--duration", Some(duration_arg(t)));
        }
        if let Some(n) = self.count {
            a.flag_value("--count", Some(n.to_string()));
        }
        if self.workers != 1 {
            a.flag_value("--workers", Some(self.workers.to_string()));
        }
        if !self.promisc {
            a.flag_value("--no-promisc", None::<&str>);
        }
        if self.buffer_bytes != 64 << 20 {
            // a plain number is bytes to the parser
            a.flag_value("--buffer", Some(self.buffer_bytes.to_string()));
        }
        if let Some(p) = &self.stats_json {
            a.flag_value("--stats-json", Some(p));
        }
        if self.stats_interval_secs != 1.0 {
            a.flag_value(
                "--stats-interval",
                Some(self.stats_interval_secs.to_string()),
            );
        }
        if self.prefix != "capture" {
            a.flag_value("--prefix", Some(&self.prefix));
        }
        if self.fail_on_drop {
            a.flag_value("--fail-on-drop", None::<&str>);
        }
        a.0
    }

    /// Checks the settings against each other, before anything touches the system.
    pub fn validate(&self) -> Result<(), CaptureRunError> {
        let bad = |m: &str| Err(CaptureRunError::Invalid(m.into()));
        if self.filter.is_some() && !matches!(self.source, SourceSpec::Iface(_)) {
            return bad("--filter applies to iface: sources only");
        }
        if self.rotate_bytes.is_some_and(|b| b < 4096) {
            return bad("--rotate size must be at least 4KiB");
        }
        if self.ring.is_some() && self.rotate_bytes.is_none() && self.rotate_time.is_none() {
            return bad("--ring needs --rotate SIZE and/or --rotate TIME (with one file there is nothing to delete)");
        }
        if self.ring == Some(0) {
            return bad("--ring must be at least 1");
        }
        if self.count == Some(0) {
            return bad("--count must be at least 1");
        }
        if self.workers == 0 || self.workers > 64 {
            return bad("--workers must be 1 to 64");
        }
        if !(self.stats_interval_secs.is_finite() && self.stats_interval_secs > 0.0) {
            return bad("--stats-interval must be a positive, finite number");
        }
        if self.prefix.is_empty() || self.prefix.contains('/') {
            return bad("--prefix must be a plain file name prefix");
        }
        Ok(())
    }

    /// A file source must exist (the other sources are checked when they open).
    pub fn check_source(&self) -> Result<(), CaptureRunError> {
        if let SourceSpec::File(p) = &self.source {
            if !p.is_file() {
                // say what is there: "no such file" for a FIFO or a directory misled
                let why = if p.is_dir() {
                    "is a directory"
                } else if p.exists() {
                    "not a regular file (a file source reads a capture file; a pipe or device will not do)"
                } else if p.as_os_str() == "-" {
                    "a file source reads a capture file, not standard input"
                } else {
                    "no such file"
                };
                return Err(CaptureRunError::Invalid(format!("{}: {why}", p.display())));
            }
        }
        Ok(())
    }

    /// `DIR/capture.ready`.
    pub fn ready_path(&self) -> PathBuf {
        self.dir.join(READY_FILE)
    }

    /// `DIR/capture-summary.json`.
    pub fn summary_path(&self) -> PathBuf {
        self.dir.join(SUMMARY_FILE)
    }

    /// What the capture wrote into `capture.ready`, once it is capturing (None before).
    pub fn ready(&self) -> Option<Ready> {
        Ready::read(&self.dir)
    }

    /// The summary the capture wrote when it ended.
    pub fn read_summary(&self) -> Result<CaptureSummary, CaptureRunError> {
        read_summary(&self.dir)
    }

    /// Runs the capture in this process until its source ends, a stop condition holds or
    /// `hooks.stop` is set: creates the output directory, writes `capture.ready` once the
    /// source is capturing and `capture-summary.json` at the end, and returns the summary.
    /// A stop on a disk-full, write or source error is returned as a summary too (its
    /// `stop_reason` says so); the caller decides the exit status.
    pub fn run(&self, hooks: RunHooks) -> Result<CaptureSummary, CaptureRunError> {
        self.validate()?;
        self.check_source()?;
        let key_given = self.key.as_deref().map(CaptureKey::load).transpose()?;
        let dir = &self.dir;
        // another capture writing into this directory: its ready file and summary are not
        // stale, and two captures' files in one directory are no capture
        if let Some(r) = Ready::read(dir).filter(|r| r.pid != std::process::id()) {
            let comm = std::fs::read_to_string(format!("/proc/{}/comm", r.pid)).unwrap_or_default();
            if mimic_core::process::running(r.pid as i32) && comm.starts_with("mimic") {
                return Err(CaptureRunError::Invalid(format!(
                    "{}: a capture is running into this directory (pid {}, source {}): stop it, or give this one another output directory",
                    dir.display(),
                    r.pid,
                    r.source
                )));
            }
        }
        // a directory this run makes is removed again if the run fails before writing into it
        // (declared before the summary reserve inside it, so dropped after it)
        let _made = MadeDir(mimic_core::db::missing_dirs(dir));
        std::fs::create_dir_all(dir).map_err(|source| CaptureRunError::Io {
            what: "creating",
            path: dir.clone(),
            source,
        })?;
        // a `.part` no running capture holds is what a killed one left
        for left in crate::output::finish_left_parts(dir) {
            eprintln!("mimic capture: warning: {left}");
        }
        let (ready, summary_path) = (self.ready_path(), self.summary_path());
        for stale in [&ready, &summary_path] {
            match std::fs::remove_file(stale) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(CaptureRunError::Io {
                        what: "removing stale",
                        path: stale.clone(),
                        source,
                    })
                }
            }
        }
        // Space for the summary, held from the start: a capture that fills its disk still has
        // room to say what it wrote and lost. Released just before the summary is written.
        let reserve = SummaryReserve::create(dir)?;
        // the key this run generates, removed again if it never captured: left behind, it
        // would make the next capture into the directory ask for `--key`
        let mut generated_key = None;
        let (key, key_origin) = match key_given {
            Some(k) => (
                k,
                format!("key file {}", self.key.as_ref().expect("given").display()),
            ),
            None => {
                let p = dir.join("capture.key");
                if p.exists() {
                    return Err(CaptureRunError::Invalid(format!(
                        "{} exists from an earlier capture: pass --key {} to reuse it, or remove it",
                        p.display(),
                        p.display()
                    )));
                }
                let k = CaptureKey::generate().map_err(|source| CaptureRunError::Io {
                    what: "reading",
                    path: "/dev/urandom".into(),
                    source,
                })?;
                k.save_new(&p)?;
                generated_key = Some(p);
                (k, "key generated for this capture".to_string())
            }
        };
        let json: Option<Box<dyn Write + Send>> = match &self.stats_json {
            None => None,
            Some(p) if p.as_os_str() == "-" => Some(Box::new(std::io::stdout())),
            Some(p) => Some(Box::new(std::fs::File::create(p).map_err(|source| {
                CaptureRunError::Io {
                    what: "creating",
                    path: p.clone(),
                    source,
                }
            })?)),
        };
        let quiet = hooks.quiet;
        let src_text = self.source.to_string();
        let ready_text = Ready {
            pid: std::process::id(),
            source: src_text.clone(),
        }
        .to_text();
        let started = Arc::new(AtomicBool::new(false));
        let started_flag = started.clone();
        let on_ready: Box<dyn FnOnce() + Send> = Box::new(move || {
            started_flag.store(true, std::sync::atomic::Ordering::SeqCst);
            if let Err(e) = mimic_core::db::write_atomic(&ready, ready_text.as_bytes()) {
                eprintln!(
                    "mimic capture: warning: could not write {}: {e}",
                    ready.display()
                );
            }
            if !quiet {
                eprintln!("mimic capture: ready ({src_text})");
            }
        });
        let cfg = CaptureConfig {
            source: self.source.clone(),
            settings: self.settings.clone(),
            key,
            key_origin,
            dir: dir.clone(),
            prefix: self.prefix.clone(),
            rotate_bytes: self.rotate_bytes,
            rotate_time: self.rotate_time,
            max_files: self.ring.map(|n| n as usize),
            duration: self.duration,
            count: self.count,
            workers: self.workers as usize,
            filter: self.filter.clone(),
            promisc: self.promisc,
            buffer_bytes: self.buffer_bytes as usize,
            stats: StatsSink {
                text: !quiet,
                json,
                interval: Duration::from_secs_f64(self.stats_interval_secs),
            },
            stop: hooks.stop,
            on_ready: Some(on_ready),
            probe: hooks.probe,
        };
        let summary = match run_capture(cfg) {
            Ok(s) => s,
            Err(e) => {
                if let Some(k) =
                    generated_key.filter(|_| !started.load(std::sync::atomic::Ordering::SeqCst))
                {
                    let _ = std::fs::remove_file(k);
                }
                return Err(e.into());
            }
        };
        drop(reserve);
        if let Err(e) = write_summary(dir, &summary) {
            eprintln!("mimic capture: warning: {e}");
        }
        Ok(summary)
    }
}

/// What [`CaptureSpec::run`] needs from the process that runs it.
pub struct RunHooks {
    /// No statistics lines and no `ready` line on stderr.
    pub quiet: bool,
    /// Set from outside (SIGINT / SIGTERM) to stop the capture cleanly.
    pub stop: Arc<AtomicBool>,
    /// Filled once the capture runs (for a `/metrics` endpoint).
    pub probe: Option<Arc<CaptureProbe>>,
}

/// The content of `capture.ready`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ready {
    /// The capturing process.
    pub pid: u32,
    /// Its source, as `--source` writes it.
    pub source: String,
}

impl Ready {
    fn to_text(&self) -> String {
        format!("pid {}\nsource {}\n", self.pid, self.source)
    }

    fn parse(text: &str) -> Option<Ready> {
        let mut pid = None;
        let mut source = None;
        for line in text.lines() {
            match line.split_once(' ') {
                Some(("pid", p)) => pid = p.trim().parse().ok(),
                Some(("source", s)) => source = Some(s.to_string()),
                _ => {}
            }
        }
        Some(Ready {
            pid: pid?,
            source: source?,
        })
    }

    /// `DIR/capture.ready`, if it is there and complete (it is written atomically).
    pub fn read(dir: &Path) -> Option<Ready> {
        Ready::parse(&std::fs::read_to_string(dir.join(READY_FILE)).ok()?)
    }
}

/// Writes `DIR/capture-summary.json` atomically.
pub fn write_summary(dir: &Path, summary: &CaptureSummary) -> Result<(), CaptureRunError> {
    let path = dir.join(SUMMARY_FILE);
    let text =
        serde_json::to_string_pretty(summary).map_err(|source| CaptureRunError::Summary {
            path: path.clone(),
            source,
        })? + "\n";
    mimic_core::db::write_atomic(&path, text.as_bytes()).map_err(|source| CaptureRunError::Io {
        what: "could not write",
        path,
        source,
    })
}

/// Reads `DIR/capture-summary.json`.
pub fn read_summary(dir: &Path) -> Result<CaptureSummary, CaptureRunError> {
    let path = dir.join(SUMMARY_FILE);
    let text = std::fs::read_to_string(&path).map_err(|source| CaptureRunError::Io {
        what: "reading",
        path: path.clone(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| CaptureRunError::Summary { path, source })
}

/// A duration as `--duration` / `--rotate` read it: whole seconds, else milliseconds.
fn duration_arg(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis().max(1))
    }
}

/// A command line under construction.
#[derive(Default)]
struct Args(Vec<OsString>);

impl Args {
    fn flag_value(&mut self, flag: &str, value: Option<impl AsRef<std::ffi::OsStr>>) {
        self.0.push(flag.into());
        if let Some(v) = value {
            self.0.push(v.as_ref().to_os_string());
        }
    }
}

/// The directories a capture made for its output (deepest first), removed when the capture
/// ends if they are empty then (a run refused before capturing leaves none behind).
struct MadeDir(Vec<PathBuf>);

impl Drop for MadeDir {
    fn drop(&mut self) {
        for d in &self.0 {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// A file of zeros that holds disk space for `capture-summary.json` while the capture runs, so
/// a full disk cannot leave the capture without its summary. Removed when dropped.
struct SummaryReserve(PathBuf);

impl SummaryReserve {
    /// Larger than the summary of a capture with a few hundred rotated files.
    const BYTES: usize = 64 * 1024;

    fn create(dir: &Path) -> Result<Self, CaptureRunError> {
        let p = dir.join(RESERVE_FILE);
        let r = SummaryReserve(p.clone());
        // written, not fallocated: every filesystem counts written blocks
        std::fs::File::create(&p)
            .and_then(|mut f| f.write_all(&[0u8; Self::BYTES]).and_then(|()| f.sync_all()))
            .map_err(|source| CaptureRunError::Io {
                what: "reserving space for the summary in",
                path: p,
                source,
            })?;
        Ok(r)
    }
}

impl Drop for SummaryReserve {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::{StopReason, Totals};

    #[test]
    fn defaults_write_only_source_and_dir() {
        let s = CaptureSpec::new(SourceSpec::Iface("eth0".into()), "/tmp/x");
        let a: Vec<String> = s
            .to_args()
            .iter()
            .map(|a| a.to_string_lossy().into())
            .collect();
        assert_eq!(a, ["capture", "--source", "iface:eth0", "-o", "/tmp/x"]);
        s.validate().unwrap();
    }

    #[test]
    fn validation_names_the_flag() {
        let mut s = CaptureSpec::new(SourceSpec::File("/x.pcap".into()), "/tmp/x");
        s.filter = Some("tcp".into());
        assert!(s.validate().unwrap_err().to_string().contains("--filter"));
        s.filter = None;
        s.ring = Some(3);
        assert!(s.validate().unwrap_err().to_string().contains("--ring"));
        s.rotate_bytes = Some(100);
        assert!(s.validate().unwrap_err().to_string().contains("4KiB"));
        s.rotate_bytes = Some(1 << 20);
        s.validate().unwrap();
        s.prefix = "a/b".into();
        assert!(s.validate().unwrap_err().to_string().contains("--prefix"));
    }

    #[test]
    fn durations_are_written_as_the_parser_reads_them() {
        use crate::capture::parse_duration;
        for d in [
            Duration::from_secs(90),
            Duration::from_millis(250),
            Duration::from_millis(1500),
        ] {
            assert_eq!(parse_duration(&duration_arg(d)).unwrap(), d, "{d:?}");
        }
    }

    #[test]
    fn ready_and_summary_files_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let spec = CaptureSpec::new(SourceSpec::Iface("veth0".into()), dir.path());
        assert_eq!(spec.ready(), None);
        std::fs::write(spec.ready_path(), "pid 12\n").unwrap();
        assert_eq!(spec.ready(), None, "incomplete ready file");
        let r = Ready {
            pid: 12,
            source: "iface:veth0".into(),
        };
        std::fs::write(spec.ready_path(), r.to_text()).unwrap();
        assert_eq!(spec.ready(), Some(r));

        assert!(spec.read_summary().is_err(), "no summary yet");
        let summary = CaptureSummary {
            source: "iface:veth0".into(),
            stop_reason: StopReason::Signal,
            elapsed_secs: 1.5,
            totals: Totals {
                kernel_dropped: 3,
                written: 40,
                ..Totals::default()
            },
            files: vec![dir.path().join("capture-1.pcapng")],
            input_error: None,
            input_skipped: None,
            output_error: Some("disk full".into()),
            ports: Some(serde_json::json!([{"port": 0}])),
        };
        write_summary(dir.path(), &summary).unwrap();
        assert_eq!(spec.read_summary().unwrap(), summary);
        std::fs::write(spec.summary_path(), "{").unwrap();
        let e = spec.read_summary().unwrap_err().to_string();
        assert!(e.contains(SUMMARY_FILE), "{e}");
    }
}
