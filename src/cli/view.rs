//! `granary view check`: a view checked against a source before it is
//! deployed, with no coordinator, node or certificates: the files listed,
//! the view resolved against the first file's footer, every tensor's dtype,
//! shape and columns printed, or the error naming file, tensor and column.

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// `granary view`.
#[derive(Subcommand)]
pub(crate) enum ViewCommand {
    /// Resolve a view against a source's first file and print the tensors
    Check(CheckArgs),
}

/// `granary view check`.
#[derive(Args)]
pub(crate) struct CheckArgs {
    /// The source: file:///abs/path/, s3://bucket/prefix/, gs://..., https://..., or an absolute path.
    #[arg(long)]
    source: String,
    /// The view file (TOML, `[[tensor]]` tables).
    #[arg(long)]
    view: PathBuf,
    /// An object_store option, KEY=VALUE (as a node's `[remote]` table), repeatable.
    #[arg(long = "remote-option")]
    remote_options: Vec<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `granary view ...`.
pub(crate) fn run(c: ViewCommand) -> Result<()> {
    match c {
        ViewCommand::Check(a) => check(a),
    }
}

fn check(a: CheckArgs) -> Result<()> {
    let view = granary_node::config::load_view(&a.view)?
        .validated()
        .with_context(|| format!("the view in {}", a.view.display()))?;
    let mut options = BTreeMap::new();
    for kv in &a.remote_options {
        let Some((k, v)) = kv.split_once('=') else { bail!("--remote-option {kv:?}: expected KEY=VALUE") };
        options.insert(k.to_string(), v.to_string());
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let report = rt.block_on(async {
        let remote = granary_source::Remote::open(&a.source, &options, None, Default::default())?;
        granary_source::check_view(&remote, &view).await.map_err(anyhow::Error::from)
    })?;
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    println!(
        "{}: {} Parquet files, {:.1} MB; view resolved against {} ({} rows in {} row groups)",
        report.source,
        report.files,
        report.bytes as f64 / 1e6,
        report.first_file,
        report.first_rows,
        report.first_row_groups
    );
    println!("{:<16} {:<6} {:<8} columns", "tensor", "dtype", "shape");
    for t in &report.tensors {
        // A jagged tensor's rows have a variable number of values: `*`.
        let dims = t.jagged.then(|| "*".to_string()).into_iter().chain(t.shape.iter().map(|d| d.to_string()));
        let shape = format!("[{}]", dims.collect::<Vec<_>>().join(", "));
        let cols = if t.columns.len() > 4 {
            format!("{} .. {} ({} columns)", t.columns[0], t.columns[t.columns.len() - 1], t.columns.len())
        } else {
            t.columns.join(", ")
        };
        let cast = if t.cast { " (cast)" } else { "" };
        let computed = t.computed.as_ref().map(|c| format!(" ({c})")).unwrap_or_default();
        println!("{:<16} {:<6} {:<8} {cols}{cast}{computed}", t.name, t.dtype, shape);
    }
    for t in &report.tensors {
        if let Some(l) = &t.lengths {
            let unit = if t.dtype == "u8" { "bytes" } else { "values" };
            println!(
                "{}: {unit} a row in the first row group ({} rows): mean {:.1}, p99 {}, max {}",
                t.name, l.rows, l.mean, l.p99, l.max
            );
        }
    }
    let jagged: Vec<&str> = report.tensors.iter().filter(|t| t.jagged).map(|t| t.name.as_str()).collect();
    if jagged.is_empty() {
        println!("{} bytes a converted row", report.row_bytes);
    } else {
        println!("{} bytes a converted row, and the values of {} (jagged)", report.row_bytes, jagged.join(", "));
    }
    Ok(())
}
