//! Reads of a region: resolving log pointers to records (from a tail buffer or the
//! volume), point lookups alone and in groups, and the `index::Ctx` the tree reads keys
//! and committed nodes through.
//!
//! Owns: the read path of DESIGN.md "Read path": candidate lookups confirmed by the one
//! record read that fetches the value, groups of gets whose cache misses overlap, record
//! prefetch requests for the volume, cache-line hints, and a record's read from the volume
//! through the mapping or copied with `pread` (`copy_record`). Does not own: range
//! iteration (`crate::range`), the index's descent (`crate::index`), the choice between
//! mapped and copied reads (`crate::read_mode`).
//!
//! Thread-safety: every read takes no lock; it pins `crossbeam_epoch` for as long as it
//! holds a pointer into a tail buffer or a node, and a caller that keeps log pointers
//! between calls registers as a snapshot or live reader first (`Region::register_live_reader`).

use std::cmp::Ordering as CmpOrdering;
use std::sync::atomic::{AtomicUsize, Ordering};

use crossbeam_epoch as epoch;

use super::Region;
use crate::error::{Error, Result};
use crate::index::{self, Ctx};
use crate::log::record::{Header, RecordRef, HEADER_BYTES};
use crate::log::tail::Tail;
use crate::prefetch::{ResidencyGate, HOT_STREAK_PROBES};
use crate::types::{DiskOffset, BLOCK_BYTES};

/// The CPU's cache line.
const CACHE_LINE_BYTES: usize = 64;

/// Most bytes of a record `hint_record_lines` asks the CPU for: four lines, about a
/// record of 200-byte values; a longer record's other lines are missed when it is read.
const HINT_RECORD_MAX_BYTES: u64 = 256;

/// Most bytes a copied record's first request reads (`Region::copy_record`): about the
/// region's average record, capped so that one huge value does not make every small
/// record's read that long.
const COPY_FIRST_MAX_BYTES: u64 = 64 << 10;

thread_local! {
    /// The candidate records of a group of gets, for `prefetch_records` (kept per thread so
    /// a group allocates nothing).
    static GROUP_PTRS: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Region {
    /// Calls `f` with the record at `ptr`, from the tail buffer or the volume.
    pub fn with_record<R>(
        &self,
        ptr: u64,
        verify: bool,
        f: impl FnOnce(RecordRef<'_>) -> R,
    ) -> Result<R> {
        let at = DiskOffset(ptr);
        let guard = epoch::pin();
        {
            if let Some(t) = self.log.buffered_tail(ptr, &guard) {
                let head = t.read(ptr, HEADER_BYTES).ok_or_else(|| {
                    Error::corruption("log record", at, "pointer past the log end")
                })?;
                let header = Header::decode(head, at)?;
                let bytes = t.read(ptr, header.total_bytes() as usize).ok_or_else(|| {
                    Error::corruption("log record", at, "record past the log end")
                })?;
                return Ok(f(RecordRef::parse(bytes, self.seed(), verify, at)?));
            }
        }
        with_scratch(|scratch| {
            let volume = &self.shared.volume;
            let storage = volume.storage();
            // Header-and-key readers (key compares, a replaced record's length) are copied
            // too: left on the mapping they map pages again, and the cgroup's reclaim
            // pays for unmapping them (measured, DESIGN.md), which cost more than the
            // second page a copy of the average record sometimes reads.
            if self.shared.read_mode.copy_next(|| storage.resident(ptr)) {
                let bytes = self.copy_record(ptr, scratch)?;
                return Ok(f(RecordRef::parse(bytes, self.seed(), verify, at)?));
            }
            // SAFETY: records outside the tail belong to closed segments, which are
            // never written again while the region can reach them.
            let head = unsafe { volume.view(ptr, HEADER_BYTES, scratch)? };
            let header = Header::decode(head, at)?;
            let total = header.total_bytes() as usize;
            if verify {
                self.prefetch_long_record(ptr, total as u64);
            }
            // SAFETY: as above.
            let bytes = unsafe { volume.view(ptr, total, scratch)? };
            Ok(f(RecordRef::parse(bytes, self.seed(), verify, at)?))
        })
    }

    /// Copies the record at `ptr` (outside the tail buffers) from the volume into
    /// `scratch` with `Storage::read_random_at`: from its header, about the region's
    /// average record in one request (all its pages at once, where a mapped read faults
    /// them in one after the other), then the rest of a longer one. A record shorter than
    /// the average may bring in one page past its end. See `read_mode.rs`.
    fn copy_record<'s>(&self, ptr: u64, scratch: &'s mut Vec<u8>) -> Result<&'s [u8]> {
        let at = DiskOffset(ptr);
        let storage = self.shared.volume.storage();
        let keys = self.keys.load(Ordering::Relaxed).max(1);
        let guess_bytes =
            (self.live_bytes() / keys).clamp(HEADER_BYTES as u64, COPY_FIRST_MAX_BYTES);
        // A little past the average (records' sizes vary by a few bytes of key), but not
        // into a page the average record would not reach.
        let average_end = ptr.saturating_add(guess_bytes);
        let page_end = average_end
            .div_ceil(BLOCK_BYTES)
            .saturating_mul(BLOCK_BYTES);
        let end = average_end
            .saturating_add(guess_bytes / 8 + 64)
            .min(page_end);
        let volume_bytes = storage.len_bytes()?;
        let first = end.min(volume_bytes).saturating_sub(ptr) as usize;
        if first < HEADER_BYTES {
            return Err(Error::corruption(
                "log record",
                at,
                "pointer past the log end",
            ));
        }
        scratch.clear();
        scratch.resize(first, 0);
        storage.read_random_at(ptr, scratch)?;
        let total = Header::decode(&scratch[..HEADER_BYTES], at)?.total_bytes();
        if ptr.saturating_add(total) > volume_bytes {
            return Err(Error::corruption(
                "log record",
                at,
                "record past the log end",
            ));
        }
        let total = total as usize;
        if total > first {
            scratch.resize(total, 0);
            storage.read_random_at(ptr + first as u64, &mut scratch[first..])?;
        }
        self.shared
            .copied_record_reads
            .fetch_add(1, Ordering::Relaxed);
        Ok(&scratch[..total])
    }

    /// The first `len` bytes of the segment at `base` from its buffer, while it is a tail
    /// or a closed segment whose write is in flight (invariant 2: its bytes may not be in
    /// the volume yet), for as long as `guard` lives; `None`: read the volume.
    pub fn buffered_segment<'g>(
        &self,
        base: DiskOffset,
        len: usize,
        guard: &'g epoch::Guard,
    ) -> Option<&'g [u8]> {
        self.log.buffered_segment(base, guard)?.read(base.0, len)
    }

    /// Whether the record at `ptr` lies in a tail still being appended to (the
    /// foreground's or the relocation log's): its segment is not closed yet.
    pub fn in_open_tail(&self, ptr: u64) -> bool {
        let guard = epoch::pin();
        self.log.buffered_tail(ptr, &guard).is_some()
    }

    /// Starts loading the cache lines of each record at `ptrs` (see `hint_record_lines`),
    /// one after the other, so that their misses overlap: a range asks for the next
    /// several records it will read in one call (`range::hint_span`). Issued together, the
    /// hints' page walks overlap too (each record of a scan is on its own page of the
    /// log, so each hint is a TLB miss as well as a cache miss); one hint per item, a few
    /// hundred instructions apart, had the walks taken one at a time.
    pub fn hint_records(&self, ptrs: &[u64]) {
        if ptrs.is_empty() {
            return;
        }
        let keys = self.keys.load(Ordering::Relaxed).max(1);
        let span_bytes =
            (self.live_bytes() / keys).clamp(HEADER_BYTES as u64, HINT_RECORD_MAX_BYTES);
        let guard = epoch::pin();
        for &ptr in ptrs {
            self.hint_record_lines(ptr, span_bytes, self.log.buffered_tail(ptr, &guard));
        }
    }

    /// Starts loading the cache lines of the record at `ptr`, when it is in memory
    /// without I/O (the tail buffer or the volume's mapping): `span_bytes` from its
    /// header (about the region's average record, at most `HINT_RECORD_MAX_BYTES`). A
    /// record's checksum reads every byte, so a line left out is a miss waited for later.
    fn hint_record_lines(&self, ptr: u64, span_bytes: u64, tail: Option<&Tail>) {
        let bytes = match tail {
            Some(t) => t.read(ptr, 1),
            // Records are copied, not mapped: their pages are not in the process's page
            // tables, so a hint would only cost a page walk.
            None if self.shared.read_mode.copying() => None,
            // SAFETY: `ptr` names a record of a closed segment that the caller's reader
            // can reach, never written while reachable; the slice is dropped at once
            // (only its address is used).
            _ => unsafe { self.shared.volume.storage().mapped(ptr, 1) },
        };
        if let Some(bytes) = bytes {
            let skew = bytes.as_ptr() as usize % CACHE_LINE_BYTES;
            let lines = (skew + span_bytes as usize).div_ceil(CACHE_LINE_BYTES);
            crate::prefetch::cache_lines(
                bytes.as_ptr().wrapping_sub(skew),
                (0..lines).map(|line| line * CACHE_LINE_BYTES),
            );
        }
    }

    /// Before a record is read whole (`verify`: its checksum covers every byte) from the
    /// volume: if it reaches past the page after its first, asks for all of it in one
    /// request. Through the mapping (MADV_RANDOM, no readahead) each page would otherwise
    /// be one synchronous fault, and a prefetch window asked only for about an average
    /// record. Records of one or two pages never pay the extra call. Off with
    /// `scan_prefetch_entries == 0`, like all prefetching.
    fn prefetch_long_record(&self, ptr: u64, total_bytes: u64) {
        if ptr % BLOCK_BYTES + total_bytes <= 2 * BLOCK_BYTES
            || self.shared.options.scan_prefetch_entries == 0
        {
            return;
        }
        let start = ptr / BLOCK_BYTES * BLOCK_BYTES;
        let len_bytes = (ptr + total_bytes).div_ceil(BLOCK_BYTES) * BLOCK_BYTES - start;
        self.shared.volume.storage().prefetch(start, len_bytes);
        self.shared.prefetch_calls.fetch_add(1, Ordering::Relaxed);
        self.shared
            .prefetch_bytes
            .fetch_add(len_bytes, Ordering::Relaxed);
    }

    pub fn record_header(&self, ptr: u64) -> Result<Header> {
        self.with_record(ptr, false, |r| r.header)
    }

    /// The value of `key` under `root` (the live root or a snapshot's).
    pub fn get_with<R>(
        &self,
        root: Option<u64>,
        key: &[u8],
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>> {
        // The index would confirm the key by reading the record, and then the value read
        // would read it again: take the prefix + hash match as a candidate and confirm it
        // with the one read that fetches the value. A collision (another key with the same
        // prefix and hash) or anything unusual falls back to the exact lookup. One epoch
        // pin spans the lookup and the read, so the record cannot be freed in between.
        let _guard = epoch::pin();
        match self.lookup_candidate(root, key)? {
            Candidate::Absent => Ok(None),
            Candidate::Maybe(ptr) => {
                let mut f = Some(f);
                if let Some(value) = self.value_at_if_key(ptr, key, |v| f.take().map(|f| f(v)))? {
                    return Ok(value);
                }
                let f = f.expect("a record of another key leaves `f` unused");
                self.get_exact(root, key, f)
            }
            Candidate::Unsure => self.get_exact(root, key, f),
        }
    }

    /// `get_with` for several keys at once, `f(i, value of keys[i])` in order: what a
    /// pipeline of GETs or a multi-get asks. One key alone waits for each of its cache
    /// misses in turn (the leaf, then the record, which lies in write order, not key
    /// order); a group looks every key up in the index first, asks the CPU for every
    /// record's first lines, and only then reads them, so the records' misses overlap.
    /// Errors are per key; one does not stop the others. No allocation.
    pub fn get_many_with(
        &self,
        root: Option<u64>,
        keys: &[&[u8]],
        mut f: impl FnMut(usize, Result<Option<&[u8]>>),
    ) {
        // Enough records in flight to cover a miss; more only lengthens the time the
        // first record's lines must stay in cache.
        const GROUP: usize = 16;
        let guard = epoch::pin();
        // Records on the device are asked for as a group too (one `posix_fadvise` per run
        // of pages, as `multi_get` does), so their reads overlap instead of faulting in one
        // at a time; the gate keeps data in memory from paying a system call.
        let device_prefetch = self.shared.options.scan_prefetch_entries > 0;
        let mut gate = ResidencyGate::with_streak(self.prefetch_streak());
        for (g, group) in keys.chunks(GROUP).enumerate() {
            let mut found = [const { None::<Result<Candidate>> }; GROUP];
            for (slot, key) in found.iter_mut().zip(group) {
                *slot = Some(self.lookup_candidate(root, key));
            }
            // A group of one reads its record at once: a hint would only cost.
            if group.len() > 1 {
                if device_prefetch {
                    GROUP_PTRS.with_borrow_mut(|ptrs| {
                        ptrs.clear();
                        ptrs.extend(found.iter().filter_map(|slot| match slot {
                            Some(Ok(Candidate::Maybe(ptr))) => Some(*ptr),
                            _ => None,
                        }));
                        self.prefetch_records(ptrs, &mut gate, 2);
                    });
                }
                let keys_now = self.keys.load(Ordering::Relaxed).max(1);
                let span_bytes = (self.live_bytes() / keys_now)
                    .clamp(HEADER_BYTES as u64, HINT_RECORD_MAX_BYTES);
                for slot in found.iter().take(group.len()) {
                    if let Some(Ok(Candidate::Maybe(ptr))) = slot {
                        let tail = self.log.buffered_tail(*ptr, &guard);
                        self.hint_record_lines(*ptr, span_bytes, tail);
                    }
                }
            }
            for (j, (slot, key)) in found.iter_mut().zip(group).enumerate() {
                let i = g * GROUP + j;
                // Whether `f` was handed the value.
                let answered = match slot.take().expect("looked up above") {
                    Err(e) => Err(e),
                    Ok(Candidate::Absent) => Ok(false),
                    Ok(Candidate::Maybe(ptr)) => {
                        match self.value_at_if_key(ptr, key, |v| f(i, Ok(Some(v)))) {
                            Ok(Some(())) => Ok(true),
                            // Another key with the same prefix and hash: look up exactly.
                            Ok(None) => self
                                .get_exact(root, key, |v| f(i, Ok(Some(v))))
                                .map(|found| found.is_some()),
                            Err(e) => Err(e),
                        }
                    }
                    Ok(Candidate::Unsure) => self
                        .get_exact(root, key, |v| f(i, Ok(Some(v))))
                        .map(|found| found.is_some()),
                };
                match answered {
                    Ok(true) => {}
                    Ok(false) => f(i, Ok(None)),
                    Err(e) => f(i, Err(e)),
                }
            }
        }
    }

    /// `get_with` by the index's own confirmation (a record read per key compare).
    fn get_exact<R>(
        &self,
        root: Option<u64>,
        key: &[u8],
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>> {
        let guard = epoch::pin();
        let Some(ptr) = self.live_deferred(root, key) else {
            let Some(ptr) = self.tree.get(self, root, key, &guard)? else {
                return Ok(None);
            };
            return self.value_at(ptr, key, f).map(Some);
        };
        self.value_at(ptr, key, f).map(Some)
    }

    /// The deferred put of `key` (`deferred.rs`), for a reader of the live tree (`root`
    /// `None`): newer than anything the tree holds for the key.
    #[inline]
    fn live_deferred(&self, root: Option<u64>, key: &[u8]) -> Option<u64> {
        if root.is_some() {
            return None;
        }
        self.deferred.get(key)
    }

    /// The log pointer the index holds for `key` under `root` (index only, no record read).
    /// The caller keeps the pointer valid after the call returns (a snapshot or a
    /// registered live reader, see `register_live_reader`).
    pub fn lookup(&self, root: Option<u64>, key: &[u8]) -> Result<Option<u64>> {
        self.check_usable()?;
        if let Some(ptr) = self.live_deferred(root, key) {
            return Ok(Some(ptr));
        }
        let guard = epoch::pin();
        self.tree.get(self, root, key, &guard)
    }

    /// Looks `key` up without reading any record: the index confirms a key whose prefix and
    /// hash match by reading its record (`Ctx::key_cmp`), which is exactly the read a
    /// batch of lookups wants to prefetch first. The leaf's match is taken as a candidate
    /// the caller confirms when it reads the record; anything else that needed a key
    /// (a long pivot kept in the log, a restart) makes the answer `Unsure`.
    pub fn lookup_candidate(&self, root: Option<u64>, key: &[u8]) -> Result<Candidate> {
        self.check_usable()?;
        if let Some(ptr) = self.live_deferred(root, key) {
            return Ok(Candidate::Maybe(ptr));
        }
        self.tree_candidate_under(root, key)
    }

    /// `lookup_candidate` in the live tree alone, deferred puts left out: the entry a
    /// put of `key` would replace.
    pub(super) fn tree_candidate(&self, key: &[u8]) -> Result<Candidate> {
        self.check_usable()?;
        self.tree_candidate_under(None, key)
    }

    fn tree_candidate_under(&self, root: Option<u64>, key: &[u8]) -> Result<Candidate> {
        let guard = epoch::pin();
        let ctx = CandidateCtx::new(self);
        let found = self.tree.get(&ctx, root, key, &guard)?;
        Ok(match (found, ctx.compares.get()) {
            (None, 0) => Candidate::Absent,
            (Some(ptr), 1) if ptr == ctx.last.get() => Candidate::Maybe(ptr),
            _ => Candidate::Unsure,
        })
    }

    /// Calls `f` with the value of the put record at `ptr`, which the index named for `key`
    /// (verified: a record of another key or a tombstone is corruption).
    pub fn value_at<R>(&self, ptr: u64, key: &[u8], f: impl FnOnce(&[u8]) -> R) -> Result<R> {
        self.value_at_if_key(ptr, key, f)?.ok_or_else(|| {
            Error::corruption(
                "index entry",
                DiskOffset(ptr),
                "points at a record of another key",
            )
        })
    }

    /// As `value_at`, but `None` when the record at `ptr` holds another key (a
    /// `Candidate::Maybe` that collided); a tombstone of `key` is still corruption.
    pub fn value_at_if_key<R>(
        &self,
        ptr: u64,
        key: &[u8],
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>> {
        self.with_record(ptr, true, |rec| {
            if rec.key != key {
                return Ok(None);
            }
            if rec.header.is_tombstone() {
                return Err(Error::corruption(
                    "index entry",
                    DiskOffset(ptr),
                    "points at a tombstone",
                ));
            }
            Ok(Some(f(rec.value)))
        })?
    }

    /// Asks the volume to start reading the records at `ptrs` (any order, duplicates
    /// allowed; left sorted, the caller clears it) and returns without waiting. Records in
    /// a tail buffer are skipped (they are in memory). Each record is asked for from its
    /// start for about the region's average record size (at least its header's page); a
    /// longer one reads the rest when it is read. Adjacent pages go in one request.
    ///
    /// `gate` (the caller's, kept across its batches) probes `probes` records first and
    /// skips the batch once the data looks resident (see `prefetch::ResidencyGate`).
    pub fn prefetch_records(&self, ptrs: &mut Vec<u64>, gate: &mut ResidencyGate, probes: usize) {
        // Decided before the tail filter below, which pins the epoch and looks up every
        // record's segment: most batches of a cached scan are skipped unprobed.
        if gate.passes_unprobed() {
            self.shared
                .prefetch_skipped
                .fetch_add(ptrs.len() as u64, Ordering::Relaxed);
            return;
        }
        self.prefetch_probed(ptrs, gate, probes, &self.prefetch_streak);
    }

    /// Asks the volume to start reading the records of `keys` and returns without waiting:
    /// `multi_get`'s first half, for a caller that reads the keys one by one afterwards (a
    /// server's pipelined commands), so their device reads overlap. A hint: absent or
    /// unreadable keys are passed over. While earlier calls found their records in memory
    /// (a hot `key_prefetch_streak`, apart from the ranges' streak), most calls return
    /// before taking a key from `keys` (lazy, so the caller's work to find them is
    /// skipped too; such keys are not counted in `prefetch_skipped`). The gate starts
    /// without free passes, so a call now and then probes, and data evicted since is
    /// found (`ResidencyGate::probing_from`).
    pub fn prefetch_keys<K: AsRef<[u8]>>(&self, root: Option<u64>, keys: impl Iterator<Item = K>) {
        self.prefetch_keys_gated(root, &self.key_prefetch_streak, keys);
    }

    /// `prefetch_keys` of keys the caller found through records it reads first (a
    /// collection's members, under its metadata), whose gate keeps its own streak
    /// (`dependent_prefetch_streak`).
    pub fn prefetch_dependent_keys<K: AsRef<[u8]>>(&self, keys: impl Iterator<Item = K>) {
        self.prefetch_keys_gated(None, &self.dependent_prefetch_streak, keys);
    }

    /// `prefetch_keys` with its gate's streak kept in `streak`.
    fn prefetch_keys_gated<K: AsRef<[u8]>>(
        &self,
        root: Option<u64>,
        streak: &AtomicUsize,
        keys: impl Iterator<Item = K>,
    ) {
        if self.shared.options.scan_prefetch_entries == 0 {
            return;
        }
        let mut gate = ResidencyGate::probing_from(streak.load(Ordering::Relaxed));
        if gate.passes_unprobed() {
            return;
        }
        let mut candidates =
            keys.filter_map(|key| match self.lookup_candidate(root, key.as_ref()) {
                Ok(Candidate::Maybe(ptr)) => Some(ptr),
                _ => None,
            });
        GROUP_PTRS.with_borrow_mut(|ptrs| {
            ptrs.clear();
            // A hot gate's probed call (one in `HOT_PROBE_EVERY_BATCHES`): two records say
            // whether the data is still in memory before the rest are looked up, which
            // in memory was most of this call's cost (an index walk per key).
            if gate.streak() >= HOT_STREAK_PROBES {
                ptrs.extend(candidates.by_ref().take(2));
                self.prefetch_probed(ptrs, &mut gate, 2, streak);
                if !gate.missed() {
                    return;
                }
                ptrs.clear();
            }
            ptrs.extend(candidates);
            // One record is read at once by its caller: a hint would only cost.
            if ptrs.len() < 2 {
                return;
            }
            // As `multi_get`: about one probe per six records.
            let probes = (ptrs.len() / 6).max(2);
            self.prefetch_probed(ptrs, &mut gate, probes, streak);
        });
    }

    /// `prefetch_records` for a batch its gate did not pass unprobed; the gate's streak
    /// is published to `streak` (`prefetch_streak` or `key_prefetch_streak`).
    fn prefetch_probed(
        &self,
        ptrs: &mut Vec<u64>,
        gate: &mut ResidencyGate,
        probes: usize,
        streak: &AtomicUsize,
    ) {
        let asked = ptrs.len();
        {
            let guard = epoch::pin();
            // SAFETY: protected by the guard; never null after construction. A tail
            // switched right after this reading only makes us skip records that were just
            // written out (resident) or ask for bytes not yet written (harmless).
            ptrs.retain(|&ptr| self.log.buffered_tail(ptr, &guard).is_none());
        }
        if ptrs.is_empty() {
            // Every record is in a tail buffer, in memory: as many resident probes. A
            // record rewritten by every request (a list's metadata under a pipeline of
            // LPUSHes) otherwise kept its callers' gate cold, and each batch paid its
            // index lookups for nothing.
            gate.credit_resident(asked.min(probes));
            store_streak(streak, gate);
            return;
        }
        let storage = self.shared.volume.storage();
        let mode = &self.shared.read_mode;
        let issue = gate.probe(ptrs, probes, |ptr| {
            let resident = storage.resident(ptr);
            if let Some(resident) = resident {
                mode.sample(!resident);
            }
            resident
        });
        store_streak(streak, gate);
        if !issue {
            self.shared
                .prefetch_skipped
                .fetch_add(ptrs.len() as u64, Ordering::Relaxed);
            return;
        }
        let keys = self.keys.load(Ordering::Relaxed).max(1);
        let record_bytes = (self.live_bytes() / keys).clamp(
            HEADER_BYTES as u64,
            crate::prefetch::MAX_RECORD_PREFETCH_BYTES,
        );
        let mut bytes = 0;
        let calls = crate::prefetch::page_runs(ptrs, record_bytes, |offset, len_bytes| {
            storage.prefetch(offset, len_bytes);
            bytes += len_bytes;
        });
        self.shared
            .prefetch_calls
            .fetch_add(calls, Ordering::Relaxed);
        self.shared
            .prefetch_bytes
            .fetch_add(bytes, Ordering::Relaxed);
    }

    /// Where a new reader's `ResidencyGate` starts.
    pub fn prefetch_streak(&self) -> usize {
        self.prefetch_streak.load(Ordering::Relaxed)
    }

    /// Where `prefetch_keys`'s gate starts.
    #[cfg(test)]
    pub fn key_prefetch_streak(&self) -> usize {
        self.key_prefetch_streak.load(Ordering::Relaxed)
    }

    /// Where `prefetch_dependent_keys`'s gate starts.
    #[cfg(test)]
    pub fn dependent_prefetch_streak(&self) -> usize {
        self.dependent_prefetch_streak.load(Ordering::Relaxed)
    }

    /// Copies the leaf `seek` lands on (for range iteration).
    pub fn copy_leaf(
        &self,
        root: Option<u64>,
        seek: index::Seek<'_>,
        out: &mut index::LeafCopy,
    ) -> Result<()> {
        self.check_usable()?;
        let guard = epoch::pin();
        self.tree.copy_leaf(self, root, seek, &guard, out)
    }

    /// Copies the leaf holding `key`, leaving out its entries certainly below it and
    /// those past about `max_entries` (see `index::Tree::copy_leaf_from`): the leaves of
    /// a forward range.
    pub fn copy_leaf_from(
        &self,
        root: Option<u64>,
        key: &[u8],
        max_entries: usize,
        out: &mut index::LeafCopy,
    ) -> Result<()> {
        self.check_usable()?;
        let guard = epoch::pin();
        self.tree
            .copy_leaf_from(self, root, key, max_entries, &guard, out)
    }
}

impl Ctx for Region {
    fn key_cmp(&self, ptr: u64, key: &[u8]) -> Result<CmpOrdering> {
        self.with_record(ptr, false, |r| r.key.cmp(key))
    }

    fn key_into(&self, ptr: u64, out: &mut Vec<u8>) -> Result<()> {
        self.with_record(ptr, false, |r| {
            out.clear();
            out.extend_from_slice(r.key);
        })
    }

    fn with_node<R>(&self, off: DiskOffset, f: impl FnOnce(&[u8]) -> Result<R>) -> Result<R> {
        with_scratch(|scratch| {
            // SAFETY: committed nodes are never written again while reachable; their
            // blocks are released only after every reader that could see them is gone.
            let bytes = unsafe {
                self.shared
                    .volume
                    .view(off.0, BLOCK_BYTES as usize, scratch)?
            };
            f(bytes)
        })
    }
}

/// What `Region::lookup_candidate` found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Candidate {
    /// The key is not in the index (no record was needed to tell).
    Absent,
    /// The entry whose key prefix and hash match the key's: its record holds the key
    /// unless two keys collide on both (then look up exactly).
    Maybe(u64),
    /// Look up exactly (`Region::lookup`).
    Unsure,
}

/// A `Ctx` that answers every key comparison with "equal" without reading the record,
/// and counts them (see `Region::lookup_candidate`).
pub(super) struct CandidateCtx<'a> {
    region: &'a Region,
    compares: std::cell::Cell<u32>,
    last: std::cell::Cell<u64>,
}

impl<'a> CandidateCtx<'a> {
    pub(super) fn new(region: &'a Region) -> CandidateCtx<'a> {
        CandidateCtx {
            region,
            compares: std::cell::Cell::new(0),
            last: std::cell::Cell::new(0),
        }
    }
}

impl Ctx for CandidateCtx<'_> {
    fn key_cmp(&self, ptr: u64, _key: &[u8]) -> Result<CmpOrdering> {
        self.compares.set(self.compares.get() + 1);
        self.last.set(ptr);
        Ok(CmpOrdering::Equal)
    }

    fn key_into(&self, ptr: u64, out: &mut Vec<u8>) -> Result<()> {
        self.region.key_into(ptr, out)
    }

    fn with_node<R>(&self, off: DiskOffset, f: impl FnOnce(&[u8]) -> Result<R>) -> Result<R> {
        self.region.with_node(off, f)
    }
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` with a scratch buffer for backends without a mapping. A small per-thread
/// stack of buffers, so nested calls (a node view that compares a key) each get one.
#[inline]
fn with_scratch<R>(f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
    let mut buf = SCRATCH.with(|s| s.borrow_mut().pop()).unwrap_or_default();
    let out = f(&mut buf);
    if buf.capacity() <= 1 << 20 {
        SCRATCH.with(|s| s.borrow_mut().push(buf));
    }
    out
}

/// Publishes `gate`'s streak for the region's next readers. Stored only when it changes:
/// every reader of the region loads it, and a store per batch moved its cache line
/// between cores at every seek.
fn store_streak(streak: &AtomicUsize, gate: &ResidencyGate) {
    if streak.load(Ordering::Relaxed) != gate.streak() {
        streak.store(gate.streak(), Ordering::Relaxed);
    }
}
