//! Commands on slots under migration, as Redis Cluster answers them (DESIGN.md, "Slot
//! migration"), and the two commands of the protocol: `ASKING` (the next command may
//! run on a slot this server imports) and `TUCANA.IMPORT` (a source's batch of stored
//! pairs for a migration's target).
//!
//! On the source, a command on a migrating slot runs under the region's write lock,
//! reads included: if all its keys are here it runs here; if none is, `-ASK <slot>
//! <target>`; if some are, or one is being copied right now, `-TRYAGAIN`. On the target,
//! after `ASKING`, a command with several keys runs only if all are there (else
//! `TRYAGAIN`). Any command whose slot changed hands between routing and its lock gets
//! the reply the new map calls for (`MOVED`, `TRYAGAIN`).
//!
//! Owns: those answers and the two commands. Does not own: routing (`routing`), the map,
//! the migrator (`crate::migration`).
//!
//! Thread-safety: as the other handlers; the write lock of the region orders a command
//! with the migrator's batches.

use tucana::Durability;
use tucana_cluster::{split_storage_key, storage_key, RegionId};

use crate::expiry::{deadline_key, decode_deadline, index_key};
use crate::expiry::{is_reserved, MARKER};
use crate::migration::{ask, slot_state, tombstone_key, tombstone_of, SlotState};
use crate::resp::Reply;
use crate::store::Slot;

use super::kv::{Bounds, Kv, LockedKv, Ops, Pairs, ReadKv};
use super::routing::{keys, Routed};
use super::table::{KvFn, Spec};
use super::{parse_i64, run_kv, wrong_args, Call};

/// `ASKING`: the next command may run on a slot this server is importing.
pub(super) fn cmd_asking(call: &mut Call<'_>, _args: &[Vec<u8>]) -> tucana::Result<Reply> {
    if call.state.cluster.is_none() {
        return Ok(Reply::error(
            "ERR This instance has cluster support disabled",
        ));
    }
    call.session.asking = true;
    Ok(Reply::Ok)
}

/// Runs a string command routed to `region` (a region of this server, or a migration
/// target after `ASKING`), as the slot's migration state asks (see the module doc).
pub(super) fn run_routed(
    call: &mut Call<'_>,
    spec: &Spec,
    f: KvFn,
    write: bool,
    args: &[Vec<u8>],
    routed: Routed,
    region: &Slot,
) -> tucana::Result<Reply> {
    let state = call.state;
    let cluster = state.cluster.as_ref().expect("routed in cluster mode");
    let hash_slot = routed.hash_slot;
    if !write
        && matches!(
            slot_state(cluster, hash_slot, routed.region),
            SlotState::Owned
        )
    {
        // A read without the lock, kept only if no migration of the slot began meanwhile
        // (the migrator deletes only after its view showed the migration).
        let reply = region.read(|ks| {
            let mut kv = ReadKv {
                ks,
                state,
                may_expire: region.may_expire(),
                misses_of: Some(0),
            };
            run_kv(f, &mut kv, Some(hash_slot), args)
        })?;
        if matches!(
            slot_state(cluster, hash_slot, routed.region),
            SlotState::Owned
        ) {
            return Ok(reply);
        }
    }
    let mut kv = LockedKv::new(region.lock_writes(), state);
    let stored = |key: &[u8]| storage_key(hash_slot, key);
    let present = |kv: &LockedKv<'_>, key: &[u8]| -> tucana::Result<bool> {
        match kv.guard.existing() {
            Some(ks) => Ok(ks.get_with(&stored(key), |_| ())?.is_some()),
            None => Ok(false),
        }
    };
    // A key deleted here during the migration (its tombstone not yet sent) is still
    // here, absent.
    let here = |kv: &LockedKv<'_>, key: &[u8]| -> tucana::Result<bool> {
        if present(kv, key)? {
            return Ok(true);
        }
        match kv.guard.existing() {
            Some(ks) => Ok(ks
                .get_with(&storage_key(hash_slot, &tombstone_key(key)), |_| ())?
                .is_some()),
            None => Ok(false),
        }
    };
    let mut migrating = false;
    match slot_state(cluster, hash_slot, routed.region) {
        SlotState::Owned => {}
        SlotState::Gone(reply) => return Ok(Reply::error(reply)),
        SlotState::Importing => {
            let mut all = true;
            let mut count = 0;
            for key in keys(spec, args) {
                count += 1;
                all &= present(&kv, key)?;
            }
            if count > 1 && !all {
                return Ok(tryagain());
            }
        }
        SlotState::Migrating { target } => {
            let (mut found, mut away) = (0, 0);
            for key in keys(spec, args) {
                // The key, or its tombstone, is being sent: wait until its deletion here
                // is durable (else a promoted backup could hold a tombstone the target
                // already applied, and delete a write the target took since).
                let in_flight =
                    |stored: Vec<u8>| cluster.in_flight.contains(routed.region, &stored);
                if in_flight(stored(key)) || in_flight(stored(&tombstone_key(key))) {
                    return Ok(tryagain());
                }
                if here(&kv, key)? {
                    found += 1;
                } else {
                    away += 1;
                }
            }
            if away > 0 && found > 0 {
                return Ok(tryagain());
            }
            if away > 0 {
                return Ok(Reply::error(ask(cluster, hash_slot, target)));
            }
            migrating = true;
        }
    }
    let reply = if migrating {
        run_kv(
            f,
            &mut Tombstoning { inner: &mut kv },
            Some(hash_slot),
            args,
        )
    } else {
        run_kv(f, &mut kv, Some(hash_slot), args)
    };
    call.wrote |= kv.wrote;
    if kv.wrote {
        call.session.wrote_to(region.name());
    }
    reply
}

/// Whether `EXEC` may run its transaction on `hash_slot` in `region` now (called under
/// the region's write lock): only on a slot no migration moves; else the reply.
pub(super) fn exec_refusal(call: &Call<'_>, hash_slot: u16, region: RegionId) -> Option<Reply> {
    let cluster = call.state.cluster.as_ref()?;
    match slot_state(cluster, hash_slot, region) {
        SlotState::Owned => None,
        SlotState::Gone(reply) => Some(Reply::error(reply)),
        SlotState::Migrating { .. } | SlotState::Importing => Some(tryagain()),
    }
}

/// The store of a command on a migrating slot's source: each deletion of a client's key
/// also writes its tombstone, each put removes it, in the same atomic batch (see
/// `migration::tombstone_key`). Keys reaching it are stored (slot-prefixed) keys.
struct Tombstoning<'k, 'a> {
    inner: &'k mut LockedKv<'a>,
}

impl Kv for Tombstoning<'_, '_> {
    fn settings(&self) -> &crate::settings::Settings {
        self.inner.settings()
    }

    fn get(&mut self, key: &[u8]) -> tucana::Result<Option<Vec<u8>>> {
        self.inner.get(key)
    }

    fn value_len(&mut self, key: &[u8]) -> tucana::Result<Option<usize>> {
        self.inner.value_len(key)
    }

    fn range(&mut self, bounds: Bounds, rev: bool, limit: usize) -> tucana::Result<Pairs> {
        self.inner.range(bounds, rev, limit)
    }

    fn apply(&mut self, mut ops: Ops) -> tucana::Result<()> {
        let mut tombstones = Vec::new();
        for (stored, value) in &ops {
            let Ok((slot, key)) = split_storage_key(stored) else {
                continue;
            };
            if is_reserved(key) {
                continue;
            }
            let tombstone = storage_key(slot, &tombstone_key(key));
            tombstones.push((tombstone, value.is_none().then(Vec::new)));
        }
        ops.extend(tombstones);
        self.inner.apply(ops)
    }

    fn multi_get(&mut self, keys: &[Vec<u8>]) -> tucana::Result<Vec<Option<Vec<u8>>>> {
        self.inner.multi_get(keys)
    }

    fn lookup(&mut self, key: &[u8]) -> tucana::Result<Option<Vec<u8>>> {
        self.inner.lookup(key)
    }

    fn count_lookup(&mut self, key: &[u8], hit: bool) {
        self.inner.count_lookup(key, hit);
    }

    fn may_expire(&self) -> bool {
        self.inner.may_expire()
    }

    fn note_deadline(&mut self) {
        self.inner.note_deadline();
    }

    fn note_abandoned(&mut self) {
        self.inner.note_abandoned();
    }

    fn touch(&mut self, key: &[u8]) {
        self.inner.touch(key);
    }
}

fn tryagain() -> Reply {
    Reply::error("TRYAGAIN Multiple keys request during rehashing of slot")
}

/// `TUCANA.IMPORT <region> <epoch> <stored-key> <value> ...`: a migration source's batch
/// for region `region`, which the map must name as a migration's target led here at
/// `epoch`; every key must be a stored key of the migrating slots. Written as one batch
/// (with the marker of deadlines if a deadline record comes); answered, as any write,
/// once synced and acknowledged by the region's backups.
pub(super) fn cmd_import(call: &mut Call<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let Some(cluster) = call.state.cluster.clone() else {
        return Ok(Reply::error(
            "ERR This instance has cluster support disabled",
        ));
    };
    if args.len() < 5 || !(args.len() - 3).is_multiple_of(2) {
        return Ok(wrong_args("tucana.import"));
    }
    let (Some(id), Some(epoch)) = (parse_i64(&args[1]), parse_i64(&args[2])) else {
        return Ok(Reply::error("ERR TUCANA.IMPORT: bad region id or epoch"));
    };
    let id = RegionId(id as u64);
    let range = {
        let view = cluster.view();
        let target = view
            .map
            .as_ref()
            .and_then(|m| m.migrations.iter().find(|m| m.target.id == id))
            .map(|m| &m.target);
        match target {
            Some(t) if t.primary == cluster.id && t.epoch == epoch as u64 => t.slots,
            Some(t) => {
                return Ok(Reply::error(format!(
                    "ERR TUCANA.IMPORT: region {id} is led by {} at epoch {}, not by this server at epoch {epoch}",
                    t.primary, t.epoch
                )))
            }
            None => {
                return Ok(Reply::error(format!(
                    "ERR TUCANA.IMPORT: region {id} is not a migration target in this server's map"
                )))
            }
        }
    };
    if cluster.is_unpromoted(id) {
        return Ok(Reply::error("CLUSTERDOWN Hash slot not served"));
    }
    let mut reserved = false;
    for pair in args[3..].chunks(2) {
        match split_storage_key(&pair[0]) {
            Ok((slot, key)) if range.contains(slot) => {
                reserved |= is_reserved(key) && tombstone_of(key).is_none();
            }
            _ => {
                return Ok(Reply::error(format!(
                    "ERR TUCANA.IMPORT: a key outside slots {range} of region {id}"
                )))
            }
        }
    }
    let db = &call.state.store.db;
    let region = cluster.region(db, id);
    let guard = region.lock_writes();
    let ks = guard.keyspace(db)?;
    let mut batch = ks.batch();
    for pair in args[3..].chunks(2) {
        let (slot, key) = split_storage_key(&pair[0]).expect("checked above");
        let Some(deleted) = tombstone_of(key) else {
            batch.put(&pair[0], &pair[1]);
            continue;
        };
        // The source deleted the key during the migration: so does the target, with its
        // deadline records (a copy may have come in a batch never acknowledged).
        let deadline = storage_key(slot, &deadline_key(deleted));
        if let Some(d) = ks.get(&deadline)? {
            if let Ok(at) = decode_deadline(&d) {
                batch.delete(&storage_key(slot, &index_key(at, deleted)));
            }
            batch.delete(&deadline);
        }
        batch.delete(&storage_key(slot, deleted));
    }
    let marking = reserved && !guard.may_expire();
    if marking {
        batch.put(MARKER, b"");
    }
    batch.commit_with(Durability::Buffered)?;
    if marking {
        guard.set_may_expire();
    }
    // Old versions come over with the live ones, and tombstones delete keys unread.
    guard.note_abandoned();
    let written: Vec<Vec<u8>> = args[3..]
        .chunks(2)
        .map(|p| match split_storage_key(&p[0]) {
            Ok((slot, key)) => {
                tombstone_of(key).map_or_else(|| p[0].clone(), |k| storage_key(slot, k))
            }
            Err(_) => p[0].clone(),
        })
        .collect();
    guard.modified(written.iter().map(Vec::as_slice), true);
    drop(guard);
    call.wrote = true;
    call.session.wrote_to(region.name());
    Ok(Reply::Ok)
}
