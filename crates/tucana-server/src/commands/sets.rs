//! The set commands: SADD, SREM, SMEMBERS, SISMEMBER, SMISMEMBER, SCARD, SPOP,
//! SRANDMEMBER, SMOVE, SSCAN, and the set algebra SINTER, SUNION, SDIFF with their
//! `*STORE` forms, and SINTERCARD.
//!
//! A set is its metadata at the client's key and one sub-record per member
//! (`types::Family::Set`, member → empty); members come back in byte order (Redis
//! promises no order). The algebra reads every member of its sets (O(total members)).
//! Owns the commands' semantics; storage is `collection`'s and `types`'.
//!
//! Thread-safety: plain functions on the store a handler is given.

use std::collections::BTreeSet;

use crate::glob::glob_match;
use crate::resp::Reply;
use crate::types::{sub_key, Family, Kind};

use super::collection::{
    all_members, open, open_or, random_members, scan_options, scan_reply, Update,
};
use super::hashes::random_count;
use super::kv::Kv;
use super::{not_an_integer, parse_i64};

const SET: Kind = Kind::Set;
const F: Family = Family::Set;

fn is_member(kv: &mut dyn Kv, key: &[u8], version: u64, m: &[u8]) -> tucana::Result<bool> {
    Ok(kv.lookup(&sub_key(F, key, version, m))?.is_some())
}

pub(super) fn cmd_sadd(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let key = &args[1];
    let opened = match open(kv, key, SET)? {
        Ok(o) => o,
        Err(reply) => return Ok(reply),
    };
    let existed = opened.meta.is_some();
    let mut update = Update::new(key, opened, SET);
    let mut added = BTreeSet::new();
    for m in &args[2..] {
        if added.contains(m) || (existed && is_member(kv, key, update.meta.version, m)?) {
            continue;
        }
        update.put(F, m, Vec::new());
        added.insert(m.clone());
    }
    if added.is_empty() {
        return Ok(Reply::Int(0));
    }
    update.meta.count += added.len() as u64;
    update.apply(kv, "sadd")?;
    Ok(Reply::Int(added.len() as i64))
}

pub(super) fn cmd_srem(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let key = &args[1];
    let (opened, meta) = open_or!(kv, key, SET, Reply::Int(0));
    let mut update = Update::new(key, opened, SET);
    let mut gone = BTreeSet::new();
    for m in &args[2..] {
        if !gone.contains(m) && is_member(kv, key, meta.version, m)? {
            update.delete(F, m);
            gone.insert(m.clone());
        }
    }
    if gone.is_empty() {
        return Ok(Reply::Int(0));
    }
    update.meta.count = update.meta.count.saturating_sub(gone.len() as u64);
    update.apply(kv, "srem")?;
    Ok(Reply::Int(gone.len() as i64))
}

/// Every member of `key` (missing: none); `Err` is WRONGTYPE.
fn members_of(kv: &mut dyn Kv, key: &[u8]) -> tucana::Result<Result<Vec<Vec<u8>>, Reply>> {
    let opened = match open(kv, key, SET)? {
        Ok(o) => o,
        Err(reply) => return Ok(Err(reply)),
    };
    let Some(meta) = opened.meta else {
        return Ok(Ok(Vec::new()));
    };
    let pairs = all_members(kv, F, key, meta.version)?;
    Ok(Ok(pairs.into_iter().map(|(m, _)| m).collect()))
}

fn set_reply(members: impl IntoIterator<Item = Vec<u8>>) -> Reply {
    Reply::Set(members.into_iter().map(Reply::Bulk).collect())
}

pub(super) fn cmd_smembers(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    Ok(match members_of(kv, &args[1])? {
        Ok(members) => set_reply(members),
        Err(reply) => reply,
    })
}

pub(super) fn cmd_sismember(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let (_, meta) = open_or!(kv, &args[1], SET, Reply::Int(0));
    Ok(Reply::Int(
        is_member(kv, &args[1], meta.version, &args[2])? as i64
    ))
}

pub(super) fn cmd_smismember(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let zeros = Reply::Array(vec![Reply::Int(0); args.len() - 2]);
    let (_, meta) = open_or!(kv, &args[1], SET, zeros);
    let mut out = Vec::new();
    for m in &args[2..] {
        out.push(Reply::Int(is_member(kv, &args[1], meta.version, m)? as i64));
    }
    Ok(Reply::Array(out))
}

pub(super) fn cmd_scard(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let (_, meta) = open_or!(kv, &args[1], SET, Reply::Int(0));
    Ok(Reply::Int(meta.count as i64))
}

/// The optional count of SPOP and SRANDMEMBER: `Err` is the reply to a bad one.
fn count_arg(args: &[Vec<u8>], positive: bool) -> Result<Option<i64>, Reply> {
    match args.get(2) {
        None => Ok(None),
        Some(_) if args.len() > 3 => Err(super::syntax_error()),
        Some(n) => match parse_i64(n) {
            Some(n) if !positive || n >= 0 => Ok(Some(n)),
            // SPOP reads its count as a positive number: anything else is out of range.
            _ if positive => Err(Reply::error("ERR value is out of range, must be positive")),
            _ => Err(not_an_integer()),
        },
    }
}

pub(super) fn cmd_spop(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let count = match count_arg(args, true) {
        Ok(c) => c,
        Err(reply) => return Ok(reply),
    };
    let missing = if count.is_some() {
        Reply::Set(Vec::new())
    } else {
        Reply::Nil
    };
    let key = &args[1];
    let (opened, meta) = open_or!(kv, key, SET, missing);
    if count == Some(0) {
        return Ok(Reply::Set(Vec::new()));
    }
    let picks = random_members(kv, F, key, &meta, Some(count.unwrap_or(1)))?;
    let mut update = Update::new(key, opened, SET);
    let mut popped = Vec::new();
    for (m, _) in picks {
        update.delete(F, &m);
        update.meta.count = update.meta.count.saturating_sub(1);
        popped.push(m);
    }
    update.apply(kv, "spop")?;
    Ok(match count {
        None => popped.pop().map_or(Reply::Nil, Reply::Bulk),
        Some(_) => set_reply(popped),
    })
}

pub(super) fn cmd_srandmember(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let count = match count_arg(args, false) {
        Ok(c) => c,
        Err(reply) => return Ok(reply),
    };
    if let Some(Err(reply)) = args.get(2).map(|n| random_count(n, false)) {
        return Ok(reply);
    }
    let missing = if count.is_some() {
        Reply::Array(Vec::new())
    } else {
        Reply::Nil
    };
    let (_, meta) = open_or!(kv, &args[1], SET, missing);
    let picks = random_members(kv, F, &args[1], &meta, count)?;
    Ok(match count {
        None => picks
            .into_iter()
            .next()
            .map_or(Reply::Nil, |(m, _)| Reply::Bulk(m)),
        Some(_) => Reply::Array(picks.into_iter().map(|(m, _)| Reply::Bulk(m)).collect()),
    })
}

/// `SMOVE source destination member`: both keys' writes in one batch.
pub(super) fn cmd_smove(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let (src, dst, m) = (&args[1], &args[2], &args[3]);
    let src_opened = match open(kv, src, SET)? {
        Ok(o) => o,
        Err(reply) => return Ok(reply),
    };
    let dst_opened = match open(kv, dst, SET)? {
        Ok(o) => o,
        Err(reply) => return Ok(reply),
    };
    let Some(src_meta) = src_opened.meta else {
        return Ok(Reply::Int(0));
    };
    if !is_member(kv, src, src_meta.version, m)? {
        return Ok(Reply::Int(0));
    }
    if src == dst {
        return Ok(Reply::Int(1));
    }
    let dst_has = match dst_opened.meta {
        Some(meta) => is_member(kv, dst, meta.version, m)?,
        None => false,
    };
    let mut from = Update::new(src, src_opened, SET);
    from.delete(F, m);
    from.meta.count = from.meta.count.saturating_sub(1);
    // Redis's order: the source's events (`srem`, `del` if emptied), then the
    // destination's (`new`, `sadd`; none when it had the member).
    let flags = kv.notify_flags();
    let (mut writes, mut events) = from.finish(flags, Some("srem"));
    if !dst_has {
        let mut to = Update::new(dst, dst_opened, SET);
        to.put(F, m, Vec::new());
        to.meta.count += 1;
        let (to_writes, to_events) = to.finish(flags, Some("sadd"));
        writes.append(to_writes);
        events.append(to_events);
    }
    writes.apply(kv)?;
    events.raise(kv);
    Ok(Reply::Int(1))
}

#[derive(Clone, Copy, PartialEq)]
enum Op {
    Inter,
    Union,
    Diff,
}

/// The members of `op` over `keys`; `Err` is WRONGTYPE (every key is checked first, as
/// Redis does).
fn algebra(
    kv: &mut dyn Kv,
    keys: &[Vec<u8>],
    op: Op,
) -> tucana::Result<Result<BTreeSet<Vec<u8>>, Reply>> {
    let mut sets = Vec::with_capacity(keys.len());
    for key in keys {
        match members_of(kv, key)? {
            Ok(members) => sets.push(members.into_iter().collect::<BTreeSet<_>>()),
            Err(reply) => return Ok(Err(reply)),
        }
    }
    let mut sets = sets.into_iter();
    let first = sets.next().unwrap_or_default();
    Ok(Ok(sets.fold(first, |acc, s| match op {
        Op::Inter => acc.intersection(&s).cloned().collect(),
        Op::Union => acc.union(&s).cloned().collect(),
        Op::Diff => acc.difference(&s).cloned().collect(),
    })))
}

fn algebra_command(kv: &mut dyn Kv, args: &[Vec<u8>], op: Op) -> tucana::Result<Reply> {
    Ok(match algebra(kv, &args[1..], op)? {
        Ok(members) => set_reply(members),
        Err(reply) => reply,
    })
}

/// The `*STORE` forms: the result replaces `destination` (whatever it held, without a
/// deadline); an empty result deletes it. The result's size.
fn store_command(kv: &mut dyn Kv, args: &[Vec<u8>], op: Op) -> tucana::Result<Reply> {
    let members = match algebra(kv, &args[2..], op)? {
        Ok(members) => members,
        Err(reply) => return Ok(reply),
    };
    let mut update = Update::replace(kv, &args[1], SET)?;
    for m in &members {
        update.put(F, m, Vec::new());
    }
    update.meta.count = members.len() as u64;
    let event = match op {
        Op::Inter => "sinterstore",
        Op::Union => "sunionstore",
        Op::Diff => "sdiffstore",
    };
    update.apply_store(kv, event)?;
    Ok(Reply::Int(members.len() as i64))
}

pub(super) fn cmd_sinter(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    algebra_command(kv, args, Op::Inter)
}

pub(super) fn cmd_sunion(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    algebra_command(kv, args, Op::Union)
}

pub(super) fn cmd_sdiff(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    algebra_command(kv, args, Op::Diff)
}

pub(super) fn cmd_sinterstore(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    store_command(kv, args, Op::Inter)
}

pub(super) fn cmd_sunionstore(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    store_command(kv, args, Op::Union)
}

pub(super) fn cmd_sdiffstore(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    store_command(kv, args, Op::Diff)
}

/// `SINTERCARD numkeys key... [LIMIT n]`: the size of the intersection (at most `n`).
pub(super) fn cmd_sintercard(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let (keys, limit) = match super::zset_algebra::card_request(args, false) {
        Ok(r) => r,
        Err(reply) => return Ok(reply),
    };
    Ok(match algebra(kv, keys, Op::Inter)? {
        Ok(members) if limit > 0 => Reply::Int(members.len().min(limit) as i64),
        Ok(members) => Reply::Int(members.len() as i64),
        Err(reply) => reply,
    })
}

/// `SSCAN key cursor [MATCH pattern] [COUNT n]`: every member in one reply.
pub(super) fn cmd_sscan(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let pattern = match scan_options(args) {
        Ok(p) => p,
        Err(reply) => return Ok(reply),
    };
    let (_, meta) = open_or!(kv, &args[1], SET, scan_reply(Vec::new()));
    let mut items = Vec::new();
    for (m, _) in all_members(kv, F, &args[1], meta.version)? {
        if pattern.as_ref().is_none_or(|p| glob_match(p, &m)) {
            items.push(Reply::Bulk(m));
        }
    }
    Ok(scan_reply(items))
}
