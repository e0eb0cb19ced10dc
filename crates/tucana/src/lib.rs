//! Tucana: a persistent, ordered key-value store for fast SSDs.
//!
//! An in-memory B-tree whose leaves hold sorted (key prefix, key hash, log pointer)
//! entries indexes an append-only key-value log. Durability comes from copy-on-write
//! commits of index nodes and allocator bitmaps at epochs, made atomic by a two-slot
//! superblock; after a crash only the log written since the last commit is replayed.
//!
//! ```no_run
//! use tucana::{Database, Durability};
//! let db = Database::open("data.tucana")?;
//! let users = db.keyspace("users")?;
//! users.put(b"alice", b"42")?;
//! users.put_with(b"bob", b"7", Durability::Sync)?;
//! assert_eq!(users.get(b"alice")?.as_deref(), Some(&b"42"[..]));
//! for item in users.range::<&[u8], _>(..).rev() {
//!     let (key, value) = item?;
//!     println!("{:?} = {:?}", key, value);
//! }
//! # Ok::<(), tucana::Error>(())
//! ```

pub mod alloc;
mod background;
mod check;
mod commit;
mod db;
mod descriptor;
mod engine;
pub mod error;
mod gc;
mod group_commit;
pub mod index;
mod keyspace;
pub mod log;
mod options;
mod prefetch;
mod range;
mod read_mode;
mod recovery;
mod region;
mod replica;
pub mod replication;
mod shared;
mod stats;
pub mod trim;
pub mod types;
pub mod volume;

/// Crash points for the failover harness (`tucana-crashtest failover`): a binary built
/// with the `failpoints` feature dies at a named point when `FAILPOINTS` arms it.
#[cfg(feature = "failpoints")]
pub mod failpoints {
    /// Dies as `kill -9` kills: no destructor, no flush, no exit handler.
    pub fn kill_self() -> ! {
        // SAFETY: kill(2) and getpid(2) touch no memory of ours.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        // SIGKILL cannot be caught or ignored; delivery to ourselves is immediate.
        unreachable!("SIGKILL returned")
    }
}

/// Codecs private to the engine, exposed only for the fuzz targets in `fuzz/` (M5 of
/// docs/reliability.md) and the corruption suite (M4, which aims at the newest commit's
/// structures): not part of the API, may change at any time.
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::descriptor::{Descriptor, RegionDesc};
}

pub use check::CheckReport;
pub use db::Database;
pub use error::{Error, Result};
pub use gc::ReorganiseReport;
pub use keyspace::{Batch, Durability, Keyspace, Snapshot};
pub use options::{DeferredUpdates, Options};
pub use range::Range;
pub use stats::{KeyspaceStats, Stats};
pub use types::{MAX_KEY_BYTES, MAX_VALUE_BYTES};
