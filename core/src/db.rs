//! The versioned SQLite schema and the helpers every part uses to create a database atomically
//! and to open one another part wrote. A migration level is the tables and columns that
//! [`crate::schema`]'s lists give that level ([`crate::schema::schema_sql`]) followed by its
//! file `schemas/NNNN_*.sql` (indexes and views).

use std::path::{Path, PathBuf};
use std::sync::mpsc;

use rusqlite::{Connection, OptionalExtension};

/// Schema files, in order: the hand-written part (indexes, views) of each migration level; the
/// tables and columns of a level come from [`crate::schema`]. A database's migration level
/// (`PRAGMA user_version`, meta `schema_migration`) is the number of the last one applied.
pub const MIGRATIONS: &[(u32, &str)] = &[
    (1, include_str!("../../schemas/0001_init.sql")),
    (2, include_str!("../../schemas/0002_operator.sql")),
    (3, include_str!("../../schemas/0003_community_id.sql")),
    (4, include_str!("../../schemas/0004_bw_source.sql")),
    (5, include_str!("../../schemas/0005_zero_window.sql")),
    (6, include_str!("../../schemas/0006_queue_rwin_max.sql")),
    (7, include_str!("../../schemas/0007_shaper_lead.sql")),
    (8, include_str!("../../schemas/0008_client_reading.sql")),
    (9, include_str!("../../schemas/0009_read_rate_by.sql")),
    (10, include_str!("../../schemas/0010_rwin_profile.sql")),
];
/// The migration level this build writes and brings older databases up to: the last file's.
pub const SCHEMA_LEVEL: u32 = MIGRATIONS[MIGRATIONS.len() - 1].0;
/// The version of the data contract (tables and columns; meta `schema_version`), which every
/// reader checks. Migrations that only add indexes and views (0002) leave it alone, so a
/// database migrated in place stays readable by older builds; neither does one that adds a
/// nullable column at the end (0003, 0004, 0005, 0006, 0007, 0008,
/// 0009, 0010), which readers naming their columns do not see.
pub const SCHEMA_VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("{path}: no such file")]
    NotFound { path: PathBuf },
    #[error("{path}: not an SQLite database")]
    NotSqlite { path: PathBuf },
    #[error("{path}: an SQLite database, but not one mimic wrote (no {missing} table)")]
    NotMimic {
        path: PathBuf,
        missing: &'static str,
    },
    /// A `meta` table of another program's (mimic's has `key` and `value`).
    #[error("{path}: an SQLite database, but not one mimic wrote (its meta table has no {column} column)")]
    ForeignMeta { path: PathBuf, column: &'static str },
    #[error("{path}: schema version {found}, this mimic reads version {supported}")]
    SchemaVersion {
        path: PathBuf,
        found: String,
        supported: u32,
    },
    #[error("{path}: {source}")]
    Sqlite {
        path: PathBuf,
        source: rusqlite::Error,
    },
    /// A write to the database was interrupted and its rollback journal is still beside it:
    /// a reader (read-only) cannot roll it back, and reads nothing until a writer has.
    #[error("{path}: a write to this database was interrupted and its rollback journal ({path}-journal) is still there; the next program that opens it for writing rolls the write back (e.g. `sqlite3 {path} 'PRAGMA quick_check'`), then run this again")]
    HotJournal { path: PathBuf },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// An output that is one of the run's inputs (under any name: the same file).
    #[error("{path}: the output would overwrite an input")]
    OutputIsInput { path: PathBuf },
    /// A value of a type its column does not take (a database changed by hand, or damaged):
    /// every reader would otherwise take it differently (SQL arithmetic reads text as 0).
    #[error("{0}")]
    BadValue(Box<BadValue>),
    #[error("{path}: the {table} table, which the data contract has at this database's schema level ({level}), is missing; the database was changed outside mimic or is damaged")]
    MissingTable {
        path: PathBuf,
        table: &'static str,
        level: u32,
    },
    #[error("{path}: table {table} has no column {column}, which the data contract has at this database's schema level ({level}); the database was changed outside mimic or is damaged")]
    MissingColumn {
        path: PathBuf,
        table: &'static str,
        column: &'static str,
        level: u32,
    },
}

/// A value of a type its column does not take ([`DbError::BadValue`]).
#[derive(Debug, thiserror::Error)]
#[error("{path}: table {table}, row {row}: {column} holds {found}, where the data contract has {expected}; the database was changed outside mimic or is damaged (fix or delete that row)")]
pub struct BadValue {
    pub path: PathBuf,
    pub table: &'static str,
    pub row: String,
    pub column: String,
    pub found: String,
    pub expected: String,
}

/// Applies every migration to an empty database and records the version.
pub fn init_schema(conn: &Connection) -> rusqlite::Result<()> {
    init_schema_tables(conn)?;
    for ix in index_statements() {
        conn.execute_batch(ix)?;
    }
    Ok(())
}

/// The schema as builds before STRICT tables created it (0.x before 2026-12-02): the same
/// tables, columns, indexes and meta, but SQLite does not hold the values to their columns'
/// types. For tests of what readers do with such a database.
#[doc(hidden)]
pub fn init_schema_not_strict(conn: &Connection) -> rusqlite::Result<()> {
    for (n, sql) in MIGRATIONS {
        let sql = migration_sql(*n, sql);
        debug_assert!(sql.contains(") STRICT;") || !sql.contains("CREATE TABLE"));
        conn.execute_batch(&sql.replace(") STRICT;", ");"))?;
    }
    stamp_schema(conn)
}

/// The schema's `CREATE INDEX` statements (one per line in the schema files).
pub fn index_statements() -> Vec<&'static str> {
    MIGRATIONS
        .iter()
        .flat_map(|(_, sql)| sql.lines())
        .filter(|l| l.trim_start().starts_with("CREATE INDEX"))
        .collect()
}

/// Migration `level` as SQL: its generated tables and columns, then its file.
pub fn migration_sql(level: u32, file: &str) -> String {
    format!("{}\n{file}", crate::schema::schema_sql(level))
}

/// Applies the schema without its indexes, for a bulk load that creates them afterwards
/// with [`index_statements`] (much faster than maintaining them row by row).
pub fn init_schema_tables(conn: &Connection) -> rusqlite::Result<()> {
    for (n, sql) in MIGRATIONS {
        let rest: String = sql
            .lines()
            .filter(|l| !l.trim_start().starts_with("CREATE INDEX"))
            .collect::<Vec<_>>()
            .join("\n");
        conn.execute_batch(&migration_sql(*n, &rest))?;
    }
    stamp_schema(conn)
}

/// The level and version marks of a database created at this build's level.
fn stamp_schema(conn: &Connection) -> rusqlite::Result<()> {
    conn.pragma_update(None, "user_version", SCHEMA_LEVEL)?;
    set_meta(conn, "schema_version", &SCHEMA_VERSION.to_string())?;
    set_meta(conn, "schema_migration", &SCHEMA_LEVEL.to_string())?;
    set_meta(conn, "tool", "mimic")?;
    set_meta(conn, "tool_version", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

/// Every row of `table` as one line of text (`Debug` of each value, `|`-separated), ordered by
/// its first two columns: for checking that two databases hold the same content.
pub fn table_rows(conn: &Connection, table: &str) -> rusqlite::Result<Vec<String>> {
    let mut st = conn.prepare(&format!("SELECT * FROM \"{table}\" ORDER BY 1, 2"))?;
    let n = st.column_count();
    let rows = st.query_map([], |r| {
        (0..n)
            .map(|i| r.get_ref(i).map(|v| format!("{v:?}")))
            .collect::<rusqlite::Result<Vec<_>>>()
            .map(|v| v.join("|"))
    })?;
    rows.collect()
}

pub fn set_meta(conn: &Connection, key: &str, value: &str) -> rusqlite::Result<()> {
    conn.execute(
        "INSERT OR REPLACE INTO meta(key, value) VALUES (?1, ?2)",
        (key, value),
    )?;
    Ok(())
}

pub fn get_meta(conn: &Connection, key: &str) -> rusqlite::Result<Option<String>> {
    conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| {
        r.get::<_, Option<String>>(0)
    })
    .optional()
    .map(Option::flatten)
}

/// A database being written: it lives under a temporary name beside its destination and
/// takes the final name only on [`AtomicDb::commit`]. Dropped uncommitted, it is deleted, so an
/// interrupted run leaves the previous result or none, never half of one.
pub struct AtomicDb {
    conn: Option<Connection>,
    /// The temporary file, for the final fsync.
    file: std::fs::File,
    /// Makes what has been written so far durable while the writing goes on (started by the
    /// first [`AtomicDb::start_writeback`]).
    syncer: Option<Syncer>,
    /// File size at the last request to the syncer.
    synced_len: u64,
    /// The temporary file, removed if the process is interrupted meanwhile.
    tmp: crate::interrupt::TempOutput,
    dest: PathBuf,
}

/// Bytes written between background syncs of a database being written.
const SYNC_STEP: u64 = 8 << 20;

/// A thread that fdatasyncs the temporary file whenever asked (requests made while it is
/// syncing fold into one). A sync costs the writer nothing but the request: the thread spends
/// its time waiting for the disk, and the final fsync is left with only what came after.
struct Syncer {
    tx: mpsc::SyncSender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Syncer {
    fn start(file: &std::fs::File) -> std::io::Result<Syncer> {
        let file = file.try_clone()?;
        let (tx, rx) = mpsc::sync_channel::<()>(1);
        let thread = std::thread::Builder::new()
            .name("mimic-dbsync".into())
            .spawn(move || {
                for () in rx {
                    // a failure shows again at the final fsync, which reports it
                    let _ = file.sync_data();
                }
            })?;
        Ok(Syncer { tx, thread })
    }

    /// Waits for the sync under way, if any.
    fn stop(self) {
        drop(self.tx);
        let _ = self.thread.join();
    }
}

impl AtomicDb {
    /// Creates a fresh database with the current schema for `dest`.
    pub fn create(dest: impl AsRef<Path>) -> Result<AtomicDb, DbError> {
        Self::create_with(dest, true)
    }

    /// Like [`AtomicDb::create`]; with `indexes` false the caller runs [`index_statements`]
    /// itself after loading its rows.
    pub fn create_with(dest: impl AsRef<Path>, indexes: bool) -> Result<AtomicDb, DbError> {
        let dest = dest.as_ref().to_path_buf();
        if is_special_file(&dest) {
            return Err(DbError::Io {
                path: dest,
                source: std::io::Error::other("not a regular file (a database needs one)"),
            });
        }
        check_output_dir(&dest)
            .and_then(|_| refuse_replacing_a_capture(&dest))
            .map_err(|source| DbError::Io {
                path: dest.clone(),
                source,
            })?;
        remove_stale_temp_siblings(&dest);
        let held = crate::interrupt::TempOutput::new(temp_sibling(&dest));
        let tmp = held.path();
        let _ = std::fs::remove_file(tmp);
        let sq = |source| DbError::Sqlite {
            path: dest.clone(),
            source,
        };
        // made here rather than by SQLite, whose "unable to open database file" would hide
        // why (a read-only file system, a directory without write permission); SQLite takes an
        // empty file as a new database
        if let Err(source) = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(tmp)
        {
            return Err(DbError::Io { path: dest, source });
        }
        skip_memory_statistics();
        let setup = || -> Result<Connection, rusqlite::Error> {
            let conn = Connection::open(tmp)?;
            // The temporary file is private to this run: trade durability for speed until
            // commit. Large pages: fewer b-tree pages to balance during bulk loads.
            conn.execute_batch("PRAGMA page_size = 65536; PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF; PRAGMA foreign_keys = OFF;")?;
            if indexes {
                init_schema(&conn)?;
            } else {
                init_schema_tables(&conn)?;
            }
            Ok(conn)
        };
        // No AtomicDb exists yet to remove the temporary file when dropped: a failure here (a
        // full disk while the schema is written) removes it itself, or it would stay beside
        // the output (until a later run's sweep) holding the space that ran out.
        let conn = match setup() {
            Ok(conn) => conn,
            Err(e) => {
                let _ = std::fs::remove_file(tmp);
                return Err(sq(e));
            }
        };
        let file = match std::fs::File::open(tmp) {
            Ok(f) => f,
            Err(source) => {
                drop(conn);
                let _ = std::fs::remove_file(tmp);
                return Err(DbError::Io { path: dest, source });
            }
        };
        Ok(AtomicDb {
            conn: Some(conn),
            file,
            syncer: None,
            synced_len: 0,
            tmp: held,
            dest,
        })
    }

    pub fn conn(&self) -> &Connection {
        self.conn.as_ref().expect("connection present until commit")
    }
    pub fn conn_mut(&mut self) -> &mut Connection {
        self.conn.as_mut().expect("connection present until commit")
    }
    pub fn dest(&self) -> &Path {
        &self.dest
    }

    /// Asks for what has been written to the temporary file so far to be made durable in the
    /// background, without waiting, once every [`SYNC_STEP`] bytes: a long bulk load that calls
    /// this now and then leaves little for the fsync in [`AtomicDb::commit`] to wait for
    /// (measured on the analysis benchmark: that fsync took 65-100 ms for the 71 MB database
    /// when all of it was left to the end, 11-21 ms with this).
    pub fn start_writeback(&mut self) {
        let len = self.file.metadata().map_or(0, |m| m.len());
        if len < self.synced_len + SYNC_STEP {
            return;
        }
        self.synced_len = len;
        if self.syncer.is_none() {
            // without the thread, the final fsync does all the work
            self.syncer = Syncer::start(&self.file).ok();
        }
        if let Some(s) = &self.syncer {
            // full: a sync is already asked for and will cover this data too
            let _ = s.tx.try_send(());
        }
    }

    /// Closes the database, flushes it to disk and moves it to its final name.
    pub fn commit(mut self) -> Result<PathBuf, DbError> {
        let conn = self.conn.take().expect("commit once");
        let dest = self.dest.clone();
        if let Some(s) = self.syncer.take() {
            s.stop();
        }
        let io = |source| DbError::Io {
            path: dest.clone(),
            source,
        };
        let done = conn
            .close()
            .map_err(|(_, source)| DbError::Sqlite {
                path: dest.clone(),
                source,
            })
            .and_then(|()| self.file.sync_all().map_err(io))
            .and_then(|()| std::fs::rename(self.tmp.path(), &dest).map_err(io));
        if done.is_err() {
            // a database that cannot take its name is not left behind under the temporary one
            let _ = std::fs::remove_file(self.tmp.path());
        }
        done.map(|()| dest)
    }
}

impl Drop for AtomicDb {
    fn drop(&mut self) {
        if self.conn.take().is_some() {
            let _ = std::fs::remove_file(self.tmp.path());
        }
    }
}

/// Turns off SQLite's memory statistics, which take a global mutex around every allocation it
/// makes (a bulk load makes one or more per row). Works only before SQLite's first use in the
/// process; later it is a no-op.
fn skip_memory_statistics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: SQLITE_CONFIG_MEMSTATUS takes one int; sqlite3_config refuses (SQLITE_MISUSE)
        // once SQLite is initialised, and no other thread can be initialising it through this
        // function at the same time (Once).
        unsafe {
            rusqlite::ffi::sqlite3_config(
                rusqlite::ffi::SQLITE_CONFIG_MEMSTATUS,
                0 as std::ffi::c_int,
            );
        }
    });
}

/// `dir/.name.tmp-PID` beside `dest`.
pub fn temp_sibling(dest: &Path) -> PathBuf {
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "out".into());
    dest.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

/// A file that holds data an output must not replace: what [`data_file_kind`] finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataFile {
    /// pcap (either byte order, micro- or nanosecond), pcapng, or gzip (a compressed trace).
    Capture,
    /// An SQLite database (a flows.db, a replay.db).
    Sqlite,
}

impl DataFile {
    /// What the file is, for an error message.
    pub fn describe(self) -> &'static str {
        match self {
            DataFile::Capture => "a capture file (pcap, pcapng or gzip)",
            DataFile::Sqlite => "an SQLite database",
        }
    }
}

/// The first 16 bytes of every SQLite database file.
const SQLITE_HEADER: &[u8; 16] = b"SQLite format 3\0";

/// Whether `path` is an existing regular file that holds a capture or a database, by its first
/// bytes; None for anything else (or nothing there).
pub fn data_file_kind(path: &Path) -> Option<DataFile> {
    // looked at before opening: opening a FIFO to read would wait for a writer
    if !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
        return None;
    }
    let mut f = std::fs::File::open(path).ok()?;
    let mut head = [0u8; 16];
    let n = crate::trace::read_up_to(&mut f, &mut head).ok()?;
    let head = &head[..n];
    if head == SQLITE_HEADER {
        return Some(DataFile::Sqlite);
    }
    let capture = matches!(
        head.get(..4),
        Some(
            [0xa1, 0xb2, 0xc3, 0xd4]
                | [0xd4, 0xc3, 0xb2, 0xa1]
                | [0xa1, 0xb2, 0x3c, 0x4d]
                | [0x4d, 0x3c, 0xb2, 0xa1]
                | [0x0a, 0x0d, 0x0d, 0x0a]
        )
    ) || head.starts_with(&[0x1f, 0x8b]);
    capture.then_some(DataFile::Capture)
}

/// The error that refuses to replace a file of `kind` with `what`.
fn refusal(kind: DataFile, what: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::AlreadyExists,
        format!(
            "is {}, not replacing it with {what}: name the file to write",
            kind.describe()
        ),
    )
}

/// Refuses to replace a capture or a database with a text output (an export, a report):
/// `-o` given a trace's or a database's name by mistake would otherwise destroy it. `what`
/// names the output ("a CSV export").
pub fn refuse_replacing_data(dest: &Path, what: &str) -> std::io::Result<()> {
    match data_file_kind(dest) {
        Some(kind) => Err(refusal(kind, what)),
        None => Ok(()),
    }
}

/// Refuses to replace a capture file (pcap, pcapng, gzip) with a database: `-o` given a
/// trace's name by mistake would otherwise destroy the trace. (A database replaces the
/// previous database of that name: that is what `-o flows.db` run twice means.)
fn refuse_replacing_a_capture(dest: &Path) -> std::io::Result<()> {
    match data_file_kind(dest) {
        Some(DataFile::Capture) => Err(refusal(DataFile::Capture, "a database")),
        _ => Ok(()),
    }
}

/// Removes the temporary siblings of `dest` ([`temp_sibling`]) that killed runs left: made by
/// a process that no longer runs here and not written to for ten minutes (a run on another
/// host writing into a shared directory keeps its file fresh).
fn remove_stale_temp_siblings(dest: &Path) {
    let Some(name) = dest.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return;
    };
    let dir = match dest.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let prefix = format!(".{name}.tmp-");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let file = e.file_name();
        let Some(pid) = file
            .to_str()
            .and_then(|f| f.strip_prefix(&prefix))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let running = i32::try_from(pid).is_ok_and(crate::process::running);
        let quiet = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > std::time::Duration::from_secs(600));
        if !running && quiet && e.file_type().is_ok_and(|t| t.is_file()) {
            tracing::info!(
                "{}: removing a killed run's temporary file",
                e.path().display()
            );
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// The directories that `create_dir_all(dir)` would make: `dir` and its ancestors that do not
/// exist, deepest first (the order to remove them in, when a run that made them fails).
pub fn missing_dirs(dir: &Path) -> Vec<PathBuf> {
    dir.ancestors()
        .filter(|a| !a.as_os_str().is_empty())
        .take_while(|a| !a.exists())
        .map(Path::to_path_buf)
        .collect()
}

/// Whether `dest` exists and is neither a regular file nor a directory: a device such as
/// `/dev/null` or `/dev/stdout`, a FIFO, a socket. Renaming a temporary file over it would
/// replace the device with a file, so such an output is written in place (or refused where
/// only a file will do).
pub fn is_special_file(dest: &Path) -> bool {
    std::fs::metadata(dest).is_ok_and(|m| !m.is_file() && !m.is_dir())
}

/// Checks that the directory an output goes into exists: before a run's work, so that it does
/// not fail at its end, or after writing its other outputs, naming a temporary file.
pub fn check_output_dir(dest: &Path) -> std::io::Result<()> {
    let parent = match dest.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if parent.is_dir() {
        Ok(())
    } else {
        Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("no such directory: {}", parent.display()),
        ))
    }
}

/// Checks a database output before a run's work, so that the run does not fail at its end
/// (or, renaming its result into place, replace what it must not): refuses an output that is
/// one of `inputs` under any name, a directory, a device or FIFO (a rename would replace
/// `/dev/null` with a file), a capture, or one in a directory that does not exist.
pub fn check_db_output(dest: &Path, inputs: &[&Path]) -> Result<(), DbError> {
    let io = |source| DbError::Io {
        path: dest.to_path_buf(),
        source,
    };
    refuse_an_input(dest, inputs)?;
    if let Ok(out) = std::fs::metadata(dest) {
        if out.is_dir() {
            return Err(io(std::io::Error::other("is a directory")));
        }
        if !out.is_file() {
            return Err(io(std::io::Error::other(
                "not a regular file (a database needs one)",
            )));
        }
    }
    check_output_dir(dest)
        .and_then(|_| refuse_replacing_a_capture(dest))
        .map_err(io)
}

/// Refuses an output `dest` that is one of `inputs` under any name (a symlink, a hard link,
/// `./`: the same device and inode), which its final rename would destroy.
pub fn refuse_an_input(dest: &Path, inputs: &[&Path]) -> Result<(), DbError> {
    use std::os::unix::fs::MetadataExt;
    let Ok(out) = std::fs::metadata(dest) else {
        return Ok(());
    };
    match inputs
        .iter()
        .find(|p| std::fs::metadata(p).is_ok_and(|m| (m.dev(), m.ino()) == (out.dev(), out.ino())))
    {
        Some(p) => Err(DbError::OutputIsInput {
            path: p.to_path_buf(),
        }),
        None => Ok(()),
    }
}

/// Writes a file atomically: a temporary sibling, fsync, rename ([`StagedFile`]). A device or
/// FIFO ([`is_special_file`]) is written in place instead.
pub fn write_atomic(dest: impl AsRef<Path>, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dest = dest.as_ref();
    check_output_dir(dest)?;
    let mut f = StagedFile::create(dest)?;
    f.writer().write_all(bytes)?;
    f.commit()
}

/// A file written under its temporary sibling ([`temp_sibling`]) and renamed over its
/// destination only when complete, so that the destination holds the previous file or the
/// whole new one, never part of one. Dropped before [`StagedFile::commit`] (or failing in it),
/// the temporary file is removed, and so it is if the process is interrupted meanwhile
/// ([`crate::interrupt`]). A device or FIFO (`/dev/null`, `/dev/stdout`) is written in place:
/// renaming over it would replace it. The one writer behind `write_atomic`, export's files and
/// compare's outputs.
pub struct StagedFile {
    out: Option<std::io::BufWriter<std::fs::File>>,
    /// None when writing in place.
    tmp: Option<crate::interrupt::TempOutput>,
    dest: PathBuf,
}

impl StagedFile {
    /// Opens the temporary sibling of `dest` (or `dest` itself, a device or FIFO) for writing.
    /// The caller has checked `dest`'s directory ([`check_output_dir`]).
    pub fn create(dest: &Path) -> std::io::Result<StagedFile> {
        let (f, tmp) = if is_special_file(dest) {
            (std::fs::File::options().write(true).open(dest)?, None)
        } else {
            let tmp = crate::interrupt::TempOutput::new(temp_sibling(dest));
            (std::fs::File::create(tmp.path())?, Some(tmp))
        };
        Ok(StagedFile {
            out: Some(std::io::BufWriter::with_capacity(1 << 16, f)),
            tmp,
            dest: dest.to_path_buf(),
        })
    }

    pub fn writer(&mut self) -> &mut std::io::BufWriter<std::fs::File> {
        self.out.as_mut().expect("writer present until finished")
    }

    pub fn dest(&self) -> &Path {
        &self.dest
    }

    /// Flushes what was written and makes the temporary file durable, leaving the rename to
    /// [`StagedFile::commit`] (for outputs put in place together once all are written).
    pub fn finish(&mut self) -> std::io::Result<()> {
        if let Some(out) = self.out.take() {
            let f = out.into_inner().map_err(|e| e.into_error())?;
            if self.tmp.is_some() {
                f.sync_all()?;
            }
        }
        Ok(())
    }

    /// [`StagedFile::finish`], then renames the file over its destination.
    pub fn commit(mut self) -> std::io::Result<()> {
        self.finish()?;
        if let Some(tmp) = &self.tmp {
            // a failed rename leaves `tmp` set, for Drop to remove the file
            std::fs::rename(tmp.path(), &self.dest)?;
        }
        self.tmp = None;
        Ok(())
    }
}

impl Drop for StagedFile {
    fn drop(&mut self) {
        // not committed (or the rename failed): nothing half-written left behind
        if let Some(tmp) = &self.tmp {
            let _ = std::fs::remove_file(tmp.path());
        }
    }
}

/// The name to give SQLite for `path`: a relative path that starts with `file:` would be
/// taken for an SQLite URI (`file:s2.db` then fails to open, or opens something else), so it
/// gets a leading `./`.
pub fn sqlite_name(path: &Path) -> std::borrow::Cow<'_, Path> {
    if path.is_relative() && path.as_os_str().as_encoded_bytes().starts_with(b"file:") {
        std::borrow::Cow::Owned(Path::new(".").join(path))
    } else {
        std::borrow::Cow::Borrowed(path)
    }
}

/// How the readers open a database: without SQLite's per-connection mutex, which its default
/// (serialized) mode takes on every column read; a rusqlite `Connection` is used by one
/// thread at a time anyway (it is not `Sync`). Reading `exchanges` whole took 19% of
/// `mimic compare`'s time in that mutex.
const READ_ONLY: rusqlite::OpenFlags =
    rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY.union(rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX);
const READ_WRITE: rusqlite::OpenFlags =
    rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE.union(rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX);

/// Opens a database some part of mimic wrote, read-only, and checks that it is one and that
/// its schema version is the one this build reads.
pub fn open_existing(path: impl AsRef<Path>) -> Result<Connection, DbError> {
    let path = path.as_ref().to_path_buf();
    if !path.exists() {
        return Err(DbError::NotFound { path });
    }
    // a FIFO, a socket or a device would block the open below (a FIFO until something writes
    // into it) or hand SQLite something it cannot page through: only a regular file is a
    // database (a link to one is fine)
    if !std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
        return Err(DbError::Io {
            source: std::io::Error::other(if path.is_dir() {
                "is a directory"
            } else {
                "not a regular file (a database needs one)"
            }),
            path,
        });
    }
    let mut header = [0u8; 16];
    {
        use std::io::Read;
        let mut f = std::fs::File::open(&path).map_err(|source| DbError::Io {
            path: path.clone(),
            source,
        })?;
        let n = f.read(&mut header).map_err(|source| DbError::Io {
            path: path.clone(),
            source,
        })?;
        if n < 16 || &header != SQLITE_HEADER {
            return Err(DbError::NotSqlite { path });
        }
    }
    let conn = Connection::open_with_flags(sqlite_name(&path), READ_ONLY).map_err(|source| {
        DbError::Sqlite {
            path: path.clone(),
            source,
        }
    })?;
    for table in ["meta", "connections"] {
        let exists: bool = conn
            .query_row(
                "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = ?1",
                [table],
                |r| r.get(0),
            )
            .map_err(|source| {
                // the first read: where a hot journal shows (SQLITE_READONLY_ROLLBACK)
                let hot = source.sqlite_error().map(|e| e.extended_code)
                    == Some(rusqlite::ffi::SQLITE_READONLY_ROLLBACK);
                if hot {
                    DbError::HotJournal { path: path.clone() }
                } else {
                    DbError::Sqlite {
                        path: path.clone(),
                        source,
                    }
                }
            })?;
        if !exists {
            return Err(DbError::NotMimic {
                path,
                missing: if table == "meta" {
                    "meta"
                } else {
                    "connections"
                },
            });
        }
    }
    // another program's meta table would fail every read of it with SQL's own words
    for column in ["key", "value"] {
        let has: bool = conn
            .query_row(
                "SELECT count(*) > 0 FROM pragma_table_info('meta') WHERE name = ?1",
                [column],
                |r| r.get(0),
            )
            .map_err(|source| DbError::Sqlite {
                path: path.clone(),
                source,
            })?;
        if !has {
            return Err(DbError::ForeignMeta { path, column });
        }
    }
    let version = get_meta(&conn, "schema_version").map_err(|source| DbError::Sqlite {
        path: path.clone(),
        source,
    })?;
    match version.as_deref() {
        Some(v) if v == SCHEMA_VERSION.to_string() => {
            let conn = bring_up_to_date(conn, &path)?;
            check_value_types(&conn, &path)?;
            Ok(conn)
        }
        Some(v) => Err(DbError::SchemaVersion {
            path,
            found: v.to_string(),
            supported: SCHEMA_VERSION,
        }),
        None => Err(DbError::SchemaVersion {
            path,
            found: "none".into(),
            supported: SCHEMA_VERSION,
        }),
    }
}

/// Checks that every value of every table of the data contract has its column's type (REAL
/// columns take integers too), and NULL only where the column allows it: one scan of each
/// table, stopping at the first row that does not. The first bad row is named by its key. Every
/// table and column the contract has at the database's schema level must be there.
///
/// A table SQLite already holds to that (see [`enforced_by_sqlite`]: the `STRICT` tables this
/// build creates) is not scanned: on the 2.3 M-frame benchmark's database the scans took 87% of
/// `mimic export`'s instructions.
pub fn check_value_types(conn: &Connection, path: &Path) -> Result<(), DbError> {
    use crate::schema::{SqlType, TABLES};
    let sq = |source| DbError::Sqlite {
        path: path.to_path_buf(),
        source,
    };
    let level = schema_level(conn).map_err(sq)?;
    for t in TABLES {
        let present: Vec<String> = {
            let mut st = conn
                .prepare("SELECT name FROM pragma_table_info(?1)")
                .map_err(sq)?;
            let rows = st.query_map([t.name], |r| r.get(0)).map_err(sq)?;
            rows.collect::<Result<_, _>>().map_err(sq)?
        };
        // what the contract has at the database's level must be there (a table or column
        // dropped or renamed by hand fails every reader differently otherwise)
        if t.since <= level {
            if present.is_empty() {
                return Err(DbError::MissingTable {
                    path: path.to_path_buf(),
                    table: t.name,
                    level,
                });
            }
            if let Some(c) = t
                .columns
                .iter()
                .find(|c| c.since <= level && !present.iter().any(|p| p == c.name))
            {
                return Err(DbError::MissingColumn {
                    path: path.to_path_buf(),
                    table: t.name,
                    column: c.name,
                    level,
                });
            }
        }
        let cols: Vec<_> = t
            .columns
            .iter()
            .filter(|c| present.iter().any(|p| p == c.name))
            .collect();
        if cols.is_empty() || enforced_by_sqlite(conn, t.name, &cols).map_err(sq)? {
            continue;
        }
        let allowed = |c: &crate::schema::Column| {
            let mut a = match c.sql_type {
                SqlType::Integer => vec!["'integer'"],
                SqlType::Real => vec!["'real'", "'integer'"],
                SqlType::Text => vec!["'text'"],
            };
            if c.nullable() {
                a.push("'null'");
            }
            a.join(", ")
        };
        let ok: Vec<String> = cols
            .iter()
            .map(|c| format!("typeof({}) IN ({})", c.name, allowed(c)))
            .collect();
        let which: String = cols
            .iter()
            .zip(&ok)
            .map(|(c, ok)| format!(" WHEN NOT ({ok}) THEN '{}'", c.name))
            .collect();
        let value: String = cols
            .iter()
            .zip(&ok)
            .map(|(c, ok)| {
                format!(
                    " WHEN NOT ({ok}) THEN typeof({0}) || ' ' || substr(quote({0}), 1, 40)",
                    c.name
                )
            })
            .collect();
        // the row's key: its id, or its first two columns (conn_id, seq)
        let key: Vec<&str> = if cols[0].name == "id" {
            vec![cols[0].name]
        } else {
            cols.iter().take(2).map(|c| c.name).collect()
        };
        let key_sql: Vec<String> = key
            .iter()
            .map(|k| format!("'{k}=' || quote({k})"))
            .collect();
        let sql = format!(
            "SELECT {}, CASE{which} END, CASE{value} END FROM {} WHERE NOT ({}) LIMIT 1",
            key_sql.join(" || ', ' || "),
            t.name,
            ok.join(" AND ")
        );
        let bad: Option<(String, String, String)> = conn
            .query_row(&sql, [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .optional()
            .map_err(sq)?;
        if let Some((row, column, found)) = bad {
            let c = cols
                .iter()
                .find(|c| c.name == column)
                .expect("a checked column");
            return Err(DbError::BadValue(Box::new(BadValue {
                path: path.to_path_buf(),
                table: t.name,
                row,
                column,
                found,
                expected: c.expected(),
            })));
        }
    }
    Ok(())
}

/// Whether SQLite itself refuses, from any writer, every value of `table` that
/// [`check_value_types`] would find: the table is `STRICT` (SQLite stores nothing but the
/// declared type or NULL in a column of a STRICT table, and converts an integer written to a
/// REAL column), each of `cols` is declared with the contract's type, and each column the
/// contract holds non-NULL is declared `NOT NULL` or is part of the primary key (NOT NULL in a
/// STRICT table), with the contract's DEFAULT. A table of a database written before (not
/// STRICT) or changed by hand (its type, NOT NULL or default changed) is scanned.
pub fn enforced_by_sqlite(
    conn: &Connection,
    table: &str,
    cols: &[&crate::schema::Column],
) -> rusqlite::Result<bool> {
    let strict: Option<bool> = conn
        .query_row(
            "SELECT strict FROM pragma_table_list WHERE schema = 'main' AND name = ?1",
            [table],
            |r| r.get(0),
        )
        .optional()?;
    if strict != Some(true) {
        return Ok(false);
    }
    let mut st = conn.prepare(
        "SELECT name, type, \"notnull\", dflt_value, pk FROM pragma_table_info(?1, 'main')",
    )?;
    type Declared = (String, String, bool, Option<String>, i64);
    let declared: Vec<Declared> = st
        .query_map([table], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    Ok(cols.iter().all(|c| {
        declared.iter().any(|(name, ty, not_null, default, pk)| {
            name == c.name
                && ty.eq_ignore_ascii_case(c.sql_type.as_str())
                && (c.nullable() || *not_null || *pk > 0)
                // SQLite (3.40 at least) does not check the DEFAULT that `ALTER TABLE … ADD
                // COLUMN` gives the rows already there against a STRICT column's type
                && default.as_deref() == c.default
        })
    }))
}

/// A database's migration level: `PRAGMA user_version` (set by every writer since the first
/// schema; a level-1 database without it is treated as level 1).
pub fn schema_level(conn: &Connection) -> rusqlite::Result<u32> {
    let v: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    Ok(v.clamp(1, u32::MAX as i64) as u32)
}

/// Applies the migrations after `conn`'s level to it in one transaction, and records the new
/// level. Returns the migrations applied.
pub fn migrate(conn: &Connection) -> rusqlite::Result<Vec<u32>> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let run = || -> rusqlite::Result<Vec<u32>> {
        // read inside the transaction: another process may have migrated it meanwhile
        let level = schema_level(conn)?;
        let mut applied = Vec::new();
        for (n, sql) in MIGRATIONS.iter().filter(|(n, _)| *n > level) {
            conn.execute_batch(&migration_sql(*n, sql))?;
            applied.push(*n);
        }
        if !applied.is_empty() {
            conn.pragma_update(None, "user_version", SCHEMA_LEVEL)?;
            set_meta(conn, "schema_migration", &SCHEMA_LEVEL.to_string())?;
        }
        Ok(applied)
    };
    match run() {
        Ok(applied) => {
            conn.execute_batch("COMMIT")?;
            Ok(applied)
        }
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// The `SELECT` of the data contract's view `name` (its `CREATE VIEW` in the migration files,
/// without the final `;`), for readers whose output must not follow a view redefined in the
/// database (`mimic export` puts it in a `WITH` clause). `None`: no such view.
pub fn view_select(name: &str) -> Option<&'static str> {
    let head = format!("CREATE VIEW IF NOT EXISTS {name} AS");
    MIGRATIONS.iter().rev().find_map(|(_, sql)| {
        let at = sql.find(&head)? + head.len();
        let body = &sql[at..];
        // a view's statement ends at the first `;` that ends a line (none inside a string)
        let end = body.find(";\n").or_else(|| body.rfind(';'))?;
        Some(body[..end].trim())
    })
}

/// Creates the views of the migrations after `conn`'s level as TEMP views, visible to this
/// connection only: how a database that may not be written is read with the current names.
/// (Columns a later migration adds cannot be added this way: a reader of such a column needs
/// the database migrated.)
pub fn add_temp_views(conn: &Connection) -> rusqlite::Result<()> {
    let level = schema_level(conn)?;
    for (_, sql) in MIGRATIONS.iter().filter(|(n, _)| *n > level) {
        // (columns cannot be added to a database that may not be written: read without them)
        let views: String = sql
            .lines()
            .filter(|l| {
                let l = l.trim_start();
                !l.starts_with("CREATE INDEX") && !l.starts_with("ALTER TABLE")
            })
            .collect::<Vec<_>>()
            .join("\n")
            .replace(
                "CREATE VIEW IF NOT EXISTS",
                "CREATE TEMP VIEW IF NOT EXISTS",
            );
        conn.execute_batch(&views)?;
    }
    Ok(())
}

/// Brings a database of the current contract version, opened read-only, up to this build's
/// migration level: in place when the file may be written (the indexes then serve every later
/// reader too), else with TEMP views for this connection alone.
fn bring_up_to_date(conn: Connection, path: &Path) -> Result<Connection, DbError> {
    bring_up_to_date_waiting(conn, path, std::time::Duration::from_secs(5))
}

/// [`bring_up_to_date`], waiting at most `busy` for another process's write lock.
fn bring_up_to_date_waiting(
    conn: Connection,
    path: &Path,
    busy: std::time::Duration,
) -> Result<Connection, DbError> {
    let sq = |source| DbError::Sqlite {
        path: path.to_path_buf(),
        source,
    };
    let level = schema_level(&conn).map_err(sq)?;
    if level >= SCHEMA_LEVEL {
        return Ok(conn);
    }
    drop(conn);
    let t0 = std::time::Instant::now();
    let in_place = Connection::open_with_flags(sqlite_name(path), READ_WRITE).and_then(|rw| {
        rw.busy_timeout(busy)?;
        migrate(&rw)
    });
    let conn = Connection::open_with_flags(sqlite_name(path), READ_ONLY).map_err(sq)?;
    match in_place {
        Ok(applied) => tracing::info!(
            path = %path.display(),
            ?applied,
            seconds = t0.elapsed().as_secs_f64(),
            "database brought up to schema migration {SCHEMA_LEVEL} (indexes and views added)"
        ),
        Err(e) => {
            tracing::info!(
                path = %path.display(),
                "database left at schema migration {level} ({e}): reading it with temporary views and without the newer indexes"
            );
            add_temp_views(&conn).map_err(sq)?;
        }
    }
    Ok(conn)
}

#[cfg(test)]
mod tests {
    use super::StagedFile;

    /// A staged file whose rename fails (a directory of its name) leaves no temporary; one
    /// committed leaves only its destination.
    #[test]
    fn a_staged_file_leaves_no_temporary_behind() {
        use std::io::Write;
        let d = tempfile::tempdir().unwrap();
        let dir_dest = d.path().join("taken");
        std::fs::create_dir(&dir_dest).unwrap();
        let mut f = StagedFile::create(&dir_dest).unwrap();
        f.writer().write_all(b"x").unwrap();
        assert!(f.commit().is_err());
        let ok = d.path().join("ok");
        let mut f = StagedFile::create(&ok).unwrap();
        f.writer().write_all(b"y").unwrap();
        f.commit().unwrap();
        let mut names: Vec<String> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["ok", "taken"]);
        assert_eq!(std::fs::read(&ok).unwrap(), b"y");
    }

    use super::*;

    /// A temporary folder for one test's databases.
    fn tempdir() -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix("mimic-db-")
            .tempdir()
            .unwrap()
    }

    /// A database never replaces a capture; a killed run's temporary file is removed by the
    /// next run (not one of a process that runs, nor a fresh one); a table or column the
    /// contract has at the database's level, gone, is named.
    #[test]
    fn outputs_spare_captures_and_sweep_killed_runs_and_readers_name_missing_columns() {
        let tmp = tempdir();
        let dir = tmp.path();
        for magic in [
            &[0xd4u8, 0xc3, 0xb2, 0xa1][..],
            &[0x0a, 0x0d, 0x0d, 0x0a],
            &[0x1f, 0x8b, 0x08, 0x00],
        ] {
            let cap = dir.join("trace.pcap");
            std::fs::write(&cap, [magic, &[0u8; 40][..]].concat()).unwrap();
            let e = AtomicDb::create(&cap).err().unwrap().to_string();
            assert!(e.contains("is a capture file"), "{e}");
            assert_eq!(
                &std::fs::read(&cap).unwrap()[..4],
                magic,
                "the capture was replaced"
            );
        }

        let dest = dir.join("flows.db");
        // pid 1 (init) runs; 999999999 and 999999998 do not
        let dead = dir.join(".flows.db.tmp-999999999");
        let fresh = dir.join(".flows.db.tmp-999999998");
        let live = dir.join(".flows.db.tmp-1");
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        for f in [&dead, &fresh, &live] {
            std::fs::write(f, b"half a database").unwrap();
            if f != &fresh {
                std::fs::File::options()
                    .write(true)
                    .open(f)
                    .unwrap()
                    .set_modified(old)
                    .unwrap();
            }
        }
        let db = AtomicDb::create(&dest).unwrap();
        set_meta(db.conn(), "role", "original").unwrap();
        db.commit().unwrap();
        assert!(!dead.exists(), "a killed run's temporary file stayed");
        assert!(fresh.exists(), "a fresh temporary file was removed");
        assert!(
            live.exists(),
            "a running process's temporary file was removed"
        );

        open_existing(&dest).unwrap();
        let rw = Connection::open(&dest).unwrap();
        rw.execute_batch("ALTER TABLE connections RENAME COLUMN client_ip TO client_addr")
            .unwrap();
        drop(rw);
        let e = open_existing(&dest).err().unwrap().to_string();
        assert!(
            e.contains("table connections has no column client_ip"),
            "{e}"
        );
        let rw = Connection::open(&dest).unwrap();
        rw.execute_batch(
            "ALTER TABLE connections RENAME COLUMN client_addr TO client_ip; DROP TABLE exchanges;",
        )
        .unwrap();
        drop(rw);
        let e = open_existing(&dest).err().unwrap().to_string();
        assert!(
            e.contains(
                "the exchanges table, which the data contract has at this database's schema level"
            ) && e.contains("is missing")
                && !e.contains("not one mimic wrote"),
            "{e}"
        );

        // another program's database with tables of these names: named as not mimic's, not
        // with SQL's "no such column: value"
        let foreign = dir.join("foreign.db");
        Connection::open(&foreign)
            .unwrap()
            .execute_batch("CREATE TABLE meta(k, v); CREATE TABLE connections(x);")
            .unwrap();
        let e = open_existing(&foreign).err().unwrap().to_string();
        assert!(
            e.contains("foreign.db: an SQLite database, but not one mimic wrote (its meta table has no key column)"),
            "{e}"
        );
        // a FIFO would block the open until something wrote into it
        let fifo = dir.join("fifo.db");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo reads a NUL-terminated path that lives across the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = open_existing(&fifo).err().unwrap().to_string();
        assert!(
            e.contains("fifo.db: not a regular file (a database needs one)"),
            "{e}"
        );
    }

    /// Each view of the contract has its SELECT, which gives what the view gives.
    #[test]
    fn view_selects_are_the_views() {
        let c = Connection::open_in_memory().unwrap();
        init_schema(&c).unwrap();
        c.execute_batch(
            "INSERT INTO connections (id, client_ip, client_port, server_ip, server_port, ip_version, t_first, t_end, complete, server_by, rtt_samples, syn_retx, synack_retx, zero_window, data_pkts_down, data_bytes_down, retx_down, spurious_retx_down, data_pkts_up, data_bytes_up, retx_up, fin_retx, zwnd_probes, dup_frames, bw_samples, delack_policy, termination, exchanges, holes_down, holes_up, frames)
             VALUES (1, '10.0.0.1', 40000, '10.0.0.2', 80, 4, 1000000, 2000000, 1, 'syn', 0, 0, 0, 0, 1, 100, 0, 0, 1, 50, 0, 0, 0, 0, 0, 'none', 'fin', 1, 0, 0, 4)",
        )
        .unwrap();
        for view in ["conn_summary", "conn_class", "class_summary"] {
            let select = view_select(view).unwrap();
            assert!(
                !select.contains(';')
                    && (select.starts_with("SELECT") || select.starts_with("WITH")),
                "{view}: {select}"
            );
            let rows = |sql: &str| -> Vec<String> {
                let mut st = c.prepare(sql).unwrap();
                let n = st.column_count();
                st.query_map([], |r| {
                    Ok((0..n)
                        .map(|i| format!("{:?}", r.get_ref(i).unwrap()))
                        .collect::<Vec<_>>()
                        .join("|"))
                })
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap()
            };
            let want = rows(&format!("SELECT * FROM {view}"));
            assert_eq!(want.len(), 1, "{view}");
            assert_eq!(
                rows(&format!("WITH v AS ({select}) SELECT * FROM v")),
                want,
                "{view}"
            );
        }
        assert!(view_select("no_such_view").is_none());
    }

    #[test]
    fn a_database_left_with_a_hot_journal_is_named_with_what_to_do() {
        let tmp = tempdir();
        let dest = tmp.path().join("flows.db");
        let db = AtomicDb::create(&dest).unwrap();
        set_meta(db.conn(), "role", "original").unwrap();
        db.commit().unwrap();
        // a writer killed mid-transaction, after its cache spilled (the journal synced, its
        // header written, pages of the database already changed): the two files as they
        // were then
        let w = Connection::open(&dest).unwrap();
        w.execute_batch(
            "PRAGMA journal_mode = DELETE; CREATE TABLE pad(x); PRAGMA cache_size = 1;
             BEGIN EXCLUSIVE; UPDATE meta SET value = 'x' WHERE key = 'role';
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 400)
             INSERT INTO pad SELECT randomblob(2000) FROM n;",
        )
        .unwrap();
        let journal = tmp.path().join("flows.db-journal");
        let head = std::fs::read(&journal).expect("a journal during the transaction");
        assert!(
            head.len() > 8 && head[..8] != [0; 8],
            "the journal's header is not written yet"
        );
        let crashed = tmp.path().join("crashed.db");
        std::fs::copy(&dest, &crashed).unwrap();
        std::fs::copy(&journal, tmp.path().join("crashed.db-journal")).unwrap();
        w.execute_batch("ROLLBACK").unwrap();
        drop(w);
        let e = open_existing(&crashed).unwrap_err();
        assert!(matches!(e, DbError::HotJournal { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(
            msg.starts_with(&format!(
                "{}: a write to this database was interrupted",
                crashed.display()
            )),
            "{msg}"
        );
        // once a writer has rolled it back, it reads as before
        Connection::open(&crashed)
            .unwrap()
            .execute_batch("PRAGMA quick_check")
            .unwrap();
        let c = open_existing(&crashed).unwrap();
        assert_eq!(get_meta(&c, "role").unwrap().as_deref(), Some("original"));
    }

    #[test]
    fn atomic_create_commit_and_reopen() {
        let tmp = tempdir();
        let dir = tmp.path();
        let dest = dir.join("flows.db");
        {
            let db = AtomicDb::create(&dest).unwrap();
            set_meta(db.conn(), "role", "original").unwrap();
            // dropped without commit: nothing at the destination, no temporary left
        }
        assert!(!dest.exists());
        assert!(!temp_sibling(&dest).exists());
        let db = AtomicDb::create(&dest).unwrap();
        set_meta(db.conn(), "role", "original").unwrap();
        db.commit().unwrap();
        let c = open_existing(&dest).unwrap();
        assert_eq!(get_meta(&c, "role").unwrap().as_deref(), Some("original"));
        assert_eq!(
            get_meta(&c, "schema_version").unwrap().as_deref(),
            Some("1")
        );
        assert_eq!(
            get_meta(&c, "schema_migration").unwrap().as_deref(),
            Some("10")
        );
        assert_eq!(schema_level(&c).unwrap(), SCHEMA_LEVEL);
        assert_eq!(index_statements().len(), 3);
        let n: i64 = c.query_row("SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name NOT LIKE 'sqlite_%'", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 3);
        drop(c);

        let junk = dir.join("junk.db");
        std::fs::write(&junk, b"not a database at all, just text").unwrap();
        assert!(matches!(
            open_existing(&junk),
            Err(DbError::NotSqlite { .. })
        ));
        let other = dir.join("other.db");
        Connection::open(&other)
            .unwrap()
            .execute_batch("CREATE TABLE t(x)")
            .unwrap();
        assert!(matches!(
            open_existing(&other),
            Err(DbError::NotMimic { .. })
        ));
    }

    /// The first schema as it was written by hand, before the tables came from the column
    /// lists: what databases of level 1 were created with.
    const SCHEMA1_AS_WRITTEN: &str = include_str!("../testdata/schema1.sql");

    /// A database as the first schema's writers left it: 0001 only, level 1, one connection
    /// with an RTT sample.
    fn schema1_db(path: &Path) {
        let c = Connection::open(path).unwrap();
        c.execute_batch(SCHEMA1_AS_WRITTEN).unwrap();
        c.pragma_update(None, "user_version", 1).unwrap();
        set_meta(&c, "schema_version", "1").unwrap();
        c.execute_batch(
            "INSERT INTO connections (id, client_ip, client_port, server_ip, server_port, ip_version, t_first, t_end,
               complete, server_by, min_rtt_us, rtt_samples, bw_bps, termination)
             VALUES (1, '2001:db8::1', 40000, '192.0.2.1', 443, 6, 1700000000123456, 1700000001123456, 1, 'syn',
               12345, 1, 1.5e6, 'fin');
             INSERT INTO rtt_samples VALUES (1, 1700000000200000, 12345, 'data');
             INSERT INTO exchanges (conn_id, seq, req_bytes, resp_bytes) VALUES (1, 0, 100, 2000);",
        )
        .unwrap();
    }

    fn objects(c: &Connection) -> Vec<String> {
        let mut st = c
            .prepare("SELECT name FROM sqlite_master WHERE type IN ('index', 'view') AND name NOT LIKE 'sqlite_%' ORDER BY name")
            .unwrap();
        let names = st.query_map([], |r| r.get(0)).unwrap();
        names.collect::<rusqlite::Result<_>>().unwrap()
    }

    /// Opening a level-1 database migrates it in place: indexes and views added, the contract
    /// version (what older builds check) unchanged; opening it again changes nothing.
    #[test]
    fn a_schema1_database_is_migrated_in_place() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("old.db");
        schema1_db(&p);
        let c = open_existing(&p).unwrap();
        assert_eq!(schema_level(&c).unwrap(), SCHEMA_LEVEL);
        assert_eq!(
            get_meta(&c, "schema_version").unwrap().as_deref(),
            Some("1")
        );
        assert_eq!(
            get_meta(&c, "schema_migration").unwrap().as_deref(),
            Some("10")
        );
        assert_eq!(
            objects(&c),
            [
                "bw_samples_by_conn",
                "class_summary",
                "conn_class",
                "conn_summary",
                "connections_by_client",
                "rtt_samples_by_conn"
            ]
        );
        let (client, rtt, start): (String, f64, String) = c
            .query_row(
                "SELECT client, min_rtt_ms, start_utc FROM conn_summary WHERE id = 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap();
        assert_eq!(client, "[2001:db8::1]:40000");
        assert_eq!(rtt, 12.345);
        assert_eq!(start, "2023-11-14 22:13:20.123");
        // 0003's column, NULL for the rows written before it
        let cid: Option<String> = c
            .query_row(
                "SELECT community_id FROM connections WHERE id = 1",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(cid, None);
        // 0004's columns, NULL too
        let (src, kind): (Option<String>, Option<String>) = c
            .query_row(
                "SELECT (SELECT bw_source FROM connections WHERE id = 1), \
                 (SELECT kind FROM bw_samples LIMIT 1)",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!((src, kind), (None, None));
        // 0005's columns, NULL too
        let (zw, at): (Option<i64>, Option<i64>) = c
            .query_row(
                "SELECT zero_window_us, zero_window_at_bytes FROM exchanges WHERE conn_id = 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!((zw, at), (None, None));
        // 0006's columns, NULL too
        let (rw, q, full): (Option<i64>, Option<i64>, Option<i64>) = c
            .query_row(
                "SELECT rwin_max_bytes, queue_down_pkts, queue_down_full FROM connections \
                 WHERE id = 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap();
        assert_eq!((rw, q, full), (None, None, None));
        // 0007's column, NULL too
        let lead: Option<f64> = c
            .query_row(
                "SELECT shaper_lead_down FROM connections WHERE id = 1",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(lead, None);
        // 0008's columns, NULL too
        let (stalls, rate): (Option<String>, Option<f64>) = c
            .query_row(
                "SELECT zero_window_stalls, read_rate_bps FROM exchanges WHERE conn_id = 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!((stalls, rate), (None, None));
        // 0009's column, NULL too
        let by: Option<String> = c
            .query_row(
                "SELECT read_rate_by FROM exchanges WHERE conn_id = 1",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(by, None);
        // 0010's column, NULL too
        let profile: Option<String> = c
            .query_row(
                "SELECT rwin_profile FROM exchanges WHERE conn_id = 1",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(profile, None);
        drop(c);
        // a second open finds nothing to do (and a second migrate applies nothing)
        let c = open_existing(&p).unwrap();
        assert_eq!(objects(&c).len(), 6);
        drop(c);
        let rw = Connection::open(&p).unwrap();
        assert_eq!(migrate(&rw).unwrap(), Vec::<u32>::new());
    }

    /// A database that may not be written is read through TEMP views, and left as it was.
    #[test]
    fn a_schema1_database_that_may_not_be_written_gets_temp_views() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("old.db");
        schema1_db(&p);
        let c =
            Connection::open_with_flags(&p, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        // what bring_up_to_date falls back to when the in-place migration fails
        assert!(migrate(&c).is_err());
        add_temp_views(&c).unwrap();
        let (bw, class): (f64, String) = c
            .query_row(
                "SELECT s.bw_kbps, k.bw_class FROM conn_summary s JOIN conn_class k USING (id)",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!((bw, class.as_str()), (1500.0, "1 - 6 Mbit/s"));
        let n: i64 = c
            .query_row("SELECT connections FROM class_summary", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 1);
        assert_eq!(objects(&c), ["connections_by_client"]);
        assert_eq!(schema_level(&c).unwrap(), 1);
    }

    /// When the in-place migration cannot happen (here: another connection holds the write
    /// lock), opening still succeeds, through TEMP views, and leaves the file alone.
    #[test]
    fn opening_falls_back_to_temp_views_when_the_file_cannot_be_migrated() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("old.db");
        schema1_db(&p);
        let writer = Connection::open(&p).unwrap();
        writer.execute_batch("BEGIN IMMEDIATE").unwrap();
        let ro =
            Connection::open_with_flags(&p, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        let c = bring_up_to_date_waiting(ro, &p, std::time::Duration::from_millis(50)).unwrap();
        let client: String = c
            .query_row("SELECT client FROM conn_summary", [], |r| r.get(0))
            .unwrap();
        assert_eq!(client, "[2001:db8::1]:40000");
        assert_eq!(schema_level(&c).unwrap(), 1);
        assert_eq!(objects(&c), ["connections_by_client"]);
        writer.execute_batch("ROLLBACK").unwrap();
        drop((c, writer));
        // once the lock is gone, the next open migrates it
        let c = open_existing(&p).unwrap();
        assert_eq!(schema_level(&c).unwrap(), SCHEMA_LEVEL);
    }

    /// A device or FIFO given as an output is written in place, never replaced by a file
    /// (renaming over `/dev/null` would break every program on the machine); a database is
    /// refused there.
    #[test]
    fn special_files_are_written_in_place_not_replaced() {
        use std::io::Read;
        use std::os::unix::fs::FileTypeExt;
        let tmp = tempfile::tempdir().unwrap();
        let fifo = tmp.path().join("pipe");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo reads a NUL-terminated path that lives across the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(is_special_file(&fifo));
        assert!(!is_special_file(tmp.path()));
        assert!(!is_special_file(&tmp.path().join("absent")));
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || {
                let mut s = String::new();
                std::fs::File::open(&fifo)
                    .unwrap()
                    .read_to_string(&mut s)
                    .unwrap();
                s
            })
        };
        write_atomic(&fifo, b"through the pipe").unwrap();
        assert_eq!(reader.join().unwrap(), "through the pipe");
        assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
        let e = AtomicDb::create(&fifo)
            .err()
            .expect("a database into a FIFO");
        assert!(e.to_string().contains("not a regular file"), "{e}");
        assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
        let names: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    /// A load larger than the sync step starts the background syncer; the database commits
    /// whole, and one dropped while the syncer may still be at work leaves nothing behind.
    #[test]
    fn background_sync_during_a_large_load() {
        let tmp = tempdir();
        let dest = tmp.path().join("big.db");
        let rows = 3 * SYNC_STEP as usize / 4096;
        let load = |db: &mut AtomicDb| {
            db.conn()
                .execute_batch("CREATE TABLE blobs(b BLOB); BEGIN;")
                .unwrap();
            for i in 0..rows {
                db.conn()
                    .execute("INSERT INTO blobs VALUES (zeroblob(4096))", [])
                    .unwrap();
                if i % 256 == 0 {
                    db.start_writeback();
                }
            }
            db.conn().execute_batch("COMMIT;").unwrap();
            db.start_writeback();
        };
        {
            let mut db = AtomicDb::create(&dest).unwrap();
            load(&mut db);
            assert!(
                db.syncer.is_some(),
                "no syncer after {} MiB",
                (3 * SYNC_STEP) >> 20
            );
        }
        assert!(!dest.exists());
        assert!(!temp_sibling(&dest).exists());
        let mut db = AtomicDb::create(&dest).unwrap();
        load(&mut db);
        assert!(db.synced_len >= SYNC_STEP);
        db.commit().unwrap();
        let c = open_existing(&dest).unwrap();
        let n: i64 = c
            .query_row("SELECT count(*) FROM blobs", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n as usize, rows);
    }
}
