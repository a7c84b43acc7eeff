//! What the demos show while they run: lines above the progress bars (or
//! plain lines when the bars are hidden), and the bars' one style.

use indicatif::{MultiProgress, ProgressStyle};

/// Prints a line above the progress bars, or plainly when they are hidden
/// (output is not a terminal).
pub(super) fn say_to(bars: &MultiProgress, line: String) {
    if bars.is_hidden() {
        println!("{line}");
    } else {
        let _ = bars.println(line);
    }
}

/// The style of every bar: a right-aligned label, the bar, done/total.
pub(super) fn style(prefix: &str) -> ProgressStyle {
    ProgressStyle::with_template(&format!("{prefix:>18} [{{bar:40}}] {{pos}}/{{len}} {{msg}}"))
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}
