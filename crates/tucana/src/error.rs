//! Typed errors. Bad bytes read from the volume are an `Err` naming what and where,
//! never a panic; programmer errors (broken invariants) panic.

use crate::types::DiskOffset;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),

    #[error("corrupt {what} at volume offset {offset}: {detail}")]
    Corruption {
        what: &'static str,
        offset: DiskOffset,
        detail: String,
    },

    #[error("key of {len} bytes is larger than the limit of {max} bytes")]
    KeyTooLarge { len: usize, max: usize },

    #[error("value of {len} bytes is larger than the limit of {max} bytes")]
    ValueTooLarge { len: usize, max: usize },

    #[error("the volume is in use by another process (it is locked)")]
    Locked,

    #[error("volume members: {0}")]
    Members(String),

    #[error("not a Tucana volume: {0}")]
    NotAVolume(String),

    #[error("volume format version {found} is newer than this build supports ({supported})")]
    UnsupportedVersion { found: u32, supported: u32 },

    #[error("the store refuses writes after a failed write or sync; reopen it to recover")]
    Poisoned,

    #[error("keyspace {0:?} does not exist")]
    KeyspaceNotFound(String),

    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    #[error("the database is closed")]
    Closed,

    #[error("keyspace {keyspace:?} is at replication term {term} elsewhere: this server no longer takes writes for it")]
    Fenced { keyspace: String, term: u64 },
}

impl Error {
    pub fn corruption(what: &'static str, offset: DiskOffset, detail: impl Into<String>) -> Error {
        Error::Corruption {
            what,
            offset,
            detail: detail.into(),
        }
    }
}
