//! Volumes over several members on the simulated disk: each member is a window of one
//! `SimStorage` (member `m` at offset `m << 40`), and `volume` opens the engine's
//! `MemberSet` over them, so every suite can run on a 3-member volume; `add_member` adds
//! the next window as a member of a closed volume, `new_member` gives it for an add to an
//! open one (the adds' power-loss tests, `tests/add_member.rs`, `tests/add_member_online.rs`,
//! over `member_add`'s volume and checks); `remove_member` removes one from a closed
//! volume and `volume_over` opens the windows left (`tests/remove_member.rs`);
//! `volume_grown` makes a volume of more groups than members and `rebalance` evens its
//! groups out (`tests/rebalance.rs`).
//!
//! Owns: the window (`Window`, a `Storage` that shifts offsets into its range and keeps
//! its own length) and the member lengths read back from a crash image. Does not own: the
//! crash model (`sim`: the windows share its one power domain, so power loss drops,
//! reorders and tears unsynced writes across all members at once, as for one machine).
//!
//! Where this is weaker than separate devices: a member's `sync` makes every member's
//! pending writes durable (the simulated disk has one durable image), so a bug that
//! forgets to sync one member while syncing another would not show here. The member set's
//! own unit tests check that `sync` reaches every dirty member.
//!
//! Thread-safety: `Send + Sync`, as `SimStorage`; a window's length is an atomic.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tucana::volume::{AddedMember, MemberSet, Rebalanced, RemovedMember, Storage};
use tucana::Result;

use crate::sim::{SimStorage, BLOCK_BYTES};

/// Bytes between two members' windows (1 TiB: far more than a case writes).
const WINDOW_BYTES: u64 = 1 << 40;

/// Bytes of a member slot (an allocation group).
const SLOT_BYTES: u64 = 128 << 20;

/// One member: the simulated disk's bytes from `base`, `len_bytes` long.
struct Window {
    sim: Arc<SimStorage>,
    base: u64,
    len_bytes: AtomicU64,
}

impl Storage for Window {
    fn len_bytes(&self) -> Result<u64> {
        Ok(self.len_bytes.load(Ordering::Acquire))
    }

    fn grow(&self, len_bytes: u64) -> Result<()> {
        assert!(len_bytes <= WINDOW_BYTES, "a member grew past its window");
        self.sim.grow(self.base + len_bytes)?;
        self.len_bytes.fetch_max(len_bytes, Ordering::AcqRel);
        Ok(())
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.sim.read_at(self.base + offset, buf)
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.sim.write_at(self.base + offset, data)
    }

    fn sync(&self) -> Result<()> {
        self.sim.sync()
    }

    fn punch_hole(&self, offset: u64, len: u64) -> Result<()> {
        self.sim.punch_hole(self.base + offset, len)
    }
}

/// The storage a suite opens the engine on: the simulated disk itself for one member,
/// else a `MemberSet` over `members` windows of it (created when the disk is empty).
/// A member's length is where its last written block ends, rounded up to a slot, so a
/// crash image reopens with the slots it holds. Errors: `MemberSet::open`'s (a crash image
/// whose member headers are wrong is a failed recovery, not a panic).
pub fn volume(sim: &Arc<SimStorage>, members: usize) -> Result<Arc<dyn Storage>> {
    if members <= 1 {
        return Ok(sim.clone());
    }
    Ok(member_set(sim, members)?)
}

/// As `volume` for two members or more, as the `MemberSet` itself (for what only the set
/// has: placing growth on a member, a test hook).
pub fn member_set(sim: &Arc<SimStorage>, members: usize) -> Result<Arc<MemberSet>> {
    Ok(Arc::new(MemberSet::open(windows(sim, members), true)?))
}

/// As `volume`, over the windows `which` (a volume some member was removed from is opened
/// over the others, in order).
pub fn volume_over(sim: &Arc<SimStorage>, which: &[usize]) -> Result<Arc<dyn Storage>> {
    Ok(Arc::new(MemberSet::open(windows_at(sim, which), false)?))
}

/// Removes the member at `position` of the windows `which` (every current member, in
/// order) from the closed volume over them (`MemberSet::remove_member`).
pub fn remove_member(
    sim: &Arc<SimStorage>,
    which: &[usize],
    position: usize,
) -> Result<RemovedMember> {
    MemberSet::remove_member(windows_at(sim, which), position)
}

/// A fresh volume over windows `0..members` of `sim` (which must be empty), grown to
/// `groups` groups placed round-robin before the engine creates its volume on it (so its
/// allocator covers every group).
pub fn volume_grown(
    sim: &Arc<SimStorage>,
    members: usize,
    groups: u64,
) -> Result<Arc<dyn Storage>> {
    let set = MemberSet::open(windows(sim, members), true)?;
    set.grow(groups * SLOT_BYTES)?;
    Ok(Arc::new(set))
}

/// Rebalances the closed volume over windows `0..members` (`MemberSet::rebalance`).
pub fn rebalance(sim: &Arc<SimStorage>, members: usize) -> Result<Rebalanced> {
    MemberSet::rebalance(windows(sim, members))
}

/// Adds window `members` as the next member of the closed volume over windows
/// `0..members` (`MemberSet::add_member`; blank when nothing was ever written in it).
pub fn add_member(sim: &Arc<SimStorage>, members: usize) -> Result<AddedMember> {
    let mut all = windows(sim, members + 1);
    all.pop();
    let (name, storage, blank) = new_member(sim, members)?;
    MemberSet::add_member(all, (name, storage), blank)
}

/// Window `index` as a member to add (to a closed volume, or to an open one with
/// `Database::add_member_storage`): its name, its storage and whether it is blank (nothing
/// was ever written in it).
pub fn new_member(sim: &Arc<SimStorage>, index: usize) -> Result<(String, Arc<dyn Storage>, bool)> {
    let (name, storage) = windows(sim, index + 1)
        .pop()
        .expect("the new member's window");
    let blank = storage.len_bytes()? == 0;
    Ok((name, storage, blank))
}

/// Windows `0..members` of the simulated disk, each as long as its written blocks reach
/// (rounded up to a slot).
fn windows(sim: &Arc<SimStorage>, members: usize) -> Vec<(String, Arc<dyn Storage>)> {
    windows_at(sim, &(0..members).collect::<Vec<_>>())
}

/// Windows `which`, in that order, each as long as its written blocks reach.
fn windows_at(sim: &Arc<SimStorage>, which: &[usize]) -> Vec<(String, Arc<dyn Storage>)> {
    let members = which.iter().max().map_or(0, |&m| m + 1);
    let mut ends = vec![0u64; members];
    for block in sim.current_image().written_blocks() {
        let at = block * BLOCK_BYTES;
        let m = (at / WINDOW_BYTES) as usize;
        if m < members {
            let end = (at % WINDOW_BYTES + BLOCK_BYTES).div_ceil(SLOT_BYTES) * SLOT_BYTES;
            ends[m] = ends[m].max(end);
        }
    }
    which
        .iter()
        .map(|&m| (m, ends[m]))
        .map(|(m, end)| {
            let window: Arc<dyn Storage> = Arc::new(Window {
                sim: sim.clone(),
                base: m as u64 * WINDOW_BYTES,
                len_bytes: AtomicU64::new(end),
            });
            (format!("sim member {m}"), window)
        })
        .collect()
}
