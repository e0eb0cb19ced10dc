//! Adding a member to an OPEN volume over several, on the simulated disk (DESIGN.md,
//! "Adding a member", *to an open volume*): a writer thread puts and syncs before, during
//! and after the add; power is lost at every I/O of the add (in the adding thread: the
//! writer's own I/O goes on around it), with several crash images each. What the crash
//! leaves must be what the offline analysis says: either the old volume (it opens over the
//! old members, is refused with the new one, and the add runs again on the open volume)
//! or the new one (it opens over every member, is refused without the new one); in both,
//! every record and every write acknowledged by a sync is there and `check` passes; and
//! over the new set, new segments go to the new member.

use std::sync::Arc;

use rand::SeedableRng;
use tucana::Database;
use tucana_torture::member_add::{
    open, two_member_volume, use_three_members, verify, verify_acknowledged, while_writing,
    writer_key, writer_value, writes_reach_member, PUTS_BEFORE_OP, RECORDS,
};
use tucana_torture::members;
use tucana_torture::sim::{SimStorage, BLOCK_BYTES};

const CRASH_IMAGES_PER_IO: u64 = 4;
/// The name of the thread that runs the add: the crash counts only its I/Os.
const ADDER: &str = "adder";
/// The name of the writer thread (a crash after the add counts its I/Os).
const WRITER: &str = "writer";
/// Puts acknowledged before the add starts.
const PUTS_BEFORE_ADD: u64 = PUTS_BEFORE_OP;

/// Opens the volume over `sim`'s two members, starts the writer, adds window 2 from a
/// thread named `ADDER` once the writer's first puts are acknowledged, then (`after`)
/// lets the writer run on until the add returned and `after` did, stops it. Returns the
/// add's result and the puts acknowledged; the database is given to `after` first.
fn add_while_writing(
    sim: &Arc<SimStorage>,
    arm: impl FnOnce(),
    after: impl FnOnce(&Database, &tucana::Keyspace),
) -> (tucana::Result<tucana::volume::AddedMember>, u64, Database) {
    let db = open(sim, 2).expect("open over two members");
    let (name, storage, blank) = members::new_member(sim, 2).unwrap();
    let adding = db.clone();
    let (added, acknowledged) = while_writing(
        &db,
        WRITER,
        arm,
        ADDER,
        move || adding.add_member_storage(&name, storage, blank),
        after,
    );
    (added, acknowledged, db)
}

/// Every record of round 0 and every acknowledged writer put is there; `check` passes.
fn verify_all(db: &Database, acknowledged: u64, where_: &str) {
    verify_acknowledged(db, acknowledged, where_);
    let ks = db.open_keyspace("k").unwrap();
    verify(db, &ks, RECORDS, 0, where_);
}

#[test]
fn an_add_to_an_open_volume_while_writing_gives_the_new_member_segments() {
    let sim = Arc::new(SimStorage::from_image(two_member_volume(), 1));
    let (added, acknowledged, db) = add_while_writing(
        &sim,
        || {},
        |db, ks| {
            // The set grew in place: three members in the figures, and writes reach the
            // new one by dispatch while the writer goes on.
            assert_eq!(db.stats().members.len(), 3);
            writes_reach_member(db, ks, 2, "after an online add");
        },
    );
    let added = added.expect("add a member to the open volume");
    assert_eq!((added.index, added.generation), (2, 1));
    assert!(
        acknowledged > PUTS_BEFORE_ADD,
        "the writer went on after the add"
    );
    db.check().expect("check covers the new member");
    db.close().unwrap();
    let err = open(&sim, 2).err().expect("the old set is refused now");
    assert!(err.to_string().contains("missing"), "{err}");
    let db = open(&sim, 3).expect("reopen over three");
    let ks = db.open_keyspace("k").unwrap();
    for i in 0..acknowledged {
        assert_eq!(
            ks.get(&writer_key(i)).unwrap().as_deref(),
            Some(&writer_value(i)[..]),
            "acknowledged put {i}"
        );
    }
    verify(&db, &ks, RECORDS, 1, "reopened after an online add");
    assert!(
        db.stats().members[2].groups >= 1,
        "{:?}",
        db.stats().members
    );
    db.close().unwrap();
}

#[test]
fn power_loss_at_every_io_of_an_online_add_leaves_the_old_volume_or_the_new_one() {
    let base = two_member_volume();
    // How many I/Os a whole add makes (the same sequence whatever the writer does: the
    // crash below counts only the adding thread's).
    let probe = Arc::new(SimStorage::from_image(base.clone(), 2));
    let db = open(&probe, 2).unwrap();
    db.sync().unwrap();
    let before = probe.io_count();
    let (name, storage, blank) = members::new_member(&probe, 2).unwrap();
    db.add_member_storage(&name, storage, blank)
        .expect("a whole add");
    let ios = probe.io_count() - before;
    db.close().unwrap();
    assert!(ios >= 4, "an add writes and syncs two members: {ios} I/Os");
    let (mut old, mut new) = (0, 0);
    for at_io in 0..ios {
        for shot in 0..CRASH_IMAGES_PER_IO {
            let where_ = format!("crash at I/O {at_io} of the add's {ios}, image {shot}");
            let sim = Arc::new(SimStorage::from_image(base.clone(), at_io));
            let (added, acknowledged, db) =
                add_while_writing(&sim, || sim.arm_crash_in_thread(ADDER, at_io), |_, _| {});
            assert!(added.is_err(), "{where_}: the add went on past the crash");
            assert!(sim.crashed(), "{where_}: no crash");
            // Image 0: none of the writes since the last sync landed; image 1: all of
            // them did (so the crash before the table's sync leaves the new volume
            // whatever the writer did); then a random subset each, dropped, reordered
            // or torn.
            let image = match shot {
                0 => sim.durable_image(),
                1 => sim.current_image(),
                _ => sim.crash_image(&mut rand::rngs::StdRng::seed_from_u64(at_io * 100 + shot)),
            };
            db.abandon();
            let after = Arc::new(SimStorage::from_image(image, shot));
            // Exactly one of the two member sets opens.
            match open(&after, 3) {
                Ok(db) => {
                    new += 1;
                    verify_all(&db, acknowledged, &where_);
                    db.close().unwrap();
                    let two = open(&after, 2).err().expect("both sets open");
                    assert!(two.to_string().contains("missing"), "{where_}: {two}");
                    use_three_members(&after, &where_);
                }
                Err(three) => {
                    old += 1;
                    // As the offline analysis says: no header yet (or a torn one), or a
                    // whole header the table does not name.
                    let why = three.to_string();
                    assert!(
                        why.contains("not a member of a Tucana volume")
                            || why.contains("not in the volume's member table"),
                        "{where_}: {why}"
                    );
                    let db = open(&after, 2).unwrap_or_else(|two| {
                        panic!("{where_}: neither set opens: over 3: {three}; over 2: {two}")
                    });
                    verify_all(&db, acknowledged, &where_);
                    // The add runs again on the open volume over what the crash left.
                    let (name, storage, blank) = members::new_member(&after, 2).unwrap();
                    db.add_member_storage(&name, storage, blank)
                        .unwrap_or_else(|e| panic!("{where_}: the add again: {e}"));
                    db.close().unwrap();
                    use_three_members(&after, &where_);
                }
            }
        }
    }
    eprintln!("{ios} I/Os in the add; crash images: {old} left the old volume, {new} the new one");
    // Crashes landed on both sides of the table's write.
    assert!(old > 0 && new > 0, "old {old}, new {new}");
}

#[test]
fn power_loss_while_writing_after_an_online_add_keeps_every_acknowledged_put() {
    let base = two_member_volume();
    // Crash images with durable data on the new member, and every acknowledged put read
    // back from them.
    let mut on_new_member = 0;
    // The writer's I/Os after the add before power goes: its segments and syncs reach
    // the new member among the others, and the crash falls at points of each.
    for writer_ios in [0u64, 3, 10, 30, 80, 160] {
        let where_ = format!("crash after {writer_ios} of the writer's I/Os after the add");
        let sim = Arc::new(SimStorage::from_image(base.clone(), writer_ios));
        let (added, acknowledged, db) = add_while_writing(
            &sim,
            || {},
            |_, _| {
                sim.arm_crash_in_thread(WRITER, writer_ios);
                let mut waited_ms = 0;
                while !sim.crashed() {
                    assert!(waited_ms < 120_000, "{where_}: the writer never crashed");
                    std::thread::sleep(std::time::Duration::from_millis(1));
                    waited_ms += 1;
                }
            },
        );
        added.unwrap_or_else(|e| panic!("{where_}: the add: {e}"));
        let mut rng = rand::rngs::StdRng::seed_from_u64(writer_ios);
        let image = sim.crash_image(&mut rng);
        db.abandon();
        // Blocks of member 2 (the window at 1 TiB) that survived the crash, past its
        // slot 0's reserved blocks (the header's): the writer's segments, durable there.
        let member_2 = (1u64 << 40) / BLOCK_BYTES..(2u64 << 40) / BLOCK_BYTES;
        let data_blocks = image
            .written_blocks()
            .into_iter()
            .filter(|b| member_2.contains(b) && b - member_2.start >= 8)
            .count();
        let after = Arc::new(SimStorage::from_image(image, writer_ios));
        assert!(open(&after, 2).is_err(), "{where_}: the old set opens");
        let db = open(&after, 3).unwrap_or_else(|e| panic!("{where_}: open over 3: {e}"));
        verify_all(&db, acknowledged, &where_);
        if data_blocks > 0 {
            on_new_member += 1;
        }
        db.close().unwrap();
        use_three_members(&after, &where_);
    }
    assert!(
        on_new_member > 0,
        "no crash image held data on the new member"
    );
}
