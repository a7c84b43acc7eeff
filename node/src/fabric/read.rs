//! Reading a peer's stream: bytes into a buffer or straight into a memory
//! file, bounded by the stall clock; the request/response exchange that
//! skips progress frames; and the liveness probe asked after a stall.
//! The decisions (when a quiet stream has stalled, whether a connection
//! still answers) are the pure [`StallClock`] and [`Liveness`]; this file
//! only waits for what they say.

use super::error::{LinkFault, Stall};
use crate::shm::ChunkFile;
use granary_node_core::stall::{Liveness, StallClock, TimerFired, Verdict};
use granary_proto::frame::{self, FrameError, HEADER_LEN};
use granary_proto::peer::{MAX_PEER_FRAME_LEN, PeerRequest, PeerResponse};
use granary_proto::wire::{decode, encode};
use std::time::Duration;

/// Reading a peer's stream failed.
#[derive(Debug)]
pub(crate) enum StreamError {
    /// Nothing came on the stream for the stall timeout.
    Stalled(Stall),
    /// The stream or connection failed, or the peer broke the protocol.
    Failed(LinkFault),
}

impl From<LinkFault> for StreamError {
    fn from(fault: LinkFault) -> Self {
        Self::Failed(fault)
    }
}

impl StreamError {
    /// As a link fault, for callers that do not tell a stall apart.
    pub(crate) fn into_fault(self) -> LinkFault {
        match self {
            Self::Stalled(stall) => LinkFault::Stalled(stall),
            Self::Failed(fault) => fault,
        }
    }
}

/// Where [`read_live`] puts what it reads.
pub(crate) trait Fill {
    /// Bytes wanted in all.
    fn len(&self) -> usize;
    /// Bytes taken so far.
    fn filled(&self) -> usize;
    /// Takes what `recv` has, waiting for at least one byte; false when
    /// the stream ended first. `what` names the bytes in an error.
    async fn take(&mut self, recv: &mut quinn::RecvStream, what: &'static str) -> Result<bool, LinkFault>;
}

/// A buffer filled by copying.
pub(crate) struct Buffer<'a> {
    pub(crate) buf: &'a mut [u8],
    pub(crate) pos: usize,
}

impl Fill for Buffer<'_> {
    fn len(&self) -> usize {
        self.buf.len()
    }

    fn filled(&self) -> usize {
        self.pos
    }

    async fn take(&mut self, recv: &mut quinn::RecvStream, what: &'static str) -> Result<bool, LinkFault> {
        match recv.read(&mut self.buf[self.pos..]).await.map_err(|error| LinkFault::Read { what, error })? {
            Some(n) => {
                self.pos += n;
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

/// Pieces [`Pieces`] takes from QUIC per write into the file.
const PIECES_PER_WRITE: usize = 64;

/// A memory file filled with the pieces QUIC received, as they are (no
/// copy into memory first), as many as are there at once per write. Bytes
/// past the file's length are not taken.
pub(crate) struct Pieces<'a> {
    file: &'a mut ChunkFile,
    pieces: [bytes::Bytes; PIECES_PER_WRITE],
}

impl<'a> Pieces<'a> {
    pub(crate) fn new(file: &'a mut ChunkFile) -> Self {
        Self { file, pieces: std::array::from_fn(|_| bytes::Bytes::new()) }
    }
}

impl Fill for Pieces<'_> {
    fn len(&self) -> usize {
        self.file.len()
    }

    fn filled(&self) -> usize {
        self.file.written()
    }

    async fn take(&mut self, recv: &mut quinn::RecvStream, what: &'static str) -> Result<bool, LinkFault> {
        let Some(n) = recv.read_chunks(&mut self.pieces).await.map_err(|error| LinkFault::Read { what, error })? else {
            return Ok(false);
        };
        // What comes after the chunk's announced length is not the chunk:
        // left unwritten, as a read of exactly that length would leave it.
        let mut room = self.file.len() - self.file.written();
        for piece in &mut self.pieces[..n] {
            piece.truncate(room);
            room -= piece.len();
        }
        let len = self.file.len();
        let written =
            self.file.append(&self.pieces[..n]).map_err(|error| LinkFault::Memory { what: "writing", len, error });
        self.pieces[..n].fill(bytes::Bytes::new());
        written.map(|()| true)
    }
}

/// Fills `into` from `recv`, failing when the stream ends early or when no
/// byte arrives for `stall` (`what` names the bytes); [`StallClock`]
/// decides when a quiet period is a stall.
pub(crate) async fn read_live(
    recv: &mut quinn::RecvStream,
    into: &mut impl Fill,
    what: &'static str,
    stall: Duration,
) -> Result<(), StreamError> {
    let len = into.len();
    let mut clock = StallClock::new(tokio::time::Instant::now().into_std(), stall);
    let mut until = clock.deadline();
    while into.filled() < len {
        let reading = async {
            while into.filled() < len {
                match into.take(recv, what).await {
                    Ok(true) => clock.handle_progress(tokio::time::Instant::now().into_std()),
                    Ok(false) => return Err(LinkFault::Ended { what, got: into.filled(), len }.into()),
                    Err(fault) => return Err(fault.into()),
                }
            }
            Ok(())
        };
        match tokio::time::timeout_at(until.into(), reading).await {
            Ok(done) => return done,
            Err(_) => match clock.handle_timer(tokio::time::Instant::now().into_std()) {
                TimerFired::Rearm(next) => until = next,
                TimerFired::Stalled => {
                    return Err(StreamError::Stalled(Stall { idle: clock.timeout(), what, got: into.filled(), len }));
                }
            },
        }
    }
    Ok(())
}

/// Whether the other end of `conn` still answers, asked after a stream on
/// it stalled; [`Liveness`] decides from the connection's datagram count.
pub(crate) async fn peer_answers(conn: &quinn::Connection, keep_alive: Duration) -> bool {
    let probe = Liveness::new(tokio::time::Instant::now().into_std(), conn.stats().udp_rx.datagrams, keep_alive);
    loop {
        let closed = conn.close_reason().is_some();
        match probe.sample(tokio::time::Instant::now().into_std(), conn.stats().udp_rx.datagrams, closed) {
            Verdict::Answers => return true,
            Verdict::Silent => return false,
            Verdict::SampleIn(wait) => {
                tokio::select! {
                    _ = conn.closed() => return false,
                    _ = tokio::time::sleep(wait) => {}
                }
            }
        }
    }
}

/// Opens a stream on `conn`, sends `request` as one frame, finishes the
/// sending side and reads the response frame, skipping the owner's
/// [`PeerResponse::Working`] frames; bytes that follow the answer (a chunk,
/// a footer) are left on the returned stream. An owner that sends no
/// first frame within `first` (its first answer or progress frame), or
/// nothing for `stall` after it, has stalled.
pub(crate) async fn ask(
    conn: &quinn::Connection,
    request: &PeerRequest,
    first: Duration,
    stall: Duration,
) -> Result<(PeerResponse, quinn::RecvStream), StreamError> {
    let (mut send, mut recv) = conn.open_bi().await.map_err(LinkFault::Open)?;
    let request = peer_frame(&encode(request)).map_err(|error| LinkFault::Frame { what: "request", error })?;
    send.write_all(&request).await.map_err(LinkFault::Send)?;
    let _ = send.finish();
    let mut wait = first;
    loop {
        let mut prefix = [0u8; HEADER_LEN];
        read_live(&mut recv, &mut Buffer { buf: &mut prefix, pos: 0 }, "response header", wait).await?;
        wait = stall;
        let len = frame::decode_len(prefix, MAX_PEER_FRAME_LEN)
            .map_err(|error| LinkFault::Frame { what: "response header", error })?;
        let mut head = vec![0u8; len];
        read_live(&mut recv, &mut Buffer { buf: &mut head, pos: 0 }, "response header", stall).await?;
        match decode::<PeerResponse>(&head).map_err(LinkFault::Decode)? {
            PeerResponse::Working => continue,
            response => return Ok((response, recv)),
        }
    }
}

/// One peer frame: `body` (a message's archive from [`encode`]) behind the
/// length prefix of [`granary_proto::frame`], within [`MAX_PEER_FRAME_LEN`].
pub(crate) fn peer_frame(body: &[u8]) -> Result<Vec<u8>, FrameError> {
    frame::encode(body, MAX_PEER_FRAME_LEN)
}
