//! The sorted set commands: ZADD (NX, XX, GT, LT, CH, INCR), ZINCRBY, ZREM, ZSCORE,
//! ZMSCORE, ZCARD, ZCOUNT, ZRANK, ZREVRANK, ZRANGE (BYSCORE, BYLEX, REV, LIMIT,
//! WITHSCORES), ZREVRANGE, ZRANGEBYSCORE, ZREVRANGEBYSCORE, ZRANGEBYLEX, ZREVRANGEBYLEX,
//! ZLEXCOUNT, ZREMRANGEBYSCORE, ZREMRANGEBYRANK, ZREMRANGEBYLEX, ZPOPMIN, ZPOPMAX, ZSCAN.
//!
//! A sorted set is its metadata at the client's key and two sub-records per member: by
//! member (`ZMember`: member → score) for point reads and lex ranges, by score
//! (`ZScore`: order-preserving score, member → empty) for score and rank ranges, written
//! together by every command. Ranks are counted by walking the score family (O(rank)).
//! Owns the commands' semantics; storage is `collection`'s and `types`'.
//!
//! Thread-safety: plain functions on the store a handler is given.

use std::ops::Bound;

use crate::glob::glob_match;
use crate::resp::Reply;
use crate::types::{
    decode_score, encode_score, score_from_order, score_order, sub_key, Family, Kind,
};

use super::collection::{
    all_members, double_reply, members, open, open_or, parse_double, scan_options, scan_reply,
    Update,
};
use super::kv::Kv;
use super::{not_an_integer, parse_i64, syntax_error};

pub(super) const ZSET: Kind = Kind::ZSet;

/// Members with their scores, in the order a command answers them.
pub(super) type Items = Vec<(Vec<u8>, f64)>;
/// Bounds on members (a lex range).
type LexBounds = (Bound<Vec<u8>>, Bound<Vec<u8>>);
/// Where a range answer starts and how much of it: `(offset, limit)`.
type Window = (usize, usize);

/// A member's score in version `version` of `key`.
fn score_of(kv: &mut dyn Kv, key: &[u8], version: u64, m: &[u8]) -> tucana::Result<Option<f64>> {
    kv.lookup(&sub_key(Family::ZMember, key, version, m))?
        .map(|v| decode_score(&v))
        .transpose()
}

/// Writes `member` with `score` (its old score `old` if it had one) into `update`; -0 is
/// stored as 0, as Redis stores it.
pub(super) fn put_member(update: &mut Update<'_>, member: &[u8], score: f64, old: Option<f64>) {
    let score = score + 0.0;
    if let Some(old) = old {
        update.delete_parts(Family::ZScore, &[&score_order(old), member]);
    } else {
        update.meta.count += 1;
    }
    update.put(Family::ZMember, member, encode_score(score).to_vec());
    update.put_parts(Family::ZScore, &[&score_order(score), member], Vec::new());
}

pub(super) fn delete_member(update: &mut Update<'_>, member: &[u8], score: f64) {
    update.delete(Family::ZMember, member);
    update.delete_parts(Family::ZScore, &[&score_order(score), member]);
    update.meta.count = update.meta.count.saturating_sub(1);
}

fn score_key(score: f64, member: &[u8]) -> Vec<u8> {
    [&score_order(score)[..], member].concat()
}

/// A score family suffix back as (score, member); damage is an error.
fn split_score_key(suffix: &[u8]) -> tucana::Result<(f64, &[u8])> {
    if suffix.len() < 8 {
        return Err(tucana::Error::InvalidArgument(format!(
            "damaged sorted set score entry ({} bytes)",
            suffix.len()
        )));
    }
    let (order, member) = suffix.split_at(8);
    Ok((score_from_order(order)?, member))
}

/// ZADD's flags.
#[derive(Default)]
struct ZaddFlags {
    nx: bool,
    xx: bool,
    gt: bool,
    lt: bool,
    ch: bool,
    incr: bool,
}

/// Which of [`ZaddFlags`]' fields a flag word sets.
type ZaddFlag = fn(&mut ZaddFlags) -> &mut bool;

/// ZADD's flag words (matched without regard to case) and the flag each sets.
const ZADD_FLAGS: [(&[u8], ZaddFlag); 6] = [
    (b"NX", |f| &mut f.nx),
    (b"XX", |f| &mut f.xx),
    (b"GT", |f| &mut f.gt),
    (b"LT", |f| &mut f.lt),
    (b"CH", |f| &mut f.ch),
    (b"INCR", |f| &mut f.incr),
];

/// The flag `arg` names, if it is one of ZADD's flag words (which come before its pairs).
fn zadd_flag(arg: &[u8]) -> Option<ZaddFlag> {
    ZADD_FLAGS
        .iter()
        .find(|(name, _)| arg.eq_ignore_ascii_case(name))
        .map(|&(_, flag)| flag)
}

/// Whether `arg` is one of ZADD's flag words (which come before its pairs).
pub(super) fn is_zadd_flag(arg: &[u8]) -> bool {
    zadd_flag(arg).is_some()
}

/// `ZADD key [NX|XX] [GT|LT] [CH] [INCR] score member [score member ...]`, with Redis's
/// order of checks and replies.
pub(super) fn cmd_zadd(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let mut f = ZaddFlags::default();
    let mut i = 2;
    while i < args.len() {
        let Some(flag) = zadd_flag(&args[i]) else {
            break;
        };
        *flag(&mut f) = true;
        i += 1;
    }
    let rest = &args[i..];
    if rest.is_empty() || !rest.len().is_multiple_of(2) {
        return Ok(syntax_error());
    }
    if f.nx && f.xx {
        return Ok(Reply::error(
            "ERR XX and NX options at the same time are not compatible",
        ));
    }
    if (f.nx && (f.gt || f.lt)) || (f.gt && f.lt) {
        return Ok(Reply::error(
            "ERR GT, LT, and/or NX options at the same time are not compatible",
        ));
    }
    if f.incr && rest.len() > 2 {
        return Ok(Reply::error(
            "ERR INCR option supports a single increment-element pair",
        ));
    }
    let mut pairs = Vec::with_capacity(rest.len() / 2);
    for pair in rest.chunks(2) {
        let Some(score) = parse_double(&pair[0]) else {
            return Ok(Reply::error("ERR value is not a valid float"));
        };
        pairs.push((score, &pair[1]));
    }
    let key = &args[1];
    let opened = match open(kv, key, ZSET)? {
        Ok(o) => o,
        Err(reply) => return Ok(reply),
    };
    let missing = opened.meta.is_none();
    let mut update = Update::new(key, opened, ZSET);
    let (mut added, mut updated) = (0, 0);
    let mut incr_result = None;
    // Scores written by this command (a member given twice sees its first write); only
    // kept when there is more than one pair.
    let several = pairs.len() > 1;
    let mut written: std::collections::HashMap<&[u8], f64> = std::collections::HashMap::new();
    for (score, member) in pairs {
        if missing && f.xx {
            break;
        }
        let old = match written.get(member.as_slice()) {
            Some(&s) => Some(s),
            None if missing => None,
            None => score_of(kv, key, update.meta.version, member)?,
        };
        let Some(cur) = old else {
            if f.xx {
                continue;
            }
            put_member(&mut update, member, score, None);
            if several {
                written.insert(member, score);
            }
            added += 1;
            incr_result = Some(score);
            continue;
        };
        if f.nx {
            continue;
        }
        let mut score = score;
        if f.incr {
            score += cur;
            if score.is_nan() {
                return Ok(Reply::error("ERR resulting score is not a number (NaN)"));
            }
        }
        if (f.lt && score >= cur) || (f.gt && score <= cur) {
            continue;
        }
        incr_result = Some(score);
        if score != cur {
            put_member(&mut update, member, score, Some(cur));
            if several {
                written.insert(member, score);
            }
            updated += 1;
        }
    }
    // Nothing changed: nothing written (and WATCH not disturbed), as in Redis.
    if added + updated > 0 {
        update.apply(kv, if f.incr { "zincr" } else { "zadd" })?;
    }
    Ok(match (f.incr, incr_result) {
        // The score as computed (-0 answers -0, though 0 is stored, as in Redis).
        (true, Some(score)) => double_reply(score),
        (true, None) => Reply::Nil,
        _ => Reply::Int(if f.ch { added + updated } else { added }),
    })
}

/// `ZINCRBY key increment member`.
pub(super) fn cmd_zincrby(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let Some(delta) = parse_double(&args[2]) else {
        return Ok(Reply::error("ERR value is not a valid float"));
    };
    let key = &args[1];
    let opened = match open(kv, key, ZSET)? {
        Ok(o) => o,
        Err(reply) => return Ok(reply),
    };
    let mut update = Update::new(key, opened, ZSET);
    let old = score_of(kv, key, update.meta.version, &args[3])?;
    // A new member takes the increment itself (-0 stays -0 in the reply).
    let score = old.map_or(delta, |o| o + delta);
    if score.is_nan() {
        return Ok(Reply::error("ERR resulting score is not a number (NaN)"));
    }
    // An unchanged score writes nothing and raises no event, as in Redis.
    if old != Some(score) {
        put_member(&mut update, &args[3], score, old);
        update.apply(kv, "zincr")?;
    }
    Ok(double_reply(score))
}

pub(super) fn cmd_zrem(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let key = &args[1];
    let (opened, meta) = open_or!(kv, key, ZSET, Reply::Int(0));
    let mut update = Update::new(key, opened, ZSET);
    let mut gone = std::collections::HashSet::new();
    for m in &args[2..] {
        if gone.contains(m) {
            continue;
        }
        if let Some(score) = score_of(kv, key, meta.version, m)? {
            delete_member(&mut update, m, score);
            gone.insert(m.clone());
        }
    }
    if !gone.is_empty() {
        update.apply(kv, "zrem")?;
    }
    Ok(Reply::Int(gone.len() as i64))
}

pub(super) fn cmd_zscore(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let (_, meta) = open_or!(kv, &args[1], ZSET, Reply::Nil);
    Ok(score_of(kv, &args[1], meta.version, &args[2])?.map_or(Reply::Nil, double_reply))
}

pub(super) fn cmd_zmscore(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let nils = Reply::Array(vec![Reply::Nil; args.len() - 2]);
    let (_, meta) = open_or!(kv, &args[1], ZSET, nils);
    let mut out = Vec::new();
    for m in &args[2..] {
        out.push(score_of(kv, &args[1], meta.version, m)?.map_or(Reply::Nil, double_reply));
    }
    Ok(Reply::Array(out))
}

pub(super) fn cmd_zcard(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let (_, meta) = open_or!(kv, &args[1], ZSET, Reply::Int(0));
    Ok(Reply::Int(meta.count as i64))
}

/// A score bound: `-inf`, `(1.5` (exclusive), `3`.
#[derive(Clone, Copy)]
struct ScoreBound {
    score: f64,
    exclusive: bool,
}

fn score_bound(arg: &[u8]) -> Option<ScoreBound> {
    let (exclusive, text) = match arg.split_first() {
        Some((b'(', rest)) => (true, rest),
        _ => (false, arg),
    };
    Some(ScoreBound {
        score: parse_double(text)?,
        exclusive,
    })
}

fn bad_score_bound() -> Reply {
    Reply::error("ERR min or max is not a float")
}

/// The smallest 8 bytes above `b` (as a big-endian number): the start of the next
/// score's entries.
fn next_order(b: [u8; 8]) -> Vec<u8> {
    u64::from_be_bytes(b).wrapping_add(1).to_be_bytes().to_vec()
}

/// The score family's suffix bounds of `min`..`max`.
fn score_bounds(min: ScoreBound, max: ScoreBound) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    let lo = if min.exclusive {
        Bound::Included(next_order(score_order(min.score)))
    } else {
        Bound::Included(score_order(min.score).to_vec())
    };
    let hi = if max.exclusive {
        Bound::Excluded(score_order(max.score).to_vec())
    } else if max.score == f64::INFINITY {
        Bound::Unbounded
    } else {
        Bound::Excluded(next_order(score_order(max.score)))
    };
    (lo, hi)
}

/// An empty range (min above max) would make bounds the engine may refuse.
fn empty_score_range(min: ScoreBound, max: ScoreBound) -> bool {
    min.score > max.score || (min.score == max.score && (min.exclusive || max.exclusive))
}

fn as_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Included(v) => Bound::Included(v.as_slice()),
        Bound::Excluded(v) => Bound::Excluded(v.as_slice()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

/// (member, score) of the members with a score in `min`..`max`, in score order
/// (`rev`: descending), after skipping `offset`, at most `limit`.
fn by_score(
    kv: &mut dyn Kv,
    key: &[u8],
    version: u64,
    (min, max): (ScoreBound, ScoreBound),
    rev: bool,
    (offset, limit): Window,
) -> tucana::Result<Items> {
    if empty_score_range(min, max) {
        return Ok(Vec::new());
    }
    let (lo, hi) = score_bounds(min, max);
    let take = offset.saturating_add(limit);
    let pairs = members(
        kv,
        Family::ZScore,
        key,
        version,
        (as_ref(&lo), as_ref(&hi)),
        rev,
        take,
    )?;
    let mut out = Vec::with_capacity(pairs.len().saturating_sub(offset));
    for (mut suffix, _) in pairs.into_iter().skip(offset) {
        let (score, member) = split_score_key(&suffix)?;
        let member_at = suffix.len() - member.len();
        // The member in the suffix's own buffer: no allocation per item.
        suffix.drain(..member_at);
        out.push((suffix, score));
    }
    Ok(out)
}

/// A lex bound of ZRANGEBYLEX: `-`, `+`, `[m`, `(m`; `None` for anything else.
fn lex_bound(arg: &[u8]) -> Option<Bound<Vec<u8>>> {
    match arg {
        b"-" => Some(Bound::Unbounded),
        b"+" => Some(Bound::Unbounded),
        [b'[', m @ ..] => Some(Bound::Included(m.to_vec())),
        [b'(', m @ ..] => Some(Bound::Excluded(m.to_vec())),
        _ => None,
    }
}

/// A lex range's bounds: `-` as a maximum or `+` as a minimum match nothing.
fn lex_range(min: &[u8], max: &[u8]) -> Result<Option<LexBounds>, Reply> {
    let (Some(lo), Some(hi)) = (lex_bound(min), lex_bound(max)) else {
        return Err(Reply::error("ERR min or max not valid string range item"));
    };
    if min == b"+" || max == b"-" {
        return Ok(None);
    }
    let empty = match (&lo, &hi) {
        (Bound::Included(a), Bound::Included(b)) => a > b,
        (Bound::Included(a) | Bound::Excluded(a), Bound::Included(b) | Bound::Excluded(b)) => {
            a >= b
        }
        _ => false,
    };
    Ok((!empty).then_some((lo, hi)))
}

/// (member, score) of the members in a lex range, in member order (`rev`: descending),
/// after `offset`, at most `limit`.
fn by_lex(
    kv: &mut dyn Kv,
    key: &[u8],
    version: u64,
    (lo, hi): &LexBounds,
    rev: bool,
    (offset, limit): Window,
) -> tucana::Result<Items> {
    let pairs = members(
        kv,
        Family::ZMember,
        key,
        version,
        (as_ref(lo), as_ref(hi)),
        rev,
        offset.saturating_add(limit),
    )?;
    pairs
        .into_iter()
        .skip(offset)
        .map(|(m, v)| Ok((m, decode_score(&v)?)))
        .collect()
}

/// Ranks `start..=stop` (Redis's negative indexes) of a collection of `len` as a
/// non-empty `(first, count)`.
pub(super) fn rank_window(start: i64, stop: i64, len: u64) -> Option<(usize, usize)> {
    let len = len as i64;
    let start = if start < 0 {
        (len + start).max(0)
    } else {
        start
    };
    let stop = if stop < 0 {
        len + stop
    } else {
        stop.min(len - 1)
    };
    if start > stop || start >= len {
        return None;
    }
    Some((start as usize, (stop - start + 1) as usize))
}

/// (member, score) by rank, `rev` counting from the highest score.
pub(super) fn by_rank(
    kv: &mut dyn Kv,
    key: &[u8],
    version: u64,
    first: usize,
    count: usize,
    rev: bool,
) -> tucana::Result<Items> {
    let all = ScoreBound {
        score: f64::NEG_INFINITY,
        exclusive: false,
    };
    let top = ScoreBound {
        score: f64::INFINITY,
        exclusive: false,
    };
    by_score(kv, key, version, (all, top), rev, (first, count))
}

pub(super) fn range_reply(items: Items, with_scores: bool) -> Reply {
    if with_scores {
        // RESP3: [[member, score], ...]; RESP2: [member, score, ...].
        return Reply::Pairs(
            items
                .into_iter()
                .map(|(m, s)| (Reply::Bulk(m), double_reply(s)))
                .collect(),
        );
    }
    Reply::Array(items.into_iter().map(|(m, _)| Reply::Bulk(m)).collect())
}

/// What a ZRANGE-family request asks for.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum By {
    Rank,
    Score,
    Lex,
}

pub(super) struct RangeRequest {
    by: By,
    rev: bool,
    pub(super) with_scores: bool,
    /// LIMIT offset count (`None`: all).
    limit: Option<(i64, i64)>,
}

/// Parses `[BYSCORE|BYLEX] [REV] [LIMIT offset count] [WITHSCORES]` (ZRANGE) or, with
/// `fixed`, only `[WITHSCORES] [LIMIT offset count]` after a command that names its kind.
pub(super) fn range_request(
    args: &[Vec<u8>],
    mut req: RangeRequest,
    fixed: bool,
) -> Result<RangeRequest, Reply> {
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].to_ascii_uppercase();
        match arg.as_slice() {
            b"WITHSCORES" if !(fixed && req.by == By::Lex) => req.with_scores = true,
            b"LIMIT" if args.len() > i + 2 => {
                let (Some(o), Some(c)) = (parse_i64(&args[i + 1]), parse_i64(&args[i + 2])) else {
                    return Err(not_an_integer());
                };
                req.limit = Some((o, c));
                i += 2;
            }
            b"BYSCORE" if !fixed => req.by = By::Score,
            b"BYLEX" if !fixed => req.by = By::Lex,
            b"REV" if !fixed => req.rev = true,
            _ => return Err(syntax_error()),
        }
        i += 1;
    }
    if req.limit.is_some() && req.by == By::Rank {
        return Err(Reply::error(
            "ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX",
        ));
    }
    if req.with_scores && req.by == By::Lex {
        return Err(Reply::error(
            "ERR syntax error, WITHSCORES not supported in combination with BYLEX",
        ));
    }
    Ok(req)
}

/// Runs a ZRANGE-family request on `key` with its two range arguments as given (for
/// `rev` score and lex ranges the first is the maximum).
pub(super) fn run_range(
    kv: &mut dyn Kv,
    key: &[u8],
    a: &[u8],
    b: &[u8],
    req: &RangeRequest,
) -> tucana::Result<Result<Items, Reply>> {
    let (offset, limit) = match req.limit {
        Some((o, _)) if o < 0 => (0, 0),
        Some((o, c)) => (o as usize, if c < 0 { usize::MAX } else { c as usize }),
        None => (0, usize::MAX),
    };
    // Arguments are checked before the key is looked at, as Redis does.
    let (lo_arg, hi_arg) = if req.rev { (b, a) } else { (a, b) };
    enum Parsed {
        Rank(i64, i64),
        Score(ScoreBound, ScoreBound),
        Lex(Option<LexBounds>),
    }
    let parsed = match req.by {
        By::Rank => match (parse_i64(a), parse_i64(b)) {
            (Some(s), Some(e)) => Parsed::Rank(s, e),
            _ => return Ok(Err(not_an_integer())),
        },
        By::Score => match (score_bound(lo_arg), score_bound(hi_arg)) {
            (Some(min), Some(max)) => Parsed::Score(min, max),
            _ => return Ok(Err(bad_score_bound())),
        },
        By::Lex => match lex_range(lo_arg, hi_arg) {
            Ok(r) => Parsed::Lex(r),
            Err(reply) => return Ok(Err(reply)),
        },
    };
    let opened = match open(kv, key, ZSET)? {
        Ok(o) => o,
        Err(reply) => return Ok(Err(reply)),
    };
    let Some(meta) = opened.meta else {
        return Ok(Ok(Vec::new()));
    };
    if limit == 0 {
        return Ok(Ok(Vec::new()));
    }
    let items = match parsed {
        Parsed::Rank(s, e) => match rank_window(s, e, meta.count) {
            Some((first, count)) => by_rank(kv, key, meta.version, first, count, req.rev)?,
            None => Vec::new(),
        },
        Parsed::Score(min, max) => {
            by_score(kv, key, meta.version, (min, max), req.rev, (offset, limit))?
        }
        Parsed::Lex(None) => Vec::new(),
        Parsed::Lex(Some(bounds)) => {
            by_lex(kv, key, meta.version, &bounds, req.rev, (offset, limit))?
        }
    };
    Ok(Ok(items))
}

fn range_command(
    kv: &mut dyn Kv,
    args: &[Vec<u8>],
    req: RangeRequest,
    fixed: bool,
) -> tucana::Result<Reply> {
    let req = match range_request(&args[4..], req, fixed) {
        Ok(r) => r,
        Err(reply) => return Ok(reply),
    };
    Ok(match run_range(kv, &args[1], &args[2], &args[3], &req)? {
        Ok(items) => range_reply(items, req.with_scores),
        Err(reply) => reply,
    })
}

pub(super) fn request(by: By, rev: bool) -> RangeRequest {
    RangeRequest {
        by,
        rev,
        with_scores: false,
        limit: None,
    }
}

pub(super) fn cmd_zrange(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    range_command(kv, args, request(By::Rank, false), false)
}

pub(super) fn cmd_zrevrange(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    // ZREVRANGE takes WITHSCORES only.
    if args.len() > 5 || (args.len() == 5 && !args[4].eq_ignore_ascii_case(b"WITHSCORES")) {
        return Ok(syntax_error());
    }
    range_command(kv, args, request(By::Rank, true), true)
}

pub(super) fn cmd_zrangebyscore(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    range_command(kv, args, request(By::Score, false), true)
}

pub(super) fn cmd_zrevrangebyscore(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    range_command(kv, args, request(By::Score, true), true)
}

pub(super) fn cmd_zrangebylex(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    range_command(kv, args, request(By::Lex, false), true)
}

pub(super) fn cmd_zrevrangebylex(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    range_command(kv, args, request(By::Lex, true), true)
}

/// `ZCOUNT key min max`.
pub(super) fn cmd_zcount(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let req = request(By::Score, false);
    Ok(match run_range(kv, &args[1], &args[2], &args[3], &req)? {
        Ok(items) => Reply::Int(items.len() as i64),
        Err(reply) => reply,
    })
}

/// `ZLEXCOUNT key min max`.
pub(super) fn cmd_zlexcount(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let req = request(By::Lex, false);
    Ok(match run_range(kv, &args[1], &args[2], &args[3], &req)? {
        Ok(items) => Reply::Int(items.len() as i64),
        Err(reply) => reply,
    })
}

/// ZREMRANGEBYSCORE, ZREMRANGEBYRANK, ZREMRANGEBYLEX: `key a b`, the number removed.
fn remrange(kv: &mut dyn Kv, args: &[Vec<u8>], by: By) -> tucana::Result<Reply> {
    let key = &args[1];
    let items = match run_range(kv, key, &args[2], &args[3], &request(by, false))? {
        Ok(items) => items,
        Err(reply) => return Ok(reply),
    };
    if items.is_empty() {
        return Ok(Reply::Int(0));
    }
    let opened = match open(kv, key, ZSET)? {
        Ok(o) => o,
        Err(reply) => return Ok(reply),
    };
    let mut update = Update::new(key, opened, ZSET);
    for (m, s) in &items {
        delete_member(&mut update, m, *s);
    }
    let event = match by {
        By::Score => "zremrangebyscore",
        By::Rank => "zremrangebyrank",
        By::Lex => "zremrangebylex",
    };
    update.apply(kv, event)?;
    Ok(Reply::Int(items.len() as i64))
}

pub(super) fn cmd_zremrangebyscore(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    remrange(kv, args, By::Score)
}

pub(super) fn cmd_zremrangebyrank(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    remrange(kv, args, By::Rank)
}

pub(super) fn cmd_zremrangebylex(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    remrange(kv, args, By::Lex)
}

/// ZRANK and ZREVRANK: `key member [WITHSCORE]`.
fn rank(kv: &mut dyn Kv, args: &[Vec<u8>], rev: bool) -> tucana::Result<Reply> {
    let with_score = match args.get(3) {
        None => false,
        Some(w) if args.len() == 4 && w.eq_ignore_ascii_case(b"WITHSCORE") => true,
        Some(_) => return Ok(syntax_error()),
    };
    let missing = if with_score {
        Reply::NilArray
    } else {
        Reply::Nil
    };
    let (_, meta) = open_or!(kv, &args[1], ZSET, missing);
    let Some(score) = score_of(kv, &args[1], meta.version, &args[2])? else {
        return Ok(missing);
    };
    let mine = score_key(score, &args[2]);
    let before = if rev {
        members(
            kv,
            Family::ZScore,
            &args[1],
            meta.version,
            (Bound::Excluded(mine.as_slice()), Bound::Unbounded),
            false,
            usize::MAX,
        )?
    } else {
        members(
            kv,
            Family::ZScore,
            &args[1],
            meta.version,
            (Bound::Unbounded, Bound::Excluded(mine.as_slice())),
            false,
            usize::MAX,
        )?
    };
    let n = Reply::Int(before.len() as i64);
    Ok(if with_score {
        Reply::Array(vec![n, double_reply(score)])
    } else {
        n
    })
}

pub(super) fn cmd_zrank(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    rank(kv, args, false)
}

pub(super) fn cmd_zrevrank(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    rank(kv, args, true)
}

/// ZPOPMIN and ZPOPMAX: `key [count]`.
fn pop(kv: &mut dyn Kv, args: &[Vec<u8>], max: bool) -> tucana::Result<Reply> {
    let count = match args.get(2) {
        None => 1,
        Some(n) => match parse_i64(n) {
            Some(n) if n >= 0 => n as usize,
            Some(_) => return Ok(Reply::error("ERR value is out of range, must be positive")),
            None => return Ok(not_an_integer()),
        },
    };
    if args.len() > 3 {
        return Ok(syntax_error());
    }
    let key = &args[1];
    let (opened, meta) = open_or!(kv, key, ZSET, Reply::Array(Vec::new()));
    if count == 0 {
        return Ok(Reply::Array(Vec::new()));
    }
    let items = by_rank(kv, key, meta.version, 0, count, max)?;
    let mut update = Update::new(key, opened, ZSET);
    for (m, s) in &items {
        delete_member(&mut update, m, *s);
    }
    update.apply(kv, if max { "zpopmax" } else { "zpopmin" })?;
    // Without a count, one flat [member, score] in RESP3 too.
    if args.len() == 2 {
        let flat = items
            .into_iter()
            .flat_map(|(m, s)| [Reply::Bulk(m), double_reply(s)])
            .collect();
        return Ok(Reply::Array(flat));
    }
    Ok(range_reply(items, true))
}

pub(super) fn cmd_zpopmin(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    pop(kv, args, false)
}

pub(super) fn cmd_zpopmax(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    pop(kv, args, true)
}

/// `ZSCAN key cursor [MATCH pattern] [COUNT n]`: every member and score in one reply.
pub(super) fn cmd_zscan(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let pattern = match scan_options(args) {
        Ok(p) => p,
        Err(reply) => return Ok(reply),
    };
    let (_, meta) = open_or!(kv, &args[1], ZSET, scan_reply(Vec::new()));
    let mut items = Vec::new();
    for (m, v) in all_members(kv, Family::ZMember, &args[1], meta.version)? {
        if pattern.as_ref().is_none_or(|p| glob_match(p, &m)) {
            let score = decode_score(&v)?;
            items.push(Reply::Bulk(m));
            items.push(double_reply(score));
        }
    }
    Ok(scan_reply(items))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_windows_follow_redis() {
        assert_eq!(rank_window(0, -1, 3), Some((0, 3)));
        assert_eq!(rank_window(-2, -1, 3), Some((1, 2)));
        assert_eq!(rank_window(-10, 1, 3), Some((0, 2)));
        assert_eq!(rank_window(1, 100, 3), Some((1, 2)));
        assert_eq!(rank_window(3, 5, 3), None);
        assert_eq!(rank_window(2, 1, 3), None);
        assert_eq!(rank_window(0, -4, 3), None);
    }

    #[test]
    fn lex_ranges_follow_redis() {
        assert!(lex_range(b"a", b"+").is_err());
        assert_eq!(lex_range(b"+", b"[z").unwrap(), None);
        assert_eq!(lex_range(b"[b", b"(b").unwrap(), None);
        assert!(lex_range(b"[b", b"[b").unwrap().is_some());
        assert!(lex_range(b"-", b"+").unwrap().is_some());
    }
}
