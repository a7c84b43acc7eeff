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

/// The median of `v` (the mean of the middle two for an even count), or 0
/// for none: epochs and rounds are short and the machine is shared, so one
/// descheduled measurement must not decide a figure.
pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// A ratio, or 0 when the denominator is 0.
pub fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

/// The whole machine's CPU time by kind, from `/proc/stat` (Linux).
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuSample {
    user: u64,
    system: u64,
    idle: u64,
    steal: u64,
    total: u64,
}

/// Shares of the machine's CPU time over an interval: on this shared VM
/// they tell a run slowed by the kernel (page zeroing, network stack) or
/// by the host (steal) from a run slowed by our code.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct CpuShares {
    /// User time (with nice).
    pub user: f64,
    /// Kernel time (with interrupts).
    pub system: f64,
    /// Idle (with I/O wait).
    pub idle: f64,
    /// Time the hypervisor gave to others.
    pub steal: f64,
}

impl CpuSample {
    /// The counters now; `None` where `/proc/stat` is unreadable.
    pub fn now() -> Option<Self> {
        let text = std::fs::read_to_string("/proc/stat").ok()?;
        Self::parse(text.lines().next()?)
    }

    /// Parses the aggregate `cpu` line of `/proc/stat`.
    fn parse(line: &str) -> Option<Self> {
        let mut fields = line.split_whitespace();
        if fields.next()? != "cpu" {
            return None;
        }
        let v: Vec<u64> = fields.map(|f| f.parse().ok()).collect::<Option<_>>()?;
        let at = |i: usize| v.get(i).copied().unwrap_or(0);
        // user nice system idle iowait irq softirq steal (guest times are
        // already inside user and nice).
        Some(Self {
            user: at(0) + at(1),
            system: at(2) + at(5) + at(6),
            idle: at(3) + at(4),
            steal: at(7),
            total: (0..8).map(at).sum(),
        })
    }

    /// Shares of the time between `earlier` and `self`.
    pub fn since(&self, earlier: &Self) -> CpuShares {
        let total = self.total.saturating_sub(earlier.total);
        let share = |now: u64, then: u64| ratio(now.saturating_sub(then) as f64, total as f64);
        CpuShares {
            user: share(self.user, earlier.user),
            system: share(self.system, earlier.system),
            idle: share(self.idle, earlier.idle),
            steal: share(self.steal, earlier.steal),
        }
    }
}

#[cfg(test)]
mod cpu_tests {
    use super::*;

    #[test]
    fn shares_of_an_interval_add_up_and_name_each_kind() {
        let a = CpuSample::parse("cpu  100 0 50 800 50 0 0 0 0 0").expect("parse");
        let b = CpuSample::parse("cpu  160 10 80 860 50 5 5 30 0 0").expect("parse");
        let s = b.since(&a);
        assert_eq!((s.user, s.system, s.idle, s.steal), (0.35, 0.2, 0.3, 0.15));
        assert!(CpuSample::parse("cpu0 1 2 3").is_none());
        assert!(CpuSample::parse("cpu  1 x 3").is_none());
    }
}
