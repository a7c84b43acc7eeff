//! `granary demo --daily`: a dataset that changes every day (issue 43).
//!
//! A cluster (`--nodes`, 4 unless given) serves a window of `--days` days
//! (`day=01` to `day=10`, one Parquet file each) named by a brace range,
//! and one rank reads an epoch of it: the warm version. Then a job pinned
//! to it keeps reading while day 11 lands and the window moves by a day
//! (`day={02..11}`, a new version); a rank of the new version reads an
//! epoch. The demo reports what the new version cost against day 11's own
//! bytes and row groups, and that the old job read nothing from the store
//! and the same bytes as before.

use super::args::DemoArgs;
use super::report::{say_to, style};
use super::setup::cluster_spec;
use anyhow::{Context, Result, bail};
use granary_client::{ChunkSource, Loader, LoaderConfig, LocalSource};
use granary_proto::DatasetVersion;
use granary_testkit::datagen::{self, GenSpec};
use granary_testkit::harness::{LocalCluster, LocalClusterSpec};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget};
use std::path::Path;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(120);

/// Runs the daily demo.
pub(super) fn run(a: DemoArgs) -> Result<()> {
    let started = Instant::now();
    let days = a.days.max(2);
    // A cluster: 4 nodes unless `--nodes` names 2 or more.
    let nodes = if a.nodes > 1 { a.nodes } else { 4 };
    let rows_per_day = (a.rows / u64::from(days)).max(a.row_group_rows);
    let bars = MultiProgress::new();
    if a.json {
        bars.set_draw_target(ProgressDrawTarget::hidden());
    }
    let say = |s: String| {
        if !a.json {
            say_to(&bars, s);
        }
    };
    let work = tempfile::tempdir()?;
    let data = work.path().join("data");
    for day in 1..=days {
        write_day(&data, day, rows_per_day, a.row_group_rows)?;
    }
    let window = |first: u32, last: u32| format!("file://{}/day={{{first:02}..{last:02}}}/", data.display());
    let spec = LocalClusterSpec {
        nodes,
        prefetch_bytes: 0,
        source: Some(window(1, days)),
        ..cluster_spec(&DemoArgs { nodes, ..a.clone() })
    };
    say(format!(
        "{days} days of {rows_per_day} rows ({} row groups a day) at {}; starting a coordinator and {nodes} node \
         daemons, the dataset named {}",
        rows_per_day.div_ceil(a.row_group_rows),
        data.display(),
        window(1, days)
    ));
    let mut c = LocalCluster::prepare(&std::env::current_exe()?, &work.path().join("cluster"), &data, spec)?;
    until(&c, "the coordinator turns on owners that follow content", || c.status().is_ok_and(|s| s.content_owners))?;
    c.start_nodes()?;
    let ids = c.node_ids();
    let v1 = current(&c, ids[0])?;
    let warm = read(&c, &bars, ids[0], v1, "warm: days 1-10")?;
    say(format!("warm: a rank read version {} ({} rows), every shard converted once", short(v1), warm.rows));

    // The old job stays connected (its version stays held) while the new
    // day lands and the window moves.
    let old_job = LocalSource::connect(c.socket(ids[0]))?;
    old_job.describe("ads", Some(v1))?;
    let day = days + 1;
    let (new_day_bytes, new_day_row_groups) = write_day(&data, day, rows_per_day, a.row_group_rows)?;
    c.add_source("ads", &window(2, day)).context("registering the moved window")?;
    until(&c, "every node serves the new version", || ids.iter().all(|&id| current(&c, id).is_ok_and(|v| v != v1)))?;
    let v2 = current(&c, ids[0])?;
    say(format!(
        "day {day} landed ({:.1} MB); the window moved to days 2-{day}: version {}",
        new_day_bytes as f64 / 1e6,
        short(v2)
    ));

    let before = c.total_stats()?;
    let again = read(&c, &bars, ids[0], v1, "old job again")?;
    let mid = c.total_stats()?;
    let new = read(&c, &bars, ids[ids.len() - 1], v2, &format!("new: days 2-{day}"))?;
    let after = c.total_stats()?;
    drop(old_job);
    let old_job_remote = mid.remote_bytes - before.remote_bytes;
    let identical = again.digest == warm.digest;
    let remote = after.remote_bytes - mid.remote_bytes;
    let converted = after.conversions - mid.conversions;
    let over = remote as f64 / new_day_bytes.max(1) as f64;
    let exact = converted == new_day_row_groups;
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "scenario": "daily",
                "nodes": nodes,
                "days": days,
                "new_day_bytes": new_day_bytes,
                "new_day_row_groups": new_day_row_groups,
                "new_version_rows": new.rows,
                "new_version_remote_bytes": remote,
                "new_version_remote_over_new_day": over,
                "new_version_conversions": converted,
                "converts_only_the_new_day": u8::from(exact),
                "old_job_remote_bytes": old_job_remote,
                "old_job_identical": u8::from(identical),
                "secs": started.elapsed().as_secs_f64(),
            })
        );
    } else {
        println!();
        println!(
            "new version: {} — converted {converted} row groups (day {day} has {new_day_row_groups}), read {:.2} MB \
             from the store, {over:.3}x day {day}'s {:.2} MB",
            if exact { "OK" } else { "FAILED" },
            remote as f64 / 1e6,
            new_day_bytes as f64 / 1e6
        );
        println!(
            "old job: {} — read {old_job_remote} bytes from the store, its batches {} the ones before",
            if identical && old_job_remote == 0 { "OK" } else { "FAILED" },
            if identical { "byte for byte" } else { "NOT" }
        );
        println!("total {:.1}s", started.elapsed().as_secs_f64());
    }
    if !(exact && identical && old_job_remote == 0) {
        bail!("the new day cost more than the new day, or the old job changed\n{}", c.log_tails());
    }
    Ok(())
}

/// Day `day`'s file under `data/day=DD/`: its bytes and row groups.
fn write_day(data: &Path, day: u32, rows: u64, row_group_rows: u64) -> Result<(u64, u64)> {
    let spec = GenSpec {
        seed: 1000 + u64::from(day),
        rows,
        files: 1,
        row_group_rows,
        compression: "snappy".into(),
        ..GenSpec::default()
    };
    let report = datagen::generate(&data.join(format!("day={day:02}")), &spec, |_| {})?;
    Ok((report.bytes, rows.div_ceil(row_group_rows)))
}

/// What a rank read: its rows and a digest of every batch's bytes.
struct Read {
    rows: u64,
    digest: u64,
}

/// Epoch 0 of `version`, read by one rank through node `id`.
fn read(c: &LocalCluster, bars: &MultiProgress, id: u64, version: DatasetVersion, name: &str) -> Result<Read> {
    let cfg = LoaderConfig { seed: 11, version: Some(version), ..LoaderConfig::new("ads", 1024) };
    let loader = Loader::connect(c.socket(id), cfg)?;
    let epoch = loader.epoch(0)?;
    let bar = bars.add(ProgressBar::new(epoch.num_batches()));
    bar.set_style(style(name));
    let mut hash = xxhash_rust::xxh3::Xxh3::new();
    let mut rows = 0u64;
    for batch in epoch {
        let batch = batch?;
        rows += batch.rows() as u64;
        for part in batch.parts() {
            hash.update(part);
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(Read { rows, digest: hash.digest() })
}

/// The version node `id` serves as current.
fn current(c: &LocalCluster, id: u64) -> Result<DatasetVersion> {
    Ok(LocalSource::connect(c.socket(id))?.describe("ads", None)?.version)
}

fn until(c: &LocalCluster, what: &str, mut done: impl FnMut() -> bool) -> Result<()> {
    let start = Instant::now();
    while !done() {
        if start.elapsed() > WAIT {
            bail!("{what}: not within {WAIT:?}\n{}", c.log_tails());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

fn short(v: DatasetVersion) -> String {
    v.to_hex()[..12].to_string()
}
