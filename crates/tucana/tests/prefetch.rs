//! Scan prefetch and multi-get: results never depend on prefetching (model tests, both
//! directions, several window sizes), and a storage wrapper that logs I/O shows that a
//! cold scan asks for every record's page before reading it, and never for records still
//! in the tail buffer. Nothing here measures time.

use std::collections::BTreeMap;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use tucana::volume::{MemStorage, Storage};
use tucana::{Database, Keyspace, Options, Result};

const PAGE_BYTES: u64 = 4096;
const SEGMENT_BYTES: u64 = 64 << 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    Prefetch { offset: u64, len_bytes: u64 },
    Read { offset: u64, len_bytes: u64 },
}

/// A memory volume that logs reads and prefetch requests, in order. Says every page is
/// resident when `resident` is set, else that it cannot tell.
struct Logging {
    inner: MemStorage,
    events: Mutex<Vec<Event>>,
    resident: std::sync::atomic::AtomicBool,
}

impl Logging {
    fn new() -> Arc<Logging> {
        Arc::new(Logging {
            inner: MemStorage::new(),
            events: Mutex::new(Vec::new()),
            resident: std::sync::atomic::AtomicBool::new(false),
        })
    }

    fn take(&self) -> Vec<Event> {
        std::mem::take(&mut *self.events.lock())
    }
}

impl Storage for Logging {
    fn len_bytes(&self) -> Result<u64> {
        self.inner.len_bytes()
    }
    fn grow(&self, len_bytes: u64) -> Result<()> {
        self.inner.grow(len_bytes)
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.events.lock().push(Event::Read {
            offset,
            len_bytes: buf.len() as u64,
        });
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.inner.write_at(offset, data)
    }
    fn sync(&self) -> Result<()> {
        self.inner.sync()
    }
    fn prefetch(&self, offset: u64, len_bytes: u64) {
        self.events
            .lock()
            .push(Event::Prefetch { offset, len_bytes });
    }
    fn resident(&self, _offset: u64) -> Option<bool> {
        self.resident
            .load(std::sync::atomic::Ordering::Relaxed)
            .then_some(true)
    }
}

/// No background work: only the test moves the log, so every read is the test's.
fn quiet(prefetch_entries: usize) -> Options {
    Database::builder()
        .commit_interval(None)
        .flush_interval(None)
        .gc(false)
        .log_segment_bytes(SEGMENT_BYTES)
        .scan_prefetch_entries(prefetch_entries)
}

/// 8-byte keys, so that every key has its own key prefix (range bounds of other lengths
/// then never need a key read to find their place in a leaf).
fn key(i: u32) -> Vec<u8> {
    format!("k{i:07}").into_bytes()
}

fn value(i: u32, len: usize) -> Vec<u8> {
    let mut v = format!("value of {i}:").into_bytes();
    v.resize(len, b'.');
    v
}

/// Checks that every read in `events` that lies outside `tail` (the tail segment's byte
/// range) falls inside a page range some earlier prefetch asked for, and that no prefetch
/// touches `tail`. Returns the number of reads that were covered.
fn assert_reads_prefetched_first(events: &[Event], tail: std::ops::Range<u64>) -> usize {
    let mut asked: Vec<(u64, u64)> = Vec::new();
    let mut covered = 0;
    for event in events {
        match *event {
            Event::Prefetch { offset, len_bytes } => {
                assert!(len_bytes > 0);
                assert_eq!(offset % PAGE_BYTES, 0, "prefetch of whole pages");
                assert_eq!(len_bytes % PAGE_BYTES, 0, "prefetch of whole pages");
                assert!(
                    offset + len_bytes <= tail.start || offset >= tail.end,
                    "prefetch {offset:#x}+{len_bytes} of tail-buffer records ({tail:?})"
                );
                asked.push((offset, offset + len_bytes));
            }
            Event::Read { offset, len_bytes } => {
                if tail.contains(&offset) {
                    continue;
                }
                let end = offset + len_bytes;
                assert!(
                    asked.iter().any(|&(s, e)| s <= offset && end <= e),
                    "read {offset:#x}+{len_bytes} was not prefetched first"
                );
                covered += 1;
            }
        }
    }
    covered
}

/// Loads `n` keys (in a scrambled order, so log order is not key order) with fixed-size
/// values into a fresh quiet database on a logging volume. Returns the volume, the
/// keyspace and the byte range of the tail segment (which holds the newest records).
fn load(n: u32, value_len: usize, prefetch_entries: usize) -> (Arc<Logging>, Database, Keyspace) {
    let storage = Logging::new();
    let db = quiet(prefetch_entries)
        .open_storage(storage.clone())
        .expect("open");
    let ks = db.keyspace("ks").expect("keyspace");
    for j in 0..n {
        // A permutation of 0..n (n is not a multiple of 7919, a prime).
        let i = ((j as u64 * 7919) % n as u64) as u32;
        ks.put(&key(i), &value(i, value_len)).expect("put");
    }
    // Closed segments are read from their buffers until their writes (in flight, done by
    // the next thread that must wait: no background threads here) are done.
    db.sync().expect("sync");
    storage.take();
    (storage, db, ks)
}

/// The tail segment: the aligned segment holding the newest record (found by reading the
/// volume's bytes for the last key written; records never span segments).
fn tail_segment(storage: &Logging, newest_key: &[u8]) -> std::ops::Range<u64> {
    let len = storage.len_bytes().unwrap();
    let mut bytes = vec![0u8; len as usize];
    storage.inner.read_at(0, &mut bytes).unwrap();
    // The newest copy is the last occurrence (the tail may not be flushed yet: then the
    // tail segment is simply not found on the volume and nothing can be read from it).
    match bytes
        .windows(newest_key.len())
        .rposition(|w| w == newest_key)
    {
        Some(at) => {
            let start = at as u64 / SEGMENT_BYTES * SEGMENT_BYTES;
            start..start + SEGMENT_BYTES
        }
        None => 0..0,
    }
}

#[test]
fn a_cold_scan_asks_for_every_record_before_reading_it_both_directions() {
    let n = 3000;
    let (storage, db, ks) = load(n, 200, 64);
    let last_written = ((n as u64 - 1) * 7919 % n as u64) as u32;
    // Unflushed: the tail is in memory only; its segment is wherever the last flushed
    // segment switch put it, so find it after a flush of the tail to the volume.
    db.sync().unwrap();
    let tail = tail_segment(&storage, &key(last_written));
    assert!(!tail.is_empty());
    storage.take();

    let before = db.stats();
    let forward: Vec<_> = ks.range::<&[u8], _>(..).map(|r| r.unwrap()).collect();
    assert_eq!(forward.len(), n as usize);
    let events = storage.take();
    let reads = assert_reads_prefetched_first(&events, tail.clone());
    // Nearly every record is outside the 64 KiB tail segment (3000 x 232 bytes).
    assert!(reads > 2 * (n as usize - 300), "{reads} reads covered");
    let after = db.stats();
    let calls = events
        .iter()
        .filter(|e| matches!(e, Event::Prefetch { .. }))
        .count() as u64;
    assert_eq!(after.prefetch_calls - before.prefetch_calls, calls);
    assert!(calls > 0 && after.prefetch_bytes > before.prefetch_bytes);

    let backward: Vec<_> = ks.range::<&[u8], _>(..).rev().map(|r| r.unwrap()).collect();
    let events = storage.take();
    assert!(assert_reads_prefetched_first(&events, tail.clone()) > 2 * (n as usize - 300));
    let mut reversed = backward.clone();
    reversed.reverse();
    assert_eq!(reversed, forward);

    // Short scans from the middle, each direction, and a bounded range; bounds of 7 bytes
    // fall between keys' prefixes, so finding the start reads no record.
    for (lo, hi) in [
        (b"k000150".to_vec(), b"k000170".to_vec()),
        (b"k000290".to_vec(), b"k000300".to_vec()),
    ] {
        let got: Vec<_> = ks
            .range(lo.clone()..hi.clone())
            .map(|r| r.unwrap())
            .collect();
        assert!(!got.is_empty());
        let got_rev: Vec<_> = ks
            .range(lo.clone()..hi.clone())
            .rev()
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(got.len(), got_rev.len());
        assert_reads_prefetched_first(&storage.take(), tail.clone());
    }
    let mut short = ks.range(b"k000123".to_vec()..);
    for _ in 0..100 {
        short.next().unwrap().unwrap();
    }
    drop(short);
    assert_reads_prefetched_first(&storage.take(), tail.clone());

    // multi_get goes the same way.
    let keys: Vec<Vec<u8>> = (0..200).map(|i| key(i * 13 % n)).collect();
    let values = ks.multi_get(&keys).unwrap();
    assert!(values.iter().all(Option::is_some));
    assert_reads_prefetched_first(&storage.take(), tail.clone());

    // So do groups of gets (the server's pipelined GETs): each group of records is asked
    // for before any of it is read.
    let keys: Vec<Vec<u8>> = (0..160).map(|i| key(i * 17 % n)).collect();
    let slices: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    let mut found = 0;
    ks.get_many_with(&slices, |_, v| found += usize::from(v.unwrap().is_some()));
    assert_eq!(found, keys.len());
    assert!(assert_reads_prefetched_first(&storage.take(), tail) > 100);
}

/// Pages asked for since the last `take` (and takes the events).
fn pages_asked(storage: &Logging) -> u64 {
    storage
        .take()
        .iter()
        .map(|e| match e {
            Event::Prefetch { len_bytes, .. } => len_bytes / PAGE_BYTES,
            Event::Read { .. } => 0,
        })
        .sum()
}

#[test]
fn a_bounded_scan_does_not_ask_for_records_past_its_end() {
    let (storage, _db, ks) = load(3000, 200, 64);
    let got: Vec<_> = ks
        .range(b"k000100".to_vec()..b"k000101".to_vec())
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(got.len(), 10);
    let asked = pages_asked(&storage);
    // Ten records, each in at most two pages; the window (64) stops at the bound.
    assert!((1..=20).contains(&asked), "{asked} pages asked for");
}

/// A short scan without a bound (YCSB E's: a seek and a few nexts) asks for a small first
/// window, not for the whole configured one, and copies no leaf ahead of time: the window
/// grows only as the scan shows it is a long one.
#[test]
fn a_short_scan_starts_with_a_small_window() {
    let (storage, _db, ks) = load(3000, 200, 64);
    let got: Vec<_> = ks
        .range(b"k000100".to_vec()..)
        .take(3)
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(got.len(), 3);
    let asked = pages_asked(&storage);
    // The first window is 8 records, each in at most two pages (64 would be ~128 pages).
    assert!((1..=16).contains(&asked), "{asked} pages asked for");
}

/// A scan that says how many items it will take (`Range::limit`) asks for no record past
/// the last of them; without it the doubling window runs ahead of a 30-item scan.
#[test]
fn a_limited_scan_asks_for_no_record_past_its_limit() {
    let (storage, _db, ks) = load(3000, 200, 64);
    let limited: Vec<_> = ks
        .range(b"k000100".to_vec()..)
        .limit(30)
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(limited.len(), 30);
    let asked_limited = pages_asked(&storage);
    // Thirty records, each in at most two pages.
    assert!(
        (1..=60).contains(&asked_limited),
        "{asked_limited} pages asked for"
    );
    let taken: Vec<_> = ks
        .range(b"k000100".to_vec()..)
        .take(30)
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(taken, limited);
    let asked_taken = pages_asked(&storage);
    assert!(
        asked_taken > asked_limited,
        "{asked_taken} pages asked for by take(30), {asked_limited} by limit(30)"
    );
}

/// A scan that says how many items it takes asks for all of them (up to the window)
/// before it reads the first: one round of device reads, where a scan of unknown length
/// finds out as it goes (a window of 8, then 16, 32, 64, each asked for between reads).
#[test]
fn a_limited_scan_asks_for_all_its_records_before_reading_any() {
    let (storage, _db, ks) = load(3000, 200, 64);
    let reads_then_asks = |events: &[Event]| {
        let first_read = events
            .iter()
            .position(|e| matches!(e, Event::Read { .. }))
            .expect("a cold scan reads the volume");
        events[first_read..]
            .iter()
            .filter(|e| matches!(e, Event::Prefetch { .. }))
            .count()
    };
    let limited: Vec<_> = ks
        .range(b"k000100".to_vec()..)
        .limit(40)
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(limited.len(), 40);
    let events = storage.take();
    assert_eq!(reads_then_asks(&events), 0, "{events:?}");
    let taken: Vec<_> = ks
        .range(b"k000100".to_vec()..)
        .take(40)
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(taken, limited);
    assert!(reads_then_asks(&storage.take()) > 0);
}

/// `limit` ends the range after that many items, from both ends together.
#[test]
fn a_limit_counts_items_from_both_ends() {
    let (_storage, _db, ks) = load(500, 20, 64);
    assert_eq!(ks.range::<Vec<u8>, _>(..).limit(0).count(), 0);
    assert_eq!(ks.range::<Vec<u8>, _>(..).limit(7).count(), 7);
    assert_eq!(ks.range::<Vec<u8>, _>(..).limit(600).count(), 500);
    let mut range = ks.range::<Vec<u8>, _>(..).limit(5);
    let front = range.next().unwrap().unwrap();
    let back = range.next_back().unwrap().unwrap();
    assert_eq!((front.0, back.0), (key(0), key(499)));
    let rest: Vec<_> = range.map(|r| r.unwrap().0).collect();
    assert_eq!(rest, vec![key(1), key(2), key(3)]);
}

#[test]
fn records_in_the_tail_buffer_are_not_prefetched() {
    // 50 small records fit in the first segment: nothing is on the volume yet.
    let (storage, db, ks) = load(50, 100, 64);
    let before = db.stats();
    assert_eq!(ks.range::<&[u8], _>(..).count(), 50);
    assert_eq!(ks.range::<&[u8], _>(..).rev().count(), 50);
    let keys: Vec<_> = (0..50).map(key).collect();
    assert!(ks.multi_get(&keys).unwrap().iter().all(Option::is_some));
    let events = storage.take();
    assert!(events.is_empty(), "{events:?}");
    let after = db.stats();
    assert_eq!(after.prefetch_calls, before.prefetch_calls);
    assert_eq!(after.prefetch_bytes, before.prefetch_bytes);
}

#[test]
fn prefetch_off_asks_for_nothing() {
    let (storage, db, ks) = load(3000, 200, 0);
    assert_eq!(ks.range::<&[u8], _>(..).count(), 3000);
    assert_eq!(ks.range::<&[u8], _>(..).rev().count(), 3000);
    let keys: Vec<_> = (0..300).map(key).collect();
    ks.multi_get(&keys).unwrap();
    let slices: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    ks.get_many_with(&slices, |_, v| assert!(v.unwrap().is_some()));
    assert!(!storage
        .take()
        .iter()
        .any(|e| matches!(e, Event::Prefetch { .. })));
    assert_eq!(db.stats().prefetch_calls, 0);
}

/// Applies the same random puts and deletes to databases with different prefetch windows
/// and to a model, then compares ranges in both directions and interleaved.
#[test]
fn ranges_are_the_same_with_and_without_prefetch() {
    let windows = [0usize, 1, 2, 7, 64, 1000];
    let dbs: Vec<_> = windows
        .iter()
        .map(|&w| {
            let db = quiet(w).open_in_memory().unwrap();
            let ks = db.keyspace("ks").unwrap();
            (db, ks)
        })
        .collect();
    let mut model = BTreeMap::new();
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    for _ in 0..8000 {
        let i = rng.random_range(0..4000u32);
        if rng.random_bool(0.2) {
            model.remove(&key(i));
            for (_, ks) in &dbs {
                ks.delete(&key(i)).unwrap();
            }
        } else {
            let v = value(i, rng.random_range(0..300));
            model.insert(key(i), v.clone());
            for (_, ks) in &dbs {
                ks.put(&key(i), &v).unwrap();
            }
        }
    }
    let bound = |rng: &mut rand::rngs::StdRng| match rng.random_range(0..3) {
        0 => Bound::Unbounded,
        1 => Bound::Included(key(rng.random_range(0..4200))),
        _ => Bound::Excluded(key(rng.random_range(0..4200))),
    };
    for round in 0..40 {
        let range = (bound(&mut rng), bound(&mut rng));
        // (Filtered: `BTreeMap::range` panics on the inverted ranges tested here too.)
        let want: Vec<_> = model
            .iter()
            .filter(|(k, _)| range.contains(*k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<Vec<_>>();
        // A step pattern: true = next, false = next_back.
        let steps: Vec<bool> = (0..want.len() + 2)
            .map(|_| match round % 3 {
                0 => true,
                1 => false,
                _ => rng.random_bool(0.5),
            })
            .collect();
        for (w, (_, ks)) in windows.iter().zip(&dbs) {
            let mut it = ks.range(range.clone());
            let (mut front, mut back) = (Vec::new(), Vec::new());
            for &forward in &steps {
                let item = if forward { it.next() } else { it.next_back() };
                match item {
                    Some(item) => {
                        let item = item.unwrap();
                        if forward {
                            front.push(item)
                        } else {
                            back.push(item)
                        }
                    }
                    None => break,
                }
            }
            back.reverse();
            front.extend(back);
            assert_eq!(front, want, "window {w}, round {round}, range {range:?}");
        }
    }
    // Prefix scans too.
    for prefix in [&b"k0001"[..], b"k003", b"k0039999", b"x"] {
        let want: Vec<_> = model
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (_, ks) in &dbs {
            let got: Vec<_> = ks.prefix(prefix).map(|r| r.unwrap()).collect();
            assert_eq!(got, want);
            let mut rev: Vec<_> = ks.prefix(prefix).rev().map(|r| r.unwrap()).collect();
            rev.reverse();
            assert_eq!(rev, want);
        }
    }
}

#[test]
fn multi_get_agrees_with_get() {
    let db = quiet(16).open_in_memory().unwrap();
    let ks = db.keyspace("ks").unwrap();
    let mut model = BTreeMap::new();
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    for _ in 0..5000 {
        let i = rng.random_range(0..2000u32);
        if rng.random_bool(0.25) {
            ks.delete(&key(i)).unwrap();
            model.remove(&key(i));
        } else {
            let v = value(i, rng.random_range(0..500));
            ks.put(&key(i), &v).unwrap();
            model.insert(key(i), v);
        }
    }
    // Present, absent, deleted and repeated keys, in a random order; more keys than the
    // multi-get window, so several windows run.
    let keys: Vec<Vec<u8>> = (0..3000).map(|_| key(rng.random_range(0..2200))).collect();
    let got = ks.multi_get(&keys).unwrap();
    assert_eq!(got.len(), keys.len());
    for (k, v) in keys.iter().zip(&got) {
        assert_eq!(v.as_ref(), model.get(k), "key {k:?}");
        assert_eq!(*v, ks.get(k).unwrap());
    }
    assert!(got.iter().any(Option::is_none) && got.iter().any(Option::is_some));
    assert_eq!(
        ks.multi_get::<&[u8]>(&[]).unwrap(),
        Vec::<Option<Vec<u8>>>::new()
    );

    // A snapshot's multi_get sees the snapshot, not later writes.
    let snap = ks.snapshot().expect("snapshot");
    let frozen = model.clone();
    for i in 0..2000u32 {
        if i % 3 == 0 {
            ks.delete(&key(i)).unwrap();
        } else {
            ks.put(&key(i), b"later").unwrap();
        }
    }
    let got = snap.multi_get(&keys).unwrap();
    for (k, v) in keys.iter().zip(&got) {
        assert_eq!(v.as_ref(), frozen.get(k));
        assert_eq!(*v, snap.get(k).unwrap());
    }
    let live = ks.multi_get(&keys).unwrap();
    for (k, v) in keys.iter().zip(&live) {
        assert_eq!(*v, ks.get(k).unwrap());
    }
    // Size limits are checked like `get`'s.
    assert!(ks
        .multi_get(&[vec![0u8; tucana::MAX_KEY_BYTES + 1]])
        .is_err());
}

#[test]
fn get_many_with_agrees_with_get_key_by_key() {
    let db = quiet(16).open_in_memory().unwrap();
    let ks = db.keyspace("ks").unwrap();
    let mut model = BTreeMap::new();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    // Short keys and long ones (separators kept in the log make lookups unsure), records
    // in closed segments, committed, and in the tail buffer.
    let long = |i: u32| {
        let mut k = format!("long-{i:05}-").into_bytes();
        k.resize(400, b'x');
        k
    };
    for step in 0..6000u32 {
        let i = rng.random_range(0..2000u32);
        let k = if i % 7 == 0 { long(i) } else { key(i) };
        if rng.random_bool(0.2) {
            ks.delete(&k).unwrap();
            model.remove(&k);
        } else {
            let v = value(i, rng.random_range(0..300));
            ks.put(&k, &v).unwrap();
            model.insert(k, v);
        }
        if step == 3000 {
            db.commit().unwrap();
        }
    }
    // Present, absent, deleted and repeated keys in a random order, more than one group.
    let keys: Vec<Vec<u8>> = (0..500)
        .map(|_| {
            let i = rng.random_range(0..2200u32);
            if i % 7 == 0 {
                long(i)
            } else {
                key(i)
            }
        })
        .collect();
    let slices: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    let mut seen = Vec::new();
    ks.get_many_with(&slices, |i, found| {
        seen.push((i, found.unwrap().map(<[u8]>::to_vec)));
    });
    assert_eq!(seen.len(), keys.len(), "one answer per key");
    for (n, (i, got)) in seen.iter().enumerate() {
        assert_eq!(*i, n, "answers in the keys' order");
        assert_eq!(got.as_ref(), model.get(&keys[n]), "key {:?}", keys[n]);
        assert_eq!(*got, ks.get(&keys[n]).unwrap());
    }
    assert!(seen.iter().any(|(_, v)| v.is_none()) && seen.iter().any(|(_, v)| v.is_some()));
    ks.get_many_with(&[], |_, _| panic!("no keys, no calls"));

    // A key over the limit gets its error; the keys around it are still answered.
    let too_long = vec![0u8; tucana::MAX_KEY_BYTES + 1];
    let mixed: Vec<&[u8]> = vec![&keys[0], &too_long, &keys[1]];
    let mut answers = Vec::new();
    ks.get_many_with(&mixed, |i, found| {
        answers.push((i, found.map(|v| v.map(<[u8]>::to_vec))))
    });
    assert_eq!(answers.len(), 3);
    assert!(matches!(
        answers[1],
        (1, Err(tucana::Error::KeyTooLarge { .. }))
    ));
    assert_eq!(answers[0].1.as_ref().unwrap().as_ref(), model.get(&keys[0]));
    assert_eq!(answers[2].1.as_ref().unwrap().as_ref(), model.get(&keys[1]));
}

#[test]
fn multi_get_of_long_keys_with_long_common_prefixes() {
    // Separators longer than an inline pivot are kept in the log: the candidate lookup
    // cannot use them and falls back to exact lookups, with the same answers.
    let db = quiet(64).open_in_memory().unwrap();
    let ks = db.keyspace("long").unwrap();
    let long_key = |i: u32| {
        let mut k = vec![b'p'; 400];
        k.extend_from_slice(format!("{i:06}").as_bytes());
        k
    };
    for i in 0..3000u32 {
        if i % 5 != 0 {
            ks.put(&long_key(i), &value(i, 50)).unwrap();
        }
    }
    let keys: Vec<_> = (0..3000u32).rev().map(long_key).collect();
    let got = ks.multi_get(&keys).unwrap();
    for (k, v) in keys.iter().zip(&got) {
        assert_eq!(*v, ks.get(k).unwrap());
    }
    assert_eq!(got.iter().filter(|v| v.is_some()).count(), 2400);
}

#[test]
fn a_long_record_is_asked_for_whole_before_it_is_read() {
    let (storage, db, ks) = load(200, 100, 64);
    let long = value(7, 50_000);
    ks.put(b"long", &long).unwrap();
    // Push it out of the tail buffer: fill the rest of its segment and the next.
    for i in 0..1000 {
        ks.put(&key(100_000 + i), &value(i, 100)).unwrap();
    }
    // And out of the in-flight set: its write is done by the sync.
    db.sync().unwrap();
    storage.take();
    let before = db.stats();
    assert_eq!(ks.get(b"long").unwrap(), Some(long));
    let events = storage.take();
    let Some(Event::Prefetch { offset, len_bytes }) = events
        .iter()
        .find(|e| matches!(e, Event::Prefetch { .. }))
        .copied()
    else {
        panic!("no prefetch in {events:?}");
    };
    assert!((50_000..=50_000 + 2 * PAGE_BYTES).contains(&len_bytes));
    // Every read of the record's body lies inside that request, after it.
    let first_prefetch = events
        .iter()
        .position(|e| matches!(e, Event::Prefetch { .. }))
        .unwrap();
    for e in &events[first_prefetch + 1..] {
        if let Event::Read {
            offset: at,
            len_bytes: len,
        } = *e
        {
            assert!(offset <= at && at + len <= offset + len_bytes, "{e:?}");
        }
    }
    assert_eq!(db.stats().prefetch_calls, before.prefetch_calls + 1);

    // Short records never cost a request when read one at a time.
    ks.get(&key(3)).unwrap().unwrap();
    assert!(!storage
        .take()
        .iter()
        .any(|e| matches!(e, Event::Prefetch { .. })));
}

#[test]
fn records_found_in_memory_stop_being_asked_for() {
    let (storage, db, ks) = load(3000, 200, 64);
    storage
        .resident
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let before = db.stats();
    assert_eq!(ks.range::<&[u8], _>(..).count(), 3000);
    let after = db.stats();
    // A few windows are asked for until the probes make a streak, then none.
    let calls = after.prefetch_calls - before.prefetch_calls;
    assert!(calls > 0 && calls < 400, "{calls} calls");
    assert!(after.prefetch_skipped - before.prefetch_skipped > 2000);
    // A multi-get of 100 cached keys decides within the call.
    let keys: Vec<_> = (0..100).map(|i| key(i * 7)).collect();
    let before = db.stats();
    ks.multi_get(&keys).unwrap();
    let after = db.stats();
    assert_eq!(after.prefetch_calls, before.prefetch_calls);
    // (Records still in the tail buffer are not counted: they are never asked for.)
    let skipped = after.prefetch_skipped - before.prefetch_skipped;
    assert!((80..=100).contains(&skipped), "{skipped}");
}

#[test]
fn a_prefetch_of_keys_asks_for_their_records_before_they_are_read() {
    let (storage, _db, ks) = load(2000, 300, 64);
    let tail = tail_segment(&storage, &key(((1999u64 * 7919) % 2000) as u32));
    let keys: Vec<Vec<u8>> = (0..40).map(|i| key(i * 47)).collect();
    let long = vec![b'x'; 70_000];
    let mut asked: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
    // An absent key and one too long are passed over, not an error.
    asked.push(b"absent");
    asked.push(&long);
    ks.prefetch(asked.iter().copied());
    assert!(
        storage
            .take()
            .iter()
            .all(|e| matches!(e, Event::Prefetch { .. })),
        "a prefetch reads nothing itself"
    );
    // Read one by one, as a server's pipelined commands do: every read outside the tail
    // segment falls in pages asked for by the one call above (the events are re-logged
    // with the prefetch first to check it).
    ks.prefetch(asked.iter().copied());
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(ks.get(k).unwrap(), Some(value(i as u32 * 47, 300)));
    }
    let events = storage.take();
    assert!(assert_reads_prefetched_first(&events, tail) > 0);
}

#[test]
fn a_prefetch_of_keys_in_memory_stops_asking_and_asks_again_once_they_are_evicted() {
    let (storage, db, ks) = load(2000, 300, 64);
    let resident = |on: bool| {
        storage
            .resident
            .store(on, std::sync::atomic::Ordering::Relaxed)
    };
    let batch = |b: u32| -> Vec<Vec<u8>> { (0..16).map(|i| key((b * 16 + i) % 2000)).collect() };
    let prefetch = |b: u32| {
        let keys = batch(b);
        ks.prefetch(keys.iter().map(|k| k.as_slice()));
    };
    resident(true);
    for b in 0..20 {
        prefetch(b);
    }
    // Hot now: a run of calls asks for nothing.
    let before = db.stats();
    storage.take();
    for b in 20..60 {
        prefetch(b);
    }
    let after = db.stats();
    assert_eq!(after.prefetch_calls, before.prefetch_calls);
    assert!(!storage
        .take()
        .iter()
        .any(|e| matches!(e, Event::Prefetch { .. })));
    // Evicted (the storage cannot tell any more): within a few calls a probe misses and
    // the keys are asked for again. (A gate with `with_streak`'s free passes, made anew
    // for each call, would pass every call unprobed and never see it.)
    resident(false);
    let before = db.stats();
    for b in 60..80 {
        prefetch(b);
    }
    let after = db.stats();
    assert!(after.prefetch_calls > before.prefetch_calls);
    assert!(storage
        .take()
        .iter()
        .any(|e| matches!(e, Event::Prefetch { .. })));
}
