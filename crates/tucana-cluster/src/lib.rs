//! The coordination layer of a Tucana cluster (issue 19; DESIGN.md, "Cluster"): what the
//! coordinator, the servers in cluster mode and the operators' commands agree on.
//!
//! Files: `slot` (a key's Redis Cluster hash slot, and the slot-prefixed keys a server
//! stores), `map` (the cluster map: slot ranges → primary, backups, epoch; its validation
//! and the pure changes the coordinator makes), `types` (server ids), `error`. Keeping
//! the map in etcd comes next.
//!
//! It owns no data path and knows no engine: it does not depend on `tucana`, the server or
//! replication; they will depend on it.
//!
//! Threads: `slot` and `map` are plain values and functions.

pub mod error;
pub mod map;
pub mod slot;
pub mod types;

pub use error::{Error, Result};
pub use map::{ClusterMap, Region, RegionId, ServerId, ServerInfo, SlotRange};
pub use slot::{key_slot, split_storage_key, storage_key, SLOTS};
