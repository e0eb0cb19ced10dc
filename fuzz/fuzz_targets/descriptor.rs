//! Commit descriptor decoder (no crc of its own: the superblock carries it, so raw and
//! mutated bytes both reach the field decoding). Property: never panics; a descriptor
//! that decodes survives an encode/decode round trip unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tucana::fuzzing::Descriptor;
use tucana_fuzz::{base, mutate};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let (base_bytes, at) = &base().descriptor;
    let bytes = if mode & 1 == 0 {
        rest.to_vec()
    } else {
        let mut bytes = base_bytes.clone();
        mutate(&mut bytes, rest);
        // Also try cutting it short or extending it.
        match mode >> 6 {
            1 => bytes.truncate(bytes.len().saturating_sub(1 + (mode as usize & 0x3f))),
            2 => bytes.extend_from_slice(&rest[..rest.len().min(16)]),
            _ => {}
        }
        bytes
    };
    if let Ok(desc) = Descriptor::decode(&bytes, *at) {
        let again =
            Descriptor::decode(&desc.encode(), *at).expect("a re-encoded descriptor decodes");
        assert_eq!(again, desc);
    }
});
