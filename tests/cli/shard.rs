//! `mimic analyze --shard K/N` and `mimic merge`: the merged shards are the unsharded run,
//! row by row, on every well-formed public capture; bad merges are refused with the reason.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;

use rusqlite::Connection;

use crate::analyze::{analyze, db};
use crate::common::flowdb::{assert_merged_equals_unsharded, meta};
use crate::common::*;

fn merge(inputs: &[PathBuf], out: &Path) -> Output {
    let mut cmd = mimic();
    cmd.arg("merge").args(inputs).arg("-o").arg(out);
    crate::analyze::run_with_timeout(cmd, std::time::Duration::from_secs(60), "merge")
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

/// Analyzes `f` unsharded and in `n` shards, merges the shards; returns (unsharded, merged,
/// shard files).
fn shard_and_merge(f: &Path, dir: &Path, n: u32) -> (PathBuf, PathBuf, Vec<PathBuf>) {
    let full = dir.join("full.db");
    ok(&analyze(f, &full, &[]), &f.display().to_string());
    let shards: Vec<PathBuf> = (1..=n)
        .map(|k| {
            let p = dir.join(format!("shard{k}.db"));
            let o = analyze(f, &p, &["--shard", &format!("{k}/{n}")]);
            ok(&o, &format!("{} shard {k}/{n}", f.display()));
            p
        })
        .collect();
    let merged = dir.join("merged.db");
    // given out of order: the merge sorts them
    let mut given = shards.clone();
    given.reverse();
    ok(
        &merge(&given, &merged),
        &format!("merge of {}", f.display()),
    );
    (full, merged, shards)
}

/// The proof: on every well-formed public capture (the generated stand-ins without
/// the corpus), 4 shards merged equal the unsharded run in every table, row by row and column
/// by column, and in every meta row but the ones named in META_DIFFERS.
#[test]
fn merged_shards_equal_the_unsharded_run_on_every_public_capture() {
    let tmp = tempdir();
    let (mut files, mut conns, mut rows) = (0, 0usize, 0usize);
    let mut sharded_ids = 0;
    for dir in ["web", "loss", "encap", "format", "edge"] {
        for f in traces_in(dir) {
            let d = tmp.path().join(files.to_string());
            std::fs::create_dir(&d).unwrap();
            let (full, merged, shards) = shard_and_merge(&f, &d, 4);
            let (a, b) = (db(&full), db(&merged));
            let ta = assert_merged_equals_unsharded(&a, &b, &f.display().to_string());
            rows += ta.values().map(Vec::len).sum::<usize>();
            conns += ta["connections"].len();
            // every connection has its Community ID
            let missing: i64 = b
                .query_row(
                    "SELECT count(*) FROM connections WHERE community_id IS NULL OR community_id NOT LIKE '1:%'",
                    [],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(missing, 0, "{}", f.display());
            let (ma, mb) = (meta(&a), meta(&b));
            let peak = |m: &BTreeMap<String, String>| m["peak_connections"].parse::<u64>().unwrap();
            assert!(peak(&mb) >= peak(&ma), "{}", f.display());
            assert_eq!(mb["shards"], "4");
            assert!(mb["merged_from"].contains("shard1.db"));
            // each shard holds its own connections only (the hash splits the capture)
            let per: Vec<i64> = shards
                .iter()
                .map(|s| {
                    db(s)
                        .query_row("SELECT count(*) FROM connections", [], |r| r.get(0))
                        .unwrap()
                })
                .collect();
            if ta["connections"].len() >= 8 {
                sharded_ids += (per.iter().filter(|&&n| n > 0).count() >= 2) as usize;
            }
            files += 1;
        }
    }
    let want = if corpus_present() { 85 } else { 30 };
    assert!(files >= want, "only {files} captures found");
    assert!(sharded_ids >= 5, "the shards did not split the captures");
    eprintln!(
        "shard-and-merge equals the unsharded run: {files} captures, {conns} connections, {rows} rows"
    );
}

/// What `mimic merge` refuses, and that it says why (exit 2, nothing written).
#[test]
fn merge_refuses_what_is_not_the_shards_of_one_run() {
    let tmp = tempdir();
    let d = tmp.path();
    let f = trace("web/tcptrace_http.dmp.pcap");
    let g = trace("web/zeek_echo-connections.pcap");
    let (full, _, shards) = shard_and_merge(&f, d, 3);
    let other = d.join("other");
    std::fs::create_dir(&other).unwrap();
    let other_shard = other.join("o1.db");
    ok(
        &analyze(&g, &other_shard, &["--shard", "1/3"]),
        "other input",
    );
    let by4 = d.join("by4.db");
    ok(&analyze(&f, &by4, &["--shard", "2/4"]), "2/4");
    let port = d.join("port.db");
    ok(
        &analyze(&f, &port, &["--shard", "1/3", "--server-port", "8080"]),
        "settings",
    );
    let out = d.join("out.db");
    let cases: Vec<(Vec<PathBuf>, &str)> = vec![
        (
            vec![shards[0].clone(), shards[1].clone()],
            "shard 3 of 3 missing",
        ),
        (
            vec![shards[0].clone(), shards[0].clone(), shards[1].clone()],
            "are both shard 1/3",
        ),
        (
            vec![shards[0].clone(), shards[1].clone(), by4.clone()],
            "shards of different counts overlap",
        ),
        (
            vec![full.clone(), shards[1].clone(), shards[2].clone()],
            "not a shard",
        ),
        (
            vec![other_shard.clone(), shards[1].clone(), shards[2].clone()],
            "different inputs",
        ),
        (
            vec![port.clone(), shards[1].clone(), shards[2].clone()],
            "different settings: meta `server_ports`",
        ),
    ];
    for (inputs, want) in cases {
        let o = merge(&inputs, &out);
        assert_eq!(o.status.code(), Some(2), "{want}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "want {want:?}: {}", stderr(&o));
        assert!(!out.exists(), "{want}: an output was written");
        assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
    }
    // the output is an input
    let o = merge(&shards, &shards[0]);
    assert_refused(&o, "would overwrite an input");
    // a shard with a column this build does not have: a different schema
    let odd = d.join("odd.db");
    std::fs::copy(&shards[2], &odd).unwrap();
    Connection::open(&odd)
        .unwrap()
        .execute_batch("ALTER TABLE exchanges ADD COLUMN extra INTEGER")
        .unwrap();
    let o = merge(&[shards[0].clone(), shards[1].clone(), odd], &out);
    assert_refused(&o, "a different schema");
    assert_refused(&o, "exchanges");
    // a count in meta that is not one (changed by hand, or damaged): named, not summed as 0
    for (key, value) in [("connections", "-5"), ("tcp_segments", "many")] {
        let bad = d.join(format!("bad-{key}.db"));
        std::fs::copy(&shards[2], &bad).unwrap();
        Connection::open(&bad)
            .unwrap()
            .execute("UPDATE meta SET value = ?1 WHERE key = ?2", [value, key])
            .unwrap();
        let o = merge(&[shards[0].clone(), shards[1].clone(), bad.clone()], &out);
        assert_eq!(o.status.code(), Some(2), "{key}: {}", stderr(&o));
        let want = format!(
            "bad-{key}.db: meta `{key}` is \"{value}\", which this mimic does not read (not a count"
        );
        assert!(stderr(&o).contains(&want), "{}", stderr(&o));
        assert!(!out.exists());
    }
    // shards named relative to the working directory, one starting with `file:` (which SQLite
    // would take for a URI): merged like any other name
    let rel = d.join("rel");
    std::fs::create_dir(&rel).unwrap();
    for (k, s) in shards.iter().enumerate() {
        let name = if k == 1 {
            "file:s2.db".to_string()
        } else {
            format!("s{}.db", k + 1)
        };
        std::fs::copy(s, rel.join(name)).unwrap();
    }
    let mut cmd = mimic();
    cmd.current_dir(&rel)
        .args(["merge", "s1.db", "file:s2.db", "s3.db", "-o", "file:m.db"]);
    let o = crate::analyze::run_with_timeout(cmd, std::time::Duration::from_secs(60), "merge");
    ok(&o, "relative shard names");
    assert!(rel.join("file:m.db").exists());
    let mut cmd = mimic();
    cmd.current_dir(&rel)
        .args(["export", "--format", "csv", "file:m.db"]);
    let o = crate::analyze::run_with_timeout(cmd, std::time::Duration::from_secs(60), "export");
    ok(&o, "export of file:m.db");
    assert!(stdout(&o).lines().count() > 1, "{}", stdout(&o));
    // a bad --shard is refused before anything is read
    for bad in ["0/4", "5/4", "1/0", "x"] {
        let o = analyze(&f, &d.join("bad.db"), &["--shard", bad]);
        assert_eq!(o.status.code(), Some(2), "{bad}");
        assert!(stderr(&o).contains("shard"), "{bad}: {}", stderr(&o));
        assert!(!d.join("bad.db").exists());
    }
}

/// A shard says which it is, how it was drawn, and what it passed over; the shards' segment
/// counts add up to the unsharded run's.
#[test]
fn a_shard_database_says_which_shard_it_is() {
    let tmp = tempdir();
    let f = trace("web/tcptrace_http.dmp.pcap");
    let (full, merged, shards) = shard_and_merge(&f, tmp.path(), 2);
    let total: u64 = meta(&db(&full))["tcp_segments"].parse().unwrap();
    let mut sum = 0;
    for (k, s) in shards.iter().enumerate() {
        let m = meta(&db(s));
        assert_eq!(m["shard"], format!("{}/2", k + 1));
        assert!(m["shard_hash"].starts_with("community_id_v1 seed 0"));
        let mine: u64 = m["tcp_segments"].parse().unwrap();
        let other: u64 = m["other_shard_segments"].parse().unwrap();
        assert_eq!(mine + other, total);
        sum += mine;
    }
    assert_eq!(sum, total);
    let m = meta(&db(&merged));
    assert!(!m.contains_key("shard") && !m.contains_key("other_shard_segments"));
    assert!(m["command"].contains("merge"));
}
