//! Unit tests of adding a member over memory backends: the table's two copies, the new
//! member's group, and the refusals. (Power loss at every I/O of the add is
//! `tucana-torture`'s `tests/add_member.rs`.)

use std::sync::Arc;

use super::*;
use crate::volume::MemStorage;

use crate::volume::members::tests::{mems, named};

/// A created volume over `n` members, past its first commit (no creation to redo).
fn volume(n: usize) -> Vec<Arc<MemStorage>> {
    let mems = mems(n);
    drop(MemberSet::open(named(&mems), true).unwrap());
    mems[0].write_at(0, b"a superblock").unwrap();
    mems
}

/// Adds `new` to the volume over `mems`.
fn add(mems: &[Arc<MemStorage>], new: &Arc<MemStorage>) -> Result<AddedMember> {
    let blank = new.len_bytes()? == 0;
    MemberSet::add_member(
        named(mems),
        (
            format!("mem{}", mems.len()),
            new.clone() as Arc<dyn Storage>,
        ),
        blank,
    )
}

fn copy(storage: &MemStorage, at: u64) -> Option<SlotHeader> {
    read_block(storage, at, "t").unwrap()
}

#[test]
fn an_added_member_holds_the_next_group_and_the_table_alternates_its_copies() {
    let mut all = volume(2);
    let set = MemberSet::open(named(&all), false).unwrap();
    set.grow(3 * SLOT_BYTES).unwrap();
    drop(set);
    let third = Arc::new(MemStorage::new());
    let added = add(&all, &third).unwrap();
    assert_eq!((added.index, added.group, added.generation), (2, 3, 1));
    // The creation's copy (block 6) is untouched, the new table is in block 7.
    assert_eq!(copy(&all[0], HEADER_OFFSET).unwrap().table.len(), 2);
    assert_eq!(copy(&all[0], TABLE_COPY_OFFSET).unwrap().table.len(), 3);
    all.push(third);
    let set = MemberSet::open(named(&all), false).unwrap();
    assert_eq!(set.lookup(3), Some((2, 0)));
    set.verify().unwrap();
    drop(set);
    // The second add writes over the older copy, block 6.
    let fourth = Arc::new(MemStorage::new());
    assert_eq!(add(&all, &fourth).unwrap().generation, 2);
    let six = copy(&all[0], HEADER_OFFSET).unwrap();
    assert_eq!((six.table.len(), six.generation), (4, 2));
    assert_eq!(copy(&all[0], TABLE_COPY_OFFSET).unwrap().generation, 1);
    all.push(fourth);
    MemberSet::open(named(&all), false)
        .unwrap()
        .verify()
        .unwrap();
}

#[test]
fn a_torn_table_write_leaves_the_table_before_the_add() {
    // The second add's table goes over block 6; torn there (its crc fails), block 7's
    // table of generation 1 is the newest: the volume is the three-member one, and the
    // fourth member is refused as an add that did not finish, until the add runs again.
    let mut all = volume(2);
    let third = Arc::new(MemStorage::new());
    add(&all, &third).unwrap();
    all.push(third);
    let fourth = Arc::new(MemStorage::new());
    add(&all, &fourth).unwrap();
    all[0].write_at(HEADER_OFFSET + 512, &[0xee; 512]).unwrap();
    assert_eq!(copy(&all[0], HEADER_OFFSET), None, "torn");
    MemberSet::open(named(&all), false)
        .unwrap()
        .verify()
        .unwrap();
    let mut four = all.clone();
    four.push(fourth.clone());
    let err = MemberSet::open(named(&four), false)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("member 3 (mem3) is not in the volume's member table of 3 members"),
        "{err}"
    );
    let again = add(&all, &fourth).unwrap();
    assert_eq!((again.index, again.generation), (3, 2));
    MemberSet::open(named(&four), false)
        .unwrap()
        .verify()
        .unwrap();
}

#[test]
fn the_old_member_set_is_refused_once_the_table_names_the_new_member() {
    let mut all = volume(2);
    let third = Arc::new(MemStorage::new());
    add(&all, &third).unwrap();
    let err = MemberSet::open(named(&all), false)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("member 2 (uuid"), "{err}");
    assert!(err.contains("missing"), "{err}");
    all.push(third);
    MemberSet::open(named(&all), false).unwrap();
}

#[test]
fn a_new_member_that_is_someones_is_refused_naming_it_and_nothing_is_written() {
    let all = volume(2);
    // Holding data.
    let data = Arc::new(MemStorage::new());
    data.grow(SLOT_BYTES).unwrap();
    data.write_at(0, b"someone's file").unwrap();
    let err = add(&all, &data).err().unwrap().to_string();
    assert!(err.contains("new member 2 (mem2) holds data"), "{err}");
    // A member of another volume.
    let other = volume(2);
    let err = add(&all, &other[1]).err().unwrap().to_string();
    assert!(err.contains("belongs to another volume"), "{err}");
    // A member of this one.
    let err = add(&all, &all[1]).err().unwrap().to_string();
    assert!(err.contains("is already member 1 of this volume"), "{err}");
    // Nothing was written: the table is the creation's.
    assert_eq!(copy(&all[0], TABLE_COPY_OFFSET), None);
    // A single-file volume has no table to add to.
    let err = MemberSet::add_member(
        named(&all[..1]),
        (
            "new".into(),
            Arc::new(MemStorage::new()) as Arc<dyn Storage>,
        ),
        true,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains("single-file volume"), "{err}");
}

#[test]
fn verify_names_a_table_that_does_not_match_the_members_open() {
    // `check` over the members must see the table: one that names fewer members than
    // are open (written by hand here: open itself refuses such a set) is reported.
    let all = volume(3);
    let set = MemberSet::open(named(&all), false).unwrap();
    let mut h = copy(&all[0], HEADER_OFFSET).unwrap();
    h.table.pop();
    h.generation = 1;
    all[0].write_at(TABLE_COPY_OFFSET, &h.encode()).unwrap();
    let err = set.verify().err().unwrap().to_string();
    assert!(err.contains("names 2 members, 3 are open"), "{err}");
}

#[test]
fn an_online_add_publishes_the_member_for_placement_dispatch_stats_and_sync() {
    // The new member fails its syncs on demand: a sync of the set after a write to its
    // group must reach it (a commit syncs every member before its superblock; a member
    // the set forgot would leave that write volatile under a durable superblock).
    let all = volume(2);
    let set = MemberSet::open(named(&all), false).unwrap();
    let new = Arc::new(crate::volume::FailingSync::new());
    let added = set
        .add_member_online(("mem2".into(), new.clone()), true, &|| {
            panic!("the table's write did not fail")
        })
        .unwrap();
    assert_eq!((added.index, added.group, added.generation), (2, 2, 1));
    assert_eq!(set.lookup(2), Some((2, 0)));
    let groups: Vec<u64> = set.member_stats().iter().map(|m| m.groups).collect();
    assert_eq!(groups, [1, 1, 1]);
    set.verify().unwrap();
    // Round-robin gives the new member its turn among three.
    let mut turns: Vec<usize> = (0..3)
        .map(|_| set.dispatch_member(None, &[]).unwrap())
        .collect();
    turns.sort();
    assert_eq!(turns, [0, 1, 2]);
    // Growth takes the group already placed on it, then places the next one anew.
    set.grow(3 * SLOT_BYTES).unwrap();
    assert_eq!(set.lookup(2), Some((2, 0)));
    assert_eq!(set.lookup(3), None);
    set.grow(4 * SLOT_BYTES).unwrap();
    assert!(set.lookup(3).is_some());
    set.sync().unwrap();
    set.write_at(2 * SLOT_BYTES + (1 << 20), b"on the new member")
        .unwrap();
    new.set_broken(true);
    assert!(set.sync().is_err(), "the sync missed the new member");
    new.set_broken(false);
    set.sync().unwrap();
    let mut back = [0u8; 17];
    new.read_at(1 << 20, &mut back).unwrap();
    assert_eq!(&back, b"on the new member");
}

#[test]
fn a_failed_table_sync_in_an_online_add_says_so_and_publishes_nothing() {
    // Member 0 (which holds the table) fails its syncs: the add must report that the
    // table's state is unknown (the engine poisons itself on it) and leave the set as it
    // was: two members, the next group unplaced.
    let first = Arc::new(crate::volume::FailingSync::new());
    let second = Arc::new(MemStorage::new());
    let members = || -> Vec<(String, Arc<dyn Storage>)> {
        vec![
            ("mem0".into(), first.clone() as Arc<dyn Storage>),
            ("mem1".into(), second.clone() as Arc<dyn Storage>),
        ]
    };
    drop(MemberSet::open(members(), true).unwrap());
    first.write_at(0, b"a superblock").unwrap();
    let set = MemberSet::open(members(), false).unwrap();
    first.set_broken(true);
    let unsure = std::sync::atomic::AtomicBool::new(false);
    let err = set
        .add_member_online(("mem2".into(), Arc::new(MemStorage::new())), true, &|| {
            unsure.store(true, std::sync::atomic::Ordering::SeqCst)
        })
        .expect_err("the table's sync failed");
    assert!(err.to_string().contains("injected sync failure"), "{err}");
    assert!(unsure.load(std::sync::atomic::Ordering::SeqCst));
    assert_eq!(set.member_stats().len(), 2);
    assert_eq!(set.lookup(2), None);
}
