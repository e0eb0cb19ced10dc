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
//! Files: `mod.rs` the `Allocator` handle (create, load, allocate, release, recovery's
//! marks, counters); `state.rs` the in-memory bitmap and its runs (search, growth, checked
//! release); `punch.rs` giving freed runs back to the file system, at once or deferred;
//! `commit.rs` the commit phases and images; `bitmap.rs` bit ranges of one group's bitmap;
//! `buddy.rs` the on-disk buddy format.
//!
//! Thread-safety: `Allocator` is `Send + Sync`; every method takes `&self` and one internal
//! mutex for the length of the call (held across `Storage::grow` when the volume grows,
//! which is rare). Only one commit may be in progress at a time (asserted).

mod bitmap;
mod buddy;
mod commit;
mod punch;
mod state;

use std::fmt;

use parking_lot::Mutex;

pub use bitmap::{BitmapWords, BITMAP_WORDS};
pub use buddy::{
    buddy_offset, decode_buddy, encode_buddy, group_offset, Buddy, BUDDY_A_BLOCK, BUDDY_BYTES,
    BUDDY_MAGIC,
};
pub use commit::BitmapCommit;

use crate::error::{Error, Result};
use crate::types::{CommitEpoch, DiskOffset, BLOCK_BYTES};
use crate::volume::Storage;
use punch::DEFERRED_MIN_BLOCKS;
use state::{Group, State};

/// Blocks per allocation group (128 MiB of 4 KiB blocks; one 4 KiB bitmap).
pub const GROUP_BLOCKS: u64 = 32768;

/// Blocks at the start of every group that are never handed out.
pub const GROUP_RESERVED_BLOCKS: u64 = 8;

/// Bytes per allocation group.
pub const GROUP_BYTES: u64 = GROUP_BLOCKS * BLOCK_BYTES;

// A volume over several members places whole groups in member slots and keeps a slot
// header in a spare reserved block (never handed out, never a bitmap buddy).
const _: () = assert!(crate::volume::slot_header::SLOT_BYTES == GROUP_BYTES);
const _: () = assert!(
    crate::volume::slot_header::HEADER_BLOCK < GROUP_RESERVED_BLOCKS
        && crate::volume::slot_header::HEADER_BLOCK >= buddy::BUDDY_A_BLOCK + 4
);

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

    /// As `allocate`, preferring a run on member `member` of a volume over several members
    /// (`Storage::member_of`): first fit from the cursor among that member's groups; when
    /// none has room (or `member` is `None`), exactly `allocate`, which may grow the
    /// volume and place the run on any member.
    pub fn allocate_on(
        &self,
        storage: &dyn Storage,
        blocks: u64,
        align_blocks: u64,
        post_seal: bool,
        member: Option<usize>,
    ) -> Result<DiskOffset> {
        if let Some(member) = member {
            let mut st = self.state.lock();
            let on_member = |g: usize| storage.member_of(g as u64 * GROUP_BYTES) == Some(member);
            if let Some(start_block) =
                st.find_run_where(st.cursor_block, blocks, align_blocks, on_member)
            {
                st.take(start_block, blocks, post_seal);
                return Ok(DiskOffset(start_block * BLOCK_BYTES));
            }
            // The chosen member's groups are full: grow the volume by a group placed on
            // it (members grow independently). Falling back to the others' room instead
            // capped a member at the groups it had: on members of 10, 20 and 40 MiB/s,
            // least-weighted dispatch filled the fast member's one group and then sent
            // its segments to the slow ones, which set the pace.
            if let Some(start_block) = grow_on(&mut st, storage, member, blocks, align_blocks)
                .and_then(|from| st.find_run_where(from, blocks, align_blocks, on_member))
            {
                st.take(start_block, blocks, post_seal);
                return Ok(DiskOffset(start_block * BLOCK_BYTES));
            }
        }
        self.allocate(storage, blocks, align_blocks, post_seal)
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

    /// As `allocate_up_to`, preferring a run on member `member` of a volume over several
    /// members, as `allocate_on` does for segments: the first free run among that
    /// member's groups; when none has a free block, a new group placed on it; when the
    /// member cannot grow (or `member` is `None`), exactly `allocate_up_to`. For a
    /// commit's node runs, placed by the dispatch policy (`Storage::dispatch_member`).
    pub fn allocate_up_to_on(
        &self,
        storage: &dyn Storage,
        max_blocks: u64,
        member: Option<usize>,
    ) -> Result<(DiskOffset, u64)> {
        if let Some(member) = member {
            assert!(max_blocks >= 1, "allocating an empty run");
            let max_blocks = max_blocks.min(GROUP_BLOCKS - GROUP_RESERVED_BLOCKS);
            let mut st = self.state.lock();
            let on_member = |g: usize| storage.member_of(g as u64 * GROUP_BYTES) == Some(member);
            let run = st
                .find_run_up_to_where(st.cursor_block, max_blocks, on_member)
                .or_else(|| {
                    grow_on(&mut st, storage, member, max_blocks, 1)
                        .and_then(|from| st.find_run_up_to_where(from, max_blocks, on_member))
                });
            if let Some((start_block, blocks)) = run {
                assert!((1..=max_blocks).contains(&blocks));
                st.take(start_block, blocks, false);
                return Ok((DiskOffset(start_block * BLOCK_BYTES), blocks));
            }
        }
        self.allocate_up_to(storage, max_blocks)
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
}

/// Grows the volume (allocator lock held) by a new group placed on `member`, with room
/// for an aligned run of `blocks`: the search start for the run (`State::grow`'s), or
/// `None` when the volume cannot grow so (past its maximum size, or the member's device
/// is full: the caller then takes room on any member).
fn grow_on(
    st: &mut State,
    storage: &dyn Storage,
    member: usize,
    blocks: u64,
    align_blocks: u64,
) -> Option<u64> {
    let new_group = st.groups_len() as u64;
    let needed =
        new_group * GROUP_BLOCKS + bitmap::align_up(GROUP_RESERVED_BLOCKS, align_blocks) + blocks;
    if !volume_bytes_valid(needed * BLOCK_BYTES) {
        return None;
    }
    storage.place_growth_on(Some(member));
    let grown = st.grow(storage, needed);
    storage.place_growth_on(None);
    grown.ok()
}

#[cfg(test)]
mod tests;
