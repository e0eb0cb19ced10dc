//! How a record outside the tail buffers is read: through the volume's mapping (no system
//! call, the default) or copied with `pread` (`Storage::read_random_at`) while the data
//! set looks larger than memory.
//!
//! Why two ways (DESIGN.md, "What a larger-than-memory read costs"): a record in the page
//! cache costs nothing through the mapping and a system call through `pread`, so data in
//! memory is read mapped. A record that is not resident costs a page fault through the
//! mapping: the fault, its synchronous read of one page (MADV_RANDOM), a second fault and
//! a second synchronous read when the record straddles a page boundary (about a quarter of
//! 1 KB records), and later, in a memory cgroup, the reclaim of a page that is mapped into
//! the process (the reverse-map walk, the unmap and its TLB shootdown). `pread` reads all
//! the record's pages in one request and leaves nothing mapped. Which one is cheaper
//! depends on the share of reads that miss, so readers sample it: one read in
//! `SAMPLE_EVERY` (per thread) asks `Storage::resident` about its record's page first (and
//! the residency probes of the scans' prefetch gate count too: a scan's own reads find
//! the pages it just asked for), and a moving average of the answers turns the copying mode on above `COLD_ENTER_SHARE`
//! and off below `COLD_LEAVE_SHARE`.
//!
//! Owns: the sampling, the moving average and the mode. Does not own: the reads
//! themselves (`Region::with_record`), nor the residency probe (`Storage`).
//!
//! Thread-safety: `ReadMode` is shared by every reader of a volume; its state is two
//! relaxed atomics. Concurrent samples may overwrite each other's update of the average,
//! which only loses a sample: the mode is a speed hint, never a correctness matter (both
//! ways return the same bytes).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// One read in this many (per thread) probes residency first. A probe is one `mincore`
/// (about a microsecond here), so sampling costs well under 1% of a read of data in
/// memory (about a microsecond through the harness), and a change of the data's
/// residency shows within a few hundred reads (copying starts after 3 missed samples).
pub(crate) const SAMPLE_EVERY: u32 = 128;

/// The moving average's unit: a share of 1.0.
const SHARE_ONE: u32 = 1 << 16;

/// Weight of a new sample in the moving average: 1 / 2^`AVERAGE_SHIFT` (about the last 16
/// samples, i.e. the last two thousand reads, decide).
const AVERAGE_SHIFT: u32 = 4;

/// Share of sampled reads that missed above which records are copied with `pread`. Back
/// of the envelope (DESIGN.md): a copied hit costs about 1 µs more than a mapped one, a
/// copied miss saves several (the fault, the unmap at reclaim, the second synchronous read
/// of a straddling record), so copying pays from a miss share of roughly 1 in 8.
const COLD_ENTER_SHARE: u32 = SHARE_ONE / 8;

/// Share below which reads go back to the mapping (lower than `COLD_ENTER_SHARE` so a
/// share near the threshold does not flip the mode at every sample).
const COLD_LEAVE_SHARE: u32 = SHARE_ONE / 16;

thread_local! {
    /// Reads this thread made, for choosing which ones sample.
    static READS: Cell<u32> = const { Cell::new(0) };
}

/// The read mode of a volume. See the module doc.
#[derive(Debug)]
pub(crate) struct ReadMode {
    /// Whether records are copied (`pread`) rather than read through the mapping.
    copying: AtomicBool,
    /// Moving average of the sampled reads that missed, in units of `SHARE_ONE`.
    miss_share: AtomicU32,
    /// `false`: never copy (`Options::cold_reads_copied`).
    enabled: bool,
}

impl ReadMode {
    pub(crate) fn new(enabled: bool) -> ReadMode {
        ReadMode {
            copying: AtomicBool::new(false),
            miss_share: AtomicU32::new(0),
            enabled,
        }
    }

    /// Called before each record read from the volume: whether to copy it (`true`) or
    /// read it through the mapping. `resident` answers whether the record's first page is
    /// in memory (`None`: the backend cannot tell, which never turns copying on); it is
    /// called on one read in `SAMPLE_EVERY` of the calling thread.
    #[inline]
    pub(crate) fn copy_next(&self, resident: impl FnOnce() -> Option<bool>) -> bool {
        if !self.enabled {
            return false;
        }
        let n = READS.with(|reads| {
            let n = reads.get().wrapping_add(1);
            reads.set(n);
            n
        });
        if n.is_multiple_of(SAMPLE_EVERY) {
            if let Some(resident) = resident() {
                self.sample(!resident);
            }
        }
        self.copying.load(Ordering::Relaxed)
    }

    /// Adds one sample (`missed`: the page was not resident) to the moving average and
    /// sets the mode from it. Besides `copy_next`'s own, range iterators and groups of gets
    /// give the probes of their prefetch gate (taken before they ask for the pages, so
    /// they see what a read would have found).
    pub(crate) fn sample(&self, missed: bool) {
        if !self.enabled {
            return;
        }
        let share = self.miss_share.load(Ordering::Relaxed);
        let target = if missed { SHARE_ONE } else { 0 };
        // share + (target - share) / 2^shift, in unsigned arithmetic.
        let share = if target >= share {
            share + ((target - share) >> AVERAGE_SHIFT)
        } else {
            share - ((share - target) >> AVERAGE_SHIFT)
        };
        self.miss_share.store(share, Ordering::Relaxed);
        let copying = self.copying.load(Ordering::Relaxed);
        if !copying && share >= COLD_ENTER_SHARE {
            self.copying.store(true, Ordering::Relaxed);
        } else if copying && share < COLD_LEAVE_SHARE {
            self.copying.store(false, Ordering::Relaxed);
        }
    }

    /// Whether records are copied now.
    pub(crate) fn copying(&self) -> bool {
        self.copying.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn misses_turn_copying_on_and_hits_turn_it_off_with_hysteresis() {
        let mode = ReadMode::new(true);
        assert!(!mode.copying());
        // All hits: stays mapped.
        for _ in 0..100 {
            mode.sample(false);
        }
        assert!(!mode.copying());
        // One miss in four: the average settles near a quarter, above the entry share.
        for i in 0..200 {
            mode.sample(i % 4 == 0);
        }
        assert!(mode.copying());
        // One miss in eleven: the average stays between the two thresholds (it swings
        // from about 0.064 to 0.123), so the mode stays as it was.
        for i in 0..440 {
            mode.sample(i % 11 == 0);
        }
        assert!(mode.copying());
        // All hits again: back to the mapping.
        for _ in 0..100 {
            mode.sample(false);
        }
        assert!(!mode.copying());
        // And one miss in eleven, starting from mapped, does not turn copying on.
        for i in 0..440 {
            mode.sample(i % 11 == 0);
        }
        assert!(!mode.copying());
    }

    #[test]
    fn only_one_read_in_sample_every_probes_and_unknown_residency_never_copies() {
        let mode = ReadMode::new(true);
        let probes = Cell::new(0);
        for _ in 0..SAMPLE_EVERY * 100 {
            assert!(!mode.copy_next(|| {
                probes.set(probes.get() + 1);
                None
            }));
        }
        assert_eq!(probes.get(), 100);
        for _ in 0..SAMPLE_EVERY * 100 {
            mode.copy_next(|| Some(false));
        }
        assert!(mode.copying());
        // Disabled: never probes, never copies.
        let off = ReadMode::new(false);
        for _ in 0..SAMPLE_EVERY * 100 {
            assert!(!off.copy_next(|| panic!("a disabled mode probes nothing")));
        }
    }
}
