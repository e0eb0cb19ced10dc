//! The string commands (GET, SET, MGET, MSET, INCR, APPEND, DEL, ...), each written once
//! against [`Kv`] so that it runs the same on the keyspace, under the write lock or
//! inside `EXEC`.
//!
//! Owns the commands' semantics (options, arithmetic, replies). A handler writes
//! with one `Kv::apply` (or `put`) after its reads, as its last step, so a command that
//! fails leaves no partial writes in an `EXEC` overlay. It owns no locks or engine
//! handles: the store it is given does.
//!
//! Thread-safety: handlers are plain functions; they run on whichever thread runs the
//! batch.

use crate::resp::Reply;

use super::kv::{Kv, Ops};
use super::{not_an_integer, opt_bulk, parse_i64, syntax_error, wrong_args};

pub(super) fn cmd_get(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    Ok(opt_bulk(kv.get(&args[1])?))
}

pub(super) fn cmd_mget(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let values = kv.multi_get(&args[1..])?;
    Ok(Reply::Array(values.into_iter().map(opt_bulk).collect()))
}

pub(super) fn cmd_exists(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let mut n = 0;
    for key in &args[1..] {
        if kv.value_len(key)?.is_some() {
            n += 1;
        }
    }
    Ok(Reply::Int(n))
}

pub(super) fn cmd_strlen(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    Ok(Reply::Int(kv.value_len(&args[1])?.unwrap_or(0) as i64))
}

pub(super) fn cmd_type(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let exists = kv.value_len(&args[1])?.is_some();
    Ok(Reply::Status(if exists { "string" } else { "none" }.into()))
}

/// No expiry: -1 for a key that exists (no TTL), -2 for one that does not.
pub(super) fn cmd_ttl(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let exists = kv.value_len(&args[1])?.is_some();
    Ok(Reply::Int(if exists { -1 } else { -2 }))
}

const NO_EXPIRY: &str =
    "ERR expiry is not supported: tucana keeps a key until it is deleted (EX, PX, EXAT, PXAT)";

pub(super) fn cmd_set(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let (key, value) = (&args[1], &args[2]);
    let (mut nx, mut xx, mut get) = (false, false, false);
    for opt in &args[3..] {
        match opt.to_ascii_uppercase().as_slice() {
            b"NX" if !xx => nx = true,
            b"XX" if !nx => xx = true,
            b"GET" => get = true,
            // Keeping the TTL of a key without one changes nothing.
            b"KEEPTTL" => {}
            b"EX" | b"PX" | b"EXAT" | b"PXAT" => return Ok(Reply::error(NO_EXPIRY)),
            _ => return Ok(syntax_error()),
        }
    }
    let old = if nx || xx || get { kv.get(key)? } else { None };
    let exists = old.is_some();
    let apply = !(nx && exists || xx && !exists);
    if apply {
        kv.put(key, value.clone())?;
    }
    Ok(match (get, apply) {
        (true, _) => opt_bulk(old),
        (false, true) => Reply::Ok,
        (false, false) => Reply::Nil,
    })
}

pub(super) fn cmd_setnx(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    if kv.value_len(&args[1])?.is_some() {
        return Ok(Reply::Int(0));
    }
    kv.put(&args[1], args[2].clone())?;
    Ok(Reply::Int(1))
}

pub(super) fn cmd_getset(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let old = kv.get(&args[1])?;
    kv.put(&args[1], args[2].clone())?;
    Ok(opt_bulk(old))
}

pub(super) fn cmd_getdel(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let old = kv.get(&args[1])?;
    if old.is_some() {
        kv.apply(vec![(args[1].clone(), None)])?;
    }
    Ok(opt_bulk(old))
}

fn pairs(args: &[Vec<u8>]) -> Option<Ops> {
    let rest = &args[1..];
    if !rest.len().is_multiple_of(2) {
        return None;
    }
    Some(
        rest.chunks(2)
            .map(|kv| (kv[0].clone(), Some(kv[1].clone())))
            .collect(),
    )
}

pub(super) fn cmd_mset(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let Some(ops) = pairs(args) else {
        return Ok(wrong_args("mset"));
    };
    kv.apply(ops)?;
    Ok(Reply::Ok)
}

pub(super) fn cmd_msetnx(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let Some(ops) = pairs(args) else {
        return Ok(wrong_args("msetnx"));
    };
    for (key, _) in &ops {
        if kv.value_len(key)?.is_some() {
            return Ok(Reply::Int(0));
        }
    }
    kv.apply(ops)?;
    Ok(Reply::Int(1))
}

pub(super) fn cmd_del(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let mut ops: Ops = Vec::new();
    for key in &args[1..] {
        if !ops.iter().any(|(k, _)| k == key) && kv.value_len(key)?.is_some() {
            ops.push((key.clone(), None));
        }
    }
    let n = ops.len() as i64;
    kv.apply(ops)?;
    Ok(Reply::Int(n))
}

pub(super) fn cmd_append(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let mut value = kv.get(&args[1])?.unwrap_or_default();
    value.extend_from_slice(&args[2]);
    let len = value.len() as i64;
    kv.put(&args[1], value)?;
    Ok(Reply::Int(len))
}

fn incr_by(kv: &mut dyn Kv, key: &[u8], delta: i64) -> tucana::Result<Reply> {
    let current = match kv.get(key)? {
        None => 0,
        Some(v) => match parse_i64(&v) {
            Some(n) => n,
            None => return Ok(not_an_integer()),
        },
    };
    let Some(next) = current.checked_add(delta) else {
        return Ok(Reply::error("ERR increment or decrement would overflow"));
    };
    kv.put(key, next.to_string().into_bytes())?;
    Ok(Reply::Int(next))
}

pub(super) fn cmd_incr(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    incr_by(kv, &args[1], 1)
}

pub(super) fn cmd_decr(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    incr_by(kv, &args[1], -1)
}

pub(super) fn cmd_incrby(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    match parse_i64(&args[2]) {
        Some(delta) => incr_by(kv, &args[1], delta),
        None => Ok(not_an_integer()),
    }
}

pub(super) fn cmd_decrby(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    match parse_i64(&args[2]).and_then(i64::checked_neg) {
        Some(delta) => incr_by(kv, &args[1], delta),
        None => Ok(not_an_integer()),
    }
}
