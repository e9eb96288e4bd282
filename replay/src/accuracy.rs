//! How well the analyzer recovers a workload's known truth: a synthetic workload (or any
//! database whose parameters were emulated) is replayed through the lab, the replay capture is
//! analyzed, and each inferred parameter of a replayed connection is compared with the value
//! its pipes and server were configured with (`mimic synth check`).

use std::collections::HashMap;
use std::path::Path;

use mimic_core::db::{open_existing, DbError};
use mimic_core::schema::{ConnectionRow, ExchangeRow, ReplayMapRow, ReplayPipeRow, TableRow};
use serde::Serialize;

#[derive(Debug, thiserror::Error)]
pub enum AccuracyError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("{path}: {source}")]
    Sql {
        path: String,
        source: rusqlite::Error,
    },
    #[error("{0}: not a replay database (no replay_map rows)")]
    NotReplay(String),
    /// The replay's `replay_map` names none of the truth's connections: a replay of another
    /// database, or the two arguments swapped.
    #[error("{replay}: its replay_map names none of the {truth_conns} connections of {truth} (a replay of another database?)")]
    NotPaired {
        truth: String,
        replay: String,
        truth_conns: usize,
    },
    /// Not one replayed connection could be scored: each `replay_map` row names an original
    /// the truth lacks or a replayed connection the replay lacks (a damaged or edited map).
    #[error("{replay}: none of its {replayed} replayed connections could be scored against {truth} ({no_replayed_row} name a replayed connection its connections table lacks, {no_truth} an original connection {truth} lacks): a damaged replay_map?")]
    NoneScored {
        truth: String,
        replay: String,
        replayed: usize,
        no_truth: u64,
        no_replayed_row: u64,
    },
}

/// One criterion: how many of `n` paired items met it, against the share required.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub parameter: &'static str,
    pub criterion: &'static str,
    pub n: u64,
    pub ok: u64,
    pub share: f64,
    pub required: f64,
    pub pass: bool,
    /// Median absolute error, in the parameter's unit.
    pub median_abs_error: f64,
    /// 99th percentile of the absolute error (nearest rank), in the parameter's unit.
    pub p99_abs_error: f64,
    pub unit: &'static str,
}

impl Check {
    fn new(
        parameter: &'static str,
        criterion: &'static str,
        unit: &'static str,
        required: f64,
        results: &[(bool, f64)],
    ) -> Check {
        let n = results.len() as u64;
        let ok = results.iter().filter(|r| r.0).count() as u64;
        let share = if n == 0 { 0.0 } else { ok as f64 / n as f64 };
        let mut errs: Vec<f64> = results.iter().map(|r| r.1.abs()).collect();
        errs.sort_by(|a, b| a.total_cmp(b));
        let median_abs_error = errs.get(errs.len() / 2).copied().unwrap_or(0.0);
        let p99_abs_error = match errs.len() {
            0 => 0.0,
            k => errs[((k as f64 * 0.99).ceil() as usize).clamp(1, k) - 1],
        };
        Check {
            parameter,
            criterion,
            n,
            ok,
            share,
            required,
            pass: n > 0 && share >= required,
            median_abs_error,
            p99_abs_error,
            unit,
        }
    }
}

/// Aggregate loss: losses the analyzer inferred (retransmissions less spurious ones) against
/// the drops the emulator made on the same connections (a drop of a pure ACK or SYN-ACK costs
/// no data retransmission, so the two differ by a little even when every loss is found).
#[derive(Clone, Debug, Serialize)]
pub struct LossCheck {
    pub data_packets: u64,
    pub inferred_losses: u64,
    /// Drops the emulator made on the downstream pipes (loss model and queue).
    pub emulated_drops: u64,
    pub inferred_rate: f64,
    /// Emulated drops per data segment.
    pub emulated_rate: f64,
    /// The configured loss rates, weighted by packets.
    pub configured_rate: f64,
    /// 95% binomial interval of the inferred losses if each data packet were lost with the
    /// emulated rate.
    pub interval: (f64, f64),
    pub pass: bool,
}

/// The random (i.i.d.) part of the loss against the workload's truth: the analyzer's
/// `loss_random_down` (losses the bottleneck queue does not explain, what a replay re-emulates)
/// summed over the replayed data segments, against the truth's loss rate on the same segments.
/// Reported beside the aggregate check, not required: `loss_random_down` tells queue overflows
/// from random drops by replaying the server's packets through the class queue, and a random
/// drop that also met a full queue, or a wrong bandwidth estimate, moves a loss between the two.
#[derive(Clone, Debug, Serialize)]
pub struct RandomLossCheck {
    /// Losses expected from the truth: Σ truth rate × data segments of the replayed connection.
    pub expected: f64,
    /// 95% binomial interval around `expected` (in losses).
    pub interval: (f64, f64),
    /// Σ inferred `loss_random_down` × data segments.
    pub inferred: f64,
    /// Drops the emulator's loss model made (queue drops excluded).
    pub emulated: u64,
    pub within: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct AccuracyReport {
    pub truth: String,
    pub replay: String,
    pub paired: u64,
    pub failed: u64,
    /// `replay_map` rows of replayed connections left unpaired: the original id is not among
    /// the truth's connections, or the replayed id not among the replay's (a damaged or
    /// edited map: counted, never silently dropped).
    pub no_truth: u64,
    pub no_replayed_row: u64,
    pub checks: Vec<Check>,
    pub loss: LossCheck,
    pub random_loss: RandomLossCheck,
    /// Share of paired connections with a bandwidth estimate.
    pub bw_coverage: f64,
}

impl AccuracyReport {
    pub fn pass(&self) -> bool {
        self.checks.iter().all(|c| c.pass || c.required == 0.0) && self.loss.pass
    }

    /// The accuracy table as text.
    pub fn table(&self) -> String {
        let mut unpaired = String::new();
        if self.no_truth > 0 {
            unpaired += &format!(
                "; {} left out: original id not among the truth's connections",
                self.no_truth
            );
        }
        if self.no_replayed_row > 0 {
            unpaired += &format!(
                "; {} left out: replayed connection id not among the replay's connections",
                self.no_replayed_row
            );
        }
        let mut s = format!(
            "inference accuracy: {} replayed connections paired with their truth ({} failed to replay{unpaired})\n{:<16} {:<40} {:>7} {:>8} {:>9} {:>12} {:>12}  result\n",
            self.paired, self.failed, "parameter", "criterion", "n", "share", "required", "median |err|", "p99 |err|"
        );
        for c in &self.checks {
            s += &format!(
                "{:<16} {:<40} {:>7} {:>7.1}% {:>8} {:>9.3} {:<3}{:>9.3} {:<3} {}\n",
                c.parameter,
                c.criterion,
                c.n,
                c.share * 100.0,
                if c.required > 0.0 {
                    format!("{:.0}%", c.required * 100.0)
                } else {
                    "report".into()
                },
                c.median_abs_error,
                c.unit,
                c.p99_abs_error,
                c.unit,
                if c.required == 0.0 {
                    "-"
                } else if c.pass {
                    "ok"
                } else {
                    "MISS"
                }
            );
        }
        let l = &self.loss;
        s += &format!(
            "{:<16} {:<40} {:>7} inferred {} ({:.3}%) vs emulated {} drops ({:.3}%; configured random loss {:.3}%), 95% interval [{:.3}%, {:.3}%]  {}\n",
            "loss (aggregate)",
            "within the binomial interval",
            l.data_packets,
            l.inferred_losses,
            l.inferred_rate * 100.0,
            l.emulated_drops,
            l.emulated_rate * 100.0,
            l.configured_rate * 100.0,
            l.interval.0 * 100.0,
            l.interval.1 * 100.0,
            if l.pass { "ok" } else { "MISS" }
        );
        let r = &self.random_loss;
        s += &format!(
            "{:<16} {:<40} {:>7} inferred {:.0} vs truth {:.1} (loss model dropped {}), 95% interval [{:.1}, {:.1}]  {}\n",
            "loss (random)",
            "within the binomial interval of the truth",
            l.data_packets,
            r.inferred,
            r.expected,
            r.emulated,
            r.interval.0,
            r.interval.1,
            if r.within { "report: ok" } else { "report: outside" }
        );
        s += &format!(
            "bandwidth estimates for {:.1}% of the paired connections\n",
            self.bw_coverage * 100.0
        );
        s
    }
}

struct Truth {
    rtt: Option<i64>,
    loss_random: f64,
    bw: Option<f64>,
    delack: String,
    rwin: Option<i64>,
    ex: Vec<(i64, i64)>,
}

struct Inferred {
    rtt: Option<i64>,
    bw: Option<f64>,
    delack: String,
    rwin: Option<i64>,
    data_pkts: i64,
    losses: i64,
    loss_random: f64,
    ex: Vec<(Option<i64>, Option<i64>)>,
}

/// Compares the replay `replay` of the workload `truth`.
pub fn evaluate(truth: &Path, replay: &Path) -> Result<AccuracyReport, AccuracyError> {
    let t = open_existing(truth)?;
    let r = open_existing(replay)?;
    let tp = truth.display().to_string();
    let rp = replay.display().to_string();
    let sqt = |source| AccuracyError::Sql {
        path: tp.clone(),
        source,
    };
    let sqr = |source| AccuracyError::Sql {
        path: rp.clone(),
        source,
    };

    // every table is read through its one column list (mimic_core::schema)
    let mut truths: HashMap<i64, Truth> = ConnectionRow::read_all(&t, "id")
        .map_err(sqt)?
        .into_iter()
        .map(|c| {
            (
                c.id,
                Truth {
                    rtt: c.min_rtt_us,
                    bw: c.bw_bps,
                    delack: c.delack_policy.into_owned(),
                    rwin: c.rwin_bytes,
                    loss_random: c.loss_random_down.or(c.loss_rate_down).unwrap_or(0.0),
                    ex: Vec::new(),
                },
            )
        })
        .collect();
    for e in ExchangeRow::read_all(&t, "conn_id, seq").map_err(sqt)? {
        if let Some(tr) = truths.get_mut(&e.conn_id) {
            tr.ex.push((
                e.response_delay_us.unwrap_or(0),
                e.query_delay_us.unwrap_or(0),
            ));
        }
    }

    let mut pairs: Vec<(i64, i64)> = Vec::new();
    let mut failed = 0u64;
    for m in ReplayMapRow::read_all(&r, "orig_conn_id").map_err(sqr)? {
        match (m.status.as_ref(), m.replay_conn_id) {
            ("ok", Some(rid)) => pairs.push((m.orig_conn_id, rid)),
            _ => failed += 1,
        }
    }
    if pairs.is_empty() && failed == 0 {
        return Err(AccuracyError::NotReplay(rp));
    }
    // scored against nothing, every criterion would read as missed: an accuracy regression
    // where the databases do not belong together
    if !pairs.is_empty() && !pairs.iter().any(|(o, _)| truths.contains_key(o)) {
        return Err(AccuracyError::NotPaired {
            truth: tp,
            replay: rp,
            truth_conns: truths.len(),
        });
    }

    let mut inferred: HashMap<i64, Inferred> = ConnectionRow::read_all(&r, "id")
        .map_err(sqr)?
        .into_iter()
        .map(|c| {
            (
                c.id,
                Inferred {
                    rtt: c.min_rtt_us,
                    bw: c.bw_bps,
                    delack: c.delack_policy.into_owned(),
                    rwin: c.rwin_bytes,
                    data_pkts: c.data_pkts_down,
                    losses: c.retx_down - c.spurious_retx_down,
                    loss_random: c.loss_random_down.unwrap_or(0.0),
                    ex: Vec::new(),
                },
            )
        })
        .collect();
    for e in ExchangeRow::read_all(&r, "conn_id, seq").map_err(sqr)? {
        if let Some(inf) = inferred.get_mut(&e.conn_id) {
            inf.ex.push((e.response_delay_us, e.query_delay_us));
        }
    }

    // emulator counters, when the replay recorded them
    let mut emulated: HashMap<i64, (f64, i64, i64, i64)> = HashMap::new();
    let has_pipes: bool = r
        .query_row(
            "SELECT count(*) > 0 FROM sqlite_master WHERE name = 'replay_pipes'",
            [],
            |row| row.get(0),
        )
        .map_err(sqr)?;
    if has_pipes {
        for p in ReplayPipeRow::read_all(&r, "orig_conn_id").map_err(sqr)? {
            let loss_drops = p.down_loss_drops.unwrap_or(0);
            emulated.insert(
                p.orig_conn_id,
                (
                    p.down_loss,
                    p.down_packets.unwrap_or(0),
                    loss_drops + p.down_queue_drops.unwrap_or(0),
                    loss_drops,
                ),
            );
        }
    }

    let (mut rtt, mut bw, mut rd, mut qd, mut delack, mut rwin) = (
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
    );
    let (mut with_bw, mut paired) = (0u64, 0u64);
    let (mut data_pkts, mut losses) = (0u64, 0u64);
    let (mut offered, mut drops, mut cfg_weighted) = (0f64, 0f64, 0f64);
    let (mut rand_expected, mut rand_var, mut rand_inferred, mut rand_emulated) =
        (0f64, 0f64, 0f64, 0u64);
    let (mut no_truth, mut no_replayed_row) = (0u64, 0u64);
    for (o, rid) in &pairs {
        let (Some(tr), Some(inf)) = (truths.get(o), inferred.get(rid)) else {
            if !truths.contains_key(o) {
                no_truth += 1;
            } else {
                no_replayed_row += 1;
            }
            continue;
        };
        paired += 1;
        if let (Some(t), Some(x)) = (tr.rtt, inf.rtt) {
            let err = (x - t) as f64;
            rtt.push((err.abs() <= (0.1 * t as f64).max(1000.0), err / 1000.0));
        }
        if inf.bw.is_some() {
            with_bw += 1;
        }
        if let (Some(t), Some(x)) = (tr.bw, inf.bw) {
            let rel = (x - t) / t;
            bw.push((rel.abs() <= 0.2, rel * 100.0));
        }
        if tr.ex.len() == inf.ex.len() {
            for ((trd, tqd), (xrd, xqd)) in tr.ex.iter().zip(&inf.ex) {
                if let Some(x) = xrd {
                    let e = (x - trd) as f64;
                    rd.push((e.abs() <= 2000.0, e / 1000.0));
                }
                if let Some(x) = xqd {
                    let e = (x - tqd) as f64;
                    qd.push((e.abs() <= 2000.0, e / 1000.0));
                }
            }
        }
        if inf.delack != "unknown" {
            delack.push((inf.delack == tr.delack, 0.0));
        }
        if let (Some(t), Some(x)) = (tr.rwin, inf.rwin) {
            let rel = (x - t) as f64 / t as f64;
            rwin.push((rel.abs() <= 0.1, rel * 100.0));
        }
        data_pkts += inf.data_pkts.max(0) as u64;
        losses += inf.losses.max(0) as u64;
        if let Some((p, pk, dr, rdr)) = emulated.get(o) {
            offered += (*pk + *dr) as f64;
            drops += *dr as f64;
            cfg_weighted += p * (*pk + *dr) as f64;
            rand_emulated += (*rdr).max(0) as u64;
        }
        let segs = inf.data_pkts.max(0) as f64;
        let p = tr.loss_random.clamp(0.0, 1.0);
        rand_expected += p * segs;
        rand_var += p * (1.0 - p) * segs;
        rand_inferred += inf.loss_random.max(0.0) * segs;
    }
    if paired == 0 && !pairs.is_empty() {
        return Err(AccuracyError::NoneScored {
            truth: tp,
            replay: rp,
            replayed: pairs.len(),
            no_truth,
            no_replayed_row,
        });
    }
    // Every drop the emulator made on a data segment costs the server one retransmission, so
    // the inferred losses should match the drops in count; the interval is the binomial one
    // of that count over the data segments sent.
    let n = data_pkts as f64;
    let emulated_rate = if n > 0.0 { drops / n } else { 0.0 };
    let sd = (drops * (1.0 - emulated_rate.min(1.0))).sqrt();
    let (lo, hi) = ((drops - 1.96 * sd - 0.5).max(0.0), drops + 1.96 * sd + 0.5);
    let loss = LossCheck {
        data_packets: data_pkts,
        inferred_losses: losses,
        emulated_drops: drops as u64,
        inferred_rate: if n > 0.0 { losses as f64 / n } else { 0.0 },
        emulated_rate,
        configured_rate: if offered > 0.0 {
            cfg_weighted / offered
        } else {
            0.0
        },
        interval: if n > 0.0 {
            (lo / n, hi / n)
        } else {
            (0.0, 0.0)
        },
        pass: (losses as f64) >= lo && (losses as f64) <= hi,
    };
    let rsd = rand_var.sqrt();
    let rand_interval = (
        (rand_expected - 1.96 * rsd - 0.5).max(0.0),
        rand_expected + 1.96 * rsd + 0.5,
    );
    let random_loss = RandomLossCheck {
        expected: rand_expected,
        interval: rand_interval,
        inferred: rand_inferred,
        emulated: rand_emulated,
        within: rand_inferred >= rand_interval.0 && rand_inferred <= rand_interval.1,
    };
    let checks = vec![
        Check::new("min RTT", "within 10% or 1 ms", "ms", 0.95, &rtt),
        Check::new(
            "bandwidth",
            "within 20% (connections with an estimate)",
            "%",
            0.80,
            &bw,
        ),
        Check::new(
            "response delay",
            "within 2 ms (per exchange)",
            "ms",
            0.95,
            &rd,
        ),
        Check::new("query delay", "within 2 ms (per exchange)", "ms", 0.95, &qd),
        Check::new(
            "delayed ACK",
            "policy as emulated (where inferred)",
            "",
            0.0,
            &delack,
        ),
        Check::new("receive window", "within 10%", "%", 0.0, &rwin),
    ];
    Ok(AccuracyReport {
        truth: tp,
        replay: rp,
        paired,
        failed,
        no_truth,
        no_replayed_row,
        checks,
        loss,
        random_loss,
        bw_coverage: if paired > 0 {
            with_bw as f64 / paired as f64
        } else {
            0.0
        },
    })
}
