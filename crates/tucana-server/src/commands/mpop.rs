//! The pops over several keys: LMPOP and ZMPOP, which pop from the first of their keys
//! that is not empty and answer `[key, popped]` (a null array when every key is empty).
//!
//! Owns their request (`numkeys key... LEFT|RIGHT|MIN|MAX [COUNT n]`, with Redis 7.0's
//! replies to bad ones) and [`pop_first`], the one non-blocking step the blocking pops
//! (BLPOP, BZPOPMIN, ...) also take. The pops themselves are `lists`' and `zsets`' (one
//! batch per pop).
//!
//! Thread-safety: plain functions on the store a handler is given.

use crate::resp::Reply;
use crate::types::Kind;

use super::collection::{double_reply, open, Update};
use super::kv::Kv;
use super::lists::{pop_from, LIST};
use super::zsets::{by_rank, delete_member, ZSET};
use super::{parse_i64, syntax_error};

/// Which end to pop from: lists' LEFT (head) or RIGHT, sorted sets' MIN or MAX.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum End {
    Left,
    Right,
    Min,
    Max,
}

impl End {
    fn kind(self) -> Kind {
        match self {
            End::Left | End::Right => LIST,
            End::Min | End::Max => ZSET,
        }
    }
}

/// What one pop took: the key and the elements (lists) or members with scores (sorted
/// sets), in pop order.
pub(super) enum Popped {
    List(Vec<u8>, Vec<Vec<u8>>),
    ZSet(Vec<u8>, Vec<(Vec<u8>, f64)>),
}

impl Popped {
    /// LMPOP's and ZMPOP's answer: `[key, [element...]]` or `[key, [[member, score]...]]`.
    pub(super) fn mpop_reply(self) -> Reply {
        match self {
            Popped::List(key, elements) => Reply::Array(vec![
                Reply::Bulk(key),
                Reply::Array(elements.into_iter().map(Reply::Bulk).collect()),
            ]),
            Popped::ZSet(key, items) => Reply::Array(vec![
                Reply::Bulk(key),
                Reply::Array(
                    items
                        .into_iter()
                        .map(|(m, s)| Reply::Array(vec![Reply::Bulk(m), double_reply(s)]))
                        .collect(),
                ),
            ]),
        }
    }
}

/// Pops up to `count` from `end` of the first of `keys` that exists (`Ok(None)`: none
/// does). A first existing key of another type is WRONGTYPE (later keys are not
/// looked at, as in Redis).
pub(super) fn pop_first(
    kv: &mut dyn Kv,
    keys: &[Vec<u8>],
    end: End,
    count: usize,
) -> tucana::Result<Result<Option<Popped>, Reply>> {
    for key in keys {
        let opened = match open(kv, key, end.kind())? {
            Ok(o) => o,
            Err(reply) => return Ok(Err(reply)),
        };
        let Some(meta) = opened.meta else {
            continue;
        };
        let mut update = Update::new(key, opened, end.kind());
        let popped = match end {
            End::Left | End::Right => {
                let elements = pop_from(kv, key, &mut update, count, end == End::Left)?;
                Popped::List(key.clone(), elements)
            }
            End::Min | End::Max => {
                let items = by_rank(kv, key, meta.version, 0, count, end == End::Max)?;
                for (m, s) in &items {
                    delete_member(&mut update, m, *s);
                }
                Popped::ZSet(key.clone(), items)
            }
        };
        let event = match end {
            End::Left => "lpop",
            End::Right => "rpop",
            End::Min => "zpopmin",
            End::Max => "zpopmax",
        };
        update.apply(kv, event)?;
        return Ok(Ok(Some(popped)));
    }
    Ok(Ok(None))
}

/// A count that must be at least 1 (`numkeys`, `COUNT`), with Redis's reply otherwise.
fn positive(arg: &[u8], what: &str) -> Result<usize, Reply> {
    parse_i64(arg)
        .filter(|&n| n >= 1)
        .map(|n| n as usize)
        .ok_or_else(|| Reply::error(format!("ERR {what} should be greater than 0")))
}

/// `numkeys key... end [COUNT n]` from `args` (starting at the count): the keys, the
/// end, and the count (1 by default). `lists` picks LEFT|RIGHT, else MIN|MAX.
pub(super) fn mpop_request(
    args: &[Vec<u8>],
    lists: bool,
) -> Result<(&[Vec<u8>], End, usize), Reply> {
    let n = positive(&args[0], "numkeys")?;
    let end_at = n + 1;
    let Some(end) = args.get(end_at) else {
        return Err(syntax_error());
    };
    let end = match (lists, end.to_ascii_uppercase().as_slice()) {
        (true, b"LEFT") => End::Left,
        (true, b"RIGHT") => End::Right,
        (false, b"MIN") => End::Min,
        (false, b"MAX") => End::Max,
        _ => return Err(syntax_error()),
    };
    let mut count = None;
    let mut i = end_at + 1;
    while i < args.len() {
        if count.is_none() && args[i].eq_ignore_ascii_case(b"COUNT") && i + 1 < args.len() {
            count = Some(positive(&args[i + 1], "count")?);
            i += 2;
        } else {
            return Err(syntax_error());
        }
    }
    Ok((&args[1..=n], end, count.unwrap_or(1)))
}

/// LMPOP/ZMPOP from their arguments after the command's name (`args[0]` is skipped).
pub(super) fn mpop(kv: &mut dyn Kv, args: &[Vec<u8>], lists: bool) -> tucana::Result<Reply> {
    let (keys, end, count) = match mpop_request(&args[1..], lists) {
        Ok(r) => r,
        Err(reply) => return Ok(reply),
    };
    Ok(match pop_first(kv, keys, end, count)? {
        Ok(Some(popped)) => popped.mpop_reply(),
        Ok(None) => Reply::NilArray,
        Err(reply) => reply,
    })
}

/// `LMPOP numkeys key... LEFT|RIGHT [COUNT n]`
pub(super) fn cmd_lmpop(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    mpop(kv, args, true)
}

/// `ZMPOP numkeys key... MIN|MAX [COUNT n]`
pub(super) fn cmd_zmpop(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    mpop(kv, args, false)
}
