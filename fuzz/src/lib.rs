//! Shared pieces of the fuzz targets (M5 of docs/reliability.md).
//!
//! Owns: a small valid volume image built once per process (`base`), the way a target turns
//! fuzzer bytes into mutations of a valid structure (`mutate`), re-stamping checksums so a
//! mutation reaches the decoder behind the crc (`fix_*`), and `open_and_read`, which opens
//! a volume image from memory and reads everything through the public API. Does not own
//! the property each target asserts (the targets do).
//!
//! Why mutations of valid images rather than raw bytes only: every on-disk structure is
//! checksummed, so random bytes die at the crc check and never reach the field decoding
//! behind it. Each target therefore runs in one of two modes picked by the first input
//! byte: raw bytes as they come (the crc path), or a valid image mutated and re-stamped
//! (the structure path).
//!
//! The checksum layouts repeated here are those of the engine's codecs (superblock slot:
//! `volume/superblock.rs`; node: `index/node/mod.rs` and `index/node/image.rs`; buddy: `alloc/buddy.rs`; log record:
//! `log/record.rs`); if one changes, the re-stamping here stops working and the target
//! degrades to the crc path, which shows as a sharp drop in coverage, not as a failure.
//!
//! Single-threaded per target process; `base` is built under a `OnceLock`.

use std::sync::{Arc, OnceLock};

use tucana::fuzzing::Descriptor;
use tucana::index::ImageContents;
use tucana::types::{DiskOffset, RegionId};
use tucana::volume::superblock::Superblock;
use tucana::volume::{MemStorage, Storage};
use tucana::{Database, Durability};

pub const BLOCK_BYTES: usize = 4096;
const SLOT_CRC_AT: usize = BLOCK_BYTES - 4;
/// Superblock fields (`volume/superblock.rs`).
const SB_DESCRIPTOR_AT: usize = 24;
const SB_DESCRIPTOR_BYTES_AT: usize = 32;
const SB_DESCRIPTOR_CRC_AT: usize = 40;
/// "TNOD" in the high half of a committed node's word 0 (`index/node/image.rs`).
const NODE_MAGIC: u32 = 0x444F_4E54;
/// Bitmap buddy layout (`alloc/buddy.rs`): bitmap, magic, group, epoch, crc.
pub const BUDDY_BYTES: usize = 8192;
const BUDDY_MAGIC_AT: usize = 4096;
const BUDDY_CRC_AT: usize = 4096 + 24;
const BUDDY_MAGIC: &[u8; 8] = b"TCNBUDDY";

/// A valid volume and the structures found in it.
pub struct Base {
    /// The whole volume file after a simulated crash (last commit + a synced log tail).
    pub volume: Sparse,
    /// The newest superblock slot's bytes and its slot number.
    pub slot: (Vec<u8>, usize),
    /// The newest commit descriptor and where it lies.
    pub descriptor: (Vec<u8>, DiskOffset),
    /// Committed index node images with their offsets and regions (internal and leaves).
    pub nodes: Vec<(Vec<u8>, DiskOffset, RegionId)>,
    /// Numbers of the non-zero blocks of `volume` (where mutations matter).
    pub used_blocks: Vec<u64>,
}

fn read(storage: &dyn Storage, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    storage
        .read_at(offset, &mut buf)
        .expect("read the base volume");
    buf
}

fn build_base() -> Base {
    let storage = Arc::new(MemStorage::new());
    let db = Database::builder()
        .commit_interval(None)
        .flush_interval(None)
        .log_segment_bytes(64 << 10)
        .open_storage(storage.clone())
        .expect("create the base volume");
    let a = db.keyspace("a").expect("keyspace a");
    let b = db.keyspace("b").expect("keyspace b");
    let c = db.keyspace("c").expect("keyspace c");
    let d = db.keyspace("d").expect("keyspace d");
    // Enough keys for an internal node (a leaf holds 200), long keys for pivots kept by
    // log pointer, and shared 8-byte prefixes for hash ties.
    for i in 0..700u32 {
        let key = match i % 3 {
            0 => format!("key{i:06}").into_bytes(),
            1 => format!("shared-prefix-{i:06}").into_bytes(),
            _ => {
                let mut k = format!("long{i:06}-").into_bytes();
                k.resize(300, b'x');
                k
            }
        };
        a.put(&key, format!("value {i}").as_bytes()).expect("put");
    }
    for i in 0..50u32 {
        a.delete(format!("key{:06}", i * 3).as_bytes())
            .expect("delete");
    }
    // redis-benchmark's key shape: every pivot starts with `key:000000`, so internal
    // nodes get stems (header words 5..7).
    for i in 0..600u32 {
        c.put(format!("key:{:012}", i * 7919 % 100_000).as_bytes(), b"v")
            .expect("put");
    }
    // The server's list elements: a 28-byte collection prefix and an 8-byte index, so
    // leaf stems pass 32 bytes and the internal stem passes 24 (its bytes past the header are
    // pivot 0's).
    for i in 0..700u64 {
        let mut k = b"\xff\xfftucana\x00L\x00\x00\x00\x06mylist\0\0\0\0\0\0\0\x01".to_vec();
        k.extend_from_slice(&((1u64 << 63) + i * 3 % 700).to_be_bytes());
        d.put(&k, b"element").expect("put");
    }
    let mut batch = b.batch();
    for i in 0..20u32 {
        batch.put(format!("b{i}").as_bytes(), &vec![b'v'; 100 * i as usize]);
    }
    batch.commit().expect("batch");
    db.commit().expect("commit");
    // A log tail after the commit, made durable: open replays it.
    for i in 0..30u32 {
        b.put_with(format!("tail{i}").as_bytes(), b"t", Durability::Buffered)
            .expect("put");
    }
    b.delete(b"b3").expect("delete");
    db.sync().expect("sync");
    db.abandon();

    let len = storage.len_bytes().expect("length") as usize;
    let volume = read(storage.as_ref(), 0, len);
    let sb = tucana::volume::superblock::read_newest(storage.as_ref())
        .expect("read the superblock")
        .expect("a superblock");
    let slot_no = (sb.epoch.0 % 2) as usize;
    let slot = volume[slot_no * BLOCK_BYTES..(slot_no + 1) * BLOCK_BYTES].to_vec();
    assert_eq!(
        Superblock::decode(&slot, slot_no).expect("slot decodes"),
        sb
    );
    let desc_bytes = read(
        storage.as_ref(),
        sb.descriptor.0,
        sb.descriptor_bytes as usize,
    );
    let desc = Descriptor::decode(&desc_bytes, sb.descriptor).expect("descriptor decodes");
    let mut nodes = Vec::new();
    let mut stems = 0;
    let (mut long_internal_stems, mut long_leaf_stems) = (0, 0);
    for region in &desc.regions {
        let mut todo = vec![region.root];
        let mut taken = 0;
        while let Some(off) = todo.pop() {
            // A few nodes of every region (each keyspace's keys have their own shape).
            if off.0 == 0 || taken >= 5 {
                continue;
            }
            taken += 1;
            let img = read(storage.as_ref(), off.0, BLOCK_BYTES);
            match tucana::index::image_contents(&img, off, region.id).expect("node decodes") {
                ImageContents::Internal { children, stem, .. } => {
                    stems += usize::from(!stem.is_empty());
                    long_internal_stems += usize::from(stem.len() > 24);
                    todo.extend(children.into_iter().take(3))
                }
                ImageContents::Leaf { stem, .. } => {
                    long_leaf_stems += usize::from(stem.len() > 32);
                }
            }
            nodes.push((img, off, region.id));
        }
    }
    assert!(
        nodes.len() >= 2,
        "the base volume has an internal node and leaves"
    );
    assert!(
        stems > 0,
        "the base volume has an internal node with a stem"
    );
    assert!(
        long_internal_stems > 0 && long_leaf_stems > 0,
        "the base volume has stems past the header words"
    );
    let volume = Sparse::from_bytes(&volume);
    let used_blocks = volume.blocks.keys().copied().collect();
    Base {
        volume,
        slot: (slot, slot_no),
        descriptor: (desc_bytes, sb.descriptor),
        nodes,
        used_blocks,
    }
}

/// The base volume, built on first use.
pub fn base() -> &'static Base {
    static BASE: OnceLock<Base> = OnceLock::new();
    BASE.get_or_init(build_base)
}

/// Applies fuzzer `data` to `target` as 4-byte edits: offset (u16 LE, modulo the length),
/// an operation, a byte. Operations: set, xor, add, and "zero 64 bytes" (a torn sector
/// in miniature).
pub fn mutate(target: &mut [u8], data: &[u8]) {
    if target.is_empty() {
        return;
    }
    for edit in data.chunks_exact(4) {
        let at = u16::from_le_bytes([edit[0], edit[1]]) as usize % target.len();
        let value = edit[3];
        match edit[2] % 4 {
            0 => target[at] = value,
            1 => target[at] ^= value,
            2 => target[at] = target[at].wrapping_add(value),
            _ => {
                let end = (at + 64).min(target.len());
                target[at..end].fill(0);
            }
        }
    }
}

/// Like `mutate` for a whole volume: each 6-byte edit names one of the base volume's
/// non-zero blocks (u16), an offset in it (u16), an operation and a byte; operation 4
/// copies the whole block over another used block (a misdirected write).
pub fn mutate_volume(volume: &mut Sparse, used_blocks: &[u64], data: &[u8]) {
    for edit in data.chunks_exact(6) {
        let pick = u16::from_le_bytes([edit[0], edit[1]]) as usize;
        let block = used_blocks[pick % used_blocks.len()];
        let at = u16::from_le_bytes([edit[2], edit[3]]) as usize % BLOCK_BYTES;
        let value = edit[5];
        let bytes = volume.block_mut(block);
        match edit[4] % 5 {
            0 => bytes[at] = value,
            1 => bytes[at] ^= value,
            2 => bytes[at] = bytes[at].wrapping_add(value),
            3 => {
                let end = (at + 512).min(BLOCK_BYTES);
                bytes[at..end].fill(0);
            }
            _ => {
                let src = bytes.to_vec();
                let to = used_blocks[(pick + 1 + value as usize) % used_blocks.len()];
                volume.block_mut(to).copy_from_slice(&src);
            }
        }
    }
}

/// A volume image kept as its non-zero blocks: the base volume is 8 MiB (the size a new
/// volume starts at) but holds a few hundred KiB, and copying it whole for every input
/// made the `open` target twenty times slower.
#[derive(Clone, Debug)]
pub struct Sparse {
    pub len_bytes: u64,
    /// Block number to its 4096 bytes; absent blocks are zeros.
    pub blocks: std::collections::BTreeMap<u64, Box<[u8]>>,
}

impl Sparse {
    /// The non-zero blocks of `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> Sparse {
        let blocks = bytes
            .chunks(BLOCK_BYTES)
            .enumerate()
            .filter(|(_, block)| block.iter().any(|&b| b != 0))
            .map(|(i, block)| {
                let mut full = vec![0u8; BLOCK_BYTES];
                full[..block.len()].copy_from_slice(block);
                (i as u64, full.into_boxed_slice())
            })
            .collect();
        Sparse {
            len_bytes: bytes.len() as u64,
            blocks,
        }
    }

    /// The block's bytes, created as zeros if absent.
    pub fn block_mut(&mut self, block: u64) -> &mut [u8] {
        self.blocks
            .entry(block)
            .or_insert_with(|| vec![0u8; BLOCK_BYTES].into_boxed_slice())
    }

    /// Copies `offset..offset + buf.len()` into `buf`; false if it reaches past the end.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> bool {
        let Some(end) = offset.checked_add(buf.len() as u64) else {
            return false;
        };
        if end > self.len_bytes {
            return false;
        }
        let mut done = 0usize;
        while done < buf.len() {
            let at = offset + done as u64;
            let block = at / BLOCK_BYTES as u64;
            let in_block = (at % BLOCK_BYTES as u64) as usize;
            let n = (BLOCK_BYTES - in_block).min(buf.len() - done);
            match self.blocks.get(&block) {
                Some(bytes) => buf[done..done + n].copy_from_slice(&bytes[in_block..in_block + n]),
                None => buf[done..done + n].fill(0),
            }
            done += n;
        }
        true
    }

    /// Writes `data` at `offset`; false if it reaches past the end.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> bool {
        let Some(end) = offset.checked_add(data.len() as u64) else {
            return false;
        };
        if end > self.len_bytes {
            return false;
        }
        let mut done = 0usize;
        while done < data.len() {
            let at = offset + done as u64;
            let in_block = (at % BLOCK_BYTES as u64) as usize;
            let n = (BLOCK_BYTES - in_block).min(data.len() - done);
            self.block_mut(at / BLOCK_BYTES as u64)[in_block..in_block + n]
                .copy_from_slice(&data[done..done + n]);
            done += n;
        }
        true
    }

    /// Cuts the volume to `len_bytes` (a file truncated after the fact).
    pub fn truncate(&mut self, len_bytes: u64) {
        self.len_bytes = self.len_bytes.min(len_bytes);
        let first_gone = self.len_bytes.div_ceil(BLOCK_BYTES as u64);
        self.blocks.split_off(&first_gone);
    }
}

/// A `Storage` over a `Sparse` image: the `MemStorage` of the fuzz targets.
pub struct SparseStorage(std::sync::Mutex<Sparse>);

impl SparseStorage {
    pub fn new(volume: Sparse) -> SparseStorage {
        SparseStorage(std::sync::Mutex::new(volume))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sparse> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn past_end(offset: u64, len: usize) -> tucana::Error {
    tucana::Error::Io(std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        format!("{len} bytes at {offset:#x} reach past the end of the volume"),
    ))
}

impl Storage for SparseStorage {
    fn len_bytes(&self) -> tucana::Result<u64> {
        Ok(self.lock().len_bytes)
    }

    fn grow(&self, len_bytes: u64) -> tucana::Result<()> {
        let mut v = self.lock();
        v.len_bytes = v.len_bytes.max(len_bytes);
        Ok(())
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> tucana::Result<()> {
        if self.lock().read(offset, buf) {
            Ok(())
        } else {
            Err(past_end(offset, buf.len()))
        }
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> tucana::Result<()> {
        // As in `MemStorage`: the engine writes only inside space it has grown, so a
        // write past the end is an engine bug, and the fuzzer should see it.
        assert!(
            self.lock().write(offset, data),
            "write of {} bytes at {offset:#x} past the end of the volume",
            data.len()
        );
        Ok(())
    }

    fn sync(&self) -> tucana::Result<()> {
        Ok(())
    }
}

/// Re-stamps a superblock slot's own crc.
pub fn fix_slot_crc(slot: &mut [u8]) {
    assert_eq!(slot.len(), BLOCK_BYTES);
    let crc = crc32c::crc32c_append(crc32c::crc32c(&slot[..SLOT_CRC_AT]), &[0u8; 4]);
    slot[SLOT_CRC_AT..].copy_from_slice(&crc.to_le_bytes());
}

/// Re-stamps a node image's crc (word 0, low half), making it a committed node.
pub fn fix_node_crc(img: &mut [u8]) {
    assert_eq!(img.len(), BLOCK_BYTES);
    let crc = crc32c::crc32c_append(crc32c::crc32c(&[0u8; 8]), &img[8..]);
    let w0 = crc as u64 | (NODE_MAGIC as u64) << 32;
    img[..8].copy_from_slice(&w0.to_le_bytes());
}

/// Re-stamps a bitmap buddy's crc.
pub fn fix_buddy_crc(buddy: &mut [u8]) {
    assert_eq!(buddy.len(), BUDDY_BYTES);
    buddy[BUDDY_CRC_AT..BUDDY_CRC_AT + 4].fill(0);
    let crc = crc32c::crc32c(buddy);
    buddy[BUDDY_CRC_AT..BUDDY_CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

/// Re-stamps every checksum of group 0's structures in a volume image: each superblock
/// slot's descriptor crc and own crc, every block that carries the node magic, and the
/// two bitmap buddies. Log records keep their crcs (their boundaries are not known here).
pub fn fix_volume_crcs(volume: &mut Sparse) {
    for (&block, bytes) in volume.blocks.iter_mut() {
        if block >= 2 && u64_at(bytes, 0) >> 32 == NODE_MAGIC as u64 {
            fix_node_crc(bytes);
        }
    }
    for buddy_at in [2 * BLOCK_BYTES as u64, 4 * BLOCK_BYTES as u64] {
        let mut buddy = vec![0u8; BUDDY_BYTES];
        if volume.read(buddy_at, &mut buddy)
            && &buddy[BUDDY_MAGIC_AT..BUDDY_MAGIC_AT + 8] == BUDDY_MAGIC
        {
            fix_buddy_crc(&mut buddy);
            volume.write(buddy_at, &buddy);
        }
    }
    for slot in 0..2u64 {
        let mut bytes = vec![0u8; BLOCK_BYTES];
        if !volume.read(slot * BLOCK_BYTES as u64, &mut bytes) {
            continue;
        }
        let desc_at = u64_at(&bytes, SB_DESCRIPTOR_AT);
        let desc_len = u64_at(&bytes, SB_DESCRIPTOR_BYTES_AT);
        // Descriptors are small; a mutated length is left to the engine to reject.
        if desc_len <= 1 << 20 {
            let mut desc = vec![0u8; desc_len as usize];
            if volume.read(desc_at, &mut desc) {
                let crc = crc32c::crc32c(&desc);
                bytes[SB_DESCRIPTOR_CRC_AT..SB_DESCRIPTOR_CRC_AT + 4]
                    .copy_from_slice(&crc.to_le_bytes());
            }
        }
        fix_slot_crc(&mut bytes);
        volume.write(slot * BLOCK_BYTES as u64, &bytes);
    }
}

/// Opens `volume` from memory and reads everything through the public API: every
/// keyspace forwards and backwards, every key by `get`, a prefix scan, a snapshot, stats,
/// then `check` and a few writes. Errors are expected on mutated volumes; only a panic
/// (or an abort) is a finding.
pub fn open_and_read(volume: Sparse) {
    let storage = Arc::new(SparseStorage::new(volume));
    let Ok(db) = Database::builder()
        .commit_interval(None)
        .flush_interval(None)
        .create_if_missing(false)
        .open_storage(storage)
    else {
        return;
    };
    for name in db.keyspace_names() {
        let Ok(ks) = db.open_keyspace(&name) else {
            continue;
        };
        let mut keys = Vec::new();
        for (key, _) in ks.range::<&[u8], _>(..).map_while(Result::ok) {
            keys.push(key);
        }
        for item in ks.range::<&[u8], _>(..).rev() {
            if item.is_err() {
                break;
            }
        }
        for key in keys.iter().take(200) {
            let _ = ks.get(key);
        }
        for item in ks.prefix(b"shared").take(50) {
            if item.is_err() {
                break;
            }
        }
        // A snapshot of a damaged volume may fail (applying deferred updates reads
        // records); both are fine here, a panic is not.
        if let Ok(snapshot) = ks.snapshot() {
            let _ = snapshot.get(b"key000001");
        }
        let _ = ks.len();
        // Writing to a damaged volume must fail cleanly or work; both are fine here.
        let _ = ks.put(b"fuzz", b"written after open");
        let _ = ks.delete(b"tail1");
    }
    let _ = db.stats();
    let _ = db.check();
    let _ = db.close();
}
