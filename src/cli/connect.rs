//! How the one-shot cluster commands (`dataset add|ls|show|placement`,
//! `status`) reach the coordinators: the shared flags, one request answered
//! by whichever voter leads, and the error for an answer of the wrong kind.

use anyhow::Result;
use clap::Args;
use granary_net::api::{AddProgress, ApiRequest, ApiResponse};
use granary_net::client::{ClientOptions, CoordinatorClient, parse_addrs};
use granary_net::tls::Identity;
use std::path::PathBuf;
use std::time::Duration;

/// How to reach the coordinators.
#[derive(Args, Clone)]
pub(crate) struct ConnectArgs {
    /// Coordinator addresses, `HOST:PORT,...` (any voter; requests find the leader).
    #[arg(long, env = "GRANARY_COORDINATORS", value_delimiter = ',', required = true)]
    coordinators: Vec<String>,
    /// An identity folder of `granary certs init`: `admin/` for dataset changes, any host's for reads.
    #[arg(long, env = "GRANARY_CERTS")]
    certs: PathBuf,
    /// Certificate name in that folder. Default: `admin` if the folder holds it, else the folder's one identity.
    #[arg(long)]
    cert_name: Option<String>,
    /// Give up after this many milliseconds without an answer (for
    /// `dataset add`, without an answer or progress).
    #[arg(long, default_value_t = 10_000)]
    timeout_ms: u64,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Sends one request and waits for its answer, on a runtime of its own:
/// these commands make one call and exit.
pub(crate) fn call(connect: &ConnectArgs, req: ApiRequest) -> Result<ApiResponse> {
    call_reporting(connect, req, |_| {})
}

/// [`call`] for a request the leader answers with progress first
/// (`AddDataset { progress: true }`): `on_progress` sees each step, and
/// `--timeout-ms` counts from the last frame heard.
pub(crate) fn call_reporting(
    connect: &ConnectArgs,
    req: ApiRequest,
    on_progress: impl FnMut(&AddProgress) + Send,
) -> Result<ApiResponse> {
    let (identity, _) = Identity::load_in(&connect.certs, connect.cert_name.as_deref(), "admin")?;
    let addrs = parse_addrs(&connect.coordinators)?;
    let options = ClientOptions { deadline: Duration::from_millis(connect.timeout_ms), ..Default::default() };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async move {
        let client = CoordinatorClient::new(&identity, addrs, options)?;
        let (_, resp) = client.call_reporting(&req, on_progress).await?;
        client.close();
        Ok(resp)
    })
}

/// The error for an answer that does not fit the request.
pub(crate) fn unexpected(resp: ApiResponse) -> anyhow::Error {
    anyhow::anyhow!("unexpected answer from the coordinator: {resp:?}")
}
