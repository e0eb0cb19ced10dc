//! Regions: one keyspace's tree, log and writer.
//!
//! Owns: applying writes to the tree (each record appended to the region's log first,
//! `crate::log::writer`), sealing the tree for a commit and taking in what a durable commit
//! lets go, snapshot and live-iterator registration, and the region's share of
//! freeing (nodes and segments retired until nothing can reach them). Reads live in
//! `read` (resolving log pointers to records for readers and for the tree, `index::Ctx`),
//! garbage collection's primitives in `relocate` (relocating a victim segment's live
//! records and retiring the emptied segment; policy and passes live in `crate::gc`), the
//! name → region map in `registry`.
//!
//! Does not own: the log's bytes and per-segment counts (`log::writer::Log`), commits
//! (`crate::commit` seals and persists through the methods here), group sync.
//!
//! Thread-safety: one writer at a time per region (the `writer` mutex, held for an append
//! plus its tree update); readers take no lock: they pin `crossbeam_epoch`, read the tree
//! optimistically and read records from the tail buffer or the volume. Regions never share
//! a lock on the write path except the allocator's, taken once per log segment.

mod deferred;
mod key_order;
mod open;
mod read;
mod readers;
mod registry;
mod relocate;
mod ship;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_epoch as epoch;
use parking_lot::{Mutex, MutexGuard};

use crate::error::{Error, Result};
use crate::index::{self, Tree, NODE_BYTES};
use crate::log::record::{self, HEADER_BYTES};
use crate::log::tail::Tail;
use crate::log::writer::{Log, SegmentTotals, TailPositions, Writer};
use crate::log::SegmentStats;
use crate::shared::Shared;
use crate::stats::KeyspaceStats;
use crate::types::{DiskOffset, RegionId, SeqNo, TreeEpoch, BLOCK_BYTES};

pub(crate) use key_order::{scattered, ScatteredRead};
pub(crate) use open::Links;
pub use open::{ReplayReport, ReplayStop};
pub(crate) use read::Candidate;
pub use readers::ReaderTicket;
pub(crate) use registry::Regions;
pub(crate) use relocate::Retire;
use relocate::RetiredSegment;
pub use ship::{LogPosition, ShipSegment};

pub(crate) use crate::types::Extent;

/// One write of a batch: a put (`Some(value)`) or a delete (`None`).
pub(crate) struct Op<'a> {
    pub key: &'a [u8],
    pub value: Option<&'a [u8]>,
}

/// Who a region is: its id in this volume, its name, the crc seed of its records (derived
/// from the id, or the primary's for a region that began as a replica) and its
/// replication term (0: never replicated).
pub(crate) struct Identity {
    pub id: RegionId,
    pub name: String,
    pub seed: u32,
    pub term: u64,
}

/// The sealed state of a region, captured by a commit.
pub(crate) struct SealedRegion {
    pub root_word: u64,
    pub tree_epoch: TreeEpoch,
    pub generation: u32,
    pub next_seq: SeqNo,
    /// Where the tails stood: replay starts at the foreground's position.
    pub tails: TailPositions,
    pub keys: u64,
    pub segments: Vec<(DiskOffset, SegmentStats)>,
    /// `order` the next segment allocated gets: every segment allocated before the seal
    /// has a lower one (what a backup tells retired segments from new ones by).
    pub next_order: u64,
}

/// A record log replay found (`crate::recovery`), applied in log order by
/// `Region::apply_replayed`.
pub(crate) enum Replayed {
    Put { at: DiskOffset, len: u64 },
    Delete { at: DiskOffset, len: u64 },
    Link { at: DiskOffset, len: u64 },
}

/// What a durable commit let go of in a region (`Region::commit_durable`): retired nodes
/// and segments neither superblock slot nor any snapshot can reach.
#[derive(Default)]
pub(crate) struct Reclaimed {
    /// Index nodes, one block each; still wait for in-flight readers.
    pub nodes: Vec<DiskOffset>,
    /// Segments past their reader grace period: free at once.
    pub segments_now: Vec<Extent>,
    /// Segments that still wait for in-flight readers.
    pub segments_after_readers: Vec<Extent>,
}

/// Keys of a write whose index path is warmed before the writer lock (`Region::lock_warm`):
/// a large batch holds the lock long anyway, and warming all of it would double its
/// descents.
const WARM_OPS_MAX: usize = 32;

/// Writes that warm their index path after a writer found the lock taken (`lock_warm`).
const WARM_AFTER_CONTENTION: u32 = 64;

pub(crate) struct Region {
    id: RegionId,
    name: String,
    /// Replication term: raised by every change of primary; writes stop once a higher
    /// one is known elsewhere (`crate::replication`).
    term: AtomicU64,
    tree: Tree,
    shared: Arc<Shared>,
    log: Log,
    writer: Mutex<Writer>,
    /// The writer's segment count and size, read without its lock.
    segment_totals: Arc<SegmentTotals>,
    /// The writer's log generation, which never changes while the region is open (read
    /// without the writer's lock).
    generation: u32,
    /// Writes left that warm their index path before taking the writer lock
    /// (`lock_warm`): set when a writer finds the lock taken, 0 for a lone writer.
    warm_writes: AtomicU32,
    keys: AtomicU64,
    /// The residency streak of the last prefetch batch any reader probed (see
    /// `prefetch::ResidencyGate`); new ranges start from it.
    prefetch_streak: AtomicUsize,
    /// The same for `prefetch_keys` (a server's pipelined commands), kept apart: the
    /// records a window of commands names first (a collection's metadata, often the
    /// same hot record) say nothing of the records a range over its members reads, and
    /// a streak made hot by them would give those ranges free passes out of memory.
    key_prefetch_streak: AtomicUsize,
    /// The same for `prefetch_dependent_keys` (keys found through records read first: a
    /// collection's members under its metadata), kept apart from both: a hot metadata
    /// record says nothing of its members, and a streak made hot by it would give the
    /// members' reads free passes out of memory.
    dependent_prefetch_streak: AtomicUsize,
    /// Tree epochs still read: snapshots, live ranges, pinned commits.
    readers: readers::Readers,
    /// Sealed tree epochs of the last two durable commits (older first).
    durable_epochs: Mutex<[Option<TreeEpoch>; 2]>,
    /// Segments emptied by garbage collection, not yet handed to the allocator.
    retired_segments: Mutex<Vec<RetiredSegment>>,
    /// Root of the tree in the newest durable commit.
    committed_root: Mutex<DiskOffset>,
    dropped: AtomicBool,
    /// Garbage collection retires no segment of this order or more
    /// (`Region::set_ship_horizon`).
    ship_horizon: AtomicU64,
    /// The order of the newest durable commit's tail segment (`u64::MAX` while no commit
    /// lists the region): garbage collection retires no foreground segment of this order
    /// or more. See `Region::gc_candidates`.
    replay_from_order: AtomicU64,
    /// A higher replication term is known elsewhere: writes are refused
    /// (`Region::fence`); 0 while none is.
    fenced_by: AtomicU64,
    /// Puts logged but not yet applied to the tree (`deferred.rs`).
    deferred: deferred::Deferred,
    /// Scans' reports of scattered records, and the retired-segment count that vouches
    /// for their pointers (`key_order.rs`).
    scattered_reads: key_order::ScatteredReads,
}

impl Region {
    /// A region over `tree` and a log appending at `tail` (and, after an open, the
    /// relocation tail its commit left), whose newest durable commit has `committed_root`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        shared: Arc<Shared>,
        identity: Identity,
        tree: Tree,
        tail: Tail,
        gc_tail: Option<Tail>,
        writer: Writer,
        keys: u64,
        committed_root: DiskOffset,
    ) -> Region {
        let log = Log::new(shared.clone(), identity.seed, tail, gc_tail, &writer);
        Region {
            id: identity.id,
            name: identity.name,
            term: AtomicU64::new(identity.term),
            tree,
            shared,
            log,
            generation: writer.generation,
            segment_totals: writer.totals(),
            writer: Mutex::new(writer),
            warm_writes: AtomicU32::new(0),
            keys: AtomicU64::new(keys),
            prefetch_streak: AtomicUsize::new(0),
            key_prefetch_streak: AtomicUsize::new(0),
            dependent_prefetch_streak: AtomicUsize::new(0),
            readers: readers::Readers::new(),
            durable_epochs: Mutex::new([None, None]),
            retired_segments: Mutex::new(Vec::new()),
            committed_root: Mutex::new(committed_root),
            dropped: AtomicBool::new(false),
            ship_horizon: AtomicU64::new(u64::MAX),
            replay_from_order: AtomicU64::new(u64::MAX),
            fenced_by: AtomicU64::new(0),
            deferred: deferred::Deferred::default(),
            scattered_reads: key_order::ScatteredReads::default(),
        }
    }

    /// A new, empty region whose log starts in the segment at `base` (allocated by the
    /// caller, `size_bytes` long).
    pub fn create(
        shared: &Arc<Shared>,
        id: RegionId,
        name: &str,
        base: DiskOffset,
        size_bytes: u64,
    ) -> Region {
        let mut writer = Writer::new(1, SeqNo(0), 1);
        if shared.options.gc {
            writer.dead_records.insert(base.0, Vec::new());
        }
        writer.add_segment(
            base,
            SegmentStats {
                size_bytes,
                written_bytes: 0,
                live_bytes: 0,
                order: 0,
            },
            false,
        );
        Region::new(
            shared.clone(),
            Identity {
                id,
                name: name.to_string(),
                seed: record::fresh_region_seed(id),
                term: 0,
            },
            Tree::new(id, TreeEpoch(1)),
            Tail::new(base, size_bytes, 0),
            None,
            writer,
            0,
            DiskOffset::NONE,
        )
    }

    #[inline]
    pub fn id(&self) -> RegionId {
        self.id
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Replication term (0: never replicated).
    pub fn term(&self) -> u64 {
        self.term.load(Ordering::Acquire)
    }

    #[inline]
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Live keys.
    #[inline]
    pub fn keys(&self) -> u64 {
        self.keys.load(Ordering::Relaxed)
    }

    /// Bytes of the records the index points at.
    #[inline]
    pub fn live_bytes(&self) -> u64 {
        self.log.live_bytes()
    }

    /// Bytes of the log written and dead.
    #[inline]
    pub fn dead_bytes(&self) -> u64 {
        self.log.dead_bytes()
    }

    /// crc seed of the region's records.
    #[inline]
    pub fn seed(&self) -> u32 {
        self.log.seed()
    }

    /// The log generation of this opening of the region (see `log::record`).
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// Heap nodes the index holds.
    pub fn heap_nodes(&self) -> u64 {
        self.tree.heap_nodes()
    }

    /// Index nodes changed since the last commit's seal: what a commit would write.
    pub fn dirty_node_bytes(&self) -> u64 {
        self.tree.dirty_nodes() * NODE_BYTES as u64
    }

    /// Whether nodes copied on write wait to be freed.
    pub fn has_retired_nodes(&self) -> bool {
        self.tree.has_retired()
    }

    pub fn is_dropped(&self) -> bool {
        self.dropped.load(Ordering::Acquire)
    }

    fn check_usable(&self) -> Result<()> {
        if self.is_dropped() {
            return Err(Error::KeyspaceNotFound(self.name.clone()));
        }
        Ok(())
    }

    /// Refuses writes from now on: another server holds the region at `term`, higher than
    /// this one's (a backup was promoted). Reads go on.
    pub fn fence(&self, term: u64) {
        self.fenced_by.fetch_max(term, Ordering::AcqRel);
    }

    /// The term of the server the region was fenced by, if it was.
    pub fn fenced_by(&self) -> Option<u64> {
        match self.fenced_by.load(Ordering::Acquire) {
            0 => None,
            term => Some(term),
        }
    }

    /// Sets the replication term (a region becoming replicated, or a reconfiguration);
    /// persisted by the next commit. Never lowers it.
    pub fn raise_term(&self, term: u64) {
        self.term.fetch_max(term, Ordering::AcqRel);
    }

    fn check_writable(&self) -> Result<()> {
        if let Some(term) = self.fenced_by() {
            return Err(Error::Fenced {
                keyspace: self.name.clone(),
                term,
            });
        }
        self.shared.check_writable()
    }

    /// Returns once no write is in progress (each holds the writer lock): a close that
    /// refused new writes waits for those already past the check.
    pub fn wait_for_writer(&self) {
        drop(self.writer.lock());
    }

    pub fn stats(&self) -> KeyspaceStats {
        KeyspaceStats {
            name: self.name.clone(),
            keys: self.keys(),
            live_log_bytes: self.live_bytes(),
            dead_log_bytes: self.dead_bytes(),
            log_segments: self.segment_count(),
            log_size_bytes: self.log_size_bytes() + self.retired_segment_bytes(),
            index_nodes: self.heap_nodes(),
            index_writes: self.tree.write_counts(),
        }
    }

    // ----- writes --------------------------------------------------------------------

    /// Appends the ops as one atomic unit and applies them to the tree. Returns the
    /// write ticket to wait for when the caller wants durability, and how many of the
    /// ops replaced or removed an existing key.
    pub fn write(&self, ops: &[Op<'_>]) -> Result<(u64, usize)> {
        self.check_usable()?;
        let shared = &self.shared;
        self.check_writable()?;
        // A lone put may be deferred (`deferred.rs`): it must not read the record it
        // replaces, so its path is not warmed either.
        let deferrable = ops.len() == 1 && ops[0].value.is_some() && self.defer_put_now();
        let warm = if deferrable { 0 } else { WARM_OPS_MAX };
        let mut w = self.lock_warm(ops.iter().take(warm).map(|op| op.key));
        // Checked again under the lock: a drop, close or fence may have drained writers
        // meanwhile.
        self.check_usable()?;
        self.check_writable()?;
        let mut ptrs = [DiskOffset::NONE; 1];
        let mut many = Vec::new();
        let ptrs: &mut [DiskOffset] = if ops.len() == 1 {
            &mut ptrs
        } else {
            many.resize(ops.len(), DiskOffset::NONE);
            &mut many
        };
        let mut appended = 0u64;
        for (i, op) in ops.iter().enumerate() {
            let mut flags = 0;
            if op.value.is_none() {
                flags |= record::FLAG_TOMBSTONE;
            }
            if i + 1 < ops.len() {
                flags |= record::FLAG_BATCH_MORE;
            }
            let at = self
                .log
                .append(&mut w, flags, op.key, op.value.unwrap_or(&[]))
                .inspect_err(|_| shared.poison())?;
            appended += (HEADER_BYTES + op.key.len() + op.value.map_or(0, |v| v.len())) as u64;
            ptrs[i] = at;
        }
        let mut existed = 0;
        let mut deferred = false;
        // A batch's neighbouring keys (a run's pushes or pops of one list) often share a
        // leaf: each after the first is applied there without a descent.
        let mut finger = index::Finger::default();
        let mut i = 0;
        while i < ops.len() {
            let (op, ptr) = (&ops[i], ptrs[i]);
            if deferrable
                && self
                    .try_defer(&mut w, op.key, ptr)
                    .inspect_err(|_| shared.poison())?
            {
                // An update (the index holds the key, or a key of its prefix and hash).
                existed += 1;
                deferred = true;
                i += 1;
                continue;
            }
            // A run of puts or of deletes goes to the index together: neighbouring keys
            // share one shift of their leaf (`Tree::insert_run_near`, `remove_run_near`).
            let put = op.value.is_some();
            let run = ops[i..]
                .iter()
                .take_while(|o| o.value.is_some() == put)
                .count();
            if ops.len() > 1 && run > 1 {
                existed += self
                    .apply_run(&mut w, &ops[i..i + run], &ptrs[i..i + run], &mut finger)
                    .inspect_err(|_| shared.poison())?;
                i += run;
                continue;
            }
            if !self.deferred.is_empty() {
                self.apply_deferred_of(&mut w, op.key)?;
            }
            if self
                .apply(
                    &mut w,
                    op.key,
                    op.value.is_some(),
                    ptr,
                    (ops.len() > 1).then_some(&mut finger),
                )
                .inspect_err(|_| shared.poison())?
            {
                existed += 1;
            }
            i += 1;
        }
        let ticket = shared.write_ticket.fetch_add(1, Ordering::AcqRel) + 1;
        drop(w);
        if deferred && self.deferred.len() >= deferred::DEFERRED_BATCH {
            self.apply_deferred(false)?;
        }
        shared
            .log_bytes_since_commit
            .fetch_add(appended, Ordering::Relaxed);
        shared
            .foreground_bytes
            .fetch_add(appended, Ordering::Relaxed);
        shared.maybe_wake_committer();
        // Outside every lock: a paced writer holds nobody up but itself.
        shared.pace_writer(appended);
        Ok((ticket, existed))
    }

    /// The writer lock, for a write of `keys`. When another writer holds it, the index
    /// nodes these keys go to, and the records they replace, are first brought into the
    /// cache, reading only (a lookup that compares no key, `CandidateCtx`, then the
    /// candidate record's header): a region's writers
    /// take turns under the lock, and a cache miss taken under it (random keys miss on
    /// their leaf) makes every one of them wait, while one taken here, instead of waiting,
    /// costs nobody. A lone writer takes the lock at once: warming would only double its
    /// descents (a single-threaded random fill ran 25% slower). Once a writer found the
    /// lock taken, the next `WARM_AFTER_CONTENTION` writes warm whether or not they would
    /// wait: under steady contention the lock is usually free for an instant between two
    /// holders, and a writer that takes it then still takes its misses under it.
    fn lock_warm<'k>(&self, keys: impl Iterator<Item = &'k [u8]>) -> MutexGuard<'_, Writer> {
        let warm_left = self.warm_writes.load(Ordering::Relaxed);
        if warm_left == 0 {
            if let Some(w) = self.writer.try_lock() {
                return w;
            }
            self.warm_writes
                .store(WARM_AFTER_CONTENTION, Ordering::Relaxed);
        } else {
            // Racy between writers, and harmless: a count, not an invariant.
            self.warm_writes.store(warm_left - 1, Ordering::Relaxed);
        }
        let guard = epoch::pin();
        let ctx = read::CandidateCtx::new(self);
        for key in keys {
            // The record a write replaces is read under the lock twice over: the insert
            // confirms the key against it, and its length is counted dead (`apply`). Read
            // it here first, so that when it was evicted from memory the device read (a
            // fault, or a copy) is taken outside the lock too. Its pointer stays valid
            // under `guard`; a candidate of another key (a collision) is only a wasted read.
            if let Ok(Some(ptr)) = self.tree.get(&ctx, None, key, &guard) {
                let _ = self.record_header(ptr);
            }
        }
        self.writer.lock()
    }

    /// Applies one logged write to the tree and the byte counts (also used by replay).
    /// Returns whether the key existed.
    /// With a `finger` (a batch of several writes), a key that falls in the leaf the
    /// previous one reached is applied there without a descent from the root.
    fn apply(
        &self,
        w: &mut Writer,
        key: &[u8],
        put: bool,
        ptr: DiskOffset,
        finger: Option<&mut index::Finger>,
    ) -> Result<bool> {
        let old = if put {
            let old = match finger {
                Some(finger) => self.tree.insert_near(self, finger, key, ptr.0)?,
                None => self.tree.insert(self, key, ptr.0)?,
            };
            if old.is_none() {
                self.keys.fetch_add(1, Ordering::Relaxed);
            }
            old
        } else {
            let old = match finger {
                Some(finger) => self.tree.remove_near(self, finger, key)?,
                None => self.tree.remove(self, key)?,
            };
            if old.is_some() {
                self.keys.fetch_sub(1, Ordering::Relaxed);
            }
            old
        };
        if let Some(old) = old {
            let len = self.record_header(old)?.total_bytes();
            self.log.account_dead(w, DiskOffset(old), len);
        }
        if self.tree.young_heap_due() {
            self.tree.free_young_heap(self.oldest_snapshot());
        }
        Ok(old.is_some())
    }

    /// `apply` of a batch's run of consecutive puts or of consecutive deletes (`ops`, in
    /// the batch's order, appended at `ptrs`): neighbouring keys go into or leave their
    /// leaf together (`Tree::insert_run_near`, `Tree::remove_run_near`). Returns how many
    /// of the keys existed.
    fn apply_run(
        &self,
        w: &mut Writer,
        ops: &[Op<'_>],
        ptrs: &[DiskOffset],
        finger: &mut index::Finger,
    ) -> Result<usize> {
        if !self.deferred.is_empty() {
            for op in ops {
                self.apply_deferred_of(w, op.key)?;
            }
        }
        let keys: Vec<&[u8]> = ops.iter().map(|op| op.key).collect();
        let mut olds = vec![None; keys.len()];
        let put = ops[0].value.is_some();
        if put {
            let ptrs: Vec<u64> = ptrs.iter().map(|p| p.0).collect();
            self.tree
                .insert_run_near(self, finger, &keys, &ptrs, &mut olds)?;
        } else {
            self.tree.remove_run_near(self, finger, &keys, &mut olds)?;
        }
        let existed = olds.iter().flatten().count();
        let changed = keys.len() - existed;
        if put {
            self.keys.fetch_add(changed as u64, Ordering::Relaxed);
        } else {
            self.keys.fetch_sub(existed as u64, Ordering::Relaxed);
        }
        for old in olds.into_iter().flatten() {
            let len = self.record_header(old)?.total_bytes();
            self.log.account_dead(w, DiskOffset(old), len);
        }
        if self.tree.young_heap_due() {
            self.tree.free_young_heap(self.oldest_snapshot());
        }
        Ok(existed)
    }

    /// Applies what replay found after the committed position, in log order: each record
    /// counted in its segment, each put and delete applied to the tree.
    pub fn apply_replayed(&self, items: Vec<Replayed>) -> Result<()> {
        let mut w = self.writer.lock();
        let mut key = Vec::new();
        for item in items {
            match item {
                Replayed::Put { at, len } | Replayed::Delete { at, len } => {
                    let put = matches!(item, Replayed::Put { .. });
                    self.log.account_replayed(&mut w, at, len, put);
                    self.with_record(at.0, false, |r| {
                        key.clear();
                        key.extend_from_slice(r.key);
                    })?;
                    self.apply(&mut w, &key, put, at, None)?;
                }
                Replayed::Link { at, len } => self.log.account_replayed(&mut w, at, len, false),
            }
        }
        Ok(())
    }

    // ----- commits -------------------------------------------------------------------

    /// Seals the region for a commit: an O(1) epoch bump of the tree under the writer
    /// lock, with the log positions the sealed tree is complete up to. Segments the
    /// writer allocates from now on must not appear in the commit's bitmap image, until
    /// `commit_durable` with `end_seal`.
    pub fn seal_for_commit(&self) -> Result<SealedRegion> {
        // The sealed tree must hold every logged put: deferred ones are applied first,
        // most of them outside the lock.
        self.apply_deferred(true)?;
        let mut w = self.writer.lock();
        self.apply_all_deferred(&mut w)?;
        let sealed = self.tree.seal();
        w.sealed_for_commit = true;
        Ok(SealedRegion {
            root_word: sealed.root,
            tree_epoch: sealed.epoch,
            generation: w.generation,
            next_seq: w.next_seq,
            tails: self.log.positions(&w),
            keys: self.keys(),
            segments: w
                .segments
                .iter()
                .map(|(off, s)| (DiskOffset(*off), *s))
                .collect(),
            next_order: w.next_order,
        })
    }

    /// Writes the foreground tail's pending bytes to the volume (not synced): what a
    /// group sync needs.
    pub fn flush_tail(&self) -> Result<()> {
        self.log.flush_tail()
    }

    /// Writes both tails' pending bytes to the volume (not synced): what a commit needs,
    /// since the tree it persists may point at relocated copies too.
    pub fn flush_tails(&self) -> Result<()> {
        self.log.flush_tail()?;
        self.log.flush_gc_tail()
    }

    /// Persists the tree sealed at `sealed` (`Tree::persist`): node images to write, at
    /// blocks from `alloc`. Returns the root's offset. From then on the commit reads none
    /// of the sealed tree's heap nodes, so those retired since can be freed.
    pub fn persist(
        &self,
        sealed: &SealedRegion,
        alloc: &mut dyn FnMut() -> Result<DiskOffset>,
        images: &mut Vec<(DiskOffset, Box<[u8; NODE_BYTES]>)>,
    ) -> Result<DiskOffset> {
        let root = self
            .tree
            .persist(sealed.root_word, self.id, alloc, images)?;
        self.tree.mark_persisted(sealed.tree_epoch);
        self.tree.free_young_heap(self.oldest_snapshot());
        Ok(root)
    }

    /// Nodes retired at or before `sealed` whose blocks are not free yet: not in the tree
    /// sealed then.
    pub fn retired_nodes(&self, sealed: TreeEpoch) -> Vec<DiskOffset> {
        self.tree.retired_disk_blocks(sealed)
    }

    /// What a commit sealed at `sealed` lists in its free log for this region: nodes and
    /// segments retired at or before that seal (allocated in its bitmap, referenced by
    /// nothing in it).
    pub fn retired_extents(&self, sealed: TreeEpoch) -> Vec<Extent> {
        let mut out: Vec<Extent> = self
            .tree
            .retired_disk_blocks(sealed)
            .into_iter()
            .map(|off| (off, 1))
            .collect();
        // Segments retired after the seal are still in the sealed segment list.
        out.extend(self.retired_segment_extents(sealed));
        out
    }

    /// After a durable commit that sealed this region at `tree_epoch` with its tree at
    /// `root`: the durable seals and committed root move on, and what neither superblock
    /// slot references any more (and no snapshot reads) is returned for freeing.
    /// `end_seal`: writers stop allocating as after a seal (no repeat follows).
    pub fn commit_durable(
        &self,
        tree_epoch: TreeEpoch,
        root: DiskOffset,
        tail_order: u64,
        end_seal: bool,
    ) -> Reclaimed {
        // Commits become durable one at a time, their tails in log order.
        self.set_replay_from_order(tail_order);
        let durable = {
            let mut w = self.writer.lock();
            if end_seal {
                w.sealed_for_commit = false;
            }
            let mut e = self.durable_epochs.lock();
            *e = [e[1], Some(tree_epoch)];
            e[0]
        };
        *self.committed_root.lock() = root;
        // Retired nodes unreferenced by both superblock slots' commits can go.
        let Some(durable) = durable else {
            return Reclaimed::default();
        };
        let nodes = self.tree.reclaim(durable, self.oldest_snapshot());
        let (segments_now, segments_after_readers) = self.reclaim_segments(durable);
        Reclaimed {
            nodes,
            segments_now,
            segments_after_readers,
        }
    }

    /// The newest durable commit's tail segment is of order `order` (an open sets the
    /// one it opened from; each durable commit its own).
    pub(crate) fn set_replay_from_order(&self, order: u64) {
        self.replay_from_order.store(order, Ordering::Release);
    }

    /// Marks the region dropped (writes and reads answer `KeyspaceNotFound` from now on),
    /// waits for a write in progress, and lists every extent it owns: its segments,
    /// retired segments not yet on their way back, the nodes of its committed tree and
    /// nodes retired from it.
    pub fn drop_and_list_extents(&self) -> Result<Vec<Extent>> {
        self.dropped.store(true, Ordering::Release);
        // Wait for a write in progress; later ones see `dropped`.
        let w = self.writer.lock();
        let mut extents: Vec<Extent> = w
            .segments
            .iter()
            .map(|(off, s)| (DiskOffset(*off), s.size_bytes / BLOCK_BYTES))
            .collect();
        drop(w);
        // Segments garbage collection retired and that are not yet on their way to the
        // allocator (those are in `Shared::frees` and stay there).
        extents.extend(self.retired_segments.lock().drain(..).map(|r| r.extent()));
        let root = *self.committed_root.lock();
        let storage = self.shared.volume.storage();
        index::committed_nodes(
            root,
            self.id,
            &mut |off, image| storage.read_at(off.0, image),
            &mut |off| extents.push((off, 1)),
        )?;
        for off in self.tree.retired_disk_blocks(TreeEpoch(u64::MAX)) {
            extents.push((off, 1));
        }
        extents.sort();
        extents.dedup();
        Ok(extents)
    }

    /// Sealed tree epochs of the last two durable commits (older first).
    #[cfg(test)]
    pub fn durable_epochs(&self) -> [Option<TreeEpoch>; 2] {
        *self.durable_epochs.lock()
    }

    #[cfg(test)]
    pub fn tree(&self) -> &Tree {
        &self.tree
    }

    #[cfg(test)]
    pub fn log(&self) -> &Log {
        &self.log
    }

    // ----- snapshots -----------------------------------------------------------------

    /// Seals the running tree epoch and pins the sealed root for a snapshot.
    pub fn open_snapshot(&self) -> Result<(u64, ReaderTicket)> {
        // Deferred puts are applied first, so the snapshot holds every acknowledged
        // write. One that fails to apply (a device error, which poisons the volume as a
        // failed write does) fails the snapshot: a snapshot without it would miss an
        // acknowledged write.
        self.apply_deferred(true)?;
        let mut w = self.writer.lock();
        self.apply_all_deferred(&mut w)?;
        let sealed = self.tree.seal();
        Ok((sealed.root, self.readers.register(sealed.epoch)))
    }

    /// Registers a live-tree iterator: it holds log pointers between calls without an
    /// epoch guard, so nothing retired from now on may be freed while it lives. It counts
    /// as a snapshot of the epoch before the running one (anything retired in the running
    /// epoch or later waits). Returns the ticket to pass to `close_snapshot`.
    pub fn register_live_reader(&self) -> ReaderTicket {
        // Read under the registration's lock: a reclaim deciding now sees this
        // registration or ran before it, when this reader held no pointer yet.
        self.readers
            .register_with(|| TreeEpoch(self.tree.running_epoch().0.saturating_sub(1)))
    }

    /// Registers a reader of the tree sealed at `epoch` (a committed one): nothing retired
    /// after it is freed until `close_snapshot`. The caller holds the commit lock, so that
    /// a commit does not free the tree between reading `epoch` and this call.
    pub fn register_snapshot_at(&self, epoch: TreeEpoch) -> ReaderTicket {
        self.readers.register(epoch)
    }

    /// Closes a registration (a snapshot's, a live range's or a pinned commit's).
    pub fn close_snapshot(&self, ticket: ReaderTicket) {
        self.readers.close(ticket);
    }

    /// The oldest epoch a snapshot or live range still reads.
    pub fn oldest_snapshot(&self) -> Option<TreeEpoch> {
        self.readers.oldest()
    }

    // ----- segments ------------------------------------------------------------------

    pub fn segment_count(&self) -> u64 {
        self.segment_totals.count()
    }

    /// Total size of the region's log segments (what the log occupies in the volume).
    pub fn log_size_bytes(&self) -> u64 {
        self.segment_totals.size_bytes()
    }

    /// The region's segments with their counts (for tests).
    #[cfg(test)]
    pub fn segments(&self) -> std::collections::BTreeMap<u64, SegmentStats> {
        self.writer.lock().segments.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    /// The story: `INFO` on a server under a heavy write load answered only when a writer
    /// let go of its region's lock, which it may hold while the device takes a full budget
    /// of writes in flight: `stats()` read the segment count and the log's size under that
    /// lock. They come from counters now. Here `stats()` is asked while the lock is held,
    /// and its figures must match the segment map's.
    #[test]
    fn stats_are_read_without_the_writer_lock() {
        let db = crate::Database::builder().open_in_memory().unwrap();
        let keyspace = db.keyspace("t").unwrap();
        for i in 0..60_000u32 {
            keyspace.put(&i.to_be_bytes(), &[7u8; 100]).unwrap();
        }
        let region = db.engine.regions.get("t").unwrap();
        let held = region.writer.lock();
        let count = held.segments.len() as u64;
        let size_bytes: u64 = held.segments.values().map(|s| s.size_bytes).sum();
        assert!(count > 1, "the load fills more than one segment: {count}");
        let (sender, receiver) = std::sync::mpsc::channel();
        let asking = db.clone();
        std::thread::spawn(move || sender.send(asking.stats()).is_ok());
        let stats = receiver
            .recv_timeout(Duration::from_secs(60))
            .expect("stats() waits for the writer lock");
        drop(held);
        assert_eq!(stats.keyspaces[0].log_segments, count);
        assert_eq!(stats.keyspaces[0].log_size_bytes, size_bytes);
        assert_eq!(stats.log_size_bytes, size_bytes);
    }
}
