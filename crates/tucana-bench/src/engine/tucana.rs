//! Tucana behind the [`Engine`] trait: one volume file, one keyspace.

use std::ops::Bound;
use std::path::Path;

use tucana::{Database, DeferredUpdates, Durability, Keyspace};

use super::{Direction, Engine, EngineConfig, EngineKind, Footprint, Visit};
use crate::Result;

/// File name of the volume inside the engine's directory.
const VOLUME_FILE: &str = "bench.tucana";

/// Name of the keyspace every workload uses.
const KEYSPACE: &str = "bench";

pub struct Tucana;

impl EngineKind for Tucana {
    fn name(&self) -> &'static str {
        "tucana"
    }

    fn configuration(&self, config: &EngineConfig) -> serde_json::Value {
        let options = options(config);
        serde_json::json!({
            "version": env!("CARGO_PKG_VERSION"),
            "durability": if config.sync_writes { "Durability::Sync per write" } else { "Durability::Buffered" },
            "flush_interval_ms": options.flush_interval.map(|d| d.as_millis() as u64),
            "commit_interval_ms": options.commit_interval.map(|d| d.as_millis() as u64),
            "commit_dirty_bytes": options.commit_dirty_bytes,
            "log_segment_bytes": options.log_segment_bytes,
            "gc": if options.gc { "background GC on" } else { "background GC off" },
            "gc_space_amp": options.gc_space_amp,
            "gc_rate_bytes_per_sec": options.gc_rate_bytes_per_sec,
            "scan_prefetch_entries": options.scan_prefetch_entries,
            "cold_reads_copied": options.cold_reads_copied,
            "deferred_updates": format!("{:?}", options.deferred_updates),
            "cache": "none of its own: the index is in memory, values are read through the page cache",
        })
    }

    fn open(&self, dir: &Path, config: &EngineConfig) -> Result<Box<dyn Engine>> {
        let db = options(config).open(dir.join(VOLUME_FILE))?;
        let keyspace = db.keyspace(KEYSPACE)?;
        let durability = if config.sync_writes {
            Durability::Sync
        } else {
            Durability::Buffered
        };
        Ok(Box::new(TucanaEngine {
            db,
            keyspace,
            durability,
            // TUCANA_BENCH_SCAN_LIMIT=0: scans do not tell the range their count (the
            // side-by-side run of `Range::limit`, DESIGN.md "Prefetch").
            scan_limit: std::env::var("TUCANA_BENCH_SCAN_LIMIT").as_deref() != Ok("0"),
        }))
    }

    fn has_gc_switch(&self) -> bool {
        true
    }
}

/// The builder for `config`: the engine's defaults but the benchmark's flush interval and
/// GC settings.
fn options(config: &EngineConfig) -> tucana::Options {
    let mut options = Database::builder()
        .flush_interval(Some(config.flush_interval))
        .gc(config.gc);
    if let Some(target) = config.gc_space_amp {
        options = options.gc_space_amp(target);
    }
    if let Some(bytes) = config.mapping_reservation_bytes {
        options = options.mapping_reservation_bytes(bytes);
    }
    // Side-by-side runs of the write path (DESIGN.md, "Writes in flight"):
    // TUCANA_BENCH_WRITES_IN_FLIGHT=0 is the synchronous path, N segments per member else.
    // Experiments on the read path (DESIGN.md, "What a larger-than-memory read costs"):
    // the same binary with records always read through the mapping, or another scan
    // prefetch window.
    // TUCANA_BENCH_DEFERRED_UPDATES=when-cold|always|off: `Options::deferred_updates`.
    match std::env::var("TUCANA_BENCH_DEFERRED_UPDATES").as_deref() {
        Ok("when-cold") => options = options.deferred_updates(DeferredUpdates::WhenCold),
        Ok("always") => options = options.deferred_updates(DeferredUpdates::Always),
        Ok("off") => options = options.deferred_updates(DeferredUpdates::Off),
        _ => {}
    }
    // TUCANA_BENCH_REORGANISE_SCANNED=0: `Options::reorganise_scanned` off.
    if std::env::var("TUCANA_BENCH_REORGANISE_SCANNED").as_deref() == Ok("0") {
        options = options.reorganise_scanned(false);
    }
    if std::env::var("TUCANA_BENCH_COLD_READS_COPIED").as_deref() == Ok("0") {
        options = options.cold_reads_copied(false);
    }
    if let Some(entries) = std::env::var("TUCANA_BENCH_SCAN_PREFETCH_ENTRIES")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        options = options.scan_prefetch_entries(entries);
    }
    if let Some(segments) = std::env::var("TUCANA_BENCH_WRITES_IN_FLIGHT")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        options = options.writes_in_flight_segments(segments);
    }
    // TUCANA_BENCH_WRITES_IN_FLIGHT_DEPTH=D: D segment writes running at once per member.
    if let Some(depth) = std::env::var("TUCANA_BENCH_WRITES_IN_FLIGHT_DEPTH")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        options = options.writes_in_flight_depth(depth);
    }
    if !config.background_commit {
        // Only explicit `commit()` calls persist the index; the log tail since then is
        // what recovery replays.
        options = options.commit_interval(None).commit_dirty_bytes(u64::MAX);
    }
    options
}

struct TucanaEngine {
    db: Database,
    keyspace: Keyspace,
    durability: Durability,
    /// Whether `scan_at_most` passes its count to the range (`Range::limit`).
    scan_limit: bool,
}

impl TucanaEngine {
    /// The database handle alone. The keyspace handle may keep the database alive, so it
    /// must be gone before `close` or `abandon`, which expect to hold the last handle.
    fn into_database(self) -> Database {
        // Moving `db` out drops the other fields, the keyspace among them, right here.
        self.db
    }
}

impl Engine for TucanaEngine {
    fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        Ok(self.keyspace.put_with(key, value, self.durability)?)
    }

    fn put_batch(&self, pairs: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
        let mut batch = self.keyspace.batch();
        for (key, value) in pairs {
            batch.put(key, value);
        }
        Ok(batch.commit_with(self.durability)?)
    }

    fn get(&self, key: &[u8], check: &mut dyn FnMut(&[u8]) -> bool) -> Result<Option<bool>> {
        Ok(self.keyspace.get_with(key, check)?)
    }

    fn delete(&self, key: &[u8]) -> Result<bool> {
        Ok(self.keyspace.delete_with(key, self.durability)?)
    }

    fn scan(
        &self,
        lower: Bound<&[u8]>,
        upper: Bound<&[u8]>,
        direction: Direction,
        visit: &mut Visit<'_>,
    ) -> Result<()> {
        let range = self.keyspace.range::<&[u8], _>((lower, upper));
        visit_range(range, direction, visit)
    }

    fn scan_at_most(
        &self,
        lower: Bound<&[u8]>,
        upper: Bound<&[u8]>,
        direction: Direction,
        limit: usize,
        visit: &mut Visit<'_>,
    ) -> Result<()> {
        let range = self.keyspace.range::<&[u8], _>((lower, upper));
        let range = if self.scan_limit {
            range.limit(limit)
        } else {
            range
        };
        visit_range(range, direction, visit)
    }

    fn sync(&self) -> Result<()> {
        Ok(self.db.sync()?)
    }

    fn commit(&self) -> Result<()> {
        Ok(self.db.commit()?)
    }

    fn footprint(&self) -> Footprint {
        let stats = self.db.stats();
        Footprint {
            keys: Some(stats.keys),
            index_bytes: Some(stats.index_bytes),
            live_log_bytes: Some(stats.live_log_bytes),
            dead_log_bytes: Some(stats.dead_log_bytes),
            log_size_bytes: Some(stats.log_size_bytes),
            allocated_bytes: Some(stats.allocated_bytes),
            gc_passes: Some(stats.gc_passes),
            gc_relocated_bytes: Some(stats.gc_relocated_bytes),
            gc_reclaimed_bytes: Some(stats.gc_reclaimed_bytes),
            gc_paced_ns: Some(stats.gc_paced_ns),
            commits: Some(stats.commits),
            syncs: Some(stats.syncs),
        }
    }

    fn reclaim_space(&mut self) -> Result<&'static str> {
        // A full pass: relocates, commits until the emptied segments are free and punches
        // them out of the file.
        self.db.gc()?;
        Ok("Database::gc() (a forced full GC pass)")
    }

    fn close(self: Box<Self>) -> Result<()> {
        // A debugging aid, off by default: the engine's counters (index splits and the
        // keys they read, GC, prefetch) at the end of each run, on stderr.
        if std::env::var_os("TUCANA_BENCH_PRINT_STATS").is_some() {
            eprintln!("tucana stats at close: {}", self.db.stats().to_json());
        }
        Ok((*self).into_database().close()?)
    }

    fn abandon(self: Box<Self>) {
        (*self).into_database().abandon();
    }
}

/// Lends `range`'s pairs to `visit` in `direction` order until it breaks or the range
/// ends: in place (`Range::next_with`), as LMDB's cursor lends its page's bytes, since the
/// owned pairs of `Iterator::next` would be two allocations per item that only this
/// adapter, not the engine's caller, asked for.
fn visit_range(
    mut range: tucana::Range,
    direction: Direction,
    visit: &mut Visit<'_>,
) -> Result<()> {
    loop {
        let step = match direction {
            Direction::Forward => range.next_with(|key, value| visit(key, value)),
            Direction::Reverse => range.next_back_with(|key, value| visit(key, value)),
        };
        match step {
            None => return Ok(()),
            Some(flow) => {
                if flow?.is_break() {
                    return Ok(());
                }
            }
        }
    }
}
