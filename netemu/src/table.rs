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

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;

use crate::config::PipeConfig;
use crate::engine::{FlowRule, PipeTable, PrefixRule};
use crate::units::quote;

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

/// toml's message for `e`: its own rendering (the line at fault, a caret under the column)
/// where the line and the message are short enough to quote whole; else the line's number
/// and column with the line and the message quoted by their heads, so that a file of one
/// long line (or a value of megabytes) gives a message of a few lines, not a copy of itself.
fn toml_message(e: &toml::de::Error, text: &str) -> String {
    let whole = |s: &str| matches!(quote(s), Cow::Borrowed(_));
    let message = e.message();
    let at = e.span().map(|s| s.start.min(text.len()));
    let Some(at) = at.filter(|&a| text.is_char_boundary(a)) else {
        return if whole(message) {
            e.to_string()
        } else {
            format!("{}\n", quote(message))
        };
    };
    let start = text[..at].rfind('\n').map_or(0, |n| n + 1);
    let line = text[start..].split('\n').next().unwrap_or("");
    if whole(line) && whole(message) {
        return e.to_string();
    }
    let n = text[..start].matches('\n').count() + 1;
    let column = text[start..at].chars().count() + 1;
    format!(
        "TOML parse error at line {n}, column {column}\n{n} | {}\n{}\n",
        quote(line),
        quote(message)
    )
}

/// Parses a pipe table; errors name `path` and the entry.
pub fn parse(text: &str, path: &str) -> Result<PipeTable, TableError> {
    let err = |msg: String| TableError {
        path: path.into(),
        msg,
    };
    let f: File = toml::from_str(text).map_err(|e| err(toml_message(&e, text)))?;
    let mut t = PipeTable::default();
    if let Some(d) = f.default {
        t.default = Some(pair(d.up, d.down, d.both, "[default]").map_err(err)?);
    }
    // the entry each pair of networks was first given in
    let mut first_prefix = HashMap::new();
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
        // the same two networks (host bits aside): prefixes are tried in order, so the later
        // entry would never be used; overlapping ones are the way to say "this, else that"
        if let Some(j) = first_prefix.insert((r.client.network(), r.server.network()), i) {
            return Err(err(format!(
                "[[prefix]] #{} and {what} both match client {} and server {}: prefixes are tried in order, so {what} would never be used (give each pair of networks one entry)",
                j + 1,
                r.client,
                r.server
            )));
        }
    }
    for (i, fl) in f.flow.into_iter().enumerate() {
        let what = format!("[[flow]] #{}", i + 1);
        let (up, down) = pair(fl.pipes.up, fl.pipes.down, fl.pipes.both, &what).map_err(err)?;
        t.flows.push(FlowRule {
            client: fl.client.parse().map_err(|_| {
                err(format!(
                    "{what}: client `{}` is not IP:PORT",
                    quote(&fl.client)
                ))
            })?,
            server: fl.server.parse().map_err(|_| {
                err(format!(
                    "{what}: server `{}` is not IP:PORT",
                    quote(&fl.server)
                ))
            })?,
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
    // a connection takes the first rule of its client and server: a second one's pipes would
    // never be used (and its filter never match)
    if let Some((j, i)) = t.duplicate_flow() {
        let r = &t.flows[i];
        return Err(err(format!(
            "[[flow]] #{} and [[flow]] #{} both match client {} and server {}: a connection takes one rule's pipes, so [[flow]] #{} would never be used (give each connection one entry)",
            j + 1,
            i + 1,
            r.client,
            r.server,
            i + 1
        )));
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

    fn flow(client: &str, server: &str, pipes: &str) -> String {
        format!("[[flow]]\nclient = \"{client}\"\nserver = \"{server}\"\nboth = \"{pipes}\"\n")
    }

    /// Two entries for one connection: the second's filter could never match, so the file is
    /// refused naming both; entries that only overlap are not duplicates.
    #[test]
    fn a_connection_or_prefix_pair_given_twice_is_refused() {
        let c = "198.19.0.7:40000";
        let s = "198.18.0.1:80";
        let text = [
            flow(c, s, "delay=1ms"),
            flow("198.19.0.8:40000", s, "delay=2ms"),
            flow(c, s, "delay=3ms,rate=1mbit"),
        ]
        .concat();
        let e = parse(&text, "p.toml").unwrap_err().to_string();
        assert!(
            e.contains("p.toml: [[flow]] #1 and [[flow]] #3 both match client 198.19.0.7:40000 and server 198.18.0.1:80"),
            "{e}"
        );
        let e = parse(
            &[
                flow("[2001:db8::1]:40000", "[2001:db8::2]:80", "delay=1ms"),
                flow("[2001:db8::1]:40000", "[2001:db8::2]:80", "delay=1ms"),
            ]
            .concat(),
            "p.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("[[flow]] #1 and [[flow]] #2"), "{e}");
        // another port, another server, the roles swapped: other connections
        let t = parse(
            &[
                flow(c, s, "delay=1ms"),
                flow("198.19.0.7:40001", s, "delay=1ms"),
                flow(c, "198.18.0.1:443", "delay=1ms"),
                flow(s, c, "delay=1ms"),
            ]
            .concat(),
            "p.toml",
        )
        .unwrap();
        assert_eq!(t.flows.len(), 4);

        let prefix = |client: &str, server: &str| {
            format!(
                "[[prefix]]\nclient = \"{client}\"\nserver = \"{server}\"\nboth = \"delay=1ms\"\n"
            )
        };
        // the same networks, written with other host bits
        let e = parse(
            &[
                prefix("198.19.0.0/24", "198.18.0.1/32"),
                prefix("198.19.1.0/24", "198.18.0.1/32"),
                prefix("198.19.0.9/24", "198.18.0.1"),
            ]
            .concat(),
            "p.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("p.toml: [[prefix]] #1 and [[prefix]] #3 both match client 198.19.0.9/24 and server 198.18.0.1/32")
                && e.contains("tried in order"),
            "{e}"
        );
        for (a, b) in [
            ("0.0.0.0/0", "10.1.2.3/0"),
            ("2001:db8::/32", "2001:db8:0:1::/32"),
        ] {
            let server = if a.contains(':') {
                "::/0"
            } else {
                "198.18.0.1"
            };
            let e = parse(&[prefix(a, server), prefix(b, server)].concat(), "p.toml")
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("[[prefix]] #1 and [[prefix]] #2 both match"),
                "{e}"
            );
        }
        // a narrower prefix in front of a wider one is "this, else that"
        let t = parse(
            &[
                prefix("198.19.0.0/25", "198.18.0.1/32"),
                prefix("198.19.0.0/24", "198.18.0.1/32"),
                prefix("198.19.0.0/24", "198.18.0.0/24"),
            ]
            .concat(),
            "p.toml",
        )
        .unwrap();
        assert_eq!(t.prefixes.len(), 3);
    }

    /// A value or a line of megabytes gives a message of a few lines: the spec, the TOML line
    /// and toml's message are quoted by their heads and lengths.
    #[test]
    fn errors_quote_long_input_by_its_head() {
        let junk = "x".repeat(5_000_000);
        let e = parse(
            &format!("[default]\nboth = \"delay=1ms,{junk}\"\n"),
            "p.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.len() < 500, "{} bytes: {}", e.len(), &e[..500]);
        assert!(
            e.starts_with("p.toml: [default]: pipe spec `delay=1ms,xxx")
                && e.contains("… (5000010 bytes)`"),
            "{e}"
        );
        // a syntax error on a line of 200 KB: its number, column and head
        let e = parse(
            &format!("# pipes\n[default]\nboth = \"{}", "y".repeat(200_000)),
            "p.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.len() < 500, "{} bytes: {}", e.len(), &e[..500]);
        assert!(
            e.contains("line 3, column 200009")
                && e.contains("3 | both = \"yyy")
                && e.contains("… (200008 bytes)"),
            "{e}"
        );
        // a string where a table belongs: serde's message quotes the value
        let e = parse(&format!("default = \"{junk}\"\n"), "p.toml")
            .unwrap_err()
            .to_string();
        assert!(e.len() < 600, "{} bytes: {}", e.len(), &e[..600]);
        let e = parse(
            &format!(
                "[[flow]]\nclient = \"{junk}\"\nserver = \"198.18.0.1:80\"\nboth = \"delay=1ms\"\n"
            ),
            "p.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.len() < 300 && e.contains("[[flow]] #1: client `xxx") && e.contains("is not IP:PORT"),
            "{e}"
        );
        // short ones are toml's own, as they were
        let text = "[default]\nboth = \"delay=1ms\"\nbogus = 1\n";
        let e = parse(text, "p.toml").unwrap_err().to_string();
        let toml_own = toml::from_str::<File>(text).err().unwrap().to_string();
        assert_eq!(e, format!("p.toml: {toml_own}"));
        assert!(e.contains("3 | bogus = 1"), "{e}");
    }
}
