//! redb behind the [`Engine`] trait (feature `redb`): one database file, one table of raw
//! bytes.
//!
//! Configuration, and where each setting comes from (redb 4.x docs on docs.rs): redb's
//! cache set to the benchmark's cache budget (`Builder::set_cache_size`, "the amount of
//! memory used for caching data"), the default `ConcurrencyMode::ExclusiveWriter` (one
//! process), two-phase commit and quick-repair left at their defaults (off: redb documents
//! both as slowing commits, for an attack model and for recovery time, neither of which
//! this benchmark measures), one write transaction per operation as an application with
//! independent writes would do. Buffered durability is `Durability::None` per transaction
//! plus an empty `Durability::Immediate` commit once per flush interval from a [`Flusher`]
//! (the docs: a `None` commit "will not be persisted to disk unless followed by a commit
//! with `Durability::Immediate`", redb's way to batch durability; it is also what lets redb
//! reuse freed pages); sync durability is `Durability::Immediate` (the default) per write.
//!
//! Thread-safety: `redb::Database` is `Send + Sync`; redb serialises write transactions.

use std::ops::{Bound, ControlFlow};
use std::path::Path;
use std::sync::Arc;

use redb::{Database, Durability, ReadableDatabase, ReadableTableMetadata, TableDefinition};

use super::{Direction, Engine, EngineConfig, EngineKind, Flusher, Footprint, Visit};
use crate::Result;

const TABLE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("bench");

pub struct Redb;

impl EngineKind for Redb {
    fn name(&self) -> &'static str {
        "redb"
    }

    fn configuration(&self, config: &EngineConfig) -> serde_json::Value {
        serde_json::json!({
            "crate": format!("redb {}", env!("TUCANA_BENCH_REDB_VERSION")),
            "cache_size_bytes": config.cache_bytes,
            "concurrency_mode": "ExclusiveWriter (default)",
            "two_phase_commit": "off (default)",
            "quick_repair": "off (default)",
            "transactions": "one write transaction per put/delete; one read transaction per get/scan",
            "durability": if config.sync_writes {
                "Durability::Immediate per write".to_string()
            } else {
                format!("Durability::None per write; an Immediate commit every {} ms", config.flush_interval.as_millis())
            },
        })
    }

    fn open(&self, dir: &Path, config: &EngineConfig) -> Result<Box<dyn Engine>> {
        let db = Arc::new(
            redb::Builder::new()
                .set_cache_size(usize::try_from(config.cache_bytes)?)
                .create(dir.join("bench.redb"))?,
        );
        let txn = db.begin_write()?;
        txn.open_table(TABLE)?;
        txn.commit()?;
        let durability = if config.sync_writes {
            Durability::Immediate
        } else {
            Durability::None
        };
        let flusher = (!config.sync_writes).then(|| {
            let db = Arc::clone(&db);
            Flusher::start("redb", config.flush_interval, move || flush(&db))
        });
        Ok(Box::new(RedbEngine {
            flusher,
            db,
            durability,
        }))
    }
}

/// An empty durable commit: makes every earlier `Durability::None` commit durable.
fn flush(db: &Database) -> Result<()> {
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate)?;
    Ok(txn.commit()?)
}

struct RedbEngine {
    flusher: Option<Flusher>,
    db: Arc<Database>,
    durability: Durability,
}

impl Engine for RedbEngine {
    fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(self.durability)?;
        txn.open_table(TABLE)?.insert(key, value)?;
        Ok(txn.commit()?)
    }

    fn put_batch(&self, pairs: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(self.durability)?;
        {
            let mut table = txn.open_table(TABLE)?;
            for (key, value) in pairs {
                table.insert(key.as_slice(), value.as_slice())?;
            }
        }
        Ok(txn.commit()?)
    }

    fn get(&self, key: &[u8], check: &mut dyn FnMut(&[u8]) -> bool) -> Result<Option<bool>> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(TABLE)?;
        Ok(table.get(key)?.map(|value| check(value.value())))
    }

    fn delete(&self, key: &[u8]) -> Result<bool> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(self.durability)?;
        let present = txn.open_table(TABLE)?.remove(key)?.is_some();
        txn.commit()?;
        Ok(present)
    }

    fn scan(
        &self,
        lower: Bound<&[u8]>,
        upper: Bound<&[u8]>,
        direction: Direction,
        visit: &mut Visit<'_>,
    ) -> Result<()> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(TABLE)?;
        let range = table.range::<&[u8]>((lower, upper))?;
        let mut step =
            |item: std::result::Result<_, redb::StorageError>| -> Result<ControlFlow<()>> {
                let (key, value): (redb::AccessGuard<&[u8]>, redb::AccessGuard<&[u8]>) = item?;
                Ok(visit(key.value(), value.value()))
            };
        match direction {
            Direction::Forward => {
                for item in range {
                    if step(item)?.is_break() {
                        break;
                    }
                }
            }
            Direction::Reverse => {
                for item in range.rev() {
                    if step(item)?.is_break() {
                        break;
                    }
                }
            }
        }
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        flush(&self.db)
    }

    fn commit(&self) -> Result<()> {
        flush(&self.db)
    }

    fn footprint(&self) -> Footprint {
        let keys = self
            .db
            .begin_read()
            .ok()
            .and_then(|txn| txn.open_table(TABLE).ok()?.len().ok());
        Footprint {
            keys,
            ..Footprint::default()
        }
    }

    fn reclaim_space(&mut self) -> Result<&'static str> {
        // `compact` needs the only handle: stop the flusher (it holds a clone), compact,
        // and start it again with the same interval.
        let interval = self.flusher.as_ref().map(|f| f.interval());
        drop(self.flusher.take());
        flush(&self.db)?;
        let db = Arc::get_mut(&mut self.db).ok_or("redb: another handle is still open")?;
        db.compact()?;
        if let Some(interval) = interval {
            let db = Arc::clone(&self.db);
            self.flusher = Some(Flusher::start("redb", interval, move || flush(&db)));
        }
        Ok("Database::compact")
    }

    fn close(self: Box<Self>) -> Result<()> {
        let RedbEngine { flusher, db, .. } = *self;
        drop(flusher);
        flush(&db)
    }

    fn abandon(self: Box<Self>) {
        drop(self);
    }
}
