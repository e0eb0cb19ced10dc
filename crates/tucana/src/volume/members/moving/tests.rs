//! Unit tests of removing a member from the open volume over memory backends: writes to a
//! moving group reach its new slot, whenever they land against the copy; the member
//! drains; a failed copy is undone; the refusals.

use std::sync::Arc;

use super::*;
use crate::volume::members::tests::{mems, named};
use crate::volume::{MemStorage, Storage};

/// A volume over three members with six groups (member 1 holds groups 1 and 4), past
/// its first commit, open.
fn open_volume() -> (Vec<Arc<MemStorage>>, MemberSet) {
    let mems = mems(3);
    let set = MemberSet::open(named(&mems), true).unwrap();
    set.grow(6 * SLOT_BYTES).unwrap();
    mems[0].write_at(0, b"a superblock").unwrap();
    for g in 0..6 {
        set.write_at(g * SLOT_BYTES + (1 << 20), &bytes(g, 0))
            .unwrap();
    }
    (mems, set)
}

fn bytes(group: u64, round: u64) -> Vec<u8> {
    format!("group {group} round {round} ")
        .repeat(50)
        .into_bytes()
}

fn read(set: &MemberSet, group: u64, at: u64, len: usize) -> Vec<u8> {
    let mut back = vec![0u8; len];
    set.read_at(group * SLOT_BYTES + at, &mut back).unwrap();
    back
}

fn unsure() -> impl Fn() {
    || panic!("the table's write did not fail")
}

#[test]
fn writes_before_during_and_after_the_copy_all_reach_the_new_slots() {
    let (mems, set) = open_volume();
    let plan = set.plan_moves(1).unwrap();
    assert_eq!(plan.len(), 2);
    // Drained: nothing is dispatched or placed on member 1 from here on.
    for _ in 0..6 {
        assert_ne!(set.dispatch_member(None, &[]), Some(1));
    }
    assert_eq!(set.member_stats()[1].state, "draining");
    // Before the copy (the copy reads it from the old slot) ...
    set.write_at(SLOT_BYTES + (1 << 20), &bytes(1, 1)).unwrap();
    let copied = set.copy_planned(1, &plan);
    // ... and after it, before the switch: written to both slots.
    set.write_uncached_at(4 * SLOT_BYTES + (2 << 20), &[7u8; 4096])
        .unwrap();
    let removed = set.finish_moves(1, &plan, copied, &unsure()).unwrap();
    assert_eq!((removed.index, removed.groups_moved), (1, 2));
    // And after the switch: only to the new slot.
    set.write_at(4 * SLOT_BYTES + (3 << 20), &bytes(4, 2))
        .unwrap();
    for g in [1, 4] {
        assert_ne!(set.lookup(g).unwrap().0, 1);
    }
    assert_eq!(set.member_stats()[1].state, "removed");
    set.verify().unwrap();
    drop(set);
    let left: Vec<_> = named(&mems)
        .into_iter()
        .enumerate()
        .filter(|(i, _)| *i != 1)
        .map(|(_, m)| m)
        .collect();
    let set = MemberSet::open(left, false).unwrap();
    set.verify().unwrap();
    assert_eq!(read(&set, 1, 1 << 20, bytes(1, 1).len()), bytes(1, 1));
    assert_eq!(read(&set, 4, 2 << 20, 4096), vec![7u8; 4096]);
    assert_eq!(read(&set, 4, 3 << 20, bytes(4, 2).len()), bytes(4, 2));
    for g in [0, 2, 3, 5] {
        assert_eq!(read(&set, g, 1 << 20, bytes(g, 0).len()), bytes(g, 0));
    }
}

#[test]
fn a_failed_copy_is_undone_and_the_member_takes_segments_again() {
    let (mems, set) = open_volume();
    let plan = set.plan_moves(1).unwrap();
    let err = Error::Members("injected copy failure".into());
    assert!(set.finish_moves(1, &plan, Err(err), &unsure()).is_err());
    assert_eq!(set.member_stats()[1].state, "live");
    assert_eq!(set.lookup(1).unwrap().0, 1);
    assert!((0..6).any(|_| set.dispatch_member(None, &[]) == Some(1)));
    set.write_at(SLOT_BYTES + (1 << 20), &bytes(1, 3)).unwrap();
    set.verify().unwrap();
    drop(set);
    // The old volume, with the write, and the removal runs again.
    let set = MemberSet::open(named(&mems), false).unwrap();
    assert_eq!(read(&set, 1, 1 << 20, bytes(1, 3).len()), bytes(1, 3));
    set.remove_member_online(1, &unsure()).unwrap();
    set.verify().unwrap();
}

#[test]
fn online_refusals_write_nothing() {
    let (mems, set) = open_volume();
    let image: Vec<u64> = mems.iter().map(|m| m.io_bytes().0).collect();
    for (name, needle) in [
        ("mem0", "is member 0"),
        ("elsewhere", "is not a member of the open volume"),
    ] {
        let err = set
            .remove_member(name, &unsure())
            .expect_err(name)
            .to_string();
        assert!(err.contains(needle), "{needle}: {err}");
    }
    set.remove_member("mem1", &unsure()).unwrap();
    let written: Vec<u64> = mems.iter().map(|m| m.io_bytes().0).collect();
    assert_ne!(written, image);
    let err = set
        .remove_member("mem1", &unsure())
        .expect_err("removed")
        .to_string();
    assert!(err.contains("is removed or being removed"), "{err}");
    let err = set
        .remove_member("mem2", &unsure())
        .expect_err("last")
        .to_string();
    assert!(err.contains("would leave member 0 alone"), "{err}");
    assert_eq!(
        mems.iter().map(|m| m.io_bytes().0).collect::<Vec<_>>(),
        written
    );
}

/// Ten groups over two members (five each), then a third member added with group 10:
/// 5/5/1; the rebalance's first move takes group 2 (member 0, slot 1) to member 2.
fn unbalanced() -> (Vec<Arc<MemStorage>>, MemberSet) {
    let all = mems(3);
    let set = MemberSet::open(named(&all[..2]), true).unwrap();
    set.grow(10 * SLOT_BYTES).unwrap();
    all[0].write_at(0, b"a superblock").unwrap();
    for g in 0..10 {
        set.write_at(g * SLOT_BYTES + (1 << 20), &bytes(g, 0))
            .unwrap();
    }
    set.sync().unwrap();
    drop(set);
    let named = named(&all);
    MemberSet::add_member(named[..2].to_vec(), named[2].clone(), true).unwrap();
    let set = MemberSet::open(named, false).unwrap();
    (all, set)
}

#[test]
fn a_rebalance_moves_a_group_whose_writes_before_during_and_after_its_copy_all_land() {
    // The online move of one group: a write before the copy (the copy reads it too), one
    // between the copy and the switch (written to both slots), one after the switch
    // (to the new slot only); then the rest of the rebalance, and a reopen reads all.
    let (all, set) = unbalanced();
    let (from, p) = set.plan_one_move().unwrap().unwrap();
    assert_eq!((from, p.group, p.from_slot, p.target), (0, 2, 1, 2));
    set.write_at(2 * SLOT_BYTES + (2 << 20), &bytes(2, 1))
        .unwrap();
    let (copied, header) = set.copy_one(from, &p).unwrap();
    assert!(copied > 0);
    set.write_uncached_at(2 * SLOT_BYTES + (3 << 20), &[9u8; 4096])
        .unwrap();
    // Both writes came after the group was marked moving: each written twice.
    let twice = bytes(2, 1).len() as u64 + 4096;
    assert_eq!(set.moves.rewritten_bytes.load(Ordering::Relaxed), twice);
    set.finish_one(from, &p, &header, &|| panic!("no failure"))
        .unwrap();
    assert_eq!(set.lookup(2), Some((2, p.slot)));
    set.write_at(2 * SLOT_BYTES + (4 << 20), &bytes(2, 2))
        .unwrap();
    // The old slot is not free on the open volume (a mapped view may still read it).
    assert!(!set.grow_lock.lock().free_slots[0].contains(&1));
    let rest = set.rebalance_online(&|| panic!("no failure")).unwrap();
    assert_eq!((rest.groups_moved, rest.groups.clone()), (1, vec![4, 4, 3]));
    set.verify().unwrap();
    drop(set);
    let set = MemberSet::open(named(&all), false).unwrap();
    set.verify().unwrap();
    assert_eq!(set.lookup(2), Some((2, p.slot)));
    assert_eq!(read(&set, 2, 2 << 20, bytes(2, 1).len()), bytes(2, 1));
    assert_eq!(read(&set, 2, 3 << 20, 4096), vec![9u8; 4096]);
    assert_eq!(read(&set, 2, 4 << 20, bytes(2, 2).len()), bytes(2, 2));
    for g in 0..10 {
        assert_eq!(read(&set, g, 1 << 20, bytes(g, 0).len()), bytes(g, 0));
    }
    // Reopened, the old slots are free again, their headers zero.
    assert_eq!(set.grow_lock.lock().free_slots[0], vec![1]);
}

#[test]
fn a_failed_copy_of_a_rebalance_is_undone_and_a_second_runs_refused() {
    let (_all, set) = unbalanced();
    let (from, p) = set.plan_one_move().unwrap().unwrap();
    // While one move holds the lock, a removal or another rebalance is refused.
    {
        let _one = set.moves.removal.lock();
        let refused = set.rebalance_online(&|| ()).err().unwrap().to_string();
        assert!(refused.contains("already running"), "{refused}");
    }
    set.undo_moves(&mut set.grow_lock.lock(), None, std::slice::from_ref(&p));
    assert_eq!(set.lookup(2), Some((from, p.from_slot)));
    assert_eq!(set.packed(2) & MOVING_BIT, 0);
    assert_eq!(set.member_stats()[2].groups, 1);
    assert!(set.grow_lock.lock().free_slots[2].contains(&p.slot));
    let done = set.rebalance_online(&|| panic!("no failure")).unwrap();
    assert_eq!(done.groups, vec![4, 4, 3]);
}
