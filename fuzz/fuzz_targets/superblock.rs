//! Superblock slot decoder: raw bytes, and mutations of a valid slot with the crc
//! re-stamped. Property: never panics; a slot that decodes re-encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tucana::volume::superblock::Superblock;
use tucana_fuzz::{base, fix_slot_crc, mutate, BLOCK_BYTES};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let slot_no = (mode >> 1) as usize % 2;
    let bytes = if mode & 1 == 0 {
        rest.to_vec()
    } else {
        let mut slot = base().slot.0.clone();
        mutate(&mut slot, rest);
        fix_slot_crc(&mut slot);
        slot
    };
    if let Ok(sb) = Superblock::decode(&bytes, slot_no) {
        assert_eq!(bytes.len(), BLOCK_BYTES);
        assert_eq!(
            &sb.encode()[..],
            &bytes[..],
            "decoded slot does not re-encode to itself"
        );
    }
});
