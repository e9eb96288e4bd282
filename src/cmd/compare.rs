//! `mimic compare BASE.db OTHER.db...`: response-time distributions against BASE, with
//! confidence intervals, the KS test, per-connection error of replays, and a verdict; HTML,
//! PNG and JSON outputs; `--fail-if` as a rollout gate (exit 1 when the condition holds).

use std::io::Write;
use std::path::PathBuf;
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
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Write every plot of the report as a PNG file into DIR (created if missing).
    #[arg(long, value_name = "DIR")]
    pub png: Option<PathBuf>,
    /// Print everything machine-readable as JSON on stdout (`--json`), or write it to FILE
    /// (`--json=FILE`).
    #[arg(long, value_name = "FILE", num_args = 0..=1, require_equals = true, default_missing_value = "-")]
    pub json: Option<PathBuf>,
    /// Exit with status 1 when this condition holds for any OTHER, e.g. "p90 > +5%"; may be
    /// given more than once (any one holding is enough). Grammar below.
    #[arg(long = "fail-if", value_name = "EXPR")]
    pub fail_if: Vec<String>,
    /// Bootstrap resamples per input for the confidence intervals.
    #[arg(long, value_name = "N", default_value_t = Options::default().bootstrap_replicates)]
    pub bootstrap: usize,
    /// Seed of the bootstrap: the same inputs and seed give the same report.
    #[arg(long, value_name = "N", default_value_t = Options::default().seed)]
    pub seed: u64,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    // Validate everything the user typed before reading any database.
    let gates = args
        .fail_if
        .iter()
        .map(|e| FailIf::parse(e))
        .collect::<Result<Vec<_>, _>>()?;
    let options = Options {
        bootstrap_replicates: args.bootstrap,
        seed: args.seed,
        ..Options::default()
    };
    if let Some(dir) = &args.png {
        if dir.exists() && !dir.is_dir() {
            anyhow::bail!("--png {}: exists and is not a directory", dir.display());
        }
    }

    let spinner = progress::spinner("compare");
    spinner.set_message(format!("{} inputs", 1 + args.others.len()));
    let report = Report::build(&args.base, &args.others, &options)?;
    spinner.finish_and_clear();

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
    let json_on_stdout = args.json.as_deref().is_some_and(|p| p.as_os_str() == "-");
    let mut out = std::io::stdout().lock();
    match &args.json {
        Some(_) if json_on_stdout => {
            let mut s = serde_json::to_string_pretty(&report.to_json())?;
            s.push('\n');
            out.write_all(s.as_bytes())?;
        }
        Some(path) => {
            report.write_json(path).context("writing the JSON report")?;
            say(format!("mimic: wrote {}", path.display()));
        }
        None => {}
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
    for gate in &gates {
        for o in gate.evaluate(&report) {
            if o.holds {
                held = true;
                eprintln!(
                    "mimic: --fail-if \"{}\" holds for {}: {}",
                    gate.text, o.other, o.explanation
                );
            } else {
                say(format!(
                    "mimic: --fail-if \"{}\" does not hold for {}: {}",
                    gate.text, o.other, o.explanation
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
