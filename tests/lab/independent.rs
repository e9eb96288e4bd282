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

/// Runs `bench/independent.sh ARGS --out OUT` with this build's mimic; fails the test with its
/// output unless it succeeded. Returns (stdout, stderr).
fn run_testbed(args: &[&str], out: &Path) -> (String, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/independent.sh");
    let o = Command::new(&script)
        .args(args)
        .arg("--out")
        .arg(out)
        .env("MIMIC", mimic_bin())
        .output()
        .unwrap();
    let (so, se) = (stdout(&o), stderr(&o));
    assert!(
        o.status.success(),
        "independent.sh {args:?} failed: {so}{se}"
    );
    (so, se)
}

/// `run_testbed` with the router a QEMU guest on Debian's stock kernel (`--netem-guest`),
/// after checking what a guest run needs (a failure names what is missing).
fn run_guest_testbed(args: &[&str], out: &Path) -> (String, String) {
    crate::util::require_guest_tools(
        "the independent testbed's router guest",
        &["nginx", "curl", "tcpdump", "python3", "sqlite3", "ping"],
    );
    let kernel = crate::util::debian_kernel();
    let kernel_arg = kernel.to_string_lossy();
    let mut all = args.to_vec();
    all.extend(["--netem-guest", &kernel_arg]);
    run_testbed(&all, out)
}

/// The run's `table.json`.
fn table(out: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(out.join("table.json")).unwrap()).unwrap()
}

/// Root and the tools a namespace run of the testbed needs (a failure names what is missing).
fn require_testbed_tools() {
    require_root("the independent testbed");
    for tool in ["nginx", "curl", "tcpdump", "python3", "sqlite3", "ethtool"] {
        require_tool(tool);
    }
}

/// The run's tag (the script names its namespaces on stderr), after checking that none of
/// its namespaces is left.
fn torn_down(se: &str) -> String {
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
    tag
}

/// The testbed's shaping check (before the workload): an error naming each class whose ping
/// RTT or goodput was off.
fn shaping_check_off(t: &serde_json::Value) -> Result<(), String> {
    let off: Vec<String> = get(t, &["shaping_check", "classes"])
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["rtt_ok"] != true || c["goodput_ok"] != true)
        .map(|c| c.to_string())
        .collect();
    if off.is_empty() {
        Ok(())
    } else {
        Err(format!("shaping check off: {}", off.join("; ")))
    }
}

#[test]
fn independent_testbed_quick_run() {
    require_testbed_tools();
    let tmp = tempdir();
    // what the testbed times (htb's departures against the serialization time, the RTT and
    // the bandwidth the analyzer finds from the capture's timestamps) is judged on a run
    // that passed it: a miss while the hypervisor took STOLEN_MAX or more of the CPU runs the
    // testbed again (util::timed_check; a CI-mode run with 13-55% stolen had 79.3% of htb's
    // departures within 5% of the serialization time)
    let (out, so, se, t) = crate::util::timed_check("the testbed's timing", |n| {
        let out = tmp.path().join(format!("ind{n}"));
        let (so, se) = run_testbed(&["--quick", "--no-delay", "--connections", "40"], &out);
        // nothing left behind: the script names its namespaces
        torn_down(&se);
        let t = table(&out);
        let mut off = Vec::new();
        for class in ["isdn-128k", "dsl-4m"] {
            let c = get(&t, &["analyzer", class]);
            // rate-only classes: min RTT is the LAN's; bandwidth by dispersion of real TCP
            let bw = get(c, &["bandwidth"]);
            if get(c, &["min_rtt", "share"]).as_f64().unwrap() < 0.9
                || bw["connections"].as_u64().unwrap() < 10
                || bw["share"].as_f64().unwrap() < 0.8
            {
                off.push(format!("{class}: {c}"));
            }
        }
        // htb releases packets at the stab-corrected IP rate, not on a tick
        let d = get(&t, &["shaper_departures"]);
        if d["within_5pct_of_serialization"].as_f64().unwrap() < 0.8 {
            off.push(format!("shaper departures: {d}"));
        }
        if off.is_empty() {
            Ok((out, so, se, t))
        } else {
            Err(off.join("; "))
        }
    });
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
    let all = get(&t, &["analyzer", "all"]);
    assert_eq!(all["connections"], 40, "{all}");
    assert_eq!(all["not_in_capture"], 0, "{all}");
    for class in ["isdn-128k", "dsl-4m"] {
        let c = get(&t, &["analyzer", class]);
        assert_eq!(c["connections"], 20, "{class}: {c}");
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
    assert!(so.contains("replay fidelity"), "{so}");
}

/// `bench/independent.sh --predict`: the same seeded workload at the server's initcwnd 3 and
/// 10, the 3 capture replayed at 10. The captures must show the windows the routes set (the
/// max of sent - 2 x acked packets: 3 to 5 at initcwnd 3, never 10; 10 to 12 at 10), both runs
/// hold the same connections, and the report carries the KS distances and shifts for every
/// class.
#[test]
fn independent_testbed_predict_quick_run() {
    require_testbed_tools();
    let tmp = tempdir();
    let out = tmp.path().join("pred");
    let (so, se) = run_testbed(
        &["--quick", "--no-delay", "--connections", "40", "--predict"],
        &out,
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
    // The two replays of the initcwnd 3 capture (at 3, the baseline, and at 10, the
    // prediction) hold every connection the replay says it replayed: a connection it did not
    // (skipped as incomplete in the capture, left out without a rate, failed, or missing from
    // the replay's own capture)
    // is in its summary, and at most 5% of them may be so (the replay criterion of issue 22;
    // a CI-mode run of 2026-12-03 with up to 34% of the CPU stolen had one isdn-128k
    // connection in neither replay).
    let not_replayed = |f: &str| -> (u64, String) {
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join(f)).unwrap()).unwrap();
        let left_out = &r["rate_sources"]["left_out"];
        let n = ["skipped_by_select", "failed", "missing"]
            .iter()
            .map(|k| &r[*k])
            .chain([left_out])
            .map(|v| v.as_u64().unwrap_or_else(|| panic!("{f}: {r}")))
            .sum::<u64>();
        let why = format!(
            "{f}: {} replayed, {} ok, {} failed, {} missing from its capture, {} skipped by \
             --select, {left_out} left out without a rate",
            r["connections"], r["ok"], r["failed"], r["missing"], r["skipped_by_select"]
        );
        eprintln!("{why}");
        (n, why)
    };
    let replays = [
        ("replay_from", not_replayed("iw3/replay.json")),
        ("predicted_to", not_replayed("predicted.json")),
    ];
    for (_, (n, why)) in &replays {
        assert!(n * 20 <= 40, "more than 5% of 40 not replayed: {why}");
    }
    for g in ["isdn-128k", "dsl-4m", "all"] {
        let r = get(&p, &["groups", g]);
        let n = get(r, &["connections"]);
        let want = if g == "all" { 40 } else { 20 };
        for k in ["real_from", "real_to"] {
            assert_eq!(n[k], want, "{g} {k}: {r}");
        }
        for (k, (lost, why)) in &replays {
            let got = n[*k].as_u64().unwrap();
            assert!(
                got <= want && got + lost >= want,
                "{g} {k}: {got} of {want}, and the replay accounts for {lost} not replayed ({why}): {r}"
            );
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

/// The testbed's delay and loss classes through netem in a router guest on Debian's stock
/// kernel (`--netem-guest`, issue 18): one guest boot, a short run of two classes with delay.
/// The testbed's own htb + netem shape the guest's NICs; the shaping check before the workload
/// finds each class's ping RTT at 2 × delay + the base RTT and its download goodput at the rate;
/// the analyzer finds the configured RTT; the replay pairs every connection; and neither the
/// guest nor the namespaces are left behind.
#[test]
fn independent_testbed_delay_classes_in_a_netem_guest() {
    let tmp = tempdir();
    // the shaping check times the guest's netem and htb, whose timers are the host's CPU
    // time: a run that misses it while the hypervisor took STOLEN_MAX (1.5%) or more of the CPU
    // is run again, and one that missed in every try, each stolen from, is not judged
    // (util::timed_check_unless_stolen; CI-mode runs with 5-14% stolen got dsl-4m's goodput
    // 25.7% low, and with 9.0-21.6% stolen 11.0-25.6% low in all three tries). What does not
    // time anything is judged on the last run either way; the timings on the run that passed.
    let mut last = None;
    let judged = crate::util::timed_check_unless_stolen("the testbed's shaping check", |n| {
        let out = tmp.path().join(format!("ind{n}"));
        let (so, se) = run_guest_testbed(&["--quick", "--connections", "20"], &out);
        let t = table(&out);
        let off = shaping_check_off(&t);
        last = Some((out, so, se, t));
        off
    })
    .is_some();
    let (out, so, se, t) = last.expect("the testbed ran");
    let tag = torn_down(&se);
    let ps = Command::new("pgrep")
        .args(["-f", &format!("mimic-{tag}-emu")])
        .output()
        .unwrap();
    assert!(
        stdout(&ps).trim().is_empty(),
        "QEMU of {tag} left behind: {}",
        stdout(&ps)
    );
    assert!(se.contains("clients: 20 of 20 connections ok"), "{se}");
    assert!(se.contains("0 packets dropped by kernel"), "{se}");
    let router = t["router"].as_str().unwrap_or_default();
    assert!(
        router.contains("QEMU guest") && router.contains("netem"),
        "{router}"
    );
    // the shaping check: both classes within its tolerances, RTT 2 x delay + base
    let base_ms = t["base_rtt_us"].as_f64().unwrap() / 1000.0;
    let checks = get(&t, &["shaping_check", "classes"]).as_array().unwrap();
    assert_eq!(checks.len(), 2, "{checks:?}");
    for c in checks {
        let want = 2.0 * c["delay_ms"].as_f64().unwrap() + base_ms;
        assert!(
            (c["rtt_expected_ms"].as_f64().unwrap() - want).abs() < 1e-6,
            "{c}"
        );
        if judged {
            assert_eq!(c["rtt_ok"], true, "ping RTT off: {c}");
            assert_eq!(c["goodput_ok"], true, "goodput off: {c}");
        }
    }
    // the truth carries the configured delay; the analyzer finds that RTT
    let truth = std::fs::read_to_string(out.join("truth.csv")).unwrap();
    assert!(
        truth.lines().skip(1).all(|l| {
            let f: Vec<&str> = l.split(',').collect();
            match f[1] {
                "isdn-128k" => f[10] == "100" && f[11] == "100",
                "dsl-4m" => f[10] == "20" && f[11] == "20",
                _ => false,
            }
        }),
        "{truth}"
    );
    for class in ["isdn-128k", "dsl-4m"] {
        let c = get(&t, &["analyzer", class]);
        assert_eq!(c["connections"], 10, "{class}: {c}");
        // the RTT the analyzer found is the guest's delay as timed then
        assert!(
            !judged || get(c, &["min_rtt", "share"]).as_f64().unwrap() >= 0.9,
            "{class}: {c}"
        );
        assert!(get(&t, &["loss", class, "configured"]).as_f64().unwrap() == 0.0);
    }
    let r = get(&t, &["replay_fidelity", "all"]);
    assert_eq!(r["replayed"], 20, "{r}");
    assert_eq!(r["failed"], 0, "{r}");
    assert!(so.contains("shaping check"), "{so}");
    assert!(so.contains("shapers: QEMU guest"), "{so}");
}

/// The two classes over 12 Mbit/s in the router guest (issue 18): htb's bucket of less than a
/// packet lost 12% of 25 Mbit/s and 24% of 50 Mbit/s to the TCG guest's late timers, so there
/// they are shaped by netem's rate (a serializing link) with one client address each. The
/// shaping check holds both within its tolerances, the truth and the check name the shaper,
/// each class runs on one address, and the analyzer finds the path's RTT: between the configured
/// one and what a typical ping took through the class's shaper (each with what the router's own
/// delay added while the connection ran).
#[test]
fn independent_testbed_fast_classes_in_a_netem_guest() {
    let tmp = tempdir();
    // the shaping check times the guest's netem (its goodput at 25 and 50 Mbit/s): a miss
    // while the hypervisor took STOLEN_MAX or more of the CPU runs the testbed again, and one
    // that missed in every try, each stolen from, is not judged
    // (util::timed_check_unless_stolen; a CI-mode run with 5-13% stolen got fibre-50m's
    // goodput 11.6% low). What does not time anything is judged on the last run either way.
    let mut last = None;
    let judged = crate::util::timed_check_unless_stolen("the testbed's shaping check", |n| {
        let out = tmp.path().join(format!("ind{n}"));
        let (so, se) = run_guest_testbed(
            &[
                "--classes",
                "cable-25m,fibre-50m",
                "--connections",
                "20",
                "--no-replay",
            ],
            &out,
        );
        // the tables (analyzer, shaping check, router load) go with a failure's output
        println!("{so}");
        torn_down(&se);
        let t = table(&out);
        let off = shaping_check_off(&t).and_then(|()| fast_min_rtt_off(&t));
        last = Some((out, se, t));
        off
    })
    .is_some();
    let (out, se, t) = last.expect("the testbed ran");
    assert!(se.contains("clients: 20 of 20 connections ok"), "{se}");
    // one address a class (--fast-addrs' default in the guest), netem's rate
    let classes = std::fs::read_to_string(out.join("classes.txt")).unwrap();
    for l in classes.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(f.get(8..10), Some(&["1", "netem-rate"][..]), "{classes}");
    }
    let truth = std::fs::read_to_string(out.join("truth.csv")).unwrap();
    let mut lines = truth.lines();
    assert!(lines.next().unwrap().ends_with(",shaper"), "{truth}");
    assert!(lines.all(|l| l.ends_with(",netem-rate")), "{truth}");
    let checks = get(&t, &["shaping_check", "classes"]).as_array().unwrap();
    assert_eq!(checks.len(), 2, "{checks:?}");
    for c in checks {
        assert_eq!(c["shaper"], "netem-rate", "{c}");
        if judged {
            assert_eq!(c["rtt_ok"], true, "ping RTT off: {c}");
            assert_eq!(c["goodput_ok"], true, "goodput off: {c}");
        }
    }
    // On a 5 or 2 ms path two things the configuration does not hold are as large as the 1 ms
    // tolerance: the TCG router's own delay under the workload (0.3-1.5 ms, measured by the
    // unshaped path's pings) and netem's late timers, by a different amount for each packet
    // (the shaping check's 20 pings through the class's own shaper: 0.06-3.0 ms late, 1.0-2.5
    // ms on average). A connection's min RTT is the least of its few samples, each that late:
    // CI found cable-25m 5/10 within 1 ms of 2 x delay + base (median 0.87 ms over, the router
    // adding nothing), and, judged against the pings' minimum instead, fibre 8/10 where one
    // ping of 20 came back 0.06 ms late and their average 1.83 ms. So the truth is a range,
    // from 2 x delay + the router's delay then (netem is never early) up to what a typical
    // packet took (the pings' average) plus the same: the analyzer must fall within 1 ms (or
    // 10%) of it for 90% of the connections and within 1 ms at the median. An analyzer early
    // by more than 1 ms, or late by more than the pings' average lateness and 1 ms, fails.
    for class in ["cable-25m", "fibre-50m"] {
        let c = get(&t, &["analyzer", class]);
        assert_eq!(c["shaper"], "netem-rate", "{class}: {c}");
        assert_eq!(c["connections"], 10, "{class}: {c}");
        assert_eq!(
            get(c, &["min_rtt_concurrent_base", "n"]),
            10,
            "{class}: {c}"
        );
        assert_eq!(get(c, &["min_rtt_ping_range", "n"]), 10, "{class}: {c}");
    }
    // (judged in the timed check above, fast_min_rtt_off)
}

/// The fast classes' min RTT against the path's range (the comment above its call): `Err`
/// with what missed. Timed, as the shaping check is: netem's timers in the TCG guest fire
/// later while the hypervisor takes the CPU (a CI-mode run of 2026-12-03 with 6.9% stolen
/// during the testbed: cable-25m 8 of 10 within the range, where 90% is asked; earlier runs
/// 10 of 10).
fn fast_min_rtt_off(t: &serde_json::Value) -> Result<(), String> {
    let mut off = Vec::new();
    for class in ["cable-25m", "fibre-50m"] {
        let c = get(t, &["analyzer", class]);
        let range = get(c, &["min_rtt_ping_range"]);
        let share = range["share"].as_f64().unwrap_or(0.0);
        let med = range["median_error_ms"].as_f64().unwrap_or(f64::NAN);
        if share < 0.9 || med.is_nan() || med.abs() > 1.0 {
            off.push(format!(
                "{class}: min RTT within the path's range for {:.0}% (90% asked), median error {med} ms (1 ms allowed): {c}",
                100.0 * share
            ));
        }
    }
    if off.is_empty() {
        Ok(())
    } else {
        Err(off.join("; "))
    }
}

/// `--netem-guest` without an image in the kernel cache names what is missing and how to get
/// it, before building anything.
#[test]
fn independent_testbed_netem_guest_without_a_kernel_says_so() {
    require_root("the independent testbed");
    let tmp = tempdir();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/independent.sh");
    let o = Command::new(&script)
        .args(["--quick", "--netem-guest", "--out"])
        .arg(tmp.path().join("ind"))
        .env("MIMIC", mimic_bin())
        .env("MIMIC_CACHE_DIR", tmp.path().join("empty-cache"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let se = stderr(&o);
    assert!(
        se.contains("no kernel image in") && se.contains("mimic lab fetch-kernel"),
        "{se}"
    );
    let o = Command::new(&script)
        .args(["--quick", "--netem-guest", "/nonexistent/vmlinuz", "--out"])
        .arg(tmp.path().join("ind2"))
        .env("MIMIC", mimic_bin())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("/nonexistent/vmlinuz: no such kernel image"),
        "{}",
        stderr(&o)
    );
}
