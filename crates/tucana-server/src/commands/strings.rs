//! The string commands (GET, SET, SETEX, GETEX, MGET, MSET, INCR, APPEND, DEL, ...), each
//! written once against [`Kv`] so that it runs the same on the keyspace, under the write
//! lock or inside `EXEC`. Every read hides expired keys and every write keeps the key's
//! deadline in step (`expire`): SET, GETSET, MSET and DEL drop it, INCR and APPEND keep
//! it, as in Redis.
//!
//! Owns the commands' semantics (options, arithmetic, replies). A handler writes
//! with one `Kv::apply` (or `put`) after its reads, as its last step, so a command that
//! fails leaves no partial writes in an `EXEC` overlay. It owns no locks or engine
//! handles: the store it is given does.
//!
//! Thread-safety: handlers are plain functions; they run on whichever thread runs the
//! batch.

use crate::resp::Reply;

use crate::expiry::now_ms;

use crate::types::{is_typed, kind_of};

use super::collection::{delete_members, wrongtype};
use super::expire::{live_len, live_value, read_stored, set_deadline, Writes};
use super::kv::Kv;
use super::{not_an_integer, opt_bulk, parse_i64, syntax_error, wrong_args};
use crate::notify::{GENERIC, NEW, STRING};

/// A string value read for a command on strings: `Err(WRONGTYPE)` for a collection.
pub(super) fn string_only(value: Option<Vec<u8>>) -> Result<Option<Vec<u8>>, Reply> {
    match value {
        Some(v) if is_typed(&v) => Err(wrongtype()),
        v => Ok(v),
    }
}

/// The refusal of a value a string command would write that starts like a collection's
/// metadata (`types::TYPED`), which could not be told from one.
pub(super) fn reserved_value<'a>(mut values: impl Iterator<Item = &'a Vec<u8>>) -> Option<Reply> {
    values.any(|v| is_typed(v)).then(|| {
        Reply::error(
            "ERR values starting with \\xff\\xfftucana\\x00T are reserved for tucana's collections",
        )
    })
}

pub(super) fn cmd_get(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    Ok(string_only(live_value(kv, &args[1])?).map_or_else(|r| r, opt_bulk))
}

pub(super) fn cmd_mget(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let values = if kv.may_expire() {
        let mut values = Vec::with_capacity(args.len() - 1);
        for key in &args[1..] {
            values.push(live_value(kv, key)?);
        }
        values
    } else {
        kv.multi_get(&args[1..])?
    };
    // A collection reads as nil, as in Redis.
    Ok(Reply::Array(
        values
            .into_iter()
            .map(|v| opt_bulk(v.filter(|v| !is_typed(v))))
            .collect(),
    ))
}

pub(super) fn cmd_exists(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let mut n = 0;
    for key in &args[1..] {
        if live_len(kv, key)?.is_some() {
            n += 1;
        }
    }
    Ok(Reply::Int(n))
}

pub(super) fn cmd_strlen(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    Ok(match string_only(live_value(kv, &args[1])?) {
        Ok(v) => Reply::Int(v.map_or(0, |v| v.len()) as i64),
        Err(reply) => reply,
    })
}

/// The type name of a stored value (`TYPE`, `SCAN ... TYPE`).
pub(super) fn type_name(value: &[u8]) -> &'static str {
    match kind_of(value) {
        Some(kind) => kind.name(),
        None => "string",
    }
}

pub(super) fn cmd_type(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let name = live_value(kv, &args[1])?.map_or("none", |v| type_name(&v));
    Ok(Reply::Status(name.into()))
}

/// `OBJECT ENCODING key` (and `OBJECT HELP`): the names Redis gives its encodings, which
/// some clients and tests read; strings by their content, as Redis picks them. `OBJECT
/// REFCOUNT key`: 1 (no value is shared).
pub(super) fn cmd_object(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let sub = args[1].to_ascii_uppercase();
    if sub == b"REFCOUNT" && args.len() == 3 {
        // Values are never shared between keys here (Redis shares small integers), so
        // every value has one reference.
        return Ok(match live_value(kv, &args[2])? {
            Some(_) => Reply::Int(1),
            None => Reply::Nil,
        });
    }
    if sub != b"ENCODING" || args.len() != 3 {
        return Ok(Reply::error(format!(
            "ERR unknown subcommand or wrong number of arguments for '{}'. Try OBJECT HELP.",
            super::printable(&args[1], 64)
        )));
    }
    let Some(value) = live_value(kv, &args[2])? else {
        return Ok(Reply::Nil);
    };
    let name = match kind_of(&value) {
        Some(_) => {
            let meta = crate::types::Meta::decode(&value)?;
            super::collection::redis_encoding(kv, &args[2], &meta)?
        }
        None if value.len() <= 20 && parse_i64(&value).is_some() => "int",
        None if value.len() <= 44 => "embstr",
        None => "raw",
    };
    Ok(Reply::Bulk(name.as_bytes().to_vec()))
}

/// SET's options.
#[derive(Default)]
struct SetOptions {
    nx: bool,
    xx: bool,
    get: bool,
    keep_ttl: bool,
    /// EX, PX, EXAT or PXAT with its argument.
    expire: Option<(Vec<u8>, Vec<u8>)>,
}

fn set_options(args: &[Vec<u8>]) -> Result<SetOptions, Reply> {
    let mut o = SetOptions::default();
    let mut i = 0;
    while i < args.len() {
        let opt = args[i].to_ascii_uppercase();
        match opt.as_slice() {
            b"NX" if !o.xx => o.nx = true,
            b"XX" if !o.nx => o.xx = true,
            b"GET" => o.get = true,
            b"KEEPTTL" if o.expire.is_none() => o.keep_ttl = true,
            b"EX" | b"PX" | b"EXAT" | b"PXAT" if !o.keep_ttl && o.expire.is_none() => {
                let time = args.get(i + 1).ok_or_else(syntax_error)?;
                o.expire = Some((opt, time.clone()));
                i += 1;
            }
            _ => return Err(syntax_error()),
        }
        i += 1;
    }
    Ok(o)
}

/// The deadline of an `EX|PX|EXAT|PXAT time` option (`Err`: the reply).
fn option_deadline(option: &[u8], time: &[u8], now: u64, command: &str) -> Result<i64, Reply> {
    let seconds = option == b"EX" || option == b"EXAT";
    let relative = option == b"EX" || option == b"PX";
    set_deadline(time, seconds, relative, now, command)
}

/// `SET key value [NX|XX] [GET] [EX s|PX ms|EXAT s|PXAT ms|KEEPTTL]`. A deadline already
/// past (EXAT, PXAT) leaves the key deleted, as in Redis.
pub(super) fn cmd_set(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let (key, value) = (&args[1], &args[2]);
    if let Some(reply) = reserved_value([value].into_iter()) {
        return Ok(reply);
    }
    let o = match set_options(&args[3..]) {
        Ok(o) => o,
        Err(reply) => return Ok(reply),
    };
    let now = now_ms();
    let deadline = match &o.expire {
        Some((option, time)) => match option_deadline(option, time, now, "set") {
            Ok(d) => Some(d),
            Err(reply) => return Ok(reply),
        },
        None => None,
    };
    // A plain SET reads only the deadline record it must delete (none where no key can
    // have one), not the value (unless a `new` notification must tell).
    let stored =
        if o.nx || o.xx || o.get || o.keep_ttl || crate::notify::wants(kv.notify_flags(), NEW) {
            read_stored(kv, key, now)?
        } else {
            super::expire::Stored {
                value: None,
                stored_deadline_ms: stored_deadline(kv, key)?,
            }
        };
    if o.get && stored.value.as_deref().is_some_and(is_typed) {
        return Ok(wrongtype());
    }
    let exists = stored.value.is_some();
    let apply = !(o.nx && exists || o.xx && !exists);
    if apply {
        let mut writes = Writes::default();
        match deadline {
            Some(d) if d <= now as i64 => writes.delete(key, stored.stored_deadline_ms),
            Some(d) => writes.put(
                key,
                value.clone(),
                stored.stored_deadline_ms,
                Some(d as u64),
            ),
            None => {
                let keep = if o.keep_ttl {
                    stored.deadline_ms()
                } else {
                    None
                };
                writes.put(key, value.clone(), stored.stored_deadline_ms, keep);
            }
        }
        writes.apply(kv)?;
        set_events(kv, key, exists, deadline.is_some());
    }
    Ok(match (o.get, apply) {
        (true, _) => opt_bulk(stored.value),
        (false, true) => Reply::Ok,
        (false, false) => Reply::Nil,
    })
}

/// The events of a SET (and SETEX, SETNX, GETSET, MSET): `new` for a key that did not
/// exist, `set`, and `expire` when it came with a deadline (Redis raises them even for
/// a deadline already past).
fn set_events(kv: &mut dyn Kv, key: &[u8], existed: bool, with_deadline: bool) {
    if !existed {
        kv.notify(NEW, "new", key);
    }
    kv.notify(STRING, "set", key);
    if with_deadline {
        kv.notify(GENERIC, "expire", key);
    }
}

/// SETEX and PSETEX: `key time value`.
fn setex_generic(
    kv: &mut dyn Kv,
    args: &[Vec<u8>],
    seconds: bool,
    command: &str,
) -> tucana::Result<Reply> {
    if let Some(reply) = reserved_value([&args[3]].into_iter()) {
        return Ok(reply);
    }
    let now = now_ms();
    let deadline = match set_deadline(&args[2], seconds, true, now, command) {
        Ok(d) => d as u64,
        Err(reply) => return Ok(reply),
    };
    let stored = read_stored(kv, &args[1], now)?;
    let mut writes = Writes::default();
    writes.put(
        &args[1],
        args[3].clone(),
        stored.stored_deadline_ms,
        Some(deadline),
    );
    writes.apply(kv)?;
    set_events(kv, &args[1], stored.value.is_some(), true);
    Ok(Reply::Ok)
}

pub(super) fn cmd_setex(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    setex_generic(kv, args, true, "setex")
}

pub(super) fn cmd_psetex(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    setex_generic(kv, args, false, "psetex")
}

/// `GETEX key [EX s|PX ms|EXAT s|PXAT ms|PERSIST]`: the value, and its deadline changed.
pub(super) fn cmd_getex(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let now = now_ms();
    // `None`: unchanged; `Some(None)`: PERSIST; `Some(Some(d))`: a new deadline.
    let mut change: Option<Option<i64>> = None;
    let mut i = 2;
    while i < args.len() {
        let opt = args[i].to_ascii_uppercase();
        match opt.as_slice() {
            b"PERSIST" if change.is_none() => change = Some(None),
            b"EX" | b"PX" | b"EXAT" | b"PXAT" if change.is_none() => {
                let Some(time) = args.get(i + 1) else {
                    return Ok(syntax_error());
                };
                match option_deadline(&opt, time, now, "getex") {
                    Ok(d) => change = Some(Some(d)),
                    Err(reply) => return Ok(reply),
                }
                i += 1;
            }
            _ => return Ok(syntax_error()),
        }
        i += 1;
    }
    let key = &args[1];
    let stored = read_stored(kv, key, now)?;
    if stored.value.is_none() {
        return Ok(Reply::Nil);
    }
    if stored.value.as_deref().is_some_and(is_typed) {
        return Ok(wrongtype());
    }
    if let Some(new) = change {
        let mut writes = Writes::default();
        let event = match new {
            Some(d) if d <= now as i64 => {
                writes.delete(key, stored.stored_deadline_ms);
                Some("del")
            }
            Some(d) => {
                writes.deadline(key, stored.stored_deadline_ms, Some(d as u64));
                Some("expire")
            }
            None => {
                writes.deadline(key, stored.stored_deadline_ms, None);
                stored.deadline_ms().map(|_| "persist")
            }
        };
        writes.apply(kv)?;
        if let Some(event) = event {
            kv.notify(GENERIC, event, key);
        }
    }
    Ok(opt_bulk(stored.value))
}

pub(super) fn cmd_setnx(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    if let Some(reply) = reserved_value([&args[2]].into_iter()) {
        return Ok(reply);
    }
    let stored = read_stored(kv, &args[1], now_ms())?;
    if stored.value.is_some() {
        return Ok(Reply::Int(0));
    }
    let mut writes = Writes::default();
    writes.put(&args[1], args[2].clone(), stored.stored_deadline_ms, None);
    writes.apply(kv)?;
    set_events(kv, &args[1], false, false);
    Ok(Reply::Int(1))
}

pub(super) fn cmd_getset(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    if let Some(reply) = reserved_value([&args[2]].into_iter()) {
        return Ok(reply);
    }
    let stored = read_stored(kv, &args[1], now_ms())?;
    if stored.value.as_deref().is_some_and(is_typed) {
        return Ok(wrongtype());
    }
    let mut writes = Writes::default();
    writes.put(&args[1], args[2].clone(), stored.stored_deadline_ms, None);
    writes.apply(kv)?;
    set_events(kv, &args[1], stored.value.is_some(), false);
    Ok(opt_bulk(stored.value))
}

pub(super) fn cmd_getdel(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let stored = read_stored(kv, &args[1], now_ms())?;
    if stored.value.as_deref().is_some_and(is_typed) {
        return Ok(wrongtype());
    }
    if stored.value.is_some() {
        let mut writes = Writes::default();
        writes.delete(&args[1], stored.stored_deadline_ms);
        writes.apply(kv)?;
        kv.notify(GENERIC, "del", &args[1]);
    }
    Ok(opt_bulk(stored.value))
}

/// The key and value pairs of MSET and MSETNX.
fn pairs(args: &[Vec<u8>]) -> Option<std::slice::Chunks<'_, Vec<u8>>> {
    let rest = &args[1..];
    rest.len().is_multiple_of(2).then(|| rest.chunks(2))
}

/// The stored deadline of `key` (even if passed), which its next write must delete.
pub(super) fn stored_deadline(kv: &mut dyn Kv, key: &[u8]) -> tucana::Result<Option<u64>> {
    if !kv.may_expire() {
        return Ok(None);
    }
    kv.lookup(&crate::expiry::deadline_key(key))?
        .map(|d| crate::expiry::decode_deadline(&d))
        .transpose()
}

/// MSET's writes: each pair's value without a deadline (a key given twice: the last wins).
fn mset_writes(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Writes> {
    let mut writes = Writes::default();
    let mut seen = std::collections::HashMap::new();
    for pair in pairs(args).into_iter().flatten() {
        let old = match seen.get(&pair[0]) {
            Some(_) => None,
            None => stored_deadline(kv, &pair[0])?,
        };
        seen.insert(pair[0].clone(), ());
        writes.put(&pair[0], pair[1].clone(), old, None);
    }
    Ok(writes)
}

/// Whether each pair's key existed before MSET wrote it (a key given twice exists for
/// its second write): read only when `new` notifications are on.
fn mset_existed(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Vec<bool>> {
    let mut existed = Vec::new();
    if !crate::notify::wants(kv.notify_flags(), NEW) {
        return Ok(existed);
    }
    let mut seen = std::collections::HashSet::new();
    for pair in pairs(args).into_iter().flatten() {
        let before = seen.contains(&pair[0]) || live_len(kv, &pair[0])?.is_some();
        seen.insert(pair[0].clone());
        existed.push(before);
    }
    Ok(existed)
}

/// MSET's events, pair by pair (`existed` from [`mset_existed`]; empty: no `new`).
fn mset_events(kv: &mut dyn Kv, args: &[Vec<u8>], existed: &[bool]) {
    if kv.notify_flags() == 0 {
        return;
    }
    for (i, pair) in pairs(args).into_iter().flatten().enumerate() {
        set_events(kv, &pair[0], existed.get(i).copied().unwrap_or(true), false);
    }
}

pub(super) fn cmd_mset(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    if pairs(args).is_none() {
        return Ok(wrong_args("mset"));
    }
    if let Some(reply) = reserved_value(args[2..].iter().step_by(2)) {
        return Ok(reply);
    }
    let existed = mset_existed(kv, args)?;
    mset_writes(kv, args)?.apply(kv)?;
    mset_events(kv, args, &existed);
    Ok(Reply::Ok)
}

pub(super) fn cmd_msetnx(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let Some(pairs) = pairs(args) else {
        return Ok(wrong_args("msetnx"));
    };
    if let Some(reply) = reserved_value(args[2..].iter().step_by(2)) {
        return Ok(reply);
    }
    for pair in pairs {
        if live_len(kv, &pair[0])?.is_some() {
            return Ok(Reply::Int(0));
        }
    }
    let existed = mset_existed(kv, args)?;
    mset_writes(kv, args)?.apply(kv)?;
    mset_events(kv, args, &existed);
    Ok(Reply::Int(1))
}

pub(super) fn cmd_del(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let now = now_ms();
    let mut writes = Writes::default();
    let mut n = 0;
    let mut deleted = Vec::new();
    for key in &args[1..] {
        if writes.writes(key) {
            continue;
        }
        let stored = if kv.may_expire() {
            read_stored(kv, key, now)?
        } else {
            super::expire::Stored {
                value: kv.lookup(key)?,
                stored_deadline_ms: None,
            }
        };
        // A small collection's members go in the same batch; a big one's are left to
        // the sweep of old versions (its metadata, deleted here, names their version).
        if let Some(v) = stored.value.as_deref().filter(|v| is_typed(v)) {
            delete_members(kv, key, v, &mut writes)?;
        }
        // An expired key's records go too, but it does not count as deleted.
        if stored.value.is_some() || stored.stored_deadline_ms.is_some() {
            writes.delete(key, stored.stored_deadline_ms);
        }
        if stored.value.is_some() {
            n += 1;
            deleted.push(key);
        }
    }
    writes.apply(kv)?;
    for key in deleted {
        kv.notify(GENERIC, "del", key);
    }
    Ok(Reply::Int(n))
}

/// A read-modify-write that keeps the key's deadline (APPEND, INCR): the new value, or
/// the reply when the old one does not fit. `event` is its notification (after `new`
/// when the key did not exist).
pub(super) fn modify(
    kv: &mut dyn Kv,
    key: &[u8],
    event: &'static str,
    f: impl FnOnce(Option<Vec<u8>>) -> Result<Vec<u8>, Reply>,
) -> tucana::Result<Result<Vec<u8>, Reply>> {
    let stored = read_stored(kv, key, now_ms())?;
    if stored.value.as_deref().is_some_and(is_typed) {
        return Ok(Err(wrongtype()));
    }
    let keep = stored.deadline_ms();
    let existed = stored.value.is_some();
    // Kept only to tell an unchanged SETBIT (its event depends on it).
    let old_value = if event == "setbit" {
        stored.value.clone()
    } else {
        None
    };
    let value = match f(stored.value) {
        Ok(v) => v,
        Err(reply) => return Ok(Err(reply)),
    };
    let mut writes = Writes::default();
    writes.put(key, value.clone(), stored.stored_deadline_ms, keep);
    writes.apply(kv)?;
    if !existed {
        kv.notify(NEW, "new", key);
    }
    // Redis raises `setbit` only when the bit changed (or the key was made).
    if !(event == "setbit" && existed && old_value.as_deref() == Some(value.as_slice())) {
        kv.notify(STRING, event, key);
    }
    Ok(Ok(value))
}

pub(super) fn cmd_append(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let result = modify(kv, &args[1], "append", |old| {
        let mut value = old.unwrap_or_default();
        value.extend_from_slice(&args[2]);
        match reserved_value([&value].into_iter()) {
            Some(reply) => Err(reply),
            None => Ok(value),
        }
    })?;
    Ok(result.map_or_else(|reply| reply, |v| Reply::Int(v.len() as i64)))
}

fn incr_by(kv: &mut dyn Kv, key: &[u8], delta: i64) -> tucana::Result<Reply> {
    let mut next = 0;
    let result = modify(kv, key, "incrby", |old| {
        let current = match old {
            None => 0,
            Some(v) => parse_i64(&v).ok_or_else(not_an_integer)?,
        };
        next = current
            .checked_add(delta)
            .ok_or_else(|| Reply::error("ERR increment or decrement would overflow"))?;
        Ok(next.to_string().into_bytes())
    })?;
    Ok(result.map_or_else(|reply| reply, |_| Reply::Int(next)))
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
    match parse_i64(&args[2]).map(i64::checked_neg) {
        Some(Some(delta)) => incr_by(kv, &args[1], delta),
        // i64::MIN has no negation: Redis's words for it.
        Some(None) => Ok(Reply::error("ERR decrement would overflow")),
        None => Ok(not_an_integer()),
    }
}
