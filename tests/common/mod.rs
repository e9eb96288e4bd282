//! Shared harness for the integration tests: run the `mimic` binary in a temporary directory,
//! find the public traces, and insist on what a test needs instead of skipping.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `mimic` binary cargo built for these tests.
pub fn mimic_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_mimic"))
}

pub fn mimic() -> Command {
    Command::new(mimic_bin())
}

/// Runs `mimic` with `args` and returns its output (never panics on a non-zero exit).
pub fn run(args: &[&str]) -> Output {
    mimic().args(args).output().expect("spawn mimic")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `../shared/traces/public` beside the checkout.
pub fn traces() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces/public");
    assert!(
        p.is_dir(),
        "{} is missing: check out shared/ beside this repository",
        p.display()
    );
    p.canonicalize().unwrap()
}

pub fn trace(rel: &str) -> PathBuf {
    let p = traces().join(rel);
    assert!(p.exists(), "public trace {} is missing", p.display());
    p
}

/// Every capture file in a folder of the public traces.
pub fn traces_in(dir: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = walk(&traces().join(dir))
        .into_iter()
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n != "SOURCES.md" && n != "README.md")
        })
        .collect();
    v.sort();
    v
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("mimic-test-")
        .tempdir()
        .expect("temp dir")
}

/// Fails (does not skip) when the test is not running as root.
pub fn require_root(what: &str) {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    assert_eq!(
        uid, 0,
        "{what} needs root (network namespaces); run the test suite as root"
    );
}

/// Fails with a clear message when an external tool a test compares against is missing.
pub fn require_tool(tool: &str) -> PathBuf {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{tool} is not installed: scripts/deps.sh test installs it"
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}
