//! The map's invariants, lookups and transformations; property tests that random
//! sequences of changes keep the map valid with monotonic epochs, and that no bytes make
//! `decode` panic.

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;

fn ids(count: usize) -> Vec<ServerId> {
    (0..count).map(|_| ServerId::random()).collect()
}

#[test]
fn server_ids() {
    let id = ServerId::random();
    assert_eq!(id.as_str().len(), 40);
    assert_eq!(ServerId::parse(id.as_str()), Some(id.clone()));
    assert_ne!(ServerId::random(), id);
    for bad in ["", "abc", &"A".repeat(40), &"g".repeat(40), &"0".repeat(41)] {
        assert_eq!(ServerId::parse(bad), None);
    }
    // A bad id inside JSON is a decode error, not a panic.
    let info = br#"{"id":"xyz","client_addr":"a:1","repl_addr":"a:2"}"#;
    assert!(matches!(
        ServerInfo::decode(info, "test"),
        Err(Error::Decode { .. })
    ));
}

#[test]
fn even_map_covers_every_slot_once() {
    for count in [1, 2, 3, 7, 16384] {
        let map = ClusterMap::even(&ids(count)).unwrap();
        assert_eq!(map.regions.len(), count);
        assert_eq!(map.regions[0].slots.start, 0);
        assert_eq!(map.regions.last().unwrap().slots.end, SLOTS - 1);
        let total: u32 = map.regions.iter().map(|r| r.slots.len()).sum();
        assert_eq!(total, u32::from(SLOTS));
    }
    // Three primaries split as redis-cli --cluster create does: 5462, 5461, 5461.
    let map = ClusterMap::even(&ids(3)).unwrap();
    let ranges: Vec<_> = map.regions.iter().map(|r| r.slots).collect();
    assert_eq!(
        ranges,
        [
            SlotRange::new(0, 5461),
            SlotRange::new(5462, 10922),
            SlotRange::new(10923, 16383)
        ]
    );
    assert!(ClusterMap::even(&[]).is_err());
}

#[test]
fn region_of_slot_finds_the_range() {
    let servers = ids(3);
    let mut map = ClusterMap::even(&servers).unwrap();
    // Leave a hole: slots 100..=199 unassigned.
    map.regions[0].slots = SlotRange::new(200, 5461);
    map.regions.insert(
        0,
        Region {
            id: RegionId(9),
            slots: SlotRange::new(0, 99),
            primary: servers[1].clone(),
            backups: vec![],
            epoch: 1,
            in_sync: vec![],
            handoff: None,
            born_epoch: 1,
        },
    );
    map.validate().unwrap();
    assert_eq!(map.region_of_slot(0).unwrap().id, RegionId(9));
    assert_eq!(map.region_of_slot(99).unwrap().id, RegionId(9));
    assert!(map.region_of_slot(100).is_none());
    assert!(map.region_of_slot(199).is_none());
    assert_eq!(map.region_of_slot(200).unwrap().id, RegionId(1));
    assert_eq!(map.region_of_slot(5462).unwrap().id, RegionId(2));
    assert_eq!(map.region_of_slot(16383).unwrap().id, RegionId(3));
    assert!(map.region_of_slot(16384).is_none());
    let empty = ClusterMap {
        version: 1,
        config_epoch: 0,
        regions: vec![],
        last_failover: None,
        migrations: vec![],
        max_region_id: 0,
        replicas: None,
    };
    empty.validate().unwrap();
    assert!(empty.region_of_slot(5).is_none());
}

fn invalid(edit: impl FnOnce(&mut ClusterMap)) -> String {
    let servers = ids(3);
    let mut map = ClusterMap::even(&servers).unwrap();
    map.regions[0].backups.push(servers[1].clone());
    map.validate().unwrap();
    edit(&mut map);
    let Err(Error::InvalidMap(detail)) = map.validate() else {
        panic!("the map should be invalid: {map:?}");
    };
    // The same map read from etcd is a decode error.
    assert!(matches!(
        ClusterMap::decode(&map.encode(), "test"),
        Err(Error::Decode { .. })
    ));
    detail
}

#[test]
fn validation_catches_each_broken_invariant() {
    let overlap = invalid(|m| m.regions[1].slots.start = 5461);
    assert!(overlap.contains("overlaps"), "{overlap}");
    let unsorted = invalid(|m| m.regions.swap(0, 2));
    assert!(unsorted.contains("overlaps or is before"), "{unsorted}");
    let past_end = invalid(|m| m.regions[2].slots.end = SLOTS);
    assert!(past_end.contains("bad slot range"), "{past_end}");
    let reversed = invalid(|m| m.regions[1].slots = SlotRange::new(6000, 5999));
    assert!(reversed.contains("bad slot range"), "{reversed}");
    let primary_backup = invalid(|m| {
        let primary = m.regions[0].primary.clone();
        m.regions[0].backups.push(primary);
    });
    assert!(
        primary_backup.contains("also its backup"),
        "{primary_backup}"
    );
    let twice = invalid(|m| {
        let backup = m.regions[0].backups[0].clone();
        m.regions[0].backups.push(backup);
    });
    assert!(twice.contains("appears twice"), "{twice}");
    let zero_epoch = invalid(|m| m.regions[1].epoch = 0);
    assert!(zero_epoch.contains("epoch 0"), "{zero_epoch}");
    let future_epoch = invalid(|m| m.regions[1].epoch = m.config_epoch + 1);
    assert!(future_epoch.contains("epoch"), "{future_epoch}");
    let stranger_in_sync = invalid(|m| {
        let primary = m.regions[2].primary.clone();
        m.regions[0].in_sync.push(primary);
    });
    assert!(
        stranger_in_sync.contains("in sync but not a backup"),
        "{stranger_in_sync}"
    );
    let in_sync_twice = invalid(|m| {
        let backup = m.regions[0].backups[0].clone();
        m.regions[0].in_sync.push(backup.clone());
        m.regions[0].in_sync.push(backup);
    });
    assert!(in_sync_twice.contains("in sync twice"), "{in_sync_twice}");
    let same_id = invalid(|m| m.regions[2].id = m.regions[0].id);
    assert!(same_id.contains("appears twice"), "{same_id}");
}

#[test]
fn decode_rejects_garbage_with_an_error() {
    for bytes in [
        &b""[..],
        b"{",
        b"null",
        b"[]",
        b"{\"version\":1}",
        b"\xff\xfe",
    ] {
        assert!(matches!(
            ClusterMap::decode(bytes, "map"),
            Err(Error::Decode { .. })
        ));
    }
    let map = ClusterMap::even(&ids(2)).unwrap();
    assert_eq!(ClusterMap::decode(&map.encode(), "map").unwrap(), map);
    // A map written before regions knew their birth: every primary may start empty, as
    // before.
    let old = String::from_utf8(map.encode())
        .unwrap()
        .replace(",\"born_epoch\":1", "")
        .replace(",\"born_epoch\":2", "");
    assert!(!old.contains("born_epoch"), "{old}");
    let decoded = ClusterMap::decode(old.as_bytes(), "map").unwrap();
    assert!(decoded.regions.iter().all(|r| r.born_epoch == 0));
    assert!(!decoded.regions[0].has_had_another_primary());
}

#[test]
fn promote_assign_remove() {
    let servers = ids(4);
    let map = ClusterMap::even(&servers[..2]).unwrap();
    let (r1, r2) = (RegionId(1), RegionId(2));
    let map = map.assign_backup(r1, &servers[2]).unwrap();
    let map = map.assign_backup(r1, &servers[3]).unwrap();
    assert_eq!(
        map.region(r1).unwrap().backups,
        [servers[2].clone(), servers[3].clone()]
    );
    assert_eq!(
        map.region(r1).unwrap().epoch,
        1,
        "a new backup is no new reign"
    );
    assert!(matches!(
        map.assign_backup(r1, &servers[0]),
        Err(Error::Refused(_))
    ));
    assert!(matches!(
        map.assign_backup(r1, &servers[2]),
        Err(Error::Refused(_))
    ));
    assert!(matches!(
        map.assign_backup(RegionId(7), &servers[2]),
        Err(Error::Refused(_))
    ));

    // servers[0] dies: servers[3] takes region 1 over at an epoch above every other.
    assert!(matches!(
        map.promote(r1, &servers[1]),
        Err(Error::Refused(_))
    ));
    assert!(matches!(
        map.remove_server(&servers[0]),
        Err(Error::Refused(_))
    ));
    // A backup that was never seen caught up may lack acknowledged writes.
    assert!(matches!(
        map.promote(r1, &servers[3]),
        Err(Error::Refused(_))
    ));
    // Reports of another reign, or of a server that is not a backup, change nothing.
    assert!(matches!(
        map.mark_in_sync(r1, 2, &servers[3]),
        Err(Error::Refused(_))
    ));
    assert!(matches!(
        map.mark_in_sync(r1, 1, &servers[1]),
        Err(Error::Refused(_))
    ));
    let map = map.mark_in_sync(r1, 1, &servers[3]).unwrap();
    let map = map.mark_in_sync(r1, 1, &servers[2]).unwrap();
    assert_eq!(map.mark_in_sync(r1, 1, &servers[2]).unwrap(), map);
    let promoted = map.promote(r1, &servers[3]).unwrap();
    let region = promoted.region(r1).unwrap();
    assert_eq!(region.primary, servers[3]);
    assert_eq!(region.backups, [servers[2].clone()]);
    // The story (M10 with link resets, 6aa1e3d): the other backup, kept in sync, dropped
    // its copy to catch up from the new primary, and a kill promoted it without the
    // acknowledged writes. It is in sync again only once the new primary saw it catch up.
    assert!(region.in_sync.is_empty(), "{:?}", region.in_sync);
    assert_eq!(region.epoch, 3);
    // Created at epoch 1 on servers[0]: its primary now must hold its data.
    assert!(!map.region(r1).unwrap().has_had_another_primary());
    assert!(region.has_had_another_primary());
    assert_eq!(promoted.config_epoch, 3);
    assert_eq!(promoted.region(r2).unwrap().epoch, 2);
    assert!(promoted.version > map.version);
    assert_eq!(promoted.regions_led_by(&servers[3]).count(), 1);
    assert_eq!(promoted.regions_led_by(&servers[0]).count(), 0);

    // A planned failover to servers[2] once the new primary saw it catch up: asked for
    // (once is enough), then done.
    assert!(matches!(
        promoted.request_handoff(r1, 3, Some(&servers[2])),
        Err(Error::Refused(_))
    ));
    let promoted = promoted.mark_in_sync(r1, 3, &servers[2]).unwrap();
    let asked = promoted.request_handoff(r1, 3, Some(&servers[2])).unwrap();
    assert_eq!(
        asked.region(r1).unwrap().handoff.as_ref(),
        Some(&servers[2])
    );
    assert_eq!(
        asked.request_handoff(r1, 3, Some(&servers[2])).unwrap(),
        asked
    );
    assert!(matches!(
        asked.request_handoff(r1, 2, Some(&servers[2])),
        Err(Error::Refused(_))
    ));
    let withdrawn = asked.request_handoff(r1, 3, None).unwrap();
    assert_eq!(withdrawn.region(r1).unwrap().handoff, None);
    let handed = asked.promote(r1, &servers[2]).unwrap();
    assert_eq!(handed.region(r1).unwrap().primary, servers[2]);
    assert_eq!(handed.region(r1).unwrap().handoff, None, "done");
    // A server the map drops takes its handoff with it.
    assert_eq!(
        asked
            .without_backup(&servers[2])
            .unwrap()
            .region(r1)
            .unwrap()
            .handoff,
        None
    );

    // servers[2] leaves: dropped from region 1's backups.
    let removed = promoted.remove_server(&servers[2]).unwrap();
    assert!(removed.region(r1).unwrap().backups.is_empty());
    assert!(removed.region(r1).unwrap().in_sync.is_empty());
    assert!(removed.version > promoted.version);
    // A server the map does not name: nothing changes.
    let unknown = ServerId::random();
    assert_eq!(removed.remove_server(&unknown).unwrap(), removed);
}

#[derive(Clone, Debug)]
enum Change {
    Promote { region: usize, backup: usize },
    AssignBackup { region: usize, server: usize },
    RemoveServer { server: usize },
    MarkInSync { region: usize, server: usize },
    Handoff { region: usize, server: usize },
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        (0..8usize, 0..4usize).prop_map(|(region, backup)| Change::Promote { region, backup }),
        (0..8usize, 0..8usize).prop_map(|(region, server)| Change::AssignBackup { region, server }),
        (0..8usize).prop_map(|server| Change::RemoveServer { server }),
        (0..8usize, 0..8usize).prop_map(|(region, server)| Change::MarkInSync { region, server }),
        (0..8usize, 0..8usize).prop_map(|(region, server)| Change::Handoff { region, server }),
    ]
}

/// Applies `change` (indices wrap around the regions, a region's backups, and the pool
/// of servers, so most changes name something that exists).
fn apply(map: &ClusterMap, change: &Change, pool: &[ServerId]) -> Result<ClusterMap> {
    let region = |i: usize| &map.regions[i % map.regions.len()];
    match *change {
        Change::Promote { region: r, backup } => {
            let region = region(r);
            // A region without backups: promote someone who is not one (refused).
            let chosen = match region.backups.len() {
                0 => &pool[backup % pool.len()],
                n => &region.backups[backup % n],
            };
            map.promote(region.id, chosen)
        }
        Change::AssignBackup { region: r, server } => {
            map.assign_backup(region(r).id, &pool[server % pool.len()])
        }
        Change::RemoveServer { server } => map.remove_server(&pool[server % pool.len()]),
        Change::MarkInSync { region: r, server } => {
            let region = region(r);
            map.mark_in_sync(region.id, region.epoch, &pool[server % pool.len()])
        }
        Change::Handoff { region: r, server } => {
            let region = region(r);
            map.request_handoff(region.id, region.epoch, Some(&pool[server % pool.len()]))
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn changes_keep_the_map_valid_and_epochs_monotonic(
        primaries in 1..5usize,
        changes in proptest::collection::vec(change(), 1..60),
    ) {
        let pool = ids(8);
        let mut map = ClusterMap::even(&pool[..primaries]).unwrap();
        let slots: Vec<_> = map.regions.iter().map(|r| (r.id, r.slots)).collect();
        for change in &changes {
            let before = map.clone();
            match apply(&map, change, &pool) {
                Err(Error::Refused(_)) => continue,
                Err(e) => return Err(TestCaseError::fail(format!("{change:?}: {e}"))),
                Ok(next) => map = next,
            }
            map.validate().unwrap();
            prop_assert_eq!(ClusterMap::decode(&map.encode(), "map").unwrap(), map.clone());
            // Slot ranges and region ids never move in these changes.
            let now: Vec<_> = map.regions.iter().map(|r| (r.id, r.slots)).collect();
            prop_assert_eq!(&now, &slots);
            prop_assert!(map.version >= before.version);
            prop_assert!(map.config_epoch >= before.config_epoch);
            let old: HashMap<_, _> = before.regions.iter().map(|r| (r.id, r)).collect();
            for region in &map.regions {
                let was = old[&region.id];
                prop_assert!(region.epoch >= was.epoch);
                if region.primary != was.primary {
                    // A new reign: its epoch is above every epoch the map held.
                    prop_assert!(region.epoch > before.config_epoch);
                    prop_assert!(!region.backups.contains(&was.primary));
                    // Only a backup seen caught up takes over, and the others catch
                    // up from it before they may.
                    prop_assert!(was.in_sync.contains(&region.primary));
                    prop_assert!(region.in_sync.is_empty());
                } else {
                    prop_assert_eq!(region.epoch, was.epoch);
                }
            }
            // No two regions' reigns share an epoch.
            let mut epochs: Vec<_> = map.regions.iter().map(|r| r.epoch).collect();
            epochs.sort_unstable();
            epochs.dedup();
            prop_assert_eq!(epochs.len(), map.regions.len());
        }
    }

    #[test]
    fn decode_never_panics_on_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        if let Ok(map) = ClusterMap::decode(&bytes, "map") {
            map.validate().unwrap();
        }
    }

    #[test]
    fn decode_never_panics_on_altered_maps(
        field in 0..6usize,
        region in 0..3usize,
        value in prop_oneof![Just(0u64), Just(16383), Just(16384), Just(u64::MAX), any::<u64>()],
    ) {
        let map = ClusterMap::even(&ids(3)).unwrap();
        let mut json: serde_json::Value = serde_json::from_slice(&map.encode()).unwrap();
        let target = match field {
            0 => &mut json["version"],
            1 => &mut json["config_epoch"],
            2 => &mut json["regions"][region]["epoch"],
            3 => &mut json["regions"][region]["id"],
            4 => &mut json["regions"][region]["slots"]["start"],
            _ => &mut json["regions"][region]["slots"]["end"],
        };
        *target = serde_json::Value::from(value);
        let bytes = serde_json::to_vec(&json).unwrap();
        if let Ok(decoded) = ClusterMap::decode(&bytes, "map") {
            decoded.validate().unwrap();
        }
    }
}

#[test]
fn even_with_backups_spreads_the_backups_over_the_other_servers() {
    let servers = ids(4);
    let map = ClusterMap::even_with_backups(&servers, 2).unwrap();
    let mut backed: HashMap<&ServerId, usize> = HashMap::new();
    for region in &map.regions {
        assert_eq!(region.backups.len(), 2);
        assert!(!region.backups.contains(&region.primary));
        for b in &region.backups {
            *backed.entry(b).or_default() += 1;
        }
    }
    assert!(servers.iter().all(|s| backed[s] == 2), "{backed:?}");
    assert_eq!(
        ClusterMap::even_with_backups(&servers, 0).unwrap(),
        ClusterMap::even(&servers).unwrap()
    );
    assert!(ClusterMap::even_with_backups(&servers, 4).is_err());
}

#[test]
fn a_restarted_server_is_in_sync_nowhere_until_seen_caught_up_again() {
    // The story: a backup killed and restarted before its lease ran out stayed in sync
    // in the map, holding only what its last commit recorded; had its primary died then,
    // it would have been promoted without the writes it had acknowledged since.
    let servers = ids(3);
    let map = ClusterMap::even_with_backups(&servers, 2).unwrap();
    assert!(map
        .regions
        .iter()
        .all(|r| r.in_sync.contains(&servers[1]) || r.primary == servers[1]));
    let restarted = map.out_of_sync(&servers[1]).unwrap();
    assert!(restarted.version > map.version);
    for (before, after) in map.regions.iter().zip(&restarted.regions) {
        assert!(!after.in_sync.contains(&servers[1]), "{after:?}");
        assert_eq!(after.backups, before.backups, "still a backup");
        assert_eq!(after.epoch, before.epoch);
        let others: Vec<_> = before
            .in_sync
            .iter()
            .filter(|b| **b != servers[1])
            .collect();
        assert_eq!(after.in_sync.iter().collect::<Vec<_>>(), others);
    }
    // Nothing to change the second time.
    assert_eq!(restarted.out_of_sync(&servers[1]).unwrap(), restarted);
}
