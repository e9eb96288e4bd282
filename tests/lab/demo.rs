//! `mimic demo` end to end (root, namespaces): the report's JSON must hold both replays, the
//! verdicts and the changed stack.

use std::process::Command;

use crate::common::*;

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
    // the lab is gone
    assert!(!std::path::Path::new(&format!("/run/netns/{lab}-cli")).exists());
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
