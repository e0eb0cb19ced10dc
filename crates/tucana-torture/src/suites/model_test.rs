//! The model test as a command (row M6 of `docs/reliability.md`): random operation
//! sequences against a `BTreeMap` per keyspace, on the simulated volume, with reads
//! checked after every step: gets, forward and reverse ranges with random bounds,
//! prefixes, snapshots (checked against the model as it was when they were taken, after
//! later writes), clean reopens (must hold everything and pass `check`) and crashes
//! (must hold an allowed prefix and pass `check`; the model then continues from what
//! was recovered). `count` is the number of cases; each runs `STEPS` operations.
//!
//! Garbage collection: half the cases use the overwrite-heavy `Mix::GC`, whose forced
//! passes relocate records under the reads, snapshots and ranges that follow; one case in
//! four runs the background committer and collector every millisecond (not exactly
//! replayable), and half of its crashes are aimed at an I/O of the collector's thread.

use std::ops::Bound;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::Rng;
use tucana::{Database, Keyspace, Snapshot};

use crate::model::{KeyspaceModel, State};
use crate::sim::SimStorage;
use crate::workload::{self, Mix, Op, Recovery, GC_THREAD};
use crate::{case_rng, catch, Report, RunArgs};

const STEPS: u32 = 300;
const KEYSPACES: usize = 2;

/// How long a crash aimed at the background collector waits for its I/O (when the
/// collector has work, its I/O came within 5 ms in measurements).
const BACKGROUND_GC_WAIT: Duration = Duration::from_millis(6);

#[derive(Default)]
struct Tally {
    cases: u64,
    steps: u64,
    reads: u64,
    reopens: u64,
    crashes: u64,
    background_cases: u64,
    /// Crashes at an I/O of the background collector's thread.
    gc_crashes: u64,
    forced_gc_passes: u64,
    gc_passes: u64,
    gc_relocated_bytes: u64,
    failures: Vec<String>,
    panics: u64,
}

pub fn run(args: &RunArgs) -> Report {
    let mut t = Tally::default();
    let cases: Vec<u64> = match args.case {
        Some(c) => vec![c],
        None => (0..args.count).collect(),
    };
    for case in cases {
        t.cases += 1;
        let where_ = format!("model-test seed {} case {case}", args.seed);
        match catch(|| run_case(args.seed, case, args.members, &mut t)) {
            Ok(Ok(())) => {}
            Ok(Err(m)) => t.failures.push(format!("{where_}: {m}")),
            Err(p) => {
                t.panics += 1;
                t.failures.push(format!("{where_}: panic: {p}"));
            }
        }
    }
    Report {
        figures: format!(
            "M6 cases: {} (background {}), steps: {}, reads checked: {}, reopens: {}, crashes: {} (inside background gc: {}), gc passes: {} (forced {}, background {}), gc relocated: {} KiB, failures: {}, panics: {}, seed: {}",
            t.cases,
            t.background_cases,
            t.steps,
            t.reads,
            t.reopens,
            t.crashes,
            t.gc_crashes,
            t.gc_passes,
            t.forced_gc_passes,
            t.gc_passes.saturating_sub(t.forced_gc_passes),
            t.gc_relocated_bytes >> 10,
            t.failures.len() as u64 - t.panics,
            t.panics,
            args.seed
        ),
        failures: t.failures,
    }
}

struct Live {
    sim: Arc<SimStorage>,
    /// Members of the volume (`members::volume`).
    members: usize,
    db: Database,
    keyspaces: Vec<Keyspace>,
}

fn open_live(
    sim: Arc<SimStorage>,
    members: usize,
    names: &[String],
    background: bool,
) -> Result<Live, String> {
    let storage = crate::members::volume(&sim, members).map_err(|e| format!("members: {e}"))?;
    let db = workload::open(workload::options(background), &storage)
        .map_err(|e| format!("open: {e}"))?;
    let keyspaces = names
        .iter()
        .map(|n| db.keyspace(n))
        .collect::<tucana::Result<Vec<_>>>()
        .map_err(|e| format!("keyspace: {e}"))?;
    Ok(Live {
        sim,
        members,
        db,
        keyspaces,
    })
}

fn random_bound(rng: &mut StdRng) -> Bound<Vec<u8>> {
    match rng.random_range(0..3) {
        0 => Bound::Unbounded,
        1 => Bound::Included(workload::random_key(rng)),
        _ => Bound::Excluded(workload::random_key(rng)),
    }
}

fn in_bounds(k: &[u8], lo: &Bound<Vec<u8>>, hi: &Bound<Vec<u8>>) -> bool {
    let above = match lo {
        Bound::Included(l) => k >= l.as_slice(),
        Bound::Excluded(l) => k > l.as_slice(),
        Bound::Unbounded => true,
    };
    let below = match hi {
        Bound::Included(h) => k <= h.as_slice(),
        Bound::Excluded(h) => k < h.as_slice(),
        Bound::Unbounded => true,
    };
    above && below
}

type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

fn collect(it: tucana::Range, rev: bool) -> tucana::Result<Pairs> {
    if rev {
        it.rev().collect()
    } else {
        it.collect()
    }
}

/// Checks a range over the live keyspace or a snapshot against `want`.
fn check_range(
    rng: &mut StdRng,
    want: &State,
    live: Option<&Keyspace>,
    snap: Option<&Snapshot>,
) -> Result<(), String> {
    let rev = rng.random_bool(0.5);
    let (lo, hi, it, what) = if rng.random_bool(0.2) {
        let p = workload::random_key(rng);
        let p = p[..rng.random_range(0..=p.len())].to_vec();
        let it = match (live, snap) {
            (Some(ks), _) => ks.prefix(&p),
            (None, Some(s)) => s.prefix(&p),
            _ => unreachable!("one source"),
        };
        let mut end = p.clone();
        let hi = loop {
            match end.pop() {
                Some(0xff) => continue,
                Some(b) => {
                    end.push(b + 1);
                    break Bound::Excluded(end);
                }
                None => break Bound::Unbounded,
            }
        };
        (Bound::Included(p.clone()), hi, it, format!("prefix {p:?}"))
    } else {
        let (lo, hi) = (random_bound(rng), random_bound(rng));
        let r = (lo.clone(), hi.clone());
        let it = match (live, snap) {
            (Some(ks), _) => ks.range::<Vec<u8>, _>(r),
            (None, Some(s)) => s.range::<Vec<u8>, _>(r),
            _ => unreachable!("one source"),
        };
        (lo.clone(), hi.clone(), it, format!("range {lo:?}..{hi:?}"))
    };
    let got = collect(it, rev).map_err(|e| format!("{what} rev={rev}: {e}"))?;
    let mut expect: Pairs = want
        .iter()
        .filter(|(k, _)| in_bounds(k, &lo, &hi))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if rev {
        expect.reverse();
    }
    if got != expect {
        return Err(format!(
            "{what} rev={rev}: got {} pairs, want {} (first difference at {:?})",
            got.len(),
            expect.len(),
            got.iter()
                .zip(&expect)
                .position(|(a, b)| a != b)
                .unwrap_or(got.len().min(expect.len()))
        ));
    }
    Ok(())
}

/// Whether background GC has work: some keyspace's log is over its space-amplification
/// target (else the collector does no I/O, and waiting for one is time lost).
fn over_gc_target(db: &Database) -> bool {
    let target = workload::options(true).gc_space_amp;
    db.stats()
        .keyspaces
        .iter()
        .any(|ks| ks.log_size_bytes as f64 > target * ks.live_log_bytes as f64)
}

/// Adds what a database's collector did to the tally (before the handle goes).
fn count_gc(t: &mut Tally, db: &Database) {
    let stats = db.stats();
    t.gc_passes += stats.gc_passes;
    t.gc_relocated_bytes += stats.gc_relocated_bytes;
}

/// Closes `live` cleanly and opens it again: every keyspace must equal its model, and
/// `check` must pass. Each model restarts from what was read.
fn reopen(
    live: Live,
    models: &mut [KeyspaceModel],
    names: &[String],
    background: bool,
    t: &mut Tally,
) -> Result<Live, String> {
    let (sim, members) = (live.sim.clone(), live.members);
    let Live { db, keyspaces, .. } = live;
    drop(keyspaces);
    count_gc(t, &db);
    db.close().map_err(|e| format!("close: {e}"))?;
    let live = open_live(sim, members, names, background)?;
    for (i, m) in models.iter_mut().enumerate() {
        let got = workload::read_state(&live.keyspaces[i])
            .map_err(|e| format!("read after reopen: {e}"))?;
        if got != m.latest() {
            return Err(format!("ks{i} after a clean reopen differs from the model"));
        }
        *m = KeyspaceModel::new(got);
    }
    live.db
        .check()
        .map_err(|e| format!("check after a clean reopen: {e}"))?;
    Ok(live)
}

/// Loses power under `live` (with a background collector, half the time at one of its
/// next I/Os), opens a random post-crash image, which must hold an allowed state, and
/// carries on from it: the models restart from what was recovered.
fn crash(
    live: Live,
    rng: &mut StdRng,
    models: &mut Vec<KeyspaceModel>,
    names: &[String],
    background: bool,
    t: &mut Tally,
) -> Result<Live, String> {
    let Live {
        sim,
        members,
        db,
        keyspaces,
    } = live;
    drop(keyspaces);
    if background && rng.random_bool(0.5) && over_gc_target(&db) {
        // Power lost at one of the collector's next I/Os, if it does any soon.
        sim.arm_crash_in_thread(GC_THREAD, rng.random_range(0..4));
        let waited = Instant::now();
        while !sim.crashed() && waited.elapsed() < BACKGROUND_GC_WAIT {
            std::thread::sleep(Duration::from_millis(1));
        }
        t.gc_crashes += u64::from(sim.crash_thread().as_deref() == Some(GC_THREAD));
    }
    count_gc(t, &db);
    db.abandon();
    let recovered = Arc::new(sim.crash(rng));
    let storage = crate::members::volume(&recovered, members)
        .map_err(|e| format!("members after a crash: {e}"))?;
    let db = workload::open(workload::options(false), &storage)
        .map_err(|e| format!("open after a crash: {e}"))?;
    match workload::verify_recovered(&db, names, models) {
        Recovery::Good(states) => {
            *models = states.into_iter().map(KeyspaceModel::new).collect();
        }
        other => return Err(format!("after a crash: {other:?}")),
    }
    drop(db);
    open_live(recovered, members, names, background)
}

fn run_case(seed: u64, case: u64, members: usize, t: &mut Tally) -> Result<(), String> {
    let mut rng = case_rng(seed, case);
    let names: Vec<String> = (0..KEYSPACES).map(|i| format!("ks{i}")).collect();
    let mix = if rng.random_bool(0.5) {
        Mix::GC
    } else {
        Mix::PLAIN
    };
    let background = rng.random_range(0..4) == 0;
    t.background_cases += u64::from(background);
    let sim = Arc::new(SimStorage::new(rng.random()));
    let mut live = open_live(sim, members, &names, background)?;
    live.db.commit().map_err(|e| format!("first commit: {e}"))?;
    let mut models = vec![KeyspaceModel::default(); KEYSPACES];
    let mut snapshots: Vec<(usize, Snapshot, State)> = Vec::new();
    for step in 0..STEPS {
        t.steps += 1;
        let at = |m: String| format!("step {step}: {m}");
        if background && rng.random_range(0..20) == 0 {
            // Steps take microseconds: let the collector and committer take turns too.
            std::thread::sleep(Duration::from_millis(1));
        }
        let ks = rng.random_range(0..KEYSPACES);
        match rng.random_range(0..100) {
            0..45 => {
                let op = workload::random_op_of(&mut rng, mix, KEYSPACES, u64::from(step) + 1);
                t.forced_gc_passes += u64::from(matches!(op, Op::Gc));
                workload::run_op(&op, &live.db, &live.keyspaces, &mut models)
                    .map_err(|e| at(format!("{op:?}: {e}")))?;
            }
            45..60 => {
                t.reads += 1;
                let key = workload::random_key(&mut rng);
                let got = live.keyspaces[ks]
                    .get(&key)
                    .map_err(|e| at(format!("get: {e}")))?;
                let want = models[ks].latest().get(&key).cloned();
                if got != want {
                    return Err(at(format!(
                        "get {:?} in ks{ks}: got {:?} bytes, want {:?}",
                        String::from_utf8_lossy(&key),
                        got.map(|g| g.len()),
                        want.map(|w| w.len())
                    )));
                }
            }
            60..75 => {
                t.reads += 1;
                check_range(
                    &mut rng,
                    &models[ks].latest(),
                    Some(&live.keyspaces[ks]),
                    None,
                )
                .map_err(|m| at(format!("ks{ks} {m}")))?;
            }
            75..82 => {
                if snapshots.len() < 4 {
                    let snap = live.keyspaces[ks]
                        .snapshot()
                        .map_err(|e| at(format!("ks{ks} snapshot: {e}")))?;
                    snapshots.push((ks, snap, models[ks].latest()));
                }
            }
            82..90 => {
                if !snapshots.is_empty() {
                    t.reads += 1;
                    let i = rng.random_range(0..snapshots.len());
                    let (ks, snap, want) = &snapshots[i];
                    check_range(&mut rng, want, None, Some(snap))
                        .map_err(|m| at(format!("snapshot of ks{ks}: {m}")))?;
                    if rng.random_bool(0.5) {
                        snapshots.swap_remove(i);
                    }
                }
            }
            90..95 => {
                // Clean reopen: everything must be there.
                t.reopens += 1;
                snapshots.clear();
                live = reopen(live, &mut models, &names, background, t).map_err(at)?;
            }
            _ => {
                // Crash: a random post-crash image of the unsynced writes.
                t.crashes += 1;
                snapshots.clear();
                live = crash(live, &mut rng, &mut models, &names, background, t).map_err(at)?;
            }
        }
    }
    count_gc(t, &live.db);
    live.db.close().map_err(|e| format!("final close: {e}"))?;
    Ok(())
}
