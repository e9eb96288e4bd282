//! Kernel pipes on a REMOTE router (issue 22, item 3): `mimic netemu run --backend netem` in a
//! QEMU guest on Debian's stock kernel (the lab's router host, `lab up --kernel`), reached
//! over its authenticated control channel on the lab's client-side /24; `mimic serve` in the
//! server namespace; `mimic replay` in the client namespace as a remote controller (`--server`,
//! `--netemu`, `--client-addr`), its pipes installed per connection ahead of each SYN and
//! removed after it closes. One guest, booted once.
//!
//! Needs root, qemu-system-x86, busybox-static, cpio and apt access to Debian's
//! `linux-image-amd64`; a missing one fails the test with its name.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use mimic_netemu::control::{Client, ControlAddr, ControllerTls};
use mimic_netemu::kernel_router::KernelRouterInfo;
use mimic_netemu::lab::LabInfo;
use mimic_netemu::netns;

use crate::common::{mimic, mimic_bin, stderr, stdout, tempdir};
use crate::util::{
    debian_kernel, json, lab_name, meta, ok, require_guest_tools, timed_check_unless_stolen,
    LabDown, TIMED_TRIES,
};

/// The router's control address in the guest (on its bridge, in the lab's client /24).
const ROUTER_IP: &str = "198.18.0.254";
const ROUTER_LOG: &str = "/run/mimic-kernel-router.log";

/// Kills a process this test started when the test ends.
struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn guest(name: &str, argv: &[&str]) -> Output {
    let mut a = vec!["lab", "exec", name, "emu", "--"];
    a.extend_from_slice(argv);
    mimic().args(&a).output().unwrap()
}

/// The router's report, asked from the client namespace (where its address is reachable),
/// retried until it answers or `within` has passed.
fn router_info(ns: &str, addr: &ControlAddr, pki: &Path, within: Duration) -> KernelRouterInfo {
    let (ns, addr, pki) = (ns.to_string(), addr.clone(), pki.to_path_buf());
    std::thread::spawn(move || {
        netns::enter(&ns).unwrap();
        let tls = ControllerTls::load(&pki).unwrap();
        let until = Instant::now() + within;
        loop {
            match Client::connect(&addr, &tls).and_then(|mut c| c.kernel_info()) {
                Ok(i) => return i,
                Err(e) if Instant::now() > until => {
                    panic!("the kernel router at {addr} did not answer: {e}")
                }
                Err(_) => std::thread::sleep(Duration::from_millis(300)),
            }
        }
    })
    .join()
    .unwrap()
}

#[test]
fn a_remote_router_in_a_guest_installs_netem_pipes_per_connection_over_the_control_channel() {
    require_guest_tools("guest lab tests", &[]);
    let kernel = debian_kernel();
    let tmp = tempdir();
    let d = tmp.path();
    let p = |f: &str| d.join(f).display().to_string();
    ok(&[
        "synth",
        "--connections",
        "240",
        "--rate",
        "20",
        "--seed",
        "11",
        "--max-response",
        "50000",
        "-o",
        &p("synth.db"),
    ]);
    let name = lab_name("gk");
    let _down = LabDown(name.clone());
    ok(&["lab", "up", &name, "--kernel", kernel.to_str().unwrap()]);
    let info = LabInfo::for_name(&name).unwrap();
    let pki = info.pki_dir.display().to_string();
    let (ec, es) = (info.emu_cli_if.clone(), info.emu_srv_if.clone());
    let exe = mimic_bin().display().to_string();
    let control = format!("tcp:{ROUTER_IP}:7002");

    // the router's certificate into the guest; its control address on the guest's bridge
    let read = |f: &str| std::fs::read_to_string(info.pki_dir.join(f)).unwrap();
    let o = guest(
        &name,
        &[
            "sh",
            "-ec",
            "umask 077; mkdir -p \"$1\"; printf %s \"$2\" > \"$1/ca.crt\"; printf %s \"$3\" > \"$1/netemu.crt\"; printf %s \"$4\" > \"$1/netemu.key\"; ip addr replace \"$5\"/24 dev br0",
            "sh",
            &pki,
            &read("ca.crt"),
            &read("netemu.crt"),
            &read("netemu.key"),
            ROUTER_IP,
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let router_args = [
        exe.as_str(),
        "-q",
        "netemu",
        "run",
        "--backend",
        "netem",
        "--client-if",
        &ec,
        "--server-if",
        &es,
        "--control",
        &control,
        "--pki",
        &pki,
    ];

    // a root qdisc that is not mimic's is refused (nothing installed), replaced only with --force
    let o = guest(
        &name,
        &[
            "tc", "qdisc", "add", "dev", &ec, "root", "handle", "1:", "htb",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let o = guest(&name, &router_args);
    assert!(!o.status.success(), "a foreign root qdisc was not refused");
    assert!(
        stderr(&o).contains("root qdisc mimic did not install") && stderr(&o).contains(&ec),
        "{}",
        stderr(&o)
    );
    let q = stdout(&guest(&name, &["tc", "qdisc", "show", "dev", &es]));
    assert!(!q.contains("6d69:"), "the refused router left a qdisc: {q}");
    let o = guest(&name, &["tc", "qdisc", "del", "dev", &ec, "root"]);
    assert!(o.status.success(), "{}", stderr(&o));

    // the router, in the background in the guest
    let quoted: Vec<String> = router_args.iter().map(|a| format!("'{a}'")).collect();
    let o = guest(
        &name,
        &[
            "sh",
            "-ec",
            &format!(
                "setsid {} > {ROUTER_LOG} 2>&1 < /dev/null & echo $!",
                quoted.join(" ")
            ),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let router_pid = stdout(&o).trim().to_string();
    let addr: ControlAddr = control.parse().unwrap();
    let before = router_info(&info.ns_cli, &addr, &info.pki_dir, Duration::from_secs(60));
    assert_eq!(before.backend, "netem");
    assert_eq!(before.installed, 0);
    assert!(!before.kernel.is_empty());
    eprintln!("kernel router: {before:?}");

    // the server emulator in the server namespace
    let serve_ctl = format!("unix:{}", d.join("serve.sock").display());
    let server = format!("{}:8080", info.server_addr);
    let _serve = Kill(
        netns::command(
            &info.ns_srv,
            mimic_bin(),
            [
                "-q",
                "serve",
                "--listen",
                &server,
                "--control",
                &serve_ctl,
                "--pki",
                &pki,
            ],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap(),
    );
    let until = Instant::now() + Duration::from_secs(10);
    while !d.join("serve.sock").exists() {
        assert!(Instant::now() < until, "serve did not come up");
        std::thread::sleep(Duration::from_millis(50));
    }
    let addrs: Vec<String> = (0..4)
        .map(|i| info.pool_addr(i).unwrap().to_string())
        .collect();
    // a remote replay does not measure the LAN's own round trip: the user gives it
    // (`--lan-rtt`, GUIDE) — here the minimum of 20 pings from the client host through the
    // router guest, unshaped (no pipe matches the client host's own address). Without it the
    // TCG guest's 0.6-2.6 ms put 30 of 240 min RTTs outside 10% or 2 ms in a CI run.
    let lan_us = mimic_replay::orchestrate::lan::measure(&info.ns_cli, info.server_addr.into())
        .unwrap_or_else(|e| panic!("the LAN's round trip through the router guest: {e}"));
    let lan_ms = lan_us as f64 / 1000.0;
    eprintln!("the LAN's own round trip through the router guest: {lan_ms} ms");
    let lan_rtt = format!("{lan_ms:.3}ms");
    let replay = |out: &str, extra: &[&str]| -> Output {
        let mut args = vec![
            "replay".to_string(),
            p("synth.db"),
            "-o".into(),
            p(out),
            "--server".into(),
            server.clone(),
            "--server-port".into(),
            "8080".into(),
            "--server-control".into(),
            serve_ctl.clone(),
            "--netemu".into(),
            control.clone(),
            "--pki".into(),
            pki.clone(),
            "--lan-rtt".into(),
            lan_rtt.clone(),
            "--emulator".into(),
            "netem".into(),
            "--json".into(),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        for a in &addrs {
            args.push("--client-addr".into());
            args.push(a.clone());
        }
        let mut c: Command = netns::command(&info.ns_cli, mimic_bin(), &args);
        c.output().unwrap()
    };

    // 1. per connection (its timing checked as timed_check_unless_stolen says: tried again
    //    where the hypervisor took the CPU during a failed try, and not judged where it took it
    //    during every try; a run of the lab suite alone missed all three tries with 11.8-25.5%
    //    stolen, the replay calling itself distorted each time). Every try installs and removes
    //    240 pipes, whatever its timing; what a try asserts outright still fails the test.
    let judged = timed_check_unless_stolen(
        "the per-connection replay through the router guest",
        |n| {
            let o = replay("per.db", &["--kernel-pipes", "per-connection"]);
            assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
            let r = json(&o);
            let k = &r["kernel_pipes"];
            eprintln!("per-connection replay: {k}");
            assert_eq!(r["connections"].as_u64(), Some(240), "{r}");
            assert_eq!(
                r["netemu"],
                serde_json::Value::Null,
                "no datapath of mimic's ran"
            );
            assert_eq!(k["mode"], "per-connection");
            assert_eq!(k["pipes"].as_u64(), Some(480), "{k}");
            let late = k["late_installs"].as_u64().unwrap();
            let most = k["max_installed"].as_u64().unwrap();
            assert!(
                most > 0 && most < 120,
                "at most {most} of 240 connections installed at once: not per connection"
            );
            // a late install holds its SYN (below: no connection crossed the router unshaped), so
            // what this bounds is the lead time's keeping starts on time; the TCG router guest
            // stalls for up to a second now and then (6-19 late of 240 in some runs, 0 in most)
            let waits = k["syn_waits"].as_u64().unwrap();
            if late > 24 {
                return Err(format!(
                    "{late} of 240 installs came after their SYN was due \
                 (lead {} ms, slowest batch {} ms)",
                    k["lead_ms"], k["batch_max_ms"]
                ));
            }
            assert!(k["router"].as_str().unwrap().contains(&control), "{k}");
            let db = d.join("per.db");
            assert_eq!(meta(&db, "emulator"), "netem");
            assert_eq!(meta(&db, "emulator_pipe_mode"), "per-connection");
            assert_eq!(meta(&db, "emulator_late_installs"), late.to_string());
            assert_eq!(meta(&db, "emulator_syn_waits"), waits.to_string());
            assert_eq!(meta(&db, "emulator_max_installed"), most.to_string());
            // replayed and shaped: the truth's min RTT came back (an unshaped replay has ~0)
            // the replay and its original (`t`), one connection for the count and the misses
            let c = rusqlite::Connection::open(&db).unwrap();
            c.execute("ATTACH DATABASE ?1 AS t", [p("synth.db")])
                .unwrap();
            let (replayed, rtt_ok, rtt_n, unshaped): (i64, i64, i64, i64) = {
                c.query_row(
            "SELECT (SELECT count(replay_conn_id) FROM replay_map), \
             coalesce(sum(abs(r.min_rtt_us - o.min_rtt_us) <= max(0.1 * o.min_rtt_us, 2000)), 0), count(*), \
             coalesce(sum(r.min_rtt_us < 0.5 * o.min_rtt_us), 0) \
             FROM replay_map m JOIN t.connections o ON o.id = m.orig_conn_id \
             JOIN connections r ON r.id = m.replay_conn_id \
             WHERE r.min_rtt_us IS NOT NULL AND o.min_rtt_us IS NOT NULL",
            [],
            |x| Ok((x.get(0)?, x.get(1)?, x.get(2)?, x.get(3)?)),
        )
        .unwrap()
            };
            eprintln!("replayed {replayed} of 240; min RTT within 10% or 2 ms: {rtt_ok} of {rtt_n}; {late} pipes late, {waits} SYNs held for them");
            {
                // the misses, original against replayed min RTT (ms) and the pipe's rate: a late pipe
                // shows as a replay far below, the guest's own delay as one above
                let mut st = c
                    .prepare(
                        "SELECT o.min_rtt_us, r.min_rtt_us, p.down_rate_bps FROM replay_map m \
                 JOIN t.connections o ON o.id = m.orig_conn_id \
                 JOIN connections r ON r.id = m.replay_conn_id \
                 LEFT JOIN replay_pipes p ON p.orig_conn_id = m.orig_conn_id \
                 WHERE abs(r.min_rtt_us - o.min_rtt_us) > max(0.1 * o.min_rtt_us, 2000) \
                 ORDER BY r.min_rtt_us - o.min_rtt_us",
                    )
                    .unwrap();
                let misses: Vec<String> = st
                    .query_map([], |x| {
                        let (o, r, bw) = (
                            x.get::<_, f64>(0)?,
                            x.get::<_, f64>(1)?,
                            x.get::<_, Option<f64>>(2)?,
                        );
                        let bw = bw.map_or("unshaped".into(), |b| format!("{:.0} kbit/s", b / 1e3));
                        Ok(format!("{:.1}->{:.1} ({bw})", o / 1e3, r / 1e3))
                    })
                    .unwrap()
                    .map(|x| x.unwrap())
                    .collect();
                eprintln!(
                    "min RTT misses (ms, original->replayed): {}",
                    misses.join(" ")
                );
            }
            assert!(replayed >= 228, "replayed {replayed} of 240");
            // every SYN waited for its pipes: none crossed the router unshaped (one that did has
            // only the LAN's round trip, 0.6-2.6 ms through this guest, against the synth's 2-300 ms)
            assert_eq!(
        unshaped, 0,
        "{unshaped} connections replayed at under half their min RTT: a SYN went before its pipes ({late} late, {waits} held)"
    );
            if !(rtt_ok as f64 >= 0.9 * rtt_n as f64 && rtt_n >= 200) {
                return Err(format!(
                    "min RTT within 10% or 2 ms for {rtt_ok} of {rtt_n} (timing health {})",
                    r["timing"]
                ));
            }
            Ok(n as u64)
        },
    );
    let tries = judged.unwrap_or(TIMED_TRIES as u64);
    // everything this replay installed is gone again; the router keeps serving
    let after = router_info(&info.ns_cli, &addr, &info.pki_dir, Duration::from_secs(10));
    assert_eq!(after.installed, 0, "{after:?}");
    assert_eq!(after.installs, 240 * tries, "{after:?} after {tries} tries");
    assert_eq!(after.removes, 240 * tries, "{after:?} after {tries} tries");
    for dev in [&ec, &es] {
        // the skeleton and the (empty) group qdisc stay; no pipe's netem leaf does
        let q = stdout(&guest(&name, &["tc", "qdisc", "show", "dev", dev]));
        assert!(q.contains("6d69:"), "mimic's root qdisc is gone early: {q}");
        assert!(!q.contains("netem"), "a pipe is left on {dev}: {q}");
    }

    // 1b. the router stalls mid-replay (stopped for 4 s, past the lead time — at most about
    //     1.5 s after a slow first batch — once the clients have connections open: the pipes
    //     put in before them are in): the SYNs due meanwhile wait for their pipes and start
    //     late, and no connection crosses the router unshaped
    let stall = std::thread::spawn({
        let (name, pid, ns) = (name.clone(), router_pid.clone(), info.ns_cli.clone());
        move || {
            let until = Instant::now() + Duration::from_secs(60);
            while Instant::now() < until {
                let o = netns::command(
                    &ns,
                    "ss",
                    ["-Htn", "state", "established", "( dport = :8080 )"],
                )
                .output()
                .unwrap();
                if !stdout(&o).trim().is_empty() {
                    return Some(guest(
                        &name,
                        &[
                            "sh",
                            "-c",
                            &format!("kill -STOP {pid}; sleep 4; kill -CONT {pid}"),
                        ],
                    ));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            None
        }
    });
    let o = replay(
        "stall.db",
        &["--kernel-pipes", "per-connection", "--limit", "160"],
    );
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let g = stall
        .join()
        .unwrap()
        .expect("no replayed connection within 60 s: the router was not stalled");
    assert!(
        g.status.success(),
        "stalling the router: {}{}",
        stdout(&g),
        stderr(&g)
    );
    let k = &json(&o)["kernel_pipes"];
    eprintln!("per-connection replay, the router stopped for 4 s: {k}");
    let (late, waits) = (
        k["late_installs"].as_u64().unwrap(),
        k["syn_waits"].as_u64().unwrap(),
    );
    let db = d.join("stall.db");
    let (replayed, unshaped): (i64, i64) = {
        let c = rusqlite::Connection::open(&db).unwrap();
        c.execute("ATTACH DATABASE ?1 AS t", [p("synth.db")])
            .unwrap();
        c.query_row(
            "SELECT (SELECT count(replay_conn_id) FROM replay_map), \
             coalesce(sum(r.min_rtt_us < 0.5 * o.min_rtt_us), 0) \
             FROM replay_map m JOIN t.connections o ON o.id = m.orig_conn_id \
             JOIN connections r ON r.id = m.replay_conn_id \
             WHERE r.min_rtt_us IS NOT NULL AND o.min_rtt_us IS NOT NULL",
            [],
            |x| Ok((x.get(0)?, x.get(1)?)),
        )
        .unwrap()
    };
    eprintln!("stalled router: replayed {replayed} of 160; {late} pipes late, {waits} SYNs held, {unshaped} below half their min RTT");
    assert!(
        late >= 5 && waits >= 5,
        "the stall made no late installs: {k}"
    );
    assert!(
        k["syn_wait_max_ms"].as_f64().unwrap() >= 500.0,
        "the longest hold is shorter than the stall past the lead: {k}"
    );
    assert_eq!(meta(&db, "emulator_syn_waits"), waits.to_string());
    assert!(replayed >= 152, "replayed {replayed} of 160");
    assert_eq!(
        unshaped, 0,
        "{unshaped} connections crossed the stalled router unshaped ({late} late, {waits} held)"
    );
    let after = router_info(&info.ns_cli, &addr, &info.pki_dir, Duration::from_secs(10));
    assert_eq!(after.installed, 0, "{after:?}");
    assert_eq!(after.installs, 240 * tries + 160, "{after:?}");

    // 2. a short workload: auto installs all at once
    let o = replay("all.db", &["--limit", "40"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let r = json(&o);
    assert_eq!(r["kernel_pipes"]["mode"], "all", "{}", r["kernel_pipes"]);
    assert_eq!(meta(&d.join("all.db"), "emulator_pipe_mode"), "all");
    assert!(r["ok"].as_u64().unwrap() >= 38, "{r}");
    let after = router_info(&info.ns_cli, &addr, &info.pki_dir, Duration::from_secs(10));
    assert_eq!(after.installed, 0, "{after:?}");

    // 3. SIGTERM: the router removes its root qdiscs and exits
    let o = guest(
        &name,
        &[
            "sh",
            "-c",
            // (gone, or a zombie: the guest's init need not reap a process left to it)
            &format!("kill {router_pid}; i=0; while [ $i -lt 100 ]; do st=$(cut -d' ' -f3 /proc/{router_pid}/stat 2>/dev/null); [ -z \"$st\" ] || [ \"$st\" = Z ] && exit 0; sleep 0.2; i=$((i+1)); done; exit 1"),
        ],
    );
    let log = stdout(&guest(&name, &["cat", ROUTER_LOG]));
    assert!(
        o.status.success(),
        "the router did not exit within 20 s of SIGTERM: {}{}; its log: {log}",
        stdout(&o),
        stderr(&o)
    );
    assert!(log.contains("mimic's root qdiscs removed"), "{log}");
    assert!(
        log.contains(&format!(
            "{all} connections installed, {all} removed",
            all = 240 * tries + 160 + 40
        )) && !log.contains(" 0 with delayed-ACK shaping left out"),
        "{log}"
    );
    let q = stdout(&guest(&name, &["tc", "-j", "qdisc", "show"]));
    let v: serde_json::Value = serde_json::from_str(&q).unwrap();
    for x in v.as_array().unwrap() {
        assert!(
            !x["handle"].as_str().unwrap_or("").starts_with("6d69:") && x["kind"] != "netem",
            "left in the router guest after SIGTERM: {x}"
        );
    }

    // 4. the same per connection with the lab's router host itself (`--lab`: tc over the
    //    guest's command channel, one exec per batch)
    //    (a timed check: how many installs come after their SYN was due, and how many
    //    connections complete, depend on how fast the TCG guest runs tc, which the
    //    hypervisor's steal slows; the rest is asserted in every try)
    let mut last: Option<(serde_json::Value, String)> = None;
    timed_check_unless_stolen("the lab router guest's per-connection pipes", |i| {
        let out = p(&format!("lab-{i}.db"));
        let o = mimic()
            .args(["replay", &p("synth.db"), "-o", &out, "--lab", &name])
            .args([
                "--keep-lab",
                "--emulator",
                "netem",
                "--kernel-pipes",
                "per-connection",
            ])
            .args(["--limit", "100", "--json"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
        let r = json(&o);
        let k = &r["kernel_pipes"];
        eprintln!("per-connection replay with the lab's router guest: {k}");
        assert_eq!(k["mode"], "per-connection", "{k}");
        assert_eq!(k["pipes"].as_u64(), Some(200), "{k}");
        let replayed = r["ok"].as_u64().unwrap();
        let late = k["late_installs"].as_u64().unwrap();
        last = Some((r.clone(), out));
        if replayed >= 95 && late <= 10 {
            Ok(())
        } else {
            Err(format!(
                "{replayed} of 100 replayed (95 asked), {late} of 100 installs came after \
                 their SYN was due (10 at most): {k}"
            ))
        }
    });
    let (r, out) = last.expect("a try ran");
    let k = &r["kernel_pipes"];
    assert_eq!(
        meta(Path::new(&out), "emulator_late_installs"),
        k["late_installs"].to_string()
    );
    assert_eq!(
        meta(Path::new(&out), "emulator_syn_waits"),
        k["syn_waits"].to_string()
    );
    let q = stdout(&guest(&name, &["tc", "qdisc", "show"]));
    assert!(
        !q.contains("6d69:") && !q.contains("netem"),
        "left in the router guest after the lab replay: {q}"
    );
    ok(&["lab", "down", &name]);
}
