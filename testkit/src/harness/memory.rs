//! [`ProcMemory`]: a process's memory as Linux reports it in
//! `/proc/PID/status`, for benchmarks that compare footprints.

use anyhow::Result;
use serde::Serialize;

/// Memory of a process, from /proc/PID/status, in bytes.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct ProcMemory {
    /// Anonymous resident memory.
    pub rss_anon: u64,
    /// File-backed resident memory.
    pub rss_file: u64,
    /// Resident shared memory (memory files the process touched).
    pub rss_shmem: u64,
}

/// Reads /proc/PID/status.
pub fn proc_memory(pid: u32) -> Result<ProcMemory> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> u64 {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    Ok(ProcMemory { rss_anon: field("RssAnon:"), rss_file: field("RssFile:"), rss_shmem: field("RssShmem:") })
}
