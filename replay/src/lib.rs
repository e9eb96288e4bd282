//! mimic-replay: Monkey Do.
//!
//! * [`workload`] — the connections of a mimic database, as the replay needs them.
//! * [`synth`] — synthetic workloads with known truth.
//! * [`server`] — the server emulator (`mimic serve`) and [`control`], its control channel.
//! * [`serve_capture`] — the replay's capture at the server host, run by `mimic serve` and
//!   brought to the controller over the control channel (files checked by size and SHA-256).
//! * [`client`] — the client emulator, one task per connection.
//! * [`agent`] — a client agent (`mimic agent`): the client emulator on another host, driven
//!   over the control channel (`mimic replay --agents`).
//! * [`spec`] — the launch contracts of `mimic serve` ([`spec::ServeSpec`]) and `mimic replay`
//!   ([`spec::ReplayOptions`]): typed settings and the one place that writes their command lines.
//! * [`orchestrate`] — a whole replay, by stage: plan, roles (started from their crates'
//!   specs), the client emulator, the replay database.
//! * [`accuracy`] — inferred parameters of a replay against a synthetic workload's truth.
//! * [`hrtimer`] — sub-millisecond sleeps for async tasks.

pub mod accuracy;
pub mod agent;
pub mod client;
pub mod control;
pub mod hrtimer;
pub mod orchestrate;
pub mod preamble;
pub mod serve_capture;
pub mod server;
pub mod spec;
pub mod synth;
mod sys;
pub mod workload;
