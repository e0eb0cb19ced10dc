//! The engine's side of replication (DESIGN.md, "Replication"): what a primary's shipper
//! reads, and what a backup applies. The protocol, connections and acknowledgements live
//! in the `tucana-replication` crate, which enters the engine only through this module.
//!
//! Owns: the public handles `ShipSource` (a primary region, as its shipper sees it) and
//! `ReplicaHandle` (a replica region on a backup), and the types they exchange. Does not
//! own: any of the mechanics (`region::ship`, `commit`'s observer, `replica`).
//!
//! Thread-safety: handles are `Clone + Send + Sync`.

use std::sync::Arc;

use crate::db::Database;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::keyspace::Keyspace;
use crate::region::Region;
use crate::replica::Replica;
use crate::types::DiskOffset;

pub use crate::commit::{CommitDelta, CommitObserver, RegionDelta};
pub use crate::descriptor::{ReceivedSegment, RegionDesc, ReplicaDesc};
pub use crate::index::NODE_BYTES;
pub use crate::region::{LogPosition, ReplayReport, ReplayStop, ShipSegment};
pub use crate::replica::{Delta, ReplicaState};

impl Database {
    /// Has `observer` told of every commit once it is durable (`None`: nobody).
    pub fn set_commit_observer(&self, observer: Option<Arc<dyn CommitObserver>>) {
        self.engine.committer.set_observer(observer);
    }

    /// The keyspace `name` as a replication shipper reads it.
    pub fn ship_source(&self, name: &str) -> Result<ShipSource> {
        let region = self
            .engine
            .regions
            .get(name)
            .ok_or_else(|| Error::KeyspaceNotFound(name.to_string()))?;
        Ok(ShipSource {
            engine: self.engine.clone(),
            region,
        })
    }

    /// The replica `name` of another server's keyspace whose records have crc seed
    /// `seed`, created (durably) at `term` if this volume has none of that name.
    pub fn replica(&self, name: &str, seed: u32, term: u64) -> Result<ReplicaHandle> {
        let replica = self.engine.create_replica(name, seed, term)?;
        Ok(ReplicaHandle {
            engine: self.engine.clone(),
            replica,
        })
    }

    /// The replica `name`, if this volume has one.
    pub fn open_replica(&self, name: &str) -> Option<ReplicaHandle> {
        let replica = self.engine.regions.replica(name)?;
        Some(ReplicaHandle {
            engine: self.engine.clone(),
            replica,
        })
    }

    /// Names of this volume's replicas, sorted.
    pub fn replica_names(&self) -> Vec<String> {
        self.engine
            .regions
            .replicas()
            .iter()
            .map(|r| r.name().to_string())
            .collect()
    }
}

impl Keyspace {
    /// Where the keyspace's log ends now: every write that returned before this call lies
    /// at or below it (what a write waits to see acknowledged by backups).
    pub fn log_position(&self) -> LogPosition {
        self.region().log_position()
    }

    /// The keyspace's replication term (0: never replicated).
    pub fn term(&self) -> u64 {
        self.region().term()
    }
}

/// A primary keyspace, as a replication shipper reads it.
#[derive(Clone)]
pub struct ShipSource {
    engine: Arc<Engine>,
    region: Arc<Region>,
}

/// The newest commit of a region, pinned: its nodes stay readable while this lives.
pub struct PinnedCommit {
    /// The commit's epoch.
    pub epoch: u64,
    /// The region's entry in that commit.
    pub desc: RegionDesc,
    /// Above every order the commit's segments have.
    pub next_order: u64,
    source: ShipSource,
    pin: crate::region::ReaderTicket,
}

impl Drop for PinnedCommit {
    fn drop(&mut self) {
        self.source.region.close_snapshot(self.pin);
    }
}

impl PinnedCommit {
    /// Calls `f` with every node of the commit's tree (its offset and image), parents
    /// before children.
    pub fn for_each_node(
        &self,
        f: &mut dyn FnMut(DiskOffset, Box<[u8; NODE_BYTES]>) -> Result<()>,
    ) -> Result<()> {
        let storage = self.source.engine.shared.volume.storage();
        let mut stack = Vec::new();
        if !self.desc.root.is_none() {
            stack.push(self.desc.root);
        }
        while let Some(off) = stack.pop() {
            let mut image = Box::new([0u8; NODE_BYTES]);
            storage.read_at(off.0, &mut image[..])?;
            if let crate::index::ImageContents::Internal { children, .. } =
                crate::index::image_contents(&image[..], off, self.desc.id)?
            {
                stack.extend(children);
            }
            f(off, image)?;
        }
        Ok(())
    }
}

impl ShipSource {
    pub fn name(&self) -> &str {
        self.region.name()
    }

    /// crc seed of the region's records (a replica keeps it).
    pub fn seed(&self) -> u32 {
        self.region.seed()
    }

    pub fn term(&self) -> u64 {
        self.region.term()
    }

    /// The log generation of this opening of the region: raised at every open (a
    /// restart) and promotion, so a backup can tell that bytes it received past its last
    /// applied commit may not be the primary's any more.
    pub fn generation(&self) -> u32 {
        self.region.generation()
    }

    /// Raises the region's replication term (it becomes replicated, or a
    /// reconfiguration); persisted by the next commit.
    pub fn raise_term(&self, term: u64) {
        self.region.raise_term(term);
    }

    /// Refuses writes from now on: a backup answered that it is at `term`, higher than
    /// this region's (it was promoted).
    pub fn fence(&self, term: u64) {
        self.region.fence(term);
    }

    pub fn fenced_by(&self) -> Option<u64> {
        self.region.fenced_by()
    }

    pub fn is_dropped(&self) -> bool {
        self.region.is_dropped()
    }

    /// The region's segments from order `from` on, at most `max` of them.
    pub fn segments(&self, from: u64, max: usize) -> Vec<ShipSegment> {
        self.region.ship_segments(from, max)
    }

    /// Copies ready bytes of the segment at `base` from `offset` into `buf`.
    pub fn read(&self, base: DiskOffset, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.region.read_log(base, offset, buf)
    }

    pub fn log_position(&self) -> LogPosition {
        self.region.log_position()
    }

    /// Garbage collection retires no segment of order `horizon` or more.
    pub fn set_horizon(&self, horizon: u64) {
        self.region.set_ship_horizon(horizon);
    }

    /// The region's newest commit, read back from the volume and pinned (for a full
    /// index); `None` if no commit lists the region yet.
    pub fn pin_newest_commit(&self) -> Result<Option<PinnedCommit>> {
        let cs = self.engine.committer.lock();
        let Some((desc, epoch)) = crate::check::newest_region_entry(
            self.engine.shared.volume.storage().as_ref(),
            self.region.name(),
        )?
        else {
            return Ok(None);
        };
        let pin = self.region.register_snapshot_at(desc.tree_epoch);
        drop(cs);
        let next_order = desc
            .segments
            .iter()
            .map(|(_, s)| s.order + 1)
            .max()
            .unwrap_or(0);
        Ok(Some(PinnedCommit {
            epoch,
            desc,
            next_order,
            source: self.clone(),
            pin,
        }))
    }
}

/// Commits of a region that a backup was not sent, folded into one delta (DESIGN.md,
/// "Replication", *index shipping*): the nodes they wrote that the newest of them still
/// references, and the nodes they let go of that the backup may hold. Applied as one
/// commit, it takes a backup whose node map matches the commit before the first folded
/// one to the newest, as the commits one by one would.
///
/// Offsets only: the images are read from the volume when the delta is made, while the
/// newest folded commit is pinned (its nodes cannot be freed then).
#[derive(Debug, Default)]
pub struct FoldedCommits {
    /// The newest folded commit: epoch, descriptor entry, `next_order`.
    newest: Option<(u64, RegionDesc, u64)>,
    /// Nodes written by the folded commits and not let go of by a later one.
    written: std::collections::BTreeSet<u64>,
    /// Nodes let go of that an earlier commit than the folded ones wrote.
    released: std::collections::BTreeSet<u64>,
}

impl FoldedCommits {
    /// Folds in the next commit (commits must come in order): what it wrote and what it
    /// let go of.
    pub fn fold(
        &mut self,
        epoch: u64,
        desc: RegionDesc,
        next_order: u64,
        written: impl IntoIterator<Item = DiskOffset>,
        released: impl IntoIterator<Item = DiskOffset>,
    ) {
        debug_assert!(self.newest.as_ref().is_none_or(|(e, _, _)| *e < epoch));
        // A node written by a folded commit never reached the backup: letting it go
        // again is nothing to the backup. (A commit never writes at an offset it lets
        // go of: a node's blocks are freed only after the commit that released it.)
        for off in released {
            if !self.written.remove(&off.0) {
                self.released.insert(off.0);
            }
        }
        self.written.extend(written.into_iter().map(|o| o.0));
        self.newest = Some((epoch, desc, next_order));
    }

    pub fn is_empty(&self) -> bool {
        self.newest.is_none()
    }

    /// The newest folded commit's epoch.
    pub fn epoch(&self) -> Option<u64> {
        self.newest.as_ref().map(|(e, _, _)| *e)
    }

    /// Bytes of node images the folded delta ships.
    pub fn node_bytes(&self) -> u64 {
        self.written.len() as u64 * NODE_BYTES as u64
    }

    /// The folded delta at `term`, its images read from the volume: `pinned` must be the
    /// newest folded commit, pinned.
    pub fn delta(&self, pinned: &PinnedCommit, term: u64) -> Result<Delta> {
        let Some((epoch, desc, next_order)) = &self.newest else {
            return Err(Error::InvalidArgument("no commit folded".into()));
        };
        if pinned.epoch != *epoch || pinned.desc.name != desc.name {
            return Err(Error::InvalidArgument(format!(
                "commit {} of {:?} is pinned, the newest folded is {epoch} of {:?}",
                pinned.epoch, pinned.desc.name, desc.name
            )));
        }
        let storage = pinned.source.engine.shared.volume.storage();
        let mut nodes = Vec::with_capacity(self.written.len());
        for &off in &self.written {
            let mut image = Box::new([0u8; NODE_BYTES]);
            storage.read_at(off, &mut image[..])?;
            crate::index::verify_image(&image[..], DiskOffset(off), desc.id)?;
            nodes.push((DiskOffset(off), image));
        }
        Ok(Delta {
            term,
            upstream_epoch: *epoch,
            full: false,
            desc: desc.clone(),
            next_order: *next_order,
            nodes,
            released_nodes: self.released.iter().map(|&o| DiskOffset(o)).collect(),
        })
    }
}

/// A replica region on a backup.
#[derive(Clone)]
pub struct ReplicaHandle {
    engine: Arc<Engine>,
    replica: Arc<Replica>,
}

impl ReplicaHandle {
    pub fn name(&self) -> &str {
        self.replica.name()
    }

    pub fn state(&self) -> ReplicaState {
        self.replica.state()
    }

    /// Calls `f` with every key and value of the last commit the replica applied, in key
    /// order (read from the volume, not fast: for checks and tools).
    pub fn for_each(&self, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<()> {
        self.replica.for_each(f)
    }

    /// The value of `key` in the last commit the replica applied (writes shipped since
    /// are not seen; see `Replica::get`).
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.replica.get(key)
    }

    /// The foreground position this backup may acknowledge: how far promotion's replay
    /// would reach through what it received, as (the primary's segment order, offset in
    /// it); `None` before the first applied commit (see `Replica::replayable_position`).
    pub fn replayable_position(&self) -> Option<(u64, u64)> {
        self.replica.replayable_position()
    }

    /// Raises the replica's term; frames of lower terms are refused from then on.
    pub fn raise_term(&self, term: u64) {
        self.replica.raise_term(term);
    }

    /// Writes bytes the primary shipped of its segment at `origin` (`size_bytes` long,
    /// order `order`) at `offset` (see `Replica::write_log`). Not synced: `Database::sync`
    /// makes every replica's received bytes durable at once.
    pub fn write_log(
        &self,
        origin: DiskOffset,
        size_bytes: u64,
        order: u64,
        offset: u64,
        bytes: &[u8],
    ) -> Result<()> {
        self.replica
            .write_log(origin, size_bytes, order, offset, bytes)
    }

    /// Applies a primary's commit and commits: durable when it returns.
    pub fn apply(&self, delta: Delta) -> Result<()> {
        self.engine.apply_replica(self.replica.name(), delta)
    }

    /// Turns the replica into a writable keyspace at `term` (higher than its own).
    pub fn promote(self, term: u64) -> Result<Keyspace> {
        Ok(self.promote_reporting(term)?.0)
    }

    /// `promote`, also saying what replay of the log received since the last applied
    /// commit found (what a server logs: a replay that stops early drops writes).
    pub fn promote_reporting(self, term: u64) -> Result<(Keyspace, ReplayReport)> {
        let (region, report) = self.engine.promote_replica(self.replica.name(), term)?;
        Ok((Keyspace::new(self.engine.clone(), region), report))
    }

    /// Forgets every byte received past the last applied commit (durably): what a
    /// backup does when its primary reopened the region since (see
    /// `RegionInfo::generation` in the replication protocol).
    pub fn keep_committed(&self) -> Result<()> {
        self.engine.keep_replica_committed(self.replica.name())
    }

    /// Drops the replica and its data (durably).
    pub fn drop_replica(self) -> Result<()> {
        self.engine.drop_replica(self.replica.name())
    }
}
