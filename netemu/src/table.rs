//! The pipe table file (`--pipes FILE.toml`):
//!
//! ```toml
//! # Unmatched IP traffic (omit for "pass unshaped"). `both` sets up and down alike.
//! [default]
//! up = "delay=20ms,rate=10mbit,queue=50"
//! down = "delay=20ms,rate=10mbit,queue=50"
//!
//! # Tried in order, after the exact flow rules.
//! [[prefix]]
//! client = "198.19.0.0/24"
//! server = "198.18.0.1/32"
//! both = "delay=5ms"
//!
//! # Exact TCP connections (either direction of the connection matches).
//! [[flow]]
//! client = "198.19.0.7:40000"
//! server = "198.18.0.1:80"
//! up = "delay=10ms,rate=1mbit,ack_every=4,ack_timeout=200ms"
//! down = "delay=10ms,rate=10mbit,queue=30"
//! ```

use std::path::Path;

use serde::Deserialize;

use crate::config::PipeConfig;
use crate::engine::{FlowRule, PipeTable, PrefixRule};

#[derive(Debug, thiserror::Error)]
#[error("{path}: {msg}")]
pub struct TableError {
    pub path: String,
    pub msg: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Pair {
    up: Option<String>,
    down: Option<String>,
    both: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PrefixEntry {
    client: String,
    server: String,
    #[serde(flatten)]
    pipes: PairFlat,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FlowEntry {
    client: String,
    server: String,
    #[serde(flatten)]
    pipes: PairFlat,
}

#[derive(Deserialize)]
struct PairFlat {
    up: Option<String>,
    down: Option<String>,
    both: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    default: Option<Pair>,
    #[serde(default)]
    prefix: Vec<PrefixEntry>,
    #[serde(default)]
    flow: Vec<FlowEntry>,
}

fn pair(
    up: Option<String>,
    down: Option<String>,
    both: Option<String>,
    what: &str,
) -> Result<(PipeConfig, PipeConfig), String> {
    let parse = |s: &str| s.parse::<PipeConfig>().map_err(|e| format!("{what}: {e}"));
    match (up, down, both) {
        (None, None, Some(b)) => Ok((parse(&b)?, parse(&b)?)),
        (Some(u), Some(d), None) => Ok((parse(&u)?, parse(&d)?)),
        (None, None, None) => Err(format!("{what}: give `up` and `down`, or `both`")),
        (_, _, Some(_)) => Err(format!(
            "{what}: give either `both` or `up`/`down`, not both"
        )),
        _ => Err(format!("{what}: give both `up` and `down` (or `both`)")),
    }
}

/// Parses a pipe table; errors name `path` and the entry.
pub fn parse(text: &str, path: &str) -> Result<PipeTable, TableError> {
    let err = |msg: String| TableError {
        path: path.into(),
        msg,
    };
    let f: File = toml::from_str(text).map_err(|e| err(e.to_string()))?;
    let mut t = PipeTable::default();
    if let Some(d) = f.default {
        t.default = Some(pair(d.up, d.down, d.both, "[default]").map_err(err)?);
    }
    for (i, p) in f.prefix.into_iter().enumerate() {
        let what = format!("[[prefix]] #{}", i + 1);
        let (up, down) = pair(p.pipes.up, p.pipes.down, p.pipes.both, &what).map_err(err)?;
        t.prefixes.push(PrefixRule {
            client: p
                .client
                .parse()
                .map_err(|e| err(format!("{what}: client: {e}")))?,
            server: p
                .server
                .parse()
                .map_err(|e| err(format!("{what}: server: {e}")))?,
            up,
            down,
        });
        let r = t.prefixes.last().unwrap();
        if r.client.addr.is_ipv4() != r.server.addr.is_ipv4() {
            return Err(err(format!(
                "{what}: client {} and server {} are of different address families (IPv4 and IPv6): no packet matches it",
                r.client, r.server
            )));
        }
    }
    for (i, fl) in f.flow.into_iter().enumerate() {
        let what = format!("[[flow]] #{}", i + 1);
        let (up, down) = pair(fl.pipes.up, fl.pipes.down, fl.pipes.both, &what).map_err(err)?;
        t.flows.push(FlowRule {
            client: fl
                .client
                .parse()
                .map_err(|_| err(format!("{what}: client `{}` is not IP:PORT", fl.client)))?,
            server: fl
                .server
                .parse()
                .map_err(|_| err(format!("{what}: server `{}` is not IP:PORT", fl.server)))?,
            up,
            down,
        });
        let r = t.flows.last().unwrap();
        if let Some((end, a)) = [("client", r.client), ("server", r.server)]
            .into_iter()
            .find(|(_, a)| a.port() == 0)
        {
            return Err(err(format!(
                "{what}: {end} {a} has port 0, which no TCP segment carries: no packet matches it"
            )));
        }
        if r.client.is_ipv4() != r.server.is_ipv4() {
            return Err(err(format!(
                "{what}: client {} and server {} are of different address families (IPv4 and IPv6): no packet matches it",
                r.client, r.server
            )));
        }
    }
    Ok(t)
}

/// Reads and parses a pipe table file.
pub fn load(path: &Path) -> Result<PipeTable, TableError> {
    let text = std::fs::read_to_string(path).map_err(|e| TableError {
        path: path.display().to_string(),
        msg: e.to_string(),
    })?;
    parse(&text, &path.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_example() {
        let t = parse(
            r#"
[default]
up = "delay=20ms,rate=10mbit,queue=50"
down = "delay=20ms,rate=10mbit,queue=50"
[[prefix]]
client = "198.19.0.0/24"
server = "198.18.0.1/32"
both = "delay=5ms"
[[flow]]
client = "198.19.0.7:40000"
server = "198.18.0.1:80"
up = "delay=10ms,rate=1mbit,ack_every=4,ack_timeout=200ms"
down = "delay=10ms,rate=10mbit,queue=30"
"#,
            "x.toml",
        )
        .unwrap();
        assert!(t.default.is_some());
        assert_eq!(t.prefixes.len(), 1);
        assert_eq!(t.flows[0].up.ack.unwrap().every, 4);
    }

    #[test]
    fn errors_name_the_file_and_entry() {
        let e = parse(
            "[[flow]]\nclient = \"1.2.3.4\"\nserver = \"1.2.3.5:80\"\nboth = \"delay=1ms\"\n",
            "p.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("p.toml") && e.contains("[[flow]] #1") && e.contains("IP:PORT"),
            "{e}"
        );
        let e = parse(
            "[default]\nup = \"delay=1ms,bogus=1\"\ndown = \"delay=1ms\"\n",
            "p.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("[default]") && e.contains("bogus"), "{e}");
        let e = parse("[defaults]\n", "p.toml").unwrap_err().to_string();
        assert!(e.contains("p.toml"), "{e}");
        for (entry, client, server) in [
            ("flow", "[2001:db8::1]:40000", "198.18.0.1:80"),
            ("flow", "198.19.0.7:40000", "[2001:db8::2]:80"),
            ("prefix", "198.19.0.0/24", "2001:db8::/64"),
        ] {
            let e = parse(
                &format!("[[{entry}]]\nclient = \"{client}\"\nserver = \"{server}\"\nboth = \"delay=1ms\"\n"),
                "p.toml",
            )
            .unwrap_err()
            .to_string();
            assert!(
                e.contains("p.toml")
                    && e.contains(&format!("[[{entry}]] #1"))
                    && e.contains("different address families"),
                "{e}"
            );
        }
        // port 0 and an empty pipe spec match or shape nothing
        for (entry, want) in [
            (
                "client = \"198.19.0.7:0\"\nserver = \"198.18.0.1:80\"\nboth = \"delay=1ms\"",
                "client 198.19.0.7:0 has port 0",
            ),
            (
                "client = \"198.19.0.7:40000\"\nserver = \"198.18.0.1:0\"\nboth = \"delay=1ms\"",
                "server 198.18.0.1:0 has port 0",
            ),
            (
                "client = \"198.19.0.7:40000\"\nserver = \"198.18.0.1:80\"\nup = \"\"\ndown = \"delay=1ms\"",
                "pipe spec ``: empty",
            ),
        ] {
            let e = parse(&format!("[[flow]]\n{entry}\n"), "p.toml")
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("p.toml") && e.contains("[[flow]] #1") && e.contains(want),
                "{e}"
            );
        }
    }
}
