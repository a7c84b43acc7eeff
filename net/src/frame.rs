//! Size-capped JSON messages on QUIC streams.
//!
//! A frame is a 4-byte little-endian length followed by that many bytes of
//! JSON. The reader checks the declared length against a caller-given cap
//! before it allocates or reads the body, and grows its buffer only as bytes
//! arrive, so a peer cannot make us reserve memory it never sends. A stream
//! that ends before a frame starts is a clean end (`Ok(None)`); one that ends
//! inside a frame is [`codec::FrameError::Frame(codec::FrameError::Truncated`].
//!
//! The framing is [`granary_proto::frame`], the sans-I/O codec every Granary
//! stream shares (its cap rule, its incremental decoder); this module adds
//! JSON ([`encode_frame`], [`decode_body`]) and thin shells that move the
//! bytes over quinn streams ([`write_frame`], [`read_frame`], [`call`]).

use std::any::type_name;
use std::fmt;
use std::net::SocketAddr;

use granary_proto::frame::{self as codec, FrameBuilder, FrameDecoder};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Largest frame body anyone sends: 64 MiB. Control messages are far smaller; this only bounds a broken peer.
pub const MAX_FRAME_BYTES: usize = 64 << 20;

/// Bytes of the length prefix.
pub const LEN_PREFIX_BYTES: usize = codec::HEADER_LEN;

/// Why a frame could not be sent or received on a stream: the stream's
/// own failures, or the frame's ([`StreamError::Frame`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// Reading from the stream failed (reset by the peer, or the connection was lost).
    #[error("reading a frame: {}", Chain(.0))]
    Read(quinn::ReadError),
    /// Writing to the stream failed (stopped by the peer, or the connection was lost).
    #[error("writing a frame: {}", Chain(.0))]
    Write(quinn::WriteError),
    /// Finishing the send side of the stream failed because it was already closed.
    #[error("finishing the stream: {0}")]
    Finish(quinn::ClosedStream),
    /// The connection to the peer is gone (found while opening or finishing a request stream).
    #[error("connection to {peer} lost: {error}")]
    ConnectionLost {
        /// The peer's address.
        peer: SocketAddr,
        /// Why the connection is gone.
        error: quinn::ConnectionError,
    },
    /// The frame itself: longer than the limit (the body neither sent nor
    /// read), cut short by the stream's end, or not the JSON of the
    /// expected type (the one codec error, [`codec::FrameError`]).
    #[error(transparent)]
    Frame(#[from] codec::FrameError),
    /// A message could not be encoded as JSON (for example, a map with non-string keys).
    #[error("encoding {type_name} as JSON: {error}")]
    Encode {
        /// The Rust type of the message.
        type_name: &'static str,
        /// serde_json's error.
        error: serde_json::Error,
    },
    /// The peer finished the response stream without sending a response.
    #[error("{peer} closed the stream without a response")]
    NoResponse {
        /// The peer's address.
        peer: SocketAddr,
    },
}

/// Displays an error followed by its sources ("connection lost: aborted by peer: ..."), because quinn's stream errors
/// say only "connection lost" and keep the reason in their source.
struct Chain<'a>(&'a dyn std::error::Error);

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(err) = source {
            write!(f, ": {err}")?;
            source = err.source();
        }
        Ok(())
    }
}

impl StreamError {
    /// Whether the error means the whole connection is gone (so a retry must use a new connection), as opposed to a
    /// failure of this one stream or message.
    pub fn is_connection_lost(&self) -> bool {
        matches!(
            self,
            StreamError::ConnectionLost { .. }
                | StreamError::Read(quinn::ReadError::ConnectionLost(_))
                | StreamError::Write(quinn::WriteError::ConnectionLost(_))
        )
    }
}

/// The frame of `msg`: the 4-byte little-endian length of its JSON, then the JSON. Refuses (`TooLarge`) a body above
/// [`MAX_FRAME_BYTES`].
pub fn encode_frame<T: Serialize>(msg: &T) -> Result<Vec<u8>, StreamError> {
    encode_capped(msg, MAX_FRAME_BYTES)
}

/// [`encode_frame`] with the cap `max` (at most [`MAX_FRAME_BYTES`]), so that tests need not build 64 MiB messages.
fn encode_capped<T: Serialize>(msg: &T, max: usize) -> Result<Vec<u8>, StreamError> {
    // Stops at the cap while the JSON is written: an answer far over it
    // never takes more than the cap in memory.
    let cap = max.min(MAX_FRAME_BYTES);
    let mut frame = FrameBuilder::capped(cap);
    if let Err(error) = serde_json::to_writer(&mut frame, msg) {
        if let Some(len) = frame.over_cap() {
            return Err(codec::FrameError::TooLarge { len, cap }.into());
        }
        return Err(StreamError::Encode { type_name: type_name::<T>(), error });
    }
    Ok(frame.finish(cap)?)
}

/// The body length a prefix declares, if it is at most `max`.
pub fn decode_len(prefix: [u8; LEN_PREFIX_BYTES], max: usize) -> Result<usize, StreamError> {
    Ok(codec::decode_len(prefix, max)?)
}

/// The message in a frame body.
pub fn decode_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, StreamError> {
    serde_json::from_slice(body).map_err(|error| {
        StreamError::Frame(codec::FrameError::Malformed { expected: type_name::<T>(), reason: error.to_string() })
    })
}

/// Writes one frame holding `msg`. Refuses (`TooLarge`, before writing anything) a body above [`MAX_FRAME_BYTES`].
pub async fn write_frame<T: Serialize>(send: &mut quinn::SendStream, msg: &T) -> Result<(), StreamError> {
    let frame = encode_frame(msg)?;
    send.write_all(&frame).await.map_err(StreamError::Write)
}

/// Reads one frame and decodes it as a `T`.
///
/// Returns `Ok(None)` when the stream ends cleanly before a frame starts. A declared length above `max` is refused
/// before anything is allocated or read. Malformed JSON and a stream that ends inside a frame are errors.
pub async fn read_frame<T: DeserializeOwned>(
    recv: &mut quinn::RecvStream,
    max: usize,
) -> Result<Option<T>, StreamError> {
    Ok(read_frame_sized(recv, max).await?.map(|(msg, _)| msg))
}

/// [`read_frame`], with the frame's size on the stream (prefix included).
pub async fn read_frame_sized<T: DeserializeOwned>(
    recv: &mut quinn::RecvStream,
    max: usize,
) -> Result<Option<(T, usize)>, StreamError> {
    match read_frame_body(recv, max).await? {
        Some(body) => {
            let size = body.len() + LEN_PREFIX_BYTES;
            decode_body(&body).map(|msg| Some((msg, size)))
        }
        None => Ok(None),
    }
}

/// One frame's body of at most `max` bytes, not decoded; `Ok(None)` when
/// the stream ended between frames.
pub async fn read_frame_body(recv: &mut quinn::RecvStream, max: usize) -> Result<Option<Vec<u8>>, StreamError> {
    let mut decoder = FrameDecoder::new(max);
    loop {
        if let Some(body) = decoder.poll_frame() {
            return Ok(Some(body));
        }
        // At most what the frame still needs, so bytes after it stay on the stream.
        match recv.read_chunk(decoder.wanted(), true).await.map_err(StreamError::Read)? {
            Some(chunk) => {
                decoder.push(&chunk.bytes)?;
            }
            None => {
                decoder.finish()?;
                return Ok(None);
            }
        }
    }
}

/// One request/response exchange: opens a bidirectional stream on `conn`, writes `req`, finishes the send side, and
/// reads one response frame of at most `max` bytes. A stream that ends without a response is
/// [`StreamError::NoResponse`].
pub async fn call<Req: Serialize, Resp: DeserializeOwned>(
    conn: &quinn::Connection,
    req: &Req,
    max: usize,
) -> Result<Resp, StreamError> {
    call_until(conn, req, max, |_| false).await
}

/// [`call`], for a request answered by frames that `more` consumes (it
/// returns true: progress, say) before the one it returns false for, which
/// is the answer.
pub async fn call_until<Req: Serialize, Resp: DeserializeOwned>(
    conn: &quinn::Connection,
    req: &Req,
    max: usize,
    mut more: impl FnMut(&Resp) -> bool,
) -> Result<Resp, StreamError> {
    let peer = conn.remote_address();
    // Encode first, so an unsendable request does not open (and abandon) a stream.
    let frame = encode_frame(req)?;
    let (mut send, mut recv) = conn.open_bi().await.map_err(|error| StreamError::ConnectionLost { peer, error })?;
    send.write_all(&frame).await.map_err(StreamError::Write)?;
    // finish() fails only on a stream that is already closed; if the connection went down meanwhile, say so.
    send.finish().map_err(|closed| match conn.close_reason() {
        Some(error) => StreamError::ConnectionLost { peer, error },
        None => StreamError::Finish(closed),
    })?;
    loop {
        let resp = read_frame(&mut recv, max).await?.ok_or(StreamError::NoResponse { peer })?;
        if !more(&resp) {
            return Ok(resp);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Msg {
        id: u64,
        name: String,
        tags: Vec<String>,
    }

    #[test]
    fn encode_writes_little_endian_length_then_json() {
        let frame = encode_frame(&Msg { id: 7, name: "a".into(), tags: vec![] }).unwrap();
        let json = br#"{"id":7,"name":"a","tags":[]}"#;
        assert_eq!(&frame[..4], &(json.len() as u32).to_le_bytes());
        assert_eq!(&frame[4..], json);
    }

    #[test]
    fn decode_len_enforces_the_cap() {
        assert_eq!(decode_len(10u32.to_le_bytes(), 10).unwrap(), 10);
        assert_eq!(decode_len([0; 4], 0).unwrap(), 0);
        assert!(matches!(
            decode_len(11u32.to_le_bytes(), 10),
            Err(StreamError::Frame(codec::FrameError::TooLarge { len: 11, cap: 10 }))
        ));
        assert!(matches!(
            decode_len([0xff; 4], MAX_FRAME_BYTES),
            Err(StreamError::Frame(codec::FrameError::TooLarge { len, cap: MAX_FRAME_BYTES })) if len == u32::MAX as usize
        ));
    }

    #[test]
    fn encode_refuses_oversized_messages() {
        // The JSON of a string of n characters is n + 2 bytes.
        assert_eq!(encode_capped(&"x".repeat(98), 100).unwrap().len(), 4 + 100);
        assert!(matches!(
            encode_capped(&"x".repeat(99), 100),
            Err(StreamError::Frame(codec::FrameError::TooLarge { len: 101, cap: 100 }))
        ));
        // A message of 5 MB stops being encoded at the cap: the length
        // refused is where it stopped, not the whole.
        let big = vec!["x".repeat(50); 100_000];
        match encode_capped(&big, 100) {
            Err(StreamError::Frame(codec::FrameError::TooLarge { len, cap: 100 })) => assert!(len < 200, "{len}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn encode_reports_unencodable_messages() {
        let map = BTreeMap::from([((1u8, 2u8), 3u8)]);
        let err = encode_frame(&map).unwrap_err();
        assert!(matches!(err, StreamError::Encode { .. }), "{err}");
    }

    #[test]
    fn decode_body_names_the_expected_type() {
        let err = decode_body::<Msg>(br#"{"id":"seven"}"#).unwrap_err();
        assert!(matches!(err, StreamError::Frame(codec::FrameError::Malformed { .. })));
        assert!(err.to_string().contains("Msg"), "{err}");
        assert!(matches!(decode_body::<Msg>(b""), Err(StreamError::Frame(codec::FrameError::Malformed { .. }))));
    }

    proptest! {
        #[test]
        fn frames_round_trip(id: u64, name in ".*", tags in proptest::collection::vec(".*", 0..4)) {
            let msg = Msg { id, name, tags };
            let frame = encode_frame(&msg).unwrap();
            let prefix: [u8; 4] = frame[..4].try_into().unwrap();
            let len = decode_len(prefix, MAX_FRAME_BYTES).unwrap();
            prop_assert_eq!(len, frame.len() - 4);
            prop_assert_eq!(decode_body::<Msg>(&frame[4..]).unwrap(), msg);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256), max in 0usize..512) {
            if bytes.len() >= 4 {
                let _ = decode_len(bytes[..4].try_into().unwrap(), max);
            }
            let _ = decode_body::<Msg>(&bytes);
        }
    }
}
