//! Applying a primary's commit to a replica: the shipped node images rewritten into
//! blocks of this volume (every disk pointer translated through the segment and node
//! maps), written, and the commit's descriptor entry installed, translated.
//!
//! Owns: the translation and the checks around it (every segment the commit lists must
//! have arrived; every image is verified before and after its rewrite). Does not own:
//! committing the result (the engine commits under the same hold of the commit lock).
//!
//! Thread-safety: called with the volume's commit lock held, so no commit runs while it
//! allocates blocks and nothing else changes the replica's maps meanwhile.

use std::collections::{BTreeMap, HashMap};

use super::{Replica, State};
use crate::descriptor::{RegionDesc, ReplicaDesc};
use crate::error::{Error, Result};
use crate::index::{self, NODE_BYTES};
use crate::log::GcTailPos;
use crate::types::{DiskOffset, Extent, BLOCK_BYTES};

/// A primary's commit of one region, as a backup applies it.
pub struct Delta {
    /// The term the primary ships at (the commit's entry may carry an older one: the
    /// term is raised in memory and persisted by the primary's next commit).
    pub term: u64,
    /// The primary's commit epoch.
    pub upstream_epoch: u64,
    /// Every node of the commit's tree, not only the ones it wrote: the backup's node
    /// map is rebuilt from it (a new or restarted backup).
    pub full: bool,
    /// The commit's descriptor entry for the region, in the primary's offsets.
    pub desc: RegionDesc,
    /// The primary's `next_order` at the commit's seal.
    pub next_order: u64,
    /// Node images at the primary's offsets.
    pub nodes: Vec<(DiskOffset, Box<[u8; NODE_BYTES]>)>,
    /// Nodes of earlier commits this one no longer references (ignored when `full`).
    pub released_nodes: Vec<DiskOffset>,
}

/// Nodes of a delta are allocated in runs of up to this many blocks (as a commit's are).
const NODE_RUN_BLOCKS: u64 = 256;

impl Replica {
    /// Applies `delta`: its nodes rewritten and written (not synced), its entry installed.
    /// Returns the extents it let go of (nodes and segments the primary no longer
    /// references, or the whole previous tree for a full delta), which the caller frees
    /// from its next commit on. The caller holds the commit lock and commits next.
    pub fn apply(&self, delta: Delta) -> Result<Vec<Extent>> {
        let mut st = self.state.lock();
        if st.promoting {
            return Err(self.being_promoted());
        }
        if delta.term < st.term {
            return Err(Error::InvalidArgument(format!(
                "replica {:?} is at term {}; a commit of term {} is refused",
                self.name, st.term, delta.term
            )));
        }
        if delta.desc.seed != self.seed {
            return Err(self.protocol("a commit of records with another seed"));
        }
        if !delta.full && !st.nodes_current {
            return Err(self.protocol("a delta while the node map is not current"));
        }
        self.check_received(&mut st, &delta)?;
        let mut released: Vec<Extent> = Vec::new();
        let mut nodes = if delta.full {
            // The previous tree goes whole: the new one is written in full.
            if let Some((old, _)) = &st.committed {
                let storage = self.shared.volume.storage();
                index::committed_nodes(
                    old.root,
                    self.id,
                    &mut |off, image| storage.read_at(off.0, image),
                    &mut |off| released.push((off, 1)),
                )?;
            }
            HashMap::with_capacity(delta.nodes.len())
        } else {
            // What the primary let go of goes first: a delta folded from several commits
            // (`FoldedCommits`) may write a node at an offset one of them let go of.
            // Offsets the map does not hold (written and let go of within the fold)
            // are nothing here.
            let mut nodes = std::mem::take(&mut st.nodes);
            for off in &delta.released_nodes {
                if let Some(copy) = nodes.remove(&off.0) {
                    released.push((DiskOffset(copy), 1));
                }
            }
            nodes
        };
        let written = self.write_nodes(&st, &delta, &mut nodes).and_then(|added| {
            match self.translate_desc(&st, &delta.desc, &nodes) {
                Ok(translated) => Ok(translated),
                Err(e) => {
                    // Written, and referenced by nothing: let them go, or they stay
                    // allocated for ever (found as leaked blocks by `check` after the
                    // M8 cluster cycles).
                    for (off, copy) in added {
                        nodes.remove(&off);
                        self.shared.allocator.release(DiskOffset(copy), 1);
                    }
                    Err(e)
                }
            }
        });
        let translated = match written {
            Ok(translated) => translated,
            Err(e) => {
                if !delta.full {
                    // The map lost the released entries (their blocks stay allocated
                    // until the full index the next commit must now be, which frees
                    // the old tree whole).
                    st.nodes = nodes;
                    st.nodes_current = false;
                }
                return Err(e);
            }
        };
        released.extend(self.retire_segments(&mut st, &delta));
        st.nodes = nodes;
        st.nodes_current = true;
        st.term = delta.term;
        st.committed = Some((
            translated,
            ReplicaDesc {
                upstream_epoch: delta.upstream_epoch,
                upstream_next_order: delta.next_order,
            },
        ));
        self.restart_frontier(&mut st);
        released.sort();
        released.dedup();
        Ok(released)
    }

    fn protocol(&self, detail: &str) -> Error {
        Error::InvalidArgument(format!("replica {:?}: {detail}", self.name))
    }

    /// Every segment the commit lists must be here with at least the bytes it counts
    /// written: its tree may point anywhere in them, and replay starts at its tail.
    fn check_received(&self, st: &mut State, delta: &Delta) -> Result<()> {
        for (origin, stats) in &delta.desc.segments {
            if stats.written_bytes == 0 {
                // A segment nothing was written to yet sends no bytes: its copy begins here.
                self.copy_of(st, stats.order, *origin, stats.size_bytes)?;
            }
            match st.copies.get(&stats.order) {
                Some(c)
                    if c.origin == *origin
                        && c.size_bytes == stats.size_bytes
                        && c.received_bytes >= stats.written_bytes => {}
                _ => {
                    return Err(self.protocol(&format!(
                        "commit {} lists segment {origin} ({} bytes written), not received",
                        delta.upstream_epoch, stats.written_bytes
                    )))
                }
            }
        }
        Ok(())
    }

    /// Allocates a block for every node of the delta (adding them to `nodes` first, so
    /// that children within the delta translate too), rewrites each image and writes
    /// them. Returns what it added to `nodes` (the primary's offset, the block written
    /// here); on failure the blocks are released and `nodes` is as it was.
    fn write_nodes(
        &self,
        st: &State,
        delta: &Delta,
        nodes: &mut HashMap<u64, u64>,
    ) -> Result<Vec<(u64, u64)>> {
        let shared = &self.shared;
        let storage = shared.volume.storage();
        // The commit's tree points only into its own segments: translate through those.
        let segment_map: BTreeMap<u64, (u64, u64)> = delta
            .desc
            .segments
            .iter()
            .map(|(origin, stats)| (origin.0, (st.copies[&stats.order].at.0, stats.size_bytes)))
            .collect();
        let translate_log = |ptr: u64| -> Option<u64> {
            let (origin, (copy, size)) = segment_map.range(..=ptr).next_back()?;
            (ptr - origin < *size).then(|| copy + (ptr - origin))
        };
        let mut runs: Vec<(DiskOffset, u64)> = Vec::new();
        let mut added: Vec<u64> = Vec::with_capacity(delta.nodes.len());
        let result = (|| -> Result<Vec<(DiskOffset, Box<[u8; NODE_BYTES]>)>> {
            let mut left = delta.nodes.len() as u64;
            let mut run = (DiskOffset::NONE, 0u64);
            for (off, _) in &delta.nodes {
                if run.1 == 0 {
                    // On the member the dispatch policy names, as the primary's own
                    // node runs (`None` for one file). A backup writes them itself.
                    let member = storage.dispatch_member(None, &[]);
                    run = shared.allocator.allocate_up_to_on(
                        storage.as_ref(),
                        NODE_RUN_BLOCKS.min(left),
                        member,
                    )?;
                    runs.push(run);
                }
                if nodes.insert(off.0, run.0 .0).is_some() {
                    return Err(self.protocol(&format!("node {off} shipped twice")));
                }
                added.push(off.0);
                run = (run.0.plus_bytes(BLOCK_BYTES), run.1 - 1);
                left -= 1;
            }
            let mut out = Vec::with_capacity(delta.nodes.len());
            for (off, image) in &delta.nodes {
                let copy = DiskOffset(nodes[&off.0]);
                let mut rewritten = Box::new([0u8; NODE_BYTES]);
                index::rewrite_image(
                    &image[..],
                    (*off, delta.desc.id),
                    &mut rewritten[..],
                    (copy, self.id),
                    &translate_log,
                    &|node| nodes.get(&node).copied(),
                )?;
                out.push((copy, rewritten));
            }
            Ok(out)
        })();
        let written = result.and_then(|images| {
            crate::volume::write_block_runs(
                storage.as_ref(),
                images.iter().map(|(off, image)| (*off, &**image)),
                &shared.bytes_written,
            )
        });
        if let Err(e) = written {
            for off in added {
                nodes.remove(&off);
            }
            for (at, blocks) in runs {
                shared.allocator.release(at, blocks);
            }
            return Err(e);
        }
        Ok(added.into_iter().map(|off| (off, nodes[&off])).collect())
    }

    /// The commit's entry in this volume's terms: this region's id, the root through the
    /// node map, tails and segments through the segment map (counts as the primary's).
    fn translate_desc(
        &self,
        st: &State,
        desc: &RegionDesc,
        nodes: &HashMap<u64, u64>,
    ) -> Result<RegionDesc> {
        let by_origin: HashMap<u64, DiskOffset> = desc
            .segments
            .iter()
            .map(|(origin, stats)| (origin.0, st.copies[&stats.order].at))
            .collect();
        let copy_of = |origin: DiskOffset| -> Result<DiskOffset> {
            by_origin
                .get(&origin.0)
                .copied()
                .ok_or_else(|| self.protocol(&format!("segment {origin} is not in the commit")))
        };
        let root = if desc.root.is_none() {
            DiskOffset::NONE
        } else {
            DiskOffset(
                *nodes
                    .get(&desc.root.0)
                    .ok_or_else(|| self.protocol(&format!("root {} not shipped", desc.root)))?,
            )
        };
        let mut out = desc.clone();
        out.id = self.id;
        out.name = self.name.clone();
        out.root = root;
        out.tail = copy_of(desc.tail)?;
        out.gc_tail = match desc.gc_tail {
            None => None,
            Some(pos) => Some(GcTailPos {
                base: copy_of(pos.base)?,
                ..pos
            }),
        };
        out.segments = desc
            .segments
            .iter()
            .map(|(origin, stats)| Ok((copy_of(*origin)?, *stats)))
            .collect::<Result<_>>()?;
        out.replica = None;
        out.received = Vec::new();
        Ok(out)
    }

    /// Copies of segments the primary retired: below the commit's `next_order` (so
    /// allocated before its seal) and not in its list. They leave the segment map.
    fn retire_segments(&self, st: &mut State, delta: &Delta) -> Vec<Extent> {
        let listed: std::collections::HashSet<u64> =
            delta.desc.segments.iter().map(|(_, s)| s.order).collect();
        let gone: Vec<u64> = st
            .copies
            .range(..delta.next_order)
            .filter(|(order, _)| !listed.contains(order))
            .map(|(order, _)| *order)
            .collect();
        gone.into_iter()
            .filter_map(|order| st.copies.remove(&order))
            .map(|c| (c.at, c.size_bytes / BLOCK_BYTES))
            .collect()
    }
}
