//! Remote storage: object_store behind a counting, optionally throttled
//! Parquet reader.
//!
//! Every byte the node reads from the source passes through
//! [`RemoteFile`], which counts it (the `remote_bytes` the benchmarks
//! compare with the dataset size) and, when a [`ThrottleConfig`] is set,
//! charges it against one bandwidth budget shared by all requests.
//! object_store's own `ThrottledStore` delays each request by its size but
//! lets concurrent requests add up, so it cannot model a link of fixed
//! bandwidth; [`Throttle`] can.

use crate::error::RemoteError;
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, TryStreamExt};
use object_store::path::Path as StorePath;
use object_store::{GetOptions, ObjectMeta, ObjectStore, ObjectStoreExt};
use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Simulated remote-storage conditions: a latency per request and a
/// bandwidth cap shared by all requests. For demos and benchmarks.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ThrottleConfig {
    /// Added before every request. Default 0.
    #[serde(default)]
    pub latency_ms: u64,
    /// Aggregate bytes per second over all requests.
    pub bandwidth_bytes_per_s: u64,
}

impl ThrottleConfig {
    /// Latency as a Duration.
    pub fn latency(&self) -> Duration {
        Duration::from_millis(self.latency_ms)
    }
}

/// Counters of remote traffic.
#[derive(Debug, Default)]
pub struct RemoteCounters {
    /// Bytes received from the store.
    pub bytes: AtomicU64,
    /// Requests made.
    pub requests: AtomicU64,
    /// Parquet footers read from the store.
    pub footers: AtomicU64,
    /// Parquet footers received from peers instead.
    pub peer_footers: AtomicU64,
    /// Footers peers sent that were refused (not the footer registered, or
    /// not a footer): each was read from the store instead.
    pub peer_footers_refused: AtomicU64,
}

/// A shared bandwidth budget plus a fixed latency per request.
#[derive(Debug)]
pub struct Throttle {
    cfg: ThrottleConfig,
    /// The instant at which the simulated link is next free.
    next_free: std::sync::Mutex<Instant>,
}

impl Throttle {
    /// A throttle with `cfg`.
    pub fn new(cfg: ThrottleConfig) -> Self {
        Self { cfg, next_free: std::sync::Mutex::new(Instant::now()) }
    }

    /// Waits as a request of `bytes` would on the simulated link: the
    /// latency, then its share of the link, queued behind earlier requests.
    pub async fn charge(&self, bytes: u64) {
        tokio::time::sleep(self.cfg.latency()).await;
        let bw = self.cfg.bandwidth_bytes_per_s.max(1);
        let transfer = Duration::from_secs_f64(bytes as f64 / bw as f64);
        let done = {
            // The lock guards one Instant; a poisoned lock still holds a
            // valid Instant, so keep using it.
            let mut next = self.next_free.lock().unwrap_or_else(|p| p.into_inner());
            let start = (*next).max(Instant::now());
            *next = start + transfer;
            *next
        };
        tokio::time::sleep_until(done.into()).await;
    }
}

/// The largest footer read (the same bound as a footer from a peer).
const MAX_FOOTER_LEN: u64 = granary_proto::peer::MAX_PEER_FOOTER_LEN;

/// Bytes read from a file's end to find its footer in one request.
const FOOTER_READ_HINT: u64 = 64 << 10;

/// The length of the footer (metadata + 8) from a file's last bytes.
fn footer_len(tail: &[u8]) -> Result<u64, String> {
    let n = tail.len();
    if n < 8 || &tail[n - 4..] != b"PAR1" {
        return Err("no PAR1 magic at the end: not a Parquet file, or truncated".into());
    }
    let meta = u32::from_le_bytes([tail[n - 8], tail[n - 7], tail[n - 6], tail[n - 5]]);
    Ok(meta as u64 + 8)
}

/// Decodes a footer as [`RemoteFile::footer_bytes`] returns it (from remote
/// storage or from a peer); `path` names the file in errors.
pub fn decode_footer(path: &str, raw: &[u8]) -> Result<ParquetMetaData, RemoteError> {
    let bad = |source| RemoteError::Parquet { path: path.to_string(), source };
    let need = footer_len(raw).map_err(|what| bad(parquet::errors::ParquetError::General(what)))?;
    if need != raw.len() as u64 {
        return Err(bad(parquet::errors::ParquetError::General(format!(
            "footer says {need} bytes, {} given",
            raw.len()
        ))));
    }
    ParquetMetaDataReader::decode_metadata(&raw[..raw.len() - 8]).map_err(bad)
}

/// Builds object_store's usual reqwest client with extra trusted CA
/// certificates (`[remote] ca_file`). A connector, rather than
/// `with_client_options`, keeps the client options each builder derives
/// from its defaults, the environment and the other `[remote]` options.
#[derive(Debug)]
struct TrustCa {
    certs: Vec<object_store::Certificate>,
}

impl object_store::client::HttpConnector for TrustCa {
    fn connect(&self, options: &object_store::ClientOptions) -> object_store::Result<object_store::client::HttpClient> {
        let options = self.certs.iter().fold(options.clone(), |o, c| o.with_root_certificate(c.clone()));
        object_store::client::ReqwestConnector::default().connect(&options)
    }
}

/// Listings of a selection's prefixes in flight at once.
const LISTINGS: usize = 16;

fn is_parquet(m: &ObjectMeta) -> bool {
    m.location.as_ref().ends_with(".parquet")
}

/// `path` below the store prefix `base` (no leading `/`), if it is below.
fn below<'a>(base: &str, path: &'a str) -> Option<&'a str> {
    if base.is_empty() { Some(path) } else { path.strip_prefix(base)?.strip_prefix('/') }
}

/// One source: a store, the prefix the dataset lives under, and counters.
#[derive(Clone)]
pub struct Remote {
    url: String,
    /// What the source selects below its base (globs, brace ranges);
    /// `None`: every file under it.
    selection: Option<crate::select::Selection>,
    store: Arc<dyn ObjectStore>,
    prefix: StorePath,
    throttle: Option<Arc<Throttle>>,
    counters: Arc<RemoteCounters>,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote").field("url", &self.url).finish()
    }
}

impl Remote {
    /// Opens `url` with object_store `options` (plus the usual environment
    /// variables for `s3://` and `gs://`).
    pub fn open(
        url: &str,
        options: &BTreeMap<String, String>,
        throttle: Option<Arc<Throttle>>,
        counters: Arc<RemoteCounters>,
    ) -> Result<Self, RemoteError> {
        let open_err = |reason: String| RemoteError::Open { url: url.to_string(), reason };
        // `s3://b/ads/date=2026-11-{01..30}/`: the store and prefix are
        // the base's, the rest selects below it.
        let (url, selection) = crate::select::split(url).map_err(open_err)?;
        // object_store's HTTP-based stores build reqwest clients that need a
        // process-wide TLS provider; an embedding program may not set one.
        granary_net::tls::ensure_default_crypto_provider();
        // A plain absolute path is a local folder: `/data/ads` is
        // `file:///data/ads/` (so both give one dataset version).
        let local;
        let url: &str = if url.starts_with('/') {
            local =
                url::Url::from_directory_path(url).map_err(|()| open_err("not an absolute path".into()))?.to_string();
            &local
        } else {
            url
        };
        let parsed = url::Url::parse(url).map_err(|e| match e {
            url::ParseError::RelativeUrlWithoutBase => open_err(
                "neither a URL (file:///abs/path/, s3://bucket/prefix/, gs://bucket/prefix/, https://host/path/) \
                 nor an absolute path"
                    .into(),
            ),
            e => open_err(e.to_string()),
        })?;
        // `ca_file` is ours, not object_store's: CA certificates (PEM) that
        // the network stores trust besides the system's, for endpoints with
        // a private CA (an internal MinIO, a WebDAV server).
        let mut options = options.clone();
        let ca_file = options.remove("ca_file");
        let trust = match &ca_file {
            None => None,
            Some(ca_file) => {
                let pem = std::fs::read(ca_file).map_err(|e| open_err(format!("reading ca_file {ca_file}: {e}")))?;
                let certs = object_store::Certificate::from_pem_bundle(&pem)
                    .map_err(|e| open_err(format!("ca_file {ca_file}: {e}")))?;
                if certs.is_empty() {
                    return Err(open_err(format!("ca_file {ca_file} holds no PEM certificate")));
                }
                Some(TrustCa { certs })
            }
        };
        let prefix_of =
            |parsed: &url::Url| StorePath::from_url_path(parsed.path()).map_err(|e| open_err(e.to_string()));
        let (store, prefix): (Arc<dyn ObjectStore>, StorePath) = match parsed.scheme() {
            "s3" | "s3a" => {
                let mut b = object_store::aws::AmazonS3Builder::from_env().with_url(url);
                if let Some(trust) = trust {
                    b = b.with_http_connector(trust);
                }
                for (k, v) in &options {
                    let key = k.parse().map_err(|e: object_store::Error| open_err(e.to_string()))?;
                    b = b.with_config(key, v);
                }
                (Arc::new(b.build().map_err(|e| open_err(e.to_string()))?), prefix_of(&parsed)?)
            }
            "gs" => {
                let mut b = object_store::gcp::GoogleCloudStorageBuilder::from_env().with_url(url);
                if let Some(trust) = trust {
                    b = b.with_http_connector(trust);
                }
                for (k, v) in &options {
                    let key = k.parse().map_err(|e: object_store::Error| open_err(e.to_string()))?;
                    b = b.with_config(key, v);
                }
                (Arc::new(b.build().map_err(|e| open_err(e.to_string()))?), prefix_of(&parsed)?)
            }
            "http" if options.get("allow_http").map(|v| v.eq_ignore_ascii_case("true")) != Some(true) => {
                // object_store's client refuses plain HTTP with a bare
                // "builder error" at the first request; say why up front.
                return Err(open_err(
                    "plain http:// is refused unless the node's [remote] options set allow_http = \"true\"".into(),
                ));
            }
            "http" | "https"
                if matches!(
                    object_store::ObjectStoreScheme::parse(&parsed),
                    Ok((object_store::ObjectStoreScheme::Http, _))
                ) =>
            {
                // Built here rather than through `parse_url_opts`, which
                // drops options it does not know without a word.
                let origin = &parsed[..url::Position::BeforePath];
                let mut b = object_store::http::HttpBuilder::new().with_url(origin);
                if let Some(trust) = trust {
                    b = b.with_http_connector(trust);
                }
                for (k, v) in &options {
                    let key = k.parse().map_err(|e: object_store::Error| open_err(e.to_string()))?;
                    b = b.with_config(key, v);
                }
                (Arc::new(b.build().map_err(|e| open_err(e.to_string()))?), prefix_of(&parsed)?)
            }
            _ if ca_file.is_some() => {
                return Err(open_err("ca_file applies to s3://, gs://, http:// and https:// sources".into()));
            }
            _ => {
                let (store, prefix) =
                    object_store::parse_url_opts(&parsed, options.iter()).map_err(|e| open_err(e.to_string()))?;
                (Arc::from(store), prefix)
            }
        };
        Ok(Self { url: url.to_string(), selection, store, prefix, throttle, counters })
    }

    /// The source URL: its base, without the selection (what a manifest
    /// records, so that a window of days that moves keeps naming the same
    /// files by the same source).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The source as given, its selection included.
    pub fn shown_source(&self) -> String {
        match &self.selection {
            Some(s) => format!("{}{}", self.url, s.text()),
            None => self.url.clone(),
        }
    }

    /// The counters shared by every file of this source.
    pub fn counters(&self) -> &Arc<RemoteCounters> {
        &self.counters
    }

    /// Every `.parquet` object the source names, sorted by path: all of
    /// them under the prefix, or those its selection matches, listed from
    /// the selection's literal prefixes only.
    pub async fn list_parquet(&self) -> Result<Vec<ObjectMeta>, RemoteError> {
        use futures::StreamExt;
        let mut metas: Vec<ObjectMeta> = match &self.selection {
            None => self
                .store
                .list(Some(&self.prefix))
                .try_filter(|m| futures::future::ready(is_parquet(m)))
                .try_collect()
                .await
                .map_err(|error| RemoteError::Store { path: self.shown_source(), error })?,
            Some(selection) => {
                // Owned values only in the listings' futures (a closure
                // over references there keeps rustc from proving the
                // callers' futures `Send`).
                let places: Vec<StorePath> = selection
                    .prefixes()
                    .iter()
                    .map(|p| StorePath::from_iter(self.prefix.parts().chain(StorePath::from(p.as_str()).parts())))
                    .collect();
                let store = self.store.clone();
                let mut listed = futures::stream::iter(places)
                    .map(move |at| {
                        let store = store.clone();
                        async move { store.list(Some(&at)).try_collect::<Vec<ObjectMeta>>().await }
                    })
                    .buffer_unordered(LISTINGS);
                let mut found = Vec::new();
                while let Some(list) = listed.next().await {
                    let list = list.map_err(|error| RemoteError::Store { path: self.shown_source(), error })?;
                    found.extend(list.into_iter().filter(|m| {
                        is_parquet(m)
                            && below(self.prefix.as_ref(), m.location.as_ref()).is_some_and(|b| selection.matches(b))
                    }));
                }
                found
            }
        };
        metas.sort_by(|a, b| a.location.cmp(&b.location));
        metas.dedup_by(|a, b| a.location == b.location);
        if metas.is_empty() {
            return Err(RemoteError::Empty(self.shown_source()));
        }
        Ok(metas)
    }

    /// The object's current size and version (one request, no bytes).
    pub async fn head(&self, path: &StorePath) -> Result<ObjectMeta, RemoteError> {
        self.counters.requests.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.store.head(path).await.map_err(|source| RemoteError::Store { path: self.shown(path), error: source })
    }

    /// `path` as a person finds it again: an absolute path for a local
    /// source (object_store's paths drop the leading `/`), the whole URL
    /// (`s3://bucket/key`) for a store. For messages only: manifests keep
    /// object paths.
    pub fn shown(&self, path: &StorePath) -> String {
        match url::Url::parse(&self.url) {
            Ok(u) if u.scheme() == "file" => format!("/{path}"),
            Ok(u) => format!("{}/{path}", &u[..url::Position::BeforePath]),
            Err(_) => path.to_string(),
        }
    }

    /// A Parquet reader over one object of known size.
    pub fn file(&self, path: StorePath, size: u64) -> RemoteFile {
        RemoteFile { remote: self.clone(), path, size, pin: None }
    }
}

/// Whether `meta` is of another object version than `version_tag` (a
/// manifest's: an ETag, or `mtime:MICROS` where the listing gave none),
/// compared the way reads are pinned: a tag made of a modification time is
/// compared with the answer's modification time, not with its ETag.
pub(crate) fn version_differs(version_tag: &str, meta: &ObjectMeta) -> bool {
    Pin::parse(version_tag).is_some_and(|p| p.differs(meta))
}

/// The object version a file's reads are pinned to: the manifest's
/// version tag, an ETag or, where the store's listing gave none, the
/// modification time (`mtime:MICROS`).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Pin {
    ETag(String),
    /// Microseconds since the epoch.
    Modified(i64),
}

impl Pin {
    fn parse(version_tag: &str) -> Option<Pin> {
        match version_tag.strip_prefix("mtime:") {
            Some(micros) => micros.parse().ok().map(Pin::Modified),
            None if version_tag.is_empty() => None,
            None => Some(Pin::ETag(version_tag.to_string())),
        }
    }

    /// Whether an answer with `meta` is of another object version: another
    /// ETag, or a modification time in another second (an answer's
    /// `Last-Modified` has whole seconds; a change within the registered
    /// second is not seen this way).
    fn differs(&self, meta: &ObjectMeta) -> bool {
        match self {
            Pin::ETag(tag) => meta.e_tag.as_ref().is_some_and(|now| !same_etag(now, tag)),
            Pin::Modified(micros) => meta.last_modified.timestamp() != micros.div_euclid(1_000_000),
        }
    }

    fn describe(&self) -> String {
        match self {
            Pin::ETag(tag) => format!("ETag {tag}"),
            Pin::Modified(micros) => format!("modified at {micros} µs"),
        }
    }
}

/// Two ETags name the same object version: equal once a weak marker and
/// quotes are set aside (listings and answers of some stores differ in
/// those alone).
fn same_etag(a: &str, b: &str) -> bool {
    let bare = |t: &str| t.trim_start_matches("W/").trim_matches('"').to_string();
    bare(a) == bare(b)
}

/// How an answer's object version reads in an error.
fn describe_meta(meta: &ObjectMeta, pin: &Pin) -> String {
    match (pin, &meta.e_tag) {
        (Pin::ETag(_), Some(tag)) => format!("ETag {tag}"),
        _ => format!("modified at {} µs", meta.last_modified.timestamp_micros()),
    }
}

/// A Parquet file on the remote store; counts and throttles every read.
pub struct RemoteFile {
    remote: Remote,
    path: StorePath,
    size: u64,
    /// The object version every read is pinned to, if any.
    pin: Option<Pin>,
}

impl RemoteFile {
    /// Object path.
    pub fn path(&self) -> &StorePath {
        &self.path
    }

    /// Where the object is, as a person finds it again ([`Remote::shown`]).
    pub fn shown(&self) -> String {
        self.remote.shown(&self.path)
    }

    /// Pins every read to the object version a manifest's `version_tag`
    /// names. An ETag goes with each request as `If-Match`; either way an
    /// answer for another version (the store's own ETag, or its
    /// modification time where the listing gave no ETag) is
    /// [`RemoteError::Changed`], never bytes of the new object read with
    /// the old footer. An empty tag leaves reads unpinned.
    pub fn pinned_to(mut self, version_tag: &str) -> Self {
        self.pin = Pin::parse(version_tag);
        self
    }

    /// One range of the object, under the pin if there is one.
    async fn fetch(&self, range: Range<u64>) -> parquet::errors::Result<Bytes> {
        let Some(pin) = &self.pin else {
            return self.remote.store.get_range(&self.path, range).await.map_err(|e| self.store_err(e));
        };
        let if_match = match pin {
            Pin::ETag(tag) => Some(tag.clone()),
            Pin::Modified(_) => None,
        };
        let options = GetOptions { range: Some(range.into()), if_match, ..GetOptions::default() };
        match self.remote.store.get_opts(&self.path, options).await {
            Ok(got) if !pin.differs(&got.meta) => got.bytes().await.map_err(|e| self.store_err(e)),
            Ok(got) => Err(self.changed(pin, Some(describe_meta(&got.meta, pin)))),
            Err(object_store::Error::Precondition { .. }) => {
                let now = self.remote.store.head(&self.path).await.ok().map(|m| describe_meta(&m, pin));
                Err(self.changed(pin, now))
            }
            Err(e) => Err(self.store_err(e)),
        }
    }

    fn changed(&self, pin: &Pin, now: Option<String>) -> parquet::errors::ParquetError {
        parquet::errors::ParquetError::External(Box::new(RemoteError::Changed {
            path: self.shown(),
            registered: pin.describe(),
            now,
        }))
    }

    async fn account(&self, bytes: u64, requests: u64) {
        self.remote.counters.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.remote.counters.requests.fetch_add(requests, Ordering::Relaxed);
        if let Some(t) = &self.remote.throttle {
            t.charge(bytes).await;
        }
    }

    /// object_store clamps a range to the object's current size, so an
    /// object replaced by a shorter one answers with fewer bytes than
    /// asked: an error here, never bytes from the wrong offsets.
    fn check_len(&self, range: &Range<u64>, b: &Bytes) -> parquet::errors::Result<()> {
        let want = range.end.saturating_sub(range.start);
        if b.len() as u64 != want {
            return Err(parquet::errors::ParquetError::General(format!(
                "{}: {} bytes returned for bytes {}..{} of a {}-byte object: it changed since it was listed",
                self.shown(),
                b.len(),
                range.start,
                range.end,
                self.size
            )));
        }
        Ok(())
    }

    fn store_err(&self, source: object_store::Error) -> parquet::errors::ParquetError {
        parquet::errors::ParquetError::External(Box::new(RemoteError::Store { path: self.shown(), error: source }))
    }

    /// Reads and decodes the footer.
    pub async fn metadata(&mut self) -> Result<Arc<ParquetMetaData>, RemoteError> {
        let raw = self.footer_bytes().await?;
        decode_footer(&self.shown(), &raw).map(Arc::new)
    }

    /// The footer as stored: the file's last bytes (metadata, its length,
    /// the `PAR1` magic). One request when it fits the 64 KiB read from the
    /// end, else two.
    pub async fn footer_bytes(&mut self) -> Result<Bytes, RemoteError> {
        let shown = self.shown();
        let bad = |what: String| RemoteError::Parquet {
            path: shown.clone(),
            source: parquet::errors::ParquetError::General(what),
        };
        if self.size < 12 {
            return Err(bad(format!("{} bytes is too short for a Parquet file", self.size)));
        }
        let hint = self.size.min(FOOTER_READ_HINT);
        let tail =
            self.get_bytes(self.size - hint..self.size).await.map_err(|e| RemoteError::from_read(shown.clone(), e))?;
        self.remote.counters.footers.fetch_add(1, Ordering::Relaxed);
        let need = footer_len(&tail).map_err(&bad)?;
        if need > self.size - 4 {
            return Err(bad(format!("footer of {need} bytes in a file of {}", self.size)));
        }
        if need > MAX_FOOTER_LEN {
            return Err(bad(format!("footer of {need} bytes, over the {MAX_FOOTER_LEN} this node reads")));
        }
        if need <= hint {
            return Ok(tail.slice((hint - need) as usize..));
        }
        let head = self
            .get_bytes(self.size - need..self.size - hint)
            .await
            .map_err(|e| RemoteError::from_read(shown.clone(), e))?;
        let mut all = Vec::with_capacity(need as usize);
        all.extend_from_slice(&head);
        all.extend_from_slice(&tail);
        Ok(Bytes::from(all))
    }
}

impl AsyncFileReader for RemoteFile {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        async move {
            let b = self.fetch(range.clone()).await?;
            self.account(b.len() as u64, 1).await;
            self.check_len(&range, &b)?;
            Ok(b)
        }
        .boxed()
    }

    fn get_byte_ranges(&mut self, ranges: Vec<Range<u64>>) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        async move {
            let out = match self.pin {
                None => self.remote.store.get_ranges(&self.path, &ranges).await.map_err(|e| self.store_err(e))?,
                // As object_store's own get_ranges coalesces, each request
                // under the pin.
                Some(_) => {
                    let fetch = |r: Range<u64>| self.fetch(r);
                    object_store::coalesce_ranges(&ranges, fetch, object_store::OBJECT_STORE_COALESCE_DEFAULT).await?
                }
            };
            let n: u64 = out.iter().map(|b| b.len() as u64).sum();
            // object_store coalesces nearby ranges into fewer requests; count
            // one request per call, which is what a throttled link would see.
            self.account(n, 1).await;
            if out.len() != ranges.len() {
                return Err(parquet::errors::ParquetError::General(format!(
                    "{}: {} ranges asked, {} returned",
                    self.path,
                    ranges.len(),
                    out.len()
                )));
            }
            for (range, b) in ranges.iter().zip(&out) {
                self.check_len(range, b)?;
            }
            Ok(out)
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        async move {
            // Page indexes are not used: whole row groups are read.
            let _ = options;
            let raw = self.footer_bytes().await.map_err(|e| parquet::errors::ParquetError::External(Box::new(e)))?;
            let md = ParquetMetaDataReader::decode_metadata(&raw[..raw.len() - 8])?;
            Ok(Arc::new(md))
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(e_tag: Option<&str>, secs: i64) -> ObjectMeta {
        ObjectMeta {
            location: StorePath::from("f.parquet"),
            last_modified: Default::default(),
            size: 1,
            e_tag: e_tag.map(String::from),
            version: None,
        }
        .with_secs(secs)
    }

    trait WithSecs {
        fn with_secs(self, secs: i64) -> Self;
    }

    impl WithSecs for ObjectMeta {
        fn with_secs(mut self, secs: i64) -> Self {
            // The default is the epoch: move it by whole seconds.
            self.last_modified += std::time::Duration::from_secs(secs as u64);
            self
        }
    }

    #[test]
    fn a_plain_absolute_path_is_a_local_folder_and_a_relative_one_is_refused_with_the_forms() {
        let open = |u: &str| Remote::open(u, &BTreeMap::new(), None, Arc::default());
        let r = open("/data/ads").expect("an absolute path opens");
        assert_eq!(r.url(), "file:///data/ads/");
        assert_eq!(
            granary_proto::manifest::canonical_source(r.url()),
            granary_proto::manifest::canonical_source(open("file:///data/ads/").expect("url").url()),
            "one source, one dataset version"
        );
        let e = open("data/ads/").unwrap_err().to_string();
        assert!(e.contains("source data/ads/:") && e.contains("nor an absolute path") && e.contains("file:///"), "{e}");
    }

    #[test]
    fn a_manifest_tag_pins_to_its_etag_or_its_modification_second() {
        assert_eq!(Pin::parse("\"abc\""), Some(Pin::ETag("\"abc\"".into())));
        assert_eq!(Pin::parse("mtime:5500000"), Some(Pin::Modified(5_500_000)));
        assert_eq!(Pin::parse(""), None);
        let etag = Pin::parse("\"abc\"").unwrap();
        assert!(!etag.differs(&meta(Some("\"abc\""), 0)));
        assert!(!etag.differs(&meta(Some("W/\"abc\""), 0)), "a weak marker or quotes alone are the same tag");
        assert!(!etag.differs(&meta(Some("abc"), 0)));
        assert!(etag.differs(&meta(Some("\"abd\""), 0)));
        assert!(!etag.differs(&meta(None, 0)), "an answer without an ETag cannot be told apart");
        let mtime = Pin::parse("mtime:5500000").unwrap();
        assert!(!mtime.differs(&meta(None, 5)), "5.5 s registered, 5 s answered: the same second");
        assert!(mtime.differs(&meta(None, 6)));
        assert!(mtime.differs(&meta(None, 4)));
        // A store whose listing had no ETags but whose answers have one:
        // the time decides, not the ETag.
        assert!(!version_differs("mtime:5500000", &meta(Some("\"d9fc\""), 5)));
        assert!(version_differs("mtime:5500000", &meta(Some("\"d9fc\""), 7)));
        assert!(!version_differs("", &meta(Some("\"d9fc\""), 7)), "no tag registered: nothing to compare");
    }
}
