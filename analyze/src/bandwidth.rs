//! Combining packet-pair samples into one bottleneck estimate.
//!
//! * Histogram mode (papers/004, CAIDA/Georgia Tech): sort, drop the lower half (pairs the
//!   sender did not send back to back), bin the rest with the Freedman–Diaconis width and take
//!   the centre of the strongest mode.
//! * Minimum delay sum (papers/001, CapProbe): the pair whose two packets saw the least queueing
//!   carries the bottleneck's dispersion.
//! * Median of the filtered samples.

use crate::config::BwMethod;

/// One candidate pair: its rate and the sum of the two packets' send→ACK delays.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Pair {
    pub bps: f64,
    pub delay_sum_ns: i64,
}

/// The estimate, and for each pair whether it is one the estimate came from (the samples in
/// the strongest mode, the middle sample(s), or the minimum-delay-sum pair).
pub(crate) fn combine(method: BwMethod, pairs: &[Pair]) -> (Option<f64>, Vec<bool>) {
    let mut used = vec![false; pairs.len()];
    let valid = |p: &Pair| p.bps.is_finite() && p.bps > 0.0;
    let mut v: Vec<f64> = pairs.iter().filter(|p| valid(p)).map(|p| p.bps).collect();
    if v.is_empty() {
        return (None, used);
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let (est, lo, hi) = match method {
        BwMethod::Median => {
            let n = v.len();
            (median(&v), v[(n - 1) / 2], v[n / 2])
        }
        BwMethod::MinDelaySum => {
            let best = pairs
                .iter()
                .filter(|p| valid(p))
                .min_by(|a, b| {
                    a.delay_sum_ns
                        .cmp(&b.delay_sum_ns)
                        .then(b.bps.total_cmp(&a.bps))
                })
                .map(|p| p.bps)
                .expect("non-empty");
            (best, best, best)
        }
        BwMethod::HistogramMode => histogram_mode(&v),
    };
    let mut marked = false;
    for (u, p) in used.iter_mut().zip(pairs) {
        if valid(p) && p.bps >= lo && p.bps <= hi && !(method == BwMethod::MinDelaySum && marked) {
            *u = true;
            marked = true;
        }
    }
    (Some(est), used)
}

fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    let pos = q * (sorted.len() - 1) as f64;
    let i = pos.floor() as usize;
    let f = pos - i as f64;
    if i + 1 < sorted.len() {
        sorted[i] * (1.0 - f) + sorted[i + 1] * f
    } else {
        sorted[i]
    }
}

/// `sorted` ascending, non-empty. Returns the estimate and the range of the samples it came from.
fn histogram_mode(sorted: &[f64]) -> (f64, f64, f64) {
    // drop the lower half (keep at least one sample)
    let upper = &sorted[sorted.len() / 2..];
    let whole = |u: &[f64]| (median(u), u[0], u[u.len() - 1]);
    if upper.len() < 3 {
        return whole(upper);
    }
    let iqr = quantile(upper, 0.75) - quantile(upper, 0.25);
    let width = 2.0 * iqr / (upper.len() as f64).cbrt();
    let lo = upper[0];
    let hi = upper[upper.len() - 1];
    if width.is_nan() || width <= 0.0 || hi <= lo {
        return whole(upper);
    }
    let bins = (((hi - lo) / width).floor() as usize + 1).min(10_000);
    let mut counts = vec![0u32; bins];
    for &x in upper {
        let b = (((x - lo) / width) as usize).min(bins - 1);
        counts[b] += 1;
    }
    // strongest mode; ties go to the higher-rate bin (pairs only under-estimate when the
    // sender spaced them or an ACK was delayed)
    let mut best = 0;
    for (i, c) in counts.iter().enumerate() {
        if *c >= counts[best] {
            best = i;
        }
    }
    // centre of the mode: the median of the samples inside the bin
    let in_bin: Vec<f64> = upper
        .iter()
        .copied()
        .filter(|x| ((((x - lo) / width) as usize).min(bins - 1)) == best)
        .collect();
    whole(&in_bin)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(v: &[f64]) -> Vec<Pair> {
        v.iter()
            .enumerate()
            .map(|(i, b)| Pair {
                bps: *b,
                delay_sum_ns: 1000 + i as i64,
            })
            .collect()
    }

    #[test]
    fn mode_ignores_low_tail_and_outliers() {
        // true rate 10 Mbit/s; low samples from spaced sends, one compressed-ACK outlier
        let v = [2e6, 3e6, 5e6, 9.9e6, 10e6, 10.1e6, 10e6, 9.95e6, 40e6];
        let (est, used) = combine(BwMethod::HistogramMode, &pairs(&v));
        let est = est.unwrap();
        assert!((est - 10e6).abs() < 0.3e6, "{est}");
        // the samples of the strongest bin are marked; the low tail and the outlier are not
        assert_eq!(
            used,
            vec![false, false, false, false, true, false, true, true, false]
        );
        assert_eq!(
            combine(BwMethod::Median, &pairs(&[1.0, 3.0, 2.0])),
            (Some(2.0), vec![false, false, true])
        );
        assert_eq!(combine(BwMethod::HistogramMode, &[]), (None, vec![]));
    }

    #[test]
    fn min_delay_sum_picks_least_queued_pair() {
        let p = [
            Pair {
                bps: 5e6,
                delay_sum_ns: 900,
            },
            Pair {
                bps: 8e6,
                delay_sum_ns: 300,
            },
            Pair {
                bps: 20e6,
                delay_sum_ns: 700,
            },
        ];
        assert_eq!(
            combine(BwMethod::MinDelaySum, &p),
            (Some(8e6), vec![false, true, false])
        );
    }
}
