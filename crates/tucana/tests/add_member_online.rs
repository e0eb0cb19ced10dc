//! Adding a member to an open volume over member files (DESIGN.md, "Adding a member", *to
//! an open volume*): writer threads, a reader and the background committer run through
//! the add; afterwards the new member takes segments by dispatch, `check` covers it, and
//! the volume reopens over every member with every value read back. And every refusal
//! of the offline add (a member already in the set, a member of another volume, a file
//! holding data, a single-file volume) is made on the open volume with nothing written.

mod common;
use common::snapshot;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tucana::{Database, Error, Options};

fn options() -> Options {
    Database::builder()
        .commit_interval(None)
        .flush_interval(None)
        // Small segments, so the writes after the add fill several on every member.
        .log_segment_bytes(256 << 10)
        .mapping_reservation_bytes(1 << 30)
}

fn member_paths(dir: &Path, volume: &str, n: usize) -> Vec<PathBuf> {
    (0..n).map(|i| dir.join(format!("{volume}.m{i}"))).collect()
}

fn key(writer: u64, i: u64) -> Vec<u8> {
    format!("writer{writer}-{i:08}").into_bytes()
}

fn value(writer: u64, i: u64) -> Vec<u8> {
    format!("value {writer} {i:08} {}", "v".repeat((i % 400) as usize)).into_bytes()
}

/// A closed volume over `paths` holding `keys` keys of writer 0 (`key(0, i)`).
fn create(paths: &[PathBuf], keys: u64) {
    let db = options().open_members(paths).unwrap();
    let ks = db.keyspace("ks").unwrap();
    for i in 0..keys {
        ks.put(&key(0, i), &value(0, i)).unwrap();
    }
    db.close().unwrap();
}

const WRITERS: u64 = 3;
const PRELOADED: u64 = 2_000;
/// Puts each writer makes before the add may start, and after it returned.
const PUTS_BEFORE_ADD: u64 = 500;
const PUTS_AFTER_ADD: u64 = 3_000;

#[test]
fn writers_run_through_an_online_add_and_every_value_reads_back_over_the_new_set() {
    let dir = tempfile::tempdir().unwrap();
    let paths = member_paths(dir.path(), "v", 2);
    create(&paths, PRELOADED);
    let db = options()
        .commit_interval(Some(Duration::from_millis(5)))
        .open_members(&paths)
        .unwrap();
    let added = Arc::new(AtomicBool::new(false));
    let ready = Arc::new(AtomicU64::new(0));
    let writers: Vec<_> = (1..=WRITERS)
        .map(|w| {
            let (db, added, ready) = (db.clone(), added.clone(), ready.clone());
            std::thread::spawn(move || {
                let ks = db.open_keyspace("ks").unwrap();
                let mut after = 0;
                let mut i = 0;
                while after < PUTS_AFTER_ADD {
                    ks.put(&key(w, i), &value(w, i)).unwrap();
                    i += 1;
                    if i == PUTS_BEFORE_ADD {
                        ready.fetch_add(1, Ordering::AcqRel);
                    }
                    if i > PUTS_BEFORE_ADD && added.load(Ordering::Acquire) {
                        after += 1;
                    }
                    if i % 256 == 0 {
                        db.sync().unwrap();
                    }
                }
                i
            })
        })
        .collect();
    let reader = {
        let (db, added) = (db.clone(), added.clone());
        std::thread::spawn(move || {
            let ks = db.open_keyspace("ks").unwrap();
            let mut reads = 0u64;
            while !added.load(Ordering::Acquire) || reads < 2 * PRELOADED {
                let i = reads % PRELOADED;
                assert_eq!(ks.get(&key(0, i)).unwrap(), Some(value(0, i)), "key {i}");
                reads += 1;
            }
        })
    };
    while ready.load(Ordering::Acquire) < WRITERS {
        std::thread::yield_now();
    }
    let new = dir.path().join("v.m2");
    let info = db
        .add_member(&new)
        .expect("add a member to the open volume");
    assert_eq!((info.index, info.generation), (2, 1));
    added.store(true, Ordering::Release);
    let written: Vec<u64> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    reader.join().unwrap();
    db.sync().unwrap();
    let stats = db.stats();
    assert_eq!(stats.members.len(), 3, "{:?}", stats.members);
    assert!(
        stats.members[2].bytes_written > 64 << 10,
        "segments reach the new member: {:?}",
        stats.members
    );
    db.check().expect("check covers the new member");
    db.close().unwrap();

    // The old set is refused now; the new one opens and holds everything.
    let err = options().open_members(&paths).err().expect("the old set");
    assert!(err.to_string().contains("missing"), "{err}");
    let mut all = paths.clone();
    all.push(new.clone());
    let db = options().open_members(&all).unwrap();
    let ks = db.open_keyspace("ks").unwrap();
    for i in 0..PRELOADED {
        assert_eq!(
            ks.get(&key(0, i)).unwrap(),
            Some(value(0, i)),
            "preloaded {i}"
        );
    }
    for (w, &n) in (1..=WRITERS).zip(&written) {
        for i in 0..n {
            assert_eq!(
                ks.get(&key(w, i)).unwrap(),
                Some(value(w, i)),
                "writer {w} put {i}"
            );
        }
    }
    let report = db.check().unwrap();
    assert_eq!(report.members, 3);
    db.close().unwrap();
    // The new member's file holds the data of the segments written to it, not only its
    // 4 KiB header (the rest of its slot is a sparse hole until written).
    use std::os::unix::fs::MetadataExt;
    let held_bytes = std::fs::metadata(&new).unwrap().blocks() * 512;
    assert!(
        held_bytes > 256 << 10,
        "the new member holds {held_bytes} bytes"
    );
}

/// The add of `new` to the open `db` is refused with an error holding every needle,
/// and no file in `dir` changed; the set still has `members` members.
fn refused(db: &Database, dir: &Path, new: &Path, members: usize, needles: &[&str]) {
    let before = snapshot(dir);
    let err = db.add_member(new).expect_err("the add is refused");
    let text = err.to_string();
    for needle in needles {
        assert!(text.contains(needle), "{text:?} lacks {needle:?}");
    }
    assert!(
        snapshot(dir) == before,
        "a refused add changed a file: {text}"
    );
    assert_eq!(db.stats().members.len(), members);
    assert!(!db.is_poisoned(), "a refusal poisoned the store: {text}");
}

#[test]
fn an_online_add_refuses_what_the_offline_add_refuses_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ours = member_paths(dir.path(), "ours", 2);
    let theirs = member_paths(dir.path(), "theirs", 2);
    create(&ours, 500);
    create(&theirs, 500);
    let junk = dir.path().join("junk");
    std::fs::write(&junk, vec![0xA5u8; 64 << 10]).unwrap();
    let db = options().open_members(&ours).unwrap();
    // A member of this very set, by its path and by another spelling of it.
    refused(&db, dir.path(), &ours[1], 2, &["same file as member 1"]);
    let respelled = dir.path().join(".").join("ours.m0");
    refused(&db, dir.path(), &respelled, 2, &["same file as member 0"]);
    // A member of another volume, and a file holding data.
    refused(
        &db,
        dir.path(),
        &theirs[1],
        2,
        &["theirs.m1", "another volume"],
    );
    refused(&db, dir.path(), &junk, 2, &["junk", "holds data"]);
    // After the refusals the volume works, and an empty file is taken.
    let ks = db.open_keyspace("ks").unwrap();
    ks.put(b"after", b"refusals").unwrap();
    let added = db.add_member(dir.path().join("ours.m2")).unwrap();
    assert_eq!(added.index, 2);
    db.check().unwrap();
    db.close().unwrap();

    // A single-file volume takes no member, and the new path is not even created.
    let single = dir.path().join("single");
    let db = options().open(&single).unwrap();
    let new = dir.path().join("never");
    let err = db.add_member(&new).expect_err("a single file is refused");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert!(!new.exists(), "a refused add created {}", new.display());
    db.close().unwrap();
}

#[test]
fn a_failed_sync_of_the_member_table_poisons_the_store() {
    // Member 0 holds the member table. If its sync fails during an add, the table on
    // the device may be the old one or the new one: the store cannot tell which set a
    // crash would reopen, so it acknowledges nothing more (as after any failed sync).
    use tucana::volume::{FailingSync, MemStorage, MemberSet, Storage};
    let failing = Arc::new(FailingSync::new());
    let members: Vec<(String, Arc<dyn Storage>)> = vec![
        ("m0".into(), failing.clone()),
        ("m1".into(), Arc::new(MemStorage::new())),
    ];
    let set = MemberSet::open(members, true).unwrap();
    let db = options().open_storage(Arc::new(set)).unwrap();
    let ks = db.keyspace("ks").unwrap();
    ks.put(b"k", b"v").unwrap();
    db.commit().unwrap();
    failing.set_broken(true);
    let new: Arc<dyn Storage> = Arc::new(MemStorage::new());
    assert!(db.add_member_storage("m2", new, true).is_err());
    assert!(db.is_poisoned());
    failing.set_broken(false);
    assert!(matches!(db.sync(), Err(Error::Poisoned)));
    assert_eq!(db.stats().members.len(), 2);
}
