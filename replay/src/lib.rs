//! mimic-replay: Monkey Do.
//!
//! * [`workload`] — the connections of a mimic database, as the replay needs them.
//! * [`synth`] — synthetic workloads with known truth.
//! * [`server`] — the server emulator (`mimic serve`) and [`control`], its control channel.
//! * [`client`] — the client emulator, one task per connection.
//! * [`orchestrate`] — a whole replay: lab roles, per-connection pipes, capture, analysis.
//! * [`accuracy`] — inferred parameters of a replay against a synthetic workload's truth.
//! * [`hrtimer`] — sub-millisecond sleeps for async tasks.

pub mod accuracy;
pub mod client;
pub mod control;
pub mod hrtimer;
pub mod orchestrate;
pub mod preamble;
pub mod server;
pub mod synth;
mod sys;
pub mod workload;
