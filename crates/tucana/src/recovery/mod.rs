//! Opening a volume: pick the newest valid superblock slot, load its descriptor and
//! bitmaps, apply its free log, take each region's committed tree as it is (nothing is
//! loaded: nodes are read through the mapping when touched), and replay only the log
//! written since that commit (WiscKey §3.3.3), stopping at the first record that is torn,
//! invalid, of another life of the log, or out of sequence. Then bump every region's log
//! generation and commit, so stale records past the replayed end can never be taken for
//! new ones.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::alloc::Allocator;
use crate::commit::descriptor::{Descriptor, RegionDesc};
use crate::commit::Committer;
use crate::error::{Error, Result};
use crate::index::Tree;
use crate::log::record::{self, Header, RecordRef, GENERATION_MASK, HEADER_BYTES};
use crate::log::tail::Tail;
use crate::log::writer::Writer;
use crate::log::SegmentStats;
use crate::options::Options;
use crate::region::{Region, Regions, Replayed};
use crate::shared::Shared;
use crate::types::{CommitEpoch, DiskOffset, SeqNo, TreeEpoch, BLOCK_BYTES};
use crate::volume::superblock;
use crate::volume::{Storage, Volume};

/// A fresh volume starts this big (sparse) and grows as needed.
const INITIAL_VOLUME_BYTES: u64 = 8 << 20;

/// An opened volume's parts, with a commit made (the replayed log is in it, and every
/// region's log generation was bumped).
pub(crate) struct Opened {
    pub shared: Arc<Shared>,
    pub regions: Regions,
    pub committer: Committer,
}

pub(crate) fn open(options: Options, storage: Arc<dyn Storage>) -> Result<Opened> {
    let volume = Volume::new(storage.clone());
    let newest = match superblock::read_newest(storage.as_ref()) {
        Err(_) if creation_was_interrupted(storage.as_ref())? => None,
        other => other?,
    };
    let Some(sb) = newest else {
        // Only an empty file (or one whose creation we began and never committed) becomes
        // a new volume: a non-empty file without a superblock is somebody else's data and
        // is never overwritten.
        let len = storage.len_bytes()?;
        if len != 0 && !creation_was_interrupted(storage.as_ref())? {
            return Err(Error::NotAVolume(
                "the file has data but no superblock".into(),
            ));
        }
        return create(options, volume);
    };
    let len = storage.len_bytes()?;
    if len < sb.volume_bytes {
        return Err(Error::corruption(
            "volume",
            DiskOffset(len),
            format!(
                "file is {len} bytes, the superblock says {}",
                sb.volume_bytes
            ),
        ));
    }
    let mut desc_bytes = vec![0u8; sb.descriptor_bytes as usize];
    if sb.descriptor.0.saturating_add(sb.descriptor_bytes) > sb.volume_bytes {
        return Err(Error::corruption(
            "superblock",
            superblock::slot_offset(sb.epoch),
            "descriptor lies past the volume end",
        ));
    }
    storage.read_at(sb.descriptor.0, &mut desc_bytes)?;
    if crc32c::crc32c(&desc_bytes) != sb.descriptor_crc {
        return Err(Error::corruption(
            "commit descriptor",
            sb.descriptor,
            "checksum mismatch",
        ));
    }
    let desc = Descriptor::decode(&desc_bytes, sb.descriptor)?;
    if desc.epoch != sb.epoch {
        return Err(Error::corruption(
            "commit descriptor",
            sb.descriptor,
            "epoch differs from the superblock's",
        ));
    }
    let allocator = Allocator::load(
        storage.as_ref(),
        sb.volume_bytes,
        &desc.bitmap_slots,
        sb.epoch,
    )?;
    // Log segments allocated after the commit may lie past its volume length.
    allocator.cover_file(len);
    for (off, blocks) in &desc.free_log {
        if let Err(why) = allocator.try_release(*off, *blocks) {
            return Err(Error::corruption("free log", *off, why));
        }
    }
    // The descriptor's extent is freed by the commit that supersedes it, so the length
    // the superblock gives must be the extent its commit allocated: whole blocks, still
    // allocated after the free log, no more than its padding beyond the encoded bytes
    // (a commit pads by less than two blocks), and no log segment's (below). A longer
    // length that decodes (trailing zeros) would later free blocks that are not its own.
    let desc_blocks = sb.descriptor_bytes.div_ceil(BLOCK_BYTES);
    let encoded_blocks = (desc.encode().len() as u64).div_ceil(BLOCK_BYTES);
    if !sb.descriptor.block_aligned()
        || desc_blocks > encoded_blocks + 2
        || !allocator.is_allocated(sb.descriptor, desc_blocks)
    {
        return Err(Error::corruption(
            "superblock",
            superblock::slot_offset(sb.epoch),
            format!(
                "descriptor extent of {desc_blocks} blocks at {} is not the one its commit allocated",
                sb.descriptor
            ),
        ));
    }
    let shared = Arc::new(Shared::new(options, volume, allocator));
    let mut regions = BTreeMap::new();
    for rd in &desc.regions {
        let region = recover_region(&shared, rd)?;
        let overlaps = {
            let desc_end = sb.descriptor.0 + desc_blocks * BLOCK_BYTES;
            region.overlaps_segment(sb.descriptor.0, desc_end)
        };
        if overlaps {
            return Err(Error::corruption(
                "superblock",
                superblock::slot_offset(sb.epoch),
                format!(
                    "descriptor extent at {} overlaps a log segment of region {:?}",
                    sb.descriptor, rd.name
                ),
            ));
        }
        regions.insert(rd.name.clone(), Arc::new(region));
    }
    let regions = Regions::new(regions, desc.next_region_id);
    let committer = Committer::new(shared.clone(), sb.epoch, Some((sb.descriptor, desc_blocks)));
    committer.commit(&regions)?;
    Ok(Opened {
        shared,
        regions,
        committer,
    })
}

/// Written to slot 0 before anything else when a volume is created, and overwritten by
/// the second commit: a file that starts with it and whose slot 1 was never written is a
/// creation that crashed before committing anything, safe to create again.
const CREATING_MAGIC: &[u8; 8] = b"TUCANAC\0";

fn creation_was_interrupted(storage: &dyn Storage) -> Result<bool> {
    let slot = superblock::SLOT_BYTES;
    if storage.len_bytes()? < 2 * slot as u64 {
        return Ok(false);
    }
    let mut slots = vec![0u8; 2 * slot];
    storage.read_at(0, &mut slots)?;
    Ok(&slots[..8] == CREATING_MAGIC
        && slots[8..slot].iter().all(|b| *b == 0)
        && slots[slot..].iter().all(|b| *b == 0))
}

fn create(options: Options, volume: Volume) -> Result<Opened> {
    let storage = volume.storage().clone();
    if storage.len_bytes()? < INITIAL_VOLUME_BYTES {
        storage.grow(INITIAL_VOLUME_BYTES)?;
    }
    let mut marker = vec![0u8; superblock::SLOT_BYTES];
    marker[..8].copy_from_slice(CREATING_MAGIC);
    storage.write_at(0, &marker)?;
    storage.write_at(
        superblock::SLOT_BYTES as u64,
        &vec![0u8; superblock::SLOT_BYTES],
    )?;
    storage.sync()?;
    let allocator = Allocator::create(storage.len_bytes()? / BLOCK_BYTES * BLOCK_BYTES);
    let shared = Arc::new(Shared::new(options, volume, allocator));
    let regions = Regions::new(BTreeMap::new(), 1);
    let committer = Committer::new(shared.clone(), CommitEpoch(0), None);
    // Two commits: the second overwrites the creation marker in slot 0.
    committer.commit(&regions)?;
    committer.commit(&regions)?;
    Ok(Opened {
        shared,
        regions,
        committer,
    })
}

/// The relocation tail of a region as its commit left it: the copies below `pos.used_bytes`
/// are what the committed tree may point at; anything garbage collection appended after
/// the commit is dropped (the index goes back to the originals, which a commit keeps
/// until two commits sealed after their segment's retirement), so nothing is replayed.
fn recover_gc_tail(
    shared: &Arc<Shared>,
    rd: &RegionDesc,
    segments: &BTreeMap<u64, SegmentStats>,
    pos: crate::log::GcTailPos,
) -> Result<Tail> {
    let fits = segments
        .get(&pos.base.0)
        .is_some_and(|s| s.size_bytes == pos.size_bytes && s.written_bytes == pos.used_bytes);
    if !fits || pos.base == rd.tail {
        return Err(Error::corruption(
            "commit descriptor",
            pos.base,
            format!(
                "relocation tail of region {:?} does not match its segment",
                rd.name
            ),
        ));
    }
    let mut prefix = vec![0u8; pos.used_bytes as usize];
    shared.volume.storage().read_at(pos.base.0, &mut prefix)?;
    Ok(Tail::with_prefix(pos.base, pos.size_bytes, &prefix))
}

fn recover_region(shared: &Arc<Shared>, rd: &RegionDesc) -> Result<Region> {
    let (mut segments, newest_order) = committed_segments(shared, rd)?;
    let gc_tail = match rd.gc_tail {
        None => None,
        Some(pos) => Some(recover_gc_tail(shared, rd, &segments, pos)?),
    };
    let end = replay_scan(shared, rd, &segments);
    let mut next_order = newest_order + 1;
    for (off, size) in &end.chain[1..] {
        segments.insert(
            off.0,
            SegmentStats {
                size_bytes: *size,
                written_bytes: 0,
                live_bytes: 0,
                order: next_order,
            },
        );
        next_order += 1;
    }
    let (tail_base, tail_size) = *end.chain.last().expect("chain is never empty");
    let mut prefix = vec![0u8; end.used_bytes as usize];
    shared.volume.storage().read_at(tail_base.0, &mut prefix)?;
    let tail = Tail::with_prefix(tail_base, tail_size, &prefix);

    let mut writer = Writer::new(
        (rd.generation + 1) & GENERATION_MASK,
        end.next_seq,
        next_order,
    );
    writer.segments = segments;
    let tree = Tree::from_disk(rd.id, rd.root, TreeEpoch(rd.tree_epoch.0 + 1));
    let region = Region::new(
        shared.clone(),
        rd.id,
        rd.name.clone(),
        tree,
        tail,
        gc_tail,
        writer,
        rd.keys,
        rd.root,
    );
    region.apply_replayed(end.items)?;
    Ok(region)
}

/// The log segments a commit lists for region `rd`, checked (allocated, aligned, one
/// order each, the tail among them with the size the descriptor gives it twice), and the
/// newest order among them.
fn committed_segments(
    shared: &Shared,
    rd: &RegionDesc,
) -> Result<(BTreeMap<u64, SegmentStats>, u64)> {
    let allocator = &shared.allocator;
    let mut segments: BTreeMap<u64, SegmentStats> = BTreeMap::new();
    let mut orders = std::collections::BTreeSet::new();
    for (off, s) in &rd.segments {
        if !orders.insert(s.order) {
            return Err(Error::corruption(
                "commit descriptor",
                *off,
                format!(
                    "two log segments of region {:?} have order {}",
                    rd.name, s.order
                ),
            ));
        }
        if !off.block_aligned()
            || s.size_bytes == 0
            || s.size_bytes % BLOCK_BYTES != 0
            || !allocator.is_allocated(*off, s.size_bytes / BLOCK_BYTES)
        {
            return Err(Error::corruption(
                "commit descriptor",
                *off,
                format!("log segment of region {:?} is not allocated", rd.name),
            ));
        }
        segments.insert(off.0, *s);
    }
    match segments.get(&rd.tail.0) {
        None => {
            return Err(Error::corruption(
                "commit descriptor",
                rd.tail,
                format!("tail of region {:?} is not one of its segments", rd.name),
            ))
        }
        // The tail's size is written twice (position and segment list); replay and the
        // tail buffer trust it, so the two must agree.
        Some(s) if s.size_bytes != rd.tail_size_bytes => {
            return Err(Error::corruption(
                "commit descriptor",
                rd.tail,
                format!(
                    "tail of region {:?} is {} bytes but its segment {}",
                    rd.name, rd.tail_size_bytes, s.size_bytes
                ),
            ))
        }
        Some(_) => {}
    }
    Ok((segments, orders.last().copied().unwrap_or(0)))
}

/// Where replay of a region's log ended: the chain of segments it followed from the
/// committed tail (the last one is the new tail), the bytes used in the last, the next
/// sequence number, and the complete units it found, in log order.
struct ReplayEnd {
    chain: Vec<(DiskOffset, u64)>,
    used_bytes: u64,
    next_seq: SeqNo,
    items: Vec<Replayed>,
}

/// Reads region `rd`'s log from its committed position, following LINK records into the
/// segments they name (marking them allocated), and keeps every complete unit (a batch
/// all or nothing); stops at the first record that is torn, invalid, of another life of
/// the log, or out of sequence. Segments only a torn batch's links reached are released.
fn replay_scan(
    shared: &Shared,
    rd: &RegionDesc,
    segments: &BTreeMap<u64, SegmentStats>,
) -> ReplayEnd {
    let storage = shared.volume.storage().clone();
    let allocator = &shared.allocator;
    let seed = record::region_seed(rd.id);
    let mut chain: Vec<(DiskOffset, u64)> = vec![(rd.tail, rd.tail_size_bytes)];
    let mut used = rd.tail_used_bytes;
    let mut seq = rd.next_seq;
    let mut items: Vec<Replayed> = Vec::new();
    let mut staged: Vec<Replayed> = Vec::new();
    // The last complete point: (chain length, used, seq).
    let mut complete = (1usize, used, seq);
    let mut in_batch = false;
    let mut header_buf = [0u8; HEADER_BYTES];
    let mut body = Vec::new();
    loop {
        let (base, size) = *chain.last().expect("chain is never empty");
        if used + HEADER_BYTES as u64 > size {
            break;
        }
        let at = base.plus_bytes(used);
        if storage.read_at(at.0, &mut header_buf).is_err() {
            break;
        }
        let Ok(header) = Header::decode(&header_buf, at) else {
            break;
        };
        let len = header.total_bytes();
        if len > size - used {
            break;
        }
        body.resize(len as usize, 0);
        if storage.read_at(at.0, &mut body).is_err() {
            break;
        }
        let Ok(rec) = RecordRef::parse(&body, seed, true, at) else {
            break;
        };
        // A relocated copy is never part of the chain (its segments have no links into
        // the chain; one can only be met here as stale bytes of a reused block).
        if rec.header.generation != rd.generation & GENERATION_MASK
            || rec.header.seq != seq
            || rec.header.is_relocated()
        {
            break;
        }
        seq = SeqNo(seq.0 + 1);
        used += len;
        if rec.header.is_link() {
            let Ok((next, next_size)) = rec.link_target(at) else {
                break;
            };
            if !next.block_aligned()
                || next_size == 0
                || next_size % BLOCK_BYTES != 0
                || next.0.saturating_add(next_size) > allocator.volume_bytes()
                || segments.contains_key(&next.0)
                || allocator.is_allocated(next, next_size / BLOCK_BYTES)
            {
                break;
            }
            allocator.mark_allocated(next, next_size / BLOCK_BYTES);
            staged.push(Replayed::Link { at, len });
            chain.push((next, next_size));
            used = 0;
            // A link inside a batch belongs to the batch: it counts only if the batch
            // completes (a segment switch can fall in the middle of a batch).
            if !in_batch {
                items.append(&mut staged);
                complete = (chain.len(), used, seq);
            }
        } else {
            staged.push(if rec.header.is_tombstone() {
                Replayed::Delete { at, len }
            } else {
                Replayed::Put { at, len }
            });
            in_batch = rec.header.batch_more();
            if !in_batch {
                items.append(&mut staged);
                complete = (chain.len(), used, seq);
            }
        }
    }
    // Anything after the last complete unit is gone: a torn batch, and segments that only
    // its links reached.
    let (chain_len, used, seq) = complete;
    for (off, size) in chain.drain(chain_len..) {
        allocator.release(off, size / BLOCK_BYTES);
    }
    ReplayEnd {
        chain,
        used_bytes: used,
        next_seq: seq,
        items,
    }
}
