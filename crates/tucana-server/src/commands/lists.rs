//! The list commands: LPUSH, RPUSH, LPUSHX, RPUSHX, LPOP, RPOP (with a count), LLEN,
//! LINDEX, LSET, LRANGE, LTRIM, LREM, LINSERT, LPOS, LMOVE, RPOPLPUSH. The blocking pops
//! (BLPOP, BRPOP, BLMOVE, ...) are `blocking`'s, built on `pop_from`.
//!
//! A list is its metadata at the client's key (with the index of its first element and
//! one past its last) and one sub-record per element (`types::Family::List`, index as
//! 8 big-endian bytes → element), so pushes and pops at either end, LINDEX and LSET are
//! O(1) records and LRANGE is one range read; LREM and LINSERT rewrite the elements after
//! the change (O(n)). Owns the commands' semantics; storage is `collection`'s and
//! `types`'.
//!
//! Thread-safety: plain functions on the store a handler is given.

use std::ops::Bound;

use crate::resp::Reply;
use crate::types::{decode_index, sub_key, Family, Kind, Meta};

use super::collection::{members, open, open_or, Opened, Update};
use super::kv::Kv;
use super::zsets::rank_window;
use super::{not_an_integer, parse_i64, syntax_error};

pub(super) const LIST: Kind = Kind::List;
const F: Family = Family::List;

fn idx(i: u64) -> [u8; 8] {
    i.to_be_bytes()
}

/// Elements `first..first + count` (positions from the head), in order.
fn elements(
    kv: &mut dyn Kv,
    key: &[u8],
    meta: &Meta,
    first: u64,
    count: usize,
) -> tucana::Result<Vec<Vec<u8>>> {
    let from = idx(meta.head + first);
    let pairs = members(
        kv,
        F,
        key,
        meta.version,
        (Bound::Included(&from), Bound::Excluded(&idx(meta.tail))),
        false,
        count,
    )?;
    // Elements are contiguous from the head: a gap is damage, not a shorter list.
    let mut out = Vec::with_capacity(pairs.len());
    for (want, (suffix, v)) in (meta.head + first..).zip(pairs) {
        if decode_index(&suffix)? != want {
            return Err(damaged_list(key, meta.count, out.len()));
        }
        out.push(v);
    }
    Ok(out)
}

fn all_elements(kv: &mut dyn Kv, key: &[u8], meta: &Meta) -> tucana::Result<Vec<Vec<u8>>> {
    elements(kv, key, meta, 0, usize::MAX)
}

/// A list whose metadata counts more elements than its records hold.
fn damaged_list(key: &[u8], counted: u64, found: usize) -> tucana::Error {
    tucana::Error::InvalidArgument(format!(
        "damaged list {:?}: its metadata counts {counted} elements where {found} are stored",
        String::from_utf8_lossy(key)
    ))
}

/// Pushes `values` at the head (`left`) or the tail of `update`'s list.
fn push_all(update: &mut Update<'_>, values: &[Vec<u8>], left: bool) {
    for v in values {
        let at = if left {
            update.meta.head -= 1;
            update.meta.head
        } else {
            update.meta.tail += 1;
            update.meta.tail - 1
        };
        update.put(F, &idx(at), v.clone());
        update.meta.count += 1;
    }
}

/// LPUSH, RPUSH and, with `only_existing`, LPUSHX, RPUSHX: the new length.
fn push(
    kv: &mut dyn Kv,
    args: &[Vec<u8>],
    left: bool,
    only_existing: bool,
) -> tucana::Result<Reply> {
    let key = &args[1];
    let opened = match open(kv, key, LIST)? {
        Ok(o) => o,
        Err(reply) => return Ok(reply),
    };
    if only_existing && opened.meta.is_none() {
        return Ok(Reply::Int(0));
    }
    let mut update = Update::new(key, opened, LIST);
    push_all(&mut update, &args[2..], left);
    let len = update.meta.count;
    update.apply(kv, if left { "lpush" } else { "rpush" })?;
    Ok(Reply::Int(len as i64))
}

pub(super) fn cmd_lpush(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    push(kv, args, true, false)
}

pub(super) fn cmd_rpush(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    push(kv, args, false, false)
}

pub(super) fn cmd_lpushx(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    push(kv, args, true, true)
}

pub(super) fn cmd_rpushx(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    push(kv, args, false, true)
}

/// Pops up to `count` elements from one end of `update`'s list (known elements read from
/// the store), in pop order.
pub(super) fn pop_from(
    kv: &mut dyn Kv,
    key: &[u8],
    update: &mut Update<'_>,
    count: usize,
    left: bool,
) -> tucana::Result<Vec<Vec<u8>>> {
    let meta = update.meta;
    let n = (count as u64).min(meta.count);
    let first = if left { 0 } else { meta.count - n };
    let mut popped = if n == 1 {
        // One element (LPOP, RPOP, LMOVE): a point read; a range read would build an
        // iterator (copying a leaf of the index) for one record.
        let element = kv.lookup(&sub_key(F, key, meta.version, &idx(meta.head + first)))?;
        element.into_iter().collect()
    } else {
        elements(kv, key, &meta, first, n as usize)?
    };
    if popped.len() as u64 != n {
        return Err(damaged_list(key, n, popped.len()));
    }
    for i in 0..n {
        update.delete(F, &idx(meta.head + first + i));
    }
    if left {
        update.meta.head += n;
    } else {
        update.meta.tail -= n;
        popped.reverse();
    }
    update.meta.count -= n;
    Ok(popped)
}

/// LPOP and RPOP: `key [count]`.
fn pop(kv: &mut dyn Kv, args: &[Vec<u8>], left: bool) -> tucana::Result<Reply> {
    let count = match args.get(2) {
        None => None,
        Some(_) if args.len() > 3 => {
            return Ok(super::wrong_args(if left { "lpop" } else { "rpop" }))
        }
        Some(n) => match parse_i64(n) {
            Some(n) if n >= 0 => Some(n as usize),
            _ => return Ok(Reply::error("ERR value is out of range, must be positive")),
        },
    };
    let missing = if count.is_some() {
        Reply::NilArray
    } else {
        Reply::Nil
    };
    let key = &args[1];
    let (opened, _) = open_or!(kv, key, LIST, missing);
    let mut update = Update::new(key, opened, LIST);
    let popped = pop_from(kv, key, &mut update, count.unwrap_or(1), left)?;
    if !popped.is_empty() {
        update.apply(kv, if left { "lpop" } else { "rpop" })?;
    }
    Ok(match count {
        None => popped.into_iter().next().map_or(Reply::Nil, Reply::Bulk),
        Some(_) => Reply::Array(popped.into_iter().map(Reply::Bulk).collect()),
    })
}

pub(super) fn cmd_lpop(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    pop(kv, args, true)
}

pub(super) fn cmd_rpop(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    pop(kv, args, false)
}

pub(super) fn cmd_llen(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let (_, meta) = open_or!(kv, &args[1], LIST, Reply::Int(0));
    Ok(Reply::Int(meta.count as i64))
}

/// A position from Redis's index (negative from the tail), if inside the list.
fn position(index: i64, len: u64) -> Option<u64> {
    let i = if index < 0 { len as i64 + index } else { index };
    (0..len as i64).contains(&i).then_some(i as u64)
}

pub(super) fn cmd_lindex(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let Some(index) = parse_i64(&args[2]) else {
        return Ok(not_an_integer());
    };
    let (_, meta) = open_or!(kv, &args[1], LIST, Reply::Nil);
    let Some(at) = position(index, meta.count) else {
        return Ok(Reply::Nil);
    };
    let v = kv.lookup(&sub_key(F, &args[1], meta.version, &idx(meta.head + at)))?;
    Ok(v.map_or(Reply::Nil, Reply::Bulk))
}

pub(super) fn cmd_lset(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let Some(index) = parse_i64(&args[2]) else {
        return Ok(not_an_integer());
    };
    let key = &args[1];
    let (opened, meta) = open_or!(kv, key, LIST, Reply::error("ERR no such key"));
    let Some(at) = position(index, meta.count) else {
        return Ok(Reply::error("ERR index out of range"));
    };
    let mut update = Update::new(key, opened, LIST);
    update.put(F, &idx(meta.head + at), args[3].clone());
    update.apply(kv, "lset")?;
    Ok(Reply::Ok)
}

pub(super) fn cmd_lrange(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let (Some(start), Some(stop)) = (parse_i64(&args[2]), parse_i64(&args[3])) else {
        return Ok(not_an_integer());
    };
    let (_, meta) = open_or!(kv, &args[1], LIST, Reply::Array(Vec::new()));
    let Some((first, count)) = rank_window(start, stop, meta.count) else {
        return Ok(Reply::Array(Vec::new()));
    };
    let items = elements(kv, &args[1], &meta, first as u64, count)?;
    Ok(Reply::Array(items.into_iter().map(Reply::Bulk).collect()))
}

pub(super) fn cmd_ltrim(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let (Some(start), Some(stop)) = (parse_i64(&args[2]), parse_i64(&args[3])) else {
        return Ok(not_an_integer());
    };
    let key = &args[1];
    let (opened, meta) = open_or!(kv, key, LIST, Reply::Ok);
    let (first, count) =
        rank_window(start, stop, meta.count).map_or((0, 0), |(f, c)| (f as u64, c as u64));
    let mut update = Update::new(key, opened, LIST);
    // The records outside the window, as stored (read, not counted from the metadata, so
    // damaged metadata cannot make this loop run on).
    let (start, end) = (idx(meta.head + first), idx(meta.head + first + count));
    for bounds in [
        (Bound::Unbounded, Bound::Excluded(start.as_slice())),
        (Bound::Included(end.as_slice()), Bound::Unbounded),
    ] {
        for (suffix, _) in members(kv, F, key, meta.version, bounds, false, usize::MAX)? {
            update.delete(F, &suffix);
        }
    }
    update.meta.head = meta.head + first;
    update.meta.tail = update.meta.head + count;
    update.meta.count = count;
    update.apply(kv, "ltrim")?;
    Ok(Reply::Ok)
}

/// Rewrites the list of `update` (whose stored elements are `old`) as `new`, from its
/// head: only positions that changed are written, the ones past the end deleted.
fn rewrite(update: &mut Update<'_>, old: &[Vec<u8>], new: &[Vec<u8>]) {
    let head = update.meta.head;
    for (i, v) in new.iter().enumerate() {
        if old.get(i) != Some(v) {
            update.put(F, &idx(head + i as u64), v.clone());
        }
    }
    for i in new.len()..old.len() {
        update.delete(F, &idx(head + i as u64));
    }
    update.meta.count = new.len() as u64;
    update.meta.tail = head + new.len() as u64;
}

/// `LREM key count element`: removes the first `count` matches (from the tail when
/// negative, all when 0); how many went.
pub(super) fn cmd_lrem(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let Some(count) = parse_i64(&args[2]) else {
        return Ok(not_an_integer());
    };
    let key = &args[1];
    let (opened, meta) = open_or!(kv, key, LIST, Reply::Int(0));
    let old = all_elements(kv, key, &meta)?;
    let limit = if count == 0 {
        u64::MAX
    } else {
        count.unsigned_abs()
    };
    let mut keep = vec![true; old.len()];
    let mut removed = 0u64;
    let order: Box<dyn Iterator<Item = usize>> = if count < 0 {
        Box::new((0..old.len()).rev())
    } else {
        Box::new(0..old.len())
    };
    for i in order {
        if removed == limit {
            break;
        }
        if old[i] == args[3] {
            keep[i] = false;
            removed += 1;
        }
    }
    if removed == 0 {
        return Ok(Reply::Int(0));
    }
    let new: Vec<Vec<u8>> = old
        .iter()
        .zip(&keep)
        .filter(|(_, &k)| k)
        .map(|(v, _)| v.clone())
        .collect();
    let mut update = Update::new(key, opened, LIST);
    rewrite(&mut update, &old, &new);
    update.apply(kv, "lrem")?;
    Ok(Reply::Int(removed as i64))
}

/// `LINSERT key BEFORE|AFTER pivot element`: the new length, -1 without the pivot, 0 for
/// a missing key.
pub(super) fn cmd_linsert(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let after = match args[2].to_ascii_uppercase().as_slice() {
        b"BEFORE" => false,
        b"AFTER" => true,
        _ => return Ok(syntax_error()),
    };
    let key = &args[1];
    let (opened, meta) = open_or!(kv, key, LIST, Reply::Int(0));
    let old = all_elements(kv, key, &meta)?;
    let Some(at) = old.iter().position(|v| *v == args[3]) else {
        return Ok(Reply::Int(-1));
    };
    let mut new = old.clone();
    new.insert(at + usize::from(after), args[4].clone());
    let mut update = Update::new(key, opened, LIST);
    rewrite(&mut update, &old, &new);
    let len = update.meta.count;
    update.apply(kv, "linsert")?;
    Ok(Reply::Int(len as i64))
}

/// `LPOS key element [RANK rank] [COUNT num] [MAXLEN len]`.
pub(super) fn cmd_lpos(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let (mut rank, mut count, mut maxlen) = (1i64, None, 0i64);
    let mut i = 3;
    while i < args.len() {
        let Some(value) = args.get(i + 1) else {
            return Ok(syntax_error());
        };
        let Some(n) = parse_i64(value) else {
            return Ok(not_an_integer());
        };
        match args[i].to_ascii_uppercase().as_slice() {
            b"RANK" if n == 0 || n == i64::MIN => {
                return Ok(Reply::error("ERR RANK can't be zero: use 1 to start from the first match, 2 from the second ... or use negative to start from the end of the list"));
            }
            b"RANK" => rank = n,
            b"COUNT" if n < 0 => return Ok(Reply::error("ERR COUNT can't be negative")),
            b"COUNT" => count = Some(n as usize),
            b"MAXLEN" if n < 0 => return Ok(Reply::error("ERR MAXLEN can't be negative")),
            b"MAXLEN" => maxlen = n,
            _ => return Ok(syntax_error()),
        }
        i += 2;
    }
    let missing = if count.is_some() {
        Reply::Array(Vec::new())
    } else {
        Reply::Nil
    };
    let (_, meta) = open_or!(kv, &args[1], LIST, missing);
    let all = all_elements(kv, &args[1], &meta)?;
    let len = all.len();
    let order: Box<dyn Iterator<Item = usize>> = if rank < 0 {
        Box::new((0..len).rev())
    } else {
        Box::new(0..len)
    };
    let wanted = match count {
        Some(0) => usize::MAX,
        Some(c) => c,
        None => 1,
    };
    let mut skip = rank.unsigned_abs() - 1;
    let mut found = Vec::new();
    for (seen, i) in order.enumerate() {
        if maxlen != 0 && seen as i64 >= maxlen {
            break;
        }
        if all[i] != args[2] {
            continue;
        }
        if skip > 0 {
            skip -= 1;
            continue;
        }
        found.push(Reply::Int(i as i64));
        if found.len() == wanted {
            break;
        }
    }
    Ok(match count {
        Some(_) => Reply::Array(found),
        None => found.into_iter().next().unwrap_or(Reply::Nil),
    })
}

/// LMOVE's `LEFT`/`RIGHT` as "from the head".
fn side(arg: &[u8]) -> Option<bool> {
    match arg.to_ascii_uppercase().as_slice() {
        b"LEFT" => Some(true),
        b"RIGHT" => Some(false),
        _ => None,
    }
}

/// LMOVE and RPOPLPUSH: pops from one end of `src`, pushes to one end of `dst` (the
/// same list: a rotation), in one batch.
fn lmove(
    kv: &mut dyn Kv,
    src: &[u8],
    dst: &[u8],
    from_left: bool,
    to_left: bool,
) -> tucana::Result<Reply> {
    let (src_opened, _) = open_or!(kv, src, LIST, Reply::Nil);
    let dst_opened: Option<Opened> = if src == dst {
        None
    } else {
        match open(kv, dst, LIST)? {
            Ok(o) => Some(o),
            Err(reply) => return Ok(reply),
        }
    };
    let mut from = Update::new(src, src_opened, LIST);
    let Some(value) = pop_from(kv, src, &mut from, 1, from_left)?.pop() else {
        return Err(damaged_list(src, 1, 0));
    };
    let push_one = std::slice::from_ref(&value);
    // Redis's order: the destination's events (`new`, the push), then the source's
    // (the pop, `del` if emptied).
    let flags = kv.notify_flags();
    let pop_event = if from_left { "lpop" } else { "rpop" };
    let push_event = if to_left { "lpush" } else { "rpush" };
    let (writes, events) = match dst_opened {
        None => {
            push_all(&mut from, push_one, to_left);
            let (writes, mut events) = from.finish(flags, Some(push_event));
            if flags != 0 {
                events.add(crate::notify::LIST, pop_event, src);
            }
            (writes, events)
        }
        Some(opened) => {
            let (mut writes, from_events) = from.finish(flags, Some(pop_event));
            let mut to = Update::new(dst, opened, LIST);
            push_all(&mut to, push_one, to_left);
            let (to_writes, mut events) = to.finish(flags, Some(push_event));
            writes.append(to_writes);
            events.append(from_events);
            (writes, events)
        }
    };
    writes.apply(kv)?;
    events.raise(kv);
    Ok(Reply::Bulk(value))
}

pub(super) fn cmd_lmove(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let (Some(from_left), Some(to_left)) = (side(&args[3]), side(&args[4])) else {
        return Ok(syntax_error());
    };
    lmove(kv, &args[1], &args[2], from_left, to_left)
}

pub(super) fn cmd_rpoplpush(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    lmove(kv, &args[1], &args[2], false, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_follow_redis_indexes() {
        assert_eq!(position(0, 3), Some(0));
        assert_eq!(position(-1, 3), Some(2));
        assert_eq!(position(-3, 3), Some(0));
        assert_eq!(position(-4, 3), None);
        assert_eq!(position(3, 3), None);
        assert_eq!(position(0, 0), None);
    }
}
