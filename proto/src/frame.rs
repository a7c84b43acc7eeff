//! The frame every Granary stream carries: a u32 little-endian length, then
//! that many bytes of body. Pure and sans-I/O; the callers own the sockets.
//!
//! Three transports use it with their own body encodings and caps: the
//! trainer's Unix socket ([`crate::wire`], rkyv, [`crate::wire::MAX_FRAME_LEN`]),
//! the peer fabric ([`crate::peer`], rkyv, [`crate::peer::MAX_PEER_FRAME_LEN`])
//! and the control plane (`granary_net::frame`, JSON). What they share is
//! written once here:
//!
//! - **One cap rule.** A body of more than `cap` bytes is refused
//!   ([`FrameError::TooLarge`]), by [`check_len`], and so by the encoder
//!   ([`encode`], [`encode_header`], [`FrameBuilder::finish`]) and the
//!   decoder ([`decode_len`], [`FrameDecoder`]) alike. A length that does not
//!   fit the u32 header is over every cap.
//! - **The cap before the allocation.** [`decode_len`] reads a declared
//!   length and refuses it before anyone reserves memory for the body, and
//!   [`FrameDecoder`] reserves at most 64 KiB ahead of the bytes that have
//!   arrived, so a peer cannot make us reserve memory it never sends.
//! - **Clean ends.** A stream that ends between frames ended cleanly; one
//!   that ends inside a frame is [`FrameError::Truncated`], naming the part.
//!
//! A shell that reads into fixed buffers (`read_exact`, or `recvmsg` with a
//! descriptor attached to the header) reads [`HEADER_LEN`] bytes, calls
//! [`decode_len`], then reads that many. A shell that takes whatever has
//! arrived pushes it into a [`FrameDecoder`], asking it how many bytes it
//! wants next ([`FrameDecoder::wanted`]) so it never reads past the end of
//! a frame (bytes that follow a frame, such as a chunk, stay on the stream).

use thiserror::Error;

/// Bytes of the length header in front of every body.
pub const HEADER_LEN: usize = 4;

/// The most bytes [`FrameDecoder`] reserves for a body before they arrive.
const INITIAL_RESERVE_BYTES: usize = 64 << 10;

/// The two parts of a frame, to say where a stream ended.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FramePart {
    /// The [`HEADER_LEN`]-byte length header.
    Header,
    /// The body the header announced.
    Body,
}

impl FramePart {
    /// `"length prefix"` or `"body"`, as error messages name the part.
    pub fn as_str(self) -> &'static str {
        match self {
            FramePart::Header => "length prefix",
            FramePart::Body => "body",
        }
    }
}

impl std::fmt::Display for FramePart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a frame could not be encoded or decoded: the one codec error of
/// every frame (the local socket's rkyv messages, the peers', the
/// coordinator's JSON ones; `granary_net::frame::StreamError` adds the
/// stream's own failures around it).
#[derive(Clone, PartialEq, Eq, Debug, Error)]
#[non_exhaustive]
pub enum FrameError {
    /// A body is longer than the cap (or than a u32 can say); nothing of it
    /// was encoded, or reserved and read.
    #[error("frame of {len} bytes exceeds the limit of {cap} bytes")]
    TooLarge {
        /// The body's (declared or given) length in bytes.
        len: usize,
        /// The cap in bytes.
        cap: usize,
    },
    /// The body is not a valid message of the expected type.
    #[error("malformed frame: expected {expected}: {reason}")]
    Malformed {
        /// The Rust type that was expected.
        expected: &'static str,
        /// The decoder's own words for what failed (rkyv's check, serde's
        /// line and column).
        reason: String,
    },
    /// The stream ended inside a frame.
    #[error("stream ended inside a frame: got {read} of {len} bytes of its {part}")]
    Truncated {
        /// The part the stream ended in.
        part: FramePart,
        /// Bytes of that part received.
        read: usize,
        /// Bytes of that part expected.
        len: usize,
    },
}

/// `len` if a body of `len` bytes is allowed under `cap`: at most `cap`, and
/// at most `u32::MAX`, what the header can say.
pub fn check_len(len: usize, cap: usize) -> Result<usize, FrameError> {
    let cap = cap.min(u32::MAX as usize);
    if len > cap { Err(FrameError::TooLarge { len, cap }) } else { Ok(len) }
}

/// The header of a body of `body_len` bytes, if [`check_len`] allows it.
pub fn encode_header(body_len: usize, cap: usize) -> Result<[u8; HEADER_LEN], FrameError> {
    let len = check_len(body_len, cap)?;
    // check_len bounds `len` by u32::MAX, so the conversion cannot fail.
    let len = u32::try_from(len).map_err(|_| FrameError::TooLarge { len, cap })?;
    Ok(len.to_le_bytes())
}

/// The frame of `body`: its header, then the body. Refuses a body over `cap`.
pub fn encode(body: &[u8], cap: usize) -> Result<Vec<u8>, FrameError> {
    let header = encode_header(body.len(), cap)?;
    let mut frame = Vec::with_capacity(HEADER_LEN + body.len());
    frame.extend_from_slice(&header);
    frame.extend_from_slice(body);
    Ok(frame)
}

/// The body length a header declares, if [`check_len`] allows it under
/// `cap`. Call it before reserving anything for the body.
pub fn decode_len(header: [u8; HEADER_LEN], cap: usize) -> Result<usize, FrameError> {
    // On a 16-bit target a u32 may not fit usize; that is over every cap.
    let len = usize::try_from(u32::from_le_bytes(header)).unwrap_or(usize::MAX);
    check_len(len, cap)
}

/// A frame built in place, for encoders that write their body into a
/// buffer (`serde_json::to_writer`): the header's bytes are reserved first
/// and written by [`FrameBuilder::finish`] once the body's length is known,
/// so the body is never copied. A builder made [`FrameBuilder::capped`]
/// stops at its cap while the body is written: the write that would pass
/// it fails (the encoder stops), nothing more is kept, and `finish`
/// refuses the frame, so a message far over the cap never takes more than
/// the cap in memory.
#[derive(Clone, Debug)]
pub struct FrameBuilder {
    /// [`HEADER_LEN`] reserved bytes, then the body so far.
    buf: Vec<u8>,
    /// The most body bytes kept.
    cap: usize,
    /// The body length a refused write would have reached.
    over: Option<usize>,
}

impl Default for FrameBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl FrameBuilder {
    /// An empty body, with no cap while it is written (`finish` checks one).
    pub fn new() -> Self {
        Self::capped(usize::MAX)
    }

    /// An empty body that stops at `cap` bytes while it is written.
    pub fn capped(cap: usize) -> Self {
        FrameBuilder { buf: vec![0; HEADER_LEN], cap, over: None }
    }

    /// Appends `bytes` to the body; past the cap, keeps nothing and
    /// remembers the length it would have reached.
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        let len = self.body_len().saturating_add(bytes.len());
        if self.over.is_some() || len > self.cap {
            self.over = Some(self.over.unwrap_or(0).max(len));
            return;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes of body so far.
    pub fn body_len(&self) -> usize {
        self.buf.len() - HEADER_LEN
    }

    /// The body length a write past the cap would have reached, if one
    /// came.
    pub fn over_cap(&self) -> Option<usize> {
        self.over
    }

    /// The whole frame, header written. Refuses a body over `cap` (or over
    /// the builder's own cap: the length a refused write would have
    /// reached).
    pub fn finish(mut self, cap: usize) -> Result<Vec<u8>, FrameError> {
        if let Some(len) = self.over {
            return Err(FrameError::TooLarge { len, cap: cap.min(self.cap) });
        }
        let header = encode_header(self.body_len(), cap)?;
        self.buf[..HEADER_LEN].copy_from_slice(&header);
        Ok(self.buf)
    }
}

impl std::io::Write for FrameBuilder {
    /// Fails once the body would pass the builder's cap.
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.extend_from_slice(bytes);
        match self.over {
            None => Ok(bytes.len()),
            Some(len) => Err(std::io::Error::other(format!("frame body of {len}+ bytes over its cap of {}", self.cap))),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// An incremental decoder: push in the bytes that arrived, poll out whole
/// bodies. It takes at most [`FrameDecoder::wanted`] bytes per push, the
/// rest of the current part, so the bytes after a frame stay with the
/// caller, and it refuses a declared length over the cap as soon as the
/// header is complete, before it reserves anything for the body.
#[derive(Debug)]
pub struct FrameDecoder {
    cap: usize,
    state: State,
}

/// Where a [`FrameDecoder`] is in the current frame.
#[derive(Debug)]
enum State {
    /// Reading the header; `read` of its bytes are in `buf`.
    Header { buf: [u8; HEADER_LEN], read: usize },
    /// Reading a body of `len` bytes (complete when `body.len() == len`).
    Body { len: usize, body: Vec<u8> },
    /// A header declared a length over the cap; the stream is unusable.
    Refused(FrameError),
}

impl FrameDecoder {
    /// A decoder of frames whose bodies are at most `cap` bytes.
    pub fn new(cap: usize) -> Self {
        FrameDecoder { cap, state: State::Header { buf: [0; HEADER_LEN], read: 0 } }
    }

    /// How many bytes the current part still needs: what a shell should
    /// read next, at most. Zero when a body is complete (take it with
    /// [`FrameDecoder::poll_frame`]) or the decoder has refused a frame.
    pub fn wanted(&self) -> usize {
        match &self.state {
            State::Header { read, .. } => HEADER_LEN - read,
            State::Body { len, body } => len - body.len(),
            State::Refused(_) => 0,
        }
    }

    /// Takes the first bytes of `bytes`, at most [`FrameDecoder::wanted`],
    /// and returns how many it took. A header that declares more than the
    /// cap is refused ([`FrameError::TooLarge`]), now and on every later
    /// push.
    pub fn push(&mut self, bytes: &[u8]) -> Result<usize, FrameError> {
        let take = bytes.len().min(self.wanted());
        match &mut self.state {
            State::Refused(e) => return Err(e.clone()),
            State::Header { buf, read } => {
                buf[*read..*read + take].copy_from_slice(&bytes[..take]);
                *read += take;
                if *read == HEADER_LEN {
                    match decode_len(*buf, self.cap) {
                        Ok(len) => {
                            let body = Vec::with_capacity(len.min(INITIAL_RESERVE_BYTES));
                            self.state = State::Body { len, body };
                        }
                        Err(e) => {
                            self.state = State::Refused(e.clone());
                            return Err(e);
                        }
                    }
                }
            }
            State::Body { body, .. } => body.extend_from_slice(&bytes[..take]),
        }
        Ok(take)
    }

    /// The body of the current frame if it is complete; the decoder then
    /// starts on the next frame.
    pub fn poll_frame(&mut self) -> Option<Vec<u8>> {
        match &mut self.state {
            State::Body { len, body } if body.len() == *len => {
                let body = std::mem::take(body);
                self.state = State::Header { buf: [0; HEADER_LEN], read: 0 };
                Some(body)
            }
            _ => None,
        }
    }

    /// Whether no byte of a frame is pending: the stream may end here.
    pub fn is_between_frames(&self) -> bool {
        matches!(self.state, State::Header { read: 0, .. })
    }

    /// Call at the end of the stream: `Ok` if it ended between frames (or
    /// after a complete body not yet polled), [`FrameError::Truncated`] if
    /// inside one, the refusal if a frame was refused.
    pub fn finish(&self) -> Result<(), FrameError> {
        match &self.state {
            State::Header { read: 0, .. } => Ok(()),
            State::Header { read, .. } => {
                Err(FrameError::Truncated { part: FramePart::Header, read: *read, len: HEADER_LEN })
            }
            State::Body { len, body } if body.len() < *len => {
                Err(FrameError::Truncated { part: FramePart::Body, read: body.len(), len: *len })
            }
            State::Body { .. } => Ok(()),
            State::Refused(e) => Err(e.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Pushes `stream` into a decoder in pieces of the given sizes (cycled),
    /// collecting every body; returns the bodies and the first error.
    fn decode_all(stream: &[u8], cap: usize, pieces: &[usize]) -> (Vec<Vec<u8>>, Result<(), FrameError>) {
        let mut decoder = FrameDecoder::new(cap);
        let mut bodies = Vec::new();
        let mut at = 0;
        let mut sizes = pieces.iter().copied().cycle();
        while at < stream.len() {
            let piece = &stream[at..(at + sizes.next().unwrap_or(1).max(1)).min(stream.len())];
            let mut used = 0;
            while used < piece.len() {
                match decoder.push(&piece[used..]) {
                    Ok(n) => used += n,
                    Err(e) => return (bodies, Err(e)),
                }
                bodies.extend(decoder.poll_frame());
            }
            at += piece.len();
        }
        bodies.extend(decoder.poll_frame());
        (bodies, decoder.finish())
    }

    #[test]
    fn the_header_is_the_little_endian_length() {
        assert_eq!(encode(b"abc", 10).unwrap(), [3, 0, 0, 0, b'a', b'b', b'c']);
        assert_eq!(encode(b"", 0).unwrap(), [0, 0, 0, 0]);
        assert_eq!(encode_header(0x0102_0304, usize::MAX).unwrap(), [4, 3, 2, 1]);
        let mut built = FrameBuilder::new();
        built.extend_from_slice(b"ab");
        std::io::Write::write_all(&mut built, b"c").unwrap();
        assert_eq!(built.body_len(), 3);
        assert_eq!(built.finish(3).unwrap(), encode(b"abc", 3).unwrap());
    }

    #[test]
    fn the_cap_refuses_longer_bodies_on_both_sides() {
        assert_eq!(check_len(10, 10), Ok(10));
        assert_eq!(encode(&[0; 11], 10), Err(FrameError::TooLarge { len: 11, cap: 10 }));
        let mut built = FrameBuilder::new();
        built.extend_from_slice(&[0; 11]);
        assert_eq!(built.finish(10), Err(FrameError::TooLarge { len: 11, cap: 10 }));
        // Capped while built: the write past the cap fails and keeps
        // nothing; finish names the length it would have reached.
        let mut built = FrameBuilder::capped(10);
        std::io::Write::write_all(&mut built, &[0; 8]).unwrap();
        assert!(std::io::Write::write_all(&mut built, &[0; 8]).is_err());
        assert_eq!(built.body_len(), 8, "nothing past the cap is kept");
        assert_eq!(built.over_cap(), Some(16));
        assert_eq!(built.finish(64), Err(FrameError::TooLarge { len: 16, cap: 10 }));
        let mut built = FrameBuilder::capped(10);
        std::io::Write::write_all(&mut built, &[0; 10]).unwrap();
        assert_eq!(built.finish(10).unwrap().len(), HEADER_LEN + 10);
        assert_eq!(decode_len(10u32.to_le_bytes(), 10), Ok(10));
        assert_eq!(decode_len(11u32.to_le_bytes(), 10), Err(FrameError::TooLarge { len: 11, cap: 10 }));
        let max = u32::MAX as usize;
        assert_eq!(decode_len([0xff; 4], usize::MAX), Ok(max));
        assert_eq!(decode_len([0xff; 4], 64 << 20), Err(FrameError::TooLarge { len: max, cap: 64 << 20 }));
    }

    /// A length the header cannot say is over every cap, whatever the caller
    /// asked for (checked without allocating 4 GiB).
    #[cfg(target_pointer_width = "64")]
    #[test]
    fn a_length_beyond_u32_is_refused() {
        let len = u32::MAX as usize + 1;
        assert_eq!(encode_header(len, usize::MAX), Err(FrameError::TooLarge { len, cap: u32::MAX as usize }));
    }

    #[test]
    fn a_length_over_the_cap_is_refused_as_the_header_completes() {
        let mut decoder = FrameDecoder::new(1000);
        assert_eq!(decoder.push(&1001u32.to_le_bytes()[..3]), Ok(3));
        let refused = FrameError::TooLarge { len: 1001, cap: 1000 };
        assert_eq!(decoder.push(&[0, 9, 9, 9]), Err(refused.clone()));
        assert!(matches!(decoder.state, State::Refused(_)), "nothing reserved for the body");
        assert_eq!(decoder.wanted(), 0);
        assert_eq!(decoder.push(b"more"), Err(refused.clone()));
        assert_eq!(decoder.finish(), Err(refused));
    }

    #[test]
    fn a_large_allowed_length_reserves_only_what_may_arrive_soon() {
        let mut decoder = FrameDecoder::new(usize::MAX);
        assert_eq!(decoder.push(&u32::MAX.to_le_bytes()), Ok(4));
        let State::Body { body, .. } = &decoder.state else { panic!("expected a body") };
        assert!(body.capacity() <= INITIAL_RESERVE_BYTES, "reserved {}", body.capacity());
        assert_eq!(decoder.wanted(), u32::MAX as usize);
    }

    #[test]
    fn the_decoder_never_takes_bytes_past_the_frame() {
        let mut stream = encode(b"head", 100).unwrap();
        stream.extend_from_slice(b"chunk bytes");
        let mut decoder = FrameDecoder::new(100);
        assert_eq!(decoder.wanted(), HEADER_LEN);
        assert_eq!(decoder.push(&stream), Ok(HEADER_LEN));
        assert_eq!(decoder.wanted(), 4);
        assert_eq!(decoder.push(&stream[HEADER_LEN..]), Ok(4));
        assert_eq!(decoder.wanted(), 0);
        assert_eq!(decoder.push(&stream[2 * HEADER_LEN..]), Ok(0));
        assert_eq!(decoder.poll_frame().as_deref(), Some(&b"head"[..]));
        assert_eq!(decoder.poll_frame(), None);
        assert!(decoder.is_between_frames());
    }

    #[test]
    fn ends_inside_a_frame_are_truncated_and_between_frames_clean() {
        let frame = encode(&[7; 100], 100).unwrap();
        assert_eq!(decode_all(&frame[..0], 100, &[1]).1, Ok(()));
        assert_eq!(decode_all(&frame, 100, &[3]).1, Ok(()));
        assert_eq!(
            decode_all(&frame[..2], 100, &[1]).1,
            Err(FrameError::Truncated { part: FramePart::Header, read: 2, len: 4 })
        );
        assert_eq!(
            decode_all(&frame[..14], 100, &[5]).1,
            Err(FrameError::Truncated { part: FramePart::Body, read: 10, len: 100 })
        );
        let err = FrameError::Truncated { part: FramePart::Header, read: 2, len: 4 };
        assert_eq!(err.to_string(), "stream ended inside a frame: got 2 of 4 bytes of its length prefix");
    }

    #[test]
    fn an_empty_body_is_a_frame() {
        let (bodies, end) = decode_all(&[0, 0, 0, 0, 0, 0, 0, 0], 0, &[8]);
        assert_eq!(bodies, [Vec::<u8>::new(), Vec::new()]);
        assert_eq!(end, Ok(()));
    }

    proptest! {
        #[test]
        fn frames_round_trip_in_any_pieces(
            bodies in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 0..6),
            pieces in prop::collection::vec(1usize..40, 1..8),
        ) {
            let mut stream = Vec::new();
            for b in &bodies {
                stream.extend(encode(b, 300).unwrap());
            }
            let (got, end) = decode_all(&stream, 300, &pieces);
            prop_assert_eq!(end, Ok(()));
            prop_assert_eq!(got, bodies);
        }

        #[test]
        fn arbitrary_bytes_never_panic_nor_pass_the_cap(
            bytes in prop::collection::vec(any::<u8>(), 0..512),
            cap in 0usize..600,
            pieces in prop::collection::vec(1usize..64, 1..8),
        ) {
            let (bodies, _) = decode_all(&bytes, cap, &pieces);
            prop_assert!(bodies.iter().all(|b| b.len() <= cap));
            if bytes.len() >= HEADER_LEN {
                let header: [u8; HEADER_LEN] = bytes[..HEADER_LEN].try_into().unwrap();
                let _ = decode_len(header, cap);
            }
        }

        #[test]
        fn a_declared_length_over_the_cap_is_refused_before_any_body_byte(
            cap in 0usize..(1 << 20),
            over in 1usize..(1 << 20),
            tail in prop::collection::vec(any::<u8>(), 0..64),
        ) {
            let len = (cap + over) as u32;
            let mut decoder = FrameDecoder::new(cap);
            let mut stream = len.to_le_bytes().to_vec();
            stream.extend_from_slice(&tail);
            let refused = FrameError::TooLarge { len: len as usize, cap };
            prop_assert_eq!(decoder.push(&stream), Err(refused));
            prop_assert!(matches!(decoder.state, State::Refused(_)));
            prop_assert_eq!(decoder.wanted(), 0);
        }
    }
}
