//! Writes in flight: per volume member, a queue of writes handed over by the engine and
//! done in the background, bounded by an in-flight budget in bytes (per member and over
//! the volume). DESIGN.md, "Volumes over several devices", *Writes in flight*.
//!
//! Owns: the queues, their budget, the worker threads (up to `depth` per member, started
//! as the member's queue needs them: a member has that many writes running at once, which
//! complete in any order), the order of completion a sync waits for, and the first error
//! of a failed write (kept until someone reports it). Does not own: what a job writes or
//! what becomes of its buffer (the caller's closure: `log::in_flight` for closed log
//! segments), nor syncing (`Storage::sync`, called by the engine after `wait_queued`).
//!
//! Two ways to run: with worker threads (`threaded`), a job starts on one of its
//! member's workers as soon as the ones before it on that member have started and fewer
//! than `depth` run there (jobs start in order, finish in any order); without (`threaded == false`,
//! stores that run no background thread, such as the torture suites' deterministic runs),
//! jobs wait in the queue and the caller's thread runs them where it would otherwise wait:
//! when the budget is full, in `wait_queued` (every sync and commit), and in `drain`. The
//! second keeps every I/O in one thread and in a repeatable order while still deferring
//! writes exactly as the first does, so what readers and syncs must get right is tested
//! deterministically.
//!
//! Thread-safety: every method may be called from any thread. One mutex guards the queue
//! state (held only to push, pop and count, never during a write); a condvar wakes
//! workers, writers waiting for budget and syncs waiting for completion.

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};

/// A write handed over: runs once, on a worker or on a waiting caller's thread, and
/// returns the bytes it wrote. It must never panic.
pub type Job = Box<dyn FnOnce() -> Result<u64> + Send>;

/// The budget a reservation took, to be handed to `push` with its job.
#[must_use = "a reservation holds budget until its job is pushed"]
pub struct Reservation {
    member: usize,
    bytes: u64,
}

struct Queued {
    seq: u64,
    bytes: u64,
    job: Job,
}

#[derive(Default)]
struct MemberQueue {
    pending: VecDeque<Queued>,
    /// Sequence numbers of jobs taken out of `pending` and running now (at most the
    /// queue's depth with worker threads; they complete in any order).
    running: BTreeSet<u64>,
    /// Bytes reserved or queued or running on this member.
    in_flight_bytes: u64,
    /// Of those, bytes whose job has not started (reserved, or queued): what dispatch
    /// adds to the member's queue, since the member set sees a job's own I/O only once
    /// it runs.
    waiting_bytes: u64,
    /// Jobs done on this member (statistics).
    done_jobs: u64,
    /// Nanoseconds this member had nothing in flight while another member had something
    /// (statistics: LOCS's idle queues, which cost throughput).
    idle_while_others_busy_ns: u64,
    /// Worker threads started for this member (at most the queue's depth).
    workers_started: usize,
}

impl MemberQueue {
    /// The lowest sequence number not done yet on this member (`next` when none is).
    /// Right with jobs completing out of order: `pending` is in sequence order (pushed
    /// under the lock in the order numbers are given, taken from the front), so its front
    /// is its lowest, and every running job is in `running`, whatever finished before it.
    fn lowest_incomplete(&self, next: u64) -> u64 {
        let pending = self.pending.front().map_or(next, |q| q.seq);
        let running = self.running.first().copied().unwrap_or(next);
        pending.min(running)
    }
}

struct State {
    members: Vec<MemberQueue>,
    /// The next job's sequence number (volume-wide, increasing with `push`).
    next_seq: u64,
    in_flight_bytes: u64,
    /// The first failed job's error, until a caller reports it (`take_error`).
    error: Option<Error>,
    /// When the members' busy/idle times were last added up (`account_idle`).
    idle_accounted_at: Instant,
    shutdown: bool,
}

struct Inner {
    state: Mutex<State>,
    changed: Condvar,
    /// A job failed (stays set): what `failed` reads without the lock.
    failed: AtomicBool,
    bytes_written: AtomicU64,
    member_budget_bytes: u64,
    volume_budget_bytes: u64,
    /// Most jobs running at once per member (worker threads per member).
    depth: usize,
    threaded: bool,
}

/// The queues of one open volume.
pub struct WriteQueue {
    inner: Arc<Inner>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl WriteQueue {
    /// Queues allowing `member_budget_bytes` in flight per member and
    /// `volume_budget_bytes` over all of them (a single write larger than either still
    /// goes, alone). `threaded`: up to `depth` worker threads per member (at least one),
    /// each running one job at a time; else callers run the jobs, one at a time.
    pub fn new(
        member_budget_bytes: u64,
        volume_budget_bytes: u64,
        depth: usize,
        threaded: bool,
    ) -> WriteQueue {
        WriteQueue {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    members: Vec::new(),
                    next_seq: 1,
                    in_flight_bytes: 0,
                    error: None,
                    idle_accounted_at: Instant::now(),
                    shutdown: false,
                }),
                changed: Condvar::new(),
                failed: AtomicBool::new(false),
                bytes_written: AtomicU64::new(0),
                member_budget_bytes,
                volume_budget_bytes,
                depth: depth.max(1),
                threaded,
            }),
            workers: Mutex::new(Vec::new()),
        }
    }

    /// Makes room for members `0..count` (a member otherwise gets its queue at its first
    /// write), so that statistics cover every member from the start.
    pub fn add_members(&self, count: usize) {
        if count > 0 {
            grow(&mut self.inner.state.lock(), count - 1);
        }
    }

    /// Whether a job ever failed (the store must then acknowledge nothing more).
    #[inline]
    pub fn failed(&self) -> bool {
        self.inner.failed.load(Ordering::Acquire)
    }

    /// The first failed job's error, once (later calls: `Poisoned`); `Ok` if none failed.
    pub fn check(&self) -> Result<()> {
        if !self.failed() {
            return Ok(());
        }
        Err(self
            .inner
            .state
            .lock()
            .error
            .take()
            .unwrap_or(Error::Poisoned))
    }

    /// Bytes the jobs wrote so far.
    pub fn bytes_written(&self) -> u64 {
        self.inner.bytes_written.load(Ordering::Relaxed)
    }

    /// Bytes reserved, queued or being written now, over all members.
    pub fn in_flight_bytes(&self) -> u64 {
        self.inner.state.lock().in_flight_bytes
    }

    /// Takes `bytes` of `member`'s budget for a write, waiting while the budget is full
    /// or `ready()` is false (the caller's own limit, such as a free slot for the
    /// buffer; `ready` is asked with the queue locked and must not take this queue's
    /// locks). Without worker threads, runs queued jobs instead of waiting. Errors: a
    /// failed job's (nothing is reserved then).
    pub fn reserve(
        &self,
        member: usize,
        bytes: u64,
        ready: &dyn Fn() -> bool,
    ) -> Result<Reservation> {
        let inner = &self.inner;
        let mut st = inner.state.lock();
        loop {
            if inner.failed.load(Ordering::Acquire) {
                drop(st);
                return Err(self.check().unwrap_err());
            }
            grow(&mut st, member);
            let m = &st.members[member];
            let fits = (m.in_flight_bytes == 0
                || m.in_flight_bytes + bytes <= inner.member_budget_bytes)
                && (st.in_flight_bytes == 0
                    || st.in_flight_bytes + bytes <= inner.volume_budget_bytes);
            if fits && ready() {
                account_idle(&mut st);
                st.members[member].in_flight_bytes += bytes;
                st.members[member].waiting_bytes += bytes;
                st.in_flight_bytes += bytes;
                return Ok(Reservation { member, bytes });
            }
            if inner.threaded {
                inner.changed.wait(&mut st);
            } else if !run_one(inner, &mut st, None) {
                // Nothing queued: another caller is running the jobs that hold the
                // budget (or the caller's limit); it wakes us when one is done.
                inner.changed.wait(&mut st);
            }
        }
    }

    /// Queues `job` with the budget `r` took; it starts after every job queued before it
    /// on the same member has started (and, with a depth of 1, is done).
    pub fn push(&self, r: Reservation, job: Job) {
        let inner = &self.inner;
        let mut st = inner.state.lock();
        let seq = st.next_seq;
        st.next_seq += 1;
        let m = &mut st.members[r.member];
        m.pending.push_back(Queued {
            seq,
            bytes: r.bytes,
            job,
        });
        // One more worker when the member has more jobs than workers (each worker is
        // either running one of them or about to take one), up to the depth.
        let jobs = m.pending.len() + m.running.len();
        let start = inner.threaded && m.workers_started < inner.depth && jobs > m.workers_started;
        m.workers_started += usize::from(start);
        drop(st);
        if start {
            let inner = Arc::clone(&self.inner);
            let member = r.member;
            let handle = std::thread::Builder::new()
                .name(format!("tucana-write-{member}"))
                .spawn(move || worker(&inner, member))
                .expect("spawn a write worker thread");
            self.workers.lock().push(handle);
        }
        inner.changed.notify_all();
    }

    /// Waits until every job pushed before this call is done, on every member (without
    /// worker threads, runs them). Errors: a failed job's, reported once, then
    /// `Poisoned`.
    pub fn wait_queued(&self) -> Result<()> {
        let upto = self.inner.state.lock().next_seq;
        self.wait_below(upto)
    }

    /// The sequence number the next job pushed will get: jobs pushed so far are below it.
    #[cfg(test)]
    fn next_seq(&self) -> u64 {
        self.inner.state.lock().next_seq
    }

    /// Waits until every job numbered below `upto` is done, on every member (jobs pushed
    /// since may still run); `wait_queued` with its snapshot taken earlier.
    fn wait_below(&self, upto: u64) -> Result<()> {
        let inner = &self.inner;
        let mut st = inner.state.lock();
        loop {
            let next = st.next_seq;
            if st.members.iter().all(|m| m.lowest_incomplete(next) >= upto) {
                break;
            }
            if inner.threaded {
                inner.changed.wait(&mut st);
            } else if !run_one(inner, &mut st, Some(upto)) {
                // Others run the rest: wait for them.
                inner.changed.wait(&mut st);
            }
        }
        drop(st);
        self.check()
    }

    /// Every job pushed so far done, errors ignored (they stay for `check`): for closing
    /// and dropping.
    pub fn drain(&self) {
        let _ = self.wait_queued();
    }

    /// Per member (index = member), bytes reserved or queued whose job has not started:
    /// the writes least-weighted-queue dispatch counts on top of what the member set
    /// sees in flight (DESIGN.md, *Dispatch*).
    pub fn waiting_bytes(&self) -> Vec<u64> {
        let st = self.inner.state.lock();
        st.members.iter().map(|m| m.waiting_bytes).collect()
    }

    /// Per member (index = member; members never written have no entry), its queue now
    /// and since the queue was made.
    pub fn member_figures(&self) -> Vec<QueueFigures> {
        let mut st = self.inner.state.lock();
        account_idle(&mut st);
        st.members
            .iter()
            .map(|m| QueueFigures {
                in_flight_bytes: m.in_flight_bytes,
                jobs: (m.pending.len() + m.running.len()) as u64,
                running_jobs: m.running.len() as u64,
                done_jobs: m.done_jobs,
                idle_while_others_busy_ns: m.idle_while_others_busy_ns,
            })
            .collect()
    }
}

impl Drop for WriteQueue {
    /// Runs every queued job, then stops the workers.
    fn drop(&mut self) {
        self.drain();
        self.inner.state.lock().shutdown = true;
        self.inner.changed.notify_all();
        for h in std::mem::take(&mut *self.workers.lock()) {
            let _ = h.join();
        }
    }
}

/// One member's write queue, for statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueFigures {
    /// Bytes reserved, queued or being written.
    pub in_flight_bytes: u64,
    /// Jobs queued or running.
    pub jobs: u64,
    /// Of those, jobs running now (at most the queue's depth).
    pub running_jobs: u64,
    /// Jobs done.
    pub done_jobs: u64,
    /// Nanoseconds with nothing in flight on this member while another member had
    /// something in flight.
    pub idle_while_others_busy_ns: u64,
}

/// Adds the time since the last call to the idle time of every member that had nothing
/// in flight while another had something. Called (lock held) before any member's
/// in-flight bytes change, and when figures are read: O(members), one clock read.
fn account_idle(st: &mut State) {
    let now = Instant::now();
    let elapsed_ns =
        u64::try_from(now.duration_since(st.idle_accounted_at).as_nanos()).unwrap_or(u64::MAX);
    st.idle_accounted_at = now;
    let busy = st.members.iter().filter(|m| m.in_flight_bytes > 0).count();
    if busy == 0 {
        return;
    }
    for m in st.members.iter_mut().filter(|m| m.in_flight_bytes == 0) {
        m.idle_while_others_busy_ns = m.idle_while_others_busy_ns.saturating_add(elapsed_ns);
    }
}

fn grow(st: &mut State, member: usize) {
    if st.members.len() <= member {
        st.members.resize_with(member + 1, MemberQueue::default);
    }
}

/// Takes the oldest queued job (of any member, with a sequence number below `below` when
/// given) and runs it with the lock released. False when there was none.
fn run_one(inner: &Inner, st: &mut parking_lot::MutexGuard<'_, State>, below: Option<u64>) -> bool {
    let Some(member) = (0..st.members.len())
        .filter(|&i| {
            st.members[i]
                .pending
                .front()
                .is_some_and(|q| below.is_none_or(|b| q.seq < b))
        })
        .min_by_key(|&i| st.members[i].pending.front().map(|q| q.seq))
    else {
        return false;
    };
    run_front(inner, st, member);
    true
}

/// Runs `member`'s oldest queued job with the lock released, then counts it done.
fn run_front(inner: &Inner, st: &mut parking_lot::MutexGuard<'_, State>, member: usize) {
    let q = st.members[member]
        .pending
        .pop_front()
        .expect("a queued job");
    st.members[member].running.insert(q.seq);
    st.members[member].waiting_bytes -= q.bytes;
    let result = parking_lot::MutexGuard::unlocked(st, q.job);
    account_idle(st);
    let m = &mut st.members[member];
    m.running.remove(&q.seq);
    m.in_flight_bytes -= q.bytes;
    m.done_jobs += 1;
    st.in_flight_bytes -= q.bytes;
    match result {
        Ok(written) => {
            inner.bytes_written.fetch_add(written, Ordering::Relaxed);
        }
        Err(e) => {
            if !inner.failed.swap(true, Ordering::AcqRel) {
                st.error = Some(e);
            }
        }
    }
    inner.changed.notify_all();
}

/// One of a member's workers: takes the member's oldest queued job, runs it, and again,
/// until the queue shuts down and is empty. With several workers per member, jobs start
/// in order and complete in any order.
fn worker(inner: &Inner, member: usize) {
    let mut st = inner.state.lock();
    loop {
        if !st.members[member].pending.is_empty() {
            run_front(inner, &mut st, member);
        } else if st.shutdown {
            return;
        } else {
            inner.changed.wait(&mut st);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn counting_job(log: &Arc<Mutex<Vec<u32>>>, id: u32, bytes: u64) -> Job {
        let log = Arc::clone(log);
        Box::new(move || {
            log.lock().push(id);
            Ok(bytes)
        })
    }

    #[test]
    fn without_threads_jobs_wait_until_a_sync_or_a_full_budget_runs_them() {
        let q = WriteQueue::new(2 * 100, 1000, 4, false);
        let log = Arc::new(Mutex::new(Vec::new()));
        for id in 0..2 {
            let r = q.reserve(0, 100, &|| true).unwrap();
            q.push(r, counting_job(&log, id, 100));
        }
        assert!(log.lock().is_empty(), "deferred until someone must wait");
        // The third write does not fit in member 0's budget: the oldest runs first.
        let r = q.reserve(0, 100, &|| true).unwrap();
        assert_eq!(*log.lock(), vec![0]);
        q.push(r, counting_job(&log, 2, 100));
        q.wait_queued().unwrap();
        assert_eq!(*log.lock(), vec![0, 1, 2]);
        assert_eq!(q.bytes_written(), 300);
        assert_eq!(q.in_flight_bytes(), 0);
    }

    #[test]
    fn a_failed_job_is_reported_once_then_the_queue_says_poisoned() {
        let q = WriteQueue::new(1 << 20, 1 << 20, 1, true);
        let r = q.reserve(0, 10, &|| true).unwrap();
        q.push(
            r,
            Box::new(|| Err(Error::Io(std::io::Error::other("device gone")))),
        );
        let first = q.wait_queued().unwrap_err();
        assert!(matches!(first, Error::Io(_)), "{first}");
        assert!(q.failed());
        assert!(matches!(q.wait_queued(), Err(Error::Poisoned)));
        assert!(matches!(q.reserve(0, 10, &|| true), Err(Error::Poisoned)));
    }

    #[test]
    fn wait_queued_waits_for_earlier_jobs_on_every_member() {
        let q = WriteQueue::new(1 << 20, 1 << 20, 1, true);
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let done = Arc::new(AtomicUsize::new(0));
        for member in 0..3 {
            let r = q.reserve(member, 10, &|| true).unwrap();
            let (gate, done) = (Arc::clone(&gate), Arc::clone(&done));
            q.push(
                r,
                Box::new(move || {
                    let (open, cv) = &*gate;
                    let mut open = open.lock();
                    while !*open {
                        cv.wait(&mut open);
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                    Ok(10)
                }),
            );
        }
        let opener = {
            let gate = Arc::clone(&gate);
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(20));
                *gate.0.lock() = true;
                gate.1.notify_all();
            })
        };
        q.wait_queued().unwrap();
        assert_eq!(
            done.load(Ordering::SeqCst),
            3,
            "returned before every member's job"
        );
        opener.join().unwrap();
    }

    #[test]
    fn reserve_waits_for_the_budget_and_the_callers_own_limit() {
        let q = WriteQueue::new(100, 150, 4, false);
        let log = Arc::new(Mutex::new(Vec::new()));
        let r = q.reserve(0, 100, &|| true).unwrap();
        q.push(r, counting_job(&log, 0, 100));
        // Member 1 has room, the volume does not (100 + 100 > 150): job 0 runs first.
        let r = q.reserve(1, 100, &|| true).unwrap();
        assert_eq!(*log.lock(), vec![0]);
        q.push(r, counting_job(&log, 1, 100));
        // The caller's limit holds it until job 1 ran.
        let log2 = Arc::clone(&log);
        let r = q.reserve(1, 10, &move || log2.lock().len() == 2).unwrap();
        assert_eq!(*log.lock(), vec![0, 1]);
        q.push(r, counting_job(&log, 2, 10));
        drop(q);
        assert_eq!(
            *log.lock(),
            vec![0, 1, 2],
            "dropping the queue runs what is left"
        );
    }

    #[test]
    fn waiting_bytes_count_reserved_and_queued_jobs_not_running_ones() {
        // What least-weighted dispatch adds to a member's queue: a segment counts from
        // its reservation until its job starts (from then the member set sees its I/O).
        let q = WriteQueue::new(1 << 20, 1 << 20, 1, true);
        assert!(q.waiting_bytes().is_empty());
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let started = Arc::new(AtomicUsize::new(0));
        let gated = |gate: &Arc<(Mutex<bool>, Condvar)>, started: &Arc<AtomicUsize>| -> Job {
            let (gate, started) = (Arc::clone(gate), Arc::clone(started));
            Box::new(move || {
                started.fetch_add(1, Ordering::SeqCst);
                let (open, cv) = &*gate;
                let mut open = open.lock();
                while !*open {
                    cv.wait(&mut open);
                }
                Ok(100)
            })
        };
        let r = q.reserve(1, 100, &|| true).unwrap();
        assert_eq!(q.waiting_bytes(), vec![0, 100]);
        q.push(r, gated(&gate, &started));
        // The worker takes the job: it runs (held at the gate) and waits no more.
        while started.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        assert_eq!(q.waiting_bytes(), vec![0, 0]);
        let r = q.reserve(1, 300, &|| true).unwrap();
        q.push(r, gated(&gate, &started));
        let r = q.reserve(0, 50, &|| true).unwrap();
        assert_eq!(q.waiting_bytes()[1], 300, "queued behind the running job");
        assert_eq!(q.waiting_bytes()[0], 50, "reserved, not pushed yet");
        q.push(r, gated(&gate, &started));
        *gate.0.lock() = true;
        gate.1.notify_all();
        q.wait_queued().unwrap();
        assert_eq!(q.waiting_bytes(), vec![0, 0]);
        assert_eq!(q.in_flight_bytes(), 0);
    }

    /// A gate jobs wait at until it is opened; counts the jobs that reached it.
    struct Gate {
        open: Mutex<bool>,
        cv: Condvar,
    }

    impl Gate {
        fn new() -> Arc<Gate> {
            Arc::new(Gate {
                open: Mutex::new(false),
                cv: Condvar::new(),
            })
        }

        fn wait(&self) {
            let mut open = self.open.lock();
            while !*open {
                self.cv.wait(&mut open);
            }
        }

        fn open(&self) {
            *self.open.lock() = true;
            self.cv.notify_all();
        }
    }

    /// Spins until `done()` (another thread's progress), failing after 30 s: a liveness
    /// bound for a hang, not a timing assertion.
    fn await_true(what: &str, done: impl Fn() -> bool) {
        let deadline = Instant::now() + std::time::Duration::from_secs(30);
        while !done() {
            assert!(Instant::now() < deadline, "never happened: {what}");
            std::thread::yield_now();
        }
    }

    #[test]
    fn several_jobs_run_at_once_on_a_member_and_a_sync_waits_for_exactly_those_before_it() {
        // Depth 3 on one member: job a is held at its gate while job b, queued after it,
        // runs and finishes (out of order). A sync taken then must still wait for a (the
        // member's lowest unfinished job), and must not wait for c, queued after it.
        let q = Arc::new(WriteQueue::new(1 << 20, 1 << 20, 3, true));
        let (gate_a, gate_c) = (Gate::new(), Gate::new());
        let (a_done, b_done, c_done) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let held = |gate: &Arc<Gate>, done: &Arc<AtomicBool>| -> Job {
            let (gate, done) = (Arc::clone(gate), Arc::clone(done));
            Box::new(move || {
                gate.wait();
                done.store(true, Ordering::SeqCst);
                Ok(10)
            })
        };
        let r = q.reserve(0, 10, &|| true).unwrap();
        q.push(r, held(&gate_a, &a_done));
        let r = q.reserve(0, 10, &|| true).unwrap();
        let b = Arc::clone(&b_done);
        q.push(
            r,
            Box::new(move || {
                b.store(true, Ordering::SeqCst);
                Ok(10)
            }),
        );
        await_true("b finishing while a runs", || b_done.load(Ordering::SeqCst));
        assert!(!a_done.load(Ordering::SeqCst), "a is still held");
        // The sync's snapshot (what `wait_queued` takes first) covers a and b; c is
        // pushed after it.
        let upto = q.next_seq();
        let returned = Arc::new(AtomicBool::new(false));
        let waiter = {
            let (q, a_done, returned) =
                (Arc::clone(&q), Arc::clone(&a_done), Arc::clone(&returned));
            std::thread::spawn(move || {
                q.wait_below(upto).unwrap();
                assert!(a_done.load(Ordering::SeqCst), "returned before a was done");
                returned.store(true, Ordering::SeqCst);
            })
        };
        let r = q.reserve(0, 10, &|| true).unwrap();
        q.push(r, held(&gate_c, &c_done));
        await_true("a and c both running", || {
            q.member_figures()[0].running_jobs == 2
        });
        assert_eq!(q.member_figures()[0].jobs, 2);
        assert!(!returned.load(Ordering::SeqCst), "a is not done");
        gate_a.open();
        waiter.join().unwrap();
        assert!(returned.load(Ordering::SeqCst));
        assert!(!c_done.load(Ordering::SeqCst), "the sync did not need c");
        gate_c.open();
        q.wait_queued().unwrap();
        assert_eq!(q.bytes_written(), 30);
        assert_eq!(q.member_figures()[0].done_jobs, 3);
    }

    #[test]
    fn a_member_runs_at_most_its_depth_of_jobs_at_once() {
        let q = WriteQueue::new(1 << 20, 1 << 20, 2, true);
        let gate = Gate::new();
        let running_now = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        for _ in 0..5 {
            let r = q.reserve(0, 10, &|| true).unwrap();
            let (gate, running_now, most) = (
                Arc::clone(&gate),
                Arc::clone(&running_now),
                Arc::clone(&most),
            );
            q.push(
                r,
                Box::new(move || {
                    let now = running_now.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    gate.wait();
                    running_now.fetch_sub(1, Ordering::SeqCst);
                    Ok(10)
                }),
            );
        }
        await_true("two jobs running", || {
            running_now.load(Ordering::SeqCst) == 2
        });
        let f = q.member_figures()[0];
        assert_eq!((f.jobs, f.running_jobs), (5, 2));
        gate.open();
        q.wait_queued().unwrap();
        assert_eq!(most.load(Ordering::SeqCst), 2, "never more than the depth");
        assert_eq!(q.member_figures()[0].running_jobs, 0);
    }

    #[test]
    fn an_error_in_one_of_several_concurrent_jobs_is_reported_once_and_the_others_finish() {
        // Three jobs run at once on one member; the middle one fails while the others are
        // still running. Its error is reported once (the others' success does not hide
        // it, nor do they report twice), the bytes of the others are counted, and the
        // budget is given back by all three.
        let q = WriteQueue::new(1 << 20, 1 << 20, 3, true);
        let gate = Gate::new();
        let started = Arc::new(AtomicUsize::new(0));
        for id in 0..3u64 {
            let r = q.reserve(0, 100, &|| true).unwrap();
            let (gate, started) = (Arc::clone(&gate), Arc::clone(&started));
            q.push(
                r,
                Box::new(move || {
                    started.fetch_add(1, Ordering::SeqCst);
                    gate.wait();
                    if id == 1 {
                        return Err(Error::Io(std::io::Error::other("member 0 write failed")));
                    }
                    Ok(100)
                }),
            );
        }
        await_true("three jobs running", || started.load(Ordering::SeqCst) == 3);
        gate.open();
        let first = q.wait_queued().unwrap_err();
        assert!(
            first.to_string().contains("member 0 write failed"),
            "{first}"
        );
        assert!(matches!(q.wait_queued(), Err(Error::Poisoned)));
        assert!(matches!(q.check(), Err(Error::Poisoned)));
        assert_eq!(q.bytes_written(), 200, "the two that succeeded");
        assert_eq!(q.in_flight_bytes(), 0);
        assert_eq!(q.member_figures()[0].done_jobs, 3);
    }

    #[test]
    fn without_threads_a_deep_queue_still_runs_jobs_in_order_in_the_callers_thread() {
        let q = WriteQueue::new(1 << 20, 1 << 20, 8, false);
        let log = Arc::new(Mutex::new(Vec::new()));
        let me = std::thread::current().id();
        for id in 0..6 {
            let r = q.reserve(id as usize % 2, 10, &|| true).unwrap();
            let log = Arc::clone(&log);
            q.push(
                r,
                Box::new(move || {
                    assert_eq!(std::thread::current().id(), me, "a worker thread ran it");
                    log.lock().push(id);
                    Ok(10)
                }),
            );
        }
        assert!(log.lock().is_empty());
        q.wait_queued().unwrap();
        assert_eq!(*log.lock(), vec![0, 1, 2, 3, 4, 5]);
    }

    proptest::proptest! {
        /// `lowest_incomplete` against the minimum of the unfinished jobs, over random
        /// pushes, starts (from the front, as workers take them) and completions in any
        /// order (as several workers finish them).
        #[test]
        fn lowest_incomplete_is_the_least_unfinished_job_whatever_finishes_first(
            steps in proptest::collection::vec((0u8..3, 0usize..8), 1..200)
        ) {
            let mut m = MemberQueue::default();
            let mut next = 1u64;
            let mut unfinished = BTreeSet::new();
            for (op, pick) in steps {
                match op {
                    0 => {
                        m.pending.push_back(Queued { seq: next, bytes: 1, job: Box::new(|| Ok(1)) });
                        unfinished.insert(next);
                        next += 1;
                    }
                    1 => {
                        if let Some(q) = m.pending.pop_front() {
                            m.running.insert(q.seq);
                        }
                    }
                    _ => {
                        if let Some(&seq) = m.running.iter().nth(pick % m.running.len().max(1)) {
                            m.running.remove(&seq);
                            unfinished.remove(&seq);
                        }
                    }
                }
                let expected = unfinished.first().copied().unwrap_or(next);
                proptest::prop_assert_eq!(m.lowest_incomplete(next), expected);
            }
        }
    }
}
