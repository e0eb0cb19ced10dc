//! Commands on the whole keyspace of the selected database: SCAN, KEYS, the ordered
//! TRANGE and TPREFIX, DBSIZE, RANDOMKEY, FLUSHDB and FLUSHALL.
//!
//! Owns the iteration bounds (literal prefixes, ZRANGEBYLEX-style bounds) and SCAN's
//! cursor contract; the cursors themselves are kept by `store`. Reads take no lock and
//! start over if a `FLUSHDB` drops the keyspace under them (`store::Slot::read`).
//!
//! Thread-safety: handlers are plain functions; FLUSHDB and FLUSHALL take the write lock
//! of each database they drop and wait on the device.

use std::ops::Bound;

use tucana::Keyspace;
use tucana_cluster::prefix_slot;
use tucana_cluster::slot::slot_prefix;

use crate::glob::{glob_match, literal_prefix};
use crate::resp::Reply;
use crate::store::Slot;

use crate::expiry::{is_reserved, now_ms, RESERVED};

use super::expire::{hidden_records, visible};
use super::strings::type_name;
use super::{cluster_keys, not_an_integer, parse_i64, prefix_end, syntax_error, Call};

/// Keys of a keyspace in order from `lo` (or the first) to `hi` (or the last).
fn range_of(
    ks: Option<&Keyspace>,
    lo: Bound<Vec<u8>>,
    hi: Bound<Vec<u8>>,
) -> Option<tucana::Range> {
    ks.map(|ks| ks.range::<Vec<u8>, _>((lo, hi)))
}

/// `SCAN cursor [MATCH pattern] [COUNT n] [TYPE type]`
///
/// The cursor contract of Redis holds: a full iteration (from cursor 0 until 0 comes
/// back) returns every key present from start to end, once, in key order. A cursor is a
/// number naming where the last call stopped, kept by the server (`max_scan_cursors`,
/// oldest forgotten first; a forgotten one answers `ERR invalid cursor`).
pub(super) fn cmd_scan(call: &mut Call<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let text = std::str::from_utf8(&args[1]).ok();
    let Some(cursor) = text.and_then(|s| s.parse::<u64>().ok()) else {
        // Redis reads the cursor with strtoul, so `-1` is a valid (huge) cursor there,
        // past every position: an iteration that has finished. (strtoul takes any `-n`
        // down to -u64::MAX.)
        let negative = text.and_then(|s| s.parse::<i128>().ok());
        if negative.is_some_and(|n| n < 0 && n >= -i128::from(u64::MAX)) {
            return Ok(scan_reply(call, call.session.db_index, Vec::new(), None));
        }
        return Ok(Reply::error("ERR invalid cursor"));
    };
    let mut pattern: Option<&[u8]> = None;
    let mut count: usize = 10;
    let mut type_filter: Option<&[u8]> = None;
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
            (b"TYPE", Some(t)) => type_filter = Some(t),
            _ => return Ok(syntax_error()),
        }
        i += 2;
    }
    let db_index = call.session.db_index;
    let after = if cursor == 0 {
        None
    } else {
        match call.state.store.cursor(db_index, cursor) {
            Some(key) => Some(key),
            None => return Ok(Reply::error("ERR invalid cursor")),
        }
    };
    if call.state.cluster.is_some() {
        let (keys, last) = cluster_keys::scan(call, after, pattern, count, type_filter)?;
        return Ok(scan_reply(call, db_index, keys, last));
    }
    let prefix = pattern.map(literal_prefix).unwrap_or_default();
    let lo = match &after {
        Some(k) if k.as_slice() >= prefix.as_slice() => Bound::Excluded(k.clone()),
        _ => Bound::Included(prefix.clone()),
    };
    let hi = prefix_end(&prefix);
    let (may_expire, now) = (call.slot().may_expire(), now_ms());
    let (keys, last) = call.slot().read(|ks| {
        let mut keys = Vec::new();
        let mut last: Option<Vec<u8>> = None;
        if let (Some(range), Some(ks)) = (range_of(ks, lo.clone(), hi.clone()), ks) {
            let mut range = range.peekable();
            let mut examined = 0;
            let mut finished = false;
            while examined < count {
                let Some(item) = range.next() else { break };
                let (key, value) = item?;
                if is_reserved(&key) {
                    // Deadlines and collections' members: one seek past them all.
                    match after_reserved(&hi) {
                        Some(lo) => range = ks.range::<Vec<u8>, _>((lo, hi.clone())).peekable(),
                        None => {
                            finished = true;
                            break;
                        }
                    }
                    continue;
                }
                examined += 1;
                if type_filter.is_none_or(|t| t.eq_ignore_ascii_case(type_name(&value).as_bytes()))
                    && pattern.is_none_or(|p| glob_match(p, &key))
                    && visible(ks, may_expire, &[], &key, now)?
                {
                    keys.push(Reply::Bulk(key.clone()));
                }
                last = Some(key);
            }
            // Only hand out a cursor when something follows.
            if finished || range.peek().is_none() {
                last = None;
            }
        }
        Ok((keys, last))
    })?;
    Ok(scan_reply(call, db_index, keys, last))
}

/// Where a walk ending at `hi` goes on after the reserved family (deadline records and
/// collections' sub-records, one contiguous range of stored keys outside cluster mode);
/// `None` when nothing of the walk is left past it.
fn after_reserved(hi: &Bound<Vec<u8>>) -> Option<Bound<Vec<u8>>> {
    let Bound::Excluded(end) = prefix_end(RESERVED) else {
        return None;
    };
    match hi {
        Bound::Excluded(h) if *h <= end => None,
        Bound::Included(h) if *h < end => None,
        _ => Some(Bound::Included(end)),
    }
}

/// SCAN's reply: a cursor for where it stopped (`last`; 0 when nothing follows), then the
/// keys.
fn scan_reply(call: &Call<'_>, db_index: u32, keys: Vec<Reply>, last: Option<Vec<u8>>) -> Reply {
    let next = match last {
        Some(key) => call.state.store.save_cursor(db_index, key),
        None => 0,
    };
    Reply::Array(vec![
        Reply::Bulk(next.to_string().into_bytes()),
        Reply::Array(keys),
    ])
}

pub(super) fn cmd_keys(call: &mut Call<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let pattern = &args[1];
    if call.state.cluster.is_some() {
        return cluster_keys::keys(call, pattern);
    }
    let prefix = literal_prefix(pattern);
    let hi = prefix_end(&prefix);
    let (may_expire, now) = (call.slot().may_expire(), now_ms());
    call.slot().read(|ks| {
        let mut keys = Vec::new();
        let range = range_of(ks, Bound::Included(prefix.clone()), hi.clone());
        if let (Some(mut range), Some(ks)) = (range, ks) {
            while let Some(item) = range.next() {
                let (key, _) = item?;
                if is_reserved(&key) {
                    // Deadlines and collections' members: one seek past them all.
                    match after_reserved(&hi) {
                        Some(lo) => range = ks.range::<Vec<u8>, _>((lo, hi.clone())),
                        None => break,
                    }
                    continue;
                }
                if glob_match(pattern, &key) && visible(ks, may_expire, &[], &key, now)? {
                    keys.push(Reply::Bulk(key));
                }
            }
        }
        Ok(Reply::Array(keys))
    })
}

type Pair = (Vec<u8>, Vec<u8>);

/// Options shared by TRANGE and TPREFIX: `[REV] [LIMIT count] [WITHVALUES]`.
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

/// The live keys (with their values if asked) from `lo` to `hi` in `slot`'s keyspace,
/// whose stored keys are `prefix` (a hash slot's, or empty) then the client's key; the
/// reserved records (deadlines, collections' members) are never listed.
fn collect_range(
    slot: &Slot,
    prefix: &[u8],
    lo: Bound<Vec<u8>>,
    hi: Bound<Vec<u8>>,
    opts: &RangeOptions,
) -> tucana::Result<Reply> {
    let limit = opts.limit.unwrap_or(usize::MAX);
    let stored = |key: &Vec<u8>| [prefix, key].concat();
    let lo = match lo {
        Bound::Included(k) => Bound::Included(stored(&k)),
        Bound::Excluded(k) => Bound::Excluded(stored(&k)),
        Bound::Unbounded if prefix.is_empty() => Bound::Unbounded,
        Bound::Unbounded => Bound::Included(prefix.to_vec()),
    };
    let hi = match hi {
        Bound::Included(k) => Bound::Included(stored(&k)),
        Bound::Excluded(k) => Bound::Excluded(stored(&k)),
        Bound::Unbounded => prefix_end(prefix),
    };
    let (may_expire, now) = (slot.may_expire(), now_ms());
    slot.read(|ks| {
        let mut items = Vec::new();
        let (Some(range), Some(ks)) = (range_of(ks, lo.clone(), hi.clone()), ks) else {
            return Ok(Reply::Array(items));
        };
        let iter: Box<dyn Iterator<Item = tucana::Result<Pair>>> = if opts.rev {
            Box::new(range.rev())
        } else {
            Box::new(range)
        };
        let mut taken = 0;
        for item in iter {
            if taken == limit {
                break;
            }
            let (stored, value) = item?;
            let key = stored[prefix.len()..].to_vec();
            if is_reserved(&key) || !visible(ks, may_expire, prefix, &key, now)? {
                continue;
            }
            taken += 1;
            items.push(Reply::Bulk(key));
            if opts.with_values {
                items.push(Reply::Bulk(value));
            }
        }
        Ok(Reply::Array(items))
    })
}

/// `TRANGE start end [REV] [LIMIT count] [WITHVALUES]`: keys from `start` to `end` in key
/// order (`REV`: descending), bounds written as in ZRANGEBYLEX (`-`, `+`, `[k`, `(k`).
/// In cluster mode the range must lie in one hash slot: both bounds given, sharing a
/// prefix that holds a `{hashtag}` (so every key between them has that tag).
pub(super) fn cmd_trange(call: &mut Call<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let (Some(lo), Some(hi)) = (lex_bound(&args[1], true), lex_bound(&args[2], false)) else {
        return Ok(Reply::error(
            "ERR start and end must be '-', '+', '[key' (inclusive) or '(key' (exclusive)",
        ));
    };
    let opts = match range_options(&args[3..]) {
        Ok(opts) => opts,
        Err(reply) => return Ok(reply),
    };
    if call.state.cluster.is_some() {
        let shared = match (&lo, &hi) {
            (Bound::Included(a) | Bound::Excluded(a), Bound::Included(b) | Bound::Excluded(b)) => {
                let n = a.iter().zip(b).take_while(|(x, y)| x == y).count();
                prefix_slot(&a[..n])
            }
            _ => None,
        };
        let Some(hash_slot) = shared else {
            return Ok(Reply::error(
                "ERR in cluster mode TRANGE's bounds must both be keys sharing a prefix that holds a {hashtag}, so the range lies in one hash slot",
            ));
        };
        return in_slot(call, hash_slot, lo, hi, &opts);
    }
    collect_range(call.slot(), &[], lo, hi, &opts)
}

/// `TPREFIX prefix [REV] [LIMIT count] [WITHVALUES]`: the keys that start with `prefix`.
/// In cluster mode the prefix must hold a `{hashtag}` (its keys are in one hash slot).
pub(super) fn cmd_tprefix(call: &mut Call<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let prefix = args[1].clone();
    let hi = prefix_end(&prefix);
    let opts = match range_options(&args[2..]) {
        Ok(opts) => opts,
        Err(reply) => return Ok(reply),
    };
    if call.state.cluster.is_some() {
        let Some(hash_slot) = prefix_slot(&prefix) else {
            return Ok(Reply::error(
                "ERR in cluster mode TPREFIX's prefix must hold a {hashtag}, so its keys lie in one hash slot",
            ));
        };
        return in_slot(call, hash_slot, Bound::Included(prefix), hi, &opts);
    }
    collect_range(call.slot(), &[], Bound::Included(prefix), hi, &opts)
}

/// A range of one hash slot in cluster mode: read in the region that serves the slot
/// here, or answered with where to go (`MOVED`, `TRYAGAIN` during a migration, ...).
fn in_slot(
    call: &Call<'_>,
    hash_slot: u16,
    lo: Bound<Vec<u8>>,
    hi: Bound<Vec<u8>>,
    opts: &RangeOptions,
) -> tucana::Result<Reply> {
    match cluster_keys::slot_region(call, hash_slot) {
        Ok(slot) => collect_range(&slot, &slot_prefix(hash_slot), lo, hi, opts),
        Err(reply) => Ok(reply),
    }
}

pub(super) fn cmd_dbsize(call: &mut Call<'_>, _args: &[Vec<u8>]) -> tucana::Result<Reply> {
    if call.state.cluster.is_some() {
        return cluster_keys::dbsize(call);
    }
    let may_expire = call.slot().may_expire();
    let n = call.slot().read(|ks| match ks {
        None => Ok(0),
        Some(ks) if !may_expire => Ok(ks.len()),
        Some(ks) => Ok(ks.len().saturating_sub(hidden_records(ks, &[], now_ms())?)),
    })?;
    Ok(Reply::Int(n as i64))
}

/// `RANDOMKEY`: a live key picked at random (nil when there is none). The keyspace is
/// ordered, not hashed, so the pick is the first live key at or after a random point
/// between the first and the last stored key (wrapping around): every key can come back,
/// not with equal chances (a key after a wide gap comes back more often).
pub(super) fn cmd_randomkey(call: &mut Call<'_>, _args: &[Vec<u8>]) -> tucana::Result<Reply> {
    if call.state.cluster.is_some() {
        return Ok(Reply::error(
            "ERR RANDOMKEY is not supported in cluster mode yet",
        ));
    }
    let (may_expire, now) = (call.slot().may_expire(), now_ms());
    let mut rng = super::collection::Rng::new();
    call.slot().read(|ks| {
        let Some(ks) = ks else {
            return Ok(Reply::Nil);
        };
        let all = (Bound::<Vec<u8>>::Unbounded, Bound::<Vec<u8>>::Unbounded);
        let (Some(first), Some(last)) = (
            ks.range::<Vec<u8>, _>(all.clone()).next().transpose()?,
            ks.range::<Vec<u8>, _>(all).next_back().transpose()?,
        ) else {
            return Ok(Reply::Nil);
        };
        let pivot = super::collection::random_between(&mut rng, &first.0, &last.0);
        let after = first_live(
            ks,
            may_expire,
            now,
            Bound::Included(pivot.clone()),
            Bound::Unbounded,
        )?;
        let key = match after {
            Some(key) => Some(key),
            None => first_live(
                ks,
                may_expire,
                now,
                Bound::Unbounded,
                Bound::Excluded(pivot),
            )?,
        };
        Ok(key.map_or(Reply::Nil, Reply::Bulk))
    })
}

/// The first client's live key in `(lo, hi)`, skipping the reserved family in one seek.
fn first_live(
    ks: &Keyspace,
    may_expire: bool,
    now: u64,
    lo: Bound<Vec<u8>>,
    hi: Bound<Vec<u8>>,
) -> tucana::Result<Option<Vec<u8>>> {
    let mut range = ks.range::<Vec<u8>, _>((lo, hi.clone()));
    while let Some(item) = range.next() {
        let (key, _) = item?;
        if is_reserved(&key) {
            match after_reserved(&hi) {
                Some(lo) => range = ks.range::<Vec<u8>, _>((lo, hi.clone())),
                None => break,
            }
            continue;
        }
        if visible(ks, may_expire, &[], &key, now)? {
            return Ok(Some(key));
        }
    }
    Ok(None)
}

fn flush_option_ok(args: &[Vec<u8>]) -> bool {
    match args {
        [_] => true,
        [_, mode] => mode.eq_ignore_ascii_case(b"SYNC") || mode.eq_ignore_ascii_case(b"ASYNC"),
        _ => false,
    }
}

/// Drops the keyspace (durably, O(1)); the next write creates it again.
pub(super) fn cmd_flushdb(call: &mut Call<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    if !flush_option_ok(args) {
        return Ok(syntax_error());
    }
    if call.state.cluster.is_some() {
        return cluster_keys::flush(call);
    }
    call.slot().lock_writes().flush(&call.state.store.db)?;
    Ok(Reply::Ok)
}

pub(super) fn cmd_flushall(call: &mut Call<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    if !flush_option_ok(args) {
        return Ok(syntax_error());
    }
    if call.state.cluster.is_some() {
        return cluster_keys::flush(call);
    }
    for slot in call.state.store.slots() {
        slot.lock_writes().flush(&call.state.store.db)?;
    }
    Ok(Reply::Ok)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
