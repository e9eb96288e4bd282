//! `mimic demo` end to end (root, namespaces): the report's JSON must hold both replays, the
//! verdicts and the changed stack.

use std::process::Command;
use std::time::Duration;

use mimic_netemu::lab::LabInfo;
use mimic_netemu::netns;

use crate::common::*;
use crate::util::{assert_demo_pairs, meta, LabDown};

/// Nothing of lab `name` is left: namespaces, interfaces, runtime directory, processes.
pub fn assert_lab_gone(name: &str) {
    let info = LabInfo::for_name(name).unwrap();
    for ns in info.namespaces() {
        assert!(!netns::exists(ns), "namespace {ns} left behind");
    }
    let links = Command::new("ip").args(["-o", "link"]).output().unwrap();
    assert!(
        !stdout(&links).contains(&format!("{name}-")),
        "interfaces of {name} left behind"
    );
    assert!(
        !info.runtime_dir.exists(),
        "{} left behind",
        info.runtime_dir.display()
    );
    let procs = Command::new("pgrep")
        .args(["-a", "-f", &format!("--lab {name}")])
        .output()
        .unwrap();
    assert!(
        stdout(&procs).trim().is_empty(),
        "processes of {name} left behind: {}",
        stdout(&procs)
    );
}

#[test]
fn demo_runs_end_to_end() {
    require_root("the demo test");
    let tmp = tempdir();
    let out = tmp.path().join("demo");
    let lab = format!("dm{}", std::process::id() % 100_000);
    let o = mimic()
        .args([
            "demo",
            "--out",
            out.to_str().unwrap(),
            "--connections",
            "40",
            "--lab",
            &lab,
        ])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "demo failed: {}{}",
        stdout(&o),
        stderr(&o)
    );
    let text = stdout(&o);
    assert!(
        text.contains("report: ") && text.contains("report.html"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("verdict: replay-change vs replay-current")),
        "{text}"
    );
    // every stage reported its progress
    for n in 1..=6 {
        assert!(
            stderr(&o).contains(&format!("[{n}/6]")),
            "stage {n} missing: {}",
            stderr(&o)
        );
    }
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("report.json")).unwrap()).unwrap();
    let inputs = report["inputs"].as_array().unwrap();
    let labels: Vec<&str> = inputs
        .iter()
        .map(|i| i["label"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["production", "replay-current", "replay-change"]);
    assert_eq!(inputs[1]["role"].as_str(), Some("replay"));
    assert_eq!(inputs[2]["role"].as_str(), Some("replay"));
    // the changed stack is recorded, as read back from the server namespace
    let stack = |k: usize| -> serde_json::Value {
        serde_json::from_str(inputs[k]["meta"]["stack"].as_str().unwrap()).unwrap()
    };
    assert_eq!(stack(1)["initcwnd"].as_u64(), Some(3));
    assert_eq!(stack(2)["initcwnd"].as_u64(), Some(10));
    // both replays pair with production; the change is judged connection by connection
    assert_demo_pairs(&out, &report, 40);
    assert!(report["ab"][0]["wilcoxon_p"].as_f64().unwrap() <= 1.0);
    assert_eq!(report["verdict"].as_array().unwrap().len(), 3);
    assert!(out.join("report.html").exists() && out.join("plots").is_dir());
    assert_lab_gone(&lab);
    significance_gate_on_the_demo_replays(&out);
}

/// The significance-aware rollout gate on real replays: the demo's replays of production under
/// initcwnd 3 and initcwnd 10, and one more replay of production under initcwnd 3 (the only
/// replay this adds). Two replays of the same capture are paired connection by connection, so
/// the gate's interval is a paired bootstrap over the 40 connections.
///
/// The condition asserted is `p25 < -2%` (OTHER's p25 surely more than 2% faster): initcwnd 10
/// saves round trips on responses of a few to a few tens of segments, which sit in the lower
/// half of this workload; its largest responses are bandwidth-bound and barely move (p90
/// within ±5%). Observed intervals for initcwnd 10 against 3: p25 [−91%, −16%] (40
/// connections) and [−81%, −18%] (120 connections); the median's upper bound came out at −7%,
/// −5% and −2% in three runs of 40, too close to −2% to assert, so it is only printed. The two
/// initcwnd-3 replays must stay silent both ways round on p25 and the median, in both
/// directions.
fn significance_gate_on_the_demo_replays(out: &std::path::Path) {
    let db = |f: &str| out.join(f).display().to_string();
    let lab = format!("dg{}", std::process::id() % 100_000);
    let _down = LabDown(lab.clone());
    let o = run(&[
        "replay",
        &db("production.db"),
        "-o",
        &db("replay-current-2.db"),
        "--lab",
        &lab,
        "--stack",
        "initcwnd=3",
    ]);
    assert!(o.status.success(), "replay: {}{}", stdout(&o), stderr(&o));
    assert_lab_gone(&lab);
    // A replay that called its own timing distorted and named the hypervisor's steal as the
    // likely cause moved its response times by the host's error, not the stack's: the gate's
    // verdicts are then printed, not judged (as the lab replay test does not judge such a
    // replay's timing); its exit status and line are checked either way.
    let stolen: Vec<String> = [
        "replay-current.db",
        "replay-change.db",
        "replay-current-2.db",
    ]
    .into_iter()
    .filter(|f| {
        let path = out.join(f);
        let detail: serde_json::Value =
            serde_json::from_str(&meta(&path, "timing_health_detail")).unwrap();
        meta(&path, "timing_health") == "distorted"
            && detail["cause"]
                .as_str()
                .is_some_and(|c| c.contains("hypervisor took"))
    })
    .map(str::to_string)
    .collect();
    let judged = stolen.is_empty();
    if !judged {
        eprintln!(
            "TIMING NOT JUDGED: the gate's verdicts, {} distorted while the hypervisor took the CPU",
            stolen.join(", ")
        );
    }
    // exit status, and the --fail-if line (with the interval and the verdict)
    let gate = |base: &str, other: &str, cond: &str| -> (Option<i32>, String) {
        let o = run(&[
            "compare",
            &db(base),
            &db(other),
            "--fail-if",
            cond,
            "--confidence",
            "95",
        ]);
        let lines: Vec<String> = stderr(&o)
            .lines()
            .filter(|l| l.contains("--fail-if"))
            .map(str::to_string)
            .collect();
        assert_eq!(lines.len(), 1, "{}{}", stdout(&o), stderr(&o));
        // shown with --nocapture: the intervals observed
        eprintln!(
            "{base} -> {other}: exit {:?}: {}",
            o.status.code(),
            lines[0]
        );
        (o.status.code(), lines[0].clone())
    };
    // initcwnd 10 sends the first 10 segments at once: its short responses are faster
    let (code, line) = gate("replay-current.db", "replay-change.db", "p25 < -2%");
    assert!(matches!(code, Some(0 | 1)), "{line}");
    assert!(line.contains("paired over"), "{line}");
    if judged {
        assert_eq!(code, Some(1), "{line}");
        assert!(
            line.contains("at 95% confidence holds for replay-change")
                && line.contains("the whole interval is below"),
            "{line}"
        );
    }
    // for the record (not asserted): the median, and p90 the other way round
    gate("replay-current.db", "replay-change.db", "median < -2%");
    gate("replay-change.db", "replay-current.db", "p90 > +5%");
    // nothing changed: silent, both ways round
    for (base, other) in [
        ("replay-current.db", "replay-current-2.db"),
        ("replay-current-2.db", "replay-current.db"),
    ] {
        for cond in ["p25 < -2%", "p25 > +2%", "median < -2%", "median > +2%"] {
            let (code, line) = gate(base, other, cond);
            assert!(matches!(code, Some(0 | 1)), "{line}");
            assert!(line.contains("paired over"), "{line}");
            if judged {
                assert_eq!(code, Some(0), "{line}");
                assert!(line.contains("does not hold"), "{line}");
            }
        }
    }
}

/// Ctrl-C at any stage (building the lab, synthesizing, replaying) stops the demo with exit
/// 130 and removes the lab. The delays count from the first stage's line: the Ctrl-C handler
/// is in place by then (a SIGINT a fixed time after the spawn could beat it on a loaded
/// machine, and the process then died of the signal).
#[test]
fn demo_interrupted_at_any_stage_exits_130_and_removes_the_lab() {
    use std::io::BufRead;
    require_root("the demo test");
    for (i, after) in [0u64, 60, 2500].into_iter().enumerate() {
        let tmp = tempdir();
        let lab = format!("di{}{i}", std::process::id() % 100_000);
        let mut child = mimic()
            .args([
                "demo",
                "--out",
                tmp.path().join("demo").to_str().unwrap(),
                "--connections",
                "20",
                "--lab",
                &lab,
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let err = child.stderr.take().unwrap();
        let (started_tx, started) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut all = String::new();
            for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                if line.starts_with("[1/") {
                    let _ = started_tx.send(());
                }
                all.push_str(&line);
                all.push('\n');
            }
            all
        });
        if started.recv_timeout(Duration::from_secs(60)).is_err() {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the demo never printed its first stage: {}",
                reader.join().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(after));
        // SAFETY: kill has no memory-safety preconditions; the pid is our own child's.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        let status = child.wait().unwrap();
        let err = reader.join().unwrap();
        assert_eq!(
            status.code(),
            Some(130),
            "interrupted {after} ms after its first stage: {err}"
        );
        assert!(err.contains("interrupted; the lab is removed"), "{err}");
        assert!(
            !err.contains("WARN"),
            "warnings on a clean interrupt: {err}"
        );
        assert_lab_gone(&lab);
    }
}

#[test]
fn demo_without_root_says_so() {
    require_root("the demo test (it drops to an unprivileged user)");
    let tool = require_tool("setpriv");
    let o = Command::new(tool)
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(mimic_bin())
        .args(["demo", "--out", "/tmp/mimic-demo-nonroot-test"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("needs root"), "{}", stderr(&o));
}

/// What the demo refuses before it builds anything: a lab name that exists (it would rebuild
/// that lab, change its stack and remove it), an output directory holding files no demo wrote
/// (it would replace them), and a change that changes nothing (two identical replays).
#[test]
fn demo_refuses_what_it_would_destroy_or_waste() {
    require_root("the demo test");
    let tmp = tempdir();
    let demo = |lab: &str, out: &std::path::Path, extra: &[&str]| {
        mimic()
            .args(["demo", "--out", out.to_str().unwrap(), "--lab", lab])
            .args(extra)
            .output()
            .unwrap()
    };
    // a lab of that name exists (here, what `lab list` counts as one: its runtime directory)
    let lab = format!("dx{}", std::process::id() % 100_000);
    let dir = mimic_netemu::lab::runtime_dir(&lab);
    std::fs::create_dir_all(&dir).unwrap();
    let o = demo(&lab, &tmp.path().join("a"), &[]);
    std::fs::remove_dir(&dir).unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("lab {lab} exists")),
        "{}",
        stderr(&o)
    );
    assert!(
        !tmp.path().join("a").exists(),
        "a refused demo made its --out"
    );
    // a directory of someone else's files
    let theirs = tmp.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::fs::write(theirs.join("workload.db"), "USERDATA").unwrap();
    let o = demo(&lab, &theirs, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("holds files an earlier demo did not write"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        std::fs::read_to_string(theirs.join("workload.db")).unwrap(),
        "USERDATA"
    );
    // a file as --out
    let o = demo(&lab, &theirs.join("workload.db"), &[]);
    assert!(stderr(&o).contains("not a directory"), "{}", stderr(&o));
    // no change to evaluate
    for extra in [
        &["--change", ""][..],
        &["--current", "initcwnd=10", "--change", "initcwnd=10"],
    ] {
        let o = demo(&lab, &tmp.path().join("b"), extra);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("--change is empty") || stderr(&o).contains("changes nothing"),
            "{extra:?}: {}",
            stderr(&o)
        );
    }
    assert_lab_gone(&lab);
}
