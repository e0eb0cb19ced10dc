//! Kill -9 of the real `tucana` binary on a real file, cycle after cycle (row M3 of
//! `docs/reliability.md`).
//!
//! Owns: the cycle loop. Each cycle spawns `tucana --db V crash-writer --seed S' [--gc]`,
//! reads its acknowledgements, kills it with SIGKILL at a random instant (during its open,
//! between calls, inside a sync, a commit or a forced GC pass), reopens the volume with
//! the library, checks the recovered contents against what was acknowledged
//! (`model::verify`), cross-checks `get` against the scan, runs `check()`, and closes; the
//! next cycle starts from the recovered state on the same volume. Does not own: the writer (`tucana-cli`,
//! `crash_writer.rs`) nor the rules (`model.rs`).
//!
//! A share of the cycles (`Config::gc_percent`, by the writer's seed) runs the writer in
//! its GC-heavy mode (`--gc`): garbage collection relocates, retires, commits in pairs and
//! punches all through its life, and three in ten of those cycles aim the kill into a
//! forced pass. Their writers report what their collector did (`gcstats`), summed in the
//! figures as evidence that the kills landed on a collector at work.
//!
//! Independently of that, a share of the cycles (`Config::deferred_percent`, by another
//! part of the writer's seed) runs the writer with every update deferred
//! (`--deferred-updates`): kills then land while acknowledged updates are in the log but
//! not yet in the index. Their writers report how many puts they deferred (`deferstats`).
//!
//! The driver is single-threaded apart from one thread per cycle that reads the writer's
//! stdout into a channel, so the kill can be timed while lines arrive.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use tucana::Database;

use crate::model::{self, GcStats, Session, State};
use crate::Rng;

/// What `run` needs.
pub struct Config {
    pub cycles: u64,
    pub seed: u64,
    /// Directory for the volume and the writer's stderr.
    pub dir: PathBuf,
    /// The `tucana` binary.
    pub tucana: PathBuf,
    /// Print a progress line every this many cycles (0: never).
    pub progress_every: u64,
    /// Percent of the cycles whose writer runs GC-heavy (`crash-writer --gc`).
    pub gc_percent: u64,
    /// Percent of the cycles whose writer defers every update (`--deferred-updates`).
    pub deferred_percent: u64,
}

/// The figures of a run.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    pub cycles: u64,
    pub lost_durable_writes: u64,
    pub non_prefix_states: u64,
    pub check_failures: u64,
    pub acked_ops: u64,
    /// Writes that had to survive, summed over cycles.
    pub durable_writes: u64,
    /// Kills that landed before the writer had opened the volume.
    pub kills_during_open: u64,
    /// Cycles whose last write was in flight when the kill came.
    pub kills_in_flight: u64,
    /// Cycles whose writer ran GC-heavy.
    pub gc_cycles: u64,
    /// GC-heavy cycles killed while a forced pass (`Database::gc`) was in flight.
    pub kills_in_forced_gc: u64,
    /// GC-heavy cycles whose writer reported relocated bytes before the kill.
    pub gc_cycles_relocating: u64,
    /// What the GC-heavy writers reported last before their kill, summed.
    pub gc: GcStats,
    /// Cycles whose writer deferred every update.
    pub deferred_cycles: u64,
    /// Puts those writers reported deferred before their kill, summed.
    pub deferred_puts: u64,
    /// The first failure, described.
    pub failure: Option<String>,
}

impl Summary {
    /// Counts what a killed writer's session shows: where the kill landed, and for a
    /// GC-heavy writer what its collector had done.
    fn count_session(&mut self, session: &Session, plan: CyclePlan) {
        let mode = plan.mode;
        if plan.deferred {
            self.deferred_cycles += 1;
            self.deferred_puts += session.deferred_puts.unwrap_or(0);
        }
        if !session.opened {
            self.kills_during_open += 1;
        }
        if session.in_flight.is_some() {
            self.kills_in_flight += 1;
        }
        if mode == Mode::Gc {
            self.gc_cycles += 1;
            if session.in_flight == Some(model::Op::Gc) {
                self.kills_in_forced_gc += 1;
            }
            if let Some(gc) = session.gc_stats {
                if gc.relocated_bytes > 0 {
                    self.gc_cycles_relocating += 1;
                }
                self.gc.passes += gc.passes;
                self.gc.relocated_bytes += gc.relocated_bytes;
                self.gc.reclaimed_bytes += gc.reclaimed_bytes;
            }
        }
        self.acked_ops += session.acked.len() as u64;
    }

    pub fn failed(&self) -> bool {
        self.lost_durable_writes + self.non_prefix_states + self.check_failures > 0
            || self.failure.is_some()
    }

    /// The figure line of row M3 in `docs/reliability.md`, with how much garbage
    /// collection the kills met.
    pub fn figure_line(&self, seed: u64) -> String {
        let mib = |bytes: u64| bytes as f64 / (1u64 << 20) as f64;
        format!(
            "M3 kill cycles: {}, lost durable writes: {}, non-prefix states: {}, check failures: {}, \
             gc cycles: {} (killed in a forced pass: {}, writers that relocated: {}, relocated {:.1} MiB, \
             reclaimed {:.1} MiB), deferred-update cycles: {} (puts deferred: {}), seed: {}",
            self.cycles,
            self.lost_durable_writes,
            self.non_prefix_states,
            self.check_failures,
            self.gc_cycles,
            self.kills_in_forced_gc,
            self.gc_cycles_relocating,
            mib(self.gc.relocated_bytes),
            mib(self.gc.reclaimed_bytes),
            self.deferred_cycles,
            self.deferred_puts,
            seed
        )
    }
}

/// How the writer of a cycle runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// The plain mix: a few hundred keys per keyspace, segments of 64 KiB to 2 MiB.
    Plain,
    /// `crash-writer --gc`: hot keys, 64 KiB segments, a busy collector, forced passes.
    Gc,
}

/// When to kill the writer.
#[derive(Clone, Copy, Debug)]
enum KillPlan {
    /// This long after spawning, whatever it is doing (often inside open).
    AfterTime(Duration),
    /// After this many acknowledgements, then this much longer.
    AfterAcks(u64, Duration),
    /// This long after the writer began its n-th forced GC pass (`Mode::Gc` only).
    InForcedGc(u64, Duration),
}

/// What a cycle does: printed with its failure, and replayed by its seed.
#[derive(Clone, Copy, Debug)]
struct CyclePlan {
    mode: Mode,
    /// The writer defers every update (`--deferred-updates`).
    deferred: bool,
    kill: KillPlan,
}

fn plan(rng: &mut Rng, mode: Mode, deferred: bool) -> CyclePlan {
    let kill = match mode {
        Mode::Plain => match rng.below(10) {
            0 => KillPlan::AfterTime(Duration::from_micros(rng.below(40_000))),
            _ => {
                // Mostly short runs keep cycles fast; a few long ones let commits, segment
                // switches and large values happen before the kill.
                let acks = match rng.below(10) {
                    0..=5 => rng.below(30),
                    6..=8 => rng.below(300),
                    _ => rng.below(3_000),
                };
                KillPlan::AfterAcks(acks, Duration::from_micros(rng.below(3_000)))
            }
        },
        // The collector is at work from the writer's open on (the volume it finds has dead
        // space); a forced pass comes every 60 ops or so and takes a few milliseconds, a
        // background step or commit pair every few. Runs as long as the plain mode's keep
        // the run's time where it was.
        Mode::Gc => match rng.below(20) {
            0 => KillPlan::AfterTime(Duration::from_micros(rng.below(40_000))),
            1..=6 => {
                KillPlan::InForcedGc(1 + rng.below(2), Duration::from_micros(rng.below(10_000)))
            }
            _ => {
                let acks = match rng.below(10) {
                    0..=5 => rng.below(100),
                    6..=8 => rng.below(400),
                    _ => rng.below(2_000),
                };
                KillPlan::AfterAcks(acks, Duration::from_micros(rng.below(3_000)))
            }
        },
    };
    CyclePlan {
        mode,
        deferred,
        kill,
    }
}

/// Reads complete lines until EOF; a torn last line (no newline) is dropped.
fn read_lines(stdout: impl Read, tx: mpsc::Sender<String>) {
    let mut reader = BufReader::new(stdout);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => return,
            Ok(_) if buf.last() != Some(&b'\n') => return,
            Ok(_) => {
                buf.pop();
                let line = String::from_utf8_lossy(&buf).into_owned();
                if tx.send(line).is_err() {
                    return;
                }
            }
        }
    }
}

/// Waits according to `plan`, collecting lines; returns false if the writer ended first.
fn wait_for_kill(
    plan: KillPlan,
    spawned: Instant,
    rx: &Receiver<String>,
    lines: &mut Vec<String>,
) -> bool {
    let mut acks = 0u64;
    let mut passes = 0u64;
    let mut deadline = match plan {
        KillPlan::AfterTime(after) => Some(spawned + after),
        KillPlan::AfterAcks(0, after) => Some(Instant::now() + after),
        KillPlan::AfterAcks(..) | KillPlan::InForcedGc(..) => None,
    };
    loop {
        let timeout = match deadline {
            Some(d) => match d.checked_duration_since(Instant::now()) {
                Some(left) => left,
                None => return true,
            },
            // A writer that stops acknowledging for this long is stuck: kill it anyway
            // (the verdict still applies).
            None => Duration::from_secs(30),
        };
        match rx.recv_timeout(timeout) {
            Ok(line) => {
                if line.starts_with("ack ") {
                    acks += 1;
                    if let KillPlan::AfterAcks(n, after) = plan {
                        if acks == n {
                            deadline = Some(Instant::now() + after);
                        }
                    }
                } else if line.starts_with("begin ") && line.ends_with(" gc") {
                    passes += 1;
                    if let KillPlan::InForcedGc(n, after) = plan {
                        if passes == n {
                            deadline = Some(Instant::now() + after);
                        }
                    }
                }
                lines.push(line);
            }
            Err(RecvTimeoutError::Timeout) => return true,
            Err(RecvTimeoutError::Disconnected) => return false,
        }
    }
}

fn read_state(db: &Database) -> Result<State, String> {
    let mut state = State::new();
    for name in db.keyspace_names() {
        let ks = db
            .open_keyspace(&name)
            .map_err(|e| format!("keyspace {name}: {e}"))?;
        let mut contents = model::Contents::new();
        for item in ks.range::<&[u8], _>(..) {
            let (key, value) = item.map_err(|e| format!("scan of {name}: {e}"))?;
            contents.insert(key, value);
        }
        // Point reads take another path through the index than scans: both must agree.
        for (key, value) in &contents {
            match ks.get(key) {
                Ok(Some(v)) if &v == value => {}
                other => {
                    return Err(format!(
                        "keyspace {name}: get({}) = {other:?} disagrees with the scan",
                        String::from_utf8_lossy(key)
                    ))
                }
            }
        }
        if ks.len() != contents.len() as u64 {
            return Err(format!(
                "keyspace {name}: len() = {} but the scan found {}",
                ks.len(),
                contents.len()
            ));
        }
        state.insert(name, contents);
    }
    Ok(state)
}

fn stderr_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

fn spawn(
    config: &Config,
    volume: &Path,
    seed: u64,
    plan: CyclePlan,
    stderr: &Path,
) -> Result<Child, String> {
    let stderr_file = std::fs::File::create(stderr)
        .map_err(|e| format!("cannot create {}: {e}", stderr.display()))?;
    let mut command = Command::new(&config.tucana);
    command
        .arg("--db")
        .arg(volume)
        .arg("crash-writer")
        .arg("--seed")
        .arg(seed.to_string());
    if plan.mode == Mode::Gc {
        command.arg("--gc");
    }
    if plan.deferred {
        command.arg("--deferred-updates");
    }
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr_file)
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", config.tucana.display()))
}

/// Runs the cycles; stops at the first failure (the volume stays in `config.dir`).
pub fn run(config: &Config) -> Summary {
    let mut summary = Summary::default();
    let volume = config.dir.join("kill9.tucana");
    let stderr = config.dir.join("writer-stderr.log");
    if let Err(e) = create_volume(&config.dir, &volume) {
        summary.failure = Some(e);
        return summary;
    }
    let mut rng = Rng::new(config.seed);
    let mut base = State::new();
    let started = Instant::now();
    for cycle in 0..config.cycles {
        let writer_seed = rng.next_u64();
        // By the writer's seed, so that a writer seed alone names the whole cycle.
        let mode = if writer_seed % 100 < config.gc_percent {
            Mode::Gc
        } else {
            Mode::Plain
        };
        // Another part of the seed, so that deferral falls on GC-heavy and plain cycles alike.
        let deferred = (writer_seed / 100) % 100 < config.deferred_percent;
        let plan = plan(&mut rng, mode, deferred);
        let fail = |summary: &mut Summary, what: String| {
            summary.failure = Some(format!(
                "cycle {cycle} (writer seed {writer_seed}, kill plan {plan:?}): {what}"
            ));
        };
        let session = match kill_writer(config, &volume, &stderr, writer_seed, plan) {
            Ok(session) => session,
            Err(e) => {
                fail(&mut summary, e);
                return summary;
            }
        };
        summary.count_session(&session, plan);
        match verify_cycle(&volume, &base, &session, &mut summary) {
            Ok(recovered) => base = recovered,
            Err(e) => {
                fail(&mut summary, e);
                return summary;
            }
        }
        summary.cycles += 1;
        if config.progress_every > 0 && summary.cycles % config.progress_every == 0 {
            eprintln!(
                "kill9: {} cycles, {} acknowledged ops, {:.1} s",
                summary.cycles,
                summary.acked_ops,
                started.elapsed().as_secs_f64()
            );
        }
    }
    summary
}

/// Creates `dir` and an empty volume in it, which must not exist yet.
fn create_volume(dir: &Path, volume: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    if volume.exists() {
        return Err(format!(
            "{} exists: give a fresh --dir (or delete it)",
            volume.display()
        ));
    }
    // The volume is created here, not by a writer that might die while creating it: open
    // refuses a non-empty file without a superblock (by design, see recovery/mod.rs).
    Database::open(volume)
        .and_then(Database::close)
        .map_err(|e| format!("cannot create {}: {e}", volume.display()))
}

/// Spawns the writer of one cycle, kills it as `plan` says and returns what it
/// acknowledged; `Err` if it could not run, ended by itself or printed nonsense.
fn kill_writer(
    config: &Config,
    volume: &Path,
    stderr: &Path,
    writer_seed: u64,
    plan: CyclePlan,
) -> Result<Session, String> {
    let mut child = spawn(config, volume, writer_seed, plan, stderr)?;
    let spawned = Instant::now();
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().expect("stdout is piped");
    let reader = std::thread::spawn(move || read_lines(stdout, tx));
    let mut lines = Vec::new();
    let alive = wait_for_kill(plan.kill, spawned, &rx, &mut lines);
    // std's Child::kill is SIGKILL on Unix: no handler, no flush, no unwinding.
    let _ = child.kill();
    let status = child.wait();
    lines.extend(rx.iter());
    let _ = reader.join();
    let killed = matches!(&status, Ok(s) if {
        use std::os::unix::process::ExitStatusExt;
        s.signal() == Some(libc::SIGKILL)
    });
    if !alive || !killed {
        return Err(format!(
            "the writer ended by itself ({status:?}); its stderr:\n{}",
            stderr_tail(stderr)
        ));
    }
    Session::from_lines(lines.iter().map(String::as_str))
        .map_err(|e| format!("bad writer output: {e}"))
}

/// Reopens the volume after a kill, checks what it holds against `base` and the
/// writer's `session` (counting violations and check failures in `summary`), runs
/// `check` and closes it; returns the recovered state, the next cycle's base.
fn verify_cycle(
    volume: &Path,
    base: &State,
    session: &Session,
    summary: &mut Summary,
) -> Result<State, String> {
    let db = Database::builder()
        .create_if_missing(false)
        .commit_interval(None)
        .flush_interval(None)
        .open(volume)
        .map_err(|e| {
            summary.check_failures += 1;
            format!("reopening after the kill failed: {e}")
        })?;
    let recovered = read_state(&db).map_err(|e| {
        summary.check_failures += 1;
        format!("reading the recovered volume: {e}")
    })?;
    match model::verify(base, session, &recovered) {
        Ok(found) => summary.durable_writes += found.durable as u64,
        Err(violation) => {
            match &violation {
                model::Violation::LostDurable { lost, .. } => {
                    summary.lost_durable_writes += *lost as u64
                }
                model::Violation::NonPrefix { .. } => summary.non_prefix_states += 1,
            }
            return Err(violation.to_string());
        }
    }
    let keys: u64 = recovered.values().map(|c| c.len() as u64).sum();
    match db.check() {
        Ok(report) if report.keys == keys => {}
        Ok(report) => {
            summary.check_failures += 1;
            return Err(format!(
                "check counts {} keys, the scans {keys}",
                report.keys
            ));
        }
        Err(e) => {
            summary.check_failures += 1;
            return Err(format!("check failed: {e}"));
        }
    }
    if let Err(e) = db.close() {
        summary.check_failures += 1;
        return Err(format!("closing after the check failed: {e}"));
    }
    Ok(recovered)
}
