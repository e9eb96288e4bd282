//! A run's outputs written all or nothing: each file rendered into its temporary sibling
//! (`mimic_core::db::StagedFile`, the writer behind `write_atomic`), and renamed into place
//! only once every one was rendered. Dropped before [`Outputs::commit`], or failing in it before its
//! renames, it removes its temporaries and the directories it made, and every earlier file
//! stays as it was. (`write_atomic` does one file; a report of several must not leave its HTML
//! newly written when its JSON or a PNG then fails.)

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::CompareError;

enum Staged {
    /// Rendered into its temporary sibling, renamed over its destination on commit.
    File(mimic_core::db::StagedFile),
    /// A device or FIFO (`/dev/null`, `/dev/stdout`): renaming over it would replace it, so it
    /// is written in place on commit, before any rename.
    InPlace { dest: PathBuf, bytes: Vec<u8> },
    /// Standard output, written on commit before any rename.
    Stdout(Vec<u8>),
}

/// Outputs staged for one commit.
#[derive(Default)]
pub struct Outputs {
    staged: Vec<Staged>,
    /// Directories [`Outputs::create_dir`] made, deepest first: removed when not committed
    /// (and, when empty, if the process is interrupted).
    made_dirs: Vec<PathBuf>,
    held_dirs: Vec<mimic_core::interrupt::TempOutput>,
    committed: bool,
}

fn io_error(path: &Path, source: std::io::Error) -> CompareError {
    CompareError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Refuses a directory where a file is to go: renaming a file over it fails, and only at the
/// end; a directory of that name is never what was meant.
pub(crate) fn refuse_directory(dest: &Path) -> Result<(), CompareError> {
    if dest.is_dir() {
        return Err(io_error(
            dest,
            std::io::Error::new(
                std::io::ErrorKind::IsADirectory,
                "is a directory, not a file to write",
            ),
        ));
    }
    Ok(())
}

impl Outputs {
    pub fn new() -> Outputs {
        Outputs::default()
    }

    /// Creates `dir` and any missing parents now; the ones made here are removed again (when
    /// empty) if the outputs are not committed.
    pub fn create_dir(&mut self, dir: &Path) -> Result<(), CompareError> {
        let missing = mimic_core::db::missing_dirs(dir);
        std::fs::create_dir_all(dir).map_err(|e| io_error(dir, e))?;
        self.held_dirs.extend(
            missing
                .iter()
                .map(mimic_core::interrupt::TempOutput::dir_if_empty),
        );
        self.made_dirs.extend(missing);
        Ok(())
    }

    /// Renders `bytes` for `dest` into its temporary sibling (synced to disk), or keeps them
    /// for a device or FIFO written in place on commit.
    pub fn add(&mut self, dest: &Path, bytes: &[u8]) -> Result<(), CompareError> {
        mimic_core::db::check_output_dir(dest).map_err(|e| io_error(dest, e))?;
        refuse_directory(dest)?;
        if mimic_core::db::is_special_file(dest) {
            self.staged.push(Staged::InPlace {
                dest: dest.to_path_buf(),
                bytes: bytes.to_vec(),
            });
            return Ok(());
        }
        let mut f = mimic_core::db::StagedFile::create(dest).map_err(|e| io_error(dest, e))?;
        f.writer()
            .write_all(bytes)
            .and_then(|()| f.finish())
            .map_err(|e| io_error(dest, e))?;
        self.staged.push(Staged::File(f));
        Ok(())
    }

    /// `bytes` for standard output, written on commit.
    pub fn add_stdout(&mut self, bytes: Vec<u8>) {
        self.staged.push(Staged::Stdout(bytes));
    }

    /// Writes the in-place outputs and standard output, then renames every file into place.
    /// Whatever fails before the renames leaves every file as it was (a rename of a checked
    /// temporary into its own directory fails only if that directory changes meanwhile);
    /// returns the files written, standard output left out.
    pub fn commit(mut self) -> Result<Vec<PathBuf>, CompareError> {
        // checked again here: a directory may have appeared since `add`, and two outputs of
        // one name would leave only the last
        let mut seen = HashSet::new();
        for s in &self.staged {
            let dest = match s {
                Staged::File(f) => Some(f.dest()),
                Staged::InPlace { dest, .. } => Some(dest.as_path()),
                Staged::Stdout(_) => None,
            };
            if let Some(dest) = dest {
                refuse_directory(dest)?;
                if !seen.insert(dest) {
                    return Err(io_error(
                        dest,
                        std::io::Error::new(
                            std::io::ErrorKind::AlreadyExists,
                            "named by two outputs",
                        ),
                    ));
                }
            }
        }
        for s in &self.staged {
            match s {
                Staged::InPlace { dest, bytes } => std::fs::OpenOptions::new()
                    .write(true)
                    .open(dest)
                    .and_then(|mut f| f.write_all(bytes))
                    .map_err(|e| io_error(dest, e))?,
                Staged::Stdout(bytes) => {
                    let mut out = std::io::stdout().lock();
                    match out.write_all(bytes).and_then(|()| out.flush()) {
                        // `mimic compare ... | head`: the reader has what it wanted
                        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                            return Err(CompareError::Stdout(e))
                        }
                        _ => {}
                    }
                }
                Staged::File(_) => {}
            }
        }
        let mut written = Vec::new();
        for s in std::mem::take(&mut self.staged) {
            match s {
                Staged::File(f) => {
                    let dest = f.dest().to_path_buf();
                    f.commit().map_err(|e| io_error(&dest, e))?;
                    written.push(dest);
                }
                Staged::InPlace { dest, .. } => written.push(dest),
                Staged::Stdout(_) => {}
            }
        }
        self.committed = true;
        Ok(written)
    }
}

impl Drop for Outputs {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        // not committed, or a rename failed: no temporary left behind (each staged file removes
        // its own), then the directories made for them, if nothing else went in
        self.staged.clear();
        for d in &self.made_dirs {
            let _ = std::fs::remove_dir(d);
        }
    }
}
