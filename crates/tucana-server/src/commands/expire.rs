//! Key deadlines as the handlers see them, and the commands of Redis's keyspace group that
//! read or change them: EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT, PERSIST, TTL, PTTL,
//! EXPIRETIME, PEXPIRETIME.
//!
//! Owns lazy expiry ([`read_stored`]: a key whose deadline has passed is missing to every
//! command), the writes that keep a key's deadline record and index entry in step with
//! its value ([`Writes`], one `Kv::apply`), and the parsing of expire times with Redis's
//! replies. The stored layout is `expiry`'s; keys are the client's (in cluster mode
//! `SlotKv` slot-prefixes the deadline records like any key). It owns no locks: the
//! store a handler is given does.
//!
//! Thread-safety: plain functions; they run on whichever thread runs the batch.

use tucana::Keyspace;

use crate::expiry::{
    deadline_key, decode_deadline, encode_deadline, index_key, index_prefix, is_reserved, now_ms,
    split_index_key, RESERVED,
};
use crate::resp::Reply;

use super::kv::{Kv, Ops};
use super::{not_an_integer, parse_i64};

/// A key as stored: its value if it is live, and the deadline record found (which the
/// next write of the key must delete, together with its index entry, even if it passed).
pub(super) struct Stored {
    pub(super) value: Option<Vec<u8>>,
    pub(super) stored_deadline_ms: Option<u64>,
}

impl Stored {
    /// The deadline of the live key (`None`: missing, or live without one).
    pub(super) fn deadline_ms(&self) -> Option<u64> {
        self.value.as_ref().and(self.stored_deadline_ms)
    }
}

/// A key is live until its deadline has passed (at the deadline itself it still is, as
/// in Redis).
fn live(deadline_ms: Option<u64>, now_ms: u64) -> bool {
    deadline_ms.is_none_or(|d| d >= now_ms)
}

/// Reads `key` as a client sees it, counting a keyspace hit or miss.
pub(super) fn read_stored(kv: &mut dyn Kv, key: &[u8], now_ms: u64) -> tucana::Result<Stored> {
    if !kv.may_expire() {
        return Ok(Stored {
            value: kv.get(key)?,
            stored_deadline_ms: None,
        });
    }
    let mut value = kv.lookup(key)?;
    let stored_deadline_ms = match &value {
        Some(_) => kv
            .lookup(&deadline_key(key))?
            .map(|d| decode_deadline(&d))
            .transpose()?,
        None => None,
    };
    if !live(stored_deadline_ms, now_ms) {
        value = None;
    }
    kv.count_lookup(key, value.is_some());
    Ok(Stored {
        value,
        stored_deadline_ms,
    })
}

/// For the commands that walk the keyspace (SCAN, KEYS, TRANGE, ...): whether the stored
/// key `prefix key` (`prefix`: the slot prefix in cluster mode, else empty) is a client's
/// live key, not a deadline record nor expired. Without `may_expire` every key is.
pub(super) fn visible(
    ks: &Keyspace,
    may_expire: bool,
    prefix: &[u8],
    key: &[u8],
    now_ms: u64,
) -> tucana::Result<bool> {
    if !may_expire {
        return Ok(true);
    }
    if is_reserved(key) {
        return Ok(false);
    }
    let mut stored = prefix.to_vec();
    stored.extend_from_slice(&deadline_key(key));
    Ok(match ks.get(&stored)? {
        Some(d) => live(Some(decode_deadline(&d)?), now_ms),
        None => true,
    })
}

/// How many records under `prefix` (a slot's, or empty) are not a client's live key: the
/// reserved family's records and the expired keys. O(keys with a deadline).
pub(super) fn hidden_records(ks: &Keyspace, prefix: &[u8], now_ms: u64) -> tucana::Result<u64> {
    Ok(deadline_counts(ks, prefix, now_ms)?.0)
}

/// `hidden_records`, and the live keys with a deadline (INFO's `expires`).
pub(super) fn deadline_counts(
    ks: &Keyspace,
    prefix: &[u8],
    now_ms: u64,
) -> tucana::Result<(u64, u64)> {
    let mut family = prefix.to_vec();
    family.extend_from_slice(RESERVED);
    let (mut hidden, mut expires) = (0, 0);
    for item in ks.prefix(&family) {
        item?;
        hidden += 1;
    }
    let mut index = prefix.to_vec();
    index.extend_from_slice(&index_prefix());
    for item in ks.prefix(&index) {
        let (stored, _) = item?;
        let (deadline, _) = split_index_key(&stored[prefix.len()..])?;
        if live(Some(deadline), now_ms) {
            expires += 1;
        } else {
            hidden += 1;
        }
    }
    Ok((hidden, expires))
}

/// The value of `key` if it is live.
pub(super) fn live_value(kv: &mut dyn Kv, key: &[u8]) -> tucana::Result<Option<Vec<u8>>> {
    Ok(read_stored(kv, key, now_ms())?.value)
}

/// The length of `key`'s value if it is live (without copying it when no deadline can
/// apply).
pub(super) fn live_len(kv: &mut dyn Kv, key: &[u8]) -> tucana::Result<Option<usize>> {
    if !kv.may_expire() {
        return kv.value_len(key);
    }
    Ok(live_value(kv, key)?.map(|v| v.len()))
}

/// The writes of one command: values with their deadline records and index entries,
/// applied together as one atomic batch.
#[derive(Default)]
pub(super) struct Writes {
    ops: Ops,
    deadline: bool,
    /// Keys whose deadline had passed that these writes delete or overwrite: lazy
    /// expiry's deletions, each an `expired` notification once applied.
    expired: Vec<Vec<u8>>,
    /// A key's value is written or deleted without these writes knowing that nothing
    /// of it is left behind: if it held a collection, that version's sub-records may
    /// now belong to no key, and the collector of old versions must walk again
    /// (`Kv::note_abandoned`).
    abandons: bool,
    /// Keys these writes modify without writing a record of them (a collection whose
    /// sub-records change under unchanged metadata): marked modified once applied
    /// (`Kv::touch`), as a write of them would be.
    touched: Vec<Vec<u8>>,
}

impl Writes {
    /// Changes `key`'s deadline from the stored `old_ms` to `new_ms`, value untouched.
    pub(super) fn deadline(&mut self, key: &[u8], old_ms: Option<u64>, new_ms: Option<u64>) {
        if old_ms == new_ms {
            return;
        }
        if let Some(old) = old_ms {
            self.ops.push((index_key(old, key), None));
        }
        match new_ms {
            Some(new) => {
                self.ops
                    .push((deadline_key(key), Some(encode_deadline(new))));
                self.ops.push((index_key(new, key), Some(Vec::new())));
                self.deadline = true;
            }
            None => self.ops.push((deadline_key(key), None)),
        }
    }

    /// Writes `value` at `key`, whose stored deadline is `old_ms`, with deadline `new_ms`.
    /// Whatever `key` held is taken as replaced unread: if it was a collection, its
    /// version may be abandoned (see `abandons`).
    pub(super) fn put(
        &mut self,
        key: &[u8],
        value: Vec<u8>,
        old_ms: Option<u64>,
        new_ms: Option<u64>,
    ) {
        self.abandons = true;
        self.put_same_version(key, value, old_ms, new_ms);
    }

    /// [`Writes::put`] of a collection's metadata over the version the key already
    /// holds, or over nothing at all (no value, no deadline): no version is abandoned.
    pub(super) fn put_same_version(
        &mut self,
        key: &[u8],
        value: Vec<u8>,
        old_ms: Option<u64>,
        new_ms: Option<u64>,
    ) {
        self.note_expired(key, old_ms);
        self.ops.push((key.to_vec(), Some(value)));
        self.deadline(key, old_ms, new_ms);
    }

    /// Deletes `key` with its deadline (stored as `old_ms`); like [`Writes::put`], what it
    /// held may be a collection whose version is abandoned.
    pub(super) fn delete(&mut self, key: &[u8], old_ms: Option<u64>) {
        self.abandons = true;
        self.delete_emptied(key, old_ms);
    }

    /// [`Writes::delete`] of a collection emptied in its own version: these writes
    /// delete its last sub-records, so no version is abandoned.
    pub(super) fn delete_emptied(&mut self, key: &[u8], old_ms: Option<u64>) {
        self.note_expired(key, old_ms);
        self.ops.push((key.to_vec(), None));
        self.deadline(key, old_ms, None);
    }

    /// A write over `key` whose stored deadline `old_ms` has passed removes an expired
    /// key (Redis deletes it when a command looks it up, with an `expired` event).
    fn note_expired(&mut self, key: &[u8], old_ms: Option<u64>) {
        if old_ms.is_some_and(|d| !live(Some(d), now_ms()))
            && !self.expired.iter().any(|k| k == key)
        {
            self.expired.push(key.to_vec());
        }
    }

    /// A write of a record in the reserved family (a collection's sub-record): the
    /// batch carries the keyspace's marker, so walks of the keyspace hide the family.
    pub(super) fn reserved(&mut self, stored: Vec<u8>, value: Option<Vec<u8>>) {
        self.ops.push((stored, value));
        self.deadline = true;
    }

    /// `key` is modified by these writes though none of them is a record of it.
    pub(super) fn touch(&mut self, key: &[u8]) {
        self.touched.push(key.to_vec());
    }

    /// Whether there is nothing to write.
    pub(super) fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Adds `other`'s writes after these (one batch for two keys: SMOVE, LMOVE).
    pub(super) fn append(&mut self, other: Writes) {
        self.ops.extend(other.ops);
        self.deadline |= other.deadline;
        self.abandons |= other.abandons;
        self.expired.extend(other.expired);
        self.touched.extend(other.touched);
    }

    /// Whether `key` is already written here (DEL of a key given twice).
    pub(super) fn writes(&self, key: &[u8]) -> bool {
        self.ops.iter().any(|(k, _)| k == key)
    }

    /// Applies every write as one atomic batch, then notifies the expired keys it
    /// removed (before the command's own events, which its handler raises next).
    pub(super) fn apply(self, kv: &mut dyn Kv) -> tucana::Result<()> {
        if self.deadline {
            kv.note_deadline();
        }
        if self.abandons {
            kv.note_abandoned();
        }
        kv.apply(self.ops)?;
        for key in &self.touched {
            kv.touch(key);
        }
        for key in &self.expired {
            kv.notify(crate::notify::EXPIRED, "expired", key);
        }
        Ok(())
    }
}

/// `ERR invalid expire time in '<cmd>' command`.
pub(super) fn invalid_expire_time(command: &str) -> Reply {
    Reply::error(format!("ERR invalid expire time in '{command}' command"))
}

/// A deadline in unix ms from an expire time argument of SET, SETEX, PSETEX or GETEX:
/// must be positive; `relative` adds it to now. `Err` is the reply.
pub(super) fn set_deadline(
    arg: &[u8],
    seconds: bool,
    relative: bool,
    now_ms: u64,
    command: &str,
) -> Result<i64, Reply> {
    let n = parse_i64(arg).ok_or_else(not_an_integer)?;
    if n <= 0 {
        return Err(invalid_expire_time(command));
    }
    expire_deadline(n, seconds, relative, now_ms).ok_or_else(|| invalid_expire_time(command))
}

/// `n` seconds or milliseconds, from now or from the epoch, as a deadline in unix ms;
/// `None` on overflow.
fn expire_deadline(n: i64, seconds: bool, relative: bool, now_ms: u64) -> Option<i64> {
    let ms = if seconds { n.checked_mul(1000)? } else { n };
    if relative {
        ms.checked_add(now_ms as i64)
    } else {
        Some(ms)
    }
}

/// The conditions of EXPIRE and its family.
#[derive(Default)]
struct Conditions {
    nx: bool,
    xx: bool,
    gt: bool,
    lt: bool,
}

fn conditions(args: &[Vec<u8>]) -> Result<Conditions, Reply> {
    let mut c = Conditions::default();
    for arg in args {
        match arg.to_ascii_uppercase().as_slice() {
            b"NX" => c.nx = true,
            b"XX" => c.xx = true,
            b"GT" => c.gt = true,
            b"LT" => c.lt = true,
            _ => {
                return Err(Reply::error(format!(
                    "ERR Unsupported option {}",
                    String::from_utf8_lossy(arg)
                )))
            }
        }
    }
    if c.nx && (c.xx || c.gt || c.lt) {
        return Err(Reply::error(
            "ERR NX and XX, GT or LT options at the same time are not compatible",
        ));
    }
    if c.gt && c.lt {
        return Err(Reply::error(
            "ERR GT and LT options at the same time are not compatible",
        ));
    }
    Ok(c)
}

impl Conditions {
    /// Whether a key whose deadline is `current` (`None`: none, i.e. never) takes `new`.
    fn allow(&self, current: Option<u64>, new: i64) -> bool {
        match current {
            None => !(self.xx || self.gt),
            Some(cur) => {
                !(self.nx || (self.gt && new <= cur as i64) || (self.lt && new >= cur as i64))
            }
        }
    }
}

/// EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT: `key time [NX|XX|GT|LT]`. 1 when the deadline
/// was set (or, at or before now, the key deleted), 0 when the key is missing or a
/// condition failed.
fn expire_generic(
    kv: &mut dyn Kv,
    args: &[Vec<u8>],
    seconds: bool,
    relative: bool,
    command: &str,
) -> tucana::Result<Reply> {
    // Options first, then the time, as Redis checks them.
    let c = match conditions(&args[3..]) {
        Ok(c) => c,
        Err(reply) => return Ok(reply),
    };
    let Some(n) = parse_i64(&args[2]) else {
        return Ok(not_an_integer());
    };
    let now = now_ms();
    let Some(when) = expire_deadline(n, seconds, relative, now) else {
        return Ok(invalid_expire_time(command));
    };
    let key = &args[1];
    let stored = read_stored(kv, key, now)?;
    if stored.value.is_none() || !c.allow(stored.deadline_ms(), when) {
        return Ok(Reply::Int(0));
    }
    let mut writes = Writes::default();
    let event = if when <= now as i64 {
        writes.delete(key, stored.stored_deadline_ms);
        "del"
    } else {
        writes.deadline(key, stored.stored_deadline_ms, Some(when as u64));
        "expire"
    };
    writes.apply(kv)?;
    kv.notify(crate::notify::GENERIC, event, key);
    Ok(Reply::Int(1))
}

pub(super) fn cmd_expire(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    expire_generic(kv, args, true, true, "expire")
}

pub(super) fn cmd_pexpire(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    expire_generic(kv, args, false, true, "pexpire")
}

pub(super) fn cmd_expireat(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    expire_generic(kv, args, true, false, "expireat")
}

pub(super) fn cmd_pexpireat(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    expire_generic(kv, args, false, false, "pexpireat")
}

/// `PERSIST key`: 1 when a deadline was removed.
pub(super) fn cmd_persist(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let stored = read_stored(kv, &args[1], now_ms())?;
    let Some(deadline) = stored.deadline_ms() else {
        return Ok(Reply::Int(0));
    };
    let mut writes = Writes::default();
    writes.deadline(&args[1], Some(deadline), None);
    writes.apply(kv)?;
    kv.notify(crate::notify::GENERIC, "persist", &args[1]);
    Ok(Reply::Int(1))
}

/// TTL, PTTL, EXPIRETIME, PEXPIRETIME: -2 for a missing key, -1 for one without a
/// deadline, else the time left (or the deadline), seconds rounded as Redis rounds them.
fn ttl_generic(kv: &mut dyn Kv, key: &[u8], ms: bool, absolute: bool) -> tucana::Result<Reply> {
    let now = now_ms();
    let stored = read_stored(kv, key, now)?;
    if stored.value.is_none() {
        return Ok(Reply::Int(-2));
    }
    let Some(deadline) = stored.deadline_ms() else {
        return Ok(Reply::Int(-1));
    };
    let t = if absolute {
        deadline
    } else {
        deadline.saturating_sub(now)
    };
    let t = if ms { t } else { t.saturating_add(500) / 1000 };
    Ok(Reply::Int(t.min(i64::MAX as u64) as i64))
}

pub(super) fn cmd_ttl(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    ttl_generic(kv, &args[1], false, false)
}

pub(super) fn cmd_pttl(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    ttl_generic(kv, &args[1], true, false)
}

pub(super) fn cmd_expiretime(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    ttl_generic(kv, &args[1], false, true)
}

pub(super) fn cmd_pexpiretime(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    ttl_generic(kv, &args[1], true, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(w: &[&str]) -> Vec<Vec<u8>> {
        w.iter().map(|s| s.as_bytes().to_vec()).collect()
    }

    #[test]
    fn conditions_follow_redis() {
        let c = conditions(&words(&["gt"])).ok().unwrap();
        assert!(!c.allow(None, 10), "GT: no deadline is forever");
        assert!(c.allow(Some(5), 10) && !c.allow(Some(10), 10));
        let c = conditions(&words(&["LT"])).ok().unwrap();
        assert!(c.allow(None, 10) && c.allow(Some(11), 10) && !c.allow(Some(10), 10));
        let c = conditions(&words(&["nx"])).ok().unwrap();
        assert!(c.allow(None, 1) && !c.allow(Some(1), 1));
        let c = conditions(&words(&["xx"])).ok().unwrap();
        assert!(!c.allow(None, 1) && c.allow(Some(1), 1));
        assert!(conditions(&words(&["nx", "xx"])).is_err());
        assert!(conditions(&words(&["gt", "lt"])).is_err());
        assert!(conditions(&words(&["xy"])).is_err());
    }

    #[test]
    fn expire_times_overflow_into_errors() {
        assert_eq!(expire_deadline(2, true, true, 1000), Some(3000));
        assert_eq!(expire_deadline(i64::MAX / 100, true, false, 0), None);
        assert_eq!(expire_deadline(i64::MAX, false, true, 1), None);
        assert!(set_deadline(b"0", true, true, 0, "set").is_err());
        assert!(set_deadline(b"-1", false, false, 0, "set").is_err());
        assert!(set_deadline(b"x", false, false, 0, "set").is_err());
    }
}
