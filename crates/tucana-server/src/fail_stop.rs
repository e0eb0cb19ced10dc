//! Fail-stop in cluster mode: a server whose store failed leaves the cluster.
//!
//! Owns: watching the store for a failure that poisoned it (a log append, segment write,
//! sync or commit the device refused: disk full, a file size limit, an I/O error; the
//! store then acknowledges nothing more) and, when one comes, shutting the server down.
//! The shutdown revokes the server's lease in etcd (`cluster::stay_registered`), so the
//! coordinator promotes a backup of each region it led at once; the process then exits
//! with the store's error (the final commit refuses a poisoned store). Without this, a
//! poisoned server kept renewing its lease: its regions neither took writes nor failed
//! over until someone restarted it by hand.
//!
//! Does not own the shutdown (`server`), the lease (`cluster`) or the failover
//! (`coordinator`). A single server (no cluster) keeps serving reads when poisoned, with
//! every write refused: there is nobody to hand its data to.
//!
//! Thread-safety: one task on the listener's runtime; it reads the store's poisoned
//! flag (an atomic) and sends on the shutdown channel.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::state::{stopped, ServerState};

/// How often the store's poisoned flag is read: a failed store is out of the cluster
/// within this, plus the time etcd takes to revoke a lease.
const CHECK_EVERY: Duration = Duration::from_millis(50);

/// Ends the server once its store is poisoned, or returns at shutdown.
pub async fn run(state: Arc<ServerState>, mut shutdown: watch::Receiver<bool>) {
    let mut ticks = tokio::time::interval(CHECK_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stopped(&mut shutdown) => return,
        }
        if state.store.db.is_poisoned() {
            eprintln!(
                "tucana serve: the store failed (a write or sync the device refused; \
                 earlier messages say which) and acknowledges nothing more: leaving the \
                 cluster so that its regions fail over, and exiting"
            );
            state.shutdown.send_replace(true);
            return;
        }
    }
}
