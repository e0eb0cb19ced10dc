//! Volumes over several member files (DESIGN.md, "Volumes over several devices"): create,
//! write, reopen and check across members; and every wrong member set refused with an
//! error naming the member, without a byte of any file changed.

mod common;
use common::snapshot;

use std::path::{Path, PathBuf};

use tucana::{Database, Error, Options};

fn options() -> Options {
    Database::builder()
        .commit_interval(None)
        .flush_interval(None)
        // Small, so the test's growth is quick to map and unmap.
        .mapping_reservation_bytes(1 << 30)
}

fn member_paths(dir: &Path, volume: &str, n: usize) -> Vec<PathBuf> {
    (0..n).map(|i| dir.join(format!("{volume}.m{i}"))).collect()
}

fn value(i: u32) -> Vec<u8> {
    format!("value {i:08} {}", "x".repeat((i % 300) as usize)).into_bytes()
}

/// Creates a 3-member volume with enough data that it grows past its first groups.
fn create(paths: &[PathBuf], keys: u32) {
    let db = options().open_members(paths).unwrap();
    let ks = db.keyspace("ks").unwrap();
    for i in 0..keys {
        ks.put(format!("key{i:08}").as_bytes(), &value(i)).unwrap();
    }
    db.commit().unwrap();
    db.close().unwrap();
}

#[test]
fn three_members_write_reopen_and_check() {
    let dir = tempfile::tempdir().unwrap();
    let paths = member_paths(dir.path(), "v", 3);
    create(&paths, 20_000);
    let db = options().open_members(&paths).unwrap();
    let ks = db.keyspace("ks").unwrap();
    for i in (0..20_000).step_by(97) {
        assert_eq!(
            ks.get(format!("key{i:08}").as_bytes()).unwrap(),
            Some(value(i)),
            "key {i}"
        );
    }
    // More writes after the reopen: 400 MiB fill the three groups creation placed (one
    // per member) and grow the volume by a group, placed on member 0 by round-robin.
    let big = vec![7u8; 100_000];
    for i in 0..4_200u32 {
        ks.put(format!("big{i:06}").as_bytes(), &big).unwrap();
    }
    db.commit().unwrap();
    let report = db.check().unwrap();
    assert_eq!(report.members, 3);
    assert_eq!(report.keys, 24_200);
    let stats = db.stats();
    assert_eq!(stats.members.len(), 3);
    for (i, member) in stats.members.iter().enumerate() {
        assert!(member.name.ends_with(&format!("v.m{i}")), "{member:?}");
        assert!(member.bytes_written > 16 << 20, "{member:?}");
    }
    let groups: Vec<u64> = stats.members.iter().map(|m| m.groups).collect();
    assert!(
        groups[0] >= 2 && groups[1] >= 1 && groups[2] >= 1,
        "{groups:?}"
    );
    drop(ks);
    db.close().unwrap();
    let db = options().open_members(&paths).unwrap();
    let ks = db.keyspace("ks").unwrap();
    assert_eq!(ks.get(b"big004199").unwrap(), Some(big));
    assert_eq!(db.check().unwrap().keys, 24_200);
}

#[test]
fn one_path_is_a_single_file_volume_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("single");
    {
        let db = options().open_members(&[&path]).unwrap();
        db.keyspace("ks").unwrap().put(b"k", b"v").unwrap();
        db.close().unwrap();
    }
    let db = options().open(&path).unwrap();
    assert_eq!(
        db.keyspace("ks").unwrap().get(b"k").unwrap(),
        Some(b"v".to_vec())
    );
    assert_eq!(db.check().unwrap().members, 0);
    assert!(db.stats().members.is_empty());
}

/// Opens `paths` expecting `Error::Members` containing every one of `needles`, and checks
/// that no file in the directory changed.
fn refused(dir: &Path, paths: &[PathBuf], needles: &[&str]) {
    let before = snapshot(dir);
    let err = match options().open_members(paths) {
        Ok(_) => panic!("opened {paths:?}"),
        Err(e) => e,
    };
    assert!(matches!(err, Error::Members(_)), "{err:?}");
    let text = err.to_string();
    for needle in needles {
        assert!(text.contains(needle), "{text:?} should name {needle:?}");
    }
    assert!(snapshot(dir) == before, "a refused open changed a file");
}

#[test]
fn a_missing_member_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let paths = member_paths(dir.path(), "v", 3);
    create(&paths, 1_000);
    // Left out of the list.
    refused(dir.path(), &paths[..2], &["member 2", "missing"]);
    // Named but gone.
    std::fs::rename(&paths[1], dir.path().join("elsewhere")).unwrap();
    refused(dir.path(), &paths, &["member 1", "v.m1", "missing"]);
    assert!(
        !paths[1].exists(),
        "a refused open created the missing member"
    );
    std::fs::rename(dir.path().join("elsewhere"), &paths[1]).unwrap();
    options().open_members(&paths).unwrap();
}

#[test]
fn a_lone_member_opened_as_a_single_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let paths = member_paths(dir.path(), "v", 3);
    create(&paths, 1_000);
    let before = snapshot(dir.path());
    let err = options().open(&paths[0]).err().unwrap();
    let text = err.to_string();
    assert!(matches!(err, Error::Members(_)), "{err:?}");
    assert!(
        text.contains("member 0") && text.contains("member 1") && text.contains("member 2"),
        "{text}"
    );
    assert!(snapshot(dir.path()) == before);
}

#[test]
fn swapped_members_are_refused_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let paths = member_paths(dir.path(), "v", 3);
    create(&paths, 1_000);
    let swapped = vec![paths[0].clone(), paths[2].clone(), paths[1].clone()];
    refused(
        dir.path(),
        &swapped,
        &["member 1", "v.m2", "holds member 2"],
    );
    let first_moved = vec![paths[1].clone(), paths[0].clone(), paths[2].clone()];
    refused(
        dir.path(),
        &first_moved,
        &["member 0", "v.m1", "holds member 1"],
    );
}

#[test]
fn duplicated_members_are_refused_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let paths = member_paths(dir.path(), "v", 3);
    create(&paths, 1_000);
    // The same file twice.
    let twice = vec![paths[0].clone(), paths[1].clone(), paths[1].clone()];
    refused(dir.path(), &twice, &["member 2", "same file as member 1"]);
    // A copy of a member in place of another.
    let copy = dir.path().join("copy-of-m1");
    std::fs::copy(&paths[1], &copy).unwrap();
    let with_copy = vec![paths[0].clone(), paths[1].clone(), copy];
    refused(
        dir.path(),
        &with_copy,
        &["member 2", "copy-of-m1", "a copy of one member"],
    );
}

#[test]
fn a_member_of_another_volume_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let ours = member_paths(dir.path(), "ours", 3);
    let theirs = member_paths(dir.path(), "theirs", 3);
    create(&ours, 1_000);
    create(&theirs, 1_000);
    let mixed = vec![ours[0].clone(), theirs[1].clone(), ours[2].clone()];
    refused(
        dir.path(),
        &mixed,
        &["member 1", "theirs.m1", "another volume"],
    );
    // A single-file volume is not a member either.
    let single = dir.path().join("single");
    options().open(&single).unwrap().close().unwrap();
    let with_single = vec![ours[0].clone(), ours[1].clone(), single.clone()];
    refused(
        dir.path(),
        &with_single,
        &["member 2", "single", "not a member"],
    );
    let single_first = vec![single, ours[1].clone(), ours[2].clone()];
    refused(dir.path(), &single_first, &["member 0", "no member table"]);
    // An extra path past the table.
    let extra = dir.path().join("extra");
    std::fs::write(&extra, b"").unwrap();
    let mut four = ours.clone();
    four.push(extra);
    refused(dir.path(), &four, &["member 3", "extra"]);
}

#[test]
fn a_failed_sync_on_one_member_poisons_the_store() {
    // Three memory members, member 0 (which every commit writes: the superblock) able
    // to fail its syncs: a commit whose fdatasync fails on it, while the others sync
    // beside it, must not be acknowledged, and the store then refuses writes as after
    // any failed sync. (That a failure of any dirty member is reported is the member
    // set's unit test `a_failed_member_sync_is_reported_and_the_member_stays_dirty`.)
    use std::sync::Arc;
    use tucana::volume::{FailingSync, MemStorage, MemberSet, Storage};
    let failing = Arc::new(FailingSync::new());
    let members: Vec<(String, Arc<dyn Storage>)> = vec![
        ("m0".into(), failing.clone()),
        ("m1".into(), Arc::new(MemStorage::new())),
        ("m2".into(), Arc::new(MemStorage::new())),
    ];
    let set = MemberSet::open(members, true).unwrap();
    let db = options().open_storage(Arc::new(set)).unwrap();
    let ks = db.keyspace("ks").unwrap();
    ks.put(b"k", b"v").unwrap();
    db.commit().unwrap();
    failing.set_broken(true);
    ks.put(b"k2", b"v").unwrap();
    assert!(db.commit().is_err());
    failing.set_broken(false);
    assert!(matches!(db.sync(), Err(Error::Poisoned)));
    assert!(matches!(
        ks.put_with(b"k3", b"v", tucana::Durability::Sync),
        Err(Error::Poisoned)
    ));
}

#[test]
fn log_segments_spread_over_every_member() {
    // Round-robin dispatch of segments: a load of ~24 MiB of records (a dozen 2 MiB
    // segments) puts a share of the log on each of three members, long before the
    // volume grows past the groups creation placed.
    use std::sync::Arc;
    use tucana::volume::{MemStorage, MemberSet, Storage};
    let members: Vec<(String, Arc<dyn Storage>)> = (0..3)
        .map(|i| {
            (
                format!("m{i}"),
                Arc::new(MemStorage::new()) as Arc<dyn Storage>,
            )
        })
        .collect();
    let set = MemberSet::open(members, true).unwrap();
    let db = options().open_storage(Arc::new(set)).unwrap();
    let ks = db.keyspace("ks").unwrap();
    for i in 0..24_000u32 {
        ks.put(format!("key{i:08}").as_bytes(), &[i as u8; 1000])
            .unwrap();
    }
    db.commit().unwrap();
    let stats = db.stats();
    let total: u64 = stats.members.iter().map(|m| m.bytes_written).sum();
    for member in &stats.members {
        assert!(
            member.bytes_written > total / 5,
            "{member:?} of {total} bytes written"
        );
    }
    assert_eq!(db.check().unwrap().keys, 24_000);
}

#[test]
fn least_weighted_dispatch_opens_writes_and_checks() {
    let dir = tempfile::tempdir().unwrap();
    let paths = member_paths(dir.path(), "v", 3);
    let db = options()
        .member_dispatch(tucana::volume::DispatchPolicy::LeastWeightedQueue)
        .open_members(&paths)
        .unwrap();
    let ks = db.keyspace("ks").unwrap();
    for i in 0..12_000u32 {
        ks.put(format!("key{i:08}").as_bytes(), &[i as u8; 1000])
            .unwrap();
    }
    db.commit().unwrap();
    assert_eq!(db.check().unwrap().keys, 12_000);
    let stats = db.stats();
    for member in &stats.members {
        assert!(member.bytes_written > 2 << 20, "{member:?}");
        assert_eq!(member.in_flight_requests, 0, "{member:?}");
    }
}

#[test]
fn segment_writes_that_wait_for_the_device_write_reopen_and_check() {
    // `segment_writes_wait_for_device`: each background segment write waits for its
    // writeback (sync_file_range) and is timed as a write on its member; the data is the
    // same as without, over three member files.
    let big = |i: u32| {
        let mut v = value(i);
        v.resize(1000, b'.');
        v
    };
    let dir = tempfile::tempdir().unwrap();
    let paths = member_paths(dir.path(), "w", 3);
    {
        let db = options()
            .member_dispatch(tucana::volume::DispatchPolicy::LeastWeightedQueue)
            .segment_writes_wait_for_device(true)
            .open_members(&paths)
            .unwrap();
        let ks = db.keyspace("ks").unwrap();
        for i in 0..12_000u32 {
            ks.put(format!("key{i:08}").as_bytes(), &big(i)).unwrap();
        }
        db.sync().unwrap();
        let stats = db.stats();
        let done: u64 = stats.members.iter().map(|m| m.queue_done_jobs).sum();
        assert!(done >= 4, "{stats:?}");
        db.close().unwrap();
    }
    let db = options().open_members(&paths).unwrap();
    let ks = db.keyspace("ks").unwrap();
    for i in (0..12_000u32).step_by(13) {
        assert_eq!(
            ks.get(format!("key{i:08}").as_bytes()).unwrap(),
            Some(big(i))
        );
    }
    assert_eq!(db.check().unwrap().keys, 12_000);
}

#[test]
fn a_pinned_member_gets_every_segment_and_every_node_run() {
    // A commit's node runs used to take the allocator's first fit (group 0, on member
    // 0) whatever the dispatch policy said; now they go where the policy sends them, as
    // segments do (and so does a keyspace's first segment, which took first fit too).
    // With every dispatch pinned to member 1, member 1 holds the log and the index;
    // members 0 and 2 get only what is placed by first fit (member 0: the superblock,
    // descriptors and bitmaps).
    let dir = tempfile::tempdir().unwrap();
    let paths = member_paths(dir.path(), "p", 3);
    {
        let db = options()
            .member_dispatch(tucana::volume::DispatchPolicy::Member(1))
            .open_members(&paths)
            .unwrap();
        let ks = db.keyspace("ks").unwrap();
        for i in 0..100_000u32 {
            ks.put(format!("key{i:08}").as_bytes(), &[i as u8; 100])
                .unwrap();
        }
        db.commit().unwrap();
        let stats = db.stats();
        let written: Vec<u64> = stats.members.iter().map(|m| m.bytes_written).collect();
        assert!(written[1] > 10 << 20, "{written:?}");
        assert!(written[0] < 1 << 20, "{written:?}");
        assert!(written[2] < 1 << 20, "{written:?}");
        assert_eq!(db.check().unwrap().keys, 100_000);
        db.close().unwrap();
    }
    let db = options().open_members(&paths).unwrap();
    let ks = db.keyspace("ks").unwrap();
    for i in (0..100_000u32).step_by(97) {
        assert_eq!(
            ks.get(format!("key{i:08}").as_bytes()).unwrap().as_deref(),
            Some(&[i as u8; 100][..])
        );
    }
}
