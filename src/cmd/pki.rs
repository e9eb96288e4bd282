//! `mimic pki init DIR`: the certificates and keys of the control channel (a CA, the
//! controller's, one per role), for an operator to distribute to the hosts.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use mimic_control::pki::{self, InitOptions};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Write a new CA certificate, the controller's certificate and key, and one certificate
    /// and key per role (netemu, serve, agent, and each --role) into DIR. Keys are mode 0600; the
    /// CA's own key signs them and is thrown away.
    Init {
        /// Directory to write (created mode 0700 when missing).
        dir: PathBuf,
        /// A further role to make a certificate for (repeatable), e.g. `capture`.
        #[arg(long = "role", value_name = "NAME")]
        roles: Vec<String>,
        /// Days the certificates are valid.
        #[arg(long, default_value_t = 825, value_parser = clap::value_parser!(u32).range(1..))]
        days: u32,
        /// Replace the files of an earlier `pki init` in DIR.
        #[arg(long)]
        force: bool,
    },
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    match a.cmd {
        Cmd::Init {
            dir,
            roles,
            days,
            force,
        } => {
            let files = pki::init(
                &dir,
                &InitOptions {
                    force,
                    extra_roles: roles,
                    days,
                },
            )?;
            for f in &files {
                println!("{}", f.display());
            }
            if !crate::progress::quiet() {
                eprintln!(
                    "mimic pki: wrote {} files; give every host ca.crt, each role host its ROLE.crt and ROLE.key, and only the controller controller.crt and controller.key",
                    files.len()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
