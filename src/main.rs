//! `mimic`: a thin CLI over the mimic crates. `main` only parses and dispatches; each
//! subcommand lives in `cmd/`. Exit codes: 0 success, 1 a condition the user asked about
//! held (e.g. `compare --fail-if`), 2 an error.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd;
mod progress;

// Analysis allocates and frees many small per-connection buffers on several threads:
// mimalloc, through its plain entry points where the alignment allows (`alloc.rs` says why).
#[global_allocator]
static GLOBAL: mimic_analyze::alloc::Allocator = mimic_analyze::alloc::Allocator;

#[derive(Parser)]
#[command(
    name = "mimic",
    version,
    about = "Capture, distil and replay TCP workloads to predict what a TCP stack change does to response times"
)]
struct Cli {
    /// More log output (repeat for more); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    /// No progress bars and only errors on stderr.
    #[arg(short, long, global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Capture traffic at a tap (DPDK, libpcap or a file) into sampled, anonymized pcapng.
    Capture(cmd::capture::Args),
    /// Analyze trace files into a per-connection database (flows.db).
    Analyze(cmd::analyze::Args),
    /// Merge the shard databases of one analysis (`analyze --shard K/N`) into one flows.db.
    Merge(cmd::merge::Args),
    /// Build, inspect or tear down the three-namespace replay lab.
    Lab(cmd::lab::Args),
    /// Run the per-flow network emulator, or render its pipes for tc/netem or ipfw/dummynet.
    Netemu(cmd::netemu::Args),
    /// Replay a flows.db workload through per-flow pipes against a server emulator.
    Replay(cmd::replay::Args),
    /// Run the server emulator alone (for a server host whose kernel you changed).
    Serve(cmd::serve::Args),
    /// Run a client agent: opens its share of a replay's connections (`replay --agents`).
    Agent(cmd::agent::Args),
    /// Make the certificates and keys of the roles' control channel.
    Pki(cmd::pki::Args),
    /// Generate a synthetic workload with known per-connection truth.
    Synth(cmd::synth::Args),
    /// Compare response-time distributions of databases and write the report.
    Compare(cmd::compare::Args),
    /// Write a per-connection summary of a database as text, CSV, JSON lines or a Zeek
    /// conn.log, or every table as Parquet.
    Export(cmd::export::Args),
    /// Run the whole pipeline on the built-in lab and print the verdict.
    Demo(cmd::demo::Args),
}

fn main() -> ExitCode {
    // A closed pipe (`mimic ... | head`) ends the process quietly, as for any Unix filter.
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    init_logging(cli.verbose, cli.quiet);
    progress::set_quiet(cli.quiet);
    let result = match cli.command {
        Command::Capture(a) => cmd::capture::run(a),
        Command::Analyze(a) => cmd::analyze::run(a),
        Command::Merge(a) => cmd::merge::run(a),
        Command::Lab(a) => cmd::lab::run(a),
        Command::Netemu(a) => cmd::netemu::run(a),
        Command::Replay(a) => cmd::replay::run(a),
        Command::Serve(a) => cmd::serve::run(a),
        Command::Agent(a) => cmd::agent::run(a),
        Command::Pki(a) => cmd::pki::run(a),
        Command::Synth(a) => cmd::synth::run(a),
        Command::Compare(a) => cmd::compare::run(a),
        Command::Export(a) => cmd::export::run(a),
        Command::Demo(a) => cmd::demo::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("mimic: error: {}", error_line(&e));
            ExitCode::from(2)
        }
    }
}

/// The error and its causes on one line, as `{:#}` prints them, but without a cause whose text
/// the line already ends with (errors such as `{path}: {source}` show their source themselves).
fn error_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.is_empty() {
            line = text;
        } else if !line.ends_with(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
    }
    line
}

fn init_logging(verbose: u8, quiet: bool) {
    use tracing_subscriber::EnvFilter;
    let default = match (quiet, verbose) {
        (true, _) => "error",
        (false, 0) => "warn",
        (false, 1) => "info",
        (false, 2) => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    // colours only for a terminal: a log file or a pipe gets plain text
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_target(false)
        .init();
}
