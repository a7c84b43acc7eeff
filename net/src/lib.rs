//! Granary's authenticated transport, shared by the coordinator, the nodes
//! and the command-line tools.
//!
//! - [`role`]: what a certificate's holder is ([`role::Role`]).
//! - [`pki`]: the offline PKI: the cluster CA and the role certificates it
//!   signs, on disk, and what a certificate says.
//! - [`identity`]: a loaded [`identity::Identity`] and the mutual-TLS QUIC
//!   configurations it builds, which refuse any peer without a certificate
//!   of the cluster; the peer's role after the handshake.
//! - [`transport`]: keep-alive, idle timeout and stream limits of every
//!   connection, the ALPN names, binding an endpoint.
//! - [`error`]: [`error::TlsError`], the error of the four above.
//! - [`tls`]: the four above re-exported under their former paths, until
//!   the other crates move to the new ones.
//! - [`backoff`]: pauses between retries, exponential with jitter (pure).
//! - [`budget`]: a budget of things in progress, in all and per source
//!   address, pure (handshakes, metrics connections).
//! - [`conn`]: outgoing connections cached per peer, role-checked.
//! - [`frame`]: length-prefixed, size-capped JSON messages on QUIC streams.
//! - [`api`]: the coordinator's API messages.
//! - [`placement`]: the placement a watch delivers, whole then as
//!   updates (pure).
//! - [`client`]: a coordinator client that finds the leader and follows
//!   redirects.
//! - [`metrics`]: the Prometheus endpoint (`GET /metrics` over HTTP) that
//!   nodes and voters serve their registries on.
//!
//! The control plane speaks JSON (openraft's types are serde types, and these
//! messages are small and rare); the data plane keeps rkyv.

pub mod api;
pub mod backoff;
pub mod budget;
pub mod client;
pub mod conn;
pub mod error;
pub mod frame;
pub mod identity;
pub mod metrics;
pub mod pki;
pub mod placement;
pub mod process;
pub mod role;
pub mod tls;
pub mod transport;
