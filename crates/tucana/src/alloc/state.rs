//! The in-memory bitmap of the volume and the operations on its runs.
//!
//! Owns: `State` (every group's bitmap and free count, the volume's length in blocks, the
//! next-fit cursor, the count of allocated blocks), setting, clearing and counting runs
//! across groups, the search for a free run, growth of the volume, taking a run found free
//! (recorded when it is post-seal), checked release, and the consistency check the tests
//! run. Does not own: the word-level bit operations (`bitmap`), the commit phases and
//! images (`commit`), the deferred runs and the punches (`punch`), nor the lock.
//!
//! Thread-safety: plain data; `Allocator` keeps `State` behind its mutex and every method
//! here runs on the locked state (`grow` calls `Storage::grow` with the lock held).

use super::bitmap::{self, BitmapWords};
use super::commit::CommitPhase;
use super::punch::DeferredRun;
use super::{
    group_count, volume_bytes_valid, GROUP_BLOCKS, GROUP_RESERVED_BLOCKS, GROWTH_MIN_BYTES,
};
use crate::error::Result;
use crate::types::{DiskOffset, BLOCK_BYTES};
use crate::volume::Storage;

/// A run of blocks, in volume block numbers.
#[derive(Clone, Copy, Debug)]
pub(super) struct Run {
    pub(super) start_block: u64,
    blocks: u64,
}

impl Run {
    pub(super) fn end_block(self) -> u64 {
        self.start_block + self.blocks
    }
}

pub(super) struct Group {
    pub(super) bits: Box<BitmapWords>,
    /// Clear bits; bits past the volume's end are set, so all of these are usable.
    pub(super) free_blocks: u64,
    /// Current (durable) buddy. For a group never committed: the one its first image
    /// must not use.
    pub(super) slot: u8,
    pub(super) dirty: bool,
}

impl Group {
    /// A group with only its reserved blocks (and those past the volume's end) allocated.
    pub(super) fn fresh(end_in_group: u64) -> Group {
        assert!((GROUP_RESERVED_BLOCKS..=GROUP_BLOCKS).contains(&end_in_group));
        let mut bits = bitmap::zeroed();
        bitmap::set_range(&mut bits, 0, GROUP_RESERVED_BLOCKS);
        bitmap::set_range(&mut bits, end_in_group, GROUP_BLOCKS);
        Group {
            free_blocks: GROUP_BLOCKS - bitmap::count_all(&bits),
            bits,
            // The first image goes to buddy A.
            slot: 1,
            dirty: true,
        }
    }
}

pub(super) struct State {
    pub(super) volume_blocks: u64,
    pub(super) groups: Vec<Group>,
    /// Where the next search starts (next fit): just past the last run handed out.
    pub(super) cursor_block: u64,
    /// Set bits inside the volume, reserved blocks included.
    pub(super) allocated_blocks: u64,
    pub(super) phase: CommitPhase,
    /// Runs released without a punch (`release_punching` with `defer`), newest last. Log
    /// segments are allocated from them first, so in a burst their blocks are written
    /// again while the file system still holds them; `punch_deferred` gives back what
    /// stays free. Each lies inside one group; a run may have been allocated since (by a
    /// search), so its bits are checked at every use.
    pub(super) deferred: Vec<DeferredRun>,
}

impl State {
    pub(super) fn new(volume_blocks: u64, groups: Vec<Group>, allocated_blocks: u64) -> State {
        State {
            volume_blocks,
            groups,
            cursor_block: 0,
            allocated_blocks,
            phase: CommitPhase::Idle,
            deferred: Vec::new(),
        }
    }

    /// Blocks of group `g` inside the volume.
    pub(super) fn end_in_group(&self, g: usize) -> u64 {
        (self.volume_blocks - g as u64 * GROUP_BLOCKS).min(GROUP_BLOCKS)
    }

    /// Calls `f(group, lo, hi)` for each group's share of blocks `start..end` (inside the volume).
    fn for_each_piece(start: u64, end: u64, mut f: impl FnMut(usize, u64, u64)) {
        let mut block = start;
        while block < end {
            let g = block / GROUP_BLOCKS;
            let base = g * GROUP_BLOCKS;
            let hi = (end - base).min(GROUP_BLOCKS);
            f(g as usize, block - base, hi);
            block = base + hi;
        }
    }

    /// Sets blocks `start..end` (inside the volume); returns how many were clear.
    pub(super) fn set_run(&mut self, start: u64, end: u64) -> u64 {
        assert!(end <= self.volume_blocks);
        let mut newly_total = 0;
        let groups = &mut self.groups;
        Self::for_each_piece(start, end, |g, lo, hi| {
            let group = &mut groups[g];
            let newly = bitmap::set_range(&mut group.bits, lo, hi);
            group.free_blocks -= newly;
            group.dirty |= newly > 0;
            newly_total += newly;
        });
        self.allocated_blocks += newly_total;
        newly_total
    }

    /// Clears blocks `start..end` (inside the volume); returns how many were set.
    fn clear_run(&mut self, start: u64, end: u64) -> u64 {
        assert!(end <= self.volume_blocks);
        let mut cleared_total = 0;
        let groups = &mut self.groups;
        Self::for_each_piece(start, end, |g, lo, hi| {
            let group = &mut groups[g];
            let cleared = bitmap::clear_range(&mut group.bits, lo, hi);
            group.free_blocks += cleared;
            group.dirty |= cleared > 0;
            cleared_total += cleared;
        });
        self.allocated_blocks -= cleared_total;
        cleared_total
    }

    /// Set blocks in `start..end` (inside the volume).
    pub(super) fn count_set(&self, start: u64, end: u64) -> u64 {
        assert!(end <= self.volume_blocks);
        let mut set = 0;
        Self::for_each_piece(start, end, |g, lo, hi| {
            set += bitmap::count_set(&self.groups[g].bits, lo, hi);
        });
        set
    }

    /// Visits the groups starting at the cursor's position and wrapping around once (the
    /// cursor's own group is visited again from its start last); `search(group, from)`
    /// returns a group-relative hit.
    fn search_from<T>(
        &self,
        cursor_block: u64,
        mut search: impl FnMut(usize, &Group, u64) -> Option<T>,
    ) -> Option<(usize, T)> {
        let count = self.groups.len();
        let cursor_block = if cursor_block >= self.volume_blocks {
            0
        } else {
            cursor_block
        };
        let first = (cursor_block / GROUP_BLOCKS) as usize;
        for step in 0..=count {
            let g = (first + step) % count;
            let from = if step == 0 {
                cursor_block % GROUP_BLOCKS
            } else {
                0
            };
            if let Some(hit) = search(g, &self.groups[g], from) {
                return Some((g, hit));
            }
        }
        None
    }

    /// First fit from `cursor_block`: the start block of a free aligned run.
    pub(super) fn find_run(
        &self,
        cursor_block: u64,
        blocks: u64,
        align_blocks: u64,
    ) -> Option<u64> {
        self.search_from(cursor_block, |_, group, from| {
            if group.free_blocks < blocks {
                return None;
            }
            bitmap::find_run(&group.bits, from, blocks, align_blocks)
        })
        .map(|(g, start)| g as u64 * GROUP_BLOCKS + start)
    }

    /// As `find_run`, among the groups `keep` accepts.
    pub(super) fn find_run_where(
        &self,
        cursor_block: u64,
        blocks: u64,
        align_blocks: u64,
        keep: impl Fn(usize) -> bool,
    ) -> Option<u64> {
        self.search_from(cursor_block, |g, group, from| {
            if group.free_blocks < blocks || !keep(g) {
                return None;
            }
            bitmap::find_run(&group.bits, from, blocks, align_blocks)
        })
        .map(|(g, start)| g as u64 * GROUP_BLOCKS + start)
    }

    /// First free run of up to `max_blocks` from `cursor_block`: (start block, blocks).
    pub(super) fn find_run_up_to(&self, cursor_block: u64, max_blocks: u64) -> Option<(u64, u64)> {
        self.find_run_up_to_where(cursor_block, max_blocks, |_| true)
    }

    /// As `find_run_up_to`, among the groups `keep` accepts.
    pub(super) fn find_run_up_to_where(
        &self,
        cursor_block: u64,
        max_blocks: u64,
        keep: impl Fn(usize) -> bool,
    ) -> Option<(u64, u64)> {
        self.search_from(cursor_block, |g, group, from| {
            if group.free_blocks == 0 || !keep(g) {
                return None;
            }
            bitmap::first_run_up_to(&group.bits, from, max_blocks)
        })
        .map(|(g, (start, blocks))| (g as u64 * GROUP_BLOCKS + start, blocks))
    }

    /// The smallest volume length (blocks) at which an aligned run of `blocks` fits past
    /// the last allocated block of the last group (or in a new group after it).
    pub(super) fn needed_end_block(&self, blocks: u64, align_blocks: u64) -> u64 {
        let last = self.groups.len() - 1;
        let base = last as u64 * GROUP_BLOCKS;
        let end_in = self.end_in_group(last);
        // The reserved blocks are set, so there always is a last set bit.
        let tail_start =
            bitmap::last_set_below(&self.groups[last].bits, end_in).map_or(0, |b| b + 1);
        let start = bitmap::align_up(tail_start.max(GROUP_RESERVED_BLOCKS), align_blocks);
        if start + blocks <= GROUP_BLOCKS {
            base + start + blocks
        } else {
            base + GROUP_BLOCKS + bitmap::align_up(GROUP_RESERVED_BLOCKS, align_blocks) + blocks
        }
    }

    /// Groups the volume has now.
    pub(super) fn groups_len(&self) -> usize {
        self.groups.len()
    }

    /// Grows the volume so that a run ending at `needed_end_block` fits; returns the block
    /// where a search for it should start.
    pub(super) fn grow(&mut self, storage: &dyn Storage, needed_end_block: u64) -> Result<u64> {
        let old_bytes = self.volume_blocks * BLOCK_BYTES;
        let policy_bytes = old_bytes + (old_bytes / 8).max(GROWTH_MIN_BYTES);
        let mut new_blocks = policy_bytes.div_ceil(BLOCK_BYTES).max(needed_end_block);
        let tail_blocks = new_blocks % GROUP_BLOCKS;
        if tail_blocks != 0 && tail_blocks < GROUP_RESERVED_BLOCKS {
            new_blocks += GROUP_RESERVED_BLOCKS - tail_blocks;
        }
        assert!(new_blocks > self.volume_blocks);
        storage.grow(new_blocks * BLOCK_BYTES)?;
        let search_from = (self.groups.len() as u64 - 1) * GROUP_BLOCKS;
        self.extend(new_blocks);
        Ok(search_from)
    }

    /// Makes the in-memory state cover `new_blocks` (the storage already does).
    pub(super) fn extend(&mut self, new_blocks: u64) {
        assert!(volume_bytes_valid(new_blocks * BLOCK_BYTES));
        let last = self.groups.len() - 1;
        let old_end = self.end_in_group(last);
        self.volume_blocks = new_blocks;
        let new_end = self.end_in_group(last);
        if new_end > old_end {
            let group = &mut self.groups[last];
            let freed = bitmap::clear_range(&mut group.bits, old_end, new_end);
            assert_eq!(
                freed,
                new_end - old_end,
                "bits past the volume's end must be set"
            );
            group.free_blocks += freed;
            group.dirty = true;
        }
        for g in self.groups.len()..group_count(new_blocks * BLOCK_BYTES) as usize {
            let group = Group::fresh((new_blocks - g as u64 * GROUP_BLOCKS).min(GROUP_BLOCKS));
            self.allocated_blocks += GROUP_RESERVED_BLOCKS;
            self.groups.push(group);
        }
    }

    /// Marks a run found free as allocated and records it when it belongs to the next epoch.
    pub(super) fn take(&mut self, start_block: u64, blocks: u64, post_seal: bool) {
        let newly = self.set_run(start_block, start_block + blocks);
        assert_eq!(newly, blocks, "the search returned a run that is not free");
        if post_seal {
            match &mut self.phase {
                CommitPhase::Idle => {}
                CommitPhase::Sealed { post_seal } | CommitPhase::Imaged { post_seal, .. } => {
                    post_seal.push(Run {
                        start_block,
                        blocks,
                    })
                }
            }
        }
        self.cursor_block = start_block + blocks;
    }

    /// See `Allocator::try_release`.
    pub(super) fn try_release(&mut self, offset: DiskOffset, blocks: u64) -> Result<(), String> {
        if !offset.block_aligned() {
            return Err(format!("releasing unaligned offset {offset}"));
        }
        if blocks == 0 {
            return Err(format!("releasing an empty run at {offset}"));
        }
        let start = offset.0 / BLOCK_BYTES;
        let end = start.saturating_add(blocks);
        if end > self.volume_blocks {
            return Err(format!(
                "releasing {blocks} blocks at {offset}, past the volume's end"
            ));
        }
        let mut reserved = None;
        State::for_each_piece(start, end, |g, lo, _| {
            if lo < GROUP_RESERVED_BLOCKS && reserved.is_none() {
                reserved = Some((g, lo));
            }
        });
        if let Some((g, lo)) = reserved {
            return Err(format!(
                "releasing reserved block {lo} of group {g} (run of {blocks} blocks at {offset})"
            ));
        }
        let set = self.count_set(start, end);
        if set != blocks {
            return Err(format!(
                "double free: {} of {blocks} blocks at {offset} are free",
                blocks - set
            ));
        }
        self.clear_run(start, end);
        self.forget_post_seal(start, end);
        Ok(())
    }

    /// Forgets released blocks `start..end` from the recorded post-seal runs, so that a
    /// later pre-seal allocation of the same blocks is not cut out of the image.
    fn forget_post_seal(&mut self, start: u64, end: u64) {
        let runs = match &mut self.phase {
            CommitPhase::Idle => return,
            CommitPhase::Sealed { post_seal } | CommitPhase::Imaged { post_seal, .. } => post_seal,
        };
        let mut kept = Vec::with_capacity(runs.len() + 1);
        for run in runs.drain(..) {
            if run.end_block() <= start || run.start_block >= end {
                kept.push(run);
                continue;
            }
            if run.start_block < start {
                kept.push(Run {
                    start_block: run.start_block,
                    blocks: start - run.start_block,
                });
            }
            if run.end_block() > end {
                kept.push(Run {
                    start_block: end,
                    blocks: run.end_block() - end,
                });
            }
        }
        *runs = kept;
    }

    /// Panics unless the counters and fixed bits agree with the bitmaps (tests).
    #[cfg(test)]
    pub(super) fn assert_consistent(&self) {
        assert_eq!(
            self.groups.len() as u64,
            group_count(self.volume_blocks * BLOCK_BYTES)
        );
        let mut allocated = 0;
        for (g, group) in self.groups.iter().enumerate() {
            let end_in = self.end_in_group(g);
            let set = bitmap::count_all(&group.bits);
            assert_eq!(
                group.free_blocks,
                GROUP_BLOCKS - set,
                "group {g} free count"
            );
            assert_eq!(
                bitmap::count_set(&group.bits, 0, GROUP_RESERVED_BLOCKS),
                GROUP_RESERVED_BLOCKS
            );
            assert_eq!(
                bitmap::count_set(&group.bits, end_in, GROUP_BLOCKS),
                GROUP_BLOCKS - end_in
            );
            allocated += set - (GROUP_BLOCKS - end_in);
        }
        assert_eq!(allocated, self.allocated_blocks);
    }
}
