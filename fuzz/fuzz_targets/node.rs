//! Index node image decoder (`verify_image`, `image_contents`): raw bytes, and mutations
//! of real committed nodes (internal and leaves, internal ones with stems) with the crc
//! re-stamped, anywhere or in the 64-byte header only (kind, counts, the stem length and
//! the internal stem in words 5..7, where one flipped byte is a different node). Property:
//! never panics, and the two functions agree on whether the image is sound.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tucana::index::{image_contents, verify_image};
use tucana::types::{DiskOffset, RegionId};
use tucana_fuzz::{base, fix_node_crc, mutate, BLOCK_BYTES};

const HEADER_BYTES: usize = 64;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let nodes = &base().nodes;
    let (img, off, region) = if mode & 1 == 0 {
        let mut img = rest.to_vec();
        img.resize(BLOCK_BYTES, 0);
        if mode & 2 != 0 {
            fix_node_crc(&mut img);
        }
        (
            img,
            DiskOffset(u64::from(mode) * BLOCK_BYTES as u64),
            RegionId(1),
        )
    } else {
        let (img, off, region) = &nodes[(mode >> 2) as usize % nodes.len()];
        let mut img = img.clone();
        if mode & 2 != 0 {
            // Past word 0 (the crc, re-stamped below) and inside the header.
            mutate(&mut img[8..HEADER_BYTES], rest);
        } else {
            mutate(&mut img, rest);
        }
        fix_node_crc(&mut img);
        (img, *off, *region)
    };
    let verified = verify_image(&img, off, region).is_ok();
    let contents = image_contents(&img, off, region).is_ok();
    assert_eq!(
        verified, contents,
        "verify_image and image_contents disagree"
    );
    // A wrong length is an error too.
    let _ = verify_image(&img[..img.len() - 1], off, region);
});
