//! Loader behaviour over an in-memory source: resume, equivalence across
//! lookahead settings, bounded shutdown, and typed views.

use granary_client::{
    ChunkSource, ClientError, Loader, LoaderConfig, MemorySource, Position, ResumeState, TensorError,
};
use granary_proto::wire::DatasetInfo;
use granary_proto::{AlignedBuf, ChunkLayout, DType, DatasetVersion, ShardId, ShardRows, Shuffle, TensorLayout};
use std::sync::Arc;

const V: DatasetVersion = DatasetVersion([3; 16]);

fn layouts() -> Vec<TensorLayout> {
    vec![
        TensorLayout { name: "x".into(), dtype: DType::F32, shape: vec![3], jagged: false },
        TensorLayout { name: "id".into(), dtype: DType::I64, shape: vec![], jagged: false },
    ]
}

/// Shard `s` row `r`: x = [s*1000 + r, .., ..], id = s*1000 + r.
fn source(rows: &[u64]) -> Arc<MemorySource> {
    let mut shards = Vec::new();
    let mut chunks = Vec::new();
    for (i, &n) in rows.iter().enumerate() {
        let shard = ShardId { file: 0, row_group: i as u32 };
        shards.push(ShardRows { shard, rows: n });
        let layout = ChunkLayout::new(V, shard, n, &layouts()).unwrap();
        let mut buf = AlignedBuf::zeroed(layout.total_len());
        let base = i as u64 * 1000;
        let x: Vec<f32> = (0..n).flat_map(|r| [0.0, 1.0, 2.0].map(|k| (base + r) as f32 + k / 10.0)).collect();
        let ids: Vec<i64> = (0..n).map(|r| (base + r) as i64).collect();
        buf.as_mut_slice()[layout.tensor_range(0)].copy_from_slice(bytemuck::cast_slice(&x));
        buf.as_mut_slice()[layout.tensor_range(1)].copy_from_slice(bytemuck::cast_slice(&ids));
        layout.seal(buf.as_mut_slice()).unwrap();
        chunks.push((shard, buf));
    }
    let info = DatasetInfo {
        name: "t".into(),
        version: V,
        plan_key: granary_proto::PlanKey(3),
        tensors: layouts(),
        shards,
        files: vec!["f".into()],
        source_bytes: 0,
        mapping_budget_bytes: u64::MAX,
    };
    Arc::new(MemorySource::new(info, chunks).unwrap())
}

fn ids(loader: &Loader, pos: Position) -> Vec<Vec<i64>> {
    loader.resume(pos).unwrap().map(|b| b.unwrap().tensor::<i64>("id").unwrap().data().to_vec()).collect()
}

#[test]
fn resume_continues_at_exactly_the_next_batch() {
    let src = source(&[37, 50, 12, 41, 5]);
    let cfg = LoaderConfig { seed: 9, world_size: 2, rank: 1, ..LoaderConfig::new("t", 8) };
    let loader = Loader::new(src.clone(), cfg).unwrap();
    let full = ids(&loader, Position { epoch: 2, batch: 0 });
    let mut stream = loader.epoch(2).unwrap();
    let mut head = Vec::new();
    for _ in 0..3 {
        head.push(stream.next().unwrap().unwrap().tensor::<i64>("id").unwrap().data().to_vec());
    }
    let saved = stream.state();
    assert_eq!(saved.position(), Position { epoch: 2, batch: 3 });
    assert_eq!((saved.version, saved.seed, saved.world_size, saved.rank), (V, 9, 2, 1));
    drop(stream);
    // Through a checkpoint (JSON) into a loader made from the state alone.
    let saved: ResumeState = serde_json::from_str(&serde_json::to_string(&saved).unwrap()).unwrap();
    let resumed = Loader::new(src, LoaderConfig::resuming(&saved)).unwrap();
    let tail: Vec<Vec<i64>> =
        resumed.resume_from(&saved).unwrap().map(|b| b.unwrap().tensor::<i64>("id").unwrap().data().to_vec()).collect();
    head.extend(tail);
    assert_eq!(head, full);
}

#[test]
fn a_state_saved_under_other_parameters_is_refused_naming_the_difference() {
    let src = source(&[37, 50, 12, 41, 5]);
    let cfg = LoaderConfig { seed: 9, world_size: 2, rank: 1, ..LoaderConfig::new("t", 8) };
    let saved = Loader::new(src.clone(), cfg.clone()).unwrap().state_at(Position { epoch: 1, batch: 2 });
    for (now, field) in [
        (LoaderConfig { world_size: 4, ..cfg.clone() }, "world_size"),
        (LoaderConfig { seed: 10, ..cfg.clone() }, "seed"),
        (LoaderConfig { rank: 0, ..cfg.clone() }, "rank"),
        (LoaderConfig { batch_size: 16, ..cfg.clone() }, "batch_size"),
        (LoaderConfig { shuffle: Shuffle::Off, ..cfg.clone() }, "shuffle"),
        (LoaderConfig { drop_last: true, ..cfg.clone() }, "drop_last"),
    ] {
        let loader = Loader::new(src.clone(), now).unwrap();
        match loader.resume_from(&saved) {
            Err(ClientError::ResumeMismatch(m)) => assert_eq!(m.field, field, "{m}"),
            Err(e) => panic!("{field}: expected a mismatch, got {e}"),
            Ok(_) => panic!("{field}: a changed {field} was resumed"),
        }
    }
    // Another version: the state names the one its job read.
    let other = ResumeState { version: DatasetVersion([4; 16]), ..saved.clone() };
    let loader = Loader::new(src.clone(), cfg).unwrap();
    let e = loader.resume_from(&other).err().expect("another version is refused");
    assert!(e.to_string().contains("version"), "{e}");
    assert!(loader.resume_from(&saved).is_ok());
}

#[test]
fn a_position_past_the_end_of_its_epoch_is_an_error_and_the_end_itself_is_empty() {
    let loader = Loader::new(source(&[10, 10]), LoaderConfig::new("t", 4)).unwrap();
    let n = loader.num_batches(0).unwrap() as u64;
    assert_eq!(loader.resume(Position { epoch: 0, batch: n }).unwrap().count(), 0);
    match loader.resume(Position { epoch: 0, batch: n + 1 }) {
        Err(ClientError::PositionPastEnd { batch, batches, .. }) => assert_eq!((batch, batches), (n + 1, n)),
        Err(e) => panic!("expected PositionPastEnd, got {e}"),
        Ok(_) => panic!("a position past the end was clamped"),
    }
}

#[test]
fn a_loader_pinned_to_a_version_the_source_does_not_serve_fails_naming_both() {
    let cfg = LoaderConfig { version: Some(DatasetVersion([4; 16])), ..LoaderConfig::new("t", 4) };
    match Loader::new(source(&[10]), cfg) {
        Err(ClientError::VersionGone { dataset, version, current }) => {
            assert_eq!((dataset.as_str(), version, current), ("t", DatasetVersion([4; 16]), Some(V)))
        }
        Err(e) => panic!("expected VersionGone, got {e}"),
        Ok(_) => panic!("a loader read another version than its job pinned"),
    }
    let pinned = LoaderConfig { version: Some(V), ..LoaderConfig::new("t", 4) };
    assert_eq!(Loader::new(source(&[10]), pinned).unwrap().version(), V);
}

#[test]
fn lookahead_does_not_change_the_stream() {
    let src = source(&[37, 50, 12, 41, 5]);
    let streams: Vec<Vec<Vec<i64>>> = [1usize, 2, 7]
        .iter()
        .map(|&ahead| {
            let cfg = LoaderConfig {
                seed: 4,
                prefetch_batches: ahead,
                shuffle: Shuffle::Windowed { window_shards: 2 },
                ..LoaderConfig::new("t", 16)
            };
            ids(&Loader::new(src.clone(), cfg).unwrap(), Position { epoch: 0, batch: 0 })
        })
        .collect();
    assert_eq!(streams[0], streams[1]);
    assert_eq!(streams[0], streams[2]);
    let total: usize = streams[0].iter().map(Vec::len).sum();
    assert_eq!(total, 145);
}

/// Every tensor's bytes of every batch of an epoch.
fn bytes(loader: &Loader, epoch: u64) -> Vec<Vec<Vec<u8>>> {
    loader
        .epoch(epoch)
        .unwrap()
        .map(|b| {
            let b = b.unwrap();
            (0..b.layouts().len()).map(|i| b.tensor_bytes(i).to_vec()).collect()
        })
        .collect()
}

#[test]
fn the_assembly_thread_count_does_not_change_a_byte() {
    let src = source(&[37, 50, 12, 41, 5, 64, 3]);
    for shuffle in [Shuffle::Off, Shuffle::Windowed { window_shards: 3 }, Shuffle::Blocks { window_batches: 4 }] {
        let streams: Vec<_> = [1usize, 2, 4, 8]
            .iter()
            .map(|&threads| {
                let cfg = LoaderConfig {
                    seed: 11,
                    world_size: 2,
                    rank: 1,
                    shuffle,
                    assembly_threads: threads,
                    prefetch_batches: 3,
                    ..LoaderConfig::new("t", 6)
                };
                bytes(&Loader::new(src.clone(), cfg).unwrap(), 3)
            })
            .collect();
        assert!(streams[0].len() > 5, "{shuffle:?}");
        for s in &streams[1..] {
            assert_eq!(s, &streams[0], "{shuffle:?}");
        }
    }
}

#[test]
fn block_batches_inside_one_chunk_are_views_and_hold_its_rows() {
    let src = source(&[37, 50, 12, 41, 5]);
    let cfg = LoaderConfig { seed: 2, shuffle: Shuffle::Blocks { window_batches: 3 }, ..LoaderConfig::new("t", 8) };
    let loader = Loader::new(src, cfg).unwrap();
    let (mut views, mut total) = (0, 0);
    for b in loader.epoch(1).unwrap() {
        let b = b.unwrap();
        let ids = b.tensor::<i64>("id").unwrap().data().to_vec();
        let one_chunk = ids.windows(2).all(|w| w[1] == w[0] + 1);
        // A batch is a view exactly when its rows are one run of one chunk.
        assert_eq!(b.is_view(), one_chunk, "{ids:?}");
        let x = b.tensor::<f32>("x").unwrap();
        for (k, id) in ids.iter().enumerate() {
            assert_eq!(x.data()[3 * k], *id as f32);
        }
        views += usize::from(b.is_view());
        total += 1;
    }
    assert_eq!(total, 145usize.div_ceil(8));
    assert!(views >= total - 5, "{views} of {total} batches were views");
}

#[test]
fn typed_views_have_shapes_and_check_dtypes() {
    let src = source(&[10]);
    let loader = Loader::new(src, LoaderConfig { shuffle: Shuffle::Off, ..LoaderConfig::new("t", 4) }).unwrap();
    let batch = loader.epoch(0).unwrap().next().unwrap().unwrap();
    let x = batch.tensor::<f32>("x").unwrap();
    assert_eq!(x.shape(), &[4, 3]);
    assert_eq!(&x.data()[..3], &[0.0, 0.1, 0.2]);
    assert!(matches!(batch.tensor::<i64>("x"), Err(TensorError::DType { .. })));
    assert!(matches!(batch.tensor::<f32>("nope"), Err(TensorError::Unknown(_))));
    assert_eq!(batch.tensor_bytes(0).as_ptr() as usize % 64, 0);
}

#[test]
fn dropping_a_stream_midway_stops_its_thread() {
    let src = source(&[500, 500, 500]);
    let loader = Loader::new(src, LoaderConfig { prefetch_batches: 1, ..LoaderConfig::new("t", 2) }).unwrap();
    for _ in 0..20 {
        let mut s = loader.epoch(0).unwrap();
        let _ = s.next();
        // Drop joins the producer; a hang here fails the test by timeout.
    }
}

/// A source whose fetch fails: the error reaches the consumer, named.
struct Failing(Arc<MemorySource>);

impl ChunkSource for Failing {
    fn describe(&self, d: &str, v: Option<DatasetVersion>) -> Result<DatasetInfo, ClientError> {
        self.0.describe(d, v)
    }
    fn fetch(&self, _: DatasetVersion, shard: ShardId) -> Result<granary_client::Chunk, ClientError> {
        Err(ClientError::Node {
            kind: granary_proto::wire::ErrorKind::BadInput,
            message: format!("shard {shard}: corrupt"),
        })
    }
}

#[test]
fn fetch_errors_end_the_epoch_with_the_error() {
    let loader = Loader::new(Arc::new(Failing(source(&[10, 10]))), LoaderConfig::new("t", 4)).unwrap();
    let mut s = loader.epoch(0).unwrap();
    match s.next() {
        Some(Err(ClientError::Node { message, .. })) => assert!(message.contains("corrupt")),
        other => panic!("expected the fetch error, got {other:?}"),
    }
    assert!(s.next().is_none());
}

/// The rows every rank of a world of `world` delivers for the steps of
/// epoch `epoch` from `from` to `to`, step by step, ranks in order; each
/// rank's loader made from `state` (as a restarted job makes them), or
/// fresh when there is none.
fn global_rows(
    src: &Arc<MemorySource>,
    state: Option<&ResumeState>,
    world: u32,
    epoch: u64,
    steps: std::ops::Range<u64>,
) -> Vec<Vec<i64>> {
    let loaders: Vec<Loader> = (0..world)
        .map(|rank| {
            let cfg = match state {
                Some(s) => LoaderConfig { world_size: world, rank, ..LoaderConfig::resuming(s) },
                None => LoaderConfig {
                    seed: 4,
                    shuffle: Shuffle::Windowed { window_shards: 2 },
                    ..LoaderConfig::global("t", 12, 3, world, rank)
                },
            };
            Loader::new(src.clone(), cfg).unwrap()
        })
        .collect();
    let mut streams: Vec<_> = loaders
        .iter()
        .map(|l| match state {
            Some(s) => l.resume_from(&ResumeState { world_size: world, rank: l.config().rank, ..s.clone() }).unwrap(),
            None => l.resume(Position { epoch, batch: steps.start }).unwrap(),
        })
        .collect();
    steps
        .map(|_| {
            streams
                .iter_mut()
                .flat_map(|s| s.next().unwrap().unwrap().tensor::<i64>("id").unwrap().data().to_vec())
                .collect()
        })
        .collect()
}

#[test]
fn a_global_plan_job_resumes_on_another_world_size_with_the_same_rows() {
    let src = source(&[37, 50, 12, 41, 5, 29, 18]);
    let one = Loader::new(
        src.clone(),
        LoaderConfig {
            seed: 4,
            shuffle: Shuffle::Windowed { window_shards: 2 },
            ..LoaderConfig::global("t", 12, 3, 1, 0)
        },
    )
    .unwrap();
    let steps = one.num_batches(1).unwrap() as u64;
    assert_eq!(steps, 192u64.div_ceil(12));
    let reference = global_rows(&src, None, 1, 1, 0..steps);
    // Every row of the epoch once.
    let mut all: Vec<i64> = reference.concat();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), 192);

    // Four ranks, stopped after step 5; the state rank 2 saved resumes on
    // two ranks, then again on three.
    let four = global_rows(&src, None, 4, 1, 0..6);
    assert_eq!(four, reference[..6]);
    let rank2 = Loader::new(
        src.clone(),
        LoaderConfig {
            seed: 4,
            shuffle: Shuffle::Windowed { window_shards: 2 },
            ..LoaderConfig::global("t", 12, 3, 4, 2)
        },
    )
    .unwrap();
    assert_eq!(rank2.config().batch_size, 3, "the global batch over the world size");
    let saved = rank2.state_at(Position { epoch: 1, batch: 6 });
    let two = global_rows(&src, Some(&saved), 2, 1, 6..11);
    assert_eq!(two, reference[6..11]);
    let saved = ResumeState { batch: 11, ..saved };
    let three = global_rows(&src, Some(&saved), 3, 1, 11..steps);
    assert_eq!(three, reference[11..]);

    // A world size that does not divide the global batch is refused by name.
    let err = Loader::new(src.clone(), LoaderConfig::global("t", 12, 3, 5, 0)).err().expect("5 does not divide 12");
    assert!(err.to_string().contains("world of 5 ranks"), "{err}");
    // The rank plan's whole-epoch view is not a global loader's.
    assert!(matches!(rank2.plan(1), Err(ClientError::Plan(granary_proto::PlanError::NotTheRankPlan))));
    assert!(rank2.global_plan(1).unwrap().is_some());
}

#[test]
fn row_digests_name_rows_whatever_batch_holds_them() {
    let src = source(&[37, 50, 12]);
    let digests = |batch_size| -> Vec<u64> {
        let cfg = LoaderConfig { shuffle: Shuffle::Off, ..LoaderConfig::new("t", batch_size) };
        let loader = Loader::new(src.clone(), cfg).unwrap();
        loader.epoch(0).unwrap().flat_map(|b| b.unwrap().row_digests()).collect()
    };
    let small = digests(7);
    assert_eq!(small.len(), 99);
    assert_eq!(small, digests(64), "the same rows in the same order, cut differently");
    let mut unique = small.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), 99, "rows of different values differ");
}
