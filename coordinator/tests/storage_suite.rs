//! openraft's storage conformance suite against the real stores: the redb
//! [`LogStore`] and the snapshot-backed [`StateMachineStore`], each case in
//! a fresh temporary folder.

use granary_coordinator::sm::StateMachineStore;
use granary_coordinator::store::{DurableSnapshot, LogStore, StoreError};
use granary_coordinator::types::{TypeConfig, VoterId};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{CommittedLeaderId, LogId, StorageError, StorageIOError};
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
        let sm = StateMachineStore::open(&dir.path().join("sm")).map_err(storage_err)?;
        let log =
            LogStore::open(&dir.path().join("raft.redb"), all_covered()).map_err(|e: StoreError| storage_err(e))?;
        Ok((dir, log, sm))
    }
}

/// A durable snapshot past every index the suite writes. The suite purges
/// and appends with no snapshot at all, as openraft's own contract allows;
/// the coordinator's log keeps entries until a snapshot on disk covers them
/// and holds appends past a purge until then (store.rs; its unit tests
/// cover that with the real state machine), so here every purge is covered.
fn all_covered() -> DurableSnapshot {
    let far = LogId::new(CommittedLeaderId::new(u64::MAX / 2, VoterId(0)), u64::MAX / 2);
    tokio::sync::watch::channel(Some(far)).1
}

/// Runs every case of openraft 0.9.25's suite (35 of them: log reads,
/// truncate, purge, vote, initial state, apply, snapshot build and transfer).
#[test]
fn openraft_storage_suite_passes() -> anyhow::Result<()> {
    Suite::test_all(TempStores)?;
    Ok(())
}
