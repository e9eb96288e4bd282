//! `mimic export [--format text|csv|json|zeek] DB [-o FILE]`: one line or block per connection
//! of a mimic database, for people (text, like tcptrace's long output), spreadsheets (CSV),
//! scripts (JSON lines) and Zeek tooling (a conn.log-shaped TSV); or, with `--format parquet
//! DB -o DIR`, every table of the database as a Parquet dataset (the writer of `mimic analyze
//! --format parquet`).

use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use mimic_core::schema::{ConnectionRow, TableRow};
use rusqlite::types::ValueRef;
use rusqlite::{Connection, Row};

#[derive(clap::Args)]
#[command(after_help = "\
Formats (one record per connection, in connection id order):
  text  a block per connection, as tcptrace's long output: addresses, times in ms,
        bandwidth in kbit/s, loss, bytes, response time, handshake options
  csv   the columns of the conn_summary view, with a header row; NULL is an empty field
  json  JSON lines: one object per connection with the conn_summary columns; NULL is null
  zeek  Zeek's conn.log (TSV with #separator/#fields/#types header lines; `-` when unset);
        conn_state from mimic's handshake/termination, see GUIDE.md
  parquet  not one record per connection: every table of the database (connections,
        exchanges, rtt_samples, bw_samples, meta, ...) as DIR/table=NAME/shard=K/part-0.parquet
        (K of a shard's meta `shard`, else 1), as `mimic analyze --format parquet` writes;
        -o DIR is required
Exit status: 0 written, 2 error. A closed pipe on stdout (`| head`) ends it quietly by SIGPIPE, as it ends any Unix filter (status 141 in a shell).")]
pub struct Args {
    /// The database to export (from analyze, replay or synth; older schema levels too).
    #[arg(value_name = "DB")]
    pub db: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Write to FILE (atomically: complete or not at all) instead of standard output (`-o -`
    /// is standard output too); with `--format parquet`, the dataset directory (required).
    #[arg(short, long, value_name = "FILE|DIR")]
    pub output: Option<PathBuf>,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Text,
    Csv,
    Json,
    Zeek,
    Parquet,
}

pub fn run(mut a: Args) -> anyhow::Result<ExitCode> {
    // an interruption removes the unfinished output (the signal alone would leave it hidden
    // beside the output)
    mimic_core::interrupt::remove_temps_on_interrupt("export")
        .context("installing SIGINT/SIGTERM handlers")?;
    if a.output.as_deref().is_some_and(|o| o.as_os_str() == "-") {
        if a.format == Format::Parquet {
            anyhow::bail!(
                "--format parquet writes a directory of files: name it with -o DIR (not `-`)"
            );
        }
        a.output = None;
    }
    if let Some(out) = &a.output {
        if same_file(out, &a.db) {
            anyhow::bail!(
                "{}: is the database being exported; name another output file",
                out.display()
            );
        }
        // a text export over a capture or another database would destroy it
        if a.format != Format::Parquet {
            mimic_core::db::refuse_replacing_data(out, "an export")
                .with_context(|| out.display().to_string())?;
        }
    }
    let conn = mimic_core::db::open_existing(&a.db)?;
    if a.format == Format::Parquet {
        let Some(dir) = &a.output else {
            anyhow::bail!("--format parquet writes a directory of files: name it with -o DIR");
        };
        let (shard, counts) = mimic_analyze::columnar::export_database(&conn, &a.db, dir)
            .with_context(|| format!("{}: exporting to Parquet", a.db.display()))?;
        let rows: Vec<String> = counts.iter().map(|(t, n)| format!("{t} {n}")).collect();
        eprintln!(
            "wrote {} (shard={shard}): {}",
            dir.display(),
            rows.join(", ")
        );
        return Ok(ExitCode::SUCCESS);
    }
    let db = a.db.display().to_string();
    let result = match &a.output {
        Some(path) => {
            let mut out = mimic_core::db::StagedFile::create(path)
                .with_context(|| format!("{}: cannot create", path.display()))?;
            write(&conn, &db, a.format, out.writer())
                .and_then(|()| out.commit().map_err(Error::Io))
                .map_err(|e| e.context(&db, Some(path)))
        }
        None => {
            let mut out = BufWriter::with_capacity(1 << 16, io::stdout().lock());
            // a closed pipe (`| head`) ends the process by SIGPIPE before a write can fail
            write(&conn, &db, a.format, &mut out)
                .and_then(|()| out.flush().map_err(Error::Io))
                .map_err(|e| e.context(&db, None))
        }
    };
    result?;
    Ok(ExitCode::SUCCESS)
}

/// Whether `a` and `b` name the same existing file (also through links).
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

#[derive(Debug)]
enum Error {
    Sql(rusqlite::Error),
    Io(io::Error),
    /// Text that is not UTF-8 in a connection's row (a database changed by hand or damaged):
    /// refused, as the zeek format's reader refuses it, rather than written with replacement
    /// characters that hide the damage.
    NotUtf8 {
        id: String,
        column: String,
        value: String,
    },
    /// A value the zeek format's field cannot hold (a port outside 0-65535, a negative byte
    /// count, an address that is none, an end before the start): refused for the same reason.
    NotZeek {
        id: i64,
        column: &'static str,
        value: String,
        field: &'static str,
    },
}

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Error {
        Error::Sql(e)
    }
}
impl From<io::Error> for Error {
    fn from(e: io::Error) -> Error {
        Error::Io(e)
    }
}
impl From<csv::Error> for Error {
    fn from(e: csv::Error) -> Error {
        match e.into_kind() {
            csv::ErrorKind::Io(e) => Error::Io(e),
            other => Error::Io(io::Error::other(format!("{other:?}"))),
        }
    }
}

impl Error {
    /// The error on one line, naming the file it concerns: the output for a failed write, the
    /// database for a failed query.
    fn context(self, db: &str, out: Option<&Path>) -> anyhow::Error {
        match self {
            Error::Sql(e) => anyhow::anyhow!("{db}: reading the connections: {e}"),
            Error::NotUtf8 { id, column, value } => anyhow::anyhow!(
                "{db}: connection {id}: {column} holds text that is not UTF-8: {value}; the \
                 database was changed outside mimic or is damaged"
            ),
            Error::NotZeek {
                id,
                column,
                value,
                field,
            } => anyhow::anyhow!(
                "{db}: connection {id}: {column} holds {value}, which Zeek's {field} cannot \
                 hold; the database was changed outside mimic or is damaged"
            ),
            Error::Io(e) => match out {
                Some(p) => anyhow::anyhow!("{}: writing: {e}", p.display()),
                None => anyhow::anyhow!("standard output: writing: {e}"),
            },
        }
    }
}

fn write(conn: &Connection, db: &str, format: Format, out: &mut dyn Write) -> Result<(), Error> {
    match format {
        Format::Csv => write_csv(conn, out),
        Format::Json => write_json(conn, out),
        Format::Zeek => write_zeek(conn, out),
        Format::Text => write_text(conn, db, out),
        Format::Parquet => unreachable!("parquet is written by columnar::export_database"),
    }
}

/// `query` over `conn_summary` as the data contract defines it (a `WITH` clause of the view's
/// own `SELECT`), not as the database may have it: an export's columns and rows do not follow a
/// view redefined or dropped by hand.
fn with_summary(query: &str) -> String {
    let view = mimic_core::db::view_select("conn_summary")
        .expect("the data contract defines conn_summary");
    format!("WITH conn_summary AS ({view}) {query}")
}

const SUMMARY: &str = "SELECT * FROM conn_summary ORDER BY id";

fn write_csv(conn: &Connection, out: &mut dyn Write) -> Result<(), Error> {
    let mut st = conn.prepare(&with_summary(SUMMARY))?;
    let names: Vec<String> = st.column_names().map(|s| s.to_string()).collect();
    let mut w = csv::Writer::from_writer(out);
    w.write_record(&names)?;
    let mut rows = st.query([])?;
    let mut field = Vec::with_capacity(names.len());
    while let Some(r) = rows.next()? {
        field.clear();
        for i in 0..names.len() {
            field.push(plain(r, i)?);
        }
        w.write_record(&field)?;
    }
    w.flush()?;
    Ok(())
}

/// Column `i` of a row as text: integers and reals as Rust prints them (shortest round trip),
/// NULL as an empty string; text that is not UTF-8 is an error naming the row (its `id`) and
/// the column.
fn plain(r: &Row<'_>, i: usize) -> Result<String, Error> {
    Ok(match r.get_ref(i)? {
        ValueRef::Null => String::new(),
        ValueRef::Integer(i) => i.to_string(),
        ValueRef::Real(f) => f.to_string(),
        ValueRef::Text(t) | ValueRef::Blob(t) => match std::str::from_utf8(t) {
            Ok(t) => t.to_string(),
            Err(_) => {
                return Err(Error::NotUtf8 {
                    id: match r.get_ref("id") {
                        Ok(ValueRef::Integer(id)) => id.to_string(),
                        _ => "?".into(),
                    },
                    column: r.as_ref().column_name(i)?.to_string(),
                    value: mimic_core::schema::show_value(ValueRef::Text(t)),
                })
            }
        },
    })
}

fn write_json(conn: &Connection, out: &mut dyn Write) -> Result<(), Error> {
    let mut st = conn.prepare(&with_summary(SUMMARY))?;
    // the keys in the view's column order (serde_json's map would sort them)
    let keys: Vec<String> = st
        .column_names()
        .map(|s| serde_json::Value::from(s).to_string())
        .collect();
    let mut rows = st.query([])?;
    let mut line = String::new();
    while let Some(r) = rows.next()? {
        line.clear();
        line.push('{');
        for (i, k) in keys.iter().enumerate() {
            if i > 0 {
                line.push(',');
            }
            line.push_str(k);
            line.push(':');
            let v = match r.get_ref(i)? {
                ValueRef::Null => serde_json::Value::Null,
                ValueRef::Integer(n) => n.into(),
                // a non-finite real has no JSON form: null
                ValueRef::Real(f) => {
                    serde_json::Number::from_f64(f).map_or(serde_json::Value::Null, Into::into)
                }
                _ => plain(r, i)?.into(),
            };
            line.push_str(&v.to_string());
        }
        line.push_str("}\n");
        out.write_all(line.as_bytes())?;
    }
    Ok(())
}

/// Zeek's conn.log fields (its default set, Zeek 5-7) and their types.
const ZEEK_FIELDS: [(&str, &str); 21] = [
    ("ts", "time"),
    ("uid", "string"),
    ("id.orig_h", "addr"),
    ("id.orig_p", "port"),
    ("id.resp_h", "addr"),
    ("id.resp_p", "port"),
    ("proto", "enum"),
    ("service", "string"),
    ("duration", "interval"),
    ("orig_bytes", "count"),
    ("resp_bytes", "count"),
    ("conn_state", "string"),
    ("local_orig", "bool"),
    ("local_resp", "bool"),
    ("missed_bytes", "count"),
    ("history", "string"),
    ("orig_pkts", "count"),
    ("orig_ip_bytes", "count"),
    ("resp_pkts", "count"),
    ("resp_ip_bytes", "count"),
    ("tunnel_parents", "set[string]"),
];

/// Zeek's conn_state from what mimic records: whether a SYN and a SYN/SYN-ACK pair were
/// captured, how the connection ended and which side closed first. mimic's `fin` means a FIN
/// ended it without an abort, not that both sides sent one, so a half-close reads as SF; the
/// side that closed first is taken as the RST's sender.
pub(crate) fn conn_state(
    syn_seen: bool,
    prune_reason: Option<&str>,
    termination: &str,
    closed_by: Option<&str>,
) -> &'static str {
    let has = |r: &str| prune_reason.is_some_and(|p| p.split(',').any(|x| x.trim() == r));
    let rst = termination.starts_with("rst");
    if !syn_seen {
        // picked up mid-stream
        return "OTH";
    }
    if has("no_handshake") {
        return match (termination, closed_by) {
            (_, Some("server")) if rst => "REJ",
            (_, Some("client")) if rst => "RSTOS0",
            ("fin", Some("client")) if has("one_direction") => "SH",
            ("none", _) if has("one_direction") => "S0",
            _ => "OTH",
        };
    }
    match (termination, closed_by) {
        ("none", _) => "S1",
        ("fin", _) => "SF",
        (_, Some("client")) if rst => "RSTO",
        (_, Some("server")) if rst => "RSTR",
        _ => "OTH",
    }
}

/// µs since the epoch as Zeek's seconds with six decimals.
fn zeek_seconds(us: i64) -> String {
    let sign = if us < 0 { "-" } else { "" };
    let a = us.unsigned_abs();
    format!("{sign}{}.{:06}", a / 1_000_000, a % 1_000_000)
}

/// Refuses a connection whose values a conn.log field cannot hold: Zeek's reader would reject
/// the line (a `port` is 0-65535, a `count` is not negative, an `addr` is an address), and a
/// negative `duration` is no connection.
fn zeek_can_hold(c: &ConnectionRow) -> Result<(), Error> {
    let bad = |column, value: String, field| {
        Err(Error::NotZeek {
            id: c.id,
            column,
            value,
            field,
        })
    };
    for (column, ip) in [("client_ip", &c.client_ip), ("server_ip", &c.server_ip)] {
        if ip.parse::<std::net::IpAddr>().is_err() {
            return bad(
                column,
                format!("'{}'", ip.escape_default()),
                "addr (an address)",
            );
        }
    }
    for (column, port) in [
        ("client_port", c.client_port),
        ("server_port", c.server_port),
    ] {
        if !(0..=65_535).contains(&port) {
            return bad(column, port.to_string(), "port (0-65535)");
        }
    }
    for (column, n) in [
        ("data_bytes_up", c.data_bytes_up),
        ("data_bytes_down", c.data_bytes_down),
    ] {
        if n < 0 {
            return bad(column, n.to_string(), "count (not negative)");
        }
    }
    if c.t_end < c.t_first {
        return bad(
            "t_end",
            format!("{} (before t_first, {})", c.t_end, c.t_first),
            "duration (not negative)",
        );
    }
    Ok(())
}

fn write_zeek(conn: &Connection, out: &mut dyn Write) -> Result<(), Error> {
    let now: String = conn.query_row("SELECT strftime('%Y-%m-%d-%H-%M-%S', 'now')", [], |r| {
        r.get(0)
    })?;
    let names: Vec<&str> = ZEEK_FIELDS.iter().map(|f| f.0).collect();
    let types: Vec<&str> = ZEEK_FIELDS.iter().map(|f| f.1).collect();
    write!(
        out,
        "#separator \\x09\n#set_separator\t,\n#empty_field\t(empty)\n#unset_field\t-\n#path\tconn\n#open\t{now}\n#fields\t{}\n#types\t{}\n",
        names.join("\t"),
        types.join("\t")
    )?;
    // the connections through the contract's column list; which carried HTTP, from exchanges
    let mut st = conn.prepare("SELECT DISTINCT conn_id FROM exchanges WHERE method IS NOT NULL")?;
    let http: std::collections::HashSet<i64> =
        st.query_map([], |r| r.get(0))?.collect::<Result<_, _>>()?;
    for c in ConnectionRow::read_all(conn, "id")? {
        zeek_can_hold(&c)?;
        let state = conn_state(
            c.t_syn.is_some(),
            c.prune_reason.as_deref(),
            &c.termination,
            c.closed_by.as_deref(),
        );
        let fields = [
            zeek_seconds(c.t_first),
            format!("C{}", c.id),
            c.client_ip.to_string(),
            c.client_port.to_string(),
            c.server_ip.to_string(),
            c.server_port.to_string(),
            "tcp".into(),
            if http.contains(&c.id) { "http" } else { "-" }.into(),
            zeek_seconds(c.t_end - c.t_first),
            c.data_bytes_up.to_string(),
            c.data_bytes_down.to_string(),
            state.into(),
        ];
        // local_orig .. tunnel_parents: mimic does not record them
        let unset = ZEEK_FIELDS.len() - fields.len();
        writeln!(out, "{}{}", fields.join("\t"), "\t-".repeat(unset))?;
    }
    writeln!(out, "#close\t{now}")?;
    Ok(())
}

/// A text value of a row, or `fallback` for NULL.
fn text_or(r: &Row<'_>, col: &str, fallback: &str) -> Result<String, Error> {
    let i = r.as_ref().column_index(col)?;
    Ok(match r.get_ref(i)? {
        ValueRef::Null => fallback.to_string(),
        _ => plain(r, i)?,
    })
}

fn yes_no(r: &Row<'_>, col: &str) -> Result<&'static str, Error> {
    Ok(match r.get::<_, Option<i64>>(col)? {
        Some(0) => "no",
        Some(_) => "yes",
        None => "n/a",
    })
}

fn write_text(conn: &Connection, db: &str, out: &mut dyn Write) -> Result<(), Error> {
    let (n, complete): (i64, i64) = conn.query_row(
        "SELECT count(*), coalesce(sum(complete), 0) FROM connections",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let role = mimic_core::db::get_meta(conn, "role")?.unwrap_or_else(|| "unknown".into());
    writeln!(
        out,
        "{db}: {n} connections, {complete} complete (role {role})"
    )?;
    let mut st = conn.prepare(&with_summary(
        "SELECT s.*, c.mss_server, c.wscale_client, c.wscale_server, c.sack_ok, c.ts_ok, c.ecn_ok,
                c.spurious_retx_down, c.data_pkts_up, c.retx_up, c.acks_per_seg, c.delack_timeout_us
         FROM conn_summary s JOIN connections c ON c.id = s.id ORDER BY s.id",
    ))?;
    let mut rows = st.query([])?;
    while let Some(r) = rows.next()? {
        let na = "n/a";
        let id: i64 = r.get("id")?;
        let vlan = match r.get::<_, Option<i64>>("vlan")? {
            Some(v) => format!(" (vlan {v})"),
            None => String::new(),
        };
        writeln!(
            out,
            "\nconnection {id}: {} -> {}{vlan}",
            text_or(r, "client", na)?,
            text_or(r, "server", na)?
        )?;
        let line = |label: &str, value: String| format!("  {label:<16}{value}\n");
        let mut block = String::new();
        block += &line(
            "first packet:",
            format!("{} UTC", text_or(r, "start_utc", na)?),
        );
        block += &line(
            "duration:",
            format!("{} ms", text_or(r, "duration_ms", na)?),
        );
        let complete = match r.get::<_, i64>("complete")? {
            0 => format!("no ({})", text_or(r, "prune_reason", "?")?),
            _ => "yes".into(),
        };
        block += &line("complete:", complete);
        let closed = match text_or(r, "closed_by", "")? {
            by if !by.is_empty() => format!(", closed by {by}"),
            _ => String::new(),
        };
        block += &line(
            "termination:",
            format!("{}{closed}", text_or(r, "termination", na)?),
        );
        block += &line("handshake RTT:", ms(r, "handshake_rtt_ms")?);
        block += &line(
            "min RTT:",
            format!(
                "{} ({})",
                ms(r, "min_rtt_ms")?,
                counted(r, "rtt_sample_count", "sample")?
            ),
        );
        let bw = match r.get::<_, Option<f64>>("bw_kbps")? {
            Some(v) => format!("{v} kbit/s"),
            None => na.into(),
        };
        block += &line(
            "bandwidth:",
            format!("{bw} ({})", counted(r, "bw_sample_count", "sample")?),
        );
        let loss = match r.get::<_, Option<f64>>("loss_down_pct")? {
            Some(v) => format!("{v} %"),
            None => na.into(),
        };
        block += &line(
            "loss down:",
            format!(
                "{loss} ({} of {} retransmitted, {} spurious)",
                text_or(r, "retx_down", "0")?,
                counted(r, "data_pkts_down", "data segment")?,
                text_or(r, "spurious_retx_down", "0")?
            ),
        );
        block += &line(
            "data up:",
            format!(
                "{} in {}, {} retransmitted",
                counted(r, "bytes_up", "byte")?,
                counted(r, "data_pkts_up", "segment")?,
                text_or(r, "retx_up", "0")?
            ),
        );
        block += &line(
            "data down:",
            format!(
                "{} in {}",
                counted(r, "bytes_down", "byte")?,
                counted(r, "data_pkts_down", "segment")?
            ),
        );
        block += &line(
            "response time:",
            format!(
                "{} ({})",
                ms(r, "response_time_ms")?,
                counted(r, "exchange_count", "exchange")?
            ),
        );
        block += &line(
            "options:",
            format!(
                "mss {}/{}, wscale {}/{}, sack {}, timestamps {}, ecn {} (client/server)",
                text_or(r, "mss_client", na)?,
                text_or(r, "mss_server", na)?,
                text_or(r, "wscale_client", na)?,
                text_or(r, "wscale_server", na)?,
                yes_no(r, "sack_ok")?,
                yes_no(r, "ts_ok")?,
                yes_no(r, "ecn_ok")?
            ),
        );
        let timeout = match r.get::<_, Option<i64>>("delack_timeout_us")? {
            Some(t) => format!(", timeout {} ms", t as f64 / 1000.0),
            None => String::new(),
        };
        let per_seg = match r.get::<_, Option<f64>>("acks_per_seg")? {
            Some(a) => format!(" ({a:.2} ACKs per segment{timeout})"),
            None => String::new(),
        };
        block += &line(
            "client:",
            format!(
                "rwin {} bytes, delayed ACK {}{per_seg}",
                text_or(r, "rwin_bytes", na)?,
                text_or(r, "delack_policy", na)?
            ),
        );
        block += &line("frames:", text_or(r, "frames", "0")?);
        out.write_all(block.as_bytes())?;
    }
    Ok(())
}

/// An integer column with its noun: "1 segment", "3 segments".
fn counted(r: &Row<'_>, col: &str, noun: &str) -> Result<String, Error> {
    let n = r.get::<_, Option<i64>>(col)?.unwrap_or(0);
    Ok(format!("{n} {noun}{}", if n == 1 { "" } else { "s" }))
}

fn ms(r: &Row<'_>, col: &str) -> Result<String, Error> {
    Ok(match r.get::<_, Option<f64>>(col)? {
        Some(v) => format!("{v} ms"),
        None => "n/a".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeek_conn_states() {
        let st = conn_state;
        assert_eq!(
            st(false, Some("no_handshake"), "fin", Some("client")),
            "OTH"
        );
        assert_eq!(st(true, None, "fin", Some("client")), "SF");
        assert_eq!(st(true, Some("seq_holes"), "fin", Some("server")), "SF");
        assert_eq!(st(true, Some("no_termination"), "none", None), "S1");
        assert_eq!(st(true, None, "rst_after_response", Some("client")), "RSTO");
        assert_eq!(st(true, None, "rst_abort", Some("server")), "RSTR");
        assert_eq!(
            st(
                true,
                Some("no_handshake,no_termination,one_direction"),
                "none",
                None
            ),
            "S0"
        );
        assert_eq!(
            st(true, Some("no_handshake"), "rst_abort", Some("server")),
            "REJ"
        );
        assert_eq!(
            st(
                true,
                Some("no_handshake,one_direction"),
                "rst_abort",
                Some("client")
            ),
            "RSTOS0"
        );
        assert_eq!(
            st(
                true,
                Some("no_handshake,one_direction"),
                "fin",
                Some("client")
            ),
            "SH"
        );
        assert_eq!(st(true, Some("no_handshake"), "none", None), "OTH");
    }

    #[test]
    fn zeek_seconds_keep_every_microsecond() {
        assert_eq!(zeek_seconds(1_700_000_000_000_001), "1700000000.000001");
        assert_eq!(zeek_seconds(0), "0.000000");
        assert_eq!(zeek_seconds(1_234_567), "1.234567");
        assert_eq!(zeek_seconds(-5), "-0.000005");
    }
}
