//! Internal node stems on a whole volume: a volume whose internal nodes were written
//! without stems (the layout before they existed) opens, reads, passes `check` and takes
//! writes; an internal node image whose stem is damaged (checksum re-stamped, so only the
//! stem is wrong) is reported as corruption by reads, writes and `check`, never a panic.
//!
//! The node layout used here is `index/node/mod.rs`'s: header word 1 (bytes 8..16) holds the
//! kind (byte 8) and the stem length (bytes 14..16), words 5..7 (bytes 40..64) the stem,
//! the pivot prefixes start at byte 1096; word 0's low half is the crc32c of the image
//! with word 0 taken as zero.

use std::collections::BTreeMap;
use std::sync::Arc;

use tucana::index::{image_contents, key_prefix, ImageContents, ImagePivot};
use tucana::types::{DiskOffset, RegionId};
use tucana::volume::{MemStorage, Storage};
use tucana::{Database, Error};

const BLOCK: usize = 4096;
const STEM_LEN_AT: usize = 14;
const STEM_AT: usize = 40;
const PIVOT_PREFIX_AT: usize = 1096;

/// A committed volume of `key:%012d` keys (`n` of them, every 7th number), closed.
fn volume(n: u64) -> (Arc<MemStorage>, BTreeMap<Vec<u8>, Vec<u8>>) {
    let storage = Arc::new(MemStorage::new());
    let db = Database::builder()
        .commit_interval(None)
        .flush_interval(None)
        .open_storage(storage.clone())
        .expect("create");
    let ks = db.keyspace("k").expect("keyspace");
    let mut model = BTreeMap::new();
    for i in 0..n {
        // Not in key order, so leaves split in the middle as under random inserts.
        let key = format!("key:{:012}", (i * 7_919) % (n * 7)).into_bytes();
        let value = format!("v{i}").into_bytes();
        ks.put(&key, &value).expect("put");
        model.insert(key, value);
    }
    drop(ks);
    db.close().expect("close");
    (storage, model)
}

/// Every internal node of the committed tree of the volume's only keyspace: offset,
/// image and the keyspace's region, root first.
fn internal_nodes(storage: &MemStorage) -> Vec<(DiskOffset, Vec<u8>, RegionId)> {
    let sb = tucana::volume::superblock::read_newest(storage)
        .expect("read")
        .expect("a superblock");
    let mut bytes = vec![0u8; sb.descriptor_bytes as usize];
    storage.read_at(sb.descriptor.0, &mut bytes).expect("read");
    let desc = tucana::fuzzing::Descriptor::decode(&bytes, sb.descriptor).expect("decode");
    let region = &desc.regions[0];
    let mut out = Vec::new();
    let mut todo = vec![region.root];
    while let Some(off) = todo.pop() {
        let mut img = vec![0u8; BLOCK];
        storage.read_at(off.0, &mut img).expect("read a node");
        if let ImageContents::Internal { children, .. } =
            image_contents(&img, off, region.id).expect("a sound node")
        {
            todo.extend(children);
            out.push((off, img, region.id));
        }
    }
    out
}

fn restamp(img: &mut [u8]) {
    let crc = crc32c::crc32c_append(crc32c::crc32c(&[0u8; 8]), &img[8..]);
    img[..4].copy_from_slice(&crc.to_le_bytes());
}

fn open(storage: Arc<MemStorage>) -> tucana::Result<Database> {
    Database::builder()
        .commit_interval(None)
        .flush_interval(None)
        .create_if_missing(false)
        .open_storage(storage)
}

fn stem_len(img: &[u8]) -> usize {
    u16::from_le_bytes([img[STEM_LEN_AT], img[STEM_LEN_AT + 1]]) as usize
}

/// Internal nodes written before they had stems kept stem length 0, zero header words
/// 5..7 and each pivot's first 8 bytes as its prefix; descriptors and key area were as
/// now. Such a volume must read as before, pass `check`, and take writes on top (its
/// nodes are copied with stem 0; the ones that split get stems).
#[test]
fn a_volume_written_without_internal_stems_reads_checks_and_takes_writes() {
    let (storage, mut model) = volume(30_000);
    let nodes = internal_nodes(&storage);
    assert!(nodes.len() >= 3, "{} internal nodes", nodes.len());
    for (off, mut img, region) in nodes {
        assert!(stem_len(&img) >= 10, "key:000000 is in every pivot");
        let Ok(ImageContents::Internal { pivots, .. }) = image_contents(&img, off, region) else {
            unreachable!("internal_nodes returns sound internal nodes")
        };
        for (i, p) in pivots.iter().enumerate() {
            let ImagePivot::Inline(bytes) = p else {
                panic!("short keys make inline pivots")
            };
            let at = PIVOT_PREFIX_AT + 8 * i;
            img[at..at + 8].copy_from_slice(&key_prefix(bytes).to_le_bytes());
        }
        img[STEM_LEN_AT..STEM_LEN_AT + 2].fill(0);
        img[STEM_AT..STEM_AT + 24].fill(0);
        restamp(&mut img);
        storage.write_at(off.0, &img).expect("write");
    }
    assert!(internal_nodes(&storage)
        .iter()
        .all(|(_, img, _)| stem_len(img) == 0));

    let db = open(storage.clone()).expect("open");
    db.check().expect("check of the stemless volume");
    let ks = db.open_keyspace("k").expect("keyspace");
    for (k, v) in model.iter().step_by(13) {
        assert_eq!(ks.get(k).expect("get").as_deref(), Some(&v[..]));
    }
    assert_eq!(ks.get(b"key:000000000001").expect("get"), None);
    let all: Vec<_> = ks
        .range::<&[u8], _>(..)
        .map(|item| item.expect("scan"))
        .collect();
    assert_eq!(all.len(), model.len());
    let from = b"key:000000100000".to_vec();
    let back: Vec<Vec<u8>> = ks
        .range::<&[u8], _>(..&from[..])
        .rev()
        .take(50)
        .map(|item| item.expect("scan").0.to_vec())
        .collect();
    let expect: Vec<Vec<u8>> = model
        .range(..from)
        .rev()
        .take(50)
        .map(|(k, _)| k.clone())
        .collect();
    assert_eq!(back, expect);
    // Enough new keys that internal nodes split (the copies of stemless nodes that only
    // take pivots keep stem 0).
    for i in 0..60_000u64 {
        let key = format!("key:{:012}", i * 11 + 3).into_bytes();
        ks.put(&key, b"new").expect("put");
        model.insert(key, b"new".to_vec());
    }
    drop(ks);
    db.close().expect("close");
    assert!(
        internal_nodes(&storage)
            .iter()
            .any(|(_, img, _)| stem_len(img) > 0),
        "nodes that split got stems"
    );
    let db = open(storage).expect("reopen");
    db.check().expect("check after writes on top");
    let ks = db.open_keyspace("k").expect("keyspace");
    for (k, v) in model.iter().step_by(17) {
        assert_eq!(ks.get(k).expect("get").as_deref(), Some(&v[..]));
    }
}

/// How far a damaged stem gets.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Found {
    /// By opening the node (its header): every read through it fails.
    AtOpen,
    /// By verifying the whole node (`check`, and copying it for a write): a pivot does not
    /// start with the stem. A lookup reads a consistent node of other keys.
    ByVerify,
    /// Only by the fences: the stem bytes that are nowhere else in the node (its first 8)
    /// changed, so the node is sound by itself but its pivots are not inside the pivots
    /// above it. `check` compares them; a write goes through.
    ByFences,
}

/// Damage to an internal node's stem, checksum re-stamped. A stem longer than 24 bytes,
/// or with bytes left past its length, is refused when the node is opened, so every read
/// through it fails; a stem that does not fit the node's pivots reads as a consistent node
/// with other keys (a lookup may answer absent) but `check` and any write through it (the
/// node is copied, which verifies it completely) report it; a stem changed where only the
/// stem holds the bytes is found by `check`'s fences. None of it panics.
#[test]
fn a_damaged_internal_stem_is_corruption_not_a_panic() {
    type Damage = fn(&mut [u8]);
    let damages: [(&str, Found, Damage); 5] = [
        ("stem of 25 bytes", Found::AtOpen, |img| {
            img[STEM_LEN_AT..STEM_LEN_AT + 2].copy_from_slice(&25u16.to_le_bytes())
        }),
        ("stem shortened, its last byte left", Found::AtOpen, |img| {
            let len = stem_len(img) as u16 - 1;
            img[STEM_LEN_AT..STEM_LEN_AT + 2].copy_from_slice(&len.to_le_bytes())
        }),
        ("a stem byte past the 8th changed", Found::ByVerify, |img| {
            let len = stem_len(img);
            img[STEM_AT + len - 1] ^= 0x40;
        }),
        ("stem one zero byte longer", Found::ByVerify, |img| {
            let len = stem_len(img) as u16 + 1;
            img[STEM_LEN_AT..STEM_LEN_AT + 2].copy_from_slice(&len.to_le_bytes())
        }),
        ("the stem's first byte changed", Found::ByFences, |img| {
            img[STEM_AT] ^= 1
        }),
    ];
    for (name, found, damage) in damages {
        let refused_at_open = found == Found::AtOpen;
        let (storage, model) = volume(3_000);
        let nodes = internal_nodes(&storage);
        let (root, mut img, _) = nodes[0].clone();
        assert!(stem_len(&img) >= 9, "{name}: the root's stem");
        damage(&mut img);
        restamp(&mut img);
        storage.write_at(root.0, &img).expect("write");

        // Nothing is replayed, so opening reads no node.
        let db = open(storage).expect("open");
        let ks = db.open_keyspace("k").expect("keyspace");
        let mut errors = 0;
        for (k, v) in model.iter().step_by(29) {
            match ks.get(k) {
                Ok(found) => assert!(
                    !refused_at_open || found.as_deref() == Some(&v[..]),
                    "{name}: wrong answer"
                ),
                Err(Error::Corruption { offset, .. }) => {
                    assert_eq!(offset, root, "{name}");
                    errors += 1;
                }
                Err(e) => panic!("{name}: unexpected error {e}"),
            }
        }
        if refused_at_open {
            assert_eq!(errors, model.len().div_ceil(29), "{name}: every get");
        }
        match ks.range::<&[u8], _>(..).find_map(|item| item.err()) {
            Some(Error::Corruption { .. }) => {}
            None if !refused_at_open => {}
            other => panic!("{name}: scan ended with {other:?}"),
        }
        match db.check() {
            Err(Error::Corruption { detail, .. }) => {
                if found == Found::ByFences {
                    assert!(detail.contains("fences"), "{name}: {detail}");
                }
            }
            other => panic!("{name}: check gave {other:?}"),
        }
        match ks.put(b"key:000000000007", b"x") {
            Err(Error::Corruption { offset, .. }) => assert_eq!(offset, root, "{name}"),
            Ok(()) if found == Found::ByFences => {}
            other => panic!("{name}: a write through the root gave {other:?}"),
        }
    }
}
