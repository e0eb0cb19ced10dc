//! LMDB (through `heed`) behind the [`Engine`] trait (feature `lmdb`): one environment,
//! one named database of raw bytes.
//!
//! Configuration, and where each setting comes from (LMDB's API documentation,
//! `mdb_env_set_mapsize` and `mdb_env_open`'s flags, through heed 0.23): a 64 GiB map (LMDB's guide: the map size is the database's
//! maximum size, so make it larger than anything the run can reach; it is sparse and costs
//! nothing until used), `NO_READAHEAD` (the guide's advice when the data set may exceed
//! memory: readahead only evicts useful pages on random reads). LMDB has no cache of its
//! own; it reads through the kernel's page cache via its memory map, so the cache budget
//! does not apply. Buffered durability is `NO_SYNC` (commits do not fsync) plus
//! `mdb_env_sync` once per flush interval from a [`Flusher`]; sync durability is LMDB's
//! default (each commit syncs). One write transaction per operation, as an application
//! with independent writes would do; LMDB serialises writers.
//!
//! Thread-safety: the environment is `Send + Sync`; read transactions are per thread
//! (heed's default TLS mode: one open read transaction per thread at a time, which the
//! adapter respects by never holding one across calls).

use std::ops::{Bound, ControlFlow};
use std::path::Path;

use heed::types::Bytes;
use heed::{CommitOrAbort, Database, Env, EnvFlags, EnvOpenOptions};

use super::{Direction, Engine, EngineConfig, EngineKind, Flusher, Footprint, Visit};
use crate::Result;

/// Size of the memory map: the most the database can ever hold.
const MAP_BYTES: usize = 64 << 30;

pub struct Lmdb;

fn flags(config: &EngineConfig) -> EnvFlags {
    let mut flags = EnvFlags::NO_READ_AHEAD;
    if !config.sync_writes {
        flags |= EnvFlags::NO_SYNC;
    }
    flags
}

impl EngineKind for Lmdb {
    fn name(&self) -> &'static str {
        "lmdb"
    }

    fn configuration(&self, config: &EngineConfig) -> serde_json::Value {
        serde_json::json!({
            "crate": format!("heed {}", env!("TUCANA_BENCH_HEED_VERSION")),
            "library": format!("{} (bundled by lmdb-master-sys, as the linked library reports it)", heed::lmdb_version().string),
            "map_size_bytes": MAP_BYTES,
            "flags": format!("{:?}", flags(config)),
            "cache": "none of its own: reads through the page cache via mmap",
            "transactions": "one write transaction per put/delete; one read transaction per get/scan",
            "durability": if config.sync_writes {
                "each commit fsyncs (LMDB default)".to_string()
            } else {
                format!("MDB_NOSYNC; mdb_env_sync every {} ms", config.flush_interval.as_millis())
            },
        })
    }

    fn open(&self, dir: &Path, config: &EngineConfig) -> Result<Box<dyn Engine>> {
        let mut options = EnvOpenOptions::new();
        options.map_size(MAP_BYTES).max_dbs(1);
        // SAFETY: heed requires that the flags not break LMDB's invariants for the way the
        // environment is used: NO_SYNC only weakens durability (the benchmark syncs on its
        // own schedule), NO_READ_AHEAD only changes madvise hints.
        unsafe {
            options.flags(flags(config));
        }
        // SAFETY: heed's requirement is that the same environment is not opened twice in
        // one process; the directory is fresh and owned by this engine alone.
        let env = unsafe { options.open(dir)? };
        // heed 0.23 opens databases inside a committed write transaction; what it hands
        // back after the commit is a `Database<'static, ..>` (a dbi number and the
        // environment's identity, checked against each transaction's).
        let txn = env.write_txn()?;
        let db: Database<'static, Bytes, Bytes> = env
            .create_databases_and_commit(txn, |opener, txn| {
                opener
                    .create_database::<Bytes, Bytes>(txn, Some("bench"))
                    .map(CommitOrAbort::<_, ()>::Commit)
            })
            .map_err(|error: heed::Error| error)?
            .unwrap_commit();
        let flusher = (!config.sync_writes).then(|| {
            let env = env.clone();
            Flusher::start("lmdb", config.flush_interval, move || Ok(env.force_sync()?))
        });
        Ok(Box::new(LmdbEngine { flusher, env, db }))
    }
}

struct LmdbEngine {
    flusher: Option<Flusher>,
    env: Env,
    db: Database<'static, Bytes, Bytes>,
}

impl Engine for LmdbEngine {
    fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        let mut txn = self.env.write_txn()?;
        self.db.put(&mut txn, key, value)?;
        Ok(txn.commit()?)
    }

    fn put_batch(&self, pairs: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
        let mut txn = self.env.write_txn()?;
        for (key, value) in pairs {
            self.db.put(&mut txn, key, value)?;
        }
        Ok(txn.commit()?)
    }

    fn get(&self, key: &[u8], check: &mut dyn FnMut(&[u8]) -> bool) -> Result<Option<bool>> {
        let txn = self.env.read_txn()?;
        Ok(self.db.get(&txn, key)?.map(check))
    }

    fn delete(&self, key: &[u8]) -> Result<bool> {
        let mut txn = self.env.write_txn()?;
        let present = self.db.delete(&mut txn, key)?;
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
        let txn = self.env.read_txn()?;
        let bounds = (lower, upper);
        match direction {
            Direction::Forward => {
                for item in self.db.range(&txn, &bounds)? {
                    let (key, value) = item?;
                    if let ControlFlow::Break(()) = visit(key, value) {
                        break;
                    }
                }
            }
            Direction::Reverse => {
                for item in self.db.rev_range(&txn, &bounds)? {
                    let (key, value) = item?;
                    if let ControlFlow::Break(()) = visit(key, value) {
                        break;
                    }
                }
            }
        }
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        Ok(self.env.force_sync()?)
    }

    fn commit(&self) -> Result<()> {
        // Every LMDB commit already persists the B-tree; syncing makes it durable.
        Ok(self.env.force_sync()?)
    }

    fn footprint(&self) -> Footprint {
        let keys = self
            .env
            .read_txn()
            .ok()
            .and_then(|txn| self.db.len(&txn).ok());
        Footprint {
            keys,
            ..Footprint::default()
        }
    }

    fn reclaim_space(&mut self) -> Result<&'static str> {
        // LMDB reuses freed pages inside its file but never shrinks it; copying the
        // environment with compaction (mdb_env_copy2) makes another file, which is not
        // giving space back in place.
        self.env.force_sync()?;
        Ok("nothing: LMDB reuses freed pages in its file and never shrinks it")
    }

    fn close(self: Box<Self>) -> Result<()> {
        let LmdbEngine { flusher, env, .. } = *self;
        drop(flusher);
        env.force_sync()?;
        Ok(())
    }

    fn abandon(self: Box<Self>) {
        drop(self);
    }
}
