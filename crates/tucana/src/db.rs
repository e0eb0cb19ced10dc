//! The database handle: opens a volume, owns its regions (keyspaces), the background
//! thread (flushes, commits, garbage collection) and the group-commit machinery.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};

use crate::alloc::Allocator;
use crate::check::CheckReport;
use crate::error::{Error, Result};
use crate::keyspace::Keyspace;
use crate::region::Region;
use crate::stats::{KeyspaceStats, Stats};
use crate::types::{CommitEpoch, DiskOffset, BLOCK_BYTES};
use crate::volume::{Storage, Volume};

/// How a database is opened. Built with `Database::builder()`.
#[derive(Clone, Debug)]
pub struct Options {
    /// Background commit at least this often while there are changes (`None`: never).
    pub commit_interval: Option<Duration>,
    /// Background commit once this many log bytes were written since the last commit.
    pub commit_dirty_bytes: u64,
    /// Buffered writes are flushed and synced at least this often (`None`: never).
    pub flush_interval: Option<Duration>,
    /// Size of a log segment; records larger than this get a segment of their own.
    pub log_segment_bytes: u64,
    /// Create the volume if the file does not exist.
    pub create_if_missing: bool,
    /// Background garbage collection of the log, in a thread of its own beside the
    /// background committer; both exist when `commit_interval` or `flush_interval` is set
    /// (GC needs commits to free anything). `Database::gc` works either way.
    pub gc: bool,
    /// The space amplification background GC steers toward: disk bytes over the keys and
    /// values of live records. A keyspace's dead log bytes are collected back under half
    /// the room the target leaves once they pass it (the room: what keeps its log,
    /// estimated index and share of the volume's measured overhead, such as index nodes
    /// copied on write and segments on their way back, at the target; for records so
    /// small that their headers and index entries alone exceed it, the line is 0.36 of
    /// what they take with no garbage, for a target of 1.5). A fast burst of overwrites
    /// runs a little over it until it ends. Writers are paced past twice the room
    /// (DESIGN.md, "Garbage collection").
    pub gc_space_amp: f64,
    /// Most bytes of live records background GC copies per second while collecting back
    /// to its line; past 0.65 of the room it may also copy 2 bytes per byte
    /// foreground writers append.
    pub gc_rate_bytes_per_sec: u64,
    /// Range iterators keep the log records of this many entries ahead of each end asked
    /// for at once (`Storage::prefetch`), so that a scan of records not in memory has many
    /// reads in flight; `multi_get` prefetches its keys' records in windows of at least
    /// this many, `get_many_with` group by group, and a record longer than two pages is
    /// asked for whole before it is read.
    /// 0 turns all of it off.
    pub scan_prefetch_entries: usize,
    /// How often the background collector wakes to take a step (default 100 ms). For the
    /// torture suites, which need background GC steps within a few milliseconds of work to
    /// crash inside them; not a tuning knob (the budget follows the foreground, not the tick).
    #[doc(hidden)]
    pub gc_tick: Duration,
    /// Address space reserved for the read mapping of a volume file (default 64 GiB); the
    /// mapping grows past it with the file, only sooner with a smaller one. Costs no
    /// memory, but tools that cap a process's address space (valgrind, `ulimit -v`) refuse
    /// the default.
    pub mapping_reservation_bytes: u64,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            commit_interval: Some(Duration::from_secs(5)),
            commit_dirty_bytes: 256 << 20,
            flush_interval: Some(Duration::from_millis(200)),
            log_segment_bytes: 2 << 20,
            create_if_missing: true,
            gc: true,
            gc_space_amp: 1.5,
            gc_rate_bytes_per_sec: 64 << 20,
            scan_prefetch_entries: 64,
            gc_tick: GC_TICK,
            mapping_reservation_bytes: crate::volume::DEFAULT_MAPPING_RESERVATION_BYTES,
        }
    }
}

impl Options {
    pub fn commit_interval(mut self, interval: Option<Duration>) -> Options {
        self.commit_interval = interval;
        self
    }

    pub fn commit_dirty_bytes(mut self, bytes: u64) -> Options {
        self.commit_dirty_bytes = bytes;
        self
    }

    pub fn flush_interval(mut self, interval: Option<Duration>) -> Options {
        self.flush_interval = interval;
        self
    }

    pub fn log_segment_bytes(mut self, bytes: u64) -> Options {
        self.log_segment_bytes = bytes;
        self
    }

    pub fn create_if_missing(mut self, create: bool) -> Options {
        self.create_if_missing = create;
        self
    }

    /// Turns background garbage collection on (the default) or off.
    pub fn gc(mut self, on: bool) -> Options {
        self.gc = on;
        self
    }

    /// Space amplification (disk bytes / live keys and values) background GC steers
    /// toward; more than 1.0 (default 1.5). See the field.
    pub fn gc_space_amp(mut self, target: f64) -> Options {
        self.gc_space_amp = target;
        self
    }

    /// Bytes of live records background GC copies per second (default 64 MiB/s); during
    /// a burst it may copy more. See the field.
    pub fn gc_rate_bytes_per_sec(mut self, rate: u64) -> Options {
        self.gc_rate_bytes_per_sec = rate;
        self
    }

    /// Log records range iterators ask the device for ahead of where they are (default
    /// 64; 0: none, also for `multi_get` and `get_many_with`). See the field.
    pub fn scan_prefetch_entries(mut self, entries: usize) -> Options {
        self.scan_prefetch_entries = entries;
        self
    }

    /// See the field; for tests.
    #[doc(hidden)]
    pub fn gc_tick(mut self, tick: Duration) -> Options {
        self.gc_tick = tick;
        self
    }

    /// See the field (at least one block).
    pub fn mapping_reservation_bytes(mut self, bytes: u64) -> Options {
        self.mapping_reservation_bytes = bytes.max(crate::types::BLOCK_BYTES);
        self
    }

    /// Whether an open store runs the background committer (and, with `gc`, the
    /// collector's loop): only when something is timed.
    pub(crate) fn runs_background_threads(&self) -> bool {
        self.commit_interval.is_some() || self.flush_interval.is_some()
    }

    /// Opens (or creates) the volume in the file at `path`, locked against other processes.
    pub fn open(self, path: impl AsRef<Path>) -> Result<Database> {
        let storage = crate::volume::FileStorage::open_with_min_reservation(
            path.as_ref(),
            self.create_if_missing,
            self.mapping_reservation_bytes,
        )?;
        self.open_storage(Arc::new(storage))
    }

    /// Opens a volume held in memory (lost when dropped); for tests and tools.
    pub fn open_in_memory(self) -> Result<Database> {
        self.open_storage(Arc::new(crate::volume::MemStorage::new()))
    }

    /// Opens the volume on any storage backend (e.g. a fault-injecting one).
    pub fn open_storage(self, storage: Arc<dyn Storage>) -> Result<Database> {
        if !self.log_segment_bytes.is_power_of_two()
            || !(64 << 10..=64 << 20).contains(&self.log_segment_bytes)
        {
            return Err(Error::InvalidArgument(
                "log_segment_bytes must be a power of two from 64 KiB to 64 MiB".into(),
            ));
        }
        // NaN is rejected too (it is not greater than 1.0).
        if self.gc_space_amp.partial_cmp(&1.0) != Some(std::cmp::Ordering::Greater)
            || self.gc_rate_bytes_per_sec == 0
        {
            return Err(Error::InvalidArgument(
                "gc_space_amp must be more than 1.0 and gc_rate_bytes_per_sec positive".into(),
            ));
        }
        let inner = crate::recovery::open(self, storage)?;
        let inner = Arc::new(inner);
        DbInner::start_background(&inner);
        Ok(Database { inner })
    }
}

/// A handle to an open database. Cheap to clone; `Send + Sync`.
#[derive(Clone)]
pub struct Database {
    pub(crate) inner: Arc<DbInner>,
}

impl Database {
    pub fn builder() -> Options {
        Options::default()
    }

    /// Opens (or creates) the database file at `path` with default options.
    pub fn open(path: impl AsRef<Path>) -> Result<Database> {
        Options::default().open(path)
    }

    /// Opens the keyspace `name`, creating it (durably) if it does not exist.
    pub fn keyspace(&self, name: &str) -> Result<Keyspace> {
        if let Some(region) = self.inner.regions.read().get(name) {
            return Ok(Keyspace::new(self.inner.clone(), region.clone()));
        }
        let region = self.inner.create_region(name)?;
        Ok(Keyspace::new(self.inner.clone(), region))
    }

    /// Opens the keyspace `name`; `Error::KeyspaceNotFound` if it does not exist.
    pub fn open_keyspace(&self, name: &str) -> Result<Keyspace> {
        match self.inner.regions.read().get(name) {
            Some(region) => Ok(Keyspace::new(self.inner.clone(), region.clone())),
            None => Err(Error::KeyspaceNotFound(name.to_string())),
        }
    }

    /// Names of all keyspaces, sorted.
    pub fn keyspace_names(&self) -> Vec<String> {
        self.inner.regions.read().keys().cloned().collect()
    }

    /// Drops a keyspace and all its data (durably); its space is freed by later commits.
    /// Handles to it still held report `Error::KeyspaceNotFound`.
    pub fn drop_keyspace(&self, name: &str) -> Result<()> {
        self.inner.drop_region(name)
    }

    /// Makes every write acknowledged so far durable (log flush + sync); group commit.
    pub fn sync(&self) -> Result<()> {
        self.inner.sync()
    }

    /// Persists the index: a new commit epoch. Implies `sync`.
    pub fn commit(&self) -> Result<()> {
        self.inner.commit()
    }

    /// Garbage-collects the log now, fully: relocates the live records of every log
    /// segment with dead space worth taking back, commits until the emptied segments are
    /// back in the allocator, and gives their bytes back to the file system. Segments that a
    /// snapshot or iterator opened before may still read are freed by a commit after it is
    /// dropped. Readers and writers keep going meanwhile; commits interleave.
    pub fn gc(&self) -> Result<()> {
        self.inner.gc_full()
    }

    pub fn stats(&self) -> Stats {
        self.inner.stats()
    }

    /// Commits, then walks the whole committed volume and verifies every invariant and
    /// checksum. Writers keep running meanwhile; commits wait.
    pub fn check(&self) -> Result<CheckReport> {
        crate::check::check(&self.inner)
    }

    /// Commits and closes. Dropping the last handle does the same, ignoring errors.
    /// Other clones of this handle (and keyspace handles) keep the volume open until they
    /// are dropped, but no longer commit in the background.
    pub fn close(self) -> Result<()> {
        self.inner.finish()
    }

    /// Drops the handle as a process crash would: no flush, no sync, no commit; the
    /// volume lock is released once every handle is gone. Bytes already written to the
    /// file stay (as after a process crash); buffered writes still in memory are lost.
    /// For tests and benchmarks.
    #[doc(hidden)]
    pub fn abandon(self) {
        self.inner.abandon()
    }
}

/// State shared by the database and its regions.
pub(crate) struct Shared {
    pub options: Options,
    pub volume: Volume,
    pub allocator: Allocator,
    poisoned: AtomicBool,
    /// `close` was called: writes are refused (reads go on while handles live).
    closed: AtomicBool,
    /// Number of the newest write whose records are in a log buffer.
    pub write_ticket: AtomicU64,
    /// Every write with a ticket at or below this is durable.
    synced_ticket: AtomicU64,
    sync_lock: Mutex<()>,
    pub log_bytes_since_commit: AtomicU64,
    pub bytes_written: AtomicU64,
    pub commits: AtomicU64,
    pub syncs: AtomicU64,
    /// Garbage collection passes that did something (background steps and forced passes).
    pub gc_passes: AtomicU64,
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
    /// Wakes the background committer early (dirty-bytes threshold reached).
    wake: (Mutex<bool>, Condvar),
    pub frees: Arc<Mutex<PendingFrees>>,
    /// Nanoseconds a foreground writer sleeps per KiB it appends; 0 unless garbage
    /// collection is behind its space target (see `pace_writer`).
    pub write_delay_ns_per_kib: AtomicU64,
    /// Disk bytes beyond the regions' logs and estimated index, per byte of their
    /// floor, its decaying peak (f64 bits): set by each background GC step
    /// (`DbInner::measure_overhead`).
    pub gc_overhead_share_bits: AtomicU64,
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
        Shared {
            options,
            volume,
            allocator,
            poisoned: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            write_ticket: AtomicU64::new(0),
            synced_ticket: AtomicU64::new(0),
            sync_lock: Mutex::new(()),
            log_bytes_since_commit: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            commits: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            gc_passes: AtomicU64::new(0),
            gc_relocated_bytes: AtomicU64::new(0),
            gc_reclaimed_bytes: AtomicU64::new(0),
            foreground_bytes: AtomicU64::new(0),
            gc_paced_ns: AtomicU64::new(0),
            prefetch_calls: AtomicU64::new(0),
            prefetch_bytes: AtomicU64::new(0),
            prefetch_skipped: AtomicU64::new(0),
            wake: (Mutex::new(false), Condvar::new()),
            frees: Arc::new(Mutex::new(PendingFrees::default())),
            write_delay_ns_per_kib: AtomicU64::new(0),
            gc_overhead_share_bits: AtomicU64::new(0),
        }
    }

    pub fn check_writable(&self) -> Result<()> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(Error::Poisoned);
        }
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        Ok(())
    }

    /// After a failed write or sync nothing more is acknowledged (RELIABILITY.md §5).
    pub fn poison(&self) {
        self.poisoned.store(true, Ordering::Release);
    }

    pub fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Acquire)
    }

    pub fn maybe_wake_committer(&self) {
        if self.log_bytes_since_commit.load(Ordering::Relaxed) >= self.options.commit_dirty_bytes {
            self.wake_committer();
        }
    }

    /// Slows a foreground writer that just appended `bytes` while garbage collection
    /// cannot keep the disk under its target (`write_delay_ns_per_kib`, set by the
    /// collector: [`crate::gc::next_write_delay`]). The delay is owed per thread and
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
}

/// Commit bookkeeping, under `DbInner::commit_state`.
pub(crate) struct CommitState {
    /// Newest durable commit.
    pub epoch: CommitEpoch,
    pub next_region_id: u64,
    /// Descriptor extents of the last two durable commits (older first).
    pub descriptors: [Option<(DiskOffset, u64)>; 2],
    /// Extents unreferenced by the newest commit but still by the one before it; freed
    /// after the next commit (so either superblock slot stays a complete state).
    pub deferred: Vec<(DiskOffset, u64)>,
    /// Extents of dropped regions, unreferenced from the next commit on.
    pub dropped: Vec<(DiskOffset, u64)>,
}

pub(crate) struct DbInner {
    pub shared: Arc<Shared>,
    pub regions: RwLock<BTreeMap<String, Arc<Region>>>,
    pub commit_state: Mutex<CommitState>,
    /// The garbage collector; one pass at a time.
    pub gc: Mutex<crate::gc::GcState>,
    /// The background committer and, with `gc`, the garbage collector's thread.
    background: Mutex<Vec<std::thread::JoinHandle<()>>>,
    stop: AtomicBool,
    finished: AtomicBool,
}

impl DbInner {
    pub fn new(
        shared: Arc<Shared>,
        regions: BTreeMap<String, Arc<Region>>,
        cs: CommitState,
    ) -> DbInner {
        DbInner {
            shared,
            regions: RwLock::new(regions),
            commit_state: Mutex::new(cs),
            gc: Mutex::new(crate::gc::GcState::new()),
            background: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            finished: AtomicBool::new(false),
        }
    }

    pub fn region_list(&self) -> Vec<Arc<Region>> {
        self.regions.read().values().cloned().collect()
    }

    /// Group commit: makes every write with a ticket up to `ticket` durable. Whoever
    /// holds the sync lock flushes for everybody waiting behind it.
    pub fn sync_to(&self, ticket: u64) -> Result<()> {
        let shared = &self.shared;
        // A poisoned store answers no sync with Ok, even one with nothing left to write:
        // the caller would take it for a healthy store.
        if shared.is_poisoned() {
            return Err(Error::Poisoned);
        }
        if shared.synced_ticket.load(Ordering::Acquire) >= ticket {
            return Ok(());
        }
        let _sync = shared.sync_lock.lock();
        if shared.synced_ticket.load(Ordering::Acquire) >= ticket {
            return Ok(());
        }
        shared.check_writable()?;
        let target = shared.write_ticket.load(Ordering::Acquire);
        let result = (|| {
            for region in self.region_list() {
                region.flush_tail()?;
            }
            shared.volume.storage().sync()
        })();
        if let Err(e) = result {
            shared.poison();
            return Err(e);
        }
        shared.synced_ticket.fetch_max(target, Ordering::AcqRel);
        shared.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    pub fn sync(&self) -> Result<()> {
        self.sync_to(self.shared.write_ticket.load(Ordering::Acquire))
    }

    pub fn commit(&self) -> Result<()> {
        let mut cs = self.commit_state.lock();
        self.commit_locked(&mut cs)
    }

    /// A commit and its repeat (`commit_pair_locked`): both superblock slots name the
    /// newest state, and what it stopped referencing is freed at once.
    pub fn commit_pair(&self) -> Result<()> {
        let mut cs = self.commit_state.lock();
        self.commit_pair_locked(&mut cs)
    }

    fn start_background(this: &Arc<DbInner>) {
        let opts = &this.shared.options;
        if !opts.runs_background_threads() {
            return;
        }
        let weak = Arc::downgrade(this);
        let handle = std::thread::Builder::new()
            .name("tucana-committer".into())
            .spawn(move || background_loop(weak))
            .expect("spawn the background committer");
        let mut threads = this.background.lock();
        threads.push(handle);
        if opts.gc {
            // Its own thread: a GC step and a commit (two fsyncs, often hundreds of
            // milliseconds under a burst) in one thread each held the other up, and GC
            // needs those commits to give space back.
            let weak = Arc::downgrade(this);
            let handle = std::thread::Builder::new()
                .name("tucana-gc".into())
                .spawn(move || gc_loop(weak))
                .expect("spawn the background garbage collector");
            threads.push(handle);
        }
    }

    fn stop_background(&self) {
        self.stop.store(true, Ordering::Release);
        {
            let (lock, cv) = &self.shared.wake;
            *lock.lock() = true;
            cv.notify_all();
        }
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
        let mut cs = self.commit_state.lock();
        self.shared.closed.store(true, Ordering::Release);
        for region in self.region_list() {
            drop(region.writer.lock());
        }
        let committed = self.commit_locked(&mut cs);
        // The file keeps no free segment the background collector left unpunched.
        crate::commit::punch_deferred(&self.shared, std::time::Duration::ZERO);
        committed
    }

    pub fn abandon(&self) {
        if self.finished.swap(true, Ordering::AcqRel) {
            return;
        }
        self.stop_background();
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
            allocated_bytes: shared.allocator.allocated_blocks() * BLOCK_BYTES,
            commit_epoch: self.commit_state.lock().epoch.0,
            gc_passes: shared.gc_passes.load(Ordering::Relaxed),
            gc_relocated_bytes: shared.gc_relocated_bytes.load(Ordering::Relaxed),
            gc_reclaimed_bytes: shared.gc_reclaimed_bytes.load(Ordering::Relaxed),
            gc_paced_ns: shared.gc_paced_ns.load(Ordering::Relaxed),
            prefetch_calls: shared.prefetch_calls.load(Ordering::Relaxed),
            prefetch_bytes: shared.prefetch_bytes.load(Ordering::Relaxed),
            prefetch_skipped: shared.prefetch_skipped.load(Ordering::Relaxed),
            ..Stats::default()
        };
        for region in self.region_list() {
            let ks = KeyspaceStats {
                name: region.name.clone(),
                keys: region.keys.load(Ordering::Relaxed),
                live_log_bytes: region.live_bytes.load(Ordering::Relaxed),
                dead_log_bytes: region.dead_bytes.load(Ordering::Relaxed),
                log_segments: region.segment_count(),
                log_size_bytes: region.log_size_bytes() + region.retired_segment_bytes(),
                index_nodes: region.tree.heap_nodes(),
            };
            stats.keys += ks.keys;
            stats.live_log_bytes += ks.live_log_bytes;
            stats.dead_log_bytes += ks.dead_log_bytes;
            stats.log_size_bytes += ks.log_size_bytes;
            stats.index_nodes += ks.index_nodes;
            stats.keyspaces.push(ks);
        }
        stats.index_bytes = stats.index_nodes * crate::index::NODE_BYTES as u64;
        stats
    }
}

impl Drop for DbInner {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

/// Flushes buffered writes every `flush_interval`, commits every `commit_interval` (when
/// there are changes, or space garbage collection freed waits for a commit), when
/// `commit_dirty_bytes` of log were written since the last commit, or sooner when GC
/// holds space only commits give back (`DbInner::gc_commit_due`). Garbage collection
/// runs in a thread of its own (`gc_loop`).
fn background_loop(db: std::sync::Weak<DbInner>) {
    let mut last_commit = Instant::now();
    let mut last_flush = Instant::now();
    loop {
        let Some(inner) = db.upgrade() else { return };
        if inner.stop.load(Ordering::Acquire) {
            return;
        }
        let opts = inner.shared.options.clone();
        let tick = [opts.flush_interval, opts.commit_interval]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(Duration::from_secs(1))
            .min(Duration::from_millis(100));
        {
            let (lock, cv) = &inner.shared.wake;
            let mut woken = lock.lock();
            if !*woken {
                cv.wait_for(&mut woken, tick);
            }
            *woken = false;
        }
        if inner.stop.load(Ordering::Acquire) || inner.shared.is_poisoned() {
            return;
        }
        if !inner.shared.frees.lock().limbo.is_empty() {
            // Frees wait for readers' grace period, which only moves when threads pin;
            // an idle store has none, so nudge it.
            crossbeam_epoch::pin().flush();
        }
        if opts.gc && !inner.shared.frees.lock().releasable.is_empty() {
            // Give their bytes back now rather than at the next commit.
            inner.release_frees_now();
        }
        let dirty = inner.shared.log_bytes_since_commit.load(Ordering::Relaxed);
        let since_commit = last_commit.elapsed();
        let commit_due = opts.commit_interval.is_some_and(|i| {
            since_commit >= i && (dirty > 0 || (opts.gc && inner.gc_wants_commit()))
        }) || dirty >= opts.commit_dirty_bytes;
        if opts.gc && opts.commit_interval.is_some() && inner.gc_commit_due(since_commit) {
            // Errors poison the database; the next user call reports them.
            let _ = inner.gc_commit_pair();
            last_commit = Instant::now();
            last_flush = last_commit;
        } else if commit_due {
            // Errors poison the database; the next user call reports them.
            let _ = inner.commit();
            if opts.gc {
                // What the commit freed past its readers goes back now, not at the next
                // wake-up.
                inner.release_frees_now();
            }
            last_commit = Instant::now();
            last_flush = last_commit;
        } else if opts
            .flush_interval
            .is_some_and(|i| last_flush.elapsed() >= i)
        {
            let _ = inner.sync();
            last_flush = Instant::now();
        }
    }
}

/// Background GC's tick by default (`Options::gc_tick`): a step at least this often.
const GC_TICK: Duration = Duration::from_millis(100);

/// Runs a budgeted step of garbage collection every `GC_TICK`, or at once after a step
/// that stopped at its cap with work left (`DbInner::background_gc`).
fn gc_loop(db: std::sync::Weak<DbInner>) {
    let tick = match db.upgrade() {
        Some(inner) => inner.shared.options.gc_tick,
        None => return,
    };
    let mut behind = false;
    loop {
        if !behind {
            // `stop_background` unparks: no tick's wait to close.
            std::thread::park_timeout(tick);
        }
        let Some(inner) = db.upgrade() else { return };
        if inner.stop.load(Ordering::Acquire) || inner.shared.is_poisoned() {
            return;
        }
        // Errors that matter poison the database; the next user call reports them.
        behind = inner.background_gc().unwrap_or(false);
        crate::commit::punch_deferred(&inner.shared, crate::commit::DEFERRED_PUNCH_AGE);
        // Segments it retired come back only through commits: let the committer judge now.
        inner.shared.wake_committer();
    }
}
