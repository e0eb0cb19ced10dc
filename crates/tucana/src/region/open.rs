//! Opening a region from its entry in a commit descriptor: its committed tree as it is
//! (nothing is loaded: nodes are read through the mapping when touched), its segments
//! checked against the allocator, and the log written since that commit replayed into the
//! tree (WiscKey §3.3.3), stopping at the first record that is torn, invalid, of another
//! life of the log, or out of sequence.
//!
//! Owns: replay and the checks of a region's descriptor entry. Does not own: the volume
//! level of opening (superblock, descriptor, allocator, free log: `crate::recovery`).
//! Used by recovery for every region and by promotion for a replica region, whose LINK
//! records name the primary's segments (`Links::Translated`).
//!
//! Thread-safety: runs before the region is shared with anyone.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{Identity, Region, Replayed};
use crate::descriptor::RegionDesc;
use crate::error::{Error, Result};
use crate::index::Tree;
use crate::log::record::{Header, RecordRef, GENERATION_MASK, HEADER_BYTES};
use crate::log::tail::Tail;
use crate::log::writer::Writer;
use crate::log::SegmentStats;
use crate::shared::Shared;
use crate::types::{DiskOffset, SeqNo, TreeEpoch, BLOCK_BYTES};

/// How replay follows a LINK record to the segment it names.
pub(crate) enum Links<'a> {
    /// Local recovery: the segment was allocated after the commit; it must lie inside the
    /// volume, free in the commit's bitmap and in no list, and replay marks it allocated.
    Local,
    /// Promotion of a replica region: LINKs name the primary's segments; the map gives,
    /// for each origin received since the commit, the backup's copies `(offset, size)`
    /// of the segments the primary had there (more than one when it reused the space),
    /// already allocated.
    Translated(&'a BTreeMap<u64, Vec<(DiskOffset, u64)>>),
}

impl Region {
    /// The region of descriptor entry `rd`, with the log written since that commit
    /// replayed. Returns it, the segments replay followed past the committed tail (the
    /// backup's offsets, for a promotion to free the others it received), and what replay
    /// found.
    pub fn open(
        shared: &Arc<Shared>,
        rd: &RegionDesc,
        links: Links<'_>,
    ) -> Result<(Region, Vec<DiskOffset>, ReplayReport)> {
        recover_region(shared, rd, links)
    }
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
    let order = segments[&pos.base.0].order;
    Ok(Tail::with_prefix(pos.base, pos.size_bytes, order, &prefix))
}

fn recover_region(
    shared: &Arc<Shared>,
    rd: &RegionDesc,
    links: Links<'_>,
) -> Result<(Region, Vec<DiskOffset>, ReplayReport)> {
    let (mut segments, newest_order) = committed_segments(shared, rd)?;
    let gc_tail = match rd.gc_tail {
        None => None,
        Some(pos) => Some(recover_gc_tail(shared, rd, &segments, pos)?),
    };
    let end = replay_scan(shared, rd, &segments, &links);
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
    let committed_tail_order = segments[&rd.tail.0].order;
    let (tail_base, tail_size) = *end.chain.last().expect("chain is never empty");
    let mut prefix = vec![0u8; end.used_bytes as usize];
    shared.volume.storage().read_at(tail_base.0, &mut prefix)?;
    let tail_order = segments[&tail_base.0].order;
    let tail = Tail::with_prefix(tail_base, tail_size, tail_order, &prefix);

    let mut writer = Writer::new(
        (rd.generation + 1) & GENERATION_MASK,
        end.next_seq,
        next_order,
    );
    let relocation_tail = rd.gc_tail.map(|pos| pos.base.0);
    for (off, stats) in segments {
        writer.add_segment(DiskOffset(off), stats, Some(off) == relocation_tail);
    }
    let tree = Tree::from_disk(rd.id, rd.root, TreeEpoch(rd.tree_epoch.0 + 1));
    let region = Region::new(
        shared.clone(),
        Identity {
            id: rd.id,
            name: rd.name.clone(),
            seed: rd.seed,
            term: rd.term,
        },
        tree,
        tail,
        gc_tail,
        writer,
        rd.keys,
        rd.root,
    );
    region.set_replay_from_order(committed_tail_order);
    region.apply_replayed(end.items)?;
    let reached = end.chain[1..].iter().map(|(off, _)| *off).collect();
    Ok((region, reached, end.report))
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
    report: ReplayReport,
}

/// What replay of a region's log found when the region was opened (local recovery or a
/// promotion): how much it kept and why it stopped. A promotion that stops early loses
/// what the replica received past that point, so the server says this when it promotes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplayReport {
    /// The commit's next sequence number, where replay started.
    pub from_seq: u64,
    /// Where replay started (the committed tail's end, in this volume).
    pub from: DiskOffset,
    /// Records kept (puts, deletes and links of complete units).
    pub records: u64,
    /// Segments followed past the committed tail.
    pub segments: u64,
    /// Why it stopped.
    pub stop: ReplayStop,
    /// Where the record it stopped at was (in this volume).
    pub stop_at: DiskOffset,
    /// A promotion's: bytes the replica had received past `stop_at` in the copy it
    /// stopped in, and copies received since the commit that replay never reached.
    /// Nonzero bytes past a stop that is not a torn last batch are acknowledged writes
    /// the promotion cannot take: a bug, said loudly.
    pub unreplayed_bytes: u64,
    pub unreached_copies: u64,
    /// Of those, copies that hold a complete batch of the foreground log (relocation
    /// copies never do, nor the rest of a batch whose end never arrived): log replay
    /// should have reached them and did not. Any is a promotion stopped short (M10 seed
    /// 213: the end of the commit's tail segment never arrived, the segments after it
    /// did).
    pub unreached_log_copies: u64,
}

/// Why replay stopped reading a region's log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayStop {
    /// Zero bytes where the next header would be: the end of what was written.
    EndOfLog,
    /// No room for a header before the segment's end, and no link out of it.
    SegmentEnd,
    /// Bytes that are not a record header: where the log ends in space never zeroed
    /// (stale bytes), or a torn write.
    Invalid,
    /// A header whose record does not verify (or runs past the segment): torn, or stale
    /// bytes of an older record; its sequence number and generation as the header says.
    BadRecord {
        seq: u64,
        generation: u32,
        /// The record's length as its header says.
        bytes: u64,
    },
    /// A record of another life of the log.
    OtherGeneration { found: u32, expected: u32 },
    /// A record of this life out of sequence.
    OutOfSequence { found: u64, expected: u64 },
    /// A relocated copy (stale bytes of a reused block).
    Relocated,
    /// A LINK to a segment replay cannot take: outside the volume or in use locally, or,
    /// in a promotion, one the replica holds no copy of that starts where the link says.
    UnresolvedLink { target: u64 },
    /// The storage failed to read.
    ReadFailed,
}

impl ReplayReport {
    /// Whether a promotion's replay stopped short of bytes the replica holds: received
    /// bytes past the stop that are not just the start of a record cut off by the end of
    /// what was received. Those bytes are writes the primary shipped, and maybe had
    /// acknowledged, that replay cannot take: promoting would lose them.
    pub fn stopped_short(&self) -> bool {
        if self.unreached_log_copies > 0 {
            return true;
        }
        match self.stop {
            // Nothing past it, or less than a header: the end of what was received.
            _ if self.unreplayed_bytes < HEADER_BYTES as u64 => false,
            ReplayStop::BadRecord { bytes, .. } => bytes <= self.unreplayed_bytes,
            _ => true,
        }
    }
}

impl std::fmt::Display for ReplayReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "replayed {} records from seq {} at {} over {} more segments, stopped at {}: ",
            self.records, self.from_seq, self.from, self.segments, self.stop_at
        )?;
        match self.stop {
            ReplayStop::EndOfLog => write!(f, "end of the written log"),
            ReplayStop::SegmentEnd => write!(f, "end of a segment without a link"),
            ReplayStop::Invalid => write!(f, "bytes that are not a record header"),
            ReplayStop::BadRecord {
                seq,
                generation,
                bytes,
            } => write!(
                f,
                "a header (seq {seq}, generation {generation}, {bytes} bytes) whose record does not verify"
            ),
            ReplayStop::OtherGeneration { found, expected } => {
                write!(f, "a record of generation {found}, not {expected}")
            }
            ReplayStop::OutOfSequence { found, expected } => {
                write!(f, "a record of seq {found}, not {expected}")
            }
            ReplayStop::Relocated => write!(f, "a relocated record"),
            ReplayStop::UnresolvedLink { target } => {
                write!(f, "a link to segment {target}, which cannot be followed")
            }
            ReplayStop::ReadFailed => write!(f, "a read failure"),
        }?;
        if self.unreplayed_bytes > 0 || self.unreached_copies > 0 {
            write!(
                f,
                "; {} bytes received past it, {} copies received since the commit not reached ({} of the foreground log; relocation copies never are)",
                self.unreplayed_bytes, self.unreached_copies, self.unreached_log_copies
            )?;
        }
        Ok(())
    }
}

/// Reads region `rd`'s log from its committed position, following LINK records into the
/// segments they name (marking them allocated), and keeps every complete unit (a batch
/// all or nothing); stops at the first record that is torn, invalid, of another life of
/// the log, or out of sequence. Segments only a torn batch's links reached are released.
fn replay_scan(
    shared: &Shared,
    rd: &RegionDesc,
    segments: &BTreeMap<u64, SegmentStats>,
    links: &Links<'_>,
) -> ReplayEnd {
    let storage = shared.volume.storage().clone();
    let allocator = &shared.allocator;
    let seed = rd.seed;
    let mut chain: Vec<(DiskOffset, u64)> = vec![(rd.tail, rd.tail_size_bytes)];
    let mut used = rd.tail_used_bytes;
    let mut seq = rd.next_seq;
    let mut items: Vec<Replayed> = Vec::new();
    let mut staged: Vec<Replayed> = Vec::new();
    // The last complete point: (chain length, used, seq).
    let mut complete = (1usize, used, seq);
    let mut in_batch = false;
    let mut body = Vec::new();
    let mut stop_at;
    let stop = loop {
        let (base, size) = *chain.last().expect("chain is never empty");
        let at = base.plus_bytes(used);
        stop_at = at;
        let rec = match read_record(storage.as_ref(), seed, at, size - used, &mut body) {
            Ok(rec) => rec,
            Err(stop) => break stop,
        };
        let len = rec.header.total_bytes();
        // A relocated copy is never part of the chain (its segments have no links into
        // the chain; one can only be met here as stale bytes of a reused block).
        let expected = rd.generation & GENERATION_MASK;
        if rec.header.generation != expected {
            break ReplayStop::OtherGeneration {
                found: rec.header.generation,
                expected,
            };
        }
        if rec.header.seq != seq {
            break ReplayStop::OutOfSequence {
                found: rec.header.seq.0,
                expected: seq.0,
            };
        }
        if rec.header.is_relocated() {
            break ReplayStop::Relocated;
        }
        seq = SeqNo(seq.0 + 1);
        used += len;
        if rec.header.is_link() {
            let Ok((next, next_size)) = rec.link_target(at) else {
                break ReplayStop::Invalid;
            };
            let first = (seq, rd.generation & GENERATION_MASK);
            let Some(next) = follow_link(shared, segments, links, next, next_size, first) else {
                break ReplayStop::UnresolvedLink { target: next.0 };
            };
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
    };
    // Anything after the last complete unit is gone: a torn batch, and segments that only
    // its links reached (a promotion frees the copies it did not reach itself).
    let (chain_len, used, seq) = complete;
    for (off, size) in chain.drain(chain_len..) {
        if matches!(links, Links::Local) {
            allocator.release(off, size / BLOCK_BYTES);
        }
    }
    let report = ReplayReport {
        from_seq: rd.next_seq.0,
        from: rd.tail.plus_bytes(rd.tail_used_bytes),
        records: items.len() as u64,
        segments: chain.len() as u64 - 1,
        stop,
        stop_at,
        unreplayed_bytes: 0,
        unreached_copies: 0,
        unreached_log_copies: 0,
    };
    ReplayEnd {
        chain,
        used_bytes: used,
        next_seq: seq,
        items,
        report,
    }
}

/// The record at `at`, with `room` bytes left in its segment, read into `body`; or why
/// there is none.
fn read_record<'a>(
    storage: &dyn crate::volume::Storage,
    seed: u32,
    at: DiskOffset,
    room: u64,
    body: &'a mut Vec<u8>,
) -> std::result::Result<RecordRef<'a>, ReplayStop> {
    let mut header_buf = [0u8; HEADER_BYTES];
    if room < HEADER_BYTES as u64 {
        return Err(ReplayStop::SegmentEnd);
    }
    if storage.read_at(at.0, &mut header_buf).is_err() {
        return Err(ReplayStop::ReadFailed);
    }
    if header_buf.iter().all(|b| *b == 0) {
        return Err(ReplayStop::EndOfLog);
    }
    let header = Header::decode(&header_buf, at).map_err(|_| ReplayStop::Invalid)?;
    let len = header.total_bytes();
    let bad = ReplayStop::BadRecord {
        seq: header.seq.0,
        generation: header.generation,
        bytes: len,
    };
    if len > room {
        return Err(bad);
    }
    body.resize(len as usize, 0);
    if storage.read_at(at.0, body).is_err() {
        return Err(ReplayStop::ReadFailed);
    }
    RecordRef::parse(body, seed, true, at).map_err(|_| bad)
}

/// Whether the segment at `at` starts with a record of sequence number and generation
/// `first` (a readable header; the record itself is verified when replay reads it).
fn starts_with(shared: &Shared, at: DiskOffset, first: (SeqNo, u32)) -> bool {
    let mut header = [0u8; HEADER_BYTES];
    if shared.volume.storage().read_at(at.0, &mut header).is_err() {
        return false;
    }
    Header::decode(&header, at)
        .is_ok_and(|h| h.seq == first.0 && h.generation == first.1 && !h.is_relocated())
}

/// The segment a LINK names (`next`, `next_size` as the record says), as replay will read
/// it; `None` ends replay (stale bytes of an older life, or a segment the backup never
/// received). `first` is the sequence number and generation the record after the LINK
/// has: of a promotion's copies at that origin, the one whose first record has them.
///
/// (Taking the newest copy at the origin instead stopped replay at the first LINK into
/// space the primary had reused since the replica's last applied commit, and every write
/// after it was lost: M10, seed 11.)
fn follow_link(
    shared: &Shared,
    segments: &BTreeMap<u64, SegmentStats>,
    links: &Links<'_>,
    next: DiskOffset,
    next_size: u64,
    first: (SeqNo, u32),
) -> Option<DiskOffset> {
    if !next.block_aligned() || next_size == 0 || !next_size.is_multiple_of(BLOCK_BYTES) {
        return None;
    }
    match links {
        Links::Local => {
            let allocator = &shared.allocator;
            if next.0.saturating_add(next_size) > allocator.volume_bytes()
                || segments.contains_key(&next.0)
                || allocator.is_allocated(next, next_size / BLOCK_BYTES)
            {
                return None;
            }
            allocator.mark_allocated(next, next_size / BLOCK_BYTES);
            Some(next)
        }
        Links::Translated(map) => map.get(&next.0)?.iter().find_map(|&(copy, size)| {
            (size == next_size && starts_with(shared, copy, first)).then_some(copy)
        }),
    }
}
