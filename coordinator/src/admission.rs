//! Which connections a voter admits once their handshake has named who
//! they are, pure: a cap in all, a cap per role, and a small cap per node
//! identity.
//!
//! A node speaks to a voter over one connection (its heartbeats, watch,
//! holds and lookups are streams on it), so a node id bound in its
//! certificate gets [`MAX_CONNECTIONS_PER_NODE`]: that one, and room for a
//! new one while a dead one's idle timer runs. The node role's cap is sized
//! for [`NODES_PLANNED`] such nodes, with a fifth more for those overlaps;
//! certificates that name no node id share the role's cap. The role caps
//! add up to less than [`MAX_CONNECTIONS`], so connections of other roles
//! never fill it for the nodes, and one role's certificates (a trainer's,
//! an admin's) cannot take the connections nodes need for their
//! heartbeats, or the voters' Raft connections.

use granary_net::tls::Role;
use granary_proto::NodeId;
use std::collections::HashMap;

/// Nodes one voter is sized to serve at once.
pub const NODES_PLANNED: usize = 10_000;

/// Connections one node identity may hold open to one voter.
pub const MAX_CONNECTIONS_PER_NODE: usize = 4;

/// Connections served at once, every role together.
pub const MAX_CONNECTIONS: usize = 16_384;

/// Connections one role's certificates may hold open at once.
pub fn role_limit(role: Role) -> usize {
    match role {
        Role::Coordinator => 64,
        Role::Node => NODES_PLANNED + NODES_PLANNED / 5,
        Role::Trainer => 512,
        Role::Admin => 128,
    }
}

/// Why a connection was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// [`MAX_CONNECTIONS`] are open.
    #[error("{0} connections are open, the most this voter serves")]
    Full(usize),
    /// The role's connections are all taken.
    #[error("{open} connections of {role} certificates are open, the most their role may hold")]
    Role {
        /// The role.
        role: Role,
        /// Its connections open.
        open: usize,
    },
    /// The node identity holds its connections already.
    #[error("{node} holds {open} connections already, the most one node may (a node needs one per voter)")]
    Node {
        /// The node.
        node: NodeId,
        /// Its connections open.
        open: usize,
    },
}

/// What [`Admission`] holds, in numbers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnectionCounts {
    /// Connections open, in all.
    pub open: usize,
    /// Of them, node certificates'.
    pub nodes: usize,
    /// Node identities (bound in their certificates) with a connection open.
    pub nodes_connected: usize,
    /// The most connections one node identity holds open (0: none).
    pub most_per_node: usize,
}

/// The connections open, by role and by node identity.
#[derive(Debug, Default)]
pub struct Admission {
    total: usize,
    by_role: [usize; 4],
    by_node: HashMap<NodeId, usize>,
}

fn role_index(role: Role) -> usize {
    match role {
        Role::Coordinator => 0,
        Role::Node => 1,
        Role::Trainer => 2,
        Role::Admin => 3,
    }
}

impl Admission {
    /// Takes a connection for `role` (and for `node`, the node id its
    /// certificate is bound to, if any), or says why not; nothing is taken
    /// on a refusal.
    pub fn admit(&mut self, role: Role, node: Option<NodeId>) -> Result<(), Refusal> {
        if self.total >= MAX_CONNECTIONS {
            return Err(Refusal::Full(self.total));
        }
        let open = self.by_role[role_index(role)];
        if open >= role_limit(role) {
            return Err(Refusal::Role { role, open });
        }
        if let Some(node) = node {
            let open = self.by_node.get(&node).copied().unwrap_or(0);
            if open >= MAX_CONNECTIONS_PER_NODE {
                return Err(Refusal::Node { node, open });
            }
            self.by_node.insert(node, open + 1);
        }
        self.by_role[role_index(role)] += 1;
        self.total += 1;
        Ok(())
    }

    /// A connection [`Admission::admit`] took ended.
    pub fn release(&mut self, role: Role, node: Option<NodeId>) {
        if let Some(node) = node
            && let Some(open) = self.by_node.get_mut(&node)
        {
            *open -= 1;
            if *open == 0 {
                self.by_node.remove(&node);
            }
        }
        let r = &mut self.by_role[role_index(role)];
        *r = r.saturating_sub(1);
        self.total = self.total.saturating_sub(1);
    }

    /// Connections open, in all.
    pub fn open(&self) -> usize {
        self.total
    }

    /// Connections open of `role`'s certificates.
    pub fn open_of(&self, role: Role) -> usize {
        self.by_role[role_index(role)]
    }

    /// Everything counted, at once.
    pub fn counts(&self) -> ConnectionCounts {
        ConnectionCounts {
            open: self.total,
            nodes: self.open_of(Role::Node),
            nodes_connected: self.nodes_connected(),
            most_per_node: self.most_per_node(),
        }
    }

    /// Node identities with a connection open.
    pub fn nodes_connected(&self) -> usize {
        self.by_node.len()
    }

    /// The most connections one node identity holds open (0: none).
    pub fn most_per_node(&self) -> usize {
        self.by_node.values().copied().max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_role_caps_fit_the_total_and_the_planned_nodes() {
        assert!(Role::ALL.iter().map(|r| role_limit(*r)).sum::<usize>() < MAX_CONNECTIONS);
        assert!(role_limit(Role::Node) >= NODES_PLANNED, "every planned node gets its one connection");
    }

    #[test]
    fn a_node_identity_gets_a_few_connections_and_others_keep_theirs() {
        let mut a = Admission::default();
        let n = Some(NodeId(7));
        for _ in 0..MAX_CONNECTIONS_PER_NODE {
            a.admit(Role::Node, n).unwrap();
        }
        assert_eq!(a.admit(Role::Node, n), Err(Refusal::Node { node: NodeId(7), open: MAX_CONNECTIONS_PER_NODE }));
        a.admit(Role::Node, Some(NodeId(8))).unwrap();
        assert_eq!((a.open(), a.nodes_connected(), a.most_per_node()), (MAX_CONNECTIONS_PER_NODE + 1, 2, 4));
        a.release(Role::Node, n);
        a.admit(Role::Node, n).unwrap();
        for _ in 0..MAX_CONNECTIONS_PER_NODE {
            a.release(Role::Node, n);
        }
        assert_eq!((a.open(), a.nodes_connected(), a.most_per_node()), (1, 1, 1));
        // Releasing what was never taken changes nothing below zero.
        a.release(Role::Admin, None);
        assert_eq!(a.open_of(Role::Admin), 0);
    }

    #[test]
    fn a_role_is_held_to_its_own_cap_and_unbound_nodes_share_the_roles() {
        let mut a = Admission::default();
        for _ in 0..role_limit(Role::Trainer) {
            a.admit(Role::Trainer, None).unwrap();
        }
        assert_eq!(a.admit(Role::Trainer, None), Err(Refusal::Role { role: Role::Trainer, open: 512 }));
        a.admit(Role::Node, Some(NodeId(1))).unwrap();
        for _ in 0..MAX_CONNECTIONS_PER_NODE + 3 {
            a.admit(Role::Node, None).unwrap();
        }
        assert_eq!(a.open_of(Role::Node), MAX_CONNECTIONS_PER_NODE + 4);
        let msg = Refusal::Node { node: NodeId(3), open: 4 }.to_string();
        assert!(msg.contains("node-3"), "{msg}");
    }

    #[test]
    fn the_planned_nodes_fit_with_one_connection_each() {
        let mut a = Admission::default();
        for n in 0..NODES_PLANNED as u64 {
            a.admit(Role::Node, Some(NodeId(n))).unwrap();
        }
        for _ in 0..role_limit(Role::Trainer) {
            a.admit(Role::Trainer, None).unwrap();
        }
        assert_eq!(a.most_per_node(), 1);
    }
}
