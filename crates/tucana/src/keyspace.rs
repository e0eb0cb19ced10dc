//! Keyspaces (regions): the user-facing handles for reads, writes, batches, snapshots
//! and ranges.

use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use crate::db::DbInner;
use crate::error::{Error, Result};
use crate::index::{LeafCopy, Seek};
use crate::region::{Op, Region};
use crate::types::{DiskOffset, TreeEpoch, MAX_KEY_BYTES, MAX_VALUE_BYTES};

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
    db: Arc<DbInner>,
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
    pub(crate) fn new(db: Arc<DbInner>, region: Arc<Region>) -> Keyspace {
        Keyspace { db, region }
    }

    pub fn name(&self) -> &str {
        &self.region.name
    }

    /// Writes atomically; returns how many ops replaced or removed an existing key.
    fn write(&self, ops: &[Op<'_>], durability: Durability) -> Result<usize> {
        let (ticket, existed) = self.region.write(ops)?;
        if durability == Durability::Sync {
            self.db.sync_to(ticket)?;
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

    pub fn contains(&self, key: &[u8]) -> Result<bool> {
        Ok(self.get_with(key, |_| ())?.is_some())
    }

    /// Removes `key`; returns whether it was present.
    pub fn delete(&self, key: &[u8]) -> Result<bool> {
        self.delete_with(key, Durability::Buffered)
    }

    pub fn delete_with(&self, key: &[u8], durability: Durability) -> Result<bool> {
        check_key(key)?;
        Ok(self.write(&[Op { key, value: None }], durability)? == 1)
    }

    /// Live keys in the keyspace.
    pub fn len(&self) -> u64 {
        self.region.keys.load(std::sync::atomic::Ordering::Relaxed)
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

    /// An atomic batch of writes to this keyspace: all or nothing, also across a crash.
    pub fn batch(&self) -> Batch {
        Batch {
            keyspace: self.clone(),
            ops: Vec::new(),
        }
    }

    /// A consistent point-in-time view; never blocks writers.
    pub fn snapshot(&self) -> Snapshot {
        let (root, epoch) = self.region.open_snapshot();
        Snapshot {
            pin: Arc::new(SnapshotPin {
                region: self.region.clone(),
                root,
                epoch,
            }),
        }
    }
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

enum BatchOp {
    Put(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
}

/// A batch of writes applied atomically by `commit`.
pub struct Batch {
    keyspace: Keyspace,
    ops: Vec<BatchOp>,
}

impl Batch {
    /// Adds a put. Size limits are checked by `commit`.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> &mut Batch {
        self.ops.push(BatchOp::Put(key.to_vec(), value.to_vec()));
        self
    }

    pub fn delete(&mut self, key: &[u8]) -> &mut Batch {
        self.ops.push(BatchOp::Delete(key.to_vec()));
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
        if self.ops.is_empty() {
            return Ok(());
        }
        let mut ops = Vec::with_capacity(self.ops.len());
        for op in &self.ops {
            match op {
                BatchOp::Put(k, v) => {
                    check_key(k)?;
                    check_value(v)?;
                    ops.push(Op {
                        key: k,
                        value: Some(v),
                    });
                }
                BatchOp::Delete(k) => {
                    check_key(k)?;
                    ops.push(Op {
                        key: k,
                        value: None,
                    });
                }
            }
        }
        self.keyspace.write(&ops, durability)?;
        Ok(())
    }
}

/// Registration of a reader that holds log pointers between calls: a snapshot (`root` is
/// its sealed root) or a live-tree range (`root` unused). While it lives, log segments and
/// nodes retired in `epoch` or later are not freed.
struct SnapshotPin {
    region: Arc<Region>,
    root: u64,
    epoch: TreeEpoch,
}

impl Drop for SnapshotPin {
    fn drop(&mut self) {
        self.region.close_snapshot(self.epoch);
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

/// One side of a range iterator: a copied leaf and the position in it.
#[derive(Default)]
struct Side {
    leaf: LeafCopy,
    /// Next index to look at (front: counts up; back: counts down, exclusive).
    pos: usize,
    started: bool,
    exhausted: bool,
}

/// An iterator over `(key, value)` pairs of a range, both directions.
///
/// A range over the live keyspace keeps the log segments garbage collection empties after
/// its creation from being freed until it is dropped (like a snapshot does): drop
/// iterators you are done with.
pub struct Range {
    region: Arc<Region>,
    root: Option<u64>,
    /// Keeps what the iterator's log pointers name alive (see `SnapshotPin`).
    pin: Option<Arc<SnapshotPin>>,
    /// Remaining bounds: shrink as items are returned from either end.
    lo: Bound<Vec<u8>>,
    hi: Bound<Vec<u8>>,
    front: Side,
    back: Side,
    done: bool,
}

/// What a range reports when the fences its path gave a leaf are impossible: the leaf it
/// moved to does not lie beyond the one before, or holds a key outside them. Only a
/// damaged index (pivots out of order) does that; going on would loop or skip keys.
fn fences_broken() -> Error {
    Error::corruption(
        "index",
        DiskOffset::NONE,
        "leaf fences out of order (damaged pivots)",
    )
}

fn above_lo(key: &[u8], lo: &Bound<Vec<u8>>) -> bool {
    match lo {
        Bound::Included(l) => key >= l.as_slice(),
        Bound::Excluded(l) => key > l.as_slice(),
        Bound::Unbounded => true,
    }
}

fn below_hi(key: &[u8], hi: &Bound<Vec<u8>>) -> bool {
    match hi {
        Bound::Included(h) => key <= h.as_slice(),
        Bound::Excluded(h) => key < h.as_slice(),
        Bound::Unbounded => true,
    }
}

impl Range {
    fn new(
        region: Arc<Region>,
        root: Option<u64>,
        (lo, hi): (Bound<Vec<u8>>, Bound<Vec<u8>>),
    ) -> Range {
        let empty = match (&lo, &hi) {
            (Bound::Included(l), Bound::Included(h)) => l > h,
            (Bound::Included(l), Bound::Excluded(h))
            | (Bound::Excluded(l), Bound::Included(h))
            | (Bound::Excluded(l), Bound::Excluded(h)) => l >= h,
            _ => false,
        };
        // A live range copies log pointers out of leaves and reads the records later,
        // without an epoch guard in between: register it like a snapshot.
        let pin = root.is_none().then(|| {
            let epoch = region.register_live_reader();
            Arc::new(SnapshotPin {
                region: region.clone(),
                root: 0,
                epoch,
            })
        });
        Range {
            region,
            root,
            pin,
            lo,
            hi,
            front: Side::default(),
            back: Side::default(),
            done: empty,
        }
    }

    /// Reads the record at `ptr` as an owned pair.
    fn item(&self, ptr: u64) -> Result<(Vec<u8>, Vec<u8>)> {
        self.region
            .with_record(ptr, true, |r| (r.key.to_vec(), r.value.to_vec()))
    }

    /// Index of the first entry of the front leaf that is not below `lo`.
    fn first_not_below_lo(&self) -> Result<usize> {
        match &self.lo {
            Bound::Unbounded => Ok(0),
            Bound::Included(k) => self.partition(&self.front.leaf, k, |key, k| key < k),
            Bound::Excluded(k) => self.partition(&self.front.leaf, k, |key, k| key <= k),
        }
    }

    /// One past the last entry of the back leaf that is not above `hi`.
    fn end_not_above_hi(&self) -> Result<usize> {
        match &self.hi {
            Bound::Unbounded => Ok(self.back.leaf.ptrs.len()),
            Bound::Included(k) => self.partition(&self.back.leaf, k, |key, k| key <= k),
            Bound::Excluded(k) => self.partition(&self.back.leaf, k, |key, k| key < k),
        }
    }

    /// The first entry of `leaf` whose key fails `before(key, bound)`, for a predicate
    /// true on a prefix of the (sorted) entries and settled by the prefix wherever the
    /// entry's prefix differs from the bound's: a binary search on prefixes, then on keys
    /// (read from the log) only among prefixes equal to the bound's.
    fn partition(
        &self,
        leaf: &LeafCopy,
        bound: &[u8],
        before: impl Fn(&[u8], &[u8]) -> bool,
    ) -> Result<usize> {
        let std::ops::Range {
            start: mut lo,
            end: mut hi,
        } = leaf.tie_span(bound);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self
                .region
                .with_record(leaf.ptrs[mid], false, |r| before(r.key, bound))?
            {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        Ok(lo)
    }

    fn next_front(&mut self) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        loop {
            if self.front.started && self.front.pos < self.front.leaf.ptrs.len() {
                let ptr = self.front.leaf.ptrs[self.front.pos];
                self.front.pos += 1;
                let (key, value) = self.item(ptr)?;
                if !self.front.leaf.holds(&key) {
                    return Err(fences_broken());
                }
                if !above_lo(&key, &self.lo) {
                    continue;
                }
                if !below_hi(&key, &self.hi) {
                    return Ok(None);
                }
                self.lo = Bound::Excluded(key.clone());
                return Ok(Some((key, value)));
            }
            if self.front.exhausted {
                return Ok(None);
            }
            // Load the next leaf: the one holding the lower bound, then by fences.
            let seek_key = if self.front.started {
                // Keys of the next leaf are >= this leaf's upper fence.
                match self.front.leaf.high.take() {
                    Some(high) if below_hi(&high, &self.hi) => Some(high),
                    _ => {
                        self.front.exhausted = true;
                        return Ok(None);
                    }
                }
            } else {
                match &self.lo {
                    Bound::Included(k) | Bound::Excluded(k) => Some(k.clone()),
                    Bound::Unbounded => None,
                }
            };
            let seek = match &seek_key {
                Some(k) => Seek::AtOrAfter(k),
                None => Seek::First,
            };
            self.region
                .copy_leaf(self.root, seek, &mut self.front.leaf)?;
            // The leaf holding `k` ends after `k`: a damaged index whose fences do not
            // advance would otherwise send this loop round the same leaves for ever.
            if let (Some(k), Some(high)) = (&seek_key, &self.front.leaf.high) {
                if high <= k {
                    return Err(fences_broken());
                }
            }
            self.front.started = true;
            self.front.pos = self.first_not_below_lo()?;
        }
    }

    fn next_back_inner(&mut self) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        loop {
            if self.back.started && self.back.pos > 0 {
                self.back.pos -= 1;
                let ptr = self.back.leaf.ptrs[self.back.pos];
                let (key, value) = self.item(ptr)?;
                if !self.back.leaf.holds(&key) {
                    return Err(fences_broken());
                }
                if !below_hi(&key, &self.hi) {
                    continue;
                }
                if !above_lo(&key, &self.lo) {
                    return Ok(None);
                }
                self.hi = Bound::Excluded(key.clone());
                return Ok(Some((key, value)));
            }
            if self.back.exhausted {
                return Ok(None);
            }
            let seek_key = if self.back.started {
                // Keys of the previous leaf are < this leaf's lower fence.
                match self.back.leaf.low.take() {
                    Some(low) if above_lo(&low, &self.lo) => Some((low, false)),
                    _ => {
                        self.back.exhausted = true;
                        return Ok(None);
                    }
                }
            } else {
                match &self.hi {
                    Bound::Included(k) => Some((k.clone(), true)),
                    Bound::Excluded(k) => Some((k.clone(), false)),
                    Bound::Unbounded => None,
                }
            };
            let seek = match &seek_key {
                Some((k, true)) => Seek::AtOrAfter(k),
                Some((k, false)) => Seek::Before(k),
                None => Seek::Last,
            };
            self.region
                .copy_leaf(self.root, seek, &mut self.back.leaf)?;
            // The leaf holding `k` starts at or before it, the leaf before `k` before it
            // (see `next_front`).
            if let (Some((k, at_or_after)), Some(low)) = (&seek_key, &self.back.leaf.low) {
                if low > k || (!at_or_after && low == k) {
                    return Err(fences_broken());
                }
            }
            self.back.started = true;
            self.back.pos = self.end_not_above_hi()?;
        }
    }
}

impl Iterator for Range {
    type Item = Result<(Vec<u8>, Vec<u8>)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.next_front() {
            Ok(Some(item)) => Some(Ok(item)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

impl DoubleEndedIterator for Range {
    fn next_back(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.next_back_inner() {
            Ok(Some(item)) => Some(Ok(item)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
