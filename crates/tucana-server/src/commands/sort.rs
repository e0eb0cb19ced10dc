//! SORT and SORT_RO: the elements of a list, set or sorted set, sorted as numbers or
//! (ALPHA) as bytes, optionally by weights read from other keys (`BY pattern`), cut by
//! `LIMIT`, answered as themselves or as values read from other keys (`GET pattern`),
//! and stored as a list (`STORE`, SORT only).
//!
//! Owns the options, the pattern lookups (`*` is replaced by the element; `key->field`
//! reads a hash field; `#` is the element itself) and the order, which is Redis's:
//! numeric ties are broken by the elements' bytes, missing weights sort first with
//! ALPHA and count as 0 without, a `BY` pattern without `*` leaves the elements in
//! their stored order (list order, sets by member, sorted sets by score), which DESC
//! reverses. It owns no
//! locks: SORT runs as a write (under the database's write lock, `STORE` is one batch
//! with the old destination's removal), SORT_RO as a read.
//!
//! In cluster mode `BY`, `GET` and `STORE` are refused: the keys they name may live in
//! other slots.
//!
//! Cost: O(n log n) for n elements, plus one lookup per element and pattern.
//!
//! Thread-safety: plain functions; they run on whichever thread runs the batch.

use std::cmp::Ordering;

use crate::expiry::now_ms;
use crate::resp::Reply;
use crate::types::{is_typed, sub_key, Family, Kind, Meta};

use super::collection::{all_members, parse_double, wrongtype, Update};
use super::expire::read_stored;
use super::kv::Kv;
use super::{not_an_integer, parse_i64, syntax_error};

/// SORT's options.
#[derive(Default)]
struct Options {
    by: Option<Vec<u8>>,
    limit: Option<(i64, i64)>,
    get: Vec<Vec<u8>>,
    desc: bool,
    alpha: bool,
    store: Option<Vec<u8>>,
}

fn options(args: &[Vec<u8>], may_store: bool) -> Result<Options, Reply> {
    let mut o = Options::default();
    let mut i = 2;
    while i < args.len() {
        let next = args.get(i + 1);
        match (args[i].to_ascii_uppercase().as_slice(), next) {
            (b"ASC", _) => o.desc = false,
            (b"DESC", _) => o.desc = true,
            (b"ALPHA", _) => o.alpha = true,
            (b"LIMIT", Some(offset)) if i + 2 < args.len() => {
                match (parse_i64(offset), parse_i64(&args[i + 2])) {
                    (Some(offset), Some(count)) => o.limit = Some((offset, count)),
                    _ => return Err(not_an_integer()),
                }
                i += 2;
            }
            (b"BY", Some(pattern)) => {
                o.by = Some(pattern.clone());
                i += 1;
            }
            (b"GET", Some(pattern)) => {
                o.get.push(pattern.clone());
                i += 1;
            }
            (b"STORE", Some(dst)) if may_store => {
                o.store = Some(dst.clone());
                i += 1;
            }
            _ => return Err(syntax_error()),
        }
        i += 1;
    }
    Ok(o)
}

/// The elements of `key` in stored order; `Err`: WRONGTYPE.
fn elements(kv: &mut dyn Kv, key: &[u8]) -> tucana::Result<Result<Vec<Vec<u8>>, Reply>> {
    let Some(value) = read_stored(kv, key, now_ms())?.value else {
        return Ok(Ok(Vec::new()));
    };
    if !is_typed(&value) {
        return Ok(Err(wrongtype()));
    }
    let meta = Meta::decode(&value)?;
    Ok(Ok(match meta.kind {
        Kind::List => all_members(kv, Family::List, key, meta.version)?
            .into_iter()
            .map(|(_, element)| element)
            .collect(),
        Kind::Set => all_members(kv, Family::Set, key, meta.version)?
            .into_iter()
            .map(|(member, _)| member)
            .collect(),
        // By score: the score index's suffix is the ordered score, then the member.
        Kind::ZSet => all_members(kv, Family::ZScore, key, meta.version)?
            .into_iter()
            .map(|(suffix, _)| suffix.get(8..).unwrap_or_default().to_vec())
            .collect(),
        Kind::Hash => return Ok(Err(wrongtype())),
    }))
}

/// What `pattern` names for `element`: `#` the element; else the string at the key the
/// pattern makes (its first `*` replaced), or with `->field` that hash's field. `None`
/// when the key is missing or of another type, or the pattern has no `*`.
fn lookup(kv: &mut dyn Kv, pattern: &[u8], element: &[u8]) -> tucana::Result<Option<Vec<u8>>> {
    if pattern == b"#" {
        return Ok(Some(element.to_vec()));
    }
    let Some(star) = pattern.iter().position(|&b| b == b'*') else {
        return Ok(None);
    };
    let arrow = pattern[star..]
        .windows(2)
        .position(|w| w == b"->")
        .map(|p| p + star)
        .filter(|&p| p + 2 < pattern.len());
    let key_end = arrow.unwrap_or(pattern.len());
    let key = [&pattern[..star], element, &pattern[star + 1..key_end]].concat();
    let Some(value) = read_stored(kv, &key, now_ms())?.value else {
        return Ok(None);
    };
    match arrow {
        None => Ok((!is_typed(&value)).then_some(value)),
        Some(arrow) => {
            let Ok(meta) = Meta::decode(&value) else {
                return Ok(None);
            };
            if meta.kind != Kind::Hash {
                return Ok(None);
            }
            let field = &pattern[arrow + 2..];
            if meta.packed {
                let entries = crate::types::packed::parse(&value)?;
                return Ok(entries
                    .into_iter()
                    .find(|(f, _)| *f == field)
                    .map(|(_, v)| v.to_vec()));
            }
            kv.get(&sub_key(Family::Hash, &key, meta.version, field))
        }
    }
}

fn sort(kv: &mut dyn Kv, args: &[Vec<u8>], may_store: bool) -> tucana::Result<Reply> {
    let o = match options(args, may_store) {
        Ok(o) => o,
        Err(reply) => return Ok(reply),
    };
    if kv.hash_slot().is_some() && (o.by.is_some() || !o.get.is_empty() || o.store.is_some()) {
        return Ok(Reply::error(
            "ERR SORT's BY, GET and STORE options are not supported in cluster mode",
        ));
    }
    let mut items = match elements(kv, &args[1])? {
        Ok(found) => found,
        Err(reply) => return Ok(reply),
    };
    let dont_sort = o.by.as_ref().is_some_and(|p| !p.contains(&b'*'));
    if dont_sort && o.desc {
        // Left unsorted, the stored order is read from its end (as Redis reads a list or
        // a sorted set; a set's byte order is the ALPHA order Redis gives a set then).
        items.reverse();
    } else if !dont_sort {
        // Each element with what it sorts by: bytes (ALPHA) or a number.
        let mut keyed = Vec::with_capacity(items.len());
        for item in items {
            let weight = match &o.by {
                Some(pattern) => lookup(kv, pattern, &item)?,
                None => Some(item.clone()),
            };
            let score = if o.alpha {
                0.0
            } else {
                match weight.as_deref() {
                    None => 0.0,
                    Some(w) => match parse_double(w) {
                        Some(d) => d,
                        None => {
                            return Ok(Reply::error(
                                "ERR One or more scores can't be converted into double",
                            ))
                        }
                    },
                }
            };
            keyed.push((item, weight, score));
        }
        keyed.sort_by(|a, b| {
            let cmp = if o.alpha {
                // Missing weights first; equal weights keep no further order.
                a.1.cmp(&b.1)
            } else {
                a.2.partial_cmp(&b.2)
                    .unwrap_or(Ordering::Equal)
                    .then_with(|| a.0.cmp(&b.0))
            };
            if o.desc {
                cmp.reverse()
            } else {
                cmp
            }
        });
        items = keyed.into_iter().map(|(item, _, _)| item).collect();
    }
    if let Some((offset, count)) = o.limit {
        let start = usize::try_from(offset).unwrap_or(0).min(items.len());
        let end = match usize::try_from(count) {
            Ok(count) => start.saturating_add(count).min(items.len()),
            Err(_) => items.len(),
        };
        items = items.drain(start..end).collect();
    }
    let mut out: Vec<Option<Vec<u8>>> = Vec::new();
    for item in items {
        if o.get.is_empty() {
            out.push(Some(item));
        } else {
            for pattern in &o.get {
                out.push(lookup(kv, pattern, &item)?);
            }
        }
    }
    let Some(dst) = o.store else {
        return Ok(Reply::Array(
            out.into_iter()
                .map(|v| v.map_or(Reply::Nil, Reply::Bulk))
                .collect(),
        ));
    };
    // The result replaces the destination as a list (an empty result deletes it).
    let mut update = Update::replace(kv, &dst, Kind::List)?;
    let head = update.meta.head;
    for (i, value) in out.iter().enumerate() {
        let index = (head + i as u64).to_be_bytes();
        update.put(Family::List, &index, value.clone().unwrap_or_default());
    }
    update.meta.count = out.len() as u64;
    update.meta.tail = head + out.len() as u64;
    update.apply_store(kv, "sortstore")?;
    Ok(Reply::Int(out.len() as i64))
}

/// `SORT key [BY pattern] [LIMIT offset count] [GET pattern ...] [ASC|DESC] [ALPHA]
/// [STORE destination]`
pub(super) fn cmd_sort(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    sort(kv, args, true)
}

/// `SORT_RO key ...`: SORT without STORE.
pub(super) fn cmd_sort_ro(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    sort(kv, args, false)
}
