//! M3: kill -9 of the real `tucana` binary on a real file, cycle after cycle.
//!
//! Owns: the cycle loop. Each cycle spawns `tucana --db V crash-writer --seed S'`, reads
//! its acknowledgements, kills it with SIGKILL at a random instant (during its open,
//! between calls, inside a sync or a commit), reopens the volume with the library, checks
//! the recovered contents against what was acknowledged (`model::verify`), cross-checks
//! `get` against the scan, runs `check()`, and closes; the next cycle starts from the
//! recovered state on the same volume. Does not own: the writer (`tucana-cli`,
//! `crash_writer.rs`) nor the rules (`model.rs`).
//!
//! The driver is single-threaded apart from one thread per cycle that reads the writer's
//! stdout into a channel, so the kill can be timed while lines arrive.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use tucana::Database;

use crate::model::{self, Session, State};
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
    /// The first failure, described.
    pub failure: Option<String>,
}

impl Summary {
    pub fn failed(&self) -> bool {
        self.lost_durable_writes + self.non_prefix_states + self.check_failures > 0
            || self.failure.is_some()
    }

    /// The figure line of RELIABILITY.md.
    pub fn figure_line(&self, seed: u64) -> String {
        format!(
            "M3 kill cycles: {}, lost durable writes: {}, non-prefix states: {}, check failures: {}, seed: {}",
            self.cycles, self.lost_durable_writes, self.non_prefix_states, self.check_failures, seed
        )
    }
}

/// When to kill the writer.
#[derive(Clone, Copy, Debug)]
enum KillPlan {
    /// This long after spawning, whatever it is doing (often inside open).
    AfterTime(Duration),
    /// After this many acknowledgements, then this much longer.
    AfterAcks(u64, Duration),
}

fn plan(rng: &mut Rng) -> KillPlan {
    match rng.below(10) {
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
    let mut deadline = match plan {
        KillPlan::AfterTime(after) => Some(spawned + after),
        KillPlan::AfterAcks(0, after) => Some(Instant::now() + after),
        KillPlan::AfterAcks(..) => None,
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

fn spawn(config: &Config, volume: &Path, seed: u64, stderr: &Path) -> Result<Child, String> {
    let stderr_file = std::fs::File::create(stderr)
        .map_err(|e| format!("cannot create {}: {e}", stderr.display()))?;
    Command::new(&config.tucana)
        .arg("--db")
        .arg(volume)
        .arg("crash-writer")
        .arg("--seed")
        .arg(seed.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr_file)
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", config.tucana.display()))
}

/// Runs the cycles; stops at the first failure (the volume stays in `config.dir`).
pub fn run(config: &Config) -> Summary {
    let mut summary = Summary::default();
    if let Err(e) = std::fs::create_dir_all(&config.dir) {
        summary.failure = Some(format!("cannot create {}: {e}", config.dir.display()));
        return summary;
    }
    let volume = config.dir.join("kill9.tucana");
    let stderr = config.dir.join("writer-stderr.log");
    if volume.exists() {
        summary.failure = Some(format!(
            "{} exists: give a fresh --dir (or delete it)",
            volume.display()
        ));
        return summary;
    }
    // The volume is created here, not by a writer that might die while creating it: open
    // refuses a non-empty file without a superblock (by design, see recovery/mod.rs).
    if let Err(e) = Database::open(&volume).and_then(Database::close) {
        summary.failure = Some(format!("cannot create {}: {e}", volume.display()));
        return summary;
    }
    let mut rng = Rng::new(config.seed);
    let mut base = State::new();
    let started = Instant::now();
    for cycle in 0..config.cycles {
        let writer_seed = rng.next_u64();
        let plan = plan(&mut rng);
        let fail = |summary: &mut Summary, what: String| {
            summary.failure = Some(format!(
                "cycle {cycle} (writer seed {writer_seed}, kill plan {plan:?}): {what}"
            ));
        };
        let mut child = match spawn(config, &volume, writer_seed, &stderr) {
            Ok(child) => child,
            Err(e) => {
                fail(&mut summary, e);
                return summary;
            }
        };
        let spawned = Instant::now();
        let (tx, rx) = mpsc::channel();
        let stdout = child.stdout.take().expect("stdout is piped");
        let reader = std::thread::spawn(move || read_lines(stdout, tx));
        let mut lines = Vec::new();
        let alive = wait_for_kill(plan, spawned, &rx, &mut lines);
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
            fail(
                &mut summary,
                format!(
                    "the writer ended by itself ({status:?}); its stderr:\n{}",
                    stderr_tail(&stderr)
                ),
            );
            return summary;
        }
        let session = match Session::from_lines(lines.iter().map(String::as_str)) {
            Ok(s) => s,
            Err(e) => {
                fail(&mut summary, format!("bad writer output: {e}"));
                return summary;
            }
        };
        if !session.opened {
            summary.kills_during_open += 1;
        }
        if session.in_flight.is_some() {
            summary.kills_in_flight += 1;
        }
        summary.acked_ops += session.acked.len() as u64;
        let db = match Database::builder()
            .create_if_missing(false)
            .commit_interval(None)
            .flush_interval(None)
            .open(&volume)
        {
            Ok(db) => db,
            Err(e) => {
                summary.check_failures += 1;
                fail(
                    &mut summary,
                    format!("reopening after the kill failed: {e}"),
                );
                return summary;
            }
        };
        let recovered = match read_state(&db) {
            Ok(state) => state,
            Err(e) => {
                summary.check_failures += 1;
                fail(&mut summary, format!("reading the recovered volume: {e}"));
                return summary;
            }
        };
        match model::verify(&base, &session, &recovered) {
            Ok(found) => summary.durable_writes += found.durable as u64,
            Err(violation) => {
                match &violation {
                    model::Violation::LostDurable { lost, .. } => {
                        summary.lost_durable_writes += *lost as u64
                    }
                    model::Violation::NonPrefix { .. } => summary.non_prefix_states += 1,
                }
                fail(&mut summary, violation.to_string());
                return summary;
            }
        }
        let keys: u64 = recovered.values().map(|c| c.len() as u64).sum();
        match db.check() {
            Ok(report) if report.keys == keys => {}
            Ok(report) => {
                summary.check_failures += 1;
                fail(
                    &mut summary,
                    format!("check counts {} keys, the scans {keys}", report.keys),
                );
                return summary;
            }
            Err(e) => {
                summary.check_failures += 1;
                fail(&mut summary, format!("check failed: {e}"));
                return summary;
            }
        }
        if let Err(e) = db.close() {
            summary.check_failures += 1;
            fail(&mut summary, format!("closing after the check failed: {e}"));
            return summary;
        }
        base = recovered;
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
