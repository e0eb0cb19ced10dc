//! Keyspaces (regions): the user-facing handles for reads, writes, batches, snapshots
//! and ranges.

use std::ops::RangeBounds;

use crate::error::Result;

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
pub struct Keyspace {}

impl Keyspace {
    pub fn name(&self) -> &str {
        todo!()
    }

    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.put_with(key, value, Durability::Buffered)
    }

    pub fn put_with(&self, key: &[u8], value: &[u8], durability: Durability) -> Result<()> {
        let _ = (key, value, durability);
        todo!()
    }

    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let _ = key;
        todo!()
    }

    /// Calls `f` with the value in place (no copy) and returns what it returns.
    pub fn get_with<R>(&self, key: &[u8], f: impl FnOnce(&[u8]) -> R) -> Result<Option<R>> {
        let _ = (key, f);
        todo!()
    }

    pub fn contains(&self, key: &[u8]) -> Result<bool> {
        let _ = key;
        todo!()
    }

    /// Removes `key`; returns whether it was present.
    pub fn delete(&self, key: &[u8]) -> Result<bool> {
        self.delete_with(key, Durability::Buffered)
    }

    pub fn delete_with(&self, key: &[u8], durability: Durability) -> Result<bool> {
        let _ = (key, durability);
        todo!()
    }

    /// Live keys in the keyspace.
    pub fn len(&self) -> u64 {
        todo!()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Iterates over a key range, in order; `.rev()` iterates backwards.
    pub fn range<K: AsRef<[u8]>, R: RangeBounds<K>>(&self, range: R) -> Range {
        let _ = range;
        todo!()
    }

    /// Iterates over the keys that start with `prefix`.
    pub fn prefix(&self, prefix: &[u8]) -> Range {
        let _ = prefix;
        todo!()
    }

    /// An atomic batch of writes to this keyspace: all or nothing, also across a crash.
    pub fn batch(&self) -> Batch {
        todo!()
    }

    /// A consistent point-in-time view; never blocks writers.
    pub fn snapshot(&self) -> Snapshot {
        todo!()
    }
}

/// A batch of writes applied atomically by `commit`.
pub struct Batch {}

impl Batch {
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> &mut Batch {
        let _ = (key, value);
        todo!()
    }

    pub fn delete(&mut self, key: &[u8]) -> &mut Batch {
        let _ = key;
        todo!()
    }

    pub fn len(&self) -> usize {
        todo!()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn commit(self) -> Result<()> {
        self.commit_with(Durability::Buffered)
    }

    pub fn commit_with(self, durability: Durability) -> Result<()> {
        let _ = durability;
        todo!()
    }
}

/// A consistent, read-only view of a keyspace at one instant.
pub struct Snapshot {}

impl Snapshot {
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let _ = key;
        todo!()
    }

    pub fn contains(&self, key: &[u8]) -> Result<bool> {
        Ok(self.get(key)?.is_some())
    }

    pub fn range<K: AsRef<[u8]>, R: RangeBounds<K>>(&self, range: R) -> Range {
        let _ = range;
        todo!()
    }

    pub fn prefix(&self, prefix: &[u8]) -> Range {
        let _ = prefix;
        todo!()
    }
}

/// An iterator over `(key, value)` pairs of a range, both directions.
pub struct Range {}

impl Iterator for Range {
    type Item = Result<(Vec<u8>, Vec<u8>)>;

    fn next(&mut self) -> Option<Self::Item> {
        todo!()
    }
}

impl DoubleEndedIterator for Range {
    fn next_back(&mut self) -> Option<Self::Item> {
        todo!()
    }
}
