//! Command handlers: what each supported command does, on top of the engine's public API.
//!
//! Owns the command table (names, arities, flags), the per-connection [`Session`]
//! (protocol, selected database, authentication, `MULTI` queue) and the execution of a
//! pipelined batch of requests, including the one sync that makes a batch's writes durable
//! before any of its replies is sent (sync durability). It owns no sockets and no wire
//! format beyond building [`Reply`] values.
//!
//! String commands are written once against the small [`Kv`] trait and run three ways:
//! reads directly on the keyspace (no lock), writes under the database's write lock
//! (see `store.rs` for why), and inside `EXEC` on an overlay whose writes become one
//! atomic engine batch. Plain `GET key` and `SET key value`, most of a cache's traffic,
//! also have a fast path in [`execute_batch`] that answers exactly as the general one
//! would, without building owned arguments or [`Reply`] values.
//!
//! Thread-safety: a `Session` belongs to one connection; `execute_batch` may run on any
//! thread and may block (engine writes, syncs, commits).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::{Bound, Range};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use tucana::{Durability, Keyspace};

use crate::config::DurabilityMode;
use crate::glob::{glob_match, literal_prefix};
use crate::metrics::Tally;
use crate::resp::{encode_bulk, encode_error, encode_nil, Args, Protocol, Reply, Requests};
use crate::state::ServerState;
use crate::store::{Slot, WriteGuard};

/// The Redis version whose commands and replies we follow, reported to clients that ask
/// (`HELLO`, `INFO`); some clients pick features by it.
pub const REDIS_COMPAT_VERSION: &str = "7.2.0";

/// Per-connection state.
#[derive(Debug)]
pub struct Session {
    pub id: u64,
    pub protocol: Protocol,
    pub db_index: u32,
    pub authenticated: bool,
    pub name: Option<Vec<u8>>,
    pub lib_name: Option<Vec<u8>>,
    pub lib_version: Option<Vec<u8>>,
    multi: Option<Multi>,
    /// Close the connection once the replies so far are written (`QUIT`, `SHUTDOWN`).
    pub close_after_reply: bool,
    /// The client asked the server to shut down.
    pub shutdown_requested: bool,
}

#[derive(Debug, Default)]
struct Multi {
    queued: Vec<Args>,
    /// A command could not be queued: `EXEC` aborts (as Redis does).
    failed: bool,
}

impl Session {
    pub fn new(id: u64, authenticated: bool) -> Session {
        Session {
            id,
            protocol: Protocol::Resp2,
            db_index: 0,
            authenticated,
            name: None,
            lib_name: None,
            lib_version: None,
            multi: None,
            close_after_reply: false,
            shutdown_requested: false,
        }
    }
}

/// Writes for [`Kv::apply`]: a put (`Some(value)`) or a delete (`None`) per key.
type Ops = Vec<(Vec<u8>, Option<Vec<u8>>)>;

/// Reads and writes of the string commands; see the module doc for the three kinds.
trait Kv {
    fn get(&mut self, key: &[u8]) -> tucana::Result<Option<Vec<u8>>>;
    /// Length of the value, without copying it.
    fn value_len(&mut self, key: &[u8]) -> tucana::Result<Option<usize>> {
        Ok(self.get(key)?.map(|v| v.len()))
    }
    /// Applies puts (`Some`) and deletes (`None`) atomically.
    fn apply(&mut self, ops: Ops) -> tucana::Result<()>;

    /// The values of `keys`, in order. Stores override it to read them all at once.
    fn multi_get(&mut self, keys: &[Vec<u8>]) -> tucana::Result<Vec<Option<Vec<u8>>>> {
        keys.iter().map(|key| self.get(key)).collect()
    }

    fn put(&mut self, key: &[u8], value: Vec<u8>) -> tucana::Result<()> {
        self.apply(vec![(key.to_vec(), Some(value))])
    }
}

/// Reads on the keyspace as it is; no writes.
struct ReadKv<'a> {
    ks: Option<&'a Keyspace>,
    state: &'a ServerState,
}

impl Kv for ReadKv<'_> {
    fn get(&mut self, key: &[u8]) -> tucana::Result<Option<Vec<u8>>> {
        let value = match self.ks {
            Some(ks) => ks.get(key)?,
            None => None,
        };
        self.state.metrics.count_lookup(value.is_some());
        Ok(value)
    }

    fn value_len(&mut self, key: &[u8]) -> tucana::Result<Option<usize>> {
        match self.ks {
            Some(ks) => ks.get_with(key, |v| v.len()),
            None => Ok(None),
        }
    }

    /// One `Keyspace::multi_get`: the records not in memory are read in parallel.
    fn multi_get(&mut self, keys: &[Vec<u8>]) -> tucana::Result<Vec<Option<Vec<u8>>>> {
        let values = match self.ks {
            Some(ks) => ks.multi_get(keys)?,
            None => vec![None; keys.len()],
        };
        for value in &values {
            self.state.metrics.count_lookup(value.is_some());
        }
        Ok(values)
    }

    fn apply(&mut self, _ops: Ops) -> tucana::Result<()> {
        // The command table marks every command that writes; reaching this is a bug.
        debug_assert!(false, "a read-only command wrote");
        Err(tucana::Error::InvalidArgument(
            "internal error: write in a read-only command".into(),
        ))
    }
}

/// Reads and writes under the database's write lock.
struct LockedKv<'a> {
    guard: WriteGuard<'a>,
    state: &'a ServerState,
    wrote: bool,
}

impl Kv for LockedKv<'_> {
    fn get(&mut self, key: &[u8]) -> tucana::Result<Option<Vec<u8>>> {
        let value = match self.guard.existing() {
            Some(ks) => ks.get(key)?,
            None => None,
        };
        self.state.metrics.count_lookup(value.is_some());
        Ok(value)
    }

    fn apply(&mut self, ops: Ops) -> tucana::Result<()> {
        if ops.is_empty() {
            return Ok(());
        }
        let ks = self.guard.keyspace(&self.state.store.db)?;
        self.wrote = true;
        // Durability is handled per batch by `execute_batch` (one sync for the batch).
        if let [(key, value)] = ops.as_slice() {
            return match value {
                Some(v) => ks.put_with(key, v, Durability::Buffered),
                None => ks.delete_with(key, Durability::Buffered).map(|_| ()),
            };
        }
        let mut batch = ks.batch();
        for (key, value) in &ops {
            match value {
                Some(v) => batch.put(key, v),
                None => batch.delete(key),
            };
        }
        batch.commit_with(Durability::Buffered)
    }
}

/// Inside `EXEC`: reads see the transaction's own writes, writes wait in an overlay that
/// becomes one atomic batch at the end.
struct TxKv<'a> {
    guard: WriteGuard<'a>,
    state: &'a ServerState,
    overlay: HashMap<Vec<u8>, Option<Vec<u8>>>,
}

impl Kv for TxKv<'_> {
    fn get(&mut self, key: &[u8]) -> tucana::Result<Option<Vec<u8>>> {
        if let Some(v) = self.overlay.get(key) {
            return Ok(v.clone());
        }
        let value = match self.guard.existing() {
            Some(ks) => ks.get(key)?,
            None => None,
        };
        self.state.metrics.count_lookup(value.is_some());
        Ok(value)
    }

    fn apply(&mut self, ops: Ops) -> tucana::Result<()> {
        for (key, value) in ops {
            self.overlay.insert(key, value);
        }
        Ok(())
    }
}

type KvFn = fn(&mut dyn Kv, &[Vec<u8>]) -> tucana::Result<Reply>;
type CtxFn = fn(&mut Ctx<'_>, &[Vec<u8>]) -> tucana::Result<Reply>;

#[derive(Clone, Copy)]
enum Run {
    /// A string command that only reads.
    Read(KvFn),
    /// A string command that writes (under the write lock).
    Write(KvFn),
    /// Anything else; `blocks` when it may wait on I/O (commit, drop, sync).
    Other { f: CtxFn, blocks: bool },
}

/// Allowed before `AUTH`.
const NOAUTH: u8 = 1;
/// Not allowed inside `MULTI` (works on the whole keyspace or on the connection).
const NOMULTI: u8 = 2;
/// Runs at once inside `MULTI` instead of being queued (`EXEC`, `DISCARD`, `QUIT`, ...).
const TXCTL: u8 = 4;

/// One command of the table.
pub struct Spec {
    /// Lower case, as `COMMAND` reports it.
    pub name: &'static str,
    /// Redis convention: n > 0 exactly n arguments (with the name), n < 0 at least -n.
    pub arity: i32,
    flags: u8,
    /// Key positions, for `COMMAND` (cluster-aware clients read them).
    keys: (i32, i32, i32),
    run: Run,
}

macro_rules! spec {
    ($name:literal, $arity:expr, $flags:expr, $keys:expr, $run:expr) => {
        Spec {
            name: $name,
            arity: $arity,
            flags: $flags,
            keys: $keys,
            run: $run,
        }
    };
}

const NO_KEYS: (i32, i32, i32) = (0, 0, 0);
const KEY1: (i32, i32, i32) = (1, 1, 1);
const ALL_KEYS: (i32, i32, i32) = (1, -1, 1);

fn other(f: CtxFn) -> Run {
    Run::Other { f, blocks: false }
}

fn blocking(f: CtxFn) -> Run {
    Run::Other { f, blocks: true }
}

/// Every supported command.
fn table() -> &'static [Spec] {
    static TABLE: OnceLock<Vec<Spec>> = OnceLock::new();
    TABLE.get_or_init(|| {
        vec![
            spec!("get", 2, 0, KEY1, Run::Read(cmd_get)),
            spec!("mget", -2, 0, ALL_KEYS, Run::Read(cmd_mget)),
            spec!("exists", -2, 0, ALL_KEYS, Run::Read(cmd_exists)),
            spec!("strlen", 2, 0, KEY1, Run::Read(cmd_strlen)),
            spec!("type", 2, 0, KEY1, Run::Read(cmd_type)),
            spec!("ttl", 2, 0, KEY1, Run::Read(cmd_ttl)),
            spec!("pttl", 2, 0, KEY1, Run::Read(cmd_ttl)),
            spec!("set", -3, 0, KEY1, Run::Write(cmd_set)),
            spec!("setnx", 3, 0, KEY1, Run::Write(cmd_setnx)),
            spec!("getset", 3, 0, KEY1, Run::Write(cmd_getset)),
            spec!("getdel", 2, 0, KEY1, Run::Write(cmd_getdel)),
            spec!("mset", -3, 0, (1, -1, 2), Run::Write(cmd_mset)),
            spec!("msetnx", -3, 0, (1, -1, 2), Run::Write(cmd_msetnx)),
            spec!("del", -2, 0, ALL_KEYS, Run::Write(cmd_del)),
            spec!("unlink", -2, 0, ALL_KEYS, Run::Write(cmd_del)),
            spec!("append", 3, 0, KEY1, Run::Write(cmd_append)),
            spec!("incr", 2, 0, KEY1, Run::Write(cmd_incr)),
            spec!("decr", 2, 0, KEY1, Run::Write(cmd_decr)),
            spec!("incrby", 3, 0, KEY1, Run::Write(cmd_incrby)),
            spec!("decrby", 3, 0, KEY1, Run::Write(cmd_decrby)),
            spec!("scan", -2, NOMULTI, NO_KEYS, other(cmd_scan)),
            spec!("keys", 2, NOMULTI, NO_KEYS, other(cmd_keys)),
            spec!("trange", -3, NOMULTI, NO_KEYS, other(cmd_trange)),
            spec!("tprefix", -2, NOMULTI, NO_KEYS, other(cmd_tprefix)),
            spec!("dbsize", 1, NOMULTI, NO_KEYS, other(cmd_dbsize)),
            spec!("flushdb", -1, NOMULTI, NO_KEYS, blocking(cmd_flushdb)),
            spec!("flushall", -1, NOMULTI, NO_KEYS, blocking(cmd_flushall)),
            spec!("select", 2, NOMULTI, NO_KEYS, other(cmd_select)),
            spec!("multi", 1, TXCTL, NO_KEYS, other(cmd_multi)),
            spec!("exec", 1, TXCTL, NO_KEYS, blocking(cmd_exec)),
            spec!("discard", 1, TXCTL, NO_KEYS, other(cmd_discard)),
            spec!("ping", -1, 0, NO_KEYS, other(cmd_ping)),
            spec!("echo", 2, 0, NO_KEYS, other(cmd_echo)),
            spec!("quit", -1, NOAUTH | TXCTL, NO_KEYS, other(cmd_quit)),
            spec!("auth", -2, NOAUTH | NOMULTI, NO_KEYS, other(cmd_auth)),
            spec!("hello", -1, NOAUTH | NOMULTI, NO_KEYS, other(cmd_hello)),
            spec!("client", -2, NOMULTI, NO_KEYS, other(cmd_client)),
            spec!("command", -1, NOMULTI, NO_KEYS, other(cmd_command)),
            spec!("config", -2, NOMULTI, NO_KEYS, other(cmd_config)),
            spec!("info", -1, NOMULTI, NO_KEYS, other(cmd_info)),
            spec!("time", 1, 0, NO_KEYS, other(cmd_time)),
            spec!("save", 1, NOMULTI, NO_KEYS, blocking(cmd_save)),
            spec!("bgsave", -1, NOMULTI, NO_KEYS, blocking(cmd_bgsave)),
            spec!(
                "bgrewriteaof",
                1,
                NOMULTI,
                NO_KEYS,
                blocking(cmd_bgrewriteaof)
            ),
            spec!("shutdown", -1, NOMULTI, NO_KEYS, other(cmd_shutdown)),
        ]
    })
}

/// FNV-1a: command names are a few bytes and come from the table or a client that can
/// only pick among them, so the flooding resistance of the default hasher buys nothing
/// and its cost shows up once per command.
#[derive(Default)]
struct NameHasher(u64);

impl Hasher for NameHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for &b in bytes {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}

type NameIndex = HashMap<&'static [u8], usize, BuildHasherDefault<NameHasher>>;

fn index_by_name() -> &'static NameIndex {
    static INDEX: OnceLock<NameIndex> = OnceLock::new();
    INDEX.get_or_init(|| {
        table()
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name.as_bytes(), i))
            .collect()
    })
}

/// Number of commands in the table (metrics keep one counter per command).
pub fn command_count() -> usize {
    table().len()
}

/// Name of command `index` of the table.
pub fn command_name(index: usize) -> &'static str {
    table()[index].name
}

/// The table index of a command name, any case.
pub fn lookup(name: &[u8]) -> Option<usize> {
    let mut lower = [0u8; 16];
    if name.len() > lower.len() {
        return None;
    }
    for (l, n) in lower.iter_mut().zip(name) {
        *l = n.to_ascii_lowercase();
    }
    index_by_name().get(&lower[..name.len()]).copied()
}

/// Whether running this request may wait on I/O: the connection then runs its batch on
/// a thread that may block, so the async workers keep serving other connections.
///
/// Reads never block. Writes only take the keyspace's write lock (held for a log append
/// by another writer) and append to the log buffer, so they run on the async worker too:
/// a hop to the blocking pool costs more than they do. In sync mode the wait for the
/// fsync that follows is asynchronous (`syncer`).
pub fn may_block(name: &[u8]) -> bool {
    let Some(i) = lookup(name) else {
        return false;
    };
    match table()[i].run {
        Run::Read(_) => false,
        Run::Write(_) => false,
        Run::Other { blocks, .. } => blocks,
    }
}

/// What a handler sees besides its arguments.
pub struct Ctx<'a> {
    state: &'a ServerState,
    session: &'a mut Session,
    /// Set when the request wrote: in sync mode its reply waits for a sync.
    wrote: bool,
}

/// Runs a pipelined batch of requests and appends their encoded replies to `out`.
///
/// Replies are encoded into `out` as
/// each request runs. Writes are applied buffered; the returned [`Written`] says where
/// their replies are, so that in sync mode the caller makes them durable (one sync for
/// the batch) before it sends anything, and turns them into errors if that sync fails.
///
/// Plain `GET key` and `SET key value` (the bulk of a cache's traffic) take a fast path
/// when the connection is authenticated and not in `MULTI`: a run of consecutive ones
/// reads one keyspace handle (GET, values encoded from where they lie) or takes the write
/// lock once and applies the run as one engine batch (SET). Their replies are what the
/// general path would answer; anything else goes through [`execute`].
pub fn execute_batch(
    state: &ServerState,
    session: &mut Session,
    requests: Requests<'_>,
    out: &mut Vec<u8>,
) -> Written {
    let base = out.len();
    let mut tally = Tally::default();
    // Where in `out` the replies of requests that wrote are (sync mode may replace them).
    let mut written: Vec<Range<usize>> = Vec::new();
    let mut args: Vec<&[u8]> = Vec::new();
    let mut i = 0;
    while i < requests.len() {
        requests.args_into(i, &mut args);
        if args.is_empty() {
            i += 1;
            continue;
        }
        let fast = session.authenticated && session.multi.is_none();
        if fast && is_plain(&args, b"get", 2) {
            let run = run_length(requests, i, b"get", 2);
            fast_gets(state, session, requests, i..i + run, out, &mut tally);
            i += run;
            continue;
        }
        if fast && is_plain(&args, b"set", 3) {
            let run = set_run_length(requests, i);
            fast_sets(
                state,
                session,
                requests,
                i..i + run,
                out,
                &mut tally,
                &mut written,
            );
            i += run;
            continue;
        }
        let owned: Args = args.iter().map(|a| a.to_vec()).collect();
        let mut ctx = Ctx {
            state,
            session: &mut *session,
            wrote: false,
        };
        let reply = execute(&mut ctx, &owned);
        let wrote = ctx.wrote;
        if reply.is_error() {
            tally.error();
        }
        // The protocol in force when the reply was made (HELLO switches it).
        let at = out.len();
        reply.encode(session.protocol, out);
        if wrote {
            written.push(at..out.len());
        }
        if session.close_after_reply {
            break;
        }
        i += 1;
    }
    state.metrics.add_tally(&tally);
    Written {
        base,
        ranges: written,
    }
}

/// Where in a batch's output the replies of its writes are: in sync mode they may be
/// sent only once the writes are durable.
#[must_use = "in sync mode the writes must be made durable before their replies are sent"]
pub struct Written {
    /// `out.len()` when the batch started.
    base: usize,
    /// Ascending, at or after `base`.
    ranges: Vec<Range<usize>>,
}

impl Written {
    /// Whether the batch wrote nothing (nothing to make durable).
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The sync after the batch failed: the writes are applied (and visible) but not
    /// known to be durable, and their replies now say so.
    pub fn not_durable(&self, out: &mut Vec<u8>, error: &dyn std::fmt::Display) {
        let text = format!("ERR the write was applied but could not be made durable: {error}");
        replace_replies(out, self.base, &self.ranges, &text);
    }
}

/// Replaces the replies at `ranges` (ascending, at or after `base`) with the error `text`.
fn replace_replies(out: &mut Vec<u8>, base: usize, ranges: &[Range<usize>], text: &str) {
    let old = out.split_off(base);
    let mut from = 0;
    for range in ranges {
        let (start, end) = (range.start - base, range.end - base);
        assert!(from <= start && start <= end && end <= old.len());
        out.extend_from_slice(&old[from..start]);
        encode_error(text, out);
        from = end;
    }
    out.extend_from_slice(&old[from..]);
}

/// Whether `args` is `name` (any case) with exactly `argc` arguments, the name included.
fn is_plain(args: &[&[u8]], name: &[u8], argc: usize) -> bool {
    args.len() == argc && args[0].eq_ignore_ascii_case(name)
}

/// How many requests from `first` on are plain `name` requests (at least the first).
fn run_length(requests: Requests<'_>, first: usize, name: &[u8], argc: usize) -> usize {
    (first..requests.len())
        .take_while(|&j| {
            requests.arg_count(j) == argc && requests.arg(j, 0).eq_ignore_ascii_case(name)
        })
        .count()
}

/// A run of SETs goes to the engine as one atomic write, under the keyspace's writer
/// lock: past this many bytes a run is cut, so a pipeline of large values does not hold
/// the lock (and other writers) while megabytes are appended.
const SET_RUN_MAX_BYTES: usize = 1 << 20;

/// `run_length` for plain SETs, cut after `SET_RUN_MAX_BYTES` of keys and values.
fn set_run_length(requests: Requests<'_>, first: usize) -> usize {
    let mut bytes = 0;
    let mut run = 0;
    for j in first..first + run_length(requests, first, b"set", 3) {
        if run > 0 && bytes >= SET_RUN_MAX_BYTES {
            break;
        }
        bytes += requests.arg(j, 1).len() + requests.arg(j, 2).len();
        run += 1;
    }
    run
}

fn command_index(name: &[u8]) -> usize {
    lookup(name).expect("the fast paths' commands are in the table")
}

/// A run of plain `GET key`: one read of the keyspace handle for the run (which reads as
/// the database was when the run started, as Redis, which runs a client's pipelined
/// batch without interleaving others, would), each value encoded from where it lies.
fn fast_gets(
    state: &ServerState,
    session: &Session,
    requests: Requests<'_>,
    run: Range<usize>,
    out: &mut Vec<u8>,
    tally: &mut Tally,
) {
    tally.command(command_index(b"get"), run.len() as u64);
    let protocol = session.protocol;
    let mark = out.len();
    let mut local = Tally::default();
    // Keys go to the engine in groups (`Keyspace::get_many_with`), whose lookups overlap
    // their cache misses; a group of pipelined GETs is what redis-benchmark -P sends.
    const GROUP: usize = 32;
    let read = state.store.slot(session.db_index).read(|ks| {
        // A retry (the keyspace was dropped meanwhile) starts the run over.
        out.truncate(mark);
        local = Tally::default();
        let Some(ks) = ks else {
            for _ in run.clone() {
                local.lookup(false);
                encode_nil(protocol, out);
            }
            return Ok(());
        };
        let mut keys: [&[u8]; GROUP] = [&[]; GROUP];
        let mut dropped = None;
        for first in run.clone().step_by(GROUP) {
            let group = first..(first + GROUP).min(run.end);
            for (slot, j) in keys.iter_mut().zip(group.clone()) {
                *slot = requests.arg(j, 1);
            }
            ks.get_many_with(&keys[..group.len()], |_, found| match found {
                Ok(Some(value)) => {
                    local.lookup(true);
                    encode_bulk(value, out);
                }
                Ok(None) => {
                    local.lookup(false);
                    encode_nil(protocol, out);
                }
                Err(e @ tucana::Error::KeyspaceNotFound(_)) => dropped = Some(e),
                Err(e) => {
                    local.error();
                    encode_error(&format!("ERR {e}"), out);
                }
            });
            if let Some(e) = dropped.take() {
                return Err(e);
            }
        }
        Ok(())
    });
    if let Err(e) = read {
        // Only a keyspace dropped again and again gets here: every GET of the run fails.
        out.truncate(mark);
        local = Tally::default();
        for _ in run {
            local.error();
            encode_error(&format!("ERR {e}"), out);
        }
    }
    tally.merge(&local);
}

/// A run of plain `SET key value`: the database's write lock taken once and the run
/// applied as one engine batch (one append of the records, one trip through the engine's
/// writer lock). Every SET of the run answers `+OK`, as each would alone. If the batch
/// fails (a value over the engine's limit, say) before anything was applied, each SET is
/// applied alone so each reply says what happened to it.
#[allow(clippy::too_many_arguments)]
fn fast_sets(
    state: &ServerState,
    session: &Session,
    requests: Requests<'_>,
    run: Range<usize>,
    out: &mut Vec<u8>,
    tally: &mut Tally,
    written: &mut Vec<Range<usize>>,
) {
    tally.command(command_index(b"set"), run.len() as u64);
    let pair = |j: usize| (requests.arg(j, 1), requests.arg(j, 2));
    let guard = state.store.slot(session.db_index).lock_writes();
    let applied = guard.keyspace(&state.store.db).and_then(|ks| {
        if run.len() == 1 {
            let (key, value) = pair(run.start);
            return ks.put_with(key, value, Durability::Buffered).map(|()| ks);
        }
        // Keys and values stay where they lie in the request buffer (no copy per SET).
        let pairs: Vec<(&[u8], &[u8])> = run.clone().map(pair).collect();
        ks.put_all(&pairs, Durability::Buffered).map(|()| ks)
    });
    let mut one_by_one = None;
    match applied {
        Ok(_) => {}
        // A failed single SET is its own answer; a failed batch is retried one by one.
        Err(e) if run.len() == 1 => {
            tally.error();
            let at = out.len();
            encode_error(&format!("ERR {e}"), out);
            written.push(at..out.len());
            return;
        }
        Err(_) => one_by_one = Some(guard.keyspace(&state.store.db).map_err(|e| e.to_string())),
    }
    for j in run {
        let at = out.len();
        let result = match &one_by_one {
            None => Ok(()),
            Some(Ok(ks)) => {
                let (key, value) = pair(j);
                ks.put_with(key, value, Durability::Buffered)
                    .map_err(|e| e.to_string())
            }
            Some(Err(e)) => Err(e.clone()),
        };
        match result {
            Ok(()) => out.extend_from_slice(b"+OK\r\n"),
            Err(e) => {
                tally.error();
                encode_error(&format!("ERR {e}"), out);
            }
        }
        written.push(at..out.len());
    }
}

fn unknown_command(args: &Args) -> Reply {
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

fn execute(ctx: &mut Ctx<'_>, args: &Args) -> Reply {
    let Some(index) = lookup(&args[0]) else {
        if let Some(multi) = &mut ctx.session.multi {
            multi.failed = true;
        }
        return unknown_command(args);
    };
    let spec = &table()[index];
    if !ctx.session.authenticated && spec.flags & NOAUTH == 0 {
        return Reply::error("NOAUTH Authentication required.");
    }
    let n = args.len() as i32;
    if (spec.arity > 0 && n != spec.arity) || (spec.arity < 0 && n < -spec.arity) {
        if let Some(multi) = &mut ctx.session.multi {
            multi.failed = true;
        }
        return wrong_args(spec.name);
    }
    if let Some(multi) = &mut ctx.session.multi {
        if spec.flags & TXCTL == 0 {
            if spec.flags & NOMULTI != 0 {
                multi.failed = true;
                return Reply::error(format!(
                    "ERR '{}' is not allowed inside a transaction (a transaction is one atomic batch of string commands on the selected database)",
                    spec.name
                ));
            }
            multi.queued.push(args.clone());
            return Reply::Status("QUEUED".into());
        }
    }
    ctx.state.metrics.count_command(index);
    let result = run_spec(ctx, spec, args);
    result.unwrap_or_else(|e| Reply::error(format!("ERR {e}")))
}

fn run_spec(ctx: &mut Ctx<'_>, spec: &Spec, args: &Args) -> tucana::Result<Reply> {
    let state = ctx.state;
    match spec.run {
        Run::Read(f) => {
            let slot = state.store.slot(ctx.session.db_index);
            slot.read(|ks| f(&mut ReadKv { ks, state }, args))
        }
        Run::Write(f) => {
            let slot = state.store.slot(ctx.session.db_index);
            let mut kv = LockedKv {
                guard: slot.lock_writes(),
                state,
                wrote: false,
            };
            let reply = f(&mut kv, args);
            ctx.wrote |= kv.wrote;
            reply
        }
        Run::Other { f, .. } => f(ctx, args),
    }
}

// ---- string commands ----------------------------------------------------------------

/// Parses an integer the way Redis does: the canonical decimal form of an `i64`.
fn parse_i64(bytes: &[u8]) -> Option<i64> {
    if bytes.is_empty() || bytes.len() > 20 {
        return None;
    }
    let s = std::str::from_utf8(bytes).ok()?;
    let n: i64 = s.parse().ok()?;
    (n.to_string() == s).then_some(n)
}

fn not_an_integer() -> Reply {
    Reply::error("ERR value is not an integer or out of range")
}

fn opt_bulk(value: Option<Vec<u8>>) -> Reply {
    value.map_or(Reply::Nil, Reply::Bulk)
}

fn cmd_get(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    Ok(opt_bulk(kv.get(&args[1])?))
}

fn cmd_mget(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let values = kv.multi_get(&args[1..])?;
    Ok(Reply::Array(values.into_iter().map(opt_bulk).collect()))
}

fn cmd_exists(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let mut n = 0;
    for key in &args[1..] {
        if kv.value_len(key)?.is_some() {
            n += 1;
        }
    }
    Ok(Reply::Int(n))
}

fn cmd_strlen(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    Ok(Reply::Int(kv.value_len(&args[1])?.unwrap_or(0) as i64))
}

fn cmd_type(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let exists = kv.value_len(&args[1])?.is_some();
    Ok(Reply::Status(if exists { "string" } else { "none" }.into()))
}

/// No expiry: -1 for a key that exists (no TTL), -2 for one that does not.
fn cmd_ttl(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let exists = kv.value_len(&args[1])?.is_some();
    Ok(Reply::Int(if exists { -1 } else { -2 }))
}

const NO_EXPIRY: &str =
    "ERR expiry is not supported: tucana keeps a key until it is deleted (EX, PX, EXAT, PXAT)";

fn cmd_set(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let (key, value) = (&args[1], &args[2]);
    let (mut nx, mut xx, mut get) = (false, false, false);
    for opt in &args[3..] {
        match opt.to_ascii_uppercase().as_slice() {
            b"NX" if !xx => nx = true,
            b"XX" if !nx => xx = true,
            b"GET" => get = true,
            // Keeping the TTL of a key without one changes nothing.
            b"KEEPTTL" => {}
            b"EX" | b"PX" | b"EXAT" | b"PXAT" => return Ok(Reply::error(NO_EXPIRY)),
            _ => return Ok(syntax_error()),
        }
    }
    let old = if nx || xx || get { kv.get(key)? } else { None };
    let exists = old.is_some();
    let apply = !(nx && exists || xx && !exists);
    if apply {
        kv.put(key, value.clone())?;
    }
    Ok(match (get, apply) {
        (true, _) => opt_bulk(old),
        (false, true) => Reply::Ok,
        (false, false) => Reply::Nil,
    })
}

fn cmd_setnx(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    if kv.value_len(&args[1])?.is_some() {
        return Ok(Reply::Int(0));
    }
    kv.put(&args[1], args[2].clone())?;
    Ok(Reply::Int(1))
}

fn cmd_getset(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let old = kv.get(&args[1])?;
    kv.put(&args[1], args[2].clone())?;
    Ok(opt_bulk(old))
}

fn cmd_getdel(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let old = kv.get(&args[1])?;
    if old.is_some() {
        kv.apply(vec![(args[1].clone(), None)])?;
    }
    Ok(opt_bulk(old))
}

fn pairs(args: &[Vec<u8>]) -> Option<Ops> {
    let rest = &args[1..];
    if !rest.len().is_multiple_of(2) {
        return None;
    }
    Some(
        rest.chunks(2)
            .map(|kv| (kv[0].clone(), Some(kv[1].clone())))
            .collect(),
    )
}

fn cmd_mset(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let Some(ops) = pairs(args) else {
        return Ok(wrong_args("mset"));
    };
    kv.apply(ops)?;
    Ok(Reply::Ok)
}

fn cmd_msetnx(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let Some(ops) = pairs(args) else {
        return Ok(wrong_args("msetnx"));
    };
    for (key, _) in &ops {
        if kv.value_len(key)?.is_some() {
            return Ok(Reply::Int(0));
        }
    }
    kv.apply(ops)?;
    Ok(Reply::Int(1))
}

fn cmd_del(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let mut ops: Ops = Vec::new();
    for key in &args[1..] {
        if !ops.iter().any(|(k, _)| k == key) && kv.value_len(key)?.is_some() {
            ops.push((key.clone(), None));
        }
    }
    let n = ops.len() as i64;
    kv.apply(ops)?;
    Ok(Reply::Int(n))
}

fn cmd_append(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let mut value = kv.get(&args[1])?.unwrap_or_default();
    value.extend_from_slice(&args[2]);
    let len = value.len() as i64;
    kv.put(&args[1], value)?;
    Ok(Reply::Int(len))
}

fn incr_by(kv: &mut dyn Kv, key: &[u8], delta: i64) -> tucana::Result<Reply> {
    let current = match kv.get(key)? {
        None => 0,
        Some(v) => match parse_i64(&v) {
            Some(n) => n,
            None => return Ok(not_an_integer()),
        },
    };
    let Some(next) = current.checked_add(delta) else {
        return Ok(Reply::error("ERR increment or decrement would overflow"));
    };
    kv.put(key, next.to_string().into_bytes())?;
    Ok(Reply::Int(next))
}

fn cmd_incr(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    incr_by(kv, &args[1], 1)
}

fn cmd_decr(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    incr_by(kv, &args[1], -1)
}

fn cmd_incrby(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    match parse_i64(&args[2]) {
        Some(delta) => incr_by(kv, &args[1], delta),
        None => Ok(not_an_integer()),
    }
}

fn cmd_decrby(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    match parse_i64(&args[2]).and_then(i64::checked_neg) {
        Some(delta) => incr_by(kv, &args[1], delta),
        None => Ok(not_an_integer()),
    }
}

// ---- keyspace commands --------------------------------------------------------------

fn slot<'a>(ctx: &Ctx<'a>) -> &'a Slot {
    ctx.state.store.slot(ctx.session.db_index)
}

/// Keys of a keyspace in order from `lo` (or the first) to `hi` (or the last).
fn range_of(
    ks: Option<&Keyspace>,
    lo: Bound<Vec<u8>>,
    hi: Bound<Vec<u8>>,
) -> Option<tucana::Range> {
    ks.map(|ks| ks.range::<Vec<u8>, _>((lo, hi)))
}

/// `[prefix, next(prefix))` as bounds; `Unbounded` end when the prefix is all 0xff.
fn prefix_end(prefix: &[u8]) -> Bound<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Bound::Excluded(end);
        }
    }
    Bound::Unbounded
}

/// SCAN cursor [MATCH pattern] [COUNT n] [TYPE type]
///
/// The cursor contract of Redis holds: a full iteration (from cursor 0 until 0 comes
/// back) returns every key present from start to end, once, in key order. A cursor is a
/// number naming where the last call stopped, kept by the server (`max_scan_cursors`,
/// oldest forgotten first; a forgotten one answers `ERR invalid cursor`).
fn cmd_scan(ctx: &mut Ctx<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let Some(cursor) = std::str::from_utf8(&args[1])
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    else {
        return Ok(Reply::error("ERR invalid cursor"));
    };
    let mut pattern: Option<&[u8]> = None;
    let mut count: usize = 10;
    let mut strings = true;
    let mut i = 2;
    while i < args.len() {
        let value = args.get(i + 1);
        match (args[i].to_ascii_uppercase().as_slice(), value) {
            (b"MATCH", Some(p)) => pattern = Some(p),
            (b"COUNT", Some(n)) => match parse_i64(n) {
                Some(n) if n >= 1 => count = n as usize,
                Some(_) => return Ok(syntax_error()),
                None => return Ok(not_an_integer()),
            },
            (b"TYPE", Some(t)) => strings = t.eq_ignore_ascii_case(b"string"),
            _ => return Ok(syntax_error()),
        }
        i += 2;
    }
    let db_index = ctx.session.db_index;
    let after = if cursor == 0 {
        None
    } else {
        match ctx.state.store.cursor(db_index, cursor) {
            Some(key) => Some(key),
            None => return Ok(Reply::error("ERR invalid cursor")),
        }
    };
    let prefix = pattern.map(literal_prefix).unwrap_or_default();
    let lo = match &after {
        Some(k) if k.as_slice() >= prefix.as_slice() => Bound::Excluded(k.clone()),
        _ => Bound::Included(prefix.clone()),
    };
    let hi = prefix_end(&prefix);
    let (keys, last) = slot(ctx).read(|ks| {
        let mut keys = Vec::new();
        let mut last: Option<Vec<u8>> = None;
        if let Some(range) = range_of(ks, lo.clone(), hi.clone()) {
            let mut range = range.peekable();
            let mut examined = 0;
            while examined < count {
                let Some(item) = range.next() else { break };
                let (key, _) = item?;
                examined += 1;
                if strings && pattern.is_none_or(|p| glob_match(p, &key)) {
                    keys.push(Reply::Bulk(key.clone()));
                }
                last = Some(key);
            }
            // Only hand out a cursor when something follows.
            if range.peek().is_none() {
                last = None;
            }
        }
        Ok((keys, last))
    })?;
    let next = match last {
        Some(key) => ctx.state.store.save_cursor(db_index, key),
        None => 0,
    };
    Ok(Reply::Array(vec![
        Reply::Bulk(next.to_string().into_bytes()),
        Reply::Array(keys),
    ]))
}

fn cmd_keys(ctx: &mut Ctx<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let pattern = &args[1];
    let prefix = literal_prefix(pattern);
    let hi = prefix_end(&prefix);
    slot(ctx).read(|ks| {
        let mut keys = Vec::new();
        if let Some(range) = range_of(ks, Bound::Included(prefix.clone()), hi.clone()) {
            for item in range {
                let (key, _) = item?;
                if glob_match(pattern, &key) {
                    keys.push(Reply::Bulk(key));
                }
            }
        }
        Ok(Reply::Array(keys))
    })
}

type Pair = (Vec<u8>, Vec<u8>);

/// Options state by TRANGE and TPREFIX: `[REV] [LIMIT count] [WITHVALUES]`.
struct RangeOptions {
    rev: bool,
    limit: Option<usize>,
    with_values: bool,
}

fn range_options(args: &[Vec<u8>]) -> Result<RangeOptions, Reply> {
    let mut opts = RangeOptions {
        rev: false,
        limit: None,
        with_values: false,
    };
    let mut i = 0;
    while i < args.len() {
        match args[i].to_ascii_uppercase().as_slice() {
            b"REV" => opts.rev = true,
            b"WITHVALUES" => opts.with_values = true,
            b"LIMIT" => {
                let n = args.get(i + 1).ok_or_else(syntax_error)?;
                match parse_i64(n) {
                    Some(n) if n >= 0 => opts.limit = Some(n as usize),
                    _ => return Err(not_an_integer()),
                }
                i += 1;
            }
            _ => return Err(syntax_error()),
        }
        i += 1;
    }
    Ok(opts)
}

/// A range bound as ZRANGEBYLEX writes it: `-`, `+`, `[key` (inclusive), `(key`.
fn lex_bound(arg: &[u8], low: bool) -> Option<Bound<Vec<u8>>> {
    match arg {
        b"-" if low => Some(Bound::Unbounded),
        b"+" if !low => Some(Bound::Unbounded),
        [b'[', key @ ..] => Some(Bound::Included(key.to_vec())),
        [b'(', key @ ..] => Some(Bound::Excluded(key.to_vec())),
        _ => None,
    }
}

fn collect_range(
    ctx: &Ctx<'_>,
    lo: Bound<Vec<u8>>,
    hi: Bound<Vec<u8>>,
    opts: &RangeOptions,
) -> tucana::Result<Reply> {
    let limit = opts.limit.unwrap_or(usize::MAX);
    slot(ctx).read(|ks| {
        let mut items = Vec::new();
        let Some(range) = range_of(ks, lo.clone(), hi.clone()) else {
            return Ok(Reply::Array(items));
        };
        let iter: Box<dyn Iterator<Item = tucana::Result<Pair>>> = if opts.rev {
            Box::new(range.rev())
        } else {
            Box::new(range)
        };
        for item in iter.take(limit) {
            let (key, value) = item?;
            items.push(Reply::Bulk(key));
            if opts.with_values {
                items.push(Reply::Bulk(value));
            }
        }
        Ok(Reply::Array(items))
    })
}

/// TRANGE start end [REV] [LIMIT count] [WITHVALUES]: keys from `start` to `end` in key
/// order (`REV`: descending), bounds written as in ZRANGEBYLEX (`-`, `+`, `[k`, `(k`).
fn cmd_trange(ctx: &mut Ctx<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let (Some(lo), Some(hi)) = (lex_bound(&args[1], true), lex_bound(&args[2], false)) else {
        return Ok(Reply::error(
            "ERR start and end must be '-', '+', '[key' (inclusive) or '(key' (exclusive)",
        ));
    };
    match range_options(&args[3..]) {
        Ok(opts) => collect_range(ctx, lo, hi, &opts),
        Err(reply) => Ok(reply),
    }
}

/// TPREFIX prefix [REV] [LIMIT count] [WITHVALUES]: the keys that start with `prefix`.
fn cmd_tprefix(ctx: &mut Ctx<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let prefix = args[1].clone();
    let hi = prefix_end(&prefix);
    match range_options(&args[2..]) {
        Ok(opts) => collect_range(ctx, Bound::Included(prefix), hi, &opts),
        Err(reply) => Ok(reply),
    }
}

fn cmd_dbsize(ctx: &mut Ctx<'_>, _args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let n = slot(ctx).read(|ks| Ok(ks.map_or(0, |ks| ks.len())))?;
    Ok(Reply::Int(n as i64))
}

fn flush_option_ok(args: &[Vec<u8>]) -> bool {
    match args {
        [_] => true,
        [_, mode] => mode.eq_ignore_ascii_case(b"SYNC") || mode.eq_ignore_ascii_case(b"ASYNC"),
        _ => false,
    }
}

/// Drops the keyspace (durably, O(1)); the next write creates it again.
fn cmd_flushdb(ctx: &mut Ctx<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    if !flush_option_ok(args) {
        return Ok(syntax_error());
    }
    slot(ctx).lock_writes().flush(&ctx.state.store.db)?;
    Ok(Reply::Ok)
}

fn cmd_flushall(ctx: &mut Ctx<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    if !flush_option_ok(args) {
        return Ok(syntax_error());
    }
    for slot in ctx.state.store.slots() {
        slot.lock_writes().flush(&ctx.state.store.db)?;
    }
    Ok(Reply::Ok)
}

// ---- transactions -------------------------------------------------------------------

fn cmd_multi(ctx: &mut Ctx<'_>, _args: &[Vec<u8>]) -> tucana::Result<Reply> {
    if ctx.session.multi.is_some() {
        return Ok(Reply::error("ERR MULTI calls can not be nested"));
    }
    ctx.session.multi = Some(Multi::default());
    Ok(Reply::Ok)
}

fn cmd_discard(ctx: &mut Ctx<'_>, _args: &[Vec<u8>]) -> tucana::Result<Reply> {
    match ctx.session.multi.take() {
        Some(_) => Ok(Reply::Ok),
        None => Ok(Reply::error("ERR DISCARD without MULTI")),
    }
}

/// Runs the queued commands under the database's write lock; their writes become one
/// atomic engine batch (all or nothing, also across a crash). A command that fails at run
/// time (INCR of a non-number) answers an error in its place and writes nothing, as in
/// Redis; if the batch itself fails, nothing is applied and EXEC answers the error.
fn cmd_exec(ctx: &mut Ctx<'_>, _args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let Some(multi) = ctx.session.multi.take() else {
        return Ok(Reply::error("ERR EXEC without MULTI"));
    };
    if multi.failed {
        return Ok(Reply::error(
            "EXECABORT Transaction discarded because of previous errors.",
        ));
    }
    let state = ctx.state;
    let slot = slot(ctx);
    let mut tx = TxKv {
        guard: slot.lock_writes(),
        state,
        overlay: HashMap::new(),
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
            Run::Read(f) | Run::Write(f) => {
                f(&mut tx, args).unwrap_or_else(|e| Reply::error(format!("ERR {e}")))
            }
            Run::Other { f, .. } => {
                let mut inner = Ctx {
                    state,
                    session: &mut *ctx.session,
                    wrote: false,
                };
                f(&mut inner, args).unwrap_or_else(|e| Reply::error(format!("ERR {e}")))
            }
        };
        replies.push(reply);
    }
    if !tx.overlay.is_empty() {
        let ks = tx.guard.keyspace(&state.store.db)?;
        let mut batch = ks.batch();
        for (key, value) in &tx.overlay {
            match value {
                Some(v) => batch.put(key, v),
                None => batch.delete(key),
            };
        }
        if let Err(e) = batch.commit_with(Durability::Buffered) {
            return Ok(Reply::error(format!(
                "EXECABORT the transaction's batch failed, nothing was applied: {e}"
            )));
        }
        ctx.wrote = true;
    }
    Ok(Reply::Array(replies))
}

// ---- connection and server ----------------------------------------------------------

fn cmd_ping(_ctx: &mut Ctx<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    Ok(match args {
        [_] => Reply::Status("PONG".into()),
        [_, msg] => Reply::Bulk(msg.clone()),
        _ => wrong_args("ping"),
    })
}

fn cmd_echo(_ctx: &mut Ctx<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    Ok(Reply::Bulk(args[1].clone()))
}

fn cmd_quit(ctx: &mut Ctx<'_>, _args: &[Vec<u8>]) -> tucana::Result<Reply> {
    ctx.session.close_after_reply = true;
    Ok(Reply::Ok)
}

fn cmd_select(ctx: &mut Ctx<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    match parse_i64(&args[1]) {
        Some(n) if n >= 0 && n < i64::from(ctx.state.store.databases()) => {
            ctx.session.db_index = n as u32;
            Ok(Reply::Ok)
        }
        Some(_) => Ok(Reply::error("ERR DB index is out of range")),
        None => Ok(not_an_integer()),
    }
}

/// Compares in time independent of where the first difference is.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for (i, x) in a.iter().enumerate() {
        diff |= usize::from(x ^ b.get(i).copied().unwrap_or(0));
    }
    diff == 0
}

/// Checks a user name and password; `Err` is the reply when they are wrong.
fn authenticate(ctx: &mut Ctx<'_>, user: Option<&[u8]>, password: &[u8]) -> Result<(), Reply> {
    let Some(expected) = ctx.state.config.requirepass.as_deref() else {
        return Err(Reply::error(
            "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
        ));
    };
    let user_ok = user.is_none_or(|u| u == b"default");
    if user_ok && same_secret(password, expected.as_bytes()) {
        ctx.session.authenticated = true;
        Ok(())
    } else {
        ctx.state.metrics.count_auth_failure();
        Err(Reply::error(
            "WRONGPASS invalid username-password pair or user is disabled.",
        ))
    }
}

fn cmd_auth(ctx: &mut Ctx<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let result = match args {
        [_, password] => authenticate(ctx, None, password),
        [_, user, password] => authenticate(ctx, Some(user), password),
        _ => return Ok(syntax_error()),
    };
    Ok(result.map_or_else(|e| e, |()| Reply::Ok))
}

/// HELLO [protover [AUTH username password] [SETNAME clientname]]
fn cmd_hello(ctx: &mut Ctx<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let mut protocol = ctx.session.protocol;
    if let Some(version) = args.get(1) {
        protocol = match parse_i64(version) {
            Some(2) => Protocol::Resp2,
            Some(3) => Protocol::Resp3,
            Some(_) => return Ok(Reply::error("NOPROTO unsupported protocol version")),
            None => {
                return Ok(Reply::error(
                    "ERR Protocol version is not an integer or out of range",
                ))
            }
        };
    }
    let mut name = None;
    let mut i = 2;
    while i < args.len() {
        match args[i].to_ascii_uppercase().as_slice() {
            b"AUTH" if i + 2 < args.len() => {
                if let Err(reply) = authenticate(ctx, Some(&args[i + 1]), &args[i + 2]) {
                    return Ok(reply);
                }
                i += 3;
            }
            b"SETNAME" if i + 1 < args.len() => {
                name = Some(args[i + 1].clone());
                i += 2;
            }
            _ => return Ok(syntax_error()),
        }
    }
    if !ctx.session.authenticated {
        return Ok(Reply::error(
            "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time",
        ));
    }
    if let Some(name) = name {
        ctx.session.name = Some(name);
    }
    ctx.session.protocol = protocol;
    let proto = if protocol == Protocol::Resp3 { 3 } else { 2 };
    let s = |t: &str| Reply::bulk(t);
    Ok(Reply::Map(vec![
        (s("server"), s("tucana")),
        (s("version"), s(REDIS_COMPAT_VERSION)),
        (s("proto"), Reply::Int(proto)),
        (s("id"), Reply::Int(ctx.session.id as i64)),
        (s("mode"), s("standalone")),
        (s("role"), s("master")),
        (s("modules"), Reply::Array(vec![])),
    ]))
}

fn client_info_line(ctx: &Ctx<'_>) -> String {
    let text = |v: &Option<Vec<u8>>| v.as_deref().map(|b| printable(b, 64)).unwrap_or_default();
    format!(
        "id={} name={} db={} resp={} lib-name={} lib-ver={}",
        ctx.session.id,
        text(&ctx.session.name),
        ctx.session.db_index,
        if ctx.session.protocol == Protocol::Resp3 {
            3
        } else {
            2
        },
        text(&ctx.session.lib_name),
        text(&ctx.session.lib_version),
    )
}

fn cmd_client(ctx: &mut Ctx<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let sub = args[1].to_ascii_uppercase();
    Ok(match (sub.as_slice(), &args[2..]) {
        (b"SETNAME", [name]) => {
            if name.iter().any(|&b| b <= b' ' || b > b'~') {
                Reply::error("ERR Client names cannot contain spaces, newlines or special characters.")
            } else {
                ctx.session.name = (!name.is_empty()).then(|| name.clone());
                Reply::Ok
            }
        }
        (b"GETNAME", []) => opt_bulk(ctx.session.name.clone()),
        (b"ID", []) => Reply::Int(ctx.session.id as i64),
        (b"SETINFO", [attr, value]) => match attr.to_ascii_uppercase().as_slice() {
            b"LIB-NAME" => {
                ctx.session.lib_name = Some(value.clone());
                Reply::Ok
            }
            b"LIB-VER" => {
                ctx.session.lib_version = Some(value.clone());
                Reply::Ok
            }
            _ => Reply::error(format!(
                "ERR Unrecognized option '{}'",
                printable(attr, 32)
            )),
        },
        (b"INFO", []) => Reply::Bulk(format!("{}\n", client_info_line(ctx)).into_bytes()),
        // Eviction and LRU do not exist here, so opting out of them changes nothing.
        (b"NO-EVICT" | b"NO-TOUCH", [_]) => Reply::Ok,
        _ => Reply::error(format!(
            "ERR unknown subcommand or wrong number of arguments for '{}'. Supported: SETNAME GETNAME ID SETINFO INFO",
            printable(&args[1], 32)
        )),
    })
}

fn command_entry(spec: &Spec, protocol: Protocol) -> Reply {
    let write = matches!(spec.run, Run::Write(_)) || matches!(spec.name, "flushdb" | "flushall");
    let flag = if write { "write" } else { "readonly" };
    let flags = vec![Reply::Status(flag.into())];
    Reply::Array(vec![
        Reply::bulk(spec.name),
        Reply::Int(i64::from(spec.arity)),
        if protocol == Protocol::Resp3 {
            Reply::Set(flags)
        } else {
            Reply::Array(flags)
        },
        Reply::Int(i64::from(spec.keys.0)),
        Reply::Int(i64::from(spec.keys.1)),
        Reply::Int(i64::from(spec.keys.2)),
    ])
}

fn cmd_command(ctx: &mut Ctx<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let protocol = ctx.session.protocol;
    let Some(sub) = args.get(1) else {
        return Ok(Reply::Array(
            table().iter().map(|s| command_entry(s, protocol)).collect(),
        ));
    };
    Ok(match sub.to_ascii_uppercase().as_slice() {
        b"COUNT" => Reply::Int(table().len() as i64),
        b"INFO" => Reply::Array(
            args[2..]
                .iter()
                .map(|n| lookup(n).map_or(Reply::Nil, |i| command_entry(&table()[i], protocol)))
                .collect(),
        ),
        // redis-cli asks for documentation to show hints; we have none to give.
        b"DOCS" => Reply::Map(vec![]),
        b"LIST" => Reply::Array(table().iter().map(|s| Reply::bulk(s.name)).collect()),
        _ => Reply::error(format!(
            "ERR unknown subcommand '{}'. Supported: COUNT INFO DOCS LIST",
            printable(sub, 32)
        )),
    })
}

/// CONFIG GET answers the parameters clients and tools ask about; CONFIG SET is refused
/// (the server is configured by its command line).
fn cmd_config(ctx: &mut Ctx<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let sub = args[1].to_ascii_uppercase();
    if sub.as_slice() != b"GET" {
        return Ok(Reply::error(format!(
            "ERR CONFIG {} is not supported: tucana serve is configured by its command line",
            printable(&args[1], 32)
        )));
    }
    if args.len() < 3 {
        return Ok(wrong_args("config|get"));
    }
    let config = &ctx.state.config;
    let idle = config.idle_timeout.map_or(0, |d| d.as_secs());
    let params: Vec<(&str, String)> = vec![
        ("bind", config.listen.ip().to_string()),
        ("port", config.listen.port().to_string()),
        ("databases", config.databases.to_string()),
        ("maxclients", config.max_clients.to_string()),
        ("timeout", idle.to_string()),
        // Every write goes to the log; there are no RDB snapshots.
        ("appendonly", "yes".into()),
        (
            "appendfsync",
            match config.durability {
                DurabilityMode::Sync => "always".into(),
                DurabilityMode::Buffered => "everysec".into(),
            },
        ),
        ("save", String::new()),
        ("maxmemory", "0".into()),
        ("maxmemory-policy", "noeviction".into()),
        (
            "proto-max-bulk-len",
            config.request_limits.max_bulk_bytes.to_string(),
        ),
    ];
    let mut out = Vec::new();
    for (name, value) in &params {
        if args[2..]
            .iter()
            .any(|p| glob_match(&p.to_ascii_lowercase(), name.as_bytes()))
        {
            out.push((Reply::bulk(*name), Reply::bulk(value.as_str())));
        }
    }
    Ok(Reply::Map(out))
}

fn cmd_info(ctx: &mut Ctx<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let sections: Vec<String> = args[1..]
        .iter()
        .map(|s| String::from_utf8_lossy(s).to_ascii_lowercase())
        .collect();
    let connected = ctx.state.metrics.connected_clients();
    Ok(Reply::Bulk(
        crate::metrics::info_text(ctx.state, &sections, connected).into_bytes(),
    ))
}

fn cmd_time(_ctx: &mut Ctx<'_>, _args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Ok(Reply::Array(vec![
        Reply::Bulk(now.as_secs().to_string().into_bytes()),
        Reply::Bulk(now.subsec_micros().to_string().into_bytes()),
    ]))
}

/// SAVE: a commit (the index is persisted as a new epoch; the data was in the log).
fn cmd_save(ctx: &mut Ctx<'_>, _args: &[Vec<u8>]) -> tucana::Result<Reply> {
    ctx.state.store.db.commit()?;
    Ok(Reply::Ok)
}

/// BGSAVE: the same commit, done before answering (it is quick: only the index changes).
fn cmd_bgsave(ctx: &mut Ctx<'_>, _args: &[Vec<u8>]) -> tucana::Result<Reply> {
    ctx.state.store.db.commit()?;
    Ok(Reply::Status("Background saving started".into()))
}

/// BGREWRITEAOF: a forced garbage collection of the log, Redis's way of compacting its
/// append-only file; done before answering, and INFO persistence counts what it gave back.
fn cmd_bgrewriteaof(ctx: &mut Ctx<'_>, _args: &[Vec<u8>]) -> tucana::Result<Reply> {
    ctx.state.store.db.gc()?;
    Ok(Reply::Status(
        "Background append only file rewriting started".into(),
    ))
}

/// SHUTDOWN [NOSAVE|SAVE|NOW|FORCE|ABORT]: stops the server as SIGTERM does (connections
/// finish their requests in flight, then a commit). NOSAVE is treated as SAVE: writes
/// were already acknowledged, and we never drop them.
fn cmd_shutdown(ctx: &mut Ctx<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    for arg in &args[1..] {
        match arg.to_ascii_uppercase().as_slice() {
            b"NOSAVE" | b"SAVE" | b"NOW" | b"FORCE" => {}
            b"ABORT" => return Ok(Reply::error("ERR No shutdown in progress.")),
            _ => return Ok(syntax_error()),
        }
    }
    ctx.session.shutdown_requested = true;
    ctx.session.close_after_reply = true;
    Ok(Reply::Ok)
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

    #[test]
    fn lookup_ignores_case_and_every_command_is_found() {
        assert!(lookup(b"gEt").is_some());
        assert!(lookup(b"expire").is_none());
        assert!(lookup(b"averyveryverylongcommandname").is_none());
        for (i, spec) in table().iter().enumerate() {
            assert_eq!(lookup(spec.name.to_ascii_uppercase().as_bytes()), Some(i));
            assert_eq!(spec.name, spec.name.to_ascii_lowercase());
        }
    }

    #[test]
    fn lex_bounds_follow_zrangebylex() {
        assert_eq!(lex_bound(b"-", true), Some(Bound::Unbounded));
        assert_eq!(lex_bound(b"+", true), None);
        assert_eq!(
            lex_bound(b"[a", false),
            Some(Bound::Included(b"a".to_vec()))
        );
        assert_eq!(lex_bound(b"(a", true), Some(Bound::Excluded(b"a".to_vec())));
        assert_eq!(lex_bound(b"a", true), None);
    }

    #[test]
    fn failed_syncs_replace_exactly_the_replies_of_writes() {
        let mut out = b"old:+OK\r\n$1\r\nv\r\n+OK\r\n".to_vec();
        let base = 4;
        replace_replies(&mut out, base, &[4..9, 16..21], "ERR not durable");
        assert_eq!(
            out,
            b"old:-ERR not durable\r\n$1\r\nv\r\n-ERR not durable\r\n"
        );
    }

    #[test]
    fn secrets_compare_exactly() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"abc", b"abcd"));
        assert!(!same_secret(b"", b"a"));
    }
}
