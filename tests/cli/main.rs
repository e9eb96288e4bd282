//! Command-line integration tests: one binary, modules by part. These need no root.

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/prom.rs"]
mod prom;

mod agent;
mod analyze;
mod analyze_input;
mod capture;
mod compare;
mod export;
mod metrics;
mod netemu;
mod parquet;
mod pki;
mod replay;
mod shard;
