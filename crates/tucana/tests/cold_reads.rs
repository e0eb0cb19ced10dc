//! Records read by copy while the data looks larger than memory (`Options::cold_reads_copied`,
//! DESIGN.md "What a larger-than-memory read costs"): a storage wrapper that says whether
//! pages are resident and logs the reads shows that records found missing are copied with
//! `Storage::read_random_at`, one request per record of average size, that records in
//! memory never are, and that values are the same either way. Nothing here measures time.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tucana::volume::{MemStorage, Storage};
use tucana::{Database, Keyspace, Options, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    /// `read_at`: the reads of a backend without a mapping (the mapped path here).
    Read,
    /// `read_random_at`: a copied record.
    RandomRead { len_bytes: u64 },
}

/// What `resident` answers.
const UNKNOWN: u8 = 0;
const RESIDENT: u8 = 1;
const MISSING: u8 = 2;

/// A memory volume that logs reads and answers residency as told.
struct Residency {
    inner: MemStorage,
    events: Mutex<Vec<Event>>,
    answer: AtomicU8,
}

impl Residency {
    fn new(answer: u8) -> Arc<Residency> {
        Arc::new(Residency {
            inner: MemStorage::new(),
            events: Mutex::new(Vec::new()),
            answer: AtomicU8::new(answer),
        })
    }

    fn take(&self) -> Vec<Event> {
        std::mem::take(&mut *self.events.lock())
    }
}

impl Storage for Residency {
    fn len_bytes(&self) -> Result<u64> {
        self.inner.len_bytes()
    }
    fn grow(&self, len_bytes: u64) -> Result<()> {
        self.inner.grow(len_bytes)
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.events.lock().push(Event::Read);
        self.inner.read_at(offset, buf)
    }
    fn read_random_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.events.lock().push(Event::RandomRead {
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
    fn resident(&self, _offset: u64) -> Option<bool> {
        match self.answer.load(Ordering::Relaxed) {
            RESIDENT => Some(true),
            MISSING => Some(false),
            _ => None,
        }
    }
}

/// No background work: every read is the test's.
fn quiet() -> Options {
    Database::builder()
        .commit_interval(None)
        .flush_interval(None)
        .gc(false)
        .log_segment_bytes(64 << 10)
}

fn key(i: u32) -> Vec<u8> {
    format!("k{i:07}").into_bytes()
}

/// Values of `len(i)` bytes that name their key.
fn value(i: u32, len: usize) -> Vec<u8> {
    let mut v = format!("value of {i}:").into_bytes();
    v.resize(len, b'.');
    v
}

/// Loads keys `0..n` in a scrambled order with values of `len(i)` bytes, syncs (so closed
/// segments are read from the volume) and clears the log of reads.
fn load(
    storage: &Arc<Residency>,
    options: Options,
    n: u32,
    len: impl Fn(u32) -> usize,
) -> (Database, Keyspace) {
    let db = options.open_storage(storage.clone()).expect("open");
    let ks = db.keyspace("ks").expect("keyspace");
    for j in 0..n {
        let i = ((j as u64 * 7919) % n as u64) as u32;
        ks.put(&key(i), &value(i, len(i))).expect("put");
    }
    db.sync().expect("sync");
    storage.take();
    (db, ks)
}

/// Reads every key once in a scrambled order, checking each value.
fn read_all(ks: &Keyspace, n: u32, len: impl Fn(u32) -> usize) {
    for j in 0..n {
        let i = ((j as u64 * 104_729) % n as u64) as u32;
        let got = ks.get(&key(i)).expect("get").expect("present");
        assert_eq!(got, value(i, len(i)), "value of key {i}");
    }
}

fn random_reads(events: &[Event]) -> Vec<u64> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::RandomRead { len_bytes } => Some(*len_bytes),
            Event::Read => None,
        })
        .collect()
}

#[test]
fn records_missing_from_memory_are_copied_in_one_request_each() {
    let n = 3000;
    let storage = Residency::new(MISSING);
    let (db, ks) = load(&storage, quiet(), n, |_| 1000);
    let before = db.stats().copied_record_reads;
    read_all(&ks, n, |_| 1000);
    let copied = db.stats().copied_record_reads - before;
    // Three sampled misses (one read in 128 is sampled) turn copying on; the tail
    // segment's records come from its buffer.
    assert!(
        copied > u64::from(n) * 3 / 4,
        "{copied} of {n} reads copied"
    );
    let sizes = random_reads(&storage.take());
    // Every record has the average size, so the first request reads all of it.
    assert_eq!(sizes.len() as u64, copied, "one request per copied record");
    assert!(sizes.iter().all(|&len| len >= 1000), "{sizes:?}");
    // A second pass still finds the data missing and still reads the right values.
    read_all(&ks, n, |_| 1000);
    assert!(db.stats().copied_record_reads - before > u64::from(n) * 17 / 10);
}

#[test]
fn records_in_memory_or_of_unknown_residency_are_never_copied() {
    for answer in [RESIDENT, UNKNOWN] {
        let n = 2000;
        let storage = Residency::new(answer);
        let (db, ks) = load(&storage, quiet(), n, |_| 500);
        read_all(&ks, n, |_| 500);
        read_all(&ks, n, |_| 500);
        assert_eq!(db.stats().copied_record_reads, 0, "answer {answer}");
        assert!(random_reads(&storage.take()).is_empty());
    }
}

#[test]
fn copying_turned_off_never_copies() {
    let n = 2000;
    let storage = Residency::new(MISSING);
    let (db, ks) = load(&storage, quiet().cold_reads_copied(false), n, |_| 500);
    read_all(&ks, n, |_| 500);
    assert_eq!(db.stats().copied_record_reads, 0);
    assert!(random_reads(&storage.take()).is_empty());
}

#[test]
fn reads_go_back_to_the_mapping_once_the_data_is_in_memory() {
    let n = 3000;
    let storage = Residency::new(MISSING);
    let (db, ks) = load(&storage, quiet(), n, |_| 300);
    read_all(&ks, n, |_| 300);
    assert!(db.stats().copied_record_reads > 0);
    // The data is in memory now: after some 43 samples, 5,500 reads (the moving average
    // falling from nearly all misses to below its exit share), no more copies.
    storage.answer.store(RESIDENT, Ordering::Relaxed);
    for _ in 0..3 {
        read_all(&ks, n, |_| 300);
    }
    let copied = db.stats().copied_record_reads;
    storage.take();
    read_all(&ks, n, |_| 300);
    assert_eq!(db.stats().copied_record_reads, copied);
    assert!(random_reads(&storage.take()).is_empty());
}

#[test]
fn records_longer_than_the_average_are_copied_whole() {
    // One record in 50 has a 20 KB value, the rest 100 B: the first request reads about
    // the average record, and a long record's rest comes in a second one.
    let n = 3000;
    let len = |i: u32| if i % 50 == 7 { 20_000 } else { 100 };
    let storage = Residency::new(MISSING);
    let (db, ks) = load(&storage, quiet(), n, len);
    let before = db.stats().copied_record_reads;
    read_all(&ks, n, len);
    let copied = db.stats().copied_record_reads - before;
    assert!(
        copied > u64::from(n) * 3 / 4,
        "{copied} of {n} reads copied"
    );
    let requests = random_reads(&storage.take()).len() as u64;
    assert!(requests > copied, "long records take a second request");
    assert!(
        requests <= copied + u64::from(n / 50),
        "at most two per long record"
    );
}
