//! The clients blocked on keys of one database (BLPOP and the other blocking pops):
//! per key, a first-come-first-served queue of waiters, signalled after a write of the
//! key is applied (DESIGN.md, "Blocking pops").
//!
//! Owns the queues and the wake-up rule: a write of a key wakes the first waiter of its
//! queue only; a waiter that leaves (served, timed out, disconnected: [`Wait`]'s drop)
//! wakes the next waiter of each of its keys, so several elements pushed at once serve
//! several waiters in order, and a waiter woken for nothing keeps its place. It does not
//! own what a waiter does when woken (the connection retries its command) nor the
//! commands (`commands::blocking`). Also the table of blocked clients by client id
//! ([`UnblockTable`]), through which `CLIENT UNBLOCK` ends a client's wait.
//!
//! Thread-safety: `Send + Sync`; a mutex guards the queues; writers pay one atomic load
//! when nobody waits. Notifications are `tokio::sync::Notify` permits: one sent before
//! its waiter awaits is kept, so none is lost.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

/// The waiters of one database, by key (stored keys).
#[derive(Default)]
pub struct WaitTable {
    queues: Mutex<HashMap<Vec<u8>, VecDeque<Arc<Waiter>>>>,
    /// Keys in `queues`: zero lets writers skip the lock.
    keys: AtomicUsize,
    next_id: AtomicU64,
}

/// One blocked client.
pub struct Waiter {
    id: u64,
    notify: Notify,
}

/// A client's place in the queues of its keys; leaves them when dropped.
pub struct Wait {
    table: Arc<WaitTable>,
    keys: Vec<Vec<u8>>,
    waiter: Arc<Waiter>,
}

impl WaitTable {
    /// Queues a waiter at the back of each of `keys`' queues.
    pub fn wait(table: &Arc<WaitTable>, keys: &[Vec<u8>]) -> Wait {
        let waiter = Arc::new(Waiter {
            id: table.next_id.fetch_add(1, Ordering::Relaxed),
            notify: Notify::new(),
        });
        let mut keys_in = keys.to_vec();
        keys_in.sort();
        keys_in.dedup();
        let mut queues = table.queues.lock();
        for key in &keys_in {
            queues
                .entry(key.clone())
                .or_default()
                .push_back(waiter.clone());
        }
        table.keys.store(queues.len(), Ordering::Release);
        Wait {
            table: table.clone(),
            keys: keys_in,
            waiter,
        }
    }

    /// Whether any client waits on a key here (a hint for writers).
    pub fn any(&self) -> bool {
        self.keys.load(Ordering::Acquire) > 0
    }

    /// Wakes the first waiter of each of `keys` that has one.
    pub fn signal<'k>(&self, keys: impl IntoIterator<Item = &'k [u8]>) {
        if !self.any() {
            return;
        }
        let queues = self.queues.lock();
        for key in keys {
            if let Some(first) = queues.get(key).and_then(|q| q.front()) {
                first.notify.notify_one();
            }
        }
    }

    /// Clients waiting on `key`.
    #[cfg(test)]
    pub fn waiting_on(&self, key: &[u8]) -> usize {
        self.queues.lock().get(key).map_or(0, VecDeque::len)
    }
}

impl Wait {
    /// Until this waiter is woken (at once if it was woken since it last awaited).
    pub async fn notified(&self) {
        self.waiter.notify.notified().await;
    }
}

impl Drop for Wait {
    fn drop(&mut self) {
        let mut queues = self.table.queues.lock();
        for key in &self.keys {
            let Some(queue) = queues.get_mut(key) else {
                continue;
            };
            queue.retain(|w| w.id != self.waiter.id);
            match queue.front() {
                // The next waiter looks: what woke this one may be there for it too.
                Some(next) => next.notify.notify_one(),
                None => {
                    queues.remove(key);
                }
            }
        }
        self.table.keys.store(queues.len(), Ordering::Release);
    }
}

/// How `CLIENT UNBLOCK` ends a client's wait: as if its timeout passed (a null reply),
/// or with an `UNBLOCKED` error.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum UnblockAs {
    Timeout,
    Error,
}

/// The blocked clients of the server by client id, for `CLIENT UNBLOCK` (whatever
/// database they wait in).
#[derive(Default)]
pub struct UnblockTable {
    clients: Mutex<HashMap<u64, Arc<Unblock>>>,
}

/// One blocked client's way out.
pub struct Unblock {
    notify: Notify,
    how: Mutex<Option<UnblockAs>>,
}

/// A blocked client's entry in the [`UnblockTable`]; leaves it when dropped.
pub struct Unblockable<'a> {
    table: &'a UnblockTable,
    client_id: u64,
    unblock: Arc<Unblock>,
}

impl UnblockTable {
    /// Lists client `client_id` as blocked until the returned entry is dropped.
    pub fn register(&self, client_id: u64) -> Unblockable<'_> {
        let unblock = Arc::new(Unblock {
            notify: Notify::new(),
            how: Mutex::new(None),
        });
        self.clients.lock().insert(client_id, unblock.clone());
        Unblockable {
            table: self,
            client_id,
            unblock,
        }
    }

    /// Ends the wait of client `client_id`, if it is blocked (`false` otherwise). It
    /// leaves the table at once, so a second call answers `false`.
    pub fn unblock(&self, client_id: u64, how: UnblockAs) -> bool {
        let Some(unblock) = self.clients.lock().remove(&client_id) else {
            return false;
        };
        *unblock.how.lock() = Some(how);
        unblock.notify.notify_one();
        true
    }
}

impl Unblockable<'_> {
    /// Until `CLIENT UNBLOCK` names this client (at once if it did since the last call).
    pub async fn unblocked(&self) -> UnblockAs {
        self.unblock.notify.notified().await;
        self.unblock.how.lock().unwrap_or(UnblockAs::Timeout)
    }
}

impl Drop for Unblockable<'_> {
    fn drop(&mut self) {
        let mut clients = self.table.clients.lock();
        if clients
            .get(&self.client_id)
            .is_some_and(|u| Arc::ptr_eq(u, &self.unblock))
        {
            clients.remove(&self.client_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;

    /// Whether the waiter has a pending wake-up (without waiting for one).
    fn woken(wait: &Wait) -> bool {
        let fut = wait.notified();
        let mut fut = std::pin::pin!(fut);
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        fut.as_mut().poll(&mut cx).is_ready()
    }

    #[test]
    fn a_write_wakes_the_first_waiter_and_leaving_passes_it_on() {
        let table = Arc::new(WaitTable::default());
        assert!(!table.any());
        let a = WaitTable::wait(&table, &[b"k".to_vec(), b"other".to_vec()]);
        let b = WaitTable::wait(&table, &[b"k".to_vec()]);
        assert!(table.any());
        assert_eq!(table.waiting_on(b"k"), 2);
        table.signal([&b"nobody"[..]]);
        assert!(!woken(&a) && !woken(&b));
        table.signal([&b"k"[..]]);
        assert!(woken(&a), "the first waiter is woken");
        assert!(!woken(&b), "only the first");
        // A woken for nothing keeps its place; when A leaves, B is woken.
        table.signal([&b"k"[..]]);
        drop(a);
        assert!(woken(&b));
        assert_eq!(table.waiting_on(b"k"), 1);
        assert_eq!(table.waiting_on(b"other"), 0);
        drop(b);
        assert!(!table.any());
    }

    #[test]
    fn client_unblock_reaches_only_a_blocked_client_once() {
        let table = UnblockTable::default();
        assert!(!table.unblock(7, UnblockAs::Error), "nobody is blocked");
        let entry = table.register(7);
        assert!(table.unblock(7, UnblockAs::Error));
        assert!(!table.unblock(7, UnblockAs::Timeout), "already unblocked");
        {
            let fut = entry.unblocked();
            let mut fut = std::pin::pin!(fut);
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            assert_eq!(
                fut.as_mut().poll(&mut cx),
                std::task::Poll::Ready(UnblockAs::Error)
            );
        }
        drop(entry);
        let again = table.register(7);
        drop(again);
        assert!(!table.unblock(7, UnblockAs::Timeout), "left when dropped");
    }
}
