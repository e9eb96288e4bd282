//! `--fail-if`: a rollout gate. A condition on the difference between each OTHER and BASE; it
//! holds when it is true for at least one OTHER.
//!
//! Grammar (spaces optional, case-insensitive):
//!
//! ```text
//! condition := stat op value
//! stat      := "p" NUMBER          percentile 0–100 of the response time, e.g. p90, p99.9
//!            | "median"            = p50
//!            | "mean"
//! op        := ">" | ">=" | "<" | "<="
//! value     := SIGN? NUMBER "%"    relative difference (OTHER − BASE) / BASE
//!            | SIGN? NUMBER UNIT   absolute difference OTHER − BASE; UNIT = us | µs | ms | s
//! SIGN      := "+" | "-" | "−"     no sign means +
//! ```
//!
//! `p90 > +5%` holds when some OTHER's p90 is more than 5% above BASE's; `median < -10%` when
//! some OTHER's median is more than 10% below; `p99 >= 20ms` when some OTHER's p99 is at least
//! 20 ms above BASE's.
//!
//! Two forms. By default the condition is judged on the point estimates (the report shows
//! their intervals next to them). With a confidence level ([`FailIf::with_confidence`], the
//! CLI's `--confidence 95`) it is judged on the bootstrap interval of the difference at that
//! level, the same unpaired interval the report prints: `>`/`>=` hold only when the interval's
//! LOWER bound is beyond the threshold, `<`/`<=` only when its UPPER bound is. A difference
//! whose interval straddles the threshold does not hold, however far the point estimate is.

use serde::Serialize;

use crate::fmt;
use crate::report::{stat_name, Report};

/// The statistic a condition looks at.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stat {
    /// Percentile 0–100.
    Percentile(f64),
    Mean,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Op {
    #[serde(rename = ">")]
    Gt,
    #[serde(rename = ">=")]
    Ge,
    #[serde(rename = "<")]
    Lt,
    #[serde(rename = "<=")]
    Le,
}

/// The threshold: a relative difference (a fraction: 0.05 = +5%) or an absolute one (µs).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Threshold {
    Relative(f64),
    AbsoluteUs(f64),
}

/// Why a relative threshold cannot be judged: BASE's `what` is 0.
fn base_zero(what: &str, op: Op) -> String {
    format!(
        "BASE's {what} is 0, and a difference relative to 0 is undefined: give the threshold as a time (e.g. \"{} 5ms\")",
        op.symbol()
    )
}

/// A parsed `--fail-if` condition.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FailIf {
    pub text: String,
    pub stat: Stat,
    pub op: Op,
    pub threshold: Threshold,
    /// `None`: judged on the point estimate. `Some(0.95)`: judged on the 95% bootstrap interval
    /// of the difference, which must lie wholly beyond the threshold (see
    /// [`FailIf::with_confidence`]).
    pub confidence: Option<f64>,
}

/// Connections each side (pairs, where paired) below which a bootstrap interval says nothing:
/// every resample of one connection is that connection (an interval of one point), and a
/// handful give intervals far narrower than the truth's.
pub const MIN_INTERVAL_CONNECTIONS: usize = 10;

/// A condition evaluated against one OTHER.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub other: String,
    /// The point estimate of the difference: a fraction for a relative threshold, µs otherwise.
    pub value: f64,
    /// Under a confidence level: the bootstrap interval of the difference (same unit as
    /// `value`) that the condition was judged on; `None` in the point-estimate form, or when
    /// there is no interval (a relative difference to a BASE statistic of 0).
    pub interval: Option<[f64; 2]>,
    /// The confidence level of `interval` (0.95 = 95%), `None` in the point-estimate form.
    pub confidence: Option<f64>,
    /// Under a confidence level, how BASE's and OTHER's connections were paired (the interval
    /// is then a paired bootstrap over them, and `value` their difference); `None`: unpaired,
    /// the report's own interval.
    pub paired: Option<String>,
    /// What the point estimate alone says (equal to `holds` in the point-estimate form).
    pub point_holds: bool,
    pub holds: bool,
    /// Why the condition cannot be judged for this OTHER (then `holds` is false, and a gate is
    /// no answer: `mimic compare` exits 2): a relative threshold against a BASE statistic of
    /// 0, or an interval from fewer than [`MIN_INTERVAL_CONNECTIONS`] connections a side.
    pub undecided: Option<String>,
    /// E.g. "p90 +7.3% (is > +5.0%)", or with a level
    /// "p90 +7.3% [+5.9%, +8.8%] at 95%, unpaired: the whole interval is above +5.0%, significant".
    pub explanation: String,
}

#[derive(Debug, thiserror::Error, PartialEq)]
#[error("invalid --fail-if condition \"{text}\": {problem}. Expected STAT OP VALUE, e.g. \"p90 > +5%\", \"median < -10%\", \"mean >= 20ms\" (STAT: pN, median, mean; OP: > >= < <=; VALUE: a signed percent, or a time in us, ms or s)")]
pub struct FailIfError {
    pub text: String,
    pub problem: String,
}

impl FailIf {
    pub fn parse(text: &str) -> Result<FailIf, FailIfError> {
        let err = |problem: String| FailIfError {
            text: text.to_string(),
            problem,
        };
        let s = text.trim().to_lowercase();
        if s.is_empty() {
            return Err(err("it is empty".into()));
        }
        // statistic
        let op_at = s
            .find(['<', '>', '='])
            .ok_or_else(|| err("no comparison operator".into()))?;
        let stat_text = s[..op_at].trim();
        let stat = match stat_text {
            "mean" | "avg" | "average" => Stat::Mean,
            "median" => Stat::Percentile(50.0),
            t if t.starts_with('p') => {
                let p: f64 = t[1..].trim().parse().map_err(|_| {
                    err(format!(
                        "\"{stat_text}\" is not a percentile (write p50, p90, p99.9)"
                    ))
                })?;
                if !(0.0..=100.0).contains(&p) {
                    return Err(err(format!("percentile {p} is outside 0–100")));
                }
                Stat::Percentile(p)
            }
            "" => return Err(err("the statistic is missing before the operator".into())),
            t => return Err(err(format!("unknown statistic \"{t}\""))),
        };
        // operator
        let rest = &s[op_at..];
        let (op, rest) = if let Some(r) = rest.strip_prefix(">=") {
            (Op::Ge, r)
        } else if let Some(r) = rest.strip_prefix("<=") {
            (Op::Le, r)
        } else if let Some(r) = rest.strip_prefix('>') {
            (Op::Gt, r)
        } else if let Some(r) = rest.strip_prefix('<') {
            (Op::Lt, r)
        } else {
            return Err(err(format!(
                "\"{}\" is not an operator (use >, >=, < or <=)",
                rest.chars().take(2).collect::<String>()
            )));
        };
        // value
        let v = rest.trim();
        if v.is_empty() {
            return Err(err("the value is missing after the operator".into()));
        }
        if v.starts_with(['<', '>', '=']) {
            return Err(err(format!(
                "\"{}\" is not an operator (use >, >=, < or <=)",
                s[op_at..].trim()
            )));
        }
        let (negative, body) =
            if let Some(b) = v.strip_prefix('-').or_else(|| v.strip_prefix('\u{2212}')) {
                (true, b.trim_start())
            } else if let Some(b) = v.strip_prefix('+') {
                (false, b.trim_start())
            } else {
                (false, v)
            };
        let num_end = body
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(body.len());
        let (num, unit) = (&body[..num_end], body[num_end..].trim());
        let n: f64 = num
            .parse()
            .map_err(|_| err(format!("\"{v}\" does not start with a number")))?;
        let n = if negative { -n } else { n };
        let threshold = match unit {
            "%" => Threshold::Relative(n / 100.0),
            "us" | "µs" | "μs" => Threshold::AbsoluteUs(n),
            "ms" => Threshold::AbsoluteUs(n * 1e3),
            "s" => Threshold::AbsoluteUs(n * 1e6),
            "" => {
                return Err(err(format!(
                    "\"{v}\" has no unit: write % for a relative difference or us/ms/s for a time"
                )))
            }
            u => return Err(err(format!("unknown unit \"{u}\" (use %, us, ms or s)"))),
        };
        Ok(FailIf {
            text: text.trim().to_string(),
            stat,
            op,
            threshold,
            confidence: None,
        })
    }

    /// The same condition judged on the confidence interval at `level` (0.95 = 95%) instead
    /// of the point estimate: it then holds for an OTHER only when the whole interval lies
    /// beyond the threshold. `None` is the point-estimate form.
    pub fn with_confidence(mut self, level: Option<f64>) -> FailIf {
        self.confidence = level;
        self
    }

    /// True when the condition holds for at least one OTHER.
    pub fn holds(&self, report: &Report) -> bool {
        self.evaluate(report).iter().any(|o| o.holds)
    }

    /// The condition against each OTHER: on the point estimate, or, with a confidence level,
    /// on the bound of the interval nearest the threshold's side (the lower bound for `>` and
    /// `>=`, the upper bound for `<` and `<=`).
    pub fn evaluate(&self, report: &Report) -> Vec<Outcome> {
        let p = match self.stat {
            Stat::Percentile(p) => Some(p),
            Stat::Mean => None,
        };
        let stat = match p {
            Some(p) => stat_name(p),
            None => "mean".into(),
        };
        let (limit, limit_shown) = match self.threshold {
            Threshold::Relative(t) => (t, fmt::pct_signed(t)),
            Threshold::AbsoluteUs(t) => (t, fmt::ms_signed(t)),
        };
        let show = |v: f64| match self.threshold {
            Threshold::Relative(_) => fmt::pct_signed(v),
            Threshold::AbsoluteUs(_) => fmt::ms_signed(v),
        };
        let op = self.op.symbol();
        (1..report.inputs.len())
            .map(|k| {
                let other = report.inputs[k].label.clone();
                let Some(level) = self.confidence else {
                    let base = report.stat_us(0, p);
                    let o = report.stat_us(k, p);
                    let value = match self.threshold {
                        Threshold::Relative(_) if base > 0.0 => (o - base) / base,
                        Threshold::Relative(_) => f64::NAN,
                        Threshold::AbsoluteUs(_) => o - base,
                    };
                    let holds = self.op.test(value, limit);
                    let undecided = value.is_nan().then(|| base_zero(&stat, self.op));
                    return Outcome {
                        other,
                        value,
                        interval: None,
                        confidence: None,
                        paired: None,
                        point_holds: holds,
                        holds,
                        explanation: match &undecided {
                            Some(why) => format!("{stat} {}: {why}", show(value)),
                            None => format!(
                                "{stat} {} ({} {op} {limit_shown})",
                                show(value),
                                if holds { "is" } else { "is not" },
                            ),
                        },
                        undecided,
                    };
                };
                // Paired where the report pairs BASE's and OTHER's connections (a replay of
                // BASE, two replays of one workload), unpaired otherwise.
                let (row, paired) = match report.paired_difference(k, p, level) {
                    Some((row, n, how)) => (row, Some((n, how))),
                    None => (report.difference(k, p, level), None),
                };
                let (value, ci) = match self.threshold {
                    Threshold::Relative(_) => (row.rel, row.rel_ci),
                    Threshold::AbsoluteUs(_) => (row.diff_us, row.diff_ci_us),
                };
                let point_holds = self.op.test(value, limit);
                let level_shown = level_name(level);
                let head = format!(
                    "{stat} {} [{}, {}] at {level_shown}, {}",
                    show(value),
                    show(ci[0]),
                    show(ci[1]),
                    match &paired {
                        Some((n, _)) => format!("paired over {n} connections"),
                        None => "unpaired".to_string(),
                    }
                );
                let n = match &paired {
                    Some((n, _)) => *n,
                    None => report.samples[0].len().min(report.samples[k].len()),
                };
                let undecided = if n < MIN_INTERVAL_CONNECTIONS {
                    Some(format!(
                        "{n} connection{} {}: too few for a {level_shown} interval (at least {MIN_INTERVAL_CONNECTIONS} {})",
                        if n == 1 { "" } else { "s" },
                        if paired.is_some() { "paired" } else { "on the smaller side" },
                        if paired.is_some() { "pairs" } else { "each side" },
                    ))
                } else if !(ci[0].is_finite() && ci[1].is_finite()) {
                    Some(format!(
                        "no {level_shown} interval: {}",
                        base_zero(&format!("{stat} in the resamples"), self.op)
                    ))
                } else {
                    None
                };
                if let Some(why) = undecided {
                    return Outcome {
                        other,
                        value,
                        interval: None,
                        confidence: Some(level),
                        paired: paired.as_ref().map(|p| p.1.clone()),
                        point_holds,
                        holds: false,
                        explanation: format!("{stat} {}: {why}", show(value)),
                        undecided: Some(why),
                    };
                }
                // The bound on the threshold's side decides; the other bound tells whether the
                // interval lies wholly on the other side or straddles the threshold.
                let (near, far) = match self.op {
                    Op::Gt | Op::Ge => (ci[0], ci[1]),
                    Op::Lt | Op::Le => (ci[1], ci[0]),
                };
                let holds = self.op.test(near, limit);
                let (beyond, short) = match self.op {
                    Op::Gt => ("above", "at or below"),
                    Op::Ge => ("at or above", "below"),
                    Op::Lt => ("below", "at or above"),
                    Op::Le => ("at or below", "above"),
                };
                let explanation = if holds {
                    format!("{head}: the whole interval is {beyond} {limit_shown}, significant")
                } else if !self.op.test(far, limit) {
                    format!("{head}: the whole interval is {short} {limit_shown}")
                } else {
                    format!(
                        "{head}: the interval straddles {limit_shown}, not significant (the point estimate alone {} {op} {limit_shown})",
                        if point_holds { "is" } else { "is not" }
                    )
                };
                Outcome {
                    other,
                    value,
                    interval: Some(ci),
                    confidence: Some(level),
                    paired: paired.as_ref().map(|p| p.1.clone()),
                    point_holds,
                    holds,
                    explanation,
                    undecided: None,
                }
            })
            .collect()
    }

    /// Whether the condition could not be judged for some OTHER (see [`Outcome::undecided`]).
    pub fn undecided(outcomes: &[Outcome]) -> bool {
        outcomes.iter().any(|o| o.undecided.is_some())
    }

    /// How the gate is shown: the condition, with the level when it is judged on intervals:
    /// `"p90 > +5%" at 95% confidence`.
    pub fn describe(&self) -> String {
        match self.confidence {
            None => format!("\"{}\"", self.text),
            Some(c) => format!("\"{}\" at {} confidence", self.text, level_name(c)),
        }
    }
}

impl Op {
    pub fn symbol(self) -> &'static str {
        match self {
            Op::Gt => ">",
            Op::Ge => ">=",
            Op::Lt => "<",
            Op::Le => "<=",
        }
    }

    /// `value OP limit`; false for a value that is not a number.
    fn test(self, value: f64, limit: f64) -> bool {
        value.is_finite()
            && match self {
                Op::Gt => value > limit,
                Op::Ge => value >= limit,
                Op::Lt => value < limit,
                Op::Le => value <= limit,
            }
    }
}

/// 0.95 → "95%", 0.999 → "99.9%".
fn level_name(level: f64) -> String {
    format!("{}%", fmt::level(level))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_grammar() {
        let f = FailIf::parse("p90 > +5%").unwrap();
        assert_eq!(
            (f.stat, f.op, f.threshold),
            (Stat::Percentile(90.0), Op::Gt, Threshold::Relative(0.05))
        );
        let f = FailIf::parse("  P99.9>=20ms ").unwrap();
        assert_eq!(
            (f.stat, f.op, f.threshold),
            (
                Stat::Percentile(99.9),
                Op::Ge,
                Threshold::AbsoluteUs(20_000.0)
            )
        );
        let f = FailIf::parse("median < -10%").unwrap();
        assert_eq!(
            (f.stat, f.op, f.threshold),
            (Stat::Percentile(50.0), Op::Lt, Threshold::Relative(-0.10))
        );
        let f = FailIf::parse("mean <= \u{2212}1.5 s").unwrap();
        assert_eq!(
            (f.stat, f.op, f.threshold),
            (Stat::Mean, Op::Le, Threshold::AbsoluteUs(-1.5e6))
        );
        let f = FailIf::parse("p50 > 250us").unwrap();
        assert_eq!(f.threshold, Threshold::AbsoluteUs(250.0));
        let f = FailIf::parse("p50 > 5%").unwrap();
        assert_eq!(f.threshold, Threshold::Relative(0.05));
    }

    #[test]
    fn rejects_bad_conditions_clearly() {
        for (text, needle) in [
            ("", "empty"),
            ("p90 5%", "no comparison operator"),
            ("p90 >> 5%", "not an operator"),
            ("p90 => 5%", "not an operator"),
            ("p90 > 5", "no unit"),
            ("p90 > 5 parsecs", "unknown unit"),
            ("p900 > 5%", "outside 0–100"),
            ("px > 5%", "not a percentile"),
            ("max > 5%", "unknown statistic"),
            ("> 5%", "statistic is missing"),
            ("p90 >", "value is missing"),
            ("p90 > fast", "does not start with a number"),
        ] {
            let e = FailIf::parse(text).unwrap_err();
            assert!(e.problem.contains(needle), "{text:?}: {}", e.problem);
            assert!(e.to_string().contains("Expected STAT OP VALUE"), "{e}");
        }
    }

    /// Deterministic log-normal-ish response times (µs): median ~`median`, spread `sigma`.
    fn sample(n: usize, median: f64, sigma: f64, seed: u64) -> Vec<f64> {
        let mut x = seed;
        let mut u = move || {
            // splitmix64
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
        };
        (0..n)
            .map(|_| {
                // Box–Muller
                let (a, b) = (u().max(1e-12), u());
                let z = (-2.0 * a.ln()).sqrt() * (2.0 * std::f64::consts::PI * b).cos();
                (median * (sigma * z).exp()).round()
            })
            .collect()
    }

    fn report(samples: &[Vec<f64>]) -> Report {
        Report::from_samples(
            samples,
            &crate::Options {
                bootstrap_replicates: 1000,
                ..Default::default()
            },
        )
    }

    fn gate(text: &str, level: f64) -> FailIf {
        FailIf::parse(text).unwrap().with_confidence(Some(level))
    }

    #[test]
    fn a_real_shift_with_a_tight_interval_fires() {
        let base = sample(2000, 50_000.0, 0.5, 1);
        let slower: Vec<f64> = sample(2000, 50_000.0, 0.5, 2)
            .iter()
            .map(|v| v * 1.2)
            .collect();
        let r = report(&[base, slower]);
        let o = &gate("p90 > +5%", 0.95).evaluate(&r)[0];
        let [lo, hi] = o.interval.unwrap();
        assert!(o.holds && o.point_holds, "{o:?}");
        assert!(lo > 0.05 && lo < o.value && o.value < hi, "{o:?}");
        assert!(
            o.explanation
                .contains("at 95%, unpaired: the whole interval is above +5.0%, significant"),
            "{}",
            o.explanation
        );
        // the same shift, seen from the other side
        let o = &gate("median < -5%", 0.95).evaluate(&r)[0];
        assert!(!o.holds, "{o:?}");
        assert!(
            o.explanation.contains("the whole interval is at or above"),
            "{}",
            o.explanation
        );
        // the mean and an absolute threshold have intervals of their own
        let o = &gate("mean > 5ms", 0.95).evaluate(&r)[0];
        assert!(o.holds, "{o:?}");
        assert!(o.interval.unwrap()[0] > 5_000.0, "{o:?}");
    }

    #[test]
    fn noise_with_a_wide_interval_straddling_the_threshold_does_not_fire() {
        // 15 connections each, very spread out, OTHER 8% slower at every percentile: the point
        // estimate of p90 is +8%, but the interval reaches far on both sides
        let base = sample(15, 50_000.0, 1.2, 3);
        let other: Vec<f64> = base.iter().map(|v| v * 1.08).collect();
        let r = report(&[base, other]);
        let point = &FailIf::parse("p90 > +5%").unwrap().evaluate(&r)[0];
        let o = &gate("p90 > +5%", 0.95).evaluate(&r)[0];
        assert!(point.holds, "the point form fires on this noise: {point:?}");
        assert!(o.point_holds && !o.holds, "{o:?}");
        let [lo, hi] = o.interval.unwrap();
        assert!(lo < 0.05 && hi > 0.05, "{o:?}");
        assert!(
            o.explanation.contains(
                "the interval straddles +5.0%, not significant (the point estimate alone is > +5.0%)"
            ),
            "{}",
            o.explanation
        );
        // two samples of the same distribution: silent both ways
        let r = report(&[sample(500, 50_000.0, 0.5, 5), sample(500, 50_000.0, 0.5, 6)]);
        for text in [
            "p90 > +5%",
            "p90 < -5%",
            "median > +2%",
            "median < -2%",
            "mean > 2ms",
        ] {
            let o = &gate(text, 0.95).evaluate(&r)[0];
            assert!(!o.holds, "{text}: {o:?}");
        }
    }

    #[test]
    fn boundaries_strict_and_inclusive() {
        // every resample of a constant sample is that constant: the interval is one point,
        // exactly on the threshold
        let r = report(&[vec![1000.0; 50], vec![1100.0; 50]]);
        for (text, holds) in [
            ("p50 > 100us", false),
            ("p50 >= 100us", true),
            ("p50 < 100us", false),
            ("p50 <= 100us", true),
            ("p50 > +10%", false),
            ("p50 >= +10%", true),
            ("p50 <= 10%", true),
            ("mean >= 0.1ms", true),
        ] {
            let o = &gate(text, 0.95).evaluate(&r)[0];
            assert_eq!(o.holds, holds, "{text}: {o:?}");
            assert_eq!(o.point_holds, holds, "{text}: {o:?}");
        }
        // BASE of 0: no relative interval, so a relative condition cannot be judged (on the
        // interval or the point estimate); an absolute one can
        let r = report(&[vec![0.0; 20], vec![500.0; 20]]);
        let o = &gate("p50 > +5%", 0.95).evaluate(&r)[0];
        assert!(!o.holds && o.interval.is_none(), "{o:?}");
        assert!(
            o.explanation.contains("no 95% interval")
                && o.undecided
                    .as_deref()
                    .unwrap()
                    .contains("BASE's p50 in the resamples is 0"),
            "{o:?}"
        );
        let point = &FailIf::parse("p50 > +5%").unwrap().evaluate(&r)[0];
        assert!(!point.holds && point.undecided.is_some(), "{point:?}");
        assert!(
            point.explanation.contains("give the threshold as a time"),
            "{point:?}"
        );
        assert!(gate("p50 > 400us", 0.95).holds(&r));
        assert!(!FailIf::undecided(&gate("p50 > 400us", 0.95).evaluate(&r)));
        // one connection a side: every resample is that connection, an interval of one point;
        // nine are too few as well, ten are enough
        for (n, decided) in [(1, false), (9, false), (10, true)] {
            let r = report(&[vec![1000.0; n], vec![9000.0; n]]);
            let o = &gate("p90 > +5%", 0.95).evaluate(&r)[0];
            assert_eq!(o.undecided.is_none(), decided, "{n}: {o:?}");
            assert_eq!(o.holds, decided, "{n}: {o:?}");
            if !decided {
                assert!(
                    o.explanation.contains("too few for a 95% interval"),
                    "{o:?}"
                );
            }
            // the point estimate needs no interval
            assert!(FailIf::parse("p90 > +5%").unwrap().holds(&r), "{n}");
        }
    }

    #[test]
    fn the_level_drives_the_interval_used() {
        let base = sample(60, 50_000.0, 0.6, 7);
        let other: Vec<f64> = sample(60, 50_000.0, 0.6, 8)
            .iter()
            .map(|v| v * 1.25)
            .collect();
        let r = report(&[base, other]);
        // at the report's level the gate's interval is the table's
        let row = r.comparisons[0]
            .rows
            .iter()
            .find(|x| x.stat == "p50")
            .unwrap();
        let o = &gate("p50 > 0%", 0.95).evaluate(&r)[0];
        assert_eq!(o.interval.unwrap(), row.rel_ci);
        // a threshold between the 80% and the 99% lower bounds: fires at 80%, not at 99%
        let lo80 = r.difference(1, Some(50.0), 0.80).rel_ci[0];
        let lo99 = r.difference(1, Some(50.0), 0.99).rel_ci[0];
        assert!(lo99 < lo80, "{lo99} {lo80}");
        let t = (lo80 + lo99) / 2.0 * 100.0;
        let text = format!("p50 > {t}%");
        assert!(gate(&text, 0.80).holds(&r), "{text}");
        assert!(!gate(&text, 0.99).holds(&r), "{text}");
        assert!(gate(&text, 0.99).evaluate(&r)[0]
            .explanation
            .contains("at 99%"));
        // a percentile outside the table gets an interval from the same resamples
        let p80 = r.difference(1, Some(80.0), 0.95);
        assert!(
            p80.rel_ci[0] < p80.rel && p80.rel < p80.rel_ci[1],
            "{p80:?}"
        );
        assert_eq!(p80.stat, "p80");
        assert_eq!(r.difference(1, Some(80.0), 0.95).rel_ci, p80.rel_ci);
    }

    #[test]
    fn wider_levels_need_more_resamples() {
        use crate::report::min_replicates;
        assert_eq!(min_replicates(0.95), 100);
        assert_eq!(min_replicates(0.90), 100);
        assert_eq!(min_replicates(0.99), 500);
        assert_eq!(min_replicates(0.999), 5000);
        assert_eq!(level_name(0.999), "99.9%");
        assert_eq!(level_name(0.95), "95%");
    }

    #[test]
    fn several_others_are_judged_each_on_its_own_interval() {
        let base = sample(1000, 50_000.0, 0.5, 9);
        let same = sample(1000, 50_000.0, 0.5, 10);
        let faster: Vec<f64> = sample(1000, 50_000.0, 0.5, 11)
            .iter()
            .map(|v| v * 0.8)
            .collect();
        let r = report(&[base, same, faster]);
        let g = gate("median < -5%", 0.95);
        let o = g.evaluate(&r);
        assert_eq!((o[0].holds, o[1].holds), (false, true), "{o:?}");
        assert!(g.holds(&r));
        assert_eq!(g.describe(), "\"median < -5%\" at 95% confidence");
        assert_eq!(
            FailIf::parse("median < -5%").unwrap().describe(),
            "\"median < -5%\""
        );
    }
}
