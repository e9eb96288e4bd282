//! The data contract: every table mimic writes, each as ONE list of columns (name, SQL type,
//! unit, doc). Everything else comes from these lists:
//!
//! * the SQLite DDL ([`Table::create_sql`], and `ALTER TABLE … ADD COLUMN` for a column added
//!   by a later migration: [`schema_sql`]), which `db` applies level by level;
//! * one row type per table (`ConnectionRow`, `ExchangeRow`, …) with one field per column, in
//!   column order: writers fill a row and [`TableRow::bind`] binds it to the generated
//!   placeholders of [`Table::insert_sql`] (no positional list kept in step by hand, no count);
//! * the reader [`TableRow::read`] for `SELECT` [`Table::select_sql`];
//! * the column types of any other output (the Parquet schema takes its types from
//!   [`Column::sql_type`] and [`Column::not_null`]).
//!
//! Adding a column is one entry here, with `.since(N)` naming the migration that adds it: a new
//! database gets it from `CREATE TABLE`, an older one from the migration's generated
//! `ALTER TABLE`, and the compiler then points at every writer that must give it a value.
//! Column and table names are the contract DESIGN.md names; readers query them by name.
//!
//! Conventions (as in `schemas/0001_init.sql` since the first version): times are µs since the
//! Unix epoch, durations µs, rates IP-layer bits per second, byte counts TCP payload bytes
//! unless a column says otherwise; NULL means "not known / not measurable".

use std::borrow::Cow;
use std::fmt::Write as _;

use rusqlite::types::{Null, ValueRef};

/// A text value: borrowed for the fixed names writers use (`"fin"`, `"syn"`), owned for
/// addresses and for what a reader reads.
pub type Text = Cow<'static, str>;

/// The SQLite type a column is declared with.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum SqlType {
    Integer,
    Real,
    Text,
}

impl SqlType {
    pub fn as_str(self) -> &'static str {
        match self {
            SqlType::Integer => "INTEGER",
            SqlType::Real => "REAL",
            SqlType::Text => "TEXT",
        }
    }
}

/// What a column's number means.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Unit {
    /// An identifier, a name, an address, a port or an enumeration: no unit.
    None,
    /// A point in time, µs since the Unix epoch (UTC).
    EpochMicros,
    /// A duration, µs.
    Micros,
    /// IP-layer bits per second.
    BitsPerSecond,
    /// Bytes (TCP payload unless the column says otherwise).
    Bytes,
    /// Packets or segments.
    Packets,
    /// A number of events.
    Count,
    /// A fraction between 0 and 1.
    Fraction,
    /// 1 (yes) or 0 (no).
    Flag,
    /// A TCP window-scale shift count (0-14).
    Shift,
}

impl Unit {
    /// The unit as the documentation writes it (empty for [`Unit::None`]).
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::None => "",
            Unit::EpochMicros => "µs since epoch",
            Unit::Micros => "µs",
            Unit::BitsPerSecond => "bit/s",
            Unit::Bytes => "bytes",
            Unit::Packets => "packets",
            Unit::Count => "count",
            Unit::Fraction => "fraction",
            Unit::Flag => "0/1",
            Unit::Shift => "shift",
        }
    }
}

/// One column of the contract.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Column {
    pub name: &'static str,
    pub sql_type: SqlType,
    /// Declared `NOT NULL` (a primary-key column is not, as SQLite's own rule has it).
    pub not_null: bool,
    pub primary_key: bool,
    /// The `DEFAULT` clause's SQL value, as written (`0`, `'unknown'`).
    pub default: Option<&'static str>,
    /// `REFERENCES table(column)`.
    pub references: Option<&'static str>,
    pub unit: Unit,
    pub doc: &'static str,
    /// The migration level that added the column (1: the first schema).
    pub since: u32,
}

impl Column {
    /// The doc on one line.
    pub fn doc_line(&self) -> String {
        self.doc.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    /// Unit and doc, for a comment: `µs; SYN -> …`.
    fn note(&self) -> String {
        match (self.unit.as_str(), self.doc_line()) {
            ("", d) => d,
            (u, d) if d.is_empty() => u.to_string(),
            (u, d) => format!("{u}; {d}"),
        }
    }

    /// Whether SQLite lets the column hold NULL: not for `NOT NULL` and not for an `INTEGER
    /// PRIMARY KEY` (the rowid); a `TEXT PRIMARY KEY` does (SQLite's old rule) in a table that
    /// is not STRICT, as a database written before them has. Columnar outputs declare their
    /// fields nullable exactly then.
    pub fn nullable(&self) -> bool {
        !(self.not_null || (self.primary_key && self.sql_type == SqlType::Integer))
    }

    /// What a value of the column must be, as messages about a bad one say it: `INTEGER (never
    /// NULL)`, `REAL or NULL`.
    pub fn expected(&self) -> String {
        let null = if self.nullable() {
            " or NULL"
        } else {
            " (never NULL)"
        };
        format!("{}{null}", self.sql_type.as_str())
    }

    /// The column's definition in `CREATE TABLE` / `ALTER TABLE … ADD COLUMN`.
    pub fn ddl(&self) -> String {
        let mut s = format!("{} {}", self.name, self.sql_type.as_str());
        if self.primary_key {
            s.push_str(" PRIMARY KEY");
        } else if self.not_null {
            s.push_str(" NOT NULL");
        }
        if let Some(d) = self.default {
            let _ = write!(s, " DEFAULT {d}");
        }
        if let Some(r) = self.references {
            let _ = write!(s, " REFERENCES {r}");
        }
        s
    }
}

/// How a column is declared in the lists below: everything about it except what the row
/// type's field already says (its name, and its type and nullability through [`Value`]).
#[derive(Copy, Clone, Debug)]
pub struct Spec {
    unit: Unit,
    primary_key: bool,
    default: Option<&'static str>,
    references: Option<&'static str>,
    since: u32,
}

/// A column with `unit`, in the first schema, nullable exactly when its field is an `Option`.
pub const fn col(unit: Unit) -> Spec {
    Spec {
        unit,
        primary_key: false,
        default: None,
        references: None,
        since: 1,
    }
}

impl Spec {
    pub const fn primary_key(mut self) -> Spec {
        self.primary_key = true;
        self
    }
    /// `DEFAULT sql` (an SQL literal: `0`, `'unknown'`).
    pub const fn default(mut self, sql: &'static str) -> Spec {
        self.default = Some(sql);
        self
    }
    /// `REFERENCES target` (`connections(id)`).
    pub const fn references(mut self, target: &'static str) -> Spec {
        self.references = Some(target);
        self
    }
    /// Added by migration `level` (`ALTER TABLE … ADD COLUMN` on older databases).
    pub const fn since(mut self, level: u32) -> Spec {
        self.since = level;
        self
    }
    #[doc(hidden)]
    pub const fn column(
        self,
        name: &'static str,
        sql_type: SqlType,
        nullable: bool,
        doc: &'static str,
    ) -> Column {
        Column {
            name,
            sql_type,
            not_null: !nullable && !self.primary_key,
            primary_key: self.primary_key,
            default: self.default,
            references: self.references,
            unit: self.unit,
            doc,
            since: self.since,
        }
    }
}

/// One table of the contract.
#[derive(Debug)]
pub struct Table {
    pub name: &'static str,
    pub doc: &'static str,
    pub columns: &'static [Column],
    /// Table constraints after the columns (`PRIMARY KEY (conn_id, seq)`).
    pub constraints: &'static [&'static str],
    /// The migration level that created the table.
    pub since: u32,
}

impl Table {
    pub fn column(&self, name: &str) -> Option<&'static Column> {
        self.columns.iter().find(|c| c.name == name)
    }

    /// The column names, comma-separated, in column order.
    pub fn column_list(&self) -> String {
        let names: Vec<&str> = self.columns.iter().map(|c| c.name).collect();
        names.join(", ")
    }

    /// `CREATE TABLE` with the columns of migration `level` and before, each with its unit and
    /// doc as a comment (SQLite keeps the text: `sqlite3 flows.db .schema` shows them).
    ///
    /// The table is `STRICT` (SQLite 3.37, 2021): SQLite itself refuses a value of another type
    /// than the column's, from any writer (a hand edit in `sqlite3` too), so a reader need not
    /// scan the table for one ([`crate::db::check_value_types`] scans only tables without it:
    /// those created before, which a migration keeps as they are).
    pub fn create_sql(&self, level: u32) -> String {
        let cols: Vec<&Column> = self.columns.iter().filter(|c| c.since <= level).collect();
        let mut sql = format!("CREATE TABLE {} (\n", self.name);
        let items = cols.len() + self.constraints.len();
        for (i, c) in cols.iter().enumerate() {
            let sep = if i + 1 < items { "," } else { "" };
            let def = format!("    {}{sep}", c.ddl());
            let note = c.note();
            if note.is_empty() {
                let _ = writeln!(sql, "{def}");
            } else {
                let _ = writeln!(sql, "{def:<56} -- {note}");
            }
        }
        for (i, c) in self.constraints.iter().enumerate() {
            let sep = if cols.len() + i + 1 < items { "," } else { "" };
            let _ = writeln!(sql, "    {c}{sep}");
        }
        sql.push_str(") STRICT;\n");
        sql
    }

    /// `INSERT OR FAIL INTO table (every column) VALUES (?, …), …` for `rows` rows, the
    /// placeholders in column order: what [`TableRow::bind`] fills, row after row. (OR FAIL:
    /// a multi-row statement then needs no statement journal; an error ends the whole write
    /// anyway.)
    pub fn insert_sql(&self, rows: usize) -> String {
        let one = format!("({})", vec!["?"; self.columns.len()].join(","));
        format!(
            "INSERT OR FAIL INTO {} ({}) VALUES {}",
            self.name,
            self.column_list(),
            vec![one.as_str(); rows.max(1)].join(",")
        )
    }

    /// `SELECT every column FROM table`: what [`TableRow::read`] reads.
    pub fn select_sql(&self) -> String {
        format!("SELECT {} FROM {}", self.column_list(), self.name)
    }

    /// `SELECT` the named columns `FROM table`, for a reader that needs a few columns of a
    /// large table (`mimic compare` of the 595,327-exchange benchmark database with itself:
    /// 2.2 s reading whole `exchanges` rows, 1.5 s reading the two it uses). Panics on a name that is not a column of this table: that is a reader
    /// out of step with the contract, which its tests catch on the first query.
    pub fn select_columns_sql(&self, columns: &[&str]) -> String {
        for c in columns {
            assert!(
                self.column(c).is_some(),
                "{c} is not a column of table {}",
                self.name
            );
        }
        format!("SELECT {} FROM {}", columns.join(", "), self.name)
    }
}

/// One value of a row as the writers other than SQLite's take it (the Parquet writer): the
/// column's type, or NULL.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum Cell<'a> {
    Integer(i64),
    Real(f64),
    Text(&'a str),
    Null,
}

/// A Rust type a column holds: its SQL type, whether NULL is allowed, and how it is bound and
/// read. Columns hold `i64`, `f64` or [`Text`], or an `Option` of one (nullable).
pub trait Value: Sized {
    const SQL_TYPE: SqlType;
    const NULLABLE: bool;
    /// The value as a [`Cell`].
    fn cell(&self) -> Cell<'_>;
    fn bind(&self, st: &mut rusqlite::Statement<'_>, idx: usize) -> rusqlite::Result<()>;
    fn read(r: &rusqlite::Row<'_>, idx: usize) -> rusqlite::Result<Self>;
}

impl Value for i64 {
    const SQL_TYPE: SqlType = SqlType::Integer;
    const NULLABLE: bool = false;
    #[inline]
    fn cell(&self) -> Cell<'_> {
        Cell::Integer(*self)
    }
    #[inline]
    fn bind(&self, st: &mut rusqlite::Statement<'_>, idx: usize) -> rusqlite::Result<()> {
        st.raw_bind_parameter(idx, *self)
    }
    fn read(r: &rusqlite::Row<'_>, idx: usize) -> rusqlite::Result<Self> {
        r.get(idx)
    }
}

impl Value for f64 {
    const SQL_TYPE: SqlType = SqlType::Real;
    const NULLABLE: bool = false;
    #[inline]
    fn cell(&self) -> Cell<'_> {
        Cell::Real(*self)
    }
    #[inline]
    fn bind(&self, st: &mut rusqlite::Statement<'_>, idx: usize) -> rusqlite::Result<()> {
        st.raw_bind_parameter(idx, *self)
    }
    fn read(r: &rusqlite::Row<'_>, idx: usize) -> rusqlite::Result<Self> {
        r.get(idx)
    }
}

impl Value for Text {
    const SQL_TYPE: SqlType = SqlType::Text;
    const NULLABLE: bool = false;
    #[inline]
    fn cell(&self) -> Cell<'_> {
        Cell::Text(self.as_ref())
    }
    #[inline]
    fn bind(&self, st: &mut rusqlite::Statement<'_>, idx: usize) -> rusqlite::Result<()> {
        st.raw_bind_parameter(idx, self.as_ref())
    }
    fn read(r: &rusqlite::Row<'_>, idx: usize) -> rusqlite::Result<Self> {
        r.get::<_, String>(idx).map(Cow::Owned)
    }
}

impl<T: Value> Value for Option<T> {
    const SQL_TYPE: SqlType = T::SQL_TYPE;
    const NULLABLE: bool = true;
    #[inline]
    fn cell(&self) -> Cell<'_> {
        match self {
            Some(v) => v.cell(),
            None => Cell::Null,
        }
    }
    #[inline]
    fn bind(&self, st: &mut rusqlite::Statement<'_>, idx: usize) -> rusqlite::Result<()> {
        match self {
            Some(v) => v.bind(st, idx),
            None => st.raw_bind_parameter(idx, Null),
        }
    }
    fn read(r: &rusqlite::Row<'_>, idx: usize) -> rusqlite::Result<Self> {
        match r.get_ref(idx)? {
            ValueRef::Null => Ok(None),
            _ => T::read(r, idx).map(Some),
        }
    }
}

/// A value a reader could not take (text that is not UTF-8, a type or range its field does
/// not hold), named by table, row and column: rusqlite's own error gives a column index and,
/// for text, an offset into the value.
#[derive(Debug, thiserror::Error)]
#[error("table {table}, row with {key}: {column} holds {what}; the database was changed outside mimic or is damaged")]
pub struct BadRead {
    pub table: &'static str,
    /// The row's first column and its value (`id = 7`, `conn_id = 3`, `key = 'role'`).
    pub key: String,
    pub column: &'static str,
    pub what: String,
}

impl BadRead {
    /// The damaged value in a line of a reader that skips the row, the row named by `noun`
    /// (`connection with id = 3: client_ip holds text that is not UTF-8: '10.\xff.0.1'`).
    pub fn brief(&self, noun: &str) -> String {
        format!(
            "{noun} with {}: {} holds {}",
            self.key, self.column, self.what
        )
    }
}

/// The [`BadRead`] behind `e`, when `e` is a value of a row that a reader could not take
/// (the row is damaged; the statement and the database are fine): for readers that skip such
/// a row as a corrupt record instead of failing.
pub fn bad_read(e: &rusqlite::Error) -> Option<&BadRead> {
    match e {
        rusqlite::Error::FromSqlConversionFailure(_, _, inner) => inner.downcast_ref(),
        _ => None,
    }
}

/// How a value shows in a message: text quoted with its bytes that are not printable ASCII
/// escaped (`\xff`), numbers as they are.
pub fn show_value(v: ValueRef<'_>) -> String {
    match v {
        ValueRef::Null => "NULL".into(),
        ValueRef::Integer(i) => i.to_string(),
        ValueRef::Real(f) => f.to_string(),
        ValueRef::Text(t) => format!("'{}'", t.escape_ascii()),
        ValueRef::Blob(b) => format!("a BLOB of {} bytes", b.len()),
    }
}

/// How a message names a row: by its first column (every contract table's key comes first)
/// and that column's value, `id = 7`.
pub fn row_key(r: &rusqlite::Row<'_>) -> String {
    match (r.as_ref().column_name(0), r.get_ref(0)) {
        (Ok(name), Ok(v)) => format!("{name} = {}", show_value(v)),
        _ => "its first column unreadable".into(),
    }
}

/// Turns a failed read of column `idx` of a row of `table` (read with [`Table::select_sql`])
/// into a [`BadRead`] that names them; other errors (the statement's, SQLite's) pass unchanged.
#[cold]
fn name_bad_read(
    e: rusqlite::Error,
    table: &'static Table,
    r: &rusqlite::Row<'_>,
    idx: usize,
) -> rusqlite::Error {
    use rusqlite::Error as E;
    let column = &table.columns[idx];
    // the value the read failed on (the statement has the column: the read got to its value)
    let Ok(value) = r.get_ref(idx) else {
        return e;
    };
    let what = match &e {
        E::Utf8Error(..) => format!("text that is not UTF-8: {}", show_value(value)),
        E::InvalidColumnType(_, _, t) => format!(
            "{} ({t}), where the data contract has {}",
            show_value(value),
            column.expected()
        ),
        E::IntegralValueOutOfRange(_, v) => format!("{v}, out of its field's range"),
        E::FromSqlConversionFailure(_, t, inner) => {
            format!("a {t} value it cannot be read as: {inner}")
        }
        _ => return e,
    };
    let key = row_key(r);
    E::FromSqlConversionFailure(
        // rusqlite's "unknown column": its message is then ours alone
        usize::MAX,
        value.data_type(),
        Box::new(BadRead {
            table: table.name,
            key,
            column: column.name,
            what,
        }),
    )
}

/// A row of one table: one field per column, in column order.
pub trait TableRow: Sized {
    const TABLE: &'static Table;
    /// Binds the row's values to parameters `first`, `first + 1`, … of a statement made from
    /// [`Table::insert_sql`] (`first` is 1 for the first row, `1 + k * columns` for row k).
    fn bind(&self, st: &mut rusqlite::Statement<'_>, first: usize) -> rusqlite::Result<()>;
    /// Reads a row of [`Table::select_sql`].
    fn read(r: &rusqlite::Row<'_>) -> rusqlite::Result<Self>;
    /// Calls `f` with each column's value, in column order (for writers other than SQLite's).
    fn for_each_cell(&self, f: impl FnMut(Cell<'_>));

    /// Inserts the row on its own (writers that insert many rows use multi-row statements).
    fn insert(&self, conn: &rusqlite::Connection) -> rusqlite::Result<()> {
        let mut st = conn.prepare_cached(&Self::TABLE.insert_sql(1))?;
        self.bind(&mut st, 1)?;
        st.raw_execute().map(|_| ())
    }

    /// Every row of the table, in `ORDER BY order` (an SQL expression over its columns).
    fn read_all(conn: &rusqlite::Connection, order: &str) -> rusqlite::Result<Vec<Self>> {
        let mut st = conn.prepare(&format!("{} ORDER BY {order}", Self::TABLE.select_sql()))?;
        let rows = st.query_map([], |r| Self::read(r))?;
        rows.collect()
    }
}

/// Declares the tables: for each, a row struct and its [`TableRow`] implementation whose
/// [`Table`] lists the fields as columns (doc comments become the columns' docs).
macro_rules! tables {
    ($(
        $(#[doc = $tdoc:literal])*
        pub struct $Row:ident in $table:literal since $tsince:literal
            $(, constraint $constraint:literal)* {
            $(
                $(#[doc = $doc:literal])*
                $field:ident : $ty:ty => $spec:expr
            ),* $(,)?
        }
    )*) => {
        $(
            $(#[doc = $tdoc])*
            #[doc = ""]
            #[doc = concat!("One row of table `", $table, "`: one field per column, in column order.")]
            #[derive(Clone, Debug, Default, PartialEq)]
            pub struct $Row {
                $( $(#[doc = $doc])* pub $field: $ty, )*
            }

            impl TableRow for $Row {
                const TABLE: &'static Table = &Table {
                    name: $table,
                    doc: concat!($($tdoc, "\n"),*),
                    columns: &[$(
                        $spec.column(
                            stringify!($field),
                            <$ty as Value>::SQL_TYPE,
                            <$ty as Value>::NULLABLE,
                            concat!($($doc, "\n"),*),
                        )
                    ),*],
                    constraints: &[$($constraint),*],
                    since: $tsince,
                };

                #[inline]
                fn bind(
                    &self,
                    st: &mut rusqlite::Statement<'_>,
                    first: usize,
                ) -> rusqlite::Result<()> {
                    let mut idx = first;
                    $(
                        Value::bind(&self.$field, st, idx)?;
                        idx += 1;
                    )*
                    let _ = idx;
                    Ok(())
                }

                #[inline]
                fn for_each_cell(&self, mut f: impl FnMut(Cell<'_>)) {
                    $( f(Value::cell(&self.$field)); )*
                }

                // the last column's increment is never read
                #[allow(unused_assignments)]
                fn read(r: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
                    let mut idx = 0;
                    Ok($Row {
                        $( $field: {
                            let v = Value::read(r, idx)
                                .map_err(|e| name_bad_read(e, Self::TABLE, r, idx))?;
                            idx += 1;
                            v
                        }, )*
                    })
                }
            }
        )*

        /// Every table of the contract, in creation order.
        pub const TABLES: &[&Table] = &[$(<$Row as TableRow>::TABLE),*];
    };
}

tables! {
    /// Key/value facts about the database: schema version and migration level, the tool and
    /// its version, the inputs, the role (`original`, `synth`, `replay`), analysis settings.
    pub struct MetaRow in "meta" since 1 {
        /// The fact's name (`schema_version`, `role`, …).
        key: Text => col(Unit::None).primary_key(),
        /// Its value, as text.
        value: Option<Text> => col(Unit::None),
    }

    /// One row per TCP connection (an analysis's, a synthetic workload's or a replay's).
    pub struct ConnectionRow in "connections" since 1 {
        /// Connection id, unique in the database (exchanges and samples refer to it).
        id: i64 => col(Unit::None).primary_key(),
        /// Client address (IPv4 dotted, IPv6 RFC 5952 text); the client is the side that
        /// opened the connection, or as `server_by` says.
        client_ip: Text => col(Unit::None),
        client_port: i64 => col(Unit::None),
        /// Server address.
        server_ip: Text => col(Unit::None),
        server_port: i64 => col(Unit::None),
        /// Outermost VLAN id, NULL when untagged.
        vlan: Option<i64> => col(Unit::None),
        /// 4 or 6.
        ip_version: i64 => col(Unit::None),
        /// Client SYN (first one seen); NULL without a SYN.
        t_syn: Option<i64> => col(Unit::EpochMicros),
        /// First packet of the connection.
        t_first: i64 => col(Unit::EpochMicros),
        /// Last packet of the connection.
        t_end: i64 => col(Unit::EpochMicros),
        /// 1: handshake, termination and no sequence holes.
        complete: i64 => col(Unit::Flag),
        /// Why not complete (comma-separated), NULL if complete.
        prune_reason: Option<Text> => col(Unit::None),
        /// How the server side was chosen: syn, synack, port, net, guess.
        server_by: Text => col(Unit::None),
        /// Min tap->client->tap + min tap->server->tap over handshake and Karn-valid
        /// data->ACK samples.
        min_rtt_us: Option<i64> => col(Unit::Micros),
        /// SYN -> client's ACK of the SYN-ACK at the capture point.
        hs_rtt_us: Option<i64> => col(Unit::Micros),
        /// RTT samples taken (rtt_samples rows keep the first ones, the minimum and the
        /// largest of a segment that had data sent after it, per direction).
        rtt_samples: i64 => col(Unit::Count).default("0"),
        /// MSS option of the client's SYN.
        mss_client: Option<i64> => col(Unit::Bytes),
        /// MSS option of the server's SYN-ACK.
        mss_server: Option<i64> => col(Unit::Bytes),
        /// Window-scale option of the client's SYN.
        wscale_client: Option<i64> => col(Unit::Shift),
        /// Window-scale option of the server's SYN-ACK.
        wscale_server: Option<i64> => col(Unit::Shift),
        /// Both SYNs carried SACK-permitted.
        sack_ok: Option<i64> => col(Unit::Flag),
        /// Both SYNs carried timestamps.
        ts_ok: Option<i64> => col(Unit::Flag),
        /// ECN negotiated (SYN with ECE+CWR, SYN-ACK with ECE).
        ecn_ok: Option<i64> => col(Unit::Flag),
        /// Client SYN retransmissions.
        syn_retx: i64 => col(Unit::Count).default("0"),
        /// Server SYN-ACK retransmissions.
        synack_retx: i64 => col(Unit::Count).default("0"),
        /// Client receive window: scaled window at the first request segment.
        rwin_bytes: Option<i64> => col(Unit::Bytes),
        /// Window in the client's SYN (unscaled, as RFC 7323 says).
        rwin_syn_bytes: Option<i64> => col(Unit::Bytes),
        /// Times the client advertised a zero window.
        zero_window: i64 => col(Unit::Count).default("0"),
        /// Downstream (server -> client) data segments.
        data_pkts_down: i64 => col(Unit::Packets).default("0"),
        /// Downstream unique payload bytes.
        data_bytes_down: i64 => col(Unit::Bytes).default("0"),
        /// Downstream retransmissions.
        retx_down: i64 => col(Unit::Packets).default("0"),
        /// Downstream retransmissions found spurious.
        spurious_retx_down: i64 => col(Unit::Packets).default("0"),
        /// dsack or dupack (how spurious ones were detected).
        spurious_by: Option<Text> => col(Unit::None),
        /// (retx - spurious) / data segments sent.
        loss_rate_down: Option<f64> => col(Unit::Fraction),
        /// The part the bottleneck queue does not explain: losses whose original was sent with
        /// no more in flight than bw x min RTT + the class queue (replayed as i.i.d.).
        loss_random_down: Option<f64> => col(Unit::Fraction),
        /// Upstream (client -> server) data segments.
        data_pkts_up: i64 => col(Unit::Packets).default("0"),
        /// Upstream unique payload bytes.
        data_bytes_up: i64 => col(Unit::Bytes).default("0"),
        /// Upstream retransmissions.
        retx_up: i64 => col(Unit::Packets).default("0"),
        /// FINs sent again (either side).
        fin_retx: i64 => col(Unit::Count).default("0"),
        /// Data sent into a closed (zero) window, either side.
        zwnd_probes: i64 => col(Unit::Packets).default("0"),
        /// Frames captured more than once (same IPv4 datagram), ignored.
        dup_frames: i64 => col(Unit::Count).default("0"),
        /// Bottleneck bandwidth (packet pairs on the client's ACK spacing), IP layer.
        bw_bps: Option<f64> => col(Unit::BitsPerSecond),
        /// Bandwidth samples the combiner used for bw_bps.
        bw_samples: i64 => col(Unit::Count).default("0"),
        /// Client delayed-ACK policy in slow start: quick / delayed / unknown.
        delack_policy: Text => col(Unit::None).default("'unknown'"),
        /// Client ACKs per data segment in slow start.
        acks_per_seg: Option<f64> => col(Unit::None),
        /// Client delayed-ACK timer.
        delack_timeout_us: Option<i64> => col(Unit::Micros),
        /// fin / rst_after_response / rst_abort / none.
        termination: Text => col(Unit::None),
        /// client / server / NULL.
        closed_by: Option<Text> => col(Unit::None),
        /// Request/response exchanges (rows in exchanges).
        exchanges: i64 => col(Unit::Count).default("0"),
        /// First request byte to last response byte.
        response_time_us: Option<i64> => col(Unit::Micros),
        /// Sequence ranges never seen (server side).
        holes_down: i64 => col(Unit::Count).default("0"),
        /// Sequence ranges never seen (client side).
        holes_up: i64 => col(Unit::Count).default("0"),
        /// Frames of the connection.
        frames: i64 => col(Unit::Packets).default("0"),
        /// Community ID v1 of the connection's addresses and ports (seed 0, TCP), the flow hash
        /// Zeek, Suricata, Arkime and Elastic emit; NULL in rows written before migration 3.
        community_id: Option<Text> => col(Unit::None).since(3),
        /// Where bw_bps came from: trains / pairs (of this connection's own ACKs) / none; a
        /// replay that pools rates fills the rest at replay time. NULL in rows written before
        /// migration 4.
        bw_source: Option<Text> => col(Unit::None).since(4),
        /// Largest receive window the client advertised (scaled) once it had sent data: the
        /// most a replay's client lets the server have in flight (a client whose stack grew
        /// its window, as Linux autotuning does, past rwin_bytes). NULL in rows written before
        /// migration 6.
        rwin_max_bytes: Option<i64> => col(Unit::Bytes).since(6),
        /// Downstream bottleneck queue (the packet being sent included) the server's
        /// transmissions show at the estimated rate: the deepest a delivered packet found a
        /// drop-tail queue fed with them (lost originals left out). A lower bound of the queue,
        /// or its length where queue_down_full says so. NULL without a rate, and in rows written
        /// before migration 6.
        queue_down_pkts: Option<i64> => col(Unit::Packets).since(6),
        /// 1: an original was lost to the queue at queue_down_pkts (an overflow), so the queue
        /// holds no more; 0: the queue never overflowed, and holds at least that many. NULL
        /// where queue_down_pkts is.
        queue_down_full: Option<i64> => col(Unit::Flag).since(6),
        /// How much earlier than a store-and-forward link the downstream bottleneck delivered
        /// the server's packets that met a short queue, in units of each packet's own
        /// serialization at bw_bps (the median over the packets with at most one ahead in the
        /// queue model, clamped to 0..8): near 0 a link that serializes every packet, near 1 a
        /// token bucket (tc htb/tbf, a cable modem) that lets each leave at the start of its
        /// slot; above 1 (since 2026-11-28) a bucket that many full-size packets deep, read
        /// from the packets that met 2-7 ahead where at least 4 did. NULL without a rate,
        /// without packets slow enough to measure (2 ms of serialization), and in rows written
        /// before migration 7; rows written before 2026-11-28 stop at 1.
        shaper_lead_down: Option<f64> => col(Unit::Packets).since(7),
    }

    /// One row per request/response exchange (an application data unit each way).
    pub struct ExchangeRow in "exchanges" since 1, constraint "PRIMARY KEY (conn_id, seq)" {
        /// The connection (`connections.id`).
        conn_id: i64 => col(Unit::None).references("connections(id)"),
        /// 0-based order within the connection.
        seq: i64 => col(Unit::None),
        /// First request packet.
        t_req_first: Option<i64> => col(Unit::EpochMicros),
        /// Last request packet.
        t_req_last: Option<i64> => col(Unit::EpochMicros),
        /// Request payload.
        req_bytes: i64 => col(Unit::Bytes),
        /// First response packet.
        t_resp_first: Option<i64> => col(Unit::EpochMicros),
        /// Last response packet.
        t_resp_last: Option<i64> => col(Unit::EpochMicros),
        /// Response payload.
        resp_bytes: i64 => col(Unit::Bytes),
        /// Last request packet -> first response packet.
        response_delay_us: Option<i64> => col(Unit::Micros),
        /// First response packet -> first packet after the server's pause.
        query_delay_us: Option<i64> => col(Unit::Micros),
        /// Response bytes sent before the query delay.
        header_bytes: Option<i64> => col(Unit::Bytes),
        /// Previous response's last packet -> this request's first.
        think_time_us: Option<i64> => col(Unit::Micros),
        /// Plaintext HTTP/1.x request method, when captured.
        method: Option<Text> => col(Unit::None),
        /// Plaintext HTTP/1.x response status, when captured.
        status: Option<i64> => col(Unit::None),
        /// Time the client's advertised receive window stayed at zero while the server still
        /// had this response to send (the client stopped reading): the sum of the closed
        /// intervals, from the client's zero-window ACK to its window update, as the tap saw
        /// them; 0 when it never closed. NULL in rows written before migration 5.
        zero_window_us: Option<i64> => col(Unit::Micros).since(5),
        /// Response bytes the client had acknowledged when its window first closed during this
        /// response (NULL when it never closed, and in rows written before migration 5).
        zero_window_at_bytes: Option<i64> => col(Unit::Bytes).since(5),
        /// Every interval the client's window stayed at zero while the server still had this
        /// response to send, in order, as `AT:US` pairs separated by spaces: the response bytes
        /// the client had acknowledged when its window closed and the time it stayed closed
        /// (their sum is zero_window_us). NULL when it never closed, and in rows written before
        /// migration 8.
        zero_window_stalls: Option<Text> => col(Unit::None).since(8),
        /// The rate at which the client read this response while its window was open, where
        /// its window showed it reading slower than the data came (it closed, or fell below a
        /// quarter of the largest the client advertised while response data was outstanding):
        /// response bytes (TCP payload) over the time from the first to the last response
        /// packet less the closed intervals and the query delay. NULL where the window never
        /// showed it (the client read at once), and in rows written before migration 8.
        read_rate_bps: Option<f64> => col(Unit::BitsPerSecond).since(8),
        /// What showed read_rate_bps: `window` (the client's window closed or drained while
        /// response data was outstanding) or `ack_clock` (its window stayed open, but the
        /// response took clearly longer than its bottleneck rate and slow start allow, with no
        /// loss to explain it: the client's ACKs fell behind its path). NULL where there is no
        /// read rate, and in rows written before migration 9.
        read_rate_by: Option<Text> => col(Unit::None).since(9),
        /// The client's advertised receive window while the server had this response's data
        /// outstanding, as `AT:BYTES` pairs separated by spaces: the response bytes the client
        /// had acknowledged and the window (bytes, scaled) it advertised with them — the first
        /// such window, then each that moved by 1/8 or more from the previous pair's (at most
        /// 64; zero windows are in zero_window_stalls instead). A window that shrinks while
        /// the client reads (a reader that lags without stopping, a receive buffer filled by
        /// large packet buffers) holds the server back as the path does not. NULL where the
        /// client acknowledged no response data, and in rows written before migration 10.
        rwin_profile: Option<Text> => col(Unit::None).since(10),
    }

    /// Bandwidth samples: packet pairs (two consecutive client ACKs advancing over server
    /// segments sent in one burst, none retransmitted, spaced wider than the server sent them)
    /// and trains (the first to the last ACK of a run of such segments, spanning at least
    /// 10 ms).
    pub struct BwSampleRow in "bw_samples" since 1 {
        conn_id: i64 => col(Unit::None).references("connections(id)"),
        /// Time of the second ACK of the pair (the last ACK of the train).
        t_us: i64 => col(Unit::EpochMicros),
        /// The pair's (the train's) rate.
        bps: f64 => col(Unit::BitsPerSecond),
        /// IP bytes newly acknowledged by the second ACK (by the train's ACKs after its first).
        bytes: i64 => col(Unit::Bytes),
        /// Spacing of the two ACKs (the first and last ACK of the train).
        gap_us: i64 => col(Unit::Micros),
        /// 1 if the combiner used it for bw_bps (see meta bw_method).
        used: i64 => col(Unit::Flag),
        /// pair / train (NULL in rows written before migration 4: pairs).
        kind: Option<Text> => col(Unit::None).since(4),
    }

    /// RTT samples: the first ones, the minimum and the largest per direction (the largest of
    /// a segment with data sent after it, whose ACK no delayed-ACK timer held: the deepest
    /// bottleneck queue seen, which a replay sizes its queue by).
    pub struct RttSampleRow in "rtt_samples" since 1 {
        conn_id: i64 => col(Unit::None).references("connections(id)"),
        /// When the sample was taken (the acknowledgement).
        t_us: i64 => col(Unit::EpochMicros),
        /// The round trip measured.
        rtt_us: i64 => col(Unit::Micros),
        /// handshake (SYN -> client's ACK of the SYN-ACK), data (server data -> client ACK),
        /// upstream (client data -> server ACK).
        kind: Text => col(Unit::None),
    }

    /// Replay databases: which replayed connection reproduces which original one.
    pub struct ReplayMapRow in "replay_map" since 1 {
        /// The connection of the replayed workload (`connections.id` there).
        orig_conn_id: i64 => col(Unit::None).primary_key(),
        /// This database's connection that replays it; NULL when the replayed connection failed or was not seen.
        replay_conn_id: Option<i64> => col(Unit::None),
        /// ok / failed / missing.
        status: Text => col(Unit::None),
        /// refused / reset / timeout / ... when failed.
        failure: Option<Text> => col(Unit::None),
        /// The 4-tuple the replay used.
        client_ip: Option<Text> => col(Unit::None),
        client_port: Option<i64> => col(Unit::None),
        server_ip: Option<Text> => col(Unit::None),
        server_port: Option<i64> => col(Unit::None),
    }

    /// Replay databases: each replayed connection's emulated pipes, as configured and as the
    /// network emulator counted them (packets accepted, dropped by the queue limit, dropped by
    /// the loss model).
    pub struct ReplayPipeRow in "replay_pipes" since 1 {
        /// The connection of the replayed workload.
        orig_conn_id: i64 => col(Unit::None).primary_key(),
        /// Delay added each way: the original's one-way delay less half the LAN's own round
        /// trip (`meta.lan_rtt_us`), which the router adds.
        one_way_delay_us: i64 => col(Unit::Micros),
        /// Downstream rate limit; NULL: none.
        down_rate_bps: Option<f64> => col(Unit::BitsPerSecond),
        /// Downstream i.i.d. loss rate.
        down_loss: f64 => col(Unit::Fraction),
        /// Upstream queue limit.
        queue_up: i64 => col(Unit::Packets),
        /// Downstream queue limit.
        queue_down: i64 => col(Unit::Packets),
        /// Delayed-ACK shaping of the client's pure ACKs: one ACK per this many.
        ack_every: Option<i64> => col(Unit::Count),
        /// The delayed-ACK shaping's timer.
        ack_timeout_us: Option<i64> => col(Unit::Micros),
        /// Upstream packets the emulator accepted; NULL: not counted.
        up_packets: Option<i64> => col(Unit::Packets),
        /// Upstream packets dropped by the queue limit.
        up_queue_drops: Option<i64> => col(Unit::Packets),
        /// Upstream packets dropped by the loss model.
        up_loss_drops: Option<i64> => col(Unit::Packets),
        /// Downstream packets the emulator accepted.
        down_packets: Option<i64> => col(Unit::Packets),
        /// Downstream bytes the emulator accepted (IP packets).
        down_bytes: Option<i64> => col(Unit::Bytes),
        /// Downstream packets dropped by the queue limit.
        down_queue_drops: Option<i64> => col(Unit::Packets),
        /// Downstream packets dropped by the loss model.
        down_loss_drops: Option<i64> => col(Unit::Packets),
        /// Longest downstream queue seen.
        down_max_queue: Option<i64> => col(Unit::Packets),
    }
}

/// The tables and columns migration `level` adds, as SQL: `CREATE TABLE` for a table of that
/// level (with its columns up to that level), `ALTER TABLE … ADD COLUMN` for a later column of
/// an older table. The hand-written part of a migration (indexes, views) is its file in
/// `schemas/`.
pub fn schema_sql(level: u32) -> String {
    schema_sql_of(TABLES, level)
}

/// [`schema_sql`] of any list of tables.
pub fn schema_sql_of(tables: &[&Table], level: u32) -> String {
    let mut sql = String::new();
    for t in tables {
        if t.since == level {
            sql.push_str(&t.create_sql(level));
        } else if t.since < level {
            for c in t.columns.iter().filter(|c| c.since == level) {
                let _ = writeln!(sql, "ALTER TABLE {} ADD COLUMN {};", t.name, c.ddl());
            }
        }
    }
    sql
}

/// The contract as a Markdown table per table (name, type, unit, doc): the reference the
/// documentation points to, generated so that it cannot drift.
pub fn markdown() -> String {
    let mut s = String::new();
    for t in TABLES {
        let _ = writeln!(
            s,
            "### `{}`\n\n{}\n",
            t.name,
            t.doc.trim().replace("\n ", " ")
        );
        let _ = writeln!(s, "| column | type | unit | meaning |\n|---|---|---|---|");
        for c in t.columns {
            let ty = format!(
                "{}{}{}",
                c.sql_type.as_str(),
                if c.primary_key {
                    " PRIMARY KEY"
                } else if c.not_null {
                    " NOT NULL"
                } else {
                    ""
                },
                if c.since > 1 {
                    format!(" (migration {})", c.since)
                } else {
                    String::new()
                }
            );
            let _ = writeln!(
                s,
                "| `{}` | {ty} | {} | {} |",
                c.name,
                c.unit.as_str(),
                c.doc_line()
            );
        }
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::Connection;

    /// `pragma table_info` as (name, type, notnull, default, pk) per column.
    type Info = Vec<(String, String, bool, Option<String>, i64)>;

    fn table_info(c: &Connection, table: &str) -> Info {
        let mut st = c.prepare(&format!("PRAGMA table_info({table})")).unwrap();
        let rows = st
            .query_map([], |r| {
                Ok((r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?))
            })
            .unwrap();
        rows.collect::<rusqlite::Result<_>>().unwrap()
    }

    /// `info` as the STRICT table of the same columns reports it: its key columns NOT NULL,
    /// but for the rowid (a one-column INTEGER PRIMARY KEY).
    fn as_strict(info: Info) -> Info {
        let keys = info.iter().filter(|c| c.4 > 0).count();
        info.into_iter()
            .map(|(n, ty, nn, d, pk)| {
                let rowid = keys == 1 && pk == 1 && ty == "INTEGER";
                (n, ty, nn || (pk > 0 && !rowid), d, pk)
            })
            .collect()
    }

    /// What `pragma table_info` must say of a table declared by `t` (STRICT).
    fn expected_info(t: &Table) -> Info {
        let composite: Vec<String> = t
            .constraints
            .iter()
            .filter_map(|c| c.strip_prefix("PRIMARY KEY ("))
            .flat_map(|c| {
                c.trim_end_matches(')')
                    .split(',')
                    .map(|s| s.trim().to_string())
            })
            .collect();
        let declared: Info = t
            .columns
            .iter()
            .map(|c| {
                let pk = if c.primary_key {
                    1
                } else {
                    composite
                        .iter()
                        .position(|n| n == c.name)
                        .map_or(0, |i| i as i64 + 1)
                };
                (
                    c.name.to_string(),
                    c.sql_type.as_str().to_string(),
                    c.not_null,
                    c.default.map(str::to_string),
                    pk,
                )
            })
            .collect();
        as_strict(declared)
    }

    fn fresh_db() -> Connection {
        let c = Connection::open_in_memory().unwrap();
        crate::db::init_schema(&c).unwrap();
        c
    }

    fn user_tables(c: &Connection) -> Vec<String> {
        let mut st = c
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY rowid")
            .unwrap();
        let rows = st.query_map([], |r| r.get(0)).unwrap();
        rows.collect::<rusqlite::Result<_>>().unwrap()
    }

    /// The DDL generated from the lists is what SQLite reports of a database mimic creates:
    /// the same tables in order, and for each the columns in list order with the listed type,
    /// NOT NULL, default and primary key.
    #[test]
    fn generated_tables_are_what_sqlite_reports() {
        let c = fresh_db();
        let names: Vec<&str> = TABLES.iter().map(|t| t.name).collect();
        assert_eq!(user_tables(&c), names);
        for t in TABLES {
            assert_eq!(table_info(&c, t.name), expected_info(t), "table {}", t.name);
        }
    }

    /// A reader's few columns are selected by name; a name the table does not have is the
    /// reader's bug and stops it before any query.
    #[test]
    fn a_column_subset_is_selected_by_name_and_an_unknown_one_refused() {
        let t = ExchangeRow::TABLE;
        assert_eq!(
            t.select_columns_sql(&["response_delay_us", "query_delay_us"]),
            "SELECT response_delay_us, query_delay_us FROM exchanges"
        );
        let c = fresh_db();
        c.prepare(&t.select_columns_sql(&["conn_id", "seq"]))
            .unwrap();
        let e = std::panic::catch_unwind(|| t.select_columns_sql(&["response_delay"])).unwrap_err();
        let msg = e.downcast_ref::<String>().unwrap();
        assert_eq!(msg, "response_delay is not a column of table exchanges");
    }

    /// A database created with the first schema as it was written by hand (before the lists)
    /// and migrated, and one created from the lists, have the same tables, columns (name,
    /// type, NOT NULL, default, primary key), foreign keys and indexes: old and new databases
    /// are read alike, by old and new builds.
    #[test]
    fn the_lists_reproduce_the_hand_written_first_schema() {
        let old = Connection::open_in_memory().unwrap();
        old.execute_batch(include_str!("../testdata/schema1.sql"))
            .unwrap();
        old.pragma_update(None, "user_version", 1).unwrap();
        // brought up to this build's level as `open_existing` does
        crate::db::migrate(&old).unwrap();
        let new = fresh_db();
        assert_eq!(user_tables(&old), user_tables(&new));
        for t in user_tables(&old) {
            // the same columns; the old tables are not STRICT (a migration keeps them as they
            // are), so their TEXT key takes NULL where the new one does not
            assert_eq!(
                as_strict(table_info(&old, &t)),
                table_info(&new, &t),
                "table {t}"
            );
            for pragma in ["foreign_key_list", "index_list"] {
                let dump = |c: &Connection| {
                    let mut st = c.prepare(&format!("PRAGMA {pragma}({t})")).unwrap();
                    let n = st.column_count();
                    let rows = st
                        .query_map([], |r| {
                            (0..n)
                                .map(|i| r.get_ref(i).map(|v| format!("{v:?}")))
                                .collect::<rusqlite::Result<Vec<_>>>()
                        })
                        .unwrap();
                    rows.collect::<rusqlite::Result<Vec<_>>>().unwrap()
                };
                assert_eq!(dump(&old), dump(&new), "{pragma}({t})");
            }
        }
    }

    /// What makes a list usable for migrations: names unique, columns added later come after
    /// the older ones (ALTER TABLE appends), and a later column can be added to a table that
    /// has rows (not a key; NOT NULL only with a default).
    #[test]
    fn the_lists_are_well_formed() {
        for t in TABLES {
            let mut seen = std::collections::HashSet::new();
            for c in t.columns {
                assert!(seen.insert(c.name), "{}.{} twice", t.name, c.name);
                assert!(
                    c.since >= t.since,
                    "{}.{} older than its table",
                    t.name,
                    c.name
                );
                if c.since > t.since {
                    assert!(
                        !c.primary_key,
                        "{}.{}: a later column cannot be a key",
                        t.name, c.name
                    );
                    assert!(
                        !c.not_null || c.default.is_some(),
                        "{}.{}: a later NOT NULL column needs a default",
                        t.name,
                        c.name
                    );
                }
            }
            assert!(
                t.columns.windows(2).all(|w| w[0].since <= w[1].since),
                "{}: columns of a later migration must come last",
                t.name
            );
        }
        // a level with no entry in db::MIGRATIONS is never applied: its columns would be missing
        let levels: Vec<u32> = crate::db::MIGRATIONS.iter().map(|(n, _)| *n).collect();
        for t in TABLES {
            assert!(
                levels.contains(&t.since),
                "{}: level {} is not in db::MIGRATIONS",
                t.name,
                t.since
            );
            for c in t.columns {
                assert!(
                    levels.contains(&c.since),
                    "{}.{}: level {} is not in db::MIGRATIONS",
                    t.name,
                    c.name,
                    c.since
                );
            }
        }
    }

    /// Every column is bound by the writer and read by the reader, in list order: a row with
    /// a distinct value in every column goes in through one multi-row statement and comes
    /// back equal, and the statement has exactly as many placeholders as the rows bind.
    #[test]
    fn rows_round_trip_through_the_generated_insert_and_select() {
        let c = fresh_db();
        let conn = |id: i64| ConnectionRow {
            id,
            client_ip: "2001:db8::1".into(),
            client_port: 40_000 + id,
            server_ip: Text::Owned("192.0.2.1".to_string()),
            server_port: 443,
            vlan: Some(7),
            ip_version: 6,
            t_syn: Some(1_700_000_000_000_000),
            t_first: 1_700_000_000_000_001,
            t_end: 1_700_000_001_000_000,
            complete: 1,
            prune_reason: None,
            server_by: "syn".into(),
            min_rtt_us: Some(12_345),
            hs_rtt_us: Some(12_400),
            rtt_samples: 3,
            mss_client: Some(1460),
            mss_server: Some(1400),
            wscale_client: Some(7),
            wscale_server: Some(8),
            sack_ok: Some(1),
            ts_ok: Some(0),
            ecn_ok: None,
            syn_retx: 1,
            synack_retx: 2,
            rwin_bytes: Some(65_535),
            rwin_syn_bytes: Some(64_240),
            zero_window: 4,
            data_pkts_down: 10,
            data_bytes_down: 14_600,
            retx_down: 1,
            spurious_retx_down: 0,
            spurious_by: Some("dsack".into()),
            loss_rate_down: Some(0.1),
            loss_random_down: Some(0.05),
            data_pkts_up: 2,
            data_bytes_up: 300,
            retx_up: 0,
            fin_retx: 5,
            zwnd_probes: 6,
            dup_frames: 7,
            bw_bps: Some(1.5e6),
            bw_samples: 8,
            delack_policy: "delayed".into(),
            acks_per_seg: Some(0.5),
            delack_timeout_us: Some(200_000),
            termination: "fin".into(),
            closed_by: Some("client".into()),
            exchanges: 1,
            response_time_us: Some(50_000),
            holes_down: 9,
            holes_up: 10,
            frames: 20,
            community_id: Some(Text::Owned(format!("1:conn{id}="))),
            bw_source: Some("trains".into()),
            rwin_max_bytes: Some(131_072),
            queue_down_pkts: Some(51),
            queue_down_full: Some(1),
            shaper_lead_down: Some(0.96),
        };
        let rows = [conn(1), conn(2), conn(3)];
        let n = ConnectionRow::TABLE.columns.len();
        let mut st = c
            .prepare(&ConnectionRow::TABLE.insert_sql(rows.len()))
            .unwrap();
        assert_eq!(st.parameter_count(), rows.len() * n);
        for (k, r) in rows.iter().enumerate() {
            r.bind(&mut st, 1 + k * n).unwrap();
        }
        st.raw_execute().unwrap();
        drop(st);
        assert_eq!(ConnectionRow::read_all(&c, "id").unwrap(), rows);

        let ex = ExchangeRow {
            conn_id: 1,
            seq: 0,
            t_req_first: Some(1),
            t_req_last: Some(2),
            req_bytes: 3,
            t_resp_first: Some(4),
            t_resp_last: None,
            resp_bytes: 6,
            response_delay_us: Some(7),
            query_delay_us: Some(8),
            header_bytes: Some(9),
            think_time_us: Some(10),
            method: Some("GET".into()),
            status: Some(200),
            zero_window_us: Some(11),
            zero_window_at_bytes: Some(12),
            zero_window_stalls: Some("1000:2000 3000:4000".into()),
            read_rate_bps: Some(13.5),
            read_rate_by: Some("window".into()),
            rwin_profile: Some("0:64512 14480:40960".into()),
        };
        ex.insert(&c).unwrap();
        assert_eq!(ExchangeRow::read_all(&c, "conn_id, seq").unwrap(), [ex]);

        // text that is not UTF-8 (STRICT takes it as TEXT) is named by table, row and column,
        // and shown, not given as a column index and an offset into the value
        c.execute(
            "UPDATE connections SET server_ip = CAST(x'3139322eff2e322e31' AS TEXT) WHERE id = 2",
            [],
        )
        .unwrap();
        let e = ConnectionRow::read_all(&c, "id").unwrap_err();
        let b = bad_read(&e).unwrap();
        assert_eq!(
            (b.table, b.key.as_str(), b.column),
            ("connections", "id = 2", "server_ip")
        );
        assert_eq!(
            e.to_string(),
            "table connections, row with id = 2: server_ip holds text that is not UTF-8: \
             '192.\\xff.2.1'; the database was changed outside mimic or is damaged"
        );
        // a value of another type (a table that is not STRICT) names the type expected
        let old = Connection::open_in_memory().unwrap();
        crate::db::init_schema_not_strict(&old).unwrap();
        ConnectionRow::default().insert(&old).unwrap();
        ExchangeRow::default().insert(&old).unwrap();
        old.execute("UPDATE exchanges SET req_bytes = 'many'", [])
            .unwrap();
        let e = ExchangeRow::read_all(&old, "conn_id")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(
                "table exchanges, row with conn_id = 0: req_bytes holds 'many' (Text), where the \
                 data contract has INTEGER (never NULL)"
            ),
            "{e}"
        );

        // every value has its column's type. In a database of this build SQLite refuses a
        // hand-changed one itself (STRICT tables), so no reader scans for one
        let path = std::path::Path::new("x.db");
        let bad = [
            (
                "connections SET response_time_us = 'hello' WHERE id = 2",
                "id=2",
                "response_time_us holds text 'hello'",
            ),
            (
                "connections SET response_time_us = 3.5 WHERE id = 3",
                "id=3",
                "response_time_us holds real 3.5",
            ),
            (
                "connections SET bw_bps = 'fast' WHERE id = 1",
                "id=1",
                "bw_bps holds text 'fast'",
            ),
            (
                "connections SET client_ip = x'2a' WHERE id = 1",
                "id=1",
                "client_ip holds blob",
            ),
            (
                "exchanges SET req_bytes = x'00' WHERE seq = 0",
                "conn_id=1, seq=0",
                "req_bytes holds blob",
            ),
        ];
        for (set, _, _) in bad {
            let e = c.execute_batch(&format!("UPDATE {set};")).unwrap_err();
            assert!(e.to_string().contains("cannot store"), "{set}: {e}");
        }
        for t in TABLES {
            let cols: Vec<&Column> = t.columns.iter().collect();
            assert!(
                crate::db::enforced_by_sqlite(&c, t.name, &cols).unwrap(),
                "{} is not STRICT with the contract's types",
                t.name
            );
        }
        crate::db::check_value_types(&c, path).unwrap();

        // a database written before STRICT (a migrated one keeps its tables as they were) is
        // scanned: a hand-changed value is named by table, row and column (SQL arithmetic would
        // read text as 0, and `get` would fail without a row)
        let dir = tempfile::tempdir().unwrap();
        let loose_path = dir.path().join("loose.db");
        crate::db::init_schema_not_strict(&Connection::open(&loose_path).unwrap()).unwrap();
        c.execute("ATTACH ?1 AS loose", [loose_path.to_str().unwrap()])
            .unwrap();
        for t in TABLES {
            c.execute_batch(&format!(
                "DELETE FROM loose.{0}; INSERT INTO loose.{0} SELECT * FROM main.{0};",
                t.name
            ))
            .unwrap();
        }
        c.execute_batch("DETACH loose").unwrap();
        let c = Connection::open(&loose_path).unwrap();
        for t in TABLES {
            let cols: Vec<&Column> = t.columns.iter().collect();
            assert!(!crate::db::enforced_by_sqlite(&c, t.name, &cols).unwrap());
        }
        crate::db::check_value_types(&c, path).unwrap();
        for (set, row, what) in bad {
            c.execute_batch(&format!("SAVEPOINT s; UPDATE {set};"))
                .unwrap();
            let e = crate::db::check_value_types(&c, path)
                .unwrap_err()
                .to_string();
            assert!(e.contains(row) && e.contains(what), "{set}: {e}");
            c.execute_batch("ROLLBACK TO s; RELEASE s;").unwrap();
        }
        // a STRICT table whose contract column was declared without its type or NOT NULL (by
        // hand) is scanned as well
        let probe = Connection::open_in_memory().unwrap();
        probe
            .execute_batch(
                "CREATE TABLE exchanges (conn_id INTEGER NOT NULL, seq ANY, req_bytes INTEGER) STRICT;",
            )
            .unwrap();
        let ex_cols: Vec<&Column> = ExchangeRow::TABLE.columns[..2].iter().collect();
        assert!(!crate::db::enforced_by_sqlite(&probe, "exchanges", &ex_cols).unwrap());
        let req: Vec<&Column> = vec![ExchangeRow::TABLE.column("req_bytes").unwrap()];
        assert!(
            !crate::db::enforced_by_sqlite(&probe, "exchanges", &req).unwrap(),
            "req_bytes is NOT NULL in the contract"
        );
        assert!(!crate::db::enforced_by_sqlite(&probe, "missing", &req).unwrap());
        // a column declared with another default than the contract's: scanned. (SQLite 3.40,
        // Debian 12's `sqlite3`, lets `ALTER TABLE … ADD COLUMN frames INTEGER NOT NULL
        // DEFAULT 'many'` give the rows there the text unchecked; the bundled 3.54 refuses it)
        let frames: Vec<&Column> = vec![ConnectionRow::TABLE.column("frames").unwrap()];
        assert_eq!(frames[0].default, Some("0"));
        for (default, enforced) in [("0", true), ("7", false), ("'many'", false)] {
            let probe = Connection::open_in_memory().unwrap();
            probe
                .execute_batch(&format!(
                    "CREATE TABLE connections (frames INTEGER NOT NULL DEFAULT {default}) STRICT;"
                ))
                .unwrap();
            assert_eq!(
                crate::db::enforced_by_sqlite(&probe, "connections", &frames).unwrap(),
                enforced,
                "DEFAULT {default}"
            );
        }
        let fresh = fresh_db();
        ConnectionRow {
            id: 1,
            ..Default::default()
        }
        .insert(&fresh)
        .unwrap();
        let readd = "ALTER TABLE connections DROP COLUMN frames; \
                     ALTER TABLE connections ADD COLUMN frames INTEGER NOT NULL DEFAULT 'many';";
        if fresh.execute_batch(readd).is_ok() {
            let cols: Vec<&Column> = ConnectionRow::TABLE.columns.iter().collect();
            assert!(!crate::db::enforced_by_sqlite(&fresh, "connections", &cols).unwrap());
            let e = crate::db::check_value_types(&fresh, path)
                .unwrap_err()
                .to_string();
            assert!(e.contains("frames holds text 'many'"), "{e}");
        }
        crate::db::check_value_types(&c, path).unwrap();
        // a REAL column takes integers (SQLite's own affinity stores them as they come)
        c.execute("UPDATE connections SET bw_bps = 1500000 WHERE id = 1", [])
            .unwrap();
        crate::db::check_value_types(&c, path).unwrap();
        // the contract's NOT NULL holds through the generated DDL
        ExchangeRow {
            conn_id: 1,
            seq: 1,
            ..Default::default()
        }
        .insert(&c)
        .unwrap();
        let e = RttSampleRow {
            conn_id: 1,
            ..Default::default()
        }
        .insert(&c);
        assert!(e.is_ok(), "an empty kind is text, not NULL: {e:?}");
        assert!(c
            .execute(
                "INSERT INTO rtt_samples (conn_id, t_us, rtt_us) VALUES (1, 2, 3)",
                []
            )
            .is_err());
    }

    /// A row's cells are its fields in column order, None as NULL; `nullable` is SQLite's
    /// rule (NOT NULL and INTEGER PRIMARY KEY refuse NULL, a TEXT PRIMARY KEY takes it).
    #[test]
    fn cells_follow_the_column_list_and_nulls() {
        let ex = ExchangeRow {
            conn_id: 3,
            seq: 1,
            t_req_first: Some(10),
            method: Some("GET".into()),
            ..Default::default()
        };
        let mut cells = Vec::new();
        ex.for_each_cell(|c| cells.push(format!("{c:?}")));
        assert_eq!(cells.len(), ExchangeRow::TABLE.columns.len());
        assert_eq!(
            &cells[..4],
            ["Integer(3)", "Integer(1)", "Integer(10)", "Null"]
        );
        assert_eq!(cells[12], "Text(\"GET\")");
        assert_eq!(cells[13], "Null");
        let bw = BwSampleRow {
            bps: 2.5,
            ..Default::default()
        };
        let mut cells = Vec::new();
        bw.for_each_cell(|c| cells.push(format!("{c:?}")));
        assert_eq!(cells[2], "Real(2.5)");
        let col = |t: &Table, n: &str| t.column(n).unwrap().nullable();
        assert!(!col(ConnectionRow::TABLE, "id"));
        assert!(!col(ConnectionRow::TABLE, "client_ip"));
        assert!(col(ConnectionRow::TABLE, "min_rtt_us"));
        assert!(col(MetaRow::TABLE, "key"));
        assert!(col(MetaRow::TABLE, "value"));
        assert!(!col(ReplayMapRow::TABLE, "orig_conn_id"));
        assert!(col(ReplayMapRow::TABLE, "replay_conn_id"));
    }

    /// The mechanism a new column goes through: version 2 of a table is version 1 plus one
    /// entry with `.since(2)`. A version-1 database with rows, migrated with the generated
    /// ALTER TABLE, has the same columns as a database created at version 2, keeps its rows
    /// (the new column at its default), and takes the new rows; nothing but the list changed.
    #[test]
    fn adding_a_column_is_one_entry_in_the_list() {
        mod v1 {
            use super::super::*;
            tables! {
                /// A table of a test.
                pub struct ThingRow in "things" since 1 {
                    id: i64 => col(Unit::None).primary_key(),
                    name: Text => col(Unit::None),
                }
            }
        }
        mod v2 {
            use super::super::*;
            tables! {
                /// A table of a test.
                pub struct ThingRow in "things" since 1 {
                    id: i64 => col(Unit::None).primary_key(),
                    name: Text => col(Unit::None),
                    /// The new column.
                    size_bytes: i64 => col(Unit::Bytes).default("0").since(2),
                    note: Option<Text> => col(Unit::None).since(2),
                }
            }
        }
        let migrated = Connection::open_in_memory().unwrap();
        migrated
            .execute_batch(&schema_sql_of(v1::TABLES, 1))
            .unwrap();
        v1::ThingRow {
            id: 1,
            name: "old".into(),
        }
        .insert(&migrated)
        .unwrap();
        let alter = schema_sql_of(v2::TABLES, 2);
        assert_eq!(
            alter,
            "ALTER TABLE things ADD COLUMN size_bytes INTEGER NOT NULL DEFAULT 0;\nALTER TABLE things ADD COLUMN note TEXT;\n"
        );
        migrated.execute_batch(&alter).unwrap();
        let fresh = Connection::open_in_memory().unwrap();
        for level in [1, 2] {
            fresh
                .execute_batch(&schema_sql_of(v2::TABLES, level))
                .unwrap();
        }
        assert_eq!(
            table_info(&migrated, "things"),
            table_info(&fresh, "things")
        );
        assert_eq!(
            table_info(&fresh, "things"),
            expected_info(<v2::ThingRow as TableRow>::TABLE)
        );
        let new = v2::ThingRow {
            id: 2,
            name: "new".into(),
            size_bytes: 1500,
            note: Some("written at version 2".into()),
        };
        new.insert(&migrated).unwrap();
        let got = v2::ThingRow::read_all(&migrated, "id").unwrap();
        assert_eq!(
            got,
            [
                v2::ThingRow {
                    id: 1,
                    name: "old".into(),
                    size_bytes: 0,
                    note: None,
                },
                new
            ]
        );
        // a version-1 reader still reads the table (by name, the older columns)
        let old_reader = v1::ThingRow::read_all(&migrated, "id").unwrap();
        assert_eq!(old_reader.len(), 2);
    }

    /// `schemas/COLUMNS.md`, the column reference for people who do not read Rust, is this
    /// module's [`markdown`]: regenerate it with `MIMIC_BLESS=1 cargo test -p mimic-core
    /// column_reference` after changing a list.
    #[test]
    fn the_column_reference_is_up_to_date() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../schemas/COLUMNS.md");
        let want = format!(
            "# The data contract: tables and columns\n\n\
             Generated from the column lists in `core/src/schema.rs` (do not edit here: change \
             the list, then run\n`MIMIC_BLESS=1 cargo test -p mimic-core column_reference`). \
             Times are µs since the Unix epoch, durations µs,\nrates IP-layer bits per second, \
             byte counts TCP payload bytes unless a column says otherwise; NULL means\n\
             \"not known / not measurable\". Indexes and the operator views are in \
             `schemas/NNNN_*.sql`.\n\n{}",
            markdown()
        );
        if std::env::var_os("MIMIC_BLESS").is_some() {
            crate::db::write_atomic(&path, want.as_bytes()).unwrap();
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "{} is not what the column lists say: regenerate it with MIMIC_BLESS=1 cargo test -p mimic-core column_reference",
            path.display()
        );
    }

    #[test]
    fn markdown_lists_every_column_with_its_unit() {
        let md = markdown();
        for t in TABLES {
            assert!(md.contains(&format!("### `{}`", t.name)));
            for c in t.columns {
                assert!(md.contains(&format!("| `{}` |", c.name)), "{}", c.name);
            }
        }
        assert!(md.contains("| `t_syn` | INTEGER | µs since epoch | Client SYN (first one seen); NULL without a SYN. |"), "{md}");
    }
}
