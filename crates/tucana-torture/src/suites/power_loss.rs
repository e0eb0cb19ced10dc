//! Simulated power loss (row M1 of `docs/reliability.md`): random workloads on the
//! simulated volume, power lost at a random I/O, several post-crash images of that
//! instant (unsynced writes dropped, reordered, torn), each reopened, compared with the
//! model and `check`ed.
//!
//! A case runs up to three *lives*: after the crash states of one life are verified, the
//! last recovered database carries on with the next life, so recovery from a recovered
//! volume (generation bumps, replay after replay) is exercised too. One case in five runs
//! the background committer, flusher and garbage collector every millisecond; those do
//! not replay exactly.
//!
//! Garbage collection: three cases in five use the overwrite-heavy `Mix::GC` (a few dozen
//! keys, 64 KiB segments, forced `Database::gc` passes among the operations), so passes
//! relocate, retire, free and punch segments, and later writes reuse them. In those
//! cases the crash is aimed, one time in two, inside a forced pass (at a random I/O of
//! it: relocation reads and appends, its five commits, the punches); in background cases,
//! one time in two, at a random I/O of the background collector's thread. A crash state
//! counts as *inside GC* when the power went while a forced pass was running or at an I/O
//! of the collector's thread; the figures line says how many there were, and how much GC
//! the cases did (passes, bytes relocated and reclaimed, hole punches).
//!
//! One crash state in three is also opened with its newest superblock slot zeroed (when
//! the other slot is valid): open must fall back to the older commit and replay to an
//! allowed state, which holds only if freeing keeps everything that commit reaches until
//! a later commit is durable (GC's retired segments included). The one thing a commit
//! under way may already have rewritten is the older commit's bitmap buddy; open refuses
//! that as corrupt, and the figures line counts those states apart.
//!
//! Deferred updates: one case in three (by its number) defers every update of an existing
//! key (`workload::deferring`), so power fails while acknowledged updates are in the log
//! but not in the index, and while batches of them are applied; the figures line counts
//! those crash states and the puts their lives deferred.
//!
//! `count` is the number of crash states to reach.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::Rng;
use tucana::volume::superblock::Superblock;
use tucana::volume::Storage;
use tucana::{Database, Error, Keyspace};

use crate::members;
use crate::model::{KeyspaceModel, State};
use crate::sim::{Fault, Image, IoKind, SimStorage, BLOCK_BYTES};
use crate::workload::{self, Mix, Op, Recovery, GC_THREAD};
use crate::{case_rng, catch, Report, RunArgs};

const LIVES: u32 = 3;
const STATES_PER_CRASH: u32 = 3;

/// I/Os a forced GC pass is assumed to make until one was measured in the case (the
/// crash aimed inside a pass falls at a random one of them).
const GC_PASS_IOS_GUESS: u64 = 120;

/// How long a background case waits, after its operations, for the collector's thread to
/// reach the I/O the crash is armed at (it works only while a log is over its target).
const BACKGROUND_GC_WAIT: Duration = Duration::from_millis(40);

#[derive(Default)]
struct Tally {
    crash_states: u64,
    /// Crash states whose power loss fell inside a forced GC pass.
    gc_forced_states: u64,
    /// Crash states also opened with their newest superblock slot lost.
    older_slot_states: u64,
    /// Of those, states where a commit in progress had rewritten the older commit's
    /// bitmap buddy (open rightly refuses it).
    older_slot_superseded: u64,
    /// Crash states whose power loss fell at an I/O of the background collector.
    gc_background_states: u64,
    gc_passes: u64,
    gc_relocated_bytes: u64,
    gc_reclaimed_bytes: u64,
    punches: u64,
    lost_durable: u64,
    non_prefix: u64,
    failed_recoveries: u64,
    panics: u64,
    /// Crash states of the cases that defer every update, and the puts those cases'
    /// lives deferred before their power losses.
    deferred_states: u64,
    deferred_puts: u64,
    failures: Vec<String>,
}

pub fn run(args: &RunArgs) -> Report {
    let mut t = Tally::default();
    let mut case = args.case.unwrap_or(0);
    loop {
        let before = t.crash_states;
        let where_ = format!("power-loss seed {} case {case}", args.seed);
        if let Err(p) = catch(|| run_case(args.seed, case, args.members, &mut t)) {
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
            "M1 crash states: {}, gc crash states: {} (forced pass {}, background {}), lost durable writes: {}, non-prefix states: {}, failed recoveries: {}, panics: {}, gc passes: {}, gc relocated: {} KiB, gc reclaimed: {} KiB, hole punches: {}, newest superblock slot lost too: {} (older commit superseded by one under way: {}), deferred-update crash states: {} (puts deferred: {}), seed: {}",
            t.crash_states,
            t.gc_forced_states + t.gc_background_states,
            t.gc_forced_states,
            t.gc_background_states,
            t.lost_durable,
            t.non_prefix,
            t.failed_recoveries,
            t.panics,
            t.gc_passes,
            t.gc_relocated_bytes >> 10,
            t.gc_reclaimed_bytes >> 10,
            t.punches,
            t.older_slot_states,
            t.older_slot_superseded,
            t.deferred_states,
            t.deferred_puts,
            args.seed
        ),
        failures: t.failures,
    }
}

/// What a case draws at its start and carries through its lives.
struct Case {
    rng: StdRng,
    background: bool,
    /// Appended to failures: whether the case replays exactly.
    replay: &'static str,
    options: tucana::Options,
    /// Every update of an existing key is deferred (one case in three, by its number, so
    /// the draws of a seed stay what they were).
    deferred: bool,
    mix: Mix,
    keyspace_count: usize,
    names: Vec<String>,
    /// Operations so far (values are tagged with it).
    tag: u64,
    /// I/Os a forced GC pass of this case makes (a crash aimed inside one falls at a
    /// random one of them).
    gc_pass_ios: u64,
    /// Members of the volume (`members::volume`).
    members: usize,
}

/// Where a life's power loss fell.
#[derive(Clone, Copy, Debug)]
struct Crash {
    in_forced_gc: bool,
    in_background_gc: bool,
}

impl Case {
    fn draw(seed: u64, case: u64, members: usize) -> Case {
        let mut rng = case_rng(seed, case);
        let background = rng.random_bool(0.2);
        let replay = if background {
            " (background committer on: replay may differ)"
        } else {
            ""
        };
        let mix = if rng.random_range(0..5) < 3 {
            Mix::GC
        } else {
            Mix::PLAIN
        };
        let keyspace_count = rng.random_range(1..=3usize);
        let deferred = case % 3 == 2;
        Case {
            rng,
            background,
            replay,
            options: workload::deferring(workload::options(background), deferred),
            deferred,
            mix,
            keyspace_count,
            names: (0..keyspace_count).map(|i| format!("ks{i}")).collect(),
            tag: 0,
            gc_pass_ios: GC_PASS_IOS_GUESS,
            members,
        }
    }

    /// Runs one life's workload until the power goes (or its steps run out), and counts
    /// what its collector did; `None` if an operation failed with no fault injected.
    fn live(
        &mut self,
        where_: &str,
        sim: &SimStorage,
        db: &Database,
        keyspaces: &[Keyspace],
        models: &mut [KeyspaceModel],
        t: &mut Tally,
    ) -> Option<Crash> {
        let rng = &mut self.rng;
        let steps = rng.random_range(10..150u32);
        let crash_step = rng.random_range(0..steps);
        // Where the crash of this life is aimed.
        let aim = match rng.random_range(0..2) {
            0 if self.background => Aim::BackgroundGc,
            0 if self.mix == Mix::GC => Aim::ForcedGc,
            _ => Aim::AnyIo,
        };
        let mut crashed_in_forced_gc = false;
        let punches_before = sim.io_count_of(IoKind::Punch);
        for step in 0..steps {
            self.tag += 1;
            let mut op = workload::random_op_of(rng, self.mix, self.keyspace_count, self.tag);
            if step == crash_step {
                match aim {
                    Aim::AnyIo => {
                        let at_io = sim.io_count() + rng.random_range(0..40);
                        sim.arm(Fault::Crash { at_io });
                    }
                    Aim::ForcedGc => {
                        op = Op::Gc;
                        let at_io = sim.io_count() + rng.random_range(0..self.gc_pass_ios);
                        sim.arm(Fault::Crash { at_io });
                    }
                    Aim::BackgroundGc => {
                        sim.arm_crash_in_thread(GC_THREAD, rng.random_range(0..6));
                    }
                }
            }
            // A background thread may have lost the power between two operations.
            if sim.crashed() {
                break;
            }
            let ios_before = sim.io_count();
            let r = workload::run_op(&op, db, keyspaces, models);
            if sim.crashed() {
                crashed_in_forced_gc = matches!(op, Op::Gc);
                break;
            }
            if let Err(e) = r {
                t.failures.push(format!(
                    "{where_} step {step}: {op:?} failed with no fault injected: {e}{}",
                    self.replay
                ));
                return None;
            }
            if matches!(op, Op::Gc) && !self.background {
                // Aim later crashes inside a pass of the size this case's passes have.
                self.gc_pass_ios = (sim.io_count() - ios_before).max(1);
            }
        }
        if aim == Aim::BackgroundGc {
            // The collector works only while a log is over its target: give it a moment.
            let waited = Instant::now();
            while !sim.crashed() && waited.elapsed() < BACKGROUND_GC_WAIT {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let stats = db.stats();
        t.gc_passes += stats.gc_passes;
        t.gc_relocated_bytes += stats.gc_relocated_bytes;
        t.gc_reclaimed_bytes += stats.gc_reclaimed_bytes;
        t.punches += sim.io_count_of(IoKind::Punch) - punches_before;
        Some(Crash {
            in_forced_gc: crashed_in_forced_gc,
            in_background_gc: sim.crashed() && sim.crash_thread().as_deref() == Some(GC_THREAD),
        })
    }

    /// Opens `STATES_PER_CRASH` post-crash images of `sim` (one in three also with its
    /// newest superblock slot lost) and judges each against the models; returns the last
    /// good one's database, states and storage, to carry on with.
    fn recover_crash_states(
        &mut self,
        where_: &str,
        sim: &SimStorage,
        models: &[KeyspaceModel],
        crash: Crash,
        t: &mut Tally,
    ) -> Option<(Database, Vec<State>, Arc<SimStorage>)> {
        let rng = &mut self.rng;
        let (names, replay) = (&self.names, self.replay);
        let mut next: Option<(Database, Vec<State>, Arc<SimStorage>)> = None;
        for state in 0..STATES_PER_CRASH {
            let where_ = format!("{where_} crash state {state}");
            let image = sim.crash_image(rng);
            let recovered = Arc::new(SimStorage::from_image(image.clone(), rng.random()));
            let members = self.members;
            t.crash_states += 1;
            if self.deferred {
                t.deferred_states += 1;
            }
            if crash.in_background_gc {
                t.gc_background_states += 1;
            } else if crash.in_forced_gc {
                t.gc_forced_states += 1;
            }
            if rng.random_range(0..3) == 0 {
                // The newest superblock slot of the crash image goes bad too: open must
                // fall back to the older slot's commit, and replaying its log from there
                // must give an allowed state too. This holds only if nothing that commit
                // reaches (nodes, segments, its replay window) was reused or punched
                // before the newer commit was durable: the two-commit delay of freeing.
                if let Some(image) = without_newest_slot(image) {
                    t.older_slot_states += 1;
                    let where_ = format!("{where_} (newest superblock slot lost)");
                    let older = Arc::new(SimStorage::from_image(image, 0));
                    let options = workload::options(false);
                    let outcome = catch(|| recover(&options, &older, members, names, models));
                    if matches!(
                        &outcome,
                        Ok((_, Recovery::Failed(Error::Corruption { what, .. }))) if *what == BUDDY
                    ) {
                        // A commit after the newest was under way: it writes its bitmap to
                        // the buddy the older commit uses (then its slot), as the design
                        // allows; nothing else of the older commit may change.
                        t.older_slot_superseded += 1;
                    } else if let Some((db, _)) = judge(t, &where_, replay, outcome) {
                        db.abandon();
                    }
                }
            }
            let outcome = catch(|| recover(&self.options, &recovered, members, names, models));
            if let Some((db, states)) = judge(t, &where_, replay, outcome) {
                // Carry on with the last good one; the others are closed as crashes.
                if let Some((old, _, _)) = next.replace((db, states, recovered)) {
                    old.abandon();
                }
            }
        }
        next
    }
}

fn run_case(seed: u64, case: u64, members: usize, t: &mut Tally) {
    let mut c = Case::draw(seed, case, members);
    let mut sim = Arc::new(SimStorage::new(c.rng.random()));
    let storage = members::volume(&sim, members).expect("members of a fresh volume");
    let mut db = workload::open(c.options.clone(), &storage).expect("create a fresh volume");
    let mut keyspaces: Vec<Keyspace> = c
        .names
        .iter()
        .map(|n| db.keyspace(n).expect("create a keyspace"))
        .collect();
    // Each creation commits; one more commit and the older superblock slot knows every
    // keyspace too (a state that falls back to it must still have them).
    db.commit().expect("commit the keyspaces");
    let mut models: Vec<KeyspaceModel> = c.names.iter().map(|_| KeyspaceModel::default()).collect();

    for life in 0..LIVES {
        let where_ = format!("power-loss seed {seed} case {case} life {life}");
        let Some(crash) = c.live(&where_, &sim, &db, &keyspaces, &mut models, t) else {
            return;
        };
        t.deferred_puts += db.stats().deferred_puts;
        db.abandon();
        drop(keyspaces);
        let Some((new_db, states, new_sim)) =
            c.recover_crash_states(&where_, &sim, &models, crash, t)
        else {
            return;
        };
        db = new_db;
        sim = new_sim;
        keyspaces = match c.names.iter().map(|n| db.open_keyspace(n)).collect() {
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

/// Where a life's crash is aimed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Aim {
    /// A random I/O of the next few, whoever makes it.
    AnyIo,
    /// A random I/O of a forced GC pass run at the crash step.
    ForcedGc,
    /// One of the next few I/Os of the background collector's thread.
    BackgroundGc,
}

/// `what` of the corruption error of a bitmap buddy.
const BUDDY: &str = "allocator bitmap buddy";

/// Opens a crash image and compares it with the models (`check` included).
fn recover(
    options: &tucana::Options,
    sim: &Arc<SimStorage>,
    members: usize,
    names: &[String],
    models: &[KeyspaceModel],
) -> (Option<Database>, Recovery) {
    let storage = match members::volume(sim, members) {
        Ok(storage) => storage,
        Err(e) => return (None, Recovery::Failed(e)),
    };
    match workload::open(options.clone(), &storage) {
        Ok(db) => {
            let r = workload::verify_recovered(&db, names, models);
            (Some(db), r)
        }
        Err(e) => (None, Recovery::Failed(e)),
    }
}

/// Tallies how a recovery went; returns the database and its states when it was good.
fn judge(
    t: &mut Tally,
    where_: &str,
    replay: &str,
    outcome: Result<(Option<Database>, Recovery), String>,
) -> Option<(Database, Vec<State>)> {
    match outcome {
        Err(p) => {
            t.panics += 1;
            t.failures.push(format!("{where_}: panic: {p}{replay}"));
        }
        Ok((Some(db), Recovery::Good(states))) => return Some((db, states)),
        Ok((db, failure)) => {
            if let Some(db) = db {
                db.abandon();
            }
            match failure {
                Recovery::LostDurable(m) => {
                    t.lost_durable += 1;
                    t.failures
                        .push(format!("{where_}: lost durable writes: {m}{replay}"));
                }
                Recovery::NonPrefix(m) => {
                    t.non_prefix += 1;
                    t.failures
                        .push(format!("{where_}: non-prefix state: {m}{replay}"));
                }
                Recovery::Failed(e) => {
                    t.failed_recoveries += 1;
                    t.failures
                        .push(format!("{where_}: recovery failed: {e}{replay}"));
                }
                Recovery::Good(_) => unreachable!("Good comes with a database"),
            }
        }
    }
    None
}

/// `image` with its newest valid superblock slot zeroed, if the other slot is valid too
/// (else there is no older commit to fall back to: `None`).
fn without_newest_slot(image: Image) -> Option<Image> {
    let sim = SimStorage::from_image(image, 0);
    let mut epochs = [None, None];
    for (slot, epoch) in epochs.iter_mut().enumerate() {
        let mut bytes = vec![0u8; BLOCK_BYTES as usize];
        if sim.read_at(slot as u64 * BLOCK_BYTES, &mut bytes).is_ok() {
            *epoch = Superblock::decode(&bytes, slot).ok().map(|sb| sb.epoch);
        }
    }
    let [Some(a), Some(b)] = epochs else {
        return None;
    };
    sim.zero_block(if a > b { 0 } else { 1 });
    Some(sim.current_image())
}
