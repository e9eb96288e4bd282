//! `mimic synth --profile web --connections N -o synth.db`: a synthetic workload with known
//! truth; `mimic synth check SYNTH.db REPLAY.db`: how well a replay's analysis recovered it.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use mimic_replay::accuracy;
use mimic_replay::synth::{self, Profile, SynthOptions};

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    check: Option<Check>,
    /// Workload profile (web: search/browsing responses with a header and a query delay).
    #[arg(long, default_value = "web", value_parser = parse_profile)]
    profile: Profile,
    /// Number of connections.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    connections: u32,
    /// New connections per second (Poisson arrivals).
    #[arg(long, default_value_t = 10.0, value_parser = super::positive_number)]
    rate: f64,
    /// Largest response in bytes: lowers each client class's own cap (dial-up 24,000, DSL
    /// 150,000, the others 300,000), never raises it.
    #[arg(long, default_value_t = 300_000)]
    max_response: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The database to write.
    #[arg(short, long, value_name = "FILE", required = false, value_parser = super::file_output)]
    output: Option<PathBuf>,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Subcommand)]
enum Check {
    /// Compare the analysis of a replay with the truth of the workload it replayed (the
    /// analyzer's accuracy harness); exit 1 when a criterion is missed, 2 when nothing could be
    /// scored.
    Check {
        /// The workload that was replayed: a `mimic synth` database (its parameters are what
        /// the emulator and the server were set to), or any database replayed the same way.
        #[arg(value_name = "TRUTH.db")]
        truth: PathBuf,
        /// The replay of TRUTH (`mimic replay TRUTH.db -o REPLAY.db`), paired with it through
        /// its replay_map.
        #[arg(value_name = "REPLAY.db")]
        replay: PathBuf,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

fn parse_profile(s: &str) -> Result<Profile, String> {
    s.parse()
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    // an interruption removes the unfinished output (the signal alone would leave it hidden
    // beside the output)
    mimic_core::interrupt::remove_temps_on_interrupt("synth")
        .context("installing SIGINT/SIGTERM handlers")?;
    if let Some(Check::Check {
        truth,
        replay,
        json,
    }) = a.check
    {
        let r = accuracy::evaluate(&truth, &replay)?;
        if json {
            println!("{}", serde_json::to_string_pretty(&r)?);
        } else {
            print!("{}", r.table());
        }
        return Ok(if r.pass() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }
    let Some(out) = a.output else {
        anyhow::bail!("-o/--output is required (the synthetic workload database to write)");
    };
    // the arrival process takes at least 1e-6/s; below it the rate recorded in `meta` would
    // not be the one the workload was drawn with
    if a.rate < 1e-6 {
        anyhow::bail!(
            "--rate {:?}: must be at least 1e-6 connections per second",
            a.rate
        );
    }
    if a.max_response < 1000 {
        anyhow::bail!("--max-response must be at least 1000 bytes");
    }
    // above the classes' own caps it would change nothing, while meta recorded it as given
    let cap = synth::WEB_CLASSES
        .iter()
        .map(|c| c.max_response)
        .max()
        .unwrap_or(0);
    if a.max_response > cap {
        anyhow::bail!(
            "--max-response {}: the largest response of any client class is {cap} bytes; this option lowers the classes' caps, it cannot raise them",
            a.max_response
        );
    }
    let s = synth::generate(
        &SynthOptions {
            profile: a.profile,
            connections: a.connections as usize,
            rate: a.rate,
            seed: a.seed,
            max_response: a.max_response,
        },
        &out,
    )?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        let classes: Vec<String> = s.by_class.iter().map(|(c, n)| format!("{c} {n}")).collect();
        println!(
            "wrote {}: {} connections, {} exchanges over {:.0} s ({})",
            s.output,
            s.connections,
            s.exchanges,
            s.duration_s,
            classes.join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}
