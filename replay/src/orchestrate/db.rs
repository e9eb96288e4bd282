//! The replay database: the capture of the server side analyzed as any trace is, then
//! `replay_map` (each replayed connection paired with its original), `replay_pipes` (each
//! connection's pipes and what the emulator counted on them) and the replay's `meta`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use mimic_analyze::driver::{self as analysis, RunOptions, Summary as AnalysisSummary};
use mimic_core::db::{set_meta, DbError};
use mimic_core::schema::{ReplayMapRow, ReplayPipeRow, TableRow, Text};
use mimic_netemu::config::{LossModel, PipeConfig, QueueLimit};
use mimic_netemu::stack::StackProfile;

use super::rates::RateSources;
use super::ReplayError;
use crate::client::Outcome;
use crate::spec::ReplayOptions;
use crate::workload::Workload;

/// Analyzes the capture `files` into `output` (the staged replay database), as `mimic
/// analyze` would with the server emulator's port as the server port.
pub(super) fn analyze(
    files: &[PathBuf],
    output: &Path,
    server_port: u16,
) -> Result<AnalysisSummary, ReplayError> {
    analysis::run(&RunOptions {
        inputs: files.to_vec(),
        output: output.to_path_buf(),
        config: mimic_analyze::Config {
            server_ports: vec![server_port],
            ..mimic_analyze::Config::default()
        },
        threads: 1,
        progress: None,
        meta: Vec::new(),
        filter: None,
        cancel: None,
    })
    .map_err(|e| ReplayError::Analysis(e.to_string()))
}

pub(super) struct Finished {
    pub missing: u64,
}

/// A connection's pipes and what the emulator counted on them.
pub(super) struct PipeRecord {
    pub up: PipeConfig,
    pub down: PipeConfig,
    pub counters: Option<(mimic_netemu::pipe::Counters, mimic_netemu::pipe::Counters)>,
}

/// Where the replay was captured and what answered it, for `meta`.
pub(super) struct Vantage<'a> {
    /// `server` or `client`.
    pub capture: &'a str,
    pub iface: &'a str,
    pub server_host: Option<&'a crate::control::HostInfo>,
    /// `--agents`: each agent's [`super::agents::AgentRun`], as JSON.
    pub agents: Option<String>,
}

/// Adds `replay_map` and the replay's metadata to the analysis of the capture.
#[allow(clippy::too_many_arguments)]
pub(super) fn finish_db(
    path: &Path,
    opts: &ReplayOptions,
    wl: &Workload,
    outcomes: &[Outcome],
    pipes: &[PipeRecord],
    server: SocketAddr,
    stack: Option<&StackProfile>,
    lab: Option<&str>,
    vantage: &Vantage,
    rates: &RateSources,
    emulator: &[(&'static str, String)],
) -> Result<Finished, ReplayError> {
    let sq = |source| DbError::Sqlite {
        path: path.to_path_buf(),
        source,
    };
    let mut c = rusqlite::Connection::open(path).map_err(sq)?;
    let tx = c.transaction().map_err(sq)?;
    let mut missing = 0u64;
    {
        let mut find = tx
            .prepare("SELECT id FROM connections WHERE client_ip = ?1 AND client_port = ?2 AND server_port = ?3 ORDER BY id DESC LIMIT 1")
            .map_err(sq)?;
        for o in outcomes {
            let spec = &wl.conns[o.index];
            let local = o.local;
            let found: Option<i64> = find
                .query_row(
                    rusqlite::params![local.ip().to_string(), local.port(), server.port()],
                    |r| r.get(0),
                )
                .ok();
            let (status, failure) = match (&o.result, found) {
                (Ok(()), Some(_)) => ("ok", None),
                (Ok(()), None) => {
                    missing += 1;
                    ("missing", Some("not in the capture".to_string()))
                }
                (Err(f), _) => ("failed", Some(f.as_str())),
            };
            ReplayMapRow {
                orig_conn_id: spec.orig_id,
                replay_conn_id: if status == "ok" { found } else { None },
                status: status.into(),
                failure: failure.map(Text::Owned),
                client_ip: Some(Text::Owned(local.ip().to_string())),
                client_port: Some(local.port().into()),
                server_ip: Some(Text::Owned(server.ip().to_string())),
                server_port: Some(server.port().into()),
            }
            .insert(&tx)
            .map_err(sq)?;
        }
        for (c, p) in wl.conns.iter().zip(pipes) {
            let q = |l: &QueueLimit| match l {
                QueueLimit::Packets(n) => *n as i64,
                QueueLimit::Bytes(b) => *b as i64,
            };
            let loss = match p.down.loss {
                LossModel::Iid(x) => x,
                _ => 0.0,
            };
            let (u, d) = match &p.counters {
                Some((u, d)) => (Some(u), Some(d)),
                None => (None, None),
            };
            ReplayPipeRow {
                orig_conn_id: c.orig_id,
                one_way_delay_us: (p.down.delay / 1000) as i64,
                down_rate_bps: (p.down.rate_bps > 0).then_some(p.down.rate_bps as f64),
                down_loss: loss,
                queue_up: q(&p.up.queue),
                queue_down: q(&p.down.queue),
                ack_every: p.up.ack.map(|a| a.every.into()),
                ack_timeout_us: p.up.ack.map(|a| (a.timeout / 1000) as i64),
                up_packets: u.map(|c| c.packets as i64),
                up_queue_drops: u.map(|c| c.queue_drops as i64),
                up_loss_drops: u.map(|c| c.loss_drops as i64),
                down_packets: d.map(|c| c.packets as i64),
                down_bytes: d.map(|c| c.bytes as i64),
                down_queue_drops: d.map(|c| c.queue_drops as i64),
                down_loss_drops: d.map(|c| c.loss_drops as i64),
                down_max_queue: d.map(|c| c.max_queue_packets as i64),
            }
            .insert(&tx)
            .map_err(sq)?;
        }
    }
    let meta = [
        ("role", "replay".to_string()),
        // the client agents and how each one's share went (JSON; empty: the client ran in
        // the controller's process)
        ("agents", vantage.agents.clone().unwrap_or_default()),
        ("replay_of", opts.input.display().to_string()),
        ("replay_of_role", wl.role.clone().unwrap_or_default()),
        ("select", format!("{:?}", opts.select).to_lowercase()),
        ("time_scale", opts.time_scale.to_string()),
        ("seed", opts.seed.to_string()),
        ("queue", opts.queue.to_string()),
        ("request_timing", opts.request_timing.to_string()),
        ("lab", lab.unwrap_or("").to_string()),
        (
            "stack",
            stack
                .map(|s| serde_json::to_string(s).unwrap_or_default())
                .unwrap_or_default(),
        ),
        (
            "stack_spec",
            stack.map(|s| s.to_string()).unwrap_or_default(),
        ),
        ("replayed", outcomes.len().to_string()),
        (
            "replay_failed",
            outcomes
                .iter()
                .filter(|o| o.result.is_err())
                .count()
                .to_string(),
        ),
    ];
    for (k, v) in meta {
        set_meta(&tx, k, &v).map_err(sq)?;
    }
    for (k, v) in vantage_meta(vantage)
        .into_iter()
        .chain(rates.meta())
        .chain(emulator.iter().cloned())
    {
        set_meta(&tx, k, &v).map_err(sq)?;
    }
    tx.commit().map_err(sq)?;
    Ok(Finished { missing })
}

/// The `meta` rows of where a replay was captured and the server host that answered it:
/// `capture_vantage`, `capture_iface`, `server_kernel`, `server_hostname`, `server_stack`
/// (JSON), `server_stack_spec` (the `--stack` syntax) and `server_stack_error`; empty values
/// where serve did not report them.
fn vantage_meta(v: &Vantage) -> Vec<(&'static str, String)> {
    let h = v.server_host;
    let stack = h.and_then(|h| h.stack.as_ref());
    vec![
        ("capture_vantage", v.capture.to_string()),
        ("capture_iface", v.iface.to_string()),
        (
            "server_kernel",
            h.map(|h| h.kernel.clone()).unwrap_or_default(),
        ),
        (
            "server_hostname",
            h.map(|h| h.hostname.clone()).unwrap_or_default(),
        ),
        (
            "server_stack",
            stack
                .map(|s| serde_json::to_string(s).unwrap_or_default())
                .unwrap_or_default(),
        ),
        (
            "server_stack_spec",
            stack.map(|s| s.to_string()).unwrap_or_default(),
        ),
        (
            "server_stack_error",
            match h {
                None => "the server emulator did not answer `info`".to_string(),
                Some(h) => h.stack_error.clone().unwrap_or_default(),
            },
        ),
    ]
}
