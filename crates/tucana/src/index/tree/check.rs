//! A full verification of one tree against its log, for the engine's `check`: disk images
//! completely, levels, every key's prefix and hash, keys strictly ascending inside their
//! fences, pivots ascending inside theirs, and every key and pivot starting with its node's
//! stem with its prefix the 8 bytes after it.
//!
//! Owns: the recursive walk and what it counts (`TreeCheck`). Does not own: verifying a
//! single disk image's structure (`node`), walking the volume's other structures (the
//! engine's `check`).
//!
//! Thread safety: reads the tree at a sealed root, or the live root under the region's
//! writer lock; either way nothing it reads changes. Its `unsafe` turns words of nodes
//! reachable from that root into references.

use super::Tree;
use crate::error::{Error, Result};
use crate::index::node::heap::{as_internal, as_leaf};
use crate::index::node::image::DiskNode;
use crate::index::node::view::{
    no_restart, HeapInternal, HeapLeaf, InternalRead, LeafRead, SResult,
};
use crate::index::node::{NodeRef, MAX_INT_STEM_BYTES};
use crate::index::search::pivot_into;
use crate::index::{key_hash, key_prefix, Ctx};
use crate::types::DiskOffset;

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

impl Tree {
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

    /// Verifies the node at `word` and everything below it: its keys (pivots) must lie in
    /// `[low, high)` (`None`: unbounded) and its level be `expect_level` when given.
    /// Returns its level.
    fn check_node<C: Ctx>(
        &self,
        ctx: &C,
        word: u64,
        expect_level: Option<u8>,
        low: Option<&[u8]>,
        high: Option<&[u8]>,
        report: &mut TreeCheck,
    ) -> Result<u8> {
        let (at, snap) = self.snapshot_node(ctx, word, expect_level, report)?;
        let bad = |detail: String| Error::corruption("index node", at, detail);
        if let Some(l) = expect_level {
            if snap.level != l {
                return Err(bad(format!("level {} where {l} was expected", snap.level)));
            }
        }
        match snap.body {
            Snap::Leaf(leaf) => check_leaf(ctx, at, leaf, low, high, report)?,
            Snap::Internal(node) => {
                check_pivots(at, &node, low, high, report)?;
                // Child `i` holds the keys from pivot `i - 1` (inclusive) to pivot `i`.
                for (i, &child) in node.children.iter().enumerate() {
                    let lo = if i == 0 {
                        low
                    } else {
                        Some(node.pivots[i - 1].as_slice())
                    };
                    let hi = if i == node.pivots.len() {
                        high
                    } else {
                        Some(node.pivots[i].as_slice())
                    };
                    self.check_node(ctx, child, Some(snap.level - 1), lo, hi, report)?;
                }
            }
        }
        Ok(snap.level)
    }

    /// Copies the node at `word` out and counts it: a disk image verified completely
    /// first (checksum, bounds, its level against `expect_level`), a heap node as it is.
    /// Returns where the node lives (`DiskOffset::NONE` for a heap node) and the copy.
    fn snapshot_node<C: Ctx>(
        &self,
        ctx: &C,
        word: u64,
        expect_level: Option<u8>,
        report: &mut TreeCheck,
    ) -> Result<(DiskOffset, NodeSnap)> {
        match NodeRef::decode(word) {
            None => Err(Error::corruption(
                "index",
                DiskOffset::NONE,
                "empty child slot",
            )),
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
                Ok((DiskOffset::NONE, snap))
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
                Ok((off, snap))
            }
        }
    }
}

/// Every entry of the leaf at `at` (`DiskOffset::NONE`: a heap leaf) against its key in
/// the log: the key starts with the stem, its prefix (after the stem) and hash match, it
/// lies inside the fences `[low, high)`, and keys ascend strictly.
fn check_leaf<C: Ctx>(
    ctx: &C,
    at: DiskOffset,
    leaf: LeafSnap,
    low: Option<&[u8]>,
    high: Option<&[u8]>,
    report: &mut TreeCheck,
) -> Result<()> {
    let LeafSnap { stem, entries } = leaf;
    let bad = |detail: String| Error::corruption("index node", at, detail);
    let in_fences = |k: &[u8]| low.is_none_or(|l| l <= k) && high.is_none_or(|h| k < h);
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
    Ok(())
}

/// Every pivot of the internal node at `at`: its length as its descriptor says, starting with the
/// node's stem (at most `MAX_INT_STEM_BYTES`) with its prefix the 8 bytes after it,
/// ascending strictly, and inside the node's fences (`low <= pivot <= high`).
fn check_pivots(
    at: DiskOffset,
    node: &InternalSnap,
    low: Option<&[u8]>,
    high: Option<&[u8]>,
    report: &mut TreeCheck,
) -> Result<()> {
    let InternalSnap {
        pivots,
        external,
        stem,
        stem_len,
        prefixes,
        lens,
        ..
    } = node;
    let bad = |detail: String| Error::corruption("index node", at, detail);
    report.pivots += pivots.len() as u64;
    report.external_pivots += external;
    if *stem_len > MAX_INT_STEM_BYTES {
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
        if !p.starts_with(stem) {
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
        if low.is_some_and(|l| p.as_slice() < l) || high.is_some_and(|h| p.as_slice() > h) {
            return Err(bad(format!("pivot {i}: outside the node's fences")));
        }
    }
    Ok(())
}

/// A node's content copied out for `check`.
struct NodeSnap {
    level: u8,
    body: Snap,
}

enum Snap {
    Leaf(LeafSnap),
    Internal(InternalSnap),
}

struct LeafSnap {
    stem: Vec<u8>,
    /// (prefix, hash, log pointer) of every entry.
    entries: Vec<(u64, u32, u64)>,
}

struct InternalSnap {
    children: Vec<u64>,
    pivots: Vec<Vec<u8>>,
    /// Pivots kept by log pointer.
    external: u64,
    stem: Vec<u8>,
    /// As the header says, not clamped.
    stem_len: usize,
    prefixes: Vec<u64>,
    /// Descriptor lengths.
    lens: Vec<usize>,
}

fn snapshot_leaf<L: LeafRead>(l: &L) -> NodeSnap {
    NodeSnap {
        level: 0,
        body: Snap::Leaf(LeafSnap {
            stem: l.stem()[..l.stem_len()].to_vec(),
            entries: (0..l.count())
                .map(|i| (l.prefix(i), l.hash(i), l.ptr(i)))
                .collect(),
        }),
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
        body: Snap::Internal(InternalSnap {
            children,
            pivots,
            external,
            stem: v.stem()?[..v.stem_len()].to_vec(),
            stem_len,
            prefixes: (0..n).map(|i| v.pivot_prefix(i)).collect(),
            lens: (0..n).map(|i| v.pivot_desc(i).len_bytes as usize).collect(),
        }),
    })
}

#[cfg(test)]
impl Tree {
    /// (level, stem) of every heap internal node of the live tree, root first, parents
    /// before children. Writer only (or nothing else running).
    pub(crate) fn internal_stems_for_test(&self) -> Vec<(u8, Vec<u8>)> {
        let mut out = Vec::new();
        let mut todo = vec![self.root.load(std::sync::atomic::Ordering::Acquire)];
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
            let stem = no_restart(view.stem()).expect("the writer's own heap node");
            out.push((m.level, stem[..view.stem_len()].to_vec()));
            todo.extend((0..=view.count()).rev().map(|i| view.child(i)));
        }
        out
    }
}
