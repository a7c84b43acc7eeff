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
    Ok(ProcMemory {
        rss_anon: status_bytes(&text, "RssAnon:"),
        rss_file: status_bytes(&text, "RssFile:"),
        rss_shmem: status_bytes(&text, "RssShmem:"),
    })
}

/// The peak resident memory of a process (`VmHWM` in /proc/PID/status),
/// in bytes.
pub fn peak_rss(pid: u32) -> Result<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    Ok(status_bytes(&text, "VmHWM:"))
}

/// A `NAME: N kB` field of /proc/PID/status in bytes (0 when absent).
fn status_bytes(text: &str, name: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}
