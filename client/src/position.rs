//! [`Position`]: a place in a rank's plan, the whole resume state of a
//! rank. Its own module because batches, the loader and the GPU stream all
//! carry one, and none of them owns the idea.

/// A place in a rank's plan. A rank's whole resume state, with the
/// version and plan parameters that give the place its meaning, is a
/// [`crate::ResumeState`].
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug, Default)]
pub struct Position {
    /// Epoch, from 0.
    pub epoch: u64,
    /// Batch index within the epoch.
    pub batch: u64,
}
