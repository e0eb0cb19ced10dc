//! `tucana serve`: a server that speaks RESP, the Redis protocol, over a Tucana database,
//! so existing Redis clients, `redis-cli` and `redis-benchmark` work against it.
//!
//! Layers, bottom up: [`resp`] (wire format, limits), `glob` (key patterns), `store`
//! (numbered databases → keyspaces, the per-keyspace write lock, SCAN cursors),
//! `commands` (what each command does), `metrics` (INFO and Prometheus), `outbox` (replies
//! sent just before a connection thread sleeps), `busy_poll` (a busy thread polls a
//! little longer before it sleeps), `syncer` (sync durability: one thread syncs for all
//! waiting connections), [`server`] (sockets, connections, shutdown), `tls` (optional TLS with rustls). The engine is used only through its public API.
//!
//! ```no_run
//! let db = tucana::Database::open("data.tucana")?;
//! let server = tucana_server::spawn(db, tucana_server::ServerConfig::default())?;
//! println!("listening on {}", server.addr);
//! server.stop()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod busy_poll;
mod commands;
pub mod config;
mod connection;
mod glob;
mod metrics;
mod outbox;
mod prometheus;
pub mod resp;
pub mod server;
mod state;
mod store;
mod syncer;
mod tls;

pub use commands::REDIS_COMPAT_VERSION;
pub use config::{DurabilityMode, ServerConfig, TlsFiles, DEFAULT_PORT};
pub use resp::{Protocol, Reply, RequestLimits};
pub use server::{serve_until_signal, spawn, RunningServer, Server, ShutdownHandle};
pub use store::keyspace_name;
