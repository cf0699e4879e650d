//! Typed errors. Business outcomes (illegal message, flush timeout, not found) are
//! statuses, not errors; an `Error` means the store could not do its job: I/O failed,
//! bytes on disk are corrupt, the directory is locked, the configuration is wrong.

use crate::format::Corruption;
use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{op} failed on {path} at offset {offset}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        offset: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("corrupt data in {path} at offset {offset}: {kind}{}", detail.as_ref().map(|d| format!(" ({d})")).unwrap_or_default())]
    Corrupt {
        path: PathBuf,
        offset: u64,
        kind: Corruption,
        detail: Option<String>,
    },
    #[error(
        "store directory {0} is locked by another process (\"already started\"); stop it first"
    )]
    Locked(PathBuf),
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("store directory {path} is not usable: {why}")]
    BadLayout { path: PathBuf, why: String },
    #[error("the store has stopped taking writes after an earlier failure: {0}")]
    Failed(String),
    #[error("the store is shut down")]
    ShutDown,
    #[error("bad request: {0}")]
    BadRequest(String),
    #[error("shard {shard} is unavailable: {why}")]
    ShardUnavailable { shard: usize, why: String },
}

impl Error {
    pub fn io(
        op: &'static str,
        path: impl Into<PathBuf>,
        offset: u64,
        source: std::io::Error,
    ) -> Error {
        Error::Io {
            op,
            path: path.into(),
            offset,
            source,
        }
    }

    /// glommio wraps io errors in its own type; keep the original errno.
    pub fn glommio(
        op: &'static str,
        path: impl Into<PathBuf>,
        offset: u64,
        e: glommio::GlommioError<()>,
    ) -> Error {
        Error::io(op, path, offset, std::io::Error::from(e))
    }
}
