//! A checksum trailer for streamed files (the snapshot file): the body is
//! written through a [`SummingWriter`], then a trailer line holds the
//! body's XXH3-128 in hex; a reader sums the body through a
//! [`SummingReader`] as it decodes it and compares with the trailer.
//!
//! JSON decodes a flipped digit or letter into a different value without
//! complaint (an epoch, an owner id, a node address), so a snapshot corrupted
//! on disk or in transit would otherwise install as a wrong state. With the
//! trailer such a file is an error naming it. The sum is not a signature:
//! transport is authenticated by TLS, and the disk by who can write to it.

use std::io::{self, Read, Write};
use xxhash_rust::xxh3::Xxh3;

/// What the trailer line starts with, after the body's last byte.
const TRAILER_TAG: &[u8] = b"\nxxh3-128 ";
/// The trailer's length: the tag, 32 hex digits and a newline.
pub const TRAILER_BYTES: usize = TRAILER_TAG.len() + 32 + 1;

/// Sums what is written through it.
pub struct SummingWriter<W> {
    inner: W,
    sum: Xxh3,
}

impl<W: Write> SummingWriter<W> {
    /// Sums what is written to `inner` from now on.
    pub fn new(inner: W) -> Self {
        Self { inner, sum: Xxh3::new() }
    }

    /// Writes the trailer (the sum of everything written so far) and
    /// returns the inner writer.
    pub fn finish(mut self) -> io::Result<W> {
        let line = trailer(self.sum.digest128());
        self.inner.write_all(&line)?;
        Ok(self.inner)
    }
}

impl<W: Write> Write for SummingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.sum.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Sums what is read through it.
pub struct SummingReader<R> {
    inner: R,
    sum: Xxh3,
}

/// Why a file's trailer does not vouch for its body.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TrailerError {
    /// The stream ends where the trailer should start.
    #[error("it ends without its checksum line (cut short, or not written by this format)")]
    Missing,
    /// What follows the body is not one trailer line.
    #[error("its checksum line is malformed")]
    Malformed,
    /// The body is not what was summed when it was written.
    #[error(
        "its contents do not match its checksum (stored {stored:032x}, computed {computed:032x}): the file is corrupt"
    )]
    Mismatch {
        /// The sum the trailer holds.
        stored: u128,
        /// The sum of the body as read.
        computed: u128,
    },
}

impl<R: Read> SummingReader<R> {
    /// Sums what is read from `inner` from now on.
    pub fn new(inner: R) -> Self {
        Self { inner, sum: Xxh3::new() }
    }

    /// Reads the rest of the stream, which must be exactly the trailer of
    /// the body read so far.
    pub fn check_trailer(self) -> io::Result<Result<(), TrailerError>> {
        let computed = self.sum.digest128();
        let mut rest = Vec::with_capacity(TRAILER_BYTES);
        self.inner.take(TRAILER_BYTES as u64 + 1).read_to_end(&mut rest)?;
        Ok(match parse_trailer(&rest) {
            Err(e) => Err(e),
            Ok(stored) if stored != computed => Err(TrailerError::Mismatch { stored, computed }),
            Ok(_) => Ok(()),
        })
    }

    /// Reads the rest of the stream, which must be only whitespace (a file
    /// of a format without a trailer).
    pub fn check_no_trailer(self) -> io::Result<bool> {
        let mut rest = Vec::new();
        self.inner.take(1 << 10).read_to_end(&mut rest)?;
        Ok(rest.iter().all(u8::is_ascii_whitespace))
    }
}

impl<R: Read> Read for SummingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.sum.update(&buf[..n]);
        Ok(n)
    }
}

fn trailer(sum: u128) -> Vec<u8> {
    let mut line = TRAILER_TAG.to_vec();
    line.extend_from_slice(format!("{sum:032x}\n").as_bytes());
    line
}

/// The sum a trailer holds.
fn parse_trailer(rest: &[u8]) -> Result<u128, TrailerError> {
    if rest.is_empty() {
        return Err(TrailerError::Missing);
    }
    let hex = rest
        .strip_prefix(TRAILER_TAG)
        .and_then(|r| r.strip_suffix(b"\n"))
        .filter(|h| h.len() == 32)
        .ok_or(TrailerError::Malformed)?;
    let hex = std::str::from_utf8(hex).map_err(|_| TrailerError::Malformed)?;
    u128::from_str_radix(hex, 16).map_err(|_| TrailerError::Malformed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn written(body: &[u8]) -> Vec<u8> {
        let mut w = SummingWriter::new(Vec::new());
        w.write_all(body).expect("vec");
        w.finish().expect("vec")
    }

    fn check(file: &[u8], body_len: usize) -> Result<(), TrailerError> {
        let mut r = SummingReader::new(file);
        let mut body = vec![0; body_len];
        r.read_exact(&mut body).expect("long enough");
        r.check_trailer().expect("in memory")
    }

    #[test]
    fn a_written_file_checks_and_a_cut_or_changed_one_does_not() {
        let body = br#"{"format":3,"epoch":12}"#;
        let file = written(body);
        assert_eq!(file.len(), body.len() + TRAILER_BYTES);
        assert_eq!(check(&file, body.len()), Ok(()));
        assert_eq!(check(&file[..body.len()], body.len()), Err(TrailerError::Missing));
        assert_eq!(check(&file[..file.len() - 1], body.len()), Err(TrailerError::Malformed));
        let mut longer = file.clone();
        longer.push(b'x');
        assert_eq!(check(&longer, body.len()), Err(TrailerError::Malformed), "bytes after the trailer");
        let mut flipped = file.clone();
        flipped[18] = b'3'; // "epoch":12 -> 32: still JSON, another value
        assert!(matches!(check(&flipped, body.len()), Err(TrailerError::Mismatch { .. })));
    }

    #[test]
    fn a_file_without_trailer_is_only_followed_by_whitespace() {
        let r = SummingReader::new(&b" \n"[..]);
        assert!(r.check_no_trailer().expect("in memory"));
        let r = SummingReader::new(&b"\nxxh3-128 00"[..]);
        assert!(!r.check_no_trailer().expect("in memory"));
    }

    proptest! {
        #[test]
        fn any_one_changed_byte_of_the_body_is_found(body in proptest::collection::vec(any::<u8>(), 1..256),
                                                     at in any::<prop::sample::Index>(), to in any::<u8>()) {
            let mut file = written(&body);
            let i = at.index(body.len());
            prop_assume!(file[i] != to);
            file[i] = to;
            let mismatch = matches!(check(&file, body.len()), Err(TrailerError::Mismatch { .. }));
            prop_assert!(mismatch, "a changed byte went unnoticed");
        }
    }
}
