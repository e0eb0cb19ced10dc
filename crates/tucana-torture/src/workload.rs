//! Random workloads shared by the suites: generating operations from a seeded generator,
//! running them against a database while recording every answer in the model, reading a
//! keyspace back, and checking a reopened volume against the model.
//!
//! Owns: the operation mix (keys from a small space so writes overwrite and delete live
//! keys; some keys share their 8-byte prefix; values from a few bytes to more than a
//! 64 KiB log segment; with `Mix::GC` a space of a few dozen keys, so most writes leave
//! dead records behind, and forced garbage-collection passes among the operations) and
//! the verification of a recovered database. Does not own: where crashes or faults happen
//! (the suites decide).
//!
//! Thread-safety: single-threaded use; the database may run its own background thread.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use tucana::volume::Storage;
use tucana::{Database, DeferredUpdates, Durability, Error, Keyspace, Options};

use crate::model::{KeyspaceModel, Outcome, State, Verdict, Write};

/// Log segment size of every suite: small, so workloads cross segments often.
pub const SEGMENT_BYTES: u64 = 64 << 10;

/// Name of the engine's background garbage-collector thread (`tucana::Database`'s
/// `tucana-gc`): I/O issued by it is background GC at work.
pub const GC_THREAD: &str = "tucana-gc";

/// Options of a torture database. With `background` the committer commits and flushes,
/// and the garbage collector takes a step, every millisecond (runs are then not exactly
/// replayable: the interleaving of their I/O with the workload's depends on timing).
/// Without it no thread but the caller's does I/O.
pub fn options(background: bool) -> Options {
    let tick = background.then_some(Duration::from_millis(1));
    Database::builder()
        .log_segment_bytes(SEGMENT_BYTES)
        .commit_interval(tick)
        .flush_interval(tick)
        .commit_dirty_bytes(256 << 10)
        .gc(background)
        .gc_tick(Duration::from_millis(1))
}

/// `options`, deferring every update of an existing key when `deferred` (by default the
/// engine defers only while its data is out of memory, which a test volume never is), so
/// that crashes and faults also fall while acknowledged updates are not in the index yet.
pub fn deferring(options: Options, deferred: bool) -> Options {
    if deferred {
        options.deferred_updates(DeferredUpdates::Always)
    } else {
        options
    }
}

/// What a workload's operations look like.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mix {
    /// Keys are drawn from `2 × keys` (half of them sharing an 8-byte prefix).
    pub keys: u32,
    /// Percent of operations that are forced GC passes (`Database::gc`).
    pub gc_percent: u32,
}

impl Mix {
    /// A few hundred keys, no forced GC.
    pub const PLAIN: Mix = Mix {
        keys: 160,
        gc_percent: 0,
    };
    /// Overwrite-heavy, with forced GC passes: 24 keys, so most puts and deletes leave
    /// the previous record dead and segments empty out, and 4% GC passes, each
    /// relocating the live records of those segments, retiring, freeing and punching them.
    pub const GC: Mix = Mix {
        keys: 12,
        gc_percent: 4,
    };
}

/// Opens a database on `storage` with `options`.
pub fn open(options: Options, storage: &Arc<dyn Storage>) -> tucana::Result<Database> {
    options.open_storage(storage.clone())
}

/// One operation of a workload.
#[derive(Clone, Debug)]
pub enum Op {
    Put {
        ks: usize,
        key: Vec<u8>,
        value: Vec<u8>,
        sync: bool,
    },
    Delete {
        ks: usize,
        key: Vec<u8>,
        sync: bool,
    },
    Batch {
        ks: usize,
        writes: Vec<Write>,
        sync: bool,
    },
    Sync,
    Commit,
    /// A forced garbage-collection pass (`Database::gc`, which commits five times).
    Gc,
}

/// A key from a space of a few hundred, some sharing an 8-byte prefix.
pub fn random_key(rng: &mut StdRng) -> Vec<u8> {
    random_key_of(rng, Mix::PLAIN.keys)
}

/// A key from a space of `2 × keys`, some sharing an 8-byte prefix.
pub fn random_key_of(rng: &mut StdRng, keys: u32) -> Vec<u8> {
    let n = rng.random_range(0..keys);
    if rng.random_bool(0.2) {
        format!("shared-prefix/{n:03}").into_bytes()
    } else {
        format!("k{n:03}").into_bytes()
    }
}

/// A value naming where it was written (so two writes never carry equal values) padded to
/// a random length: mostly small, sometimes a good part of a segment, rarely more than one.
pub fn random_value(rng: &mut StdRng, tag: u64) -> Vec<u8> {
    let len = match rng.random_range(0..100) {
        0..70 => rng.random_range(0..200),
        70..97 => rng.random_range(1_000..24_000),
        _ => rng.random_range(60_000..80_000),
    };
    let mut v = format!("v{tag}:").into_bytes();
    let fill = (tag % 251) as u8;
    v.extend((0..len).map(|i| fill.wrapping_add(i as u8)));
    v
}

/// A random operation of `Mix::PLAIN` on one of `keyspaces` keyspaces; `tag` makes
/// values unique.
pub fn random_op(rng: &mut StdRng, keyspaces: usize, tag: u64) -> Op {
    random_op_of(rng, Mix::PLAIN, keyspaces, tag)
}

/// A random operation of `mix` on one of `keyspaces` keyspaces; `tag` makes values unique.
pub fn random_op_of(rng: &mut StdRng, mix: Mix, keyspaces: usize, tag: u64) -> Op {
    // No draw for a mix without GC: the plain mix's streams stay as they were.
    if mix.gc_percent > 0 && rng.random_range(0..100) < mix.gc_percent {
        return Op::Gc;
    }
    let ks = rng.random_range(0..keyspaces);
    let sync = rng.random_bool(0.1);
    match rng.random_range(0..100) {
        0..55 => Op::Put {
            ks,
            key: random_key_of(rng, mix.keys),
            value: random_value(rng, tag),
            sync,
        },
        55..72 => Op::Delete {
            ks,
            key: random_key_of(rng, mix.keys),
            sync,
        },
        72..90 => {
            let n = rng.random_range(1..8);
            let writes = (0..n)
                .map(|i| {
                    let key = random_key_of(rng, mix.keys);
                    let value = rng
                        .random_bool(0.8)
                        .then(|| random_value(rng, tag * 16 + i));
                    (key, value)
                })
                .collect();
            Op::Batch { ks, writes, sync }
        }
        90..96 => Op::Sync,
        _ => Op::Commit,
    }
}

fn durability(sync: bool) -> Durability {
    if sync {
        Durability::Sync
    } else {
        Durability::Buffered
    }
}

/// Runs `op`, recording what it asked for and how it ended in `models`. Returns the call's
/// result (with the error, if any).
pub fn run_op(
    op: &Op,
    db: &Database,
    keyspaces: &[Keyspace],
    models: &mut [KeyspaceModel],
) -> tucana::Result<()> {
    let outcome = |r: &tucana::Result<()>, sync: bool| match r {
        Ok(()) => Outcome::Acked { durable: sync },
        Err(_) => Outcome::Failed,
    };
    match op {
        Op::Put {
            ks,
            key,
            value,
            sync,
        } => {
            let r = keyspaces[*ks].put_with(key, value, durability(*sync));
            models[*ks].record(vec![(key.clone(), Some(value.clone()))], outcome(&r, *sync));
            r
        }
        Op::Delete { ks, key, sync } => {
            let r = keyspaces[*ks]
                .delete_with(key, durability(*sync))
                .map(|_| ());
            models[*ks].record(vec![(key.clone(), None)], outcome(&r, *sync));
            r
        }
        Op::Batch { ks, writes, sync } => {
            let mut b = keyspaces[*ks].batch();
            for (k, v) in writes {
                match v {
                    Some(v) => b.put(k, v),
                    None => b.delete(k),
                };
            }
            let r = b.commit_with(durability(*sync));
            models[*ks].record(writes.clone(), outcome(&r, *sync));
            r
        }
        Op::Sync | Op::Commit | Op::Gc => {
            let r = match op {
                Op::Sync => db.sync(),
                Op::Commit => db.commit(),
                // A pass commits before it returns: everything before it is durable.
                _ => db.gc(),
            };
            if r.is_ok() {
                models.iter_mut().for_each(KeyspaceModel::mark_durable);
            }
            r
        }
    }
}

/// Every pair of a keyspace, in order.
pub fn read_state(ks: &Keyspace) -> tucana::Result<State> {
    let mut s = BTreeMap::new();
    for item in ks.range::<&[u8], _>(..) {
        let (k, v) = item?;
        s.insert(k, v);
    }
    Ok(s)
}

/// How a reopened database compared with the model.
#[derive(Debug)]
pub enum Recovery {
    /// Every keyspace is an allowed prefix and `check` passed; the recovered states.
    Good(Vec<State>),
    /// A durable write is missing.
    LostDurable(String),
    /// A state no prefix of the history produces.
    NonPrefix(String),
    /// Open, a read or `check` failed.
    Failed(Error),
}

/// Reads back every keyspace of `db`, compares with `models` and runs `check`.
pub fn verify_recovered(db: &Database, names: &[String], models: &[KeyspaceModel]) -> Recovery {
    let mut states = Vec::with_capacity(names.len());
    for (name, model) in names.iter().zip(models) {
        let state = match db.open_keyspace(name) {
            Ok(ks) => match read_state(&ks) {
                Ok(s) => s,
                Err(e) => return Recovery::Failed(e),
            },
            // Every suite creates its keyspaces durably before any fault.
            Err(Error::KeyspaceNotFound(_)) => {
                return Recovery::LostDurable(format!("keyspace {name} is gone"))
            }
            Err(e) => return Recovery::Failed(e),
        };
        match model.verify(&state) {
            Verdict::Prefix { .. } => {}
            v @ Verdict::LostDurable { .. } => {
                return Recovery::LostDurable(format!("keyspace {name}: {v:?}"))
            }
            v @ Verdict::NonPrefix { .. } => {
                return Recovery::NonPrefix(format!("keyspace {name}: {v:?}"))
            }
        }
        states.push(state);
    }
    if let Err(e) = db.check() {
        return Recovery::Failed(e);
    }
    Recovery::Good(states)
}
