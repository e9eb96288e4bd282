//! Scraping a `--metrics` endpoint in the tests: Python's `prometheus_client` (the Prometheus
//! project's own client, Debian package python3-prometheus-client) fetches the page and parses
//! it with its strict OpenMetrics parser, so a malformed page fails the test.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::process::Command;

const SCRAPE_PY: &str = r#"
import json, sys, urllib.request
from prometheus_client.openmetrics.parser import text_string_to_metric_families
r = urllib.request.urlopen(sys.argv[1], timeout=10)
text = r.read().decode("utf-8")
out = {"status": r.status, "content_type": r.headers.get("Content-Type"), "types": {}, "samples": {}}
for fam in text_string_to_metric_families(text):
    out["types"][fam.name] = fam.type
    for s in fam.samples:
        labels = ",".join('%s="%s"' % (k, v) for k, v in sorted(s.labels.items()))
        out["samples"][s.name + ("{" + labels + "}" if labels else "")] = s.value
print(json.dumps(out))
"#;

/// A python3 that has `prometheus_client`; fails the test with what to install otherwise.
pub fn python() -> String {
    for p in ["python3", "/usr/bin/python3"] {
        let ok = Command::new(p)
            .args(["-c", "import prometheus_client.openmetrics.parser"])
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return p.to_string();
        }
    }
    panic!(
        "no python3 with prometheus_client (the OpenMetrics parser these tests use): \
         scripts/deps.sh test installs python3-prometheus-client"
    );
}

/// One parsed scrape.
#[derive(Debug)]
pub struct Scrape {
    pub content_type: String,
    /// Family name → type (`counter`, `gauge`).
    pub types: BTreeMap<String, String>,
    /// `name{label="v",…}` (labels sorted) → value.
    pub samples: BTreeMap<String, f64>,
}

impl Scrape {
    /// A sample's value as a whole number; fails the test when it is missing.
    pub fn get(&self, key: &str) -> u64 {
        let v = *self
            .samples
            .get(key)
            .unwrap_or_else(|| panic!("no sample {key} in {:?}", self.samples.keys()));
        assert!(v >= 0.0 && v.fract() == 0.0, "{key} = {v}");
        v as u64
    }
}

/// Fetches and parses `url`, running the scraper under `prefix` (e.g. `ip netns exec NS`);
/// fails the test if it cannot.
pub fn scrape(prefix: &[&str], url: &str) -> Scrape {
    try_scrape(prefix, url).unwrap_or_else(|e| panic!("scraping {url}: {e}"))
}

fn try_scrape(prefix: &[&str], url: &str) -> Result<Scrape, String> {
    let py = python();
    let mut cmd = match prefix.split_first() {
        Some((p, rest)) => {
            let mut c = Command::new(p);
            c.args(rest).arg(&py);
            c
        }
        None => Command::new(&py),
    };
    let o = cmd.arg("-c").arg(SCRAPE_PY).arg(url).output().unwrap();
    if !o.status.success() {
        return Err(String::from_utf8_lossy(&o.stderr).into_owned());
    }
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).map_err(|e| e.to_string())?;
    assert_eq!(v["status"], 200, "{v}");
    let ct = v["content_type"].as_str().unwrap_or_default().to_string();
    assert!(
        ct.starts_with("application/openmetrics-text; version=1.0.0"),
        "content type {ct}"
    );
    let map = |k: &str| -> BTreeMap<String, serde_json::Value> {
        v[k].as_object()
            .unwrap()
            .iter()
            .map(|(a, b)| (a.clone(), b.clone()))
            .collect()
    };
    Ok(Scrape {
        content_type: ct,
        types: map("types")
            .into_iter()
            .map(|(k, t)| (k, t.as_str().unwrap().to_string()))
            .collect(),
        samples: map("samples")
            .into_iter()
            .map(|(k, x)| (k, x.as_f64().unwrap()))
            .collect(),
    })
}

/// Waits until `url` answers a scrape (the command has started), at most `secs` seconds.
pub fn wait_for(prefix: &[&str], url: &str, secs: u64) -> Scrape {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        match try_scrape(prefix, url) {
            Ok(s) => return s,
            Err(e) => assert!(
                std::time::Instant::now() < deadline,
                "{url} did not answer within {secs} s: {e}"
            ),
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
