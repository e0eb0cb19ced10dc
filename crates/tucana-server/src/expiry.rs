//! The stored layout of key deadlines (DESIGN.md, "Expiry"): the reserved key family, in
//! the same keyspace as the keys, that holds each key's deadline and the index of
//! deadlines, and the clock deadlines are compared with.
//!
//! Owns the reserved prefix and the encoding of its records: the deadline record
//! `R 'd' key` (8 bytes, big-endian unix milliseconds), the index entry
//! `R 'i' deadline key` (empty; key order is deadline order) and the marker `R 'm'`, whose
//! presence says the keyspace may hold deadlines. It does not own what the commands do
//! with deadlines (`commands::expire`) nor the background deletion (`sweeper`).
//!
//! Thread-safety: constants and pure functions.

use std::time::{SystemTime, UNIX_EPOCH};

/// The reserved prefix: a client's key may not start with it (`commands::execute`).
pub const RESERVED: &[u8] = b"\xff\xfftucana\x00";
/// Written (unprefixed by a cluster slot) in the batch that writes a keyspace's first
/// deadline; a keyspace without it has no deadlines, which keeps reads of databases that
/// never used expiry free of deadline lookups.
pub const MARKER: &[u8] = b"\xff\xfftucana\x00m";

const DEADLINE: u8 = b'd';
const INDEX: u8 = b'i';

/// Whether a client's key falls in the reserved family.
pub fn is_reserved(key: &[u8]) -> bool {
    key.starts_with(RESERVED)
}

/// The key of `key`'s deadline record.
pub fn deadline_key(key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(RESERVED.len() + 1 + key.len());
    out.extend_from_slice(RESERVED);
    out.push(DEADLINE);
    out.extend_from_slice(key);
    out
}

/// Whether `stored` is a deadline record's key (`R 'd' key`, unprefixed by a slot).
pub fn is_deadline_key(stored: &[u8]) -> bool {
    stored.len() > RESERVED.len()
        && stored.starts_with(RESERVED)
        && stored[RESERVED.len()] == DEADLINE
}

/// The prefix of every index entry.
pub fn index_prefix() -> Vec<u8> {
    let mut out = RESERVED.to_vec();
    out.push(INDEX);
    out
}

/// The index entry of `key` expiring at `deadline_ms`.
pub fn index_key(deadline_ms: u64, key: &[u8]) -> Vec<u8> {
    let mut out = index_prefix();
    out.extend_from_slice(&deadline_ms.to_be_bytes());
    out.extend_from_slice(key);
    out
}

/// The deadline and key of an index entry; a damaged one is an error.
pub fn split_index_key(stored: &[u8]) -> tucana::Result<(u64, &[u8])> {
    let rest = stored
        .strip_prefix(index_prefix().as_slice())
        .ok_or_else(|| damaged("index entry", stored))?;
    let (deadline, key) = rest
        .split_first_chunk::<8>()
        .ok_or_else(|| damaged("index entry", stored))?;
    Ok((u64::from_be_bytes(*deadline), key))
}

pub fn encode_deadline(deadline_ms: u64) -> Vec<u8> {
    deadline_ms.to_be_bytes().to_vec()
}

/// A deadline record's value; anything but 8 bytes is a damaged record (an error).
pub fn decode_deadline(bytes: &[u8]) -> tucana::Result<u64> {
    match <[u8; 8]>::try_from(bytes) {
        Ok(b) => Ok(u64::from_be_bytes(b)),
        Err(_) => Err(damaged("deadline record", bytes)),
    }
}

fn damaged(what: &str, bytes: &[u8]) -> tucana::Error {
    tucana::Error::InvalidArgument(format!(
        "damaged {what} in the reserved key family ({} bytes)",
        bytes.len()
    ))
}

/// The client's key (stored form) that writing the stored key `stored` modifies, for
/// WATCH: a deadline record modifies its key, index entries and the marker none, any
/// other key itself. `slot_prefixed`: cluster mode, where a stored key is `slot key`.
pub fn modified_key(stored: &[u8], slot_prefixed: bool) -> Option<Vec<u8>> {
    let (prefix, rest) = if slot_prefixed && stored.len() >= 2 {
        stored.split_at(2)
    } else {
        stored.split_at(0)
    };
    match rest.strip_prefix(RESERVED) {
        None => Some(stored.to_vec()),
        Some([DEADLINE, key @ ..]) => Some([prefix, key].concat()),
        Some(_) => None,
    }
}

/// Whether the (unprefixed) `key` is live in `ks` at `now_ms`: stored, and its deadline,
/// if any, not passed. An error reads as live (the caller then treats the key as
/// present, which for WATCH is the safe side: EXEC aborts).
pub fn live_in(ks: &tucana::Keyspace, key: &[u8], now_ms: u64) -> bool {
    match ks.contains(key) {
        Ok(false) => false,
        Ok(true) => match ks.get(&deadline_key(key)) {
            Ok(Some(d)) => decode_deadline(&d).map_or(true, |d| d >= now_ms),
            Ok(None) | Err(_) => true,
        },
        Err(_) => true,
    }
}

/// Now, in unix milliseconds (what deadlines are compared with).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_entries_sort_by_deadline_and_round_trip() {
        let early = index_key(5, b"zzz");
        let late = index_key(256, b"aaa");
        assert!(early < late);
        assert_eq!(split_index_key(&late).unwrap(), (256, &b"aaa"[..]));
        assert!(split_index_key(&index_prefix()).is_err());
        assert!(is_reserved(&deadline_key(b"k")) && is_reserved(MARKER));
        assert!(!is_reserved(b"\xff\xff"));
        assert_eq!(
            modified_key(&deadline_key(b"k"), false),
            Some(b"k".to_vec())
        );
        assert_eq!(modified_key(&index_key(1, b"k"), false), None);
        assert_eq!(modified_key(b"k", false), Some(b"k".to_vec()));
        let stored = [&b"\x00\x07"[..], &deadline_key(b"k")].concat();
        assert_eq!(modified_key(&stored, true), Some(b"\x00\x07k".to_vec()));
    }

    #[test]
    fn damaged_deadline_records_are_errors() {
        assert_eq!(decode_deadline(&encode_deadline(42)).unwrap(), 42);
        assert!(decode_deadline(b"short").is_err());
    }
}
