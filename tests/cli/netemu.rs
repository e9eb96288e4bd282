//! `mimic netemu render` command-line tests (no root: nothing is applied here; applying is
//! tested in netemu/tests/tc_apply.rs and tests/lab/netemu.rs).
//! `MIMIC_BLESS=1` rewrites the expected files in tests/cli/golden/.

use std::path::Path;

use crate::common::{assert_refused, run, stderr, stdout, tempdir};

fn golden(name: &str, got: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/cli/golden")
        .join(name);
    if std::env::var_os("MIMIC_BLESS").is_some() {
        std::fs::write(&path, got).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!(
            "{} is missing (run with MIMIC_BLESS=1 once and review it)",
            path.display()
        )
    });
    assert_eq!(got, want, "{} differs", path.display());
}

/// A small synthetic workload, rendered for both backends: the pipes a replay of it in the lab
/// would register (client addresses 198.19.0.1 and up, server 198.18.0.1:80).
#[test]
fn render_from_a_flows_db_gives_the_replays_pipes() {
    let dir = tempdir();
    let db = dir.path().join("synth.db");
    let db_s = db.to_str().unwrap();
    let o = run(&[
        "-q",
        "synth",
        "--connections",
        "6",
        "--seed",
        "7",
        "-o",
        db_s,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // `netemu render --backend netem --from` the database, and `more`
    let render = |more: &[&str]| {
        run(&[
            &["netemu", "render", "--backend", "netem", "--from", db_s][..],
            more,
        ]
        .concat())
    };
    let o = render(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let sh = stdout(&o);
    // one flow per connection, client addresses in replay order
    assert_eq!(
        sh.matches("/32 match ip dst 198.18.0.1/32").count(),
        6,
        "{sh}"
    );
    assert!(sh.contains("match ip src 198.19.0.1/32 match ip dst 198.18.0.1/32 match ip sport 20000 0xffff match ip dport 80 0xffff"), "{sh}");
    golden("synth6.netem.sh", &sh);
    // the delayed-ACK shaping netem cannot do is said, not dropped silently
    let warned = stderr(&o);
    if sh.contains("WITHOUT their ACK policy") {
        assert!(warned.contains("delayed-ACK shaping left out"), "{warned}");
    }
    let o = run(&["netemu", "render", "--backend", "dummynet", "--from", db_s]);
    assert!(o.status.success(), "{}", stderr(&o));
    golden("synth6.dummynet.sh", &stdout(&o));
    // the batch form: the same commands without `tc`, for one `tc -batch` process
    let o = render(&["--batch"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let batch = stdout(&o);
    let cmds = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| !l.starts_with('#') && !l.contains("|| true"))
            .map(|l| l.trim_start_matches("tc ").to_string())
            .collect()
    };
    assert_eq!(cmds(&batch), cmds(&sh[sh.find('\n').unwrap() + 1..]));
    // own addresses and server
    let o = render(&[
        "--client-addr",
        "10.1.0.1",
        "--client-addr",
        "10.1.0.2",
        "--server",
        "10.0.0.1:8080",
        "--limit",
        "3",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let sh = stdout(&o);
    assert_eq!(sh.matches("dport 8080 0xffff").count(), 3, "{sh}");
    assert!(
        sh.contains(
            "match ip src 10.1.0.2/32 match ip dst 10.0.0.1/32 match ip sport 20000 0xffff"
        ),
        "{sh}"
    );
    assert!(
        sh.contains(
            "match ip src 10.1.0.1/32 match ip dst 10.0.0.1/32 match ip sport 20001 0xffff"
        ),
        "{sh}"
    );
    // a connection a replay would leave out (no estimate of its own, no peer of its client
    // to pool one from) is left out of the render too, and said to be
    {
        let c = rusqlite::Connection::open(&db).unwrap();
        c.execute(
            "UPDATE connections SET bw_bps = NULL, bw_samples = 0, client_ip = '203.0.113.99' \
             WHERE id = (SELECT min(id) FROM connections)",
            [],
        )
        .unwrap();
    }
    let o = render(&["--unestimated", "skip"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o).matches("/32 match ip dst 198.18.0.1/32").count(),
        5,
        "{}",
        stdout(&o)
    );
    assert!(
        stderr(&o).contains("synth.db: 1 connections left out: no bandwidth estimate"),
        "{}",
        stderr(&o)
    );
    // values no capture gives (a damaged or hand-edited database) are counted and skipped,
    // never rendered as a delay that wrapped around or a loss cut to 100%
    {
        let c = rusqlite::Connection::open(&db).unwrap();
        c.execute_batch(
            "UPDATE connections SET min_rtt_us = 36893488147419104 \
               WHERE id = (SELECT id FROM connections ORDER BY id LIMIT 1 OFFSET 1); \
             UPDATE connections SET loss_rate_down = 5, loss_random_down = 5 \
               WHERE id = (SELECT id FROM connections ORDER BY id LIMIT 1 OFFSET 2); \
             UPDATE connections SET client_ip = CAST(x'3139382e3139ff' AS TEXT) \
               WHERE id = (SELECT id FROM connections ORDER BY id LIMIT 1 OFFSET 3); \
             UPDATE connections SET bw_bps = 1e300 \
               WHERE id = (SELECT id FROM connections ORDER BY id LIMIT 1 OFFSET 0);",
        )
        .unwrap();
    }
    let o = render(&["--unestimated", "skip"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let sh = stdout(&o);
    assert_eq!(
        sh.matches("/32 match ip dst 198.18.0.1/32").count(),
        2,
        "{sh}"
    );
    assert!(!sh.contains("loss 100%"), "{sh}");
    let warned = stderr(&o);
    assert!(
        warned.contains("synth.db: 4 connections skipped for values no capture gives")
            && warned.contains("bw_bps 1e300 is above 10 Tbit/s")
            && !sh.contains("18446744073709551615"),
        "{warned}"
    );
    // nothing left: the message says what left nothing
    let o = render(&["--select", "all", "--limit", "0"]);
    assert_refused(&o, "synth.db: no connection to replay (--limit 0)");
}

#[test]
fn teardown_prints_the_removal_of_mimics_pipes_only() {
    let o = run(&[
        "netemu",
        "render",
        "--backend",
        "netem",
        "--teardown",
        "--client-if",
        "c0",
        "--server-if",
        "s0",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let sh = stdout(&o);
    let cmds: Vec<&str> = sh.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(
        cmds,
        [
            "tc qdisc del dev s0 root handle 6d69: 2>/dev/null || true",
            "tc qdisc del dev c0 root handle 6d69: 2>/dev/null || true"
        ]
    );
    let o = run(&["netemu", "render", "--backend", "dummynet", "--teardown"]);
    assert_refused(&o, "give the same --pipes");
    let o = run(&[
        "netemu",
        "render",
        "--backend",
        "dummynet",
        "--teardown",
        "--default",
        "delay=5ms",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("ipfw -q delete set 29"));
}

#[test]
fn bad_render_requests_are_clear_errors() {
    let dir = tempdir();
    // a pipe table without pipes is named
    let empty = dir.path().join("empty.toml");
    std::fs::write(&empty, "# nothing yet\n").unwrap();
    let empty = empty.to_str().unwrap();
    let missing = dir.path().join("missing.db");
    let missing = missing.to_str().unwrap();
    // a pipe no kernel backend can express is named with the file it came from, or the flag
    let pipes = dir.path().join("slow-start.toml");
    std::fs::write(
        &pipes,
        "[[flow]]\nclient = \"198.19.0.7:40000\"\nserver = \"198.18.0.2:80\"\nup = \"delay=10ms\"\ndown = \"delay=10ms,first_delay=150ms\"\n",
    )
    .unwrap();
    let pipes = pipes.to_str().unwrap();
    let cases: [(&[&str], &str); 11] = [
        // an empty spec (an unset shell variable) is not a pipe that only forwards
        (
            &["--backend", "netem", "--default", ""],
            "pipe spec ``: empty: give at least one KEY=VALUE",
        ),
        (
            &[
                "--backend",
                "netem",
                "--default-up",
                " , ",
                "--default-down",
                "delay=1ms",
            ],
            "pipe spec ` , `: empty",
        ),
        // no client connects to port 0
        (
            &[
                "--backend",
                "netem",
                "--from",
                missing,
                "--server",
                "198.18.0.1:0",
            ],
            "port 0 is no port a client can connect to",
        ),
        (
            &["--backend", "netem", "--pipes", empty],
            "empty.toml: holds no pipes",
        ),
        // --apply never picks interfaces by itself
        (
            &["--backend", "netem", "--default", "delay=5ms", "--apply"],
            "name both with --client-if and --server-if",
        ),
        (
            &["--backend", "netem", "--default", "delay=5ms", "--force"],
            "--apply",
        ),
        (&["--backend", "netem"], "no pipes to render"),
        (&["--backend", "netem", "--from", missing], "missing.db"),
        (
            &[
                "--backend",
                "netem",
                "--client-addr",
                "10.0.0.1",
                "--default",
                "delay=1ms",
            ],
            "--client-addr",
        ),
        (
            &["--backend", "netem", "--pipes", pipes],
            "slow-start.toml: flow #1 198.19.0.7:40000 -> 198.18.0.2:80 down: a first-packet delay",
        ),
        (
            &[
                "--backend",
                "dummynet",
                "--default",
                "delay=1ms,first_delay=5ms",
            ],
            "--default: default up: a first-packet delay",
        ),
    ];
    for (args, want) in cases {
        let o = run(&[&["netemu", "render"], args].concat());
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
    }
    let o = run(&["netemu", "render", "--backend", "netem", "--from", missing]);
    assert!(stderr(&o).contains("no such file"), "{}", stderr(&o));
    // more pipes than one interface's htb takes: the table that holds them is named
    let big = dir.path().join("big.toml");
    let mut t = String::new();
    for i in 0..65_300u32 {
        t.push_str(&format!(
            "[[flow]]\nclient = \"198.19.{}.{}:{}\"\nserver = \"198.18.0.2:80\"\nup = \"delay=1ms\"\ndown = \"delay=1ms\"\n",
            i / 250 % 250,
            i % 250 + 1,
            40_000 + i / 62_500
        ));
    }
    std::fs::write(&big, t).unwrap();
    let o = run(&[
        "netemu",
        "render",
        "--backend",
        "netem",
        "--pipes",
        big.to_str().unwrap(),
    ]);
    assert_refused(&o, "big.toml: too many pipes for");
}

/// `netemu run --backend netem` takes interfaces and installs only what a controller sends:
/// the flags it cannot honour are clear errors before anything is touched.
#[test]
fn a_kernel_router_refuses_what_it_cannot_do() {
    let o = run(&["netemu", "run", "--backend", "netem", "--lab", "x"]);
    assert_refused(
        &o,
        "--backend netem takes --client-if and --server-if, not --lab",
    );
    let o = run(&[
        "netemu",
        "run",
        "--backend",
        "netem",
        "--client-if",
        "a0",
        "--server-if",
        "b0",
        "--default",
        "delay=1ms",
    ]);
    assert_refused(&o, "installs only the pipes the controller sends");
    let o = run(&["netemu", "run", "--backend", "dummynet", "--lab", "x"]);
    assert_refused(&o, "unknown router backend `dummynet`");
}

/// `rate=0` is refused as `rate=0bit` is, naming `unlimited` (the way to ask for no limit):
/// it used to render a pipe without any limit, the opposite of what it says.
#[test]
fn a_rate_of_zero_is_refused_not_read_as_unlimited() {
    let dir = tempdir();
    let file = dir.path().join("zero.toml");
    std::fs::write(&file, "[default]\nboth = \"delay=5ms,rate=0\"\n").unwrap();
    let file = file.to_str().unwrap();
    for backend in ["netem", "dummynet"] {
        for args in [
            &["--default", "rate=0"][..],
            &["--default", "delay=5ms,rate=0,queue=10"],
            &["--default-up", "delay=5ms", "--default-down", "bw=0"],
            &["--pipes", file],
        ] {
            let o = run(&[&["netemu", "render", "--backend", backend], args].concat());
            assert_refused(&o, "`0` is no rate");
            assert!(stderr(&o).contains("write `unlimited`"), "{}", stderr(&o));
        }
    }
    let o = run(&["netemu", "run", "--lab", "x", "--default", "rate=0"]);
    assert_refused(&o, "write `unlimited`");
    // the spelled-out way still renders an unlimited pipe
    let o = run(&[
        "netemu",
        "render",
        "--backend",
        "netem",
        "--default",
        "delay=5ms,rate=unlimited",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("netem limit"), "{}", stdout(&o));
}

/// One interface for both sides: the downstream pipes' root qdisc would replace the
/// upstream ones'. Refused for both backends, printing, --apply and --teardown, naming the
/// options (and the default a missing one takes). The name is one no machine has, so that a
/// regression applies nothing.
#[test]
fn one_interface_for_both_sides_is_refused() {
    for backend in ["netem", "dummynet"] {
        for more in [
            &[][..],
            &["--teardown"],
            &["--apply"],
            &["--teardown", "--apply"],
        ] {
            let o = run(&[
                &[
                    "netemu",
                    "render",
                    "--backend",
                    backend,
                    "--default",
                    "delay=1ms",
                    "--client-if",
                    "mimic-t0",
                    "--server-if",
                    "mimic-t0",
                ][..],
                more,
            ]
            .concat());
            assert_refused(&o, "--client-if and --server-if are both mimic-t0");
            assert!(stderr(&o).contains("name two interfaces"), "{}", stderr(&o));
            assert!(o.stdout.is_empty(), "{}", stdout(&o));
        }
    }
    let o = run(&[
        "netemu",
        "render",
        "--backend",
        "netem",
        "--default",
        "delay=1ms",
        "--client-if",
        "eth1",
    ]);
    assert_refused(
        &o,
        "--client-if eth1 is the interface --server-if defaults to",
    );
    let o = run(&[
        "netemu",
        "render",
        "--backend",
        "netem",
        "--default",
        "delay=1ms",
        "--server-if",
        "eth0",
    ]);
    assert_refused(
        &o,
        "--server-if eth0 is the interface --client-if defaults to",
    );
    // the emulator itself, either backend, before anything is opened
    for backend in ["mimic", "netem"] {
        let o = run(&[
            "netemu",
            "run",
            "--backend",
            backend,
            "--client-if",
            "a0",
            "--server-if",
            "a0",
        ]);
        assert_refused(&o, "--client-if and --server-if are both a0");
    }
}

/// Two [[flow]] entries of one connection: the second's filter could never match. Refused
/// naming both entries; so is a connection of --from that a flow of the file already has.
#[test]
fn a_connection_given_twice_is_refused_naming_both() {
    let dir = tempdir();
    let flow = |client: &str, pipes: &str| {
        format!("[[flow]]\nclient = \"{client}\"\nserver = \"198.18.0.1:80\"\nboth = \"{pipes}\"\n")
    };
    let twice = dir.path().join("twice.toml");
    std::fs::write(
        &twice,
        [
            flow("198.19.0.7:40000", "delay=1ms"),
            flow("198.19.0.8:40000", "delay=1ms"),
            flow("198.19.0.7:40000", "delay=9ms,rate=1mbit"),
        ]
        .concat(),
    )
    .unwrap();
    for backend in ["netem", "dummynet"] {
        let o = run(&[
            "netemu",
            "render",
            "--backend",
            backend,
            "--pipes",
            twice.to_str().unwrap(),
        ]);
        assert_refused(
            &o,
            "twice.toml: [[flow]] #1 and [[flow]] #3 both match client 198.19.0.7:40000 and server 198.18.0.1:80",
        );
    }
    // the first connection of a replay in the lab: 198.19.0.1:20000 -> 198.18.0.1:80
    let db = dir.path().join("synth.db");
    let o = run(&[
        "-q",
        "synth",
        "--connections",
        "2",
        "--seed",
        "7",
        "-o",
        db.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let file = dir.path().join("one.toml");
    std::fs::write(
        &file,
        [
            flow("198.19.0.9:40000", "delay=1ms"),
            flow("198.19.0.1:20000", "delay=1ms"),
        ]
        .concat(),
    )
    .unwrap();
    let render = |more: &[&str]| {
        run(&[
            &[
                "netemu",
                "render",
                "--backend",
                "netem",
                "--pipes",
                file.to_str().unwrap(),
                "--from",
                db.to_str().unwrap(),
                "--unestimated",
                "unshaped",
            ][..],
            more,
        ]
        .concat())
    };
    let o = render(&[]);
    assert_refused(
        &o,
        "synth.db: a connection from 198.19.0.1:20000 to 198.18.0.1:80 has the client and server of",
    );
    assert!(
        stderr(&o).contains("one.toml's [[flow]] #2"),
        "{}",
        stderr(&o)
    );
    let o = render(&["--client-addr", "198.19.0.2"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// An error quotes a pipe spec, a value or a TOML line by its head and length when it is
/// long: a 5 MB value gave a 10 MB message, a 200 KB line a 200 KB one.
#[test]
fn errors_quote_long_input_by_its_head() {
    let dir = tempdir();
    let big = dir.path().join("big.toml");
    let junk = "x".repeat(5_000_000);
    std::fs::write(&big, format!("[default]\nboth = \"delay=1ms,{junk}\"\n")).unwrap();
    let o = run(&[
        "netemu",
        "render",
        "--backend",
        "netem",
        "--pipes",
        big.to_str().unwrap(),
    ]);
    assert_refused(&o, "big.toml: [default]: pipe spec `delay=1ms,xxx");
    let e = stderr(&o);
    assert!(e.len() < 1000, "{} bytes", e.len());
    assert!(
        e.contains("… (5000010 bytes)`: `xxx") && e.contains("… (5000000 bytes)` is not KEY=VALUE"),
        "{e}"
    );
    let line = dir.path().join("line.toml");
    std::fs::write(
        &line,
        format!("[default]\nboth = \"{}", "y".repeat(200_000)),
    )
    .unwrap();
    let o = run(&[
        "netemu",
        "render",
        "--backend",
        "netem",
        "--pipes",
        line.to_str().unwrap(),
    ]);
    assert_refused(&o, "line.toml: TOML parse error at line 2, column 200009");
    let e = stderr(&o);
    assert!(e.len() < 1000 && e.contains("… (200008 bytes)"), "{e}");
    // on the command line (clap's own message would quote it whole, once more)
    let arg = format!("delay=1ms,{}", "z".repeat(100_000));
    let o = run(&["netemu", "render", "--backend", "netem", "--default", &arg]);
    assert_refused(&o, "invalid value 'delay=1ms,zzz");
    let e = stderr(&o);
    assert!(
        e.len() < 1000 && e.contains("… (100010 bytes)' for '--default <DEFAULT>': pipe spec `"),
        "{e}"
    );
    // short ones are quoted whole, as typed
    let o = run(&[
        "netemu",
        "render",
        "--backend",
        "netem",
        "--default",
        "delay=1ms,colour=red",
    ]);
    assert_refused(
        &o,
        "invalid value 'delay=1ms,colour=red' for '--default <DEFAULT>': pipe spec `delay=1ms,colour=red`: unknown key `colour`",
    );
}

/// `--backend tc` and `ipfw` are aliases (as `mimic replay --emulator` takes them), and the
/// help says so; anything else is refused with the list.
#[test]
fn backends_are_named_by_emulator_or_by_tool() {
    let o = run(&["netemu", "render", "--help"]);
    assert!(
        stdout(&o).contains("netem or dummynet (or by the tool each is installed with: tc, ipfw)"),
        "{}",
        stdout(&o)
    );
    for (alias, name) in [("tc", "netem"), ("ipfw", "dummynet")] {
        let a = run(&[
            "netemu",
            "render",
            "--backend",
            alias,
            "--default",
            "delay=1ms",
        ]);
        let n = run(&[
            "netemu",
            "render",
            "--backend",
            name,
            "--default",
            "delay=1ms",
        ]);
        assert!(a.status.success(), "{}", stderr(&a));
        assert_eq!(stdout(&a), stdout(&n));
    }
    let o = run(&[
        "netemu",
        "render",
        "--backend",
        "pf",
        "--default",
        "delay=1ms",
    ]);
    assert_refused(
        &o,
        "`pf` is not a backend (netem or dummynet; tc and ipfw are their aliases)",
    );
}

/// `lab status` of a lab of which nothing exists (a mistyped name, or one already down) says so
/// in one line and exits 1, instead of listing every namespace and interface as missing.
#[test]
fn the_status_of_a_lab_that_does_not_exist_is_one_line() {
    let name = format!("nolab{}", std::process::id() % 100_000);
    let o = run(&["lab", "status", &name]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let out = stdout(&o);
    assert_eq!(
        out.trim_end(),
        format!(
            "lab {name}: not up, nothing of it exists (`mimic lab list` names the labs on this host)"
        ),
        "{out}"
    );
    // the JSON form keeps every field for scripts
    let o = run(&["lab", "status", &name, "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["up"], false);
}

/// `netemu run` refuses values with which it could not work, before anything starts (they
/// ran: no packet fits in 0 buffers, no connection in 0 flow rules; a CPU that is not online
/// or a priority above SCHED_FIFO's 99 only warned).
#[test]
fn netemu_run_refuses_values_it_cannot_work_with() {
    for (flag, value, want) in [
        ("--buffers", "0", "0 is not in 1.."),
        ("--max-flows", "0", "must be at least 1"),
        ("--spin-us", "99999999999", "is not in 0..=1000000"),
        ("--cpu", "1000", "CPU 1000 is not online"),
        ("--rt-priority", "100", "100 is not in 0..=99"),
    ] {
        let o = run(&["netemu", "run", "--lab", "x", flag, value]);
        assert_refused(&o, want);
    }
}

/// An interface that does not exist is named as such when kernel pipes are applied (the
/// error blamed the kernel for lacking netem, which this host's does too).
#[test]
fn applying_kernel_pipes_names_a_missing_interface() {
    let o = run(&[
        "netemu",
        "render",
        "--backend",
        "netem",
        "--default",
        "delay=1ms",
        "--client-if",
        "nosuchif0",
        "--server-if",
        "nosuchif1",
        "--apply",
    ]);
    assert_refused(&o, "Cannot find device");
}
