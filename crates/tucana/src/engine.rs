//! The engine of an open database: its shared state, its regions, the committer, the
//! garbage collector and the background threads, and the operations that span regions
//! (group sync, commits, creating and dropping keyspaces, close, statistics).
//!
//! Owns: composing those parts and the order in which the spanning operations take their
//! locks (the commit lock before a region's writer lock, never the other way). Does not
//! own: what each part does (`shared`, `region`, `commit`, `gc`, `check`), opening
//! (`recovery`), the background loops (`background`), the public handles (`db`,
//! `keyspace`).
//!
//! Thread-safety: `Send + Sync`, shared behind an `Arc` by every handle; see each part.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;

use crate::check::CheckReport;
use crate::commit::Committer;
use crate::error::{Error, Result};
use crate::gc::Collector;
use crate::log::record::{Header, RecordRef, HEADER_BYTES};
use crate::recovery::Opened;
use crate::region::{Links, Region, Regions, ReplayReport};
use crate::replica::{Delta, Replica};
use crate::shared::Shared;
use crate::stats::Stats;
use crate::types::{DiskOffset, BLOCK_BYTES};

pub(crate) struct Engine {
    pub shared: Arc<Shared>,
    pub regions: Regions,
    pub committer: Committer,
    pub collector: Collector,
    /// The background committer and, with `gc`, the garbage collector's thread
    /// (`crate::background`).
    background: Mutex<Vec<JoinHandle<()>>>,
    stop: AtomicBool,
    finished: AtomicBool,
}

impl Engine {
    pub fn new(opened: Opened) -> Engine {
        let Opened {
            shared,
            regions,
            committer,
        } = opened;
        Engine {
            collector: Collector::new(shared.clone()),
            shared,
            regions,
            committer,
            background: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            finished: AtomicBool::new(false),
        }
    }

    /// Group commit: makes every write with a ticket up to `ticket` durable. The waiting
    /// writers flush every region's tail for each other, the next group while the current
    /// one's `fdatasync` runs (`group_commit.rs`).
    pub fn sync_to(&self, ticket: u64) -> Result<()> {
        self.shared.sync_to(ticket, || {
            for region in self.regions.list() {
                region.flush_tail()?;
            }
            Ok(())
        })
    }

    /// Makes every write so far durable, and every replica's received log. A replica's
    /// segment map is persisted by commits only, so while a replica holds a segment no
    /// durable commit lists (received since the last commit) this commits (a commit
    /// implies a sync): a sync would leave those bytes on the disk but unreachable after
    /// a crash (M9).
    pub fn sync(&self) -> Result<()> {
        if self
            .regions
            .replicas()
            .iter()
            .any(|r| r.has_unlisted_copies())
        {
            return self.commit();
        }
        self.sync_to(self.shared.last_write_ticket())
    }

    pub fn commit(&self) -> Result<()> {
        self.committer.commit(&self.regions)
    }

    /// A commit and its repeat: both superblock slots name the newest state, and what it
    /// stopped referencing is freed at once.
    #[cfg(test)]
    pub fn commit_pair(&self) -> Result<()> {
        self.committer.commit_pair(&self.regions)
    }

    /// The region `name`, created (durably: a commit follows under the commit lock, so
    /// that it and anything written to it survive a crash) if it does not exist.
    pub fn create_region(&self, name: &str) -> Result<Arc<Region>> {
        if let Some(region) = self.regions.get(name) {
            return Ok(region);
        }
        let mut cs = self.committer.lock();
        if let Some(region) = self.regions.get(name) {
            return Ok(region);
        }
        let region = self.regions.create(&self.shared, name)?;
        self.committer.commit_locked(&mut cs, &self.regions)?;
        Ok(region)
    }

    /// Drops a region durably; its blocks are freed once no commit on disk needs them.
    pub fn drop_region(&self, name: &str) -> Result<()> {
        self.commit_releasing(name, |regions| {
            regions.remove(name).map(|r| r.drop_and_list_extents())
        })
    }

    /// Under the commit lock (the volume writable): what `release` lets go of in the
    /// region or replica `name` (`None`: there is no such) is freed once no commit on
    /// disk needs it, and a commit is made.
    fn commit_releasing(
        &self,
        name: &str,
        release: impl FnOnce(&Regions) -> Option<Result<Vec<crate::types::Extent>>>,
    ) -> Result<()> {
        let mut cs = self.committer.lock();
        self.shared.check_writable()?;
        let extents =
            release(&self.regions).ok_or_else(|| Error::KeyspaceNotFound(name.to_string()))??;
        cs.drop_after_next_commit(extents);
        self.committer.commit_locked(&mut cs, &self.regions)
    }

    /// The replica `name` of a region whose records have crc seed `seed`, created
    /// (durably) at `term` if it does not exist.
    pub fn create_replica(&self, name: &str, seed: u32, term: u64) -> Result<Arc<Replica>> {
        if let Some(replica) = self.regions.replica(name) {
            return Ok(replica);
        }
        let mut cs = self.committer.lock();
        if let Some(replica) = self.regions.replica(name) {
            return Ok(replica);
        }
        let replica = self
            .regions
            .create_replica(&self.shared, name, seed, term)?;
        self.committer.commit_locked(&mut cs, &self.regions)?;
        Ok(replica)
    }

    /// Applies a primary's commit to replica `name` and makes the result durable: when
    /// this returns, the replica mirrors that commit across a crash.
    pub fn apply_replica(&self, name: &str, delta: Delta) -> Result<()> {
        let mut cs = self.committer.lock();
        self.shared.check_writable()?;
        let replica = self
            .regions
            .replica(name)
            .ok_or_else(|| Error::KeyspaceNotFound(name.to_string()))?;
        let released = replica.apply(delta)?;
        // The failover harness's kill inside a backup's own commit: nodes written, the
        // descriptor not.
        #[cfg(feature = "failpoints")]
        fail::fail_point!("backup-commit", |_| crate::failpoints::kill_self());
        cs.drop_after_next_commit(released);
        self.committer.commit_locked(&mut cs, &self.regions)
    }

    /// Turns replica `name` into a writable region at `term`: its last applied commit as
    /// it is, then the log it received since replayed, LINK records followed through its
    /// segment map; the copies replay did not reach are freed. Durable when it returns.
    pub fn promote_replica(&self, name: &str, term: u64) -> Result<(Arc<Region>, ReplayReport)> {
        let mut cs = self.committer.lock();
        self.shared.check_writable()?;
        let replica = self
            .regions
            .replica(name)
            .ok_or_else(|| Error::KeyspaceNotFound(name.to_string()))?;
        if term <= replica.term() {
            return Err(Error::InvalidArgument(format!(
                "promotion of {name:?} needs a term above its {}",
                replica.term()
            )));
        }
        let crate::replica::PromotionStart {
            desc,
            later,
            later_extents,
        } = replica.promotion_start(term)?;
        let (region, reached, mut report) =
            match Region::open(&self.shared, &desc, Links::Translated(&later)) {
                Ok(opened) => opened,
                Err(e) => {
                    replica.promotion_failed();
                    return Err(e);
                }
            };
        let unreached: Vec<_> = later_extents
            .into_iter()
            .filter(|(at, _)| !reached.contains(at))
            .collect();
        report.unreplayed_bytes = replica.received_past(report.stop_at);
        report.unreached_copies = unreached.len() as u64;
        report.unreached_log_copies = unreached
            .iter()
            .filter(|(at, blocks)| {
                self.holds_a_complete_log_batch(*at, blocks * BLOCK_BYTES, desc.seed)
            })
            .count() as u64;
        if report.stopped_short() {
            // Nothing is freed and the replica stays as it is: the promotion is refused
            // (the region is not served) rather than made without writes the replica
            // holds, and the bytes stay for whoever looks.
            replica.promotion_failed();
            return Err(Error::corruption(
                "replica",
                report.stop_at,
                format!("promotion of {name:?} refused: {report}"),
            ));
        }
        cs.drop_after_next_commit(unreached);
        let region = Arc::new(region);
        self.regions.remove_replica(name);
        self.regions.insert(region.clone());
        self.committer.commit_locked(&mut cs, &self.regions)?;
        Ok((region, report))
    }

    /// Whether the copy at `at` (`size_bytes` long) holds the end of a batch of the
    /// foreground log of a region whose records have crc seed `seed`: verified records
    /// from its start, the last without `FLAG_BATCH_MORE`. Such a copy holds writes that
    /// were complete (and may have been acknowledged), which a promotion's replay should
    /// have reached. Not one that is empty, holds relocated copies, or only the start of
    /// a batch whose end never arrived (replay rightly drops that).
    fn holds_a_complete_log_batch(&self, at: DiskOffset, size_bytes: u64, seed: u32) -> bool {
        let mut copy = vec![0u8; size_bytes as usize];
        if self
            .shared
            .volume
            .storage()
            .read_at(at.0, &mut copy)
            .is_err()
        {
            return false;
        }
        let mut pos = 0usize;
        while pos + HEADER_BYTES <= copy.len() {
            let here = DiskOffset(at.0 + pos as u64);
            let Ok(header) = Header::decode(&copy[pos..pos + HEADER_BYTES], here) else {
                return false;
            };
            let end = pos as u64 + header.total_bytes();
            if header.is_relocated() || end > size_bytes {
                return false;
            }
            if RecordRef::parse(&copy[pos..end as usize], seed, true, here).is_err() {
                return false;
            }
            if !header.batch_more() {
                return true;
            }
            pos = end as usize;
        }
        false
    }

    /// Makes replica `name` forget what it received past its last applied commit
    /// (`Replica::keep_committed`), durably: the copies it lets go of are freed after
    /// the commit this makes, which also records the shorter received counts.
    pub fn keep_replica_committed(&self, name: &str) -> Result<()> {
        self.commit_releasing(name, |regions| {
            regions.replica(name).map(|r| Ok(r.keep_committed()))
        })
    }

    /// Drops replica `name` durably (its primary dropped the region, or replication of it
    /// stopped); its blocks are freed once no commit on disk needs them.
    pub fn drop_replica(&self, name: &str) -> Result<()> {
        self.commit_releasing(name, |regions| {
            regions.remove_replica(name).map(|r| r.extents())
        })
    }

    /// Commits, then walks the whole committed volume and verifies it.
    pub fn check(&self) -> Result<CheckReport> {
        crate::check::check(&self.shared, &self.regions, &self.committer)
    }

    /// A full garbage collection pass (`Database::gc`).
    pub fn gc_full(&self) -> Result<()> {
        self.collector.full_pass(&self.regions, &self.committer)
    }

    /// Rewrites scattered records in key order, then a full pass (`Database::reorganise`).
    pub fn reorganise(&self) -> Result<crate::gc::ReorganiseReport> {
        self.collector.reorganise(&self.regions, &self.committer)
    }

    /// Keeps the background threads' handles, for `finish` to join.
    pub fn add_background(&self, handle: JoinHandle<()>) {
        self.background.lock().push(handle);
    }

    /// Whether the background threads were told to stop.
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    fn stop_background(&self) {
        self.stop.store(true, Ordering::Release);
        self.shared.wake_all();
        let handles = std::mem::take(&mut *self.background.lock());
        for h in &handles {
            h.thread().unpark();
        }
        for h in handles {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }

    /// Commits and stops background work; later calls do nothing.
    pub fn finish(&self) -> Result<()> {
        if self.finished.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.stop_background();
        if self.shared.is_poisoned() {
            return Err(Error::Poisoned);
        }
        // Refuse new writes, wait for the ones in progress (each holds its region's writer
        // lock), then make everything durable.
        let mut cs = self.committer.lock();
        self.shared.close();
        for region in self.regions.list() {
            region.wait_for_writer();
        }
        let committed = self.committer.commit_locked(&mut cs, &self.regions);
        // The file keeps no free segment the background collector left unpunched.
        self.shared.flush_trims();
        committed
    }

    pub fn abandon(&self) {
        if self.finished.swap(true, Ordering::AcqRel) {
            return;
        }
        self.stop_background();
    }

    /// Adds a member to the open volume (DESIGN.md, "Adding a member", online): the member
    /// set checks, writes and publishes it (`Storage::add_member`), then the write queue
    /// and the trim counters count it. A failed write or sync of the member table poisons
    /// the store (what of the table is durable is unknown, as after any failed sync).
    pub fn add_member(
        &self,
        new: (String, Arc<dyn crate::volume::Storage>),
        blank: bool,
    ) -> Result<crate::volume::AddedMember> {
        let shared = &self.shared;
        shared.check_writable()?;
        let added = shared
            .volume
            .storage()
            .add_member(new, blank, &|| shared.poison())?;
        if let Some(queue) = &shared.writes {
            queue.add_members(added.index + 1);
        }
        shared.trims.grow_to(added.index + 1);
        Ok(added)
    }

    pub fn remove_member(&self, name: &str) -> Result<crate::volume::RemovedMember> {
        let shared = &self.shared;
        shared.check_writable()?;
        shared
            .volume
            .storage()
            .remove_member(name, &|| shared.poison())
    }

    pub fn rebalance(&self) -> Result<crate::volume::Rebalanced> {
        let shared = &self.shared;
        shared.check_writable()?;
        shared.volume.storage().rebalance(&|| shared.poison())
    }

    pub fn is_poisoned(&self) -> bool {
        self.shared.is_poisoned()
    }

    pub fn stats(&self) -> Stats {
        let shared = &self.shared;
        let storage = shared.volume.storage();
        let (bytes_written, bytes_read) = storage.io_bytes();
        let mut stats = Stats {
            index_nodes: 0,
            commits: shared.commits.load(Ordering::Relaxed),
            syncs: shared.syncs.load(Ordering::Relaxed),
            bytes_written,
            bytes_read,
            volume_bytes: storage.len_bytes().unwrap_or(0),
            space_used_bytes: storage.space_used_bytes().unwrap_or(0),
            volume_kind: storage.kind().as_str().to_string(),
            allocated_bytes: shared.allocator.allocated_blocks() * BLOCK_BYTES,
            commit_epoch: self.committer.epoch().0,
            gc_passes: shared.gc_passes.load(Ordering::Relaxed),
            gc_relocated_bytes: shared.gc_relocated_bytes.load(Ordering::Relaxed),
            gc_reclaimed_bytes: shared.gc_reclaimed_bytes.load(Ordering::Relaxed),
            reorganised_bytes: shared.reorganised_bytes.load(Ordering::Relaxed),
            scattered_reads: shared.scattered_reads.load(Ordering::Relaxed),
            scattered_reads_dropped: shared.scattered_reads_dropped.load(Ordering::Relaxed),
            gc_paced_ns: shared.gc_paced_ns.load(Ordering::Relaxed),
            prefetch_calls: shared.prefetch_calls.load(Ordering::Relaxed),
            prefetch_bytes: shared.prefetch_bytes.load(Ordering::Relaxed),
            prefetch_skipped: shared.prefetch_skipped.load(Ordering::Relaxed),
            copied_record_reads: shared.copied_record_reads.load(Ordering::Relaxed),
            deferred_puts: shared.deferred_puts.load(Ordering::Relaxed),
            writes_in_flight_bytes: shared.writes.as_ref().map_or(0, |q| q.in_flight_bytes()),
            members: storage.members(),
            ..Stats::default()
        };
        let trims = shared.trim_figures();
        for (m, member) in stats.members.iter_mut().enumerate() {
            if let Some(t) = trims.get(m) {
                member.trims_queued = t.queued;
                member.trims_issued = t.issued;
                member.trims_forced = t.forced;
                member.trims_pending_bytes = t.pending_bytes;
            }
        }
        for t in &trims {
            stats.trims_queued += t.queued;
            stats.trims_issued += t.issued;
            stats.trims_forced += t.forced;
            stats.trims_pending_bytes += t.pending_bytes;
        }
        if let Some(queue) = &shared.writes {
            let figures = queue.member_figures();
            for (m, member) in stats.members.iter_mut().enumerate() {
                if let Some(q) = figures.get(m) {
                    *member = std::mem::take(member).with_queue(q);
                }
            }
        }
        for region in self.regions.list() {
            let ks = region.stats();
            stats.keys += ks.keys;
            stats.live_log_bytes += ks.live_log_bytes;
            stats.dead_log_bytes += ks.dead_log_bytes;
            stats.log_size_bytes += ks.log_size_bytes;
            stats.index_nodes += ks.index_nodes;
            stats.index_leaf_splits += ks.index_writes.leaf_splits;
            stats.index_restemmed_halves += ks.index_writes.restemmed_halves;
            stats.index_split_key_reads += ks.index_writes.split_key_reads;
            stats.index_insert_key_reads += ks.index_writes.insert_key_reads;
            stats.keyspaces.push(ks);
        }
        stats.index_bytes = stats.index_nodes * crate::index::NODE_BYTES as u64;
        stats
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}
