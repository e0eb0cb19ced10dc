//! `WATCH`'s table of one database: a version per key that some connection watches,
//! moved by every write of that key (value, deadline, deletion, expiry sweep, flush of
//! a live key).
//!
//! Owns the versions and the count of watchers per key; a key leaves the table when its
//! last watcher goes ([`Watch`] releases on drop, so a connection that ends releases
//! its keys). Versions, not values, are compared at `EXEC`, so a key written back to the
//! same value still counts as modified (no ABA). Writes pay one atomic load when nobody
//! watches anything in the database. It does not own `EXEC`'s check (`commands`), which
//! runs under the database's write lock, as do the bumps: no write can fall between a
//! check and the transaction.
//!
//! Thread-safety: `Send + Sync`; a mutex guards the map.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

/// The watched keys of one database (stored keys: slot-prefixed in cluster mode).
#[derive(Default)]
pub struct WatchTable {
    /// Key → (watchers, version).
    keys: Mutex<HashMap<Vec<u8>, (usize, u64)>>,
    /// Entries in `keys`: zero lets writes skip the lock.
    watched: AtomicUsize,
}

/// One connection's watch of one key; released when dropped.
pub struct Watch {
    table: Arc<WatchTable>,
    key: Vec<u8>,
    version: u64,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Watch({} bytes, v{})", self.key.len(), self.version)
    }
}

impl WatchTable {
    /// Starts watching `key`.
    pub fn watch(table: &Arc<WatchTable>, key: &[u8]) -> Watch {
        let mut keys = table.keys.lock();
        let entry = keys.entry(key.to_vec()).or_insert((0, 0));
        entry.0 += 1;
        let version = entry.1;
        table.watched.store(keys.len(), Ordering::Release);
        Watch {
            table: table.clone(),
            key: key.to_vec(),
            version,
        }
    }

    /// Whether anybody watches a key here (a hint for writers; bumps run under the
    /// database's write lock, and `watch` takes it too before reading a version).
    pub fn any(&self) -> bool {
        self.watched.load(Ordering::Acquire) > 0
    }

    /// Marks `keys` modified.
    pub fn bump<'k>(&self, keys: impl IntoIterator<Item = &'k [u8]>) {
        if !self.any() {
            return;
        }
        let mut table = self.keys.lock();
        for key in keys {
            if let Some(entry) = table.get_mut(key) {
                entry.1 += 1;
            }
        }
    }

    /// The keys watched now (FLUSHDB marks those that are live modified: a flush does
    /// not modify a key that had already expired, as in Redis 7).
    pub fn keys(&self) -> Vec<Vec<u8>> {
        if !self.any() {
            return Vec::new();
        }
        self.keys.lock().keys().cloned().collect()
    }

    fn release(&self, key: &[u8]) {
        let mut keys = self.keys.lock();
        if let Some(entry) = keys.get_mut(key) {
            entry.0 -= 1;
            if entry.0 == 0 {
                keys.remove(key);
            }
        }
        self.watched.store(keys.len(), Ordering::Release);
    }
}

impl Watch {
    /// Whether the key was written since the watch began.
    pub fn modified(&self) -> bool {
        self.table.keys.lock().get(&self.key).map(|e| e.1) != Some(self.version)
    }

    /// The watched key (stored form).
    pub fn key(&self) -> &[u8] {
        &self.key
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.table.release(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_moves_the_version_and_the_last_release_forgets_the_key() {
        let table = Arc::new(WatchTable::default());
        table.bump([&b"k"[..]]);
        let a = WatchTable::watch(&table, b"k");
        let b = WatchTable::watch(&table, b"k");
        assert!(!a.modified() && table.any());
        table.bump([&b"other"[..]]);
        assert!(!a.modified());
        table.bump([&b"k"[..]]);
        assert!(a.modified() && b.modified());
        let c = WatchTable::watch(&table, b"k");
        assert!(!c.modified());
        assert_eq!(table.keys(), [b"k".to_vec()]);
        table.bump(table.keys().iter().map(Vec::as_slice));
        assert!(c.modified());
        drop((a, b, c));
        assert!(!table.any());
    }
}
