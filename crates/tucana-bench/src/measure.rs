//! Measurement: wall time, process CPU time and per-operation latency of one phase.
//!
//! A phase starts a [`PhaseTimer`], every worker thread records into its own
//! [`Latencies`] (no sharing, no locks on the hot path), and the timer's `finish` merges
//! them into a [`Measurement`]. Owns no engine and prints nothing.
//!
//! What the numbers include: CPU time is the whole process's (engine background threads,
//! but also the benchmark's own key generation and value checks); latencies are taken
//! with two `Instant::now()` calls around each operation (a few tens of ns each), which
//! matters only for the cheapest operations such as one step of a scan. I/O is counted
//! twice: this process's storage-layer bytes (/proc/self/io, exact but blind to what an
//! engine's writeback costs the device beyond the page) and the data directory's block
//! device (every process on it, so other work on the machine shows up). Peak RSS is reset
//! at the start of each phase, so it is the phase's own peak. With `--offcpu` a phase also
//! runs module `offcpu`'s sampler (where the time went: running, runnable, blocked).

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::{offcpu, sys};

/// Latencies above this are recorded as this; an hour-long operation is a hang, not a
/// latency worth resolving.
const LATENCY_MAX_NS: u64 = 3_600_000_000_000;

/// Three significant digits: 0.1% error on any percentile.
const LATENCY_SIGNIFICANT_DIGITS: u8 = 3;

/// One thread's latency samples, in nanoseconds.
pub struct Latencies {
    histogram: Histogram<u64>,
}

impl Latencies {
    pub fn new() -> Latencies {
        let histogram = Histogram::new_with_bounds(1, LATENCY_MAX_NS, LATENCY_SIGNIFICANT_DIGITS)
            .expect("constant histogram bounds are valid");
        Latencies { histogram }
    }

    pub fn record(&mut self, latency: Duration) {
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        // A sub-nanosecond reading is still one operation; clamp it into range.
        self.histogram.saturating_record(ns.max(1));
    }

    /// Times `op` and records its latency.
    #[inline]
    pub fn time<T>(&mut self, op: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let result = op();
        self.record(start.elapsed());
        result
    }

    pub fn count(&self) -> u64 {
        self.histogram.len()
    }

    fn merge(&mut self, other: &Latencies) {
        self.histogram
            .add(&other.histogram)
            .expect("histograms with the same bounds always add");
    }
}

/// Spawns a phase's client thread number `thread` in `scope`, named so that module
/// `offcpu` tells the threads issuing the operations from the engine's own.
pub fn spawn_client<'scope, T: Send + 'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    thread: usize,
    body: impl FnOnce() -> T + Send + 'scope,
) -> std::thread::ScopedJoinHandle<'scope, T> {
    std::thread::Builder::new()
        .name(format!("{}{thread}", offcpu::CLIENT_THREAD_PREFIX))
        .spawn_scoped(scope, body)
        // As `Scope::spawn`, which panics the same way when the OS refuses a thread.
        .expect("failed to spawn a client thread")
}

/// The block device whose statistics every phase reads: set once, from the data directory.
static DEVICE_STAT: OnceLock<PathBuf> = OnceLock::new();

/// Makes every later phase also count the I/O of the device holding `dir`; returns the
/// device's description, or `None` when it has no block-device statistics.
pub fn watch_device_of(dir: &std::path::Path) -> Option<String> {
    let (stat, name) = sys::device_stat_path(dir)?;
    // A second call (tests) keeps the first device; every run uses one data directory.
    let _ = DEVICE_STAT.set(stat);
    Some(sys::device_description(&name))
}

fn device_io() -> Option<sys::ProcessIo> {
    sys::device_io(DEVICE_STAT.get()?)
}

/// The watched device's bytes read and written so far (for phases timed elsewhere, such
/// as another process's work).
pub fn device_io_now() -> Option<sys::ProcessIo> {
    device_io()
}

/// Bytes moved during a phase, as seen by the process and by the device.
#[derive(Clone, Copy, Debug, Default)]
pub struct IoDelta {
    pub process: Option<sys::ProcessIo>,
    pub device: Option<sys::ProcessIo>,
}

fn delta(before: Option<sys::ProcessIo>, after: Option<sys::ProcessIo>) -> Option<sys::ProcessIo> {
    let (before, after) = (before?, after?);
    Some(sys::ProcessIo {
        read_bytes: after.read_bytes.saturating_sub(before.read_bytes),
        write_bytes: after.write_bytes.saturating_sub(before.write_bytes),
    })
}

/// Started just before a phase's first operation.
pub struct PhaseTimer {
    wall_start: Instant,
    cpu_start: Duration,
    process_io_start: Option<sys::ProcessIo>,
    device_io_start: Option<sys::ProcessIo>,
    peak_rss_reset: bool,
    /// Where the time went (`--offcpu`), when enabled.
    offcpu: Option<offcpu::PhaseSampler>,
}

impl PhaseTimer {
    pub fn start() -> PhaseTimer {
        let peak_rss_reset = sys::reset_peak_rss();
        let offcpu = offcpu::PhaseSampler::start();
        PhaseTimer {
            offcpu,
            process_io_start: sys::process_io(),
            device_io_start: device_io(),
            peak_rss_reset,
            cpu_start: sys::process_cpu_time(),
            wall_start: Instant::now(),
        }
    }

    /// Stops the clocks; `ops` is the number of operations the phase did, `per_thread` the
    /// latencies its threads recorded.
    pub fn finish(self, ops: u64, per_thread: &[Latencies]) -> Measurement {
        let elapsed = self.wall_start.elapsed();
        let cpu = sys::process_cpu_time().saturating_sub(self.cpu_start);
        let offcpu = self.offcpu.map(offcpu::PhaseSampler::finish);
        let io = IoDelta {
            process: delta(self.process_io_start, sys::process_io()),
            device: delta(self.device_io_start, device_io()),
        };
        // Without a reset the peak would be the whole process's, possibly an earlier
        // engine's: better none than a wrong one.
        let peak_rss_bytes = if self.peak_rss_reset {
            sys::peak_rss_bytes()
        } else {
            None
        };
        let mut latencies = Latencies::new();
        for thread in per_thread {
            latencies.merge(thread);
        }
        Measurement {
            ops,
            elapsed,
            cpu,
            io,
            peak_rss_bytes,
            offcpu,
            latencies,
        }
    }
}

/// The result of one phase.
pub struct Measurement {
    pub ops: u64,
    pub elapsed: Duration,
    /// User + system time of the whole process during the phase.
    pub cpu: Duration,
    pub io: IoDelta,
    /// Peak resident memory of the process during the phase.
    pub peak_rss_bytes: Option<u64>,
    /// Where the time went (module `offcpu`), when the sampler is enabled.
    pub offcpu: Option<serde_json::Value>,
    latencies: Latencies,
}

impl Measurement {
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn cpu_us_per_op(&self) -> f64 {
        if self.ops == 0 {
            return 0.0;
        }
        self.cpu.as_secs_f64() * 1e6 / self.ops as f64
    }

    /// Latency at `quantile` (0.5 = median), in microseconds; 0 if nothing was timed.
    pub fn latency_us(&self, quantile: f64) -> f64 {
        if self.latencies.count() == 0 {
            return 0.0;
        }
        self.latencies.histogram.value_at_quantile(quantile) as f64 / 1000.0
    }

    pub fn p50_us(&self) -> f64 {
        self.latency_us(0.5)
    }

    pub fn p99_us(&self) -> f64 {
        self.latency_us(0.99)
    }

    pub fn p999_us(&self) -> f64 {
        self.latency_us(0.999)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_come_from_all_threads() {
        let mut a = Latencies::new();
        let mut b = Latencies::new();
        for _ in 0..990 {
            a.record(Duration::from_micros(10));
        }
        for _ in 0..10 {
            b.record(Duration::from_millis(5));
        }
        let m = PhaseTimer::start().finish(1000, &[a, b]);
        assert_eq!(m.ops, 1000);
        // Three significant digits: within 0.1%.
        assert!((m.p50_us() - 10.0).abs() < 0.02, "{}", m.p50_us());
        assert!((m.p99_us() - 10.0).abs() < 0.02, "{}", m.p99_us());
        assert!((m.p999_us() - 5000.0).abs() < 5.0, "{}", m.p999_us());
    }

    #[test]
    fn empty_phase_reports_zeros() {
        let m = PhaseTimer::start().finish(0, &[]);
        assert_eq!(m.cpu_us_per_op(), 0.0);
        assert_eq!(m.p99_us(), 0.0);
    }

    #[test]
    fn extreme_latencies_are_clamped_not_lost() {
        let mut l = Latencies::new();
        l.record(Duration::ZERO);
        l.record(Duration::from_secs(10 * 3600));
        assert_eq!(l.count(), 2);
    }
}
