//! Protocol versions, and how two builds agree on one.
//!
//! Every wire has a version number that moves when its messages change
//! in a way an older build cannot read. A build speaks a range of them
//! ([`Speaks`]): its own and, so that a fleet can be upgraded one host at
//! a time, the one before. Two sides speak the highest version both know
//! ([`Speaks::negotiate`]); when they share none, the refusal
//! ([`Mismatch`]) names both ranges and says which side is the older one,
//! so the person reading it knows what to upgrade. Never "malformed
//! frame".
//!
//! The local socket (a trainer and the node on its host) opens with a
//! hello: eight bytes from the trainer, ten back from the node
//! ([`encode_hello`], [`decode_hello_reply`]). It is not an rkyv frame, so
//! that every build, however old or new, reads it the same way. A trainer
//! of local protocol 1 (every build before the hello) sends a frame at
//! once; its first four bytes are a frame length, which the node tells
//! from the hello's magic ([`is_hello`]): the magic read as a length is
//! larger than any frame a node accepts, so a node of protocol 1 refuses
//! a hello as an oversized frame, and a trainer of protocol 2 then knows
//! it speaks to a node of protocol 1 ([`decode_hello_reply`] says
//! [`HelloReply::Legacy`]).
//!
//! The QUIC wires (the coordinator API, Raft between voters, the peer
//! fabric) carry their version in the ALPN protocol name
//! (`granary-peer/4`): TLS picks the highest both list.

use std::fmt;

/// The versions of one wire a build speaks: every one from `oldest` to
/// `current`, both included.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Speaks {
    /// The oldest version this build still speaks.
    pub oldest: u16,
    /// The version this build was written for.
    pub current: u16,
}

impl Speaks {
    /// The highest version both sides speak, or why there is none.
    pub fn negotiate(self, theirs: Speaks) -> Result<u16, Mismatch> {
        let highest = self.current.min(theirs.current);
        if highest >= self.oldest.max(theirs.oldest) && self.oldest <= self.current && theirs.oldest <= theirs.current {
            Ok(highest)
        } else {
            Err(Mismatch { ours: self, theirs })
        }
    }

    /// Whether this build speaks `version`.
    pub fn speaks(self, version: u16) -> bool {
        (self.oldest..=self.current).contains(&version)
    }
}

impl fmt::Display for Speaks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.oldest == self.current {
            write!(f, "{}", self.current)
        } else {
            write!(f, "{} to {}", self.oldest, self.current)
        }
    }
}

/// Two sides that share no version of a wire.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Mismatch {
    /// What this side speaks.
    pub ours: Speaks,
    /// What the other side speaks.
    pub theirs: Speaks,
}

/// Which side of a [`Mismatch`] is the older build.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Older {
    /// This side: upgrade it.
    Ours,
    /// The other side: upgrade it.
    Theirs,
}

impl Mismatch {
    /// The side whose newest version is the lower one (the one to
    /// upgrade).
    pub fn older(&self) -> Older {
        if self.ours.current < self.theirs.current { Older::Ours } else { Older::Theirs }
    }
}

/// The local socket's versions in this build. 1: frames from the first
/// request on, no hello (every build before the hello). 2: a hello, then
/// the same frames. 3: chunks may be of format 3 (`crate::chunk`), which
/// name their converter; a node hands a trainer of 1 or 2 format-2 copies.
pub const LOCAL: Speaks = Speaks { oldest: 1, current: 3 };

/// The first four bytes of a hello and of its reply. Read as a frame
/// length (little-endian) they are 1,498,305,095 bytes, larger than any
/// frame a node or trainer accepts.
pub const HELLO_MAGIC: [u8; 4] = *b"GRNY";

/// Length of a trainer's hello.
pub const HELLO_LEN: usize = 8;

/// Length of the node's reply to a hello.
pub const HELLO_REPLY_LEN: usize = 10;

/// A trainer's hello: the magic, then the oldest and current version it
/// speaks (u16, little-endian).
pub fn encode_hello(speaks: Speaks) -> [u8; HELLO_LEN] {
    let mut out = [0u8; HELLO_LEN];
    out[..4].copy_from_slice(&HELLO_MAGIC);
    out[4..6].copy_from_slice(&speaks.oldest.to_le_bytes());
    out[6..8].copy_from_slice(&speaks.current.to_le_bytes());
    out
}

/// Whether the first four bytes a node reads open a hello (not a frame).
pub fn is_hello(first: [u8; 4]) -> bool {
    first == HELLO_MAGIC
}

/// What a trainer speaks, from the four bytes of its hello after the
/// magic.
pub fn decode_hello(rest: [u8; 4]) -> Speaks {
    Speaks { oldest: u16::from_le_bytes([rest[0], rest[1]]), current: u16::from_le_bytes([rest[2], rest[3]]) }
}

/// The node's answer to a hello: the magic, the version chosen (0: none,
/// the trainer's hello is refused and the connection closes), and the
/// oldest and current version the node speaks.
pub fn encode_hello_reply(chosen: Option<u16>, node: Speaks) -> [u8; HELLO_REPLY_LEN] {
    let mut out = [0u8; HELLO_REPLY_LEN];
    out[..4].copy_from_slice(&HELLO_MAGIC);
    out[4..6].copy_from_slice(&chosen.unwrap_or(0).to_le_bytes());
    out[6..8].copy_from_slice(&node.oldest.to_le_bytes());
    out[8..10].copy_from_slice(&node.current.to_le_bytes());
    out
}

/// The node's answer to a hello, as the trainer reads it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum HelloReply {
    /// Both speak `version` from here on.
    Speak {
        /// The version chosen.
        version: u16,
        /// What the node speaks.
        node: Speaks,
    },
    /// The node speaks none of the trainer's versions; it closes the
    /// connection.
    Refused {
        /// What the node speaks.
        node: Speaks,
    },
    /// Not a hello reply: a node of local protocol 1 answered the hello
    /// as an oversized frame (and closed the connection).
    Legacy,
}

/// Reads the first [`HELLO_REPLY_LEN`] bytes a node sent after a hello.
/// A chosen version the trainer did not offer is a refusal too: the node
/// does not keep the protocol.
pub fn decode_hello_reply(bytes: [u8; HELLO_REPLY_LEN], ours: Speaks) -> HelloReply {
    if bytes[..4] != HELLO_MAGIC {
        return HelloReply::Legacy;
    }
    let chosen = u16::from_le_bytes([bytes[4], bytes[5]]);
    let node =
        Speaks { oldest: u16::from_le_bytes([bytes[6], bytes[7]]), current: u16::from_le_bytes([bytes[8], bytes[9]]) };
    if chosen != 0 && ours.speaks(chosen) && node.speaks(chosen) {
        HelloReply::Speak { version: chosen, node }
    } else {
        HelloReply::Refused { node }
    }
}

/// What the node does with a connection that opened without a hello: a
/// trainer of local protocol 1. `Err` when this node no longer speaks it
/// (the mismatch, for the refusal it sends as a frame protocol 1 reads).
pub fn without_hello(node: Speaks) -> Result<u16, Mismatch> {
    node.negotiate(Speaks { oldest: 1, current: 1 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame;

    const fn s(oldest: u16, current: u16) -> Speaks {
        Speaks { oldest, current }
    }

    #[test]
    fn the_highest_version_both_speak_is_chosen() {
        assert_eq!(s(1, 2).negotiate(s(1, 2)), Ok(2));
        assert_eq!(s(2, 3).negotiate(s(1, 2)), Ok(2), "a newer side speaks the older's current");
        assert_eq!(s(1, 2).negotiate(s(2, 3)), Ok(2));
        assert_eq!(s(3, 3).negotiate(s(1, 5)), Ok(3));
    }

    #[test]
    fn two_versions_apart_is_a_mismatch_naming_the_older_side() {
        let m = s(1, 2).negotiate(s(3, 4)).unwrap_err();
        assert_eq!(m, Mismatch { ours: s(1, 2), theirs: s(3, 4) });
        assert_eq!(m.older(), Older::Ours);
        let m = s(3, 4).negotiate(s(1, 2)).unwrap_err();
        assert_eq!(m.older(), Older::Theirs);
        assert_eq!(s(1, 2).to_string(), "1 to 2");
        assert_eq!(s(4, 4).to_string(), "4");
    }

    #[test]
    fn an_empty_range_speaks_nothing() {
        assert!(s(3, 2).negotiate(s(1, 5)).is_err());
        assert!(s(1, 5).negotiate(s(3, 2)).is_err());
    }

    #[test]
    fn a_hello_is_never_a_frame_a_legacy_node_accepts() {
        let hello = encode_hello(LOCAL);
        let header: [u8; 4] = hello[..4].try_into().unwrap();
        assert!(frame::decode_len(header, crate::wire::MAX_FRAME_LEN).is_err());
        assert!(is_hello(header));
        assert_eq!(decode_hello(hello[4..].try_into().unwrap()), LOCAL);
        // Every frame length a node accepts is not the magic.
        assert!(!is_hello((crate::wire::MAX_FRAME_LEN as u32).to_le_bytes()));
    }

    #[test]
    fn replies_round_trip_and_a_legacy_frame_reads_as_legacy() {
        assert_eq!(
            decode_hello_reply(encode_hello_reply(Some(2), s(1, 2)), LOCAL),
            HelloReply::Speak { version: 2, node: s(1, 2) }
        );
        assert_eq!(decode_hello_reply(encode_hello_reply(None, s(3, 4)), LOCAL), HelloReply::Refused { node: s(3, 4) });
        // A node that picks a version the trainer did not offer keeps no
        // protocol: refused.
        assert_eq!(
            decode_hello_reply(encode_hello_reply(Some(7), s(1, 9)), LOCAL),
            HelloReply::Refused { node: s(1, 9) }
        );
        let mut legacy = [0u8; HELLO_REPLY_LEN];
        legacy[..4].copy_from_slice(&90u32.to_le_bytes());
        assert_eq!(decode_hello_reply(legacy, LOCAL), HelloReply::Legacy);
    }

    #[test]
    fn a_trainer_without_a_hello_speaks_protocol_one() {
        assert_eq!(without_hello(LOCAL), Ok(1));
        assert_eq!(without_hello(s(2, 3)).unwrap_err().older(), Older::Theirs);
    }
}
