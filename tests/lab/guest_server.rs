//! Against the kernel you changed (issue 22, items 1 and 4): the lab's server host as a QEMU
//! guest on Debian's stock kernel (`mimic lab up --server-kernel`), `mimic serve` started in
//! it by `mimic replay --lab`, one workload replayed with `--stack initcwnd=3` and with
//! `--stack initcwnd=10` set on the guest's kernel, and `mimic compare` must call initcwnd 10
//! faster. Then both guests (router and server) are killed as in a crash and `lab down` must
//! leave nothing. The server guest boots once, in one test, so the suite stays fast.
//!
//! Needs root, qemu-system-x86, busybox-static, cpio and apt access to Debian's
//! `linux-image-amd64` (fetched once into /var/cache/mimic/kernels); a missing one fails the
//! test with its name.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use mimic_netemu::lab::LabInfo;
use mimic_netemu::netns;

use crate::common::{mimic, require_root, require_tool, stderr, stdout, tempdir};
use crate::util::{
    assert_demo_pairs, debian_kernel, meta, ok_text, require_guest_tools, wait_exiting, LabDown,
};

/// The path-limited round trip the modified workload's connections get (each way half).
const RTT_MS: f64 = 40.0;

/// Pids of the QEMU of lab host `role` (QEMU is named `mimic-NAME-ROLE`).
fn qemu_pids(name: &str, role: &str) -> Vec<i32> {
    let tag = format!("mimic-{name}-{role}");
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd);
        if cmd.contains("qemu") && cmd.split('\0').any(|a| a == tag) {
            v.push(pid);
        }
    }
    v
}

/// A synth workload made RTT-bound, where the initial window decides the response time:
/// every connection 40 ms round trip at 50 Mbit/s without loss, a client that ACKs every
/// segment into a 256 kB window, and responses of 20-60 kB sent in one go (no query pause).
fn initcwnd_workload(dir: &Path) -> PathBuf {
    let db = dir.join("workload.db");
    ok_text(&[
        "synth",
        "-q",
        "--connections",
        "40",
        "--rate",
        "10",
        "--max-response",
        "60000",
        "-o",
        db.to_str().unwrap(),
    ]);
    let c = rusqlite::Connection::open(&db).unwrap();
    c.execute_batch(&format!(
        "UPDATE connections SET min_rtt_us = {}, bw_bps = 50e6, loss_random_down = 0,
             loss_rate_down = 0, rwin_bytes = max(coalesce(rwin_bytes, 0), 262144),
             delack_policy = 'quick', acks_per_seg = 1.0;
         UPDATE exchanges SET resp_bytes = 20000 + (conn_id * 7919 + seq * 104729) % 40000,
             query_delay_us = NULL;
         UPDATE exchanges SET header_bytes = resp_bytes;",
        (RTT_MS * 1000.0) as u64
    ))
    .unwrap();
    db
}

fn replay(name: &str, workload: &Path, out: &Path, stack: &str) -> f64 {
    let t0 = Instant::now();
    let o = mimic()
        .args([
            "replay",
            workload.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "--lab",
            name,
            "--stack",
            stack,
        ])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "replay with --stack {stack} against the server guest failed: {}{}",
        stdout(&o),
        stderr(&o)
    );
    t0.elapsed().as_secs_f64()
}

/// Debian's stock kernel image and its release (`vmlinuz-RELEASE`), what the guest's
/// `uname -r` and the replays' `server_kernel` meta must say.
fn debian_kernel_and_version() -> (PathBuf, String) {
    let kernel = debian_kernel();
    let version = kernel
        .file_name()
        .and_then(|f| f.to_str())
        .and_then(|f| f.strip_prefix("vmlinuz-"))
        .unwrap_or_else(|| panic!("{}: not named vmlinuz-RELEASE", kernel.display()))
        .to_string();
    (kernel, version)
}

#[test]
fn replay_against_a_server_guest_shows_initcwnd_10_faster_than_3() {
    require_guest_tools("the server guest test", &[]);
    let (kernel, version) = debian_kernel_and_version();
    let name = format!("gs{}", std::process::id() % 100_000);
    let _guard = LabDown(name.clone());
    let tmp = tempdir();
    let t_all = Instant::now();

    // 1. The server host on Debian's kernel, the rest namespaces.
    let t0 = Instant::now();
    let o = mimic()
        .args(["lab", "up", &name, "--server-kernel"])
        .arg(&kernel)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "lab up --server-kernel failed: {}{}",
        stdout(&o),
        stderr(&o)
    );
    let boot_s = t0.elapsed().as_secs_f64();
    assert!(
        stderr(&o).contains(&format!("server host {name}-srv is a")),
        "{}",
        stderr(&o)
    );
    // `lab exec srv` runs in the guest; it has the server's address and route to the pool
    let srv = |cmd: &[&str]| {
        let mut a = vec!["lab", "exec", &name, "srv", "--"];
        a.extend_from_slice(cmd);
        ok_text(&a)
    };
    assert_eq!(srv(&["uname", "-r"]).trim(), version);
    let addrs = srv(&["ip", "-br", "addr"]);
    assert!(addrs.contains("198.18.0.1/24"), "{addrs}");
    let st: serde_json::Value =
        serde_json::from_str(&ok_text(&["lab", "status", &name, "--json"])).unwrap();
    let hosts = st["hosts"].as_array().unwrap();
    let h = |role: &str| hosts.iter().find(|h| h["role"] == role).unwrap().clone();
    assert_eq!(h("srv")["kind"], "guest");
    assert_eq!(h("srv")["kernel"].as_str(), Some(version.as_str()));
    assert_eq!(h("emu")["kind"], "namespace");
    // `lab stack` sets the guest kernel's route attributes and sysctls, and reads them back
    let after = ok_text(&["lab", "stack", &name, "initcwnd=3,cc=reno"]);
    assert!(
        after.contains("initcwnd=3") && after.contains("cc=reno"),
        "{after}"
    );
    let route = srv(&["ip", "route", "show", "198.19.0.0/19"]);
    assert!(route.contains("initcwnd 3"), "{route}");

    // 2. One workload, replayed against the guest's kernel with initcwnd 3 and 10.
    let workload = initcwnd_workload(tmp.path());
    let r3 = tmp.path().join("iw3.db");
    let r10 = tmp.path().join("iw10.db");
    let s3 = replay(&name, &workload, &r3, "initcwnd=3");
    let s10 = replay(&name, &workload, &r10, "initcwnd=10");
    // meta says where the server ran: the guest's kernel, the stack set on it
    for (db, iw) in [(&r3, 3), (&r10, 10)] {
        assert_eq!(meta(db, "server_kernel"), version, "{}", db.display());
        let stack: serde_json::Value = serde_json::from_str(&meta(db, "server_stack")).unwrap();
        assert_eq!(stack["initcwnd"].as_u64(), Some(iw), "{stack}");
    }

    // 3. mimic compare: initcwnd 10 is faster at the median, by about one round trip.
    let o = mimic()
        .args(["compare", "--json", "-"])
        .arg(&r3)
        .arg(&r10)
        .output()
        .unwrap();
    assert!(o.status.success(), "compare failed: {}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let c = &report["comparisons"][0];
    let verdict = c["verdict"].as_str().unwrap();
    assert!(
        verdict.contains("iw10 is faster at the median"),
        "verdict: {verdict}"
    );
    let p50 = c["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["stat"] == "p50")
        .unwrap();
    assert_eq!(p50["direction"], "faster", "{p50}");
    // 20-60 kB: initcwnd 3 needs 3-4 round trips of slow start, 10 needs 2-3: the median
    // moves by about one round trip (between half and two and a half)
    let shift_ms = -p50["diff_us"].as_f64().unwrap() / 1000.0;
    assert!(
        (0.5 * RTT_MS..=2.5 * RTT_MS).contains(&shift_ms),
        "median shift {shift_ms:.1} ms for a {RTT_MS} ms round trip: {p50}"
    );
    eprintln!(
        "server guest: boot {boot_s:.1} s, replays {s3:.1} s (initcwnd 3) and {s10:.1} s (initcwnd 10); median {:.1} -> {:.1} ms; {verdict}",
        p50["base_us"].as_f64().unwrap() / 1000.0,
        p50["other_us"].as_f64().unwrap() / 1000.0
    );

    // 4. A crash of both guests: the router and the server on the kernel, QEMUs killed with
    // SIGKILL; status says so, `lab down` leaves no guest, tap, namespace or runtime file.
    ok_text(&[
        "lab",
        "up",
        &name,
        "--kernel",
        kernel.to_str().unwrap(),
        "--server-kernel",
        kernel.to_str().unwrap(),
    ]);
    let st: serde_json::Value =
        serde_json::from_str(&ok_text(&["lab", "status", &name, "--json"])).unwrap();
    for h in st["hosts"].as_array().unwrap() {
        if h["role"] != "cli" {
            assert_eq!(h["kind"], "guest", "{h}");
            assert_eq!(h["kernel"].as_str(), Some(version.as_str()), "{h}");
        }
    }
    let mut killed = Vec::new();
    for role in ["emu", "srv"] {
        let pids = qemu_pids(&name, role);
        assert_eq!(pids.len(), 1, "one QEMU for {role}: {pids:?}");
        // SAFETY: killing the QEMU this test's lab started.
        unsafe { libc::kill(pids[0], libc::SIGKILL) };
        killed.push(pids[0]);
    }
    // SIGKILL is asynchronous: `lab status` must call a QEMU that has begun to exit not running
    wait_exiting(&killed);
    let o = mimic().args(["lab", "status", &name]).output().unwrap();
    assert!(!o.status.success(), "status of a crashed lab must say so");
    assert_eq!(
        stdout(&o).matches("NOT running").count(),
        2,
        "{}",
        stdout(&o)
    );
    ok_text(&["lab", "down", &name]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while ["emu", "srv"]
        .iter()
        .any(|r| !qemu_pids(&name, r).is_empty())
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    for role in ["emu", "srv"] {
        assert!(
            qemu_pids(&name, role).is_empty(),
            "QEMU of {role} still runs"
        );
    }
    let info = LabInfo::for_name(&name).unwrap();
    for ns in info.namespaces() {
        assert!(!netns::exists(ns), "namespace {ns} is left");
    }
    let links = Command::new("ip").args(["-o", "link"]).output().unwrap();
    let links = String::from_utf8_lossy(&links.stdout);
    assert!(
        !links.contains(&format!(" {name}-")),
        "interfaces of {name} are left: {links}"
    );
    assert!(
        !info.runtime_dir.exists(),
        "{} is left",
        info.runtime_dir.display()
    );
    eprintln!(
        "server guest test took {:.0} s",
        t_all.elapsed().as_secs_f64()
    );
}

/// Nothing of lab `name` is left: no namespace, interface or runtime dir, no QEMU.
fn assert_lab_gone(name: &str) {
    for role in ["emu", "srv"] {
        assert!(
            qemu_pids(name, role).is_empty(),
            "QEMU of {role} still runs"
        );
    }
    let info = LabInfo::for_name(name).unwrap();
    for ns in info.namespaces() {
        assert!(!netns::exists(ns), "namespace {ns} is left");
    }
    assert!(
        !info.runtime_dir.exists(),
        "{} is left",
        info.runtime_dir.display()
    );
}

/// `mimic demo --server-kernel` (issue 22, item 4): production and both replays run against a
/// server host booted on Debian's kernel, the report holds the three inputs and the paired
/// verdict, and the demo's lab (its QEMU included) is gone after it. 40 connections, as the
/// namespace demo's test (a 200-connection run by hand took 132 s here).
#[test]
fn demo_with_a_server_kernel_runs_every_stage_against_the_guest_and_removes_it() {
    require_guest_tools("the demo's server guest test", &[]);
    let (kernel, version) = debian_kernel_and_version();
    let name = format!("gd{}", std::process::id() % 100_000);
    let _g = LabDown(name.clone());
    let d = tempdir();
    let out = d.path().join("demo");
    let t0 = Instant::now();
    let o = mimic()
        .args(["demo", "--connections", "40", "--lab", &name, "--out"])
        .arg(&out)
        .arg("--server-kernel")
        .arg(&kernel)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "demo --server-kernel failed: {}{}",
        stdout(&o),
        stderr(&o)
    );
    let e = stderr(&o);
    assert!(
        e.contains(&format!("server on kernel {version} in a QEMU guest"))
            && e.contains(&format!("server host {name}-srv is a")),
        "{e}"
    );
    // every run's server was the guest, on its kernel, with the stack of that run
    for (db, iw) in [
        ("production-run.db", 3),
        ("replay-current.db", 3),
        ("replay-change.db", 10),
    ] {
        let db = out.join(db);
        assert_eq!(meta(&db, "server_kernel"), version, "{}", db.display());
        assert_eq!(
            meta(&db, "server_hostname"),
            format!("{name}-srv"),
            "{}",
            db.display()
        );
        let stack: serde_json::Value = serde_json::from_str(&meta(&db, "server_stack")).unwrap();
        assert_eq!(
            stack["initcwnd"].as_u64(),
            Some(iw),
            "{}: {stack}",
            db.display()
        );
    }
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("report.json")).unwrap()).unwrap();
    let labels: Vec<&str> = report["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["label"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["production", "replay-current", "replay-change"]);
    assert_demo_pairs(&out, &report, 40);
    assert!(
        stdout(&o)
            .lines()
            .any(|l| l.starts_with("verdict: replay-change vs replay-current")),
        "{}",
        stdout(&o)
    );
    assert_lab_gone(&name);
    eprintln!(
        "demo --server-kernel: {:.0} s; {}",
        t0.elapsed().as_secs_f64(),
        stdout(&o).lines().last().unwrap_or("")
    );
}

#[test]
fn a_server_kernel_that_is_not_one_is_named_and_nothing_is_built() {
    require_root("the server guest test");
    let d = tempdir();
    let bogus = d.path().join("vmlinuz-notakernel");
    std::fs::write(&bogus, vec![0x42u8; 8192]).unwrap();
    let name = format!("gb{}", std::process::id() % 100_000);
    let _g = LabDown(name.clone());
    let o = mimic()
        .args(["lab", "up", &name, "--server-kernel"])
        .arg(&bogus)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("vmlinuz-notakernel") && e.contains("not a Linux kernel image"),
        "{e}"
    );
    assert_lab_gone(&name);
    // the demo checks the image before it builds its lab
    let o = mimic()
        .args(["demo", "--lab", &name, "--out"])
        .arg(d.path().join("demo"))
        .arg("--server-kernel")
        .arg(&bogus)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("vmlinuz-notakernel") && e.contains("not a Linux kernel image"),
        "{e}"
    );
    assert_lab_gone(&name);
}

#[test]
fn a_server_guest_that_does_not_come_up_in_time_is_killed_and_the_lab_removed() {
    require_root("the server guest test");
    require_tool("qemu-system-x86_64");
    let kernel = debian_kernel();
    let name = format!("gt{}", std::process::id() % 100_000);
    let _g = LabDown(name.clone());
    let t0 = Instant::now();
    let o = mimic()
        .args([
            "lab",
            "up",
            &name,
            "--boot-timeout",
            "1s",
            "--server-kernel",
        ])
        .arg(&kernel)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains(&format!("guest {name}-srv did not come up within 1.0 s"))
            && e.contains("console"),
        "{e}"
    );
    // its console is kept where the lab's cleanup leaves it, and named
    let console = std::env::temp_dir().join(format!("mimic-{name}-srv.console"));
    assert!(
        e.contains(&format!("console {}", console.display())) && console.is_file(),
        "{e}"
    );
    std::fs::remove_file(&console).unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "took {:?}",
        t0.elapsed()
    );
    assert_lab_gone(&name);
}
