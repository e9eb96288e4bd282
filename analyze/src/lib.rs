//! mimic-analyze: Monkey See, done properly.
//!
//! A sans-I/O TCP analyzer ([`Analyzer`]): it is fed timestamped frames (or decoded segments)
//! and emits one [`ConnectionRecord`] per connection — RTT, loss, bottleneck bandwidth,
//! delayed-ACK policy, receive window, request/response exchanges with server delays. It never
//! reads a clock or a file; [`driver`] is the thin layer that reads trace files and writes the
//! SQLite database.

pub mod alloc;
pub mod analyzer;
mod bandwidth;
pub mod columnar;
pub mod config;
mod conn;
pub mod driver;
pub mod filter;
#[doc(hidden)]
pub mod fuzzing;
mod halfopen;
mod http;
pub mod merge;
mod ranges;
pub mod record;
pub mod store;

pub use analyzer::{Analyzer, AnalyzerStats};
pub use config::{BwMethod, Cidr, Config};
pub use record::*;

#[cfg(test)]
mod tests;
