//! `bench/independent.sh` (the independent-truth testbed: nginx, a Python query server, curl
//! and a Python client behind the kernel's htb, captured with tcpdump) works end to end on a
//! short rate-only run: every connection the clients made is found in the analysis and
//! paired with its replay, the tables come out in all three formats, the shaper releases
//! packets at the configured rate, and nothing of the testbed is left behind.

use std::path::Path;
use std::process::Command;

use crate::common::*;

fn get<'a>(v: &'a serde_json::Value, path: &[&str]) -> &'a serde_json::Value {
    path.iter().fold(v, |v, k| &v[*k])
}

#[test]
fn independent_testbed_quick_run() {
    require_root("the independent testbed");
    for tool in ["nginx", "curl", "tcpdump", "python3", "sqlite3", "ethtool"] {
        require_tool(tool);
    }
    let tmp = tempdir();
    let out = tmp.path().join("ind");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/independent.sh");
    let o = Command::new(&script)
        .args(["--quick", "--no-delay", "--connections", "40", "--out"])
        .arg(&out)
        .env("MIMIC", mimic_bin())
        .output()
        .unwrap();
    let (so, se) = (stdout(&o), stderr(&o));
    assert!(o.status.success(), "independent.sh failed: {so}{se}");
    // nothing left behind: the script names its namespaces
    let tag = se
        .lines()
        .find_map(|l| l.strip_prefix("independent: namespaces "))
        .unwrap_or_else(|| panic!("no namespaces line: {se}"))
        .split('-')
        .next()
        .unwrap()
        .to_string();
    let ns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    assert!(
        !stdout(&ns).contains(&format!("{tag}-")),
        "namespaces of {tag} left behind: {}",
        stdout(&ns)
    );
    assert!(se.contains("clients: 40 of 40 connections ok"), "{se}");
    assert!(se.contains("0 packets dropped by kernel"), "{se}");
    for f in [
        "table.txt",
        "table.csv",
        "analyzer.csv",
        "replay.csv",
        "truth.csv",
    ] {
        assert!(out.join(f).is_file(), "{f} missing in {}", out.display());
    }
    let t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("table.json")).unwrap()).unwrap();
    let all = get(&t, &["analyzer", "all"]);
    assert_eq!(all["connections"], 40, "{all}");
    assert_eq!(all["not_in_capture"], 0, "{all}");
    for class in ["isdn-128k", "dsl-4m"] {
        let c = get(&t, &["analyzer", class]);
        assert_eq!(c["connections"], 20, "{class}: {c}");
        // rate-only classes: min RTT is the LAN's; bandwidth by dispersion of real TCP
        assert!(
            get(c, &["min_rtt", "share"]).as_f64().unwrap() >= 0.9,
            "{class}: {c}"
        );
        let bw = get(c, &["bandwidth"]);
        assert!(bw["connections"].as_u64().unwrap() >= 10, "{class}: {bw}");
        assert!(bw["share"].as_f64().unwrap() >= 0.8, "{class}: {bw}");
    }
    let r = get(&t, &["replay_fidelity", "all"]);
    assert_eq!(r["replayed"], 40, "{r}");
    assert_eq!(r["failed"], 0, "{r}");
    // the per-class pairing agrees with mimic compare's own
    let mc = get(&t, &["replay_fidelity", "mimic_compare"]);
    assert_eq!(mc["pairs"], 40, "{mc}");
    let ours = r["share"].as_f64().unwrap();
    assert!(
        (mc["within_20"].as_f64().unwrap() - ours).abs() < 1e-9,
        "{mc} vs {r}"
    );
    // htb releases packets at the stab-corrected IP rate, not on a tick
    let d = get(&t, &["shaper_departures"]);
    assert!(
        d["within_5pct_of_serialization"].as_f64().unwrap() >= 0.8,
        "{d}"
    );
    assert!(so.contains("replay fidelity"), "{so}");
}

/// `bench/independent.sh --predict`: the same seeded workload at the server's initcwnd 3 and
/// 10, the 3 capture replayed at 10. The captures must show the windows the routes set (the
/// max of sent - 2 x acked packets: 3 to 5 at initcwnd 3, never 10; 10 to 12 at 10), both runs
/// hold the same connections, and the report carries the KS distances and shifts for every
/// class.
#[test]
fn independent_testbed_predict_quick_run() {
    require_root("the independent testbed");
    for tool in ["nginx", "curl", "tcpdump", "python3", "sqlite3", "ethtool"] {
        require_tool(tool);
    }
    let tmp = tempdir();
    let out = tmp.path().join("pred");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/independent.sh");
    let o = Command::new(&script)
        .args([
            "--quick",
            "--no-delay",
            "--connections",
            "40",
            "--predict",
            "--out",
        ])
        .arg(&out)
        .env("MIMIC", mimic_bin())
        .output()
        .unwrap();
    let (so, se) = (stdout(&o), stderr(&o));
    assert!(
        o.status.success(),
        "independent.sh --predict failed: {so}{se}"
    );
    assert_eq!(
        se.matches("clients: 40 of 40 connections ok").count(),
        2,
        "two runs of the workload: {se}"
    );
    for run in ["iw3", "iw10"] {
        let iw = std::fs::read_to_string(out.join(run).join("server_initcwnd")).unwrap();
        assert_eq!(iw.trim(), &run[2..], "{run}");
        // the same seeded plan in both runs
        assert_eq!(
            std::fs::read_to_string(out.join(run).join("truth.csv")).unwrap(),
            std::fs::read_to_string(out.join("iw3/truth.csv")).unwrap(),
            "{run}"
        );
    }
    for f in [
        "prediction.txt",
        "prediction.csv",
        "predicted.db",
        "compare.json",
    ] {
        assert!(out.join(f).is_file(), "{f} missing in {}", out.display());
    }
    let p: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("prediction.json")).unwrap())
            .unwrap();
    for (run, iw) in [("iw3", 3u64), ("iw10", 10)] {
        let fl = get(&p, &["first_flights", run]);
        assert!(fl["connections"].as_u64().unwrap() >= 5, "{run}: {fl}");
        for (w, n) in fl["flights"].as_object().unwrap() {
            let w: u64 = w.parse().unwrap();
            assert!(
                (iw..=iw + 2).contains(&w),
                "{run}: {n} connections with a window of {w}: {fl}"
            );
        }
    }
    for g in ["isdn-128k", "dsl-4m", "all"] {
        let r = get(&p, &["groups", g]);
        let n = get(r, &["connections"]);
        let want = if g == "all" { 40 } else { 20 };
        for k in ["real_from", "real_to", "replay_from", "predicted_to"] {
            assert_eq!(n[k], want, "{g} {k}: {r}");
        }
        let d = get(r, &["ks_predicted_vs_real_to", "d"]).as_f64().unwrap();
        assert!((0.0..=1.0).contains(&d), "{g}: {r}");
        assert!(r["median_shift_real_us"].is_number(), "{g}: {r}");
        assert!(r["median_shift_predicted_us"].is_number(), "{g}: {r}");
    }
    // the Python KS agrees with mimic compare's on the same two distributions
    let ours = get(&p, &["groups", "all", "ks_predicted_vs_real_to", "d"]);
    let theirs = get(&p, &["mimic_compare_ks_predicted_vs_real_to", "d"]);
    assert!(
        (ours.as_f64().unwrap() - theirs.as_f64().unwrap()).abs() < 1e-9,
        "{ours} vs {theirs}"
    );
    assert!(
        so.contains("prediction of the server's initcwnd 3 -> 10"),
        "{so}"
    );
}
