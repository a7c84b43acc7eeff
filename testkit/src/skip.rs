//! A test that cannot run here says so: [`skipped`] prints "skipped: WHY"
//! (cargo shows it with `--nocapture`, or when the test fails) and, when
//! `GRANARY_SKIP_LOG` names a file, appends the test's name and why to it,
//! so CI can say how many tests skipped and why instead of counting them
//! as passed.

use std::io::Write;

/// Records that the running test (or a part of it) was skipped, and why.
pub fn skipped(why: impl std::fmt::Display) {
    eprintln!("skipped: {why}");
    if let Some(path) = std::env::var_os("GRANARY_SKIP_LOG") {
        record(std::path::Path::new(&path), std::thread::current().name().unwrap_or("?"), &why.to_string());
    }
}

fn record(path: &std::path::Path, test: &str, why: &str) {
    // One short line per append: lines of parallel tests do not interleave.
    let line = format!("{test}: {}\n", why.replace('\n', " "));
    let written =
        std::fs::OpenOptions::new().create(true).append(true).open(path).and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        eprintln!("cannot record the skip in {}: {e}", path.display());
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_skip_is_recorded_with_the_test_name() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("skips");
        let me = std::thread::current().name().unwrap_or("?").to_string();
        super::record(&log, &me, "no widget,\nno gadget");
        super::record(&log, "other", "none");
        let text = std::fs::read_to_string(&log).unwrap();
        assert_eq!(text, format!("{me}: no widget, no gadget\nother: none\n"));
    }
}
