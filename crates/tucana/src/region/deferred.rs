//! Deferred updates: a put of a key the index already holds, logged at once and applied
//! to the index later, in batches, so that the writer does not wait for the device.
//!
//! Why (DESIGN.md, "Updates that do not wait for the device"): applying a put to the
//! index reads the record it replaces, to confirm the full key (a leaf keeps only an
//! 8-byte prefix and a 4-byte hash) and to count its bytes dead. Out of memory that is one
//! random device read per update, at queue depth 1, under the writer lock or just before
//! it. A deferred put is appended to the log (so it is durable exactly as any other put),
//! recorded here by its full key, and applied by a later batch whose replaced records are
//! first asked from the device all at once (`Region::prefetch_records`), then read while
//! the device works on all of them.
//!
//! Exactness: the map is keyed by the full key and holds the newest deferred put of each
//! key, so nothing here trusts a prefix or a hash. Readers of the live tree consult it
//! first (`Region::get_with` and the other point reads); everything that needs the live
//! tree to hold every acknowledged write applies it first: a commit's seal, a snapshot, a
//! live range, garbage collection of a segment, and a delete or batch touching a deferred
//! key (`Region::write`).
//!
//! Owns: the map and the batch application. Does not own: which puts are deferred (the
//! policy, `Options::deferred_updates`, is read in `Region::write`), the index, the log.
//!
//! Thread-safety: the map is under its own mutex, taken by readers only while it is not
//! empty (an atomic count says so). Entries are added and applied only under the region's
//! writer lock; an entry is removed only after the index holds its put, so a reader that
//! misses it here finds the put in the index.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use parking_lot::{Mutex, MutexGuard};

use super::{Candidate, Region};
use crate::error::Result;
use crate::log::writer::Writer;
use crate::options::DeferredUpdates;
use crate::prefetch::ResidencyGate;
use crate::types::DiskOffset;

/// Deferred puts after which the writer that adds one applies the batch.
pub(crate) const DEFERRED_BATCH: usize = 256;

/// Deferred puts beyond which writes are applied at once (the batch being applied by
/// another writer has fallen behind).
const DEFERRED_MAX: usize = 4 * DEFERRED_BATCH;

/// The deferred puts of one region: full key → log pointer of its newest deferred put.
#[derive(Default)]
pub(super) struct Deferred {
    map: Mutex<HashMap<Box<[u8]>, u64>>,
    /// Entries in `map`, readable without its lock (Release after each change).
    len: AtomicUsize,
    /// A writer is applying a batch outside the writer lock (`Region::apply_deferred`).
    applying: AtomicBool,
}

impl Deferred {
    pub(super) fn is_empty(&self) -> bool {
        self.len.load(Ordering::Acquire) == 0
    }

    pub(super) fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    /// The log pointer of `key`'s deferred put, if it has one.
    pub(super) fn get(&self, key: &[u8]) -> Option<u64> {
        if self.is_empty() {
            return None;
        }
        self.map.lock().get(key).copied()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Box<[u8]>, u64>> {
        self.map.lock()
    }

    fn set_len(&self, map: &HashMap<Box<[u8]>, u64>) {
        self.len.store(map.len(), Ordering::Release);
    }

    /// Every entry, for a batch to apply.
    fn entries(&self) -> Vec<(Box<[u8]>, u64)> {
        self.lock().iter().map(|(k, p)| (k.clone(), *p)).collect()
    }
}

impl Region {
    /// Whether a lone put of `key` should be deferred now (writer lock held).
    pub(super) fn defer_put_now(&self) -> bool {
        match self.shared.options.deferred_updates {
            DeferredUpdates::Off => false,
            DeferredUpdates::Always => self.deferred.len() < DEFERRED_MAX,
            DeferredUpdates::WhenCold => {
                self.shared.read_mode.copying() && self.deferred.len() < DEFERRED_MAX
            }
        }
    }

    /// Defers the put of `key` logged at `ptr`, if the index holds a candidate entry for
    /// the key (a prefix and hash match): then the put is an update, whose replaced
    /// record is read later. Returns false, deferring nothing, for a key the index does
    /// not hold (its insert reads no record) or cannot tell without reading. A deferred
    /// put it replaces is counted dead here (it was never in the index).
    pub(super) fn try_defer(&self, w: &mut Writer, key: &[u8], ptr: DiskOffset) -> Result<bool> {
        // Entries are added under the writer lock only (held here), so the answer cannot
        // change before the insert below; readers never wait on a descent.
        if self.deferred.get(key).is_none() {
            let Candidate::Maybe(replaced) = self.tree_candidate(key)? else {
                return Ok(false);
            };
            // A replaced record in memory costs the exact path nothing but a cache miss
            // (YCSB F's update of the record it has just read): deferring it would only
            // add the map's work.
            if self.shared.options.deferred_updates == DeferredUpdates::WhenCold
                && self.in_memory(replaced)
            {
                return Ok(false);
            }
        }
        let previous = {
            let mut map = self.deferred.lock();
            let previous = map.insert(key.into(), ptr.0);
            self.deferred.set_len(&map);
            previous
        };
        if let Some(previous) = previous {
            // Just written: in a tail buffer or the page cache.
            let len = self.record_header(previous)?.total_bytes();
            self.log.account_dead(w, DiskOffset(previous), len);
        }
        self.shared.deferred_puts.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    /// Whether the record at `ptr` is in memory: in a tail buffer, or its first page in
    /// the page cache (`Storage::resident`, one `mincore`).
    fn in_memory(&self, ptr: u64) -> bool {
        let guard = crossbeam_epoch::pin();
        self.log.buffered_tail(ptr, &guard).is_some()
            || self.shared.volume.storage().resident(ptr) == Some(true)
    }

    /// Applies the deferred put of `key`, if there is one, before another write of the
    /// key is applied (writer lock held): a delete or a batch must find the index exact.
    pub(super) fn apply_deferred_of(&self, w: &mut Writer, key: &[u8]) -> Result<()> {
        if let Some(ptr) = self.deferred.get(key) {
            self.apply_deferred_entries(w, &[(key.into(), ptr)])?;
        }
        Ok(())
    }

    /// Applies every deferred put (writer lock held): what a seal needs.
    pub(super) fn apply_all_deferred(&self, w: &mut Writer) -> Result<()> {
        if self.deferred.is_empty() {
            return Ok(());
        }
        let entries = self.deferred.entries();
        self.apply_deferred_entries(w, &entries)
    }

    /// Applies `entries` that are still the newest deferred put of their key: into the
    /// index first, then out of the map (a reader that misses the entry finds the index
    /// holding it).
    fn apply_deferred_entries(&self, w: &mut Writer, entries: &[(Box<[u8]>, u64)]) -> Result<()> {
        for (key, ptr) in entries {
            if self.deferred.get(key) != Some(*ptr) {
                continue;
            }
            self.apply(w, key, true, DiskOffset(*ptr), None)
                .inspect_err(|_| self.shared.poison())?;
            let mut map = self.deferred.lock();
            map.remove(key);
            self.deferred.set_len(&map);
        }
        Ok(())
    }

    /// Applies the deferred puts (not under the writer lock): the records they replace
    /// are asked from the device together and read before the lock is taken, so the
    /// lock is held for index work only. One applier at a time; `wait` makes a caller
    /// that finds another applying wait for the lock and apply what is left (what a
    /// reader that needs the index exact does), otherwise it returns at once.
    pub(crate) fn apply_deferred(&self, wait: bool) -> Result<()> {
        if self.deferred.is_empty() {
            return Ok(());
        }
        if self
            .deferred
            .applying
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            if wait {
                let mut w = self.writer.lock();
                return self.apply_all_deferred(&mut w);
            }
            return Ok(());
        }
        let result = self.warm_and_apply();
        self.deferred.applying.store(false, Ordering::Release);
        result
    }

    fn warm_and_apply(&self) -> Result<()> {
        let entries = self.deferred.entries();
        {
            // The pointers stay valid under the guard, as in `lock_warm`.
            let _guard = crossbeam_epoch::pin();
            let mut replaced = Vec::with_capacity(entries.len());
            for (key, _) in &entries {
                if let Ok(Candidate::Maybe(old)) = self.tree_candidate(key) {
                    replaced.push(old);
                }
            }
            let mut ask = replaced.clone();
            self.prefetch_records(&mut ask, &mut ResidencyGate::default(), 1);
            for old in replaced {
                // A wasted read at worst (another key's record, a collision).
                let _ = self.record_header(old);
            }
        }
        let mut w = self.writer.lock();
        self.check_usable()?;
        self.apply_deferred_entries(&mut w, &entries)
    }
}
