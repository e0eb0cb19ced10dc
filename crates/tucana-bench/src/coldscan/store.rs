//! The stores a cold-scan run measures: Tucana through its own API with a scan prefetch
//! window ([`Variant::Tucana`]), a peer through the harness's `Engine` trait; opening,
//! scanning and closing one, the load that fills it once, and the page-cache chores
//! around each measurement (drop every file of the store, or read them all in).
//!
//! Owns the engines' settings for this command and the load; the phases are `phases`'s.
//! Single-threaded.

use std::ops::Bound;
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use tucana::{Database, Keyspace, Options};

use super::Plan;
use crate::engine::{Direction, Engine, EngineConfig, EngineKind, Visit};
use crate::workload::{Generation, Permutation};
use crate::{sys, Result};

/// File name of Tucana's volume inside the engine's directory.
const VOLUME_FILE: &str = "coldscan.tucana";
const KEYSPACE: &str = "bench";
/// Keys written per batch during the load.
const LOAD_BATCH_KEYS: u64 = 1000;

/// One way of running an engine: Tucana with a prefetch window, or a peer.
#[derive(Clone, Copy)]
pub(super) enum Variant {
    /// `reorganised`: the store was settled by `Database::reorganise` (its records
    /// rewritten in key order) instead of left as loaded.
    Tucana {
        prefetch_entries: usize,
        reorganised: bool,
    },
    Peer(&'static dyn EngineKind),
}

impl Variant {
    pub(super) fn engine_name(&self) -> &'static str {
        match self {
            Variant::Tucana { .. } => "tucana",
            Variant::Peer(kind) => kind.name(),
        }
    }

    pub(super) fn prefetch_entries(&self) -> Option<usize> {
        match self {
            Variant::Tucana {
                prefetch_entries, ..
            } => Some(*prefetch_entries),
            Variant::Peer(_) => None,
        }
    }

    pub(super) fn reorganised(&self) -> bool {
        matches!(
            self,
            Variant::Tucana {
                reorganised: true,
                ..
            }
        )
    }

    /// "tucana (prefetch 64)", "tucana (prefetch 64, reorganised)", "rocksdb".
    pub(super) fn label(&self) -> String {
        let reorganised = if self.reorganised() {
            ", reorganised"
        } else {
            ""
        };
        match self.prefetch_entries() {
            Some(0) => format!("tucana (prefetch off{reorganised})"),
            Some(n) => format!("tucana (prefetch {n}{reorganised})"),
            None => self.engine_name().to_string(),
        }
    }

    /// The `prefetch` field of its records: "off", "on", "on, reorganised"; `None` for a
    /// peer.
    pub(super) fn prefetch_setting(&self) -> Option<String> {
        let setting = match self.prefetch_entries()? {
            0 => "off",
            _ => "on",
        };
        Some(if self.reorganised() {
            format!("{setting}, reorganised")
        } else {
            setting.to_string()
        })
    }
}

/// An open store of one variant.
pub(super) enum Store {
    Tucana { db: Database, keyspace: Keyspace },
    Peer(Box<dyn Engine>),
}

impl Store {
    pub(super) fn open(variant: Variant, dir: &Path, config: &EngineConfig) -> Result<Store> {
        Ok(match variant {
            Variant::Tucana {
                prefetch_entries, ..
            } => {
                let db = tucana_options(prefetch_entries).open(dir.join(VOLUME_FILE))?;
                let keyspace = db.keyspace(KEYSPACE)?;
                Store::Tucana { db, keyspace }
            }
            Variant::Peer(kind) => Store::Peer(kind.open(dir, config)?),
        })
    }

    /// Visits the pairs from `lower` on (forward) or up to the end (reverse) in `direction`
    /// order until `visit` breaks.
    pub(super) fn scan(
        &self,
        lower: Bound<&[u8]>,
        direction: Direction,
        visit: &mut Visit<'_>,
    ) -> Result<()> {
        match self {
            Store::Tucana { keyspace, .. } => {
                let range = keyspace.range::<&[u8], _>((lower, Bound::Unbounded));
                let mut step = |item: tucana::Result<(Vec<u8>, Vec<u8>)>| -> Result<bool> {
                    let (key, value) = item?;
                    Ok(visit(&key, &value).is_break())
                };
                match direction {
                    Direction::Forward => {
                        for item in range {
                            if step(item)? {
                                break;
                            }
                        }
                    }
                    Direction::Reverse => {
                        for item in range.rev() {
                            if step(item)? {
                                break;
                            }
                        }
                    }
                }
                Ok(())
            }
            Store::Peer(engine) => engine.scan(lower, Bound::Unbounded, direction, visit),
        }
    }

    /// Tucana's prefetch counters (calls, bytes) so far.
    pub(super) fn prefetch_counters(&self) -> Option<(u64, u64)> {
        match self {
            Store::Tucana { db, .. } => {
                let stats = db.stats();
                Some((stats.prefetch_calls, stats.prefetch_bytes))
            }
            Store::Peer(_) => None,
        }
    }

    pub(super) fn close(self) -> Result<()> {
        match self {
            Store::Tucana { db, keyspace } => {
                // The keyspace handle may keep the database alive; close wants the last one.
                drop(keyspace);
                Ok(db.close()?)
            }
            Store::Peer(engine) => engine.close(),
        }
    }
}

fn tucana_options(prefetch_entries: usize) -> Options {
    // Reads only: no background work that could read or write during a phase.
    Database::builder()
        .commit_interval(None)
        .flush_interval(None)
        .gc(false)
        .scan_prefetch_entries(prefetch_entries)
}

/// What [`tucana_options`] and the load use, for the results.
pub(super) fn tucana_configuration(prefetch_entries: u64) -> Value {
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "load": format!("Database::builder().gc(false), one batch per {LOAD_BATCH_KEYS} puts, then close"),
        "measurements": "commit_interval None, flush_interval None, gc off (reads only: no background work)",
        "scan_prefetch_entries": format!("0 (prefetch off) and {prefetch_entries} (on)"),
        "cache": "none of its own: the index is in memory, values are read through the page cache",
    })
}

/// Writes every key once, in a random order, settles the store (unless asked not to) and
/// closes it; returns how long the load took and what settling did.
pub(super) fn load(plan: &Plan, variant: Variant, dir: &Path) -> Result<(Duration, String)> {
    let start = std::time::Instant::now();
    let order = Permutation::new(plan.args.keys, plan.args.seed ^ 0xC01D);
    let keyset = &plan.keyset;
    let (mut key, mut value) = (keyset.key_buf(), keyset.value_buf());
    let settle = match variant {
        Variant::Tucana { .. } => {
            let db = Database::builder().gc(false).open(dir.join(VOLUME_FILE))?;
            let ks = db.keyspace(KEYSPACE)?;
            let mut position = 0;
            while position < plan.args.keys {
                let mut batch = ks.batch();
                let end = (position + LOAD_BATCH_KEYS).min(plan.args.keys);
                for p in position..end {
                    keyset.key_into(order.at(p), &mut key);
                    keyset.value_into(&key, Generation(0), &mut value);
                    batch.put(&key, &value);
                }
                batch.commit()?;
                position = end;
            }
            drop(ks);
            let settle = if variant.reorganised() {
                let report = db.reorganise()?;
                format!(
                    "Database::reorganise: {} of {} leaves rewritten in key order, {} records \
                     copied",
                    report.leaves_rewritten, report.leaves_seen, report.records_copied
                )
            } else {
                // No overwrites or deletes: nothing for GC to do; the index is committed at
                // close.
                "nothing to do (no dead records; index committed at close)".to_string()
            };
            db.close()?;
            settle
        }
        Variant::Peer(kind) => {
            let mut engine = kind.open(dir, &plan.engine_config)?;
            let mut pairs = Vec::with_capacity(LOAD_BATCH_KEYS as usize);
            let mut position = 0;
            while position < plan.args.keys {
                pairs.clear();
                let end = (position + LOAD_BATCH_KEYS).min(plan.args.keys);
                for p in position..end {
                    keyset.key_into(order.at(p), &mut key);
                    keyset.value_into(&key, Generation(0), &mut value);
                    pairs.push((key.clone(), value.clone()));
                }
                engine.put_batch(&pairs)?;
                position = end;
            }
            engine.commit()?;
            let settle = if plan.args.no_settle {
                "not asked to (--no-settle)".to_string()
            } else {
                engine.reclaim_space()?.to_string()
            };
            engine.sync()?;
            engine.close()?;
            settle
        }
    };
    Ok((start.elapsed(), settle))
}

/// Syncs and drops every file of the store's directory from the page cache.
pub(super) fn drop_store_from_page_cache(dir: &Path) -> Result<()> {
    for file in sys::files_under(dir)? {
        sys::drop_from_page_cache(&file)?;
    }
    Ok(())
}

/// Reads every file of the store's directory, so that it is in the page cache.
pub(super) fn read_whole_files(dir: &Path) -> Result<()> {
    for file in sys::files_under(dir)? {
        std::io::copy(&mut std::fs::File::open(file)?, &mut std::io::sink())?;
    }
    Ok(())
}
