//! flows.db for the operator: the indexes behind GUIDE.md's per-connection queries, databases
//! of the first schema level (migrated or read), and `mimic export` in every format against the
//! database it exports, on an analysis of public captures.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use rusqlite::Connection;

use crate::common::*;

/// The first schema's DDL, as databases written before migration 0002 were created (the
/// hand-written file that core's column lists replaced).
const SCHEMA_1: &str = include_str!("../../core/testdata/schema1.sql");

/// Public captures with plain and pipelined HTTP, a refused connection, one picked up without
/// its SYN, IPv6 and VLAN-tagged traffic, and losses.
fn captures() -> Vec<PathBuf> {
    let mut v = traces_in("web");
    for f in [
        "edge/chrissanders_tcp_refuseconnection.pcapng",
        "edge/zeek_tcp_missing-syn.pcap",
        "encap/arkime_v6-http.pcap",
    ] {
        v.push(trace(f));
    }
    // without the corpus: connections reset and left open, VLAN-tagged ones, and losses
    for (f, instead) in [
        (
            "edge/zeek_http_pipelined-requests.pcap",
            "edge/generated_rst-and-open.pcap",
        ),
        ("encap/arkime_twovlan.pcap", "format/generated_vlan.pcapng"),
        (
            "loss/chrissanders_http_espn_fail.pcapng",
            "loss/generated_losses.pcap",
        ),
    ] {
        v.push(trace_or(f, instead));
    }
    v
}

/// Connections in [`captures`]: over 2,000 in the public corpus, 777 in the generated one.
fn min_connections() -> usize {
    if corpus_present() {
        2000
    } else {
        700
    }
}

fn run_limited(args: &[&str], limit: Duration) -> Output {
    let mut child = mimic()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn mimic");
    // read stdout while waiting, so a large output cannot block the child
    let mut out = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        out.read_to_end(&mut v).map(|_| v)
    });
    let start = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("mimic {args:?} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let stdout = reader.join().unwrap().expect("read stdout");
    let mut o = child.wait_with_output().expect("output");
    o.stdout = stdout;
    o
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `mimic analyze` of the captures into `dir/flows.db`.
fn analyzed(dir: &Path) -> PathBuf {
    let db = dir.join("flows.db");
    let files = captures();
    let mut args = vec!["analyze", "-q", "-o", s(&db)];
    args.extend(files.iter().map(|p| s(p)));
    let o = run_limited(&args, Duration::from_secs(120));
    assert!(o.status.success(), "analyze failed: {}", stderr(&o));
    db
}

/// A copy of `new` as a database of the first schema level: created with 0001's DDL only
/// (no newer indexes, no views), level 1, the same rows.
fn schema1_copy(new: &Path, old: &Path) {
    let c = Connection::open(old).unwrap();
    c.execute_batch(SCHEMA_1).unwrap();
    c.pragma_update(None, "user_version", 1).unwrap();
    c.execute("ATTACH DATABASE ?1 AS new", [s(new)]).unwrap();
    for t in [
        "meta",
        "connections",
        "exchanges",
        "bw_samples",
        "rtt_samples",
        "replay_map",
        "replay_pipes",
    ] {
        // the columns the first schema has (later migrations add some at the end)
        let cols: String = c
            .query_row(
                &format!("SELECT group_concat(name, ', ') FROM pragma_table_info('{t}')"),
                [],
                |r| r.get(0),
            )
            .unwrap();
        c.execute_batch(&format!(
            "INSERT INTO main.{t} ({cols}) SELECT {cols} FROM new.{t}"
        ))
        .unwrap();
    }
    c.execute_batch("DELETE FROM main.meta WHERE key = 'schema_migration'; DETACH DATABASE new")
        .unwrap();
}

fn count(c: &Connection, sql: &str) -> i64 {
    c.query_row(sql, [], |r| r.get(0)).unwrap()
}

/// The statements of GUIDE.md's SQL blocks that look up one connection (`= 42`).
fn guide_per_connection_queries() -> Vec<String> {
    let guide = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/GUIDE.md"))
        .expect("GUIDE.md");
    let mut queries = Vec::new();
    let mut in_sql = false;
    let mut block = String::new();
    for line in guide.lines() {
        if !in_sql && line.trim_start().starts_with("```sql") {
            in_sql = true;
            block.clear();
        } else if in_sql && line.trim_start().starts_with("```") {
            in_sql = false;
            for stmt in block.split(';') {
                let stmt = stmt.split_whitespace().collect::<Vec<_>>().join(" ");
                if stmt.contains("= 42") {
                    queries.push(stmt);
                }
            }
        } else if in_sql {
            // comments out, so they cannot hide a statement
            block.push_str(line.split("--").next().unwrap_or(""));
            block.push('\n');
        }
    }
    queries
}

/// `EXPLAIN QUERY PLAN` of `sql`, one detail line per step.
fn plan(c: &Connection, sql: &str) -> Vec<String> {
    let mut st = c
        .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    let rows = st.query_map([], |r| r.get::<_, String>(3)).unwrap();
    rows.collect::<rusqlite::Result<_>>().unwrap()
}

fn uses_an_index(plan: &[String]) -> bool {
    !plan.is_empty()
        && plan.iter().all(|d| {
            d.starts_with("SEARCH")
                && (d.contains("USING INDEX")
                    || d.contains("USING COVERING INDEX")
                    || d.contains("USING INTEGER PRIMARY KEY"))
        })
}

#[test]
fn guide_per_connection_queries_use_an_index() {
    let queries = guide_per_connection_queries();
    for table in ["conn_summary", "rtt_samples", "bw_samples", "exchanges"] {
        assert!(
            queries
                .iter()
                .any(|q| q.contains(&format!("FROM {table} "))),
            "GUIDE.md has no per-connection query on {table}: {queries:?}"
        );
    }
    let dir = tempdir();
    let db = analyzed(dir.path());
    let c = Connection::open(&db).unwrap();
    for q in &queries {
        let p = plan(&c, q);
        assert!(uses_an_index(&p), "{q}: {p:?}");
        // and it runs
        c.prepare(q).unwrap().query([]).unwrap().next().unwrap();
    }
    drop(c);

    // Before the migration the sample tables had no index: the same check fails there, and
    // passes once a newer mimic has opened the database.
    let old = dir.path().join("old.db");
    schema1_copy(&db, &old);
    {
        let c = Connection::open(&old).unwrap();
        for table in ["rtt_samples", "bw_samples"] {
            let p = plan(&c, &format!("SELECT * FROM {table} WHERE conn_id = 42"));
            assert!(!uses_an_index(&p), "{table} on schema 1: {p:?}");
            assert!(p.iter().any(|d| d.starts_with("SCAN")), "{p:?}");
        }
    }
    let o = run(&[
        "export",
        "--format",
        "csv",
        s(&old),
        "-o",
        s(&dir.path().join("x.csv")),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let c = Connection::open(&old).unwrap();
    for q in &queries {
        let p = plan(&c, q);
        assert!(uses_an_index(&p), "migrated: {q}: {p:?}");
    }
}

#[test]
fn a_schema1_database_is_migrated_and_reads_like_a_new_one() {
    let dir = tempdir();
    let db = analyzed(dir.path());
    let old = dir.path().join("old.db");
    schema1_copy(&db, &old);
    {
        let c = Connection::open(&old).unwrap();
        assert_eq!(
            count(&c, "SELECT count(*) FROM sqlite_master WHERE type = 'view'"),
            0
        );
        assert_eq!(count(&c, "PRAGMA user_version"), 1);
    }
    for format in ["csv", "json", "text"] {
        let a = run(&["export", "--format", format, s(&db)]);
        let b = run(&["export", "--format", format, s(&old)]);
        assert!(
            a.status.success() && b.status.success(),
            "{}{}",
            stderr(&a),
            stderr(&b)
        );
        // the text header names the file; everything else is the same
        let body = |o: &Output| {
            stdout(o)
                .lines()
                .skip((format == "text") as usize)
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert_eq!(body(&a), body(&b), "{format}");
        assert!(stdout(&b).lines().count() > min_connections(), "{format}");
    }
    // migrated in place: indexes and views added, the contract version older builds check kept
    let c = Connection::open(&old).unwrap();
    assert_eq!(
        count(&c, "PRAGMA user_version"),
        mimic_core::db::SCHEMA_LEVEL as i64
    );
    let meta = |k: &str| -> String {
        c.query_row("SELECT value FROM meta WHERE key = ?1", [k], |r| r.get(0))
            .unwrap()
    };
    assert_eq!(meta("schema_version"), "1");
    assert_eq!(
        meta("schema_migration"),
        mimic_core::db::SCHEMA_LEVEL.to_string()
    );
    for name in [
        "rtt_samples_by_conn",
        "bw_samples_by_conn",
        "conn_summary",
        "conn_class",
        "class_summary",
    ] {
        assert_eq!(
            count(
                &c,
                &format!("SELECT count(*) FROM sqlite_master WHERE name = '{name}'")
            ),
            1,
            "{name}"
        );
    }
    // the rows are untouched
    for t in ["connections", "exchanges", "rtt_samples", "bw_samples"] {
        let n = count(&c, &format!("SELECT count(*) FROM {t}"));
        let m = count(
            &Connection::open(&db).unwrap(),
            &format!("SELECT count(*) FROM {t}"),
        );
        assert_eq!(n, m, "{t}");
    }
    drop(c);
    // compare reads it too (a second schema-1 copy, compared with the migrated one)
    let old2 = dir.path().join("old2.db");
    schema1_copy(&db, &old2);
    let o = run(&["compare", s(&old2), s(&old)]);
    assert!(o.status.success(), "compare: {}", stderr(&o));
    assert!(stdout(&o).contains("old2.db"), "{}", stdout(&o));
}

/// The database's view of one connection, to check the exports against.
struct Truth {
    client: String,
    server_ip: String,
    server_port: i64,
    t_first: i64,
    t_end: i64,
    min_rtt_us: Option<i64>,
    bw_bps: Option<f64>,
    loss: Option<f64>,
    response_time_us: Option<i64>,
    exchanges: i64,
    bytes_up: i64,
    bytes_down: i64,
    complete: bool,
    http: bool,
}

fn truth(db: &Path) -> HashMap<i64, Truth> {
    let c = Connection::open(db).unwrap();
    let mut st = c
        .prepare(
            "SELECT id, client_ip, client_port, ip_version, server_ip, server_port, t_first, t_end, min_rtt_us,
                    bw_bps, loss_rate_down, response_time_us, exchanges, data_bytes_up, data_bytes_down, complete,
                    (SELECT count(*) FROM exchanges e WHERE e.conn_id = c.id AND e.method IS NOT NULL) > 0
             FROM connections c",
        )
        .unwrap();
    let rows = st
        .query_map([], |r| {
            let ip: String = r.get(1)?;
            let port: i64 = r.get(2)?;
            let v6 = r.get::<_, i64>(3)? == 6;
            Ok((
                r.get(0)?,
                Truth {
                    client: if v6 {
                        format!("[{ip}]:{port}")
                    } else {
                        format!("{ip}:{port}")
                    },
                    server_ip: r.get(4)?,
                    server_port: r.get(5)?,
                    t_first: r.get(6)?,
                    t_end: r.get(7)?,
                    min_rtt_us: r.get(8)?,
                    bw_bps: r.get(9)?,
                    loss: r.get(10)?,
                    response_time_us: r.get(11)?,
                    exchanges: r.get(12)?,
                    bytes_up: r.get(13)?,
                    bytes_down: r.get(14)?,
                    complete: r.get(15)?,
                    http: r.get(16)?,
                },
            ))
        })
        .unwrap();
    rows.collect::<rusqlite::Result<_>>().unwrap()
}

fn close(a: Option<f64>, b: Option<f64>, tol: f64) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => (a - b).abs() <= tol,
        _ => false,
    }
}

/// The values an export gives for one connection, checked against the database: its client,
/// `[min_rtt_ms, bw_kbps, loss_down_pct, response_time_ms]` and `[exchange_count, bytes_down]`.
fn check_row(t: &Truth, id: i64, client: &str, units: [Option<f64>; 4], counts: [i64; 2]) {
    let [rtt_ms, bw_kbps, loss_pct, rt_ms] = units;
    let [exchanges, bytes_down] = counts;
    assert_eq!(client, t.client, "connection {id}");
    assert!(
        close(
            rtt_ms.map(|v| v * 1000.0),
            t.min_rtt_us.map(|v| v as f64),
            0.5
        ),
        "connection {id}: min RTT {rtt_ms:?} ms vs {:?} µs",
        t.min_rtt_us
    );
    assert!(
        close(bw_kbps.map(|v| v * 1000.0), t.bw_bps, 50.0),
        "connection {id}: bw {bw_kbps:?} kbit/s vs {:?} bit/s",
        t.bw_bps
    );
    assert!(
        close(loss_pct.map(|v| v / 100.0), t.loss, 5e-6),
        "connection {id}: loss {loss_pct:?} % vs {:?}",
        t.loss
    );
    assert!(
        close(
            rt_ms.map(|v| v * 1000.0),
            t.response_time_us.map(|v| v as f64),
            0.5
        ),
        "connection {id}: response time {rt_ms:?} ms vs {:?} µs",
        t.response_time_us
    );
    assert_eq!(exchanges, t.exchanges, "connection {id}");
    assert_eq!(bytes_down, t.bytes_down, "connection {id}");
}

#[test]
fn export_formats_match_the_database() {
    let dir = tempdir();
    let db = analyzed(dir.path());
    let truth = truth(&db);
    let n = truth.len();
    assert!(n > min_connections(), "{n} connections");
    let c = Connection::open(&db).unwrap();
    let view_cols: Vec<String> = c
        .prepare("SELECT * FROM conn_summary")
        .unwrap()
        .column_names()
        .map(String::from)
        .collect();
    drop(c);
    let export = |format: &str| {
        let o = run_limited(
            &["export", "--format", format, s(&db)],
            Duration::from_secs(60),
        );
        assert!(o.status.success(), "{format}: {}", stderr(&o));
        assert!(stderr(&o).is_empty(), "{format}: {}", stderr(&o));
        stdout(&o)
    };

    // CSV: a header row with the view's columns, every record as wide, one per connection
    let csv_text = export("csv");
    let mut rd = csv::Reader::from_reader(csv_text.as_bytes());
    let header: Vec<String> = rd.headers().unwrap().iter().map(String::from).collect();
    assert_eq!(header, view_cols);
    let col = |name: &str| header.iter().position(|h| h == name).unwrap();
    let num = |rec: &csv::StringRecord, name: &str| -> Option<f64> {
        let f = &rec[col(name)];
        (!f.is_empty()).then(|| f.parse().unwrap_or_else(|e| panic!("{name} {f:?}: {e}")))
    };
    let mut seen = 0;
    for rec in rd.records() {
        let rec = rec.expect("a CSV record");
        assert_eq!(rec.len(), view_cols.len());
        let id: i64 = rec[col("id")].parse().unwrap();
        let t = &truth[&id];
        check_row(
            t,
            id,
            &rec[col("client")],
            [
                num(&rec, "min_rtt_ms"),
                num(&rec, "bw_kbps"),
                num(&rec, "loss_down_pct"),
                num(&rec, "response_time_ms"),
            ],
            [
                rec[col("exchange_count")].parse().unwrap(),
                rec[col("bytes_down")].parse().unwrap(),
            ],
        );
        assert_eq!(rec[col("complete")] == *"1", t.complete);
        seen += 1;
    }
    assert_eq!(seen, n);

    // JSON lines: every line an object with the view's keys
    let json_text = export("json");
    let mut seen = 0;
    for line in json_text.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        let o = v.as_object().expect("an object per line");
        assert_eq!(o.len(), view_cols.len(), "{line}");
        let id = o["id"].as_i64().unwrap();
        let t = &truth[&id];
        let f = |k: &str| o[k].as_f64();
        check_row(
            t,
            id,
            o["client"].as_str().unwrap(),
            [
                f("min_rtt_ms"),
                f("bw_kbps"),
                f("loss_down_pct"),
                f("response_time_ms"),
            ],
            [
                o["exchange_count"].as_i64().unwrap(),
                o["bytes_down"].as_i64().unwrap(),
            ],
        );
        assert!(o["vlan"].is_null() || o["vlan"].is_i64());
        seen += 1;
    }
    assert_eq!(seen, n);
    assert!(
        json_text.contains("\"client\":\"["),
        "an IPv6 client as [address]:port"
    );

    // Zeek conn.log: the header lines, as many fields per row as #fields names
    let zeek = export("zeek");
    let lines: Vec<&str> = zeek.lines().collect();
    assert_eq!(lines[0], "#separator \\x09");
    let header = |key: &str| -> Vec<&str> {
        let l = lines
            .iter()
            .find(|l| l.starts_with(&format!("#{key}\t")))
            .unwrap_or_else(|| panic!("no #{key}"));
        l.split('\t').skip(1).collect()
    };
    assert_eq!(header("path"), ["conn"]);
    assert_eq!(header("unset_field"), ["-"]);
    let fields = header("fields");
    let types = header("types");
    assert_eq!(fields.len(), types.len());
    assert_eq!(
        &fields[..12],
        [
            "ts",
            "uid",
            "id.orig_h",
            "id.orig_p",
            "id.resp_h",
            "id.resp_p",
            "proto",
            "service",
            "duration",
            "orig_bytes",
            "resp_bytes",
            "conn_state"
        ]
    );
    assert_eq!(
        &types[..12],
        [
            "time", "string", "addr", "port", "addr", "port", "enum", "string", "interval",
            "count", "count", "string"
        ]
    );
    assert!(lines.last().unwrap().starts_with("#close\t"));
    let at = |name: &str| fields.iter().position(|f| *f == name).unwrap();
    let mut states: HashMap<String, usize> = HashMap::new();
    let mut seen = 0;
    for l in lines.iter().filter(|l| !l.starts_with('#')) {
        let v: Vec<&str> = l.split('\t').collect();
        assert_eq!(v.len(), fields.len(), "{l}");
        let id: i64 = v[at("uid")].strip_prefix('C').unwrap().parse().unwrap();
        let t = &truth[&id];
        let secs = |us: i64| format!("{}.{:06}", us / 1_000_000, us % 1_000_000);
        assert_eq!(v[at("ts")], secs(t.t_first), "{l}");
        assert_eq!(v[at("duration")], secs(t.t_end - t.t_first), "{l}");
        assert_eq!(v[at("id.resp_h")], t.server_ip);
        assert_eq!(v[at("id.resp_p")], t.server_port.to_string());
        let orig_h = v[at("id.orig_h")];
        assert!(
            t.client.starts_with(orig_h) || t.client.starts_with(&format!("[{orig_h}]")),
            "{l}"
        );
        assert_eq!(v[at("proto")], "tcp");
        assert_eq!(v[at("service")], if t.http { "http" } else { "-" }, "{l}");
        assert_eq!(v[at("orig_bytes")], t.bytes_up.to_string());
        assert_eq!(v[at("resp_bytes")], t.bytes_down.to_string());
        let st = v[at("conn_state")];
        if t.complete {
            // complete: handshake, no holes, and a FIN or RST
            assert!(["SF", "RSTO", "RSTR"].contains(&st), "{l}");
        }
        *states.entry(st.to_string()).or_default() += 1;
        seen += 1;
    }
    assert_eq!(seen, n);
    // the captures hold a refused connection, one without its SYN and unfinished ones
    for st in ["SF", "REJ", "OTH", "S1"] {
        assert!(states.contains_key(st), "no {st}: {states:?}");
    }

    // text: a header line and one block per connection
    let text = export("text");
    assert!(text
        .lines()
        .next()
        .unwrap()
        .starts_with(&format!("{}: {n} connections", db.display())));
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("connection "))
            .count(),
        n
    );
    assert_eq!(text.matches("\n  response time:").count(), n);

    // class_summary: the classes cover every connection once; the median is the middle
    let c = Connection::open(&db).unwrap();
    assert_eq!(
        count(&c, "SELECT sum(connections) FROM class_summary") as usize,
        n
    );
    let mut st = c
        .prepare("SELECT s.response_time_ms FROM conn_summary s JOIN conn_class k USING (id) WHERE k.bw_class = 'unknown' AND k.rtt_class = '50 - 100 ms' AND s.response_time_ms IS NOT NULL ORDER BY 1")
        .unwrap();
    let v: Vec<f64> = st
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert!(v.len() > 100, "{} in the class", v.len());
    let median = if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    };
    let p90 = v[(9 * v.len()).div_ceil(10) - 1];
    let (m, p): (f64, f64) = c
        .query_row("SELECT median_response_time_ms, p90_response_time_ms FROM class_summary WHERE bw_class = 'unknown' AND rtt_class = '50 - 100 ms'", [], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap();
    assert!((m - median).abs() < 0.001, "{m} vs {median}");
    assert!((p - p90).abs() < 0.001, "{p} vs {p90}");
    drop(st);

    // a view redefined (or dropped) by hand does not change what export writes: it reads the
    // contract's own definition
    for (change, what) in [
        (
            "DROP VIEW class_summary; DROP VIEW conn_summary; \
             CREATE VIEW conn_summary AS SELECT id FROM connections WHERE 0;",
            "redefined",
        ),
        ("DROP VIEW conn_summary;", "dropped"),
    ] {
        c.execute_batch(change).unwrap();
        let again = export("csv");
        assert_eq!(again, csv_text, "conn_summary {what}: the export changed");
    }
}

#[test]
fn export_to_a_file_is_atomic_and_errors_name_the_file() {
    let dir = tempdir();
    let db = analyzed(dir.path());
    let out = dir.path().join("conns.csv");
    let o = run(&["export", "--format", "csv", s(&db), "-o", s(&out)]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(o.stdout.is_empty());
    let piped = run(&["export", "--format", "csv", s(&db)]);
    assert_eq!(std::fs::read(&out).unwrap(), piped.stdout);
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| !n.contains(".tmp-")),
        "a temporary file was left: {names:?}"
    );

    // a FIFO (as /dev/null or /dev/stdout would be) is written into, never replaced by a file
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(s(&fifo)).unwrap();
    // SAFETY: mkfifo reads a NUL-terminated path that lives across the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(fifo).unwrap())
    };
    let o = run(&["export", "--format", "csv", s(&db), "-o", s(&fifo)]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(reader.join().unwrap(), piped.stdout);
    {
        use std::os::unix::fs::FileTypeExt;
        assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    }
    std::fs::remove_file(&fifo).unwrap();

    let before = std::fs::read(&db).unwrap();
    let expect = |args: &[&str], what: &str| {
        let o = run(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(e.contains(what), "{args:?}: {e}");
        assert!(!e.contains("panicked"), "{e}");
    };
    // the output may not be the database itself, under any name
    let link = dir.path().join("link.db");
    std::fs::hard_link(&db, &link).unwrap();
    expect(
        &["export", s(&db), "-o", s(&link)],
        "is the database being exported",
    );
    assert_eq!(std::fs::read(&db).unwrap(), before);
    // nor another database or a capture: a text export named like them would destroy them
    let other = dir.path().join("other.db");
    std::fs::copy(&db, &other).unwrap();
    expect(
        &["export", "--format", "csv", s(&db), "-o", s(&other)],
        "other.db: is an SQLite database, not replacing it with an export",
    );
    assert_eq!(std::fs::read(&other).unwrap(), before);
    let cap = dir.path().join("trace.pcap");
    std::fs::copy(&captures()[0], &cap).unwrap();
    let cap_before = std::fs::read(&cap).unwrap();
    expect(
        &["export", "--format", "json", s(&db), "-o", s(&cap)],
        "trace.pcap: is a capture file (pcap, pcapng or gzip), not replacing it",
    );
    assert_eq!(std::fs::read(&cap).unwrap(), cap_before);
    // an output directory that does not exist
    let nowhere = dir.path().join("missing/out.csv");
    expect(&["export", s(&db), "-o", s(&nowhere)], "missing/out.csv");
    // inputs that are not mimic databases
    expect(
        &["export", s(&dir.path().join("absent.db"))],
        "absent.db: no such file",
    );
    let text = dir.path().join("notes.db");
    std::fs::write(&text, "not a database").unwrap();
    expect(&["export", s(&text)], "notes.db: not an SQLite database");
    expect(&["export", "--format", "xml", s(&db)], "xml");
    // text that is not UTF-8 (a database changed by hand) is named in every format, never
    // written with replacement characters; to a file, nothing is left behind
    let damaged = dir.path().join("damaged.db");
    std::fs::copy(&db, &damaged).unwrap();
    let id: i64 = {
        let c = Connection::open(&damaged).unwrap();
        c.execute_batch(
            "UPDATE connections SET client_ip = CAST(x'31302eff2e302e31' AS TEXT) \
             WHERE id = (SELECT max(id) FROM connections)",
        )
        .unwrap();
        c.query_row("SELECT max(id) FROM connections", [], |r| r.get(0))
            .unwrap()
    };
    let written = dir.path().join("damaged.out");
    let in_view = format!("connection {id}: client holds text that is not UTF-8: '10.\\xff.0.1:");
    let in_table =
        format!("row with id = {id}: client_ip holds text that is not UTF-8: '10.\\xff.0.1'");
    for (format, want) in [
        ("csv", &in_view),
        ("json", &in_view),
        ("text", &in_view),
        ("zeek", &in_table),
    ] {
        expect(
            &["export", "--format", format, s(&damaged), "-o", s(&written)],
            want,
        );
        assert!(!written.exists(), "{format}: an output was left");
    }
}

#[test]
fn export_into_a_closed_pipe_ends_quietly() {
    let dir = tempdir();
    let db = analyzed(dir.path());
    for format in ["text", "csv", "json", "zeek"] {
        let mut child = Command::new(mimic_bin())
            .args(["export", "--format", format, s(&db)])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // `| head -1`: read a line, then close the pipe
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        assert!(!first.is_empty());
        let o = child.wait_with_output().unwrap();
        let e = stderr(&o);
        assert!(e.is_empty(), "{format}: {e}");
        // killed by SIGPIPE like any Unix filter, or a clean exit where the whole export fit
        // in the pipe before it closed: never the error status
        use std::os::unix::process::ExitStatusExt;
        assert!(
            o.status.success() || o.status.signal() == Some(13),
            "{format}: {:?}",
            o.status
        );
    }
}

/// A database input that is not a regular file (a FIFO, as a shell's `<(…)` gives) is refused
/// at once by every reader, named: opening a FIFO blocks until something writes into it, and
/// before this check `export`, `compare`, `merge`, `synth check`, `netemu render --from` and
/// `replay` waited for that forever. A directory is refused as one.
#[test]
fn a_database_input_that_is_not_a_regular_file_is_refused_at_once() {
    let dir = tempdir();
    let db = dir.path().join("syn.db");
    let o = run(&["synth", "-q", "--connections", "20", "-o", s(&db)]);
    assert!(o.status.success(), "{}", stderr(&o));
    // an analysis, for compare (a synth workload has no response times)
    let flows = dir.path().join("flows.db");
    let o = run(&["analyze", "-q", "-o", s(&flows), s(&captures()[0])]);
    assert!(o.status.success(), "{}", stderr(&o));
    let fifo = dir.path().join("fifo.db");
    let c = std::ffi::CString::new(s(&fifo)).unwrap();
    // SAFETY: mkfifo reads a NUL-terminated path that lives across the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let out = dir.path().join("out.db");
    let sub = dir.path().join("sub.db");
    std::fs::create_dir(&sub).unwrap();
    for (bad, why) in [
        (&fifo, "not a regular file (a database needs one)"),
        (&sub, "is a directory"),
    ] {
        let runs: [Vec<&str>; 7] = [
            vec!["export", s(bad)],
            vec!["compare", s(&flows), s(bad)],
            vec!["compare", s(bad), s(&flows)],
            vec!["merge", s(bad), s(&db), "-o", s(&out)],
            vec!["synth", "check", s(&db), s(bad)],
            vec!["netemu", "render", "--backend", "netem", "--from", s(bad)],
            vec![
                "netemu",
                "render",
                "--backend",
                "netem",
                "--from",
                s(bad),
                "--batch",
            ],
        ];
        for args in runs {
            let o = run_limited(&args, Duration::from_secs(60));
            assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
            let e = stderr(&o);
            assert!(e.contains(&format!("{}: {why}", s(bad))), "{args:?}: {e}");
            assert!(!e.contains("panicked"), "{e}");
        }
    }
    assert!(!out.exists());
}

/// Log lines into a file or a pipe are plain text: no colour escapes, which a log file or
/// `grep` shows as `^[[33m` (they came through when stderr was not a terminal).
#[test]
fn log_lines_into_a_pipe_have_no_colour_escapes() {
    let dir = tempdir();
    let db = dir.path().join("flows.db");
    let o = run(&["-vv", "analyze", "-o", s(&db), s(&captures()[0])]);
    assert!(o.status.success(), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("DEBUG"), "{e}");
    assert!(!e.contains('\u{1b}'), "{e:?}");
}

/// Starts `mimic ARGS`, waits for its temporary output `tmp_name` (`{pid}` replaced by the
/// child's) to appear in `dir`, then sends `sig` and returns what the process did, and the
/// temporary path.
fn interrupted(args: &[&str], dir: &Path, tmp_name: &str, sig: i32) -> (Output, PathBuf) {
    let mut cmd = mimic();
    sigint_as_at_a_terminal(&mut cmd);
    let child = cmd
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn mimic");
    let tmp = dir.join(tmp_name.replace("{pid}", &child.id().to_string()));
    let start = Instant::now();
    while !tmp.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "{args:?}: no {} appeared",
            tmp.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: kill(2) with the pid of a child this test started and has not waited for.
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
    (child.wait_with_output().expect("wait"), tmp)
}

/// Ctrl-C or SIGTERM during `synth` or `export` removes the unfinished output and keeps the
/// previous one: the signal's default action used to end the process leaving its temporary
/// file (a 3-million-connection synth: 146 MB) hidden beside the output. The exit status is
/// 130, as every command's when interrupted.
#[test]
fn an_interrupted_write_keeps_the_previous_output_and_leaves_no_temporary_file() {
    let dir = tempdir();
    let d = dir.path();
    // interrupted long before its end: 3 million connections take seconds to write
    let big = d.join("big.db");
    let (o, tmp) = interrupted(
        &["synth", "-q", "--connections", "3000000", "-o", s(&big)],
        d,
        ".big.db.tmp-{pid}",
        libc::SIGTERM,
    );
    assert_eq!(o.status.code(), Some(130), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("mimic: synth interrupted; nothing was written"),
        "{}",
        stderr(&o)
    );
    assert!(!tmp.exists() && !big.exists());

    let db = d.join("syn.db");
    let o = run(&["synth", "-q", "--connections", "300000", "-o", s(&db)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let prev = d.join("conns.json");
    std::fs::write(&prev, "previous\n").unwrap();
    let (o, tmp) = interrupted(
        &["export", "--format", "json", s(&db), "-o", s(&prev)],
        d,
        ".conns.json.tmp-{pid}",
        libc::SIGINT,
    );
    // a fast export may have finished before the signal: then it wrote all of it
    if o.status.success() {
        let exported = std::fs::read_to_string(&prev).unwrap();
        assert_eq!(exported.lines().count(), 300_000, "not whole");
    } else {
        assert_eq!(o.status.code(), Some(130), "{}", stderr(&o));
        assert_eq!(std::fs::read_to_string(&prev).unwrap(), "previous\n");
    }
    assert!(!tmp.exists());
    let pq = d.join("pq");
    let (o, _) = interrupted(
        &["export", "--format", "parquet", s(&db), "-o", s(&pq)],
        d,
        "pq",
        libc::SIGTERM,
    );
    if !o.status.success() {
        assert_eq!(o.status.code(), Some(130), "{}", stderr(&o));
        // the directory it created went with its temporary files
        assert!(
            !pq.exists(),
            "{:?}",
            std::fs::read_dir(&pq).map(|r| r.count())
        );
    }
}

/// The zeek format refuses a value its conn.log field cannot hold — a port outside 0-65535, a
/// negative byte count, an address that is none, an end before the start (a database edited
/// or damaged) — naming the connection and column, and writes nothing: Zeek's reader would
/// reject the line (it wrote `-1` as a port). The other formats dump what the database holds.
#[test]
fn zeek_refuses_values_its_fields_cannot_hold() {
    let dir = tempdir();
    let db = dir.path().join("flows.db");
    let o = run(&["analyze", "-q", "-o", s(&db), s(&captures()[0])]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = dir.path().join("conn.log");
    let o = run(&["export", "--format", "zeek", s(&db), "-o", s(&out)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let good = std::fs::read(&out).unwrap();
    let id: i64 = Connection::open(&db)
        .unwrap()
        .query_row("SELECT max(id) FROM connections", [], |r| r.get(0))
        .unwrap();
    for (set, want) in [
        (
            "client_port = -1",
            "client_port holds -1, which Zeek's port (0-65535)",
        ),
        (
            "server_port = 70000",
            "server_port holds 70000, which Zeek's port",
        ),
        (
            "data_bytes_down = -5",
            "data_bytes_down holds -5, which Zeek's count",
        ),
        (
            "client_ip = 'nowhere'",
            "client_ip holds 'nowhere', which Zeek's addr",
        ),
        ("t_end = t_first - 10", "t_end holds"),
    ] {
        let bad = dir.path().join("bad.db");
        std::fs::copy(&db, &bad).unwrap();
        Connection::open(&bad)
            .unwrap()
            .execute(&format!("UPDATE connections SET {set} WHERE id = {id}"), [])
            .unwrap();
        let o = run(&["export", "--format", "zeek", s(&bad), "-o", s(&out)]);
        assert_refused(&o, &format!("bad.db: connection {id}: {want}"));
        assert_eq!(
            std::fs::read(&out).unwrap(),
            good,
            "{set}: the output was replaced"
        );
        let o = run(&["export", "--format", "csv", s(&bad)]);
        assert!(o.status.success(), "{set}: {}", stderr(&o));
    }
}
