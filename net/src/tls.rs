//! The former home of the cluster PKI, identities, roles and transport
//! settings, kept as re-exports so that `granary_net::tls::X` paths in other
//! crates keep working while they move to [`crate::role`], [`crate::pki`],
//! [`crate::identity`], [`crate::transport`] and [`crate::error`]. New code
//! should import from those; this module goes once no crate uses it
//! (issue 13).

pub use crate::error::TlsError;
pub use crate::identity::{
    Identity, ensure_default_crypto_provider, peer_node_id, peer_role, peer_voter_id, require_peer_role,
    server_endpoint,
};
pub use crate::pki::{
    ADMIN_FOLDER, CA_FOLDER, CA_NAME, HOSTS_FOLDER, SplitPlan, identities_in, identity_name, identity_paths,
    init_cluster, init_split, issue, issue_bound, issue_from, node_id_of_cert, role_of_cert, voter_id_of_cert,
};
pub use crate::role::{NODE_URI_PREFIX, ParseRoleError, ROLE_URI_PREFIX, Role, VOTER_URI_PREFIX};
pub use crate::transport::{
    ALPN_API, ALPN_PEER, ALPN_PEER_PREVIOUS, ALPN_RAFT, ALPN_RAFT_PREVIOUS, ALPN_VERSIONS, IDLE_TIMEOUT,
    KEEP_ALIVE_INTERVAL, MAX_CONCURRENT_BIDI_STREAMS, MAX_CONCURRENT_UNI_STREAMS, PEER_PROTOCOLS, RAFT_PROTOCOLS,
    VERSIONS_CLOSE, alpn_of, answer_versions, endpoint, transport_config, transport_config_with,
    transport_config_with_idle_timeout, version_refusal,
};
