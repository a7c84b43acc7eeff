//! In-process mode: a node embedded in the trainer's process.
//!
//! [`EmbeddedNode`] runs a [`Node`] on its own tokio runtime and implements
//! the client's [`ChunkSource`], so a single-process job (or a test) uses the
//! same loader, plan and batch assembly as a trainer talking to a daemon,
//! minus the socket.

use crate::config::NodeConfig;
use crate::error::FetchError;
use crate::service::{Node, StartError};
use crate::session::Session;
use crate::shm::SealedChunk;
use granary_client::{Chunk, ChunkBytes, ChunkSource, ClientError};
use granary_proto::chunk::Verify;
use granary_proto::wire::DatasetInfo;
use granary_proto::{DatasetVersion, ShardId, Walk};
use std::sync::{Arc, Mutex};

/// A node running inside this process.
pub struct EmbeddedNode {
    runtime: tokio::runtime::Runtime,
    node: Node,
    session: Mutex<Session>,
}

struct Held(Arc<SealedChunk>);

impl ChunkBytes for Held {
    fn bytes(&self) -> &[u8] {
        self.0.bytes()
    }
}

fn node_err(e: impl std::fmt::Display, kind: granary_proto::wire::ErrorKind) -> ClientError {
    ClientError::Node { kind, message: e.to_string() }
}

impl EmbeddedNode {
    /// Starts a node with `cfg` on a runtime of `threads` worker threads.
    pub fn start(cfg: &NodeConfig, threads: usize) -> Result<Self, StartError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("granary-node")
            .enable_all()
            .build()
            .map_err(StartError::Runtime)?;
        let node = runtime.block_on(Node::start(cfg))?;
        Ok(Self { runtime, session: Mutex::new(Session::new(node.clone())), node })
    }

    /// What `granary doctor` reads from a daemon, in-process: the node's
    /// stage clocks and the clocks its loaders reported. Two snapshots a
    /// few seconds apart go to `granary_proto::doctor::diagnose`.
    pub fn doctor_snapshot(&self) -> granary_proto::doctor::DoctorSnapshot {
        self.node.doctor_snapshot()
    }

    /// The node.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// Runs a future on the node's runtime.
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.runtime.block_on(f)
    }
}

impl ChunkSource for EmbeddedNode {
    fn report(&self, report: &granary_proto::doctor::RankReport) -> Result<bool, ClientError> {
        // The one in-process client's slot: no connection ever has this id.
        self.node.report(u64::MAX, report.clone());
        Ok(true)
    }

    fn describe(&self, dataset: &str, version: Option<DatasetVersion>) -> Result<DatasetInfo, ClientError> {
        self.node.describe(dataset, version).map_err(|e| match e {
            FetchError::NotServed { dataset, version: Some(version), current: Some(current), .. } => {
                ClientError::VersionGone { dataset, version, current: Some(current) }
            }
            FetchError::NotServed { dataset, served, .. } => ClientError::UnknownDataset { dataset, served },
            e => node_err(&e, e.kind()),
        })
    }

    fn follow(&self, version: DatasetVersion, walk: &Walk) -> Result<(), ClientError> {
        let _guard = self.runtime.enter();
        let f = self.node.follow(version, walk).map_err(|e| node_err(&e, e.kind()))?;
        self.session.lock().unwrap_or_else(|p| p.into_inner()).follow(f);
        Ok(())
    }

    fn fetch(&self, version: DatasetVersion, shard: ShardId) -> Result<Chunk, ClientError> {
        {
            let _guard = self.runtime.enter();
            self.session.lock().unwrap_or_else(|p| p.into_inner()).touch(shard);
        }
        let chunk = self.runtime.block_on(self.node.chunk(version, shard)).map_err(|e| node_err(&e, e.kind()))?;
        // The node validated the payload when it produced or loaded the
        // chunk, and the memory file is sealed since.
        Chunk::new(Arc::new(Held(chunk)), version, shard, Verify::HeaderOnly)
    }
}
