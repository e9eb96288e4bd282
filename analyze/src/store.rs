//! Writing connection records into a mimic database (schema `schemas/`: the tables of
//! `0001_init.sql`, the indexes and views of `0002_operator.sql`, the `community_id` column of
//! `0003_community_id.sql`).
//!
//! Bulk loading is the expensive part of an analysis (a busy trace yields millions of
//! exchange and sample rows), so rows are buffered and inserted many per statement with
//! pre-bound parameters, and the indexes are built once at the end.

use std::path::{Path, PathBuf};

use mimic_core::community_id::tcp_community_id;
use mimic_core::db::{index_statements, set_meta, AtomicDb, DbError};
use mimic_core::flow::Endpoint;
use mimic_core::Timestamp;
use rusqlite::{Connection, ToSql};

use crate::record::ConnectionRecord;

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

const CONN_COLS: &str = "id, client_ip, client_port, server_ip, server_port, vlan, ip_version, t_syn, t_first, t_end,
    complete, prune_reason, server_by, min_rtt_us, hs_rtt_us, rtt_samples, mss_client, mss_server, wscale_client,
    wscale_server, sack_ok, ts_ok, ecn_ok, syn_retx, synack_retx, rwin_bytes, rwin_syn_bytes, zero_window, data_pkts_down,
    data_bytes_down, retx_down, spurious_retx_down, spurious_by, loss_rate_down, loss_random_down, data_pkts_up, data_bytes_up, retx_up,
    fin_retx, zwnd_probes, dup_frames,
    bw_bps, bw_samples, delack_policy, acks_per_seg, delack_timeout_us, termination, closed_by, exchanges,
    response_time_us, holes_down, holes_up, frames, community_id";
const CONN_N: usize = 54;
const EXCH_COLS: &str =
    "conn_id, seq, t_req_first, t_req_last, req_bytes, t_resp_first, t_resp_last, resp_bytes,
    response_delay_us, query_delay_us, header_bytes, think_time_us, method, status";
const EXCH_N: usize = 14;
const RTT_COLS: &str = "conn_id, t_us, rtt_us, kind";
const RTT_N: usize = 4;
const BW_COLS: &str = "conn_id, t_us, bps, bytes, gap_us, used";
const BW_N: usize = 6;

/// Rows per multi-row INSERT, and records buffered before a flush.
const CHUNK: usize = 64;
const BUFFER_RECORDS: usize = 512;

fn insert_sql(table: &str, cols: &str, n: usize, rows: usize) -> String {
    let one = format!("({})", vec!["?"; n].join(","));
    format!(
        "INSERT OR FAIL INTO {table} ({cols}) VALUES {}",
        vec![one.as_str(); rows].join(",")
    )
}

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

/// Binds and executes `count` rows from `rows` through multi-row statements of CHUNK rows, the
/// rest one by one. The rows are bound as the iterator yields them: nothing is collected first
/// (a flush's rows used to be gathered into a vector per table first: 3.3% of the writer's
/// instructions, and the page faults of the vectors' growth).
fn load<R>(
    conn: &Connection,
    table: &str,
    cols: &str,
    n: usize,
    count: usize,
    rows: impl Iterator<Item = R>,
    bind: impl Fn(&mut Binder, R),
) -> rusqlite::Result<()> {
    let full = count / CHUNK * CHUNK;
    let mut rows = rows.take(count);
    let mut run = |per: usize, rows_left: usize| -> rusqlite::Result<()> {
        if rows_left == 0 {
            return Ok(());
        }
        let mut st = conn.prepare_cached(&insert_sql(table, cols, n, per))?;
        for _ in 0..rows_left / per {
            let mut b = Binder {
                st: &mut st,
                idx: 1,
                err: None,
            };
            for r in rows.by_ref().take(per) {
                bind(&mut b, r);
            }
            if let Some(e) = b.err {
                return Err(e);
            }
            // fewer rows than counted would leave an earlier statement's values bound
            if b.idx != per * n + 1 {
                return Err(rusqlite::Error::InvalidParameterCount(b.idx - 1, per * n));
            }
            st.raw_execute()?;
        }
        Ok(())
    };
    run(CHUNK, full)?;
    run(1, count - full)
}

/// Binds parameters in order, remembering the first error.
struct Binder<'a, 'b> {
    st: &'a mut rusqlite::CachedStatement<'b>,
    idx: usize,
    err: Option<rusqlite::Error>,
}

impl Binder<'_, '_> {
    #[inline]
    fn v<T: ToSql>(&mut self, v: T) -> &mut Self {
        if self.err.is_none() {
            if let Err(e) = self.st.raw_bind_parameter(self.idx, v) {
                self.err = Some(e);
            }
        }
        self.idx += 1;
        self
    }
}

impl RecordStore {
    pub fn create(dest: &Path) -> Result<RecordStore, DbError> {
        let db = AtomicDb::create_with(dest, false)?;
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
            load(
                c,
                "connections",
                CONN_COLS,
                CONN_N,
                recs.len(),
                recs.iter(),
                |b, r| {
                    let bo = |x: Option<bool>| x.map(|v| v as i64);
                    b.v(r.id as i64)
                        .v(r.client_ip.to_string())
                        .v(r.client_port)
                        .v(r.server_ip.to_string())
                        .v(r.server_port);
                    b.v(r.vlan)
                        .v(r.ip_version())
                        .v(us(r.t_syn))
                        .v(r.t_first.as_micros())
                        .v(r.t_end.as_micros());
                    b.v(r.complete() as i64)
                        .v(r.prune_reason())
                        .v(r.server_by.as_str())
                        .v(r.min_rtt_us)
                        .v(r.hs_rtt_us);
                    b.v(r.rtt_sample_count)
                        .v(r.mss_client)
                        .v(r.mss_server)
                        .v(r.wscale_client)
                        .v(r.wscale_server);
                    b.v(bo(r.sack_ok))
                        .v(bo(r.ts_ok))
                        .v(bo(r.ecn_ok))
                        .v(r.syn_retx)
                        .v(r.synack_retx);
                    b.v(r.rwin_bytes.map(|v| v as i64))
                        .v(r.rwin_syn_bytes.map(|v| v as i64))
                        .v(r.zero_window);
                    b.v(r.data_pkts_down as i64)
                        .v(r.data_bytes_down as i64)
                        .v(r.retx_down as i64)
                        .v(r.spurious_retx_down as i64);
                    b.v(r.spurious_by)
                        .v(r.loss_rate_down)
                        .v(r.loss_random_down)
                        .v(r.data_pkts_up as i64)
                        .v(r.data_bytes_up as i64)
                        .v(r.retx_up as i64);
                    b.v(r.fin_retx as i64)
                        .v(r.zwnd_probes as i64)
                        .v(r.dup_frames as i64);
                    b.v(r.bw_bps)
                        .v(r.bw_samples.iter().filter(|s| s.used).count() as i64)
                        .v(r.delack_policy.as_str());
                    b.v(r.acks_per_seg)
                        .v(r.delack_timeout_us)
                        .v(r.termination.as_str())
                        .v(r.closed_by);
                    b.v(r.exchanges.len() as i64)
                        .v(r.response_time_us)
                        .v(r.holes_down)
                        .v(r.holes_up)
                        .v(r.frames as i64);
                    b.v(tcp_community_id(
                        &Endpoint::new(r.client_ip, r.client_port),
                        &Endpoint::new(r.server_ip, r.server_port),
                    ));
                },
            )?;
            let (ex_n, ex) = rows_of(&recs, |r| &r.exchanges);
            load(c, "exchanges", EXCH_COLS, EXCH_N, ex_n, ex, |b, (id, e)| {
                b.v(id)
                    .v(e.seq)
                    .v(us(e.t_req_first))
                    .v(us(e.t_req_last))
                    .v(e.req_bytes as i64);
                b.v(us(e.t_resp_first))
                    .v(us(e.t_resp_last))
                    .v(e.resp_bytes as i64)
                    .v(e.response_delay_us);
                b.v(e.query_delay_us)
                    .v(e.header_bytes.map(|v| v as i64))
                    .v(e.think_time_us)
                    .v(e.method)
                    .v(e.status);
            })?;
            let (rtt_n, rtt) = rows_of(&recs, |r| &r.rtt_samples);
            load(
                c,
                "rtt_samples",
                RTT_COLS,
                RTT_N,
                rtt_n,
                rtt,
                |b, (id, s)| {
                    b.v(id).v(s.t.as_micros()).v(s.rtt_us).v(s.kind.as_str());
                },
            )?;
            let (bw_n, bw) = rows_of(&recs, |r| &r.bw_samples);
            load(c, "bw_samples", BW_COLS, BW_N, bw_n, bw, |b, (id, s)| {
                b.v(id)
                    .v(s.t.as_micros())
                    .v(s.bps)
                    .v(s.bytes as i64)
                    .v(s.gap_us)
                    .v(s.used as i64);
            })?;
            Ok(())
        })();
        recs.clear();
        self.pending = recs;
        res.map_err(self.err())
    }

    /// Writes what is buffered, builds the indexes, ends the transaction and moves the
    /// database to its final name.
    pub fn commit(mut self) -> Result<PathBuf, DbError> {
        let t0 = std::time::Instant::now();
        self.flush()?;
        let t1 = std::time::Instant::now();
        for ix in index_statements() {
            self.db.conn().execute_batch(ix).map_err(self.err())?;
        }
        let t2 = std::time::Instant::now();
        self.db
            .conn()
            .execute_batch("COMMIT;")
            .map_err(self.err())?;
        let t3 = std::time::Instant::now();
        let r = self.db.commit();
        tracing::debug!(
            flush_s = (t1 - t0).as_secs_f64(),
            index_s = (t2 - t1).as_secs_f64(),
            commit_s = (t3 - t2).as_secs_f64(),
            fsync_rename_s = t3.elapsed().as_secs_f64(),
            "database committed"
        );
        r
    }
}
