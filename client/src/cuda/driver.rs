//! The CUDA driver boundary: loading and probing `libcuda` without
//! panicking, mapping driver errors to [`GpuError`], and the
//! host-memory calls the rest of the crate makes (registering chunk mappings,
//! allocating page-locked buffers).
//!
//! Every driver call in `cuda` goes through [`guarded`] and [`driver`], so
//! the "no driver is an error, not a panic" rule lives in one place.

use crate::error::{ClientError, GpuError};
use cudarc::driver::{CudaContext, DriverError, PinnedHostSlice};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, OnceLock};

/// The error returned when `libcuda` cannot be loaded.
fn no_driver() -> ClientError {
    ClientError::Gpu(GpuError::NoDriver)
}

/// Maps a driver error to [`ClientError::Gpu`], naming what failed.
///
/// The error code is formatted with `Debug` (for example
/// `CUDA_ERROR_OUT_OF_MEMORY`) rather than `Display`, which would call back
/// into the driver.
pub(super) fn driver(what: impl std::fmt::Display) -> impl FnOnce(DriverError) -> ClientError {
    move |e| ClientError::Gpu(GpuError::Driver { what: what.to_string(), code: format!("{:?}", e.0) })
}

/// True when `libcuda` can be loaded. Never calls into the driver.
fn driver_library_present() -> bool {
    // SAFETY: `is_culib_present` dlopens (and immediately closes) the
    // NVIDIA driver library under its usual names; loading it runs the
    // library's initialisers, which is exactly what cudarc does on the first
    // driver call anyway. It has no other preconditions and does not panic.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Runs driver calls, turning a panic inside cudarc into [`ClientError::Gpu`].
///
/// Second line of defence: callers check [`driver_library_present`] first,
/// but cudarc also panics when a driver symbol is missing (an old driver),
/// and a data loader must not take the trainer down over that.
pub(super) fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, ClientError>) -> Result<T, ClientError> {
    // AssertUnwindSafe: `f` only builds owned values; if it unwinds they are
    // dropped during unwinding and no partially updated state is observed
    // afterwards.
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let msg = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "non-string panic payload".to_string());
        tracing::error!(what, %msg, "the CUDA driver wrapper panicked");
        Err(ClientError::Gpu(GpuError::Panicked { what: what.to_string(), message: msg }))
    })
}

/// Loads the driver, initialises it and counts devices.
pub(super) fn probe() -> Result<usize, ClientError> {
    if !driver_library_present() {
        return Err(no_driver());
    }
    guarded("initialising the CUDA driver", || {
        let n = CudaContext::device_count().map_err(driver("initialising the CUDA driver (cuInit / device count)"))?;
        Ok(usize::try_from(n).unwrap_or(0))
    })
}

/// True when a CUDA driver can be loaded and reports at least one device.
///
/// Never panics. The answer is computed once per process and cached.
pub fn cuda_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| matches!(probe(), Ok(n) if n > 0))
}

/// Makes `ctx` current on this thread without losing an error cudarc
/// recorded on it earlier (binding reports and clears such an error; it is
/// recorded again for the feed to find), then runs `f`.
fn with_context<T>(ctx: &Arc<CudaContext>, f: impl FnOnce() -> Result<T, ClientError>) -> Result<T, ClientError> {
    let earlier = ctx.bind_to_thread().err();
    if earlier.is_some() {
        ctx.bind_to_thread().map_err(driver("binding the CUDA context"))?;
    }
    let result = f();
    if let Some(e) = earlier {
        ctx.record_err::<()>(Err(e));
    }
    result
}

/// Registers `len` bytes at `ptr` (a read-only mapping) with `ctx` as
/// page-locked memory, usable from any context (`PORTABLE`); the error where
/// the driver refuses.
pub(crate) fn register_host_read_only(
    ctx: &Arc<CudaContext>,
    ptr: *mut std::ffi::c_void,
    len: usize,
) -> Result<(), ClientError> {
    guarded("registering chunk memory with the CUDA driver", || {
        with_context(ctx, || {
            use cudarc::driver::sys::{
                CU_MEMHOSTREGISTER_PORTABLE, CU_MEMHOSTREGISTER_READ_ONLY, cuMemHostRegister_v2,
            };
            // SAFETY: `ptr..ptr+len` is a live mapping owned by the caller,
            // which unregisters it (`unregister_host`) before unmapping it;
            // the driver only pins its pages and never writes them.
            let r =
                unsafe { cuMemHostRegister_v2(ptr, len, CU_MEMHOSTREGISTER_READ_ONLY | CU_MEMHOSTREGISTER_PORTABLE) };
            r.result().map_err(driver(format_args!("registering {len} bytes of chunk memory")))
        })
    })
}

/// Undoes [`register_host_read_only`] for `ptr`; false (logged) when the
/// driver did not, in which case the caller must not unmap the range.
pub(crate) fn unregister_host(ctx: &Arc<CudaContext>, ptr: *mut std::ffi::c_void) -> bool {
    let result = guarded("unregistering chunk memory", || {
        with_context(ctx, || {
            // SAFETY: `ptr` was registered with this context and is still
            // mapped.
            let r = unsafe { cudarc::driver::sys::cuMemHostUnregister(ptr) };
            r.result().map_err(driver("unregistering chunk memory"))
        })
    });
    match result {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(error = %e, "unregistering chunk memory failed: the mapping is kept");
            false
        }
    }
}

/// `bytes` of page-locked host memory of `ctx`, zeroed, and its address.
pub(crate) fn alloc_pinned(
    ctx: &Arc<CudaContext>,
    bytes: usize,
) -> Result<(PinnedHostSlice<u8>, *mut u8), ClientError> {
    guarded("allocating page-locked memory for a batch", || {
        // SAFETY: the memory is uninitialised after this call; it is zeroed
        // below before any slice of it is formed. Flags 0: plain page-locked
        // memory, not write-combined, since the CPU writes it.
        let mut host = unsafe { ctx.alloc_pinned_with_flags::<u8>(bytes, 0) }
            .map_err(driver(format_args!("allocating {bytes} bytes of page-locked memory for a batch")))?;
        let ptr = host.as_mut_ptr().map_err(driver("waiting on a new page-locked buffer"))?;
        // SAFETY: `ptr` is the start of a live allocation of `bytes` bytes
        // owned by `host`, which no other code has seen yet.
        unsafe { ptr.write_bytes(0, bytes) };
        Ok((host, ptr))
    })
}
