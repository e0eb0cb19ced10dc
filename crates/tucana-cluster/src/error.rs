//! The crate's one error enum. Bytes that do not decode (from etcd, a watch, a volume), or
//! decode into a map that breaks an invariant, are an `Err` naming the source and what is
//! wrong, never a panic. A map transformation that does not apply (an unknown region, a server that is
//! not a backup) is an `Err` too, and leaves the map as it was.

use crate::types::{Revision, ServerId};

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),

    /// `update_map` found the map at another revision than the caller read: someone
    /// changed it meanwhile. `current` is the map's revision now (`None`: no map).
    #[error("the cluster map changed: expected revision {expected}, found {current:?}")]
    Conflict {
        expected: Revision,
        current: Option<Revision>,
    },

    #[error("the cluster map already exists (revision {current})")]
    MapExists { current: Revision },

    #[error(
        "the fenced map update was refused: {server} no longer leads the coordinator election"
    )]
    NotLeader { server: ServerId },

    #[error("server {0} is already registered (its previous lease has not expired)")]
    AlreadyRegistered(ServerId),

    #[error("invalid cluster map: {0}")]
    InvalidMap(String),

    #[error("map change refused: {0}")]
    Refused(String),

    #[error("cannot decode {what}: {detail}")]
    Decode { what: String, detail: String },

    #[error("invalid server id {0:?}: expected 40 lowercase hex characters")]
    InvalidServerId(String),

    #[error("storage key of {len} bytes is too short to hold a slot (2 bytes)")]
    StorageKeyTooShort { len: usize },

    #[error("storage key names slot {slot}, past the last slot (16383)")]
    SlotOutOfRange { slot: u16 },

    #[error("lease time to live {lease_ttl:?} is not between 1 s and {max_seconds} s")]
    InvalidLeaseTtl {
        lease_ttl: std::time::Duration,
        max_seconds: u64,
    },

    #[error("the etcd watch was canceled: {reason}")]
    WatchCanceled { reason: String },
}
