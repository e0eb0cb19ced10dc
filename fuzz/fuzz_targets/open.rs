//! `open` on mutated volumes: a small valid volume (last commit plus a durable log tail to
//! replay) with the fuzzer's edits applied to its non-zero blocks (byte sets, flips, zeroed
//! sectors, misdirected blocks), checksums optionally re-stamped so the edit reaches the
//! structure behind the crc; then open from memory and read everything, `check`, write.
//! Property: never panics, never aborts (errors are the expected outcome).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tucana_fuzz::{base, fix_volume_crcs, mutate_volume, open_and_read, BLOCK_BYTES};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let base = base();
    let mut volume = base.volume.clone();
    mutate_volume(&mut volume, &base.used_blocks, rest);
    if mode & 1 == 1 {
        fix_volume_crcs(&mut volume);
    }
    if mode & 2 == 2 {
        // A file cut short after the fact.
        let cut = u64::from(mode >> 2) * BLOCK_BYTES as u64;
        volume.truncate(volume.len_bytes.saturating_sub(cut));
    }
    open_and_read(volume);
});
