//! I/O failures: after a failed write or sync the store acknowledges nothing more
//! (docs/reliability.md, promise 5), reads keep working, and the volume reopens to a sound state with
//! every write acknowledged before the failure.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tucana::volume::{MemStorage, Storage};
use tucana::{Database, Durability, Error};

/// Memory storage whose writes and syncs fail while `broken` is set, and whose reads fail
/// while `reads_broken` is.
struct Flaky {
    inner: MemStorage,
    broken: AtomicBool,
    reads_broken: AtomicBool,
}

impl Flaky {
    fn fail_if_broken(&self) -> tucana::Result<()> {
        if self.broken.load(Ordering::SeqCst) {
            return Err(Error::Io(std::io::Error::other("injected I/O error")));
        }
        Ok(())
    }
}

impl Storage for Flaky {
    fn len_bytes(&self) -> tucana::Result<u64> {
        self.inner.len_bytes()
    }
    fn grow(&self, len_bytes: u64) -> tucana::Result<()> {
        self.fail_if_broken()?;
        self.inner.grow(len_bytes)
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> tucana::Result<()> {
        if self.reads_broken.load(Ordering::SeqCst) {
            return Err(Error::Io(std::io::Error::other("injected read error")));
        }
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> tucana::Result<()> {
        self.fail_if_broken()?;
        self.inner.write_at(offset, data)
    }
    fn sync(&self) -> tucana::Result<()> {
        self.fail_if_broken()?;
        self.inner.sync()
    }
}

fn options() -> tucana::Options {
    Database::builder()
        .commit_interval(None)
        .flush_interval(None)
}

#[test]
fn a_failed_sync_poisons_the_store_and_nothing_more_is_acknowledged() {
    let storage = Arc::new(Flaky {
        inner: MemStorage::new(),
        broken: AtomicBool::new(false),
        reads_broken: AtomicBool::new(false),
    });
    let db = options().open_storage(storage.clone()).unwrap();
    let ks = db.keyspace("ks").unwrap();
    ks.put_with(b"durable", b"1", Durability::Sync).unwrap();
    ks.put(b"buffered", b"2").unwrap();

    storage.broken.store(true, Ordering::SeqCst);
    let err = ks.put_with(b"lost", b"3", Durability::Sync).unwrap_err();
    assert!(
        matches!(err, Error::Io(_)),
        "the failing sync reports the I/O error: {err}"
    );
    storage.broken.store(false, Ordering::SeqCst);

    // The device works again, but the store must not pretend: the page cache may have
    // dropped what the failed sync was writing.
    assert!(matches!(ks.put(b"after", b"4"), Err(Error::Poisoned)));
    assert!(matches!(
        ks.put_with(b"after", b"4", Durability::Sync),
        Err(Error::Poisoned)
    ));
    assert!(matches!(db.sync(), Err(Error::Poisoned)));
    assert!(matches!(db.commit(), Err(Error::Poisoned)));
    let mut batch = ks.batch();
    batch.put(b"a", b"b");
    assert!(matches!(batch.commit(), Err(Error::Poisoned)));
    // Reads keep working.
    assert_eq!(ks.get(b"durable").unwrap().as_deref(), Some(&b"1"[..]));
    drop(ks);
    assert!(matches!(db.close(), Err(Error::Poisoned)));

    // Reopening recovers: the acknowledged durable write is there, the volume is sound.
    let db = options().open_storage(storage).unwrap();
    let ks = db.open_keyspace("ks").unwrap();
    assert_eq!(ks.get(b"durable").unwrap().as_deref(), Some(&b"1"[..]));
    assert!(ks.get(b"after").unwrap().is_none());
    db.check().unwrap();
}

#[test]
fn a_failed_commit_poisons_the_store_and_reopen_recovers_the_previous_one() {
    let storage = Arc::new(Flaky {
        inner: MemStorage::new(),
        broken: AtomicBool::new(false),
        reads_broken: AtomicBool::new(false),
    });
    let db = options().open_storage(storage.clone()).unwrap();
    let ks = db.keyspace("ks").unwrap();
    for i in 0..2_000u32 {
        ks.put(&i.to_be_bytes(), &[7; 100]).unwrap();
    }
    db.sync().unwrap();
    storage.broken.store(true, Ordering::SeqCst);
    assert!(db.commit().is_err());
    storage.broken.store(false, Ordering::SeqCst);
    assert!(matches!(ks.put(b"x", b"y"), Err(Error::Poisoned)));
    drop(ks);
    let _ = db.close();

    let db = options().open_storage(storage).unwrap();
    let ks = db.open_keyspace("ks").unwrap();
    assert_eq!(ks.len(), 2_000, "synced writes come back through replay");
    db.check().unwrap();
}

/// Session 21's deferred updates made `Keyspace::snapshot` apply the deferred puts first
/// and ignore a failure to do so: the snapshot was then taken of an index without an
/// acknowledged put, and read the value it replaced. A snapshot now fails instead.
#[test]
fn a_snapshot_fails_rather_than_miss_a_deferred_update_it_could_not_apply() {
    let storage = Arc::new(Flaky {
        inner: MemStorage::new(),
        broken: AtomicBool::new(false),
        reads_broken: AtomicBool::new(false),
    });
    let db = options()
        .log_segment_bytes(64 * 1024)
        .deferred_updates(tucana::DeferredUpdates::Always)
        .open_storage(storage.clone())
        .unwrap();
    let ks = db.keyspace("ks").unwrap();
    // Enough records that the first ones sit in closed segments, read from the device.
    for i in 0..2000u32 {
        ks.put(format!("key{i:05}").as_bytes(), &[b'a'; 100])
            .unwrap();
    }
    db.commit().unwrap();
    ks.put(b"key00000", b"new").unwrap();
    assert_eq!(db.stats().deferred_puts, 1, "the update was deferred");
    // Applying it reads the record it replaces: that read fails.
    storage.reads_broken.store(true, Ordering::SeqCst);
    assert!(
        ks.snapshot().is_err(),
        "a snapshot without the deferred put would read the old value"
    );
    storage.reads_broken.store(false, Ordering::SeqCst);
    // The live keyspace still answers with the acknowledged put.
    assert_eq!(ks.get(b"key00000").unwrap().as_deref(), Some(&b"new"[..]));
    db.abandon();
}
