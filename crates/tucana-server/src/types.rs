//! The stored layout of Redis's collection types (hashes, sets, sorted sets, lists) on the
//! ordered keyspace (DESIGN.md, "Data types"): a metadata record at the client's key and
//! one ordered sub-record per field, member or element in the reserved key family.
//!
//! Owns the encoding and decoding of those records: the metadata value
//! `R 'T' kind version count [head tail]`, the sub-record keys
//! `R family key-len key version suffix`, the order-preserving encoding of scores, and the
//! allocation of versions; the packed layout of small hashes is [`packed`]'s. Decoders of what was read from disk return an error on damage,
//! never panic. It does not own what the commands do with the records
//! (`commands::collection` and the handlers) nor the reserved prefix (`expiry`).
//!
//! Thread-safety: pure functions, and one atomic counter for versions.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::expiry::RESERVED;

pub mod packed;

/// What a collection's metadata value starts with: a string value may not (the string
/// commands refuse it), so a value at a client's key is metadata exactly when it does.
pub const TYPED: &[u8] = b"\xff\xfftucana\x00T";

/// The kind of a collection (the byte after [`TYPED`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Hash,
    Set,
    ZSet,
    List,
}

impl Kind {
    fn byte(self) -> u8 {
        match self {
            Kind::Hash => b'h',
            Kind::Set => b's',
            Kind::ZSet => b'z',
            Kind::List => b'l',
        }
    }

    fn from_byte(b: u8) -> Option<Kind> {
        Some(match b {
            b'h' => Kind::Hash,
            b's' => Kind::Set,
            b'z' => Kind::ZSet,
            b'l' => Kind::List,
            _ => return None,
        })
    }

    /// TYPE's answer (and SCAN's `TYPE` filter's name).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Hash => "hash",
            Kind::Set => "set",
            Kind::ZSet => "zset",
            Kind::List => "list",
        }
    }

    /// OBJECT ENCODING's answer: the name Redis gives its encoding for big collections
    /// (which ours behave like: every member is its own record).
    pub fn encoding(self) -> &'static str {
        match self {
            Kind::Hash | Kind::Set => "hashtable",
            Kind::ZSet => "skiplist",
            Kind::List => "quicklist",
        }
    }
}

/// Where a list's elements start: indexes are `u64`, the first push lands here, so a list
/// can grow 2^63 elements either way.
pub const LIST_MIDDLE: u64 = 1 << 63;

/// A collection's metadata.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Meta {
    pub kind: Kind,
    /// Names this incarnation of the key: sub-records of another version are garbage.
    pub version: u64,
    /// Fields, members or elements.
    pub count: u64,
    /// Lists: the index of the first element and one past the last (others: 0).
    pub head: u64,
    pub tail: u64,
    /// A packed hash ([`packed`]): its fields are in its value, it has no sub-records and
    /// its `version` is 0, which no sub-record has ([`next_version`] never returns it),
    /// so a walk of its version's sub-records finds none.
    pub packed: bool,
}

impl Meta {
    /// A new, empty collection with a fresh version.
    pub fn new(kind: Kind) -> Meta {
        Meta {
            kind,
            version: next_version(),
            count: 0,
            head: LIST_MIDDLE,
            tail: LIST_MIDDLE,
            packed: false,
        }
    }

    /// The per-field layout's metadata value. A packed hash's value is
    /// [`packed::encode`]'s: asking this for it is a programmer error.
    pub fn encode(&self) -> Vec<u8> {
        assert!(!self.packed, "a packed hash's value is packed::encode's");
        let mut out = Vec::with_capacity(TYPED.len() + 33);
        out.extend_from_slice(TYPED);
        out.push(self.kind.byte());
        out.extend_from_slice(&self.version.to_be_bytes());
        out.extend_from_slice(&self.count.to_be_bytes());
        if self.kind == Kind::List {
            out.extend_from_slice(&self.head.to_be_bytes());
            out.extend_from_slice(&self.tail.to_be_bytes());
        }
        out
    }

    /// The metadata in a value that starts with [`TYPED`]; anything else is damage. A
    /// packed hash's whole value is checked ([`packed::parse`]).
    pub fn decode(bytes: &[u8]) -> tucana::Result<Meta> {
        if packed::is_packed(bytes) {
            let count = packed::parse(bytes)?.len() as u64;
            return Ok(Meta::packed(count));
        }
        let rest = bytes
            .strip_prefix(TYPED)
            .ok_or_else(|| damaged("metadata record", bytes))?;
        let (&kind, rest) = rest
            .split_first()
            .ok_or_else(|| damaged("metadata record", bytes))?;
        let kind = Kind::from_byte(kind).ok_or_else(|| damaged("metadata record", bytes))?;
        let want = if kind == Kind::List { 32 } else { 16 };
        if rest.len() != want {
            return Err(damaged("metadata record", bytes));
        }
        let word = |i: usize| u64::from_be_bytes(rest[i * 8..i * 8 + 8].try_into().unwrap());
        let (head, tail) = if kind == Kind::List {
            (word(2), word(3))
        } else {
            (LIST_MIDDLE, LIST_MIDDLE)
        };
        if kind == Kind::List && tail.checked_sub(head) != Some(word(1)) {
            return Err(damaged("list metadata record", bytes));
        }
        Ok(Meta {
            kind,
            version: word(0),
            count: word(1),
            head,
            tail,
            packed: false,
        })
    }

    /// The metadata of a packed hash of `count` fields.
    pub fn packed(count: u64) -> Meta {
        Meta {
            kind: Kind::Hash,
            version: 0,
            count,
            head: LIST_MIDDLE,
            tail: LIST_MIDDLE,
            packed: true,
        }
    }
}

/// Whether a stored value is a collection's metadata (else it is a string).
pub fn is_typed(value: &[u8]) -> bool {
    value.starts_with(TYPED)
}

/// The kind of a typed value, if its kind byte is known (a packed hash is a hash).
pub fn kind_of(value: &[u8]) -> Option<Kind> {
    value
        .strip_prefix(TYPED)
        .and_then(|r| r.first())
        .and_then(|&b| match b {
            packed::KIND_BYTE => Some(Kind::Hash),
            b => Kind::from_byte(b),
        })
}

/// The sub-record families.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Hash: field → value.
    Hash,
    /// Set: member → empty.
    Set,
    /// Sorted set: member → score (8 bytes, `f64` bits big-endian).
    ZMember,
    /// Sorted set: score (order-preserving, 8 bytes) member → empty.
    ZScore,
    /// List: index (8 bytes big-endian) → element.
    List,
}

impl Family {
    fn byte(self) -> u8 {
        match self {
            Family::Hash => b'H',
            Family::Set => b'S',
            Family::ZMember => b'Z',
            Family::ZScore => b'O',
            Family::List => b'L',
        }
    }

    /// The families a collection of `kind` has.
    pub fn of(kind: Kind) -> &'static [Family] {
        match kind {
            Kind::Hash => &[Family::Hash],
            Kind::Set => &[Family::Set],
            Kind::ZSet => &[Family::ZMember, Family::ZScore],
            Kind::List => &[Family::List],
        }
    }
}

/// The prefix of every sub-record of one version of `key` in `family`:
/// `R family key-len(4 bytes BE) key version(8 bytes BE)`.
pub fn sub_prefix(family: Family, key: &[u8], version: u64) -> Vec<u8> {
    sub_prefix_with_room(family, key, version, 16)
}

/// [`sub_prefix`] in a vector with room for `room` more bytes.
fn sub_prefix_with_room(family: Family, key: &[u8], version: u64, room: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(RESERVED.len() + 13 + key.len() + room);
    out.extend_from_slice(RESERVED);
    out.push(family.byte());
    out.extend_from_slice(&(key.len() as u32).to_be_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(&version.to_be_bytes());
    out
}

/// A sub-record's key: its version's prefix and `suffix` (field, member, index, ...), in
/// one allocation of its exact size (a sorted set's score suffixes and long members used
/// to grow it a second time).
pub fn sub_key(family: Family, key: &[u8], version: u64, suffix: &[u8]) -> Vec<u8> {
    sub_key_of_parts(family, key, version, &[suffix])
}

/// [`sub_key`] of a suffix given in parts (a sorted set's score entry: the score's order
/// bytes, then the member), joined in the key's one allocation.
pub fn sub_key_of_parts(family: Family, key: &[u8], version: u64, parts: &[&[u8]]) -> Vec<u8> {
    let room = parts.iter().map(|p| p.len()).sum();
    let mut out = sub_prefix_with_room(family, key, version, room);
    for part in parts {
        out.extend_from_slice(part);
    }
    out
}

/// A sub-record key's parts: family, the client's key, version, suffix.
pub type SubKey<'a> = (Family, &'a [u8], u64, &'a [u8]);

/// The parts of a stored sub-record key (for the collector of old versions), `None` when
/// `stored` is not a sub-record; a truncated one is damage.
pub fn split_sub_key(stored: &[u8]) -> tucana::Result<Option<SubKey<'_>>> {
    let Some(rest) = stored.strip_prefix(RESERVED) else {
        return Ok(None);
    };
    let Some((&b, rest)) = rest.split_first() else {
        return Ok(None);
    };
    let family = match b {
        b'H' => Family::Hash,
        b'S' => Family::Set,
        b'Z' => Family::ZMember,
        b'O' => Family::ZScore,
        b'L' => Family::List,
        _ => return Ok(None),
    };
    let bad = || damaged("sub-record key", stored);
    let (len, rest) = rest.split_first_chunk::<4>().ok_or_else(bad)?;
    let len = u32::from_be_bytes(*len) as usize;
    if rest.len() < len + 8 {
        return Err(bad());
    }
    let (key, rest) = rest.split_at(len);
    let (version, suffix) = rest.split_first_chunk::<8>().ok_or_else(bad)?;
    Ok(Some((family, key, u64::from_be_bytes(*version), suffix)))
}

/// A score as 8 bytes whose byte order is the numeric order (-inf first, +inf last);
/// -0 is stored as 0, which Redis orders equal to it.
pub fn score_order(score: f64) -> [u8; 8] {
    let score = if score == 0.0 { 0.0 } else { score };
    let bits = score.to_bits();
    let ordered = if bits >> 63 == 1 {
        !bits
    } else {
        bits | (1 << 63)
    };
    ordered.to_be_bytes()
}

/// The score of [`score_order`]'s bytes; a wrong length is damage.
pub fn score_from_order(bytes: &[u8]) -> tucana::Result<f64> {
    let b: [u8; 8] = bytes
        .try_into()
        .map_err(|_| damaged("score index entry", bytes))?;
    let ordered = u64::from_be_bytes(b);
    let bits = if ordered >> 63 == 1 {
        ordered & !(1 << 63)
    } else {
        !ordered
    };
    Ok(f64::from_bits(bits))
}

/// A score as a member record's value.
pub fn encode_score(score: f64) -> [u8; 8] {
    score.to_bits().to_be_bytes()
}

/// A member record's score; a wrong length or a NaN is damage.
pub fn decode_score(bytes: &[u8]) -> tucana::Result<f64> {
    let b: [u8; 8] = bytes
        .try_into()
        .map_err(|_| damaged("sorted set member record", bytes))?;
    let score = f64::from_bits(u64::from_be_bytes(b));
    if score.is_nan() {
        return Err(damaged("sorted set member record", bytes));
    }
    Ok(score)
}

/// A list element's index from the suffix of its key; a wrong length is damage.
pub fn decode_index(suffix: &[u8]) -> tucana::Result<u64> {
    let b: [u8; 8] = suffix
        .try_into()
        .map_err(|_| damaged("list element key", suffix))?;
    Ok(u64::from_be_bytes(b))
}

static LAST_VERSION: AtomicU64 = AtomicU64::new(0);

/// A version no earlier incarnation of any key has: the wall clock in microseconds, or
/// one more than the last one handed out if that is later. Across a restart the clock
/// has moved on (a clock set back by more than the process's downtime could reuse a
/// version, see DESIGN.md).
pub fn next_version() -> u64 {
    let now_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    let mut last = LAST_VERSION.load(Ordering::Relaxed);
    loop {
        let next = now_us.max(last + 1);
        match LAST_VERSION.compare_exchange_weak(last, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(seen) => last = seen,
        }
    }
}

fn damaged(what: &str, bytes: &[u8]) -> tucana::Error {
    tucana::Error::InvalidArgument(format!(
        "damaged {what} of a collection ({} bytes)",
        bytes.len()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_round_trips_and_damage_is_an_error() {
        for kind in [Kind::Hash, Kind::Set, Kind::ZSet, Kind::List] {
            let mut meta = Meta::new(kind);
            meta.count = 3;
            if kind == Kind::List {
                meta.head = LIST_MIDDLE - 1;
                meta.tail = LIST_MIDDLE + 2;
            }
            let bytes = meta.encode();
            assert!(is_typed(&bytes));
            assert_eq!(kind_of(&bytes), Some(kind));
            assert_eq!(Meta::decode(&bytes).unwrap(), meta);
            for cut in 0..bytes.len() {
                assert!(
                    Meta::decode(&bytes[..cut]).is_err(),
                    "{kind:?} cut at {cut}"
                );
            }
        }
        let mut list = Meta::new(Kind::List);
        list.count = 5; // but head == tail
        assert!(Meta::decode(&list.encode()).is_err());
        assert!(Meta::decode(b"\xff\xfftucana\x00Tq0123456789abcdef").is_err());
    }

    #[test]
    fn score_order_is_numeric_order() {
        let scores = [
            f64::NEG_INFINITY,
            -1e300,
            -2.5,
            -1.0,
            -f64::MIN_POSITIVE,
            0.0,
            f64::MIN_POSITIVE,
            1.0,
            1.5,
            1e300,
            f64::INFINITY,
        ];
        for w in scores.windows(2) {
            assert!(score_order(w[0]) < score_order(w[1]), "{} < {}", w[0], w[1]);
        }
        for s in scores {
            assert_eq!(score_from_order(&score_order(s)).unwrap(), s);
        }
        assert_eq!(score_order(-0.0), score_order(0.0));
        assert!(decode_score(&encode_score(f64::NAN)).is_err());
        assert!(decode_score(b"1234567").is_err());
    }

    #[test]
    fn sub_keys_split_back_and_keep_one_version_together() {
        let k = sub_key(Family::Hash, b"user:1", 7, b"name");
        let (f, key, v, suffix) = split_sub_key(&k).unwrap().unwrap();
        assert_eq!(
            (f, key, v, suffix),
            (Family::Hash, &b"user:1"[..], 7, &b"name"[..])
        );
        assert!(k.starts_with(&sub_prefix(Family::Hash, b"user:1", 7)));
        // A key that is a prefix of another cannot share its sub-records' prefix.
        assert!(
            !sub_key(Family::Hash, b"user:10", 7, b"").starts_with(&sub_prefix(
                Family::Hash,
                b"user:1",
                7
            ))
        );
        assert!(split_sub_key(&k[..RESERVED.len() + 3]).is_err());
        assert_eq!(split_sub_key(b"plain").unwrap(), None);
        assert!(next_version() < next_version());
    }
}
