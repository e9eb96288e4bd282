//! `mimic lab`: build, inspect, re-profile or tear down the three-namespace replay lab.

use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use mimic_netemu::lab::{self, LabOptions};
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
    },
    /// Kill every process in the lab's namespaces and remove the namespaces, veths and
    /// runtime files (also after a crash, and for half-built labs).
    Down { name: String },
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
        Cmd::Up { name, stack } => {
            let (info, notes) = lab::up(&name, &LabOptions { stack })
                .with_context(|| format!("building lab {name}"))?;
            for n in notes {
                eprintln!("mimic: note: {n}");
            }
            println!(
                "lab {} is up: client {} (pool {}) in {}, emulator {} <-> {} in {}, server {} on {} in {}",
                info.name, info.client_addr, info.client_pool, info.ns_cli, info.emu_cli_if, info.emu_srv_if, info.ns_emu, info.server_addr, info.srv_if, info.ns_srv
            );
            println!("start the emulator with: mimic netemu run --lab {} --default \"delay=20ms,rate=10mbit\"", info.name);
        }
        Cmd::Down { name } => {
            let r = lab::down(&name).with_context(|| format!("tearing down lab {name}"))?;
            if r.namespaces.is_empty() {
                println!("lab {name} was not up; nothing left behind");
            } else {
                println!(
                    "lab {name} removed ({} namespaces, {} processes stopped)",
                    r.namespaces.len(),
                    r.killed.len()
                );
            }
        }
        Cmd::Status { name, json } => {
            let st = lab::status(&name)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&st)?);
            } else {
                println!("lab {}: {}", st.name, if st.up { "up" } else { "not up" });
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
