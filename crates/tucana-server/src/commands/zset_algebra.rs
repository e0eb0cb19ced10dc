//! The sorted set commands over several keys or into another key: ZUNION, ZINTER, ZDIFF
//! and their STORE forms (WEIGHTS, AGGREGATE, WITHSCORES), ZINTERCARD, ZRANGESTORE, and
//! ZRANDMEMBER.
//!
//! Owns their semantics as Redis 7.0 has them: plain sets count as sorted sets whose
//! every score is 1; a weighted score or a sum that is NaN (`inf * 0`, `inf - inf`)
//! becomes 0; results are answered and stored in score order (ties by member). Inputs
//! are read whole (O(members of every input)); a STORE writes its result and drops the
//! destination's old value in one batch (`collection::Update::replace`). Storage is
//! `collection`'s and `types`'; the single-key commands are `zsets`'.
//!
//! Thread-safety: plain functions on the store a handler is given.

use std::collections::BTreeMap;

use crate::expiry::now_ms;
use crate::resp::Reply;
use crate::types::{decode_score, Family, Kind, Meta};

use super::collection::{all_members, open_or, parse_double, random_members, wrongtype, Update};
use super::expire::read_stored;
use super::hashes::random_count;
use super::kv::Kv;
use super::zsets::{put_member, range_reply, range_request, request, run_range, By, Items, ZSET};
use super::{not_an_integer, parse_i64, syntax_error};

/// The members of `key` with their scores: a sorted set's, a set's with score 1, none
/// for a missing key; `Err` is WRONGTYPE.
fn scored_members(kv: &mut dyn Kv, key: &[u8]) -> tucana::Result<Result<Items, Reply>> {
    let Some(value) = read_stored(kv, key, now_ms())?.value else {
        return Ok(Ok(Vec::new()));
    };
    if !crate::types::is_typed(&value) {
        return Ok(Err(wrongtype()));
    }
    let meta = Meta::decode(&value)?;
    let items = match meta.kind {
        Kind::ZSet => all_members(kv, Family::ZMember, key, meta.version)?
            .into_iter()
            .map(|(m, s)| Ok((m, decode_score(&s)?)))
            .collect::<tucana::Result<Items>>()?,
        Kind::Set => all_members(kv, Family::Set, key, meta.version)?
            .into_iter()
            .map(|(m, _)| (m, 1.0))
            .collect(),
        _ => return Ok(Err(wrongtype())),
    };
    Ok(Ok(items))
}

#[derive(Clone, Copy, PartialEq)]
enum Op {
    Union,
    Inter,
    Diff,
}

#[derive(Clone, Copy)]
enum Aggregate {
    Sum,
    Min,
    Max,
}

impl Aggregate {
    fn apply(self, acc: f64, value: f64) -> f64 {
        match self {
            Aggregate::Sum => {
                let sum = acc + value;
                if sum.is_nan() {
                    0.0
                } else {
                    sum
                }
            }
            Aggregate::Min => acc.min(value),
            Aggregate::Max => acc.max(value),
        }
    }
}

/// A weighted score: NaN (`inf * 0`) counts as 0, as in Redis.
fn weighted(score: f64, weight: f64) -> f64 {
    let w = score * weight;
    if w.is_nan() {
        0.0
    } else {
        w
    }
}

/// Sorts a result as a sorted set orders it: by score, then member bytes.
fn in_score_order(map: BTreeMap<Vec<u8>, f64>) -> Items {
    let mut items: Items = map.into_iter().collect();
    // Not `total_cmp`: it orders -0 before 0, which Redis holds equal (ties by member).
    // Scores are never NaN here (`weighted`, `Aggregate::apply`).
    items.sort_by(|a, b| {
        a.1.partial_cmp(&b.1)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then_with(|| a.0.cmp(&b.0))
    });
    items
}

/// The parsed request of ZUNION, ZINTER, ZDIFF and their STORE forms.
struct Request<'a> {
    keys: &'a [Vec<u8>],
    weights: Vec<f64>,
    aggregate: Aggregate,
    with_scores: bool,
}

/// Reads `numkeys key... [WEIGHTS w...] [AGGREGATE SUM|MIN|MAX] [WITHSCORES]` from
/// `args` (starting at the count), and the inputs, in Redis's order of checks: the count,
/// the inputs' types, then the options.
fn parse<'a>(
    kv: &mut dyn Kv,
    args: &'a [Vec<u8>],
    op: Op,
    store: bool,
    command: &str,
) -> tucana::Result<Result<(Request<'a>, Vec<Items>), Reply>> {
    let Some(n) = parse_i64(&args[0]) else {
        return Ok(Err(not_an_integer()));
    };
    if n < 1 {
        return Ok(Err(Reply::error(format!(
            "ERR at least 1 input key is needed for '{command}' command"
        ))));
    }
    if n as u64 > (args.len() - 1) as u64 {
        return Ok(Err(syntax_error()));
    }
    let n = n as usize;
    let keys = &args[1..=n];
    let mut inputs = Vec::with_capacity(n);
    for key in keys {
        match scored_members(kv, key)? {
            Ok(items) => inputs.push(items),
            Err(reply) => return Ok(Err(reply)),
        }
    }
    let mut req = Request {
        keys,
        weights: vec![1.0; n],
        aggregate: Aggregate::Sum,
        with_scores: false,
    };
    let mut i = n + 1;
    while i < args.len() {
        let remaining = args.len() - i;
        let word = args[i].to_ascii_uppercase();
        match word.as_slice() {
            b"WEIGHTS" if op != Op::Diff && remaining > n => {
                for (w, arg) in req.weights.iter_mut().zip(&args[i + 1..=i + n]) {
                    match parse_double(arg) {
                        Some(d) => *w = d,
                        None => return Ok(Err(Reply::error("ERR weight value is not a float"))),
                    }
                }
                i += n + 1;
            }
            b"AGGREGATE" if op != Op::Diff && remaining >= 2 => {
                req.aggregate = match args[i + 1].to_ascii_uppercase().as_slice() {
                    b"SUM" => Aggregate::Sum,
                    b"MIN" => Aggregate::Min,
                    b"MAX" => Aggregate::Max,
                    _ => return Ok(Err(syntax_error())),
                };
                i += 2;
            }
            b"WITHSCORES" if !store => {
                req.with_scores = true;
                i += 1;
            }
            _ => return Ok(Err(syntax_error())),
        }
    }
    Ok(Ok((req, inputs)))
}

/// The result of `op` over the inputs, in score order.
fn combine(req: &Request<'_>, inputs: Vec<Items>, op: Op) -> Items {
    let mut result = BTreeMap::new();
    // Redis walks the inputs smallest first (not for ZDIFF), which decides the order of
    // a sum's additions.
    let mut order: Vec<usize> = (0..inputs.len()).collect();
    if op != Op::Diff {
        order.sort_by_key(|&i| inputs[i].len());
    }
    match op {
        Op::Union => {
            for &i in &order {
                for (m, s) in &inputs[i] {
                    let score = weighted(*s, req.weights[i]);
                    result
                        .entry(m.clone())
                        .and_modify(|acc: &mut f64| *acc = req.aggregate.apply(*acc, score))
                        .or_insert(score);
                }
            }
        }
        Op::Inter => {
            let others: Vec<BTreeMap<&[u8], f64>> = order[1..]
                .iter()
                .map(|&i| inputs[i].iter().map(|(m, s)| (m.as_slice(), *s)).collect())
                .collect();
            let first = order[0];
            'members: for (m, s) in &inputs[first] {
                let mut score = weighted(*s, req.weights[first]);
                for (set, &i) in others.iter().zip(&order[1..]) {
                    match set.get(m.as_slice()) {
                        Some(&other) => {
                            score = req.aggregate.apply(score, weighted(other, req.weights[i]))
                        }
                        None => continue 'members,
                    }
                }
                result.insert(m.clone(), score);
            }
        }
        Op::Diff => {
            let others: Vec<&[u8]> = inputs[1..]
                .iter()
                .flatten()
                .map(|(m, _)| m.as_slice())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            for (m, s) in &inputs[0] {
                if others.binary_search(&m.as_slice()).is_err() {
                    result.insert(m.clone(), *s);
                }
            }
        }
    }
    in_score_order(result)
}

/// ZUNION, ZINTER, ZDIFF: `numkeys key... [options]`.
fn combine_command(kv: &mut dyn Kv, args: &[Vec<u8>], op: Op, name: &str) -> tucana::Result<Reply> {
    let (req, inputs) = match parse(kv, &args[1..], op, false, name)? {
        Ok(parsed) => parsed,
        Err(reply) => return Ok(reply),
    };
    debug_assert_eq!(req.keys.len(), inputs.len());
    let items = combine(&req, inputs, op);
    Ok(range_reply(items, req.with_scores))
}

/// Replaces `dst` with a sorted set of `items` (deleted when empty); the reply is its size.
/// `event`: the command's name, its keyspace notification.
fn store(kv: &mut dyn Kv, dst: &[u8], items: &Items, event: &'static str) -> tucana::Result<Reply> {
    let mut update = Update::replace(kv, dst, ZSET)?;
    for (m, s) in items {
        put_member(&mut update, m, *s, None);
    }
    update.apply_store(kv, event)?;
    Ok(Reply::Int(items.len() as i64))
}

/// ZUNIONSTORE, ZINTERSTORE, ZDIFFSTORE: `destination numkeys key... [options]`.
fn store_command(
    kv: &mut dyn Kv,
    args: &[Vec<u8>],
    op: Op,
    name: &'static str,
) -> tucana::Result<Reply> {
    let (req, inputs) = match parse(kv, &args[2..], op, true, name)? {
        Ok(parsed) => parsed,
        Err(reply) => return Ok(reply),
    };
    let items = combine(&req, inputs, op);
    store(kv, &args[1], &items, name)
}

pub(super) fn cmd_zunion(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    combine_command(kv, args, Op::Union, "zunion")
}

pub(super) fn cmd_zinter(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    combine_command(kv, args, Op::Inter, "zinter")
}

pub(super) fn cmd_zdiff(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    combine_command(kv, args, Op::Diff, "zdiff")
}

pub(super) fn cmd_zunionstore(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    store_command(kv, args, Op::Union, "zunionstore")
}

pub(super) fn cmd_zinterstore(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    store_command(kv, args, Op::Inter, "zinterstore")
}

pub(super) fn cmd_zdiffstore(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    store_command(kv, args, Op::Diff, "zdiffstore")
}

/// The `numkeys key... [LIMIT n]` of SINTERCARD and ZINTERCARD: the keys and the limit
/// (0: none), or the reply Redis gives a bad request (ZINTERCARD checks its key count as
/// ZINTER does, SINTERCARD as the other commands with a count of keys).
pub(super) fn card_request(args: &[Vec<u8>], zset: bool) -> Result<(&[Vec<u8>], usize), Reply> {
    let numkeys = if zset {
        let n = parse_i64(&args[1]).ok_or_else(not_an_integer)?;
        if n < 1 {
            return Err(Reply::error(
                "ERR at least 1 input key is needed for 'zintercard' command",
            ));
        }
        if n as u64 > (args.len() - 2) as u64 {
            return Err(syntax_error());
        }
        n
    } else {
        let n = parse_i64(&args[1])
            .filter(|&n| n >= 1)
            .ok_or_else(|| Reply::error("ERR numkeys should be greater than 0"))?;
        if n as u64 > (args.len() - 2) as u64 {
            return Err(Reply::error(
                "ERR Number of keys can't be greater than number of args",
            ));
        }
        n
    };
    let n = numkeys as usize;
    let mut limit = 0;
    let mut i = 2 + n;
    while i < args.len() {
        if args[i].eq_ignore_ascii_case(b"LIMIT") && i + 1 < args.len() {
            limit = parse_i64(&args[i + 1])
                .filter(|&l| l >= 0)
                .ok_or_else(|| Reply::error("ERR LIMIT can't be negative"))?
                as usize;
            i += 2;
        } else {
            return Err(syntax_error());
        }
    }
    Ok((&args[2..2 + n], limit))
}

/// `ZINTERCARD numkeys key... [LIMIT n]`: the size of the intersection (at most `n`).
pub(super) fn cmd_zintercard(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let (keys, limit) = match card_request(args, true) {
        Ok(r) => r,
        Err(reply) => return Ok(reply),
    };
    let mut inputs = Vec::with_capacity(keys.len());
    for key in keys {
        match scored_members(kv, key)? {
            Ok(items) => inputs.push(items),
            Err(reply) => return Ok(reply),
        }
    }
    let req = Request {
        keys,
        weights: vec![1.0; keys.len()],
        aggregate: Aggregate::Sum,
        with_scores: false,
    };
    let n = combine(&req, inputs, Op::Inter).len();
    Ok(Reply::Int(if limit > 0 { n.min(limit) } else { n } as i64))
}

/// `ZRANGESTORE dst src min max [BYSCORE|BYLEX] [REV] [LIMIT offset count]`: ZRANGE's
/// answer stored at `dst` (deleted when empty); its size.
pub(super) fn cmd_zrangestore(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let req = match range_request(&args[5..], request(By::Rank, false), false) {
        Ok(r) if r.with_scores => return Ok(syntax_error()),
        Ok(r) => r,
        Err(reply) => return Ok(reply),
    };
    let items = match run_range(kv, &args[2], &args[3], &args[4], &req)? {
        Ok(items) => items,
        Err(reply) => return Ok(reply),
    };
    store(kv, &args[1], &items, "zrangestore")
}

/// `ZRANDMEMBER key [count [WITHSCORES]]`, as HRANDFIELD picks (`collection`).
pub(super) fn cmd_zrandmember(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let with_scores = match args.get(3) {
        None => false,
        Some(w) if w.eq_ignore_ascii_case(b"WITHSCORES") && args.len() == 4 => true,
        Some(_) => return Ok(syntax_error()),
    };
    let count = match args.get(2).map(|n| random_count(n, with_scores)) {
        None => None,
        Some(Ok(n)) => Some(n),
        Some(Err(reply)) => return Ok(reply),
    };
    let missing = if count.is_some() {
        Reply::Array(Vec::new())
    } else {
        Reply::Nil
    };
    let (_, meta) = open_or!(kv, &args[1], ZSET, missing);
    let picks = random_members(kv, Family::ZMember, &args[1], &meta, count)?;
    let Some(_) = count else {
        return Ok(picks
            .into_iter()
            .next()
            .map_or(Reply::Nil, |(m, _)| Reply::Bulk(m)));
    };
    let mut items = Vec::with_capacity(picks.len());
    for (m, s) in picks {
        items.push((m, decode_score(&s)?));
    }
    Ok(range_reply(items, with_scores))
}
