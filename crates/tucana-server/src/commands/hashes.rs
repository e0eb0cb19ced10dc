//! The hash commands: HSET, HMSET, HSETNX, HGET, HMGET, HGETALL, HKEYS, HVALS, HLEN,
//! HEXISTS, HSTRLEN, HDEL, HINCRBY, HINCRBYFLOAT, HRANDFIELD, HSCAN.
//!
//! A hash is its metadata at the client's key and one sub-record per field
//! (`types::Family::Hash`, field → value); fields come back in field order, not in
//! Redis's insertion order (Redis promises no order). Owns the commands' semantics;
//! storage is `collection`'s and `types`'.
//!
//! Thread-safety: plain functions on the store a handler is given.

use crate::glob::glob_match;
use crate::resp::Reply;
use crate::types::{sub_key, Family, Kind};

use super::collection::{
    all_members, open, open_or, parse_double, random_members, scan_options, scan_reply, Update,
};
use super::kv::Kv;
use super::{not_an_integer, opt_bulk, parse_i64, wrong_args};

const HASH: Kind = Kind::Hash;
const F: Family = Family::Hash;

/// A field's value in version `version` of `key`.
fn field(kv: &mut dyn Kv, key: &[u8], version: u64, f: &[u8]) -> tucana::Result<Option<Vec<u8>>> {
    kv.lookup(&sub_key(F, key, version, f))
}

/// HSET and HMSET: `key field value [field value ...]`; HSET answers the number of new
/// fields, HMSET `OK`.
fn hset_generic(kv: &mut dyn Kv, args: &[Vec<u8>], name: &str) -> tucana::Result<Reply> {
    if !args.len().is_multiple_of(2) {
        return Ok(wrong_args(name));
    }
    let key = &args[1];
    let opened = match open(kv, key, HASH)? {
        Ok(o) => o,
        Err(reply) => return Ok(reply),
    };
    // A new hash has no fields to look up (a record's first HSET, YCSB's load).
    let existed = opened.meta.is_some();
    let mut update = Update::new(key, opened, HASH);
    let mut added = std::collections::HashSet::new();
    for pair in args[2..].chunks(2) {
        let is_new = !added.contains(&pair[0])
            && (!existed || field(kv, key, update.meta.version, &pair[0])?.is_none());
        if is_new {
            added.insert(pair[0].clone());
        }
        update.put(F, &pair[0], pair[1].clone());
    }
    update.meta.count += added.len() as u64;
    update.apply(kv, "hset")?;
    Ok(if name == "hmset" {
        Reply::Ok
    } else {
        Reply::Int(added.len() as i64)
    })
}

pub(super) fn cmd_hset(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    hset_generic(kv, args, "hset")
}

pub(super) fn cmd_hmset(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    hset_generic(kv, args, "hmset")
}

pub(super) fn cmd_hsetnx(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let key = &args[1];
    let opened = match open(kv, key, HASH)? {
        Ok(o) => o,
        Err(reply) => return Ok(reply),
    };
    let mut update = Update::new(key, opened, HASH);
    if field(kv, key, update.meta.version, &args[2])?.is_some() {
        return Ok(Reply::Int(0));
    }
    update.put(F, &args[2], args[3].clone());
    update.meta.count += 1;
    update.apply(kv, "hset")?;
    Ok(Reply::Int(1))
}

pub(super) fn cmd_hget(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let (_, meta) = open_or!(kv, &args[1], HASH, Reply::Nil);
    Ok(opt_bulk(field(kv, &args[1], meta.version, &args[2])?))
}

pub(super) fn cmd_hmget(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let nils = Reply::Array(vec![Reply::Nil; args.len() - 2]);
    let (_, meta) = open_or!(kv, &args[1], HASH, nils);
    let mut out = Vec::with_capacity(args.len() - 2);
    for f in &args[2..] {
        out.push(opt_bulk(field(kv, &args[1], meta.version, f)?));
    }
    Ok(Reply::Array(out))
}

pub(super) fn cmd_hgetall(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let (_, meta) = open_or!(kv, &args[1], HASH, Reply::Map(Vec::new()));
    let pairs = all_members(kv, F, &args[1], meta.version)?;
    Ok(Reply::Map(
        pairs
            .into_iter()
            .map(|(f, v)| (Reply::Bulk(f), Reply::Bulk(v)))
            .collect(),
    ))
}

pub(super) fn cmd_hkeys(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let (_, meta) = open_or!(kv, &args[1], HASH, Reply::Array(Vec::new()));
    let pairs = all_members(kv, F, &args[1], meta.version)?;
    Ok(Reply::Array(
        pairs.into_iter().map(|(f, _)| Reply::Bulk(f)).collect(),
    ))
}

pub(super) fn cmd_hvals(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let (_, meta) = open_or!(kv, &args[1], HASH, Reply::Array(Vec::new()));
    let pairs = all_members(kv, F, &args[1], meta.version)?;
    Ok(Reply::Array(
        pairs.into_iter().map(|(_, v)| Reply::Bulk(v)).collect(),
    ))
}

pub(super) fn cmd_hlen(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let (_, meta) = open_or!(kv, &args[1], HASH, Reply::Int(0));
    Ok(Reply::Int(meta.count as i64))
}

pub(super) fn cmd_hexists(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let (_, meta) = open_or!(kv, &args[1], HASH, Reply::Int(0));
    let found = field(kv, &args[1], meta.version, &args[2])?.is_some();
    Ok(Reply::Int(found as i64))
}

pub(super) fn cmd_hstrlen(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let (_, meta) = open_or!(kv, &args[1], HASH, Reply::Int(0));
    let len = field(kv, &args[1], meta.version, &args[2])?.map_or(0, |v| v.len());
    Ok(Reply::Int(len as i64))
}

pub(super) fn cmd_hdel(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let key = &args[1];
    let (opened, meta) = open_or!(kv, key, HASH, Reply::Int(0));
    let mut update = Update::new(key, opened, HASH);
    let mut gone = std::collections::HashSet::new();
    for f in &args[2..] {
        if !gone.contains(f) && field(kv, key, meta.version, f)?.is_some() {
            update.delete(F, f);
            gone.insert(f.clone());
        }
    }
    if gone.is_empty() {
        return Ok(Reply::Int(0));
    }
    update.meta.count = update.meta.count.saturating_sub(gone.len() as u64);
    update.apply(kv, "hdel")?;
    Ok(Reply::Int(gone.len() as i64))
}

/// A read-modify-write of one field (HINCRBY, HINCRBYFLOAT; `event` its notification):
/// `f` maps the old value to the new one, or to the reply when it does not fit.
fn modify_field(
    kv: &mut dyn Kv,
    args: &[Vec<u8>],
    event: &'static str,
    f: impl FnOnce(Option<&[u8]>) -> Result<(Vec<u8>, Reply), Reply>,
) -> tucana::Result<Reply> {
    let key = &args[1];
    let opened = match open(kv, key, HASH)? {
        Ok(o) => o,
        Err(reply) => return Ok(reply),
    };
    let mut update = Update::new(key, opened, HASH);
    let old = field(kv, key, update.meta.version, &args[2])?;
    let (value, reply) = match f(old.as_deref()) {
        Ok(done) => done,
        Err(reply) => return Ok(reply),
    };
    if old.is_none() {
        update.meta.count += 1;
    }
    update.put(F, &args[2], value);
    update.apply(kv, event)?;
    Ok(reply)
}

pub(super) fn cmd_hincrby(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let Some(delta) = parse_i64(&args[3]) else {
        return Ok(not_an_integer());
    };
    modify_field(kv, args, "hincrby", |old| {
        let current = match old {
            None => 0,
            Some(v) => {
                parse_i64(v).ok_or_else(|| Reply::error("ERR hash value is not an integer"))?
            }
        };
        let next = current
            .checked_add(delta)
            .ok_or_else(|| Reply::error("ERR increment or decrement would overflow"))?;
        Ok((next.to_string().into_bytes(), Reply::Int(next)))
    })
}

/// HINCRBYFLOAT's arithmetic is in `f64` and its result printed in the shortest form that
/// reads back the same (Redis uses `long double` and 17 decimals, trimmed: the same text
/// for the sums people write, like 10.5 + 0.1 = 10.6).
pub(super) fn cmd_hincrbyfloat(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let Some(delta) = parse_double(&args[3]) else {
        return Ok(Reply::error("ERR value is not a valid float"));
    };
    if !delta.is_finite() {
        return Ok(Reply::error("ERR value is NaN or Infinity"));
    }
    modify_field(kv, args, "hincrbyfloat", |old| {
        let current = match old {
            None => 0.0,
            Some(v) => parse_double(v)
                .filter(|d| d.is_finite())
                .ok_or_else(|| Reply::error("ERR hash value is not a float"))?,
        };
        let next = current + delta;
        if !next.is_finite() {
            return Err(Reply::error("ERR increment would produce NaN or Infinity"));
        }
        let text = format!("{next}").into_bytes();
        Ok((text.clone(), Reply::Bulk(text)))
    })
}

/// `HRANDFIELD key [count [WITHVALUES]]`: without a count one field (or nil); a positive
/// count that many distinct fields (at most all); a negative one that many, repeats
/// allowed.
pub(super) fn cmd_hrandfield(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let with_values = match args.get(3) {
        None => false,
        Some(w) if w.eq_ignore_ascii_case(b"WITHVALUES") && args.len() == 4 => true,
        Some(_) => return Ok(super::syntax_error()),
    };
    let count = match args.get(2).map(|n| random_count(n, with_values)) {
        None => None,
        Some(Ok(n)) => Some(n),
        Some(Err(reply)) => return Ok(reply),
    };
    let missing = if count.is_some() {
        Reply::Array(Vec::new())
    } else {
        Reply::Nil
    };
    let (_, meta) = open_or!(kv, &args[1], HASH, missing);
    let picks = random_members(kv, F, &args[1], &meta, count)?;
    let Some(_) = count else {
        return Ok(picks
            .into_iter()
            .next()
            .map_or(Reply::Nil, |(f, _)| Reply::Bulk(f)));
    };
    if with_values {
        // RESP3: [[field, value], ...], as Redis 7 answers.
        let pairs = picks
            .into_iter()
            .map(|(f, v)| (Reply::Bulk(f), Reply::Bulk(v)))
            .collect();
        return Ok(Reply::Pairs(pairs));
    }
    Ok(Reply::Array(
        picks.into_iter().map(|(f, _)| Reply::Bulk(f)).collect(),
    ))
}

/// Picks with repeats beyond this many are refused (Redis would build the reply until
/// memory runs out).
const MAX_REPEATED_PICKS: u64 = 1 << 32;

/// The count of HRANDFIELD and SRANDMEMBER, checked as Redis checks it (its range, and
/// half of it with values), and refused past [`MAX_REPEATED_PICKS`] repeats.
pub(super) fn random_count(arg: &[u8], with_values: bool) -> Result<i64, Reply> {
    let n = parse_i64(arg).ok_or_else(not_an_integer)?;
    if n == i64::MIN {
        return Err(Reply::error(
            "ERR value is out of range, value must between -9223372036854775807 and 9223372036854775807",
        ));
    }
    let too_many = (with_values && n.unsigned_abs() > (i64::MAX / 2) as u64)
        || (n < 0 && n.unsigned_abs() > MAX_REPEATED_PICKS);
    if too_many {
        return Err(Reply::error("ERR value is out of range"));
    }
    Ok(n)
}

/// `HSCAN key cursor [MATCH pattern] [COUNT n]`: every field and value in one reply.
pub(super) fn cmd_hscan(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let pattern = match scan_options(args) {
        Ok(p) => p,
        Err(reply) => return Ok(reply),
    };
    let (_, meta) = open_or!(kv, &args[1], HASH, scan_reply(Vec::new()));
    let mut items = Vec::new();
    for (f, v) in all_members(kv, F, &args[1], meta.version)? {
        if pattern.as_ref().is_none_or(|p| glob_match(p, &f)) {
            items.push(Reply::Bulk(f));
            items.push(Reply::Bulk(v));
        }
    }
    Ok(scan_reply(items))
}
