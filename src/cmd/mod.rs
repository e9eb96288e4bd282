//! One module per subcommand: its flags (defined once, with help) and a `run` that validates
//! them before touching the system and returns the process exit code.

pub mod analyze;
pub mod capture;
pub mod compare;
pub mod demo;
pub mod export;
pub mod lab;
pub mod merge;
pub mod netemu;
pub mod replay;
pub mod serve;
pub mod synth;

/// Value parser for rates, time scales and intervals: a positive, finite number (`inf` and
/// `NaN` parse as f64 too, and would start everything at once or schedule it never).
pub(crate) fn positive_number(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err("must be a positive, finite number".into()),
    }
}
