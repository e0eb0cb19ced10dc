//! Unit tests of the member set over memory backends: placement, routing across group
//! boundaries, reopening, and the headers `verify` checks.

use super::*;
use crate::types::BLOCK_BYTES;
use crate::volume::dispatch::{DispatchPolicy, Kind};
use crate::volume::MemStorage;
use std::sync::atomic::AtomicBool;

/// `n` empty memory members (also for `table::tests`).
pub(super) fn mems(n: usize) -> Vec<Arc<MemStorage>> {
    (0..n).map(|_| Arc::new(MemStorage::new())).collect()
}

/// The members named `mem0`, `mem1`… as `MemberSet::open` takes them.
pub(super) fn named(mems: &[Arc<MemStorage>]) -> Vec<(String, Arc<dyn Storage>)> {
    mems.iter()
        .enumerate()
        .map(|(i, m)| (format!("mem{i}"), m.clone() as Arc<dyn Storage>))
        .collect()
}

/// Overwrites the creation marker in member 0's slot 0, as the first commit does: the
/// member set is then a created volume that open validates, not a creation to redo.
fn pretend_committed(mems: &[Arc<MemStorage>]) {
    mems[0].write_at(0, b"a superblock").unwrap();
}

#[test]
fn creation_places_one_group_per_member_then_round_robin() {
    let mems = mems(3);
    let set = MemberSet::open(named(&mems), true).unwrap();
    assert_eq!(set.len_bytes().unwrap(), 3 * SLOT_BYTES);
    for g in 0..3 {
        assert_eq!(set.lookup(g), Some((g as usize, 0)));
    }
    set.grow(5 * SLOT_BYTES + 8 * BLOCK_BYTES).unwrap();
    assert_eq!(set.lookup(3), Some((0, 1)));
    assert_eq!(set.lookup(4), Some((1, 1)));
    assert_eq!(set.lookup(5), Some((2, 1)));
    assert_eq!(set.lookup(6), None);
    assert_eq!(mems[0].len_bytes().unwrap(), 2 * SLOT_BYTES);
    let groups: Vec<u64> = set.member_stats().iter().map(|m| m.groups).collect();
    assert_eq!(groups, [2, 2, 2]);
    set.verify().unwrap();
}

#[test]
fn io_across_a_group_boundary_lands_on_both_members_and_survives_reopen() {
    let mems = mems(2);
    {
        let set = MemberSet::open(named(&mems), true).unwrap();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        set.write_at(SLOT_BYTES - 5_000, &data).unwrap();
        let mut back = vec![0u8; data.len()];
        set.read_at(SLOT_BYTES - 5_000, &mut back).unwrap();
        assert_eq!(back, data);
        // The first half is at the end of member 0's slot 0, the rest at the start of
        // member 1's slot 0.
        let mut first = vec![0u8; 5_000];
        mems[0].read_at(SLOT_BYTES - 5_000, &mut first).unwrap();
        assert_eq!(first, data[..5_000]);
        let mut second = vec![0u8; 5_000];
        mems[1].read_at(0, &mut second).unwrap();
        assert_eq!(second, data[5_000..]);
        assert_eq!(set.io_bytes(), (10_000, 10_000));
        set.sync().unwrap();
    }
    pretend_committed(&mems);
    let set = MemberSet::open(named(&mems), false).unwrap();
    assert_eq!(set.len_bytes().unwrap(), 2 * SLOT_BYTES);
    let mut back = vec![0u8; 3];
    set.read_at(SLOT_BYTES, &mut back).unwrap();
    assert_eq!(
        back,
        [
            (5_000 % 251) as u8,
            (5_001 % 251) as u8,
            (5_002 % 251) as u8
        ]
    );
}

#[test]
fn a_group_whose_header_was_lost_is_placed_again_and_a_free_slot_reused() {
    // Groups 0..4 over 2 members; then group 2's header (member 0, slot 1) is wiped, as a
    // crash before that member's sync leaves it. Reopen: group 3 (member 1, slot 1) is
    // found, so group 2 is a hole below it and is placed again, in the free slot.
    let mems = mems(2);
    {
        let set = MemberSet::open(named(&mems), true).unwrap();
        set.grow(4 * SLOT_BYTES).unwrap();
        assert_eq!(set.lookup(2), Some((0, 1)));
        assert_eq!(set.lookup(3), Some((1, 1)));
    }
    pretend_committed(&mems);
    mems[0]
        .write_at(SLOT_BYTES + HEADER_OFFSET, &[0u8; BLOCK_BYTES as usize])
        .unwrap();
    let set = MemberSet::open(named(&mems), false).unwrap();
    assert_eq!(set.len_bytes().unwrap(), 4 * SLOT_BYTES);
    assert_eq!(set.lookup(2).map(|(_, slot)| slot), Some(1));
    set.verify().unwrap();
}

#[test]
fn two_slots_claiming_one_group_are_refused_naming_both() {
    let mems = mems(2);
    {
        let set = MemberSet::open(named(&mems), true).unwrap();
        set.grow(4 * SLOT_BYTES).unwrap();
    }
    pretend_committed(&mems);
    // Member 1's slot 1 (group 3) rewritten to claim group 2, which member 0 holds.
    let mut bytes = vec![0u8; BLOCK_BYTES as usize];
    mems[1]
        .read_at(SLOT_BYTES + HEADER_OFFSET, &mut bytes)
        .unwrap();
    let mut h = SlotHeader::decode(&bytes, "t").unwrap().unwrap();
    h.group = 2;
    mems[1]
        .write_at(SLOT_BYTES + HEADER_OFFSET, &h.encode())
        .unwrap();
    let Err(err) = MemberSet::open(named(&mems), false) else {
        panic!("opened a volume with one group in two slots");
    };
    let text = err.to_string();
    assert!(
        text.contains("mem0") && text.contains("mem1") && text.contains("group 2"),
        "{text}"
    );
}

#[test]
fn verify_names_a_slot_whose_header_went_bad() {
    let mems = mems(3);
    let set = MemberSet::open(named(&mems), true).unwrap();
    set.verify().unwrap();
    mems[2].write_at(HEADER_OFFSET + 100, b"rot").unwrap();
    let err = set.verify().unwrap_err().to_string();
    assert!(err.contains("member 2 (mem2) slot 0"), "{err}");
}

#[test]
fn sync_fans_out_only_to_dirty_members() {
    let mems = mems(3);
    let set = MemberSet::open(named(&mems), true).unwrap();
    set.sync().unwrap();
    assert!(set.members.iter().all(|m| !m.dirty.load(Ordering::Relaxed)));
    set.write_at(SLOT_BYTES + 10, b"x").unwrap();
    let dirty: Vec<bool> = set
        .members
        .iter()
        .map(|m| m.dirty.load(Ordering::Relaxed))
        .collect();
    assert_eq!(dirty, [false, true, false]);
    set.sync().unwrap();
    assert!(set.members.iter().all(|m| !m.dirty.load(Ordering::Relaxed)));
}

#[test]
fn fresh_members_need_creation_and_data_beside_an_empty_member_0_is_refused() {
    let mems = mems(2);
    let err = MemberSet::open(named(&mems), false)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("member 0 (mem0) is empty"), "{err}");
    mems[1].grow(4096).unwrap();
    mems[1].write_at(0, b"someone's data").unwrap();
    let err = MemberSet::open(named(&mems), true)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("member 1 (mem1) has data but member 0 is empty"),
        "{err}"
    );
    assert_eq!(mems[0].len_bytes().unwrap(), 0, "nothing written");
}

#[test]
fn a_creation_interrupted_before_a_member_got_its_header_is_done_again() {
    // Member 0's table and the creation marker are durable, member 1's header is not (a
    // crash inside `create`): nothing was ever committed, so open creates again instead
    // of calling member 1 "not a member".
    let mems = mems(2);
    drop(MemberSet::open(named(&mems), true).unwrap());
    mems[1]
        .write_at(HEADER_OFFSET, &[0u8; BLOCK_BYTES as usize])
        .unwrap();
    let set = MemberSet::open(named(&mems), true).unwrap();
    set.verify().unwrap();
    assert_eq!(set.lookup(1), Some((1, 0)));
    // Once member 0 holds a superblock instead of the marker, the same state is refused.
    mems[1]
        .write_at(HEADER_OFFSET, &[0u8; BLOCK_BYTES as usize])
        .unwrap();
    mems[0].write_at(0, b"not the creation marker").unwrap();
    let err = MemberSet::open(named(&mems), true)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("member 1 (mem1) is not a member"), "{err}");
}

#[test]
fn a_failed_member_sync_is_reported_and_the_member_stays_dirty() {
    use crate::volume::FailingSync;
    let failing = Arc::new(FailingSync::new());
    let members: Vec<(String, Arc<dyn Storage>)> = vec![
        ("m0".into(), Arc::new(MemStorage::new())),
        ("m1".into(), failing.clone()),
        ("m2".into(), Arc::new(MemStorage::new())),
    ];
    let set = MemberSet::open(members, true).unwrap();
    set.sync().unwrap();
    // Members 1 and 2 dirty: their syncs run side by side, member 1's fails.
    set.write_at(SLOT_BYTES + 10, b"on member 1").unwrap();
    set.write_at(2 * SLOT_BYTES + 10, b"on member 2").unwrap();
    failing.set_broken(true);
    assert!(set.sync().is_err());
    assert!(set.members[1].dirty.load(Ordering::Relaxed));
    assert!(!set.members[2].dirty.load(Ordering::Relaxed));
    failing.set_broken(false);
    set.sync().unwrap();
    assert!(!set.members[1].dirty.load(Ordering::Relaxed));
}

#[test]
fn segments_go_round_robin_over_members_and_fall_back_when_one_is_full() {
    use crate::alloc::{Allocator, GROUP_BYTES};
    let mems = mems(3);
    let set = MemberSet::open(named(&mems), true).unwrap();
    let allocator = Allocator::create(set.len_bytes().unwrap());
    let segment_blocks = 512; // 2 MiB
    let mut on = Vec::new();
    for _ in 0..6 {
        let member = set.dispatch_member(None, &[]);
        let at = allocator
            .allocate_on(&set, segment_blocks, segment_blocks, false, member)
            .unwrap();
        assert_eq!(set.member_of(at.0), member);
        on.push(member.unwrap());
    }
    assert_eq!(on, [0, 1, 2, 0, 1, 2]);
    // Member 1's only group filled up: the volume grows by a group placed on member 1
    // (members grow independently), though members 0 and 2 still have room. (It used
    // to fall back to their room, which capped a fast member at the groups it had.)
    let groups_before = set.len_bytes().unwrap().div_ceil(GROUP_BYTES);
    let at = loop {
        let at = allocator
            .allocate_on(&set, segment_blocks, segment_blocks, false, Some(1))
            .unwrap();
        assert_eq!(set.member_of(at.0), Some(1));
        if at.0 / GROUP_BYTES != 1 {
            break at;
        }
    };
    assert!(at.0 / GROUP_BYTES >= groups_before, "{at:?}");
    assert_eq!(set.member_stats()[1].groups, 2);
    // Growth for no member in particular is placed round-robin again.
    let before: Vec<u64> = set.member_stats().iter().map(|m| m.groups).collect();
    set.grow(set.len_bytes().unwrap() + 3 * SLOT_BYTES).unwrap();
    let after: Vec<u64> = set.member_stats().iter().map(|m| m.groups).collect();
    assert_eq!(after.iter().sum::<u64>(), before.iter().sum::<u64>() + 3);
    assert!(
        after.iter().zip(&before).all(|(a, b)| a > b),
        "{before:?} -> {after:?}"
    );
}

#[test]
fn node_runs_go_to_the_dispatched_member_and_grow_on_it_when_it_is_full() {
    // A commit's node runs used to take the allocator's first fit, wherever it was:
    // the member the dispatch policy would have passed over (busy, or slow) got them as
    // often as any. Now each run is placed as a segment is.
    use crate::alloc::{Allocator, GROUP_BYTES};
    let mems = mems(3);
    let set = MemberSet::open(named(&mems), true)
        .unwrap()
        .with_policy(DispatchPolicy::LeastWeightedQueue);
    let allocator = Allocator::create(set.len_bytes().unwrap());
    let run_blocks = 256; // 1 MiB, a commit's `NODE_RUN_BLOCKS`
                          // Member 1 is busy reading: least-weighted dispatch keeps node runs off it.
    set.members[1].load.start(Kind::Read, 64 << 20);
    let mut on = Vec::new();
    for _ in 0..6 {
        let member = set.dispatch_member(None, &[]);
        let (at, blocks) = allocator
            .allocate_up_to_on(&set, run_blocks, member)
            .unwrap();
        assert_eq!(blocks, run_blocks);
        assert_eq!(set.member_of(at.0), member, "{at:?}");
        on.push(member.unwrap());
    }
    assert!(!on.contains(&1), "{on:?}");
    assert!(on.contains(&0) && on.contains(&2), "{on:?}");
    set.members[1].load.finish(Kind::Read, 64 << 20, 1_000);
    // A member whose groups are full grows by a group placed on it, though the others
    // still have room; without a member named, first fit as before.
    let groups_before = set.len_bytes().unwrap().div_ceil(GROUP_BYTES);
    let at = loop {
        let (at, _) = allocator
            .allocate_up_to_on(&set, run_blocks, Some(2))
            .unwrap();
        assert_eq!(set.member_of(at.0), Some(2));
        if at.0 / GROUP_BYTES != 2 {
            break at;
        }
    };
    assert!(at.0 / GROUP_BYTES >= groups_before, "{at:?}");
    assert_eq!(set.member_stats()[2].groups, 2);
    let (anywhere, _) = allocator.allocate_up_to_on(&set, run_blocks, None).unwrap();
    assert!(set.member_of(anywhere.0).is_some());
}

#[test]
fn least_weighted_dispatch_passes_over_a_member_busy_reading() {
    let mems = mems(3);
    let set = MemberSet::open(named(&mems), true)
        .unwrap()
        .with_policy(DispatchPolicy::LeastWeightedQueue);
    // Idle members tie: they take turns.
    let idle: Vec<Option<usize>> = (0..3).map(|_| set.dispatch_member(None, &[])).collect();
    assert_eq!(idle, [Some(0), Some(1), Some(2)]);
    // 8 MiB of reads in flight on member 1 (a hot range, or a GC pass reading victims).
    set.members[1].load.start(Kind::Read, 8 << 20);
    let busy: Vec<Option<usize>> = (0..4).map(|_| set.dispatch_member(None, &[])).collect();
    assert!(!busy.contains(&Some(1)), "{busy:?}");
    assert!(
        busy.contains(&Some(0)) && busy.contains(&Some(2)),
        "{busy:?}"
    );
    let stats = set.member_stats();
    assert_eq!(stats[1].in_flight_bytes, 8 << 20);
    assert_eq!(stats[1].in_flight_requests, 1);
    assert!(stats[1].weighted_queue_ps > 0 && stats[0].weighted_queue_ps == 0);
    set.members[1].load.finish(Kind::Read, 8 << 20, 1_000);
    // Round-robin ignores load.
    let rr = MemberSet::open(named(&mems), false).unwrap();
    rr.members[1].load.start(Kind::Read, 8 << 20);
    let turns: Vec<Option<usize>> = (0..3).map(|_| rr.dispatch_member(None, &[])).collect();
    assert_eq!(turns, [Some(0), Some(1), Some(2)]);
    // A pinned member takes everything but what must avoid it, load or not.
    let pinned = MemberSet::open(named(&mems), false)
        .unwrap()
        .with_policy(DispatchPolicy::Member(1));
    pinned.members[1].load.start(Kind::Read, 8 << 20);
    let on: Vec<Option<usize>> = (0..3).map(|_| pinned.dispatch_member(None, &[])).collect();
    assert_eq!(on, [Some(1); 3]);
    assert_ne!(pinned.dispatch_member(Some(1), &[]), Some(1));
    let past_the_end = MemberSet::open(named(&mems), false)
        .unwrap()
        .with_policy(DispatchPolicy::Member(7));
    assert!(past_the_end
        .dispatch_member(None, &[])
        .is_some_and(|m| m < 3));
}

#[test]
fn prefetches_on_a_member_count_as_its_reads_for_least_weighted_dispatch() {
    // What the engine asks to read ahead (scans, `multi_get`) is read work the member
    // set never saw in flight; announced, it steers segments and node runs away from a
    // member serving a hot range, and shows in that member's weighted queue.
    let three = mems(3);
    let set = MemberSet::open(named(&three), true)
        .unwrap()
        .with_policy(DispatchPolicy::LeastWeightedQueue);
    // A slow reader (one 1 MiB read took 10 s), so that the announced work lasts far
    // longer than this test, however loaded the machine.
    let slow_reads = |set: &MemberSet, m: usize| {
        set.members[m].load.start(Kind::Read, 1 << 20);
        set.members[m]
            .load
            .finish(Kind::Read, 1 << 20, 10_000_000_000);
    };
    slow_reads(&set, 1);
    // 64 MiB asked ahead in member 1's group (group 1, slot 0 of member 1).
    set.prefetch(SLOT_BYTES + 8 * BLOCK_BYTES, 64 << 20);
    let stats = set.member_stats();
    assert!(stats[1].weighted_queue_ps > 0, "{stats:?}");
    assert_eq!(
        (stats[0].weighted_queue_ps, stats[2].weighted_queue_ps),
        (0, 0)
    );
    let picks: Vec<Option<usize>> = (0..4).map(|_| set.dispatch_member(None, &[])).collect();
    assert!(!picks.contains(&Some(1)), "{picks:?}");
    // A prefetch across a group boundary is announced on both members, each its piece.
    let fresh = MemberSet::open(named(&mems(2)), true).unwrap();
    slow_reads(&fresh, 0);
    slow_reads(&fresh, 1);
    fresh.prefetch(SLOT_BYTES - (1 << 20), 2 << 20);
    let both = fresh.member_stats();
    assert!(
        both[0].weighted_queue_ps > 0 && both[1].weighted_queue_ps > 0,
        "{both:?}"
    );
}

#[test]
fn member_requests_are_counted_and_timed() {
    let mems = mems(2);
    let set = MemberSet::open(named(&mems), true).unwrap();
    set.write_at(SLOT_BYTES, &vec![1u8; 1 << 20]).unwrap();
    let mut back = vec![0u8; 1 << 20];
    set.read_at(SLOT_BYTES, &mut back).unwrap();
    let stats = set.member_stats();
    assert_eq!(
        (stats[1].in_flight_requests, stats[1].in_flight_bytes),
        (0, 0)
    );
    assert_eq!(stats[1].bytes_written, 1 << 20);
    assert_eq!(stats[1].bytes_read, 1 << 20);
    assert_eq!(stats[0].bytes_read, 0);
}

#[test]
fn a_relocation_segment_goes_away_from_its_victims_member() {
    // GC reads its victim on one member; the copies' segment goes to another, under
    // either policy, and still in turn among the others.
    let mems = mems(3);
    for policy in [
        DispatchPolicy::RoundRobin,
        DispatchPolicy::LeastWeightedQueue,
    ] {
        let set = MemberSet::open(named(&mems), true)
            .unwrap()
            .with_policy(policy);
        let picks: Vec<usize> = (0..6)
            .map(|_| set.dispatch_member(Some(1), &[]).unwrap())
            .collect();
        assert!(!picks.contains(&1), "{policy:?}: {picks:?}");
        assert!(
            picks.contains(&0) && picks.contains(&2),
            "{policy:?}: {picks:?}"
        );
        pretend_committed(&mems);
    }
}

#[test]
fn least_weighted_dispatch_counts_writes_waiting_in_the_write_queue() {
    // Before, least-weighted dispatch saw only the requests issued through the member
    // set: segments waiting in the write queue for a member whose worker was busy were
    // invisible, so a member with a backlog kept being handed more of them.
    let mems = mems(3);
    let set = MemberSet::open(named(&mems), true)
        .unwrap()
        .with_policy(DispatchPolicy::LeastWeightedQueue);
    let backlog_on_1 = [0, 8 << 20, 0];
    let picks: Vec<usize> = (0..6)
        .map(|_| set.dispatch_member(None, &backlog_on_1).unwrap())
        .collect();
    assert!(!picks.contains(&1), "{picks:?}");
    assert!(picks.contains(&0) && picks.contains(&2), "{picks:?}");
    // A backlog everywhere: the shortest one, whatever the turn.
    for _ in 0..3 {
        assert_eq!(
            set.dispatch_member(None, &[6 << 20, 2 << 20, 4 << 20]),
            Some(1)
        );
    }
    // Missing entries count as nothing queued.
    for _ in 0..3 {
        assert_eq!(set.dispatch_member(None, &[6 << 20, 2 << 20]), Some(2));
    }
    // Queued bytes weigh by the member's measured time per byte written: member 0
    // measured four times slower than member 2, so its 2 MiB outweigh member 2's 4 MiB.
    for _ in 0..64 {
        set.members[0].load.start(Kind::Write, 1 << 20);
        set.members[0].load.finish(Kind::Write, 1 << 20, 8_000_000);
        set.members[2].load.start(Kind::Write, 1 << 20);
        set.members[2].load.finish(Kind::Write, 1 << 20, 2_000_000);
    }
    assert_eq!(
        set.dispatch_member(Some(1), &[2 << 20, 0, 4 << 20]),
        Some(2)
    );
    // Round-robin ignores queued bytes.
    let rr = MemberSet::open(named(&mems), false).unwrap();
    let turns: Vec<Option<usize>> = (0..3)
        .map(|_| rr.dispatch_member(None, &backlog_on_1))
        .collect();
    assert_eq!(turns, [Some(0), Some(1), Some(2)]);
}

#[test]
fn least_weighted_dispatch_always_picks_a_least_loaded_member() {
    // A property over a deterministic sweep: reads in flight and writes queued on each
    // of three members, in every combination of a few sizes; the chosen member's
    // weighted length (in flight plus queued) is the least, and `avoid` is honoured
    // whenever another member exists.
    let mems = mems(3);
    let set = MemberSet::open(named(&mems), true)
        .unwrap()
        .with_policy(DispatchPolicy::LeastWeightedQueue);
    let sizes = [0u64, 1 << 20, 3 << 20];
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..200 {
        // xorshift: a repeatable spread of cases.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let pick = |shift: u32| sizes[((state >> shift) % 3) as usize];
        let reads = [pick(0), pick(4), pick(8)];
        let queued = [pick(12), pick(16), pick(20)];
        for (m, &bytes) in reads.iter().enumerate() {
            set.members[m].load.start(Kind::Read, bytes);
        }
        let lengths: Vec<u64> = (0..3)
            .map(|m| set.members[m].load.weighted_length_with_queued(queued[m]))
            .collect();
        let chosen = set.dispatch_member(None, &queued).unwrap();
        assert_eq!(
            lengths[chosen],
            *lengths.iter().min().unwrap(),
            "{reads:?} {queued:?}"
        );
        let avoid = (state >> 24) as usize % 3;
        let away = set.dispatch_member(Some(avoid), &queued).unwrap();
        assert_ne!(away, avoid);
        let least_other = (0..3).filter(|&m| m != avoid).map(|m| lengths[m]).min();
        assert_eq!(Some(lengths[away]), least_other, "{reads:?} {queued:?}");
        for (m, &bytes) in reads.iter().enumerate() {
            set.members[m].load.finish(Kind::Read, bytes, 0);
        }
    }
}

/// Memory storage whose hole punches wait for the test's word, having said they started.
struct PunchGate {
    inner: MemStorage,
    entered: Mutex<std::sync::mpsc::Sender<()>>,
    go: Mutex<std::sync::mpsc::Receiver<()>>,
}

impl Storage for PunchGate {
    fn len_bytes(&self) -> Result<u64> {
        self.inner.len_bytes()
    }
    fn grow(&self, len_bytes: u64) -> Result<()> {
        self.inner.grow(len_bytes)
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.inner.write_at(offset, data)
    }
    fn sync(&self) -> Result<()> {
        self.inner.sync()
    }
    fn punch_hole(&self, offset: u64, len: u64) -> Result<()> {
        self.entered.lock().send(()).unwrap();
        self.go.lock().recv().unwrap();
        self.inner.punch_hole(offset, len)
    }
}

#[test]
fn an_issued_trim_weighs_in_least_weighted_dispatch_until_it_is_done() {
    // Trims listed by the scheduler are not requests yet and weigh nothing (they live in
    // the allocator, not here); a trim issued counts on its member from the call to its
    // return, so segments go elsewhere meanwhile (LOCS's erase in a channel's queue).
    let (entered_tx, entered_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel();
    let gated = Arc::new(PunchGate {
        inner: MemStorage::new(),
        entered: Mutex::new(entered_tx),
        go: Mutex::new(go_rx),
    });
    let mems = mems(3);
    let mut members = named(&mems);
    members[1].1 = gated.clone();
    let set = Arc::new(
        MemberSet::open(members, true)
            .unwrap()
            .with_policy(DispatchPolicy::LeastWeightedQueue),
    );
    assert!(set.member_stats().iter().all(|m| m.weighted_queue_ps == 0));
    let trimming = {
        let set = Arc::clone(&set);
        // Member 1's first group, past its slot header.
        std::thread::spawn(move || set.punch_hole(SLOT_BYTES + (1 << 20), 4 << 20))
    };
    entered_rx.recv().unwrap();
    let during = set.member_stats();
    assert_eq!(during[1].in_flight_bytes, 4 << 20, "{during:?}");
    assert!(during[1].weighted_queue_ps > 0 && during[0].weighted_queue_ps == 0);
    let picks: Vec<Option<usize>> = (0..4).map(|_| set.dispatch_member(None, &[])).collect();
    assert!(!picks.contains(&Some(1)), "{picks:?}");
    go_tx.send(()).unwrap();
    trimming.join().unwrap().unwrap();
    let after = set.member_stats();
    assert_eq!(
        (after[1].in_flight_bytes, after[1].weighted_queue_ps),
        (0, 0)
    );
    let picks: Vec<Option<usize>> = (0..3).map(|_| set.dispatch_member(None, &[])).collect();
    assert!(picks.contains(&Some(1)), "{picks:?}");
}

/// Memory storage whose `sync` waits while its gate is closed, counting finished syncs.
#[derive(Default)]
struct GatedSync {
    inner: MemStorage,
    gate_closed: AtomicBool,
    started: AtomicU64,
    finished: AtomicU64,
}

impl Storage for GatedSync {
    fn len_bytes(&self) -> Result<u64> {
        self.inner.len_bytes()
    }
    fn grow(&self, len_bytes: u64) -> Result<()> {
        self.inner.grow(len_bytes)
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.inner.write_at(offset, data)
    }
    fn sync(&self) -> Result<()> {
        self.started.fetch_add(1, Ordering::SeqCst);
        while self.gate_closed.load(Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        self.finished.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// A commit's sync and a group sync run side by side (pipelined group commit, issue 22).
/// The member set used to clear a member's dirty flag and then `fdatasync` it; a second
/// sync arriving in between found every member clean and returned at once, while the
/// first one's `fdatasync`, the only one covering a write that completed before both
/// calls, was still running: a write acknowledged before it was durable. Now the second
/// sync waits for the `fdatasync` in flight.
#[test]
fn a_sync_waits_for_a_members_fdatasync_another_caller_has_in_flight() {
    let gated = Arc::new(GatedSync::default());
    let members: Vec<(String, Arc<dyn Storage>)> = vec![
        ("m0".into(), Arc::new(MemStorage::new())),
        ("m1".into(), gated.clone()),
    ];
    let set = Arc::new(MemberSet::open(members, true).unwrap());
    set.sync().unwrap();
    let before = gated.finished.load(Ordering::SeqCst);
    set.write_at(SLOT_BYTES + 10, b"on member 1").unwrap();
    gated.gate_closed.store(true, Ordering::SeqCst);
    let first = {
        let set = set.clone();
        std::thread::spawn(move || set.sync())
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while gated.started.load(Ordering::SeqCst) < before + 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the first sync never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(!set.members[1].dirty.load(Ordering::SeqCst));
    let second = {
        let (set, gated) = (set.clone(), gated.clone());
        std::thread::spawn(move || {
            set.sync().unwrap();
            // What the second sync's caller may now acknowledge must be durable.
            gated.finished.load(Ordering::SeqCst)
        })
    };
    // Give the second sync time to (wrongly) return while the first is held.
    std::thread::sleep(std::time::Duration::from_millis(50));
    gated.gate_closed.store(false, Ordering::SeqCst);
    first.join().unwrap().unwrap();
    let finished_when_second_returned = second.join().unwrap();
    assert_eq!(finished_when_second_returned, before + 1);
    // Nothing was written since: the second sync ran no `fdatasync` of its own.
    assert_eq!(gated.started.load(Ordering::SeqCst), before + 1);
}
