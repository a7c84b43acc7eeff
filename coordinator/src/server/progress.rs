//! A dataset registration that reports progress
//! (`AddDataset { progress: true }`): the registration runs while its
//! progress, as the handler publishes it ([`AddProgress`] on a watch
//! channel), is written to the caller's stream: each new step at once,
//! within a step at most every [`PROGRESS_EVERY`]; the answer follows on
//! the same stream. Reading the
//! footers of 100,000 files takes minutes: the caller sees it move, and
//! its deadline counts from the last frame.

use super::ctx::Ctx;
use super::handlers::datasets;
use granary_net::api::{AddProgress, AddStage, ApiResponse};
use granary_net::frame::{self, StreamError};
use granary_proto::View;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// How often progress is written, at most.
pub(super) const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// Registers `name` as [`datasets::add`] does, writing its progress to
/// `send` meanwhile; returns the answer (not yet written). A caller that
/// stops reading gets no more progress; the registration goes on.
pub(super) async fn add_reporting(
    ctx: &Ctx,
    name: String,
    source: String,
    view: View,
    send: &mut quinn::SendStream,
) -> Result<ApiResponse, StreamError> {
    let (tx, mut rx) = watch::channel(AddProgress::default());
    let work = datasets::add(ctx, name, source, view, &tx);
    tokio::pin!(work);
    // The step and time of the last frame written; whether a newer
    // progress waits for PROGRESS_EVERY to pass.
    let mut last: Option<(AddStage, Instant)> = None;
    let mut pending = false;
    let mut reporting = true;
    loop {
        let due = last.map_or_else(Instant::now, |(_, at)| at + PROGRESS_EVERY);
        tokio::select! {
            answer = &mut work => return Ok(match answer { Ok(r) | Err(r) => r }),
            changed = rx.changed(), if reporting => {
                pending = changed.is_ok();
                // A new step is written at once; within a step, at most
                // every PROGRESS_EVERY.
                if !last.is_some_and(|(stage, at)| stage == rx.borrow().stage && at.elapsed() < PROGRESS_EVERY) {
                    reporting = write(send, &mut rx, &mut last).await;
                    pending = false;
                }
            }
            _ = tokio::time::sleep_until(due), if pending && reporting => {
                reporting = write(send, &mut rx, &mut last).await;
                pending = false;
            }
        }
    }
}

/// Writes the latest progress; false when the caller did not take it
/// within a second (no more is written then).
async fn write(
    send: &mut quinn::SendStream,
    rx: &mut watch::Receiver<AddProgress>,
    last: &mut Option<(AddStage, Instant)>,
) -> bool {
    let now = *rx.borrow_and_update();
    *last = Some((now.stage, Instant::now()));
    // The registration waits while a frame is written: a second at most.
    let frame = ApiResponse::AddProgress(now);
    let written = tokio::time::timeout(PROGRESS_EVERY * 4, frame::write_frame(send, &frame)).await;
    let ok = matches!(written, Ok(Ok(())));
    if !ok {
        tracing::debug!("the caller of a dataset registration stopped taking its progress");
    }
    ok
}
