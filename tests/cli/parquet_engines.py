"""Reads a mimic Parquet dataset with DuckDB and with PySpark (local mode, one JVM start), and
the SQLite database of the same analysis with Python's sqlite3, and prints each engine's
figures as JSON: rows per table, the shard partitions seen, a per-class aggregate of
connections (by an RTT class: connections, bytes each way, exchanges, median response time)
and a join of exchanges to connections. The Rust test (tests/cli/parquet.rs) compares them.

DuckDB also dumps every row of every table but meta, of the sharded dataset and of
EXPORTED_DIR (`mimic export --format parquet FLOWS_DB`), for a row-by-row comparison.

usage: parquet_engines.py DATASET_DIR FLOWS_DB EXPORTED_DIR OUT_JSON
"""

import json
import sqlite3
import statistics
import sys

DIR, DB, EXPORTED, OUT = sys.argv[1:5]
TABLES = ["connections", "exchanges", "rtt_samples", "bw_samples", "replay_map", "replay_pipes"]

CLASS = """CASE WHEN c.min_rtt_us IS NULL THEN 'none'
    WHEN c.min_rtt_us < 1000 THEN 'lt1ms'
    WHEN c.min_rtt_us < 10000 THEN 'lt10ms'
    WHEN c.min_rtt_us < 100000 THEN 'lt100ms'
    ELSE 'ge100ms' END"""

# the same SQL in all three engines, but the median (SQLite has none; DuckDB's median and
# Spark's percentile(x, 0.5) are exact and interpolate between the middle two, as Python's
# statistics.median does)
AGG = f"""SELECT {CLASS} AS rtt_class, count(*) AS n, sum(c.data_bytes_down) AS down,
    sum(c.data_bytes_up) AS up, sum(c.exchanges) AS ex, {{median}} AS median_rt
  FROM connections c GROUP BY 1 ORDER BY 1"""
JOIN = """SELECT count(*), sum(e.resp_bytes), sum(e.req_bytes)
  FROM exchanges e JOIN connections c ON e.conn_id = c.id"""


def norm(rows):
    return [[None if v is None else (float(v) if isinstance(v, float) else v) for v in r]
            for r in rows]


def figures_sqlite():
    c = sqlite3.connect(f"file:{DB}?mode=ro", uri=True)
    counts = {t: c.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}
    agg = c.execute(AGG.format(median="NULL")).fetchall()
    out = []
    for row in agg:
        rts = [r[0] for r in c.execute(
            f"SELECT c.response_time_us FROM connections c WHERE ({CLASS}) = ? "
            "AND c.response_time_us IS NOT NULL", (row[0],))]
        med = float(statistics.median(rts)) if rts else None
        out.append(list(row[:5]) + [med])
    join = list(c.execute(JOIN).fetchone())
    return {"counts": counts, "shards": None, "classes": norm(out), "join": join}


def figures_duckdb():
    import duckdb
    con = duckdb.connect()
    for t in TABLES + ["meta"]:
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet("
                    f"'{DIR}/table={t}/*/*.parquet', hive_partitioning = true)")
    counts = {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}
    shards = [r[0] for r in con.execute(
        "SELECT DISTINCT shard FROM connections ORDER BY 1").fetchall()]
    agg = con.execute(AGG.format(median="median(c.response_time_us)")).fetchall()
    join = list(con.execute(JOIN).fetchone())
    types = {r[0]: r[1] for r in con.execute(
        "SELECT column_name, column_type FROM (DESCRIBE connections)").fetchall()}
    meta_shard = {str(k): v for k, v in con.execute(
        "SELECT shard, value FROM meta WHERE key = 'shard' ORDER BY shard").fetchall()}

    def rows(d):
        out = {}
        for t in TABLES:
            # the columns of the files, in their order (the partition columns left out)
            out[t] = norm(con.execute(
                f"SELECT * EXCLUDE (shard, \"table\") FROM read_parquet("
                f"'{d}/table={t}/*/*.parquet', hive_partitioning = true)").fetchall())
        return out

    return {"counts": counts, "shards": [int(s) for s in shards], "classes": norm(agg),
            "join": join, "types": types, "meta_shard": meta_shard, "rows": rows(DIR),
            "exported_rows": rows(EXPORTED)}


def figures_spark():
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master("local[1]").appName("mimic-parquet-test")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        for t in TABLES + ["meta"]:
            spark.read.parquet(f"{DIR}/table={t}").createOrReplaceTempView(t)
        # one job for all the counts (each job costs a scheduling round in local mode)
        row = spark.sql("SELECT " + ", ".join(
            f"(SELECT count(*) FROM {t}) AS {t}" for t in TABLES)).collect()[0]
        counts = {t: row[t] for t in TABLES}
        shards = [r[0] for r in spark.sql(
            "SELECT DISTINCT shard FROM connections ORDER BY 1").collect()]
        agg = [list(r) for r in spark.sql(
            AGG.format(median="percentile(c.response_time_us, 0.5)")).collect()]
        join = list(spark.sql(JOIN).collect()[0])
        types = {f.name: f.dataType.simpleString()
                 for f in spark.table("connections").schema.fields}
    finally:
        spark.stop()
    return {"counts": counts, "shards": [int(s) for s in shards], "classes": norm(agg),
            "join": join, "types": types}


result = {"sqlite": figures_sqlite()}
for name, f in [("duckdb", figures_duckdb), ("spark", figures_spark)]:
    try:
        result[name] = f()
    except ImportError as e:
        result[name] = {"error": f"python package missing: {e}"}
with open(OUT, "w") as f:
    json.dump(result, f)
