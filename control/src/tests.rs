//! The channel end to end over loopback TCP: every kind of unauthenticated peer is refused
//! before any command runs, and the role keeps serving the legitimate controller.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use crate::pki::{self, InitOptions};
use crate::*;

fn pki_dir() -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix("mimic-pki-")
        .tempdir()
        .unwrap();
    pki::init(d.path(), &InitOptions::default()).unwrap();
    d
}

/// A role `netemu` on 127.0.0.1 whose handler counts `bump`s and echoes everything else.
struct Role {
    addr: ControlAddr,
    bumps: Arc<AtomicU64>,
    counters: Arc<ServerCounters>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Role {
    fn start(dir: &Path, role: &str) -> Role {
        let l = Listener::bind(&"tcp:127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        let bumps = Arc::new(AtomicU64::new(0));
        let b = bumps.clone();
        let handler: Handler = Arc::new(move |v: Value| match v["op"].as_str() {
            Some("bump") => Ok(json!(b.fetch_add(1, Ordering::SeqCst) + 1)),
            Some("fail") => Err("as asked".into()),
            Some("sleep") => {
                std::thread::sleep(Duration::from_millis(v["ms"].as_u64().unwrap_or(0)));
                Ok(json!("slept"))
            }
            _ => Ok(v),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let s = Server::new(l, RoleTls::load(dir, role).unwrap(), handler, stop.clone());
        let counters = s.counters();
        let thread = Some(s.spawn().unwrap());
        Role {
            addr,
            bumps,
            counters,
            stop,
            thread,
        }
    }

    fn tcp(&self) -> String {
        match &self.addr {
            ControlAddr::Tcp(a) => a.clone(),
            ControlAddr::Unix(_) => unreachable!(),
        }
    }

    /// Waits for the server's connection thread to count a refusal.
    fn wait_refused(&self, n: u64) {
        for _ in 0..200 {
            if self.counters.refused.load(Ordering::SeqCst) >= n {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!(
            "the role counted {} refusals, expected {n}",
            self.counters.refused.load(Ordering::SeqCst)
        );
    }

    /// The legitimate controller still gets through, and its command runs.
    fn still_serves(&self, dir: &Path) {
        let before = self.bumps.load(Ordering::SeqCst);
        let mut c = Client::connect(&self.addr, &ControllerTls::load(dir).unwrap(), "netemu")
            .expect("the legitimate controller is served");
        assert_eq!(c.call(&json!({"op": "bump"})).unwrap(), json!(before + 1));
    }
}

impl Drop for Role {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

fn auth_error(r: Result<Client, ControlError>) -> String {
    match r {
        Err(ControlError::Auth { why, .. }) => why,
        Err(e) => panic!("expected an authentication error, got {e}"),
        Ok(_) => panic!("expected an authentication error, the connection was accepted"),
    }
}

#[test]
fn addresses() {
    assert_eq!(
        "unix:/run/x.sock".parse::<ControlAddr>(),
        Ok(ControlAddr::Unix("/run/x.sock".into()))
    );
    assert_eq!(
        "tcp:127.0.0.1:7070".parse::<ControlAddr>(),
        Ok(ControlAddr::Tcp("127.0.0.1:7070".into()))
    );
    assert!("127.0.0.1:7070".parse::<ControlAddr>().is_err());
    assert!("tcp:7070".parse::<ControlAddr>().is_err());
    assert_eq!(
        "tcp:[::1]:0".parse::<ControlAddr>(),
        Ok(ControlAddr::Tcp("[::1]:0".into()))
    );
    assert!("tcp:host.example:7000".parse::<ControlAddr>().is_ok());
    // no port, or an IPv6 address without brackets: refused when parsed, not when bound
    for bad in [
        "tcp:[::1]",
        "tcp:::1",
        "tcp:host:",
        "tcp::7000",
        "tcp:h:70000",
    ] {
        let e = bad.parse::<ControlAddr>().unwrap_err();
        assert!(e.contains("write tcp:HOST:PORT"), "{bad}: {e}");
    }
}

#[test]
fn init_writes_private_keys_0600_and_refuses_to_overwrite() {
    let d = tempfile::Builder::new()
        .prefix("mimic-pki-")
        .tempdir()
        .unwrap();
    let dir = d.path().join("pki");
    let opts = InitOptions {
        extra_roles: vec!["capture".into()],
        ..InitOptions::default()
    };
    let files = pki::init(&dir, &opts).unwrap();
    let names: Vec<String> = files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for n in [
        "ca.crt",
        "controller.crt",
        "controller.key",
        "netemu.crt",
        "netemu.key",
        "serve.crt",
        "serve.key",
        "agent.crt",
        "agent.key",
        "capture.crt",
        "capture.key",
    ] {
        assert!(names.iter().any(|x| x == n), "{n} written: {names:?}");
    }
    assert!(!dir.join("ca.key").exists(), "the CA key is never written");
    for f in &files {
        let mode = std::fs::metadata(f).unwrap().permissions().mode() & 0o777;
        if f.extension().unwrap() == "key" {
            assert_eq!(mode, 0o600, "{}", f.display());
        } else {
            assert_eq!(mode & 0o077, 0o044, "{}", f.display());
        }
    }
    assert_eq!(
        std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let ca = std::fs::read(dir.join("ca.crt")).unwrap();
    let e = pki::init(&dir, &opts).unwrap_err().to_string();
    assert!(e.contains("--force") && e.contains("ca.crt"), "{e}");
    assert_eq!(std::fs::read(dir.join("ca.crt")).unwrap(), ca, "left alone");
    pki::init(
        &dir,
        &InitOptions {
            force: true,
            ..opts.clone()
        },
    )
    .unwrap();
    assert_ne!(std::fs::read(dir.join("ca.crt")).unwrap(), ca, "replaced");
    assert!(std::fs::read_dir(&dir).unwrap().all(|e| !e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .contains(".tmp")));
    assert!(pki::init(
        &dir,
        &InitOptions {
            extra_roles: vec!["Bad Name".into()],
            force: true,
            ..InitOptions::default()
        }
    )
    .is_err());
}

#[test]
fn a_forced_init_that_cannot_finish_replaces_nothing_and_days_stop_at_9999() {
    let d = tempfile::Builder::new()
        .prefix("mimic-pki-")
        .tempdir()
        .unwrap();
    let dir = d.path().join("pki");
    let opts = InitOptions::default();
    pki::init(&dir, &opts).unwrap();
    let before: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap())
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    // one of the files is a directory now: a forced init refuses before writing anything
    std::fs::remove_file(dir.join("serve.key")).unwrap();
    std::fs::create_dir(dir.join("serve.key")).unwrap();
    let forced = InitOptions {
        force: true,
        ..opts.clone()
    };
    let e = pki::init(&dir, &forced).unwrap_err().to_string();
    assert!(
        e.contains("serve.key") && e.contains("not a regular file"),
        "{e}"
    );
    for (name, bytes) in &before {
        if name != "serve.key" {
            assert_eq!(
                &std::fs::read(dir.join(name)).unwrap(),
                bytes,
                "{name} replaced"
            );
        }
    }
    assert!(std::fs::read_dir(&dir).unwrap().all(|e| !e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .contains(".tmp")));

    // a validity past the year 9999 is refused before the directory is made
    let far = d.path().join("far");
    let e = pki::init(
        &far,
        &InitOptions {
            days: 3_000_000,
            ..InitOptions::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("9999") && e.contains("3000000"), "{e}");
    assert!(!far.exists(), "a refused init made its directory");
    pki::init(
        &far,
        &InitOptions {
            days: 365 * 100,
            ..InitOptions::default()
        },
    )
    .unwrap();
}

#[test]
fn loading_names_the_missing_or_unsafe_file() {
    let d = pki_dir();
    std::fs::remove_file(d.path().join("serve.key")).unwrap();
    let e = RoleTls::load(d.path(), "serve").err().unwrap().to_string();
    assert!(e.contains("serve.key") && e.contains("pki init"), "{e}");
    std::fs::set_permissions(
        d.path().join("controller.key"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let e = ControllerTls::load(d.path()).err().unwrap().to_string();
    assert!(
        e.contains("controller.key") && e.contains("chmod 600"),
        "{e}"
    );
    // a file where the directory should be
    let e = RoleTls::load(&d.path().join("netemu.key"), "serve")
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("netemu.key: not a directory"), "{e}");
    std::fs::write(d.path().join("netemu.crt"), "not pem").unwrap();
    let e = RoleTls::load(d.path(), "netemu").err().unwrap().to_string();
    assert!(e.contains("netemu.crt"), "{e}");
}

#[test]
fn the_controller_is_served_over_tls_and_unix_sockets() {
    let d = pki_dir();
    let role = Role::start(d.path(), "netemu");
    let tls = ControllerTls::load(d.path()).unwrap();
    let mut c = Client::connect(&role.addr, &tls, "netemu").unwrap();
    assert_eq!(c.call(&json!({"op": "bump"})).unwrap(), json!(1));
    assert_eq!(
        c.call(&json!({"op": "echo", "x": [1, 2]})).unwrap(),
        json!({"op": "echo", "x": [1, 2]})
    );
    assert!(matches!(
        c.call(&json!({"op": "fail"})),
        Err(ControlError::Refused { msg, .. }) if msg == "as asked"
    ));
    // the connection survives a refused command
    assert_eq!(c.call(&json!({"op": "bump"})).unwrap(), json!(2));

    let t = tempfile::Builder::new()
        .prefix("mimic-ctl-")
        .tempdir()
        .unwrap();
    let addr = ControlAddr::Unix(t.path().join("serve.sock"));
    let l = Listener::bind(&addr).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let h: Handler = Arc::new(|_| Ok(json!("pong")));
    let srv = Server::new(
        l,
        RoleTls::load(d.path(), "serve").unwrap(),
        h,
        stop.clone(),
    )
    .spawn()
    .unwrap();
    let mut c = Client::connect(&addr, &tls, "serve").unwrap();
    assert_eq!(c.call(&json!({"op": "ping"})).unwrap(), json!("pong"));
    // the emulator's certificate does not answer for the server
    let e = auth_error(Client::connect(&role.addr, &tls, "serve"));
    assert!(e.contains("another role"), "{e}");
    stop.store(true, Ordering::SeqCst);
    srv.join().unwrap();
    assert!(!t.path().join("serve.sock").exists(), "socket removed");

    // a stale socket is replaced; a file that is not a socket is refused and kept (it was
    // deleted, and the socket that took its place removed at exit)
    let stale = t.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    assert!(stale.exists());
    drop(Listener::bind(&ControlAddr::Unix(stale.clone())).unwrap());
    let file = t.path().join("notes.txt");
    std::fs::write(&file, "precious").unwrap();
    let e = Listener::bind(&ControlAddr::Unix(file.clone()))
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("notes.txt: exists and is not a socket"), "{e}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "precious");
}

#[test]
fn a_controller_with_a_key_from_another_pki_is_refused() {
    let d = pki_dir();
    let other = pki_dir();
    let role = Role::start(d.path(), "netemu");
    let e = auth_error(Client::connect(
        &role.addr,
        &ControllerTls::load(other.path()).unwrap(),
        "netemu",
    ));
    // our side does not trust the role's CA either: it refuses first
    assert!(e.contains("not signed by this PKI's CA"), "{e}");

    // the same CA as the role trusts, but the certificate and key of another PKI's
    // controller: the role refuses it (`load` itself refuses such files: `load_identity`
    // takes them, as a controller built another way could show them)
    std::fs::copy(d.path().join("ca.crt"), other.path().join("ca.crt")).unwrap();
    assert!(ControllerTls::load(other.path()).is_err());
    let e = auth_error(Client::connect(
        &role.addr,
        &ControllerTls::load_identity(other.path(), "controller").unwrap(),
        "netemu",
    ));
    assert!(e.contains("refused our certificate"), "{e}");
    role.wait_refused(2);
    assert_eq!(role.counters.requests.load(Ordering::SeqCst), 0);
    assert_eq!(role.bumps.load(Ordering::SeqCst), 0);
    role.still_serves(d.path());
}

#[test]
fn a_controller_without_a_key_is_refused() {
    let d = pki_dir();
    let role = Role::start(d.path(), "netemu");
    let e = auth_error(Client::connect(
        &role.addr,
        &ControllerTls::without_identity(d.path()).unwrap(),
        "netemu",
    ));
    assert!(e.contains("certificate"), "{e}");
    role.wait_refused(1);
    assert_eq!(role.counters.requests.load(Ordering::SeqCst), 0);
    role.still_serves(d.path());
}

#[test]
fn a_role_key_cannot_give_commands() {
    let d = pki_dir();
    let role = Role::start(d.path(), "netemu");
    let e = auth_error(Client::connect(
        &role.addr,
        &ControllerTls::load_identity(d.path(), "serve").unwrap(),
        "netemu",
    ));
    assert!(e.contains("refused our certificate"), "{e}");
    role.wait_refused(1);
    assert_eq!(role.counters.requests.load(Ordering::SeqCst), 0);
    role.still_serves(d.path());
}

#[test]
fn a_plaintext_client_is_refused() {
    let d = pki_dir();
    let role = Role::start(d.path(), "netemu");
    let mut s = TcpStream::connect(role.tcp()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // what a client of the former token channel sent
    s.write_all(b"{\"op\":\"hello\",\"token\":\"sesame\"}\n{\"op\":\"bump\"}\n")
        .unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    assert!(
        !String::from_utf8_lossy(&got).contains("\"ok\""),
        "no JSON answer: {got:?}"
    );
    role.wait_refused(1);
    assert_eq!(role.counters.requests.load(Ordering::SeqCst), 0);
    assert_eq!(role.bumps.load(Ordering::SeqCst), 0);
    role.still_serves(d.path());
}

#[test]
fn a_replayed_handshake_is_refused() {
    let d = pki_dir();
    let role = Role::start(d.path(), "netemu");
    // a recording proxy in front of the role
    let proxy = TcpListener::bind("127.0.0.1:0").unwrap();
    let paddr = proxy.local_addr().unwrap();
    let target = role.tcp();
    let recorded = Arc::new(Mutex::new(Vec::new()));
    let rec = recorded.clone();
    let p = std::thread::spawn(move || {
        let (mut c, _) = proxy.accept().unwrap();
        let mut s = TcpStream::connect(target).unwrap();
        let (mut c2, mut s2) = (c.try_clone().unwrap(), s.try_clone().unwrap());
        let down = std::thread::spawn(move || {
            let _ = std::io::copy(&mut s2, &mut c2);
            let _ = c2.shutdown(std::net::Shutdown::Write);
        });
        let mut buf = [0u8; 4096];
        loop {
            match c.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    rec.lock().unwrap().extend_from_slice(&buf[..n]);
                    if s.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = s.shutdown(std::net::Shutdown::Write);
        down.join().unwrap();
    });
    {
        let mut c = Client::connect(
            &ControlAddr::Tcp(paddr.to_string()),
            &ControllerTls::load(d.path()).unwrap(),
            "netemu",
        )
        .unwrap();
        assert_eq!(c.call(&json!({"op": "bump"})).unwrap(), json!(1));
    }
    p.join().unwrap();
    let bytes = recorded.lock().unwrap().clone();
    assert!(bytes.len() > 500, "recorded {} bytes", bytes.len());
    assert_eq!(role.counters.authenticated.load(Ordering::SeqCst), 1);

    // the legitimate controller's bytes, replayed to the role (a fresh handshake)
    let mut s = TcpStream::connect(role.tcp()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&bytes).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    role.wait_refused(1);
    assert_eq!(role.counters.authenticated.load(Ordering::SeqCst), 1);
    assert_eq!(
        role.bumps.load(Ordering::SeqCst),
        1,
        "the replayed command did not run"
    );
    role.still_serves(d.path());
}

#[test]
fn a_role_with_a_certificate_from_another_pki_is_not_trusted() {
    let d = pki_dir();
    let other = pki_dir();
    let role = Role::start(other.path(), "netemu");
    let e = auth_error(Client::connect(
        &role.addr,
        &ControllerTls::load(d.path()).unwrap(),
        "netemu",
    ));
    assert!(e.contains("not signed by this PKI's CA"), "{e}");
    assert_eq!(role.counters.requests.load(Ordering::SeqCst), 0);
}

/// Files whose certificates expired are refused when loaded, on either side, naming the file
/// and this host's clock (the other end would refuse them at the first handshake).
#[test]
fn expired_certificates_are_refused_when_loaded() {
    let d = tempfile::tempdir().unwrap();
    let days = InitOptions {
        days: 2,
        ..InitOptions::default()
    };
    let then = time::OffsetDateTime::now_utc() - time::Duration::days(30);
    pki::init_at(d.path(), &days, then).unwrap();
    let role = RoleTls::load(d.path(), "netemu")
        .err()
        .expect("an expired role certificate");
    let controller = ControllerTls::load(d.path())
        .err()
        .expect("an expired controller certificate");
    for (e, file) in [(role, "netemu.crt"), (controller, "controller.crt")] {
        let e = e.to_string();
        assert!(
            e.contains(&d.path().join(file).display().to_string()),
            "{e}"
        );
        assert!(e.contains("the certificate expired on 20"), "{e}");
        assert!(e.contains("UTC by this host's clock (it reads 20"), "{e}");
        assert!(e.contains("mimic pki init --force"), "{e}");
    }
    // made a day ago and valid for two: loads
    let fresh = tempfile::tempdir().unwrap();
    pki::init_at(
        fresh.path(),
        &days,
        time::OffsetDateTime::now_utc() - time::Duration::days(1),
    )
    .unwrap();
    RoleTls::load(fresh.path(), "netemu").unwrap();
    ControllerTls::load(fresh.path()).unwrap();
}

/// A role that does not answer within the call's limit: the call fails with a timeout naming
/// the role and the request, in about the limit and not when the role wakes; the client says
/// why it cannot be used any more, and the role goes on serving new connections. Calls within
/// their limits, however slow, are answered; a TCP connection watches its peer's host.
#[test]
fn a_call_the_role_does_not_answer_in_time_fails_and_closes_the_connection() {
    let d = pki_dir();
    let role = Role::start(d.path(), "netemu");
    let tls = ControllerTls::load(d.path()).unwrap();
    let mut c = Client::connect(&role.addr, &tls, "netemu").unwrap();
    assert_eq!(
        c.stream().tcp_user_timeout(),
        Some(PEER_SILENT),
        "TCP_USER_TIMEOUT on the controller's socket"
    );
    c.set_call_timeout(Duration::from_secs(5));
    assert_eq!(
        c.call(&json!({"op": "sleep", "ms": 600})).unwrap(),
        json!("slept"),
        "an answer slower than the socket's read slice but within the limit"
    );
    let t0 = std::time::Instant::now();
    let e = c
        .call_within(
            &json!({"op": "sleep", "ms": 3000}),
            Duration::from_millis(400),
        )
        .unwrap_err();
    let waited = t0.elapsed();
    match &e {
        ControlError::Timeout { role, op, secs, .. } => {
            assert_eq!((role.as_str(), op.as_str(), *secs), ("netemu", "sleep", 1))
        }
        e => panic!("expected a timeout, got {e}"),
    }
    assert!(e.to_string().contains("did not answer `sleep`"), "{e}");
    assert!(
        waited >= Duration::from_millis(400) && waited < Duration::from_millis(2500),
        "gave up after {waited:?}"
    );
    // the late answer must not be taken for the next call's
    match c.call(&json!({"op": "bump"})) {
        Err(ControlError::Io { err, .. }) => {
            assert_eq!(err.kind(), std::io::ErrorKind::NotConnected);
            assert!(err.to_string().contains("`sleep` timed out"), "{err}");
        }
        r => panic!("a closed client answered {r:?}"),
    }
    assert_eq!(
        role.bumps.load(Ordering::SeqCst),
        0,
        "nothing ran after the timeout"
    );
    role.still_serves(d.path());
}

/// A host given the CA of one `pki init` and its certificate from another fails when it starts,
/// naming the mix-up, rather than at the first handshake of a replay; so does a role given
/// another role's certificate.
#[test]
fn files_of_two_pki_runs_are_refused_when_loaded() {
    let a = pki_dir();
    let b = pki_dir();
    std::fs::copy(b.path().join("ca.crt"), a.path().join("ca.crt")).unwrap();
    for e in [
        RoleTls::load(a.path(), "agent").err().unwrap().to_string(),
        ControllerTls::load(a.path()).err().unwrap().to_string(),
    ] {
        assert!(
            e.contains("not signed by the CA in") && e.contains("different `mimic pki init` runs"),
            "{e}"
        );
    }
    let c = pki_dir();
    for (from, to) in [("serve.crt", "agent.crt"), ("serve.key", "agent.key")] {
        std::fs::copy(c.path().join(from), c.path().join(to)).unwrap();
    }
    let e = RoleTls::load(c.path(), "agent").err().unwrap().to_string();
    assert!(e.contains("agent.crt: names another role"), "{e}");
    // the files of one run still load
    RoleTls::load(b.path(), "agent").unwrap();
    ControllerTls::load(b.path()).unwrap();
}

/// A unix control socket's missing directories are made for it and removed with it; a path
/// longer than a socket address holds is refused before any directory is made.
#[test]
fn a_unix_socket_leaves_no_directory_behind() {
    let d = tempfile::tempdir().unwrap();
    let sock = d.path().join("a/b/c.sock");
    let l = Listener::bind(&ControlAddr::Unix(sock.clone())).unwrap();
    assert!(sock.exists());
    drop(l);
    assert!(
        !d.path().join("a").exists(),
        "the directories made for it stay"
    );
    let long = d.path().join("x/y").join("u".repeat(120));
    let e = Listener::bind(&ControlAddr::Unix(long))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("holds at most 107 bytes"), "{e}");
    assert!(
        !d.path().join("x").exists(),
        "a refused path's directories were made"
    );
    // a parent that is a file: named as such
    std::fs::write(d.path().join("f"), "").unwrap();
    let e = Listener::bind(&ControlAddr::Unix(d.path().join("f/s.sock")))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("making its directory"), "{e}");
}
