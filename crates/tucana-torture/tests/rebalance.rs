//! Rebalancing a volume over several members on the simulated disk (DESIGN.md,
//! "Rebalancing onto a member"): power loss at every I/O of the rebalance, with several
//! crash images each (unsynced writes dropped, reordered or torn), must leave a volume
//! that opens over the same members with each group found exactly once, on its old slot
//! or its new one; every record the engine acknowledged and every synced marker in the
//! moved groups is there, `check` passes, and the rebalance runs again to the end.
//!
//! The volume (`member_add::unbalanced_volume`): two members grown to 8 groups before
//! the engine created its volume on them (so the allocator's bitmaps are in every group,
//! those moved included), records written and synced by the engine, a synced marker at
//! the end of every group (space the engine has not reached), then a third member added
//! (with group 8): 4/4/1 groups, and the rebalance moves group 2 (member 0) and group 3
//! (member 1) onto member 2: the groups after the first of each member, where the
//! engine's records went on from there (about a third of member 0's blocks in this
//! volume are in group 2).

use std::sync::Arc;

use rand::SeedableRng;
use tucana_torture::member_add::{
    at_every_crash_point, groups_and_markers, open, unbalanced_volume, verify, writes_reach_member,
    RECORDS,
};
use tucana_torture::members;
use tucana_torture::sim::{Fault, SimStorage};

const CRASH_IMAGES_PER_IO: u64 = 4;

/// Over the three members: each group found once with its marker, the records there,
/// `check` passes. Returns the groups per member.
fn verify_volume(sim: &Arc<SimStorage>, where_: &str) -> Vec<u64> {
    let groups = groups_and_markers(sim, where_);
    let db = open(sim, 3).unwrap_or_else(|e| panic!("{where_}: engine open: {e}"));
    let ks = db.open_keyspace("k").unwrap();
    verify(&db, &ks, RECORDS, 0, where_);
    db.close().unwrap();
    groups
}

#[test]
fn a_rebalance_moves_two_groups_onto_the_added_member_and_a_second_moves_nothing() {
    let sim = Arc::new(SimStorage::from_image(unbalanced_volume(), 1));
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
    let db = open(&sim, 3).unwrap();
    let ks = db.open_keyspace("k").unwrap();
    writes_reach_member(&db, &ks, 2, "after the rebalance");
    verify(&db, &ks, RECORDS, 1, "after the rebalance");
    db.close().unwrap();
}

#[test]
fn power_loss_at_every_io_of_a_rebalance_leaves_each_group_once_with_its_bytes() {
    let base = unbalanced_volume();
    let probe = Arc::new(SimStorage::from_image(base.clone(), 2));
    members::rebalance(&probe, 3).expect("a whole rebalance");
    let ios = probe.io_count();
    assert!(
        ios >= 8,
        "a rebalance reads, copies, writes and syncs: {ios} I/Os"
    );
    let counts = at_every_crash_point(0..ios, |at_io| {
        let (mut old, mut new, mut part) = (0, 0, 0);
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
        (old, new, part)
    });
    let (old, new, part) = counts
        .iter()
        .fold((0, 0, 0), |a, c| (a.0 + c.0, a.1 + c.1, a.2 + c.2));
    println!(
        "a rebalance makes {ios} I/Os; crash images: {old} before it, {new} after it, {part} with one group moved"
    );
    assert!(old > 0 && new > 0, "old {old}, new {new}, part {part}");
}
