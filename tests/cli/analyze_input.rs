//! `mimic analyze` input: a capture on standard input (`-`), the `--filter` capture filter
//! against tshark's counts, and the messages for a gzip that holds no capture and for a
//! capture cut short before its first frame.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use rusqlite::Connection;

use crate::analyze::{analyze, db, flate2_writer, run_with_timeout, summary, wait_with_timeout};
use crate::common::*;

/// Runs `mimic analyze - -o OUT --json EXTRA...` with `input`'s bytes on standard input.
fn analyze_stdin(input: &[u8], out: &Path, extra: &[&str]) -> Output {
    let mut child = mimic()
        .args(["analyze", "-", "--json", "-o"])
        .arg(out)
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn mimic");
    let mut stdin = child.stdin.take().unwrap();
    let bytes = input.to_vec();
    // written from another thread, in pieces with pauses, as a pipe from tcpdump delivers
    // them; mimic reads while it is written
    let writer = std::thread::spawn(move || {
        for (i, piece) in bytes.chunks(4096).enumerate() {
            if stdin.write_all(piece).is_err() {
                break;
            }
            if i % 16 == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    });
    let o = wait_with_timeout(child, Duration::from_secs(60), "mimic analyze -");
    writer.join().unwrap();
    o
}

/// Every row of a table (meta without the rows that name the input), in an order that
/// depends only on the rows.
fn rows(c: &Connection, table: &str) -> Vec<String> {
    let only = if table == "meta" {
        let keys: Vec<String> = NAMES_THE_INPUT.iter().map(|k| format!("'{k}'")).collect();
        format!(" WHERE key NOT IN ({})", keys.join(", "))
    } else {
        String::new()
    };
    let n = c
        .prepare(&format!("SELECT * FROM \"{table}\""))
        .unwrap()
        .column_count();
    let order: Vec<String> = (1..=n).map(|i| i.to_string()).collect();
    let mut st = c
        .prepare(&format!(
            "SELECT * FROM \"{table}\"{only} ORDER BY {}",
            order.join(", ")
        ))
        .unwrap();
    let r = st
        .query_map([], |r| {
            (0..n)
                .map(|i| r.get_ref(i).map(|v| format!("{v:?}")))
                .collect::<rusqlite::Result<Vec<_>>>()
                .map(|v| v.join("|"))
        })
        .unwrap()
        .collect::<rusqlite::Result<Vec<_>>>()
        .unwrap();
    r
}

/// Meta rows that name the input or the command line, and so differ between a file and the
/// same bytes on standard input.
const NAMES_THE_INPUT: [&str; 3] = ["inputs", "command", "input_issues"];

/// Two databases hold the same rows in every table, meta aside from the rows that name the
/// input; returns the number of rows compared.
fn same_database(a: &Path, b: &Path, what: &str) -> usize {
    let (ca, cb) = (db(a), db(b));
    let tables = |c: &Connection| -> Vec<String> {
        let mut st = c
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            .unwrap();
        let v = st
            .query_map([], |r| r.get::<_, String>(0))
            .unwrap()
            .collect::<rusqlite::Result<Vec<_>>>()
            .unwrap();
        v
    };
    let names = tables(&ca);
    assert_eq!(names, tables(&cb), "{what}: the tables differ");
    assert!(
        names.iter().any(|t| t == "connections"),
        "{what}: {names:?}"
    );
    let mut compared = 0;
    for t in &names {
        let (ra, rb) = (rows(&ca, t), rows(&cb, t));
        assert_eq!(
            ra.len(),
            rb.len(),
            "{what}: table {t} has a different number of rows"
        );
        for (x, y) in ra.iter().zip(&rb) {
            assert_eq!(x, y, "{what}: table {t} differs");
        }
        compared += ra.len();
    }
    compared
}

fn meta(c: &Connection, key: &str) -> Option<String> {
    mimic_core::db::get_meta(c, key).unwrap()
}

fn gzip_copy(src: &Path, dst: &Path) {
    let mut enc = flate2_writer(dst);
    enc.write_all(&std::fs::read(src).unwrap()).unwrap();
}

/// `cat x | mimic analyze - -o a.db` gives the database `mimic analyze x -o b.db` gives, for
/// pcap (either byte order, µs and ns), pcapng and gzip, with one or two threads.
#[test]
fn standard_input_gives_the_database_a_file_gives() {
    let tmp = tempdir();
    let gz = tmp.path().join("m57.pcap.gz");
    // without the corpus: the generated captures of the same kinds (a lossy pcap, a
    // nanosecond big-endian pcap, a second pcapng; none has several interfaces)
    gzip_copy(
        &trace_or(
            "loss/zeek_http_m57-long-49583-80.pcap",
            "loss/generated_losses.pcap",
        ),
        &gz,
    );
    let ngz = tmp.path().join("espn.pcapng.gz");
    gzip_copy(&trace("web/chrissanders_http_espn.pcapng"), &ngz);
    let cases: Vec<(PathBuf, &[&str])> = vec![
        (trace("web/zeek_http_bro.org.pcap"), &[]),
        (trace("web/chrissanders_http_espn.pcapng"), &[]),
        (
            trace_or(
                "format/ndpi_sites_multi-if.pcapng",
                "format/generated_nanosecond.pcapng",
            ),
            &[],
        ),
        (
            trace_or(
                "format/pcapplusplus_nanosecs_big_endian.pcap",
                "format/generated_nanosecond_be.pcap",
            ),
            &[],
        ),
        (
            trace_or("web/ndpi_netflix.pcap", "web/pcapplusplus_example.pcap"),
            &["--threads", "2"],
        ),
        (gz, &[]),
        (ngz, &[]),
    ];
    let mut total = 0;
    for (i, (f, extra)) in cases.iter().enumerate() {
        let what = format!("{} {extra:?}", f.display());
        let (a, b) = (
            tmp.path().join(format!("stdin{i}.db")),
            tmp.path().join(format!("file{i}.db")),
        );
        let o = analyze_stdin(&std::fs::read(f).unwrap(), &a, extra);
        assert!(o.status.success(), "{what}: {}", stderr(&o));
        let s = summary(&o);
        assert_eq!(s["inputs"], serde_json::json!(["-"]), "{what}");
        assert!(s["connections"].as_i64().unwrap() > 0, "{what}");
        let o = analyze(f, &b, extra);
        assert!(o.status.success(), "{what}: {}", stderr(&o));
        total += same_database(&a, &b, &what);
        assert_eq!(
            meta(&db(&a), "inputs").as_deref(),
            Some("[\"-\"]"),
            "{what}"
        );
    }
    assert!(total > 2_000, "only {total} rows compared");

    // a capture cut short on standard input: the same rows up to the cut, reported alike
    let whole = std::fs::read(trace("web/zeek_http_bro.org.pcap")).unwrap();
    let cut = tmp.path().join("cut.pcap");
    std::fs::write(&cut, &whole[..whole.len() - 10]).unwrap();
    let (a, b) = (tmp.path().join("cut-stdin.db"), tmp.path().join("cut.db"));
    let oa = analyze_stdin(&std::fs::read(&cut).unwrap(), &a, &[]);
    let ob = analyze(&cut, &b, &[]);
    assert!(
        oa.status.success() && ob.status.success(),
        "{}",
        stderr(&oa)
    );
    same_database(&a, &b, "cut short");
    let (sa, sb) = (summary(&oa), summary(&ob));
    assert_eq!(sa["input_issues"][0]["file"], "standard input");
    assert_eq!(
        sa["input_issues"][0]["reason"],
        sb["input_issues"][0]["reason"]
    );
    assert!(
        stderr(&oa).contains("mimic: warning: standard input: file is cut short"),
        "{}",
        stderr(&oa)
    );
}

#[test]
fn standard_input_once_and_merged_with_files() {
    let tmp = tempdir();
    let out = tmp.path().join("x.db");
    let o = run(&["analyze", "-", "-", "-o", out.to_str().unwrap()]);
    assert_refused(&o, "standard input (`-`) can be read only once");
    // `-` beside a file: merged in time order, as two files are
    let (f, g) = (
        trace("web/pcapplusplus_example.pcap"),
        trace("web/zeek_http_bro.org.pcap"),
    );
    let (both, mixed) = (tmp.path().join("both.db"), tmp.path().join("mixed.db"));
    let mut c = mimic();
    c.args(["analyze", "--json", "-o"])
        .arg(&both)
        .arg(&f)
        .arg(&g);
    assert!(run_with_timeout(c, Duration::from_secs(60), "two files")
        .status
        .success());
    let mut child = mimic()
        .args(["analyze", "--json", "-o"])
        .arg(&mixed)
        .arg(&f)
        .arg("-")
        .stdin(std::fs::File::open(&g).unwrap())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _ = child.stdin.take();
    let o = wait_with_timeout(child, Duration::from_secs(60), "file and -");
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        summary(&o)["inputs"],
        serde_json::json!([f.to_str().unwrap(), "-"])
    );
    same_database(&both, &mixed, "file and -");
    // an empty standard input is an error naming it
    let o = analyze_stdin(b"", &out, &[]);
    assert_refused(&o, "standard input: empty");
    assert!(!out.exists());
}

/// Ctrl-C (or SIGTERM) while standard input is open but quiet — `tcpdump -w - | mimic analyze
/// -` with no traffic — ends the run as it does for files: exit 130, the previous output kept.
#[test]
fn interrupt_while_standard_input_is_quiet() {
    let tmp = tempdir();
    let out = tmp.path().join("flows.db");
    std::fs::write(&out, b"the previous result").unwrap();
    let f = std::fs::read(trace("web/zeek_http_bro.org.pcap")).unwrap();
    for sig in [libc::SIGINT, libc::SIGTERM] {
        let mut child = mimic()
            .args(["analyze", "-", "-q", "-o"])
            .arg(&out)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // the header and some frames, then nothing, with the pipe left open
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(&f[..20_000]).unwrap();
        stdin.flush().unwrap();
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            child.try_wait().unwrap().is_none(),
            "mimic ended on its own"
        );
        let pid = child.id() as libc::pid_t;
        let start = Instant::now();
        // SAFETY: kill(2) on the child this test spawned and has not reaped yet
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
        let o = wait_with_timeout(child, Duration::from_secs(10), "after the signal");
        drop(stdin);
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(o.status.code(), Some(130), "signal {sig}: {}", stderr(&o));
        assert!(stderr(&o).contains("interrupted"), "{}", stderr(&o));
        assert_eq!(std::fs::read(&out).unwrap(), b"the previous result");
    }
}

/// tshark's frame count for a display filter.
fn tshark_count(file: &Path, display_filter: &str) -> u64 {
    let o = Command::new("tshark")
        .arg("-n")
        .arg("-r")
        .arg(file)
        .args(["-Y", display_filter, "-T", "fields", "-e", "frame.number"])
        .output()
        .expect("run tshark");
    assert!(
        o.status.success(),
        "tshark -r {} -Y {display_filter:?}: {}",
        file.display(),
        stderr(&o)
    );
    stdout(&o).lines().filter(|l| !l.trim().is_empty()).count() as u64
}

/// Frames that reached the filter and were accepted: the summary's frames less those the
/// reader itself skipped (none in the captures used here, which the test checks).
fn accepted(s: &serde_json::Value, what: &str) -> u64 {
    let skipped = s["skipped"].as_object().unwrap();
    for k in [
        "timestamp_out_of_range",
        "unknown_interface",
        "file_truncated",
        "corrupt_record",
    ] {
        assert!(
            !skipped.contains_key(k),
            "{what}: the reader skipped frames ({k})"
        );
    }
    s["frames"].as_u64().unwrap()
}

/// The capture with three link types that the filter test builds with mergecap.
const MIXED: &str = "mixed-link-types.pcapng";

/// A BPF expression, the display filter that means the same, and the captures left out with
/// the reason.
type FilterPair = (
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
);

/// `--filter` selects the frames tshark's equivalent display filter selects, on public
/// captures of several link types (Ethernet, VLAN-tagged Ethernet, raw IP, Linux SLL, pcapng
/// with several interfaces of one link type and of several, a capture whose frames were cut by
/// a 96-byte snaplen): 109 comparisons (107 on the generated captures without the corpus).
///
/// The pairs mean the same only where BPF looks where tshark looks: BPF's `tcp port 80`,
/// `ip net`, `tcp[tcpflags]` and `ip6` read the headers right after the link header, so they
/// do not match a VLAN-tagged frame (unless written `vlan and …`) or a packet inside a tunnel,
/// which tshark's dissectors find anywhere; `tcp[]` reads IPv4 only (hence `ip && …`); `ip.addr`
/// also matches the addresses quoted inside an ICMP error. Each capture below is one where the
/// pair is exactly equal, and the exclusions say why the others are not.
#[test]
fn filter_selects_what_tshark_selects() {
    require_tool("tshark");
    require_tool("mergecap");
    let tmp = tempdir();
    // a pcapng with interfaces of three link types, each with port-80 traffic: Ethernet, Linux
    // SLL and raw IP, the filter compiled for each
    let mixed = tmp.path().join("mixed-link-types.pcapng");
    let o = Command::new("mergecap")
        .args(["-F", "pcapng", "-w"])
        .arg(&mixed)
        .arg(trace("web/zeek_http_bro.org.pcap"))
        .arg(trace("encap/pcapplusplus_sll.pcap"))
        .arg(trace("encap/pcapplusplus_raw_ip.pcap"))
        .output()
        .unwrap();
    assert!(o.status.success(), "mergecap: {}", stderr(&o));
    // without the corpus, the pcapngs with several interfaces are merged here too: one with a
    // BSD NULL interface (written here, little-endian), Ethernet and raw IP; one with three
    // Ethernet interfaces, one of them with nanosecond timestamps
    let several = [
        (MULTI_NULL, tmp.path().join(MULTI_NULL)),
        (MULTI_ETH, tmp.path().join(MULTI_ETH)),
    ];
    if !corpus_present() {
        let null = tmp.path().join("null.pcap");
        write_null_capture(&null);
        for (out, inputs) in [
            (
                &several[0].1,
                vec![
                    null,
                    trace("web/zeek_http_bro.org.pcap"),
                    trace("encap/pcapplusplus_four_ipv6_http_streams_rawip.pcap"),
                ],
            ),
            (
                &several[1].1,
                vec![
                    trace("web/zeek_echo-connections.pcap"),
                    trace("edge/generated_rst-and-open.pcap"),
                    trace("format/generated_nanosecond.pcapng"),
                ],
            ),
        ] {
            let o = Command::new("mergecap")
                .args(["-F", "pcapng", "-w"])
                .arg(out)
                .args(&inputs)
                .output()
                .unwrap();
            assert!(o.status.success(), "mergecap: {}", stderr(&o));
        }
    }
    let path_of = |f: &str| {
        if f == MIXED {
            mixed.clone()
        } else if let Some((_, p)) = several.iter().find(|(n, _)| *n == f) {
            p.clone()
        } else {
            trace(f)
        }
    };
    // the public captures; without them, generated ones with the same properties (VLAN tags,
    // IPv6, SYNs, port 80 and other ports, 10.0.0.0/8, frames over 1000 bytes, snaplen-cut
    // frames, raw IP, Linux SLL, BSD NULL, several interfaces)
    let files: Vec<&str> = if corpus_present() {
        vec![
            MIXED,
            "format/pcapplusplus_many_interfaces-1.pcapng",
            "web/zeek_http_bro.org.pcap",
            "web/chrissanders_http_espn.pcapng",
            "web/ndpi_netflix.pcap",
            "web/pcapplusplus_many-protocols.pcap",
            "web/chrissanders_ek_to_cryptowall4.pcapng",
            "encap/zeek_http-vlan-0.pcap",
            "encap/ndpi_reddit_ipv6.pcap",
            "encap/chrissanders_http_ip4and6.pcapng",
            "encap/pcapplusplus_raw_ip.pcap",
            "encap/pcapplusplus_sll.pcap",
            "format/ndpi_sites_multi-if.pcapng",
            "format/zeek_tcp_timestamp_snaplen.pcap",
            "loss/zeek_http_m57-long-49583-80.pcap",
        ]
    } else {
        vec![
            MIXED,
            MULTI_NULL,
            MULTI_ETH,
            "web/zeek_http_bro.org.pcap",
            "web/chrissanders_http_espn.pcapng",
            "web/pcapplusplus_example.pcap",
            "web/zeek_echo-connections.pcap",
            "format/generated_vlan.pcapng",
            "encap/arkime_v6-http.pcap",
            "encap/pcapplusplus_raw_ip.pcap",
            "encap/pcapplusplus_four_ipv6_http_streams_rawip.pcap",
            "encap/pcapplusplus_sll.pcap",
            // BSD NULL written big-endian: the address family in the file's byte order
            "encap/tcptrace_dlt_null.dmp.pcap",
            "format/generated_snaplen68.pcap",
            "loss/generated_losses.pcap",
            "edge/generated_rst-and-open.pcap",
        ]
    };
    // (BPF, display filter, captures left out and why)
    const VLAN_TAGGED: &str = "its frames are VLAN-tagged: BPF needs `vlan and …`";
    const NO_VLAN: [(&str, &str); 7] = [
        (
            "encap/pcapplusplus_raw_ip.pcap",
            "no VLAN on raw IP (libpcap refuses `vlan`)",
        ),
        (
            "encap/pcapplusplus_sll.pcap",
            "no VLAN on Linux SLL (libpcap refuses `vlan`)",
        ),
        (MIXED, "it has an SLL and a raw IP interface"),
        (
            "format/pcapplusplus_many_interfaces-1.pcapng",
            "it has a BSD NULL interface (libpcap refuses `vlan`)",
        ),
        // the generated ones
        (
            "encap/tcptrace_dlt_null.dmp.pcap",
            "BSD NULL (libpcap refuses `vlan`)",
        ),
        (
            MULTI_NULL,
            "it has a BSD NULL interface (libpcap refuses `vlan`)",
        ),
        (
            "encap/pcapplusplus_four_ipv6_http_streams_rawip.pcap",
            "no VLAN on raw IP (libpcap refuses `vlan`)",
        ),
    ];
    const GENERATED_VLAN: &str = "format/generated_vlan.pcapng";
    let pairs: [FilterPair; 8] = [
        (
            "tcp port 80",
            "tcp.port==80",
            &[
                ("encap/zeek_http-vlan-0.pcap", VLAN_TAGGED),
                (GENERATED_VLAN, VLAN_TAGGED),
            ],
        ),
        ("vlan and tcp port 80", "vlan && tcp.port==80", &NO_VLAN),
        (
            "ip net 10.0.0.0/8",
            "ip.addr==10.0.0.0/8",
            &[
                (
                    "web/pcapplusplus_many-protocols.pcap",
                    "24 of its frames are VLAN-tagged",
                ),
                (GENERATED_VLAN, VLAN_TAGGED),
            ],
        ),
        (
            "tcp[tcpflags] & tcp-syn != 0",
            "ip && tcp.flags.syn==1",
            &[
                ("encap/zeek_http-vlan-0.pcap", VLAN_TAGGED),
                (GENERATED_VLAN, VLAN_TAGGED),
            ],
        ),
        ("vlan", "vlan", &NO_VLAN),
        ("ip6", "ipv6", &[]),
        // the length on the wire, not the 96 bytes a snaplen kept
        ("greater 1000", "frame.len >= 1000", &[]),
        ("tcp and not port 80", "tcp && !(tcp.port==80)", &[]),
    ];
    let mut checked = 0;
    let mut nonzero = 0;
    // every frame, once per capture
    let frames: std::collections::BTreeMap<&str, u64> = files
        .iter()
        .map(|f| (*f, tshark_count(&path_of(f), "frame")))
        .collect();
    for (bpf, df, left_out) in pairs {
        for &f in &files {
            if left_out.iter().any(|(l, _)| *l == f) {
                continue;
            }
            let path = path_of(f);
            let what = format!("{f}: --filter {bpf:?} against tshark -Y {df:?}");
            let out = tmp.path().join(format!("{checked}.db"));
            let o = analyze(&path, &out, &["--filter", bpf]);
            assert!(o.status.success(), "{what}: {}", stderr(&o));
            let s = summary(&o);
            let ours = accepted(&s, &what);
            let all = ours + s["filter_rejected"].as_u64().unwrap();
            assert_eq!(all, frames[f], "{what}: frames read");
            assert_eq!(ours, tshark_count(&path, df), "{what}");
            let c = db(&out);
            assert_eq!(meta(&c, "filter").as_deref(), Some(bpf), "{what}");
            assert_eq!(
                meta(&c, "filter_rejected"),
                Some(s["filter_rejected"].to_string()),
                "{what}"
            );
            checked += 1;
            nonzero += (ours > 0) as usize;
        }
    }
    // 109 and 40 on the public captures
    let (want_checked, want_nonzero) = if corpus_present() {
        (109, 40)
    } else {
        (GEN_CHECKED, GEN_NONZERO)
    };
    assert!(
        checked >= want_checked && nonzero >= want_nonzero,
        "{checked} checked, {nonzero} non-zero"
    );
}

/// The generated pcapngs with several interfaces that the filter test merges.
const MULTI_NULL: &str = "null-ethernet-raw-ip.pcapng";
const MULTI_ETH: &str = "three-ethernet-interfaces.pcapng";
/// The comparisons on the generated captures, and those where both select frames.
const GEN_CHECKED: usize = 107;
const GEN_NONZERO: usize = 60;

/// A little-endian BSD NULL (loopback) pcap with IPv4 connections to port 80 and to other
/// ports, from the 10.0.0.0/8 network and from outside it. No IPv6: libpcap compiles `ip6`
/// on DLT_NULL for the host's AF_INET6 (10 on Linux), not the BSD values (24, 28, 30) that
/// tshark reads, so the pairs would not mean the same.
fn write_null_capture(path: &Path) {
    use mimic_core::testcap::{write_capture, Capture, Close, Conn, Exchange, Format, Link};
    let t0 = 1_700_000_000_000_000_000i64;
    let conns: Vec<Conn> = [
        ("10.1.2.3:40000", "10.1.2.4:80"),
        ("192.168.5.1:40001", "192.168.5.2:8080"),
        ("10.200.0.9:40002", "10.200.0.1:80"),
        ("10.1.2.3:40003", "172.20.0.1:443"),
    ]
    .iter()
    .enumerate()
    .map(|(i, (c, s))| {
        let mut k = Conn::new(
            c.parse().unwrap(),
            s.parse().unwrap(),
            t0 + i as i64 * 50_000_000,
        );
        k.exchanges
            .push(Exchange::http_get("/", 4_000 + i * 1_000, 0, 2_000_000));
        k.close = Close::Fin;
        k
    })
    .collect();
    let cap = Capture {
        format: Format::Pcap {
            big_endian: false,
            nanos: false,
        },
        link: Link::Null,
        snaplen: 262_144,
    };
    write_capture(path, &cap, &conns).unwrap();
}

#[test]
fn filter_errors_name_what_is_wrong() {
    let tmp = tempdir();
    let out = tmp.path().join("x.db");
    std::fs::write(&out, b"the previous result").unwrap();
    // a mistake in the expression is refused before any input is read (this one is missing)
    let o = run(&[
        "analyze",
        tmp.path().join("missing.pcap").to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--filter",
        "tcp prot 80",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("--filter") && e.contains("tcp prot 80") && e.contains("syntax error"),
        "{e}"
    );
    assert!(!e.contains("missing.pcap"), "{e}");
    // an expression libpcap cannot compile for an input's link type: that input is named
    let sll = trace("encap/pcapplusplus_sll.pcap");
    let o = analyze(&sll, &out, &["--filter", "vlan"]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(
        e.contains("pcapplusplus_sll.pcap")
            && e.contains("cannot be compiled for link type LINUX_SLL (113)"),
        "{e}"
    );
    assert_eq!(std::fs::read(&out).unwrap(), b"the previous result");
    // the summary says what the filter rejected
    let o = mimic()
        .args(["analyze", "-o"])
        .arg(&out)
        .arg(trace("web/zeek_http_bro.org.pcap"))
        .args(["--filter", "tcp[tcpflags] & tcp-syn != 0"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    // 725 in the public capture; in the generated one, its frames without SYN, counted here
    let rejected = if corpus_present() {
        725
    } else {
        let (frames, syns) = frames_and_syns(&trace("web/zeek_http_bro.org.pcap"));
        assert!(syns > 0 && syns < frames, "{syns} of {frames}");
        frames - syns
    };
    assert!(
        stdout(&o).contains(&format!(
            "capture filter \"tcp[tcpflags] & tcp-syn != 0\": {} frames rejected (not analyzed, not counted above)",
            group(rejected)
        )),
        "{}",
        stdout(&o)
    );
}

/// The frames of a little-endian Ethernet pcap, and how many of them are TCP segments with
/// SYN set, read with etherparse (not libpcap, which the filter uses).
fn frames_and_syns(f: &Path) -> (u64, u64) {
    let b = std::fs::read(f).unwrap();
    assert_eq!(&b[..4], &[0xd4, 0xc3, 0xb2, 0xa1], "{}", f.display());
    assert_eq!(b[20], 1, "{}: not Ethernet", f.display());
    let (mut at, mut frames, mut syns) = (24, 0, 0);
    while at + 16 <= b.len() {
        let caplen = u32::from_le_bytes(b[at + 8..at + 12].try_into().unwrap()) as usize;
        let frame = &b[at + 16..at + 16 + caplen];
        frames += 1;
        if let Ok(p) = etherparse::SlicedPacket::from_ethernet(frame) {
            if let Some(etherparse::TransportSlice::Tcp(t)) = p.transport {
                syns += t.syn() as u64;
            }
        }
        at += 16 + caplen;
    }
    (frames, syns)
}

/// `gzip notes.txt` was reported by its compressed magic bytes (`1f 8b 08 08`), which read as
/// "gzip is not supported".
#[test]
fn gzip_of_a_text_file_says_what_it_holds() {
    let tmp = tempdir();
    let txt = tmp.path().join("notes.txt");
    std::fs::write(&txt, "GET / HTTP/1.1\r\nHost: example.com\r\n\r\n").unwrap();
    let gz = tmp.path().join("notes.txt.gz");
    gzip_copy(&txt, &gz);
    let out = tmp.path().join("x.db");
    for o in [
        analyze(&gz, &out, &[]),
        analyze_stdin(&std::fs::read(&gz).unwrap(), &out, &[]),
    ] {
        assert_eq!(o.status.code(), Some(2));
        let e = stderr(&o);
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(
            e.contains(
                ": a gzip stream whose content is not a pcap or pcapng file (the content starts \
                 with bytes 47 45 54 20 2f 20 48 54, text \"GET / HTTP/1.1\\r\\nHost: ex\")"
            ),
            "{e}"
        );
        assert!(!e.contains("1f 8b"), "{e}");
        assert!(!out.exists());
    }
}

/// A capture none of whose frames mimic can decode (here: its link type says PPP) is an error
/// naming the input and why, with the previous output kept, not an empty database; beside a
/// capture that decodes, its frames are counted as not analyzed.
#[test]
fn a_capture_of_a_link_type_mimic_does_not_decode_is_an_error() {
    let tmp = tempdir();
    let good = trace("web/zeek_http_bro.org.pcap");
    let mut bytes = std::fs::read(&good).unwrap();
    assert_eq!(
        &bytes[..4],
        &[0xd4, 0xc3, 0xb2, 0xa1],
        "a little-endian pcap"
    );
    bytes[20..24].copy_from_slice(&9u32.to_le_bytes()); // LINKTYPE_PPP
    let ppp = tmp.path().join("ppp.pcap");
    std::fs::write(&ppp, &bytes).unwrap();
    let out = tmp.path().join("flows.db");
    std::fs::write(&out, b"the previous result").unwrap();
    let o = analyze(&ppp, &out, &[]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(
        e.contains(&format!("{}: none of the", ppp.display()))
            && e.contains("frames read could be decoded")
            && e.contains("of a link type mimic does not decode")
            && e.ends_with("nothing was written\n"),
        "{e}"
    );
    assert_eq!(std::fs::read(&out).unwrap(), b"the previous result");
    // with a capture that decodes: analyzed, the PPP frames counted as not analyzed
    let o = Command::new(mimic_bin())
        .args(["analyze", "--json", "-o"])
        .arg(&out)
        .arg(&good)
        .arg(&ppp)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(s["connections"].as_u64().unwrap() > 0, "{s}");
    assert!(s.to_string().contains("\"unsupported_link_type\""), "{s}");
}

/// A pcap cut inside its first record exited 0 with an empty database (its warning said
/// "frames before it were analyzed"). Alone it is now an error (exit 2, GUIDE.md: nothing
/// could be analyzed, so nothing is written); beside other inputs it is a warning saying no
/// frame of it could be read, and `meta` records it.
#[test]
fn capture_cut_inside_its_first_record() {
    let tmp = tempdir();
    let full = std::fs::read(trace("web/zeek_http_bro.org.pcap")).unwrap();
    let out = tmp.path().join("flows.db");
    std::fs::write(&out, b"the previous result").unwrap();
    for keep in [30, 40, 60] {
        let cut = tmp.path().join(format!("cut{keep}.pcap"));
        std::fs::write(&cut, &full[..keep]).unwrap();
        let o = analyze(&cut, &out, &[]);
        assert_eq!(o.status.code(), Some(2), "{keep}: {}", stderr(&o));
        let e = stderr(&o);
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(
            e.starts_with("mimic: error:")
                && e.contains(&format!(
                    "cut{keep}.pcap: file is cut short in the middle of a record at byte 24"
                ))
                && e.contains("no frame could be read, so nothing was written"),
            "{e}"
        );
        assert_eq!(std::fs::read(&out).unwrap(), b"the previous result");
        // the same bytes gzip-compressed, and on standard input
        let gz = tmp.path().join(format!("cut{keep}.pcap.gz"));
        gzip_copy(&cut, &gz);
        for o in [
            analyze(&gz, &out, &[]),
            analyze_stdin(&full[..keep], &out, &[]),
        ] {
            assert_refused(&o, "no frame could be read");
        }
    }
    // an empty capture (a header and no record) is not cut short: exit 0, nothing to report
    let empty = tmp.path().join("empty.pcap");
    std::fs::write(&empty, &full[..24]).unwrap();
    let o = analyze(&empty, &out, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).is_empty(), "{}", stderr(&o));

    // beside a whole capture: analyzed, with a warning and the note in meta
    let cut = tmp.path().join("cut40.pcap");
    let whole = trace("web/pcapplusplus_example.pcap");
    let mut c = mimic();
    c.args(["analyze", "--json", "-o"])
        .arg(&out)
        .arg(&cut)
        .arg(&whole);
    let o = run_with_timeout(c, Duration::from_secs(60), "cut and whole");
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "cut40.pcap: file is cut short in the middle of a record at byte 24 (no frame of it could be read)"
        ),
        "{}",
        stderr(&o)
    );
    let s = summary(&o);
    assert_eq!(s["input_issues"][0]["frames_before"], 0);
    assert_eq!(s["input_issues"][0]["reason"], "file_truncated");
    assert!(s["frames"].as_u64().unwrap() > 0);
    let issues = meta(&db(&out), "input_issues").unwrap();
    assert!(
        issues.contains("cut40.pcap") && issues.contains("\"frames_before\":0"),
        "{issues}"
    );
    // cut after some frames: the warning counts them
    let later = tmp.path().join("later.pcap");
    std::fs::write(&later, &full[..full.len() - 10]).unwrap();
    let o = analyze(&later, &out, &[]);
    assert!(o.status.success());
    let n = summary(&o)["input_issues"][0]["frames_before"]
        .as_u64()
        .unwrap();
    assert!(n > 700, "{n}");
    assert!(
        stderr(&o).contains(&format!(
            "(the {} frames before it were analyzed)",
            group(n)
        )),
        "{}",
        stderr(&o)
    );
}

/// The producer the issue names: `tcpdump -r F -w - [EXPR] | mimic analyze -`. Unfiltered it
/// gives the database the file gives; with a filter expression it gives the connections
/// `mimic analyze F --filter EXPR` gives (the same libpcap selects the frames; only the
/// connection ids differ, which number a connection by its first frame in the input read).
#[test]
fn tcpdump_piped_into_standard_input() {
    require_tool("tcpdump");
    let tmp = tempdir();
    let piped = |f: &Path, expr: &str, out: &Path| -> Output {
        let cmd = format!(
            "tcpdump -r '{}' -w - {expr} 2>/dev/null | '{}' analyze - --json -o '{}'",
            f.display(),
            mimic_bin().display(),
            out.display()
        );
        let mut c = Command::new("sh");
        c.arg("-c").arg(cmd);
        run_with_timeout(c, Duration::from_secs(60), "tcpdump | mimic analyze -")
    };
    let f = trace_or("web/ndpi_netflix.pcap", "web/pcapplusplus_example.pcap");
    let (a, b) = (tmp.path().join("a.db"), tmp.path().join("b.db"));
    let o = piped(&f, "", &a);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(analyze(&f, &b, &[]).status.success());
    same_database(&a, &b, "tcpdump -w - | mimic analyze -");

    let columns = "client_ip, client_port, server_ip, server_port, vlan, t_syn, t_end, \
                   complete, min_rtt_us, hs_rtt_us, retx_down, bw_bps, response_time_us";
    // without the corpus, generated captures where each expression rejects frames and keeps
    // some: raw IP with port 80 and 443 connections, and an Ethernet capture of web traffic
    let cases = if corpus_present() {
        [
            ("web/ndpi_netflix.pcap", "'tcp port 80'"),
            (
                "web/pcapplusplus_many-protocols.pcap",
                "'tcp and not port 80'",
            ),
            (
                "web/chrissanders_ek_to_cryptowall4.pcapng",
                "'tcp[tcpflags] & tcp-syn != 0 or greater 1000'",
            ),
        ]
    } else {
        [
            ("encap/pcapplusplus_raw_ip.pcap", "'tcp port 80'"),
            ("encap/pcapplusplus_raw_ip.pcap", "'tcp and not port 80'"),
            (
                "web/zeek_http_bro.org.pcap",
                "'tcp[tcpflags] & tcp-syn != 0 or greater 1000'",
            ),
        ]
    };
    for (file, expr) in cases {
        let f = trace(file);
        let what = format!("{file} {expr}");
        let (a, b) = (tmp.path().join("fa.db"), tmp.path().join("fb.db"));
        let oa = piped(&f, expr, &a);
        assert!(oa.status.success(), "{what}: {}", stderr(&oa));
        let ob = analyze(&f, &b, &["--filter", expr.trim_matches('\'')]);
        assert!(ob.status.success(), "{what}: {}", stderr(&ob));
        let (sa, sb) = (summary(&oa), summary(&ob));
        for k in [
            "frames",
            "tcp_segments",
            "connections",
            "complete",
            "exchanges",
        ] {
            assert_eq!(sa[k], sb[k], "{what}: {k}");
        }
        assert!(sb["filter_rejected"].as_u64().unwrap() > 0, "{what}");
        let q =
            format!("SELECT {columns} FROM connections ORDER BY t_syn, client_port, server_port");
        let ra = rows_of(&db(&a), &q);
        assert!(!ra.is_empty(), "{what}");
        assert_eq!(ra, rows_of(&db(&b), &q), "{what}");
    }
}

/// `n` with thousands separators, as mimic's messages print counts (1,267).
fn group(n: u64) -> String {
    let d = n.to_string();
    let mut out = String::new();
    for (i, ch) in d.chars().enumerate() {
        if i > 0 && (d.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

fn rows_of(c: &Connection, sql: &str) -> Vec<String> {
    let mut st = c.prepare(sql).unwrap();
    let n = st.column_count();
    let v = st
        .query_map([], |r| {
            (0..n)
                .map(|i| r.get_ref(i).map(|v| format!("{v:?}")))
                .collect::<rusqlite::Result<Vec<_>>>()
                .map(|v| v.join("|"))
        })
        .unwrap()
        .collect::<rusqlite::Result<Vec<_>>>()
        .unwrap();
    v
}
