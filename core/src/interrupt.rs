//! A run's temporary outputs removed when the run is interrupted (Ctrl-C, SIGTERM).
//!
//! Outputs are written under a temporary name and renamed into place at the end, so an
//! interrupted run never leaves half a result; but the signal's default action ends the
//! process where it stands, leaving the temporary file (a 3-million-connection `synth`:
//! 146 MB) hidden beside the output until a later run of the same output sweeps it. A command
//! that has no interruption of its own (`analyze` and `replay` stop cleanly themselves)
//! calls [`remove_temps_on_interrupt`] once; each temporary output is held by a [`TempOutput`]
//! while it exists.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use signal_hook::consts::{SIGINT, SIGTERM};

/// Each held path, and whether it goes only when empty (a directory the run created for its
/// output, which other runs may have written into meanwhile).
static TEMPS: Mutex<Vec<(PathBuf, bool)>> = Mutex::new(Vec::new());

fn temps() -> MutexGuard<'static, Vec<(PathBuf, bool)>> {
    // a panic elsewhere while holding the list leaves it usable
    TEMPS.lock().unwrap_or_else(|e| e.into_inner())
}

/// A temporary output (a file or a directory) that an interruption removes while this guard
/// lives. Drop it once the output was renamed into place or removed.
#[derive(Debug)]
pub struct TempOutput(PathBuf, bool);

impl TempOutput {
    pub fn new(path: impl Into<PathBuf>) -> TempOutput {
        Self::hold(path.into(), false)
    }

    /// A directory the run created for its outputs: removed by an interruption only if it is
    /// empty by then (after the temporary outputs inside it went).
    pub fn dir_if_empty(path: impl Into<PathBuf>) -> TempOutput {
        Self::hold(path.into(), true)
    }

    fn hold(path: PathBuf, if_empty: bool) -> TempOutput {
        temps().push((path.clone(), if_empty));
        TempOutput(path, if_empty)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempOutput {
    fn drop(&mut self) {
        let mut t = temps();
        if let Some(i) = t.iter().rposition(|(p, e)| *p == self.0 && *e == self.1) {
            t.swap_remove(i);
        }
    }
}

/// From now on SIGINT and SIGTERM remove the temporary outputs held at that moment, say so
/// on stderr (`mimic: {what} interrupted; nothing was written`) and end the process with 130,
/// the status every mimic command gives when interrupted (GUIDE.md). The list stays locked
/// from then on, so no temporary output is started after the signal (an output renamed into
/// place just before it is whole, and stays).
pub fn remove_temps_on_interrupt(what: &'static str) -> std::io::Result<()> {
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])?;
    std::thread::Builder::new()
        .name("mimic-interrupt".into())
        .spawn(move || {
            if signals.forever().next().is_some() {
                let held = temps();
                for (p, _) in held.iter().filter(|(_, if_empty)| !if_empty) {
                    let _ = if p.is_dir() {
                        std::fs::remove_dir_all(p)
                    } else {
                        std::fs::remove_file(p)
                    };
                }
                for (p, _) in held.iter().filter(|(_, if_empty)| *if_empty) {
                    let _ = std::fs::remove_dir(p);
                }
                eprintln!("mimic: {what} interrupted; nothing was written");
                std::process::exit(130);
            }
        })?;
    Ok(())
}
