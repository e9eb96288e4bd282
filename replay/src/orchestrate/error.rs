//! What can end a replay early.

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
