//! `mimic demo` end to end (root, namespaces): the report's JSON must hold both replays, the
//! verdicts and the changed stack.

use std::process::Command;
use std::time::Duration;

use mimic_netemu::lab::LabInfo;
use mimic_netemu::netns;

use crate::common::*;

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
    for c in report["comparisons"].as_array().unwrap() {
        assert!(
            c["paired"]["pairs"].as_u64().unwrap() >= 30,
            "{}",
            c["paired"]
        );
        assert!(!c["verdict"].as_str().unwrap().is_empty());
    }
    let ab = &report["ab"][0];
    assert_eq!(ab["b"].as_str(), Some("replay-change"));
    assert!(ab["n"].as_u64().unwrap() >= 30);
    assert!(ab["wilcoxon_p"].as_f64().unwrap() <= 1.0);
    assert_eq!(report["verdict"].as_array().unwrap().len(), 3);
    assert!(out.join("report.html").exists() && out.join("plots").is_dir());
    assert_lab_gone(&lab);
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
