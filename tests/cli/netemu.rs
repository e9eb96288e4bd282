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
               WHERE id = (SELECT id FROM connections ORDER BY id LIMIT 1 OFFSET 3);",
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
        warned.contains("synth.db: 3 connections skipped for values no capture gives")
            && warned.contains("min_rtt_us 36893488147419104 is not between 0 and an hour"),
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
