//! Slot migrations in the map (DESIGN.md, "Slot migration"): a range of a region's slots
//! moving online into a new region, and the plans that even out the slots over servers
//! by such moves (`rebalance`, `add-server`, `remove-server`).
//!
//! A migration names its source region and a whole target [`Region`] (new id, primary,
//! backups, new epoch) whose `slots` are the range being moved: a prefix or suffix of the
//! source's range, or all of it. Until `finish_migration` the source still owns those
//! slots (ranges stay disjoint, `region_of_slot` answers the source); the target exists
//! only so that its primary creates its keyspace, ships it to its backups and accepts
//! the source's imports. Finishing gives the slots to the target; the map is valid at
//! every step.
//!
//! Owns: `begin_migration`, `finish_migration`, the migrations' invariants, their repair
//! when a target's primary died, and the planning of moves (`next_move`). Does not own:
//! moving the data (the server's migrator), who writes the map (the operator's command
//! begins; the source's primary finishes, through a CAS in `etcd`).
//!
//! Threads: plain values.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use serde::{Deserialize, Serialize};

use super::{ClusterMap, Region, RegionId, ServerId, SlotRange};
use crate::error::{Error, Result};
use crate::slot::SLOTS;

/// Slots `target.slots` of region `source` moving into the new region `target`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Migration {
    pub source: RegionId,
    pub target: Region,
}

/// One step of a plan: move `slots` of region `source` to a new region led by `to`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Move {
    pub source: RegionId,
    pub slots: SlotRange,
    pub to: ServerId,
}

/// The server of `load` leading the most slots (ties: the smallest id), with its count.
fn heaviest(load: &BTreeMap<&ServerId, u32>) -> Option<(ServerId, u32)> {
    load.iter()
        .max_by_key(|(s, n)| (**n, std::cmp::Reverse(**s)))
        .map(|(s, n)| ((*s).clone(), *n))
}

/// The server of `load` leading the fewest slots (ties: the smallest id), with its count.
fn lightest(load: &BTreeMap<&ServerId, u32>) -> Option<(ServerId, u32)> {
    load.iter()
        .min_by_key(|(s, n)| (**n, **s))
        .map(|(s, n)| ((*s).clone(), *n))
}

/// One step of the coordinator's balancing of leadership ([`ClusterMap::balancing_step`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Balancing {
    /// A planned failover of `region` to its in-sync backup `to` was asked for.
    Handoff { region: RegionId, to: ServerId },
    /// `server` became an extra backup of `region`, to take it over once in sync.
    Backup { region: RegionId, server: ServerId },
}

impl ClusterMap {
    /// The migration out of region `source`, if one runs.
    pub fn migration_from(&self, source: RegionId) -> Option<&Migration> {
        self.migrations.iter().find(|m| m.source == source)
    }

    /// The migration moving `slot`, if one does.
    pub fn migration_of_slot(&self, slot: u16) -> Option<&Migration> {
        self.migrations
            .iter()
            .find(|m| m.target.slots.contains(slot))
    }

    /// Every region, the migrations' targets included (what a server must open and ship).
    pub fn all_regions(&self) -> impl Iterator<Item = &Region> {
        self.regions
            .iter()
            .chain(self.migrations.iter().map(|m| &m.target))
    }

    /// The next region id: above every id this map ever gave.
    fn next_region_id(&self) -> u64 {
        let highest = self.all_regions().map(|r| r.id.0).max().unwrap_or(0);
        highest.max(self.max_region_id) + 1
    }

    /// Starts moving `slots` of region `source` into a new region led by `primary` with
    /// `backups`, at a new epoch. Refused if `source` is not a region, already migrates,
    /// or `slots` is not a prefix, a suffix or the whole of its range. The new region's
    /// id is the second value.
    pub fn begin_migration(
        &self,
        source: RegionId,
        slots: SlotRange,
        primary: &ServerId,
        backups: Vec<ServerId>,
    ) -> Result<(ClusterMap, RegionId)> {
        let Some(region) = self.regions.iter().find(|r| r.id == source) else {
            return Err(Error::Refused(format!("no region {source}")));
        };
        if self.migration_from(source).is_some() {
            return Err(Error::Refused(format!(
                "region {source} is already migrating slots"
            )));
        }
        check_part(region, slots).map_err(Error::Refused)?;
        let mut map = self.clone();
        let id = RegionId(self.next_region_id());
        map.max_region_id = id.0;
        map.config_epoch += 1;
        map.migrations.push(Migration {
            source,
            target: Region {
                id,
                slots,
                primary: primary.clone(),
                // The new region is empty, and nothing is imported into it without
                // every backup's acknowledgement: all of them hold all of it.
                in_sync: backups.clone(),
                handoff: None,
                backups,
                epoch: map.config_epoch,
                born_epoch: map.config_epoch,
            },
        });
        map.version += 1;
        map.validate()?;
        Ok((map, id))
    }

    /// Gives the migrating slots of region `source` to the migration's target, which
    /// becomes a region of the map (the source keeps the rest of its range, or leaves
    /// the map if it moved all of it). The same map when `source` migrates nothing (it
    /// was finished already): finishing twice is harmless.
    pub fn finish_migration(&self, source: RegionId) -> Result<ClusterMap> {
        let Some(at) = self.migrations.iter().position(|m| m.source == source) else {
            return Ok(self.clone());
        };
        let mut map = self.clone();
        let migration = map.migrations.remove(at);
        let target = migration.target;
        let Some(pos) = map.regions.iter().position(|r| r.id == source) else {
            return Err(Error::InvalidMap(format!(
                "migration from missing region {source}"
            )));
        };
        let region = &mut map.regions[pos];
        if region.slots == target.slots {
            map.regions.remove(pos);
        } else if region.slots.start == target.slots.start {
            region.slots.start = target.slots.end + 1;
        } else {
            region.slots.end = target.slots.start - 1;
        }
        let insert_at = map
            .regions
            .partition_point(|r| r.slots.start < target.slots.start);
        map.regions.insert(insert_at, target);
        map.version += 1;
        map.validate()?;
        Ok(map)
    }

    /// Each migration's target whose primary is not in `live` led by its first live
    /// in-sync backup, at a new epoch (as `promote` does for a region), and dead servers out of
    /// the targets' backups. A target with nobody live keeps its dead primary (its
    /// imported data is nowhere else). Equal to `self` when nothing needs it.
    pub fn repaired_migrations(&self, live: &BTreeSet<ServerId>) -> Result<ClusterMap> {
        let mut map = self.clone();
        let mut changed = false;
        for i in 0..map.migrations.len() {
            let target = &map.migrations[i].target;
            if !live.contains(&target.primary) {
                let in_sync = |b: &ServerId| live.contains(b) && target.in_sync.contains(b);
                if let Some(pos) = target.backups.iter().position(in_sync) {
                    map.config_epoch += 1;
                    let epoch = map.config_epoch;
                    let target = &mut map.migrations[i].target;
                    target.primary = target.backups.remove(pos);
                    // The others catch up from the new primary (see `promote`).
                    target.in_sync.clear();
                    target.epoch = epoch;
                    changed = true;
                }
            }
            let target = &mut map.migrations[i].target;
            let before = target.backups.len();
            target.backups.retain(|b| live.contains(b));
            target.in_sync.retain(|b| live.contains(b));
            changed |= target.backups.len() != before;
        }
        if changed {
            map.version += 1;
            map.validate()?;
        }
        Ok(map)
    }

    /// `count` backups for a new region led by `primary`: the servers of `live` other
    /// than it that back the fewest regions now (ties by id), fewer if there are not
    /// enough.
    pub fn pick_backups(
        &self,
        primary: &ServerId,
        count: usize,
        live: &BTreeSet<ServerId>,
    ) -> Vec<ServerId> {
        let mut load: BTreeMap<&ServerId, usize> = live
            .iter()
            .filter(|s| *s != primary)
            .map(|s| (s, 0))
            .collect();
        for region in self.all_regions() {
            for b in &region.backups {
                if let Some(n) = load.get_mut(b) {
                    *n += 1;
                }
            }
        }
        let mut ranked: Vec<(usize, &ServerId)> = load.into_iter().map(|(s, n)| (n, s)).collect();
        ranked.sort();
        ranked
            .into_iter()
            .take(count)
            .map(|(_, s)| s.clone())
            .collect()
    }

    /// How many slots each server of `servers` leads (0 for one leading none).
    fn led_slots<'a>(&self, servers: &'a BTreeSet<ServerId>) -> BTreeMap<&'a ServerId, u32> {
        let mut load: BTreeMap<&ServerId, u32> = servers.iter().map(|s| (s, 0)).collect();
        for region in &self.regions {
            if let Some(n) = load.get_mut(&region.primary) {
                *n += region.slots.len();
            }
        }
        load
    }

    /// The next planned failover that evens out the slots led by `servers` without moving
    /// data: a region of the server leading the most slots (above its share) handed over
    /// to one of its in-sync backups in `servers` that then leads no more than its share
    /// (the one leading fewest after it, ties by region id); `None` when none fits or a
    /// migration runs. Returns the region, its epoch and the backup.
    pub fn next_handoff(&self, servers: &BTreeSet<ServerId>) -> Option<(RegionId, u64, ServerId)> {
        if !self.migrations.is_empty() || servers.is_empty() {
            return None;
        }
        let load = self.led_slots(servers);
        let (heavy, heavy_load) = heaviest(&load)?;
        let share = load.values().sum::<u32>().div_ceil(servers.len() as u32);
        if heavy_load <= share {
            return None;
        }
        self.regions
            .iter()
            .filter(|r| r.primary == heavy && r.handoff.is_none())
            .flat_map(|r| {
                r.in_sync
                    .iter()
                    .filter_map(|b| load.get(b).map(|&n| (r, b, n)))
                    .collect::<Vec<_>>()
            })
            .filter(|(r, _, n)| n + r.slots.len() <= share)
            .min_by_key(|(r, b, n)| {
                let after = (heavy_load - r.slots.len()).max(n + r.slots.len());
                (after, r.id, (*b).clone())
            })
            .map(|(r, b, _)| (r.id, r.epoch, b.clone()))
    }

    /// What the coordinator does by itself to even out leadership after failovers left
    /// one server leading more than its share, one step per call, only while the cluster
    /// is calm (every region's primary and backups live and every backup in sync, no
    /// handoff asked, no migration): a planned failover to an in-sync backup that may
    /// take the region ([`ClusterMap::next_handoff`]); failing that, the server leading
    /// the fewest slots made an extra backup of a region of the busiest one it could
    /// take, so that, once it caught up, a later step hands the region to it (a handoff
    /// drops the old primary, so the region is back to `replicas` backups). The region
    /// keeps its in-sync backup throughout. `None` when leadership is even or nothing
    /// fits.
    pub fn balancing_step(&self, live: &BTreeSet<ServerId>) -> Option<(ClusterMap, Balancing)> {
        let calm = self.regions.iter().all(|r| {
            r.handoff.is_none()
                && !r.backups.is_empty()
                && live.contains(&r.primary)
                && r.backups
                    .iter()
                    .all(|b| live.contains(b) && r.in_sync.contains(b))
        });
        if !calm || !self.migrations.is_empty() || live.is_empty() {
            return None;
        }
        if let Some((region, epoch, to)) = self.next_handoff(live) {
            let map = self.request_handoff(region, epoch, Some(&to)).ok()?;
            return Some((map, Balancing::Handoff { region, to }));
        }
        let load = self.led_slots(live);
        let share = load.values().sum::<u32>().div_ceil(live.len() as u32);
        let (heavy, heavy_load) = heaviest(&load)?;
        let (light, light_load) = lightest(&load)?;
        if heavy_load <= share {
            return None;
        }
        let replicas = self.replicas.unwrap_or_else(|| {
            self.regions
                .iter()
                .map(|r| r.backups.len())
                .max()
                .unwrap_or(0)
        });
        let region = self
            .regions
            .iter()
            .filter(|r| r.primary == heavy && !r.backups.contains(&light))
            .filter(|r| r.backups.len() <= replicas)
            .filter(|r| light_load + r.slots.len() <= share)
            .max_by_key(|r| (r.slots.len(), std::cmp::Reverse(r.id)))?;
        let map = self.assign_backup(region.id, &light).ok()?;
        Some((
            map,
            Balancing::Backup {
                region: region.id,
                server: light,
            },
        ))
    }

    /// The next move that evens out the slots led by `servers` (the servers that should
    /// lead; a region led by anyone else moves whole to the server leading the fewest
    /// slots), or `None` when every server of `servers` leads within one slot of its
    /// share... as near as whole slots allow, and no migration is running. Moves are a
    /// suffix of the most loaded server's largest region, as many slots as it has above
    /// its share or the least loaded below it, whichever is fewer.
    pub fn next_move(&self, servers: &BTreeSet<ServerId>) -> Option<Move> {
        if !self.migrations.is_empty() || servers.is_empty() {
            return None;
        }
        let load = self.led_slots(servers);
        if let Some(region) = self.regions.iter().find(|r| !servers.contains(&r.primary)) {
            return Some(Move {
                source: region.id,
                slots: region.slots,
                to: lightest(&load)?.0,
            });
        }
        let total: u32 = load.values().sum();
        let count = servers.len() as u32;
        // Shares of whole slots: the first `total % count` servers (by load, heaviest
        // first) may keep one slot more.
        let high = total.div_ceil(count);
        let low = total / count;
        let (heavy, heavy_load) = heaviest(&load)?;
        let (light, light_load) = lightest(&load)?;
        if heavy_load <= high && light_load >= low {
            return None;
        }
        let amount = (heavy_load - high.min(heavy_load))
            .max(1)
            .min(low.saturating_sub(light_load).max(1));
        let region = self
            .regions
            .iter()
            .filter(|r| r.primary == heavy)
            .max_by_key(|r| (r.slots.len(), std::cmp::Reverse(r.id)))?;
        let amount = amount.min(region.slots.len());
        let slots = SlotRange::new(
            (u32::from(region.slots.end) + 1 - amount) as u16,
            region.slots.end,
        );
        Some(Move {
            source: region.id,
            slots,
            to: light,
        })
    }

    /// The migrations' invariants (part of `validate`): each source is a region of the
    /// map migrating once; each target's slots a prefix, suffix or all of its source's
    /// range; targets' ids unique among all regions; targets' epochs, primaries and
    /// backups as a region's.
    pub(super) fn validate_migrations(&self, ids: &mut HashSet<RegionId>) -> Result<()> {
        let invalid = |detail: String| Err(Error::InvalidMap(detail));
        let mut sources = HashSet::new();
        for m in &self.migrations {
            let target = &m.target;
            let Some(source) = self.regions.iter().find(|r| r.id == m.source) else {
                return invalid(format!("migration from missing region {}", m.source));
            };
            if !sources.insert(m.source) {
                return invalid(format!("region {} migrates twice", m.source));
            }
            if let Err(detail) = check_part(source, target.slots) {
                return invalid(format!("migration to region {}: {detail}", target.id));
            }
            if !ids.insert(target.id) {
                return invalid(format!("region id {} appears twice", target.id));
            }
            if target.epoch == 0 || target.epoch > self.config_epoch {
                return invalid(format!(
                    "region {}: epoch {} is not in 1..={}",
                    target.id, target.epoch, self.config_epoch
                ));
            }
            if target.backups.contains(&target.primary) {
                return invalid(format!(
                    "region {}: primary {} is also its backup",
                    target.id, target.primary
                ));
            }
            for (i, backup) in target.backups.iter().enumerate() {
                if target.backups[..i].contains(backup) {
                    return invalid(format!(
                        "region {}: backup {backup} appears twice",
                        target.id
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Whether `slots` is a prefix, a suffix or all of `region`'s range (so both parts stay
/// one range each); the reason if not.
fn check_part(region: &Region, slots: SlotRange) -> std::result::Result<(), String> {
    let r = region.slots;
    let ok = slots.start <= slots.end
        && slots.end < SLOTS
        && r.start <= slots.start
        && slots.end <= r.end
        && (slots.start == r.start || slots.end == r.end);
    if ok {
        Ok(())
    } else {
        Err(format!(
            "slots {slots} are not a prefix, a suffix or all of region {}'s {r}",
            region.id
        ))
    }
}
