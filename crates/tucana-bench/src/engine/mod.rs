//! The engines under test, behind one small trait so that a workload is written once and
//! runs on each of them.
//!
//! Owns the adapter from each engine's API to [`Engine`] and each engine's configuration
//! (what its tuning guide says for this job, reported by [`EngineKind::configuration`]);
//! owns no workload, timing or printing. Peers (RocksDB, LMDB, fjall, redb) are one module
//! each behind a cargo feature, so their build cost stays optional.
//!
//! Durability classes, the same for every engine: buffered (nothing synced per operation,
//! everything synced about once per `flush_interval`, by the engine's own timer where it has
//! one, else by a [`Flusher`] thread) or sync (durable before each write returns).
//!
//! Thread-safety: an [`Engine`] is `Send + Sync`; the workload calls it from several
//! threads at once, and each adapter maps that onto its engine's own rules (Tucana
//! serialises writers per keyspace internally).

use std::ops::{Bound, ControlFlow};
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use crate::Result;

#[cfg(feature = "fjall")]
mod fjall;
#[cfg(feature = "lmdb")]
mod lmdb;
#[cfg(test)]
pub mod memory;
#[cfg(feature = "redb")]
mod redb;
#[cfg(feature = "rocksdb")]
mod rocksdb;
mod tucana;

#[cfg(feature = "fjall")]
pub use self::fjall::Fjall;
#[cfg(feature = "lmdb")]
pub use self::lmdb::Lmdb;
#[cfg(feature = "redb")]
pub use self::redb::Redb;
#[cfg(feature = "rocksdb")]
pub use self::rocksdb::RocksDb;
pub use self::tucana::Tucana;

/// How an engine is opened for a run.
#[derive(Clone, Copy, Debug)]
pub struct EngineConfig {
    /// Every write is durable when it returns (fsync or the engine's equivalent); else
    /// writes are buffered and made durable by the engine's own background flushing.
    pub sync_writes: bool,
    /// Let the engine persist its index (commit, checkpoint, flush memtable) on its own
    /// schedule. Off for the recovery benchmark, which must control exactly what the
    /// last durable index covers.
    pub background_commit: bool,
    /// Memory the engine may use for caches of its own (block cache, page cache of its
    /// own); engines that rely on the kernel's page cache ignore it and say so.
    pub cache_bytes: u64,
    /// In buffered mode, how often acknowledged writes are made durable.
    pub flush_interval: Duration,
    /// Background garbage collection (Tucana's log GC). Peers' compaction is how they
    /// reclaim space and always runs, as their guides leave it; they ignore this.
    pub gc: bool,
    /// Space amplification at which background GC works (`None`: the engine's default).
    /// Only engines with [`EngineKind::has_gc_switch`] use it.
    pub gc_space_amp: Option<f64>,
    /// Tucana's `mapping_reservation_bytes` (`None`: its default); runs under valgrind,
    /// which refuses the default 64 GiB of address space, set a smaller one.
    pub mapping_reservation_bytes: Option<u64>,
}

impl Default for EngineConfig {
    fn default() -> EngineConfig {
        EngineConfig {
            sync_writes: false,
            background_commit: true,
            cache_bytes: 256 << 20,
            flush_interval: Duration::from_secs(1),
            gc: true,
            gc_space_amp: None,
            mapping_reservation_bytes: None,
        }
    }
}

/// A kind of engine: knows how to open one in a directory the benchmark owns.
pub trait EngineKind: Sync {
    /// Short lowercase name, the `engine` field of every JSON record.
    fn name(&self) -> &'static str;

    /// Opens (creating if needed) an engine whose files all live under `dir`, which the
    /// benchmark created for it and deletes after the run.
    fn open(&self, dir: &Path, config: &EngineConfig) -> Result<Box<dyn Engine>>;

    /// The settings `open` uses for `config`, with the reason for each where it is a
    /// choice, for the results document.
    fn configuration(&self, config: &EngineConfig) -> serde_json::Value;

    /// Whether [`EngineConfig::gc`] turns this engine's space reclamation off, so that a
    /// run with it and one without can be compared (Tucana; the peers' compaction is part
    /// of how they work and stays on).
    fn has_gc_switch(&self) -> bool {
        false
    }
}

/// A thread that calls `flush` every `interval` until dropped: the once-a-second durability
/// of engines that have no timer of their own. A failed flush is printed, not fatal: the
/// next sync or close reports it to the benchmark.
#[cfg_attr(
    not(any(
        feature = "rocksdb",
        feature = "lmdb",
        feature = "redb",
        feature = "fjall"
    )),
    allow(dead_code)
)]
pub struct Flusher {
    interval: Duration,
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[cfg_attr(
    not(any(
        feature = "rocksdb",
        feature = "lmdb",
        feature = "redb",
        feature = "fjall"
    )),
    allow(dead_code)
)]
impl Flusher {
    pub fn start(
        name: &str,
        interval: Duration,
        flush: impl Fn() -> Result<()> + Send + 'static,
    ) -> Flusher {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(format!("{name}-flusher"))
            .spawn(move || {
                // Disconnection (the sender dropped) is the stop signal.
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
                    if let Err(error) = flush() {
                        eprintln!("background flush failed: {error}");
                    }
                }
            })
            .expect("spawning a thread");
        Flusher {
            interval,
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

#[cfg_attr(not(feature = "redb"), allow(dead_code))]
impl Flusher {
    /// How often it flushes.
    pub fn interval(&self) -> Duration {
        self.interval
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Called with each `(key, value)` of a scan; `Break` ends the scan.
pub type Visit<'a> = dyn FnMut(&[u8], &[u8]) -> ControlFlow<()> + 'a;

/// Scan direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Forward,
    Reverse,
}

/// What an engine says about its memory and log; `None` where it has no such notion.
#[derive(Clone, Debug, Default)]
pub struct Footprint {
    pub keys: Option<u64>,
    /// Heap bytes of the index.
    pub index_bytes: Option<u64>,
    /// Log bytes still referenced by the index.
    pub live_log_bytes: Option<u64>,
    /// Log bytes of overwritten or deleted records not yet reclaimed.
    pub dead_log_bytes: Option<u64>,
    /// Bytes the log's segments take (live, dead and not yet reclaimed).
    pub log_size_bytes: Option<u64>,
    /// Bytes the engine's own allocator has handed out in its files (log, index, metadata).
    pub allocated_bytes: Option<u64>,
    /// Garbage collection passes that did something since open.
    pub gc_passes: Option<u64>,
    /// Bytes of live records garbage collection copied since open.
    pub gc_relocated_bytes: Option<u64>,
    /// Bytes of log segments garbage collection handed back since open.
    pub gc_reclaimed_bytes: Option<u64>,
    /// Nanoseconds writers slept because garbage collection fell behind (write pacing).
    pub gc_paced_ns: Option<u64>,
    /// Durable commits of the engine's index since open.
    pub commits: Option<u64>,
    /// Syncs of the engine's files since open (Tucana: `Stats::syncs`, one per group
    /// commit's `fdatasync`).
    pub syncs: Option<u64>,
}

/// One open engine with one key space (table, keyspace, database) for the benchmark.
pub trait Engine: Send + Sync {
    fn put(&self, key: &[u8], value: &[u8]) -> Result<()>;

    /// Writes all `pairs` with the engine's own batch (one transaction, one write batch)
    /// where it has one; durability as for `put`. Used by bulk loads.
    fn put_batch(&self, pairs: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
        for (key, value) in pairs {
            self.put(key, value)?;
        }
        Ok(())
    }

    /// Looks `key` up and calls `check` with its value, in place where the engine allows;
    /// returns `Ok(None)` when the key is absent, else what `check` returned.
    fn get(&self, key: &[u8], check: &mut dyn FnMut(&[u8]) -> bool) -> Result<Option<bool>>;

    /// Removes `key`; returns whether it was present.
    fn delete(&self, key: &[u8]) -> Result<bool>;

    /// Visits the pairs with `lower <= key < upper` in `direction` order until `visit`
    /// breaks or the range ends.
    fn scan(
        &self,
        lower: Bound<&[u8]>,
        upper: Bound<&[u8]>,
        direction: Direction,
        visit: &mut Visit<'_>,
    ) -> Result<()>;

    /// `scan` for a caller that takes at most `limit` pairs, as YCSB's own scan passes
    /// its record count to the database binding: an engine whose iterators read ahead
    /// may stop there (Tucana's `Range::limit`); by default the count is not used.
    fn scan_at_most(
        &self,
        lower: Bound<&[u8]>,
        upper: Bound<&[u8]>,
        direction: Direction,
        limit: usize,
        visit: &mut Visit<'_>,
    ) -> Result<()> {
        let _ = limit;
        self.scan(lower, upper, direction, visit)
    }

    /// Makes every write acknowledged so far durable.
    fn sync(&self) -> Result<()>;

    /// Persists the index so that reopening does not replay the writes made so far.
    fn commit(&self) -> Result<()>;

    fn footprint(&self) -> Footprint;

    /// Does what the engine's documentation says gives the space of deleted and
    /// overwritten data back (a forced GC, a full compaction), and returns what that was,
    /// for the results. `&mut`: some engines need exclusive access; the caller holds the
    /// only handle, so no workload runs meanwhile. Default: nothing to do.
    fn reclaim_space(&mut self) -> Result<&'static str> {
        Ok("nothing: the engine has no call that gives space back")
    }

    /// Closes cleanly (the engine's normal shutdown).
    fn close(self: Box<Self>) -> Result<()>;

    /// Drops the engine as a process crash would: nothing more is flushed, synced or
    /// committed, but the files may be reopened by this process.
    fn abandon(self: Box<Self>);
}
