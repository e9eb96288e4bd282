//! `mimic compare BASE.db OTHER.db...`: response-time distributions against BASE, with
//! confidence intervals, the KS test, per-connection error of replays, and a verdict; HTML,
//! PNG and JSON outputs; `--fail-if` as a rollout gate (exit 1 when the condition holds).

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
A condition that cannot be judged is an error: a relative threshold where BASE's statistic is 0,
or, with --confidence, fewer than 10 connections a side (pairs, where paired).
Exit status: 0 no condition held, 1 a --fail-if condition held, 2 error (a condition that could
not be judged, where none held, included).")]
pub struct Args {
    /// The reference database: an analyzed capture (role original) or a replay. (A synth
    /// workload has no response times until replayed: compare its replays, or score one
    /// against it with `mimic synth check`.)
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

/// What a path names, for telling two outputs (or an output and an input) of one file apart
/// however they are spelt: its directory canonicalized (the nearest one that exists, the rest
/// as given) and its file name. `./r.html` and `r.html`, `d/../r.html` and `r.html` match.
fn identity(path: &Path) -> PathBuf {
    if let Ok(p) = path.canonicalize() {
        // an existing file, through links too: an output linked to an input is that input
        return p;
    }
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => {
            let parent = if parent.as_os_str().is_empty() {
                Path::new(".")
            } else {
                parent
            };
            identity(parent).join(name)
        }
        _ => std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()),
    }
}

/// An output file as the checks name it.
#[derive(Clone)]
struct OutFile {
    /// How the command line gave it: `--html r.html`, `--png plots: plots/population_loss.png`.
    what: String,
    /// What the flag takes, for the hint of a refusal.
    takes: &'static str,
    path: PathBuf,
    /// Whether its directory must exist now (the PNGs' is made).
    dir_exists: bool,
}

impl OutFile {
    fn file(flag: &str, path: &Path) -> OutFile {
        OutFile {
            what: format!("{flag} {}", path.display()),
            takes: match flag {
                "--html" => "--html takes the name of the file to write",
                _ => "--json takes the name of the file to write",
            },
            path: path.to_path_buf(),
            dir_exists: true,
        }
    }

    fn plots(dir: &Path, names: Vec<String>) -> Vec<OutFile> {
        names
            .into_iter()
            .map(|n| {
                let path = dir.join(n);
                OutFile {
                    what: format!("--png {}: {}", dir.display(), path.display()),
                    takes: "a plot of the report goes there: move it away, or give --png another directory",
                    path,
                    dir_exists: false,
                }
            })
            .collect()
    }
}

/// An output file must not be a directory, one of the inputs, any SQLite database or a
/// capture: `--json base.db` would otherwise replace a database with a report.
fn check_output(o: &OutFile, inputs: &[PathBuf]) -> anyhow::Result<()> {
    let (what, takes) = (&o.what, o.takes);
    if o.dir_exists {
        mimic_core::db::check_output_dir(&o.path).with_context(|| what.clone())?;
    }
    if o.path.is_dir() {
        anyhow::bail!("{what}: is a directory; {takes}");
    }
    if inputs.contains(&identity(&o.path)) {
        anyhow::bail!("{what}: that is one of the input databases; {takes}");
    }
    if let Some(kind) = mimic_core::db::data_file_kind(&o.path) {
        anyhow::bail!(
            "{what}: is {}, not overwriting it; {takes}",
            kind.describe()
        );
    }
    Ok(())
}

/// Checks every output file, and that no two name the same file: the one written last would
/// silently replace the other.
fn check_outputs(outputs: &[OutFile], inputs: &[PathBuf]) -> anyhow::Result<()> {
    let mut seen: Vec<(PathBuf, &OutFile)> = Vec::new();
    for o in outputs {
        check_output(o, inputs)?;
        let id = identity(&o.path);
        if let Some((_, first)) = seen.iter().find(|(i, _)| *i == id) {
            anyhow::bail!(
                "{} and {} name the same file: give each output a file of its own",
                first.what,
                o.what
            );
        }
        seen.push((id, o));
    }
    Ok(())
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    // an interruption removes the outputs rendered so far (the signal alone would leave them
    // hidden beside their names)
    mimic_core::interrupt::remove_temps_on_interrupt("compare")
        .context("installing SIGINT/SIGTERM handlers")?;
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
    // Every output is checked before any database is read, and written all or nothing after.
    if let Some(dir) = &args.png {
        if dir.exists() && !dir.is_dir() {
            anyhow::bail!("--png {}: exists and is not a directory", dir.display());
        }
    }
    let inputs: Vec<PathBuf> = std::iter::once(&args.base)
        .chain(&args.others)
        .map(|p| identity(p))
        .collect();
    let json_on_stdout = args.json.as_deref().is_some_and(|p| p.as_os_str() == "-");
    let mut files = Vec::new();
    if let Some(p) = &args.html {
        files.push(OutFile::file("--html", p));
    }
    if let Some(p) = args.json.as_ref().filter(|_| !json_on_stdout) {
        files.push(OutFile::file("--json", p));
    }
    let plots = |names: Vec<String>| match &args.png {
        Some(dir) => OutFile::plots(dir, names),
        None => Vec::new(),
    };
    check_outputs(
        &[files.clone(), plots(Report::fixed_png_names())].concat(),
        &inputs,
    )?;

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
    // the PNGs' names hang on the inputs (one set per replay of BASE): checked again, all
    // of them, before anything is rendered
    let pngs = plots(report.png_names());
    let n_pngs = pngs.len();
    check_outputs(&[files, pngs].concat(), &inputs)?;
    let outcomes: Vec<_> = gates.iter().map(|g| g.evaluate(&report)).collect();

    // Every output rendered into a temporary file first, then all put in place together.
    let mut out = mimic_compare::Outputs::new();
    if let Some(path) = &args.html {
        out.add(path, report.to_html().as_bytes())
            .context("writing the HTML report")?;
    }
    if let Some(dir) = &args.png {
        report
            .stage_pngs(&mut out, dir)
            .context("writing the PNG plots")?;
    }
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
                        "undecided": FailIf::undecided(o),
                        "outcomes": o,
                    })
                })
                .collect::<Vec<_>>(),
        );
        let mut s = serde_json::to_string_pretty(&v)?;
        s.push('\n');
        if json_on_stdout {
            out.add_stdout(s.into_bytes());
        } else {
            out.add(path, s.as_bytes())
                .context("writing the JSON report")?;
        }
    }
    if !json_on_stdout {
        out.add_stdout(report.to_text().into_bytes());
    }
    out.commit().map_err(|e| match e {
        // names standard output itself
        e @ mimic_compare::CompareError::Stdout(_) => anyhow::Error::from(e),
        e => anyhow::Error::from(e).context("writing the report"),
    })?;
    if let Some(path) = &args.html {
        say(format!("mimic: wrote {}", path.display()));
    }
    if let Some(dir) = &args.png {
        say(format!(
            "mimic: wrote {n_pngs} plots into {}",
            dir.display()
        ));
    }
    if let Some(path) = args.json.as_ref().filter(|_| !json_on_stdout) {
        say(format!("mimic: wrote {}", path.display()));
    }
    if json_on_stdout {
        // stdout is the JSON; the verdict still reaches a person on stderr.
        for line in report.verdict().lines() {
            say(format!("verdict: {line}"));
        }
    }

    let mut held = false;
    let mut undecided = false;
    for (gate, outcomes) in gates.iter().zip(&outcomes) {
        for o in outcomes {
            if o.undecided.is_some() {
                undecided = true;
                eprintln!(
                    "mimic: error: --fail-if {} cannot be judged for {}: {}",
                    gate.describe(),
                    o.other,
                    o.explanation
                );
            } else if o.holds {
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
    // a condition that held is the answer; one that could not be judged is none
    Ok(if held {
        ExitCode::from(1)
    } else if undecided {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// The help's "fewer than 10 connections" is the library's limit.
    #[test]
    fn the_help_names_the_interval_limit() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: super::Args,
        }
        let help = Cli::command().render_long_help().to_string();
        let want = format!(
            "fewer than {} connections a side",
            mimic_compare::MIN_INTERVAL_CONNECTIONS
        );
        assert!(help.contains(&want), "{help}");
    }
}
