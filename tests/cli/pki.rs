//! `mimic pki init` and the roles' loading of its files.

use std::os::unix::fs::PermissionsExt;

use crate::common::{assert_refused, run, stderr, stdout, tempdir};

#[test]
fn pki_init_writes_keys_0600_and_refuses_to_overwrite_without_force() {
    let d = tempdir();
    let dir = d.path().join("pki");
    let dir_s = dir.to_str().unwrap();
    let o = run(&["pki", "init", dir_s, "--role", "capture"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let listed = stdout(&o);
    for f in [
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
        assert!(listed.contains(&format!("/{f}\n")), "{f} in {listed}");
        let mode = std::fs::metadata(dir.join(f)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, if f.ends_with(".key") { 0o600 } else { 0o644 }, "{f}");
    }
    let ca = std::fs::read(dir.join("ca.crt")).unwrap();

    let o = run(&["pki", "init", dir_s]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(e.contains("--force") && e.contains("ca.crt"), "{e}");
    assert_eq!(std::fs::read(dir.join("ca.crt")).unwrap(), ca);

    let o = run(&["pki", "init", dir_s, "--force"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_ne!(std::fs::read(dir.join("ca.crt")).unwrap(), ca);

    let o = run(&["pki", "init", dir_s, "--force", "--role", "Not A Name"]);
    assert_refused(&o, "not a role name");
    let long = "r".repeat(64);
    let o = run(&["pki", "init", dir_s, "--force", "--role", &long]);
    assert_refused(&o, "at most 63 characters");
}

#[test]
fn serve_names_the_missing_or_unsafe_key_before_serving() {
    let d = tempdir();
    let dir = d.path().join("pki");
    let dir_s = dir.to_str().unwrap();
    assert!(run(&["pki", "init", dir_s]).status.success());
    let serve = |pki: &str| {
        run(&[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--control",
            &format!("unix:{}", d.path().join("s.sock").display()),
            "--pki",
            pki,
        ])
    };
    std::fs::set_permissions(
        dir.join("serve.key"),
        std::fs::Permissions::from_mode(0o640),
    )
    .unwrap();
    let o = serve(dir_s);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(e.contains("serve.key") && e.contains("chmod 600"), "{e}");
    std::fs::remove_file(dir.join("serve.key")).unwrap();
    let o = serve(dir_s);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(e.contains("serve.key") && e.contains("pki init"), "{e}");
    // --control without --pki is a usage error
    let o = run(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--control",
        "tcp:127.0.0.1:1",
    ]);
    assert_refused(&o, "--pki");
}
