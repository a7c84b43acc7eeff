//! The API request counter (`granary_coordinator_api_requests`): requests
//! answered, by kind and result, counted where they are answered and
//! exported by `metrics.rs`. Split from it so the server's context, which
//! holds the counter, does not import the exporter that reads the context.

use granary_net::api::{ApiResponse, FailureKind};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

/// The labels of the API request counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ApiLabels {
    /// The request's kind (`register-node`, `heartbeat`, ...).
    kind: &'static str,
    /// `ok`, `not-leader`, or the failure's kind.
    result: &'static str,
}

impl ApiLabels {
    /// A placement watch stream opened.
    pub(super) fn watch() -> Self {
        Self { kind: "watch-placement", result: "ok" }
    }
}

/// API requests answered, by kind and result.
pub(super) type ApiRequests = Family<ApiLabels, Counter>;

/// Counts one answered request of `kind`.
pub(super) fn count(requests: &ApiRequests, kind: &'static str, resp: &ApiResponse) {
    let result = match resp {
        ApiResponse::NotLeader { .. } => "not-leader",
        ApiResponse::Failed { kind, .. } => match kind {
            FailureKind::Forbidden => "forbidden",
            FailureKind::NotFound => "not-found",
            FailureKind::BadRequest => "bad-request",
            FailureKind::Unavailable => "unavailable",
            FailureKind::Internal => "internal",
        },
        _ => "ok",
    };
    requests.get_or_create(&ApiLabels { kind, result }).inc();
}
