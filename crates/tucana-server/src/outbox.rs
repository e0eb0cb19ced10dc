//! Replies written when a connection thread is about to wait for events, rather than as
//! each connection finishes its batch: what redis-server does in `beforeSleep`.
//!
//! Why: on loopback a reply's `send` runs the receiver's TCP processing and wakes the
//! client. Sent one connection at a time, between the batches of the other connections
//! that became ready together, each reply tends to find the client asleep again (another
//! wake-up, on a virtual machine an inter-processor interrupt, and the client's next
//! requests trickle back one connection at a time). Sent together once every ready
//! connection has run, the first reply wakes the client and the others find it awake and
//! busy, so it sends its next requests in a burst, and the server's next event-loop turn
//! finds many connections ready. Measured with `redis-benchmark -c 50 -P 16 -t set`
//! (docs/server-bench.md): fewer context switches on both sides and less CPU per request.
//!
//! The reply to a lone request waits too when the thread busy-polls (`busy_poll`), and
//! is sent at once when it does not. A connection that sent one request waits on its
//! reply: on a thread that sleeps as soon as it runs out of work, queueing those left
//! both sides idle in turn (at `-P 1` in the harness, 0.85 and 1.03 of redis-server's
//! SET throughput against 1.40 and 1.20 with lone replies sent at once). On a thread that
//! polls, the flush comes right after the ready connections have run, and sending the
//! replies together served `-P 1` SETs faster and more evenly than sending each at once
//! (docs/server-bench.md, "Busy polling").
//!
//! How: a connection whose reply is small appends it to its [`Outbox`] and goes back to
//! reading; the outbox joins this thread's list of queued outboxes, and the runtime's
//! park hook ([`flush_queued`], `on_thread_park`) sends every queued outbox with one
//! non-blocking `send` each before the thread sleeps in `epoll_wait`. If the socket
//! cannot take it all (a slow reader), the rest stays in the outbox and the connection's
//! task is woken to write it itself, waiting for the socket as usual; if the send fails,
//! the task is woken to end the connection. Nothing else changes: a reply is only queued
//! after its batch ran (sync-mode writes are durable by then), replies stay in request
//! order, and a connection that ends (QUIT, EOF, shutdown, an error) first writes what
//! its outbox holds.
//!
//! Thread-safety: an outbox belongs to one connection task, which runs on one connection
//! thread; the park hook runs on that same thread between task polls, so the two never
//! run at once (the mutex only satisfies `Send`, it is never contended). Plain TCP only
//! (TLS buffers inside rustls, so its replies are written at once).

use std::cell::RefCell;
use std::io::{self, Write};
use std::mem::ManuallyDrop;
use std::os::fd::{FromRawFd, RawFd};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use parking_lot::Mutex;

/// A connection queues its reply only while its outbox holds at most this much; a larger
/// reply (a big GET) is written at once, after what the outbox holds.
pub const OUTBOX_MAX_BYTES: usize = 64 << 10;

thread_local! {
    /// The outboxes with bytes to send before this thread sleeps.
    static QUEUED: RefCell<Vec<Arc<Mutex<State>>>> = const { RefCell::new(Vec::new()) };
}

struct State {
    /// The connection's socket; open while `closed` is false (see [`Outbox`]'s drop).
    fd: RawFd,
    /// Bytes not yet sent, in reply order.
    pending: Vec<u8>,
    /// In this thread's `QUEUED` list.
    queued: bool,
    /// The park hook could not send everything: the task writes the rest itself.
    stalled: bool,
    /// A send failed: the connection is broken.
    failed: bool,
    /// The connection ended; the hook must not touch `fd` again.
    closed: bool,
    /// The task, while it waits for its next request.
    waker: Option<Waker>,
}

/// The replies of one plain-TCP connection waiting for the park hook.
pub struct Outbox(Arc<Mutex<State>>);

impl Outbox {
    /// An outbox for the socket `fd`, which the caller keeps open for the outbox's life.
    pub fn new(fd: RawFd) -> Outbox {
        Outbox(Arc::new(Mutex::new(State {
            fd,
            pending: Vec::new(),
            queued: false,
            stalled: false,
            failed: false,
            closed: false,
            waker: None,
        })))
    }

    /// Whether `reply_bytes` more can be queued rather than written at once.
    pub fn has_room(&self, reply_bytes: usize) -> bool {
        let s = self.0.lock();
        !s.stalled && !s.failed && s.pending.len() + reply_bytes <= OUTBOX_MAX_BYTES
    }

    /// Queues `out` for the park hook and leaves `out` empty (its buffer swapped with the
    /// outbox's when that was empty, so nothing is copied or allocated in the usual case).
    pub fn queue(&self, out: &mut Vec<u8>) {
        let mut s = self.0.lock();
        if s.pending.is_empty() {
            std::mem::swap(&mut s.pending, out);
        } else {
            s.pending.extend_from_slice(out);
        }
        out.clear();
        if !s.queued {
            s.queued = true;
            QUEUED.with(|q| q.borrow_mut().push(self.0.clone()));
        }
    }

    /// Takes the bytes the task must write itself, before anything newer: what the
    /// outbox still holds. Fails if the park hook's send failed.
    pub fn take_pending(&self, into: &mut Vec<u8>) -> io::Result<()> {
        let mut s = self.0.lock();
        if s.failed {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "sending a queued reply failed",
            ));
        }
        s.stalled = false;
        into.extend_from_slice(&s.pending);
        s.pending.clear();
        Ok(())
    }

    /// Ready when the task has to act: the hook left bytes it could not send, or failed.
    pub fn poll_attention(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut s = self.0.lock();
        if s.stalled || s.failed {
            return Poll::Ready(());
        }
        match &s.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => s.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

impl Drop for Outbox {
    /// The connection ends (also when its task is aborted): the hook must forget the
    /// socket before it is closed and its descriptor reused.
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.closed = true;
        s.pending = Vec::new();
        s.waker = None;
    }
}

/// The park hook of a connection thread: sends every queued outbox (one non-blocking
/// `send` each, more only while the socket takes it all).
pub fn flush_queued() {
    let queued = QUEUED.with(|q| std::mem::take(&mut *q.borrow_mut()));
    if queued.is_empty() {
        return;
    }
    for outbox in &queued {
        let mut s = outbox.lock();
        s.queued = false;
        if s.closed || s.pending.is_empty() {
            continue;
        }
        // SAFETY: `fd` is the connection's open socket: the task keeps the stream open
        // while its `Outbox` lives, the outbox's drop sets `closed` first, and this hook
        // runs on the task's thread between task polls, so the stream cannot be dropped
        // during this call. `ManuallyDrop` keeps this borrowed handle from closing it.
        let socket = ManuallyDrop::new(unsafe { std::net::TcpStream::from_raw_fd(s.fd) });
        let mut sent = 0;
        let result = loop {
            match (&*socket).write(&s.pending[sent..]) {
                Ok(0) => break Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    sent += n;
                    if sent == s.pending.len() {
                        break Ok(());
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        match result {
            Ok(()) => s.pending.clear(),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                s.pending.drain(..sent);
                s.stalled = true;
            }
            Err(_) => {
                s.pending.clear();
                s.failed = true;
            }
        }
        if s.stalled || s.failed {
            if let Some(w) = s.waker.take() {
                w.wake();
            }
        }
    }
    // Keep the list's capacity for the next turn (no allocation per turn).
    QUEUED.with(|q| {
        let mut q = q.borrow_mut();
        if q.is_empty() {
            let mut queued = queued;
            queued.clear();
            *q = queued;
        }
    });
}
