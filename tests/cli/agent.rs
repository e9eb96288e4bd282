//! `mimic agent` and `mimic replay --agents`: what is refused before anything starts.

use crate::common::{assert_refused, run, stderr, tempdir};

/// `mimic agent --control SOCK --pki PKI EXTRA...`, run to its end.
fn agent(sock: &str, pki: &std::path::Path, extra: &[&str]) -> std::process::Output {
    let pki = pki.to_str().unwrap();
    run(&[&["agent", "--control", sock, "--pki", pki][..], extra].concat())
}

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
    let o = agent(&sock, &pki, &["--client-addr", "127.0.0.2"]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(e.contains("ca.crt") && e.contains("pki init"), "{e}");
    // a source address this host does not hold: its connections could never be opened
    // (TEST-NET-3; refused before the PKI is read)
    let o = agent(&sock, &pki, &["--client-addr", "203.0.113.0/30"]);
    assert_refused(
        &o,
        "203.0.113.1, 203.0.113.2 are not an address of this host",
    );
    // no connection comes from the unspecified address (bind takes it, so it passed)
    let o = agent(&sock, &pki, &["--client-addr", "0.0.0.0"]);
    assert_refused(&o, "0.0.0.0 is the unspecified address");
    assert!(!d.path().join("a.sock").exists());
}

/// The roles that serve a control channel on `tcp:HOST:0` say which port the kernel gave them
/// (and `mimic serve` its replay port): a user cannot reach them otherwise.
#[test]
fn roles_name_the_port_they_were_given() {
    let d = tempdir();
    let pki = d.path().join("pki");
    let o = run(&["pki", "init", pki.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    for role in [
        vec!["agent", "--client-addr", "127.0.0.2"],
        vec!["serve", "--listen", "127.0.0.1:0"],
    ] {
        let mut c = crate::common::mimic();
        c.args(&role)
            .args([
                "--control",
                "tcp:127.0.0.1:0",
                "--pki",
                pki.to_str().unwrap(),
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        let mut child = c.spawn().unwrap();
        let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        std::io::BufRead::read_line(&mut err, &mut line).unwrap();
        // SAFETY: the child's pid, which has not been waited for yet.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let st = child.wait().unwrap();
        assert!(st.success(), "{role:?}: {st:?}; first line {line:?}");
        let ports: Vec<u16> = line
            .match_indices("127.0.0.1:")
            .map(|(i, m)| {
                let digits: String = line[i + m.len()..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                digits.parse().unwrap()
            })
            .collect();
        let want = if role[0] == "serve" { 2 } else { 1 };
        assert!(
            ports.len() == want && ports.iter().all(|&p| p != 0),
            "{role:?}: {line:?} names {ports:?}"
        );
    }
    // a timer CPU that is not online is named as such (was the kernel's bare EINVAL)
    let sock = format!("unix:{}", d.path().join("a.sock").display());
    let o = agent(
        &sock,
        &pki,
        &["--client-addr", "127.0.0.2", "--timer-cpus", "1000"],
    );
    assert_refused(&o, "CPU 1000 is not online on this machine");
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
