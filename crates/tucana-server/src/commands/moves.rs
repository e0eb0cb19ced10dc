//! Commands that move or copy a whole key, whatever its type: RENAME, RENAMENX, COPY,
//! and TOUCH (which only looks).
//!
//! Owns what moves with a key: a string's value or a packed hash's (`types::packed`),
//! or a collection's metadata and every sub-record (rewritten under the new key with a fresh version, since a sub-record's key
//! names its collection's key, `types`), and its deadline. The source's removal, the
//! destination's old value (a small collection's members with it, a big one's left to
//! the collector) and the new records are one `Kv::apply`, so a crash keeps the key at
//! one place or the other, never both nor neither. In cluster mode both keys are in one
//! hash slot (`routing` answers `CROSSSLOT` otherwise). It owns no locks: the store a
//! handler is given does.
//!
//! Cost: moving a collection is O(its members) records written (Redis's RENAME is O(1)).
//!
//! Thread-safety: plain functions; they run on whichever thread runs the batch.

use crate::expiry::now_ms;
use crate::resp::Reply;
use crate::types::{is_typed, sub_key, Family, Meta};

use super::collection::{all_members, delete_members};
use super::expire::{read_stored, Stored, Writes};
use super::kv::Kv;
use super::syntax_error;

/// The writes that put `src`'s live `value` (with deadline `deadline_ms`) at `dst`,
/// replacing what `dst` holds (`dst_stored`).
fn copy_writes(
    kv: &mut dyn Kv,
    src: &[u8],
    value: &[u8],
    deadline_ms: Option<u64>,
    dst: &[u8],
    dst_stored: &Stored,
) -> tucana::Result<Writes> {
    let mut writes = Writes::default();
    if let Some(old) = dst_stored.value.as_deref().filter(|v| is_typed(v)) {
        delete_members(kv, dst, old, &mut writes)?;
    }
    let new_value = if crate::types::packed::is_packed(value) {
        // A packed hash has no sub-records and its value names no key: it moves as is.
        crate::types::packed::parse(value)?;
        value.to_vec()
    } else if is_typed(value) {
        let meta = Meta::decode(value)?;
        let copy = Meta {
            version: crate::types::next_version(),
            ..meta
        };
        for &family in Family::of(meta.kind) {
            for (suffix, member) in all_members(kv, family, src, meta.version)? {
                writes.reserved(sub_key(family, dst, copy.version, &suffix), Some(member));
            }
        }
        copy.encode()
    } else {
        value.to_vec()
    };
    writes.put(dst, new_value, dst_stored.stored_deadline_ms, deadline_ms);
    Ok(writes)
}

/// RENAME (`nx`: RENAMENX): moves `src` to `dst`, replacing `dst` unless `nx`.
fn rename(kv: &mut dyn Kv, args: &[Vec<u8>], nx: bool) -> tucana::Result<Reply> {
    let (src, dst) = (&args[1], &args[2]);
    let now = now_ms();
    let source = read_stored(kv, src, now)?;
    let Some(value) = source.value.as_deref() else {
        return Ok(Reply::error("ERR no such key"));
    };
    if src == dst {
        return Ok(if nx { Reply::Int(0) } else { Reply::Ok });
    }
    let target = read_stored(kv, dst, now)?;
    if nx && target.value.is_some() {
        return Ok(Reply::Int(0));
    }
    let mut writes = copy_writes(kv, src, value, source.deadline_ms(), dst, &target)?;
    if is_typed(value) {
        delete_members(kv, src, value, &mut writes)?;
    }
    writes.delete(src, source.stored_deadline_ms);
    writes.apply(kv)?;
    // Redis's events: the destination is added anew (`new`, even over an old key,
    // which Redis deletes first), then `rename_from` and `rename_to`.
    kv.notify(crate::notify::NEW, "new", dst);
    kv.notify(crate::notify::GENERIC, "rename_from", src);
    kv.notify(crate::notify::GENERIC, "rename_to", dst);
    Ok(if nx { Reply::Int(1) } else { Reply::Ok })
}

/// `RENAME src dst`
pub(super) fn cmd_rename(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    rename(kv, args, false)
}

/// `RENAMENX src dst`
pub(super) fn cmd_renamenx(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    rename(kv, args, true)
}

/// `COPY src dst [DB n] [REPLACE]`: 1 when copied, 0 when `src` is missing or `dst`
/// exists without `REPLACE`. `DB` is refused: a copy stays in the selected database
/// (each database is its own keyspace with its own write lock, and a handler holds one).
pub(super) fn cmd_copy(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let (src, dst) = (&args[1], &args[2]);
    let mut replace = false;
    let mut i = 3;
    while i < args.len() {
        match args[i].to_ascii_uppercase().as_slice() {
            b"REPLACE" => replace = true,
            b"DB" if i + 1 < args.len() => {
                if super::parse_i64(&args[i + 1]).is_none() {
                    return Ok(super::not_an_integer());
                }
                return Ok(Reply::error(
                    "ERR COPY's DB option is not supported: a copy stays in the selected database",
                ));
            }
            _ => return Ok(syntax_error()),
        }
        i += 1;
    }
    if src == dst {
        return Ok(Reply::error(
            "ERR source and destination objects are the same",
        ));
    }
    let now = now_ms();
    let source = read_stored(kv, src, now)?;
    let Some(value) = source.value.as_deref() else {
        return Ok(Reply::Int(0));
    };
    let target = read_stored(kv, dst, now)?;
    if target.value.is_some() && !replace {
        return Ok(Reply::Int(0));
    }
    copy_writes(kv, src, value, source.deadline_ms(), dst, &target)?.apply(kv)?;
    kv.notify(crate::notify::NEW, "new", dst);
    kv.notify(crate::notify::GENERIC, "copy_to", dst);
    Ok(Reply::Int(1))
}

/// `TOUCH key...`: how many of the keys exist (a key given twice counts twice). Tucana
/// keeps no access times, so touching changes nothing.
pub(super) fn cmd_touch(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let now = now_ms();
    let mut n = 0;
    for key in &args[1..] {
        if read_stored(kv, key, now)?.value.is_some() {
            n += 1;
        }
    }
    Ok(Reply::Int(n))
}
