//! Whether a voter is ready (issue 48): what its `/readyz` answers. A
//! voter is ready when it is one of the cluster's voters and knows a
//! leader: then what it is asked is answered or forwarded. A voter that
//! is not yet in the membership, or whose group has no leader (quorum
//! lost, or an election under way), is not; nor is a leader that has not
//! heard from a quorum lately (openraft never steps such a leader down).

use crate::types::VoterId;
use std::time::Duration;

/// A voter's readiness: `own` its id, `voters` the membership's voters,
/// `leader` the leader it knows, if any; as leader, `quorum_ack` is how
/// long ago a quorum last acknowledged it, which must be within `fresh`.
/// `Ok` says what it is ready as.
pub fn voter_readiness(
    own: VoterId,
    voters: &[VoterId],
    leader: Option<VoterId>,
    quorum_ack: Option<Duration>,
    fresh: Duration,
) -> Result<String, String> {
    if !voters.contains(&own) {
        return Err(format!("voter {} is not in the cluster's membership yet", own.0));
    }
    match leader {
        Some(l) if l == own && voters.len() > 1 && quorum_ack.is_none_or(|a| a > fresh) => Err(format!(
            "voter {} leads, but no quorum of the {} voters has answered it {}",
            own.0,
            voters.len(),
            quorum_ack.map_or("yet".to_string(), |a| format!("for {} ms", a.as_millis()))
        )),
        Some(l) if l == own => Ok(format!("voter {}, the leader, of {} voters", own.0, voters.len())),
        Some(l) => Ok(format!("voter {}, following voter {}, of {} voters", own.0, l.0, voters.len())),
        None => Err(format!("voter {} knows no leader (an election is under way, or quorum is lost)", own.0)),
    }
}

/// How many more of `voters` voters may become unreachable before the
/// group loses its quorum, with `reachable` of them reachable (the leader
/// counted): negative when it has lost it.
pub fn quorum_margin(reachable: usize, voters: usize) -> i64 {
    reachable as i64 - (voters / 2 + 1) as i64
}

/// Whether a voter that last answered the leader `answered` ago (None:
/// never) is reachable: within `fresh` (half a lease, as the leader's
/// own quorum check).
pub fn reachable(answered: Option<Duration>, fresh: Duration) -> bool {
    answered.is_some_and(|a| a <= fresh)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_voter_is_ready_in_the_membership_with_a_leader() {
        let (a, b, c) = (VoterId(1), VoterId(2), VoterId(3));
        let fresh = Duration::from_millis(1_500);
        let acked = Some(Duration::from_millis(100));
        let ready = |own, leader, ack| voter_readiness(own, &[a, b, c], leader, ack, fresh);
        assert_eq!(ready(a, Some(a), acked), Ok("voter 1, the leader, of 3 voters".into()));
        assert_eq!(ready(b, Some(a), None), Ok("voter 2, following voter 1, of 3 voters".into()));
        let none = ready(b, None, None).unwrap_err();
        assert!(none.contains("knows no leader"), "{none}");
        let outside = voter_readiness(VoterId(4), &[a, b, c], Some(a), acked, fresh).unwrap_err();
        assert!(outside.contains("not in the cluster's membership"), "{outside}");
        // A leader cut off from its quorum.
        let alone = ready(a, Some(a), Some(Duration::from_millis(1_600))).unwrap_err();
        assert_eq!(alone, "voter 1 leads, but no quorum of the 3 voters has answered it for 1600 ms");
        assert!(ready(a, Some(a), None).unwrap_err().ends_with("has answered it yet"));
        // A voter alone is its own quorum.
        assert!(voter_readiness(a, &[a], Some(a), None, fresh).is_ok());
    }

    #[test]
    fn the_quorum_margin_counts_the_voters_that_may_still_fail() {
        assert_eq!(quorum_margin(3, 3), 1);
        assert_eq!(quorum_margin(2, 3), 0, "one down of three: none more may fail");
        assert_eq!(quorum_margin(1, 3), -1, "quorum lost");
        assert_eq!(quorum_margin(5, 5), 2);
        assert_eq!(quorum_margin(1, 1), 0);
        let fresh = Duration::from_millis(1_500);
        assert!(reachable(Some(Duration::from_millis(40)), fresh));
        assert!(!reachable(Some(Duration::from_millis(1_501)), fresh));
        assert!(!reachable(None, fresh), "never answered");
    }
}
