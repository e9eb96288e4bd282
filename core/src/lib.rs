//! Shared types for mimic.
//!
//! * [`time`] — one timestamp type (nanoseconds since the Unix epoch), converted at the edges.
//! * [`seq`] — TCP sequence numbers that compare and subtract modulo 2^32.
//! * [`community_id`] — the Community ID v1 flow hash, and the shards of `analyze --shard K/N`
//!   drawn from it.
//! * [`flow`] — flow keys (VLAN stack + 4-tuple) with a canonical, direction-free form.
//! * [`packet`] — decoding a captured frame of any supported link type down to a TCP segment,
//!   with malformed input reported as a small `Copy` reason that callers count.
//! * [`trace`] — reading pcap / pcapng (optionally gzip-compressed) files as timestamped frames.
//! * [`cpu`] — CPU affinity (the lab keeps its real-time datapath and its timer threads apart).
//! * [`testcap`] — pcap / pcapng files written from scripted TCP conversations (the tests' own captures).
//! * [`schema`] — the data contract: one column list per table (name, SQL type, unit, doc), from
//!   which the DDL, the writers' binds and the readers come.
//! * [`stats`] — order statistics the estimators share (the median).
//! * [`db`] — the versioned SQLite schema shared by analyze, replay and compare, and atomic output.

pub mod community_id;
pub mod cpu;
pub mod db;
pub mod flow;
pub mod interrupt;
pub mod model;
pub mod packet;
pub mod process;
pub mod schema;
pub mod seq;
pub mod stats;
pub mod testcap;
pub mod time;
pub mod trace;

pub use flow::{FlowKey, VlanStack};
pub use packet::{DecodeError, LinkType, TcpFlags, TcpOptions, TcpSegment};
pub use seq::SeqNum;
pub use time::Timestamp;
