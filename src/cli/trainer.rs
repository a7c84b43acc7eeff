//! `granary trainer`: one data-parallel rank as its own process.
//!
//! Driven over stdin (`epoch N` lines) so that a driver (the demo) can keep
//! ranks in lockstep per epoch, and reporting JSON lines on stdout
//! ([`granary_testkit::harness::TrainerEvent`]). Consuming a batch means
//! checksumming it (every byte is read, and the checksums prove that two runs
//! delivered the same bytes in the same order), or with `--consume copy`
//! copying it into a staging buffer, as a trainer feeding a device would.

use anyhow::{Context, Result, bail};
use clap::Args;
use granary_bench::consume::Staging;
use granary_client::{
    Batch, ChunkSource, Loader, LoaderConfig, LocalSource, MemorySource, PlanKind, Position, ResumeState,
};
use granary_proto::{AlignedBuf, Shuffle};
use granary_testkit::harness::TrainerEvent;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Arguments of one rank.
#[derive(Args, Clone, Debug)]
pub(crate) struct TrainerArgs {
    /// The node's socket.
    #[arg(long)]
    pub socket: PathBuf,
    /// Dataset name.
    #[arg(long, default_value = "ads")]
    pub dataset: String,
    /// The dataset version the job reads (32 hex digits; default: the
    /// node's current version when the rank starts).
    #[arg(long, value_parser = parse_version)]
    pub version: Option<granary_proto::DatasetVersion>,
    /// This rank.
    #[arg(long)]
    pub rank: u32,
    /// Number of ranks.
    #[arg(long)]
    pub world: u32,
    /// Rows per batch.
    #[arg(long, default_value_t = 1024)]
    pub batch_size: u32,
    /// Job seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Shuffle window in shards (0 = no shuffle).
    #[arg(long, default_value_t = 4)]
    pub window: u32,
    /// Block shuffle in groups of this many batches instead of the windowed
    /// one (0 = windowed): batches inside one chunk are handed out in place.
    #[arg(long, default_value_t = 0)]
    pub window_batches: u32,
    /// Batch assembly threads (0: the loader's default for this machine).
    #[arg(long, default_value_t = 0)]
    pub assembly_threads: usize,
    /// Bytes of chunk mappings kept for later epochs.
    #[arg(long, default_value_t = granary_client::local::DEFAULT_MAPPING_CACHE_BYTES)]
    pub mapping_cache_bytes: u64,
    /// What consuming a batch means: checksum (proves which bytes came) or
    /// copy (into a staging buffer; the epoch digest is then empty).
    #[arg(long, value_enum, default_value_t = ConsumeArg::Checksum)]
    pub consume: ConsumeArg,
    /// Assemble epoch 1 once at start and hand out those batches every
    /// epoch (the copy scenario: the fastest any loader could feed).
    #[arg(long)]
    pub preassembled: bool,
    /// Batches assembled ahead.
    #[arg(long, default_value_t = 2)]
    pub prefetch_batches: usize,
    /// Copy every chunk into this process first (the in-RAM ceiling).
    #[arg(long)]
    pub ceiling: bool,
    /// Also write every batch's tensor bytes to DIR/rank-R-epoch-E.bin
    /// (tests compare them byte for byte).
    #[arg(long)]
    pub dump: Option<PathBuf>,
    /// Walk the global plan with global batches of this many rows (each
    /// rank gets global-batch / world of each); 0: the rank plan with
    /// --batch-size.
    #[arg(long, default_value_t = 0)]
    pub global_batch: u32,
    /// Canonical partitions of the global plan.
    #[arg(long, default_value_t = 1)]
    pub partitions: u32,
    /// Resume from this saved state (`granary_client::ResumeState` as
    /// JSON): its dataset, version and plan, with this rank and world.
    #[arg(long)]
    pub resume: Option<PathBuf>,
}

fn parse_version(s: &str) -> Result<granary_proto::DatasetVersion, String> {
    granary_proto::DatasetVersion::from_hex(s).ok_or_else(|| format!("not a dataset version (32 hex digits): {s:?}"))
}

/// What consuming a batch means.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConsumeArg {
    /// xxh3 of every tensor.
    Checksum,
    /// A copy of every tensor into a staging buffer.
    Copy,
}

fn emit(ev: &TrainerEvent) {
    // stdout is the protocol channel; a closed pipe means the driver is
    // gone, and the next read of stdin ends the rank.
    if let Ok(line) = serde_json::to_string(ev) {
        println!("{line}");
    }
}

/// Runs the rank until stdin closes.
pub(crate) fn run(a: TrainerArgs) -> Result<()> {
    let rank = a.rank;
    match drive(a) {
        Ok(()) => Ok(()),
        Err(e) => {
            emit(&TrainerEvent::Error { rank, message: format!("{e:#}") });
            Err(e)
        }
    }
}

fn drive(a: TrainerArgs) -> Result<()> {
    let source = Arc::new(LocalSource::connect(&a.socket)?.mapping_cache(a.mapping_cache_bytes));
    let shuffle = match (a.window_batches, a.window) {
        (0, 0) => Shuffle::Off,
        (0, w) => Shuffle::Windowed { window_shards: w },
        (b, _) => Shuffle::Blocks { window_batches: b },
    };
    let resume: Option<ResumeState> = match &a.resume {
        Some(path) => Some(
            serde_json::from_slice(&std::fs::read(path).with_context(|| format!("reading {}", path.display()))?)
                .with_context(|| format!("{} is not a resume state", path.display()))?,
        ),
        None => None,
    };
    let base = match &resume {
        Some(state) => LoaderConfig::resuming(state),
        None => LoaderConfig {
            version: a.version,
            seed: a.seed,
            shuffle,
            plan: match a.global_batch {
                0 => PlanKind::Rank,
                g => PlanKind::Global { global_batch: g, partitions: a.partitions },
            },
            ..LoaderConfig::new(a.dataset.clone(), a.batch_size)
        },
    };
    let cfg = LoaderConfig {
        rank: a.rank,
        world_size: a.world,
        prefetch_batches: a.prefetch_batches,
        assembly_threads: a.assembly_threads,
        mapping_cache_bytes: a.mapping_cache_bytes,
        ..base
    };
    let loader = if a.ceiling {
        let info = source.describe(&a.dataset, a.version)?;
        let mut chunks = Vec::with_capacity(info.shards.len());
        for s in &info.shards {
            let c = source.fetch(info.version, s.shard).with_context(|| format!("copying {}", s.shard))?;
            chunks.push((s.shard, AlignedBuf::from_slice(c.bytes())));
        }
        Loader::new(Arc::new(MemorySource::new(info, chunks)?), cfg)?
    } else {
        Loader::new(source, cfg)?
    };
    let preassembled: Option<Vec<Batch>> =
        if a.preassembled { Some(loader.epoch(1)?.collect::<Result<_, _>>()?) } else { None };
    let mut staging = Staging::new(0);
    emit(&TrainerEvent::Ready { rank: a.rank, batches: loader.num_batches(0)? as u64 });
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        if let Some(args) = line.strip_prefix("steps ") {
            run_steps(&loader, a.rank, args, resume.as_ref())?;
            continue;
        }
        let Some(epoch) = line.strip_prefix("epoch ").and_then(|n| n.trim().parse::<u64>().ok()) else {
            bail!("unexpected command {line:?} (expected `epoch N` or `steps EPOCH FROM TO`)");
        };
        let start = Instant::now();
        // Batches are borrowed from the preassembled epoch, or owned as they
        // come from the loader.
        let mut stream: Box<dyn Iterator<Item = Result<Held<'_>>>> = match &preassembled {
            Some(batches) => Box::new(batches.iter().map(|b| Ok(Held::Borrowed(b)))),
            None => Box::new(loader.epoch(epoch)?.map(|b| b.map(Held::Owned).map_err(anyhow::Error::from))),
        };
        let total = loader.num_batches(epoch)? as u64;
        let every = (total / 20).max(1);
        let (mut rows, mut bytes, mut done) = (0u64, 0u64, 0u64);
        let mut digest = xxhash_rust::xxh3::Xxh3::new();
        let mut dump = match &a.dump {
            Some(dir) => {
                let path = dir.join(format!("rank-{}-epoch-{epoch}.bin", a.rank));
                Some(std::io::BufWriter::new(
                    std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?,
                ))
            }
            None => None,
        };
        for batch in stream.by_ref() {
            let batch = batch?;
            let batch: &Batch = match &batch {
                Held::Owned(b) => b,
                Held::Borrowed(b) => b,
            };
            if let Some(w) = dump.as_mut() {
                for part in batch.parts() {
                    w.write_all(part)?;
                }
            }
            rows += batch.rows() as u64;
            match a.consume {
                ConsumeArg::Checksum => {
                    bytes += batch.byte_len() as u64;
                    digest.update(&batch.checksum().to_le_bytes());
                }
                ConsumeArg::Copy => bytes += staging.consume(batch),
            }
            done += 1;
            if done % every == 0 {
                emit(&TrainerEvent::Progress { rank: a.rank, epoch, done });
            }
        }
        if let Some(mut w) = dump.take() {
            w.flush()?;
        }
        emit(&TrainerEvent::Epoch {
            rank: a.rank,
            epoch,
            rows,
            bytes,
            secs: start.elapsed().as_secs_f64(),
            digest: format!("{:016x}", digest.digest()),
        });
    }
    Ok(())
}

/// `steps EPOCH FROM TO`: batches `FROM..TO` of the epoch, each reported
/// by the rows it held, then the resume state at `TO`. A rank started with
/// `--resume` checks that the state is its loader's (any world size, with
/// the global plan) and starts there.
fn run_steps(loader: &Loader, rank: u32, args: &str, resume: Option<&ResumeState>) -> Result<()> {
    let n: Vec<u64> = args.split_whitespace().map(str::parse).collect::<Result<_, _>>()?;
    let [epoch, from, to] = n[..] else { bail!("expected `steps EPOCH FROM TO`, got `steps {args}`") };
    let total = loader.num_batches(epoch)? as u64;
    if from > to || to > total {
        bail!("steps {from}..{to} of epoch {epoch}: the epoch has {total} batches");
    }
    let at = Position { epoch, batch: from };
    let stream = match resume {
        Some(state) if state.position() == at => {
            let mine = ResumeState { rank, world_size: loader.config().world_size, ..state.clone() };
            loader.resume_from(&mine)?
        }
        _ => loader.resume(at)?,
    };
    for (step, batch) in (from..to).zip(stream) {
        let batch = batch?;
        emit(&TrainerEvent::Rows { rank, epoch, step, rows: batch.row_digests() });
    }
    let state = serde_json::to_string(&loader.state_at(Position { epoch, batch: to }))?;
    emit(&TrainerEvent::Stopped { rank, epoch, next: to, state });
    Ok(())
}

/// A batch as the epoch loop gets it.
enum Held<'a> {
    Owned(Batch),
    Borrowed(&'a Batch),
}
