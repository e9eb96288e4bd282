//! Per-flow network emulation for mimic: the pipe engine, the userspace datapath, `tc`/`ipfw`
//! backends and the three-host lab.
//!
//! The core is pure and takes time as an argument ([`pipe`], [`wheel`], [`classify`], [`ack`],
//! [`engine`]); everything that touches sockets, namespaces or the clock is a thin driver
//! around it ([`datapath`], [`control`], [`lab`], [`stack`], [`netns`]). [`spec`] is the
//! emulator role's launch contract: `mimic netemu run`'s settings and command line.

pub mod ack;
pub mod classify;
pub mod config;
pub mod control;
pub mod datapath;
pub mod engine;
pub mod guest;
pub mod kernel_router;
pub mod lab;
pub mod netns;
pub mod pipe;
pub mod render;
pub mod rng;
pub mod spec;
pub mod stack;
pub mod table;
pub mod units;
pub mod wheel;

pub use config::{AckPolicy, LossModel, PipeConfig, QueueLimit};
pub use engine::{
    Direction, Engine, FlowRule, PipeCounters, PipeOwner, PipeTable, PrefixRule, RuleId, Side,
};
pub use pipe::Counters;
