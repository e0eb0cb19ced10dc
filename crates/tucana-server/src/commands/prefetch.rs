//! Asking the engine, before a pipelined batch's requests run, for the records their
//! keys name ([`prefetch_window`]), so that with data larger than memory a pipeline of
//! HGETALLs or HSETs on different keys waits for one round of device reads in flight
//! together instead of one read per request, each taken at depth one on the
//! connection's thread.
//!
//! Owns which requests' keys are asked for: each keyed command's first key (the
//! metadata record of a collection, or a string), except plain `GET` (its fast path
//! asks for its own group, `Region::get_many_with`) and `SET` (it reads nothing). It does
//! not own whether asking pays (the engine's residency gate: while the data is found in
//! memory, a call returns before a key is taken from the iterator, so the command
//! table is not even consulted), nor running the requests (`batch`).
//!
//! Thread-safety: runs on the batch's thread; the engine call is a hint that takes no
//! lock but the keyspace handle's.

use crate::expiry::is_reserved;
use crate::resp::Requests;
use crate::state::ServerState;
use crate::types::{is_typed, sub_key, Family, Kind, Meta};

use super::table::{lookup, table};
use super::Session;

/// Requests whose keys are asked for together: a window covers a pipeline of the size
/// clients use (redis-benchmark's -P 16, a client library's batches) in one call, and
/// stays small enough that the first records asked for are not evicted by the last
/// before they are read.
pub(super) const WINDOW_REQUESTS: usize = 64;

/// Asks for the records of the first keys of requests `from..` (at most
/// [`WINDOW_REQUESTS`] of them) and returns where the window ends. Called by the batch
/// when it reaches the end of the previous window. Only outside `MULTI` (queued requests
/// run at `EXEC`) and outside cluster mode (there keys are stored under their region's
/// names, `routing`).
pub(super) fn prefetch_window(
    state: &ServerState,
    session: &Session,
    requests: Requests<'_>,
    from: usize,
) -> usize {
    let end = (from + WINDOW_REQUESTS).min(requests.len());
    if end - from < 2 || session.multi.is_some() || state.cluster.is_some() {
        return end;
    }
    let keys = (from..end).filter_map(|j| first_read_key(requests, j));
    // A hint: a failure to reach the keyspace costs only the speed-up.
    let _ = state.store.slot(session.db_index).read(|ks| {
        if let Some(ks) = ks {
            ks.prefetch(keys.clone());
            ks.prefetch_dependent(member_keys(ks, requests, from..end));
        }
        Ok(())
    });
    end
}

/// The sub-records the requests `range` read once they have their key's metadata (the
/// member's record of a ZADD, ZSCORE, SADD or SISMEMBER): made from each key's
/// metadata, read as the engine takes the keys. Lazy, so while the engine finds them in
/// memory (and takes no key) nothing is read or made; out of memory the metadata was
/// just asked for by the first call, and a run of requests on one key reads it once.
fn member_keys<'r>(
    ks: &'r tucana::Keyspace,
    requests: Requests<'r>,
    range: std::ops::Range<usize>,
) -> impl Iterator<Item = Vec<u8>> + 'r {
    member_requests(ks, requests, range).flat_map(move |r| {
        let MemberRequest {
            j,
            key,
            meta,
            family,
            args,
        } = r;
        args.map(move |n| sub_key(family, key, meta.version, requests.arg(j, n)))
    })
}

/// A request of a window that reads members' records under its key's metadata.
struct MemberRequest<'r> {
    /// The request's index.
    j: usize,
    key: &'r [u8],
    /// The collection's metadata, of the kind the command needs.
    meta: Meta,
    /// The members' records' family.
    family: Family,
    /// The arguments that name members.
    args: std::iter::StepBy<std::ops::Range<usize>>,
}

/// The requests of `range` that read members' records, each with its key's metadata
/// (read in place, once per run of requests on one key; a key missing or of another
/// kind drops the request).
fn member_requests<'r>(
    ks: &'r tucana::Keyspace,
    requests: Requests<'r>,
    range: std::ops::Range<usize>,
) -> impl Iterator<Item = MemberRequest<'r>> + 'r {
    let mut last: Option<(&'r [u8], Option<Meta>)> = None;
    range.filter_map(move |j| {
        let (kind, family, args) = member_args(requests, j)?;
        let key = requests.arg(j, 1);
        if last.as_ref().is_none_or(|(k, _)| *k != key) {
            last = Some((key, collection_meta(ks, key)));
        }
        let meta = last
            .as_ref()
            .and_then(|(_, meta)| *meta)
            .filter(|meta| meta.kind == kind)?;
        Some(MemberRequest {
            j,
            key,
            meta,
            family,
            args,
        })
    })
}

/// The metadata at `key` if it holds a collection, read in place (a hint: damage or an
/// error reads as nothing).
fn collection_meta(ks: &tucana::Keyspace, key: &[u8]) -> Option<Meta> {
    ks.get_with(key, |v| is_typed(v).then(|| Meta::decode(v).ok()).flatten())
        .ok()
        .flatten()
        .flatten()
}

/// For a request that reads members' records after its key's metadata: the kind its key
/// must hold, the family of those records and the arguments that name the members.
/// Sorted sets' and sets' commands only: a hash is mostly packed (its fields are in its
/// metadata's value), and a pipeline of HSETs on new keys, whose metadata is missing,
/// would read every key again for nothing (+6% instructions in memory, measured).
fn member_args(
    requests: Requests<'_>,
    j: usize,
) -> Option<(Kind, Family, std::iter::StepBy<std::ops::Range<usize>>)> {
    let argc = requests.arg_count(j);
    let name = requests.arg(j, 0);
    // Every command here starts with Z or S: the others (most of a pipeline of LPUSHes
    // or HSETs) leave after one byte.
    if !matches!(name.first().map(u8::to_ascii_lowercase), Some(b'z' | b's')) {
        return None;
    }
    let is = |n: &str| name.eq_ignore_ascii_case(n.as_bytes());
    let (kind, family, first, step) = if is("zadd") {
        // Flags, then score-member pairs.
        let flags = (2..argc)
            .take_while(|&n| super::zsets::is_zadd_flag(requests.arg(j, n)))
            .count();
        (Kind::ZSet, Family::ZMember, 3 + flags, 2)
    } else if is("zincrby") {
        (Kind::ZSet, Family::ZMember, 3, 1)
    } else if is("zscore") || is("zmscore") || is("zrem") {
        (Kind::ZSet, Family::ZMember, 2, 1)
    } else if is("sadd") || is("srem") || is("sismember") || is("smismember") {
        (Kind::Set, Family::Set, 2, 1)
    } else {
        return None;
    };
    (argc > first).then(|| (kind, family, (first..argc).step_by(step)))
}

/// The key request `j` will read first, if it is a keyed command other than `GET` and
/// `SET` (see the module doc) and its key is not in the reserved family.
fn first_read_key<'r>(requests: Requests<'r>, j: usize) -> Option<&'r [u8]> {
    let argc = requests.arg_count(j);
    if argc < 2 {
        return None;
    }
    let name = requests.arg(j, 0);
    if name.eq_ignore_ascii_case(b"get") || name.eq_ignore_ascii_case(b"set") {
        return None;
    }
    let first = table()[lookup(name)?].keys.0;
    let first = usize::try_from(first)
        .ok()
        .filter(|&f| f >= 1 && f < argc)?;
    Some(requests.arg(j, first)).filter(|key| !is_reserved(key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resp::{decode_into, RequestLimits, RequestSpans};
    use crate::types::encode_score;

    #[test]
    fn the_first_key_of_keyed_commands_but_get_and_set() {
        let wire = b"HGETALL rec:1\r\nhset rec:2 f v\r\nGET plain\r\nSET plain v\r\nPING\r\n\
ZADD z 1 m\r\nMGET a b\r\nNOSUCHCOMMAND k\r\nLPUSH\r\n";
        let mut spans = RequestSpans::default();
        let mut at = 0;
        while let Some(used) = decode_into(wire, at, &RequestLimits::DEFAULT, &mut spans).unwrap() {
            at += used;
        }
        let requests = spans.in_buffer(wire);
        assert_eq!(requests.len(), 9);
        let keys: Vec<Option<&[u8]>> = (0..requests.len())
            .map(|j| first_read_key(requests, j))
            .collect();
        let expected: [Option<&[u8]>; 9] = [
            Some(b"rec:1"),
            Some(b"rec:2"),
            None,
            None,
            None,
            Some(b"z"),
            Some(b"a"),
            None,
            None,
        ];
        assert_eq!(keys, expected);
    }

    #[test]
    fn members_are_asked_for_under_their_keys_metadata_version() {
        let db = tucana::Database::builder().open_in_memory().unwrap();
        let ks = db.keyspace("members").unwrap();
        let meta = |kind| Meta {
            count: 2,
            ..Meta::new(kind)
        };
        let (zset, set, hash) = (meta(Kind::ZSet), meta(Kind::Set), meta(Kind::Hash));
        ks.put(b"z", &zset.encode()).unwrap();
        ks.put(b"s", &set.encode()).unwrap();
        ks.put(b"h", &hash.encode()).unwrap();
        ks.put(b"str", b"plain").unwrap();
        let entries = [(&b"f"[..], &b"v"[..])];
        ks.put(b"ph", &crate::types::packed::encode(entries.into_iter()))
            .unwrap();
        // Members `a` (score 1.5) and `c` (score -2) are in `z`.
        let member = |m: &[u8]| sub_key(Family::ZMember, b"z", zset.version, m);
        ks.put(&member(b"a"), &encode_score(1.5)).unwrap();
        ks.put(&member(b"c"), &encode_score(-2.0)).unwrap();
        let wire =
            b"HGET ph f\r\nZADD z NX ch 1 a 2 b\r\nZSCORE z c\r\nZINCRBY z 1 d\r\nSADD z x\r\n\
SISMEMBER s m\r\nHSET h f 1 g 2\r\nHGET h f\r\nZADD missing 1 a\r\nHGET str f\r\n\
ZADD z 1\r\nLPUSH z a\r\nZREM z c a\r\n";
        let mut spans = RequestSpans::default();
        let mut at = 0;
        while let Some(used) = decode_into(wire, at, &RequestLimits::DEFAULT, &mut spans).unwrap() {
            at += used;
        }
        let requests = spans.in_buffer(wire);
        let got: Vec<Vec<u8>> = member_keys(&ks, requests, 0..requests.len()).collect();
        let expected = vec![
            member(b"a"),
            member(b"b"),
            member(b"c"),
            member(b"d"),
            // SADD on a sorted set: WRONGTYPE, nothing asked for.
            sub_key(Family::Set, b"s", set.version, b"m"),
            // Hashes (HGET of a packed one first, HSET and HGET of one laid out per
            // field), a missing key, a string, a ZADD without a member, a list command:
            // none.
            member(b"c"),
            member(b"a"),
        ];
        assert_eq!(got, expected);
    }
}
