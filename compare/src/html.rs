//! The HTML report: one self-contained file (inline CSS and SVG, no script, nothing fetched),
//! readable offline and printable.

use std::fmt::Write as _;

use crate::fmt::{self, esc};
use crate::plots::{self, Figure, Section};
use crate::report::{Comparison, Direction, Paired, Report, ERROR_BANDS};
use crate::stats::{KsMethod, KS_EXACT_MAX_PRODUCT};

const CSS: &str = r#"
:root { color-scheme: light; }
body { font-family: "DejaVu Sans", "Liberation Sans", Arial, Helvetica, sans-serif; color: #1a1a1a;
  background: #f4f5f7; margin: 0; font-size: 14px; line-height: 1.45; }
main { max-width: 1600px; margin: 0 auto; padding: 18px 24px 40px; background: #fff; }
h1 { font-size: 24px; margin: 6px 0 2px; }
h2 { font-size: 19px; margin: 30px 0 8px; padding-bottom: 4px; border-bottom: 2px solid #d8dde3; }
h3 { font-size: 15px; margin: 20px 0 6px; }
p.sub { color: #555; margin: 0 0 10px; }
.verdict { border-left: 6px solid #888; background: #f6f6f6; padding: 10px 14px; margin: 8px 0; font-size: 15px; }
.verdict.faster { border-color: #1b7f3b; background: #eef8f1; }
.verdict.slower { border-color: #b3261e; background: #fcefee; }
.verdict.mixed { border-color: #b07900; background: #fdf6e7; }
.verdict b { font-weight: 700; }
table { border-collapse: collapse; margin: 6px 0 12px; font-size: 13px; }
th, td { border: 1px solid #d5d9de; padding: 4px 9px; vertical-align: top; }
th { background: #eef1f4; text-align: left; font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.faster td.sig { background: #e3f4e8; color: #14602c; font-weight: 600; }
tr.slower td.sig { background: #fbe5e3; color: #8f1d16; font-weight: 600; }
tr.not_significant td.sig { color: #666; }
tbody tr:nth-child(even) td { background-color: #fafbfc; }
tr.faster:nth-child(even) td.sig { background: #e3f4e8; }
tr.slower:nth-child(even) td.sig { background: #fbe5e3; }
.figure { margin: 10px 0 16px; }
.figure svg { max-width: 100%; height: auto; border: 1px solid #e1e4e8; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(700px, 1fr)); gap: 4px 16px; }
.grid .figure { margin: 6px 0; }
.note { color: #555; font-size: 12.5px; }
.warn { color: #8a5300; background: #fff7e6; border: 1px solid #f0d9a8; padding: 6px 10px; }
.kv { font-size: 12px; color: #444; overflow-wrap: anywhere; max-width: 560px; }
code { background: #f0f2f4; padding: 0 3px; border-radius: 3px; }
details summary { cursor: pointer; color: #333; }
footer { color: #777; font-size: 12px; margin-top: 30px; }
"#;

/// Verdict colour class from the p50/p90 directions.
fn verdict_class(c: &Comparison) -> &'static str {
    let dir = |s: &str| c.rows.iter().find(|r| r.stat == s).map(|r| r.direction);
    match (dir("p50"), dir("p90")) {
        (Some(Direction::Faster), Some(Direction::Faster | Direction::NotSignificant))
        | (Some(Direction::NotSignificant), Some(Direction::Faster)) => "faster",
        (Some(Direction::Slower), Some(Direction::Slower | Direction::NotSignificant))
        | (Some(Direction::NotSignificant), Some(Direction::Slower)) => "slower",
        (Some(Direction::NotSignificant), Some(Direction::NotSignificant)) => "same",
        _ => "mixed",
    }
}

pub(crate) fn render(r: &Report) -> String {
    let figures = plots::figures(r);
    let mut h = String::with_capacity(512 * 1024);
    let base = &r.inputs[0];
    let others: Vec<String> = r.inputs[1..]
        .iter()
        .map(|i| format!("<b>{}</b>", esc(&i.label)))
        .collect();
    let title = format!(
        "mimic compare: {} vs {}",
        r.inputs[1..]
            .iter()
            .map(|i| i.label.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        base.label
    );
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>{}</title>\n<style>{CSS}</style>\n</head>\n<body>\n<main>\n",
        esc(&title)
    );
    let _ = write!(
        h,
        "<h1>Response-time comparison</h1>\n<p class=\"sub\">BASE <b>{}</b> against {} · mimic {} · {} bootstrap resamples, seed {}, {}% intervals</p>\n",
        esc(&base.label),
        if others.is_empty() { "nothing".to_string() } else { others.join(", ") },
        r.tool_version,
        r.options.bootstrap_replicates,
        r.options.seed,
        fmt::level(r.options.confidence)
    );

    // Verdict
    h.push_str("<h2 id=\"verdict\">Verdict</h2>\n");
    if r.comparisons.is_empty() {
        h.push_str("<p class=\"verdict\">No OTHER input to compare with.</p>\n");
    }
    for c in &r.comparisons {
        let _ = writeln!(
            h,
            "<p class=\"verdict {}\">{}</p>",
            verdict_class(c),
            esc(&c.verdict)
        );
        if let Some(w) = &c.vantage_warning {
            let _ = writeln!(h, "<p class=\"warn\">Vantage point: {}</p>", esc(w));
        }
        if let Some(w) = &c.timing_warning {
            let _ = writeln!(h, "<p class=\"warn\">Replay timing: {}</p>", esc(w));
        }
    }
    for a in &r.ab {
        let class = match a.direction {
            Direction::Faster => "faster",
            Direction::Slower => "slower",
            Direction::NotSignificant => "same",
        };
        let _ = writeln!(
            h,
            "<p class=\"verdict {class}\"><b>{}</b></p>",
            esc(&a.verdict)
        );
        if let Some(w) = &a.timing_warning {
            let _ = writeln!(h, "<p class=\"warn\">Replay timing: {}</p>", esc(w));
        }
    }
    if !r.ab.is_empty() {
        h.push_str("<p class=\"note\">Replays of the same workload reproduce the same original connections, so the stack change is judged connection by connection (bold): each connection's response time under the change against its own time under the reference replay, with a bootstrap over connections and a Wilcoxon signed-rank test. The lines above compare each input's distribution with BASE's, as independent samples.</p>\n");
        let level = fmt::level(r.options.confidence);
        let _ = write!(h, "<table>\n<thead><tr><th>change</th><th>reference</th><th class=\"num\">connections</th><th class=\"num\">median change</th><th class=\"num\">{level}% CI</th><th class=\"num\">total change</th><th class=\"num\">{level}% CI</th><th class=\"num\">faster</th><th class=\"num\">slower</th><th class=\"num\">Wilcoxon p</th></tr></thead>\n<tbody>\n");
        for a in &r.ab {
            let _ = writeln!(
                h,
                "<tr><td>{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">[{}, {}]</td><td class=\"num\">{}</td><td class=\"num\">[{}, {}]</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
                esc(&a.b),
                esc(&a.a),
                a.n,
                fmt::pct_signed(a.median_rel),
                fmt::pct_signed(a.median_rel_ci[0]),
                fmt::pct_signed(a.median_rel_ci[1]),
                fmt::pct_signed(a.total_rel),
                fmt::pct_signed(a.total_rel_ci[0]),
                fmt::pct_signed(a.total_rel_ci[1]),
                fmt::pct(a.faster, 0),
                fmt::pct(a.slower, 0),
                esc(&fmt::p_value(a.wilcoxon_p))
            );
        }
        h.push_str("</tbody>\n</table>\n");
    }

    // Inputs
    h.push_str("<h2 id=\"inputs\">Inputs</h2>\n<table>\n<thead><tr><th>input</th><th>role</th><th>file</th><th class=\"num\">connections</th><th class=\"num\">with response time</th><th>left out (why)</th><th>stack / settings</th></tr></thead>\n<tbody>\n");
    for (k, i) in r.inputs.iter().enumerate() {
        let excluded = if i.excluded.is_empty() {
            "none".to_string()
        } else {
            i.excluded
                .iter()
                .map(|e| format!("{} {}", e.count, esc(&e.reason)))
                .collect::<Vec<_>>()
                .join("<br>")
        };
        let stack: Vec<String> = i
            .meta
            .iter()
            .filter(|(k, _)| {
                k.contains("stack")
                    || k.contains("profile")
                    || k.as_str() == "cc"
                    || k.contains("initcwnd")
            })
            .map(|(k, v)| format!("<code>{}</code> {}", esc(k), esc(v)))
            .collect();
        let all_meta: String = i
            .meta
            .iter()
            .map(|(k, v)| format!("<code>{}</code> = {}", esc(k), esc(v)))
            .collect::<Vec<_>>()
            .join("<br>");
        let _ = writeln!(
            h,
            "<tr><td><span style=\"color:{}\">■</span> <b>{}</b>{}</td><td>{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td><td class=\"kv\">{}<details><summary>all meta</summary>{}</details></td></tr>",
            plots::input_color(k),
            esc(&i.label),
            if k == 0 { " (BASE)" } else { "" },
            esc(i.role.as_deref().unwrap_or("not recorded")),
            esc(&i.path.display().to_string()),
            i.connections,
            i.with_response_time,
            excluded,
            if stack.is_empty() { "not recorded".to_string() } else { stack.join("<br>") },
            all_meta
        );
    }
    h.push_str("</tbody></table>\n<p class=\"note\">Response times are per connection: first request byte to last response byte. Connections without one (no complete exchange) are left out of every response-time statistic and counted above.</p>\n");

    // Response time
    h.push_str("<h2 id=\"response-time\">Response time</h2>\n");
    push_figures(&mut h, &figures, Section::ResponseTime, false);
    h.push_str("<h3>Percentiles</h3>\n<table>\n<thead><tr><th>input</th>");
    for p in crate::stats::TABLE_PERCENTILES {
        let _ = write!(h, "<th class=\"num\">{}</th>", crate::report::stat_name(p));
    }
    h.push_str("<th class=\"num\">mean</th></tr></thead>\n<tbody>\n");
    for i in &r.inputs {
        let _ = write!(h, "<tr><td>{}</td>", esc(&i.label));
        for p in crate::stats::TABLE_PERCENTILES {
            let _ = write!(
                h,
                "<td class=\"num\">{} ms</td>",
                fmt::ms(i.response_time_us.percentiles[&crate::report::stat_name(p)])
            );
        }
        let _ = writeln!(
            h,
            "<td class=\"num\">{} ms</td></tr>",
            fmt::ms(i.response_time_us.mean)
        );
    }
    h.push_str("</tbody></table>\n");
    for c in &r.comparisons {
        let _ = write!(
            h,
            "<h3>{} against {} (BASE)</h3>\n<table>\n<thead><tr><th>statistic</th><th class=\"num\">{} (BASE)</th><th class=\"num\">{}</th><th class=\"num\">difference</th><th class=\"num\">{}% CI</th><th class=\"num\">relative</th><th class=\"num\">{}% CI</th><th>finding</th></tr></thead>\n<tbody>\n",
            esc(&c.other),
            esc(&c.base),
            esc(&c.base),
            esc(&c.other),
            fmt::level(r.options.confidence),
            fmt::level(r.options.confidence)
        );
        for row in &c.rows {
            let (cls, finding) = match row.direction {
                Direction::Faster => ("faster", format!("{} faster", esc(&c.other))),
                Direction::Slower => ("slower", format!("{} slower", esc(&c.other))),
                Direction::NotSignificant => {
                    ("not_significant", "no significant difference".to_string())
                }
            };
            let _ = writeln!(
                h,
                "<tr class=\"{cls}\"><td>{}</td><td class=\"num\">{} ms</td><td class=\"num\">{} ms</td><td class=\"num sig\">{}</td><td class=\"num\">[{}, {}]</td><td class=\"num sig\">{}</td><td class=\"num\">[{}, {}]</td><td class=\"sig\">{finding}</td></tr>",
                row.stat,
                fmt::ms(row.base_us),
                fmt::ms(row.other_us),
                fmt::ms_signed(row.diff_us),
                fmt::ms_signed(row.diff_ci_us[0]),
                fmt::ms_signed(row.diff_ci_us[1]),
                fmt::pct_signed(row.rel),
                fmt::pct_signed(row.rel_ci[0]),
                fmt::pct_signed(row.rel_ci[1]),
            );
        }
        let _ = writeln!(
            h,
            "</tbody></table>\n<p>Two-sample Kolmogorov–Smirnov test: D = <b>{:.4}</b>, {} ({} p-value, n = {} and {}). {}</p>",
            c.ks.d,
            fmt::p_value(c.ks.p_value),
            match c.ks.method {
                KsMethod::Exact => "exact",
                KsMethod::Asymptotic => "asymptotic",
            },
            c.ks.n1,
            c.ks.n2,
            if c.ks.p_value < 0.05 {
                "The two response-time distributions differ."
            } else {
                "No significant difference between the distributions."
            }
        );
    }

    // Per-connection fidelity
    for (ci, c) in r.comparisons.iter().enumerate() {
        if let Some(note) = &c.pairing_note {
            let _ = writeln!(
                h,
                "<h2>Per connection: {} vs {}</h2>\n<p class=\"warn\">{}</p>",
                esc(&c.other),
                esc(&c.base),
                esc(note)
            );
        }
        let Some(p) = &c.paired else { continue };
        let _ = writeln!(
            h,
            "<h2 id=\"paired-{ci}\">Per connection: {} as a replay of {}</h2>",
            esc(&c.other),
            esc(&c.base)
        );
        paired_summary(&mut h, c, p);
        push_figures(&mut h, &figures, Section::Paired(ci), true);
        for b in &p.breakdowns {
            let what = match b.by.as_str() {
                "response_time" => "original response time",
                "bandwidth" => "bottleneck bandwidth",
                _ => "min RTT",
            };
            let _ = write!(
                h,
                "<h3>By {what}</h3>\n<p class=\"note\">Classes: {}.</p>\n<table>\n<thead><tr><th>class</th><th class=\"num\">connections</th><th class=\"num\">within ±10%</th><th class=\"num\">within ±20%</th><th class=\"num\">replay faster</th><th class=\"num\">p10 error</th><th class=\"num\">median error</th><th class=\"num\">p90 error</th></tr></thead>\n<tbody>\n",
                esc(&b.method)
            );
            for cl in std::iter::once(&p.overall).chain(&b.classes) {
                let _ = writeln!(
                    h,
                    "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
                    if cl.label == "all" { "<b>all</b>".to_string() } else { esc(&cl.label) },
                    cl.n,
                    fmt::pct(cl.within_10, 1),
                    fmt::pct(cl.within_20, 1),
                    fmt::pct(cl.below_zero, 1),
                    fmt::pct_signed(cl.percentiles["p10"]),
                    fmt::pct_signed(cl.percentiles["p50"]),
                    fmt::pct_signed(cl.percentiles["p90"]),
                );
            }
            h.push_str("</tbody></table>\n");
        }
    }

    // Population
    h.push_str("<h2 id=\"population\">Population</h2>\n<p class=\"note\">What the analyzer inferred for the connections of each input: the conditions the workload was replayed under.</p>\n");
    push_figures(&mut h, &figures, Section::Population, true);
    population_table(&mut h, r);

    // Method
    let _ = write!(
        h,
        "<h2 id=\"method\">How these numbers are computed</h2>\n<ul class=\"note\">\n\
<li>Percentiles interpolate linearly between the two closest ranks (Hyndman &amp; Fan type 7, numpy's default).</li>\n\
<li>Confidence intervals: percentile bootstrap with {} resamples of each input, drawn independently (ChaCha8, seed {}); the interval of a difference is the central {}% of the resampled differences. A difference is called significant when its interval excludes 0.</li>\n\
<li>Kolmogorov–Smirnov: two-sided two-sample test; the p-value is exact (lattice-path count of the null distribution, assuming no ties) when n₁·n₂ ≤ {:.0e}, otherwise from the asymptotic Kolmogorov distribution at √(n₁n₂/(n₁+n₂))·D.</li>\n\
<li>Relative error per connection (Monkey §5.1): (replay − original) / original, pairing each replayed connection with the BASE connection it reproduces through the replay's <code>replay_map</code>. Failed replays are listed, never dropped silently.</li>\n\
</ul>\n",
        r.options.bootstrap_replicates,
        r.options.seed,
        fmt::level(r.options.confidence),
        KS_EXACT_MAX_PRODUCT as f64
    );
    let _ = write!(h, "<footer>Written by mimic {} (<code>mimic compare</code>). Self-contained: no scripts, no external resources.</footer>\n</main>\n</body>\n</html>\n", r.tool_version);
    h
}

fn push_figures(h: &mut String, figures: &[Figure], section: Section, grid: bool) {
    if grid {
        h.push_str("<div class=\"grid\">\n");
    }
    for f in figures.iter().filter(|f| f.section == section) {
        let _ = writeln!(
            h,
            "<div class=\"figure\" id=\"fig-{}\">{}</div>",
            f.name,
            f.chart.to_svg()
        );
    }
    if grid {
        h.push_str("</div>\n");
    }
}

fn paired_summary(h: &mut String, c: &Comparison, p: &Paired) {
    let o = &p.overall;
    let _ = writeln!(
        h,
        "<p><b>{}</b> of {} paired connections replayed within ±{:.0}% of the original response time, <b>{}</b> within ±{:.0}% (Monkey reached 86% within ±20%). Median error {}; the replay was faster for {} of them.</p>",
        fmt::pct(o.within_10, 1),
        p.pairs,
        ERROR_BANDS[0] * 100.0,
        fmt::pct(o.within_20, 1),
        ERROR_BANDS[1] * 100.0,
        fmt::pct_signed(o.percentiles["p50"]),
        fmt::pct(o.below_zero, 0)
    );
    let _ = writeln!(
        h,
        "<p class=\"note\">Pairing check: {} of {} replayed connections have the same number of exchanges and the same response bytes (within 5%) as the {} connection they reproduce.</p>",
        p.consistent,
        p.consistency_checked,
        esc(&c.base)
    );
    let unpaired: u64 = p.unpaired.iter().map(|u| u.count).sum();
    let _ = writeln!(
        h,
        "<p>{}'s replay_map has {} rows: {} paired, {} not paired (below). {} connection(s) of {} with a response time were not replayed at all.</p>",
        esc(&c.other),
        p.replay_map_rows,
        p.pairs,
        unpaired,
        p.not_replayed,
        esc(&c.base)
    );
    if !p.unpaired.is_empty() {
        h.push_str("<table>\n<thead><tr><th>status</th><th>reason</th><th class=\"num\">connections</th></tr></thead>\n<tbody>\n");
        for u in &p.unpaired {
            let _ = writeln!(
                h,
                "<tr><td>{}</td><td>{}</td><td class=\"num\">{}</td></tr>",
                esc(&u.status),
                esc(&u.reason),
                u.count
            );
        }
        h.push_str("</tbody></table>\n");
    }
}

/// A population table row: column, label, and how its values print.
type MetricRow = (&'static str, &'static str, fn(f64) -> String);

fn population_table(h: &mut String, r: &Report) {
    let rows: [MetricRow; 5] = [
        ("min_rtt_us", "min RTT", fmt::duration),
        ("bw_bps", "bottleneck bandwidth", fmt::bitrate),
        ("loss_rate_down", "loss rate (down)", |v| fmt::pct(v, 2)),
        ("response_delay_us", "server response delay", fmt::duration),
        ("query_delay_us", "server query delay", fmt::duration),
    ];
    h.push_str("<table>\n<thead><tr><th>metric</th><th>input</th><th class=\"num\">with estimate</th><th class=\"num\">without</th><th class=\"num\">p10</th><th class=\"num\">p50</th><th class=\"num\">p90</th><th class=\"num\">mean</th></tr></thead>\n<tbody>\n");
    for (key, name, f) in rows {
        for i in &r.inputs {
            let m = &i.population[key];
            let cell = |v: f64| {
                if m.dist.n == 0 {
                    "–".to_string()
                } else {
                    f(v)
                }
            };
            let _ = writeln!(
                h,
                "<tr><td>{name}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
                esc(&i.label),
                m.dist.n,
                m.missing,
                cell(m.dist.percentiles["p10"]),
                cell(m.dist.percentiles["p50"]),
                cell(m.dist.percentiles["p90"]),
                cell(m.dist.mean)
            );
        }
    }
    h.push_str("</tbody></table>\n<p class=\"note\">min RTT, bandwidth and loss are per connection; the server delays per request/response exchange. “without”: no estimate (e.g. no packet pairs for bandwidth).</p>\n");
}
