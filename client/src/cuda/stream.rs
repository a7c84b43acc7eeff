//! [`GpuStream`]: a lending iterator over a batch source that keeps the
//! next batch's copy enqueued while the caller works on the current one.

use super::feed::GpuFeed;
use super::view::GpuBatch;
use crate::batch::Batch;
use crate::error::ClientError;

/// Batches from an iterator, uploaded one ahead: when the caller gets batch
/// n, the copy of batch n+1 is already enqueued.
///
/// Returning a borrowed [`GpuBatch`] makes this a lending iterator, so it
/// offers [`next_gpu`](Self::next_gpu) instead of implementing [`Iterator`].
/// Errors from the source are passed through in order, after the batches
/// before them.
pub struct GpuStream<I> {
    feed: GpuFeed,
    batches: I,
    /// Slot holding the next batch to hand out, already enqueued.
    queued: Option<usize>,
    /// An error met while prefetching, to hand out after the current batch.
    pending: Option<ClientError>,
    /// The source returned `None`.
    exhausted: bool,
}

impl<I> std::fmt::Debug for GpuStream<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuStream")
            .field("feed", &self.feed)
            .field("queued", &self.queued)
            .field("exhausted", &self.exhausted)
            .finish()
    }
}

impl<I: Iterator<Item = Result<Batch, ClientError>>> GpuStream<I> {
    /// Uploads the batches of `batches` through `feed`.
    pub fn new(feed: GpuFeed, batches: I) -> Self {
        GpuStream { feed, batches, queued: None, pending: None, exhausted: false }
    }

    /// The next batch on the GPU, with the following batch's copy already
    /// enqueued; `None` when the source is exhausted.
    pub fn next_gpu(&mut self) -> Option<Result<GpuBatch<'_>, ClientError>> {
        let current = match self.queued.take() {
            Some(index) => index,
            None => {
                if let Some(e) = self.pending.take() {
                    return Some(Err(e));
                }
                match self.pull() {
                    Ok(Some(index)) => index,
                    Ok(None) => return None,
                    Err(e) => return Some(Err(e)),
                }
            }
        };
        // Prefetch into the other slot. The caller's previous GpuBatch lived
        // there and its borrow has ended, since this call takes `&mut self`.
        if self.pending.is_none() {
            match self.pull() {
                Ok(next) => self.queued = next,
                Err(e) => self.pending = Some(e),
            }
        }
        Some(self.feed.batch_in(current))
    }

    /// Takes the next batch from the source and stages it.
    fn pull(&mut self) -> Result<Option<usize>, ClientError> {
        if self.exhausted {
            return Ok(None);
        }
        match self.batches.next() {
            None => {
                self.exhausted = true;
                Ok(None)
            }
            // A batch in page-locked memory is copied from there and kept
            // until the copy is done; any other is staged and dropped,
            // returning its buffer to the loader's pool.
            Some(batch) => self.feed.stage_owned(batch?).map(Some),
        }
    }

    /// The feed.
    pub fn feed(&self) -> &GpuFeed {
        &self.feed
    }

    /// The feed and the source. A batch already prefetched onto the GPU but
    /// not yet handed out is discarded: resume the source from the position
    /// after the last batch consumed.
    pub fn into_parts(self) -> (GpuFeed, I) {
        (self.feed, self.batches)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::driver::cuda_available;
    use crate::cuda::fixtures::{batch, layouts};
    use crate::cuda::layout::slot_bytes;
    use crate::cuda::view::tests::check_on_device;
    use granary_proto::TensorLayout;
    use std::sync::Arc;

    /// Runs only where a CUDA device is present.
    #[test]
    fn cuda_stream_prefetches_in_order_on_gpu() {
        if !cuda_available() {
            crate::cuda::fixtures::skipped("no CUDA device");
            return;
        }
        let ls: Arc<[TensorLayout]> = layouts().into();
        let cap = slot_bytes(&ls, 32).expect("no overflow");
        let feed = GpuFeed::new(0, cap).expect("feed on device 0");
        let expected: Vec<Batch> = (0..5).map(|i| batch(&ls, 32, i)).collect();
        let mut source: Vec<Result<Batch, ClientError>> = (0..5).map(|i| Ok(batch(&ls, 32, i))).collect();
        source.insert(3, Err(ClientError::Producer(crate::error::ProducerError::Injected("a failed batch"))));
        let mut stream = GpuStream::new(feed, source.into_iter());
        let mut seen = Vec::new();
        let mut errors = 0;
        while let Some(next) = stream.next_gpu() {
            match next {
                Ok(g) => {
                    check_on_device(&g, &expected[g.position().batch as usize]);
                    seen.push(g.position().batch);
                }
                Err(_) => {
                    errors += 1;
                    assert_eq!(seen, vec![0, 1, 2], "error delivered in order");
                }
            }
        }
        assert_eq!(seen, vec![0, 1, 2, 3, 4]);
        assert_eq!(errors, 1);
    }

    /// A loader assembling into the feed's page-locked memory, through a
    /// GpuStream: every batch on the device equals the same loader's batch
    /// assembled on the heap, and the pinned buffers (reused by the loader
    /// while copies are in flight) never hand the device a later batch's
    /// bytes. Runs only where a CUDA device is present.
    #[test]
    fn cuda_stream_copies_loader_batches_from_pinned_memory_on_gpu() {
        if !cuda_available() {
            crate::cuda::fixtures::skipped("no CUDA device");
            return;
        }
        use crate::{Loader, LoaderConfig, MemorySource};
        use granary_proto::wire::DatasetInfo;
        use granary_proto::{AlignedBuf, ChunkLayout, DatasetVersion, ShardId, ShardRows, Shuffle};
        let v = DatasetVersion([5; 16]);
        let ls = layouts();
        let (mut shards, mut chunks) = (Vec::new(), Vec::new());
        for i in 0..6u32 {
            let shard = ShardId { file: 0, row_group: i };
            let rows = 50 + u64::from(i) * 7;
            shards.push(ShardRows { shard, rows });
            let layout = ChunkLayout::new(v, shard, rows, &ls).expect("layout");
            let mut buf = AlignedBuf::zeroed(layout.total_len());
            for t in 0..ls.len() {
                for (b, byte) in buf.as_mut_slice()[layout.tensor_range(t)].iter_mut().enumerate() {
                    *byte = (b as u32 * 13 + i * 101 + t as u32) as u8;
                }
            }
            layout.seal(buf.as_mut_slice()).expect("seal");
            chunks.push((shard, buf));
        }
        let info = DatasetInfo {
            name: "t".into(),
            version: v,
            plan_key: granary_proto::PlanKey(1),
            tensors: ls.clone(),
            shards,
            files: vec!["f".into()],
            source_bytes: 0,
            mapping_budget_bytes: u64::MAX,
        };
        let src = Arc::new(MemorySource::new(info, chunks).expect("source"));
        let cfg = LoaderConfig {
            shuffle: Shuffle::Windowed { window_shards: 2 },
            assembly_threads: 3,
            ..LoaderConfig::new("t", 16)
        };
        let heap = Loader::new(src.clone(), cfg.clone()).expect("heap loader");
        let expected: Vec<Batch> = heap.epoch(0).expect("epoch").collect::<Result<_, _>>().expect("batches");
        let ls: Arc<[TensorLayout]> = ls.into();
        let feed = GpuFeed::new(0, slot_bytes(&ls, 16).expect("no overflow")).expect("feed on device 0");
        let pinned = Loader::new(src, LoaderConfig { host_memory: feed.host_memory(), ..cfg }).expect("pinned loader");
        let mut stream = GpuStream::new(feed, pinned.epoch(0).expect("epoch"));
        let mut n = 0;
        while let Some(next) = stream.next_gpu() {
            let g = next.expect("batch on the device");
            check_on_device(&g, &expected[g.position().batch as usize]);
            n += 1;
        }
        assert_eq!(n, expected.len());
    }
}
