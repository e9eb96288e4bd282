//! `mimic replay --agents`: the client side of a replay on several client hosts (lab
//! namespaces `NAME-cli`, `NAME-cli2`, each its own TCP stack behind one switch), driven over
//! the control channel (root, namespaces).

use crate::common::*;
use crate::util::{json, lab_name, ok, LabDown};

/// A synth workload of `n` short connections (responses up to 20 kB) opening at `rate` a
/// second, written to `out`.
fn synth(out: &str, n: u64, rate: u32, seed: u64) {
    ok(&[
        "synth",
        "--connections",
        &n.to_string(),
        "--rate",
        &rate.to_string(),
        "--max-response",
        "20000",
        "--seed",
        &seed.to_string(),
        "-o",
        out,
    ]);
}

/// Whether process `pid` is a `mimic agent` (an `agent` argument on its command line).
fn is_agent(pid: i32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| c.split(|&b| b == 0).any(|a| a == b"agent"))
        .unwrap_or(false)
}

/// `[p50, p99, max]` of a JSON summary's figures, as text.
fn three(v: &serde_json::Value) -> String {
    format!("{} / {} / {}", v[0], v[1], v[2])
}

/// 10,000 short connections (a `mimic synth` workload at 200 new connections per second)
/// replayed twice in one lab at the same offered load: once from one client host (an agent in
/// `NAME-cli`), once split over two (agents in `NAME-cli` and `NAME-cli2`, by the original
/// flows' Community ID). Both capture and analyze at the server as a local replay does. The
/// two-agent run must complete at least 99% of the connections, each agent must get about
/// half of them, and the replay database must record the agents; the start lateness (at the
/// agents) and the server-delay lateness (at the server emulator) of both runs are printed.
#[test]
fn ten_thousand_connections_over_two_client_agents() {
    require_root("agent lab test");
    for t in ["ip", "ethtool", "sysctl", "bridge"] {
        require_tool(t);
    }
    let tmp = tempdir();
    let d = tmp.path();
    let p = |f: &str| d.join(f).display().to_string();
    const N: u64 = 10_000;
    synth(&p("synth.db"), N, 200, 11);
    let name = lab_name("ag");
    let _down = LabDown(name.clone());
    let up = ok(&["lab", "up", &name, "--clients", "2"]);
    assert!(
        stdout(&up).contains(&format!("{name}-cli2")),
        "{}",
        stdout(&up)
    );

    let mut rows = Vec::new();
    let mut runs = Vec::new();
    for agents in ["cli", "cli,cli2"] {
        let out = p(&format!("replay-{}.db", agents.replace(',', "-")));
        let r = json(&ok(&[
            "replay",
            &p("synth.db"),
            "-o",
            &out,
            "--lab",
            &name,
            "--agents",
            agents,
            "--json",
        ]));
        assert_eq!(r["connections"].as_u64(), Some(N), "{agents}: {r}");
        let per_agent = r["agents"].as_array().expect("agents in the summary");
        assert_eq!(per_agent.len(), agents.split(',').count(), "{r}");
        let sum: u64 = per_agent
            .iter()
            .map(|a| a["connections"].as_u64().unwrap())
            .sum();
        assert_eq!(sum, N, "every connection went to one agent: {r}");
        let meta: serde_json::Value = {
            let c = rusqlite::Connection::open(&out).unwrap();
            let v: String = c
                .query_row("SELECT value FROM meta WHERE key = 'agents'", [], |r| {
                    r.get(0)
                })
                .unwrap();
            serde_json::from_str(&v).unwrap()
        };
        assert_eq!(meta.as_array().map(|a| a.len()), Some(per_agent.len()));
        let srv = &r["server"]["response_delay_error"];
        rows.push(format!(
            "{:>2} client host(s) | {:>5} ok of {N} ({:>4} failed, {:>3} missing) | start lateness p50/p99/max {} µs (> 1 ms: {}) | server response-delay lateness p50/p99/max {} / {} / {} µs (> 1 ms: {}) | at most {} open | {:.0} s",
            per_agent.len(),
            r["ok"],
            r["failed"],
            r["missing"],
            three(&r["start_lateness_us"]),
            r["starts_over_1ms"],
            srv["p50_us"],
            srv["p99_us"],
            srv["max_us"],
            srv["over_1ms"],
            r["max_concurrent"],
            r["duration_s"].as_f64().unwrap_or(0.0),
        ));
        for a in per_agent {
            rows.push(format!(
                "     agent {} on {}: {} connections, {} ok, start lateness p50/p99/max {} µs, start instant {:.0} ms ahead",
                a["agent"].as_str().unwrap_or("?"),
                a["host"].as_str().unwrap_or("?"),
                a["connections"],
                a["ok"],
                three(&a["start_lateness_us"]),
                a["start_lead_ms"].as_f64().unwrap_or(0.0)
            ));
        }
        runs.push(r);
    }
    // shown with --nocapture / --show-output: the figures of the report
    eprintln!("same workload, same offered load (200 new connections/s, {N} connections):");
    for row in &rows {
        eprintln!("{row}");
    }

    let two = &runs[1];
    let ok_two = two["ok"].as_u64().unwrap();
    assert!(
        ok_two * 100 >= N * 99,
        "two agents completed {ok_two} of {N} (< 99%): {}",
        two["failures"]
    );
    for a in two["agents"].as_array().unwrap() {
        let n = a["connections"].as_u64().unwrap();
        // the Community ID hash splits 10,000 flows within a few percent of half
        assert!(
            (N * 45 / 100..=N * 55 / 100).contains(&n),
            "agent {} got {n} of {N}",
            a["agent"]
        );
    }
    // the capture at the server saw the replay: its analysis paired the connections
    assert!(
        two["missing"].as_u64().unwrap() * 100 <= N,
        "more than 1% of the replayed connections are missing from the server's capture: {}",
        two["missing"]
    );
}

/// A controller whose agent's host is cut off in the middle of a call: the call fails within
/// about the control channel's 30 s peer timeout (`TCP_USER_TIMEOUT`), saying the host
/// stopped answering, where it used to wait for the kernel's retransmissions (about 15
/// minutes; for ever on an idle connection). The agent serves a TCP control address in one
/// namespace, the controller calls it from the other, and the cut is the agent's end of the
/// veth going down, as a pulled cable or a powered-off host would leave it. The agent then
/// drops its end too (its own keepalive), so a role's thread is not held by a lost controller.
/// The call's own limit (`--agent-timeout`, 30 s by default) races the peer timeout it equals;
/// whichever ends the call, it names the host, not a busy agent: a request the agent's kernel
/// never acknowledged is told apart from one the agent has not answered.
#[test]
fn a_call_to_an_agent_whose_host_is_cut_off_fails_within_the_peer_timeout() {
    use crate::capture::{sh, Proc, VethLab};
    use mimic_replay::agent::{AgentClient, ControlAddr, ControllerTls};
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    let lab = VethLab::new("ka", 76);
    let tmp = tempdir();
    let pki = tmp.path().join("pki");
    ok(&["pki", "init", &pki.display().to_string()]);
    let control = format!("tcp:{}:7079", lab.srv_ip);
    let _agent = Proc(Some(
        lab.exec(&lab.srv, mimic_bin())
            .args(["-q", "agent", "--control", &control, "--pki"])
            .arg(&pki)
            .args(["--client-addr", &lab.srv_ip])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("starting mimic agent"),
    ));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (cut_tx, cut_rx) = std::sync::mpsc::channel::<()>();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let cli = lab.cli.clone();
    std::thread::spawn(move || {
        mimic_netemu::netns::enter(&cli).unwrap();
        let tls = ControllerTls::load(&pki).unwrap();
        let addr: ControlAddr = control.parse().unwrap();
        let until = Instant::now() + Duration::from_secs(15);
        let mut c = loop {
            match AgentClient::connect(&addr, &tls) {
                Ok(c) => break c,
                Err(e) if Instant::now() > until => panic!("the agent is not reachable: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        let before = c.info().expect("the agent answers before the cut");
        ready_tx.send(before.client_addrs.len()).unwrap();
        cut_rx.recv().unwrap();
        let t0 = Instant::now();
        let r = c.info().map(|_| ()).map_err(|e| e.to_string());
        let _ = done_tx.send((r, t0.elapsed()));
    });
    assert_eq!(
        ready_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the controller reached the agent"),
        1
    );
    sh(&format!("ip -n {} link set {} down", lab.srv, lab.srv_if));
    let t_cut = Instant::now();
    cut_tx.send(()).unwrap();
    // (a controller that waits on is left blocked in its thread: the namespaces go, the
    // kernel drops its connection after its own retransmissions)
    let (r, waited) = done_rx
        .recv_timeout(Duration::from_secs(90))
        .expect("the call across the cut was still waiting after 90 s");
    eprintln!("a call across the cut: {r:?} after {waited:.1?}");
    let e = r.expect_err("a call across the cut cannot be answered");
    assert!(
        e.contains("agent's host stopped answering during `info`"),
        "{e}"
    );
    // 30 s, and a retransmission timer that fires at most a few seconds past it
    assert!(
        waited >= Duration::from_secs(25) && waited <= Duration::from_secs(60),
        "the call failed after {waited:?}"
    );
    // the agent's side watches its controller the same way: its last word from it came just
    // before the cut, so its kernel drops the connection within seconds of the controller's
    let established = || {
        let o = mimic_netemu::netns::command(&lab.srv, "ss", ["-Htn", "state", "established"])
            .output()
            .expect("ss");
        stdout(&o).lines().filter(|l| l.contains(":7079")).count()
    };
    let until = Instant::now() + Duration::from_secs(20);
    while established() > 0 {
        assert!(
            Instant::now() < until,
            "the agent still holds its controller's connection 20 s after the controller gave up"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    eprintln!(
        "the agent dropped its controller's connection {:.1?} after the cut",
        t_cut.elapsed()
    );
}

/// A replay over two lab client agents, one of which hangs mid-replay (SIGSTOP: its host keeps
/// acknowledging, its process answers nothing). The replay's poll of the agents (`status`,
/// limited by `--agent-timeout`, here 8 s instead of the default 30 s) gives up on it, tells the
/// other agent to stop and ends with an error naming the hung agent and the limit, where it used
/// to wait for ever (Ctrl-C included).
/// The agents it started are gone afterwards, the stopped one too.
#[test]
fn a_replay_whose_agent_hangs_fails_naming_it_within_the_status_limit() {
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    require_root("agent lab test");
    for t in ["ip", "ss", "sysctl", "bridge"] {
        require_tool(t);
    }
    let tmp = tempdir();
    let d = tmp.path();
    let p = |f: &str| d.join(f).display().to_string();
    // 3,000 connections at 50 a second: a minute of replay, of which this test needs a few
    // seconds before the hang and the status limit after it
    synth(&p("synth.db"), 3_000, 50, 12);
    let name = lab_name("ah");
    let _down = LabDown(name.clone());
    ok(&["lab", "up", &name, "--clients", "2"]);
    let (cli, cli2) = (format!("{name}-cli"), format!("{name}-cli2"));

    /// The replay's process, killed if the test ends before it does.
    struct Replay(std::process::Child);
    impl Drop for Replay {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    /// A stopped process, continued and killed if the test ends first.
    struct Stopped(i32);
    impl Drop for Stopped {
        fn drop(&mut self) {
            // only while the pid is still a `mimic agent` (the replay reaps the agents it
            // started when it ends)
            if is_agent(self.0) {
                // SAFETY: signals to the agent process this test stopped.
                unsafe {
                    libc::kill(self.0, libc::SIGKILL);
                    libc::kill(self.0, libc::SIGCONT);
                }
            }
        }
    }
    // `mimic agent` processes in a namespace
    let agents_in = |ns: &str| -> Vec<i32> {
        mimic_netemu::netns::pids(ns)
            .into_iter()
            .filter(|&pid| is_agent(pid))
            .collect()
    };
    // replayed connections (TCP; the agents' control channel is a unix socket) in a namespace
    let tcp_in = |ns: &str| -> usize {
        let o = mimic_netemu::netns::command(ns, "ss", ["-Htan"])
            .output()
            .expect("ss");
        stdout(&o).lines().count()
    };

    let mut replay = Replay(
        mimic()
            .args(["replay", &p("synth.db"), "-o", &p("replay.db")])
            .args([
                "--lab",
                &name,
                "--agents",
                "cli,cli2",
                "--agent-timeout",
                "8",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting mimic replay"),
    );
    // the replay is under way once the second agent has connections open
    let until = Instant::now() + Duration::from_secs(120);
    while tcp_in(&cli2) == 0 {
        if let Some(st) = replay.0.try_wait().unwrap() {
            panic!("the replay ended ({st}) before its agents opened connections");
        }
        assert!(
            Instant::now() < until,
            "no replayed connection in {cli2} within 120 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let hung = agents_in(&cli2);
    assert_eq!(hung.len(), 1, "one agent in {cli2}: {hung:?}");
    assert_eq!(agents_in(&cli).len(), 1, "one agent in {cli}");
    // SAFETY: SIGSTOP to the agent process the replay started in the lab's namespace.
    assert_eq!(unsafe { libc::kill(hung[0], libc::SIGSTOP) }, 0);
    let _stopped = Stopped(hung[0]);
    let t_hang = Instant::now();
    let status = loop {
        if let Some(st) = replay.0.try_wait().unwrap() {
            break st;
        }
        assert!(
            t_hang.elapsed() < Duration::from_secs(120),
            "the replay still runs 120 s after its agent hung"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let waited = t_hang.elapsed();
    let mut err = String::new();
    use std::io::Read;
    replay
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    eprintln!("the replay ended {waited:.1?} after its agent hung ({status}): {err}");
    assert!(!status.success(), "a replay with a hung agent succeeded");
    assert!(
        err.contains("agent cli2")
            && err.contains("did not answer `status` within 8 s")
            && err.contains("raise --agent-timeout"),
        "the error names the hung agent and its call: {err}"
    );
    // the agent limit (8 s), polled every 200 ms, and the teardown of the others (a loose
    // guard against a hang, not a timing figure: the message above names the limit)
    assert!(
        waited >= Duration::from_secs(7) && waited <= Duration::from_secs(60),
        "the replay ended {waited:?} after its agent hung"
    );
    assert!(
        !std::path::Path::new(&p("replay.db")).exists(),
        "a failed replay left a replay database"
    );
    // the agents it started went with it, the stopped one too (killed: a stopped process
    // does not act on SIGTERM)
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let left: Vec<i32> = [&cli, &cli2].iter().flat_map(|ns| agents_in(ns)).collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < until,
            "agents {left:?} still run 10 s after the replay ended"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
