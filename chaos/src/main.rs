//! `granary-chaos`: the chaos harness as a binary of its own, so that the
//! `granary` binary a host runs links no fault store (s3s), no FUSE server
//! (fuser) and no harness (issue 29).
//!
//! - `granary-chaos sim` — the deterministic simulation of the fabric's races.
//! - `granary-chaos run` — the real processes under a seeded schedule of faults.
//! - `granary-chaos hosts` — one fault on hosts made of network namespaces (root).
//! - `granary-chaos node` — a node daemon that forges the chunks it sends to
//!   peers: `run`'s byzantine peer, started by `run` itself.
//!
//! `run` and `hosts` start the `granary` binary's processes: by default the
//! `granary` beside this binary, or `--granary PATH`.

mod cli;

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "granary-chaos",
    version,
    about = "Chaos testing of Granary: simulation and real processes under seeded faults"
)]
struct Cli {
    /// The `granary` binary whose voters, nodes and ranks `run` and `hosts`
    /// start. Default: `granary` in this binary's folder.
    #[arg(long, global = true, value_name = "PATH")]
    granary: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Deterministic simulation of the decision cores under seeded faults.
    Sim(cli::sim::SimArgs),
    /// The real processes (voters, nodes, trainer ranks) under a seeded
    /// schedule of faults, checked against a fault-free reference.
    Run(cli::run::RunArgs),
    /// A node stopped, or its host cut off, in the cold epoch, on hosts
    /// made of network namespaces, against the same job without the fault
    /// (needs root).
    Hosts(cli::hosts::HostsArgs),
    /// A node daemon like `granary node` whose peer server forges every
    /// chunk it sends (the byzantine peer `run` starts); never for use.
    #[command(hide = true)]
    Node(cli::node::NodeArgs),
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            let mut text = format!("error: {e}");
            for cause in e.chain().skip(1) {
                let cause = cause.to_string();
                if !text.contains(&cause) {
                    text += &format!("\n  caused by: {cause}");
                }
            }
            eprintln!("{text}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    // The fault store's and the nodes' HTTP clients need a process-wide TLS provider.
    granary_net::tls::ensure_default_crypto_provider();
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("GRANARY_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,foyer=error"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match cli.command {
        Command::Sim(a) => cli::sim::run(&a),
        Command::Run(a) => cli::run::run(&a, &cli::granary_binary(cli.granary.as_deref())?),
        Command::Hosts(a) => cli::hosts::run(&a, &cli::granary_binary(cli.granary.as_deref())?),
        Command::Node(a) => cli::node::run(&a),
    }
}
