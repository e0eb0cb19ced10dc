//! fjall behind the [`Engine`] trait (feature `fjall`): one keyspace, one partition.
//!
//! Configuration, and why: the block cache set to the benchmark's cache budget (fjall's
//! guide: the one knob that matters for reads), default 10-bit bloom filters and 16 MiB
//! memtables, no compression (the values are random bytes). Buffered durability is
//! fjall's own fsync thread (`fsync_ms` = the flush interval) with journal writes that are
//! not persisted per operation; sync durability is `persist(SyncAll)` after each write.
//!
//! Thread-safety: `Keyspace` and `PartitionHandle` are `Send + Sync` and cheap to share.

use std::ops::{Bound, ControlFlow};
use std::path::Path;

use fjall::{CompressionType, Keyspace, PartitionCreateOptions, PartitionHandle, PersistMode};

use super::{Direction, Engine, EngineConfig, EngineKind, Footprint, Visit};
use crate::Result;

pub struct Fjall;

fn fsync_ms(config: &EngineConfig) -> u16 {
    u16::try_from(config.flush_interval.as_millis())
        .unwrap_or(u16::MAX)
        .max(1)
}

impl EngineKind for Fjall {
    fn name(&self) -> &'static str {
        "fjall"
    }

    fn configuration(&self, config: &EngineConfig) -> serde_json::Value {
        serde_json::json!({
            "crate": "fjall 2.11",
            "cache_size_bytes": config.cache_bytes,
            "bloom_filter_bits_per_key": "10 (default)",
            "max_memtable_size": "16 MiB (default)",
            "compression": "none (values are incompressible random bytes)",
            "durability": if config.sync_writes {
                "persist(PersistMode::SyncAll) after each write".to_string()
            } else {
                format!("journal buffered; fsync_ms = {}", fsync_ms(config))
            },
        })
    }

    fn open(&self, dir: &Path, config: &EngineConfig) -> Result<Box<dyn Engine>> {
        let mut builder = fjall::Config::new(dir).cache_size(config.cache_bytes);
        if !config.sync_writes {
            builder = builder.fsync_ms(Some(fsync_ms(config)));
        }
        let keyspace = builder.open()?;
        let partition = keyspace.open_partition(
            "bench",
            PartitionCreateOptions::default().compression(CompressionType::None),
        )?;
        Ok(Box::new(FjallEngine {
            keyspace,
            partition,
            sync_writes: config.sync_writes,
        }))
    }
}

struct FjallEngine {
    keyspace: Keyspace,
    partition: PartitionHandle,
    sync_writes: bool,
}

impl FjallEngine {
    fn after_write(&self) -> Result<()> {
        if self.sync_writes {
            self.keyspace.persist(PersistMode::SyncAll)?;
        }
        Ok(())
    }
}

impl Engine for FjallEngine {
    fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.partition.insert(key, value)?;
        self.after_write()
    }

    fn put_batch(&self, pairs: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
        let mut batch = self.keyspace.batch();
        for (key, value) in pairs {
            batch.insert(&self.partition, key.as_slice(), value.as_slice());
        }
        batch.commit()?;
        self.after_write()
    }

    fn get(&self, key: &[u8], check: &mut dyn FnMut(&[u8]) -> bool) -> Result<Option<bool>> {
        Ok(self.partition.get(key)?.map(|value| check(&value)))
    }

    fn delete(&self, key: &[u8]) -> Result<bool> {
        // fjall removes blindly; the trait promises presence, which costs a lookup.
        let present = self.partition.contains_key(key)?;
        self.partition.remove(key)?;
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
        let range = self.partition.range::<&[u8], _>((lower, upper));
        match direction {
            Direction::Forward => {
                for item in range {
                    let (key, value) = item?;
                    if let ControlFlow::Break(()) = visit(&key, &value) {
                        break;
                    }
                }
            }
            Direction::Reverse => {
                for item in range.rev() {
                    let (key, value) = item?;
                    if let ControlFlow::Break(()) = visit(&key, &value) {
                        break;
                    }
                }
            }
        }
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        Ok(self.keyspace.persist(PersistMode::SyncAll)?)
    }

    fn commit(&self) -> Result<()> {
        // The equivalent of persisting the index: the memtable to a segment.
        self.partition.rotate_memtable_and_wait()?;
        Ok(self.keyspace.persist(PersistMode::SyncAll)?)
    }

    fn footprint(&self) -> Footprint {
        Footprint::default()
    }

    fn reclaim_space(&mut self) -> Result<&'static str> {
        // The memtable's tombstones to a segment, then every segment merged, which drops
        // the tombstones and what they shadow.
        self.partition.rotate_memtable_and_wait()?;
        self.partition.major_compact()?;
        self.keyspace.persist(PersistMode::SyncAll)?;
        Ok("rotate_memtable_and_wait, then major_compact")
    }

    fn close(self: Box<Self>) -> Result<()> {
        self.keyspace.persist(PersistMode::SyncAll)?;
        Ok(())
    }

    fn abandon(self: Box<Self>) {
        drop(self);
    }
}
