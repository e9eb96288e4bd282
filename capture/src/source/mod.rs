//! Packet sources. Every source hands frames to the same per-queue callback
//! ([`Queue::poll`]), so files, libpcap and DPDK feed one pipeline.
//!
//! * `pcap:FILE` — [`file::FileSource`], a pcap / pcapng / gzip file read with the core reader.
//! * `iface:NAME` — [`live::LiveSource`], libpcap on a Linux interface (TPACKET_V3 ring,
//!   nanosecond timestamps, both directions), optionally several handles joined in a
//!   `PACKET_FANOUT_HASH` group (the kernel's symmetric flow hash) for several workers.
//! * `dpdk:"EAL ARGS"` — `dpdk::DpdkSource` (cargo feature `dpdk`).

use std::fmt;
use std::str::FromStr;

use mimic_core::{LinkType, Timestamp};

pub mod file;
pub mod live;

#[cfg(feature = "dpdk")]
pub mod dpdk;

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("{0}")]
    Trace(#[from] mimic_core::trace::TraceError),
    /// Corrupt records a file source skipped, reading on after them (not an input that
    /// ended early, unless the message says what ended it after them).
    #[error("{0}")]
    Skipped(mimic_core::trace::TraceError),
    #[error("interface {iface}: {what}")]
    Live { iface: String, what: String },
    #[error("DPDK: {0}")]
    Dpdk(String),
    #[error("{0}")]
    Spec(String),
}

/// Where packets come from, as given on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceSpec {
    File(std::path::PathBuf),
    Iface(String),
    Dpdk(String),
}

impl FromStr for SourceSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<SourceSpec, String> {
        let bad = || format!("source {s:?}: expected pcap:FILE, iface:NAME or dpdk:\"EAL ARGS\"");
        let (kind, rest) = s.split_once(':').ok_or_else(bad)?;
        if rest.is_empty() {
            return Err(bad());
        }
        match kind {
            "pcap" | "file" => Ok(SourceSpec::File(rest.into())),
            "iface" => Ok(SourceSpec::Iface(rest.into())),
            "dpdk" => Ok(SourceSpec::Dpdk(rest.into())),
            _ => Err(bad()),
        }
    }
}

impl fmt::Display for SourceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SourceSpec::File(p) => write!(f, "pcap:{}", p.display()),
            SourceSpec::Iface(i) => write!(f, "iface:{i}"),
            SourceSpec::Dpdk(a) => write!(f, "dpdk:{a}"),
        }
    }
}

/// Result of one [`Queue::poll`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Poll {
    /// This many frames were handed to the callback.
    Frames(usize),
    /// Nothing arrived within the poll interval (live sources).
    Idle,
    /// The source is exhausted (files).
    End,
}

/// Cumulative loss counters of a queue, as the NIC / kernel reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Drops {
    /// Dropped because the capture buffer (ring / descriptors / mbufs) was full.
    pub dropped: u64,
    /// Dropped by the interface or driver.
    pub if_dropped: u64,
}

/// The callback a queue hands frames to: (capture time, link type, wire length, bytes).
pub type FrameSink<'a> = dyn FnMut(Timestamp, LinkType, u32, &[u8]) + 'a;

/// One receive queue, owned by one worker thread.
pub trait Queue: Send {
    /// Hands the frames available now to `sink`, waiting at most about 100 ms for some.
    fn poll(&mut self, sink: &mut FrameSink<'_>) -> Result<Poll, SourceError>;
    /// Hands on whatever the queue still holds (a merge buffer) before the capture stops.
    fn flush(&mut self, _sink: &mut FrameSink<'_>) {}
    /// Loss counters since the queue was opened.
    fn drops(&mut self) -> Drops {
        Drops::default()
    }
}

/// An opened source: its queues and what the output should say about it.
pub struct Opened {
    pub queues: Vec<Box<dyn Queue>>,
    /// Link type of the frames, when known before the first one.
    pub link: Option<LinkType>,
    pub if_name: String,
    pub description: String,
    /// Drops the source can only count globally (DPDK af_packet: interface counters minus
    /// what was received); called with the total received so far.
    pub global_drops: Option<Box<dyn FnMut(u64) -> u64 + Send>>,
    /// True when packet timestamps come from the source (file, NIC) rather than the host clock.
    pub hw_timestamps: bool,
    /// Whether several workers share the traffic by a symmetric hash (so a connection stays on one).
    pub symmetric: bool,
    /// How the timestamps are made, in words, when `hw_timestamps` does not say enough
    /// (DPDK: per-packet TSC stamps, NIC clocks).
    pub timestamps: Option<String>,
    /// Per-port counters for the summary (DPDK: received, drops, merge counters per port).
    pub ports_report: Option<Box<dyn Fn() -> serde_json::Value + Send>>,
}

/// Options that shape how a source is opened.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    pub workers: usize,
    /// Bytes per frame the source must capture.
    pub snaplen: u32,
    pub filter: Option<String>,
    pub promisc: bool,
    /// Kernel ring size per handle (libpcap), bytes.
    pub buffer_bytes: usize,
}

pub fn open(spec: &SourceSpec, opts: &OpenOptions) -> Result<Opened, SourceError> {
    match spec {
        SourceSpec::File(p) => file::open(p, opts),
        SourceSpec::Iface(name) => live::open(name, opts),
        #[cfg(feature = "dpdk")]
        SourceSpec::Dpdk(args) => dpdk::open(args, opts),
        #[cfg(not(feature = "dpdk"))]
        SourceSpec::Dpdk(_) => Err(SourceError::Dpdk(
            "this mimic was built without DPDK support; scripts/demo.sh builds it in, or rebuild with `cargo build --release --features dpdk` (needs Debian's libdpdk-dev: scripts/deps.sh demo installs it)".into(),
        )),
    }
}

/// The host's real-time clock as a capture timestamp.
pub fn now() -> Timestamp {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp::from_nanos(d.as_nanos() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_specs() {
        assert_eq!(
            "pcap:/tmp/x.pcap".parse::<SourceSpec>().unwrap(),
            SourceSpec::File("/tmp/x.pcap".into())
        );
        assert_eq!(
            "iface:veth0".parse::<SourceSpec>().unwrap(),
            SourceSpec::Iface("veth0".into())
        );
        assert_eq!(
            "dpdk:--no-huge -m 256".parse::<SourceSpec>().unwrap(),
            SourceSpec::Dpdk("--no-huge -m 256".into())
        );
        assert!("eth0".parse::<SourceSpec>().is_err());
        assert!("iface:".parse::<SourceSpec>().is_err());
        assert!("tap:x".parse::<SourceSpec>().is_err());
    }
}
