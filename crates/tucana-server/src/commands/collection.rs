//! What the collection commands (hashes, sorted sets, sets, lists) share: opening a key
//! as a collection of one kind (lazy expiry, `WRONGTYPE`), one command's writes of
//! sub-records and metadata as one atomic batch ([`Update`]), reading a version's
//! sub-records in order, and the number formats of Redis's replies.
//!
//! Owns the rule that keeps metadata and sub-records in step: every write of a collection
//! goes through [`Update::apply`], which writes the metadata when it changed (or deletes
//! the key when the last member went) in the same `Kv::apply` as the sub-records (when it
//! did not, the key is marked modified all the same, `Kv::touch`), and then raises the
//! command's keyspace notifications in Redis's order ([`Events`]: `new` when the key was
//! created, the command's event, `del` when the key was emptied). The layout is `types`';
//! deadlines are `expire`'s.
//!
//! Thread-safety: plain functions on the store a handler is given.

use std::ops::Bound;

use crate::expiry::now_ms;
use crate::resp::Reply;
use crate::types::{sub_key, sub_key_of_parts, sub_prefix, Family, Kind, Meta};

use super::expire::{read_stored, Writes};
use super::kv::{Kv, Pairs};

/// Redis's reply to a command on a key of another type.
pub(super) fn wrongtype() -> Reply {
    Reply::error("WRONGTYPE Operation against a key holding the wrong kind of value")
}

/// A key opened as a collection: its live metadata (`None`: missing or expired) and the
/// deadline record its next write must keep or drop.
pub(super) struct Opened {
    pub(super) meta: Option<Meta>,
    /// A packed hash's fields and values, in field order (`types::packed`).
    pub(super) packed: Option<Pairs>,
    /// A live value is at the key (this collection, or what `replace` overwrites).
    exists: bool,
    stored_deadline_ms: Option<u64>,
    live_deadline_ms: Option<u64>,
}

/// Opens `key` as a collection of `kind`; `Err` is `WRONGTYPE` (a string, or another
/// kind). A damaged metadata record is an error.
pub(super) fn open(
    kv: &mut dyn Kv,
    key: &[u8],
    kind: Kind,
) -> tucana::Result<Result<Opened, Reply>> {
    let stored = read_stored(kv, key, now_ms())?;
    let live_deadline_ms = stored.deadline_ms();
    let mut packed = None;
    let meta = match &stored.value {
        None => None,
        Some(v) if crate::types::packed::is_packed(v) => {
            if kind != Kind::Hash {
                return Ok(Err(wrongtype()));
            }
            let entries = crate::types::packed::decode(v)?;
            let meta = Meta::packed(entries.len() as u64);
            packed = Some(entries);
            Some(meta)
        }
        Some(v) if crate::types::is_typed(v) => {
            let meta = Meta::decode(v)?;
            if meta.kind != kind {
                return Ok(Err(wrongtype()));
            }
            Some(meta)
        }
        Some(_) => return Ok(Err(wrongtype())),
    };
    Ok(Ok(Opened {
        exists: meta.is_some(),
        meta,
        packed,
        stored_deadline_ms: stored.stored_deadline_ms,
        live_deadline_ms,
    }))
}

/// Opens `key` for a handler that returns `reply` when it is missing; evaluates to the
/// metadata, or returns the reply (or `WRONGTYPE`) from the handler.
macro_rules! open_or {
    ($kv:expr, $key:expr, $kind:expr, $missing:expr) => {
        match super::collection::open($kv, $key, $kind)? {
            Err(reply) => return Ok(reply),
            Ok(opened) => match opened.meta {
                Some(meta) => (opened, meta),
                None => return Ok($missing),
            },
        }
    };
}
pub(super) use open_or;

/// One command's writes to one collection: sub-records, then the metadata (with `count`
/// kept by the caller), applied as one batch.
pub(super) struct Update<'k> {
    key: &'k [u8],
    kind: Kind,
    opened: Opened,
    pub(super) meta: Meta,
    writes: Writes,
    /// The metadata value to write when it is not `meta.encode()` (a packed hash's).
    value: Option<Vec<u8>>,
}

impl<'k> Update<'k> {
    /// Starts the writes of `key`, creating a new version if it is missing.
    pub(super) fn new(key: &'k [u8], opened: Opened, kind: Kind) -> Update<'k> {
        let meta = opened.meta.unwrap_or_else(|| Meta::new(kind));
        Update {
            key,
            kind,
            opened,
            meta,
            writes: Writes::default(),
            value: None,
        }
    }

    /// Starts writes that replace whatever `key` holds (the `*STORE` commands) with a new,
    /// empty collection of `kind` without a deadline: a small old collection's members
    /// are deleted in the same batch, a big one's left to the sweep.
    pub(super) fn replace(
        kv: &mut dyn Kv,
        key: &'k [u8],
        kind: Kind,
    ) -> tucana::Result<Update<'k>> {
        let stored = read_stored(kv, key, now_ms())?;
        let mut writes = Writes::default();
        if let Some(v) = stored
            .value
            .as_deref()
            .filter(|v| crate::types::is_typed(v))
        {
            delete_members(kv, key, v, &mut writes)?;
        }
        Ok(Update {
            key,
            kind,
            opened: Opened {
                meta: None,
                packed: None,
                exists: stored.value.is_some(),
                stored_deadline_ms: stored.stored_deadline_ms,
                live_deadline_ms: None,
            },
            meta: Meta::new(kind),
            writes,
            value: None,
        })
    }

    /// Writes `value` at the key instead of `meta.encode()` (a packed hash, whose fields
    /// are in it; `meta.count` must still say how many).
    pub(super) fn set_value(&mut self, value: Vec<u8>) {
        self.value = Some(value);
    }

    /// The opened key's packed fields (`Opened::packed`), taken out.
    pub(super) fn take_packed(&mut self) -> Option<Pairs> {
        self.opened.packed.take()
    }

    pub(super) fn put(&mut self, family: Family, suffix: &[u8], value: Vec<u8>) {
        self.put_parts(family, &[suffix], value);
    }

    pub(super) fn delete(&mut self, family: Family, suffix: &[u8]) {
        self.delete_parts(family, &[suffix]);
    }

    /// `put` of a suffix given in parts (`sub_key_of_parts`).
    pub(super) fn put_parts(&mut self, family: Family, suffix: &[&[u8]], value: Vec<u8>) {
        let stored = sub_key_of_parts(family, self.key, self.meta.version, suffix);
        self.writes.reserved(stored, Some(value));
    }

    /// `delete` of a suffix given in parts (`sub_key_of_parts`).
    pub(super) fn delete_parts(&mut self, family: Family, suffix: &[&[u8]]) {
        let stored = sub_key_of_parts(family, self.key, self.meta.version, suffix);
        self.writes.reserved(stored, None);
    }

    /// Applies the writes with the metadata: a collection left empty is deleted (with its
    /// deadline), as Redis deletes an emptied key; else it keeps its deadline. A command
    /// that changed nothing of a missing key writes nothing, and one that left an existing
    /// key's metadata as it was writes only its sub-records. Then raises `event` (in the
    /// class of the collection's kind), after `new` if the key was created and before
    /// `del` if it was emptied.
    pub(super) fn apply(self, kv: &mut dyn Kv, event: &'static str) -> tucana::Result<()> {
        let (writes, events) = self.finish(kv.notify_flags(), Some(event));
        writes.apply(kv)?;
        events.raise(kv);
        Ok(())
    }

    /// `apply` for the `*STORE` commands: an empty result raises no event of its own
    /// (only `del`, when it replaced a key), as in Redis.
    pub(super) fn apply_store(self, kv: &mut dyn Kv, event: &'static str) -> tucana::Result<()> {
        let event = (self.meta.count > 0).then_some(event);
        let (writes, events) = self.finish(kv.notify_flags(), event);
        writes.apply(kv)?;
        events.raise(kv);
        Ok(())
    }

    /// The writes `apply` would apply, and the events it would raise after them (none
    /// unless `flags`, `Kv::notify_flags`, has a class on), to apply two collections'
    /// updates as one batch (SMOVE, LMOVE).
    pub(super) fn finish(mut self, flags: u32, event: Option<&'static str>) -> (Writes, Events) {
        let mut events = Events::default();
        let existed = self.opened.exists;
        let emptied = self.meta.count == 0;
        if flags != 0 {
            if !existed && !emptied {
                events.add(crate::notify::NEW, "new", self.key);
            }
            if let Some(event) = event {
                events.add(class_of(self.kind), event, self.key);
            }
            if existed && emptied {
                events.add(crate::notify::GENERIC, "del", self.key);
            }
        }
        let stored_deadline = self.opened.stored_deadline_ms;
        // The key's version goes on (or there was nothing at the key): every sub-record
        // it drops is deleted in these writes. Else (a new version over an expired or
        // replaced key, or a packed hash turned per-field) an old one may be abandoned.
        let same_version = match &self.opened.meta {
            Some(old) => old.version == self.meta.version,
            None => !existed && stored_deadline.is_none(),
        };
        if emptied {
            if same_version && (existed || stored_deadline.is_some()) {
                self.writes.delete_emptied(self.key, stored_deadline);
            } else if !same_version {
                self.writes.delete(self.key, stored_deadline);
            }
        } else if self.value.is_none()
            && self.opened.meta == Some(self.meta)
            && stored_deadline == self.opened.live_deadline_ms
        {
            // The metadata stays as stored (a score changed, a field or an element
            // overwritten, or nothing at all): it is not written again. Sub-records
            // written are the change, and mark the key modified as its write would.
            if !self.writes.is_empty() {
                self.writes.touch(self.key);
            }
        } else {
            let value = match self.value.take() {
                Some(value) => value,
                None => self.meta.encode(),
            };
            let live_deadline = self.opened.live_deadline_ms;
            if same_version {
                self.writes
                    .put_same_version(self.key, value, stored_deadline, live_deadline);
            } else {
                self.writes
                    .put(self.key, value, stored_deadline, live_deadline);
            }
        }
        (self.writes, events)
    }
}

/// The keyspace notification class of a collection kind's commands.
pub(super) fn class_of(kind: Kind) -> u32 {
    match kind {
        Kind::Hash => crate::notify::HASH,
        Kind::Set => crate::notify::SET,
        Kind::ZSet => crate::notify::ZSET,
        Kind::List => crate::notify::LIST,
    }
}

/// Keyspace notifications of a command, raised in order once its writes are applied
/// (empty, and allocation-free, while notifications are off).
#[derive(Default)]
pub(super) struct Events(Vec<(u32, &'static str, Vec<u8>)>);

impl Events {
    pub(super) fn add(&mut self, class: u32, event: &'static str, key: &[u8]) {
        self.0.push((class, event, key.to_vec()));
    }

    /// Adds `other`'s events after these.
    pub(super) fn append(&mut self, other: Events) {
        self.0.extend(other.0);
    }

    pub(super) fn raise(self, kv: &mut dyn Kv) {
        for (class, event, key) in self.0 {
            kv.notify(class, event, &key);
        }
    }
}

/// Bounds on sub-record suffixes (field, member, encoded score or index).
pub(super) type SuffixBounds<'a> = (Bound<&'a [u8]>, Bound<&'a [u8]>);

/// Sub-records of one version of `key` in `family` whose suffix is within `bounds`, in
/// order (`rev`: descending), at most `limit`; the suffixes with their values.
pub(super) fn members(
    kv: &mut dyn Kv,
    family: Family,
    key: &[u8],
    version: u64,
    (lo, hi): SuffixBounds<'_>,
    rev: bool,
    limit: usize,
) -> tucana::Result<Pairs> {
    let prefix = sub_prefix(family, key, version);
    let with = |s: &[u8]| [prefix.as_slice(), s].concat();
    let lo = match lo {
        Bound::Included(s) => Bound::Included(with(s)),
        Bound::Excluded(s) => Bound::Excluded(with(s)),
        Bound::Unbounded => Bound::Included(prefix.clone()),
    };
    let hi = match hi {
        Bound::Included(s) => Bound::Included(with(s)),
        Bound::Excluded(s) => Bound::Excluded(with(s)),
        Bound::Unbounded => super::prefix_end(&prefix),
    };
    let mut pairs = kv.range((lo, hi), rev, limit)?;
    // Each suffix in its key's own buffer: no allocation per pair.
    for (k, _) in &mut pairs {
        k.drain(..prefix.len());
    }
    Ok(pairs)
}

/// Every sub-record of a version in `family`, in order.
pub(super) fn all_members(
    kv: &mut dyn Kv,
    family: Family,
    key: &[u8],
    version: u64,
) -> tucana::Result<Pairs> {
    members(
        kv,
        family,
        key,
        version,
        (Bound::Unbounded, Bound::Unbounded),
        false,
        usize::MAX,
    )
}

/// Collections up to this many members are deleted with their key (DEL, overwrite);
/// bigger ones leave their sub-records to the sweep of old versions, so a DEL stays
/// O(1) in records written.
pub(super) const DELETE_INLINE_MAX: u64 = 128;

/// DEL's part for a typed value: deletes a small collection's sub-records in the batch
/// of `writes`.
pub(super) fn delete_members(
    kv: &mut dyn Kv,
    key: &[u8],
    value: &[u8],
    writes: &mut Writes,
) -> tucana::Result<()> {
    // Damaged metadata names no version to delete: DEL still deletes the key (what the
    // client asked), and its records are left to the collector.
    let Ok(meta) = Meta::decode(value) else {
        return Ok(());
    };
    // A packed hash has no sub-records: deleting its value deletes it all.
    if meta.packed || meta.count > DELETE_INLINE_MAX {
        return Ok(());
    }
    for &family in Family::of(meta.kind) {
        for (suffix, _) in all_members(kv, family, key, meta.version)? {
            writes.reserved(sub_key(family, key, meta.version, &suffix), None);
        }
    }
    Ok(())
}

/// OBJECT ENCODING of a collection: the encoding Redis 7.0 would give a collection of
/// this size and content under the thresholds set with CONFIG SET (hashes and sorted
/// sets: `listpack` while small, sets of integers: `intset`). A hash of the per-field
/// layout (`hashes`) answers `hashtable`, as Redis's converted hashes do (never back); a
/// packed one `listpack` unless its size or a field or value is past Redis's thresholds
/// (tucana packs up to 128 fields and 4 KiB, Redis's default value bound is 64 bytes).
/// Sorted sets are stored alike at every size; unlike Redis, which never converts back,
/// one that shrinks answers the small encoding again. Reads the members only of a small
/// collection.
pub(super) fn redis_encoding(
    kv: &mut dyn Kv,
    key: &[u8],
    meta: &Meta,
) -> tucana::Result<&'static str> {
    let threshold = |name: &str| u64::try_from(kv.settings().threshold(name)).unwrap_or(0);
    let fits = |kv: &mut dyn Kv, family: Family, max_len: u64| {
        let all = all_members(kv, family, key, meta.version)?;
        Ok::<bool, tucana::Error>(all.iter().all(|(m, _)| m.len() as u64 <= max_len))
    };
    Ok(match meta.kind {
        Kind::Hash if meta.packed => {
            let (entries, value) = (
                threshold("hash-max-listpack-entries"),
                threshold("hash-max-listpack-value"),
            );
            let short = |b: &[u8]| b.len() as u64 <= value;
            let small = meta.count <= entries
                && match kv.lookup(key)? {
                    Some(v) if crate::types::packed::is_packed(&v) => {
                        crate::types::packed::parse(&v)?
                            .iter()
                            .all(|(f, v)| short(f) && short(v))
                    }
                    _ => false,
                };
            if small {
                "listpack"
            } else {
                "hashtable"
            }
        }
        Kind::Hash => "hashtable",
        Kind::ZSet => {
            let (entries, value) = (
                threshold("zset-max-listpack-entries"),
                threshold("zset-max-listpack-value"),
            );
            if meta.count <= entries && fits(kv, Family::ZMember, value)? {
                "listpack"
            } else {
                "skiplist"
            }
        }
        Kind::Set => {
            let integers = meta.count <= threshold("set-max-intset-entries")
                && all_members(kv, Family::Set, key, meta.version)?
                    .iter()
                    .all(|(m, _)| super::parse_i64(m).is_some());
            if integers {
                "intset"
            } else {
                "hashtable"
            }
        }
        Kind::List => "quicklist",
    })
}

/// A float as Redis 7.0 replies one (`%.17g`; `inf`, `-inf`, `-0`).
pub(super) fn format_double(d: f64) -> String {
    if d.is_nan() {
        return "nan".into();
    }
    if d.is_infinite() {
        return if d > 0.0 { "inf" } else { "-inf" }.into();
    }
    if d == 0.0 {
        return if d.is_sign_negative() { "-0" } else { "0" }.into();
    }
    // 17 significant digits, then %g's choice between fixed and exponent forms.
    let sci = format!("{d:.16e}");
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("{:e}'s exponent is an integer");
    if !(-4..17).contains(&exp) {
        let mantissa = trim_zeros(mantissa);
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exp.abs());
    }
    let decimals = (16 - exp).max(0) as usize;
    trim_zeros(&format!("{d:.decimals$}")).to_string()
}

/// `1.500` → `1.5`, `2.000` → `2` (only when there is a decimal point).
fn trim_zeros(s: &str) -> &str {
    if !s.contains('.') {
        return s;
    }
    s.trim_end_matches('0').trim_end_matches('.')
}

/// A float argument as Redis reads one (`strtod`, whole argument, no spaces, no NaN).
pub(super) fn parse_double(arg: &[u8]) -> Option<f64> {
    if let Some(d) = parse_small_integer(arg) {
        return Some(d);
    }
    let s = std::str::from_utf8(arg).ok()?;
    if s.is_empty() || s.starts_with(|c: char| c.is_whitespace()) {
        return None;
    }
    let lower = s.to_ascii_lowercase();
    let d = match lower.trim_start_matches(['+', '-']) {
        "inf" | "infinity" => {
            if lower.starts_with('-') {
                f64::NEG_INFINITY
            } else {
                f64::INFINITY
            }
        }
        _ if lower.contains("inf") || lower.contains("nan") => return None,
        _ => s.parse().ok()?,
    };
    (!d.is_nan()).then_some(d)
}

/// `parse_double`'s common case without allocating: a sign and up to 15 decimal digits
/// (scores such as `1700000000`, redis-benchmark's), which an `f64` holds exactly, so the
/// result is `strtod`'s (`-0` included). `None`: anything else, left to the full parse.
fn parse_small_integer(arg: &[u8]) -> Option<f64> {
    let (negative, digits) = match arg {
        [b'-', rest @ ..] => (true, rest),
        [b'+', rest @ ..] => (false, rest),
        _ => (false, arg),
    };
    if digits.is_empty() || digits.len() > 15 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits
        .iter()
        .fold(0u64, |n, &d| n * 10 + u64::from(d - b'0'));
    let d = n as f64;
    Some(if negative { -d } else { d })
}

/// A float reply: a RESP3 double, a bulk string in RESP2.
pub(super) fn double_reply(d: f64) -> Reply {
    Reply::Double(format_double(d))
}

/// A small random number generator for HRANDFIELD, SRANDMEMBER, SPOP (xorshift seeded from
/// the clock: the picks need no more than to vary).
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new() -> Rng {
        Rng(crate::types::next_version() | 1)
    }

    /// A number in `0..n` (`n` > 0).
    pub(super) fn below(&mut self, n: usize) -> usize {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        (x % n as u64) as usize
    }
}

/// Indexes into `n` members for a random pick of `count` (see HRANDFIELD): `None` one,
/// positive distinct ones, negative with repeats.
pub(super) fn random_picks(n: usize, count: Option<i64>) -> Vec<usize> {
    let mut rng = Rng::new();
    if n == 0 {
        return Vec::new();
    }
    match count {
        None => vec![rng.below(n)],
        Some(c) if c < 0 => (0..c.unsigned_abs()).map(|_| rng.below(n)).collect(),
        Some(c) => {
            let mut all: Vec<usize> = (0..n).collect();
            let take = (c as u64).min(n as u64) as usize;
            for i in 0..take {
                let j = i + rng.below(n - i);
                all.swap(i, j);
            }
            all.truncate(take);
            all
        }
    }
}

/// Collections up to this many members are picked from uniformly (every member read);
/// bigger ones from random points of their range (O(picks) records, not O(n)).
pub(super) const UNIFORM_PICK_MAX: u64 = 512;

/// Random members of one version of a collection for HRANDFIELD, SRANDMEMBER and SPOP
/// (`count` as in HRANDFIELD: `None` one, positive distinct ones, negative with
/// repeats). A big collection's picks start at a random point between its first and last
/// member and take the members that follow (wrapping to the first): not uniform (a member
/// after a wide gap is picked more often), as Kvrocks also trades it for speed.
pub(super) fn random_members(
    kv: &mut dyn Kv,
    family: Family,
    key: &[u8],
    meta: &Meta,
    count: Option<i64>,
) -> tucana::Result<Pairs> {
    if meta.count <= UNIFORM_PICK_MAX {
        let all = all_members(kv, family, key, meta.version)?;
        let picks = random_picks(all.len(), count);
        return Ok(picks.into_iter().map(|i| all[i].clone()).collect());
    }
    let ends = |kv: &mut dyn Kv, rev: bool| {
        members(
            kv,
            family,
            key,
            meta.version,
            (Bound::Unbounded, Bound::Unbounded),
            rev,
            1,
        )
    };
    let (first, last) = (ends(kv, false)?, ends(kv, true)?);
    let (Some((first, _)), Some((last, _))) = (first.first(), last.first()) else {
        return Ok(Vec::new());
    };
    let mut rng = Rng::new();
    // `take` members from one random point (`runs` times).
    let (runs, take) = match count {
        None => (1, 1),
        Some(c) if c < 0 => (c.unsigned_abs(), 1),
        Some(c) => (1, (c as u64).min(meta.count)),
    };
    let mut out = Vec::new();
    for _ in 0..runs {
        let start = random_between(&mut rng, first, last);
        let mut run = members(
            kv,
            family,
            key,
            meta.version,
            (Bound::Included(start.as_slice()), Bound::Unbounded),
            false,
            take as usize,
        )?;
        if (run.len() as u64) < take {
            let more = members(
                kv,
                family,
                key,
                meta.version,
                (Bound::Unbounded, Bound::Excluded(start.as_slice())),
                false,
                take as usize - run.len(),
            )?;
            run.extend(more);
        }
        out.extend(run);
    }
    Ok(out)
}

/// A byte string between `lo` and `hi` (`lo` <= `hi`): their common prefix, a random
/// byte between theirs at the first difference, then random bytes.
pub(super) fn random_between(rng: &mut Rng, lo: &[u8], hi: &[u8]) -> Vec<u8> {
    let common = lo.iter().zip(hi).take_while(|(a, b)| a == b).count();
    let mut out = lo[..common].to_vec();
    let from = lo.get(common).copied().unwrap_or(0) as usize;
    let to = hi.get(common).copied().unwrap_or(255) as usize;
    out.push((from + rng.below(to.saturating_sub(from) + 1)) as u8);
    for _ in 0..4 {
        out.push(rng.below(256) as u8);
    }
    out
}

/// A `*SCAN key cursor [MATCH pattern] [COUNT n]` request: the pattern, or the reply to
/// a bad one. Every member is returned in one reply with cursor 0 (COUNT is a hint, as
/// Redis treats it for small collections).
pub(super) fn scan_options(args: &[Vec<u8>]) -> Result<Option<Vec<u8>>, Reply> {
    if super::parse_u64_cursor(&args[2]).is_none() {
        return Err(Reply::error("ERR invalid cursor"));
    }
    let mut pattern = None;
    let mut i = 3;
    while i < args.len() {
        match (args[i].to_ascii_uppercase().as_slice(), args.get(i + 1)) {
            (b"MATCH", Some(p)) => pattern = Some(p.clone()),
            (b"COUNT", Some(n)) => match super::parse_i64(n) {
                Some(n) if n >= 1 => {}
                Some(_) => return Err(super::syntax_error()),
                None => return Err(super::not_an_integer()),
            },
            _ => return Err(super::syntax_error()),
        }
        i += 2;
    }
    Ok(pattern)
}

/// The reply of a `*SCAN` that returned everything.
pub(super) fn scan_reply(items: Vec<Reply>) -> Reply {
    Reply::Array(vec![Reply::Bulk(b"0".to_vec()), Reply::Array(items)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_print_as_redis_prints_them() {
        for (d, want) in [
            (1.0, "1"),
            (1.5, "1.5"),
            (-2.25, "-2.25"),
            (0.1, "0.10000000000000001"),
            (1e17, "1e+17"),
            (1.5e-5, "1.5e-05"),
            (1.0 / 3.0, "0.33333333333333331"),
            (0.0001, "0.0001"),
            (123456789.0, "123456789"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
            (-0.0, "-0"),
            (3.0e300, "3.0000000000000002e+300"),
        ] {
            assert_eq!(format_double(d), want, "{d}");
        }
    }

    #[test]
    fn doubles_parse_as_redis_reads_them() {
        assert_eq!(parse_double(b"1.5"), Some(1.5));
        assert_eq!(parse_double(b"-inf"), Some(f64::NEG_INFINITY));
        assert_eq!(parse_double(b"+inf"), Some(f64::INFINITY));
        assert_eq!(parse_double(b"1e3"), Some(1000.0));
        for bad in [
            &b""[..],
            b" 1",
            b"1 ",
            b"nan",
            b"abc",
            b"1.5x",
            b"infx",
            b"-",
            b"+",
            b"--1",
            b"1-",
        ] {
            assert_eq!(
                parse_double(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    /// The integer fast path must give exactly what the full parse gives, bit for bit
    /// (`-0` is negative zero), at every length it takes and just past it.
    #[test]
    fn integer_scores_parse_as_the_full_parse_does() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut cases: Vec<String> = ["0", "-0", "+0", "007", "-000", "999999999999999"]
            .map(String::from)
            .to_vec();
        cases.push("1".repeat(16));
        cases.push(format!("-{}", "9".repeat(17)));
        for _ in 0..10_000 {
            let digits = 1 + rng.below(17);
            let sign = ["", "-", "+"][rng.below(3)];
            let n: String = (0..digits)
                .map(|_| char::from(b'0' + rng.below(10) as u8))
                .collect();
            cases.push(format!("{sign}{n}"));
        }
        for case in cases {
            let want: f64 = case.parse().unwrap();
            let got = parse_double(case.as_bytes()).unwrap();
            assert_eq!(got.to_bits(), want.to_bits(), "{case}");
        }
    }
}
