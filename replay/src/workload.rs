//! A workload to replay: the connections of a mimic database (an analysis of production
//! traffic, a synthetic workload, or an earlier replay) with what the replay needs of each.

use std::collections::HashMap;
use std::path::Path;

use mimic_core::db::{get_meta, open_existing, DbError};
use mimic_core::schema::{ConnectionRow, ExchangeRow, TableRow};
use rusqlite::Connection;
use serde::Serialize;

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("{path}: {source}")]
    Sql {
        path: String,
        source: rusqlite::Error,
    },
    /// Nothing left to replay; `why` says what left nothing.
    #[error("{path}: no connection to replay ({why})")]
    Empty { path: String, why: String },
}

/// Which connections of the database to replay.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Select {
    /// Complete connections (handshake, termination, no holes) with at least one exchange.
    Complete,
    /// Every connection with at least one exchange.
    All,
}

impl std::str::FromStr for Select {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "complete" => Ok(Select::Complete),
            "all" => Ok(Select::All),
            _ => Err(format!("'{s}': --select takes complete or all")),
        }
    }
}

impl std::fmt::Display for Select {
    /// The `--select` value, as [`Select::from_str`](std::str::FromStr) reads it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Select::Complete => "complete",
            Select::All => "all",
        })
    }
}

/// When the client emulator sends each request of a connection.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestTiming {
    /// Open loop: at its recorded time relative to the connection's start, but never before
    /// the previous response has arrived and the recorded think time has passed (a client
    /// does not ask for the next object before it has the last one).
    #[default]
    Recorded,
    /// Closed loop: the recorded think time after the previous response arrived.
    Think,
}

impl std::str::FromStr for RequestTiming {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "recorded" => Ok(RequestTiming::Recorded),
            "think" => Ok(RequestTiming::Think),
            _ => Err(format!("'{s}': --request-timing takes recorded or think")),
        }
    }
}

impl std::fmt::Display for RequestTiming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RequestTiming::Recorded => "recorded",
            RequestTiming::Think => "think",
        })
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Close {
    /// The client closes with FIN.
    ClientFin,
    /// The client closes with RST (e.g. Windows after the response).
    ClientRst,
    /// The server closes with FIN after the last response.
    ServerFin,
    /// The server closes with RST.
    ServerRst,
}

#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct ExchangeSpec {
    pub seq: u32,
    pub req_bytes: u64,
    pub resp_bytes: u64,
    pub response_delay_us: u64,
    pub query_delay_us: u64,
    /// Response bytes written before the query delay.
    pub header_bytes: u64,
    /// The client's pause before this request: after the previous response, or for the first
    /// request after the connection is established.
    pub think_time_us: u64,
    /// The request's first packet relative to the connection's start (`t_start_us`), as the
    /// capture point saw both; None when not recorded.
    pub offset_us: Option<u64>,
    /// How long the original client's receive window stayed at zero while the server still
    /// had this response to send (it stopped reading), µs; 0 when it read at once.
    #[serde(default)]
    pub zero_window_us: u64,
    /// Response bytes the original client had acknowledged when its window first closed.
    #[serde(default)]
    pub zero_window_at_bytes: u64,
    /// Every interval the original client's window stayed closed during this response, in
    /// order (`exchanges.zero_window_stalls`; from the two columns above, one stall, where a
    /// database before migration 8 has no list).
    #[serde(default)]
    pub stalls: Vec<Stall>,
    /// The rate the original client read this response at while its window was open, where
    /// its window showed it reading slower than the data came (`exchanges.read_rate_bps`),
    /// TCP payload bits per second.
    #[serde(default)]
    pub read_rate_bps: Option<f64>,
    /// That rate came from the original's ACK clock (`exchanges.read_rate_by` `ack_clock`: its
    /// window stayed open, but its ACKs fell behind what its path delivered), not from its
    /// window. Replayed alike; counted apart.
    #[serde(default)]
    pub read_rate_by_ack_clock: bool,
    /// The original client's advertised window across this response, in response order
    /// (`exchanges.rwin_profile`): the replay's client holds its own at most at the
    /// original's at each point. Empty: not recorded (left to the client's kernel).
    #[serde(default)]
    pub rwin_profile: Vec<WindowPoint>,
}

/// A point of the original client's window profile: from `at_bytes` of the response on (its
/// bytes acknowledged), the client advertised `window_bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct WindowPoint {
    pub at_bytes: u64,
    pub window_bytes: u64,
}

impl ExchangeSpec {
    /// The window the original client advertised with `at` bytes of this response
    /// acknowledged, as a bound for the replay's client: between two points of the profile
    /// where it shrank, the straight line from one to the other (a window that shrinks as
    /// the data comes); where it grew, the larger, next point's (a kernel raises its window
    /// a little with each segment once the bound allows, so a bound that only rose at each
    /// point would hold it below the original's all the way); the first point's before it,
    /// the last's after. None without a profile.
    pub fn window_at(&self, at: u64) -> Option<u64> {
        let p = &self.rwin_profile;
        let k = p.partition_point(|w| w.at_bytes <= at);
        let a = p.get(k.saturating_sub(1))?;
        let Some(b) = p.get(k).filter(|_| k > 0) else {
            return Some(a.window_bytes);
        };
        if b.window_bytes >= a.window_bytes {
            return Some(b.window_bytes);
        }
        let span = b.at_bytes.saturating_sub(a.at_bytes).max(1) as f64;
        let f = (at.saturating_sub(a.at_bytes) as f64 / span).min(1.0);
        let drop = (a.window_bytes - b.window_bytes) as f64 * f;
        Some(a.window_bytes - drop as u64)
    }
}

/// One interval the original client's window stayed closed during a response.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Stall {
    /// Response bytes the client had acknowledged when its window closed.
    pub at_bytes: u64,
    /// How long it stayed closed, µs.
    pub closed_us: u64,
}

/// Parses a list of `A:B` pairs of whole numbers separated by spaces (column `column`, whose
/// pairs are named `form` in an error).
fn parse_pairs(text: &str, column: &str, form: &str) -> Result<Vec<(u64, u64)>, String> {
    text.split_whitespace()
        .map(|pair| {
            let bad = || format!("{column}: {pair:?} is not {form}");
            let (a, b) = pair.split_once(':').ok_or_else(bad)?;
            let num = |v: &str| v.parse::<u64>().map_err(|_| bad());
            Ok((num(a)?, num(b)?))
        })
        .collect()
}

/// Parses `exchanges.zero_window_stalls` (`AT:US` pairs separated by spaces).
pub fn parse_stalls(text: &str) -> Result<Vec<Stall>, String> {
    Ok(parse_pairs(text, "zero_window_stalls", "AT:US")?
        .into_iter()
        .map(|(at_bytes, closed_us)| Stall {
            at_bytes,
            closed_us,
        })
        .collect())
}

/// Parses `exchanges.rwin_profile` (`AT:BYTES` pairs separated by spaces).
pub fn parse_window_profile(text: &str) -> Result<Vec<WindowPoint>, String> {
    Ok(parse_pairs(text, "rwin_profile", "AT:BYTES")?
        .into_iter()
        .map(|(at_bytes, window_bytes)| WindowPoint {
            at_bytes,
            window_bytes,
        })
        .collect())
}

#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct ConnSpec {
    pub orig_id: i64,
    /// The original client's address (pools bandwidth estimates across its connections).
    pub client_ip: Option<String>,
    /// Start of the connection at the capture point (the SYN, or the first packet), µs.
    pub t_start_us: i64,
    pub min_rtt_us: Option<i64>,
    /// The handshake's round trip at the capture point (`hs_rtt_us`: SYN to the client's ACK
    /// of the SYN-ACK, what the original server's first RTT sample was); None where it is not
    /// known or a SYN or SYN-ACK was sent again (then the server took no sample from it).
    #[serde(default)]
    pub hs_rtt_us: Option<i64>,
    /// The largest downstream (data → ACK) RTT sample the database kept (`rtt_samples` of
    /// kind `data`): min RTT plus the deepest queue the bottleneck showed.
    pub max_rtt_us: Option<i64>,
    /// Bottleneck rate at the IP layer, bits/s.
    pub bw_bps: Option<f64>,
    /// Bandwidth samples behind `bw_bps` (`bw_samples`); 0: not recorded.
    #[serde(default)]
    pub bw_samples: u32,
    /// Random (i.i.d.) loss to emulate on the downstream pipe: the database's
    /// `loss_random_down` (loss the bottleneck queue does not explain), else `loss_rate_down`.
    pub loss_rate_down: f64,
    /// Delayed-ACK policy of the client: ACK every `every` segments, or after `timeout_us`.
    pub delack_every: Option<u32>,
    pub delack_timeout_us: Option<i64>,
    pub rwin_bytes: Option<u64>,
    /// The largest window the original client advertised (`rwin_max_bytes`): its window grew
    /// past `rwin_bytes` (Linux autotuning). None: not recorded (databases before migration 6).
    #[serde(default)]
    pub rwin_max_bytes: Option<u64>,
    /// The downstream bottleneck queue the original's transmissions showed, packets
    /// (`queue_down_pkts`), pooled over its client's connections before a replay
    /// (`orchestrate::queues`); None: not known (no rate, or an older database).
    #[serde(default)]
    pub queue_down_pkts: Option<u32>,
    /// The queue overflowed at `queue_down_pkts` (`queue_down_full`): that is its length, not
    /// only a lower bound.
    #[serde(default)]
    pub queue_down_full: bool,
    /// How much earlier than a serializing link the original's bottleneck delivered packets
    /// that met a short queue, in units of their serialization (`shaper_lead_down`: about 0 a
    /// store-and-forward link, about 1 a token bucket); None: not measured (no rate, nothing
    /// slow enough, or an older database).
    #[serde(default)]
    pub shaper_lead_down: Option<f64>,
    pub mss_client: Option<u16>,
    pub server_port: u16,
    pub close: Close,
    pub exchanges: Vec<ExchangeSpec>,
}

impl ConnSpec {
    /// A connection with nothing measured (no RTT, rate, loss, delayed ACKs, window or queue;
    /// port 80, closed by the client, no exchanges): the base the unit tests set fields on.
    #[cfg(test)]
    pub(crate) fn bare(orig_id: i64) -> ConnSpec {
        ConnSpec {
            orig_id,
            client_ip: None,
            t_start_us: 0,
            min_rtt_us: None,
            hs_rtt_us: None,
            max_rtt_us: None,
            bw_bps: None,
            bw_samples: 0,
            loss_rate_down: 0.0,
            delack_every: None,
            delack_timeout_us: None,
            rwin_bytes: None,
            rwin_max_bytes: None,
            queue_down_pkts: None,
            queue_down_full: false,
            shaper_lead_down: None,
            mss_client: None,
            server_port: 80,
            close: Close::ClientFin,
            exchanges: Vec::new(),
        }
    }
}

impl ExchangeSpec {
    /// The first exchange of a connection: a 100-byte request and a `resp_bytes` response sent
    /// at once, no think time, the client reading at once: the base the unit tests set fields
    /// on.
    #[cfg(test)]
    pub(crate) fn bare(resp_bytes: u64) -> ExchangeSpec {
        ExchangeSpec {
            seq: 0,
            req_bytes: 100,
            resp_bytes,
            response_delay_us: 0,
            query_delay_us: 0,
            header_bytes: 0,
            think_time_us: 0,
            offset_us: None,
            zero_window_us: 0,
            zero_window_at_bytes: 0,
            stalls: Vec::new(),
            read_rate_bps: None,
            read_rate_by_ack_clock: false,
            rwin_profile: Vec::new(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Workload {
    pub source: String,
    pub role: Option<String>,
    pub conns: Vec<ConnSpec>,
    /// Connections of the database left out by `select`.
    pub skipped: u64,
}

/// Default delayed-ACK timeout when a client delays ACKs but no timer was measured (Windows'
/// 200 ms; Monkey's clients were mostly Windows).
pub const DEFAULT_DELACK_TIMEOUT_US: i64 = 200_000;

pub fn load(path: &Path, select: Select, limit: Option<usize>) -> Result<Workload, WorkloadError> {
    let c = open_existing(path)?;
    let p = path.display().to_string();
    let sq = |source| WorkloadError::Sql {
        path: p.clone(),
        source,
    };
    let role = get_meta(&c, "role").map_err(sq)?;
    let total: i64 = c
        .query_row("SELECT count(*) FROM connections", [], |r| r.get(0))
        .map_err(sq)?;
    let filter = match select {
        Select::Complete => "WHERE complete = 1 AND exchanges > 0",
        Select::All => "WHERE exchanges > 0",
    };
    // the columns come from the contract's one list (ConnectionRow); only the largest data
    // RTT sample is an aggregate of its own
    let max_data_rtt = max_data_rtts(&c).map_err(sq)?;
    let mut st = c
        .prepare(&format!(
            "{} {filter} ORDER BY coalesce(t_syn, t_first), id",
            ConnectionRow::TABLE.select_sql()
        ))
        .map_err(sq)?;
    // a connection whose values no capture can give (a database damaged or edited by hand) is
    // a corrupt record: counted, named and skipped, never turned into a pipe whose delay
    // wrapped around or whose loss was quietly cut to 100%
    let mut selected = 0usize;
    let mut implausible = Vec::new();
    let mut conns: Vec<ConnSpec> = Vec::new();
    for row in st.query_map([], ConnectionRow::read).map_err(sq)? {
        selected += 1;
        let r = match row {
            Ok(r) => r,
            // a value no reader can take (text that is not UTF-8): the same kind of corrupt
            // record, counted and skipped
            Err(e) => match mimic_core::schema::bad_read(&e) {
                Some(b) => {
                    implausible.push(b.brief("connection"));
                    continue;
                }
                None => return Err(sq(e)),
            },
        };
        match implausible_values(&r) {
            Some(why) => implausible.push(format!("connection {}: {why}", r.id)),
            None => conns.push(conn_spec(r, &max_data_rtt)),
        }
    }
    if !implausible.is_empty() {
        tracing::warn!(
            "{p}: {} connections skipped for values no capture gives (a damaged or edited \
             database), e.g. {}",
            implausible.len(),
            implausible[0]
        );
    }
    if let Some(n) = limit {
        conns.truncate(n);
    }
    let (bad_stalls, bad_profiles) = load_exchanges(&c, &mut conns).map_err(sq)?;
    if bad_stalls > 0 {
        tracing::warn!(
            "{p}: {bad_stalls} exchanges with an unreadable zero_window_stalls list (not AT:US \
             pairs), each replayed with its first stall only"
        );
    }
    if bad_profiles > 0 {
        tracing::warn!(
            "{p}: {bad_profiles} exchanges with an unreadable rwin_profile (not AT:BYTES \
             pairs), each replayed with its client's window left to its kernel"
        );
    }
    conns.retain(|c| !c.exchanges.is_empty());
    if conns.is_empty() {
        let why = if total == 0 {
            "the database has no connections".to_string()
        } else if limit == Some(0) {
            "--limit 0".to_string()
        } else if selected > 0 && implausible.len() == selected {
            format!(
                "each of the {selected} selected has values no capture gives, e.g. {}",
                implausible[0]
            )
        } else if selected > 0 {
            format!("none of the {selected} selected has an exchange in `exchanges`")
        } else {
            match select {
                Select::Complete => format!(
                    "none of its {total} connections is complete with at least one exchange; \
                     --select all replays incomplete ones too"
                ),
                Select::All => format!("none of its {total} connections has an exchange"),
            }
        };
        return Err(WorkloadError::Empty { path: p, why });
    }
    let skipped = total as u64 - conns.len() as u64;
    Ok(Workload {
        source: p,
        role,
        conns,
        skipped,
    })
}

/// The largest `data` RTT sample of each connection that has one.
fn max_data_rtts(c: &Connection) -> rusqlite::Result<HashMap<i64, i64>> {
    let mut st = c.prepare(
        "SELECT conn_id, max(rtt_us) FROM rtt_samples WHERE kind = 'data' GROUP BY conn_id",
    )?;
    let rows = st.query_map([], |r| Ok((r.get(0)?, r.get::<_, Option<i64>>(1)?)))?;
    rows.filter_map(|r| r.map(|(id, max)| max.map(|m| (id, m))).transpose())
        .collect()
}

/// The longest one-way delay, RTT or delayed-ACK timer a replay takes from a database (µs):
/// an hour, as for a pipe table's delays.
const MAX_PLAUSIBLE_US: i64 = 3_600_000_000;

/// The fastest bandwidth a replay takes from a database: a pipe's fastest rate.
const MAX_PLAUSIBLE_BPS: f64 = mimic_netemu::units::MAX_RATE_BPS;

/// Why a connection's values cannot have come from a capture, if they cannot: an RTT or
/// delayed-ACK timer below zero or over an hour, a loss rate outside 0–1, a bandwidth that is
/// not a positive number or above [`MAX_PLAUSIBLE_BPS`].
fn implausible_values(r: &ConnectionRow) -> Option<String> {
    let us = |name: &str, v: Option<i64>| match v {
        Some(v) if !(0..=MAX_PLAUSIBLE_US).contains(&v) => {
            Some(format!("{name} {v} is not between 0 and an hour"))
        }
        _ => None,
    };
    let rate = |name: &str, v: Option<f64>| match v {
        Some(v) if !(0.0..=1.0).contains(&v) => Some(format!("{name} {v} is not between 0 and 1")),
        _ => None,
    };
    us("min_rtt_us", r.min_rtt_us)
        .or_else(|| us("hs_rtt_us", r.hs_rtt_us))
        .or_else(|| us("delack_timeout_us", r.delack_timeout_us))
        .or_else(|| rate("loss_random_down", r.loss_random_down))
        .or_else(|| rate("loss_rate_down", r.loss_rate_down))
        .or_else(|| match r.bw_bps {
            Some(b) if !(b.is_finite() && b > 0.0) => {
                Some(format!("bw_bps {b} is not a positive number"))
            }
            Some(b) if b > MAX_PLAUSIBLE_BPS => Some(format!(
                "bw_bps {b:e} is above 10 Tbit/s, faster than any link a capture measures"
            )),
            _ => None,
        })
}

/// A connection of the database as the replay plays it (its exchanges come later); one that
/// [`implausible_values`] passed.
fn conn_spec(r: ConnectionRow, max_data_rtt: &HashMap<i64, i64>) -> ConnSpec {
    let close = match (r.termination.as_ref(), r.closed_by.as_deref()) {
        ("rst_after_response" | "rst_abort", Some("server")) => Close::ServerRst,
        ("rst_after_response" | "rst_abort", _) => Close::ClientRst,
        ("fin", Some("server")) => Close::ServerFin,
        _ => Close::ClientFin,
    };
    ConnSpec {
        orig_id: r.id,
        client_ip: Some(r.client_ip.into_owned()),
        t_start_us: r.t_syn.unwrap_or(r.t_first),
        min_rtt_us: r.min_rtt_us,
        // a handshake RTT counts only where neither side resent its SYN
        hs_rtt_us: r
            .hs_rtt_us
            .filter(|_| r.syn_retx == 0 && r.synack_retx == 0),
        max_rtt_us: max_data_rtt.get(&r.id).copied(),
        bw_bps: r.bw_bps,
        bw_samples: u32::try_from(r.bw_samples).unwrap_or(0),
        // within 0–1: [`implausible_values`] left out the connections whose rates are not
        loss_rate_down: r.loss_random_down.or(r.loss_rate_down).unwrap_or(0.0),
        delack_every: (r.delack_policy == "delayed").then_some(2),
        delack_timeout_us: r.delack_timeout_us,
        rwin_bytes: r.rwin_bytes.map(|v| v.max(0) as u64),
        rwin_max_bytes: r.rwin_max_bytes.map(|v| v.max(0) as u64),
        queue_down_pkts: r
            .queue_down_pkts
            .and_then(|v| u32::try_from(v).ok())
            .filter(|v| *v > 0),
        queue_down_full: r.queue_down_full == Some(1),
        shaper_lead_down: r.shaper_lead_down.filter(|v| v.is_finite()),
        mss_client: r.mss_client.and_then(|v| u16::try_from(v).ok()),
        server_port: r.server_port as u16,
        close,
        exchanges: Vec::new(),
    }
}

/// Reads every connection's exchanges; returns how many had a `zero_window_stalls` list that
/// is not `AT:US` pairs (each replayed with the one stall its two older columns give, and
/// named in a warning), and how many an `rwin_profile` that is not `AT:BYTES` pairs (each
/// replayed without one, named in a warning).
fn load_exchanges(c: &Connection, conns: &mut [ConnSpec]) -> rusqlite::Result<(u64, u64)> {
    let mut st = c.prepare(&format!(
        "{} WHERE conn_id = ?1 ORDER BY seq",
        ExchangeRow::TABLE.select_sql()
    ))?;
    let mut bad_stalls = 0u64;
    let mut bad_profiles = 0u64;
    for conn in conns.iter_mut() {
        let t0 = conn.t_start_us;
        let rows = st.query_map([conn.orig_id], |r| {
            let e = ExchangeRow::read(r)?;
            let nn = |v: i64| v.max(0) as u64;
            let (stalls, bad) = exchange_stalls(&e);
            if let Some(why) = &bad {
                tracing::warn!(
                    "exchange {} of connection {}: {why}; replayed with its first stall only",
                    e.seq,
                    e.conn_id
                );
            }
            let (rwin_profile, bad_profile) = exchange_profile(&e);
            if let Some(why) = &bad_profile {
                tracing::warn!(
                    "exchange {} of connection {}: {why}; its client's window is left to its \
                     kernel",
                    e.seq,
                    e.conn_id
                );
            }
            Ok((
                ExchangeSpec {
                    seq: e.seq as u32,
                    req_bytes: nn(e.req_bytes),
                    resp_bytes: nn(e.resp_bytes),
                    response_delay_us: nn(e.response_delay_us.unwrap_or(0)),
                    query_delay_us: nn(e.query_delay_us.unwrap_or(0)),
                    header_bytes: nn(e.header_bytes.unwrap_or(e.resp_bytes)),
                    think_time_us: nn(e.think_time_us.unwrap_or(0)),
                    offset_us: e.t_req_first.and_then(|t| u64::try_from(t - t0).ok()),
                    zero_window_us: nn(e.zero_window_us.unwrap_or(0)),
                    zero_window_at_bytes: nn(e.zero_window_at_bytes.unwrap_or(0)),
                    stalls,
                    read_rate_bps: e.read_rate_bps.filter(|r| r.is_finite() && *r > 0.0),
                    read_rate_by_ack_clock: e.read_rate_by.as_deref() == Some("ack_clock"),
                    rwin_profile,
                },
                bad.is_some(),
                bad_profile.is_some(),
            ))
        })?;
        conn.exchanges = Vec::new();
        for row in rows {
            let (e, bad, bad_profile) = row?;
            bad_stalls += u64::from(bad);
            bad_profiles += u64::from(bad_profile);
            conn.exchanges.push(e);
        }
        for e in &mut conn.exchanges {
            e.header_bytes = e.header_bytes.min(e.resp_bytes);
            e.zero_window_at_bytes = e.zero_window_at_bytes.min(e.resp_bytes);
            let resp = e.resp_bytes;
            e.stalls.retain(|s| s.closed_us > 0 && s.at_bytes < resp);
            // a profile's points in response order, inside the response, each an open window
            e.rwin_profile
                .retain(|w| w.window_bytes > 0 && w.at_bytes < resp);
            e.rwin_profile.sort_by_key(|w| w.at_bytes);
            if e.header_bytes == e.resp_bytes {
                e.query_delay_us = 0;
            }
        }
    }
    Ok((bad_stalls, bad_profiles))
}

/// An exchange's window profile: its `rwin_profile` pairs; none where it has none, or where
/// they are not `AT:BYTES` pairs (then with why: a corrupt record, counted, and its client's
/// window left to its kernel as in a database before migration 10).
fn exchange_profile(e: &ExchangeRow) -> (Vec<WindowPoint>, Option<String>) {
    match e.rwin_profile.as_deref().map(parse_window_profile) {
        Some(Ok(points)) => (points, None),
        Some(Err(why)) => (Vec::new(), Some(why)),
        None => (Vec::new(), None),
    }
}

/// An exchange's stalls: its `zero_window_stalls` list; else — in a database before migration
/// 8, or where the list is not `AT:US` pairs (then with why, a corrupt record counted and
/// replayed as well as the rest of the row allows) — the one stall its two older columns give
/// (`zero_window_us` at `zero_window_at_bytes`).
fn exchange_stalls(e: &ExchangeRow) -> (Vec<Stall>, Option<String>) {
    let nn = |v: i64| v.max(0) as u64;
    let first = || match (e.zero_window_us, e.zero_window_at_bytes) {
        (Some(us), Some(at)) if us > 0 => vec![Stall {
            at_bytes: nn(at),
            closed_us: nn(us),
        }],
        _ => Vec::new(),
    };
    match e.zero_window_stalls.as_deref().map(parse_stalls) {
        Some(Ok(list)) => (list, None),
        Some(Err(why)) => (first(), Some(why)),
        None => (first(), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `exchanges.zero_window_stalls` is read back as written; what is not `AT:US` is an
    /// error naming the pair, not a panic or a silently dropped stall.
    #[test]
    fn stalls_are_parsed_and_bad_ones_named() {
        assert_eq!(
            parse_stalls("78058:250000 158922:360000").unwrap(),
            vec![
                Stall {
                    at_bytes: 78_058,
                    closed_us: 250_000
                },
                Stall {
                    at_bytes: 158_922,
                    closed_us: 360_000
                },
            ]
        );
        assert_eq!(parse_stalls("").unwrap(), vec![]);
        for bad in ["78058", "78058:x", "-1:5", "1:2:3"] {
            let e = parse_stalls(bad).unwrap_err();
            assert!(e.contains("zero_window_stalls") && e.contains(bad), "{e}");
        }
    }

    /// A corrupt stall list costs its exchange the list, not the workload: the one stall of
    /// the two older columns is replayed instead, and the reason is given for the count.
    #[test]
    fn an_unreadable_stall_list_falls_back_to_the_first_stall() {
        let row = |list: Option<&'static str>| ExchangeRow {
            zero_window_us: Some(250_000),
            zero_window_at_bytes: Some(78_058),
            zero_window_stalls: list.map(Into::into),
            ..ExchangeRow::default()
        };
        let first = vec![Stall {
            at_bytes: 78_058,
            closed_us: 250_000,
        }];
        let (stalls, bad) = exchange_stalls(&row(Some("78058:x")));
        assert_eq!(stalls, first);
        assert!(bad.is_some_and(|w| w.contains("78058:x")));
        assert_eq!(exchange_stalls(&row(None)), (first, None));
        let (stalls, bad) = exchange_stalls(&row(Some("78058:250000 158922:360000")));
        assert_eq!((stalls.len(), bad), (2, None));
    }

    fn points(list: &[(u64, u64)]) -> Vec<WindowPoint> {
        list.iter()
            .map(|&(at_bytes, window_bytes)| WindowPoint {
                at_bytes,
                window_bytes,
            })
            .collect()
    }

    /// `exchanges.rwin_profile` is read back as written; a list that is not `AT:BYTES` pairs
    /// is named, and its exchange replays without a profile (the rest of the row as it is).
    #[test]
    fn window_profiles_are_parsed_and_bad_ones_named() {
        assert_eq!(
            parse_window_profile("258:64512 11842:56320").unwrap(),
            points(&[(258, 64_512), (11_842, 56_320)])
        );
        for bad in ["258", "258:x", "-1:5", "1:2:3"] {
            let e = parse_window_profile(bad).unwrap_err();
            assert!(e.contains("rwin_profile") && e.contains(bad), "{e}");
        }
        let row = |list: Option<&'static str>| ExchangeRow {
            rwin_profile: list.map(Into::into),
            ..ExchangeRow::default()
        };
        let (p, bad) = exchange_profile(&row(Some("258:64512 11842:x")));
        assert!(p.is_empty());
        assert!(bad.is_some_and(|w| w.contains("11842:x")));
        assert_eq!(exchange_profile(&row(None)), (Vec::new(), None));
        let (p, bad) = exchange_profile(&row(Some("258:64512 11842:56320")));
        assert_eq!((p.len(), bad), (2, None));
    }

    /// The bound a replay's client takes from a profile: the first point's window before it;
    /// where the window shrank, the straight line between two points; where it grew, the next
    /// point's at once; the last point's after it. No profile, no bound.
    #[test]
    fn the_window_bound_follows_the_profile() {
        let mut e = ExchangeSpec::bare(200_000);
        assert_eq!(e.window_at(0), None);
        e.rwin_profile = points(&[
            (1_000, 64_000),
            (11_000, 44_000),
            (21_000, 54_000),
            (31_000, 80_000),
        ]);
        assert_eq!(e.window_at(0), Some(64_000));
        assert_eq!(e.window_at(1_000), Some(64_000));
        // shrinking: halfway from 64,000 to 44,000
        assert_eq!(e.window_at(6_000), Some(54_000));
        assert_eq!(e.window_at(11_000), Some(54_000));
        // growing: the next point's
        assert_eq!(e.window_at(11_001), Some(54_000));
        assert_eq!(e.window_at(21_000), Some(80_000));
        assert_eq!(e.window_at(31_000), Some(80_000));
        assert_eq!(e.window_at(150_000), Some(80_000));
    }
}
