//! What a certificate's holder is in the cluster: a [`Role`].
//!
//! A certificate says what its holder is in a URI subject-alternative name
//! `urn:granary:role:<role>` ([`ROLE_URI_PREFIX`]); a node's certificate may
//! also be bound to one node id (`urn:granary:node:<id>`,
//! [`NODE_URI_PREFIX`]). The TLS layer only checks that a peer belongs to
//! the cluster; which roles may use which protocol is the server's decision,
//! taken after the handshake with [`crate::identity::peer_role`] or
//! [`crate::identity::require_peer_role`].

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Prefix of the URI subject-alternative name that carries a certificate's role.
pub const ROLE_URI_PREFIX: &str = "urn:granary:role:";

/// Prefix of the subject-alternative-name URI that binds a node certificate to one node id
/// (`urn:granary:node:<id>`). A bound certificate may register and heartbeat only as that node.
pub const NODE_URI_PREFIX: &str = "urn:granary:node:";

/// Prefix of the subject-alternative-name URI that binds a coordinator certificate to one voter id
/// (`urn:granary:voter:<id>`). Raft accepts a bound certificate only as that voter.
pub const VOTER_URI_PREFIX: &str = "urn:granary:voter:";

/// What a certificate's holder is in the cluster.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A coordinator: holds the cluster map, takes part in Raft.
    Coordinator,
    /// A cache node: stores and serves chunks.
    Node,
    /// A training process: reads batches.
    Trainer,
    /// An operator's command-line tool.
    Admin,
}

impl Role {
    /// Every role, in declaration order.
    pub const ALL: [Role; 4] = [Role::Coordinator, Role::Node, Role::Trainer, Role::Admin];

    /// The lowercase name: `"coordinator"`, `"node"`, `"trainer"`, `"admin"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Coordinator => "coordinator",
            Role::Node => "node",
            Role::Trainer => "trainer",
            Role::Admin => "admin",
        }
    }

    /// The DNS name in this role's certificates, which clients pass as the server name when they connect:
    /// `"granary-coordinator"`, `"granary-node"`, `"granary-trainer"`, `"granary-admin"`.
    pub fn server_name(self) -> &'static str {
        match self {
            Role::Coordinator => "granary-coordinator",
            Role::Node => "granary-node",
            Role::Trainer => "granary-trainer",
            Role::Admin => "granary-admin",
        }
    }

    /// The URI subject-alternative name that marks a certificate with this role.
    pub fn uri(self) -> String {
        format!("{ROLE_URI_PREFIX}{}", self.as_str())
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that names no [`Role`].
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[error("unknown role {input:?}: expected one of coordinator, node, trainer, admin")]
pub struct ParseRoleError {
    /// The string that was given.
    pub input: String,
}

impl FromStr for Role {
    type Err = ParseRoleError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Role::ALL.into_iter().find(|r| r.as_str() == s).ok_or_else(|| ParseRoleError { input: s.to_owned() })
    }
}

/// Formats a list of roles as "a", "a or b", "a, b or c".
pub(crate) struct RoleList<'a>(pub(crate) &'a [Role]);

impl fmt::Display for RoleList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            [] => f.write_str("no role"),
            [only] => write!(f, "{only}"),
            [init @ .., last] => {
                for (i, r) in init.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{r}")?;
                }
                write!(f, " or {last}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_names_round_trip() {
        for role in Role::ALL {
            assert_eq!(role.as_str().parse::<Role>().unwrap(), role);
            assert_eq!(role.to_string(), role.as_str());
            assert_eq!(serde_json::to_string(&role).unwrap(), format!("\"{}\"", role.as_str()));
            assert_eq!(serde_json::from_str::<Role>(&format!("\"{role}\"")).unwrap(), role);
            assert_eq!(role.server_name(), format!("granary-{role}"));
        }
        assert_eq!("Node".parse::<Role>(), Err(ParseRoleError { input: "Node".into() }));
    }

    #[test]
    fn role_list_reads_as_prose() {
        assert_eq!(RoleList(&[Role::Node]).to_string(), "node");
        assert_eq!(RoleList(&[Role::Node, Role::Admin]).to_string(), "node or admin");
        assert_eq!(RoleList(&[Role::Node, Role::Trainer, Role::Admin]).to_string(), "node, trainer or admin");
    }
}
