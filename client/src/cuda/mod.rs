//! Copying batches to the GPU, double-buffered (feature `cuda`).
//!
//! A [`GpuFeed`] owns one CUDA stream and two *slots*. A slot is a pinned
//! (page-locked) host buffer, a device buffer of the same size, and two
//! events: `copied`, recorded on the feed's stream after the slot's
//! host-to-device copy, and `released`, which a consumer may record on its own
//! stream once its kernels have read the slot. [`GpuFeed::upload`] packs every
//! tensor of a [`Batch`](crate::Batch) into the next slot's pinned buffer at 64-byte-aligned
//! offsets (see [`slot_bytes`]), enqueues one asynchronous copy of the used
//! bytes, and returns a [`GpuBatch`] describing the tensors on the device.
//! Slots alternate, so the copy of batch n+1 runs while the GPU still works on
//! batch n; [`GpuStream`] goes one step further and enqueues batch n+1 before
//! handing batch n to the caller, so the copy also overlaps host-side work.
//!
//! ## One host copy
//! [`GpuStream`] takes ownership of each batch. A batch the loader assembled
//! into page-locked memory (a [`LoaderConfig`](crate::LoaderConfig) whose
//! `host_memory` is [`GpuFeed::host_memory`]) is copied to the device
//! straight from that memory: the loader's gather is the only host copy, and
//! the slot's staging buffer is not used. The slot keeps the host batch, and
//! with it the buffer, until the slot's `copied` event has been waited on
//! (when the slot comes round again), so the loader cannot reuse the buffer
//! while the device still reads it. Every other batch (a view into chunk
//! memory, or one assembled on the heap) is packed into the slot's staging
//! buffer first, as [`GpuFeed::upload`] always does, except a view into a
//! chunk whose mapping is registered with the driver
//! ([`LocalSource::page_lock_for`](crate::LocalSource::page_lock_for)):
//! that is copied tensor by tensor straight from chunk memory, and held in
//! the slot like a pinned batch, so with a block shuffle most batches cross
//! to the device with no host copy at all.
//!
//! ## Design choices
//! - **Bounded memory.** Everything is allocated once, in [`GpuFeed::new`]:
//!   2 x `max_batch_bytes` pinned host memory and 2 x `max_batch_bytes` of
//!   device memory. A batch that does not fit is an error, never a
//!   reallocation.
//! - **Pinned staging, one host copy.** An asynchronous copy needs a
//!   page-locked source; the loader's pooled buffers are ordinary heap memory
//!   and registering them with the driver on every batch costs more than one
//!   `memcpy`. The staging buffers are allocated without
//!   `CU_MEMHOSTALLOC_WRITECOMBINED` (flags 0): the CPU writes them and
//!   write-combined memory is only fast for strictly streaming writes.
//! - **Reuse is enforced, not hoped for.** A [`GpuBatch`] borrows its feed,
//!   so the host cannot start another upload while it still holds views of
//!   the previous one. Before the CPU overwrites a slot's pinned buffer it
//!   waits on the slot's `copied` event; before the device buffer is
//!   overwritten the copy stream waits (on the GPU, without blocking the host)
//!   on the slot's `released` event and on cudarc's per-buffer read events.
//!   Work that reads a batch through [`GpuBatch::view`] with cudarc, or that
//!   runs on [`GpuFeed::stream`], is therefore ordered automatically; work
//!   launched on another stream through a raw [`GpuBatch::device_ptr`] must
//!   be followed by [`GpuBatch::release_after`].
//! - **No driver is an error, not a panic.** cudarc loads `libcuda` at run
//!   time (so this builds without a CUDA toolkit), but its first driver call
//!   panics when the library is missing. Every entry point first probes for
//!   the library and returns [`ClientError::Gpu`](crate::ClientError::Gpu) when it is absent; as a
//!   second line of defence the driver calls made while probing and creating
//!   a feed run under [`std::panic::catch_unwind`]. Creation also performs
//!   one small copy per slot, which resolves every driver symbol the upload
//!   path uses, so a driver too old for them fails in [`GpuFeed::new`].
//!
//! ## Files
//! Imports go one way, down this list: `driver` (loading and probing
//! `libcuda`, error mapping, host-memory registration and pinned
//! allocation), `layout` (where tensors lie in a slot, [`GpuTensor`]),
//! `slot` (one pinned/device buffer pair, its events and copies), `view`
//! ([`GpuBatch`]), `feed` ([`GpuFeed`]), `stream` ([`GpuStream`]).

mod driver;
mod feed;
#[cfg(test)]
mod fixtures;
mod layout;
mod slot;
mod stream;
mod view;

pub use driver::cuda_available;
pub(crate) use driver::{alloc_pinned, register_host_read_only, unregister_host};
pub use feed::GpuFeed;
pub use layout::{GpuTensor, SLOT_ALIGN, slot_bytes};
pub use stream::GpuStream;
pub use view::GpuBatch;
