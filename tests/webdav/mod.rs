//! A read-only WebDAV file server for tests of `http://` sources.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

/// Serves the files under `root` read-only over plain HTTP on 127.0.0.1:0,
/// with the part of WebDAV that object_store's HTTP store reads: `PROPFIND`
/// (listing, depth 0, 1 or infinity), `HEAD`, and `GET` with one byte range
/// (`bytes=a-b`, `bytes=a-`, `bytes=-n`). Anything else is 405. Runs on the
/// current tokio runtime; `requests` counts every request served.
pub(crate) async fn serve_webdav(root: &Path, requests: Arc<AtomicU64>) -> SocketAddr {
    serve(root, requests, None).await
}

/// [`serve_webdav`] over HTTPS: every connection is a TLS session with
/// `tls` (the test's server certificate).
pub(crate) async fn serve_webdav_tls(
    root: &Path,
    requests: Arc<AtomicU64>,
    tls: Arc<rustls::ServerConfig>,
) -> SocketAddr {
    serve(root, requests, Some(tokio_rustls::TlsAcceptor::from(tls))).await
}

async fn serve(root: &Path, requests: Arc<AtomicU64>, tls: Option<tokio_rustls::TlsAcceptor>) -> SocketAddr {
    let root = root.to_path_buf();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = listener.accept().await else { return };
            let (root, requests, tls) = (root.clone(), requests.clone(), tls.clone());
            let service = hyper::service::service_fn(move |req| {
                requests.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let root = root.clone();
                async move { Ok::<_, std::convert::Infallible>(dav::answer(&root, &req)) }
            });
            tokio::spawn(async move {
                let http = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
                let _ = match tls {
                    // A client that refuses our certificate ends here.
                    Some(tls) => match tls.accept(sock).await {
                        Ok(stream) => http.serve_connection(hyper_util::rt::TokioIo::new(stream), service).await,
                        Err(_) => return,
                    },
                    None => http.serve_connection(hyper_util::rt::TokioIo::new(sock), service).await,
                };
            });
        }
    });
    addr
}

mod dav {
    use http_body_util::Full;
    use hyper::body::Bytes;
    use hyper::{Method, Request, Response, StatusCode};
    use std::io::{Read, Seek, SeekFrom};
    use std::path::{Path, PathBuf};

    type Reply = Response<Full<Bytes>>;

    fn status(code: StatusCode) -> Reply {
        let mut r = Response::new(Full::new(Bytes::new()));
        *r.status_mut() = code;
        r
    }

    /// The file a request path names, refusing `..`.
    fn local(root: &Path, uri_path: &str) -> Option<PathBuf> {
        let rel = uri_path.trim_start_matches('/').trim_end_matches('/');
        if rel.split('/').any(|p| p == "..") {
            return None;
        }
        Some(if rel.is_empty() { root.to_path_buf() } else { root.join(rel) })
    }

    fn etag(meta: &std::fs::Metadata) -> String {
        let modified = meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
        format!("\"{}-{}\"", meta.len(), modified.map(|d| d.as_nanos()).unwrap_or(0))
    }

    fn last_modified(meta: &std::fs::Metadata) -> String {
        httpdate::fmt_http_date(meta.modified().unwrap_or(std::time::UNIX_EPOCH))
    }

    pub(super) fn answer<B>(root: &Path, req: &Request<B>) -> Reply {
        let Some(path) = local(root, req.uri().path()) else { return status(StatusCode::FORBIDDEN) };
        match req.method().as_str() {
            "PROPFIND" => propfind(root, &path, req.headers().get("depth").and_then(|d| d.to_str().ok())),
            _ if req.method() == Method::HEAD || req.method() == Method::GET => {
                let Ok(meta) = std::fs::metadata(&path) else { return status(StatusCode::NOT_FOUND) };
                if !meta.is_file() {
                    return status(StatusCode::NOT_FOUND);
                }
                let len = meta.len();
                let range = req.headers().get("range").and_then(|r| r.to_str().ok()).map(|r| parse_range(r, len));
                let (start, end, code) = match range {
                    None => (0, len, StatusCode::OK),
                    Some(Some((a, b))) => (a, b, StatusCode::PARTIAL_CONTENT),
                    Some(None) => return status(StatusCode::RANGE_NOT_SATISFIABLE),
                };
                let body = if req.method() == Method::GET {
                    let mut buf = vec![0u8; (end - start) as usize];
                    let read = std::fs::File::open(&path)
                        .and_then(|mut f| f.seek(SeekFrom::Start(start)).and_then(|_| f.read_exact(&mut buf)));
                    if read.is_err() {
                        return status(StatusCode::INTERNAL_SERVER_ERROR);
                    }
                    Bytes::from(buf)
                } else {
                    Bytes::new()
                };
                let mut r = Response::builder()
                    .status(code)
                    .header("content-length", (end - start).to_string())
                    .header("last-modified", last_modified(&meta))
                    .header("etag", etag(&meta))
                    .header("accept-ranges", "bytes");
                if code == StatusCode::PARTIAL_CONTENT {
                    r = r.header("content-range", format!("bytes {}-{}/{len}", start, end - 1));
                }
                r.body(Full::new(body)).expect("response")
            }
            _ => status(StatusCode::METHOD_NOT_ALLOWED),
        }
    }

    /// `[start, end)` of a single-range header, or None when unsatisfiable.
    fn parse_range(header: &str, len: u64) -> Option<(u64, u64)> {
        let spec = header.strip_prefix("bytes=")?;
        let (a, b) = spec.split_once('-')?;
        let (start, end) = if a.is_empty() {
            let n: u64 = b.parse().ok()?;
            (len.saturating_sub(n), len)
        } else {
            let start: u64 = a.parse().ok()?;
            let end = if b.is_empty() { len } else { b.parse::<u64>().ok()?.saturating_add(1).min(len) };
            (start, end)
        };
        (start < end).then_some((start, end))
    }

    fn propfind(root: &Path, path: &Path, depth: Option<&str>) -> Reply {
        let Ok(meta) = std::fs::metadata(path) else { return status(StatusCode::NOT_FOUND) };
        let max_depth = match depth {
            Some("0") => 0,
            Some("1") => 1,
            _ => usize::MAX,
        };
        let mut entries = Vec::new();
        let mut stack = vec![(path.to_path_buf(), meta, 0usize)];
        while let Some((p, meta, d)) = stack.pop() {
            if meta.is_dir()
                && d < max_depth
                && let Ok(children) = std::fs::read_dir(&p)
            {
                for c in children.flatten() {
                    if let Ok(m) = c.metadata() {
                        stack.push((c.path(), m, d + 1));
                    }
                }
            }
            entries.push((p, meta));
        }
        let mut xml = String::from("<?xml version=\"1.0\" encoding=\"utf-8\"?>\n<multistatus xmlns=\"DAV:\">\n");
        for (p, meta) in entries {
            let rel = p.strip_prefix(root).unwrap_or(&p).to_string_lossy().replace('\\', "/");
            let mut href = format!("/{rel}");
            let kind = if meta.is_dir() {
                href.push('/');
                "<resourcetype><collection/></resourcetype>".to_string()
            } else {
                format!("<resourcetype/><getcontentlength>{}</getcontentlength>", meta.len())
            };
            xml.push_str(&format!(
                "<response><href>{href}</href><propstat><prop><getlastmodified>{}</getlastmodified>{kind}<getetag>{}</getetag></prop><status>HTTP/1.1 200 OK</status></propstat></response>\n",
                last_modified(&meta),
                etag(&meta).replace('"', "&quot;"),
            ));
        }
        xml.push_str("</multistatus>\n");
        Response::builder()
            .status(StatusCode::MULTI_STATUS)
            .header("content-type", "application/xml; charset=utf-8")
            .body(Full::new(Bytes::from(xml)))
            .expect("response")
    }
}
