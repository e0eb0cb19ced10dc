//! The coordination layer of a Tucana cluster (issue 19; DESIGN.md, "Cluster"): what the
//! coordinator, the servers in cluster mode and the operators' commands agree on.
//!
//! Files: `slot` (a key's Redis Cluster hash slot, and the slot-prefixed keys a server
//! stores), `map` (the cluster map: slot ranges → primary, backups, epoch; its validation
//! and the pure changes the coordinator makes), `etcd` (the map, the server list under
//! leases and the coordinator election, kept in etcd), `types` (server ids, revisions),
//! `error`, and with the `testing` feature `testing` (a real etcd process for tests).
//!
//! It owns no data path and knows no engine: it does not depend on `tucana`, the server or
//! replication; they will depend on it.
//!
//! Threads: `slot` and `map` are plain values and functions. `etcd::Store` is `Clone` and
//! `Send + Sync`; its calls are async (tokio). A `Registration` keeps its lease alive from
//! a task on the runtime that created it.

pub mod error;
pub mod etcd;
pub mod map;
pub mod slot;
#[cfg(feature = "testing")]
pub mod testing;
pub mod types;

pub use error::{Error, Result};
pub use etcd::{
    LeaderWatch, Leadership, LeaseStatus, MapEvent, MapWatch, Registration, Revision, ServerEvent,
    ServerWatch, Store,
};
pub use map::{
    Balancing, ClusterMap, Failover, Migration, Move, Region, RegionId, ServerId, ServerInfo,
    SlotRange,
};
pub use slot::{key_slot, prefix_slot, split_storage_key, storage_key, SLOTS};
