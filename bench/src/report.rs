//! Conditions of a run and output helpers.

use serde::Serialize;

/// What a measurement depended on.
#[derive(Clone, Debug, Serialize)]
pub struct Conditions {
    /// Git commit of the working tree, if known.
    pub commit: String,
    /// Cores available.
    pub cores: usize,
    /// Build profile.
    pub profile: &'static str,
}

impl Conditions {
    /// Reads the current conditions.
    pub fn current() -> Self {
        let commit = std::process::Command::new("git")
            .args(["rev-parse", "--short=12", "HEAD"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let profile = if cfg!(debug_assertions) { "debug" } else { "release" };
        Self { commit, cores, profile }
    }
}

/// Bytes per second as GB/s (10^9).
pub fn gbps(bytes: u64, secs: f64) -> f64 {
    if secs > 0.0 { bytes as f64 / secs / 1e9 } else { 0.0 }
}

/// A ratio, or 0 when the denominator is 0.
pub fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}
