//! Removing a member from a volume over member files (DESIGN.md, "Removing a member"):
//! data written across three members, member 1 removed (from the closed volume, or from
//! the open one with writers, a reader and the background committer running through the
//! removal), the volume reopened over the other two with every value read back and
//! `check` clean, and member 1 refused as no longer in the table. And the refusals
//! (member 0, a path that is not a member, the last member but one, a volume open
//! elsewhere), each with nothing written.

mod common;
use common::snapshot;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tucana::volume::DispatchPolicy;
use tucana::{Database, Options};

fn options() -> Options {
    Database::builder()
        .commit_interval(None)
        .flush_interval(None)
        // Small segments, so the keys fill several on every member.
        .log_segment_bytes(256 << 10)
        .mapping_reservation_bytes(1 << 30)
}

fn member_paths(dir: &Path, n: usize) -> Vec<PathBuf> {
    (0..n).map(|i| dir.join(format!("volume.m{i}"))).collect()
}

fn key(i: u64) -> Vec<u8> {
    format!("key-{i:08}").into_bytes()
}

fn value(i: u64) -> Vec<u8> {
    format!("value {i:08} {}", "v".repeat((i % 400) as usize)).into_bytes()
}

const KEYS: u64 = 20_000;

/// A closed volume over `paths` holding `KEYS` keys, half of them written again after a
/// commit (so segments and node runs of two commits are on every member).
fn create(paths: &[PathBuf]) {
    let db = options().open_members(paths).unwrap();
    let ks = db.keyspace("ks").unwrap();
    for i in 0..KEYS {
        ks.put(&key(i), b"first").unwrap();
    }
    db.commit().unwrap();
    for i in 0..KEYS {
        ks.put(&key(i), &value(i)).unwrap();
    }
    db.close().unwrap();
}

#[test]
fn a_member_removed_from_three_leaves_every_value_on_the_other_two() {
    let dir = tempfile::tempdir().unwrap();
    let paths = member_paths(dir.path(), 3);
    create(&paths);
    let db = options().open_members(&paths).unwrap();
    let written: Vec<u64> = db.stats().members.iter().map(|m| m.groups).collect();
    assert!(written[1] >= 1, "member 1 holds no group: {written:?}");
    db.close().unwrap();
    let removed = options().remove_member(&paths, &paths[1]).unwrap();
    let on_disk = |p: &Path| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(p).unwrap().blocks() * 512
    };
    println!(
        "{removed:?}; member 1 held {} bytes on disk",
        on_disk(&paths[1])
    );
    assert_eq!((removed.index, removed.generation), (1, 1));
    assert_eq!(removed.groups_moved, written[1]);
    assert!(removed.bytes_moved > 0, "{removed:?}");
    let left = [paths[0].clone(), paths[2].clone()];
    let db = options().open_members(&left).unwrap();
    let ks = db.open_keyspace("ks").unwrap();
    for i in 0..KEYS {
        assert_eq!(ks.get(&key(i)).unwrap(), Some(value(i)), "key {i}");
    }
    db.check().unwrap();
    let stats = db.stats();
    assert_eq!(stats.members[1].kind, "removed");
    assert_eq!(
        stats.members.iter().map(|m| m.groups).sum::<u64>(),
        written.iter().sum::<u64>()
    );
    // The members left take new writes and a commit.
    for i in 0..KEYS {
        ks.put(&key(i), b"third").unwrap();
    }
    drop(ks);
    db.close().unwrap();
    let db = options().open_members(&left).unwrap();
    assert_eq!(
        db.open_keyspace("ks").unwrap().get(&key(7)).unwrap(),
        Some(b"third".to_vec())
    );
    db.check().unwrap();
    db.close().unwrap();
    // The removed member is refused wherever it is given.
    for set in [
        paths.to_vec(),
        vec![paths[0].clone(), paths[1].clone()],
        vec![paths[0].clone(), paths[2].clone(), paths[1].clone()],
    ] {
        let Err(err) = options().open_members(&set) else {
            panic!("{set:?} opened");
        };
        let err = err.to_string();
        assert!(err.contains("is not in the volume's member table"), "{err}");
        assert!(err.contains("volume.m1"), "{err}");
    }
}

#[test]
fn refused_removals_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let paths = member_paths(dir.path(), 3);
    create(&paths);
    let two_dir = tempfile::tempdir().unwrap();
    let two = member_paths(two_dir.path(), 2);
    create(&two);
    // Open elsewhere: refused by the lock (the open volume's files compared around it).
    let db = options().open_members(&paths).unwrap();
    let open_before = snapshot(dir.path());
    let err = options()
        .remove_member(&paths, &paths[1])
        .expect_err("locked");
    assert!(matches!(err, tucana::Error::Locked), "{err}");
    assert!(
        snapshot(dir.path()) == open_before,
        "a refused removal wrote"
    );
    db.close().unwrap();
    let before = (snapshot(dir.path()), snapshot(two_dir.path()));
    let refused = |paths: &[PathBuf], remove: &Path, needle: &str| {
        let err = options().remove_member(paths, remove).expect_err("refused");
        let err = err.to_string();
        assert!(err.contains(needle), "{needle}: {err}");
    };
    refused(&paths, &paths[0], "is member 0");
    refused(
        &paths,
        &dir.path().join("other"),
        "is not one of the 3 members given",
    );
    refused(&paths, &two[1], "is not one of the 3 members given");
    refused(&two, &two[1], "would leave member 0 alone");
    refused(&paths[..1], &paths[0], "single-file volume");
    // A wrong member set: open's refusal.
    let swapped = [paths[0].clone(), paths[2].clone(), paths[1].clone()];
    refused(&swapped, &paths[1], "swapped");
    assert!(
        (snapshot(dir.path()), snapshot(two_dir.path())) == before,
        "a refused removal wrote"
    );
}

const WRITERS: u64 = 2;
/// Puts each writer makes before the removal may start, and after it returned.
const PUTS_BEFORE: u64 = 2_000;
const PUTS_AFTER: u64 = 3_000;

fn writer_key(w: u64, i: u64) -> Vec<u8> {
    format!("writer{w}-{i:08}").into_bytes()
}

#[test]
fn writers_run_through_an_online_removal_and_every_value_reads_back_without_the_member() {
    online_removal_with_writers(DispatchPolicy::RoundRobin);
}

#[test]
fn writers_whose_segments_are_all_on_the_member_removed_lose_nothing() {
    // Every segment and node run goes to member 1 until it drains: the writers' open
    // tails, the commits' node runs and bitmaps are in the groups being copied, so the
    // copy runs beside writes to them (written a second time, to the new slot).
    online_removal_with_writers(DispatchPolicy::Member(1));
}

fn online_removal_with_writers(policy: DispatchPolicy) {
    let dir = tempfile::tempdir().unwrap();
    let paths = member_paths(dir.path(), 3);
    create(&paths);
    let db = options()
        .commit_interval(Some(Duration::from_millis(5)))
        .member_dispatch(policy)
        .open_members(&paths)
        .unwrap();
    let removed = Arc::new(AtomicBool::new(false));
    let ready = Arc::new(AtomicU64::new(0));
    let writers: Vec<_> = (1..=WRITERS)
        .map(|w| {
            let (db, removed, ready) = (db.clone(), removed.clone(), ready.clone());
            std::thread::spawn(move || {
                let ks = db.open_keyspace("ks").unwrap();
                let (mut i, mut after) = (0, 0);
                while after < PUTS_AFTER {
                    ks.put(&writer_key(w, i), &value(i)).unwrap();
                    // Overwrites too, so commits free and allocate in every group.
                    ks.put(&key(i % KEYS), &value(i % KEYS + 1)).unwrap();
                    i += 1;
                    if i == PUTS_BEFORE {
                        ready.fetch_add(1, Ordering::AcqRel);
                    }
                    if i > PUTS_BEFORE && removed.load(Ordering::Acquire) {
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
        let (db, removed) = (db.clone(), removed.clone());
        std::thread::spawn(move || {
            let ks = db.open_keyspace("ks").unwrap();
            let mut reads = 0u64;
            while !removed.load(Ordering::Acquire) || reads < 2 * KEYS {
                let i = reads % KEYS;
                let got = ks.get(&key(i)).unwrap().expect("every key is there");
                assert!(got == value(i) || got == value(i + 1), "key {i}");
                reads += 1;
            }
        })
    };
    while ready.load(Ordering::Acquire) < WRITERS {
        std::thread::yield_now();
    }
    let before = db.stats().members[1].groups;
    let info = db.remove_member(&paths[1]).expect("remove member 1");
    println!("online, {policy:?}: {info:?}");
    assert_eq!(
        (info.index, info.generation, info.groups_moved),
        (1, 1, before)
    );
    removed.store(true, Ordering::Release);
    let written: Vec<u64> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    reader.join().unwrap();
    db.sync().unwrap();
    let stats = db.stats();
    assert_eq!(stats.members[1].state, "removed", "{:?}", stats.members);
    assert_eq!(stats.members[1].groups, 0);
    let check = db.check().expect("check after the removal");
    assert_eq!(check.members, 2);
    db.close().unwrap();

    let err = options().open_members(&paths).expect_err_text();
    assert!(err.contains("it was member 1"), "{err}");
    let left = [paths[0].clone(), paths[2].clone()];
    let db = options().open_members(&left).unwrap();
    let ks = db.open_keyspace("ks").unwrap();
    for i in 0..KEYS {
        let got = ks.get(&key(i)).unwrap().expect("every key is there");
        assert!(got == value(i) || got == value(i + 1), "key {i}");
    }
    for (w, &n) in (1..=WRITERS).zip(&written) {
        for i in 0..n {
            assert_eq!(
                ks.get(&writer_key(w, i)).unwrap(),
                Some(value(i)),
                "writer {w} put {i}"
            );
        }
    }
    db.check().unwrap();
    db.close().unwrap();
}

#[test]
fn online_refusals_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let paths = member_paths(dir.path(), 3);
    create(&paths);
    let db = options().open_members(&paths).unwrap();
    let before = snapshot(dir.path());
    for (path, needle) in [
        (paths[0].clone(), "is member 0"),
        (
            dir.path().join("other"),
            "is not a member of the open volume",
        ),
    ] {
        let err = db.remove_member(&path).expect_err("refused").to_string();
        assert!(err.contains(needle), "{needle}: {err}");
    }
    assert!(snapshot(dir.path()) == before, "a refused removal wrote");
    db.remove_member(&paths[1]).unwrap();
    let after = snapshot(dir.path());
    let err = db.remove_member(&paths[2]).expect_err("last").to_string();
    assert!(err.contains("would leave member 0 alone"), "{err}");
    assert!(snapshot(dir.path()) == after, "a refused removal wrote");
    db.close().unwrap();
    let single = tempfile::tempdir().unwrap();
    let db = options().open(single.path().join("v")).unwrap();
    let err = db.remove_member(&paths[1]).expect_err("single").to_string();
    assert!(err.contains("single-file volume"), "{err}");
    db.close().unwrap();
}

trait ErrText {
    fn expect_err_text(self) -> String;
}

impl<T> ErrText for tucana::Result<T> {
    fn expect_err_text(self) -> String {
        match self {
            Ok(_) => panic!("not refused"),
            Err(e) => e.to_string(),
        }
    }
}
