//! `mimic merge`: the databases of the N shards of one analysis (`mimic analyze --shard K/N`)
//! joined into the database one unsharded run writes.
//!
//! A connection's id is the number of its first frame in the whole input, which every shard
//! counts alike (a shard reads every frame and analyzes only its own connections), so the
//! shards' ids are disjoint and already the unsharded run's: rows are copied as they are,
//! nothing is renumbered. Every table the schema has (but `meta`) is copied with every column.
//!
//! `meta` of the merged database: the rows every shard has alike (inputs, frame counts,
//! settings) once; the per-connection counters summed ([`SUMMED`]); `shards` (N) and
//! `merged_from` (the shard files) added; each shard's `shard`, `shard_hash`,
//! `other_shard_segments` and `command` dropped (`command` is the merge's own).
//!
//! Refused, with the file and the reason: a database that is not a shard, shards of different
//! counts or hash rules, the same shard twice, a missing shard, shards of different inputs or
//! settings (any other meta row that differs), different columns (schema), and a connection id
//! in two shards.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use mimic_core::community_id::Shard;
use mimic_core::db::{index_statements, open_existing, set_meta, AtomicDb, DbError};
use rusqlite::{Connection, OptionalExtension};
use serde::Serialize;

use crate::driver::SHARD_HASH;

#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error("nothing to merge: no shard databases given")]
    NoInputs,
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(
        "{0}: not a shard (no meta `shard`: it was not written by `mimic analyze --shard K/N`)"
    )]
    NotAShard(PathBuf),
    #[error("{path}: meta `{key}` is {value:?}, which this mimic does not read ({why})")]
    BadMeta {
        path: PathBuf,
        key: String,
        value: String,
        why: String,
    },
    #[error("{a} and {b} are both shard {shard}: each shard once")]
    DuplicateShard {
        a: PathBuf,
        b: PathBuf,
        shard: Shard,
    },
    #[error("{a} is shard {sa} but {b} is shard {sb}: shards of different counts overlap; merge the N shards of one run")]
    ShardCount {
        a: PathBuf,
        sa: Shard,
        b: PathBuf,
        sb: Shard,
    },
    #[error("shard{} {} of {n} missing: merging needs all {n} shards of the run", if .missing.len() > 1 { "s" } else { "" }, .missing.iter().map(|k| k.to_string()).collect::<Vec<_>>().join(", "))]
    Missing { missing: Vec<u32>, n: u32 },
    /// `detail`: which meta row, and its value in each.
    #[error("{a} and {b} are shards of {what}: {detail}")]
    Mismatch {
        a: PathBuf,
        b: PathBuf,
        what: &'static str,
        detail: String,
    },
    #[error("{path}: a different schema from this mimic's: table `{table}` {detail}")]
    Schema {
        path: PathBuf,
        table: String,
        detail: String,
    },
    #[error("{path}: connection id {id} is in another shard too: the shards overlap")]
    Overlap { path: PathBuf, id: i64 },
}

/// meta rows summed over the shards: counts of connections and of what happened to them.
/// (`peak_connections` summed is an upper bound of the unsharded run's peak: the shards'
/// peaks need not fall at the same moment.)
pub const SUMMED: &[&str] = &[
    "connections",
    "complete",
    "exchanges",
    "duplicate_frames",
    "port_reuse",
    "evicted",
    "peak_connections",
    "tcp_segments",
];
/// Prefixes of meta rows summed over the shards.
pub const SUMMED_PREFIXES: &[&str] = &["pruned.", "limit_drops."];
/// meta rows of a shard that the merged database does not carry.
pub const PER_SHARD: &[&str] = &["shard", "shard_hash", "other_shard_segments", "command"];
/// meta rows the output database writes for itself.
const OWN: &[&str] = &["schema_version", "schema_migration", "tool", "tool_version"];
/// meta rows that say what was read: a difference means different inputs (others, different
/// settings).
const INPUT_KEYS: &[&str] = &[
    "inputs",
    "frames",
    "input_issues",
    "filter_rejected",
    "time_backwards",
    "max_time_backwards_s",
    "ts_invalid_fraction",
    "ts_missing",
    "capture_dropped",
];

fn mismatch(key: &str, va: &str, vb: &str) -> String {
    format!("meta `{key}` is {va} in one and {vb} in the other")
}

fn summed(key: &str) -> bool {
    SUMMED.contains(&key) || SUMMED_PREFIXES.iter().any(|p| key.starts_with(p))
}

pub struct MergeOptions {
    /// The shard databases, in any order.
    pub inputs: Vec<PathBuf>,
    pub output: PathBuf,
    /// Extra `meta` rows (e.g. the command line).
    pub meta: Vec<(String, String)>,
}

#[derive(Debug, Clone, Serialize)]
pub struct MergeSummary {
    pub output: String,
    pub shards: u32,
    pub inputs: Vec<String>,
    /// Rows copied, by table.
    pub rows: BTreeMap<String, u64>,
    pub elapsed_s: f64,
}

struct ShardDb {
    path: PathBuf,
    shard: Shard,
    meta: BTreeMap<String, String>,
}

/// Every `meta` row of the database `c` (at `path`), key to value (NULL read as "", as a
/// Parquet dataset's meta reads it).
pub(crate) fn read_meta(c: &Connection, path: &Path) -> Result<BTreeMap<String, String>, DbError> {
    let sq = |source| DbError::Sqlite {
        path: path.to_path_buf(),
        source,
    };
    let mut st = c
        .prepare("SELECT key, coalesce(value, '') FROM meta")
        .map_err(sq)?;
    let rows = st
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
        .map_err(sq)?;
    rows.collect::<rusqlite::Result<_>>().map_err(sq)
}

fn open_shard(path: &Path) -> Result<ShardDb, MergeError> {
    let c = open_existing(path)?;
    let meta = read_meta(&c, path)?;
    let Some(value) = meta.get("shard") else {
        return Err(MergeError::NotAShard(path.to_path_buf()));
    };
    let shard: Shard = value.parse().map_err(|why| MergeError::BadMeta {
        path: path.to_path_buf(),
        key: "shard".into(),
        value: value.clone(),
        why,
    })?;
    let hash = meta.get("shard_hash").cloned().unwrap_or_default();
    if hash != SHARD_HASH {
        return Err(MergeError::BadMeta {
            path: path.to_path_buf(),
            key: "shard_hash".into(),
            value: hash,
            why: format!("its shards are drawn by \"{SHARD_HASH}\""),
        });
    }
    // the rows summed over the shards, and the segments each passed over, are counts: one
    // that is not (a database changed by hand, or damaged) would be summed as 0, or make
    // the shards look like analyses of different inputs
    for (k, v) in &meta {
        if (summed(k) || k == "other_shard_segments") && v.parse::<u64>().is_err() {
            return Err(MergeError::BadMeta {
                path: path.to_path_buf(),
                key: k.clone(),
                value: v.clone(),
                why: "not a count; the database was changed outside mimic or is damaged".into(),
            });
        }
    }
    Ok(ShardDb {
        path: path.to_path_buf(),
        shard,
        meta,
    })
}

/// Checks that the shards are the N shards of one run: one count, each shard once, none
/// missing, the same inputs and settings. Returns N.
fn check_shards(shards: &[ShardDb]) -> Result<u32, MergeError> {
    let first = &shards[0];
    let n = first.shard.count();
    let mut seen: BTreeMap<u32, &ShardDb> = BTreeMap::new();
    for s in shards {
        if s.shard.count() != n {
            return Err(MergeError::ShardCount {
                a: first.path.clone(),
                sa: first.shard,
                b: s.path.clone(),
                sb: s.shard,
            });
        }
        if let Some(other) = seen.insert(s.shard.index(), s) {
            return Err(MergeError::DuplicateShard {
                a: other.path.clone(),
                b: s.path.clone(),
                shard: s.shard,
            });
        }
    }
    let missing: Vec<u32> = (1..=n).filter(|k| !seen.contains_key(k)).collect();
    if !missing.is_empty() {
        return Err(MergeError::Missing { missing, n });
    }
    for s in &shards[1..] {
        if let Some((what, detail)) = run_mismatch(&first.meta, &s.meta) {
            return Err(MergeError::Mismatch {
                a: first.path.clone(),
                b: s.path.clone(),
                what,
                detail,
            });
        }
    }
    Ok(n)
}

/// Why the shards whose `meta` rows are `a` and `b` are not shards of one run, if they are not:
/// "different inputs" or "different settings", and which row differs (every shard of a run
/// read the same frames with the same settings: what it analyzed plus what it passed over is
/// the whole input's TCP segments). Also the Parquet writer's check of a dataset's shards.
pub fn run_mismatch(
    a: &BTreeMap<String, String>,
    b: &BTreeMap<String, String>,
) -> Option<(&'static str, String)> {
    let segments = |m: &BTreeMap<String, String>| -> String {
        let get = |k: &str| m.get(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        (get("tcp_segments") + get("other_shard_segments")).to_string()
    };
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    for key in keys {
        if summed(key) || PER_SHARD.contains(&key.as_str()) || OWN.contains(&key.as_str()) {
            continue;
        }
        let (va, vb) = (a.get(key), b.get(key));
        if va != vb {
            let show = |v: Option<&String>| v.map_or("absent".to_string(), |v| format!("{v:?}"));
            let input = INPUT_KEYS.contains(&key.as_str()) || key.starts_with("skipped.");
            return Some((
                if input {
                    "different inputs"
                } else {
                    "different settings"
                },
                mismatch(key, &show(va), &show(vb)),
            ));
        }
    }
    (segments(a) != segments(b)).then(|| {
        (
            "different inputs",
            mismatch(
                "tcp_segments + other_shard_segments",
                &segments(a),
                &segments(b),
            ),
        )
    })
}

/// The merged database's meta rows (besides the ones it writes for itself).
fn merged_meta(shards: &[ShardDb], opts: &MergeOptions) -> Vec<(String, String)> {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    let mut sums: BTreeMap<String, u64> = BTreeMap::new();
    for s in shards {
        for (k, v) in &s.meta {
            if OWN.contains(&k.as_str()) || PER_SHARD.contains(&k.as_str()) {
                continue;
            }
            if summed(k) {
                *sums.entry(k.clone()).or_default() += v.parse::<u64>().unwrap_or(0);
            } else {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    out.extend(sums.into_iter().map(|(k, v)| (k, v.to_string())));
    out.insert("shards".into(), shards[0].shard.count().to_string());
    out.insert(
        "merged_from".into(),
        serde_json::to_string(
            &shards
                .iter()
                .map(|s| s.path.display().to_string())
                .collect::<Vec<_>>(),
        )
        .unwrap_or_default(),
    );
    out.extend(opts.meta.iter().cloned());
    out.into_iter().collect()
}

fn columns(c: &Connection, schema: &str, table: &str) -> rusqlite::Result<Vec<String>> {
    let mut st = c.prepare(&format!(
        "SELECT name FROM pragma_table_info('{table}', '{schema}') ORDER BY cid"
    ))?;
    let names = st.query_map([], |r| r.get(0))?;
    names.collect()
}

fn check_output(output: &Path, inputs: &[PathBuf]) -> Result<(), MergeError> {
    let inputs: Vec<&Path> = inputs.iter().map(PathBuf::as_path).collect();
    Ok(mimic_core::db::check_db_output(output, &inputs)?)
}

/// Merges the shard databases into `opts.output` (written atomically).
pub fn merge(opts: &MergeOptions) -> Result<MergeSummary, MergeError> {
    let started = Instant::now();
    if opts.inputs.is_empty() {
        return Err(MergeError::NoInputs);
    }
    check_output(&opts.output, &opts.inputs)?;
    let mut shards = opts
        .inputs
        .iter()
        .map(|p| open_shard(p))
        .collect::<Result<Vec<_>, _>>()?;
    let n = check_shards(&shards)?;
    shards.sort_by_key(|s| s.shard);

    let dest = opts.output.clone();
    let db = AtomicDb::create_with(&dest, false)?;
    let sq = |path: &Path| {
        let path = path.to_path_buf();
        move |source| {
            MergeError::Db(DbError::Sqlite {
                path: path.clone(),
                source,
            })
        }
    };
    let c = db.conn();
    c.execute_batch(
        "PRAGMA locking_mode = EXCLUSIVE; PRAGMA cache_size = -65536; PRAGMA temp_store = MEMORY;",
    )
    .map_err(sq(&dest))?;
    let tables: Vec<String> = {
        let mut st = c
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name != 'meta' ORDER BY rowid")
            .map_err(sq(&dest))?;
        let names = st.query_map([], |r| r.get(0)).map_err(sq(&dest))?;
        names.collect::<rusqlite::Result<_>>().map_err(sq(&dest))?
    };
    let mut rows: BTreeMap<String, u64> = BTreeMap::new();
    for s in &shards {
        // (ATTACH and DETACH only outside a transaction)
        c.execute(
            "ATTACH DATABASE ?1 AS shard",
            [mimic_core::db::sqlite_name(&s.path).display().to_string()],
        )
        .map_err(sq(&s.path))?;
        c.execute_batch("BEGIN;").map_err(sq(&dest))?;
        let copied = (|| -> Result<(), MergeError> {
            for t in &tables {
                let want = columns(c, "main", t).map_err(sq(&dest))?;
                let have = columns(c, "shard", t).map_err(sq(&s.path))?;
                if want != have {
                    let detail = if have.is_empty() {
                        "is missing".to_string()
                    } else {
                        format!(
                            "has columns ({}), this mimic's ({})",
                            have.join(", "),
                            want.join(", ")
                        )
                    };
                    return Err(MergeError::Schema {
                        path: s.path.clone(),
                        table: t.clone(),
                        detail,
                    });
                }
                let cols = want
                    .iter()
                    .map(|c| format!("\"{c}\""))
                    .collect::<Vec<_>>()
                    .join(", ");
                let order = if t == "connections" {
                    " ORDER BY id"
                } else {
                    ""
                };
                let res = c.execute(
                    &format!(
                        "INSERT INTO main.\"{t}\" ({cols}) SELECT {cols} FROM shard.\"{t}\"{order}"
                    ),
                    [],
                );
                match res {
                    Ok(k) => *rows.entry(t.clone()).or_default() += k as u64,
                    Err(e)
                        if t == "connections"
                            && matches!(&e, rusqlite::Error::SqliteFailure(f, _)
                                if f.code == rusqlite::ErrorCode::ConstraintViolation) =>
                    {
                        // an id another shard has; any other constraint (a value the STRICT
                        // table refuses) is reported as SQLite put it
                        let id: Option<i64> = c
                            .query_row(
                                "SELECT id FROM shard.connections WHERE id IN (SELECT id FROM main.connections) LIMIT 1",
                                [],
                                |r| r.get(0),
                            )
                            .optional()
                            .map_err(sq(&s.path))?;
                        return Err(match id {
                            Some(id) => MergeError::Overlap {
                                path: s.path.clone(),
                                id,
                            },
                            None => sq(&s.path)(e),
                        });
                    }
                    Err(e) => return Err(sq(&s.path)(e)),
                }
            }
            Ok(())
        })();
        c.execute_batch("COMMIT; DETACH DATABASE shard;")
            .map_err(sq(&dest))?;
        copied?;
    }
    c.execute_batch("BEGIN;").map_err(sq(&dest))?;
    for (k, v) in merged_meta(&shards, opts) {
        set_meta(c, &k, &v).map_err(sq(&dest))?;
    }
    for ix in index_statements() {
        c.execute_batch(ix).map_err(sq(&dest))?;
    }
    c.execute_batch("COMMIT;").map_err(sq(&dest))?;
    db.commit()?;
    Ok(MergeSummary {
        output: dest.display().to_string(),
        shards: n,
        inputs: shards
            .iter()
            .map(|s| s.path.display().to_string())
            .collect(),
        rows,
        elapsed_s: started.elapsed().as_secs_f64(),
    })
}
