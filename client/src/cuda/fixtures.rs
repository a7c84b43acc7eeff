//! Test fixtures shared by the `cuda` unit tests: the tensor layouts they
//! use and host batches whose every byte is a function of its place.

use crate::batch::Batch;
use crate::hostbuf::{BufferPool, HostMemory};
use crate::position::Position;
use granary_proto::{DType, TensorLayout};
use std::sync::Arc;

pub(super) fn layout(name: &str, dtype: DType, shape: &[u32]) -> TensorLayout {
    TensorLayout::dense(name, dtype, shape.to_vec())
}

pub(super) fn layouts() -> Vec<TensorLayout> {
    vec![
        layout("label", DType::Bool, &[]),
        layout("dense", DType::F32, &[13]),
        layout("ids", DType::I64, &[3]),
        layout("f16", DType::F16, &[5]),
    ]
}

/// A batch of `rows` rows in `memory`, every byte a function of its
/// place.
pub(super) fn batch_in(ls: &Arc<[TensorLayout]>, rows: usize, index: u64, memory: HostMemory) -> Batch {
    let mut placements = Vec::new();
    let used = crate::hostbuf::pack_values(ls, rows, &[], &mut placements).expect("no overflow");
    let mut buf = BufferPool::new(1, memory).take(used).expect("buffer");
    for (t, &crate::hostbuf::Placement { offset, len, .. }) in placements.iter().enumerate() {
        for (b, byte) in buf.as_mut_slice()[offset..offset + len].iter_mut().enumerate() {
            *byte = (b as u64 * 31 + index * 7 + t as u64) as u8;
        }
    }
    Batch {
        position: Position { epoch: 0, batch: index },
        rows,
        layouts: ls.clone(),
        storage: crate::batch::Storage::Owned { buf, placements, recycle: None },
    }
}

pub(super) fn batch(ls: &Arc<[TensorLayout]>, rows: usize, index: u64) -> Batch {
    batch_in(ls, rows, index, HostMemory::Heap)
}

/// A test that cannot run here says "skipped" and why, and appends its
/// name and why to `GRANARY_SKIP_LOG` when set (CI counts them); the same
/// rule as `granary_testkit::skip`, which this crate cannot depend on.
pub(crate) fn skipped(why: impl std::fmt::Display) {
    use std::io::Write;
    eprintln!("skipped: {why}");
    let Some(path) = std::env::var_os("GRANARY_SKIP_LOG") else { return };
    let test = std::thread::current().name().unwrap_or("?").to_string();
    let line = format!("{test}: {}\n", why.to_string().replace('\n', " "));
    let _ =
        std::fs::OpenOptions::new().create(true).append(true).open(path).and_then(|mut f| f.write_all(line.as_bytes()));
}
