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
//! 20 ms above BASE's. The condition is evaluated on the point estimates (the report shows their
//! confidence intervals next to them).

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

/// A parsed `--fail-if` condition.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FailIf {
    pub text: String,
    pub stat: Stat,
    pub op: Op,
    pub threshold: Threshold,
}

/// A condition evaluated against one OTHER.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub other: String,
    /// The difference it was evaluated on: a fraction for a relative threshold, µs otherwise.
    pub value: f64,
    pub holds: bool,
    /// E.g. "p90 +7.3% (> +5.0%)".
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
        })
    }

    /// True when the condition holds for at least one OTHER.
    pub fn holds(&self, report: &Report) -> bool {
        self.evaluate(report).iter().any(|o| o.holds)
    }

    /// The condition against each OTHER.
    pub fn evaluate(&self, report: &Report) -> Vec<Outcome> {
        let p = match self.stat {
            Stat::Percentile(p) => Some(p),
            Stat::Mean => None,
        };
        let stat = match p {
            Some(p) => stat_name(p),
            None => "mean".into(),
        };
        let base = report.stat_us(0, p);
        (1..report.inputs.len())
            .map(|k| {
                let other = report.stat_us(k, p);
                let (value, shown, limit) = match self.threshold {
                    Threshold::Relative(t) => {
                        let rel = if base > 0.0 {
                            (other - base) / base
                        } else {
                            f64::NAN
                        };
                        (rel, fmt::pct_signed(rel), (t, fmt::pct_signed(t)))
                    }
                    Threshold::AbsoluteUs(t) => (
                        other - base,
                        fmt::ms_signed(other - base),
                        (t, fmt::ms_signed(t)),
                    ),
                };
                let holds = value.is_finite()
                    && match self.op {
                        Op::Gt => value > limit.0,
                        Op::Ge => value >= limit.0,
                        Op::Lt => value < limit.0,
                        Op::Le => value <= limit.0,
                    };
                let op = match self.op {
                    Op::Gt => ">",
                    Op::Ge => ">=",
                    Op::Lt => "<",
                    Op::Le => "<=",
                };
                Outcome {
                    other: report.inputs[k].label.clone(),
                    value,
                    holds,
                    explanation: format!(
                        "{stat} {shown} ({} {op} {})",
                        if holds { "is" } else { "is not" },
                        limit.1
                    ),
                }
            })
            .collect()
    }
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
}
