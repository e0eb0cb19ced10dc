//! Turning the log pointers a reader is about to follow into a few prefetch requests.
//!
//! Records are in the log in write order, not key order, so a scan of records that are not
//! in memory reads one random page per record. Read one at a time that is the device's
//! queue-depth-1 rate; asking for a window of them at once (`Storage::prefetch`, which
//! returns without waiting) lets the device work on many in parallel, and the reads that
//! follow find the pages resident (WiscKey §3.3.3).
//!
//! Owns: rounding records to pages and merging them into runs of adjacent pages, so a log
//! written in key order (a bulk load) costs one request per run instead of one per record;
//! and the residency gate: a request costs a system call even when the pages are already
//! in memory (a third of the time of a scan of cached data when asked per record), so a
//! reader probes a few records of each batch (`Storage::resident`, one `mincore` each) and
//! stops asking once a run of probes all found their pages resident.
//! Does not own: which records to ask for (range iterators and `multi_get` in `keyspace`,
//! the tail-buffer filter in `Region::prefetch_records`) nor the I/O (the `Storage`).
//!
//! Also owns the CPU-cache counterpart, [`cache_lines`]: for data already in memory the
//! wait is a cache (and TLB) miss per record or per node level rather than a device read,
//! and the same remedy applies on a smaller scale (start the loads of what comes next
//! before waiting on what comes now).
//!
//! Thread-safety: plain functions over caller-owned buffers, and one per-thread counter
//! (how many batches this thread's hot gates passed unprobed, `HOT_PROBE_EVERY_BATCHES`).

use crate::types::BLOCK_BYTES;

/// Asks the CPU to start loading the cache lines that hold `addr + at` for each `at` in
/// `offsets`. A hint only: a prefetch instruction reads nothing into the program's view of
/// memory and never faults, so any address is safe, a stale one just wastes a fetch.
/// Pages that are not resident are not read in (the device-level prefetch does that).
#[inline(always)]
pub(crate) fn cache_lines(addr: *const u8, offsets: impl IntoIterator<Item = usize>) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    for at in offsets {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: see above; `wrapping_add` makes no in-bounds claim.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(addr.wrapping_add(at).cast::<i8>()) };
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = (addr, offsets.into_iter());
}

/// Most bytes asked for per record. A record is prefetched from its start for about the
/// region's average record size (`Region::prefetch_records`); capped so one huge value
/// does not make every record of a window ask for megabytes. A record longer than what
/// was prefetched reads its remaining pages when it is read.
pub(crate) const MAX_RECORD_PREFETCH_BYTES: u64 = 256 << 10;

/// `multi_get` asks for at most this many records before reading them (more when
/// `Options::scan_prefetch_entries` is larger).
pub(crate) const MULTI_GET_WINDOW_ENTRIES: usize = 1024;

/// Consecutive resident probes after which a reader's batches are taken to be in memory
/// and no longer asked for (until a probe misses). Small enough that a cached multi-get of
/// about 100 keys decides within the call; large enough that a partly cached data set
/// (where asking still pays: one miss costs a device read, a request a system call) rarely
/// looks cached.
pub(crate) const HOT_STREAK_PROBES: usize = 16;

/// Batches a gate that starts hot asks for nothing without probing. A range's first two
/// windows (8 and 16 entries) cover a seek and its next twenty items, so the short scans
/// of YCSB E and of a seek-and-next pay no `mincore` (two probes were a quarter of a
/// 10-item seek's time on cached data). A misleading start (the data was evicted since
/// the region's last reader) reads those items one by one before the probes catch it.
pub(crate) const HOT_START_FREE_BATCHES: u8 = 2;

/// Once a gate is hot (its streak reached `HOT_STREAK_PROBES`), it probes only one batch
/// in this many, counted per thread across all its readers: a cached scan otherwise paid
/// two `mincore` calls per half window for ever (10% of the CPU of YCSB E's scans and of
/// a cached full scan, session 21's profiles). Data evicted under a hot reader is found at
/// the next probed batch, at most this many batches of the thread later.
pub(crate) const HOT_PROBE_EVERY_BATCHES: u32 = 8;

thread_local! {
    /// Batches this thread's hot gates passed without probing since their last probe.
    static HOT_UNPROBED: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Whether a reader's next batch is worth asking for. Kept by the reader across its
/// batches (a range iterator) or for one call (`multi_get`).
#[derive(Clone, Debug, Default)]
pub(crate) struct ResidencyGate {
    /// Probes in a row that found their page resident.
    resident_streak: usize,
    /// Batches to skip without probing: a gate that starts hot (see `with_streak`) skips
    /// its first `HOT_START_FREE_BATCHES`, so a short scan over data in memory makes no
    /// system call at all.
    free_passes: u8,
    /// Some probe found its page not resident (or could not tell): the reader has read
    /// from the device.
    missed: bool,
}

impl ResidencyGate {
    /// A gate that starts where another left off (a region's last reader, see
    /// `Region::prefetch_streak`): a new range over data known to be in memory does not
    /// ask for its first batches before its own probes agree.
    pub(crate) fn with_streak(resident_streak: usize) -> ResidencyGate {
        ResidencyGate {
            resident_streak,
            free_passes: if resident_streak >= HOT_STREAK_PROBES {
                HOT_START_FREE_BATCHES
            } else {
                0
            },
            missed: false,
        }
    }

    /// A gate that starts at `resident_streak` without free passes: once hot, it still
    /// probes one batch in `HOT_PROBE_EVERY_BATCHES`. For callers that make a new gate
    /// per batch (`Region::prefetch_keys`), where `with_streak`'s free passes would skip
    /// every batch and never notice data evicted under a hot streak.
    pub(crate) fn probing_from(resident_streak: usize) -> ResidencyGate {
        ResidencyGate {
            resident_streak,
            free_passes: 0,
            missed: false,
        }
    }

    /// Whether some probe of this gate found its page not resident (or could not tell).
    pub(crate) fn missed(&self) -> bool {
        self.missed
    }

    /// Probes in a row that found their page resident.
    pub(crate) fn streak(&self) -> usize {
        self.resident_streak
    }

    /// Probes up to `probes` records of `ptrs`, spread evenly, with `resident` (`None`:
    /// unknown, counts as a miss) and returns whether to ask for the batch: yes at the
    /// first miss (the remaining probes are skipped), no once the streak of resident
    /// probes reaches `HOT_STREAK_PROBES`.
    #[cfg(test)]
    pub(crate) fn issue(
        &mut self,
        ptrs: &[u64],
        probes: usize,
        resident: impl Fn(u64) -> Option<bool>,
    ) -> bool {
        if self.passes_unprobed() {
            return false;
        }
        self.probe(ptrs, probes, resident)
    }

    /// Whether the next batch is skipped without probing: a free pass of a gate that
    /// started hot, or a hot gate's batch between two probed ones (see
    /// `HOT_PROBE_EVERY_BATCHES`). Callers with work to do before probing (filtering
    /// the batch) ask this first; `issue` does both.
    pub(crate) fn passes_unprobed(&mut self) -> bool {
        if self.free_passes > 0 {
            self.free_passes -= 1;
            return true;
        }
        if self.resident_streak < HOT_STREAK_PROBES {
            return false;
        }
        HOT_UNPROBED
            .try_with(|unprobed| {
                let n = unprobed.get() + 1;
                if n >= HOT_PROBE_EVERY_BATCHES {
                    unprobed.set(0);
                    false
                } else {
                    unprobed.set(n);
                    true
                }
            })
            .unwrap_or(false)
    }

    /// Counts `n` records known to be in memory without a probe (records in a tail
    /// buffer) as resident probes.
    pub(crate) fn credit_resident(&mut self, n: usize) {
        self.resident_streak = self.resident_streak.saturating_add(n);
    }

    /// The probing half of `issue`, for a batch `passes_unprobed` did not skip.
    pub(crate) fn probe(
        &mut self,
        ptrs: &[u64],
        probes: usize,
        resident: impl Fn(u64) -> Option<bool>,
    ) -> bool {
        let step = ptrs.len().div_ceil(probes.max(1)).max(1);
        for &ptr in ptrs.iter().step_by(step) {
            if resident(ptr) != Some(true) {
                self.resident_streak = 0;
                self.missed = true;
                return true;
            }
            self.resident_streak += 1;
        }
        self.resident_streak < HOT_STREAK_PROBES
    }
}

/// Page size the runs are rounded to (the kernel's page cache unit on the platforms we
/// run on; the volume's block size is the same).
const PAGE_BYTES: u64 = BLOCK_BYTES;

/// Sorts `ptrs` (record offsets) and calls `issue(offset, len_bytes)` once per run of
/// pages covering `[ptr, ptr + record_bytes)` of every record, adjacent or overlapping
/// ranges merged. `ptrs` is left sorted (callers clear it). Returns the number of runs.
pub(crate) fn page_runs(
    ptrs: &mut [u64],
    record_bytes: u64,
    mut issue: impl FnMut(u64, u64),
) -> u64 {
    assert!(record_bytes > 0, "a record has at least a header");
    ptrs.sort_unstable();
    let mut runs = 0;
    let mut current: Option<(u64, u64)> = None;
    for &ptr in ptrs.iter() {
        let start = ptr / PAGE_BYTES * PAGE_BYTES;
        let end = ptr.saturating_add(record_bytes).div_ceil(PAGE_BYTES) * PAGE_BYTES;
        current = match current {
            // Sorted by start, so a run only ever grows at its end.
            Some((run_start, run_end)) if start <= run_end => Some((run_start, run_end.max(end))),
            Some((run_start, run_end)) => {
                issue(run_start, run_end - run_start);
                runs += 1;
                Some((start, end))
            }
            None => Some((start, end)),
        };
    }
    if let Some((run_start, run_end)) = current {
        issue(run_start, run_end - run_start);
        runs += 1;
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs_of(ptrs: &[u64], record_bytes: u64) -> Vec<(u64, u64)> {
        let mut ptrs = ptrs.to_vec();
        let mut out = Vec::new();
        let n = page_runs(&mut ptrs, record_bytes, |off, len| out.push((off, len)));
        assert_eq!(n as usize, out.len());
        out
    }

    #[test]
    fn a_gate_that_starts_hot_skips_its_first_batches_without_probing() {
        let ptrs: Vec<u64> = (0..8).map(|i| i * 4096).collect();
        let probes = std::cell::Cell::new(0);
        let count = |_| {
            probes.set(probes.get() + 1);
            Some(false)
        };
        let mut hot = ResidencyGate::with_streak(HOT_STREAK_PROBES);
        for _ in 0..HOT_START_FREE_BATCHES {
            assert!(!hot.issue(&ptrs, 2, count));
        }
        assert_eq!(probes.get(), 0);
        // After its free batches it probes one batch in `HOT_PROBE_EVERY_BATCHES` (this
        // thread's count), and a miss opens it.
        let mut batches = 0;
        while !hot.issue(&ptrs, 2, count) {
            batches += 1;
            assert!(batches < HOT_PROBE_EVERY_BATCHES, "a hot gate never probed");
        }
        assert_eq!(probes.get(), 1);
        // A gate that starts cold probes its first batch.
        let mut cold = ResidencyGate::with_streak(3);
        assert!(cold.issue(&ptrs, 2, count));
        assert_eq!(probes.get(), 2);
    }

    #[test]
    fn the_gate_closes_after_a_streak_of_resident_probes_and_reopens_at_a_miss() {
        let ptrs: Vec<u64> = (0..32).map(|i| i * 4096).collect();
        let mut gate = ResidencyGate::default();
        // Unknown residency (no mapping): always ask.
        for _ in 0..20 {
            assert!(gate.issue(&ptrs, 2, |_| None));
        }
        // Two resident probes per batch: still asking until 16 in a row.
        for _ in 0..7 {
            assert!(gate.issue(&ptrs, 2, |_| Some(true)));
        }
        assert!(!gate.issue(&ptrs, 2, |_| Some(true)));
        assert!(!gate.issue(&ptrs, 2, |_| Some(true)));
        // Hot, it probes one batch in `HOT_PROBE_EVERY_BATCHES`; a miss there reopens it,
        // and the streak starts again.
        let probed = std::cell::Cell::new(0);
        let mut batches = 0;
        while !gate.issue(&ptrs, 2, |p| {
            probed.set(probed.get() + 1);
            Some(p != 16 * 4096)
        }) {
            batches += 1;
            assert!(batches < HOT_PROBE_EVERY_BATCHES, "a hot gate never probed");
        }
        assert_eq!(probed.get(), 2);
        assert!(gate.issue(&ptrs, 2, |_| Some(true)));
        // Enough probes in one batch decide at once; probes are spread over the batch.
        let mut gate = ResidencyGate::default();
        let probed = std::cell::RefCell::new(Vec::new());
        assert!(!gate.issue(&ptrs, 16, |p| {
            probed.borrow_mut().push(p);
            Some(true)
        }));
        assert_eq!(probed.borrow().len(), 16);
        assert_eq!(probed.borrow()[1], 2 * 4096);
        // A batch shorter than the probe count probes each record once.
        let mut gate = ResidencyGate::default();
        let count = std::cell::Cell::new(0);
        gate.issue(&ptrs[..3], 16, |_| {
            count.set(count.get() + 1);
            Some(true)
        });
        assert_eq!(count.get(), 3);
    }

    #[test]
    fn records_round_to_pages_and_adjacent_pages_merge() {
        assert_eq!(runs_of(&[], 100), vec![]);
        // One small record inside a page: that page.
        assert_eq!(runs_of(&[8192 + 100], 100), vec![(8192, 4096)]);
        // A record across a page edge: both pages.
        assert_eq!(runs_of(&[4096 - 10], 100), vec![(0, 8192)]);
        // Unsorted input; records in adjacent pages merge, a gap splits.
        assert_eq!(
            runs_of(&[5 * 4096 + 7, 4096, 2 * 4096 + 3000, 40], 200),
            vec![(0, 3 * 4096), (5 * 4096, 4096)]
        );
        // Duplicates are harmless.
        assert_eq!(runs_of(&[4096, 4096, 4096], 24), vec![(4096, 4096)]);
        // A large record estimate covers the pages it spans.
        assert_eq!(runs_of(&[4096 + 1], 3 * 4096), vec![(4096, 4 * 4096)]);
    }
}
