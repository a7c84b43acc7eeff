//! Repeated log lines of a library, rate-limited (issue 48): openraft logs
//! every failed replication to an unreachable voter at ERROR, about five
//! lines a second for each dead voter, which buries what on-call needs to
//! read. Its replication and network lines pass at most once per call site
//! every [`EVERY`]; the others are dropped. (The leader's own view of its
//! voters is in `granary status` and its metrics.)

use std::collections::HashMap;
use std::time::{Duration, Instant};
use tracing::callsite::Identifier;

/// How often one call site of a rate-limited target may log.
pub(crate) const EVERY: Duration = Duration::from_secs(30);

/// The targets whose lines are rate-limited: where openraft reports each
/// failed RPC to another voter.
const NOISY: &[&str] = &["openraft::replication", "openraft::network"];

/// When each rate-limited call site last passed.
#[derive(Default)]
pub(crate) struct Gate {
    last: HashMap<Identifier, Instant>,
}

impl Gate {
    /// Whether a line of `target` from call site `site` passes at `now`.
    pub(crate) fn admit(&mut self, target: &str, site: Identifier, now: Instant) -> bool {
        if !NOISY.iter().any(|n| target.starts_with(n)) {
            return true;
        }
        match self.last.get(&site) {
            Some(&t) if now.saturating_duration_since(t) < EVERY => false,
            _ => {
                self.last.insert(site, now);
                true
            }
        }
    }
}

/// The gate as a per-layer filter for the log output, for subscribers
/// `S`. A noisy call site is asked about at every event (its interest is
/// "sometimes", never cached); the others always pass this filter.
pub(crate) fn filter<S>() -> impl tracing_subscriber::layer::Filter<S>
where
    S: tracing::Subscriber,
{
    let gate = std::sync::Mutex::new(Gate::default());
    tracing_subscriber::filter::DynFilterFn::new(move |meta: &tracing::Metadata<'_>, _| {
        // Spans always pass: only events are lines.
        if !meta.is_event() {
            return true;
        }
        gate.lock().unwrap_or_else(|p| p.into_inner()).admit(meta.target(), meta.callsite(), Instant::now())
    })
    .with_callsite_filter(|meta| match NOISY.iter().any(|n| meta.target().starts_with(n)) {
        true => tracing::subscriber::Interest::sometimes(),
        false => tracing::subscriber::Interest::always(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Site(#[allow(dead_code)] u8);
    impl tracing::Callsite for Site {
        fn set_interest(&self, _: tracing::subscriber::Interest) {}
        fn metadata(&self) -> &tracing::Metadata<'_> {
            unimplemented!("not asked in these tests")
        }
    }
    // Not zero-sized: two statics of a zero-sized type may share an address.
    static A: Site = Site(1);
    static B: Site = Site(2);

    #[test]
    fn a_noisy_call_site_passes_once_per_period_and_others_always() {
        let (a, b) = (Identifier(&A), Identifier(&B));
        let t0 = Instant::now();
        let mut g = Gate::default();
        let noisy = "openraft::replication";
        assert!(g.admit(noisy, a.clone(), t0));
        assert!(!g.admit(noisy, a.clone(), t0 + Duration::from_secs(1)), "five a second: dropped");
        assert!(g.admit(noisy, b.clone(), t0 + Duration::from_secs(1)), "another call site");
        assert!(g.admit(noisy, a.clone(), t0 + EVERY), "once per period");
        for s in 0..100 {
            assert!(g.admit("granary_coordinator::server", a.clone(), t0 + Duration::from_millis(s)), "ours always");
        }
    }
}
