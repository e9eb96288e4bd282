//! Command-line integration tests: one binary, modules by part. These need no root.

#[path = "../common/mod.rs"]
mod common;

mod analyze;
mod analyze_input;
mod capture;
mod compare;
mod replay;
