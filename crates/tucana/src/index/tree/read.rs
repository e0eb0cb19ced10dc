//! Readers' descents: point lookups, GC's points-at question, and copies of one leaf with
//! its fences for ranges, from the live root or a sealed one.
//!
//! Owns: the descent loop with optimistic lock coupling and its restarts, the three
//! descents (`Descent`: what to do at each internal node and at the leaf), and the leaf
//! copies ranges iterate over (`LeafCopy`, `Seek`). Does not own: searches inside a node
//! (`search`), what a range does with a leaf (the keyspace's iterators).
//!
//! Thread safety: any thread, never blocking, inside a `crossbeam_epoch` guard the caller
//! holds for the whole call. Its `unsafe` turns a node word read by a descent into a
//! reference: the word is the start root (live, or sealed and kept alive by the epoch
//! rules) or a child word of a node whose version validated after it was read, and the
//! guard keeps a node retired since then from being freed. Every value read from a heap
//! node is trusted only after that node's version validates.

use std::sync::atomic::Ordering::*;

use crossbeam_epoch::Guard;

use super::Tree;
use crate::error::Result;
use crate::index::node::heap::{as_internal, as_leaf};
use crate::index::node::image::DiskNode;
use crate::index::node::view::{
    no_restart, HeapInternal, HeapLeaf, InternalRead, LeafRead, SResult, SearchErr,
};
use crate::index::node::{prefetch_leaf_word, Header, NodeRef, KIND_LEAF};
use crate::index::search::{
    child_index, leaf_get, leaf_points_at, pivot_into, stem_position, StemPos,
};
use crate::index::{key_hash, Ctx};
use crate::types::DiskOffset;

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
    /// Entries of the leaf after the copy's last were left out (`Tree::copy_leaf_from`
    /// with a cap): the rest of the leaf is found by a seek from the last entry's key,
    /// not from `high`.
    pub cut: bool,
}

impl LeafCopy {
    /// Empties the copy, keeping its buffers' capacity.
    pub fn clear(&mut self) {
        self.ptrs.clear();
        self.prefixes.clear();
        self.stem.clear();
        self.low = None;
        self.high = None;
        self.cut = false;
    }

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

impl Tree {
    /// Whether `key` maps to log pointer `ptr` in the tree at `root` (`None`: the live
    /// root), reading no log record (see `search::leaf_points_at`). Never blocks; any thread.
    pub fn points_at<C: Ctx>(
        &self,
        ctx: &C,
        root: Option<u64>,
        key: &[u8],
        ptr: u64,
        _guard: &Guard,
    ) -> Result<bool> {
        let mut w = PointsAtDescent {
            key,
            hash: key_hash(key),
            ptr,
        };
        self.descend(ctx, root, &mut w)
    }

    /// The log pointer of `key` in the tree at `root` (`None`: the live root, or a
    /// `Sealed::root`). Never blocks; any thread.
    pub fn get<C: Ctx>(
        &self,
        ctx: &C,
        root: Option<u64>,
        key: &[u8],
        _guard: &Guard,
    ) -> Result<Option<u64>> {
        let mut w = GetDescent {
            key,
            hash: key_hash(key),
        };
        self.descend(ctx, root, &mut w)
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
        self.copy_leaf_trimmed(ctx, root, seek, None, usize::MAX, out)
    }

    /// `copy_leaf` of `Seek::AtOrAfter(key)` that leaves out the entries certainly below
    /// `key` (their prefix is below its, or the whole leaf is): what a forward range needs
    /// from its first leaf. A seek that reads a few items from the middle of a leaf
    /// copied all of it (a fifth of `seekrandom`'s CPU was `copy_leaf`, session 21). The
    /// copy's entries and prefixes start at the first entry that may hold `key` or more;
    /// its low fence is the leaf's.
    ///
    /// About `max_entries` entries are copied (a range with a limit: ten members of a
    /// sorted set copied half a leaf, a hundred entries, and that copy was 13% of
    /// `ZRANGEBYSCORE … LIMIT 0 10`'s CPU). A cut copy (`LeafCopy::cut`) ends past the
    /// entries whose prefixes tie with `key`'s and one entry further, so it holds an
    /// entry above `key`, and a forward range goes on with a seek from the last key it
    /// read. Its fences stay the leaf's; no key is read to cut it (a cold scan asks for
    /// its records before it reads any). `usize::MAX`: the leaf's tail whole.
    pub fn copy_leaf_from<C: Ctx>(
        &self,
        ctx: &C,
        root: Option<u64>,
        key: &[u8],
        max_entries: usize,
        _guard: &Guard,
        out: &mut LeafCopy,
    ) -> Result<()> {
        self.copy_leaf_trimmed(ctx, root, Seek::AtOrAfter(key), Some(key), max_entries, out)
    }

    fn copy_leaf_trimmed<C: Ctx>(
        &self,
        ctx: &C,
        root: Option<u64>,
        seek: Seek<'_>,
        from_key: Option<&[u8]>,
        max_entries: usize,
        out: &mut LeafCopy,
    ) -> Result<()> {
        let mut w = LeafCopyDescent {
            seek,
            from_key,
            max_entries,
            low: out.low.take().unwrap_or_default(),
            high: out.high.take().unwrap_or_default(),
            out,
            low_set: false,
            high_set: false,
        };
        self.descend(ctx, root, &mut w)?;
        let LeafCopyDescent {
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
    pub(super) fn descend<C: Ctx, W: Descent>(
        &self,
        ctx: &C,
        root: Option<u64>,
        w: &mut W,
    ) -> Result<W::Out> {
        loop {
            w.reset();
            let start = root.unwrap_or_else(|| self.root.load(Acquire));
            match self.descend_once(ctx, start, root.is_none(), w) {
                Ok(out) => return Ok(out),
                Err(SearchErr::Fail(e)) => return Err(e),
                // Only a node of the running epoch moves; a sealed root never restarts.
                Err(SearchErr::Restart) => debug_assert!(root.is_none()),
            }
        }
    }

    /// One attempt of `descend` from the root word `start` (`live`: the live root, which is
    /// re-checked like a parent); `Restart` when a heap node moved under it.
    fn descend_once<C: Ctx, W: Descent>(
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
                Some(NodeRef::Disk(off)) => return self.descend_disk(ctx, off, expect_level, w),
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
                let view = HeapLeaf {
                    // SAFETY: `p` is live (above), and the kind of a node never changes.
                    node: unsafe { as_leaf(p) },
                    version: Some(v),
                };
                let out = w.leaf(&view, ctx)?;
                view.validate()?;
                return Ok(out);
            }
            let view = HeapInternal {
                // SAFETY: as above.
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
    fn descend_disk<C: Ctx, W: Descent>(
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
}

/// What one descent from a root to a leaf does on its way (lookups and leaf copies): the
/// descent loop (`Tree::descend`) is generic over it, so each kind is compiled on its own.
///
/// The implementations are `#[inline]`: the loop calls them at every node. Without it,
/// once the tree's code was spread over several files, rustc compiled them out of line and
/// a leaf copy took 4% more instructions (callgrind, `tucana-bench micro --keys 50000`).
pub(super) trait Descent {
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

/// A point lookup: the log pointer of `key` (`Tree::get`; the writer's `remove` probes
/// with it too).
pub(super) struct GetDescent<'k> {
    pub(super) key: &'k [u8],
    pub(super) hash: u32,
}

impl Descent for GetDescent<'_> {
    type Out = Option<u64>;
    #[inline]
    fn empty(&mut self) -> Option<u64> {
        None
    }
    #[inline]
    fn internal<V: InternalRead, C: Ctx>(&mut self, v: &V, ctx: &C) -> SResult<usize> {
        child_index(v, ctx, self.key, true)
    }
    #[inline]
    fn leaf<L: LeafRead, C: Ctx>(&mut self, l: &L, ctx: &C) -> SResult<Option<u64>> {
        leaf_get(l, ctx, self.key, self.hash)
    }
}

/// Whether `key`'s entry holds `ptr` (`Tree::points_at`).
struct PointsAtDescent<'k> {
    key: &'k [u8],
    hash: u32,
    ptr: u64,
}

impl Descent for PointsAtDescent<'_> {
    type Out = bool;
    #[inline]
    fn empty(&mut self) -> bool {
        false
    }
    #[inline]
    fn internal<V: InternalRead, C: Ctx>(&mut self, v: &V, ctx: &C) -> SResult<usize> {
        child_index(v, ctx, self.key, true)
    }
    #[inline]
    fn leaf<L: LeafRead, C: Ctx>(&mut self, l: &L, _ctx: &C) -> SResult<bool> {
        leaf_points_at(l, self.key, self.hash, self.ptr)
    }
}

/// A copy of the leaf `seek` chooses, with the fences gathered on the way down
/// (`Tree::copy_leaf`).
struct LeafCopyDescent<'a, 'o> {
    seek: Seek<'a>,
    /// Leave out the entries certainly below this key (`Tree::copy_leaf_from`).
    from_key: Option<&'a [u8]>,
    /// Copy about this many entries, ending past the ones tied with `from_key`.
    max_entries: usize,
    out: &'o mut LeafCopy,
    low: Vec<u8>,
    high: Vec<u8>,
    low_set: bool,
    high_set: bool,
}

impl Descent for LeafCopyDescent<'_, '_> {
    type Out = ();
    #[inline]
    fn reset(&mut self) {
        self.low_set = false;
        self.high_set = false;
        self.out.ptrs.clear();
        self.out.prefixes.clear();
        self.out.stem.clear();
        self.out.cut = false;
    }
    #[inline]
    fn empty(&mut self) {}
    #[inline]
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
    #[inline]
    fn leaf<L: LeafRead, C: Ctx>(&mut self, l: &L, _ctx: &C) -> SResult<()> {
        self.out.ptrs.clear();
        self.out.prefixes.clear();
        let n = l.count();
        let stem_bytes = l.stem();
        let stem = &stem_bytes[..l.stem_len().min(stem_bytes.len())];
        // The first entry whose prefix is not below the key's (the start of `tie_span`)
        // and the first whose prefix is above it (its end), read from the node; a torn
        // read is caught by `validate` below.
        let first_not_below = |kp: u64, above: bool| {
            let (mut lo, mut hi) = (0, n);
            while lo < hi {
                let mid = (lo + hi) / 2;
                let p = l.prefix(mid);
                if p < kp || (above && p == kp) {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            lo
        };
        let (start, ties_end) = match self.from_key.map(|k| stem_position(stem, k)) {
            None | Some(StemPos::Below) => (0, 0),
            Some(StemPos::Above) => (n, n),
            Some(StemPos::Inside(kp)) => {
                let start = first_not_below(kp, false);
                let capped = self.max_entries < n - start;
                (
                    start,
                    if capped {
                        first_not_below(kp, true)
                    } else {
                        start
                    },
                )
            }
        };
        // Past the entries tied with the key, and one entry further: a cut copy then holds
        // an entry above the key, so a range that goes on from its last key moves on.
        let end = start
            .saturating_add(self.max_entries.max(1))
            .max(ties_end.saturating_add(1))
            .min(n);
        self.out.ptrs.extend((start..end).map(|i| l.ptr(i)));
        self.out.prefixes.extend((start..end).map(|i| l.prefix(i)));
        self.out.cut = end < n;
        self.out.stem.clear();
        self.out.stem.extend_from_slice(stem);
        l.validate()?;
        if self.out.ptrs.contains(&0) {
            return Err(l.corrupt("zero log pointer"));
        }
        Ok(())
    }
}

/// What `descend_disk` did at one disk node: the descent's result, or the child to go on to
/// (its word and level).
enum DiskStep<T> {
    Done(T),
    Next(u64, u8),
}
