//! I/O failure sweeps in the style of SQLite (row M2 of `docs/reliability.md`): for a
//! fixed workload (drawn from the seed, no background thread, so I/O numbers are the
//! same on every run), count its I/Os, then for every I/O number N run it again with
//! I/O N failing once, failing from N on, and cut short (a write that writes a prefix,
//! then fails). Asserts:
//!
//! - once a write or sync failed, no later call acknowledges a write, sync, commit or GC
//!   pass (the store is poisoned, promise 5 of `docs/reliability.md`), even when the I/O
//!   works again;
//! - the durable image, and one random post-crash image, reopen, pass `check` and hold a
//!   prefix of the history that includes everything acknowledged durable.
//!
//! Odd-numbered workloads are overwrite-heavy (`Mix::GC`) and run forced garbage
//! collection passes (one in the middle and one at the end, besides those the mix
//! draws), so the sweep fails every I/O of a pass too: the reads of its victims, the
//! appends and flushes of relocated records, its five commits and its hole punches (a
//! failed punch only keeps the bytes: the engine goes on). The figures line counts the
//! I/O positions inside GC passes and the hole punches among them.
//!
//! Workloads 2 and 3 of every four defer every update of an existing key
//! (`workload::deferring`): their sweeps fail the reads and writes of deferred batches
//! being applied (at a commit, a GC pass, or when a batch or delete meets a deferred key).
//!
//! Failures during the volume's creation are not swept (an interrupted creation leaves a
//! file the engine refuses to open, by design). `count` is the number of workloads.

use std::sync::Arc;

use rand::Rng;
use tucana::volume::Storage;
use tucana::Keyspace;

use crate::model::KeyspaceModel;
use crate::sim::{Fault, IoKind, SimStorage};
use crate::workload::{self, Mix, Op, Recovery};
use crate::{case_rng, catch, Report, RunArgs};

const KEYSPACES: usize = 2;
const OPS: usize = 150;
/// Operations of a GC workload: fewer, since each pass makes about a hundred I/Os and the
/// sweep replays the whole workload once per I/O position and mode.
const GC_OPS: usize = 100;

#[derive(Default)]
struct Tally {
    io_positions: u64,
    /// I/O positions inside forced GC passes.
    gc_io_positions: u64,
    /// Hole punches among the I/O positions.
    punch_positions: u64,
    runs: u64,
    faults_fired: u64,
    acked_after_failure: u64,
    lost_durable: u64,
    non_prefix: u64,
    failed_recoveries: u64,
    panics: u64,
    /// Workloads that deferred every update, and the puts their dry runs deferred.
    deferred_workloads: u64,
    deferred_puts: u64,
    failures: Vec<String>,
}

#[derive(Clone, Copy, Debug)]
enum Mode {
    Once,
    FromThenOn,
    Short,
}

pub fn run(args: &RunArgs) -> Report {
    let mut t = Tally::default();
    let cases: Vec<u64> = match args.case {
        Some(c) => vec![c],
        None => (0..args.count).collect(),
    };
    for case in cases {
        let where_ = format!("io-failure seed {} case {case}", args.seed);
        if let Err(p) = catch(|| run_case(args, case, &mut t)) {
            t.panics += 1;
            t.failures.push(format!("{where_}: panic: {p}"));
        }
    }
    Report {
        figures: format!(
            "M2 workloads: {}, I/O positions: {} (inside gc passes: {}, hole punches: {}), runs: {}, faults fired: {}, acknowledgements after a failed write or sync: {}, lost durable writes: {}, non-prefix states: {}, failed recoveries: {}, panics: {}, deferred-update workloads: {} (puts deferred: {}), seed: {}",
            args.case.map_or(args.count, |_| 1),
            t.io_positions,
            t.gc_io_positions,
            t.punch_positions,
            t.runs,
            t.faults_fired,
            t.acked_after_failure,
            t.lost_durable,
            t.non_prefix,
            t.failed_recoveries,
            t.panics,
            t.deferred_workloads,
            t.deferred_puts,
            args.seed
        ),
        failures: t.failures,
    }
}

fn workload_ops(seed: u64, case: u64) -> (u64, Vec<Op>) {
    let mut rng = case_rng(seed, case);
    let sim_seed = rng.random();
    let (mix, count) = if case % 2 == 1 {
        (Mix::GC, GC_OPS)
    } else {
        (Mix::PLAIN, OPS)
    };
    let mut ops: Vec<Op> = (0..count as u64)
        .map(|i| workload::random_op_of(&mut rng, mix, KEYSPACES, i + 1))
        .collect();
    if mix == Mix::GC {
        ops.insert(count / 2, Op::Gc);
        ops.push(Op::Gc);
    }
    ops.push(Op::Commit);
    (sim_seed, ops)
}

/// Whether workload `case` defers every update (2 and 3 of every four: a plain and a
/// GC-heavy one).
fn defers(case: u64) -> bool {
    case % 4 >= 2
}

/// A fresh volume with the keyspaces created and committed, ready to arm a fault.
fn setup(sim_seed: u64, deferred: bool) -> (Arc<SimStorage>, tucana::Database, Vec<Keyspace>) {
    let sim = Arc::new(SimStorage::new(sim_seed));
    let storage: Arc<dyn Storage> = sim.clone();
    let options = workload::deferring(workload::options(false), deferred);
    let db = workload::open(options, &storage).expect("create a fresh volume");
    let keyspaces = (0..KEYSPACES)
        .map(|i| db.keyspace(&format!("ks{i}")).expect("create a keyspace"))
        .collect();
    db.commit().expect("first commit");
    (sim, db, keyspaces)
}

fn run_case(args: &RunArgs, case: u64, t: &mut Tally) {
    let (sim_seed, ops) = workload_ops(args.seed, case);
    let names: Vec<String> = (0..KEYSPACES).map(|i| format!("ks{i}")).collect();

    let deferred = defers(case);
    // Dry run: how many I/Os the workload makes.
    let (sim, db, keyspaces) = setup(sim_seed, deferred);
    let base_io = sim.io_count();
    let mut models = vec![KeyspaceModel::default(); KEYSPACES];
    let mut gc_ios = 0;
    for (i, op) in ops.iter().enumerate() {
        let before = sim.io_count();
        if let Err(e) = workload::run_op(op, &db, &keyspaces, &mut models) {
            t.failures.push(format!(
                "io-failure seed {} case {case} dry run op {i}: {op:?} failed without a fault: {e}",
                args.seed
            ));
            return;
        }
        if matches!(op, Op::Gc) {
            gc_ios += sim.io_count() - before;
        }
    }
    let total = sim.io_count() - base_io;
    let kinds = sim.io_kinds();
    if deferred {
        t.deferred_workloads += 1;
        t.deferred_puts += db.stats().deferred_puts;
    }
    db.abandon();
    t.io_positions += total;
    t.gc_io_positions += gc_ios;
    t.punch_positions += kinds[base_io as usize..]
        .iter()
        .filter(|k| **k == IoKind::Punch)
        .count() as u64;
    if args.verbose {
        eprintln!("io-failure seed {} case {case}: {total} I/Os", args.seed);
    }

    let mut crash_rng = case_rng(args.seed ^ 0x4d32, case);
    for n in 0..total {
        for mode in [Mode::Once, Mode::FromThenOn, Mode::Short] {
            // A short "write" of anything but a write is a plain failure: swept already.
            if matches!(mode, Mode::Short) && kinds[(base_io + n) as usize] != IoKind::Write {
                continue;
            }
            let where_ = format!(
                "io-failure seed {} case {case} I/O {n} ({mode:?})",
                args.seed
            );
            t.runs += 1;
            let sweep = || {
                sweep_one(
                    sim_seed,
                    deferred,
                    &ops,
                    &names,
                    base_io + n,
                    mode,
                    &mut crash_rng,
                )
            };
            match catch(sweep) {
                Err(p) => {
                    t.panics += 1;
                    t.failures.push(format!("{where_}: panic: {p}"));
                }
                Ok(r) => {
                    t.faults_fired += u64::from(r.fired);
                    if let Some(m) = r.acked_after_failure {
                        t.acked_after_failure += 1;
                        t.failures.push(format!("{where_}: {m}"));
                    }
                    for (what, rec) in r.recoveries {
                        match rec {
                            Recovery::Good(_) => {}
                            Recovery::LostDurable(m) => {
                                t.lost_durable += 1;
                                t.failures
                                    .push(format!("{where_}, {what}: lost durable writes: {m}"));
                            }
                            Recovery::NonPrefix(m) => {
                                t.non_prefix += 1;
                                t.failures
                                    .push(format!("{where_}, {what}: non-prefix state: {m}"));
                            }
                            Recovery::Failed(e) => {
                                t.failed_recoveries += 1;
                                t.failures
                                    .push(format!("{where_}, {what}: recovery failed: {e}"));
                            }
                        }
                    }
                }
            }
        }
    }
}

struct SweepResult {
    fired: bool,
    acked_after_failure: Option<String>,
    recoveries: Vec<(&'static str, Recovery)>,
}

fn sweep_one(
    sim_seed: u64,
    deferred: bool,
    ops: &[Op],
    names: &[String],
    at_io: u64,
    mode: Mode,
    crash_rng: &mut rand::rngs::StdRng,
) -> SweepResult {
    let (sim, db, keyspaces) = setup(sim_seed, deferred);
    sim.arm(match mode {
        Mode::Once => Fault::FailOnce { at_io },
        Mode::FromThenOn => Fault::FailFrom { at_io },
        Mode::Short => Fault::ShortWrite { at_io },
    });
    let mut models = vec![KeyspaceModel::default(); KEYSPACES];
    let mut acked_after_failure = None;
    for (i, op) in ops.iter().enumerate() {
        let r = workload::run_op(op, &db, &keyspaces, &mut models);
        // A failed read or hole punch loses nothing the store acknowledged, so the store
        // may go on; a failed write or sync poisons it. A sync answering `Ok` counts as an
        // acknowledgement too (it was once let through with nothing left unsynced: the
        // regression test `sync_on_a_poisoned_store_with_nothing_unsynced_is_an_error`).
        let write_failed = sim
            .faulted()
            .iter()
            .find(|(_, k)| matches!(k, IoKind::Write | IoKind::Sync))
            .copied();
        if let (Ok(()), Some((io, kind)), None) = (&r, write_failed, &acked_after_failure) {
            acked_after_failure = Some(format!(
                "op {i} ({}) acknowledged after {kind:?} I/O {io} failed",
                op_name(op)
            ));
        }
    }
    let fired = !sim.faulted().is_empty();
    db.abandon();
    drop(keyspaces);

    let mut recoveries = Vec::new();
    let images = [
        ("durable image", sim.durable_image()),
        ("random crash image", sim.crash_image(crash_rng)),
    ];
    for (what, image) in images {
        let storage: Arc<dyn Storage> = Arc::new(SimStorage::from_image(image, 0));
        let rec = match workload::open(workload::options(false), &storage) {
            Ok(db) => {
                let r = workload::verify_recovered(&db, names, &models);
                db.abandon();
                r
            }
            Err(e) => Recovery::Failed(e),
        };
        recoveries.push((what, rec));
    }
    SweepResult {
        fired,
        acked_after_failure,
        recoveries,
    }
}

fn op_name(op: &Op) -> &'static str {
    match op {
        Op::Put { sync: true, .. } => "sync put",
        Op::Put { .. } => "put",
        Op::Delete { sync: true, .. } => "sync delete",
        Op::Delete { .. } => "delete",
        Op::Batch { sync: true, .. } => "sync batch",
        Op::Batch { .. } => "batch",
        Op::Sync => "sync",
        Op::Commit => "commit",
        Op::Gc => "gc",
    }
}
