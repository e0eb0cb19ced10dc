//! Bugs found by the torture suites, each kept as a named test.

use std::sync::Arc;

use tucana::volume::{FailingSync, MemStorage, Storage};
use tucana::{Database, Durability, Error};

/// Found by M2 (I/O error sweeps). `Database::sync` returned `Ok` on a poisoned store
/// whenever nothing unsynced was left: its group-commit fast path ("everything up to my
/// ticket is already durable") ran before the poison check. Nothing acknowledged was
/// lost, but a caller reading that `Ok` would take a store that refuses every write for a
/// healthy one. A poisoned store now answers every sync with `Error::Poisoned`.
#[test]
fn sync_on_a_poisoned_store_with_nothing_unsynced_is_an_error() {
    let storage = Arc::new(FailingSync::new());
    let db = Database::builder()
        .commit_interval(None)
        .flush_interval(None)
        .open_storage(storage.clone())
        .unwrap();
    let ks = db.keyspace("ks").unwrap();
    ks.put(b"k", b"v").unwrap();
    db.sync().unwrap();
    // A commit whose sync fails poisons the store with nothing unsynced left.
    storage.set_broken(true);
    assert!(db.commit().is_err());
    storage.set_broken(false);
    assert!(matches!(db.sync(), Err(Error::Poisoned)));
    assert!(matches!(
        ks.put_with(b"k2", b"v", Durability::Sync),
        Err(Error::Poisoned)
    ));
}

/// The newest superblock of `storage` and the descriptor it names.
fn committed(
    storage: &MemStorage,
) -> (
    tucana::volume::superblock::Superblock,
    tucana::fuzzing::Descriptor,
) {
    let sb = tucana::volume::superblock::read_newest(storage)
        .expect("read")
        .expect("a superblock");
    let mut bytes = vec![0u8; sb.descriptor_bytes as usize];
    storage.read_at(sb.descriptor.0, &mut bytes).expect("read");
    let desc = tucana::fuzzing::Descriptor::decode(&bytes, sb.descriptor).expect("decode");
    (sb, desc)
}

/// A closed volume with one keyspace "k" holding `keys`, each with the value "value".
fn volume_with(keys: impl Iterator<Item = Vec<u8>>) -> Arc<MemStorage> {
    let storage = Arc::new(MemStorage::new());
    let db = Database::builder()
        .commit_interval(None)
        .flush_interval(None)
        .open_storage(storage.clone())
        .expect("create");
    let ks = db.keyspace("k").expect("keyspace");
    for key in keys {
        ks.put(&key, b"value").expect("put");
    }
    db.close().expect("close");
    storage
}

/// A committed volume whose descriptor's free log is replaced by `free_log`, with every
/// checksum re-stamped so only the free log is wrong.
fn volume_with_free_log(free_log: Vec<(tucana::types::DiskOffset, u64)>) -> Arc<MemStorage> {
    volume_with_descriptor(|desc| desc.free_log = free_log)
}

/// A committed volume of 100 keys whose descriptor `edit` changed, with every checksum
/// re-stamped so only the edited fields are wrong.
fn volume_with_descriptor(edit: impl FnOnce(&mut tucana::fuzzing::Descriptor)) -> Arc<MemStorage> {
    let storage = volume_with((0..100u32).map(|i| format!("key{i:04}").into_bytes()));
    let (mut sb, mut desc) = committed(&storage);
    edit(&mut desc);
    let bytes = desc.encode();
    // A few more bytes than before still fit in the descriptor's block.
    assert!(bytes.len() <= 4096, "the descriptor fits its block");
    storage.write_at(sb.descriptor.0, &bytes).expect("write");
    sb.descriptor_bytes = bytes.len() as u64;
    sb.descriptor_crc = crc32c::crc32c(&bytes);
    sb.write_to(storage.as_ref()).expect("write the slot");
    storage
}

/// Found by M5 (the `open` fuzz target, in CI). Recovery checked each free-log run with
/// `is_allocated`, which counts blocks past the volume's end as allocated (the file may
/// have grown after the commit), then freed it with `release`, whose preconditions are
/// assertions: a free log naming a run past the end — or one touching a group's reserved
/// blocks, which are always allocated — panicked at open instead of reporting corruption.
/// Recovery now frees through `Allocator::try_release`, which checks every precondition
/// and says which one failed.
#[test]
fn a_free_log_naming_impossible_runs_is_corruption_not_a_panic() {
    use tucana::types::DiskOffset;
    let past_end = DiskOffset(0xc3_0004_0000);
    let reserved = DiskOffset(0); // the superblock slots
    let unaligned = DiskOffset(4096 * 40 + 7);
    let cases = [
        (past_end, 2, "past the volume's end"),
        (reserved, 1, "reserved block"),
        (unaligned, 1, "unaligned"),
        (DiskOffset(4096 * 40), 0, "empty run"),
    ];
    for (off, blocks, expected) in cases {
        let storage = volume_with_free_log(vec![(off, blocks)]);
        match Database::builder()
            .create_if_missing(false)
            .open_storage(storage)
        {
            Err(Error::Corruption { what, detail, .. }) => {
                assert_eq!(what, "free log");
                assert!(detail.contains(expected), "{detail:?} names {expected:?}");
            }
            Err(other) => panic!("{off}+{blocks}: wrong error {other}"),
            Ok(_) => panic!("{off}+{blocks}: opened a volume with an impossible free log"),
        }
    }
    // The same volume with a sane free log still opens: the check is not too strict.
    opens_and_reads(volume_with_free_log(Vec::new()));
}

/// Opens a volume made by `volume_with` (100 keys) and reads one of its keys: the checks
/// a test adds are not too strict for a sound volume.
fn opens_and_reads(storage: Arc<MemStorage>) {
    let db = Database::builder()
        .create_if_missing(false)
        .open_storage(storage)
        .expect("open");
    let ks = db.open_keyspace("k").expect("keyspace");
    assert_eq!(
        ks.get(b"key0042").expect("get").as_deref(),
        Some(&b"value"[..])
    );
}

/// Found by M5 (the `open` fuzz target, a timeout). A zeroed sector in an internal node
/// (re-stamped checksum) left its pivots' descriptors zero: every pivot read as the empty
/// key while the prefixes still differed, so the fences a range iterator gets from the
/// path are not in order. A forward scan moves to the leaf holding the previous leaf's
/// upper fence; with that fence at or below the position it had, it came back to the same
/// leaves for ever inside one `next()`; a backward scan ended early and silently skipped
/// keys. Ranges now check that each leaf they move to lies beyond the last and that every
/// key they read lies inside its leaf's fences (both hold in a sound tree), and report
/// corruption otherwise.
#[test]
fn a_scan_over_pivots_out_of_order_is_corruption_not_a_hang() {
    use std::sync::mpsc;
    use std::time::Duration;
    // Node layout (index/node/mod.rs): word 1 = kind | level | count, pivot descriptors at 2120.
    const PIVOT_DESC_AT: usize = 2120;
    let storage = volume_with((0..3000u32).map(|i| format!("key{i:06}").into_bytes()));
    let (_, desc) = committed(&storage);
    let root = desc.regions[0].root;
    let mut img = vec![0u8; 4096];
    storage.read_at(root.0, &mut img).expect("read the root");
    let meta = u64::from_le_bytes(img[8..16].try_into().expect("8 bytes"));
    assert_eq!(meta & 0xff, 2, "the root is an internal node");
    let pivots = ((meta >> 16) & 0xffff) as usize;
    assert!(pivots >= 4, "{pivots} pivots");
    img[PIVOT_DESC_AT..PIVOT_DESC_AT + 8 * pivots].fill(0);
    // Without its stem (stem length, the top 16 bits of word 1, and its bytes in words
    // 5..7) the node is laid out as when M5 found this; with it, the empty pivots would be
    // shorter than the stem, which the node itself reports before the range's checks run.
    img[14..16].fill(0);
    img[40..64].fill(0);
    let crc = crc32c::crc32c_append(crc32c::crc32c(&[0u8; 8]), &img[8..]);
    img[..4].copy_from_slice(&crc.to_le_bytes());
    storage.write_at(root.0, &img).expect("write the root");

    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let db = Database::builder()
            .create_if_missing(false)
            .open_storage(storage)
            .expect("open (the damage is below the root's header)");
        let ks = db.open_keyspace("k").expect("keyspace");
        let forward: Vec<_> = ks.range::<&[u8], _>(..).collect();
        let backward: Vec<_> = ks.range::<&[u8], _>(..).rev().collect();
        let _ = tx.send((forward, backward));
    });
    // A liveness guard, not a speed claim: before the fix the scan never returned.
    let (forward, backward) = rx
        .recv_timeout(Duration::from_secs(300))
        .expect("the scans finished");
    for (name, items) in [("forward", forward), ("backward", backward)] {
        match items.last() {
            Some(Err(Error::Corruption { what, .. })) => assert_eq!(*what, "index"),
            other => panic!("{name} scan ended with {other:?}, not an index corruption"),
        }
    }
}

/// Found by M5 (the `open` fuzz target, in CI). The descriptor writes a region's tail
/// segment size twice, in the tail position and in the segment list; recovery checked the
/// list's entry (aligned, allocated) but built the tail buffer from the position's copy,
/// whose preconditions are assertions: a position whose size was zero (or not a whole
/// number of blocks) panicked at open. Recovery now requires the two to agree and every
/// segment to be at least one block.
#[test]
fn a_tail_size_that_disagrees_with_its_segment_is_corruption_not_a_panic() {
    let tail_size = |size: u64| {
        move |desc: &mut tucana::fuzzing::Descriptor| {
            desc.regions[0].tail_size_bytes = size;
            desc.regions[0].tail_used_bytes = 0;
        }
    };
    let empty_segments = |desc: &mut tucana::fuzzing::Descriptor| {
        let tail = desc.regions[0].tail;
        desc.regions[0].tail_size_bytes = 0;
        desc.regions[0].tail_used_bytes = 0;
        for (off, s) in &mut desc.regions[0].segments {
            if *off == tail {
                s.size_bytes = 0;
                s.written_bytes = 0;
                s.live_bytes = 0;
            }
        }
    };
    type Edit = Box<dyn FnOnce(&mut tucana::fuzzing::Descriptor)>;
    let cases: [(&str, Edit); 4] = [
        ("zero", Box::new(tail_size(0))),
        ("unaligned", Box::new(tail_size(4096 + 40))),
        ("one block more", Box::new(tail_size((2 << 20) + 4096))),
        ("empty segment", Box::new(empty_segments)),
    ];
    for (name, edit) in cases {
        let storage = volume_with_descriptor(edit);
        match Database::builder()
            .create_if_missing(false)
            .open_storage(storage)
        {
            Err(Error::Corruption { what, .. }) => assert_eq!(what, "commit descriptor", "{name}"),
            Err(other) => panic!("{name}: wrong error {other}"),
            Ok(_) => panic!("{name}: opened a volume whose tail disagrees with its segment"),
        }
    }
    // Untouched, the same volume opens and reads.
    opens_and_reads(volume_with_descriptor(|_| {}));
}

/// Found by M5 (the `open` fuzz target, a longer local run after the fix above). A region's
/// index root offset that is not a whole block reached `Tree::from_disk`, whose tagged child
/// words assert alignment, and panicked at open. The descriptor decoder now rejects it.
#[test]
fn an_index_root_that_is_not_a_block_is_corruption_not_a_panic() {
    let storage = volume_with_descriptor(|desc| {
        let root = desc.regions[0].root;
        assert!(!root.is_none(), "100 keys make a tree");
        desc.regions[0].root = tucana::types::DiskOffset(root.0 + 0x32);
    });
    match Database::builder()
        .create_if_missing(false)
        .open_storage(storage)
    {
        Err(Error::Corruption { what, detail, .. }) => {
            assert_eq!(what, "commit descriptor");
            assert!(detail.contains("index root"), "{detail}");
        }
        Err(other) => panic!("wrong error {other}"),
        Ok(_) => panic!("opened a volume whose index root is not a block"),
    }
}

/// Found by M5 (the `open` fuzz target, a longer local run): a superblock whose descriptor
/// length was larger than the extent its commit allocated (the extra bytes zero, so the
/// descriptor still decoded, and the crc re-stamped over them) opened fine; the commit
/// that superseded it freed the longer extent, blocks that were never its own, and the
/// allocator's double-free assertion fired at close. Open now checks the extent: no
/// longer than the encoded descriptor plus its padding, allocated, and clear of every
/// log segment.
#[test]
fn a_descriptor_length_past_its_extent_is_corruption_not_a_double_free() {
    for extra_blocks in [3u64, 40] {
        let storage = volume_with((0..100u32).map(|i| format!("key{i:04}").into_bytes()));
        let (mut sb, _) = committed(&storage);
        sb.descriptor_bytes = sb.descriptor_bytes.div_ceil(4096) * 4096 + extra_blocks * 4096;
        let mut bytes = vec![0u8; sb.descriptor_bytes as usize];
        storage.read_at(sb.descriptor.0, &mut bytes).expect("read");
        sb.descriptor_crc = crc32c::crc32c(&bytes);
        sb.write_to(storage.as_ref()).expect("write the slot");
        match Database::builder()
            .create_if_missing(false)
            .open_storage(storage)
        {
            Err(Error::Corruption { what, detail, .. }) => {
                assert_eq!(what, "superblock", "{extra_blocks}");
                assert!(detail.contains("descriptor extent"), "{detail}");
            }
            Err(other) => panic!("{extra_blocks}: wrong error {other}"),
            Ok(db) => {
                let _ = db.close();
                panic!("{extra_blocks}: opened a volume whose descriptor length is too long");
            }
        }
    }
}
