//! Allocator tests over a sparse in-memory storage.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

const MIB: u64 = 1 << 20;

/// A volume in memory that stores only the blocks written, so tests can grow it to many
/// groups cheaply. Unwritten bytes read as zero.
struct SparseStorage {
    inner: Mutex<Sparse>,
    fail_grow: AtomicBool,
}

struct Sparse {
    len_bytes: u64,
    blocks: HashMap<u64, Box<[u8]>>,
}

impl SparseStorage {
    fn new(len_bytes: u64) -> SparseStorage {
        SparseStorage {
            inner: Mutex::new(Sparse {
                len_bytes,
                blocks: HashMap::new(),
            }),
            fail_grow: AtomicBool::new(false),
        }
    }

    /// Calls `f(block, offset_in_block, buf_range)` for each block the range touches.
    fn pieces(offset: u64, len: usize, mut f: impl FnMut(u64, usize, std::ops::Range<usize>)) {
        let mut done = 0;
        while done < len {
            let at = offset + done as u64;
            let in_block = (at % BLOCK_BYTES) as usize;
            let n = (BLOCK_BYTES as usize - in_block).min(len - done);
            f(at / BLOCK_BYTES, in_block, done..done + n);
            done += n;
        }
    }

    fn check_range(inner: &Sparse, offset: u64, len: usize) -> Result<()> {
        if offset + len as u64 > inner.len_bytes {
            return Err(Error::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "past the end of the test volume",
            )));
        }
        Ok(())
    }

    fn flip_bit(&self, offset: u64, bit: u8) {
        let mut byte = [0u8];
        self.read_at(offset, &mut byte).expect("inside the volume");
        byte[0] ^= 1 << bit;
        self.write_at(offset, &byte).expect("inside the volume");
    }
}

impl Storage for SparseStorage {
    fn len_bytes(&self) -> Result<u64> {
        Ok(self.inner.lock().len_bytes)
    }

    fn grow(&self, len_bytes: u64) -> Result<()> {
        if self.fail_grow.load(Ordering::Relaxed) {
            return Err(Error::Io(std::io::Error::other("injected grow failure")));
        }
        let mut inner = self.inner.lock();
        inner.len_bytes = inner.len_bytes.max(len_bytes);
        Ok(())
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let inner = self.inner.lock();
        Self::check_range(&inner, offset, buf.len())?;
        Self::pieces(offset, buf.len(), |block, at, range| {
            let n = range.len();
            match inner.blocks.get(&block) {
                Some(bytes) => buf[range].copy_from_slice(&bytes[at..at + n]),
                None => buf[range].fill(0),
            }
        });
        Ok(())
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        let mut inner = self.inner.lock();
        Self::check_range(&inner, offset, data.len())?;
        Self::pieces(offset, data.len(), |block, at, range| {
            let bytes = inner
                .blocks
                .entry(block)
                .or_insert_with(|| vec![0u8; BLOCK_BYTES as usize].into_boxed_slice());
            bytes[at..at + range.len()].copy_from_slice(&data[range]);
        });
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        Ok(())
    }
}

fn new_volume(volume_bytes: u64) -> (SparseStorage, Allocator) {
    (
        SparseStorage::new(volume_bytes),
        Allocator::create(volume_bytes),
    )
}

fn write_images(storage: &SparseStorage, commit: &BitmapCommit) {
    for (offset, bytes) in &commit.writes {
        storage
            .write_at(offset.0, &bytes[..])
            .expect("buddy inside the volume");
    }
}

/// Runs a whole successful commit with no concurrent allocations; returns what it wrote.
fn commit(storage: &SparseStorage, alloc: &Allocator, epoch: u64) -> BitmapCommit {
    alloc.begin_commit();
    let images = alloc.commit_images(CommitEpoch(epoch));
    write_images(storage, &images);
    alloc.end_commit(true);
    images
}

/// Allocated blocks inside the volume.
fn live_set(alloc: &Allocator) -> BTreeSet<u64> {
    let st = alloc.state.lock();
    st.assert_consistent();
    let mut set = BTreeSet::new();
    for (g, group) in st.groups.iter().enumerate() {
        for block in 0..st.end_in_group(g) {
            if group.bits[(block / 64) as usize] & (1 << (block % 64)) != 0 {
                set.insert(g as u64 * GROUP_BLOCKS + block);
            }
        }
    }
    set
}

fn reserved_blocks(groups: std::ops::Range<u64>) -> impl Iterator<Item = u64> {
    groups.flat_map(|g| g * GROUP_BLOCKS..g * GROUP_BLOCKS + GROUP_RESERVED_BLOCKS)
}

fn block_of(offset: DiskOffset) -> u64 {
    assert!(offset.block_aligned());
    offset.0 / BLOCK_BYTES
}

fn assert_corruption_at<T: fmt::Debug>(result: Result<T>, offset: DiskOffset) {
    match result {
        Err(Error::Corruption { offset: at, .. }) => assert_eq!(at, offset),
        other => panic!("expected a corruption error at {offset}, got {other:?}"),
    }
}

#[test]
fn allocator_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Allocator>();
}

#[test]
fn fresh_volume_has_only_reserved_blocks_allocated() {
    let alloc = Allocator::create(2 * GROUP_BYTES + 100 * BLOCK_BYTES);
    assert_eq!(alloc.volume_bytes(), 2 * GROUP_BYTES + 100 * BLOCK_BYTES);
    assert_eq!(alloc.allocated_blocks(), 3 * GROUP_RESERVED_BLOCKS);
    assert_eq!(live_set(&alloc), reserved_blocks(0..3).collect());
    assert_eq!(alloc.slots(), vec![1, 1, 1]);
    // Blocks past the end count as allocated; the last data block does not.
    let end = DiskOffset(alloc.volume_bytes());
    assert!(alloc.is_allocated(end, 10));
    assert!(!alloc.is_allocated(DiskOffset(end.0 - BLOCK_BYTES), 1));
    assert!(!volume_bytes_valid(GROUP_BYTES + 3 * BLOCK_BYTES));
    assert!(!volume_bytes_valid(7 * BLOCK_BYTES));
    assert!(!volume_bytes_valid(GROUP_BYTES + 1));
}

#[test]
fn allocate_release_and_reallocate() {
    let (storage, alloc) = new_volume(64 * BLOCK_BYTES);
    let a = alloc.allocate(&storage, 10, 1, false).unwrap();
    let b = alloc.allocate(&storage, 10, 1, false).unwrap();
    assert_eq!((block_of(a), block_of(b)), (8, 18));
    assert!(alloc.is_allocated(a, 10) && alloc.is_allocated(b, 10));
    assert_eq!(alloc.allocated_blocks(), 8 + 20);
    alloc.release(a, 10);
    assert!(!alloc.is_allocated(a, 1));
    assert_eq!(alloc.allocated_blocks(), 8 + 10);
    // Next fit: the cursor goes on past `b` before it wraps around to the freed run.
    let c = alloc.allocate(&storage, 30, 1, false).unwrap();
    assert_eq!(block_of(c), 28);
    let d = alloc.allocate(&storage, 10, 1, false).unwrap();
    assert_eq!(block_of(d), 8, "wraps around to the freed run");
    assert_eq!(alloc.volume_bytes(), 64 * BLOCK_BYTES, "no growth needed");
    // 58..64 is free (6 blocks); 7 blocks only fit after growth.
    let e = alloc.allocate(&storage, 6, 1, false).unwrap();
    assert_eq!(block_of(e), 58);
    assert_eq!(alloc.allocated_blocks(), 64);
    let f = alloc.allocate(&storage, 7, 1, false).unwrap();
    assert_eq!(block_of(f), 64, "the run starts where the volume ended");
    assert_eq!(alloc.volume_bytes(), 64 * BLOCK_BYTES + GROWTH_MIN_BYTES);
    assert_eq!(storage.len_bytes().unwrap(), alloc.volume_bytes());
    live_set(&alloc);
}

#[test]
fn runs_are_aligned() {
    let (storage, alloc) = new_volume(GROUP_BYTES);
    alloc.allocate(&storage, 1, 1, false).unwrap();
    for align in [1, 2, 16, 64, 512, 4096] {
        for blocks in [1, 3, align] {
            let at = block_of(alloc.allocate(&storage, blocks, align, false).unwrap());
            assert_eq!(
                at % align,
                0,
                "run of {blocks} aligned to {align} at block {at}"
            );
            assert!(alloc.is_allocated(DiskOffset(at * BLOCK_BYTES), blocks));
        }
    }
    live_set(&alloc);
}

#[test]
fn runs_never_touch_reserved_blocks_or_cross_groups() {
    let (storage, alloc) = new_volume(2 * GROUP_BYTES);
    let mut seen = BTreeSet::new();
    for i in 0..200u64 {
        let blocks = 700 + (i * 37) % 900;
        let at = block_of(alloc.allocate(&storage, blocks, 1, false).unwrap());
        let in_group = at % GROUP_BLOCKS;
        assert!(
            in_group >= GROUP_RESERVED_BLOCKS,
            "run at reserved block {at}"
        );
        assert!(
            in_group + blocks <= GROUP_BLOCKS,
            "run {at}+{blocks} crosses a group"
        );
        for b in at..at + blocks {
            assert!(seen.insert(b), "block {b} handed out twice");
        }
    }
    assert!(
        alloc.volume_bytes() > 2 * GROUP_BYTES,
        "the test should have grown the volume"
    );
    let groups = group_count(alloc.volume_bytes());
    for block in reserved_blocks(0..groups) {
        assert!(!seen.contains(&block));
        assert!(alloc.is_allocated(DiskOffset(block * BLOCK_BYTES), 1));
    }
    live_set(&alloc);
}

#[test]
fn growth_adds_an_eighth_or_16_mib_and_what_the_run_needs() {
    // 16 MiB minimum on a small volume.
    let (storage, alloc) = new_volume(64 * BLOCK_BYTES);
    alloc.allocate(&storage, 100, 1, false).unwrap();
    assert_eq!(alloc.volume_bytes(), 64 * BLOCK_BYTES + 16 * MIB);

    // A full group: one eighth of 8 groups is one group, and the run needs all of it.
    let (storage, alloc) = new_volume(8 * GROUP_BYTES);
    let data_blocks = GROUP_BLOCKS - GROUP_RESERVED_BLOCKS;
    for g in 0..8 {
        let at = block_of(alloc.allocate(&storage, data_blocks, 1, false).unwrap());
        assert_eq!(at, g * GROUP_BLOCKS + GROUP_RESERVED_BLOCKS);
    }
    assert_eq!(alloc.volume_bytes(), 8 * GROUP_BYTES);
    let at = block_of(alloc.allocate(&storage, data_blocks, 1, false).unwrap());
    assert_eq!(at, 8 * GROUP_BLOCKS + GROUP_RESERVED_BLOCKS);
    assert_eq!(alloc.volume_bytes(), 9 * GROUP_BYTES);
    assert_eq!(storage.len_bytes().unwrap(), 9 * GROUP_BYTES);

    // A run bigger than the policy's growth gets the space it needs.
    let (storage, alloc) = new_volume(64 * BLOCK_BYTES);
    let at = block_of(alloc.allocate(&storage, 20_000, 1, false).unwrap());
    assert_eq!(
        at, GROUP_RESERVED_BLOCKS,
        "the free tail of the volume is used"
    );
    assert_eq!(
        alloc.volume_bytes(),
        (GROUP_RESERVED_BLOCKS + 20_000) * BLOCK_BYTES
    );
}

#[test]
fn growth_across_several_groups_then_commit_and_load() {
    let (storage, alloc) = new_volume(64 * BLOCK_BYTES);
    let mut runs = Vec::new();
    for _ in 0..5 {
        runs.push(alloc.allocate(&storage, 30_000, 1, false).unwrap());
    }
    let groups = group_count(alloc.volume_bytes());
    assert!(groups >= 5, "{groups} groups");
    for (i, run) in runs.iter().enumerate() {
        let at = block_of(*run);
        assert_eq!(at / GROUP_BLOCKS, i as u64, "one run per group");
        assert!(alloc.is_allocated(*run, 30_000));
    }
    assert_eq!(alloc.slots().len() as u64, groups);
    let expected = live_set(&alloc);
    assert_eq!(expected.len() as u64, alloc.allocated_blocks());
    assert!(reserved_blocks(0..groups).all(|b| expected.contains(&b)));

    let images = commit(&storage, &alloc, 1);
    assert_eq!(
        images.writes.len() as u64,
        groups,
        "every new group is in the first image"
    );
    assert_eq!(images.volume_bytes, alloc.volume_bytes());
    let loaded =
        Allocator::load(&storage, images.volume_bytes, &images.slots, CommitEpoch(1)).unwrap();
    assert_eq!(live_set(&loaded), expected);
    assert_eq!(loaded.allocated_blocks(), alloc.allocated_blocks());
}

#[test]
fn commit_images_exclude_post_seal_runs_and_buddies_alternate() {
    let (storage, alloc) = new_volume(2 * GROUP_BYTES);
    let first = commit(&storage, &alloc, 1);
    assert_eq!(
        first.slots,
        vec![0, 0],
        "the first image of every group goes to buddy A"
    );
    assert_eq!(
        first.writes.iter().map(|w| w.0).collect::<Vec<_>>(),
        vec![buddy_offset(0, 0), buddy_offset(1, 0)]
    );
    assert_eq!(alloc.slots(), vec![0, 0]);

    let before_seal = alloc.allocate(&storage, 8, 1, true).unwrap(); // no commit running: plain
    alloc.begin_commit();
    let next_epoch = alloc.allocate(&storage, 512, 512, true).unwrap();
    let nodes = alloc.allocate(&storage, 4, 1, false).unwrap();
    let images = alloc.commit_images(CommitEpoch(2));
    write_images(&storage, &images);
    alloc.end_commit(true);
    assert_eq!(images.writes.len(), 1, "only group 0 changed");
    assert_eq!(
        images.writes[0].0,
        buddy_offset(0, 1),
        "group 0 alternates to buddy B"
    );
    assert_eq!(images.slots, vec![1, 0]);
    assert_eq!(alloc.slots(), vec![1, 0]);

    let loaded =
        Allocator::load(&storage, images.volume_bytes, &images.slots, CommitEpoch(2)).unwrap();
    assert!(loaded.is_allocated(before_seal, 8));
    assert!(loaded.is_allocated(nodes, 4));
    assert!(
        !loaded.is_allocated(next_epoch, 1),
        "post-seal run leaked into the image"
    );
    assert!(
        alloc.is_allocated(next_epoch, 512),
        "the live state keeps it"
    );

    // Group 0 stayed changed because of the left-out run; the next commit has it, in A.
    let third = commit(&storage, &alloc, 3);
    assert_eq!(
        third.writes.iter().map(|w| w.0).collect::<Vec<_>>(),
        vec![buddy_offset(0, 0)]
    );
    let loaded =
        Allocator::load(&storage, third.volume_bytes, &third.slots, CommitEpoch(3)).unwrap();
    assert_eq!(live_set(&loaded), live_set(&alloc));
    // Buddy B still holds epoch 2's image, intact.
    let mut buf = vec![0u8; BUDDY_BYTES];
    storage.read_at(buddy_offset(0, 1).0, &mut buf).unwrap();
    assert_eq!(
        decode_buddy(&buf, 0, buddy_offset(0, 1)).unwrap().epoch,
        CommitEpoch(2)
    );

    // Nothing changed: nothing to write.
    let fourth = commit(&storage, &alloc, 4);
    assert!(fourth.writes.is_empty());
    assert_eq!(fourth.slots, vec![0, 0]);
}

#[test]
fn changes_after_the_image_wait_for_the_next_commit() {
    let (storage, alloc) = new_volume(2 * GROUP_BYTES);
    commit(&storage, &alloc, 1);
    alloc.begin_commit();
    let images = alloc.commit_images(CommitEpoch(2));
    assert!(images.writes.is_empty());
    let late = alloc.allocate(&storage, 3, 1, false).unwrap();
    alloc.end_commit(true);
    let next = commit(&storage, &alloc, 3);
    assert_eq!(next.writes.len(), 1);
    let loaded = Allocator::load(&storage, next.volume_bytes, &next.slots, CommitEpoch(3)).unwrap();
    assert!(loaded.is_allocated(late, 3));
}

#[test]
fn released_post_seal_blocks_taken_again_before_the_image_are_kept() {
    let (storage, alloc) = new_volume(GROUP_BYTES);
    commit(&storage, &alloc, 1);
    alloc.begin_commit();
    let run = alloc.allocate(&storage, 16, 1, true).unwrap();
    alloc.release(run, 16);
    assert!(alloc.mark_allocated(run.plus_bytes(4 * BLOCK_BYTES), 8));
    let images = alloc.commit_images(CommitEpoch(2));
    write_images(&storage, &images);
    alloc.end_commit(true);
    let loaded =
        Allocator::load(&storage, images.volume_bytes, &images.slots, CommitEpoch(2)).unwrap();
    assert!(loaded.is_allocated(run.plus_bytes(4 * BLOCK_BYTES), 8));
    assert!(!loaded.is_allocated(run, 1));
}

#[test]
fn failed_commit_leaves_slots_and_changes_in_place() {
    let (storage, alloc) = new_volume(3 * GROUP_BYTES);
    commit(&storage, &alloc, 1);
    let run = alloc.allocate(&storage, 100, 1, false).unwrap();

    alloc.begin_commit();
    let failed = alloc.commit_images(CommitEpoch(2));
    write_images(&storage, &failed);
    alloc.end_commit(false);
    assert_eq!(failed.slots, vec![1, 0, 0]);
    assert_eq!(
        alloc.slots(),
        vec![0, 0, 0],
        "a failed commit changes no slot"
    );

    // Epoch 1's images are still what the durable state names.
    let durable = Allocator::load(
        &storage,
        alloc.volume_bytes(),
        &alloc.slots(),
        CommitEpoch(1),
    )
    .unwrap();
    assert!(!durable.is_allocated(run, 1));

    // The retry writes the same group to the same buddy.
    let retry = commit(&storage, &alloc, 3);
    assert_eq!(
        retry.writes.iter().map(|w| w.0).collect::<Vec<_>>(),
        vec![buddy_offset(0, 1)]
    );
    assert_eq!(alloc.slots(), vec![1, 0, 0]);
    let loaded =
        Allocator::load(&storage, retry.volume_bytes, &retry.slots, CommitEpoch(3)).unwrap();
    assert!(loaded.is_allocated(run, 100));

    // A commit abandoned before its images changes nothing either.
    alloc.begin_commit();
    alloc.end_commit(false);
    assert_eq!(alloc.slots(), vec![1, 0, 0]);
}

#[test]
fn corrupt_buddies_are_errors_naming_the_buddy() {
    let (storage, alloc) = new_volume(2 * GROUP_BYTES);
    alloc.allocate(&storage, 1000, 1, false).unwrap();
    let images = commit(&storage, &alloc, 5);
    let load = |committed: u64| {
        Allocator::load(
            &storage,
            images.volume_bytes,
            &images.slots,
            CommitEpoch(committed),
        )
    };
    load(5).expect("intact volume loads");

    // A bit flip anywhere in either group's current buddy (the buddy tests flip every bit).
    let mut rng = StdRng::seed_from_u64(7);
    for _ in 0..64 {
        let group = rng.random_range(0..2u64);
        let buddy = buddy_offset(group, images.slots[group as usize]);
        let at = buddy.0 + rng.random_range(0..BUDDY_BYTES as u64);
        let bit = rng.random_range(0..8u8);
        storage.flip_bit(at, bit);
        assert_corruption_at(load(5), buddy);
        storage.flip_bit(at, bit);
    }
    load(5).expect("restored volume loads");

    // A buddy from a commit that never became durable.
    assert_corruption_at(load(4), buddy_offset(0, 0));

    // Well-formed buddies that leave reserved blocks, or blocks past the end, free.
    let mut bits = bitmap::zeroed();
    bitmap::set_range(&mut bits, 1, GROUP_RESERVED_BLOCKS);
    storage
        .write_at(
            buddy_offset(1, 0).0,
            &encode_buddy(1, CommitEpoch(5), &bits)[..],
        )
        .unwrap();
    assert_corruption_at(load(5), buddy_offset(1, 0));
    let short_volume = GROUP_BYTES + 100 * BLOCK_BYTES;
    let mut bits = bitmap::zeroed();
    bitmap::set_range(&mut bits, 0, GROUP_RESERVED_BLOCKS);
    storage
        .write_at(
            buddy_offset(1, 0).0,
            &encode_buddy(1, CommitEpoch(5), &bits)[..],
        )
        .unwrap();
    assert_corruption_at(
        Allocator::load(&storage, short_volume, &images.slots, CommitEpoch(5)),
        buddy_offset(1, 0),
    );

    // A buddy written to the other group's place (misdirected write).
    storage
        .write_at(buddy_offset(1, 0).0, &images.writes[0].1[..])
        .unwrap();
    assert_corruption_at(load(5), buddy_offset(1, 0));

    // A never-written buddy.
    assert_corruption_at(
        Allocator::load(&storage, images.volume_bytes, &[0, 1], CommitEpoch(5)),
        buddy_offset(1, 1),
    );
}

#[test]
fn bad_descriptor_fields_are_errors() {
    let (storage, alloc) = new_volume(2 * GROUP_BYTES);
    let images = commit(&storage, &alloc, 1);
    let vb = images.volume_bytes;
    let corrupt =
        |r: Result<Allocator>| assert!(matches!(r, Err(Error::Corruption { .. })), "{r:?}");
    corrupt(Allocator::load(&storage, vb, &[0], CommitEpoch(1)));
    corrupt(Allocator::load(&storage, vb, &[0, 2], CommitEpoch(1)));
    corrupt(Allocator::load(&storage, vb + 1, &[0, 0], CommitEpoch(1)));
    corrupt(Allocator::load(
        &storage,
        vb + 3 * BLOCK_BYTES,
        &[0, 0, 0],
        CommitEpoch(1),
    ));
    corrupt(Allocator::load(
        &storage,
        vb + 64 * BLOCK_BYTES,
        &[0, 0, 0],
        CommitEpoch(1),
    ));
}

#[test]
fn failed_growth_changes_nothing() {
    let (storage, alloc) = new_volume(64 * BLOCK_BYTES);
    alloc.allocate(&storage, 50, 1, false).unwrap();
    storage.fail_grow.store(true, Ordering::Relaxed);
    assert!(matches!(
        alloc.allocate(&storage, 10, 1, false),
        Err(Error::Io(_))
    ));
    assert!(
        alloc.allocate_up_to(&storage, 10).is_ok(),
        "6 blocks are still free"
    );
    assert!(matches!(
        alloc.allocate_up_to(&storage, 10),
        Err(Error::Io(_))
    ));
    assert_eq!(alloc.volume_bytes(), 64 * BLOCK_BYTES);
    assert_eq!(alloc.allocated_blocks(), 64);
    assert_eq!(alloc.slots().len(), 1);
    storage.fail_grow.store(false, Ordering::Relaxed);
    assert_eq!(
        block_of(alloc.allocate(&storage, 10, 1, false).unwrap()),
        64
    );
    live_set(&alloc);
}

#[test]
fn allocate_up_to_takes_the_first_free_run() {
    let (storage, alloc) = new_volume(GROUP_BYTES);
    let a = alloc.allocate(&storage, 10, 1, false).unwrap();
    let b = alloc.allocate(&storage, 10, 1, false).unwrap();
    alloc.allocate(&storage, 10, 1, false).unwrap();
    alloc.release(b, 10);
    // The cursor is past the third run; the free tail of the group is long.
    let (at, blocks) = alloc.allocate_up_to(&storage, 5000).unwrap();
    assert_eq!((block_of(at), blocks), (38, 5000));
    // Exhaust the group's tail, then wrap around to the hole `b` left.
    let (_, blocks) = alloc.allocate_up_to(&storage, 100_000).unwrap();
    assert_eq!(blocks, GROUP_BLOCKS - 5038);
    assert_eq!(alloc.allocate_up_to(&storage, 4).unwrap(), (b, 4));
    alloc.release(a, 10);
    // From the cursor (inside b's hole): the rest of that hole, then around to a's.
    assert_eq!(
        alloc.allocate_up_to(&storage, 50).unwrap(),
        (b.plus_bytes(4 * BLOCK_BYTES), 6)
    );
    assert_eq!(alloc.allocate_up_to(&storage, 50).unwrap(), (a, 10));
    assert_eq!(alloc.volume_bytes(), GROUP_BYTES);
    let (at, _) = alloc.allocate_up_to(&storage, 50).unwrap();
    assert_eq!(
        block_of(at),
        GROUP_BLOCKS + GROUP_RESERVED_BLOCKS,
        "grew into a new group"
    );
}

#[test]
fn mark_allocated_reports_overlaps() {
    let (storage, alloc) = new_volume(GROUP_BYTES - 1000 * BLOCK_BYTES);
    let run = alloc.allocate(&storage, 10, 1, false).unwrap();
    assert!(
        !alloc.mark_allocated(run.plus_bytes(5 * BLOCK_BYTES), 10),
        "overlaps the run"
    );
    assert!(alloc.is_allocated(run, 15));
    assert!(!alloc.is_allocated(run, 16));
    assert!(alloc.mark_allocated(DiskOffset(1000 * BLOCK_BYTES), 3));
    assert!(
        !alloc.mark_allocated(DiskOffset(1000 * BLOCK_BYTES), 1),
        "already marked"
    );
    assert!(!alloc.mark_allocated(DiskOffset(0), 1), "reserved");
    assert!(
        !alloc.mark_allocated(DiskOffset(5000 * BLOCK_BYTES + 1), 1),
        "unaligned"
    );
    assert!(!alloc.is_allocated(DiskOffset(5000 * BLOCK_BYTES), 1));
    let end = alloc.volume_bytes();
    assert!(
        !alloc.mark_allocated(DiskOffset(end - 2 * BLOCK_BYTES), 4),
        "runs past the end"
    );
    assert!(alloc.is_allocated(DiskOffset(end - 2 * BLOCK_BYTES), 2));
    assert!(
        !alloc.mark_allocated(DiskOffset(u64::MAX - 4095), u64::MAX),
        "far past the end"
    );
    assert_eq!(alloc.allocated_blocks(), 8 + 15 + 3 + 2);
    live_set(&alloc);
}

#[test]
#[should_panic(expected = "double free")]
fn double_free_panics() {
    let (storage, alloc) = new_volume(GROUP_BYTES);
    let run = alloc.allocate(&storage, 4, 1, false).unwrap();
    alloc.release(run, 4);
    alloc.release(run, 4);
}

#[test]
#[should_panic(expected = "reserved block")]
fn releasing_reserved_blocks_panics() {
    let alloc = Allocator::create(GROUP_BYTES);
    alloc.release(DiskOffset(2 * BLOCK_BYTES), 2);
}

#[test]
fn concurrent_allocations_are_disjoint() {
    let (storage, alloc) = new_volume(64 * BLOCK_BYTES);
    let runs: Vec<Vec<(DiskOffset, u64)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4u64)
            .map(|t| {
                let (storage, alloc) = (&storage, &alloc);
                scope.spawn(move || {
                    (0..200u64)
                        .map(|i| {
                            let blocks = 1 + (t + i) % 7;
                            (
                                alloc.allocate(storage, blocks, 1, i % 2 == 0).unwrap(),
                                blocks,
                            )
                        })
                        .collect()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut seen = BTreeSet::new();
    for (offset, blocks) in runs.into_iter().flatten() {
        for b in block_of(offset)..block_of(offset) + blocks {
            assert!(seen.insert(b), "block {b} handed out twice");
        }
    }
    assert_eq!(
        alloc.allocated_blocks(),
        seen.len() as u64 + GROUP_RESERVED_BLOCKS
    );
}

/// Random operation sequences against a model (a set of allocated blocks), with commits
/// (some failing) whose images are loaded back and compared with what the model says they
/// must hold.
#[test]
fn random_operations_match_a_model() {
    for seed in 0..4 {
        run_model(seed, 1500);
    }
}

fn run_model(seed: u64, steps: usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    let (storage, alloc) = new_volume(64 * BLOCK_BYTES);
    let mut model: BTreeSet<u64> = reserved_blocks(0..1).collect();
    let mut groups = 1;
    let mut runs: Vec<(u64, u64)> = Vec::new();
    // Post-seal runs of the running commit that are still allocated.
    let mut post_seal: Vec<(u64, u64)> = Vec::new();
    let mut committing = false;
    let mut epoch = 0;
    let mut durable: Option<(BitmapCommit, BTreeSet<u64>, u64)> = None;

    for step in 0..steps {
        let ctx = format!("seed {seed} step {step}");
        match rng.random_range(0..100) {
            0..40 => {
                let blocks = if rng.random_bool(0.1) {
                    rng.random_range(1..=4000)
                } else {
                    rng.random_range(1..=64)
                };
                let align = [1, 2, 8, 64, 512][rng.random_range(0..5)];
                let sealed = committing && rng.random_bool(0.5);
                let at = block_of(alloc.allocate(&storage, blocks, align, sealed).unwrap());
                assert_eq!(at % align, 0, "{ctx}");
                assert!(at % GROUP_BLOCKS >= GROUP_RESERVED_BLOCKS, "{ctx}");
                assert!(at % GROUP_BLOCKS + blocks <= GROUP_BLOCKS, "{ctx}");
                assert!(at + blocks <= alloc.volume_bytes() / BLOCK_BYTES, "{ctx}");
                for b in at..at + blocks {
                    assert!(model.insert(b), "{ctx}: block {b} handed out twice");
                }
                runs.push((at, blocks));
                if sealed {
                    post_seal.push((at, blocks));
                }
            }
            40..50 => {
                let max = rng.random_range(1..=200);
                let (offset, blocks) = alloc.allocate_up_to(&storage, max).unwrap();
                let at = block_of(offset);
                assert!((1..=max).contains(&blocks), "{ctx}");
                assert!(at % GROUP_BLOCKS + blocks <= GROUP_BLOCKS, "{ctx}");
                for b in at..at + blocks {
                    assert!(model.insert(b), "{ctx}: block {b} handed out twice");
                }
                runs.push((at, blocks));
            }
            50..80 if !runs.is_empty() => {
                let (at, blocks) = runs.swap_remove(rng.random_range(0..runs.len()));
                alloc.release(DiskOffset(at * BLOCK_BYTES), blocks);
                for b in at..at + blocks {
                    assert!(model.remove(&b), "{ctx}");
                }
                post_seal.retain(|&run| run != (at, blocks));
            }
            80..85 => {
                let volume_blocks = alloc.volume_bytes() / BLOCK_BYTES;
                let at = rng.random_range(0..volume_blocks + 10);
                let blocks = rng.random_range(1..=8);
                let fresh =
                    at + blocks <= volume_blocks && (at..at + blocks).all(|b| !model.contains(&b));
                assert_eq!(
                    alloc.mark_allocated(DiskOffset(at * BLOCK_BYTES), blocks),
                    fresh,
                    "{ctx}"
                );
                model.extend((at..at + blocks).filter(|&b| b < volume_blocks));
            }
            85..90 => {
                let volume_blocks = alloc.volume_bytes() / BLOCK_BYTES;
                let at = rng.random_range(0..volume_blocks + 10);
                let blocks = rng.random_range(0..=8);
                let expected = (at..at + blocks).all(|b| b >= volume_blocks || model.contains(&b));
                assert_eq!(
                    alloc.is_allocated(DiskOffset(at * BLOCK_BYTES), blocks),
                    expected,
                    "{ctx}"
                );
            }
            90..95 if !committing => {
                alloc.begin_commit();
                committing = true;
                post_seal.clear();
            }
            95..100 if committing => {
                epoch += 1;
                let images = alloc.commit_images(CommitEpoch(epoch));
                let mut expected = model.clone();
                for &(at, blocks) in &post_seal {
                    for b in at..at + blocks {
                        expected.remove(&b);
                    }
                }
                write_images(&storage, &images);
                // Changes between the image and the end of the commit are allowed.
                if rng.random_bool(0.3) {
                    let at = block_of(alloc.allocate(&storage, 3, 1, false).unwrap());
                    model.extend(at..at + 3);
                    runs.push((at, 3));
                }
                let ok = rng.random_bool(0.8);
                alloc.end_commit(ok);
                committing = false;
                if ok {
                    assert_eq!(
                        alloc.slots()[..images.slots.len()],
                        images.slots[..],
                        "{ctx}"
                    );
                    durable = Some((images, expected, epoch));
                } else if let Some((images, _, _)) = &durable {
                    assert_eq!(
                        alloc.slots()[..images.slots.len()],
                        images.slots[..],
                        "{ctx}"
                    );
                }
                if let Some((images, expected, epoch)) = &durable {
                    let loaded = Allocator::load(
                        &storage,
                        images.volume_bytes,
                        &images.slots,
                        CommitEpoch(*epoch),
                    )
                    .unwrap_or_else(|e| panic!("{ctx}: {e}"));
                    assert_eq!(&live_set(&loaded), expected, "{ctx}: loaded image");
                }
            }
            _ => {}
        }
        let now_groups = group_count(alloc.volume_bytes());
        model.extend(reserved_blocks(groups..now_groups));
        groups = now_groups;
        assert_eq!(alloc.allocated_blocks(), model.len() as u64, "{ctx}");
        if step % 100 == 0 {
            assert_eq!(live_set(&alloc), model, "{ctx}");
        }
    }
    assert_eq!(live_set(&alloc), model);
    assert!(
        groups > 1,
        "seed {seed}: the run should have grown past one group"
    );
}

/// Blocks freed one at a time in separate batches (index nodes come back like that) are
/// punched once they form a run long enough, merged with the free blocks around them;
/// an allocated block is never punched.
#[test]
fn release_punching_merges_runs_freed_one_block_at_a_time() {
    let (storage, alloc) = new_volume(256 * BLOCK_BYTES);
    // 8 reserved blocks, then 40 single-block allocations at blocks 8..48, then a
    // neighbour that stays allocated.
    let singles: Vec<DiskOffset> = (0..40)
        .map(|_| alloc.allocate(&storage, 1, 1, false).unwrap())
        .collect();
    let kept = alloc.allocate(&storage, 1, 1, false).unwrap();
    assert_eq!(block_of(singles[0]), 8);
    assert_eq!(block_of(kept), 48);
    let mut punched: Vec<(u64, u64)> = Vec::new();
    for (i, off) in singles.iter().enumerate() {
        let mut batch = Vec::new();
        alloc.release_punching(&[(*off, 1)], 16, false, &mut |at, len| {
            batch.push((at, len))
        });
        if i + 1 < 16 {
            assert!(
                batch.is_empty(),
                "punched {batch:?} with {} blocks free",
                i + 1
            );
        } else {
            // The whole free run from the reserved blocks to here, in one call.
            assert_eq!(batch, vec![(8 * BLOCK_BYTES, (i as u64 + 1) * BLOCK_BYTES)]);
        }
        punched.extend(batch);
    }
    for (at, len) in &punched {
        let (lo, hi) = (at / BLOCK_BYTES, (at + len) / BLOCK_BYTES);
        assert!(
            lo >= GROUP_RESERVED_BLOCKS && hi <= block_of(kept),
            "{lo}..{hi}"
        );
    }
    // Freeing a block next to a free run that reaches the volume's end punches it all.
    let mut last = Vec::new();
    alloc.release_punching(&[(kept, 1)], 16, false, &mut |at, len| last.push((at, len)));
    assert_eq!(last, vec![(8 * BLOCK_BYTES, (256 - 8) * BLOCK_BYTES)]);
    live_set(&alloc);
}

/// Large extents (log segments) are punched as given, adjacent ones merged, before they
/// are released: no free neighbour is punched with them.
#[test]
fn release_punching_punches_large_extents_as_given() {
    let (storage, alloc) = new_volume(256 * BLOCK_BYTES);
    let a = alloc.allocate(&storage, 20, 1, false).unwrap();
    let b = alloc.allocate(&storage, 20, 1, false).unwrap();
    let c = alloc.allocate(&storage, 20, 1, false).unwrap();
    assert_eq!((block_of(a), block_of(b), block_of(c)), (8, 28, 48));
    let mut punched = Vec::new();
    alloc.release_punching(&[(c, 20), (a, 20)], 16, false, &mut |at, len| {
        punched.push((at, len))
    });
    assert_eq!(
        punched,
        vec![
            (8 * BLOCK_BYTES, 20 * BLOCK_BYTES),
            (48 * BLOCK_BYTES, 20 * BLOCK_BYTES)
        ]
    );
    punched.clear();
    alloc.release_punching(&[(b, 20)], 16, false, &mut |at, len| {
        punched.push((at, len))
    });
    assert_eq!(punched, vec![(28 * BLOCK_BYTES, 20 * BLOCK_BYTES)]);
    assert!(!alloc.is_allocated(a, 60));
    live_set(&alloc);
}

/// Many small extents freed in one batch (a commit pair hands back thousands of index
/// nodes) are punched as the union of their free runs: every free block once, in as many
/// calls as there are separate runs, never an allocated block, even where the runs are
/// longer than the window searched around each extent.
#[test]
fn release_punching_punches_each_free_block_of_a_batch_once() {
    let (storage, alloc) = new_volume(4096 * BLOCK_BYTES);
    // Blocks 8..1408 one at a time; every 700th stays allocated and splits the runs.
    let singles: Vec<DiskOffset> = (0..1400)
        .map(|_| alloc.allocate(&storage, 1, 1, false).unwrap())
        .collect();
    let fence = alloc.allocate(&storage, 1, 1, false).unwrap();
    assert_eq!(block_of(fence), 1408);
    let freed: Vec<(DiskOffset, u64)> = singles
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 700 != 699)
        .map(|(_, off)| (*off, 1))
        .collect();
    let mut punched: Vec<(u64, u64)> = Vec::new();
    alloc.release_punching(&freed, 16, false, &mut |at, len| punched.push((at, len)));
    let blocks = |(at, len): (u64, u64)| (at / BLOCK_BYTES, (at + len) / BLOCK_BYTES);
    let runs: Vec<(u64, u64)> = punched.iter().copied().map(blocks).collect();
    assert_eq!(runs, vec![(8, 707), (708, 1407)]);
    live_set(&alloc);
}

/// Deferred releases are not punched; the next allocations of their size take them,
/// newest first, without moving the next-fit cursor; `punch_deferred` punches only what
/// is still free of them (merged), and forgets them all.
#[test]
fn deferred_runs_are_reused_first_and_punched_only_where_still_free() {
    let (storage, alloc) = new_volume(1024 * BLOCK_BYTES);
    let segs: Vec<DiskOffset> = (0..4)
        .map(|_| alloc.allocate(&storage, 16, 16, false).unwrap())
        .collect();
    assert_eq!(
        segs.iter().map(|&s| block_of(s)).collect::<Vec<_>>(),
        vec![16, 32, 48, 64]
    );
    let mut punched: Vec<(u64, u64)> = Vec::new();
    let freed: Vec<(DiskOffset, u64)> = segs.iter().map(|&s| (s, 16)).collect();
    alloc.release_punching(&freed, 16, true, &mut |at, len| punched.push((at, len)));
    assert!(
        punched.is_empty(),
        "deferred runs punched at release: {punched:?}"
    );
    assert_eq!(alloc.deferred_bytes(), 64 * BLOCK_BYTES);
    assert!(!alloc.is_allocated(segs[0], 64), "deferred runs are free");
    // The newest listing is the highest run (released in offset order): reused first.
    let again = alloc.allocate(&storage, 16, 16, false).unwrap();
    assert_eq!(block_of(again), 64);
    // The cursor did not move back, and runs shorter than the punch threshold are not
    // taken from the list: a small allocation continues the sweep past 80.
    let node = alloc.allocate(&storage, 1, 1, false).unwrap();
    assert_eq!(block_of(node), 80);
    // Blocks of a deferred run allocated meanwhile by other means (recovery marks four)
    // are left out of the punch.
    assert!(alloc.mark_allocated(DiskOffset(40 * BLOCK_BYTES), 4));
    let mut punched: Vec<(u64, u64)> = Vec::new();
    let bytes = alloc.punch_deferred(Duration::ZERO, &mut |at, len| {
        punched.push((at / BLOCK_BYTES, (at + len) / BLOCK_BYTES))
    });
    assert_eq!(punched, vec![(16, 40), (44, 64)]);
    assert_eq!(bytes, 44 * BLOCK_BYTES);
    assert_eq!(alloc.deferred_bytes(), 0);
    // Nothing listed any more: allocations search as usual, on from the cursor.
    let next = alloc.allocate(&storage, 16, 16, false).unwrap();
    assert_eq!(block_of(next), 96);
    live_set(&alloc);
}

/// A run younger than the age asked for waits; a run released twice (reused, then freed
/// again while its first listing waits) is punched once.
#[test]
fn deferred_runs_wait_their_age_and_are_punched_once() {
    let (storage, alloc) = new_volume(1024 * BLOCK_BYTES);
    let a = alloc.allocate(&storage, 16, 16, false).unwrap();
    alloc.release_punching(&[(a, 16)], 16, true, &mut |_, _| {
        panic!("punched at release")
    });
    let mut calls = 0;
    alloc.punch_deferred(Duration::from_secs(3600), &mut |_, _| calls += 1);
    assert_eq!(calls, 0);
    assert_eq!(alloc.deferred_bytes(), 16 * BLOCK_BYTES);
    // Taken by another way than the list (recovery marks it), freed again, listed again.
    assert!(alloc.mark_allocated(a, 16));
    alloc.release_punching(&[(a, 16)], 16, true, &mut |_, _| {
        panic!("punched at release")
    });
    // And four blocks in its middle taken again: both listings split around them.
    let middle = DiskOffset(a.0 + 4 * BLOCK_BYTES);
    assert!(alloc.mark_allocated(middle, 4));
    let mut punched = Vec::new();
    alloc.punch_deferred(Duration::ZERO, &mut |at, len| punched.push((at, len)));
    assert_eq!(
        punched,
        vec![
            (a.0, 4 * BLOCK_BYTES),
            (middle.0 + 4 * BLOCK_BYTES, 8 * BLOCK_BYTES)
        ]
    );
    live_set(&alloc);
}
