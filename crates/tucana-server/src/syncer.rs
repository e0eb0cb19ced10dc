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

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};
use tokio::sync::oneshot;
use tucana::replication::LogPosition;
use tucana::Database;

use crate::replication::Replication;

/// Why a write was applied but not answered as durable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotDurable {
    /// The sync failed (the engine's error, as text: it is not `Clone`).
    Sync(String),
    /// The backups did not acknowledge it: the whole reply text (`NOREPLICAS ...`,
    /// `READONLY ...`).
    Acks(String),
}

impl NotDurable {
    /// The error reply a write answers with.
    pub fn reply_text(&self) -> String {
        match self {
            NotDurable::Sync(e) => {
                format!("ERR the write was applied but could not be made durable: {e}")
            }
            NotDurable::Acks(text) => text.clone(),
        }
    }
}

/// What a waiter learns.
pub type SyncResult = Result<(), NotDurable>;

/// A registered connection: its answer, and the keyspace position its backups must
/// acknowledge (with replication).
/// A waiter, and the keyspaces and log positions its backups must acknowledge (none: no
/// wait for backups).
type Waiter = (oneshot::Sender<SyncResult>, Vec<(String, LogPosition)>);

struct Queue {
    /// Registered since the syncer last took the queue.
    waiting: Vec<Waiter>,
    stop: bool,
}

/// A queue and the condition variable its thread sleeps on.
struct Inner {
    queue: Mutex<Queue>,
    /// Signalled when the queue gets its first waiter, or on stop.
    work: Condvar,
}

/// The syncer thread of a server running with sync durability, and, with replication,
/// its acker thread: synced writes wait there for their backups' acknowledgements while
/// the syncer goes on to the next sync.
pub struct Syncer {
    inner: Arc<Inner>,
    acks: Arc<Inner>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Syncer {
    pub fn start(db: Database, replication: Option<Arc<Replication>>) -> io::Result<Syncer> {
        let inner = Arc::new(Inner {
            queue: Mutex::new(Queue {
                waiting: Vec::new(),
                stop: false,
            }),
            work: Condvar::new(),
        });
        let acks = Arc::new(Inner {
            queue: Mutex::new(Queue {
                waiting: Vec::new(),
                stop: false,
            }),
            work: Condvar::new(),
        });
        let mut threads = Vec::new();
        let replication = replication.filter(|r| r.has_backups());
        if let Some(replication) = replication.clone() {
            let acks = acks.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("tucana-acker".into())
                    .spawn(move || run_acker(&replication, &acks))?,
            );
        }
        {
            let inner = inner.clone();
            let acks = replication.is_some().then(|| acks.clone());
            threads.push(
                std::thread::Builder::new()
                    .name("tucana-syncer".into())
                    .spawn(move || run(&db, &inner, acks.as_deref()))?,
            );
        }
        Ok(Syncer {
            inner,
            acks,
            threads: Mutex::new(threads),
        })
    }

    /// Registers now; resolves once a sync that started after this call has finished
    /// (every write applied before the call is then durable), and, for each of `acked`
    /// (a keyspace and a position in its log), once every backup acknowledged it too.
    pub fn durable(
        &self,
        acked: Vec<(String, LogPosition)>,
    ) -> impl std::future::Future<Output = SyncResult> {
        let (tx, rx) = oneshot::channel();
        {
            let mut queue = self.inner.queue.lock();
            if queue.stop {
                // Not reached while connections run: the server stops the syncer after
                // the last one ended.
                let _ = tx.send(Err(NotDurable::Sync("the server is shutting down".into())));
            } else {
                queue.waiting.push((tx, acked));
                if queue.waiting.len() == 1 {
                    self.inner.work.notify_one();
                }
            }
        }
        async move {
            rx.await
                .unwrap_or_else(|_| Err(NotDurable::Sync("the syncer thread ended".into())))
        }
    }

    /// Answers whoever is still registered, then ends the threads.
    pub fn stop(&self) {
        for inner in [&self.inner, &self.acks] {
            inner.queue.lock().stop = true;
            inner.work.notify_one();
        }
        for thread in self.threads.lock().drain(..) {
            let _ = thread.join();
        }
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Takes the waiters registered on `inner` once there are some; `None` once stopped and
/// empty.
fn take_batch(inner: &Inner, batch: &mut Vec<Waiter>) -> Option<()> {
    let mut queue = inner.queue.lock();
    while queue.waiting.is_empty() && !queue.stop {
        inner.work.wait(&mut queue);
    }
    if queue.waiting.is_empty() {
        return None; // stopped, nobody left to answer
    }
    // The vectors trade places: no allocation per sync once both have grown.
    std::mem::swap(batch, &mut queue.waiting);
    Some(())
}

fn run(db: &Database, inner: &Inner, acks: Option<&Inner>) {
    let mut batch = Vec::new();
    while take_batch(inner, &mut batch).is_some() {
        let result = db.sync().map_err(|e| NotDurable::Sync(e.to_string()));
        let mut handed = false;
        for (tx, acked) in batch.drain(..) {
            match (&result, acked, acks) {
                (Ok(()), acked, Some(acks)) if !acked.is_empty() => {
                    acks.queue.lock().waiting.push((tx, acked));
                    handed = true;
                }
                // A waiter that went away (its connection was aborted) needs no answer.
                _ => {
                    let _ = tx.send(result.clone());
                }
            }
        }
        if let (true, Some(acks)) = (handed, acks) {
            acks.work.notify_one();
        }
    }
}

/// Answers synced writes once their backups acknowledged them: one wait per keyspace for
/// the highest position of the batch covers every write in it.
fn run_acker(replication: &Replication, inner: &Inner) {
    let mut batch = Vec::new();
    while take_batch(inner, &mut batch).is_some() {
        let mut highest: HashMap<String, LogPosition> = HashMap::new();
        for (_, acked) in &batch {
            for (name, position) in acked {
                let e = highest.entry(name.clone()).or_default();
                *e = (*e).max(*position);
            }
        }
        let results: HashMap<String, SyncResult> = highest
            .into_iter()
            .map(|(name, position)| {
                let result = replication
                    .wait_acked(&name, position)
                    .map_err(NotDurable::Acks);
                (name, result)
            })
            .collect();
        for (tx, acked) in batch.drain(..) {
            let result = acked
                .iter()
                .map(|(name, _)| results[name].clone())
                .find(|r| r.is_err())
                .unwrap_or(Ok(()));
            let _ = tx.send(result);
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
        let syncer = Syncer::start(db.clone(), None).unwrap();
        let ks = db.keyspace("k").unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut waits = Vec::new();
            for i in 0..100u32 {
                ks.put(&i.to_be_bytes(), b"v").unwrap();
                waits.push(syncer.durable(Vec::new()));
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
        let late = rt.block_on(syncer.durable(Vec::new()));
        assert!(late.unwrap_err().reply_text().contains("shutting down"));
    }
}
