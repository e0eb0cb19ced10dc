//! The coordinator's repair of the map after servers died (DESIGN.md, "The coordinator
//! and failover"): a pure function of the map and the live servers, so it is tested
//! without etcd and the coordinator only reads, repairs and writes.
//!
//! Owns: which backup is promoted for a region whose primary is dead, which dead servers
//! leave the backup lists, which live server becomes a new backup. Does not own: when it
//! runs or writing the result (the server's coordinator, through `update_map_as`).

use std::collections::{BTreeMap, BTreeSet};

use super::{ClusterMap, ServerId};
use crate::error::Result;

impl ClusterMap {
    /// The map with every region whose primary is not in `live` led by its first live
    /// in-sync backup (`promote`: a new epoch), the servers not in `live` removed from every
    /// backup list (`without_backup`), and each region given new backups from `live`
    /// (`assign_backup`, the server backing the fewest regions first) until it has
    /// `replicas` (in maps without it, as many as the most any region of `self` has). A region with no live in-sync backup
    /// keeps its dead primary (nobody live is known to hold all its acknowledged writes:
    /// it stays down rather than lose them). Equal to `self` when nothing needs repair.
    ///
    /// Only in-sync backups are promoted: a write is acknowledged only once every backup
    /// of its region has it, but a backup assigned after a write was acknowledged gets it
    /// by catching up, and is in sync only once its primary has seen it done.
    pub fn repaired(&self, live: &BTreeSet<ServerId>) -> Result<ClusterMap> {
        let target = self
            .replicas
            .or_else(|| self.regions.iter().map(|r| r.backups.len()).max());
        let mut map = self.clone();
        for region in &self.regions {
            if live.contains(&region.primary) {
                continue;
            }
            if let Some(backup) = region.in_sync.iter().find(|b| live.contains(*b)) {
                map = map.promote(region.id, backup)?;
            }
        }
        let named: BTreeSet<ServerId> = map
            .regions
            .iter()
            .flat_map(|r| r.backups.iter().cloned())
            .collect();
        for dead in named.iter().filter(|s| !live.contains(*s)) {
            map = map.without_backup(dead)?;
        }
        let target = target.unwrap_or(0);
        let ids: Vec<_> = map.regions.iter().map(|r| r.id).collect();
        for id in ids {
            while let Some(region) = map.region(id) {
                if region.backups.len() >= target || !live.contains(&region.primary) {
                    break;
                }
                let mut load: BTreeMap<&ServerId, usize> = live
                    .iter()
                    .filter(|s| **s != region.primary && !region.backups.contains(s))
                    .map(|s| (s, 0))
                    .collect();
                for r in &map.regions {
                    for b in &r.backups {
                        if let Some(n) = load.get_mut(b) {
                            *n += 1;
                        }
                    }
                }
                let Some((server, _)) = load.into_iter().min_by_key(|(s, n)| (*n, (*s).clone()))
                else {
                    break;
                };
                let server = server.clone();
                map = map.assign_backup(id, &server)?;
            }
        }
        Ok(map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn servers(n: usize) -> Vec<ServerId> {
        let mut ids: Vec<_> = (0..n).map(|_| ServerId::random()).collect();
        ids.sort();
        ids
    }

    #[test]
    fn a_dead_primary_is_replaced_by_its_backup_and_every_region_gets_its_backup_back() {
        let ids = servers(3);
        let map = ClusterMap::even_with_backups(&ids, 1).unwrap();
        let live: BTreeSet<ServerId> = ids[1..].iter().cloned().collect();
        let repaired = map.repaired(&live).unwrap();
        // Region 1 (led by the dead server) is led by its backup, at a new epoch.
        let r1 = repaired.region(super::super::RegionId(1)).unwrap();
        assert_eq!(r1.primary, ids[1]);
        assert!(r1.epoch > map.config_epoch);
        for region in &repaired.regions {
            assert!(live.contains(&region.primary));
            assert_eq!(region.backups.len(), 1, "{region:?}");
            assert!(region.backups.iter().all(|b| live.contains(b)));
        }
        // Nothing more to do the second time.
        assert_eq!(repaired.repaired(&live).unwrap(), repaired);
        // Nothing to do with everyone live.
        let all: BTreeSet<ServerId> = ids.iter().cloned().collect();
        assert_eq!(map.repaired(&all).unwrap(), map);
    }

    #[test]
    fn regions_that_all_lost_their_backups_get_them_back() {
        // The story (the fault campaign, M10, seed 1): kills left one server leading
        // every region and another backing them all; a planned failover on the backup
        // promoted it for every region. A promotion takes the backup out of the backups
        // and keeps no old primary, so no region had a backup left, and the repair, whose
        // target was the most backups any region had, had a target of 0: sync writes were
        // acknowledged with one copy for good.
        let ids = servers(3);
        let mut map = ClusterMap::even_with_backups(&ids, 1).unwrap();
        for id in map.regions.iter().map(|r| r.id).collect::<Vec<_>>() {
            let backup = map.region(id).unwrap().backups[0].clone();
            map = map.promote(id, &backup).unwrap();
        }
        assert!(map.regions.iter().all(|r| r.backups.is_empty()));
        let live: BTreeSet<ServerId> = ids.iter().cloned().collect();
        let repaired = map.repaired(&live).unwrap();
        for region in &repaired.regions {
            assert_eq!(region.backups.len(), 1, "{region:?}");
        }
    }

    #[test]
    fn a_backup_still_catching_up_is_not_promoted() {
        // The story: region 1's first backup died, the coordinator gave it a new one
        // (still copying the region), then the primary died too. Promoting the new
        // backup would lose every write acknowledged before it joined.
        let ids = servers(3);
        let map = ClusterMap::even_with_backups(&ids, 1).unwrap();
        let r1 = super::super::RegionId(1);
        let without_first = map
            .repaired(&[ids[0].clone(), ids[2].clone()].into())
            .unwrap();
        let region = without_first.region(r1).unwrap();
        assert_eq!(region.backups, [ids[2].clone()]);
        assert!(region.in_sync.is_empty(), "a new backup starts out of sync");
        let live: BTreeSet<ServerId> = [ids[2].clone()].into();
        let down = without_first.repaired(&live).unwrap();
        assert_eq!(
            down.region(r1).unwrap().primary,
            ids[0],
            "region 1 stays down"
        );
        // Once its primary reported it caught up, it takes over.
        let synced = without_first
            .mark_in_sync(r1, region.epoch, &ids[2])
            .unwrap();
        let up = synced.repaired(&live).unwrap();
        assert_eq!(up.region(r1).unwrap().primary, ids[2]);
    }

    #[test]
    fn a_dead_primary_nobody_can_replace_still_leaves_the_backup_lists() {
        // The story: with two of three servers dead, a region whose primary and backup
        // both died keeps its dead primary; that server also backed another region, and
        // taking it out of that backup list was refused ("is the primary of region 1"),
        // so every repair failed and the coordinator repaired nothing at all.
        let ids = servers(3);
        let map = ClusterMap::even_with_backups(&ids, 1).unwrap();
        let live: BTreeSet<ServerId> = [ids[2].clone()].into();
        let repaired = map.repaired(&live).unwrap();
        for region in &repaired.regions {
            assert!(
                region.backups.iter().all(|b| live.contains(b)),
                "{region:?}"
            );
        }
        // Region 2 (ids[1] led, ids[2] backed) is led by the survivor.
        assert_eq!(
            repaired.region(super::super::RegionId(2)).unwrap().primary,
            ids[2]
        );
    }

    #[test]
    fn a_region_with_nobody_left_keeps_its_dead_primary() {
        let ids = servers(2);
        let map = ClusterMap::even(&ids).unwrap();
        let live: BTreeSet<ServerId> = [ids[1].clone()].into();
        assert_eq!(map.repaired(&live).unwrap(), map);
    }
}
