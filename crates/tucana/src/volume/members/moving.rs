//! Removing a member from the open volume (DESIGN.md, "Removing a member", *to an open
//! volume*): the member drains (placement and dispatch pass over it), each of its groups
//! is copied to a slot of another member while writes to it are written to both, the
//! table marks it removed, and then the groups' map entries switch to their new slots.
//! And rebalancing the open volume (DESIGN.md, "Rebalancing onto a member"): the same
//! move, one group at a time from a member that stays live, the copy's header written
//! and synced before the switch, the old slot's header zeroed after it.
//!
//! Owns: the groups being moved (`Moves`: their targets and the lock that orders a piece
//! of the copy with the writes that reach it), writing a piece again where its group
//! goes, and the online removal's and rebalance's steps (and, with the feature
//! `test-hooks` only, one test seam in the rebalance's move: `on_rebalance_copied`).
//! Does not own: the offline removal's refusals, slot choice, copy and table write
//! (`remove.rs`, reused here), the rebalance's plan and header (`rebalance.rs`), nor the
//! write path's first write (`members.rs`).
//!
//! Why no write is lost on the new slot. A writer writes its piece where the map entry
//! it loaded says, then loads the entry again (sequentially consistent, as the removal's
//! store of `MOVING_BIT`); if it changed, or says the group is moving, it writes the
//! piece again, under `Moves::lock`, where the group goes. The copy reads and writes each
//! piece under that lock, after the bit was stored. So for each piece a writer wrote to
//! the old slot, either the copy read it afterwards (the write came before the bit's
//! store, which came before the read), or the writer saw the bit (or the switched entry)
//! and wrote the piece again, under the lock, after or instead of the copy's piece. Two
//! writers never write one range at once (the engine writes disjoint extents).
//!
//! Thread-safety: one removal or rebalance at a time (`Moves::removal`); placement steps
//! under the
//! set's `grow_lock`, the copy outside it (growth on other members goes on); writes to a
//! moving group take `Moves::lock` for their second write only.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::rebalance::{zero_header, Rebalanced};
use super::remove::{copy_slot_piecewise, RemovedMember, ONLINE_PIECE_BYTES};
use super::{Member, MemberSet, MOVING_BIT, SLOT_BITS};
use crate::error::{Error, Result};
use crate::volume::dispatch::Kind;
use crate::volume::slot_header::{SlotHeader, HEADER_OFFSET, SLOT_BYTES};

/// Groups being moved by a removal on the open volume.
#[derive(Default)]
pub(super) struct Moves {
    /// group → (target member, target slot), for every map entry with `MOVING_BIT`.
    targets: Mutex<HashMap<u64, (usize, u64)>>,
    /// Held by the copy for each piece (read, then write) and by a writer's second
    /// write: orders the two on the target slot.
    lock: Mutex<()>,
    /// Held for the whole of a removal or a rebalance on the open volume: one at a time.
    removal: Mutex<()>,
    /// Bytes writers wrote a second time during the running removal.
    rewritten_bytes: AtomicU64,
    /// The test seam `MemberSet::on_rebalance_copied` sets (feature `test-hooks`).
    #[cfg(feature = "test-hooks")]
    copied_hook: Mutex<Option<CopiedHook>>,
}

/// Called with a group's number on the rebalancing thread (feature `test-hooks`).
#[cfg(feature = "test-hooks")]
type CopiedHook = std::sync::Arc<dyn Fn(u64) + Send + Sync>;

/// Why a second removal or rebalance on the open volume is refused.
const ALREADY_RUNNING: &str = "a removal or a rebalance is already running";

/// One group a removal moves: where it is and where it goes.
#[derive(Clone, Copy)]
struct Planned {
    group: u64,
    from_slot: u64,
    target: usize,
    slot: u64,
    fresh: bool,
}

/// Writes `bytes` at `at` of `member`, counted and marked dirty as every write is.
pub(super) fn write_member(member: &Member, at: u64, bytes: &[u8], uncached: bool) -> Result<()> {
    let n = bytes.len() as u64;
    member.timed(Kind::Write, n, || {
        if uncached {
            member.storage.write_uncached_at(at, bytes)
        } else {
            member.storage.write_at(at, bytes)
        }
    })?;
    member.written_bytes.fetch_add(n, Ordering::Relaxed);
    // After the write: a sync that clears the flag before this point still covers the
    // write only if it started later (see `Member::sync`).
    member.dirty.store(true, Ordering::Release);
    Ok(())
}

impl MemberSet {
    /// A writer's second write of a piece of `group` (at `within` it): where the group
    /// goes while it moves, or where it is now if its entry changed since the first.
    pub(super) fn write_again(
        &self,
        group: u64,
        within: u64,
        bytes: &[u8],
        uncached: bool,
    ) -> Result<()> {
        let _ordered = self.moves.lock.lock();
        let packed = self.packed(group);
        let (m, slot) = if packed & MOVING_BIT != 0 {
            *self
                .moves
                .targets
                .lock()
                .get(&group)
                .expect("a moving group has a target")
        } else {
            super::unpack(packed)
        };
        write_member(
            &self.members[m],
            slot * SLOT_BYTES + within,
            bytes,
            uncached,
        )?;
        self.moves
            .rewritten_bytes
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Removes member `r` from this open volume. `table_unsure` is called when the
    /// table's write or sync failed (the engine then poisons itself). Errors: member 0,
    /// a member already removed or being removed, a removal that would leave one member
    /// (`Error::Members`, nothing written); no room for a group (the removal is undone:
    /// nothing durable names it); I/O errors (the same, or, from the table, unknown).
    pub fn remove_member_online(&self, r: usize, table_unsure: &dyn Fn()) -> Result<RemovedMember> {
        let _one = self
            .moves
            .removal
            .try_lock()
            .ok_or_else(|| Error::Members(ALREADY_RUNNING.into()))?;
        self.moves.rewritten_bytes.store(0, Ordering::Relaxed);
        let plan = self.plan_moves(r)?;
        let copied = self.copy_planned(r, &plan);
        self.finish_moves(r, &plan, copied, table_unsure)
    }

    /// After the copy: undone if it failed; else the table, then the switch.
    fn finish_moves(
        &self,
        r: usize,
        plan: &[Planned],
        copied: Result<u64>,
        table_unsure: &dyn Fn(),
    ) -> Result<RemovedMember> {
        let mut placement = self.grow_lock.lock();
        let bytes_moved = match copied {
            Ok(bytes) => bytes,
            Err(e) => {
                self.undo_moves(&mut placement, Some(r), plan);
                return Err(e);
            }
        };
        let generation = self
            .write_table_without(r)
            .inspect_err(|_| table_unsure())?;
        // The table is durable: the groups are where their copies are. Writers that
        // loaded the old entry write again there (their second load sees the change).
        let _ordered = self.moves.lock.lock();
        let mut targets = self.moves.targets.lock();
        for p in plan {
            let entry = self.entry(p.group).expect("a placed group has an entry");
            entry.store(
                ((p.target as u64 + 1) << SLOT_BITS) | p.slot,
                Ordering::SeqCst,
            );
            targets.remove(&p.group);
            placement.groups[r] -= 1;
        }
        Ok(RemovedMember {
            index: r,
            groups_moved: plan.len() as u64,
            bytes_moved,
            generation,
            rewritten_bytes: self.moves.rewritten_bytes.load(Ordering::Relaxed),
        })
    }

    /// Under `grow_lock`: the refusals, the member drained, leftovers of an unfinished
    /// removal cleared, and each of its groups given a target slot and marked moving.
    fn plan_moves(&self, r: usize) -> Result<Vec<Planned>> {
        let mut placement = self.grow_lock.lock();
        let live = self.members.iter().filter(|m| !m.takes_nothing()).count();
        match self.members.get(r) {
            _ if r == 0 => {
                return Err(Error::Members(format!(
                    "{} is member 0, which holds the superblock and the member table: it cannot be removed",
                    self.members[0].name
                )))
            }
            None => return Err(Error::Members(format!("there is no member {r}"))),
            Some(m) if m.takes_nothing() => {
                return Err(Error::Members(format!(
                    "member {r} ({}) is removed or being removed",
                    m.name
                )))
            }
            Some(m) if live <= 2 => {
                return Err(Error::Members(format!(
                    "removing {} would leave member 0 alone: a volume over several members keeps two at least",
                    m.name
                )))
            }
            Some(_) => {}
        }
        self.clear_unfinished_moves(&placement, Some(r))?;
        self.members[r].draining.store(true, Ordering::SeqCst);
        let mut plan = Vec::new();
        for group in 0..placement.placed_groups {
            let Some((_, from_slot)) = self.lookup(group).filter(|&(m, _)| m == r) else {
                continue;
            };
            let (target, slot, fresh) = match self.slot_for_move(&mut placement, r, group) {
                Ok(place) => place,
                Err(e) => {
                    self.undo_moves(&mut placement, Some(r), &plan);
                    return Err(e);
                }
            };
            placement.groups[target] += 1;
            self.moves.targets.lock().insert(group, (target, slot));
            let entry = self.entry(group).expect("a placed group has an entry");
            entry.fetch_or(MOVING_BIT, Ordering::SeqCst);
            plan.push(Planned {
                group,
                from_slot,
                target,
                slot,
                fresh,
            });
        }
        Ok(plan)
    }

    /// Copies every planned group (each piece under `Moves::lock`), writes its pending
    /// header, and syncs the targets. Returns the bytes written.
    fn copy_planned(&self, r: usize, plan: &[Planned]) -> Result<u64> {
        // Every `MOVING_BIT` stored before any piece is read (the writers' side is the
        // fence in `write_pieces`); on x86 the `fetch_or` already is one.
        std::sync::atomic::fence(Ordering::SeqCst);
        let mut bytes = 0;
        for p in plan {
            let target = &self.members[p.target];
            bytes += copy_slot_piecewise(
                &self.members[r],
                p.from_slot,
                target,
                p.slot,
                p.fresh,
                ONLINE_PIECE_BYTES,
                &|| self.moves.lock.lock(),
            )?;
            let header = SlotHeader {
                member_index: p.target as u32,
                volume_uuid: self.volume_uuid,
                member_uuid: target.uuid,
                group: p.group,
                table: Vec::new(),
                generation: 0,
                moved_from: Some(r as u32),
                rebalanced_from: None,
                rebalanced_moves: 0,
            };
            write_member(
                target,
                p.slot * SLOT_BYTES + HEADER_OFFSET,
                &header.encode(),
                false,
            )?;
        }
        let mut targets: Vec<usize> = plan.iter().map(|p| p.target).collect();
        targets.sort_unstable();
        targets.dedup();
        for t in targets {
            self.members[t].sync()?;
        }
        Ok(bytes)
    }

    /// Puts back what `plan_moves` changed: the entries' bit, the targets' slots (free
    /// again: their pending headers count for nothing) and the member's drain.
    fn undo_moves(&self, placement: &mut super::Placement, r: Option<usize>, plan: &[Planned]) {
        let _ordered = self.moves.lock.lock();
        let mut targets = self.moves.targets.lock();
        for p in plan.iter().rev() {
            let entry = self.entry(p.group).expect("a placed group has an entry");
            entry.fetch_and(!MOVING_BIT, Ordering::SeqCst);
            targets.remove(&p.group);
            placement.groups[p.target] -= 1;
            placement.free_slots[p.target].push(p.slot);
        }
        if let Some(r) = r {
            self.members[r].draining.store(false, Ordering::SeqCst);
        }
    }
}

impl MemberSet {
    /// Rebalances this open volume (DESIGN.md, "Rebalancing onto a member"): one group at
    /// a time, while writers run, from the live member with the most groups to the one
    /// with the fewest, until they differ by one at most. `unsure` is called when a moved
    /// group's header may be durable while its move cannot go on (its write or sync
    /// failed): the engine then poisons itself, as the next open may take the copy.
    /// Errors: a removal or rebalance already running (nothing written); I/O errors.
    pub fn rebalance_online(&self, unsure: &dyn Fn()) -> Result<Rebalanced> {
        let _one = self
            .moves
            .removal
            .try_lock()
            .ok_or_else(|| Error::Members(ALREADY_RUNNING.into()))?;
        self.moves.rewritten_bytes.store(0, Ordering::Relaxed);
        self.clear_unfinished_moves(&self.grow_lock.lock(), None)?;
        let (mut groups_moved, mut bytes_moved) = (0, 0);
        // Each move takes a group off the fullest member: at most every group once.
        let most = self.grow_lock.lock().placed_groups;
        for _ in 0..most {
            let Some((from, p)) = self.plan_one_move()? else {
                break;
            };
            bytes_moved += self.move_one(from, &p, unsure)?;
            groups_moved += 1;
        }
        Ok(Rebalanced {
            groups_moved,
            bytes_moved,
            groups: self.grow_lock.lock().groups.clone(),
            rewritten_bytes: self.moves.rewritten_bytes.load(Ordering::Relaxed),
        })
    }

    /// Under `grow_lock`: the next move, its target slot taken and the group marked
    /// moving; `None` when the members are within one group.
    fn plan_one_move(&self) -> Result<Option<(usize, Planned)>> {
        let mut placement = self.grow_lock.lock();
        let Some((group, from, from_slot, target)) = self.next_move(&placement) else {
            return Ok(None);
        };
        let (slot, fresh) = self.take_slot(&mut placement, target)?;
        placement.groups[target] += 1;
        self.moves.targets.lock().insert(group, (target, slot));
        let entry = self.entry(group).expect("a placed group has an entry");
        entry.fetch_or(MOVING_BIT, Ordering::SeqCst);
        let planned = Planned {
            group,
            from_slot,
            target,
            slot,
            fresh,
        };
        Ok(Some((from, planned)))
    }

    /// One group's move: the copy (writes to it go to both slots meanwhile), synced; its
    /// header, synced; the switch; the old header zeroed, synced. Returns the bytes
    /// copied. A failure before the header's write undoes the move.
    fn move_one(&self, from: usize, p: &Planned, unsure: &dyn Fn()) -> Result<u64> {
        let (bytes, header) = match self.copy_one(from, p) {
            Ok(copied) => copied,
            Err(e) => {
                // Nothing names the copy (its header block is still zero): undone.
                self.undo_moves(&mut self.grow_lock.lock(), None, std::slice::from_ref(p));
                return Err(e);
            }
        };
        #[cfg(feature = "test-hooks")]
        self.copied(p.group);
        self.finish_one(from, p, &header, unsure)?;
        Ok(bytes)
    }

    /// A test seam (feature `test-hooks`; it does not exist without it): `hook` is called
    /// on the rebalancing thread of `rebalance_online` with a group's number once the
    /// group's copy is written and synced, while its map entry is still marked moving
    /// (before its header: writes meanwhile go to both slots), holding no lock of the
    /// set's. A power-loss test blocks in it until its writer has written into the group
    /// and synced, so writes between the mark and the switch happen in every run, not
    /// when the scheduler allows. Replaces an earlier hook.
    #[cfg(feature = "test-hooks")]
    pub fn on_rebalance_copied(&self, hook: impl Fn(u64) + Send + Sync + 'static) {
        *self.moves.copied_hook.lock() = Some(std::sync::Arc::new(hook));
    }

    /// Calls the hook `on_rebalance_copied` set, if any (outside the hook's own lock).
    #[cfg(feature = "test-hooks")]
    fn copied(&self, group: u64) {
        let hook = self.moves.copied_hook.lock().clone();
        if let Some(hook) = hook {
            hook(group);
        }
    }

    /// The copy of a moving group's slot, each piece under `Moves::lock`, and a sync of
    /// the target; returns the bytes written and the header the copy will carry.
    fn copy_one(&self, from: usize, p: &Planned) -> Result<(u64, SlotHeader)> {
        // The group's `MOVING_BIT` stored before any piece is read (see `copy_planned`).
        std::sync::atomic::fence(Ordering::SeqCst);
        let target = &self.members[p.target];
        let bytes = copy_slot_piecewise(
            &self.members[from],
            p.from_slot,
            target,
            p.slot,
            p.fresh,
            ONLINE_PIECE_BYTES,
            &|| self.moves.lock.lock(),
        )?;
        target.sync()?;
        let header = self.rebalanced_header(p.group, from, p.from_slot, p.target)?;
        Ok((bytes, header))
    }

    /// After the copy: its header, synced (from its write on, the next open may take
    /// the copy, so a failure calls `unsure`); the switch; the old slot's header zeroed
    /// and synced. The old slot is not reused until the next open: a reader may still
    /// hold a mapped view of it.
    fn finish_one(
        &self,
        from: usize,
        p: &Planned,
        header: &SlotHeader,
        unsure: &dyn Fn(),
    ) -> Result<()> {
        let target = &self.members[p.target];
        write_member(
            target,
            p.slot * SLOT_BYTES + HEADER_OFFSET,
            &header.encode(),
            false,
        )
        .and_then(|()| target.sync())
        .inspect_err(|_| unsure())?;
        {
            let mut placement = self.grow_lock.lock();
            let _ordered = self.moves.lock.lock();
            let entry = self.entry(p.group).expect("a placed group has an entry");
            entry.store(
                ((p.target as u64 + 1) << SLOT_BITS) | p.slot,
                Ordering::SeqCst,
            );
            self.moves.targets.lock().remove(&p.group);
            placement.groups[from] -= 1;
        }
        let source = &self.members[from];
        zero_header(source, p.from_slot)?;
        source.sync()
    }
}

#[cfg(test)]
mod tests;
