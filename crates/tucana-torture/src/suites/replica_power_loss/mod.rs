//! Backup power loss (row M9 of `docs/reliability.md`): a primary in memory replicates
//! one or two keyspaces to a backup on the simulated volume, through a link that does
//! what the network shipper does (log bytes by segment order in chunks of random sizes,
//! then each commit's delta, or the newest commit in full when the backup may have missed
//! one); the primary runs a random workload (puts, overwrites, deletes, batches, syncs,
//! commits, forced GC passes; one case in four plans the drop of its second keyspace) and
//! the backup's power goes at a random I/O: while it writes shipped log, writes a shipped
//! commit's nodes and descriptor, writes that commit's superblock, commits or syncs on its
//! own, writes to a keyspace of its own (one case in three has one), or drops a replica.
//! One crash in two is aimed at a random I/O of applying shipped commits (node writes,
//! the backup's commit of each), the other at one of the next few I/Os, whoever makes it.
//!
//! Each crash gives several post-crash images (unsynced writes dropped, reordered, torn
//! at a sector), each reopened and judged (`verify`): it opens and passes `check`; each
//! replica holds a commit the primary shipped, no older than the last one whose `apply`
//! returned, with exactly the primary's contents at that commit; promoted, it holds that
//! commit's contents plus a prefix of the log received after it, no shorter than what
//! the backup had made durable (`link`'s module doc says what that is), no longer than
//! what was shipped. Then the backup carries on from the last good image: reattached, it
//! takes the primary's newest commit in full and the log it lacks, must then equal the
//! primary at that commit, and the next life crashes it again (up to three lives per
//! case).
//!
//! Owns: the cases, their lives and the tally. Does not own: the primary and the link
//! (`link`), the judgement of a crash state (`verify`), the simulated volume (`sim`).
//!
//! `count` is the number of crash states to reach. Neither database runs background
//! threads, so `--case` replays a case exactly.
//!
//! Thread-safety: single-threaded.

mod link;
mod verify;

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::Rng;
use tucana::volume::Storage;
use tucana::{Database, Keyspace};

use crate::model::KeyspaceModel;
use crate::sim::{Fault, Image, SimStorage};
use crate::workload::{self, Mix, Op};
use crate::{case_rng, catch, Report, RunArgs};
use link::{Dropped, Link, Phase};
use verify::Broken;

const LIVES: u32 = 3;
const STATES_PER_CRASH: u32 = 3;
/// The backup's keyspace of its own, in the cases that have one.
const OWN: &str = "own";

/// Phases in the order the figures line names them.
const PHASES: [Phase; 6] = [
    Phase::Idle,
    Phase::Log,
    Phase::ApplyWrites,
    Phase::ApplySuperblock,
    Phase::Backup,
    Phase::Drop,
];

#[derive(Default)]
struct Tally {
    cases: u64,
    crash_states: u64,
    /// Crash states by the phase the power went in (`PHASES` order).
    by_phase: [u64; PHASES.len()],
    lost_commits: u64,
    wrong_commits: u64,
    lost_log: u64,
    non_prefix: u64,
    failed_recoveries: u64,
    panics: u64,
    deltas_applied: u64,
    full_applied: u64,
    log_bytes: u64,
    log_writes: u64,
    /// The primary's GC passes and the bytes they relocated.
    gc_passes: u64,
    gc_relocated_bytes: u64,
    promotions: u64,
    promotions_replaying: u64,
    promotions_log_bound: u64,
    resumed_lives: u64,
    failures: Vec<String>,
}

pub fn run(args: &RunArgs) -> Report {
    let mut t = Tally::default();
    let mut case = args.case.unwrap_or(0);
    loop {
        let before = t.crash_states;
        t.cases += 1;
        let where_ = format!("replica-power-loss seed {} case {case}", args.seed);
        if let Err(p) = catch(|| run_case(args.seed, case, &mut t)) {
            t.panics += 1;
            t.failures.push(format!("{where_}: panic: {p}"));
        }
        if args.verbose {
            eprintln!("{where_}: {} crash states", t.crash_states - before);
        }
        if args.case.is_some() || t.crash_states >= args.count {
            break;
        }
        case += 1;
    }
    let p = &t.by_phase;
    Report {
        figures: format!(
            "M9 cases: {}, crash states: {} (between calls {}, writing shipped log {}, a shipped commit's nodes and descriptor {}, its superblock {}, the backup's own commits, syncs and writes {}, replica drops {}), lost durable commits: {}, wrong commits: {}, lost durable log: {}, non-prefix states: {}, failed recoveries: {}, panics: {}, commits applied: {} (in full: {}), log shipped: {} KiB in {} writes, primary gc passes: {} (relocated {} KiB), promotions: {} (replaying log: {}, bounded by durable log: {}), resumed lives: {}, seed: {}",
            t.cases,
            t.crash_states,
            p[0],
            p[1],
            p[2],
            p[3],
            p[4],
            p[5],
            t.lost_commits,
            t.wrong_commits,
            t.lost_log,
            t.non_prefix,
            t.failed_recoveries,
            t.panics,
            t.deltas_applied,
            t.full_applied,
            t.log_bytes >> 10,
            t.log_writes,
            t.gc_passes,
            t.gc_relocated_bytes >> 10,
            t.promotions,
            t.promotions_replaying,
            t.promotions_log_bound,
            t.resumed_lives,
            args.seed
        ),
        failures: t.failures,
    }
}

/// The backup: its simulated volume, its database and its own keyspace with its model.
struct Backup {
    sim: Arc<SimStorage>,
    db: Database,
    own: Option<(Keyspace, KeyspaceModel)>,
}

/// One step of a life.
#[derive(Debug)]
enum Action {
    Primary(Op),
    /// Ship the log the backup lacks.
    Ship,
    /// Ship the log, then apply the commits the backup lacks.
    Apply,
    /// `Database::sync` on the backup.
    Sync,
    /// `Database::commit` on the backup.
    Commit,
    /// An operation on the backup's own keyspace.
    Own(Op),
    /// The primary drops its second keyspace; the backup its replica.
    Drop,
}

/// What a case draws at its start and carries through its lives.
struct Case {
    rng: StdRng,
    mix: Mix,
    names: Vec<String>,
    own: bool,
    /// Life and step at which the primary drops its second keyspace.
    drop_at: Option<(u32, u32)>,
    /// Operations so far (values are tagged with it).
    tag: u64,
}

impl Case {
    fn draw(seed: u64, case: u64) -> Case {
        let mut rng = case_rng(seed, case);
        let mix = if rng.random_bool(0.5) {
            Mix::GC
        } else {
            Mix::PLAIN
        };
        let keyspaces = rng.random_range(1..=2usize);
        let own = rng.random_range(0..3) == 0;
        let drop_at = (keyspaces == 2 && rng.random_bool(0.5))
            .then(|| (rng.random_range(0..LIVES), rng.random_range(0..60)));
        Case {
            rng,
            mix,
            names: (0..keyspaces).map(|i| format!("r{i}")).collect(),
            own,
            drop_at,
            tag: 0,
        }
    }

    fn draw_action(&mut self, life: u32, step: u32) -> Action {
        if self.drop_at == Some((life, step)) {
            return Action::Drop;
        }
        let rng = &mut self.rng;
        match rng.random_range(0..100) {
            0..55 => {}
            55..67 => return Action::Ship,
            67..84 => return Action::Apply,
            84..88 => return Action::Sync,
            88..91 => return Action::Commit,
            _ if self.own => {
                return Action::Own(workload::random_op_of(rng, Mix::PLAIN, 1, self.tag))
            }
            _ => {}
        }
        Action::Primary(workload::random_op_of(
            rng,
            self.mix,
            self.names.len(),
            self.tag,
        ))
    }

    fn act(&mut self, action: Action, link: &mut Link, b: &mut Backup) -> tucana::Result<()> {
        match action {
            Action::Primary(op) => link.run_primary(op),
            Action::Ship => link.ship(&b.db, &b.sim, &mut self.rng),
            Action::Apply => link.apply(&b.db, &b.sim, &mut self.rng),
            Action::Sync | Action::Commit => {
                link.enter_backup_work(&b.sim);
                if matches!(action, Action::Sync) {
                    b.db.sync()?;
                } else {
                    b.db.commit()?;
                }
                link.backup_durable();
                Ok(())
            }
            Action::Own(op) => {
                link.enter_backup_work(&b.sim);
                let (ks, model) = b.own.as_mut().expect("a case with its own keyspace");
                let r = workload::run_op(
                    &op,
                    &b.db,
                    std::slice::from_ref(ks),
                    std::slice::from_mut(model),
                );
                if r.is_ok() && matches!(op, Op::Sync | Op::Commit | Op::Gc) {
                    link.backup_durable();
                }
                r
            }
            Action::Drop => link.drop_keyspace(1, &b.db, &b.sim),
        }
    }

    /// Runs one life until the backup's power goes (or its steps run out: then the
    /// power goes after the last); the phase it went in, or `None` if something failed
    /// with no fault injected.
    fn live(
        &mut self,
        where_: &str,
        life: u32,
        link: &mut Link,
        b: &mut Backup,
        t: &mut Tally,
    ) -> Option<Phase> {
        let steps = self.rng.random_range(20..160u32);
        let crash_step = self.rng.random_range(0..steps);
        let aim_apply = self.rng.random_bool(0.5);
        let mut crash_io = None;
        for step in 0..steps {
            self.tag += 1;
            let mut action = self.draw_action(life, step);
            if step == crash_step && aim_apply {
                // At one of the I/Os of applying commits, once their log is shipped; the
                // primary commits first, so there is one to apply.
                if let Err(e) = link.run_primary(Op::Commit) {
                    t.failures
                        .push(format!("{where_} step {step}: the primary's commit: {e}"));
                    return None;
                }
                action = Action::Apply;
                link.aim_in_commits = true;
            } else if step == crash_step {
                let at_io = b.sim.io_count() + self.rng.random_range(0..40);
                b.sim.arm(Fault::Crash { at_io });
                crash_io = Some(at_io);
            }
            let what = format!("{action:?}");
            let r = self.act(action, link, b);
            if b.sim.crashed() {
                break;
            }
            if let Err(e) = r {
                let what: String = what.chars().take(120).collect();
                t.failures.push(format!(
                    "{where_} step {step}: {what} failed with no fault injected: {e}"
                ));
                return None;
            }
        }
        let crashed = b.sim.crashed();
        b.sim.disarm();
        link.aim_in_commits = false;
        crash_io = crash_io.or(link.armed_at.take());
        Some(link.crash_phase(&b.sim, crash_io.filter(|_| crashed)))
    }

    /// Judges `STATES_PER_CRASH` post-crash images of the backup; returns the backup
    /// reopened from the last good one, to carry on with if `carry_on`.
    fn recover(
        &mut self,
        where_: &str,
        link: &mut Link,
        b: Backup,
        phase: Phase,
        carry_on: bool,
        t: &mut Tally,
    ) -> Option<Backup> {
        let Backup { sim, db, own } = b;
        let own_model = own.map(|(ks, model)| {
            drop(ks);
            model
        });
        db.abandon();
        let options = workload::options(false);
        let phase_index = PHASES.iter().position(|p| *p == phase).expect("a phase");
        let mut resume_from: Option<Image> = None;
        for state in 0..STATES_PER_CRASH {
            let where_ = format!("{where_} crash state {state} ({phase:?})");
            let image = sim.crash_image(&mut self.rng);
            let storage: Arc<dyn Storage> =
                Arc::new(SimStorage::from_image(image.clone(), self.rng.random()));
            t.crash_states += 1;
            t.by_phase[phase_index] += 1;
            let own = own_model.as_ref().map(|m| (OWN, m));
            match catch(|| verify::judge(&options, &storage, link, own)) {
                Err(p) => {
                    t.panics += 1;
                    t.failures.push(format!("{where_}: panic: {p}"));
                }
                Ok(Err((wrong, m))) => {
                    *match wrong {
                        Broken::LostCommit => &mut t.lost_commits,
                        Broken::WrongCommit => &mut t.wrong_commits,
                        Broken::LostLog => &mut t.lost_log,
                        Broken::NonPrefix => &mut t.non_prefix,
                        Broken::Failed => &mut t.failed_recoveries,
                    } += 1;
                    t.failures.push(format!("{where_}: {wrong:?}: {m}"));
                }
                Ok(Ok(good)) => {
                    t.promotions += good.promotions;
                    t.promotions_replaying += good.replayed;
                    t.promotions_log_bound += good.log_bound;
                    resume_from = Some(image);
                }
            }
        }
        let image = resume_from.filter(|_| carry_on)?;
        match resume(link, image, &mut self.rng, own_model.is_some()) {
            Ok(b) => {
                t.resumed_lives += 1;
                Some(b)
            }
            Err(e) => {
                t.failed_recoveries += 1;
                t.failures.push(format!(
                    "{where_}: reopening the backup to carry on, and catching up: {e}"
                ));
                None
            }
        }
    }
}

/// The backup reopened from `image` (judged good) to carry on: committed at once (the
/// recovered state is the durable base of the next life), a replica drop under way done
/// again, each replica's link reset to what the reopened replica holds; then caught up
/// (the log it lacks, the primary's newest commit in full) and compared with the primary.
fn resume(link: &mut Link, image: Image, rng: &mut StdRng, own: bool) -> Result<Backup, String> {
    let sim = Arc::new(SimStorage::from_image(image, rng.random()));
    let storage: Arc<dyn Storage> = sim.clone();
    let db = workload::open(workload::options(false), &storage).map_err(|e| e.to_string())?;
    match catch_up(link, &db, &sim, rng, own) {
        Ok(own) => Ok(Backup { sim, db, own }),
        Err(e) => {
            db.abandon();
            Err(e)
        }
    }
}

/// `resume`'s work on the reopened backup; returns its own keyspace with a model that
/// starts from what it holds.
fn catch_up(
    link: &mut Link,
    db: &Database,
    sim: &SimStorage,
    rng: &mut StdRng,
    own: bool,
) -> Result<Option<(Keyspace, KeyspaceModel)>, String> {
    let text = |e: tucana::Error| e.to_string();
    db.check().map_err(text)?;
    for i in 0..link.keyspaces.len() {
        match link.keyspaces[i].dropped {
            Dropped::No => {
                let name = &link.keyspaces[i].name;
                let Some(replica) = db.open_replica(name) else {
                    return Err(format!("replica {name} is gone"));
                };
                link.keyspaces[i].resume_at(replica.state().upstream_epoch);
            }
            Dropped::Attempted => link.drop_replica(i, db, sim).map_err(text)?,
            Dropped::Durably => {}
        }
    }
    link.apply(db, sim, rng).map_err(text)?;
    verify::caught_up(db, link).map_err(|(b, m)| format!("{b:?}: {m}"))?;
    if !own {
        return Ok(None);
    }
    let ks = db.open_keyspace(OWN).map_err(text)?;
    let state = workload::read_state(&ks).map_err(text)?;
    Ok(Some((ks, KeyspaceModel::new(state))))
}

fn run_case(seed: u64, case: u64, t: &mut Tally) {
    let mut c = Case::draw(seed, case);
    let sim = Arc::new(SimStorage::new(c.rng.random()));
    let storage: Arc<dyn Storage> = sim.clone();
    let db = workload::open(workload::options(false), &storage).expect("create the backup");
    let own = c.own.then(|| {
        let ks = db.keyspace(OWN).expect("create the backup's own keyspace");
        (ks, KeyspaceModel::default())
    });
    let mut link = Link::new(&c.names, &db).expect("create the primary and the replicas");
    let mut backup = Some(Backup { sim, db, own });
    for life in 0..LIVES {
        let Some(mut b) = backup.take() else {
            break;
        };
        let where_ = format!("replica-power-loss seed {seed} case {case} life {life}");
        let Some(phase) = c.live(&where_, life, &mut link, &mut b, t) else {
            b.db.abandon();
            break;
        };
        backup = c.recover(&where_, &mut link, b, phase, life + 1 < LIVES, t);
    }
    if let Some(b) = backup {
        b.db.abandon();
    }
    let s = &link.stats;
    t.deltas_applied += s.deltas_applied;
    t.full_applied += s.full_applied;
    t.log_bytes += s.log_bytes;
    t.log_writes += s.log_writes;
    let (passes, relocated) = link.primary_gc();
    t.gc_passes += passes;
    t.gc_relocated_bytes += relocated;
}
