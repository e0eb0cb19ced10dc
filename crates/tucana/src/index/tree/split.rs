//! Top-down splits of full nodes, and the stems they give each half.
//!
//! Owns: where a node splits (`LEAF_SPLIT_EDGE` for sequential loads, the end of a run of
//! tied prefixes for a leaf where one dominates, key-area bytes for internal nodes), the
//! separator a split pushes up (from the prefixes, or from the log when they tie;
//! EXTERNAL when longer than `MAX_INLINE_PIVOT`), growing a half's stem when its
//! keys or pivots share more bytes, shrinking an internal node's stem for a separator
//! without it, and the order that keeps every key reachable for readers: right half built
//! unseen, published through the parent, then cut from the left. Does not own: deciding to
//! split (the writer's descent in `write` splits every full node it meets), the node
//! format (`node`).
//!
//! Thread safety: writer only, like `write`. Its `unsafe` turns words of nodes on the
//! writer's path, and of nodes it just allocated, into references: the former are live
//! (reachable from the root, which only the writer changes), the latter are its own until
//! published. A published node is changed only inside its seqlock.

use std::cmp::Ordering;
use std::ptr::NonNull;
use std::sync::atomic::Ordering::*;

use super::write::{common_len, prefix_after_shrink, stem_room};
use super::{CountingCtx, Tree};
use crate::error::{Error, Result};
use crate::index::node::heap::{as_internal, as_leaf};
use crate::index::node::view::{no_restart, HeapInternal, HeapLeaf, InternalRead, LeafRead};
use crate::index::node::{
    heap_word, Header, InternalNode, LeafNode, Meta, PivotDesc, AREA_FREE_MIN_BYTES, C_INT, C_LEAF,
    KEY_AREA_BYTES, KIND_INTERNAL, MAX_INLINE_PIVOT, MAX_INT_STEM_BYTES, MAX_STEM_BYTES,
    PIVOT_EXTERNAL,
};
use crate::index::search::{pivot_into, separator, stem_position, StemPos};
use crate::index::{key_prefix, Ctx};
use crate::types::DiskOffset;

impl Tree {
    /// Splits the full child `idx` of `parent`: right half built unseen, then made reachable
    /// through the parent, then cut from the child (readers never miss a key).
    pub(super) fn split_child<C: Ctx>(
        &self,
        ctx: &C,
        parent: &InternalNode,
        idx: usize,
        child: NonNull<Header>,
        running: u64,
        key: &[u8],
    ) -> Result<Sep> {
        let split = self.split_prepare(ctx, child, running, key)?;
        self.shape_changed();
        Self::insert_pivot(parent, idx, &split.sep, heap_word(split.right));
        self.truncate(child, split.keep, split.left_stem);
        Ok(split.sep)
    }

    /// Splits the full writable root under a new root; returns the new root.
    pub(super) fn split_root<C: Ctx>(
        &self,
        ctx: &C,
        old: NonNull<Header>,
        running: u64,
        key: &[u8],
    ) -> Result<NonNull<Header>> {
        let Split {
            sep,
            right,
            keep,
            left_stem,
            ..
        } = self.split_prepare(ctx, old, running, key)?;
        self.shape_changed();
        // SAFETY: `old` is the live root.
        let level = unsafe { old.as_ref() }.meta().level + 1;
        let nr = self.new_internal(running, level);
        // SAFETY: just allocated as an internal node.
        let node = unsafe { as_internal(nr) };
        let mut used = 0;
        // The stem of a node with one pivot is as much of it as fits; the next pivot
        // shrinks it to what they share.
        let stem_len = sep.bytes.len().min(stem_room(sep.external.is_none()));
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
        self.truncate(old, keep, left_stem);
        Ok(nr)
    }

    /// Builds the right half of the full writable node `p` as a new, unpublished node.
    /// Changes nothing visible, so an error (a failed key read) leaves the tree as it was.
    /// `key` is the key being inserted.
    fn split_prepare<C: Ctx>(
        &self,
        ctx: &C,
        p: NonNull<Header>,
        running: u64,
        key: &[u8],
    ) -> Result<Split> {
        // SAFETY: `p` is a live node on the writer's path.
        if unsafe { p.as_ref() }.meta().is_leaf() {
            // SAFETY: live, and the kind was checked.
            self.split_leaf_prepare(ctx, unsafe { as_leaf(p) }, running, key)
        } else {
            // SAFETY: live, and the kind was checked.
            self.split_internal_prepare(ctx, unsafe { as_internal(p) }, running)
        }
    }

    /// `split_prepare` of a leaf: where it splits, the separator, each half's stem, and
    /// the right half's entries.
    fn split_leaf_prepare<C: Ctx>(
        &self,
        ctx: &C,
        leaf: &LeafNode,
        running: u64,
        key: &[u8],
    ) -> Result<Split> {
        let counting = CountingCtx::new(ctx);
        let split = self.split_leaf_prepare_counted(&counting, leaf, running, key);
        Self::count(&self.leaf_splits, 1);
        Self::count(&self.split_key_reads, counting.reads());
        if let Ok(s) = &split {
            let halves = s.left_stem.is_some() as u64 + s.right_restemmed as u64;
            Self::count(&self.restemmed_halves, halves);
        }
        split
    }

    /// `split_leaf_prepare` through a counting `Ctx`.
    fn split_leaf_prepare_counted<C: Ctx>(
        &self,
        ctx: &C,
        leaf: &LeafNode,
        running: u64,
        key: &[u8],
    ) -> Result<Split> {
        let own = HeapLeaf {
            node: leaf,
            version: None,
        };
        let n = leaf.hdr.meta().count as usize;
        let keep = leaf_split_point(ctx, &own, n, key)?;
        let stem = &own.stem()[..own.stem_len()];
        let (pl, pr) = (own.prefix(keep - 1), own.prefix(keep));
        let sep = if pl == pr {
            Self::separator_from_log(ctx, own.ptr(keep - 1), own.ptr(keep))?
        } else if pl < pr {
            prefix_separator(stem, pl, pr)
        } else {
            return Err(Error::corruption(
                "index leaf",
                DiskOffset(own.ptr(keep)),
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
        let right_restemmed = right_stem.is_some();
        let stem = match &right_stem {
            Some(rs) => rs.stem.clone(),
            None => stem.to_vec(),
        };
        right.set_stem(&stem);
        right.hdr.set_meta(Meta {
            count: (n - keep) as u16,
            stem_len: stem.len() as u16,
            ..right.hdr.meta()
        });
        Ok(Split {
            sep,
            right: r,
            keep,
            left_stem,
            right_restemmed,
        })
    }

    /// `split_prepare` of an internal node: where it splits (by key-area bytes if need
    /// be), the pivot that moves up, each half's stem, and the right half's pivots and
    /// children.
    fn split_internal_prepare<C: Ctx>(
        &self,
        ctx: &C,
        node: &InternalNode,
        running: u64,
    ) -> Result<Split> {
        let own = HeapInternal {
            node,
            version: None,
        };
        let n = node.hdr.meta().count as usize;
        let sizes: Vec<usize> = (0..n).map(|i| own.pivot_desc(i).area_bytes()).collect();
        let keep = internal_split_point(&sizes);
        let sep = sep_of(ctx, node, keep)?;
        // Each half may share more leading bytes than the whole did; a half whose first
        // pivot cannot hold the stem past the header (`stem_room`) may have to share less.
        let left_stem = Self::half_stem(ctx, &own, 0..keep)?;
        let right_stem = Self::half_stem(ctx, &own, keep + 1..n)?;
        let r = self.new_internal(running, own.level());
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
            None => no_restart(own.stem())?[..own.stem_len()].to_vec(),
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
        Ok(Split {
            sep,
            right: r,
            keep,
            left_stem,
            right_restemmed: right_stem.is_some(),
        })
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

    /// A longer stem for entries `range` of `leaf` (one half of a split), if they share
    /// more bytes than its stem and their prefixes tie often enough to pay for it (at
    /// least one neighbour pair in `RESTEM_TIE_SHARE_DIVISOR`: see there). Reads every key
    /// of the half from the log to build the new prefixes; `None` leaves the half as it
    /// is, which is always correct (a tie costs inserts a few key reads, lookups none).
    fn grown_stem<C: Ctx>(
        ctx: &C,
        leaf: &LeafNode,
        range: std::ops::Range<usize>,
    ) -> Result<Option<Restem>> {
        let stem_len = leaf.hdr.meta().stem_len as usize;
        if stem_len >= MAX_STEM_BYTES || !ties_pay_for_a_stem(leaf, range.clone()) {
            return Ok(None);
        }
        // The first byte after the stem of the half's first and last keys is the top
        // byte of their prefixes (0 for a key that ends at the stem): if those differ,
        // the half shares no more than the stem, and no key need be read to know it.
        let (pf, pl) = (
            leaf.prefix[range.start].load(Relaxed),
            leaf.prefix[range.end - 1].load(Relaxed),
        );
        if (pf ^ pl) >> 56 != 0 {
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
        room: usize,
    ) -> Result<Option<Restem>> {
        let stem_len = v.stem_len();
        if range.is_empty() || stem_len >= room {
            return Ok(None);
        }
        let (mut first, mut last) = (Vec::new(), Vec::new());
        no_restart(pivot_into(v, ctx, range.start, &mut first))?;
        no_restart(pivot_into(v, ctx, range.end - 1, &mut last))?;
        let new_len = common_len(&first, &last).min(room);
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

    /// The stem of pivots `range` of the writer's internal node `v` as a node of their
    /// own (one half of a split), when it is not the node's: grown over what they share
    /// (`grown_internal_stem`), or cut to the header's bytes when the half's first pivot
    /// cannot hold the rest (`stem_room`: an EXTERNAL one, or no pivot at all), with
    /// prefixes that take the bytes given up in front (no pivot read).
    fn half_stem<C: Ctx>(
        ctx: &C,
        v: &HeapInternal<'_>,
        range: std::ops::Range<usize>,
    ) -> Result<Option<Restem>> {
        let room = stem_room(!range.is_empty() && !v.pivot_desc(range.start).is_external());
        if let Some(grown) = Self::grown_internal_stem(ctx, v, range.clone(), room)? {
            return Ok(Some(grown));
        }
        let stem_len = v.stem_len();
        if stem_len <= room {
            return Ok(None);
        }
        let old = no_restart(v.stem())?;
        Ok(Some(Restem {
            stem: old[..room].to_vec(),
            prefixes: range
                .map(|i| prefix_after_shrink(&old[..stem_len], room, v.pivot_prefix(i)))
                .collect(),
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
        // SAFETY: as above; the kind was checked.
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
        let stem = no_restart(own.stem()).expect("the writer's own heap node");
        let old_stem = &stem[..m.stem_len as usize];
        let mut stem_len = common_len(old_stem, &sep.bytes);
        if idx == 0 {
            // The new pivot 0 holds the stem past the header.
            stem_len = stem_len.min(stem_room(sep.external.is_none()));
        }
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
}

/// Entries a leaf split leaves on the side a sequential load moves away from.
const LEAF_SPLIT_EDGE: usize = C_LEAF / 10;

/// A leaf splits at the end of the run of tied prefixes around its middle when the run
/// holds at least one in this many of its entries (`tie_run_end`). A smaller run moves
/// the split by at most a few entries, where a middle cut costs little either way.
const TIE_RUN_SPLIT_SHARE_DIVISOR: usize = 4;

/// A split half grows its stem only when at least one in this many of its neighbour
/// pairs tie on their prefix. Growing reads all the half's ~100 keys from the log under
/// the writer lock; a tie left in place costs an insert that lands in it a key read or
/// two (`leaf_position`: a binary search of the tie by full key), and a lookup nothing
/// (the hash picks the candidate). A half with a share `t` of tied pairs takes about
/// `100 t` inserts into ties before it splits again, ~`150 t` key reads, so growing
/// pays only when ties are dense. With YCSB's keys (3M loaded) halves tie at a share of
/// 1/64 to 1/16 and the old rule (any tie) re-stemmed half of all splits; see DESIGN.md,
/// "What a larger-than-memory load waits on".
const RESTEM_TIE_SHARE_DIVISOR: usize = 4;

/// Whether entries `range` of the writer's `leaf` tie often enough on their prefixes
/// for a longer stem to repay reading their keys (`RESTEM_TIE_SHARE_DIVISOR`). Reads
/// only the node.
fn ties_pay_for_a_stem(leaf: &LeafNode, range: std::ops::Range<usize>) -> bool {
    let pairs = range.len().saturating_sub(1);
    let ties = range
        .skip(1)
        .filter(|&i| leaf.prefix[i - 1].load(Relaxed) == leaf.prefix[i].load(Relaxed))
        .count();
    ties > 0 && ties * RESTEM_TIE_SHARE_DIVISOR >= pairs
}

/// The right half of a split, built but not yet reachable, and what the left half keeps.
struct Split {
    /// The separator the parent gets between the halves.
    sep: Sep,
    /// The new right half, unpublished.
    right: NonNull<Header>,
    /// Entries (pivots) the split node keeps.
    keep: usize,
    /// The kept half's longer stem and its new prefixes, if it gets one.
    left_stem: Option<Restem>,
    /// Whether the right half got a longer stem (counted in `WriteCounts`).
    right_restemmed: bool,
}

/// New prefixes and stem for a node whose stem grows (a split that finds the keys or
/// pivots of a half share more bytes): applied inside the node's write section.
struct Restem {
    stem: Vec<u8>,
    prefixes: Vec<u64>,
}

/// A separator on its way into an internal node. Its whole bytes are at hand (an EXTERNAL
/// one's read from the log once), because where it goes decides its prefix: the 8 bytes
/// after that node's stem, which it may also shrink.
pub(super) struct Sep {
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
    pub(super) fn cmp_key(&self, key: &[u8]) -> Ordering {
        self.bytes.as_slice().cmp(key)
    }
}

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

/// Number of entries the left half of the full leaf `own` (`n` entries) keeps. A key
/// beyond either end of the leaf is what ascending (descending) loads look like: leave
/// the side they will not come back to nearly full instead of half full. Random inserts
/// hit this 1 time in ~C_LEAF and lose little.
fn leaf_split_point<C: Ctx>(ctx: &C, own: &HeapLeaf<'_>, n: usize, key: &[u8]) -> Result<usize> {
    let key_pos = stem_position(&own.stem()[..own.stem_len()], key);
    let beyond = |i: usize, side: Ordering| -> Result<bool> {
        let kp = match key_pos {
            StemPos::Below => return Ok(side == Ordering::Greater),
            StemPos::Above => return Ok(side == Ordering::Less),
            StemPos::Inside(kp) => kp,
        };
        Ok(match own.prefix(i).cmp(&kp) {
            Ordering::Equal => ctx.key_cmp(own.ptr(i), key)? == side,
            o => o == side,
        })
    };
    let keep = if beyond(n - 1, Ordering::Less)? {
        n - LEAF_SPLIT_EDGE
    } else if beyond(0, Ordering::Greater)? {
        LEAF_SPLIT_EDGE
    } else {
        tie_run_end(own, n).unwrap_or(n / 2)
    };
    assert!(keep >= 1 && keep < n);
    Ok(keep)
}

/// Where a full leaf of `n` entries splits when its middle entry is inside a run of
/// entries that tie on their prefix, the run holds at least a quarter of the leaf and
/// not all of it: at the run's end nearer the middle. Reads only the node.
///
/// Why: a run of ties is keys that share more bytes than the leaf's stem (one list's
/// elements, one sorted set's members), beside keys that do not (the list's own key,
/// another collection's sub-records). Cut in the middle, the half with the run keeps the
/// outsiders and so the short stem, and every insert into the run searches it by full
/// key from the log (`leaf_position`): the head of a list pushed with LPUSH, whose
/// neighbour is the list's key, read 7.4 keys per push and 1 more per push at splits
/// (`examples/list_key_reads.rs`). Cut at the run's end, the run's half grows a stem
/// over the run's shared bytes (`grown_stem`) and its prefixes stop tying. The price is
/// a lopsided split (as few as one entry on the outsiders' side), bounded to leaves where
/// one run dominates; the run's half, nearly full, splits again by the usual rules.
fn tie_run_end(own: &HeapLeaf<'_>, n: usize) -> Option<usize> {
    let middle = n / 2;
    let tie = own.prefix(middle);
    let mut start = middle;
    while start > 0 && own.prefix(start - 1) == tie {
        start -= 1;
    }
    let mut end = middle + 1;
    while end < n && own.prefix(end) == tie {
        end += 1;
    }
    if (end - start) * TIE_RUN_SPLIT_SHARE_DIVISOR < n {
        return None;
    }
    match (start > 0, end < n) {
        (false, false) => None,
        (true, false) => Some(start),
        (false, true) => Some(end),
        (true, true) => Some(if middle - start <= end - middle {
            start
        } else {
            end
        }),
    }
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
