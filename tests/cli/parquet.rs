//! `mimic analyze --format parquet` and `mimic export --format parquet`: a public capture set
//! analyzed in 4 shards into one Parquet directory is read back by DuckDB and by PySpark (the
//! engines people run, from PyPI, in the venv `scripts/deps.sh test` makes) as one table per
//! name, and their counts, a per-class aggregate and a join equal the SQLite figures of the
//! unsharded run; DuckDB's rows equal SQLite's, row by row and column by column.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::analyze::{db, run_with_timeout};
use crate::common::*;

/// The Python with DuckDB and PySpark: `$MIMIC_PYENV/bin/python`, by default the venv
/// `scripts/deps.sh test` creates. Missing: the test fails naming it.
fn python() -> PathBuf {
    let env = std::env::var_os("MIMIC_PYENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/mimic/pyenv"));
    let py = env.join("bin/python");
    assert!(
        py.is_file(),
        "{} is missing: the Python venv with duckdb and pyspark (scripts/deps.sh test creates it; or set MIMIC_PYENV)",
        py.display()
    );
    py
}

/// Waits for `child` up to `limit`; past it, kills it and gives None.
fn wait_or_kill(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().expect("wait") {
            return Some(s);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn ok(o: &Output, what: &str) {
    assert!(
        o.status.success(),
        "{what}: exit {:?}\n{}{}",
        o.status,
        stdout(o),
        stderr(o)
    );
}

fn analyze_set(files: &[PathBuf], out: &Path, extra: &[&str]) -> Output {
    let mut cmd = mimic();
    cmd.arg("analyze")
        .args(files)
        .arg("-o")
        .arg(out)
        .arg("-q")
        .args(extra);
    run_with_timeout(cmd, Duration::from_secs(120), "analyze")
}

/// Every row of a table of the SQLite database, each a list of JSON values in column order.
fn sqlite_rows(c: &rusqlite::Connection, table: &str) -> Vec<Vec<Value>> {
    let mut st = c.prepare(&format!("SELECT * FROM {table}")).unwrap();
    let n = st.column_count();
    let rows = st
        .query_map([], |r| {
            (0..n)
                .map(|i| {
                    Ok(match r.get_ref(i)? {
                        rusqlite::types::ValueRef::Null => Value::Null,
                        rusqlite::types::ValueRef::Integer(v) => Value::from(v),
                        rusqlite::types::ValueRef::Real(v) => Value::from(v),
                        rusqlite::types::ValueRef::Text(v) => {
                            Value::from(String::from_utf8_lossy(v).into_owned())
                        }
                        rusqlite::types::ValueRef::Blob(_) => panic!("a blob in {table}"),
                    })
                })
                .collect::<rusqlite::Result<Vec<_>>>()
        })
        .unwrap();
    rows.collect::<rusqlite::Result<_>>().unwrap()
}

/// Rows equal value by value; floats to the last bit but one (serde_json's default float
/// parsing may round the script's shortest decimal to the neighbouring double).
fn same_row(a: &[Value], b: &[Value]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| match (x, y) {
            (Value::Number(p), Value::Number(q)) if p.is_f64() || q.is_f64() => {
                let (p, q) = (p.as_f64().unwrap(), q.as_f64().unwrap());
                (p - q).abs() <= 2.0 * f64::EPSILON * p.abs().max(q.abs())
            }
            _ => x == y,
        })
}

fn sorted(mut rows: Vec<Vec<Value>>) -> Vec<Vec<Value>> {
    rows.sort_by_cached_key(|r| serde_json::to_string(r).unwrap());
    rows
}

/// The per-class aggregate rows: class and sums exactly, the median to 1e-9.
fn assert_classes(want: &Value, got: &Value, engine: &str) {
    let (w, g) = (want.as_array().unwrap(), got.as_array().unwrap());
    assert_eq!(w.len(), g.len(), "{engine}: classes {g:?}, SQLite {w:?}");
    for (a, b) in w.iter().zip(g) {
        let (a, b) = (a.as_array().unwrap(), b.as_array().unwrap());
        assert_eq!(a[..5], b[..5], "{engine}: class row {b:?}, SQLite {a:?}");
        match (a[5].as_f64(), b[5].as_f64()) {
            (None, None) => {}
            (Some(x), Some(y)) => assert!(
                (x - y).abs() <= 1e-9 * x.abs().max(1.0),
                "{engine}: median {y} of class {}, SQLite {x}",
                a[0]
            ),
            (x, y) => panic!("{engine}: median {y:?} of class {}, SQLite {x:?}", a[0]),
        }
    }
}

/// The check (CI): the `web/` capture set in 4 shards, written with `--format parquet`
/// into one directory, read by DuckDB (`read_parquet(..., hive_partitioning = true)`) and by
/// PySpark in local mode (`spark.read.parquet('DIR/table=connections')`): rows per table, the
/// shard partitions, connections / bytes / exchanges / median response time per RTT class and a
/// join of exchanges to connections equal what SQLite says of the unsharded flows.db; DuckDB's
/// rows of every table equal SQLite's; and `mimic export --format parquet flows.db` gives the
/// same rows.
#[test]
fn duckdb_and_spark_read_a_4_shard_parquet_directory_as_the_sqlite_run() {
    let py = python();
    require_tool("java");
    let tmp = tempdir();
    let files = traces_in("web");
    let full = tmp.path().join("flows.db");
    ok(&analyze_set(&files, &full, &[]), "unsharded analysis");
    let ds = tmp.path().join("dataset");
    for k in 1..=4 {
        let shard = format!("{k}/4");
        ok(
            &analyze_set(&files, &ds, &["--format", "parquet", "--shard", &shard]),
            &format!("shard {shard} to Parquet"),
        );
    }
    for t in ["connections", "exchanges", "meta", "bw_samples"] {
        for k in 1..=4 {
            let p = ds.join(format!("table={t}/shard={k}/part-0.parquet"));
            assert!(p.is_file(), "{} missing", p.display());
        }
    }
    // nothing else in the directory (no temporary files left)
    let top: Vec<String> = std::fs::read_dir(&ds)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(top.iter().all(|n| n.starts_with("table=")), "{top:?}");
    let exported = tmp.path().join("exported");
    let mut cmd = mimic();
    cmd.args(["export", "--format", "parquet"])
        .arg(&full)
        .arg("-o")
        .arg(&exported);
    ok(
        &run_with_timeout(cmd, Duration::from_secs(60), "export"),
        "export",
    );

    // the figures (megabytes of rows) and Spark's log go to files: a pipe would fill and stop
    // the script
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cli/parquet_engines.py");
    let (json, log) = (
        tmp.path().join("figures.json"),
        tmp.path().join("engines.log"),
    );
    let mut child = Command::new(&py)
        .arg(&script)
        .arg(&ds)
        .arg(&full)
        .arg(&exported)
        .arg(&json)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start parquet_engines.py");
    let status = wait_or_kill(&mut child, Duration::from_secs(600));
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    let tail = &log_text[log_text.len().saturating_sub(3000)..];
    assert!(
        status.is_some_and(|s| s.success()),
        "parquet_engines.py (DuckDB and PySpark): {status:?}\n{tail}"
    );
    let figures: Value = serde_json::from_slice(&std::fs::read(&json).unwrap())
        .unwrap_or_else(|e| panic!("parquet_engines.py output: {e}\n{tail}"));

    let sql = &figures["sqlite"];
    let c = db(&full);
    let conns: i64 = c
        .query_row("SELECT count(*) FROM connections", [], |r| r.get(0))
        .unwrap();
    assert!(conns > 100, "the capture set gave only {conns} connections");
    assert_eq!(sql["counts"]["connections"], conns);
    for engine in ["duckdb", "spark"] {
        let f = &figures[engine];
        assert!(
            f.get("error").is_none(),
            "{engine}: {} (scripts/deps.sh test installs it into the venv)",
            f["error"]
        );
        assert_eq!(f["counts"], sql["counts"], "{engine}: rows per table");
        assert_eq!(f["shards"], serde_json::json!([1, 2, 3, 4]), "{engine}");
        assert_classes(&sql["classes"], &f["classes"], engine);
        assert_eq!(f["join"], sql["join"], "{engine}: exchanges joined");
        let types = &f["types"];
        let want = if engine == "duckdb" {
            [
                ("id", "BIGINT"),
                ("bw_bps", "DOUBLE"),
                ("client_ip", "VARCHAR"),
            ]
        } else {
            [
                ("id", "bigint"),
                ("bw_bps", "double"),
                ("client_ip", "string"),
            ]
        };
        for (col, ty) in want {
            assert_eq!(types[col], ty, "{engine}: type of connections.{col}");
        }
    }
    let duck = &figures["duckdb"];
    // each shard's meta says which shard it is
    let shard_meta: BTreeMap<String, Value> =
        serde_json::from_value(duck["meta_shard"].clone()).unwrap();
    assert_eq!(
        shard_meta.values().cloned().collect::<Vec<_>>(),
        ["1/4", "2/4", "3/4", "4/4"]
    );
    let mut compared = 0;
    for (set, label) in [("rows", "4 shards"), ("exported_rows", "export")] {
        let rows = duck[set].as_object().expect("rows per table");
        for (table, got) in rows {
            let got: Vec<Vec<Value>> = serde_json::from_value(got.clone()).unwrap();
            let want = sqlite_rows(&c, table);
            assert_eq!(
                got.len(),
                want.len(),
                "{label}: rows of {table} in Parquet and SQLite"
            );
            let (got, want) = (sorted(got), sorted(want));
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    same_row(g, w),
                    "{label}: a row of {table}, Parquet {g:?} vs SQLite {w:?}"
                );
            }
            compared += got.len();
        }
    }
    assert!(compared > 1000, "only {compared} rows compared");
    eprintln!(
        "parquet: {conns} connections, {compared} rows compared with SQLite; DuckDB and Spark agree on {} classes",
        sql["classes"].as_array().unwrap().len()
    );
}

/// Bad uses are refused with a message naming what is wrong: Parquet output onto a file, a
/// directory holding another run's shard, export without a directory.
#[test]
fn parquet_output_refuses_what_it_cannot_write() {
    let tmp = tempdir();
    let f = trace("web/tcptrace_http.dmp.pcap");
    let file = tmp.path().join("plain");
    std::fs::write(&file, b"x").unwrap();
    let o = analyze_set(std::slice::from_ref(&f), &file, &["--format", "parquet"]);
    assert_refused(&o, "not a directory");

    let ds = tmp.path().join("ds");
    ok(
        &analyze_set(
            std::slice::from_ref(&f),
            &ds,
            &["--format", "parquet", "--shard", "3/3"],
        ),
        "shard 3/3",
    );
    let o = analyze_set(std::slice::from_ref(&f), &ds, &["--format", "parquet"]);
    assert_refused(&o, "shard=3");
    // another shard of the same count, but of another input or with other settings: as
    // `mimic merge` refuses such shards, the dataset refuses them, naming the difference, and
    // keeps only what it held
    let other = trace("web/zeek_http_bro.org.pcap");
    for (input, extra, why) in [
        (&other, &[][..], "different inputs: meta `frames`"),
        (
            &f,
            &["--idle-timeout", "5"][..],
            "different settings: meta `idle_timeout_s`",
        ),
    ] {
        let args = [&["--format", "parquet", "--shard", "1/3"][..], extra].concat();
        let o = analyze_set(std::slice::from_ref(input), &ds, &args);
        assert_refused(&o, "holds shard=3 of another run");
        assert!(stderr(&o).contains(why), "{}", stderr(&o));
        assert!(!ds.join("table=meta/shard=1").exists());
    }
    // exporting a shard database into it likewise
    let db = tmp.path().join("s1.db");
    ok(
        &analyze_set(std::slice::from_ref(&other), &db, &["--shard", "1/3"]),
        "sqlite shard",
    );
    let o = run(&[
        "export",
        "--format",
        "parquet",
        db.to_str().unwrap(),
        "-o",
        ds.to_str().unwrap(),
    ]);
    assert_refused(&o, "different inputs");
    // the same run's other shard joins it
    ok(
        &analyze_set(
            std::slice::from_ref(&f),
            &ds,
            &["--format", "parquet", "--shard", "1/3"],
        ),
        "shard 1/3",
    );

    let full = tmp.path().join("flows.db");
    ok(&analyze_set(std::slice::from_ref(&f), &full, &[]), "sqlite");
    let o = run(&["export", "--format", "parquet", full.to_str().unwrap()]);
    assert_refused(&o, "-o DIR");
}

/// The bytes of every table's part of shard `shard` of a Parquet dataset, by table name.
fn parts(ds: &Path, shard: u32) -> BTreeMap<String, Option<Vec<u8>>> {
    let mut m = BTreeMap::new();
    for e in std::fs::read_dir(ds).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        if let Some(t) = name.strip_prefix("table=") {
            let p = ds.join(&name).join(format!("shard={shard}/part-0.parquet"));
            m.insert(t.to_string(), std::fs::read(p).ok());
        }
    }
    m
}

/// A run killed while it renames its parts into place (after every file was complete) leaves
/// a shard with some tables of its own and some of the run before; the next run on the
/// directory completes that commit first, so the shard is the killed run's whole.
#[test]
fn a_commit_killed_halfway_is_completed_by_the_next_run() {
    let tmp = tempdir();
    let a = trace("web/tcptrace_http.dmp.pcap");
    let b = trace("web/zeek_http_bro.org.pcap");
    let ds = tmp.path().join("ds");
    // shards 1 and 2 of two-shard runs: a dataset holds the shards of runs of one count
    let half = ["--format", "parquet", "--shard", "1/2"];
    ok(&analyze_set(std::slice::from_ref(&a), &ds, &half), "run A");
    let before = parts(&ds, 1);
    let clean = tmp.path().join("clean");
    ok(
        &analyze_set(std::slice::from_ref(&b), &clean, &half),
        "run B",
    );
    let want = parts(&clean, 1);
    assert!(want.len() >= 5, "{:?}", want.keys());
    // the same rows give the same bytes: the tables whose rows differ tell the runs apart
    let differ: Vec<&String> = want
        .keys()
        .filter(|t| *t != "meta" && want[*t] != before[*t])
        .collect();
    assert!(
        differ.len() >= 3,
        "A and B differ in too few tables: {differ:?}"
    );

    // B again into A's directory, killed once two tables are in place
    let mut cmd = mimic();
    cmd.arg("analyze")
        .arg(&b)
        .arg("-o")
        .arg(&ds)
        .arg("-q")
        .args(half)
        .env("MIMIC_FAULT_ABORT_COMMIT_AFTER", "2");
    let o = run_with_timeout(cmd, Duration::from_secs(120), "killed run");
    assert!(
        !o.status.success(),
        "the run was to be aborted: {}",
        stderr(&o)
    );
    let mixed = parts(&ds, 1);
    let of_b = |m: &BTreeMap<String, Option<Vec<u8>>>| {
        differ.iter().filter(|t| m[**t] == want[**t]).count()
    };
    assert!(
        of_b(&mixed) < differ.len(),
        "the run was killed before all its tables were in place"
    );
    assert!(
        std::fs::read_dir(&ds)
            .unwrap()
            .any(|e| e.unwrap().path().join("COMMITTING").exists()),
        "the killed run left its mark"
    );

    // the next run on the directory (B's other shard: it leaves shard 1 alone) completes it
    let mut cmd = mimic();
    cmd.arg("analyze")
        .arg(&b)
        .arg("-o")
        .arg(&ds)
        .args(["--format", "parquet", "--shard", "2/2"]);
    let o = run_with_timeout(cmd, Duration::from_secs(120), "next run");
    ok(&o, "next run");
    assert!(
        stderr(&o).contains("completing the commit of shard 1 that a killed run began"),
        "{}",
        stderr(&o)
    );
    let after = parts(&ds, 1);
    assert_eq!(
        of_b(&after),
        differ.len(),
        "every table of shard 1 is the killed run's"
    );
    assert!(after["meta"].is_some());
    let left: Vec<String> = std::fs::read_dir(&ds)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(left.is_empty(), "temporary directories left: {left:?}");
}
