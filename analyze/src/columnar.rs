//! Parquet output: the tables of a mimic database as a Hive-partitioned directory of Parquet
//! files that DuckDB, Spark, Trino and pandas read as one table per name, shards included:
//!
//! ```text
//! DIR/table=connections/shard=1/part-0.parquet
//! DIR/table=connections/shard=2/part-0.parquet
//! DIR/table=exchanges/shard=1/part-0.parquet
//! …
//! ```
//!
//! `shard=K` is the K of `mimic analyze --shard K/N` (1 for an unsharded run), so the N shard
//! runs of one analysis, on any hosts, write into one directory and form one dataset.
//!
//! The Arrow schema of each table comes from its column list in `mimic_core::schema` (the list
//! the SQLite DDL comes from; nothing here names a column): INTEGER → Int64, REAL → Float64,
//! TEXT → Utf8, nullable exactly where SQLite allows NULL ([`Column::nullable`]); each field
//! carries the column's unit, doc and SQL declaration as field metadata, each file the table's
//! doc and the schema version as key/value metadata.
//!
//! A run writes every file into a hidden temporary directory inside DIR
//! (`.mimic-tmp-shard=K-PID-NANOS-HOST`, which no reader looks at) and renames each into its
//! place only when all are complete ([`ParquetDataset::commit`]), the shard's earlier parts
//! moved aside first and put back if a rename fails; a run that fails or is interrupted
//! removes the temporary directory and leaves the shard's previous tables, or none, never some
//! of one run's and some of another's. A later run removes what a killed one left there; one
//! killed during its renames (a few milliseconds, after every file was complete and on disk)
//! left a mark in its temporary directory (`COMMITTING`), and the next run on the directory
//! from the same host completes that commit before its own work, unless a later commit
//! replaced the shard since, so the shard is one run's whole (until then, a reader sees some
//! of its tables and some of the earlier run's).

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::builder::{Float64Builder, Int64Builder, StringBuilder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use mimic_core::db::{SCHEMA_LEVEL, SCHEMA_VERSION};
use mimic_core::schema::{Cell, Column, SqlType, Table, TableRow, TABLES};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;

/// The file name of a shard's part of a table.
pub const PART_FILE: &str = "part-0.parquet";

/// Rows gathered in the column builders before they go to the Parquet writer as one batch.
const BATCH_ROWS: usize = 16 * 1024;
/// Rows per Parquet row group (the unit readers parallelise and skip over).
/// (DuckDB's own size: a few row groups per shard file to read in parallel).
const ROW_GROUP_ROWS: usize = 122_880;
/// Dictionary size per column chunk before a column falls back to plain encoding. The default
/// (1 MiB) kept a large dictionary for each of the ~90 columns (ids and times never repeat):
/// on the benchmark trace 157-170 MB peak RSS for the analysis (SQLite's 76-93 MB), 130-137 MB
/// with 128 KiB, and a file no larger (23 MB).
const DICT_PAGE_BYTES: usize = 128 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ColumnarError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: writing Parquet: {source}")]
    Parquet {
        path: PathBuf,
        source: parquet::errors::ParquetError,
    },
    #[error("{path}: building a batch of rows: {source}")]
    Arrow {
        path: PathBuf,
        source: arrow_schema::ArrowError,
    },
    /// A value that does not fit its column (from a database whose column holds another type,
    /// or NULL where the contract does not allow it).
    #[error("{table}.{column}: {what}")]
    Value {
        table: &'static str,
        column: &'static str,
        what: String,
    },
    #[error(transparent)]
    Db(#[from] mimic_core::db::DbError),
    #[error("{path}: {source}")]
    Sqlite {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("{path}: meta `shard` is {value:?}, not K/N")]
    BadShard { path: PathBuf, value: String },
    #[error("{dir}: holds shard={found} of table {table}, which a run of {count} shard(s) does not write: the directory would mix two runs' results (write into an empty directory, or remove it first)")]
    ForeignShard {
        dir: PathBuf,
        table: &'static str,
        found: u32,
        count: u32,
    },
    #[error("{dir}: holds shard={found} of a run of {n} shard(s), and this run has {count}: the directory would mix two runs' results (write into an empty directory, or remove it first)")]
    OtherCount {
        dir: PathBuf,
        found: u32,
        n: u32,
        count: u32,
    },
    /// `what`/`detail` as `mimic merge` says them (`merge::run_mismatch`).
    #[error("{dir}: holds shard={found} of another run ({what}: {detail}): the directory would mix two runs' results, so this shard was not written (write into an empty directory, or remove it first)")]
    OtherRun {
        dir: PathBuf,
        found: u32,
        what: &'static str,
        detail: String,
    },
}

/// The shard count that shard `shard`'s part of `meta` in `dir` records (its `shard` row,
/// "K/N"; rows but none of that key: an unsharded run, 1). `None` when the part cannot be
/// read or has no rows (a later step says so, or the part is replaced).
fn recorded_count(dir: &Path, shard: u32) -> Option<u32> {
    let meta = read_meta(dir, shard)?;
    match meta.get("shard") {
        Some(v) => v.split_once('/')?.1.parse().ok(),
        None => Some(1),
    }
}

/// The shards (`shard=K` directories) that table `table` of the dataset in `dir` holds, in
/// order; none where the table's directory cannot be read.
fn shards_of(dir: &Path, table: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(dir.join(format!("table={table}"))) else {
        return Vec::new();
    };
    let mut found: Vec<u32> = entries
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("shard="))
                .and_then(|k| k.parse::<u32>().ok())
        })
        .collect();
    found.sort_unstable();
    found
}

/// The rows of shard `shard`'s part of `meta` in `dir`, key to value; `None` when the part
/// cannot be read or has no rows.
pub fn read_meta(dir: &Path, shard: u32) -> Option<BTreeMap<String, String>> {
    use arrow_array::{Array, StringArray};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let f = File::open(part_path(dir, "meta", shard)).ok()?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(f)
        .ok()?
        .build()
        .ok()?;
    let mut meta = BTreeMap::new();
    for batch in reader {
        let b = batch.ok()?;
        let text = |name| {
            b.column_by_name(name)
                .and_then(|c| c.as_any().downcast_ref::<StringArray>())
        };
        let (keys, values) = (text("key")?, text("value")?);
        for i in 0..b.num_rows() {
            if !keys.is_null(i) {
                let v = (!values.is_null(i)).then(|| values.value(i).to_string());
                meta.insert(keys.value(i).to_string(), v.unwrap_or_default());
            }
        }
    }
    (!meta.is_empty()).then_some(meta)
}

/// The Arrow type of an SQL column type.
pub fn data_type(t: SqlType) -> DataType {
    match t {
        SqlType::Integer => DataType::Int64,
        SqlType::Real => DataType::Float64,
        SqlType::Text => DataType::Utf8,
    }
}

/// The Arrow field of a column: its name, type, nullability, and its unit, doc and SQL
/// declaration as metadata (`unit` only when it has one).
pub fn field(c: &Column) -> Field {
    let mut md = HashMap::new();
    if !c.unit.as_str().is_empty() {
        md.insert("unit".to_string(), c.unit.as_str().to_string());
    }
    md.insert("doc".to_string(), c.doc_line());
    md.insert("sql".to_string(), c.ddl());
    Field::new(c.name, data_type(c.sql_type), c.nullable()).with_metadata(md)
}

/// The Arrow schema of a table, from its column list.
pub fn arrow_schema(t: &Table) -> Schema {
    let fields: Vec<Field> = t.columns.iter().map(field).collect();
    let md = HashMap::from([
        ("mimic.table".to_string(), t.name.to_string()),
        (
            "mimic.doc".to_string(),
            t.doc.split_whitespace().collect::<Vec<_>>().join(" "),
        ),
        (
            "mimic.schema_version".to_string(),
            SCHEMA_VERSION.to_string(),
        ),
        (
            "mimic.schema_migration".to_string(),
            SCHEMA_LEVEL.to_string(),
        ),
    ]);
    Schema::new(fields).with_metadata(md)
}

/// Where shard `shard`'s part of `table` lives in a dataset directory.
pub fn part_path(dir: &Path, table: &str, shard: u32) -> PathBuf {
    dir.join(format!("table={table}"))
        .join(format!("shard={shard}"))
        .join(PART_FILE)
}

enum ColumnBuilder {
    Integer(Int64Builder),
    Real(Float64Builder),
    Text(StringBuilder),
}

impl ColumnBuilder {
    fn new(t: SqlType) -> ColumnBuilder {
        match t {
            SqlType::Integer => ColumnBuilder::Integer(Int64Builder::with_capacity(BATCH_ROWS)),
            SqlType::Real => ColumnBuilder::Real(Float64Builder::with_capacity(BATCH_ROWS)),
            SqlType::Text => {
                ColumnBuilder::Text(StringBuilder::with_capacity(BATCH_ROWS, BATCH_ROWS * 8))
            }
        }
    }

    fn finish(&mut self) -> ArrayRef {
        match self {
            ColumnBuilder::Integer(b) => Arc::new(b.finish()),
            ColumnBuilder::Real(b) => Arc::new(b.finish()),
            ColumnBuilder::Text(b) => Arc::new(b.finish()),
        }
    }
}

/// One table being written to its Parquet file: rows are appended a value at a time into
/// column builders, which go to the file as a batch every `BATCH_ROWS` rows.
pub struct TableWriter {
    table: &'static Table,
    schema: SchemaRef,
    builders: Vec<ColumnBuilder>,
    /// Rows in the builders.
    pending: usize,
    /// Rows written, in total.
    rows: u64,
    writer: Option<ArrowWriter<File>>,
    path: PathBuf,
}

impl TableWriter {
    /// A writer of `table` into the new file `path`.
    pub fn create(table: &'static Table, path: &Path) -> Result<TableWriter, ColumnarError> {
        let schema: SchemaRef = Arc::new(arrow_schema(table));
        let file = File::create(path).map_err(|source| ColumnarError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
            .set_dictionary_page_size_limit(DICT_PAGE_BYTES)
            .set_created_by(format!("mimic {}", env!("CARGO_PKG_VERSION")))
            .build();
        let writer = ArrowWriter::try_new(file, schema.clone(), Some(props)).map_err(|source| {
            ColumnarError::Parquet {
                path: path.to_path_buf(),
                source,
            }
        })?;
        Ok(TableWriter {
            table,
            builders: table
                .columns
                .iter()
                .map(|c| ColumnBuilder::new(c.sql_type))
                .collect(),
            schema,
            pending: 0,
            rows: 0,
            writer: Some(writer),
            path: path.to_path_buf(),
        })
    }

    pub fn table(&self) -> &'static Table {
        self.table
    }

    /// Rows written so far (complete rows only).
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Appends column `col`'s value of the row being built. Values convert as SQLite's column
    /// affinity would (an integer in a REAL column becomes a float); anything else that does
    /// not fit the column's type, and NULL in a column that does not take it, is an error.
    #[inline]
    pub fn append(&mut self, col: usize, cell: Cell<'_>) -> Result<(), ColumnarError> {
        let c = &self.table.columns[col];
        let bad = |what: String| ColumnarError::Value {
            table: self.table.name,
            column: c.name,
            what,
        };
        match (&mut self.builders[col], cell) {
            (_, Cell::Null) if !c.nullable() => {
                return Err(bad("NULL in a column that does not allow it".into()))
            }
            (ColumnBuilder::Integer(b), Cell::Null) => b.append_null(),
            (ColumnBuilder::Real(b), Cell::Null) => b.append_null(),
            (ColumnBuilder::Text(b), Cell::Null) => b.append_null(),
            (ColumnBuilder::Integer(b), Cell::Integer(v)) => b.append_value(v),
            (ColumnBuilder::Real(b), Cell::Real(v)) => b.append_value(v),
            (ColumnBuilder::Real(b), Cell::Integer(v)) => b.append_value(v as f64),
            (ColumnBuilder::Text(b), Cell::Text(v)) => b.append_value(v),
            (_, other) => {
                return Err(bad(format!(
                    "{other:?} in a column of type {}",
                    c.sql_type.as_str()
                )))
            }
        }
        Ok(())
    }

    /// Ends the row whose values were appended (one per column, in column order).
    #[inline]
    pub fn end_row(&mut self) -> Result<(), ColumnarError> {
        self.pending += 1;
        if self.pending >= BATCH_ROWS {
            self.write_batch()?;
        }
        Ok(())
    }

    /// Appends a row of the table's row type.
    pub fn push<T: TableRow>(&mut self, row: &T) -> Result<(), ColumnarError> {
        debug_assert_eq!(T::TABLE.name, self.table.name);
        let mut col = 0;
        let mut err = None;
        row.for_each_cell(|cell| {
            if err.is_none() {
                if let Err(e) = self.append(col, cell) {
                    err = Some(e);
                }
            }
            col += 1;
        });
        match err {
            Some(e) => Err(e),
            None => self.end_row(),
        }
    }

    fn write_batch(&mut self) -> Result<(), ColumnarError> {
        if self.pending == 0 {
            return Ok(());
        }
        let arrays: Vec<ArrayRef> = self.builders.iter_mut().map(|b| b.finish()).collect();
        if let Some(a) = arrays.iter().find(|a| a.len() != self.pending) {
            return Err(ColumnarError::Value {
                table: self.table.name,
                column: "",
                what: format!(
                    "a row with a missing or extra value ({} values for {} rows)",
                    a.len(),
                    self.pending
                ),
            });
        }
        let batch = RecordBatch::try_new(self.schema.clone(), arrays).map_err(|source| {
            ColumnarError::Arrow {
                path: self.path.clone(),
                source,
            }
        })?;
        let w = self.writer.as_mut().expect("writer used after finish");
        w.write(&batch).map_err(|source| ColumnarError::Parquet {
            path: self.path.clone(),
            source,
        })?;
        self.rows += self.pending as u64;
        self.pending = 0;
        Ok(())
    }

    /// Writes what is buffered and the file's footer, and syncs the file to disk.
    pub fn finish(&mut self) -> Result<u64, ColumnarError> {
        self.close()?;
        self.sync()?;
        Ok(self.rows)
    }

    /// Writes what is buffered and the file's footer (the file is complete but not yet
    /// synced: [`TableWriter::sync`]).
    fn close(&mut self) -> Result<u64, ColumnarError> {
        self.write_batch()?;
        let Some(mut w) = self.writer.take() else {
            return Ok(self.rows);
        };
        w.finish().map_err(|source| ColumnarError::Parquet {
            path: self.path.clone(),
            source,
        })?;
        Ok(self.rows)
    }

    /// Syncs the closed file to disk (through a handle of its own: the writer's went with it).
    fn sync(&self) -> Result<(), ColumnarError> {
        File::open(&self.path)
            .and_then(|f| f.sync_all())
            .map_err(io(&self.path))
    }
}

/// One shard's part of a Parquet dataset being written: a [`TableWriter`] per table of the
/// contract, in a temporary directory until [`ParquetDataset::commit`].
pub struct ParquetDataset {
    dir: PathBuf,
    shard: u32,
    tmp: PathBuf,
    tables: Vec<TableWriter>,
    committed: bool,
    /// DIR did not exist before: an uncommitted run removes it again (when empty).
    created_dir: bool,
    /// Removes `tmp` if the process is interrupted before the commit's mark is written; after
    /// it, a commit cut short is completed by the next run, and `tmp` must stay for that.
    held: Option<mimic_core::interrupt::TempOutput>,
    /// Removes DIR, if this run created it and it is empty, on an interruption.
    _held_dir: Option<mimic_core::interrupt::TempOutput>,
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> ColumnarError + '_ {
    move |source| ColumnarError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The prefix of a run's temporary directory inside the dataset's
/// (`.mimic-tmp-shard=K-PID-NANOS-HOST`).
const TMP_PREFIX: &str = ".mimic-tmp-shard=";

/// The mark a commit leaves in its temporary directory before its first rename: every new
/// part is complete and on disk, so a commit killed past it is completed by the next run.
const COMMIT_MARK: &str = "COMMITTING";

/// For the test of a commit killed halfway: `MIMIC_FAULT_ABORT_COMMIT_AFTER=N` aborts the
/// process once N tables have been renamed into place.
const FAULT_ABORT_COMMIT: &str = "MIMIC_FAULT_ABORT_COMMIT_AFTER";

/// Whether the commit a killed run began (its temporary directory `tmp` holds the mark) is
/// the shard's last: no part of the shard was written after the mark (a later run's commit
/// replaced what it had put in place, and what it left must not replace that run's parts).
fn killed_commit_is_the_last(dir: &Path, tmp: &Path, shard: u32) -> bool {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let Some(mark) = modified(&tmp.join(COMMIT_MARK)) else {
        return false;
    };
    TABLES
        .iter()
        .all(|t| modified(&part_path(dir, t.name, shard)).is_none_or(|part| part <= mark))
}

/// Completes the commit a killed run began (its temporary directory `tmp` holds the mark):
/// every new part still in `tmp` takes its place in shard `shard`. `false` when a rename
/// failed (the directory is then left for a later run).
fn complete_killed_commit(dir: &Path, tmp: &Path, shard: u32) -> bool {
    let mut ok = true;
    for t in TABLES {
        let src = tmp.join(format!("{}.parquet", t.name));
        if !src.exists() {
            continue; // renamed before the run was killed
        }
        let dest = part_path(dir, t.name, shard);
        let parent = dest.parent().expect("a part has a directory");
        if let Err(e) = std::fs::create_dir_all(parent).and_then(|()| std::fs::rename(&src, &dest))
        {
            tracing::warn!(
                "{}: cannot complete the commit of a run killed during it: {e}",
                dest.display()
            );
            ok = false;
        }
    }
    ok
}

/// This host's name, as the temporary directories carry it (`/proc/sys/kernel/hostname`; a
/// container has its own).
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().replace(['/', '-'], "_"))
        .unwrap_or_default()
}

/// Removes the temporary directories that killed runs left in `dir`: one made on this host
/// by a process that no longer runs, and any not touched for a week (the shards of a run may
/// write into one directory from several hosts, whose pids mean nothing here).
fn remove_dead_runs_temp_dirs(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let me = host_name();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(TMP_PREFIX)) else {
            continue;
        };
        // SHARD-PID-NANOS-HOST
        let parts: Vec<&str> = rest.splitn(4, '-').collect();
        let dead_here = match parts.as_slice() {
            [_, pid, _, host] if !me.is_empty() && *host == me => pid
                .parse::<i32>()
                .is_ok_and(|p| !mimic_core::process::running(p)),
            _ => false,
        };
        let week_old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > std::time::Duration::from_secs(7 * 24 * 3600));
        if dead_here || week_old {
            // a commit is completed only by a run of the host that began it, and only when
            // it is the shard's last (a week-old folder of another host's run is removed)
            let shard = parts.first().and_then(|k| k.parse::<u32>().ok());
            let last = |k| dead_here && killed_commit_is_the_last(dir, &e.path(), k);
            if let Some(shard) = shard.filter(|&k| last(k)) {
                tracing::warn!(
                    "{}: completing the commit of shard {shard} that a killed run began",
                    dir.display()
                );
                if !complete_killed_commit(dir, &e.path(), shard) {
                    continue;
                }
            } else {
                tracing::info!(
                    "{}: removing the temporary directory of a run that was killed",
                    e.path().display()
                );
            }
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

impl ParquetDataset {
    /// Starts shard `shard` of `count` of a dataset in `dir` (created if missing; its parent
    /// must exist). Refuses a directory that holds a shard beyond `count` (another run's).
    pub fn create(dir: &Path, shard: u32, count: u32) -> Result<ParquetDataset, ColumnarError> {
        let mut created_dir = false;
        match std::fs::metadata(dir) {
            Ok(m) if !m.is_dir() => {
                return Err(ColumnarError::Io {
                    path: dir.to_path_buf(),
                    source: std::io::Error::other(
                        "exists and is not a directory (Parquet output is a directory)",
                    ),
                })
            }
            Ok(_) => {}
            Err(_) => match std::fs::create_dir(dir) {
                Ok(()) => created_dir = true,
                // the shards of one run start at once: another one made it in between
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => {}
                Err(e) => return Err(io(dir)(e)),
            },
        }
        for t in TABLES {
            for found in shards_of(dir, t.name) {
                if found > count {
                    return Err(ColumnarError::ForeignShard {
                        dir: dir.to_path_buf(),
                        table: t.name,
                        found,
                        count,
                    });
                }
                // a shard this run could write, but of a run of another count (its meta
                // says "K/N"): one shard of a 2-shard run beside one of a 3-shard run is no
                // dataset either
                if t.name == "meta" {
                    match recorded_count(dir, found) {
                        Some(n) if n != count => {
                            return Err(ColumnarError::OtherCount {
                                dir: dir.to_path_buf(),
                                found,
                                n,
                                count,
                            })
                        }
                        _ => {}
                    }
                }
            }
        }
        remove_dead_runs_temp_dirs(dir);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let tmp = dir.join(format!(
            "{TMP_PREFIX}{shard}-{}-{nanos}-{}",
            std::process::id(),
            host_name()
        ));
        std::fs::create_dir(&tmp).map_err(io(&tmp))?;
        let held = Some(mimic_core::interrupt::TempOutput::new(&tmp));
        let mut ds = ParquetDataset {
            dir: dir.to_path_buf(),
            shard,
            tmp,
            tables: Vec::with_capacity(TABLES.len()),
            committed: false,
            created_dir,
            held,
            _held_dir: created_dir.then(|| mimic_core::interrupt::TempOutput::dir_if_empty(dir)),
        };
        for t in TABLES {
            let path = ds.tmp.join(format!("{}.parquet", t.name));
            ds.tables.push(TableWriter::create(t, &path)?);
        }
        Ok(ds)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Refuses to join a dataset whose other shards are of another run: their `meta` and this
    /// run's (`meta`) must agree as `mimic merge` requires of shards (the same inputs and
    /// settings); a shard whose meta part cannot be read is left to the readers.
    pub fn check_same_run(&self, meta: &BTreeMap<String, String>) -> Result<(), ColumnarError> {
        for k in shards_of(&self.dir, "meta") {
            if k == self.shard {
                continue;
            }
            if let Some(theirs) = read_meta(&self.dir, k) {
                if let Some((what, detail)) = crate::merge::run_mismatch(meta, &theirs) {
                    return Err(ColumnarError::OtherRun {
                        dir: self.dir.clone(),
                        found: k,
                        what,
                        detail,
                    });
                }
            }
        }
        Ok(())
    }

    /// The index of table `name` (for [`ParquetDataset::table`]).
    pub fn index(name: &str) -> Option<usize> {
        TABLES.iter().position(|t| t.name == name)
    }

    /// The writer of the table at `index` (an index of `TABLES`).
    pub fn table(&mut self, index: usize) -> &mut TableWriter {
        &mut self.tables[index]
    }

    /// Finishes every file and renames each to `DIR/table=NAME/shard=K/part-0.parquet`
    /// (replacing that shard's earlier part); returns each table's name and rows.
    pub fn commit(mut self) -> Result<TableCounts, ColumnarError> {
        let t0 = std::time::Instant::now();
        let mut counts = Vec::with_capacity(self.tables.len());
        for w in &mut self.tables {
            counts.push((w.table.name, w.close()?));
        }
        let t1 = std::time::Instant::now();
        for w in &self.tables {
            w.sync()?;
        }
        let t2 = std::time::Instant::now();
        let dests: Vec<PathBuf> = self
            .tables
            .iter()
            .map(|w| part_path(&self.dir, w.table.name, self.shard))
            .collect();
        // what is in a part's place must be a file to replace: refused before any rename
        for dest in &dests {
            if let Ok(m) = std::fs::symlink_metadata(dest) {
                if !m.file_type().is_file() {
                    return Err(ColumnarError::Io {
                        path: dest.clone(),
                        source: std::io::Error::other(
                            "is in the place of this shard's part and is not a file; nothing was replaced",
                        ),
                    });
                }
            }
        }
        // Every new part is complete and on disk: the mark says so to a later run, should this
        // one be killed during the renames.
        drop(self.held.take());
        let mark = self.tmp.join(COMMIT_MARK);
        File::create(&mark)
            .and_then(|f| f.sync_all())
            .and_then(|()| File::open(&self.tmp)?.sync_all())
            .map_err(io(&mark))?;
        let abort_after: Option<usize> = std::env::var(FAULT_ABORT_COMMIT)
            .ok()
            .and_then(|n| n.parse().ok());
        // The earlier parts are moved aside (into the temporary directory) before the new ones
        // take their places; a rename that fails puts every earlier part back, so the shard is
        // all this run's or all the earlier one's, never a mix of tables from both.
        let mut done: Vec<(usize, Option<PathBuf>)> = Vec::new();
        let mut failed = None;
        for (i, (w, dest)) in self.tables.iter().zip(&dests).enumerate() {
            let parent = dest.parent().expect("a part has a directory");
            let aside = self.tmp.join(format!("earlier-{}.parquet", w.table.name));
            let step = (|| -> Result<Option<PathBuf>, ColumnarError> {
                std::fs::create_dir_all(parent).map_err(io(parent))?;
                let earlier = match std::fs::rename(dest, &aside) {
                    Ok(()) => Some(aside.clone()),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                    Err(e) => return Err(io(dest)(e)),
                };
                if let Err(e) = std::fs::rename(&w.path, dest) {
                    if let Some(a) = &earlier {
                        let _ = std::fs::rename(a, dest);
                    }
                    return Err(io(dest)(e));
                }
                Ok(earlier)
            })();
            if abort_after == Some(i + 1) {
                std::process::abort();
            }
            match step {
                Ok(earlier) => done.push((i, earlier)),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        if let Some(e) = failed {
            // the commit is abandoned: a later run must not complete it, should this one be
            // killed while it puts the earlier parts back
            let _ = std::fs::remove_file(&mark);
            let _ = File::open(&self.tmp).and_then(|d| d.sync_all());
            for (i, earlier) in done.into_iter().rev() {
                match earlier {
                    Some(a) => {
                        let _ = std::fs::rename(&a, &dests[i]);
                    }
                    None => {
                        let _ = std::fs::remove_file(&dests[i]);
                    }
                }
            }
            return Err(e);
        }
        // the renames themselves reach the disk with their directories
        for dest in &dests {
            let parent = dest.parent().expect("a part has a directory");
            File::open(parent)
                .and_then(|d| d.sync_all())
                .map_err(io(parent))?;
        }
        self.committed = true;
        std::fs::remove_dir_all(&self.tmp).map_err(io(&self.tmp))?;
        tracing::debug!(
            close_s = (t1 - t0).as_secs_f64(),
            sync_s = (t2 - t1).as_secs_f64(),
            rename_s = t2.elapsed().as_secs_f64(),
            "parquet files"
        );
        Ok(counts)
    }
}

impl Drop for ParquetDataset {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.tmp);
            if self.created_dir {
                // only if empty: another shard may have written into it meanwhile
                let _ = std::fs::remove_dir(&self.dir);
            }
        }
    }
}

/// Rows written per table, in `TABLES` order.
pub type TableCounts = Vec<(&'static str, u64)>;

/// Writes every table of the mimic database `conn` (opened from `db`) as one shard of the
/// dataset in `dir`: shard K of N when the database is shard K/N of a run (meta `shard`),
/// else shard 1 of 1. A column the database does not have yet (an older schema level) is
/// written with its default, or NULL; a table it does not have, as an empty file. Returns the
/// shard and each table's rows.
pub fn export_database(
    conn: &rusqlite::Connection,
    db: &Path,
    dir: &Path,
) -> Result<(u32, TableCounts), ColumnarError> {
    let sql = |source| ColumnarError::Sqlite {
        path: db.to_path_buf(),
        source,
    };
    let (k, n) = match mimic_core::db::get_meta(conn, "shard").map_err(sql)? {
        None => (1, 1),
        Some(v) => {
            let s: mimic_core::community_id::Shard =
                v.parse().map_err(|_| ColumnarError::BadShard {
                    path: db.to_path_buf(),
                    value: v.clone(),
                })?;
            (s.index(), s.count())
        }
    };
    let mut ds = ParquetDataset::create(dir, k, n)?;
    for (ix, t) in TABLES.iter().enumerate() {
        let have: Vec<String> = {
            let mut st = conn
                .prepare(&format!("PRAGMA table_info(\"{}\")", t.name))
                .map_err(sql)?;
            let names = st.query_map([], |r| r.get::<_, String>(1)).map_err(sql)?;
            names.collect::<rusqlite::Result<_>>().map_err(sql)?
        };
        if have.is_empty() {
            continue;
        }
        let exprs: Vec<String> = t
            .columns
            .iter()
            .map(|c| {
                if have.iter().any(|h| h == c.name) {
                    format!("\"{}\"", c.name)
                } else {
                    c.default.unwrap_or("NULL").to_string()
                }
            })
            .collect();
        let mut st = conn
            .prepare(&format!("SELECT {} FROM \"{}\"", exprs.join(", "), t.name))
            .map_err(sql)?;
        let mut rows = st.query([]).map_err(sql)?;
        let w = ds.table(ix);
        while let Some(r) = rows.next().map_err(sql)? {
            for col in 0..t.columns.len() {
                let cell = match r.get_ref(col).map_err(sql)? {
                    rusqlite::types::ValueRef::Null => Cell::Null,
                    rusqlite::types::ValueRef::Integer(v) => Cell::Integer(v),
                    rusqlite::types::ValueRef::Real(v) => Cell::Real(v),
                    rusqlite::types::ValueRef::Text(v) => {
                        Cell::Text(std::str::from_utf8(v).map_err(|_| ColumnarError::Value {
                            table: t.name,
                            column: t.columns[col].name,
                            // the row by its key and the value, its bytes that are not
                            // printable ASCII escaped (\xff), as every reader shows them:
                            // Utf8Error's own text gives an offset into the value only
                            what: format!(
                                "row with {} holds text that is not UTF-8: {}",
                                mimic_core::schema::row_key(r),
                                mimic_core::schema::show_value(rusqlite::types::ValueRef::Text(v))
                            ),
                        })?)
                    }
                    rusqlite::types::ValueRef::Blob(_) => {
                        return Err(ColumnarError::Value {
                            table: t.name,
                            column: t.columns[col].name,
                            what: format!(
                                "row with {} holds a BLOB, which the contract has no column for",
                                mimic_core::schema::row_key(r)
                            ),
                        })
                    }
                };
                w.append(col, cell)?;
            }
            w.end_row()?;
        }
    }
    // a shard database joins a dataset only beside shards of its own run
    let meta = crate::merge::read_meta(conn, db)?;
    ds.check_same_run(&meta)?;
    Ok((k, ds.commit()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Array, Float64Array, Int64Array, StringArray};
    use mimic_core::schema::{ConnectionRow, ExchangeRow, MetaRow, Text};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    /// Every batch of a Parquet file, and its Arrow schema as the file stores it.
    fn read(path: &Path) -> (SchemaRef, Vec<RecordBatch>) {
        let b = ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap()).unwrap();
        let schema = b.schema().clone();
        let batches = b.build().unwrap().collect::<Result<Vec<_>, _>>().unwrap();
        (schema, batches)
    }

    /// The type mapping, for every column of every table: INTEGER -> Int64, REAL -> Float64,
    /// TEXT -> Utf8, nullable exactly where SQLite allows NULL, the unit and doc as field
    /// metadata; and a few columns named explicitly, so that the rule is not only checked
    /// against itself.
    #[test]
    fn the_arrow_schema_is_the_column_list() {
        for t in TABLES {
            let s = arrow_schema(t);
            assert_eq!(s.fields().len(), t.columns.len(), "{}", t.name);
            for (f, c) in s.fields().iter().zip(t.columns) {
                assert_eq!(f.name(), c.name);
                assert_eq!(
                    f.data_type(),
                    &data_type(c.sql_type),
                    "{}.{}",
                    t.name,
                    c.name
                );
                assert_eq!(
                    f.is_nullable(),
                    !(c.not_null || (c.primary_key && c.sql_type == SqlType::Integer))
                );
                assert_eq!(f.metadata().get("doc"), Some(&c.doc_line()));
                assert_eq!(
                    f.metadata().get("unit").map(String::as_str),
                    Some(c.unit.as_str()).filter(|u| !u.is_empty())
                );
            }
            assert_eq!(
                s.metadata().get("mimic.table").map(String::as_str),
                Some(t.name)
            );
        }
        let c = arrow_schema(ConnectionRow::TABLE);
        let f = |n: &str| c.field_with_name(n).unwrap().clone();
        assert_eq!(
            (f("id").data_type().clone(), f("id").is_nullable()),
            (DataType::Int64, false)
        );
        assert_eq!(
            (
                f("client_ip").data_type().clone(),
                f("client_ip").is_nullable()
            ),
            (DataType::Utf8, false)
        );
        assert_eq!(
            (
                f("min_rtt_us").data_type().clone(),
                f("min_rtt_us").is_nullable()
            ),
            (DataType::Int64, true)
        );
        assert_eq!(
            (f("bw_bps").data_type().clone(), f("bw_bps").is_nullable()),
            (DataType::Float64, true)
        );
        assert_eq!(
            (
                f("community_id").data_type().clone(),
                f("community_id").is_nullable()
            ),
            (DataType::Utf8, true)
        );
        assert_eq!(f("min_rtt_us").metadata().get("unit").unwrap(), "µs");
        assert_eq!(f("t_syn").metadata().get("unit").unwrap(), "µs since epoch");
        // meta.key is TEXT PRIMARY KEY: SQLite lets it hold NULL, so the field is nullable
        assert!(arrow_schema(MetaRow::TABLE)
            .field_with_name("key")
            .unwrap()
            .is_nullable());
    }

    fn conn(id: i64, some: bool) -> ConnectionRow {
        ConnectionRow {
            id,
            client_ip: Text::Owned(format!("192.0.2.{id}")),
            client_port: 40_000 + id,
            server_ip: "198.51.100.1".into(),
            server_port: 443,
            vlan: some.then_some(7),
            ip_version: 4,
            t_first: 1_700_000_000_000_000 + id,
            t_end: 1_700_000_001_000_000,
            server_by: "syn".into(),
            min_rtt_us: some.then_some(12_345),
            bw_bps: some.then_some(1.5e6),
            prune_reason: (!some).then_some(Text::Borrowed("no_syn")),
            delack_policy: "unknown".into(),
            termination: "fin".into(),
            community_id: some.then(|| Text::Owned(format!("1:conn{id}="))),
            ..Default::default()
        }
    }

    /// Rows written through the dataset come back from the file with the same values, NULL
    /// where the row had None (and not 0 or ""), across more than one batch; the part sits at
    /// `table=NAME/shard=K/part-0.parquet`, and the temporary directory is gone.
    #[test]
    fn rows_and_nulls_round_trip() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ds");
        let mut ds = ParquetDataset::create(&dir, 2, 4).unwrap();
        let ci = ParquetDataset::index("connections").unwrap();
        let n = BATCH_ROWS as i64 + 10;
        for id in 0..n {
            ds.table(ci).push(&conn(id, id % 3 != 0)).unwrap();
        }
        let ei = ParquetDataset::index("exchanges").unwrap();
        ds.table(ei)
            .push(&ExchangeRow {
                conn_id: 1,
                method: Some("GET".into()),
                status: None,
                ..Default::default()
            })
            .unwrap();
        let counts = ds.commit().unwrap();
        assert!(counts.contains(&("connections", n as u64)));
        assert!(counts.contains(&("exchanges", 1)));
        assert!(counts.contains(&("replay_map", 0)));
        let names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| n.starts_with("table=")), "{names:?}");
        for t in TABLES {
            assert!(part_path(&dir, t.name, 2).is_file(), "{}", t.name);
        }

        let (schema, batches) = read(&part_path(&dir, "connections", 2));
        assert_eq!(
            schema
                .field_with_name("min_rtt_us")
                .unwrap()
                .metadata()
                .get("unit")
                .unwrap(),
            "µs"
        );
        let mut id = 0i64;
        let total: usize = batches.iter().map(|b| b.num_rows()).sum();
        assert_eq!(total as i64, n);
        for b in &batches {
            let col = |name: &str| b.column(b.schema().index_of(name).unwrap()).clone();
            let ids = col("id");
            let ids = ids.as_any().downcast_ref::<Int64Array>().unwrap();
            let rtt = col("min_rtt_us");
            let rtt = rtt.as_any().downcast_ref::<Int64Array>().unwrap();
            let bw = col("bw_bps");
            let bw = bw.as_any().downcast_ref::<Float64Array>().unwrap();
            let prune = col("prune_reason");
            let prune = prune.as_any().downcast_ref::<StringArray>().unwrap();
            let ip = col("client_ip");
            let ip = ip.as_any().downcast_ref::<StringArray>().unwrap();
            for i in 0..b.num_rows() {
                let some = id % 3 != 0;
                assert_eq!(ids.value(i), id);
                assert_eq!(ip.value(i), format!("192.0.2.{id}"));
                assert_eq!(rtt.is_null(i), !some, "row {id}");
                assert_eq!(bw.is_null(i), !some);
                assert_eq!(prune.is_null(i), some);
                if some {
                    assert_eq!(rtt.value(i), 12_345);
                    assert_eq!(bw.value(i), 1.5e6);
                } else {
                    assert_eq!(prune.value(i), "no_syn");
                }
                id += 1;
            }
        }
        let (_, ex) = read(&part_path(&dir, "exchanges", 2));
        let b = &ex[0];
        let status = b.column(b.schema().index_of("status").unwrap());
        let method = b.column(b.schema().index_of("method").unwrap());
        assert!(status.is_null(0));
        assert_eq!(
            method
                .as_any()
                .downcast_ref::<StringArray>()
                .unwrap()
                .value(0),
            "GET"
        );
    }

    /// Values that do not fit their column are refused naming the table and column: NULL in
    /// a NOT NULL column, text in an INTEGER column; an integer in a REAL column is taken as
    /// SQLite's affinity takes it.
    #[test]
    fn values_that_do_not_fit_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let mut ds = ParquetDataset::create(&tmp.path().join("ds"), 1, 1).unwrap();
        let w = ds.table(ParquetDataset::index("bw_samples").unwrap());
        let e = w.append(0, Cell::Null).unwrap_err().to_string();
        assert!(
            e.contains("bw_samples.conn_id") && e.contains("NULL"),
            "{e}"
        );
        let e = w.append(1, Cell::Text("x")).unwrap_err().to_string();
        assert!(
            e.contains("bw_samples.t_us") && e.contains("INTEGER"),
            "{e}"
        );
        w.append(2, Cell::Integer(5)).unwrap();
    }

    /// A dataset dropped before its commit (a failed or interrupted run) leaves nothing in the
    /// directory: no part file, no temporary directory.
    #[test]
    fn an_uncommitted_dataset_leaves_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ds");
        let mut ds = ParquetDataset::create(&dir, 1, 1).unwrap();
        ds.table(1).push(&conn(1, true)).unwrap();
        drop(ds);
        // the directory it created goes too; one that existed stays, empty
        assert!(!dir.exists());
        std::fs::create_dir(&dir).unwrap();
        let mut ds = ParquetDataset::create(&dir, 1, 1).unwrap();
        ds.table(1).push(&conn(1, true)).unwrap();
        drop(ds);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    }

    /// A commit that cannot put one table in its place replaces none of the shard's earlier
    /// tables (an audit found a run that failed on its last rename with the other tables
    /// already the new run's), and a killed run's temporary directory is removed by the next.
    #[test]
    fn a_failed_commit_keeps_every_earlier_table_and_killed_runs_leave_nothing_for_long() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ds");
        let write = |id: i64| {
            let mut ds = ParquetDataset::create(&dir, 1, 1)?;
            ds.table(1).push(&conn(id, true)).unwrap();
            ds.commit()
        };
        write(1).unwrap();
        let snapshot = || -> Vec<(PathBuf, Vec<u8>)> {
            let mut v: Vec<(PathBuf, Vec<u8>)> = TABLES
                .iter()
                .map(|t| part_path(&dir, t.name, 1))
                .filter(|p| p.is_file())
                .map(|p| (p.clone(), std::fs::read(&p).unwrap()))
                .collect();
            v.sort();
            v
        };
        let before = snapshot();
        assert_eq!(before.len(), TABLES.len());
        // the last table's part is a directory now: nothing is replaced
        let last = part_path(&dir, TABLES.last().unwrap().name, 1);
        std::fs::remove_file(&last).unwrap();
        std::fs::create_dir_all(last.join("x")).unwrap();
        let without_last = || -> Vec<(PathBuf, Vec<u8>)> {
            before.iter().filter(|(p, _)| *p != last).cloned().collect()
        };
        let e = write(2).unwrap_err().to_string();
        assert!(
            e.contains("not a file") && e.contains("nothing was replaced"),
            "{e}"
        );
        assert_eq!(
            snapshot(),
            without_last(),
            "a refused commit replaced some tables"
        );
        // a rename that fails midway (the last table's shard directory is a file): the tables
        // already renamed get their earlier parts back
        let shard_dir = last.parent().unwrap().to_path_buf();
        std::fs::remove_dir_all(&shard_dir).unwrap();
        std::fs::write(&shard_dir, b"not a directory").unwrap();
        assert!(write(3).is_err());
        assert_eq!(
            snapshot(),
            without_last(),
            "a failed commit replaced some tables"
        );
        std::fs::remove_file(&shard_dir).unwrap();
        write(4).unwrap();
        // a killed run's temporary directory (this host, a pid that no longer runs) goes at
        // the next run; one of another host stays unless a week old
        let dead = dir.join(format!("{TMP_PREFIX}1-999999999-5-{}", host_name()));
        let other = dir.join(format!("{TMP_PREFIX}1-999999999-5-another_host"));
        std::fs::create_dir(&dead).unwrap();
        std::fs::create_dir(&other).unwrap();
        write(5).unwrap();
        assert!(!dead.exists(), "a dead run's temporary directory stayed");
        assert!(
            other.exists(),
            "another host's run's temporary directory was removed"
        );
    }

    /// The shards of one run started at once all create the dataset's directory: each one
    /// that finds it made by another in between goes on (a 16-shard run on 16 CPUs failed
    /// with "File exists" before), and every shard's parts land.
    #[test]
    fn shards_started_at_once_share_the_new_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ds");
        let n = 16u32;
        let go = std::sync::Barrier::new(n as usize);
        std::thread::scope(|s| {
            let handles: Vec<_> = (1..=n)
                .map(|k| {
                    let (dir, go) = (&dir, &go);
                    s.spawn(move || {
                        go.wait();
                        let mut ds = ParquetDataset::create(dir, k, n)?;
                        ds.table(1).push(&conn(i64::from(k), true))?;
                        ds.commit()
                    })
                })
                .collect();
            for (k, h) in handles.into_iter().enumerate() {
                h.join()
                    .unwrap()
                    .unwrap_or_else(|e| panic!("shard {}: {e}", k + 1));
            }
        });
        for k in 1..=n {
            assert!(part_path(&dir, "connections", k).is_file(), "shard {k}");
        }
    }

    /// A directory holding a shard of a run of another count is another run's, whatever its
    /// number: refused (shard 1 of a 2-shard run beside a 3-shard run's was taken); the
    /// run's own count is welcome.
    #[test]
    fn a_shard_of_a_run_of_another_count_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ds");
        let meta = ParquetDataset::index("meta").unwrap();
        let mut ds = ParquetDataset::create(&dir, 1, 2).unwrap();
        ds.table(meta)
            .push(&MetaRow {
                key: "shard".into(),
                value: Some("1/2".into()),
            })
            .unwrap();
        ds.commit().unwrap();
        let e = ParquetDataset::create(&dir, 2, 3)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("holds shard=1 of a run of 2 shard(s), and this run has 3"),
            "{e}"
        );
        ParquetDataset::create(&dir, 2, 2)
            .unwrap()
            .commit()
            .unwrap();
    }

    /// A directory holding a shard beyond the run's count is another run's: refused.
    #[test]
    fn a_foreign_shard_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ds");
        ParquetDataset::create(&dir, 3, 4)
            .unwrap()
            .commit()
            .unwrap();
        let e = ParquetDataset::create(&dir, 1, 2)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("shard=3") && e.contains("mix"), "{e}");
        // the other shards of the same run are welcome
        ParquetDataset::create(&dir, 1, 4)
            .unwrap()
            .commit()
            .unwrap();
        let file = tmp.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        let e = ParquetDataset::create(&file, 1, 1)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("not a directory"), "{e}");
    }

    /// A database converted by `export_database` has in each file the rows of its table, with
    /// the NULLs it had; a column of a later migration that the database lacks is NULL.
    #[test]
    fn a_database_exports_every_table() {
        let tmp = tempfile::tempdir().unwrap();
        let c = rusqlite::Connection::open_in_memory().unwrap();
        mimic_core::db::init_schema(&c).unwrap();
        conn(1, true).insert(&c).unwrap();
        conn(2, false).insert(&c).unwrap();
        mimic_core::db::set_meta(&c, "shard", "2/3").unwrap();
        let dir = tmp.path().join("ds");
        let (k, counts) = export_database(&c, Path::new("x.db"), &dir).unwrap();
        assert_eq!(k, 2);
        assert!(counts.contains(&("connections", 2)));
        let (_, b) = read(&part_path(&dir, "connections", 2));
        let rtt = b[0].column(b[0].schema().index_of("min_rtt_us").unwrap());
        assert!(!rtt.is_null(0) && rtt.is_null(1));

        // an older database: its tables not STRICT (as written before them), without
        // community_id
        let c = rusqlite::Connection::open_in_memory().unwrap();
        mimic_core::db::init_schema_not_strict(&c).unwrap();
        conn(1, true).insert(&c).unwrap();
        conn(2, false).insert(&c).unwrap();
        c.execute_batch("ALTER TABLE connections DROP COLUMN community_id;")
            .unwrap();
        let dir = tmp.path().join("old");
        let (k, _) = export_database(&c, Path::new("x.db"), &dir).unwrap();
        assert_eq!(k, 1);
        let (_, b) = read(&part_path(&dir, "connections", 1));
        let cid = b[0].column(b[0].schema().index_of("community_id").unwrap());
        assert_eq!(cid.null_count(), 2);
        // a value of the wrong type is named
        c.execute("UPDATE connections SET client_port = 'x' WHERE id = 1", [])
            .unwrap();
        let e = export_database(&c, Path::new("x.db"), &tmp.path().join("bad"))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("connections.client_port"), "{e}");
        // text that is not UTF-8 is named by its row and shown escaped (not by an offset
        // into the value)
        c.execute_batch(
            "UPDATE connections SET client_port = 40000 WHERE id = 1;
             UPDATE connections SET client_ip = CAST(x'31302eff2e302e31' AS TEXT) WHERE id = 2;",
        )
        .unwrap();
        let e = export_database(&c, Path::new("x.db"), &tmp.path().join("utf8"))
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains(
                "connections.client_ip: row with id = 2 holds text that is not UTF-8: \
                 '10.\\xff.0.1'"
            ),
            "{e}"
        );
    }
}
