//! What every child process shares: its environment (errors returned from
//! `main` print without a backtrace) and the tail of its log, kept short
//! but never without the error it exited with.

use std::path::Path;
use std::process::Command;

/// The last 20 lines of a child's log file (empty if unreadable), without
/// backtrace frames, and with the error a child exited with (`Error: …`
/// and its causes, as `main` prints it) always included: with
/// `RUST_BACKTRACE` set, the frames alone would fill the tail.
pub(super) fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    tail_of(&text)
}

fn tail_of(text: &str) -> String {
    let is_frame = |l: &str| {
        let t = l.trim_start();
        t.starts_with("at ")
            || t.split_once(": ").is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    let lines: Vec<&str> = text.lines().filter(|l| !is_frame(l)).collect();
    let mut start = lines.len().saturating_sub(20);
    if let Some(err) = lines.iter().rposition(|l| l.starts_with("Error: ")) {
        start = start.min(err);
    }
    lines[start..].join("\n")
}

/// A command running `exe`, inside network namespace `netns` when given
/// (`ip netns exec NS EXE`, which execs it).
pub(super) fn command_in(netns: Option<&str>, exe: &Path) -> Command {
    match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(exe);
            c
        }
        None => Command::new(exe),
    }
}

/// A child's environment: errors a child returns from `main` print without
/// a backtrace even where `RUST_BACKTRACE` is set (panics keep theirs).
pub(super) fn quiet_errors(cmd: &mut Command) -> &mut Command {
    cmd.env("RUST_LIB_BACKTRACE", "0")
}

#[cfg(test)]
mod tests {
    use super::tail_of;

    #[test]
    fn a_log_tail_keeps_the_error_and_drops_backtrace_frames() {
        let mut log =
            String::from("INFO starting\nError: ssd folder /x: no space\n\nCaused by:\n    full\n\nStack backtrace:\n");
        for i in 0..40 {
            log += &format!("  {i}: some::frame\n             at ./src/x.rs:{i}:5\n");
        }
        let tail = tail_of(&log);
        assert!(tail.contains("Error: ssd folder /x: no space"), "{tail}");
        assert!(tail.contains("full") && !tail.contains("some::frame") && !tail.contains("at ./src"), "{tail}");
        // The error stays in the tail however much was logged after it.
        let later: String = (0..30).map(|i| format!("INFO shutting down {i}\n")).collect();
        let tail = tail_of(&format!("Error: refused\n{later}"));
        assert!(tail.starts_with("Error: refused") && tail.ends_with("down 29"), "{tail}");
        let plain: String = (0..30).map(|i| format!("line {i}\n")).collect();
        assert_eq!(tail_of(&plain).lines().count(), 20);
        assert!(tail_of(&plain).starts_with("line 10"));
    }
}
