//! The commit's side of a tree: disk images of a sealed tree, the blocks of retired nodes,
//! reclamation of what no commit, snapshot or reader can reach, and the log records the
//! tree itself still names (EXTERNAL pivots, which garbage collection must keep).
//!
//! Owns: the post-order walk that gives every new heap node of a sealed tree a block and
//! an image, the retired list's release rule (DESIGN.md, *Freeing*), and handing retired
//! heap nodes to `crossbeam_epoch`. Does not own: allocating blocks, writing images, the
//! free log, or deciding when to persist and reclaim (the commit).
//!
//! Thread safety: `persist`, `reclaim`, `has_retired` and `retired_disk_blocks` may run on
//! another thread beside the writer and readers (calls of `persist` must not overlap);
//! `external_pivots` is the writer's. Its `unsafe`: nodes reachable from a sealed root
//! are immutable and live until reclaimed, which needs a durable epoch past the commit
//! persisting them, or until `free_young_heap` frees their memory, which needs that
//! commit's `mark_persisted` (and no older snapshot); retired nodes are live until the
//! closure `reclaim` or `free_young_heap` defers runs, after every reader that could have
//! found them unpinned.

use std::ptr::NonNull;
use std::sync::atomic::Ordering::*;

use super::{HeapNode, Retired, RetiredNode, Tree};
use crate::error::Result;
use crate::index::node::heap::{as_internal, free_nodes};
use crate::index::node::image::{encode_image, DiskNode};
use crate::index::node::view::{no_restart, HeapInternal, InternalRead};
use crate::index::node::{disk_word, Header, NodeRef, C_INT, NODE_BYTES, W_DISK};
use crate::index::Ctx;
use crate::types::{DiskOffset, RegionId, TreeEpoch};

impl Tree {
    /// Builds disk images of every heap node reachable from `sealed_root` that has no disk
    /// offset yet (post-order, so children get offsets first), allocating each a block with
    /// `alloc` and recording the offset in the node. Returns the root's offset
    /// (`DiskOffset::NONE` for an empty tree).
    ///
    /// Runs beside the writer and readers; `sealed_root` must come from `seal`, and calls
    /// must not overlap. Offsets are recorded as images are built, before they are written:
    /// if the commit then fails, the region must stop (be poisoned) rather than persist again.
    pub fn persist(
        &self,
        sealed_root: u64,
        region: RegionId,
        alloc: &mut dyn FnMut() -> Result<DiskOffset>,
        out: &mut Vec<(DiskOffset, Box<[u8; NODE_BYTES]>)>,
    ) -> Result<DiskOffset> {
        assert_eq!(region, self.region, "persist for another region's tree");
        match NodeRef::decode(sealed_root) {
            None => Ok(DiskOffset::NONE),
            Some(NodeRef::Disk(off)) => Ok(off),
            Some(NodeRef::Heap(p)) => {
                // SAFETY: a sealed root's nodes are live until reclaimed, which needs a
                // durable epoch past the commit that is running this, or freed early by
                // `free_young_heap`, which needs `mark_persisted` of this seal first.
                let epoch = unsafe { p.as_ref() }.epoch();
                assert!(
                    epoch < self.running.load(Acquire),
                    "persist of a root that is not sealed"
                );
                let _guard = crossbeam_epoch::pin();
                self.persist_node(p, alloc, out)
            }
        }
    }

    fn persist_node(
        &self,
        p: NonNull<Header>,
        alloc: &mut dyn FnMut() -> Result<DiskOffset>,
        out: &mut Vec<(DiskOffset, Box<[u8; NODE_BYTES]>)>,
    ) -> Result<DiskOffset> {
        // SAFETY: reachable from a sealed root, see `persist`.
        let hdr = unsafe { p.as_ref() };
        let done = hdr.disk_offset();
        if done != 0 {
            // Persisted by an earlier commit; so is everything below it (it is immutable).
            return Ok(DiskOffset(done));
        }
        let m = hdr.meta();
        let mut children = [0u64; C_INT + 1];
        if !m.is_leaf() {
            // SAFETY: kind checked.
            let node = unsafe { as_internal(p) };
            for (i, slot) in children.iter_mut().enumerate().take(m.count as usize + 1) {
                let w = node.child[i].load(Acquire);
                *slot = match NodeRef::decode(w) {
                    None => panic!("internal node with an empty child slot {i}"),
                    Some(NodeRef::Heap(c)) => disk_word(self.persist_node(c, alloc, out)?),
                    Some(NodeRef::Disk(_)) => w,
                };
            }
        }
        let off = alloc()?;
        assert!(
            !off.is_none() && off.block_aligned(),
            "allocator gave {off:?} for an index node"
        );
        let img = encode_image(p, off, self.region, |i| children[i]);
        hdr.w[W_DISK].store(off.0, Release);
        out.push((off, img));
        Ok(off)
    }

    /// Frees every retired node that no commit, snapshot or reader can reach any more:
    /// retired in an epoch `<= durable`, and no snapshot older than that epoch. Heap memory
    /// is freed once all current crossbeam-epoch readers are gone; the nodes' disk blocks
    /// (a disk node's offset, or a heap node's assigned offset) are returned, and the
    /// caller must likewise wait for readers before reusing them.
    pub fn reclaim(
        &self,
        durable: TreeEpoch,
        oldest_snapshot: Option<TreeEpoch>,
    ) -> Vec<DiskOffset> {
        let free = |r: &Retired| r.epoch <= durable && oldest_snapshot.is_none_or(|s| s >= r.epoch);
        let taken: Vec<Retired> = {
            // Both lists at once (always `retired` first): a node moving from one to the
            // other is never missed.
            let mut list = self.retired.lock();
            let mut young = self.young.lock();
            let (mut take, keep): (Vec<Retired>, Vec<Retired>) = list.drain(..).partition(free);
            *list = keep;
            let (take_young, keep): (Vec<Retired>, Vec<Retired>) = young.drain(..).partition(free);
            *young = keep;
            self.young_len.store(young.len() as u64, Relaxed);
            self.young_due
                .store(young.len() as u64 + super::YOUNG_HEAP_BATCH, Relaxed);
            take.extend(take_young);
            take
        };
        if taken.is_empty() {
            return Vec::new();
        }
        let mut heap = Vec::new();
        let mut blocks = Vec::new();
        for r in taken {
            match r.node {
                RetiredNode::Heap(h) => {
                    // SAFETY: retired nodes stay live until freed below.
                    let off = unsafe { h.0.as_ref() }.disk_offset();
                    if off != 0 {
                        blocks.push(DiskOffset(off));
                    }
                    heap.push(h);
                }
                RetiredNode::Disk(off) => blocks.push(off),
            }
        }
        self.free_heap_after_readers(heap);
        blocks
    }

    /// Records that the commit of the tree sealed at `epoch` has built the images of its
    /// nodes (`persist` returned): it reads none of their heap memory any more.
    pub fn mark_persisted(&self, epoch: TreeEpoch) {
        self.persisted.fetch_max(epoch.0, AcqRel);
    }

    /// Retired heap nodes held in memory and not yet freed (`free_young_heap` frees them).
    pub fn young_heap_nodes(&self) -> u64 {
        self.young_len.load(Relaxed)
    }

    /// True when enough heap nodes were retired since the last `free_young_heap` pass
    /// for the writer to run another.
    pub fn young_heap_due(&self) -> bool {
        self.young_len.load(Relaxed) >= self.young_due.load(Relaxed)
    }

    /// Frees the heap memory of retired nodes that nobody can read any more, without
    /// waiting for the commits that free their disk blocks: retired in an epoch `e` with
    /// every sealed tree older than `e` either persisted already (`mark_persisted`, so no
    /// commit walks it) or read by no snapshot (`oldest_snapshot` is none or `>= e`).
    /// Their disk blocks, if they have any, stay in the retired list for `reclaim`. A node
    /// retired in `e` belongs only to sealed trees older than `e`: the live tree and every
    /// later seal no longer reach it. Returns the number of nodes freed.
    ///
    /// Without this, a node replaced by copy-on-write held its 4 KiB until the second
    /// durable commit after it: under random writes, nearly every leaf twice over.
    pub fn free_young_heap(&self, oldest_snapshot: Option<TreeEpoch>) -> u64 {
        let persisted = self.persisted.load(Acquire);
        let free = |r: &Retired| {
            r.epoch.0 <= persisted.saturating_add(1) && oldest_snapshot.is_none_or(|s| s >= r.epoch)
        };
        let mut heap = Vec::new();
        {
            // Both lists at once (always `retired` first), so that `retired_disk_blocks`
            // never misses a block on its way from one to the other.
            let mut list = self.retired.lock();
            let mut young = self.young.lock();
            let (take, keep): (Vec<Retired>, Vec<Retired>) = young.drain(..).partition(free);
            *young = keep;
            self.young_len.store(young.len() as u64, Relaxed);
            self.young_due
                .store(young.len() as u64 + super::YOUNG_HEAP_BATCH, Relaxed);
            for r in take {
                let RetiredNode::Heap(h) = r.node else {
                    unreachable!("only heap nodes are young")
                };
                // SAFETY: retired nodes stay live until freed below.
                let off = unsafe { h.0.as_ref() }.disk_offset();
                if off != 0 {
                    list.push(Retired {
                        epoch: r.epoch,
                        node: RetiredNode::Disk(DiskOffset(off)),
                    });
                }
                heap.push(h);
            }
        }
        let freed = heap.len() as u64;
        if freed > 0 {
            self.free_heap_after_readers(heap);
        }
        freed
    }

    /// Frees `heap` once every reader pinned now has unpinned.
    fn free_heap_after_readers(&self, heap: Vec<HeapNode>) {
        self.heap_nodes.fetch_sub(heap.len() as u64, Relaxed);
        let guard = crossbeam_epoch::pin();
        // SAFETY: the nodes are unreachable from the live root and from every sealed root
        // anyone may still read (the epoch rules of the callers); readers that found them
        // before are pinned, and the closure runs only after they unpin. Each node is freed
        // once: it left the retired lists in the caller.
        unsafe {
            guard.defer_unchecked(move || free_nodes(heap.into_iter().map(|h| h.0)));
        }
        guard.flush();
    }

    /// True if replaced nodes wait for commits (and readers) before they are freed.
    pub fn has_retired(&self) -> bool {
        !self.retired.lock().is_empty() || !self.young.lock().is_empty()
    }

    /// Disk blocks of retired nodes retired in an epoch `<= upto` (for the commit's free log).
    pub fn retired_disk_blocks(&self, upto: TreeEpoch) -> Vec<DiskOffset> {
        let list = self.retired.lock();
        let young = self.young.lock();
        list.iter()
            .chain(young.iter())
            .filter(|r| r.epoch <= upto)
            .filter_map(|r| match &r.node {
                RetiredNode::Disk(off) => Some(*off),
                // SAFETY: nodes in the retired list are live.
                RetiredNode::Heap(h) => match unsafe { h.0.as_ref() }.disk_offset() {
                    0 => None,
                    off => Some(DiskOffset(off)),
                },
            })
            .collect()
    }

    /// Calls `f` with the log pointer of every separator kept by pointer (an EXTERNAL
    /// pivot, see `MAX_INLINE_PIVOT`) in the live tree's internal nodes. Garbage collection
    /// asks before it frees a log segment: such a pivot reads its key from the log, and the
    /// record it names may be dead (its key deleted) yet still needed. Writer only (the
    /// live tree does not change meanwhile). Visits internal nodes only (~1 in 128 nodes).
    pub fn external_pivots<C: Ctx>(&self, ctx: &C, f: &mut dyn FnMut(u64)) -> Result<()> {
        let _w = self.writer();
        fn visit<V: InternalRead>(
            v: &V,
            f: &mut dyn FnMut(u64),
            below: &mut Vec<u64>,
        ) -> Result<()> {
            for i in 0..v.count() {
                let d = v.pivot_desc(i);
                if d.is_external() {
                    let mut b = [0u8; 8];
                    no_restart(v.area_read(d.area_at as usize, &mut b))?;
                    f(u64::from_le_bytes(b));
                }
            }
            if v.level() > 1 {
                below.extend((0..=v.count()).map(|i| v.child(i)));
            }
            Ok(())
        }
        let mut stack = vec![self.root.load(Acquire)];
        while let Some(word) = stack.pop() {
            match NodeRef::decode(word) {
                None => {}
                Some(NodeRef::Heap(p)) => {
                    // SAFETY: reachable from the live root, which only this writer changes.
                    if unsafe { p.as_ref() }.meta().is_leaf() {
                        continue;
                    }
                    let view = HeapInternal {
                        // SAFETY: kind checked.
                        node: unsafe { as_internal(p) },
                        version: None,
                    };
                    visit(&view, f, &mut stack)?;
                }
                Some(NodeRef::Disk(off)) => {
                    ctx.with_node(off, |img| {
                        let d = DiskNode::open(img, off, self.region, None)?;
                        if d.meta().is_leaf() {
                            return Ok(());
                        }
                        visit(&d, f, &mut stack)
                    })?;
                }
            }
        }
        Ok(())
    }
}
