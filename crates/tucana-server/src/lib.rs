//! `tucana serve`: a server that speaks RESP, the Redis protocol, over a Tucana database,
//! so existing Redis clients, `redis-cli` and `redis-benchmark` work against it.
//!
//! Modules, bottom up (each uses only modules above it in this list, so there is no
//! import cycle; DESIGN.md, "The server", follows a request through them):
//! - [`resp`] (the wire format: requests decoded under limits, replies encoded),
//!   [`config`] (`ServerConfig`), `glob` (key patterns), `tls` (the rustls acceptor);
//! - `expiry` (the stored layout of key deadlines), [`types`] (the stored layout of
//!   hashes, sets, sorted sets and lists), `watch` (WATCH's versions of watched keys),
//!   `waiters` (the clients blocked on keys by BLPOP and the other blocking pops),
//!   `pubsub` (Pub/Sub's channels, patterns and each subscriber's bounded queue),
//!   `notify` (keyspace notifications: event classes, their flag string, publishing);
//! - `metrics` (the counters), `settings` (what CONFIG SET changes at run time), `store` (numbered databases → keyspaces, the
//!   per-database write lock, SCAN cursors), `syncer` (sync durability: one thread
//!   syncs for all waiting connections), `outbox` (replies sent together just before a
//!   connection thread sleeps), `busy_poll` (a busy thread polls a little longer before
//!   it sleeps);
//! - `coordinator` (cluster mode: the election and the map's repair after deaths);
//! - `cluster` (cluster mode: the server's id, its registration in etcd, the map it
//!   follows and its regions' keyspaces);
//! - `replication` (this server's keyspaces shipped to backups, others' taken as
//!   replicas: `tucana-replication` started from the configuration);
//! - `cluster_follow` (cluster mode: promotions, terms, fences and backups from each
//!   view of the map; joins `cluster` and `replication`, which know nothing of each
//!   other);
//! - `state` (`ServerState`: what every connection shares), `collector` (deletes the
//!   sub-records of old collection versions), `sweeper` (deletes expired keys in the
//!   background, and runs the collector); cluster mode's tasks: `in_sync` (reports
//!   caught-up backups), `handoff` (planned failover), `migration` and `in_flight`
//!   (slot migration's source side), `splitter` (splits regions grown too large),
//!   `cluster_report` (what `INFO cluster` and `/metrics` say of each region);
//! - `commands` (what each command does; running a pipelined batch);
//! - `connection` (one connection's request loop), `prometheus` (the `/metrics`
//!   endpoint);
//! - [`server`] (listeners, connection threads, shutdown, the entry points).
//!
//! The engine is used only through its public API.
//!
//! ```no_run
//! let db = tucana::Database::open("data.tucana")?;
//! let server = tucana_server::spawn(db, tucana_server::ServerConfig::default())?;
//! println!("listening on {}", server.addr);
//! server.stop()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod busy_poll;
mod cluster;
mod cluster_follow;
mod cluster_report;
mod collector;
mod commands;
pub mod config;
mod connection;
mod coordinator;
mod expiry;
mod fail_stop;
mod glob;
mod handoff;
mod in_flight;
mod in_sync;
mod metrics;
mod migration;
mod notify;
mod outbox;
mod prometheus;
mod pubsub;
mod replication;
pub mod resp;
pub mod server;
mod settings;
mod splitter;
mod state;
mod store;
mod sweeper;
mod syncer;
mod tls;
pub mod types;
mod waiters;
mod watch;

pub use commands::REDIS_COMPAT_VERSION;
pub use config::{
    ClusterConfig, DurabilityMode, ReplicationConfig, ServerConfig, TlsFiles, DEFAULT_PORT,
};
pub use replication::{promote_replicas, replica_info_lines};
pub use resp::{Protocol, Reply, RequestLimits};
pub use server::{serve_until_signal, spawn, RunningServer, Server, ShutdownHandle};
pub use store::keyspace_name;
