//! Rebalancing an OPEN volume over several members on the simulated disk (DESIGN.md,
//! "Rebalancing onto a member"): a writer thread puts and syncs before, during and after
//! the rebalance; power is lost at every I/O of the rebalancing thread (the writer's own
//! I/O goes on around it, and its writes to a moving group are written twice), with
//! several crash images each. Whatever the crash leaves opens over the same three members
//! with each group found exactly once (on its old slot or its new one) and its marker
//! there, every record and every write a sync acknowledged is there, `check` passes, and
//! the rebalance runs again on the open volume to 3/3/3.

use std::sync::Arc;

use rand::SeedableRng;
use tucana::volume::Rebalanced;
use tucana::Database;
use tucana_torture::member_add::{
    at_every_crash_point, groups_and_markers, open, unbalanced_volume, verify, verify_acknowledged,
    while_writing, PUTS_BEFORE_OP, RECORDS,
};
use tucana_torture::sim::SimStorage;

const CRASH_IMAGES_PER_IO: u64 = 4;
/// The name of the thread that runs the rebalance: the crash counts only its I/Os.
const REBALANCER: &str = "rebalancer";
const WRITER: &str = "writer";

/// Opens the volume over `sim`'s three members, starts the writer, rebalances from a
/// thread named `REBALANCER` once the writer's first puts are acknowledged. Returns the
/// rebalance's result, the puts acknowledged, and the database.
fn rebalance_while_writing(
    sim: &Arc<SimStorage>,
    arm: impl FnOnce(),
) -> (tucana::Result<Rebalanced>, u64, Database) {
    let db = open(sim, 3).expect("open over three members");
    let rebalancing = db.clone();
    let (done, acknowledged) = while_writing(
        &db,
        WRITER,
        arm,
        REBALANCER,
        move || rebalancing.rebalance(),
        |_, _| {},
    );
    (done, acknowledged, db)
}

/// Every record of round 0 and every acknowledged writer put is there; `check` passes.
fn verify_all(db: &Database, acknowledged: u64, where_: &str) {
    verify_acknowledged(db, acknowledged, where_);
    let ks = db.open_keyspace("k").unwrap();
    verify(db, &ks, RECORDS, 0, where_);
}

#[test]
fn a_rebalance_of_an_open_volume_while_writing_keeps_every_acknowledged_put() {
    let sim = Arc::new(SimStorage::from_image(unbalanced_volume(), 1));
    let (done, acknowledged, db) = rebalance_while_writing(&sim, || {});
    let done = done.expect("rebalance the open volume");
    eprintln!(
        "online rebalance: {} groups, {} bytes moved, {} bytes written twice, beside {acknowledged} acknowledged puts",
        done.groups_moved, done.bytes_moved, done.rewritten_bytes
    );
    assert_eq!((done.groups_moved, done.groups.clone()), (2, vec![3, 3, 3]));
    assert!(acknowledged > PUTS_BEFORE_OP, "the writer went on");
    let groups: Vec<u64> = db.stats().members.iter().map(|m| m.groups).collect();
    assert_eq!(groups, vec![3, 3, 3]);
    verify_all(&db, acknowledged, "after an online rebalance");
    // Balanced: a second rebalance moves nothing.
    let again = db.rebalance().unwrap();
    assert_eq!((again.groups_moved, again.bytes_moved), (0, 0));
    db.close().unwrap();
    assert_eq!(groups_and_markers(&sim, "reopened"), vec![3, 3, 3]);
    let db = open(&sim, 3).unwrap();
    verify_all(&db, acknowledged, "reopened");
    db.close().unwrap();
}

#[test]
fn power_loss_at_every_io_of_an_online_rebalance_leaves_each_group_once_and_every_put() {
    let base = unbalanced_volume();
    // How many I/Os a whole rebalance makes in its own thread.
    let probe = Arc::new(SimStorage::from_image(base.clone(), 2));
    let db = open(&probe, 3).unwrap();
    db.sync().unwrap();
    let before = probe.io_count();
    db.rebalance().expect("a whole rebalance");
    let ios = probe.io_count() - before;
    db.close().unwrap();
    assert!(
        ios >= 8,
        "a rebalance reads, copies, writes and syncs: {ios} I/Os"
    );
    // Two crash points past the probe's count: the rebalance finishes, then the power
    // fails (as in the online removal's test).
    let counts = at_every_crash_point(0..ios + 2, |at_io| {
        let (mut old, mut new, mut part) = (0, 0, 0);
        // One run per crash point, and every image taken from it: a run (a rebalance
        // beside a writer) costs more than checking an image.
        let sim = Arc::new(SimStorage::from_image(base.clone(), at_io));
        let (done, acknowledged, db) =
            rebalance_while_writing(&sim, || sim.arm_crash_in_thread(REBALANCER, at_io));
        // Its syncs may be done by the writer's, so it may finish before the point.
        let finished = done.is_ok();
        if !finished {
            assert!(
                sim.crashed(),
                "crash at I/O {at_io}: failed without a crash: {done:?}"
            );
        }
        let images: Vec<_> = (0..CRASH_IMAGES_PER_IO)
            .map(|shot| match shot {
                0 => sim.durable_image(),
                1 => sim.current_image(),
                _ => sim.crash_image(&mut rand::rngs::StdRng::seed_from_u64(at_io * 100 + shot)),
            })
            .collect();
        db.abandon();
        for (shot, image) in images.into_iter().enumerate() {
            let where_ = format!("crash at I/O {at_io} of the rebalance's {ios}, image {shot}");
            let after = Arc::new(SimStorage::from_image(image, shot as u64));
            match groups_and_markers(&after, &where_).as_slice() {
                [4, 4, 1] => old += 1,
                [3, 3, 3] => new += 1,
                _ => part += 1,
            }
            let db = open(&after, 3).unwrap_or_else(|e| panic!("{where_}: open: {e}"));
            verify_all(&db, acknowledged, &where_);
            // The rebalance runs again on the open volume over what the crash left.
            let again = db
                .rebalance()
                .unwrap_or_else(|e| panic!("{where_}: the rebalance again: {e}"));
            assert_eq!(again.groups, vec![3, 3, 3], "{where_}");
            db.close().unwrap();
            assert_eq!(groups_and_markers(&after, &where_), vec![3, 3, 3]);
            let db = open(&after, 3).unwrap();
            verify_all(&db, acknowledged, &where_);
            db.close().unwrap();
        }
        (old, new, part, u32::from(finished))
    });
    let (old, new, part, finished) = counts.iter().fold((0, 0, 0, 0), |a, c| {
        (a.0 + c.0, a.1 + c.1, a.2 + c.2, a.3 + c.3)
    });
    eprintln!(
        "{ios} I/Os in the rebalance; crash images: {old} before it, {new} after it, {part} with one group moved ({finished} runs finished before their crash point)"
    );
    assert!(old > 0 && new > 0, "old {old}, new {new}, part {part}");
}
