//! The node's Prometheus metrics ([`registry`]), served by
//! `granary_net::metrics` on the address `node.toml` names (`metrics`).
//!
//! Counters and gauges are the node's own (`granary stats`), read at each
//! scrape by a collector, so nothing is counted twice. The latency
//! histograms are observed where the work happens: a trainer's chunk
//! request (from asking to the chunk in hand), one row group read and
//! converted, and one chunk fetched from its owner. Histograms of chunk
//! requests and conversions carry the dataset's name, so their counts are
//! the per-dataset request and conversion counts.

use crate::Node;
pub use crate::timings::DatasetLabel;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};

/// Every metric of `node`, named `granary_node_*`, and the process's own
/// (`process_*`, `granary_build_info`: [`granary_net::process`]).
pub fn registry(node: &Node) -> Registry {
    let mut root = Registry::default();
    granary_net::process::register(&mut root, "node");
    let r = root.sub_registry_with_prefix("granary_node");
    let t = node.timings();
    r.register_with_unit(
        "chunk_request",
        "Trainer chunk requests, from asking to the chunk in hand, by dataset",
        Unit::Seconds,
        t.chunk_requests.clone(),
    );
    r.register_with_unit(
        "conversion",
        "Row groups read from remote storage and converted into chunks, by dataset",
        Unit::Seconds,
        t.conversions.clone(),
    );
    r.register_with_unit(
        "peer_fetch",
        "Chunks fetched from the node that owns them",
        Unit::Seconds,
        t.peer_fetches.clone(),
    );
    r.register_collector(Box::new(NodeCollector { node: node.clone() }));
    root
}

/// Reads the node's counters at each scrape.
struct NodeCollector {
    node: Node,
}

impl std::fmt::Debug for NodeCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeCollector")
    }
}

use granary_net::metrics::const_counter as counter;

/// A gauge of a count or size the node keeps unsigned.
fn gauge(enc: &mut DescriptorEncoder, name: &str, help: &str, unit: Option<&Unit>, v: u64) -> std::fmt::Result {
    granary_net::metrics::const_gauge(enc, name, help, unit, i64::try_from(v).unwrap_or(i64::MAX))
}

impl Collector for NodeCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let s = self.node.stats();
        let bytes = Some(&Unit::Bytes);
        let e = &mut enc;
        counter(e, "remote_read", "Bytes read from remote storage (footers and row groups)", bytes, s.remote_bytes)?;
        counter(e, "remote_requests", "Requests made to remote storage", None, s.remote_requests)?;
        counter(e, "remote_footers", "Parquet footers read from remote storage", None, s.remote_footers)?;
        counter(e, "peer_footers", "Parquet footers received from the peer that reads them", None, s.peer_footers)?;
        counter(e, "conversions", "Shards converted", None, s.conversions)?;
        counter(
            e,
            "chunks_reused",
            "Shards served from another dataset version's chunk of the same content (no read, no conversion)",
            None,
            self.node.chunks_reused(),
        )?;
        counter(e, "converted", "Converted bytes produced", bytes, s.converted_bytes)?;
        counter(e, "ram_hits", "Chunk requests answered from the RAM tier", None, s.ram_hits)?;
        counter(e, "ssd_hits", "Chunk requests answered from the SSD tier", None, s.ssd_hits)?;
        counter(
            e,
            "guest_hits",
            "Chunk requests answered from guest copies of other nodes' shards",
            None,
            s.guest_hits,
        )?;
        counter(e, "misses", "Chunk requests that started a load (a peer fetch or a conversion)", None, s.misses)?;
        counter(e, "joined", "Chunk requests that waited for a load already under way", None, s.joined)?;
        counter(
            e,
            "corrupt_entries",
            "SSD entries that failed validation and were read again",
            None,
            s.corrupt_entries,
        )?;
        counter(e, "prefetched", "Chunks prefetched ahead of a request", None, s.prefetched)?;
        counter(e, "peer_fetched", "Chunks fetched from their owner over the peer fabric", None, s.peer_fetched)?;
        counter(e, "peer_fetched", "Bytes of chunks fetched from their owner", bytes, s.peer_fetched_bytes)?;
        counter(e, "peer_failures", "Peer fetches that failed", None, s.peer_failures)?;
        counter(e, "peer_served", "Chunk requests from other nodes answered", None, s.peer_served)?;
        counter(
            e,
            "peer_refused",
            "Peer requests refused: the placement gives the shard to another node",
            None,
            s.peer_refused,
        )?;
        counter(
            e,
            "peer_verified",
            "Peer chunks converted here too and found the same (verify_peer_chunks)",
            None,
            s.peer_verified,
        )?;
        counter(
            e,
            "peer_mismatched",
            "Peer chunks that differed from this node's own conversion (peer quarantined)",
            None,
            s.peer_mismatched,
        )?;
        gauge(e, "peers_quarantined", "Peers quarantined for a chunk that differed", None, s.peers_quarantined)?;
        gauge(e, "chunk_memory", "Bytes of chunks held in memory files", bytes, s.chunk_memory_bytes)?;
        gauge(e, "guest", "Bytes of guest copies held", bytes, s.guest_bytes)?;
        gauge(
            e,
            "loads_in_flight",
            "Loads under way: reading and converting, fetching, or queued",
            None,
            s.loads_in_flight,
        )?;
        let depth = self.node.prefetch_in_flight();
        gauge(e, "prefetch_in_flight", "Prefetch loads under way along the ranks' plans", None, depth)?;
        let loaders = u64::from(self.node.loaders());
        gauge(e, "loaders", "Trainer loaders following a plan on this node now", None, loaders)?;
        gauge(e, "tiers_capacity", "Bytes the RAM tier and the guest area may hold", bytes, self.node.tiers_bytes())?;
        gauge(e, "load_budget", "Bytes of memory for loads in progress, now", bytes, self.node.load_budget())?;
        if let Some(m) = self.node.membership() {
            let registered = u64::from(m.since_renewal.is_some());
            gauge(e, "registered", "1 while the coordinators hold this node's registration", None, registered)?;
            if let Some(since) = m.since_renewal {
                let left = m.lease.saturating_sub(since).as_secs_f64();
                let g = ConstGauge::new(left);
                g.encode(e.encode_descriptor(
                    "lease_left",
                    "What is left of this node's lease since its last heartbeat answered",
                    Some(&Unit::Seconds),
                    g.metric_type(),
                )?)?;
            }
            gauge(e, "placement_epoch", "The placement epoch this node knows", None, m.placement_epoch)?;
        }
        let advice = self.node.mapping_advice();
        if advice != u64::MAX {
            gauge(e, "mapping_advice", "Bytes of chunk mappings each trainer is advised to keep", bytes, advice)?;
        }

        let served = self.node.served_versions();
        let current: std::collections::BTreeSet<String> = served.iter().map(|(n, _)| n.clone()).collect();
        let g = ConstGauge::new(1i64);
        let mut family = enc.encode_descriptor(
            "dataset_served",
            "Datasets this node serves (1 per dataset and version)",
            None,
            g.metric_type(),
        )?;
        for (name, version) in &served {
            #[derive(EncodeLabelSet, Debug, Clone, Hash, PartialEq, Eq)]
            struct Served {
                dataset: String,
                version: String,
            }
            g.encode(family.encode_family(&Served { dataset: name.clone(), version: version.to_string() })?)?;
        }
        let failed = self.node.failed_datasets();
        let mut family = enc.encode_descriptor(
            "dataset_failed",
            "Configured datasets this node could not open (the reason is in its log)",
            None,
            g.metric_type(),
        )?;
        for name in failed.keys().filter(|n| !current.contains(*n)) {
            g.encode(family.encode_family(&DatasetLabel { dataset: name.clone() })?)?;
        }
        Ok(())
    }
}
