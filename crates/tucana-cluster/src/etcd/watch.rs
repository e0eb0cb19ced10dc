//! Watches of the map and of the server list, as typed events.
//!
//! Owns: turning etcd watch responses into `MapEvent`s and `ServerEvent`s, decoding and
//! validating what they carry. Does not own what a watcher does with them.
//!
//! Threads: a watch is one stream, read by one task (`&mut self`).
//!
//! A watch that starts after a revision etcd has compacted away, or that etcd cancels,
//! ends with `Error::WatchCanceled`: the watcher reads the state again (`Store::map`,
//! `Store::servers`) and watches from there.

use std::collections::VecDeque;

use etcd_client::{Client, Event, WatchOptions, WatchStream};

use super::Revision;
use crate::error::{Error, Result};
use crate::map::{ClusterMap, ServerId, ServerInfo};

/// A change of the map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MapEvent {
    /// The map is now `map`, written at `revision`.
    Updated { map: ClusterMap, revision: Revision },
    /// The map key was deleted (only by hand: the cluster never deletes it).
    Deleted { revision: Revision },
}

/// A server coming or going.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerEvent {
    /// Registered (or its information rewritten).
    Up {
        info: ServerInfo,
        revision: Revision,
    },
    /// Its key is gone: the lease was revoked or expired.
    Down { id: ServerId, revision: Revision },
}

/// The raw events of one etcd watch, one at a time.
struct Events {
    stream: WatchStream,
    pending: VecDeque<Event>,
}

impl Events {
    async fn start(
        mut client: Client,
        key: String,
        prefix: bool,
        after: Option<Revision>,
    ) -> Result<Events> {
        let mut options = WatchOptions::new();
        if prefix {
            options = options.with_prefix();
        }
        if let Some(after) = after {
            options = options.with_start_revision(after.0 + 1);
        }
        let stream = client.watch(key, Some(options)).await?;
        Ok(Events {
            stream,
            pending: VecDeque::new(),
        })
    }

    async fn next(&mut self) -> Result<Option<Event>> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Ok(Some(event));
            }
            let Some(response) = self.stream.message().await? else {
                return Ok(None);
            };
            if response.canceled() {
                let mut reason = response.cancel_reason().to_owned();
                if response.compact_revision() > 0 {
                    reason += &format!(
                        " (compacted up to revision {})",
                        response.compact_revision()
                    );
                }
                return Err(Error::WatchCanceled { reason });
            }
            self.pending.extend(response.events().iter().cloned());
        }
    }
}

/// An event's key, value and revision, and whether it deletes the key. A deletion is
/// told by its version, which etcd resets to 0 on delete (`Event::event_type` would
/// panic on an event type it does not know; bytes from the network must not).
fn parts(event: &Event) -> Result<(&[u8], &[u8], Revision, bool)> {
    let kv = event.kv().ok_or_else(|| Error::Decode {
        what: "an etcd watch event".to_owned(),
        detail: "it carries no key".to_owned(),
    })?;
    Ok((
        kv.key(),
        kv.value(),
        Revision(kv.mod_revision()),
        kv.version() == 0,
    ))
}

pub(super) async fn watch_map(
    client: Client,
    key: String,
    after: Option<Revision>,
) -> Result<MapWatch> {
    Ok(MapWatch {
        events: Events::start(client, key, false, after).await?,
    })
}

/// The map's changes (`Store::watch_map`).
pub struct MapWatch {
    events: Events,
}

impl MapWatch {
    /// The next change; `None` when etcd closed the stream.
    pub async fn next(&mut self) -> Result<Option<MapEvent>> {
        let Some(event) = self.events.next().await? else {
            return Ok(None);
        };
        let (_, value, revision, deleted) = parts(&event)?;
        if deleted {
            return Ok(Some(MapEvent::Deleted { revision }));
        }
        let map = ClusterMap::decode(value, &format!("etcd key map at revision {revision}"))?;
        Ok(Some(MapEvent::Updated { map, revision }))
    }
}

pub(super) async fn watch_servers(
    client: Client,
    prefix: String,
    after: Option<Revision>,
) -> Result<ServerWatch> {
    Ok(ServerWatch {
        events: Events::start(client, prefix.clone(), true, after).await?,
        prefix,
    })
}

/// Servers coming and going (`Store::watch_servers`).
pub struct ServerWatch {
    events: Events,
    prefix: String,
}

impl ServerWatch {
    /// The next server event; `None` when etcd closed the stream.
    pub async fn next(&mut self) -> Result<Option<ServerEvent>> {
        let Some(event) = self.events.next().await? else {
            return Ok(None);
        };
        let (key, value, revision, deleted) = parts(&event)?;
        let id = server_id_of_key(key, &self.prefix)?;
        if deleted {
            return Ok(Some(ServerEvent::Down { id, revision }));
        }
        let info = ServerInfo::decode(value, &format!("etcd key servers/{id}"))?;
        if info.id != id {
            return Err(Error::Decode {
                what: format!("etcd key servers/{id}"),
                detail: format!("it holds server {}", info.id),
            });
        }
        Ok(Some(ServerEvent::Up { info, revision }))
    }
}

/// The server id at the end of a `servers/<id>` key.
pub(super) fn server_id_of_key(key: &[u8], prefix: &str) -> Result<ServerId> {
    let bad = || Error::Decode {
        what: format!("etcd key {}", String::from_utf8_lossy(key)),
        detail: format!("not {prefix}<server id>"),
    };
    let id = key.strip_prefix(prefix.as_bytes()).ok_or_else(bad)?;
    let id = std::str::from_utf8(id).map_err(|_| bad())?;
    ServerId::parse(id).ok_or_else(bad)
}
