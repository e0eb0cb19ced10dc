//! Recovery after a simulated crash (`Database::abandon`: no flush, no sync, no commit;
//! bytes already in the file stay) and after clean closes: what was made durable is
//! there, what was not is lost only as a suffix of each keyspace's history, batches are
//! all-or-nothing, and replay of the log since the last commit rebuilds overwrites and
//! deletes exactly. `check` runs after every reopen.

// Handles are dropped explicitly before `close`/`abandon`: a live `Keyspace` may keep the
// database alive. (In the API skeleton the handle has no fields yet, hence the lint.)
#![allow(clippy::drop_non_drop)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tucana::{Database, Durability, Keyspace, Options, Result};

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

/// No background work: what reaches the file is decided by the test alone.
fn manual() -> Options {
    Database::builder()
        .commit_interval(None)
        .flush_interval(None)
}

fn temp_volume() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("recovery.tucana");
    (dir, path)
}

/// Opens an existing volume and checks it, as every reopen in this file does.
fn reopen(options: Options, path: &Path, after: &str) -> Database {
    let db = options
        .create_if_missing(false)
        .open(path)
        .unwrap_or_else(|e| panic!("reopen after {after}: {e}"));
    db.check()
        .unwrap_or_else(|e| panic!("check after reopen after {after}: {e}"));
    db
}

fn contents(ks: &Keyspace) -> Model {
    let pairs = ks
        .range::<&[u8], _>(..)
        .collect::<Result<Vec<_>>>()
        .expect("full range");
    let len = pairs.len();
    let model: Model = pairs.into_iter().collect();
    assert_eq!(model.len(), len, "a range returned a key twice");
    model
}

fn assert_contents(what: &str, ks: &Keyspace, want: &Model) {
    let got = contents(ks);
    if &got != want {
        let missing: Vec<_> = want
            .keys()
            .filter(|k| !got.contains_key(*k))
            .take(5)
            .collect();
        let extra: Vec<_> = got
            .keys()
            .filter(|k| !want.contains_key(*k))
            .take(5)
            .collect();
        let differ: Vec<_> = want
            .iter()
            .filter(|(k, v)| got.get(*k).is_some_and(|g| g != *v))
            .map(|(k, _)| k)
            .take(5)
            .collect();
        panic!(
            "{what}: {} keys, want {}; missing {missing:?}, extra {extra:?}, wrong value {differ:?}",
            got.len(),
            want.len()
        );
    }
    assert_eq!(ks.len(), want.len() as u64, "{what}: len");
    for (k, v) in want.iter().take(50) {
        assert_eq!(ks.get(k).unwrap().as_ref(), Some(v), "{what}: get");
    }
}

fn key(i: u64) -> Vec<u8> {
    format!("key:{i:08}").into_bytes()
}

fn value(i: u64, version: u64, len_bytes: usize) -> Vec<u8> {
    let mut v = format!("v{version}:{i}:").into_bytes();
    v.resize(len_bytes.max(v.len()), (i ^ version) as u8);
    v
}

/// One step of a keyspace's history: a single write or a whole batch.
type Step = Vec<(Vec<u8>, Option<Vec<u8>>)>;

fn apply(model: &mut Model, step: &Step) {
    for (k, v) in step {
        match v {
            Some(v) => model.insert(k.clone(), v.clone()),
            None => model.remove(k),
        };
    }
}

fn write(ks: &Keyspace, step: &Step, durability: Durability) {
    if step.len() == 1 {
        let (k, v) = &step[0];
        match v {
            Some(v) => ks.put_with(k, v, durability).expect("put"),
            None => {
                ks.delete_with(k, durability).expect("delete");
            }
        }
    } else {
        let mut batch = ks.batch();
        for (k, v) in step {
            match v {
                Some(v) => batch.put(k, v),
                None => batch.delete(k),
            };
        }
        batch.commit_with(durability).expect("batch");
    }
}

/// The number of steps `p` with `start + history[..p]` equal to `got`, at least
/// `durable_steps` of them; `None` if the recovered state is no such prefix (a lost
/// durable write, a torn batch, or a hole in the history).
fn recovered_prefix(
    start: &Model,
    history: &[Step],
    durable_steps: usize,
    got: &Model,
) -> Option<usize> {
    let mut state = start.clone();
    for p in 0..=history.len() {
        if p > 0 {
            apply(&mut state, &history[p - 1]);
        }
        if p >= durable_steps && &state == got {
            return Some(p);
        }
    }
    None
}

#[test]
fn buffered_writes_then_sync_survive_abandon() {
    // `sync` makes every acknowledged buffered write durable, across keyspaces.
    let (_dir, path) = temp_volume();
    let db = manual().open(&path).unwrap();
    let (a, b) = (db.keyspace("a").unwrap(), db.keyspace("b").unwrap());
    db.commit().unwrap();
    let (mut ma, mut mb) = (Model::new(), Model::new());
    for i in 0..2_000 {
        let v = value(i, 1, 40);
        a.put(&key(i), &v).unwrap();
        ma.insert(key(i), v);
        if i % 3 == 0 {
            let v = value(i, 2, 300);
            b.put(&key(i), &v).unwrap();
            mb.insert(key(i), v);
        }
    }
    db.sync().unwrap();
    drop((a, b));
    db.abandon();

    let db = reopen(manual(), &path, "sync + abandon");
    assert_contents("a", &db.open_keyspace("a").unwrap(), &ma);
    assert_contents("b", &db.open_keyspace("b").unwrap(), &mb);
}

#[test]
fn writes_after_a_commit_are_replayed_from_the_log() {
    // Everything written after the last commit is only in the log: replay must rebuild
    // new keys, overwrites and deletes of committed keys, over several log segments.
    let (_dir, path) = temp_volume();
    let options = || manual().log_segment_bytes(256 * 1024);
    let db = options().open(&path).unwrap();
    let ks = db.keyspace("replay").unwrap();
    let mut model = Model::new();
    for i in 0..1_000 {
        let v = value(i, 1, 100);
        ks.put(&key(i), &v).unwrap();
        model.insert(key(i), v);
    }
    db.commit().unwrap();

    let mut rng = StdRng::seed_from_u64(42);
    for n in 0..6_000u64 {
        let i = rng.random_range(0..2_000);
        if rng.random_bool(0.2) {
            let was = ks.delete(&key(i)).unwrap();
            assert_eq!(was, model.remove(&key(i)).is_some());
        } else {
            let v = value(i, 100 + n, rng.random_range(0..600));
            ks.put(&key(i), &v).unwrap();
            model.insert(key(i), v);
        }
    }
    db.sync().unwrap();
    assert!(
        db.stats().keyspaces[0].log_segments > 1,
        "the test spans several segments"
    );
    drop(ks);
    db.abandon();

    let db = reopen(options(), &path, "replay");
    let ks = db.open_keyspace("replay").unwrap();
    assert_contents("after replay", &ks, &model);
    // The replayed state commits and reopens like any other.
    drop(ks);
    db.close().unwrap();
    let db = reopen(options(), &path, "close after replay");
    assert_contents("after close", &db.open_keyspace("replay").unwrap(), &model);
}

#[test]
fn unsynced_writes_recover_to_a_prefix_and_batches_are_all_or_nothing() {
    // Without a sync, a crash may lose writes, but only a suffix of each keyspace's
    // history, and never part of a batch. Batches here are larger than any plausible
    // write buffer so some crash states cut through the middle of one.
    let (_dir, path) = temp_volume();
    let db = manual().open(&path).unwrap();
    db.keyspace("ks").unwrap();
    db.close().unwrap();

    let mut model = Model::new();
    let mut rng = StdRng::seed_from_u64(7);
    for round in 0..6u64 {
        let db = reopen(manual(), &path, &format!("round {round}"));
        let ks = db.open_keyspace("ks").unwrap();
        assert_contents(&format!("start of round {round}"), &ks, &model);

        let mut history: Vec<Step> = Vec::new();
        let mut durable_steps = 0;
        for n in 0..40u64 {
            let step: Step = if n % 7 == 3 {
                // A batch of up to ~1.5 MiB, with deletes.
                let len = rng.random_range(2..400);
                (0..len)
                    .map(|j| {
                        let i = rng.random_range(0..3_000);
                        let v = (j % 5 != 0).then(|| value(i, round * 1000 + n, 4096));
                        (key(i), v)
                    })
                    .collect()
            } else {
                let i = rng.random_range(0..3_000);
                vec![(
                    key(i),
                    Some(value(i, round * 1000 + n, rng.random_range(0..2048))),
                )]
            };
            write(&ks, &step, Durability::Buffered);
            history.push(step);
            if round % 2 == 0 && n == 20 {
                db.sync().unwrap();
                durable_steps = history.len();
            }
        }
        drop(ks);
        db.abandon();

        let db = reopen(manual(), &path, &format!("abandon in round {round}"));
        let got = contents(&db.open_keyspace("ks").unwrap());
        let p = recovered_prefix(&model, &history, durable_steps, &got).unwrap_or_else(|| {
            panic!(
                "round {round}: recovered state ({} keys) is no prefix of the history \
                 with at least {durable_steps} steps",
                got.len()
            )
        });
        for step in &history[..p] {
            apply(&mut model, step);
        }
        db.close().unwrap();
    }
}

#[test]
fn a_batch_followed_by_sync_is_all_there_after_abandon() {
    let (_dir, path) = temp_volume();
    let db = manual().open(&path).unwrap();
    let ks = db.keyspace("batches").unwrap();
    db.commit().unwrap();
    let mut model = Model::new();

    let mut buffered = ks.batch();
    for i in 0..500 {
        let v = value(i, 1, 3000);
        buffered.put(&key(i), &v);
        model.insert(key(i), v);
    }
    buffered.commit().unwrap();
    db.sync().unwrap();

    // A sync batch is durable on return, deletes included.
    let mut synced = ks.batch();
    for i in 0..100 {
        synced.delete(&key(i));
        model.remove(&key(i));
    }
    synced.put(b"synced-batch", b"yes");
    model.insert(b"synced-batch".to_vec(), b"yes".to_vec());
    synced.commit_with(Durability::Sync).unwrap();
    drop(ks);
    db.abandon();

    let db = reopen(manual(), &path, "batches");
    assert_contents("batches", &db.open_keyspace("batches").unwrap(), &model);
}

#[test]
fn sync_writes_survive_abandon_without_an_explicit_sync() {
    // A sync write is durable when it returns; since a crash loses only a suffix of a
    // keyspace's history, the buffered writes before it in that keyspace are too.
    // Another keyspace's buffered writes may be lost, but only as a suffix.
    let (_dir, path) = temp_volume();
    let db = manual().open(&path).unwrap();
    let (ks, other) = (db.keyspace("sync").unwrap(), db.keyspace("other").unwrap());
    ks.put(b"committed", b"1").unwrap();
    ks.put(b"deleted-later", b"1").unwrap();
    db.commit().unwrap();

    let mut model = contents(&ks);
    let mut other_history: Vec<Step> = Vec::new();
    for i in 0..200 {
        let v = value(i, 1, 500);
        ks.put(&key(i), &v).unwrap();
        model.insert(key(i), v);
        let step = vec![(key(i), Some(value(i, 2, 500)))];
        write(&other, &step, Durability::Buffered);
        other_history.push(step);
    }
    ks.put_with(b"sync-put", b"durable", Durability::Sync)
        .unwrap();
    model.insert(b"sync-put".to_vec(), b"durable".to_vec());
    assert!(ks.delete_with(b"deleted-later", Durability::Sync).unwrap());
    model.remove(&b"deleted-later"[..]);
    drop((ks, other));
    db.abandon();

    let db = reopen(manual(), &path, "sync writes + abandon");
    assert_contents("sync keyspace", &db.open_keyspace("sync").unwrap(), &model);
    let got = contents(&db.open_keyspace("other").unwrap());
    assert!(
        recovered_prefix(&Model::new(), &other_history, 0, &got).is_some(),
        "the other keyspace recovered to a prefix"
    );
}

#[test]
fn overwrites_and_deletes_across_commit_and_replay_boundaries() {
    // A key's latest version wins whether its older versions are in the committed index,
    // in the replayed log, or both; a delete hides a committed or a replayed value.
    let (_dir, path) = temp_volume();
    let db = manual().open(&path).unwrap();
    let ks = db.keyspace("ow").unwrap();
    ks.put(b"k1", b"v1").unwrap();
    ks.put(b"k2", b"v1").unwrap();
    db.commit().unwrap();
    ks.put(b"k1", b"v2").unwrap(); // overwrite of a committed key
    assert!(ks.delete(b"k2").unwrap()); // delete of a committed key
    ks.put(b"k3", b"v1").unwrap(); // new key, only in the log
    db.sync().unwrap();
    drop(ks);
    db.abandon();

    let db = reopen(manual(), &path, "first replay");
    let ks = db.open_keyspace("ow").unwrap();
    let want = |pairs: &[(&[u8], &[u8])]| -> Model {
        pairs
            .iter()
            .map(|(k, v)| (k.to_vec(), v.to_vec()))
            .collect()
    };
    assert_contents(
        "first replay",
        &ks,
        &want(&[(b"k1", b"v2"), (b"k3", b"v1")]),
    );

    ks.put(b"k2", b"v3").unwrap(); // re-insert a deleted key
    assert!(ks.delete(b"k3").unwrap()); // delete a key that exists only through replay
    ks.put(b"k1", b"v3").unwrap();
    db.commit().unwrap();
    ks.put(b"k1", b"v4").unwrap(); // overwrite then delete within the replayed tail
    assert!(ks.delete(b"k1").unwrap());
    ks.put(b"k4", b"v1").unwrap();
    assert!(ks.delete(b"k4").unwrap()); // born and gone within the tail
    db.sync().unwrap();
    drop(ks);
    db.abandon();

    let db = reopen(manual(), &path, "second replay");
    let ks = db.open_keyspace("ow").unwrap();
    assert_contents("second replay", &ks, &want(&[(b"k2", b"v3")]));

    ks.put(b"k1", b"v5").unwrap();
    ks.put(b"k2", b"").unwrap(); // an empty value is a value
    drop(ks);
    db.close().unwrap();
    let db = reopen(manual(), &path, "close");
    let ks = db.open_keyspace("ow").unwrap();
    assert_contents("after close", &ks, &want(&[(b"k1", b"v5"), (b"k2", b"")]));

    // A second replay over the same keys after a replay that was itself never committed.
    ks.put(b"k1", b"v6").unwrap();
    db.sync().unwrap();
    drop(ks);
    db.abandon();
    let db = reopen(manual(), &path, "replay #3");
    db.abandon();
    let db = reopen(manual(), &path, "replay #4 (no writes in between)");
    let ks = db.open_keyspace("ow").unwrap();
    assert_contents("replay #4", &ks, &want(&[(b"k1", b"v6"), (b"k2", b"")]));
}

#[test]
fn reopen_many_times_in_a_row() {
    // Thirty open/write/close cycles, ending alternately in a clean close, a sync and a
    // crash, and a commit and a crash; the state is exact after each.
    let (_dir, path) = temp_volume();
    let mut models = vec![Model::new(), Model::new()];
    let names = ["first", "second"];
    let db = manual().open(&path).unwrap();
    for name in names {
        db.keyspace(name).unwrap();
    }
    db.close().unwrap();

    let mut rng = StdRng::seed_from_u64(99);
    for cycle in 0..30u64 {
        let db = reopen(manual(), &path, &format!("cycle {cycle}"));
        assert_eq!(db.keyspace_names(), names.to_vec());
        let handles: Vec<Keyspace> = names.iter().map(|n| db.open_keyspace(n).unwrap()).collect();
        for (ks, model) in handles.iter().zip(&models) {
            assert_contents(&format!("cycle {cycle} {}", ks.name()), ks, model);
        }
        for n in 0..50u64 {
            let which = rng.random_range(0..2);
            let i = rng.random_range(0..300);
            if rng.random_bool(0.25) {
                handles[which].delete(&key(i)).unwrap();
                models[which].remove(&key(i));
            } else {
                let v = value(i, cycle * 100 + n, rng.random_range(0..256));
                handles[which].put(&key(i), &v).unwrap();
                models[which].insert(key(i), v);
            }
        }
        drop(handles);
        match cycle % 3 {
            0 => db.close().unwrap(),
            1 => {
                db.sync().unwrap();
                db.abandon();
            }
            _ => {
                db.commit().unwrap();
                db.abandon();
            }
        }
    }
}

/// Commits `keys` keys, writes a small tail after the commit, syncs and crashes; the
/// reopen must replay the tail over the committed index and find every key.
fn reopen_after_committing(keys: u64) {
    let (_dir, path) = temp_volume();
    let db = manual().open(&path).unwrap();
    let ks = db.keyspace("bulk").unwrap();
    for start in (0..keys).step_by(1_000) {
        let mut batch = ks.batch();
        for i in start..(start + 1_000).min(keys) {
            batch.put(&key(i), &value(i, 1, 16));
        }
        batch.commit().unwrap();
    }
    db.commit().unwrap();
    // The tail: 100 new keys, 100 overwrites, 10 deletes.
    for i in 0..100 {
        ks.put(&key(keys + i), &value(keys + i, 2, 16)).unwrap();
        ks.put(&key(i * 7), &value(i * 7, 3, 16)).unwrap();
    }
    for i in 0..10 {
        assert!(ks.delete(&key(keys - 1 - i * 13)).unwrap());
    }
    db.sync().unwrap();
    drop(ks);
    db.abandon();

    let db = reopen(manual(), &path, &format!("{keys} committed keys"));
    let ks = db.open_keyspace("bulk").unwrap();
    assert_eq!(ks.len(), keys + 100 - 10);
    let deleted: Vec<u64> = (0..10).map(|i| keys - 1 - i * 13).collect();
    let mut expected = (0..keys + 100).filter(|i| !deleted.contains(i));
    for item in ks.range::<&[u8], _>(..) {
        let (k, v) = item.expect("range item");
        let i = expected.next().expect("no more keys than expected");
        assert_eq!(k, key(i));
        let version = if i >= keys {
            2
        } else if i % 7 == 0 && i / 7 < 100 {
            3
        } else {
            1
        };
        assert_eq!(v, value(i, version, 16), "value of key {i}");
    }
    assert_eq!(expected.next(), None, "every key came back");
}

#[test]
fn reopen_after_committing_10k_keys_and_a_tail() {
    reopen_after_committing(10_000);
}

#[test]
fn reopen_after_committing_100k_keys_and_a_tail() {
    reopen_after_committing(100_000);
}

#[test]
fn a_creation_that_crashed_before_its_first_commit_is_created_again() {
    // Found by the kill -9 driver (M3): a kill while creating a volume left a non-empty
    // file without a superblock, which open refused as NotAVolume. Now
    // creating a volume first stamps slot 0 with a marker; a crash before anything was
    // committed leaves a non-empty file without a superblock. That file is ours and
    // holds nothing: open creates the volume again instead of refusing it. The same
    // marker with anything in slot 1 is not taken for an interrupted creation.
    let (_dir, path) = temp_volume();
    let mut image = vec![0u8; 8 << 20];
    image[..8].copy_from_slice(b"TUCANAC\0");
    image[9000] = 0x5a; // bytes the interrupted creation had written elsewhere
    std::fs::write(&path, &image).unwrap();
    let db = Database::builder().open(&path).unwrap();
    let ks = db.keyspace("ks").unwrap();
    ks.put(b"k", b"v").unwrap();
    drop(ks);
    db.close().unwrap();
    let db = Database::builder().open(&path).unwrap();
    assert_eq!(
        db.open_keyspace("ks")
            .unwrap()
            .get(b"k")
            .unwrap()
            .as_deref(),
        Some(&b"v"[..])
    );
    db.check().unwrap();
    drop(db);

    image[4096 + 100] = 1;
    std::fs::write(&path, &image).unwrap();
    assert!(Database::builder().open(&path).is_err());
}
