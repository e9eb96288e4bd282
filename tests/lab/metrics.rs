//! `--metrics` lab tests (root, namespaces): `/metrics` scraped while `mimic capture` records
//! live traffic on a veth pair in namespaces the test creates, and while `mimic netemu run`
//! forwards pings through a lab; each page parses with the Prometheus project's OpenMetrics
//! parser (python3-prometheus-client) and its counters equal what the command reports at exit.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::capture::{run_clients, start_capture, start_server, VethLab};
use crate::common::{mimic, require_root, require_tool, stderr, tempdir};
use crate::prom::{scrape, wait_for, Scrape};

/// Scrapes until two scrapes a second apart are the same (the traffic has been counted).
fn settled(prefix: &[&str], url: &str) -> Scrape {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = scrape(prefix, url);
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let m = scrape(prefix, url);
        if m.samples == last.samples {
            return m;
        }
        assert!(Instant::now() < deadline, "counters never settled: {m:?}");
        last = m;
    }
}

/// Files of the capture on disk now, closed or being written.
fn capture_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            let n = e
                .as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .into_owned();
            n.ends_with(".pcapng") || n.ends_with(".pcapng.part")
        })
        .count()
}

/// A live capture (libpcap on a veth, 1/2 of connections, a 3-file ring of 64 KiB) scraped
/// before, during and after traffic: every page parses; the counters grow while traffic runs
/// and the ring deletes files without ever holding more than 3; the settled page's packet
/// counters equal the summary at exit; each connection is counted once, kept or sampled out.
#[test]
fn capture_metrics_during_a_live_capture_equal_the_summary() {
    let lab = VethLab::new("p", 71);
    let dir = tempdir();
    let cap_dir = dir.path().join("cap");
    let ns = lab.srv.clone();
    let prefix = ["ip", "netns", "exec", ns.as_str()];
    // the capture's own namespace has its own loopback: a fixed port cannot collide
    let url = "http://127.0.0.1:9464/metrics";
    let args: Vec<String> = [
        "--source",
        &format!("iface:{}", lab.srv_if),
        "--filter",
        "tcp",
        "--no-anonymize",
        "--payload-bytes",
        "all",
        "--sample",
        "1/2",
        "--rotate",
        "64KiB",
        "--ring",
        "3",
        "--metrics",
        "127.0.0.1:9464",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut cap = start_capture(&lab, &lab.srv, &cap_dir, &args);
    let _srv = start_server(&lab, 8090, 20_000);
    let before = wait_for(&prefix, url, 10);
    assert_eq!(before.types["mimic_capture_received_packets"], "counter");
    assert_eq!(before.types["mimic_capture_files"], "gauge");
    assert_eq!(before.get("mimic_capture_received_packets_total"), 0);

    run_clients(&lab, 8090, 60, 4);
    let during = scrape(&prefix, url);
    assert!(capture_files(&cap_dir) <= 3);
    assert!(
        during.get("mimic_capture_received_packets_total") > 0,
        "no packets counted while traffic ran: {during:?}"
    );
    run_clients(&lab, 8090, 60, 4);
    let end = settled(&prefix, url);
    assert!(capture_files(&cap_dir) <= 3);
    let rx = |m: &Scrape| m.get("mimic_capture_received_packets_total");
    assert!(rx(&end) > rx(&during), "{during:?} then {end:?}");
    assert!(end.get("mimic_capture_files_deleted_total") > 0, "{end:?}");
    assert!(end.get("mimic_capture_files") <= 3, "{end:?}");
    let conns = end.get("mimic_capture_connections_total{decision=\"kept\"}")
        + end.get("mimic_capture_connections_total{decision=\"sampled_out\"}");
    assert_eq!(conns, 120, "connection openings: {end:?}");

    cap.signal(libc::SIGTERM);
    let out = cap.wait(Duration::from_secs(20));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let p = cap_dir.join("capture-summary.json");
    let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    let n = |k: &str| s[k].as_u64().unwrap_or_else(|| panic!("{k} in {s}"));
    let dropped = |cause: &str| {
        end.get(&format!(
            "mimic_capture_dropped_packets_total{{cause=\"{cause}\"}}"
        ))
    };
    for (field, got) in [
        ("received", rx(&end)),
        (
            "received_bytes",
            end.get("mimic_capture_received_bytes_total"),
        ),
        ("kept", end.get("mimic_capture_kept_packets_total")),
        ("kept_bytes", end.get("mimic_capture_kept_bytes_total")),
        ("written", end.get("mimic_capture_written_packets_total")),
        ("sampled_out", dropped("sampled_out")),
        ("non_tcp_dropped", dropped("non_tcp")),
        ("malformed", dropped("malformed")),
        ("kernel_dropped", dropped("capture_buffer")),
        ("interface_dropped", dropped("interface")),
        ("capture_dropped", dropped("write_failed")),
        (
            "connections_kept",
            end.get("mimic_capture_connections_total{decision=\"kept\"}"),
        ),
        (
            "files_deleted",
            end.get("mimic_capture_files_deleted_total"),
        ),
    ] {
        assert_eq!(n(field), got, "{field}: summary {s}, metrics {end:?}");
    }
    // the one file still open at the last scrape was closed at exit
    assert_eq!(
        n("files_closed"),
        end.get("mimic_capture_files_closed_total") + 1
    );
    assert!(n("sampled_out") > 0 && n("kept") > 0, "{s}");
    let files = s["files"].as_array().unwrap();
    assert!(
        files.len() <= 3 && capture_files(&cap_dir) == files.len(),
        "{s}"
    );
}

/// `mimic netemu run --metrics` in a lab: pings cross the default pipes; the page parses, and
/// its per-direction counters equal the totals `netemu run --json` prints at exit.
#[test]
fn netemu_metrics_count_both_directions_and_match_the_exit_counters() {
    require_root("netemu metrics lab test");
    require_tool("ping");
    let name = format!("nm{}", std::process::id() % 100_000);
    struct Down(String);
    impl Drop for Down {
        fn drop(&mut self) {
            let _ = mimic().args(["lab", "down", &self.0]).output();
        }
    }
    let o = mimic().args(["lab", "up", &name]).output().unwrap();
    let _down = Down(name.clone());
    assert!(o.status.success(), "lab up: {}", stderr(&o));
    let info = mimic_netemu::lab::LabInfo::for_name(&name).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}/metrics");
    let child = mimic()
        .args(["netemu", "run", "--json", "--lab", &name])
        .args(["--default", "delay=1ms,rate=10mbit,queue=20"])
        .arg("--metrics")
        .arg(format!("127.0.0.1:{port}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut emu = crate::capture::Proc(Some(child));
    let first = wait_for(&[], &url, 20);
    assert_eq!(first.get("mimic_netemu_pipes"), 2);
    assert_eq!(first.types["mimic_netemu_shaped_packets"], "counter");

    let ping = mimic_netemu::netns::command(
        &info.ns_cli,
        "ping",
        ["-c", "20", "-i", "0.01", "-q", "198.18.0.1"],
    )
    .output()
    .unwrap();
    assert!(
        ping.status.success(),
        "ping: {}",
        String::from_utf8_lossy(&ping.stdout)
    );
    let m = settled(&[], &url);
    let up = m.get("mimic_netemu_shaped_packets_total{direction=\"up\"}");
    let down = m.get("mimic_netemu_shaped_packets_total{direction=\"down\"}");
    assert!(up >= 20 && down >= 20, "{m:?}");
    assert!(m.get("mimic_netemu_shaped_bytes_total{direction=\"up\"}") >= 20 * 84);
    assert!(m.get("mimic_netemu_received_frames_total{side=\"client\"}") >= 20);

    emu.signal(libc::SIGTERM);
    let out = emu.wait(Duration::from_secs(20));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let e = &j["stats"]["engine"];
    let mut want = BTreeMap::new();
    for dir in ["up", "down"] {
        want.insert(
            format!("mimic_netemu_shaped_packets_total{{direction=\"{dir}\"}}"),
            e[dir]["packets"].as_u64().unwrap(),
        );
        want.insert(
            format!("mimic_netemu_shaped_bytes_total{{direction=\"{dir}\"}}"),
            e[dir]["bytes"].as_u64().unwrap(),
        );
        for (cause, k) in [("queue", "queue_drops"), ("loss", "loss_drops")] {
            want.insert(
                format!(
                    "mimic_netemu_dropped_packets_total{{cause=\"{cause}\",direction=\"{dir}\"}}"
                ),
                e[dir][k].as_u64().unwrap(),
            );
        }
    }
    for (k, v) in want {
        assert_eq!(m.get(&k), v, "{k}: exit {j}");
    }
}
