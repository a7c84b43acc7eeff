//! Checking what peers send, as pure decisions (no I/O, no clock).
//!
//! A chunk from another node passes the fabric's checks (length from the
//! manifest, header, payload checksum, dataset version and shard) but a
//! node holding a valid certificate can still send well-formed wrong
//! values: the checksum is the sender's. So:
//!
//! - A chunk fetched from a peer is a **guest copy** until verified: RAM
//!   only, never on SSD, first to go. That holds for a shard the
//!   placement handed over from a former owner too: only this node's own
//!   conversion, or a verification, makes a chunk its own.
//! - A sampled fraction ([`FabricConfig::verify_peer_chunks`], 0.0 to 1.0;
//!   default 0) of the chunks fetched from peers is converted here as well
//!   (footer read from remote storage, never from a peer) and compared byte
//!   for byte ([`compare`]; conversion is deterministic), in one chunk
//!   format, and only when one set of converter rules made both: a chunk
//!   of another build's rules is [`Verdict::Unlike`], served from this
//!   node's own conversion and held against no one. The draw is
//!   keyed by a secret of this process ([`Sampler`]), so a peer cannot
//!   tell which of its chunks will be checked.
//! - A chunk that differs is never served: this node's own conversion is.
//!   The peer is **quarantined** ([`Quarantine`]) for the life of this
//!   process: it is asked for no chunk, handoff or footer again (its
//!   shards are read here), and every guest copy is dropped, since any of
//!   them may have come from it.
//!
//! [`FabricConfig::verify_peer_chunks`]: super::FabricConfig::verify_peer_chunks

use granary_proto::{DatasetVersion, NodeId, ShardId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hash, Hasher};

/// A fraction between 0.0 and 1.0 (the fraction of peer chunks verified).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Fraction(pub f64);

// A fraction that passed `FabricConfig::validate` is finite, so equality is
// an equivalence.
impl Eq for Fraction {}

impl Fraction {
    /// Whether this is a number from 0.0 to 1.0.
    pub fn is_valid(self) -> bool {
        (0.0..=1.0).contains(&self.0)
    }
}

/// Decides which peer chunks are verified: a keyed draw per fetch, so the
/// same shard fetched again is drawn again, and a peer that does not know
/// the key cannot predict the draw.
#[derive(Debug, Clone)]
pub struct Sampler {
    fraction: f64,
    key: u64,
}

impl Sampler {
    /// Verifies `fraction` of the chunks, drawn under `key`.
    pub fn new(fraction: Fraction, key: u64) -> Self {
        Self { fraction: fraction.0, key }
    }

    /// A sampler keyed by this process's randomness (std's `RandomState`).
    pub fn random(fraction: Fraction) -> Self {
        Self::new(fraction, std::collections::hash_map::RandomState::new().hash_one(0x9e37_79b9_u64))
    }

    /// Whether the `nth` chunk fetched from peers, of `shard` of `version`,
    /// is verified.
    pub fn sampled(&self, version: DatasetVersion, shard: ShardId, nth: u64) -> bool {
        if self.fraction <= 0.0 {
            return false;
        }
        if self.fraction >= 1.0 {
            return true;
        }
        let mut h = std::hash::DefaultHasher::new();
        (self.key, version, shard, nth).hash(&mut h);
        // The top 53 bits as a uniform number in [0, 1).
        ((h.finish() >> 11) as f64 / (1u64 << 53) as f64) < self.fraction
    }
}

/// A peer's chunk against this node's own conversion of the same shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Byte for byte the same.
    Same,
    /// The chunks differ; `at` is the first byte that does (the shorter
    /// length when one is a prefix of the other).
    Differs {
        /// Offset of the first differing byte.
        at: usize,
    },
    /// Other converter rules made the peer's chunk
    /// ([`granary_proto::chunk::CONVERTER_VERSION`]): a build of another
    /// version, whose bytes may rightly differ.
    Unlike {
        /// The rules that made the peer's chunk.
        peer: u16,
        /// This build's.
        own: u16,
    },
}

/// Compares a peer's chunk with this node's conversion of the same shard:
/// like with like, in the peer's chunk format (a format-2 chunk from a
/// build before against this node's own written in format 2), and only
/// when one set of converter rules made both.
pub fn compare(peer: &[u8], own: &[u8]) -> Verdict {
    use granary_proto::ChunkView;
    use granary_proto::chunk::{FORMAT_2_CONVERTER, Verify};
    if peer == own {
        return Verdict::Same;
    }
    let (Ok(p), Ok(o)) = (ChunkView::parse(peer, Verify::HeaderOnly), ChunkView::parse(own, Verify::HeaderOnly)) else {
        return bytewise(peer, own);
    };
    let rules = |v: &ChunkView| v.converter().unwrap_or(FORMAT_2_CONVERTER);
    if rules(&p) != rules(&o) {
        return Verdict::Unlike { peer: rules(&p), own: rules(&o) };
    }
    if p.format() != o.format() && peer.len() == own.len() {
        let mut own_as_peer = vec![0u8; own.len()];
        if o.write_format(p.format(), &mut own_as_peer).is_ok() {
            return bytewise(peer, &own_as_peer);
        }
    }
    bytewise(peer, own)
}

fn bytewise(peer: &[u8], own: &[u8]) -> Verdict {
    if peer == own {
        return Verdict::Same;
    }
    let at = peer.iter().zip(own).position(|(a, b)| a != b).unwrap_or(peer.len().min(own.len()));
    Verdict::Differs { at }
}

/// Why a peer was quarantined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quarantined {
    /// The dataset version of the chunk that differed.
    pub version: DatasetVersion,
    /// Its shard.
    pub shard: ShardId,
    /// The first byte that differed.
    pub at: usize,
}

/// Peers whose chunks differed from this node's own conversion: never
/// asked again while this process runs.
#[derive(Debug, Clone, Default)]
pub struct Quarantine {
    peers: BTreeMap<NodeId, Quarantined>,
}

impl Quarantine {
    /// Quarantines `peer`; true when it was not already (the first
    /// mismatch is the one kept).
    pub fn add(&mut self, peer: NodeId, why: Quarantined) -> bool {
        match self.peers.entry(peer) {
            std::collections::btree_map::Entry::Occupied(_) => false,
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(why);
                true
            }
        }
    }

    /// Whether `peer` is quarantined.
    pub fn contains(&self, peer: NodeId) -> bool {
        self.peers.contains_key(&peer)
    }

    /// Peers quarantined.
    pub fn len(&self) -> usize {
        self.peers.len()
    }

    /// Whether no peer is quarantined.
    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }

    /// Every quarantined peer with the mismatch that put it there.
    pub fn iter(&self) -> impl Iterator<Item = (NodeId, &Quarantined)> {
        self.peers.iter().map(|(n, q)| (*n, q))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(i: u32) -> ShardId {
        ShardId { file: 0, row_group: i }
    }

    #[test]
    fn none_and_all_are_exact_and_a_fraction_is_near_its_share() {
        let v = DatasetVersion([7; 16]);
        let none = Sampler::new(Fraction(0.0), 1);
        let all = Sampler::new(Fraction(1.0), 1);
        assert!((0..1000).all(|i| !none.sampled(v, shard(i), 0) && all.sampled(v, shard(i), 0)));
        let tenth = Sampler::new(Fraction(0.1), 42);
        let n = (0..20_000).filter(|&i| tenth.sampled(v, shard(i), 0)).count();
        assert!((1_700..2_300).contains(&n), "{n} of 20,000 drawn at 0.1");
    }

    #[test]
    fn the_draw_depends_on_the_key_and_is_drawn_again_per_fetch() {
        let v = DatasetVersion([7; 16]);
        let (a, b) = (Sampler::new(Fraction(0.5), 1), Sampler::new(Fraction(0.5), 2));
        let drawn = |s: &Sampler, nth| (0..256).map(|i| s.sampled(v, shard(i), nth)).collect::<Vec<_>>();
        assert_eq!(drawn(&a, 0), drawn(&a, 0), "pure: same key, same draw");
        assert_ne!(drawn(&a, 0), drawn(&b, 0), "another key draws other shards");
        assert_ne!(drawn(&a, 0), drawn(&a, 1), "a shard fetched again is drawn again");
    }

    #[test]
    fn a_fraction_outside_zero_to_one_is_invalid() {
        assert!(Fraction(0.0).is_valid() && Fraction(0.25).is_valid() && Fraction(1.0).is_valid());
        assert!(!Fraction(-0.1).is_valid() && !Fraction(1.5).is_valid() && !Fraction(f64::NAN).is_valid());
    }

    #[test]
    fn the_first_differing_byte_is_named() {
        assert_eq!(compare(b"abcd", b"abcd"), Verdict::Same);
        assert_eq!(compare(b"abXd", b"abcd"), Verdict::Differs { at: 2 });
        assert_eq!(compare(b"ab", b"abcd"), Verdict::Differs { at: 2 });
    }

    /// A chunk of `rows` rows of one i64 tensor, each `value`.
    fn chunk(rows: u64, value: i64) -> Vec<u8> {
        use granary_proto::{ChunkLayout, DType, TensorLayout};
        let t = [TensorLayout { name: "id".into(), dtype: DType::I64, shape: vec![], jagged: false }];
        let layout = ChunkLayout::new(DatasetVersion([1; 16]), shard(0), rows, &t).unwrap();
        let mut buf = vec![0u8; layout.total_len()];
        for v in buf[layout.tensor_range(0)].chunks_exact_mut(8) {
            v.copy_from_slice(&value.to_le_bytes());
        }
        layout.seal(&mut buf).unwrap();
        buf
    }

    fn in_format_2(chunk: &[u8]) -> Vec<u8> {
        use granary_proto::{ChunkView, chunk::Verify};
        let mut out = vec![0u8; chunk.len()];
        ChunkView::parse(chunk, Verify::Full).unwrap().write_format(2, &mut out).unwrap();
        out
    }

    #[test]
    fn a_chunk_of_the_build_before_is_compared_in_its_own_format() {
        let own = chunk(8, 7);
        assert_eq!(compare(&in_format_2(&own), &own), Verdict::Same, "the same values in format 2");
        let forged = in_format_2(&chunk(8, 9));
        assert!(matches!(compare(&forged, &own), Verdict::Differs { .. }), "other values in format 2");
        assert!(matches!(compare(&chunk(8, 9), &own), Verdict::Differs { .. }));
    }

    #[test]
    fn a_peer_is_quarantined_once_with_its_first_mismatch() {
        let mut q = Quarantine::default();
        let why = |at| Quarantined { version: DatasetVersion([1; 16]), shard: shard(0), at };
        assert!(q.add(NodeId(3), why(10)));
        assert!(!q.add(NodeId(3), why(20)), "already quarantined");
        assert!(q.contains(NodeId(3)) && !q.contains(NodeId(4)));
        assert_eq!(q.iter().next(), Some((NodeId(3), &why(10))));
        assert_eq!(q.len(), 1);
    }
}
