//! `mimic compare BASE.db OTHER.db...`: response-time distributions against BASE, with
//! confidence intervals, the KS test, per-connection error of replays, and a verdict; HTML,
//! PNG and JSON outputs; `--fail-if` as a rollout gate (exit 1 when the condition holds).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use mimic_compare::{FailIf, Options, Report};

use crate::progress;

#[derive(clap::Args)]
#[command(after_help = "\
--fail-if grammar: STAT OP VALUE, evaluated on the difference OTHER − BASE of every OTHER;
  STAT  pN (percentile 0–100, e.g. p90, p99.9), median, mean
  OP    >  >=  <  <=
  VALUE a signed percent (relative difference, e.g. +5%, -10%) or a time (20ms, 500us, 1.5s)
Examples: --fail-if 'p90 > +5%'   --fail-if 'median >= 10ms'   --fail-if 'mean > 0%'
Without --confidence a condition is judged on the point estimate. With --confidence LEVEL it
holds only when the whole LEVEL% bootstrap interval of the difference lies beyond the threshold
(> and >=: its lower bound; < and <=: its upper bound), so noise alone does not fire it:
  --fail-if 'p90 > +5%' --confidence 95   fails a rollout only when p90 is surely >5% slower
Exit status: 0 no condition held, 1 a --fail-if condition held, 2 error.")]
pub struct Args {
    /// The reference database: an analyzed capture (role original), a synth workload or a replay.
    #[arg(value_name = "BASE.db")]
    pub base: PathBuf,
    /// Databases to compare with BASE: replays of it (paired connection by connection through
    /// their replay_map) or other captures.
    #[arg(value_name = "OTHER.db", required = true)]
    pub others: Vec<PathBuf>,
    /// Write the report as one self-contained HTML file (inline SVG plots, no external fetches).
    #[arg(long, value_name = "FILE", value_parser = super::file_output)]
    pub html: Option<PathBuf>,
    /// Write every plot of the report as a PNG file into DIR (created if missing).
    #[arg(long, value_name = "DIR")]
    pub png: Option<PathBuf>,
    /// Write everything machine-readable as JSON to FILE (`--json report.json`), or to stdout
    /// with `--json -` (the text summary is then left out and the verdict lines go to stderr).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Exit with status 1 when this condition holds for any OTHER, e.g. "p90 > +5%"; may be
    /// given more than once (any one holding is enough). Grammar below.
    #[arg(long = "fail-if", value_name = "EXPR")]
    pub fail_if: Vec<String>,
    /// Judge every --fail-if condition on the bootstrap interval at this confidence level
    /// (percent, e.g. 95 or 99) instead of the point estimate: it holds only when the whole
    /// interval lies beyond the threshold. Also the level of the report's intervals.
    #[arg(long, value_name = "LEVEL", value_parser = parse_confidence)]
    pub confidence: Option<f64>,
    /// Bootstrap resamples per input for the confidence intervals (at most 1,000,000: each
    /// keeps its statistics in memory, and past a few thousand the intervals no longer move).
    #[arg(long, value_name = "N", default_value_t = Options::default().bootstrap_replicates, value_parser = parse_bootstrap)]
    pub bootstrap: usize,
    /// Seed of the bootstrap: the same inputs and seed give the same report.
    #[arg(long, value_name = "N", default_value_t = Options::default().seed)]
    pub seed: u64,
}

/// The most bootstrap resamples `--bootstrap` takes.
const MAX_BOOTSTRAP: usize = 1_000_000;

fn parse_bootstrap(s: &str) -> Result<usize, String> {
    let n: usize = s
        .trim()
        .parse()
        .map_err(|_| format!("\"{s}\" is not a whole number of resamples, e.g. 2000"))?;
    if !(1..=MAX_BOOTSTRAP).contains(&n) {
        return Err(format!(
            "{n} resamples: give 1 to {MAX_BOOTSTRAP} (the default 2000 resolves a 95% interval; each resample is kept in memory)"
        ));
    }
    Ok(n)
}

/// "95", "95%" or "99.9" → 0.95, 0.95, 0.999: a level in percent, above 50 and below 100.
fn parse_confidence(s: &str) -> Result<f64, String> {
    let t = s.trim().trim_end_matches('%').trim();
    let v: f64 = t
        .parse()
        .map_err(|_| format!("\"{s}\" is not a number: give a level in percent, e.g. 95"))?;
    if !(v > 50.0 && v < 100.0) {
        return Err(format!(
            "{s} is not a confidence level: give a percentage above 50 and below 100, e.g. 95 or 99"
        ));
    }
    Ok(v / 100.0)
}

/// An output file must not be one of the inputs, any SQLite database or a capture: `--json
/// base.db` would otherwise replace a database with a report.
fn check_output(flag: &str, path: &Path, inputs: &[&Path]) -> anyhow::Result<()> {
    if path.as_os_str() == "-" {
        return Ok(());
    }
    mimic_core::db::check_output_dir(path).with_context(|| format!("{flag} {}", path.display()))?;
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if inputs.iter().any(|i| same(i, path)) {
        anyhow::bail!(
            "{flag} {}: that is one of the input databases; {flag} takes the name of the file to write",
            path.display()
        );
    }
    if let Some(kind) = mimic_core::db::data_file_kind(path) {
        anyhow::bail!(
            "{flag} {}: is {}, not overwriting it; {flag} takes the name of the file to write",
            path.display(),
            kind.describe()
        );
    }
    Ok(())
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    // Validate everything the user typed before reading any database.
    let gates = args
        .fail_if
        .iter()
        .map(|e| FailIf::parse(e).map(|g| g.with_confidence(args.confidence)))
        .collect::<Result<Vec<_>, _>>()?;
    let options = Options {
        bootstrap_replicates: args.bootstrap,
        seed: args.seed,
        confidence: args.confidence.unwrap_or(Options::default().confidence),
    };
    if let Some(dir) = &args.png {
        if dir.exists() && !dir.is_dir() {
            anyhow::bail!("--png {}: exists and is not a directory", dir.display());
        }
    }
    let inputs: Vec<&Path> = std::iter::once(args.base.as_path())
        .chain(args.others.iter().map(PathBuf::as_path))
        .collect();
    if let Some(p) = &args.json {
        check_output("--json", p, &inputs)?;
    }
    if let Some(p) = &args.html {
        check_output("--html", p, &inputs)?;
    }

    let spinner = progress::spinner("compare");
    spinner.set_message(format!("{} inputs", 1 + args.others.len()));
    let report = Report::build(&args.base, &args.others, &options)?;
    spinner.finish_and_clear();
    // warnings go to stderr unless --quiet (the text report and the JSON carry them too)
    if !progress::quiet() {
        for c in &report.comparisons {
            if let Some(w) = &c.vantage_warning {
                eprintln!("mimic: warning: {w}");
            }
            if let Some(w) = &c.timing_warning {
                eprintln!("mimic: warning: {w}");
            }
        }
    }

    let say = |line: String| {
        if !progress::quiet() {
            eprintln!("{line}");
        }
    };
    if let Some(path) = &args.html {
        report.write_html(path).context("writing the HTML report")?;
        say(format!("mimic: wrote {}", path.display()));
    }
    if let Some(dir) = &args.png {
        let files = report.write_pngs(dir).context("writing the PNG plots")?;
        say(format!(
            "mimic: wrote {} plots into {}",
            files.len(),
            dir.display()
        ));
    }
    let outcomes: Vec<_> = gates.iter().map(|g| g.evaluate(&report)).collect();
    let json_on_stdout = args.json.as_deref().is_some_and(|p| p.as_os_str() == "-");
    let mut out = std::io::stdout().lock();
    if let Some(path) = &args.json {
        // The report, plus how each --fail-if condition came out, for a CI job to keep.
        let mut v = report.to_json();
        v["fail_if"] = serde_json::Value::from(
            gates
                .iter()
                .zip(&outcomes)
                .map(|(g, o)| {
                    serde_json::json!({
                        "condition": g,
                        "holds": o.iter().any(|o| o.holds),
                        "outcomes": o,
                    })
                })
                .collect::<Vec<_>>(),
        );
        let mut s = serde_json::to_string_pretty(&v)?;
        s.push('\n');
        if json_on_stdout {
            out.write_all(s.as_bytes())?;
        } else {
            mimic_core::db::write_atomic(path, s.as_bytes())
                .with_context(|| format!("writing the JSON report {}", path.display()))?;
            say(format!("mimic: wrote {}", path.display()));
        }
    }
    if !json_on_stdout {
        out.write_all(report.to_text().as_bytes())?;
    } else {
        // stdout is the JSON; the verdict still reaches a person on stderr.
        for line in report.verdict().lines() {
            say(format!("verdict: {line}"));
        }
    }
    out.flush()?;

    let mut held = false;
    for (gate, outcomes) in gates.iter().zip(&outcomes) {
        for o in outcomes {
            if o.holds {
                held = true;
                eprintln!(
                    "mimic: --fail-if {} holds for {}: {}",
                    gate.describe(),
                    o.other,
                    o.explanation
                );
            } else {
                say(format!(
                    "mimic: --fail-if {} does not hold for {}: {}",
                    gate.describe(),
                    o.other,
                    o.explanation
                ));
            }
        }
    }
    Ok(if held {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
