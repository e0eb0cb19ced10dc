//! Newtypes and constants shared by every part of the engine.
//!
//! Units are last in names (`BLOCK_BYTES`, `segment_bytes`). Offsets are byte offsets
//! into the volume; a `DiskOffset` of zero never names data (block 0 is a superblock slot),
//! so zero is used as "none" in on-disk fields.

use std::fmt;

/// Size of an allocation block, an index node and a superblock slot.
pub const BLOCK_BYTES: u64 = 4096;

/// Largest key accepted by the engine (inclusive).
pub const MAX_KEY_BYTES: usize = 64 * 1024;

/// Largest value accepted by the engine (inclusive).
pub const MAX_VALUE_BYTES: usize = 64 * 1024 * 1024;

/// A byte offset into the volume.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct DiskOffset(pub u64);

impl DiskOffset {
    pub const NONE: DiskOffset = DiskOffset(0);

    pub fn is_none(self) -> bool {
        self.0 == 0
    }

    pub fn block_aligned(self) -> bool {
        self.0.is_multiple_of(BLOCK_BYTES)
    }

    pub fn plus_bytes(self, bytes: u64) -> DiskOffset {
        DiskOffset(self.0 + bytes)
    }
}

impl fmt::Debug for DiskOffset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "@{:#x}", self.0)
    }
}

impl fmt::Display for DiskOffset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// Number of a volume commit: the superblock names the descriptor of the newest one.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct CommitEpoch(pub u64);

/// Version of one region's tree. Nodes created in the running tree epoch are changed in
/// place; nodes of older (sealed) tree epochs are immutable and copied on write.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct TreeEpoch(pub u64);

/// Unique, never reused identity of a region (keyspace) within a volume.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct RegionId(pub u64);

/// Sequence number of a record in a region's log; consecutive records have consecutive
/// numbers, which is how replay tells the log's end from stale bytes.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct SeqNo(pub u64);

/// A run of blocks: where it starts and how many.
pub type Extent = (DiskOffset, u64);
