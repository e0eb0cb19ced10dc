//! Replication frame decoder (`tucana_replication::frame::decode`): raw bytes behind a
//! matching crc (the structure path: every field's bounds), and valid frames mutated with
//! the crc re-stamped. Property: never panics; a frame that decodes encodes back to bytes
//! that decode to the same frame.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tucana_fuzz::mutate;
use tucana_replication::frame::{decode, encode, Frame, RegionInfo, HEADER_BYTES};

fn crc(kind: u8, payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&[kind]), payload)
}

/// A few valid frames to mutate.
fn samples() -> Vec<Vec<u8>> {
    let frames = [
        Frame::Open {
            version: 1,
            primary: "p".into(),
            password: "x".into(),
            ack_durable: false,
            regions: vec![RegionInfo {
                name: "db0".into(),
                seed: 7,
                term: 1,
                generation: 2,
            }],
        },
        Frame::Log {
            region: "db0".into(),
            term: 1,
            order: 3,
            origin: 1 << 21,
            size_bytes: 2 << 20,
            offset: 0,
            relocation: false,
            bytes: vec![1, 2, 3, 4],
        },
        Frame::Ack {
            region: "db0".into(),
            term: 1,
            order: 3,
            offset: 4,
            durable: true,
        },
        Frame::Nodes {
            region: "db0".into(),
            term: 1,
            upstream_epoch: 4,
            nodes: vec![(4096, Box::new([9; 4096]))],
        },
    ];
    frames
        .iter()
        .map(|f| {
            let mut bytes = Vec::new();
            encode(f, &mut bytes);
            bytes
        })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let (kind, payload) = if mode & 1 == 0 {
        let Some((&kind, payload)) = rest.split_first() else {
            return;
        };
        (kind, payload.to_vec())
    } else {
        let samples = samples();
        let mut bytes = samples[(mode >> 1) as usize % samples.len()].clone();
        let kind = bytes[4];
        mutate(&mut bytes[HEADER_BYTES..], rest);
        (kind, bytes[HEADER_BYTES..].to_vec())
    };
    if let Ok(frame) = decode(kind, crc(kind, &payload), &payload) {
        let mut again = Vec::new();
        encode(&frame, &mut again);
        let back = decode(
            again[4],
            crc(again[4], &again[HEADER_BYTES..]),
            &again[HEADER_BYTES..],
        );
        assert_eq!(
            back.as_ref(),
            Ok(&frame),
            "a decoded frame does not encode back"
        );
    }
});
