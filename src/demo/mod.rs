//! `granary demo`: the main job on one machine, end to end, from a fresh
//! checkout.
//!
//! - [`single`]: one node daemon and N trainer processes (the default).
//! - [`cluster`]: a coordinator and N node daemons (`--nodes N`, N ≥ 2).
//! - [`elastic`]: one node daemon (or a cluster, `--nodes N`), ranks of
//!   the global plan whose world size changes mid-epoch (`--elastic`).
//! - [`daily`]: a cluster whose dataset gains a day and moves its window
//!   (`--daily`).
//!
//! Both are built from the same parts, which depend on neither of them:
//! [`args`] (the flags), [`setup`] (the work folder and the generated
//! dataset), [`pass`] (one node daemon serving N ranks for every epoch: the
//! single-node runs and the cluster's reference run) and [`report`] (lines
//! and progress bars on the terminal). `single` and `cluster` do not import
//! each other, and only this file chooses between them, so the imports form
//! no cycle.

mod args;
mod cluster;
mod daily;
mod elastic;
mod pass;
mod report;
mod setup;
mod single;

use anyhow::{Result, bail};
pub(crate) use args::DemoArgs;

/// Runs the demo: the cluster with `--nodes` ≥ 2, one node otherwise.
pub(crate) fn run(a: DemoArgs) -> Result<()> {
    if a.nodes == 0 {
        bail!("--nodes must be at least 1");
    }
    if a.elastic {
        return elastic::run(a);
    }
    if a.daily {
        return daily::run(a);
    }
    if a.nodes > 1 {
        return cluster::run(a);
    }
    single::run(a)
}
