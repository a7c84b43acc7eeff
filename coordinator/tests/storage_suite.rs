//! openraft's storage conformance suite against the real stores: the redb
//! [`LogStore`] and the snapshot-backed [`StateMachineStore`], each case in
//! a fresh temporary folder.

use granary_coordinator::sm::StateMachineStore;
use granary_coordinator::store::{LogStore, StoreError};
use granary_coordinator::types::{TypeConfig, VoterId};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{StorageError, StorageIOError};
use tempfile::TempDir;

/// Builds both stores in a new temporary folder, returned as the guard so it
/// lives exactly as long as the case that uses it.
struct TempStores;

fn storage_err(e: impl std::error::Error + 'static) -> StorageError<VoterId> {
    StorageIOError::write(&e).into()
}

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for TempStores {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachineStore), StorageError<VoterId>> {
        let dir = tempfile::tempdir().map_err(storage_err)?;
        let log = LogStore::open(&dir.path().join("raft.redb")).map_err(|e: StoreError| storage_err(e))?;
        let sm = StateMachineStore::open(&dir.path().join("sm")).map_err(storage_err)?;
        Ok((dir, log, sm))
    }
}

/// Runs every case of openraft 0.9.25's suite (35 of them: log reads,
/// truncate, purge, vote, initial state, apply, snapshot build and transfer).
#[test]
fn openraft_storage_suite_passes() -> anyhow::Result<()> {
    Suite::test_all(TempStores)?;
    Ok(())
}
