//! Lab tests: real network namespaces, real TCP stacks, timing. They need root (CI runs as
//! root) and run in one process, one at a time (`--test-threads=1`), each with lab names
//! unique to the run and torn down by a guard.

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/prom.rs"]
mod prom;

mod agents;
mod capture;
mod demo;
mod guest;
mod guest_replay;
mod guest_router;
mod guest_server;
mod independent;
mod metrics;
mod netemu;
mod replay;
mod shard_ssh;
mod util;
