//! The regions of an open volume by name, local (writable) ones and replicas (a backup's
//! copies of regions of other servers, `crate::replica`), and the ids new ones get.
//!
//! Owns: the name → region maps (one name is one region, of either kind) and id
//! assignment (ids are never reused within a volume; the next one is recorded in every
//! commit descriptor). Does not own: making a creation, a drop or a promotion durable (the
//! caller commits while holding the commit lock, so a commit never sees a half-registered
//! region).
//!
//! Thread-safety: a read-write lock over each map; readers take a clone of what they
//! need. Changes hold the commit lock besides.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

use super::Region;
use crate::error::{Error, Result};
use crate::replica::Replica;
use crate::shared::Shared;
use crate::types::{RegionId, BLOCK_BYTES};

pub(crate) struct Regions {
    by_name: RwLock<BTreeMap<String, Arc<Region>>>,
    replicas: RwLock<BTreeMap<String, Arc<Replica>>>,
    next_id: AtomicU64,
}

impl Regions {
    pub fn new(
        by_name: BTreeMap<String, Arc<Region>>,
        replicas: BTreeMap<String, Arc<Replica>>,
        next_id: u64,
    ) -> Regions {
        Regions {
            by_name: RwLock::new(by_name),
            replicas: RwLock::new(replicas),
            next_id: AtomicU64::new(next_id),
        }
    }

    pub fn get(&self, name: &str) -> Option<Arc<Region>> {
        self.by_name.read().get(name).cloned()
    }

    /// Every region, by name.
    pub fn list(&self) -> Vec<Arc<Region>> {
        self.by_name.read().values().cloned().collect()
    }

    /// Names of every region, sorted.
    pub fn names(&self) -> Vec<String> {
        self.by_name.read().keys().cloned().collect()
    }

    /// The id the next region created gets (what a commit descriptor records).
    pub fn next_id(&self) -> u64 {
        self.next_id.load(Ordering::Acquire)
    }

    /// Creates region `name` with its first log segment and registers it; the one already
    /// registered under `name` if there is one. The caller holds the commit lock and
    /// commits next, so that the region and anything written to it survive a crash.
    pub fn create(&self, shared: &Arc<Shared>, name: &str) -> Result<Arc<Region>> {
        if name.is_empty() || name.len() > 255 {
            return Err(Error::InvalidArgument(
                "a keyspace name is 1 to 255 bytes".into(),
            ));
        }
        if let Some(region) = self.get(name) {
            return Ok(region);
        }
        if self.replica(name).is_some() {
            return Err(Error::InvalidArgument(format!(
                "{name:?} is a replica of another server's keyspace: it takes no writes until promoted"
            )));
        }
        shared.check_writable()?;
        let size = shared.options.log_segment_bytes;
        let blocks = size / BLOCK_BYTES;
        let storage = shared.volume.storage();
        // The keyspace's first segment is placed as every later one is: on the member
        // the dispatch policy names (`None` for one file: first fit).
        let queued = shared.queued_write_bytes();
        let base = shared.allocator.allocate_on(
            storage.as_ref(),
            blocks,
            blocks,
            false,
            storage.dispatch_member(None, &queued),
        )?;
        let id = RegionId(self.next_id.fetch_add(1, Ordering::AcqRel));
        let region = Arc::new(Region::create(shared, id, name, base, size));
        self.by_name
            .write()
            .insert(name.to_string(), region.clone());
        Ok(region)
    }

    /// Takes region `name` out of the map (the caller drops it durably).
    pub fn remove(&self, name: &str) -> Option<Arc<Region>> {
        self.by_name.write().remove(name)
    }

    pub fn replica(&self, name: &str) -> Option<Arc<Replica>> {
        self.replicas.read().get(name).cloned()
    }

    /// Every replica, by name.
    pub fn replicas(&self) -> Vec<Arc<Replica>> {
        self.replicas.read().values().cloned().collect()
    }

    /// Creates an empty replica `name` of a region whose records have crc seed `seed`, at
    /// `term`; the one already registered if there is one. The caller holds the commit
    /// lock and commits next.
    pub fn create_replica(
        &self,
        shared: &Arc<Shared>,
        name: &str,
        seed: u32,
        term: u64,
    ) -> Result<Arc<Replica>> {
        if name.is_empty() || name.len() > 255 {
            return Err(Error::InvalidArgument(
                "a keyspace name is 1 to 255 bytes".into(),
            ));
        }
        if let Some(replica) = self.replica(name) {
            return Ok(replica);
        }
        if self.get(name).is_some() {
            return Err(Error::InvalidArgument(format!(
                "{name:?} is a keyspace of this server: it cannot also be a replica"
            )));
        }
        shared.check_writable()?;
        let id = RegionId(self.next_id.fetch_add(1, Ordering::AcqRel));
        let replica = Arc::new(Replica::create(shared.clone(), id, name, seed, term));
        self.replicas
            .write()
            .insert(name.to_string(), replica.clone());
        Ok(replica)
    }

    /// Takes replica `name` out of the map.
    pub fn remove_replica(&self, name: &str) -> Option<Arc<Replica>> {
        self.replicas.write().remove(name)
    }

    /// Registers `region` (a promoted replica) under its name.
    pub fn insert(&self, region: Arc<Region>) {
        self.by_name
            .write()
            .insert(region.name().to_string(), region);
    }
}
