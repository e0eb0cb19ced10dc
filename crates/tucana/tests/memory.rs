//! Memory a store holds while it writes, observed from a process of its own (this file
//! has one test, so nothing else allocates tail buffers meanwhile).

use tucana::Options;

/// Closed log tails were handed to crossbeam's deferred drop and then sat in the writer
/// thread's local bag until 63 more deferred items joined them, so a bulk load kept up to
/// 64 closed segment buffers alive (128 MiB with 2 MiB segments): the resident memory of a
/// 1 KB-value load grew by about 300 MB per million keys, and every new segment got a
/// freshly faulted buffer instead of a recycled one. A switch now flushes the bag.
#[test]
fn a_bulk_load_recycles_its_closed_log_buffers() {
    let dir = tempfile::tempdir().unwrap();
    let segment_bytes = 64 << 10;
    let opts = Options::default()
        .log_segment_bytes(segment_bytes)
        .commit_interval(None)
        .flush_interval(None);
    let db = opts.open(dir.path().join("v")).unwrap();
    let ks = db.keyspace("k").unwrap();
    let value = vec![7u8; 1000];
    let before = tucana::log::tail::fresh_buffers_allocated();
    // About 300 segment switches.
    for i in 0..20_000u32 {
        ks.put(format!("key{i:08}").as_bytes(), &value).unwrap();
    }
    let fresh = tucana::log::tail::fresh_buffers_allocated() - before;
    assert!(
        fresh <= 24,
        "{fresh} fresh tail buffers for about 300 segments: closed tails are not freed"
    );
    assert_eq!(ks.get(b"key00000000").unwrap().as_deref(), Some(&value[..]));
}
