//! Rebalancing a volume over several members on the simulated disk (DESIGN.md,
//! "Rebalancing onto a member"): power loss at every I/O of the rebalance, with several
//! crash images each (unsynced writes dropped, reordered or torn), must leave a volume
//! that opens over the same members with each group found exactly once, on its old slot
//! or its new one; every record the engine acknowledged and every synced marker in the
//! moved groups is there, `check` passes, and the rebalance runs again to the end.
//!
//! The volume: two members grown to 8 groups before the engine created its volume on
//! them (so the allocator's bitmaps are in every group, those moved included), records
//! written and synced by the engine, a synced marker at the end of every group (space
//! the engine has not reached), then a third member added (with group 8): 4/4/1 groups,
//! and the rebalance moves group 2 (member 0) and group 3 (member 1) onto member 2: the
//! groups after the first of each member, where the engine's records went on from there
//! (about a third of member 0's blocks in this volume are in group 2).

use std::sync::Arc;

use rand::SeedableRng;
use tucana_torture::member_add::{key, value, verify, writes_reach_member, RECORDS};
use tucana_torture::members;
use tucana_torture::sim::{Fault, Image, SimStorage};
use tucana_torture::workload;

const CRASH_IMAGES_PER_IO: u64 = 4;

/// Bytes of a group (a member slot).
const SLOT_BYTES: u64 = 128 << 20;

/// Groups of the volume before the add, and with it.
const GROUPS: u64 = 8;
const GROUPS_WITH_ADDED: u64 = GROUPS + 1;

fn marker(group: u64) -> Vec<u8> {
    format!("marker of group {group} ").repeat(64).into_bytes()
}

/// Where group `group`'s marker is: the last 64 KiB of the group.
fn marker_at(group: u64) -> u64 {
    (group + 1) * SLOT_BYTES - (64 << 10)
}

/// The volume described in the module doc, closed: its durable image.
fn base() -> Image {
    let sim = Arc::new(SimStorage::new(17));
    let storage = members::volume_grown(&sim, 2, GROUPS).unwrap();
    let db = workload::open(workload::options(false), &storage).unwrap();
    let ks = db.keyspace("k").unwrap();
    for i in 0..RECORDS {
        ks.put(&key(i), &value(i, 0)).unwrap();
    }
    db.close().unwrap();
    drop(storage);
    let storage = members::volume(&sim, 2).unwrap();
    for g in 0..GROUPS {
        storage.write_at(marker_at(g), &marker(g)).unwrap();
    }
    storage.sync().unwrap();
    drop(storage);
    members::add_member(&sim, 2).unwrap();
    sim.durable_image()
}

/// Over the three members: each group has one place (open refuses two unresolved
/// claimants), the markers and the records are there, `check` passes. Returns the
/// groups per member.
fn verify_volume(sim: &Arc<SimStorage>, where_: &str) -> Vec<u64> {
    let storage = members::volume(sim, 3).unwrap_or_else(|e| panic!("{where_}: open: {e}"));
    for g in 0..GROUPS_WITH_ADDED {
        assert!(
            storage.member_of(g * SLOT_BYTES).is_some(),
            "{where_}: group {g}"
        );
    }
    for g in 0..GROUPS {
        let mut back = vec![0u8; marker(g).len()];
        storage.read_at(marker_at(g), &mut back).unwrap();
        assert!(back == marker(g), "{where_}: marker of group {g} lost");
    }
    let groups: Vec<u64> = storage.members().iter().map(|m| m.groups).collect();
    assert_eq!(
        groups.iter().sum::<u64>(),
        GROUPS_WITH_ADDED,
        "{where_}: {groups:?}"
    );
    let db = workload::open(workload::options(false), &storage)
        .unwrap_or_else(|e| panic!("{where_}: engine open: {e}"));
    let ks = db.open_keyspace("k").unwrap();
    verify(&db, &ks, RECORDS, 0, where_);
    db.close().unwrap();
    groups
}

#[test]
fn a_rebalance_moves_two_groups_onto_the_added_member_and_a_second_moves_nothing() {
    let sim = Arc::new(SimStorage::from_image(base(), 1));
    assert_eq!(verify_volume(&sim, "before"), vec![4, 4, 1]);
    let done = members::rebalance(&sim, 3).expect("rebalance");
    assert_eq!((done.groups_moved, done.groups.clone()), (2, vec![3, 3, 3]));
    assert!(done.bytes_moved > 0, "{done:?}");
    assert_eq!(verify_volume(&sim, "after"), vec![3, 3, 3]);
    // Balanced: nothing moves, and nothing is written.
    let probe = Arc::new(SimStorage::from_image(sim.durable_image(), 2));
    let again = members::rebalance(&probe, 3).unwrap();
    assert_eq!((again.groups_moved, again.bytes_moved), (0, 0));
    assert_eq!(probe.io_count_of(tucana_torture::sim::IoKind::Write), 0);
    // The engine goes on over the rebalanced volume and writes reach every member.
    let storage = members::volume(&sim, 3).unwrap();
    let db = workload::open(workload::options(false), &storage).unwrap();
    let ks = db.open_keyspace("k").unwrap();
    writes_reach_member(&db, &ks, 2, "after the rebalance");
    verify(&db, &ks, RECORDS, 1, "after the rebalance");
    db.close().unwrap();
}

#[test]
fn power_loss_at_every_io_of_a_rebalance_leaves_each_group_once_with_its_bytes() {
    let base = base();
    let probe = Arc::new(SimStorage::from_image(base.clone(), 2));
    members::rebalance(&probe, 3).expect("a whole rebalance");
    let ios = probe.io_count();
    assert!(
        ios >= 8,
        "a rebalance reads, copies, writes and syncs: {ios} I/Os"
    );
    let (mut old, mut new, mut part) = (0, 0, 0);
    for at_io in 0..ios {
        for shot in 0..CRASH_IMAGES_PER_IO {
            let where_ = format!("crash at I/O {at_io} of {ios}, image {shot}");
            let sim = Arc::new(SimStorage::from_image(base.clone(), at_io));
            sim.arm(Fault::Crash { at_io });
            assert!(
                members::rebalance(&sim, 3).is_err(),
                "{where_}: the rebalance went on past the crash"
            );
            let mut rng = rand::rngs::StdRng::seed_from_u64(at_io * 100 + shot);
            let after = Arc::new(SimStorage::from_image(sim.crash_image(&mut rng), shot));
            match verify_volume(&after, &where_).as_slice() {
                [4, 4, 1] => old += 1,
                [3, 3, 3] => new += 1,
                _ => part += 1,
            }
            // The rebalance runs again over what the crash left, and finishes.
            let done = members::rebalance(&after, 3)
                .unwrap_or_else(|e| panic!("{where_}: the rebalance again: {e}"));
            assert_eq!(done.groups, vec![3, 3, 3], "{where_}");
            assert_eq!(verify_volume(&after, &where_), vec![3, 3, 3], "{where_}");
        }
    }
    println!(
        "a rebalance makes {ios} I/Os; crash images: {old} before it, {new} after it, {part} with one group moved"
    );
    assert!(old > 0 && new > 0, "old {old}, new {new}, part {part}");
}
