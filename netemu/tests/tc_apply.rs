//! The netem backend applied to a real kernel: inside network namespaces this test creates
//! (names carry the pid and a counter; a guard deletes them), with pfifo leaves in place of
//! netem because this kernel has htb and u32 but no sch_netem (the netem leaves need a kernel
//! that has it, e.g. Debian's stock kernel in a QEMU guest). Needs root and `tc`/`ip`
//! (iproute2): without them the tests FAIL saying so.
//!
//! `cargo test -p mimic-netemu --test tc_apply -- --nocapture --test-threads=1` prints the
//! install times for 1,000 / 10,000 / 65,536 pipes.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use mimic_netemu::engine::{FlowRule, PipeTable};
use mimic_netemu::render::{
    apply, apply_teardown, render, root_qdisc, ApplyOptions, Backend, Leaf, RenderError,
    RenderOptions, RootQdisc, TC_GROUP_PIPES,
};
use mimic_netemu::PipeConfig;

static NEXT: AtomicU32 = AtomicU32::new(0);

fn need_root_and_iproute2() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "these tests need root (network namespaces, tc); run them as root"
    );
    for tool in ["ip", "tc"] {
        assert!(
            Command::new(tool).arg("-V").output().is_ok(),
            "`{tool}` (iproute2) is missing: apt-get install iproute2"
        );
    }
}

fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", args.join(" ")));
    assert!(
        out.status.success(),
        "`{}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Namespaces this test created; deleted (with their veths) on drop, even after a panic.
struct Namespaces(Vec<String>);

impl Namespaces {
    fn new(roles: &[&str]) -> Self {
        need_root_and_iproute2();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let mut g = Namespaces(Vec::new());
        for r in roles {
            let ns = format!("mimic-tcapply-{}-{n}-{r}", std::process::id());
            sh(&["ip", "netns", "add", &ns]);
            g.0.push(ns.clone());
            // no IPv6 chatter (router solicitations, MLD) to move counters or fill classes
            sh(&[
                "ip",
                "netns",
                "exec",
                &ns,
                "sysctl",
                "-qw",
                "net.ipv6.conf.all.disable_ipv6=1",
                "net.ipv6.conf.default.disable_ipv6=1",
            ]);
        }
        g
    }
    fn ns(&self, i: usize) -> &str {
        &self.0[i]
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in &self.0 {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// One namespace with a veth pair `cif` (client side) / `sif` (server side), both up.
fn one_router() -> Namespaces {
    let g = Namespaces::new(&["r"]);
    let r = g.ns(0);
    sh(&[
        "ip", "-n", r, "link", "add", "cif", "type", "veth", "peer", "name", "sif",
    ]);
    sh(&["ip", "-n", r, "link", "set", "cif", "up"]);
    sh(&["ip", "-n", r, "link", "set", "sif", "up"]);
    g
}

fn ropts() -> RenderOptions {
    RenderOptions {
        leaf: Leaf::Pfifo,
        ..RenderOptions::new("cif", "sif")
    }
}

fn in_ns(ns: &str) -> ApplyOptions {
    ApplyOptions {
        netns: Some(ns.into()),
        force: false,
    }
}

fn golden_table() -> PipeTable {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/table.toml");
    mimic_netemu::table::load(&p).unwrap()
}

/// Everything tc shows under both interfaces, as JSON text.
fn tc_state(ns: &str) -> String {
    let mut s = String::new();
    for dev in ["cif", "sif"] {
        for what in ["qdisc", "class", "filter"] {
            s += &sh(&["tc", "-n", ns, "-j", what, "show", "dev", dev]);
            s.push('\n');
        }
    }
    s
}

/// `n` flows the way a replay lays them out: pool address i mod 8190, port 20000 + i / 8190.
fn flows(n: usize) -> PipeTable {
    let up: PipeConfig = "delay=20ms,queue=10".parse().unwrap();
    let down: PipeConfig = "delay=20ms,rate=10mbit,loss=1%,queue=30".parse().unwrap();
    PipeTable {
        flows: (0..n)
            .map(|i| FlowRule {
                client: SocketAddr::new(
                    Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 19, 0, 1)) + (i % 8190) as u32)
                        .into(),
                    20_000 + (i / 8190) as u16,
                ),
                server: "198.18.0.1:80".parse().unwrap(),
                up: up.clone(),
                down: down.clone(),
            })
            .collect(),
        ..Default::default()
    }
}

#[test]
fn applying_twice_gives_the_same_state_and_teardown_leaves_none_of_mimics() {
    let g = one_router();
    let ns = g.ns(0);
    let before = tc_state(ns);
    let s = render(Backend::Netem, &golden_table(), &ropts()).unwrap();
    let r = apply(Backend::Netem, &s, &ropts(), &in_ns(ns)).unwrap();
    assert!(r.replaced.is_empty(), "{r:?}");
    let once = tc_state(ns);
    assert!(once.contains("\"handle\":\"6d69:\""), "{once}");
    let r = apply(Backend::Netem, &s, &ropts(), &in_ns(ns)).unwrap();
    assert_eq!(
        r.replaced,
        ["sif", "cif"],
        "the second apply replaces the first"
    );
    let twice = tc_state(ns);
    assert_eq!(once, twice, "a second apply changed the state");
    // one htb class per pipe + the catch-all, one leaf per pipe, on each interface
    for dev in ["cif", "sif"] {
        let classes = sh(&["tc", "-n", ns, "class", "show", "dev", dev]);
        assert_eq!(classes.lines().count(), 1 + 4, "{dev}: {classes}");
    }
    let r = apply_teardown(Backend::Netem, None, &ropts(), &in_ns(ns)).unwrap();
    assert_eq!(r.replaced, ["sif", "cif"]);
    assert_eq!(tc_state(ns), before, "teardown left something behind");
    // nothing of mimic's left: a second teardown does nothing
    let r = apply_teardown(Backend::Netem, None, &ropts(), &in_ns(ns)).unwrap();
    assert!(r.replaced.is_empty());
}

#[test]
fn a_root_qdisc_mimic_did_not_install_is_refused_unless_forced_and_never_torn_down() {
    let g = one_router();
    let ns = g.ns(0);
    sh(&[
        "tc", "-n", ns, "qdisc", "add", "dev", "sif", "root", "handle", "1:", "htb", "default", "1",
    ]);
    let theirs = tc_state(ns);
    let s = render(Backend::Netem, &golden_table(), &ropts()).unwrap();
    let e = apply(Backend::Netem, &s, &ropts(), &in_ns(ns)).unwrap_err();
    assert!(
        matches!(&e, RenderError::ForeignRoot { dev, kind, handle } if dev == "sif" && kind == "htb" && handle == "1:"),
        "{e}"
    );
    assert!(e.to_string().contains("--force"), "{e}");
    assert_eq!(tc_state(ns), theirs, "a refused apply changed something");
    // the teardown leaves someone else's root alone
    apply_teardown(Backend::Netem, None, &ropts(), &in_ns(ns)).unwrap();
    assert_eq!(
        tc_state(ns),
        theirs,
        "the teardown removed a qdisc mimic did not install"
    );
    // the rendered shell script refuses too (`qdisc add` over another root fails)
    let script = s.to_shell().replace("tc ", &format!("tc -n {ns} "));
    let out = Command::new("sh")
        .args(["-e", "-c", &script])
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "the shell script replaced their root"
    );
    assert_eq!(tc_state(ns), theirs);
    // --force replaces it
    let forced = ApplyOptions {
        force: true,
        ..in_ns(ns)
    };
    let r = apply(Backend::Netem, &s, &ropts(), &forced).unwrap();
    assert_eq!(r.forced, ["sif"]);
    assert_eq!(root_qdisc("sif", &in_ns(ns)).unwrap(), RootQdisc::Mimic);
    apply_teardown(Backend::Netem, None, &ropts(), &in_ns(ns)).unwrap();
}

#[test]
fn a_missing_interface_is_an_error_naming_it_before_anything_changes() {
    let g = one_router();
    let ns = g.ns(0);
    let before = tc_state(ns);
    let o = RenderOptions {
        leaf: Leaf::Pfifo,
        ..RenderOptions::new("cif", "nosuchif0")
    };
    let s = render(Backend::Netem, &golden_table(), &o).unwrap();
    let e = apply(Backend::Netem, &s, &o, &in_ns(ns)).unwrap_err();
    assert!(
        matches!(&e, RenderError::Interface { dev, .. } if dev == "nosuchif0"),
        "{e}"
    );
    assert_eq!(tc_state(ns), before);
}

#[test]
fn the_real_netem_leaf_is_refused_on_a_kernel_without_netem_before_any_change() {
    let g = one_router();
    let ns = g.ns(0);
    let before = tc_state(ns);
    let o = RenderOptions::new("cif", "sif");
    let s = render(Backend::Netem, &golden_table(), &o).unwrap();
    match apply(Backend::Netem, &s, &o, &in_ns(ns)) {
        // a kernel with netem (a guest): then it must have installed
        Ok(_) => {
            assert_eq!(root_qdisc("cif", &in_ns(ns)).unwrap(), RootQdisc::Mimic);
        }
        Err(e) => {
            assert!(matches!(e, RenderError::NoNetem(_)), "{e}");
            assert_eq!(tc_state(ns), before);
        }
    }
}

/// Three namespaces (client, router, server): packets of each flow land in its own class,
/// everything else in the default class — the hashed u32 filters classify, not just install.
#[test]
fn hashed_filters_put_each_connection_in_its_own_class() {
    classify_two_connections(0);
}

/// As above with 300 more flows, so each interface's pipes go into two groups (nested htb
/// qdiscs, a filter to the group at the root and one to the pipe in the group): flow #1 is in
/// the first group, flow #2 in the second.
#[test]
fn grouped_filters_put_each_connection_in_its_own_class() {
    classify_two_connections(300);
}

/// The class a rendered script gives to the `dir` ("up" or "down") pipe of flow `n`.
fn class_of(script: &str, n: usize, dir: &str) -> String {
    let mut lines = script.lines();
    let head = format!("# flow #{n} ");
    lines
        .find(|l| l.starts_with(&head) && l.contains(&format!(" {dir}: ")))
        .and_then(|_| lines.next())
        .and_then(|l| l.split_whitespace().skip_while(|w| *w != "classid").nth(1))
        .unwrap_or_else(|| panic!("no class for flow #{n} {dir} in\n{script}"))
        .to_string()
}

fn classify_two_connections(filler: usize) {
    assert!(
        Command::new("curl").arg("--version").output().is_ok(),
        "curl is missing (it opens connections from chosen ports): apt-get install curl"
    );
    let g = Namespaces::new(&["c", "r", "s"]);
    let (c, r, s) = (g.ns(0), g.ns(1), g.ns(2));
    sh(&[
        "ip", "-n", r, "link", "add", "cif", "type", "veth", "peer", "name", "c0", "netns", c,
    ]);
    sh(&[
        "ip", "-n", r, "link", "add", "sif", "type", "veth", "peer", "name", "s0", "netns", s,
    ]);
    for (ns, dev, addr) in [
        (c, "c0", "198.18.1.2/24"),
        (r, "cif", "198.18.1.1/24"),
        (r, "sif", "198.18.0.2/24"),
        (s, "s0", "198.18.0.1/24"),
    ] {
        sh(&["ip", "-n", ns, "addr", "add", addr, "dev", dev]);
        sh(&["ip", "-n", ns, "link", "set", dev, "up"]);
    }
    for a in ["198.19.0.7/32", "198.19.0.8/32", "198.19.0.9/32"] {
        sh(&["ip", "-n", c, "addr", "add", a, "dev", "lo"]);
    }
    sh(&["ip", "-n", c, "link", "set", "lo", "up"]);
    sh(&[
        "ip",
        "-n",
        c,
        "route",
        "add",
        "default",
        "via",
        "198.18.1.1",
    ]);
    sh(&[
        "ip",
        "-n",
        s,
        "route",
        "add",
        "default",
        "via",
        "198.18.0.2",
    ]);
    sh(&[
        "ip",
        "-n",
        r,
        "route",
        "add",
        "198.19.0.0/16",
        "via",
        "198.18.1.2",
    ]);
    sh(&[
        "ip",
        "netns",
        "exec",
        r,
        "sysctl",
        "-qw",
        "net.ipv4.ip_forward=1",
    ]);
    let t: PipeTable = toml_table(
        r#"
[default]
both = "delay=1ms"
[[flow]]
client = "198.19.0.7:40000"
server = "198.18.0.1:80"
up = "delay=1ms"
down = "delay=1ms"
[[flow]]
client = "198.19.0.8:40001"
server = "198.18.0.1:80"
up = "delay=1ms"
down = "delay=1ms"
"#,
    );
    let mut t = t;
    // filler flows (never used) between flow #1 and flow #2
    let second = t.flows.pop().unwrap();
    for i in 0..filler {
        let mut f = t.flows[0].clone();
        f.client = SocketAddr::new(
            Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 19, 8, 1)) + i as u32).into(),
            30_000,
        );
        t.flows.push(f);
    }
    t.flows.push(second);
    let sc = render(Backend::Netem, &t, &ropts()).unwrap();
    let text = sc.to_shell();
    let last = t.flows.len();
    assert_eq!(text.contains("groups of"), filler > 0);
    apply(Backend::Netem, &sc, &ropts(), &in_ns(r)).unwrap();
    // each curl: SYN up, RST down (nothing listens), through its own pair of classes
    for (src, port) in [
        ("198.19.0.7", "40000"),
        ("198.19.0.8", "40001"),
        ("198.19.0.8", "40001"),
        ("198.19.0.9", "40002"),
    ] {
        let _ = Command::new("ip")
            .args([
                "netns",
                "exec",
                c,
                "curl",
                "-s",
                "--max-time",
                "2",
                "--interface",
                src,
                "--local-port",
                port,
                "http://198.18.0.1:80/",
            ])
            .output();
        // a reused local port waits out nothing: the RST closed the socket
    }
    // `tc -s class show` text (this iproute2 prints class statistics only as text):
    // "class htb 6d69:10 root ..." then " Sent B bytes P pkt ..."
    let packets = |dev: &str| -> Vec<(String, u64)> {
        let text = sh(&["tc", "-n", r, "-s", "class", "show", "dev", dev]);
        let mut v = Vec::new();
        let mut class = None;
        for l in text.lines() {
            let w: Vec<&str> = l.split_whitespace().collect();
            match w.as_slice() {
                ["class", "htb", id, ..] => class = Some(id.to_string()),
                ["Sent", _, "bytes", p, "pkt", ..] => {
                    if let Some(c) = class.take() {
                        v.push((c, p.parse().unwrap()));
                    }
                }
                _ => {}
            }
        }
        v.sort();
        v
    };
    // flow #1 -> its class (one connection), flow #2 -> its class (two connections, so twice
    // the packets), 198.19.0.9 -> the default class 6d69:2; the catch-all 6d69:1 sees nothing
    let up = packets("sif");
    let down = packets("cif");
    for (dir, v, d) in [("upstream", &up, "up"), ("downstream", &down, "down")] {
        let n = |id: &str| v.iter().find(|(c, _)| c == id).map(|x| x.1);
        let (first, second) = (class_of(&text, 1, d), class_of(&text, last, d));
        if filler == 0 {
            assert_eq!((first.as_str(), second.as_str()), ("6d69:10", "6d69:11"));
        } else {
            // in two different groups' qdiscs
            assert_ne!(first.split(':').next(), second.split(':').next());
        }
        let one = n(&first).unwrap();
        assert!(
            one >= 1,
            "{dir}: flow #1 saw nothing: {v:?}\n{}\n{}",
            sh(&["ip", "-n", r, "-s", "link"]),
            sh(&["ip", "-n", r, "route"])
        );
        assert_eq!(n(&second), Some(2 * one), "{dir}: {v:?}");
        // the filler flows' classes saw nothing
        let busy = v.iter().filter(|(_, p)| *p > 0).count();
        let groups = if filler > 0 { 2 } else { 0 };
        assert!(busy <= 3 + groups, "{dir}: {v:?}");
        assert!(n("6d69:2").unwrap() >= one, "{dir}: {v:?}");
        assert_eq!(n("6d69:1"), Some(0), "{dir}: {v:?}");
    }
    apply_teardown(Backend::Netem, None, &ropts(), &in_ns(r)).unwrap();
}

fn toml_table(text: &str) -> PipeTable {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.toml");
    std::fs::write(&p, text).unwrap();
    mimic_netemu::table::load(&p).unwrap()
}

/// Renders and installs `pipes` pipes (`pipes / 2` connections), checks the class count,
/// removes them; returns the install time and prints the figures.
fn time_install(ns: &str, pipes: usize) -> f64 {
    let t = flows(pipes / 2);
    let t0 = Instant::now();
    let s = render(Backend::Netem, &t, &ropts()).unwrap();
    let rendered = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let r = apply(Backend::Netem, &s, &ropts(), &in_ns(ns)).unwrap();
    let installed = t1.elapsed().as_secs_f64();
    eprintln!("tc install: {pipes} pipes applied in {installed:.2} s");
    let classes = sh(&["tc", "-n", ns, "class", "show", "dev", "sif"])
        .lines()
        .count();
    // the pipes' classes, the catch-all, and a class per group beyond one group's worth
    let per_if = pipes / 2;
    let groups = if per_if > TC_GROUP_PIPES {
        per_if.div_ceil(TC_GROUP_PIPES)
    } else {
        0
    };
    assert_eq!(classes, per_if + 1 + groups);
    let t2 = Instant::now();
    apply_teardown(Backend::Netem, None, &ropts(), &in_ns(ns)).unwrap();
    eprintln!(
        "tc install: {pipes} pipes ({} commands in one tc -batch): render {rendered:.3} s, apply {installed:.2} s, teardown {:.2} s",
        r.commands,
        t2.elapsed().as_secs_f64()
    );
    installed
}

/// Install time with `tc -batch` and hashed filters (pfifo leaves: this kernel has no netem).
/// Pipes are one direction each: N pipes = N/2 connections, N/2 classes + leaves + filters per
/// interface.
/// The times are printed, not asserted (timed assertions belong in benchmarks:
/// `bench/netem-install.sh`); what is checked is that every class arrives and leaves.
#[test]
fn install_1000_and_10000_pipes_in_one_batch() {
    let g = one_router();
    let ns = g.ns(0);
    time_install(ns, 1_000);
    time_install(ns, 10_000);
}

/// The kernel makes every new htb class walk all classes of its qdisc (reverse binding of
/// filters), so one htb with N classes installs in O(N^2): minutes at 65,536 pipes.
#[test]
#[ignore = "benchmark, minutes: bench/netem-install.sh"]
fn install_time_of_65536_pipes() {
    let g = one_router();
    time_install(g.ns(0), 65_536);
}
