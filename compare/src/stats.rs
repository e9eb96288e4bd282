//! The statistics behind a comparison: percentiles, the two-sample Kolmogorov–Smirnov test and
//! bootstrap confidence intervals. Pure functions over sorted `f64` samples; the tests at the
//! bottom check them against reference values scipy/numpy produced
//! (`tests/reference/gen.py` → `tests/reference/expected.json`).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The percentiles every report tabulates.
pub const TABLE_PERCENTILES: [f64; 7] = [10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0];

/// Percentile `p` (0–100) of an ascending sample, interpolating linearly between the two
/// closest ranks: with `h = (n − 1)·p/100`, `x[⌊h⌋] + (h − ⌊h⌋)·(x[⌊h⌋+1] − x[⌊h⌋])`.
/// This is Hyndman & Fan's type 7 — numpy's default (`method="linear"`), R's default,
/// Excel's PERCENTILE.INC. NaN for an empty sample.
pub fn percentile_sorted(sorted: &[f64], p: f64) -> f64 {
    let n = sorted.len();
    if n == 0 || !p.is_finite() {
        return f64::NAN;
    }
    let h = (n - 1) as f64 * (p.clamp(0.0, 100.0) / 100.0);
    let lo = h.floor() as usize;
    let frac = h - lo as f64;
    if lo + 1 >= n {
        return sorted[n - 1];
    }
    sorted[lo] + frac * (sorted[lo + 1] - sorted[lo])
}

pub fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.iter().sum::<f64>() / xs.len() as f64
}

/// Which distribution the KS p-value comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KsMethod {
    /// The exact null distribution of D for these two sample sizes (no ties assumed), by
    /// counting lattice paths that leave the band |F₁ − F₂| < D (Hodges 1957).
    Exact,
    /// The limiting Kolmogorov distribution: p = Q_KS(√(n₁n₂/(n₁+n₂))·D).
    Asymptotic,
}

/// The exact p-value is computed when n₁·n₂ is at most this (about a second of work at worst on
/// one core); above it the asymptotic distribution is accurate to well under 1% of p for the
/// sample sizes where it is used.
pub const KS_EXACT_MAX_PRODUCT: u64 = 100_000_000;

/// A two-sample, two-sided Kolmogorov–Smirnov test.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct KsTest {
    /// sup |F₁(x) − F₂(x)| over the empirical CDFs.
    pub d: f64,
    pub p_value: f64,
    pub method: KsMethod,
    pub n1: usize,
    pub n2: usize,
}

/// The KS test with the method chosen by size: exact when n₁·n₂ ≤ [`KS_EXACT_MAX_PRODUCT`],
/// asymptotic otherwise. Both samples ascending and non-empty (`None` otherwise).
pub fn ks_2samp(a: &[f64], b: &[f64]) -> Option<KsTest> {
    let method = if (a.len() as u64).saturating_mul(b.len() as u64) <= KS_EXACT_MAX_PRODUCT {
        KsMethod::Exact
    } else {
        KsMethod::Asymptotic
    };
    ks_2samp_with(a, b, method)
}

/// The KS test with a given method. Both samples ascending and non-empty (`None` otherwise).
pub fn ks_2samp_with(a: &[f64], b: &[f64], method: KsMethod) -> Option<KsTest> {
    let (n1, n2) = (a.len() as u64, b.len() as u64);
    if n1 == 0 || n2 == 0 {
        return None;
    }
    let dnum = ks_statistic_scaled(a, b);
    let d = dnum as f64 / (n1 as f64 * n2 as f64);
    let p_value = match method {
        KsMethod::Exact => ks_exact_sf(n1, n2, dnum),
        KsMethod::Asymptotic => {
            let en = (n1 as f64 * n2 as f64) / (n1 + n2) as f64;
            kolmogorov_sf(en.sqrt() * d)
        }
    };
    Some(KsTest {
        d,
        p_value: p_value.clamp(0.0, 1.0),
        method,
        n1: a.len(),
        n2: b.len(),
    })
}

/// n₁·n₂·D as an integer: the largest |i·n₂ − j·n₁| where i and j count the values of `a` and
/// `b` at or below each distinct value (ties in and between samples step together).
fn ks_statistic_scaled(a: &[f64], b: &[f64]) -> u64 {
    let (n1, n2) = (a.len() as i128, b.len() as i128);
    let (mut i, mut j) = (0usize, 0usize);
    let mut best: u64 = 0;
    while i < a.len() || j < b.len() {
        let v = match (a.get(i), b.get(j)) {
            (Some(&x), Some(&y)) => x.min(y),
            (Some(&x), None) => x,
            (None, Some(&y)) => y,
            (None, None) => break,
        };
        while i < a.len() && a[i] <= v {
            i += 1;
        }
        while j < b.len() && b[j] <= v {
            j += 1;
        }
        let diff = (i as i128 * n2 - j as i128 * n1).unsigned_abs() as u64;
        best = best.max(diff);
    }
    best
}

/// P(D ≥ dnum/(n₁n₂)) under the null hypothesis, exactly: a uniformly random ordering of the
/// pooled sample is a monotone lattice path from (0,0) to (n₁,n₂); D ≥ d exactly when the path
/// touches a node with |i·n₂ − j·n₁| ≥ dnum. The probability mass of paths still inside the band
/// is carried row by row (a path at (i,j) steps to i+1 with probability (n₁−i)/(n₁−i+n₂−j)),
/// and the mass stepping out of the band is summed. Summing the leaving mass, instead of taking
/// 1 − P(inside), keeps tiny p-values accurate. Only the band is visited: O(n₁·n₂·D) work.
fn ks_exact_sf(n1: u64, n2: u64, dnum: u64) -> f64 {
    if dnum == 0 {
        return 1.0;
    }
    let (m, n) = (n1 as usize, n2 as usize);
    let (n1i, n2i, dn) = (n1 as i128, n2 as i128, dnum as i128);
    let inside = |i: usize, j: usize| (i as i128 * n2i - j as i128 * n1i).abs() < dn;
    // Inside nodes of row i: j·n₁ ∈ (i·n₂ − dnum, i·n₂ + dnum), an interval (maybe empty).
    let window = |i: usize| -> Option<(usize, usize)> {
        let c = i as i128 * n2i;
        let lo = (c - dn).div_euclid(n1i) + 1;
        let hi = (c + dn - 1).div_euclid(n1i);
        let (lo, hi) = (lo.max(0), hi.min(n as i128));
        (lo <= hi).then_some((lo as usize, hi as usize))
    };
    // P(step to i+1 | at (i,j)) and P(step to j+1 | at (i,j)).
    let p_i = |i: usize, j: usize| (m - i) as f64 / ((m - i) + (n - j)) as f64;
    let p_j = |i: usize, j: usize| (n - j) as f64 / ((m - i) + (n - j)) as f64;

    let mut prev = vec![0f64; n + 1];
    let mut cur = vec![0f64; n + 1];
    let mut prev_win: Option<(usize, usize)> = None;
    let mut leaving = 0f64;
    for i in 0..=m {
        let Some((lo, hi)) = window(i) else {
            // No inside node in this row: every path has left the band already.
            return 1.0;
        };
        for j in lo..=hi {
            let mut v = if i == 0 && j == 0 { 1.0 } else { 0.0 };
            if j > lo {
                v += cur[j - 1] * p_j(i, j - 1);
            }
            if let Some((plo, phi)) = prev_win {
                if j >= plo && j <= phi {
                    v += prev[j] * p_i(i - 1, j);
                }
            }
            cur[j] = v;
            if v != 0.0 {
                if j < n && !inside(i, j + 1) {
                    leaving += v * p_j(i, j);
                }
                if i < m && !inside(i + 1, j) {
                    leaving += v * p_i(i, j);
                }
            }
        }
        std::mem::swap(&mut prev, &mut cur);
        prev_win = Some((lo, hi));
    }
    leaving.min(1.0)
}

/// The Kolmogorov distribution's survival function Q(λ) = P(K > λ) =
/// 2 Σₖ (−1)^(k−1) exp(−2k²λ²); below λ = 1 through the Jacobi-theta form
/// 1 − (√(2π)/λ) Σₖ exp(−(2k−1)²π²/(8λ²)), which converges fast there.
pub fn kolmogorov_sf(lambda: f64) -> f64 {
    if !lambda.is_finite() {
        return if lambda > 0.0 { 0.0 } else { 1.0 };
    }
    if lambda <= 0.0 {
        return 1.0;
    }
    if lambda < 1.0 {
        let pi2 = std::f64::consts::PI * std::f64::consts::PI;
        let mut cdf = 0.0;
        for k in 1..=100 {
            let t = ((-((2 * k - 1) as f64).powi(2) * pi2) / (8.0 * lambda * lambda)).exp();
            cdf += t;
            if t < 1e-18 * cdf.max(1e-300) {
                break;
            }
        }
        (1.0 - (2.0 * std::f64::consts::PI).sqrt() / lambda * cdf).clamp(0.0, 1.0)
    } else {
        let mut sum = 0.0;
        for k in 1..=100 {
            let t = (-2.0 * (k * k) as f64 * lambda * lambda).exp();
            sum += if k % 2 == 1 { t } else { -t };
            if t < 1e-18 * sum.abs().max(1e-300) {
                break;
            }
        }
        (2.0 * sum).clamp(0.0, 1.0)
    }
}

/// Bootstrap replicates of a sample's percentiles and mean.
#[derive(Debug, Clone)]
pub struct Replicates {
    /// The percentiles (0–100) each replicate holds, in this order.
    pub percentiles: Vec<f64>,
    /// `values[r][k]` = percentile `percentiles[k]` of replicate r; the mean is at index
    /// `percentiles.len()`.
    pub values: Vec<Vec<f64>>,
}

/// Draws `replicates` resamples (n draws with replacement) of the ascending sample `sorted`
/// with a ChaCha8 generator seeded by `seed`, and returns each resample's percentiles (type 7,
/// as [`percentile_sorted`]) and mean. A resample is kept as counts per original index, so its
/// order statistics come from one pass over the counts: O(n) per replicate, no sorting.
pub fn bootstrap(sorted: &[f64], percentiles: &[f64], replicates: usize, seed: u64) -> Replicates {
    let n = sorted.len();
    let mut values = Vec::with_capacity(replicates);
    if n == 0 {
        return Replicates {
            percentiles: percentiles.to_vec(),
            values,
        };
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    // Ranks needed (0-based order statistics): ⌊h⌋ and ⌊h⌋+1 for each percentile.
    let mut ranks: Vec<usize> = Vec::new();
    for &p in percentiles {
        let h = (n - 1) as f64 * (p.clamp(0.0, 100.0) / 100.0);
        let lo = h.floor() as usize;
        ranks.push(lo.min(n - 1));
        ranks.push((lo + 1).min(n - 1));
    }
    let mut order: Vec<usize> = (0..ranks.len()).collect();
    order.sort_by_key(|&k| ranks[k]);
    let mut counts = vec![0u32; n];
    let mut at_rank = vec![0f64; ranks.len()];
    for _ in 0..replicates {
        counts.iter_mut().for_each(|c| *c = 0);
        for _ in 0..n {
            counts[rng.random_range(0..n)] += 1;
        }
        // One pass: cumulative counts tell which original value holds each rank.
        let mut sum = 0f64;
        let mut seen = 0usize; // values of the resample at indices < idx
        let mut next = 0usize; // next entry of `order` to fill
        for (idx, &c) in counts.iter().enumerate() {
            if c == 0 {
                continue;
            }
            sum += c as f64 * sorted[idx];
            seen += c as usize;
            while next < order.len() && ranks[order[next]] < seen {
                at_rank[order[next]] = sorted[idx];
                next += 1;
            }
        }
        let mut row = Vec::with_capacity(percentiles.len() + 1);
        for (k, &p) in percentiles.iter().enumerate() {
            let h = (n - 1) as f64 * (p.clamp(0.0, 100.0) / 100.0);
            let frac = h - h.floor();
            let (lo, hi) = (at_rank[2 * k], at_rank[2 * k + 1]);
            row.push(lo + frac * (hi - lo));
        }
        row.push(sum / n as f64);
        values.push(row);
    }
    Replicates {
        percentiles: percentiles.to_vec(),
        values,
    }
}

/// A paired bootstrap: `pairs` are (BASE, OTHER) values of the same unit (a connection both
/// replays reproduced); each resample draws units with replacement and takes statistic `p`
/// (percentile 0–100, type 7, or the mean for `None`) of BASE's and of OTHER's values of the
/// same units. Returns (BASE's, OTHER's) statistic per resample. A resample is held as counts
/// per unit and read in each side's sorted order, so no sort per resample.
pub fn paired_bootstrap(
    pairs: &[(f64, f64)],
    p: Option<f64>,
    replicates: usize,
    seed: u64,
) -> Vec<(f64, f64)> {
    let n = pairs.len();
    if n == 0 {
        return Vec::new();
    }
    let mut by_base: Vec<usize> = (0..n).collect();
    by_base.sort_by(|&i, &j| pairs[i].0.total_cmp(&pairs[j].0));
    let mut by_other: Vec<usize> = (0..n).collect();
    by_other.sort_by(|&i, &j| pairs[i].1.total_cmp(&pairs[j].1));
    let stat = |order: &[usize], value: &dyn Fn(usize) -> f64, counts: &[u32]| -> f64 {
        let Some(p) = p else {
            let sum: f64 = order.iter().map(|&i| counts[i] as f64 * value(i)).sum();
            return sum / n as f64;
        };
        let h = (n - 1) as f64 * (p.clamp(0.0, 100.0) / 100.0);
        let lo = h.floor() as usize;
        let hi = (lo + 1).min(n - 1);
        let (mut vlo, mut seen) = (f64::NAN, 0usize);
        for &i in order {
            if counts[i] == 0 {
                continue;
            }
            seen += counts[i] as usize;
            if vlo.is_nan() && lo < seen {
                vlo = value(i);
            }
            if hi < seen {
                return vlo + (h - lo as f64) * (value(i) - vlo);
            }
        }
        vlo
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut counts = vec![0u32; n];
    (0..replicates)
        .map(|_| {
            counts.iter_mut().for_each(|c| *c = 0);
            for _ in 0..n {
                counts[rng.random_range(0..n)] += 1;
            }
            (
                stat(&by_base, &|i| pairs[i].0, &counts),
                stat(&by_other, &|i| pairs[i].1, &counts),
            )
        })
        .collect()
}

/// The central `confidence` interval (e.g. 0.95) of `values` by the percentile method
/// (type-7 percentiles of the replicate values). NaN replicates are ignored.
pub fn percentile_interval(values: &[f64], confidence: f64) -> (f64, f64) {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    v.sort_by(f64::total_cmp);
    let tail = (1.0 - confidence) / 2.0 * 100.0;
    (
        percentile_sorted(&v, tail),
        percentile_sorted(&v, 100.0 - tail),
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::Value;

    const EXPECTED: &str = include_str!("../tests/reference/expected.json");

    /// splitmix64, bit for bit as in tests/reference/gen.py.
    struct SplitMix(u64);
    impl SplitMix {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E3779B97F4A7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
            z ^ (z >> 31)
        }
    }

    /// Rebuilds a sample from its spec and checks it is the one gen.py used; sorted.
    fn sample(spec: &Value, check: &Value) -> Vec<f64> {
        let mut f = sample_in_order(spec, check);
        f.sort_by(f64::total_cmp);
        f
    }

    /// Rebuilds a sample from its spec, in gen.py's order, and checks it is the one gen.py
    /// used (also for ab.rs's paired cases).
    pub(crate) fn sample_in_order(spec: &Value, check: &Value) -> Vec<f64> {
        let kind = spec["kind"].as_str().unwrap();
        let n = spec["n"].as_u64().unwrap() as usize;
        let mut g = SplitMix(spec["seed"].as_u64().unwrap());
        let shift = spec["shift"].as_u64().unwrap();
        let scale = spec["scale_pct"].as_u64().unwrap();
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let v = match kind {
                "uniform" => (g.next() >> 11) % 100000,
                "tri" => (g.next() >> 11) % 50000 + (g.next() >> 11) % 50000,
                "skew" => {
                    let a = (g.next() >> 11) % 100000;
                    let b = (g.next() >> 11) % 100000;
                    a * b / 100000
                }
                "ties" => (g.next() >> 11) % 20,
                k => panic!("unknown kind {k}"),
            };
            out.push(v * scale / 100 + shift);
        }
        let first: Vec<u64> = check["first"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        assert_eq!(
            &out[..first.len()],
            &first[..],
            "sample {spec} differs from gen.py's"
        );
        assert_eq!(
            out.iter().sum::<u64>(),
            check["sum"].as_u64().unwrap(),
            "sample {spec} sum"
        );
        out.into_iter().map(|v| v as f64).collect()
    }

    fn expected() -> Value {
        serde_json::from_str(EXPECTED).unwrap()
    }

    fn close(got: f64, want: f64, rel: f64, abs: f64) -> bool {
        (got - want).abs() <= abs + rel * want.abs()
    }

    /// KS D and exact p against scipy.stats.ks_2samp(method="exact"): D to 1e-12, p to a
    /// relative 1e-9 (p-values down to 1e-20 included).
    #[test]
    fn ks_exact_matches_scipy() {
        let e = expected();
        let cases = e["ks_exact"].as_array().unwrap();
        assert!(cases.len() >= 10);
        for c in cases {
            let a = sample(&c["a"], &c["a_check"]);
            let b = sample(&c["b"], &c["b_check"]);
            let t = ks_2samp_with(&a, &b, KsMethod::Exact).unwrap();
            let (d, p) = (c["d"].as_f64().unwrap(), c["p"].as_f64().unwrap());
            assert!(
                close(t.d, d, 0.0, 1e-12),
                "D {} vs scipy {} for {}",
                t.d,
                d,
                c["a"]
            );
            assert!(
                close(t.p_value, p, 1e-9, 1e-300),
                "p {:e} vs scipy {:e} for {} / {}",
                t.p_value,
                p,
                c["a"],
                c["b"]
            );
            // symmetric in its arguments
            let s = ks_2samp_with(&b, &a, KsMethod::Exact).unwrap();
            assert!(close(s.p_value, t.p_value, 1e-12, 0.0) && s.d == t.d);
        }
    }

    /// Asymptotic p against scipy.special.kolmogorov(√en·D) to 1e-9 relative, and against
    /// scipy's own asymptotic ks_2samp (kstwo.sf(D, round(en))) within 2% of p.
    #[test]
    fn ks_asymptotic_matches_scipy() {
        let e = expected();
        for c in e["ks_asymp"].as_array().unwrap() {
            let a = sample(&c["a"], &c["a_check"]);
            let b = sample(&c["b"], &c["b_check"]);
            let t = ks_2samp(&a, &b).unwrap();
            assert_eq!(
                t.method,
                KsMethod::Asymptotic,
                "large samples use the asymptotic p"
            );
            assert!(close(t.d, c["d"].as_f64().unwrap(), 0.0, 1e-12));
            let want = c["p_kolmogorov"].as_f64().unwrap();
            assert!(
                close(t.p_value, want, 1e-9, 0.0),
                "{} vs {}",
                t.p_value,
                want
            );
            let scipy = c["p_scipy_asymp"].as_f64().unwrap();
            assert!(
                close(t.p_value, scipy, 0.02, 0.0),
                "{} vs scipy asymp {}",
                t.p_value,
                scipy
            );
        }
    }

    #[test]
    fn kolmogorov_sf_matches_scipy() {
        for c in expected()["kolmogorov"].as_array().unwrap() {
            let (l, want) = (c["lambda"].as_f64().unwrap(), c["sf"].as_f64().unwrap());
            assert!(
                close(kolmogorov_sf(l), want, 1e-10, 1e-15),
                "Q({l}) = {} vs {}",
                kolmogorov_sf(l),
                want
            );
        }
    }

    #[test]
    fn percentiles_match_numpy_linear() {
        for c in expected()["percentiles"].as_array().unwrap() {
            let s = sample(&c["sample"], &c["check"]);
            let ps = c["p"].as_array().unwrap();
            let vs = c["values"].as_array().unwrap();
            for (p, v) in ps.iter().zip(vs) {
                let (p, v) = (p.as_f64().unwrap(), v.as_f64().unwrap());
                let got = percentile_sorted(&s, p);
                assert!(
                    close(got, v, 1e-12, 1e-9),
                    "p{p} of {}: {got} vs numpy {v}",
                    c["sample"]
                );
            }
            assert!(close(mean(&s), c["mean"].as_f64().unwrap(), 1e-12, 0.0));
        }
        assert!(percentile_sorted(&[], 50.0).is_nan());
    }

    /// The exact distribution's mass adds up: leaving + staying = 1, checked through a
    /// brute-force enumeration of all orderings for small sizes.
    #[test]
    fn ks_exact_equals_brute_force_enumeration() {
        for (m, n) in [(3usize, 4usize), (5, 5), (2, 7), (6, 4)] {
            // every subset of positions for the first sample = one equally likely ordering
            let total = m + n;
            let mut counts: std::collections::BTreeMap<u64, u64> = Default::default();
            let mut paths = 0u64;
            for mask in 0u32..(1 << total) {
                if mask.count_ones() as usize != m {
                    continue;
                }
                paths += 1;
                let (mut i, mut j, mut best) = (0i64, 0i64, 0u64);
                for pos in 0..total {
                    if mask >> pos & 1 == 1 {
                        i += 1
                    } else {
                        j += 1
                    }
                    best = best.max((i * n as i64 - j * m as i64).unsigned_abs());
                }
                *counts.entry(best).or_default() += 1;
            }
            for &dnum in counts.keys() {
                let at_least: u64 = counts.range(dnum..).map(|(_, c)| c).sum();
                let want = at_least as f64 / paths as f64;
                let got = ks_exact_sf(m as u64, n as u64, dnum);
                assert!(
                    close(got, want, 1e-12, 1e-15),
                    "m={m} n={n} dnum={dnum}: {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn ks_identical_samples_and_disjoint_samples() {
        let a: Vec<f64> = (0..50).map(|v| v as f64).collect();
        let t = ks_2samp(&a, &a).unwrap();
        assert_eq!(t.d, 0.0);
        assert_eq!(t.p_value, 1.0);
        let b: Vec<f64> = (100..150).map(|v| v as f64).collect();
        let t = ks_2samp(&a, &b).unwrap();
        assert_eq!(t.d, 1.0);
        // P(all of one sample below all of the other, either way) = 2 / C(100, 50)
        assert!(
            close(t.p_value, 2.0 / 1.008_913_445_455_641_9e29, 1e-9, 0.0),
            "{:e}",
            t.p_value
        );
        assert!(ks_2samp(&[], &a).is_none());
    }

    /// A fixed seed reproduces the same replicates (golden values), and the replicates behave
    /// like resamples: every replicate percentile is a value within the sample's range, and
    /// their spread shrinks with n as 1/√n.
    #[test]
    fn bootstrap_is_reproducible_and_sane() {
        let xs: Vec<f64> = (1..=101).map(|v| v as f64).collect();
        let r1 = bootstrap(&xs, &[50.0, 90.0], 200, 42);
        let r2 = bootstrap(&xs, &[50.0, 90.0], 200, 42);
        assert_eq!(r1.values, r2.values);
        let r3 = bootstrap(&xs, &[50.0, 90.0], 200, 43);
        assert_ne!(r1.values, r3.values);
        for row in &r1.values {
            assert!(row[0] >= 1.0 && row[0] <= 101.0 && row[1] >= row[0]);
            assert!(
                row[2] > 30.0 && row[2] < 70.0,
                "mean of a resample {}",
                row[2]
            );
        }
        // golden: first replicate of seed 42 (changes only if rand/rand_chacha change streams)
        assert_eq!(
            r1.values[0],
            GOLDEN_FIRST_REPLICATE.to_vec(),
            "golden replicate"
        );
        // the mean of a resample is distributed around the sample mean with sd σ/√n
        let means: Vec<f64> = bootstrap(&xs, &[], 2000, 7)
            .values
            .iter()
            .map(|r| r[0])
            .collect();
        let m = mean(&means);
        let sd =
            (means.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (means.len() - 1) as f64).sqrt();
        let sigma = (xs.iter().map(|x| (x - 51.0).powi(2)).sum::<f64>() / 101.0).sqrt();
        assert!((m - 51.0).abs() < 0.2, "bootstrap mean {m}");
        assert!(
            (sd / (sigma / 101f64.sqrt()) - 1.0).abs() < 0.08,
            "bootstrap sd {sd} vs {}",
            sigma / 101f64.sqrt()
        );
    }

    const GOLDEN_FIRST_REPLICATE: [f64; 3] = [59.0, 90.0, 5342.0 / 101.0];

    /// Replicate percentiles computed from counts equal those of the explicitly sorted resample.
    #[test]
    fn bootstrap_order_statistics_equal_sorting() {
        let xs: Vec<f64> = (0..37)
            .map(|v| ((v * 7919) % 101) as f64)
            .collect::<Vec<_>>();
        let mut xs = xs;
        xs.sort_by(f64::total_cmp);
        let ps = [0.0, 10.0, 33.0, 50.0, 99.0, 100.0];
        let reps = bootstrap(&xs, &ps, 5, 9);
        // regenerate the same draws and sort them explicitly
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        for row in &reps.values {
            let mut res: Vec<f64> = (0..xs.len())
                .map(|_| xs[rng.random_range(0..xs.len())])
                .collect();
            res.sort_by(f64::total_cmp);
            for (k, &p) in ps.iter().enumerate() {
                assert!(close(row[k], percentile_sorted(&res, p), 1e-12, 1e-12));
            }
            assert!(close(row[ps.len()], mean(&res), 1e-12, 1e-9));
        }
    }

    /// Coverage: over many experiments with a known true difference of medians, the 95%
    /// percentile-bootstrap interval for the difference covers the truth in 88–99% of them.
    #[test]
    fn bootstrap_interval_covers_true_median_difference() {
        // Exponential(mean 100) vs Exponential(mean 130): true medians 100·ln2 and 130·ln2.
        let truth = 30.0 * std::f64::consts::LN_2;
        let mut g = SplitMix(2024);
        let mut expo = |mean_v: f64| {
            let u = ((g.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            -mean_v * u.ln()
        };
        let experiments = 200;
        let mut covered = 0;
        for e in 0..experiments {
            let mut a: Vec<f64> = (0..150).map(|_| expo(100.0)).collect();
            let mut b: Vec<f64> = (0..150).map(|_| expo(130.0)).collect();
            a.sort_by(f64::total_cmp);
            b.sort_by(f64::total_cmp);
            let ra = bootstrap(&a, &[50.0], 400, 1000 + e);
            let rb = bootstrap(&b, &[50.0], 400, 5000 + e);
            let diffs: Vec<f64> = ra
                .values
                .iter()
                .zip(&rb.values)
                .map(|(x, y)| y[0] - x[0])
                .collect();
            let (lo, hi) = percentile_interval(&diffs, 0.95);
            if lo <= truth && truth <= hi {
                covered += 1;
            }
        }
        let rate = covered as f64 / experiments as f64;
        assert!((0.88..=0.99).contains(&rate), "coverage {rate}");
    }

    #[test]
    fn percentile_interval_basic() {
        let v: Vec<f64> = (0..=1000).map(|x| x as f64).collect();
        let (lo, hi) = percentile_interval(&v, 0.95);
        assert!(close(lo, 25.0, 0.0, 1e-9) && close(hi, 975.0, 0.0, 1e-9));
        assert!(percentile_interval(&[f64::NAN], 0.95).0.is_nan());
    }

    #[test]
    fn paired_bootstrap_equals_explicit_paired_resampling() {
        let pairs: Vec<(f64, f64)> = (0..37u64)
            .map(|i| {
                let a = ((i * 7919) % 101) as f64 * 13.0 + 50.0;
                (a, a * 0.8 + ((i * 31) % 17) as f64)
            })
            .collect();
        for p in [
            Some(0.0),
            Some(10.0),
            Some(50.0),
            Some(90.0),
            Some(99.0),
            Some(100.0),
            None,
        ] {
            let got = paired_bootstrap(&pairs, p, 50, 5);
            let mut rng = ChaCha8Rng::seed_from_u64(5);
            for (b, o) in got {
                let idx: Vec<usize> = (0..pairs.len())
                    .map(|_| rng.random_range(0..pairs.len()))
                    .collect();
                let mut xs: Vec<f64> = idx.iter().map(|&i| pairs[i].0).collect();
                let mut ys: Vec<f64> = idx.iter().map(|&i| pairs[i].1).collect();
                xs.sort_by(f64::total_cmp);
                ys.sort_by(f64::total_cmp);
                let (eb, eo) = match p {
                    Some(p) => (percentile_sorted(&xs, p), percentile_sorted(&ys, p)),
                    None => (mean(&xs), mean(&ys)),
                };
                assert!(
                    (b - eb).abs() < 1e-9 && (o - eo).abs() < 1e-9,
                    "{p:?}: {b} {eb} {o} {eo}"
                );
            }
        }
        assert!(paired_bootstrap(&[], Some(50.0), 10, 1).is_empty());
    }
}
