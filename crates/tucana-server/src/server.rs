//! The server's frame: binding the listeners, the connection threads, accepting a
//! connection and handing it to a thread, graceful shutdown, and the public entry points
//! ([`Server`], [`spawn`], [`serve_until_signal`]).
//!
//! Owns the listening socket, the max-clients limit, the threads and which runtime runs
//! what. One connection's life is `connection`'s, what commands do is `commands`', the
//! state every connection shares is `state`'s, the `/metrics` endpoint `prometheus`'.
//!
//! Execution model: connections are async tasks spread round-robin over the connection
//! threads (`ConnectionThreads`), each a single-threaded tokio runtime; how many is
//! `ServerConfig::threads` (default: one per core but one); the listener, the
//! metrics endpoint and signals run on a separate small runtime. A connection stays on
//! its thread for its life: each thread waits on its own sockets and runs what became
//! ready, with no work stealing between threads (in a shared multi-threaded runtime a
//! worker that found work woke another to steal some, a futex wake and a context switch
//! per request at pipeline depth 1). Before a thread sleeps, its park hook sends the
//! replies its connections queued (`outbox`), and a thread that ran several
//! connections' batches since it last slept polls a little longer first (`busy_poll`).
//! Batches that may wait on the device run on tokio's blocking pool; in sync mode one
//! `syncer` thread makes the writes of all waiting connections durable at once.
//!
//! Shutdown (SIGINT, SIGTERM, `SHUTDOWN`, or [`ShutdownHandle::shutdown`]): the listener
//! stops accepting, each connection finishes the batch it is running, answers it and
//! closes; after all are closed (or the grace period ran out) the threads and the
//! syncer stop and the database commits.
//!
//! Thread-safety: `Server::run` runs on the listener's runtime; everything it shares
//! with the connections is in the `Arc<ServerState>`.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tucana::Database;

use crate::commands::command_count;
use crate::config::ServerConfig;
use crate::connection::serve_accepted;
use crate::metrics::Metrics;
use crate::prometheus::serve_metrics;
use crate::state::{stopped, ServerState};

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
        if let Some(cluster) = &state.cluster {
            cluster.start(shutdown.clone());
            if let Some(replication) = &state.replication {
                let reporting =
                    crate::in_sync::report(cluster.clone(), replication.clone(), shutdown.clone());
                cluster.add_task(tokio::spawn(reporting));
            }
            tokio::spawn(crate::migration::run(state.clone(), shutdown.clone()));
            tokio::spawn(crate::splitter::run(state.clone(), shutdown.clone()));
            tokio::spawn(crate::fail_stop::run(state.clone(), shutdown.clone()));
        }
        // Ends by itself at shutdown; not in `tasks`, which holds the connections.
        if state.config.active_expiry {
            tokio::spawn(crate::sweeper::run(state.clone(), shutdown.clone()));
        }
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
        if let Some(cluster) = &state.cluster {
            cluster.stopped(Duration::from_secs(2)).await;
        }
        // Every connection has ended: the threads have nothing left to run, and nobody
        // waits for a sync.
        let stopping = state.clone();
        let _ = tokio::task::spawn_blocking(move || {
            threads.stop();
            if let Some(syncer) = &stopping.syncer {
                syncer.stop();
            }
            if let Some(replication) = &stopping.replication {
                replication.stop();
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
    if metrics.connected_clients() >= state.settings.max_clients() {
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
            // A write past the process's file size limit (`ulimit -f`) then fails with
            // EFBIG, which poisons the store like any refused write (and, in a cluster,
            // hands its regions over: `fail_stop`), instead of SIGXFSZ killing the process
            // with every buffered write lost.
            let mut file_too_large = signal(SignalKind::from_raw(libc::SIGXFSZ))?;
            tokio::spawn(async move {
                while file_too_large.recv().await.is_some() {
                    eprintln!("tucana serve: a write went past the file size limit (SIGXFSZ)");
                }
            });
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
