//! Switches a coordinator group turns on only once every voter runs a
//! build that reads them, pure.
//!
//! A log entry that an older build cannot decode, or would apply
//! differently, may not be written while such a build votes: its replica
//! would stop, or diverge. A voter's build shows in the version of Raft
//! its connection with the leader chose (the ALPN: `granary-raft/2` or
//! `/1`, `crate::network::QuicNetwork::raft_versions`). The leader turns
//! a switch on, once, when every other voter has spoken the version that
//! carries it; a voter of the build before cannot rejoin the group after
//! that (upgrade voters first, one at a time: deploy/README.md,
//! "Upgrading").

use crate::types::VoterId;
use std::collections::BTreeMap;

/// The version of Raft whose entries include `EnableContentOwners`.
pub const CONTENT_OWNERS_RAFT: u16 = 2;

/// Whether the leader `me` should propose `EnableContentOwners`: not on
/// yet, and every other voter of `voters` has spoken Raft
/// [`CONTENT_OWNERS_RAFT`] or newer with it (`speaks`).
pub fn content_owners_due(on: bool, me: VoterId, voters: &[VoterId], speaks: &BTreeMap<VoterId, u16>) -> bool {
    !on && voters.iter().all(|v| *v == me || speaks.get(v).is_some_and(|&s| s >= CONTENT_OWNERS_RAFT))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_switch_waits_for_every_voter_to_speak_its_version() {
        let v = |i| VoterId(i);
        let voters = [v(1), v(2), v(3)];
        let speaks = |pairs: &[(u64, u16)]| pairs.iter().map(|&(i, s)| (v(i), s)).collect::<BTreeMap<_, _>>();
        assert!(content_owners_due(false, v(1), &[v(1)], &speaks(&[])), "a group of one is its own build");
        assert!(!content_owners_due(false, v(1), &voters, &speaks(&[(2, 2)])), "voter 3 not heard yet");
        assert!(!content_owners_due(false, v(1), &voters, &speaks(&[(2, 2), (3, 1)])), "voter 3 is the build before");
        assert!(content_owners_due(false, v(1), &voters, &speaks(&[(2, 2), (3, 2)])));
        assert!(!content_owners_due(true, v(1), &voters, &speaks(&[(2, 2), (3, 2)])), "once");
    }
}
