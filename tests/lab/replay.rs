//! `mimic synth` / `mimic replay` / `mimic serve` lab tests (root, namespaces).
//!
//! The end-to-end test is also the analyzer's accuracy harness: a synthetic workload with
//! known truth is replayed through the lab, the server-side capture analyzed, and every
//! inferred parameter compared with the truth (the table is printed).

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use mimic_netemu::lab::LabInfo;
use mimic_netemu::netns;

use crate::common::*;
use crate::util::{
    json, lab_name, ok, stolen_during, timed_check_unless_stolen, LabDown, STOLEN_MAX, TIMED_TRIES,
};

fn preflight() {
    require_root("replay lab tests");
    for t in ["ip", "ethtool", "sysctl"] {
        require_tool(t);
    }
}

/// synth (all client classes) → replay in a lab the replay builds and removes → analysis of
/// the server-side capture; the inferred parameters must match the truth. Then the capture,
/// analyzed as an "original", is replayed again and compared (Monkey §5.1 fidelity).
#[test]
fn synth_replay_recovers_the_truth_and_replays_faithfully() {
    preflight();
    let tmp = tempdir();
    let d = tmp.path();
    let p = |f: &str| d.join(f).display().to_string();
    let s = json(&ok(&[
        "synth",
        "--connections",
        "320",
        "--rate",
        "20",
        "--seed",
        "7",
        "-o",
        &p("synth.db"),
        "--json",
    ]));
    for (class, n) in s["by_class"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v[0].as_str().unwrap(), v[1].as_u64().unwrap()))
    {
        assert!(n > 0, "no {class} connection in the workload");
    }
    let name = lab_name("rp");
    let _down = LabDown(name.clone());
    // The replay judges its own timing (replay/src/orchestrate/health.rs). A run it calls
    // distorted is run again, as GUIDE tells an operator to, up to three runs in all, and the
    // last must be healthy: on this project's VMs the hypervisor stops a vCPU for
    // milliseconds now and then (a CI-mode run of 2026-12-01 at load 0.3: starts, departures
    // and server delays all p99 3.9-5.2 ms late, where the same test alone gave p99 61-111
    // us), which no part of mimic can undo, while a regression in any part is late in every
    // run. Only where the hypervisor took at least STOLEN_MAX of the machine's CPU during
    // each of the three is the timing not held against mimic: then the replay must have
    // called itself distorted, with its reasons (what an operator would be told), and every
    // check below that is not about timing still holds. Measured: healthy runs had 0.01-1.2%
    // stolen (10 and 930 ms in 42 s on 2 CPUs, 2026-12-01); on 2026-12-02 every run of this
    // build and of 34cd14a (the last that passed CI) was distorted, with 3.6-8.4% stolen
    // (3,060-7,060 ms a run), where a busy loop on both CPUs lost 0.9%.
    const RUNS: usize = TIMED_TRIES;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let replay = || {
        let _ = std::fs::remove_dir_all(d.join("cap"));
        let (r, stolen, share) = stolen_during(|| {
            json(&ok(&[
                "replay",
                &p("synth.db"),
                "-o",
                &p("replay.db"),
                "--lab",
                &name,
                "--keep-capture",
                &p("cap"),
                "--json",
            ]))
        });
        eprintln!(
            "the hypervisor stole {stolen:.0} ms of CPU during the replay ({:.2}% of {cpus} \
             CPUs' time); its timing health: {}",
            share * 100.0,
            r["timing"]
        );
        (r, stolen, share)
    };
    let (mut r, mut stolen, share) = replay();
    let mut all_stolen = share >= STOLEN_MAX;
    for run in 2..=RUNS {
        if r["timing"]["verdict"] == "ok" {
            break;
        }
        eprintln!(
            "replay {} of at most {RUNS} was distorted: replaying once more",
            run - 1
        );
        let (again, again_stolen, share) = replay();
        (r, stolen) = (again, again_stolen);
        all_stolen &= share >= STOLEN_MAX;
    }
    // the replay measured the steal too, over its own run (inside this one: no more than
    // what was stolen here, a clock tick per CPU aside)
    let own = r["timing"]["stolen_ms"]
        .as_u64()
        .unwrap_or_else(|| panic!("no stolen_ms in the timing health: {}", r["timing"]));
    assert!(
        own as f64 <= stolen + 10.0 * cpus as f64,
        "the replay counted {own} ms stolen, more than the {stolen} ms around it"
    );
    assert_eq!(r["connections"].as_u64(), Some(320));
    assert_eq!(r["failed"].as_u64(), Some(0), "{r}");
    assert_eq!(r["missing"].as_u64(), Some(0));
    // shown with --show-output, so that a CI log tells how close the run came to the bounds
    eprintln!("server delay errors: {}", r["server"]);
    eprintln!(
        "start lateness p50, p99, max (µs): {}",
        r["start_lateness_us"]
    );
    // the replay judged its own timing (replay/src/orchestrate/health.rs): every pipe's delay
    // was measured back in the connections' min RTT, and no part ran late; the verdict and its
    // figures are in meta, for `mimic compare` to warn about
    let t = &r["timing"];
    let timing_judged = t["verdict"] == "ok" || !all_stolen;
    if timing_judged {
        assert_eq!(t["verdict"], "ok", "{t}");
    } else {
        eprintln!(
            "TIMING NOT JUDGED: all {RUNS} replays distorted while the hypervisor took at \
             least {:.1}% of the CPU during each; the replay said so: {t}",
            STOLEN_MAX * 100.0
        );
        assert_eq!(t["verdict"], "distorted", "{t}");
        // and it named the likely cause
        assert!(
            t["cause"]
                .as_str()
                .is_some_and(|c| c.contains("hypervisor took")),
            "{t}"
        );
        let reasons = t["reasons"].as_array().unwrap();
        assert!(
            reasons
                .iter()
                .any(|r| r.as_str().unwrap().contains("late (at most")),
            "a distorted replay names what ran late: {t}"
        );
    }
    assert!(t["rtt_judged"].as_u64().unwrap() >= 300, "{t}");
    // the share of pipes whose delay came back in the min RTT is timed too (a lab run on
    // 2026-12-03 with 19.4% stolen had 87.8%, and the replay called itself distorted for it)
    assert!(
        !timing_judged || t["rtt_agree"].as_f64().unwrap() >= 0.9,
        "{t}"
    );
    assert!(t["departure_late_p99_us"].as_u64().is_some(), "{t}");
    let c = rusqlite::Connection::open(p("replay.db")).unwrap();
    let meta = |k: &str| -> String {
        c.query_row("SELECT value FROM meta WHERE key = ?1", [k], |r| r.get(0))
            .unwrap_or_else(|e| panic!("meta {k}: {e}"))
    };
    assert_eq!(meta("timing_health"), t["verdict"].as_str().unwrap());
    let detail: serde_json::Value = serde_json::from_str(&meta("timing_health_detail")).unwrap();
    assert_eq!(&detail, t);
    drop(c);
    // both emulators' timer threads ran real-time within their budgets (root, as in CI):
    // without it a deadline waits up to a scheduler tick (4 ms) on a busy CPU
    let missing = "SCHED_FIFO for the timer threads was refused: needs root (or CAP_SYS_NICE) \
                   and real-time runtime in the process's cpu cgroup";
    assert_eq!(
        r["server"]["timer_realtime"].as_bool(),
        Some(true),
        "{missing}: {r}"
    );
    assert_eq!(
        r["client_timer_realtime"].as_bool(),
        Some(true),
        "{missing}: {r}"
    );
    // the server keeps its delays: typically to the microsecond (p50 < 100 µs), p99 within the
    // replay's own timing-health bound (2 ms, health.rs LATE_P99_MAX_US), and 97% of both kinds
    // together within 1 ms. On the earlier sessions' VM: p99 19-164 µs in fourteen runs with
    // real-time timer threads, at most one delay a run over 1 ms (before them a woken timer
    // thread could wait a scheduler tick: a CI run had p99 2.6 ms). On the 2026-11-28 VM,
    // whose hypervisor steals 0.6-1 s of CPU a run in bursts, four CI-mode runs: two within
    // 1% over 1 ms, then query p99 1.48 ms, then 21 of 897 over 1 ms (2.3%; response p99 1.64
    // ms, max 3.0 ms) while the client's starts and the emulator's departures were as late
    // (p99 1.6-1.8 ms): the host, not the server's timers.
    // (the medians hold to 100 µs on any host but one whose hypervisor keeps taking the CPU;
    // the tails only where the timing is judged, above)
    let (mut over, mut count) = (0, 0);
    for kind in ["response_delay_error", "query_delay_error"] {
        let e = &r["server"][kind];
        let get = |k: &str| e[k].as_u64().unwrap_or_else(|| panic!("{kind}.{k}: {e}"));
        assert!(get("count") > 0, "{kind}: {e}");
        // (a replay whose timing is not judged ran while the hypervisor took STOLEN_MAX (1.5%) or more of
        // the CPU in each try: its median need only be within the server's 1 ms; a CI-mode
        // run with 14% stolen had a query-delay median of 117 µs)
        let p50_max = if timing_judged { 100 } else { 1_000 };
        assert!(get("p50_us") < p50_max, "{kind}: {e}");
        assert!(
            !timing_judged || get("p99_us") < mimic_replay::orchestrate::health::LATE_P99_MAX_US,
            "{kind}: {e}"
        );
        over += get("over_1ms");
        count += get("count");
    }
    assert!(
        !timing_judged || over * 100 <= count * 3,
        "{over} of {count} server delays more than 1 ms off: {}",
        r["server"]
    );
    // with two CPUs or more the datapath runs on the last one alone, the timers elsewhere
    if cpus >= 2 {
        let split = &r["cpu_split"];
        let dp = split["datapath"]
            .as_u64()
            .unwrap_or_else(|| panic!("no CPU split: {r}"));
        let timers = mimic_core::cpu::parse_list(split["timers"].as_str().unwrap()).unwrap();
        assert!(
            !timers.is_empty() && !timers.contains(&(dp as usize)),
            "{split}"
        );
    }
    // the clients' recorded RST closes reach the server as resets between exchanges, not as
    // I/O errors
    let resets: i64 = rusqlite::Connection::open(d.join("synth.db"))
        .unwrap()
        .query_row(
            "SELECT count(*) FROM connections WHERE termination = 'rst_after_response'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(resets > 0, "the workload has no RST closes");
    assert_eq!(
        r["server"]["client_resets"].as_i64(),
        Some(resets),
        "{}",
        r["server"]
    );
    assert_eq!(
        r["server"]["io_errors"].as_u64(),
        Some(0),
        "{}",
        r["server"]
    );
    // the replay built the lab and removed it, with nothing left behind
    crate::demo::assert_lab_gone(&name);

    // where the replay was captured and what answered it
    {
        let db = rusqlite::Connection::open(d.join("replay.db")).unwrap();
        let meta = |k: &str| -> String {
            mimic_core::db::get_meta(&db, k)
                .unwrap()
                .unwrap_or_else(|| panic!("no meta {k}"))
        };
        assert_eq!(meta("capture_vantage"), "server");
        assert_eq!(
            meta("capture_iface"),
            LabInfo::for_name(&name).unwrap().srv_if
        );
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        assert_eq!(
            meta("server_kernel"),
            kernel.trim(),
            "the lab's server shares the host kernel"
        );
        let stack: serde_json::Value = serde_json::from_str(&meta("server_stack"))
            .unwrap_or_else(|e| panic!("server_stack: {e}: {}", meta("server_stack")));
        assert!(stack["cc"].is_string(), "{stack}");
        assert!(stack["rmem"].is_array(), "{stack}");
        assert!(!meta("server_stack_spec").is_empty());
        assert_eq!(meta("server_stack_error"), "");
        assert!(!meta("stack").is_empty(), "the lab's read-back profile");
        assert_eq!(r["capture_vantage"], "server", "{r}");
        assert!(r["server_host"]["kernel"].is_string(), "{r}");
    }

    let check = Command::new(mimic_bin())
        .args(["synth", "check", &p("synth.db"), &p("replay.db")])
        .output()
        .unwrap();
    eprintln!("{}", stdout(&check));
    // its criteria (min RTT within 10% or 1 ms for 95%, delays within 2 ms, …) are timed
    // figures: held where the replay's timing is judged; otherwise the check must still run
    // and judge (exit 0, or 1 for a criterion missed), not fail on its input
    if timing_judged {
        assert!(
            check.status.success(),
            "accuracy criteria missed:\n{}",
            stdout(&check)
        );
    } else {
        assert!(
            matches!(check.status.code(), Some(0 | 1)),
            "synth check failed: {}{}",
            stdout(&check),
            String::from_utf8_lossy(&check.stderr)
        );
        if !check.status.success() {
            eprintln!("TIMING NOT JUDGED: the accuracy criteria above were missed by a replay distorted while stolen from");
        }
    }

    // fidelity: the lab capture is the "original"; its replay should match it connection by
    // connection
    let caps: Vec<String> = std::fs::read_dir(d.join("cap"))
        .unwrap()
        .map(|e| e.unwrap().path().display().to_string())
        .collect();
    assert!(!caps.is_empty());
    let mut args = vec![
        "analyze".to_string(),
        "-q".into(),
        "-o".into(),
        p("flows.db"),
        "--server-port".into(),
        "80".into(),
    ];
    args.extend(caps);
    let o = mimic().args(&args).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    // response times are the host's timing too: a replay that misses while the hypervisor
    // took the CPU is replayed again, and not judged where it took it in every try (a CI-mode
    // run with 17% stolen: 84.7% within ±20%, the replay calling itself distorted)
    timed_check_unless_stolen("the replay of the lab capture within ±20%", |n| {
        let name2 = lab_name("rp");
        let _down2 = LabDown(name2.clone());
        let again = p(&format!("again{n}.db"));
        ok(&["replay", &p("flows.db"), "-o", &again, "--lab", &name2]);
        let cmp = json(&ok(&["compare", &p("flows.db"), &again, "--json", "-"]));
        // both captured at the server: no vantage warning
        assert!(
            cmp["comparisons"][0]["vantage_warning"].is_null(),
            "{}",
            cmp["comparisons"][0]["vantage_warning"]
        );
        let text = ok(&["compare", &p("flows.db"), &again]);
        eprintln!("{}", stdout(&text));
        let paired = &cmp["comparisons"][0]["paired"]["overall"];
        let within20 = paired["within_20"]
            .as_f64()
            .unwrap_or_else(|| panic!("no paired share in {}", cmp["comparisons"][0]));
        if within20 >= 0.90 {
            Ok(())
        } else {
            Err(format!(
                "only {:.1}% of connections within ±20%",
                within20 * 100.0
            ))
        }
    });
}

/// The three roles as separate processes started by hand, driven over their control channels
/// (the remote path): the replay runs in the client namespace like a remote client host. A
/// controller with another PKI's key is refused; the server's replay port refuses (and
/// counts) a client outside the ranges the controller announced; both roles go on serving
/// the legitimate controller.
#[test]
fn remote_roles_over_authenticated_control_channels() {
    preflight();
    let tmp = tempdir();
    let d = tmp.path();
    let p = |f: &str| d.join(f).display().to_string();
    ok(&[
        "synth",
        "--connections",
        "30",
        "--rate",
        "30",
        "--seed",
        "3",
        "--max-response",
        "20000",
        "-o",
        &p("synth.db"),
    ]);
    let name = lab_name("rp");
    let _down = LabDown(name.clone());
    ok(&["lab", "up", &name]);
    let info = LabInfo::for_name(&name).unwrap();
    let pki = info.pki_dir.display().to_string();
    let serve_ctl = format!("unix:{}", d.join("serve.sock").display());
    let server = format!("{}:8080", info.server_addr);
    let spawn = |ns: &str, args: &[&str]| {
        netns::command(ns, mimic_bin(), args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    // the router beside the clients and the server on one machine: the replay's spin rule
    let mut emu = spawn(
        &info.ns_emu,
        &["-q", "netemu", "run", "--lab", &name, "--spin-rule", "load"],
    );
    let mut srv = spawn(
        &info.ns_srv,
        &[
            "-q",
            "serve",
            "--listen",
            &server,
            "--control",
            &serve_ctl,
            "--pki",
            &pki,
        ],
    );
    let until = Instant::now() + Duration::from_secs(10);
    while !(d.join("serve.sock").exists() && info.runtime_dir.join("netemu.sock").exists()) {
        assert!(Instant::now() < until, "roles did not come up");
        std::thread::sleep(Duration::from_millis(50));
    }
    let addrs: Vec<String> = (0..4)
        .map(|i| info.pool_addr(i).unwrap().to_string())
        .collect();
    let remote = |out: &str, pki_dir: &str, port: &str, extra: &[&str]| -> Output {
        let mut args = vec![
            "replay".to_string(),
            p("synth.db"),
            "-o".into(),
            p(out),
            "--server".into(),
            format!("{}:{port}", info.server_addr),
            "--server-port".into(),
            port.into(),
            "--server-control".into(),
            serve_ctl.clone(),
            "--netemu".into(),
            info.control.clone(),
            "--pki".into(),
            pki_dir.into(),
            "--json".into(),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        for a in &addrs {
            args.push("--client-addr".into());
            args.push(a.clone());
        }
        netns::command(&info.ns_cli, mimic_bin(), &args)
            .output()
            .unwrap()
    };
    // a controller whose certificate and key come from another `pki init` beside the lab's
    // CA: refused before it dials anyone, naming the mix-up (that the roles refuse such a
    // controller too is control/src/tests.rs's)
    let bad = d.join("bad-pki");
    ok(&["pki", "init", bad.to_str().unwrap()]);
    std::fs::copy(info.pki_dir.join("ca.crt"), bad.join("ca.crt")).unwrap();
    let o = remote("x.db", bad.to_str().unwrap(), "8080", &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("controller.crt: not signed by the CA in"),
        "{}",
        stderr(&o)
    );
    assert!(!d.join("x.db").exists());
    // the lab's own PKI: every connection replayed
    let o = remote("r.db", &pki, "8080", &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r = json(&o);
    assert_eq!(r["ok"].as_u64(), Some(30), "{r}");
    assert_eq!(r["analysis"]["connections"].as_u64(), Some(30));
    // captured by serve at the server host (the default vantage), brought over the control
    // channel and analyzed here; serve keeps no copy
    assert_eq!(r["capture_vantage"], "server", "{r}");
    assert!(
        r["capture"]["written"].as_u64().unwrap_or(0) > 30 * 6,
        "{r}"
    );
    {
        let db = rusqlite::Connection::open(d.join("r.db")).unwrap();
        let meta = |k: &str| -> String {
            db.query_row("SELECT value FROM meta WHERE key = ?1", [k], |r| r.get(0))
                .unwrap()
        };
        assert_eq!(meta("capture_vantage"), "server");
        assert_eq!(meta("capture_iface"), info.srv_if);
        let paired: i64 = db
            .query_row(
                "SELECT count(*) FROM replay_map WHERE status = 'ok' AND replay_conn_id IS NOT NULL",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(paired, 30);
    }
    // (`ip netns exec` execs serve: the child's pid is serve's)
    let serve_dir = std::env::temp_dir().join(format!("mimic-serve-{}", srv.id()));
    assert!(
        !serve_dir.join("capture-1").exists(),
        "serve kept the capture it handed over"
    );
    // the replay announced its four client addresses: a client from the client host's own
    // address (outside them) is reset and counted, never served
    let tls = mimic_control::ControllerTls::load(&info.pki_dir).unwrap();
    let ctl: mimic_control::ControlAddr = serve_ctl.parse().unwrap();
    let refused = || {
        mimic_replay::control::ServeClient::connect(&ctl, &tls)
            .unwrap()
            .stats()
            .unwrap()
            .refused
    };
    let before = refused();
    let probe = netns::command(
        &info.ns_cli,
        "bash",
        [
            "-c",
            &format!(
                "exec 3<>/dev/tcp/{}/8080 && printf 'GET / HTTP/1.0\\r\\n\\r\\n' >&3 && cat <&3",
                info.server_addr
            ),
        ],
    )
    .output()
    .unwrap();
    assert!(
        probe.stdout.is_empty(),
        "an address outside the announced ranges was answered: {:?}",
        String::from_utf8_lossy(&probe.stdout)
    );
    assert_eq!(refused(), before + 1, "the refusal is counted");
    // a port nothing listens on: every connection fails as refused, and the run finishes
    let o = remote("f.db", &pki, "8081", &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r = json(&o);
    assert_eq!(r["failed"].as_u64(), Some(30), "{r}");
    assert_eq!(r["failures"]["refused"].as_u64(), Some(30), "{r}");
    let db = rusqlite::Connection::open(d.join("f.db")).unwrap();
    let failed: i64 = db
        .query_row(
            "SELECT count(*) FROM replay_map WHERE status = 'failed' AND failure = 'refused'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(failed, 30);
    // the workload and pipe options reach the replay and its database
    let o = remote(
        "q.db",
        &pki,
        "8080",
        &[
            "--queue",
            "down=7",
            "--limit",
            "10",
            "--select",
            "all",
            "--seed",
            "5",
            "--time-scale",
            "2",
            "--vantage",
            "client",
            "--capture-iface",
            &info.cli_if,
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let r = json(&o);
    assert_eq!(r["connections"].as_u64(), Some(10), "{r}");
    assert_eq!(r["ok"].as_u64(), Some(10), "{r}");
    let db = rusqlite::Connection::open(d.join("q.db")).unwrap();
    let queues: Vec<(i64, Option<f64>, i64)> = db
        .prepare("SELECT queue_up, down_rate_bps, queue_down FROM replay_pipes")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(queues.len(), 10);
    for (up, rate, down) in queues {
        assert_eq!(down, 7, "downstream queue not overridden");
        let class_up = mimic_core::model::queue_packets(rate).0 as i64;
        assert_eq!(up, class_up, "upstream queue should keep its rate class");
    }
    let meta = |k: &str| -> String {
        db.query_row("SELECT value FROM meta WHERE key = ?1", [k], |r| r.get(0))
            .unwrap()
    };
    assert_eq!(meta("queue"), "up=by rate class,down=7");
    assert_eq!(meta("seed"), "5");
    assert_eq!(meta("time_scale"), "2");
    assert_eq!(meta("select"), "all");
    // captured on the client host (--vantage client --capture-iface), the server's host
    // asked over the control channel
    assert_eq!(meta("capture_vantage"), "client");
    assert!(!meta("server_kernel").is_empty());
    assert!(
        meta("server_stack").contains("\"cc\""),
        "{}",
        meta("server_stack")
    );
    // serve stopped as an operator stops it (SIGTERM) removes its capture directory
    let term = Command::new("kill")
        .args(["-TERM", &srv.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let until = Instant::now() + Duration::from_secs(10);
    while srv.try_wait().unwrap().is_none() {
        assert!(Instant::now() < until, "serve did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!serve_dir.exists(), "{} left behind", serve_dir.display());
    let _ = emu.kill();
    let _ = emu.wait();
}

/// Ctrl-C stops a replay cleanly: exit 130, no output, and no lab debris (the replay built the
/// lab, so it removes it).
#[test]
fn interrupt_leaves_no_debris() {
    preflight();
    let tmp = tempdir();
    let d = tmp.path();
    let p = |f: &str| d.join(f).display().to_string();
    ok(&[
        "synth",
        "--connections",
        "400",
        "--rate",
        "10",
        "-o",
        &p("synth.db"),
    ]);
    let name = lab_name("rp");
    let _down = LabDown(name.clone());
    let mut child = mimic()
        .args(["replay", &p("synth.db"), "-o", &p("r.db"), "--lab", &name])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // wait until the replay is under way (the lab exists and its roles run)
    let info = LabInfo::for_name(&name).unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    while !info.runtime_dir.join("serve.sock").exists() {
        assert!(Instant::now() < until, "replay did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(3));
    // SAFETY: signalling our own child.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "replay did not stop after SIGINT"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(130));
    assert!(!Path::new(&p("r.db")).exists());
    crate::demo::assert_lab_gone(&name);
    // nothing of ours is still running
    let ps = Command::new("ps").args(["-eo", "args"]).output().unwrap();
    assert!(
        !stdout(&ps)
            .lines()
            .any(|l| l.contains(&format!("--lab {name}")) || l.contains(&name)),
        "processes left behind"
    );
}

/// Requests leave at their recorded times within the connection (open loop), never before the
/// previous response plus its think time; `--request-timing think` sends them the think time
/// after the previous response instead. The workload records each later request 700 ms after
/// the one before, with a 1 ms think time, on fast paths where every response takes far less.
#[test]
fn requests_leave_at_their_recorded_times_or_after_the_think_time() {
    preflight();
    let tmp = tempdir();
    let d = tmp.path();
    let p = |f: &str| d.join(f).display().to_string();
    ok(&[
        "synth",
        "--connections",
        "16",
        "--rate",
        "40",
        "--max-response",
        "20000",
        "--seed",
        "3",
        "-o",
        &p("synth.db"),
    ]);
    let gap_us = 700_000i64;
    {
        let c = rusqlite::Connection::open(d.join("synth.db")).unwrap();
        c.execute_batch(&format!(
            "UPDATE connections SET bw_bps = 20e6, min_rtt_us = 10000, hs_rtt_us = 10000,
                 loss_rate_down = 0, loss_random_down = 0;
             UPDATE exchanges SET think_time_us = 1000,
                 t_req_first = (SELECT t_syn FROM connections WHERE id = conn_id) + 20000 + {gap_us} * seq,
                 t_req_last = (SELECT t_syn FROM connections WHERE id = conn_id) + 20000 + {gap_us} * seq;"
        ))
        .unwrap();
        let multi: i64 = c
            .query_row("SELECT count(*) FROM exchanges WHERE seq > 0", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert!(multi >= 3, "the workload has {multi} later requests");
    }
    // offsets of the later requests from their connection's SYN, as the replay's capture saw them
    let offsets = |db: &str| -> Vec<(i64, i64)> {
        let c = rusqlite::Connection::open(d.join(db)).unwrap();
        let mut st = c
            .prepare(
                "SELECT e.seq, e.t_req_first - c.t_syn FROM replay_map m
                 JOIN connections c ON c.id = m.replay_conn_id
                 JOIN exchanges e ON e.conn_id = c.id WHERE e.seq > 0 ORDER BY m.orig_conn_id, e.seq",
            )
            .unwrap();
        st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    for timing in ["recorded", "think"] {
        // the request times are judged from the capture's SYN: a stall of the host that holds
        // one SYN back moves its connection's offsets (a CI-mode run with 13-55% of the CPU
        // stolen had one request 12.7 ms "early"), so a miss is replayed again where the
        // hypervisor took the CPU meanwhile, and not judged where it took it in every try
        // (util::timed_check_unless_stolen; another run, 11-13% stolen in each of three tries,
        // missed by 31.1, 5.7 and 12.3 ms); the checks that are not about timing hold in every try
        timed_check_unless_stolen(&format!("request times ({timing})"), |n| {
            let name = lab_name("rp");
            let _down = LabDown(name.clone());
            let out = format!("{timing}{n}.db");
            let r = json(&ok(&[
                "replay",
                &p("synth.db"),
                "-o",
                &p(&out),
                "--lab",
                &name,
                "--request-timing",
                timing,
                "--json",
            ]));
            assert_eq!(r["failed"].as_u64(), Some(0), "{r}");
            let meta: String = rusqlite::Connection::open(d.join(&out))
                .unwrap()
                .query_row(
                    "SELECT value FROM meta WHERE key = 'request_timing'",
                    [],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(meta, timing);
            // replay's database writer builds the schema's indexes and views as analyze's does
            let schema: i64 = rusqlite::Connection::open(d.join(&out))
                .unwrap()
                .query_row(
                    "SELECT count(*) FROM sqlite_master WHERE name IN
                   ('rtt_samples_by_conn', 'bw_samples_by_conn', 'conn_summary', 'class_summary')",
                    [],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(
                schema, 4,
                "{out}: the indexes and views of schema migration 2"
            );
            let offs = offsets(&out);
            assert!(offs.len() >= 3, "{offs:?}");
            let recorded_at = |seq: i64| 20_000 + gap_us * seq;
            let worst = offs
                .iter()
                .map(|&(seq, off)| off - recorded_at(seq))
                .max_by_key(|d| d.abs())
                .unwrap();
            eprintln!(
                "{timing}: {} later requests, the farthest {worst} µs from its recorded time",
                offs.len()
            );
            for (seq, off) in offs {
                let recorded = recorded_at(seq);
                if timing == "recorded" {
                    if (off - recorded).abs() > 5_000 {
                        return Err(format!(
                            "request {seq} at +{off} µs, recorded at +{recorded} µs"
                        ));
                    }
                } else if off >= recorded - 300_000 {
                    return Err(format!(
                        "request {seq} at +{off} µs: not sent right after the previous response"
                    ));
                }
            }
            Ok(())
        });
    }
}

/// No connection runs unshaped unless the user asked for it: a workload where some connections
/// have no bandwidth estimate is replayed with the default (`--unestimated pooled`): those of a
/// client address with estimates get that client's median, the others are left out; with
/// `--unestimated pooled-class` those get their RTT class's median unless the class has no
/// estimate either. The summary and `meta` count each source, and no pipe is without a rate. A
/// delayed-ACK timeout the analyzer inferred beyond the pipe's 2 s maximum is not held (pooled
/// as an unmeasured one), counted, instead of refusing the workload. With `--unestimated unshaped` (asked
/// for) exactly the unestimated connections run unshaped.
#[test]
fn connections_without_estimates_get_a_chosen_rate_and_are_counted() {
    preflight();
    let tmp = tempdir();
    let d = tmp.path();
    let p = |f: &str| d.join(f).display().to_string();
    ok(&[
        "synth",
        "--connections",
        "24",
        "--rate",
        "40",
        "--max-response",
        "20000",
        "--seed",
        "11",
        "-o",
        &p("synth.db"),
    ]);
    let db = rusqlite::Connection::open(d.join("synth.db")).unwrap();
    // id % 4 = 0: client 10.1.0.1, estimated 2 Mbit/s (id % 8 = 4) or none (id % 8 = 0: pooled
    // by client); 1: own client, 20 ms, none (pooled by the 10-50 ms class when asked, else
    // left out); 2: own client, 3 ms, none (no estimate in the < 10 ms class: left out);
    // 3: own client, 20 ms, 5 Mbit/s, a 4.7 s delayed-ACK timeout
    db.execute_batch(
        "UPDATE connections SET min_rtt_us = 20000, hs_rtt_us = 20000, bw_bps = 5e6,
             loss_rate_down = 0, loss_random_down = 0, client_ip = '10.2.0.' || id;
         UPDATE connections SET client_ip = '10.1.0.1', bw_bps = 2e6 WHERE id % 4 = 0;
         UPDATE connections SET bw_bps = NULL WHERE id % 8 = 0 OR id % 4 = 1;
         UPDATE connections SET bw_bps = NULL, min_rtt_us = 3000, hs_rtt_us = 3000 WHERE id % 4 = 2;
         UPDATE connections SET delack_policy = 'delayed', delack_timeout_us = 4700000 WHERE id % 4 = 3;",
    )
    .unwrap();
    let count = |w: &str| -> u64 {
        db.query_row(
            &format!(
                "SELECT count(*) FROM connections WHERE complete = 1 AND exchanges > 0 AND {w}"
            ),
            [],
            |r| r.get::<_, i64>(0),
        )
        .unwrap() as u64
    };
    let total = count("1");
    let estimated = count("bw_bps IS NOT NULL");
    let (by_client, by_class, no_class) = (
        count("id % 8 = 0"),
        count("id % 4 = 1"),
        count("id % 4 = 2"),
    );
    let delack = count("id % 4 = 3");
    for n in [estimated, by_client, by_class, no_class, delack] {
        assert!(n > 0, "the workload lacks a kind of connection: {n}");
    }
    drop(db);
    let meta = |out: &str| -> std::collections::HashMap<String, String> {
        let c = rusqlite::Connection::open(d.join(out)).unwrap();
        let mut st = c.prepare("SELECT key, value FROM meta").unwrap();
        st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    // each replayed connection's downstream rate (NULL: unshaped), by original id
    let rates = |out: &str| -> Vec<(i64, Option<f64>)> {
        let c = rusqlite::Connection::open(d.join(out)).unwrap();
        let mut st = c
            .prepare("SELECT orig_conn_id, down_rate_bps FROM replay_pipes ORDER BY orig_conn_id")
            .unwrap();
        st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    let replay = |out: &str, mode: Option<&str>| -> serde_json::Value {
        let name = lab_name("rp");
        let _down = LabDown(name.clone());
        let o = p(out);
        let mut args = vec!["replay", &p("synth.db"), "-o", &o, "--lab", &name, "--json"]
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>();
        if let Some(m) = mode {
            args.extend(["--unestimated".to_string(), m.to_string()]);
        }
        let r = json(&ok(&args.iter().map(String::as_str).collect::<Vec<_>>()));
        eprintln!("rate sources ({mode:?}): {}", r["rate_sources"]);
        assert_eq!(r["failed"].as_u64(), Some(0), "{r}");
        r
    };

    for (out, mode, class, left_out) in [
        ("pooled.db", None, 0, by_class + no_class),
        ("pooled-class.db", Some("pooled-class"), by_class, no_class),
    ] {
        let r = replay(out, mode);
        let rs = &r["rate_sources"];
        let m = meta(out);
        let name = mode.unwrap_or("pooled");
        assert_eq!(rs["unestimated"].as_str(), Some(name), "{rs}");
        assert_eq!(m["unestimated"], name);
        for (k, n) in [
            ("estimated", estimated),
            ("pooled_by_client", by_client),
            ("pooled_by_class", class),
            ("unshaped_by_request", 0),
            ("left_out", left_out),
            ("delack_timeout_defaulted", delack),
        ] {
            assert_eq!(rs[k].as_u64(), Some(n), "{out}: summary {k}: {rs}");
            let key = if k.starts_with("delack") {
                k.to_string()
            } else {
                format!("rate_{k}")
            };
            assert_eq!(m[&key], n.to_string(), "{out}: meta {key}");
        }
        assert_eq!(r["connections"].as_u64(), Some(total - left_out), "{r}");
        let got = rates(out);
        assert_eq!(got.len() as u64, total - left_out);
        for (id, rate) in &got {
            assert!(
                rate.is_some_and(|b| b > 0.0),
                "{out}: connection {id} replayed without a rate limit, unasked: {rate:?}"
            );
            assert_ne!(
                id % 4,
                2,
                "{out}: connection {id} should have been left out"
            );
            if id % 4 == 0 {
                assert_eq!(
                    *rate,
                    Some(2e6),
                    "{out}: connection {id}: its client's median"
                );
            }
        }
        // the 4.7 s timeouts became the default 200 ms on the pipes
        let c = rusqlite::Connection::open(d.join(out)).unwrap();
        let timeouts = |w: &str| -> u64 {
            c.query_row(
                &format!("SELECT count(*) FROM replay_pipes WHERE {w}"),
                [],
                |r| r.get::<_, i64>(0),
            )
            .unwrap() as u64
        };
        assert_eq!(timeouts("ack_timeout_us > 2000000"), 0);
        assert_eq!(
            timeouts("orig_conn_id % 4 = 3 AND ack_timeout_us = 200000"),
            delack
        );
    }

    // asked for: the unestimated connections run unshaped, and are counted as such
    let r = replay("unshaped.db", Some("unshaped"));
    let rs = &r["rate_sources"];
    let unestimated = total - estimated;
    assert_eq!(
        rs["unshaped_by_request"].as_u64(),
        Some(unestimated),
        "{rs}"
    );
    assert_eq!(rs["left_out"].as_u64(), Some(0), "{rs}");
    assert_eq!(r["connections"].as_u64(), Some(total), "{r}");
    let m = meta("unshaped.db");
    assert_eq!(m["unestimated"], "unshaped");
    assert_eq!(m["rate_unshaped_by_request"], unestimated.to_string());
    let unshaped = rates("unshaped.db")
        .iter()
        .filter(|(_, r)| r.is_none())
        .count() as u64;
    assert_eq!(unshaped, unestimated);
}

/// Runs the Python `script` on `lab`'s client host against its server (port 8080) with
/// `args` after the address and port, captured by tcpdump at the server, and analyzes the
/// capture into `d/flows.db`.
fn capture_python_client(lab: &crate::capture::VethLab, d: &Path, script: &str, args: &[String]) {
    let mut tcpdump = crate::capture::start_tcpdump(lab, &d.join("cap.pcap"));
    let o = lab
        .exec(&lab.cli, "python3")
        .arg("-c")
        .arg(script)
        .arg(&lab.srv_ip)
        .arg("8080")
        .args(args)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "the stalling client failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    std::thread::sleep(Duration::from_millis(300));
    tcpdump.signal(libc::SIGINT);
    tcpdump.wait(Duration::from_secs(10));
    let p = |f: &str| d.join(f).display().to_string();
    ok(&["analyze", &p("cap.pcap"), "-o", &p("flows.db")]);
}

/// Replays `d/flows.db` without rate limits into `d/replay.db` in a lab of its own (named
/// after `tag`, down again when this returns); its `--json` summary, every connection replayed.
fn replay_unshaped_in_lab(d: &Path, tag: &str) -> serde_json::Value {
    let name = lab_name(tag);
    let _down = LabDown(name.clone());
    let p = |f: &str| d.join(f).display().to_string();
    let r = json(&ok(&[
        "replay",
        &p("flows.db"),
        "-o",
        &p("replay.db"),
        "--lab",
        &name,
        "--unestimated",
        "unshaped",
        "--json",
    ]));
    assert_eq!(r["failed"].as_u64(), Some(0), "{r}");
    r
}

/// A real client that stops reading is replayed as one: a Python client reads the first
/// 20 kB of a 600 kB response, pauses (0.8 s, 1.5 s), then reads the rest, so its window
/// closes and the server waits (captured with tcpdump at the server). The analyzer records
/// per exchange how long the window stayed closed (the pause less the time the buffer took to
/// fill), the replay's
/// client stops reading until its own window has been closed that long (its capture shows a
/// closed window too), and every replayed response time is within 20% of the original's. A
/// client reading at once would replay each in a few milliseconds.
#[test]
fn a_client_that_stops_reading_is_replayed_with_its_pause() {
    use crate::capture::{start_server, VethLab};
    preflight();
    require_tool("python3");
    let tmp = tempdir();
    let d = tmp.path();
    let body = 600_000usize;
    let pauses = [0.8f64, 1.5, 0.8];
    let lab = VethLab::new("zw", 73);
    let _server = start_server(&lab, 8080, body);
    const STALLING_CLIENT: &str = r#"
import socket, sys, time
host, port, body = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for pause in map(float, sys.argv[4:]):
    c = socket.create_connection((host, port), timeout=20)
    c.sendall(b"GET / HTTP/1.0\r\nHost: lab\r\n\r\n")
    got = 0
    while got < 20000:
        got += len(c.recv(20000 - got))
    time.sleep(pause)
    while True:
        b = c.recv(65536)
        if not b:
            break
        got += len(b)
    assert got > body, got
    c.close()
    time.sleep(0.2)
"#;
    let args: Vec<String> = std::iter::once(body.to_string())
        .chain(pauses.iter().map(|x| x.to_string()))
        .collect();
    capture_python_client(&lab, d, STALLING_CLIENT, &args);
    let c = rusqlite::Connection::open(d.join("flows.db")).unwrap();
    let orig: Vec<(i64, i64, i64, i64)> = c
        .prepare(
            "SELECT c.id, c.response_time_us, e.zero_window_us, coalesce(e.zero_window_at_bytes, -1)
             FROM connections c JOIN exchanges e ON e.conn_id = c.id ORDER BY c.t_syn",
        )
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        orig.len(),
        pauses.len(),
        "one exchange per connection: {orig:?}"
    );
    for (&(id, rt, zw, at), pause) in orig.iter().zip(pauses) {
        // the window closes only once the buffer has filled after the client stopped reading
        // (the server sends into a shrinking window meanwhile: about 90 ms on an idle host),
        // and reopens when the client reads again, which a loaded host may wake late (up to
        // 0.3 s seen here at load 16): the tap's closed time, not the pause, is what a replay
        // must reproduce
        let want = pause * 1e6;
        assert!(
            zw as f64 >= 0.5 * want && zw as f64 <= 1.5 * want,
            "connection {id}: window closed {zw} µs, the client paused {want} µs"
        );
        assert!(
            at >= 20_000 && (at as usize) < body,
            "connection {id}: closed at byte {at}"
        );
        assert!(rt as f64 >= want, "connection {id}: response time {rt} µs");
    }
    drop(c);
    let r = replay_unshaped_in_lab(d, "zw");
    assert_eq!(
        r["rate_sources"]["paused_reads"].as_u64(),
        Some(pauses.len() as u64),
        "the summary counts the clients that pause their reads: {r}"
    );
    let c = rusqlite::Connection::open(d.join("replay.db")).unwrap();
    let meta: String = c
        .query_row(
            "SELECT value FROM meta WHERE key = 'clients_pausing_reads'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(meta, pauses.len().to_string());
    for &(id, rt, zw, _) in &orig {
        let (rrt, rzw): (i64, i64) = c
            .query_row(
                "SELECT c.response_time_us, e.zero_window_us FROM replay_map m
                 JOIN connections c ON c.id = m.replay_conn_id
                 JOIN exchanges e ON e.conn_id = c.id WHERE m.orig_conn_id = ?1",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        let err = (rrt - rt) as f64 / rt as f64;
        eprintln!(
            "connection {id}: original {rt} µs (window closed {zw} µs), replay {rrt} µs \
             (closed {rzw} µs): {:+.1}%",
            100.0 * err
        );
        assert!(
            rzw > 0,
            "connection {id}: the replay's client never closed its window"
        );
        assert!(
            err.abs() <= 0.2,
            "connection {id}: replay {rrt} µs against the original's {rt} µs"
        );
    }
}

/// A real client that stops reading twice in one response is replayed with both stops: a
/// Python client with a fixed 64 KiB receive buffer reads 20 kB of a 600 kB response, pauses
/// 0.6 s, reads on to 300 kB, pauses 1.0 s, then reads the rest (captured with tcpdump at the
/// server). The analyzer lists both
/// closed intervals at their places (`exchanges.zero_window_stalls`); the replay's client
/// closes its window twice, each about as long as the original's (one pause of the total at
/// the first, as before migration 8, shows one), and the response time is within 20%.
#[test]
fn a_client_that_stops_twice_in_one_response_is_replayed_with_both_stops() {
    use crate::capture::{start_server, VethLab};
    preflight();
    require_tool("python3");
    let tmp = tempdir();
    let d = tmp.path();
    let body = 600_000usize;
    let lab = VethLab::new("zw2", 74);
    let _server = start_server(&lab, 8080, body);
    const TWICE: &str = r#"
import socket, sys, time
host, port, body = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
c = socket.socket()
# a fixed buffer (no autotuning): the rest after the second stop must not fit in it
c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
c.settimeout(20)
c.connect((host, port))
c.sendall(b"GET / HTTP/1.0\r\nHost: lab\r\n\r\n")
got = 0
for upto, pause in ((20000, 0.6), (300000, 1.0)):
    while got < upto:
        got += len(c.recv(upto - got))
    time.sleep(pause)
while True:
    b = c.recv(65536)
    if not b:
        break
    got += len(b)
assert got > body, got
c.close()
"#;
    capture_python_client(&lab, d, TWICE, &[body.to_string()]);
    let stalls = |db: &str, id: Option<i64>| -> (i64, i64, Vec<(i64, i64)>) {
        let c = rusqlite::Connection::open(d.join(db)).unwrap();
        let sql = match id {
            None => "SELECT c.id, c.response_time_us, coalesce(e.zero_window_stalls, '')
                     FROM connections c JOIN exchanges e ON e.conn_id = c.id"
                .to_string(),
            Some(id) => format!(
                "SELECT m.orig_conn_id, c.response_time_us, coalesce(e.zero_window_stalls, '')
                 FROM replay_map m JOIN connections c ON c.id = m.replay_conn_id
                 JOIN exchanges e ON e.conn_id = c.id WHERE m.orig_conn_id = {id}"
            ),
        };
        let (id, rt, text): (i64, i64, String) = c
            .query_row(&sql, [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap();
        let list = text
            .split_whitespace()
            .map(|pair| {
                let (at, us) = pair.split_once(':').unwrap();
                (at.parse().unwrap(), us.parse().unwrap())
            })
            .collect();
        (id, rt, list)
    };
    let (id, rt, orig) = stalls("flows.db", None);
    eprintln!("original: {rt} µs, stalls {orig:?}");
    assert_eq!(
        orig.len(),
        2,
        "two closed intervals in the response: {orig:?}"
    );
    // as in the one-stop test: the tap's closed time is the pause less the buffer's fill
    for (&(at, us), (after, pause)) in orig.iter().zip([(20_000, 0.6e6), (300_000, 1.0e6)]) {
        assert!(
            at >= after && (at as usize) < body,
            "closed at byte {at}, the client stopped after {after}"
        );
        assert!(
            us as f64 >= 0.5 * pause && us as f64 <= 1.5 * pause,
            "closed {us} µs, the client paused {pause} µs"
        );
    }
    replay_unshaped_in_lab(d, "zw2");
    let (_, rrt, replay) = stalls("replay.db", Some(id));
    let err = (rrt - rt) as f64 / rt as f64;
    eprintln!("replay: {rrt} µs ({:+.1}%), stalls {replay:?}", 100.0 * err);
    assert_eq!(
        replay.len(),
        2,
        "the replay's client closed its window at each stop: {replay:?}"
    );
    for (&(_, want), &(_, got)) in orig.iter().zip(&replay) {
        assert!(
            (got - want).abs() as f64 <= 0.2 * want as f64 + 20_000.0,
            "a stop closed {got} µs, the original's {want} µs"
        );
    }
    assert!(
        err.abs() <= 0.2,
        "replay {rrt} µs against the original's {rt} µs"
    );
}
