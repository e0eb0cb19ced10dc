//! Migrations in the map: begin and finish by hand, then property tests that random
//! sequences of migrations, finishes and repairs keep the map valid with every slot
//! owned once, and that the rebalancing plan converges.

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::*;

fn ids(count: usize) -> Vec<ServerId> {
    let mut ids: Vec<_> = (0..count).map(|_| ServerId::random()).collect();
    ids.sort();
    ids
}

/// Every slot's owning region id, slot by slot.
fn owners(map: &ClusterMap) -> Vec<Option<RegionId>> {
    (0..SLOTS)
        .map(|s| map.region_of_slot(s).map(|r| r.id))
        .collect()
}

#[test]
fn a_suffix_moves_into_a_new_region_only_when_finished() {
    let servers = ids(3);
    let map = ClusterMap::even_with_backups(&servers, 1).unwrap();
    let (begun, id) = map
        .begin_migration(
            RegionId(1),
            SlotRange::new(5000, 5461),
            &servers[2],
            vec![servers[0].clone()],
        )
        .unwrap();
    assert_eq!(id, RegionId(4));
    assert!(begun.config_epoch > map.config_epoch);
    // The source still owns the slots; the target is a region for lookups by id.
    assert_eq!(owners(&begun), owners(&map));
    assert_eq!(begun.migration_of_slot(5000).unwrap().target.id, id);
    assert!(begun.migration_of_slot(4999).is_none());
    assert_eq!(begun.region(id).unwrap().primary, servers[2]);
    assert_eq!(ClusterMap::decode(&begun.encode(), "map").unwrap(), begun);
    // One migration per source; only prefixes and suffixes.
    let refused = begun.begin_migration(RegionId(1), SlotRange::new(0, 10), &servers[1], vec![]);
    assert!(matches!(refused, Err(Error::Refused(_))), "{refused:?}");
    let middle = map.begin_migration(RegionId(2), SlotRange::new(6000, 6001), &servers[0], vec![]);
    assert!(matches!(middle, Err(Error::Refused(_))), "{middle:?}");
    let outside = map.begin_migration(RegionId(2), SlotRange::new(0, 5462), &servers[0], vec![]);
    assert!(matches!(outside, Err(Error::Refused(_))), "{outside:?}");

    let finished = begun.finish_migration(RegionId(1)).unwrap();
    assert!(finished.migrations.is_empty());
    assert_eq!(finished.region_of_slot(4999).unwrap().id, RegionId(1));
    assert_eq!(finished.region_of_slot(5000).unwrap().id, id);
    assert_eq!(finished.region_of_slot(5461).unwrap().id, id);
    assert_eq!(finished.region_of_slot(5462).unwrap().id, RegionId(2));
    // Finishing again (a second finisher, after a crash) changes nothing.
    assert_eq!(finished.finish_migration(RegionId(1)).unwrap(), finished);

    // A whole region moves: it leaves the map, and its id is never given again.
    let (whole, id5) = finished
        .begin_migration(
            RegionId(3),
            SlotRange::new(10923, 16383),
            &servers[0],
            vec![],
        )
        .unwrap();
    let whole = whole.finish_migration(RegionId(3)).unwrap();
    assert!(whole.region(RegionId(3)).is_none());
    assert_eq!(whole.region_of_slot(16383).unwrap().id, id5);
    let (_, next) = whole
        .begin_migration(id5, SlotRange::new(16000, 16383), &servers[1], vec![])
        .unwrap();
    assert_eq!(next, RegionId(id5.0 + 1));
}

#[test]
fn a_dead_target_primary_is_replaced_by_its_backup() {
    let servers = ids(3);
    let map = ClusterMap::even(&servers).unwrap();
    let (begun, id) = map
        .begin_migration(
            RegionId(2),
            SlotRange::new(5462, 6000),
            &servers[0],
            vec![servers[1].clone()],
        )
        .unwrap();
    let live: BTreeSet<ServerId> = servers[1..].iter().cloned().collect();
    let repaired = begun.repaired_migrations(&live).unwrap();
    let target = repaired.region(id).unwrap();
    assert_eq!(target.primary, servers[1]);
    assert!(target.backups.is_empty());
    assert!(target.epoch > begun.config_epoch);
    assert_eq!(repaired.repaired_migrations(&live).unwrap(), repaired);
    let all: BTreeSet<ServerId> = servers.iter().cloned().collect();
    assert_eq!(begun.repaired_migrations(&all).unwrap(), begun);
}

#[test]
fn validation_catches_broken_migrations() {
    let servers = ids(2);
    let map = ClusterMap::even(&servers).unwrap();
    let (begun, _) = map
        .begin_migration(RegionId(1), SlotRange::new(0, 99), &servers[1], vec![])
        .unwrap();
    let broken = |edit: &dyn Fn(&mut ClusterMap)| {
        let mut m = begun.clone();
        edit(&mut m);
        assert!(
            matches!(
                ClusterMap::decode(&m.encode(), "map"),
                Err(Error::Decode { .. })
            ),
            "{m:?}"
        );
    };
    broken(&|m| m.migrations[0].source = RegionId(9));
    broken(&|m| m.migrations[0].target.slots = SlotRange::new(10, 20));
    broken(&|m| m.migrations[0].target.id = RegionId(2));
    broken(&|m| m.migrations[0].target.epoch = m.config_epoch + 1);
    broken(&|m| {
        let again = m.migrations[0].clone();
        m.migrations.push(again);
    });
}

/// Applies `moves` by begin and finish until `next_move` has none; the map at the end.
fn run_plan(mut map: ClusterMap, servers: &BTreeSet<ServerId>) -> ClusterMap {
    for _ in 0..64 {
        let Some(step) = map.next_move(servers) else {
            return map;
        };
        let (begun, _) = map
            .begin_migration(step.source, step.slots, &step.to, vec![])
            .unwrap();
        map = begun.finish_migration(step.source).unwrap();
        map.validate().unwrap();
    }
    panic!("no balance after 64 moves: {map:?}");
}

fn loads(map: &ClusterMap, servers: &BTreeSet<ServerId>) -> Vec<u32> {
    servers
        .iter()
        .map(|s| map.regions_led_by(s).map(|r| r.slots.len()).sum())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn migrations_finishes_and_repairs_keep_every_slot_owned_once(
        primaries in 1..5usize,
        steps in proptest::collection::vec((0..4u8, 0..16usize, 0..16384u16, any::<bool>(), 0..8usize), 1..40),
    ) {
        let pool = ids(6);
        let mut map = ClusterMap::even_with_backups(&pool[..primaries], primaries.min(2) - 1).unwrap();
        let mut given: BTreeSet<RegionId> = map.regions.iter().map(|r| r.id).collect();
        for (kind, r, at, suffix, server) in steps {
            let before = map.clone();
            let region = map.regions[r % map.regions.len()].clone();
            let next = match kind {
                0 | 1 => {
                    let len = region.slots.len() as u16;
                    let n = 1 + at % len;
                    let slots = if suffix {
                        SlotRange::new(region.slots.end + 1 - n, region.slots.end)
                    } else {
                        SlotRange::new(region.slots.start, region.slots.start + n - 1)
                    };
                    let to = &pool[server % pool.len()];
                    let backups = map.pick_backups(to, 1, &pool.iter().cloned().collect());
                    match map.begin_migration(region.id, slots, to, backups) {
                        Ok((m, id)) => {
                            prop_assert!(given.insert(id), "region id {} given twice", id);
                            m
                        }
                        Err(Error::Refused(_)) => continue,
                        Err(e) => return Err(TestCaseError::fail(e.to_string())),
                    }
                }
                2 => map.finish_migration(region.id).unwrap(),
                _ => {
                    let live: BTreeSet<ServerId> = pool.iter().enumerate()
                        .filter(|(i, _)| i % 6 != server % 6).map(|(_, s)| s.clone()).collect();
                    // `repaired` refuses (an error, no panic) when a server left as the
                    // dead primary of a region nobody else holds also backs another
                    // region (`remove_server` refuses a primary): a gap of the
                    // repair itself, reported, not of migrations.
                    let repaired = match map.repaired(&live) {
                        Ok(m) => m,
                        Err(Error::Refused(_)) => map.clone(),
                        Err(e) => return Err(TestCaseError::fail(e.to_string())),
                    };
                    repaired.repaired_migrations(&live).unwrap()
                }
            };
            next.validate().unwrap();
            prop_assert_eq!(ClusterMap::decode(&next.encode(), "map").unwrap(), next.clone());
            // Every slot is owned once, before as after; a slot changes owner only by a
            // finish, and then to the target of the migration that moved it.
            for slot in 0..SLOTS {
                let old = before.region_of_slot(slot).map(|r| r.id);
                let new = next.region_of_slot(slot).map(|r| r.id);
                prop_assert!(new.is_some());
                if old != new {
                    prop_assert_eq!(kind, 2);
                    prop_assert_eq!(before.migration_of_slot(slot).map(|m| m.target.id), new);
                }
            }
            prop_assert!(next.config_epoch >= before.config_epoch);
            map = next;
        }
    }

    #[test]
    fn rebalancing_converges_to_even_loads(start in 1..5usize, end in 1..6usize) {
        let pool = ids(6);
        let map = ClusterMap::even(&pool[..start]).unwrap();
        let servers: BTreeSet<ServerId> = pool[..end].iter().cloned().collect();
        let done = run_plan(map, &servers);
        let loads = loads(&done, &servers);
        let (min, max) = (loads.iter().min().unwrap(), loads.iter().max().unwrap());
        prop_assert!(max - min <= 1, "{:?}", loads);
        prop_assert_eq!(loads.iter().sum::<u32>(), u32::from(SLOTS));
        // Servers left out (removed) lead nothing.
        for gone in &pool[end..] {
            prop_assert_eq!(done.regions_led_by(gone).count(), 0);
        }
    }
}

#[test]
fn leadership_evens_out_by_handoffs_to_in_sync_backups() {
    // Three servers, one backup each; the first server died twice over, and its regions
    // went to their backups: servers[1] leads two regions, servers[0] none.
    let servers = ids(3);
    let all: BTreeSet<ServerId> = servers.iter().cloned().collect();
    let map = ClusterMap::even_with_backups(&servers, 1).unwrap();
    assert_eq!(map.next_handoff(&all), None, "even already");
    let r1 = map.regions[0].id;
    let moved = map.promote(r1, &servers[1]).unwrap();
    // Region 1 has no backup now: no handoff of it is possible, and none of region 2
    // (servers[1]'s other region) would help while its backup is not in sync.
    let moved = moved.assign_backup(r1, &servers[0]).unwrap();
    assert_eq!(
        moved.next_handoff(&all),
        None,
        "its backups are not in sync yet"
    );
    let epoch = moved.region(r1).unwrap().epoch;
    let synced = moved.mark_in_sync(r1, epoch, &servers[0]).unwrap();
    let (id, at, to) = synced.next_handoff(&all).expect("a handoff evens it out");
    assert_eq!((id, at, &to), (r1, epoch, &servers[0]));
    let handed = synced.request_handoff(id, at, Some(&to)).unwrap();
    assert_eq!(handed.next_handoff(&all), None, "one is under way");
    let done = handed.promote(id, &to).unwrap();
    assert_eq!(done.next_handoff(&all), None, "even again");
    for server in &servers {
        assert_eq!(done.regions_led_by(server).count(), 1);
    }
}

#[test]
fn the_coordinator_balances_leadership_only_when_the_cluster_is_calm() {
    // As above: servers[1] leads two regions after a failover, servers[0] backs one of
    // them. The coordinator asks for a handoff only once every backup is in sync and
    // alive, and not while one is under way.
    let servers = ids(3);
    let all: BTreeSet<ServerId> = servers.iter().cloned().collect();
    let map = ClusterMap::even_with_backups(&servers, 1).unwrap();
    assert!(map.balancing_step(&all).is_none(), "even already");
    let r1 = map.regions[0].id;
    let moved = map
        .promote(r1, &servers[1])
        .unwrap()
        .assign_backup(r1, &servers[0])
        .unwrap();
    assert!(moved.balancing_step(&all).is_none(), "a backup catching up");
    let epoch = moved.region(r1).unwrap().epoch;
    let synced = moved.mark_in_sync(r1, epoch, &servers[0]).unwrap();
    let without_2: BTreeSet<ServerId> = servers[..2].iter().cloned().collect();
    assert!(
        synced.balancing_step(&without_2).is_none(),
        "a backup of another region is dead: repair comes first"
    );
    let (asked, step) = synced.balancing_step(&all).expect("a handoff evens it out");
    assert_eq!(
        step,
        Balancing::Handoff {
            region: r1,
            to: servers[0].clone()
        }
    );
    assert_eq!(
        asked.region(r1).unwrap().handoff.as_ref(),
        Some(&servers[0])
    );
    assert!(asked.balancing_step(&all).is_none(), "one is under way");
    let done = asked.promote(r1, &servers[0]).unwrap();
    assert!(done.balancing_step(&all).is_none(), "even again");
}

#[test]
fn a_server_that_backs_no_busy_region_is_made_a_backup_of_one_then_handed_it() {
    // servers[0] died; its region went to servers[1], and the repair gave the region
    // servers[2] as its backup: servers[0], back, leads nothing and backs nothing that
    // a handoff could give it. The coordinator first makes it an extra backup of a
    // region of servers[1]; in sync, it is handed the region, which ends with one backup
    // as `--replicas 1` asked (the repair does not give the others a second one).
    let servers = ids(3);
    let all: BTreeSet<ServerId> = servers.iter().cloned().collect();
    let map = ClusterMap::even_with_backups(&servers, 1).unwrap();
    let r1 = map.regions[0].id;
    let mut failed = map
        .promote(r1, &servers[1])
        .unwrap()
        .without_backup(&servers[0])
        .unwrap();
    for region in failed.regions.clone() {
        if region.backups.is_empty() {
            let other = all
                .iter()
                .find(|s| **s != region.primary && **s != servers[0])
                .unwrap();
            failed = failed.assign_backup(region.id, other).unwrap();
            failed = failed
                .mark_in_sync(region.id, failed.region(region.id).unwrap().epoch, other)
                .unwrap();
        }
    }
    assert_eq!(failed.repaired(&all).unwrap(), failed, "nothing to repair");
    assert_eq!(failed.regions_led_by(&servers[0]).count(), 0);
    let (extra, step) = failed.balancing_step(&all).expect("a step");
    let Balancing::Backup { region, server } = step else {
        panic!("{step:?}")
    };
    assert_eq!(server, servers[0]);
    assert_eq!(extra.region(region).unwrap().primary, servers[1]);
    assert_eq!(extra.region(region).unwrap().backups.len(), 2);
    assert_eq!(
        extra.repaired(&all).unwrap(),
        extra,
        "no second backups elsewhere"
    );
    assert!(extra.balancing_step(&all).is_none(), "it is catching up");
    let epoch = extra.region(region).unwrap().epoch;
    let synced = extra.mark_in_sync(region, epoch, &servers[0]).unwrap();
    let (asked, step) = synced.balancing_step(&all).expect("a handoff now");
    assert_eq!(
        step,
        Balancing::Handoff {
            region,
            to: servers[0].clone()
        }
    );
    let done = asked.promote(region, &servers[0]).unwrap();
    assert_eq!(done.region(region).unwrap().backups.len(), 1);
    for server in &servers {
        assert_eq!(done.regions_led_by(server).count(), 1, "{done:?}");
    }
    assert!(done.balancing_step(&all).is_none(), "even again");
}
