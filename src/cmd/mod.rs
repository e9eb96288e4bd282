//! One module per subcommand: its flags (defined once, with help) and a `run` that validates
//! them before touching the system and returns the process exit code.

pub mod agent;
pub mod analyze;
pub mod capture;
pub mod compare;
pub mod demo;
pub mod export;
pub mod lab;
pub mod merge;
pub mod netemu;
pub mod pki;
pub mod replay;
pub mod serve;
pub mod synth;

/// Value parser for rates, time scales and intervals: a positive, finite number (`inf` and
/// `NaN` parse as f64 too, and would start everything at once or schedule it never).
pub(crate) fn positive_number(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err("must be a positive, finite number".into()),
    }
}

/// Value parser for an output that must be a file (a database, a Parquet directory, an HTML
/// report): `-` is refused rather than written as a file named `-` (where `-` means standard
/// output elsewhere, as in `--json -`).
pub(crate) fn file_output(s: &str) -> Result<std::path::PathBuf, String> {
    match s {
        "" => Err("give a file name".into()),
        "-" => Err("this output cannot go to standard output (`-`): give a file name".into()),
        _ => Ok(s.into()),
    }
}

/// Value parser for a replayed connection's client (source) address: one a host can hold and
/// a TCP connection can come from, not 0.0.0.0 (any address), a broadcast or a multicast one.
pub(crate) fn client_addr(s: &str) -> Result<std::net::Ipv4Addr, String> {
    let a: std::net::Ipv4Addr = s
        .parse()
        .map_err(|_| format!("`{s}` is not an IPv4 address (e.g. 198.19.0.1)"))?;
    match mimic_replay::spec::unusable_source(a) {
        None => Ok(a),
        Some(why) => Err(format!(
            "{a} is {why}: no TCP connection comes from it; give an address a client host can hold"
        )),
    }
}

/// Value parser for a TCP server port: 1-65535 (port 0 is no port a connection can use: a
/// server would listen on whatever port the kernel picks, a filter on it match nothing).
pub(crate) fn server_port(s: &str) -> Result<u16, String> {
    match s.parse::<u16>() {
        Ok(0) => Err("port 0 is no port a connection can use: give 1-65535".into()),
        Ok(p) => Ok(p),
        Err(_) => Err(format!("`{s}` is not a port number (1-65535)")),
    }
}

/// Value parser for the address of a server that clients connect to (`IP:PORT`, port not 0).
pub(crate) fn server_addr(s: &str) -> Result<std::net::SocketAddr, String> {
    let a: std::net::SocketAddr = s
        .parse()
        .map_err(|_| format!("`{s}` is not IP:PORT (e.g. 198.18.0.1:80)"))?;
    if a.port() == 0 {
        return Err("port 0 is no port a client can connect to: give 1-65535".into());
    }
    Ok(a)
}

/// Value parser for a control-channel address (`tcp:HOST:PORT` or `unix:PATH`).
pub(crate) fn parse_control(s: &str) -> Result<mimic_netemu::control::ControlAddr, String> {
    s.parse()
}

/// `--timer-cpus LIST` of the roles with a timer thread (serve, agent), checked.
pub(crate) fn timer_cpus(list: Option<&str>) -> anyhow::Result<Option<Vec<usize>>> {
    list.map(mimic_core::cpu::parse_list)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--timer-cpus: {e}"))
}

/// Keeps the process's timer thread on `cpus` (`--timer-cpus`).
pub(crate) fn pin_timer_thread(cpus: &[usize]) -> anyhow::Result<()> {
    use anyhow::Context;
    mimic_replay::hrtimer::HrTimer::global()
        .pin(cpus)
        .with_context(|| {
            format!(
                "keeping the timer thread on CPUs {}",
                mimic_core::cpu::format_list(cpus)
            )
        })
}

/// Parses `mimic ARGS…` with the binary's own clap parser, as a started role would; for the
/// tests that turn each role's spec into its command line and back.
#[cfg(test)]
pub(crate) fn parse_role_args(args: Vec<std::ffi::OsString>) -> crate::Command {
    use clap::Parser;
    let line = args
        .iter()
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    match crate::Cli::try_parse_from(std::iter::once("mimic".into()).chain(args)) {
        Ok(cli) => cli.command,
        Err(e) => panic!("`mimic {line}` does not parse: {e}"),
    }
}

/// The control channel a bound listener serves, as the user can reach it: `tcp:HOST:0` asks the
/// kernel for a port, and the line a role prints on start must say which one it got.
pub(crate) fn bound_control(
    listener: &mimic_control::Listener,
    asked: &mimic_control::ControlAddr,
) -> String {
    listener
        .local_addr()
        .map_or_else(|_| asked.to_string(), |a| a.to_string())
}
