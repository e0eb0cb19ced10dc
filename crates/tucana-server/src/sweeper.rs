//! Active expiry: a background task that deletes keys whose deadline has passed, found
//! through the index of deadlines (`expiry`) without a full scan and without a client
//! reading them (DESIGN.md, "Expiry").
//!
//! Owns the sweep: every [`TICK`], for each database that may hold deadlines, the due
//! index entries are read from the start of the index (no lock: readers never block),
//! then under the database's write lock each is checked against the key's deadline record
//! and the key, its record and its entry are deleted in one engine batch, at most
//! [`BATCH_KEYS`] keys per batch and [`BATCHES_PER_TICK`] batches per database per tick,
//! so a flood of expired keys does not hold the lock for long. Deletes are buffered: after
//! a crash an unsynced delete is undone, and the key is hidden again by lazy expiry and
//! swept again. It does not own lazy expiry (`commands::expire`). Cluster mode's regions
//! are not swept yet (their keys expire lazily).
//!
//! Thread-safety: the task runs on the listener's runtime and does its engine work on
//! the blocking pool; it takes each database's write lock as any writer does.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tucana::Durability;

use crate::expiry::{
    deadline_key, decode_deadline, index_key, index_prefix, now_ms, split_index_key,
};
use crate::state::{stopped, ServerState};
use crate::store::Slot;

/// How often the sweeper looks for due keys.
pub const TICK: Duration = Duration::from_millis(100);
/// Keys deleted by one engine batch, under one hold of the write lock.
pub const BATCH_KEYS: usize = 64;
/// Batches per database per tick.
pub const BATCHES_PER_TICK: usize = 4;

/// Sweeps until the server shuts down.
pub async fn run(state: Arc<ServerState>, mut shutdown: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(TICK) => {}
            _ = stopped(&mut shutdown) => return,
        }
        let state = state.clone();
        let _ = tokio::task::spawn_blocking(move || sweep_all(&state)).await;
    }
}

/// One tick over every numbered database.
fn sweep_all(state: &ServerState) {
    for slot in state.store.slots() {
        if !slot.may_expire() {
            continue;
        }
        for _ in 0..BATCHES_PER_TICK {
            match sweep(slot, now_ms(), BATCH_KEYS) {
                Ok(n) if n == BATCH_KEYS => continue,
                Ok(_) => break,
                Err(e) => {
                    // A keyspace this server no longer writes (fenced) or a damaged
                    // record: lazy expiry still hides the keys.
                    eprintln!("tucana serve: expiry sweep of {}: {e}", slot.name());
                    break;
                }
            }
        }
    }
}

/// Deletes up to `max` keys of `slot` due at `now_ms`; the number of index entries
/// handled (due keys deleted, and stale entries).
pub fn sweep(slot: &Slot, now_ms: u64, max: usize) -> tucana::Result<usize> {
    let Some(ks) = slot.existing() else {
        return Ok(0);
    };
    let mut due = Vec::new();
    for item in ks.prefix(&index_prefix()) {
        let (stored, _) = item?;
        let (deadline_ms, key) = split_index_key(&stored)?;
        // A key is live at its deadline itself.
        if deadline_ms >= now_ms || due.len() == max {
            break;
        }
        due.push((deadline_ms, key.to_vec()));
    }
    if due.is_empty() {
        return Ok(0);
    }
    let guard = slot.lock_writes();
    let Some(ks) = guard.existing() else {
        return Ok(0);
    };
    let mut batch = ks.batch();
    for (deadline_ms, key) in &due {
        let record = deadline_key(key);
        let current = ks.get(&record)?.map(|d| decode_deadline(&d)).transpose()?;
        // Re-checked under the lock: a write since the read moved or dropped the deadline.
        if current == Some(*deadline_ms) {
            batch.delete(key);
            batch.delete(&record);
        }
        batch.delete(&index_key(*deadline_ms, key));
    }
    batch.commit_with(Durability::Buffered)?;
    // An expired key that is deleted is modified, for WATCH.
    guard.modified(due.iter().map(|(_, key)| key.as_slice()), false);
    Ok(due.len())
}
