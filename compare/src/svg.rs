//! CDF charts as standalone SVG: the same markup goes inline into the HTML report and, through
//! resvg, into the PNG files, so both show identical plots. Written by hand (no plotting
//! library) to control what an operator reads: titles, units on the axes, log-scale decades,
//! a legend with sample sizes, shaded error bands.

use crate::fmt::{self, esc};
use crate::stats;

pub(crate) const WIDTH: f64 = 760.0;
pub(crate) const HEIGHT: f64 = 440.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 24.0;
const TOP: f64 = 56.0;
const BOTTOM: f64 = 58.0;
pub(crate) const FONT: &str = "DejaVu Sans, Liberation Sans, Arial, Helvetica, sans-serif";

/// Okabe–Ito colours (distinguishable with the common colour-vision deficiencies); BASE is
/// drawn in near-black.
pub(crate) const BASE_COLOR: &str = "#222222";
pub(crate) const PALETTE: [&str; 7] = [
    "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#7F6F00",
];

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Scale {
    Linear,
    Log,
}

/// What the x values are, for the tick labels.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Units {
    /// Microseconds, shown as µs / ms / s.
    Duration,
    /// Bits per second, shown as kbit/s, Mbit/s, …
    Bitrate,
    /// A fraction shown as a percentage.
    Percent,
    /// A fraction shown as a signed percentage (relative error).
    SignedPercent,
}

pub(crate) struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
    pub color: String,
    pub width: f64,
    pub dash: Option<&'static str>,
}

/// A shaded vertical band (e.g. relative error within ±20%).
pub(crate) struct Band {
    pub from: f64,
    pub to: f64,
    pub fill: &'static str,
    pub label: String,
}

pub(crate) struct Chart {
    pub title: String,
    pub subtitle: String,
    pub x_label: String,
    pub y_label: String,
    pub scale: Scale,
    pub units: Units,
    pub x_range: (f64, f64),
    pub series: Vec<Series>,
    pub bands: Vec<Band>,
    /// Dashed vertical reference lines.
    pub vlines: Vec<f64>,
    /// A line of small print under the plot (e.g. how out-of-range values are drawn).
    pub note: Option<String>,
}

/// Empirical CDF points of an ascending sample: the exact step function up to 600 values,
/// beyond that 1001 quantiles joined by lines (indistinguishable at plot resolution).
pub(crate) fn cdf_points(sorted: &[f64]) -> Vec<(f64, f64)> {
    let n = sorted.len();
    let mut pts = Vec::new();
    if n == 0 {
        return pts;
    }
    if n <= 600 {
        pts.push((sorted[0], 0.0));
        for (i, &x) in sorted.iter().enumerate() {
            pts.push((x, i as f64 / n as f64));
            pts.push((x, (i + 1) as f64 / n as f64));
        }
    } else {
        pts.push((sorted[0], 0.0));
        for k in 0..=1000 {
            let q = k as f64 / 1000.0;
            pts.push((stats::percentile_sorted(sorted, q * 100.0), q));
        }
    }
    pts
}

/// An x range covering every sample: for a log axis from the smallest positive value to the
/// largest, widened to a little margin.
pub(crate) fn auto_range(samples: &[&[f64]], scale: Scale) -> (f64, f64) {
    let mut lo = f64::INFINITY;
    let mut hi = f64::NEG_INFINITY;
    for s in samples {
        for &v in s.iter() {
            if scale == Scale::Log && v <= 0.0 {
                continue;
            }
            lo = lo.min(v);
            hi = hi.max(v);
        }
    }
    if !lo.is_finite() || !hi.is_finite() {
        return if scale == Scale::Log {
            (1.0, 10.0)
        } else {
            (0.0, 1.0)
        };
    }
    match scale {
        Scale::Log => {
            if hi / lo < 10.0 {
                let mid = (lo * hi).sqrt();
                (mid / 3.2, mid * 3.2)
            } else {
                (lo / 1.25, hi * 1.25)
            }
        }
        Scale::Linear => {
            if hi - lo < 1e-12 {
                (
                    lo - 0.5_f64.max(lo.abs() * 0.1),
                    hi + 0.5_f64.max(hi.abs() * 0.1),
                )
            } else {
                let pad = (hi - lo) * 0.03;
                (lo - pad, hi + pad)
            }
        }
    }
}

impl Chart {
    fn plot_w(&self) -> f64 {
        WIDTH - LEFT - RIGHT
    }
    fn plot_h(&self) -> f64 {
        HEIGHT - TOP - BOTTOM
    }
    fn t(&self, x: f64) -> f64 {
        match self.scale {
            Scale::Linear => x,
            Scale::Log => x.max(self.x_range.0 * 1e-3).log10(),
        }
    }
    fn px(&self, x: f64) -> f64 {
        let (a, b) = (self.t(self.x_range.0), self.t(self.x_range.1));
        let v = LEFT + (self.t(x) - a) / (b - a) * self.plot_w();
        v.clamp(LEFT - 2.0, LEFT + self.plot_w() + 2.0)
    }
    fn py(&self, y: f64) -> f64 {
        TOP + (1.0 - y) * self.plot_h()
    }

    fn tick_label(&self, x: f64) -> String {
        match self.units {
            Units::Duration => fmt::duration(x),
            Units::Bitrate => fmt::bitrate(x),
            Units::Percent => format!("{}%", fmt::sig3(x * 100.0)),
            Units::SignedPercent => {
                let v = (x * 100.0).round();
                if v == 0.0 {
                    "0%".into()
                } else if v > 0.0 {
                    format!("+{v}%")
                } else {
                    format!("{}{}%", fmt::MINUS, -v)
                }
            }
        }
    }

    /// (position, label or empty, major) for the x axis.
    fn x_ticks(&self) -> Vec<(f64, String, bool)> {
        let (lo, hi) = self.x_range;
        let mut out = Vec::new();
        match self.scale {
            Scale::Log => {
                let d0 = lo.log10().floor() as i32;
                let d1 = hi.log10().ceil() as i32;
                let decades = (hi / lo).log10();
                for d in d0..=d1 {
                    let base = 10f64.powi(d);
                    for m in 1..=9 {
                        let v = base * m as f64;
                        if v < lo * 0.999 || v > hi * 1.001 {
                            continue;
                        }
                        let labelled = m == 1
                            || (decades < 3.2 && (m == 2 || m == 5))
                            || (decades < 1.2 && m != 1);
                        out.push((
                            v,
                            if labelled {
                                self.tick_label(v)
                            } else {
                                String::new()
                            },
                            m == 1,
                        ));
                    }
                }
            }
            Scale::Linear => {
                let step = nice_step((hi - lo) / 7.0);
                let mut v = (lo / step).ceil() * step;
                while v <= hi + step * 1e-9 {
                    let vv = if v.abs() < step * 1e-9 { 0.0 } else { v };
                    out.push((vv, self.tick_label(vv), true));
                    v += step;
                }
            }
        }
        out
    }

    /// The chart as a standalone `<svg>` element.
    pub fn to_svg(&self) -> String {
        let mut s = String::with_capacity(32 * 1024);
        let (pw, ph) = (self.plot_w(), self.plot_h());
        s.push_str(&format!(
            r#"<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" font-family="{FONT}" role="img" aria-label="{}">"#,
            esc(&self.title)
        ));
        s.push_str(&format!(r#"<title>{}</title>"#, esc(&self.title)));
        s.push_str(&format!(
            r##"<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>"##
        ));
        let clip_id = format!("clip{:x}", hash(&self.title));
        s.push_str(&format!(
            r#"<defs><clipPath id="{clip_id}"><rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}"/></clipPath></defs>"#
        ));
        // title and subtitle
        s.push_str(&format!(
            r##"<text x="{LEFT}" y="22" font-size="16" font-weight="bold" fill="#111">{}</text>"##,
            esc(&self.title)
        ));
        if !self.subtitle.is_empty() {
            s.push_str(&format!(
                r##"<text x="{LEFT}" y="41" font-size="12" fill="#555">{}</text>"##,
                esc(&self.subtitle)
            ));
        }
        // plot background
        s.push_str(&format!(
            r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="#fbfbfb" stroke="none"/>"##
        ));
        // bands
        for b in &self.bands {
            let (x0, x1) = (self.px(b.from), self.px(b.to));
            s.push_str(&format!(
                r#"<rect x="{x0:.1}" y="{TOP}" width="{:.1}" height="{ph}" fill="{}" clip-path="url(#{clip_id})"/>"#,
                (x1 - x0).max(0.0),
                b.fill
            ));
        }
        // grid and ticks
        for k in 0..=10 {
            let y = k as f64 / 10.0;
            let py = self.py(y);
            let major = k % 2 == 0;
            s.push_str(&format!(
                r##"<line x1="{LEFT}" x2="{:.1}" y1="{py:.1}" y2="{py:.1}" stroke="{}" stroke-width="1"/>"##,
                LEFT + pw,
                if major { "#d9d9d9" } else { "#ececec" }
            ));
            if major {
                s.push_str(&format!(
                    r##"<text x="{:.1}" y="{:.1}" font-size="11" fill="#333" text-anchor="end">{}</text>"##,
                    LEFT - 6.0,
                    py + 4.0,
                    trim_y(y)
                ));
            }
        }
        for (x, label, major) in self.x_ticks() {
            let px = self.px(x);
            s.push_str(&format!(
                r##"<line x1="{px:.1}" x2="{px:.1}" y1="{TOP}" y2="{:.1}" stroke="{}" stroke-width="1"/>"##,
                TOP + ph,
                if major { "#d0d0d0" } else { "#ececec" }
            ));
            if !label.is_empty() {
                s.push_str(&format!(
                    r##"<line x1="{px:.1}" x2="{px:.1}" y1="{:.1}" y2="{:.1}" stroke="#333" stroke-width="1"/>"##,
                    TOP + ph,
                    TOP + ph + 4.0
                ));
                s.push_str(&format!(
                    r##"<text x="{px:.1}" y="{:.1}" font-size="11" fill="#333" text-anchor="middle">{}</text>"##,
                    TOP + ph + 17.0,
                    esc(&label)
                ));
            }
        }
        for &v in &self.vlines {
            let px = self.px(v);
            s.push_str(&format!(
                r##"<line x1="{px:.1}" x2="{px:.1}" y1="{TOP}" y2="{:.1}" stroke="#777" stroke-width="1" stroke-dasharray="4 3"/>"##,
                TOP + ph
            ));
        }
        // band labels, just above the plot at the band's right edge, clear of the curves
        for b in &self.bands {
            let px = self.px(b.to);
            s.push_str(&format!(
                r##"<text x="{:.1}" y="{:.1}" font-size="10" fill="#4a6f96" text-anchor="middle">{}</text>"##,
                px,
                TOP - 4.0,
                esc(&b.label)
            ));
        }
        // axes frame
        s.push_str(&format!(
            r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#333" stroke-width="1"/>"##
        ));
        // series
        for ser in &self.series {
            if ser.points.is_empty() {
                continue;
            }
            let mut d = String::with_capacity(ser.points.len() * 14);
            let mut last: Option<(f64, f64)> = None;
            for (i, &(x, y)) in ser.points.iter().enumerate() {
                let (px, py) = (self.px(x), self.py(y));
                if let Some((lx, ly)) = last {
                    if (px - lx).abs() < 0.05 && (py - ly).abs() < 0.05 {
                        continue;
                    }
                }
                d.push_str(&format!(
                    "{}{px:.1},{py:.1}",
                    if i == 0 { "M" } else { " L" }
                ));
                last = Some((px, py));
            }
            // carry the CDF to the right edge at its last level
            if let Some(&(_, y)) = ser.points.last() {
                d.push_str(&format!(" L{:.1},{:.1}", LEFT + pw, self.py(y)));
            }
            s.push_str(&format!(
                r#"<path d="{d}" fill="none" stroke="{}" stroke-width="{}" stroke-linejoin="round"{} clip-path="url(#{clip_id})"/>"#,
                ser.color,
                ser.width,
                ser.dash.map(|da| format!(r#" stroke-dasharray="{da}""#)).unwrap_or_default()
            ));
        }
        // axis labels
        s.push_str(&format!(
            r##"<text x="{:.1}" y="{:.1}" font-size="12" fill="#111" text-anchor="middle">{}</text>"##,
            LEFT + pw / 2.0,
            HEIGHT - 22.0,
            esc(&self.x_label)
        ));
        s.push_str(&format!(
            r##"<text x="16" y="{:.1}" font-size="12" fill="#111" text-anchor="middle" transform="rotate(-90 16 {:.1})">{}</text>"##,
            TOP + ph / 2.0,
            TOP + ph / 2.0,
            esc(&self.y_label)
        ));
        if let Some(note) = &self.note {
            s.push_str(&format!(
                r##"<text x="{:.1}" y="{:.1}" font-size="10" fill="#666" text-anchor="end">{}</text>"##,
                WIDTH - RIGHT,
                HEIGHT - 6.0,
                esc(note)
            ));
        }
        // legend: lower right, inside the plot, where a CDF leaves room
        let rows = self.series.len();
        if rows > 0 {
            let longest = self
                .series
                .iter()
                .map(|s| s.label.chars().count())
                .max()
                .unwrap_or(0) as f64;
            let w = (longest * 6.9 + 44.0).min(pw - 20.0);
            let h = rows as f64 * 18.0 + 10.0;
            let x0 = LEFT + pw - w - 10.0;
            let y0 = TOP + ph - h - 10.0;
            s.push_str(&format!(
                r##"<rect x="{x0:.1}" y="{y0:.1}" width="{w:.1}" height="{h:.1}" fill="#ffffff" fill-opacity="0.92" stroke="#bbb" rx="3"/>"##
            ));
            for (i, ser) in self.series.iter().enumerate() {
                let y = y0 + 14.0 + i as f64 * 18.0;
                s.push_str(&format!(
                    r#"<line x1="{:.1}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="{}" stroke-width="{}"{}/>"#,
                    x0 + 8.0,
                    x0 + 32.0,
                    y - 4.0,
                    y - 4.0,
                    ser.color,
                    ser.width.max(2.0),
                    ser.dash.map(|da| format!(r#" stroke-dasharray="{da}""#)).unwrap_or_default()
                ));
                s.push_str(&format!(
                    r##"<text x="{:.1}" y="{y:.1}" font-size="12" fill="#111">{}</text>"##,
                    x0 + 38.0,
                    esc(&ser.label)
                ));
            }
        }
        s.push_str("</svg>");
        s
    }
}

fn trim_y(y: f64) -> String {
    if y == 0.0 {
        "0".into()
    } else if y == 1.0 {
        "1".into()
    } else {
        format!("{y:.1}")
    }
}

/// 1, 2 or 5 × 10^k closest above `raw`.
fn nice_step(raw: f64) -> f64 {
    if raw <= 0.0 || !raw.is_finite() {
        return 1.0;
    }
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let m = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    m * mag
}

/// A small stable hash to give each chart's clip path a unique id within one page.
fn hash(s: &str) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart(scale: Scale, units: Units, range: (f64, f64)) -> Chart {
        Chart {
            title: "t".into(),
            subtitle: String::new(),
            x_label: "x".into(),
            y_label: "y".into(),
            scale,
            units,
            x_range: range,
            series: vec![Series {
                label: "a <b>".into(),
                points: cdf_points(&[1.0, 2.0, 3.0]),
                color: "#000".into(),
                width: 2.0,
                dash: None,
            }],
            bands: vec![],
            vlines: vec![],
            note: None,
        }
    }

    #[test]
    fn log_axis_ticks_are_decades_with_units() {
        let labels = |range: (f64, f64)| -> Vec<String> {
            chart(Scale::Log, Units::Duration, range)
                .x_ticks()
                .into_iter()
                .filter(|t| !t.1.is_empty())
                .map(|t| t.1)
                .collect()
        };
        assert_eq!(
            labels((800.0, 2_000_000.0)),
            ["1 ms", "10 ms", "100 ms", "1 s"]
        );
        assert_eq!(
            labels((3000.0, 60000.0)),
            ["5 ms", "10 ms", "20 ms", "50 ms"]
        );
    }

    #[test]
    fn linear_percent_ticks() {
        let c = chart(Scale::Linear, Units::SignedPercent, (-0.5, 0.5));
        let labels: Vec<String> = c.x_ticks().into_iter().map(|t| t.1).collect();
        assert!(
            labels.contains(&"0%".to_string())
                && labels.contains(&"+20%".to_string())
                && labels.contains(&"\u{2212}20%".to_string()),
            "{labels:?}"
        );
    }

    #[test]
    fn svg_is_escaped_and_complete() {
        let svg = chart(Scale::Linear, Units::Percent, (0.0, 4.0)).to_svg();
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert!(svg.contains("a &lt;b&gt;"));
        assert!(svg.contains("<path d=\"M"));
    }

    #[test]
    fn cdf_points_step_and_quantile_forms() {
        let p = cdf_points(&[1.0, 2.0]);
        assert_eq!(
            p,
            vec![(1.0, 0.0), (1.0, 0.0), (1.0, 0.5), (2.0, 0.5), (2.0, 1.0)]
        );
        let big: Vec<f64> = (0..10_000).map(|v| v as f64).collect();
        let p = cdf_points(&big);
        assert_eq!(p.len(), 1002);
        assert_eq!(p.last().unwrap(), &(9999.0, 1.0));
    }
}
