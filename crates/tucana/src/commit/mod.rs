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
//! Only one commit runs at a time (`Committer`, whose lock is the commit lock). Failure at any step poisons
//! the database: nothing after it is acknowledged, and reopening recovers the previous
//! commit plus the log.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};

use crate::descriptor::{Descriptor, RegionDesc};
use crate::error::{Error, Result};
use crate::index::NODE_BYTES;
use crate::region::{Extent, Region, Regions, SealedRegion};
use crate::replica::Replica;
use crate::shared::Shared;
use crate::types::{CommitEpoch, DiskOffset, BLOCK_BYTES};
use crate::volume::superblock::Superblock;

/// Commit bookkeeping, under the committer's lock.
pub(crate) struct CommitState {
    /// Newest durable commit.
    epoch: CommitEpoch,
    /// Descriptor extents of the last two durable commits (older first).
    descriptors: [Option<Extent>; 2],
    /// Extents unreferenced by the newest commit but still by the one before it; freed
    /// after the next commit (so either superblock slot stays a complete state).
    deferred: Vec<Extent>,
    /// Extents of dropped regions, unreferenced from the next commit on.
    dropped: Vec<Extent>,
}

impl CommitState {
    /// Newest durable commit.
    pub fn epoch(&self) -> CommitEpoch {
        self.epoch
    }

    /// Extents the next commit stops referencing (a dropped region's), freed like
    /// anything else it lets go: once no durable commit needs them.
    pub fn drop_after_next_commit(&mut self, extents: Vec<Extent>) {
        self.dropped.extend(extents);
    }

    /// Whether a commit would move freed space along: a dropped region waiting, or
    /// extents deferred beyond the previous commit's descriptor (every commit defers that
    /// one: alone, it is the resting state, not work).
    pub fn has_frees_waiting(&self) -> bool {
        let resting = self.descriptors[0];
        !self.dropped.is_empty() || self.deferred.iter().any(|e| Some(*e) != resting)
    }
}

/// What one commit did to one region, for a replication shipper (DESIGN.md,
/// "Replication"): its descriptor entry as written (the primary's offsets), the node
/// images the commit wrote for it, and the nodes retired at or before its seal (no longer
/// in its tree; the commit's free log lists them).
pub struct RegionDelta {
    pub desc: RegionDesc,
    /// `order` the region's next segment gets: every segment allocated before the seal
    /// has a lower one.
    pub next_order: u64,
    pub nodes: Vec<(DiskOffset, Box<[u8; NODE_BYTES]>)>,
    pub released_nodes: Vec<DiskOffset>,
}

/// A durable commit, as a `CommitObserver` is told of it.
pub struct CommitDelta {
    pub epoch: CommitEpoch,
    /// Whether this is the repeat of a pair: the same state under the next epoch, with
    /// no node written.
    pub repeat: bool,
    pub regions: Vec<RegionDelta>,
}

/// Told of every commit once it is durable, under the commit lock (so it must only hand
/// the delta on, never wait).
pub trait CommitObserver: Send + Sync {
    fn committed(&self, delta: CommitDelta);
}

/// What the first commit of a pair hands its repeat: the local regions' entries and their
/// `next_order`, and the replicas' entries as that commit captured them.
struct FirstOfPair {
    descs: Vec<RegionDesc>,
    next_orders: Vec<u64>,
    replica_descs: Vec<RegionDesc>,
}

/// Makes commits, one at a time (its lock is the commit lock).
pub(crate) struct Committer {
    shared: Arc<Shared>,
    state: Mutex<CommitState>,
    observer: parking_lot::RwLock<Option<Arc<dyn CommitObserver>>>,
}

/// Nodes are allocated in runs of up to this many blocks, so a commit writes them with
/// few large writes.
const NODE_RUN_BLOCKS: u64 = 256;

impl Committer {
    /// The committer of a volume whose newest durable commit is `epoch`, with its
    /// descriptor at `descriptor` (none for a volume being created).
    pub fn new(shared: Arc<Shared>, epoch: CommitEpoch, descriptor: Option<Extent>) -> Committer {
        Committer {
            shared,
            state: Mutex::new(CommitState {
                epoch,
                descriptors: [None, descriptor],
                deferred: Vec::new(),
                dropped: Vec::new(),
            }),
            observer: parking_lot::RwLock::new(None),
        }
    }

    /// Has `observer` told of every commit from now on (`None`: nobody).
    pub fn set_observer(&self, observer: Option<Arc<dyn CommitObserver>>) {
        *self.observer.write() = observer;
    }

    /// The commit lock: held, no commit runs.
    pub fn lock(&self) -> MutexGuard<'_, CommitState> {
        self.state.lock()
    }

    pub fn try_lock(&self) -> Option<MutexGuard<'_, CommitState>> {
        self.state.try_lock()
    }

    /// Newest durable commit epoch.
    pub fn epoch(&self) -> CommitEpoch {
        self.state.lock().epoch
    }

    /// A commit of every region of `regions`.
    pub fn commit(&self, regions: &Regions) -> Result<()> {
        let mut cs = self.state.lock();
        self.commit_locked(&mut cs, regions)
    }

    /// A commit and its repeat (`commit_pair_locked`): both superblock slots name the
    /// newest state, and what it stopped referencing is freed at once.
    pub fn commit_pair(&self, regions: &Regions) -> Result<()> {
        let mut cs = self.state.lock();
        self.commit_pair_locked(&mut cs, regions)
    }

    /// A commit, the commit lock held (`cs`): seal, persist, descriptor, superblock.
    pub fn commit_locked(&self, cs: &mut CommitState, registry: &Regions) -> Result<()> {
        let next_region_id = registry.next_id();
        let (regions, replicas) = (registry.list(), registry.replicas());
        self.guarded(cs, &replicas, |this, cs, started| {
            this.commit_steps(cs, started, &regions, &replicas, next_region_id, false)
                .map(|_| ())
        })
    }

    /// Two commits back to back, the second a *repeat* of the first: the same roots, log
    /// positions and segment lists under a new epoch, in the other superblock slot. It
    /// writes no node, only a descriptor and bitmap images (and two fsyncs), and leaves
    /// both slots naming the same state, so whatever the first commit stopped
    /// referencing (segments garbage collection retired before its seal, copied nodes)
    /// may be freed at once, not one commit interval later (DESIGN.md, "Commit pairs").
    pub fn commit_pair_locked(&self, cs: &mut CommitState, registry: &Regions) -> Result<()> {
        let next_region_id = registry.next_id();
        let (regions, replicas) = (registry.list(), registry.replicas());
        self.guarded(cs, &replicas, |this, cs, started| {
            let first =
                this.commit_steps(cs, started, &regions, &replicas, next_region_id, true)?;
            this.repeat_steps(cs, started, &regions, &replicas, next_region_id, first)
        })
    }

    /// Hands the frees that passed the reader grace period to the allocator now, punching
    /// the file's holes, instead of at the start of the next commit: the bytes go back
    /// to the file system as soon as nothing can read them. Skipped while a commit runs
    /// (its first step takes them). Equivalent to that first step: both durable commits'
    /// free logs or bitmaps already count these blocks as unreferenced, and the next
    /// commit's bitmap image shows them free either way.
    pub fn release_frees_now(&self) {
        let Some(_cs) = self.state.try_lock() else {
            return;
        };
        if self.shared.is_poisoned() {
            return;
        }
        self.shared.release_releasable();
    }

    /// Runs commit steps; on failure poisons the database and ends a commit left open in
    /// the allocator. A closed database still commits (its final commit); a poisoned one
    /// never does.
    fn guarded(
        &self,
        cs: &mut CommitState,
        replicas: &[Arc<Replica>],
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
        // Replicas allocate as after no seal again, committed or not (a failed commit
        // poisons: nothing more is committed).
        for replica in replicas {
            replica.commit_durable(result.is_ok());
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
        regions: &[Arc<Region>],
        replicas: &[Arc<Replica>],
        next_region_id: u64,
        keep_seal: bool,
    ) -> Result<FirstOfPair> {
        let shared = &self.shared;
        let storage = shared.volume.storage().clone();
        let allocator = &shared.allocator;

        // 0. Deferred puts (`region/deferred.rs`) go into the trees before anything is
        // sealed; their device reads are taken here, outside every writer lock.
        for region in regions {
            region.apply_deferred(true)?;
        }

        // 1. Frees that are safe now become free space in this commit's bitmap.
        shared.release_releasable();
        allocator.begin_commit();
        *started = true;

        // 2. Seal.
        let sealed: Vec<SealedRegion> = regions
            .iter()
            .map(|r| r.seal_for_commit())
            .collect::<Result<_>>()?;
        let replica_descs: Vec<RegionDesc> = replicas.iter().map(|r| r.seal_for_commit()).collect();
        shared.log_bytes_since_commit.store(0, Ordering::Relaxed);

        // 3. The log up to every seal point reaches the file.
        for region in regions {
            region.flush_tails()?;
        }

        // 4. Persist trees.
        let mut images: Vec<Vec<(DiskOffset, Box<[u8; NODE_BYTES]>)>> =
            Vec::with_capacity(regions.len());
        let mut run = (DiskOffset::NONE, 0u64);
        let mut roots = Vec::with_capacity(regions.len());
        // This commit's node runs placed so far, per member (see `allocate_node_run`).
        let mut placed_bytes: Vec<u64> = Vec::new();
        {
            let mut alloc = || -> Result<DiskOffset> {
                if run.1 == 0 {
                    run = allocate_node_run(shared, storage.as_ref(), &mut placed_bytes)?;
                }
                let at = run.0;
                run = (at.plus_bytes(BLOCK_BYTES), run.1 - 1);
                Ok(at)
            };
            for (region, s) in regions.iter().zip(&sealed) {
                let mut written = Vec::new();
                roots.push(region.persist(s, &mut alloc, &mut written)?);
                images.push(written);
            }
        }
        if run.1 > 0 {
            allocator.release(run.0, run.1);
        }
        // The node runs: in flight on their members' write queues when there are queues
        // (written while the descriptor is made; `write_commit` waits for them before its
        // first sync, so no superblock is durable before the nodes it leads to), else
        // written here.
        let nodes = images.iter().flatten().map(|(off, image)| (*off, &**image));
        match &shared.writes {
            Some(queue) => crate::volume::queue_block_runs(queue, &storage, nodes)?,
            None => {
                crate::volume::write_block_runs(storage.as_ref(), nodes, &shared.bytes_written)?
            }
        }

        // 5-6. Descriptor, bitmaps, superblock.
        let descs: Vec<RegionDesc> = regions
            .iter()
            .zip(&sealed)
            .zip(&roots)
            .map(|((region, s), root)| region_desc(region, s, *root))
            .collect();
        let descs = self.write_commit(
            cs,
            regions,
            next_region_id,
            descs,
            &replica_descs,
            keep_seal,
        )?;
        if !keep_seal {
            *started = false;
        }
        self.commit_durable(regions, &descs, !keep_seal);
        if let Some(observer) = self.observer.read().clone() {
            let deltas = regions
                .iter()
                .zip(&descs)
                .zip(sealed.iter().zip(images))
                .map(|((region, d), (s, nodes))| RegionDelta {
                    desc: d.clone(),
                    next_order: s.next_order,
                    nodes,
                    released_nodes: region.retired_nodes(d.tree_epoch),
                })
                .collect();
            observer.committed(CommitDelta {
                epoch: cs.epoch,
                repeat: false,
                regions: deltas,
            });
        }
        Ok(FirstOfPair {
            descs,
            next_orders: sealed.iter().map(|s| s.next_order).collect(),
            replica_descs,
        })
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
        replicas: &[Arc<Replica>],
        next_region_id: u64,
        first: FirstOfPair,
    ) -> Result<()> {
        let FirstOfPair {
            descs,
            next_orders,
            replica_descs,
        } = first;
        // The replicas as the first commit saw them: what they received since stays out
        // of this image as well (they still allocate as after that seal).
        debug_assert_eq!(replicas.len(), replica_descs.len());
        assert!(
            cs.dropped.is_empty(),
            "a dropped region's extents wait for a full commit, not a repeat"
        );
        // Frees that passed the grace period since the first commit began: reclaimed by
        // the rule every commit start relies on (neither durable slot references them).
        self.shared.release_releasable();
        let descs = self.write_commit(cs, regions, next_region_id, descs, &replica_descs, false)?;
        *started = false;
        self.commit_durable(regions, &descs, true);
        if let Some(observer) = self.observer.read().clone() {
            let deltas = descs
                .into_iter()
                .zip(next_orders)
                .map(|(desc, next_order)| RegionDelta {
                    desc,
                    next_order,
                    nodes: Vec::new(),
                    released_nodes: Vec::new(),
                })
                .collect();
            observer.committed(CommitDelta {
                epoch: cs.epoch,
                repeat: true,
                regions: deltas,
            });
        }
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
        next_region_id: u64,
        descs: Vec<RegionDesc>,
        replica_descs: &[RegionDesc],
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
            free_log.extend(region.retired_extents(d.tree_epoch));
        }
        free_log.sort();
        free_log.dedup();

        let local_regions = descs.len();
        let mut all = descs;
        all.extend_from_slice(replica_descs);
        let mut desc = Descriptor {
            epoch,
            next_region_id,
            volume_bytes: 0,
            bitmap_slots: allocator.slots(),
            free_log,
            regions: all,
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

        // Make it all durable, then switch the superblock: the closed log segments and
        // node runs still in flight first (every segment the sealed trees point into was
        // queued before this: it closed before the tails' flush of this commit; the node
        // runs were queued by `commit_steps` above).
        shared.wait_writes()?;
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
        desc.regions.truncate(local_regions);
        Ok(desc.regions)
    }

    /// After a durable commit of `descs`: each region's durable seals and committed root
    /// move on, and what neither superblock slot references any more (and no snapshot
    /// reads) goes on its way to the allocator. `end_seal`: writers stop allocating as
    /// after a seal (no repeat follows).
    fn commit_durable(&self, regions: &[Arc<Region>], descs: &[RegionDesc], end_seal: bool) {
        let shared = &self.shared;
        for (region, d) in regions.iter().zip(descs) {
            let tail_order = d
                .segments
                .iter()
                .find(|(off, _)| *off == d.tail)
                .map_or(0, |(_, stats)| stats.order);
            let reclaimed = region.commit_durable(d.tree_epoch, d.root, tail_order, end_seal);
            shared.release_after_readers(reclaimed.nodes.into_iter().map(|b| (b, 1)).collect());
            let bytes: u64 = reclaimed
                .segments_now
                .iter()
                .chain(&reclaimed.segments_after_readers)
                .map(|(_, b)| b * BLOCK_BYTES)
                .sum();
            shared
                .gc_reclaimed_bytes
                .fetch_add(bytes, Ordering::Relaxed);
            shared
                .frees
                .lock()
                .releasable
                .extend(reclaimed.segments_now);
            shared.release_after_readers(reclaimed.segments_after_readers);
        }
        shared.commits.fetch_add(1, Ordering::Relaxed);
    }
}

fn region_desc(region: &Region, s: &SealedRegion, root: DiskOffset) -> RegionDesc {
    RegionDesc {
        id: region.id(),
        name: region.name().to_string(),
        tree_epoch: s.tree_epoch,
        root,
        generation: s.generation,
        next_seq: s.next_seq,
        tail: s.tails.tail,
        tail_size_bytes: s.tails.tail_size_bytes,
        tail_used_bytes: s.tails.tail_used_bytes,
        gc_tail: s.tails.gc_tail,
        keys: s.keys,
        segments: s.segments.clone(),
        seed: region.seed(),
        term: region.term(),
        replica: None,
        received: Vec::new(),
    }
}

/// The next run (up to `NODE_RUN_BLOCKS`) for a commit's index nodes: on the member the
/// dispatch policy names, as a log segment is (`None` for one file: first fit). The
/// member's queued writes count, and so do `placed_bytes[m]`, this commit's runs placed
/// on member `m` so far (queued only once the trees are persisted), so that
/// least-weighted dispatch spreads a large commit instead of giving every run to the
/// member that was least loaded when it began; the new run is added to them.
fn allocate_node_run(
    shared: &Shared,
    storage: &dyn crate::volume::Storage,
    placed_bytes: &mut Vec<u64>,
) -> Result<(DiskOffset, u64)> {
    let mut queued = shared.queued_write_bytes();
    if queued.len() < placed_bytes.len() {
        queued.resize(placed_bytes.len(), 0);
    }
    for (q, p) in queued.iter_mut().zip(placed_bytes.iter()) {
        *q += p;
    }
    let member = storage.dispatch_member(None, &queued);
    let run = shared
        .allocator
        .allocate_up_to_on(storage, NODE_RUN_BLOCKS, member)?;
    if let Some(m) = storage.member_of(run.0 .0) {
        if placed_bytes.len() <= m {
            placed_bytes.resize(m + 1, 0);
        }
        placed_bytes[m] += run.1 * BLOCK_BYTES;
    }
    Ok(run)
}

#[cfg(test)]
mod tests {
    use crate::volume::superblock::{slot_offset, Superblock, SLOT_BYTES};

    use super::*;

    /// Both superblock slots' descriptors, oldest first.
    fn slots(db: &crate::Database) -> [(Superblock, Descriptor); 2] {
        let storage = db.engine.shared.volume.storage().clone();
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
        let region = db.engine.regions.get("t").unwrap();
        db.engine.commit_pair().unwrap();
        let [(first_sb, first), (repeat_sb, repeat)] = slots(&db);
        assert_eq!(repeat_sb.epoch.0, first_sb.epoch.0 + 1);
        assert_eq!(
            first.regions, repeat.regions,
            "the repeat names other regions"
        );
        assert_eq!(
            region.durable_epochs(),
            [Some(first.regions[0].tree_epoch); 2]
        );
        // The nodes the first commit copied on write are unreferenced by both slots now:
        // taken from the tree at once, not one commit later.
        assert!(
            !region.has_retired_nodes(),
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
                db.engine.commit_pair().unwrap();
            }
            let storage = db.engine.shared.volume.storage().clone();
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
