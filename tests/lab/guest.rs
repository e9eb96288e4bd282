//! Lab hosts on a kernel you name (issue 22, item 1): the router host as a QEMU guest on
//! Debian's stock kernel, netem pipes rendered by mimic installed in it with `mimic lab exec`,
//! measured with ping, iperf3 and UDP probes from the host's namespaces. The guest boots once,
//! in one test (`guest_lab_runs_mimics_netem_pipes_on_debians_kernel`), so the suite stays
//! fast; the bad-input tests boot nothing that comes up.
//!
//! Needs root, qemu-system-x86, busybox-static, cpio, iperf3 and apt access to Debian's
//! `linux-image-amd64` (fetched once into /var/cache/mimic/kernels); a missing one fails the
//! test with its name.

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use mimic_netemu::lab::LabInfo;
use mimic_netemu::netns;

use crate::common::{mimic, mimic_bin, require_root, stderr, stdout};
use crate::util::{
    debian_kernel, lab_name, ok_text, require_guest_tools, timed_check_unless_stolen, unstolen,
    wait_exiting, LabDown,
};

/// Pids of QEMU processes started for lab `name` (QEMU is named `mimic-NAME-emu`).
fn qemu_pids(name: &str) -> Vec<i32> {
    let tag = format!("mimic-{name}-emu");
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

/// Nothing of lab `name` is left: no QEMU, no namespace, no interface (tap or veth) of its
/// names in the host namespace, no runtime dir.
fn assert_nothing_left(name: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !qemu_pids(name).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(qemu_pids(name).is_empty(), "QEMU of {name} still runs");
    let info = LabInfo::for_name(name).unwrap();
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
}

/// A folder of the host's the guest sees at the same path (under target/, which may itself lie
/// under /tmp: the guest overlays the host's /tmp).
fn guest_visible_dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("guest-{name}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

struct GuestLab {
    name: String,
    info: LabInfo,
    dir: PathBuf,
    files: u32,
}

impl GuestLab {
    fn exec(&self, host: &str, cmd: &[&str]) -> Output {
        mimic()
            .args(["lab", "exec", &self.name, host, "--"])
            .args(cmd)
            .output()
            .unwrap()
    }

    fn exec_ok(&self, host: &str, cmd: &[&str]) -> String {
        let o = self.exec(host, cmd);
        assert!(
            o.status.success(),
            "lab exec {host} {cmd:?} failed ({}): {}{}",
            o.status,
            stdout(&o),
            stderr(&o)
        );
        stdout(&o)
    }

    /// Renders `table` with mimic's netem backend and applies it in the router guest.
    fn apply(&mut self, table: &str) {
        self.files += 1;
        let p = self.dir.join(format!("pipes-{}.toml", self.files));
        std::fs::write(&p, table).unwrap();
        let bin = mimic_bin();
        let out = self.exec_ok(
            "emu",
            &[
                bin.to_str().unwrap(),
                "netemu",
                "render",
                "--backend",
                "netem",
                "--pipes",
                p.to_str().unwrap(),
                "--client-if",
                &self.info.emu_cli_if,
                "--server-if",
                &self.info.emu_srv_if,
                "--apply",
            ],
        );
        eprintln!("applied in the guest: {}", out.trim());
        // `--apply` checks for netem in a throwaway namespace; the guest kernel frees it in
        // a kworker after the command returns, which on a TCG vCPU takes long enough to delay
        // the next packets (one ping of 142 ms right after an apply). Measure after it.
        std::thread::sleep(Duration::from_secs(1));
    }

    fn qdiscs(&self) -> serde_json::Value {
        serde_json::from_str(&self.exec_ok("emu", &["tc", "-j", "qdisc", "show"])).unwrap()
    }

    /// netem's drop counter summed over the guest's netem qdiscs.
    fn netem_drops(&self) -> u64 {
        let v: serde_json::Value =
            serde_json::from_str(&self.exec_ok("emu", &["tc", "-s", "-j", "qdisc", "show"]))
                .unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .filter(|q| q["kind"] == "netem")
            .map(|q| q["drops"].as_u64().unwrap_or(0))
            .sum()
    }

    /// `ping` from the client namespace: probes sent and received, min and avg RTT (ms).
    fn ping(&self, args: &[&str]) -> Ping {
        let o = netns::command(&self.info.ns_cli, "ping", args)
            .output()
            .unwrap();
        let text = stdout(&o);
        let line = text
            .lines()
            .find(|l| l.contains("packets transmitted"))
            .unwrap_or_else(|| panic!("no ping summary: {text}{}", stderr(&o)));
        let nums: Vec<u64> = line
            .split(',')
            .take(2)
            .map(|f| f.split_whitespace().next().unwrap().parse().unwrap())
            .collect();
        let rtt: Vec<f64> = text
            .lines()
            .find(|l| l.starts_with("rtt"))
            .and_then(|l| l.split('=').nth(1))
            .map(|v| {
                v.split_whitespace()
                    .next()
                    .unwrap_or("")
                    .split('/')
                    .map(|x| x.parse().unwrap_or(f64::NAN))
                    .collect()
            })
            .unwrap_or_default();
        eprintln!("ping {args:?}: {}", text.lines().last().unwrap_or(""));
        Ping {
            sent: nums[0],
            got: nums[1],
            min: rtt.first().copied().unwrap_or(f64::NAN),
            avg: rtt.get(1).copied().unwrap_or(f64::NAN),
        }
    }
}

/// One `ping -q` summary.
struct Ping {
    sent: u64,
    got: u64,
    min: f64,
    avg: f64,
}

impl Ping {
    /// Checks a pipe that should give a round trip of `want` ms: its minimum `want` within
    /// 2 ms over the unshaped guest's minimum (the probes the TCG guest disturbed least), and
    /// its average within 2 ms of `want - reference_rtt` over the average of `reference`, a
    /// netem pipe of `reference_rtt` ms whose packets wait on the same late timers.
    fn check_delay(
        &self,
        unshaped: &Ping,
        reference: &Ping,
        reference_rtt: f64,
        want: f64,
        what: &str,
    ) -> Result<(), String> {
        let (dmin, davg) = (self.min - unshaped.min, self.avg - reference.avg);
        if self.got != self.sent {
            return Err(format!(
                "{what}: {} of {} probes lost",
                self.sent - self.got,
                self.sent
            ));
        }
        if (dmin - want).abs() <= 2.0 && (davg - (want - reference_rtt)).abs() <= 2.0 {
            return Ok(());
        }
        Err(format!(
            "{what}: min {} ms over the unshaped guest's {} (want {want} ± 2), avg {} ms over \
             the {reference_rtt} ms reference pipe's {} (want {} ± 2)",
            self.min,
            unshaped.min,
            self.avg,
            reference.avg,
            want - reference_rtt
        ))
    }
}

/// Sends `n` numbered UDP datagrams of `size` bytes from `src` in the client namespace to the
/// server, `per_ms` per millisecond (0: as fast as possible); returns the numbers the server
/// namespace received within `settle` after the last.
fn udp_probe(
    info: &LabInfo,
    src: Ipv4Addr,
    port: u16,
    n: u32,
    size: usize,
    per_ms: u32,
    settle: Duration,
) -> Vec<u32> {
    let srv_ns = info.ns_srv.clone();
    let bind = SocketAddr::new(info.server_addr.into(), port);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let rx = std::thread::spawn(move || {
        netns::enter(&srv_ns).unwrap();
        let s = UdpSocket::bind(bind).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        ready_tx.send(()).unwrap();
        let mut got = Vec::new();
        let mut buf = vec![0u8; 65536];
        let mut end: Option<Instant> = None;
        loop {
            if end.is_none() && done_rx.try_recv().is_ok() {
                end = Some(Instant::now() + settle);
            }
            if end.is_some_and(|e| Instant::now() >= e) {
                return got;
            }
            if let Ok((len, _)) = s.recv_from(&mut buf) {
                if len >= 4 {
                    got.push(u32::from_be_bytes(buf[..4].try_into().unwrap()));
                }
            }
        }
    });
    ready_rx.recv().unwrap();
    let cli_ns = info.ns_cli.clone();
    let dst = bind;
    std::thread::spawn(move || {
        netns::enter(&cli_ns).unwrap();
        let s = UdpSocket::bind(SocketAddr::new(src.into(), 0)).unwrap();
        let mut buf = vec![0u8; size];
        let t0 = Instant::now();
        for i in 0..n {
            buf[..4].copy_from_slice(&i.to_be_bytes());
            s.send_to(&buf, dst).unwrap();
            if per_ms > 0 && (i + 1) % per_ms == 0 {
                let due = t0 + Duration::from_millis(((i + 1) / per_ms) as u64);
                if let Some(d) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(d);
                }
            }
        }
    })
    .join()
    .unwrap();
    done_tx.send(()).unwrap();
    rx.join().unwrap()
}

#[test]
fn guest_lab_runs_mimics_netem_pipes_on_debians_kernel() {
    require_guest_tools("guest lab tests", &["ping", "iperf3"]);
    let kernel = debian_kernel();
    let name = lab_name("gu");
    let _g = LabDown(name.clone());
    let t0 = Instant::now();
    let o = mimic()
        .args(["lab", "up", &name, "--kernel", kernel.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "lab up --kernel failed: {}", stderr(&o));
    eprintln!(
        "lab up --kernel took {:.1} s: {}",
        t0.elapsed().as_secs_f64(),
        stderr(&o).trim()
    );
    let info = LabInfo::for_name(&name).unwrap();

    // Status: each host and its kernel; the router runs the image's release.
    let st: serde_json::Value =
        serde_json::from_str(&ok_text(&["lab", "status", &name, "--json"])).unwrap();
    assert_eq!(st["up"], true, "{st:#}");
    let hosts = st["hosts"].as_array().unwrap();
    let by_role = |r: &str| hosts.iter().find(|h| h["role"] == r).unwrap().clone();
    let emu = by_role("emu");
    assert_eq!(emu["kind"], "guest", "{emu:#}");
    let want = emu["guest"]["kernel"]["version"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(want.ends_with("-amd64"), "{want}");
    assert_eq!(emu["kernel"], want.as_str());
    let host_release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    for r in ["cli", "srv"] {
        assert_eq!(by_role(r)["kind"], "namespace");
        assert_eq!(by_role(r)["kernel"], host_release.trim());
    }
    eprintln!(
        "guest: accel {} ({}), booted in {:.1} s",
        emu["guest"]["accel"], emu["guest"]["accel_why"], emu["guest"]["boot_secs"]
    );
    let text = ok_text(&["lab", "status", &name]);
    assert!(text.contains(&format!("kernel {want}")), "{text}");

    // A plain `lab up` leaves the guest lab as it is (the same QEMU); mimic's own datapath is
    // refused on veths that are joined to the guest's taps.
    let pid = emu["guest"]["pid"].as_i64().unwrap();
    ok_text(&["lab", "up", &name]);
    assert_eq!(qemu_pids(&name), vec![pid as i32]);
    let o = mimic()
        .args(["netemu", "run", "--lab", &name, "--default", "delay=1ms"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("is a QEMU guest"), "{}", stderr(&o));

    // lab exec: exit status and both streams come back, namespace or guest alike.
    let o = mimic()
        .args([
            "lab",
            "exec",
            &name,
            "emu",
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; exit 7",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(7));
    assert_eq!(stdout(&o), "out\n");
    assert_eq!(stderr(&o), "err\n");
    let o = mimic()
        .args(["lab", "exec", &name, "srv", "--", "sh", "-c", "exit 5"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(5));
    let mut lab = GuestLab {
        name: name.clone(),
        info: info.clone(),
        dir: guest_visible_dir(&name),
        files: 0,
    };
    assert_eq!(lab.exec_ok("emu", &["uname", "-r"]).trim(), want);
    // The guest has netem (a module of the stock kernel, loaded at boot).
    let lsmod = lab.exec_ok("emu", &["cat", "/proc/modules"]);
    assert!(lsmod.contains("sch_netem "), "{lsmod}");

    // 0. The guest's own forwarding, before any pipe: what an emulated CPU adds to every
    // round trip (TCG: 0.6-2.6 ms on this project's VMs; about 0.05 ms on hardware) is not
    // netem's, so the delays below are judged on what the pipes add to it, with the same ping.
    // (the references below are measured again while the hypervisor took the CPU)
    let base = unstolen("the unshaped guest's ping", || {
        lab.ping(&["-c", "200", "-i", "0.02", "-q", "198.18.0.1"])
    });
    assert_eq!(
        base.got, base.sent,
        "ping through the unshaped guest lost probes"
    );
    assert!(
        base.avg < 10.0,
        "the guest forwards too slowly to judge netem's delays: unshaped ping avg {} ms",
        base.avg
    );

    // A packet netem delays leaves on a timer, and a TCG guest's timers fire late, the more so
    // on a loaded host: the averages through 20 and 30 ms each way were 41.0-41.7 and
    // 60.9-61.9 ms over the unshaped guest's in eight CI-mode runs, and one CI run failed on
    // 62.15. The lateness grows with the delay up to about 10 ms each way and then stays (one
    // CI-mode run: 0.5 ms per round trip at 1 ms each way, 1.7-1.9 ms at 10, 20 and 30; the
    // 30 ms pipe's average 40.0 ms over the 10 ms pipe's, 39.9-40.3 in four runs here). So
    // the averages are judged against a netem pipe of 10 ms each way, which waits on the same
    // timers, and the minima against the unshaped guest.
    lab.apply("[default]\nboth = \"delay=10ms\"\n");
    // the first apply after boot: ten probes first, so that a late first one (45 ms once)
    // does not weigh on the reference's average
    lab.ping(&["-c", "10", "-i", "0.02", "-q", "198.18.0.1"]);
    let reference = unstolen("the 10 ms reference pipe's ping", || {
        lab.ping(&["-c", "200", "-i", "0.02", "-q", "198.18.0.1"])
    });
    assert_eq!(
        reference.got, reference.sent,
        "ping through 10 ms each way lost probes"
    );

    // 1. 20 ms each way: ping average 40 ms ± 2 ms (20 over the 10 ms pipe's), minimum 40 ± 2
    // over the unshaped guest's.
    lab.apply("[default]\nboth = \"delay=20ms\"\n");
    // (timed checks: tried again only when the hypervisor took the CPU meanwhile, and not
    // judged when it took it in every try: a CI-mode run with 8-16% stolen in each of three
    // tries had pipe 1's average 2.4-3.9 ms over the reference's; the minima stayed within 2 ms)
    timed_check_unless_stolen("20 ms each way", |_| {
        let p = lab.ping(&["-c", "200", "-i", "0.02", "-q", "198.18.0.1"]);
        p.check_delay(&base, &reference, 20.0, 40.0, "20 ms each way")
    });

    // 2. Applying the rendered script twice leaves the same `tc -j qdisc show`; two pipes
    // see only their own settings.
    let two = "[[prefix]]\nclient = \"198.19.0.1/32\"\nserver = \"198.18.0.1/32\"\nboth = \"delay=10ms\"\n\n\
               [[prefix]]\nclient = \"198.19.0.2/32\"\nserver = \"198.18.0.1/32\"\nboth = \"delay=30ms\"\n";
    lab.apply(two);
    let first = lab.qdiscs();
    lab.apply(two);
    assert_eq!(lab.qdiscs(), first, "a second apply changed the qdiscs");
    let ping_from =
        |src: &str| lab.ping(&["-c", "100", "-i", "0.02", "-q", "-I", src, "198.18.0.1"]);
    for (src, want, what) in [
        ("198.19.0.1", 20.0, "pipe 1 (10 ms each way)"),
        ("198.19.0.2", 60.0, "pipe 2 (30 ms each way)"),
    ] {
        timed_check_unless_stolen(what, |_| {
            ping_from(src).check_delay(&base, &reference, 20.0, want, what)
        });
    }
    // Against the unshaped guest: its minimum, and no more than 2 ms on the average (one-sided:
    // the unshaped ping right after boot once averaged 2.4 ms with a 101 ms outlier).
    timed_check_unless_stolen("unmatched traffic", |_| {
        let p0 = lab.ping(&["-c", "100", "-i", "0.02", "-q", "198.18.0.1"]);
        if (p0.min - base.min).abs() <= 2.0 && p0.avg - base.avg < 2.0 {
            Ok(())
        } else {
            Err(format!(
                "unmatched traffic is not shaped: min {} / avg {} ms against the unshaped \
                 guest's {} / {}",
                p0.min, p0.avg, base.min, base.avg
            ))
        }
    });

    // 3. 10 Mbit/s: iperf3 goodput within ±5% of rate × payload share (1448 of 1500 IP
    // bytes: mimic's rate counts IP bytes, the netem rendering charges htb accordingly).
    lab.apply("[default]\nboth = \"delay=5ms,rate=10mbit,queue=100\"\n");
    // (a timed check: the guest's htb and netem run on emulated timers, which the hypervisor's
    // steal slows as it slows the delays above)
    let expect = 10e6 * 1448.0 / 1500.0;
    timed_check_unless_stolen("iperf3 through 10 Mbit/s in the guest", |_| {
        let mut srv = netns::command(&info.ns_srv, "iperf3", ["-s", "-1", "-B", "198.18.0.1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let json = loop {
            let o = netns::command(
                &info.ns_cli,
                "iperf3",
                ["-c", "198.18.0.1", "-t", "8", "-O", "2", "-J"],
            )
            .output()
            .unwrap();
            // iperf3 -J reports a failure (e.g. a server not yet listening) in an `error` field.
            let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap_or_default();
            if o.status.success() && v.get("error").is_none() {
                break stdout(&o);
            }
            assert!(
                Instant::now() < deadline,
                "iperf3 failed: {}{}",
                stdout(&o),
                stderr(&o)
            );
            std::thread::sleep(Duration::from_millis(200));
        };
        let _ = srv.kill();
        let _ = srv.wait();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        let bps = v["end"]["sum_received"]["bits_per_second"]
            .as_f64()
            .unwrap();
        eprintln!(
            "iperf3 through 10 Mbit/s in the guest: {:.3} Mbit/s received, {:.3} expected ({:+.2}%)",
            bps / 1e6,
            expect / 1e6,
            (bps / expect - 1.0) * 100.0
        );
        if (bps / expect - 1.0).abs() <= 0.05 {
            Ok(())
        } else {
            Err(format!("goodput {bps} vs {expect}"))
        }
    });

    // 4. 1% loss over 20,000 probes loses 0.8–1.2%, and netem counted every loss. netem's
    // draws take no seed on this kernel, so the count lost is binomial(20000, 0.01): sd 14.1,
    // and 0.8–1.2% (160–240) is 2.84 sd, outside which a right 1% falls once in 250 runs. A
    // second, independent 20,000 then decides (both outside: once in 60,000 runs); it must
    // be inside, and netem must have counted every loss of both.
    lab.apply("[default]\nup = \"loss=1%\"\ndown = \"delay=0ms\"\n");
    let n = 20_000u32;
    for round in 1..=2 {
        let drops0 = lab.netem_drops();
        let got = udp_probe(
            &info,
            Ipv4Addr::new(198, 19, 0, 9),
            9001,
            n,
            100,
            2,
            Duration::from_secs(1),
        );
        let lost = n as usize - got.len();
        let share = lost as f64 / n as f64 * 100.0;
        let counted = lab.netem_drops() - drops0;
        eprintln!(
            "1% loss, round {round}: {lost} of {n} lost ({share:.2}%), netem counted {counted}"
        );
        assert_eq!(counted as usize, lost, "losses that netem did not make");
        if (0.8..=1.2).contains(&share) {
            break;
        }
        assert!(round < 2, "lost {share:.2}% in a second round too");
    }

    // 5. A burst larger than the queue drops the excess: 100 datagrams at once into a
    // 30-packet queue. At 100 kbit/s (netem's own rate) a 1028-byte datagram leaves every
    // 82 ms, the first after its own serialization, so none leaves while the TCG guest takes
    // the burst in (~20 ms):
    // netem's queue (its `limit`: the queue plus the delay line, see netemu/README.md) fills,
    // and the rest is dropped by netem.
    lab.apply("[default]\nup = \"rate=100kbit,queue=30\"\ndown = \"delay=0ms\"\n");
    let limit = lab
        .qdiscs()
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["kind"] == "netem" && q["dev"] == info.emu_srv_if.as_str())
        .and_then(|q| q["options"]["limit"].as_u64())
        .expect("netem limit on the upstream interface");
    let drops0 = lab.netem_drops();
    let got = udp_probe(
        &info,
        Ipv4Addr::new(198, 19, 0, 10),
        9002,
        100,
        1000,
        0,
        Duration::from_secs(4),
    );
    let dropped = lab.netem_drops() - drops0;
    eprintln!(
        "burst of 100 into queue 30 (netem limit {limit}): {} delivered, netem dropped {dropped}",
        got.len()
    );
    let n = got.len() as u64;
    assert!(
        n >= 30 && n <= limit + 2,
        "delivered {n} of a 100-datagram burst into a 30-packet queue (netem limit {limit})"
    );
    assert_eq!(
        n + dropped,
        100,
        "every datagram delivered or dropped by netem"
    );
    assert_eq!(
        got,
        (0..n as u32).collect::<Vec<_>>(),
        "drop-tail keeps the head"
    );

    // 6. Teardown leaves none of mimic's qdiscs (root handle 6d69:), only the kernel's.
    let bin = mimic_bin();
    lab.exec_ok(
        "emu",
        &[
            bin.to_str().unwrap(),
            "netemu",
            "render",
            "--backend",
            "netem",
            "--teardown",
            "--client-if",
            &info.emu_cli_if,
            "--server-if",
            &info.emu_srv_if,
            "--apply",
        ],
    );
    let q = lab.qdiscs();
    for x in q.as_array().unwrap() {
        assert!(
            !x["handle"].as_str().unwrap_or("").starts_with("6d69:") && x["kind"] != "netem",
            "left after teardown: {x}"
        );
    }

    // 7. A crash: QEMU killed with SIGKILL; status says so, `lab down` leaves nothing.
    let pids = qemu_pids(&name);
    assert_eq!(pids.len(), 1, "{pids:?}");
    // SAFETY: killing the QEMU this test's lab started.
    unsafe { libc::kill(pids[0], libc::SIGKILL) };
    wait_exiting(&pids);
    let o = mimic().args(["lab", "status", &name]).output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stdout(&o).contains("NOT running"), "{}", stdout(&o));
    ok_text(&["lab", "down", &name]);
    assert_nothing_left(&name);

    // 8. The owning process killed while the guest boots: `lab down` still removes it all.
    let mut up = mimic()
        .args(["lab", "up", &name, "--kernel", kernel.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while qemu_pids(&name).is_empty() {
        assert!(Instant::now() < deadline, "QEMU did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = up.kill();
    let _ = up.wait();
    assert!(
        !qemu_pids(&name).is_empty(),
        "QEMU should outlive the killed lab up"
    );
    ok_text(&["lab", "down", &name]);
    assert_nothing_left(&name);
    let _ = std::fs::remove_dir_all(&lab.dir);
}

#[test]
fn lab_up_with_a_file_that_is_not_a_kernel_names_it_and_builds_nothing() {
    require_root("guest lab tests");
    let name = lab_name("gu");
    let _g = LabDown(name.clone());
    let d = crate::common::tempdir();
    let bogus = d.path().join("vmlinuz-bogus");
    std::fs::write(&bogus, vec![0x42u8; 8192]).unwrap();
    let o = mimic()
        .args(["lab", "up", &name, "--kernel", bogus.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("vmlinuz-bogus") && e.contains("not a Linux kernel image"),
        "{e}"
    );
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    assert_nothing_left(&name);
}

#[test]
fn lab_up_without_qemu_says_so_and_leaves_nothing() {
    require_guest_tools("guest lab tests", &["ping", "iperf3"]);
    let kernel = debian_kernel();
    let name = lab_name("gu");
    let _g = LabDown(name.clone());
    // An override naming a binary that does not exist.
    let o = mimic()
        .env("MIMIC_QEMU", "/nonexistent/qemu-system-x86_64")
        .args(["lab", "up", &name, "--kernel", kernel.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("QEMU not found") && e.contains("/nonexistent/qemu"),
        "{e}"
    );
    assert_nothing_left(&name);
    // No QEMU on PATH.
    let o = mimic()
        .env("PATH", "/usr/sbin:/sbin")
        .args(["lab", "up", &name, "--kernel", kernel.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("QEMU not found") && e.contains("qemu-system-x86"),
        "{e}"
    );
    assert_nothing_left(&name);
}

#[test]
fn a_guest_that_does_not_come_up_in_time_is_killed_and_the_lab_removed() {
    require_guest_tools("guest lab tests", &["ping", "iperf3"]);
    let kernel = debian_kernel();
    let name = lab_name("gu");
    let _g = LabDown(name.clone());
    let t0 = Instant::now();
    let o = mimic()
        .args([
            "lab",
            "up",
            &name,
            "--kernel",
            kernel.to_str().unwrap(),
            "--boot-timeout",
            "1s",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains(&format!("guest {name}-emu did not come up within 1.0 s"))
            && e.contains("console"),
        "{e}"
    );
    // its console is kept where the lab's cleanup leaves it, and named
    let console = std::env::temp_dir().join(format!("mimic-{name}-emu.console"));
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
    assert_nothing_left(&name);
}

#[test]
fn a_guest_booted_with_highres_off_runs_its_timers_on_the_tick() {
    require_guest_tools("guest lab tests", &["ping", "iperf3"]);
    let kernel = debian_kernel();
    let name = lab_name("gu");
    let _g = LabDown(name.clone());
    // Words that would take the lab's own keys are refused before anything is built.
    for (line, needle) in [
        ("highres=off console=tty0", "`console`"),
        ("mimic_host=x", "`mimic_host`"),
        ("highres=off\nnohz=off", "control character"),
    ] {
        let o = mimic()
            .args(["lab", "up", &name, "--kernel", kernel.to_str().unwrap()])
            .args(["--kernel-cmdline", line])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{line:?}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(e.contains("--kernel-cmdline") && e.contains(needle), "{e}");
        assert_nothing_left(&name);
    }
    let o = mimic()
        .args(["lab", "up", &name, "--kernel-cmdline", "highres=off"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("--kernel or --server-kernel"),
        "{}",
        stderr(&o)
    );
    assert_nothing_left(&name);

    let o = mimic()
        .args(["lab", "up", &name, "--kernel", kernel.to_str().unwrap()])
        .args(["--kernel-cmdline", "highres=off"])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "lab up --kernel-cmdline failed: {}",
        stderr(&o)
    );
    let st: serde_json::Value =
        serde_json::from_str(&ok_text(&["lab", "status", &name, "--json"])).unwrap();
    let emu = st["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["role"] == "emu")
        .unwrap()
        .clone();
    assert_eq!(emu["guest"]["cmdline"], serde_json::json!(["highres=off"]));
    let text = ok_text(&["lab", "status", &name]);
    assert!(
        text.contains("extra kernel command line: highres=off"),
        "{text}"
    );
    let lab = GuestLab {
        name: name.clone(),
        info: LabInfo::for_name(&name).unwrap(),
        dir: guest_visible_dir(&name),
        files: 0,
    };
    let cmdline = lab.exec_ok("emu", &["cat", "/proc/cmdline"]);
    assert!(cmdline.trim_end().ends_with(" highres=off"), "{cmdline}");
    assert!(
        cmdline.contains(&format!("mimic_host={name}-emu")),
        "{cmdline}"
    );
    // hrtimers at the tick: Debian's kernel is HZ=250, a 4 ms resolution (1 ns with highres on).
    let tl = lab.exec_ok("emu", &["cat", "/proc/timer_list"]);
    let res: u64 = tl
        .lines()
        .find_map(|l| l.trim().strip_prefix(".resolution:"))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("no .resolution in the guest's /proc/timer_list: {tl}"));
    assert_eq!(res, 4_000_000, "hrtimer resolution in the guest");
}
