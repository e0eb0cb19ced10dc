//! The block allocator: which 4 KiB blocks of the volume are in use (Tucana §3.2–3.4).
//!
//! Owns: the in-memory bitmap of every allocation group, the search for free runs, growth
//! of the volume when nothing fits, the on-disk bitmap buddies (`buddy`) and which of each
//! group's two buddies is current, and the commit-time images of the bitmap. Does not own:
//! deferring frees until no commit or reader can see the run (the caller's free log — a
//! `release` is visible in the next image made), the commit descriptor and superblock that
//! record `slots` and `volume_bytes`, nor what is stored in the blocks.
//!
//! Layout: the volume is cut into groups of `GROUP_BLOCKS` blocks (128 MiB). Blocks 0..8 of
//! every group are reserved (group 0's blocks 0 and 1 are the superblock slots; blocks 2-3
//! and 4-5 are bitmap buddies A and B; 6-7 are spare) and always allocated. Blocks past the
//! end of the volume count as allocated, so the bits of a partial last group past the end
//! are set. A volume's last group always holds at least its reserved blocks.
//!
//! Buddy pairs keep the last durable image of every group intact: a commit writes a
//! changed group's image to the buddy the last durable commit does *not* use, and its
//! descriptor records the new choice per group (`slots`, 0 = A, 1 = B). Commit protocol:
//!
//! 1. `begin_commit` seals the state: from now on, `allocate(…, post_seal = true)` runs
//!    (space for writes that belong to the next epoch, e.g. new log segments) are recorded.
//! 2. The commit allocates what it writes (nodes, descriptor) with `post_seal = false`.
//! 3. `commit_images(epoch)` returns the images of every changed group: live bits minus the
//!    recorded post-seal runs, so they never leak into this commit's durable state.
//! 4. The caller writes the images and the descriptor, syncs, writes the superblock.
//! 5. `end_commit(true)` makes the images' buddies current; `end_commit(false)` (the commit
//!    failed) changes nothing, and every group stays changed for the next commit.
//!
//! A group is "changed" when an allocate, release, mark or growth changed a bit of it since
//! the last image of it that became durable; a group whose image excluded post-seal runs
//! stays changed, and groups created by growth are changed until first committed.
//!
//! Thread-safety: `Allocator` is `Send + Sync`; every method takes `&self` and one internal
//! mutex for the length of the call (held across `Storage::grow` when the volume grows,
//! which is rare). Only one commit may be in progress at a time (asserted).

mod bitmap;
mod buddy;

use std::fmt;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

pub use bitmap::{BitmapWords, BITMAP_WORDS};
pub use buddy::{
    buddy_offset, decode_buddy, encode_buddy, group_offset, Buddy, BUDDY_A_BLOCK, BUDDY_BYTES,
    BUDDY_MAGIC,
};

use crate::error::{Error, Result};
use crate::types::{CommitEpoch, DiskOffset, BLOCK_BYTES};
use crate::volume::Storage;

/// Blocks per allocation group (128 MiB of 4 KiB blocks; one 4 KiB bitmap).
pub const GROUP_BLOCKS: u64 = 32768;

/// Blocks at the start of every group that are never handed out.
pub const GROUP_RESERVED_BLOCKS: u64 = 8;

/// Bytes per allocation group.
pub const GROUP_BYTES: u64 = GROUP_BLOCKS * BLOCK_BYTES;

/// The least a growth adds to the volume (it also adds at least 1/8 of the volume).
pub const GROWTH_MIN_BYTES: u64 = 16 << 20;

/// Number of groups a volume of `volume_bytes` has (the last may be partial).
pub fn group_count(volume_bytes: u64) -> u64 {
    volume_bytes.div_ceil(GROUP_BYTES)
}

/// Whether the allocator accepts a volume of this length: a block multiple holding
/// group 0's reserved blocks, whose partial last group (if any) holds its reserved blocks.
pub fn volume_bytes_valid(volume_bytes: u64) -> bool {
    let tail_blocks = (volume_bytes / BLOCK_BYTES) % GROUP_BLOCKS;
    volume_bytes.is_multiple_of(BLOCK_BYTES)
        && volume_bytes >= GROUP_RESERVED_BLOCKS * BLOCK_BYTES
        && (tail_blocks == 0 || tail_blocks >= GROUP_RESERVED_BLOCKS)
}

/// The bitmap images a commit writes, and the buddy choice its descriptor records.
pub struct BitmapCommit {
    /// (buddy offset, encoded buddy) for every changed group.
    pub writes: Vec<(DiskOffset, Box<[u8; BUDDY_BYTES]>)>,
    /// Current buddy per group once this commit is durable (one per group of `volume_bytes`).
    pub slots: Vec<u8>,
    /// The volume length these images describe; the descriptor must record it, since
    /// `Allocator::load` needs it (the file itself may be longer after a failed commit).
    pub volume_bytes: u64,
}

impl fmt::Debug for BitmapCommit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BitmapCommit")
            .field(
                "writes",
                &self.writes.iter().map(|w| w.0).collect::<Vec<_>>(),
            )
            .field("slots", &self.slots)
            .field("volume_bytes", &self.volume_bytes)
            .finish()
    }
}

/// A run of blocks, in volume block numbers.
#[derive(Clone, Copy, Debug)]
struct Run {
    start_block: u64,
    blocks: u64,
}

impl Run {
    fn end_block(self) -> u64 {
        self.start_block + self.blocks
    }
}

enum CommitPhase {
    Idle,
    /// `begin_commit` ran; post-seal runs are recorded.
    Sealed {
        post_seal: Vec<Run>,
    },
    /// `commit_images` ran: (group, slot its image went to).
    Imaged {
        post_seal: Vec<Run>,
        imaged: Vec<(usize, u8)>,
    },
}

struct Group {
    bits: Box<BitmapWords>,
    /// Clear bits; bits past the volume's end are set, so all of these are usable.
    free_blocks: u64,
    /// Current (durable) buddy. For a group never committed: the one its first image
    /// must not use.
    slot: u8,
    dirty: bool,
}

impl Group {
    /// A group with only its reserved blocks (and those past the volume's end) allocated.
    fn fresh(end_in_group: u64) -> Group {
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

struct State {
    volume_blocks: u64,
    groups: Vec<Group>,
    /// Where the next search starts (next fit): just past the last run handed out.
    cursor_block: u64,
    /// Set bits inside the volume, reserved blocks included.
    allocated_blocks: u64,
    phase: CommitPhase,
    /// Runs released without a punch (`release_punching` with `defer`), newest last. Log
    /// segments are allocated from them first, so in a burst their blocks are written
    /// again while the file system still holds them; `punch_deferred` gives back what
    /// stays free. Each lies inside one group; a run may have been allocated since (by a
    /// search), so its bits are checked at every use.
    deferred: Vec<DeferredRun>,
}

/// See `State::deferred`.
#[derive(Clone, Copy, Debug)]
struct DeferredRun {
    start_block: u64,
    blocks: u64,
    released_at: Instant,
}

/// How many of the newest deferred runs an allocation looks at.
const DEFERRED_SCAN: usize = 64;

/// Allocations shorter than this (index nodes, descriptors) do not take deferred runs:
/// they would cut segment-sized holes into pieces no segment fits.
const DEFERRED_MIN_BLOCKS: u64 = 16;

/// The volume's block allocator. See the module documentation.
pub struct Allocator {
    state: Mutex<State>,
}

impl fmt::Debug for Allocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.state.lock();
        f.debug_struct("Allocator")
            .field("volume_bytes", &(st.volume_blocks * BLOCK_BYTES))
            .field("groups", &st.groups.len())
            .field("allocated_blocks", &st.allocated_blocks)
            .finish()
    }
}

impl State {
    fn new(volume_blocks: u64, groups: Vec<Group>, allocated_blocks: u64) -> State {
        State {
            volume_blocks,
            groups,
            cursor_block: 0,
            allocated_blocks,
            phase: CommitPhase::Idle,
            deferred: Vec::new(),
        }
    }

    /// A free run of `blocks` aligned to `align_blocks` inside one of the newest deferred
    /// runs, taken out of it (what is left of that run stays listed).
    fn take_deferred(&mut self, blocks: u64, align_blocks: u64) -> Option<u64> {
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

    /// Blocks of group `g` inside the volume.
    fn end_in_group(&self, g: usize) -> u64 {
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
    fn set_run(&mut self, start: u64, end: u64) -> u64 {
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
    fn count_set(&self, start: u64, end: u64) -> u64 {
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
        mut search: impl FnMut(&Group, u64) -> Option<T>,
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
            if let Some(hit) = search(&self.groups[g], from) {
                return Some((g, hit));
            }
        }
        None
    }

    /// First fit from `cursor_block`: the start block of a free aligned run.
    fn find_run(&self, cursor_block: u64, blocks: u64, align_blocks: u64) -> Option<u64> {
        self.search_from(cursor_block, |group, from| {
            if group.free_blocks < blocks {
                return None;
            }
            bitmap::find_run(&group.bits, from, blocks, align_blocks)
        })
        .map(|(g, start)| g as u64 * GROUP_BLOCKS + start)
    }

    /// First free run of up to `max_blocks` from `cursor_block`: (start block, blocks).
    fn find_run_up_to(&self, cursor_block: u64, max_blocks: u64) -> Option<(u64, u64)> {
        self.search_from(cursor_block, |group, from| {
            if group.free_blocks == 0 {
                return None;
            }
            bitmap::first_run_up_to(&group.bits, from, max_blocks)
        })
        .map(|(g, (start, blocks))| (g as u64 * GROUP_BLOCKS + start, blocks))
    }

    /// The smallest volume length (blocks) at which an aligned run of `blocks` fits past
    /// the last allocated block of the last group (or in a new group after it).
    fn needed_end_block(&self, blocks: u64, align_blocks: u64) -> u64 {
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

    /// Grows the volume so that a run ending at `needed_end_block` fits; returns the block
    /// where a search for it should start.
    fn grow(&mut self, storage: &dyn Storage, needed_end_block: u64) -> Result<u64> {
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
    fn extend(&mut self, new_blocks: u64) {
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
    fn take(&mut self, start_block: u64, blocks: u64, post_seal: bool) {
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
    fn try_release(&mut self, offset: DiskOffset, blocks: u64) -> Result<(), String> {
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
    fn assert_consistent(&self) {
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
    /// Fresh volume of `volume_bytes`: only the reserved blocks are allocated, and every
    /// group is changed (the first commit writes them all).
    ///
    /// Panics unless `volume_bytes_valid(volume_bytes)`.
    pub fn create(volume_bytes: u64) -> Allocator {
        assert!(
            volume_bytes_valid(volume_bytes),
            "volume of {volume_bytes} bytes: not a block multiple, or a group too short for its reserved blocks"
        );
        let volume_blocks = volume_bytes / BLOCK_BYTES;
        let count = group_count(volume_bytes);
        let groups = (0..count)
            .map(|g| Group::fresh((volume_blocks - g * GROUP_BLOCKS).min(GROUP_BLOCKS)))
            .collect();
        Allocator {
            state: Mutex::new(State::new(
                volume_blocks,
                groups,
                count * GROUP_RESERVED_BLOCKS,
            )),
        }
    }

    /// Loads each group's current buddy per `slots` (one per group of `volume_bytes`, as
    /// recorded by the commit descriptor), verifying magic, group number, crc, `epoch <=
    /// committed`, and that reserved blocks and blocks past the end are marked allocated.
    /// Errors name the group and the buddy's offset. No group is changed afterwards.
    pub fn load(
        storage: &dyn Storage,
        volume_bytes: u64,
        slots: &[u8],
        committed: CommitEpoch,
    ) -> Result<Allocator> {
        const WHAT: &str = "allocator state";
        if !volume_bytes_valid(volume_bytes) {
            return Err(Error::corruption(
                WHAT,
                DiskOffset::NONE,
                format!(
                    "committed volume length {volume_bytes} is not a valid allocator volume length"
                ),
            ));
        }
        let count = group_count(volume_bytes);
        if slots.len() as u64 != count {
            return Err(Error::corruption(
                WHAT,
                DiskOffset::NONE,
                format!(
                    "{} buddy slots recorded for a volume of {volume_bytes} bytes ({count} groups)",
                    slots.len()
                ),
            ));
        }
        let storage_bytes = storage.len_bytes()?;
        if storage_bytes < volume_bytes {
            return Err(Error::corruption(
                "volume length",
                DiskOffset(storage_bytes),
                format!(
                    "the volume is {storage_bytes} bytes but its last commit covers {volume_bytes}"
                ),
            ));
        }
        let volume_blocks = volume_bytes / BLOCK_BYTES;
        let mut buf = vec![0u8; BUDDY_BYTES];
        let mut groups = Vec::with_capacity(count as usize);
        let mut allocated_blocks = 0;
        for (g, &slot) in (0..count).zip(slots) {
            if slot > 1 {
                return Err(Error::corruption(
                    WHAT,
                    group_offset(g),
                    format!("group {g}: buddy slot {slot} is neither A (0) nor B (1)"),
                ));
            }
            let offset = buddy_offset(g, slot);
            storage.read_at(offset.0, &mut buf)?;
            let buddy = decode_buddy(&buf, g, offset)?;
            let bad = |detail: String| {
                Error::corruption(
                    "allocator bitmap buddy",
                    offset,
                    format!("group {g}: {detail}"),
                )
            };
            if buddy.epoch > committed {
                return Err(bad(format!(
                    "written by epoch {} after the last commit {}",
                    buddy.epoch.0, committed.0
                )));
            }
            let bits = buddy.bitmap;
            let reserved_set = bitmap::count_set(&bits, 0, GROUP_RESERVED_BLOCKS);
            if reserved_set != GROUP_RESERVED_BLOCKS {
                return Err(bad(format!(
                    "only {reserved_set} of the {GROUP_RESERVED_BLOCKS} reserved blocks are marked allocated"
                )));
            }
            let end_in = (volume_blocks - g * GROUP_BLOCKS).min(GROUP_BLOCKS);
            let past_end = GROUP_BLOCKS - end_in;
            if bitmap::count_set(&bits, end_in, GROUP_BLOCKS) != past_end {
                return Err(bad(format!(
                    "blocks past the volume's end (from group block {end_in}) are marked free"
                )));
            }
            let set = bitmap::count_all(&bits);
            allocated_blocks += set - past_end;
            groups.push(Group {
                free_blocks: GROUP_BLOCKS - set,
                bits,
                slot,
                dirty: false,
            });
        }
        Ok(Allocator {
            state: Mutex::new(State::new(volume_blocks, groups, allocated_blocks)),
        })
    }

    /// First fit from a rotating cursor: a run of `blocks` free blocks whose start is a
    /// multiple of `align_blocks` (a power of two, so within its group too), never crossing
    /// a group boundary or a reserved block. When nothing fits, grows the volume
    /// (`storage.grow`) by at least 1/8 of its size and `GROWTH_MIN_BYTES`, and new groups
    /// get their reserved blocks. `post_seal`: the run belongs to the epoch after the
    /// running commit and is left out of its images (see the module documentation); no
    /// effect when no commit is running.
    ///
    /// Panics when the run could never fit in a group. Errors: only a failed `grow`, which
    /// leaves the allocator unchanged.
    pub fn allocate(
        &self,
        storage: &dyn Storage,
        blocks: u64,
        align_blocks: u64,
        post_seal: bool,
    ) -> Result<DiskOffset> {
        assert!(blocks >= 1, "allocating an empty run");
        assert!(
            align_blocks.is_power_of_two() && align_blocks <= GROUP_BLOCKS,
            "alignment of {align_blocks} blocks is not a power of two up to a group"
        );
        assert!(
            bitmap::align_up(GROUP_RESERVED_BLOCKS, align_blocks) + blocks <= GROUP_BLOCKS,
            "a run of {blocks} blocks aligned to {align_blocks} never fits in a group"
        );
        let mut st = self.state.lock();
        let deferred = if blocks >= DEFERRED_MIN_BLOCKS {
            st.take_deferred(blocks, align_blocks)
        } else {
            None
        };
        if let Some(start_block) = deferred {
            // Reuse out of the next-fit sweep: the cursor stays where the sweep is.
            let cursor = st.cursor_block;
            st.take(start_block, blocks, post_seal);
            st.cursor_block = cursor;
            return Ok(DiskOffset(start_block * BLOCK_BYTES));
        }
        let start_block = match st.find_run(st.cursor_block, blocks, align_blocks) {
            Some(start) => start,
            None => {
                let needed = st.needed_end_block(blocks, align_blocks);
                let from = st.grow(storage, needed)?;
                st.find_run(from, blocks, align_blocks)
                    .expect("the volume was grown to fit the run")
            }
        };
        debug_assert_eq!(start_block % align_blocks, 0);
        st.take(start_block, blocks, post_seal);
        Ok(DiskOffset(start_block * BLOCK_BYTES))
    }

    /// Like `allocate(…, 1, 1, false)` but returns the first free run (from the cursor) of
    /// up to `max_blocks`, so a commit can write many nodes in few runs: (offset, blocks).
    pub fn allocate_up_to(
        &self,
        storage: &dyn Storage,
        max_blocks: u64,
    ) -> Result<(DiskOffset, u64)> {
        assert!(max_blocks >= 1, "allocating an empty run");
        let max_blocks = max_blocks.min(GROUP_BLOCKS - GROUP_RESERVED_BLOCKS);
        let mut st = self.state.lock();
        let (start_block, blocks) = match st.find_run_up_to(st.cursor_block, max_blocks) {
            Some(run) => run,
            None => {
                let needed = st.needed_end_block(max_blocks, 1);
                let from = st.grow(storage, needed)?;
                st.find_run_up_to(from, max_blocks)
                    .expect("the volume was grown to fit the run")
            }
        };
        assert!((1..=max_blocks).contains(&blocks));
        st.take(start_block, blocks, false);
        Ok((DiskOffset(start_block * BLOCK_BYTES), blocks))
    }

    /// Frees a run. Panics (programmer error) unless the run is block-aligned, inside the
    /// volume, clear of reserved blocks and wholly allocated — a double free included.
    /// Runs named by bytes read from disk go through [`Allocator::try_release`] instead.
    pub fn release(&self, offset: DiskOffset, blocks: u64) {
        if let Err(why) = self.try_release(offset, blocks) {
            panic!("{why}");
        }
    }

    /// Frees a run if it may be freed; otherwise changes nothing and says why. Recovery
    /// uses it for the free log, whose runs come from disk and may be anything.
    pub fn try_release(&self, offset: DiskOffset, blocks: u64) -> Result<(), String> {
        self.state.lock().try_release(offset, blocks)
    }

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
        let mut st = self.state.lock();
        let now = Instant::now();
        let mut due: Vec<(u64, u64)> = Vec::new();
        st.deferred.retain(|d| {
            let old = now.duration_since(d.released_at) >= min_age;
            if old {
                due.push((d.start_block, d.start_block + d.blocks));
            }
            !old
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

    /// Bytes of the runs released unpunched and not yet given to `punch_deferred`: free
    /// in the bitmap, still held by the file system (unless allocated again since).
    pub fn deferred_bytes(&self) -> u64 {
        self.state.lock().deferred_blocks() * BLOCK_BYTES
    }

    /// Recovery: marks a run allocated (e.g. a replayed log segment). Returns false if some
    /// of it was already allocated, lies past the volume's end (which counts as allocated)
    /// or the offset is not block-aligned (then nothing changes); the blocks inside the
    /// volume are allocated afterwards either way.
    pub fn mark_allocated(&self, offset: DiskOffset, blocks: u64) -> bool {
        if !offset.block_aligned() {
            return false;
        }
        let start = offset.0 / BLOCK_BYTES;
        let end = start.saturating_add(blocks);
        let mut st = self.state.lock();
        let inside_end = end.min(st.volume_blocks);
        let mut all_were_free = end <= st.volume_blocks;
        if start < inside_end {
            all_were_free &= st.set_run(start, inside_end) == inside_end - start;
        }
        all_were_free
    }

    /// Whether every block touching `offset .. offset + blocks * BLOCK_BYTES` is allocated
    /// (blocks past the volume's end count as allocated; an empty run is).
    pub fn is_allocated(&self, offset: DiskOffset, blocks: u64) -> bool {
        if blocks == 0 {
            return true;
        }
        let start = offset.0 / BLOCK_BYTES;
        let end = offset
            .0
            .saturating_add(blocks.saturating_mul(BLOCK_BYTES))
            .div_ceil(BLOCK_BYTES);
        let st = self.state.lock();
        let inside_end = end.min(st.volume_blocks);
        start >= inside_end || st.count_set(start, inside_end) == inside_end - start
    }

    /// Recovery: covers a file that grew after the last commit (segments allocated since
    /// live there and replay marks them). Rounds down to whole blocks and keeps a partial
    /// last group big enough for its reserved blocks; never shrinks.
    pub fn cover_file(&self, file_len_bytes: u64) {
        let mut st = self.state.lock();
        let mut blocks = file_len_bytes / BLOCK_BYTES;
        let tail_blocks = blocks % GROUP_BLOCKS;
        if tail_blocks != 0 && tail_blocks < GROUP_RESERVED_BLOCKS {
            blocks -= tail_blocks;
        }
        if blocks > st.volume_blocks {
            st.extend(blocks);
        }
    }

    /// Allocated blocks inside the volume, reserved blocks included.
    pub fn allocated_blocks(&self) -> u64 {
        self.state.lock().allocated_blocks
    }

    /// The volume length the allocator covers (grows with `allocate`).
    pub fn volume_bytes(&self) -> u64 {
        self.state.lock().volume_blocks * BLOCK_BYTES
    }

    /// Current committed buddy per group. For a group not yet committed (fresh volume,
    /// growth): the buddy its first image will not use.
    pub fn slots(&self) -> Vec<u8> {
        self.state.lock().groups.iter().map(|g| g.slot).collect()
    }

    /// Seals the state for a commit: from now until `end_commit`, runs from
    /// `allocate(…, post_seal = true)` are left out of this commit's images.
    /// Panics if a commit is already in progress.
    pub fn begin_commit(&self) {
        let mut st = self.state.lock();
        assert!(
            matches!(st.phase, CommitPhase::Idle),
            "begin_commit while a commit is in progress"
        );
        st.phase = CommitPhase::Sealed {
            post_seal: Vec::new(),
        };
    }

    /// Images of the changed groups as commit `epoch` must write them: live bits minus the
    /// recorded post-seal runs, each addressed to the buddy the last durable commit does
    /// not use. Groups whose image left out post-seal runs stay changed. Panics unless
    /// called once, after `begin_commit`.
    pub fn commit_images(&self, epoch: CommitEpoch) -> BitmapCommit {
        let mut st = self.state.lock();
        let st = &mut *st;
        let post_seal = match std::mem::replace(&mut st.phase, CommitPhase::Idle) {
            CommitPhase::Sealed { post_seal } => post_seal,
            _ => panic!("commit_images without begin_commit, or twice in one commit"),
        };
        let mut writes = Vec::new();
        let mut imaged = Vec::new();
        for (g, group) in st.groups.iter_mut().enumerate() {
            if !group.dirty {
                continue;
            }
            let mut bits = group.bits.clone();
            let mut excluded = false;
            let base = g as u64 * GROUP_BLOCKS;
            for run in &post_seal {
                let lo = run.start_block.max(base);
                let hi = run.end_block().min(base + GROUP_BLOCKS);
                if lo < hi {
                    excluded |= bitmap::clear_range(&mut bits, lo - base, hi - base) > 0;
                }
            }
            let slot = 1 - group.slot;
            writes.push((
                buddy_offset(g as u64, slot),
                encode_buddy(g as u64, epoch, &bits),
            ));
            imaged.push((g, slot));
            // Changes from here on (and the runs left out) go to the next commit.
            group.dirty = excluded;
        }
        let mut slots: Vec<u8> = st.groups.iter().map(|g| g.slot).collect();
        for &(g, slot) in &imaged {
            slots[g] = slot;
        }
        st.phase = CommitPhase::Imaged { post_seal, imaged };
        BitmapCommit {
            writes,
            slots,
            volume_bytes: st.volume_blocks * BLOCK_BYTES,
        }
    }

    /// Ends a commit whose superblock is durable, like `end_commit(true)`, and seals again
    /// at once, still recording the post-seal runs of the commit just ended: the next
    /// commit is a repeat of it (the same durable state under a new epoch), whose images
    /// must leave out everything allocated after that seal too. Panics without
    /// `commit_images`.
    pub fn end_commit_keep_seal(&self) {
        let mut st = self.state.lock();
        match std::mem::replace(&mut st.phase, CommitPhase::Idle) {
            CommitPhase::Imaged { imaged, post_seal } => {
                for (g, slot) in imaged {
                    st.groups[g].slot = slot;
                }
                st.phase = CommitPhase::Sealed { post_seal };
            }
            _ => panic!("end_commit_keep_seal without commit_images"),
        }
    }

    /// Ends the commit. `committed`: its superblock is durable, so the images' buddies
    /// become current. Otherwise nothing changes and every imaged group stays changed.
    /// Panics without `begin_commit`, or with `committed` but no `commit_images`.
    pub fn end_commit(&self, committed: bool) {
        let mut st = self.state.lock();
        match std::mem::replace(&mut st.phase, CommitPhase::Idle) {
            CommitPhase::Idle => panic!("end_commit without begin_commit"),
            CommitPhase::Sealed { .. } => {
                assert!(!committed, "end_commit(true) without commit_images");
            }
            CommitPhase::Imaged { imaged, .. } => {
                for (g, slot) in imaged {
                    let group = &mut st.groups[g];
                    if committed {
                        group.slot = slot;
                    } else {
                        group.dirty = true;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
