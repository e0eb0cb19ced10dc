//! A volume over several members (files or devices): the `Storage` that routes each volume
//! offset to the member and slot holding its group (DESIGN.md, "Volumes over several
//! devices").
//!
//! Owns: opening and validating a member set (refusing a missing, swapped, duplicated,
//! foreign or removed member before writing anything; a removed member's index holds a
//! stand-in), the map group → (member, slot) rebuilt from the slot headers, placing new
//! groups on members (round-robin, passing over removed and draining ones), per-member
//! dirtiness and the parallel `fdatasync`, per-member counters, and re-verifying the
//! headers for `check`. Reading headers (both copies of the table) and adding a member
//! are `members/table.rs`'s; open's per-member checks `members/checks.rs`'s; removing a
//! member `members/remove.rs`'s (closed volume) and `members/moving.rs`'s (open one, with
//! the second write of a piece of a moving group); rebalancing groups and settling two
//! slots that claim one group at open `members/rebalance.rs`'s (its online steps are in
//! `moving.rs`). Does not own: the members' I/O (each
//! is a `Storage`: `FileStorage` with its own mapping, or memory in tests), what the
//! bytes mean, nor which blocks are free (`alloc`).
//!
//! Thread-safety: `Send + Sync`. Map entries are atomics published once (after their
//! slot header was written) and read without a lock; only a removal or a rebalance on the
//! open volume changes a published entry (marks it moving, then switches it to its new
//! slot: see `moving.rs` for why writers lose nothing). The member list is append-only
//! (`MemberList`: a member added to the open volume is published before any map entry
//! names it); placement, growth, adds and a removal's steps serialise on `grow_lock`. I/O
//! to disjoint ranges runs in parallel, as for one file.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::volume::dispatch::{least_weighted, DispatchPolicy, Kind};
use crate::volume::slot_header::{
    new_uuid, uuid_hex, SlotHeader, Uuid, HEADER_OFFSET, MEMBERS_MAX, SLOT_BYTES,
};
use crate::volume::Storage;

pub use super::member_stats::MemberStats;

/// Groups per chunk of the map, and chunks: 2^20 groups (128 PiB) at most.
const CHUNK_GROUPS: usize = 1024;
const CHUNKS: usize = 1024;

/// Placement state, under `grow_lock`.
struct Placement {
    /// Member the next group goes to under round-robin.
    next_member: usize,
    /// Per member: slots with no valid header (free), lowest last.
    free_slots: Vec<Vec<u64>>,
    /// Per member: slots it has (its length in slots).
    slot_counts: Vec<u64>,
    /// Groups placed per member.
    groups: Vec<u64>,
    /// Groups with a place: `0..placed_groups`.
    placed_groups: u64,
}

/// A volume over several members. See the module doc.
pub struct MemberSet {
    /// Fixed capacity, appended to by an add on the open volume (`table.rs`).
    members: MemberList,
    volume_uuid: Uuid,
    /// group → `(member + 1) << 40 | slot`, 0 while unplaced.
    map: Box<[OnceLock<Box<[AtomicU64]>>]>,
    len_bytes: AtomicU64,
    grow_lock: Mutex<Placement>,
    /// Round-robin counter of `dispatch_member` (and its tie-breaker under LWQL).
    next_segment_member: AtomicU64,
    /// The member new groups go to (`Storage::place_growth_on`); `usize::MAX`:
    /// round-robin.
    growth_member: std::sync::atomic::AtomicUsize,
    policy: DispatchPolicy,
    /// Groups a removal on the open volume is moving, and the lock that orders its copy
    /// with the writes it must see (`moving.rs`).
    moves: Moves,
}

const SLOT_BITS: u32 = 40;

/// Set in a map entry while its group is copied to another member by a removal on the
/// open volume (`moving.rs`): writes to it are written again where it goes.
const MOVING_BIT: u64 = 1 << 63;

impl MemberSet {
    /// As `open_paths`, over any backends (memory or simulated disks in tests), each with
    /// the name its errors use.
    pub fn open(
        members: Vec<(String, Arc<dyn Storage>)>,
        create_if_missing: bool,
    ) -> Result<MemberSet> {
        let blank: Vec<bool> = members
            .iter()
            .map(|(_, s)| Ok(s.capacity_bytes().is_none() && s.len_bytes()? == 0))
            .collect::<Result<_>>()?;
        MemberSet::open_with_blank(members, &blank, create_if_missing)
    }

    /// As `open`; `blank[i]`: member `i` holds nothing and may be written by a creation
    /// (an empty file, or a device formatting was asked for that carries nothing of ours).
    fn open_with_blank(
        members: Vec<(String, Arc<dyn Storage>)>,
        blank: &[bool],
        create_if_missing: bool,
    ) -> Result<MemberSet> {
        if members.len() < 2 || members.len() > MEMBERS_MAX {
            return Err(Error::InvalidArgument(format!(
                "a volume over several members takes 2 to {MEMBERS_MAX}, not {}",
                members.len()
            )));
        }
        for (i, (name, storage)) in members.iter().enumerate() {
            if let Some(capacity) = storage.capacity_bytes().filter(|&c| c < SLOT_BYTES) {
                return Err(Error::Members(format!(
                    "member {i} ({name}) is a device of {capacity} bytes: a member holds whole slots of {SLOT_BYTES} bytes, at least one"
                )));
            }
        }
        let mut headers = Vec::with_capacity(members.len());
        for (name, storage) in &members {
            headers.push(read_header(storage.as_ref(), 0, name)?);
        }
        let lens: Vec<u64> = members
            .iter()
            .map(|(_, s)| s.len_bytes())
            .collect::<Result<_>>()?;
        let Some(table_header) = headers[0].clone().filter(|h| !h.table.is_empty()) else {
            if let Some(h) = &headers[0] {
                return Err(swapped(0, &members[0].0, h.member_index));
            }
            // No table: a fresh volume only if no member holds anything.
            if let Some(i) = blank.iter().position(|&b| !b) {
                let device = members[i].1.kind() == crate::volume::StorageKind::BlockDevice;
                let why = if let Some(h) = &headers[i] {
                    &*format!(
                        "carries a slot header of another Tucana volume ({}): never formatted over; wipe its first slot to reuse it",
                        uuid_hex(&h.volume_uuid)
                    )
                } else if device {
                    "is a block device that holds no member of a Tucana volume: a device is formatted only when formatting is asked for (Options::format_block_devices, tucana --format-device, which erases what it holds), and never when it carries a Tucana superblock"
                } else if i == 0 {
                    "has data but no member table: not member 0 of a Tucana volume"
                } else {
                    "has data but member 0 is empty"
                };
                return Err(Error::Members(format!(
                    "member {i} ({}) {why}",
                    members[i].0
                )));
            }
            if !create_if_missing {
                return Err(Error::Members(format!(
                    "member 0 ({}) is empty and creation was not asked for",
                    members[0].0
                )));
            }
            return MemberSet::create(members);
        };
        let table = &table_header.table;
        let volume_uuid = table_header.volume_uuid;
        if resumable_creation(&members, &headers, &lens, blank, volume_uuid)? {
            return MemberSet::create(members);
        }
        if table_header.member_index != 0 {
            return Err(swapped(0, &members[0].0, table_header.member_index));
        }
        // The paths given are the table's live members, in order: a removed member keeps
        // its index (slot headers carry it) and is left out.
        let live = live(table);
        for i in 0..headers.len() {
            check_member(i, live.get(i).copied(), &members, &headers, &table_header)?;
        }
        if members.len() < live.len() {
            let missing: Vec<String> = live[members.len()..]
                .iter()
                .map(|&i| format!("member {i} (uuid {})", uuid_hex(&table[i])))
                .collect();
            return Err(Error::Members(format!(
                "the volume has {} members, {} given: {} missing",
                live.len(),
                members.len(),
                missing.join(", ")
            )));
        }
        // More paths than the table is impossible here: each extra one would have failed
        // the index or uuid check above.
        let (members, lens) = with_removed(members, &headers, &lens, table);
        let set = MemberSet::assemble_with(members, volume_uuid, &lens)?;
        set.place_holes()?;
        Ok(set)
    }

    /// A fresh member set: a uuid for the volume and each member, group `i` in slot 0 of
    /// member `i`, member 0's header (with the table) written and synced first, so a crash
    /// leaves either nothing (a fresh volume again) or a table.
    fn create(members: Vec<(String, Arc<dyn Storage>)>) -> Result<MemberSet> {
        let volume_uuid = new_uuid()?;
        let uuids: Vec<Uuid> = (0..members.len())
            .map(|_| new_uuid())
            .collect::<Result<_>>()?;
        for (i, (_, storage)) in members.iter().enumerate() {
            storage.grow(SLOT_BYTES)?;
            let header = SlotHeader {
                member_index: i as u32,
                volume_uuid,
                member_uuid: uuids[i],
                group: i as u64,
                table: if i == 0 { uuids.clone() } else { Vec::new() },
                generation: 0,
                moved_from: None,
                rebalanced_from: None,
                rebalanced_moves: 0,
            };
            if i == 0 {
                // Recovery creates a volume whose slots hold this marker, and only such
                // a non-empty one.
                crate::volume::superblock::write_creation_marker(storage.as_ref())?;
            }
            storage.write_at(HEADER_OFFSET, &header.encode())?;
            storage.sync()?;
        }
        let lens = vec![SLOT_BYTES; members.len()];
        let members = members
            .into_iter()
            .zip(uuids)
            .map(|((name, storage), uuid)| (name, storage, uuid))
            .collect();
        MemberSet::assemble_with(members, volume_uuid, &lens)
    }

    /// The set over validated members, in table order (a removed one as its stand-in):
    /// reads every slot header to rebuild the map.
    fn assemble_with(
        members: Vec<(String, Arc<dyn Storage>, Uuid)>,
        volume_uuid: Uuid,
        lens: &[u64],
    ) -> Result<MemberSet> {
        let map = (0..CHUNKS).map(|_| OnceLock::new()).collect();
        let n = members.len();
        let set = MemberSet {
            members: MemberList::new(
                members
                    .into_iter()
                    .map(|(name, storage, uuid)| Member::new(name, storage, uuid))
                    .collect(),
            ),
            volume_uuid,
            map,
            len_bytes: AtomicU64::new(0),
            next_segment_member: AtomicU64::new(0),
            growth_member: std::sync::atomic::AtomicUsize::new(usize::MAX),
            policy: DispatchPolicy::RoundRobin,
            moves: Moves::default(),
            grow_lock: Mutex::new(Placement {
                next_member: 0,
                free_slots: vec![Vec::new(); n],
                slot_counts: vec![0; n],
                groups: vec![0; n],
                placed_groups: 0,
            }),
        };
        let mut placement = set.grow_lock.lock();
        let mut highest: Option<u64> = None;
        for (m, member) in set.members.iter().enumerate() {
            // A file's last slot may be partly grown; a device holds only whole slots.
            let slots = match member.storage.capacity_bytes() {
                Some(_) => lens[m] / SLOT_BYTES,
                None => lens[m].div_ceil(SLOT_BYTES),
            };
            placement.slot_counts[m] = slots;
            for slot in (0..slots).rev() {
                let header = read_header(member.storage.as_ref(), slot, &member.name)?;
                // A group copied off a member counts once the table marks that member
                // removed; before, it is what a removal that did not finish left: free.
                let Some(h) = header.filter(|h| {
                    h.volume_uuid == set.volume_uuid
                        && h.member_index as usize == m
                        && h.moved_from.is_none_or(|r| set.is_removed(r as usize))
                }) else {
                    placement.free_slots[m].push(slot);
                    continue;
                };
                if m == 0 && slot == 0 && h.group != 0 {
                    return Err(set.corrupt(0, 0, format!("holds group {}, not group 0", h.group)));
                }
                let entry = set.entry(h.group).ok_or_else(|| {
                    set.corrupt(
                        m,
                        slot,
                        format!("names group {}, past the most a volume has", h.group),
                    )
                })?;
                let packed = ((m as u64 + 1) << SLOT_BITS) | slot;
                if let Err(held) =
                    entry.compare_exchange(0, packed, Ordering::AcqRel, Ordering::Acquire)
                {
                    // Two claimants: a rebalance's copy and its source, or corruption.
                    set.settle_claim(&mut placement, entry, held, (m, slot, &h))?;
                    continue;
                }
                placement.groups[m] += 1;
                highest = Some(highest.map_or(h.group, |g| g.max(h.group)));
            }
        }
        let groups = highest.map_or(0, |g| g + 1);
        placement.placed_groups = groups;
        placement.next_member = (groups as usize) % n;
        drop(placement);
        set.len_bytes.store(groups * SLOT_BYTES, Ordering::Release);
        Ok(set)
    }

    /// Places every group below the highest placed one that has no slot (its header did
    /// not reach the device before a crash: it held nothing durable).
    fn place_holes(&self) -> Result<()> {
        let mut placement = self.grow_lock.lock();
        for group in 0..placement.placed_groups {
            if self.lookup(group).is_none() {
                self.place(&mut placement, group)?;
            }
        }
        Ok(())
    }

    /// Gives `group` a slot on the member round-robin names (or the one
    /// `place_growth_on` named): writes its header, then publishes it in the map.
    fn place(&self, placement: &mut Placement, group: u64) -> Result<()> {
        let n = self.members.len();
        let named = self.growth_member.load(Ordering::Acquire);
        let m = if named < n && self.has_room(placement, named) {
            named
        } else {
            // Round-robin over the members with room: a full device is passed over, so
            // the group goes to another member instead of failing.
            let Some(m) = (0..n)
                .map(|k| (placement.next_member + k) % n)
                .find(|&m| self.has_room(placement, m))
            else {
                let full: Vec<String> = self.members.iter().map(|m| m.name.clone()).collect();
                return Err(Error::Io(std::io::Error::new(
                    std::io::ErrorKind::StorageFull,
                    format!(
                        "no member has room for group {group}: every member is a full block device ({})",
                        full.join(", ")
                    ),
                )));
            };
            placement.next_member = (m + 1) % n;
            m
        };
        let member = &self.members[m];
        let slot = match placement.free_slots[m].pop() {
            Some(slot) => slot,
            None => {
                let slot = placement.slot_counts[m];
                member.storage.grow((slot + 1) * SLOT_BYTES)?;
                placement.slot_counts[m] = slot + 1;
                slot
            }
        };
        let header = SlotHeader {
            member_index: m as u32,
            volume_uuid: self.volume_uuid,
            member_uuid: member.uuid,
            group,
            table: Vec::new(),
            generation: 0,
            moved_from: None,
            rebalanced_from: None,
            rebalanced_moves: 0,
        };
        member
            .storage
            .write_at(slot * SLOT_BYTES + HEADER_OFFSET, &header.encode())?;
        member.dirty.store(true, Ordering::Release);
        let entry = self.entry(group).ok_or_else(|| {
            Error::InvalidArgument(format!("group {group} is past the most a volume has"))
        })?;
        entry.store(((m as u64 + 1) << SLOT_BITS) | slot, Ordering::Release);
        placement.groups[m] += 1;
        placement.placed_groups = placement.placed_groups.max(group + 1);
        Ok(())
    }

    /// Whether member `m` can take one more group: a free slot, or room to grow one (a
    /// file always has; a device only below its capacity).
    fn has_room(&self, placement: &Placement, m: usize) -> bool {
        if self.members[m].takes_nothing() {
            return false;
        }
        !placement.free_slots[m].is_empty()
            || self.members[m]
                .storage
                .capacity_bytes()
                .is_none_or(|cap| (placement.slot_counts[m] + 1) * SLOT_BYTES <= cap)
    }

    /// The map entry of `group`, its chunk allocated if needed; `None` past the map.
    fn entry(&self, group: u64) -> Option<&AtomicU64> {
        let chunk = self.map.get(group as usize / CHUNK_GROUPS)?;
        let chunk = chunk.get_or_init(|| (0..CHUNK_GROUPS).map(|_| AtomicU64::new(0)).collect());
        Some(&chunk[group as usize % CHUNK_GROUPS])
    }

    /// Whether member `m` is a removed member's stand-in (`false` past the list).
    fn is_removed(&self, m: usize) -> bool {
        self.members.get(m).is_some_and(|member| member.removed)
    }

    /// `(member, slot)` of `group`, if placed.
    fn lookup(&self, group: u64) -> Option<(usize, u64)> {
        match self.packed(group) {
            0 => None,
            packed => Some(unpack(packed)),
        }
    }

    /// The map entry of `group` as stored (0: unplaced). Sequentially consistent: a
    /// writer's load after its write and a removal's store of `MOVING_BIT` before its copy
    /// reads are ordered (`moving.rs`); on x86 it is a plain load.
    fn packed(&self, group: u64) -> u64 {
        let Some(chunk) = self
            .map
            .get(group as usize / CHUNK_GROUPS)
            .and_then(|c| c.get())
        else {
            return 0;
        };
        chunk[group as usize % CHUNK_GROUPS].load(Ordering::SeqCst)
    }

    /// The member and member offset of volume offset `offset`, and the bytes from there to
    /// the end of its group. Errors for an offset in no placed group.
    fn locate(&self, offset: u64) -> Result<(&Member, u64, u64)> {
        self.locate_packed(offset, self.packed(offset / SLOT_BYTES))
    }

    /// As `locate`, with the map entry of `offset`'s group already loaded.
    fn locate_packed(&self, offset: u64, packed: u64) -> Result<(&Member, u64, u64)> {
        let group = offset / SLOT_BYTES;
        let Some((m, slot)) = (packed != 0).then(|| unpack(packed)) else {
            return Err(Error::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("volume offset {offset:#x} lies in group {group}, which no member holds"),
            )));
        };
        let within = offset % SLOT_BYTES;
        Ok((
            &self.members[m],
            slot * SLOT_BYTES + within,
            SLOT_BYTES - within,
        ))
    }

    /// Runs `f(member, member offset, piece range)` over the pieces of
    /// `offset..offset+len`, one per group.
    fn each_piece(
        &self,
        offset: u64,
        len: usize,
        mut f: impl FnMut(&Member, u64, std::ops::Range<usize>) -> Result<()>,
    ) -> Result<()> {
        let mut done = 0usize;
        while done < len {
            let (member, at, room) = self.locate(offset + done as u64)?;
            let piece = (len - done).min(room as usize);
            f(member, at, done..done + piece)?;
            done += piece;
        }
        Ok(())
    }

    fn corrupt(&self, m: usize, slot: u64, detail: String) -> Error {
        Error::Members(format!(
            "member {m} ({}) slot {slot}: {detail}",
            self.members[m].name
        ))
    }

    /// The same set, dispatching log segments by `policy` (round-robin by default).
    pub fn with_policy(mut self, policy: DispatchPolicy) -> MemberSet {
        self.policy = policy;
        self
    }

    /// Per-member figures.
    pub fn member_stats(&self) -> Vec<MemberStats> {
        let placement = self.grow_lock.lock();
        self.members
            .iter()
            .enumerate()
            .map(|(m, member)| MemberStats {
                name: member.name.clone(),
                kind: member.storage.kind().as_str().to_string(),
                state: match (member.removed, member.draining.load(Ordering::Relaxed)) {
                    (false, false) => "live",
                    (false, true) if placement.groups[m] > 0 => "draining",
                    _ => "removed",
                }
                .to_string(),
                uuid: uuid_hex(&member.uuid),
                groups: placement.groups[m],
                bytes_written: member.written_bytes.load(Ordering::Relaxed),
                bytes_read: member.read_bytes.load(Ordering::Relaxed),
                in_flight_requests: member.load.in_flight_requests(),
                in_flight_bytes: member.load.in_flight_bytes(),
                in_flight_read_bytes: member.load.in_flight_bytes_of(Kind::Read),
                in_flight_write_bytes: member.load.in_flight_bytes_of(Kind::Write)
                    + member.load.in_flight_bytes_of(Kind::Writeback),
                weighted_queue_ps: member.load.weighted_length(),
                write_ps_per_byte: member.load.ps_per_byte(Kind::Write),
                read_ps_per_byte: member.load.ps_per_byte(Kind::Read),
                writeback_ps_per_byte: member.load.ps_per_byte(Kind::Writeback),
                ..MemberStats::default()
            })
            .collect()
    }

    /// Re-reads every placed group's slot header and checks it names its volume, member
    /// and group as the map does. Errors name the member and slot.
    pub fn verify(&self) -> Result<()> {
        // Under the lock: an add on the open volume publishes its member under it, after
        // its table is durable, so the table and the member list are read in one state.
        let groups = {
            let placement = self.grow_lock.lock();
            self.verify_table()?;
            placement.placed_groups
        };
        for group in 0..groups {
            let Some((m, slot)) = self.lookup(group) else {
                return Err(Error::Members(format!("group {group} has no member")));
            };
            let member = &self.members[m];
            if member.removed {
                return Err(Error::Members(format!(
                    "group {group} is on member {m}, which the member table says was removed"
                )));
            }
            if let Some(cap) = member.storage.capacity_bytes() {
                if (slot + 1) * SLOT_BYTES > cap {
                    return Err(self.corrupt(
                        m,
                        slot,
                        format!("holds group {group} past the end of the device ({cap} bytes)"),
                    ));
                }
            }
            match read_header(member.storage.as_ref(), slot, &member.name)? {
                Some(h)
                    if h.volume_uuid == self.volume_uuid
                        && h.member_index as usize == m
                        && h.member_uuid == member.uuid
                        && h.group == group => {}
                other => {
                    return Err(self.corrupt(
                        m,
                        slot,
                        format!("should hold group {group}, its header is {other:?}"),
                    ))
                }
            }
        }
        Ok(())
    }
}

fn unpack(packed: u64) -> (usize, u64) {
    let packed = packed & !MOVING_BIT;
    (
        ((packed >> SLOT_BITS) - 1) as usize,
        packed & ((1 << SLOT_BITS) - 1),
    )
}

impl MemberSet {
    /// `write_at` or, with `uncached`, `write_uncached_at`, one piece per group. A piece
    /// of a group that a removal is moving, or moved while the piece was written, is
    /// written again where the group goes (`moving.rs`): one more load of its map entry
    /// per piece when nothing moves.
    fn write_pieces(&self, offset: u64, data: &[u8], uncached: bool) -> Result<()> {
        let mut done = 0usize;
        while done < data.len() {
            let at = offset + done as u64;
            let group = at / SLOT_BYTES;
            let packed = self.packed(group);
            let (member, local, room) = self.locate_packed(at, packed)?;
            let bytes = &data[done..done + (data.len() - done).min(room as usize)];
            write_member(member, local, bytes, uncached)?;
            // The write's bytes must be visible before the entry is loaded again, as the
            // removal's `fetch_or` of `MOVING_BIT` comes before its copy reads them (the
            // two sides of `moving.rs`'s argument). A sequentially consistent load alone
            // does not order an earlier plain store (x86 lets a load pass a buffered
            // store); the fence does, once per piece (a segment or a node run).
            std::sync::atomic::fence(Ordering::SeqCst);
            let now = self.packed(group);
            if now != packed || now & MOVING_BIT != 0 {
                self.write_again(group, at % SLOT_BYTES, bytes, uncached)?;
            }
            done += bytes.len();
        }
        Ok(())
    }

    /// `read_at` or, with `random`, `read_random_at`: each member's piece read the same way.
    fn read_pieces(&self, offset: u64, buf: &mut [u8], random: bool) -> Result<()> {
        let len_bytes = self.len_bytes.load(Ordering::Acquire);
        if offset
            .checked_add(buf.len() as u64)
            .is_none_or(|end| end > len_bytes)
        {
            return Err(Error::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!(
                    "read of {} bytes at {offset:#x} past the end of the volume ({len_bytes} bytes)",
                    buf.len()
                ),
            )));
        }
        self.each_piece(offset, buf.len(), |member, at, range| {
            let n = range.len() as u64;
            member.timed(Kind::Read, n, || {
                let piece = &mut buf[range];
                if random {
                    member.storage.read_random_at(at, piece)
                } else {
                    member.storage.read_at(at, piece)
                }
            })?;
            member.read_bytes.fetch_add(n, Ordering::Relaxed);
            Ok(())
        })
    }
}

impl Storage for MemberSet {
    fn len_bytes(&self) -> Result<u64> {
        Ok(self.len_bytes.load(Ordering::Acquire))
    }

    fn grow(&self, len_bytes: u64) -> Result<()> {
        let mut placement = self.grow_lock.lock();
        if len_bytes <= self.len_bytes.load(Ordering::Acquire) {
            return Ok(());
        }
        for group in placement.placed_groups..len_bytes.div_ceil(SLOT_BYTES) {
            self.place(&mut placement, group)?;
        }
        self.len_bytes.store(len_bytes, Ordering::Release);
        Ok(())
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.read_pieces(offset, buf, false)
    }

    fn read_random_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.read_pieces(offset, buf, true)
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.write_pieces(offset, data, false)
    }

    fn write_uncached_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.write_pieces(offset, data, true)
    }

    fn sync(&self) -> Result<()> {
        // Every member a write may be waiting on: dirty, or being synced by another
        // caller (a commit's sync beside a group sync) whose `fdatasync` may not be done.
        let busy: Vec<&Member> = self.members.iter().filter(|m| m.needs_sync()).collect();
        match busy.as_slice() {
            [] => Ok(()),
            [only] => only.sync(),
            [first, rest @ ..] => std::thread::scope(|scope| {
                let others: Vec<_> = rest
                    .iter()
                    .map(|member| scope.spawn(move || member.sync()))
                    .collect();
                let mut result = first.sync();
                for handle in others {
                    let other = handle.join().expect("a member's sync panicked");
                    result = result.and(other);
                }
                result
            }),
        }
    }

    unsafe fn mapped(&self, offset: u64, len: usize) -> Option<&[u8]> {
        let (member, at, room) = self.locate(offset).ok()?;
        if len as u64 > room {
            return None;
        }
        // SAFETY: the caller's guarantee for `offset..offset+len` is the same guarantee
        // for the member's range it maps to (the map never moves a placed group).
        unsafe { member.storage.mapped(at, len) }
    }

    fn punch_hole(&self, offset: u64, len: u64) -> Result<()> {
        let mut done = 0u64;
        while done < len {
            let (member, at, room) = self.locate(offset + done)?;
            let piece = (len - done).min(room);
            member.timed(Kind::Trim, piece, || member.storage.punch_hole(at, piece))?;
            member.dirty.store(true, Ordering::Release);
            done += piece;
        }
        Ok(())
    }

    fn prefetch(&self, offset: u64, len_bytes: u64) {
        let end = offset
            .saturating_add(len_bytes)
            .min(self.len_bytes.load(Ordering::Acquire));
        let mut at = offset;
        while at < end {
            let Ok((member, local, room)) = self.locate(at) else {
                return;
            };
            let piece = (end - at).min(room);
            // Read work the member will do that no request of ours waits for:
            // least-weighted dispatch counts it as announced (`Load::announce_read`).
            member.load.announce_read(piece);
            member.storage.prefetch(local, piece);
            at += piece;
        }
    }

    fn start_writeback(&self, offset: u64, len_bytes: u64) {
        let mut at = offset;
        let end = offset.saturating_add(len_bytes);
        while at < end {
            let Ok((member, local, room)) = self.locate(at) else {
                return;
            };
            let piece = (end - at).min(room);
            member.storage.start_writeback(local, piece);
            at += piece;
        }
    }

    fn write_back_and_wait(&self, offset: u64, len_bytes: u64) -> Result<()> {
        // Timed as a writeback: the member's queue holds these bytes while it lasts, and
        // its time per byte is the device's (apart from the copy's, `Kind::Write`).
        let mut at = offset;
        let end = offset.saturating_add(len_bytes);
        while at < end {
            let (member, local, room) = self.locate(at)?;
            let piece = (end - at).min(room);
            member.timed(Kind::Writeback, piece, || {
                member.storage.write_back_and_wait(local, piece)
            })?;
            at += piece;
        }
        Ok(())
    }

    fn resident(&self, offset: u64) -> Option<bool> {
        let (member, at, _) = self.locate(offset).ok()?;
        member.storage.resident(at)
    }

    fn space_used_bytes(&self) -> Result<u64> {
        self.members
            .iter()
            .try_fold(0u64, |sum, m| Ok(sum + m.storage.space_used_bytes()?))
    }

    fn io_bytes(&self) -> (u64, u64) {
        self.members.iter().fold((0, 0), |(w, r), m| {
            (
                w + m.written_bytes.load(Ordering::Relaxed),
                r + m.read_bytes.load(Ordering::Relaxed),
            )
        })
    }

    fn members(&self) -> Vec<MemberStats> {
        self.member_stats()
    }

    fn device_space(&self, member: usize) -> Option<crate::volume::DeviceSpace> {
        self.members.get(member)?.storage.device_space(0)
    }

    fn place_growth_on(&self, member: Option<usize>) {
        self.growth_member
            .store(member.unwrap_or(usize::MAX), Ordering::Release);
    }

    fn member_of(&self, offset: u64) -> Option<usize> {
        self.lookup(offset / SLOT_BYTES).map(|(m, _)| m)
    }

    fn dispatch_member(&self, avoid: Option<usize>, queued_write_bytes: &[u64]) -> Option<usize> {
        let n = self.members.len();
        let turn = (self.next_segment_member.fetch_add(1, Ordering::Relaxed) % n as u64) as usize;
        let lengths: Vec<u64> = match self.policy {
            DispatchPolicy::Member(m)
                if m < n && Some(m) != avoid && !self.members[m].takes_nothing() =>
            {
                return Some(m)
            }
            // Round-robin is least-weighted with every member weighing the same.
            DispatchPolicy::RoundRobin | DispatchPolicy::Member(_) => vec![0; n],
            DispatchPolicy::LeastWeightedQueue => self
                .members
                .iter()
                .take(n)
                .enumerate()
                .map(|(m, member)| {
                    let queued = queued_write_bytes.get(m).copied().unwrap_or(0);
                    member.load.weighted_length_with_queued(queued)
                })
                .collect(),
        };
        // A removed member's stand-in never takes a segment or a node run (one more load
        // of a flag per member, beside the load figures LWQL reads anyway).
        let lengths: Vec<u64> = lengths
            .into_iter()
            .zip(self.members.iter())
            .enumerate()
            .map(|(m, (len, member))| {
                if Some(m) == avoid || member.takes_nothing() {
                    u64::MAX
                } else {
                    len
                }
            })
            .collect();
        Some(least_weighted(&lengths, turn))
    }

    fn verify_members(&self) -> Result<()> {
        self.verify()
    }

    fn add_member(
        &self,
        new: (String, Arc<dyn Storage>),
        blank: bool,
        table_unsure: &dyn Fn(),
    ) -> Result<AddedMember> {
        self.add_member_online(new, blank, table_unsure)
    }

    fn remove_member(&self, name: &str, table_unsure: &dyn Fn()) -> Result<RemovedMember> {
        let identity = paths::file_identity(std::path::Path::new(name));
        let r = self
            .members
            .iter()
            .position(|m| {
                !m.removed
                    && (m.name == name
                        || identity.is_some()
                            && paths::file_identity(std::path::Path::new(&m.name)) == identity)
            })
            .ok_or_else(|| Error::Members(format!("{name} is not a member of the open volume")))?;
        self.remove_member_online(r, table_unsure)
    }

    fn rebalance(&self, unsure: &dyn Fn()) -> Result<Rebalanced> {
        self.rebalance_online(unsure)
    }

    fn kind(&self) -> crate::volume::StorageKind {
        crate::volume::StorageKind::Members
    }
}

mod checks;
mod member;
mod moving;
mod paths;
mod rebalance;
mod remove;
mod table;

pub use checks::refuse_lone_member;
use checks::{check_member, live, resumable_creation, swapped, with_removed};
use member::{Member, MemberList};
use moving::{write_member, Moves};
pub use rebalance::Rebalanced;
pub use remove::RemovedMember;
pub(crate) use table::read_header;
pub use table::AddedMember;
pub(crate) use table::SINGLE_FILE;

#[cfg(test)]
mod tests;
