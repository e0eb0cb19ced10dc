//! The key-value log: append-only records in log segments, one log per region.
//!
//! Owns: the record format (`record`), the in-memory tail segment (`tail`). The region
//! (`crate::region`) drives appends, segment switches and replay; live/dead byte counts
//! per segment are kept there (`SegmentStats`), exact from the first record.

pub mod record;
pub mod tail;

/// Byte counts of one log segment. `written - live` bytes are dead (overwritten or
/// deleted records, tombstones, links): what garbage collection reclaims.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SegmentStats {
    pub size_bytes: u64,
    pub written_bytes: u64,
    pub live_bytes: u64,
    /// Position of the segment in its region's chain: strictly increasing with allocation,
    /// never reused within a region. Garbage collection compares it with the position of a
    /// commit's tail to know whether the segment lies before that commit's replay window.
    pub order: u64,
}

impl SegmentStats {
    pub fn dead_bytes(&self) -> u64 {
        self.written_bytes - self.live_bytes
    }
}
