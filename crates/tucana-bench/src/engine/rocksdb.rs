//! RocksDB behind the [`Engine`] trait (feature `rocksdb`): one database, default column
//! family, configured as RocksDB's tuning guide advises for a point-lookup-and-scan store
//! of this size.
//!
//! Configuration, and why: an LRU block cache of the benchmark's cache budget holding index
//! and filter blocks too (so the budget is the whole cache), 10-bit bloom filters (the
//! guide's default for point lookups), dynamic level sizes, `bytes_per_sync` 1 MiB
//! (smooth writeback), as many background jobs as cores, no compression (the benchmark's
//! values are random bytes; compressing them only costs CPU). Buffered durability is the
//! WAL without sync plus `flush_wal(sync)` once per flush interval from a [`Flusher`];
//! sync durability is `WriteOptions::set_sync(true)` per write (RocksDB groups concurrent
//! writers into one WAL sync).
//!
//! Which RocksDB: built against the system library when `ROCKSDB_LIB_DIR` was set at build
//! time (build.rs records it in `TUCANA_BENCH_ROCKSDB_LINK`), else the bundled sources.
//!
//! Thread-safety: `rocksdb::DB` is `Send + Sync`; reads and writes from any thread.

use std::ops::{Bound, ControlFlow};
use std::path::Path;
use std::sync::Arc;

use rocksdb::{BlockBasedOptions, Cache, DBCompressionType, Options, WriteOptions, DB};

use super::{Direction, Engine, EngineConfig, EngineKind, Flusher, Footprint, Visit};
use crate::Result;

pub struct RocksDb;

fn cores() -> i32 {
    std::thread::available_parallelism().map_or(2, |n| n.get() as i32)
}

impl EngineKind for RocksDb {
    fn name(&self) -> &'static str {
        "rocksdb"
    }

    fn configuration(&self, config: &EngineConfig) -> serde_json::Value {
        serde_json::json!({
            "crate": "rocksdb 0.20.1",
            "library": env!("TUCANA_BENCH_ROCKSDB_LINK"),
            "block_cache_bytes": config.cache_bytes,
            "cache_index_and_filter_blocks": true,
            "pin_l0_filter_and_index_blocks_in_cache": true,
            "bloom_filter_bits_per_key": 10,
            "format_version": 5,
            "level_compaction_dynamic_level_bytes": true,
            "max_background_jobs": cores(),
            "bytes_per_sync": 1 << 20,
            "compression": "none (values are incompressible random bytes)",
            "write_buffer_size": "64 MiB (default)",
            "wal": true,
            "durability": if config.sync_writes {
                "WriteOptions::set_sync(true) per write".to_string()
            } else {
                format!("WAL unsynced; flush_wal(sync=true) every {} ms", config.flush_interval.as_millis())
            },
        })
    }

    fn open(&self, dir: &Path, config: &EngineConfig) -> Result<Box<dyn Engine>> {
        let mut table = BlockBasedOptions::default();
        let cache = Cache::new_lru_cache(usize::try_from(config.cache_bytes)?)?;
        table.set_block_cache(&cache);
        table.set_bloom_filter(10.0, false);
        table.set_cache_index_and_filter_blocks(true);
        table.set_pin_l0_filter_and_index_blocks_in_cache(true);
        table.set_format_version(5);

        let mut options = Options::default();
        options.create_if_missing(true);
        options.set_block_based_table_factory(&table);
        options.set_level_compaction_dynamic_level_bytes(true);
        options.set_max_background_jobs(cores());
        options.increase_parallelism(cores());
        options.set_bytes_per_sync(1 << 20);
        options.set_compression_type(DBCompressionType::None);
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
