//! The comparison itself: BASE against each OTHER, as data (serialisable to JSON) from which the
//! verdict, the text summary, the HTML report and the PNG plots are drawn.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::fmt;
use crate::input::{self, Input, Metric};
use crate::stats::{self, KsTest, TABLE_PERCENTILES};
use crate::CompareError;

/// How a report is computed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Options {
    /// Bootstrap resamples per input for the confidence intervals.
    pub bootstrap_replicates: usize,
    /// Seed of the bootstrap generator (ChaCha8): the same inputs and seed give the same report.
    pub seed: u64,
    /// Confidence level of the intervals (0.95 = 95%).
    pub confidence: f64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            bootstrap_replicates: 2000,
            seed: 1,
            confidence: 0.95,
        }
    }
}

/// The shares of relative error the report tabulates (±10% and ±20%, as Monkey §5.1).
pub const ERROR_BANDS: [f64; 2] = [0.10, 0.20];

/// Summary of one distribution: size, mean, the table percentiles and 101 quantiles (p0..p100)
/// that describe its CDF.
#[derive(Debug, Clone, Serialize)]
pub struct Distribution {
    pub n: usize,
    pub mean: f64,
    pub min: f64,
    pub max: f64,
    /// "p10" → value, for [`TABLE_PERCENTILES`].
    pub percentiles: BTreeMap<String, f64>,
    /// Percentile 0, 1, …, 100 (type 7): enough to redraw the CDF.
    pub quantiles: Vec<f64>,
}

impl Distribution {
    fn of(sorted: &[f64]) -> Distribution {
        Distribution {
            n: sorted.len(),
            mean: stats::mean(sorted),
            min: sorted.first().copied().unwrap_or(f64::NAN),
            max: sorted.last().copied().unwrap_or(f64::NAN),
            percentiles: TABLE_PERCENTILES
                .iter()
                .map(|&p| (stat_name(p), stats::percentile_sorted(sorted, p)))
                .collect(),
            quantiles: (0..=100)
                .map(|p| stats::percentile_sorted(sorted, p as f64))
                .collect(),
        }
    }
}

/// A population metric of one input: its distribution and how many had no value.
#[derive(Debug, Clone, Serialize)]
pub struct PopulationMetric {
    #[serde(flatten)]
    pub dist: Distribution,
    /// Connections (or exchanges, for the server delays) without a value.
    pub missing: u64,
}

/// Connections left out of the response-time distribution, by reason.
#[derive(Debug, Clone, Serialize)]
pub struct Excluded {
    pub reason: String,
    pub count: u64,
}

/// One input database as the report describes it.
#[derive(Debug, Clone, Serialize)]
pub struct InputSummary {
    /// Short name used in tables and legends (file stem, made unique).
    pub label: String,
    pub path: PathBuf,
    /// `meta.role`: original / replay / synth (None if the database does not say).
    pub role: Option<String>,
    /// Every `meta` key of the database (stack profile, tool version, inputs, …).
    pub meta: BTreeMap<String, String>,
    /// Where the database's trace was captured (`meta.capture_vantage`): `server`, `client`
    /// or `unknown` (also when a capture does not say); None for a synth workload, which was
    /// never captured.
    pub capture_vantage: Option<String>,
    pub connections: u64,
    pub with_response_time: usize,
    pub excluded: Vec<Excluded>,
    pub response_time_us: Distribution,
    /// min_rtt_us, bw_bps, loss_rate_down (per connection); response_delay_us, query_delay_us
    /// (per exchange).
    pub population: BTreeMap<String, PopulationMetric>,
    pub exchanges: u64,
}

/// Which way a difference points, when its interval excludes zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// OTHER is significantly smaller (faster).
    Faster,
    /// OTHER is significantly larger (slower).
    Slower,
    /// The interval contains zero.
    NotSignificant,
}

/// One row of the percentile table: a statistic of BASE and OTHER and their difference.
#[derive(Debug, Clone, Serialize)]
pub struct StatDiff {
    /// "p10" … "p99" or "mean".
    pub stat: String,
    pub base_us: f64,
    pub other_us: f64,
    /// other − base (µs), with its bootstrap interval.
    pub diff_us: f64,
    pub diff_ci_us: [f64; 2],
    /// (other − base) / base, a fraction (−0.12 = 12% faster), with its bootstrap interval.
    pub rel: f64,
    pub rel_ci: [f64; 2],
    pub direction: Direction,
}

/// Failed or unusable replayed connections, by reason.
#[derive(Debug, Clone, Serialize)]
pub struct Unpaired {
    /// `replay_map.status` (failed / missing / …) or "ok" for a replayed connection that
    /// could not be paired for another reason.
    pub status: String,
    /// `replay_map.failure` or the reason it could not be paired.
    pub reason: String,
    pub count: u64,
}

/// Relative-error statistics of a set of paired connections.
#[derive(Debug, Clone, Serialize)]
pub struct ErrorStats {
    pub label: String,
    pub n: usize,
    /// Share of connections with |relative error| ≤ 10% and ≤ 20%.
    pub within_10: f64,
    pub within_20: f64,
    /// Share with a negative error (replay faster than the original).
    pub below_zero: f64,
    /// p10/p25/p50/p75/p90/p95/p99 of the relative error (fractions).
    pub percentiles: BTreeMap<String, f64>,
    #[serde(skip)]
    pub(crate) errors: Vec<f64>,
}

impl ErrorStats {
    fn of(label: String, mut errors: Vec<f64>) -> ErrorStats {
        errors.sort_by(f64::total_cmp);
        let n = errors.len();
        let share = |f: &dyn Fn(f64) -> bool| {
            if n == 0 {
                f64::NAN
            } else {
                errors.iter().filter(|&&e| f(e)).count() as f64 / n as f64
            }
        };
        ErrorStats {
            label,
            n,
            within_10: share(&|e| e.abs() <= ERROR_BANDS[0] + 1e-12),
            within_20: share(&|e| e.abs() <= ERROR_BANDS[1] + 1e-12),
            below_zero: share(&|e| e < 0.0),
            percentiles: TABLE_PERCENTILES
                .iter()
                .map(|&p| (stat_name(p), stats::percentile_sorted(&errors, p)))
                .collect(),
            errors,
        }
    }
}

/// Relative error broken down by a property of the original connection.
#[derive(Debug, Clone, Serialize)]
pub struct Breakdown {
    /// "response_time", "bandwidth" or "min_rtt".
    pub by: String,
    /// How the classes were formed.
    pub method: String,
    pub classes: Vec<ErrorStats>,
}

/// The per-connection comparison of a replay with the BASE connections it reproduces.
#[derive(Debug, Clone, Serialize)]
pub struct Paired {
    /// Rows in OTHER's replay_map.
    pub replay_map_rows: usize,
    /// Replayed connections whose exchange count and response bytes agree with their original
    /// (within 5% or 1500 bytes), of those checked: how sure the pairing is.
    pub consistent: usize,
    pub consistency_checked: usize,
    /// Connections of BASE with a response time that OTHER did not replay at all.
    pub not_replayed: usize,
    /// Connections paired (both response times known).
    pub pairs: usize,
    /// Everything in replay_map that did not become a pair, by reason: failed replays are
    /// reported here, never silently dropped.
    pub unpaired: Vec<Unpaired>,
    /// All pairs.
    pub overall: ErrorStats,
    /// By original response time, bottleneck bandwidth and min RTT (Monkey Figures 6–8).
    pub breakdowns: Vec<Breakdown>,
}

/// BASE against one OTHER.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub base: String,
    pub other: String,
    /// p10 … p99, then the mean.
    pub rows: Vec<StatDiff>,
    pub ks: KsTest,
    /// One line in plain words.
    pub verdict: String,
    /// Present when OTHER is a replay of BASE.
    pub paired: Option<Paired>,
    /// Why there is no per-connection analysis, when OTHER has a replay_map but it does not
    /// pair with BASE.
    pub pairing_note: Option<String>,
    /// Set when BASE and OTHER were captured at different vantage points, or at one that is
    /// not known: their response times are then not measured alike.
    pub vantage_warning: Option<String>,
    /// Set when BASE or OTHER is a replay whose own timing was distorted (its `meta`
    /// `timing_health`): part of the difference is then the host's error, not the change.
    pub timing_warning: Option<String>,
}

/// A full report: BASE (inputs[0]) against each OTHER.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// "mimic-compare/1": bumped when a field changes meaning.
    pub format: &'static str,
    pub tool_version: &'static str,
    pub options: Options,
    pub inputs: Vec<InputSummary>,
    pub comparisons: Vec<Comparison>,
    /// When several OTHERs are replays of BASE: each later replay against the first, connection
    /// by connection (the A/B of a stack change).
    pub ab: Vec<crate::ab::AbComparison>,
    #[serde(skip)]
    pub(crate) samples: Vec<Vec<f64>>,
    /// The bootstrap replicates of each input (table percentiles, then the mean), kept so that
    /// an interval at another level or for another percentile comes from the same resamples.
    #[serde(skip)]
    pub(crate) reps: Vec<stats::Replicates>,
    #[serde(skip)]
    pub(crate) loaded: Vec<Input>,
}

/// "p50" for 50, "p99.9" for 99.9.
pub fn stat_name(p: f64) -> String {
    if p.fract() == 0.0 {
        format!("p{}", p as u64)
    } else {
        format!("p{p}")
    }
}

/// The bootstrap stream of input `k` (0 = BASE): its own seed, so that adding an input leaves
/// the others' intervals alone and the result does not depend on the thread count.
fn input_seed(seed: u64, k: usize) -> u64 {
    seed ^ (k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The smallest number of bootstrap resamples for an interval at `confidence`: 2.5 resamples
/// in each tail (100 at 95%, 500 at 99%, 5000 at 99.9%), and never fewer than 100.
pub fn min_replicates(confidence: f64) -> usize {
    // less a hair, so that 99.9% (1 − 0.999 is not exactly 0.001) asks for 5000, not 5001
    ((5.0 / (1.0 - confidence) - 1e-6).ceil() as usize).max(100)
}

/// One row of the difference table from the bootstrap replicates of a statistic of BASE and
/// OTHER (resampled independently: the unpaired comparison of two distributions). The
/// intervals are percentile-method intervals of OTHER − BASE and (OTHER − BASE) / BASE over
/// the replicate pairs.
fn stat_diff(
    stat: String,
    b: f64,
    o: f64,
    base_reps: &[f64],
    other_reps: &[f64],
    confidence: f64,
) -> StatDiff {
    let diffs: Vec<f64> = base_reps
        .iter()
        .zip(other_reps)
        .map(|(br, or)| or - br)
        .collect();
    let rels: Vec<f64> = base_reps
        .iter()
        .zip(other_reps)
        .map(|(br, or)| if *br > 0.0 { (or - br) / br } else { f64::NAN })
        .collect();
    let (dlo, dhi) = stats::percentile_interval(&diffs, confidence);
    let (rlo, rhi) = stats::percentile_interval(&rels, confidence);
    let direction = if dlo > 0.0 {
        Direction::Slower
    } else if dhi < 0.0 {
        Direction::Faster
    } else {
        Direction::NotSignificant
    };
    StatDiff {
        stat,
        base_us: b,
        other_us: o,
        diff_us: o - b,
        diff_ci_us: [dlo, dhi],
        rel: if b > 0.0 { (o - b) / b } else { f64::NAN },
        rel_ci: [rlo, rhi],
        direction,
    }
}

impl Report {
    /// Reads BASE and every OTHER and computes the comparison. Errors name the file at fault:
    /// not SQLite, not a mimic database, another schema version, or no connection with a
    /// response time.
    pub fn build(
        base: &Path,
        others: &[PathBuf],
        options: &Options,
    ) -> Result<Report, CompareError> {
        if !(options.confidence > 0.0 && options.confidence < 1.0) {
            return Err(CompareError::Options(format!(
                "confidence must be between 0 and 1, not {}",
                options.confidence
            )));
        }
        let needed = min_replicates(options.confidence);
        if options.bootstrap_replicates < needed {
            return Err(CompareError::Options(format!(
                "at least {needed} bootstrap replicates are needed for a {}% interval (2.5 in each tail), not {}",
                // every digit the level was given with (99.99999 is not a 100% interval)
                format!("{:.10}", options.confidence * 100.0)
                    .trim_end_matches('0')
                    .trim_end_matches('.'),
                options.bootstrap_replicates
            )));
        }
        let mut loaded = vec![input::load(base)?];
        for o in others {
            loaded.push(input::load(o)?);
        }
        Ok(Report::from_inputs(loaded, options))
    }

    pub(crate) fn from_inputs(loaded: Vec<Input>, options: &Options) -> Report {
        let labels = unique_labels(&loaded.iter().map(|i| i.path.as_path()).collect::<Vec<_>>());
        let inputs: Vec<InputSummary> = loaded
            .iter()
            .zip(&labels)
            .map(|(i, l)| summarize(i, l.clone()))
            .collect();
        let samples: Vec<Vec<f64>> = loaded.iter().map(|i| i.response_times_us.clone()).collect();

        let mut ps: Vec<f64> = TABLE_PERCENTILES.to_vec();
        ps.dedup();
        // Resample every input at once, one thread per input (the work is O(n) per replicate).
        // Input k has its own stream (seed ^ k·φ), so adding an input leaves the others'
        // intervals alone and the result does not depend on the thread count.
        let reps: Vec<stats::Replicates> = std::thread::scope(|scope| {
            let handles: Vec<_> = samples
                .iter()
                .enumerate()
                .map(|(k, sample)| {
                    let ps = &ps;
                    let seed = input_seed(options.seed, k);
                    scope.spawn(move || {
                        stats::bootstrap(sample, ps, options.bootstrap_replicates, seed)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("bootstrap thread"))
                .collect()
        });
        let base_reps = &reps[0];
        let mut comparisons = Vec::new();
        for k in 1..loaded.len() {
            let other_reps = &reps[k];
            let mut rows = Vec::new();
            for (idx, name) in ps
                .iter()
                .map(|&p| stat_name(p))
                .chain(std::iter::once("mean".to_string()))
                .enumerate()
            {
                let (b, o) = if idx < ps.len() {
                    (
                        stats::percentile_sorted(&samples[0], ps[idx]),
                        stats::percentile_sorted(&samples[k], ps[idx]),
                    )
                } else {
                    (stats::mean(&samples[0]), stats::mean(&samples[k]))
                };
                let column = |r: &stats::Replicates| -> Vec<f64> {
                    r.values.iter().map(|row| row[idx]).collect()
                };
                rows.push(stat_diff(
                    name,
                    b,
                    o,
                    &column(base_reps),
                    &column(other_reps),
                    options.confidence,
                ));
            }
            let ks = stats::ks_2samp(&samples[0], &samples[k]).expect("inputs are never empty");
            let (paired, pairing_note) = pair(&loaded[0], &loaded[k], &labels[0], &labels[k]);
            let verdict = verdict_line(&labels[0], &labels[k], &rows, &ks, options.confidence);
            let vantage_warning = vantage_warning(
                (&labels[0], inputs[0].capture_vantage.as_deref()),
                (&labels[k], inputs[k].capture_vantage.as_deref()),
            );
            let timing_warning =
                timing_warning(&[(&labels[0], &loaded[0].meta), (&labels[k], &loaded[k].meta)]);
            comparisons.push(Comparison {
                base: labels[0].clone(),
                other: labels[k].clone(),
                rows,
                ks,
                verdict,
                paired,
                pairing_note,
                vantage_warning,
                timing_warning,
            });
        }
        // Replays of the same workload pair up connection by connection: the first replay is
        // the reference (A), each later one a change (B).
        let mut ab = Vec::new();
        if comparisons.first().is_some_and(|c| c.paired.is_some()) {
            for k in 2..loaded.len() {
                if comparisons[k - 1].paired.is_some() {
                    if let Some(c) = crate::ab::compare(
                        &loaded[1],
                        &loaded[k],
                        &labels[1],
                        &labels[k],
                        options.bootstrap_replicates,
                        options.seed ^ (k as u64),
                        options.confidence,
                    ) {
                        let timing_warning = timing_warning(&[
                            (&labels[1], &loaded[1].meta),
                            (&labels[k], &loaded[k].meta),
                        ]);
                        ab.push(crate::ab::AbComparison {
                            timing_warning,
                            ..c
                        });
                    }
                }
            }
        }
        Report {
            format: "mimic-compare/1",
            tool_version: env!("CARGO_PKG_VERSION"),
            options: *options,
            inputs,
            comparisons,
            ab,
            samples,
            reps,
            loaded,
        }
    }

    /// The verdict: one line per OTHER, in plain words.
    pub fn verdict(&self) -> String {
        if self.comparisons.is_empty() {
            return format!("{}: no OTHER input to compare with", self.inputs[0].label);
        }
        self.comparisons
            .iter()
            .map(|c| c.verdict.as_str())
            .chain(self.ab.iter().map(|a| a.verdict.as_str()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The warnings of every comparison (vantage points, distorted replay timing), each once.
    pub fn warnings(&self) -> Vec<String> {
        let mut v: Vec<String> = Vec::new();
        let all = self
            .comparisons
            .iter()
            .flat_map(|c| [&c.vantage_warning, &c.timing_warning])
            .chain(self.ab.iter().map(|a| &a.timing_warning))
            .flatten();
        for w in all {
            if !v.contains(w) {
                v.push(w.clone());
            }
        }
        v
    }

    /// Everything machine-readable (the `--json` output).
    pub fn to_json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).expect("a report serialises");
        v["verdict"] = serde_json::Value::from(
            self.comparisons
                .iter()
                .map(|c| c.verdict.clone())
                .chain(self.ab.iter().map(|a| a.verdict.clone()))
                .collect::<Vec<_>>(),
        );
        v
    }

    /// Sorted response times (µs) of input `k` (0 = BASE).
    pub fn response_times_us(&self, k: usize) -> &[f64] {
        &self.samples[k]
    }

    /// Percentile `p` (0–100) or, for `None`, the mean of input `k`'s response times (µs).
    pub fn stat_us(&self, k: usize, p: Option<f64>) -> f64 {
        match p {
            Some(p) => stats::percentile_sorted(&self.samples[k], p),
            None => stats::mean(&self.samples[k]),
        }
    }

    /// The difference OTHER − BASE (input `k` against input 0) of percentile `p` (0–100) or,
    /// for `None`, of the mean, with bootstrap intervals at `confidence` (0.95 = 95%). The
    /// intervals come from the very resamples behind the report's table: for a table statistic
    /// at the report's level this is the table's row; another level re-reads the same
    /// replicates, and a percentile outside the table is computed from the same streams (the
    /// same seeds draw the same resamples whatever statistics are taken from them).
    pub fn difference(&self, k: usize, p: Option<f64>, confidence: f64) -> StatDiff {
        assert!(k > 0 && k < self.samples.len(), "input {k} is not an OTHER");
        let table = &self.reps[0].percentiles;
        let idx = match p {
            Some(p) => table.iter().position(|&q| q == p),
            None => Some(table.len()),
        };
        let (base_col, other_col) = match idx {
            Some(idx) => {
                let column = |r: &stats::Replicates| -> Vec<f64> {
                    r.values.iter().map(|row| row[idx]).collect()
                };
                (column(&self.reps[0]), column(&self.reps[k]))
            }
            None => {
                let p = p.expect("the mean is always in the table");
                let column = |j: usize| -> Vec<f64> {
                    stats::bootstrap(
                        &self.samples[j],
                        &[p],
                        self.options.bootstrap_replicates,
                        input_seed(self.options.seed, j),
                    )
                    .values
                    .iter()
                    .map(|row| row[0])
                    .collect()
                };
                (column(0), column(k))
            }
        };
        let name = p.map(stat_name).unwrap_or_else(|| "mean".into());
        stat_diff(
            name,
            self.stat_us(0, p),
            self.stat_us(k, p),
            &base_col,
            &other_col,
            confidence,
        )
    }

    /// Response times (µs) of the connections that BASE and OTHER `k` both hold, as (BASE,
    /// OTHER) pairs, when the two are paired connection by connection: OTHER is a replay of
    /// BASE (the report's per-connection section), or both are replays of the same workload
    /// (their replay_maps name the same original connections for at least half of the smaller
    /// one, and at least half of those replayed connections agree on exchanges and response
    /// bytes, the check the report applies to a replay of BASE). `None` otherwise: the two are
    /// then independent samples. The string says how they pair.
    pub fn pairs(&self, k: usize) -> Option<(Vec<(f64, f64)>, String)> {
        let (base, other) = (&self.loaded[0], &self.loaded[k]);
        let (lb, lo) = (&self.inputs[0].label, &self.inputs[k].label);
        let rt = |i: &Input, id: Option<i64>| {
            id.and_then(|id| i.by_id.get(&id))
                .and_then(|f| f.response_time_us)
                .filter(|v| *v > 0.0)
        };
        if self.comparisons[k - 1].paired.is_some() {
            let pairs: Vec<(f64, f64)> = other
                .replay_map
                .iter()
                .flatten()
                .filter(|r| r.status == "ok")
                .filter_map(|r| {
                    Some((
                        rt(base, Some(r.orig_conn_id))?,
                        rt(other, r.replay_conn_id)?,
                    ))
                })
                .collect();
            return Some((pairs, format!("{lo} replays {lb}'s connections")));
        }
        // two replays: the replayed connection of each original connection, on each side
        let replayed = |i: &Input| -> Option<HashMap<i64, input::ConnFacts>> {
            let map = i.replay_map.as_ref().filter(|m| !m.is_empty())?;
            Some(
                map.iter()
                    .filter(|r| r.status == "ok")
                    .filter_map(|r| Some((r.orig_conn_id, *i.by_id.get(&r.replay_conn_id?)?)))
                    .collect(),
            )
        };
        let (mb, mo) = (replayed(base)?, replayed(other)?);
        let joined: Vec<(&input::ConnFacts, &input::ConnFacts)> = mb
            .iter()
            .filter_map(|(id, b)| Some((b, mo.get(id)?)))
            .collect();
        if joined.is_empty() || 2 * joined.len() < mb.len().min(mo.len()) {
            return None;
        }
        let agree = joined
            .iter()
            .filter(|(b, o)| {
                let tolerance = (b.bytes_down as f64 * 0.05).max(1500.0);
                b.exchanges == o.exchanges
                    && ((b.bytes_down - o.bytes_down) as f64).abs() <= tolerance
            })
            .count();
        if 2 * agree < joined.len() {
            return None;
        }
        let pairs = joined
            .iter()
            .filter_map(|(b, o)| {
                Some((
                    b.response_time_us.filter(|v| *v > 0.0)?,
                    o.response_time_us.filter(|v| *v > 0.0)?,
                ))
            })
            .collect();
        Some((
            pairs,
            format!("{lb} and {lo} replay the same original connections"),
        ))
    }

    /// The difference OTHER − BASE of percentile `p` (or the mean, `None`) over the connections
    /// the two share ([`Report::pairs`]), with a paired bootstrap interval at `confidence`:
    /// connections are resampled together, so what both replays share (the workload) cancels
    /// and only the change is left in the interval. The point estimates are over the paired
    /// connections. `None` when the two are not paired or share fewer than two connections;
    /// the `usize` is the number of pairs.
    pub fn paired_difference(
        &self,
        k: usize,
        p: Option<f64>,
        confidence: f64,
    ) -> Option<(StatDiff, usize, String)> {
        let (pairs, how) = self.pairs(k)?;
        if pairs.len() < 2 {
            return None;
        }
        let reps = stats::paired_bootstrap(
            &pairs,
            p,
            self.options.bootstrap_replicates,
            input_seed(self.options.seed, k) ^ 0x7061_6972_6564, // "paired"
        );
        let point = |side: &dyn Fn(&(f64, f64)) -> f64| {
            let mut v: Vec<f64> = pairs.iter().map(side).collect();
            v.sort_by(f64::total_cmp);
            match p {
                Some(p) => stats::percentile_sorted(&v, p),
                None => stats::mean(&v),
            }
        };
        let (b, o) = (point(&|x| x.0), point(&|x| x.1));
        let (bc, oc): (Vec<f64>, Vec<f64>) = reps.into_iter().unzip();
        let name = p.map(stat_name).unwrap_or_else(|| "mean".into());
        Some((
            stat_diff(name, b, o, &bc, &oc, confidence),
            pairs.len(),
            how,
        ))
    }

    /// A plain-text summary for a terminal: inputs, the percentile table, KS, paired error,
    /// and the verdict lines.
    pub fn to_text(&self) -> String {
        crate::text::render(self)
    }
}

/// File stems, made unique by falling back to the file name and then to a counter.
fn unique_labels(paths: &[&Path]) -> Vec<String> {
    let stem = |p: &Path| {
        p.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| p.display().to_string())
    };
    let mut labels: Vec<String> = paths.iter().map(|p| stem(p)).collect();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for l in &labels {
        *seen.entry(l.clone()).or_default() += 1;
    }
    for (i, l) in labels.iter_mut().enumerate() {
        if seen[l.as_str()] > 1 {
            *l = format!("{l}#{}", i + 1);
        }
    }
    labels
}

fn metric(m: &Metric) -> PopulationMetric {
    PopulationMetric {
        dist: Distribution::of(&m.values),
        missing: m.missing,
    }
}

/// `meta.capture_vantage` of a capture (`unknown` when it does not say or says something
/// else); None for a synth workload.
fn capture_vantage(i: &Input) -> Option<String> {
    if i.role() == Some("synth") && !i.meta.contains_key("capture_vantage") {
        return None;
    }
    let v = i
        .meta
        .get("capture_vantage")
        .map(String::as_str)
        .filter(|v| matches!(*v, "server" | "client"))
        .unwrap_or("unknown");
    Some(v.to_string())
}

/// The warning for a comparison of captures taken at different or unknown vantage points:
/// at the client every response time carries about one more round trip than at the server.
/// None when both were captured at the same known point, or when one is a synth workload.
pub(crate) fn vantage_warning(
    (base, b): (&str, Option<&str>),
    (other, o): (&str, Option<&str>),
) -> Option<String> {
    let (b, o) = (b?, o?);
    if b == o && b != "unknown" {
        return None;
    }
    let at = |v: &str| match v {
        "unknown" => "at an unknown point".to_string(),
        v => format!("at the {v}"),
    };
    let head = format!("{base} was captured {}, {other} {}", at(b), at(o));
    Some(if b != "unknown" && o != "unknown" {
        format!(
            "{head}: response times measured at a client include about one more round trip than at the server, so part of the difference is where they were measured (capture both at the server: see GUIDE.md, vantage point)"
        )
    } else {
        format!(
            "{head} (meta capture_vantage, set by `mimic analyze --vantage`): the response times may not be measured alike"
        )
    })
}

/// The warning for a comparison that involves a replay whose timing was distorted (`meta`
/// `timing_health` = `distorted`, written by `mimic replay`; its reasons are in
/// `timing_health_detail`). None when every input is healthy or not a replay.
pub(crate) fn timing_warning(
    inputs: &[(&str, &std::collections::BTreeMap<String, String>)],
) -> Option<String> {
    let bad: Vec<String> = inputs
        .iter()
        .filter(|(_, m)| m.get("timing_health").map(String::as_str) == Some("distorted"))
        .map(|(label, m)| {
            let reasons = m
                .get("timing_health_detail")
                .and_then(|d| serde_json::from_str::<serde_json::Value>(d).ok())
                .and_then(|d| {
                    // the reasons, then the likely cause where the replay named one
                    d["reasons"].as_array().map(|r| {
                        r.iter()
                            .chain(std::iter::once(&d["cause"]))
                            .filter_map(|x| x.as_str())
                            .collect::<Vec<_>>()
                            .join("; ")
                    })
                })
                .filter(|r| !r.is_empty())
                .unwrap_or_else(|| "see its meta timing_health_detail".to_string());
            format!("{label} ({reasons})")
        })
        .collect();
    if bad.is_empty() {
        return None;
    }
    Some(format!(
        "the replay's own timing was distorted in {}: part of any difference is the host's error, not the workload's or the change's; rerun on a quieter host (GUIDE.md, timing health)",
        bad.join(" and ")
    ))
}

fn summarize(i: &Input, label: String) -> InputSummary {
    let mut population = BTreeMap::new();
    population.insert("min_rtt_us".to_string(), metric(&i.min_rtt_us));
    population.insert("bw_bps".to_string(), metric(&i.bw_bps));
    population.insert("loss_rate_down".to_string(), metric(&i.loss_rate_down));
    population.insert(
        "response_delay_us".to_string(),
        metric(&i.response_delay_us),
    );
    population.insert("query_delay_us".to_string(), metric(&i.query_delay_us));
    InputSummary {
        label,
        path: i.path.clone(),
        role: i.role().map(str::to_string),
        meta: i.meta.clone(),
        capture_vantage: capture_vantage(i),
        connections: i.connections,
        with_response_time: i.response_times_us.len(),
        excluded: i
            .excluded
            .iter()
            .map(|(reason, count)| Excluded {
                reason: reason.clone(),
                count: *count,
            })
            .collect(),
        response_time_us: Distribution::of(&i.response_times_us),
        population,
        exchanges: i.exchanges,
    }
}

/// Pairs OTHER's replayed connections with BASE's originals through OTHER's replay_map.
fn pair(
    base: &Input,
    other: &Input,
    base_label: &str,
    other_label: &str,
) -> (Option<Paired>, Option<String>) {
    let Some(map) = &other.replay_map else {
        return (None, None);
    };
    if map.is_empty() {
        return (None, None);
    }
    if base.role() == Some("replay") {
        return (
            None,
            Some(format!(
                "{other_label} is a replay, but {base_label} is itself a replay: {other_label}'s replay_map names connections of \
                 the workload both were replayed from, not of {base_label}, so there is no per-connection comparison"
            )),
        );
    }
    let foreign = map
        .iter()
        .filter(|r| {
            !base.by_id.contains_key(&r.orig_conn_id) && !base.damaged_ids.contains(&r.orig_conn_id)
        })
        .count();
    if foreign > 0 {
        return (
            None,
            Some(format!(
                "{other_label} has a replay_map, but {foreign} of its {} rows name connections {base_label} does not have: \
                 it is not a replay of {base_label}, so there is no per-connection comparison",
                map.len()
            )),
        );
    }
    // The ids match; do the connections? A replay reproduces each connection's exchanges and
    // response bytes, so most replayed connections must agree with the BASE connection of
    // that id. (Ids alone would pair a replay with any database of as many connections.)
    let mut checked = 0usize;
    let mut agree = 0usize;
    for r in map.iter().filter(|r| r.status == "ok") {
        let (Some(o), Some(p)) = (
            base.by_id.get(&r.orig_conn_id),
            r.replay_conn_id.and_then(|id| other.by_id.get(&id)),
        ) else {
            continue;
        };
        checked += 1;
        let tolerance = (o.bytes_down as f64 * 0.05).max(1500.0);
        if o.exchanges == p.exchanges && ((o.bytes_down - p.bytes_down) as f64).abs() <= tolerance {
            agree += 1;
        }
    }
    if checked > 0 && (agree as f64) < 0.5 * checked as f64 {
        return (
            None,
            Some(format!(
                "{other_label} has a replay_map naming connections of {base_label}, but only {agree} of {checked} replayed \
                 connections have the same number of exchanges and response bytes as the {base_label} connection they \
                 claim to reproduce: it does not look like a replay of {base_label}, so there is no per-connection comparison"
            )),
        );
    }
    let mut unpaired: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut pairs: Vec<(f64, input::ConnFacts)> = Vec::new(); // (relative error, original's facts)
    let mut replayed = std::collections::HashSet::new();
    for r in map {
        replayed.insert(r.orig_conn_id);
        let Some(&orig) = base.by_id.get(&r.orig_conn_id) else {
            // not foreign (checked above): its row in BASE is damaged and was left out
            *unpaired
                .entry((
                    r.status.clone(),
                    format!("original connection's row is damaged (left out of {base_label})"),
                ))
                .or_default() += 1;
            continue;
        };
        if r.status != "ok" {
            let reason = r
                .failure
                .clone()
                .filter(|f| !f.is_empty())
                .unwrap_or_else(|| "no reason recorded".into());
            *unpaired.entry((r.status.clone(), reason)).or_default() += 1;
            continue;
        }
        let replay_rt = r
            .replay_conn_id
            .and_then(|id| other.by_id.get(&id))
            .and_then(|f| f.response_time_us);
        let why = match (orig.response_time_us, r.replay_conn_id, replay_rt) {
            (None, _, _) => Some("original connection has no response time"),
            (Some(o), _, _) if o <= 0.0 => Some("original response time is 0"),
            (_, None, _) => Some("status ok but no replayed connection id"),
            (_, Some(id), _) if other.damaged_ids.contains(&id) => {
                Some("replayed connection's row is damaged (left out)")
            }
            (_, Some(id), _) if !other.by_id.contains_key(&id) => {
                Some("replayed connection id not in the replay's connections")
            }
            (_, _, None) => Some("replayed connection has no response time"),
            _ => None,
        };
        match why {
            Some(w) => *unpaired.entry(("ok".into(), w.into())).or_default() += 1,
            None => {
                let (o, p) = (orig.response_time_us.unwrap(), replay_rt.unwrap());
                pairs.push(((p - o) / o, orig));
            }
        }
    }
    let not_replayed = base
        .by_id
        .iter()
        .filter(|(id, f)| f.response_time_us.is_some() && !replayed.contains(*id))
        .count();
    let overall = ErrorStats::of("all".into(), pairs.iter().map(|p| p.0).collect());
    let breakdowns = vec![
        breakdown(
            "response_time",
            &pairs,
            |f| f.response_time_us,
            fmt::duration,
        ),
        breakdown("bandwidth", &pairs, |f| f.bw_bps, fmt::bitrate),
        breakdown("min_rtt", &pairs, |f| f.min_rtt_us, fmt::duration),
    ];
    let unpaired = unpaired
        .into_iter()
        .map(|((status, reason), count)| Unpaired {
            status,
            reason,
            count,
        })
        .collect();
    (
        Some(Paired {
            replay_map_rows: map.len(),
            consistent: agree,
            consistency_checked: checked,
            not_replayed,
            pairs: pairs.len(),
            unpaired,
            overall,
            breakdowns,
        }),
        None,
    )
}

/// Classes of the original connections by one property: one class per value when there are at
/// most five distinct values (a synthetic workload's bandwidth classes, say), otherwise the
/// quartiles of the paired connections' values, rounded to two significant digits; connections
/// without a value form an "unknown" class.
fn breakdown(
    by: &str,
    pairs: &[(f64, input::ConnFacts)],
    key: impl Fn(&input::ConnFacts) -> Option<f64>,
    label: fn(f64) -> String,
) -> Breakdown {
    let mut known: Vec<f64> = pairs.iter().filter_map(|p| key(&p.1)).collect();
    known.sort_by(f64::total_cmp);
    let mut distinct = known.clone();
    distinct.dedup();
    let mut classes = Vec::new();
    let method;
    if distinct.len() <= 5 {
        method = "one class per distinct value".to_string();
        for v in &distinct {
            let errs = pairs
                .iter()
                .filter(|p| key(&p.1) == Some(*v))
                .map(|p| p.0)
                .collect();
            classes.push(ErrorStats::of(label(*v), errs));
        }
    } else {
        method = "quartiles of the original connections' values (2 significant digits)".to_string();
        let mut bounds: Vec<f64> = [25.0, 50.0, 75.0]
            .iter()
            .map(|&p| round2(stats::percentile_sorted(&known, p)))
            .collect();
        bounds.dedup();
        bounds.retain(|&b| b > known[0]);
        let mut lo = f64::NEG_INFINITY;
        for i in 0..=bounds.len() {
            let hi = bounds.get(i).copied().unwrap_or(f64::INFINITY);
            let errs: Vec<f64> = pairs
                .iter()
                .filter(|p| key(&p.1).is_some_and(|v| v >= lo && v < hi))
                .map(|p| p.0)
                .collect();
            let name = match (lo.is_finite(), hi.is_finite()) {
                (false, true) => format!("< {}", label(hi)),
                (true, true) => format!("{} – {}", label(lo), label(hi)),
                (true, false) => format!("≥ {}", label(lo)),
                (false, false) => "all".into(),
            };
            if !errs.is_empty() {
                classes.push(ErrorStats::of(name, errs));
            }
            lo = hi;
        }
    }
    let unknown: Vec<f64> = pairs
        .iter()
        .filter(|p| key(&p.1).is_none())
        .map(|p| p.0)
        .collect();
    if !unknown.is_empty() {
        classes.push(ErrorStats::of("unknown".into(), unknown));
    }
    Breakdown {
        by: by.to_string(),
        method,
        classes,
    }
}

fn round2(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return v;
    }
    let mag = 10f64.powi(v.log10().floor() as i32 - 1);
    (v / mag).round() * mag
}

/// "OTHER vs BASE: p50 −12.0% [−15.1%, −9.2%], p90 −20.3% [−25.0%, −16.1%]: OTHER is faster;
/// the distributions differ (KS D=0.21, p<0.001)".
fn verdict_line(
    base: &str,
    other: &str,
    rows: &[StatDiff],
    ks: &KsTest,
    confidence: f64,
) -> String {
    let row = |s: &str| {
        rows.iter()
            .find(|r| r.stat == s)
            .expect("p50 and p90 are in the table")
    };
    let (p50, p90) = (row("p50"), row("p90"));
    let show = |r: &StatDiff| {
        format!(
            "{} {} [{}, {}]",
            r.stat,
            fmt::pct_signed(r.rel),
            fmt::pct_signed(r.rel_ci[0]),
            fmt::pct_signed(r.rel_ci[1])
        )
    };
    use Direction::*;
    let word = |d: Direction| match d {
        Faster => "faster",
        Slower => "slower",
        NotSignificant => "",
    };
    let level = format!("{}%", fmt::level(confidence));
    let finding = match (p50.direction, p90.direction) {
        (NotSignificant, NotSignificant) => {
            format!("no significant difference at p50 or p90 ({level} intervals include 0)")
        }
        (a, b) if a == b => format!("{other} is {}", word(a)),
        (a, NotSignificant) => format!(
            "{other} is {} at the median; no significant difference at p90",
            word(a)
        ),
        (NotSignificant, b) => format!(
            "{other} is {} at p90; no significant difference at the median",
            word(b)
        ),
        (a, b) => format!(
            "{other} is {} at the median but {} at p90",
            word(a),
            word(b)
        ),
    };
    let ks_words = if ks.p_value < 0.05 {
        format!(
            "the distributions differ (KS D={:.3}, {})",
            ks.d,
            fmt::p_value(ks.p_value)
        )
    } else {
        format!(
            "KS finds no significant difference between the distributions (D={:.3}, {})",
            ks.d,
            fmt::p_value(ks.p_value)
        )
    };
    format!(
        "{other} vs {base}: {}, {}: {finding}; {ks_words}",
        show(p50),
        show(p90)
    )
}

#[cfg(test)]
impl Report {
    /// A report over bare response-time samples (µs; BASE first), for tests of what is computed
    /// from them: no database, no population metrics, no replay_map.
    pub(crate) fn from_samples(samples: &[Vec<f64>], options: &Options) -> Report {
        let loaded = samples
            .iter()
            .enumerate()
            .map(|(k, s)| {
                let mut v = s.clone();
                v.sort_by(f64::total_cmp);
                Input {
                    path: PathBuf::from(format!("input{k}.db")),
                    meta: BTreeMap::new(),
                    connections: v.len() as u64,
                    response_times_us: v,
                    excluded: Vec::new(),
                    min_rtt_us: Default::default(),
                    bw_bps: Default::default(),
                    loss_rate_down: Default::default(),
                    response_delay_us: Default::default(),
                    query_delay_us: Default::default(),
                    exchanges: 0,
                    by_id: HashMap::new(),
                    damaged_ids: Default::default(),
                    replay_map: None,
                }
            })
            .collect();
        Report::from_inputs(loaded, options)
    }
}
