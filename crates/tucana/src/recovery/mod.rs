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
use crate::commit::Committer;
use crate::descriptor::Descriptor;
use crate::error::{Error, Result};
use crate::options::Options;
use crate::region::{Links, Region, Regions};
use crate::replica::Replica;
use crate::shared::Shared;
use crate::types::{CommitEpoch, DiskOffset, BLOCK_BYTES};
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
        Err(_) if superblock::creation_was_interrupted(storage.as_ref())? => None,
        other => other?,
    };
    let Some(sb) = newest else {
        // Only an empty file (or one whose creation we began and never committed) becomes
        // a new volume: a non-empty file without a superblock is somebody else's data and
        // is never overwritten.
        let len = storage.len_bytes()?;
        if len != 0 && !superblock::creation_was_interrupted(storage.as_ref())? {
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
    let desc = read_descriptor(storage.as_ref(), &sb)?;
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
    let (regions, replicas) = open_regions(&shared, &sb, desc_blocks, &desc)?;
    let regions = Regions::new(regions, replicas, desc.next_region_id);
    let committer = Committer::new(shared.clone(), sb.epoch, Some((sb.descriptor, desc_blocks)));
    committer.commit(&regions)?;
    Ok(Opened {
        shared,
        regions,
        committer,
    })
}

/// The descriptor the superblock `sb` names, read and checked (inside the volume, crc,
/// epoch).
fn read_descriptor(storage: &dyn Storage, sb: &superblock::Superblock) -> Result<Descriptor> {
    if sb.descriptor.0.saturating_add(sb.descriptor_bytes) > sb.volume_bytes {
        return Err(Error::corruption(
            "superblock",
            superblock::slot_offset(sb.epoch),
            "descriptor lies past the volume end",
        ));
    }
    let mut desc_bytes = vec![0u8; sb.descriptor_bytes as usize];
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
    Ok(desc)
}

type Opens = (
    BTreeMap<String, Arc<Region>>,
    BTreeMap<String, Arc<Replica>>,
);

/// Every region and replica of the commit `desc` (whose descriptor takes `desc_blocks`
/// at `sb.descriptor`), opened: regions with their log replayed, replicas as they are.
fn open_regions(
    shared: &Arc<Shared>,
    sb: &superblock::Superblock,
    desc_blocks: u64,
    desc: &Descriptor,
) -> Result<Opens> {
    let (mut regions, mut replicas) = (BTreeMap::new(), BTreeMap::new());
    let desc_end = sb.descriptor.0 + desc_blocks * BLOCK_BYTES;
    for rd in &desc.regions {
        let overlaps = rd
            .segments
            .iter()
            .any(|(at, s)| at.0 < desc_end && at.0 + s.size_bytes > sb.descriptor.0);
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
        if rd.replica.is_some() {
            let replica = Replica::open(shared.clone(), rd)?;
            replicas.insert(rd.name.clone(), Arc::new(replica));
        } else {
            let (region, _, _) = Region::open(shared, rd, Links::Local)?;
            regions.insert(rd.name.clone(), Arc::new(region));
        }
    }
    Ok((regions, replicas))
}

/// Written to slot 0 before anything else when a volume is created, and overwritten by
/// the second commit: a file that starts with it and whose slot 1 was never written is a
/// creation that crashed before committing anything, safe to create again.
fn create(options: Options, volume: Volume) -> Result<Opened> {
    let storage = volume.storage().clone();
    if storage.len_bytes()? < INITIAL_VOLUME_BYTES {
        storage.grow(INITIAL_VOLUME_BYTES)?;
    }
    superblock::write_creation_marker(storage.as_ref())?;
    storage.sync()?;
    let allocator = Allocator::create(storage.len_bytes()? / BLOCK_BYTES * BLOCK_BYTES);
    let shared = Arc::new(Shared::new(options, volume, allocator));
    let regions = Regions::new(BTreeMap::new(), BTreeMap::new(), 1);
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
