//! Running a pipelined batch of requests: [`execute_batch`] and the fast paths of plain
//! `GET key` and `SET key value` runs (runs of collection writes are `runs`'), and
//! [`Written`], where in the batch's output the replies of its writes are.
//!
//! Owns the order requests run in and the encoding of their replies into the
//! connection's output buffer, and the batch's [`Tally`] of counts. It does not own
//! durability's wait (the connection awaits the syncer, or syncs on a blocking thread,
//! before any reply is sent) nor what the commands do (handlers, through `execute`).
//!
//! Thread-safety: a batch runs on one thread, the connection's or a blocking one, and
//! may block on the database's write lock.

use std::ops::Range;

use tucana::Durability;

use crate::expiry::{deadline_key, decode_deadline, is_reserved, now_ms};
use crate::metrics::Tally;
use crate::resp::{encode_bulk, encode_error, encode_nil, ArgsBuf, Reply, Requests};
use crate::state::ServerState;
use crate::syncer::NotDurable;

use super::prefetch::prefetch_window;
use super::runs;
use super::table::lookup;
use super::{execute, Call, Session};

/// Runs a pipelined batch of requests and appends their encoded replies to `out`.
///
/// Replies are encoded into `out` as each request runs. Writes are applied buffered; the returned [`Written`] says where
/// their replies are, so that in sync mode the caller makes them durable (one sync for
/// the batch) before it sends anything, and turns them into errors if that sync fails.
///
/// Plain `GET key` and `SET key value` (the bulk of a cache's traffic) take a fast path
/// when the connection is authenticated and not in `MULTI`: a run of consecutive ones
/// reads one keyspace handle (GET, values encoded from where they lie) or takes the write
/// lock once and applies the run as one engine batch (SET). A run of collection writes
/// (LPUSH, LPOP, ZADD, HSET, ...) runs its handlers under one hold of the write lock with
/// their writes in one engine batch (`runs`). Their replies are what the general path
/// would answer; anything else goes through [`execute`].
pub fn execute_batch(
    state: &ServerState,
    session: &mut Session,
    requests: Requests<'_>,
    out: &mut Vec<u8>,
) -> Written {
    let base = out.len();
    let mut replies = Replies {
        out,
        tally: Tally::default(),
        written: Vec::new(),
        read: Vec::new(),
    };
    let mut args: Vec<&[u8]> = Vec::new();
    let mut owned = ArgsBuf::default();
    // Requests before this index run on the general path (a run of them failed).
    let mut one_by_one_until = 0;
    // Requests before this index had their keys' records asked for (`prefetch`).
    let mut prefetched_until = 0;
    let mut i = 0;
    while i < requests.len() {
        if i >= prefetched_until && session.authenticated {
            prefetched_until = prefetch_window(state, session, requests, i);
        }
        requests.args_into(i, &mut args);
        if args.is_empty() {
            i += 1;
            continue;
        }
        // Cluster mode routes every key (`routing`); the fast paths do not. GETs look
        // deadlines up; a run of SETs that would drop one takes the general path.
        let fast = session.authenticated
            && session.multi.is_none()
            && state.cluster.is_none()
            && !session.in_resp2_pubsub()
            && session.replies_on();
        // A GET that misses raises `keymiss` when the `m` class is on: the general path.
        if fast
            && is_plain(&args, b"get", 2)
            && !crate::notify::wants(state.settings.notify_flags(), crate::notify::KEY_MISS)
        {
            let run = run_length(requests, i, b"get", 2);
            fast_gets(state, session, requests, i..i + run, &mut replies);
            i += run;
            continue;
        }
        // With keyspace notifications on, SETs take the general path, which raises them.
        if fast && is_plain(&args, b"set", 3) && state.settings.notify_flags() == 0 {
            let run = set_run_length(requests, i);
            let done = match run {
                0 => 0,
                _ => fast_sets(state, session, requests, i..i + run, &mut replies),
            };
            if done > 0 {
                i += done;
                continue;
            }
        }
        // A run of collection writes (LPUSH, LPOP, ZADD, HSET, ...): one lock hold, one
        // engine batch (`runs`); a run whose batch failed goes one by one.
        if fast && i >= one_by_one_until {
            let run = runs::run_length(requests, i);
            if run >= 2 && runs::runs_allowed(state, session) {
                let output = runs::RunOutput {
                    out: &mut *replies.out,
                    tally: &mut replies.tally,
                    written: &mut replies.written,
                };
                if runs::fast_collection_writes(state, session, requests, i..i + run, output) {
                    i += run;
                    continue;
                }
                one_by_one_until = i + run;
            }
        }
        let mut call = Call {
            state,
            session: &mut *session,
            wrote: false,
        };
        run_general(&mut call, owned.fill(&args), &mut replies);
        // A blocked request is its batch's last (the connection decodes up to it).
        if session.close_after_reply || session.blocked.is_some() {
            break;
        }
        i += 1;
    }
    state.metrics.add_tally(&replies.tally);
    Written {
        base,
        ranges: replies.written,
        reads: replies.read,
    }
}

/// Runs one request on the general path and encodes its reply; a blocking pop that
/// found nothing notes where its placeholder reply starts.
fn run_general(call: &mut Call<'_>, args: &[Vec<u8>], replies: &mut Replies<'_>) {
    let reads = call.session.reads_noted;
    let reply = execute(call, args);
    if reply.is_error() {
        replies.tally.error();
    }
    // The protocol in force when the reply was made (HELLO switches it).
    let at = replies.out.len();
    if call.session.take_reply_suppressed() {
        // CLIENT REPLY OFF or SKIP: only Pub/Sub's push frames go out, as in Redis.
        encode_pushes(&reply, call.session.protocol, replies.out);
    } else {
        reply.encode(call.session.protocol, replies.out);
    }
    if call.wrote {
        replies.written.push(at..replies.out.len());
    } else if call.session.reads_noted != reads {
        replies.read.push(at..replies.out.len());
    }
    if let Some(blocked) = &mut call.session.blocked {
        blocked.reply_at = at;
    }
}

/// Encodes only the Pub/Sub frames of `reply` (those Redis sends even to a client
/// that turned its replies off).
fn encode_pushes(reply: &Reply, protocol: crate::resp::Protocol, out: &mut Vec<u8>) {
    match reply {
        Reply::Push(_) | Reply::Encoded(_) => reply.encode(protocol, out),
        Reply::Frames(frames) => {
            for frame in frames {
                encode_pushes(frame, protocol, out);
            }
        }
        _ => {}
    }
}

/// Runs a blocked request again (its connection was woken, see `blocking`), appending
/// its reply to `out`. If it still finds nothing, `session.blocked` is set again and the
/// reply is its placeholder.
pub fn retry_blocked(
    state: &ServerState,
    session: &mut Session,
    args: &[Vec<u8>],
    out: &mut Vec<u8>,
) -> Written {
    let base = out.len();
    let mut replies = Replies {
        out,
        tally: Tally::default(),
        written: Vec::new(),
        read: Vec::new(),
    };
    session.retrying = true;
    let mut call = Call {
        state,
        session,
        wrote: false,
    };
    run_general(&mut call, args, &mut replies);
    call.session.retrying = false;
    state.metrics.add_tally(&replies.tally);
    Written {
        base,
        ranges: replies.written,
        reads: replies.read,
    }
}

/// A batch's replies as they are encoded, with what the batch counted and where the
/// replies of its writes are.
struct Replies<'o> {
    out: &'o mut Vec<u8>,
    tally: Tally,
    /// Where in `out` the replies of requests that wrote are (sync mode may replace them).
    written: Vec<Range<usize>>,
    /// Where the replies of requests that read a region as its primary are (cluster
    /// mode with sync durability may replace them: see `Session::read_keyspaces`).
    read: Vec<Range<usize>>,
}

/// Where in a batch's output the replies of its writes are: in sync mode they may be
/// sent only once the writes are durable.
#[must_use = "in sync mode the writes must be made durable before their replies are sent"]
pub struct Written {
    /// `out.len()` when the batch started.
    base: usize,
    /// Ascending, at or after `base`.
    ranges: Vec<Range<usize>>,
    /// The replies of reads of a region as its primary (cluster mode), ascending.
    reads: Vec<Range<usize>>,
}

impl Written {
    /// Whether the batch wrote nothing (nothing to make durable).
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Whether the batch read a region as its primary (cluster mode).
    pub fn has_reads(&self) -> bool {
        !self.reads.is_empty()
    }

    /// The sync after the batch failed, or its backups did not acknowledge it: the
    /// writes are applied (and visible) but not known to be durable, and their replies
    /// now say so, as do the replies of its reads (what they saw may be lost).
    pub fn not_durable(&self, out: &mut Vec<u8>, why: &NotDurable) {
        let text = why.reply_text();
        let read_text = read_refusal(&text);
        let mut ranges: Vec<(Range<usize>, &str)> = self
            .ranges
            .iter()
            .map(|r| (r.clone(), text.as_str()))
            .chain(self.reads.iter().map(|r| (r.clone(), read_text.as_str())))
            .collect();
        ranges.sort_by_key(|(r, _)| r.start);
        replace_replies(out, self.base, &ranges);
    }

    /// The batch's reads may not be answered (this server no longer leads their region,
    /// or its lease is gone): their replies become the refusal `text` (a write's, which
    /// is reworded for a read).
    pub fn reads_refused(&self, out: &mut Vec<u8>, text: &str) {
        let text = read_refusal(text);
        let ranges: Vec<_> = self
            .reads
            .iter()
            .map(|r| (r.clone(), text.as_str()))
            .collect();
        replace_replies(out, self.base, &ranges);
    }
}

/// A write's refusal `text` (a gate's or the backups') as a read's: same error code, so
/// clients react alike, with words about the read.
fn read_refusal(text: &str) -> String {
    let code = text.split(' ').next().unwrap_or_default();
    match code {
        "NOREPLICAS" => "NOREPLICAS the backups have not acknowledged what this read saw in time (a failover could lose it): not answered".into(),
        "READONLY" => "READONLY this server may no longer lead this slot (its cluster lease is not valid, or a backup was promoted): the read is not answered".into(),
        _ if text.starts_with("ERR the write was applied") => {
            "ERR what this read saw could not be made durable: not answered".into()
        }
        _ => text.to_string(),
    }
}

/// Replaces the replies at `ranges` (ascending, at or after `base`) with their error text.
fn replace_replies(out: &mut Vec<u8>, base: usize, ranges: &[(Range<usize>, &str)]) {
    let old = out.split_off(base);
    let mut from = 0;
    for (range, text) in ranges {
        let (start, end) = (range.start - base, range.end - base);
        assert!(from <= start && start <= end && end <= old.len());
        out.extend_from_slice(&old[from..start]);
        encode_error(text, out);
        from = end;
    }
    out.extend_from_slice(&old[from..]);
}

/// Whether `args` is `name` (any case) with exactly `argc` arguments, the name included.
/// A key in the reserved family of deadlines is refused by the general path.
fn is_plain(args: &[&[u8]], name: &[u8], argc: usize) -> bool {
    args.len() == argc && args[0].eq_ignore_ascii_case(name) && !is_reserved(args[1])
}

/// How many requests from `first` on are plain `name` requests (at least the first).
fn run_length(requests: Requests<'_>, first: usize, name: &[u8], argc: usize) -> usize {
    (first..requests.len())
        .take_while(|&j| {
            requests.arg_count(j) == argc
                && requests.arg(j, 0).eq_ignore_ascii_case(name)
                && !is_reserved(requests.arg(j, 1))
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
        // A value that starts like a collection's metadata is refused by the general path.
        if crate::types::is_typed(requests.arg(j, 2)) {
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

/// Keys a fast-path GET looks up at once (`Keyspace::get_many_with`, whose lookups
/// overlap their cache misses); a group of pipelined GETs is what redis-benchmark -P
/// sends.
const GROUP: usize = 32;

/// A run of plain `GET key`: one read of the keyspace handle for the run (which reads as
/// the database was when the run started, as Redis, which runs a client's pipelined
/// batch without interleaving others, would), each value encoded from where it lies.
fn fast_gets(
    state: &ServerState,
    session: &Session,
    requests: Requests<'_>,
    run: Range<usize>,
    replies: &mut Replies<'_>,
) {
    replies
        .tally
        .command(command_index(b"get"), run.len() as u64);
    let out = &mut *replies.out;
    let protocol = session.protocol;
    let mark = out.len();
    let mut local = Tally::default();
    // Keys go to the engine in groups of `GROUP`, with their deadline records first when
    // the database may hold some.
    let slot = state.store.slot(session.db_index);
    let may_expire = slot.may_expire();
    let now = now_ms();
    let read = slot.read(|ks| {
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
            let deadlines = if may_expire {
                group_deadlines(ks, &keys[..group.len()], now)?
            } else {
                [Deadline::Live; GROUP]
            };
            ks.get_many_with(&keys[..group.len()], |i, found| {
                match (found, deadlines[i]) {
                    (Ok(Some(_)), Deadline::Damaged) => {
                        local.error();
                        encode_error("ERR damaged deadline record", out);
                    }
                    // A collection's metadata: GET answers as on any other type.
                    (Ok(Some(value)), Deadline::Live) if crate::types::is_typed(value) => {
                        local.lookup(true);
                        encode_error(
                            "WRONGTYPE Operation against a key holding the wrong kind of value",
                            out,
                        );
                    }
                    (Ok(Some(value)), Deadline::Live) => {
                        local.lookup(true);
                        encode_bulk(value, out);
                    }
                    (Ok(_), _) => {
                        local.lookup(false);
                        encode_nil(protocol, out);
                    }
                    (Err(e @ tucana::Error::KeyspaceNotFound(_)), _) => dropped = Some(e),
                    (Err(e), _) => {
                        local.error();
                        encode_error(&super::error_text(&e), out);
                    }
                }
            });
            if let Some(e) = dropped.take() {
                return Err(e);
            }
        }
        Ok(())
    });
    if let Err(e) = read {
        // A keyspace dropped again and again, or a failed read of deadline records:
        // every GET of the run fails.
        out.truncate(mark);
        local = Tally::default();
        for _ in run {
            local.error();
            encode_error(&super::error_text(&e), out);
        }
    }
    replies.tally.merge(&local);
}

/// What a GET of the fast path learns from a key's deadline record.
#[derive(Clone, Copy)]
enum Deadline {
    /// No deadline, or one not passed.
    Live,
    Expired,
    /// Not a deadline record: the GET answers an error.
    Damaged,
}

/// The deadlines of a group of keys, read together (a miss each for keys without one).
/// Read before the values: a write in between (which would drop or move a deadline)
/// makes the GET answer as before that write or after it, never a mix that shows an
/// expired value.
fn group_deadlines(
    ks: &tucana::Keyspace,
    keys: &[&[u8]],
    now: u64,
) -> tucana::Result<[Deadline; GROUP]> {
    let records: Vec<Vec<u8>> = keys.iter().map(|k| deadline_key(k)).collect();
    let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
    let mut deadlines = [Deadline::Live; GROUP];
    let mut failed = None;
    ks.get_many_with(&refs, |i, found| match found {
        Ok(Some(bytes)) => {
            deadlines[i] = match decode_deadline(bytes) {
                // Live at the deadline itself, as everywhere.
                Ok(d) if d < now => Deadline::Expired,
                Ok(_) => Deadline::Live,
                Err(_) => Deadline::Damaged,
            }
        }
        Ok(None) => {}
        Err(e) => failed = Some(e),
    });
    match failed {
        Some(e) => Err(e),
        None => Ok(deadlines),
    }
}

/// The index of the first of `keys` that has a deadline record (a failed read counts as
/// one: the general path then answers the error).
fn first_with_deadline(ks: &tucana::Keyspace, keys: &[&[u8]]) -> Option<usize> {
    for (n, group) in keys.chunks(GROUP).enumerate() {
        let records: Vec<Vec<u8>> = group.iter().map(|k| deadline_key(k)).collect();
        let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
        let mut first = None;
        ks.get_many_with(&refs, |i, record| {
            if first.is_none() && !matches!(record, Ok(None)) {
                first = Some(i);
            }
        });
        if let Some(i) = first {
            return Some(n * GROUP + i);
        }
    }
    None
}

/// A run of plain `SET key value`: the database's write lock taken once and the run
/// applied as one engine batch (one append of the records, one trip through the engine's
/// writer lock). Every SET of the run answers `+OK`, as each would alone. If the batch
/// fails (a value over the engine's limit, say) before anything was applied, each SET is
/// applied alone so each reply says what happened to it.
///
/// Where keys may have deadlines, the run's deadline records are looked up under the lock
/// first (a miss each, for keys without one); the run stops before the first key that has
/// one, which its SET must drop and so takes the general path. Returns how many SETs were
/// applied (0: the first has a deadline).
fn fast_sets(
    state: &ServerState,
    session: &Session,
    requests: Requests<'_>,
    mut run: Range<usize>,
    replies: &mut Replies<'_>,
) -> usize {
    let Replies {
        out,
        tally,
        written,
        ..
    } = replies;
    let pair = |j: usize| (requests.arg(j, 1), requests.arg(j, 2));
    let guard = state.store.slot(session.db_index).lock_writes();
    if guard.may_expire() {
        let keys: Vec<&[u8]> = run.clone().map(|j| pair(j).0).collect();
        if let Some(first) = guard
            .existing()
            .and_then(|ks| first_with_deadline(&ks, &keys))
        {
            run.end = run.start + first;
        }
        if run.is_empty() {
            return 0;
        }
    }
    tally.command(command_index(b"set"), run.len() as u64);
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
        // Fast paths run outside cluster mode only: stored keys are the clients'.
        Ok(_) => guard.modified(run.clone().map(|j| pair(j).0), false),
        // A failed single SET is its own answer; a failed batch is retried one by one.
        Err(e) if run.len() == 1 => {
            tally.error();
            let at = out.len();
            encode_error(&super::error_text(&e), out);
            written.push(at..out.len());
            return run.len();
        }
        Err(_) => {
            one_by_one = Some(
                guard
                    .keyspace(&state.store.db)
                    .map_err(|e| super::error_text(&e)),
            )
        }
    }
    for j in run.clone() {
        let at = out.len();
        let result = match &one_by_one {
            None => Ok(()),
            Some(Ok(ks)) => {
                let (key, value) = pair(j);
                let put = ks.put_with(key, value, Durability::Buffered);
                guard.modified([key], false);
                put.map_err(|e| super::error_text(&e))
            }
            Some(Err(e)) => Err(e.clone()),
        };
        match result {
            Ok(()) => out.extend_from_slice(b"+OK\r\n"),
            Err(e) => {
                tally.error();
                encode_error(&e, out);
            }
        }
        written.push(at..out.len());
    }
    // A SET over a collection abandons its version (there is none without the marker).
    if guard.may_expire() {
        guard.note_abandoned();
    }
    run.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_syncs_replace_exactly_the_replies_of_writes() {
        let mut out = b"old:+OK\r\n$1\r\nv\r\n+OK\r\n".to_vec();
        let base = 4;
        replace_replies(
            &mut out,
            base,
            &[(4..9, "ERR not durable"), (16..21, "ERR not durable")],
        );
        assert_eq!(
            out,
            b"old:-ERR not durable\r\n$1\r\nv\r\n-ERR not durable\r\n"
        );
    }

    #[test]
    fn a_failed_acknowledgement_refuses_the_reads_with_their_own_words() {
        // A write (+OK) and a read ($1 v) of the same batch, the backups silent.
        let mut out = b"+OK\r\n$1\r\nv\r\n".to_vec();
        let written = Written {
            base: 0,
            ranges: vec![Range { start: 0, end: 5 }],
            reads: vec![Range { start: 5, end: 12 }],
        };
        let why = NotDurable::Acks("NOREPLICAS Not enough good replicas to write.".into());
        written.not_durable(&mut out, &why);
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.split("\r\n").collect();
        assert_eq!(lines[0], "-NOREPLICAS Not enough good replicas to write.");
        assert!(lines[1].starts_with("-NOREPLICAS "), "{text}");
        assert!(lines[1].contains("read"), "{text}");
        assert_eq!(lines.len(), 3, "{text}");
    }
}
