//! Writing connection records into a mimic database (schema `schemas/`: the tables of
//! `0001_init.sql`, the indexes and views of `0002_operator.sql`, the `community_id` column of
//! `0003_community_id.sql`, the `bw_source` and `bw_samples.kind` columns of
//! `0004_bw_source.sql`).
//!
//! The columns are the lists of `mimic_core::schema`: a record becomes one row struct per table
//! ([`connection_row`], [`exchange_row`], …) and the rows bind themselves to the generated
//! INSERT. Bulk loading is the expensive part of an analysis (a busy trace yields millions of
//! exchange and sample rows), so rows are buffered and inserted many per statement on a
//! thread of their own; the indexes grow with the rows there, so the end of a run has no
//! index to build.
//!
//! With `--format parquet` the same rows go to the column builders of a Parquet dataset
//! ([`ParquetStore`], `crate::columnar`) instead; [`Output`] is either.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mimic_core::community_id::tcp_community_id;
use mimic_core::db::{set_meta, AtomicDb, DbError, SCHEMA_LEVEL, SCHEMA_VERSION};
use mimic_core::flow::Endpoint;
use mimic_core::schema::{
    BwSampleRow, ConnectionRow, ExchangeRow, MetaRow, RttSampleRow, Table, TableRow, Text,
};
use mimic_core::Timestamp;
use rusqlite::Connection;

use crate::columnar::{ColumnarError, ParquetDataset};
use crate::record::{BwSample, ConnectionRecord, Exchange, RttSample};

/// Inserts records into a database being written atomically; everything happens in one
/// transaction and the file takes its final name only in [`RecordStore::commit`].
pub struct RecordStore {
    db: AtomicDb,
    pending: Vec<ConnectionRecord>,
    pub connections: u64,
    pub exchanges: u64,
    pub rtt_samples: u64,
    pub bw_samples: u64,
}

/// Rows per multi-row INSERT, and records buffered before a flush.
const CHUNK: usize = 64;
const BUFFER_RECORDS: usize = 512;

/// The rows of one child table across `recs`, each with its connection's id, and their number.
fn rows_of<'a, T: 'a>(
    recs: &'a [ConnectionRecord],
    rows: impl Fn(&'a ConnectionRecord) -> &'a [T] + Copy + 'a,
) -> (usize, impl Iterator<Item = (i64, &'a T)> + 'a) {
    let n = recs.iter().map(|r| rows(r).len()).sum();
    (
        n,
        recs.iter()
            .flat_map(move |r| rows(r).iter().map(move |x| (r.id as i64, x))),
    )
}

fn us(t: Option<Timestamp>) -> Option<i64> {
    t.map(|t| t.as_micros())
}

fn flag(x: Option<bool>) -> Option<i64> {
    x.map(i64::from)
}

/// The `connections` row of a record (columns: `mimic_core::schema::ConnectionRow`).
pub fn connection_row(r: &ConnectionRecord) -> ConnectionRow {
    ConnectionRow {
        id: r.id as i64,
        client_ip: Text::Owned(r.client_ip.to_string()),
        client_port: r.client_port.into(),
        server_ip: Text::Owned(r.server_ip.to_string()),
        server_port: r.server_port.into(),
        vlan: r.vlan.map(i64::from),
        ip_version: r.ip_version().into(),
        t_syn: us(r.t_syn),
        t_first: r.t_first.as_micros(),
        t_end: r.t_end.as_micros(),
        complete: r.complete().into(),
        prune_reason: r.prune_reason().map(Text::Owned),
        server_by: r.server_by.as_str().into(),
        min_rtt_us: r.min_rtt_us,
        hs_rtt_us: r.hs_rtt_us,
        rtt_samples: r.rtt_sample_count.into(),
        mss_client: r.mss_client.map(i64::from),
        mss_server: r.mss_server.map(i64::from),
        wscale_client: r.wscale_client.map(i64::from),
        wscale_server: r.wscale_server.map(i64::from),
        sack_ok: flag(r.sack_ok),
        ts_ok: flag(r.ts_ok),
        ecn_ok: flag(r.ecn_ok),
        syn_retx: r.syn_retx.into(),
        synack_retx: r.synack_retx.into(),
        rwin_bytes: r.rwin_bytes.map(|v| v as i64),
        rwin_syn_bytes: r.rwin_syn_bytes.map(|v| v as i64),
        zero_window: r.zero_window.into(),
        data_pkts_down: r.data_pkts_down as i64,
        data_bytes_down: r.data_bytes_down as i64,
        retx_down: r.retx_down as i64,
        spurious_retx_down: r.spurious_retx_down as i64,
        spurious_by: r.spurious_by.map(Text::Borrowed),
        loss_rate_down: r.loss_rate_down,
        loss_random_down: r.loss_random_down,
        data_pkts_up: r.data_pkts_up as i64,
        data_bytes_up: r.data_bytes_up as i64,
        retx_up: r.retx_up as i64,
        fin_retx: r.fin_retx as i64,
        zwnd_probes: r.zwnd_probes as i64,
        dup_frames: r.dup_frames as i64,
        bw_bps: r.bw_bps,
        bw_samples: r.bw_samples.iter().filter(|s| s.used).count() as i64,
        delack_policy: r.delack_policy.as_str().into(),
        acks_per_seg: r.acks_per_seg,
        delack_timeout_us: r.delack_timeout_us,
        termination: r.termination.as_str().into(),
        closed_by: r.closed_by.map(Text::Borrowed),
        exchanges: r.exchanges.len() as i64,
        response_time_us: r.response_time_us,
        holes_down: r.holes_down.into(),
        holes_up: r.holes_up.into(),
        frames: r.frames as i64,
        community_id: Some(Text::Owned(tcp_community_id(
            &Endpoint::new(r.client_ip, r.client_port),
            &Endpoint::new(r.server_ip, r.server_port),
        ))),
        bw_source: Some(Text::Borrowed(r.bw_source.as_str())),
        rwin_max_bytes: r.rwin_max_bytes.map(|v| v as i64),
        queue_down_pkts: r.queue_down_pkts.map(i64::from),
        queue_down_full: flag(r.queue_down_full),
        shaper_lead_down: r.shaper_lead_down,
    }
}

/// The `exchanges` row of connection `conn_id`'s exchange `e`.
pub fn exchange_row(conn_id: i64, e: &Exchange) -> ExchangeRow {
    ExchangeRow {
        conn_id,
        seq: e.seq.into(),
        t_req_first: us(e.t_req_first),
        t_req_last: us(e.t_req_last),
        req_bytes: e.req_bytes as i64,
        t_resp_first: us(e.t_resp_first),
        t_resp_last: us(e.t_resp_last),
        resp_bytes: e.resp_bytes as i64,
        response_delay_us: e.response_delay_us,
        query_delay_us: e.query_delay_us,
        header_bytes: e.header_bytes.map(|v| v as i64),
        think_time_us: e.think_time_us,
        method: e.method.map(Text::Borrowed),
        status: e.status.map(i64::from),
        zero_window_us: e.zero_window_us,
        zero_window_at_bytes: e.zero_window_at_bytes.map(|v| v as i64),
        zero_window_stalls: stalls_text(&e.zero_window_stalls),
        read_rate_bps: e.read_rate_bps,
        read_rate_by: e.read_rate_by.map(|b| Text::Borrowed(b.as_str())),
        rwin_profile: pairs_text(&e.rwin_profile),
    }
}

/// `exchanges.zero_window_stalls`: `AT:US` pairs separated by spaces, NULL when none.
fn stalls_text(stalls: &[(u64, i64)]) -> Option<Text> {
    pairs_text(stalls)
}

/// `A:B` pairs separated by spaces (`exchanges.zero_window_stalls`, `exchanges.rwin_profile`),
/// NULL when there are none.
fn pairs_text<A: std::fmt::Display, B: std::fmt::Display>(pairs: &[(A, B)]) -> Option<Text> {
    if pairs.is_empty() {
        return None;
    }
    let v: Vec<String> = pairs.iter().map(|(a, b)| format!("{a}:{b}")).collect();
    Some(Text::Owned(v.join(" ")))
}

pub fn rtt_sample_row(conn_id: i64, s: &RttSample) -> RttSampleRow {
    RttSampleRow {
        conn_id,
        t_us: s.t.as_micros(),
        rtt_us: s.rtt_us,
        kind: s.kind.as_str().into(),
    }
}

pub fn bw_sample_row(conn_id: i64, s: &BwSample) -> BwSampleRow {
    BwSampleRow {
        conn_id,
        t_us: s.t.as_micros(),
        bps: s.bps,
        bytes: s.bytes as i64,
        gap_us: s.gap_us,
        used: s.used.into(),
        kind: Some(Text::Borrowed(s.kind.as_str())),
    }
}

/// Inserts `count` rows from `rows` through multi-row statements of CHUNK rows
/// ([`Table::insert_sql`]), the rest one by one. The rows are bound as the iterator yields
/// them: nothing is collected first (a flush's rows used to be gathered into a vector per
/// table first: 3.3% of the writer's instructions, and the page faults of the vectors'
/// growth).
fn load<T: TableRow>(
    conn: &Connection,
    count: usize,
    rows: impl Iterator<Item = T>,
) -> rusqlite::Result<()> {
    let table: &Table = T::TABLE;
    let n = table.columns.len();
    let full = count / CHUNK * CHUNK;
    let mut rows = rows.take(count);
    let mut run = |per: usize, rows_left: usize| -> rusqlite::Result<()> {
        if rows_left == 0 {
            return Ok(());
        }
        let mut st = conn.prepare_cached(&table.insert_sql(per))?;
        for _ in 0..rows_left / per {
            let mut k = 0;
            for r in rows.by_ref().take(per) {
                r.bind(&mut st, 1 + k * n)?;
                k += 1;
            }
            // fewer rows than counted would leave an earlier statement's values bound
            if k != per {
                return Err(rusqlite::Error::InvalidParameterCount(k * n, per * n));
            }
            st.raw_execute()?;
        }
        Ok(())
    };
    run(CHUNK, full)?;
    run(1, count - full)
}

impl RecordStore {
    pub fn create(dest: &Path) -> Result<RecordStore, DbError> {
        // The indexes exist from the start and grow with the rows, on this writer thread,
        // which keeps up with the analysis and waits for records 0.2-0.4 s of a run on the
        // benchmark trace (RUST_LOG=mimic_analyze=debug): building them after the load was
        // 0.10-0.22 s at the end of every run in which nothing else could happen.
        let db = AtomicDb::create_with(dest, true)?;
        // A small page cache: appending rows only touches the right edge of each b-tree, and
        // pages spilled during the load are on their way to disk before the final fsync
        // (a 64 MiB cache held them all back for the commit: measured 4% slower overall).
        db.conn()
            .execute_batch("PRAGMA locking_mode = EXCLUSIVE; PRAGMA cache_size = -4096; PRAGMA temp_store = MEMORY; BEGIN;")
            .map_err(|source| DbError::Sqlite { path: dest.to_path_buf(), source })?;

        Ok(RecordStore {
            db,
            pending: Vec::with_capacity(BUFFER_RECORDS),
            connections: 0,
            exchanges: 0,
            rtt_samples: 0,
            bw_samples: 0,
        })
    }

    fn err(&self) -> impl Fn(rusqlite::Error) -> DbError + '_ {
        move |source| DbError::Sqlite {
            path: self.db.dest().to_path_buf(),
            source,
        }
    }

    pub fn conn(&self) -> &Connection {
        self.db.conn()
    }

    pub fn set_meta(&self, key: &str, value: &str) -> Result<(), DbError> {
        set_meta(self.db.conn(), key, value).map_err(self.err())
    }

    /// Queues a record; rows reach the database in batches.
    pub fn insert(&mut self, r: ConnectionRecord) -> Result<(), DbError> {
        self.connections += 1;
        self.exchanges += r.exchanges.len() as u64;
        self.rtt_samples += r.rtt_samples.len() as u64;
        self.bw_samples += r.bw_samples.len() as u64;
        self.pending.push(r);
        if self.pending.len() >= BUFFER_RECORDS {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes the queued records now (the writer calls this when it has nothing else to do,
    /// so that little is left for [`RecordStore::commit`] once the analysis ends).
    pub fn flush(&mut self) -> Result<(), DbError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let mut recs = std::mem::take(&mut self.pending);
        // what earlier flushes wrote goes to disk in the background, not all in the fsync
        // at the end
        self.db.start_writeback();
        let c = self.db.conn();
        let res = (|| -> rusqlite::Result<()> {
            load(c, recs.len(), recs.iter().map(connection_row))?;
            let (ex_n, ex) = rows_of(&recs, |r| &r.exchanges);
            load(c, ex_n, ex.map(|(id, e)| exchange_row(id, e)))?;
            let (rtt_n, rtt) = rows_of(&recs, |r| &r.rtt_samples);
            load(c, rtt_n, rtt.map(|(id, s)| rtt_sample_row(id, s)))?;
            let (bw_n, bw) = rows_of(&recs, |r| &r.bw_samples);
            load(c, bw_n, bw.map(|(id, s)| bw_sample_row(id, s)))?;
            Ok(())
        })();
        recs.clear();
        self.pending = recs;
        res.map_err(self.err())
    }

    /// Writes what is buffered, ends the transaction and moves the database to its final
    /// name.
    pub fn commit(mut self) -> Result<PathBuf, DbError> {
        let t0 = std::time::Instant::now();
        self.flush()?;
        let t1 = std::time::Instant::now();
        self.db
            .conn()
            .execute_batch("COMMIT;")
            .map_err(self.err())?;
        let t2 = std::time::Instant::now();
        let r = self.db.commit();
        tracing::debug!(
            flush_s = (t1 - t0).as_secs_f64(),
            commit_s = (t2 - t1).as_secs_f64(),
            fsync_rename_s = t2.elapsed().as_secs_f64(),
            "database committed"
        );
        r
    }
}

/// The output formats of an analysis.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum OutputFormat {
    /// One SQLite database (flows.db).
    #[default]
    Sqlite,
    /// One shard of a Hive-partitioned Parquet directory (`crate::columnar`).
    Parquet,
}

#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Parquet(#[from] ColumnarError),
}

/// Writes records as shard K of a Parquet dataset: the rows of each record go straight to the
/// column builders of their tables; `meta` is gathered and written at the commit.
pub struct ParquetStore {
    ds: ParquetDataset,
    meta: BTreeMap<String, String>,
    /// Indexes of the tables in the dataset: meta, connections, exchanges, rtt_samples,
    /// bw_samples.
    ix: [usize; 5],
}

impl ParquetStore {
    /// Shard `shard` of `count` in the directory `dir`.
    pub fn create(dir: &Path, shard: u32, count: u32) -> Result<ParquetStore, ColumnarError> {
        let ds = ParquetDataset::create(dir, shard, count)?;
        let ix = [
            MetaRow::TABLE,
            ConnectionRow::TABLE,
            ExchangeRow::TABLE,
            RttSampleRow::TABLE,
            BwSampleRow::TABLE,
        ]
        .map(|t| ParquetDataset::index(t.name).expect("a table of the contract"));
        // what `db::init_schema_tables` writes into every new database
        let meta = [
            ("schema_version", SCHEMA_VERSION.to_string()),
            ("schema_migration", SCHEMA_LEVEL.to_string()),
            ("tool", "mimic".to_string()),
            ("tool_version", env!("CARGO_PKG_VERSION").to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        Ok(ParquetStore { ds, meta, ix })
    }

    pub fn set_meta(&mut self, key: &str, value: &str) {
        self.meta.insert(key.to_string(), value.to_string());
    }

    pub fn insert(&mut self, r: &ConnectionRecord) -> Result<(), ColumnarError> {
        let id = r.id as i64;
        let [_, conn, ex, rtt, bw] = self.ix;
        self.ds.table(conn).push(&connection_row(r))?;
        let w = self.ds.table(ex);
        for e in &r.exchanges {
            w.push(&exchange_row(id, e))?;
        }
        let w = self.ds.table(rtt);
        for s in &r.rtt_samples {
            w.push(&rtt_sample_row(id, s))?;
        }
        let w = self.ds.table(bw);
        for s in &r.bw_samples {
            w.push(&bw_sample_row(id, s))?;
        }
        Ok(())
    }

    /// Writes `meta` and every table's file, and moves them into place.
    pub fn commit(mut self) -> Result<PathBuf, ColumnarError> {
        self.ds.check_same_run(&self.meta)?;
        let w = self.ds.table(self.ix[0]);
        for (key, value) in std::mem::take(&mut self.meta) {
            w.push(&MetaRow {
                key: Text::Owned(key),
                value: Some(Text::Owned(value)),
            })?;
        }
        let dir = self.ds.dir().to_path_buf();
        let t0 = std::time::Instant::now();
        let counts = self.ds.commit()?;
        tracing::debug!(
            commit_s = t0.elapsed().as_secs_f64(),
            ?counts,
            "parquet dataset committed"
        );
        Ok(dir)
    }
}

/// Where an analysis writes its records: a SQLite database or a shard of a Parquet dataset.
pub enum Output {
    Sqlite(RecordStore),
    Parquet(ParquetStore),
}

impl Output {
    /// The output at `dest` in `format`; `shard` is (K, N) of a sharded run, (1, 1) otherwise.
    pub fn create(
        dest: &Path,
        format: OutputFormat,
        shard: (u32, u32),
    ) -> Result<Output, OutputError> {
        Ok(match format {
            OutputFormat::Sqlite => Output::Sqlite(RecordStore::create(dest)?),
            OutputFormat::Parquet => Output::Parquet(ParquetStore::create(dest, shard.0, shard.1)?),
        })
    }

    pub fn insert(&mut self, r: ConnectionRecord) -> Result<(), OutputError> {
        match self {
            Output::Sqlite(s) => Ok(s.insert(r)?),
            Output::Parquet(s) => Ok(s.insert(&r)?),
        }
    }

    /// Writes what is queued (SQLite; the Parquet builders write themselves as they fill).
    pub fn flush(&mut self) -> Result<(), OutputError> {
        match self {
            Output::Sqlite(s) => Ok(s.flush()?),
            Output::Parquet(_) => Ok(()),
        }
    }

    pub fn set_meta(&mut self, key: &str, value: &str) -> Result<(), OutputError> {
        match self {
            Output::Sqlite(s) => Ok(s.set_meta(key, value)?),
            Output::Parquet(s) => {
                s.set_meta(key, value);
                Ok(())
            }
        }
    }

    /// Completes the output and gives it its final name.
    pub fn commit(self) -> Result<PathBuf, OutputError> {
        match self {
            Output::Sqlite(s) => Ok(s.commit()?),
            Output::Parquet(s) => Ok(s.commit()?),
        }
    }
}
