//! Pipelined group commit: the protocol by which writers waiting for their writes to be
//! durable share flushes and `fdatasync`s (DESIGN.md, "Group commit, pipelined").
//!
//! Owns: the state of group sync (how far the file has the written bytes, the ticket the
//! `fdatasync` in flight covers, how far writes are durable, whether a stage failed) and
//! the loop a waiting writer runs: flush for the group, start the next `fdatasync`, or
//! wait. Does not own: what a flush or an `fdatasync` is (the caller passes them in:
//! `Shared::sync_to` flushes every region's tail and waits for the segments in flight),
//! write tickets (handed out by `Region::write`), nor the store's poisoned flag (the caller
//! poisons on the error this returns, and passes a check of it in).
//!
//! Thread-safety: `Sync`. The state sits under one mutex that is never held during I/O:
//! at most one thread flushes and at most one runs an `fdatasync` at a time, and the two
//! overlap (the next group flushes while the current one syncs). Waiters sleep on two
//! condition variables: `leader`, for the one waiter of the next group designated to start
//! its `fdatasync`, and `waiters`, for everybody else. Every state change notifies both,
//! `leader` first, under the mutex (no lost wake-ups).

use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::error::{Error, Result};

/// Group sync's shared state and its waiters. See the module doc.
pub(crate) struct GroupCommit {
    state: Mutex<State>,
    /// The designated starter of the next `fdatasync` waits here (at most one thread).
    leader: Condvar,
    /// Every other waiter.
    waiters: Condvar,
}

#[derive(Default)]
struct State {
    /// Every write with a ticket at or below this has its bytes in the file (written,
    /// perhaps not durable).
    flushed_ticket: u64,
    /// A thread is running the flush stage.
    flushing: bool,
    /// The ticket the `fdatasync` in flight covers (`flushed_ticket` when it started).
    syncing: Option<u64>,
    /// Every write with a ticket at or below this is durable.
    synced_ticket: u64,
    /// A waiter is parked on `leader` to start the next `fdatasync`.
    leader_waiting: bool,
    /// A flush or `fdatasync` failed: nothing is acknowledged any more.
    failed: bool,
}

/// What the waiters' loop does next, decided under the mutex.
enum Step {
    Done,
    Flush,
    Sync(u64),
    WaitAsLeader,
    Wait,
}

impl State {
    fn next_step(&self, ticket: u64) -> Step {
        if self.synced_ticket >= ticket {
            return Step::Done;
        }
        if self.flushed_ticket < ticket {
            // Its bytes may not be in the file yet: flush, or wait for the flusher
            // (whose flush may or may not have read this ticket: check again after).
            return if self.flushing {
                Step::Wait
            } else {
                Step::Flush
            };
        }
        match self.syncing {
            None => Step::Sync(self.flushed_ticket),
            // The `fdatasync` in flight covers it: wait for it.
            Some(covered) if covered >= ticket => Step::Wait,
            // Flushed after the one in flight started: the next one covers it.
            Some(_) if !self.leader_waiting => Step::WaitAsLeader,
            Some(_) => Step::Wait,
        }
    }
}

impl Default for GroupCommit {
    fn default() -> GroupCommit {
        GroupCommit::new()
    }
}

impl GroupCommit {
    pub fn new() -> GroupCommit {
        GroupCommit {
            state: Mutex::new(State::default()),
            leader: Condvar::new(),
            waiters: Condvar::new(),
        }
    }

    /// Returns once every write with a ticket up to `ticket` is durable: covered by an
    /// `fdatasync` that started after a flush that ran after the write took its ticket.
    ///
    /// `healthy` is checked before this thread starts a stage and at every wake-up (the
    /// store poisoned by a failed commit or background write, or closed: its error is
    /// returned). `flush` is the flush stage: it reads the newest ticket *before* writing
    /// anything, makes the bytes of every write up to it reach the file, and returns that
    /// ticket. `fdatasync` makes every completed write durable. A failed stage fails this
    /// call with its error, every other waiter's and every later one's with `Poisoned`
    /// (the caller poisons the store).
    pub fn sync_to(
        &self,
        ticket: u64,
        healthy: impl Fn() -> Result<()>,
        mut flush: impl FnMut() -> Result<u64>,
        mut fdatasync: impl FnMut() -> Result<()>,
    ) -> Result<()> {
        let mut st = self.state.lock();
        loop {
            if st.failed {
                return Err(Error::Poisoned);
            }
            healthy()?;
            match st.next_step(ticket) {
                Step::Done => return Ok(()),
                Step::Flush => {
                    st.flushing = true;
                    let flushed = MutexGuard::unlocked(&mut st, || unwinding(&mut flush));
                    st.flushing = false;
                    let flushed = self.unless_panicked(&mut st, flushed);
                    if let Ok(to) = flushed {
                        st.flushed_ticket = st.flushed_ticket.max(to);
                    }
                    self.stage_done(&mut st, flushed)?;
                }
                Step::Sync(covers) => {
                    st.syncing = Some(covers);
                    let synced = MutexGuard::unlocked(&mut st, || unwinding(&mut fdatasync));
                    st.syncing = None;
                    let synced = self.unless_panicked(&mut st, synced);
                    if synced.is_ok() {
                        st.synced_ticket = st.synced_ticket.max(covers);
                    }
                    self.stage_done(&mut st, synced)?;
                }
                Step::WaitAsLeader => {
                    st.leader_waiting = true;
                    self.leader.wait(&mut st);
                    st.leader_waiting = false;
                }
                Step::Wait => self.waiters.wait(&mut st),
            }
        }
    }

    /// A stage's result, or, if the stage panicked, the group marked failed and every
    /// waiter woken before the panic goes on: left marked as flushing or syncing, the
    /// group would keep every later waiter asleep for good.
    fn unless_panicked<T>(
        &self,
        st: &mut MutexGuard<'_, State>,
        outcome: std::thread::Result<Result<T>>,
    ) -> Result<T> {
        match outcome {
            Ok(result) => result,
            Err(panic) => {
                st.failed = true;
                self.leader.notify_all();
                self.waiters.notify_all();
                std::panic::resume_unwind(panic)
            }
        }
    }

    /// After a stage whose success is already in the state: wakes every waiter (the
    /// state changed either way) and, on failure, marks the group commit failed and
    /// returns the stage's error.
    fn stage_done<T>(&self, st: &mut State, result: Result<T>) -> Result<T> {
        if result.is_err() {
            st.failed = true;
        }
        // The leader first: parking_lot requeues the notified threads onto the mutex in
        // this order, so the next `fdatasync` usually starts before the chain of wake-ups
        // of the acknowledged writers (a running thread may still take the mutex first).
        self.leader.notify_all();
        self.waiters.notify_all();
        result
    }
}

/// Runs a stage, catching a panic so that the group can be marked failed first.
fn unwinding<T>(stage: &mut impl FnMut() -> Result<T>) -> std::thread::Result<Result<T>> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(stage))
}

#[cfg(test)]
mod tests;
