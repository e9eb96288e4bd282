//! `mimic agent` and `mimic replay --agents`: what is refused before anything starts.

use crate::common::{assert_refused, run, stderr, tempdir};

#[test]
fn agent_flags_are_checked_before_anything_starts() {
    let d = tempdir();
    let sock = format!("unix:{}", d.path().join("a.sock").display());
    // no source address
    let o = run(&["agent", "--control", &sock, "--pki", "/nonexistent"]);
    assert_refused(&o, "--client-addr");
    // more addresses than an agent takes
    let o = run(&[
        "agent",
        "--control",
        &sock,
        "--pki",
        "/nonexistent",
        "--client-addr",
        "10.0.0.0/8",
    ]);
    assert_refused(&o, "more than 65536");
    // a PKI without the agent's files: named, with the way to make them
    let pki = d.path().join("pki");
    std::fs::create_dir(&pki).unwrap();
    let o = run(&[
        "agent",
        "--control",
        &sock,
        "--pki",
        pki.to_str().unwrap(),
        "--client-addr",
        "127.0.0.2",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(e.contains("ca.crt") && e.contains("pki init"), "{e}");
    assert!(!d.path().join("a.sock").exists());
}

#[test]
fn replay_agents_are_parsed_and_a_remote_replay_needs_addresses_or_agents() {
    let o = run(&[
        "replay",
        "in.db",
        "-o",
        "out.db",
        "--lab",
        "x",
        "--agents",
        "cli,nohost",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(e.contains("`nohost` is not an agent"), "{e}");
    let remote = [
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
    ];
    let o = run(&remote);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(e.contains("--client-addr (or --agents)"), "{e}");
    // --agents and --client-addr name the client side twice
    let o = run(&[
        &remote[..],
        &["--client-addr", "127.0.0.2", "--agents", "h:7300"],
    ]
    .concat());
    assert_refused(&o, "cannot be used with");
}
