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
        }
        Ok(())
    });
    end
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
}
