//! `mimic demo`: the main job on the built-in lab, end to end.
//!
//! lab up → synthesize a "production" workload → replay it under the current stack while
//! capturing (this is production) → analyze the capture → replay that analysis under the
//! current stack and under a changed one → compare → print where the report is and the verdict.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use mimic_netemu::lab;
use mimic_netemu::stack::StackProfile;
use mimic_replay::orchestrate::{ReplayError, ReplayOptions, Target};
use mimic_replay::synth::{self, SynthOptions};
use mimic_replay::workload::Select;

#[derive(clap::Args)]
pub struct Args {
    /// Directory for the workload, capture, databases and report.
    #[arg(long, value_name = "DIR", default_value = "mimic-demo")]
    pub out: PathBuf,
    /// Connections in the synthetic production workload.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(10..=100_000))]
    pub connections: u32,
    /// New connections per second in the workload.
    #[arg(long, default_value_t = 20.0, value_parser = super::positive_number)]
    pub rate: f64,
    /// The server stack production runs (and the "current" replay uses).
    #[arg(long, value_name = "PROFILE", default_value = "initcwnd=3", value_parser = parse_stack)]
    pub current: StackProfile,
    /// The stack change to evaluate.
    #[arg(long, value_name = "PROFILE", default_value = "initcwnd=10", value_parser = parse_stack)]
    pub change: StackProfile,
    /// Lab name (built for the demo and removed after).
    #[arg(long, default_value_t = format!("demo{}", std::process::id() % 100_000))]
    pub lab: String,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Run the lab's server host as a QEMU guest on this kernel image (the kernel you
    /// changed; `mimic lab fetch-kernel` prints Debian's): production and both replays run
    /// against a server on that kernel. Its modules are found beside the image.
    #[arg(long, value_name = "IMAGE")]
    pub server_kernel: Option<PathBuf>,
}

fn parse_stack(s: &str) -> Result<StackProfile, String> {
    s.parse()
        .map_err(|e: mimic_netemu::stack::ProfileError| e.to_string())
}

const STAGES: usize = 6;

/// Set by Ctrl-C (SIGINT) or SIGTERM once the demo has started: the demo stops at the next
/// stage boundary (a replay stops at once) and its lab guard removes the lab.
static STOP: std::sync::LazyLock<Arc<AtomicBool>> =
    std::sync::LazyLock::new(|| Arc::new(AtomicBool::new(false)));

/// The demo was stopped by a signal: exit 130 like `mimic replay`, after the lab guard ran.
#[derive(Debug)]
struct Interrupted;

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("interrupted; the lab is removed")
    }
}

impl std::error::Error for Interrupted {}

fn interrupted() -> anyhow::Result<()> {
    if STOP.load(Ordering::Relaxed) {
        return Err(Interrupted.into());
    }
    Ok(())
}

fn stage(n: usize, what: &str) -> anyhow::Result<()> {
    interrupted()?;
    if !crate::progress::quiet() {
        eprintln!("[{n}/{STAGES}] {what}");
    }
    Ok(())
}

/// What the demo needs before it touches the system.
fn preflight(lab_name: &str) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("mimic demo needs root: it builds network namespaces for the lab. Run it as root, e.g. `sudo scripts/demo.sh`");
    }
    let missing: Vec<&str> = [
        ("ip", "iproute2"),
        ("ethtool", "ethtool"),
        ("sysctl", "procps"),
    ]
    .iter()
    .filter(|(tool, _)| !in_path(tool))
    .map(|(_, pkg)| *pkg)
    .collect();
    if !missing.is_empty() {
        bail!(
            "mimic demo needs these Debian packages: {} (scripts/deps.sh demo installs them)",
            missing.join(" ")
        );
    }
    lab::validate_name(lab_name)?;
    Ok(())
}

fn in_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
                .any(|d| d.join(tool).is_file())
        })
        .unwrap_or(false)
}

/// Removes the lab however the demo ends.
struct LabDown(String);

impl Drop for LabDown {
    fn drop(&mut self) {
        let _ = lab::down(&self.0);
    }
}

fn replay(
    opts: ReplayOptions,
    what: &str,
) -> anyhow::Result<mimic_replay::orchestrate::ReplaySummary> {
    match super::replay::replay_with_progress(&opts) {
        Ok(s) => {
            if !crate::progress::quiet() {
                eprintln!(
                    "      {what}: {} connections, {} ok, {} failed, in {:.0} s",
                    s.connections, s.ok, s.failed, s.duration_s
                );
                if s.timing.distorted() {
                    eprintln!("      warning: {}", s.timing.describe());
                }
            }
            Ok(s)
        }
        Err(ReplayError::Interrupted) => Err(Interrupted.into()),
        Err(e) => Err(e).with_context(|| format!("{what} failed")),
    }
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    match demo(a) {
        Err(e) if e.is::<Interrupted>() => {
            eprintln!("mimic: demo interrupted; the lab is removed");
            Ok(ExitCode::from(130))
        }
        r => r,
    }
}

/// The file that marks a directory as a demo's output: a later demo may write over what one
/// left there, and over nothing else.
const OUT_MARK: &str = ".mimic-demo";

/// What is wrong with the demo's arguments given what exists: checked before anything is
/// built or written.
fn check_args(a: &Args) -> anyhow::Result<()> {
    if a.change == StackProfile::default() {
        bail!("--change is empty: name the stack change to evaluate, e.g. --change initcwnd=10");
    }
    if a.current.merged(&a.change) == a.current {
        bail!(
            "--change {} changes nothing of --current {}: both replays would run the same stack",
            a.change,
            a.current
        );
    }
    // a lab of that name belongs to someone else: the demo would rebuild it, change its
    // server stack and remove it when done
    if lab::list().iter().any(|l| l.name == a.lab) {
        bail!(
            "lab {} exists (`mimic lab status {}`): the demo builds a lab of its own and removes it when done; give --lab a name no lab has, or take that lab down first (`mimic lab down {}`)",
            a.lab,
            a.lab,
            a.lab
        );
    }
    match std::fs::read_dir(&a.out) {
        Ok(mut entries) => {
            if entries.next().is_some() && !a.out.join(OUT_MARK).is_file() {
                bail!(
                    "{}: holds files an earlier demo did not write (the demo replaces its workload.db, production*.db, replay-*.db, report.* and plots/ there): name a new or empty directory with --out",
                    a.out.display()
                );
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) if a.out.exists() && !a.out.is_dir() => {
            bail!(
                "{}: not a directory (--out names the demo's output directory): {e}",
                a.out.display()
            )
        }
        Err(e) => bail!("{}: {e}", a.out.display()),
    }
    Ok(())
}

fn demo(a: Args) -> anyhow::Result<ExitCode> {
    preflight(&a.lab)?;
    check_args(&a)?;
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&STOP))
            .context("installing the Ctrl-C handler")?;
    }
    let started = Instant::now();
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    std::fs::write(
        a.out.join(OUT_MARK),
        "this directory holds the output of `mimic demo`; a later demo replaces it\n",
    )
    .with_context(|| format!("writing {}", a.out.join(OUT_MARK).display()))?;
    let out = std::path::absolute(&a.out)?;
    let p = |f: &str| out.join(f);
    let exe = std::env::current_exe()?;

    // a bad image is named before anything is built
    let server_kernel = match &a.server_kernel {
        Some(k) => Some(mimic_netemu::guest::inspect_kernel(k, None)?),
        None => None,
    };
    stage(
        1,
        &format!(
            "building lab {} (server stack {}{})",
            a.lab,
            a.current,
            match &server_kernel {
                Some(k) => format!(", server on kernel {} in a QEMU guest", k.version),
                None => String::new(),
            }
        ),
    )?;
    let _down = LabDown(a.lab.clone());
    let (_, notes) = lab::up_with_guests(
        &a.lab,
        &lab::LabOptions {
            stack: Some(a.current.clone()),
            // this run takes it down when it ends; `lab sweep` if it is killed first
            owner: Some(lab::Owner::current()),
        },
        &lab::GuestOptions {
            server_kernel,
            ..Default::default()
        },
    )?;
    for n in notes {
        eprintln!("      {n}");
    }

    stage(
        2,
        &format!(
            "synthesizing a production workload of {} connections",
            a.connections
        ),
    )?;
    let s = synth::generate(
        &SynthOptions {
            connections: a.connections as usize,
            rate: a.rate,
            seed: a.seed,
            ..SynthOptions::default()
        },
        &p("workload.db"),
    )?;
    eprintln!(
        "      {} exchanges over {:.0} s, classes: {}",
        s.exchanges,
        s.duration_s,
        s.by_class
            .iter()
            .map(|(c, n)| format!("{c} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    );

    let base = |input: PathBuf,
                output: PathBuf,
                stack: Option<StackProfile>,
                keep: Option<PathBuf>| ReplayOptions {
        input,
        output,
        target: Target::Lab {
            name: a.lab.clone(),
            keep: true,
        },
        stack,
        queue: Default::default(),
        request_timing: Default::default(),
        unestimated: Default::default(),
        select: Select::Complete,
        limit: None,
        time_scale: 1.0,
        seed: a.seed,
        server_port: 80,
        keep_capture: keep,
        cpu_split: true,
        agents: Vec::new(),
        agent_timeout: mimic_replay::agent::DEFAULT_LIMIT,
        emulator: Default::default(),
        kernel_pipes: Default::default(),
        lan_rtt: Default::default(),
        exe: exe.clone(),
    };
    let capdir = p("production-capture");
    let _ = std::fs::remove_dir_all(&capdir);
    stage(
        3,
        "running production: the workload under the current stack, captured at the server",
    )?;
    replay(
        base(
            p("workload.db"),
            p("production-run.db"),
            Some(a.current.clone()),
            Some(capdir.clone()),
        ),
        "production",
    )?;

    let production_stack =
        mimic_netemu::stack::read_back(&a.lab).unwrap_or_else(|_| a.current.clone());
    stage(4, "analyzing the production capture (mimic analyze)")?;
    let mut caps: Vec<PathBuf> = std::fs::read_dir(&capdir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    caps.sort();
    let flows = p("production.db");
    let an = super::analyze::analyze_with_progress(
        caps,
        flows.clone(),
        mimic_analyze::Config {
            server_ports: vec![80],
            ..Default::default()
        },
        1,
        // production's server stack, as the lab had it while capturing
        vec![
            ("stack".into(), serde_json::to_string(&production_stack)?),
            ("stack_spec".into(), production_stack.to_string()),
            // captured in the server's namespace
            ("capture_vantage".into(), "server".into()),
        ],
        // the demo stops between its stages (STOP), not inside the analysis
        None,
    )?;
    eprintln!(
        "      {} connections ({} complete), {} exchanges",
        an.connections, an.complete, an.exchanges
    );

    stage(
        5,
        &format!(
            "replaying production under the current stack ({}) and the change ({})",
            a.current, a.change
        ),
    )?;
    let current_db = p("replay-current.db");
    let change_db = p("replay-change.db");
    replay(
        base(
            flows.clone(),
            current_db.clone(),
            Some(a.current.clone()),
            None,
        ),
        "current stack",
    )?;
    replay(
        base(
            flows.clone(),
            change_db.clone(),
            Some(a.change.clone()),
            None,
        ),
        "changed stack",
    )?;

    stage(6, "comparing (mimic compare)")?;
    let report = mimic_compare::Report::build(
        &flows,
        &[current_db.clone(), change_db.clone()],
        &mimic_compare::Options::default(),
    )?;
    report.write_html(&p("report.html"))?;
    report.write_json(&p("report.json"))?;
    report.write_pngs(&p("plots"))?;
    let verdict = report.verdict();
    interrupted()?;

    println!("report: {}", p("report.html").display());
    println!(
        "        {} (machine-readable), {}/ (plots)",
        p("report.json").display(),
        p("plots").display()
    );
    for line in verdict.lines() {
        println!("verdict: {line}");
    }
    for w in report.warnings() {
        println!("warning: {w}");
    }
    println!(
        "took {:.0} s; the lab is removed",
        started.elapsed().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}
