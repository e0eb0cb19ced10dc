//! How a database is opened: every option with its default, set through the builder
//! methods (`Database::builder()`), and their validation.
//!
//! Owns: the option values and their meaning. Does not own: opening itself
//! (`Options::open` and its siblings live with the handle they return, in `crate::db`).
//! Plain data: `Clone + Send + Sync`, read-only once the database is open.

use std::time::Duration;

use crate::error::{Error, Result};

/// How a database is opened. Built with `Database::builder()`.
#[derive(Clone, Debug)]
pub struct Options {
    /// Background commit at least this often while there are changes (`None`: never).
    pub commit_interval: Option<Duration>,
    /// Background commit once this many log bytes were written since the last commit.
    pub commit_dirty_bytes: u64,
    /// Buffered writes are flushed and synced at least this often (`None`: never).
    pub flush_interval: Option<Duration>,
    /// Size of a log segment; records larger than this get a segment of their own.
    pub log_segment_bytes: u64,
    /// Create the volume if the file does not exist.
    pub create_if_missing: bool,
    /// Format a block device (the volume's, or a member's) that carries no Tucana volume,
    /// erasing what it holds. Off by default: opening never writes over a device holding
    /// someone else's data (DESIGN.md, "Raw block devices"). A device that carries a
    /// Tucana volume is opened as that volume (or refused as another volume's member),
    /// never formatted.
    pub format_block_devices: bool,
    /// Background garbage collection of the log, in a thread of its own beside the
    /// background committer; both exist when `commit_interval` or `flush_interval` is set
    /// (GC needs commits to free anything). `Database::gc` works either way.
    pub gc: bool,
    /// The space amplification background GC steers toward: disk bytes over the keys and
    /// values of live records. A keyspace's dead log bytes are collected back under half
    /// the room the target leaves once they pass it (the room: what keeps its log,
    /// estimated index and share of the volume's measured overhead, such as index nodes
    /// copied on write and segments on their way back, at the target; for records so
    /// small that their headers and index entries alone exceed it, the line is 0.36 of
    /// what they take with no garbage, for a target of 1.5). A fast burst of overwrites
    /// runs a little over it until it ends. Writers are paced past twice the room
    /// (DESIGN.md, "Garbage collection").
    pub gc_space_amp: f64,
    /// Most bytes of live records background GC copies per second while collecting back
    /// to its line; past 0.65 of the room it may also copy 2 bytes per byte
    /// foreground writers append.
    pub gc_rate_bytes_per_sec: u64,
    /// Range iterators keep the log records of this many entries ahead of each end asked
    /// for at once (`Storage::prefetch`), so that a scan of records not in memory has many
    /// reads in flight; `multi_get` prefetches its keys' records in windows of at least
    /// this many, `get_many_with` group by group, and a record longer than two pages is
    /// asked for whole before it is read.
    /// 0 turns all of it off.
    pub scan_prefetch_entries: usize,
    /// When set, the background collector reorganises the log (`Database::reorganise`:
    /// scattered records rewritten in key order, so that scans of data not in memory read
    /// the device sequentially) once foreground writes have stopped for this long, within
    /// GC's rate budget, a few leaves per step, resuming where it stopped; after a whole
    /// walk it waits for new writes before it walks again. Off by default: it writes each
    /// scattered record once more.
    pub reorganise_after_idle: Option<Duration>,
    /// A live forward scan that read records from the device and found them scattered
    /// over the log reports them, and the background collector copies those still live
    /// in key order, within GC's rate budget (`region/key_order.rs`): a range scanned
    /// cold once is read as a few pages the next time. On by default; it writes each
    /// such record once more, and only for data that is read from the device.
    pub reorganise_scanned: bool,
    /// While sampled reads find about one record in eight or more missing from memory,
    /// records outside the tail are copied with `pread` (one request for all their pages,
    /// nothing mapped) instead of read through the mapping (a fault per page); in memory
    /// they are read through the mapping, with no system call (`read_mode.rs`). Default
    /// on; off reads through the mapping always.
    pub cold_reads_copied: bool,
    /// When a lone put of a key the index already holds is applied to the index later, in
    /// batches, instead of at once (`region/deferred.rs`): applying it reads the record it
    /// replaces, one device read at a time when the data is not in memory; deferred, those
    /// reads are asked for together. Default `WhenCold` (see the enum).
    pub deferred_updates: DeferredUpdates,
    /// How often the background collector wakes to take a step (default 100 ms). For the
    /// torture suites, which need background GC steps within a few milliseconds of work to
    /// crash inside them; not a tuning knob (the budget follows the foreground, not the tick).
    #[doc(hidden)]
    pub gc_tick: Duration,
    /// Address space reserved for the read mapping of a volume file (default 64 GiB); the
    /// mapping grows past it with the file, only sooner with a smaller one. Costs no
    /// memory, but tools that cap a process's address space (valgrind, `ulimit -v`) refuse
    /// the default.
    pub mapping_reservation_bytes: u64,
    /// How a volume over several members (`Options::open_members`) picks the member of a
    /// new log segment: round-robin (the default) or least weighted queue length.
    pub member_dispatch: crate::volume::DispatchPolicy,
    /// Writes in flight: a closed log segment (or relocation segment) is handed to a
    /// background writer of its volume member and the writer goes on; it waits only when
    /// this many segments (of `log_segment_bytes`) are in flight on that member (default
    /// 4; 0: the writer's thread writes each closed segment itself, synchronously).
    /// Readers read such a segment from its buffer until its write is done; syncs and
    /// commits wait for the writes queued before them. Without background threads (no
    /// `commit_interval` nor `flush_interval`) there is no writer thread either: the
    /// queued writes are done by whoever must wait next (a full budget, a sync, a commit).
    pub writes_in_flight_segments: usize,
    /// Segment writes running at once per member (default 4; at least 1): the worker
    /// threads each member's write queue may use. With 1, a member's queued writes are
    /// done one after another; with more, up to this many `pwrite`s (or direct writes to
    /// a raw device) are in progress on it together and complete in any order. At most
    /// `writes_in_flight_segments` are ever queued, so a depth above it adds nothing.
    /// DESIGN.md, *Writes in flight*.
    pub writes_in_flight_depth: usize,
    /// Most bytes in flight over the whole volume (default 64 MiB).
    pub writes_in_flight_volume_bytes: u64,
    /// Whether a background segment write lasts until the device has the bytes
    /// (`Storage::write_back_and_wait`: writeback started and waited for, no device
    /// cache flush) instead of returning once they are in the page cache with writeback
    /// started (default false). With it, a member's write queue and its measured time per
    /// byte are the device's, which least-weighted-queue dispatch needs to tell a slow or
    /// busy device from a fast one; without, buffered writes finish at memory speed on
    /// every member and the device's backlog is in the kernel, invisible.
    pub segment_writes_wait_for_device: bool,
    /// When freed log segments are punched (trimmed): scheduled by the background loop
    /// per member (the default), or at once as they are released (for comparison).
    /// Without the background loop (nothing timed, or no `gc`) they are punched at
    /// release either way. DESIGN.md, "Volumes over several devices", *Trims*.
    pub trim_schedule: crate::trim::TrimSchedule,
    /// A member's listed trims are issued when writes are at most this share of the
    /// bytes queued on it (default 0.5; an idle member has none).
    pub trim_max_write_share: f64,
    /// Most bytes of trims a pass (every `gc_tick`) issues per member, forced ones aside
    /// (default 64 MiB).
    pub trim_pass_bytes_max: u64,
    /// A member whose file system has less than this share of its bytes available has
    /// all its listed trims issued at the next pass, whatever its load (default 0.10).
    pub trim_force_below_free_fraction: f64,
}

/// When a put of a key the index already holds is deferred (`Options::deferred_updates`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeferredUpdates {
    /// Every put is applied to the index at once.
    Off,
    /// While reads find the data mostly not in memory (the copying read mode of
    /// `Options::cold_reads_copied`, which must be on) and the record a put replaces is
    /// not in memory either: then applying it at once would wait for a device read.
    #[default]
    WhenCold,
    /// Always (for tests: exercises the deferred path on data in memory).
    Always,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            commit_interval: Some(Duration::from_secs(5)),
            commit_dirty_bytes: 256 << 20,
            flush_interval: Some(Duration::from_millis(200)),
            log_segment_bytes: 2 << 20,
            create_if_missing: true,
            format_block_devices: false,
            gc: true,
            gc_space_amp: 1.5,
            gc_rate_bytes_per_sec: 64 << 20,
            scan_prefetch_entries: 64,
            reorganise_after_idle: None,
            reorganise_scanned: true,
            cold_reads_copied: true,
            deferred_updates: DeferredUpdates::WhenCold,
            gc_tick: GC_TICK,
            mapping_reservation_bytes: crate::volume::DEFAULT_MAPPING_RESERVATION_BYTES,
            member_dispatch: crate::volume::DispatchPolicy::RoundRobin,
            writes_in_flight_segments: 4,
            writes_in_flight_depth: 4,
            writes_in_flight_volume_bytes: 64 << 20,
            segment_writes_wait_for_device: false,
            trim_schedule: crate::trim::TrimSchedule::Scheduled,
            trim_max_write_share: 0.5,
            trim_pass_bytes_max: 64 << 20,
            trim_force_below_free_fraction: 0.10,
        }
    }
}

impl Options {
    pub fn commit_interval(mut self, interval: Option<Duration>) -> Options {
        self.commit_interval = interval;
        self
    }

    pub fn commit_dirty_bytes(mut self, bytes: u64) -> Options {
        self.commit_dirty_bytes = bytes;
        self
    }

    pub fn flush_interval(mut self, interval: Option<Duration>) -> Options {
        self.flush_interval = interval;
        self
    }

    pub fn log_segment_bytes(mut self, bytes: u64) -> Options {
        self.log_segment_bytes = bytes;
        self
    }

    pub fn create_if_missing(mut self, create: bool) -> Options {
        self.create_if_missing = create;
        self
    }

    /// See `Options::format_block_devices`.
    pub fn format_block_devices(mut self, format: bool) -> Options {
        self.format_block_devices = format;
        self
    }

    /// Turns background garbage collection on (the default) or off.
    pub fn gc(mut self, on: bool) -> Options {
        self.gc = on;
        self
    }

    /// Space amplification (disk bytes / live keys and values) background GC steers
    /// toward; more than 1.0 (default 1.5). See the field.
    pub fn gc_space_amp(mut self, target: f64) -> Options {
        self.gc_space_amp = target;
        self
    }

    /// Bytes of live records background GC copies per second (default 64 MiB/s); during
    /// a burst it may copy more. See the field.
    pub fn gc_rate_bytes_per_sec(mut self, rate: u64) -> Options {
        self.gc_rate_bytes_per_sec = rate;
        self
    }

    /// Rewrite in key order what cold scans found scattered (default: on). See the field.
    pub fn reorganise_scanned(mut self, on: bool) -> Options {
        self.reorganise_scanned = on;
        self
    }

    /// Reorganise the log in the background after this long without foreground writes
    /// (default: never). See the field.
    pub fn reorganise_after_idle(mut self, idle: Option<Duration>) -> Options {
        self.reorganise_after_idle = idle;
        self
    }

    /// Copy records with `pread` while the data set looks larger than memory (default
    /// on). See the field.
    pub fn cold_reads_copied(mut self, on: bool) -> Options {
        self.cold_reads_copied = on;
        self
    }

    /// When puts of existing keys are applied to the index in batches (default
    /// `WhenCold`).
    /// See the field.
    pub fn deferred_updates(mut self, when: DeferredUpdates) -> Options {
        self.deferred_updates = when;
        self
    }

    /// Log records range iterators ask the device for ahead of where they are (default
    /// 64; 0: none, also for `multi_get` and `get_many_with`). See the field.
    pub fn scan_prefetch_entries(mut self, entries: usize) -> Options {
        self.scan_prefetch_entries = entries;
        self
    }

    /// See the field; for tests.
    #[doc(hidden)]
    pub fn gc_tick(mut self, tick: Duration) -> Options {
        self.gc_tick = tick;
        self
    }

    /// See the field (at least one block).
    pub fn mapping_reservation_bytes(mut self, bytes: u64) -> Options {
        self.mapping_reservation_bytes = bytes.max(crate::types::BLOCK_BYTES);
        self
    }

    pub fn member_dispatch(mut self, policy: crate::volume::DispatchPolicy) -> Options {
        self.member_dispatch = policy;
        self
    }

    /// Segments in flight per member before a writer waits (0: write each closed segment
    /// synchronously). See the field.
    pub fn writes_in_flight_segments(mut self, segments: usize) -> Options {
        self.writes_in_flight_segments = segments;
        self
    }

    /// Segment writes running at once per member (at least 1). See the field.
    pub fn writes_in_flight_depth(mut self, depth: usize) -> Options {
        self.writes_in_flight_depth = depth.max(1);
        self
    }

    /// Bytes in flight over the volume before a writer waits. See the field.
    pub fn writes_in_flight_volume_bytes(mut self, bytes: u64) -> Options {
        self.writes_in_flight_volume_bytes = bytes;
        self
    }

    /// Whether background segment writes wait until the device has their bytes. See the
    /// field.
    pub fn segment_writes_wait_for_device(mut self, wait: bool) -> Options {
        self.segment_writes_wait_for_device = wait;
        self
    }

    /// When freed log segments are punched. See the field.
    pub fn trim_schedule(mut self, schedule: crate::trim::TrimSchedule) -> Options {
        self.trim_schedule = schedule;
        self
    }

    /// Writes' share of a member's queued bytes at or under which its trims go (0.0 to
    /// 1.0). See the field.
    pub fn trim_max_write_share(mut self, share: f64) -> Options {
        self.trim_max_write_share = share;
        self
    }

    /// Most bytes of trims one pass issues per member (positive). See the field.
    pub fn trim_pass_bytes_max(mut self, bytes: u64) -> Options {
        self.trim_pass_bytes_max = bytes;
        self
    }

    /// Share of a member's file system under which its trims are forced (0.0 to 1.0).
    /// See the field.
    pub fn trim_force_below_free_fraction(mut self, fraction: f64) -> Options {
        self.trim_force_below_free_fraction = fraction;
        self
    }

    /// The trim scheduler's policy, from these options.
    pub(crate) fn trim_policy(&self) -> crate::trim::TrimPolicy {
        crate::trim::TrimPolicy {
            max_write_share: self.trim_max_write_share,
            pass_bytes_max: self.trim_pass_bytes_max,
            force_below_free_fraction: self.trim_force_below_free_fraction,
        }
    }

    /// Whether an open store runs the background committer (and, with `gc`, the
    /// collector's loop): only when something is timed.
    pub(crate) fn runs_background_threads(&self) -> bool {
        self.commit_interval.is_some() || self.flush_interval.is_some()
    }

    /// Refuses values the engine cannot run with (before anything is opened).
    pub(crate) fn validate(&self) -> Result<()> {
        if !self.log_segment_bytes.is_power_of_two()
            || !(64 << 10..=64 << 20).contains(&self.log_segment_bytes)
        {
            return Err(Error::InvalidArgument(
                "log_segment_bytes must be a power of two from 64 KiB to 64 MiB".into(),
            ));
        }
        // NaN is rejected too (it is not greater than 1.0).
        if self.gc_space_amp.partial_cmp(&1.0) != Some(std::cmp::Ordering::Greater)
            || self.gc_rate_bytes_per_sec == 0
        {
            return Err(Error::InvalidArgument(
                "gc_space_amp must be more than 1.0 and gc_rate_bytes_per_sec positive".into(),
            ));
        }
        // NaN is rejected too (it is in no range).
        let unit = 0.0..=1.0;
        if !unit.contains(&self.trim_max_write_share)
            || !unit.contains(&self.trim_force_below_free_fraction)
            || self.trim_pass_bytes_max == 0
        {
            return Err(Error::InvalidArgument(
                "trim_max_write_share and trim_force_below_free_fraction must be from 0.0 to \
                 1.0 and trim_pass_bytes_max positive"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// Background GC's tick by default (`Options::gc_tick`): a step at least this often.
const GC_TICK: Duration = Duration::from_millis(100);
