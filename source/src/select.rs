//! A source that names many folders or files at once (issue 43): globs
//! and brace ranges in the source URL.
//!
//! ```text
//! s3://b/ads/date=2026-11-{01..30}/          thirty days' folders
//! s3://b/{ads,clicks}/date=2026-11-0[1-7]/   two prefixes, a week each
//! /data/ads/**/part-*.parquet                files at any depth
//! ```
//!
//! The source is cut at the last `/` before its first pattern character
//! (`*`, `?`, `[`, `{`): before it, the **base**, a store and prefix opened
//! as any source is; after it, the **selection**, matched against each
//! object's path below the base. Braces are expanded first: `{a,b}` is
//! either, `{01..30}` every number from 1 to 30, as wide as its bounds
//! are written (`01`); the rest is a glob (`*` and `?` within one folder,
//! `**` across folders, `[...]` a class). A selection that names a folder
//! (ends with `/`, or matches a folder) takes every file below it. Each
//! expansion is listed from its own literal prefix, so thirty days are
//! thirty listings of one folder, not one of the whole dataset.
//!
//! Pure: no store, no I/O. The listing is `crate::remote::Remote`'s; the
//! globs are rust-lang's `glob` patterns.

use glob::{MatchOptions, Pattern};

/// Most concrete selections one source may expand to.
pub const MAX_EXPANSIONS: usize = 10_000;

const META: [char; 4] = ['*', '?', '[', '{'];

/// The selection part of a source: what it matches below its base.
#[derive(Clone, Debug)]
pub struct Selection {
    /// As written after the base.
    text: String,
    set: Vec<Pattern>,
    /// Literal prefixes below the base to list, none inside another.
    prefixes: Vec<String>,
}

impl Selection {
    /// Whether the object at `below` (its path below the base, no leading
    /// `/`) is selected.
    pub fn matches(&self, below: &str) -> bool {
        let options =
            MatchOptions { case_sensitive: true, require_literal_separator: true, require_literal_leading_dot: false };
        self.set.iter().any(|p| p.matches_with(below, options))
    }

    /// The prefixes below the base to list (each empty or ending in `/`):
    /// every selected object lies under one of them.
    pub fn prefixes(&self) -> &[String] {
        &self.prefixes
    }

    /// The selection as written.
    pub fn text(&self) -> &str {
        &self.text
    }
}

/// `source` cut into its base and its selection (`None`: no pattern, the
/// whole source is the base). The error says what is wrong with the
/// pattern.
pub fn split(source: &str) -> Result<(&str, Option<Selection>), String> {
    let Some(first) = source.find(META) else {
        return Ok((source, None));
    };
    let Some(cut) = source[..first].rfind('/') else {
        return Err(format!("{source:?}: a pattern needs a folder before it (s3://bucket/prefix/*, /data/*)"));
    };
    let (base, text) = source.split_at(cut + 1);
    if base.ends_with("://") || (base.contains("://") && base.matches('/').count() < 3) {
        return Err(format!("{source:?}: the bucket or host cannot be a pattern, only the path below it"));
    }
    let expansions = expand(text).map_err(|e| format!("{source:?}: {e}"))?;
    let mut set = Vec::with_capacity(expansions.len() * 2);
    let mut prefixes = Vec::with_capacity(expansions.len());
    for e in &expansions {
        let folder = e.trim_end_matches('/');
        let globs: Vec<String> =
            if e.ends_with('/') { vec![format!("{folder}/**")] } else { vec![e.clone(), format!("{folder}/**")] };
        for g in globs {
            set.push(Pattern::new(&g).map_err(|err| format!("{source:?}: {err}"))?);
        }
        prefixes.push(literal_prefix(e));
    }
    prefixes.sort();
    prefixes.dedup();
    let mut kept: Vec<String> = Vec::with_capacity(prefixes.len());
    for p in prefixes {
        // Sorted, so a prefix that holds `p` comes before it.
        if !kept.iter().any(|k| p.starts_with(k.as_str())) {
            kept.push(p);
        }
    }
    Ok((base, Some(Selection { text: text.to_string(), set, prefixes: kept })))
}

/// The folders of `expansion` before its first pattern character (empty,
/// or ending in `/`).
fn literal_prefix(expansion: &str) -> String {
    let literal = match expansion.find(META) {
        Some(i) => &expansion[..i],
        None => expansion,
    };
    match literal.rfind('/') {
        Some(i) => literal[..=i].to_string(),
        None => String::new(),
    }
}

/// Every brace of `text` expanded: `{a,b}` to `a` and `b`, `{1..3}` to
/// `1`, `2`, `3` (`{01..03}`: `01`, `02`, `03`), in order, braces one
/// after another multiplied out. Braces do not nest.
fn expand(text: &str) -> Result<Vec<String>, String> {
    let mut out = vec![String::new()];
    let mut rest = text;
    while let Some(open) = rest.find('{') {
        let close = rest[open..].find('}').map(|i| open + i).ok_or("a `{` without its `}`")?;
        let inner = &rest[open + 1..close];
        if inner.contains('{') {
            return Err("braces do not nest".into());
        }
        let mut choices = Vec::new();
        for item in inner.split(',') {
            match range(item)? {
                Some(numbers) => choices.extend(numbers),
                None => choices.push(item.to_string()),
            }
            if choices.len() > MAX_EXPANSIONS {
                return Err(format!("more than {MAX_EXPANSIONS} choices in one brace"));
            }
        }
        let literal = &rest[..open];
        if out.len().saturating_mul(choices.len()) > MAX_EXPANSIONS {
            return Err(format!("the braces expand to more than {MAX_EXPANSIONS} selections"));
        }
        out = out.iter().flat_map(|o| choices.iter().map(move |c| format!("{o}{literal}{c}"))).collect();
        rest = &rest[close + 1..];
    }
    if rest.contains('}') {
        return Err("a `}` without its `{`".into());
    }
    Ok(out.into_iter().map(|o| o + rest).collect())
}

/// `a..b` as its numbers (ascending or descending), zero-padded to the
/// width of a bound written with a leading zero; `None` when `item` is
/// not a range.
fn range(item: &str) -> Result<Option<Vec<String>>, String> {
    let Some((a, b)) = item.split_once("..") else { return Ok(None) };
    let number = |s: &str| !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit());
    if !number(a) || !number(b) {
        return Ok(None);
    }
    let (lo, hi): (u64, u64) = match (a.parse(), b.parse()) {
        (Ok(lo), Ok(hi)) => (lo, hi),
        _ => return Err(format!("{item}: a bound too large")),
    };
    if lo.abs_diff(hi) >= MAX_EXPANSIONS as u64 {
        return Err(format!("{item}: more than {MAX_EXPANSIONS} numbers"));
    }
    let padded = |s: &str| s.len() > 1 && s.starts_with('0');
    let width = if padded(a) || padded(b) { a.len().max(b.len()) } else { 0 };
    let numbers: Vec<u64> = if lo <= hi { (lo..=hi).collect() } else { (hi..=lo).rev().collect() };
    Ok(Some(numbers.into_iter().map(|n| format!("{n:0width$}")).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(source: &str) -> Selection {
        split(source).expect("valid").1.expect("a pattern")
    }

    #[test]
    fn a_source_without_a_pattern_is_all_base() {
        assert!(matches!(split("s3://b/ads/"), Ok(("s3://b/ads/", None))));
        assert!(matches!(split("/data/ads"), Ok(("/data/ads", None))));
    }

    #[test]
    fn a_brace_range_selects_its_days_and_lists_each_folder() {
        let (base, s) = split("s3://b/ads/date=2026-11-{01..30}/").unwrap();
        let s = s.unwrap();
        assert_eq!(base, "s3://b/ads/");
        assert_eq!(s.prefixes().len(), 30);
        assert_eq!(s.prefixes()[0], "date=2026-11-01/");
        assert!(s.matches("date=2026-11-01/part-0.parquet"));
        assert!(s.matches("date=2026-11-30/hour=3/part-0.parquet"), "every file below a selected folder");
        assert!(!s.matches("date=2026-12-01/part-0.parquet"));
        assert!(!s.matches("date=2026-11-31/part-0.parquet"));
        assert!(!s.matches("date=2026-11-1/part-0.parquet"), "as wide as the bounds are written");
    }

    #[test]
    fn alternatives_globs_and_classes() {
        let s = sel("s3://b/{ads,clicks}/date=2026-11-0[1-7]/*.parquet");
        assert_eq!(s.prefixes(), ["ads/", "clicks/"]);
        assert!(s.matches("clicks/date=2026-11-07/a.parquet"));
        assert!(!s.matches("clicks/date=2026-11-08/a.parquet"));
        assert!(!s.matches("clicks/date=2026-11-07/deeper/a.parquet"), "* stays within one folder");
        assert!(!s.matches("views/date=2026-11-01/a.parquet"));
        let deep = sel("/data/ads/**/part-*.parquet");
        assert_eq!(deep.prefixes(), [""]);
        assert!(deep.matches("x/y/part-3.parquet") && deep.matches("part-3.parquet"));
        assert!(!deep.matches("x/y/other.parquet"));
    }

    #[test]
    fn a_folder_named_without_a_slash_takes_its_files() {
        let s = sel("file:///data/ads/day={1..3}");
        assert_eq!(s.prefixes(), [""], "day=1 may be a folder or the start of a name: the base is listed");
        assert!(s.matches("day=2/part.parquet"));
        assert!(!s.matches("day=4/part.parquet"));
        assert!(!s.matches("day=10/part.parquet"));
    }

    #[test]
    fn ranges_count_down_and_overlapping_prefixes_list_once() {
        assert_eq!(expand("{3..1}").unwrap(), ["3", "2", "1"]);
        assert_eq!(expand("{8..10}").unwrap(), ["8", "9", "10"]);
        assert_eq!(expand("a{1..2}b{x,y}").unwrap(), ["a1bx", "a1by", "a2bx", "a2by"]);
        assert_eq!(expand("{a..b}").unwrap(), ["a..b"], "only numbers make a range");
        let s = sel("s3://b/ads/{x/,x/y/}");
        assert_eq!(s.prefixes(), ["x/"]);
    }

    #[test]
    fn a_bad_pattern_says_what_is_wrong() {
        for (source, why) in [
            ("s3://b/ads/{1..3", "without its `}`"),
            ("s3://b/ads/{a,{b,c}}", "do not nest"),
            ("s3://b/ads/{0..99999}", "more than 10000"),
            ("s3://b/ads/{0..99}/{0..99}/{0..9}", "more than 10000"),
            ("s3://bucket-*/ads/", "bucket or host"),
            ("*.parquet", "a folder before it"),
            ("s3://b/ads/[ab", "s3://b/ads/[ab"),
            ("s3://b/ads/***", "s3://b/ads/***"),
        ] {
            let err = split(source).expect_err(source);
            assert!(err.contains(why), "{source}: {err}");
        }
    }
}
