//! A server's registration: its key under an etcd lease, and the task that keeps the lease
//! alive and tells how long it is sure to last.
//!
//! Owns: the keepalive loop and the lease's status (`LeaseStatus`): the last confirmed
//! deadline, whether keepalives are succeeding, whether the lease is lost for good. Does
//! not own what a server does when its lease runs out (the server's fencing, later).
//!
//! Threads: the keepalive runs in a tokio task; the status is published through a
//! `tokio::sync::watch` channel, readable from any thread.
//!
//! The deadline. etcd expires a lease `ttl` after the keepalive that renewed it *arrived*;
//! the deadline here is `ttl` after that keepalive was *sent*, by this process's monotonic
//! clock, so delays in the network or in etcd only make it earlier than etcd's. A holder
//! that acts only before `deadline - margin` (`LeaseStatus::valid_at`) has `margin` to
//! cover the two clocks running at different rates.

use std::time::{Duration, Instant};

use etcd_client::{Client, LeaseKeepAliveStream, LeaseKeeper};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::error::Result;
use crate::map::ServerId;

/// What the keepalive task knows of the lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseStatus {
    /// The lease is alive at least until then (see the module doc).
    pub deadline: Instant,
    /// The last keepalive round trip succeeded.
    pub keepalive_ok: bool,
    /// etcd said the lease is gone (revoked or expired): it will never be valid again.
    /// Past the deadline with no renewal the lease is not valid (`valid_at`) but not lost:
    /// the keepalive goes on, and if etcd still has the lease (it was down and restarted,
    /// extending every lease it held) the holder is valid again with nothing done
    /// meanwhile (nobody could have taken its place: its key was never gone).
    pub lost: bool,
}

impl LeaseStatus {
    /// Whether the holder may act on the lease at `now`, stopping `margin` before the
    /// deadline.
    pub fn valid_at(&self, now: Instant, margin: Duration) -> bool {
        !self.lost && now.checked_add(margin).is_some_and(|t| t < self.deadline)
    }
}

/// A registered server; its lease is kept alive until `revoke`, or until it is dropped
/// (then etcd expires the lease, and so the server's key, one time to live later).
pub struct Registration {
    server: ServerId,
    lease_id: i64,
    lease_ttl: Duration,
    status: watch::Receiver<LeaseStatus>,
    keeper: JoinHandle<()>,
    client: Client,
}

impl Registration {
    pub(super) fn start(
        client: Client,
        server: ServerId,
        lease_id: i64,
        lease_ttl: Duration,
        deadline: Instant,
    ) -> Registration {
        let (sender, status) = watch::channel(LeaseStatus {
            deadline,
            keepalive_ok: true,
            lost: false,
        });
        let keeper = tokio::spawn(keep_alive(client.clone(), lease_id, lease_ttl, sender));
        Registration {
            server,
            lease_id,
            lease_ttl,
            status,
            keeper,
            client,
        }
    }

    pub fn server_id(&self) -> &ServerId {
        &self.server
    }

    /// etcd's id of the lease.
    pub fn lease_id(&self) -> i64 {
        self.lease_id
    }

    /// The time to live etcd granted.
    pub fn lease_ttl(&self) -> Duration {
        self.lease_ttl
    }

    pub fn status(&self) -> LeaseStatus {
        *self.status.borrow()
    }

    /// Whether the lease is valid now with `margin` to spare (`LeaseStatus::valid_at`).
    pub fn is_valid(&self, margin: Duration) -> bool {
        self.status().valid_at(Instant::now(), margin)
    }

    /// A receiver that wakes on every change of the status.
    pub fn subscribe(&self) -> watch::Receiver<LeaseStatus> {
        self.status.clone()
    }

    /// Waits until the lease is lost.
    pub async fn lost(&self) {
        let mut status = self.status.clone();
        // The sender lives as long as the keepalive task, which ends only after marking the
        // lease lost or when `self` is dropped: an error here cannot be seen.
        let _ = status.wait_for(|s| s.lost).await;
    }

    /// Stops the keepalive and revokes the lease: the server's key goes at once, and
    /// with it any election candidacy on the lease.
    pub async fn revoke(mut self) -> Result<()> {
        self.keeper.abort();
        self.client.lease_revoke(self.lease_id).await?;
        Ok(())
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

/// What one keepalive attempt learned.
enum Renewal {
    /// etcd renewed the lease for this long.
    Renewed(Duration),
    /// etcd has no such lease any more.
    Gone,
}

/// The keepalive loop: a renewal every third of the time to live; after a failure, a new
/// stream and a retry every quarter second, past the deadline too, until etcd renews the
/// lease or says it is gone.
///
/// Before, the lease was given up locally once the deadline passed: after etcd was
/// restarted (which keeps leases alive), every server re-registered, each waiting for its
/// old key to expire first, and the coordinator, seeing those keys go, failed over
/// regions of servers that had never died (the fault campaign, M10).
async fn keep_alive(
    mut client: Client,
    lease_id: i64,
    lease_ttl: Duration,
    status: watch::Sender<LeaseStatus>,
) {
    let period = (lease_ttl / 3).max(Duration::from_millis(100));
    let retry = period.min(Duration::from_millis(250));
    let mut stream = None;
    loop {
        tokio::time::sleep(period).await;
        loop {
            let deadline = status.borrow().deadline;
            let sent = Instant::now();
            // Before the deadline, an attempt may not outlast it (the status must say
            // invalid in time); past it, a period.
            let patience = match deadline.checked_duration_since(sent) {
                Some(left) if !left.is_zero() => period.min(left),
                _ => period,
            };
            let attempt = renew(&mut client, lease_id, lease_ttl, &mut stream);
            match tokio::time::timeout(patience, attempt).await {
                Ok(Ok(Renewal::Renewed(ttl))) => {
                    status.send_modify(|s| {
                        s.deadline = s.deadline.max(sent + ttl);
                        s.keepalive_ok = true;
                    });
                    break;
                }
                Ok(Ok(Renewal::Gone)) => {
                    status.send_modify(|s| {
                        s.keepalive_ok = false;
                        s.lost = true;
                    });
                    return;
                }
                Ok(Err(_)) | Err(_) => {
                    stream = None;
                    status.send_modify(|s| s.keepalive_ok = false);
                    tokio::time::sleep(retry).await;
                }
            }
        }
    }
}

/// One keepalive round trip, on the open stream or a new one.
async fn renew(
    client: &mut Client,
    lease_id: i64,
    lease_ttl: Duration,
    stream: &mut Option<(LeaseKeeper, LeaseKeepAliveStream)>,
) -> Result<Renewal> {
    let Some((keeper, responses)) = stream else {
        // Opening a stream sends the first keepalive and reads its answer.
        return match client.lease_keep_alive(lease_id).await {
            Ok(opened) => {
                *stream = Some(opened);
                Ok(Renewal::Renewed(lease_ttl))
            }
            // It fails on a lease etcd does not have, but also on a broken connection:
            // ask which (an unknown lease's time to live is -1).
            Err(e) => match client.lease_time_to_live(lease_id, None).await {
                Ok(ttl) if ttl.ttl() < 0 => Ok(Renewal::Gone),
                _ => Err(e.into()),
            },
        };
    };
    keeper.keep_alive().await?;
    match responses.message().await? {
        Some(response) if response.ttl() > 0 => {
            Ok(Renewal::Renewed(Duration::from_secs(response.ttl() as u64)))
        }
        Some(_) => Ok(Renewal::Gone),
        None => Err(etcd_client::Error::LeaseKeepAliveError(
            "etcd closed the keepalive stream".to_owned(),
        )
        .into()),
    }
}
