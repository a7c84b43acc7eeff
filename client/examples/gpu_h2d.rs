//! Host-to-device throughput of the GPU feed against a bare pinned copy, in
//! one run (feature `cuda`; needs a CUDA device, and says "skipped" without
//! one).
//!
//! ```sh
//! cargo run --release -p granary-client --features cuda --example gpu_h2d
//! ```
//!
//! Three measurements of the same bytes (batches of the benchmark dataset's
//! shape: 150 f32 features, a 32-wide f32 embedding, two i64 ids, an f32
//! label, 748 bytes a row):
//! - `bare`: one page-locked buffer of one batch, copied to one device
//!   buffer with `cuMemcpyHtoDAsync` once per batch, on one stream;
//! - `stream_preassembled`: [`GpuStream`] over batches the loader already
//!   assembled into the feed's page-locked memory (the device copy alone);
//! - `stream_loader`: [`GpuStream`] over a live loader assembling into that
//!   memory (the gather on the host and the copy together).
//!
//! Prints one JSON object with GB/s of each and `stream_vs_bare`.

#[cfg(feature = "cuda")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    use granary_client::cuda::{GpuFeed, GpuStream, cuda_available, slot_bytes};
    use granary_client::{Batch, Loader, LoaderConfig, MemorySource};
    use granary_proto::wire::DatasetInfo;
    use granary_proto::{AlignedBuf, ChunkLayout, DType, DatasetVersion, ShardId, ShardRows, Shuffle, TensorLayout};
    use std::sync::Arc;
    use std::time::Instant;

    if !cuda_available() {
        println!("skipped: no CUDA device");
        return Ok(());
    }
    let arg = |name: &str, default: usize| -> usize {
        std::env::args().skip_while(|a| a != name).nth(1).and_then(|v| v.parse().ok()).unwrap_or(default)
    };
    let (shards_n, shard_rows, batch_rows, epochs) =
        (arg("--shards", 64), arg("--shard-rows", 10_000), arg("--batch-size", 4096), arg("--epochs", 3));
    let threads = arg("--assembly-threads", 0);

    // A dataset of the benchmark's shape, converted chunks held in memory.
    let v = DatasetVersion([9; 16]);
    let tensors = vec![
        TensorLayout { name: "dense".into(), dtype: DType::F32, shape: vec![150], jagged: false },
        TensorLayout { name: "emb".into(), dtype: DType::F32, shape: vec![32], jagged: false },
        TensorLayout { name: "ids".into(), dtype: DType::I64, shape: vec![2], jagged: false },
        TensorLayout { name: "label".into(), dtype: DType::F32, shape: vec![], jagged: false },
    ];
    let (mut shards, mut chunks) = (Vec::new(), Vec::new());
    for i in 0..shards_n as u32 {
        let shard = ShardId { file: 0, row_group: i };
        shards.push(ShardRows { shard, rows: shard_rows as u64 });
        let layout = ChunkLayout::new(v, shard, shard_rows as u64, &tensors)?;
        let mut buf = AlignedBuf::zeroed(layout.total_len());
        for (k, b) in buf.as_mut_slice().iter_mut().enumerate() {
            *b = (k as u32).wrapping_mul(2_654_435_761).wrapping_add(i) as u8;
        }
        layout.seal(buf.as_mut_slice())?;
        chunks.push((shard, buf));
    }
    let info = DatasetInfo {
        name: "h2d".into(),
        version: v,
        plan_key: granary_proto::PlanKey(1),
        tensors: tensors.clone(),
        shards,
        files: vec![],
        source_bytes: 0,
        mapping_budget_bytes: u64::MAX,
    };
    let source = Arc::new(MemorySource::new(info, chunks)?);
    let layouts: Arc<[TensorLayout]> = tensors.into();
    let cap = slot_bytes(&layouts, batch_rows).ok_or("batch too large")?;
    let feed = GpuFeed::new(0, cap)?;
    let cfg = LoaderConfig {
        shuffle: Shuffle::Windowed { window_shards: 4 },
        assembly_threads: threads,
        host_memory: feed.host_memory(),
        ..LoaderConfig::new("h2d", batch_rows as u32)
    };
    let loader = Loader::new(source, cfg)?;
    let epoch_bytes: usize = loader
        .epoch(0)?
        .map(|b| b.map(|b| slot_bytes(b.layouts(), b.rows()).unwrap_or(0)))
        .sum::<Result<usize, _>>()?;
    let batches = loader.num_batches(0)?;
    let gbps = |bytes: usize, secs: f64| bytes as f64 / secs / 1e9;

    // bare: the same bytes per batch, one pinned buffer, one device buffer.
    let ctx = feed.context().clone();
    let stream = ctx.new_stream()?;
    // SAFETY: filled below before use.
    let mut host = unsafe { ctx.alloc_pinned_with_flags::<u8>(cap, 0) }?;
    host.as_mut_slice()?.fill(7);
    let mut dev = stream.alloc_zeros::<u8>(cap)?;
    let mut bare = 0.0f64;
    for _ in 0..epochs {
        let start = Instant::now();
        for _ in 0..batches {
            stream.memcpy_htod(&host, &mut dev)?;
        }
        stream.synchronize()?;
        bare = bare.max(gbps(cap * batches, start.elapsed().as_secs_f64()));
    }

    // The feed over preassembled pinned batches, then over the live loader.
    let mut stream_pre = 0.0f64;
    let mut stream_live = 0.0f64;
    let mut feed = Some(feed);
    for e in 0..epochs as u64 {
        let pre: Vec<Batch> = loader.epoch(e)?.collect::<Result<_, _>>()?;
        let start = Instant::now();
        let mut gpu = GpuStream::new(feed.take().ok_or("feed")?, pre.into_iter().map(Ok));
        while let Some(b) = gpu.next_gpu() {
            b?;
        }
        gpu.feed().stream().synchronize()?;
        stream_pre = stream_pre.max(gbps(epoch_bytes, start.elapsed().as_secs_f64()));
        let (f, _) = gpu.into_parts();

        let start = Instant::now();
        let mut gpu = GpuStream::new(f, loader.epoch(e)?);
        while let Some(b) = gpu.next_gpu() {
            b?;
        }
        gpu.feed().stream().synchronize()?;
        stream_live = stream_live.max(gbps(epoch_bytes, start.elapsed().as_secs_f64()));
        feed = Some(gpu.into_parts().0);
    }
    println!(
        "{{\"bare_gbps\":{bare:.3},\"stream_preassembled_gbps\":{stream_pre:.3},\"stream_loader_gbps\":{stream_live:.3},\"stream_vs_bare\":{:.3},\"loader_vs_bare\":{:.3},\"batch_rows\":{batch_rows},\"batches\":{batches},\"assembly_threads\":{}}}",
        stream_pre / bare.max(f64::MIN_POSITIVE),
        stream_live / bare.max(f64::MIN_POSITIVE),
        loader.config().threads()
    );
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn main() {
    println!("skipped: built without the cuda feature (add --features cuda)");
}
