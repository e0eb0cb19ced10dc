//! Deferred updates (`Options::deferred_updates`, `region/deferred.rs`): a put of a key
//! the index holds is logged at once and applied to the index later, in batches. These
//! tests force deferral (`DeferredUpdates::Always`) and check that nothing can tell:
//! point reads, multi-gets, ranges, snapshots, deletes, counts, garbage collection,
//! commits, reopens and crashes all see every acknowledged put, including for two keys
//! that share the index's whole fingerprint (8-byte prefix and 4-byte hash), where an
//! update that trusted the fingerprint would overwrite the other key.
//! (`tests/model.rs` runs its random sequences with deferral too.)

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use tucana::{Database, DeferredUpdates, Durability, Keyspace, Options};

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

fn temp_volume() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("deferred.tucana");
    (dir, path)
}

/// Every commit and GC pass is the test's; small segments so GC has victims.
fn manual() -> Options {
    Database::builder()
        .commit_interval(None)
        .flush_interval(None)
        .log_segment_bytes(64 * 1024)
        .deferred_updates(DeferredUpdates::Always)
}

fn key(i: u32) -> Vec<u8> {
    format!("user{:012}", i.wrapping_mul(2_654_435_761) % 1_000_000).into_bytes()
}

fn value(i: u32, round: u32) -> Vec<u8> {
    format!("value-{i}-{round}-{}", "x".repeat((i % 90) as usize)).into_bytes()
}

fn contents(ks: &Keyspace) -> Model {
    ks.range::<&[u8], _>(..).map(|r| r.expect("scan")).collect()
}

fn assert_reads(ks: &Keyspace, model: &Model, when: &str) {
    for (k, v) in model {
        assert_eq!(ks.get(k).expect("get").as_ref(), Some(v), "{when}: get");
    }
    let keys: Vec<&Vec<u8>> = model.keys().collect();
    let got = ks.multi_get(&keys).expect("multi_get");
    for ((k, v), g) in model.iter().zip(got) {
        assert_eq!(g.as_ref(), Some(v), "{when}: multi_get of {k:?}");
    }
    assert_eq!(ks.len(), model.len() as u64, "{when}: len");
    assert_eq!(&contents(ks), model, "{when}: range");
    let backwards: Vec<_> = ks
        .range::<&[u8], _>(..)
        .rev()
        .map(|r| r.expect("scan").0)
        .collect();
    assert!(
        backwards.iter().rev().eq(model.keys()),
        "{when}: range backwards"
    );
}

fn reopen(path: &Path, after: &str) -> Database {
    let db = manual()
        .create_if_missing(false)
        .open(path)
        .unwrap_or_else(|e| panic!("reopen after {after}: {e}"));
    db.check()
        .unwrap_or_else(|e| panic!("check after reopen after {after}: {e}"));
    db
}

#[test]
fn deferred_puts_are_seen_by_every_reader_before_and_after_they_are_applied() {
    let (_dir, path) = temp_volume();
    let db = manual().open(&path).expect("create");
    let ks = db.keyspace("k").expect("keyspace");
    let mut model = Model::new();
    const KEYS: u32 = 2000;
    for i in 0..KEYS {
        ks.put(&key(i), &value(i, 0)).expect("put");
        model.insert(key(i), value(i, 0));
    }
    // New keys are applied at once: there is nothing to defer.
    assert_eq!(db.stats().deferred_puts, 0);
    // Updates of a few keys stay deferred (fewer than a batch): every reader must see them.
    for i in 0..50 {
        ks.put(&key(i), &value(i, 1)).expect("update");
        model.insert(key(i), value(i, 1));
    }
    assert_eq!(db.stats().deferred_puts, 50);
    for i in 0..50 {
        assert_eq!(ks.get(&key(i)).expect("get"), Some(value(i, 1)));
    }
    let snapshot = ks.snapshot().expect("snapshot");
    assert_reads(&ks, &model, "fewer than a batch deferred");
    // Many updates, some of one key several times: batches are applied by the writers.
    for round in 2..5 {
        for i in (0..KEYS).step_by(round as usize) {
            ks.put(&key(i), &value(i, round)).expect("update");
            model.insert(key(i), value(i, round));
        }
    }
    assert!(db.stats().deferred_puts > 1000);
    // The snapshot taken earlier still reads the state of its time.
    for i in 0..50 {
        assert_eq!(
            snapshot.get(&key(i)).expect("snapshot get"),
            Some(value(i, 1))
        );
    }
    drop(snapshot);
    // A delete and a batch touching deferred keys find the index exact.
    ks.put(&key(7), &value(7, 9)).expect("update");
    assert!(
        ks.delete(&key(7)).expect("delete"),
        "a deferred key was present"
    );
    model.remove(&key(7));
    ks.put(&key(8), &value(8, 9)).expect("update");
    let mut batch = ks.batch();
    batch.put(&key(8), &value(8, 10));
    batch.delete(&key(9));
    batch.commit().expect("batch");
    model.insert(key(8), value(8, 10));
    model.remove(&key(9));
    assert_reads(&ks, &model, "after many batches");
    db.commit().expect("commit");
    assert_reads(&ks, &model, "after a commit");
    // The space the replaced records held is counted dead, as without deferral.
    db.gc().expect("gc");
    assert_reads(&ks, &model, "after a full GC pass");
    drop(ks);
    db.close().expect("close");
    let db = reopen(&path, "close");
    let ks = db.keyspace("k").expect("keyspace");
    assert_reads(&ks, &model, "after reopen");
}

#[test]
fn deferred_puts_acknowledged_durable_survive_a_crash() {
    let (_dir, path) = temp_volume();
    let db = manual().open(&path).expect("create");
    let ks = db.keyspace("k").expect("keyspace");
    let mut model = Model::new();
    for i in 0..500 {
        ks.put(&key(i), &value(i, 0)).expect("put");
        model.insert(key(i), value(i, 0));
    }
    db.commit().expect("commit");
    for i in 0..300 {
        ks.put_with(&key(i), &value(i, 1), Durability::Sync)
            .expect("update");
        model.insert(key(i), value(i, 1));
    }
    assert!(db.stats().deferred_puts >= 300);
    // No commit since the updates: some are still deferred when the process dies.
    drop(ks);
    db.abandon();
    let db = reopen(&path, "a crash");
    let ks = db.keyspace("k").expect("keyspace");
    assert_reads(&ks, &model, "after a crash");
}

#[test]
fn garbage_collection_keeps_deferred_puts_and_frees_what_they_replaced() {
    let (_dir, path) = temp_volume();
    let db = manual().open(&path).expect("create");
    let ks = db.keyspace("k").expect("keyspace");
    let mut model = Model::new();
    for round in 0..6 {
        for i in 0..3000 {
            ks.put(&key(i), &value(i, round)).expect("put");
            model.insert(key(i), value(i, round));
        }
        // A pass while puts are deferred: their records are live, the ones they replaced
        // are not (once applied).
        db.gc().expect("gc");
        assert_reads(&ks, &model, &format!("after GC in round {round}"));
    }
    db.commit().expect("commit");
    db.gc().expect("gc");
    db.commit().expect("commit");
    let stats = db.stats();
    assert!(stats.deferred_puts > 10_000, "{}", stats.deferred_puts);
    // Six rounds written, GC ran after each: the log holds about one round, not six.
    let live = stats.live_log_bytes;
    assert!(
        stats.log_size_bytes < 3 * live,
        "log {} bytes for {live} live",
        stats.log_size_bytes
    );
    drop(ks);
    db.close().expect("close");
    let db = reopen(&path, "close");
    assert_reads(&db.keyspace("k").expect("keyspace"), &model, "after reopen");
}

/// Two keys of equal length, the same first 8 bytes and the same crc32c: the index keeps
/// the same prefix and hash for both. Found by a birthday search over pseudo-random 8-byte
/// suffixes (about 80,000 tries); a counter would not do, since crc32c is linear and a
/// counter's few changing bits map to distinct checksums.
fn colliding_keys() -> (Vec<u8>, Vec<u8>) {
    let mut seen: HashMap<u32, Vec<u8>> = HashMap::new();
    for n in 0u64.. {
        let mut k = b"collide:".to_vec();
        // splitmix64 of the counter.
        let mut z = n.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        k.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
        let h = crc32c::crc32c(&k);
        if let Some(other) = seen.insert(h, k.clone()) {
            return (other, k);
        }
    }
    unreachable!()
}

#[test]
fn a_key_sharing_another_keys_prefix_and_hash_is_never_taken_for_it() {
    let (a, b) = colliding_keys();
    assert_eq!(crc32c::crc32c(&a), crc32c::crc32c(&b));
    assert_eq!(a[..8], b[..8]);
    let (_dir, path) = temp_volume();
    let db = manual().open(&path).expect("create");
    let ks = db.keyspace("k").expect("keyspace");
    let mut model = Model::new();
    // Neighbours on both sides keep the leaf's stem short of the shared head.
    for (k, v) in [(&b"a"[..], &b"low"[..]), (b"z", b"high"), (&a, b"a0")] {
        ks.put(k, v).expect("put");
        model.insert(k.to_vec(), v.to_vec());
    }
    // `b` is new, but the index holds `a` under its prefix and hash: the put is deferred
    // as if it were an update, and must not replace `a`.
    ks.put(&b, b"b0").expect("put b");
    assert_eq!(
        db.stats().deferred_puts,
        1,
        "the index took b for an update of a"
    );
    model.insert(b.clone(), b"b0".to_vec());
    assert_eq!(ks.get(&a).expect("get a"), Some(b"a0".to_vec()));
    assert_eq!(ks.get(&b).expect("get b"), Some(b"b0".to_vec()));
    assert_reads(&ks, &model, "b deferred beside a");
    // Updates of both, deferred in turn, then a delete of one.
    ks.put(&a, b"a1").expect("put a");
    ks.put(&b, b"b1").expect("put b");
    model.insert(a.clone(), b"a1".to_vec());
    model.insert(b.clone(), b"b1".to_vec());
    assert_reads(&ks, &model, "both updated");
    ks.put(&b, b"b2").expect("put b");
    assert!(ks.delete(&a).expect("delete a"));
    model.insert(b.clone(), b"b2".to_vec());
    model.remove(&a);
    assert_reads(&ks, &model, "a deleted");
    db.commit().expect("commit");
    drop(ks);
    db.close().expect("close");
    let db = reopen(&path, "close");
    let ks = db.keyspace("k").expect("keyspace");
    assert_reads(&ks, &model, "after reopen");
}
