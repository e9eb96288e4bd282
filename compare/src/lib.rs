//! mimic-compare: response-time distributions of mimic databases compared — percentiles with
//! bootstrap confidence intervals, the two-sample Kolmogorov–Smirnov test, per-connection
//! relative error of a replay (Monkey §5.1, Figures 6–8), the population being replayed — and
//! the report an operator reads before a rollout: a verdict line, a self-contained HTML file,
//! PNG plots, JSON, and a `--fail-if` gate.
//!
//! ```no_run
//! use std::path::{Path, PathBuf};
//! use mimic_compare::{FailIf, Options, Report};
//! let report = Report::build(Path::new("original.db"), &[PathBuf::from("replay.db")], &Options::default())?;
//! println!("{}", report.verdict());
//! report.write_html(Path::new("report.html"))?;
//! let gate = FailIf::parse("p90 > +5%")?;
//! let outcomes = gate.evaluate(&report);
//! if outcomes.iter().any(|o| o.holds) { std::process::exit(1) }
//! // a relative threshold against a BASE statistic of 0 says nothing either way
//! if FailIf::undecided(&outcomes) { std::process::exit(2) }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::path::{Path, PathBuf};

pub mod ab;
mod failif;
pub mod fmt;
mod html;
mod input;
mod outputs;
mod plots;
mod png;
mod report;
pub mod stats;
mod svg;
#[cfg(test)]
mod tests;
mod text;

pub use failif::{FailIf, FailIfError, Op, Outcome, Stat, Threshold, MIN_INTERVAL_CONNECTIONS};
pub use outputs::Outputs;
pub use report::{
    Breakdown, Comparison, Direction, Distribution, ErrorStats, Excluded, InputSummary, Options,
    Paired, PopulationMetric, Report, StatDiff, Unpaired, ERROR_BANDS,
};
pub use stats::{KsMethod, KsTest};

#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    /// Not found, not SQLite, not a mimic database, another schema version.
    #[error(transparent)]
    Db(#[from] mimic_core::db::DbError),
    #[error("{path}: {source}")]
    Query {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("{}: empty input: {}", path.display(), if *connections == 0 { "the database has no connections".to_string() } else { format!("none of its {connections} connections has a response time (connections.response_time_us is NULL, below zero or implausible for all), nothing to compare") })]
    Empty { path: PathBuf, connections: u64 },
    /// A synth workload: its response times are what a replay of it measures.
    #[error("{}: a synth workload (meta role = synth) has no response times to compare, only what a replay of it measures: compare its replays (`mimic replay {} -o replay.db`, then `mimic compare replay.db OTHER-REPLAY.db`), or score a replay against it with `mimic synth check {} replay.db`", path.display(), path.display(), path.display())]
    Synth { path: PathBuf },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Writing standard output failed (`--json -` into a full disk).
    #[error("standard output: writing: {0}")]
    Stdout(std::io::Error),
    #[error("PNG output: {0}")]
    Png(String),
    #[error("{0}")]
    Options(String),
}

impl Report {
    /// The self-contained HTML report as a string.
    pub fn to_html(&self) -> String {
        html::render(self)
    }

    /// Writes the HTML report to `path` atomically.
    pub fn write_html(&self, path: &Path) -> Result<(), CompareError> {
        mimic_core::db::write_atomic(path, self.to_html().as_bytes()).map_err(|source| {
            CompareError::Io {
                path: path.to_path_buf(),
                source,
            }
        })
    }

    /// Writes every figure of the report as `DIR/<name>.png` (creating DIR) and returns the
    /// paths: `response_time_cdf`, `rel_error_<other>_by_{response_time,bandwidth,min_rtt}`
    /// for each replay of BASE, `population_{min_rtt,bandwidth,loss,response_delay,query_delay}`.
    /// All or nothing: each file replaced atomically, and none if any one fails.
    pub fn write_pngs(&self, dir: &Path) -> Result<Vec<PathBuf>, CompareError> {
        let mut out = Outputs::new();
        self.stage_pngs(&mut out, dir)?;
        out.commit()
    }

    /// The file names [`Report::write_pngs`] writes into its directory.
    pub fn png_names(&self) -> Vec<String> {
        plots::figures(self)
            .into_iter()
            .map(|f| format!("{}.png", f.name))
            .collect()
    }

    /// The PNG file names a report may have whatever its inputs (the per-replay
    /// `rel_error_*` ones come on top): what an output can be checked against before
    /// [`Report::build`].
    pub fn fixed_png_names() -> Vec<String> {
        plots::FIXED_NAMES
            .iter()
            .map(|n| format!("{n}.png"))
            .collect()
    }

    /// Renders every figure as `DIR/<name>.png` into `out` (creating DIR), for
    /// [`Outputs::commit`] to put in place with the run's other outputs.
    pub fn stage_pngs(&self, out: &mut Outputs, dir: &Path) -> Result<(), CompareError> {
        let figures: Vec<(String, String)> = plots::figures(self)
            .into_iter()
            .map(|f| (f.name, f.chart.to_svg()))
            .collect();
        // every PNG rendered before the first file is touched
        let files = png::render_all(&figures)?;
        if dir.exists() && !dir.is_dir() {
            return Err(CompareError::Io {
                path: dir.to_path_buf(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotADirectory,
                    "exists and is not a directory",
                ),
            });
        }
        out.create_dir(dir)?;
        for (name, bytes) in files {
            out.add(&dir.join(name), &bytes)?;
        }
        Ok(())
    }

    /// Writes the JSON (pretty-printed, newline-terminated) to `path` atomically.
    pub fn write_json(&self, path: &Path) -> Result<(), CompareError> {
        let mut s = serde_json::to_string_pretty(&self.to_json()).expect("a report serialises");
        s.push('\n');
        mimic_core::db::write_atomic(path, s.as_bytes()).map_err(|source| CompareError::Io {
            path: path.to_path_buf(),
            source,
        })
    }
}
