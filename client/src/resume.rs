//! A rank's whole resume state: the dataset version its job pinned, every
//! plan parameter that decides which rows its batches hold and in what
//! order, and where it is. A trainer saves it in its checkpoint (it
//! serialises with serde) and resumes from it with
//! [`crate::Loader::resume_from`], which refuses a state that another
//! version or other parameters would read differently.

use crate::position::Position;
use granary_proto::{DatasetVersion, Shuffle};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Which plan a loader walks.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PlanKind {
    /// The rank plan: rank `r` of `W` reads the `r`-th `1/W` of the epoch's
    /// rows, in batches of `batch_size`. Its order depends on the world
    /// size: a state resumes only on the same world size and rank.
    #[default]
    Rank,
    /// The global plan ([`granary_proto::GlobalPlan`]): global batches of
    /// `global_batch` rows drawn from `partitions` canonical partitions;
    /// each rank takes its slice (`global_batch / world_size` rows) of each.
    /// The same global order on every world size dividing `global_batch`:
    /// a state resumes on any of them, at the same global step.
    Global {
        /// Rows of one global step, all ranks together.
        global_batch: u32,
        /// Canonical partitions, fixed for the job (`1..=global_batch`).
        partitions: u32,
    },
}

impl std::fmt::Display for PlanKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PlanKind::Rank => write!(f, "the rank plan"),
            PlanKind::Global { global_batch, partitions } => {
                write!(f, "the global plan (global batch {global_batch}, {partitions} partitions)")
            }
        }
    }
}

/// Everything that defines a rank's batches, and its place in them.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ResumeState {
    /// Dataset name.
    pub dataset: String,
    /// The dataset version the job reads (32 hex digits in JSON).
    pub version: DatasetVersion,
    /// The job's seed.
    pub seed: u64,
    /// This rank.
    pub rank: u32,
    /// Number of data-parallel ranks.
    pub world_size: u32,
    /// Rows per batch.
    pub batch_size: u32,
    /// Shuffle settings.
    pub shuffle: Shuffle,
    /// Whether rows that do not fill a batch on every rank are dropped.
    pub drop_last: bool,
    /// The plan walked (states saved before plan kinds existed are of the
    /// rank plan).
    #[serde(default)]
    pub plan: PlanKind,
    /// The epoch of the next batch.
    pub epoch: u64,
    /// The index of the next batch within its epoch (with the global plan,
    /// the next global step: the same on every rank).
    pub batch: u64,
}

/// A saved state that the loader it is given to would read differently.
#[derive(Clone, PartialEq, Eq, Debug, Error)]
#[error("cannot resume: the saved state has {field} {saved}, this loader {now}")]
pub struct ResumeMismatch {
    /// The field that differs.
    pub field: &'static str,
    /// Its value in the saved state.
    pub saved: String,
    /// Its value in the loader.
    pub now: String,
}

impl ResumeState {
    /// The place in the plan.
    pub fn position(&self) -> Position {
        Position { epoch: self.epoch, batch: self.batch }
    }

    /// The first field that decides the batches (everything but the
    /// position) in which `self`, a saved state, differs from `now`, the
    /// state of the loader asked to resume it. With the global plan the
    /// world size, rank and per-rank batch size are free: the global steps
    /// are the same on every world size.
    pub fn mismatch(&self, now: &ResumeState) -> Option<ResumeMismatch> {
        let differ = |field: &'static str, saved: String, now: String| {
            (saved != now).then_some(ResumeMismatch { field, saved, now })
        };
        let shuffle = |s: &Shuffle| match s {
            Shuffle::Off => "off".to_string(),
            Shuffle::Windowed { window_shards } => format!("windows of {window_shards} shards"),
            Shuffle::Blocks { window_batches } => format!("blocks permuted in groups of {window_batches} batches"),
        };
        let elastic = matches!(self.plan, PlanKind::Global { .. });
        differ("dataset", format!("{:?}", self.dataset), format!("{:?}", now.dataset))
            .or_else(|| differ("version", self.version.to_hex(), now.version.to_hex()))
            .or_else(|| differ("plan", self.plan.to_string(), now.plan.to_string()))
            .or_else(|| differ("seed", self.seed.to_string(), now.seed.to_string()))
            .or_else(|| {
                (!elastic)
                    .then(|| {
                        differ("world_size", self.world_size.to_string(), now.world_size.to_string())
                            .or_else(|| differ("rank", self.rank.to_string(), now.rank.to_string()))
                            .or_else(|| differ("batch_size", self.batch_size.to_string(), now.batch_size.to_string()))
                    })
                    .flatten()
            })
            .or_else(|| differ("shuffle", shuffle(&self.shuffle), shuffle(&now.shuffle)))
            .or_else(|| differ("drop_last", self.drop_last.to_string(), now.drop_last.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> ResumeState {
        ResumeState {
            dataset: "ads".into(),
            version: DatasetVersion([7; 16]),
            seed: 1,
            rank: 2,
            world_size: 4,
            batch_size: 256,
            shuffle: Shuffle::Windowed { window_shards: 4 },
            drop_last: false,
            plan: PlanKind::Rank,
            epoch: 3,
            batch: 17,
        }
    }

    #[test]
    fn a_global_plan_state_resumes_on_another_world_size_but_not_another_plan() {
        let global = PlanKind::Global { global_batch: 1024, partitions: 16 };
        let saved = ResumeState { plan: global, ..state() };
        let now = ResumeState { world_size: 2, rank: 0, batch_size: 512, epoch: 0, batch: 0, ..saved.clone() };
        assert_eq!(saved.mismatch(&now), None, "any world size dividing the global batch");
        let other = ResumeState { plan: PlanKind::Global { global_batch: 1024, partitions: 8 }, ..now.clone() };
        let m = saved.mismatch(&other).expect("another partitioning is another order");
        assert_eq!(m.field, "plan");
        assert!(m.to_string().contains("16 partitions"), "{m}");
        let rank_plan = ResumeState { plan: PlanKind::Rank, ..state() };
        assert_eq!(saved.mismatch(&rank_plan).expect("another kind").field, "plan");
    }

    #[test]
    fn a_state_saved_before_plan_kinds_is_of_the_rank_plan() {
        let mut json: serde_json::Value = serde_json::to_value(state()).unwrap();
        json.as_object_mut().unwrap().remove("plan");
        let back: ResumeState = serde_json::from_value(json).unwrap();
        assert_eq!(back.plan, PlanKind::Rank);
        let global = ResumeState { plan: PlanKind::Global { global_batch: 64, partitions: 4 }, ..state() };
        let json = serde_json::to_string(&global).unwrap();
        assert!(json.contains(r#""plan":{"kind":"global","global_batch":64,"partitions":4}"#), "{json}");
    }

    #[test]
    fn the_same_parameters_at_another_position_match() {
        let now = ResumeState { epoch: 0, batch: 0, ..state() };
        assert_eq!(state().mismatch(&now), None);
    }

    #[test]
    fn a_mismatch_names_the_field_and_both_values() {
        let now = ResumeState { world_size: 8, ..state() };
        let m = state().mismatch(&now).unwrap();
        assert_eq!(m.field, "world_size");
        assert_eq!(m.to_string(), "cannot resume: the saved state has world_size 4, this loader 8");
        let now = ResumeState { shuffle: Shuffle::Off, ..state() };
        assert!(state().mismatch(&now).unwrap().to_string().contains("windows of 4 shards, this loader off"));
        let now = ResumeState { version: DatasetVersion([8; 16]), ..state() };
        assert_eq!(state().mismatch(&now).unwrap().field, "version");
    }

    #[test]
    fn the_state_round_trips_through_json_with_the_version_in_hex() {
        let json = serde_json::to_string(&state()).unwrap();
        assert!(json.contains(&"07".repeat(16)), "{json}");
        let back: ResumeState = serde_json::from_str(&json).unwrap();
        assert_eq!(back, state());
    }
}
