//! Busy polling: a connection thread that has just served several connections keeps
//! polling its sockets for a short while (the budget, `ServerConfig::busy_poll`) before it
//! sleeps in `epoll_wait`.
//!
//! Why: on a thread that sleeps, the next request's `send` has to wake it. On loopback
//! the client's `send` runs the server side's TCP receive in the client's own context,
//! so the wake-up (a cross-core interrupt; on a virtual machine, an exit to the
//! hypervisor) is paid by the client, and the woken thread pays for the context switch.
//! A thread that is awake only has the socket marked ready. With `redis-benchmark -c 50
//! -P 1` on two cores, one connection thread served each batch faster than the client
//! sent the next ones, slept about once per 8 requests (redis-server: once per 10 to
//! 100), and the client spent about 1 µs more CPU per request
//! against it than against redis-server: the client set the pace
//! (docs/server-bench.md, "Busy polling").
//!
//! How: each thread counts the batches it runs. Its park hook ([`before_park`], after the
//! outboxes are flushed) compares the count with the one at the previous park. Two or
//! more batches since then mean several connections are active; the hook then wakes this
//! thread's poller task instead of letting the thread sleep. The poller ([`run`]) yields
//! again and again: each yield makes the runtime poll its driver without waiting
//! (`epoll_wait` with timeout 0) and run whatever became ready. It flushes the outboxes
//! before each yield, as the park hook would. Once no batch has run for the budget, the
//! poller stops and the thread sleeps at its next park. A client that waits on each reply
//! alone (one batch per wake-up) never starts a spin, and an idle server spins at most
//! one budget after its last request.
//!
//! Cost: while it spins, the thread uses a core it would otherwise leave idle, so the
//! server's CPU time per request rises when it is not busy enough to keep a core. At a
//! load that keeps several connections active but leaves gaps shorter than the budget,
//! the thread never sleeps. `--busy-poll-us 0` turns the spin off.

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

/// A park after this many batches since the previous park starts a spin.
const SPIN_AFTER_BATCHES: u64 = 2;

thread_local! {
    /// Batches run by the connections of this thread.
    static BATCHES: Cell<u64> = const { Cell::new(0) };
    /// `BATCHES` when the park hook last looked (or a spin ended).
    static BATCHES_SEEN: Cell<u64> = const { Cell::new(0) };
    /// The hook asked the poller to spin.
    static SPIN_ASKED: Cell<bool> = const { Cell::new(false) };
    /// The poller task, while it waits to be asked.
    static POLLER: RefCell<Option<Waker>> = const { RefCell::new(None) };
    /// Spins started on this thread.
    static SPINS: Cell<u64> = const { Cell::new(0) };
}

/// A connection ran a batch of requests on this thread.
pub fn batch_ran() {
    BATCHES.with(|b| b.set(b.get().wrapping_add(1)));
}

/// The park hook's part: starts a spin when this thread ran several batches since its
/// previous park, by waking the poller (the runtime then has a task to run and does not
/// sleep).
pub fn before_park() {
    let batches = BATCHES.with(Cell::get);
    let seen = BATCHES_SEEN.with(|s| s.replace(batches));
    if batches.wrapping_sub(seen) < SPIN_AFTER_BATCHES {
        return;
    }
    if let Some(poller) = POLLER.with(|p| p.borrow_mut().take()) {
        SPIN_ASKED.with(|a| a.set(true));
        poller.wake();
    }
}

/// The poller of one connection thread; spawned on its runtime when busy polling is on.
/// Never returns (it ends with the runtime).
pub async fn run(budget: Duration) {
    assert!(
        !budget.is_zero(),
        "a poller without a budget would never spin"
    );
    loop {
        // Wait until the park hook asks for a spin.
        poll_fn(|cx| {
            if SPIN_ASKED.with(|a| a.replace(false)) {
                return Poll::Ready(());
            }
            POLLER.with(|p| *p.borrow_mut() = Some(cx.waker().clone()));
            Poll::Pending
        })
        .await;
        SPINS.with(|s| s.set(s.get() + 1));
        let mut seen = BATCHES.with(Cell::get);
        let mut last_work = Instant::now();
        loop {
            // What the park hook does before the thread would sleep.
            crate::outbox::flush_queued();
            // Back after the runtime polled its driver (without waiting) and ran the
            // connections that became ready.
            tokio::task::yield_now().await;
            let batches = BATCHES.with(Cell::get);
            let now = Instant::now();
            if batches != seen {
                seen = batches;
                last_work = now;
            } else if now.duration_since(last_work) >= budget {
                break;
            }
        }
        // The batches of this spin do not start another one.
        BATCHES_SEEN.with(|s| s.set(BATCHES.with(Cell::get)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    struct CountingWaker(AtomicUsize);

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Registers a stand-in poller; returns its wake count.
    fn fake_poller() -> Arc<CountingWaker> {
        let counter = Arc::new(CountingWaker(AtomicUsize::new(0)));
        POLLER.with(|p| *p.borrow_mut() = Some(Waker::from(counter.clone())));
        counter
    }

    fn poller_waiting() -> bool {
        POLLER.with(|p| p.borrow().is_some())
    }

    // Each test runs on a thread of its own, so the thread-locals start fresh.

    #[test]
    fn a_park_after_one_batch_sleeps_and_after_two_spins() {
        let poller = fake_poller();
        before_park();
        assert_eq!(poller.0.load(Ordering::SeqCst), 0, "nothing ran: sleep");
        batch_ran();
        before_park();
        assert_eq!(poller.0.load(Ordering::SeqCst), 0, "a lone client: sleep");
        assert!(poller_waiting());
        batch_ran();
        batch_ran();
        before_park();
        assert_eq!(poller.0.load(Ordering::SeqCst), 1, "two connections: spin");
        assert!(SPIN_ASKED.with(Cell::get));
        assert!(!poller_waiting(), "the hook handed its waker over");
        // The batches were counted: the next park sleeps unless more ran.
        SPIN_ASKED.with(|a| a.set(false));
        let poller = fake_poller();
        before_park();
        assert_eq!(poller.0.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_park_without_a_waiting_poller_sleeps() {
        // Busy polling off (no poller), or the poller is spinning already.
        batch_ran();
        batch_ran();
        before_park();
        assert!(!SPIN_ASKED.with(Cell::get));
    }

    #[test]
    fn a_spin_lets_other_tasks_run_and_ends_after_its_budget() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .on_thread_park(before_park)
            .build()
            .unwrap();
        rt.block_on(async {
            tokio::spawn(run(Duration::from_millis(2)));
            while !poller_waiting() {
                tokio::task::yield_now().await;
            }
            batch_ran();
            batch_ran();
            // The runtime's park after this sleep starts a spin (the hook sees two batches);
            // the sleep still ends (the spin polls the driver, timers included), and so
            // does the spin, after 2 ms without a batch.
            let ticks = Arc::new(AtomicUsize::new(0));
            let ticker = {
                let ticks = ticks.clone();
                tokio::spawn(async move {
                    for _ in 0..5 {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        ticks.fetch_add(1, Ordering::SeqCst);
                    }
                })
            };
            ticker.await.unwrap();
            assert_eq!(ticks.load(Ordering::SeqCst), 5);
            while !poller_waiting() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            assert_eq!(SPINS.with(Cell::get), 1, "the two batches started one spin");
            // Back to waiting: the batches of the spin do not start another.
            assert_eq!(BATCHES_SEEN.with(Cell::get), BATCHES.with(Cell::get));
            tokio::time::sleep(Duration::from_millis(5)).await;
            assert_eq!(SPINS.with(Cell::get), 1, "no batch, no spin");
        });
    }
}
