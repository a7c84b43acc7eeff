//! `granary`: one binary for every role.
//!
//! - `granary demo` — the main job on an embedded local default.
//! - `granary node --config node.toml` — the node daemon.
//! - `granary dataset gen` — write the synthetic dataset.
//! - `granary bench local` — the single-host scenario benchmark.
//! - `granary bench placement` — the placement function at cluster scale.
//! - `granary bench failover` — leader kills in a coordinator group of real processes.
//! - `granary stats --socket PATH` — a node's counters.
//! - `granary doctor --socket PATH` — which stage bounds a running job, and the setting that helps.
//! - `granary coordinator --id N --listen ADDR --peers ... --data-dir DIR` — a coordinator voter.
//! - `granary certs init --out DIR` — the cluster CA and role certificates.
//! - `granary dataset add|ls|show|placement` — datasets registered with the coordinators.
//! - `granary view check --source URL --view view.toml` — a view against a source's first file.
//! - `granary status` — leader, voters, nodes with leases, placement epoch.
//! - `granary nodes weight --node N --weight W` — a node's placement weight (admin).
//! - `granary trainer ...` — one trainer rank (used by the demo).
//!
//! This file holds only the top-level grammar, the process-wide setup
//! (TLS provider, tracing), the dispatch and how an error is printed. Each command's arguments and
//! body live together in [`cli`] (one file per command) or, for the demo,
//! in [`demo`], so that reading one command never means reading the others.

mod cli;
mod demo;
mod quiet;

use anyhow::Result;
use clap::{Parser, Subcommand};
use cli::{bench, certs, connect, coordinator, dataset, doctor, node, nodes, stats, status, trainer, view};

#[derive(Parser)]
#[command(name = "granary", version, about = "A distributed cache fabric that keeps GPUs fed")]
struct Cli {
    /// Log lines on stderr as `text` or `json` (one object per line with its
    /// spans' fields, for log shippers); GRANARY_LOG picks which lines, in
    /// RUST_LOG's syntax.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value_t = LogFormat::Text,
        env = "GRANARY_LOG_FORMAT",
        hide_possible_values = true,
        display_order = 900
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// `--log-format`.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the whole single-host path on a generated dataset and report.
    Demo(demo::DemoArgs),
    /// Run a coordinator voter.
    Coordinator(coordinator::CoordinatorArgs),
    /// Cluster certificates.
    #[command(subcommand)]
    Certs(certs::CertsCommand),
    /// Leader, term, voters, nodes with leases, placement epoch and shards per node.
    Status(connect::ConnectArgs),
    /// Run a node daemon.
    Node(node::NodeArgs),
    /// Dataset tools.
    #[command(subcommand)]
    Dataset(dataset::DatasetCommand),
    /// Node placement weights (admin).
    #[command(subcommand)]
    Nodes(nodes::NodesCommand),
    /// View tools: check a view against a source before deploying it.
    #[command(subcommand)]
    View(view::ViewCommand),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Print a node's counters.
    Stats(stats::StatsArgs),
    /// Measure a running job for a few seconds and name the stage that bounds it.
    Doctor(doctor::DoctorArgs),
    /// One trainer rank, driven over stdin/stdout (used by the demo).
    #[command(hide = true)]
    Trainer(trainer::TrainerArgs),
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}", error_text(&e, std::env::var_os("GRANARY_BACKTRACE").is_some_and(|v| v == "1")));
            std::process::ExitCode::FAILURE
        }
    }
}

/// An error as the user reads it: `error: ` and the message, then each
/// cause on its own line unless a message before already says it (wrappers
/// often repeat their cause). The backtrace only with `GRANARY_BACKTRACE=1`:
/// `RUST_BACKTRACE`, often set for every program, would print thirty frames
/// under a config error.
fn error_text(e: &anyhow::Error, backtrace: bool) -> String {
    let mut out = format!("error: {e}");
    let mut said = e.to_string();
    for cause in e.chain().skip(1) {
        let text = cause.to_string();
        if said.contains(&text) {
            continue;
        }
        out += &format!("\n  caused by: {text}");
        said += &text;
    }
    if backtrace {
        out += &format!("\n\nbacktrace:\n{}", e.backtrace());
    }
    out
}

fn run() -> Result<()> {
    // object_store's HTTP client needs a process-wide TLS provider (ring).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    // The daemon logs its lifecycle; interactive commands only problems.
    let default = if matches!(cli.command, Command::Node(_) | Command::Coordinator(_)) {
        "info,openraft=warn"
    } else {
        "warn,foyer=error"
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("GRANARY_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // openraft's lines about an unreachable voter pass once per call site
    // every 30 s (quiet.rs).
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{Layer, fmt};
    let logs = tracing_subscriber::registry();
    match cli.log_format {
        LogFormat::Json => logs
            .with(
                fmt::layer()
                    .json()
                    .with_current_span(false)
                    .with_span_list(true)
                    .with_writer(std::io::stderr)
                    .with_filter(filter)
                    .with_filter(quiet::filter()),
            )
            .init(),
        // Colours only on a terminal: daemons usually log to files.
        LogFormat::Text => logs
            .with(
                fmt::layer()
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                    .with_writer(std::io::stderr)
                    .with_filter(filter)
                    .with_filter(quiet::filter()),
            )
            .init(),
    }
    // A command that only prints dies quietly when its reader goes away
    // (`granary status | head -1`), as other Unix tools do, instead of
    // panicking on the closed pipe (issue 48). Daemons keep ignoring
    // SIGPIPE (a write to a closed socket is an error they handle), as do
    // `stats` and `doctor`, which write to the node's socket: their output
    // goes through `cli::emit`.
    if matches!(
        cli.command,
        Command::Status(_) | Command::Dataset(_) | Command::Nodes(_) | Command::View(_) | Command::Certs(_)
    ) {
        // SAFETY: SIG_DFL is a valid disposition for SIGPIPE, set before
        // any thread this process starts.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    match cli.command {
        Command::Demo(a) => demo::run(a),
        Command::Node(a) => node::run(&a),
        Command::Dataset(c) => dataset::run(c),
        Command::Nodes(c) => nodes::run(c),
        Command::View(c) => view::run(c),
        Command::Coordinator(a) => coordinator::run(a),
        Command::Certs(c) => certs::run(c),
        Command::Status(c) => status::run(&c),
        Command::Bench(c) => bench::run(c),
        Command::Stats(a) => stats::run(&a),
        Command::Doctor(a) => doctor::run(&a),
        Command::Trainer(a) => trainer::run(a),
    }
}

#[cfg(test)]
mod tests {
    use super::error_text;
    use anyhow::Context;

    #[test]
    fn an_error_is_said_once_with_its_new_causes_and_no_backtrace_unless_asked() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory (os error 2)");
        let e = Err::<(), _>(io).context("reading /etc/granary/node.toml").context("starting the node").unwrap_err();
        assert_eq!(
            error_text(&e, false),
            "error: starting the node\n  caused by: reading /etc/granary/node.toml\n  caused by: No such file or directory (os error 2)"
        );
        // A wrapper that repeats its cause's message says it once.
        let e =
            anyhow::anyhow!("bad view: tensor \"x\" names no column").context("bad view: tensor \"x\" names no column");
        assert_eq!(error_text(&e, false), "error: bad view: tensor \"x\" names no column");
        assert!(error_text(&e, true).contains("backtrace:"));
    }
}
