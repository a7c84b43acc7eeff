//! Issue 30: batches of jagged tensors over an in-memory source. Rows come
//! in plan order with their own values, offsets rebased to the batch's
//! first value, whether the batch was assembled or is a view into one
//! chunk; the bytes do not depend on the assembly thread count; the
//! checksum covers the offsets; dense and jagged reads are not mixed up.

use granary_client::{Batch, Loader, LoaderConfig, MemorySource, TensorError};
use granary_proto::wire::DatasetInfo;
use granary_proto::{AlignedBuf, ChunkLayout, DType, DatasetVersion, ShardId, ShardRows, Shuffle, TensorLayout};
use proptest::prelude::*;
use std::sync::Arc;

const V: DatasetVersion = DatasetVersion([30; 16]);

fn layouts() -> Vec<TensorLayout> {
    vec![
        TensorLayout::dense("id", DType::I64, vec![]),
        TensorLayout::jagged("hist", DType::I64, vec![]),
        TensorLayout::jagged("pairs", DType::I32, vec![2]),
        TensorLayout::jagged("blob", DType::U8, vec![]),
    ]
}

/// Row `id`'s values: `hist` holds `id % 7` values (row 0 of every 7 is
/// empty), `pairs` `id % 3` values of two, `blob` `id % 11 * 5` bytes.
fn hist(id: i64) -> Vec<i64> {
    (0..id % 7).map(|k| id * 100 + k).collect()
}
fn pairs(id: i64) -> Vec<i32> {
    (0..id % 3).flat_map(|k| [id as i32, k as i32]).collect()
}
fn blob(id: i64) -> Vec<u8> {
    (0..id % 11 * 5).map(|k| (id * 7 + k) as u8).collect()
}

/// Offsets (in values) of rows with these value counts.
fn offsets(counts: impl Iterator<Item = usize>) -> Vec<u64> {
    std::iter::once(0)
        .chain(counts.scan(0u64, |acc, n| Some(std::mem::replace(acc, *acc + n as u64) + n as u64)))
        .collect()
}

/// Shard `s` holds rows with ids `s * 1000 + r`.
fn source(rows: &[u64]) -> Arc<MemorySource> {
    let (mut shards, mut chunks) = (Vec::new(), Vec::new());
    for (s, &n) in rows.iter().enumerate() {
        let shard = ShardId { file: 0, row_group: s as u32 };
        shards.push(ShardRows { shard, rows: n });
        let ids: Vec<i64> = (0..n as i64).map(|r| s as i64 * 1000 + r).collect();
        let h: Vec<i64> = ids.iter().flat_map(|&i| hist(i)).collect();
        let p: Vec<i32> = ids.iter().flat_map(|&i| pairs(i)).collect();
        let b: Vec<u8> = ids.iter().flat_map(|&i| blob(i)).collect();
        let values = [0, h.len() as u64, p.len() as u64 / 2, b.len() as u64];
        let layout = ChunkLayout::with_values(V, shard, n, &layouts(), &values).unwrap();
        let mut buf = AlignedBuf::zeroed(layout.total_len());
        let out = buf.as_mut_slice();
        out[layout.tensor_range(0)].copy_from_slice(bytemuck::cast_slice(&ids));
        out[layout.tensor_range(1)].copy_from_slice(bytemuck::cast_slice(&h));
        out[layout.tensor_range(2)].copy_from_slice(bytemuck::cast_slice(&p));
        out[layout.tensor_range(3)].copy_from_slice(&b);
        let o1 = offsets(ids.iter().map(|&i| hist(i).len()));
        let o2 = offsets(ids.iter().map(|&i| pairs(i).len() / 2));
        let o3 = offsets(ids.iter().map(|&i| blob(i).len()));
        for (t, o) in [(1, o1), (2, o2), (3, o3)] {
            out[layout.offsets_range(t).unwrap()].copy_from_slice(bytemuck::cast_slice(&o));
        }
        layout.seal(out).unwrap();
        chunks.push((shard, buf));
    }
    let info = DatasetInfo {
        name: "j".into(),
        version: V,
        plan_key: granary_proto::PlanKey(30),
        tensors: layouts(),
        shards,
        files: vec!["f".into()],
        source_bytes: 0,
        mapping_budget_bytes: u64::MAX,
    };
    Arc::new(MemorySource::new(info, chunks).unwrap())
}

/// Checks every row of `b` against its id; returns the ids.
fn check(b: &Batch) -> Vec<i64> {
    let ids = b.tensor::<i64>("id").unwrap().data().to_vec();
    let h = b.jagged::<i64>("hist").unwrap();
    let p = b.jagged::<i32>("pairs").unwrap();
    let blobs = b.bytes("blob").unwrap();
    for j in [h.offsets(), p.offsets(), blobs.offsets()] {
        assert_eq!(j.len(), ids.len() + 1);
        assert_eq!(j[0], 0, "offsets are rebased to the batch's first value");
    }
    assert_eq!(h.values().len() as u64, h.offsets()[ids.len()]);
    assert_eq!(p.values().len() as u64, 2 * p.offsets()[ids.len()]);
    assert_eq!(p.value_shape(), &[2]);
    for (k, &id) in ids.iter().enumerate() {
        assert_eq!(h.row(k).unwrap(), hist(id), "hist of row {id}");
        assert_eq!(p.row(k).unwrap(), pairs(id), "pairs of row {id}");
        assert_eq!(blobs.row(k).unwrap(), blob(id), "blob of row {id}");
    }
    let lengths: Vec<usize> = blobs.lengths().collect();
    assert_eq!(lengths, ids.iter().map(|&i| blob(i).len()).collect::<Vec<_>>());
    assert_eq!(blobs.iter().map(<[u8]>::len).collect::<Vec<_>>(), lengths);
    ids
}

/// Every batch of an epoch: its parts' bytes and its checksum.
fn epoch(src: &Arc<MemorySource>, cfg: LoaderConfig) -> Vec<(Vec<Vec<u8>>, u64)> {
    let loader = Loader::new(src.clone(), cfg).unwrap();
    loader
        .epoch(2)
        .unwrap()
        .map(|b| {
            let b = b.unwrap();
            check(&b);
            (b.parts().map(<[u8]>::to_vec).collect(), b.checksum())
        })
        .collect()
}

#[test]
fn every_row_arrives_with_its_own_values_in_plan_order() {
    let src = source(&[37, 50, 12, 41, 5]);
    for shuffle in [Shuffle::Off, Shuffle::Windowed { window_shards: 2 }, Shuffle::Blocks { window_batches: 3 }] {
        let cfg = LoaderConfig { seed: 5, shuffle, ..LoaderConfig::new("j", 8) };
        let loader = Loader::new(src.clone(), cfg).unwrap();
        let plan = loader.plan(0).unwrap();
        let mut seen = Vec::new();
        for b in loader.epoch(0).unwrap() {
            seen.extend(check(&b.unwrap()));
        }
        let want: Vec<i64> = (0..plan.num_batches())
            .flat_map(|i| plan.batch(i).iter())
            .map(|r| plan_id(&loader, r.shard_index) + i64::from(r.row))
            .collect();
        assert_eq!(seen, want, "{shuffle:?}");
    }
}

fn plan_id(loader: &Loader, shard_index: u32) -> i64 {
    i64::from(loader.info().shards[shard_index as usize].shard.row_group) * 1000
}

#[test]
fn a_batch_inside_one_chunk_is_a_view_of_its_values() {
    let src = source(&[37, 50, 12, 41, 5]);
    let cfg = LoaderConfig { seed: 2, shuffle: Shuffle::Blocks { window_batches: 3 }, ..LoaderConfig::new("j", 8) };
    let loader = Loader::new(src, cfg).unwrap();
    let mut views = 0;
    for b in loader.epoch(1).unwrap() {
        let b = b.unwrap();
        let ids = check(&b);
        if b.is_view() {
            views += 1;
            assert!(ids.windows(2).all(|w| w[1] == w[0] + 1));
        }
    }
    assert!(views > 10, "{views} views");
}

#[test]
fn dense_and_jagged_reads_are_not_mixed_up() {
    let src = source(&[20]);
    let loader = Loader::new(src, LoaderConfig { shuffle: Shuffle::Off, ..LoaderConfig::new("j", 8) }).unwrap();
    let b = loader.epoch(0).unwrap().next().unwrap().unwrap();
    let e = b.tensor::<i64>("hist").unwrap_err();
    assert!(matches!(e, TensorError::Jagged { jagged: true, .. }), "{e}");
    assert!(e.to_string().contains("batch.jagged()"), "{e}");
    assert!(matches!(b.jagged::<i64>("id"), Err(TensorError::Jagged { jagged: false, .. })));
    assert!(matches!(b.jagged::<i32>("hist"), Err(TensorError::DType { .. })));
    assert!(matches!(b.bytes("hist"), Err(TensorError::DType { .. })));
    // Parts: id, then each jagged tensor's offsets and values.
    assert_eq!(b.parts().count(), 7);
    assert_eq!(b.byte_len(), b.parts().map(<[u8]>::len).sum::<usize>());
}

#[test]
fn the_checksum_covers_the_row_offsets() {
    // Rows 1 and 2 hold hist values [100] and [200, 201]; moving the
    // boundary between them changes only the offsets, and the checksum.
    let src = source(&[20]);
    let loader = Loader::new(src, LoaderConfig { shuffle: Shuffle::Off, ..LoaderConfig::new("j", 4) }).unwrap();
    let b = loader.epoch(0).unwrap().next().unwrap().unwrap();
    let offsets: &[u8] = bytemuck::cast_slice(b.row_offsets(1).unwrap());
    assert_eq!(b.row_offsets(1).unwrap(), &[0, 0, 1, 3, 6]);
    assert!(b.parts().any(|p| std::ptr::eq(p, offsets)));
    let mut moved: Vec<Vec<u8>> = b.parts().map(<[u8]>::to_vec).collect();
    moved[1][8..16].copy_from_slice(&2u64.to_le_bytes());
    let sum = |parts: &[Vec<u8>]| {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        for p in parts {
            h.update(&(p.len() as u64).to_le_bytes());
            h.update(p);
        }
        h.digest()
    };
    let original: Vec<Vec<u8>> = b.parts().map(<[u8]>::to_vec).collect();
    assert_eq!(sum(&original), b.checksum(), "the checksum is over the parts, in order");
    assert_ne!(sum(&moved), b.checksum());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    /// The bytes of every batch (values and offsets) do not depend on the
    /// assembly thread count or lookahead, for any shard sizes, batch size
    /// and shuffle.
    #[test]
    fn the_assembly_thread_count_does_not_change_a_byte(
        rows in prop::collection::vec(1u64..60, 1..7),
        batch in 1u32..20,
        seed in 0u64..1000,
        shuffle in prop::sample::select(vec![
            Shuffle::Off,
            Shuffle::Windowed { window_shards: 3 },
            Shuffle::Blocks { window_batches: 4 },
        ]),
    ) {
        let src = source(&rows);
        let streams: Vec<_> = [(1usize, 1usize), (2, 2), (4, 3), (8, 1)]
            .iter()
            .map(|&(threads, ahead)| {
                let cfg = LoaderConfig {
                    seed,
                    world_size: 2,
                    rank: 1,
                    shuffle,
                    assembly_threads: threads,
                    prefetch_batches: ahead,
                    ..LoaderConfig::new("j", batch)
                };
                epoch(&src, cfg)
            })
            .collect();
        for s in &streams[1..] {
            prop_assert_eq!(s, &streams[0]);
        }
    }
}
