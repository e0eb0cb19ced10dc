//! One client connection, from the accepted socket to its close: the TLS handshake, the
//! request loop (read, decode a batch, run it, reply), and the end of the connection.
//!
//! Owns the connection's buffers (what was read, the decoded batch, the replies), the
//! decision where a batch runs and when its replies go out, and the per-connection limits
//! (idle timeout, request sizes through the decoder, pre-auth limits). It does not know
//! what commands do (`commands`) nor which thread it runs on (`server` hands it to one).
//!
//! A connection decodes every complete request in its buffer (a pipelined batch, at most
//! [`MAX_BATCH_REQUESTS`]) and runs the batch in one go. Batches of reads and writes run
//! on the connection thread (engine reads never block on writers; a write is a short
//! append to the log's tail). In sync mode the batch's replies then wait, asynchronously,
//! for the `syncer` thread's next sync, which makes the writes of every waiting
//! connection durable at once (group commit); the thread serves other connections
//! meanwhile. Batches that may wait on the device themselves (EXEC, FLUSHDB, SAVE) run on
//! tokio's blocking pool, the connection's buffers moving there and back with them. The
//! replies of a pipelined batch wait in the connection's outbox until its thread has run
//! every ready connection (see `outbox`); a lone request's reply waits there too when
//! the thread busy-polls (see `busy_poll`), otherwise it goes out at once. Before
//! authentication a connection decodes one request at a time, so the stricter pre-auth
//! limits apply to every request up to the `AUTH` that lifts them.
//!
//! Pub/Sub: while its session is subscribed, the connection also waits for messages
//! queued for it (`pubsub`) and writes them, between batches; a subscriber that passed
//! its output limit is closed.
//!
//! Shutdown: between batches the connection checks the server's shutdown signal; it
//! finishes the batch it is running, answers it and closes.
//!
//! Thread-safety: a connection is one async task on one connection thread; only a batch
//! that may block leaves it, for the duration of the batch, to a blocking-pool thread.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::commands::{execute_batch, may_block, retry_blocked, Blocked, Session, Written};
use crate::config::DurabilityMode;
use crate::outbox::Outbox;
use crate::resp::{
    check_incomplete, decode_into, ProtocolError, Reply, RequestLimits, RequestSpans,
};
use crate::state::{stopped, ServerState};
use crate::syncer::NotDurable;
use tucana::replication::LogPosition;

/// At most this many pipelined requests run as one batch (bounds the reply buffer).
const MAX_BATCH_REQUESTS: usize = 1024;
/// A client must finish the TLS handshake within this time.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Read this much at a time at least.
const READ_CHUNK_BYTES: usize = 16 << 10;

/// Runs one connection on the connection thread it was handed to.
pub async fn serve_accepted(
    state: Arc<ServerState>,
    stream: std::net::TcpStream,
    shutdown: watch::Receiver<bool>,
) {
    let Ok(stream) = TcpStream::from_std(stream) else {
        return;
    };
    match state.tls.clone() {
        None => {
            let mut stream = stream;
            // Declared after the stream, so dropped before it: see `Outbox`'s drop.
            let outbox = plain_outbox(&stream);
            serve_connection(state, &mut stream, outbox.as_ref(), shutdown).await;
        }
        Some(acceptor) => {
            let handshake = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream));
            if let Ok(Ok(mut tls)) = handshake.await {
                serve_connection(state, &mut tls, None, shutdown).await;
                // Ends the TLS session properly (close_notify), so clients see a
                // clean end of stream rather than a truncation; bounded, as a client
                // that stopped reading (a Pub/Sub subscriber dropped past its output
                // limit) would never take it.
                let _ = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, tls.shutdown()).await;
            }
        }
    }
}

/// The outbox of a plain TCP connection (see `outbox`).
fn plain_outbox(stream: &TcpStream) -> Option<Outbox> {
    use std::os::fd::AsRawFd;
    Some(Outbox::new(stream.as_raw_fd()))
}

/// Serves one connection until it ends, then writes what its outbox still holds.
async fn serve_connection<S: AsyncRead + AsyncWrite + Unpin>(
    state: Arc<ServerState>,
    stream: &mut S,
    outbox: Option<&Outbox>,
    shutdown: watch::Receiver<bool>,
) {
    let mut last = Vec::new();
    let ended = serve_requests(&state, stream, outbox, shutdown).await;
    // Replies queued before the end (the client may have half-closed and still read).
    if let (Ok(()), Some(outbox)) = (ended, outbox) {
        if outbox.take_pending(&mut last).is_ok() && !last.is_empty() {
            let _ = stream.write_all(&last).await;
            let _ = stream.flush().await;
        }
    }
}

/// What a connection keeps from batch to batch. All of it is reused, so a connection
/// allocates when a batch is larger than any before it, not per request; it moves to a
/// blocking thread and back with a batch that may block.
struct Connection {
    session: Session,
    /// Bytes read: consumed up to `start`, then requests not decoded yet (the last
    /// perhaps incomplete).
    buf: Vec<u8>,
    start: usize,
    /// The batch decoded from `buf`.
    spans: RequestSpans,
    /// The batch's encoded replies.
    out: Vec<u8>,
}

/// What decoding a batch found besides its requests.
struct Decoded {
    /// A request of the batch may wait on the device (`commands::may_block`).
    blocks: bool,
    /// The bytes after the batch can never become a request: the connection answers the
    /// error after the batch's replies, and closes.
    error: Option<ProtocolError>,
}

impl Connection {
    fn new(session: Session) -> Connection {
        Connection {
            session,
            buf: Vec::with_capacity(READ_CHUNK_BYTES),
            start: 0,
            out: Vec::new(),
            spans: RequestSpans::default(),
        }
    }

    /// Decodes the complete requests buffered from `start` on, as one batch: all of them
    /// (up to [`MAX_BATCH_REQUESTS`]) once the session is authenticated, one before.
    fn decode_batch(&mut self, limits: &RequestLimits) -> Decoded {
        self.spans.clear();
        let mut decoded = Decoded {
            blocks: false,
            error: None,
        };
        loop {
            match decode_into(&self.buf, self.start, limits, &mut self.spans) {
                Ok(Some(consumed)) => {
                    self.start += consumed;
                    let (requests, last) = (self.spans.in_buffer(&self.buf), self.spans.len() - 1);
                    let mut waits = false;
                    if requests.arg_count(last) > 0 {
                        let blocking = may_block(requests.arg(last, 0));
                        decoded.blocks |= blocking.device;
                        waits = blocking.client;
                    }
                    // A blocking pop ends its batch: the requests after it wait, unparsed,
                    // until it is answered.
                    if waits
                        || !self.session.authenticated
                        || self.spans.len() >= MAX_BATCH_REQUESTS
                    {
                        break;
                    }
                }
                Ok(None) => {
                    if let Err(e) = check_incomplete(self.buf.len() - self.start, limits) {
                        decoded.error = Some(e);
                    }
                    break;
                }
                Err(e) => {
                    decoded.error = Some(e);
                    break;
                }
            }
        }
        decoded
    }

    /// Runs the decoded batch; its replies are appended to `out`.
    fn execute(&mut self, state: &ServerState) -> Written {
        execute_batch(
            state,
            &mut self.session,
            self.spans.in_buffer(&self.buf),
            &mut self.out,
        )
    }

    /// Drops the consumed bytes and makes room to read at least `READ_CHUNK_BYTES`.
    fn make_room(&mut self) {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        if self.buf.capacity() - self.buf.len() < READ_CHUNK_BYTES {
            self.buf.reserve(READ_CHUNK_BYTES);
        }
    }
}

/// After a batch that wrote, with replication: wakes the shippers, and returns (and
/// keeps the last for `WAIT`) the keyspaces and log positions the backups must
/// acknowledge: the selected database's, or in cluster mode each region's the batch
/// wrote to.
fn replicated_write(state: &ServerState, conn: &mut Connection) -> Vec<(String, LogPosition)> {
    let written = std::mem::take(&mut conn.session.wrote_keyspaces);
    let Some(replication) = state.replication.as_ref() else {
        return Vec::new();
    };
    replication.notify_write();
    let keyspaces: Vec<tucana::Keyspace> = if state.cluster.is_some() {
        let db = &state.store.db;
        written
            .iter()
            .filter_map(|name| db.open_keyspace(name).ok())
            .collect()
    } else {
        let slot = state.store.slot(conn.session.db_index());
        slot.existing().into_iter().collect()
    };
    let targets: Vec<_> = keyspaces
        .iter()
        .map(|ks| (ks.name().to_string(), ks.log_position()))
        .collect();
    if let Some(last) = targets.last() {
        conn.session.last_write = Some(last.clone());
    }
    if replication.has_backups() {
        targets
    } else {
        Vec::new()
    }
}

/// Cluster mode with sync durability: the batch's reads of regions this server leads
/// must not show a write a failover could lose, nor come from a primary that may have
/// been replaced (DESIGN.md, "Linearizable reads"). Returns each region read, at its log
/// position now (at or past everything the reads saw), whose backups have not all
/// acknowledged it yet: the replies wait for that. A region whose gate refuses (lease
/// gone, led elsewhere now) turns the batch's read replies into that refusal.
fn reads_to_confirm(
    state: &ServerState,
    conn: &mut Connection,
    written: &Written,
) -> Vec<(String, LogPosition)> {
    let names = std::mem::take(&mut conn.session.read_keyspaces);
    if !written.has_reads() || state.config.durability != DurabilityMode::Sync {
        return Vec::new();
    }
    let Some(replication) = state.replication.as_ref() else {
        return Vec::new();
    };
    let mut waits = Vec::new();
    for name in names {
        let Ok(ks) = state.store.db.open_keyspace(&name) else {
            continue;
        };
        let position = ks.log_position();
        match replication.read_answerable(&name, position) {
            Some(Ok(())) => {}
            Some(Err(text)) => {
                written.reads_refused(&mut conn.out, &text);
                return Vec::new();
            }
            None => waits.push((name, position)),
        }
    }
    waits
}

/// Runs the batch on this thread. Sync durability: the replies then wait for the writes
/// to be durable, and acknowledged by the backups (and, in cluster mode, for the
/// backups' acknowledgement of what its reads saw); the thread serves other
/// connections meanwhile.
async fn run_here(state: &ServerState, conn: &mut Connection) {
    let written = conn.execute(state);
    let reads = reads_to_confirm(state, conn, &written);
    if written.is_empty() && reads.is_empty() {
        return;
    }
    let mut acked = if written.is_empty() {
        Vec::new()
    } else {
        replicated_write(state, conn)
    };
    acked.extend(reads);
    if let Some(syncer) = &state.syncer {
        if let Err(e) = syncer.durable(acked).await {
            written.not_durable(&mut conn.out, &e);
        }
    }
}

/// Runs a batch that may block on tokio's blocking pool; the connection's buffers go
/// there and come back with it. `Err` if a handler panicked (a bug; it ends this
/// connection only).
async fn run_blocking(state: &Arc<ServerState>, mut conn: Connection) -> io::Result<Connection> {
    let state = state.clone();
    tokio::task::spawn_blocking(move || {
        let written = conn.execute(&state);
        let reads = reads_to_confirm(&state, &mut conn, &written);
        if !written.is_empty() || !reads.is_empty() {
            let mut acked = if written.is_empty() {
                Vec::new()
            } else {
                replicated_write(&state, &mut conn)
            };
            acked.extend(reads);
            if state.config.durability == DurabilityMode::Sync {
                // This thread may block: the sync runs here (shared with whoever syncs
                // at the same time), then the wait for the backups.
                let result = state
                    .store
                    .db
                    .sync()
                    .map_err(|e| NotDurable::Sync(e.to_string()))
                    .and_then(|()| match &state.replication {
                        Some(r) => acked.iter().try_for_each(|(name, position)| {
                            r.wait_acked(name, *position).map_err(NotDurable::Acks)
                        }),
                        None => Ok(()),
                    });
                if let Err(e) = result {
                    written.not_durable(&mut conn.out, &e);
                }
            }
        }
        conn
    })
    .await
    .map_err(|_| io::Error::other("a command handler panicked"))
}

/// The connection's request loop. `Err` when the connection broke (nothing more can be
/// written to it); `Ok` when it ended otherwise.
async fn serve_requests<S: AsyncRead + AsyncWrite + Unpin>(
    state: &Arc<ServerState>,
    stream: &mut S,
    outbox: Option<&Outbox>,
    shutdown: watch::Receiver<bool>,
) -> io::Result<()> {
    // One wait for the whole connection, not one per request: a new wait registers with
    // the channel (a lock shared by every connection) and dropping it unregisters. Between
    // batches `shutting_down` asks the channel's version, a plain atomic load.
    let mut waiter = shutdown.clone();
    let mut stop = std::pin::pin!(stopped(&mut waiter));
    let shutting_down = || shutdown.has_changed().unwrap_or(true);
    let id = state.new_client_id();
    let mut conn = Connection::new(Session::new(id, state.config.requirepass.is_none()));
    loop {
        let limits = if conn.session.authenticated {
            state.config.request_limits
        } else {
            state.config.pre_auth_limits
        };
        let decoded = conn.decode_batch(&limits);
        let ran = !conn.spans.is_empty();
        if ran {
            if decoded.blocks {
                conn = run_blocking(state, conn).await?;
            } else {
                run_here(state, &mut conn).await;
            }
            crate::busy_poll::batch_ran();
            if let Some(blocked) = conn.session.blocked.take() {
                if !wait_blocked(state, stream, outbox, &mut conn, blocked, &mut stop).await? {
                    return Ok(());
                }
            }
            let ending =
                decoded.error.is_some() || conn.session.close_after_reply || shutting_down();
            // A pipelined batch's replies are queued, and a lone request's when the thread
            // busy-polls (see `send_replies`); the connection's last are written now.
            let queue = conn.spans.len() > 1 || !state.config.busy_poll.is_zero();
            send_replies(state, stream, outbox, &mut conn.out, queue && !ending).await?;
        }
        if let Some(e) = decoded.error {
            state
                .metrics
                .protocol_errors
                .fetch_add(1, Ordering::Relaxed);
            let mut reply = Vec::new();
            Reply::error(format!("ERR {e}")).encode(conn.session.protocol, &mut reply);
            write_now(state, stream, outbox, &reply).await?;
            return Ok(());
        }
        if conn.session.close_after_reply {
            if conn.session.shutdown_requested {
                state.shutdown.send_replace(true);
            }
            return Ok(());
        }
        if shutting_down() {
            return Ok(());
        }
        if ran {
            // More complete requests may be buffered; decode before reading.
            continue;
        }
        // Pub/Sub: the connection's queue of messages, while it is subscribed.
        let subscriber = conn.session.subscriber().cloned();
        if subscriber.as_ref().is_some_and(|s| s.dropped()) {
            return Err(past_output_limit());
        }
        conn.make_room();
        // As in Redis, the idle timeout does not apply to a subscribed connection.
        let idle_timeout = match subscriber {
            Some(_) => None,
            None => state.settings.idle_timeout(),
        };
        let read = async {
            match idle_timeout {
                Some(idle) => tokio::time::timeout(idle, stream.read_buf(&mut conn.buf)).await,
                None => Ok(stream.read_buf(&mut conn.buf).await),
            }
        };
        let attention = std::future::poll_fn(|cx| match outbox {
            Some(outbox) => outbox.poll_attention(cx),
            None => std::task::Poll::Pending,
        });
        let message = async {
            match &subscriber {
                Some(s) => s.ready().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = message => {
                if let Some(s) = &subscriber {
                    if !send_messages(state, stream, outbox, s, &mut conn.out).await? {
                        return Err(past_output_limit());
                    }
                }
            }
            r = read => match r {
                Ok(Ok(0)) => return Ok(()),
                Ok(Err(e)) => return Err(e),
                Ok(Ok(n)) => {
                    state.metrics.net_input_bytes.fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(_) => {
                    state.metrics.idle_timeouts.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
            },
            // The park hook could not send all of the outbox (or failed): write the rest
            // here, waiting for the socket as any write does.
            _ = attention => {
                write_now(state, stream, outbox, &[]).await?;
            }
            _ = &mut stop => return Ok(()),
        }
    }
}

/// The end of a subscriber dropped for passing its output limit: an error, so that
/// nothing more is written to a client that does not read (`serve_connection` writes
/// the outbox's rest only after an `Ok` end).
fn past_output_limit() -> io::Error {
    io::Error::other("a Pub/Sub subscriber passed its output limit")
}

/// Writes the Pub/Sub messages queued for this connection (after whatever its outbox
/// holds), until the queue is empty. `Ok(false)`: the subscriber passed its output
/// limit (before or during a write), and the connection must close. `spare` is the
/// connection's reply buffer, empty between batches (anything in it would go out
/// first), and is left empty.
async fn send_messages<S: AsyncWrite + Unpin>(
    state: &ServerState,
    stream: &mut S,
    outbox: Option<&Outbox>,
    subscriber: &crate::pubsub::Subscriber,
    spare: &mut Vec<u8>,
) -> io::Result<bool> {
    loop {
        if subscriber.dropped() {
            return Ok(false);
        }
        subscriber.take(spare);
        if spare.is_empty() {
            return Ok(true);
        }
        // A subscriber that does not read blocks this write; its queue keeps growing
        // meanwhile, until a publisher drops it (and wakes this task).
        let dropped = async {
            while !subscriber.dropped() {
                subscriber.ready().await;
            }
        };
        tokio::select! {
            r = write_now(state, stream, outbox, spare) => r?,
            _ = dropped => return Ok(false),
        }
        subscriber.written();
        spare.clear();
    }
}

/// Counts a connection in INFO's `blocked_clients` while it lives.
struct BlockedCount<'a>(&'a ServerState);

impl<'a> BlockedCount<'a> {
    fn new(state: &'a ServerState) -> BlockedCount<'a> {
        state
            .metrics
            .blocked_clients
            .fetch_add(1, Ordering::Relaxed);
        BlockedCount(state)
    }
}

impl Drop for BlockedCount<'_> {
    fn drop(&mut self) {
        self.0
            .metrics
            .blocked_clients
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// Buffered input a blocked client may send before the connection stops reading it.
const BLOCKED_INPUT_BYTES_MAX: usize = 1 << 20;

/// A blocking pop found nothing (DESIGN.md, "Blocking pops"): sends the batch's earlier
/// replies, queues this connection on the keys, and retries the request whenever it is
/// woken, until it is served (its reply, made durable, is left in `conn.out`) or its
/// deadline passes (a null array is). `Ok(false)`: the client hung up or the server
/// is shutting down while it waited; `Err` also when a subscribed connection passed its
/// Pub/Sub output limit meanwhile.
async fn wait_blocked<S: AsyncRead + AsyncWrite + Unpin, F: std::future::Future<Output = ()>>(
    state: &ServerState,
    stream: &mut S,
    outbox: Option<&Outbox>,
    conn: &mut Connection,
    blocked: Blocked,
    stop: &mut std::pin::Pin<&mut F>,
) -> io::Result<bool> {
    // The command's placeholder reply goes; on timeout Redis answers a null array for
    // every blocking pop (BLMOVE too, though inside MULTI it answers a null).
    conn.out.truncate(blocked.reply_at);
    send_replies(state, stream, outbox, &mut conn.out, false).await?;
    let slot = state.store.slot(conn.session.db_index());
    // Registered before the retry: a write that lands between the first try and now is
    // then seen by the retry, any later one notifies.
    let wait = crate::waiters::WaitTable::wait(slot.waiters(), &blocked.keys);
    let unblockable = state.unblock.register(conn.session.id());
    let _counted = BlockedCount::new(state);
    let sleep = async {
        match blocked.deadline {
            Some(d) => tokio::time::sleep_until(d.into()).await,
            None => std::future::pending().await,
        }
    };
    let mut sleep = std::pin::pin!(sleep);
    loop {
        let written = retry_blocked(state, &mut conn.session, &blocked.args, &mut conn.out);
        if conn.session.blocked.take().is_none() {
            // Served (or an error): leave the queues, which wakes the next waiter.
            drop(wait);
            if !written.is_empty() {
                let acked = replicated_write(state, conn);
                if let Some(syncer) = &state.syncer {
                    if let Err(e) = syncer.durable(acked).await {
                        written.not_durable(&mut conn.out, &e);
                    }
                }
            }
            return Ok(true);
        }
        conn.out.clear();
        conn.make_room();
        let room = conn.buf.len() - conn.start < BLOCKED_INPUT_BYTES_MAX;
        // A subscribed RESP3 connection gets its messages while it waits.
        let subscriber = conn.session.subscriber().cloned();
        let message = async {
            match &subscriber {
                Some(s) => s.ready().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = wait.notified() => {}
            _ = message => {
                if let Some(s) = &subscriber {
                    if !send_messages(state, stream, outbox, s, &mut conn.out).await? {
                        return Err(past_output_limit());
                    }
                }
            }
            _ = &mut sleep => {
                Reply::NilArray.encode(conn.session.protocol, &mut conn.out);
                return Ok(true);
            }
            how = unblockable.unblocked() => {
                let reply = match how {
                    crate::waiters::UnblockAs::Timeout => Reply::NilArray,
                    crate::waiters::UnblockAs::Error => {
                        Reply::error("UNBLOCKED client unblocked via CLIENT UNBLOCK")
                    }
                };
                reply.encode(conn.session.protocol, &mut conn.out);
                return Ok(true);
            }
            r = stream.read_buf(&mut conn.buf), if room => match r {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    state.metrics.net_input_bytes.fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(e) => return Err(e),
            },
            _ = stop.as_mut() => return Ok(false),
        }
    }
}

/// Sends a batch's replies (`out`, left empty), or queues them for the thread's next
/// flush when `may_queue` and the outbox has room (see `outbox`).
///
/// Without busy polling a lone reply is written at once (the client works on it while
/// this thread serves the next connection, instead of both waiting for the flush); a
/// large reply and the connection's last are written now too, after what the outbox
/// holds.
async fn send_replies<S: AsyncWrite + Unpin>(
    state: &ServerState,
    stream: &mut S,
    outbox: Option<&Outbox>,
    out: &mut Vec<u8>,
    may_queue: bool,
) -> io::Result<()> {
    match outbox {
        Some(outbox) if may_queue && outbox.has_room(out.len()) => {
            state
                .metrics
                .net_output_bytes
                .fetch_add(out.len() as u64, Ordering::Relaxed);
            outbox.queue(out);
        }
        _ => {
            write_now(state, stream, outbox, out).await?;
            out.clear();
        }
    }
    Ok(())
}

/// Writes `out` now, after the bytes the outbox still holds (so replies keep their order).
async fn write_now<S: AsyncWrite + Unpin>(
    state: &ServerState,
    stream: &mut S,
    outbox: Option<&Outbox>,
    out: &[u8],
) -> io::Result<()> {
    if let Some(outbox) = outbox {
        let mut earlier = Vec::new();
        outbox.take_pending(&mut earlier)?;
        if !earlier.is_empty() {
            stream.write_all(&earlier).await?;
        }
    }
    write_out(state, stream, out).await
}

async fn write_out<S: AsyncWrite + Unpin>(
    state: &ServerState,
    stream: &mut S,
    out: &[u8],
) -> io::Result<()> {
    state
        .metrics
        .net_output_bytes
        .fetch_add(out.len() as u64, Ordering::Relaxed);
    stream.write_all(out).await?;
    // TLS buffers what it encrypts; plain TCP's flush does nothing.
    stream.flush().await
}
