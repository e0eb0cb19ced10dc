//! The hash commands: HSET, HMSET, HSETNX, HGET, HMGET, HGETALL, HKEYS, HVALS, HLEN,
//! HEXISTS, HSTRLEN, HDEL, HINCRBY, HINCRBYFLOAT, HRANDFIELD, HSCAN.
//!
//! A hash has one of two layouts (DESIGN.md, "Packed small hashes"): *packed*, every
//! field and value inside the metadata record at the client's key (`types::packed`), while
//! it has at most 128 fields and 4 KiB of fields and values (fixed bounds: Redis's
//! `hash-max-listpack-*` settings only change what OBJECT ENCODING answers, see
//! `collection::redis_encoding`); else *per-field*, the metadata and one sub-record per
//! field (`types::Family::Hash`, field → value). A new hash starts packed; a write that would take it past a bound converts it
//! (a fresh version, every field its own record, in the command's one batch); it never
//! converts back, as in Redis. Every command reads both layouts, so the hashes of volumes
//! written before the packed layout keep working. Fields come back in field order, not in
//! Redis's insertion order (Redis promises no order). Owns the commands' semantics and
//! the choice of layout; the bytes are `types`' and `types::packed`'s, the batch
//! `collection`'s.
//!
//! Thread-safety: plain functions on the store a handler is given.

use std::collections::{BTreeMap, BTreeSet};

use crate::glob::glob_match;
use crate::resp::Reply;
use crate::types::{packed, sub_key, Family, Kind, Meta};

use super::collection::{
    all_members, open, open_or, parse_double, random_members, random_picks, scan_options,
    scan_reply, Opened, Update,
};
use super::kv::{Kv, Pairs};
use super::{not_an_integer, opt_bulk, parse_i64, wrong_args};

const HASH: Kind = Kind::Hash;
const F: Family = Family::Hash;

/// A field's value in version `version` of `key`.
fn field(kv: &mut dyn Kv, key: &[u8], version: u64, f: &[u8]) -> tucana::Result<Option<Vec<u8>>> {
    kv.lookup(&sub_key(F, key, version, f))
}

/// A live hash opened for reading, in either layout.
enum Fields {
    /// Packed: its fields and values, in field order.
    Packed(Pairs),
    /// Per-field: the version its sub-records carry.
    Split(u64),
}

impl Fields {
    fn of(opened: Opened, meta: &Meta) -> Fields {
        match opened.packed {
            Some(pairs) => Fields::Packed(pairs),
            None => Fields::Split(meta.version),
        }
    }

    /// The value of field `f` of `key`.
    fn get(&self, kv: &mut dyn Kv, key: &[u8], f: &[u8]) -> tucana::Result<Option<Vec<u8>>> {
        match self {
            Fields::Packed(pairs) => Ok(pairs
                .binary_search_by(|(k, _)| k.as_slice().cmp(f))
                .ok()
                .map(|i| pairs[i].1.clone())),
            Fields::Split(version) => field(kv, key, *version, f),
        }
    }

    /// Every field and value of `key`, in field order.
    fn all(self, kv: &mut dyn Kv, key: &[u8]) -> tucana::Result<Pairs> {
        match self {
            Fields::Packed(pairs) => Ok(pairs),
            Fields::Split(version) => all_members(kv, F, key, version),
        }
    }
}

/// Opens `key` as a hash for a handler that returns `$missing` when it is missing;
/// evaluates to its metadata and [`Fields`].
macro_rules! open_fields {
    ($kv:expr, $key:expr, $missing:expr) => {{
        let (opened, meta) = open_or!($kv, $key, HASH, $missing);
        let fields = Fields::of(opened, &meta);
        (meta, fields)
    }};
}

/// One command's writes to a hash, in either layout: a packed hash's fields are edited in
/// memory and written back as one value, converted to the per-field layout at
/// [`Writer::apply`] when they no longer fit; a per-field hash's go to [`Update`].
struct Writer<'k> {
    key: &'k [u8],
    update: Update<'k>,
    /// `Some` while the hash is packed (a new hash starts packed).
    packed: Option<BTreeMap<Vec<u8>, Vec<u8>>>,
}

impl<'k> Writer<'k> {
    /// Opens `key` for writing; `Err` is `WRONGTYPE`.
    fn open(kv: &mut dyn Kv, key: &'k [u8]) -> tucana::Result<Result<Writer<'k>, Reply>> {
        let opened = match open(kv, key, HASH)? {
            Ok(o) => o,
            Err(reply) => return Ok(Err(reply)),
        };
        let existed = opened.meta.is_some();
        let mut update = Update::new(key, opened, HASH);
        let packed = match update.take_packed() {
            Some(pairs) => Some(pairs.into_iter().collect()),
            None if !existed => Some(BTreeMap::new()),
            None => None,
        };
        Ok(Ok(Writer {
            key,
            update,
            packed,
        }))
    }

    /// The current value of field `f` (this command's writes included when packed).
    fn get(&self, kv: &mut dyn Kv, f: &[u8]) -> tucana::Result<Option<Vec<u8>>> {
        match &self.packed {
            Some(map) => Ok(map.get(f).cloned()),
            None => field(kv, self.key, self.update.meta.version, f),
        }
    }

    /// Sets field `f`; the caller keeps `count` of a per-field hash.
    fn put(&mut self, f: &[u8], value: Vec<u8>) {
        match &mut self.packed {
            Some(map) => {
                map.insert(f.to_vec(), value);
            }
            None => self.update.put(F, f, value),
        }
    }

    /// Deletes field `f` (which exists); the caller keeps `count` of a per-field hash.
    fn delete(&mut self, f: &[u8]) {
        match &mut self.packed {
            Some(map) => {
                map.remove(f);
            }
            None => self.update.delete(F, f),
        }
    }

    /// Applies the command's writes as one batch, raising `event`. A packed hash is
    /// written back packed while it fits; else it converts here: a fresh version and
    /// every field as its own record, with the new metadata over the packed value.
    fn apply(mut self, kv: &mut dyn Kv, event: &'static str) -> tucana::Result<()> {
        if let Some(map) = self.packed.take() {
            let bytes: usize = map.iter().map(|(f, v)| f.len() + v.len()).sum();
            if map.is_empty() {
                self.update.meta.count = 0; // deleted with its last field
            } else if packed::fits(map.len(), bytes) {
                self.update.meta.count = map.len() as u64;
                let entries = map.iter().map(|(f, v)| (f.as_slice(), v.as_slice()));
                self.update.set_value(packed::encode(entries));
            } else {
                self.update.meta = Meta::new(HASH);
                self.update.meta.count = map.len() as u64;
                for (f, v) in map {
                    self.update.put(F, &f, v);
                }
            }
        }
        self.update.apply(kv, event)
    }
}

/// HSET and HMSET: `key field value [field value ...]`; HSET answers the number of new
/// fields, HMSET `OK`.
fn hset_generic(kv: &mut dyn Kv, args: &[Vec<u8>], name: &str) -> tucana::Result<Reply> {
    if !args.len().is_multiple_of(2) {
        return Ok(wrong_args(name));
    }
    let mut w = match Writer::open(kv, &args[1])? {
        Ok(w) => w,
        Err(reply) => return Ok(reply),
    };
    // The fields this command adds, borrowed from its arguments: compared, not hashed
    // (SipHash, a copy of each field and the set's growth were an eighth of an HSET's
    // instructions).
    let mut added: BTreeSet<&[u8]> = BTreeSet::new();
    for pair in args[2..].chunks(2) {
        // A packed hash's lookup is in memory and sees this command's own fields.
        let is_new = !added.contains(pair[0].as_slice()) && w.get(kv, &pair[0])?.is_none();
        if is_new {
            added.insert(&pair[0]);
        }
        w.put(&pair[0], pair[1].clone());
    }
    w.update.meta.count += added.len() as u64;
    w.apply(kv, "hset")?;
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
    let mut w = match Writer::open(kv, &args[1])? {
        Ok(w) => w,
        Err(reply) => return Ok(reply),
    };
    if w.get(kv, &args[2])?.is_some() {
        return Ok(Reply::Int(0));
    }
    w.put(&args[2], args[3].clone());
    w.update.meta.count += 1;
    w.apply(kv, "hset")?;
    Ok(Reply::Int(1))
}

pub(super) fn cmd_hget(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let (_, fields) = open_fields!(kv, &args[1], Reply::Nil);
    Ok(opt_bulk(fields.get(kv, &args[1], &args[2])?))
}

pub(super) fn cmd_hmget(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let nils = Reply::Array(vec![Reply::Nil; args.len() - 2]);
    let (_, fields) = open_fields!(kv, &args[1], nils);
    let mut out = Vec::with_capacity(args.len() - 2);
    for f in &args[2..] {
        out.push(opt_bulk(fields.get(kv, &args[1], f)?));
    }
    Ok(Reply::Array(out))
}

pub(super) fn cmd_hgetall(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let (_, fields) = open_fields!(kv, &args[1], Reply::Map(Vec::new()));
    let pairs = fields.all(kv, &args[1])?;
    Ok(Reply::Map(
        pairs
            .into_iter()
            .map(|(f, v)| (Reply::Bulk(f), Reply::Bulk(v)))
            .collect(),
    ))
}

pub(super) fn cmd_hkeys(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let (_, fields) = open_fields!(kv, &args[1], Reply::Array(Vec::new()));
    let pairs = fields.all(kv, &args[1])?;
    Ok(Reply::Array(
        pairs.into_iter().map(|(f, _)| Reply::Bulk(f)).collect(),
    ))
}

pub(super) fn cmd_hvals(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let (_, fields) = open_fields!(kv, &args[1], Reply::Array(Vec::new()));
    let pairs = fields.all(kv, &args[1])?;
    Ok(Reply::Array(
        pairs.into_iter().map(|(_, v)| Reply::Bulk(v)).collect(),
    ))
}

pub(super) fn cmd_hlen(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let (_, meta) = open_or!(kv, &args[1], HASH, Reply::Int(0));
    Ok(Reply::Int(meta.count as i64))
}

pub(super) fn cmd_hexists(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let (_, fields) = open_fields!(kv, &args[1], Reply::Int(0));
    let found = fields.get(kv, &args[1], &args[2])?.is_some();
    Ok(Reply::Int(found as i64))
}

pub(super) fn cmd_hstrlen(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let (_, fields) = open_fields!(kv, &args[1], Reply::Int(0));
    let len = fields.get(kv, &args[1], &args[2])?.map_or(0, |v| v.len());
    Ok(Reply::Int(len as i64))
}

pub(super) fn cmd_hdel(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let mut w = match Writer::open(kv, &args[1])? {
        Ok(w) => w,
        Err(reply) => return Ok(reply),
    };
    if w.update.meta.count == 0 {
        return Ok(Reply::Int(0)); // missing (HDEL creates nothing)
    }
    let mut gone: BTreeSet<&[u8]> = BTreeSet::new();
    for f in &args[2..] {
        if !gone.contains(f.as_slice()) && w.get(kv, f)?.is_some() {
            w.delete(f);
            gone.insert(f);
        }
    }
    if gone.is_empty() {
        return Ok(Reply::Int(0));
    }
    w.update.meta.count = w.update.meta.count.saturating_sub(gone.len() as u64);
    w.apply(kv, "hdel")?;
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
    let mut w = match Writer::open(kv, &args[1])? {
        Ok(w) => w,
        Err(reply) => return Ok(reply),
    };
    let old = w.get(kv, &args[2])?;
    let (value, reply) = match f(old.as_deref()) {
        Ok(done) => done,
        Err(reply) => return Ok(reply),
    };
    if old.is_none() {
        w.update.meta.count += 1;
    }
    w.put(&args[2], value);
    w.apply(kv, event)?;
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
    let (meta, fields) = open_fields!(kv, &args[1], missing);
    let picks = match fields {
        Fields::Packed(pairs) => random_picks(pairs.len(), count)
            .into_iter()
            .map(|i| pairs[i].clone())
            .collect(),
        Fields::Split(_) => random_members(kv, F, &args[1], &meta, count)?,
    };
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
    let (_, fields) = open_fields!(kv, &args[1], scan_reply(Vec::new()));
    let mut items = Vec::new();
    for (f, v) in fields.all(kv, &args[1])? {
        if pattern.as_ref().is_none_or(|p| glob_match(p, &f)) {
            items.push(Reply::Bulk(f));
            items.push(Reply::Bulk(v));
        }
    }
    Ok(scan_reply(items))
}
