//! Writing connection records into a mimic database (schema `schemas/0001_init.sql`).

use std::path::Path;

use mimic_core::db::{set_meta, AtomicDb, DbError};
use rusqlite::params;

use crate::record::ConnectionRecord;

/// Inserts records into a database being written atomically; everything happens in one
/// transaction and the file takes its final name only in [`RecordStore::commit`].
pub struct RecordStore {
    db: AtomicDb,
    pub connections: u64,
    pub exchanges: u64,
    pub rtt_samples: u64,
    pub bw_samples: u64,
}

fn sq(dest: &Path) -> impl Fn(rusqlite::Error) -> DbError + '_ {
    move |source| DbError::Sqlite { path: dest.to_path_buf(), source }
}

impl RecordStore {
    pub fn create(dest: &Path) -> Result<RecordStore, DbError> {
        let db = AtomicDb::create(dest)?;
        db.conn().execute_batch("PRAGMA locking_mode = EXCLUSIVE; PRAGMA cache_size = -65536; BEGIN;").map_err(sq(dest))?;
        Ok(RecordStore { db, connections: 0, exchanges: 0, rtt_samples: 0, bw_samples: 0 })
    }

    pub fn conn(&self) -> &rusqlite::Connection {
        self.db.conn()
    }

    pub fn set_meta(&self, key: &str, value: &str) -> Result<(), DbError> {
        set_meta(self.db.conn(), key, value).map_err(sq(self.db.dest()))
    }

    pub fn insert(&mut self, r: &ConnectionRecord) -> Result<(), DbError> {
        let dest = self.db.dest().to_path_buf();
        let c = self.db.conn();
        let us = |t: Option<mimic_core::Timestamp>| t.map(|t| t.as_micros());
        let b = |x: Option<bool>| x.map(|v| v as i64);
        let mut st = c
            .prepare_cached(
                "INSERT INTO connections (id, client_ip, client_port, server_ip, server_port, vlan, ip_version, t_syn, t_first, t_end,
                 complete, prune_reason, server_by, min_rtt_us, hs_rtt_us, rtt_samples, mss_client, mss_server, wscale_client,
                 wscale_server, sack_ok, ts_ok, ecn_ok, syn_retx, rwin_bytes, rwin_syn_bytes, zero_window, data_pkts_down,
                 data_bytes_down, retx_down, spurious_retx_down, spurious_by, loss_rate_down, data_pkts_up, data_bytes_up, retx_up,
                 bw_bps, bw_samples, delack_policy, acks_per_seg, delack_timeout_us, termination, closed_by, exchanges,
                 response_time_us, holes_down, holes_up, frames)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23,
                 ?24, ?25, ?26, ?27, ?28, ?29, ?30, ?31, ?32, ?33, ?34, ?35, ?36, ?37, ?38, ?39, ?40, ?41, ?42, ?43, ?44, ?45, ?46,
                 ?47, ?48)",
            )
            .map_err(sq(&dest))?;
        st.execute(params![
            r.id as i64,
            r.client_ip.to_string(),
            r.client_port,
            r.server_ip.to_string(),
            r.server_port,
            r.vlan,
            r.ip_version(),
            us(r.t_syn),
            r.t_first.as_micros(),
            r.t_end.as_micros(),
            r.complete() as i64,
            r.prune_reason(),
            r.server_by.as_str(),
            r.min_rtt_us,
            r.hs_rtt_us,
            r.rtt_sample_count,
            r.mss_client,
            r.mss_server,
            r.wscale_client,
            r.wscale_server,
            b(r.sack_ok),
            b(r.ts_ok),
            b(r.ecn_ok),
            r.syn_retx,
            r.rwin_bytes.map(|v| v as i64),
            r.rwin_syn_bytes.map(|v| v as i64),
            r.zero_window,
            r.data_pkts_down as i64,
            r.data_bytes_down as i64,
            r.retx_down as i64,
            r.spurious_retx_down as i64,
            r.spurious_by,
            r.loss_rate_down,
            r.data_pkts_up as i64,
            r.data_bytes_up as i64,
            r.retx_up as i64,
            r.bw_bps,
            r.bw_samples.iter().filter(|s| s.used).count() as i64,
            r.delack_policy.as_str(),
            r.acks_per_seg,
            r.delack_timeout_us,
            r.termination.as_str(),
            r.closed_by,
            r.exchanges.len() as i64,
            r.response_time_us,
            r.holes_down,
            r.holes_up,
            r.frames as i64,
        ])
        .map_err(sq(&dest))?;
        if !r.exchanges.is_empty() {
            let mut st = c
                .prepare_cached(
                    "INSERT INTO exchanges (conn_id, seq, t_req_first, t_req_last, req_bytes, t_resp_first, t_resp_last, resp_bytes,
                     response_delay_us, query_delay_us, header_bytes, think_time_us, method, status)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
                )
                .map_err(sq(&dest))?;
            for e in &r.exchanges {
                st.execute(params![
                    r.id as i64,
                    e.seq,
                    us(e.t_req_first),
                    us(e.t_req_last),
                    e.req_bytes as i64,
                    us(e.t_resp_first),
                    us(e.t_resp_last),
                    e.resp_bytes as i64,
                    e.response_delay_us,
                    e.query_delay_us,
                    e.header_bytes.map(|v| v as i64),
                    e.think_time_us,
                    e.method,
                    e.status,
                ])
                .map_err(sq(&dest))?;
            }
        }
        if !r.rtt_samples.is_empty() {
            let mut st = c
                .prepare_cached("INSERT INTO rtt_samples (conn_id, t_us, rtt_us, kind) VALUES (?1, ?2, ?3, ?4)")
                .map_err(sq(&dest))?;
            for s in &r.rtt_samples {
                st.execute(params![r.id as i64, s.t.as_micros(), s.rtt_us, s.kind.as_str()]).map_err(sq(&dest))?;
            }
        }
        if !r.bw_samples.is_empty() {
            let mut st = c
                .prepare_cached("INSERT INTO bw_samples (conn_id, t_us, bps, bytes, gap_us, used) VALUES (?1, ?2, ?3, ?4, ?5, ?6)")
                .map_err(sq(&dest))?;
            for s in &r.bw_samples {
                st.execute(params![r.id as i64, s.t.as_micros(), s.bps, s.bytes as i64, s.gap_us, s.used as i64]).map_err(sq(&dest))?;
            }
        }
        self.connections += 1;
        self.exchanges += r.exchanges.len() as u64;
        self.rtt_samples += r.rtt_samples.len() as u64;
        self.bw_samples += r.bw_samples.len() as u64;
        Ok(())
    }

    /// Ends the transaction and moves the database to its final name.
    pub fn commit(self) -> Result<std::path::PathBuf, DbError> {
        let dest = self.db.dest().to_path_buf();
        self.db.conn().execute_batch("COMMIT;").map_err(sq(&dest))?;
        self.db.commit()
    }
}
