//! One module per subcommand: its flags (defined once, with help) and a `run` that validates
//! them before touching the system and returns the process exit code.

pub mod analyze;
pub mod capture;
pub mod compare;
pub mod demo;
pub mod lab;
pub mod netemu;
pub mod replay;
pub mod serve;
pub mod synth;
