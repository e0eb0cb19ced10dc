//! The coordinator election, through etcd's election API: every server may campaign with
//! its lease; the candidate whose key was created first leads; the others wait in line.
//!
//! Owns: campaigning, the leader's handle (`Leadership`), asking who leads, and observing
//! leaders in turn. Does not own what the coordinator does.
//!
//! Threads: async; a `Leadership` is a plain value (its key and creation revision), so
//! holding one proves nothing by itself: writes that must come from the leader carry it
//! into the transaction (`Store::update_map_as`).

use etcd_client::{Client, LeaderKey, ObserveStream, ResignOptions};

use super::Revision;
use crate::error::{Error, Result};
use crate::map::ServerId;

/// Leadership of the coordinator election, won by `Store::campaign`.
pub struct Leadership {
    server: ServerId,
    key: LeaderKey,
    client: Client,
}

impl Leadership {
    pub fn server_id(&self) -> &ServerId {
        &self.server
    }

    /// The etcd key that makes this server the leader (it lives on the server's lease).
    pub fn key(&self) -> &[u8] {
        self.key.key()
    }

    /// The key's creation revision: the leader is the candidate with the lowest.
    pub fn revision(&self) -> Revision {
        Revision(self.key.rev())
    }

    /// Steps down: the next candidate in line leads.
    pub async fn resign(mut self) -> Result<()> {
        let options = ResignOptions::new().with_leader(self.key.clone());
        self.client.resign(Some(options)).await?;
        Ok(())
    }
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("server", &self.server)
            .field("revision", &self.revision())
            .finish()
    }
}

pub(super) async fn campaign(
    mut client: Client,
    name: String,
    server: ServerId,
    lease_id: i64,
) -> Result<Leadership> {
    let mut response = client.campaign(name, server.as_str(), lease_id).await?;
    let key = response.take_leader().ok_or_else(|| Error::Decode {
        what: "etcd's campaign answer".to_owned(),
        detail: "it names no leader key".to_owned(),
    })?;
    Ok(Leadership {
        server,
        key,
        client,
    })
}

pub(super) async fn leader(mut client: Client, name: String) -> Result<Option<ServerId>> {
    match client.leader(name).await {
        Ok(response) => response.kv().map(|kv| leader_id(kv.value())).transpose(),
        // etcd answers an election without candidates with this error (its
        // `ErrElectionNoLeader`), not with an empty answer.
        Err(etcd_client::Error::GRpcStatus(status)) if status.message().contains("no leader") => {
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

pub(super) async fn observe(mut client: Client, name: String) -> Result<LeaderWatch> {
    Ok(LeaderWatch {
        stream: client.observe(name).await?,
    })
}

/// The leaders of the coordinator election, in turn (`Store::observe_leader`).
pub struct LeaderWatch {
    stream: ObserveStream,
}

impl LeaderWatch {
    /// The next leader (the first call: the current one, once there is one); `None` when
    /// etcd closed the stream.
    pub async fn next(&mut self) -> Result<Option<ServerId>> {
        loop {
            let Some(response) = self.stream.message().await? else {
                return Ok(None);
            };
            if let Some(kv) = response.kv() {
                return leader_id(kv.value()).map(Some);
            }
        }
    }
}

fn leader_id(value: &[u8]) -> Result<ServerId> {
    let text = std::str::from_utf8(value).map_err(|e| Error::Decode {
        what: "the coordinator election's leader".to_owned(),
        detail: e.to_string(),
    })?;
    ServerId::parse(text).ok_or_else(|| Error::InvalidServerId(text.to_owned()))
}
