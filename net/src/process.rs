//! The standard process metrics and the build's info (issue 48), for the
//! node's and the voter's registries: `process_resident_memory_bytes`,
//! `process_cpu_seconds_total`, `process_open_fds`, `process_max_fds`,
//! `process_start_time_seconds` (the names Prometheus' own clients use,
//! so dashboards and alerts written for them work) and
//! `granary_build_info{role, version}`. Read from /proc at each scrape;
//! a value /proc does not give is left out, never reported as 0.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};

/// Registers the process metrics and `granary_build_info` of a process
/// of `role` (`node`, `coordinator`) on `registry` (one without a prefix:
/// these names are standard).
pub fn register(registry: &mut Registry, role: &'static str) {
    registry.register_collector(Box::new(ProcessCollector { role }));
}

/// /proc's clock ticks per second (`USER_HZ`, 100 on Linux whatever the
/// kernel's own rate).
const USER_HZ: f64 = 100.0;

/// Fields of /proc/self/stat: user and system CPU time and the start
/// time, in clock ticks (the start since boot). The command name (field
/// 2) may hold spaces and parentheses: fields are counted after its last
/// `)`.
pub fn parse_stat(stat: &str) -> Option<(u64, u64, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, so field N is f[N - 3].
    let num = |n: usize| f.get(n - 3)?.parse::<u64>().ok();
    Some((num(14)?, num(15)?, num(22)?))
}

/// The soft limit of open files from /proc/self/limits; None when
/// unlimited or not given.
pub fn parse_max_fds(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..].split_whitespace().next()?.parse().ok()
}

/// The boot time from /proc/stat (`btime`), in seconds since the epoch.
pub fn parse_btime(stat: &str) -> Option<u64> {
    stat.lines().find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())
}

/// `VmRSS` from /proc/self/status, in bytes.
pub fn parse_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

struct ProcessCollector {
    role: &'static str,
}

impl std::fmt::Debug for ProcessCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProcessCollector")
    }
}

#[derive(EncodeLabelSet, Debug, Clone, Hash, PartialEq, Eq)]
struct Build {
    role: String,
    version: String,
}

impl Collector for ProcessCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let read = |p: &str| std::fs::read_to_string(p).ok();
        let g = ConstGauge::new(1i64);
        let mut family = enc.encode_descriptor(
            "granary_build_info",
            "The running build: its role and version (always 1)",
            None,
            g.metric_type(),
        )?;
        let build = Build { role: self.role.to_string(), version: env!("CARGO_PKG_VERSION").to_string() };
        g.encode(family.encode_family(&build)?)?;
        let e = &mut enc;
        if let Some(rss) = read("/proc/self/status").as_deref().and_then(parse_rss) {
            let rss = i64::try_from(rss).unwrap_or(i64::MAX);
            crate::metrics::const_gauge(e, "process_resident_memory", "Resident memory", Some(&Unit::Bytes), rss)?;
        }
        let stat = read("/proc/self/stat").as_deref().and_then(parse_stat);
        if let Some((user, system, _)) = stat {
            let c = prometheus_client::metrics::counter::ConstCounter::new((user + system) as f64 / USER_HZ);
            c.encode(e.encode_descriptor(
                "process_cpu",
                "User and system CPU time spent",
                Some(&Unit::Seconds),
                c.metric_type(),
            )?)?;
        }
        if let (Some((_, _, start)), Some(boot)) = (stat, read("/proc/stat").as_deref().and_then(parse_btime)) {
            let at = prometheus_client::metrics::gauge::ConstGauge::new(boot as f64 + start as f64 / USER_HZ);
            at.encode(e.encode_descriptor(
                "process_start_time",
                "Start time of the process since the Unix epoch",
                Some(&Unit::Seconds),
                at.metric_type(),
            )?)?;
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            let open = i64::try_from(fds.count()).unwrap_or(i64::MAX);
            crate::metrics::const_gauge(e, "process_open_fds", "Open file descriptors", None, open)?;
        }
        if let Some(max) = read("/proc/self/limits").as_deref().and_then(parse_max_fds) {
            let max = i64::try_from(max).unwrap_or(i64::MAX);
            crate::metrics::const_gauge(e, "process_max_fds", "The most file descriptors it may open", None, max)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_files_are_read_as_linux_writes_them() {
        // A command name with a space and a parenthesis.
        let stat = "4242 (gran ary)) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 75 0 0 20 0 9 0 123456 \
                    1000000 2000 18446744073709551615";
        assert_eq!(parse_stat(stat), Some((250, 75, 123456)));
        assert_eq!(parse_stat("garbage"), None);
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max cpu time              unlimited            unlimited            seconds   \n\
                      Max open files            1024                 1048576              files     \n";
        assert_eq!(parse_max_fds(limits), Some(1024));
        assert_eq!(parse_max_fds("Max open files unlimited unlimited files"), None);
        assert_eq!(parse_btime("cpu  1 2 3\nbtime 1765000000\nprocesses 9\n"), Some(1_765_000_000));
        assert_eq!(parse_rss("Name:\tgranary\nVmRSS:\t  2048 kB\n"), Some(2 << 20));
    }

    #[test]
    fn the_process_metrics_render_with_their_standard_names() {
        let mut r = Registry::default();
        register(&mut r, "node");
        let text = crate::metrics::render(&r).expect("render");
        assert!(text.contains("granary_build_info{role=\"node\",version=\""), "{text}");
        for name in ["process_resident_memory_bytes ", "process_cpu_seconds_total ", "process_open_fds "] {
            assert!(text.contains(name), "{name}: {text}");
        }
        assert!(text.contains("process_start_time_seconds "), "{text}");
    }
}
