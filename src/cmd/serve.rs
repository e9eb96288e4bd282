//! `mimic serve --listen ADDR`: the server emulator alone, for a server host whose kernel you
//! changed. Requests carry a preamble saying what to answer; `--control` opens the
//! authenticated, encrypted control channel `mimic replay --server-control` talks to, and the
//! replay port then serves only the client ranges the controller announces there. The flags map
//! to the role's spec ([`Args::into_spec`] → [`ServeSpec`]), which owns its command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use mimic_netemu::classify::IpNet;
use mimic_replay::control::{self, ControlAddr, Listener, RoleTls};
use mimic_replay::serve_capture::CaptureService;
use mimic_replay::server::{self, AllowList, Stats};
use mimic_replay::spec::ServeSpec;

use super::parse_control;

#[derive(clap::Args)]
pub struct Args {
    /// Address and port to serve replayed connections on, e.g. 198.18.1.1:80.
    #[arg(long, value_name = "ADDR")]
    pub listen: SocketAddr,
    /// Control channel: unix:PATH or tcp:HOST:PORT (needs --pki). With it, the replay port
    /// refuses every client until the controller announces the client address ranges.
    #[arg(long, value_name = "ADDR", value_parser = parse_control, requires = "pki")]
    pub control: Option<ControlAddr>,
    /// Directory with this role's control-channel files from `mimic pki init`: ca.crt,
    /// serve.crt, serve.key (mode 0600). For the control channel: needs --control.
    #[arg(long, value_name = "DIR", requires = "control")]
    pub pki: Option<PathBuf>,
    /// Serve replay connections only from this client range, e.g. 198.19.0.0/19
    /// (repeatable; a controller's announcement replaces the list). Without --allow and
    /// without --control, the replay port serves anyone.
    #[arg(long, value_name = "CIDR")]
    pub allow: Vec<IpNet>,
    /// Keep the timer thread (which keeps the response and query delays) on these CPUs,
    /// e.g. `0` or `0,2-3`: off the CPU of a real-time network emulator on the same machine.
    #[arg(long, value_name = "LIST")]
    pub timer_cpus: Option<String>,
    /// Print the statistics at exit as JSON.
    #[arg(long)]
    pub json: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics, e.g. 127.0.0.1:9466.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,
    /// Interface on which a controller's replay is captured at this host (`mimic replay
    /// --vantage server`, the default; needs --control and CAP_NET_RAW). Default: the
    /// interface that holds the --listen address.
    #[arg(long, value_name = "IF", requires = "control")]
    pub capture_iface: Option<String>,
    /// Directory for those captures until the controller has fetched them (default: a
    /// directory of this process under $TMPDIR or /tmp, removed at exit).
    #[arg(long, value_name = "DIR", requires = "control")]
    pub capture_dir: Option<PathBuf>,
}

impl Args {
    /// The server emulator these flags describe (checked; nothing is touched).
    pub fn into_spec(self) -> anyhow::Result<ServeSpec> {
        let timer_cpus = super::timer_cpus(self.timer_cpus.as_deref())?;
        let spec = ServeSpec {
            listen: self.listen,
            control: self.control,
            pki: self.pki,
            allow: self.allow,
            timer_cpus,
            json: self.json,
            metrics: self.metrics,
            capture_iface: self.capture_iface,
            capture_dir: self.capture_dir,
        };
        spec.validate().map_err(anyhow::Error::msg)?;
        Ok(spec)
    }
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    run_spec(a.into_spec()?)
}

/// Runs the server emulator `a` describes until SIGINT, SIGTERM or a control `shutdown`.
pub fn run_spec(a: ServeSpec) -> anyhow::Result<ExitCode> {
    // everything that can be wrong with the flags or the files, before serving
    let tls = match &a.pki {
        Some(dir) => Some(RoleTls::load(dir, control::ROLE)?),
        None => None,
    };
    let allow = if !a.allow.is_empty() || a.control.is_some() {
        AllowList::only(a.allow.clone())
    } else {
        AllowList::anyone()
    };
    let ctl_listener = match &a.control {
        Some(addr) => {
            Some(Listener::bind(addr).with_context(|| format!("binding control channel {addr}"))?)
        }
        None => None,
    };
    if let Some(cpus) = &a.timer_cpus {
        super::pin_timer_thread(cpus)?;
    }
    // the replay's capture at this host, started and fetched over the control channel
    let capture = match &a.control {
        Some(_) => Some(std::sync::Arc::new(
            CaptureService::new(a.listen, a.capture_iface.clone(), a.capture_dir.clone())
                .context("the capture service")?,
        )),
        None => None,
    };
    let metrics = a.metrics.map(mimic_metrics::bind).transpose()?;
    let stats = Stats::default();
    if let Some(m) = metrics {
        let s = stats.clone();
        let at = m.serve(mimic_metrics::registry_with(move |f| {
            serve_metrics(&s.totals(), f)
        }))?;
        if !crate::progress::quiet() {
            eprintln!("mimic serve: metrics at http://{at}/metrics");
        }
    }
    let totals = stats.clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let stats = rt.block_on(async move {
        let listener =
            server::bind(a.listen).with_context(|| format!("listening on {}", a.listen))?;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        // the control channel as bound (said below, once the signals are handled)
        let ctl_at = ctl_listener
            .as_ref()
            .zip(a.control.as_ref())
            .map(|(l, addr)| super::bound_control(l, addr));
        let ctl = match (ctl_listener, tls) {
            (Some(l), Some(tls)) => Some(
                control::spawn(
                    l,
                    tls,
                    stats.clone(),
                    allow.clone(),
                    capture.clone(),
                    stop_tx.clone(),
                )
                .context("starting the control channel")?,
            ),
            _ => None,
        };
        let tx = stop_tx.clone();
        // registered here, before serving: a SIGTERM right after start stops cleanly too
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).context("installing a SIGTERM handler")?;
        let mut int = signal(SignalKind::interrupt()).context("installing a SIGINT handler")?;
        tokio::spawn(async move {
            tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
            let _ = tx.send(true);
        });
        if !crate::progress::quiet() {
            // the bound addresses (a port 0 asks the kernel for one, which the user must
            // learn), said once a SIGTERM right after the line stops cleanly
            let at = listener
                .local_addr()
                .map_or_else(|_| a.listen.to_string(), |l| l.to_string());
            match &ctl_at {
                Some(c) => eprintln!(
                    "mimic serve: serving replayed connections on {at}; control channel on {c}"
                ),
                None => eprintln!("mimic serve: serving replayed connections on {at}"),
            }
        }
        let fin = server::serve_allowed(listener, stats, allow, stop_rx).await;
        if let Some(c) = ctl {
            c.stop();
        }
        anyhow::Ok(fin)
    })?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&stats)?);
    } else if !crate::progress::quiet() {
        eprintln!(
            "served {} connections, {} exchanges; response delay kept to p50 {} µs / p99 {} µs late; {} bad preambles, {} client resets between exchanges, {} I/O errors; {} connections refused (client outside the allowed ranges)",
            stats.connections, stats.exchanges, stats.response_delay_error.p50_us, stats.response_delay_error.p99_us, stats.bad_preamble, stats.client_resets, stats.io_errors, stats.refused
        );
        let t = totals.totals();
        if t.connections != stats.connections || t.exchanges != stats.exchanges {
            eprintln!(
                "since start (the figures above count from the last reset by the control channel): {} connections, {} exchanges, {} bad preambles, {} I/O errors",
                t.connections, t.exchanges, t.bad_preamble, t.io_errors
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The `/metrics` families of `mimic serve`, from the counters its exit summary prints
/// (counted since the start: a reset by the control channel does not set them back).
fn serve_metrics(s: &server::ServerStats, f: &mut mimic_metrics::Families) {
    use mimic_metrics::Unit;
    f.counter(
        "mimic_serve_connections",
        "Connections accepted.",
        None,
        s.connections,
    );
    f.gauge(
        "mimic_serve_active_connections",
        "Connections open now.",
        None,
        s.active,
    );
    f.counter(
        "mimic_serve_requests",
        "Requests answered (request/response exchanges completed).",
        None,
        s.exchanges,
    );
    f.counter(
        "mimic_serve_request",
        "Request bytes of the answered exchanges (preambles included).",
        Some(Unit::Bytes),
        s.bytes_in,
    );
    f.counter(
        "mimic_serve_response",
        "Response bytes written.",
        Some(Unit::Bytes),
        s.bytes_out,
    );
    f.counter_by(
        "mimic_serve_connection_errors",
        "Connections that ended abnormally, by cause (bad_preamble: a request without a valid preamble; io: an I/O error; early_close: the client closed inside an exchange; client_reset: the client reset between exchanges, how a recorded RST close ends).",
        None,
        "cause",
        &[
            ("bad_preamble", s.bad_preamble),
            ("io", s.io_errors),
            ("early_close", s.early_close),
            ("client_reset", s.client_resets),
        ],
    );
    f.counter(
        "mimic_serve_refused_connections",
        "Connections refused (reset at once) because the client's address is outside the ranges the controller announced or --allow gave.",
        None,
        s.refused,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(spec: &ServeSpec) -> ServeSpec {
        match crate::cmd::parse_role_args(spec.to_args()) {
            crate::Command::Serve(a) => a.into_spec().unwrap(),
            _ => panic!("{:?} is not `mimic serve`", spec.to_args()),
        }
    }

    /// The spec's command line, parsed by the real parser and mapped back, is the spec.
    #[test]
    fn spec_survives_its_command_line() {
        let every_field = ServeSpec {
            listen: "198.18.0.1:8080".parse().unwrap(),
            control: Some("tcp:10.9.0.1:7001".parse().unwrap()),
            pki: Some("/etc/mimic/pki".into()),
            allow: vec![
                "198.19.0.0/19".parse().unwrap(),
                "10.1.0.7".parse().unwrap(),
            ],
            timer_cpus: Some(vec![0, 2, 3]),
            json: true,
            metrics: Some("127.0.0.1:9466".parse().unwrap()),
            capture_iface: Some("eth1".into()),
            capture_dir: Some("/var/lib/mimic/captures".into()),
        };
        assert_eq!(round_trip(&every_field), every_field);
        let defaults = ServeSpec::new("[::1]:80".parse().unwrap());
        assert_eq!(round_trip(&defaults), defaults);
    }
}
