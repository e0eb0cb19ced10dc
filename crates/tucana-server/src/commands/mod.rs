//! Command handlers: what each supported command does, on top of the engine's public API.
//!
//! Owns the command table (names, arities, flags), the per-connection [`Session`]
//! (protocol, selected database, authentication, `MULTI` queue) and the execution of a
//! pipelined batch of requests, including where the replies of its writes are, so that
//! in sync mode none is sent before the writes are durable. It owns no sockets and no
//! wire format beyond encoding replies (`resp`); when a batch is run and how its replies
//! reach the client is the connection's business (`connection`).
//!
//! Files, in the order a request meets them:
//! - `batch`: [`execute_batch`] runs a pipelined batch; runs of plain `GET key` and
//!   `SET key value` (most of a cache's traffic) take fast paths that answer exactly as
//!   the general path would, without building owned arguments or [`Reply`] values;
//!   `runs` runs consecutive collection writes (LPUSH, LPOP, ZADD, HSET, ...) under one
//!   hold of the write lock as one engine batch, each through its own handler;
//!   everything else goes through [`execute`] here (authentication, arity, `MULTI`
//!   queueing); before each window of a batch's requests runs, `prefetch` asks the
//!   engine for the records their keys name (larger than memory, their reads then
//!   overlap); `execute` finds the handler in
//! - `table`: the command table ([`table::Spec`]), lookup by name, and which commands
//!   may block;
//! - `kv`: the [`kv::Kv`] trait the string commands are written against, and its three
//!   stores: reads directly on the keyspace (no lock), writes under the database's write
//!   lock (see `store` for why), and inside `EXEC` (and a run of collection writes) an
//!   overlay whose writes become one atomic engine batch;
//! - `expire`: key deadlines as handlers see them (lazy expiry, the writes that keep a
//!   key's deadline records in step) and EXPIRE, PERSIST, TTL and their family;
//! - the handlers, by Redis's command groups: `strings` (GET, SET, INCR, ...),
//!   `string_edits` (GETRANGE, SETRANGE, SETBIT, BITCOUNT, LCS, INCRBYFLOAT), `moves`
//!   (RENAME, COPY, TOUCH), `sort` (SORT, SORT_RO), `memory` (MEMORY USAGE), the collection types (`hashes`, `sets`, `zsets`,
//!   `zset_algebra` for ZUNION/ZINTER/ZDIFF/ZRANGESTORE/ZRANDMEMBER, `lists`, `mpop` for
//!   LMPOP/ZMPOP, over `collection`), `keys`
//!   (SCAN, KEYS, TRANGE, TPREFIX, DBSIZE, FLUSHDB), `transaction` (MULTI, EXEC,
//!   DISCARD), `session` (the `Session` and the commands that read or change it: AUTH,
//!   HELLO, SELECT, CLIENT, QUIT, PING, ECHO), `admin` (COMMAND, CONFIG, TIME, SAVE,
//!   BGSAVE, BGREWRITEAOF, SHUTDOWN), `pubsub` (SUBSCRIBE, PUBLISH and the rest of
//!   Pub/Sub, and what a subscribed connection may run), `info` (INFO's text, from
//!   `metrics`' counters and the engine's `Stats`), `debug` (DEBUG's subcommands that
//!   mean something here).
//!
//! Thread-safety: a `Session` belongs to one connection; `execute_batch` may run on any
//! thread and may block (engine writes take the database's write lock; `EXEC`, `FLUSHDB`
//! and `SAVE` wait on the device, which is why the connection runs batches holding them
//! on a thread that may block, see [`may_block`]).

mod admin;
mod batch;
mod blocking;
mod cluster;
mod cluster_keys;
mod collection;
mod debug;
mod expire;
mod hashes;
mod info;
mod keys;
mod kv;
mod lists;
mod memory;
mod migrating;
mod moves;
mod mpop;
mod prefetch;
mod pubsub;
mod routing;
mod runs;
mod session;
mod sets;
mod sort;
mod string_edits;
mod strings;
mod table;
mod transaction;
mod tx_keys;
mod zset_algebra;
mod zsets;

use crate::resp::Reply;
use crate::state::ServerState;
use crate::store::Slot;

pub use batch::{execute_batch, retry_blocked, Written};
pub use blocking::Blocked;
pub use session::Session;
pub use table::{command_count, command_name, may_block};

use kv::{Kv, LockedKv, ReadKv, ReplicaKv};
use routing::{Routed, SlotKv};
use table::{lookup, table, KvFn, Run, Spec, BLOCKS_CLIENT, NOAUTH, NOMULTI, TXCTL};

/// The Redis version whose commands and replies we follow, reported to clients that ask
/// (`HELLO`, `INFO`); some clients pick features by it.
pub const REDIS_COMPAT_VERSION: &str = "7.2.0";

/// What a handler sees besides its arguments.
struct Call<'a> {
    state: &'a ServerState,
    session: &'a mut Session,
    /// Set when the request wrote: in sync mode its reply waits for a sync.
    wrote: bool,
}

impl<'a> Call<'a> {
    /// The selected database.
    fn slot(&self) -> &'a Slot {
        self.state.store.slot(self.session.db_index)
    }
}

/// Runs one request on the general path: checks authentication and arity, queues it
/// inside `MULTI`, else finds its handler in the table and runs it on the store its kind
/// needs. Errors become error replies.
fn execute(call: &mut Call<'_>, args: &[Vec<u8>]) -> Reply {
    let reply = execute_one(call, args);
    // `ASKING` lasts for one command (cluster mode, `migrating`).
    if call.session.asking && !args[0].eq_ignore_ascii_case(b"asking") {
        call.session.asking = false;
    }
    reply
}

fn execute_one(call: &mut Call<'_>, args: &[Vec<u8>]) -> Reply {
    let Some(index) = lookup(&args[0]) else {
        if let Some(multi) = &mut call.session.multi {
            multi.failed = true;
        }
        return unknown_command(args);
    };
    let spec = &table()[index];
    if !call.session.authenticated && spec.flags & NOAUTH == 0 {
        return Reply::error("NOAUTH Authentication required.");
    }
    let n = args.len() as i32;
    if (spec.arity > 0 && n != spec.arity) || (spec.arity < 0 && n < -spec.arity) {
        if let Some(multi) = &mut call.session.multi {
            multi.failed = true;
        }
        return wrong_args(spec.name);
    }
    if routing::keys(spec, args).any(crate::expiry::is_reserved) {
        if let Some(multi) = &mut call.session.multi {
            multi.failed = true;
        }
        return Reply::error(
            "ERR keys starting with \\xff\\xfftucana\\x00 are reserved for tucana's deadlines",
        );
    }
    // Subscribed in RESP2, Redis runs only the Pub/Sub commands, PING, QUIT and RESET.
    if call.session.in_resp2_pubsub() {
        if let Some(refusal) = pubsub::refused_while_subscribed(spec.name, args) {
            return refusal;
        }
    }
    // Cluster mode: the keys must hash to one slot this server serves.
    let routed = match routing::route(call, spec, args) {
        Ok(routed) => routed,
        Err(reply) => {
            if let Some(multi) = &mut call.session.multi {
                multi.failed = true;
            }
            return reply;
        }
    };
    if let Some(multi) = &mut call.session.multi {
        if spec.flags & TXCTL == 0 {
            if spec.flags & NOMULTI != 0 {
                multi.failed = true;
                // Redis's words first: clients and Redis's tests match them.
                return Reply::error(format!(
                    "ERR Command not allowed inside a transaction: '{}' (a transaction is one atomic batch on the selected database)",
                    spec.name
                ));
            }
            multi.queued.push(args.to_vec());
            return Reply::Status("QUEUED".into());
        }
    }
    call.state.metrics.count_command(index);
    let result = run_spec(call, spec, args, routed);
    let reply = result.unwrap_or_else(|e| Reply::error(error_text(&e)));
    // A read of a region led here: answered once the backups hold what it saw
    // (`Session::read_keyspaces`).
    if let Some(r) = routed.filter(|r| !r.replica) {
        if !call.wrote && !reply.is_error() {
            call.session
                .read_from(&crate::cluster::region_keyspace_name(r.region));
        }
    }
    // A blocking pop that found nothing: the connection waits (`blocking`). EXEC runs
    // its commands without coming here, so inside a transaction they never block.
    // A retry that meets a key of another type keeps waiting, as Redis only serves a
    // blocked client from a key of the type it waits for.
    // (BLMOVE's destination of another type is answered, as Redis answers it.)
    let nothing = matches!(reply, Reply::Nil | Reply::NilArray)
        || (call.session.retrying
            && matches!(&reply, Reply::Error(e) if e.starts_with("WRONGTYPE"))
            && blocking::source_not_ready(call, args));
    if spec.flags & BLOCKS_CLIENT != 0 && nothing {
        if call.state.cluster.is_some() {
            return Reply::error(
                "ERR blocking pops do not wait in cluster mode yet (nothing to pop now)",
            );
        }
        call.session.blocked = blocking::blocked_on(args);
    }
    reply
}

/// The error reply of an engine error: `READONLY` for a keyspace this server is no longer
/// the primary of (clients take it as "write elsewhere"), `ERR` otherwise.
fn error_text(e: &tucana::Error) -> String {
    match e {
        tucana::Error::Fenced { .. } => format!("READONLY {e}"),
        _ => format!("ERR {e}"),
    }
}

/// Runs a string command's handler on `kv`, through the slot prefix when routed.
fn run_kv(
    f: KvFn,
    kv: &mut dyn Kv,
    hash_slot: Option<u16>,
    args: &[Vec<u8>],
) -> tucana::Result<Reply> {
    match hash_slot {
        Some(hash_slot) => f(
            &mut SlotKv {
                inner: kv,
                hash_slot,
            },
            args,
        ),
        None => f(kv, args),
    }
}

fn run_spec(
    call: &mut Call<'_>,
    spec: &Spec,
    args: &[Vec<u8>],
    routed: Option<Routed>,
) -> tucana::Result<Reply> {
    let state = call.state;
    if let (Some(r), Run::Read(f)) = (routed.filter(|r| r.replica), &spec.run) {
        let name = crate::cluster::region_keyspace_name(r.region);
        let mut kv = ReplicaKv {
            replica: state.store.db.open_replica(&name),
            state,
        };
        return run_kv(*f, &mut kv, Some(r.hash_slot), args);
    }
    let region = match (&state.cluster, routed) {
        (Some(cluster), Some(r)) => Some(cluster.region(&state.store.db, r.region)),
        // Every string command has a key; never let one reach database 0 in cluster mode.
        (Some(_), None) if !matches!(spec.run, Run::Other { .. }) => {
            return Ok(Reply::error("ERR command without a key in cluster mode"));
        }
        _ => None,
    };
    if let (Some(r), Some(region), Run::Read(f) | Run::Write(f)) = (routed, &region, spec.run) {
        let write = matches!(spec.run, Run::Write(_));
        return migrating::run_routed(call, spec, f, write, args, r, region);
    }
    let slot = region.as_deref().unwrap_or_else(|| call.slot());
    let hash_slot = routed.map(|r| r.hash_slot);
    match spec.run {
        Run::Read(f) => slot.read(|ks| {
            let may_expire = slot.may_expire();
            let mut kv = ReadKv {
                ks,
                state,
                may_expire,
                misses_of: Some(slot.index()),
            };
            run_kv(f, &mut kv, hash_slot, args)
        }),
        Run::Write(f) => {
            let mut kv = LockedKv::new(slot.lock_writes(), state);
            let reply = run_kv(f, &mut kv, hash_slot, args);
            call.wrote |= kv.wrote;
            if let (true, Some(region)) = (kv.wrote, &region) {
                call.session.wrote_to(region.name());
            }
            reply
        }
        Run::Other { f, .. } => f(call, args),
    }
}

// ---- shared by the handlers ---------------------------------------------------------

fn unknown_command(args: &[Vec<u8>]) -> Reply {
    let mut text = format!(
        "ERR unknown command '{}', with args beginning with:",
        printable(&args[0], 64)
    );
    for a in args.iter().skip(1).take(8) {
        text.push_str(&format!(" '{}'", printable(a, 64)));
    }
    Reply::error(text)
}

/// Text for an error message: lossy UTF-8 without control characters, cut at `max` chars.
fn printable(bytes: &[u8], max: usize) -> String {
    String::from_utf8_lossy(bytes)
        .chars()
        .filter(|c| !c.is_control())
        .take(max)
        .collect()
}

fn wrong_args(name: &str) -> Reply {
    Reply::error(format!(
        "ERR wrong number of arguments for '{name}' command"
    ))
}

fn syntax_error() -> Reply {
    Reply::error("ERR syntax error")
}

/// Parses an integer the way Redis does: the canonical decimal form of an `i64`.
fn parse_i64(bytes: &[u8]) -> Option<i64> {
    if bytes.is_empty() || bytes.len() > 20 {
        return None;
    }
    let s = std::str::from_utf8(bytes).ok()?;
    let n: i64 = s.parse().ok()?;
    (n.to_string() == s).then_some(n)
}

/// A SCAN cursor: an unsigned decimal number.
fn parse_u64_cursor(bytes: &[u8]) -> Option<u64> {
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

/// `[prefix, next(prefix))`'s end as a bound; `Unbounded` when the prefix is all 0xff.
fn prefix_end(prefix: &[u8]) -> std::ops::Bound<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return std::ops::Bound::Excluded(end);
        }
    }
    std::ops::Bound::Unbounded
}

fn not_an_integer() -> Reply {
    Reply::error("ERR value is not an integer or out of range")
}

fn opt_bulk(value: Option<Vec<u8>>) -> Reply {
    value.map_or(Reply::Nil, Reply::Bulk)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_parse_only_in_canonical_form() {
        assert_eq!(parse_i64(b"42"), Some(42));
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [
            &b""[..],
            b"+1",
            b" 1",
            b"01",
            b"-0",
            b"1.0",
            b"9223372036854775808",
        ] {
            assert_eq!(parse_i64(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
