//! `mimic compare` (being built; see the open issue for its specification).

use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`mimic compare` is not available in this build yet")
}
