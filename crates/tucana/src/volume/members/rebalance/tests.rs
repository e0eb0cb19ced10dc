//! Unit tests of the rebalance over memory backends: groups even out onto an added member
//! and read back, a balanced volume is left alone, and open's rule for two slots claiming
//! one group (the rebalanced copy wins, a pair it does not resolve is refused). Power loss
//! at every I/O is `tucana-torture`'s `tests/rebalance.rs`.

use std::sync::Arc;

use super::*;
use crate::volume::members::tests::{mems, named};
use crate::volume::{MemStorage, Storage};

/// A created volume over `n` members grown to `groups` groups, each group's bytes at
/// 1 MiB into it saying which group it is, then `added` blank members added.
fn volume(n: usize, groups: u64, added: usize) -> Vec<Arc<MemStorage>> {
    let all = mems(n + added);
    let set = MemberSet::open(named(&all[..n]), true).unwrap();
    set.grow(groups * SLOT_BYTES).unwrap();
    for g in 0..groups {
        set.write_at(g * SLOT_BYTES + (1 << 20), &marker(g))
            .unwrap();
    }
    drop(set);
    all[0].write_at(0, b"a superblock").unwrap();
    for k in n..n + added {
        let named = named(&all);
        MemberSet::add_member(named[..k].to_vec(), named[k].clone(), true).unwrap();
    }
    all
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

fn groups_per_member(set: &MemberSet) -> Vec<u64> {
    set.member_stats().iter().map(|m| m.groups).collect()
}

fn header_block(mem: &MemStorage, slot: u64) -> Vec<u8> {
    let mut block = vec![0u8; BLOCK_BYTES as usize];
    mem.read_at(slot * SLOT_BYTES + HEADER_OFFSET, &mut block)
        .unwrap();
    block
}

fn err<T>(result: Result<T>) -> String {
    match result {
        Ok(_) => panic!("not refused"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn groups_even_out_onto_an_added_member_and_read_back_from_their_new_slots() {
    // Ten groups over two members (five each), then a third member added with group 10:
    // 5/5/1. Two moves, 0 → 2 then 1 → 2, leave 4/4/3.
    let all = volume(2, 10, 1);
    let done = MemberSet::rebalance(named(&all)).unwrap();
    assert_eq!(done.groups_moved, 2, "{done:?}");
    assert_eq!(done.groups, vec![4, 4, 3]);
    // The markers' 64 KiB piece of each fresh slot, and nothing else.
    assert_eq!(
        done.bytes_moved,
        2 * (super::super::remove::HOLE_BYTES as u64)
    );
    let set = MemberSet::open(named(&all), false).unwrap();
    assert_eq!(groups_per_member(&set), vec![4, 4, 3]);
    assert_markers(&set, 10);
    set.verify().unwrap();
    // The lowest group outside slot 0 of each source moved: 2 off member 0, 3 off 1,
    // each from its slot 1.
    for (g, from) in [(2u64, 0usize), (3, 1)] {
        let (m, _) = set.lookup(g).unwrap();
        assert_eq!(m, 2, "group {g}");
        let free = set.grow_lock.lock().free_slots[from].clone();
        assert_eq!(
            free,
            vec![1],
            "member {from}'s old slot of group {g} is free"
        );
        assert!(header_block(&all[from], 1).iter().all(|&b| b == 0));
    }
    drop(set);
    // Balanced now: a second rebalance moves nothing.
    let again = MemberSet::rebalance(named(&all)).unwrap();
    assert_eq!((again.groups_moved, again.bytes_moved), (0, 0));
}

#[test]
fn a_balanced_volume_moves_nothing_and_writes_nothing() {
    // Round-robin placement keeps a volume within one group per member: nothing to do,
    // and not a byte written to any member (the leftovers' scan only reads).
    for (n, groups) in [(2, 2), (3, 7), (3, 9)] {
        let all = volume(n, groups, 0);
        let before: Vec<(u64, u64)> = all.iter().map(|m| m.io_bytes()).collect();
        let done = MemberSet::rebalance(named(&all)).unwrap();
        assert_eq!(
            (done.groups_moved, done.bytes_moved),
            (0, 0),
            "{n} × {groups}"
        );
        let after: Vec<(u64, u64)> = all.iter().map(|m| m.io_bytes()).collect();
        for (m, (b, a)) in before.iter().zip(&after).enumerate() {
            assert_eq!(b.0, a.0, "{n} × {groups}: member {m} was written");
        }
    }
}

#[test]
fn a_single_file_has_nothing_to_rebalance() {
    let one = mems(1);
    let refused = err(MemberSet::rebalance(named(&one)));
    assert!(refused.contains("nothing to rebalance"), "{refused}");
}

#[test]
fn a_copy_whose_source_header_was_not_zeroed_wins_and_the_next_rebalance_clears_it() {
    // A crash after the new headers were synced but before the old ones were zeroed:
    // both slots claim the group. Open takes the copy (rebalanced from the other's
    // member, one move newer), the old slot is free, and a rebalance zeroes its header.
    let all = volume(2, 10, 1);
    let old_header = header_block(&all[0], 1);
    MemberSet::rebalance(named(&all)).unwrap();
    all[0]
        .write_at(SLOT_BYTES + HEADER_OFFSET, &old_header)
        .unwrap();
    let set = MemberSet::open(named(&all), false).unwrap();
    assert_eq!(set.lookup(2).unwrap().0, 2);
    assert_eq!(groups_per_member(&set), vec![4, 4, 3]);
    assert_eq!(set.grow_lock.lock().free_slots[0], vec![1]);
    assert_markers(&set, 10);
    set.verify().unwrap();
    drop(set);
    let again = MemberSet::rebalance(named(&all)).unwrap();
    assert_eq!(again.groups_moved, 0);
    assert!(header_block(&all[0], 1).iter().all(|&b| b == 0));
}

/// Writes at slot `slot` of member `m` a header claiming `group`, rebalanced from
/// `from` with `moves`.
fn claim(all: &[Arc<MemStorage>], m: usize, slot: u64, group: u64, from: u32, moves: u32) {
    let first = read_header(all[m].as_ref(), 0, "m").unwrap().unwrap();
    let header = SlotHeader {
        member_index: m as u32,
        volume_uuid: first.volume_uuid,
        member_uuid: first.member_uuid,
        group,
        table: Vec::new(),
        generation: 0,
        moved_from: None,
        rebalanced_from: Some(from),
        rebalanced_moves: moves,
    };
    all[m].grow((slot + 1) * SLOT_BYTES).unwrap();
    all[m]
        .write_at(slot * SLOT_BYTES + HEADER_OFFSET, &header.encode())
        .unwrap();
}

#[test]
fn a_group_that_came_back_is_settled_by_its_moves_and_other_pairs_are_refused() {
    // Group 2 went 0 → 2 (moves 1). A later move 2 → 0, interrupted before member 2's
    // header was zeroed, leaves two headers each rebalanced from the other's member: the
    // moves (2 against 1) say which is newer.
    let all = volume(2, 10, 1);
    MemberSet::rebalance(named(&all)).unwrap();
    let (to, slot) = {
        let set = MemberSet::open(named(&all), false).unwrap();
        set.lookup(2).unwrap()
    };
    assert_eq!((to, slot), (2, 1));
    claim(&all, 0, 9, 2, 2, 2);
    {
        let set = MemberSet::open(named(&all), false).unwrap();
        assert_eq!(set.lookup(2), Some((0, 9)));
        assert_eq!(groups_per_member(&set), vec![5, 4, 2]);
    }
    // The same moves as the copy it claims to be newer than: not resolved, refused.
    claim(&all, 0, 9, 2, 2, 1);
    let refused = err(MemberSet::open(named(&all), false));
    assert!(refused.contains("holds group 2, as does slot"), "{refused}");
    // Rebalanced from a member other than the other claimant's: refused too.
    claim(&all, 0, 9, 2, 1, 2);
    let refused = err(MemberSet::open(named(&all), false));
    assert!(refused.contains("holds group 2, as does slot"), "{refused}");
}

/// A block device in memory: a fixed length, which it never grows past.
struct Device {
    mem: MemStorage,
    capacity_bytes: u64,
}

impl Device {
    fn new(slots: u64) -> Arc<Device> {
        let mem = MemStorage::new();
        mem.grow(slots * SLOT_BYTES).unwrap();
        Arc::new(Device {
            mem,
            capacity_bytes: slots * SLOT_BYTES,
        })
    }
}

impl Storage for Device {
    fn len_bytes(&self) -> Result<u64> {
        Ok(self.capacity_bytes)
    }
    fn grow(&self, len_bytes: u64) -> Result<()> {
        if len_bytes <= self.capacity_bytes {
            return Ok(());
        }
        Err(Error::Io(std::io::Error::new(
            std::io::ErrorKind::StorageFull,
            "device full",
        )))
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.mem.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.mem.write_at(offset, data)
    }
    fn sync(&self) -> Result<()> {
        Ok(())
    }
    fn capacity_bytes(&self) -> Option<u64> {
        Some(self.capacity_bytes)
    }
}

fn named_devices(devices: &[Arc<Device>]) -> Vec<(String, Arc<dyn Storage>)> {
    devices
        .iter()
        .enumerate()
        .map(|(i, d)| (format!("dev{i}"), d.clone() as Arc<dyn Storage>))
        .collect()
}

/// A volume created over devices of `slots[0]` and `slots[1]` slots, grown to `groups`
/// groups with their markers, then a device of `slots[2]` slots added (as `volume`).
fn device_volume(slots: [u64; 3], groups: u64) -> Vec<(String, Arc<dyn Storage>)> {
    let devices = slots.map(Device::new);
    let named = named_devices(&devices);
    let set = MemberSet::open_with_blank(named[..2].to_vec(), &[true, true], true).unwrap();
    set.grow(groups * SLOT_BYTES).unwrap();
    for g in 0..groups {
        set.write_at(g * SLOT_BYTES + (1 << 20), &marker(g))
            .unwrap();
    }
    drop(set);
    devices[0].write_at(0, b"a superblock").unwrap();
    MemberSet::add_member(named[..2].to_vec(), named[2].clone(), true).unwrap();
    named
}

#[test]
fn devices_of_different_sizes_fill_in_proportion_to_their_capacity() {
    // Two devices of 4 slots hold six groups (3/3); a device of 12 slots is added with
    // group 6 (3/3/1). By count the plan stops at 2/3/2 (checked: with every weight 1
    // this test fails so), the big device filled to a sixth and the small ones to a half
    // and three quarters; weighted by capacity (4, 4, 12) it moves 0 → 2, 1 → 2, 0 → 2:
    // 1/2/4 (a quarter, a half, a third), where one more move (1 → 2) would not lower
    // Σ groups² / slots.
    let named = device_volume([4, 4, 12], 6);
    let done = MemberSet::rebalance(named.clone()).unwrap();
    assert_eq!(done.groups, vec![1, 2, 4], "{done:?}");
    assert_eq!(done.groups_moved, 3);
    let set = MemberSet::open(named.clone(), false).unwrap();
    assert_eq!(groups_per_member(&set), vec![1, 2, 4]);
    assert_markers(&set, 6);
    set.verify().unwrap();
    drop(set);
    let again = MemberSet::rebalance(named).unwrap();
    assert_eq!(again.groups_moved, 0);
}

#[test]
fn devices_of_one_size_balance_by_count_as_files_do() {
    // Equal weights: the same plan as the files' (5/5/1 → 4/4/3).
    let named = device_volume([8, 8, 8], 10);
    let done = MemberSet::rebalance(named).unwrap();
    assert_eq!(done.groups, vec![4, 4, 3], "{done:?}");
}
