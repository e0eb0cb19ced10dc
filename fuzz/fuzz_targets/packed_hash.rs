//! The decoder of packed small hashes `tucana serve` reads back from its keyspace
//! (`tucana_server::types::packed`). Property: never panics on any bytes; what parses
//! encodes back to the same bytes, holds fields in strictly ascending order within the
//! bounds, and `Meta::decode` agrees with it on the count.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tucana_server::types::{packed, Meta, TYPED};

fuzz_target!(|data: &[u8]| {
    // Raw bytes, and the same bytes behind the packed hash's prefix (format byte and
    // on) so that the entries are reached.
    for bytes in [
        data.to_vec(),
        [TYPED, &[packed::KIND_BYTE]].concat(),
        [TYPED, &[packed::KIND_BYTE], data].concat(),
    ] {
        let Ok(entries) = packed::parse(&bytes) else {
            assert!(packed::decode(&bytes).is_err());
            continue;
        };
        assert!(entries.windows(2).all(|w| w[0].0 < w[1].0), "field order");
        let total: usize = entries.iter().map(|(f, v)| f.len() + v.len()).sum();
        assert!(packed::fits(entries.len(), total), "bounds");
        assert_eq!(packed::encode(entries.iter().copied()), bytes, "round trip");
        let meta = Meta::decode(&bytes).expect("a packed hash is metadata");
        assert!(meta.packed && meta.count == entries.len() as u64);
    }
});
