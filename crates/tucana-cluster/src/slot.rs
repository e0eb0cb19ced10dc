//! Keys to Redis Cluster hash slots, and the slot-prefixed keys a server stores.
//!
//! Owns: the slot function every Redis Cluster client computes (so a Tucana cluster routes
//! exactly as they do), and the layout of a stored key (`slot` big-endian, then the key)
//! that keeps one slot's keys contiguous in Tucana's ordered keyspace. Does not own which
//! server serves a slot (`map`).
//!
//! Threads: pure functions.
//!
//! The slot of a key is CRC16 (the XMODEM / CCITT polynomial 0x1021, initial value 0, as
//! the Redis Cluster specification defines it) of the key modulo 16384; when the key holds
//! a hashtag, only the tag is hashed. The tag is what lies between the first `{` and the
//! first `}` after it, if that is not empty: so `{user1000}.following` and
//! `{user1000}.followers` share a slot, and multi-key commands on them stay on one server.

use crate::error::{Error, Result};

/// The number of hash slots; a slot is `0..SLOTS`.
pub const SLOTS: u16 = 16384;

const CRC16: crc::Crc<u16> = crc::Crc::<u16>::new(&crc::CRC_16_XMODEM);

/// The part of `key` that is hashed: its hashtag if it has a non-empty one, else all of it.
pub fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        let rest = &key[open + 1..];
        if let Some(close) = rest.iter().position(|&b| b == b'}') {
            if close > 0 {
                return &rest[..close];
            }
        }
    }
    key
}

/// The one hash slot of every key that starts with `prefix`, if there is one: when the
/// prefix holds a whole non-empty hashtag (a `{`, then a `}` after it with something
/// between), every such key has that tag. `None` otherwise (keys with the prefix may
/// hash anywhere).
pub fn prefix_slot(prefix: &[u8]) -> Option<u16> {
    let open = prefix.iter().position(|&b| b == b'{')?;
    let close = prefix[open + 1..].iter().position(|&b| b == b'}')?;
    (close > 0).then(|| key_slot(prefix))
}

/// The hash slot of `key`, in `0..SLOTS`, as Redis Cluster computes it.
pub fn key_slot(key: &[u8]) -> u16 {
    CRC16.checksum(hash_tag(key)) % SLOTS
}

/// The key a server stores for `key` in `slot`: the slot as two big-endian bytes, then
/// the key. Big-endian makes slot order the byte order, so one slot's keys, and a range
/// of slots' keys, are one contiguous range of the ordered keyspace.
///
/// Panics if `slot >= SLOTS` (a caller's bug: slots come from `key_slot` or the map).
pub fn storage_key(slot: u16, key: &[u8]) -> Vec<u8> {
    assert!(slot < SLOTS, "slot {slot} out of range");
    let mut stored = Vec::with_capacity(2 + key.len());
    stored.extend_from_slice(&slot.to_be_bytes());
    stored.extend_from_slice(key);
    stored
}

/// The inverse of `storage_key`: the slot and the client's key. Bytes read from a volume
/// are not trusted: fewer than 2 bytes, or a slot past the last, is an error.
pub fn split_storage_key(stored: &[u8]) -> Result<(u16, &[u8])> {
    let Some((prefix, key)) = stored.split_first_chunk::<2>() else {
        return Err(Error::StorageKeyTooShort { len: stored.len() });
    };
    let slot = u16::from_be_bytes(*prefix);
    if slot >= SLOTS {
        return Err(Error::SlotOutOfRange { slot });
    }
    Ok((slot, key))
}

/// The storage keys of one slot lie in `slot_prefix(slot)..slot_prefix(slot + 1)` (the
/// last slot's run to the end of the keyspace): the bound of a scan over a slot range.
pub fn slot_prefix(slot: u16) -> [u8; 2] {
    slot.to_be_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_holding_a_whole_hashtag_fixes_the_slot_of_every_key_it_starts() {
        let slot = key_slot(b"{user:7}");
        assert_eq!(prefix_slot(b"{user:7}"), Some(slot));
        assert_eq!(prefix_slot(b"a{user:7}:b"), Some(key_slot(b"{user:7}")));
        for key in [&b"{user:7}"[..], b"{user:7}:name", b"{user:7}}x{y}"] {
            assert_eq!(key_slot(key), slot);
        }
        // No tag yet, an empty tag, a tag not closed: keys with the prefix hash apart.
        assert_eq!(prefix_slot(b"user:7"), None);
        assert_eq!(prefix_slot(b"{}user"), None);
        assert_eq!(prefix_slot(b"{user"), None);
        assert_ne!(key_slot(b"{user}a"), key_slot(b"{userb}"));
    }
    use proptest::prelude::*;

    #[test]
    fn crc16_is_xmodem() {
        // The check value of CRC-16/XMODEM, which the Redis Cluster specification quotes
        // for its reference implementation.
        assert_eq!(CRC16.checksum(b"123456789"), 0x31C3);
    }

    #[test]
    fn slots_redis_reports() {
        // `CLUSTER KEYSLOT` answers of redis-server 7 (and its documentation's examples).
        assert_eq!(key_slot(b"somekey"), 11058);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"hello"), 866);
        assert_eq!(key_slot(b""), 0);
    }

    #[test]
    fn hashtags() {
        assert_eq!(
            key_slot(b"{user1000}.following"),
            key_slot(b"{user1000}.followers")
        );
        assert_eq!(key_slot(b"{user1000}.following"), 3443);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{hello}zap"), 866);
        assert_eq!(key_slot(b"foo{}{bar}"), 8363);
        assert_eq!(key_slot(b"foo{{bar}}zap"), 4015);
        assert_eq!(key_slot(b"foo{bar}{zap}"), 5061);
        // An empty tag: the whole key is hashed.
        assert_eq!(hash_tag(b"foo{}{bar}"), b"foo{}{bar}");
        // The tag ends at the first `}` after the first `{`.
        assert_eq!(hash_tag(b"foo{{bar}}zap"), b"{bar");
        // Only the first tag counts.
        assert_eq!(hash_tag(b"foo{bar}{zap}"), b"bar");
        // No closing brace: the whole key.
        assert_eq!(hash_tag(b"foo{bar"), b"foo{bar");
        assert_eq!(hash_tag(b"}{"), b"}{");
        assert_eq!(key_slot(b"foo{bar}{zap}"), key_slot(b"bar"));
    }

    #[test]
    fn storage_key_round_trip_and_order() {
        let stored = storage_key(12182, b"foo");
        assert_eq!(stored, [0x2f, 0x96, b'f', b'o', b'o']);
        assert_eq!(split_storage_key(&stored).unwrap(), (12182, &b"foo"[..]));
        assert_eq!(split_storage_key(&[0, 0]).unwrap(), (0, &b""[..]));
        assert!(storage_key(1, b"\xff\xff") < storage_key(2, b""));
        assert_eq!(slot_prefix(300), storage_key(300, b"")[..]);
    }

    #[test]
    fn bad_storage_keys_are_errors() {
        assert!(matches!(
            split_storage_key(b""),
            Err(Error::StorageKeyTooShort { len: 0 })
        ));
        assert!(matches!(
            split_storage_key(b"x"),
            Err(Error::StorageKeyTooShort { len: 1 })
        ));
        assert!(matches!(
            split_storage_key(&[0x40, 0x00, b'k']),
            Err(Error::SlotOutOfRange { slot: 16384 })
        ));
    }

    proptest! {
        #[test]
        fn slot_in_range_and_round_trips(key in proptest::collection::vec(any::<u8>(), 0..64)) {
            let slot = key_slot(&key);
            prop_assert!(slot < SLOTS);
            let stored = storage_key(slot, &key);
            prop_assert_eq!(split_storage_key(&stored).unwrap(), (slot, &key[..]));
        }

        #[test]
        fn a_tagged_key_hashes_as_its_tag(
            tag in proptest::collection::vec(any::<u8>().prop_filter("no }", |b| *b != b'}'), 1..16),
            before in proptest::collection::vec(any::<u8>().prop_filter("no {", |b| *b != b'{'), 0..16),
            after in proptest::collection::vec(any::<u8>(), 0..16),
        ) {
            let mut key = before.clone();
            key.push(b'{');
            key.extend_from_slice(&tag);
            key.push(b'}');
            key.extend_from_slice(&after);
            prop_assert_eq!(key_slot(&key), key_slot(&tag));
        }
    }
}
