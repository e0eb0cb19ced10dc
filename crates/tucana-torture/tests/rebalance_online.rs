//! Rebalancing an OPEN volume over several members on the simulated disk (DESIGN.md,
//! "Rebalancing onto a member"), with a writer thread putting and syncing before, during
//! and after the rebalance, INTO the groups that move: power is lost at every I/O of the
//! rebalancing thread (the writer's own I/O goes on around it), with several crash images
//! each. Whatever the crash leaves opens over the same three members with each group
//! found exactly once (on its old slot or its new one) and its marker there, every record
//! and every write a sync acknowledged is there, `check` passes, and the rebalance runs
//! again on the open volume to 5/5/5.
//!
//! The story of this test. Its first version (over `unbalanced_volume`, a round-robin
//! writer) never had a write land in a moving group: its writer's segments went to
//! member 0's and 1's first groups and to member 2's, which no rebalance moves (a slot 0
//! stays), and the moves took a fraction of a second; `--nocapture` printed "0 bytes
//! written twice". Removing the moving mark (`MOVING_BIT`), which makes a write between
//! the mark and the switch go to the new slot too, left it passing: the durability of
//! those writes rested on a unit test over memory members. Here the volume
//! (`pinned_writes_volume`) has member 2's two lowest groups, 2 and 3, come from a move,
//! so they are the ones the rebalance moves off it (4/4/7 to 5/5/5), and the writer is
//! pinned to member 2 (`DispatchPolicy::Member(2)`): its log segments, node runs and the
//! bitmaps of those groups go into group 2, and into group 3 once group 2 has left. And
//! the rebalance waits after each group's copy, before its header, while the group is
//! still marked moving (the test seam `MemberSet::on_rebalance_copied`), until the writer
//! has acknowledged two more syncs: in every run that gets that far, acknowledged puts
//! were written to the old slot after the copy read it. Checked: with the mark's store
//! (`fetch_or(MOVING_BIT)` in `plan_one_move`) removed, or the second write in
//! `write_pieces` skipped, both tests fail: the first when it reads the writer's puts
//! back after the rebalance (the read of a log record in group 2, now on its new slot,
//! fails its checksum: the writes after the copy never reached that slot); the second at
//! the first crash points past group 2's header (I/O 39, image 1; I/O 40, image 0 of 83),
//! an acknowledged put (575) missing after the reopen.

use std::sync::Arc;

use parking_lot::Mutex;
use rand::SeedableRng;
use tucana::volume::{DispatchPolicy, MemberSet, Rebalanced, Storage};
use tucana::Database;
use tucana_torture::member_add::{
    at_every_crash_point, groups_and_markers_of, open, pinned_writes_volume, verify,
    verify_acknowledged, while_writing_with, WriterProgress, PINNED_AFTER, PINNED_BEFORE,
    PINNED_GROUPS, PINNED_MOVED, PUTS_BEFORE_OP, PUTS_PER_SYNC, RECORDS,
};
use tucana_torture::members;
use tucana_torture::sim::SimStorage;
use tucana_torture::workload;

const CRASH_IMAGES_PER_IO: u64 = 4;
/// The name of the thread that runs the rebalance: the crash counts only its I/Os.
const REBALANCER: &str = "rebalancer";
const WRITER: &str = "writer";
/// Syncs the writer acknowledges while a copied group is held moving.
const SYNCS_HELD: u64 = 2;

/// One group held moving after its copy: the puts acknowledged when the hold began and
/// when it ended (those between were written into the group between mark and switch).
#[derive(Clone, Copy, Debug)]
struct Held {
    group: u64,
    from: u64,
    to: u64,
}

/// What a run beside the writer gives back.
struct Run {
    done: tucana::Result<Rebalanced>,
    acknowledged: u64,
    held: Vec<Held>,
    db: Database,
}

/// Opens the volume over `sim`'s three members with every segment and node run
/// dispatched to member 2, starts the writer, and rebalances from a thread named
/// `REBALANCER` once the writer's first puts are acknowledged; after each group's copy the
/// rebalance waits for the writer's next `SYNCS_HELD` syncs.
fn rebalance_while_writing(sim: &Arc<SimStorage>, arm: impl FnOnce()) -> Run {
    let set: Arc<MemberSet> = members::member_set(sim, 3).expect("open the member set");
    let progress = Arc::new(WriterProgress::default());
    let held = Arc::new(Mutex::new(Vec::new()));
    {
        let (progress, held) = (progress.clone(), held.clone());
        set.on_rebalance_copied(move |group| {
            let (from, to) = progress.wait_for_puts(SYNCS_HELD * PUTS_PER_SYNC);
            held.lock().push(Held { group, from, to });
        });
    }
    let storage: Arc<dyn Storage> = set;
    let options = workload::options(false).member_dispatch(DispatchPolicy::Member(2));
    let db = workload::open(options, &storage).expect("open over three members");
    let rebalancing = db.clone();
    let (done, acknowledged) = while_writing_with(
        &db,
        WRITER,
        progress,
        arm,
        REBALANCER,
        move || rebalancing.rebalance(),
        |_, _| {},
    );
    let held = held.lock().clone();
    Run {
        done,
        acknowledged,
        held,
        db,
    }
}

/// Every record of round 0 and every acknowledged writer put is there; `check` passes.
fn verify_all(db: &Database, acknowledged: u64, where_: &str) {
    verify_acknowledged(db, acknowledged, where_);
    let ks = db.open_keyspace("k").unwrap();
    verify(db, &ks, RECORDS, 0, where_);
}

fn groups_and_markers(sim: &Arc<SimStorage>, where_: &str) -> Vec<u64> {
    groups_and_markers_of(sim, PINNED_GROUPS, PINNED_GROUPS, where_)
}

#[test]
fn a_rebalance_of_an_open_volume_while_writing_into_the_moving_groups_keeps_every_put() {
    let sim = Arc::new(SimStorage::from_image(pinned_writes_volume(), 1));
    let run = rebalance_while_writing(&sim, || {});
    let done = run.done.expect("rebalance the open volume");
    let acknowledged = run.acknowledged;
    eprintln!(
        "online rebalance: {} groups, {} bytes moved, {} bytes written twice, beside {acknowledged} acknowledged puts; held moving: {:?}",
        done.groups_moved, done.bytes_moved, done.rewritten_bytes, run.held
    );
    assert_eq!(
        (done.groups_moved, done.groups.clone()),
        (2, PINNED_AFTER.to_vec())
    );
    assert!(acknowledged > PUTS_BEFORE_OP, "the writer went on");
    // Each moved group was held after its copy while the writer synced into it.
    let held: Vec<u64> = run.held.iter().map(|h| h.group).collect();
    assert_eq!(held, PINNED_MOVED);
    assert!(run.held.iter().all(|h| h.to > h.from), "{:?}", run.held);
    let db = run.db;
    let groups: Vec<u64> = db.stats().members.iter().map(|m| m.groups).collect();
    assert_eq!(groups, PINNED_AFTER);
    verify_all(&db, acknowledged, "after an online rebalance");
    // Those writes were written twice (checked after the read back, so that a second
    // write missing shows as the put it loses).
    assert!(
        done.rewritten_bytes > 0,
        "no write landed in a moving group"
    );
    // Balanced: a second rebalance moves nothing.
    let again = db.rebalance().unwrap();
    assert_eq!((again.groups_moved, again.bytes_moved), (0, 0));
    db.close().unwrap();
    assert_eq!(groups_and_markers(&sim, "reopened"), PINNED_AFTER);
    let db = open(&sim, 3).unwrap();
    verify_all(&db, acknowledged, "reopened");
    db.close().unwrap();
}

#[test]
fn power_loss_at_every_io_of_an_online_rebalance_into_which_a_writer_writes_keeps_every_put() {
    let base = pinned_writes_volume();
    // How many I/Os a whole rebalance makes in its own thread, beside the writer (whose
    // data in the moving groups the copy writes too).
    let probe = Arc::new(SimStorage::from_image(base.clone(), 2));
    let run = rebalance_while_writing(&probe, || probe.count_ios_in_thread(REBALANCER));
    run.done.expect("a whole rebalance");
    let ios = probe.ios_in_thread();
    run.db.close().unwrap();
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
        let run = rebalance_while_writing(&sim, || sim.arm_crash_in_thread(REBALANCER, at_io));
        let acknowledged = run.acknowledged;
        // Its syncs may be done by the writer's, so it may finish before the point.
        let finished = run.done.is_ok();
        if !finished {
            assert!(
                sim.crashed(),
                "crash at I/O {at_io}: failed without a crash: {:?}",
                run.done
            );
        }
        let images: Vec<_> = (0..CRASH_IMAGES_PER_IO)
            .map(|shot| match shot {
                0 => sim.durable_image(),
                1 => sim.current_image(),
                _ => sim.crash_image(&mut rand::rngs::StdRng::seed_from_u64(at_io * 100 + shot)),
            })
            .collect();
        run.db.abandon();
        for (shot, image) in images.into_iter().enumerate() {
            let where_ = format!("crash at I/O {at_io} of the rebalance's {ios}, image {shot}");
            let after = Arc::new(SimStorage::from_image(image, shot as u64));
            match groups_and_markers(&after, &where_) {
                g if g == PINNED_BEFORE => old += 1,
                g if g == PINNED_AFTER => new += 1,
                _ => part += 1,
            }
            let db = open(&after, 3).unwrap_or_else(|e| panic!("{where_}: open: {e}"));
            verify_all(&db, acknowledged, &where_);
            // The rebalance runs again on the open volume over what the crash left.
            let again = db
                .rebalance()
                .unwrap_or_else(|e| panic!("{where_}: the rebalance again: {e}"));
            assert_eq!(again.groups, PINNED_AFTER, "{where_}");
            db.close().unwrap();
            assert_eq!(groups_and_markers(&after, &where_), PINNED_AFTER);
            let db = open(&after, 3).unwrap();
            verify_all(&db, acknowledged, &where_);
            db.close().unwrap();
        }
        // Puts acknowledged while a copied group was held moving, in this run.
        let held: u64 = run.held.iter().map(|h| h.to - h.from).sum();
        (old, new, part, u32::from(finished), held)
    });
    let (old, new, part, finished, held) = counts.iter().fold((0, 0, 0, 0, 0), |a, c| {
        (a.0 + c.0, a.1 + c.1, a.2 + c.2, a.3 + c.3, a.4 + c.4)
    });
    let points_held = counts.iter().filter(|c| c.4 > 0).count();
    eprintln!(
        "{ios} I/Os in the rebalance; crash images: {old} before it, {new} after it, {part} with one group moved ({finished} runs finished before their crash point); {points_held} of {} runs held a copied group moving while {held} puts were acknowledged",
        counts.len()
    );
    assert!(old > 0 && new > 0, "old {old}, new {new}, part {part}");
    assert!(
        held > 0,
        "no run acknowledged puts while a group was moving"
    );
}
