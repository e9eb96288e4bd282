-- mimic database schema, migration 2: indexes for per-connection lookups, and views with clear
-- names and units for the first questions an operator asks.
--
-- Only indexes and views: no table or column changes, so the data contract (meta
-- `schema_version`, checked by every reader) stays at 1 and a database migrated in place stays
-- readable by older mimic builds. The migration level (the number of the last file applied) is
-- kept in `PRAGMA user_version` and in meta `schema_migration`. A newer mimic adds this file to a
-- level-1 database when it opens one it may write; when it may not (read-only file or
-- directory), it creates the views for its own session (TEMP) and reads on without the indexes.
-- Every statement is idempotent (IF NOT EXISTS): a half-applied migration is simply re-run.
--
-- The contract columns of `connections` named like tables (`rtt_samples`, `bw_samples`,
-- `exchanges`: counts of rows in those tables) keep their names, since DESIGN.md's data contract
-- names them; `conn_summary` gives them clear ones (`rtt_sample_count`, `bw_sample_count`,
-- `exchange_count`).
-- Each CREATE INDEX stays on one line: bulk writers create indexes after loading the rows.

-- The samples behind one connection's numbers (`WHERE conn_id = ?`). `exchanges` needs none:
-- its primary key (conn_id, seq) is an index whose first column is conn_id.
CREATE INDEX IF NOT EXISTS rtt_samples_by_conn ON rtt_samples(conn_id);
CREATE INDEX IF NOT EXISTS bw_samples_by_conn ON bw_samples(conn_id);

-- One row per connection in operator units: `address:port` (IPv6 as `[address]:port`), times in
-- ms, bottleneck bandwidth in kbit/s (IP-layer), downstream loss in percent; NULL where the
-- connections column is NULL. `start_utc` is the first packet, to the millisecond.
CREATE VIEW IF NOT EXISTS conn_summary AS
SELECT
    id,
    CASE WHEN ip_version = 6 THEN '[' || client_ip || ']:' ELSE client_ip || ':' END || client_port AS client,
    CASE WHEN ip_version = 6 THEN '[' || server_ip || ']:' ELSE server_ip || ':' END || server_port AS server,
    vlan,
    strftime('%Y-%m-%d %H:%M:%f', t_first / 1000000.0, 'unixepoch') AS start_utc,
    ROUND((t_end - t_first) / 1000.0, 3) AS duration_ms,
    complete,
    prune_reason,
    termination,
    closed_by,
    ROUND(min_rtt_us / 1000.0, 3) AS min_rtt_ms,
    ROUND(hs_rtt_us / 1000.0, 3) AS handshake_rtt_ms,
    ROUND(bw_bps / 1000.0, 1) AS bw_kbps,
    ROUND(loss_rate_down * 100.0, 3) AS loss_down_pct,
    ROUND(response_time_us / 1000.0, 3) AS response_time_ms,
    exchanges AS exchange_count,
    data_bytes_up AS bytes_up,
    data_bytes_down AS bytes_down,
    data_pkts_down,
    retx_down,
    rtt_samples AS rtt_sample_count,
    bw_samples AS bw_sample_count,
    mss_client,
    rwin_bytes,
    delack_policy,
    frames
FROM connections;

-- Each connection's client class: its bottleneck-bandwidth bucket and its min-RTT bucket (the
-- classes an operator reasons in: modem, DSL, cable/fibre, LAN; same city, continent, far
-- away), each with a rank to sort by; `unknown` (rank 9) where the value is NULL.
CREATE VIEW IF NOT EXISTS conn_class AS
SELECT
    id,
    CASE WHEN bw_bps IS NULL THEN 9 WHEN bw_bps < 56e3 THEN 0 WHEN bw_bps < 1e6 THEN 1
         WHEN bw_bps < 6e6 THEN 2 WHEN bw_bps < 25e6 THEN 3 WHEN bw_bps < 100e6 THEN 4 ELSE 5 END AS bw_rank,
    CASE WHEN bw_bps IS NULL THEN 'unknown' WHEN bw_bps < 56e3 THEN '< 56 kbit/s'
         WHEN bw_bps < 1e6 THEN '56 kbit/s - 1 Mbit/s' WHEN bw_bps < 6e6 THEN '1 - 6 Mbit/s'
         WHEN bw_bps < 25e6 THEN '6 - 25 Mbit/s' WHEN bw_bps < 100e6 THEN '25 - 100 Mbit/s'
         ELSE '>= 100 Mbit/s' END AS bw_class,
    CASE WHEN min_rtt_us IS NULL THEN 9 WHEN min_rtt_us < 10000 THEN 0 WHEN min_rtt_us < 50000 THEN 1
         WHEN min_rtt_us < 100000 THEN 2 WHEN min_rtt_us < 300000 THEN 3 ELSE 4 END AS rtt_rank,
    CASE WHEN min_rtt_us IS NULL THEN 'unknown' WHEN min_rtt_us < 10000 THEN '< 10 ms'
         WHEN min_rtt_us < 50000 THEN '10 - 50 ms' WHEN min_rtt_us < 100000 THEN '50 - 100 ms'
         WHEN min_rtt_us < 300000 THEN '100 - 300 ms' ELSE '>= 300 ms' END AS rtt_class
FROM connections;

-- One row per client class present (bandwidth bucket x RTT bucket), in rank order: how many
-- connections (and complete ones), their share of all connections, mean min RTT, bandwidth and
-- loss, and the response time's median (mean of the two middle values when their number is
-- even), 90th percentile (nearest rank) and mean over the connections that have one.
CREATE VIEW IF NOT EXISTS class_summary AS
WITH k AS (
    SELECT cc.bw_rank, cc.bw_class, cc.rtt_rank, cc.rtt_class, s.*
    FROM conn_class cc JOIN conn_summary s ON s.id = cc.id
), ranked AS (
    SELECT bw_rank, rtt_rank, response_time_ms AS v,
           ROW_NUMBER() OVER (PARTITION BY bw_rank, rtt_rank ORDER BY response_time_ms) AS i,
           COUNT(*) OVER (PARTITION BY bw_rank, rtt_rank) AS n
    FROM k WHERE response_time_ms IS NOT NULL
), rt AS (
    SELECT bw_rank, rtt_rank,
           AVG(v) FILTER (WHERE i IN ((n + 1) / 2, (n + 2) / 2)) AS median,
           MAX(v) FILTER (WHERE i = (9 * n + 9) / 10) AS p90
    FROM ranked GROUP BY bw_rank, rtt_rank
)
SELECT
    k.bw_class,
    k.rtt_class,
    COUNT(*) AS connections,
    SUM(k.complete) AS complete,
    ROUND(100.0 * COUNT(*) / (SELECT COUNT(*) FROM connections), 2) AS share_pct,
    ROUND(AVG(k.min_rtt_ms), 3) AS avg_min_rtt_ms,
    ROUND(AVG(k.bw_kbps), 1) AS avg_bw_kbps,
    ROUND(AVG(k.loss_down_pct), 3) AS avg_loss_down_pct,
    COUNT(k.response_time_ms) AS with_response_time,
    ROUND(MAX(rt.median), 3) AS median_response_time_ms,
    ROUND(MAX(rt.p90), 3) AS p90_response_time_ms,
    ROUND(AVG(k.response_time_ms), 3) AS avg_response_time_ms,
    SUM(k.exchange_count) AS exchanges,
    SUM(k.bytes_down) AS bytes_down
FROM k LEFT JOIN rt ON rt.bw_rank = k.bw_rank AND rt.rtt_rank = k.rtt_rank
GROUP BY k.bw_rank, k.rtt_rank, k.bw_class, k.rtt_class
ORDER BY k.bw_rank, k.rtt_rank;
