//! `analyze-floor`: the least time two parts of an analysis can take on this machine, measured
//! apart from the analysis (bench/analyze.sh prints them beside the tools it times).
//!
//! * `analyze-floor read TRACE` — reads every frame of TRACE through mimic's trace reader and
//!   does nothing with it: the time any analysis of the file spends reading.
//! * `analyze-floor db DB OUT` — copies the rows of a database `mimic analyze` wrote (its
//!   connections, exchanges, RTT and bandwidth samples) into a new database OUT with the same
//!   schema and the same write settings as mimic's writer, by `INSERT INTO … SELECT * FROM …`.
//!   Into an empty table of the same shape SQLite moves each row's stored record as it is
//!   (its transfer optimisation): no value is bound, decoded or encoded, so this is the least
//!   time SQLite takes to store those rows in one database file. A database file has one writer
//!   at a time, so this time is serial however many cores the machine has. The copy is not
//!   fsynced, which only lowers the floor. With `--by-value` every row goes through SQLite's
//!   ordinary insert path instead (decoded and encoded again, indexes maintained row by row).
//! * `analyze-floor parquet DB DIR` — the same rows, read into memory first (the row types of
//!   `mimic_core::schema`), written as a Parquet dataset into DIR by mimic's Parquet writer
//!   (`mimic_analyze::columnar`, as `mimic analyze --format parquet` writes them: column
//!   builders, Snappy, files fsynced and renamed into place): what storing those records costs
//!   in Parquet, beside `db --by-value` for SQLite.
//!
//! Each prints one line: `<what> <seconds> <count>`.

use std::process::ExitCode;
use std::time::Instant;

use mimic_core::db::{index_statements, init_schema_tables};
use mimic_core::trace::TraceReader;
use rusqlite::Connection;

/// The tables an analysis fills, copied in the order mimic's writer fills them.
const TABLES: [&str; 4] = ["connections", "exchanges", "rtt_samples", "bw_samples"];

fn read(trace: &str) -> Result<(f64, u64), String> {
    let t0 = Instant::now();
    let mut r = TraceReader::open(trace).map_err(|e| e.to_string())?;
    let mut frames = 0u64;
    let mut bytes = 0u64;
    while let Some(f) = r.next_frame().map_err(|e| e.to_string())? {
        frames += 1;
        bytes += f.data.len() as u64;
    }
    // the byte count keeps the loop from being optimised away
    std::hint::black_box(bytes);
    Ok((t0.elapsed().as_secs_f64(), frames))
}

fn copy(src: &str, out: &str, by_value: bool) -> Result<(f64, u64), String> {
    let _ = std::fs::remove_file(out);
    let err = |e: rusqlite::Error| format!("{out}: {e}");
    let conn = Connection::open(out).map_err(err)?;
    // mimic's writer: core/src/db.rs (AtomicDb) and analyze/src/store.rs (RecordStore)
    conn.execute_batch(
        "PRAGMA page_size = 65536; PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF;
         PRAGMA foreign_keys = OFF; PRAGMA locking_mode = EXCLUSIVE; PRAGMA cache_size = -4096;
         PRAGMA temp_store = MEMORY;",
    )
    .map_err(err)?;
    init_schema_tables(&conn).map_err(err)?;
    conn.execute("ATTACH ?1 AS src", [src]).map_err(err)?;
    let mut rows = 0u64;
    for t in TABLES {
        rows += conn
            .query_row(&format!("SELECT count(*) FROM src.{t}"), [], |r| {
                r.get::<_, i64>(0)
            })
            .map_err(err)? as u64;
    }
    // the source's pages are read once before the clock starts, so that the copy reads them
    // from memory as the writer has its rows in memory
    for t in TABLES {
        conn.query_row(
            &format!("SELECT sum(length(quote(src.{t}.rowid))) FROM src.{t}"),
            [],
            |_| Ok(()),
        )
        .map_err(err)?;
    }
    let t0 = Instant::now();
    conn.execute_batch("BEGIN").map_err(err)?;
    for t in TABLES {
        // a WHERE clause turns SQLite's transfer optimisation off
        let filter = if by_value { " WHERE 1" } else { "" };
        conn.execute_batch(&format!(
            "INSERT INTO main.{t} SELECT * FROM src.{t}{filter}"
        ))
        .map_err(err)?;
    }
    for ix in index_statements() {
        conn.execute_batch(ix).map_err(err)?;
    }
    conn.execute_batch("COMMIT").map_err(err)?;
    let secs = t0.elapsed().as_secs_f64();
    drop(conn);
    Ok((secs, rows))
}

fn parquet(src: &str, dir: &str) -> Result<(f64, u64), String> {
    use mimic_analyze::columnar::ParquetDataset;
    use mimic_core::schema::{BwSampleRow, ConnectionRow, ExchangeRow, RttSampleRow, TableRow};
    let _ = std::fs::remove_dir_all(dir);
    let db = mimic_core::db::open_existing(src).map_err(|e| e.to_string())?;
    let err = |e: rusqlite::Error| format!("{src}: {e}");
    let conns = ConnectionRow::read_all(&db, "rowid").map_err(err)?;
    let ex = ExchangeRow::read_all(&db, "rowid").map_err(err)?;
    let rtt = RttSampleRow::read_all(&db, "rowid").map_err(err)?;
    let bw = BwSampleRow::read_all(&db, "rowid").map_err(err)?;
    let rows = (conns.len() + ex.len() + rtt.len() + bw.len()) as u64;
    let t0 = Instant::now();
    let perr = |e: mimic_analyze::columnar::ColumnarError| e.to_string();
    let mut ds = ParquetDataset::create(std::path::Path::new(dir), 1, 1).map_err(perr)?;
    fn put<T: TableRow>(ds: &mut ParquetDataset, rows: &[T]) -> Result<(), String> {
        let w = ds.table(ParquetDataset::index(T::TABLE.name).expect("a table"));
        rows.iter()
            .try_for_each(|r| w.push(r))
            .map_err(|e| e.to_string())
    }
    put(&mut ds, &conns)?;
    put(&mut ds, &ex)?;
    put(&mut ds, &rtt)?;
    put(&mut ds, &bw)?;
    ds.commit().map_err(perr)?;
    Ok((t0.elapsed().as_secs_f64(), rows))
}

fn main() -> ExitCode {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let res = match a.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["read", trace] => read(trace).map(|r| ("read", r)),
        ["db", src, out] => copy(src, out, false).map(|r| ("db_copy", r)),
        ["db", "--by-value", src, out] => copy(src, out, true).map(|r| ("db_insert", r)),
        ["parquet", src, dir] => parquet(src, dir).map(|r| ("parquet", r)),
        _ => {
            eprintln!(
                "usage: analyze-floor read TRACE | analyze-floor db [--by-value] MIMIC_DB OUT | analyze-floor parquet MIMIC_DB DIR"
            );
            return ExitCode::from(2);
        }
    };
    match res {
        Ok((what, (secs, n))) => {
            println!("{what} {secs:.4} {n}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("analyze-floor: {e}");
            ExitCode::FAILURE
        }
    }
}
