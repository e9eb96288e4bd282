//! Statistics and reports: response-time CDFs, relative error, verdicts.

pub mod stats;
