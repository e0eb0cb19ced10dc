//! Primary-backup replication of Tucana regions (Talos, adapted; DESIGN.md "Replication"):
//! a primary ships each replicated keyspace's log to its backups as it is appended and,
//! after each commit, the index nodes the commit wrote; a backup stores both, rewriting
//! the nodes' pointers into its own volume, and never builds an index of its own.
//!
//! Files: `frame` (the messages and their codec), `transport` (TCP or TLS connections,
//! frame I/O), `primary` (links to the backups, shipping, the acknowledgement board),
//! `backup` (taking a primary's stream into replica regions, or the build-index
//! baseline). The engine is reached only through `tucana::replication`.
//!
//! Threads: each side runs a small tokio runtime of its own; engine calls that block
//! (applying a commit, a sync) run on its blocking pool. Writers wait for acknowledgements
//! from any thread (`Primary::wait_acked`).

pub mod backup;
pub mod frame;
pub mod primary;
pub mod transport;

pub use backup::{Backup, BackupConfig, BackupCounters};
pub use primary::{AckError, BackupStatus, Primary, PrimaryConfig, RegionStatus};
pub use transport::{Acceptor, Dialer};
