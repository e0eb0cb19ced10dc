//! Writes in flight (DESIGN.md, "Volumes over several devices", *Writes in flight*): a
//! closed log segment is written by a background writer while its region goes on.
//! These tests hold the background writes back behind a gate (a storage whose large
//! writes wait until the test opens it), so what must stay true while a write is in
//! flight is checked while it certainly is: readers read the segment from its buffer
//! (the volume does not have its bytes yet, so a read from there fails its checksum), a
//! sync waits for every write queued before it, a writer waits when the budget is full,
//! a failed background write is reported by the next sync and poisons the store, and
//! dropping the database writes what is queued.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use tucana::volume::{MemStorage, Storage};
use tucana::{Database, Error};

const SEGMENT_BYTES: u64 = 64 << 10;
/// Writes at least this long are a closed segment's (a sync's flush of a tail writes the
/// part since its last flush, far less in these tests).
const BIG_WRITE_BYTES: usize = 32 << 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    /// A write of a closed segment returned.
    BigWrite {
        offset: u64,
    },
    Sync,
}

/// Memory storage whose big writes wait while the gate is closed, and fail while `fail`
/// is set; it records when each big write returned and each sync ran.
struct Gated {
    inner: MemStorage,
    closed: Mutex<bool>,
    opened: Condvar,
    fail: AtomicBool,
    events: Mutex<Vec<Event>>,
    /// Big writes waiting at the gate now.
    waiting: AtomicU64,
}

impl Gated {
    fn new() -> Arc<Gated> {
        Arc::new(Gated {
            inner: MemStorage::new(),
            closed: Mutex::new(false),
            opened: Condvar::new(),
            fail: AtomicBool::new(false),
            events: Mutex::new(Vec::new()),
            waiting: AtomicU64::new(0),
        })
    }

    fn close_gate(&self) {
        *self.closed.lock() = true;
    }

    fn open_gate(&self) {
        *self.closed.lock() = false;
        self.opened.notify_all();
    }

    fn events(&self) -> Vec<Event> {
        self.events.lock().clone()
    }
}

impl Storage for Gated {
    fn len_bytes(&self) -> tucana::Result<u64> {
        self.inner.len_bytes()
    }
    fn grow(&self, len_bytes: u64) -> tucana::Result<()> {
        self.inner.grow(len_bytes)
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> tucana::Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> tucana::Result<()> {
        if data.len() < BIG_WRITE_BYTES {
            return self.inner.write_at(offset, data);
        }
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let mut closed = self.closed.lock();
        while *closed {
            self.opened.wait(&mut closed);
        }
        drop(closed);
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        if self.fail.load(Ordering::SeqCst) {
            return Err(Error::Io(std::io::Error::other("injected write error")));
        }
        self.inner.write_at(offset, data)?;
        self.events.lock().push(Event::BigWrite { offset });
        Ok(())
    }
    fn sync(&self) -> tucana::Result<()> {
        self.events.lock().push(Event::Sync);
        self.inner.sync()
    }
}

/// With background threads (so with a writer thread per member), but nothing timed that
/// would run during a test: no commits, no GC, a flush interval of an hour.
fn options() -> tucana::Options {
    Database::builder()
        .commit_interval(None)
        .flush_interval(Some(Duration::from_secs(3600)))
        .gc(false)
        .log_segment_bytes(SEGMENT_BYTES)
}

fn key(i: u32) -> Vec<u8> {
    format!("key{i:06}").into_bytes()
}

fn value(i: u32) -> Vec<u8> {
    let mut v = format!("value of {i}:").into_bytes();
    v.resize(1000, b'a' + (i % 26) as u8);
    v
}

/// Waits (up to a minute: a loaded machine) until `cond` holds; panics otherwise.
fn wait_until(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..6000 {
        if cond() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("waited a minute for {what}");
}

#[test]
fn readers_read_a_closed_segment_from_its_buffer_until_its_write_is_done() {
    let storage = Gated::new();
    let db = options().open_storage(storage.clone()).unwrap();
    let ks = db.keyspace("ks").unwrap();
    db.commit().unwrap();
    storage.close_gate();
    storage.events.lock().clear();
    // About 3 closed segments (64 records of 1 KB each), under the budget of 4.
    let n = 200u32;
    for i in 0..n {
        ks.put(&key(i), &value(i)).unwrap();
    }
    wait_until("the first closed segment's write at the gate", || {
        storage.waiting.load(Ordering::SeqCst) >= 1
    });
    assert!(db.stats().writes_in_flight_bytes >= 3 * SEGMENT_BYTES);
    assert!(
        storage.events().is_empty(),
        "no closed segment reached the volume yet"
    );

    // Point reads, groups of gets, scans both ways: all from the buffers.
    for i in 0..n {
        assert_eq!(ks.get(&key(i)).unwrap(), Some(value(i)), "get {i}");
    }
    let keys: Vec<Vec<u8>> = (0..n).map(key).collect();
    let got = ks.multi_get(&keys).unwrap();
    for (i, v) in got.into_iter().enumerate() {
        assert_eq!(v, Some(value(i as u32)), "multi_get {i}");
    }
    let mut seen = 0u32;
    for item in ks.range::<&[u8], _>(..) {
        let (k, v) = item.unwrap();
        assert_eq!((k, v), (key(seen), value(seen)));
        seen += 1;
    }
    assert_eq!(seen, n);
    assert_eq!(ks.range::<&[u8], _>(..).rev().count(), n as usize);

    // Shipping: the closed segments' bytes, which the volume does not have yet.
    let source = db.ship_source("ks").unwrap();
    let closed: Vec<_> = source
        .segments(0, 100)
        .into_iter()
        .filter(|s| !s.open && s.ready_bytes > 0)
        .collect();
    assert!(closed.len() >= 3, "{closed:?}");
    let mut shipped = Vec::new();
    for s in &closed {
        let mut buf = vec![0u8; s.ready_bytes as usize];
        source.read(s.base, 0, &mut buf).unwrap();
        let mut on_volume = vec![0u8; buf.len()];
        storage.inner.read_at(s.base.0, &mut on_volume).unwrap();
        assert_ne!(buf, on_volume, "segment {:?} is still in flight", s.base);
        shipped.push((s.base, buf));
    }

    // A sync waits for every write queued before it: let it start, then open the gate.
    let syncer = {
        let db = db.clone();
        std::thread::spawn(move || db.sync())
    };
    std::thread::sleep(Duration::from_millis(100));
    storage.open_gate();
    syncer.join().unwrap().unwrap();
    let events = storage.events();
    let sync_at = events
        .iter()
        .position(|e| *e == Event::Sync)
        .expect("the sync reached the storage");
    for (base, bytes) in &shipped {
        let written_at = events
            .iter()
            .position(|e| *e == Event::BigWrite { offset: base.0 })
            .unwrap_or_else(|| panic!("segment {base:?} was written: {events:?}"));
        assert!(
            written_at < sync_at,
            "segment {base:?} written after the sync: {events:?}"
        );
        let mut on_volume = vec![0u8; bytes.len()];
        storage.inner.read_at(base.0, &mut on_volume).unwrap();
        assert_eq!(&on_volume, bytes, "shipped bytes are the volume's");
    }
    assert_eq!(db.stats().writes_in_flight_bytes, 0);
    for i in 0..n {
        assert_eq!(ks.get(&key(i)).unwrap(), Some(value(i)), "get {i} after");
    }
    drop(ks);
    db.close().unwrap();
}

#[test]
fn a_writer_waits_when_the_budget_is_full() {
    let storage = Gated::new();
    let db = options()
        .writes_in_flight_segments(2)
        .open_storage(storage.clone())
        .unwrap();
    let ks = db.keyspace("ks").unwrap();
    storage.close_gate();
    // About 10 segments' worth: more than the budget of 2.
    let n = 640u32;
    let done = Arc::new(AtomicU64::new(0));
    let writer = {
        let (ks, done) = (ks.clone(), Arc::clone(&done));
        std::thread::spawn(move || {
            for i in 0..n {
                ks.put(&key(i), &value(i)).unwrap();
                done.store(u64::from(i) + 1, Ordering::SeqCst);
            }
        })
    };
    // (`db.stats()` would wait for the writer's lock, which the waiting writer holds.)
    wait_until("the first write at the gate", || {
        storage.waiting.load(Ordering::SeqCst) >= 1
    });
    // The writer cannot finish: the gate holds the budget (2 segments, about 128
    // records; a third closed segment is the most it can reach).
    std::thread::sleep(Duration::from_millis(200));
    assert!(!writer.is_finished(), "the writer went past a full budget");
    let progressed = done.load(Ordering::SeqCst);
    assert!(
        progressed < 4 * 64,
        "{progressed} records written past a full budget"
    );
    storage.open_gate();
    writer.join().unwrap();
    for i in 0..n {
        assert_eq!(ks.get(&key(i)).unwrap(), Some(value(i)), "get {i}");
    }
    drop(ks);
    db.close().unwrap();
}

#[test]
fn a_failed_background_write_is_reported_by_the_next_sync_and_poisons_the_store() {
    let storage = Gated::new();
    let db = options().open_storage(storage.clone()).unwrap();
    let ks = db.keyspace("ks").unwrap();
    ks.put_with(b"durable", b"1", tucana::Durability::Sync)
        .unwrap();
    storage.close_gate();
    storage.fail.store(true, Ordering::SeqCst);
    // Two closed segments queued; their writer waits at the gate, so these return Ok
    // (the error can only surface later).
    for i in 0..150u32 {
        ks.put(&key(i), &value(i)).unwrap();
    }
    storage.open_gate();
    let err = db.sync().unwrap_err();
    assert!(
        matches!(err, Error::Io(_)),
        "the sync reports the write's error: {err}"
    );
    storage.fail.store(false, Ordering::SeqCst);
    assert!(matches!(ks.put(b"after", b"2"), Err(Error::Poisoned)));
    assert!(matches!(db.sync(), Err(Error::Poisoned)));
    assert!(matches!(db.commit(), Err(Error::Poisoned)));
    // Reads go on, from the buffers the failed writes kept.
    for i in 0..150u32 {
        assert_eq!(ks.get(&key(i)).unwrap(), Some(value(i)), "get {i}");
    }
    drop(ks);
    assert!(db.close().is_err());

    let db = options().open_storage(storage).unwrap();
    let ks = db.open_keyspace("ks").unwrap();
    assert_eq!(ks.get(b"durable").unwrap().as_deref(), Some(&b"1"[..]));
    db.check().unwrap();
}

#[test]
fn dropping_the_database_writes_what_is_in_flight() {
    let storage = Gated::new();
    let db = options().open_storage(storage.clone()).unwrap();
    let ks = db.keyspace("ks").unwrap();
    db.commit().unwrap();
    storage.close_gate();
    let n = 200u32;
    for i in 0..n {
        ks.put(&key(i), &value(i)).unwrap();
    }
    drop(ks);
    // Dropped as a crashing process would (no sync, no commit): the queue still writes
    // what it was handed, like the kernel would have had a synchronous write.
    let dropper = std::thread::spawn(move || db.abandon());
    std::thread::sleep(Duration::from_millis(50));
    storage.open_gate();
    dropper.join().unwrap();
    assert!(
        storage
            .events()
            .iter()
            .filter(|e| matches!(e, Event::BigWrite { .. }))
            .count()
            >= 3
    );

    // Replay follows the closed segments' chain: all but the unflushed tail's records.
    let db = options().open_storage(storage).unwrap();
    let ks = db.open_keyspace("ks").unwrap();
    let recovered = ks.len();
    assert!(recovered >= 180, "{recovered} of {n} records replayed");
    for i in 0..recovered as u32 {
        assert_eq!(ks.get(&key(i)).unwrap(), Some(value(i)), "get {i}");
    }
    db.check().unwrap();
}

/// Storage whose big writes take a while, so that segments stay in flight for long.
struct Slow {
    inner: MemStorage,
}

impl Storage for Slow {
    fn len_bytes(&self) -> tucana::Result<u64> {
        self.inner.len_bytes()
    }
    fn grow(&self, len_bytes: u64) -> tucana::Result<()> {
        self.inner.grow(len_bytes)
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> tucana::Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> tucana::Result<()> {
        if data.len() >= BIG_WRITE_BYTES {
            std::thread::sleep(Duration::from_micros(300));
        }
        self.inner.write_at(offset, data)
    }
    fn sync(&self) -> tucana::Result<()> {
        self.inner.sync()
    }
}

/// Readers racing a writer whose segments move from the tail slot to the in-flight set
/// and then to the volume: every read finds its record in one of the three. Were a closed
/// segment let go of by its tail slot before it is findable in flight, or taken out of
/// flight before its write returned, a reader would read zeros from the volume there.
#[test]
fn readers_racing_segment_switches_always_find_their_records() {
    let storage: Arc<dyn Storage> = Arc::new(Slow {
        inner: MemStorage::new(),
    });
    let db = options().open_storage(storage).unwrap();
    let ks = db.keyspace("ks").unwrap();
    let written = Arc::new(AtomicU64::new(0));
    let n = 3000u32;
    let readers: Vec<_> = (0..2)
        .map(|r| {
            let (ks, written) = (ks.clone(), Arc::clone(&written));
            std::thread::spawn(move || {
                let mut x = 0x9e37_79b9u32.wrapping_mul(r + 1);
                let mut reads = 0u64;
                loop {
                    let upto = written.load(Ordering::Acquire) as u32;
                    if upto == n {
                        return reads;
                    }
                    if upto == 0 {
                        std::thread::yield_now();
                        continue;
                    }
                    // Mostly the newest records (near the tail switch), some older ones.
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    let i = if x.is_multiple_of(4) {
                        x % upto
                    } else {
                        upto - 1 - (x % upto.min(128))
                    };
                    assert_eq!(ks.get(&key(i)).unwrap(), Some(value(i)), "get {i}");
                    reads += 1;
                }
            })
        })
        .collect();
    for i in 0..n {
        ks.put(&key(i), &value(i)).unwrap();
        written.store(u64::from(i) + 1, Ordering::Release);
    }
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
    drop(ks);
    db.close().unwrap();
}

#[test]
fn per_member_queue_figures_show_a_held_member_and_move_when_it_drains() {
    // Three members, the middle one holding its segment writes at a gate: its write
    // queue shows jobs and bytes while the others' are empty (and those count time idle
    // while a member is busy); least-weighted dispatch then sends segments elsewhere;
    // opening the gate drains it, and the figures move back.
    use tucana::volume::{DispatchPolicy, MemberSet};
    let gated = Gated::new();
    let members: Vec<(String, Arc<dyn Storage>)> = vec![
        ("m0".into(), Arc::new(MemStorage::new())),
        ("m1".into(), gated.clone()),
        ("m2".into(), Arc::new(MemStorage::new())),
    ];
    let set = MemberSet::open(members, true)
        .unwrap()
        .with_policy(DispatchPolicy::LeastWeightedQueue);
    // A budget no test load here fills, so nothing waits for member 1 but its own jobs.
    let db = options()
        .writes_in_flight_segments(64)
        .open_storage(Arc::new(set))
        .unwrap();
    let ks = db.keyspace("ks").unwrap();
    let before = db.stats();
    assert_eq!(before.members.len(), 3);
    assert!(before.members.iter().all(|m| m.queue_jobs == 0));
    gated.close_gate();
    let mut i = 0u32;
    // Until one segment's write waits at member 1's gate.
    while gated.waiting.load(Ordering::SeqCst) == 0 {
        ks.put(&key(i), &value(i)).unwrap();
        i += 1;
        assert!(i < 100_000, "no segment went to member 1");
    }
    // Twelve more segments (how many go to member 1 depends on how soon the other
    // members' workers run on a loaded machine: the unit tests check the steering).
    for _ in 0..(12 * SEGMENT_BYTES / 1000) {
        ks.put(&key(i), &value(i)).unwrap();
        i += 1;
    }
    let held = db.stats();
    let m1 = &held.members[1];
    assert!(m1.queue_jobs >= 1, "{m1:?}");
    assert!(m1.queue_bytes >= SEGMENT_BYTES, "{m1:?}");
    let json = held.to_json();
    for field in [
        "queue_jobs",
        "queue_bytes",
        "queue_done_jobs",
        "idle_while_others_busy_ns",
    ] {
        assert!(json.contains(&format!("\"{field}\":")), "{field} in {json}");
    }
    // The others kept writing.
    let elsewhere: u64 = [&held.members[0], &held.members[2]]
        .iter()
        .map(|m| m.queue_done_jobs + m.queue_jobs)
        .sum();
    assert!(elsewhere >= 8, "{held:?}");
    // An idle member accrues idle time while member 1 is busy.
    let idle_before = held.members[0].idle_while_others_busy_ns;
    std::thread::sleep(Duration::from_millis(5));
    let later = db.stats();
    if later.members[0].queue_jobs == 0 {
        assert!(
            later.members[0].idle_while_others_busy_ns > idle_before,
            "{later:?}"
        );
    }
    gated.open_gate();
    db.sync().unwrap();
    let after = db.stats();
    for m in &after.members {
        assert_eq!((m.queue_jobs, m.queue_bytes), (0, 0), "{m:?}");
    }
    assert!(after.members[1].queue_done_jobs > m1.queue_done_jobs);
    assert!(after.members[1].bytes_written > m1.bytes_written);
    for j in (0..i).step_by(97) {
        assert_eq!(ks.get(&key(j)).unwrap(), Some(value(j)));
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NodeEvent {
    /// A node run (an uncached write) arrived at the closed gate.
    NodeRunHeld,
    NodeRunDone,
    /// Any other write, and whether a write-queue worker did it.
    OtherWrite {
        by_worker: bool,
    },
    Sync,
}

/// Memory storage whose uncached writes (a commit's node runs) wait while the gate is
/// closed; it records node runs, other writes and syncs in order.
struct NodeGated {
    inner: MemStorage,
    closed: Mutex<bool>,
    opened: Condvar,
    events: Mutex<Vec<NodeEvent>>,
}

impl NodeGated {
    fn new() -> Arc<NodeGated> {
        Arc::new(NodeGated {
            inner: MemStorage::new(),
            closed: Mutex::new(false),
            opened: Condvar::new(),
            events: Mutex::new(Vec::new()),
        })
    }

    fn set_gate(&self, closed: bool) {
        *self.closed.lock() = closed;
        self.opened.notify_all();
    }

    fn events(&self) -> Vec<NodeEvent> {
        self.events.lock().clone()
    }
}

impl Storage for NodeGated {
    fn len_bytes(&self) -> tucana::Result<u64> {
        self.inner.len_bytes()
    }
    fn grow(&self, len_bytes: u64) -> tucana::Result<()> {
        self.inner.grow(len_bytes)
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> tucana::Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> tucana::Result<()> {
        let by_worker = std::thread::current()
            .name()
            .is_some_and(|n| n.starts_with("tucana-write"));
        self.inner.write_at(offset, data)?;
        self.events.lock().push(NodeEvent::OtherWrite { by_worker });
        Ok(())
    }
    fn write_uncached_at(&self, offset: u64, data: &[u8]) -> tucana::Result<()> {
        let mut closed = self.closed.lock();
        if *closed {
            self.events.lock().push(NodeEvent::NodeRunHeld);
        }
        while *closed {
            self.opened.wait(&mut closed);
        }
        drop(closed);
        self.inner.write_at(offset, data)?;
        self.events.lock().push(NodeEvent::NodeRunDone);
        Ok(())
    }
    fn sync(&self) -> tucana::Result<()> {
        self.events.lock().push(NodeEvent::Sync);
        self.inner.sync()
    }
}

struct OpenOnDrop<'a>(&'a NodeGated);

impl Drop for OpenOnDrop<'_> {
    fn drop(&mut self) {
        self.0.set_gate(false);
    }
}

#[test]
fn a_commit_writes_its_node_runs_in_flight_and_syncs_only_after_them() {
    // A commit hands its index node runs to the members' write queues instead of writing
    // them itself: while they are held at a gate, the committer goes on and writes the
    // descriptor and bitmaps, but it must not sync (a superblock made durable before the
    // nodes it leads to would be a tree of missing nodes after a crash). Opening the gate
    // lets the commit finish; every node run is done before the first sync after it.
    let storage = NodeGated::new();
    // A budget the commit's node runs fit in: with a full budget the committer would
    // wait for the held runs in `reserve`, before it could write anything else.
    let db = options()
        .writes_in_flight_segments(64)
        .open_storage(storage.clone())
        .unwrap();
    let ks = db.keyspace("ks").unwrap();
    for i in 0..3000u32 {
        ks.put(&key(i), &value(i)).unwrap();
    }
    db.sync().unwrap();
    storage.set_gate(true);
    let mark = storage.events().len();
    std::thread::scope(|scope| {
        let commit = scope.spawn(|| db.commit());
        // Opens the gate however this closure ends, so a failed assertion does not
        // leave the scope waiting forever for the held commit.
        let _open = OpenOnDrop(&storage);
        // The sync above left the tails empty, so the committer's own writes after the
        // mark are the descriptor and the bitmap images, which come after the node runs
        // were queued; the worker may reach the gate before or after them.
        wait_until("the committer writes past its held node runs", || {
            let events = storage.events();
            events[mark..].contains(&NodeEvent::NodeRunHeld)
                && events[mark..].contains(&NodeEvent::OtherWrite { by_worker: false })
        });
        assert!(
            !storage.events()[mark..].contains(&NodeEvent::Sync),
            "synced while node runs were held"
        );
        assert!(
            !commit.is_finished(),
            "the commit finished without its nodes"
        );
        storage.set_gate(false);
        commit.join().unwrap().unwrap();
    });
    let events = storage.events();
    let after = &events[mark..];
    let first_sync = after
        .iter()
        .position(|e| *e == NodeEvent::Sync)
        .expect("the commit synced");
    let last_node = after
        .iter()
        .rposition(|e| *e == NodeEvent::NodeRunDone)
        .expect("the commit wrote node runs");
    assert!(
        last_node < first_sync,
        "a node run finished after the sync: {after:?}"
    );
    for i in (0..3000u32).step_by(7) {
        assert_eq!(ks.get(&key(i)).unwrap(), Some(value(i)), "get {i}");
    }
    db.check().unwrap();
    drop(ks);
    db.close().unwrap();
    // The committed tree reopens whole.
    let db = options().open_storage(storage).unwrap();
    let ks = db.open_keyspace("ks").unwrap();
    for i in (0..3000u32).step_by(5) {
        assert_eq!(
            ks.get(&key(i)).unwrap(),
            Some(value(i)),
            "get {i} after reopening"
        );
    }
    db.check().unwrap();
}
