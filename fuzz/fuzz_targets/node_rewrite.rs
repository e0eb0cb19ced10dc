//! A backup's rewrite of a shipped index node (`tucana::index::rewrite_image`): real
//! committed nodes, mutated with the crc re-stamped, rewritten through maps that know some
//! pointers and not others. Property: never panics; a rewrite that succeeds yields an
//! image that verifies at its new place and holds the same keys with every pointer
//! translated; one that meets a pointer the maps do not know is an error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tucana::index::{image_contents, rewrite_image, ImageContents, NODE_BYTES};
use tucana::types::{DiskOffset, RegionId};
use tucana_fuzz::{base, fix_node_crc, mutate};

const SHIFT: u64 = 1 << 30;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let nodes = &base().nodes;
    let (img, off, region) = &nodes[(mode >> 2) as usize % nodes.len()];
    let mut img = img.clone();
    if mode & 1 != 0 {
        mutate(&mut img, rest);
        fix_node_crc(&mut img);
    }
    // Pointers whose low bits match the mode's are unknown to the maps.
    let unknown = |p: u64| mode & 2 != 0 && (p >> 12) % 7 == u64::from(mode) % 7;
    let log = |p: u64| (!unknown(p)).then_some(p + SHIFT);
    let node = |p: u64| (!unknown(p)).then_some(p + SHIFT);
    let to = (DiskOffset(off.0 + SHIFT), RegionId(region.0 + 1));
    let mut out = vec![0u8; NODE_BYTES];
    let Ok(()) = rewrite_image(&img, (*off, *region), &mut out, to, &log, &node) else {
        return;
    };
    let before = image_contents(&img, *off, *region).expect("a rewritten image was sound");
    let after = image_contents(&out, to.0, to.1).expect("a rewrite verifies at its new place");
    match (before, after) {
        (ImageContents::Leaf { stem: s1, entries: e1 }, ImageContents::Leaf { stem: s2, entries: e2 }) => {
            assert_eq!(s1, s2);
            assert_eq!(e1.len(), e2.len());
            for ((p1, h1, ptr1), (p2, h2, ptr2)) in e1.iter().zip(&e2) {
                assert_eq!((p1, h1, ptr1 + SHIFT), (p2, h2, *ptr2));
            }
        }
        (ImageContents::Internal { children: c1, .. }, ImageContents::Internal { children: c2, .. }) => {
            let shifted: Vec<DiskOffset> = c1.iter().map(|c| DiskOffset(c.0 + SHIFT)).collect();
            assert_eq!(shifted, c2);
        }
        _ => panic!("a rewrite changed the node's kind"),
    }
});
