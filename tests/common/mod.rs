//! Shared harness for the integration tests: run the `mimic` binary in a temporary directory,
//! find the public traces (or the suite's generated stand-ins when they are absent), and insist
//! on what a test needs instead of skipping.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `mimic` binary cargo built for these tests.
pub fn mimic_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_mimic"))
}

/// The binary, with this test process as the owner of every lab a `lab up` of it builds
/// (`MIMIC_LAB_OWNER`): a test binary killed before its guards run leaves labs that the next
/// run's `lab sweep` takes down.
pub fn mimic() -> Command {
    let mut c = Command::new(mimic_bin());
    c.env("MIMIC_LAB_OWNER", std::process::id().to_string());
    c
}

/// Gives the command SIGINT's default disposition, as a process started at a terminal has.
/// A test process started in the background of a non-interactive shell (CI scripts, `nohup
/// ... &`) inherits SIGINT ignored, passes that on to what it starts, and a shell started with
/// a signal ignored cannot trap it: a test that sends SIGINT to a script needs this.
pub fn sigint_as_at_a_terminal(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: signal(2) is async-signal-safe, the only kind of call allowed between fork and
    // exec; nothing is allocated or locked.
    unsafe {
        cmd.pre_exec(|| {
            if libc::signal(libc::SIGINT, libc::SIG_DFL) == libc::SIG_ERR {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
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

/// That `mimic` refused what it was given: exit status 2 (a usage or input error) and
/// `want` in its error output, which the failure message shows either way.
#[track_caller]
#[allow(dead_code)] // (each test binary compiles this module; not every one refuses input)
pub fn assert_refused(o: &Output, want: &str) {
    let e = stderr(o);
    assert_eq!(o.status.code(), Some(2), "exit status {:?}: {e}", o.status);
    assert!(e.contains(want), "no `{want}` in: {e}");
}

pub mod flowdb;
pub mod generated;

/// Whether an absent public corpus is an error: on CI (`CI=true`, which always has `shared/`
/// beside the checkout) or when asked for with `MIMIC_CORPUS=required`.
/// `MIMIC_CORPUS=generated` runs on the generated captures even on CI.
pub fn corpus_required() -> bool {
    match std::env::var("MIMIC_CORPUS").as_deref() {
        Ok("required") => true,
        Ok("generated") => false,
        _ => std::env::var("CI").is_ok_and(|v| v == "true"),
    }
}

/// The public corpus (third-party captures, see its SOURCES.md): `$MIMIC_TRACES` when set,
/// else `../shared/traces/public` beside the checkout (as `scripts/corpus.sh` fetches it).
/// `None` when absent, or when `MIMIC_CORPUS=generated` asks for the run a plain clone gets;
/// fails instead when [`corpus_required`].
pub fn corpus() -> Option<PathBuf> {
    static CORPUS: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    let found = CORPUS.get_or_init(|| {
        if std::env::var("MIMIC_CORPUS").is_ok_and(|v| v == "generated") {
            return None;
        }
        if let Some(dir) = std::env::var_os("MIMIC_TRACES").filter(|v| !v.is_empty()) {
            let p = PathBuf::from(dir);
            assert!(
                p.join("SOURCES.md").is_file(),
                "MIMIC_TRACES={} is not the public corpus (no SOURCES.md in it)",
                p.display()
            );
            return Some(p.canonicalize().unwrap());
        }
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces/public");
        p.is_dir().then(|| p.canonicalize().unwrap())
    });
    if found.is_none() && corpus_required() {
        panic!(
            "the public corpus is required (CI=true or MIMIC_CORPUS=required) but absent: \
             neither MIMIC_TRACES nor {} is there; scripts/corpus.sh fetches it",
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../shared/traces/public")
                .display()
        );
    }
    found.clone()
}

pub fn corpus_present() -> bool {
    corpus().is_some()
}

/// Says on the test process's stderr (past the harness's output capture, so a passing run
/// shows it too) that the running test uses a generated stand-in for `what`, and counts it in
/// `$MIMIC_CORPUS_LOG` (scripts/test.sh sums these at the end). Once per test and `what`.
pub fn note_generated(what: &str) {
    use std::io::Write;
    static SEEN: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let test = std::thread::current()
        .name()
        .unwrap_or("unnamed test")
        .to_string();
    let line = format!("public corpus absent: {test} runs on generated captures for {what}");
    {
        let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
        if seen.contains(&line) {
            return;
        }
        seen.push(line.clone());
    }
    let _ = writeln!(std::io::stderr(), "{line}");
    if let Some(log) = std::env::var_os("MIMIC_CORPUS_LOG").filter(|v| !v.is_empty()) {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
        {
            let _ = writeln!(f, "{line}");
        }
    }
}

/// The root the tests read captures from: the public corpus, or when it is absent the
/// suite's own generated captures (`generated.rs`), which carry the corpus files' names.
pub fn traces() -> PathBuf {
    corpus().unwrap_or_else(generated::root)
}

/// One capture by its path in the corpus; without the corpus, its generated stand-in (a
/// capture with the property the tests read from it), or a failure naming what is missing.
pub fn trace(rel: &str) -> PathBuf {
    let p = traces().join(rel);
    if corpus_present() {
        assert!(p.exists(), "public trace {} is missing", p.display());
    } else {
        assert!(
            p.exists(),
            "the public corpus is absent and no generated capture stands in for {rel}: \
             scripts/corpus.sh fetches the corpus (or set MIMIC_TRACES to it)"
        );
        note_generated(rel);
    }
    p
}

/// `rel` from the public corpus; without it, the generated capture `instead`, which has the
/// property the test needs from `rel` (noted, as [`trace`] notes every stand-in).
pub fn trace_or(rel: &str, instead: &str) -> PathBuf {
    if corpus_present() {
        trace(rel)
    } else {
        note_generated(&format!("{rel} (in its place {instead})"));
        trace(instead)
    }
}

/// Every capture file in a folder of the public traces (of the generated ones without it).
pub fn traces_in(dir: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = walk(&traces().join(dir))
        .into_iter()
        .filter(|p| {
            p.file_name().is_some_and(|n| {
                n != "SOURCES.md" && n != "README.md" && !n.to_string_lossy().contains(".part-")
            })
        })
        .collect();
    v.sort();
    if !corpus_present() {
        note_generated(&format!("{dir}/ ({} files)", v.len()));
    }
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
