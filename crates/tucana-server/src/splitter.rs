//! Automatic splits (issue 19; DESIGN.md, "Automatic splits"): a region this server
//! leads whose live data grows past `--cluster-split-mb` is split in two on the same
//! primary and backups, the way `tucana cluster split` does it by hand: the upper half
//! of its slots is begun as a migration into a new region (a compare-and-swap on the
//! map), and this server's migrator (`migration`) moves the data and finishes it.
//!
//! The primary decides because it alone knows the region's size (the engine's live log
//! bytes of the region's keyspace); the map's rules make a split safe whoever proposes
//! it (one migration per source, ranges that never overlap, a new epoch for the new
//! region), so this adds no new kind of map change. The coordinator is not involved.
//!
//! Owns: when a region is too large and where it is cut. Does not own: the migration
//! (`migration`), the map's rules (`tucana-cluster`).
//!
//! Thread-safety: one task on the listener's runtime; it reads the view and the
//! engine's counters (short locks) and talks to etcd only to propose a split.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tucana_cluster::{ClusterMap, Error, Region, RegionId, SlotRange};

use crate::cluster::{region_keyspace_name, Cluster, Route};
use crate::state::ServerState;

/// How often region sizes are looked at.
const TICK: Duration = Duration::from_secs(2);

/// Splits regions led here that grew past the configured size, until shutdown.
pub async fn run(state: Arc<ServerState>, mut shutdown: watch::Receiver<bool>) {
    let Some(cluster) = state.cluster.clone() else {
        return;
    };
    let limit_bytes = cluster.config().split_bytes;
    if limit_bytes == 0 {
        return;
    }
    loop {
        tokio::select! {
            _ = tokio::time::sleep(TICK) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        let sizes = live_bytes_by_keyspace(&state);
        for (id, at) in too_large(&cluster, &sizes, limit_bytes) {
            let result = cluster.change_map(move |map| split_at(map, id, at)).await;
            match result {
                Ok(()) => eprintln!(
                    "tucana serve: region {id} grew past {} MiB: splitting it at slot {at}",
                    limit_bytes >> 20
                ),
                Err(e) => eprintln!("tucana serve: splitting region {id}: {e}"),
            }
        }
    }
}

/// Live log bytes of each keyspace of the engine (counters; no scan).
fn live_bytes_by_keyspace(state: &ServerState) -> HashMap<String, u64> {
    state
        .store
        .db
        .stats()
        .keyspaces
        .into_iter()
        .map(|k| (k.name, k.live_log_bytes))
        .collect()
}

/// The regions this server leads and serves now that should be split, with the first
/// slot of their upper part.
fn too_large(
    cluster: &Cluster,
    live_bytes: &HashMap<String, u64>,
    limit_bytes: u64,
) -> Vec<(RegionId, u16)> {
    if !cluster.lease_valid() {
        return Vec::new();
    }
    let view = cluster.view();
    let Some(map) = &view.map else {
        return Vec::new();
    };
    map.regions_led_by(&cluster.id)
        .filter(|r| matches!(cluster.route(r.slots.start), Route::Here(id) if id == r.id))
        .filter(|r| !cluster.draining(r.id))
        .filter(|r| {
            live_bytes
                .get(&region_keyspace_name(r.id))
                .copied()
                .unwrap_or(0)
                > limit_bytes
        })
        .filter_map(|r| splittable(map, r).map(|at| (r.id, at)))
        .collect()
}

/// Where `region` would be cut, if it may be split now: it has two slots or more, is
/// not migrating already, and is not being handed over. The cut is the middle slot: a
/// key's slot is a hash of it, so without hash tags the halves hold about as much; a
/// half that is still too large is split again later (one slot cannot be split).
fn splittable(map: &ClusterMap, region: &Region) -> Option<u16> {
    if region.slots.len() < 2 || region.handoff.is_some() {
        return None;
    }
    if map.migration_from(region.id).is_some() {
        return None;
    }
    Some(region.slots.start + (region.slots.len() / 2) as u16)
}

/// `map` with region `id`'s slots from `at` on begun as a migration into a new region on
/// the same primary and backups; the map unchanged if `id` changed meanwhile so that
/// the split no longer fits (gone, cut elsewhere, migrating, handed over).
fn split_at(map: &ClusterMap, id: RegionId, at: u16) -> tucana_cluster::Result<ClusterMap> {
    let Some(region) = map.regions.iter().find(|r| r.id == id) else {
        return Ok(map.clone());
    };
    if splittable(map, region) != Some(at) {
        return Ok(map.clone());
    }
    let upper = SlotRange::new(at, region.slots.end);
    match map.begin_migration(id, upper, &region.primary, region.backups.clone()) {
        Ok((next, _target)) => Ok(next),
        Err(Error::Refused(_)) => Ok(map.clone()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tucana_cluster::ServerId;

    /// Two regions over two servers, each backing the other's.
    fn two_regions() -> ClusterMap {
        let servers: Vec<ServerId> = (0..2).map(|_| ServerId::random()).collect();
        ClusterMap::even_with_backups(&servers, 1).unwrap()
    }

    #[test]
    fn a_region_splits_at_its_middle_slot_into_a_new_region_on_the_same_servers() {
        let map = two_regions();
        let region = map.regions[0].clone();
        let at = splittable(&map, &region).unwrap();
        assert_eq!(at, region.slots.start + (region.slots.len() / 2) as u16);
        let next = split_at(&map, region.id, at).unwrap();
        let m = next.migration_from(region.id).expect("a migration begun");
        assert_eq!(m.target.slots, SlotRange::new(at, region.slots.end));
        assert_eq!(m.target.primary, region.primary);
        assert_eq!(m.target.backups, region.backups);
        assert!(next.config_epoch > map.config_epoch);
    }

    #[test]
    fn a_region_migrating_handed_over_or_of_one_slot_is_not_split() {
        let map = two_regions();
        let region = map.regions[0].clone();
        let at = splittable(&map, &region).unwrap();
        let migrating = split_at(&map, region.id, at).unwrap();
        assert_eq!(splittable(&migrating, &migrating.regions[0]), None);
        // A second proposal made from the same view changes nothing.
        assert_eq!(split_at(&migrating, region.id, at).unwrap(), migrating);

        let mut handed = map.clone();
        handed.regions[0].handoff = Some(handed.regions[0].backups[0].clone());
        assert_eq!(splittable(&handed, &handed.regions[0]), None);

        let mut one = map.clone();
        one.regions[0].slots = SlotRange::new(7, 7);
        assert_eq!(splittable(&one, &one.regions[0]), None);
    }

    #[test]
    fn a_split_proposed_from_a_view_the_map_has_left_behind_changes_nothing() {
        let map = two_regions();
        let region = map.regions[0].clone();
        let at = splittable(&map, &region).unwrap();
        // Someone else cut the region elsewhere first (and finished): the proposal no
        // longer fits and is dropped rather than cutting the rest again.
        let (cut, target) = map
            .begin_migration(
                region.id,
                SlotRange::new(at - 10, region.slots.end),
                &region.primary,
                region.backups.clone(),
            )
            .unwrap();
        let finished = cut.finish_migration(region.id).unwrap();
        assert!(finished.region(target).is_some());
        assert_eq!(split_at(&finished, region.id, at).unwrap(), finished);
        assert_eq!(split_at(&map, RegionId(999), at).unwrap(), map);
    }
}
