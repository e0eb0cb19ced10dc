//! A finger: where the writer's previous insert or remove of a batch landed, so that the
//! next key of the batch that falls in the same leaf is applied there without a descent
//! from the root (a list's run of pushes or pops, sorted keys of one collection).
//!
//! Owns: the finger's state (the leaf, the internal nodes above it with the child index
//! taken in each, the tree's count of shape changes when it was taken), the test of
//! whether a key's range is that leaf, and the writer's inserts and removes through it,
//! one key at a time or a batch's run of them (whose neighbouring keys the leaf takes in
//! or gives up in one shift, `write`'s `leaf_insert_run`/`leaf_remove_run`).
//! Does not own: descents from the root, splits, pruning (`write`, `split`), searches
//! inside a node (`search`).
//!
//! Thread safety: a finger belongs to one writer for one batch, under the writer lock of
//! its region; every method here is the writer's (`Tree::writer` catches overlaps). Its
//! `unsafe` is of one kind: turning a node pointer the finger kept into a reference.
//! Such a node was on the writer's path, of the running epoch, when the finger was taken,
//! and the tree's count of shape changes has not moved since: no split, pruned leaf or
//! seal happened, so the node is still reachable from the root and writable in place
//! (only a change of shape or a seal detaches or freezes a node of the running epoch;
//! copy-on-write replaces nodes of older epochs only, which no finger names).

use std::ptr::NonNull;
use std::sync::atomic::Ordering::*;

use super::Tree;
use crate::error::Result;
use crate::index::node::heap::{as_internal, as_leaf};
use crate::index::node::view::{no_restart, HeapInternal};
use crate::index::node::Header;
use crate::index::search::{child_holds, child_index};
use crate::index::Ctx;

/// Where the previous write of a batch landed. Start each batch with `Finger::default()`
/// and pass it to [`Tree::insert_near`] and [`Tree::remove_near`] for each of its keys.
#[derive(Debug, Default)]
pub struct Finger {
    /// The leaf reached last; `None` until a write reached one (or after one emptied it).
    leaf: Option<NonNull<Header>>,
    /// The internal nodes from the root down to the leaf and the child index taken in each.
    pub(super) path: Vec<(NonNull<Header>, usize)>,
    /// `Tree::shape_changes` when the leaf was reached.
    shape: u64,
    /// Writes applied through the finger, and writes that descended from the root.
    hits: u64,
    descents: u64,
}

impl Finger {
    /// Forgets the leaf (the path is refilled by the next descent).
    pub(super) fn clear(&mut self) {
        self.leaf = None;
        self.path.clear();
    }

    /// Records `leaf`, reached through `self.path`, as the tree's shape stands now.
    pub(super) fn reached(&mut self, tree: &Tree, leaf: NonNull<Header>) {
        self.leaf = Some(leaf);
        self.shape = tree.shape_changes.load(Relaxed);
    }

    /// Writes applied in the leaf the previous one reached (no descent).
    pub fn hits(&self) -> u64 {
        self.hits
    }

    /// Writes that descended from the root.
    pub fn descents(&self) -> u64 {
        self.descents
    }
}

impl Tree {
    /// `insert` for one key of a batch: in the finger's leaf when `key`'s range is that
    /// leaf and it has room, else by a descent from the root that moves the finger.
    pub fn insert_near<C: Ctx>(
        &self,
        ctx: &C,
        finger: &mut Finger,
        key: &[u8],
        ptr: u64,
    ) -> Result<Option<u64>> {
        let mut old = [None];
        self.insert_run_near(ctx, finger, &[key], &[ptr], &mut old)?;
        Ok(old[0])
    }

    /// `insert_near` of each of `keys` (to `ptrs`), a batch's consecutive puts in
    /// ascending key order; `olds[i]` gets the pointer `keys[i]` replaced. New keys that
    /// fall into one gap of the finger's leaf go in together, in one shift
    /// (`Tree::leaf_insert_run`): a list's run of 16 pushes at its head shifts its leaf
    /// twice, not 16 times.
    pub fn insert_run_near<C: Ctx>(
        &self,
        ctx: &C,
        finger: &mut Finger,
        keys: &[&[u8]],
        ptrs: &[u64],
        olds: &mut [Option<u64>],
    ) -> Result<()> {
        assert!(
            keys.len() == ptrs.len() && keys.len() == olds.len(),
            "one pointer and one answer per key"
        );
        let _w = self.writer();
        let mut i = 0;
        while i < keys.len() {
            assert!(ptrs[i] != 0, "log pointer 0 names no record");
            if let Some(node) = self.finger_leaf(ctx, finger, keys[i])? {
                // SAFETY: a finger's leaf is live and writable (module doc).
                let leaf = unsafe { as_leaf(node) };
                if !leaf.hdr.meta().is_full() {
                    let seen: &Finger = finger;
                    let mut in_leaf = |k: &[u8]| Ok(self.finger_leaf(ctx, seen, k)?.is_some());
                    let taken = self.leaf_insert_run(
                        ctx,
                        leaf,
                        &keys[i..],
                        &ptrs[i..],
                        &mut olds[i..],
                        &mut in_leaf,
                    )?;
                    finger.hits += taken as u64;
                    i += taken;
                    continue;
                }
            }
            finger.descents += 1;
            olds[i] = self.insert_from_root(ctx, keys[i], ptrs[i], Some(finger))?;
            i += 1;
        }
        Ok(())
    }

    /// `remove` for one key of a batch: in the finger's leaf when `key`'s range is that
    /// leaf (absent if the leaf does not hold it), else by a descent from the root that
    /// moves the finger. A leaf the remove empties leaves the tree and the finger.
    pub fn remove_near<C: Ctx>(
        &self,
        ctx: &C,
        finger: &mut Finger,
        key: &[u8],
    ) -> Result<Option<u64>> {
        let mut old = [None];
        self.remove_run_near(ctx, finger, &[key], &mut old)?;
        Ok(old[0])
    }

    /// `remove_near` of each of `keys`, a batch's consecutive removes in ascending key
    /// order; `olds[i]` gets the pointer `keys[i]` mapped to. Keys that are neighbouring
    /// entries of the finger's leaf leave it in one shift (`Tree::leaf_remove_run`): a
    /// list's run of 16 pops shifts its leaf twice (after the descent of the first, once
    /// for the other 15), not 16 times.
    pub fn remove_run_near<C: Ctx>(
        &self,
        ctx: &C,
        finger: &mut Finger,
        keys: &[&[u8]],
        olds: &mut [Option<u64>],
    ) -> Result<()> {
        assert_eq!(keys.len(), olds.len(), "one answer per key");
        let _w = self.writer();
        let mut i = 0;
        while i < keys.len() {
            if let Some(node) = self.finger_leaf(ctx, finger, keys[i])? {
                let taken =
                    self.leaf_remove_run(ctx, &finger.path, node, &keys[i..], &mut olds[i..])?;
                finger.hits += taken as u64;
                if finger.shape != self.shape_changes.load(Relaxed) {
                    finger.clear();
                }
                i += taken;
                continue;
            }
            finger.descents += 1;
            // Not the finger's own path: a remove of an absent key leaves the finger as
            // it was.
            let mut path = Vec::new();
            olds[i] = self.remove_from_root(ctx, keys[i], &mut path, Some(finger))?;
            i += 1;
        }
        Ok(())
    }

    /// The finger's leaf if `key`'s range is that leaf: the finger is not stale, and at
    /// every internal node from the leaf's parent up, `key` takes the child the finger
    /// took (tested against the two pivots around that child, not by a search),
    /// until both of the leaf's fences are found (a child index above 0 has its
    /// lower fence in that node, one below the node's pivot count its upper fence) or the
    /// root is passed. Usually only the parent is asked. No log record is read unless
    /// a pivot compare needs one, as in a descent.
    fn finger_leaf<C: Ctx>(
        &self,
        ctx: &C,
        finger: &Finger,
        key: &[u8],
    ) -> Result<Option<NonNull<Header>>> {
        let Some(leaf) = finger.leaf else {
            return Ok(None);
        };
        if finger.shape != self.shape_changes.load(Relaxed) {
            return Ok(None);
        }
        let (mut lower, mut upper) = (false, false);
        for &(node, idx) in finger.path.iter().rev() {
            // SAFETY: a finger's internal nodes are live and writable (module doc).
            let parent = unsafe { as_internal(node) };
            let own = HeapInternal {
                node: parent,
                version: None,
            };
            let holds = no_restart(child_holds(&own, ctx, key, idx))?;
            debug_assert_eq!(
                holds,
                no_restart(child_index(&own, ctx, key, true))? == idx,
                "the fence test and the search disagree"
            );
            if !holds {
                return Ok(None);
            }
            lower |= idx > 0;
            upper |= idx < parent.hdr.meta().count as usize;
            if lower && upper {
                break;
            }
        }
        Ok(Some(leaf))
    }
}
