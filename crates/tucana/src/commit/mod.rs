//! Commits: copy-on-write persistence of every region's index and of the allocator at a
//! new commit epoch (paper §3.3), made atomic by the superblock slot write.
//!
//! Protocol (crash analysis in DESIGN.md):
//! 1. apply releasable frees to the live bitmap (punching holes in large extents, so the
//!    file system gets the bytes back); start recording post-seal allocations;
//! 2. seal every region under its writer lock (an O(1) epoch bump: writers go on at once,
//!    copying sealed nodes on write);
//! 3. flush every log tail (records up to the seal point reach the file);
//! 4. persist each sealed tree's unpersisted nodes to newly allocated blocks;
//! 5. write the descriptor (region roots, log positions, segment counts, free log) to a
//!    new extent and the changed bitmap groups to their spare buddies;
//! 6. sync; write the superblock slot `epoch % 2`; sync.
//!
//! Only one commit runs at a time (`DbInner::commit_state`). Failure at any step poisons
//! the database: nothing after it is acknowledged, and reopening recovers the previous
//! commit plus the log.

pub mod descriptor;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::db::{CommitState, DbInner};
use crate::error::{Error, Result};
use crate::index::{Tree, NODE_BYTES};
use crate::log::tail::Tail;
use crate::log::SegmentStats;
use crate::region::{Region, SealedRegion, Writer};
use crate::types::{CommitEpoch, DiskOffset, RegionId, SeqNo, TreeEpoch, BLOCK_BYTES};
use crate::volume::superblock::Superblock;
use descriptor::{Descriptor, RegionDesc};

/// Nodes are allocated in runs of up to this many blocks, so a commit writes them with
/// few large writes.
const NODE_RUN_BLOCKS: u64 = 256;

impl DbInner {
    pub(crate) fn commit_locked(&self, cs: &mut CommitState) -> Result<()> {
        self.guarded(cs, |db, cs, started| {
            db.commit_steps(cs, started, false).map(|_| ())
        })
    }

    /// Two commits back to back, the second a *repeat* of the first: the same roots, log
    /// positions and segment lists under a new epoch, in the other superblock slot. It
    /// writes no node, only a descriptor and bitmap images (and two fsyncs), and leaves
    /// both slots naming the same state, so whatever the first commit stopped
    /// referencing (segments garbage collection retired before its seal, copied nodes)
    /// may be freed at once, not one commit interval later (DESIGN.md, "Commit pairs").
    pub(crate) fn commit_pair_locked(&self, cs: &mut CommitState) -> Result<()> {
        self.guarded(cs, |db, cs, started| {
            let (regions, descs) = db.commit_steps(cs, started, true)?;
            db.repeat_steps(cs, started, &regions, descs)
        })
    }

    /// Runs commit steps; on failure poisons the database and ends a commit left open in
    /// the allocator. A closed database still commits (its final commit); a poisoned one
    /// never does.
    fn guarded(
        &self,
        cs: &mut CommitState,
        steps: impl FnOnce(&Self, &mut CommitState, &mut bool) -> Result<()>,
    ) -> Result<()> {
        if self.shared.is_poisoned() {
            return Err(Error::Poisoned);
        }
        let mut started = false;
        let result = steps(self, cs, &mut started);
        if result.is_err() {
            self.shared.poison();
            if started {
                self.shared.allocator.end_commit(false);
            }
        }
        result
    }

    /// A full commit. `keep_seal`: a repeat follows at once, so the allocator goes on
    /// leaving out of its images what was allocated after this seal, and writers go on
    /// allocating as after the seal. Returns the regions and their descriptor entries.
    fn commit_steps(
        &self,
        cs: &mut CommitState,
        started: &mut bool,
        keep_seal: bool,
    ) -> Result<(Vec<Arc<Region>>, Vec<RegionDesc>)> {
        let shared = &self.shared;
        let storage = shared.volume.storage().clone();
        let allocator = &shared.allocator;

        // 1. Frees that are safe now become free space in this commit's bitmap.
        let releasable = std::mem::take(&mut shared.frees.lock().releasable);
        release_extents(shared, &releasable);
        allocator.begin_commit();
        *started = true;

        // 2. Seal.
        let regions = self.region_list();
        let mut sealed: Vec<SealedRegion> = Vec::with_capacity(regions.len());
        for region in &regions {
            let mut w = region.writer.lock();
            sealed.push(region.seal(&mut w));
        }
        shared.log_bytes_since_commit.store(0, Ordering::Relaxed);

        // 3. The log up to every seal point reaches the file.
        for region in &regions {
            region.flush_tail()?;
            region.flush_gc_tail()?;
        }

        // 4. Persist trees.
        let mut images: Vec<(DiskOffset, Box<[u8; NODE_BYTES]>)> = Vec::new();
        let mut run = (DiskOffset::NONE, 0u64);
        let mut roots = Vec::with_capacity(regions.len());
        {
            let mut alloc = || -> Result<DiskOffset> {
                if run.1 == 0 {
                    run = allocator.allocate_up_to(storage.as_ref(), NODE_RUN_BLOCKS)?;
                }
                let at = run.0;
                run = (at.plus_bytes(BLOCK_BYTES), run.1 - 1);
                Ok(at)
            };
            for (region, s) in regions.iter().zip(&sealed) {
                roots.push(
                    region
                        .tree
                        .persist(s.root_word, region.id, &mut alloc, &mut images)?,
                );
            }
        }
        if run.1 > 0 {
            allocator.release(run.0, run.1);
        }
        write_coalesced(storage.as_ref(), &mut images, &shared.bytes_written)?;

        // 5-6. Descriptor, bitmaps, superblock.
        let descs: Vec<RegionDesc> = regions
            .iter()
            .zip(&sealed)
            .zip(&roots)
            .map(|((region, s), root)| region_desc(region, s, *root))
            .collect();
        let descs = self.write_commit(cs, &regions, descs, keep_seal)?;
        if !keep_seal {
            *started = false;
        }
        self.commit_durable(&regions, &descs, !keep_seal);
        Ok((regions, descs))
    }

    /// The repeat commit of a pair (`commit_pair_locked`): `descs` as the commit just
    /// made wrote them, under the next epoch. Nothing was sealed or written since that
    /// commit's seal as far as this one is concerned: the allocator still leaves out
    /// what was allocated after it, and the log positions are that seal's, so open
    /// replays the same window either slot is read from.
    fn repeat_steps(
        &self,
        cs: &mut CommitState,
        started: &mut bool,
        regions: &[Arc<Region>],
        descs: Vec<RegionDesc>,
    ) -> Result<()> {
        assert!(
            cs.dropped.is_empty(),
            "a dropped region's extents wait for a full commit, not a repeat"
        );
        // Frees that passed the grace period since the first commit began: reclaimed by
        // the rule every commit start relies on (neither durable slot references them).
        let releasable = std::mem::take(&mut self.shared.frees.lock().releasable);
        release_extents(&self.shared, &releasable);
        let descs = self.write_commit(cs, regions, descs, false)?;
        *started = false;
        self.commit_durable(regions, &descs, true);
        Ok(())
    }

    /// Steps 5 and 6 of a commit of `descs` at the next epoch: the free log, the
    /// descriptor and the changed bitmap groups to new places, sync, the superblock slot,
    /// sync; then the allocator's images become current (`keep_seal`: and it goes on
    /// recording post-seal runs, for a repeat). Returns `descs`.
    fn write_commit(
        &self,
        cs: &mut CommitState,
        regions: &[Arc<Region>],
        descs: Vec<RegionDesc>,
        keep_seal: bool,
    ) -> Result<Vec<RegionDesc>> {
        let shared = &self.shared;
        let storage = shared.volume.storage();
        let allocator = &shared.allocator;
        let epoch = CommitEpoch(cs.epoch.0 + 1);
        let mut new_deferred: Vec<(DiskOffset, u64)> = std::mem::take(&mut cs.dropped);
        if let Some(prev) = cs.descriptors[1] {
            new_deferred.push(prev);
        }
        let mut free_log: Vec<(DiskOffset, u64)> = Vec::new();
        free_log.extend_from_slice(&cs.deferred);
        free_log.extend_from_slice(&new_deferred);
        {
            let frees = shared.frees.lock();
            free_log.extend_from_slice(&frees.limbo);
            free_log.extend_from_slice(&frees.releasable);
        }
        for (region, d) in regions.iter().zip(&descs) {
            for off in region.tree.retired_disk_blocks(d.tree_epoch) {
                free_log.push((off, 1));
            }
            // Segments retired after the seal are still in the sealed segment list.
            free_log.extend(region.retired_segment_extents(d.tree_epoch));
        }
        free_log.sort();
        free_log.dedup();

        let mut desc = Descriptor {
            epoch,
            next_region_id: cs.next_region_id,
            volume_bytes: 0,
            bitmap_slots: allocator.slots(),
            free_log,
            regions: descs,
        };
        // Room for the descriptor plus slack for groups added by its own allocation.
        let estimate = desc.encode().len() as u64 + BLOCK_BYTES;
        let desc_blocks = estimate.div_ceil(BLOCK_BYTES);
        let desc_at = allocator.allocate(storage.as_ref(), desc_blocks, 1, false)?;
        let bitmaps = allocator.commit_images(epoch);
        desc.bitmap_slots = bitmaps.slots.clone();
        desc.volume_bytes = bitmaps.volume_bytes;
        let mut padded = desc.encode();
        assert!(padded.len() as u64 <= desc_blocks * BLOCK_BYTES);
        // The superblock names the whole padded extent: open frees exactly what was
        // allocated once this descriptor is superseded (counting only the encoded bytes
        // leaked the slack block at every reopen).
        padded.resize((desc_blocks * BLOCK_BYTES) as usize, 0);
        storage.write_at(desc_at.0, &padded)?;
        shared
            .bytes_written
            .fetch_add(padded.len() as u64, Ordering::Relaxed);
        for (at, image) in &bitmaps.writes {
            storage.write_at(at.0, &image[..])?;
            shared
                .bytes_written
                .fetch_add(image.len() as u64, Ordering::Relaxed);
        }

        // Make it all durable, then switch the superblock.
        storage.sync()?;
        let sb = Superblock {
            epoch,
            descriptor: desc_at,
            descriptor_bytes: padded.len() as u64,
            descriptor_crc: crc32c::crc32c(&padded),
            volume_bytes: desc.volume_bytes,
        };
        storage.write_at(
            crate::volume::superblock::slot_offset(epoch).0,
            &sb.encode()[..],
        )?;
        storage.sync()?;
        if keep_seal {
            allocator.end_commit_keep_seal();
        } else {
            allocator.end_commit(true);
        }

        // The commit is durable.
        cs.epoch = epoch;
        let old_deferred = std::mem::replace(&mut cs.deferred, new_deferred);
        cs.descriptors = [cs.descriptors[1], Some((desc_at, desc_blocks))];
        shared.release_after_readers(old_deferred);
        Ok(desc.regions)
    }

    /// After a durable commit of `descs`: each region's durable seals and committed root
    /// move on, and what neither superblock slot references any more (and no snapshot
    /// reads) goes on its way to the allocator. `end_seal`: writers stop allocating as
    /// after a seal (no repeat follows).
    fn commit_durable(&self, regions: &[Arc<Region>], descs: &[RegionDesc], end_seal: bool) {
        let shared = &self.shared;
        for (region, d) in regions.iter().zip(descs) {
            let durable = {
                let mut w = region.writer.lock();
                if end_seal {
                    w.sealed_for_commit = false;
                }
                let mut e = region.durable_epochs.lock();
                *e = [e[1], Some(d.tree_epoch)];
                e[0]
            };
            *region.committed_root.lock() = d.root;
            // Retired nodes unreferenced by both superblock slots' commits can go.
            if let Some(durable) = durable {
                let blocks = region.tree.reclaim(durable, region.oldest_snapshot());
                shared.release_after_readers(blocks.into_iter().map(|b| (b, 1)).collect());
                let (now, after_readers) = region.reclaim_segments(durable);
                let bytes: u64 = now
                    .iter()
                    .chain(&after_readers)
                    .map(|(_, b)| b * BLOCK_BYTES)
                    .sum();
                shared
                    .gc_reclaimed_bytes
                    .fetch_add(bytes, Ordering::Relaxed);
                shared.frees.lock().releasable.extend(now);
                shared.release_after_readers(after_readers);
            }
        }
        shared.commits.fetch_add(1, Ordering::Relaxed);
    }

    /// Creates a region with its first log segment and commits, so that the region
    /// and anything written to it later survive a crash.
    pub(crate) fn create_region(&self, name: &str) -> Result<Arc<Region>> {
        if name.is_empty() || name.len() > 255 {
            return Err(Error::InvalidArgument(
                "a keyspace name is 1 to 255 bytes".into(),
            ));
        }
        let mut cs = self.commit_state.lock();
        if let Some(region) = self.regions.read().get(name) {
            return Ok(region.clone());
        }
        let shared = &self.shared;
        shared.check_writable()?;
        let id = RegionId(cs.next_region_id);
        let size = shared.options.log_segment_bytes;
        let blocks = size / BLOCK_BYTES;
        let storage = shared.volume.storage();
        let base = shared
            .allocator
            .allocate(storage.as_ref(), blocks, blocks, false)?;
        cs.next_region_id += 1;
        let mut writer = Writer::new(1, SeqNo(0), 1);
        if shared.options.gc {
            writer.dead_records.insert(base.0, Vec::new());
        }
        writer.segments.insert(
            base.0,
            SegmentStats {
                size_bytes: size,
                written_bytes: 0,
                live_bytes: 0,
                order: 0,
            },
        );
        let region = Arc::new(Region::new(
            shared.clone(),
            id,
            name.to_string(),
            Tree::new(id, TreeEpoch(1)),
            Tail::new(base, size),
            writer,
            0,
        ));
        self.regions
            .write()
            .insert(name.to_string(), region.clone());
        self.commit_locked(&mut cs)?;
        Ok(region)
    }

    /// Drops a region durably; its blocks are freed once no commit on disk needs them.
    pub(crate) fn drop_region(&self, name: &str) -> Result<()> {
        let mut cs = self.commit_state.lock();
        self.shared.check_writable()?;
        let region = self
            .regions
            .write()
            .remove(name)
            .ok_or_else(|| Error::KeyspaceNotFound(name.to_string()))?;
        region.dropped.store(true, Ordering::Release);
        // Wait for a write in progress; later ones see `dropped`.
        let w = region.writer.lock();
        let mut extents: Vec<(DiskOffset, u64)> = w
            .segments
            .iter()
            .map(|(off, s)| (DiskOffset(*off), s.size_bytes / BLOCK_BYTES))
            .collect();
        drop(w);
        // Segments garbage collection retired and that are not yet on their way to the
        // allocator (those are in `Shared::frees` and stay there).
        extents.extend(region.retired_segments.lock().drain(..).map(|r| r.extent()));
        let root = *region.committed_root.lock();
        crate::check::collect_tree_blocks(region.as_ref(), root, &mut |off| {
            extents.push((off, 1))
        })?;
        for off in region.tree.retired_disk_blocks(TreeEpoch(u64::MAX)) {
            extents.push((off, 1));
        }
        extents.sort();
        extents.dedup();
        cs.dropped.extend(extents);
        self.commit_locked(&mut cs)
    }
}

fn region_desc(region: &Region, s: &SealedRegion, root: DiskOffset) -> RegionDesc {
    RegionDesc {
        id: region.id,
        name: region.name.clone(),
        tree_epoch: s.tree_epoch,
        root,
        generation: s.generation,
        next_seq: s.next_seq,
        tail: s.tail,
        tail_size_bytes: s.tail_size_bytes,
        tail_used_bytes: s.tail_used_bytes,
        gc_tail: s.gc_tail,
        keys: s.keys,
        segments: s.segments.clone(),
    }
}

/// Extents at least this long are punched when they return to the allocator: log
/// segments (64 KiB at least) and runs of nodes; single blocks are not worth a system call.
const PUNCH_MIN_BLOCKS: u64 = 16;

/// Gives extents nothing can reach any more back: blocks free in the live bitmap, and
/// the free runs they lie in (merged with free neighbours, at least `PUNCH_MIN_BLOCKS`)
/// punched out of the file. Only between commits (the caller holds the commit state).
/// A failed punch loses nothing (the bytes stay allocated in the file), so it is not an
/// error.
///
/// With the collector's loop running, log segments (and other large extents) are not
/// punched here:
/// the next segments are allocated from them, and `punch_deferred` gives back those
/// still free `DEFERRED_PUNCH_AGE` later (`Allocator::release_punching`). A GC burst
/// frees and reuses hundreds of MiB a second; punching each segment as it came back, then
/// allocating it again, held the file's inode lock (every `pwrite` waits for it) for a
/// quarter of the burst on a file system that discards punched blocks synchronously.
pub(crate) fn release_extents(shared: &crate::db::Shared, extents: &[(DiskOffset, u64)]) {
    let storage = shared.volume.storage();
    shared.allocator.release_punching(
        extents,
        PUNCH_MIN_BLOCKS,
        // Only the loop punches deferred runs between a forced pass and close.
        shared.options.gc && shared.options.runs_background_threads(),
        &mut |offset, len_bytes| {
            let _ = storage.punch_hole(offset, len_bytes);
        },
    );
}

/// How long a released log segment waits, unpunched, for a new segment to reuse it.
pub(crate) const DEFERRED_PUNCH_AGE: std::time::Duration = std::time::Duration::from_millis(500);

/// Punches the free blocks of the runs `release_extents` deferred at least `min_age`
/// ago (`Duration::ZERO`: all of them). Returns the bytes punched.
pub(crate) fn punch_deferred(shared: &crate::db::Shared, min_age: std::time::Duration) -> u64 {
    let storage = shared.volume.storage();
    shared
        .allocator
        .punch_deferred(min_age, &mut |offset, len_bytes| {
            let _ = storage.punch_hole(offset, len_bytes);
        })
}

/// One block of memory aligned to a block: runs of them are what uncached (`O_DIRECT`)
/// writes take.
#[repr(C, align(4096))]
#[derive(Clone, Copy)]
struct AlignedBlock([u8; NODE_BYTES]);

const _: () = assert!(std::mem::size_of::<AlignedBlock>() == NODE_BYTES);
const _: () = assert!(NODE_BYTES as u64 == BLOCK_BYTES);

/// Writes node images with one write per run of adjacent blocks, past the page cache
/// (`Storage::write_uncached_at`): the index lives in memory and only recovery reads its
/// images, and a commit pair during GC rewrites every leaf (copying them into the page
/// cache took 40% of the committer's CPU).
fn write_coalesced(
    storage: &dyn crate::volume::Storage,
    images: &mut [(DiskOffset, Box<[u8; NODE_BYTES]>)],
    bytes_written: &std::sync::atomic::AtomicU64,
) -> Result<()> {
    images.sort_by_key(|(off, _)| *off);
    let mut i = 0;
    let mut run: Vec<AlignedBlock> = Vec::new();
    while i < images.len() {
        let start = images[i].0;
        run.clear();
        let mut j = i;
        while j < images.len() && images[j].0 .0 == start.0 + (j - i) as u64 * BLOCK_BYTES {
            run.push(AlignedBlock(*images[j].1));
            j += 1;
        }
        // SAFETY: `AlignedBlock` is a byte array with no padding (its size is its
        // alignment, asserted above), so the run's initialized elements are
        // `run.len() * NODE_BYTES` initialized bytes, borrowed no longer than `run`.
        let bytes = unsafe {
            std::slice::from_raw_parts(run.as_ptr().cast::<u8>(), run.len() * NODE_BYTES)
        };
        storage.write_uncached_at(start.0, bytes)?;
        bytes_written.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        i = j;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::volume::superblock::{slot_offset, Superblock, SLOT_BYTES};

    use super::*;

    /// Both superblock slots' descriptors, oldest first.
    fn slots(db: &crate::Database) -> [(Superblock, Descriptor); 2] {
        let storage = db.inner.shared.volume.storage().clone();
        let read = |slot: usize| {
            let mut bytes = vec![0u8; SLOT_BYTES];
            storage
                .read_at(slot as u64 * BLOCK_BYTES, &mut bytes)
                .unwrap();
            let sb = Superblock::decode(&bytes, slot).unwrap();
            let mut desc = vec![0u8; sb.descriptor_bytes as usize];
            storage.read_at(sb.descriptor.0, &mut desc).unwrap();
            assert_eq!(crc32c::crc32c(&desc), sb.descriptor_crc);
            (sb, Descriptor::decode(&desc, sb.descriptor).unwrap())
        };
        let mut both = [read(0), read(1)];
        both.sort_by_key(|(sb, _)| sb.epoch);
        both
    }

    fn store() -> crate::Database {
        crate::Database::builder()
            .commit_interval(None)
            .flush_interval(None)
            .gc(false)
            .log_segment_bytes(64 << 10)
            .open_in_memory()
            .unwrap()
    }

    /// A pair leaves both slots naming one state (the repeat writes no node, so the roots
    /// are the first commit's), and frees at once what the state before it referenced:
    /// the index nodes copied on write since the previous commit.
    #[test]
    fn a_commit_pair_names_one_state_in_both_slots_and_frees_the_old_nodes() {
        let db = store();
        let ks = db.keyspace("t").unwrap();
        for i in 0..5000u32 {
            ks.put(format!("k{i:05}").as_bytes(), &[1; 40]).unwrap();
        }
        db.commit().unwrap();
        for i in (0..5000u32).step_by(7) {
            ks.put(format!("k{i:05}").as_bytes(), &[2; 40]).unwrap();
        }
        let region = db.inner.regions.read().get("t").cloned().unwrap();
        db.inner.commit_pair().unwrap();
        let [(first_sb, first), (repeat_sb, repeat)] = slots(&db);
        assert_eq!(repeat_sb.epoch.0, first_sb.epoch.0 + 1);
        assert_eq!(
            first.regions, repeat.regions,
            "the repeat names other regions"
        );
        assert_eq!(
            *region.durable_epochs.lock(),
            [Some(first.regions[0].tree_epoch); 2]
        );
        // The nodes the first commit copied on write are unreferenced by both slots now:
        // taken from the tree at once, not one commit later.
        assert!(
            !region.tree.has_retired(),
            "retired nodes wait for another commit"
        );
        let report = db.check().unwrap();
        assert_eq!(report.unreferenced_blocks, 0);
        assert_eq!(ks.len(), 5000);
    }

    /// What a repeat lists as free or allocated must survive a reopen from either slot:
    /// nothing referenced is freed, nothing unreferenced leaks (`check` fails on both).
    #[test]
    fn either_slot_of_a_pair_reopens_to_the_same_data_without_leaks() {
        for lose_newest in [false, true] {
            let db = store();
            let ks = db.keyspace("t").unwrap();
            for round in 0..3u8 {
                for i in 0..3000u32 {
                    ks.put(format!("k{i:05}").as_bytes(), &[round; 60]).unwrap();
                }
                db.inner.commit_pair().unwrap();
            }
            let storage = db.inner.shared.volume.storage().clone();
            let newest = slots(&db)[1].0.epoch;
            drop(ks);
            db.abandon();
            if lose_newest {
                // Bit rot in the newest slot: open falls back to the first commit.
                let at = slot_offset(newest).0;
                let mut bytes = vec![0u8; SLOT_BYTES];
                storage.read_at(at, &mut bytes).unwrap();
                bytes[100] ^= 0x10;
                storage.write_at(at, &bytes).unwrap();
            }
            let db = crate::Database::builder()
                .commit_interval(None)
                .flush_interval(None)
                .gc(false)
                .open_storage(storage)
                .unwrap();
            let ks = db.keyspace("t").unwrap();
            assert_eq!(ks.len(), 3000);
            assert_eq!(ks.get(b"k00042").unwrap().unwrap(), vec![2; 60]);
            db.check().unwrap();
        }
    }
}
