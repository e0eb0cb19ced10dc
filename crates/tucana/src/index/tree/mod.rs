//! The tree of one region: the root word, the running tree epoch, the writer check, the
//! list of retired nodes, and every heap node reachable from the root or the list.
//!
//! The tree's methods are spread over its files by role, each file holding the `unsafe`
//! of its role with its argument:
//! - `write`: the writer's changes (insert, remove, replace a pointer, seal) and
//!   copy-on-write of sealed and disk nodes on the writer's path;
//! - `finger`: a batch's inserts and removes that land in the leaf the previous one
//!   reached, without a descent from the root;
//! - `split`: top-down splits of full nodes and the stems they grow or shrink;
//! - `read`: lock-free descents for readers (get, points-at, leaf copies);
//! - `persist`: the commit's side: disk images of sealed trees, retired nodes' blocks,
//!   reclamation, and the log records the tree still names (EXTERNAL pivots);
//! - `check`: a full verification of a tree against its log;
//! - here: the tree's state, shared types, node counting, and freeing on drop.
//!
//! Does not own: node bytes (`node`), comparisons inside a node (`search`), log records,
//! blocks, commits.
//!
//! Thread safety (see also the module doc of `index`):
//! - Writer methods (`insert`, `remove`, `replace_ptr`, `seal`, `external_pivots`) take
//!   `&self` and must not overlap; a swap on `writer_busy` panics if they do. The writer
//!   changes published nodes in place only inside the node's seqlock
//!   (`write_begin`/`write_end`) and never does I/O inside it.
//! - Readers (`get`, `points_at`, `copy_leaf`) use optimistic lock coupling: read a node's
//!   version, read, validate; validate the parent again after reading the child's version;
//!   restart from the live root when anything moved. Nodes of older epochs and disk nodes
//!   never change.
//! - Readers start from the live root (`root: None`: loaded, and re-checked after the
//!   root's version is read, like any parent) or from a sealed root a caller captured
//!   under the writer lock (`Some`: immutable, so never re-checked). A live root word
//!   loaded earlier is not a snapshot: a root split may truncate it before a seal.
//! - `persist`, `mark_persisted`, `reclaim`, `free_young_heap` and `retired_disk_blocks`
//!   may run on another thread beside the writer. Calls of `persist` must not overlap each
//!   other.

mod check;
mod finger;
mod persist;
mod read;
mod split;
mod write;

pub use check::TreeCheck;
pub use finger::Finger;
pub use read::{LeafCopy, Seek};

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};

use parking_lot::Mutex;

use crate::index::node::heap::{alloc_internal, alloc_leaf, as_internal, free_node};
use crate::index::node::{disk_word, Header, NodeRef};
use crate::index::Ctx;
use crate::types::{DiskOffset, RegionId, TreeEpoch};

/// Retired heap nodes the writer lets gather before it frees them (`free_young_heap`).
const YOUNG_HEAP_BATCH: u64 = 64;

/// A root made immutable by [`Tree::seal`]: what snapshots read and commits persist.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sealed {
    /// Root word (0 = empty tree, heap pointer, or disk offset | 1).
    pub root: u64,
    /// The epoch that was running until the seal; every node reachable from `root` was
    /// created in it or before.
    pub epoch: TreeEpoch,
}

/// An opaque handle on a retired heap node.
#[derive(Debug)]
pub struct HeapNode(NonNull<Header>);

// SAFETY: a retired heap node is immutable and is only freed by `reclaim` or the tree's
// `Drop`, each of which takes it out of the retired list first, so the handle may move
// between threads.
unsafe impl Send for HeapNode {}
// SAFETY: as above; the handle is only read (the disk offset word, an atomic).
unsafe impl Sync for HeapNode {}

#[derive(Debug)]
pub enum RetiredNode {
    Heap(HeapNode),
    Disk(DiskOffset),
}

/// A node replaced by copy-on-write. Snapshots older than `epoch`, commits of sealed roots
/// older than `epoch`, and in-flight readers may still read it.
#[derive(Debug)]
pub struct Retired {
    /// The running epoch when the node was replaced.
    pub epoch: TreeEpoch,
    pub node: RetiredNode,
}

/// The index of one region. See the module docs for the concurrency rules.
pub struct Tree {
    region: RegionId,
    /// Root word: 0, heap pointer, or disk offset | 1.
    root: AtomicU64,
    /// Nodes whose epoch equals this are writable in place; older ones are copied first.
    running: AtomicU64,
    writer_busy: AtomicBool,
    /// Retired nodes whose heap memory is gone (or never was): disk blocks waiting for
    /// the commits that free them.
    retired: Mutex<Vec<Retired>>,
    /// Retired heap nodes whose memory is still held: freed early by `free_young_heap`
    /// once no commit, snapshot or reader can read them (their disk blocks then move to
    /// `retired`), or with their blocks by `reclaim`.
    young: Mutex<Vec<Retired>>,
    /// Entries in `young`, readable without its lock.
    young_len: AtomicU64,
    /// `young_len` at which the writer's next `free_young_heap` pass is due: a batch of
    /// retirements past what the last pass had to keep (so that a pass that can free
    /// nothing, while an old snapshot is open, is not repeated at every write).
    young_due: AtomicU64,
    /// Every sealed epoch up to this one that a commit persists has been persisted: no
    /// commit reads heap nodes retired in `persisted + 1` or earlier.
    persisted: AtomicU64,
    /// Heap nodes reachable from the root or retired but not yet reclaimed.
    heap_nodes: AtomicU64,
    /// Nodes made in the running epoch (new or copied): about what the next commit
    /// writes (nodes made and retired within the epoch are counted too).
    dirty_nodes: AtomicU64,
    /// What the writer's leaf work cost in key reads (see [`WriteCounts`]); written by the
    /// writer only, read by anyone.
    leaf_splits: AtomicU64,
    restemmed_halves: AtomicU64,
    split_key_reads: AtomicU64,
    insert_key_reads: AtomicU64,
    stem_shrinks: AtomicU64,
    /// Changes of the tree's shape by the writer (splits, pruned leaves, seals): a
    /// [`Finger`] taken before one no longer names a node the writer may trust.
    shape_changes: AtomicU64,
}

/// Counts of the writer's leaf work since the tree was made: how often splits and inserts
/// read full keys through [`Ctx`] (for a region, log records, which larger than memory
/// are page faults taken under the writer lock). A point-in-time reading.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteCounts {
    /// Leaf splits.
    pub leaf_splits: u64,
    /// Halves of leaf splits that got a longer stem (each read all its keys).
    pub restemmed_halves: u64,
    /// Keys leaf splits read: split point, separator and longer stems.
    pub split_key_reads: u64,
    /// Keys leaf inserts read to place a key among entries whose prefixes tie.
    pub insert_key_reads: u64,
    /// Leaf stems cut short by an insert of a key without them.
    pub stem_shrinks: u64,
}

/// A [`Ctx`] that counts the full keys read through it (`key_cmp`, `key_into`): what
/// [`WriteCounts`] is made of. Single-threaded (the writer's).
pub(super) struct CountingCtx<'a, C> {
    ctx: &'a C,
    reads: std::cell::Cell<u64>,
}

impl<'a, C: Ctx> CountingCtx<'a, C> {
    pub(super) fn new(ctx: &'a C) -> CountingCtx<'a, C> {
        CountingCtx {
            ctx,
            reads: std::cell::Cell::new(0),
        }
    }

    pub(super) fn reads(&self) -> u64 {
        self.reads.get()
    }
}

impl<C: Ctx> Ctx for CountingCtx<'_, C> {
    fn key_cmp(&self, ptr: u64, key: &[u8]) -> crate::error::Result<std::cmp::Ordering> {
        self.reads.set(self.reads.get() + 1);
        self.ctx.key_cmp(ptr, key)
    }

    fn key_into(&self, ptr: u64, out: &mut Vec<u8>) -> crate::error::Result<()> {
        self.reads.set(self.reads.get() + 1);
        self.ctx.key_into(ptr, out)
    }

    fn with_node<R>(
        &self,
        off: DiskOffset,
        f: impl FnOnce(&[u8]) -> crate::error::Result<R>,
    ) -> crate::error::Result<R> {
        self.ctx.with_node(off, f)
    }
}

/// Marks a writer method as running; two at once is a caller bug (the region's writer lock
/// must serialise them), caught here cheaply.
struct WriterGuard<'a>(&'a AtomicBool);

impl Drop for WriterGuard<'_> {
    fn drop(&mut self) {
        self.0.store(false, Release);
    }
}

impl Tree {
    /// An empty tree whose writable epoch is `running`.
    pub fn new(region: RegionId, running: TreeEpoch) -> Tree {
        Tree {
            region,
            root: AtomicU64::new(0),
            running: AtomicU64::new(running.0),
            writer_busy: AtomicBool::new(false),
            retired: Mutex::new(Vec::new()),
            young: Mutex::new(Vec::new()),
            young_len: AtomicU64::new(0),
            young_due: AtomicU64::new(YOUNG_HEAP_BATCH),
            // No sealed tree of this process older than `running` holds a heap node.
            persisted: AtomicU64::new(running.0.saturating_sub(1)),
            heap_nodes: AtomicU64::new(0),
            dirty_nodes: AtomicU64::new(0),
            leaf_splits: AtomicU64::new(0),
            restemmed_halves: AtomicU64::new(0),
            split_key_reads: AtomicU64::new(0),
            insert_key_reads: AtomicU64::new(0),
            stem_shrinks: AtomicU64::new(0),
            shape_changes: AtomicU64::new(0),
        }
    }

    /// A tree over a committed root (`DiskOffset::NONE` = empty). Loads nothing: nodes are
    /// read through `Ctx::with_node` and copied into memory only when written.
    pub fn from_disk(region: RegionId, root: DiskOffset, running: TreeEpoch) -> Tree {
        let tree = Tree::new(region, running);
        if !root.is_none() {
            tree.root.store(disk_word(root), Relaxed);
        }
        tree
    }

    pub fn region(&self) -> RegionId {
        self.region
    }

    /// The live root word, to pass to `get`/`copy_leaf` for the latest state.
    pub fn root_word(&self) -> u64 {
        self.root.load(Acquire)
    }

    pub fn running_epoch(&self) -> TreeEpoch {
        TreeEpoch(self.running.load(Acquire))
    }

    /// Heap nodes held (reachable or retired and not yet reclaimed); each is `NODE_BYTES`.
    pub fn heap_nodes(&self) -> u64 {
        self.heap_nodes.load(Relaxed)
    }

    /// Nodes made since the last seal, at most: what the next commit writes, about.
    pub fn dirty_nodes(&self) -> u64 {
        self.dirty_nodes.load(Relaxed)
    }

    /// The writer's leaf work so far, in key reads.
    pub fn write_counts(&self) -> WriteCounts {
        WriteCounts {
            leaf_splits: self.leaf_splits.load(Relaxed),
            restemmed_halves: self.restemmed_halves.load(Relaxed),
            split_key_reads: self.split_key_reads.load(Relaxed),
            insert_key_reads: self.insert_key_reads.load(Relaxed),
            stem_shrinks: self.stem_shrinks.load(Relaxed),
        }
    }

    /// Adds `n` to one of the writer's counters (writer only: a load and a store, no
    /// read-modify-write on the hot path).
    fn count(counter: &AtomicU64, n: u64) {
        if n > 0 {
            counter.store(counter.load(Relaxed) + n, Relaxed);
        }
    }

    /// Counts a node made in the running epoch.
    /// Records a change of shape: every [`Finger`] taken before it is stale. Writer only.
    fn shape_changed(&self) {
        self.shape_changes.fetch_add(1, Relaxed);
    }

    fn made_node(&self) {
        self.heap_nodes.fetch_add(1, Relaxed);
        self.dirty_nodes.fetch_add(1, Relaxed);
    }

    fn writer(&self) -> WriterGuard<'_> {
        if self.writer_busy.swap(true, Acquire) {
            panic!("index::Tree: two writer calls at once (the region writer lock must serialise them)");
        }
        WriterGuard(&self.writer_busy)
    }

    fn new_leaf(&self, running: u64) -> NonNull<Header> {
        self.made_node();
        alloc_leaf(running, self.region)
    }

    fn new_internal(&self, running: u64, level: u8) -> NonNull<Header> {
        self.made_node();
        alloc_internal(running, self.region, level)
    }

    fn retire(&self, node: RetiredNode, running: u64) {
        let retired = Retired {
            epoch: TreeEpoch(running),
            node,
        };
        match retired.node {
            RetiredNode::Heap(_) => {
                let mut young = self.young.lock();
                young.push(retired);
                self.young_len.store(young.len() as u64, Relaxed);
            }
            RetiredNode::Disk(_) => self.retired.lock().push(retired),
        }
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        // `&mut self`: no reader or writer is inside the tree. Nodes reachable from the root
        // form a tree (each reached once); retired nodes are freed alone, since their
        // children are shared with the live version.
        fn free_subtree(word: u64) {
            let Some(NodeRef::Heap(p)) = NodeRef::decode(word) else {
                return;
            };
            // SAFETY: reachable from the root of a tree being dropped; freed once.
            unsafe {
                let m = p.as_ref().meta();
                if !m.is_leaf() {
                    let node = as_internal(p);
                    for i in 0..=m.count as usize {
                        free_subtree(node.child[i].load(Relaxed));
                    }
                }
                free_node(p);
            }
        }
        free_subtree(*self.root.get_mut());
        let young = std::mem::take(self.young.get_mut());
        for r in self.retired.get_mut().drain(..).chain(young) {
            if let RetiredNode::Heap(h) = r.node {
                // SAFETY: a retired node is not reachable from the root; freed once.
                unsafe { free_node(h.0) };
            }
        }
    }
}

// The tree is shared between the writer, readers and the commit thread.
const _: fn() = || {
    fn shared<T: Send + Sync>() {}
    shared::<Tree>();
};
