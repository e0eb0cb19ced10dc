//! Pipelined runs of collection writes: consecutive LPUSH, RPUSH, LPOP, RPOP, ZADD, ZREM,
//! HSET, SADD, ... requests of one batch run under one hold of the database's write lock
//! and reach the engine as one atomic batch ([`fast_collection_writes`]), as a run of SETs
//! does (`batch::fast_sets`).
//!
//! Why: alone, each of these commands takes the write lock, reads its key's metadata
//! (and deadline) from the engine, and appends its own small batch (an element and the
//! metadata). redis-benchmark's LPUSH, LPOP and ZADD hit one key with every request, so
//! in a pipeline of 16 the same metadata is read and rewritten 16 times. In a run, the
//! commands' writes wait in the overlay of [`TxKv`] (the store of `EXEC`): a command
//! reads the metadata its predecessor wrote from memory, and the engine gets one batch
//! with the last metadata and every element or member.
//!
//! What a client sees is what it would see one command at a time: each command runs its
//! own handler, unchanged, on a store whose reads see the run's earlier writes (an
//! emptied list is missing to the next LPOP, which answers nil; WRONGTYPE, lazy expiry of
//! a key whose deadline passed, new versions of a re-created key all come from the
//! handlers). No other writer runs in between (the lock is held), and reads of other
//! connections see the run's writes all at once, which is one of the orders Redis could
//! have served them in (it runs a client's pipelined batch before reading another's).
//! Durability is per batch as for every pipeline: the connection acknowledges the
//! replies of writes after the batch, once (in sync mode) they are durable, and a crash
//! keeps the run's batch whole or not at all.
//!
//! A run is not taken (the general path runs the requests) where it could answer
//! differently: keyspace notifications on (their order against the replies), a client
//! blocked on a key of this database (Redis serves it between two pushes), cluster mode
//! (routing), `MULTI`, or a request that is not a plain one of these commands with a
//! valid arity and a key outside the reserved family. If the run's batch fails as a
//! whole, nothing of it was applied and its requests run again one by one.
//!
//! Owns which requests may join a run and the run itself; the commands are their
//! handlers', the overlay and its commit `kv::TxKv`'s.
//!
//! Thread-safety: a run runs on its batch's thread and holds the database's write lock
//! from its first read to its commit (bounded by [`RUN_MAX_REQUESTS`] and
//! [`RUN_MAX_BYTES`]).

use std::ops::Range;
use std::sync::OnceLock;

use crate::expiry::is_reserved;
use crate::metrics::Tally;
use crate::resp::{ArgsBuf, Reply, Requests};
use crate::state::ServerState;

use super::kv::TxKv;
use super::table::{lookup, table, Run};
use super::Session;

/// The commands that may join a run: writes of one collection key each, whose handlers
/// read and write only through their `Kv` store with one `apply` as their last step.
const RUN_COMMANDS: &[&str] = &[
    "lpush", "rpush", "lpushx", "rpushx", "lpop", "rpop", "zadd", "zincrby", "zrem", "hset",
    "hmset", "hsetnx", "hdel", "hincrby", "sadd", "srem",
];

/// At most this many requests per run: the lock is held for the whole run.
pub(super) const RUN_MAX_REQUESTS: usize = 256;

/// A run is cut after this many bytes of arguments (the overlay holds them all until the
/// commit, and the lock is held while they are appended).
pub(super) const RUN_MAX_BYTES: usize = 1 << 20;

/// Whether the command at `index` of the table may join a run.
fn joins_runs(index: usize) -> bool {
    static JOINS: OnceLock<Vec<bool>> = OnceLock::new();
    JOINS.get_or_init(|| {
        table()
            .iter()
            .map(|spec| RUN_COMMANDS.contains(&spec.name))
            .collect()
    })[index]
}

/// Whether request `j` may join a run: one of [`RUN_COMMANDS`], a valid arity (else the
/// general path answers the error), its key outside the reserved family.
fn joins(requests: Requests<'_>, j: usize) -> bool {
    let argc = requests.arg_count(j);
    if argc < 2 {
        return false;
    }
    let Some(index) = lookup(requests.arg(j, 0)) else {
        return false;
    };
    if !joins_runs(index) {
        return false;
    }
    let arity = table()[index].arity;
    let argc = argc as i32;
    let arity_ok = if arity > 0 {
        argc == arity
    } else {
        argc >= -arity
    };
    arity_ok && !is_reserved(requests.arg(j, 1))
}

/// How many requests from `first` on may run as one run (0: the first may not join).
pub(super) fn run_length(requests: Requests<'_>, first: usize) -> usize {
    let mut bytes = 0;
    let mut run = 0;
    for j in first..requests.len() {
        if run == RUN_MAX_REQUESTS || (run > 0 && bytes >= RUN_MAX_BYTES) || !joins(requests, j) {
            break;
        }
        bytes += (0..requests.arg_count(j))
            .map(|n| requests.arg(j, n).len())
            .sum::<usize>();
        run += 1;
    }
    run
}

/// Whether a run may be taken now for `session` (see the module doc for why not).
pub(super) fn runs_allowed(state: &ServerState, session: &Session) -> bool {
    state.settings.notify_flags() == 0 && !state.store.slot(session.db_index).waiters().any()
}

/// Where a run's replies go, in its batch: the encoded replies, the batch's counts, and
/// where the replies of requests that wrote are (`batch::Written`).
pub(super) struct RunOutput<'o> {
    pub(super) out: &'o mut Vec<u8>,
    pub(super) tally: &'o mut Tally,
    pub(super) written: &'o mut Vec<Range<usize>>,
}

/// Runs the requests of `run` (each one [`joins`]) as one run: their replies encoded into
/// `output` in order, their writes applied as one engine batch. Returns `false`, with
/// nothing applied and nothing encoded, if that batch failed: the caller then runs the
/// requests one by one on the general path, so each reply says what happened to it
/// (the keyspace hits and misses of the failed run stay counted).
pub(super) fn fast_collection_writes(
    state: &ServerState,
    session: &Session,
    requests: Requests<'_>,
    run: Range<usize>,
    output: RunOutput<'_>,
) -> bool {
    let slot = state.store.slot(session.db_index);
    let mut tx = TxKv::for_run(slot.lock_writes(), state);
    let out = output.out;
    let mark = out.len();
    let mut commands: Vec<usize> = Vec::with_capacity(run.len());
    let mut errors = 0;
    let mut written = Vec::new();
    let mut borrowed: Vec<&[u8]> = Vec::new();
    let mut owned = ArgsBuf::default();
    for j in run {
        requests.args_into(j, &mut borrowed);
        let args = owned.fill(&borrowed);
        let index = lookup(&args[0]).expect("a run's commands are in the table");
        let Run::Write(f) = table()[index].run else {
            unreachable!("a run's commands are plain writes");
        };
        commands.push(index);
        let reply = f(&mut tx, args).unwrap_or_else(|e| Reply::error(super::error_text(&e)));
        if reply.is_error() {
            errors += 1;
        }
        let at = out.len();
        reply.encode(session.protocol, out);
        if tx.take_wrote() {
            written.push(at..out.len());
        }
    }
    if tx.commit().is_err() {
        out.truncate(mark);
        return false;
    }
    for index in commands {
        output.tally.command(index, 1);
    }
    for _ in 0..errors {
        output.tally.error();
    }
    output.written.extend(written);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::{command_count, execute_batch};
    use crate::metrics::Metrics;
    use crate::resp::{decode_into, RequestLimits, RequestSpans};

    /// A server state over an in-memory database, as `Server::bind` makes one.
    fn state() -> ServerState {
        let db = tucana::Database::builder().open_in_memory().unwrap();
        let config = crate::ServerConfig::default();
        ServerState::new(db, config, Metrics::new(command_count()), 0, None).unwrap()
    }

    /// The requests of `lines` (inline commands) in one buffer.
    fn wire(lines: &[String]) -> Vec<u8> {
        lines
            .iter()
            .flat_map(|l| format!("{l}\r\n").into_bytes())
            .collect()
    }

    /// Runs `wire` as one pipelined batch; its replies.
    fn batch(state: &ServerState, session: &mut Session, wire: &[u8]) -> Vec<u8> {
        let mut spans = RequestSpans::default();
        let mut at = 0;
        while let Some(n) = decode_into(wire, at, &RequestLimits::DEFAULT, &mut spans).unwrap() {
            at += n;
        }
        assert_eq!(at, wire.len(), "every request decodes");
        let mut out = Vec::new();
        let _written = execute_batch(state, session, spans.in_buffer(wire), &mut out);
        out
    }

    include!("../../tests/common/pipelined_runs_script.rs");

    /// A list `e` and a sorted set `ez` whose deadlines have passed.
    fn with_expired(state: &ServerState, session: &mut Session) {
        let setup = ["RPUSH e 1 2", "PEXPIRE e 1", "ZADD ez 1 a", "PEXPIRE ez 1"];
        let replies = batch(state, session, &wire(&setup.map(String::from)));
        assert_eq!(replies, b":2\r\n:1\r\n:1\r\n:1\r\n");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }

    #[test]
    fn a_pipelined_run_answers_as_its_commands_one_at_a_time() {
        let lines = script();
        let (piped, alone) = (state(), state());
        let (mut piped_session, mut alone_session) = (Session::new(1, true), Session::new(2, true));
        with_expired(&piped, &mut piped_session);
        with_expired(&alone, &mut alone_session);
        assert!(runs_allowed(&piped, &piped_session));
        let together = batch(&piped, &mut piped_session, &wire(&lines));
        let mut one_by_one = Vec::new();
        for line in &lines {
            let request = wire(std::slice::from_ref(line));
            one_by_one.extend(batch(&alone, &mut alone_session, &request));
        }
        assert_eq!(
            String::from_utf8_lossy(&together),
            String::from_utf8_lossy(&one_by_one)
        );
        // Spot checks that the script tests what it says.
        let text = String::from_utf8_lossy(&together);
        assert!(text.contains("-WRONGTYPE"), "{text}");
        assert!(text.contains("$-1\r\n*-1\r\n"), "pops past the end: {text}");
    }

    /// A run reads each key's deadline record once and keeps it (`TxKv::for_run`). The
    /// kept reading goes stale when the run itself writes that record: a push onto a
    /// list whose deadline has passed makes a new list and deletes the old deadline, and
    /// a pop that empties a list deletes the key and its deadline. Were the stale
    /// deadline believed, the run's next push would find its own new list expired and
    /// start another (losing the first push), and a refilled key would carry the old
    /// deadline; the overlay's delete must win. The same script runs one request at a
    /// time on another server, and replies and deadlines must agree.
    #[test]
    fn a_run_that_empties_and_refills_a_list_with_a_deadline_forgets_the_deadline() {
        let setup = [
            "RPUSH q 1 2",
            "PEXPIRE q 100000",
            "ZADD zq 1 a",
            "PEXPIRE zq 100000",
            "RPUSH old 1",
            "PEXPIRE old 1",
        ];
        let lines: Vec<String> = [
            "LPUSH q 0",
            "LPOP q",
            "LPOP q",
            "LPOP q",
            "RPUSH q new",
            "LPUSH q newer",
            "ZADD zq 2 b",
            "ZREM zq a",
            "ZREM zq b",
            "ZADD zq 3 c",
            "LPUSH keep x",
            "RPUSH old a",
            "RPUSH old b",
        ]
        .map(String::from)
        .to_vec();
        let checks = [
            "PTTL q",
            "LRANGE q 0 -1",
            "PTTL zq",
            "ZRANGE zq 0 -1",
            "PTTL keep",
            "PTTL old",
            "LRANGE old 0 -1",
        ];
        let (piped, alone) = (state(), state());
        let (mut piped_session, mut alone_session) = (Session::new(1, true), Session::new(2, true));
        let mut answers = Vec::new();
        for (state, session, pipelined) in [
            (&piped, &mut piped_session, true),
            (&alone, &mut alone_session, false),
        ] {
            batch(state, session, &wire(&setup.map(String::from)));
            // `old`'s deadline passes; the sweeper is not running.
            std::thread::sleep(std::time::Duration::from_millis(5));
            let mut replies = Vec::new();
            if pipelined {
                replies.extend(batch(state, session, &wire(&lines)));
            } else {
                for line in &lines {
                    replies.extend(batch(state, session, &wire(std::slice::from_ref(line))));
                }
            }
            replies.extend(batch(state, session, &wire(&checks.map(String::from))));
            answers.push(String::from_utf8_lossy(&replies).into_owned());
        }
        assert_eq!(answers[0], answers[1]);
        let expected_checks = concat!(
            ":-1\r\n*2\r\n$5\r\nnewer\r\n$3\r\nnew\r\n",
            ":-1\r\n*1\r\n$1\r\nc\r\n",
            ":-1\r\n",
            ":-1\r\n*2\r\n$1\r\na\r\n$1\r\nb\r\n",
        );
        assert!(
            answers[0].ends_with(expected_checks),
            "no refilled or remade key keeps a deadline, and `old` is remade once: {}",
            answers[0]
        );
    }

    #[test]
    fn runs_are_the_plain_collection_writes_up_to_the_bounds() {
        let lines = script();
        let wire = wire(&lines);
        let mut spans = RequestSpans::default();
        let mut at = 0;
        while let Some(n) = decode_into(&wire, at, &RequestLimits::DEFAULT, &mut spans).unwrap() {
            at += n;
        }
        let requests = spans.in_buffer(&wire);
        // LPUSH l .. LPUSH ez: 15 requests, up to LLEN.
        assert_eq!(run_length(requests, 0), 15);
        assert_eq!(run_length(requests, 15), 0, "LLEN reads");
        // ZADD z .. ZADD kept, up to SET.
        assert_eq!(run_length(requests, 16), 23);
        assert_eq!(run_length(requests, 39), 0, "SET");
        assert_eq!(run_length(requests, 40), 2, "LPUSH str, SADD str");
        assert_eq!(run_length(requests, 42), 0, "LPUSH without arguments");
        // LPOP l -1 and LPOP l, up to DEL.
        assert_eq!(run_length(requests, 43), 2);
        assert_eq!(run_length(requests, 45), 0, "DEL");
        // LPOP l, RPUSH l, the writes of `kept`, then the pushes and pops of `big`, cut
        // at the bound.
        assert_eq!(run_length(requests, 46), RUN_MAX_REQUESTS);
        // A reserved key takes the general path (which refuses it).
        let key = [crate::expiry::RESERVED, b"k"].concat();
        let mut reserved = format!("*3\r\n$5\r\nLPUSH\r\n${}\r\n", key.len()).into_bytes();
        reserved.extend_from_slice(&key);
        reserved.extend_from_slice(b"\r\n$1\r\nx\r\n");
        let mut spans = RequestSpans::default();
        decode_into(&reserved, 0, &RequestLimits::DEFAULT, &mut spans).unwrap();
        assert_eq!(run_length(spans.in_buffer(&reserved), 0), 0);
    }

    #[test]
    fn every_run_command_is_a_plain_write_of_one_key() {
        for name in RUN_COMMANDS {
            let index = lookup(name.as_bytes()).unwrap_or_else(|| panic!("{name} is served"));
            let spec = &table()[index];
            assert!(matches!(spec.run, Run::Write(_)), "{name}");
            assert_eq!(spec.keys, (1, 1, 1), "{name}");
            assert!(joins_runs(index), "{name}");
        }
        for other in ["set", "del", "lmove", "blpop", "zunionstore", "get"] {
            assert!(!joins_runs(lookup(other.as_bytes()).unwrap()), "{other}");
        }
    }
}
