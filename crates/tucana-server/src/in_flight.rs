//! The stored keys a slot migration is copying out of each region of this server now
//! (DESIGN.md, "Slot migration"): a command touching one answers `TRYAGAIN` until the
//! key's deletion here is as durable as a write (`migration` marks and clears them,
//! `commands::migrating` asks).
//!
//! Owns: the set only. Thread-safety: `Send + Sync`, a mutex held for set operations.

use std::collections::{BTreeSet, HashMap};

use parking_lot::Mutex;
use tucana_cluster::RegionId;

/// Stored keys being copied out of each region now (see the module doc).
#[derive(Default)]
pub struct InFlight(Mutex<HashMap<RegionId, BTreeSet<Vec<u8>>>>);

impl InFlight {
    pub fn contains(&self, region: RegionId, stored: &[u8]) -> bool {
        self.0
            .lock()
            .get(&region)
            .is_some_and(|s| s.contains(stored))
    }

    pub fn insert(&self, region: RegionId, keys: impl IntoIterator<Item = Vec<u8>>) {
        self.0.lock().entry(region).or_default().extend(keys);
    }

    pub fn clear(&self, region: RegionId) {
        self.0.lock().remove(&region);
    }
}
