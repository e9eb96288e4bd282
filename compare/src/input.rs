//! Reading one mimic database into what a comparison needs: its response times, the
//! connections left out and why, the inferred population (RTT, bandwidth, loss, server delays)
//! and, for a replay, its `replay_map`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use mimic_core::schema::{ConnectionRow, ExchangeRow, ReplayMapRow, TableRow, Value};
use rusqlite::Connection;

use crate::CompareError;

/// One connection as the per-connection (paired) analysis sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnFacts {
    pub response_time_us: Option<f64>,
    pub bw_bps: Option<f64>,
    pub min_rtt_us: Option<f64>,
    /// Request/response exchanges and unique downstream bytes: what a replay reproduces, so
    /// they tell whether a replay_map really pairs with this database.
    pub exchanges: i64,
    pub bytes_down: i64,
}

/// A row of `replay_map`.
#[derive(Debug, Clone)]
pub(crate) struct MapRow {
    pub orig_conn_id: i64,
    pub replay_conn_id: Option<i64>,
    pub status: String,
    pub failure: Option<String>,
}

/// A sorted sample of one population metric plus how many connections (or exchanges) had no
/// value for it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Metric {
    pub values: Vec<f64>,
    pub missing: u64,
}

/// Everything a report uses from one database.
#[derive(Debug, Clone)]
pub(crate) struct Input {
    pub path: PathBuf,
    pub meta: BTreeMap<String, String>,
    pub connections: u64,
    /// Ascending response times (µs) of the connections that have one.
    pub response_times_us: Vec<f64>,
    /// Connections without a response time, by reason, most frequent first.
    pub excluded: Vec<(String, u64)>,
    pub min_rtt_us: Metric,
    pub bw_bps: Metric,
    pub loss_rate_down: Metric,
    pub response_delay_us: Metric,
    pub query_delay_us: Metric,
    pub exchanges: u64,
    /// By `connections.id`.
    pub by_id: HashMap<i64, ConnFacts>,
    /// Ids of the connection rows left out as damaged (a value no reader can take): not in
    /// `by_id`, and a replay_map row naming one is unpaired for that reason, not foreign.
    pub damaged_ids: HashSet<i64>,
    /// `None` when the database has no `replay_map` table.
    pub replay_map: Option<Vec<MapRow>>,
}

impl Input {
    pub fn role(&self) -> Option<&str> {
        self.meta.get("role").map(String::as_str)
    }
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// Opens and reads `path`; an input without a single response time is an error.
pub(crate) fn load(path: &Path) -> Result<Input, CompareError> {
    let conn = mimic_core::db::open_existing(path)?;
    let q = |source| CompareError::Query {
        path: path.to_path_buf(),
        source,
    };
    let meta = read_meta(&conn).map_err(q)?;

    let mut by_id = HashMap::new();
    let mut rts = Vec::new();
    let mut excluded: BTreeMap<String, u64> = BTreeMap::new();
    let (mut min_rtt, mut bw, mut loss) = (Metric::default(), Metric::default(), Metric::default());
    let mut connections = 0u64;
    // rows left out as damaged: the first one named, and how many
    let mut damaged: (Option<String>, u64) = (None, 0);
    let mut damaged_ids = HashSet::new();
    // response times left out as implausible: the first one named, and how many
    let mut implausible: (Option<String>, u64) = (None, 0);
    let has_exchanges = table_exists(&conn, "exchanges").map_err(q)?;
    {
        // the span of a connection's own exchanges (first request byte to last response
        // byte), which its response time is measured over: by the primary key's index
        let mut span_stmt = if has_exchanges {
            Some(
                conn.prepare(
                    "SELECT max(t_resp_last) - min(t_req_first) FROM exchanges WHERE conn_id = ?1",
                )
                .map_err(q)?,
            )
        } else {
            None
        };
        let mut stmt = conn
            .prepare(ConnectionRow::TABLE.select_sql().as_str())
            .map_err(q)?;
        let mut rows = stmt.query([]).map_err(q)?;
        while let Some(r) = rows.next().map_err(q)? {
            connections += 1;
            let c = match ConnectionRow::read(r) {
                Ok(c) => c,
                // a value no reader can take (text that is not UTF-8: the database was changed
                // by hand or is damaged): a corrupt record, left out and counted with the
                // first one named, the rest compared
                Err(e) => match mimic_core::schema::bad_read(&e) {
                    Some(b) => {
                        if damaged.0.is_none() {
                            damaged.0 = Some(b.brief("connection"));
                        }
                        damaged.1 += 1;
                        // the key is an INTEGER column (STRICT): readable when another is not
                        if let Ok(id) = r.get::<_, i64>(0) {
                            damaged_ids.insert(id);
                        }
                        continue;
                    }
                    None => return Err(q(e)),
                },
            };
            // A negative response time would be a writer's bug; count it as unusable.
            let mut rt = c.response_time_us.filter(|&v| v >= 0);
            // One over an hour is kept only where the connection's exchanges span it: a
            // connection kept busy can last hours, an edited row (9223372036854775807 µs,
            // "p50 +2937239315591440%") cannot
            let mut implausible_rt = false;
            if let Some(v) = rt.filter(|&v| v > MAX_UNCHECKED_US) {
                // REAL where edited timestamps overflow the subtraction
                let span: Option<f64> = match &mut span_stmt {
                    Some(st) => st.query_row([c.id], |r| r.get(0)).map_err(q)?,
                    None => None,
                };
                if !span.is_some_and(|s| v as f64 <= s + SPAN_SLACK_US as f64) {
                    if implausible.0.is_none() {
                        implausible.0 = Some(format!("connection {}: {v} µs", c.id));
                    }
                    implausible.1 += 1;
                    implausible_rt = true;
                    rt = None;
                }
            }
            let rt = rt.map(|v| v as f64);
            match rt {
                Some(v) => rts.push(v),
                // counted above, under a reason of its own
                None if implausible_rt => {}
                None => {
                    *excluded
                        .entry(exclusion_reason(
                            c.exchanges,
                            c.prune_reason.as_deref(),
                            &c.termination,
                        ))
                        .or_default() += 1
                }
            }
            let rtt = c.min_rtt_us.filter(|&v| v >= 0).map(|v| v as f64);
            let bps = c.bw_bps.filter(|v| v.is_finite() && *v > 0.0);
            let lr = c.loss_rate_down.filter(|v| v.is_finite() && *v >= 0.0);
            push(&mut min_rtt, rtt);
            push(&mut bw, bps);
            push(&mut loss, lr);
            by_id.insert(
                c.id,
                ConnFacts {
                    response_time_us: rt,
                    bw_bps: bps,
                    min_rtt_us: rtt,
                    exchanges: c.exchanges,
                    bytes_down: c.data_bytes_down,
                },
            );
        }
    }
    if let (Some(first), n) = damaged {
        excluded.insert(
            format!("damaged (a value no reader can take, e.g. {first})"),
            n,
        );
    }
    if let (Some(first), n) = implausible {
        excluded.insert(
            format!(
                "implausible response time (over an hour, longer than the connection's \
                 exchanges span, e.g. {first}: a damaged or edited database)"
            ),
            n,
        );
    }
    if rts.is_empty() {
        // its response times are what a replay of it measures
        if meta.get("role").map(String::as_str) == Some("synth") {
            return Err(CompareError::Synth {
                path: path.to_path_buf(),
            });
        }
        return Err(CompareError::Empty {
            path: path.to_path_buf(),
            connections,
        });
    }

    let (mut rd, mut qd) = (Metric::default(), Metric::default());
    let mut exchanges = 0u64;
    if has_exchanges {
        // two columns of the largest table mimic writes (one row per exchange), not its rows
        let sql = ExchangeRow::TABLE.select_columns_sql(&["response_delay_us", "query_delay_us"]);
        let mut stmt = conn.prepare(&sql).map_err(q)?;
        let mut rows = stmt.query([]).map_err(q)?;
        while let Some(r) = rows.next().map_err(q)? {
            exchanges += 1;
            let a: Option<i64> = Value::read(r, 0).map_err(q)?;
            let b: Option<i64> = Value::read(r, 1).map_err(q)?;
            push(&mut rd, a.filter(|&v| v >= 0).map(|v| v as f64));
            push(&mut qd, b.filter(|&v| v >= 0).map(|v| v as f64));
        }
    }

    let replay_map = if table_exists(&conn, "replay_map").map_err(q)? {
        let sql = format!("{} ORDER BY orig_conn_id", ReplayMapRow::TABLE.select_sql());
        let mut stmt = conn.prepare(&sql).map_err(q)?;
        let mut rows = stmt.query([]).map_err(q)?;
        let mut map = Vec::new();
        while let Some(r) = rows.next().map_err(q)? {
            map.push(match ReplayMapRow::read(r) {
                Ok(r) => MapRow {
                    orig_conn_id: r.orig_conn_id,
                    replay_conn_id: r.replay_conn_id,
                    status: r.status.into_owned(),
                    failure: r.failure.map(|f| f.into_owned()),
                },
                // text that is not UTF-8 in status or failure (its ids are STRICT INTEGERs):
                // a corrupt record, unpaired under a status of its own and named
                Err(e) => match (mimic_core::schema::bad_read(&e), r.get::<_, i64>(0)) {
                    (Some(b), Ok(orig_conn_id)) => MapRow {
                        orig_conn_id,
                        replay_conn_id: None,
                        status: "damaged".into(),
                        // by column only, so that such rows count under one reason
                        failure: Some(format!(
                            "{} holds a value no reader can take (a damaged row)",
                            b.column
                        )),
                    },
                    _ => return Err(q(e)),
                },
            });
        }
        Some(map)
    } else {
        None
    };

    let mut excluded: Vec<(String, u64)> = excluded.into_iter().collect();
    excluded.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    for m in [&mut min_rtt, &mut bw, &mut loss, &mut rd, &mut qd] {
        m.values = sorted(std::mem::take(&mut m.values));
    }
    Ok(Input {
        path: path.to_path_buf(),
        meta,
        connections,
        response_times_us: sorted(rts),
        excluded,
        min_rtt_us: min_rtt,
        bw_bps: bw,
        loss_rate_down: loss,
        response_delay_us: rd,
        query_delay_us: qd,
        exchanges,
        by_id,
        damaged_ids,
        replay_map,
    })
}

/// The longest response time (µs) taken without a look at the connection's exchanges: an
/// hour, the bound `mimic replay` puts on a delay no capture gives (`MAX_PLAUSIBLE_US` in
/// replay/src/workload.rs; compare does not depend on the replay crate).
const MAX_UNCHECKED_US: i64 = 3_600_000_000;

/// How much longer than its exchanges' span a response time may be: the two are rounded to
/// the microsecond apart.
const SPAN_SLACK_US: i64 = 1_000;

fn push(m: &mut Metric, v: Option<f64>) {
    match v {
        Some(v) => m.values.push(v),
        None => m.missing += 1,
    }
}

/// Why a connection has no response time, in words an operator recognises.
fn exclusion_reason(exchanges: i64, prune: Option<&str>, termination: &str) -> String {
    if exchanges == 0 {
        return match termination {
            "rst_abort" => "no request/response exchange (reset)".into(),
            _ => "no request/response exchange".into(),
        };
    }
    match prune {
        Some(p) if !p.is_empty() => format!("incomplete ({p})"),
        _ => "response time not measurable".into(),
    }
}

fn read_meta(conn: &Connection) -> rusqlite::Result<BTreeMap<String, String>> {
    let mut stmt = conn.prepare("SELECT key, value FROM meta")?;
    let rows = stmt.query_map([], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, Option<String>>(1)?))
    })?;
    let mut out = BTreeMap::new();
    for row in rows {
        let (k, v) = row?;
        out.insert(k, v.unwrap_or_default());
    }
    Ok(out)
}

fn table_exists(conn: &Connection, name: &str) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = ?1",
        [name],
        |r| r.get(0),
    )
}
