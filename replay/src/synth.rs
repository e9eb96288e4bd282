//! Synthetic workloads with known per-connection truth (`mimic synth`), written in the same
//! schema as an analysis (`meta.role = synth`), through the same row types
//! (`mimic_core::schema`). Replaying one through the lab and analyzing the
//! capture is how mimic measures its own inference against the truth.

use std::net::Ipv4Addr;
use std::path::Path;

use mimic_core::community_id::tcp_community_id;
use mimic_core::db::{index_statements, set_meta, AtomicDb, DbError};
use mimic_core::flow::Endpoint;
use mimic_core::schema::{ConnectionRow, ExchangeRow, TableRow, Text};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha12Rng;
use serde::Serialize;

#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Profile {
    /// Web search / browsing: short responses with a header and a query delay, some
    /// persistent connections, clients from dial-up to fibre.
    Web,
}

impl std::str::FromStr for Profile {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "web" => Ok(Profile::Web),
            _ => Err(format!("'{s}': the only profile is web")),
        }
    }
}

#[derive(Clone, Debug)]
pub struct SynthOptions {
    pub profile: Profile,
    pub connections: usize,
    /// New connections per second (Poisson arrivals).
    pub rate: f64,
    pub seed: u64,
    /// Largest response, bytes (keeps slow classes' replays short).
    pub max_response: u64,
}

impl Default for SynthOptions {
    fn default() -> Self {
        SynthOptions {
            profile: Profile::Web,
            connections: 300,
            rate: 10.0,
            seed: 1,
            max_response: 300_000,
        }
    }
}

/// A client population class.
#[derive(Copy, Clone, Debug, Serialize)]
pub struct Class {
    pub name: &'static str,
    pub weight: f64,
    pub bw_bps: (f64, f64),
    pub rtt_ms: (f64, f64),
    pub loss: (f64, f64),
    /// Share of clients that delay ACKs (Windows-like) rather than ACK every segment.
    pub delayed_ack_share: f64,
    pub rwin: u64,
    /// Largest response for this class (dial-up replays stay short).
    pub max_response: u64,
}

pub const WEB_CLASSES: [Class; 5] = [
    Class {
        name: "dialup",
        weight: 0.06,
        bw_bps: (28e3, 56e3),
        rtt_ms: (120.0, 300.0),
        loss: (0.0, 0.02),
        delayed_ack_share: 0.9,
        rwin: 16_384,
        max_response: 24_000,
    },
    Class {
        name: "dsl",
        weight: 0.24,
        bw_bps: (0.5e6, 6e6),
        rtt_ms: (20.0, 80.0),
        loss: (0.0, 0.01),
        delayed_ack_share: 0.7,
        rwin: 65_535,
        max_response: 150_000,
    },
    Class {
        name: "cable",
        weight: 0.25,
        bw_bps: (5e6, 50e6),
        rtt_ms: (10.0, 40.0),
        loss: (0.0, 0.005),
        delayed_ack_share: 0.5,
        rwin: 262_144,
        max_response: 300_000,
    },
    Class {
        name: "mobile",
        weight: 0.20,
        bw_bps: (1e6, 20e6),
        rtt_ms: (40.0, 150.0),
        loss: (0.005, 0.02),
        delayed_ack_share: 0.3,
        rwin: 131_072,
        max_response: 300_000,
    },
    Class {
        name: "fibre",
        weight: 0.25,
        bw_bps: (50e6, 300e6),
        rtt_ms: (2.0, 20.0),
        loss: (0.0, 0.001),
        delayed_ack_share: 0.3,
        rwin: 1_048_576,
        max_response: 300_000,
    },
];

#[derive(Clone, Debug, Serialize)]
pub struct SynthSummary {
    pub output: String,
    pub connections: usize,
    pub exchanges: usize,
    pub duration_s: f64,
    pub by_class: Vec<(String, usize)>,
}

fn uniform(rng: &mut ChaCha12Rng, (lo, hi): (f64, f64)) -> f64 {
    if hi <= lo {
        lo
    } else {
        rng.random_range(lo..hi)
    }
}

/// Log-uniform between `lo` and `hi` (rates and RTTs spread over decades).
fn log_uniform(rng: &mut ChaCha12Rng, (lo, hi): (f64, f64)) -> f64 {
    (uniform(rng, (lo.ln(), hi.ln()))).exp()
}

/// Log-normal with the given median and sigma, clamped.
fn log_normal(rng: &mut ChaCha12Rng, median: f64, sigma: f64, lo: f64, hi: f64) -> f64 {
    // Box–Muller
    let u1: f64 = rng.random_range(f64::EPSILON..1.0);
    let u2: f64 = rng.random();
    let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
    (median * (sigma * z).exp()).clamp(lo, hi)
}

/// Writes a synthetic workload to `out` (atomically).
pub fn generate(opts: &SynthOptions, out: &Path) -> Result<SynthSummary, DbError> {
    let mut rng = ChaCha12Rng::seed_from_u64(opts.seed);
    // indexes after the rows: cheaper than maintaining them row by row
    let db = AtomicDb::create_with(out, false)?;
    let sq = |source| DbError::Sqlite {
        path: out.to_path_buf(),
        source,
    };
    let c = db.conn();
    c.execute_batch("BEGIN").map_err(sq)?;
    let classes = &WEB_CLASSES;
    let total_weight: f64 = classes.iter().map(|c| c.weight).sum();
    // 2026-01-01T00:00:00Z: a fixed origin keeps a seed's output identical
    let t0_us: i64 = 1_767_225_600_000_000;
    let mut t_us = t0_us as f64;
    let mut n_ex = 0usize;
    let mut by_class = vec![0usize; classes.len()];
    let server = Ipv4Addr::new(192, 0, 2, 80);
    for i in 0..opts.connections {
        // Poisson arrivals
        let gap_s = -(rng.random_range(f64::EPSILON..1.0f64)).ln() / opts.rate.max(1e-6);
        t_us += gap_s * 1e6;
        let mut pick = rng.random_range(0.0..total_weight);
        let ci = classes.iter().position(|c| {
            pick -= c.weight;
            pick < 0.0
        });
        let ci = ci.unwrap_or(classes.len() - 1);
        let class = &classes[ci];
        by_class[ci] += 1;
        let bw = log_uniform(&mut rng, class.bw_bps);
        let rtt_us = (log_uniform(&mut rng, class.rtt_ms) * 1000.0).round() as i64;
        let loss = uniform(&mut rng, class.loss);
        let delayed = rng.random_bool(class.delayed_ack_share);
        let delack_timeout_us: Option<i64> = delayed.then(|| {
            if rng.random_bool(0.7) {
                200_000
            } else {
                100_000
            }
        });
        let mss: i64 = if rng.random_bool(0.9) {
            1460
        } else {
            *[1400i64, 1360, 1380].get(rng.random_range(0..3)).unwrap()
        };
        let n = if rng.random_bool(0.7) {
            1
        } else {
            rng.random_range(2..=6)
        };
        let (termination, closed_by) = match rng.random_range(0..10) {
            0..=5 => ("fin", "client"),
            6..=7 => ("rst_after_response", "client"),
            _ => ("fin", "server"),
        };
        let client = Ipv4Addr::from(u32::from(Ipv4Addr::new(100, 64, 0, 0)) + 1 + i as u32);
        let id = (i + 1) as i64;
        let mut ex_rows = Vec::new();
        let mut t_ex = t_us + rtt_us as f64; // first request after the handshake
        for k in 0..n {
            let think_us = if k == 0 {
                uniform(&mut rng, (0.0, 5_000.0))
            } else {
                log_normal(&mut rng, 400_000.0, 1.0, 20_000.0, 3_000_000.0)
            };
            let req = rng.random_range(200..=1_200u64);
            let max_resp = class.max_response.min(opts.max_response) as f64;
            let resp = log_normal(&mut rng, 12_000.0, 1.2, 300.0, max_resp).round() as u64;
            let response_delay_us =
                log_normal(&mut rng, 3_000.0, 0.8, 300.0, 30_000.0).round() as u64;
            let (query_delay_us, header) = if resp > 4_000 && rng.random_bool(0.6) {
                let header = rng.random_range(600..=3_000u64).min(resp - 1);
                (
                    log_normal(&mut rng, 60_000.0, 0.9, 5_000.0, 400_000.0).round() as u64,
                    header,
                )
            } else {
                (0, resp)
            };
            t_ex += think_us;
            ex_rows.push((
                k,
                t_ex as i64,
                req,
                resp,
                response_delay_us,
                query_delay_us,
                header,
                think_us as i64,
            ));
        }
        let client_port = 40_000 + (i % 20_000) as u16;
        ConnectionRow {
            id,
            client_ip: Text::Owned(client.to_string()),
            client_port: client_port.into(),
            server_ip: Text::Owned(server.to_string()),
            server_port: 80,
            ip_version: 4,
            t_syn: Some(t_us as i64),
            t_first: t_us as i64,
            t_end: t_us as i64,
            complete: 1,
            server_by: "syn".into(),
            min_rtt_us: Some(rtt_us),
            hs_rtt_us: Some(rtt_us),
            mss_client: Some(mss),
            mss_server: Some(1460),
            wscale_client: Some(7),
            wscale_server: Some(7),
            sack_ok: Some(1),
            ts_ok: Some(1),
            ecn_ok: Some(0),
            rwin_bytes: Some(class.rwin as i64),
            loss_rate_down: Some(loss),
            bw_bps: Some(bw),
            delack_policy: if delayed { "delayed" } else { "quick" }.into(),
            acks_per_seg: Some(if delayed { 0.5 } else { 1.0 }),
            delack_timeout_us,
            termination: termination.into(),
            closed_by: Some(closed_by.into()),
            exchanges: n as i64,
            community_id: Some(Text::Owned(tcp_community_id(
                &Endpoint::new(client.into(), client_port),
                &Endpoint::new(server.into(), 80),
            ))),
            // no truth for the rest (counts 0, the others NULL): they are what a replay measures
            ..ConnectionRow::default()
        }
        .insert(c)
        .map_err(sq)?;
        for (k, t_req, req, resp, rd, qd, header, think) in ex_rows {
            ExchangeRow {
                conn_id: id,
                seq: k as i64,
                t_req_first: Some(t_req),
                t_req_last: Some(t_req),
                req_bytes: req as i64,
                resp_bytes: resp as i64,
                response_delay_us: Some(rd as i64),
                query_delay_us: Some(qd as i64),
                header_bytes: Some(header as i64),
                think_time_us: Some(think),
                // the synth's clients read at once
                zero_window_us: Some(0),
                ..ExchangeRow::default()
            }
            .insert(c)
            .map_err(sq)?;
            n_ex += 1;
        }
    }
    let duration_s = (t_us - t0_us as f64) / 1e6;
    for (k, v) in [
        ("role", "synth".to_string()),
        ("profile", "web".to_string()),
        ("seed", opts.seed.to_string()),
        ("connections", opts.connections.to_string()),
        ("rate_per_s", opts.rate.to_string()),
        ("classes", serde_json::to_string(&classes.to_vec()).unwrap_or_default()),
        ("bw_unit", "IP-layer bits per second (payload plus IP and TCP headers)".to_string()),
        ("truth", "min_rtt_us, bw_bps, loss_rate_down, delack_policy, delack_timeout_us, rwin_bytes, mss_client and the exchanges' sizes and delays are the configured truth; response times are unknown until replayed".to_string()),
    ] {
        set_meta(c, k, &v).map_err(sq)?;
    }
    for ix in index_statements() {
        c.execute_batch(ix).map_err(sq)?;
    }
    c.execute_batch("COMMIT").map_err(sq)?;
    let path = db.commit()?;
    Ok(SynthSummary {
        output: path.display().to_string(),
        connections: opts.connections,
        exchanges: n_ex,
        duration_s,
        by_class: classes
            .iter()
            .zip(by_class)
            .map(|(c, n)| (c.name.to_string(), n))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_workload_and_loadable() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.db"), dir.path().join("b.db"));
        let opts = SynthOptions {
            connections: 200,
            ..SynthOptions::default()
        };
        let sa = generate(&opts, &a).unwrap();
        generate(&opts, &b).unwrap();
        let dump = |p: &Path| {
            let c = rusqlite::Connection::open(p).unwrap();
            mimic_core::db::table_rows(&c, "connections").unwrap()
        };
        assert_eq!(dump(&a), dump(&b));
        // the indexes, built after the rows, and the views are all there
        let c = rusqlite::Connection::open(&a).unwrap();
        let n: i64 = c
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE name IN ('connections_by_client', 'rtt_samples_by_conn', 'bw_samples_by_conn', 'conn_summary', 'class_summary')",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(n, 5);
        assert_eq!(
            mimic_core::db::schema_level(&c).unwrap(),
            mimic_core::db::SCHEMA_LEVEL
        );
        let classes: i64 = c
            .query_row("SELECT sum(connections) FROM class_summary", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(classes, 200);
        drop(c);
        assert_eq!(sa.connections, 200);
        assert!(sa.by_class.iter().all(|(_, n)| *n > 0), "{:?}", sa.by_class);
        let w = crate::workload::load(&a, crate::workload::Select::Complete, None).unwrap();
        assert_eq!(w.conns.len(), 200);
        assert_eq!(w.role.as_deref(), Some("synth"));
        assert!(w
            .conns
            .iter()
            .all(|c| c.bw_bps.is_some() && c.min_rtt_us.is_some()));
        assert_eq!(
            w.conns.iter().map(|c| c.exchanges.len()).sum::<usize>(),
            sa.exchanges
        );
        // header never exceeds the response, a query delay only with a split
        for c in &w.conns {
            for e in &c.exchanges {
                assert!(e.header_bytes <= e.resp_bytes);
                assert!(e.query_delay_us == 0 || e.header_bytes < e.resp_bytes);
            }
        }
    }
}
