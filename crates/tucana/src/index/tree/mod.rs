//! The tree of one region: descent, insert/remove with top-down splits, copy-on-write by
//! tree epoch, sealing, persisting sealed roots as disk images, retirement and reclamation.
//!
//! Owns: the root word, the running tree epoch, the writer check, the list of retired nodes,
//! and every heap node reachable from the root or the list. Does not own: node bytes
//! (`node`), comparisons inside a node (`search`), log records, blocks, commits.
//!
//! Thread safety (see also the module doc of `index`):
//! - Writer methods (`insert`, `remove`, `seal`) take `&self` and must not overlap; a swap
//!   on `writer_busy` panics if they do. The writer changes published nodes in place only
//!   inside the node's seqlock (`write_begin`/`write_end`) and never does I/O inside it.
//! - Readers (`get`, `copy_leaf`) use optimistic lock coupling: read a node's version, read,
//!   validate; validate the parent again after reading the child's version; restart from the
//!   live root when anything moved. Nodes of older epochs and disk nodes never change.
//! - Readers start from the live root (`root: None`: loaded, and re-checked after the
//!   root's version is read, like any parent) or from a sealed root a caller captured
//!   under the writer lock (`Some`: immutable, so never re-checked). A live root word
//!   loaded earlier is not a snapshot: a root split may truncate it before a seal.
//! - `persist`, `reclaim`, `retired_disk_blocks` may run on another thread beside the writer.
//!   Calls of `persist` must not overlap each other.

use std::cmp::Ordering;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};

use crossbeam_epoch::Guard;
use parking_lot::Mutex;

use super::node::{
    alloc_internal, alloc_leaf, as_internal, as_leaf, disk_word, encode_image, free_node,
    heap_copy, heap_from_image, heap_word, no_restart, prefetch_leaf_word, DiskNode, Header,
    HeapInternal, HeapLeaf, InternalNode, InternalRead, LeafNode, LeafRead, Meta, NodeRef,
    PivotDesc, SResult, SearchErr, AREA_FREE_MIN_BYTES, C_INT, C_LEAF, KEY_AREA_BYTES,
    KIND_INTERNAL, KIND_LEAF, MAX_INLINE_PIVOT, MAX_INT_STEM_BYTES, MAX_STEM_BYTES, NODE_BYTES,
    PIVOT_EXTERNAL, W_DISK,
};
use super::search::{
    child_index, leaf_entry_of, leaf_get, leaf_points_at, leaf_position, pivot_into, separator,
    stem_position, StemPos,
};
use super::{key_hash, key_prefix, Ctx};
use crate::error::{Error, Result};
use crate::types::{DiskOffset, RegionId, TreeEpoch};

/// A root made immutable by [`Tree::seal`]: what snapshots read and commits persist.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sealed {
    /// Root word (0 = empty tree, heap pointer, or disk offset | 1).
    pub root: u64,
    /// The epoch that was running until the seal; every node reachable from `root` was
    /// created in it or before.
    pub epoch: TreeEpoch,
}

/// Where a [`Tree::copy_leaf`] lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seek<'a> {
    First,
    Last,
    /// The leaf whose key range contains the key.
    AtOrAfter(&'a [u8]),
    /// The leaf whose range holds the largest keys below the key (it may hold larger ones too).
    Before(&'a [u8]),
}

/// One leaf copied out of the tree: its log pointers in key order and its fences.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeafCopy {
    pub ptrs: Vec<u64>,
    /// The entries' key prefixes (the 8 key bytes after `stem`), parallel to `ptrs`: let an
    /// iterator find its start in the leaf without reading most keys (see `tie_span`).
    pub prefixes: Vec<u64>,
    /// The bytes every key of the leaf starts with.
    pub stem: Vec<u8>,
    /// Tightest inclusive lower bound of the leaf's key range (`None` at the left edge).
    pub low: Option<Vec<u8>>,
    /// Tightest exclusive upper bound (`None` at the right edge).
    pub high: Option<Vec<u8>>,
}

impl LeafCopy {
    /// True if `key` lies inside the leaf's fences, as every key of a sound leaf does.
    pub fn holds(&self, key: &[u8]) -> bool {
        self.low.as_deref().is_none_or(|l| l <= key) && self.high.as_deref().is_none_or(|h| key < h)
    }

    /// The entries whose order against `key` their prefixes cannot settle: entries before
    /// the returned start are below `key`, entries from its end on are above it, and only
    /// those in between (equal prefixes) need their full keys compared.
    pub fn tie_span(&self, key: &[u8]) -> std::ops::Range<usize> {
        match stem_position(&self.stem, key) {
            StemPos::Below => 0..0,
            StemPos::Above => self.ptrs.len()..self.ptrs.len(),
            StemPos::Inside(kp) => {
                self.prefixes.partition_point(|x| *x < kp)
                    ..self.prefixes.partition_point(|x| *x <= kp)
            }
        }
    }
}

/// New prefixes and stem for a node whose stem grows (a split that finds the keys or
/// pivots of a half share more bytes): applied inside the node's write section.
struct Restem {
    stem: Vec<u8>,
    prefixes: Vec<u64>,
}

/// Number of leading bytes `a` and `b` share.
/// The separator of a leaf split whose boundary entries have different prefixes `pl <
/// pr` (after the leaf's `stem`), with no log read: the stem and the right key's bytes up
/// to the first byte where the prefixes differ. It is above the left key (equal before
/// that byte, greater at it) and a prefix of the right key, which really has that byte:
/// it is greater than the left key's there, so it is not the zero padding of a short key.
fn prefix_separator(stem: &[u8], pl: u64, pr: u64) -> Sep {
    assert!(pl < pr, "prefix separator of unordered prefixes");
    let first_diff = (pl ^ pr).leading_zeros() as usize / 8;
    let mut bytes = Vec::with_capacity(stem.len() + first_diff + 1);
    bytes.extend_from_slice(stem);
    bytes.extend_from_slice(&pr.to_be_bytes()[..=first_diff]);
    Sep::inline(bytes)
}

fn common_len(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The prefix an entry gets when its leaf's stem shrinks from `old_stem` to its first
/// `new_len` bytes: the stem bytes given up come first, then the old prefix. Needs no log
/// read, which is why inserts may shrink a stem freely and only splits grow one.
fn prefix_after_shrink(old_stem: &[u8], new_len: usize, prefix: u64) -> u64 {
    let mut b = [0u8; 16];
    let given_up = &old_stem[new_len..];
    let n = given_up.len().min(8);
    b[..n].copy_from_slice(&given_up[..n]);
    b[n..n + 8].copy_from_slice(&prefix.to_be_bytes());
    let mut out = [0u8; 8];
    out.copy_from_slice(&b[..8]);
    u64::from_be_bytes(out)
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

/// What [`Tree::check`] found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TreeCheck {
    /// Levels (0 for an empty tree, 1 for a single leaf).
    pub height: u32,
    pub heap_nodes: u64,
    pub disk_nodes: u64,
    pub leaves: u64,
    pub keys: u64,
    pub pivots: u64,
    /// Pivots longer than `MAX_INLINE_PIVOT`, kept as log pointers.
    pub external_pivots: u64,
    /// Bytes of leaf stems, summed over leaves.
    pub stem_bytes: u64,
    /// Bytes of internal node stems, summed over internal nodes.
    pub internal_stem_bytes: u64,
}

/// The index of one region. See the module docs for the concurrency rules.
pub struct Tree {
    region: RegionId,
    /// Root word: 0, heap pointer, or disk offset | 1.
    root: AtomicU64,
    /// Nodes whose epoch equals this are writable in place; older ones are copied first.
    running: AtomicU64,
    writer_busy: AtomicBool,
    retired: Mutex<Vec<Retired>>,
    /// Heap nodes reachable from the root or retired but not yet reclaimed.
    heap_nodes: AtomicU64,
    /// Nodes made in the running epoch (new or copied): about what the next commit
    /// writes (nodes made and retired within the epoch are counted too).
    dirty_nodes: AtomicU64,
}

/// Marks a writer method as running; two at once is a caller bug (the region's writer lock
/// must serialise them), caught here cheaply.
struct WriterGuard<'a>(&'a AtomicBool);

impl Drop for WriterGuard<'_> {
    fn drop(&mut self) {
        self.0.store(false, Release);
    }
}

/// Entries a leaf split leaves on the side a sequential load moves away from.
const LEAF_SPLIT_EDGE: usize = C_LEAF / 10;

/// A separator on its way into an internal node. Its whole bytes are at hand (an EXTERNAL
/// one's read from the log once), because where it goes decides its prefix: the 8 bytes
/// after that node's stem, which it may also shrink.
struct Sep {
    /// The separator; for an EXTERNAL one, the full key of the record at `external`.
    bytes: Vec<u8>,
    /// Log pointer of an EXTERNAL separator (longer than `MAX_INLINE_PIVOT`).
    external: Option<u64>,
}

impl Sep {
    fn inline(bytes: Vec<u8>) -> Sep {
        assert!(bytes.len() <= MAX_INLINE_PIVOT);
        Sep {
            bytes,
            external: None,
        }
    }

    /// `sep.cmp(key)`.
    fn cmp_key(&self, key: &[u8]) -> Ordering {
        self.bytes.as_slice().cmp(key)
    }
}

/// Writes `sep` as pivot `i` of `node`, whose stem is `stem_len` bytes (and a prefix of
/// `sep`), appending its bytes to the key area at `*area_used`. The caller holds the
/// node's write section (or the node is not yet published) and sets the stem.
fn put_pivot(node: &InternalNode, i: usize, sep: &Sep, stem_len: usize, area_used: &mut usize) {
    let b = &sep.bytes;
    assert!(b.len() >= stem_len, "separator shorter than the stem");
    let at = *area_used;
    let desc = match sep.external {
        None => {
            // The key area holds the bytes from the 8th on whatever the stem (see `node`).
            if b.len() > 8 {
                node.area_write(at, &b[8..]);
                *area_used += b.len() - 8;
            }
            PivotDesc {
                len_bytes: b.len() as u32,
                area_at: if b.len() > 8 { at as u16 } else { 0 },
                flags: 0,
            }
        }
        Some(ptr) => {
            node.area_write(at, &ptr.to_le_bytes());
            *area_used += 8;
            PivotDesc {
                len_bytes: b.len() as u32,
                area_at: at as u16,
                flags: PIVOT_EXTERNAL,
            }
        }
    };
    assert!(*area_used <= KEY_AREA_BYTES);
    node.pivot_prefix[i].store(key_prefix(&b[stem_len..]), Relaxed);
    node.pivot_desc[i].store(desc.pack(), Relaxed);
}

/// Copies pivot `i` of `src` as pivot `j` of `dst` with the prefix `prefix` (its 8 bytes
/// after `dst`'s stem), appending its key-area bytes to `dst`'s area at `*area_used`. No
/// log read: the area bytes and the length do not depend on the stem.
fn copy_pivot(
    src: &InternalNode,
    i: usize,
    dst: &InternalNode,
    j: usize,
    prefix: u64,
    area_used: &mut usize,
) {
    let d = PivotDesc::unpack(src.pivot_desc[i].load(Relaxed));
    let len = d.area_bytes();
    let mut bytes = [0u8; MAX_INLINE_PIVOT];
    src.area_read(d.area_at as usize, &mut bytes[..len]);
    let at = *area_used;
    dst.area_write(at, &bytes[..len]);
    *area_used += len;
    let desc = PivotDesc {
        area_at: if len > 0 { at as u16 } else { 0 },
        ..d
    };
    dst.pivot_prefix[j].store(prefix, Relaxed);
    dst.pivot_desc[j].store(desc.pack(), Relaxed);
}

/// Pivot `i` of a node the writer owns, as a separator (an EXTERNAL one's key is read
/// from the log).
fn sep_of<C: Ctx>(ctx: &C, node: &InternalNode, i: usize) -> Result<Sep> {
    let own = HeapInternal {
        node,
        version: None,
    };
    let mut bytes = Vec::new();
    no_restart(pivot_into(&own, ctx, i, &mut bytes))?;
    let d = own.pivot_desc(i);
    let external = if d.is_external() {
        let mut b = [0u8; 8];
        node.area_read(d.area_at as usize, &mut b);
        Some(u64::from_le_bytes(b))
    } else {
        None
    };
    Ok(Sep { bytes, external })
}

/// Number of pivots the left half of a full internal node keeps; pivot `keep` moves up.
/// Halves by count, unless that leaves one half's key area still full; then halves by
/// key-area bytes, which leaves each half at most half of the area (< the full threshold).
fn internal_split_point(area_bytes: &[usize]) -> usize {
    let n = area_bytes.len();
    assert!(n >= 2, "splitting an internal node with {n} pivots");
    let limit = KEY_AREA_BYTES - AREA_FREE_MIN_BYTES;
    let m = n / 2;
    let left: usize = area_bytes[..m].iter().sum();
    let right: usize = area_bytes[m + 1..].iter().sum();
    if left <= limit && right <= limit {
        return m;
    }
    let total: usize = area_bytes.iter().sum();
    let mut acc = 0;
    for (i, b) in area_bytes.iter().enumerate() {
        acc += b;
        if 2 * acc >= total {
            return i;
        }
    }
    n - 1
}

/// Strategy for one descent from a root to a leaf (lookups and leaf copies).
trait Walk {
    type Out;
    /// Called before every attempt (an attempt may restart).
    fn reset(&mut self) {}
    /// Result for an empty tree.
    fn empty(&mut self) -> Self::Out;
    /// Picks the child of `v` to descend into.
    fn internal<V: InternalRead, C: Ctx>(&mut self, v: &V, ctx: &C) -> SResult<usize>;
    /// Produces the result at the leaf (the caller validates once more afterwards).
    fn leaf<L: LeafRead, C: Ctx>(&mut self, l: &L, ctx: &C) -> SResult<Self::Out>;
}

struct GetWalk<'k> {
    key: &'k [u8],
    hash: u32,
}

impl Walk for GetWalk<'_> {
    type Out = Option<u64>;
    fn empty(&mut self) -> Option<u64> {
        None
    }
    fn internal<V: InternalRead, C: Ctx>(&mut self, v: &V, ctx: &C) -> SResult<usize> {
        child_index(v, ctx, self.key, true)
    }
    fn leaf<L: LeafRead, C: Ctx>(&mut self, l: &L, ctx: &C) -> SResult<Option<u64>> {
        leaf_get(l, ctx, self.key, self.hash)
    }
}

struct PointsAtWalk<'k> {
    key: &'k [u8],
    hash: u32,
    ptr: u64,
}

impl Walk for PointsAtWalk<'_> {
    type Out = bool;
    fn empty(&mut self) -> bool {
        false
    }
    fn internal<V: InternalRead, C: Ctx>(&mut self, v: &V, ctx: &C) -> SResult<usize> {
        child_index(v, ctx, self.key, true)
    }
    fn leaf<L: LeafRead, C: Ctx>(&mut self, l: &L, _ctx: &C) -> SResult<bool> {
        leaf_points_at(l, self.key, self.hash, self.ptr)
    }
}

struct LeafWalk<'a, 'o> {
    seek: Seek<'a>,
    out: &'o mut LeafCopy,
    low: Vec<u8>,
    high: Vec<u8>,
    low_set: bool,
    high_set: bool,
}

impl Walk for LeafWalk<'_, '_> {
    type Out = ();
    fn reset(&mut self) {
        self.low_set = false;
        self.high_set = false;
        self.out.ptrs.clear();
        self.out.prefixes.clear();
        self.out.stem.clear();
    }
    fn empty(&mut self) {}
    fn internal<V: InternalRead, C: Ctx>(&mut self, v: &V, ctx: &C) -> SResult<usize> {
        let n = v.count();
        let idx = match self.seek {
            Seek::First => 0,
            Seek::Last => n,
            Seek::AtOrAfter(k) => child_index(v, ctx, k, true)?,
            Seek::Before(k) => child_index(v, ctx, k, false)?,
        };
        // Pivots deeper on the path lie inside the range of the ones above, so the nearest
        // pivot on each side is the tightest fence.
        if idx > 0 {
            pivot_into(v, ctx, idx - 1, &mut self.low)?;
            self.low_set = true;
        }
        if idx < n {
            pivot_into(v, ctx, idx, &mut self.high)?;
            self.high_set = true;
        }
        Ok(idx)
    }
    fn leaf<L: LeafRead, C: Ctx>(&mut self, l: &L, _ctx: &C) -> SResult<()> {
        self.out.ptrs.clear();
        self.out.prefixes.clear();
        let n = l.count();
        self.out.ptrs.extend((0..n).map(|i| l.ptr(i)));
        self.out.prefixes.extend((0..n).map(|i| l.prefix(i)));
        self.out.stem.clear();
        self.out.stem.extend_from_slice(&l.stem()[..l.stem_len()]);
        l.validate()?;
        if self.out.ptrs.contains(&0) {
            return Err(l.corrupt("zero log pointer"));
        }
        Ok(())
    }
}

enum DiskStep<T> {
    Done(T),
    Next(u64, u8),
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
            heap_nodes: AtomicU64::new(0),
            dirty_nodes: AtomicU64::new(0),
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

    /// Counts a node made in the running epoch.
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
        self.retired.lock().push(Retired {
            epoch: TreeEpoch(running),
            node,
        });
    }

    // -----------------------------------------------------------------------------------
    // Writer

    /// Maps `key` to the log pointer `ptr` (non-zero). Returns the pointer it replaced.
    /// Writer only. Allocates only when it copies or splits a node.
    pub fn insert<C: Ctx>(&self, ctx: &C, key: &[u8], ptr: u64) -> Result<Option<u64>> {
        assert!(ptr != 0, "log pointer 0 names no record");
        let _w = self.writer();
        let running = self.running.load(Relaxed);
        let kp = key_prefix(key);
        let kh = key_hash(key);
        if self.root.load(Relaxed) == 0 {
            let p = self.new_leaf(running);
            // SAFETY: just allocated as a leaf, not yet published.
            let leaf = unsafe { as_leaf(p) };
            leaf.prefix[0].store(kp, Relaxed);
            leaf.ptr[0].store(ptr, Relaxed);
            leaf.hash[0].store(kh, Relaxed);
            leaf.hdr.set_meta(Meta {
                count: 1,
                ..leaf.hdr.meta()
            });
            self.root.store(heap_word(p), Release);
            return Ok(None);
        }
        let mut node = self.writable_root(ctx, running)?;
        // SAFETY (all `as_ref`/`as_leaf`/`as_internal` below): nodes on the writer's path
        // are reachable from the root, so they are live; kinds are checked before casts.
        if unsafe { node.as_ref() }.meta().is_full() {
            node = self.split_root(ctx, node, running, key)?;
        }
        loop {
            if unsafe { node.as_ref() }.meta().is_leaf() {
                return self.leaf_insert(ctx, unsafe { as_leaf(node) }, key, kh, ptr);
            }
            let parent = unsafe { as_internal(node) };
            let own = HeapInternal {
                node: parent,
                version: None,
            };
            let mut idx = no_restart(child_index(&own, ctx, key, true))?;
            if parent.hdr.meta().level == 1 {
                prefetch_leaf_word(parent.child[idx].load(Relaxed));
            }
            let mut child = self.writable_child(ctx, parent, idx, running)?;
            if unsafe { child.as_ref() }.meta().is_full() {
                let sep = self.split_child(ctx, parent, idx, child, running, key)?;
                if sep.cmp_key(key) != Ordering::Greater {
                    idx += 1;
                    child = match NodeRef::decode(parent.child[idx].load(Relaxed)) {
                        Some(NodeRef::Heap(p)) => p,
                        other => unreachable!("new right sibling is not a heap node: {other:?}"),
                    };
                }
                assert!(!unsafe { child.as_ref() }.meta().is_full());
            }
            node = child;
        }
    }

    /// Makes the entry of `key` that holds log pointer `old` hold the pointer `new()`
    /// returns instead; false (and `new` not called) when `key` maps elsewhere or nowhere.
    /// Writer only. What garbage collection does for a record it relocates, `new`
    /// appending the copy: like `insert` of an existing key, but the entry is found by
    /// prefix, hash and pointer (`leaf_points_at`'s rule), so no log record is read to
    /// confirm the key, and the count of entries never changes, so nothing splits. One
    /// descent: the path is copied on write before the leaf is searched, so a caller
    /// that did not check `points_at` first may copy it for nothing.
    pub fn replace_ptr<C: Ctx>(
        &self,
        ctx: &C,
        key: &[u8],
        old: u64,
        new: impl FnOnce() -> Result<u64>,
    ) -> Result<bool> {
        let _w = self.writer();
        if self.root.load(Relaxed) == 0 {
            return Ok(false);
        }
        let kh = key_hash(key);
        // SAFETY: `writable_leaf` returns a live leaf of the running epoch.
        let leaf = unsafe { as_leaf(self.writable_leaf(ctx, key, None)?) };
        let own = HeapLeaf {
            node: leaf,
            version: None,
        };
        let Some(i) = no_restart(leaf_entry_of(&own, key, kh, old))? else {
            return Ok(false);
        };
        let new = new()?;
        assert!(new != 0, "log pointer 0 names no record");
        // One atomic word, as in `leaf_insert`: readers see the old or the new record of
        // the same key, both valid.
        leaf.ptr[i].store(new, Release);
        Ok(true)
    }

    /// The leaf `key` belongs in, made writable with every node on the way down (copied
    /// on write where sealed). `path`: also the internal nodes passed and the child index
    /// taken in each. Writer only; never splits (callers that add an entry split first,
    /// see `insert`).
    fn writable_leaf<C: Ctx>(
        &self,
        ctx: &C,
        key: &[u8],
        mut path: Option<&mut Vec<(NonNull<Header>, usize)>>,
    ) -> Result<NonNull<Header>> {
        let running = self.running.load(Relaxed);
        let mut node = self.writable_root(ctx, running)?;
        loop {
            // SAFETY: nodes on the writer's path are reachable from the root, so they are
            // live; the kind is checked before the casts.
            if unsafe { node.as_ref() }.meta().is_leaf() {
                return Ok(node);
            }
            let parent = unsafe { as_internal(node) };
            let own = HeapInternal {
                node: parent,
                version: None,
            };
            let idx = no_restart(child_index(&own, ctx, key, true))?;
            if let Some(path) = path.as_deref_mut() {
                path.push((node, idx));
            }
            if parent.hdr.meta().level == 1 {
                prefetch_leaf_word(parent.child[idx].load(Relaxed));
            }
            node = self.writable_child(ctx, parent, idx, running)?;
        }
    }

    /// Removes `key`. Returns the pointer it mapped to. Writer only. Copies nothing when the
    /// key is absent. A leaf left empty is taken out of its parent (and an internal node
    /// left without children out of its own), so deleting every key empties the tree;
    /// leaves are not merged otherwise (future work).
    pub fn remove<C: Ctx>(&self, ctx: &C, key: &[u8]) -> Result<Option<u64>> {
        let _w = self.writer();
        let kh = key_hash(key);
        let mut probe = GetWalk { key, hash: kh };
        if self.walk(ctx, None, &mut probe)?.is_none() {
            return Ok(None);
        }
        let running = self.running.load(Relaxed);
        // Internal nodes on the way down and the child index taken in each.
        let mut path: Vec<(NonNull<Header>, usize)> = Vec::new();
        let node = self.writable_leaf(ctx, key, Some(&mut path))?;
        // SAFETY: `writable_leaf` returns a live leaf of the running epoch.
        let leaf = unsafe { as_leaf(node) };
        let own = HeapLeaf {
            node: leaf,
            version: None,
        };
        let (pos, found) = no_restart(leaf_position(&own, ctx, key, kh))?;
        if !found {
            // The probe found it a moment ago; only a log answering differently could get
            // here. Nothing was removed.
            return Ok(None);
        }
        let m = leaf.hdr.meta();
        let n = m.count as usize;
        let old = leaf.ptr[pos].load(Relaxed);
        leaf.hdr.write_begin();
        for i in pos..n - 1 {
            leaf.prefix[i].store(leaf.prefix[i + 1].load(Relaxed), Relaxed);
            leaf.ptr[i].store(leaf.ptr[i + 1].load(Relaxed), Relaxed);
            leaf.hash[i].store(leaf.hash[i + 1].load(Relaxed), Relaxed);
        }
        leaf.hdr.set_meta(Meta {
            count: m.count - 1,
            ..m
        });
        leaf.hdr.write_end();
        if m.count == 1 {
            self.prune_empty(&path, node, running);
        }
        Ok(Some(old))
    }

    /// Takes the empty `leaf` (reached through `path`, all writable nodes of the running
    /// epoch) out of the tree, with every ancestor it leaves without children. Same reader
    /// rule as splits: the parent changes inside its seqlock, so readers that read the old
    /// child word restart when they validate it; readers already inside a detached node see
    /// its version move and restart too (an empty node answered "absent" correctly anyway).
    /// The detached nodes are retired: in no sealed tree (they are of the running epoch),
    /// freed after the readers' grace period.
    fn prune_empty(&self, path: &[(NonNull<Header>, usize)], leaf: NonNull<Header>, running: u64) {
        let mut detached = vec![leaf];
        let mut cut = false;
        for &(p, idx) in path.iter().rev() {
            // SAFETY: nodes on the writer's path are live internal nodes.
            let parent = unsafe { as_internal(p) };
            if parent.hdr.meta().count == 0 {
                // Its only child is empty: so is it.
                detached.push(p);
                continue;
            }
            Self::remove_child(parent, idx);
            cut = true;
            break;
        }
        if !cut {
            // Every node on the path is empty: the tree is.
            self.root.store(0, Release);
        }
        for p in detached {
            // SAFETY: detached, still live (freed only through the retired list).
            let hdr = unsafe { p.as_ref() };
            debug_assert_eq!(hdr.epoch(), running);
            hdr.write_begin();
            hdr.write_end();
            self.retire(RetiredNode::Heap(HeapNode(p)), running);
        }
    }

    /// Removes child `idx` of the published `node` (which has at least one pivot) and the
    /// pivot beside it: the left neighbour's pivot when there is one, so that neighbour's
    /// range grows over the removed one, else pivot 0 (the right neighbour's lower fence).
    /// Compacts the key area.
    fn remove_child(node: &InternalNode, idx: usize) {
        let m = node.hdr.meta();
        let n = m.count as usize;
        assert!(
            n >= 1 && idx <= n,
            "remove child {idx} of a node with {n} pivots"
        );
        let gone = idx.saturating_sub(1);
        let mut area = [0u8; KEY_AREA_BYTES];
        let mut descs = [0u64; C_INT];
        let mut prefixes = [0u64; C_INT];
        let mut children = [0u64; C_INT + 1];
        let mut used = 0usize;
        for (j, i) in (0..n).filter(|&i| i != gone).enumerate() {
            prefixes[j] = node.pivot_prefix[i].load(Relaxed);
            let d = PivotDesc::unpack(node.pivot_desc[i].load(Relaxed));
            let len = d.area_bytes();
            if len == 0 {
                descs[j] = d.pack();
                continue;
            }
            node.area_read(d.area_at as usize, &mut area[used..used + len]);
            descs[j] = PivotDesc {
                area_at: used as u16,
                ..d
            }
            .pack();
            used += len;
        }
        for (j, i) in (0..=n).filter(|&i| i != idx).enumerate() {
            children[j] = node.child[i].load(Relaxed);
        }
        node.hdr.write_begin();
        for j in 0..n - 1 {
            node.pivot_prefix[j].store(prefixes[j], Relaxed);
            node.pivot_desc[j].store(descs[j], Relaxed);
        }
        for (j, c) in children.iter().enumerate().take(n) {
            node.child[j].store(*c, Release);
        }
        node.area_write(0, &area[..used]);
        node.hdr.set_meta(Meta {
            count: m.count - 1,
            area_used: used as u16,
            ..m
        });
        node.hdr.write_end();
    }

    /// Makes everything reachable from the current root immutable and starts the next epoch.
    /// Writer only. The returned root stays readable until its nodes are reclaimed.
    pub fn seal(&self) -> Sealed {
        let _w = self.writer();
        let epoch = self.running.load(Relaxed);
        let root = self.root.load(Relaxed);
        self.running.store(epoch + 1, Release);
        self.dirty_nodes.store(0, Relaxed);
        Sealed {
            root,
            epoch: TreeEpoch(epoch),
        }
    }

    fn leaf_insert<C: Ctx>(
        &self,
        ctx: &C,
        leaf: &LeafNode,
        key: &[u8],
        kh: u32,
        ptr: u64,
    ) -> Result<Option<u64>> {
        let own = HeapLeaf {
            node: leaf,
            version: None,
        };
        // A key that does not start with the stem (the leaf's range is wider than its
        // keys so far) shrinks the stem to what they share.
        let stem_len = own.stem_len();
        if stem_len > 0 {
            let stem = own.stem();
            let keep = common_len(&stem[..stem_len], key);
            if keep < stem_len {
                Self::shrink_stem(leaf, &stem[..stem_len], keep);
            }
        }
        let kp = match stem_position(&own.stem()[..own.stem_len()], key) {
            StemPos::Inside(kp) => kp,
            other => unreachable!("key outside the stem after shrinking it: {other:?}"),
        };
        let (pos, found) = no_restart(leaf_position(&own, ctx, key, kh))?;
        if found {
            // One atomic word: a reader sees the old or the new pointer, both valid for
            // this key, so no version bump (readers of this leaf need not restart).
            // Release publishes the new log record to readers that load this pointer.
            let old = leaf.ptr[pos].swap(ptr, Release);
            return Ok(Some(old));
        }
        let m = leaf.hdr.meta();
        let n = m.count as usize;
        assert!(n < C_LEAF, "insert into a full leaf");
        leaf.hdr.write_begin();
        for i in (pos..n).rev() {
            leaf.prefix[i + 1].store(leaf.prefix[i].load(Relaxed), Relaxed);
            leaf.ptr[i + 1].store(leaf.ptr[i].load(Relaxed), Relaxed);
            leaf.hash[i + 1].store(leaf.hash[i].load(Relaxed), Relaxed);
        }
        leaf.prefix[pos].store(kp, Relaxed);
        leaf.ptr[pos].store(ptr, Relaxed);
        leaf.hash[pos].store(kh, Relaxed);
        leaf.hdr.set_meta(Meta {
            count: m.count + 1,
            ..m
        });
        leaf.hdr.write_end();
        Ok(None)
    }

    /// The separator of a leaf split between the records at `lp` (last key of the left
    /// half) and `rp` (first key of the right half), from their full keys: for halves
    /// whose boundary entries share their prefix.
    fn separator_from_log<C: Ctx>(ctx: &C, lp: u64, rp: u64) -> Result<Sep> {
        let mut left_last = Vec::new();
        let mut right_first = Vec::new();
        ctx.key_into(lp, &mut left_last)?;
        ctx.key_into(rp, &mut right_first)?;
        let Some(len) = separator(&left_last, &right_first) else {
            return Err(Error::corruption(
                "log record key",
                DiskOffset(rp),
                format!("key is not greater than the key of the record at {lp:#x}, its left neighbour in the index"),
            ));
        };
        let sep = if len <= MAX_INLINE_PIVOT {
            right_first.truncate(len);
            Sep::inline(right_first)
        } else {
            Sep {
                bytes: right_first,
                external: Some(rp),
            }
        };
        Ok(sep)
    }

    /// Cuts the stem of the published `leaf` to its first `keep` bytes, rewriting every
    /// prefix (no log reads: the bytes given up are in the stem).
    fn shrink_stem(leaf: &LeafNode, stem: &[u8], keep: usize) {
        let m = leaf.hdr.meta();
        assert!(keep < stem.len() && stem.len() == m.stem_len as usize);
        leaf.hdr.write_begin();
        for slot in &leaf.prefix[..m.count as usize] {
            slot.store(prefix_after_shrink(stem, keep, slot.load(Relaxed)), Relaxed);
        }
        leaf.set_stem(&stem[..keep]);
        leaf.hdr.set_meta(Meta {
            stem_len: keep as u16,
            ..m
        });
        leaf.hdr.write_end();
    }

    /// A longer stem for entries `range` of `leaf` (one half of a split), if they share
    /// more bytes than its stem and their prefixes tie somewhere (the case a longer stem
    /// helps: equal prefixes make lookups read keys from the log). Reads every key of the
    /// half from the log to build the new prefixes; `None` leaves the half as it is.
    fn grown_stem<C: Ctx>(
        ctx: &C,
        leaf: &LeafNode,
        range: std::ops::Range<usize>,
    ) -> Result<Option<Restem>> {
        let stem_len = leaf.hdr.meta().stem_len as usize;
        let ties = range
            .clone()
            .skip(1)
            .any(|i| leaf.prefix[i - 1].load(Relaxed) == leaf.prefix[i].load(Relaxed));
        if !ties || stem_len >= MAX_STEM_BYTES {
            return Ok(None);
        }
        let (mut first, mut last) = (Vec::new(), Vec::new());
        ctx.key_into(leaf.ptr[range.start].load(Relaxed), &mut first)?;
        ctx.key_into(leaf.ptr[range.end - 1].load(Relaxed), &mut last)?;
        let new_len = common_len(&first, &last).min(MAX_STEM_BYTES);
        if new_len <= stem_len {
            return Ok(None);
        }
        first.truncate(new_len);
        let mut prefixes = Vec::with_capacity(range.len());
        let mut key = Vec::new();
        for i in range {
            let ptr = leaf.ptr[i].load(Relaxed);
            ctx.key_into(ptr, &mut key)?;
            // Keys are sorted, so all between the first and the last share their bytes;
            // a log that says otherwise is corrupt.
            if !key.starts_with(&first) {
                return Err(Error::corruption(
                    "log record key",
                    DiskOffset(ptr),
                    "key lies outside the range of its neighbours in the index",
                ));
            }
            prefixes.push(key_prefix(&key[new_len..]));
        }
        Ok(Some(Restem {
            stem: first,
            prefixes,
        }))
    }

    /// Copies a disk node into a new heap node of the running epoch after checking it fully.
    fn copy_disk<C: Ctx>(
        &self,
        ctx: &C,
        off: DiskOffset,
        expect_level: Option<u8>,
        running: u64,
    ) -> Result<NonNull<Header>> {
        let p = ctx.with_node(off, |img| {
            let d = DiskNode::open(img, off, self.region, expect_level)?;
            d.verify_structure()?;
            Ok(heap_from_image(&d, running, self.region))
        })?;
        self.made_node();
        Ok(p)
    }

    fn copy_heap(&self, p: NonNull<Header>, running: u64) -> NonNull<Header> {
        self.made_node();
        heap_copy(p, running, self.region)
    }

    /// The root as a node the writer may change, copying it first if it is of an older
    /// epoch or on disk. The root must not be empty.
    fn writable_root<C: Ctx>(&self, ctx: &C, running: u64) -> Result<NonNull<Header>> {
        let word = self.root.load(Relaxed);
        let (copy, old) = match NodeRef::decode(word) {
            None => unreachable!("writable_root of an empty tree"),
            // SAFETY: the root is live.
            Some(NodeRef::Heap(p)) if unsafe { p.as_ref() }.epoch() == running => return Ok(p),
            Some(NodeRef::Heap(p)) => (self.copy_heap(p, running), RetiredNode::Heap(HeapNode(p))),
            Some(NodeRef::Disk(off)) => (
                self.copy_disk(ctx, off, None, running)?,
                RetiredNode::Disk(off),
            ),
        };
        // Readers holding the old root read an immutable, consistent older state.
        self.root.store(heap_word(copy), Release);
        self.retire(old, running);
        Ok(copy)
    }

    /// Child `idx` of the writable `parent` as a node the writer may change.
    fn writable_child<C: Ctx>(
        &self,
        ctx: &C,
        parent: &InternalNode,
        idx: usize,
        running: u64,
    ) -> Result<NonNull<Header>> {
        let word = parent.child[idx].load(Relaxed);
        let level = parent.hdr.meta().level - 1;
        let (copy, old) = match NodeRef::decode(word) {
            None => panic!("internal node with an empty child slot {idx}"),
            // SAFETY: the child of a live node on the writer's path is live.
            Some(NodeRef::Heap(p)) if unsafe { p.as_ref() }.epoch() == running => return Ok(p),
            Some(NodeRef::Heap(p)) => (self.copy_heap(p, running), RetiredNode::Heap(HeapNode(p))),
            Some(NodeRef::Disk(off)) => (
                self.copy_disk(ctx, off, Some(level), running)?,
                RetiredNode::Disk(off),
            ),
        };
        // SAFETY: `copy` was just allocated.
        debug_assert_eq!(unsafe { copy.as_ref() }.meta().level, level);
        parent.hdr.write_begin();
        parent.child[idx].store(heap_word(copy), Release);
        parent.hdr.write_end();
        self.retire(old, running);
        Ok(copy)
    }

    /// Builds the right half of the full writable node `p` as a new, unpublished node.
    /// Returns the separator, the new node, and how many entries/pivots `p` keeps.
    /// Changes nothing visible, so an error (a failed key read) leaves the tree as it was.
    /// `key` is the key being inserted.
    fn split_prepare<C: Ctx>(
        &self,
        ctx: &C,
        p: NonNull<Header>,
        running: u64,
        key: &[u8],
    ) -> Result<(Sep, NonNull<Header>, usize, Option<Restem>)> {
        // SAFETY: `p` is a live node on the writer's path; kinds are checked before casts.
        let m = unsafe { p.as_ref() }.meta();
        let n = m.count as usize;
        if m.is_leaf() {
            let leaf = unsafe { as_leaf(p) };
            let own = HeapLeaf {
                node: leaf,
                version: None,
            };
            // A key beyond either end of the leaf is what ascending (descending) loads
            // look like: leave the side they will not come back to nearly full instead of
            // half full. Random inserts hit this 1 time in ~C_LEAF and lose little.
            let key_pos = stem_position(&own.stem()[..own.stem_len()], key);
            let beyond = |i: usize, side: Ordering| -> Result<bool> {
                let kp = match key_pos {
                    StemPos::Below => return Ok(side == Ordering::Greater),
                    StemPos::Above => return Ok(side == Ordering::Less),
                    StemPos::Inside(kp) => kp,
                };
                Ok(match leaf.prefix[i].load(Relaxed).cmp(&kp) {
                    Ordering::Equal => ctx.key_cmp(leaf.ptr[i].load(Relaxed), key)? == side,
                    o => o == side,
                })
            };
            let keep = if beyond(n - 1, Ordering::Less)? {
                n - LEAF_SPLIT_EDGE
            } else if beyond(0, Ordering::Greater)? {
                LEAF_SPLIT_EDGE
            } else {
                n / 2
            };
            assert!(keep >= 1 && keep < n);
            let lp = leaf.ptr[keep - 1].load(Relaxed);
            let rp = leaf.ptr[keep].load(Relaxed);
            let stem = &own.stem()[..own.stem_len()];
            let (pl, pr) = (
                leaf.prefix[keep - 1].load(Relaxed),
                leaf.prefix[keep].load(Relaxed),
            );
            let sep = if pl == pr {
                Self::separator_from_log(ctx, lp, rp)?
            } else if pl < pr {
                prefix_separator(stem, pl, pr)
            } else {
                return Err(Error::corruption(
                    "index leaf",
                    DiskOffset(rp),
                    "entry prefixes out of order at a split".to_string(),
                ));
            };
            // Each half may share more leading bytes than the whole did.
            let left_stem = Self::grown_stem(ctx, leaf, 0..keep)?;
            let right_stem = Self::grown_stem(ctx, leaf, keep..n)?;
            let r = self.new_leaf(running);
            // SAFETY: just allocated as a leaf.
            let right = unsafe { as_leaf(r) };
            for (j, i) in (keep..n).enumerate() {
                let prefix = match &right_stem {
                    Some(rs) => rs.prefixes[j],
                    None => leaf.prefix[i].load(Relaxed),
                };
                right.prefix[j].store(prefix, Relaxed);
                right.ptr[j].store(leaf.ptr[i].load(Relaxed), Relaxed);
                right.hash[j].store(leaf.hash[i].load(Relaxed), Relaxed);
            }
            let stem = match &right_stem {
                Some(rs) => rs.stem.clone(),
                None => own.stem()[..own.stem_len()].to_vec(),
            };
            right.set_stem(&stem);
            right.hdr.set_meta(Meta {
                count: (n - keep) as u16,
                stem_len: stem.len() as u16,
                ..right.hdr.meta()
            });
            Ok((sep, r, keep, left_stem))
        } else {
            let node = unsafe { as_internal(p) };
            let own = HeapInternal {
                node,
                version: None,
            };
            let sizes: Vec<usize> = (0..n)
                .map(|i| PivotDesc::unpack(node.pivot_desc[i].load(Relaxed)).area_bytes())
                .collect();
            let keep = internal_split_point(&sizes);
            let sep = sep_of(ctx, node, keep)?;
            // Each half may share more leading bytes than the whole did.
            let left_stem = Self::grown_internal_stem(ctx, &own, 0..keep)?;
            let right_stem = Self::grown_internal_stem(ctx, &own, keep + 1..n)?;
            let r = self.new_internal(running, m.level);
            // SAFETY: just allocated as an internal node.
            let right = unsafe { as_internal(r) };
            let mut used = 0;
            for (j, i) in (keep + 1..n).enumerate() {
                let prefix = match &right_stem {
                    Some(rs) => rs.prefixes[j],
                    None => node.pivot_prefix[i].load(Relaxed),
                };
                copy_pivot(node, i, right, j, prefix, &mut used);
            }
            for (j, i) in (keep + 1..=n).enumerate() {
                right.child[j].store(node.child[i].load(Relaxed), Relaxed);
            }
            let stem = match &right_stem {
                Some(rs) => rs.stem.clone(),
                None => own.stem()[..own.stem_len()].to_vec(),
            };
            right.set_stem(&stem);
            let rm = Meta {
                count: (n - keep - 1) as u16,
                area_used: used as u16,
                stem_len: stem.len() as u16,
                ..right.hdr.meta()
            };
            assert!(!rm.is_full(), "right half of a split is still full: {rm:?}");
            right.hdr.set_meta(rm);
            Ok((sep, r, keep, left_stem))
        }
    }

    /// A longer stem for pivots `range` of the writer's internal node `v` (one half of a
    /// split): what the half's first and last pivots share, up to `MAX_INT_STEM_BYTES`,
    /// if that is more than the node's stem (every pivot between shares it: they are
    /// sorted). With the new prefixes, built from the pivots' bytes: inline ones are in
    /// the node, EXTERNAL ones are read from the log (separators longer than
    /// `MAX_INLINE_PIVOT`, rare). `None` leaves the half's stem and prefixes as they are.
    ///
    /// Why at splits: a stem only shrinks in place (`insert_pivot`), and pivots that
    /// share their first 8 bytes (`key:000000…`) tie in every prefix without one.
    fn grown_internal_stem<C: Ctx>(
        ctx: &C,
        v: &HeapInternal<'_>,
        range: std::ops::Range<usize>,
    ) -> Result<Option<Restem>> {
        let stem_len = v.stem_len();
        if range.is_empty() || stem_len >= MAX_INT_STEM_BYTES {
            return Ok(None);
        }
        let (mut first, mut last) = (Vec::new(), Vec::new());
        no_restart(pivot_into(v, ctx, range.start, &mut first))?;
        no_restart(pivot_into(v, ctx, range.end - 1, &mut last))?;
        let new_len = common_len(&first, &last).min(MAX_INT_STEM_BYTES);
        if new_len <= stem_len {
            return Ok(None);
        }
        first.truncate(new_len);
        let mut prefixes = Vec::with_capacity(range.len());
        let mut pivot = Vec::new();
        for i in range {
            no_restart(pivot_into(v, ctx, i, &mut pivot))?;
            if !pivot.starts_with(&first) {
                // Inline pivots are in order in a heap node; only a log that answers
                // otherwise for an EXTERNAL pivot's key gets here.
                let d = v.pivot_desc(i);
                assert!(d.is_external(), "internal node pivots out of order");
                let mut b = [0u8; 8];
                no_restart(v.area_read(d.area_at as usize, &mut b))?;
                return Err(Error::corruption(
                    "log record key",
                    DiskOffset(u64::from_le_bytes(b)),
                    "key of an index pivot lies outside the range of its neighbours",
                ));
            }
            prefixes.push(key_prefix(&pivot[new_len..]));
        }
        Ok(Some(Restem {
            stem: first,
            prefixes,
        }))
    }

    /// Cuts the published node `p` down to its first `keep` entries (pivots), after its
    /// upper half became reachable elsewhere, giving it its new stem if it has one.
    /// Compacts the key area of an internal node.
    fn truncate(&self, p: NonNull<Header>, keep: usize, restem: Option<Restem>) {
        // SAFETY: as in `split_prepare`.
        let hdr = unsafe { p.as_ref() };
        let m = hdr.meta();
        if m.is_leaf() {
            // SAFETY: kind checked.
            let leaf = unsafe { as_leaf(p) };
            hdr.write_begin();
            let mut stem_len = m.stem_len;
            if let Some(rs) = restem {
                assert_eq!(rs.prefixes.len(), keep);
                for (slot, prefix) in leaf.prefix.iter().zip(rs.prefixes) {
                    slot.store(prefix, Relaxed);
                }
                leaf.set_stem(&rs.stem);
                stem_len = rs.stem.len() as u16;
            }
            hdr.set_meta(Meta {
                count: keep as u16,
                stem_len,
                ..m
            });
            hdr.write_end();
            return;
        }
        let node = unsafe { as_internal(p) };
        let mut area = [0u8; KEY_AREA_BYTES];
        let mut descs = [0u64; C_INT];
        let mut used = 0usize;
        for (i, slot) in descs.iter_mut().enumerate().take(keep) {
            let d = PivotDesc::unpack(node.pivot_desc[i].load(Relaxed));
            let len = d.area_bytes();
            if len == 0 {
                *slot = d.pack();
                continue;
            }
            node.area_read(d.area_at as usize, &mut area[used..used + len]);
            *slot = PivotDesc {
                area_at: used as u16,
                ..d
            }
            .pack();
            used += len;
        }
        let lm = Meta {
            count: keep as u16,
            area_used: used as u16,
            stem_len: restem
                .as_ref()
                .map_or(m.stem_len, |rs| rs.stem.len() as u16),
            ..m
        };
        assert!(!lm.is_full(), "left half of a split is still full: {lm:?}");
        hdr.write_begin();
        for (i, d) in descs.iter().enumerate().take(keep) {
            node.pivot_desc[i].store(*d, Relaxed);
        }
        if let Some(rs) = restem {
            assert_eq!(rs.prefixes.len(), keep);
            for (slot, prefix) in node.pivot_prefix.iter().zip(rs.prefixes) {
                slot.store(prefix, Relaxed);
            }
            node.set_stem(&rs.stem);
        }
        node.area_write(0, &area[..used]);
        hdr.set_meta(lm);
        hdr.write_end();
    }

    /// Inserts (`sep`, `right`) as pivot `idx` / child `idx + 1` of the published `node`.
    /// A separator without the node's stem (a child at either end split outside the
    /// pivots so far) first shrinks the stem to what they share; each prefix then starts
    /// with the stem bytes given up, so no pivot is read.
    fn insert_pivot(node: &InternalNode, idx: usize, sep: &Sep, right: u64) {
        let m = node.hdr.meta();
        let n = m.count as usize;
        assert!(!m.is_full(), "pivot insert into a full internal node");
        assert!(idx <= n);
        assert!(m.stem_len as usize <= MAX_INT_STEM_BYTES);
        let own = HeapInternal {
            node,
            version: None,
        };
        let stem = own.stem();
        let old_stem = &stem[..m.stem_len as usize];
        let stem_len = common_len(old_stem, &sep.bytes);
        node.hdr.write_begin();
        if stem_len < old_stem.len() {
            for slot in &node.pivot_prefix[..n] {
                slot.store(
                    prefix_after_shrink(old_stem, stem_len, slot.load(Relaxed)),
                    Relaxed,
                );
            }
            node.set_stem(&old_stem[..stem_len]);
        }
        for i in (idx..n).rev() {
            node.pivot_prefix[i + 1].store(node.pivot_prefix[i].load(Relaxed), Relaxed);
            node.pivot_desc[i + 1].store(node.pivot_desc[i].load(Relaxed), Relaxed);
        }
        for i in (idx + 1..=n).rev() {
            node.child[i + 1].store(node.child[i].load(Relaxed), Relaxed);
        }
        let mut used = m.area_used as usize;
        put_pivot(node, idx, sep, stem_len, &mut used);
        node.child[idx + 1].store(right, Release);
        node.hdr.set_meta(Meta {
            count: m.count + 1,
            area_used: used as u16,
            stem_len: stem_len as u16,
            ..m
        });
        node.hdr.write_end();
    }

    /// Splits the full child `idx` of `parent`: right half built unseen, then made reachable
    /// through the parent, then cut from the child (readers never miss a key).
    fn split_child<C: Ctx>(
        &self,
        ctx: &C,
        parent: &InternalNode,
        idx: usize,
        child: NonNull<Header>,
        running: u64,
        key: &[u8],
    ) -> Result<Sep> {
        let (sep, right, keep, restem) = self.split_prepare(ctx, child, running, key)?;
        Self::insert_pivot(parent, idx, &sep, heap_word(right));
        self.truncate(child, keep, restem);
        Ok(sep)
    }

    /// Splits the full writable root under a new root; returns the new root.
    fn split_root<C: Ctx>(
        &self,
        ctx: &C,
        old: NonNull<Header>,
        running: u64,
        key: &[u8],
    ) -> Result<NonNull<Header>> {
        let (sep, right, keep, restem) = self.split_prepare(ctx, old, running, key)?;
        // SAFETY: `old` is the live root.
        let level = unsafe { old.as_ref() }.meta().level + 1;
        let nr = self.new_internal(running, level);
        // SAFETY: just allocated as an internal node.
        let node = unsafe { as_internal(nr) };
        let mut used = 0;
        // The stem of a node with one pivot is as much of it as fits; the next pivot
        // shrinks it to what they share.
        let stem_len = sep.bytes.len().min(MAX_INT_STEM_BYTES);
        node.set_stem(&sep.bytes[..stem_len]);
        node.child[0].store(heap_word(old), Relaxed);
        put_pivot(node, 0, &sep, stem_len, &mut used);
        node.child[1].store(heap_word(right), Relaxed);
        node.hdr.set_meta(Meta {
            kind: KIND_INTERNAL,
            level,
            count: 1,
            area_used: used as u16,
            stem_len: stem_len as u16,
        });
        self.root.store(heap_word(nr), Release);
        self.truncate(old, keep, restem);
        Ok(nr)
    }

    // -----------------------------------------------------------------------------------
    // Readers

    /// The log pointer of `key` in the tree at `root` (`root_word()` for the latest state,
    /// or a `Sealed::root`). Never blocks; any thread.
    /// Whether `key` maps to log pointer `ptr` in the tree at `root` (`None`: the live
    /// root), reading no log record (see `search::leaf_points_at`).
    pub fn points_at<C: Ctx>(
        &self,
        ctx: &C,
        root: Option<u64>,
        key: &[u8],
        ptr: u64,
        _guard: &Guard,
    ) -> Result<bool> {
        let mut w = PointsAtWalk {
            key,
            hash: key_hash(key),
            ptr,
        };
        self.walk(ctx, root, &mut w)
    }

    pub fn get<C: Ctx>(
        &self,
        ctx: &C,
        root: Option<u64>,
        key: &[u8],
        _guard: &Guard,
    ) -> Result<Option<u64>> {
        let mut w = GetWalk {
            key,
            hash: key_hash(key),
        };
        self.walk(ctx, root, &mut w)
    }

    /// Copies the leaf chosen by `seek` (pointers in key order, fences) into `out`, reusing
    /// its buffers. Never blocks; any thread. Forward iteration continues with
    /// `AtOrAfter(high)`, backward with `Before(low)`; leaves may be empty.
    pub fn copy_leaf<C: Ctx>(
        &self,
        ctx: &C,
        root: Option<u64>,
        seek: Seek<'_>,
        _guard: &Guard,
        out: &mut LeafCopy,
    ) -> Result<()> {
        let mut w = LeafWalk {
            seek,
            low: out.low.take().unwrap_or_default(),
            high: out.high.take().unwrap_or_default(),
            out,
            low_set: false,
            high_set: false,
        };
        self.walk(ctx, root, &mut w)?;
        let LeafWalk {
            low,
            high,
            low_set,
            high_set,
            out,
            ..
        } = w;
        out.low = low_set.then_some(low);
        out.high = high_set.then_some(high);
        Ok(())
    }

    /// Descends with `w` from a sealed root (`Some`: immutable, never restarts) or from the
    /// live root (`None`: loaded here, and loaded again after any restart).
    fn walk<C: Ctx, W: Walk>(&self, ctx: &C, root: Option<u64>, w: &mut W) -> Result<W::Out> {
        loop {
            w.reset();
            let start = root.unwrap_or_else(|| self.root.load(Acquire));
            match self.walk_once(ctx, start, root.is_none(), w) {
                Ok(out) => return Ok(out),
                Err(SearchErr::Fail(e)) => return Err(e),
                // Only a node of the running epoch moves; a sealed root never restarts.
                Err(SearchErr::Restart) => debug_assert!(root.is_none()),
            }
        }
    }

    fn walk_once<C: Ctx, W: Walk>(
        &self,
        ctx: &C,
        start: u64,
        live: bool,
        w: &mut W,
    ) -> SResult<W::Out> {
        let mut word = start;
        let mut parent: Option<(&Header, u64)> = None;
        let mut expect_level: Option<u8> = None;
        loop {
            let p = match NodeRef::decode(word) {
                None => return Ok(w.empty()),
                Some(NodeRef::Disk(off)) => return self.walk_disk(ctx, off, expect_level, w),
                Some(NodeRef::Heap(p)) => p,
            };
            // SAFETY: `word` is the start root (live, or sealed and kept alive by the
            // caller's epoch rules) or a child word read from a node whose version was
            // validated afterwards, so it named a live child at that moment; the caller's
            // guard keeps retired nodes from being freed while we read.
            let hdr = unsafe { p.as_ref() };
            let v = hdr.read_begin();
            // Lock coupling: if the parent moved, this child may have been split or replaced
            // after we read its word. The root's "parent" is the root word, re-checked the
            // same way: a live root replaced since we loaded it (split, or copied after a
            // seal) may already be truncated, and its epoch says nothing reliable about
            // that, since a seal can follow the split.
            let moved = match parent {
                Some((ph, pv)) => !ph.read_valid(pv),
                None => live && self.root.load(Acquire) != word,
            };
            if moved {
                return Err(SearchErr::Restart);
            }
            let m = hdr.meta();
            debug_assert!(expect_level.is_none_or(|l| l == m.level));
            if m.kind == KIND_LEAF {
                // SAFETY: the kind of a node never changes.
                let view = HeapLeaf {
                    node: unsafe { as_leaf(p) },
                    version: Some(v),
                };
                let out = w.leaf(&view, ctx)?;
                view.validate()?;
                return Ok(out);
            }
            // SAFETY: as above.
            let view = HeapInternal {
                node: unsafe { as_internal(p) },
                version: Some(v),
            };
            let idx = w.internal(&view, ctx)?;
            let child = view.child(idx);
            if m.level == 1 {
                prefetch_leaf_word(child);
            }
            view.validate()?;
            view.check_child(child)?;
            parent = Some((hdr, v));
            expect_level = Some(m.level - 1);
            word = child;
        }
    }

    /// Continues a descent below a disk node; everything below is on disk and immutable.
    fn walk_disk<C: Ctx, W: Walk>(
        &self,
        ctx: &C,
        mut off: DiskOffset,
        mut expect_level: Option<u8>,
        w: &mut W,
    ) -> SResult<W::Out> {
        loop {
            let step = ctx.with_node(off, |img| {
                let d = DiskNode::open(img, off, self.region, expect_level)?;
                if d.meta().is_leaf() {
                    return Ok(DiskStep::Done(no_restart(w.leaf(&d, ctx))?));
                }
                let idx = no_restart(w.internal(&d, ctx))?;
                let child = InternalRead::child(&d, idx);
                no_restart(d.check_child(child))?;
                Ok(DiskStep::Next(child, d.meta().level - 1))
            })?;
            match step {
                DiskStep::Done(out) => return Ok(out),
                DiskStep::Next(child, level) => {
                    off = DiskOffset(child & !1);
                    expect_level = Some(level);
                }
            }
        }
    }

    // -----------------------------------------------------------------------------------
    // Commit support

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
                // durable epoch past the commit that is running this.
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
            let mut list = self.retired.lock();
            let (take, keep): (Vec<Retired>, Vec<Retired>) = list.drain(..).partition(free);
            *list = keep;
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
        self.heap_nodes.fetch_sub(heap.len() as u64, Relaxed);
        let guard = crossbeam_epoch::pin();
        // SAFETY: the nodes are unreachable from the live root and from every sealed root
        // anyone may still read (the epoch rules above); readers that found them before are
        // pinned, and the closure runs only after they unpin. Each node is freed once: it
        // left the retired list above.
        unsafe {
            guard.defer_unchecked(move || {
                for h in heap {
                    free_node(h.0);
                }
            });
        }
        guard.flush();
        blocks
    }

    /// Disk blocks of retired nodes retired in an epoch `<= upto` (for the commit's free log).
    /// True if replaced nodes wait for commits (and readers) before they are freed.
    pub fn has_retired(&self) -> bool {
        !self.retired.lock().is_empty()
    }

    pub fn retired_disk_blocks(&self, upto: TreeEpoch) -> Vec<DiskOffset> {
        let list = self.retired.lock();
        list.iter()
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

    // -----------------------------------------------------------------------------------
    // Checking

    /// Walks the whole tree at `root` and verifies it: disk images completely (checksum,
    /// bounds), levels, every key's prefix and hash, keys strictly ascending within their
    /// fences, pivots ascending, every pivot starting with its node's stem with its prefix
    /// the 8 bytes after it. Reads every key from the log. `root` must be sealed, or the
    /// caller must hold the region's writer lock.
    pub fn check<C: Ctx>(&self, ctx: &C, root: u64) -> Result<TreeCheck> {
        let mut report = TreeCheck::default();
        if root != 0 {
            let level = self.check_node(ctx, root, None, None, None, &mut report)?;
            report.height = level as u32 + 1;
        }
        Ok(report)
    }

    fn check_node<C: Ctx>(
        &self,
        ctx: &C,
        word: u64,
        expect_level: Option<u8>,
        low: Option<&[u8]>,
        high: Option<&[u8]>,
        report: &mut TreeCheck,
    ) -> Result<u8> {
        let (where_, snap) = match NodeRef::decode(word) {
            None => {
                return Err(Error::corruption(
                    "index",
                    DiskOffset::NONE,
                    "empty child slot",
                ))
            }
            Some(NodeRef::Heap(p)) => {
                report.heap_nodes += 1;
                // SAFETY: reachable from `root`, which the caller keeps alive.
                let m = unsafe { p.as_ref() }.meta();
                let snap = if m.is_leaf() {
                    snapshot_leaf(&HeapLeaf {
                        // SAFETY: kind checked.
                        node: unsafe { as_leaf(p) },
                        version: None,
                    })
                } else {
                    no_restart(snapshot_internal(
                        &HeapInternal {
                            // SAFETY: kind checked.
                            node: unsafe { as_internal(p) },
                            version: None,
                        },
                        ctx,
                        m.stem_len as usize,
                    ))?
                };
                (DiskOffset::NONE, snap)
            }
            Some(NodeRef::Disk(off)) => {
                report.disk_nodes += 1;
                let snap = ctx.with_node(off, |img| {
                    let d = DiskNode::open(img, off, self.region, expect_level)?;
                    d.verify_structure()?;
                    if d.meta().is_leaf() {
                        Ok(snapshot_leaf(&d))
                    } else {
                        no_restart(snapshot_internal(&d, ctx, d.meta().stem_len as usize))
                    }
                })?;
                (off, snap)
            }
        };
        let bad = |detail: String| Error::corruption("index node", where_, detail);
        if let Some(l) = expect_level {
            if snap.level != l {
                return Err(bad(format!("level {} where {l} was expected", snap.level)));
            }
        }
        let in_fences = |k: &[u8]| low.is_none_or(|l| l <= k) && high.is_none_or(|h| k < h);
        match snap.body {
            Snap::Leaf { stem, entries } => {
                report.leaves += 1;
                report.stem_bytes += stem.len() as u64;
                report.keys += entries.len() as u64;
                let mut prev: Option<Vec<u8>> = None;
                let mut key = Vec::new();
                for (i, (prefix, hash, ptr)) in entries.into_iter().enumerate() {
                    ctx.key_into(ptr, &mut key)?;
                    if !key.starts_with(&stem) {
                        return Err(bad(format!("entry {i}: key does not start with the stem")));
                    }
                    if prefix != key_prefix(&key[stem.len()..]) || hash != key_hash(&key) {
                        return Err(bad(format!(
                            "entry {i}: prefix or hash does not match its key"
                        )));
                    }
                    if !in_fences(&key) {
                        return Err(bad(format!("entry {i}: key outside the node's fences")));
                    }
                    if prev.as_deref().is_some_and(|p| p >= key.as_slice()) {
                        return Err(bad(format!("entry {i}: keys not strictly ascending")));
                    }
                    prev = Some(std::mem::take(&mut key));
                }
            }
            Snap::Internal {
                children,
                pivots,
                external,
                stem,
                stem_len,
                prefixes,
                lens,
            } => {
                report.pivots += pivots.len() as u64;
                report.external_pivots += external;
                if stem_len > MAX_INT_STEM_BYTES {
                    return Err(bad(format!("stem of {stem_len} bytes")));
                }
                report.internal_stem_bytes += stem.len() as u64;
                for (i, p) in pivots.iter().enumerate() {
                    if p.len() != lens[i] {
                        return Err(bad(format!(
                            "pivot {i}: {} bytes, its descriptor says {}",
                            p.len(),
                            lens[i]
                        )));
                    }
                    if !p.starts_with(&stem) {
                        return Err(bad(format!(
                            "pivot {i}: does not start with the node's stem"
                        )));
                    }
                    if prefixes[i] != key_prefix(&p[stem.len()..]) {
                        return Err(bad(format!(
                            "pivot {i}: prefix is not its 8 bytes after the stem"
                        )));
                    }
                    if i > 0 && pivots[i - 1] >= *p {
                        return Err(bad(format!("pivot {i}: pivots not strictly ascending")));
                    }
                    if low.is_some_and(|l| p.as_slice() < l)
                        || high.is_some_and(|h| p.as_slice() > h)
                    {
                        return Err(bad(format!("pivot {i}: outside the node's fences")));
                    }
                }
                for (i, &child) in children.iter().enumerate() {
                    let lo = if i == 0 {
                        low
                    } else {
                        Some(pivots[i - 1].as_slice())
                    };
                    let hi = if i == pivots.len() {
                        high
                    } else {
                        Some(pivots[i].as_slice())
                    };
                    self.check_node(ctx, child, Some(snap.level - 1), lo, hi, report)?;
                }
            }
        }
        Ok(snap.level)
    }
}

/// A node's content copied out for `check`.
struct NodeSnap {
    level: u8,
    body: Snap,
}

enum Snap {
    Leaf {
        stem: Vec<u8>,
        entries: Vec<(u64, u32, u64)>,
    },
    Internal {
        children: Vec<u64>,
        pivots: Vec<Vec<u8>>,
        external: u64,
        stem: Vec<u8>,
        /// As the header says, not clamped.
        stem_len: usize,
        prefixes: Vec<u64>,
        /// Descriptor lengths.
        lens: Vec<usize>,
    },
}

fn snapshot_leaf<L: LeafRead>(l: &L) -> NodeSnap {
    NodeSnap {
        level: 0,
        body: Snap::Leaf {
            stem: l.stem()[..l.stem_len()].to_vec(),
            entries: (0..l.count())
                .map(|i| (l.prefix(i), l.hash(i), l.ptr(i)))
                .collect(),
        },
    }
}

fn snapshot_internal<V: InternalRead, C: Ctx>(
    v: &V,
    ctx: &C,
    stem_len: usize,
) -> SResult<NodeSnap> {
    let n = v.count();
    let mut pivots = Vec::with_capacity(n);
    for i in 0..n {
        let mut p = Vec::new();
        pivot_into(v, ctx, i, &mut p)?;
        pivots.push(p);
    }
    let children = (0..=n).map(|i| v.child(i)).collect();
    let external = (0..n).filter(|&i| v.pivot_desc(i).is_external()).count() as u64;
    Ok(NodeSnap {
        level: v.level(),
        body: Snap::Internal {
            children,
            pivots,
            external,
            stem: v.stem()[..v.stem_len()].to_vec(),
            stem_len,
            prefixes: (0..n).map(|i| v.pivot_prefix(i)).collect(),
            lens: (0..n).map(|i| v.pivot_desc(i).len_bytes as usize).collect(),
        },
    })
}

#[cfg(test)]
impl Tree {
    /// (level, stem) of every heap internal node of the live tree, root first, parents
    /// before children. Writer only (or nothing else running).
    pub(crate) fn internal_stems_for_test(&self) -> Vec<(u8, Vec<u8>)> {
        let mut out = Vec::new();
        let mut todo = vec![self.root.load(Acquire)];
        while let Some(word) = todo.pop() {
            let Some(NodeRef::Heap(p)) = NodeRef::decode(word) else {
                continue;
            };
            // SAFETY: reachable from the live root; nothing changes the tree meanwhile.
            let m = unsafe { p.as_ref() }.meta();
            if m.is_leaf() {
                continue;
            }
            let view = HeapInternal {
                // SAFETY: kind checked.
                node: unsafe { as_internal(p) },
                version: None,
            };
            out.push((m.level, view.stem()[..view.stem_len()].to_vec()));
            todo.extend((0..=view.count()).rev().map(|i| view.child(i)));
        }
        out
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
        for r in self.retired.get_mut().drain(..) {
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
