//! `tucana cluster move-slots|split|add-server|remove-server|rebalance`: an operator's
//! online changes of which server leads which slots (issue 19; DESIGN.md, "Slot
//! migration"). Each is one or more migrations: the map change that begins one (a CAS
//! in etcd, `ClusterMap::begin_migration`), then a wait while the source's primary moves
//! the data and finishes it. Plans (`add-server`, `remove-server`, `rebalance`) take one
//! move at a time from `ClusterMap::next_move` and wait for each; `rebalance` first hands
//! regions over to in-sync backups where that evens leadership out (`balance_leaders`:
//! planned failovers, no data moved).
//!
//! Owns: these subcommands' logic and output. Does not own: the map's rules
//! (`tucana-cluster`), the moving of data (the servers). Runs on the caller's runtime.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use tucana_cluster::{ClusterMap, Error, Move, RegionId, ServerId, SlotRange, Store};

use crate::CliError;

/// How often the map is read while waiting.
const POLL: Duration = Duration::from_millis(200);

fn etcd(what: &'static str) -> impl Fn(Error) -> CliError {
    move |e| CliError::msg(format!("{what}: {e}"))
}

/// The live servers: ids, and the id of the one announcing `addr` if asked.
async fn live(store: &Store) -> Result<(BTreeSet<ServerId>, Vec<(ServerId, String)>), CliError> {
    let (servers, _) = store.servers().await.map_err(etcd("reading servers"))?;
    let ids = servers.iter().map(|s| s.id.clone()).collect();
    let addrs = servers.into_iter().map(|s| (s.id, s.client_addr)).collect();
    Ok((ids, addrs))
}

/// The live server announcing `addr`, waiting up to `wait` for it to register.
pub async fn server_at(store: &Store, addr: &str, wait: Duration) -> Result<ServerId, CliError> {
    let deadline = Instant::now() + wait;
    loop {
        let (_, addrs) = live(store).await?;
        if let Some((id, _)) = addrs.iter().find(|(_, a)| a == addr) {
            return Ok(id.clone());
        }
        if Instant::now() >= deadline {
            return Err(CliError::msg(format!(
                "no live server announces {addr} after {wait:?}"
            )));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Begins a migration (`begin` computes it from the current map and live servers),
/// again after a conflicting write; the new region's id.
async fn begin(
    store: &Store,
    begin: impl Fn(&ClusterMap, &BTreeSet<ServerId>) -> tucana_cluster::Result<(ClusterMap, RegionId)>,
) -> Result<RegionId, CliError> {
    loop {
        let Some((map, revision)) = store.map().await.map_err(etcd("reading the map"))? else {
            return Err(CliError::msg(
                "the cluster has no map (`tucana cluster create`)",
            ));
        };
        let (servers, _) = live(store).await?;
        let (next, id) = begin(&map, &servers).map_err(etcd("beginning the migration"))?;
        match store.update_map(revision, &next).await {
            Ok(_) => return Ok(id),
            Err(Error::Conflict { .. }) => continue,
            Err(e) => return Err(etcd("writing the map")(e)),
        }
    }
}

/// Waits until region `target` is no longer a migration's target (finished), up to `wait`.
async fn wait_finished(store: &Store, target: RegionId, wait: Duration) -> Result<(), CliError> {
    let deadline = Instant::now() + wait;
    loop {
        let map = store.map().await.map_err(etcd("reading the map"))?;
        let running = map
            .as_ref()
            .is_some_and(|(m, _)| m.migrations.iter().any(|x| x.target.id == target));
        if !running {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(CliError::msg(format!(
                "the migration into region {target} still runs after {wait:?}; it goes on (`tucana cluster status`)"
            )));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Moves `slots` of region `source` into a new region led by `to`, with as many
/// backups as the source has (the live servers backing the fewest regions), and waits.
async fn move_slots(
    store: &Store,
    source: RegionId,
    slots: Option<SlotRange>,
    to: &ServerId,
    wait: Duration,
) -> Result<RegionId, CliError> {
    let target = begin(store, |map, servers| {
        let Some(region) = map.regions.iter().find(|r| r.id == source) else {
            return Err(Error::Refused(format!("no region {source}")));
        };
        let slots = slots.unwrap_or(region.slots);
        let backups = map.pick_backups(to, region.backups.len(), servers);
        map.begin_migration(source, slots, to, backups)
    })
    .await?;
    println!("moving slots of region {source} into region {target}");
    wait_finished(store, target, wait).await?;
    println!("region {target} owns them now");
    Ok(target)
}

/// `split REGION [--at SLOT]`: slots `at..` of the region into a new region on the
/// same primary and backups (default: the upper half).
pub async fn split(
    store: &Store,
    source: RegionId,
    at: Option<u16>,
    wait: Duration,
) -> Result<(), CliError> {
    let target = begin(store, |map, _| {
        let Some(region) = map.regions.iter().find(|r| r.id == source) else {
            return Err(Error::Refused(format!("no region {source}")));
        };
        let at = at.unwrap_or(region.slots.start + (region.slots.len() / 2) as u16);
        if at <= region.slots.start || at > region.slots.end {
            return Err(Error::Refused(format!(
                "--at {at} must be in {}..={}",
                region.slots.start + 1,
                region.slots.end
            )));
        }
        map.begin_migration(
            source,
            SlotRange::new(at, region.slots.end),
            &region.primary,
            region.backups.clone(),
        )
    })
    .await?;
    println!("splitting region {source}: its upper part moves into region {target}");
    wait_finished(store, target, wait).await?;
    println!("split done: region {target} owns its slots");
    Ok(())
}

/// `move-slots --from-region R [--slots A-B] --to HOST:PORT`.
pub async fn move_to(
    store: &Store,
    source: RegionId,
    slots: Option<SlotRange>,
    to_addr: &str,
    wait: Duration,
) -> Result<(), CliError> {
    let to = server_at(store, to_addr, Duration::ZERO).await?;
    move_slots(store, source, slots, &to, wait)
        .await
        .map(|_| ())
}

/// Applies `ClusterMap::next_move` for `servers` (computed anew before each move) until
/// it has none; the number of moves made.
pub async fn plan(
    store: &Store,
    servers: impl Fn(&BTreeSet<ServerId>) -> BTreeSet<ServerId>,
    wait: Duration,
) -> Result<usize, CliError> {
    let mut moves = 0;
    loop {
        let Some((map, _)) = store.map().await.map_err(etcd("reading the map"))? else {
            return Err(CliError::msg(
                "the cluster has no map (`tucana cluster create`)",
            ));
        };
        if let Some(m) = map.migrations.first() {
            println!(
                "waiting for the running migration into region {}",
                m.target.id
            );
            wait_finished(store, m.target.id, wait).await?;
            continue;
        }
        let (live_ids, addrs) = live(store).await?;
        let Some(Move { source, slots, to }) = map.next_move(&servers(&live_ids)) else {
            return Ok(moves);
        };
        let addr = addrs
            .iter()
            .find(|(id, _)| *id == to)
            .map_or("?", |(_, a)| a.as_str());
        println!(
            "move {}: slots {slots} of region {source} to {addr}",
            moves + 1
        );
        move_slots(store, source, Some(slots), &to, wait).await?;
        moves += 1;
    }
}

/// Hands regions over to in-sync backups (planned failovers: no data moves) while that
/// evens out the slots each live server leads (`ClusterMap::next_handoff`), waiting for
/// each; the number of handoffs made.
pub async fn balance_leaders(store: &Store, wait: Duration) -> Result<usize, CliError> {
    let mut handoffs = 0;
    loop {
        let Some((map, revision)) = store.map().await.map_err(etcd("reading the map"))? else {
            return Err(CliError::msg(
                "the cluster has no map (`tucana cluster create`)",
            ));
        };
        let (live_ids, addrs) = live(store).await?;
        let Some((id, epoch, to)) = map.next_handoff(&live_ids) else {
            return Ok(handoffs);
        };
        let next = map
            .request_handoff(id, epoch, Some(&to))
            .map_err(etcd("asking for a handoff"))?;
        match store.update_map(revision, &next).await {
            Ok(_) => {}
            Err(Error::Conflict { .. }) => continue,
            Err(e) => return Err(etcd("writing the map")(e)),
        }
        let addr = addrs
            .iter()
            .find(|(s, _)| *s == to)
            .map_or("?", |(_, a)| a.as_str());
        println!("handoff {}: region {id} to {addr}", handoffs + 1);
        let deadline = Instant::now() + wait;
        loop {
            let map = store.map().await.map_err(etcd("reading the map"))?;
            let region = map.as_ref().and_then(|(m, _)| m.region(id).cloned());
            match region {
                Some(r) if r.primary == to => break,
                Some(r) if r.epoch == epoch && r.handoff.as_ref() == Some(&to) => {}
                _ => {
                    return Err(CliError::msg(format!(
                        "the handoff of region {id} to {addr} was withdrawn (a backup did not acknowledge in time?)"
                    )))
                }
            }
            if Instant::now() >= deadline {
                return Err(CliError::msg(format!(
                    "the handoff of region {id} to {addr} is still pending after {wait:?}"
                )));
            }
            tokio::time::sleep(POLL).await;
        }
        handoffs += 1;
    }
}

/// Parses `A-B` (or one slot `A`) as a slot range.
pub fn parse_slots(text: &str) -> Result<SlotRange, String> {
    let (a, b) = text.split_once('-').unwrap_or((text, text));
    let a: u16 = a
        .trim()
        .parse()
        .map_err(|_| format!("bad slot range {text:?}"))?;
    let b: u16 = b
        .trim()
        .parse()
        .map_err(|_| format!("bad slot range {text:?}"))?;
    if a > b || b >= tucana_cluster::SLOTS {
        return Err(format!(
            "bad slot range {text:?}: want A-B with A <= B < 16384"
        ));
    }
    Ok(SlotRange::new(a, b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_ranges_parse() {
        assert_eq!(parse_slots("5-10"), Ok(SlotRange::new(5, 10)));
        assert_eq!(parse_slots("7"), Ok(SlotRange::new(7, 7)));
        assert!(parse_slots("10-5").is_err());
        assert!(parse_slots("0-16384").is_err());
        assert!(parse_slots("x").is_err());
    }
}
