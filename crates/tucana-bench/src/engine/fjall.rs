//! fjall behind the [`Engine`] trait (feature `fjall`): one database, one keyspace (fjall
//! 3's names; fjall 2 called them keyspace and partition).
//!
//! Configuration, and where each setting comes from (fjall 3.x docs on docs.rs and its
//! README):
//! - block cache = the benchmark's cache budget: `DatabaseBuilder::cache_size` ("the one
//!   knob" for reads; the README recommends 20–25% of memory, which is what the
//!   larger-than-memory set's 256 MiB of 1 GiB is);
//! - key-value separation (`KeyspaceCreateOptions::with_kv_separation`), the README's
//!   feature "for large blob use cases", with the separation threshold at 512 B instead of
//!   the default 1 KiB: the larger-than-memory and GC data sets' records are 10 × 100 B =
//!   1000 B, which the default would keep inline by 24 bytes; the 100 B values of the
//!   in-memory set stay inline either way. Blob files uncompressed;
//! - no compression of data and index blocks, nor of blobs (the benchmark's values are
//!   random bytes; compressing them only costs CPU);
//! - everything else fjall's defaults: 64 MiB memtables, leveled compaction, bloom filters,
//!   worker threads = min(cores, 4).
//!
//! Durability: fjall 3 writes each operation to OS buffers (its default, "matches
//! RocksDB's default durability") and has no fsync timer of its own any more (fjall 2's
//! `fsync_ms` is gone), so buffered durability is `persist(SyncAll)` once per flush
//! interval from a [`Flusher`]; sync durability is `persist(SyncAll)` after each write.
//!
//! Thread-safety: `Database` and `Keyspace` are `Send + Sync` and cheap to share.

use std::ops::{Bound, ControlFlow};
use std::path::Path;

use fjall::config::CompressionPolicy;
use fjall::{
    CompressionType, Database, Keyspace, KeyspaceCreateOptions, KvSeparationOptions, PersistMode,
};

use super::{Direction, Engine, EngineConfig, EngineKind, Flusher, Footprint, Visit};
use crate::Result;

pub struct Fjall;

/// Values at least this long go to blob files (key-value separation): below the 1000 B
/// records of the larger-than-memory set, above the 100 B values of the in-memory one.
const SEPARATION_THRESHOLD_BYTES: u32 = 512;

fn keyspace_options() -> KeyspaceCreateOptions {
    KeyspaceCreateOptions::default()
        .data_block_compression_policy(CompressionPolicy::disabled())
        .index_block_compression_policy(CompressionPolicy::disabled())
        .with_kv_separation(Some(
            KvSeparationOptions::default()
                .separation_threshold(SEPARATION_THRESHOLD_BYTES)
                .compression(CompressionType::None),
        ))
}

impl EngineKind for Fjall {
    fn name(&self) -> &'static str {
        "fjall"
    }

    fn configuration(&self, config: &EngineConfig) -> serde_json::Value {
        serde_json::json!({
            "crate": format!("fjall {} (lsm-tree {})", env!("TUCANA_BENCH_FJALL_VERSION"), env!("TUCANA_BENCH_LSM_TREE_VERSION")),
            "cache_size_bytes": config.cache_bytes,
            "kv_separation": format!("on, separation_threshold {SEPARATION_THRESHOLD_BYTES} B (default 1 KiB; the 1000 B records would stay inline), blobs uncompressed (fjall README: key-value separation for large values)"),
            "compression": "none for data and index blocks (values are incompressible random bytes)",
            "bloom_filters": "default filter policy",
            "max_memtable_size": "64 MiB (default)",
            "compaction": "leveled (default)",
            "durability": if config.sync_writes {
                "persist(PersistMode::SyncAll) after each write".to_string()
            } else {
                format!("writes to OS buffers (default); persist(SyncAll) every {} ms", config.flush_interval.as_millis())
            },
        })
    }

    fn open(&self, dir: &Path, config: &EngineConfig) -> Result<Box<dyn Engine>> {
        let db = Database::builder(dir)
            .cache_size(config.cache_bytes)
            .open()?;
        let keyspace = db.keyspace("bench", keyspace_options)?;
        let flusher = (!config.sync_writes).then(|| {
            let db = db.clone();
            Flusher::start("fjall", config.flush_interval, move || {
                Ok(db.persist(PersistMode::SyncAll)?)
            })
        });
        Ok(Box::new(FjallEngine {
            flusher,
            db,
            keyspace,
            sync_writes: config.sync_writes,
        }))
    }
}

struct FjallEngine {
    // Declared first so that it stops before the database closes.
    flusher: Option<Flusher>,
    db: Database,
    keyspace: Keyspace,
    sync_writes: bool,
}

impl FjallEngine {
    fn after_write(&self) -> Result<()> {
        if self.sync_writes {
            self.db.persist(PersistMode::SyncAll)?;
        }
        Ok(())
    }
}

impl Engine for FjallEngine {
    fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.keyspace.insert(key, value)?;
        self.after_write()
    }

    fn put_batch(&self, pairs: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
        let mut batch = self.db.batch();
        for (key, value) in pairs {
            batch.insert(&self.keyspace, key.as_slice(), value.as_slice());
        }
        batch.commit()?;
        self.after_write()
    }

    fn get(&self, key: &[u8], check: &mut dyn FnMut(&[u8]) -> bool) -> Result<Option<bool>> {
        Ok(self.keyspace.get(key)?.map(|value| check(&value)))
    }

    fn delete(&self, key: &[u8]) -> Result<bool> {
        // fjall removes blindly; the trait promises presence, which costs a lookup.
        let present = self.keyspace.contains_key(key)?;
        self.keyspace.remove(key)?;
        self.after_write()?;
        Ok(present)
    }

    fn scan(
        &self,
        lower: Bound<&[u8]>,
        upper: Bound<&[u8]>,
        direction: Direction,
        visit: &mut Visit<'_>,
    ) -> Result<()> {
        let range = self.keyspace.range::<&[u8], _>((lower, upper));
        match direction {
            Direction::Forward => {
                for item in range {
                    let (key, value) = item.into_inner()?;
                    if let ControlFlow::Break(()) = visit(&key, &value) {
                        break;
                    }
                }
            }
            Direction::Reverse => {
                for item in range.rev() {
                    let (key, value) = item.into_inner()?;
                    if let ControlFlow::Break(()) = visit(&key, &value) {
                        break;
                    }
                }
            }
        }
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        Ok(self.db.persist(PersistMode::SyncAll)?)
    }

    fn commit(&self) -> Result<()> {
        // The equivalent of persisting the index: the memtable to a segment.
        self.keyspace.rotate_memtable_and_wait()?;
        Ok(self.db.persist(PersistMode::SyncAll)?)
    }

    fn footprint(&self) -> Footprint {
        Footprint::default()
    }

    fn reclaim_space(&mut self) -> Result<&'static str> {
        // The memtable's tombstones to a segment, then every segment merged, which drops
        // the tombstones and what they shadow.
        self.keyspace.rotate_memtable_and_wait()?;
        self.keyspace.major_compact()?;
        self.db.persist(PersistMode::SyncAll)?;
        Ok("rotate_memtable_and_wait, then major_compact")
    }

    fn close(self: Box<Self>) -> Result<()> {
        let FjallEngine { flusher, db, .. } = *self;
        drop(flusher);
        db.persist(PersistMode::SyncAll)?;
        Ok(())
    }

    fn abandon(self: Box<Self>) {
        drop(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The adapter claims key-value separation for the 1000 B records of the
    /// larger-than-memory set and inline values for the 100 B ones of the in-memory set;
    /// fjall's default threshold (1 KiB) would have kept both inline. After a memtable
    /// flush, the large values must sit in blob files and the small ones must not.
    #[test]
    fn large_values_go_to_blob_files_and_small_ones_stay_inline() {
        let config = EngineConfig::default();
        for (value_bytes, separated) in [(100usize, false), (1000, true)] {
            let dir = tempfile::tempdir().expect("temporary directory");
            let db = Database::builder(dir.path())
                .cache_size(config.cache_bytes)
                .open()
                .expect("open");
            let keyspace = db.keyspace("bench", keyspace_options).expect("keyspace");
            assert!(keyspace.is_kv_separated());
            for i in 0u32..100 {
                keyspace
                    .insert(i.to_be_bytes(), vec![i as u8; value_bytes])
                    .expect("insert");
            }
            keyspace.rotate_memtable_and_wait().expect("flush");
            assert_eq!(
                keyspace.blob_file_count() > 0,
                separated,
                "{value_bytes} B values"
            );
            let value = keyspace.get(7u32.to_be_bytes()).expect("get");
            assert_eq!(value.as_deref(), Some(&vec![7u8; value_bytes][..]));
        }
    }
}
