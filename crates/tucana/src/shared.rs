//! State shared by an open database and all its regions: the volume and its allocator,
//! the options, the poisoned and closed flags, the write tickets of group sync, the
//! counters behind `Stats`, write pacing, and the extents on their way back to the
//! allocator (DESIGN.md, "Freeing").
//!
//! Owns: those fields and the small operations on them (poisoning, group sync's ticket
//! protocol, waking the background committer, pacing a writer, handing extents back
//! after the readers' grace period and punching them). Does not own: regions, commits or
//! garbage collection, which all reach it through an `Arc<Shared>`.
//!
//! Thread-safety: `Sync`; counters are relaxed atomics (statistics, not invariants), the
//! flags acquire/release; `group` runs group syncs (`group_commit.rs`), `frees` is a short
//! mutex.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::alloc::Allocator;
use crate::error::{Error, Result};
use crate::group_commit::GroupCommit;
use crate::options::Options;
use crate::read_mode::ReadMode;
use crate::trim::{Decision, MemberQueue, TrimCounters, TrimFigures, TrimSchedule};
use crate::types::DiskOffset;
use crate::volume::write_queue::WriteQueue;
use crate::volume::Volume;

/// State shared by the database and its regions.
pub(crate) struct Shared {
    pub options: Options,
    pub volume: Volume,
    pub allocator: Allocator,
    /// Writes in flight: closed log segments written in the background per member
    /// (`None`: `writes_in_flight_segments == 0`, each written by the writer at once).
    pub writes: Option<WriteQueue>,
    poisoned: AtomicBool,
    /// `close` was called: writes are refused (reads go on while handles live).
    closed: AtomicBool,
    /// Number of the newest write whose records are in a log buffer.
    pub write_ticket: AtomicU64,
    /// Group sync: which writes are flushed and durable, who flushes and syncs next.
    group: GroupCommit,
    pub log_bytes_since_commit: AtomicU64,
    pub bytes_written: AtomicU64,
    pub commits: AtomicU64,
    pub syncs: AtomicU64,
    /// Garbage collection passes that did something (background steps and forced passes).
    pub gc_passes: AtomicU64,
    /// Bytes of records the reorganiser rewrote in key order (and the index took).
    pub reorganised_bytes: AtomicU64,
    /// Scans that read scattered records from the device and reported them for a
    /// rewrite in key order (`Region::report_scattered_read`), and reports dropped
    /// because the region's queue was full.
    pub scattered_reads: AtomicU64,
    pub scattered_reads_dropped: AtomicU64,
    /// Bytes of live records garbage collection copied.
    pub gc_relocated_bytes: AtomicU64,
    /// Bytes of log segments garbage collection handed back for reuse.
    pub gc_reclaimed_bytes: AtomicU64,
    /// Log bytes foreground writers appended since open (garbage collection's copies not
    /// included): what background GC's urgent budget follows.
    pub foreground_bytes: AtomicU64,
    /// Nanoseconds foreground writers slept for write pacing.
    pub gc_paced_ns: AtomicU64,
    /// `Storage::prefetch` calls made for range iterators, multi-gets and long records, and
    /// the bytes they named (page-rounded; pages already resident count too).
    pub prefetch_calls: AtomicU64,
    pub prefetch_bytes: AtomicU64,
    /// Records not asked for because a probe found their batch resident.
    pub prefetch_skipped: AtomicU64,
    /// Whether readers copy records with `pread` or read them through the mapping.
    pub read_mode: ReadMode,
    /// Records read by copy (`ReadMode` said so).
    pub copied_record_reads: AtomicU64,
    /// Puts deferred (`Options::deferred_updates`).
    pub deferred_puts: AtomicU64,
    /// Wakes the background committer early (dirty-bytes threshold reached).
    wake: (Mutex<bool>, Condvar),
    pub frees: Arc<Mutex<PendingFrees>>,
    /// Nanoseconds a foreground writer sleeps per KiB it appends; 0 unless garbage
    /// collection is behind its space target (see `pace_writer`).
    pub write_delay_ns_per_kib: AtomicU64,
    /// Trims (punches of freed log segments) queued, issued and forced per member.
    pub trims: TrimCounters,
}

/// A paced writer sleeps once it owes this much (the kernel's timer slack makes shorter
/// sleeps cost more than they ask for).
const PACE_SLEEP_MIN_NS: u64 = 500_000;

thread_local! {
    /// Pacing delay this thread owes but has not slept yet.
    static PACE_DEBT_NS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Blocks on their way back to the allocator (see DESIGN.md, "freeing").
#[derive(Default)]
pub(crate) struct PendingFrees {
    /// Unreferenced by any durable commit, waiting for in-flight readers (crossbeam epoch).
    pub limbo: Vec<(DiskOffset, u64)>,
    /// Safe to reuse; applied to the bitmap at the start of the next commit.
    pub releasable: Vec<(DiskOffset, u64)>,
}

impl Shared {
    pub fn new(options: Options, volume: Volume, allocator: Allocator) -> Shared {
        let writes = (options.writes_in_flight_segments > 0).then(|| {
            let queue = WriteQueue::new(
                options.writes_in_flight_segments as u64 * options.log_segment_bytes,
                options.writes_in_flight_volume_bytes,
                options.writes_in_flight_depth,
                options.runs_background_threads(),
            );
            // Every member from the start, so one never written counts its idle time.
            queue.add_members(volume.storage().members().len().max(1));
            queue
        });
        let trims = TrimCounters::new(volume.storage().members().len());
        let read_mode = ReadMode::new(options.cold_reads_copied);
        Shared {
            trims,
            writes,
            options,
            volume,
            allocator,
            poisoned: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            write_ticket: AtomicU64::new(0),
            group: GroupCommit::new(),
            log_bytes_since_commit: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            commits: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            gc_passes: AtomicU64::new(0),
            reorganised_bytes: AtomicU64::new(0),
            scattered_reads: AtomicU64::new(0),
            scattered_reads_dropped: AtomicU64::new(0),
            gc_relocated_bytes: AtomicU64::new(0),
            gc_reclaimed_bytes: AtomicU64::new(0),
            foreground_bytes: AtomicU64::new(0),
            gc_paced_ns: AtomicU64::new(0),
            prefetch_calls: AtomicU64::new(0),
            prefetch_bytes: AtomicU64::new(0),
            prefetch_skipped: AtomicU64::new(0),
            read_mode,
            copied_record_reads: AtomicU64::new(0),
            deferred_puts: AtomicU64::new(0),
            wake: (Mutex::new(false), Condvar::new()),
            frees: Arc::new(Mutex::new(PendingFrees::default())),
            write_delay_ns_per_kib: AtomicU64::new(0),
        }
    }

    /// Bytes waiting in each member's write queue (none without writes in flight): what
    /// least-weighted dispatch counts as a member's queued writes.
    pub fn queued_write_bytes(&self) -> Vec<u64> {
        self.writes
            .as_ref()
            .map(|q| q.waiting_bytes())
            .unwrap_or_default()
    }

    pub fn check_writable(&self) -> Result<()> {
        self.check_writes()?;
        if self.poisoned.load(Ordering::Acquire) {
            return Err(Error::Poisoned);
        }
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        Ok(())
    }

    /// After a failed write or sync nothing more is acknowledged (docs/reliability.md, promise 5).
    pub fn poison(&self) {
        self.poisoned.store(true, Ordering::Release);
    }

    /// Whether the store is poisoned, a failed background write included.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Acquire) || self.writes.as_ref().is_some_and(|q| q.failed())
    }

    /// A background write that failed poisons the store; the first caller to see it gets
    /// its error (what the writer got when it wrote the segment itself), later ones
    /// `Poisoned`.
    fn check_writes(&self) -> Result<()> {
        match &self.writes {
            Some(q) if q.failed() => {
                self.poison();
                q.check()
            }
            _ => Ok(()),
        }
    }

    /// Waits until every closed segment queued before this call is written, on every
    /// member (a sync or commit must not `fdatasync` before them). A failed write
    /// poisons the store and is returned.
    pub fn wait_writes(&self) -> Result<()> {
        match &self.writes {
            Some(q) => q.wait_queued().inspect_err(|_| self.poison()),
            None => Ok(()),
        }
    }

    pub fn maybe_wake_committer(&self) {
        if self.log_bytes_since_commit.load(Ordering::Relaxed) >= self.options.commit_dirty_bytes {
            self.wake_committer();
        }
    }

    /// Slows a foreground writer that just appended `bytes` while garbage collection
    /// cannot keep the disk under its target (`write_delay_ns_per_kib`, set by the
    /// collector: `gc::policy::write_delay`). The delay is owed per thread and
    /// slept in pieces of at least `PACE_SLEEP_MIN_NS`, so a writer sleeps now and then
    /// instead of at every write.
    pub fn pace_writer(&self, bytes: u64) {
        let delay = self.write_delay_ns_per_kib.load(Ordering::Relaxed);
        if delay == 0 {
            return;
        }
        PACE_DEBT_NS.with(|debt| {
            let owed = debt.get() + delay * bytes / 1024;
            if owed >= PACE_SLEEP_MIN_NS {
                debt.set(0);
                self.gc_paced_ns.fetch_add(owed, Ordering::Relaxed);
                std::thread::sleep(Duration::from_nanos(owed));
            } else {
                debt.set(owed);
            }
        });
    }

    /// Has the background loop look at once at what is due (a commit, a commit pair for
    /// GC) instead of at its next tick.
    pub fn wake_committer(&self) {
        let (lock, cv) = &self.wake;
        *lock.lock() = true;
        cv.notify_one();
    }

    /// Hands extents to the allocator once no in-flight reader can still see them.
    pub fn release_after_readers(&self, extents: Vec<(DiskOffset, u64)>) {
        if extents.is_empty() {
            return;
        }
        self.frees.lock().limbo.extend_from_slice(&extents);
        let frees = Arc::clone(&self.frees);
        let guard = crossbeam_epoch::pin();
        guard.defer(move || {
            let mut f = frees.lock();
            for e in extents {
                let i = f
                    .limbo
                    .iter()
                    .position(|x| *x == e)
                    .expect("extent in limbo");
                f.limbo.swap_remove(i);
                f.releasable.push(e);
            }
        });
        guard.flush();
    }
    /// Refuses writes from now on (`close`); reads go on while handles live.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// Group commit: makes every write with a ticket up to `ticket` durable, pipelined
    /// (`group_commit.rs`): the waiting writers flush for each other (`flush_tails`: every
    /// region's tail to the file, then the segments queued before it) while the previous
    /// group's `fdatasync` runs, one `fdatasync` in flight. A failure poisons.
    pub fn sync_to(&self, ticket: u64, flush_tails: impl Fn() -> Result<()>) -> Result<()> {
        // A poisoned store answers no sync with Ok, even one with nothing left to write:
        // the caller would take it for a healthy store.
        self.check_writes()?;
        if self.is_poisoned() {
            return Err(Error::Poisoned);
        }
        let flush = || {
            // Read before the flush: every write up to it has its bytes in a tail or in a
            // segment queued before `wait_writes` below.
            let target = self.write_ticket.load(Ordering::Acquire);
            flush_tails()?;
            self.wait_writes()?;
            Ok(target)
        };
        let fdatasync = || {
            self.volume.storage().sync()?;
            self.syncs.fetch_add(1, Ordering::Relaxed);
            Ok(())
        };
        self.group
            .sync_to(ticket, || self.check_writable(), flush, fdatasync)
            .inspect_err(|e| {
                if !matches!(e, Error::Closed) {
                    self.poison();
                }
            })
    }

    /// The newest write ticket handed out: `sync_to` it covers every write so far.
    pub fn last_write_ticket(&self) -> u64 {
        self.write_ticket.load(Ordering::Acquire)
    }

    /// Waits until `wake_committer` is called or `tick` passes, whichever comes first.
    pub fn wait_for_wake(&self, tick: Duration) {
        let (lock, cv) = &self.wake;
        let mut woken = lock.lock();
        if !*woken {
            cv.wait_for(&mut woken, tick);
        }
        *woken = false;
    }

    /// Wakes every thread in `wait_for_wake` (the database is closing).
    pub fn wake_all(&self) {
        let (lock, cv) = &self.wake;
        *lock.lock() = true;
        cv.notify_all();
    }

    // ----- freeing (DESIGN.md, "Freeing") ---------------------------------------------

    /// Gives extents nothing can reach any more back: blocks free in the live bitmap, and
    /// the free runs they lie in (merged with free neighbours, at least
    /// `PUNCH_MIN_BLOCKS`) punched out of the file. Only between commits (the caller
    /// holds the commit state). A failed punch loses nothing (the bytes stay allocated in
    /// the file), so it is not an error.
    ///
    /// With the collector's loop running and trims scheduled (`Options::trim_schedule`),
    /// log segments (and other large extents) are not punched here: they are listed per
    /// member, the next segments are allocated from them, and `schedule_trims` punches
    /// those still free `DEFERRED_PUNCH_AGE` later when the member's queue is quiet or
    /// its device short of space (`crate::trim`). A GC burst frees and reuses hundreds of
    /// MiB a second; punching each segment as it came back, then allocating it again,
    /// held the file's inode lock (every `pwrite` waits for it) for a quarter of the
    /// burst on a file system that discards punched blocks synchronously.
    pub fn release_extents(&self, extents: &[(DiskOffset, u64)]) {
        let storage = self.volume.storage();
        // Only the loop punches deferred runs between a forced pass and close.
        let defer = self.options.trim_schedule == TrimSchedule::Scheduled
            && self.options.gc
            && self.options.runs_background_threads();
        self.allocator.release_punching(
            extents,
            PUNCH_MIN_BLOCKS,
            defer,
            &mut |offset, len_bytes| {
                let _ = storage.punch_hole(offset, len_bytes);
            },
        );
        for (offset, _) in extents.iter().filter(|(_, b)| *b >= PUNCH_MIN_BLOCKS) {
            let member = storage.member_of(offset.0).unwrap_or(0);
            if defer {
                self.trims.add_queued(member);
            } else {
                self.trims.add_issued(member);
            }
        }
    }

    /// Hands the extents waiting in `releasable` to the allocator (`release_extents`).
    pub fn release_releasable(&self) {
        let releasable = std::mem::take(&mut self.frees.lock().releasable);
        self.release_extents(&releasable);
    }

    /// One pass of the trim scheduler (`crate::trim`): per member, from its queue
    /// (writes reserved, queued or in flight; reads in flight) and its device's free
    /// space, holds its listed trims, issues up to `trim_pass_bytes_max` of them, or
    /// forces all; only runs listed at least `min_age` ago are looked at (new segments
    /// take younger ones first). Returns the bytes punched.
    pub fn schedule_trims(&self, min_age: Duration) -> u64 {
        let decisions = self.trim_decisions();
        let mut issued_bytes = vec![0u64; decisions.len()];
        let storage = self.volume.storage();
        let trims = &self.trims;
        self.allocator.punch_deferred_selected(
            min_age,
            &mut |offset, len_bytes| {
                let m = storage
                    .member_of(offset)
                    .unwrap_or(0)
                    .min(decisions.len() - 1);
                match decisions[m] {
                    Decision::Hold => false,
                    Decision::Force => {
                        trims.add_forced(m);
                        true
                    }
                    Decision::Issue { bytes_max } if issued_bytes[m] < bytes_max => {
                        issued_bytes[m] += len_bytes;
                        trims.add_issued(m);
                        true
                    }
                    Decision::Issue { .. } => false,
                }
            },
            &mut |offset, len_bytes| {
                let _ = storage.punch_hole(offset, len_bytes);
            },
        )
    }

    /// Each member's decision for this pass (`crate::trim::decide`).
    fn trim_decisions(&self) -> Vec<Decision> {
        let storage = self.volume.storage();
        let members = storage.members();
        let queues = self
            .writes
            .as_ref()
            .map(|q| q.member_figures())
            .unwrap_or_default();
        let policy = self.options.trim_policy();
        (0..self.trims.member_count())
            .map(|m| {
                let loads = members.get(m);
                let queued = queues.get(m).map_or(0, |q| q.in_flight_bytes);
                // A running segment job's write is in both figures: the larger counts it once.
                let queue = MemberQueue {
                    write_bytes: queued.max(loads.map_or(0, |l| l.in_flight_write_bytes)),
                    read_bytes: loads.map_or(0, |l| l.in_flight_read_bytes),
                };
                crate::trim::decide(queue, storage.device_space(m), &policy)
            })
            .collect()
    }

    /// Punches every listed run (close): no load to wait for any more. Returns the bytes.
    pub fn flush_trims(&self) -> u64 {
        let storage = self.volume.storage();
        let trims = &self.trims;
        self.allocator.punch_deferred_selected(
            Duration::ZERO,
            &mut |offset, _| {
                trims.add_issued(storage.member_of(offset).unwrap_or(0));
                true
            },
            &mut |offset, len_bytes| {
                let _ = storage.punch_hole(offset, len_bytes);
            },
        )
    }

    /// Per member (member 0 for one file): trims queued, issued, forced and bytes listed.
    pub fn trim_figures(&self) -> Vec<TrimFigures> {
        let storage = self.volume.storage();
        let mut pending = vec![0u64; self.trims.member_count()];
        for (offset, len_bytes) in self.allocator.deferred_runs() {
            let m = storage
                .member_of(offset)
                .unwrap_or(0)
                .min(pending.len() - 1);
            pending[m] += len_bytes;
        }
        pending
            .iter()
            .enumerate()
            .map(|(m, &bytes)| self.trims.figures(m, bytes))
            .collect()
    }

    /// Nudges the readers' grace period up to `nudges` times while extents wait in limbo
    /// (`yield_between`: give the core away between nudges). Readers pinned elsewhere may
    /// delay them; then a later wake-up of the committer hands them back.
    pub fn nudge_readers_grace(&self, nudges: usize, yield_between: bool) {
        for _ in 0..nudges {
            if self.frees.lock().limbo.is_empty() {
                break;
            }
            crossbeam_epoch::pin().flush();
            if yield_between {
                std::thread::yield_now();
            }
        }
    }
}

/// Extents at least this long are punched when they return to the allocator: log
/// segments (64 KiB at least) and runs of nodes; single blocks are not worth a system call.
const PUNCH_MIN_BLOCKS: u64 = 16;

/// How long a released log segment waits, unpunched, for a new segment to reuse it,
/// before the trim scheduler looks at it.
pub(crate) const DEFERRED_PUNCH_AGE: Duration = Duration::from_millis(500);
