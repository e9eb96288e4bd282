//! The plain-text summary `mimic compare` prints on a terminal.

use std::fmt::Write as _;

use crate::fmt;
use crate::report::Report;

pub(crate) fn render(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "inputs:");
    for (k, i) in r.inputs.iter().enumerate() {
        let left_out: u64 = i.excluded.iter().map(|e| e.count).sum();
        let _ = writeln!(
            s,
            "  {:<5} {}  {} ({}): {} connections, {} with a response time{}",
            if k == 0 { "BASE" } else { "OTHER" },
            i.label,
            i.path.display(),
            i.role.as_deref().unwrap_or("role not recorded"),
            i.connections,
            i.with_response_time,
            if left_out > 0 {
                format!(
                    "; left out: {}",
                    i.excluded
                        .iter()
                        .map(|e| format!("{} {}", e.count, e.reason))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            } else {
                String::new()
            }
        );
    }
    for c in &r.comparisons {
        let _ = writeln!(
            s,
            "\n{} vs {} (response time, ms; {}% bootstrap intervals):",
            c.other,
            c.base,
            fmt::level(r.options.confidence)
        );
        let _ = writeln!(
            s,
            "  {:<6} {:>10} {:>10} {:>12} {:>9}  interval of rel",
            "stat",
            c.base.chars().take(10).collect::<String>(),
            c.other.chars().take(10).collect::<String>(),
            "diff",
            "rel"
        );
        for row in &c.rows {
            let _ = writeln!(
                s,
                "  {:<6} {:>10} {:>10} {:>12} {:>9}  [{}, {}]{}",
                row.stat,
                fmt::ms(row.base_us),
                fmt::ms(row.other_us),
                fmt::ms_signed(row.diff_us),
                fmt::pct_signed(row.rel),
                fmt::pct_signed(row.rel_ci[0]),
                fmt::pct_signed(row.rel_ci[1]),
                match row.direction {
                    crate::report::Direction::Faster => "  faster",
                    crate::report::Direction::Slower => "  slower",
                    crate::report::Direction::NotSignificant => "",
                }
            );
        }
        let _ = writeln!(
            s,
            "  KS D={:.4} {} ({} p-value, n={} and {})",
            c.ks.d,
            fmt::p_value(c.ks.p_value),
            match c.ks.method {
                crate::stats::KsMethod::Exact => "exact",
                crate::stats::KsMethod::Asymptotic => "asymptotic",
            },
            c.ks.n1,
            c.ks.n2
        );
        if let Some(p) = &c.paired {
            let failed: u64 = p.unpaired.iter().map(|u| u.count).sum();
            let _ = writeln!(
                s,
                "  per connection ({} pairs): {} within ±10%, {} within ±20%, median error {}; {} not paired{}",
                p.pairs,
                fmt::pct(p.overall.within_10, 1),
                fmt::pct(p.overall.within_20, 1),
                fmt::pct_signed(p.overall.percentiles["p50"]),
                failed,
                if failed > 0 {
                    format!(
                        " ({})",
                        p.unpaired
                            .iter()
                            .map(|u| format!("{} {}: {}", u.count, u.status, u.reason))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                } else {
                    String::new()
                }
            );
        }
        if let Some(note) = &c.pairing_note {
            let _ = writeln!(s, "  note: {note}");
        }
        if let Some(w) = &c.vantage_warning {
            let _ = writeln!(s, "  warning: {w}");
        }
        if let Some(w) = &c.timing_warning {
            let _ = writeln!(s, "  warning: {w}");
        }
    }
    for a in &r.ab {
        let _ = writeln!(
            s,
            "\n{} vs {}, connection by connection ({} connections both replayed):\n  median change {} [{}, {}], total {} [{}, {}]; faster for {}, slower for {}; Wilcoxon signed-rank z={:.2}, {}",
            a.b,
            a.a,
            a.n,
            crate::fmt::pct_signed(a.median_rel),
            crate::fmt::pct_signed(a.median_rel_ci[0]),
            crate::fmt::pct_signed(a.median_rel_ci[1]),
            crate::fmt::pct_signed(a.total_rel),
            crate::fmt::pct_signed(a.total_rel_ci[0]),
            crate::fmt::pct_signed(a.total_rel_ci[1]),
            crate::fmt::pct(a.faster, 0),
            crate::fmt::pct(a.slower, 0),
            a.wilcoxon_z,
            crate::fmt::p_value(a.wilcoxon_p)
        );
        if let Some(w) = &a.timing_warning {
            let _ = writeln!(s, "  warning: {w}");
        }
    }
    let _ = writeln!(s, "\nverdict:");
    for line in r.verdict().lines() {
        let _ = writeln!(s, "  {line}");
    }
    s
}
