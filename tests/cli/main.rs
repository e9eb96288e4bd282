//! Command-line integration tests: one binary, modules by part. These need no root.

#[path = "../common/mod.rs"]
mod common;

mod analyze;
mod capture;
mod compare;
mod netemu;
mod replay;
