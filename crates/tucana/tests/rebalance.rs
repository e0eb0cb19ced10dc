//! Rebalancing a volume over member files (DESIGN.md, "Rebalancing onto a member"): two
//! members holding data and a third added, the rebalance moves groups onto the third
//! until the members differ by one group at most, and the volume reopens with every value
//! read back and `check` clean, takes new writes and reopens again; a second rebalance
//! moves nothing and leaves every byte of every file as it was. And on the open volume,
//! with two writers and a reader running through the rebalance, the writers writing into
//! the groups that move (see `an_open_volume_is_rebalanced_while_writers_write_into_the_moving_groups`).

mod common;
use common::snapshot;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use tucana::volume::{DispatchPolicy, MemberSet, Storage};
use tucana::{Database, Options};

/// Bytes of a group (a member slot).
const SLOT_BYTES: u64 = 128 << 20;

/// Groups the two members have before the add: what about 1 GiB written would leave,
/// placed round-robin (4 each), without writing it (the files stay sparse).
const GROUPS: u64 = 8;

const KEYS: u64 = 20_000;

fn options() -> Options {
    Database::builder()
        .commit_interval(None)
        .flush_interval(None)
        // Small segments, so the keys fill many of them on both members.
        .log_segment_bytes(256 << 10)
        .mapping_reservation_bytes(1 << 30)
}

fn key(i: u64) -> Vec<u8> {
    format!("key-{i:08}").into_bytes()
}

fn value(i: u64, round: u64) -> Vec<u8> {
    format!("value {i:08} {round} {}", "v".repeat((i % 400) as usize)).into_bytes()
}

fn read_back(db: &Database, keys: u64, round: u64, where_: &str) {
    let ks = db.open_keyspace("ks").unwrap();
    for i in 0..keys {
        assert_eq!(
            ks.get(&key(i)).unwrap().as_deref(),
            Some(&value(i, round)[..]),
            "{where_}: key {i}"
        );
    }
}

/// Member files `volume.m0..m2` in `dir`: the first two grown to `GROUPS` groups before
/// the engine created its volume on them, `KEYS` keys written twice with a commit
/// between (round 1 last), then the third added: 4/4/1 groups.
fn unbalanced_volume(dir: &Path) -> Vec<PathBuf> {
    let paths: Vec<PathBuf> = (0..3).map(|i| dir.join(format!("volume.m{i}"))).collect();
    let set = MemberSet::open_paths(&paths[..2], true, 1 << 30).unwrap();
    set.grow(GROUPS * SLOT_BYTES).unwrap();
    let db = options().open_storage(Arc::new(set)).unwrap();
    let ks = db.keyspace("ks").unwrap();
    for round in 0..2 {
        for i in 0..KEYS {
            ks.put(&key(i), &value(i, round)).unwrap();
        }
        db.commit().unwrap();
    }
    drop(ks);
    db.close().unwrap();
    let added = options().add_member(&paths[..2], &paths[2]).unwrap();
    assert_eq!((added.index, added.group), (2, GROUPS));
    paths
}

/// Groups per member of `pinned_writes_volume`, before and after its rebalance.
const PINNED_BEFORE: [u64; 3] = [4, 4, 7];
const PINNED_AFTER: [u64; 3] = [5, 5, 5];

/// `unbalanced_volume` rebalanced while closed (groups 2 and 3 go to member 2, in its
/// slots 1 and 2: 3/3/3), then grown while closed by one group on member 0, one on member
/// 1 (into the slots that rebalance freed) and four on member 2: 4/4/7. A writer pinned
/// to member 2 fills its lowest group with room first, group 2, and its rebalance moves
/// member 2's lowest groups outside its slot 0: group 2 to member 0, then group 3 to
/// member 1 (5/5/5). The same volume as tucana-torture's `pinned_writes_volume`.
fn pinned_writes_volume(dir: &Path) -> Vec<PathBuf> {
    let paths = unbalanced_volume(dir);
    let done = options().rebalance(&paths).unwrap();
    assert_eq!(done.groups, vec![3, 3, 3]);
    let set = MemberSet::open_paths(&paths, false, 1 << 30).unwrap();
    for (member, upto) in [(0, GROUPS + 2), (1, GROUPS + 3), (2, GROUPS + 7)] {
        set.place_growth_on(Some(member));
        set.grow(upto * SLOT_BYTES).unwrap();
    }
    set.place_growth_on(None);
    let groups: Vec<u64> = set.members().iter().map(|m| m.groups).collect();
    assert_eq!(groups, PINNED_BEFORE);
    for g in [2, 3] {
        assert_eq!(set.member_of(g * SLOT_BYTES), Some(2), "group {g}");
    }
    set.sync().unwrap();
    paths
}

/// The writers' syncs, and how many writers run: a rebalance held in
/// `MemberSet::on_rebalance_copied` waits here for the writers' next syncs.
#[derive(Default)]
struct Syncs {
    /// (syncs done, writers running)
    state: Mutex<(u64, usize)>,
    changed: Condvar,
}

impl Syncs {
    fn update(&self, f: impl FnOnce(&mut (u64, usize))) {
        f(&mut self.state.lock().unwrap());
        self.changed.notify_all();
    }

    /// Waits for `more` syncs past those done now, or until no writer runs; returns
    /// the syncs done meanwhile.
    fn wait_for(&self, more: u64) -> u64 {
        let mut state = self.state.lock().unwrap();
        let from = state.0;
        while state.0 < from + more && state.1 > 0 {
            state = self.changed.wait(state).unwrap();
        }
        state.0 - from
    }
}

/// A writer leaving (returning or panicking) is no longer waited for.
struct Running(Arc<Syncs>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.update(|s| s.1 -= 1);
    }
}

#[test]
fn two_members_with_data_and_an_added_one_are_rebalanced_and_every_value_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let paths = unbalanced_volume(dir.path());
    let done = options().rebalance(&paths).unwrap();
    println!(
        "rebalance: {} groups, {} bytes moved; groups per member {:?}",
        done.groups_moved, done.bytes_moved, done.groups
    );
    // 4/4/1 → 3/3/3: one group off each of the two first members.
    assert_eq!((done.groups_moved, done.groups.clone()), (2, vec![3, 3, 3]));
    assert!(done.bytes_moved > 0);

    let db = options().open_members(&paths).unwrap();
    read_back(&db, KEYS, 1, "after the rebalance");
    let report = db.check().unwrap();
    assert_eq!(report.members, 3);
    let groups: Vec<u64> = db.stats().members.iter().map(|m| m.groups).collect();
    assert_eq!(groups, vec![3, 3, 3]);
    let (most, fewest) = (groups.iter().max().unwrap(), groups.iter().min().unwrap());
    assert!(most - fewest <= 1, "{groups:?}");
    // New writes over the rebalanced volume, then a reopen.
    let ks = db.open_keyspace("ks").unwrap();
    for i in 0..KEYS / 2 {
        ks.put(&key(i), &value(i, 2)).unwrap();
    }
    drop(ks);
    db.close().unwrap();
    let db = options().open_members(&paths).unwrap();
    read_back(&db, KEYS / 2, 2, "after a reopen");
    db.check().unwrap();
    db.close().unwrap();

    // Balanced: a second rebalance moves nothing and writes nothing.
    let before = snapshot(dir.path());
    let again = options().rebalance(&paths).unwrap();
    assert_eq!((again.groups_moved, again.bytes_moved), (0, 0));
    assert_eq!(snapshot(dir.path()), before);
}

/// Rebalances the open volume while two writers put (and sync every 500 puts) and a reader
/// reads, then reopens it and reads every put back.
///
/// The story of this test. Its first version, over `unbalanced_volume` with round-robin
/// dispatch, never had a put land in a moving group: the writers' segments went to each
/// member's first group, which no rebalance moves, and the moves of these sparse groups
/// took a fraction of a second; it printed 0 bytes written twice in each of three runs,
/// so the second write of a put to a moving group (DESIGN.md, "Rebalancing onto a
/// member") was not tested over files. Now the volume is `pinned_writes_volume`, the
/// writers are pinned to member 2 (`DispatchPolicy::Member(2)`), so their segments and
/// node runs go into group 2 and, once it has moved, group 3, the two groups the
/// rebalance moves; and the rebalance is held after each group's copy, the group still
/// marked moving, until the writers have synced twice (`MemberSet::on_rebalance_copied`).
/// Checked: without the mark's store (`fetch_or(MOVING_BIT)` in `plan_one_move`), or with
/// the second write in `write_pieces` skipped, `check` on the open volume after the
/// rebalance fails: a log record in group 2, read from its new slot, fails its checksum
/// (the writes after the copy never reached that slot).
#[test]
fn an_open_volume_is_rebalanced_while_writers_write_into_the_moving_groups() {
    let dir = tempfile::tempdir().unwrap();
    let paths = pinned_writes_volume(dir.path());
    let set = MemberSet::open_paths(&paths, false, 1 << 30).unwrap();
    let syncs = Arc::new(Syncs::default());
    let held = Arc::new(Mutex::new(Vec::new()));
    {
        let (syncs, held) = (syncs.clone(), held.clone());
        set.on_rebalance_copied(move |group| {
            let synced = syncs.wait_for(2);
            held.lock().unwrap().push((group, synced));
        });
    }
    let db = Database::builder()
        .flush_interval(None)
        .log_segment_bytes(256 << 10)
        .mapping_reservation_bytes(1 << 30)
        .member_dispatch(DispatchPolicy::Member(2))
        .open_storage(Arc::new(set))
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    syncs.update(|s| s.1 = 2);
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let (db, stop, running) = (db.clone(), stop.clone(), Running(syncs.clone()));
            std::thread::spawn(move || {
                let ks = db.open_keyspace("ks").unwrap();
                let mut n = 0u64;
                while !stop.load(Ordering::Acquire) || n < 2_000 {
                    ks.put(&new_key(w, n), &value(n, 3)).unwrap();
                    n += 1;
                    if n.is_multiple_of(500) {
                        db.sync().unwrap();
                        running.0.update(|s| s.0 += 1);
                    }
                }
                n
            })
        })
        .collect();
    let reader = {
        let (db, stop) = (db.clone(), stop.clone());
        std::thread::spawn(move || {
            let ks = db.open_keyspace("ks").unwrap();
            let mut i = 0u64;
            while !stop.load(Ordering::Acquire) {
                let k = (i * 7919) % KEYS;
                assert_eq!(ks.get(&key(k)).unwrap().as_deref(), Some(&value(k, 1)[..]));
                i += 1;
            }
        })
    };
    let done = db.rebalance().unwrap();
    stop.store(true, Ordering::Release);
    let written: Vec<u64> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    reader.join().unwrap();
    let held = held.lock().unwrap().clone();
    println!(
        "online rebalance: {} groups, {} bytes moved, {} written twice, beside {written:?} puts; (group, writers' syncs while held): {held:?}",
        done.groups_moved, done.bytes_moved, done.rewritten_bytes
    );
    assert_eq!(
        (done.groups_moved, done.groups.clone()),
        (2, PINNED_AFTER.to_vec())
    );
    // Each moved group was held until the writers had synced into it twice.
    let groups_held: Vec<u64> = held.iter().map(|&(g, _)| g).collect();
    assert_eq!(groups_held, vec![2, 3]);
    assert!(held.iter().all(|&(_, synced)| synced >= 2), "{held:?}");
    db.check().unwrap();
    db.close().unwrap();
    let db = options().open_members(&paths).unwrap();
    let groups: Vec<u64> = db.stats().members.iter().map(|m| m.groups).collect();
    assert_eq!(groups, PINNED_AFTER);
    read_back(&db, KEYS, 1, "after the online rebalance");
    let ks = db.open_keyspace("ks").unwrap();
    for (w, &n) in written.iter().enumerate() {
        for i in 0..n {
            assert_eq!(
                ks.get(&new_key(w as u64, i)).unwrap().as_deref(),
                Some(&value(i, 3)[..]),
                "writer {w}, put {i}"
            );
        }
    }
    db.check().unwrap();
    db.close().unwrap();
    // Checked after the read back, so that a second write missing shows as the put lost.
    assert!(done.rewritten_bytes > 0, "no put landed in a moving group");
}

fn new_key(writer: u64, i: u64) -> Vec<u8> {
    format!("new-{writer}-{i:08}").into_bytes()
}

#[test]
fn a_single_file_and_a_volume_open_elsewhere_are_refused_with_nothing_written() {
    let dir = tempfile::tempdir().unwrap();
    let single = dir.path().join("single");
    let db = options().open(&single).unwrap();
    db.close().unwrap();
    let before = snapshot(dir.path());
    let refused = options().rebalance(&[&single]).expect_err("refused");
    assert!(
        refused.to_string().contains("nothing to rebalance"),
        "{refused}"
    );
    assert_eq!(snapshot(dir.path()), before);

    let paths: Vec<PathBuf> = (0..2)
        .map(|i| dir.path().join(format!("volume.m{i}")))
        .collect();
    let db = options().open_members(&paths).unwrap();
    db.close().unwrap();
    let db = options().open_members(&paths).unwrap();
    let open_elsewhere = options().rebalance(&paths).expect_err("refused");
    assert!(
        matches!(open_elsewhere, tucana::Error::Locked),
        "{open_elsewhere}"
    );
    db.close().unwrap();
}
