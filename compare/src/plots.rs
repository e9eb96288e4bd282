//! The report's figures, built once from a [`Report`] and drawn both into the HTML and as PNGs.

use crate::report::{Breakdown, Report, ERROR_BANDS};
use crate::stats;
use crate::svg::{auto_range, cdf_points, Band, Chart, Scale, Series, Units, BASE_COLOR, PALETTE};

/// Which part of the report a figure belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Section {
    ResponseTime,
    /// Index into `Report::comparisons`.
    Paired(usize),
    Population,
}

pub(crate) struct Figure {
    /// File stem of the PNG (unique within a report).
    pub name: String,
    pub section: Section,
    pub chart: Chart,
}

/// Input `k`'s colour: BASE near-black, the others from the palette.
pub(crate) fn input_color(k: usize) -> &'static str {
    if k == 0 {
        BASE_COLOR
    } else {
        PALETTE[(k - 1) % PALETTE.len()]
    }
}

/// Input `k`'s line pattern: the first two solid, later ones dashed, so identical
/// distributions drawn on top of each other stay visible.
pub(crate) fn input_dash(k: usize) -> Option<&'static str> {
    match k {
        0 | 1 => None,
        2 => Some("9 4"),
        3 => Some("3 3"),
        _ => Some("10 3 2 3"),
    }
}

/// A label fit for a file name.
pub(crate) fn file_safe(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

const Y_CONN: &str = "cumulative fraction of connections";

pub(crate) fn figures(r: &Report) -> Vec<Figure> {
    let mut out = Vec::new();

    // 1. Response-time CDFs of every input.
    let samples: Vec<&[f64]> = (0..r.inputs.len())
        .map(|k| r.response_times_us(k))
        .collect();
    let series = r
        .inputs
        .iter()
        .enumerate()
        .map(|(k, i)| Series {
            label: format!(
                "{}{} (n={})",
                i.label,
                if k == 0 { " — BASE" } else { "" },
                i.with_response_time
            ),
            points: cdf_points(samples[k]),
            color: input_color(k).into(),
            width: if k == 0 { 2.6 } else { 2.0 },
            dash: input_dash(k),
        })
        .collect();
    let any_zero = samples.iter().any(|s| s.first().is_some_and(|&v| v <= 0.0));
    out.push(Figure {
        name: "response_time_cdf".into(),
        section: Section::ResponseTime,
        chart: Chart {
            title: "Response time per connection".into(),
            subtitle:
                "CDF of first request byte → last response byte (Monkey §5.1), every input overlaid"
                    .into(),
            x_label: "response time (log scale)".into(),
            y_label: Y_CONN.into(),
            scale: Scale::Log,
            units: Units::Duration,
            x_range: auto_range(&samples, Scale::Log),
            series,
            bands: vec![],
            vlines: vec![],
            note: any_zero.then(|| "response times of 0 are drawn at the left edge".to_string()),
        },
    });

    // 2. Per-connection relative error of each replay of BASE (Monkey Figures 6–8).
    for (ci, c) in r.comparisons.iter().enumerate() {
        let Some(p) = &c.paired else { continue };
        if p.pairs == 0 {
            continue;
        }
        let all = &p.overall.errors;
        // not `clamp`: a NaN percentile falls to the bound here, where clamp would keep it
        #[allow(clippy::manual_clamp)]
        let (lo, hi) = (
            stats::percentile_sorted(all, 1.0).min(-0.5).max(-1.0),
            stats::percentile_sorted(all, 99.0).max(0.5).min(3.0),
        );
        let beyond = all.iter().filter(|&&e| e < lo || e > hi).count();
        let note = (beyond > 0)
            .then(|| format!("{beyond} connection(s) beyond the axis range, drawn at its edges"));
        for b in &p.breakdowns {
            let (what, figure) = match b.by.as_str() {
                "response_time" => ("original response time", 6),
                "bandwidth" => ("bottleneck bandwidth", 7),
                _ => ("min RTT", 8),
            };
            out.push(Figure {
                name: format!("rel_error_{}_by_{}", file_safe(&c.other), b.by),
                section: Section::Paired(ci),
                chart: Chart {
                    title: format!("{}: relative error by {what}", c.other),
                    subtitle: format!(
                        "(replay − original) / original per connection, paired with {} through replay_map (cf. Monkey Fig. {figure})",
                        c.base
                    ),
                    x_label: "relative error of response time (negative: replay faster)".into(),
                    y_label: Y_CONN.into(),
                    scale: Scale::Linear,
                    units: Units::SignedPercent,
                    x_range: (lo, hi),
                    series: error_series(all, b),
                    bands: vec![
                        Band {
                            from: -ERROR_BANDS[1],
                            to: ERROR_BANDS[1],
                            fill: "#e8f1fa",
                            label: "±20%".into(),
                        },
                        Band {
                            from: -ERROR_BANDS[0],
                            to: ERROR_BANDS[0],
                            fill: "#d2e4f5",
                            label: "±10%".into(),
                        },
                    ],
                    vlines: vec![0.0],
                    note: note.clone(),
                },
            });
        }
    }

    // 3. The population: what each input's connections looked like.
    let metrics: [(&str, &str, &str, Scale, Units, &str); 5] = [
        (
            "min_rtt_us",
            "population_min_rtt",
            "Minimum RTT per connection",
            Scale::Log,
            Units::Duration,
            "min RTT (log scale)",
        ),
        (
            "bw_bps",
            "population_bandwidth",
            "Bottleneck bandwidth per connection",
            Scale::Log,
            Units::Bitrate,
            "bottleneck bandwidth estimate (log scale)",
        ),
        (
            "loss_rate_down",
            "population_loss",
            "Downstream loss rate per connection",
            Scale::Linear,
            Units::Percent,
            "loss rate, server → client",
        ),
        (
            "response_delay_us",
            "population_response_delay",
            "Server response delay per exchange",
            Scale::Log,
            Units::Duration,
            "last request packet → first response packet (log scale)",
        ),
        (
            "query_delay_us",
            "population_query_delay",
            "Server query delay per exchange",
            Scale::Log,
            Units::Duration,
            "first response packet → end of the server's pause (log scale)",
        ),
    ];
    for (key, name, title, scale, units, x_label) in metrics {
        let values: Vec<&[f64]> = r.loaded.iter().map(|i| population_values(i, key)).collect();
        if values.iter().all(|v| v.is_empty()) {
            continue;
        }
        let per_exchange = key.ends_with("delay_us");
        let series = r
            .inputs
            .iter()
            .enumerate()
            .filter(|(k, _)| !values[*k].is_empty())
            .map(|(k, i)| Series {
                label: format!("{} (n={})", i.label, values[k].len()),
                points: cdf_points(values[k]),
                color: input_color(k).into(),
                width: if k == 0 { 2.6 } else { 2.0 },
                dash: input_dash(k),
            })
            .collect();
        let x_range = if scale == Scale::Linear {
            let max = values
                .iter()
                .filter_map(|v| v.last().copied())
                .fold(0.0, f64::max);
            (0.0, (max * 1.05).max(0.01))
        } else {
            auto_range(&values, scale)
        };
        let zeros =
            scale == Scale::Log && values.iter().any(|v| v.first().is_some_and(|&x| x <= 0.0));
        out.push(Figure {
            name: name.into(),
            section: Section::Population,
            chart: Chart {
                title: title.into(),
                subtitle: format!(
                    "CDF over every {} with an estimate, each input overlaid",
                    if per_exchange {
                        "request/response exchange"
                    } else {
                        "connection"
                    }
                ),
                x_label: x_label.into(),
                y_label: if per_exchange {
                    "cumulative fraction of exchanges".into()
                } else {
                    Y_CONN.into()
                },
                scale,
                units,
                x_range,
                series,
                bands: vec![],
                vlines: vec![],
                note: zeros.then(|| "values of 0 are drawn at the left edge".to_string()),
            },
        });
    }
    // file_safe maps two labels to one stem ("r.1" and "r_1"): a later figure of that name
    // gets "-2" and on, so that its PNG does not replace the other's
    let mut seen = std::collections::HashSet::new();
    for f in &mut out {
        let mut name = f.name.clone();
        let mut n = 1;
        while !seen.insert(name.clone()) {
            n += 1;
            name = format!("{}-{n}", f.name);
        }
        f.name = name;
    }
    out
}

/// The stems of the figures a report may have whatever its inputs, beside the per-replay
/// `rel_error_*` ones: an output checked against these before the comparison's work.
pub(crate) const FIXED_NAMES: [&str; 6] = [
    "response_time_cdf",
    "population_min_rtt",
    "population_bandwidth",
    "population_loss",
    "population_response_delay",
    "population_query_delay",
];

pub(crate) fn population_values<'a>(i: &'a crate::input::Input, key: &str) -> &'a [f64] {
    match key {
        "min_rtt_us" => &i.min_rtt_us.values,
        "bw_bps" => &i.bw_bps.values,
        "loss_rate_down" => &i.loss_rate_down.values,
        "response_delay_us" => &i.response_delay_us.values,
        "query_delay_us" => &i.query_delay_us.values,
        _ => &[],
    }
}

fn error_series(all: &[f64], b: &Breakdown) -> Vec<Series> {
    let mut v = vec![Series {
        label: format!("all connections (n={})", all.len()),
        points: cdf_points(all),
        color: BASE_COLOR.into(),
        width: 2.8,
        dash: None,
    }];
    for (i, c) in b.classes.iter().enumerate() {
        v.push(Series {
            label: format!("{} (n={})", c.label, c.n),
            points: cdf_points(&c.errors),
            color: if c.label == "unknown" {
                "#888888".into()
            } else {
                PALETTE[i % PALETTE.len()].into()
            },
            width: 1.8,
            dash: (c.label == "unknown").then_some("5 3"),
        });
    }
    v
}
