-- mimic database schema, migration 1: the first schema.
--
-- Its tables and columns are not written here: they are the column lists in core/src/schema.rs
-- (one list per table: name, SQL type, unit, doc), from which mimic generates the CREATE TABLE
-- statements of this level, the ALTER TABLE statements of later levels that add columns, the
-- writers' INSERT statements and binds, and the readers. This file keeps what is not a column:
-- the indexes of this level. (The DDL of this level as first written by hand is kept in
-- core/testdata/schema1.sql; a test checks that the generated tables are the same, column by
-- column, so databases written before and after read alike.)
--
-- Times are microseconds since the Unix epoch (INTEGER); durations are microseconds; rates are
-- bits per second; byte counts are TCP payload bytes unless a column says otherwise. NULL means
-- "not known / not measurable". Column names are the contract that analyze, replay and compare
-- rely on (see DESIGN.md).
-- Each CREATE INDEX stays on one line: bulk writers create indexes after loading the rows.

CREATE INDEX connections_by_client ON connections(client_ip, client_port);
