//! `check`: walks a whole volume and verifies every invariant and checksum.
//!
//! It commits first, then reads the committed state back from the volume as a fresh
//! open would: superblock, descriptor, bitmap buddies, every index node of every region
//! (checksum, own offset, kind, key order across the whole tree, each entry's prefix and
//! hash against its key, every pivot against its node's stem and prefix and inside the
//! pivots above it, every key inside the pivots above its leaf), every record the index
//! points at, the exact live bytes of every log segment, and that no two structures share
//! a block and every referenced block is allocated. Holding the commit lock keeps the
//! committed state still while writers go on.

use std::collections::BTreeMap;

use crate::alloc::{Allocator, GROUP_BLOCKS, GROUP_RESERVED_BLOCKS};
use crate::commit::Committer;
use crate::descriptor::{Descriptor, RegionDesc};
use crate::error::{Error, Result};
use crate::index::{self, key_hash, key_prefix, ImageContents, ImagePivot};
use crate::log::record::{Header, RecordRef, HEADER_BYTES};
use crate::region::{Region, Regions};
use crate::shared::Shared;
use crate::types::{CommitEpoch, DiskOffset, RegionId, BLOCK_BYTES};
use crate::volume::superblock::{self, Superblock};
use crate::volume::Storage;

/// What `Database::check` found on a sound volume.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckReport {
    pub commit_epoch: u64,
    pub keyspaces: u64,
    pub index_nodes: u64,
    pub keys: u64,
    pub log_segments: u64,
    pub log_records: u64,
    pub allocated_blocks: u64,
    /// Allocated blocks no committed structure references (space a crash leaked, or
    /// blocks kept for the older superblock slot's commit).
    pub unreferenced_blocks: u64,
    /// Members whose slot headers were verified (0 for a single-file volume; a removed
    /// member's entry in the table is not one).
    pub members: u64,
}

/// Blocks referenced by committed structures, to find overlaps.
struct Refs<'a> {
    allocator: &'a Allocator,
    owner: BTreeMap<u64, &'static str>,
}

impl Refs<'_> {
    fn mark(&mut self, off: DiskOffset, blocks: u64, what: &'static str) -> Result<()> {
        if !off.block_aligned() || blocks == 0 {
            return Err(Error::corruption(what, off, "extent is not block aligned"));
        }
        if !self.allocator.is_allocated(off, blocks) {
            return Err(Error::corruption(
                what,
                off,
                "referenced but free in the bitmap",
            ));
        }
        for b in 0..blocks {
            let at = off.0 + b * BLOCK_BYTES;
            if let Some(other) = self.owner.insert(at, what) {
                return Err(Error::corruption(
                    what,
                    DiskOffset(at),
                    format!("block is also used by {other}"),
                ));
            }
        }
        Ok(())
    }
}

/// How many leaked blocks a failed check names (the first ones by offset).
const LEAKED_NAMED: usize = 16;

pub(crate) fn check(
    shared: &Shared,
    regions: &Regions,
    committer: &Committer,
) -> Result<CheckReport> {
    let mut cs = committer.lock();
    committer.commit_locked(&mut cs, regions)?;
    let storage = shared.volume.storage().clone();
    storage.verify_members()?;
    let (sb, desc) = read_newest_commit(storage.as_ref(), cs.epoch())?;
    let allocator = Allocator::load(
        storage.as_ref(),
        sb.volume_bytes,
        &desc.bitmap_slots,
        sb.epoch,
    )?;
    let mut refs = Refs {
        allocator: &allocator,
        owner: BTreeMap::new(),
    };
    mark_volume_structures(&mut refs, &sb, &desc)?;
    let mut report = CheckReport {
        commit_epoch: sb.epoch.0,
        keyspaces: desc.regions.len() as u64,
        allocated_blocks: allocator.allocated_blocks(),
        members: storage
            .members()
            .iter()
            .filter(|m| m.state != "removed")
            .count() as u64,
        ..CheckReport::default()
    };
    for rd in &desc.regions {
        let unknown = || {
            Error::corruption(
                "commit descriptor",
                sb.descriptor,
                format!("unknown region {:?}", rd.name),
            )
        };
        if rd.replica.is_some() {
            regions.replica(&rd.name).ok_or_else(unknown)?;
            let records = Records::Replica {
                id: rd.id,
                seed: rd.seed,
                storage: storage.as_ref(),
            };
            check_region(&records, rd, sb.descriptor, &mut refs, &mut report)?;
        } else {
            let region = regions.get(&rd.name).ok_or_else(unknown)?;
            check_region(
                &Records::Local(&region),
                rd,
                sb.descriptor,
                &mut refs,
                &mut report,
            )?;
        }
    }
    report.unreferenced_blocks = report.allocated_blocks - refs.owner.len() as u64;
    // Every allocated block is referenced by the commit just made or listed in its free
    // log: anything else would stay allocated for ever (a leak), even across reopens.
    if report.unreferenced_blocks != 0 {
        let leaked: Vec<DiskOffset> = (0..sb.volume_bytes / BLOCK_BYTES)
            .map(|b| DiskOffset(b * BLOCK_BYTES))
            .filter(|&at| allocator.is_allocated(at, 1) && !refs.owner.contains_key(&at.0))
            .take(LEAKED_NAMED)
            .collect();
        let named: Vec<String> = leaked.iter().map(|at| format!("{:#x}", at.0)).collect();
        return Err(Error::corruption(
            "allocation bitmap",
            leaked.first().copied().unwrap_or(DiskOffset::NONE),
            format!(
                "{} allocated blocks are referenced by nothing in the commit nor in its free log (first ones at {})",
                report.unreferenced_blocks,
                named.join(", ")
            ),
        ));
    }
    drop(cs);
    Ok(report)
}

/// The newest superblock slot and its descriptor, read back from the volume as a fresh
/// open would; the slot must be the commit just made (`epoch`).
fn read_newest_commit(
    storage: &dyn Storage,
    epoch: CommitEpoch,
) -> Result<(Superblock, Descriptor)> {
    let sb = superblock::read_newest(storage)?
        .ok_or_else(|| Error::corruption("superblock", DiskOffset(0), "no valid slot"))?;
    if sb.epoch != epoch {
        return Err(Error::corruption(
            "superblock",
            superblock::slot_offset(epoch),
            format!(
                "newest slot has epoch {:?}, the last commit was {:?}",
                sb.epoch, epoch
            ),
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
    Ok((sb, desc))
}

/// The entry of region `name` in the newest commit on the volume, and that commit's epoch
/// (`None` if it lists no such region). The caller holds the commit lock.
pub(crate) fn newest_region_entry(
    storage: &dyn Storage,
    name: &str,
) -> Result<Option<(RegionDesc, u64)>> {
    let sb = superblock::read_newest(storage)?
        .ok_or_else(|| Error::corruption("superblock", DiskOffset(0), "no valid slot"))?;
    let (_, desc) = read_newest_commit(storage, sb.epoch)?;
    Ok(desc
        .regions
        .into_iter()
        .find(|rd| rd.name == name)
        .map(|rd| (rd, sb.epoch.0)))
}

/// Marks what every volume holds outside the regions: each group's reserved blocks
/// (superblocks, bitmap buddies), the descriptor, and the extents its free log lists.
fn mark_volume_structures(refs: &mut Refs<'_>, sb: &Superblock, desc: &Descriptor) -> Result<()> {
    let volume_blocks = sb.volume_bytes / BLOCK_BYTES;
    let mut group_start = 0;
    while group_start < volume_blocks {
        let reserved = GROUP_RESERVED_BLOCKS.min(volume_blocks - group_start);
        refs.mark(
            DiskOffset(group_start * BLOCK_BYTES),
            reserved,
            "reserved blocks",
        )?;
        group_start += GROUP_BLOCKS;
    }
    refs.mark(
        sb.descriptor,
        sb.descriptor_bytes.div_ceil(BLOCK_BYTES),
        "commit descriptor",
    )?;
    for (off, blocks) in &desc.free_log {
        refs.mark(*off, *blocks, "free log")?;
    }
    Ok(())
}

/// Verifies one region of the commit (`rd`, in the descriptor at `descriptor`): its
/// segments' records, its whole tree, its key count, and every segment's live bytes
/// against what the tree reaches; adds its counts to `report`.
fn check_region(
    region: &Records<'_>,
    rd: &RegionDesc,
    descriptor: DiskOffset,
    refs: &mut Refs<'_>,
    report: &mut CheckReport,
) -> Result<()> {
    let mut segments: BTreeMap<u64, (u64, u64)> = BTreeMap::new(); // off -> (size, live)
    for (off, s) in &rd.segments {
        refs.mark(*off, s.size_bytes / BLOCK_BYTES, "log segment")?;
        segments.insert(off.0, (s.size_bytes, 0));
        report.log_records += check_segment(region, *off, s.written_bytes)?;
    }
    report.log_segments += rd.segments.len() as u64;
    let mut walk = TreeVerifier {
        region,
        refs,
        segments: &mut segments,
        prev_key: None,
        keys: 0,
        nodes: 0,
    };
    if !rd.root.is_none() {
        walk.node(rd.root, 0, None, None)?;
    }
    let (keys, nodes) = (walk.keys, walk.nodes);
    if keys != rd.keys {
        return Err(Error::corruption(
            "commit descriptor",
            descriptor,
            format!(
                "region {:?} counts {} keys, its tree holds {keys}",
                rd.name, rd.keys
            ),
        ));
    }
    for (off, s) in &rd.segments {
        let live = segments[&off.0].1;
        if live != s.live_bytes {
            return Err(Error::corruption(
                "log segment",
                *off,
                format!(
                    "recorded {} live bytes, the index reaches {live}",
                    s.live_bytes
                ),
            ));
        }
    }
    report.keys += keys;
    report.index_nodes += nodes;
    Ok(())
}

/// Verifies the records of a segment's first `written` bytes; returns how many.
fn check_segment(region: &Records<'_>, base: DiskOffset, written: u64) -> Result<u64> {
    let mut pos = 0;
    let mut records = 0;
    while pos < written {
        let at = base.0 + pos;
        let len = region.with_record(at, |r| r.header.total_bytes())?;
        pos += len;
        records += 1;
    }
    if pos != written {
        return Err(Error::corruption(
            "log segment",
            base,
            format!("records end at byte {pos}, the segment counts {written} written"),
        ));
    }
    Ok(records)
}

/// Where `check` reads a region's records from.
enum Records<'a> {
    /// A local region: records may still be in one of its tail buffers.
    Local(&'a Region),
    /// A replica (a backup's copy of another server's region): all of it on the volume.
    Replica {
        id: RegionId,
        seed: u32,
        storage: &'a dyn Storage,
    },
}

impl Records<'_> {
    fn id(&self) -> RegionId {
        match self {
            Records::Local(region) => region.id(),
            Records::Replica { id, .. } => *id,
        }
    }

    fn storage(&self) -> &dyn Storage {
        match self {
            Records::Local(region) => region.shared().volume.storage().as_ref(),
            Records::Replica { storage, .. } => *storage,
        }
    }

    /// Calls `f` with the record at `ptr`, its checksum verified.
    fn with_record<R>(&self, ptr: u64, f: impl FnOnce(RecordRef<'_>) -> R) -> Result<R> {
        match self {
            Records::Local(region) => region.with_record(ptr, true, f),
            Records::Replica { seed, storage, .. } => {
                let at = DiskOffset(ptr);
                let mut head = [0u8; HEADER_BYTES];
                storage.read_at(ptr, &mut head)?;
                let len = Header::decode(&head, at)?.total_bytes() as usize;
                let mut bytes = vec![0u8; len];
                storage.read_at(ptr, &mut bytes)?;
                Ok(f(RecordRef::parse(&bytes, *seed, true, at)?))
            }
        }
    }
}

struct TreeVerifier<'a, 'r> {
    region: &'a Records<'a>,
    refs: &'a mut Refs<'r>,
    segments: &'a mut BTreeMap<u64, (u64, u64)>,
    prev_key: Option<Vec<u8>>,
    keys: u64,
    nodes: u64,
}

impl TreeVerifier<'_, '_> {
    /// Verifies the subtree at `off`, whose keys must lie in `[low, high)` (the pivots
    /// around it in its ancestors; `None` at the tree's edges).
    fn node(
        &mut self,
        off: DiskOffset,
        depth: usize,
        low: Option<&[u8]>,
        high: Option<&[u8]>,
    ) -> Result<()> {
        if depth > 64 {
            return Err(Error::corruption(
                "index node",
                off,
                "tree deeper than 64 levels",
            ));
        }
        self.refs.mark(off, 1, "index node")?;
        self.nodes += 1;
        let mut image = vec![0u8; BLOCK_BYTES as usize];
        self.region.storage().read_at(off.0, &mut image)?;
        match index::image_contents(&image, off, self.region.id())? {
            ImageContents::Internal {
                stem,
                pivots,
                children,
            } => {
                let pivots = self.pivots(off, &stem, &pivots, low, high)?;
                for (i, child) in children.into_iter().enumerate() {
                    let lo = if i == 0 {
                        low
                    } else {
                        Some(&pivots[i - 1][..])
                    };
                    let hi = pivots.get(i).map_or(high, |p| Some(&p[..]));
                    self.node(child, depth + 1, lo, hi)?;
                }
            }
            ImageContents::Leaf { stem, entries } => {
                for entry in entries {
                    self.entry(off, &stem, entry, low, high)?;
                }
            }
        }
        Ok(())
    }

    /// The bytes of the pivots of the internal node at `off`, checked: an EXTERNAL pivot's
    /// key (read from the log) against the length, stem and prefix the node keeps for it
    /// (`image_contents` verified the inline ones), all strictly ascending and inside the
    /// node's fences. A pivot that breaks any of this would send lookups to the wrong
    /// child while every key still sorts right.
    fn pivots(
        &self,
        off: DiskOffset,
        stem: &[u8],
        pivots: &[ImagePivot],
        low: Option<&[u8]>,
        high: Option<&[u8]>,
    ) -> Result<Vec<Vec<u8>>> {
        let mut out: Vec<Vec<u8>> = Vec::with_capacity(pivots.len());
        for (i, p) in pivots.iter().enumerate() {
            let bytes = match p {
                ImagePivot::Inline(bytes) => bytes.clone(),
                &ImagePivot::External {
                    ptr,
                    len_bytes,
                    prefix,
                } => {
                    let key = self
                        .region
                        .with_record(ptr, |r: RecordRef<'_>| r.key.to_vec())?;
                    if key.len() != len_bytes as usize
                        || !key.starts_with(stem)
                        || key_prefix(&key[stem.len()..]) != prefix
                    {
                        return Err(Error::corruption(
                            "index node",
                            off,
                            format!(
                                "pivot {i}: the key at {} differs from its length, stem or prefix in the node",
                                DiskOffset(ptr)
                            ),
                        ));
                    }
                    key
                }
            };
            if out.last().is_some_and(|prev| *prev >= bytes) {
                return Err(Error::corruption(
                    "index node",
                    off,
                    format!("pivot {i}: pivots not strictly ascending"),
                ));
            }
            if low.is_some_and(|l| bytes.as_slice() < l)
                || high.is_some_and(|h| bytes.as_slice() > h)
            {
                return Err(Error::corruption(
                    "index node",
                    off,
                    format!("pivot {i}: outside the node's fences"),
                ));
            }
            out.push(bytes);
        }
        Ok(out)
    }

    fn entry(
        &mut self,
        leaf: DiskOffset,
        stem: &[u8],
        (prefix, hash, ptr): (u64, u32, u64),
        low: Option<&[u8]>,
        high: Option<&[u8]>,
    ) -> Result<()> {
        let at = DiskOffset(ptr);
        let (key, len, tombstone) = self.region.with_record(ptr, |r: RecordRef<'_>| {
            (
                r.key.to_vec(),
                r.header.total_bytes(),
                r.header.is_tombstone() || r.header.is_link(),
            )
        })?;
        if tombstone {
            return Err(Error::corruption(
                "index node",
                leaf,
                format!("entry points at a non-value record {at}"),
            ));
        }
        if !key.starts_with(stem)
            || key_prefix(&key[stem.len()..]) != prefix
            || key_hash(&key) != hash
        {
            return Err(Error::corruption(
                "index node",
                leaf,
                "entry's prefix or hash differs from its key",
            ));
        }
        if self
            .prev_key
            .as_deref()
            .is_some_and(|p| p >= key.as_slice())
        {
            return Err(Error::corruption("index node", leaf, "keys out of order"));
        }
        if low.is_some_and(|l| key.as_slice() < l) || high.is_some_and(|h| key.as_slice() >= h) {
            return Err(Error::corruption(
                "index node",
                leaf,
                "key outside the leaf's fences (the pivots above it)",
            ));
        }
        let Some((base, (size, live))) = self.segments.range_mut(..=ptr).next_back() else {
            return Err(Error::corruption(
                "index node",
                leaf,
                format!("pointer {at} is outside the region's log"),
            ));
        };
        if ptr + len > base + *size {
            return Err(Error::corruption(
                "index node",
                leaf,
                format!("pointer {at} is outside the region's log"),
            ));
        }
        *live += len;
        self.keys += 1;
        self.prev_key = Some(key);
        Ok(())
    }
}
