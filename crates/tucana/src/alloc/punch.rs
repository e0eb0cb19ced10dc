//! Giving freed blocks back to the file system: punched at once, or deferred.
//!
//! Owns: `Allocator::release_punching` (large extents punched before their release, a
//! freed index node punched with the free run around it), the deferred runs
//! (`DeferredRun`, listed in `State::deferred` and taken first by large allocations through
//! `State::take_deferred`), `Allocator::punch_deferred` (all runs old enough, or those a selector accepts), and the union of runs that makes
//! one punch call per free stretch. Does not own: the system call (the caller's `punch`),
//! when deferred runs are old enough (the caller's `min_age`), nor the bitmap and its runs
//! (`state`).
//!
//! Thread-safety: `Allocator`'s methods take its mutex. Large extents are punched without
//! it (nothing can allocate them before their release); node windows and deferred runs are
//! punched with it held, so no allocation takes a block of a run being punched.

use std::time::{Duration, Instant};

use super::bitmap;
use super::state::State;
use super::{Allocator, GROUP_BLOCKS};
use crate::types::{DiskOffset, BLOCK_BYTES};

/// See `State::deferred`.
#[derive(Clone, Copy, Debug)]
pub(super) struct DeferredRun {
    start_block: u64,
    blocks: u64,
    released_at: Instant,
}

/// How many of the newest deferred runs an allocation looks at.
const DEFERRED_SCAN: usize = 64;

/// Allocations shorter than this (index nodes, descriptors) do not take deferred runs:
/// they would cut segment-sized holes into pieces no segment fits.
pub(super) const DEFERRED_MIN_BLOCKS: u64 = 16;

impl State {
    /// A free run of `blocks` aligned to `align_blocks` inside one of the newest deferred
    /// runs, taken out of it (what is left of that run stays listed).
    pub(super) fn take_deferred(&mut self, blocks: u64, align_blocks: u64) -> Option<u64> {
        let n = self.deferred.len();
        for i in (n.saturating_sub(DEFERRED_SCAN)..n).rev() {
            let d = self.deferred[i];
            let start = bitmap::align_up(d.start_block, align_blocks);
            let end = d.start_block + d.blocks;
            if start + blocks > end || self.count_set(start, start + blocks) != 0 {
                continue;
            }
            self.deferred.remove(i);
            for (lo, hi) in [(d.start_block, start), (start + blocks, end)] {
                if hi > lo {
                    self.deferred.push(DeferredRun {
                        start_block: lo,
                        blocks: hi - lo,
                        released_at: d.released_at,
                    });
                }
            }
            return Some(start);
        }
        None
    }

    /// Blocks of the deferred runs (free or not).
    fn deferred_blocks(&self) -> u64 {
        self.deferred.iter().map(|d| d.blocks).sum()
    }
}

/// Punches the union of `runs` (block ranges `lo..hi`, sorted by `lo`): overlapping and
/// adjacent runs become one call, so each block is punched once. Returns the bytes.
fn punch_union(runs: impl IntoIterator<Item = (u64, u64)>, punch: &mut dyn FnMut(u64, u64)) -> u64 {
    let mut bytes = 0;
    let mut emit = |(lo, hi): (u64, u64)| {
        punch(lo * BLOCK_BYTES, (hi - lo) * BLOCK_BYTES);
        bytes += (hi - lo) * BLOCK_BYTES;
    };
    let mut merged: Option<(u64, u64)> = None;
    for (lo, hi) in runs {
        debug_assert!(merged.is_none_or(|(mlo, _)| mlo <= lo), "runs not sorted");
        merged = match merged {
            Some((mlo, mhi)) if lo <= mhi => Some((mlo, mhi.max(hi))),
            Some(done) => {
                emit(done);
                Some((lo, hi))
            }
            None => Some((lo, hi)),
        };
    }
    if let Some(done) = merged {
        emit(done);
    }
    bytes
}

/// How far either side of a freed index node `Allocator::release_punching` looks for free
/// neighbours to punch with it (1 MiB): enough to merge a commit's run of nodes, little
/// enough that the system call under the allocator's lock stays short.
const SMALL_PUNCH_WINDOW_BLOCKS: u64 = 256;

impl Allocator {
    /// Frees `extents` (each may be freed: panics otherwise, like `release`) and has
    /// `punch(offset_bytes, len_bytes)` give their bytes back to the file system.
    ///
    /// Extents of at least `min_blocks` (log segments, runs of nodes; adjacent ones
    /// merged) are punched before they are released, outside the allocator's lock:
    /// nothing else can allocate them yet, and writers switching segments do not wait for
    /// the system calls. A smaller one (an index node) is released, then the free run it
    /// lies in, within `SMALL_PUNCH_WINDOW_BLOCKS` either side, is punched if it reaches
    /// `min_blocks`, with the lock held so no allocation takes a block of that run in
    /// between. Nodes come back one block at a time and a few per batch (commit pairs,
    /// frees handed back between commits): punched only as given, a store emptied by
    /// deletes kept its whole index in the file.
    ///
    /// With `defer`, large extents are released unpunched instead and listed for
    /// `punch_deferred`; until then log segment allocations take them first.
    pub fn release_punching(
        &self,
        extents: &[(DiskOffset, u64)],
        min_blocks: u64,
        defer: bool,
        punch: &mut dyn FnMut(u64, u64),
    ) {
        let (mut large, small): (Vec<_>, Vec<_>) = extents
            .iter()
            .copied()
            .partition(|(_, blocks)| *blocks >= min_blocks);
        large.sort_unstable();
        if defer {
            let now = Instant::now();
            let mut st = self.state.lock();
            for &(offset, blocks) in &large {
                if let Err(why) = st.try_release(offset, blocks) {
                    panic!("{why}");
                }
                st.deferred.push(DeferredRun {
                    start_block: offset.0 / BLOCK_BYTES,
                    blocks,
                    released_at: now,
                });
            }
            drop(st);
            large.clear();
        }
        punch_union(
            large.iter().map(|&(offset, blocks)| {
                let start = offset.0 / BLOCK_BYTES;
                (start, start + blocks)
            }),
            punch,
        );
        let mut st = self.state.lock();
        for &(offset, blocks) in &large {
            if let Err(why) = st.try_release(offset, blocks) {
                panic!("{why}");
            }
        }
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for &(offset, blocks) in &small {
            if let Err(why) = st.try_release(offset, blocks) {
                panic!("{why}");
            }
            let start = offset.0 / BLOCK_BYTES;
            let g = start / GROUP_BLOCKS;
            let base = g * GROUP_BLOCKS;
            let Some(group) = st.groups.get(g as usize) else {
                continue;
            };
            // Within the group (reserved blocks at its start and blocks past the volume's
            // end are set, so the run stops at them) and the window.
            let start_in = start - base;
            let end_in = (start + blocks).min(base + GROUP_BLOCKS) - base;
            let floor = start_in.saturating_sub(SMALL_PUNCH_WINDOW_BLOCKS);
            let ceiling = (end_in + SMALL_PUNCH_WINDOW_BLOCKS).min(GROUP_BLOCKS);
            let lo = bitmap::last_set_below(&group.bits, start_in)
                .map_or(0, |b| b + 1)
                .max(floor);
            let hi = bitmap::first_set(&group.bits, end_in, ceiling).unwrap_or(ceiling);
            if hi - lo >= min_blocks {
                runs.push((base + lo, base + hi));
            }
        }
        // Windows of nodes freed near each other overlap: each free block is punched once
        // (a commit pair of a GC burst frees thousands of nodes in a few runs, and punching
        // every node's window made 25k system calls over 7 GiB for 2.4 GiB freed).
        runs.sort_unstable();
        punch_union(runs, punch);
        drop(st);
    }

    /// Punches what is still free of the deferred runs released at least `min_age` ago,
    /// and forgets them. The lock is held throughout, so no allocation takes a block of a
    /// run being punched. Returns the bytes punched.
    pub fn punch_deferred(&self, min_age: Duration, punch: &mut dyn FnMut(u64, u64)) -> u64 {
        self.punch_deferred_selected(min_age, &mut |_, _| true, punch)
    }

    /// As `punch_deferred`, for the runs `select(offset_bytes, len_bytes)` accepts (asked
    /// once per run old enough, oldest first, with the allocator's lock held: it must not
    /// call the allocator); the others stay listed. The trim scheduler's pass
    /// (`Shared::schedule_trims`) selects by member and budget.
    pub fn punch_deferred_selected(
        &self,
        min_age: Duration,
        select: &mut dyn FnMut(u64, u64) -> bool,
        punch: &mut dyn FnMut(u64, u64),
    ) -> u64 {
        let mut st = self.state.lock();
        let now = Instant::now();
        let mut due: Vec<(u64, u64)> = Vec::new();
        st.deferred.retain(|d| {
            let chosen = now.duration_since(d.released_at) >= min_age
                && select(d.start_block * BLOCK_BYTES, d.blocks * BLOCK_BYTES);
            if chosen {
                due.push((d.start_block, d.start_block + d.blocks));
            }
            !chosen
        });
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for (lo, hi) in due {
            let g = lo / GROUP_BLOCKS;
            let base = g * GROUP_BLOCKS;
            debug_assert_eq!((hi - 1) / GROUP_BLOCKS, g, "a deferred run spans groups");
            let Some(group) = st.groups.get(g as usize) else {
                continue;
            };
            let (mut at, end) = (lo - base, hi - base);
            while let Some(free) = bitmap::first_clear(&group.bits, at, end) {
                let stop = bitmap::first_set(&group.bits, free, end).unwrap_or(end);
                runs.push((base + free, base + stop));
                at = stop;
            }
        }
        // A run released again while an older listing of it waits is listed twice: sorted,
        // the union punches its blocks once.
        runs.sort_unstable();
        let punched = punch_union(runs, punch);
        drop(st);
        punched
    }

    /// The deferred runs listed now, `(offset_bytes, len_bytes)`, oldest first (free or
    /// not: a run partly allocated again stays listed until a pass looks at it).
    pub fn deferred_runs(&self) -> Vec<(u64, u64)> {
        self.state
            .lock()
            .deferred
            .iter()
            .map(|d| (d.start_block * BLOCK_BYTES, d.blocks * BLOCK_BYTES))
            .collect()
    }

    /// Bytes of the runs released unpunched and not yet given to `punch_deferred`: free
    /// in the bitmap, still held by the file system (unless allocated again since).
    pub fn deferred_bytes(&self) -> u64 {
        self.state.lock().deferred_blocks() * BLOCK_BYTES
    }
}
