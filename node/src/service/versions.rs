//! The dataset versions a node serves: opening a manifest's version,
//! publishing it, describing it to trainers (waiting for a cluster's first
//! placement, or asking the coordinator for a pinned version), and closing
//! one nobody holds.

use super::{Node, VERSION_WAIT};
use crate::dataset::{Dataset, OpenError};
use crate::error::FetchError;
use crate::remote::Remote;
use crate::tier::ChunkKey;
use granary_proto::DatasetVersion;
use granary_proto::wire::DatasetInfo;
use std::sync::Arc;

impl Node {
    /// Describes dataset `name`; a cluster node that has not yet opened the
    /// datasets of its first placement (it just started, and learns them
    /// from the coordinator) first waits for that, up to `wait`, so that a
    /// trainer connecting right after a restart is not told a registered
    /// dataset is unknown.
    pub async fn describe_when_known(
        &self,
        name: &str,
        version: Option<DatasetVersion>,
        wait: std::time::Duration,
    ) -> Result<DatasetInfo, FetchError> {
        if let Some(cluster) = self.inner.cluster.get()
            && self.describe(name, version).is_err()
        {
            let mut known = self.inner.datasets_known.subscribe();
            // Timing out is fine: the answer below says what is known.
            let _ = tokio::time::timeout(wait, known.wait_for(|k| *k)).await;
            if !*known.borrow() {
                // Not joined yet: a retryable answer naming why, never
                // "not served here" (issue 48).
                let now = tokio::time::Instant::now().into_std();
                let reason = match granary_node_core::health::node_readiness(now, Some(cluster.lease_view()), None) {
                    Err(why) => why.to_string(),
                    Ok(()) => granary_node_core::health::NotReady::NoPlacement.to_string(),
                };
                return Err(FetchError::NotJoined { reason });
            }
        }
        if let Some(v) = version
            && self.inner.cluster.get().is_some()
            && self.describe(name, version).is_err()
        {
            // A pinned version this node never opened: the coordinator
            // keeps every registered version's manifest.
            let mut answered = self.inner.wanted_answered.subscribe();
            answered.mark_unchanged();
            self.inner.wanted.lock().unwrap_or_else(|p| p.into_inner()).push((name.to_string(), v));
            self.inner.wanted_added.notify_one();
            let gone =
                || self.inner.wanted_gone.lock().unwrap_or_else(|p| p.into_inner()).contains(&(name.to_string(), v));
            let _ = tokio::time::timeout(VERSION_WAIT, async {
                while answered.changed().await.is_ok() && self.describe(name, version).is_err() && !gone() {}
            })
            .await;
        }
        self.describe(name, version)
    }

    /// Waits until a trainer asks for a version this node does not serve,
    /// and returns every such (name, version) (the placement follower
    /// opens them).
    pub(crate) async fn wanted_versions(&self) -> Vec<(String, DatasetVersion)> {
        loop {
            let taken = std::mem::take(&mut *self.inner.wanted.lock().unwrap_or_else(|p| p.into_inner()));
            if !taken.is_empty() {
                return taken;
            }
            self.inner.wanted_added.notified().await;
        }
    }

    /// The follower has answered the versions it took: opened them, or
    /// learned that the coordinator knows none of `gone`.
    pub(crate) fn wanted_answered(&self, gone: Vec<(String, DatasetVersion)>) {
        *self.inner.wanted_gone.lock().unwrap_or_else(|p| p.into_inner()) = gone;
        self.inner.wanted_answered.send_modify(|n| *n += 1);
    }

    /// Serves `manifest`'s version of dataset `name` for trainers that ask
    /// for it by version, without making it the name's current version
    /// (a job pinned it). Returns the version.
    pub fn open_version(
        &self,
        name: &str,
        view: granary_proto::View,
        manifest: granary_proto::Manifest,
    ) -> Result<DatasetVersion, OpenError> {
        let ds = self.open_manifest(name, view, manifest)?;
        let version = ds.version;
        tracing::info!(dataset = %name, %version, "serving a pinned version");
        self.inner.by_version.write().unwrap_or_else(|p| p.into_inner()).entry(version).or_insert(ds);
        Ok(version)
    }

    /// Every (dataset, version) this node serves by version.
    pub(crate) fn served_versions(&self) -> Vec<(String, DatasetVersion)> {
        let by_version = self.inner.by_version.read().unwrap_or_else(|p| p.into_inner());
        by_version.iter().map(|(v, d)| (d.name.clone(), *v)).collect()
    }

    /// Stops serving `version` of dataset `name`, which the coordinator
    /// collected (no trainer used it for the retention), and drops its
    /// chunks from RAM, SSD and the guest area. A version that is some
    /// name's current one, or that trainers here follow, is kept. Returns
    /// whether it was dropped.
    pub(crate) fn close_version(&self, name: &str, version: DatasetVersion) -> bool {
        let current =
            self.inner.datasets.read().unwrap_or_else(|p| p.into_inner()).values().any(|d| d.version == version);
        let used = self.inner.holds.in_use(&(name.to_string(), version));
        if current || used {
            return false;
        }
        let Some(ds) = self.inner.by_version.write().unwrap_or_else(|p| p.into_inner()).remove(&version) else {
            return false;
        };
        for s in ds.manifest.shards() {
            let key = ChunkKey { version, shard: s.shard };
            self.inner.tier.remove(key);
            self.inner.guests.remove(key);
        }
        tracing::info!(dataset = %name, %version, "the coordinator collected this version: chunks dropped");
        true
    }

    /// After a placement update: a load that a peer waits on, and that asks
    /// a former owner of a shard the placement now gives this node, stops
    /// asking and reads the shard here (`granary_node_core::flight`; the cluster's
    /// follower calls this).
    pub(crate) fn placement_changed(&self) {
        if self.inner.cluster.get().is_none() {
            return;
        }
        let view = self.view();
        let mut engine = self.engine();
        for key in engine.placement_changed(&view) {
            if let Some(pending) = engine.shell(key) {
                pending.read_here.notify_one();
            }
        }
    }

    /// Marks the datasets of a placement as opened (the cluster's follower
    /// calls this).
    pub(crate) fn datasets_opened(&self) {
        self.inner.datasets_known.send_replace(true);
    }

    /// Describes `version` of dataset `name` (any version this node served
    /// under that name since it started), or its current version when
    /// `version` is `None`.
    pub fn describe(&self, name: &str, version: Option<DatasetVersion>) -> Result<DatasetInfo, FetchError> {
        let datasets = self.inner.datasets.read().unwrap_or_else(|p| p.into_inner());
        let current = datasets.get(name);
        let found = match version {
            None => current.cloned(),
            Some(v) => {
                let by_version = self.inner.by_version.read().unwrap_or_else(|p| p.into_inner());
                by_version.get(&v).filter(|d| d.name == name).cloned()
            }
        };
        if found.is_none()
            && current.is_none()
            && let Some(reason) = self.inner.failed.get(name)
        {
            return Err(FetchError::DatasetFailed { dataset: name.to_string(), reason: reason.clone() });
        }
        let advice = self.mapping_advice();
        found.map(|d| DatasetInfo { mapping_budget_bytes: advice, ..d.info() }).ok_or_else(|| FetchError::NotServed {
            dataset: name.to_string(),
            version,
            current: current.map(|d| d.version),
            served: datasets.keys().cloned().collect(),
        })
    }

    /// Serves the dataset version `manifest` describes under `name` from now
    /// on (the versions served before stay servable), reading nothing yet:
    /// each file's footer is read when a shard of it is first converted. A
    /// cluster node calls this with the coordinator's manifest. Returns the
    /// version.
    pub fn serve_manifest(
        &self,
        name: &str,
        view: granary_proto::View,
        manifest: granary_proto::Manifest,
    ) -> Result<DatasetVersion, OpenError> {
        let ds = self.open_manifest(name, view, manifest)?;
        Ok(self.publish(name, ds))
    }

    /// The dataset `manifest` describes, read through this node's remote
    /// options, throttle and counters; reads nothing yet.
    pub(super) fn open_manifest(
        &self,
        name: &str,
        view: granary_proto::View,
        manifest: granary_proto::Manifest,
    ) -> Result<Arc<Dataset>, OpenError> {
        let remote = Remote::open(
            &manifest.source,
            &self.inner.remote_options,
            self.inner.throttle.clone(),
            self.inner.remote.clone(),
        )?;
        Ok(Arc::new(Dataset::from_manifest(name, remote, view, manifest)?))
    }

    pub(super) fn publish(&self, name: &str, ds: Arc<Dataset>) -> DatasetVersion {
        let version = ds.version;
        tracing::info!(dataset = %name, %version, files = ds.files.len(),
            shards = ds.manifest.shards().len(), rows = ds.manifest.total_rows(), "serving dataset");
        self.inner.by_version.write().unwrap_or_else(|p| p.into_inner()).entry(version).or_insert_with(|| ds.clone());
        self.inner.datasets.write().unwrap_or_else(|p| p.into_inner()).insert(name.to_string(), ds);
        version
    }

    /// The dataset of `version`.
    pub fn dataset(&self, version: DatasetVersion) -> Result<Arc<Dataset>, FetchError> {
        let by_version = self.inner.by_version.read().unwrap_or_else(|p| p.into_inner());
        by_version.get(&version).cloned().ok_or_else(|| FetchError::UnknownVersion(version))
    }
}
