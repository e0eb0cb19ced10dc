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
//! swept again. Each key deleted raises the keyspace notification `expired` (published
//! under the lock, after its batch) when notifications of that class are on. It does not
//! own lazy expiry (`commands::expire`).
//!
//! In cluster mode each hash slot has its own index (`slot R 'i' ...`): a tick sweeps the
//! next [`SLOTS_PER_TICK`] slots of the regions this server leads, so a full round takes
//! 16384 / 1024 ticks (1.6 s), and an expired key nobody reads is deleted within about
//! 2 s.
//!
//! Thread-safety: the task runs on the listener's runtime and does its engine work on
//! the blocking pool; it takes each database's write lock as any writer does.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tucana::Durability;

use crate::collector::{self, Cursor};
use crate::expiry::{
    deadline_key, decode_deadline, index_key, index_prefix, now_ms, split_index_key,
};
use crate::state::{stopped, ServerState};
use crate::store::Slot;
use tucana_cluster::slot::slot_prefix;
use tucana_cluster::SLOTS;

/// How often the sweeper looks for due keys.
pub const TICK: Duration = Duration::from_millis(100);
/// Keys deleted by one engine batch, under one hold of the write lock.
pub const BATCH_KEYS: usize = 64;
/// Batches per database per tick.
pub const BATCHES_PER_TICK: usize = 4;
/// Cluster mode: hash slots whose index is looked at per tick.
pub const SLOTS_PER_TICK: u16 = 1024;

/// Sweeps until the server shuts down; each tick also lets the collector of old
/// collection versions walk a little further in each database (`collector`).
pub async fn run(state: Arc<ServerState>, mut shutdown: watch::Receiver<bool>) {
    let mut next_hash_slot = 0u16;
    let cursors: Arc<parking_lot::Mutex<HashMap<String, Cursor>>> = Arc::default();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(TICK) => {}
            _ = stopped(&mut shutdown) => return,
        }
        let state = state.clone();
        let first = next_hash_slot;
        next_hash_slot = ((u32::from(first) + u32::from(SLOTS_PER_TICK)) % u32::from(SLOTS)) as u16;
        let cursors = cursors.clone();
        let _ = tokio::task::spawn_blocking(move || {
            let mut cursors = cursors.lock();
            // `DEBUG SET-ACTIVE-EXPIRE 0` stops the deletions, not the collector.
            let active = state.settings.active_expire();
            if let Some(cluster) = &state.cluster {
                if active {
                    sweep_regions(&state, first);
                }
                for (_, slot) in cluster.led_regions(&state.store.db) {
                    collect_garbage(&slot, &mut cursors, true);
                }
            } else {
                for slot in state.store.slots() {
                    if active {
                        state.metrics.count_expired(sweep_keys(&state, slot, &[]));
                    }
                    collect_garbage(slot, &mut cursors, false);
                }
            }
        })
        .await;
    }
}

/// One step of the collector of old versions in `slot`.
fn collect_garbage(slot: &Slot, cursors: &mut HashMap<String, Cursor>, slot_prefixed: bool) {
    let cursor = cursors.entry(slot.name().to_string()).or_default();
    if let Err(e) = collector::collect(slot, cursor, slot_prefixed) {
        // A damaged record or a fenced keyspace: the walk starts over next time.
        eprintln!(
            "tucana serve: collection of old versions in {}: {e}",
            slot.name()
        );
        *cursor = Cursor::default();
    }
}

/// Cluster mode: hash slots `first..first + SLOTS_PER_TICK` of the regions led here.
fn sweep_regions(state: &ServerState, first: u16) {
    let metrics = &state.metrics;
    let Some(cluster) = &state.cluster else {
        return;
    };
    let last = first.saturating_add(SLOTS_PER_TICK - 1).min(SLOTS - 1);
    for (range, slot) in cluster.led_regions(&state.store.db) {
        for hash_slot in range.start.max(first)..=range.end.min(last) {
            metrics.count_expired(sweep_keys(state, &slot, &slot_prefix(hash_slot)));
        }
    }
}

/// Up to `BATCHES_PER_TICK` batches of the keys under `prefix` in `slot`; the number of
/// keys deleted. Each raises `expired` when that notification is on.
fn sweep_keys(state: &ServerState, slot: &Slot, prefix: &[u8]) -> u64 {
    let mut deleted = 0;
    if !slot.may_expire() {
        return deleted;
    }
    let flags = state.settings.notify_flags();
    let mut notify = |key: &[u8]| {
        if crate::notify::wants(flags, crate::notify::EXPIRED) {
            state.notify(flags, slot.index(), "expired", key);
        }
    };
    for _ in 0..BATCHES_PER_TICK {
        match sweep(slot, prefix, now_ms(), BATCH_KEYS, &mut notify) {
            Ok((handled, keys)) => {
                deleted += keys as u64;
                if handled < BATCH_KEYS {
                    break;
                }
            }
            Err(e) => {
                // A keyspace this server no longer writes (fenced) or a damaged
                // record: lazy expiry still hides the keys.
                eprintln!("tucana serve: expiry sweep of {}: {e}", slot.name());
                break;
            }
        }
    }
    deleted
}

/// Deletes up to `max` keys of `slot` under `prefix` (a hash slot's in cluster mode, else
/// empty) due at `now_ms`: the number of index entries handled (due keys, and stale
/// entries) and of keys deleted. `expired` is told each deleted key (the client's, without
/// `prefix`) once the batch is applied, still under the write lock.
pub fn sweep(
    slot: &Slot,
    prefix: &[u8],
    now_ms: u64,
    max: usize,
    expired: &mut dyn FnMut(&[u8]),
) -> tucana::Result<(usize, usize)> {
    let Some(ks) = slot.existing() else {
        return Ok((0, 0));
    };
    let prefixed = |key: &[u8]| [prefix, key].concat();
    let mut due = Vec::new();
    for item in ks.prefix(&prefixed(&index_prefix())) {
        let (stored, _) = item?;
        let (deadline_ms, key) = split_index_key(&stored[prefix.len()..])?;
        // A key is live at its deadline itself.
        if deadline_ms >= now_ms || due.len() == max {
            break;
        }
        due.push((deadline_ms, key.to_vec()));
    }
    if due.is_empty() {
        return Ok((0, 0));
    }
    let guard = slot.lock_writes();
    let Some(ks) = guard.existing() else {
        return Ok((0, 0));
    };
    let mut batch = ks.batch();
    let mut deleted = Vec::new();
    for (deadline_ms, key) in &due {
        let record = prefixed(&deadline_key(key));
        let current = ks.get(&record)?.map(|d| decode_deadline(&d)).transpose()?;
        // Re-checked under the lock: a write since the read moved or dropped the deadline.
        if current == Some(*deadline_ms) {
            deleted.push(prefixed(key));
            batch.delete(&prefixed(key));
            batch.delete(&record);
        }
        batch.delete(&prefixed(&index_key(*deadline_ms, key)));
    }
    batch.commit_with(Durability::Buffered)?;
    if !deleted.is_empty() {
        // An expired collection's sub-records stay, for the collector.
        guard.note_abandoned();
    }
    // An expired key that is deleted is modified, for WATCH (stored keys: the prefix is
    // part of them).
    guard.modified(deleted.iter().map(Vec::as_slice), false);
    for key in &deleted {
        expired(&key[prefix.len()..]);
    }
    Ok((due.len(), deleted.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::expiry::{encode_deadline, MARKER};

    /// Writes `prefix key` with deadline `deadline_ms`, as the handlers lay it out.
    fn put_expiring(slot: &Slot, db: &tucana::Database, prefix: &[u8], key: &[u8], d: u64) {
        let guard = slot.lock_writes();
        let ks = guard.keyspace(db).unwrap();
        let mut batch = ks.batch();
        batch.put(&[prefix, key].concat(), b"v");
        batch.put(&[prefix, &deadline_key(key)].concat(), &encode_deadline(d));
        batch.put(&[prefix, &index_key(d, key)].concat(), b"");
        batch.put(MARKER, b"");
        batch.commit().unwrap();
        guard.set_may_expire();
    }

    #[test]
    fn due_keys_go_with_their_records_and_later_ones_stay() {
        let db = tucana::Database::builder().open_in_memory().unwrap();
        for prefix in [&b""[..], &[0, 7]] {
            let slot = Slot::named(&db, format!("sweep{}", prefix.len()));
            put_expiring(&slot, &db, prefix, b"old", 10);
            put_expiring(&slot, &db, prefix, b"new", 1000);
            let mut told = Vec::new();
            let mut tell = |key: &[u8]| told.push(key.to_vec());
            assert_eq!(sweep(&slot, prefix, 500, 64, &mut tell).unwrap(), (1, 1));
            assert_eq!(told, [b"old".to_vec()], "the client's key, told once");
            let ks = slot.existing().unwrap();
            assert_eq!(ks.get(&[prefix, b"old"].concat()).unwrap(), None);
            assert!(ks.get(&[prefix, b"new"].concat()).unwrap().is_some());
            // Left: `new`, its two records and the marker.
            assert_eq!(ks.len(), 4);
            assert_eq!(sweep(&slot, prefix, 500, 64, &mut |_| {}).unwrap(), (0, 0));
            // Bounded: one key per call.
            put_expiring(&slot, &db, prefix, b"a", 20);
            put_expiring(&slot, &db, prefix, b"b", 30);
            assert_eq!(sweep(&slot, prefix, 500, 1, &mut |_| {}).unwrap(), (1, 1));
            assert_eq!(sweep(&slot, prefix, 500, 1, &mut |_| {}).unwrap(), (1, 1));
            assert_eq!(ks.len(), 4);
        }
    }
}
