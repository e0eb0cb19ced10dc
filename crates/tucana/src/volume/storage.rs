//! The storage trait: the engine's only view of the device.
//!
//! Thread-safety: every method may be called from any thread concurrently. Writes to
//! disjoint ranges may run in parallel; the engine never writes a range that a reader
//! may be looking at (see `mapped`).

use crate::error::Result;

/// Free and total bytes of the file system (or device) a volume or member lives on, as
/// `statvfs` reports them (`available_bytes`: what an unprivileged writer may still take).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceSpace {
    pub available_bytes: u64,
    pub total_bytes: u64,
}

/// What a backend stores its bytes in, for statistics and messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StorageKind {
    File,
    BlockDevice,
    Memory,
    /// A volume over several members (each has its own kind).
    Members,
    /// A wrapper (simulations in tests) or another backend.
    Other,
    /// The place of a member removed from a volume over several (it holds nothing).
    Removed,
}

impl StorageKind {
    /// The kind as statistics print it: `file`, `block-device`, `memory`, `members`,
    /// `other`, `removed`.
    pub fn as_str(self) -> &'static str {
        match self {
            StorageKind::File => "file",
            StorageKind::BlockDevice => "block-device",
            StorageKind::Memory => "memory",
            StorageKind::Members => "members",
            StorageKind::Other => "other",
            StorageKind::Removed => "removed",
        }
    }
}

/// A volume's bytes: one file, a block device, memory, or a fault-injecting simulation.
pub trait Storage: Send + Sync + 'static {
    /// Current length of the volume in bytes.
    fn len_bytes(&self) -> Result<u64>;

    /// Grows the volume to at least `len_bytes` (new bytes read as zero). Never shrinks.
    fn grow(&self, len_bytes: u64) -> Result<()>;

    /// Reads exactly `buf.len()` bytes at `offset`. Reading past the end is an error.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()>;

    /// As `read_at`, for a small read at a random place (a log record copied while the
    /// data set is larger than memory, see `read_mode.rs`): the backend should bring in
    /// exactly the pages of the range, in one request, with no readahead around them.
    /// The default is `read_at`.
    fn read_random_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.read_at(offset, buf)
    }

    /// Writes all of `data` at `offset` (inside the current length).
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()>;

    /// As `write_at`, for bytes nobody reads back while the volume is open (index node
    /// images: the index lives in memory, recovery reads them): the backend may bypass
    /// its cache, so the write costs no copy into it and evicts nothing readers use. Same
    /// durability contract as `write_at` (durable after `sync`). The default is
    /// `write_at`, as is any call whose offset, length or buffer is not block-aligned.
    fn write_uncached_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.write_at(offset, data)
    }

    /// Makes every completed `write_at` durable.
    fn sync(&self) -> Result<()>;

    /// A zero-copy view of committed bytes, when the backend has a memory mapping.
    /// `None` when the backend has no mapping or the range is not (yet) mapped; the
    /// caller then copies with `read_at`.
    ///
    /// # Safety
    /// The caller guarantees that no `write_at` or `punch_hole` overlapping
    /// `offset..offset+len` runs while the returned slice is alive (rewriting a byte with
    /// its own value is allowed), and that the range lies inside the volume.
    unsafe fn mapped(&self, offset: u64, len: usize) -> Option<&[u8]> {
        let _ = (offset, len);
        None
    }

    /// Gives the bytes of a range back to the file system (hole punch); a no-op where
    /// unsupported. Where supported the range reads as zeros afterwards; callers must not
    /// rely on that (a backend that cannot punch keeps the old bytes). Counts as a write
    /// for the `mapped` contract.
    fn punch_hole(&self, offset: u64, len: u64) -> Result<()> {
        let _ = (offset, len);
        Ok(())
    }

    /// Asks the backend to start reading `offset..offset+len_bytes` into memory and returns
    /// without waiting, so that a later `mapped` view or `read_at` of the range finds it
    /// resident. A hint: a backend may ignore it (the default does), and a failure is not
    /// reported (the later read does the I/O itself and reports its own errors). Ranges past
    /// the end of the volume are allowed and ignored.
    fn prefetch(&self, offset: u64, len_bytes: u64) {
        let _ = (offset, len_bytes);
    }

    /// Asks the backend to start writing `offset..offset+len_bytes` (already handed to
    /// `write_at`) to the device, and returns without waiting. No durability promise: only
    /// `sync` makes writes durable. What it buys is that written data does not pile up
    /// dirty in memory until the next sync, where the kernel would otherwise write it in
    /// one burst, or (inside a memory cgroup) stall the writer in reclaim waiting for it.
    /// A hint: the default ignores it, and failures are not reported (`sync` reports I/O
    /// errors).
    fn start_writeback(&self, offset: u64, len_bytes: u64) {
        let _ = (offset, len_bytes);
    }

    /// Starts writing `offset..offset+len_bytes` (already handed to `write_at`) to the
    /// device and waits until the device has it: the range's writeback, not durability
    /// (no device cache flush, no file metadata; only `sync` makes writes durable). For
    /// background segment writes that should last as long as the device takes
    /// (`Options::segment_writes_wait_for_device`). Errors: the writeback's I/O error. The
    /// default only starts the writeback.
    fn write_back_and_wait(&self, offset: u64, len_bytes: u64) -> Result<()> {
        self.start_writeback(offset, len_bytes);
        Ok(())
    }

    /// Whether the page holding byte `offset` is in memory, when the backend can tell
    /// cheaply (`None`: it cannot, or `offset` is out of range). A point-in-time hint, used
    /// to skip prefetching data that is already resident.
    fn resident(&self, offset: u64) -> Option<bool> {
        let _ = offset;
        None
    }

    /// Bytes the volume occupies on the device (less than `len_bytes` for sparse files).
    fn space_used_bytes(&self) -> Result<u64> {
        self.len_bytes()
    }

    /// Bytes moved through this handle since it was opened: `(written, read)`. Counts
    /// `write_at` and `read_at` payloads only (not `mapped` views, which are not I/O the
    /// backend sees). Backends that do not count return `(0, 0)`.
    fn io_bytes(&self) -> (u64, u64) {
        (0, 0)
    }

    /// The member holding volume offset `offset`, for a volume over several members
    /// (`None`: one file, or an offset in no placed group).
    fn member_of(&self, offset: u64) -> Option<usize> {
        let _ = offset;
        None
    }

    /// The member the next log segment should go to (the dispatch policy's choice), for a
    /// volume over several members; `None` for one file. A hint to the allocator, which
    /// falls back to any member when the chosen one has no free run. `avoid`: a member
    /// not to choose when another will do (GC's relocation segment goes away from the
    /// member of the victim it is reading: LOCS §3.3.3). `queued_write_bytes[m]`: bytes of
    /// writes waiting for member `m` in the write queue (reserved or queued, not started;
    /// missing entries are 0), counted as writes on that member by least-weighted-queue
    /// dispatch.
    fn dispatch_member(&self, avoid: Option<usize>, queued_write_bytes: &[u64]) -> Option<usize> {
        let _ = (avoid, queued_write_bytes);
        None
    }

    /// Where the groups the next `grow` adds go, for a volume over several members:
    /// `Some(m)` on member `m`, `None` the backend's own placement (round-robin). The
    /// allocator sets it around a growth for a member whose groups are full, under its
    /// lock (so no other growth sees it). A no-op for one file.
    fn place_growth_on(&self, member: Option<usize>) {
        let _ = member;
    }

    /// Free space of the file system (or device) holding member `member` (0 for one
    /// file), for the trim scheduler: forced trims when it runs low (`crate::trim`).
    /// `None`: unknown (memory, a backend that cannot tell), never low.
    fn device_space(&self, member: usize) -> Option<DeviceSpace> {
        let _ = member;
        None
    }

    /// What the backend stores its bytes in.
    fn kind(&self) -> StorageKind {
        StorageKind::Other
    }

    /// The most bytes the backend can ever hold, when fixed (a block device: `grow` past
    /// it fails); `None` when it grows as needed (a file, memory).
    fn capacity_bytes(&self) -> Option<u64> {
        None
    }

    /// Per-member figures of a volume over several members; empty for one file.
    fn members(&self) -> Vec<crate::volume::MemberStats> {
        Vec::new()
    }

    /// Adds `new` (named for messages; `blank`: it holds nothing and may be written) as
    /// the next member of this open volume over several members (DESIGN.md, "Adding a
    /// member"); new segments and node runs reach it by dispatch from then on.
    /// `table_unsure` is called when the member table's write or sync failed. The
    /// default refuses: a single-file volume has no member table.
    fn add_member(
        &self,
        new: (String, std::sync::Arc<dyn Storage>),
        blank: bool,
        table_unsure: &dyn Fn(),
    ) -> Result<crate::volume::AddedMember> {
        let _ = (new, blank, table_unsure);
        Err(crate::error::Error::InvalidArgument(
            crate::volume::members::SINGLE_FILE.into(),
        ))
    }

    /// Removes the member named `name` (its path as given, or a path to the same file)
    /// from this open volume over several members (DESIGN.md, "Removing a member"): its
    /// groups are copied onto the others while writes go on, then the member table marks
    /// it removed. `table_unsure` is called when the table's write or sync failed. The
    /// default refuses: a single-file volume has no member to remove.
    fn remove_member(
        &self,
        name: &str,
        table_unsure: &dyn Fn(),
    ) -> Result<crate::volume::RemovedMember> {
        let _ = (name, table_unsure);
        Err(crate::error::Error::InvalidArgument(
            "a single-file volume has no member to remove".into(),
        ))
    }

    /// Rebalances this open volume over several members (DESIGN.md, "Rebalancing onto a
    /// member"): groups move, one at a time and while writes go on, from the members
    /// holding the most to those holding the fewest, until they differ by one at most.
    /// `unsure` is called when a moved group's header may be durable but its move could
    /// not finish. The default refuses: a single-file volume has one member.
    fn rebalance(&self, unsure: &dyn Fn()) -> Result<crate::volume::Rebalanced> {
        let _ = unsure;
        Err(crate::error::Error::InvalidArgument(
            "a single-file volume has one member: there is nothing to rebalance".into(),
        ))
    }

    /// Re-reads and verifies what the backend keeps on the device about its own layout
    /// (a volume over several members: every slot header against the group map), for
    /// `check`. Errors name the member. The default has nothing to verify.
    fn verify_members(&self) -> Result<()> {
        Ok(())
    }
}
