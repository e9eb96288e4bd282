//! Reading flows.db in tests: every table's rows as text, the meta rows, and the proof that a
//! merged sharded analysis equals the unsharded run, row by row (tests/cli/shard.rs for
//! `mimic merge`, tests/lab/shard_ssh.rs for docker/shard-run.sh over ssh).

use std::collections::BTreeMap;
use std::path::Path;

use rusqlite::{Connection, OpenFlags};

/// meta rows that legitimately differ between the merged shards and the unsharded run: the
/// command line, the merge's own rows, and the peak of connections tracked at once (the sum
/// of the shards' peaks, which need not fall at the same moment: an upper bound).
pub const META_DIFFERS: &[&str] = &["command", "shards", "merged_from", "peak_connections"];

/// Opens a database read-only, or fails naming it.
pub fn open(p: &Path) -> Connection {
    Connection::open_with_flags(p, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Every table but `meta`, each row as text, sorted over all its columns.
pub fn tables(c: &Connection) -> BTreeMap<String, Vec<String>> {
    let names: Vec<String> = {
        let mut st = c
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name != 'meta'")
            .unwrap();
        let n = st.query_map([], |r| r.get(0)).unwrap();
        n.collect::<rusqlite::Result<_>>().unwrap()
    };
    names
        .into_iter()
        .map(|t| {
            let st = c.prepare(&format!("SELECT * FROM \"{t}\"")).unwrap();
            let n = st.column_count();
            let order = (1..=n)
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(", ");
            let mut st = c
                .prepare(&format!("SELECT * FROM \"{t}\" ORDER BY {order}"))
                .unwrap();
            let rows = st
                .query_map([], |r| {
                    (0..n)
                        .map(|i| r.get_ref(i).map(|v| format!("{v:?}")))
                        .collect::<rusqlite::Result<Vec<_>>>()
                        .map(|v| v.join("|"))
                })
                .unwrap()
                .collect::<rusqlite::Result<Vec<_>>>()
                .unwrap();
            (t, rows)
        })
        .collect()
}

pub fn meta(c: &Connection) -> BTreeMap<String, String> {
    let mut st = c
        .prepare("SELECT key, coalesce(value, '') FROM meta")
        .unwrap();
    let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap();
    rows.collect::<rusqlite::Result<_>>().unwrap()
}

/// Asserts that `merged` (shards put together) equals `full` (the unsharded run of the same
/// input): the same tables, every row of every table column by column, and every meta row
/// but those in [`META_DIFFERS`]. Returns the tables of `full` (for counts).
pub fn assert_merged_equals_unsharded(
    full: &Connection,
    merged: &Connection,
    what: &str,
) -> BTreeMap<String, Vec<String>> {
    let (ta, tb) = (tables(full), tables(merged));
    assert_eq!(
        ta.keys().collect::<Vec<_>>(),
        tb.keys().collect::<Vec<_>>(),
        "{what}: tables"
    );
    for (t, ra) in &ta {
        let rb = &tb[t];
        assert_eq!(ra.len(), rb.len(), "{what}: {t} rows");
        for (x, y) in ra.iter().zip(rb) {
            assert_eq!(x, y, "{what}: table {t} differs");
        }
    }
    let (ma, mb) = (meta(full), meta(merged));
    for k in ma.keys().chain(mb.keys()) {
        if META_DIFFERS.contains(&k.as_str()) {
            continue;
        }
        assert_eq!(ma.get(k), mb.get(k), "{what}: meta {k}");
    }
    ta
}
