//! Adding a member to a volume over several, on the simulated disk (DESIGN.md, "Adding a
//! member"): power loss at every I/O of the add, with several crash images each (unsynced
//! writes dropped, reordered or torn), must leave either the old volume (it opens over
//! the old members, is refused with the new one, and the add runs again) or the new one
//! (it opens over every member, is refused without the new one); in both, every record is
//! there and `check` passes; and over the new set, new segments go to the new member.

use std::sync::Arc;

use rand::SeedableRng;
use tucana::{Database, Keyspace};
use tucana_torture::members;
use tucana_torture::sim::{Fault, SimStorage};
use tucana_torture::workload;

const RECORDS: u64 = 600;
const CRASH_IMAGES_PER_IO: u64 = 4;

fn key(i: u64) -> Vec<u8> {
    format!("key-{i:06}").into_bytes()
}

fn value(i: u64, round: u64) -> Vec<u8> {
    format!("value-{i}-{round}-").repeat(8).into_bytes()
}

fn open(sim: &Arc<SimStorage>, members: usize) -> tucana::Result<Database> {
    let storage = members::volume(sim, members)?;
    workload::open(workload::options(false), &storage)
}

/// Every record `0..records` has its value of `round`, and `check` passes.
fn verify(db: &Database, ks: &Keyspace, records: u64, round: u64, where_: &str) {
    for i in 0..records {
        assert_eq!(
            ks.get(&key(i)).unwrap().as_deref(),
            Some(&value(i, round)[..]),
            "{where_}: record {i}"
        );
    }
    db.check()
        .unwrap_or_else(|e| panic!("{where_}: check: {e}"));
}

/// A volume over two members holding `RECORDS` records, closed: its durable image.
fn two_member_volume() -> tucana_torture::sim::Image {
    let sim = Arc::new(SimStorage::new(11));
    let db = open(&sim, 2).expect("create a volume over two members");
    let ks = db.keyspace("k").unwrap();
    for i in 0..RECORDS {
        ks.put(&key(i), &value(i, 0)).unwrap();
    }
    db.close().unwrap();
    sim.durable_image()
}

/// Over three members: the records are there, `check` passes, and a second round of
/// writes puts segments on member 2 (the new one) by dispatch.
fn use_three_members(sim: &Arc<SimStorage>, where_: &str) {
    let db = open(sim, 3).unwrap_or_else(|e| panic!("{where_}: open over 3: {e}"));
    let ks = db.open_keyspace("k").unwrap();
    verify(&db, &ks, RECORDS, 0, where_);
    let before = db.stats().members[2].bytes_written;
    // Enough for a dozen segments or more, so every member's turn comes.
    for i in 0..RECORDS * 10 {
        ks.put(&key(i), &value(i, 1)).unwrap();
    }
    db.sync().unwrap();
    let stats = db.stats();
    assert!(
        stats.members[2].bytes_written > before,
        "{where_}: no writes dispatched to the new member: {:?}",
        stats.members
    );
    verify(&db, &ks, RECORDS, 1, where_);
    db.close().unwrap();
}

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
