#!/usr/bin/env python3
"""Reference values for mimic-compare's statistics, computed once with scipy/numpy.

Run:  python3 compare/tests/reference/gen.py > compare/tests/reference/expected.json
(written with scipy 1.17.1, numpy 2.4.6; the JSON records the versions it was made with).

The samples are not random draws from numpy: they come from splitmix64, an integer generator
that is re-implemented bit for bit in compare/src/stats.rs's tests, so the Rust side rebuilds
exactly the same samples from the spec (kind, n, seed) and compares its results with these.
Every sample value is an integer (microseconds, like connections.response_time_us).

The Wilcoxon signed-rank cases ("wilcoxon") match compare/src/ab.rs's `wilcoxon`: zeros
dropped (zero_method="wilcox"), average ranks over ties with the tie-corrected variance, the
normal approximation always (method="approx", never scipy's exact or permutation p for small n)
with the continuity correction (correction=True), two-sided. Each case gives its differences as
`d` = ln(b/a) per pair ("log_ratio", what `compare` feeds it) or b - a ("diff", integers, so ties
and zeros are exact), from two regenerated samples or from explicit values.
"""
import json
import math
import sys

import numpy as np
import scipy
from scipy import special, stats

MASK = (1 << 64) - 1


def splitmix64(state):
    """Yields successive splitmix64 outputs from `state`."""
    while True:
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        yield z ^ (z >> 31)


def sample(kind, n, seed, shift=0, scale_pct=100):
    """Integer samples. kind:
    uniform  : u in [0, 100000)
    tri      : sum of two uniforms in [0, 50000) (triangular)
    skew     : (a * b) // 100000 with a, b uniform in [0, 100000) (right-skewed, like latencies)
    ties     : uniform in [0, 20) (many ties)
    Each value is then v * scale_pct // 100 + shift."""
    g = splitmix64(seed)
    out = []
    for _ in range(n):
        if kind == "uniform":
            v = (next(g) >> 11) % 100000
        elif kind == "tri":
            v = (next(g) >> 11) % 50000 + (next(g) >> 11) % 50000
        elif kind == "skew":
            a = (next(g) >> 11) % 100000
            b = (next(g) >> 11) % 100000
            v = a * b // 100000
        elif kind == "ties":
            v = (next(g) >> 11) % 20
        else:
            raise ValueError(kind)
        out.append(v * scale_pct // 100 + shift)
    return out


def spec(kind, n, seed, shift=0, scale_pct=100):
    return {"kind": kind, "n": n, "seed": seed, "shift": shift, "scale_pct": scale_pct}


def check(s, xs):
    """What the Rust side verifies first: the regenerated sample is the same."""
    return {"first": xs[:5], "sum": int(sum(xs))}


def wilcoxon_case(name, a, b, transform):
    """`a`, `b`: a spec (the sample is regenerated) or a list of explicit values."""
    case = {"name": name, "transform": transform}
    xs = []
    for key, v in (("a", a), ("b", b)):
        if isinstance(v, dict):
            x = sample(**v)
            case[key] = v
            case[key + "_check"] = check(v, x)
        else:
            x = list(v)
            case[key] = x
        xs.append(x)
    xa, xb = xs
    assert len(xa) == len(xb), name
    if transform == "log_ratio":
        d = [math.log(y / x) for x, y in zip(xa, xb)]
    elif transform == "diff":
        d = [y - x for x, y in zip(xa, xb)]
    else:
        raise ValueError(transform)
    nz = [v for v in d if v != 0]
    case["n_nonzero"] = len(nz)
    if not nz:
        # scipy gives nan; mimic's wilcoxon gives None
        case["w_plus"] = None
        case["z"] = None
        case["p"] = None
        return case
    opts = dict(zero_method="wilcox", correction=True, method="approx")
    two = stats.wilcoxon(d, alternative="two-sided", **opts)
    # alternative="greater" reports the statistic as W+ (the sum of the ranks of positive d)
    greater = stats.wilcoxon(d, alternative="greater", **opts)
    case["w_plus"] = float(greater.statistic)
    # scipy reports the two-sided z as -|z|; mimic signs it by W+ - n(n+1)/4
    case["z"] = float(two.zstatistic)
    case["p"] = float(two.pvalue)
    return case


def wilcoxon_cases():
    return [
        # the hand-made cases ab.rs tested before this reference existed
        wilcoxon_case("twelve pairs, log ratio",
                      [1.0, 2.5, 3.1, 4.7, 5.2, 6.9, 7.4, 8.8, 9.3, 10.6, 11.2, 12.9],
                      [1.3, 2.1, 3.9, 4.1, 6.0, 6.2, 8.9, 8.1, 9.9, 11.9, 10.7, 14.1], "log_ratio"),
        wilcoxon_case("ties and a zero",
                      [0] * 13,
                      [10, -10, 20, 20, -30, 40, 40, 40, 50, -5, 60, 70, 0], "diff"),
        # a single non-zero difference: |z| after the correction is 0, p = 1
        wilcoxon_case("one difference", [100, 7], [100, 12], "diff"),
        # W+ exactly at its mean n(n+1)/4: no continuity correction, z = 0, p = 1
        wilcoxon_case("W+ at the mean, n = 3", [0, 0, 0], [1, 2, -3], "diff"),
        wilcoxon_case("W+ at the mean, a tie", [0, 0], [1, -1], "diff"),
        wilcoxon_case("all zeros", [5, 6, 7], [5, 6, 7], "diff"),
        # regenerated samples, paired by position
        wilcoxon_case("skew 60, b 5% slower", spec("skew", 60, 40, shift=1),
                      spec("skew", 60, 41, shift=1, scale_pct=105), "log_ratio"),
        wilcoxon_case("tri 30, unrelated", spec("tri", 30, 42), spec("tri", 30, 43), "diff"),
        wilcoxon_case("ties 50: zeros and ties", spec("ties", 50, 44), spec("ties", 50, 45), "diff"),
        wilcoxon_case("ties 400, b shifted by 1", spec("ties", 400, 46), spec("ties", 400, 47, shift=1),
                      "diff"),
        wilcoxon_case("skew 2000, b 3% slower", spec("skew", 2000, 48, shift=1),
                      spec("skew", 2000, 49, shift=1, scale_pct=103), "log_ratio"),
        wilcoxon_case("same sample, b 90%: faster", spec("tri", 80, 50, shift=1000),
                      spec("tri", 80, 50, shift=1000, scale_pct=90), "log_ratio"),
        wilcoxon_case("tri 300, b shifted by 20000: tiny p", spec("tri", 300, 51),
                      spec("tri", 300, 52, shift=20000), "diff"),
        wilcoxon_case("uniform 1000, b 8% faster", spec("uniform", 1000, 53, shift=1),
                      spec("uniform", 1000, 54, shift=1, scale_pct=92), "log_ratio"),
    ]


def main():
    out = {
        "generator": "compare/tests/reference/gen.py",
        "scipy": scipy.__version__,
        "numpy": np.__version__,
        "ks_exact": [],
        "ks_asymp": [],
        "percentiles": [],
        "kolmogorov": [],
        "wilcoxon": [],
    }

    exact_cases = [
        (spec("uniform", 8, 1), spec("uniform", 10, 2)),
        (spec("tri", 25, 3), spec("tri", 25, 4, shift=8000)),
        (spec("ties", 30, 5), spec("ties", 40, 6, shift=1)),
        (spec("skew", 200, 7), spec("skew", 300, 8, scale_pct=110)),
        (spec("skew", 100, 9), spec("skew", 100, 10, scale_pct=300)),
        (spec("uniform", 1, 11), spec("uniform", 5, 12)),
        (spec("tri", 1000, 13), spec("tri", 1500, 14, shift=1500)),
        (spec("skew", 500, 15), spec("skew", 500, 16)),
        (spec("uniform", 3, 17), spec("uniform", 3, 18, shift=200000)),
        (spec("tri", 200, 23), spec("tri", 200, 24, shift=25000)),
        (spec("skew", 40, 25), spec("tri", 70, 26)),
    ]
    for a, b in exact_cases:
        xa, xb = sample(**a), sample(**b)
        r = stats.ks_2samp(xa, xb, method="exact")
        out["ks_exact"].append({
            "a": a, "b": b, "a_check": check(a, xa), "b_check": check(b, xb),
            "d": float(r.statistic), "p": float(r.pvalue),
        })

    asymp_cases = [
        (spec("skew", 20000, 19), spec("skew", 15000, 20, scale_pct=103)),
        (spec("tri", 12000, 21), spec("tri", 11000, 22, shift=300)),
    ]
    for a, b in asymp_cases:
        xa, xb = sample(**a), sample(**b)
        r = stats.ks_2samp(xa, xb, method="asymp")
        n1, n2 = len(xa), len(xb)
        en = n1 * n2 / (n1 + n2)
        out["ks_asymp"].append({
            "a": a, "b": b, "a_check": check(a, xa), "b_check": check(b, xb),
            "d": float(r.statistic),
            # the limiting Kolmogorov distribution at sqrt(en) * D: what mimic computes
            "p_kolmogorov": float(special.kolmogorov(math.sqrt(en) * r.statistic)),
            # scipy's own asymptotic p (kstwo.sf(D, round(en))), for the record
            "p_scipy_asymp": float(r.pvalue),
        })

    ps = [0, 1, 10, 25, 33.3, 50, 75, 90, 95, 99, 99.9, 100]
    for s in [spec("uniform", 1, 30), spec("uniform", 2, 31), spec("skew", 7, 32), spec("ties", 50, 33),
              spec("skew", 1001, 34)]:
        xs = sample(**s)
        vals = np.percentile(np.array(xs, dtype=np.float64), ps, method="linear")
        out["percentiles"].append({
            "sample": s, "check": check(s, xs), "p": ps, "values": [float(v) for v in vals],
            "mean": float(np.mean(np.array(xs, dtype=np.float64))),
        })

    for lam in [0.05, 0.2, 0.5, 0.8, 1.0, 1.2, 1.36, 1.63, 2.0, 3.0, 5.0]:
        out["kolmogorov"].append({"lambda": lam, "sf": float(special.kolmogorov(lam))})

    out["wilcoxon"] = wilcoxon_cases()

    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
