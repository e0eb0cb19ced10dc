//! The background threads of an open database: the committer (flushes, commits, commit
//! pairs for garbage collection) and the garbage collector's loop.
//!
//! Owns: when each runs (ticks, wake-ups, the thresholds that make a commit due). Does not
//! own: what a commit or a GC step does (`crate::commit`, `crate::gc`).
//!
//! Thread-safety: each loop holds only a `Weak` reference between rounds, so dropping the
//! last handle ends it; `Engine::finish` stops and joins both. Errors poison the database
//! and end the loops; the next user call reports them.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::engine::Engine;
use crate::shared::DEFERRED_PUNCH_AGE;

/// How long foreground writes must have stopped before the committer commits early for
/// garbage collection's sake (`Collector::garbage_awaits_commit`): long enough that a
/// pipeline's pauses between batches do not count, short enough that a benchmark or a
/// client's burst that has ended has its garbage collected in the quiet after it.
const QUIET_COMMIT_AFTER: Duration = Duration::from_millis(200);

/// The least time between a commit and such an early one: a client writing a burst every
/// few hundred milliseconds gets at most one early commit a second (each writes the
/// index nodes its burst dirtied), not one per burst.
const QUIET_COMMIT_MIN_INTERVAL: Duration = Duration::from_secs(1);

/// Starts the committer and, with `gc`, the collector's thread, when the options time
/// anything (`Options::runs_background_threads`).
pub(crate) fn start(engine: &Arc<Engine>) {
    let opts = &engine.shared.options;
    if !opts.runs_background_threads() {
        return;
    }
    let weak = Arc::downgrade(engine);
    let handle = std::thread::Builder::new()
        .name("tucana-committer".into())
        .spawn(move || committer_loop(weak))
        .expect("spawn the background committer");
    engine.add_background(handle);
    if opts.gc {
        // Its own thread: a GC step and a commit (two fsyncs, often hundreds of
        // milliseconds under a burst) in one thread each held the other up, and GC
        // needs those commits to give space back.
        let weak = Arc::downgrade(engine);
        let handle = std::thread::Builder::new()
            .name("tucana-gc".into())
            .spawn(move || gc_loop(weak))
            .expect("spawn the background garbage collector");
        engine.add_background(handle);
    }
}

/// Flushes buffered writes every `flush_interval`, commits every `commit_interval` (when
/// there are changes, or space garbage collection freed waits for a commit), when
/// `commit_dirty_bytes` of log were written since the last commit, or sooner when GC
/// holds space only commits give back (`Collector::commit_due`), or once writes have
/// stopped for `QUIET_COMMIT_AFTER` and left garbage only a commit lets GC reach
/// (`Collector::garbage_awaits_commit`). Garbage collection
/// runs in a thread of its own (`gc_loop`).
fn committer_loop(engine: Weak<Engine>) {
    let mut last_commit = Instant::now();
    let mut last_flush = Instant::now();
    // When foreground writes last moved `Shared::foreground_bytes`.
    let mut last_foreground = (0u64, Instant::now());
    loop {
        let Some(engine) = engine.upgrade() else {
            return;
        };
        if engine.stopping() {
            return;
        }
        let opts = engine.shared.options.clone();
        let tick = [opts.flush_interval, opts.commit_interval]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(Duration::from_secs(1))
            .min(Duration::from_millis(100));
        engine.shared.wait_for_wake(tick);
        if engine.stopping() || engine.shared.is_poisoned() {
            return;
        }
        if !engine.shared.frees.lock().limbo.is_empty() {
            // Frees wait for readers' grace period, which only moves when threads pin;
            // an idle store has none, so nudge it.
            crossbeam_epoch::pin().flush();
        }
        if opts.gc && !engine.shared.frees.lock().releasable.is_empty() {
            // Give their bytes back now rather than at the next commit.
            engine.committer.release_frees_now();
        }
        let dirty = engine.shared.log_bytes_since_commit.load(Ordering::Relaxed);
        let since_commit = last_commit.elapsed();
        let foreground = engine.shared.foreground_bytes.load(Ordering::Relaxed);
        if foreground != last_foreground.0 {
            last_foreground = (foreground, Instant::now());
        }
        let quiet = last_foreground.1.elapsed() >= QUIET_COMMIT_AFTER;
        let commit_due = opts.commit_interval.is_some_and(|i| {
            (since_commit >= i
                && (dirty > 0
                    || (opts.gc
                        && engine
                            .collector
                            .wants_commit(&engine.regions, &engine.committer))))
                || (dirty > 0
                    && quiet
                    && since_commit >= QUIET_COMMIT_MIN_INTERVAL
                    && engine.collector.garbage_awaits_commit(&engine.regions))
        }) || dirty >= opts.commit_dirty_bytes;
        if opts.gc
            && opts.commit_interval.is_some()
            && engine.collector.commit_due(&engine.regions, since_commit)
        {
            // Errors poison the database; the next user call reports them.
            let _ = engine
                .collector
                .commit_pair(&engine.regions, &engine.committer);
            last_commit = Instant::now();
            last_flush = last_commit;
        } else if commit_due {
            // Errors poison the database; the next user call reports them.
            let _ = engine.commit();
            if opts.gc {
                // What the commit freed past its readers goes back now, not at the next
                // wake-up.
                engine.committer.release_frees_now();
            }
            last_commit = Instant::now();
            last_flush = last_commit;
        } else if opts
            .flush_interval
            .is_some_and(|i| last_flush.elapsed() >= i)
        {
            let _ = engine.sync();
            last_flush = Instant::now();
        }
    }
}

/// Runs a budgeted step of garbage collection every `Options::gc_tick`, or at once after
/// a step that stopped at its cap with work left (`Collector::background_step`).
fn gc_loop(engine: Weak<Engine>) {
    let tick = match engine.upgrade() {
        Some(engine) => engine.shared.options.gc_tick,
        None => return,
    };
    let mut behind = false;
    loop {
        if !behind {
            // `Engine::finish` unparks: no tick's wait to close.
            std::thread::park_timeout(tick);
        }
        let Some(engine) = engine.upgrade() else {
            return;
        };
        if engine.stopping() || engine.shared.is_poisoned() {
            return;
        }
        // Errors that matter poison the database; the next user call reports them.
        behind = engine
            .collector
            .background_step(&engine.regions)
            .unwrap_or(false);
        // Trims of segments freed at least that long ago, for members whose queues are
        // quiet or whose devices are short of space (`crate::trim`).
        engine.shared.schedule_trims(DEFERRED_PUNCH_AGE);
        // Segments it retired come back only through commits: let the committer judge now.
        engine.shared.wake_committer();
    }
}
