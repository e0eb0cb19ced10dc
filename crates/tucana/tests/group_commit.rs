//! Group commit under concurrent sync writers (DESIGN.md, "Group commit, pipelined"): every
//! acknowledged `Sync` write survives a power cut taken after its acknowledgement, and a
//! failed `fdatasync` acknowledges nothing after it, on a simulated disk that keeps the
//! durable image apart from the written one, counts and delays its syncs, and can fail one
//! the way Linux does (the pages it was writing are dropped, a later sync "succeeds").

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use tucana::volume::Storage;
use tucana::{Database, Durability, Error};

/// A disk that forgets, at a power cut, everything no completed `sync` made durable.
/// `write_at` and `punch_hole` change the written image and note their range; `sync`
/// takes the ranges noted so far and their bytes as they are when it starts, waits
/// `sync_delay`, then copies them to the durable image (or, failing, drops them).
struct PowerCut {
    written: RwLock<Vec<u8>>,
    durable: Mutex<Vec<u8>>,
    /// Ranges written since the last sync began.
    pending: Mutex<Vec<(usize, usize)>>,
    sync_delay: Duration,
    syncs: AtomicU64,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    fail_next_sync: AtomicBool,
    failed_syncs: AtomicU64,
}

impl PowerCut {
    fn new(image: Vec<u8>, sync_delay: Duration) -> Arc<PowerCut> {
        Arc::new(PowerCut {
            written: RwLock::new(image.clone()),
            durable: Mutex::new(image),
            pending: Mutex::new(Vec::new()),
            sync_delay,
            syncs: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            fail_next_sync: AtomicBool::new(false),
            failed_syncs: AtomicU64::new(0),
        })
    }

    /// The image a power cut now would leave.
    fn cut(&self) -> Vec<u8> {
        self.durable.lock().unwrap().clone()
    }
}

impl Storage for PowerCut {
    fn len_bytes(&self) -> tucana::Result<u64> {
        Ok(self.written.read().len() as u64)
    }
    fn grow(&self, len_bytes: u64) -> tucana::Result<()> {
        let mut written = self.written.write();
        if len_bytes as usize > written.len() {
            written.resize(len_bytes as usize, 0);
        }
        Ok(())
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> tucana::Result<()> {
        let written = self.written.read();
        let start = offset as usize;
        let Some(bytes) = written.get(start..start + buf.len()) else {
            return Err(Error::Io(std::io::Error::other("read past the end")));
        };
        buf.copy_from_slice(bytes);
        Ok(())
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> tucana::Result<()> {
        let start = offset as usize;
        self.written.write()[start..start + data.len()].copy_from_slice(data);
        self.pending.lock().unwrap().push((start, data.len()));
        Ok(())
    }
    fn punch_hole(&self, offset: u64, len: u64) -> tucana::Result<()> {
        let mut written = self.written.write();
        let start = (offset as usize).min(written.len());
        let end = (offset.saturating_add(len) as usize).min(written.len());
        written[start..end].fill(0);
        self.pending.lock().unwrap().push((start, end - start));
        Ok(())
    }
    fn sync(&self) -> tucana::Result<()> {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let (len, pieces) = {
            let written = self.written.read();
            let ranges = std::mem::take(&mut *self.pending.lock().unwrap());
            let pieces: Vec<(usize, Vec<u8>)> = ranges
                .into_iter()
                .map(|(at, len)| (at, written[at..at + len].to_vec()))
                .collect();
            (written.len(), pieces)
        };
        std::thread::sleep(self.sync_delay);
        let result = if self.fail_next_sync.swap(false, Ordering::SeqCst) {
            // As Linux after a failed writeback: the pages are marked clean, their bytes
            // never reach the disk, and the next sync has nothing of theirs to write.
            self.failed_syncs.fetch_add(1, Ordering::SeqCst);
            Err(Error::Io(std::io::Error::other(
                "injected fdatasync failure",
            )))
        } else {
            let mut durable = self.durable.lock().unwrap();
            if durable.len() < len {
                durable.resize(len, 0);
            }
            for (at, bytes) in pieces {
                durable[at..at + bytes.len()].copy_from_slice(&bytes);
            }
            self.syncs.fetch_add(1, Ordering::SeqCst);
            Ok(())
        };
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        result
    }
}

const WRITERS: usize = 8;

fn options() -> tucana::Options {
    Database::builder()
        .commit_interval(None)
        // Background threads run (segments closed by the writers are written by the
        // members' writers in flight), but no periodic sync or commit.
        .flush_interval(Some(Duration::from_secs(3600)))
        .gc(false)
        .log_segment_bytes(64 << 10)
}

fn key(writer: usize, i: u64) -> Vec<u8> {
    format!("w{writer:02}-{i:06}").into_bytes()
}

fn value(writer: usize, i: u64) -> Vec<u8> {
    let mut v = format!("value {writer} {i}:").into_bytes();
    v.resize(300, b'a' + (i % 26) as u8);
    v
}

/// Runs `WRITERS` threads of `Sync` puts of fresh keys until each has done `max_writes`
/// or got an error; `acked[w]` counts writer `w`'s acknowledged puts (its keys below it).
/// Returns each writer's first error, if any.
fn run_writers(
    db: &Database,
    acked: &Arc<Vec<AtomicU64>>,
    max_writes: u64,
) -> Vec<std::thread::JoinHandle<Option<Error>>> {
    (0..WRITERS)
        .map(|w| {
            let ks = db.keyspace("ks").unwrap();
            let acked = acked.clone();
            std::thread::spawn(move || {
                for i in 0..max_writes {
                    if let Err(e) = ks.put_with(&key(w, i), &value(w, i), Durability::Sync) {
                        return Some(e);
                    }
                    acked[w].store(i + 1, Ordering::SeqCst);
                }
                None
            })
        })
        .collect()
}

/// Opens a power cut's image and checks every write acknowledged before it is there.
fn assert_survives(image: Vec<u8>, acked: &[u64], what: &str) {
    let storage = PowerCut::new(image, Duration::ZERO);
    let db = options()
        .flush_interval(None)
        .open_storage(storage)
        .unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
    let ks = db.open_keyspace("ks").unwrap();
    for (w, &count) in acked.iter().enumerate() {
        for i in 0..count {
            let got = ks.get(&key(w, i)).unwrap();
            assert_eq!(
                got.as_deref(),
                Some(&value(w, i)[..]),
                "{what}: writer {w}'s acknowledged write {i} of {count} is lost"
            );
        }
    }
    db.check().unwrap_or_else(|e| panic!("{what}: check: {e}"));
}

fn acked_now(acked: &[AtomicU64]) -> Vec<u64> {
    acked.iter().map(|a| a.load(Ordering::SeqCst)).collect()
}

#[test]
fn every_acknowledged_sync_write_survives_a_power_cut_after_its_ack() {
    const WRITES: u64 = 300;
    let sim = PowerCut::new(Vec::new(), Duration::from_micros(300));
    let db = options().open_storage(sim.clone()).unwrap();
    db.keyspace("ks").unwrap();
    let acked: Arc<Vec<AtomicU64>> = Arc::new((0..WRITERS).map(|_| AtomicU64::new(0)).collect());
    let syncs_before = sim.syncs.load(Ordering::SeqCst);
    let writers = run_writers(&db, &acked, WRITES);

    // Power cuts while they write: what was acknowledged before each must be in it.
    let mut cuts = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while writers.iter().any(|h| !h.is_finished()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(15));
        // The count first: every write it names was acknowledged before the cut.
        let counted = acked_now(&acked);
        cuts.push((counted, sim.cut()));
    }
    for handle in writers {
        assert!(handle.join().unwrap().is_none(), "a healthy write failed");
    }
    cuts.push((acked_now(&acked), sim.cut()));

    let writes = WRITERS as u64 * WRITES;
    assert_eq!(acked_now(&acked), vec![WRITES; WRITERS]);
    let syncs = sim.syncs.load(Ordering::SeqCst) - syncs_before;
    println!(
        "{writes} sync writes by {WRITERS} writers: {syncs} syncs, {} power cuts",
        cuts.len()
    );
    assert!(syncs <= writes, "{syncs} syncs for {writes} writes");
    // Nothing but group commit syncs here (no commit runs): one `fdatasync` at a time.
    assert_eq!(sim.max_in_flight.load(Ordering::SeqCst), 1);
    drop(db);
    let n = cuts.len();
    for (k, (counted, image)) in cuts.into_iter().enumerate() {
        assert_survives(image, &counted, &format!("power cut {k} of {n}"));
    }
}

#[test]
fn a_failed_fsync_under_concurrent_sync_writers_acknowledges_nothing_after_it() {
    const MAX_WRITES: u64 = 5_000;
    let sim = PowerCut::new(Vec::new(), Duration::from_micros(300));
    let db = options().open_storage(sim.clone()).unwrap();
    db.keyspace("ks").unwrap();
    let acked: Arc<Vec<AtomicU64>> = Arc::new((0..WRITERS).map(|_| AtomicU64::new(0)).collect());
    let writers = run_writers(&db, &acked, MAX_WRITES);
    let deadline = Instant::now() + Duration::from_secs(120);
    while acked_now(&acked).iter().sum::<u64>() < 200 {
        assert!(Instant::now() < deadline, "the writers made no progress");
        std::thread::sleep(Duration::from_millis(1));
    }
    sim.fail_next_sync.store(true, Ordering::SeqCst);

    // Every writer stops at an error: the failed sync's (its I/O error), or the
    // poisoned store's.
    let errors: Vec<Error> = writers
        .into_iter()
        .map(|h| {
            h.join()
                .unwrap()
                .expect("a writer ran on past a failed fsync")
        })
        .collect();
    assert_eq!(sim.failed_syncs.load(Ordering::SeqCst), 1);
    assert!(
        errors.iter().any(|e| matches!(e, Error::Io(_))),
        "someone got the I/O error: {errors:?}"
    );
    for e in &errors {
        assert!(matches!(e, Error::Io(_) | Error::Poisoned), "{e}");
    }
    let ks = db.keyspace("ks").unwrap();
    assert!(matches!(
        ks.put_with(b"after", b"x", Durability::Sync),
        Err(Error::Poisoned)
    ));
    assert!(matches!(db.sync(), Err(Error::Poisoned)));

    // The failed sync's bytes never reached the disk. Had a later sync "succeeded" and
    // acknowledged writes whose bytes it dropped, they would be missing here.
    let counted = acked_now(&acked);
    let image = sim.cut();
    drop(ks);
    drop(db);
    assert_survives(image, &counted, "after the failed fsync");
}
