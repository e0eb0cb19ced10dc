//! Unit tests of removing a member over memory backends: the groups' bytes on their new
//! slots, the table's removed entry, open's refusals after it, a removal that did not
//! finish, and that nothing places or dispatches on a removed member. (Power loss at every
//! I/O of the removal is `tucana-torture`'s `tests/remove_member.rs`.)

use std::sync::Arc;

use super::*;
use crate::volume::dispatch::DispatchPolicy;
use crate::volume::members::tests::{mems, named};
use crate::volume::{MemStorage, Storage};

/// A created volume over `n` members grown to `groups` groups, past its first commit,
/// with each group's bytes at 1 MiB into it saying which group it is.
fn volume(n: usize, groups: u64) -> Vec<Arc<MemStorage>> {
    let mems = mems(n);
    let set = MemberSet::open(named(&mems), true).unwrap();
    set.grow(groups * SLOT_BYTES).unwrap();
    for g in 0..groups {
        set.write_at(g * SLOT_BYTES + (1 << 20), &marker(g))
            .unwrap();
    }
    drop(set);
    mems[0].write_at(0, b"a superblock").unwrap();
    mems
}

fn marker(group: u64) -> Vec<u8> {
    format!("group {group} ").repeat(100).into_bytes()
}

fn assert_markers(set: &MemberSet, groups: u64) {
    for g in 0..groups {
        let mut back = marker(g);
        back.fill(0);
        set.read_at(g * SLOT_BYTES + (1 << 20), &mut back).unwrap();
        assert_eq!(back, marker(g), "group {g}");
    }
}

fn pick(all: &[Arc<MemStorage>], which: &[usize]) -> Vec<(String, Arc<dyn Storage>)> {
    let named = named(all);
    which.iter().map(|&i| named[i].clone()).collect()
}

fn err<T>(result: Result<T>) -> String {
    match result {
        Ok(_) => panic!("not refused"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_removed_members_groups_are_read_back_from_the_others_and_its_entry_stays() {
    // Six groups round-robin over three members: member 1 holds groups 1 and 4.
    let all = volume(3, 6);
    let removed = MemberSet::remove_member(named(&all), 1).unwrap();
    assert_eq!(
        (removed.index, removed.groups_moved, removed.generation),
        (1, 2, 1)
    );
    // Only the written pieces of each fresh slot: the marker's 64 KiB.
    assert_eq!(removed.bytes_moved, 2 * (HOLE_BYTES as u64));
    let set = MemberSet::open(pick(&all, &[0, 2]), false).unwrap();
    assert_markers(&set, 6);
    set.verify().unwrap();
    for g in [1, 4] {
        let (m, _) = set.lookup(g).unwrap();
        assert!(m == 0 || m == 2, "group {g} on member {m}");
    }
    let stats = set.member_stats();
    assert_eq!(stats[1].kind, "removed");
    assert_eq!(stats.iter().map(|m| m.groups).sum::<u64>(), 6);
    assert_eq!(stats[1].groups, 0);
    drop(set);
    // The removed member given back, at its place or another, is refused by name.
    let with_it = err(MemberSet::open(named(&all), false));
    assert!(
        with_it.contains("mem1 is not in the volume's member table: it was member 1"),
        "{with_it}"
    );
    let in_its_place = err(MemberSet::open(pick(&all, &[0, 1]), false));
    assert!(in_its_place.contains("was removed"), "{in_its_place}");
    let too_few = err(MemberSet::open(pick(&all, &[0]), false));
    assert!(too_few.contains("takes 2 to"), "{too_few}");
}

#[test]
fn nothing_is_placed_or_dispatched_on_a_removed_member() {
    let all = volume(3, 3);
    MemberSet::remove_member(named(&all), 1).unwrap();
    for policy in [
        DispatchPolicy::RoundRobin,
        DispatchPolicy::LeastWeightedQueue,
        DispatchPolicy::Member(1),
    ] {
        let set = MemberSet::open(pick(&all, &[0, 2]), false)
            .unwrap()
            .with_policy(policy);
        for _ in 0..12 {
            assert_ne!(set.dispatch_member(None, &[]), Some(1), "{policy:?}");
            assert_ne!(set.dispatch_member(Some(0), &[]), Some(1), "{policy:?}");
        }
        set.place_growth_on(Some(1));
        set.grow(9 * SLOT_BYTES).unwrap();
        for g in 0..9 {
            assert_ne!(set.lookup(g).unwrap().0, 1, "group {g}");
        }
        set.verify().unwrap();
    }
}

#[test]
fn a_removal_whose_table_was_not_written_leaves_the_old_volume_and_runs_again() {
    // The copies and their headers are durable, the table is not (member 0's table block
    // is put back as it was): the old set opens, the copies' slots are free, and a
    // second removal clears them before copying again, so no group is claimed twice.
    let all = volume(3, 6);
    let before = read_header(all[0].as_ref(), 0, "mem0").unwrap().unwrap();
    MemberSet::remove_member(named(&all), 1).unwrap();
    all[0]
        .write_at(TABLE_COPY_OFFSET, &vec![0u8; BLOCK_BYTES as usize])
        .unwrap();
    assert_eq!(
        read_header(all[0].as_ref(), 0, "mem0").unwrap(),
        Some(before)
    );
    let set = MemberSet::open(named(&all), false).unwrap();
    assert_markers(&set, 6);
    set.verify().unwrap();
    assert_eq!(set.lookup(1).unwrap().0, 1);
    drop(set);
    let again = MemberSet::remove_member(named(&all), 1).unwrap();
    assert_eq!((again.groups_moved, again.generation), (2, 1));
    let set = MemberSet::open(pick(&all, &[0, 2]), false).unwrap();
    assert_markers(&set, 6);
    set.verify().unwrap();
}

#[test]
fn refusals_write_nothing() {
    let all = volume(3, 3);
    let image: Vec<Vec<u8>> = all.iter().map(|m| read_all(m)).collect();
    let member0 = err(MemberSet::remove_member(named(&all), 0));
    assert!(member0.contains("mem0 is member 0"), "{member0}");
    let past = err(MemberSet::remove_member(named(&all), 3));
    assert!(past.contains("past the 3 members"), "{past}");
    let two = volume(2, 2);
    let last = err(MemberSet::remove_member(named(&two), 1));
    assert!(last.contains("would leave member 0 alone"), "{last}");
    // A wrong member set is refused by open's checks before anything is written.
    let swapped = err(MemberSet::remove_member(pick(&all, &[0, 2, 1]), 1));
    assert!(swapped.contains("swapped"), "{swapped}");
    let after: Vec<Vec<u8>> = all.iter().map(|m| read_all(m)).collect();
    assert!(image == after, "a refused removal wrote");
}

#[test]
fn a_member_added_after_a_removal_takes_the_next_index_and_the_removed_one_is_refused() {
    let mut all = volume(3, 3);
    MemberSet::remove_member(named(&all), 1).unwrap();
    let live = pick(&all, &[0, 2]);
    let old = err(MemberSet::add_member(
        live.clone(),
        ("mem1".into(), all[1].clone()),
        false,
    ));
    assert!(
        old.contains("was member 1 of this volume, since removed"),
        "{old}"
    );
    let fourth = Arc::new(MemStorage::new());
    let added = MemberSet::add_member(live, ("mem3".into(), fourth.clone()), true).unwrap();
    assert_eq!((added.index, added.generation), (3, 2));
    all.push(fourth);
    let set = MemberSet::open(pick(&all, &[0, 2, 3]), false).unwrap();
    set.verify().unwrap();
    assert_markers(&set, 3);
    // Removing member 2 now leaves members 0 and 3.
    drop(set);
    let removed = MemberSet::remove_member(pick(&all, &[0, 2, 3]), 1).unwrap();
    assert_eq!((removed.index, removed.generation), (2, 3));
    let set = MemberSet::open(pick(&all, &[0, 3]), false).unwrap();
    set.verify().unwrap();
    assert_markers(&set, 3);
}

fn read_all(m: &MemStorage) -> Vec<u8> {
    let mut bytes = vec![0u8; m.len_bytes().unwrap() as usize];
    m.read_at(0, &mut bytes).unwrap();
    bytes
}
