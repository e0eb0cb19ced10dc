//! Sync durability without a thread per waiting connection: connections apply their
//! writes on their own thread, then wait asynchronously while one syncer thread makes
//! them durable, many connections per sync.
//!
//! Why: before, a connection whose batch wrote in sync mode ran the batch on tokio's
//! blocking pool, and the engine's group commit shared each fsync among the pool threads
//! that reached it together. Every write paid two thread hand-offs (to the pool and back)
//! and a sleep in the engine's sync lock, about 45 µs of server CPU and three context
//! switches per request at `redis-benchmark -c 50 -P 1` (docs/server-bench.md).
//!
//! How: [`Syncer::durable`] is called after a batch's writes were applied (buffered, in
//! the log's tail) and registers the caller at once; the returned future resolves with
//! the result of a `Database::sync` that started after the registration, which makes
//! every write applied before it durable. The syncer thread takes everyone registered,
//! syncs once, answers them all, and takes whoever registered during that sync for the
//! next one. The more connections write, the more share each fsync; a lone writer waits
//! one fsync, as before.
//!
//! A reply is still sent only once its write is durable: the connection awaits the
//! future before it queues or writes the batch's replies. When the sync fails the writes
//! are applied but not known to be durable, and their replies say so
//! (`Written::not_durable` in `commands/batch.rs`).

use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};
use tokio::sync::oneshot;
use tucana::Database;

/// What a waiter learns: the sync's error, as text (an engine error is not `Clone`).
pub type SyncResult = Result<(), String>;

struct Queue {
    /// Registered since the syncer last took the queue.
    waiting: Vec<oneshot::Sender<SyncResult>>,
    stop: bool,
}

struct Inner {
    queue: Mutex<Queue>,
    /// Signalled when the queue gets its first waiter, or on stop.
    work: Condvar,
}

/// The syncer thread of a server running with sync durability.
pub struct Syncer {
    inner: Arc<Inner>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Syncer {
    pub fn start(db: Database) -> io::Result<Syncer> {
        let inner = Arc::new(Inner {
            queue: Mutex::new(Queue {
                waiting: Vec::new(),
                stop: false,
            }),
            work: Condvar::new(),
        });
        let thread = {
            let inner = inner.clone();
            std::thread::Builder::new()
                .name("tucana-syncer".into())
                .spawn(move || run(&db, &inner))?
        };
        Ok(Syncer {
            inner,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Registers now; resolves once a sync that started after this call has finished
    /// (every write applied before the call is then durable), with its result.
    pub fn durable(&self) -> impl std::future::Future<Output = SyncResult> {
        let (tx, rx) = oneshot::channel();
        {
            let mut queue = self.inner.queue.lock();
            if queue.stop {
                // Not reached while connections run: the server stops the syncer after
                // the last one ended.
                let _ = tx.send(Err("the server is shutting down".into()));
            } else {
                queue.waiting.push(tx);
                if queue.waiting.len() == 1 {
                    self.inner.work.notify_one();
                }
            }
        }
        async move {
            rx.await
                .unwrap_or_else(|_| Err("the syncer thread ended".into()))
        }
    }

    /// Answers whoever is still registered, then ends the thread.
    pub fn stop(&self) {
        self.inner.queue.lock().stop = true;
        self.inner.work.notify_one();
        if let Some(thread) = self.thread.lock().take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(db: &Database, inner: &Inner) {
    let mut batch = Vec::new();
    loop {
        {
            let mut queue = inner.queue.lock();
            while queue.waiting.is_empty() && !queue.stop {
                inner.work.wait(&mut queue);
            }
            if queue.waiting.is_empty() {
                return; // stopped, nobody left to answer
            }
            // The vectors trade places: no allocation per sync once both have grown.
            std::mem::swap(&mut batch, &mut queue.waiting);
        }
        let result = db.sync().map_err(|e| e.to_string());
        for waiter in batch.drain(..) {
            // A waiter that went away (its connection was aborted) needs no answer.
            let _ = waiter.send(result.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_waiter_is_answered_after_a_sync_that_covers_its_write() {
        // No background flusher: only the syncer syncs.
        let db = Database::builder()
            .flush_interval(None)
            .commit_interval(None)
            .open_in_memory()
            .unwrap();
        let syncer = Syncer::start(db.clone()).unwrap();
        let ks = db.keyspace("k").unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut waits = Vec::new();
            for i in 0..100u32 {
                ks.put(&i.to_be_bytes(), b"v").unwrap();
                waits.push(syncer.durable());
            }
            for w in waits {
                assert_eq!(w.await, Ok(()));
            }
        });
        // Every write was covered: a sync now finds nothing to do (and is not counted).
        let syncs = db.stats().syncs;
        assert!(syncs >= 1);
        db.sync().unwrap();
        assert_eq!(
            db.stats().syncs,
            syncs,
            "a write was answered before it was synced"
        );
        // (Whereas a write nobody synced is.)
        ks.put(b"late", b"v").unwrap();
        db.sync().unwrap();
        assert_eq!(db.stats().syncs, syncs + 1);

        syncer.stop();
        // After stop, a registration is answered at once with an error, never left hanging.
        let late = rt.block_on(syncer.durable());
        assert!(late.unwrap_err().contains("shutting down"));
    }
}
