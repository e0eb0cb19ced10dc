//! The public API's limits and errors: size limits on keys and values, errors that change
//! nothing, locking, missing keyspaces and files, keyspace management, statistics, and
//! volumes that are not volumes at all. Every error here is a typed `Error`, never a panic.

// Handles are dropped explicitly before `close`/`abandon`: a live `Keyspace` may keep the
// database alive. (In the API skeleton the handle has no fields yet, hence the lint.)
#![allow(clippy::drop_non_drop)]

use std::path::{Path, PathBuf};

use rand::{Rng, SeedableRng};
use tucana::{Database, Durability, Error, Keyspace, Result, MAX_KEY_BYTES, MAX_VALUE_BYTES};

fn temp_volume() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("api.tucana");
    (dir, path)
}

/// Options under which only the test commits, so statistics move only when it says.
fn quiet_open(path: &Path) -> Database {
    Database::builder()
        .commit_interval(None)
        .flush_interval(None)
        .open(path)
        .expect("open volume")
}

/// The error of a result whose `Ok` side has no `Debug` (handles).
fn expect_err<T>(what: &str, result: Result<T>) -> Error {
    match result {
        Ok(_) => panic!("{what}: expected an error, got Ok"),
        Err(e) => e,
    }
}

fn all(ks: &Keyspace) -> Vec<(Vec<u8>, Vec<u8>)> {
    ks.range::<&[u8], _>(..)
        .collect::<Result<Vec<_>>>()
        .expect("full range")
}

#[test]
fn handles_and_errors_are_send_and_sync() {
    // Handles are shared across threads by cloning; errors cross threads in results.
    fn send_sync<T: Send + Sync + 'static>() {}
    fn clone<T: Clone>() {}
    send_sync::<Database>();
    send_sync::<Keyspace>();
    send_sync::<Error>();
    send_sync::<tucana::Stats>();
    clone::<Database>();
    clone::<Keyspace>();
    fn std_error<T: std::error::Error + Send + Sync + 'static>() {}
    std_error::<Error>();
    assert_eq!(Durability::default(), Durability::Buffered);
}

#[test]
fn key_of_the_maximum_size_works_and_one_byte_more_is_rejected() {
    // The key limit is inclusive; one byte over is a typed error that writes nothing,
    // alone or inside a batch.
    let db = Database::builder().open_in_memory().expect("in-memory db");
    let ks = db.keyspace("keys").expect("keyspace");
    ks.put(b"before", b"v").unwrap();

    let max_key = vec![b'k'; MAX_KEY_BYTES];
    ks.put(&max_key, b"max").expect("key of MAX_KEY_BYTES");
    assert_eq!(ks.get(&max_key).unwrap().as_deref(), Some(&b"max"[..]));

    let mut too_long = max_key.clone();
    too_long.push(b'k');
    match ks.put(&too_long, b"x") {
        Err(Error::KeyTooLarge { len, max }) => {
            assert_eq!(len, MAX_KEY_BYTES + 1);
            assert_eq!(max, MAX_KEY_BYTES);
        }
        other => panic!("expected KeyTooLarge, got {other:?}"),
    }
    match ks.put_with(&too_long, b"x", Durability::Sync) {
        Err(Error::KeyTooLarge { .. }) => {}
        other => panic!("expected KeyTooLarge for a sync put, got {other:?}"),
    }

    // A batch with one oversized key applies none of its writes.
    let mut batch = ks.batch();
    batch
        .put(b"in-batch", b"v")
        .delete(b"before")
        .put(&too_long, b"x");
    assert!(matches!(batch.commit(), Err(Error::KeyTooLarge { .. })));

    assert_eq!(ks.len(), 2, "failed writes changed nothing");
    assert_eq!(ks.get(b"in-batch").unwrap(), None);
    assert_eq!(ks.get(b"before").unwrap().as_deref(), Some(&b"v"[..]));
    assert_eq!(ks.get(&max_key).unwrap().as_deref(), Some(&b"max"[..]));
    db.check().expect("check");
}

#[test]
fn value_of_the_maximum_size_works_and_survives_reopen() {
    // A 64 MiB value is larger than any log segment; it must round-trip through the
    // log, a commit and a reopen byte for byte.
    let (_dir, path) = temp_volume();
    let value: Vec<u8> = (0..MAX_VALUE_BYTES).map(|i| (i % 251) as u8).collect();
    {
        let db = quiet_open(&path);
        let ks = db.keyspace("big").expect("keyspace");
        ks.put(b"big", &value).expect("value of MAX_VALUE_BYTES");
        ks.put(b"small", b"after").unwrap();
        assert_eq!(
            ks.get_with(b"big", |v| v.len()).unwrap(),
            Some(MAX_VALUE_BYTES)
        );
        assert!(ks.get(b"big").unwrap().as_ref() == Some(&value));
        drop(ks);
        db.close().expect("close");
    }
    let db = quiet_open(&path);
    let ks = db.open_keyspace("big").expect("keyspace after reopen");
    assert!(ks.get_with(b"big", |v| v == &value[..]).unwrap() == Some(true));
    assert_eq!(ks.get(b"small").unwrap().as_deref(), Some(&b"after"[..]));
    db.check().expect("check");
}

#[test]
fn value_larger_than_the_maximum_is_rejected_and_changes_nothing() {
    let db = Database::builder().open_in_memory().expect("in-memory db");
    let ks = db.keyspace("values").expect("keyspace");
    ks.put(b"k", b"old").unwrap();
    let too_big = vec![0u8; MAX_VALUE_BYTES + 1];
    match ks.put(b"k", &too_big) {
        Err(Error::ValueTooLarge { len, max }) => {
            assert_eq!(len, MAX_VALUE_BYTES + 1);
            assert_eq!(max, MAX_VALUE_BYTES);
        }
        other => panic!("expected ValueTooLarge, got {other:?}"),
    }
    let mut batch = ks.batch();
    batch.put(b"other", b"v").put(b"k", &too_big);
    assert!(matches!(batch.commit(), Err(Error::ValueTooLarge { .. })));
    assert_eq!(ks.get(b"k").unwrap().as_deref(), Some(&b"old"[..]));
    assert_eq!(ks.get(b"other").unwrap(), None);
    assert_eq!(ks.len(), 1);
}

#[test]
fn put_all_is_a_batch_of_puts_without_the_copies() {
    let db = Database::builder().open_in_memory().expect("in-memory db");
    let ks = db.keyspace("pairs").expect("keyspace");
    ks.put(b"a", b"old").unwrap();
    let pairs: [(&[u8], &[u8]); 3] = [(b"a", b"1"), (b"b", b"2"), (b"a", b"3")];
    ks.put_all(&pairs, Durability::Buffered).unwrap();
    assert_eq!(
        ks.get(b"a").unwrap().as_deref(),
        Some(&b"3"[..]),
        "the later pair wins"
    );
    assert_eq!(ks.get(b"b").unwrap().as_deref(), Some(&b"2"[..]));
    ks.put_all(&[], Durability::Sync).unwrap();

    // One oversized value: nothing of the call is applied.
    let too_big = vec![0u8; MAX_VALUE_BYTES + 1];
    let pairs: [(&[u8], &[u8]); 2] = [(b"c", b"v"), (b"a", &too_big)];
    assert!(matches!(
        ks.put_all(&pairs, Durability::Buffered),
        Err(Error::ValueTooLarge { .. })
    ));
    assert_eq!(ks.get(b"c").unwrap(), None);
    assert_eq!(ks.len(), 2);
    db.check().expect("check");
}

#[test]
fn write_all_is_a_batch_of_puts_and_deletes_from_the_callers_buffers() {
    let db = Database::builder().open_in_memory().expect("in-memory db");
    let ks = db.keyspace("ops").expect("keyspace");
    ks.put(b"gone", b"old").unwrap();
    ks.put(b"a", b"old").unwrap();
    let ops: Vec<(Vec<u8>, Option<Vec<u8>>)> = vec![
        (b"gone".to_vec(), None),
        (b"a".to_vec(), Some(b"1".to_vec())),
        (b"b".to_vec(), Some(b"2".to_vec())),
        (b"b".to_vec(), None),
        (b"a".to_vec(), Some(b"3".to_vec())),
    ];
    ks.write_all(&ops, Durability::Buffered).unwrap();
    assert_eq!(ks.get(b"gone").unwrap(), None);
    assert_eq!(
        ks.get(b"a").unwrap().as_deref(),
        Some(&b"3"[..]),
        "the later op wins"
    );
    assert_eq!(ks.get(b"b").unwrap(), None, "the later delete wins");
    assert_eq!(ks.len(), 1);

    // One oversized key, after a delete and a put: nothing of the call is applied.
    let too_long = vec![b'k'; MAX_KEY_BYTES + 1];
    let ops: [(&[u8], Option<&[u8]>); 3] =
        [(b"a", None), (b"c", Some(b"v")), (&too_long, Some(b"v"))];
    assert!(matches!(
        ks.write_all(&ops, Durability::Sync),
        Err(Error::KeyTooLarge { .. })
    ));
    assert_eq!(ks.get(b"a").unwrap().as_deref(), Some(&b"3"[..]));
    assert_eq!(ks.get(b"c").unwrap(), None);
    db.check().expect("check");
}

#[test]
fn second_open_of_a_locked_volume_is_refused() {
    // The volume lock keeps a second opener (here in the same process, through a new
    // file handle) out until the first closes.
    let (_dir, path) = temp_volume();
    let db = quiet_open(&path);
    db.keyspace("ks").unwrap().put(b"k", b"v").unwrap();
    let err = expect_err("second open", Database::open(&path));
    assert!(matches!(err, Error::Locked), "expected Locked, got {err:?}");
    // The refused open did not disturb the first.
    assert_eq!(
        db.open_keyspace("ks")
            .unwrap()
            .get(b"k")
            .unwrap()
            .as_deref(),
        Some(&b"v"[..])
    );
    db.close().expect("close");

    let db = quiet_open(&path);
    assert_eq!(
        db.open_keyspace("ks")
            .unwrap()
            .get(b"k")
            .unwrap()
            .as_deref(),
        Some(&b"v"[..])
    );
}

#[test]
fn abandon_releases_the_lock() {
    let (_dir, path) = temp_volume();
    let db = quiet_open(&path);
    db.keyspace("ks").unwrap();
    db.commit().unwrap();
    db.abandon();
    let db = quiet_open(&path);
    assert_eq!(db.keyspace_names(), vec!["ks".to_string()]);
}

#[test]
fn open_keyspace_of_a_missing_name_is_keyspace_not_found() {
    let db = Database::builder().open_in_memory().expect("in-memory db");
    let err = expect_err("open_keyspace", db.open_keyspace("nope"));
    match err {
        Error::KeyspaceNotFound(name) => assert_eq!(name, "nope"),
        other => panic!("expected KeyspaceNotFound, got {other:?}"),
    }
    assert!(
        db.keyspace_names().is_empty(),
        "a failed open creates nothing"
    );
    // `keyspace` creates it; then `open_keyspace` finds it.
    db.keyspace("nope").expect("create");
    assert_eq!(db.open_keyspace("nope").expect("open").name(), "nope");
}

#[test]
fn keyspace_names_are_sorted_and_keyspaces_are_independent() {
    let db = Database::builder().open_in_memory().expect("in-memory db");
    for name in ["zeta", "alpha", "mid"] {
        let ks = db.keyspace(name).expect("create");
        assert_eq!(ks.name(), name);
        ks.put(b"shared-key", name.as_bytes()).unwrap();
    }
    // Asking again for an existing keyspace opens it; it does not make a second one.
    db.keyspace("mid").expect("reopen");
    assert_eq!(db.keyspace_names(), vec!["alpha", "mid", "zeta"]);
    for name in ["zeta", "alpha", "mid"] {
        let ks = db.open_keyspace(name).unwrap();
        assert_eq!(
            ks.get(b"shared-key").unwrap().as_deref(),
            Some(name.as_bytes())
        );
        assert_eq!(ks.len(), 1);
    }
}

#[test]
fn drop_keyspace_removes_its_data_and_survives_reopen() {
    let (_dir, path) = temp_volume();
    {
        let db = quiet_open(&path);
        let doomed = db.keyspace("doomed").unwrap();
        let kept = db.keyspace("kept").unwrap();
        for i in 0..500u32 {
            doomed
                .put(format!("key{i:05}").as_bytes(), &[7u8; 100])
                .unwrap();
            kept.put(format!("key{i:05}").as_bytes(), &i.to_le_bytes())
                .unwrap();
        }
        db.commit().unwrap();
        drop((doomed, kept));
        db.drop_keyspace("doomed").expect("drop_keyspace");
        assert_eq!(db.keyspace_names(), vec!["kept"]);
        assert!(matches!(
            expect_err("open dropped", db.open_keyspace("doomed")),
            Error::KeyspaceNotFound(_)
        ));
        assert_eq!(db.stats().keys, 500, "the dropped keyspace's keys are gone");
        db.check().expect("check after drop");
        db.close().unwrap();
    }
    {
        let db = quiet_open(&path);
        assert_eq!(db.keyspace_names(), vec!["kept"]);
        let kept = db.open_keyspace("kept").unwrap();
        assert_eq!(kept.len(), 500);
        assert_eq!(
            kept.get(b"key00499").unwrap().as_deref(),
            Some(&499u32.to_le_bytes()[..])
        );
        // The name can be used again, and starts empty.
        let reborn = db.keyspace("doomed").unwrap();
        assert!(reborn.is_empty());
        assert_eq!(reborn.get(b"key00000").unwrap(), None);
        reborn.put(b"fresh", b"1").unwrap();
        db.check().expect("check after reopen");
        drop((kept, reborn));
        db.close().unwrap();
    }
    let db = quiet_open(&path);
    assert_eq!(db.keyspace_names(), vec!["doomed", "kept"]);
    assert_eq!(
        all(&db.open_keyspace("doomed").unwrap()),
        vec![(b"fresh".to_vec(), b"1".to_vec())]
    );
    db.check().expect("check");
}

#[test]
fn stats_move_with_writes_commits_and_syncs() {
    let (_dir, path) = temp_volume();
    let db = quiet_open(&path);
    let start = db.stats();
    assert_eq!(start.keys, 0);
    assert!(
        start.volume_bytes > 0,
        "a created volume has a superblock at least"
    );

    let a = db.keyspace("a").unwrap();
    let b = db.keyspace("b").unwrap();
    for i in 0..300u32 {
        a.put(format!("a{i:04}").as_bytes(), &[1u8; 64]).unwrap();
    }
    for i in 0..200u32 {
        b.put(format!("b{i:04}").as_bytes(), &[2u8; 64]).unwrap();
    }
    let written = db.stats();
    assert_eq!(written.keys, 500);
    assert!(written.index_bytes > 0, "an index with 500 keys takes heap");
    assert!(written.index_nodes > 0);
    assert!(
        written.live_log_bytes >= 500 * 64,
        "live log holds at least the values"
    );
    let mut per_ks: Vec<(String, u64)> = written
        .keyspaces
        .iter()
        .map(|k| (k.name.clone(), k.keys))
        .collect();
    per_ks.sort();
    assert_eq!(per_ks, vec![("a".to_string(), 300), ("b".to_string(), 200)]);
    // 300 keys do not fit one leaf (200 entries): keyspace "a"'s index split, and the
    // engine's figure is the sum of the keyspaces'.
    assert!(written.index_leaf_splits >= 1, "{written:?}");
    let splits: u64 = written
        .keyspaces
        .iter()
        .map(|k| k.index_writes.leaf_splits)
        .sum();
    assert_eq!(written.index_leaf_splits, splits);

    db.sync().unwrap();
    let synced = db.stats();
    assert!(synced.syncs > written.syncs, "sync counted");
    assert!(
        synced.bytes_written > start.bytes_written,
        "the log reached the volume"
    );

    db.commit().unwrap();
    let committed = db.stats();
    assert!(committed.commits > synced.commits, "commit counted");
    assert!(
        committed.commit_epoch > start.commit_epoch,
        "commit epoch advanced"
    );
    assert!(committed.allocated_bytes > 0);

    // Overwrites and deletes turn live log bytes into dead ones.
    for i in 0..100u32 {
        a.put(format!("a{i:04}").as_bytes(), &[3u8; 64]).unwrap();
        assert!(b.delete(format!("b{i:04}").as_bytes()).unwrap());
    }
    let churned = db.stats();
    assert_eq!(churned.keys, 400);
    assert!(
        churned.dead_log_bytes > committed.dead_log_bytes,
        "overwrites leave dead bytes"
    );
    assert_eq!(a.len() + b.len(), churned.keys);

    let json = churned.to_json();
    assert!(json.contains("\"keys\":400,"), "json: {json}");
    assert!(json.contains("\"name\":\"a\""), "json: {json}");
    assert!(json.contains("\"index_leaf_splits\":"), "json: {json}");
}

#[test]
fn create_if_missing_false_on_a_missing_path_is_an_error_and_creates_nothing() {
    let (_dir, path) = temp_volume();
    let result = Database::builder().create_if_missing(false).open(&path);
    let err = expect_err("open missing", result);
    // Which variant is the engine's choice (an I/O not-found is natural); it must not
    // be mistaken for a lock or a corrupt volume.
    assert!(
        !matches!(err, Error::Locked | Error::Corruption { .. }),
        "got {err:?}"
    );
    assert!(!path.exists(), "a refused open leaves no file behind");
}

/// Writes `bytes` as a volume file and checks that opening it is a clean refusal that
/// leaves the file as it was.
fn assert_refused(name: &str, bytes: &[u8]) {
    let (_dir, path) = temp_volume();
    std::fs::write(&path, bytes).unwrap();
    for create_if_missing in [false, true] {
        let result = Database::builder()
            .create_if_missing(create_if_missing)
            .open(&path);
        let err = expect_err(name, result);
        assert!(
            matches!(err, Error::NotAVolume(_) | Error::Corruption { .. }),
            "{name}: expected NotAVolume or Corruption, got {err:?}"
        );
        assert!(
            std::fs::read(&path).unwrap() == bytes,
            "{name}: a refused open changed the file"
        );
    }
}

#[test]
fn a_file_of_garbage_is_not_a_volume() {
    // Not a panic, not an overwrite (even with create_if_missing): a typed refusal.
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x7ca7a);
    for len_bytes in [4096usize, 8192, 64 * 1024, 1 << 20] {
        let mut garbage = vec![0u8; len_bytes];
        rng.fill(&mut garbage[..]);
        assert_refused(&format!("{len_bytes} random bytes"), &garbage);
    }
    assert_refused("64 KiB of zeros", &vec![0u8; 64 * 1024]);
    assert_refused("64 KiB of 0xff", &vec![0xffu8; 64 * 1024]);
}

#[test]
fn basic_reads_and_writes_in_memory() {
    // The in-memory backend serves the same API (tools and unit tests rely on it).
    let db = Database::builder().open_in_memory().expect("in-memory db");
    let ks = db.keyspace("m").unwrap();
    assert!(ks.is_empty());
    assert!(
        !ks.delete(b"absent").unwrap(),
        "deleting an absent key reports false"
    );
    ks.put(b"k", b"").unwrap();
    assert_eq!(
        ks.get(b"k").unwrap(),
        Some(Vec::new()),
        "an empty value is a value"
    );
    assert!(ks.contains(b"k").unwrap());
    assert_eq!(ks.get_with(b"k", |v| v.len()).unwrap(), Some(0));
    assert_eq!(ks.get_with(b"absent", |v| v.len()).unwrap(), None);
    ks.put_with(b"k", b"v2", Durability::Sync).unwrap();
    assert_eq!(ks.get(b"k").unwrap().as_deref(), Some(&b"v2"[..]));
    assert!(ks.delete_with(b"k", Durability::Sync).unwrap());
    assert_eq!(ks.get(b"k").unwrap(), None);
    assert!(!ks.contains(b"k").unwrap());
    assert!(ks.is_empty());
    db.commit().unwrap();
    db.check().expect("check");
}

#[test]
fn writes_through_other_handles_after_close_are_refused_and_nothing_before_is_lost() {
    // `close` makes everything written so far durable and refuses later writes through
    // clones of the handle (they would otherwise be acknowledged and never committed).
    let (_dir, path) = temp_volume();
    let db = quiet_open(&path);
    let ks = db.keyspace("ks").unwrap();
    let clone = db.clone();
    ks.put(b"before", b"1").unwrap();
    assert!(
        ks.delete(b"before").unwrap(),
        "delete reports a present key"
    );
    assert!(
        !ks.delete(b"never").unwrap(),
        "delete reports an absent key"
    );
    ks.put(b"kept", b"2").unwrap();
    db.close().unwrap();
    assert!(matches!(
        expect_err("put after close", ks.put(b"after", b"3")),
        Error::Closed
    ));
    assert!(matches!(
        expect_err("keyspace after close", clone.keyspace("new")),
        Error::Closed
    ));
    assert_eq!(
        ks.get(b"kept").unwrap().as_deref(),
        Some(&b"2"[..]),
        "reads go on"
    );
    drop((ks, clone));
    let db = quiet_open(&path);
    let ks = db.open_keyspace("ks").unwrap();
    assert_eq!(all(&ks), vec![(b"kept".to_vec(), b"2".to_vec())]);
}

/// A small mapping reservation (for tools that cap the address space, such as valgrind)
/// only makes the mapping grow sooner: a volume far larger than it reads and reopens.
#[test]
fn a_small_mapping_reservation_still_reads_a_larger_volume() {
    let (_dir, path) = temp_volume();
    let open = || {
        Database::builder()
            .commit_interval(None)
            .flush_interval(None)
            .mapping_reservation_bytes(1 << 20)
            .open(&path)
            .unwrap()
    };
    let db = open();
    let ks = db.keyspace("k").unwrap();
    let value = vec![7u8; 4000];
    for i in 0..3000u32 {
        ks.put(format!("key{i:05}").as_bytes(), &value).unwrap();
    }
    db.commit().unwrap();
    for i in (0..3000u32).step_by(97) {
        assert_eq!(
            ks.get(format!("key{i:05}").as_bytes()).unwrap().as_deref(),
            Some(&value[..])
        );
    }
    drop(ks);
    db.close().unwrap();
    let db = open();
    let ks = db.open_keyspace("k").unwrap();
    assert_eq!(ks.range::<&[u8], _>(..).count(), 3000);
    db.check().unwrap();
}

/// `Range::next_with` and `next_back_with` lend each pair in place: the same pairs, in the
/// same order, as the owning `Iterator` and `DoubleEndedIterator`, from either end and
/// with both ends interleaved until they meet, over bounds inside and across leaves.
#[test]
fn lent_pairs_are_the_iterators_pairs_from_both_ends() {
    let (_dir, path) = temp_volume();
    let db = quiet_open(&path);
    let ks = db.keyspace("lend").unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(41);
    let mut model = std::collections::BTreeMap::new();
    for _ in 0..3000 {
        let key = format!("k{:06}", rng.random_range(0..20_000u32)).into_bytes();
        let value = vec![rng.random::<u8>(); rng.random_range(0..300)];
        ks.put(&key, &value).unwrap();
        model.insert(key, value);
    }
    db.commit().unwrap();
    for round in 0..40 {
        let a = format!("k{:06}", rng.random_range(0..21_000u32)).into_bytes();
        let b = format!("k{:06}", rng.random_range(0..21_000u32)).into_bytes();
        let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
        let want: Vec<(Vec<u8>, Vec<u8>)> = model
            .range(lo.clone()..hi.clone())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let owned: Vec<_> = ks
            .range(lo.clone()..hi.clone())
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(owned, want, "round {round}");
        // Lent, front only and back only.
        let mut range = ks.range(lo.clone()..hi.clone());
        let mut front = Vec::new();
        while let Some(pair) = range.next_with(|k, v| (k.to_vec(), v.to_vec())) {
            front.push(pair.unwrap());
        }
        assert_eq!(front, want, "round {round}");
        assert!(
            range.next_back_with(|_, _| ()).is_none(),
            "a done range stays done"
        );
        let mut range = ks.range(lo.clone()..hi.clone());
        let mut back = Vec::new();
        while let Some(pair) = range.next_back_with(|k, v| (k.to_vec(), v.to_vec())) {
            back.push(pair.unwrap());
        }
        back.reverse();
        assert_eq!(back, want, "round {round}");
        // Interleaved: lent from the front, owned from the back, until they meet.
        let mut range = ks.range(lo.clone()..hi.clone());
        let (mut head, mut tail) = (Vec::new(), Vec::new());
        loop {
            let step = if rng.random_bool(0.5) {
                range
                    .next_with(|k, v| (k.to_vec(), v.to_vec()))
                    .map(|pair| head.push(pair.unwrap()))
            } else {
                range.next_back().map(|pair| tail.push(pair.unwrap()))
            };
            if step.is_none() {
                break;
            }
        }
        tail.reverse();
        head.extend(tail);
        assert_eq!(head, want, "round {round}");
    }
}
