//! What the analyzer emits: one [`ConnectionRecord`] per TCP connection, with its exchanges and
//! the raw RTT and bandwidth samples behind the per-connection numbers. Field names follow the
//! `connections` / `exchanges` / `rtt_samples` / `bw_samples` tables of the schema.

use std::net::IpAddr;

use mimic_core::Timestamp;
use serde::Serialize;

#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ServerBy {
    /// The other side sent a SYN without ACK.
    Syn,
    /// This side answered with SYN-ACK.
    Synack,
    /// `--server-port` named its port.
    Port,
    /// `--server-net` contains its address.
    Net,
    /// No handshake and no hint: the well-known (or lower) port.
    Guess,
}

/// Where a connection's bandwidth estimate came from.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BwSource {
    /// Packet pairs of the connection's own ACKs (no train qualified).
    Pairs,
    /// Trains of the connection's own ACKs (the median of the trains).
    Trains,
    /// No sample qualified: no estimate.
    None,
}

impl BwSource {
    pub fn as_str(self) -> &'static str {
        match self {
            BwSource::Pairs => "pairs",
            BwSource::Trains => "trains",
            BwSource::None => "none",
        }
    }
}

/// What a bandwidth sample measured.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BwKind {
    /// Two consecutive advancing ACKs.
    Pair,
    /// The ACKs of a train of segments sent back to back: first to last.
    Train,
}

impl BwKind {
    pub fn as_str(self) -> &'static str {
        match self {
            BwKind::Pair => "pair",
            BwKind::Train => "train",
        }
    }
}

impl ServerBy {
    pub fn as_str(self) -> &'static str {
        match self {
            ServerBy::Syn => "syn",
            ServerBy::Synack => "synack",
            ServerBy::Port => "port",
            ServerBy::Net => "net",
            ServerBy::Guess => "guess",
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Termination {
    Fin,
    RstAfterResponse,
    RstAbort,
    None,
}

impl Termination {
    pub fn as_str(self) -> &'static str {
        match self {
            Termination::Fin => "fin",
            Termination::RstAfterResponse => "rst_after_response",
            Termination::RstAbort => "rst_abort",
            Termination::None => "none",
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DelackPolicy {
    Quick,
    Delayed,
    Unknown,
}

impl DelackPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            DelackPolicy::Quick => "quick",
            DelackPolicy::Delayed => "delayed",
            DelackPolicy::Unknown => "unknown",
        }
    }
}

/// Why a connection is not `complete`. Several can hold at once.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PruneReason {
    /// No SYN / SYN-ACK pair was captured.
    NoHandshake,
    /// Neither FIN nor RST was captured (the trace ended or the connection went idle).
    NoTermination,
    /// Some sequence range of either direction was never captured.
    SeqHoles,
    /// The connection table was full and this connection was closed early.
    Evicted,
    /// Only one direction of the connection was captured.
    OneDirection,
}

impl PruneReason {
    pub const ALL: [PruneReason; 5] = [
        PruneReason::NoHandshake,
        PruneReason::NoTermination,
        PruneReason::SeqHoles,
        PruneReason::Evicted,
        PruneReason::OneDirection,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            PruneReason::NoHandshake => "no_handshake",
            PruneReason::NoTermination => "no_termination",
            PruneReason::SeqHoles => "seq_holes",
            PruneReason::Evicted => "evicted",
            PruneReason::OneDirection => "one_direction",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Exchange {
    pub seq: u32,
    pub t_req_first: Option<Timestamp>,
    pub t_req_last: Option<Timestamp>,
    pub req_bytes: u64,
    pub t_resp_first: Option<Timestamp>,
    pub t_resp_last: Option<Timestamp>,
    pub resp_bytes: u64,
    pub response_delay_us: Option<i64>,
    pub query_delay_us: Option<i64>,
    pub header_bytes: Option<u64>,
    pub think_time_us: Option<i64>,
    pub method: Option<&'static str>,
    pub status: Option<u16>,
    /// Time the client's window stayed at zero while the server still had this response to
    /// send (µs), and the response bytes acknowledged when it first closed.
    pub zero_window_us: Option<i64>,
    pub zero_window_at_bytes: Option<u64>,
    /// Every closed interval of that time, in order: the response bytes acknowledged when the
    /// window closed and how long it stayed closed (µs).
    pub zero_window_stalls: Vec<(u64, i64)>,
    /// The rate (TCP payload bits per second) the client read this response at while its
    /// window was open, where the window showed it reading slower than the data came.
    pub read_rate_bps: Option<f64>,
    /// What showed that read rate (`exchanges.read_rate_by`).
    pub read_rate_by: Option<ReadRateBy>,
    /// The client's advertised window while this response had data outstanding, as (response
    /// bytes acknowledged, window in bytes) points: the first, then each that moved by 1/8 or
    /// more from the previous point (`exchanges.rwin_profile`).
    pub rwin_profile: Vec<(u64, u64)>,
    /// The time (µs) the server had everything it had sent of this response acknowledged
    /// and sent nothing, before its last packet (its own pauses; not stored).
    #[serde(skip)]
    pub server_idle_us: Option<i64>,
}

/// The evidence that a client read a response slower than its path brought it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadRateBy {
    /// Its advertised window closed, or drained below a quarter of its largest, while response
    /// data was outstanding.
    Window,
    /// Its window stayed open, but the response took clearly longer than the bottleneck rate
    /// and slow start allow, without loss: its ACKs fell behind what its path delivered.
    AckClock,
}

impl ReadRateBy {
    pub fn as_str(self) -> &'static str {
        match self {
            ReadRateBy::Window => "window",
            ReadRateBy::AckClock => "ack_clock",
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RttKind {
    /// SYN to the client's ACK of the SYN-ACK.
    Handshake,
    /// Server data to the client's ACK (the tap→client→tap round trip).
    Data,
    /// Client data to the server's ACK (the tap→server→tap round trip).
    Upstream,
}

impl RttKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RttKind::Handshake => "handshake",
            RttKind::Data => "data",
            RttKind::Upstream => "upstream",
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Serialize)]
pub struct RttSample {
    pub t: Timestamp,
    pub rtt_us: i64,
    pub kind: RttKind,
}

#[derive(Copy, Clone, Debug, PartialEq, Serialize)]
pub struct BwSample {
    pub t: Timestamp,
    pub bps: f64,
    pub bytes: u64,
    pub gap_us: i64,
    pub used: bool,
    pub kind: BwKind,
}

/// Everything the analyzer inferred about one TCP connection.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ConnectionRecord {
    /// Index (1-based, over all input frames in time order) of the connection's first frame:
    /// unique, and the same whatever the thread count.
    pub id: u64,
    pub client_ip: IpAddr,
    pub client_port: u16,
    pub server_ip: IpAddr,
    pub server_port: u16,
    pub vlan: Option<u16>,
    pub t_syn: Option<Timestamp>,
    pub t_first: Timestamp,
    pub t_end: Timestamp,
    pub prune: Vec<PruneReason>,
    pub server_by: ServerBy,
    pub min_rtt_us: Option<i64>,
    pub hs_rtt_us: Option<i64>,
    pub rtt_sample_count: u32,
    pub mss_client: Option<u16>,
    pub mss_server: Option<u16>,
    pub wscale_client: Option<u8>,
    pub wscale_server: Option<u8>,
    pub sack_ok: Option<bool>,
    pub ts_ok: Option<bool>,
    pub ecn_ok: Option<bool>,
    pub syn_retx: u32,
    pub synack_retx: u32,
    pub rwin_bytes: Option<u64>,
    pub rwin_syn_bytes: Option<u64>,
    /// Largest window the client advertised (scaled) once it had sent data.
    pub rwin_max_bytes: Option<u64>,
    /// The downstream bottleneck queue the server's transmissions show (packets), and whether
    /// an original was lost there (its length, not only a lower bound).
    pub queue_down_pkts: Option<u32>,
    pub queue_down_full: Option<bool>,
    /// How much earlier than a serializing link the downstream bottleneck delivered packets
    /// that met a short queue, in units of their own serialization (0: a store-and-forward
    /// link, 1: a token bucket; see `conn::shaper`).
    pub shaper_lead_down: Option<f64>,
    pub zero_window: u32,
    pub data_pkts_down: u64,
    pub data_bytes_down: u64,
    pub retx_down: u64,
    pub spurious_retx_down: u64,
    pub spurious_by: Option<&'static str>,
    pub loss_rate_down: Option<f64>,
    /// The part of the loss the bottleneck queue does not explain (what a replay adds as
    /// random loss on top of its emulated queue).
    pub loss_random_down: Option<f64>,
    pub data_pkts_up: u64,
    pub data_bytes_up: u64,
    pub retx_up: u64,
    pub fin_retx: u64,
    pub zwnd_probes: u64,
    pub dup_frames: u64,
    pub bw_bps: Option<f64>,
    pub bw_source: BwSource,
    pub delack_policy: DelackPolicy,
    pub acks_per_seg: Option<f64>,
    pub delack_timeout_us: Option<i64>,
    pub termination: Termination,
    pub closed_by: Option<&'static str>,
    pub response_time_us: Option<i64>,
    pub holes_down: u32,
    pub holes_up: u32,
    pub frames: u64,
    pub exchanges: Vec<Exchange>,
    pub rtt_samples: Vec<RttSample>,
    pub bw_samples: Vec<BwSample>,
}

impl ConnectionRecord {
    pub fn complete(&self) -> bool {
        self.prune.is_empty()
    }
    pub fn ip_version(&self) -> u8 {
        if self.client_ip.is_ipv4() {
            4
        } else {
            6
        }
    }
    /// Comma-separated prune reasons, or None when complete.
    pub fn prune_reason(&self) -> Option<String> {
        (!self.prune.is_empty()).then(|| {
            self.prune
                .iter()
                .map(|p| p.as_str())
                .collect::<Vec<_>>()
                .join(",")
        })
    }
}
