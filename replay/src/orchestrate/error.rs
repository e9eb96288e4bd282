//! What can end a replay early.

use std::time::Duration;

use mimic_capture::CaptureRunError;
use mimic_core::db::DbError;
use mimic_netemu::control::ControlError;
use mimic_netemu::lab::LabError;

use crate::workload::WorkloadError;

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    #[error(transparent)]
    Lab(#[from] LabError),
    #[error(transparent)]
    Control(#[from] ControlError),
    #[error(transparent)]
    Capture(#[from] CaptureRunError),
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("analysis of the replay capture: {0}")]
    Analysis(String),
    #[error("{role} did not start: {why}")]
    Role { role: &'static str, why: String },
    /// A role that did not answer within `limit`; `last`: why the last try failed, if it said.
    #[error("{role} did not start: {}", not_ready(*.limit, .last))]
    NotReady {
        role: &'static str,
        limit: Duration,
        last: String,
    },
    /// A role on another host (one this replay did not start) that never answered.
    #[error("{role} at {addr}: {why}")]
    Unreachable {
        role: &'static str,
        addr: String,
        why: String,
    },
    #[error("{0}")]
    Io(String),
    #[error("{0}")]
    Invalid(String),
    #[error("interrupted")]
    Interrupted,
}

/// `"not ready within LIMIT (last try: WHY)"`.
fn not_ready(limit: Duration, last: &str) -> String {
    format!("not ready within {limit:?}{}", last_try(last))
}

/// `" (last try: WHY)"`, or nothing when the last try gave no reason.
pub(crate) fn last_try(last: &str) -> String {
    if last.is_empty() {
        String::new()
    } else {
        format!(" (last try: {last})")
    }
}

impl ReplayError {
    /// A role's failure to start as `(role, why)`, whether it exited or never answered.
    pub(crate) fn role_failure(&self) -> Option<(&'static str, String)> {
        match self {
            ReplayError::Role { role, why } => Some((role, why.clone())),
            ReplayError::NotReady { role, limit, last } => Some((role, not_ready(*limit, last))),
            _ => None,
        }
    }
}
