//! Rebalancing a volume over member files (DESIGN.md, "Rebalancing onto a member"): two
//! members holding data and a third added, the rebalance moves groups onto the third
//! until the members differ by one group at most, and the volume reopens with every value
//! read back and `check` clean, takes new writes and reopens again; a second rebalance
//! moves nothing and leaves every byte of every file as it was. And on the open volume,
//! with two writers and a reader running through the rebalance.

mod common;
use common::snapshot;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tucana::volume::{MemberSet, Storage};
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

#[test]
fn an_open_volume_is_rebalanced_while_writers_and_a_reader_run() {
    let dir = tempfile::tempdir().unwrap();
    let paths = unbalanced_volume(dir.path());
    let db = Database::builder()
        .flush_interval(None)
        .log_segment_bytes(256 << 10)
        .mapping_reservation_bytes(1 << 30)
        .open_members(&paths)
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let (db, stop) = (db.clone(), stop.clone());
            std::thread::spawn(move || {
                let ks = db.open_keyspace("ks").unwrap();
                let mut n = 0u64;
                while !stop.load(Ordering::Acquire) || n < 2_000 {
                    ks.put(&new_key(w, n), &value(n, 3)).unwrap();
                    n += 1;
                    if n.is_multiple_of(500) {
                        db.sync().unwrap();
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
    println!(
        "online rebalance: {} groups, {} bytes moved, {} written twice, beside {written:?} puts",
        done.groups_moved, done.bytes_moved, done.rewritten_bytes
    );
    assert_eq!((done.groups_moved, done.groups.clone()), (2, vec![3, 3, 3]));
    db.check().unwrap();
    db.close().unwrap();
    let db = options().open_members(&paths).unwrap();
    let groups: Vec<u64> = db.stats().members.iter().map(|m| m.groups).collect();
    assert_eq!(groups, vec![3, 3, 3]);
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
