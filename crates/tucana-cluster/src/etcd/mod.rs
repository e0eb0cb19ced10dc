//! The cluster's truth, kept in etcd: the live servers, the cluster map and the
//! coordinator's leadership (DESIGN.md, "Cluster").
//!
//! Owns: the key layout, reading and writing the map with compare-and-swap, server
//! registration under leases (`lease`), watches of both (`watch`), and the coordinator
//! election (`election`). Does not own what the map should be (`map`, the coordinator).
//!
//! Keys, under `/tucana/<cluster>/`:
//!
//! | key | value | lifetime |
//! |---|---|---|
//! | `servers/<id>` | the server's `ServerInfo` (JSON) | the server's lease |
//! | `map` | the `ClusterMap` (JSON) | changed only by `create_map` / `update_map` |
//! | `coordinator/<lease>` | a campaigner's server id (etcd's election API) | the campaigner's lease |
//!
//! Threads: `Store` is a cheap `Clone` (it shares etcd-client's channel) and every call is
//! async on tokio; a `Registration` runs its keepalive in a task of the runtime that
//! registered it.

mod election;
mod lease;
mod watch;

use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp};

use crate::error::{Error, Result};
use crate::map::{ClusterMap, ServerId, ServerInfo};

pub use crate::types::Revision;
pub use election::{LeaderWatch, Leadership};
pub use lease::{LeaseStatus, Registration};
pub use watch::{MapEvent, MapWatch, ServerEvent, ServerWatch};

/// The longest lease etcd grants (its `MaxLeaseTTL`, in seconds).
const LEASE_TTL_MAX_SECONDS: u64 = 9_000_000_000;

/// A connection to etcd for one cluster (one key prefix).
#[derive(Clone)]
pub struct Store {
    client: Client,
    prefix: String,
}

impl Store {
    /// Connects to the etcd members at `endpoints` (`http://host:port`) for the cluster
    /// named `cluster` (letters, digits, `-`, `_`, `.`).
    pub async fn connect(endpoints: &[impl AsRef<str>], cluster: &str) -> Result<Store> {
        let name_ok = !cluster.is_empty()
            && cluster
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !name_ok {
            return Err(Error::Refused(format!("bad cluster name {cluster:?}")));
        }
        // HTTP/2 pings find a dead connection even while only a keepalive stream is open.
        // Not more often than every 5 s: etcd's server (--grpc-keepalive-min-time, 5 s by
        // default) answers more frequent pings with GOAWAY, which broke every open watch
        // of a long-running server a few times a minute.
        let options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_keep_alive(Duration::from_secs(6), Duration::from_secs(3))
            .with_keep_alive_while_idle(true);
        let client = Client::connect(endpoints, Some(options)).await?;
        Ok(Store {
            client,
            prefix: format!("/tucana/{cluster}/"),
        })
    }

    fn key(&self, suffix: &str) -> String {
        format!("{}{suffix}", self.prefix)
    }

    fn map_key(&self) -> String {
        self.key("map")
    }

    fn servers_prefix(&self) -> String {
        self.key("servers/")
    }

    fn election_name(&self) -> String {
        self.key("coordinator")
    }

    /// The live servers (those whose lease holds), and the revision they were read at
    /// (give it to `watch_servers` to miss no change after it).
    pub async fn servers(&self) -> Result<(Vec<ServerInfo>, Revision)> {
        let prefix = self.servers_prefix();
        let response = self
            .client
            .clone()
            .get(prefix.as_str(), Some(GetOptions::new().with_prefix()))
            .await?;
        let revision = header_revision(response.header())?;
        let mut servers = Vec::with_capacity(response.kvs().len());
        for kv in response.kvs() {
            let id = watch::server_id_of_key(kv.key(), &prefix)?;
            let info = ServerInfo::decode(kv.value(), &format!("etcd key servers/{id}"))?;
            if info.id != id {
                return Err(Error::Decode {
                    what: format!("etcd key servers/{id}"),
                    detail: format!("it holds server {}", info.id),
                });
            }
            servers.push(info);
        }
        Ok((servers, revision))
    }

    /// The map and the revision of its last change, or `None` before `create_map`.
    pub async fn map(&self) -> Result<Option<(ClusterMap, Revision)>> {
        let response = self.client.clone().get(self.map_key(), None).await?;
        let Some(kv) = response.kvs().first() else {
            return Ok(None);
        };
        let map = ClusterMap::decode(kv.value(), "etcd key map")?;
        Ok(Some((map, Revision(kv.mod_revision()))))
    }

    /// Stores the first map; refused (`MapExists`) if there is one.
    pub async fn create_map(&self, map: &ClusterMap) -> Result<Revision> {
        map.validate()?;
        let key = self.map_key();
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.as_str(), map.encode(), None)]);
        let response = self.client.clone().txn(txn).await?;
        if response.succeeded() {
            return header_revision(response.header());
        }
        match self.map_revision().await? {
            Some(current) => Err(Error::MapExists { current }),
            // Deleted meanwhile (only by hand): the caller may try again.
            None => Err(Error::Conflict {
                expected: Revision(0),
                current: None,
            }),
        }
    }

    /// Replaces the map if it is still at `expected` (the revision `map` returned): a
    /// compare-and-swap on the key's `mod_revision`. Returns the new revision; if the map
    /// changed meanwhile, `Conflict` with its current revision (read it again, redo the
    /// change).
    pub async fn update_map(&self, expected: Revision, map: &ClusterMap) -> Result<Revision> {
        self.swap_map(expected, map, None).await
    }

    /// `update_map`, and only while `leader` still leads the coordinator election (its
    /// election key exists at its creation revision): a coordinator that lost its lease
    /// while paused cannot write a map from before (`NotLeader`).
    pub async fn update_map_as(
        &self,
        leader: &Leadership,
        expected: Revision,
        map: &ClusterMap,
    ) -> Result<Revision> {
        self.swap_map(expected, map, Some(leader)).await
    }

    async fn swap_map(
        &self,
        expected: Revision,
        map: &ClusterMap,
        leader: Option<&Leadership>,
    ) -> Result<Revision> {
        map.validate()?;
        let key = self.map_key();
        let mut compares = vec![Compare::mod_revision(
            key.as_str(),
            CompareOp::Equal,
            expected.0,
        )];
        if let Some(leader) = leader {
            compares.push(Compare::create_revision(
                leader.key(),
                CompareOp::Equal,
                leader.revision().0,
            ));
        }
        let txn =
            Txn::new()
                .when(compares)
                .and_then([TxnOp::put(key.as_str(), map.encode(), None)]);
        let response = self.client.clone().txn(txn).await?;
        if response.succeeded() {
            return header_revision(response.header());
        }
        let current = self.map_revision().await?;
        match leader {
            Some(leader) if current == Some(expected) => Err(Error::NotLeader {
                server: leader.server_id().clone(),
            }),
            _ => Err(Error::Conflict { expected, current }),
        }
    }

    async fn map_revision(&self) -> Result<Option<Revision>> {
        let options = GetOptions::new().with_keys_only();
        let response = self
            .client
            .clone()
            .get(self.map_key(), Some(options))
            .await?;
        Ok(response.kvs().first().map(|kv| Revision(kv.mod_revision())))
    }

    /// Registers a live server: grants a lease of `lease_ttl` (whole seconds, rounded
    /// up), puts `servers/<id>` under it, and keeps it alive until the `Registration` is
    /// revoked or dropped. Refused (`AlreadyRegistered`) while a key for the same id
    /// exists: a restarted server waits for its old lease to expire.
    pub async fn register(&self, info: &ServerInfo, lease_ttl: Duration) -> Result<Registration> {
        let seconds = lease_ttl.as_secs() + u64::from(lease_ttl.subsec_nanos() > 0);
        if !(1..=LEASE_TTL_MAX_SECONDS).contains(&seconds) {
            return Err(Error::InvalidLeaseTtl {
                lease_ttl,
                max_seconds: LEASE_TTL_MAX_SECONDS,
            });
        }
        let mut client = self.client.clone();
        // The lease is valid at least until `sent + ttl`: etcd starts its clock later.
        let sent = Instant::now();
        let grant = client.lease_grant(seconds as i64, None).await?;
        let granted = Duration::from_secs(grant.ttl().max(0) as u64);
        let key = self.key(&format!("servers/{}", info.id));
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.as_str(),
                info.encode(),
                Some(PutOptions::new().with_lease(grant.id())),
            )]);
        let registered = client.txn(txn).await.map(|r| r.succeeded());
        if !matches!(registered, Ok(true)) {
            // Best effort: unrevoked, the lease expires by itself.
            let _ = client.lease_revoke(grant.id()).await;
            registered?;
            return Err(Error::AlreadyRegistered(info.id.clone()));
        }
        Ok(Registration::start(
            client,
            info.id.clone(),
            grant.id(),
            granted,
            sent + granted,
        ))
    }

    /// Campaigns in the coordinator election for `registration`'s server, on its lease:
    /// waits until it leads (so run it in a task of its own). Leadership ends with
    /// `Leadership::resign` or with the lease.
    pub async fn campaign(&self, registration: &Registration) -> Result<Leadership> {
        election::campaign(
            self.client.clone(),
            self.election_name(),
            registration.server_id().clone(),
            registration.lease_id(),
        )
        .await
    }

    /// The server leading the coordinator election, if any.
    pub async fn leader(&self) -> Result<Option<ServerId>> {
        election::leader(self.client.clone(), self.election_name()).await
    }

    /// Each leader of the coordinator election in turn, the current one first.
    pub async fn observe_leader(&self) -> Result<LeaderWatch> {
        election::observe(self.client.clone(), self.election_name()).await
    }

    /// The map's changes after revision `after` (`None`: from now on).
    pub async fn watch_map(&self, after: Option<Revision>) -> Result<MapWatch> {
        watch::watch_map(self.client.clone(), self.map_key(), after).await
    }

    /// Servers coming and going after revision `after` (`None`: from now on).
    pub async fn watch_servers(&self, after: Option<Revision>) -> Result<ServerWatch> {
        watch::watch_servers(self.client.clone(), self.servers_prefix(), after).await
    }
}

fn header_revision(header: Option<&etcd_client::ResponseHeader>) -> Result<Revision> {
    header
        .map(|h| Revision(h.revision()))
        .ok_or_else(|| Error::Decode {
            what: "an etcd response".to_owned(),
            detail: "it has no header".to_owned(),
        })
}
