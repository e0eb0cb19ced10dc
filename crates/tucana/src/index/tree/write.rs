//! The writer's changes to a tree: insert, remove (pruning the leaves it empties), replace
//! a record's pointer, seal, and the copy-on-write that makes each node on the writer's
//! path writable first.
//!
//! Owns: in-place changes of nodes of the running tree epoch inside their seqlock, copies
//! of sealed heap nodes and disk nodes into the running epoch (the old node retired), and
//! shrinking a leaf's stem for a key without it. Does not own: splits of full nodes and
//! the stems they grow (`split`), searches inside a node (`search`), reader descents
//! (`read`).
//!
//! Thread safety: every method here is the writer's (`Tree::writer` catches overlaps) or is
//! called by it. Its `unsafe` is of one kind: turning a node word of the writer's path into
//! a reference. Such nodes are reachable from the root, which only the writer changes, so
//! they are live; only nodes of the running epoch are changed, each change of a published
//! node inside `write_begin`/`write_end`, and never with I/O inside.

use std::cmp::Ordering;
use std::ptr::NonNull;
use std::sync::atomic::Ordering::*;

use super::read::GetDescent;
use super::{CountingCtx, Finger, HeapNode, RetiredNode, Sealed, Tree};
use crate::error::Result;
use crate::index::node::heap::{as_internal, as_leaf, heap_copy};
use crate::index::node::image::{heap_from_image, DiskNode};
use crate::index::node::view::{no_restart, HeapInternal, HeapLeaf, InternalRead, LeafRead};
use crate::index::node::{
    heap_word, prefetch_leaf_word, Header, InternalNode, LeafNode, Meta, NodeRef, PivotDesc, C_INT,
    C_LEAF, INT_HEADER_STEM_BYTES, KEY_AREA_BYTES, MAX_INT_STEM_BYTES,
};
use crate::index::search::{child_index, leaf_entry_of, leaf_position, stem_position, StemPos};
use crate::index::{key_hash, key_prefix, Ctx};
use crate::types::{DiskOffset, TreeEpoch};

impl Tree {
    /// Maps `key` to the log pointer `ptr` (non-zero). Returns the pointer it replaced.
    /// Writer only. Allocates only when it copies or splits a node.
    pub fn insert<C: Ctx>(&self, ctx: &C, key: &[u8], ptr: u64) -> Result<Option<u64>> {
        let _w = self.writer();
        self.insert_from_root(ctx, key, ptr, None)
    }

    /// `insert`'s descent from the root, splitting full nodes on the way down. With a
    /// `finger`, leaves it naming the leaf reached and the path to it (left empty when
    /// the tree was). Writer only; the caller holds the writer check.
    pub(super) fn insert_from_root<C: Ctx>(
        &self,
        ctx: &C,
        key: &[u8],
        ptr: u64,
        mut finger: Option<&mut Finger>,
    ) -> Result<Option<u64>> {
        assert!(ptr != 0, "log pointer 0 names no record");
        if let Some(f) = finger.as_deref_mut() {
            f.clear();
        }
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
        // SAFETY: nodes on the writer's path are reachable from the root, which only the
        // writer changes, so they are live (the same for every node of the loop below).
        if unsafe { node.as_ref() }.meta().is_full() {
            node = self.split_root(ctx, node, running, key)?;
        }
        loop {
            // SAFETY: live (above).
            if unsafe { node.as_ref() }.meta().is_leaf() {
                if let Some(f) = finger {
                    // After every split of this insert: the path as it stands now.
                    f.reached(self, node);
                }
                // SAFETY: live, and the kind was checked.
                return self.leaf_insert(ctx, unsafe { as_leaf(node) }, key, kh, ptr);
            }
            // SAFETY: live, and the kind was checked.
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
            // SAFETY: a child of a node on the writer's path is on it too: live.
            if unsafe { child.as_ref() }.meta().is_full() {
                let sep = self.split_child(ctx, parent, idx, child, running, key)?;
                if sep.cmp_key(key) != Ordering::Greater {
                    idx += 1;
                    child = match NodeRef::decode(parent.child[idx].load(Relaxed)) {
                        Some(NodeRef::Heap(p)) => p,
                        other => unreachable!("new right sibling is not a heap node: {other:?}"),
                    };
                }
                // SAFETY: live, as above (a new right sibling is on the writer's path now).
                assert!(!unsafe { child.as_ref() }.meta().is_full());
            }
            if let Some(f) = finger.as_deref_mut() {
                f.path.push((node, idx));
            }
            node = child;
        }
    }

    pub(super) fn leaf_insert<C: Ctx>(
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
                Self::count(&self.stem_shrinks, 1);
                Self::shrink_stem(leaf, &stem[..stem_len], keep);
            }
        }
        let kp = match stem_position(&own.stem()[..own.stem_len()], key) {
            StemPos::Inside(kp) => kp,
            other => unreachable!("key outside the stem after shrinking it: {other:?}"),
        };
        let counting = CountingCtx::new(ctx);
        let position = no_restart(leaf_position(&own, &counting, key, kh));
        Self::count(&self.insert_key_reads, counting.reads());
        let (pos, found) = position?;
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

    /// `leaf_insert` of `keys[0]` (to `ptrs[0]`), and with it each following key of `keys`
    /// while it is new to the leaf, needs no shorter stem, goes into the same gap between
    /// two entries as the first and sorts above the key before it (and, where that gap
    /// is the leaf's end, `in_leaf` says it is inside the leaf's range): such a run goes
    /// in together, in one shift of the entries after the gap inside one seqlock write,
    /// where inserting the keys one by one shifted those entries once per key (a list's
    /// run of pushes at its head puts entry after entry in front of a leaf). A reader
    /// sees none of the run or all of it. A first key already in the leaf is an update
    /// alone. `olds[j]` gets the pointer `keys[j]` replaced (`None` for every key of a
    /// run); returns how many keys were taken, at least one. The leaf must have room.
    pub(super) fn leaf_insert_run<C: Ctx>(
        &self,
        ctx: &C,
        leaf: &LeafNode,
        keys: &[&[u8]],
        ptrs: &[u64],
        olds: &mut [Option<u64>],
        in_leaf: &mut dyn FnMut(&[u8]) -> Result<bool>,
    ) -> Result<usize> {
        const RUN_MAX: usize = 64;
        let own = HeapLeaf {
            node: leaf,
            version: None,
        };
        let m = leaf.hdr.meta();
        let n = m.count as usize;
        assert!(n < C_LEAF && !keys.is_empty(), "insert into a full leaf");
        let stem = own.stem();
        let stem = &stem[..own.stem_len()];
        let counting = CountingCtx::new(ctx);
        let mut entries = [(0u64, 0u32); RUN_MAX];
        let mut gap = None;
        let mut taken = 0;
        while taken < keys.len().min(RUN_MAX) && n + taken < C_LEAF {
            let key = keys[taken];
            let StemPos::Inside(kp) = stem_position(stem, key) else {
                if taken == 0 {
                    // The stem shrinks for this key first: `leaf_insert` does both.
                    olds[0] = self.leaf_insert(ctx, leaf, key, key_hash(key), ptrs[0])?;
                    return Ok(1);
                }
                break;
            };
            let kh = key_hash(key);
            let position = no_restart(leaf_position(&own, &counting, key, kh));
            let (pos, found) = match position {
                Ok(found_at) => found_at,
                Err(e) => {
                    Self::count(&self.insert_key_reads, counting.reads());
                    return Err(e);
                }
            };
            if found && taken == 0 {
                Self::count(&self.insert_key_reads, counting.reads());
                // An update: one atomic word, as in `leaf_insert`.
                olds[0] = Some(leaf.ptr[pos].swap(ptrs[0], Release));
                return Ok(1);
            }
            if found {
                break;
            }
            match gap {
                None => gap = Some(pos),
                Some(g) if g == pos && keys[taken - 1] < key && (pos < n || in_leaf(key)?) => {}
                Some(_) => break,
            }
            entries[taken] = (kp, kh);
            taken += 1;
        }
        Self::count(&self.insert_key_reads, counting.reads());
        let at = gap.expect("the first key is new to a leaf with room: it has a gap");
        leaf.hdr.write_begin();
        for i in (at..n).rev() {
            leaf.prefix[i + taken].store(leaf.prefix[i].load(Relaxed), Relaxed);
            leaf.ptr[i + taken].store(leaf.ptr[i].load(Relaxed), Relaxed);
            leaf.hash[i + taken].store(leaf.hash[i].load(Relaxed), Relaxed);
        }
        for (j, &(kp, kh)) in entries[..taken].iter().enumerate() {
            assert!(ptrs[j] != 0, "log pointer 0 names no record");
            leaf.prefix[at + j].store(kp, Relaxed);
            leaf.ptr[at + j].store(ptrs[j], Relaxed);
            leaf.hash[at + j].store(kh, Relaxed);
        }
        leaf.hdr.set_meta(Meta {
            count: m.count + taken as u16,
            ..m
        });
        leaf.hdr.write_end();
        olds[..taken].fill(None);
        Ok(taken)
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

    /// Removes `key`. Returns the pointer it mapped to. Writer only. Copies nothing when the
    /// key is absent. A leaf left empty is taken out of its parent (and an internal node
    /// left without children out of its own), so deleting every key empties the tree;
    /// leaves are not merged otherwise (future work).
    pub fn remove<C: Ctx>(&self, ctx: &C, key: &[u8]) -> Result<Option<u64>> {
        let _w = self.writer();
        let mut path = Vec::new();
        self.remove_from_root(ctx, key, &mut path, None)
    }

    /// `remove`'s descent from the root, after a probe that copies nothing for an absent
    /// key. `path` (cleared first) gets the internal nodes passed and the child index
    /// taken in each. With a `finger`, leaves it naming the leaf reached and `path` when
    /// the leaf stays in the tree. Writer only; the caller holds the writer check.
    pub(super) fn remove_from_root<C: Ctx>(
        &self,
        ctx: &C,
        key: &[u8],
        path: &mut Vec<(NonNull<Header>, usize)>,
        finger: Option<&mut Finger>,
    ) -> Result<Option<u64>> {
        let kh = key_hash(key);
        path.clear();
        // A path already of the running epoch (written since the last seal) is searched
        // once: nothing is copied, so an absent key costs nothing more. Otherwise a probe
        // first, so that a remove of an absent key copies nothing.
        let node = match self.running_leaf(ctx, key, path)? {
            Some(node) => node,
            None => {
                let mut probe = GetDescent { key, hash: kh };
                if self.descend(ctx, None, &mut probe)?.is_none() {
                    return Ok(None);
                }
                path.clear();
                self.writable_leaf(ctx, key, Some(path))?
            }
        };
        let shape = self.shape_changes.load(Relaxed);
        let removed = self.leaf_remove(ctx, path, node, key)?;
        if let Some(f) = finger {
            f.clear();
            // A pruned leaf (a change of shape) is no place to start from.
            if self.shape_changes.load(Relaxed) == shape {
                f.path.extend_from_slice(path);
                f.reached(self, node);
            }
        }
        Ok(removed)
    }

    /// Removes `key` from the writable `node`, the leaf its range is in, reached through
    /// `path` (writable internal nodes and the child index taken in each); prunes the leaf
    /// if that empties it. Returns the pointer `key` mapped to, `None` if it is absent.
    pub(super) fn leaf_remove<C: Ctx>(
        &self,
        ctx: &C,
        path: &[(NonNull<Header>, usize)],
        node: NonNull<Header>,
        key: &[u8],
    ) -> Result<Option<u64>> {
        let mut old = [None];
        self.leaf_remove_run(ctx, path, node, &[key], &mut old)?;
        Ok(old[0])
    }

    /// `leaf_remove` of `keys[0]`, then of each following key of `keys` while it is the
    /// entry right after the last one removed: such a run leaves the leaf together, in one
    /// shift of the entries after it inside one seqlock write, where removing them one by
    /// one shifted those entries once per key (a list's run of pops takes entry after
    /// entry from the front of a leaf). A reader sees none of the run removed or all of
    /// it, which is the batch applied up to before or after the run. `olds[j]` gets the
    /// pointer `keys[j]` mapped to; returns how many keys were taken, at least one (the
    /// first, even when absent, with `None`).
    pub(super) fn leaf_remove_run<C: Ctx>(
        &self,
        ctx: &C,
        path: &[(NonNull<Header>, usize)],
        node: NonNull<Header>,
        keys: &[&[u8]],
        olds: &mut [Option<u64>],
    ) -> Result<usize> {
        let running = self.running.load(Relaxed);
        // SAFETY: callers pass a live leaf of the running epoch (`writable_leaf`'s, or a
        // finger's that no change of shape made stale).
        let leaf = unsafe { as_leaf(node) };
        let own = HeapLeaf {
            node: leaf,
            version: None,
        };
        let counting = CountingCtx::new(ctx);
        let found_at = |key: &[u8]| no_restart(leaf_position(&own, &counting, key, key_hash(key)));
        let first = found_at(keys[0]);
        let m = leaf.hdr.meta();
        let n = m.count as usize;
        let mut taken = 0;
        let pos = match first {
            Ok((pos, true)) => pos,
            other => {
                Self::count(&self.insert_key_reads, counting.reads());
                // After the probe, only a log answering differently could get here;
                // through a finger, the key is absent. Nothing was removed.
                olds[0] = None;
                return other.map(|_| 1);
            }
        };
        // The run's keys are confirmed before anything moves: an error leaves the leaf
        // as it was.
        while taken < keys.len() && pos + taken < n {
            if taken > 0 {
                match found_at(keys[taken]) {
                    Ok((at, true)) if at == pos + taken => {}
                    // Not the next entry (absent, or elsewhere): the run ends here, and
                    // the caller goes on from that key.
                    Ok(_) => break,
                    Err(e) => {
                        Self::count(&self.insert_key_reads, counting.reads());
                        return Err(e);
                    }
                }
            }
            olds[taken] = Some(leaf.ptr[pos + taken].load(Relaxed));
            taken += 1;
        }
        Self::count(&self.insert_key_reads, counting.reads());
        leaf.hdr.write_begin();
        for i in pos..n - taken {
            leaf.prefix[i].store(leaf.prefix[i + taken].load(Relaxed), Relaxed);
            leaf.ptr[i].store(leaf.ptr[i + taken].load(Relaxed), Relaxed);
            leaf.hash[i].store(leaf.hash[i + taken].load(Relaxed), Relaxed);
        }
        leaf.hdr.set_meta(Meta {
            count: m.count - taken as u16,
            ..m
        });
        leaf.hdr.write_end();
        if taken == n {
            self.prune_empty(path, node, running);
        }
        Ok(taken)
    }

    /// Takes the empty `leaf` (reached through `path`, all writable nodes of the running
    /// epoch) out of the tree, with every ancestor it leaves without children. Same reader
    /// rule as splits: the parent changes inside its seqlock, so readers that read the old
    /// child word restart when they validate it; readers already inside a detached node see
    /// its version move and restart too (an empty node answered "absent" correctly anyway).
    /// The detached nodes are retired: in no sealed tree (they are of the running epoch),
    /// freed after the readers' grace period.
    fn prune_empty(&self, path: &[(NonNull<Header>, usize)], leaf: NonNull<Header>, running: u64) {
        self.shape_changed();
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
    /// Compacts the key area. When pivot 0 goes and the one after it cannot hold the stem
    /// past the header (`stem_room`), the stem shrinks to the header's bytes.
    fn remove_child(node: &InternalNode, idx: usize) {
        let m = node.hdr.meta();
        let n = m.count as usize;
        assert!(
            n >= 1 && idx <= n,
            "remove child {idx} of a node with {n} pivots"
        );
        let gone = idx.saturating_sub(1);
        let old_len = m.stem_len as usize;
        let stem_len = if gone == 0 {
            let next_inline =
                n >= 2 && !PivotDesc::unpack(node.pivot_desc[1].load(Relaxed)).is_external();
            old_len.min(stem_room(next_inline))
        } else {
            old_len
        };
        // The old stem, read only when it is cut: its bytes go in front of every prefix.
        let cut = (stem_len < old_len).then(|| {
            let own = HeapInternal {
                node,
                version: None,
            };
            no_restart(own.stem()).expect("the writer's own heap node")
        });
        let mut area = [0u8; KEY_AREA_BYTES];
        let mut descs = [0u64; C_INT];
        let mut prefixes = [0u64; C_INT];
        let mut children = [0u64; C_INT + 1];
        let mut used = 0usize;
        for (j, i) in (0..n).filter(|&i| i != gone).enumerate() {
            prefixes[j] = node.pivot_prefix[i].load(Relaxed);
            if let Some(old) = &cut {
                prefixes[j] = prefix_after_shrink(&old[..old_len], stem_len, prefixes[j]);
            }
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
        if let Some(old) = &cut {
            node.set_stem(&old[..stem_len]);
        }
        node.hdr.set_meta(Meta {
            count: m.count - 1,
            area_used: used as u16,
            stem_len: stem_len as u16,
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
        // The running epoch's nodes are sealed now: a finger's nodes are not writable.
        self.shape_changed();
        self.dirty_nodes.store(0, Relaxed);
        Sealed {
            root,
            epoch: TreeEpoch(epoch),
        }
    }

    // -----------------------------------------------------------------------------------
    // Copy-on-write: nodes of older epochs and disk nodes on the writer's path are copied
    // into the running epoch, and the old ones retired.

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
            // SAFETY: live (above), and the kind was checked.
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

    /// The leaf `key` belongs in if it and every node above it are heap nodes of the
    /// running epoch (writable in place, nothing to copy), with the internal nodes passed
    /// and the child index taken in each in `path`; `None` (and `path` partly filled) at
    /// the first node that is not. Writer only.
    fn running_leaf<C: Ctx>(
        &self,
        ctx: &C,
        key: &[u8],
        path: &mut Vec<(NonNull<Header>, usize)>,
    ) -> Result<Option<NonNull<Header>>> {
        let running = self.running.load(Relaxed);
        let mut word = self.root.load(Relaxed);
        loop {
            let node = match NodeRef::decode(word) {
                // SAFETY: the root and the children of live nodes on the writer's path
                // are live.
                Some(NodeRef::Heap(p)) if unsafe { p.as_ref() }.epoch() == running => p,
                _ => return Ok(None),
            };
            // SAFETY: live (above); the kind is checked before the cast.
            if unsafe { node.as_ref() }.meta().is_leaf() {
                return Ok(Some(node));
            }
            // SAFETY: live, and the kind was checked.
            let parent = unsafe { as_internal(node) };
            let own = HeapInternal {
                node: parent,
                version: None,
            };
            let idx = no_restart(child_index(&own, ctx, key, true))?;
            path.push((node, idx));
            word = parent.child[idx].load(Relaxed);
        }
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

    /// Copies an immutable heap node of an older epoch into a new heap node of the running
    /// epoch (children shared, not copied).
    fn copy_heap(&self, p: NonNull<Header>, running: u64) -> NonNull<Header> {
        self.made_node();
        heap_copy(p, running, self.region)
    }
}

/// The longest stem an internal node may keep: all `MAX_INT_STEM_BYTES` when its pivot 0
/// is inline (that pivot's key-area run holds the stem's bytes past the header), only
/// the header's `INT_HEADER_STEM_BYTES` when it is EXTERNAL or the node has no pivot.
pub(super) fn stem_room(first_pivot_inline: bool) -> usize {
    if first_pivot_inline {
        MAX_INT_STEM_BYTES
    } else {
        INT_HEADER_STEM_BYTES
    }
}

/// Number of leading bytes `a` and `b` share.
pub(super) fn common_len(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The prefix an entry gets when its leaf's stem shrinks from `old_stem` to its first
/// `new_len` bytes: the stem bytes given up come first, then the old prefix. Needs no log
/// read, which is why inserts may shrink a stem freely and only splits grow one.
pub(super) fn prefix_after_shrink(old_stem: &[u8], new_len: usize, prefix: u64) -> u64 {
    let mut b = [0u8; 16];
    let given_up = &old_stem[new_len..];
    let n = given_up.len().min(8);
    b[..n].copy_from_slice(&given_up[..n]);
    b[n..n + 8].copy_from_slice(&prefix.to_be_bytes());
    let mut out = [0u8; 8];
    out.copy_from_slice(&b[..8]);
    u64::from_be_bytes(out)
}
