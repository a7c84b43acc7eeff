//! The node's configuration file (`node.toml`).
//!
//! Every default is stated on its field. Sizes are in bytes.
//!
//! ```toml
//! socket = "/run/granary/node.sock"
//! ssd_dir = "/var/cache/granary"
//! ram_bytes = 8589934592
//! ssd_bytes = 107374182400
//!
//! [[dataset]]
//! name = "ads"
//! source = "s3://bucket/ads/"
//! view = "ads.view.toml"          # or an inline [dataset.view] table
//!
//! [remote]                        # object_store options, e.g. endpoint
//! aws_endpoint = "http://127.0.0.1:9000"
//! ```

use crate::fabric::config::{FabricConfig, FabricConfigError};
use granary_proto::View;
pub use granary_source::remote::ThrottleConfig;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A served dataset.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetConfig {
    /// Dataset name.
    pub name: String,
    /// Source URL prefix (`file://`, `s3://`, `gs://`, `http(s)://`).
    pub source: String,
    /// The view: a path to a TOML file, or an inline table.
    pub view: ViewRef,
}

/// A view given inline or by path.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum ViewRef {
    /// Path to a view TOML file, relative to the config file.
    Path(PathBuf),
    /// The view itself.
    Inline(View),
}

/// The whole node configuration.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    /// Unix socket trainers connect to, in a folder only the node's user
    /// can write. Default: `/run/granary/node.sock` for root,
    /// `$XDG_RUNTIME_DIR/granary/node.sock` for another user (never the
    /// shared temporary folder).
    #[serde(default)]
    pub socket: Option<PathBuf>,
    /// Uids admitted on the socket (checked on every connection with
    /// `SO_PEERCRED`; root always is). Default: the node's own uid.
    #[serde(default)]
    pub allow_uids: Option<Vec<u32>>,
    /// Groups admitted on the socket (a peer's effective group). Default:
    /// the node's own group.
    #[serde(default)]
    pub allow_gids: Option<Vec<u32>>,
    /// Address of the Prometheus endpoint (`GET /metrics`), for example
    /// `"127.0.0.1:9464"`. Default: none (no endpoint).
    #[serde(default)]
    pub metrics: Option<std::net::SocketAddr>,
    /// SSD tier folder. Default: none (RAM tier only).
    #[serde(default)]
    pub ssd_dir: Option<PathBuf>,
    /// RAM tier capacity. Default 4 GiB.
    #[serde(default = "default_ram")]
    pub ram_bytes: u64,
    /// SSD tier capacity, reserved on disk (`fallocate`) when the node
    /// starts; a filesystem with less free space is refused. A node.toml
    /// that sets `ssd_dir` must set it too; a config built in code
    /// defaults to 64 GiB.
    #[serde(default = "default_ssd")]
    pub ssd_bytes: u64,
    /// RAM for guest copies of chunks other nodes own (in a cluster), apart
    /// from `ram_bytes`. Default: a quarter of `ram_bytes`.
    #[serde(default)]
    pub guest_bytes: Option<u64>,
    /// Largest chunk the SSD tier stores (its block size). Default 64 MiB.
    #[serde(default = "default_block")]
    pub ssd_block_bytes: u64,
    /// Bytes of chunks prefetched ahead of each rank. Default 256 MiB.
    #[serde(default = "default_prefetch")]
    pub prefetch_bytes: u64,
    /// The most bytes a plan the node builds for a trainer's `Follow` may
    /// hold at once, for every shuffle (a batch end per batch, the largest
    /// shuffle window's rows or a block group's permutation, tables per
    /// shard: `granary_proto::plan_cost`): a plan over it is refused
    /// before planning starts, naming both. Default: 256 MiB.
    #[serde(default = "default_plan_bytes")]
    pub max_plan_bytes: u64,
    /// Replaced by `max_plan_bytes` (which bounds every shuffle); still
    /// accepted so that an older node.toml loads, and ignored with a
    /// warning at start.
    #[serde(default)]
    pub max_plan_window_rows: Option<u64>,
    /// Trainer connections the socket holds at once; at the cap the one
    /// idle the longest is closed to make room (its client reconnects), and
    /// when every one is inside a request a new one is refused. Default: 1024.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// A trainer connection that sends no request for this long is closed
    /// (its client reconnects when it next needs the node). Default: 600000
    /// (10 minutes).
    #[serde(default = "default_idle_timeout_ms")]
    pub idle_timeout_ms: u64,
    /// A reply a trainer connection does not read within this long closes
    /// it. Default: 30000.
    #[serde(default = "default_write_timeout_ms")]
    pub write_timeout_ms: u64,
    /// Shards read and converted at once. Default: 4.
    #[serde(default = "default_loads")]
    pub max_concurrent_loads: usize,
    /// Memory that loads in progress may take at once: a shard's read
    /// column chunks, its decoded Arrow arrays and the memory file being
    /// filled, estimated per shard as its compressed bytes plus twice its
    /// converted size. A load that does not fit beside the others waits;
    /// one whose estimate alone is over the budget is refused with an
    /// error naming the file, row group and both sizes (before, it could
    /// get the node OOM-killed, and then the next owner). Default: half
    /// of the memory left beside the RAM tier and the guest area, where the
    /// memory is the machine's or, when lower, the node's cgroup limit (a
    /// container's `memory.max`); at least 256 MiB.
    #[serde(default)]
    pub load_memory_bytes: Option<u64>,
    /// Trainer processes (ranks) this node expects to serve at once: the
    /// memory left beside the tiers, the load budget and the node's own
    /// (at least 64 MiB, measured as it runs) is shared among them, or
    /// among the loaders following a plan when more are connected, for the
    /// chunk mappings they keep (a trainer's kept mapping of a chunk the
    /// node evicted is still charged to the node's memory). Default: 8.
    #[serde(default = "default_max_ranks")]
    pub max_ranks: u32,
    /// The most bytes of chunk mappings each trainer keeps beyond what the
    /// node holds, sent with every dataset description (a trainer's own
    /// `mapping_cache_bytes` applies when lower). Default: the memory
    /// left beside the RAM tier, the guest area, the load budget and the
    /// node's own memory (at least 64 MiB, measured as it runs), divided by
    /// `max_ranks` or the loaders connected when more, where the memory is
    /// the machine's or, when lower, the node's cgroup limit.
    #[serde(default)]
    pub trainer_mapping_bytes: Option<u64>,
    /// Threads that convert Arrow to chunks. Default: number of cores.
    #[serde(default)]
    pub convert_threads: Option<usize>,
    /// Datasets served.
    #[serde(default, rename = "dataset")]
    pub datasets: Vec<DatasetConfig>,
    /// object_store options (`aws_endpoint`, `aws_access_key_id`, ...).
    /// The usual environment variables are read too. One option is
    /// Granary's own: `ca_file`, a PEM file of CA certificates that
    /// `s3://`, `gs://` and `http(s)://` sources trust besides the
    /// system's (an endpoint with a private CA).
    #[serde(default)]
    pub remote: BTreeMap<String, String>,
    /// Simulated remote conditions. Default: none.
    #[serde(default)]
    pub throttle: Option<ThrottleConfig>,
    /// Cluster membership. Default: none (a standalone node).
    #[serde(default)]
    pub cluster: Option<ClusterConfig>,
}

/// How a node joins the cluster.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// Coordinator addresses (`host:port`); any voter will do.
    pub coordinators: Vec<String>,
    /// This node's identity folder of `granary certs init` (`hosts/node-ID/`, relative to the config file).
    pub certs: PathBuf,
    /// Certificate name in that folder. Default: `node` if the folder holds it, else the folder's one identity.
    #[serde(default)]
    pub cert_name: Option<String>,
    /// This node's id, unique in the cluster. Default: the id its
    /// certificate is bound to (`certs init --nodes N`); when both are
    /// given they must agree.
    #[serde(default)]
    pub node_id: Option<u64>,
    /// Address peers reach this node at (`host:port`).
    pub advertise: String,
    /// Address the peer endpoint binds (`host:port`), where it differs
    /// from the advertised one: `0.0.0.0:7100` behind NAT, or a port
    /// behind a relay (chaos runs). Default: the advertised address.
    #[serde(default)]
    pub listen: Option<String>,
    /// The peer fabric's times and sizes (`[cluster.fabric]`); every key
    /// is optional (see [`FabricConfig`] for the defaults).
    #[serde(default)]
    pub fabric: FabricConfig,
}

fn default_ram() -> u64 {
    4 << 30
}
fn default_ssd() -> u64 {
    64 << 30
}
fn default_block() -> u64 {
    64 << 20
}
fn default_prefetch() -> u64 {
    256 << 20
}
fn default_max_connections() -> usize {
    crate::SocketLimits::default().max_connections
}
fn default_idle_timeout_ms() -> u64 {
    crate::SocketLimits::default().idle_timeout.as_millis() as u64
}
fn default_write_timeout_ms() -> u64 {
    crate::SocketLimits::default().write_timeout.as_millis() as u64
}
fn default_plan_bytes() -> u64 {
    256 << 20
}
fn default_max_ranks() -> u32 {
    8
}

fn default_loads() -> usize {
    4
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            socket: None,
            allow_uids: None,
            allow_gids: None,
            metrics: None,
            ssd_dir: None,
            ram_bytes: default_ram(),
            ssd_bytes: default_ssd(),
            guest_bytes: None,
            ssd_block_bytes: default_block(),
            prefetch_bytes: default_prefetch(),
            max_plan_bytes: default_plan_bytes(),
            max_plan_window_rows: None,
            max_connections: default_max_connections(),
            idle_timeout_ms: default_idle_timeout_ms(),
            write_timeout_ms: default_write_timeout_ms(),
            max_concurrent_loads: default_loads(),
            load_memory_bytes: None,
            max_ranks: default_max_ranks(),
            trainer_mapping_bytes: None,
            convert_threads: None,
            datasets: Vec::new(),
            remote: BTreeMap::new(),
            throttle: None,
            cluster: None,
        }
    }
}

/// The configuration file is unusable.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The file does not parse.
    #[error("{path}: {message}")]
    Parse {
        /// The path.
        path: PathBuf,
        /// Parser message, with line and column.
        message: String,
    },
    /// The view is invalid.
    #[error("dataset {dataset:?}: {source}")]
    View {
        /// Dataset name.
        dataset: String,
        /// Cause.
        source: granary_proto::ViewError,
    },
    /// `[cluster.fabric]` holds values that cannot work together.
    #[error("{path}: {source}")]
    Fabric {
        /// The path.
        path: PathBuf,
        /// Cause.
        source: FabricConfigError,
    },
}

impl NodeConfig {
    /// The local socket's limits from `max_connections`, `idle_timeout_ms`
    /// and `write_timeout_ms`.
    pub fn socket_limits(&self) -> crate::SocketLimits {
        crate::SocketLimits {
            max_connections: self.max_connections.max(1),
            idle_timeout: std::time::Duration::from_millis(self.idle_timeout_ms.max(1)),
            write_timeout: std::time::Duration::from_millis(self.write_timeout_ms.max(1)),
        }
    }

    /// Reads and parses `path`; relative view paths resolve against its folder.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
        let mut cfg: NodeConfig = toml::from_str(&text)
            .map_err(|e| ConfigError::Parse { path: path.to_path_buf(), message: e.to_string() })?;
        // The tier's space is reserved at start: never a size nobody wrote.
        let table: toml::Table = toml::from_str(&text)
            .map_err(|e| ConfigError::Parse { path: path.to_path_buf(), message: e.to_string() })?;
        if cfg.ssd_dir.is_some() && !table.contains_key("ssd_bytes") {
            return Err(ConfigError::Parse {
                path: path.to_path_buf(),
                message: "ssd_dir is set without ssd_bytes: say how much disk the SSD tier may take (for example \
                          ssd_bytes = 107374182400, 100 GiB); it is reserved when the node starts"
                    .into(),
            });
        }
        if cfg.max_connections == 0 || cfg.idle_timeout_ms == 0 || cfg.write_timeout_ms == 0 {
            return Err(ConfigError::Parse {
                path: path.to_path_buf(),
                message: "max_connections, idle_timeout_ms and write_timeout_ms must each be at least 1".into(),
            });
        }
        if let Some(rows) = cfg.max_plan_window_rows {
            tracing::warn!(path = %path.display(), rows,
                "max_plan_window_rows is replaced by max_plan_bytes (every shuffle, in bytes; default 256 MiB) and ignored");
        }
        let base = path.parent().unwrap_or(Path::new("."));
        if let Some(c) = &mut cfg.cluster {
            c.certs = base.join(&c.certs);
            c.fabric.validate().map_err(|source| ConfigError::Fabric { path: path.to_path_buf(), source })?;
        }
        for d in &mut cfg.datasets {
            if let ViewRef::Path(p) = &d.view {
                let p = base.join(p);
                d.view = ViewRef::Inline(load_view(&p)?);
            }
        }
        Ok(cfg)
    }
}

/// Reads a view TOML file.
pub fn load_view(path: &Path) -> Result<View, ConfigError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
    toml::from_str(&text).map_err(|e| ConfigError::Parse { path: path.to_path_buf(), message: e.to_string() })
}

impl DatasetConfig {
    /// The validated view (patterns expanded).
    pub fn view(&self) -> Result<View, ConfigError> {
        let ViewRef::Inline(v) = &self.view else {
            return Err(ConfigError::Parse {
                path: PathBuf::from(&self.name),
                message: "view path was not resolved; load the config with NodeConfig::load".into(),
            });
        };
        v.clone().validated().map_err(|source| ConfigError::View { dataset: self.name.clone(), source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<NodeConfig, ConfigError> {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("node.toml");
        std::fs::write(&path, text).expect("write");
        NodeConfig::load(&path)
    }

    const CLUSTER: &str = "[cluster]\ncoordinators = [\"127.0.0.1:7000\"]\ncerts = \"certs\"\nnode_id = 1\nadvertise = \"127.0.0.1:7100\"\n";

    #[test]
    fn an_ssd_dir_without_ssd_bytes_is_refused_instead_of_reserving_a_default() {
        let e = load("ssd_dir = \"/var/cache/granary\"\n").unwrap_err().to_string();
        assert!(e.contains("ssd_dir is set without ssd_bytes") && e.contains("node.toml"), "{e}");
        let cfg = load("ssd_dir = \"/var/cache/granary\"\nssd_bytes = 1073741824\n").expect("load");
        assert_eq!(cfg.ssd_bytes, 1 << 30);
        assert!(load("ram_bytes = 1073741824\n").is_ok(), "no SSD tier, no ssd_bytes needed");
    }

    #[test]
    fn cluster_fabric_is_read_in_milliseconds_and_defaults_the_rest() {
        let cfg = load(&format!("{CLUSTER}\n[cluster.fabric]\nfetch_deadline_ms = 2000\nreroute_wait_ms = 200\n"))
            .expect("load");
        let fabric = cfg.cluster.expect("cluster").fabric;
        assert_eq!(fabric.fetch_deadline, std::time::Duration::from_secs(2));
        assert_eq!(fabric.reroute_wait, std::time::Duration::from_millis(200));
        assert_eq!(fabric.max_fetches_per_peer, FabricConfig::default().max_fetches_per_peer);
        let plain = load(CLUSTER).expect("load");
        assert_eq!(plain.cluster.expect("cluster").fabric, FabricConfig::default());
    }

    #[test]
    fn a_fabric_whose_times_cannot_work_together_is_refused_at_load_naming_the_relation() {
        let err = load(&format!("{CLUSTER}\n[cluster.fabric]\nprogress_interval_ms = 2000\n")).expect_err("refused");
        let msg = err.to_string();
        assert!(matches!(err, ConfigError::Fabric { .. }), "{msg}");
        assert!(msg.contains("node.toml") && msg.contains("stall_timeout_ms >= 5 x progress_interval_ms"), "{msg}");
        let err = load(&format!("{CLUSTER}\n[cluster.fabric]\nfetch_deadline = 5\n")).expect_err("unknown key");
        assert!(err.to_string().contains("fetch_deadline"), "{err}");
    }
}
