//! Keyspaces (regions): the user-facing handles for reads, writes, batches and
//! snapshots; ranges are in `crate::range`.
//!
//! `multi_get` reads records out of key order from the log; it asks the volume for a
//! window of the records it will read next before reading them
//! (`Options::scan_prefetch_entries`, `Region::prefetch_records`), so a cold batch keeps
//! many reads in flight. Handles are `Send + Sync`.

use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::prefetch::{ResidencyGate, MULTI_GET_WINDOW_ENTRIES};
use crate::range::{Range, SnapshotPin};
use crate::region::{Candidate, Op, Region};
use crate::types::{MAX_KEY_BYTES, MAX_VALUE_BYTES};

/// How durable a write is when the call returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Durability {
    /// In the log buffer: visible at once, durable at the next flush (background, every
    /// `flush_interval`), `sync`, sync write or commit. A crash loses at most a suffix of
    /// each keyspace's buffered writes.
    #[default]
    Buffered,
    /// Durable when the call returns. Concurrent sync writers share one flush.
    Sync,
}

/// A named keyspace of a database. Cheap to clone; `Send + Sync`.
#[derive(Clone)]
pub struct Keyspace {
    engine: Arc<Engine>,
    region: Arc<Region>,
}

fn check_key(key: &[u8]) -> Result<()> {
    if key.len() > MAX_KEY_BYTES {
        return Err(Error::KeyTooLarge {
            len: key.len(),
            max: MAX_KEY_BYTES,
        });
    }
    Ok(())
}

fn check_value(value: &[u8]) -> Result<()> {
    if value.len() > MAX_VALUE_BYTES {
        return Err(Error::ValueTooLarge {
            len: value.len(),
            max: MAX_VALUE_BYTES,
        });
    }
    Ok(())
}

impl Keyspace {
    pub(crate) fn new(engine: Arc<Engine>, region: Arc<Region>) -> Keyspace {
        Keyspace { engine, region }
    }

    pub(crate) fn region(&self) -> &Region {
        &self.region
    }

    pub fn name(&self) -> &str {
        self.region.name()
    }

    /// Writes atomically; returns how many ops replaced or removed an existing key.
    fn write(&self, ops: &[Op<'_>], durability: Durability) -> Result<usize> {
        let (ticket, existed) = self.region.write(ops)?;
        if durability == Durability::Sync {
            self.engine.sync_to(ticket)?;
        }
        Ok(existed)
    }

    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.put_with(key, value, Durability::Buffered)
    }

    pub fn put_with(&self, key: &[u8], value: &[u8], durability: Durability) -> Result<()> {
        check_key(key)?;
        check_value(value)?;
        self.write(
            &[Op {
                key,
                value: Some(value),
            }],
            durability,
        )?;
        Ok(())
    }

    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.get_with(key, |v| v.to_vec())
    }

    /// Calls `f` with the value in place (no copy) and returns what it returns.
    pub fn get_with<R>(&self, key: &[u8], f: impl FnOnce(&[u8]) -> R) -> Result<Option<R>> {
        check_key(key)?;
        self.region.get_with(None, key, f)
    }

    /// Calls `f(i, value)` for each of `keys` in order, the value in place (no copy):
    /// `get_with` for a group of keys, faster than one call each when the data is in
    /// memory (their cache misses overlap; `Region::get_many_with`). An error is the
    /// key's own (a key too long, corruption where its record lies); the other keys are
    /// still answered. For records on the device, `multi_get` reads them in parallel.
    pub fn get_many_with(&self, keys: &[&[u8]], mut f: impl FnMut(usize, Result<Option<&[u8]>>)) {
        if keys.iter().all(|key| check_key(key).is_ok()) {
            return self.region.get_many_with(None, keys, f);
        }
        // Rare (a key too long): key by key, the bad ones answered with their error.
        for (i, key) in keys.iter().enumerate() {
            let found = check_key(key)
                .and_then(|()| self.region.get_with(None, key, |v| f(i, Ok(Some(v)))));
            match found {
                Ok(Some(())) => {}
                Ok(None) => f(i, Ok(None)),
                Err(e) => f(i, Err(e)),
            }
        }
    }

    pub fn contains(&self, key: &[u8]) -> Result<bool> {
        Ok(self.get_with(key, |_| ())?.is_some())
    }

    /// The values of `keys`, in their order (`None` for a missing key; a key may repeat).
    /// Looks every key up in the index first, then asks the volume for all their records
    /// at once and reads them, so records not in memory are read in parallel. Each value
    /// is read as by `get` at some instant during the call (use a snapshot's `multi_get`
    /// for one point in time).
    pub fn multi_get<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<Vec<Option<Vec<u8>>>> {
        // Registered like a live range: the pointers looked up stay readable until read.
        let pin = SnapshotPin {
            region: self.region.clone(),
            root: 0,
            ticket: self.region.register_live_reader(),
        };
        multi_get(&pin.region, None, keys)
    }

    /// Starts reading the records of `keys` from the device and returns without waiting
    /// for them: for a caller about to read these keys one at a time (a server running a
    /// pipeline of commands, each reading its key), so that their reads are in flight
    /// together rather than one after the other. A hint: absent keys and keys too long
    /// are passed over. While the keyspace's data has lately been found in memory, most
    /// calls return without taking a key from `keys` (an iterator, so that finding the
    /// keys costs nothing then either). Keys may be borrowed or made as they are taken.
    pub fn prefetch<K: AsRef<[u8]>>(&self, keys: impl IntoIterator<Item = K>) {
        self.region.prefetch_keys(
            None,
            keys.into_iter()
                .filter(|key| check_key(key.as_ref()).is_ok()),
        );
    }

    /// `prefetch` of keys the caller found through records it reads first (a
    /// collection's members, named under its metadata's version). The engine tells
    /// whether asking pays for these apart from `prefetch`'s keys: a hot metadata record,
    /// named by every command of a pipeline, says nothing of its members.
    pub fn prefetch_dependent<K: AsRef<[u8]>>(&self, keys: impl IntoIterator<Item = K>) {
        self.region.prefetch_dependent_keys(
            keys.into_iter()
                .filter(|key| check_key(key.as_ref()).is_ok()),
        );
    }

    /// Removes `key`; returns whether it was present.
    pub fn delete(&self, key: &[u8]) -> Result<bool> {
        self.delete_with(key, Durability::Buffered)
    }

    pub fn delete_with(&self, key: &[u8], durability: Durability) -> Result<bool> {
        check_key(key)?;
        Ok(self.write(&[Op { key, value: None }], durability)? == 1)
    }

    /// Live keys in the keyspace. Applies deferred puts first (`Options::deferred_updates`):
    /// one the index has not taken yet may be of a new key.
    pub fn len(&self) -> u64 {
        // A failure poisons the volume (as a failed write does); the count is then the
        // index's.
        let _ = self.region.apply_deferred(true);
        self.region.keys()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Iterates over a key range, in order; `.rev()` iterates backwards. Each leaf is
    /// read consistently; a write made during the iteration may or may not be seen (use a
    /// snapshot for a point-in-time view).
    pub fn range<K: AsRef<[u8]>, R: RangeBounds<K>>(&self, range: R) -> Range {
        Range::new(self.region.clone(), None, owned_bounds(&range))
    }

    /// Iterates over the keys that start with `prefix`.
    pub fn prefix(&self, prefix: &[u8]) -> Range {
        Range::new(self.region.clone(), None, prefix_bounds(prefix))
    }

    /// Puts every `(key, value)` pair as one atomic batch, exactly as a [`Batch`] of these
    /// puts would (all or nothing, also across a crash; a later pair of the same key wins;
    /// a size error changes nothing), but from the caller's slices, without copying each
    /// key and value into a batch first: for callers that hold them in a buffer already
    /// (the server's pipelined SETs).
    pub fn put_all(&self, pairs: &[(&[u8], &[u8])], durability: Durability) -> Result<()> {
        self.write_checked(pairs.iter().map(|&(k, v)| (k, Some(v))), durability)
    }

    /// Applies puts (`Some(value)`) and deletes (`None`) atomically, as a [`Batch`] of
    /// them would (all or nothing, also across a crash; a later op on the same key wins; a
    /// size error changes nothing), from the caller's buffers: nothing is copied before
    /// the log append. For callers that own their writes already (the server's commands).
    pub fn write_all<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        &self,
        ops: &[(K, Option<V>)],
        durability: Durability,
    ) -> Result<()> {
        self.write_checked(
            ops.iter()
                .map(|(k, v)| (k.as_ref(), v.as_ref().map(AsRef::as_ref))),
            durability,
        )
    }

    /// `write` of `ops` once every key and value has passed the size checks.
    fn write_checked<'a>(
        &self,
        ops: impl ExactSizeIterator<Item = (&'a [u8], Option<&'a [u8]>)>,
        durability: Durability,
    ) -> Result<()> {
        if ops.len() == 0 {
            return Ok(());
        }
        let mut checked = Vec::with_capacity(ops.len());
        for (key, value) in ops {
            check_key(key)?;
            if let Some(value) = value {
                check_value(value)?;
            }
            checked.push(Op { key, value });
        }
        self.write(&checked, durability)?;
        Ok(())
    }

    /// An atomic batch of writes to this keyspace: all or nothing, also across a crash.
    pub fn batch(&self) -> Batch {
        Batch {
            keyspace: self.clone(),
            ops: Vec::new(),
        }
    }

    /// A consistent point-in-time view holding every write acknowledged before the call;
    /// never blocks writers.
    ///
    /// Errors: only when updates this keyspace deferred (`Options::deferred_updates`)
    /// cannot be brought into the index first, because the device failed a read or write
    /// (the volume is poisoned then, as after any failed write).
    pub fn snapshot(&self) -> Result<Snapshot> {
        let (root, ticket) = self.region.open_snapshot()?;
        Ok(Snapshot {
            pin: Arc::new(SnapshotPin {
                region: self.region.clone(),
                root,
                ticket,
            }),
        })
    }
}

/// `multi_get` under `root` (live: `None`); the caller keeps the pointers it looks up
/// valid (a snapshot, or a live reader registration).
fn multi_get<K: AsRef<[u8]>>(
    region: &Region,
    root: Option<u64>,
    keys: &[K],
) -> Result<Vec<Option<Vec<u8>>>> {
    for key in keys {
        check_key(key.as_ref())?;
    }
    // Index only: candidates whose records are confirmed when read, after the prefetch.
    let ptrs = keys
        .iter()
        .map(|key| region.lookup_candidate(root, key.as_ref()))
        .collect::<Result<Vec<_>>>()?;
    let prefetch = region.shared().options.scan_prefetch_entries > 0;
    let mut batch = Vec::new();
    let mut gate = ResidencyGate::with_streak(region.prefetch_streak());
    let mut values = Vec::with_capacity(keys.len());
    // Windows bound how much is asked for before it is read, so the first pages are not
    // evicted by the last ones of a huge call; typical calls fit in one window.
    let window = MULTI_GET_WINDOW_ENTRIES.max(region.shared().options.scan_prefetch_entries);
    for (keys, ptrs) in keys.chunks(window).zip(ptrs.chunks(window)) {
        if prefetch {
            batch.clear();
            batch.extend(ptrs.iter().filter_map(|c| match c {
                Candidate::Maybe(ptr) => Some(*ptr),
                _ => None,
            }));
            // About one probe per six records: a batch of ~100 cached keys is found
            // cached within the call (`HOT_STREAK_PROBES`).
            let probes = (batch.len() / 6).max(2);
            region.prefetch_records(&mut batch, &mut gate, probes);
        }
        for (key, candidate) in keys.iter().zip(ptrs) {
            let key = key.as_ref();
            let exact = |region: &Region| match region.lookup(root, key)? {
                Some(ptr) => region.value_at(ptr, key, |v| v.to_vec()).map(Some),
                None => Ok(None),
            };
            values.push(match *candidate {
                Candidate::Absent => None,
                // The record of another key only on a key prefix and hash collision.
                Candidate::Maybe(ptr) => match region.value_at_if_key(ptr, key, |v| v.to_vec())? {
                    Some(value) => Some(value),
                    None => exact(region)?,
                },
                Candidate::Unsure => exact(region)?,
            });
        }
    }
    Ok(values)
}

fn owned_bounds<K: AsRef<[u8]>, R: RangeBounds<K>>(range: &R) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    let own = |b: Bound<&K>| match b {
        Bound::Included(k) => Bound::Included(k.as_ref().to_vec()),
        Bound::Excluded(k) => Bound::Excluded(k.as_ref().to_vec()),
        Bound::Unbounded => Bound::Unbounded,
    };
    (own(range.start_bound()), own(range.end_bound()))
}

/// `[prefix, next(prefix))`, where next increments the last byte that is not 0xff.
fn prefix_bounds(prefix: &[u8]) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return (Bound::Included(prefix.to_vec()), Bound::Excluded(end));
        }
    }
    (Bound::Included(prefix.to_vec()), Bound::Unbounded)
}

/// A batch of writes applied atomically by `commit`: puts (`Some(value)`) and deletes.
pub struct Batch {
    keyspace: Keyspace,
    ops: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

impl Batch {
    /// Adds a put. Size limits are checked by `commit`.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> &mut Batch {
        self.ops.push((key.to_vec(), Some(value.to_vec())));
        self
    }

    pub fn delete(&mut self, key: &[u8]) -> &mut Batch {
        self.ops.push((key.to_vec(), None));
        self
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    pub fn commit(self) -> Result<()> {
        self.commit_with(Durability::Buffered)
    }

    /// Applies every write or none (a size error changes nothing).
    pub fn commit_with(self, durability: Durability) -> Result<()> {
        self.keyspace.write_all(&self.ops, durability)
    }
}

/// A consistent, read-only view of a keyspace at one instant. Cheap to clone; ranges
/// made from it keep it alive.
#[derive(Clone)]
pub struct Snapshot {
    pin: Arc<SnapshotPin>,
}

impl Snapshot {
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        check_key(key)?;
        self.pin
            .region
            .get_with(Some(self.pin.root), key, |v| v.to_vec())
    }

    pub fn contains(&self, key: &[u8]) -> Result<bool> {
        Ok(self.get(key)?.is_some())
    }

    /// As `Keyspace::multi_get`, all values as of this snapshot.
    pub fn multi_get<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<Vec<Option<Vec<u8>>>> {
        multi_get(&self.pin.region, Some(self.pin.root), keys)
    }

    pub fn range<K: AsRef<[u8]>, R: RangeBounds<K>>(&self, range: R) -> Range {
        let mut r = Range::new(
            self.pin.region.clone(),
            Some(self.pin.root),
            owned_bounds(&range),
        );
        r.pin = Some(self.pin.clone());
        r
    }

    pub fn prefix(&self, prefix: &[u8]) -> Range {
        let mut r = Range::new(
            self.pin.region.clone(),
            Some(self.pin.root),
            prefix_bounds(prefix),
        );
        r.pin = Some(self.pin.clone());
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefetching_a_key_rewritten_by_every_request_makes_its_gate_hot() {
        // A pipeline of LPUSHes asks, before each window of requests, for the list's
        // metadata record, which every push rewrote: it is always in the tail buffer. The
        // first version dropped such records before probing, so the region's streak
        // stayed cold and every window looked the key up 16 times for nothing (LPUSH -P
        // 16 cost 5 % more server CPU). Records in a tail buffer now count as resident
        // probes, and after a few windows calls pass without looking a key up.
        let db = crate::Database::builder()
            .commit_interval(None)
            .flush_interval(None)
            .gc(false)
            .open_in_memory()
            .unwrap();
        let ks = db.keyspace("ks").unwrap();
        let window = [b"mylist".as_slice(); 16];
        for _ in 0..20 {
            ks.put(b"mylist", b"metadata").unwrap();
            ks.prefetch(window.iter().copied());
        }
        assert!(
            ks.region().key_prefetch_streak() >= crate::prefetch::HOT_STREAK_PROBES,
            "streak {}",
            ks.region().key_prefetch_streak()
        );
        // Ranges start from their own streak, which these calls did not touch.
        assert_eq!(ks.region().prefetch_streak(), 0);
        // So do dependent keys (a collection's members): the hot metadata gave them
        // nothing, and their own calls warm only their own streak.
        assert_eq!(ks.region().dependent_prefetch_streak(), 0);
        let before = ks.region().key_prefetch_streak();
        for _ in 0..20 {
            ks.put(b"mylist", b"metadata").unwrap();
            ks.prefetch_dependent(window.iter().copied());
        }
        assert!(
            ks.region().dependent_prefetch_streak() >= crate::prefetch::HOT_STREAK_PROBES,
            "streak {}",
            ks.region().dependent_prefetch_streak()
        );
        assert_eq!(ks.region().key_prefetch_streak(), before);
    }

    #[test]
    fn prefix_bounds_increment_the_last_non_ff_byte() {
        assert_eq!(
            prefix_bounds(b"ab"),
            (
                Bound::Included(b"ab".to_vec()),
                Bound::Excluded(b"ac".to_vec())
            )
        );
        assert_eq!(
            prefix_bounds(b"a\xff"),
            (
                Bound::Included(b"a\xff".to_vec()),
                Bound::Excluded(b"b".to_vec())
            )
        );
        assert_eq!(
            prefix_bounds(b"\xff\xff"),
            (Bound::Included(b"\xff\xff".to_vec()), Bound::Unbounded)
        );
        assert_eq!(
            prefix_bounds(b""),
            (Bound::Included(vec![]), Bound::Unbounded)
        );
    }
}
