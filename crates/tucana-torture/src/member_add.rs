//! What the tests of adding and removing a member share (`tests/add_member.rs`, the add to
//! a closed volume; `tests/add_member_online.rs`, the add to an open one;
//! `tests/remove_member.rs`; `tests/rebalance.rs` and `tests/rebalance_online.rs`): the
//! records a volume is filled with, closed two- and three-member volumes holding them
//! (and two whose groups are uneven, for the rebalance), opening over some windows of
//! the simulated disk, and the checks made after a crash (every record there, `check`
//! passes, new segments reach a given member, each group found once with its marker);
//! and the writer that runs beside an operation on the open volume (`while_writing`),
//! with how far it got (`WriterProgress`).
//!
//! Owns: the records' keys and values and those checks. Does not own: the windows and the
//! add itself (`members`), nor the crash model (`sim`).
//!
//! Thread-safety: plain functions; each test drives them from its own thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};

use tucana::volume::Storage;
use tucana::{Database, Keyspace};

use crate::sim::{Image, SimStorage};
use crate::{members, workload};

/// The writer's puts between two syncs (`while_writing`).
pub const PUTS_PER_SYNC: u64 = 8;
/// Puts the writer has acknowledged before the operation starts (`while_writing`).
pub const PUTS_BEFORE_OP: u64 = 64;

/// Records of the two-member volume the adds start from.
pub const RECORDS: u64 = 600;

pub fn key(i: u64) -> Vec<u8> {
    format!("key-{i:06}").into_bytes()
}

pub fn value(i: u64, round: u64) -> Vec<u8> {
    format!("value-{i}-{round}-").repeat(8).into_bytes()
}

/// The engine over windows `0..members` of `sim` (no background threads).
pub fn open(sim: &Arc<SimStorage>, members: usize) -> tucana::Result<Database> {
    let storage = members::volume(sim, members)?;
    workload::open(workload::options(false), &storage)
}

/// The engine over the windows `which` of `sim` (a volume a member was removed from).
pub fn open_over(sim: &Arc<SimStorage>, which: &[usize]) -> tucana::Result<Database> {
    let storage = members::volume_over(sim, which)?;
    workload::open(workload::options(false), &storage)
}

/// Every record `0..records` has its value of `round`, and `check` passes.
pub fn verify(db: &Database, ks: &Keyspace, records: u64, round: u64, where_: &str) {
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

/// A volume over two members holding `RECORDS` records (round 0) in keyspace `k`,
/// closed: its durable image.
pub fn two_member_volume() -> Image {
    let sim = Arc::new(SimStorage::new(11));
    let db = open(&sim, 2).expect("create a volume over two members");
    let ks = db.keyspace("k").unwrap();
    for i in 0..RECORDS {
        ks.put(&key(i), &value(i, 0)).unwrap();
    }
    db.close().unwrap();
    sim.durable_image()
}

/// A volume over three members whose records are spread over all three: `RECORDS`
/// records of round 0, then `10 × RECORDS` of round 1 (`writes_reach_member` asserts
/// member 1, the one the removal tests take out, was written); closed: its durable image.
pub fn three_member_volume() -> Image {
    let sim = Arc::new(SimStorage::new(13));
    let db = open(&sim, 3).expect("create a volume over three members");
    let ks = db.keyspace("k").unwrap();
    for i in 0..RECORDS {
        ks.put(&key(i), &value(i, 0)).unwrap();
    }
    writes_reach_member(&db, &ks, 1, "filling three members");
    db.close().unwrap();
    sim.durable_image()
}

/// Over three members: the records of round 0 are there, `check` passes, and a second
/// round of writes puts segments on member 2 (the new one) by dispatch.
pub fn use_three_members(sim: &Arc<SimStorage>, where_: &str) {
    let db = open(sim, 3).unwrap_or_else(|e| panic!("{where_}: open over 3: {e}"));
    let ks = db.open_keyspace("k").unwrap();
    verify(&db, &ks, RECORDS, 0, where_);
    writes_reach_member(&db, &ks, 2, where_);
    verify(&db, &ks, RECORDS, 1, where_);
    db.close().unwrap();
}

/// Writes round 1 over ten times `RECORDS` keys (a dozen segments or more, so every
/// member's turn comes), syncs, and asserts member `member` was written meanwhile.
pub fn writes_reach_member(db: &Database, ks: &Keyspace, member: usize, where_: &str) {
    let before = db.stats().members[member].bytes_written;
    for i in 0..RECORDS * 10 {
        ks.put(&key(i), &value(i, 1)).unwrap();
    }
    db.sync().unwrap();
    let stats = db.stats();
    assert!(
        stats.members[member].bytes_written > before,
        "{where_}: no writes dispatched to member {member}: {:?}",
        stats.members
    );
}

/// Bytes of a group (a member slot).
const SLOT_BYTES: u64 = 128 << 20;

/// Groups of `unbalanced_volume` before its third member was added, and with it.
pub const UNEVEN_GROUPS: u64 = 8;
pub const UNEVEN_GROUPS_WITH_ADDED: u64 = UNEVEN_GROUPS + 1;

fn marker(group: u64) -> Vec<u8> {
    format!("marker of group {group} ").repeat(64).into_bytes()
}

/// Where group `group`'s marker is: its last 64 KiB (space the engine has not reached).
fn marker_at(group: u64) -> u64 {
    (group + 1) * SLOT_BYTES - (64 << 10)
}

/// Two members grown to `UNEVEN_GROUPS` groups (4 each, round-robin) before the engine
/// created its volume on them (so its allocator's bitmaps are in every group), `RECORDS`
/// records (round 0) in keyspace `k`, a synced marker at the end of every group, then a
/// third member added with group 8: 4/4/1 groups. Closed: its durable image.
pub fn unbalanced_volume() -> Image {
    let sim = Arc::new(SimStorage::new(17));
    let storage = members::volume_grown(&sim, 2, UNEVEN_GROUPS).unwrap();
    let db = workload::open(workload::options(false), &storage).unwrap();
    let ks = db.keyspace("k").unwrap();
    for i in 0..RECORDS {
        ks.put(&key(i), &value(i, 0)).unwrap();
    }
    db.close().unwrap();
    drop(storage);
    let storage = members::volume(&sim, 2).unwrap();
    for g in 0..UNEVEN_GROUPS {
        storage.write_at(marker_at(g), &marker(g)).unwrap();
    }
    storage.sync().unwrap();
    drop(storage);
    members::add_member(&sim, 2).unwrap();
    sim.durable_image()
}

/// Over `unbalanced_volume`'s three members, as a member set: each group has one place
/// (open refuses two claimants it does not resolve) and every marker is there. Returns
/// the groups per member.
pub fn groups_and_markers(sim: &Arc<SimStorage>, where_: &str) -> Vec<u64> {
    groups_and_markers_of(sim, UNEVEN_GROUPS_WITH_ADDED, UNEVEN_GROUPS, where_)
}

/// As `groups_and_markers`, for a volume over three members of `groups` groups of which
/// `0..marked` have a marker.
pub fn groups_and_markers_of(
    sim: &Arc<SimStorage>,
    groups: u64,
    marked: u64,
    where_: &str,
) -> Vec<u64> {
    let storage = members::volume(sim, 3).unwrap_or_else(|e| panic!("{where_}: open: {e}"));
    for g in 0..groups {
        assert!(
            storage.member_of(g * SLOT_BYTES).is_some(),
            "{where_}: group {g}"
        );
    }
    for g in 0..marked {
        let mut back = vec![0u8; marker(g).len()];
        storage.read_at(marker_at(g), &mut back).unwrap();
        assert!(back == marker(g), "{where_}: marker of group {g} lost");
    }
    let per_member: Vec<u64> = storage.members().iter().map(|m| m.groups).collect();
    assert_eq!(
        per_member.iter().sum::<u64>(),
        groups,
        "{where_}: {per_member:?}"
    );
    per_member
}

/// Groups of `pinned_writes_volume`, and how many each member holds before and after
/// its rebalance.
pub const PINNED_GROUPS: u64 = 15;
pub const PINNED_BEFORE: [u64; 3] = [4, 4, 7];
pub const PINNED_AFTER: [u64; 3] = [5, 5, 5];
/// The groups its rebalance moves, in order: member 2's two lowest.
pub const PINNED_MOVED: [u64; 2] = [2, 3];

/// A volume over three members whose rebalance moves the groups that a writer pinned to
/// member 2 (`DispatchPolicy::Member(2)`) writes into. Placement puts a member's first
/// group in its slot 0, which no rebalance moves, and a pinned writer fills its member's
/// lowest group with room first (next fit from block 0); so member 2's lowest groups must
/// have come to it by a move. `unbalanced_volume` (4/4/1, records and markers) rebalanced
/// while closed (groups 2 and 3 to member 2's slots 1 and 2: 3/3/3), then grown while
/// closed, as an add grows it, with group 9 on member 0 and group 10 on member 1 (into the
/// slots that rebalance freed, so the moves below copy into fresh slots and skip their
/// zeros) and groups 11–14 on member 2: 4/4/7, a synced marker at the end of each new
/// group too. Its rebalance moves group 2 to member 0, then group 3 to member 1: 5/5/5
/// (`PINNED_MOVED`). Closed: its durable image.
pub fn pinned_writes_volume() -> Image {
    let sim = Arc::new(SimStorage::from_image(unbalanced_volume(), 19));
    let moved = members::rebalance(&sim, 3).unwrap();
    assert_eq!(moved.groups, vec![3, 3, 3]);
    let set = members::member_set(&sim, 3).unwrap();
    for (member, upto) in [(0, 10), (1, 11), (2, PINNED_GROUPS)] {
        set.place_growth_on(Some(member));
        set.grow(upto * SLOT_BYTES).unwrap();
    }
    set.place_growth_on(None);
    let groups: Vec<u64> = set.members().iter().map(|m| m.groups).collect();
    assert_eq!(groups, PINNED_BEFORE);
    // Member 2's slot 0 holds group 8, placed when it was added.
    for g in PINNED_MOVED {
        assert_eq!(set.member_of(g * SLOT_BYTES), Some(2), "group {g}");
    }
    for g in UNEVEN_GROUPS..PINNED_GROUPS {
        set.write_at(marker_at(g), &marker(g)).unwrap();
    }
    set.sync().unwrap();
    drop(set);
    sim.durable_image()
}

pub fn writer_key(i: u64) -> Vec<u8> {
    format!("writer-{i:06}").into_bytes()
}

pub fn writer_value(i: u64) -> Vec<u8> {
    format!("written-{i}-").repeat(24).into_bytes()
}

/// How far the writer of `while_writing_with` got: the puts a sync acknowledged, and
/// whether it stopped. An operation running beside it waits on it (`wait_for_puts`).
#[derive(Default)]
pub struct WriterProgress {
    /// (puts acknowledged, stopped)
    state: parking_lot::Mutex<(u64, bool)>,
    changed: parking_lot::Condvar,
}

impl WriterProgress {
    fn set(&self, acknowledged: u64, stopped: bool) {
        *self.state.lock() = (acknowledged, stopped);
        self.changed.notify_all();
    }

    /// Waits until the writer has acknowledged `more` puts past those it had when called,
    /// or stopped (an operation failed: the crash). Returns the puts acknowledged when
    /// called and when it returns.
    pub fn wait_for_puts(&self, more: u64) -> (u64, u64) {
        let mut state = self.state.lock();
        let from = state.0;
        while state.0 < from + more && !state.1 {
            self.changed.wait(&mut state);
        }
        (from, state.0)
    }
}

/// Puts `writer_key(i)` for i = 0, 1, … and syncs every `PUTS_PER_SYNC`, until `stop` is
/// set (after at least `PUTS_BEFORE_OP`, which `started` announces) or an operation
/// fails (the crash). Returns how many puts a sync acknowledged, as `progress` says.
fn write_until_stopped(
    ks: &Keyspace,
    db: &Database,
    stop: &AtomicBool,
    started: mpsc::Sender<()>,
    progress: &WriterProgress,
) -> u64 {
    let acknowledged = write_until_failed_or_stopped(ks, db, stop, started, progress);
    progress.set(acknowledged, true);
    acknowledged
}

fn write_until_failed_or_stopped(
    ks: &Keyspace,
    db: &Database,
    stop: &AtomicBool,
    started: mpsc::Sender<()>,
    progress: &WriterProgress,
) -> u64 {
    let mut acknowledged = 0;
    let mut i = 0;
    loop {
        if ks.put(&writer_key(i), &writer_value(i)).is_err() {
            return acknowledged;
        }
        i += 1;
        if i % PUTS_PER_SYNC == 0 {
            if db.sync().is_err() {
                return acknowledged;
            }
            acknowledged = i;
            progress.set(acknowledged, false);
            if i == PUTS_BEFORE_OP {
                let _ = started.send(());
            }
            if i > PUTS_BEFORE_OP && stop.load(Ordering::Acquire) {
                return acknowledged;
            }
        }
    }
}

/// Runs a writer thread named `writer` on keyspace `k` of `db`; once its first
/// `PUTS_BEFORE_OP` puts are acknowledged calls `arm`, runs `op` in a thread named
/// `op_thread` (a crash armed for that thread counts only its I/Os), then `after`, then
/// stops the writer. Returns `op`'s result and the puts a sync acknowledged.
pub fn while_writing<R: Send + 'static>(
    db: &Database,
    writer: &str,
    arm: impl FnOnce(),
    op_thread: &str,
    op: impl FnOnce() -> R + Send + 'static,
    after: impl FnOnce(&Database, &Keyspace),
) -> (R, u64) {
    let progress = Arc::new(WriterProgress::default());
    while_writing_with(db, writer, progress, arm, op_thread, op, after)
}

/// As `while_writing`, the writer telling `progress` how far it got (an operation may
/// wait for it there).
pub fn while_writing_with<R: Send + 'static>(
    db: &Database,
    writer: &str,
    progress: Arc<WriterProgress>,
    arm: impl FnOnce(),
    op_thread: &str,
    op: impl FnOnce() -> R + Send + 'static,
    after: impl FnOnce(&Database, &Keyspace),
) -> (R, u64) {
    let ks = db.open_keyspace("k").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (started, first_puts) = mpsc::channel();
    let writer = {
        let (ks, db, stop) = (ks.clone(), db.clone(), stop.clone());
        std::thread::Builder::new()
            .name(writer.into())
            .spawn(move || write_until_stopped(&ks, &db, &stop, started, &progress))
            .unwrap()
    };
    first_puts
        .recv()
        .expect("the writer acknowledged its first puts");
    arm();
    let result = std::thread::Builder::new()
        .name(op_thread.into())
        .spawn(op)
        .unwrap()
        .join()
        .expect("the operation panicked");
    after(db, &ks);
    stop.store(true, Ordering::Release);
    let acknowledged = writer.join().expect("the writer panicked");
    (result, acknowledged)
}

/// Every put of the writer that a sync acknowledged (`0..acknowledged`) is there.
pub fn verify_acknowledged(db: &Database, acknowledged: u64, where_: &str) {
    let ks = db.open_keyspace("k").unwrap();
    for i in 0..acknowledged {
        assert_eq!(
            ks.get(&writer_key(i)).unwrap().as_deref(),
            Some(&writer_value(i)[..]),
            "{where_}: acknowledged put {i} of {acknowledged}"
        );
    }
}

/// Runs `check(at_io)` for every crash point in `points` and returns the results in
/// order. Each point builds its own simulated disk, so points are independent: they run
/// on as many threads as the machine has cores (a power-loss test of a member operation
/// re-runs the operation and checks several images per point, minutes on one core). A
/// panic in any point fails the caller once every thread has stopped.
pub fn at_every_crash_point<T: Send>(
    points: std::ops::Range<u64>,
    check: impl Fn(u64) -> T + Sync,
) -> Vec<T> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let next = std::sync::atomic::AtomicU64::new(points.start);
    let results = parking_lot::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let at_io = next.fetch_add(1, Ordering::Relaxed);
                if at_io >= points.end {
                    return;
                }
                let result = check(at_io);
                results.lock().push((at_io, result));
            });
        }
    });
    let mut results = results.into_inner();
    results.sort_by_key(|&(at_io, _)| at_io);
    results.into_iter().map(|(_, result)| result).collect()
}
