//! Transactions: MULTI opens a queue of commands in the `Session`, EXEC runs them under the
//! database's write lock with their writes in an overlay that becomes one atomic engine
//! batch, DISCARD forgets them.
//!
//! Owns the queue ([`Multi`]) and EXEC's all-or-nothing commit. Queueing itself (which
//! commands may be queued, and marking the transaction failed) is done as requests
//! arrive, by `execute` in `commands`.
//!
//! Thread-safety: EXEC holds the database's write lock for the whole transaction and
//! appends one engine batch; it is marked as a command that may block, so the connection
//! runs its batch on a thread that may (see `table::may_block`).

use std::collections::HashMap;

use crate::resp::{Args, Reply};

use super::kv::TxKv;
use super::routing::{crossslot, route_slot};
use super::table::{lookup, table, Run};
use super::{run_kv, unknown_command, Call};

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
        Some(_) => Ok(Reply::Ok),
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
                Some(cluster.region(&state.store.db, routed.region)),
                Some(hash_slot),
            ),
            Err(reply) => return Ok(reply),
        },
        _ => (None, None),
    };
    let slot = region.as_deref().unwrap_or_else(|| call.slot());
    let mut tx = TxKv {
        guard: slot.lock_writes(),
        state,
        overlay: HashMap::new(),
        deadline_noted: false,
    };
    let mut replies = Vec::with_capacity(multi.queued.len());
    for args in &multi.queued {
        let Some(index) = lookup(&args[0]) else {
            replies.push(unknown_command(args));
            continue;
        };
        state.metrics.count_command(index);
        let spec = &table()[index];
        let reply = match spec.run {
            // A failed command leaves no partial writes in the overlay: every handler
            // writes with one `apply`, after its reads, as its last step.
            Run::Read(f) | Run::Write(f) => run_kv(f, &mut tx, hash_slot, args)
                .unwrap_or_else(|e| Reply::error(format!("ERR {e}"))),
            Run::Other { f, .. } => {
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
    match tx.commit() {
        Ok(wrote) => call.wrote |= wrote,
        Err(e) => {
            return Ok(Reply::error(format!(
                "EXECABORT the transaction's batch failed, nothing was applied: {e}"
            )))
        }
    }
    Ok(Reply::Array(replies))
}
