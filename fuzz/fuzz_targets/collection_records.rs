//! Decoders of the collection records `tucana serve` reads back from its keyspace
//! (`tucana_server::types`): a collection's metadata value, a sub-record's key, scores
//! and list indexes. Property: never panics on any bytes; metadata that decodes encodes
//! back to the same bytes, and a sub-record key that splits is rebuilt from its parts.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tucana_server::types::{
    decode_index, decode_score, score_from_order, split_sub_key, sub_key, Meta, TYPED,
};

fuzz_target!(|data: &[u8]| {
    // Raw bytes, and the same bytes behind the metadata prefix so the fields are reached.
    for bytes in [data.to_vec(), [TYPED, data].concat()] {
        if let Ok(meta) = Meta::decode(&bytes) {
            // A packed hash's value is its own encoder's (fuzz_targets/packed_hash.rs).
            if !meta.packed {
                assert_eq!(meta.encode(), bytes, "metadata round trip");
            }
        }
    }
    for bytes in [data.to_vec(), [b"\xff\xfftucana\x00".as_slice(), data].concat()] {
        if let Ok(Some((family, key, version, suffix))) = split_sub_key(&bytes) {
            assert_eq!(sub_key(family, key, version, suffix), bytes, "sub-key round trip");
        }
    }
    let _ = decode_score(data);
    let _ = score_from_order(data);
    let _ = decode_index(data);
});
