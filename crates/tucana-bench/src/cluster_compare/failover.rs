//! The kill -9 experiment, the same for each system: writers (tucana-clusterprobe's, on
//! the client the plan names) write unique keys through the cluster and record every
//! `OK`; after a warm-up the master (primary) of a random range is killed with `kill
//! -9`; the time from the kill to the first write acknowledged on a slot of each of its
//! ranges (by the new master) is the failover time; the writers go on for a while, then every
//! acknowledged key is read back from the surviving nodes and those missing or holding
//! another value are counted lost. The victim is restarted on its directory (it rejoins
//! as a replica or backup) and the next cycle waits until every range has a caught-up
//! replica again.
//!
//! Owns the cycle's steps and its figures; the processes are `fleet`'s, the records
//! `super`'s. The writers and the failover probes run on threads of their own.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tucana_clusterprobe::{first_ack, lost_keys, tag_in, ClientKind, Writers};

use super::fleet::{Fleet, PATIENCE};
use crate::Result;

/// What a cycle does, in time.
pub(super) struct CyclePlan {
    /// The client of the writers and the probes.
    pub(super) client: ClientKind,
    pub(super) writers: usize,
    /// Writing before the kill.
    pub(super) warmup: Duration,
    /// Writing after the last of the victim's ranges took a write again.
    pub(super) after: Duration,
}

/// What one cycle measured.
pub(super) struct CycleFigures {
    pub(super) victim: String,
    /// Kill → first write acknowledged on each of the victim's ranges, ms.
    pub(super) failover_ms: Vec<f64>,
    /// Acknowledged writes of the cycle (the probes' included).
    pub(super) acknowledged: BTreeMap<String, String>,
    /// Acknowledged keys that did not read back after the failover.
    pub(super) lost: Vec<String>,
    /// How long the writers wrote, ms (warm-up, failover and after).
    pub(super) writing_ms: f64,
    /// Restart of the victim → the cluster whole again (every range with a caught-up
    /// replica), ms.
    pub(super) rejoin_ms: f64,
}

/// Runs one cycle on `fleet`, the victim chosen by `pick` (given the number of ranges).
pub(super) fn cycle(
    fleet: &mut Fleet,
    cycle: u64,
    plan: &CyclePlan,
    pick: impl FnOnce(usize) -> usize,
) -> Result<CycleFigures> {
    let ranges = fleet.settle()?;
    let victim_addr = ranges[pick(ranges.len())].primary.clone();
    let victim = fleet.index_of(&victim_addr)?;
    let led: Vec<(u16, u16)> = ranges
        .iter()
        .filter(|r| r.primary == victim_addr)
        .map(|r| (r.start, r.end))
        .collect();
    let name = fleet.system.name();
    let writing = Instant::now();
    let writers = Writers::start_with(
        plan.client,
        &fleet.addrs(),
        &format!("{name}-c{cycle}"),
        plan.writers,
    );
    std::thread::sleep(plan.warmup);
    let killed = Instant::now();
    fleet.kill9(victim);
    let live = fleet.live();
    // One probe per range of the victim, in parallel, each with a client of its own.
    let probes: Vec<std::result::Result<(String, f64), String>> = std::thread::scope(|s| {
        let handles: Vec<_> = led
            .iter()
            .map(|&(start, end)| {
                let live = live.clone();
                s.spawn(move || {
                    let key = format!("{{{}}}:{name}-c{cycle}-probe", tag_in(start, end));
                    let mut client = plan.client.make(&live);
                    first_ack(client.as_mut(), &key, PATIENCE)?;
                    Ok((key, killed.elapsed().as_secs_f64() * 1000.0))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a probe panicked".into())))
            .collect()
    });
    let mut acknowledged = BTreeMap::new();
    let mut failover_ms = Vec::new();
    let mut probe_error = None;
    for probe in probes {
        match probe {
            Ok((key, ms)) => {
                failover_ms.push(ms);
                acknowledged.insert(key, "p".to_string());
            }
            Err(e) => probe_error = Some(e),
        }
    }
    std::thread::sleep(plan.after);
    acknowledged.append(&mut writers.stop());
    let writing_ms = writing.elapsed().as_secs_f64() * 1000.0;
    if let Some(e) = probe_error {
        return Err(format!("{name}, cycle {cycle}: killed {victim_addr}: {e}").into());
    }
    fleet.served_map()?;
    let lost = lost_keys(&live, &acknowledged, PATIENCE)?;
    let restarted = Instant::now();
    fleet.restart(victim)?;
    fleet.settle()?;
    Ok(CycleFigures {
        victim: victim_addr,
        failover_ms,
        acknowledged,
        lost,
        writing_ms,
        rejoin_ms: restarted.elapsed().as_secs_f64() * 1000.0,
    })
}
