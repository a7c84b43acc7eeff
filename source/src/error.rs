//! Errors of remote sources, one enum per boundary.

use granary_proto::ShardId;
use thiserror::Error;

/// Reading remote storage failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum RemoteError {
    /// The source URL or its options are unusable.
    #[error("cannot open source {url}: {reason}")]
    Open {
        /// The source URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// A request to the store failed (missing object, network, TLS,
    /// permission). The message carries the store error's causes, which
    /// travel to trainers as text: object_store's own message alone says
    /// "error sending request" for a refused certificate.
    #[error("reading {path}: {}", with_causes(error))]
    Store {
        /// Object path.
        path: String,
        /// The store's error.
        error: object_store::Error,
    },
    /// The Parquet footer or a page could not be decoded.
    #[error("{path}: not a readable Parquet file: {source}")]
    Parquet {
        /// Object path.
        path: String,
        /// The decoder's error.
        source: parquet::errors::ParquetError,
    },
    /// A read pinned to the object's registered ETag found another version
    /// of the object: it was overwritten since the dataset version was
    /// registered. Never decoded with the old footer.
    #[error(
        "{path} changed since the dataset version was registered ({registered} then, {} now): \
         register the dataset again, or restore the file",
        now.as_deref().unwrap_or("unknown")
    )]
    Changed {
        /// Object path.
        path: String,
        /// The version the manifest records ("ETag T", or "modified at
        /// M µs" where the store listed no ETag).
        registered: String,
        /// The store's version now, if it answered.
        now: Option<String>,
    },
    /// The source holds no Parquet file.
    #[error("source {0} holds no .parquet file")]
    Empty(String),
}

/// `e`'s message followed by each distinct cause's, joined with ": ".
impl RemoteError {
    /// A read's error as the Parquet reader returns it: the store's error it
    /// carries (a 503, a lost connection: worth a retry; the object changed),
    /// else a decode error naming `path`. A store that failed a read is not
    /// an unreadable file.
    pub fn from_read(path: String, e: parquet::errors::ParquetError) -> RemoteError {
        match e {
            parquet::errors::ParquetError::External(inner) => match inner.downcast::<RemoteError>() {
                Ok(remote) => *remote,
                Err(other) => RemoteError::Parquet { path, source: parquet::errors::ParquetError::External(other) },
            },
            e => RemoteError::Parquet { path, source: e },
        }
    }
}

fn with_causes(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        // Wrappers often repeat their cause's message; say each once.
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        next = cause.source();
    }
    out
}

/// Resolving a view against a file's schema failed.
#[derive(Debug, Error, PartialEq)]
#[error("{file}: view tensor {tensor:?}, column {column:?}: {problem}")]
pub struct SchemaError {
    /// Object path of the file.
    pub file: String,
    /// Tensor of the view.
    pub tensor: String,
    /// Column involved.
    pub column: String,
    /// What is wrong.
    pub problem: String,
}

/// A dataset's file or shard could not be had.
#[derive(Debug, Error)]
pub enum SourceError {
    /// Reading remote storage failed.
    #[error(transparent)]
    Remote(#[from] RemoteError),
    /// The shard is not part of the dataset version.
    #[error("shard {0} is not part of the dataset")]
    UnknownShard(ShardId),
    /// The dataset version has no file of this index.
    #[error("no file {0}")]
    UnknownFile(usize),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_read_is_the_stores_error_and_a_bad_page_a_decode_error() {
        let store = RemoteError::Store {
            path: "s3://b/f.parquet".into(),
            error: object_store::Error::Generic { store: "S3", source: "503 SlowDown".into() },
        };
        let wrapped = parquet::errors::ParquetError::External(Box::new(store));
        let e = RemoteError::from_read("s3://b/f.parquet".into(), wrapped);
        assert!(matches!(e, RemoteError::Store { .. }), "{e}");
        assert!(e.to_string().contains("503 SlowDown") && !e.to_string().contains("not a readable"), "{e}");
        let bad = parquet::errors::ParquetError::General("bad page".into());
        let e = RemoteError::from_read("s3://b/f.parquet".into(), bad);
        assert!(matches!(e, RemoteError::Parquet { .. }), "{e}");
    }
}
