//! A heap buffer whose first byte is 64-byte aligned.
//!
//! Chunks promise 64-byte-aligned tensors so that a trainer can reinterpret
//! them as typed slices and a GPU copy can use them directly; a `Vec<u8>`
//! only promises alignment 1, so in-process chunks and batch buffers live in
//! this type instead.

/// One cache line; the unit of allocation.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// A zero-initialised byte buffer aligned to 64 bytes.
#[derive(Clone)]
pub struct AlignedBuf {
    lines: Vec<Line>,
    len: usize,
}

impl AlignedBuf {
    /// A zero-filled buffer of `len` bytes.
    pub fn zeroed(len: usize) -> Self {
        Self { lines: vec![Line([0; 64]); len.div_ceil(64)], len }
    }

    /// A buffer holding a copy of `bytes`.
    pub fn from_slice(bytes: &[u8]) -> Self {
        let mut b = Self::zeroed(bytes.len());
        b.as_mut_slice().copy_from_slice(bytes);
        b
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes available without reallocating.
    pub fn capacity(&self) -> usize {
        self.lines.len() * 64
    }

    /// Sets the length, growing (zero-filled) when needed. Existing bytes
    /// within the new length are kept.
    pub fn resize(&mut self, len: usize) {
        let lines = len.div_ceil(64);
        if lines > self.lines.len() {
            self.lines.resize(lines, Line([0; 64]));
        }
        self.len = len;
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `lines` is a contiguous allocation of `lines.len() * 64`
        // initialised bytes and `len <= lines.len() * 64` by construction.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<u8>(), self.len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; the borrow is unique through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<u8>(), self.len) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf").field("len", &self.len).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_is_64_byte_aligned_and_resize_keeps_bytes() {
        let mut b = AlignedBuf::from_slice(&[1, 2, 3]);
        assert_eq!(b.as_slice().as_ptr() as usize % 64, 0);
        b.resize(200);
        assert_eq!(&b.as_slice()[..4], &[1, 2, 3, 0]);
        assert_eq!(b.len(), 200);
        assert_eq!(b.as_slice().as_ptr() as usize % 64, 0);
    }
}
