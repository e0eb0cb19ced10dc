//! Log record decoder (`Header::decode`, `RecordRef::parse`, `link_target`): raw bytes,
//! and bytes with a valid crc stamped so the structure checks run. Property: never
//! panics; a record that parses re-encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tucana::log::record::{encode_into, region_seed, Header, RecordRef};
use tucana::types::{DiskOffset, RegionId};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let seed = region_seed(RegionId(u64::from(mode >> 2)));
    let at = DiskOffset(4096);
    let mut bytes = rest.to_vec();
    if mode & 1 == 1 && bytes.len() >= 4 {
        let crc = crc32c::crc32c_append(seed, &bytes[4..]);
        bytes[..4].copy_from_slice(&crc.to_le_bytes());
    }
    let _ = Header::decode(&bytes, at);
    let _ = RecordRef::parse(&bytes, seed, false, at);
    if let Ok(record) = RecordRef::parse(&bytes, seed, true, at) {
        let h = record.header;
        let mut again = vec![0u8; bytes.len()];
        encode_into(
            &mut again,
            seed,
            h.flags,
            h.generation,
            h.seq,
            record.key,
            record.value,
        );
        assert_eq!(again, bytes, "a parsed record does not re-encode to itself");
        let _ = record.link_target(at);
    }
});
