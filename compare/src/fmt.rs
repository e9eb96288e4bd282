//! Number formatting shared by the verdict, the text summary, the HTML tables and the plot axes.

/// U+2212, the typographic minus the report uses for negative numbers.
pub const MINUS: &str = "\u{2212}";

/// A signed percentage of a fraction: 0.073 → "+7.3%", −0.12 → "−12.0%".
pub fn pct_signed(frac: f64) -> String {
    if !frac.is_finite() {
        return "n/a".into();
    }
    let v = frac * 100.0;
    let digits = if v.abs() >= 100.0 { 0 } else { 1 };
    let s = format!("{:.*}", digits, v.abs());
    if s.trim_start_matches(['0', '.']).is_empty() {
        return format!("{s}%");
    }
    format!("{}{s}%", if v < 0.0 { MINUS } else { "+" })
}

/// An unsigned percentage of a fraction with `digits` decimals: 0.8612 → "86.1%".
pub fn pct(frac: f64, digits: usize) -> String {
    if !frac.is_finite() {
        return "n/a".into();
    }
    format!("{:.*}%", digits, frac * 100.0)
}

/// Milliseconds from microseconds with three significant digits (at least one decimal below
/// 100 ms): 734 → "0.734", 12_345 → "12.3", 1_234_567 → "1235".
pub fn ms(us: f64) -> String {
    if !us.is_finite() {
        return "n/a".into();
    }
    let v = us / 1000.0;
    let a = v.abs();
    let digits = if a == 0.0 {
        0
    } else if a < 1.0 {
        3
    } else if a < 10.0 {
        2
    } else if a < 100.0 {
        1
    } else {
        0
    };
    let s = format!("{:.*}", digits, a);
    if v < 0.0 && !s.trim_start_matches(['0', '.']).is_empty() {
        format!("{MINUS}{s}")
    } else {
        s
    }
}

/// A signed time difference in ms: "+3.21 ms", "−120 ms".
pub fn ms_signed(us: f64) -> String {
    if !us.is_finite() {
        return "n/a".into();
    }
    let body = ms(us.abs());
    if body.trim_start_matches(['0', '.']).is_empty() {
        return format!("{body} ms");
    }
    format!("{}{body} ms", if us < 0.0 { MINUS } else { "+" })
}

/// A duration with its unit chosen by size: "850 µs", "12.3 ms", "1.5 s".
pub fn duration(us: f64) -> String {
    if !us.is_finite() {
        return "n/a".into();
    }
    let a = us.abs();
    let sign = if us < 0.0 { MINUS } else { "" };
    if a < 1000.0 {
        format!("{sign}{} µs", trim(a, 0))
    } else if a < 1_000_000.0 {
        format!("{sign}{} ms", sig3(a / 1000.0))
    } else {
        format!("{sign}{} s", sig3(a / 1e6))
    }
}

/// A bit rate: "56 kbit/s", "1.5 Mbit/s", "10 Gbit/s".
pub fn bitrate(bps: f64) -> String {
    if !bps.is_finite() {
        return "n/a".into();
    }
    let (v, unit) = if bps >= 1e9 {
        (bps / 1e9, "Gbit/s")
    } else if bps >= 1e6 {
        (bps / 1e6, "Mbit/s")
    } else if bps >= 1e3 {
        (bps / 1e3, "kbit/s")
    } else {
        (bps, "bit/s")
    };
    format!("{} {unit}", sig3(v))
}

/// A p-value: "p<0.001", "p=0.023", "p=0.41".
pub fn p_value(p: f64) -> String {
    if !p.is_finite() {
        return "p=n/a".into();
    }
    if p < 0.001 {
        "p<0.001".into()
    } else if p < 0.1 {
        format!("p={p:.3}")
    } else {
        format!("p={p:.2}")
    }
}

/// Three significant digits, trailing zeros dropped: 1.50 → "1.5", 123.4 → "123", 0.0456 → "0.0456".
pub fn sig3(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return "0".into();
    }
    let mag = v.abs().log10().floor() as i32;
    let digits = (2 - mag).max(0) as usize;
    trim(v, digits)
}

fn trim(v: f64, digits: usize) -> String {
    let s = format!("{:.*}", digits, v);
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// A confidence level as a percentage without the sign: 0.95 → "95", 0.999 → "99.9".
pub fn level(confidence: f64) -> String {
    format!("{}", (confidence * 100.0 * 1e6).round() / 1e6)
}

/// Escapes text for HTML and SVG.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(pct_signed(0.073), "+7.3%");
        assert_eq!(pct_signed(-0.12), "\u{2212}12.0%");
        assert_eq!(pct_signed(0.0), "0.0%");
        assert_eq!(pct_signed(-0.0001), "0.0%");
        assert_eq!(pct_signed(1.5), "+150%");
        assert_eq!(ms(734.0), "0.734");
        assert_eq!(ms(12_345.0), "12.3");
        assert_eq!(ms(1_234_567.0), "1235");
        assert_eq!(ms_signed(-120_000.0), "\u{2212}120 ms");
        assert_eq!(ms_signed(3210.0), "+3.21 ms");
        assert_eq!(duration(850.0), "850 µs");
        assert_eq!(duration(1_500_000.0), "1.5 s");
        assert_eq!(duration(12_345.0), "12.3 ms");
        assert_eq!(bitrate(56_000.0), "56 kbit/s");
        assert_eq!(bitrate(1_500_000.0), "1.5 Mbit/s");
        assert_eq!(p_value(0.0004), "p<0.001");
        assert_eq!(p_value(0.0234), "p=0.023");
        assert_eq!(p_value(0.414), "p=0.41");
        assert_eq!(sig3(0.0456), "0.0456");
        assert_eq!(esc("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
    }
}
