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
