//! Builds the DPDK C shim when the `dpdk` feature is on (flags from `pkg-config libdpdk`).
//! Without the feature this does nothing and the crate needs no DPDK at all.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "dpdk")]
    dpdk::build();
}

#[cfg(feature = "dpdk")]
mod dpdk {
    use std::process::Command;

    fn pkg_config(args: &[&str]) -> Vec<String> {
        let out = Command::new("pkg-config").args(args).arg("libdpdk").output().unwrap_or_else(|e| {
            panic!("the `dpdk` feature needs pkg-config and libdpdk-dev (apt-get install pkg-config libdpdk-dev): {e}")
        });
        if !out.status.success() {
            panic!(
                "the `dpdk` feature needs DPDK 22.11 (Debian libdpdk-dev): pkg-config libdpdk failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(String::from)
            .collect()
    }

    pub fn build() {
        println!("cargo:rerun-if-changed=csrc/dpdk_shim.c");
        let version = pkg_config(&["--modversion"]).join("");
        if !version.starts_with("22.11") {
            println!("cargo:warning=mimic-capture was written against DPDK 22.11; found {version}");
        }
        let mut b = cc::Build::new();
        b.file("csrc/dpdk_shim.c").warnings(false).opt_level(2);
        let cflags = pkg_config(&["--cflags"]);
        let mut it = cflags.iter();
        while let Some(f) = it.next() {
            if let Some(inc) = f.strip_prefix("-I") {
                b.include(inc);
            } else if f == "-include" {
                if let Some(h) = it.next() {
                    b.flag("-include").flag(h);
                }
            } else {
                b.flag(f);
            }
        }
        b.compile("mimic_dpdk_shim");
        for f in pkg_config(&["--libs"]) {
            if let Some(l) = f.strip_prefix("-l") {
                println!("cargo:rustc-link-lib={l}");
            } else if let Some(p) = f.strip_prefix("-L") {
                println!("cargo:rustc-link-search=native={p}");
            } else if f.starts_with("-Wl,") {
                println!("cargo:rustc-link-arg={f}");
            }
        }
    }
}
