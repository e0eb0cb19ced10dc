//! Transactions: MULTI opens a queue of commands in the `Session`, EXEC runs them under the
//! database's write lock with their writes in an overlay that becomes one atomic engine
//! batch, DISCARD forgets them. WATCH makes EXEC answer a null array if a watched key was
//! modified (written, deleted, expired) since, UNWATCH forgets the watches.
//!
//! Owns the queue ([`Multi`]), the connection's watches ([`Watched`], versions kept by
//! `watch`) and EXEC's all-or-nothing commit. Queueing itself (which
//! commands may be queued, and marking the transaction failed) is done as requests
//! arrive, by `execute` in `commands`.
//!
//! Thread-safety: EXEC holds the database's write lock for the whole transaction and
//! appends one engine batch; it is marked as a command that may block, so the connection
//! runs its batch on a thread that may (see `table::may_block`).

use crate::resp::{Args, Reply};

use super::expire::live_len;
use super::kv::{ReadKv, TxKv};
use super::routing::{crossslot, route_slot};
use super::table::{lookup, table, Run};
use super::{run_kv, unknown_command, Call};
use crate::watch::{Watch, WatchTable};

/// A key this connection watches, in database `db_index`.
#[derive(Debug)]
pub(super) struct Watched {
    db_index: u32,
    watch: Watch,
    /// The key was live at WATCH: if it is missing at EXEC without a write, it expired.
    existed: bool,
}

/// Whether `key` of database `db_index` is live now.
fn is_live(call: &Call<'_>, db_index: u32, key: &[u8]) -> tucana::Result<bool> {
    let state = call.state;
    let slot = state.store.slot(db_index);
    slot.read(|ks| {
        let may_expire = slot.may_expire();
        let mut kv = ReadKv {
            ks,
            state,
            may_expire,
            misses_of: None,
        };
        Ok(live_len(&mut kv, key)?.is_some())
    })
}

/// `WATCH key [key ...]`.
pub(super) fn cmd_watch(call: &mut Call<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    if call.session.multi.is_some() {
        return Ok(Reply::error("ERR WATCH inside MULTI is not allowed"));
    }
    if call.state.cluster.is_some() {
        return Ok(Reply::error(
            "ERR WATCH is not supported in cluster mode yet",
        ));
    }
    let db_index = call.session.db_index;
    for key in &args[1..] {
        let table = call.state.store.slot(db_index).watches();
        // Watch first, then look: a write in between moves the version.
        let watch = WatchTable::watch(table, key);
        let existed = is_live(call, db_index, key)?;
        call.session.watching.push(Watched {
            db_index,
            watch,
            existed,
        });
    }
    Ok(Reply::Ok)
}

/// `UNWATCH`.
pub(super) fn cmd_unwatch(call: &mut Call<'_>, _args: &[Vec<u8>]) -> tucana::Result<Reply> {
    call.session.watching.clear();
    Ok(Reply::Ok)
}

/// Whether a watched key was modified: written or deleted (its version moved), or
/// expired (live at WATCH, missing now without a write).
fn watched_modified(call: &Call<'_>, watching: &[Watched]) -> tucana::Result<bool> {
    for w in watching {
        if w.watch.modified() || (w.existed && !is_live(call, w.db_index, w.watch.key())?) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The queue of an open transaction (in the [`Session`](super::Session)).
#[derive(Debug, Default)]
pub(super) struct Multi {
    pub(super) queued: Vec<Args>,
    /// A command could not be queued: `EXEC` aborts (as Redis does).
    pub(super) failed: bool,
    /// Cluster mode: the hash slot of the queued commands' keys (all must share one).
    pub(super) hash_slot: Option<u16>,
    /// Cluster mode: queued commands' keys hash to different slots (`EXEC` refuses).
    pub(super) cross_slot: bool,
}

pub(super) fn cmd_multi(call: &mut Call<'_>, _args: &[Vec<u8>]) -> tucana::Result<Reply> {
    if call.session.multi.is_some() {
        return Ok(Reply::error("ERR MULTI calls can not be nested"));
    }
    call.session.multi = Some(Multi::default());
    Ok(Reply::Ok)
}

pub(super) fn cmd_discard(call: &mut Call<'_>, _args: &[Vec<u8>]) -> tucana::Result<Reply> {
    match call.session.multi.take() {
        Some(_) => {
            call.session.watching.clear();
            Ok(Reply::Ok)
        }
        None => Ok(Reply::error("ERR DISCARD without MULTI")),
    }
}

/// Runs the queued commands under the database's write lock; their writes become one
/// atomic engine batch (all or nothing, also across a crash). A command that fails at run
/// time (INCR of a non-number) answers an error in its place and writes nothing, as in
/// Redis; if the batch itself fails, nothing is applied and EXEC answers the error.
pub(super) fn cmd_exec(call: &mut Call<'_>, _args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let Some(multi) = call.session.multi.take() else {
        return Ok(Reply::error("ERR EXEC without MULTI"));
    };
    // EXEC unwatches whatever it answers; the watches are checked under the write lock.
    let watching = std::mem::take(&mut call.session.watching);
    if multi.failed {
        return Ok(Reply::error(
            "EXECABORT Transaction discarded because of previous errors.",
        ));
    }
    let state = call.state;
    // Cluster mode: the transaction runs in the region of its one hash slot.
    let (region, hash_slot) = match (&state.cluster, multi.hash_slot) {
        (Some(_), _) if multi.cross_slot => return Ok(crossslot()),
        (Some(cluster), Some(hash_slot)) => match route_slot(call, hash_slot) {
            Ok(routed) => (
                Some((
                    cluster.region(&state.store.db, routed.region),
                    routed.region,
                )),
                Some(hash_slot),
            ),
            Err(reply) => return Ok(reply),
        },
        _ => (None, None),
    };
    let slot = region
        .as_ref()
        .map_or_else(|| call.slot(), |(r, _)| r.as_ref());
    let mut tx = TxKv::new(slot.lock_writes(), state);
    // Cluster mode: no transaction on a slot a migration moves (checked under the lock,
    // which orders it with the migrator's batches).
    if let (Some((_, id)), Some(hash_slot)) = (&region, hash_slot) {
        if let Some(reply) = super::migrating::exec_refusal(call, hash_slot, *id) {
            return Ok(reply);
        }
    }
    if watched_modified(call, &watching)? {
        return Ok(Reply::NilArray);
    }
    drop(watching);
    let mut replies = Vec::with_capacity(multi.queued.len());
    // Pub/Sub replies inside EXEC leave queued messages where they are: EXEC's reply is
    // one array, with no room for messages in it.
    call.session.in_exec = true;
    for args in &multi.queued {
        let Some(index) = lookup(&args[0]) else {
            replies.push(unknown_command(args));
            continue;
        };
        state.metrics.count_command(index);
        let spec = &table()[index];
        let in_tx =
            super::tx_keys::run_in_transaction(spec.name, &mut tx, args, state.cluster.is_some());
        let reply = match (in_tx, spec.run) {
            (Some(result), _) => result.unwrap_or_else(|e| Reply::error(format!("ERR {e}"))),
            // A failed command leaves no partial writes in the overlay: every handler
            // writes with one `apply`, after its reads, as its last step.
            (None, Run::Read(f) | Run::Write(f)) => run_kv(f, &mut tx, hash_slot, args)
                .unwrap_or_else(|e| Reply::error(format!("ERR {e}"))),
            (None, Run::Other { f, .. }) => {
                let mut inner = Call {
                    state,
                    session: &mut *call.session,
                    wrote: false,
                };
                f(&mut inner, args).unwrap_or_else(|e| Reply::error(format!("ERR {e}")))
            }
        };
        replies.push(reply);
    }
    call.session.in_exec = false;
    match tx.commit() {
        Ok(wrote) => {
            call.wrote |= wrote;
            if wrote && region.is_some() {
                call.session.wrote_to(slot.name());
            } else if region.is_some() {
                call.session.read_from(slot.name());
            }
        }
        Err(e) => {
            return Ok(Reply::error(format!(
                "EXECABORT the transaction's batch failed, nothing was applied: {e}"
            )))
        }
    }
    // A subscription the transaction emptied goes now; its last messages follow.
    let mut after = Vec::new();
    super::pubsub::drop_if_empty(call.session, &mut after);
    if after.is_empty() {
        Ok(Reply::Array(replies))
    } else {
        Ok(Reply::Frames(vec![
            Reply::Array(replies),
            Reply::Encoded(after),
        ]))
    }
}
