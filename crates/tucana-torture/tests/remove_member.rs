//! Removing a member from a volume over several, on the simulated disk (DESIGN.md,
//! "Removing a member"): power loss at every I/O of the removal, with several crash
//! images each (unsynced writes dropped, reordered or torn), must leave either the old
//! volume (it opens over all three members, is refused without member 1, and the removal
//! runs again) or the new one (it opens over members 0 and 2 and refuses member 1 as
//! removed); in both, every acknowledged write is there and `check` passes; and over the
//! new set, new segments go to the members left, none to the removed one.

use std::sync::Arc;

use rand::SeedableRng;
use tucana_torture::member_add::{
    open, open_over, three_member_volume, verify, writes_reach_member, RECORDS,
};
use tucana_torture::members;
use tucana_torture::sim::{Fault, SimStorage};

const CRASH_IMAGES_PER_IO: u64 = 4;

/// Records written with round 1 by `three_member_volume` (and by `writes_reach_member`).
const WRITTEN: u64 = RECORDS * 10;

/// Over members 0 and 2 after the removal: every record of round 1, `check` passes,
/// member 1 is the removed stand-in, and writes reach member 2 and never member 1.
fn use_the_members_left(sim: &Arc<SimStorage>, where_: &str) {
    let db = open_over(sim, &[0, 2]).unwrap_or_else(|e| panic!("{where_}: open over 0, 2: {e}"));
    let ks = db.open_keyspace("k").unwrap();
    verify(&db, &ks, WRITTEN, 1, where_);
    writes_reach_member(&db, &ks, 2, where_);
    let stats = db.stats();
    assert_eq!(stats.members[1].kind, "removed", "{where_}");
    assert_eq!(stats.members[1].bytes_written, 0, "{where_}");
    assert_eq!(stats.members[1].groups, 0, "{where_}");
    db.close().unwrap();
}

/// Open over all three members is refused, naming member 1 as removed.
fn assert_member_1_refused(sim: &Arc<SimStorage>, where_: &str) {
    let err = open(sim, 3).err().expect("the removed member is refused");
    let err = err.to_string();
    assert!(
        err.contains("sim member 1 is not in the volume's member table: it was member 1"),
        "{where_}: {err}"
    );
}

#[test]
fn a_removal_moves_member_1s_groups_and_the_volume_opens_without_it() {
    let sim = Arc::new(SimStorage::from_image(three_member_volume(), 1));
    let removed = members::remove_member(&sim, &[0, 1, 2], 1).expect("remove member 1");
    assert_eq!((removed.index, removed.generation), (1, 1));
    assert!(
        removed.groups_moved >= 1 && removed.bytes_moved > 0,
        "{removed:?}"
    );
    assert_member_1_refused(&sim, "after a whole removal");
    use_the_members_left(&sim, "after a whole removal");
}

#[test]
fn power_loss_at_every_io_of_a_removal_leaves_the_old_volume_or_the_new_one() {
    let base = three_member_volume();
    // How many I/Os a whole removal makes.
    let probe = Arc::new(SimStorage::from_image(base.clone(), 2));
    members::remove_member(&probe, &[0, 1, 2], 1).expect("a whole removal");
    let ios = probe.io_count();
    assert!(ios >= 6, "a removal reads, writes and syncs: {ios} I/Os");
    let (mut old, mut new) = (0, 0);
    for at_io in 0..ios {
        for shot in 0..CRASH_IMAGES_PER_IO {
            let where_ = format!("crash at I/O {at_io} of {ios}, image {shot}");
            let sim = Arc::new(SimStorage::from_image(base.clone(), at_io));
            sim.arm(Fault::Crash { at_io });
            assert!(
                members::remove_member(&sim, &[0, 1, 2], 1).is_err(),
                "{where_}: the removal went on past the crash"
            );
            let mut rng = rand::rngs::StdRng::seed_from_u64(at_io * 100 + shot);
            let after = Arc::new(SimStorage::from_image(sim.crash_image(&mut rng), shot));
            // Exactly one of the two member sets opens.
            match open(&after, 3) {
                Ok(db) => {
                    old += 1;
                    let ks = db.open_keyspace("k").unwrap();
                    verify(&db, &ks, WRITTEN, 1, &where_);
                    db.close().unwrap();
                    let err = open_over(&after, &[0, 2]).err();
                    assert!(err.is_some(), "{where_}: both sets open");
                    // The removal runs again over what the crash left, and finishes.
                    members::remove_member(&after, &[0, 1, 2], 1)
                        .unwrap_or_else(|e| panic!("{where_}: the removal again: {e}"));
                    assert_member_1_refused(&after, &where_);
                    use_the_members_left(&after, &where_);
                }
                Err(three) => {
                    new += 1;
                    assert!(
                        three.to_string().contains("was removed"),
                        "{where_}: neither the old set nor a removal: {three}"
                    );
                    use_the_members_left(&after, &where_);
                }
            }
        }
    }
    println!("a removal makes {ios} I/Os; crash images: {old} old volume, {new} new volume");
    // Crashes landed on both sides of the table's write.
    assert!(old > 0 && new > 0, "old {old}, new {new}");
}
