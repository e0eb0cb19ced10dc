//! The group commit protocol against a model file: tickets, a flushed mark, a durable
//! mark, and `fdatasync`s that can be held at a gate or made to fail.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use super::GroupCommit;
use crate::error::{Error, Result};

/// A model of the file group commit works on. `tickets` is the newest write ticket;
/// `flushed` how far the file has the bytes; `durable` how far an `fdatasync` made them
/// durable (the `flushed` it saw when it started).
#[derive(Default)]
struct Model {
    tickets: AtomicU64,
    flushed: AtomicU64,
    durable: AtomicU64,
    flushes: AtomicUsize,
    fdatasyncs: AtomicUsize,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    /// While set, an `fdatasync` waits at the gate (and `started` says one is there).
    gate_closed: AtomicBool,
    started: AtomicBool,
    /// The next `fdatasync` fails.
    fail_next: AtomicBool,
    /// Tickets `flushed` reached while an `fdatasync` was in flight.
    flushed_during_sync: StdMutex<Vec<u64>>,
}

impl Model {
    fn write(&self) -> u64 {
        self.tickets.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn flush(&self) -> Result<u64> {
        let target = self.tickets.load(Ordering::SeqCst);
        self.flushes.fetch_add(1, Ordering::SeqCst);
        self.flushed.fetch_max(target, Ordering::SeqCst);
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            self.flushed_during_sync.lock().unwrap().push(target);
        }
        Ok(target)
    }

    fn fdatasync(&self) -> Result<()> {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let covers = self.flushed.load(Ordering::SeqCst);
        self.fdatasyncs.fetch_add(1, Ordering::SeqCst);
        self.started.store(true, Ordering::SeqCst);
        while self.gate_closed.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_micros(200));
        }
        let result = if self.fail_next.swap(false, Ordering::SeqCst) {
            Err(Error::Io(std::io::Error::other(
                "injected fdatasync failure",
            )))
        } else {
            self.durable.fetch_max(covers, Ordering::SeqCst);
            Ok(())
        };
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        result
    }
}

fn sync(group: &GroupCommit, model: &Model, ticket: u64) -> Result<()> {
    group.sync_to(ticket, || Ok(()), || model.flush(), || model.fdatasync())
}

/// Waits (up to a minute: a loaded machine) until `cond` holds; panics otherwise.
fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn writers_arriving_during_an_fdatasync_flush_then_share_the_next_one() {
    let group = Arc::new(GroupCommit::new());
    let model = Arc::new(Model::default());
    model.gate_closed.store(true, Ordering::SeqCst);
    let first = {
        let (group, model) = (group.clone(), model.clone());
        let ticket = model.write();
        std::thread::spawn(move || sync(&group, &model, ticket))
    };
    wait_until("the first fdatasync started", || {
        model.started.load(Ordering::SeqCst)
    });
    // Three writers behind it: with the old sync lock they could not even flush until
    // the first `fdatasync` returned.
    let behind: Vec<_> = (0..3)
        .map(|_| {
            let (group, model) = (group.clone(), model.clone());
            let ticket = model.write();
            std::thread::spawn(move || (ticket, sync(&group, &model, ticket)))
        })
        .collect();
    wait_until("the writers behind flushed during the fdatasync", || {
        model.flushed.load(Ordering::SeqCst) == 4
    });
    assert_eq!(model.durable.load(Ordering::SeqCst), 0);
    assert!(!model.flushed_during_sync.lock().unwrap().is_empty());
    assert_eq!(model.fdatasyncs.load(Ordering::SeqCst), 1);

    model.gate_closed.store(false, Ordering::SeqCst);
    first.join().unwrap().unwrap();
    for handle in behind {
        let (ticket, result) = handle.join().unwrap();
        result.unwrap();
        assert!(model.durable.load(Ordering::SeqCst) >= ticket);
    }
    // Everything flushed before the second `fdatasync` started: one covers all three.
    assert_eq!(model.fdatasyncs.load(Ordering::SeqCst), 2);
    assert_eq!(model.max_in_flight.load(Ordering::SeqCst), 1);
    // Nothing left to do: a repeat returns without I/O.
    sync(&group, &model, 4).unwrap();
    assert_eq!(model.fdatasyncs.load(Ordering::SeqCst), 2);
}

#[test]
fn many_writers_each_acknowledged_only_after_an_fdatasync_that_covers_it() {
    const WRITERS: usize = 16;
    const WRITES: usize = 200;
    let group = Arc::new(GroupCommit::new());
    let model = Arc::new(Model::default());
    let handles: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (group, model) = (group.clone(), model.clone());
            std::thread::spawn(move || {
                for i in 0..WRITES {
                    let ticket = model.write();
                    if (w + i) % 7 == 0 {
                        std::thread::yield_now();
                    }
                    sync(&group, &model, ticket).unwrap();
                    let durable = model.durable.load(Ordering::SeqCst);
                    assert!(
                        durable >= ticket,
                        "ticket {ticket} acknowledged at {durable}"
                    );
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
    let writes = (WRITERS * WRITES) as u64;
    assert_eq!(model.durable.load(Ordering::SeqCst), writes);
    assert_eq!(model.max_in_flight.load(Ordering::SeqCst), 1);
    let fdatasyncs = model.fdatasyncs.load(Ordering::SeqCst) as u64;
    assert!((1..=writes).contains(&fdatasyncs));
    println!(
        "{writes} writes, {fdatasyncs} fdatasyncs, {} flushes",
        model.flushes.load(Ordering::SeqCst)
    );
}

#[test]
fn a_failed_fdatasync_fails_every_waiter_and_acknowledges_nothing_after_it() {
    let group = Arc::new(GroupCommit::new());
    let model = Arc::new(Model::default());
    sync(&group, &model, model.write()).unwrap();

    model.gate_closed.store(true, Ordering::SeqCst);
    model.started.store(false, Ordering::SeqCst);
    model.fail_next.store(true, Ordering::SeqCst);
    let failing = {
        let (group, model) = (group.clone(), model.clone());
        let ticket = model.write();
        std::thread::spawn(move || sync(&group, &model, ticket))
    };
    wait_until("the failing fdatasync started", || {
        model.started.load(Ordering::SeqCst)
    });
    let behind: Vec<_> = (0..4)
        .map(|_| {
            let (group, model) = (group.clone(), model.clone());
            let ticket = model.write();
            std::thread::spawn(move || sync(&group, &model, ticket))
        })
        .collect();
    wait_until("the writers behind flushed", || {
        model.flushed.load(Ordering::SeqCst) == 6
    });
    model.gate_closed.store(false, Ordering::SeqCst);

    let err = failing.join().unwrap().unwrap_err();
    assert!(
        matches!(err, Error::Io(_)),
        "the syncer gets the I/O error: {err}"
    );
    for handle in behind {
        let err = handle.join().unwrap().unwrap_err();
        assert!(matches!(err, Error::Poisoned), "a waiter behind: {err}");
    }
    // No `fdatasync` ran after the failed one (the flushed group behind it did not get
    // one that would "succeed" over pages the kernel may have dropped)...
    assert_eq!(model.fdatasyncs.load(Ordering::SeqCst), 2);
    assert_eq!(model.durable.load(Ordering::SeqCst), 1);
    // ...and no later sync is acknowledged, even of a ticket synced before the failure.
    assert!(matches!(sync(&group, &model, 1), Err(Error::Poisoned)));
    assert!(matches!(
        sync(&group, &model, model.write()),
        Err(Error::Poisoned)
    ));
    assert_eq!(model.fdatasyncs.load(Ordering::SeqCst), 2);
}

#[test]
fn a_failed_flush_fails_the_sync_and_poisons_the_group() {
    let group = GroupCommit::new();
    let ticket = 1;
    let err = group
        .sync_to(
            ticket,
            || Ok(()),
            || Err(Error::Io(std::io::Error::other("injected flush failure"))),
            || panic!("no fdatasync after a failed flush"),
        )
        .unwrap_err();
    assert!(matches!(err, Error::Io(_)));
    let err = group
        .sync_to(ticket, || Ok(()), || Ok(ticket), || Ok(()))
        .unwrap_err();
    assert!(matches!(err, Error::Poisoned));
}

#[test]
fn an_unhealthy_store_gets_its_error_and_no_io() {
    let group = GroupCommit::new();
    let err = group
        .sync_to(
            1,
            || Err(Error::Closed),
            || panic!("no flush for a closed store"),
            || panic!("no fdatasync for a closed store"),
        )
        .unwrap_err();
    assert!(matches!(err, Error::Closed));
    // Closing is not a failure of the group: it still works for a healthy caller.
    group.sync_to(1, || Ok(()), || Ok(1), || Ok(())).unwrap();
}

/// A stage that panics (a bug) used to leave the group marked as flushing: every later
/// waiter slept for good, where the old sync lock was simply released by the unwind. The
/// panic now goes on to its caller with the group marked failed, so later callers get an
/// error instead of hanging.
#[test]
fn a_panicking_stage_fails_the_group_instead_of_hanging_later_waiters() {
    let group = Arc::new(GroupCommit::new());
    let panicked = {
        let group = Arc::clone(&group);
        std::thread::spawn(move || {
            group.sync_to(1, || Ok(()), || panic!("a bug in the flush"), || Ok(()))
        })
        .join()
    };
    assert!(panicked.is_err(), "the panic reaches its caller");
    let (done, answer) = std::sync::mpsc::channel();
    {
        let group = Arc::clone(&group);
        std::thread::spawn(move || done.send(group.sync_to(2, || Ok(()), || Ok(2), || Ok(()))));
    }
    let later = answer
        .recv_timeout(Duration::from_secs(60))
        .expect("a waiter after the panic hangs");
    assert!(matches!(later, Err(Error::Poisoned)), "{later:?}");
}
