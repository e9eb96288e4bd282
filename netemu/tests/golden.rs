//! Golden tests for `mimic netemu render`: each `golden/NAME.toml` is rendered for each backend
//! and compared with `golden/NAME.BACKEND.sh` (or `.err` for a table the backend refuses).
//! `MIMIC_BLESS=1 cargo test -p mimic-netemu --test golden` rewrites the expected files.

use std::path::Path;

use mimic_netemu::render::{render, Backend, RenderOptions};

fn check(name: &str, backend: Backend, tag: &str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let table = mimic_netemu::table::load(&dir.join(format!("{name}.toml"))).unwrap();
    let opts = RenderOptions::new("eth0", "eth1");
    let (got, ext) = match render(backend, &table, &opts) {
        Ok(s) => (s.to_shell(), "sh"),
        Err(e) => (format!("{e}\n"), "err"),
    };
    let path = dir.join(format!("{name}.{tag}.{ext}"));
    if std::env::var_os("MIMIC_BLESS").is_some() {
        std::fs::write(&path, &got).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!(
            "{} is missing (run with MIMIC_BLESS=1 once and review it)",
            path.display()
        )
    });
    assert_eq!(got, want, "{} differs", path.display());
}

#[test]
fn table_renders_for_netem() {
    check("table", Backend::Netem, "netem");
}

#[test]
fn table_renders_for_dummynet() {
    check("table", Backend::Dummynet, "dummynet");
}

#[test]
fn netem_only_features_render_for_netem() {
    check("netem_only", Backend::Netem, "netem");
}

#[test]
fn netem_only_features_are_refused_by_dummynet() {
    check("netem_only", Backend::Dummynet, "dummynet");
}
