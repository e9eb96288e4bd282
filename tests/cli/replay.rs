//! `mimic replay` command-line tests.
//! Everything here fails before a lab is touched, so it needs no root; the replay itself is
//! tested in tests/lab/replay.rs.

use crate::common::{assert_refused, run, stderr, tempdir};

/// `mimic replay INPUT -o OUT` against a remote server whose control sockets and PKI do not
/// exist, from client address 127.0.0.2, then `extra`: it fails before reaching anything.
fn remote_replay(input: &str, out: &str, extra: &[&str]) -> std::process::Output {
    let mut a = vec![
        "replay",
        input,
        "-o",
        out,
        "--server",
        "127.0.0.1:80",
        "--server-control",
        "unix:/nonexistent/s.sock",
        "--netemu",
        "unix:/nonexistent/n.sock",
        "--pki",
        "/nonexistent/pki",
        "--client-addr",
        "127.0.0.2",
    ];
    a.extend_from_slice(extra);
    run(&a)
}

#[test]
fn bad_inputs_are_named_and_nothing_is_written() {
    let dir = tempdir();
    let out = dir.path().join("replay.db");
    let out_s = out.to_str().unwrap();
    let junk = dir.path().join("junk.db");
    std::fs::write(&junk, "not a database").unwrap();
    let lab = format!("rcli{}", std::process::id());

    let o = run(&["replay", junk.to_str().unwrap(), "-o", out_s, "--lab", &lab]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("junk.db") && e.contains("not an SQLite database"),
        "{e}"
    );

    let missing = dir.path().join("missing.db");
    let o = run(&[
        "replay",
        missing.to_str().unwrap(),
        "-o",
        out_s,
        "--lab",
        &lab,
    ]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("missing.db") && e.contains("no such file"),
        "{e}"
    );

    assert!(!out.exists());
    assert!(
        !std::path::Path::new(&format!("/run/netns/{lab}-cli")).exists(),
        "a bad input built a lab"
    );
}

/// `-o` is checked before anything is replayed: the result is only renamed into place at the
/// end, where a missing directory would lose the whole run and the rename would replace the
/// workload itself or a device (`/dev/null`, as root) with the replay's database. Nothing is
/// created on the way (the missing directory was made by the replay's work directory).
#[test]
fn the_output_is_checked_before_the_replay() {
    let dir = tempdir();
    let db = dir.path().join("syn.db");
    let db_s = db.to_str().unwrap();
    let o = run(&["synth", "-q", "--connections", "20", "-o", db_s]);
    assert!(o.status.success(), "{}", stderr(&o));
    let before = std::fs::read(&db).unwrap();
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let missing = dir.path().join("no/such/replay.db");
    let same = dir.path().join(".").join("syn.db");
    for (out, why) in [
        (missing.as_path(), "no such directory"),
        (db.as_path(), "syn.db: the output would overwrite an input"),
        (
            same.as_path(),
            "syn.db: the output would overwrite an input",
        ),
        (sub.as_path(), "sub: is a directory"),
        (
            std::path::Path::new("/dev/null"),
            "/dev/null: not a regular file (a database needs one)",
        ),
    ] {
        // a remote replay whose PKI does not exist: the output's refusal must come first
        let o = remote_replay(db_s, out.to_str().unwrap(), &[]);
        assert_refused(&o, why);
    }
    assert!(!dir.path().join("no").exists());
    assert_eq!(std::fs::read(&db).unwrap(), before);
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().starts_with(".mimic-replay"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let meta = std::fs::metadata("/dev/null").unwrap();
    assert!(!meta.is_file());
}

#[test]
fn queue_lengths_are_checked() {
    for (bad, why) in [
        ("0", "`0` is not a whole number of packets >= 1"),
        ("up=0", "`0` is not a whole number of packets >= 1"),
        ("side=3", "unknown queue direction `side`"),
        ("up=3,up=4", "`up` is given twice"),
    ] {
        let o = run(&[
            "replay", "in.db", "-o", "out.db", "--lab", "x", "--queue", bad,
        ]);
        assert_eq!(o.status.code(), Some(2), "{bad}");
        assert!(stderr(&o).contains(why), "{bad}: {}", stderr(&o));
    }
}

/// A replay goes to a lab or to a remote server: without either (with `--agents` too, which
/// works with both) the message names both, and both at once are refused.
#[test]
fn a_replay_names_both_targets_when_given_neither() {
    for extra in [&[][..], &["--agents", "tcp:127.0.0.1:9"][..]] {
        let o = run(&[&["replay", "in.db", "-o", "out.db"][..], extra].concat());
        assert_eq!(o.status.code(), Some(2), "{extra:?}");
        assert!(
            stderr(&o).contains("<--lab <NAME>|--server <ADDR>>"),
            "{extra:?}: {}",
            stderr(&o)
        );
    }
    let o = run(&[
        "replay",
        "in.db",
        "-o",
        "out.db",
        "--lab",
        "x",
        "--server",
        "198.18.1.1:80",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("cannot be used with"), "{}", stderr(&o));
}

/// Port 0 is no server's port: the server emulator would listen wherever the kernel put it
/// and the clients connect to nothing.
#[test]
fn port_zero_is_refused() {
    let dir = tempdir();
    let out = dir.path().join("out.db");
    let out_s = out.to_str().unwrap();
    for args in [
        &["--lab", "x", "--server-port", "0"][..],
        &[
            "--server",
            "198.18.1.1:0",
            "--server-control",
            "unix:/nonexistent",
            "--netemu",
            "unix:/nonexistent",
            "--pki",
            "/nonexistent",
        ][..],
    ] {
        let o = run(&[&["replay", "in.db", "-o", out_s][..], args].concat());
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("port 0 is no port"),
            "{args:?}: {}",
            stderr(&o)
        );
    }
    assert!(!out.exists());
}

/// Rates and time scales are positive, finite numbers: `inf` would start every connection at
/// once or schedule them beyond the end of time, NaN nothing at all.
#[test]
fn rates_and_time_scales_are_positive_numbers() {
    let dir = tempdir();
    let out = dir.path().join("out.db");
    let out_s = out.to_str().unwrap();
    let commands: [(&[&str], &str); 2] = [
        (
            &["replay", "in.db", "-o", out_s, "--lab", "x"],
            "--time-scale",
        ),
        (&["synth", "-o", out_s], "--rate"),
    ];
    for (command, flag) in commands {
        for bad in ["0", "-1", "inf", "NaN"] {
            let value = format!("{flag}={bad}");
            let o = run(&[command, &[value.as_str()]].concat());
            let e = stderr(&o);
            assert_eq!(o.status.code(), Some(2), "{} {value}", command[0]);
            assert!(
                e.contains(&format!("for '{flag} "))
                    && e.contains("must be a positive, finite number"),
                "{} {value}: {e}",
                command[0]
            );
        }
    }
    assert!(!out.exists());
}

/// The stack of a remote server is set on that host; replay refuses to pretend it applied one.
#[test]
fn stack_is_refused_with_a_remote_server() {
    let o = run(&[
        "replay",
        "in.db",
        "-o",
        "out.db",
        "--server",
        "127.0.0.1:80",
        "--server-control",
        "unix:/nonexistent/s.sock",
        "--netemu",
        "unix:/nonexistent/n.sock",
        "--pki",
        "/nonexistent/pki",
        "--vantage",
        "client",
        "--capture-iface",
        "lo",
        "--client-addr",
        "127.0.0.2",
        "--stack",
        "initcwnd=10",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("--stack") && e.contains("cannot be used with"),
        "{e}"
    );
}

/// A remote replay is captured at the server unless the client side is asked for in full:
/// `--capture-iface` alone (the flag of old, which captured on the client) and `--vantage
/// client` without an interface are refused with what to write instead; in the lab there is
/// no vantage to pick. Nothing is written.
#[test]
fn the_capture_vantage_is_asked_for_explicitly() {
    let dir = tempdir();
    let out = dir.path().join("out.db");
    let remote = |extra: &[&str]| remote_replay("in.db", out.to_str().unwrap(), extra);
    let o = remote(&["--capture-iface", "lo"]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(e.contains("--vantage client"), "{e}");
    let o = remote(&["--vantage", "client"]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(e.contains("needs --capture-iface"), "{e}");
    let o = remote(&["--vantage", "tap"]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(e.contains("server") && e.contains("client"), "{e}");
    let o = run(&[
        "replay",
        "in.db",
        "-o",
        out.to_str().unwrap(),
        "--lab",
        "x",
        "--vantage",
        "client",
    ]);
    // the vantage is a remote replay's (`--server`): named as not for a lab
    assert_refused(&o, "cannot be used with '--vantage <SIDE>'");
    assert!(!out.exists());
}

/// serve's capture settings only make sense with a controller to start the capture.
#[test]
fn serve_capture_flags_need_a_control_channel() {
    let o = run(&["serve", "--listen", "127.0.0.1:0", "--capture-iface", "lo"]);
    assert_refused(&o, "--control");
}

#[test]
fn serve_names_a_bad_timer_cpu_list() {
    for (list, why) in [("x", "not a CPU number"), ("3-1", "runs backwards")] {
        let o = run(&["serve", "--listen", "127.0.0.1:0", "--timer-cpus", list]);
        assert_ne!(o.status.code(), Some(0));
        let e = stderr(&o);
        assert!(e.contains("--timer-cpus") && e.contains(why), "{e}");
    }
    // a CPU this process may not use is refused by the kernel, and said so
    let o = run(&["serve", "--listen", "127.0.0.1:0", "--timer-cpus", "1000"]);
    assert_ne!(o.status.code(), Some(0));
    let e = stderr(&o);
    assert!(e.contains("keeping the timer thread on CPUs 1000"), "{e}");
}

/// A workload in which no connection has a bandwidth estimate, nor one to pool, is not
/// replayed unshaped behind the user's back: the default (`--unestimated pooled`) leaves
/// every connection out, and the error says so and names the flag that would replay them
/// without a rate limit, before any lab is built.
#[test]
fn a_workload_without_estimates_is_not_replayed_unshaped_by_default() {
    let dir = tempdir();
    let db = dir.path().join("noest.db");
    let out = dir.path().join("replay.db");
    let o = run(&[
        "synth",
        "--connections",
        "6",
        "--seed",
        "5",
        "-o",
        db.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "synth: {}", stderr(&o));
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute("UPDATE connections SET bw_bps = NULL", [])
        .unwrap();
    let lab = format!("rcli{}u", std::process::id());
    let o = run(&[
        "replay",
        db.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--lab",
        &lab,
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("noest.db")
            && e.contains("bandwidth estimate")
            && e.contains("--unestimated unshaped"),
        "{e}"
    );
    assert!(!out.exists());
    assert!(
        !std::path::Path::new(&format!("/run/netns/{lab}-cli")).exists(),
        "a refused workload built a lab"
    );

    // `mimic netemu render --from` gives the pipes a replay would: the same refusal, and with
    // --unestimated unshaped pipes without a rate
    let from = db.to_str().unwrap();
    let o = run(&["netemu", "render", "--backend", "tc", "--from", from]);
    assert_refused(&o, "--unestimated unshaped");
    let o = run(&[
        "netemu",
        "render",
        "--backend",
        "tc",
        "--from",
        from,
        "--unestimated",
        "unshaped",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));

    let o = run(&[
        "replay",
        "in.db",
        "-o",
        "out.db",
        "--lab",
        "x",
        "--unestimated",
        "none",
    ]);
    assert_refused(
        &o,
        "--unestimated takes pooled, pooled-class, skip or unshaped",
    );
}

#[test]
fn emulator_flag_errors_name_what_is_wrong() {
    let dir = tempdir();
    let out = dir.path().join("replay.db");
    let out_s = out.to_str().unwrap();
    // not an emulator: a usage error listing the three
    let o = run(&[
        "replay",
        "in.db",
        "-o",
        out_s,
        "--lab",
        "x",
        "--emulator",
        "netemu",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("`netemu` is not an emulator (mimic, netem or dummynet)"),
        "{e}"
    );
    // dummynet on a remote router: refused before anything is reached; netem goes on (to
    // the missing input here: a remote router takes netem pipes, `netemu run --backend netem`)
    for emulator in ["netem", "dummynet"] {
        let o = remote_replay("in.db", out_s, &["--emulator", emulator]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        let e = stderr(&o);
        if emulator == "dummynet" {
            assert!(
                e.contains("--emulator dummynet")
                    && e.contains("a remote router takes kernel pipes only as netem"),
                "{e}"
            );
        } else {
            assert!(e.contains("in.db") && !e.contains("remote router"), "{e}");
        }
    }
    // --kernel-pipes with mimic's own emulator: refused, naming why
    let o = run(&[
        "replay",
        "in.db",
        "-o",
        out_s,
        "--lab",
        "x",
        "--kernel-pipes",
        "per-connection",
    ]);
    assert_refused(&o, "--kernel-pipes per-connection: only kernel pipes");
    let o = run(&[
        "replay",
        "in.db",
        "-o",
        out_s,
        "--lab",
        "x",
        "--kernel-pipes",
        "some",
    ]);
    assert_refused(
        &o,
        "`some` is not a kernel pipe mode (auto, all or per-connection)",
    );
    assert!(!out.exists());
}

/// `mimic synth check` counts and names the replayed connections it could not pair instead of
/// dropping them silently: a `replay_map` whose replayed ids are not among the replay's
/// connections (damaged or edited) scored "0 replayed connections paired" with no reason.
#[test]
fn synth_check_names_replayed_connections_it_cannot_pair() {
    let dir = tempdir();
    let truth = dir.path().join("syn.db");
    let o = run(&[
        "synth",
        "-q",
        "--connections",
        "20",
        "-o",
        truth.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // a replay that recovered the truth exactly: the workload itself, mapped onto itself
    let replay = dir.path().join("replay.db");
    std::fs::copy(&truth, &replay).unwrap();
    let c = rusqlite::Connection::open(&replay).unwrap();
    c.execute_batch(
        "UPDATE meta SET value = 'replay' WHERE key = 'role';
         INSERT INTO replay_map SELECT id, id, 'ok', NULL, client_ip, client_port, server_ip,
             server_port FROM connections;",
    )
    .unwrap();
    let check = || {
        let o = run(&[
            "synth",
            "check",
            truth.to_str().unwrap(),
            replay.to_str().unwrap(),
        ]);
        assert!(matches!(o.status.code(), Some(0 | 1)), "{}", stderr(&o));
        crate::common::stdout(&o)
    };
    let out = check();
    assert!(
        out.starts_with(
            "inference accuracy: 20 replayed connections paired with their truth (0 failed to replay)\n"
        ),
        "{out}"
    );
    c.execute_batch(
        "UPDATE replay_map SET replay_conn_id = replay_conn_id + 100000 WHERE orig_conn_id IN
             (SELECT orig_conn_id FROM replay_map ORDER BY orig_conn_id LIMIT 3);
         UPDATE replay_map SET orig_conn_id = orig_conn_id + 100000 WHERE orig_conn_id IN
             (SELECT orig_conn_id FROM replay_map ORDER BY orig_conn_id DESC LIMIT 2);",
    )
    .unwrap();
    let out = check();
    assert!(
        out.starts_with(
            "inference accuracy: 15 replayed connections paired with their truth (0 failed to \
             replay; 2 left out: original id not among the truth's connections; 3 left out: \
             replayed connection id not among the replay's connections)\n"
        ),
        "{out}"
    );
}

/// A client (source) address no TCP connection can come from is refused where it is given,
/// by `replay` and by `netemu render --from`, which renders the pipes for those addresses.
#[test]
fn a_client_address_no_connection_can_come_from_is_refused() {
    for (addr, why) in [
        ("0.0.0.0", "0.0.0.0 is the unspecified address"),
        (
            "255.255.255.255",
            "255.255.255.255 is the broadcast address",
        ),
        ("224.0.0.1", "224.0.0.1 is a multicast address"),
        ("198.19.0.300", "`198.19.0.300` is not an IPv4 address"),
    ] {
        let o = remote_replay("in.db", "out.db", &["--client-addr", addr]);
        assert_refused(&o, why);
        let o = run(&[
            "netemu",
            "render",
            "--backend",
            "netem",
            "--from",
            "in.db",
            "--client-addr",
            addr,
        ]);
        assert_refused(&o, why);
    }
}

/// `synth --max-response` above every class's own cap would change nothing while `meta`
/// recorded it as given: refused, saying what the option does.
#[test]
fn synth_refuses_a_max_response_it_cannot_apply() {
    let dir = tempdir();
    let out = dir.path().join("s.db");
    let o = run(&[
        "synth",
        "-q",
        "--connections",
        "5",
        "--max-response",
        "300001",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_refused(
        &o,
        "--max-response 300001: the largest response of any client class is 300000 bytes",
    );
    assert!(!out.exists());
    let o = run(&[
        "synth",
        "-q",
        "--connections",
        "5",
        "--max-response",
        "300000",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// What a remote replay can know is wrong is refused before it dials a role (it used to wait
/// 15 s for the emulator and then blame it, or fail after the whole replay): a source address
/// this host does not hold, a capture interface that does not exist, a --keep-capture that is
/// a file, and the lab-only --no-cpu-split.
#[test]
fn a_remote_replay_refuses_up_front_what_it_can_check() {
    let dir = tempdir();
    let out = dir.path().join("r.db");
    let out = out.to_str().unwrap();
    let file = dir.path().join("f");
    std::fs::write(&file, "x").unwrap();
    for (extra, want) in [
        (
            &["--client-addr", "203.0.113.5"][..],
            "203.0.113.5 is not an address of this host",
        ),
        (
            &["--vantage", "client", "--capture-iface", "nosuchif0"],
            "--capture-iface nosuchif0: no such network interface",
        ),
        (
            &["--keep-capture", file.to_str().unwrap()],
            "not a directory",
        ),
        (&["--no-cpu-split"], "--no-cpu-split is for a lab replay"),
    ] {
        // (before any role is dialled: those in remote_replay do not exist)
        let o = remote_replay("in.db", out, extra);
        assert_refused(&o, want);
    }
}
