//! RocksDB behind the [`Engine`] trait (feature `rocksdb`): one database, default column
//! family, configured as RocksDB's own documentation advises for a point-lookup-and-scan
//! store whose data may exceed memory.
//!
//! Configuration, and where each setting comes from:
//! - an LRU block cache of the benchmark's cache budget that also holds the index and
//!   filter blocks (`cache_index_and_filter_blocks`, so the budget is the whole cache),
//!   10-bit bloom filters, L0's filter and index blocks pinned, `bytes_per_sync` 1 MiB,
//!   `max_background_jobs` = cores: the RocksDB wiki's "Setup Options and Basic Tuning";
//! - partitioned index and filters (`kTwoLevelIndexSearch`, `partition_filters`,
//!   `metadata_block_size` 4 KiB, the top-level index pinned, index and filter blocks at
//!   high priority in the cache): the wiki's "Partitioned Index/Filters", whose case is
//!   exactly a data set larger than memory where index and filter blocks compete with data
//!   blocks for the cache;
//! - `optimize_level_style_compaction(budget)` (the `rocksdb` crate's docs: the starting
//!   point for tuning heavy workloads and big data sets; it sizes the memtables so that
//!   they stay within `budget`), with `budget` half the cache budget so that block cache
//!   and memtables fit the larger-than-memory set's cgroup beside the page cache; dynamic
//!   level sizes (the library's default since 8.x, set explicitly);
//! - no compression at any level (the benchmark's values are random bytes; compressing
//!   them only costs CPU; the crate is built without compression libraries);
//! - the table format version is the library's default.
//!
//! Durability: buffered is the WAL without sync plus `flush_wal(sync)` once per flush
//! interval from a [`Flusher`]; sync is `WriteOptions::set_sync(true)` per write, with
//! `enable_pipelined_write` (the wiki's "Pipelined Write": the next group writes its WAL
//! while the current one applies to the memtable; RocksDB groups concurrent writers into
//! one WAL sync).
//!
//! Which RocksDB: the sources bundled in librocksdb-sys; build.rs records their version in
//! `TUCANA_BENCH_ROCKSDB_LIBRARY`, and the crates' versions from Cargo.lock.
//!
//! Thread-safety: `rocksdb::DB` is `Send + Sync`; reads and writes from any thread.

use std::ops::{Bound, ControlFlow};
use std::path::Path;
use std::sync::Arc;

use rocksdb::{
    BlockBasedIndexType, BlockBasedOptions, Cache, DBCompressionType, Options, WriteOptions, DB,
};

use super::{Direction, Engine, EngineConfig, EngineKind, Flusher, Footprint, Visit};
use crate::Result;

pub struct RocksDb;

/// Levels of the LSM tree (RocksDB's default `num_levels`), for the per-level compression.
const LEVELS: usize = 7;

/// Bytes per partition of the index and the filters (the Partitioned Index/Filters wiki's
/// `metadata_block_size`).
const METADATA_BLOCK_BYTES: usize = 4096;

fn cores() -> i32 {
    std::thread::available_parallelism().map_or(2, |n| n.get() as i32)
}

/// The memtable budget given to `optimize_level_style_compaction`: half the cache budget.
fn memtable_budget_bytes(config: &EngineConfig) -> u64 {
    config.cache_bytes / 2
}

impl EngineKind for RocksDb {
    fn name(&self) -> &'static str {
        "rocksdb"
    }

    fn configuration(&self, config: &EngineConfig) -> serde_json::Value {
        serde_json::json!({
            "crate": format!("rocksdb {} (librocksdb-sys {})", env!("TUCANA_BENCH_ROCKSDB_VERSION"), env!("TUCANA_BENCH_LIBROCKSDB_SYS_VERSION")),
            "library": env!("TUCANA_BENCH_ROCKSDB_LIBRARY"),
            "block_cache_bytes": config.cache_bytes,
            "cache_index_and_filter_blocks": "true, with high priority (wiki: Setup Options and Basic Tuning; Partitioned Index/Filters)",
            "pin_l0_filter_and_index_blocks_in_cache": true,
            "bloom_filter_bits_per_key": 10,
            "index": format!("partitioned (kTwoLevelIndexSearch), partition_filters, metadata_block_size {METADATA_BLOCK_BYTES} B, pin_top_level_index_and_filter (wiki: Partitioned Index/Filters)"),
            "optimize_level_style_compaction": format!("memtable budget {} B (half the cache budget; the crate's docs: the starting point for big data sets)", memtable_budget_bytes(config)),
            "format_version": "library default",
            "level_compaction_dynamic_level_bytes": true,
            "max_background_jobs": cores(),
            "bytes_per_sync": 1 << 20,
            "compression": "none at every level (values are incompressible random bytes)",
            "wal": true,
            "durability": if config.sync_writes {
                "WriteOptions::set_sync(true) per write; enable_pipelined_write (wiki: Pipelined Write)".to_string()
            } else {
                format!("WAL unsynced; flush_wal(sync=true) every {} ms", config.flush_interval.as_millis())
            },
        })
    }

    fn open(&self, dir: &Path, config: &EngineConfig) -> Result<Box<dyn Engine>> {
        let mut table = BlockBasedOptions::default();
        let cache = Cache::new_lru_cache(usize::try_from(config.cache_bytes)?);
        table.set_block_cache(&cache);
        table.set_bloom_filter(10.0, false);
        table.set_cache_index_and_filter_blocks(true);
        table.set_cache_index_and_filter_blocks_with_high_priority(true);
        table.set_pin_l0_filter_and_index_blocks_in_cache(true);
        table.set_index_type(BlockBasedIndexType::TwoLevelIndexSearch);
        table.set_partition_filters(true);
        table.set_metadata_block_size(METADATA_BLOCK_BYTES);
        table.set_pin_top_level_index_and_filter(true);

        let mut options = Options::default();
        options.create_if_missing(true);
        options.set_block_based_table_factory(&table);
        options.optimize_level_style_compaction(usize::try_from(memtable_budget_bytes(config))?);
        options.set_level_compaction_dynamic_level_bytes(true);
        options.increase_parallelism(cores());
        options.set_max_background_jobs(cores());
        options.set_bytes_per_sync(1 << 20);
        // After optimize_level_style_compaction, which fills in a per-level list.
        options.set_compression_type(DBCompressionType::None);
        options.set_compression_per_level(&[DBCompressionType::None; LEVELS]);
        options.set_enable_pipelined_write(config.sync_writes);
        if !config.background_commit {
            // Keep everything since the last explicit flush in the WAL, for recovery runs.
            options.set_write_buffer_size(1 << 30);
        }
        let db = Arc::new(DB::open(&options, dir)?);

        let mut write_options = WriteOptions::default();
        write_options.set_sync(config.sync_writes);
        let flusher = (!config.sync_writes).then(|| {
            let db = Arc::clone(&db);
            Flusher::start("rocksdb", config.flush_interval, move || {
                Ok(db.flush_wal(true)?)
            })
        });
        Ok(Box::new(RocksDbEngine {
            flusher,
            db,
            write_options,
            _cache: cache,
        }))
    }
}

struct RocksDbEngine {
    // Declared first so that it stops before the database closes.
    flusher: Option<Flusher>,
    db: Arc<DB>,
    write_options: WriteOptions,
    _cache: Cache,
}

impl Engine for RocksDbEngine {
    fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        Ok(self.db.put_opt(key, value, &self.write_options)?)
    }

    fn put_batch(&self, pairs: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
        let mut batch = rocksdb::WriteBatch::default();
        for (key, value) in pairs {
            batch.put(key, value);
        }
        Ok(self.db.write_opt(batch, &self.write_options)?)
    }

    fn get(&self, key: &[u8], check: &mut dyn FnMut(&[u8]) -> bool) -> Result<Option<bool>> {
        Ok(self.db.get_pinned(key)?.map(|value| check(&value)))
    }

    fn delete(&self, key: &[u8]) -> Result<bool> {
        // RocksDB deletes blindly; the trait promises presence, which costs a lookup.
        let present = self.db.get_pinned(key)?.is_some();
        self.db.delete_opt(key, &self.write_options)?;
        Ok(present)
    }

    fn scan(
        &self,
        lower: Bound<&[u8]>,
        upper: Bound<&[u8]>,
        direction: Direction,
        visit: &mut Visit<'_>,
    ) -> Result<()> {
        let mut iter = self.db.raw_iterator();
        match direction {
            Direction::Forward => match lower {
                Bound::Unbounded => iter.seek_to_first(),
                Bound::Included(key) | Bound::Excluded(key) => iter.seek(key),
            },
            Direction::Reverse => match upper {
                Bound::Unbounded => iter.seek_to_last(),
                Bound::Included(key) | Bound::Excluded(key) => iter.seek_for_prev(key),
            },
        }
        while iter.valid() {
            let (Some(key), Some(value)) = (iter.key(), iter.value()) else {
                break;
            };
            let below_upper = match upper {
                Bound::Unbounded => true,
                Bound::Included(u) => key <= u,
                Bound::Excluded(u) => key < u,
            };
            let above_lower = match lower {
                Bound::Unbounded => true,
                Bound::Included(l) => key >= l,
                Bound::Excluded(l) => key > l,
            };
            match direction {
                Direction::Forward if !below_upper => break,
                Direction::Reverse if !above_lower => break,
                // seek lands on the bound itself when it is excluded: skip it.
                _ if !(below_upper && above_lower) => {}
                _ => {
                    if let ControlFlow::Break(()) = visit(key, value) {
                        break;
                    }
                }
            }
            match direction {
                Direction::Forward => iter.next(),
                Direction::Reverse => iter.prev(),
            }
        }
        Ok(iter.status()?)
    }

    fn sync(&self) -> Result<()> {
        Ok(self.db.flush_wal(true)?)
    }

    fn commit(&self) -> Result<()> {
        // The equivalent of persisting the index: memtables to SST files.
        Ok(self.db.flush()?)
    }

    fn footprint(&self) -> Footprint {
        // RocksDB only estimates its key count; an estimate would fail the exact check.
        Footprint::default()
    }

    fn reclaim_space(&mut self) -> Result<&'static str> {
        // The memtable's tombstones first, then every level down to the bottom one, which
        // RocksDB skips by default when there is no compaction filter.
        self.db.flush()?;
        let mut options = rocksdb::CompactOptions::default();
        options.set_bottommost_level_compaction(rocksdb::BottommostLevelCompaction::Force);
        self.db
            .compact_range_opt::<&[u8], &[u8]>(None, None, &options);
        Ok("flush, then compact_range over the whole key space (bottommost level forced)")
    }

    fn close(self: Box<Self>) -> Result<()> {
        let RocksDbEngine { flusher, db, .. } = *self;
        drop(flusher);
        db.flush_wal(true)?;
        drop(db);
        Ok(())
    }

    fn abandon(self: Box<Self>) {
        // Closing RocksDB without a WAL sync is as close to a crash as its API allows.
        drop(self);
    }
}
