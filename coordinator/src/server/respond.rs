//! Bounds on what API requests may hold on a voter: requests in flight per
//! certificate identity, and the bytes of answers not yet delivered.
//!
//! A client that sends requests and never reads the answers (or sets its
//! stream window to a few bytes) would otherwise pin every encoded answer
//! (a manifest is up to 3 MiB) in a task waiting to write it: 256 streams
//! on each of 512 trainer connections. So:
//!
//! - One identity (a certificate's role and the id it is bound to:
//!   `node-3`, `coordinator-2`, `trainer`, `admin`) has at most
//!   [`MAX_REQUESTS_PER_IDENTITY`] requests in flight, from its reading to
//!   its answer delivered, and all identities together
//!   [`MAX_REQUESTS_IN_FLIGHT`]; more are answered "unavailable" at once,
//!   naming the identity and the limit (clients retry unavailable answers).
//! - Answers that can be large (status, listings, descriptions) are built
//!   [`MAX_ANSWERS_BUILDING`] at a time, each until its bytes have a place
//!   in the byte budget: a flood of them waits holding its request only,
//!   not its answer. (Without it, 512 unread status answers of 150 KB grew
//!   the voter by 147 MiB with a 2 MiB budget: the answers waiting for the
//!   budget were already built.)
//! - Answers larger than [`SMALL_ANSWER_BYTES`] take their size from one
//!   byte budget (`response_budget_bytes`, default 256 MiB) until the
//!   client has acknowledged them; an answer that finds no room within
//!   [`BUDGET_WAIT`] is replaced by a short "unavailable". Small answers
//!   (heartbeats, registrations, refusals) take none, so leases never wait
//!   behind large answers.
//! - A placement watch's frame is charged once, however many watchers it
//!   is written to (quinn sends slices of one buffer, no copy per
//!   watcher), until the last of them has acknowledged it
//!   ([`Responses::charged`]).
//! - An answer not delivered within `response_write_wait` (default 30 s)
//!   is abandoned: its stream is reset, and its bytes are freed.
//!
//! The decisions (the identity's key, the units an answer takes) are pure
//! and unit-tested; [`Responses::send`] is the shell.

use bytes::Bytes;
use granary_net::api::{ApiRequest, ApiResponse, FailureKind};
use granary_net::frame::{self, StreamError};
use granary_net::tls::Role;
use granary_proto::NodeId;
use granary_proto::frame::FrameError;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Requests one certificate identity may have in flight at once.
pub const MAX_REQUESTS_PER_IDENTITY: usize = 32;
/// Requests in flight at once, all identities together.
pub const MAX_REQUESTS_IN_FLIGHT: usize = 8192;
/// Answers up to this size take nothing from the byte budget.
pub const SMALL_ANSWER_BYTES: usize = 4 << 10;
/// Answers that can be large built at once ([`builds_large_answer`]).
pub const MAX_ANSWERS_BUILDING: usize = 16;
/// How long a large answer waits for room in the byte budget (and a
/// request that can have one for its turn to be built).
pub const BUDGET_WAIT: Duration = Duration::from_secs(10);
/// The byte budget's unit.
const UNIT: usize = 1 << 10;

/// The identity a certificate speaks as, for the per-identity limit: its
/// role and the node or voter id it is bound to, if any.
pub(super) fn identity_key(role: Role, node: Option<NodeId>, voter: Option<u64>) -> String {
    match (node, voter) {
        (Some(n), _) => format!("{role}-{}", n.0),
        (None, Some(v)) => format!("{role}-{v}"),
        (None, None) => role.to_string(),
    }
}

/// Whether `req`'s answer is built from the state and can be large (a
/// listing, a manifest, every node's status): such answers are built
/// [`MAX_ANSWERS_BUILDING`] at a time. A node's registrations and
/// heartbeats, and admin writes, are not held up by them.
pub(super) fn builds_large_answer(req: &ApiRequest) -> bool {
    matches!(
        req,
        ApiRequest::ListDatasets
            | ApiRequest::DescribeDataset { .. }
            | ApiRequest::ManifestPiece { .. }
            | ApiRequest::DescribePlacement { .. }
            | ApiRequest::Status
    )
}

/// Why an answer to `what` is not sent: it passed the frame cap (`cap`
/// bytes; building stopped at `len`), and where to ask instead.
pub(super) fn too_large(what: &str, len: usize, cap: usize) -> String {
    let instead = match what {
        "describe-dataset" => {
            "; its summary is in `granary dataset ls`, and nodes fetch the manifest in pieces (ManifestPiece)"
        }
        _ => "",
    };
    format!("the answer to {what} passes the {} MiB frame cap (stopped at {len} bytes){instead}", cap >> 20)
}

/// Units of the byte budget an answer of `len` bytes takes: none when
/// small, else its KiB, at most the whole budget (`total` units), so an
/// answer larger than the budget waits for all of it.
pub(super) fn units_for(len: usize, total: u32) -> u32 {
    if len <= SMALL_ANSWER_BYTES {
        return 0;
    }
    u32::try_from(len.div_ceil(UNIT)).unwrap_or(u32::MAX).clamp(1, total.max(1))
}

/// Encoded bytes and their room in the byte budget, freed together when
/// the last [`Bytes`] made from them drops.
struct Charged {
    bytes: Vec<u8>,
    _room: Option<OwnedSemaphorePermit>,
}

impl AsRef<[u8]> for Charged {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

/// The byte budget of answers in flight and the write deadline.
pub(super) struct Responses {
    budget: Arc<Semaphore>,
    building: Arc<Semaphore>,
    total: u32,
    write_wait: Duration,
}

impl Responses {
    /// A budget of `budget_bytes` (at least one unit) and a deadline of
    /// `write_wait` for each answer.
    pub(super) fn new(budget_bytes: u64, write_wait: Duration) -> Self {
        let total = u32::try_from((budget_bytes / UNIT as u64).max(1)).unwrap_or(u32::MAX >> 3);
        let building = Arc::new(Semaphore::new(MAX_ANSWERS_BUILDING));
        Self { budget: Arc::new(Semaphore::new(total as usize)), building, total, write_wait }
    }

    /// A turn to build an answer that can be large, or an answer saying
    /// none came within [`BUDGET_WAIT`].
    pub(super) async fn turn_to_build(&self) -> Result<OwnedSemaphorePermit, ApiResponse> {
        match tokio::time::timeout(BUDGET_WAIT, self.building.clone().acquire_owned()).await {
            Ok(Ok(p)) => Ok(p),
            _ => Err(ApiResponse::Failed {
                kind: FailureKind::Unavailable,
                message: format!(
                    "{MAX_ANSWERS_BUILDING} large answers are being built or wait for room among the answers in \
                     flight; try again"
                ),
            }),
        }
    }

    /// Bytes of large answers written and not yet acknowledged.
    pub(super) fn bytes_in_flight(&self) -> u64 {
        (self.total as u64 - self.budget.available_permits() as u64) * UNIT as u64
    }

    /// The budget in bytes.
    pub(super) fn budget_bytes(&self) -> u64 {
        self.total as u64 * UNIT as u64
    }

    /// Writes `resp` on `send` and waits until the client has it, within
    /// the budget and the deadline (see the module doc); `turn` (the turn
    /// it was built in, if any) is given back once its bytes have a place
    /// in the budget. `what` names the request in logs.
    pub(super) async fn send(
        &self,
        send: &mut quinn::SendStream,
        resp: ApiResponse,
        turn: Option<OwnedSemaphorePermit>,
        what: &str,
        peer: std::net::SocketAddr,
    ) -> Result<(), StreamError> {
        let bytes = match frame::encode_frame(&resp) {
            Ok(b) => b,
            // Built up to the cap and no further: the client gets why,
            // not a stream that ends without an answer.
            Err(StreamError::Frame(FrameError::TooLarge { len, cap })) => {
                drop((resp, turn));
                tracing::warn!(%peer, request = what, cap, "refusing an answer that passes the frame cap");
                let refused = ApiResponse::Failed { kind: FailureKind::BadRequest, message: too_large(what, len, cap) };
                return self.deliver(send, frame::encode_frame(&refused)?, what, peer).await;
            }
            Err(e) => return Err(e),
        };
        drop(resp);
        let Some(_taken) = self.room(bytes.len()).await else {
            tracing::warn!(%peer, request = what, bytes = bytes.len(),
                "answering unavailable: answers not yet read by their clients fill the response budget");
            let busy = ApiResponse::Failed {
                kind: FailureKind::Unavailable,
                message: format!(
                    "the coordinator's {} MiB of answers in flight are taken by answers clients have not read; \
                     try again",
                    self.budget_bytes() >> 20
                ),
            };
            drop((bytes, turn));
            return self.deliver(send, frame::encode_frame(&busy)?, what, peer).await;
        };
        drop(turn);
        self.deliver(send, bytes, what, peer).await
    }

    /// Room in the budget for an answer of `len` bytes, held until the
    /// result drops (`Some(None)`: a small answer takes none); `None` when
    /// none came within [`BUDGET_WAIT`].
    async fn room(&self, len: usize) -> Option<Option<OwnedSemaphorePermit>> {
        let units = units_for(len, self.total);
        if units == 0 {
            return Some(None);
        }
        match tokio::time::timeout(BUDGET_WAIT, self.budget.clone().acquire_many_owned(units)).await {
            Ok(Ok(p)) => Some(Some(p)),
            _ => None,
        }
    }

    /// Writes one view of the placement watch (the stream stays open):
    /// false when it was not written (no room in the budget within
    /// [`BUDGET_WAIT`], or not taken within the write deadline, when the
    /// stream is reset) and the watch should end; the watcher opens it
    /// again.
    pub(super) async fn send_view(
        &self,
        send: &mut quinn::SendStream,
        resp: &ApiResponse,
        peer: std::net::SocketAddr,
    ) -> Result<bool, StreamError> {
        let bytes = frame::encode_frame(resp)?;
        let len = bytes.len();
        match self.charged(bytes, BUDGET_WAIT).await {
            Some(charged) => self.send_shared(send, charged, peer).await,
            None => {
                tracing::warn!(%peer, bytes = len, "ending a placement watch: no room for its view");
                let _ = send.reset(1u32.into());
                Ok(false)
            }
        }
    }

    /// `bytes` charged to the byte budget (waiting at most `wait` for
    /// room) until the last copy of the returned [`Bytes`] is dropped:
    /// quinn keeps slices of what it sends until the client acknowledges
    /// them, so a frame written to a thousand watchers is counted once, for
    /// as long as any of them has not acknowledged it. `None`: no room came.
    pub(super) async fn charged(&self, bytes: Vec<u8>, wait: Duration) -> Option<Bytes> {
        let units = units_for(bytes.len(), self.total);
        let room = match units {
            0 => None,
            _ => match tokio::time::timeout(wait, self.budget.clone().acquire_many_owned(units)).await {
                Ok(Ok(p)) => Some(p),
                _ => return None,
            },
        };
        Some(Bytes::from_owner(Charged { bytes, _room: room }))
    }

    /// Writes a frame of the placement watch already encoded and charged
    /// ([`Responses::charged`]; one encoding is written to many watchers,
    /// without a copy): false when the client did not take it within the
    /// write deadline (the stream is then reset) and the watch should end.
    pub(super) async fn send_shared(
        &self,
        send: &mut quinn::SendStream,
        bytes: Bytes,
        peer: std::net::SocketAddr,
    ) -> Result<bool, StreamError> {
        match tokio::time::timeout(self.write_wait, send.write_chunk(bytes)).await {
            Ok(written) => written.map(|()| true).map_err(StreamError::Write),
            Err(_) => {
                tracing::warn!(%peer, wait = ?self.write_wait,
                    "ending a placement watch whose client did not take a view within the write deadline");
                let _ = send.reset(1u32.into());
                Ok(false)
            }
        }
    }

    /// Writes `bytes`, finishes the stream and waits for the client's
    /// acknowledgement, or resets the stream at the deadline.
    async fn deliver(
        &self,
        send: &mut quinn::SendStream,
        bytes: Vec<u8>,
        what: &str,
        peer: std::net::SocketAddr,
    ) -> Result<(), StreamError> {
        let written = tokio::time::timeout(self.write_wait, async {
            send.write_all(&bytes).await.map_err(StreamError::Write)?;
            drop(bytes);
            let _ = send.finish();
            let _ = send.stopped().await;
            Ok(())
        })
        .await;
        match written {
            Ok(result) => result,
            Err(_) => {
                tracing::warn!(%peer, request = what, wait = ?self.write_wait,
                    "abandoning an answer its client did not take within the write deadline");
                let _ = send.reset(1u32.into());
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_is_the_role_and_the_id_it_is_bound_to() {
        assert_eq!(identity_key(Role::Node, Some(NodeId(3)), None), "node-3");
        assert_eq!(identity_key(Role::Coordinator, None, Some(2)), "coordinator-2");
        assert_eq!(identity_key(Role::Trainer, None, None), "trainer");
        assert_eq!(identity_key(Role::Node, None, None), "node", "unbound node certificates share one identity");
    }

    #[test]
    fn only_answers_built_from_the_state_wait_for_a_turn() {
        assert!(builds_large_answer(&ApiRequest::Status));
        let m = too_large("describe-dataset", 64 << 20, 64 << 20);
        assert!(m.contains("64 MiB frame cap") && m.contains("ManifestPiece") && m.contains("dataset ls"), "{m}");
        assert!(!too_large("status", 1, 64 << 20).contains("ManifestPiece"));
        assert!(builds_large_answer(&ApiRequest::DescribeDataset { name: "ads".into(), version: None }));
        assert!(!builds_large_answer(&ApiRequest::Heartbeat { node: NodeId(1), incarnation: 1 }));
    }

    #[test]
    fn small_answers_take_no_budget_and_large_ones_at_most_all_of_it() {
        assert_eq!(units_for(100, 1024), 0);
        assert_eq!(units_for(SMALL_ANSWER_BYTES, 1024), 0);
        assert_eq!(units_for(SMALL_ANSWER_BYTES + 1, 1024), 5);
        assert_eq!(units_for(3 << 20, 1024), 1024, "larger than the budget: all of it");
        assert_eq!(units_for(1 << 20, 0), 1);
    }

    #[tokio::test]
    async fn a_shared_frame_is_charged_once_until_its_last_copy_drops() {
        let r = Responses::new(1 << 20, Duration::from_secs(1));
        let frame = r.charged(vec![7; 100 << 10], Duration::ZERO).await.expect("room");
        // What quinn keeps of it for a thousand watchers: slices, not copies.
        let slices: Vec<Bytes> = (0..1000).map(|i| frame.slice(i..i + 1200)).collect();
        assert_eq!(r.bytes_in_flight(), 100 << 10, "counted once");
        drop(frame);
        assert_eq!(r.bytes_in_flight(), 100 << 10, "the slices still hold it");
        drop(slices);
        assert_eq!(r.bytes_in_flight(), 0, "freed with the last slice");

        let all = r.charged(vec![0; 1 << 20], Duration::ZERO).await.expect("the whole budget");
        assert!(r.charged(vec![0; 8 << 10], Duration::from_millis(10)).await.is_none(), "no room left");
        assert!(r.charged(vec![0; 100], Duration::ZERO).await.is_some(), "a small frame takes none");
        drop(all);
        assert!(r.charged(vec![0; 8 << 10], Duration::ZERO).await.is_some());
    }

    #[test]
    fn the_budget_reports_what_is_taken() {
        let r = Responses::new(1 << 20, Duration::from_secs(1));
        assert_eq!((r.budget_bytes(), r.bytes_in_flight()), (1 << 20, 0));
        let _p = r.budget.try_acquire_many(units_for(100 << 10, r.total)).expect("room");
        assert_eq!(r.bytes_in_flight(), 100 << 10);
    }
}
