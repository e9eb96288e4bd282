//! `mimic lab`: build, inspect, re-profile or tear down the three-namespace replay lab.

use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use std::path::PathBuf;
use std::time::Duration;

use mimic_netemu::guest;
use mimic_netemu::lab::{self, GuestOptions, LabOptions};
use mimic_netemu::stack::{self, StackProfile};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create namespaces NAME-cli, NAME-emu, NAME-srv with their veths, addresses and routes
    /// (idempotent: a complete lab is left as it is).
    Up {
        /// Lab name: letters, digits, `-`, `_`; at most 12 characters.
        name: String,
        /// TCP stack profile for the server namespace, e.g.
        /// "initcwnd=10,cc=cubic,sack=1,rto_min=200ms,rmem=4096/87380/6291456".
        #[arg(long)]
        stack: Option<StackProfile>,
        /// Run the router host (NAME-emu) as a QEMU guest booting this kernel image (a
        /// bzImage, e.g. the `boot/vmlinuz-*` that `mimic lab fetch-kernel` prints): KVM where
        /// a probe boot shows it works, TCG otherwise. The guest reads the host's files.
        #[arg(long, value_name = "IMAGE")]
        kernel: Option<PathBuf>,
        /// Run the server host (NAME-srv) as a QEMU guest booting this kernel image (the
        /// kernel you changed): it keeps the server's address, MAC and routes, `mimic serve`
        /// runs in it (`mimic replay --lab NAME`) and `lab stack` sets its sysctls and routes.
        /// Alone or together with --kernel.
        #[arg(long, value_name = "IMAGE")]
        server_kernel: Option<PathBuf>,
        /// The kernel's modules (`lib/modules` or `lib/modules/VERSION`); default: beside
        /// the image (`IMAGE/../../lib/modules/VERSION`), then `/lib/modules/VERSION`.
        /// Applies to --kernel and --server-kernel.
        #[arg(long, value_name = "DIR")]
        modules: Option<PathBuf>,
        /// Extra kernel command-line words for the guests of --kernel and --server-kernel,
        /// appended after the lab's own (e.g. "highres=off": timers on the kernel's tick, as
        /// the testbed's coarse-tick mode wants). Space-separated words without quotes or
        /// control characters; the lab's own keys (console=, panic=, init=, rdinit=, root=,
        /// mimic_*) are refused. `lab status` shows them.
        #[arg(long, value_name = "ARGS")]
        kernel_cmdline: Option<String>,
        /// How long a guest may take from QEMU's start to answering on its command channel;
        /// past it the guest is killed and the lab removed.
        #[arg(long, value_name = "DURATION", default_value = "90s", value_parser = parse_timeout)]
        boot_timeout: Duration,
        /// Guest memory in MiB.
        #[arg(long, value_name = "MIB", default_value_t = 768, value_parser = clap::value_parser!(u32).range(128..=65536))]
        guest_memory: u32,
        /// SCHED_FIFO priority of the guest's QEMU threads once it is up (0: normal
        /// scheduling). A TCG guest's timers fire only when QEMU runs: on a loaded machine
        /// normal scheduling adds tens of ms to netem's delays. The default is above mimic's
        /// own datapath thread (10).
        #[arg(long, value_name = "PRIO", default_value_t = 20, value_parser = clap::value_parser!(i32).range(0..=99))]
        guest_priority: i32,
        /// Client hosts: NAME-cli, NAME-cli2, … (each its own namespace and TCP stack, address
        /// 198.18.0.(1+K), pool 198.19.(32(K-1)).0/19), on a switch in front of the emulator;
        /// for `mimic replay --agents cli,cli2`.
        #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=lab::MAX_CLIENTS as i64))]
        clients: u32,
        /// A process the lab belongs to (a running pid): once every owner has exited, `mimic
        /// lab sweep` takes the lab down. For scripts and test harnesses that build a lab and
        /// tear it down themselves, so that one killed first leaves nothing for long. A lab
        /// this call builds gets it as its only owner, one already built with owners one more;
        /// one built without an owner keeps none and stays until `mimic lab down`.
        #[arg(long, value_name = "PID", env = "MIMIC_LAB_OWNER")]
        owner: Option<i32>,
    },
    /// Run a command on a lab host — a namespace (`ip netns exec`) or a guest (its command
    /// channel) alike — with its exit status; a guest's stdout and stderr come back when it ends.
    Exec {
        name: String,
        /// cli, emu or srv (or cli2, … in a lab with more client hosts).
        host: String,
        /// Kill the command after this long (guests only; e.g. 30s).
        #[arg(long, value_name = "DURATION", value_parser = parse_timeout)]
        timeout: Option<Duration>,
        /// The command and its arguments (after `--`).
        #[arg(last = true, required = true, value_name = "CMD")]
        command: Vec<String>,
    },
    /// Download a Debian kernel package with apt (`apt-get download` + `dpkg-deb -x`) into
    /// the cache (/var/cache/mimic/kernels/VERSION, or $MIMIC_CACHE_DIR/kernels) and print
    /// the image's path for `lab up --kernel`. Nothing is installed into /boot.
    FetchKernel {
        /// The package (a meta package such as linux-image-amd64 is followed to its image).
        #[arg(default_value = "linux-image-amd64")]
        package: String,
    },
    /// (Internal) the command channel's guest side, run as a guest's PID 1.
    #[command(hide = true)]
    GuestAgent,
    /// Kill every process in the lab's namespaces and remove the namespaces, veths and
    /// runtime files (also after a crash, and for half-built labs).
    Down { name: String },
    /// List the labs on this host (runtime directories under /run/mimic, namespaces named
    /// like a lab host's): owner, namespaces, guests.
    List {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Take down every lab whose owners (`lab up --owner`) have all exited, with its guests,
    /// processes, namespaces and runtime files; labs without an owner, or whose owner runs,
    /// are left alone.
    Sweep {
        /// Only list what would be taken down.
        #[arg(long)]
        dry_run: bool,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Show the namespaces, interfaces, addresses and the server's stack profile in force.
    Status {
        name: String,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Change the server namespace's TCP stack profile (only the keys given) and print what is
    /// in force afterwards.
    Stack { name: String, profile: StackProfile },
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    match args.cmd {
        Cmd::Up {
            name,
            stack,
            kernel,
            server_kernel,
            modules,
            kernel_cmdline,
            boot_timeout,
            guest_memory,
            guest_priority,
            clients,
            owner,
        } => {
            let owner = owner
                .map(lab::Owner::of)
                .transpose()
                .context("--owner (or MIMIC_LAB_OWNER)")?;
            if modules.is_some() && kernel.is_none() && server_kernel.is_none() {
                anyhow::bail!(
                    "--modules names the modules of --kernel or --server-kernel; give one of them"
                );
            }
            if kernel_cmdline.is_some() && kernel.is_none() && server_kernel.is_none() {
                anyhow::bail!(
                    "--kernel-cmdline is for the guests of --kernel or --server-kernel; give one of them"
                );
            }
            let cmdline = guest::parse_cmdline(kernel_cmdline.as_deref().unwrap_or(""))?;
            let inspect = |k: &Option<PathBuf>| -> anyhow::Result<_> {
                Ok(match k {
                    Some(k) => Some(guest::inspect_kernel(k, modules.as_deref())?),
                    None => None,
                })
            };
            let router_kernel = inspect(&kernel)?;
            let server_kernel = inspect(&server_kernel)?;
            let guests = GuestOptions {
                router_kernel,
                server_kernel,
                boot_timeout,
                memory_mb: guest_memory,
                fifo_priority: (guest_priority > 0).then_some(guest_priority),
                cmdline,
            };
            let (info, notes) = lab::up_with_guests(&name, &LabOptions { stack, owner }, &guests)
                .with_context(|| format!("building lab {name}"))?;
            for n in &notes {
                eprintln!("mimic: note: {n}");
            }
            // a lab that is up keeps the client hosts it has: `--clients` only adds
            let had = lab::client_count(&name).unwrap_or(1);
            if clients < had {
                eprintln!(
                    "mimic: note: lab {name} has {had} client hosts; --clients {clients} removes none (take the lab down and up again for fewer)"
                );
            }
            if clients > 1 {
                for h in lab::add_clients(&name, clients)
                    .with_context(|| format!("adding client hosts to lab {name}"))?
                {
                    println!(
                        "client host {}: {} on {} in {} (pool {})",
                        h.role, h.addr, h.iface, h.ns, h.pool
                    );
                }
            }
            println!(
                "lab {} is up: client {} (pool {}) in {}, emulator {} <-> {} in {}, server {} on {} in {}",
                info.name, info.client_addr, info.client_pool, info.ns_cli, info.emu_cli_if, info.emu_srv_if, info.ns_emu, info.server_addr, info.srv_if, info.ns_srv
            );
            if notes.iter().any(|n| n.starts_with("router host")) {
                println!(
                    "install kernel pipes in the router guest with: mimic lab exec {0} emu -- mimic netemu render --backend netem --default \"delay=20ms,rate=10mbit\" --client-if {1} --server-if {2} --apply",
                    info.name, info.emu_cli_if, info.emu_srv_if
                );
            } else if notes.iter().any(|n| n.starts_with("server host")) {
                println!(
                    "replay against the server guest with: mimic replay flows.db -o replay.db --lab {0} --stack initcwnd=10",
                    info.name
                );
            } else {
                println!("start the emulator with: mimic netemu run --lab {} --default \"delay=20ms,rate=10mbit\"", info.name);
            }
        }
        Cmd::Exec {
            name,
            host,
            timeout,
            command,
        } => {
            let argv: Vec<&str> = command.iter().map(String::as_str).collect();
            let code = match lab::host(&name, &host)? {
                lab::Host::Namespace(ns) => {
                    if timeout.is_some() {
                        eprintln!(
                            "mimic: note: --timeout applies to guest hosts; {host} of lab {name} is a namespace, where the command runs until it ends (wrap it in `timeout`)"
                        );
                    }
                    let st = mimic_netemu::netns::command(&ns, argv[0], &argv[1..])
                        .status()
                        .with_context(|| format!("running ip netns exec {ns} {}", argv[0]))?;
                    use std::os::unix::process::ExitStatusExt;
                    st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))
                }
                lab::Host::Guest(rec) => {
                    let r = guest::exec(&rec, &argv, timeout)?;
                    use std::io::Write;
                    std::io::stdout().write_all(r.stdout.as_bytes())?;
                    std::io::stderr().write_all(r.stderr.as_bytes())?;
                    if let Some(e) = &r.error {
                        eprintln!("mimic: {}: {e}", rec.netns);
                    }
                    r.code()
                }
            };
            return Ok(ExitCode::from(code.clamp(0, 255) as u8));
        }
        Cmd::FetchKernel { package } => {
            let k = guest::fetch_debian_kernel(&package)?;
            eprintln!(
                "mimic: kernel {} (modules {})",
                k.version,
                k.modules.display()
            );
            println!("{}", k.image.display());
        }
        Cmd::GuestAgent => guest::agent_main(),
        Cmd::Down { name } => {
            let r = lab::down(&name).with_context(|| format!("tearing down lab {name}"))?;
            if r.namespaces.is_empty() {
                println!("lab {name} was not up; nothing left behind");
            } else {
                println!(
                    "lab {name} removed ({} namespaces, {} processes stopped, {} guests killed)",
                    r.namespaces.len(),
                    r.killed.len(),
                    r.guests.len()
                );
            }
        }
        Cmd::List { json } => {
            let labs = lab::list();
            if json {
                println!("{}", serde_json::to_string_pretty(&labs)?);
            } else if labs.is_empty() {
                println!("no labs on this host");
            } else {
                for l in &labs {
                    println!("{}", describe(l));
                }
            }
        }
        Cmd::Sweep { dry_run, json } => {
            let swept = lab::sweep(dry_run);
            if json {
                println!("{}", serde_json::to_string_pretty(&swept)?);
            } else if swept.is_empty() {
                println!("no lab whose owner has exited");
            } else {
                for s in &swept {
                    match (&s.down, &s.error) {
                        (_, Some(e)) => eprintln!(
                            "mimic: error: could not take down {}: {e}",
                            describe(&s.lab)
                        ),
                        (None, None) => println!("would take down {}", describe(&s.lab)),
                        (Some(r), None) => println!(
                            "took down {} ({} processes stopped, {} guests killed)",
                            describe(&s.lab),
                            r.killed.len(),
                            r.guests.len()
                        ),
                    }
                }
            }
            if swept.iter().any(|s| s.error.is_some()) {
                return Ok(ExitCode::FAILURE);
            }
        }
        Cmd::Status { name, json } => {
            let st = lab::status(&name)?;
            // nothing of it anywhere: a name mistyped, or a lab already down
            let nothing = !st.namespaces.iter().any(|n| n.1)
                && !st.info.runtime_dir.exists()
                && st.hosts.iter().all(|h| h.guest.is_none())
                && matches!(st.owner, lab::Ownership::None)
                && st.netemu_pid.is_none();
            if json {
                println!("{}", serde_json::to_string_pretty(&st)?);
            } else if nothing {
                println!(
                    "lab {}: not up, nothing of it exists (`mimic lab list` names the labs on this host)",
                    st.name
                );
            } else {
                println!(
                    "lab {}: {}, {}",
                    st.name,
                    if st.up { "up" } else { "not up" },
                    owner_text(&st.owner)
                );
                for (ns, present) in &st.namespaces {
                    println!(
                        "  namespace {ns}: {}",
                        if *present { "present" } else { "missing" }
                    );
                }
                for i in &st.interfaces {
                    if !i.present {
                        println!("  {}/{}: missing", i.namespace, i.name);
                        continue;
                    }
                    let offl = if i.offloads_on.is_empty() {
                        String::new()
                    } else {
                        format!(" (offloads still on: {})", i.offloads_on.join(", "))
                    };
                    println!(
                        "  {}/{}: {} {} {}{}",
                        i.namespace,
                        i.name,
                        if i.up { "UP" } else { "DOWN" },
                        i.mac.as_deref().unwrap_or("-"),
                        if i.addresses.is_empty() {
                            "-".to_string()
                        } else {
                            i.addresses.join(" ")
                        },
                        offl
                    );
                }
                println!(
                    "  server {} , client {} , client pool {}",
                    st.server_addr, st.client_addr, st.client_pool
                );
                for h in &st.hosts {
                    let k = match (&h.kernel, &h.error) {
                        (Some(k), _) => format!("kernel {k}"),
                        (None, Some(e)) => format!("kernel unknown ({e})"),
                        (None, None) => "kernel unknown".into(),
                    };
                    match &h.guest {
                        Some(g) => println!(
                            "  host {} ({}): {} guest, pid {} {}, {k}, image {}",
                            h.role,
                            h.namespace,
                            g.accel,
                            g.pid,
                            if h.guest_running == Some(true) {
                                "running"
                            } else {
                                "NOT running"
                            },
                            g.kernel.image.display()
                        ),
                        None => println!("  host {} ({}): namespace, {k}", h.role, h.namespace),
                    }
                    if let Some(g) = h.guest.as_ref().filter(|g| !g.cmdline.is_empty()) {
                        println!("    extra kernel command line: {}", g.cmdline.join(" "));
                    }
                }
                if let Some(p) = &st.stack {
                    println!("  server stack in force: {p}");
                }
                match st.netemu_pid {
                    Some(p) => println!("  netemu running (pid {p}), control {}", st.info.control),
                    None => println!("  netemu not running"),
                }
            }
            return Ok(if st.up {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            });
        }
        Cmd::Stack { name, profile } => {
            for n in stack::apply(&name, &profile)? {
                eprintln!("mimic: note: {n}");
            }
            println!("{}", stack::read_back(&name)?);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A timeout: a duration as the pipes take them (`90s`, `500ms`), or in minutes or hours
/// (`5m`, `5min`, `1h`), as `capture --rotate` takes them.
fn parse_timeout(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    // minutes and hours read as capture reads them; the pipes' units (no `m`: a delay of
    // `5m` is more likely a mistyped `5ms`) for the rest
    if t.ends_with(['m', 'h']) || t.ends_with("min") {
        let d = mimic_capture::capture::parse_duration(t)?;
        if d > Duration::from_secs(86_400) {
            return Err(format!("`{s}`: give at most a day"));
        }
        return Ok(d);
    }
    let ns = mimic_netemu::units::parse_duration(s)?;
    if ns == 0 {
        return Err("must be longer than 0".into());
    }
    Ok(Duration::from_nanos(ns))
}

fn owner_text(o: &lab::Ownership) -> String {
    match o {
        lab::Ownership::None => "no owner (stays until lab down)".to_string(),
        lab::Ownership::Running { owners } | lab::Ownership::Exited { owners } => {
            let each: Vec<String> = owners
                .iter()
                .map(|o| format!("{} {}", o.pid, if o.running { "running" } else { "exited" }))
                .collect();
            let swept = if owners.iter().any(|o| o.running) {
                ""
            } else {
                " (lab sweep removes it)"
            };
            format!(
                "owner{} {}{swept}",
                if owners.len() > 1 { "s" } else { "" },
                each.join(", ")
            )
        }
        lab::Ownership::Unreadable { why } => format!("owner unreadable ({why})"),
    }
}

/// One line of `lab list` and `lab sweep`: the name, the owner, what exists.
fn describe(l: &lab::LabEntry) -> String {
    let owner = owner_text(&l.owner);
    let guests = if l.guests.is_empty() {
        String::new()
    } else {
        let g: Vec<String> = l
            .guests
            .iter()
            .map(|(role, pid)| format!("{role} {pid}"))
            .collect();
        format!(", guests {}", g.join(", "))
    };
    format!(
        "{}: {owner}, {} namespaces{guests}{}",
        l.name,
        l.namespaces.len(),
        if l.runtime_dir {
            ""
        } else {
            ", no runtime directory"
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_take_minutes_and_hours_too() {
        assert_eq!(parse_timeout("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_timeout("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_timeout("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_timeout("2min"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_timeout("1.5h"), Ok(Duration::from_secs(5400)));
        for bad in ["0m", "-1h", "25h", "0s", "5", "5x"] {
            assert!(parse_timeout(bad).is_err(), "{bad}");
        }
    }
}
