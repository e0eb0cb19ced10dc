//! Fuzzes the RESP request decoder of `tucana serve` (`tucana_server::resp::decode`):
//! whatever bytes a client sends, decoding must not panic, must respect the limits, and
//! what it decodes must survive a round trip through the multibulk encoding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tucana_server::resp::{decode, RequestLimits};

fn encode_multibulk(args: &[Vec<u8>]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

fuzz_target!(|data: &[u8]| {
    for limits in [RequestLimits::DEFAULT, RequestLimits::PRE_AUTH] {
        // Decode a whole pipeline, as a connection does.
        let mut rest = data;
        while let Ok(Some((args, consumed))) = decode(rest, &limits) {
            assert!(consumed > 0 && consumed <= rest.len(), "progress within the buffer");
            assert!(args.len() <= limits.max_args);
            assert!(args.iter().all(|a| a.len() <= limits.max_bulk_bytes));
            assert!(consumed <= limits.max_request_bytes.max(limits.max_inline_bytes + 1));
            let wire = encode_multibulk(&args);
            if !args.is_empty() && wire.len() <= limits.max_request_bytes {
                let again = decode(&wire, &limits).expect("re-encoded request decodes");
                assert_eq!(again, Some((args, wire.len())));
            }
            rest = &rest[consumed..];
        }
    }
});
