//! Helpers shared by the root package's test binaries.

use std::net::SocketAddr;
use std::path::Path;

/// Serves `root` (buckets are its sub-folders) with s3s-fs on 127.0.0.1:0,
/// checking S3 signatures of `auth` (access key, secret) when given and
/// accepting unsigned requests otherwise. Runs on the current tokio runtime.
pub(crate) async fn serve_object_store(root: &Path, auth: Option<(&str, &str)>) -> SocketAddr {
    let fs = s3s_fs::FileSystem::new(root).map_err(|e| format!("{e:?}")).expect("s3s-fs");
    let mut builder = s3s::service::S3ServiceBuilder::new(fs);
    if let Some((key, secret)) = auth {
        builder.set_auth(s3s::auth::SimpleAuth::from_single(key, secret));
    }
    let service = builder.build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = listener.accept().await else { return };
            let service = service.clone();
            tokio::spawn(async move {
                let _ = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection(hyper_util::rt::TokioIo::new(sock), service)
                    .await;
            });
        }
    });
    addr
}

/// `[remote]` options of an `s3://` source served by [`serve_object_store`]
/// at `addr` with the access key `AKTEST` and secret `SKTEST`.
#[allow(dead_code)] // not every test binary that includes this module reads S3
pub(crate) fn s3_options(addr: SocketAddr) -> std::collections::BTreeMap<String, String> {
    [
        ("aws_endpoint", format!("http://{addr}")),
        ("aws_allow_http", "true".into()),
        ("aws_access_key_id", "AKTEST".into()),
        ("aws_secret_access_key", "SKTEST".into()),
        ("aws_region", "us-east-1".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}
