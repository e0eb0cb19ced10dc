//! Statistics a user or a dashboard reads.

/// Engine-wide statistics; a point-in-time reading, not a consistent snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Live keys over all keyspaces.
    pub keys: u64,
    /// Bytes of log records still reachable from an index.
    pub live_log_bytes: u64,
    /// Bytes of log records overwritten, deleted, tombstones and links.
    pub dead_log_bytes: u64,
    /// Heap bytes held by index nodes.
    pub index_bytes: u64,
    /// Index nodes resident in the heap.
    pub index_nodes: u64,
    /// Volume commits completed since open.
    pub commits: u64,
    /// Log flushes + fsyncs completed since open (group commits count once).
    pub syncs: u64,
    /// Bytes written to the volume since open.
    pub bytes_written: u64,
    /// Bytes read from the volume with explicit reads since open (mapped reads not counted).
    pub bytes_read: u64,
    /// Length of the volume file.
    pub volume_bytes: u64,
    /// Bytes the volume occupies on the device.
    pub space_used_bytes: u64,
    /// What the volume is stored in: `file`, `block-device`, `members` (a volume over
    /// several, each with its own kind in `members`), `memory` or `other`.
    pub volume_kind: String,
    /// Blocks allocated in the allocator bitmap.
    pub allocated_bytes: u64,
    /// Newest durable commit epoch.
    pub commit_epoch: u64,
    /// Bytes of log segments over all keyspaces (see `KeyspaceStats::log_size_bytes`).
    pub log_size_bytes: u64,
    /// Garbage collection passes that did something since open.
    pub gc_passes: u64,
    /// Bytes of live records garbage collection copied since open.
    pub gc_relocated_bytes: u64,
    /// Bytes of emptied log segments garbage collection handed back since open.
    pub gc_reclaimed_bytes: u64,
    /// Bytes of records the reorganiser rewrote in key order since open
    /// (`Database::reorganise`, `Options::reorganise_after_idle`).
    pub reorganised_bytes: u64,
    /// Live scans since open that read scattered records from the device and queued them
    /// for a rewrite in key order; reports dropped because the queue was full.
    pub scattered_reads: u64,
    pub scattered_reads_dropped: u64,
    /// Nanoseconds foreground writers slept because garbage collection fell far behind
    /// its space target (write pacing; 0 unless it did).
    pub gc_paced_ns: u64,
    /// Prefetch requests (`Storage::prefetch`) range iterators, multi-gets, groups of
    /// gets, `Keyspace::prefetch` and reads of records longer than two pages made since
    /// open: one per run of adjacent pages.
    pub prefetch_calls: u64,
    /// Bytes those requests named, page-rounded (resident pages included).
    pub prefetch_bytes: u64,
    /// Records range iterators and multi-gets did not ask for because the pages of a few
    /// of their batch were found in memory (`Storage::resident`). Keys a
    /// `Keyspace::prefetch` call passed over unprobed are not counted (it does not look
    /// them up).
    pub prefetch_skipped: u64,
    /// Records read by copying them with `pread` since open, because sampled reads found
    /// the data mostly not in memory (`Options::cold_reads_copied`).
    pub copied_record_reads: u64,
    /// Puts of existing keys deferred since open, applied to the index later in batches
    /// (`Options::deferred_updates`).
    pub deferred_puts: u64,
    /// Bytes of closed log segments handed to the background writers and not written yet
    /// (writes in flight; 0 with `writes_in_flight_segments == 0`).
    pub writes_in_flight_bytes: u64,
    /// Leaf splits of the indexes since open (all keyspaces).
    pub index_leaf_splits: u64,
    /// Halves of those splits that got a longer stem, reading every key of the half.
    pub index_restemmed_halves: u64,
    /// Full keys (log records) leaf splits read under the writer lock since open.
    pub index_split_key_reads: u64,
    /// Full keys (log records) inserts read to place a key among tied prefixes since open.
    pub index_insert_key_reads: u64,
    /// Trims (punches of freed log segments) over all members since open: listed for a
    /// scheduled pass, issued (by a pass, at close, or at release with
    /// `TrimSchedule::AtRelease`), forced by low free space; and bytes listed now
    /// (`MemberStats` has them per member).
    pub trims_queued: u64,
    pub trims_issued: u64,
    pub trims_forced: u64,
    pub trims_pending_bytes: u64,
    pub keyspaces: Vec<KeyspaceStats>,
    /// Per member of a volume over several members (empty for one file): groups placed
    /// on it, bytes written and read.
    pub members: Vec<crate::volume::MemberStats>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyspaceStats {
    pub name: String,
    pub keys: u64,
    pub live_log_bytes: u64,
    pub dead_log_bytes: u64,
    pub log_segments: u64,
    /// Bytes of the keyspace's log segments, including segments garbage collection
    /// emptied that still wait for readers or commits: against `live_log_bytes`, the
    /// space garbage collection can give back (`Options::gc_space_amp`).
    pub log_size_bytes: u64,
    pub index_nodes: u64,
    /// Leaf splits of the keyspace's index and the keys they and inserts read.
    pub index_writes: crate::index::WriteCounts,
}

impl Stats {
    /// Stats as a JSON object (for `tucana stats` and the server's INFO).
    pub fn to_json(&self) -> String {
        let mut s = String::new();
        s.push('{');
        let fields: [(&str, u64); 35] = [
            ("keys", self.keys),
            ("live_log_bytes", self.live_log_bytes),
            ("dead_log_bytes", self.dead_log_bytes),
            ("index_bytes", self.index_bytes),
            ("index_nodes", self.index_nodes),
            ("commits", self.commits),
            ("syncs", self.syncs),
            ("bytes_written", self.bytes_written),
            ("bytes_read", self.bytes_read),
            ("volume_bytes", self.volume_bytes),
            ("space_used_bytes", self.space_used_bytes),
            ("allocated_bytes", self.allocated_bytes),
            ("commit_epoch", self.commit_epoch),
            ("log_size_bytes", self.log_size_bytes),
            ("gc_passes", self.gc_passes),
            ("gc_relocated_bytes", self.gc_relocated_bytes),
            ("gc_reclaimed_bytes", self.gc_reclaimed_bytes),
            ("reorganised_bytes", self.reorganised_bytes),
            ("scattered_reads", self.scattered_reads),
            ("scattered_reads_dropped", self.scattered_reads_dropped),
            ("gc_paced_ns", self.gc_paced_ns),
            ("prefetch_calls", self.prefetch_calls),
            ("prefetch_bytes", self.prefetch_bytes),
            ("prefetch_skipped", self.prefetch_skipped),
            ("copied_record_reads", self.copied_record_reads),
            ("deferred_puts", self.deferred_puts),
            ("writes_in_flight_bytes", self.writes_in_flight_bytes),
            ("index_leaf_splits", self.index_leaf_splits),
            ("index_restemmed_halves", self.index_restemmed_halves),
            ("index_split_key_reads", self.index_split_key_reads),
            ("index_insert_key_reads", self.index_insert_key_reads),
            ("trims_queued", self.trims_queued),
            ("trims_issued", self.trims_issued),
            ("trims_forced", self.trims_forced),
            ("trims_pending_bytes", self.trims_pending_bytes),
        ];
        for (name, value) in fields {
            s.push_str(&format!("\"{name}\":{value},"));
        }
        s.push_str("\"keyspaces\":[");
        for (i, ks) in self.keyspaces.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            s.push_str(&format!(
                "{{\"name\":{},\"keys\":{},\"live_log_bytes\":{},\"dead_log_bytes\":{},\"log_segments\":{},\"log_size_bytes\":{},\"index_nodes\":{}}}",
                json_string(&ks.name),
                ks.keys,
                ks.live_log_bytes,
                ks.dead_log_bytes,
                ks.log_segments,
                ks.log_size_bytes,
                ks.index_nodes
            ));
        }
        s.push_str("],\"volume_kind\":");
        s.push_str(&json_string(&self.volume_kind));
        s.push_str(",\"members\":[");
        for (i, m) in self.members.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            s.push_str(&format!(
                "{{\"name\":{},\"kind\":{},\"state\":{},\"uuid\":{},\"groups\":{},\"bytes_written\":{},\"bytes_read\":{},\"in_flight_requests\":{},\"in_flight_bytes\":{},\"weighted_queue_ps\":{},\"write_ps_per_byte\":{},\"read_ps_per_byte\":{},\"writeback_ps_per_byte\":{},\"queue_jobs\":{},\"queue_running_jobs\":{},\"queue_bytes\":{},\"queue_done_jobs\":{},\"idle_while_others_busy_ns\":{},\"trims_queued\":{},\"trims_issued\":{},\"trims_forced\":{},\"trims_pending_bytes\":{}}}",
                json_string(&m.name),
                json_string(&m.kind),
                json_string(&m.state),
                json_string(&m.uuid),
                m.groups,
                m.bytes_written,
                m.bytes_read,
                m.in_flight_requests,
                m.in_flight_bytes,
                m.weighted_queue_ps,
                m.write_ps_per_byte,
                m.read_ps_per_byte,
                m.writeback_ps_per_byte,
                m.queue_jobs,
                m.queue_running_jobs,
                m.queue_bytes,
                m.queue_done_jobs,
                m.idle_while_others_busy_ns,
                m.trims_queued,
                m.trims_issued,
                m.trims_forced,
                m.trims_pending_bytes
            ));
        }
        s.push_str("]}");
        s
    }
}

fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
