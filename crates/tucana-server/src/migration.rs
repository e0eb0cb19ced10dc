//! Slot migration, the source's side (DESIGN.md, "Slot migration"): when the map says a
//! range of a region this server leads is moving into a new region, a migrator copies
//! the range's stored pairs to the target's primary in batches (`TUCANA.IMPORT`, over
//! the client port), deletes each batch here once the target acknowledged it, and
//! finishes the migration in etcd (a CAS) when the range is empty. Also the questions
//! routing asks about a slot under migration (`slot_state`, `importing_here`), and the
//! layout of tombstones (`tombstone_key`).
//!
//! A batch, step by step: under the region's write lock, read up to `migrate_batch`
//! stored pairs of the range (a key with its deadline and index records, so a key never
//! arrives without its deadline) and mark their keys in flight; release the lock; send
//! them and wait for `+OK` (the target answers after its own sync and its backups'
//! acknowledgement); under the lock delete them here; wait until the deletion is synced
//! and acknowledged by this region's backups; then clear the in-flight mark. A command
//! touching a key in flight answers `TRYAGAIN`, so no client sees a key absent here (and
//! is sent to the target) before its deletion is as durable as a write: a promoted
//! backup of this region never holds a key the target took writes for.
//!
//! Owns: the migrator tasks and the import's client connection. Does not own: the
//! in-flight set (`in_flight`, marked and cleared here), the map's changes
//! (`tucana_cluster::map::migration`), the answers to clients and the target's side
//! (`commands::migrating`, with `TUCANA.IMPORT`).
//!
//! Thread-safety: one supervising task on the listener's runtime and one task per
//! migrating region; engine work and the blocking socket run on tokio's blocking pool.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, BufRead, BufReader, Write};
use std::net::TcpStream;
use std::ops::Bound;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tucana::Durability;
use tucana_cluster::slot::slot_prefix;
use tucana_cluster::{Error, Migration, RegionId, SlotRange, Store, SLOTS};

use crate::cluster::{region_keyspace_name, Cluster, Route};
use crate::config::DurabilityMode;
use crate::expiry::{deadline_key, decode_deadline, index_key, split_index_key, RESERVED};
use crate::state::{stopped, ServerState};
use crate::store::Slot;
use crate::types::{kind_of, split_sub_key, sub_prefix, Family};

/// How often the supervisor looks for migrations, and how long a failed step waits.
const TICK: Duration = Duration::from_millis(200);
/// How long the migrator waits for the target's answer to one batch.
const IMPORT_TIMEOUT: Duration = Duration::from_secs(30);

/// A slot's state for a request routed to region `region` of this server, read from the
/// current view (callers that write ask under the region's write lock: the migrator
/// deletes only under it, after the view showed the migration).
pub enum SlotState {
    /// The region owns the slot and nothing moves it.
    Owned,
    /// The region owns the slot and is moving it into region `target`.
    Migrating { target: RegionId },
    /// `region` is a migration's target importing the slot (reached after `ASKING`).
    Importing,
    /// The slot is no longer the region's here: the reply to give instead.
    Gone(String),
}

pub fn slot_state(cluster: &Cluster, hash_slot: u16, region: RegionId) -> SlotState {
    let view = cluster.view();
    let Some(map) = &view.map else {
        return SlotState::Gone("CLUSTERDOWN Hash slot not served".into());
    };
    if let Some(r) = map.region_of_slot(hash_slot) {
        if r.id == region && r.primary == cluster.id {
            if cluster.draining(region) {
                return SlotState::Gone(
                    "TRYAGAIN a planned failover of this slot is in progress; retry".into(),
                );
            }
            return match map.migration_of_slot(hash_slot) {
                Some(m) if m.source == region => SlotState::Migrating {
                    target: m.target.id,
                },
                _ => SlotState::Owned,
            };
        }
    }
    if let Some(m) = map.migration_of_slot(hash_slot) {
        if m.target.id == region && m.target.primary == cluster.id {
            return SlotState::Importing;
        }
    }
    SlotState::Gone(match cluster.route(hash_slot) {
        Route::Moved(addr) => format!("MOVED {hash_slot} {addr}"),
        // Moved to another region of this server (a split finished): a retry routes it.
        Route::Here(_) => "TRYAGAIN the slot moved to another region; retry".into(),
        Route::Down => "CLUSTERDOWN Hash slot not served".into(),
    })
}

/// The migration target this server leads that imports `hash_slot`, if any: where a
/// command after `ASKING` runs.
pub fn importing_here(cluster: &Cluster, hash_slot: u16) -> Option<RegionId> {
    let view = cluster.view();
    let m = view.map.as_ref()?.migration_of_slot(hash_slot)?;
    (m.target.primary == cluster.id && !cluster.is_unpromoted(m.target.id)).then_some(m.target.id)
}

/// `ASK <slot> <addr>` to region `target`'s primary, or `CLUSTERDOWN` if its address is
/// unknown.
pub fn ask(cluster: &Cluster, hash_slot: u16, target: RegionId) -> String {
    let view = cluster.view();
    let addr = view
        .map
        .as_ref()
        .and_then(|m| m.region(target))
        .and_then(|r| view.client_addr(&r.primary));
    match addr {
        Some(addr) => format!("ASK {hash_slot} {addr}"),
        None => "CLUSTERDOWN Hash slot not served".into(),
    }
}

/// Starts a migrator for each migration out of a region this server leads, for as
/// long as it runs; ends at shutdown.
pub async fn run(state: Arc<ServerState>, mut shutdown: watch::Receiver<bool>) {
    let Some(cluster) = state.cluster.clone() else {
        return;
    };
    let mut running: HashMap<(RegionId, RegionId), JoinHandle<()>> = HashMap::new();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(TICK) => {}
            _ = stopped(&mut shutdown) => {
                for (_, task) in running.drain() {
                    task.abort();
                }
                return;
            }
        }
        running.retain(|_, task| !task.is_finished());
        for m in leading_migrations(&cluster) {
            running
                .entry((m.source, m.target.id))
                .or_insert_with(|| tokio::spawn(migrate(state.clone(), m.source, m.target.id)));
        }
    }
}

/// The migrations out of regions this server leads and serves now.
fn leading_migrations(cluster: &Cluster) -> Vec<Migration> {
    let view = cluster.view();
    let Some(map) = &view.map else {
        return Vec::new();
    };
    map.migrations
        .iter()
        .filter(|m| matches!(cluster.route(m.target.slots.start), Route::Here(r) if r == m.source))
        .cloned()
        .collect()
}

/// The migration `source` → `target` as the current view has it, if this server still
/// leads its source.
fn current(cluster: &Cluster, source: RegionId, target: RegionId) -> Option<Migration> {
    leading_migrations(cluster)
        .into_iter()
        .find(|m| m.source == source && m.target.id == target)
}

/// One migration, batch after batch, until it is finished (or no longer this server's).
async fn migrate(state: Arc<ServerState>, source: RegionId, target: RegionId) {
    let Some(cluster) = state.cluster.clone() else {
        return;
    };
    eprintln!("tucana serve: migrating slots of region {source} into region {target}");
    let mut conn: Option<Importer> = None;
    let mut moved = 0usize;
    loop {
        let Some(migration) = current(&cluster, source, target) else {
            cluster.in_flight.clear(source);
            eprintln!(
                "tucana serve: migration of region {source} into {target} is no longer ours ({moved} pairs moved here)"
            );
            return;
        };
        let st = state.clone();
        let mut taken = conn.take();
        let step = tokio::task::spawn_blocking(move || {
            let result = step(&st, &migration, &mut taken);
            (result, taken)
        })
        .await;
        let result = match step {
            Ok((result, back)) => {
                conn = back;
                result
            }
            Err(e) => Err(format!("the batch's thread failed: {e}")),
        };
        match result {
            Ok(Some(n)) => {
                moved += n;
                let pause = cluster.config().migrate_pause;
                if !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
            }
            Ok(None) => match finish(&cluster, source, target).await {
                Ok(()) => {
                    eprintln!(
                        "tucana serve: finished the migration of region {source} into {target} ({moved} pairs moved)"
                    );
                    // The view changes soon; `current` then ends this task.
                    tokio::time::sleep(TICK).await;
                }
                Err(e) => {
                    eprintln!("tucana serve: cannot finish migration into {target}: {e}");
                    tokio::time::sleep(TICK).await;
                }
            },
            Err(e) => {
                eprintln!("tucana serve: migration into region {target}: {e}");
                conn = None;
                tokio::time::sleep(TICK).await;
            }
        }
    }
}

/// Writes the map with the migration finished, if it still runs and this server still
/// leads its source.
async fn finish(
    cluster: &Cluster,
    source: RegionId,
    target: RegionId,
) -> tucana_cluster::Result<()> {
    let config = cluster.config();
    let store = Store::connect(&config.etcd, &config.name).await?;
    loop {
        let Some((map, revision)) = store.map().await? else {
            return Ok(());
        };
        let ours = map
            .migration_from(source)
            .is_some_and(|m| m.target.id == target)
            && map.region(source).is_some_and(|r| r.primary == cluster.id);
        if !ours {
            return Ok(());
        }
        let finished = map.finish_migration(source)?;
        match store.update_map(revision, &finished).await {
            Ok(_) => return Ok(()),
            Err(Error::Conflict { .. }) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Stored keys of slots `range`.
fn bounds(range: SlotRange) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    let lo = Bound::Included(slot_prefix(range.start).to_vec());
    let hi = if range.end + 1 >= SLOTS {
        Bound::Unbounded
    } else {
        Bound::Excluded(slot_prefix(range.end + 1).to_vec())
    };
    (lo, hi)
}

/// The tombstone of `key` (a client's key): written with the key's deletion on a
/// migrating slot's source, so the key counts as here (absent) until the tombstone has
/// deleted any copy of it at the target (see DESIGN.md, "Slot migration").
pub fn tombstone_key(key: &[u8]) -> Vec<u8> {
    [RESERVED, b"t", key].concat()
}

/// The client's key a tombstone (without its 2-byte slot) is of.
pub fn tombstone_of(rest: &[u8]) -> Option<&[u8]> {
    rest.strip_prefix(RESERVED)?.strip_prefix(b"t")
}

/// The client's key a stored key (without its 2-byte slot) belongs to: itself, or the
/// key of a deadline record, index entry or tombstone; `None` for another reserved
/// record.
fn owner_key(rest: &[u8]) -> Option<Vec<u8>> {
    let Some(reserved) = rest.strip_prefix(RESERVED) else {
        return Some(rest.to_vec());
    };
    match reserved.first() {
        Some(b'd' | b't') => Some(reserved[1..].to_vec()),
        Some(b'i') => split_index_key(rest).ok().map(|(_, key)| key.to_vec()),
        _ => match split_sub_key(rest) {
            // A collection's field, member or element.
            Ok(Some((_, key, _, _))) => Some(key.to_vec()),
            _ => None,
        },
    }
}

/// Adds to `copy` the client's key `key` (stored under the 2-byte `prefix`) with `value`,
/// and what travels with it: its deadline record and index entry, and, for a collection,
/// every sub-record of it (all versions: old ones are the collector's garbage on either
/// side). So a collection moves whole in one batch, never half here and half there. A
/// packed hash is all in its value (a walk finds only old versions' garbage, if any).
fn add_key(
    ks: &tucana::Keyspace,
    prefix: &[u8],
    key: &[u8],
    value: Vec<u8>,
    copy: &mut BTreeMap<Vec<u8>, Vec<u8>>,
) -> tucana::Result<()> {
    if let Some(kind) = kind_of(&value) {
        for &family in Family::of(kind) {
            // `sub_prefix` without its 8 version bytes: every version of the key.
            let mut all = sub_prefix(family, key, 0);
            all.truncate(all.len() - 8);
            let from = [prefix, &all].concat();
            for item in ks.range::<Vec<u8>, _>(from.clone()..) {
                let (stored, sub) = item?;
                if !stored.starts_with(&from) {
                    break;
                }
                copy.insert(stored, sub);
            }
        }
    }
    copy.insert([prefix, key].concat(), value);
    let deadline_stored = [prefix, &deadline_key(key)].concat();
    if let Some(d) = ks.get(&deadline_stored)? {
        if let Ok(deadline) = decode_deadline(&d) {
            let index_stored = [prefix, &index_key(deadline, key)].concat();
            if let Some(i) = ks.get(&index_stored)? {
                copy.insert(index_stored, i);
            }
        }
        copy.insert(deadline_stored, d);
    }
    Ok(())
}

/// One batch of `migration` (see the module doc): `Some(n)` pairs moved (0: only
/// records of absent keys were dropped), `None` when the range is empty here.
fn step(
    state: &ServerState,
    migration: &Migration,
    conn: &mut Option<Importer>,
) -> Result<Option<usize>, String> {
    let cluster = state.cluster.as_ref().expect("cluster mode");
    let source = migration.source;
    let region = cluster.region(&state.store.db, source);
    let Some(pairs) = collect(cluster, migration, &region).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    if pairs.is_empty() {
        return Ok(Some(0));
    }
    let moved = send(state, migration, conn, &pairs)
        .and_then(|()| delete_moved(state, migration, &region, &pairs));
    cluster.in_flight.clear(source);
    moved.map(|()| Some(pairs.len()))
}

/// Under the region's write lock: the next batch of the range (a key with its deadline
/// and index records, a collection with all its sub-records: `add_key`), marked in
/// flight; records of keys not here are deleted. `None`
/// when the range is empty.
fn collect(
    cluster: &Cluster,
    migration: &Migration,
    region: &Slot,
) -> tucana::Result<Option<BTreeMap<Vec<u8>, Vec<u8>>>> {
    let source = migration.source;
    let batch_size = cluster.config().migrate_batch.max(1);
    let guard = region.lock_writes();
    if !matches!(
        slot_state(cluster, migration.target.slots.start, source),
        SlotState::Migrating { target } if target == migration.target.id
    ) {
        // The view changed: the task's next look at it decides.
        return Ok(Some(BTreeMap::new()));
    }
    let Some(ks) = guard.existing() else {
        return Ok(None);
    };
    let mut copy: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut orphans: Vec<Vec<u8>> = Vec::new();
    for item in ks.range::<Vec<u8>, _>(bounds(migration.target.slots)) {
        if copy.len() >= batch_size {
            break;
        }
        let (stored, value) = item?;
        if copy.contains_key(&stored) || stored.len() < 2 {
            continue;
        }
        let prefix = &stored[..2];
        let Some(key) = owner_key(&stored[2..]) else {
            copy.insert(stored, value);
            continue;
        };
        let key_stored = [prefix, &key].concat();
        let Some(v) = ks.get(&key_stored)? else {
            let tombstone = [prefix, &tombstone_key(&key)].concat();
            if let Some(t) = ks.get(&tombstone)? {
                // Deleted here during the migration: the target deletes its copy.
                copy.insert(tombstone, t);
            } else {
                // A deadline or index record of a key that is not here: nothing to move.
                orphans.push(stored);
            }
            continue;
        };
        add_key(&ks, prefix, &key, v, &mut copy)?;
    }
    if copy.is_empty() && orphans.is_empty() {
        return Ok(None);
    }
    if !orphans.is_empty() {
        let mut batch = ks.batch();
        for key in &orphans {
            batch.delete(key);
        }
        batch.commit_with(Durability::Buffered)?;
    }
    cluster.in_flight.insert(source, copy.keys().cloned());
    Ok(Some(copy))
}

/// The target has `pairs` (as durably as a write): deletes them here under the lock,
/// then waits until the deletion is synced and acknowledged by the region's backups
/// (with sync durability), the keys still in flight meanwhile.
fn delete_moved(
    state: &ServerState,
    migration: &Migration,
    region: &Slot,
    pairs: &BTreeMap<Vec<u8>, Vec<u8>>,
) -> Result<(), String> {
    let cluster = state.cluster.as_ref().expect("cluster mode");
    let ks = {
        let guard = region.lock_writes();
        let ks = guard
            .existing()
            .ok_or_else(|| "the source keyspace went away".to_owned())?;
        let mut batch = ks.batch();
        for key in pairs.keys() {
            batch.delete(key);
        }
        batch
            .commit_with(Durability::Buffered)
            .map_err(|e| e.to_string())?;
        guard.note_abandoned();
        guard.modified(pairs.keys().map(Vec::as_slice), true);
        ks
    };
    if state.config.durability != DurabilityMode::Sync {
        return Ok(());
    }
    let name = region_keyspace_name(migration.source);
    let position = ks.log_position();
    loop {
        let synced = state
            .store
            .db
            .sync()
            .map_err(|e| e.to_string())
            .and_then(|()| match &state.replication {
                Some(r) => r.wait_acked(&name, position),
                None => Ok(()),
            });
        match synced {
            Ok(()) => return Ok(()),
            // No longer the source's primary: its successor decides.
            Err(_) if current(cluster, migration.source, migration.target.id).is_none() => {
                return Ok(())
            }
            Err(e) => {
                eprintln!(
                    "tucana serve: migration: deletion of a moved batch not yet durable: {e}"
                );
                std::thread::sleep(TICK);
            }
        }
    }
}

/// Sends `pairs` to the target's primary and waits for its `+OK`.
fn send(
    state: &ServerState,
    migration: &Migration,
    conn: &mut Option<Importer>,
    pairs: &BTreeMap<Vec<u8>, Vec<u8>>,
) -> Result<(), String> {
    let cluster = state.cluster.as_ref().expect("cluster mode");
    let addr = {
        let view = cluster.view();
        view.client_addr(&migration.target.primary)
            .map(str::to_owned)
            .ok_or_else(|| format!("no address for {}", migration.target.primary))?
    };
    if conn.as_ref().is_none_or(|c| c.addr != addr) {
        *conn = Some(
            Importer::connect(&addr, state.config.requirepass.as_deref())
                .map_err(|e| format!("cannot reach the target {addr}: {e}"))?,
        );
    }
    let importer = conn.as_mut().expect("connected above");
    let mut args: Vec<&[u8]> = Vec::with_capacity(3 + 2 * pairs.len());
    let id = migration.target.id.to_string();
    let epoch = migration.target.epoch.to_string();
    args.extend([&b"TUCANA.IMPORT"[..], id.as_bytes(), epoch.as_bytes()]);
    for (k, v) in pairs {
        args.push(k);
        args.push(v);
    }
    match importer.call(&args) {
        Ok(line) if line.starts_with('+') => Ok(()),
        Ok(line) => Err(format!(
            "the target {addr} refused the batch: {}",
            line.trim()
        )),
        Err(e) => {
            *conn = None;
            Err(format!("sending to the target {addr}: {e}"))
        }
    }
}

/// A blocking RESP connection to a target's primary, for `TUCANA.IMPORT` (and `AUTH`).
struct Importer {
    addr: String,
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Importer {
    fn connect(addr: &str, password: Option<&str>) -> io::Result<Importer> {
        let writer = TcpStream::connect(addr)?;
        writer.set_read_timeout(Some(IMPORT_TIMEOUT))?;
        writer.set_nodelay(true)?;
        let mut importer = Importer {
            addr: addr.to_owned(),
            reader: BufReader::new(writer.try_clone()?),
            writer,
        };
        if let Some(password) = password {
            let line = importer.call(&[b"AUTH", password.as_bytes()])?;
            if !line.starts_with('+') {
                return Err(io::Error::other(format!("AUTH refused: {}", line.trim())));
            }
        }
        Ok(importer)
    }

    /// Sends one command; its reply's first line (`+...` or `-...`; other replies are
    /// not expected from the commands sent).
    fn call(&mut self, args: &[&[u8]]) -> io::Result<String> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
        self.writer.write_all(&out)?;
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the target closed the connection",
            ));
        }
        Ok(line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_belong_to_their_key() {
        assert_eq!(owner_key(b"user"), Some(b"user".to_vec()));
        assert_eq!(owner_key(&deadline_key(b"k")), Some(b"k".to_vec()));
        assert_eq!(owner_key(&index_key(42, b"k")), Some(b"k".to_vec()));
        assert_eq!(owner_key(&tombstone_key(b"k")), Some(b"k".to_vec()));
        assert_eq!(tombstone_of(&tombstone_key(b"k")), Some(&b"k"[..]));
        assert_eq!(tombstone_of(b"k"), None);
        let mut other = RESERVED.to_vec();
        other.push(b'z');
        assert_eq!(owner_key(&other), None);
    }
}
