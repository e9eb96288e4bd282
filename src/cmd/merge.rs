//! `mimic merge SHARD.db... -o flows.db`: the shards of one analysis (`analyze --shard K/N`)
//! joined into the database one unsharded run writes.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use mimic_analyze::merge::{self, MergeOptions};

#[derive(clap::Args)]
pub struct Args {
    /// The databases of all N shards of one run (`mimic analyze --shard K/N`), in any order.
    #[arg(required = true, value_name = "SHARD_DB")]
    pub inputs: Vec<PathBuf>,
    /// The database to write (replaced atomically when the merge succeeds).
    #[arg(short, long, value_name = "FILE", value_parser = super::file_output)]
    pub output: PathBuf,
    /// Print the summary as JSON on stdout instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    // an interruption removes the unfinished output (the signal alone would leave it hidden
    // beside the output)
    mimic_core::interrupt::remove_temps_on_interrupt("merge")
        .context("installing SIGINT/SIGTERM handlers")?;
    let cmdline: Vec<String> = std::env::args().collect();
    let s = merge::merge(&MergeOptions {
        inputs: a.inputs.clone(),
        output: a.output.clone(),
        meta: vec![("command".into(), cmdline.join(" "))],
    })
    .with_context(|| format!("merge into {} failed", a.output.display()))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        let rows: Vec<String> = s.rows.iter().map(|(t, n)| format!("{t} {n}")).collect();
        println!(
            "merged {} shards in {:.2} s: {}",
            s.shards,
            s.elapsed_s,
            rows.join(", ")
        );
        println!("wrote {}", s.output);
    }
    Ok(ExitCode::SUCCESS)
}
