//! `CLUSTER` (KEYSLOT, MYID, SLOTS, SHARDS, NODES, INFO, COUNTKEYSINSLOT, GETKEYSINSLOT,
//! FAILOVER: `handoff` does the work),
//! `READONLY` and `READWRITE`: what Redis Cluster clients ask a node to learn the
//! cluster's layout, answered from this server's view of the map kept in etcd.
//!
//! Owns the reply shapes, written from Redis's documentation of each command: CLUSTER
//! SLOTS' `[start, end, [ip, port, id, {}], ...]`, CLUSTER SHARDS' maps of `slots` and
//! `nodes`, CLUSTER NODES' lines (`id ip:port@cport flags master ping pong epoch link
//! slots`), CLUSTER INFO's `field:value` lines. Tucana has no cluster bus, so the bus port
//! is 0 and the ping and pong times are 0. It does not own the view (`cluster`) nor the
//! key listings (`cluster_keys`).
//!
//! Outside cluster mode these commands answer Redis's error for a server whose cluster
//! support is disabled.
//!
//! Thread-safety: handlers read one snapshot of the view each.

use std::fmt::Write as _;

use tucana_cluster::{key_slot, ClusterMap, Region, ServerId, SLOTS};

use crate::cluster::{Cluster, View};
use crate::handoff;
use crate::resp::Reply;

use super::{cluster_keys, parse_i64, Call};

fn disabled() -> Reply {
    Reply::error("ERR This instance has cluster support disabled")
}

/// `READONLY`: the connection accepts reads from backups (none are served yet).
pub(super) fn cmd_readonly(call: &mut Call<'_>, _args: &[Vec<u8>]) -> tucana::Result<Reply> {
    if call.state.cluster.is_none() {
        return Ok(disabled());
    }
    call.session.readonly = true;
    Ok(Reply::Ok)
}

/// `READWRITE`: back to reading only from primaries.
pub(super) fn cmd_readwrite(call: &mut Call<'_>, _args: &[Vec<u8>]) -> tucana::Result<Reply> {
    if call.state.cluster.is_none() {
        return Ok(disabled());
    }
    call.session.readonly = false;
    Ok(Reply::Ok)
}

/// `CLUSTER subcommand [args]`
pub(super) fn cmd_cluster(call: &mut Call<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let Some(cluster) = call.state.cluster.clone() else {
        return Ok(disabled());
    };
    let sub = String::from_utf8_lossy(&args[1]).to_ascii_uppercase();
    let argc = args.len();
    if matches!(sub.as_str(), "SLOTS" | "SHARDS" | "NODES") && cluster.view_may_be_stale() {
        // Clients refresh their slot map from another node on this error.
        return Ok(Reply::error(
            "CLUSTERDOWN this server lost its cluster lease: its view of the slots may be stale",
        ));
    }
    let reply = match (sub.as_str(), argc) {
        ("KEYSLOT", 3) => Reply::Int(i64::from(key_slot(&args[2]))),
        ("MYID", 2) => Reply::bulk(cluster.id.as_str()),
        ("FAILOVER", 2 | 3) => {
            let mode = match args.get(2).map(|a| a.to_ascii_uppercase()) {
                None => Some(handoff::Mode::Planned),
                Some(a) if a == b"FORCE" || a == b"TAKEOVER" => Some(handoff::Mode::Force),
                Some(_) => None,
            };
            match mode {
                None => Reply::error("ERR syntax error"),
                Some(mode) => match handoff::request(&cluster, mode) {
                    Ok(()) => Reply::Ok,
                    Err(e) => Reply::error(e),
                },
            }
        }
        ("SLOTS", 2) => slots(&cluster, &cluster.view()),
        ("SHARDS", 2) => shards(&cluster, &cluster.view()),
        ("NODES", 2) => Reply::bulk(nodes(&cluster, &cluster.view())),
        ("INFO", 2) => Reply::bulk(info(&cluster, &cluster.view())),
        ("COUNTKEYSINSLOT", 3) => match slot_arg(&args[2]) {
            Some(slot) => {
                let keys = cluster_keys::keys_in_slot(call, slot, usize::MAX)?;
                Reply::Int(keys.len() as i64)
            }
            None => Reply::error("ERR Invalid slot"),
        },
        ("GETKEYSINSLOT", 4) => match (slot_arg(&args[2]), parse_i64(&args[3])) {
            (Some(slot), Some(count)) if count >= 0 => {
                let limit = usize::try_from(count).unwrap_or(usize::MAX);
                let keys = cluster_keys::keys_in_slot(call, slot, limit)?;
                Reply::Array(keys.into_iter().map(Reply::Bulk).collect())
            }
            _ => Reply::error("ERR Invalid slot or number of keys"),
        },
        (
            "KEYSLOT" | "MYID" | "SLOTS" | "SHARDS" | "NODES" | "INFO" | "COUNTKEYSINSLOT"
            | "GETKEYSINSLOT",
            _,
        ) => Reply::error(format!(
            "ERR wrong number of arguments for 'cluster|{}' command",
            sub.to_ascii_lowercase()
        )),
        _ => Reply::error(format!(
            "ERR unknown subcommand '{}'. Try CLUSTER HELP.",
            super::printable(&args[1], 64)
        )),
    };
    Ok(reply)
}

fn slot_arg(arg: &[u8]) -> Option<u16> {
    parse_i64(arg)
        .filter(|n| (0..i64::from(SLOTS)).contains(n))
        .map(|n| n as u16)
}

/// `host:port` split at its last colon (an address without one has port 0).
fn split_addr(addr: &str) -> (&str, i64) {
    match addr.rsplit_once(':') {
        Some((host, port)) => (
            host.trim_start_matches('[').trim_end_matches(']'),
            port.parse().unwrap_or(0),
        ),
        None => (addr, 0),
    }
}

/// The servers of a region, primary first.
fn members(region: &Region) -> impl Iterator<Item = &ServerId> {
    std::iter::once(&region.primary).chain(&region.backups)
}

fn address_of<'v>(view: &'v View, id: &ServerId) -> &'v str {
    view.client_addr(id).unwrap_or("")
}

/// `CLUSTER SLOTS`: per region, its range and its servers (primary first), each as
/// `[ip, port, id, {metadata}]`.
fn slots(_cluster: &Cluster, view: &View) -> Reply {
    let Some(map) = &view.map else {
        return Reply::Array(Vec::new());
    };
    let ranges = map
        .regions
        .iter()
        .map(|region| {
            let mut entry = vec![
                Reply::Int(i64::from(region.slots.start)),
                Reply::Int(i64::from(region.slots.end)),
            ];
            for id in members(region) {
                let (ip, port) = split_addr(address_of(view, id));
                entry.push(Reply::Array(vec![
                    Reply::bulk(ip),
                    Reply::Int(port),
                    Reply::bulk(id.as_str()),
                    Reply::Map(Vec::new()),
                ]));
            }
            Reply::Array(entry)
        })
        .collect();
    Reply::Array(ranges)
}

fn status(text: &str) -> Reply {
    Reply::bulk(text)
}

/// `CLUSTER SHARDS`: one map per region (a shard): its `slots` as start and end
/// integers, and its `nodes` (`health`: `online`, `failed` when its lease is gone, or
/// `loading` for a backup not yet in sync).
fn shards(_cluster: &Cluster, view: &View) -> Reply {
    let Some(map) = &view.map else {
        return Reply::Array(Vec::new());
    };
    let shards = map
        .regions
        .iter()
        .map(|region| {
            let nodes = members(region)
                .map(|id| {
                    let addr = address_of(view, id);
                    let (ip, port) = split_addr(addr);
                    let role = if *id == region.primary {
                        "master"
                    } else {
                        "replica"
                    };
                    // Redis's `loading` is a replica still syncing: here, a backup
                    // its primary has not reported in sync (it may not be promoted).
                    let health = if !view.live.contains(id) {
                        "failed"
                    } else if *id != region.primary && !region.in_sync.contains(id) {
                        "loading"
                    } else {
                        "online"
                    };
                    Reply::Map(vec![
                        (status("id"), Reply::bulk(id.as_str())),
                        (status("port"), Reply::Int(port)),
                        (status("ip"), Reply::bulk(ip)),
                        (status("endpoint"), Reply::bulk(ip)),
                        (status("role"), Reply::bulk(role)),
                        (status("replication-offset"), Reply::Int(0)),
                        (status("health"), Reply::bulk(health)),
                    ])
                })
                .collect();
            Reply::Map(vec![
                (
                    status("slots"),
                    Reply::Array(vec![
                        Reply::Int(i64::from(region.slots.start)),
                        Reply::Int(i64::from(region.slots.end)),
                    ]),
                ),
                (status("nodes"), Reply::Array(nodes)),
            ])
        })
        .collect();
    Reply::Array(shards)
}

/// Every server the map names or that is registered, in id order.
fn known_servers(view: &View) -> Vec<ServerId> {
    let mut ids: Vec<ServerId> = view.live.iter().cloned().collect();
    if let Some(map) = &view.map {
        ids.extend(map.regions.iter().flat_map(|r| members(r).cloned()));
    }
    ids.sort();
    ids.dedup();
    ids
}

/// The highest epoch of the regions `id` is primary of (0: none).
fn epoch_of(map: Option<&ClusterMap>, id: &ServerId) -> u64 {
    map.map_or(0, |m| {
        m.regions_led_by(id).map(|r| r.epoch).max().unwrap_or(0)
    })
}

/// `CLUSTER NODES`: one line per known server.
fn nodes(cluster: &Cluster, view: &View) -> String {
    let map = view.map.as_ref();
    let mut out = String::new();
    for id in known_servers(view) {
        let (ip, port) = split_addr(address_of(view, &id));
        let primary_of = map.map(|m| m.regions_led_by(&id).collect::<Vec<_>>());
        // NODES gives a server one role: one that leads a region is a master (even if it
        // also backs another region), one that only backs is a slave of the first
        // region's primary it backs.
        let leads = primary_of.as_ref().is_some_and(|p| !p.is_empty());
        let backup_of = map
            .and_then(|m| m.regions.iter().find(|r| r.backups.contains(&id)))
            .filter(|_| !leads);
        let mut flags = Vec::new();
        if id == cluster.id {
            flags.push("myself");
        }
        flags.push(if backup_of.is_some() {
            "slave"
        } else {
            "master"
        });
        if !view.live.contains(&id) {
            flags.push("fail");
        }
        let master = backup_of.map_or("-".to_owned(), |r| r.primary.to_string());
        let link = if view.live.contains(&id) {
            "connected"
        } else {
            "disconnected"
        };
        let _ = write!(
            out,
            "{id} {ip}:{port}@0 {} {master} 0 0 {} {link}",
            flags.join(","),
            epoch_of(map, &id)
        );
        for region in primary_of.unwrap_or_default() {
            if region.slots.start == region.slots.end {
                let _ = write!(out, " {}", region.slots.start);
            } else {
                let _ = write!(out, " {}-{}", region.slots.start, region.slots.end);
            }
        }
        if id == cluster.id {
            if let Some(map) = map {
                migration_markers(map, &id, &mut out);
            }
        }
        out.push('\n');
    }
    out
}

/// Redis's markers of slots under migration, on this server's own line: `[slot->-id]`
/// for each slot it is moving to server `id`, `[slot-<-id]` for each it imports from
/// `id` (a split within one server has none: Redis has no such state).
fn migration_markers(map: &ClusterMap, me: &ServerId, out: &mut String) {
    for m in &map.migrations {
        let Some(source) = map.region(m.source) else {
            continue;
        };
        let (target, slots) = (&m.target.primary, m.target.slots);
        if source.primary == *target {
            continue;
        }
        for slot in slots.start..=slots.end {
            if source.primary == *me {
                let _ = write!(out, " [{slot}->-{target}]");
            } else if target == me {
                let _ = write!(out, " [{slot}-<-{}]", source.primary);
            }
        }
    }
}

/// `CLUSTER INFO`: the cluster is `ok` when every slot is in a region whose primary is
/// live (Redis's default, full coverage required).
fn info(cluster: &Cluster, view: &View) -> String {
    let map = view.map.as_ref();
    let regions = map.map_or(&[][..], |m| m.regions.as_slice());
    let assigned: u32 = regions.iter().map(|r| r.slots.len()).sum();
    let ok: u32 = regions
        .iter()
        .filter(|r| view.live.contains(&r.primary))
        .map(|r| r.slots.len())
        .sum();
    let state = if ok == u32::from(SLOTS) { "ok" } else { "fail" };
    let mut primaries: Vec<&ServerId> = regions.iter().map(|r| &r.primary).collect();
    primaries.sort();
    primaries.dedup();
    let lines = [
        ("cluster_state", state.to_owned()),
        ("cluster_slots_assigned", assigned.to_string()),
        ("cluster_slots_ok", ok.to_string()),
        ("cluster_slots_pfail", "0".to_owned()),
        ("cluster_slots_fail", (assigned - ok).to_string()),
        ("cluster_known_nodes", known_servers(view).len().to_string()),
        ("cluster_size", primaries.len().to_string()),
        (
            "cluster_current_epoch",
            map.map_or(0, |m| m.config_epoch).to_string(),
        ),
        ("cluster_my_epoch", epoch_of(map, &cluster.id).to_string()),
        ("cluster_stats_messages_sent", "0".to_owned()),
        ("cluster_stats_messages_received", "0".to_owned()),
        ("total_cluster_links_buffer_limit_exceeded", "0".to_owned()),
        // Tucana's own: whether this server is registered with a valid lease (only then
        // does it acknowledge writes; a restarted server leaves the in-sync lists first).
        (
            "tucana_lease_valid",
            u8::from(cluster.lease_valid()).to_string(),
        ),
    ];
    let mut out = String::new();
    for (name, value) in lines {
        let _ = write!(out, "{name}:{value}\r\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_split_at_the_last_colon() {
        assert_eq!(split_addr("127.0.0.1:7000"), ("127.0.0.1", 7000));
        assert_eq!(split_addr("[::1]:7000"), ("::1", 7000));
        assert_eq!(split_addr("host"), ("host", 0));
    }
}
