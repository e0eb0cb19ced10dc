//! Bitmap buddy decoder: raw bytes, and mutations of a real buddy with the crc
//! re-stamped. Property: never panics; a buddy that decodes re-encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tucana::alloc::{decode_buddy, encode_buddy};
use tucana::types::DiskOffset;
use tucana_fuzz::{base, fix_buddy_crc, mutate, BLOCK_BYTES, BUDDY_BYTES};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let group = u64::from(mode >> 3);
    let offset = DiskOffset(2 * BLOCK_BYTES as u64);
    let bytes = if mode & 1 == 0 {
        let mut bytes = rest.to_vec();
        if mode & 2 != 0 && bytes.len() == BUDDY_BYTES {
            fix_buddy_crc(&mut bytes);
        }
        bytes
    } else {
        // Group 0's buddy A of the base volume.
        let mut bytes = vec![0u8; BUDDY_BYTES];
        assert!(base().volume.read(2 * BLOCK_BYTES as u64, &mut bytes));
        mutate(&mut bytes, rest);
        fix_buddy_crc(&mut bytes);
        bytes
    };
    if let Ok(buddy) = decode_buddy(&bytes, group, offset) {
        let again = encode_buddy(buddy.group, buddy.epoch, &buddy.bitmap);
        // Compare the bitmap and the header up to the crc: the crc also covers the spare
        // bytes after it, which the encoder writes as zeros but the decoder (rightly)
        // only checks through the crc, so a stamped buddy with spare bytes set differs
        // there and in its crc.
        if let Some(i) = (0..4120).find(|&i| again[i] != bytes[i]) {
            panic!(
                "a decoded buddy does not re-encode: byte {i} is {:#04x}, re-encoded {:#04x}",
                bytes[i], again[i]
            );
        }
    }
});
