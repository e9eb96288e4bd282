//! What the lab tests share: lab names unique to the run, the guard that takes a lab down
//! however a test ends, running mimic where it must succeed, its JSON, and Debian's stock
//! kernel for the guest tests.

use std::path::PathBuf;
use std::process::Output;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::common::{mimic, stderr, stdout};

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A lab name unique to this run and test: `PREFIX`, the pid (mod 100,000), `x`, a sequence
/// number (lab names are at most 12 characters: keep the prefix to two or three).
pub fn lab_name(prefix: &str) -> String {
    format!(
        "{prefix}{}x{}",
        std::process::id() % 100_000,
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// Tears a lab down when the test ends, however it ends.
pub struct LabDown(pub String);

impl Drop for LabDown {
    fn drop(&mut self) {
        let _ = mimic().args(["lab", "down", &self.0]).output();
    }
}

/// Runs mimic, which must succeed (the failure message has its output).
pub fn ok(args: &[&str]) -> Output {
    let o = mimic().args(args).output().unwrap();
    assert!(
        o.status.success(),
        "mimic {args:?} failed ({}): {}{}",
        o.status,
        stdout(&o),
        stderr(&o)
    );
    o
}

/// [`ok`], its standard output.
pub fn ok_text(args: &[&str]) -> String {
    stdout(&ok(args))
}

pub fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(o)))
}

/// Debian's stock kernel image (fetched with apt into the cache once).
pub fn debian_kernel() -> PathBuf {
    let o = mimic()
        .args(["lab", "fetch-kernel", "linux-image-amd64"])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "fetching Debian's kernel (linux-image-amd64) with apt failed: {}",
        stderr(&o)
    );
    PathBuf::from(stdout(&o).trim())
}
