//! The network side: the listener, one task per connection, the Prometheus endpoint and
//! graceful shutdown.
//!
//! Owns sockets, limits on connections (max clients, idle timeout, request sizes through
//! the decoder) and the execution model; it does not know what commands do.
//!
//! Execution model: connections are async tasks spread round-robin over the connection
//! threads (`ConnectionThreads`), each a single-threaded tokio runtime; how many is
//! `ServerConfig::threads` (default: one per core but one); the listener, the
//! metrics endpoint and signals run on a separate small runtime. A connection stays on
//! its thread for its life: each thread waits on its own sockets and runs what became
//! ready, with no work stealing between threads (in a state multi-threaded runtime a
//! worker that found work woke another to steal some, a futex wake and a context switch
//! per request at pipeline depth 1). A connection decodes every complete request in its
//! buffer (a pipelined batch) and runs the batch in one go; the replies of a pipelined
//! batch wait in the connection's outbox until its thread has run every ready connection
//! (see `outbox`). A thread that ran several connections' batches since it last slept
//! polls a little longer before it sleeps again (see `busy_poll`); then the reply to a
//! lone request waits in the outbox too, otherwise it goes out at once.
//! Batches of reads and writes run on the connection thread (engine reads never block
//! on writers; a write is a short append to the log's tail). In sync mode the batch's
//! replies then wait, asynchronously, for the `syncer` thread's next sync, which makes
//! the writes of every waiting connection durable at once (group commit); the thread
//! serves other connections meanwhile. Batches that may wait on the device themselves
//! (EXEC, FLUSHDB, SAVE) run on tokio's blocking pool. Before
//! authentication a connection decodes one request at a time, so the stricter pre-auth
//! limits apply to every request up to the `AUTH` that lifts them.
//!
//! Shutdown (SIGINT, SIGTERM, `SHUTDOWN`, or [`ShutdownHandle::shutdown`]): the listener
//! stops accepting, each connection finishes the batch it is running, answers it and
//! closes; after all are closed (or the grace period ran out) the database commits.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tucana::Database;

use crate::commands::{command_count, execute_batch, may_block, Session};
use crate::config::{DurabilityMode, ServerConfig};
use crate::metrics::Metrics;
use crate::outbox::Outbox;
use crate::prometheus::serve_metrics;
use crate::resp::{check_incomplete, decode_into, Reply, RequestSpans};
use crate::state::{stopped, ServerState};

/// At most this many pipelined requests run as one batch (bounds the reply buffer).
const MAX_BATCH_REQUESTS: usize = 1024;
/// A client must finish the TLS handshake within this time.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Read this much at a time at least.
const READ_CHUNK_BYTES: usize = 16 << 10;

/// Asks a running server to shut down gracefully. Cheap to clone.
#[derive(Clone)]
pub struct ShutdownHandle(Arc<watch::Sender<bool>>);

impl ShutdownHandle {
    pub fn shutdown(&self) {
        self.0.send_replace(true);
    }
}

/// A bound server, not yet running.
pub struct Server {
    listener: TcpListener,
    metrics_listener: Option<TcpListener>,
    state: Arc<ServerState>,
}

impl Server {
    /// Validates the configuration and binds the listeners. Must be called inside a tokio
    /// runtime. A configuration that is unsafe (a public address without a password) is
    /// an `InvalidInput` error.
    pub async fn bind(db: Database, config: ServerConfig) -> io::Result<Server> {
        config
            .validate()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let tls = config.tls.as_ref().map(crate::tls::acceptor).transpose()?;
        let listener = TcpListener::bind(config.listen).await?;
        let metrics_listener = match config.metrics_listen {
            Some(addr) => Some(TcpListener::bind(addr).await?),
            None => None,
        };
        let local_port = listener.local_addr()?.port();
        let metrics = Metrics::new(command_count());
        let state = Arc::new(ServerState::new(db, config, metrics, local_port, tls)?);
        Ok(Server {
            listener,
            metrics_listener,
            state,
        })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_listener
            .as_ref()
            .and_then(|l| l.local_addr().ok())
    }

    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle(self.state.shutdown.clone())
    }

    /// Serves until shut down, then commits the database. The error is the commit's.
    pub async fn run(self) -> tucana::Result<()> {
        let Server {
            listener,
            metrics_listener,
            state,
        } = self;
        let mut shutdown = state.shutdown.subscribe();
        let mut threads = match ConnectionThreads::start(state.threads, state.config.busy_poll) {
            Ok(t) => t,
            Err(e) => return Err(tucana::Error::Io(e)),
        };
        let mut tasks = JoinSet::new();
        if let Some(metrics) = metrics_listener {
            tasks.spawn(serve_metrics(state.clone(), metrics, shutdown.clone()));
        }
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => accept(&state, &mut tasks, &mut threads, stream, &shutdown),
                    Err(e) => {
                        // Out of file descriptors and the like: back off, keep serving.
                        eprintln!("tucana serve: accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                _ = stopped(&mut shutdown) => break,
                // Reap finished connections so the set does not grow without bound.
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            }
        }
        drop(listener);
        let grace = state.config.shutdown_grace;
        let drained =
            tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await;
        if drained.is_err() {
            eprintln!("tucana serve: connections still busy after {grace:?}; closing them");
            tasks.abort_all();
            while tasks.join_next().await.is_some() {}
        }
        // Every connection has ended: the threads have nothing left to run, and nobody
        // waits for a sync.
        let stopping = state.clone();
        let _ = tokio::task::spawn_blocking(move || {
            threads.stop();
            if let Some(syncer) = &stopping.syncer {
                syncer.stop();
            }
        })
        .await;
        let db = state.store.db.clone();
        tokio::task::spawn_blocking(move || db.commit())
            .await
            .unwrap_or_else(|e| Err(tucana::Error::Io(io::Error::other(e))))
    }
}

/// One single-threaded runtime per thread, each running the connections handed to it
/// (see the module doc for why not one multi-threaded runtime).
struct ConnectionThreads {
    handles: Vec<tokio::runtime::Handle>,
    /// Round-robin position for the next connection.
    next: usize,
    stop: Vec<tokio::sync::oneshot::Sender<()>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl ConnectionThreads {
    fn start(count: usize, busy_poll: Duration) -> io::Result<ConnectionThreads> {
        assert!(count > 0);
        let mut threads = ConnectionThreads {
            handles: Vec::with_capacity(count),
            next: 0,
            stop: Vec::with_capacity(count),
            threads: Vec::with_capacity(count),
        };
        for i in 0..count {
            let rt = tokio::runtime::Builder::new_current_thread()
                .thread_name("tucana-serve")
                .enable_all()
                .on_thread_park(|| {
                    crate::outbox::flush_queued();
                    crate::busy_poll::before_park();
                })
                .build()?;
            if !busy_poll.is_zero() {
                rt.spawn(crate::busy_poll::run(busy_poll));
            }
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            threads.handles.push(rt.handle().clone());
            threads.stop.push(stop);
            // The runtime lives and is dropped on its thread (dropping one inside another
            // runtime's task would panic).
            let thread = std::thread::Builder::new()
                .name(format!("tucana-serve-{i}"))
                .spawn(move || {
                    rt.block_on(async move {
                        let _ = stopped.await;
                    })
                })?;
            threads.threads.push(thread);
        }
        Ok(threads)
    }

    fn pick(&mut self) -> &tokio::runtime::Handle {
        let i = self.next % self.handles.len();
        self.next = self.next.wrapping_add(1);
        &self.handles[i]
    }

    /// Ends the threads; called once no connection task is left.
    fn stop(self) {
        drop(self.stop);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

fn accept(
    state: &Arc<ServerState>,
    tasks: &mut JoinSet<()>,
    threads: &mut ConnectionThreads,
    stream: TcpStream,
    shutdown: &watch::Receiver<bool>,
) {
    let metrics = &state.metrics;
    metrics.connections_received.fetch_add(1, Ordering::Relaxed);
    let _ = stream.set_nodelay(true);
    if metrics.connected_clients() >= state.config.max_clients as u64 {
        metrics.connections_rejected.fetch_add(1, Ordering::Relaxed);
        tasks.spawn(async move {
            let mut stream = stream;
            let _ = stream
                .write_all(b"-ERR max number of clients reached\r\n")
                .await;
        });
        return;
    }
    // The socket is registered with the listener's runtime; it moves to the connection
    // thread's own event loop, so its readiness wakes that thread and no other.
    let stream = match stream.into_std() {
        Ok(s) => s,
        Err(_) => return,
    };
    metrics.connected_clients.fetch_add(1, Ordering::Relaxed);
    let state = state.clone();
    let shutdown = shutdown.clone();
    let connected = ConnectedGuard(state.clone());
    let runtime = threads.pick().clone();
    tasks.spawn_on(
        async move {
            let _connected = connected;
            serve_accepted(state, stream, shutdown).await;
        },
        &runtime,
    );
}

/// Runs one connection on the connection thread it was handed to.
async fn serve_accepted(
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
                // clean end of stream rather than a truncation.
                let _ = tls.shutdown().await;
            }
        }
    }
}

/// The outbox of a plain TCP connection (see `outbox`).
fn plain_outbox(stream: &TcpStream) -> Option<Outbox> {
    use std::os::fd::AsRawFd;
    Some(Outbox::new(stream.as_raw_fd()))
}

/// Counts a connection as gone however its task ends (also when aborted).
struct ConnectedGuard(Arc<ServerState>);

impl Drop for ConnectedGuard {
    fn drop(&mut self) {
        self.0
            .metrics
            .connected_clients
            .fetch_sub(1, Ordering::Relaxed);
    }
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

/// The connection's request loop. `Err` when the connection broke (nothing more can be
/// written to it); `Ok` when it ended otherwise.
async fn serve_requests<S: AsyncRead + AsyncWrite + Unpin>(
    state: &Arc<ServerState>,
    stream: &mut S,
    outbox: Option<&Outbox>,
    shutdown: watch::Receiver<bool>,
) -> io::Result<()> {
    let state = state.clone();
    // One wait for the whole connection, not one per request: a new wait registers with
    // the channel (a lock state by every connection) and dropping it unregisters. Between
    // batches `shutting_down` asks the channel's version, a plain atomic load.
    let mut waiter = shutdown.clone();
    let mut stop = std::pin::pin!(stopped(&mut waiter));
    let shutting_down = || shutdown.has_changed().unwrap_or(true);
    let id = state.new_client_id();
    let mut session = Session::new(id, state.config.requirepass.is_none());
    let mut buf: Vec<u8> = Vec::with_capacity(READ_CHUNK_BYTES);
    let mut start = 0;
    // Both reused from batch to batch: a connection allocates when a batch is larger
    // than any before it, not per request.
    let mut out: Vec<u8> = Vec::new();
    let mut spans = RequestSpans::default();
    loop {
        let limits = if session.authenticated {
            state.config.request_limits
        } else {
            state.config.pre_auth_limits
        };
        spans.clear();
        let mut blocks = false;
        let mut protocol_error = None;
        loop {
            match decode_into(&buf, start, &limits, &mut spans) {
                Ok(Some(consumed)) => {
                    start += consumed;
                    let (requests, last) = (spans.in_buffer(&buf), spans.len() - 1);
                    if requests.arg_count(last) > 0 {
                        blocks |= may_block(requests.arg(last, 0));
                    }
                    if !session.authenticated || spans.len() >= MAX_BATCH_REQUESTS {
                        break;
                    }
                }
                Ok(None) => {
                    if let Err(e) = check_incomplete(buf.len() - start, &limits) {
                        protocol_error = Some(e);
                    }
                    break;
                }
                Err(e) => {
                    protocol_error = Some(e);
                    break;
                }
            }
        }
        let ran = !spans.is_empty();
        if ran {
            if blocks {
                // The batch's buffers go to the blocking thread and come back with it.
                let worker_state = state.clone();
                let mut worker_out = std::mem::take(&mut out);
                let worker_buf = std::mem::take(&mut buf);
                let worker_spans = std::mem::take(&mut spans);
                let joined = tokio::task::spawn_blocking(move || {
                    let written = execute_batch(
                        &worker_state,
                        &mut session,
                        worker_spans.in_buffer(&worker_buf),
                        &mut worker_out,
                    );
                    if worker_state.config.durability == DurabilityMode::Sync && !written.is_empty()
                    {
                        // This thread may block: the sync runs here (state with whoever
                        // syncs at the same time).
                        if let Err(e) = worker_state.store.db.sync() {
                            written.not_durable(&mut worker_out, &e);
                        }
                    }
                    (session, worker_out, worker_buf, worker_spans)
                })
                .await;
                match joined {
                    Ok((s, o, b, r)) => {
                        session = s;
                        out = o;
                        buf = b;
                        spans = r;
                    }
                    // A panic in a handler is a bug; it ends this connection only.
                    Err(_) => return Err(io::Error::other("a command handler panicked")),
                }
            } else {
                let written = execute_batch(&state, &mut session, spans.in_buffer(&buf), &mut out);
                if let (Some(syncer), false) = (&state.syncer, written.is_empty()) {
                    // Sync durability: the replies wait for the writes to be durable; the
                    // thread serves other connections meanwhile.
                    if let Err(e) = syncer.durable().await {
                        written.not_durable(&mut out, &e);
                    }
                }
            }
            crate::busy_poll::batch_ran();
            // Replies are queued for the next flush (see `outbox`): a pipelined batch's
            // always, a lone request's when the thread busy-polls. Without busy polling a
            // lone reply is written at once (the client works on it while this thread
            // serves the next connection, instead of both waiting for the flush). A large
            // reply and the connection's last are written now, after what the outbox holds.
            let ending = protocol_error.is_some() || session.close_after_reply || shutting_down();
            let queue = spans.len() > 1 || !state.config.busy_poll.is_zero();
            match outbox {
                Some(outbox) if queue && !ending && outbox.has_room(out.len()) => {
                    state
                        .metrics
                        .net_output_bytes
                        .fetch_add(out.len() as u64, Ordering::Relaxed);
                    outbox.queue(&mut out);
                }
                _ => {
                    write_now(&state, stream, outbox, &out).await?;
                    out.clear();
                }
            }
        }
        if let Some(e) = protocol_error {
            state
                .metrics
                .protocol_errors
                .fetch_add(1, Ordering::Relaxed);
            let mut reply = Vec::new();
            Reply::error(format!("ERR {e}")).encode(session.protocol, &mut reply);
            write_now(&state, stream, outbox, &reply).await?;
            return Ok(());
        }
        if session.close_after_reply {
            if session.shutdown_requested {
                state.shutdown.send_replace(true);
            }
            return Ok(());
        }
        if shutting_down() {
            return Ok(());
        }
        if ran {
            // More complete spans may be buffered; decode before reading.
            continue;
        }
        if start > 0 {
            buf.drain(..start);
            start = 0;
        }
        if buf.capacity() - buf.len() < READ_CHUNK_BYTES {
            buf.reserve(READ_CHUNK_BYTES);
        }
        let read = async {
            match state.config.idle_timeout {
                Some(idle) => tokio::time::timeout(idle, stream.read_buf(&mut buf)).await,
                None => Ok(stream.read_buf(&mut buf).await),
            }
        };
        let attention = std::future::poll_fn(|cx| match outbox {
            Some(outbox) => outbox.poll_attention(cx),
            None => std::task::Poll::Pending,
        });
        tokio::select! {
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
                write_now(&state, stream, outbox, &[]).await?;
            }
            _ = &mut stop => return Ok(()),
        }
    }
}

/// A server running on its own thread and runtime (tests, embedding).
pub struct RunningServer {
    pub addr: SocketAddr,
    pub metrics_addr: Option<SocketAddr>,
    handle: ShutdownHandle,
    thread: std::thread::JoinHandle<tucana::Result<()>>,
}

impl RunningServer {
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.handle.clone()
    }

    /// Shuts down gracefully and waits; the result of the final commit.
    pub fn stop(self) -> tucana::Result<()> {
        self.handle.shutdown();
        self.join()
    }

    /// Waits until the server stopped (e.g. after a `SHUTDOWN` command).
    pub fn join(self) -> tucana::Result<()> {
        self.thread.join().unwrap_or_else(|_| {
            Err(tucana::Error::Io(io::Error::other(
                "server thread panicked",
            )))
        })
    }
}

/// The runtime of the listener, the metrics endpoint and signals (connections run on
/// [`ConnectionThreads`]): one worker is plenty.
fn runtime() -> io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("tucana-listen")
        .enable_all()
        .build()
}

/// Binds and runs a server on a new thread with its own runtime.
pub fn spawn(db: Database, config: ServerConfig) -> io::Result<RunningServer> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("tucana-serve-main".into())
        .spawn(move || {
            let rt = match runtime() {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return Ok(());
                }
            };
            rt.block_on(async move {
                let server = match Server::bind(db, config).await {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return Ok(());
                    }
                };
                let addrs = server
                    .local_addr()
                    .map(|a| (a, server.metrics_addr(), server.shutdown_handle()));
                let _ = ready_tx.send(addrs);
                server.run().await
            })
        })?;
    let (addr, metrics_addr, handle) = ready_rx
        .recv()
        .map_err(|_| io::Error::other("server thread ended before binding"))??;
    Ok(RunningServer {
        addr,
        metrics_addr,
        handle,
        thread,
    })
}

/// Runs a server on this thread until SIGINT, SIGTERM or `SHUTDOWN`; `ready` is called
/// with the bound addresses once clients can connect. Returns after the final commit.
pub fn serve_until_signal(
    db: Database,
    config: ServerConfig,
    ready: impl FnOnce(SocketAddr, Option<SocketAddr>),
) -> io::Result<tucana::Result<()>> {
    let rt = runtime()?;
    rt.block_on(async move {
        let server = Server::bind(db, config).await?;
        ready(server.local_addr()?, server.metrics_addr());
        let handle = server.shutdown_handle();
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let mut interrupt = signal(SignalKind::interrupt())?;
            let mut terminate = signal(SignalKind::terminate())?;
            tokio::spawn(async move {
                tokio::select! {
                    _ = interrupt.recv() => {}
                    _ = terminate.recv() => {}
                }
                handle.shutdown();
            });
        }
        #[cfg(not(unix))]
        tokio::spawn(async move {
            let _ = tokio::signal::ctrl_c().await;
            handle.shutdown();
        });
        Ok(server.run().await)
    })
}
