//! Adding a member to a volume over several, on the simulated disk (DESIGN.md, "Adding a
//! member"): power loss at every I/O of the add, with several crash images each (unsynced
//! writes dropped, reordered or torn), must leave either the old volume (it opens over
//! the old members, is refused with the new one, and the add runs again) or the new one
//! (it opens over every member, is refused without the new one); in both, every record is
//! there and `check` passes; and over the new set, new segments go to the new member.

use std::sync::Arc;

use rand::SeedableRng;
use tucana_torture::member_add::{open, two_member_volume, use_three_members, verify, RECORDS};
use tucana_torture::members;
use tucana_torture::sim::{Fault, SimStorage};

const CRASH_IMAGES_PER_IO: u64 = 4;

#[test]
fn an_add_over_a_closed_volume_gives_the_new_member_segments_and_check_passes() {
    let sim = Arc::new(SimStorage::from_image(two_member_volume(), 1));
    let added = members::add_member(&sim, 2).expect("add a member");
    assert_eq!((added.index, added.generation), (2, 1));
    let err = open(&sim, 2).err().expect("the old set is refused now");
    assert!(err.to_string().contains("missing"), "{err}");
    use_three_members(&sim, "after a whole add");
    // A second add alternates the table's copy (block 6 this time) and works the same.
    let added = members::add_member(&sim, 3).expect("add a fourth member");
    assert_eq!((added.index, added.generation), (3, 2));
    let db = open(&sim, 4).expect("open over four");
    let ks = db.open_keyspace("k").unwrap();
    verify(&db, &ks, RECORDS, 1, "after a second add");
    db.close().unwrap();
}

#[test]
fn power_loss_at_every_io_of_an_add_leaves_the_old_volume_or_the_new_one() {
    let base = two_member_volume();
    // How many I/Os a whole add makes.
    let probe = Arc::new(SimStorage::from_image(base.clone(), 2));
    members::add_member(&probe, 2).expect("a whole add");
    let ios = probe.io_count();
    assert!(ios >= 4, "an add writes and syncs two members: {ios} I/Os");
    let (mut old, mut new) = (0, 0);
    for at_io in 0..ios {
        for shot in 0..CRASH_IMAGES_PER_IO {
            let where_ = format!("crash at I/O {at_io} of {ios}, image {shot}");
            let sim = Arc::new(SimStorage::from_image(base.clone(), at_io));
            sim.arm(Fault::Crash { at_io });
            assert!(
                members::add_member(&sim, 2).is_err(),
                "{where_}: the add went on past the crash"
            );
            let mut rng = rand::rngs::StdRng::seed_from_u64(at_io * 100 + shot);
            let after = Arc::new(SimStorage::from_image(sim.crash_image(&mut rng), shot));
            // Exactly one of the two member sets opens.
            match open(&after, 3) {
                Ok(db) => {
                    new += 1;
                    db.close().unwrap();
                    let err = open(&after, 2).err();
                    assert!(err.is_some(), "{where_}: both sets open");
                    use_three_members(&after, &where_);
                }
                Err(three) => {
                    old += 1;
                    let db = open(&after, 2).unwrap_or_else(|two| {
                        panic!("{where_}: neither set opens: over 3: {three}; over 2: {two}")
                    });
                    let ks = db.open_keyspace("k").unwrap();
                    verify(&db, &ks, RECORDS, 0, &where_);
                    db.close().unwrap();
                    // The add runs again over what the crash left, and finishes.
                    members::add_member(&after, 2)
                        .unwrap_or_else(|e| panic!("{where_}: the add again: {e}"));
                    use_three_members(&after, &where_);
                }
            }
        }
    }
    // Crashes landed on both sides of the table's write.
    assert!(old > 0 && new > 0, "old {old}, new {new}");
}
