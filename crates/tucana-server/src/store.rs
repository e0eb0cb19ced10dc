//! The server's view of the database: the numbered databases of `SELECT` mapped to
//! Tucana keyspaces, the per-keyspace write lock that makes read-modify-write commands
//! atomic, and the table of `SCAN` cursors.
//!
//! `SELECT 0` is the keyspace `default` (the one the `tucana` CLI uses by default);
//! `SELECT n` for n > 0 is the keyspace `db<n>`. A keyspace is created on the first
//! write to it; reading a database that was never written finds nothing.
//!
//! Why a write lock in the server: the engine has one writer per keyspace but no
//! compare-and-swap, so `INCR` (read, add, write) racing with another write to the same
//! key could lose that write. Every command that writes takes its database's lock for the
//! duration of its reads and writes to the engine, so writes to one keyspace are applied
//! in one order and a read-modify-write sees no write between its read and its write.
//! The lock is released before waiting for durability, so concurrent sync writers still
//! share one fsync. Reads take no lock (the engine's readers never block).
//!
//! Thread-safety: everything here is `Send + Sync`; locks are held only across engine
//! calls that do not wait for I/O beyond appending to a log buffer.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard, RwLock};
use tucana::{Database, Error, Keyspace};

use crate::waiters::WaitTable;
use crate::watch::WatchTable;

/// One numbered database.
pub struct Slot {
    name: String,
    /// The database's number (`SELECT`), named in keyspace notifications' channels; 0
    /// for a cluster region's keyspace (cluster mode has database 0 only).
    index: u32,
    /// Serialises the writers of this database (see the module doc).
    write_lock: Mutex<()>,
    /// `None` until the keyspace exists; replaced by `FLUSHDB`.
    handle: RwLock<Option<Keyspace>>,
    /// The keyspace may hold deadlines (it has `expiry::MARKER`): reads look deadlines
    /// up only when set (DESIGN.md, "Expiry").
    may_expire: AtomicBool,
    /// Writes that may have abandoned a collection's version, leaving its sub-records
    /// behind its key (a value written without reading what it replaced, a big
    /// collection deleted, an expired one swept or written again), counted after each
    /// is applied. The collector of old versions rests while this stays as it was at
    /// the start of its last full round (`collector`).
    abandonments: AtomicU64,
    /// WATCH's versions of this database's watched keys.
    watches: Arc<WatchTable>,
    /// The clients blocked on this database's keys (BLPOP, ...).
    waiters: Arc<WaitTable>,
}

/// Where a new slot's count of abandonments starts: each slot made in this process gets
/// its own band of 2^32, so the collector's cursor, kept by keyspace name, never takes a
/// new slot under an old name (a region promoted again) for the one it rested on.
fn first_abandonment_count() -> u64 {
    static SLOTS_MADE: AtomicU64 = AtomicU64::new(0);
    SLOTS_MADE.fetch_add(1, Ordering::Relaxed) << 32
}

/// Whether a keyspace holds the marker of deadlines (an error reads as "may").
fn has_marker(ks: Option<&Keyspace>) -> bool {
    ks.is_some_and(|ks| ks.contains(crate::expiry::MARKER).unwrap_or(true))
}

/// All numbered databases of one server.
pub struct Store {
    pub db: Database,
    slots: Vec<Slot>,
    cursors: Mutex<Cursors>,
}

/// The keyspace name of database `index`.
pub fn keyspace_name(index: u32) -> String {
    if index == 0 {
        "default".to_string()
    } else {
        format!("db{index}")
    }
}

impl Store {
    pub fn new(db: Database, databases: u32, max_cursors: usize) -> Store {
        assert!(databases > 0 && max_cursors > 0);
        let slots = (0..databases)
            .map(|index| Slot {
                index,
                ..Slot::named(&db, keyspace_name(index))
            })
            .collect();
        Store {
            db,
            slots,
            cursors: Mutex::new(Cursors {
                next_id: 1,
                max: max_cursors,
                positions: HashMap::new(),
                order: VecDeque::new(),
            }),
        }
    }

    pub fn databases(&self) -> u32 {
        self.slots.len() as u32
    }

    pub fn slot(&self, index: u32) -> &Slot {
        &self.slots[index as usize]
    }

    pub fn slots(&self) -> &[Slot] {
        &self.slots
    }

    /// Remembers where a `SCAN` stopped; the cursor number to hand out.
    pub fn save_cursor(&self, db_index: u32, last_key: Vec<u8>) -> u64 {
        self.cursors.lock().save(db_index, last_key)
    }

    /// Where the `SCAN` with this cursor stopped, if the cursor is known.
    pub fn cursor(&self, db_index: u32, cursor: u64) -> Option<Vec<u8>> {
        self.cursors.lock().get(db_index, cursor)
    }
}

impl Slot {
    /// The database kept in the keyspace `name`, opened if it exists (cluster mode keeps
    /// one per region, `cluster`).
    pub fn named(db: &Database, name: String) -> Slot {
        let handle = if db.keyspace_names().contains(&name) {
            db.open_keyspace(&name).ok()
        } else {
            None
        };
        Slot {
            name,
            index: 0,
            write_lock: Mutex::new(()),
            may_expire: AtomicBool::new(has_marker(handle.as_ref())),
            abandonments: AtomicU64::new(first_abandonment_count()),
            watches: Arc::default(),
            waiters: Arc::default(),
            handle: RwLock::new(handle),
        }
    }

    /// Runs a read on the current keyspace (`None`: it does not exist, so it is empty).
    /// A `FLUSHDB` that drops the keyspace while the read runs makes the read start over
    /// on the new state, so a read never reports a dropped keyspace as an error.
    /// `f` may run more than once; whatever it does before failing with
    /// `KeyspaceNotFound` it must be ready to redo.
    pub fn read<R>(
        &self,
        mut f: impl FnMut(Option<&Keyspace>) -> tucana::Result<R>,
    ) -> tucana::Result<R> {
        // A drop replaces the handle before the keyspace goes away, so one retry sees the
        // new state; the bound only guards against a keyspace dropped behind our back.
        let mut tries = 0;
        loop {
            let handle = self.handle.read().clone();
            tries += 1;
            match f(handle.as_ref()) {
                Err(Error::KeyspaceNotFound(_)) if handle.is_some() && tries < 4 => continue,
                other => return other,
            }
        }
    }

    /// The database's number (0 for a cluster region's keyspace).
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The keyspace's name (`keyspace_name` of the database's index).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The keyspace, if it exists (no lock: what a reader would see).
    pub fn existing(&self) -> Option<Keyspace> {
        self.handle.read().clone()
    }

    /// Takes the keyspace of this database as the engine has it now: one a promotion
    /// turned from a replica into a keyspace of this server becomes readable.
    pub fn reload(&self, db: &Database) {
        let _lock = self.write_lock.lock();
        let handle = db.open_keyspace(&self.name).ok();
        self.may_expire
            .store(has_marker(handle.as_ref()), Ordering::SeqCst);
        *self.handle.write() = handle;
        // The promoted keyspace's old versions were never walked here.
        self.abandonments.fetch_add(1, Ordering::Release);
    }

    /// WATCH's table of this database (bumped by writers under the write lock).
    pub fn watches(&self) -> &Arc<WatchTable> {
        &self.watches
    }

    /// The clients blocked on this database's keys (signalled by writers).
    pub fn waiters(&self) -> &Arc<WaitTable> {
        &self.waiters
    }

    /// Whether keys of this database may have deadlines (see the field).
    pub fn may_expire(&self) -> bool {
        self.may_expire.load(Ordering::Acquire)
    }

    /// How many writes may have abandoned a collection's version so far (see the field).
    pub fn abandonments(&self) -> u64 {
        self.abandonments.load(Ordering::Acquire)
    }

    /// Takes the write lock of this database (see the module doc).
    pub fn lock_writes(&self) -> WriteGuard<'_> {
        WriteGuard {
            slot: self,
            _lock: self.write_lock.lock(),
        }
    }
}

/// Holds a database's write lock; reads and writes through it see every earlier write.
pub struct WriteGuard<'a> {
    slot: &'a Slot,
    _lock: MutexGuard<'a, ()>,
}

impl WriteGuard<'_> {
    /// The database's number (`Slot::index`).
    pub fn index(&self) -> u32 {
        self.slot.index
    }

    /// See [`Slot::may_expire`].
    pub fn may_expire(&self) -> bool {
        self.slot.may_expire()
    }

    /// The marker of deadlines is now written (durably or not, as the write it came with).
    pub fn set_may_expire(&self) {
        self.slot.may_expire.store(true, Ordering::Release);
    }

    /// A write that may have abandoned a collection's version is applied (see
    /// `Slot::abandonments`): called after the write, so a collector round that starts
    /// before this call sees the count change, and one that starts after it sees the
    /// write.
    pub fn note_abandoned(&self) {
        self.slot.abandonments.fetch_add(1, Ordering::Release);
    }

    /// The keyspace, if it exists.
    pub fn existing(&self) -> Option<Keyspace> {
        self.slot.handle.read().clone()
    }

    /// Marks the keys written by `stored` (stored keys, see `expiry::modified_key`)
    /// modified for WATCH, and wakes the first client blocked on each (BLPOP, ...);
    /// nearly free when nobody watches or waits.
    pub fn modified<'k>(&self, stored: impl IntoIterator<Item = &'k [u8]>, slot_prefixed: bool) {
        let (watches, waiters) = (&self.slot.watches, &self.slot.waiters);
        if watches.any() || waiters.any() {
            let keys: Vec<Vec<u8>> = stored
                .into_iter()
                .filter_map(|k| crate::expiry::modified_key(k, slot_prefixed))
                .collect();
            watches.bump(keys.iter().map(Vec::as_slice));
            waiters.signal(keys.iter().map(Vec::as_slice));
        }
    }

    /// The keyspace, created (durably) if it does not exist yet.
    pub fn keyspace(&self, db: &Database) -> tucana::Result<Keyspace> {
        if let Some(ks) = self.existing() {
            return Ok(ks);
        }
        let ks = db.keyspace(&self.slot.name)?;
        *self.slot.handle.write() = Some(ks.clone());
        Ok(ks)
    }

    /// Drops the keyspace and all its data (durably); the next write creates it again.
    pub fn flush(&self, db: &Database) -> tucana::Result<()> {
        if self.existing().is_none() {
            return Ok(());
        }
        // The watched keys the flush deletes: those live now (Redis 7 does not count a
        // flush as a change of a watched key that had already expired).
        let now = crate::expiry::now_ms();
        let live: Vec<Vec<u8>> = match self.existing() {
            Some(ks) => self
                .slot
                .watches
                .keys()
                .into_iter()
                .filter(|k| crate::expiry::live_in(&ks, k, now))
                .collect(),
            None => Vec::new(),
        };
        // Forget the handle first: a reader that still holds the old one gets
        // `KeyspaceNotFound` once it is dropped and starts over on `None`.
        let old = self.slot.handle.write().take();
        match db.drop_keyspace(&self.slot.name) {
            Ok(()) | Err(Error::KeyspaceNotFound(_)) => {
                self.slot.may_expire.store(false, Ordering::Release);
                self.slot.watches.bump(live.iter().map(Vec::as_slice));
                Ok(())
            }
            Err(e) => {
                *self.slot.handle.write() = old;
                Err(e)
            }
        }
    }
}

/// `SCAN` positions by cursor number, oldest forgotten first.
struct Cursors {
    next_id: u64,
    max: usize,
    positions: HashMap<u64, (u32, Vec<u8>)>,
    order: VecDeque<u64>,
}

impl Cursors {
    fn save(&mut self, db_index: u32, last_key: Vec<u8>) -> u64 {
        // Never 0: 0 starts and ends an iteration.
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        while self.order.len() >= self.max {
            if let Some(old) = self.order.pop_front() {
                self.positions.remove(&old);
            }
        }
        self.positions.insert(id, (db_index, last_key));
        self.order.push_back(id);
        id
    }

    fn get(&self, db_index: u32, cursor: u64) -> Option<Vec<u8>> {
        match self.positions.get(&cursor) {
            Some((db, key)) if *db == db_index => Some(key.clone()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_numbers_map_to_keyspace_names() {
        assert_eq!(keyspace_name(0), "default");
        assert_eq!(keyspace_name(3), "db3");
    }

    #[test]
    fn keyspaces_are_created_on_first_write_and_dropped_by_flush() {
        let db = Database::builder().open_in_memory().unwrap();
        let store = Store::new(db.clone(), 4, 8);
        let slot = store.slot(2);
        assert!(!slot.read(|ks| Ok(ks.is_some())).unwrap());
        let guard = slot.lock_writes();
        guard.keyspace(&db).unwrap().put(b"k", b"v").unwrap();
        drop(guard);
        assert!(db.keyspace_names().contains(&"db2".to_string()));
        let got = slot
            .read(|ks| match ks {
                Some(ks) => ks.get(b"k"),
                None => Ok(None),
            })
            .unwrap();
        assert_eq!(got.as_deref(), Some(&b"v"[..]));
        slot.lock_writes().flush(&db).unwrap();
        assert!(!db.keyspace_names().contains(&"db2".to_string()));
        assert!(!slot.read(|ks| Ok(ks.is_some())).unwrap());
    }

    #[test]
    fn cursors_are_per_database_and_the_oldest_are_forgotten() {
        let db = Database::builder().open_in_memory().unwrap();
        let store = Store::new(db, 2, 2);
        let a = store.save_cursor(0, b"a".to_vec());
        let b = store.save_cursor(1, b"b".to_vec());
        assert_ne!(a, 0);
        assert_eq!(store.cursor(0, a), Some(b"a".to_vec()));
        assert_eq!(store.cursor(0, b), None, "cursor of another database");
        let _c = store.save_cursor(0, b"c".to_vec());
        assert_eq!(store.cursor(0, a), None, "forgotten");
        assert_eq!(store.cursor(1, b), Some(b"b".to_vec()));
    }
}
