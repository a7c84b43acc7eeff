//! `granary dataset`: the datasets Granary serves.
//!
//! - `gen` writes the synthetic recommendation dataset (Parquet files and a
//!   `view.toml`) to a local folder; it needs no cluster.
//! - `add`, `ls`, `show` and `placement` act on the datasets registered with
//!   the coordinators: the leader lists the source and reads every footer,
//!   so the client sends only a name, a source URL and a view.
//!
//! [`print_datasets`] is also the dataset table of `granary status`.

use super::connect::{ConnectArgs, call, call_reporting, unexpected};
use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use granary_net::api::{AddProgress, ApiRequest, ApiResponse, DatasetSummary, VersionStatus};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// `granary dataset`.
#[derive(Subcommand)]
pub(crate) enum DatasetCommand {
    /// Write the synthetic recommendation dataset.
    Gen(GenArgs),
    #[command(flatten)]
    Cluster(ClusterDatasetCommand),
}

/// Options of `granary dataset gen`.
#[derive(Args)]
pub(crate) struct GenArgs {
    /// Output folder.
    #[arg(long)]
    out: PathBuf,
    /// Total rows.
    #[arg(long, default_value_t = 100_000)]
    rows: u64,
    /// Number of files.
    #[arg(long, default_value_t = 4)]
    files: u32,
    /// Rows per row group.
    #[arg(long, default_value_t = 10_000)]
    row_group_rows: u64,
    /// none, snappy, zstd, lz4 or gzip.
    #[arg(long, default_value = "snappy")]
    compression: String,
    /// Feature values: uniform (random floats, plain encoding) or mixed
    /// (continuous, count-like and bucketised features, dictionary-encoded).
    #[arg(long, default_value = "uniform")]
    values: granary_testkit::datagen::Values,
    /// Seed of every value.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Also write variable-length columns: `hist` (List<Int64>, power-law
    /// lengths up to 4,096), `cats` (List<Int32>, 0 to 8 values) and
    /// `blob` (Binary, 1 to 4 KiB), and jagged tensors of them in the view.
    #[arg(long)]
    jagged: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Cluster-side dataset commands.
#[derive(Subcommand)]
pub(crate) enum ClusterDatasetCommand {
    /// Register a dataset: the leader lists the source, reads every footer and commits the manifest.
    Add {
        /// Dataset name.
        name: String,
        /// Source URL prefix (file://, s3://, gs://, http(s)://).
        #[arg(long)]
        source: String,
        /// View TOML file.
        #[arg(long)]
        view: PathBuf,
        #[command(flatten)]
        connect: ConnectArgs,
    },
    /// List datasets.
    Ls {
        #[command(flatten)]
        connect: ConnectArgs,
    },
    /// Show one dataset's current version, files and tensors.
    Show {
        /// Dataset name.
        name: String,
        #[command(flatten)]
        connect: ConnectArgs,
    },
    /// Show which node owns each shard of a dataset.
    Placement {
        /// Dataset name.
        name: String,
        #[command(flatten)]
        connect: ConnectArgs,
    },
}

/// Runs a `dataset` subcommand.
pub(crate) fn run(cmd: DatasetCommand) -> Result<()> {
    match cmd {
        DatasetCommand::Gen(a) => generate(a),
        DatasetCommand::Cluster(c) => registered(c),
    }
}

/// Writes the synthetic dataset and its view.
fn generate(a: GenArgs) -> Result<()> {
    let spec = granary_testkit::datagen::GenSpec {
        seed: a.seed,
        rows: a.rows,
        files: a.files,
        row_group_rows: a.row_group_rows,
        compression: a.compression,
        values: a.values,
        jagged: a.jagged,
    };
    let bar = indicatif::ProgressBar::new(a.rows);
    if a.json {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let report = granary_testkit::datagen::generate(&a.out, &spec, |n| bar.set_position(n))?;
    bar.finish_and_clear();
    let view_path = a.out.join("view.toml");
    std::fs::write(&view_path, granary_testkit::datagen::view_toml(a.jagged))?;
    if a.json {
        println!(
            "{}",
            serde_json::json!({"files": report.files, "rows": report.rows, "bytes": report.bytes, "view": view_path})
        );
    } else {
        println!(
            "wrote {} rows in {} files ({:.1} MB) to {}; view: {}",
            report.rows,
            report.files.len(),
            report.bytes as f64 / 1e6,
            a.out.display(),
            view_path.display()
        );
    }
    Ok(())
}

/// Prints registered datasets as a table, one row each.
pub(crate) fn print_datasets(list: &[DatasetSummary]) {
    println!("{:<20} {:<14} {:>5} {:>7} {:>12} {:>10}  source", "name", "version", "files", "shards", "rows", "MiB");
    for d in list {
        println!(
            "{:<20} {:<14} {:>5} {:>7} {:>12} {:>10.1}  {}",
            d.name,
            d.version.to_string(),
            d.files,
            d.shards,
            d.rows,
            d.source_bytes as f64 / (1 << 20) as f64,
            d.source
        );
        if d.version_list.len() > 1 {
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|t| t.as_millis() as u64)
                .unwrap_or(0);
            for v in &d.version_list {
                println!("  version {}  {:>12} rows  {}", v.version, v.rows, version_state(&v.state, now_ms));
            }
        }
    }
}

/// A version's state in words.
fn version_state(state: &VersionStatus, now_ms: u64) -> String {
    match state {
        VersionStatus::Current => "current".into(),
        VersionStatus::Held { nodes } => {
            let nodes: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
            format!("held by trainers on {} (placed, kept)", nodes.join(", "))
        }
        VersionStatus::Unused { collect_at_ms: None } => "unused (collection pending)".into(),
        VersionStatus::Unused { collect_at_ms: Some(at) } => {
            let left = at.saturating_sub(now_ms) / 1000;
            format!("unused, collected in {}h{:02}m{:02}s", left / 3600, left / 60 % 60, left % 60)
        }
    }
}

/// Runs a command on the registered datasets.
fn registered(cmd: ClusterDatasetCommand) -> Result<()> {
    match cmd {
        ClusterDatasetCommand::Add { name, source, view, connect } => {
            let text = std::fs::read_to_string(&view).with_context(|| format!("reading view {}", view.display()))?;
            let parsed: granary_proto::View =
                toml::from_str(&text).with_context(|| format!("parsing view {}", view.display()))?;
            let parsed = parsed.validated().with_context(|| format!("view {}", view.display()))?;
            // Progress on stderr (hidden with --json): reading 100,000
            // footers takes minutes.
            let bar = indicatif::ProgressBar::new(0);
            if connect.json {
                bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
            }
            if let Ok(style) = indicatif::ProgressStyle::with_template("{msg}: {pos}/{len} [{elapsed}]") {
                bar.set_style(style);
            }
            let show = |p: &AddProgress| {
                bar.set_message(p.stage.to_string());
                bar.set_length(p.total);
                bar.set_position(p.done);
            };
            let req = ApiRequest::AddDataset { name, source, view: parsed, progress: true };
            let answer = call_reporting(&connect, req, show);
            bar.finish_and_clear();
            match answer? {
                ApiResponse::DatasetAdded { summary, new } => {
                    if connect.json {
                        println!("{}", serde_json::json!({ "added": summary, "new": new }));
                    } else {
                        let what = if new { "registered" } else { "already current:" };
                        println!(
                            "{what} {} version {} ({} files, {} shards, {} rows)",
                            summary.name, summary.version, summary.files, summary.shards, summary.rows
                        );
                    }
                    Ok(())
                }
                other => Err(unexpected(other)),
            }
        }
        ClusterDatasetCommand::Ls { connect } => match call(&connect, ApiRequest::ListDatasets)? {
            ApiResponse::Datasets(list) => {
                if connect.json {
                    println!("{}", serde_json::to_string(&list)?);
                } else {
                    print_datasets(&list);
                }
                Ok(())
            }
            other => Err(unexpected(other)),
        },
        ClusterDatasetCommand::Show { name, connect } => {
            match call(&connect, ApiRequest::DescribeDataset { name, version: None })? {
                ApiResponse::Dataset { summary, manifest, view } => {
                    if connect.json {
                        println!("{}", serde_json::json!({ "summary": summary, "manifest": manifest, "view": view }));
                    } else {
                        print_datasets(std::slice::from_ref(&summary));
                        for t in &manifest.tensors {
                            println!("  tensor {:<12} {:?} {:?}", t.name, t.dtype, t.shape);
                        }
                        for f in &manifest.files {
                            println!("  {} ({} bytes, {} row groups)", f.path, f.size_bytes, f.row_groups.len());
                        }
                    }
                    Ok(())
                }
                other => Err(unexpected(other)),
            }
        }
        ClusterDatasetCommand::Placement { name, connect } => {
            match call(&connect, ApiRequest::DescribePlacement { name, version: None })? {
                ApiResponse::Placement(report) => {
                    if connect.json {
                        println!("{}", serde_json::to_string(&report)?);
                    } else {
                        println!(
                            "{} version {} placement epoch {}",
                            report.name, report.version, report.placement_epoch
                        );
                        let mut per: BTreeMap<u64, usize> = BTreeMap::new();
                        for (_, _, n) in &report.owners {
                            *per.entry(n.0).or_default() += 1;
                        }
                        for (n, c) in per {
                            println!("  node-{n}: {c} shards");
                        }
                    }
                    Ok(())
                }
                other => Err(unexpected(other)),
            }
        }
    }
}
