//! Bugs found by the torture suites, each kept as a named test.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tucana::volume::{MemStorage, Storage};
use tucana::{Database, Durability, Error};

/// Memory storage whose syncs fail while `broken` is set.
struct FailingSync {
    inner: MemStorage,
    broken: AtomicBool,
}

impl Storage for FailingSync {
    fn len_bytes(&self) -> tucana::Result<u64> {
        self.inner.len_bytes()
    }
    fn grow(&self, len_bytes: u64) -> tucana::Result<()> {
        self.inner.grow(len_bytes)
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> tucana::Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> tucana::Result<()> {
        self.inner.write_at(offset, data)
    }
    fn sync(&self) -> tucana::Result<()> {
        if self.broken.load(Ordering::SeqCst) {
            return Err(Error::Io(std::io::Error::other("injected sync failure")));
        }
        self.inner.sync()
    }
}

/// Found by M2 (I/O error sweeps). `Database::sync` returned `Ok` on a poisoned store
/// whenever nothing unsynced was left: its group-commit fast path ("everything up to my
/// ticket is already durable") ran before the poison check. Nothing acknowledged was
/// lost, but a caller reading that `Ok` would take a store that refuses every write for a
/// healthy one. A poisoned store now answers every sync with `Error::Poisoned`.
#[test]
fn sync_on_a_poisoned_store_with_nothing_unsynced_is_an_error() {
    let storage = Arc::new(FailingSync {
        inner: MemStorage::new(),
        broken: AtomicBool::new(false),
    });
    let db = Database::builder()
        .commit_interval(None)
        .flush_interval(None)
        .open_storage(storage.clone())
        .unwrap();
    let ks = db.keyspace("ks").unwrap();
    ks.put(b"k", b"v").unwrap();
    db.sync().unwrap();
    // A commit whose sync fails poisons the store with nothing unsynced left.
    storage.broken.store(true, Ordering::SeqCst);
    assert!(db.commit().is_err());
    storage.broken.store(false, Ordering::SeqCst);
    assert!(matches!(db.sync(), Err(Error::Poisoned)));
    assert!(matches!(
        ks.put_with(b"k2", b"v", Durability::Sync),
        Err(Error::Poisoned)
    ));
}
