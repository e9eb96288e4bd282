//! Two replays of the same workload, compared connection by connection: the A/B a stack
//! change calls for. Both replays reproduce the same original connections, so each
//! connection's response time under B is set against its own time under A; the paired
//! differences are far more telling than two independent distributions.

use std::collections::HashMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::fmt;
use crate::input::Input;
use crate::report::Direction;
use crate::stats;

#[derive(Debug, Clone, Serialize)]
pub struct AbComparison {
    /// The reference replay (A) and the changed one (B).
    pub a: String,
    pub b: String,
    /// Original connections both replays reproduced with a response time.
    pub n: usize,
    /// Median over connections of (B − A) / A, with its bootstrap interval.
    pub median_rel: f64,
    pub median_rel_ci: [f64; 2],
    /// Σ B / Σ A − 1 (the change of the mean), with its bootstrap interval.
    pub total_rel: f64,
    pub total_rel_ci: [f64; 2],
    /// Shares of connections more than 1% faster / slower under B.
    pub faster: f64,
    pub slower: f64,
    /// Wilcoxon signed-rank test of ln(B/A) (two-sided, normal approximation with tie and
    /// continuity corrections).
    pub wilcoxon_z: f64,
    pub wilcoxon_p: f64,
    pub direction: Direction,
    pub verdict: String,
    /// Set when A or B is a replay whose own timing was distorted (see
    /// [`crate::report::Comparison::timing_warning`]).
    pub timing_warning: Option<String>,
}

/// Response times (µs) of a replay by the original connection they reproduce.
fn by_original(r: &Input) -> HashMap<i64, f64> {
    let mut m = HashMap::new();
    for row in r
        .replay_map
        .iter()
        .flatten()
        .filter(|row| row.status == "ok")
    {
        if let Some(rt) = row
            .replay_conn_id
            .and_then(|id| r.by_id.get(&id))
            .and_then(|f| f.response_time_us)
        {
            if rt > 0.0 {
                m.insert(row.orig_conn_id, rt);
            }
        }
    }
    m
}

/// Standard normal upper tail, 2·(1 − Φ(|z|)) as erfc(|z|/√2); erfc by the Chebyshev fit of
/// Numerical Recipes (fractional error below 1.2e-7).
pub(crate) fn two_sided_normal_p(z: f64) -> f64 {
    let x = z.abs() / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.5 * x);
    let y = t
        * (-x * x - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    y.clamp(0.0, 1.0)
}

/// Wilcoxon signed-rank test of `d` (zeros dropped): (z, two-sided p), or None with fewer
/// than one non-zero difference.
pub(crate) fn wilcoxon(d: &[f64]) -> Option<(f64, f64)> {
    let mut nz: Vec<f64> = d
        .iter()
        .copied()
        .filter(|x| *x != 0.0 && x.is_finite())
        .collect();
    let n = nz.len();
    if n == 0 {
        return None;
    }
    nz.sort_by(|a, b| a.abs().total_cmp(&b.abs()));
    // average ranks over ties of |d|
    let mut w_plus = 0.0;
    let mut tie_term = 0.0;
    let mut i = 0;
    while i < n {
        let mut j = i;
        while j + 1 < n && nz[j + 1].abs() == nz[i].abs() {
            j += 1;
        }
        let rank = (i + j + 2) as f64 / 2.0;
        let t = (j - i + 1) as f64;
        tie_term += t * t * t - t;
        for x in &nz[i..=j] {
            if *x > 0.0 {
                w_plus += rank;
            }
        }
        i = j + 1;
    }
    let nf = n as f64;
    let mean = nf * (nf + 1.0) / 4.0;
    let var = nf * (nf + 1.0) * (2.0 * nf + 1.0) / 24.0 - tie_term / 48.0;
    if var <= 0.0 {
        return Some((0.0, 1.0));
    }
    // continuity correction towards the mean; none at the mean itself (0.0.signum() is 1)
    let dev = w_plus - mean;
    let correction = if dev == 0.0 { 0.0 } else { 0.5 * dev.signum() };
    let z = (dev - correction) / var.sqrt();
    Some((z, two_sided_normal_p(z)))
}

fn median_in_place(v: &mut [f64]) -> f64 {
    let n = v.len();
    let mid = n / 2;
    let (_, m, _) = v.select_nth_unstable_by(mid, f64::total_cmp);
    let hi = *m;
    if n % 2 == 1 {
        hi
    } else {
        let lo = v[..mid].iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (lo + hi) / 2.0
    }
}

/// Compares replay `b` with replay `a` over the original connections both reproduced.
pub(crate) fn compare(
    a: &Input,
    b: &Input,
    la: &str,
    lb: &str,
    replicates: usize,
    seed: u64,
    confidence: f64,
) -> Option<AbComparison> {
    let ma = by_original(a);
    let mb = by_original(b);
    let mut pairs: Vec<(i64, f64, f64)> = ma
        .iter()
        .filter_map(|(id, ra)| mb.get(id).map(|rb| (*id, *ra, *rb)))
        .collect();
    if pairs.len() < 2 {
        return None;
    }
    pairs.sort_by_key(|p| p.0);
    let n = pairs.len();
    let rel: Vec<f64> = pairs.iter().map(|(_, a, b)| (b - a) / a).collect();
    let logs: Vec<f64> = pairs.iter().map(|(_, a, b)| (b / a).ln()).collect();
    let median_rel = median_in_place(&mut rel.clone());
    let (sa, sb): (f64, f64) = pairs
        .iter()
        .fold((0.0, 0.0), |(x, y), (_, a, b)| (x + a, y + b));
    let total_rel = sb / sa - 1.0;
    // bootstrap over connections (pairs resampled together)
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xab_ab);
    let mut meds = Vec::with_capacity(replicates);
    let mut tots = Vec::with_capacity(replicates);
    let mut buf = vec![0f64; n];
    for _ in 0..replicates {
        let (mut x, mut y) = (0.0, 0.0);
        for slot in buf.iter_mut() {
            let k = rng.random_range(0..n);
            *slot = rel[k];
            x += pairs[k].1;
            y += pairs[k].2;
        }
        meds.push(median_in_place(&mut buf));
        tots.push(y / x - 1.0);
    }
    let (mlo, mhi) = stats::percentile_interval(&meds, confidence);
    let (tlo, thi) = stats::percentile_interval(&tots, confidence);
    let faster = rel.iter().filter(|r| **r < -0.01).count() as f64 / n as f64;
    let slower = rel.iter().filter(|r| **r > 0.01).count() as f64 / n as f64;
    let (z, p) = wilcoxon(&logs).unwrap_or((0.0, 1.0));
    let direction = if mhi < 0.0 && p < 1.0 - confidence {
        Direction::Faster
    } else if mlo > 0.0 && p < 1.0 - confidence {
        Direction::Slower
    } else {
        Direction::NotSignificant
    };
    let finding = match direction {
        Direction::Faster => format!("{lb} is faster"),
        Direction::Slower => format!("{lb} is slower"),
        Direction::NotSignificant => "no significant change".to_string(),
    };
    let level = format!("{}%", crate::fmt::level(confidence));
    let verdict = format!(
        "{lb} vs {la} (the same {n} connections, paired): median change {} [{}, {}], total {} [{}, {}] ({level} intervals); faster for {}, slower for {} of connections (Wilcoxon signed-rank {}): {finding}",
        fmt::pct_signed(median_rel),
        fmt::pct_signed(mlo),
        fmt::pct_signed(mhi),
        fmt::pct_signed(total_rel),
        fmt::pct_signed(tlo),
        fmt::pct_signed(thi),
        fmt::pct(faster, 0),
        fmt::pct(slower, 0),
        fmt::p_value(p)
    );
    Some(AbComparison {
        a: la.to_string(),
        b: lb.to_string(),
        n,
        median_rel,
        median_rel_ci: [mlo, mhi],
        total_rel,
        total_rel_ci: [tlo, thi],
        faster,
        slower,
        wilcoxon_z: z,
        wilcoxon_p: p,
        direction,
        verdict,
        timing_warning: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// Reference values from scipy (`tests/reference/gen.py`, its "wilcoxon" cases:
    /// `scipy.stats.wilcoxon(d, zero_method='wilcox', correction=True, method='approx')`).
    const EXPECTED: &str = include_str!("../tests/reference/expected.json");

    /// One side of a case, in gen.py's order (pairs are matched by position): a sample
    /// regenerated from its spec and checked against gen.py's, or explicit values.
    fn values(case: &Value, key: &str) -> Vec<f64> {
        let v = &case[key];
        if let Some(list) = v.as_array() {
            return list.iter().map(|x| x.as_f64().unwrap()).collect();
        }
        crate::stats::tests::sample_in_order(v, &case[format!("{key}_check")])
    }

    /// The case's differences, as `compare` forms them (ln(B/A)) or as plain B − A.
    fn differences(case: &Value) -> Vec<f64> {
        let (a, b) = (values(case, "a"), values(case, "b"));
        assert_eq!(a.len(), b.len());
        let log = match case["transform"].as_str().unwrap() {
            "log_ratio" => true,
            "diff" => false,
            t => panic!("unknown transform {t}"),
        };
        a.iter()
            .zip(&b)
            .map(|(x, y)| if log { (y / x).ln() } else { y - x })
            .collect()
    }

    fn cases() -> Vec<Value> {
        let e: Value = serde_json::from_str(EXPECTED).unwrap();
        e["wilcoxon"].as_array().unwrap().clone()
    }

    /// W+ exactly at its mean n(n+1)/4 (scipy applies no continuity correction there).
    fn at_the_mean(c: &Value) -> bool {
        let n = c["n_nonzero"].as_f64().unwrap();
        c["w_plus"].as_f64() == Some(n * (n + 1.0) / 4.0)
    }

    /// One case against scipy: no result exactly when scipy's is nan (no non-zero
    /// difference); |z| to 1e-9 relative, z signed by W+ − n(n+1)/4 (B slower: positive),
    /// p to the 1.2e-7 of the erfc fit (1e-6 relative, tails down to 1e-26 included).
    fn check_case(c: &Value) {
        let name = c["name"].as_str().unwrap();
        let d = differences(c);
        assert_eq!(
            d.iter().filter(|x| **x != 0.0).count() as u64,
            c["n_nonzero"].as_u64().unwrap(),
            "{name}: non-zero differences"
        );
        let got = wilcoxon(&d);
        let Some(p_ref) = c["p"].as_f64() else {
            assert_eq!(got, None, "{name}: scipy has no result");
            return;
        };
        let (z, p) = got.unwrap_or_else(|| panic!("{name}: no result, scipy p = {p_ref}"));
        let z_ref = c["z"].as_f64().unwrap();
        assert!(
            (z.abs() - z_ref.abs()).abs() <= 1e-9 * z_ref.abs() + 1e-12,
            "{name}: z {z} vs scipy {z_ref}"
        );
        let n = c["n_nonzero"].as_f64().unwrap();
        let dev = c["w_plus"].as_f64().unwrap() - n * (n + 1.0) / 4.0;
        if z_ref != 0.0 {
            assert_eq!(
                z.signum(),
                dev.signum(),
                "{name}: z {z} for W+ - mean {dev}"
            );
        }
        assert!(
            (p - p_ref).abs() <= 1e-6 * p_ref,
            "{name}: p {p:e} vs scipy {p_ref:e}"
        );
    }

    #[test]
    fn wilcoxon_matches_scipy() {
        let cases = cases();
        assert!(cases.len() >= 12, "the reference lost its Wilcoxon cases");
        let mut checked = 0;
        for c in cases.iter().filter(|c| !at_the_mean(c)) {
            check_case(c);
            checked += 1;
        }
        assert!(checked >= 10);
        // both directions, ties, zeros, a tail far below any significance level
        assert!(cases
            .iter()
            .any(|c| c["z"].as_f64().is_some() && c["w_plus"].as_f64() == Some(0.0)));
        assert!(cases
            .iter()
            .any(|c| c["p"].as_f64().is_some_and(|p| p < 1e-20)));
    }

    /// W+ at its mean: scipy's two-sided z is 0 and p is 1 (the continuity correction moves
    /// towards the mean, and there it is already). `0.0_f64.signum()` is 1, so a correction by
    /// `0.5 * dev.signum()` alone would report z = −0.5/σ and p < 1 (0.64 for d = [1, −1]).
    #[test]
    fn wilcoxon_at_the_mean_matches_scipy() {
        let at: Vec<Value> = cases().into_iter().filter(at_the_mean).collect();
        assert!(at.len() >= 2);
        for c in &at {
            check_case(c);
        }
    }

    #[test]
    fn normal_tail() {
        assert!((two_sided_normal_p(1.959964) - 0.05).abs() < 1e-6);
        assert!((two_sided_normal_p(0.0) - 1.0).abs() < 1e-7);
        assert!(two_sided_normal_p(10.0) < 1e-20);
    }

    #[test]
    fn median() {
        assert_eq!(median_in_place(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median_in_place(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
    }
}
