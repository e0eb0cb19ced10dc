//! Replica regions: a backup's copy of a region its primary replicates to it (DESIGN.md,
//! "Replication"). It holds the primary's log segments byte for byte, each in a segment of
//! its own, and the index of the last primary commit it applied, rewritten into its own
//! blocks; it never builds an index and never collects garbage of its own.
//!
//! Owns: the segment map (primary segment → copy, persisted as each segment's origin in
//! the descriptor), receiving log bytes, the node map (primary node → copy, in memory
//! only), applying a commit's delta (`apply`), and what the replica contributes to the
//! backup's own commits. Does not own: the protocol and connections (the
//! `tucana-replication` crate), committing (`crate::commit`), turning the replica into a
//! writable region (`crate::engine`, with `Region::open`).
//!
//! Thread-safety: one receiver per replica (the connection of its primary) calls
//! `write_log` and `apply`; the committer reads it for every commit. Everything is under
//! one mutex, held for a chunk of log bytes or the install of a delta, never for I/O of a
//! whole delta.

mod apply;
mod frontier;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::descriptor::{ReceivedSegment, RegionDesc, ReplicaDesc};
use crate::error::{Error, Result};
use crate::log::SegmentStats;
use crate::shared::Shared;
use crate::types::{DiskOffset, Extent, RegionId, BLOCK_BYTES};

pub use apply::Delta;
use frontier::Frontier;

/// A replica's copy of one of its primary's segments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Copy {
    /// Where the primary's segment starts in the primary's volume. Not unique over time:
    /// the primary reuses the space of a segment it freed, so copies are known by order.
    origin: DiskOffset,
    /// Where the copy starts in this volume.
    at: DiskOffset,
    size_bytes: u64,
    /// Bytes received from the segment's start (written to the copy, not synced).
    received_bytes: u64,
}

/// What a replica region reports of itself (to a primary, in `Hello`; to `INFO`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaState {
    pub name: String,
    /// crc seed of its records (the primary's).
    pub seed: u32,
    pub term: u64,
    /// The primary's commit it last applied (0: none yet).
    pub upstream_epoch: u64,
    /// Whether its node map matches that commit (else the next commit must come in full).
    pub node_map_current: bool,
    /// The primary's log generation at that commit (`None`: no commit applied yet).
    pub committed_generation: Option<u32>,
    /// Per segment it holds: the primary's order and offset, and the bytes received.
    pub segments: Vec<(u64, DiskOffset, u64)>,
}

/// What promotion starts from (`Replica::promotion_start`).
pub(crate) struct PromotionStart {
    /// The last applied commit's entry, translated, at the promotion's term.
    pub desc: RegionDesc,
    /// Copies received since that commit: origin → every (copy, size) there, oldest first.
    pub later: BTreeMap<u64, Vec<(DiskOffset, u64)>>,
    /// The same copies as extents (those replay does not reach are freed).
    pub later_extents: Vec<Extent>,
}

pub(crate) struct Replica {
    id: RegionId,
    name: String,
    seed: u32,
    shared: Arc<Shared>,
    state: Mutex<State>,
}

struct State {
    term: u64,
    /// The last applied commit's descriptor entry, translated (this volume's offsets,
    /// this volume's region id), with the primary's `next_order` at its seal; `None`
    /// before the first.
    committed: Option<(RegionDesc, ReplicaDesc)>,
    /// The segment map, by the primary's order for each segment (unique in a region; its
    /// offset is not, over time): order → copy.
    copies: BTreeMap<u64, Copy>,
    /// The node map: the primary's node → its copy, for the nodes of `committed`.
    nodes: HashMap<u64, u64>,
    /// Whether `nodes` holds every node of `committed` (false after an open: the map is
    /// not persisted).
    nodes_current: bool,
    /// A commit of the volume is running and captured this replica: segments allocated
    /// now must stay out of its bitmap image (as for a sealed region's writer).
    sealed_for_commit: bool,
    /// How far promotion's replay would reach through the copies (`frontier`): the
    /// position this backup acknowledges. `None` before the first applied commit.
    frontier: Option<Frontier>,
    /// A promotion took this replica's state (`promotion_start`): it takes nothing more
    /// from its primary, so nothing is acknowledged that the promoted region lacks.
    promoting: bool,
    /// Copies allocated so far, how many of them the running commit captured, and how
    /// many the newest durable commit lists. The segment map is persisted by commits
    /// only: after a crash a copy no durable commit lists is not found again, however
    /// durable its bytes (`has_unlisted_copies`).
    copies_allocated: u64,
    copies_sealed: u64,
    copies_durable: u64,
}

impl Replica {
    /// A new, empty replica of a region whose records have crc seed `seed`, at `term`.
    pub fn create(shared: Arc<Shared>, id: RegionId, name: &str, seed: u32, term: u64) -> Replica {
        Replica {
            id,
            name: name.to_string(),
            seed,
            shared,
            state: Mutex::new(State {
                term,
                committed: None,
                frontier: None,
                copies: BTreeMap::new(),
                nodes: HashMap::new(),
                nodes_current: true,
                sealed_for_commit: false,
                promoting: false,
                copies_allocated: 0,
                copies_sealed: 0,
                copies_durable: 0,
            }),
        }
    }

    /// The replica a commit recorded (`rd`, whose `replica` is set), checked against the
    /// allocator: every copy allocated and inside the volume.
    pub fn open(shared: Arc<Shared>, rd: &RegionDesc) -> Result<Replica> {
        let rep = rd.replica.expect("a replica region's entry");
        let bad =
            |at: DiskOffset, detail: String| Error::corruption("commit descriptor", at, detail);
        let mut copies = BTreeMap::new();
        let mut committed_segments = Vec::new();
        for ((at, stats), got) in rd.segments.iter().zip(&rd.received) {
            if !at.block_aligned()
                || stats.size_bytes == 0
                || !stats.size_bytes.is_multiple_of(BLOCK_BYTES)
                || !shared
                    .allocator
                    .is_allocated(*at, stats.size_bytes / BLOCK_BYTES)
            {
                return Err(bad(
                    *at,
                    format!("segment of replica {:?} is not allocated", rd.name),
                ));
            }
            let copy = Copy {
                origin: got.origin,
                at: *at,
                size_bytes: stats.size_bytes,
                received_bytes: got.received_bytes,
            };
            if copies.insert(stats.order, copy).is_some() {
                return Err(bad(
                    *at,
                    format!("two segments of replica {:?} have one order", rd.name),
                ));
            }
            if stats.order < rep.upstream_next_order {
                committed_segments.push((*at, *stats));
            }
        }
        let committed = (rep.upstream_epoch != 0).then(|| {
            let mut desc = rd.clone();
            desc.segments = committed_segments;
            desc.received = Vec::new();
            (desc, rep)
        });
        let frontier = committed
            .as_ref()
            .and_then(|(desc, _)| Frontier::at_commit(desc, &copies));
        let replica = Replica {
            id: rd.id,
            name: rd.name.clone(),
            seed: rd.seed,
            shared,
            state: Mutex::new(State {
                term: rd.term,
                committed,
                frontier,
                copies,
                nodes: HashMap::new(),
                nodes_current: rep.upstream_epoch == 0,
                sealed_for_commit: false,
                promoting: false,
                copies_allocated: 0,
                copies_sealed: 0,
                copies_durable: 0,
            }),
        };
        replica.advance_frontier(&mut replica.state.lock());
        Ok(replica)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn term(&self) -> u64 {
        self.state.lock().term
    }

    /// Raises the term (a promotion elsewhere, or a reconfiguration); never lowers it.
    pub fn raise_term(&self, term: u64) {
        let mut st = self.state.lock();
        st.term = st.term.max(term);
    }

    pub fn state(&self) -> ReplicaState {
        let st = self.state.lock();
        ReplicaState {
            name: self.name.clone(),
            seed: self.seed,
            term: st.term,
            upstream_epoch: st
                .committed
                .as_ref()
                .map_or(0, |(_, rep)| rep.upstream_epoch),
            node_map_current: st.nodes_current,
            committed_generation: st.committed.as_ref().map(|(desc, _)| desc.generation),
            segments: st
                .copies
                .iter()
                .map(|(order, c)| (*order, c.origin, c.received_bytes))
                .collect(),
        }
    }

    /// Writes `bytes` at `offset` of the copy of the primary's segment at `origin` (of
    /// `size_bytes`, order `order`), allocating the copy at its first bytes. Bytes must
    /// arrive in order: a chunk that starts past what was received is refused; one that
    /// overlaps it is written from the first new byte. Not synced: the write takes a
    /// write ticket, so the next `Engine::sync` covers it (and commits first if its copy
    /// is new: `has_unlisted_copies`).
    pub fn write_log(
        &self,
        origin: DiskOffset,
        size_bytes: u64,
        order: u64,
        offset: u64,
        bytes: &[u8],
    ) -> Result<()> {
        let bad =
            |detail: String| Error::InvalidArgument(format!("replica {:?}: {detail}", self.name));
        if offset
            .checked_add(bytes.len() as u64)
            .is_none_or(|end| end > size_bytes)
        {
            return Err(bad(format!("log bytes past the end of segment {origin}")));
        }
        let mut st = self.state.lock();
        if st.promoting {
            return Err(self.being_promoted());
        }
        let copy = self.copy_of(&mut st, order, origin, size_bytes)?;
        if offset > copy.received_bytes {
            return Err(bad(format!(
                "segment {origin}: bytes from {offset} but only {} received",
                copy.received_bytes
            )));
        }
        let skip = (copy.received_bytes - offset) as usize;
        if skip >= bytes.len() {
            return Ok(());
        }
        let new = &bytes[skip..];
        let storage = self.shared.volume.storage();
        storage.write_at(copy.at.0 + copy.received_bytes, new)?;
        self.shared
            .bytes_written
            .fetch_add(new.len() as u64, std::sync::atomic::Ordering::Relaxed);
        // Taken after the write: a sync that sees this ticket began after the bytes were
        // handed to the storage. Without one, a sync on a backup with no writes of its
        // own returned at once, having synced nothing (M9).
        self.shared
            .write_ticket
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        st.copies
            .get_mut(&order)
            .expect("registered above")
            .received_bytes += new.len() as u64;
        self.advance_frontier(&mut st);
        Ok(())
    }

    /// The foreground position this replica may acknowledge: how far promotion's replay
    /// would reach through what it received, as (the primary's segment order, offset in
    /// it); `None` before its first applied commit.
    pub fn replayable_position(&self) -> Option<(u64, u64)> {
        self.state.lock().frontier.map(|f| f.position())
    }

    /// Moves the frontier over what has arrived (`Frontier::advance`).
    fn advance_frontier(&self, st: &mut State) {
        if let Some(f) = st.frontier.as_mut() {
            f.advance(&self.shared, self.seed, &st.copies, &mut Vec::new());
        }
    }

    /// The frontier after a commit was applied or the copies cut back to it: from the
    /// commit's tail, unless the frontier is already past it in the same life of the log.
    fn restart_frontier(&self, st: &mut State) {
        let start = st
            .committed
            .as_ref()
            .and_then(|(desc, _)| Frontier::at_commit(desc, &st.copies));
        st.frontier = match (st.frontier, start) {
            (Some(now), Some(start)) if now.covers(&start) => Some(now),
            (_, start) => start,
        };
        self.advance_frontier(st);
    }

    /// The copy of the primary's segment of order `order` (at `origin`, `size_bytes`
    /// long), allocated when it is first heard of.
    fn copy_of(
        &self,
        st: &mut State,
        order: u64,
        origin: DiskOffset,
        size_bytes: u64,
    ) -> Result<Copy> {
        let bad =
            |detail: String| Error::InvalidArgument(format!("replica {:?}: {detail}", self.name));
        match st.copies.get(&order) {
            Some(c) if c.size_bytes != size_bytes || c.origin != origin => {
                Err(bad(format!("segment {order} changed size or place")))
            }
            Some(c) => Ok(*c),
            None => {
                if !size_bytes.is_multiple_of(BLOCK_BYTES) || size_bytes == 0 {
                    return Err(bad(format!("segment {origin} of {size_bytes} bytes")));
                }
                let blocks = size_bytes / BLOCK_BYTES;
                let at = self.shared.allocator.allocate(
                    self.shared.volume.storage().as_ref(),
                    blocks,
                    1,
                    st.sealed_for_commit,
                )?;
                let c = Copy {
                    origin,
                    at,
                    size_bytes,
                    received_bytes: 0,
                };
                st.copies.insert(order, c);
                st.copies_allocated += 1;
                Ok(c)
            }
        }
    }

    /// Bytes received past `at` in the copy that holds it (0 if none does).
    pub fn received_past(&self, at: DiskOffset) -> u64 {
        let st = self.state.lock();
        st.copies
            .values()
            .find(|c| c.at.0 <= at.0 && at.0 < c.at.0 + c.size_bytes)
            .map_or(0, |c| (c.at.0 + c.received_bytes).saturating_sub(at.0))
    }

    /// Forgets every byte received past the last applied commit: copies of segments the
    /// primary allocated after it go (their extents are returned, for the caller to free
    /// after its next commit), and the others keep only the bytes that commit covers. A
    /// primary that reopened its region since (a restart) has every byte its durable
    /// commit covers, but may have lost bytes it shipped after, and writes other records
    /// in their places: kept, they would stand where the primary's new bytes go (a
    /// chunk is written only past what was received), and the acknowledgements of those
    /// new writes would cover bytes this replica does not hold.
    pub fn keep_committed(&self) -> Vec<Extent> {
        let mut st = self.state.lock();
        let Some((desc, rep)) = st.committed.clone() else {
            let gone: Vec<Extent> = st
                .copies
                .values()
                .map(|c| (c.at, c.size_bytes / BLOCK_BYTES))
                .collect();
            st.copies.clear();
            return gone;
        };
        let covered: std::collections::HashMap<u64, u64> = desc
            .segments
            .iter()
            .map(|(at, stats)| {
                let mut bytes = stats.written_bytes;
                if *at == desc.tail {
                    bytes = bytes.max(desc.tail_used_bytes);
                }
                if let Some(pos) = desc.gc_tail.filter(|pos| pos.base == *at) {
                    bytes = bytes.max(pos.used_bytes);
                }
                (stats.order, bytes)
            })
            .collect();
        let later: Vec<u64> = st
            .copies
            .range(rep.upstream_next_order..)
            .map(|(order, _)| *order)
            .collect();
        let gone = later
            .into_iter()
            .filter_map(|order| st.copies.remove(&order))
            .map(|c| (c.at, c.size_bytes / BLOCK_BYTES))
            .collect();
        for (order, copy) in st.copies.iter_mut() {
            if let Some(&bytes) = covered.get(order) {
                copy.received_bytes = copy.received_bytes.min(bytes);
            }
        }
        // Nothing past the commit is held any more: the frontier starts again from it.
        st.frontier = None;
        self.restart_frontier(&mut st);
        gone
    }

    /// The replica's entry for a commit of the volume, and from now until
    /// `commit_durable` segments it allocates stay out of that commit's image.
    pub fn seal_for_commit(&self) -> RegionDesc {
        let mut st = self.state.lock();
        st.sealed_for_commit = true;
        st.copies_sealed = st.copies_allocated;
        let (mut desc, rep) = match &st.committed {
            Some((desc, rep)) => (desc.clone(), *rep),
            None => (
                RegionDesc {
                    id: self.id,
                    name: self.name.clone(),
                    tree_epoch: crate::types::TreeEpoch(0),
                    root: DiskOffset::NONE,
                    generation: 0,
                    next_seq: crate::types::SeqNo(0),
                    tail: DiskOffset::NONE,
                    tail_size_bytes: 0,
                    tail_used_bytes: 0,
                    gc_tail: None,
                    keys: 0,
                    segments: Vec::new(),
                    seed: self.seed,
                    term: 0,
                    replica: None,
                    received: Vec::new(),
                },
                ReplicaDesc {
                    upstream_epoch: 0,
                    upstream_next_order: 0,
                },
            ),
        };
        desc.term = st.term;
        desc.replica = Some(rep);
        let committed: BTreeMap<u64, SegmentStats> =
            desc.segments.iter().map(|(at, s)| (at.0, *s)).collect();
        desc.segments.clear();
        for (order, c) in &st.copies {
            let stats = committed.get(&c.at.0).copied().unwrap_or(SegmentStats {
                size_bytes: c.size_bytes,
                written_bytes: 0,
                live_bytes: 0,
                order: *order,
            });
            desc.segments.push((c.at, stats));
            desc.received.push(ReceivedSegment {
                origin: c.origin,
                received_bytes: c.received_bytes,
            });
        }
        desc
    }

    /// The commit that captured the replica is durable (`durable`), or failed.
    pub fn commit_durable(&self, durable: bool) {
        let mut st = self.state.lock();
        if durable && st.sealed_for_commit {
            st.copies_durable = st.copies_sealed;
        }
        st.sealed_for_commit = false;
    }

    /// Whether the replica holds a copy that no durable commit lists: its bytes, synced
    /// or not, would not be found after a crash until a commit lists it.
    pub fn has_unlisted_copies(&self) -> bool {
        let st = self.state.lock();
        st.copies_allocated > st.copies_durable
    }

    /// Every extent the replica holds: its copies and the nodes of its committed tree
    /// (what dropping it frees).
    pub fn extents(&self) -> Result<Vec<Extent>> {
        let st = self.state.lock();
        let mut out: Vec<Extent> = st
            .copies
            .values()
            .map(|c| (c.at, c.size_bytes / BLOCK_BYTES))
            .collect();
        if let Some((desc, _)) = &st.committed {
            let storage = self.shared.volume.storage();
            crate::index::committed_nodes(
                desc.root,
                self.id,
                &mut |off, image| storage.read_at(off.0, image),
                &mut |off| out.push((off, 1)),
            )?;
        }
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// Calls `f` with every key and value of the last applied commit, in key order, read
    /// from this volume (records verified): what the backup would serve.
    pub fn for_each(&self, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<()> {
        let root = match &self.state.lock().committed {
            Some((desc, _)) => desc.root,
            None => return Ok(()),
        };
        let storage = self.shared.volume.storage();
        let mut image = vec![0u8; crate::index::NODE_BYTES];
        // Children pushed last-first, so nodes come off the stack in key order.
        let mut stack = if root.is_none() { vec![] } else { vec![root] };
        while let Some(off) = stack.pop() {
            storage.read_at(off.0, &mut image)?;
            match crate::index::image_contents(&image, off, self.id)? {
                crate::index::ImageContents::Internal { children, .. } => {
                    stack.extend(children.into_iter().rev());
                }
                crate::index::ImageContents::Leaf { entries, .. } => {
                    for (_, _, ptr) in entries {
                        let at = DiskOffset(ptr);
                        let mut head = [0u8; crate::log::record::HEADER_BYTES];
                        storage.read_at(ptr, &mut head)?;
                        let len = crate::log::record::Header::decode(&head, at)?.total_bytes();
                        let mut bytes = vec![0u8; len as usize];
                        storage.read_at(ptr, &mut bytes)?;
                        let rec =
                            crate::log::record::RecordRef::parse(&bytes, self.seed, true, at)?;
                        f(rec.key, rec.value);
                    }
                }
            }
        }
        Ok(())
    }

    /// The value of `key` in the last applied commit, read from this volume (nodes and
    /// records verified): what a backup serves to reads it is asked for (`READONLY` in
    /// cluster mode). Writes shipped since that commit are not seen. The replica's state
    /// is held for the read, so no commit applied meanwhile lets go of what it walks.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let st = self.state.lock();
        let Some((desc, _)) = &st.committed else {
            return Ok(None);
        };
        if desc.root.is_none() {
            return Ok(None);
        }
        let ctx = ReadCtx { replica: self };
        let tree = crate::index::Tree::new(self.id, crate::types::TreeEpoch(0));
        let guard = crossbeam_epoch::pin();
        // A root word naming a disk node: its offset with the low bit set.
        let Some(ptr) = tree.get(&ctx, Some(desc.root.0 | 1), key, &guard)? else {
            return Ok(None);
        };
        let value = ctx.with_record(ptr, |r| r.value.to_vec())?;
        drop(st);
        Ok(Some(value))
    }

    /// What promotion starts from: the last applied commit's entry (translated, with the
    /// term to promote at), and the copies received since it, origin → every (copy,
    /// size) received at that origin in that window, oldest first (the primary reuses the
    /// space of segments it freed: replay picks the one whose records follow in
    /// sequence).
    pub fn promotion_start(&self, term: u64) -> Result<PromotionStart> {
        let mut st = self.state.lock();
        // From now on the replica refuses its primary's log and commits: bytes taken
        // after this would be acknowledged to the old primary (and by it to clients)
        // without being in the promoted region, whose replay reads what is here now.
        st.promoting = true;
        let Some((desc, rep)) = &st.committed else {
            return Err(Error::InvalidArgument(format!(
                "replica {:?} has applied no commit of its primary yet: nothing to promote",
                self.name
            )));
        };
        let mut desc = desc.clone();
        desc.term = term;
        desc.replica = None;
        desc.received = Vec::new();
        let mut later = BTreeMap::new();
        let mut later_extents = Vec::new();
        for (order, c) in &st.copies {
            if *order >= rep.upstream_next_order {
                later
                    .entry(c.origin.0)
                    .or_insert_with(Vec::new)
                    .push((c.at, c.size_bytes));
                later_extents.push((c.at, c.size_bytes / BLOCK_BYTES));
            }
        }
        Ok(PromotionStart {
            desc,
            later,
            later_extents,
        })
    }
}

impl Replica {
    /// A promotion that took this replica's state failed: it may take its primary's
    /// log and commits again.
    pub fn promotion_failed(&self) {
        self.state.lock().promoting = false;
    }

    fn being_promoted(&self) -> Error {
        Error::InvalidArgument(format!(
            "replica {:?} is being promoted: it takes nothing more from its old primary",
            self.name
        ))
    }
}

/// Reads of a replica's committed tree: nodes and records from the volume.
struct ReadCtx<'a> {
    replica: &'a Replica,
}

impl ReadCtx<'_> {
    /// Calls `f` with the verified record at `ptr`.
    fn with_record<R>(
        &self,
        ptr: u64,
        f: impl FnOnce(crate::log::record::RecordRef<'_>) -> R,
    ) -> Result<R> {
        use crate::log::record::{Header, RecordRef, HEADER_BYTES};
        let storage = self.replica.shared.volume.storage();
        let at = DiskOffset(ptr);
        let mut head = [0u8; HEADER_BYTES];
        storage.read_at(ptr, &mut head)?;
        let len = Header::decode(&head, at)?.total_bytes();
        let mut bytes = vec![0u8; len as usize];
        storage.read_at(ptr, &mut bytes)?;
        Ok(f(RecordRef::parse(&bytes, self.replica.seed, true, at)?))
    }
}

impl crate::index::Ctx for ReadCtx<'_> {
    fn key_cmp(&self, ptr: u64, key: &[u8]) -> Result<std::cmp::Ordering> {
        self.with_record(ptr, |r| r.key.cmp(key))
    }

    fn key_into(&self, ptr: u64, out: &mut Vec<u8>) -> Result<()> {
        self.with_record(ptr, |r| {
            out.clear();
            out.extend_from_slice(r.key);
        })
    }

    fn with_node<R>(&self, off: DiskOffset, f: impl FnOnce(&[u8]) -> Result<R>) -> Result<R> {
        let mut image = vec![0u8; crate::index::NODE_BYTES];
        self.replica
            .shared
            .volume
            .storage()
            .read_at(off.0, &mut image)?;
        f(&image)
    }
}
