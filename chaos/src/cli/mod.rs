//! The commands of the `granary-chaos` binary, one file per command, each
//! holding its `clap` arguments next to the body that uses them:
//!
//! - [`sim`]: `granary-chaos sim`, the deterministic simulation of the
//!   decision cores;
//! - [`run`]: `granary-chaos run`, real processes under seeded faults;
//! - [`hosts`]: `granary-chaos hosts`, one fault on hosts made of network
//!   namespaces;
//! - [`node`]: `granary-chaos node`, a node daemon that forges the chunks
//!   it sends to peers (`run`'s byzantine peer).
//!
//! `run` and `hosts` start voters, nodes and trainer ranks from the
//! `granary` binary ([`granary_binary`]); `sim` needs none.

pub(crate) mod hosts;
pub(crate) mod node;
pub(crate) mod run;
pub(crate) mod sim;

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};

/// The folder a chaos command works in: `keep` (made if missing), or a
/// temporary folder named with `prefix`, removed when the guard drops.
pub(crate) fn work_dir(keep: Option<&Path>, prefix: &str) -> Result<(PathBuf, Option<tempfile::TempDir>)> {
    match keep {
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            Ok((dir.to_path_buf(), None))
        }
        None => {
            let tmp = tempfile::Builder::new().prefix(prefix).tempdir()?;
            Ok((tmp.path().to_path_buf(), Some(tmp)))
        }
    }
}

/// The `granary` binary whose processes a run starts: `given` (`--granary`),
/// else `granary` in the folder of this binary (where cargo puts both).
pub(crate) fn granary_binary(given: Option<&Path>) -> Result<PathBuf> {
    let path = match given {
        Some(p) => p.to_path_buf(),
        None => {
            let me = std::env::current_exe().context("locating the granary-chaos binary")?;
            me.with_file_name(format!("granary{}", std::env::consts::EXE_SUFFIX))
        }
    };
    if !path.is_file() {
        bail!(
            "this command starts voters, nodes and trainer ranks of the granary binary, and there is none at {}: \
             build it (cargo build --release -p granary, or without --release beside a debug granary-chaos), or \
             name one with --granary PATH",
            path.display()
        );
    }
    Ok(path)
}
