//! M1, simulated power loss: random workloads on the simulated volume, power lost at a
//! random I/O, several post-crash images of that instant (unsynced writes dropped,
//! reordered, torn), each reopened, compared with the model and `check`ed.
//!
//! A case runs up to three *lives*: after the crash states of one life are verified, the
//! last recovered database carries on with the next life, so recovery from a recovered
//! volume (generation bumps, replay after replay) is exercised too. One case in five runs
//! the background committer and flusher every millisecond; those do not replay exactly.
//!
//! `count` is the number of crash states to reach.

use std::sync::Arc;

use rand::Rng;
use tucana::volume::Storage;
use tucana::{Database, Keyspace};

use crate::model::KeyspaceModel;
use crate::sim::{Fault, SimStorage};
use crate::workload::{self, Recovery};
use crate::{case_rng, catch, Report, RunArgs};

const LIVES: u32 = 3;
const STATES_PER_CRASH: u32 = 3;

#[derive(Default)]
struct Tally {
    crash_states: u64,
    lost_durable: u64,
    non_prefix: u64,
    failed_recoveries: u64,
    panics: u64,
    failures: Vec<String>,
}

pub fn run(args: &RunArgs) -> Report {
    let mut t = Tally::default();
    let mut case = args.case.unwrap_or(0);
    loop {
        let before = t.crash_states;
        let where_ = format!("m1 seed {} case {case}", args.seed);
        if let Err(p) = catch(|| run_case(args.seed, case, &mut t)) {
            t.panics += 1;
            t.failures
                .push(format!("{where_}: panic in the workload: {p}"));
        }
        if args.verbose {
            eprintln!("{where_}: {} crash states", t.crash_states - before);
        }
        if args.case.is_some() || t.crash_states >= args.count {
            break;
        }
        case += 1;
    }
    Report {
        figures: format!(
            "M1 crash states: {}, lost durable writes: {}, non-prefix states: {}, failed recoveries: {}, panics: {}, seed: {}",
            t.crash_states, t.lost_durable, t.non_prefix, t.failed_recoveries, t.panics, args.seed
        ),
        failures: t.failures,
    }
}

fn run_case(seed: u64, case: u64, t: &mut Tally) {
    let mut rng = case_rng(seed, case);
    let background = rng.random_bool(0.2);
    let replay = if background {
        " (background committer on: replay may differ)"
    } else {
        ""
    };
    let options = workload::options(background);
    let keyspace_count = rng.random_range(1..=3usize);
    let names: Vec<String> = (0..keyspace_count).map(|i| format!("ks{i}")).collect();

    let mut sim = Arc::new(SimStorage::new(rng.random()));
    let storage: Arc<dyn Storage> = sim.clone();
    let mut db = workload::open(options.clone(), &storage).expect("create a fresh volume");
    let mut keyspaces: Vec<Keyspace> = names
        .iter()
        .map(|n| db.keyspace(n).expect("create a keyspace"))
        .collect();
    let mut models: Vec<KeyspaceModel> = names.iter().map(|_| KeyspaceModel::default()).collect();
    let mut tag = 0u64;

    for life in 0..LIVES {
        let where_ = format!("m1 seed {seed} case {case} life {life}");
        let steps = rng.random_range(10..150u32);
        let crash_step = rng.random_range(0..steps);
        for step in 0..steps {
            if step == crash_step {
                let at_io = sim.io_count() + rng.random_range(0..40);
                sim.arm(Fault::Crash { at_io });
            }
            tag += 1;
            let op = workload::random_op(&mut rng, keyspace_count, tag);
            let r = workload::run_op(&op, &db, &keyspaces, &mut models);
            if sim.crashed() {
                break;
            }
            if let Err(e) = r {
                t.failures.push(format!(
                    "{where_} step {step}: {op:?} failed with no fault injected: {e}{replay}"
                ));
                return;
            }
        }
        db.abandon();
        drop(keyspaces);

        let mut next: Option<(Database, Vec<crate::model::State>, Arc<SimStorage>)> = None;
        for state in 0..STATES_PER_CRASH {
            let where_ = format!("{where_} crash state {state}");
            let recovered = Arc::new(sim.crash(&mut rng));
            let storage: Arc<dyn Storage> = recovered.clone();
            t.crash_states += 1;
            let outcome = catch(|| match workload::open(options.clone(), &storage) {
                Ok(db) => {
                    let r = workload::verify_recovered(&db, &names, &models);
                    (Some(db), r)
                }
                Err(e) => (None, Recovery::Failed(e)),
            });
            match outcome {
                Err(p) => {
                    t.panics += 1;
                    t.failures.push(format!("{where_}: panic: {p}{replay}"));
                }
                Ok((_, Recovery::LostDurable(m))) => {
                    t.lost_durable += 1;
                    t.failures
                        .push(format!("{where_}: lost durable writes: {m}{replay}"));
                }
                Ok((_, Recovery::NonPrefix(m))) => {
                    t.non_prefix += 1;
                    t.failures
                        .push(format!("{where_}: non-prefix state: {m}{replay}"));
                }
                Ok((_, Recovery::Failed(e))) => {
                    t.failed_recoveries += 1;
                    t.failures
                        .push(format!("{where_}: recovery failed: {e}{replay}"));
                }
                Ok((Some(db), Recovery::Good(states))) => {
                    // Carry on with the last good one; the others are closed as crashes.
                    if let Some((old, _, _)) = next.replace((db, states, recovered)) {
                        old.abandon();
                    }
                }
                Ok((None, Recovery::Good(_))) => unreachable!("Good comes with a database"),
            }
        }
        let Some((new_db, states, new_sim)) = next else {
            return;
        };
        db = new_db;
        sim = new_sim;
        keyspaces = match names.iter().map(|n| db.open_keyspace(n)).collect() {
            Ok(k) => k,
            Err(e) => {
                t.failures
                    .push(format!("{where_}: keyspace gone after verification: {e}"));
                return;
            }
        };
        // `check` committed the recovered state: it is the durable base of the next life.
        models = states.into_iter().map(KeyspaceModel::new).collect();
    }
    db.abandon();
}
