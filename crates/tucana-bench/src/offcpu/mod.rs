//! Where a phase's time went (`--offcpu`): each thread's wall time split into running,
//! runnable (waiting for a CPU) and blocked, the wait channels its sleeps were sampled in,
//! and the data directory's device throughput and average queue depth over the phase.
//!
//! A [`PhaseSampler`] started with the phase reads every thread of this process
//! (`/proc/self/task/*`: `schedstat`, `stat`'s state, `wchan` when asleep) at the start,
//! then every [`SAMPLE_INTERVAL`] in a thread of its own, then at the end, and
//! `/proc/diskstats` at both ends. Per thread, run and runnable time are the growth of
//! its `schedstat` between the first and the last time it was seen, and blocked time is the
//! rest of that span, so threads that start or end within the phase (the clients, which
//! the phase joins before it stops) count over their own life. Threads are grouped by
//! name: the harness's clients (named [`CLIENT_THREAD_PREFIX`]…, the threads that issue the
//! operations: their blocked share is what the workload waited on), the engine's own
//! (everything else), minus the harness's main thread (idle in a join) and the sampler.
//! The engines run in this process, so each engine's phase measures that engine.
//!
//! Off unless [`enable`]d: a phase without it costs one atomic load. The sampler's own CPU
//! time is reported with its figures. Owns the sampling and the arithmetic; the kernel's
//! formats are `parse`'s, the layout of the figures `results` and `document`'s.
//! Thread-safe: one sampler thread per phase, joined by [`PhaseSampler::finish`].

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub mod parse;

/// How often the sampler looks at every thread's state and wait channel.
pub const SAMPLE_INTERVAL: Duration = Duration::from_millis(10);

/// The name the harness gives the threads that issue a phase's operations.
pub const CLIENT_THREAD_PREFIX: &str = "client-";

/// The sampler thread's name, left out of the figures.
const SAMPLER_THREAD_NAME: &str = "offcpu-sampler";

/// Wait channels listed per group of threads.
const TOP_WAITS: usize = 3;

/// `Some(device name or None)` once enabled.
static ENABLED: OnceLock<Option<String>> = OnceLock::new();

/// Turns the sampler on for every later phase; `device` is the data directory's block
/// device as `/proc/diskstats` names it ("vda"), `None` when it has none.
pub fn enable(device: Option<String>) {
    // A second call (tests) keeps the first; a run has one data directory.
    let _ = ENABLED.set(device);
}

/// One thread as the sampler saw it.
#[derive(Clone, Debug, Default)]
struct ThreadSeen {
    comm: String,
    first: Option<(Instant, parse::SchedStat)>,
    last: Option<(Instant, parse::SchedStat)>,
    /// Samples per state letter.
    states: HashMap<char, u64>,
    /// Samples asleep per (state, wait channel).
    waits: HashMap<(char, String), u64>,
}

/// Everything the sampler saw, by thread id.
#[derive(Default)]
struct Seen {
    threads: HashMap<u32, ThreadSeen>,
    /// Lines that did not parse (a thread that ended between two reads is not one).
    bad_lines: u64,
    first_error: Option<String>,
}

impl Seen {
    /// Reads every thread of this process once.
    fn sample(&mut self, buffer: &mut String) {
        let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
            return;
        };
        let now = Instant::now();
        for entry in dir.flatten() {
            let Some(tid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            let path = entry.path();
            // A thread may end between the directory read and these: skip it silently.
            let Some(stat) = self.parsed(&path.join("stat"), buffer, parse::task_stat) else {
                continue;
            };
            let Some(sched) = self.parsed(&path.join("schedstat"), buffer, parse::schedstat) else {
                continue;
            };
            let wait = if matches!(stat.state, 'S' | 'D') {
                self.parsed(&path.join("wchan"), buffer, parse::wchan)
                    .flatten()
            } else {
                None
            };
            let seen = self.threads.entry(tid).or_default();
            seen.comm = stat.comm;
            seen.first.get_or_insert((now, sched));
            seen.last = Some((now, sched));
            *seen.states.entry(stat.state).or_default() += 1;
            if let Some(wchan) = wait {
                *seen.waits.entry((stat.state, wchan)).or_default() += 1;
            }
        }
    }

    /// The file at `path` read into `buffer` and parsed by `parse`; `None` when it cannot
    /// be read (the thread ended) or does not parse (counted in `bad_lines`).
    fn parsed<T>(
        &mut self,
        path: &std::path::Path,
        buffer: &mut String,
        parse: fn(&str) -> Result<T, String>,
    ) -> Option<T> {
        match parse(read(path, buffer)?) {
            Ok(value) => Some(value),
            Err(error) => {
                self.bad_lines += 1;
                self.first_error.get_or_insert(error);
                None
            }
        }
    }
}

/// The file at `path` into `buffer`; `None` when it cannot be read (the thread ended).
fn read<'a>(path: &std::path::Path, buffer: &'a mut String) -> Option<&'a str> {
    buffer.clear();
    File::open(path).ok()?.read_to_string(buffer).ok()?;
    Some(buffer.as_str())
}

/// Started with a phase when the sampler is enabled; see the module documentation.
pub struct PhaseSampler {
    wall_start: Instant,
    disk_start: Option<parse::DiskStats>,
    device: Option<String>,
    stop: Arc<AtomicBool>,
    handle: JoinHandle<(Seen, Option<u32>)>,
}

impl PhaseSampler {
    /// `None` unless [`enable`] was called.
    pub fn start() -> Option<PhaseSampler> {
        let device = ENABLED.get()?.clone();
        let disk_start = device.as_deref().and_then(|name| read_diskstats(name).ok());
        let mut seen = Seen::default();
        seen.sample(&mut String::new());
        let stop = Arc::new(AtomicBool::new(false));
        let stop_flag = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name(SAMPLER_THREAD_NAME.to_string())
            .spawn(move || {
                let mut buffer = String::with_capacity(512);
                while !stop_flag.load(Ordering::Acquire) {
                    std::thread::sleep(SAMPLE_INTERVAL);
                    seen.sample(&mut buffer);
                }
                (seen, crate::sys::thread_id())
            })
            .ok()?;
        Some(PhaseSampler {
            wall_start: Instant::now(),
            disk_start,
            device,
            stop,
            handle,
        })
    }

    /// Stops the sampler, takes the last look and returns the phase's figures as JSON
    /// (see [`summarise`]).
    pub fn finish(self) -> Value {
        let wall = self.wall_start.elapsed();
        self.stop.store(true, Ordering::Release);
        let Ok((mut seen, sampler_tid)) = self.handle.join() else {
            return json!({ "error": "the sampler thread panicked" });
        };
        let sampler_cpu_ns = sampler_tid
            .and_then(|tid| seen.threads.get(&tid))
            .map_or(0, |t| thread_span(t).1);
        seen.sample(&mut String::new());
        let device = match (&self.device, &self.disk_start) {
            (Some(name), Some(start)) => read_diskstats(name)
                .map(|end| device_figures(start, &end, wall))
                .unwrap_or_else(|e| json!({ "error": e })),
            (Some(name), None) => json!({ "error": format!("no diskstats line for {name}") }),
            (None, _) => Value::Null,
        };
        let main_tid = std::process::id();
        let mut figures = summarise(&seen.threads, main_tid, sampler_tid, wall);
        figures["device"] = device;
        figures["sampler_cpu_s"] = json!(sampler_cpu_ns as f64 / 1e9);
        figures["sample_interval_ms"] = json!(SAMPLE_INTERVAL.as_millis() as u64);
        if seen.bad_lines > 0 {
            figures["bad_lines"] = json!(seen.bad_lines);
            figures["first_bad_line"] = json!(seen.first_error);
        }
        figures
    }
}

fn read_diskstats(name: &str) -> Result<parse::DiskStats, String> {
    let text =
        std::fs::read_to_string("/proc/diskstats").map_err(|e| format!("/proc/diskstats: {e}"))?;
    parse::diskstats_of(&text, name)
}

/// A thread's observed span, and its run and run-queue wait within it (ns).
fn thread_span(thread: &ThreadSeen) -> (u64, u64, u64) {
    match (thread.first, thread.last) {
        (Some((t0, s0)), Some((t1, s1))) => {
            let span = u64::try_from(t1.duration_since(t0).as_nanos()).unwrap_or(u64::MAX);
            let run = s1.run_ns.saturating_sub(s0.run_ns);
            let wait = s1.wait_ns.saturating_sub(s0.wait_ns);
            (span, run, wait)
        }
        _ => (0, 0, 0),
    }
}

/// Sums of a group of threads.
#[derive(Default)]
struct Group {
    threads: u64,
    span_ns: u64,
    run_ns: u64,
    wait_ns: u64,
    samples: u64,
    waits: HashMap<(char, String), u64>,
    names: Vec<String>,
}

impl Group {
    fn add(&mut self, thread: &ThreadSeen) {
        let (span, run, wait) = thread_span(thread);
        self.threads += 1;
        self.span_ns += span;
        self.run_ns += run;
        self.wait_ns += wait;
        self.samples += thread.states.values().sum::<u64>();
        for (key, count) in &thread.waits {
            *self.waits.entry(key.clone()).or_default() += count;
        }
        if !self.names.contains(&thread.comm) {
            self.names.push(thread.comm.clone());
        }
    }

    /// Run, runnable and blocked as fractions of the threads' summed spans (blocked is
    /// the rest, never below 0: schedstat and the clock are read a few µs apart), their
    /// seconds, and the most sampled wait channels as fractions of all samples.
    fn to_json(&self) -> Value {
        let span = self.span_ns.max(1) as f64;
        let blocked_ns = self.span_ns.saturating_sub(self.run_ns + self.wait_ns);
        let mut waits: Vec<(&(char, String), &u64)> = self.waits.iter().collect();
        waits.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
        let as_json = |((state, wchan), count): &(&(char, String), &u64)| {
            json!({
                "state": state.to_string(),
                "wchan": wchan,
                "frac": **count as f64 / self.samples.max(1) as f64,
            })
        };
        let top: Vec<Value> = waits.iter().take(TOP_WAITS).map(as_json).collect();
        // Idle background threads sleep in S most of the time; their D waits (I/O) are
        // the ones that say something.
        let top_d: Vec<Value> = waits
            .iter()
            .filter(|((state, _), _)| *state == 'D')
            .take(TOP_WAITS)
            .map(as_json)
            .collect();
        json!({
            "threads": self.threads,
            "names": self.names,
            "run_frac": (self.run_ns as f64 / span).min(1.0),
            "runnable_frac": (self.wait_ns as f64 / span).min(1.0),
            "blocked_frac": blocked_ns as f64 / span,
            "run_s": self.run_ns as f64 / 1e9,
            "runnable_s": self.wait_ns as f64 / 1e9,
            "blocked_s": blocked_ns as f64 / 1e9,
            "samples": self.samples,
            "top_waits": top,
            "top_d_waits": top_d,
        })
    }
}

/// The figures of `threads` (by id) over a phase of `wall`: `clients` and `engine` groups
/// (see the module documentation), the main thread and the sampler left out.
fn summarise(
    threads: &HashMap<u32, ThreadSeen>,
    main_tid: u32,
    sampler_tid: Option<u32>,
    wall: Duration,
) -> Value {
    let mut clients = Group::default();
    let mut engine = Group::default();
    let mut ids: Vec<&u32> = threads.keys().collect();
    ids.sort();
    for tid in ids {
        let thread = &threads[tid];
        if *tid == main_tid || Some(*tid) == sampler_tid || thread.comm == SAMPLER_THREAD_NAME {
            continue;
        }
        if thread.comm.starts_with(CLIENT_THREAD_PREFIX) {
            clients.add(thread);
        } else {
            engine.add(thread);
        }
    }
    json!({
        "wall_s": wall.as_secs_f64(),
        "clients": clients.to_json(),
        "engine": engine.to_json(),
    })
}

/// Device throughput over the phase (MB = 10^6 bytes), its busy share and average queue
/// depth (requests in flight, averaged over the wall time).
fn device_figures(start: &parse::DiskStats, end: &parse::DiskStats, wall: Duration) -> Value {
    let secs = wall.as_secs_f64().max(1e-9);
    let wall_ms = secs * 1e3;
    let bytes = |a: u64, b: u64| b.saturating_sub(a) as f64 * 512.0;
    json!({
        "name": end.name,
        "write_mb_s": bytes(start.sectors_written, end.sectors_written) / 1e6 / secs,
        "read_mb_s": bytes(start.sectors_read, end.sectors_read) / 1e6 / secs,
        "busy_frac": (end.io_ticks_ms.saturating_sub(start.io_ticks_ms) as f64 / wall_ms).min(1.0),
        "queue_depth": end.weighted_io_ms.saturating_sub(start.weighted_io_ms) as f64 / wall_ms,
    })
}

/// One terminal line of a phase's figures (empty without them).
pub fn describe(figures: &Value) -> String {
    if figures.is_null() {
        return String::new();
    }
    let pct = |v: &Value| {
        v.as_f64()
            .map_or("?".to_string(), |f| format!("{:.0}%", f * 100.0))
    };
    let group = |g: &Value, waits: Option<String>| {
        format!(
            "{} thr run {} runnable {} blocked {}{}",
            g["threads"],
            pct(&g["run_frac"]),
            pct(&g["runnable_frac"]),
            pct(&g["blocked_frac"]),
            waits.map_or(String::new(), |w| format!(" [{w}]"))
        )
    };
    let device = &figures["device"];
    let device_text = match (device["write_mb_s"].as_f64(), device["read_mb_s"].as_f64()) {
        (Some(w), Some(r)) => format!(
            "; device w {w:.0} MB/s r {r:.0} MB/s qd {:.1}",
            device["queue_depth"].as_f64().unwrap_or(f64::NAN)
        ),
        _ => String::new(),
    };
    format!(
        "where the time went: clients {}; engine {}{device_text}",
        group(&figures["clients"], top_waits(&figures["clients"], 2)),
        group(&figures["engine"], top_d_waits(&figures["engine"], 2)),
    )
}

/// "D folio_wait_bit_common 31%, S futex_wait_queue 12%": a group's `n` most sampled
/// wait channels, `None` when it slept nowhere.
pub fn top_waits(group: &Value, n: usize) -> Option<String> {
    list_waits(&group["top_waits"], n)
}

/// As [`top_waits`], for the group's uninterruptible (D) waits only.
pub fn top_d_waits(group: &Value, n: usize) -> Option<String> {
    list_waits(&group["top_d_waits"], n)
}

fn list_waits(waits: &Value, n: usize) -> Option<String> {
    let waits: Vec<String> = waits
        .as_array()?
        .iter()
        .take(n)
        .map(|w| {
            format!(
                "{} {} {:.0}%",
                w["state"].as_str().unwrap_or("?"),
                w["wchan"].as_str().unwrap_or("?"),
                w["frac"].as_f64().unwrap_or(0.0) * 100.0
            )
        })
        .collect();
    (!waits.is_empty()).then(|| waits.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(comm: &str, span_ms: u64, run_ms: u64, wait_ms: u64) -> ThreadSeen {
        let t0 = Instant::now();
        let ms = |m: u64| m * 1_000_000;
        let mut thread = ThreadSeen {
            comm: comm.to_string(),
            first: Some((
                t0,
                parse::SchedStat {
                    run_ns: 5,
                    wait_ns: 7,
                },
            )),
            last: Some((
                t0 + Duration::from_millis(span_ms),
                parse::SchedStat {
                    run_ns: 5 + ms(run_ms),
                    wait_ns: 7 + ms(wait_ms),
                },
            )),
            ..ThreadSeen::default()
        };
        thread.states.insert('R', 6);
        thread.states.insert('D', 3);
        thread.states.insert('S', 1);
        thread
            .waits
            .insert(('D', "folio_wait_bit_common".to_string()), 3);
        thread
            .waits
            .insert(('S', "futex_wait_queue".to_string()), 1);
        thread
    }

    #[test]
    fn time_splits_into_run_runnable_blocked_per_group() {
        let mut threads = HashMap::new();
        threads.insert(100, seen("tucana-bench", 1000, 1, 0)); // main: left out
        threads.insert(101, seen("client-0", 1000, 500, 100));
        threads.insert(102, seen("client-1", 1000, 300, 100));
        threads.insert(103, seen("flusher", 1000, 100, 0));
        threads.insert(104, seen(SAMPLER_THREAD_NAME, 1000, 50, 0));
        let figures = summarise(&threads, 100, None, Duration::from_secs(1));
        let clients = &figures["clients"];
        assert_eq!(clients["threads"], 2);
        assert!((clients["run_frac"].as_f64().unwrap() - 0.4).abs() < 1e-9);
        assert!((clients["runnable_frac"].as_f64().unwrap() - 0.1).abs() < 1e-9);
        assert!((clients["blocked_frac"].as_f64().unwrap() - 0.5).abs() < 1e-9);
        assert_eq!(clients["top_waits"][0]["wchan"], "folio_wait_bit_common");
        assert!((clients["top_waits"][0]["frac"].as_f64().unwrap() - 0.3).abs() < 1e-9);
        let engine = &figures["engine"];
        assert_eq!(engine["threads"], 1);
        assert_eq!(engine["names"][0], "flusher");
        assert_eq!(engine["top_d_waits"].as_array().unwrap().len(), 1);
        assert_eq!(
            top_d_waits(engine, 3).as_deref(),
            Some("D folio_wait_bit_common 30%")
        );
        assert!((engine["blocked_s"].as_f64().unwrap() - 0.9).abs() < 1e-9);
        let line = describe(&figures);
        assert!(
            line.contains("clients 2 thr run 40% runnable 10% blocked 50% [D folio_wait_bit_common 30%, S futex_wait_queue 10%]"),
            "{line}"
        );
    }

    #[test]
    fn a_thread_seen_once_counts_no_time() {
        let mut thread = seen("client-0", 0, 0, 0);
        thread.last = thread.first;
        assert_eq!(thread_span(&thread), (0, 0, 0));
        let figures = summarise(
            &HashMap::from([(7, thread)]),
            1,
            None,
            Duration::from_secs(1),
        );
        assert_eq!(figures["clients"]["blocked_frac"], 0.0);
    }

    #[test]
    fn device_queue_depth_is_weighted_time_over_wall_time() {
        let start = parse::DiskStats {
            name: "vda".into(),
            sectors_read: 0,
            sectors_written: 1000,
            io_ticks_ms: 100,
            weighted_io_ms: 1000,
        };
        let end = parse::DiskStats {
            sectors_written: 1000 + 3906,
            io_ticks_ms: 600,
            weighted_io_ms: 5000,
            ..start.clone()
        };
        let figures = device_figures(&start, &end, Duration::from_secs(2));
        assert!((figures["queue_depth"].as_f64().unwrap() - 2.0).abs() < 1e-9);
        assert!((figures["busy_frac"].as_f64().unwrap() - 0.25).abs() < 1e-9);
        assert!((figures["write_mb_s"].as_f64().unwrap() - 0.999_936).abs() < 1e-3);
        assert_eq!(figures["read_mb_s"], 0.0);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_threads_are_sampled() {
        let mut seen = Seen::default();
        let mut buffer = String::new();
        let handle = std::thread::Builder::new()
            .name(format!("{CLIENT_THREAD_PREFIX}t"))
            .spawn(|| std::thread::sleep(Duration::from_millis(300)))
            .unwrap();
        seen.sample(&mut buffer);
        std::thread::sleep(Duration::from_millis(50));
        seen.sample(&mut buffer);
        handle.join().unwrap();
        assert_eq!(seen.bad_lines, 0, "{:?}", seen.first_error);
        let client = seen
            .threads
            .values()
            .find(|t| t.comm == "client-t")
            .expect("the named thread is seen");
        assert_eq!(
            client.states.values().sum::<u64>(),
            2,
            "{:?}",
            client.states
        );
        assert!(thread_span(client).0 > 0);
    }
}
