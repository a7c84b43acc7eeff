//! [`FabricConfig`]: every time and size of the peer fabric in one place,
//! with its defaults and the relations between them checked by
//! [`FabricConfig::validate`]. In `node.toml` it is `[cluster.fabric]`,
//! times in milliseconds (`fetch_deadline_ms = 30000`); every key is
//! optional.

use granary_proto::peer::{PEER_PROGRESS_INTERVAL, PEER_STALL_TIMEOUT};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Times and sizes of the peer fabric.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FabricConfig {
    /// Bound on asking peers for one chunk: every owner tried and the waits
    /// for the placement to move the shard, together; after it the node
    /// reads remote storage itself. Default: 30 s.
    #[serde(rename = "fetch_deadline_ms", with = "millis")]
    pub fetch_deadline: Duration,
    /// How long a fetch whose owner failed (not stalled) waits for a newer
    /// placement (the owner's lease expiring moves its shards) before
    /// reading remote storage itself; never past the fetch deadline.
    /// Default: 10 s.
    #[serde(rename = "reroute_wait_ms", with = "millis")]
    pub reroute_wait: Duration,
    /// How long a node that owns a shard waits for the first answer of the
    /// node the placement handed it over from (does it hold a copy?)
    /// before reading remote storage. Once that node says it is reading the
    /// shard, its progress frames keep the ask alive as for any fetch.
    /// Default: 1 s.
    #[serde(rename = "handoff_wait_ms", with = "millis")]
    pub handoff_wait: Duration,
    /// Bound on asking a peer for a footer before reading it from remote
    /// storage; the fetch deadline when that is shorter. Default: 10 s.
    #[serde(rename = "footer_deadline_ms", with = "millis")]
    pub footer_deadline: Duration,
    /// Bound on establishing a connection to a peer. A dead peer costs
    /// about a lease anyway (its shards move only when its lease expires),
    /// so this is generous enough for a loaded host to finish a handshake:
    /// a live peer wrongly marked down makes this node read its shards
    /// itself. Default: 3 s.
    #[serde(rename = "connect_timeout_ms", with = "millis")]
    pub connect_timeout: Duration,
    /// After a peer could not be reached, fetches skip it for this long
    /// (reading elsewhere at once instead of waiting out a connect timeout
    /// per shard) until the placement moves its shards away. Default: 2 s.
    #[serde(rename = "down_for_ms", with = "millis")]
    pub down_for: Duration,
    /// Chunk fetches in flight to one peer at once; more wait (footer
    /// fetches take no slot). Default: 8.
    pub max_fetches_per_peer: usize,
    /// Chunk bytes being received from one peer at once; a fetch reserves
    /// its chunk's size (announced in the response header) before
    /// allocating the buffer, so a burst of large chunks cannot exhaust
    /// memory. Default: 256 MiB.
    pub max_inflight_bytes_per_peer: u64,
    /// An owner that sends nothing on a stream (no progress frame, no
    /// chunk byte) this long has stalled. It pairs with the *owner's*
    /// progress interval, so both keys must be the same on every node of a
    /// cluster. Default: 5 s
    /// (`granary_proto::peer::PEER_STALL_TIMEOUT`).
    #[serde(rename = "stall_timeout_ms", with = "millis")]
    pub stall_timeout: Duration,
    /// How often an owner producing an answer tells the requester it is
    /// coming; at most a fifth of the stall timeout, so a slow owner is
    /// never taken for a stalled one on a busy host. Default: 1 s
    /// (`granary_proto::peer::PEER_PROGRESS_INTERVAL`).
    #[serde(rename = "progress_interval_ms", with = "millis")]
    pub progress_interval: Duration,
    /// How long a peer may take to send its request frame once it opened a
    /// stream (QUIC keep-alives keep an idle connection open, so without it
    /// a stream that never sends would hold a task forever). Default: 10 s.
    #[serde(rename = "request_timeout_ms", with = "millis")]
    pub request_timeout: Duration,
    /// How long a requester may take to receive a response, before the
    /// per-byte allowance of [`FabricConfig::response_min_bytes_per_sec`];
    /// past it the stream is reset, so a requester that stops reading
    /// cannot pin a chunk the tier has evicted. At least the fetch
    /// deadline. Default: 60 s.
    #[serde(rename = "response_timeout_ms", with = "millis")]
    pub response_timeout: Duration,
    /// The slowest rate a requester is allowed on top of the response
    /// timeout. Default: 1 MiB/s.
    pub response_min_bytes_per_sec: u64,
    /// Retry interval for opening the coordinator's datasets after a
    /// failure. Default: 5 s.
    #[serde(rename = "open_retry_ms", with = "millis")]
    pub open_retry: Duration,
    /// Take chunks and footers from, and serve them to, peers whose node
    /// certificates name no node id. Default false: the peer at an address
    /// the placement lists must present a certificate bound to the node id
    /// listed there, so a host holding some node key cannot serve as
    /// another node, and a peer asking must present one bound to some node
    /// id, so the cap per node identity holds.
    pub allow_unbound_peers: bool,
    /// How long this node keeps holding a dataset version at the
    /// coordinator after the last trainer following it left (a rank that
    /// restarts from its checkpoint within it finds the version still
    /// placed). Default: 60 s.
    #[serde(rename = "hold_linger_ms", with = "millis")]
    pub hold_linger: Duration,
    /// The fraction of chunks fetched from peers (0.0 to 1.0) that this
    /// node also converts itself and compares byte for byte; a peer whose
    /// chunk differs is quarantined (see `fabric::verify`). Each verified
    /// chunk costs one remote read, so 0.01 checks one peer chunk in a
    /// hundred at 1% of the fabric's saving. Default: 0.0.
    pub verify_peer_chunks: super::verify::Fraction,
    /// The newest version of the peer protocol this node speaks: 5 (this
    /// build's, chunks naming their converter) or 4 (the build before's).
    /// A rolling upgrade needs no setting: a node speaks 5 with new nodes
    /// and 4 with old ones. Set 4 to keep a new build speaking as the old
    /// one until every host runs it (the old build is then one restart
    /// away), and to test a fleet of both. Default: 5.
    pub peer_protocol: u16,
}

impl FabricConfig {
    /// The ALPN names of the peer protocol versions this node speaks,
    /// newest first ([`FabricConfig::peer_protocol`]).
    pub fn peer_alpns(&self) -> &'static [&'static [u8]] {
        use granary_net::tls::{ALPN_PEER_PREVIOUS, PEER_PROTOCOLS};
        if self.peer_protocol == 4 { &[ALPN_PEER_PREVIOUS] } else { PEER_PROTOCOLS }
    }

    /// The times that bound a load's route, for the node engine.
    pub fn timing(&self) -> granary_node_core::engine::Timing {
        granary_node_core::engine::Timing {
            fetch_deadline: self.fetch_deadline,
            reroute_wait: self.reroute_wait,
            placement_wait: granary_node_core::engine::PLACEMENT_WAIT.min(self.reroute_wait),
        }
    }
}

impl Default for FabricConfig {
    fn default() -> Self {
        Self {
            fetch_deadline: Duration::from_secs(30),
            reroute_wait: Duration::from_secs(10),
            handoff_wait: Duration::from_secs(1),
            footer_deadline: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(3),
            down_for: Duration::from_secs(2),
            max_fetches_per_peer: 8,
            max_inflight_bytes_per_peer: 256 << 20,
            stall_timeout: PEER_STALL_TIMEOUT,
            progress_interval: PEER_PROGRESS_INTERVAL,
            request_timeout: Duration::from_secs(10),
            response_timeout: Duration::from_secs(60),
            response_min_bytes_per_sec: 1 << 20,
            open_retry: Duration::from_secs(5),
            allow_unbound_peers: false,
            hold_linger: Duration::from_secs(60),
            verify_peer_chunks: super::verify::Fraction(0.0),
            peer_protocol: 5,
        }
    }
}

/// A [`FabricConfig`] whose values cannot work together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FabricConfigError {
    /// A value that must be positive is zero.
    #[error("[cluster.fabric] {0} must be positive")]
    Zero(&'static str),
    /// Two values break a relation between them.
    #[error("[cluster.fabric] {relation}: {values}")]
    Relation {
        /// The relation, e.g. `stall_timeout_ms >= 5 x progress_interval_ms`.
        relation: &'static str,
        /// The values given.
        values: String,
    },
}

/// Reservation granularity of [`FabricConfig::max_inflight_bytes_per_peer`].
pub(crate) const BYTE_PERMIT: u64 = 64 << 10;

impl FabricConfig {
    /// Checks every value and the relations between them.
    pub fn validate(&self) -> Result<(), FabricConfigError> {
        let positive: [(&'static str, bool); 10] = [
            ("fetch_deadline_ms", self.fetch_deadline.is_zero()),
            ("footer_deadline_ms", self.footer_deadline.is_zero()),
            ("handoff_wait_ms", self.handoff_wait.is_zero()),
            ("connect_timeout_ms", self.connect_timeout.is_zero()),
            ("max_fetches_per_peer", self.max_fetches_per_peer == 0),
            ("stall_timeout_ms", self.stall_timeout.is_zero()),
            ("progress_interval_ms", self.progress_interval.is_zero()),
            ("request_timeout_ms", self.request_timeout.is_zero()),
            ("response_min_bytes_per_sec", self.response_min_bytes_per_sec == 0),
            ("open_retry_ms", self.open_retry.is_zero()),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, zero)| *zero) {
            return Err(FabricConfigError::Zero(name));
        }
        if !self.verify_peer_chunks.is_valid() {
            return Err(FabricConfigError::Relation {
                relation: "0.0 <= verify_peer_chunks <= 1.0",
                values: format!("{}", self.verify_peer_chunks.0),
            });
        }
        if !(4..=5).contains(&self.peer_protocol) {
            return Err(FabricConfigError::Relation {
                relation: "peer_protocol is 4 or 5 (this build speaks granary-peer/4 and /5)",
                values: format!("{}", self.peer_protocol),
            });
        }
        if self.max_inflight_bytes_per_peer < BYTE_PERMIT {
            return Err(FabricConfigError::Relation {
                relation: "max_inflight_bytes_per_peer >= 65536",
                values: format!("{}", self.max_inflight_bytes_per_peer),
            });
        }
        let relations = [
            (
                "stall_timeout_ms >= 5 x progress_interval_ms",
                self.stall_timeout >= 5 * self.progress_interval,
                (self.stall_timeout, self.progress_interval),
            ),
            (
                "response_timeout_ms >= fetch_deadline_ms",
                self.response_timeout >= self.fetch_deadline,
                (self.response_timeout, self.fetch_deadline),
            ),
        ];
        match relations.iter().find(|(_, holds, _)| !holds) {
            Some((relation, _, (a, b))) => {
                Err(FabricConfigError::Relation { relation, values: format!("{a:?} and {b:?}") })
            }
            None => Ok(()),
        }
    }

    /// How long a requester may take to receive a response of `len` bytes.
    pub fn response_timeout_for(&self, len: u64) -> Duration {
        self.response_timeout + Duration::from_secs(len / self.response_min_bytes_per_sec.max(1))
    }

    /// Byte reservation units per peer.
    pub(crate) fn byte_permits(&self) -> u64 {
        (self.max_inflight_bytes_per_peer / BYTE_PERMIT).max(1)
    }
}

/// `Duration` as integer milliseconds.
mod millis {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis().min(u128::from(u64::MAX)) as u64)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_hold_every_relation() {
        assert_eq!(FabricConfig::default().validate(), Ok(()));
    }

    #[test]
    fn each_broken_relation_is_named() {
        let broken = |f: fn(&mut FabricConfig)| {
            let mut c = FabricConfig::default();
            f(&mut c);
            c.validate().expect_err("broken").to_string()
        };
        assert!(broken(|c| c.progress_interval = Duration::from_secs(2)).contains("stall_timeout_ms >= 5 x"));
        assert!(broken(|c| c.response_timeout = Duration::from_secs(1)).contains("response_timeout_ms >="));
        assert!(broken(|c| c.max_fetches_per_peer = 0).contains("max_fetches_per_peer must be positive"));
        assert!(broken(|c| c.max_inflight_bytes_per_peer = 1).contains("max_inflight_bytes_per_peer"));
        assert!(broken(|c| c.verify_peer_chunks.0 = 1.5).contains("0.0 <= verify_peer_chunks <= 1.0: 1.5"));
    }

    #[test]
    fn toml_takes_milliseconds_and_defaults_the_rest() {
        let c: FabricConfig =
            toml::from_str("fetch_deadline_ms = 2000\nmax_fetches_per_peer = 4\nverify_peer_chunks = 0.25")
                .expect("parse");
        assert_eq!(c.verify_peer_chunks.0, 0.25);
        assert_eq!(c.fetch_deadline, Duration::from_secs(2));
        assert_eq!(c.max_fetches_per_peer, 4);
        assert_eq!(c.reroute_wait, FabricConfig::default().reroute_wait);
        assert!(toml::from_str::<FabricConfig>("fetch_deadline = 2").is_err(), "units are part of the key");
        let back: FabricConfig = toml::from_str(&toml::to_string(&c).expect("write")).expect("read back");
        assert_eq!(back, c);
    }

    #[test]
    fn the_response_timeout_grows_with_the_response() {
        let c = FabricConfig::default();
        assert_eq!(c.response_timeout_for(0), Duration::from_secs(60));
        assert_eq!(c.response_timeout_for(10 << 20), Duration::from_secs(70));
    }
}
