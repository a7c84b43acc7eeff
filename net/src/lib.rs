//! Granary's authenticated transport, shared by the coordinator, the nodes
//! and the command-line tools.
//!
//! - [`tls`]: the cluster CA, certificates that carry a [`tls::Role`], and
//!   mutual-TLS QUIC endpoint configurations that refuse any peer without a
//!   certificate of the cluster.
//! - [`conn`]: outgoing connections cached per peer, role-checked.
//! - [`frame`]: length-prefixed, size-capped JSON messages on QUIC streams.
//! - [`api`]: the coordinator's API messages.
//! - [`client`]: a coordinator client that finds the leader and follows
//!   redirects.
//!
//! The control plane speaks JSON (openraft's types are serde types, and these
//! messages are small and rare); the data plane keeps rkyv.

pub mod api;
pub mod client;
pub mod conn;
pub mod frame;
pub mod tls;
