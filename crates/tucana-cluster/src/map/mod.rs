//! The cluster map: which server is primary, and which are backups, of each range of hash
//! slots, and at which epoch. etcd holds the one true copy (`etcd`); this module is the
//! value, its JSON form, its validation and the changes the coordinator makes to it.
//!
//! Owns: the map's types and invariants (`ClusterMap::validate`), lookup of a slot's
//! region, and pure transformations (`promote`, `assign_backup`, `remove_server`) that each
//! return a new validated map. Does not own where the map is stored or who may change it
//! (`etcd`), nor when to change it (the coordinator in the server, which runs
//! `repaired`, in `repair`). Slot migrations and the rebalancing plan are `migration`'s.
//!
//! Threads: plain values; share a map behind whatever the holder chooses.
//!
//! Epochs. A region's `epoch` is raised whenever its primary changes, and only then: it is
//! what a primary stamps on its writes and a backup compares (fencing), so it names one
//! reign. New epochs are drawn from the map-wide `config_epoch` (the highest epoch ever
//! given, like Redis Cluster's current epoch), so no two reigns of any regions share an
//! epoch and a new one is above every epoch the map has held. `version` counts every
//! change of the map, backups included.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::slot::SLOTS;
pub use crate::types::ServerId;

mod migration;
mod repair;

pub use migration::{Balancing, Migration, Move};

#[cfg(test)]
mod migration_tests;
#[cfg(test)]
mod tests;

/// What a live server tells the cluster about itself (etcd key `servers/<id>`, under the
/// server's lease, so it disappears when the server does).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerInfo {
    pub id: ServerId,
    /// Where Redis clients connect (`host:port`): what `MOVED` and `CLUSTER SLOTS` name.
    pub client_addr: String,
    /// Where primaries ship replication frames to this server (`host:port`).
    pub repl_addr: String,
}

impl ServerInfo {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a ServerInfo always serializes")
    }

    /// Decodes what `encode` wrote; `what` names the source in the error.
    pub fn decode(bytes: &[u8], what: &str) -> Result<ServerInfo> {
        serde_json::from_slice(bytes).map_err(|e| Error::Decode {
            what: what.to_owned(),
            detail: e.to_string(),
        })
    }
}

/// A region's id: stable across changes of primary; never reused within a map.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RegionId(pub u64);

impl fmt::Display for RegionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Slots `start..=end`, both in `0..SLOTS` once validated.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct SlotRange {
    pub start: u16,
    pub end: u16,
}

impl SlotRange {
    pub fn new(start: u16, end: u16) -> SlotRange {
        SlotRange { start, end }
    }

    pub fn contains(&self, slot: u16) -> bool {
        self.start <= slot && slot <= self.end
    }

    /// The number of slots (0 for a malformed range whose end is below its start).
    pub fn len(&self) -> u32 {
        (u32::from(self.end) + 1).saturating_sub(u32::from(self.start))
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl fmt::Display for SlotRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.start, self.end)
    }
}

/// A range of slots with one primary (which takes its writes) and its backups.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Region {
    pub id: RegionId,
    pub slots: SlotRange,
    pub primary: ServerId,
    pub backups: Vec<ServerId>,
    /// Raised with every change of primary; at least 1.
    pub epoch: u64,
    /// The backups known to hold every write the region ever acknowledged (a subset of
    /// `backups`), and so the only ones that may be promoted. A backup joins when its
    /// primary has seen it catch up (`mark_in_sync`) and stays while it is a backup: no
    /// write is acknowledged without every backup in the map. Absent (empty) in maps
    /// written before it existed: their regions fail over only once their primaries
    /// have reported their backups again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub in_sync: Vec<ServerId>,
    /// A planned failover asked for (`CLUSTER FAILOVER` on this in-sync backup): the
    /// primary stops taking commands for the region, waits until this backup has
    /// acknowledged everything, and promotes it (DESIGN.md, "Planned failover").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoff: Option<ServerId>,
    /// The epoch the region was created at (with the cluster, or as a migration's
    /// target); 0 in maps written before it existed. While `epoch` is still this, its
    /// primary is the one it was created on and may start it empty; a primary named
    /// since must hold its data (a replica to promote, or the keyspace), and a server
    /// that holds neither refuses to serve it rather than serve it empty.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub born_epoch: u64,
}

impl Region {
    /// Whether a primary of this region must hold its data already (see `born_epoch`).
    pub fn has_had_another_primary(&self) -> bool {
        self.born_epoch != 0 && self.epoch != self.born_epoch
    }
}

/// The whole map. `regions` are sorted by their first slot and do not overlap; slots in no
/// region are unassigned (a client is told the cluster does not cover them).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterMap {
    /// Raised by every change.
    pub version: u64,
    /// The highest epoch ever given to a region of this map.
    pub config_epoch: u64,
    pub regions: Vec<Region>,
    /// The last promotion the coordinator wrote (absent in maps written before it was
    /// recorded, and until a first failover).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failover: Option<Failover>,
    /// Slot ranges moving from one region into a new one (`migration`): at most one per
    /// source region. Absent in maps written before migrations existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub migrations: Vec<Migration>,
    /// The highest region id ever given (0 in maps written before it was kept: the
    /// highest id in the map then counts), so a region id is never given twice even
    /// after its region moved away whole.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_region_id: u64,
    /// Backups each region should have (`create --replicas`): what the repair gives a
    /// region short of backups. Absent in maps written before it was kept: the most any
    /// region has counts then (which fell to 0 once every region had lost its backups to
    /// failovers: docs/reliability.md, M10). A region may have one more for a while, a backup the
    /// coordinator added so it can take the region over (`balancing_step`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<usize>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A promotion of a backup for a dead primary, as the coordinator that wrote it saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failover {
    pub region: RegionId,
    /// The region's new epoch.
    pub epoch: u64,
    pub dead: ServerId,
    pub promoted: ServerId,
    /// When the coordinator submitted the map (its wall clock, Unix milliseconds).
    pub at_unix_ms: u64,
    /// From the coordinator reading the server list without the dead primary (etcd had
    /// expired its lease) to submitting the map that promotes: the coordinator's part of
    /// a failover. The lease's time to expire comes before it; the new primary's
    /// promotion after it.
    pub decided_ms: u64,
}

impl ClusterMap {
    /// A map that splits all slots evenly over `primaries`, one region each (region ids
    /// 1, 2, ...; the first `SLOTS % n` regions get one slot more), with no backups.
    pub fn even(primaries: &[ServerId]) -> Result<ClusterMap> {
        if primaries.is_empty() || primaries.len() > usize::from(SLOTS) {
            return Err(Error::Refused(format!(
                "{} primaries: a map needs 1 to {SLOTS}",
                primaries.len()
            )));
        }
        let count = primaries.len() as u64;
        let (per, extra) = (u64::from(SLOTS) / count, u64::from(SLOTS) % count);
        let mut start = 0u64;
        let mut regions = Vec::with_capacity(primaries.len());
        for (i, primary) in (0u64..).zip(primaries) {
            let len = per + u64::from(i < extra);
            let end = start + len - 1;
            regions.push(Region {
                id: RegionId(i + 1),
                slots: SlotRange::new(start as u16, end as u16),
                primary: primary.clone(),
                backups: Vec::new(),
                epoch: i + 1,
                in_sync: Vec::new(),
                handoff: None,
                born_epoch: i + 1,
            });
            start = end + 1;
        }
        let map = ClusterMap {
            version: 1,
            config_epoch: count,
            regions,
            last_failover: None,
            migrations: Vec::new(),
            max_region_id: count,
            replicas: Some(0),
        };
        map.validate()?;
        Ok(map)
    }

    /// [`ClusterMap::even`] with `replicas` backups per region: region `i`'s backups are
    /// the `replicas` servers after its primary in `primaries` (wrapping), so every server
    /// backs as many regions as it leads. Refused unless `replicas < primaries.len()`.
    pub fn even_with_backups(primaries: &[ServerId], replicas: usize) -> Result<ClusterMap> {
        if replicas >= primaries.len() {
            return Err(Error::Refused(format!(
                "{replicas} backups per region need at least {} servers, not {}",
                replicas + 1,
                primaries.len()
            )));
        }
        let mut map = ClusterMap::even(primaries)?;
        map.replicas = Some(replicas);
        let count = primaries.len();
        for (i, region) in map.regions.iter_mut().enumerate() {
            region.backups = (1..=replicas)
                .map(|k| primaries[(i + k) % count].clone())
                .collect();
            // An empty region: every backup holds all of it.
            region.in_sync = region.backups.clone();
        }
        map.validate()?;
        Ok(map)
    }

    /// Checks every invariant: slot ranges in range, sorted and disjoint; region ids
    /// unique; no primary among its own backups; no backup twice; in-sync servers are
    /// backups, once each; epochs from 1 to `config_epoch`; and the migrations'
    /// (`Migration`).
    pub fn validate(&self) -> Result<()> {
        let invalid = |detail: String| Err(Error::InvalidMap(detail));
        let mut ids = std::collections::HashSet::new();
        let mut previous: Option<&Region> = None;
        for region in &self.regions {
            let (id, slots) = (region.id, region.slots);
            if slots.start > slots.end || slots.end >= SLOTS {
                return invalid(format!("region {id}: bad slot range {slots}"));
            }
            if let Some(prev) = previous {
                if prev.slots.end >= slots.start {
                    return invalid(format!(
                        "region {id} (slots {slots}) overlaps or is before region {} (slots {})",
                        prev.id, prev.slots
                    ));
                }
            }
            if !ids.insert(id) {
                return invalid(format!("region id {id} appears twice"));
            }
            if region.epoch == 0 || region.epoch > self.config_epoch {
                return invalid(format!(
                    "region {id}: epoch {} is not in 1..={}",
                    region.epoch, self.config_epoch
                ));
            }
            if region.backups.contains(&region.primary) {
                return invalid(format!(
                    "region {id}: primary {} is also its backup",
                    region.primary
                ));
            }
            for (i, backup) in region.backups.iter().enumerate() {
                if region.backups[..i].contains(backup) {
                    return invalid(format!("region {id}: backup {backup} appears twice"));
                }
            }
            for (i, server) in region.in_sync.iter().enumerate() {
                if !region.backups.contains(server) {
                    return invalid(format!("region {id}: {server} is in sync but not a backup"));
                }
                if region.in_sync[..i].contains(server) {
                    return invalid(format!("region {id}: {server} is in sync twice"));
                }
            }
            if let Some(to) = &region.handoff {
                if !region.in_sync.contains(to) {
                    return invalid(format!(
                        "region {id}: handoff to {to}, which is not an in-sync backup"
                    ));
                }
            }
            previous = Some(region);
        }
        self.validate_migrations(&mut ids)
    }

    /// The JSON kept in etcd.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a ClusterMap always serializes")
    }

    /// Decodes and validates bytes read from etcd; `what` names the source in errors.
    pub fn decode(bytes: &[u8], what: &str) -> Result<ClusterMap> {
        let map: ClusterMap = serde_json::from_slice(bytes).map_err(|e| Error::Decode {
            what: what.to_owned(),
            detail: e.to_string(),
        })?;
        map.validate().map_err(|e| Error::Decode {
            what: what.to_owned(),
            detail: e.to_string(),
        })?;
        Ok(map)
    }

    /// The region that holds `slot`, if any (binary search over the sorted ranges).
    pub fn region_of_slot(&self, slot: u16) -> Option<&Region> {
        let after = self.regions.partition_point(|r| r.slots.start <= slot);
        let region = self.regions[..after].last()?;
        region.slots.contains(slot).then_some(region)
    }

    /// Region `id`: one of `regions`, or the target of a migration (which owns no slot
    /// until the migration finishes, but has its primary, backups and epoch).
    pub fn region(&self, id: RegionId) -> Option<&Region> {
        self.regions
            .iter()
            .chain(self.migrations.iter().map(|m| &m.target))
            .find(|r| r.id == id)
    }

    /// The regions `server` is primary of.
    pub fn regions_led_by<'a>(&'a self, server: &'a ServerId) -> impl Iterator<Item = &'a Region> {
        self.regions.iter().filter(move |r| &r.primary == server)
    }

    /// `backup` becomes the primary of region `id`; the old primary leaves the region
    /// (it is presumed dead or fenced; it may come back later as a backup). The region's
    /// epoch is raised above every epoch of the map. Refused unless `backup` is in sync
    /// (it might lack acknowledged writes). The other backups are in sync no more: the
    /// new primary's log is not the old one's, so each drops its copy and catches up
    /// from nothing, and is marked in sync again once it has (promoted before that, one
    /// would lose every write it had not caught up with).
    pub fn promote(&self, id: RegionId, backup: &ServerId) -> Result<ClusterMap> {
        self.change(id, |map, at| {
            let region = &mut map.regions[at];
            let Some(pos) = region.backups.iter().position(|b| b == backup) else {
                return Err(Error::Refused(format!(
                    "{backup} is not a backup of region {id}"
                )));
            };
            if !region.in_sync.contains(backup) {
                return Err(Error::Refused(format!(
                    "{backup} is a backup of region {id} that has not caught up: it may lack acknowledged writes"
                )));
            }
            region.backups.remove(pos);
            region.in_sync.clear();
            region.handoff = None;
            region.primary = backup.clone();
            map.config_epoch += 1;
            map.regions[at].epoch = map.config_epoch;
            Ok(())
        })
    }

    /// Asks region `id`'s primary (at `epoch`) to hand the region over to its in-sync
    /// backup `to` (a planned failover); `None` withdraws the request. Refused for another
    /// epoch, a backup not in sync, or a region that a migration moves slots out of or
    /// into (its primary is busy with it; finish it first).
    pub fn request_handoff(
        &self,
        id: RegionId,
        epoch: u64,
        to: Option<&ServerId>,
    ) -> Result<ClusterMap> {
        let Some(region) = self.regions.iter().find(|r| r.id == id) else {
            return Err(Error::Refused(format!("no region {id}")));
        };
        if region.epoch != epoch {
            return Err(Error::Refused(format!(
                "region {id} is at epoch {}, not {epoch}",
                region.epoch
            )));
        }
        if let Some(to) = to {
            if !region.in_sync.contains(to) {
                return Err(Error::Refused(format!(
                    "{to} is not an in-sync backup of region {id}"
                )));
            }
            if self
                .migrations
                .iter()
                .any(|m| m.source == id || m.target.id == id)
            {
                return Err(Error::Refused(format!(
                    "region {id} is migrating slots: a planned failover waits for the end"
                )));
            }
        }
        if region.handoff.as_ref() == to {
            return Ok(self.clone());
        }
        self.change(id, |map, at| {
            map.regions[at].handoff = to.cloned();
            Ok(())
        })
    }

    /// Backup `server` of region `id` holds every write the region acknowledged (its
    /// primary at `epoch` saw it catch up). Refused if the region is at another epoch
    /// (a report of an older reign) or `server` is no longer its backup; the map as it
    /// is if `server` is in sync already.
    pub fn mark_in_sync(&self, id: RegionId, epoch: u64, server: &ServerId) -> Result<ClusterMap> {
        let Some(region) = self.region(id) else {
            return Err(Error::Refused(format!("no region {id}")));
        };
        if region.epoch != epoch {
            return Err(Error::Refused(format!(
                "region {id} is at epoch {}, not {epoch}",
                region.epoch
            )));
        }
        if !region.backups.contains(server) {
            return Err(Error::Refused(format!(
                "{server} is not a backup of region {id}"
            )));
        }
        if region.in_sync.contains(server) {
            return Ok(self.clone());
        }
        self.change(id, |map, at| {
            map.regions[at].in_sync.push(server.clone());
            Ok(())
        })
    }

    /// `server` becomes a backup of region `id` (it will catch up from the primary).
    pub fn assign_backup(&self, id: RegionId, server: &ServerId) -> Result<ClusterMap> {
        self.change(id, |map, at| {
            let region = &mut map.regions[at];
            if &region.primary == server || region.backups.contains(server) {
                return Err(Error::Refused(format!(
                    "{server} already serves region {id}"
                )));
            }
            region.backups.push(server.clone());
            Ok(())
        })
    }

    /// Drops `server` from every region's backups. Refused while it is the primary of a
    /// region (promote a backup first). A server the map does not name leaves it as it is.
    pub fn remove_server(&self, server: &ServerId) -> Result<ClusterMap> {
        if let Some(region) = self.regions_led_by(server).next() {
            return Err(Error::Refused(format!(
                "{server} is the primary of region {}: promote a backup first",
                region.id
            )));
        }
        self.without_backup(server)
    }

    /// `server` out of every in-sync list (it restarted: it holds only what its last
    /// commit recorded, and is in sync again once a primary has seen it catch up). The
    /// map as it is when it is in none.
    pub fn out_of_sync(&self, server: &ServerId) -> Result<ClusterMap> {
        let mut map = self.clone();
        let mut changed = false;
        for region in &mut map.regions {
            let before = region.in_sync.len();
            region.in_sync.retain(|b| b != server);
            changed |= region.in_sync.len() != before;
        }
        for migration in &mut map.migrations {
            let before = migration.target.in_sync.len();
            migration.target.in_sync.retain(|b| b != server);
            changed |= migration.target.in_sync.len() != before;
        }
        if changed {
            map.version += 1;
            map.validate()?;
        }
        Ok(map)
    }

    /// `server` out of every region's backups (and in-sync lists), whatever it leads: a
    /// dead server that is still the primary of a region nobody could take over (the
    /// coordinator's repair) must not stay in other regions' backup lists.
    pub fn without_backup(&self, server: &ServerId) -> Result<ClusterMap> {
        let mut map = self.clone();
        let mut changed = false;
        for region in &mut map.regions {
            let before = region.backups.len();
            region.backups.retain(|b| b != server);
            region.in_sync.retain(|b| b != server);
            if region.handoff.as_ref() == Some(server) {
                region.handoff = None;
            }
            changed |= region.backups.len() != before;
        }
        if changed {
            map.version += 1;
            map.validate()?;
        }
        Ok(map)
    }

    /// Applies `edit` to a copy of the map at region `id`'s index, raises the version and
    /// validates the result.
    fn change(
        &self,
        id: RegionId,
        edit: impl FnOnce(&mut ClusterMap, usize) -> Result<()>,
    ) -> Result<ClusterMap> {
        let Some(at) = self.regions.iter().position(|r| r.id == id) else {
            return Err(Error::Refused(format!("no region {id}")));
        };
        let mut map = self.clone();
        edit(&mut map, at)?;
        map.version += 1;
        map.validate()?;
        Ok(map)
    }
}
