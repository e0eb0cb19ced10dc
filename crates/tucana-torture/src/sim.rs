//! The simulated volume: a `Storage` that keeps the *durable* image and the *volatile*
//! (unsynced) writes apart, simulates power loss, and injects faults.
//!
//! Owns: a sparse block image of what reads see (`current`), the image that survived the
//! last successful `sync` (`durable`), the list of operations issued since then
//! (`pending`), the I/O counter and the armed faults. Does not own: any knowledge of the
//! engine's layout (the suites classify blocks themselves).
//!
//! Power loss (`crash`): the post-crash image is the durable image plus an arbitrary subset
//! of the pending operations, applied in issue order or shuffled (a later write to the same
//! bytes may lose to an earlier one, as when the page cache wrote an old version back
//! before the crash), and possibly one write torn at a 512-byte sector boundary (only its
//! first or only its last sectors reach the disk). Grows that are not kept leave the
//! length shorter and drop the bytes written past it.
//!
//! Faults are numbered by I/O: every `read_at`, `write_at`, `sync`, `grow` and
//! `punch_hole` takes the next number (0-based); `len_bytes` and `io_bytes` do not count.
//! A scheduled crash *freezes* the storage at an I/O number: the state before that I/O is
//! kept for `crash`, and that I/O and every later one fail, as for a process whose machine
//! lost power (nothing after the instant can reach the disk, nor be acknowledged). A crash
//! may also be scheduled at the Nth I/O issued by a thread of a given name
//! (`arm_crash_in_thread`), to lose power while the engine's background garbage collector
//! is at work; the storage remembers which thread issued the I/O a crash froze at. The
//! I/Os of one named thread can be counted (`count_ios_in_thread`), to size a sweep of
//! crash points in an operation that runs beside other threads' I/O.
//!
//! Thread-safety: `Send + Sync`; all state sits behind one mutex, so I/O is serialised and
//! the I/O numbering is exact when only one thread does I/O (the suites replay exactly
//! when the engine's background thread is off).
//!
//! Determinism: every random choice comes from an `StdRng` the caller seeds; a `HashMap` is
//! used only for lookups, never iterated where order matters.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use tucana::volume::Storage;
use tucana::{Error, Result};

/// Bytes of one block of the sparse image (the engine's block size).
pub const BLOCK_BYTES: u64 = 4096;
/// Granularity at which a write may tear.
pub const SECTOR_BYTES: u64 = 512;

type Block = Arc<[u8; BLOCK_BYTES as usize]>;

/// A sparse volume image: absent blocks read as zeros. Cloning shares blocks
/// (copy-on-write), so crash images cost memory only for what they change.
#[derive(Clone, Default)]
pub struct Image {
    len_bytes: u64,
    blocks: HashMap<u64, Block>,
}

impl Image {
    pub fn len_bytes(&self) -> u64 {
        self.len_bytes
    }

    /// Block numbers holding bytes (possibly zeros), sorted.
    pub fn written_blocks(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.blocks.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Copies `buf.len()` bytes at `offset`; the caller checked the range.
    fn read(&self, offset: u64, buf: &mut [u8]) {
        let mut done = 0usize;
        while done < buf.len() {
            let at = offset + done as u64;
            let (block, within) = (at / BLOCK_BYTES, (at % BLOCK_BYTES) as usize);
            let n = (BLOCK_BYTES as usize - within).min(buf.len() - done);
            match self.blocks.get(&block) {
                Some(b) => buf[done..done + n].copy_from_slice(&b[within..within + n]),
                None => buf[done..done + n].fill(0),
            }
            done += n;
        }
    }

    /// Writes `data` at `offset`, ignoring any bytes at or past the image length.
    fn write(&mut self, offset: u64, data: &[u8]) {
        let end = (offset + data.len() as u64).min(self.len_bytes);
        let mut at = offset;
        while at < end {
            let (block, within) = (at / BLOCK_BYTES, (at % BLOCK_BYTES) as usize);
            let n = ((BLOCK_BYTES as usize - within) as u64).min(end - at) as usize;
            let src = (at - offset) as usize;
            let b = self
                .blocks
                .entry(block)
                .or_insert_with(|| Arc::new([0u8; BLOCK_BYTES as usize]));
            Arc::make_mut(b)[within..within + n].copy_from_slice(&data[src..src + n]);
            at += n as u64;
        }
    }

    fn zero(&mut self, offset: u64, len: u64) {
        let end = offset.saturating_add(len).min(self.len_bytes);
        let mut at = offset;
        while at < end {
            let (block, within) = (at / BLOCK_BYTES, (at % BLOCK_BYTES) as usize);
            let n = ((BLOCK_BYTES as usize - within) as u64).min(end - at) as usize;
            if let Some(b) = self.blocks.get_mut(&block) {
                Arc::make_mut(b)[within..within + n].fill(0);
            }
            at += n as u64;
        }
    }

    fn grow(&mut self, len_bytes: u64) {
        self.len_bytes = self.len_bytes.max(len_bytes);
    }

    /// Cuts the image to `len_bytes` (bytes past it are gone, as if never written).
    fn truncate(&mut self, len_bytes: u64) {
        self.len_bytes = len_bytes;
        let first_gone = len_bytes.div_ceil(BLOCK_BYTES);
        self.blocks.retain(|&b, _| b < first_gone);
        let partial = len_bytes % BLOCK_BYTES;
        if partial != 0 {
            if let Some(b) = self.blocks.get_mut(&(len_bytes / BLOCK_BYTES)) {
                Arc::make_mut(b)[partial as usize..].fill(0);
            }
        }
    }

    fn apply(&mut self, op: &Pending) {
        match op {
            Pending::Write { offset, data } => self.write(*offset, data),
            Pending::Grow(len) => self.grow(*len),
            Pending::Punch { offset, len } => self.zero(*offset, *len),
        }
    }
}

/// An operation issued since the last successful sync.
#[derive(Clone, Debug)]
enum Pending {
    Write { offset: u64, data: Arc<[u8]> },
    Grow(u64),
    Punch { offset: u64, len: u64 },
}

/// What kind of I/O an I/O number was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoKind {
    Read,
    Write,
    Sync,
    Grow,
    Punch,
}

/// A fault armed on I/O number `at_io`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// That I/O fails (nothing happens); later ones succeed.
    FailOnce { at_io: u64 },
    /// That I/O and every later one fail.
    FailFrom { at_io: u64 },
    /// If that I/O is a write: a prefix of it (a whole number of sectors, possibly none)
    /// is written, then it fails. Other kinds fail plainly.
    ShortWrite { at_io: u64 },
    /// If that I/O is a write: it lands `to_block - from_block` blocks away (same offset
    /// within the block) and reports success; the intended bytes keep their old content.
    /// Other kinds are unaffected. A target past the end wraps into the volume.
    Misdirect { at_io: u64, to_block: u64 },
    /// Power loss just before that I/O: see the module doc.
    Crash { at_io: u64 },
}

struct State {
    current: Image,
    durable: Image,
    pending: Vec<Pending>,
    io_count: u64,
    faults: Vec<Fault>,
    /// Set by `Fault::Crash`: durable image and pending operations at the instant of the
    /// power loss.
    frozen: Option<(Image, Vec<Pending>)>,
    /// Name of the thread whose I/O the crash froze at (`None`: unnamed, or no crash).
    crash_thread: Option<String>,
    /// `arm_crash_in_thread`: a thread name and how many of its I/Os go ahead first.
    crash_in_thread: Option<(String, u64)>,
    /// `count_ios_in_thread`: a thread name and how many I/Os it issued since.
    counted_thread: Option<(String, u64)>,
    /// Set once a `FailFrom` fault fired.
    failing: bool,
    /// I/O numbers and kinds that were failed (or cut short, or misdirected).
    faulted: Vec<(u64, IoKind)>,
    /// Kind of every I/O so far, by number.
    kinds: Vec<IoKind>,
    rng: StdRng,
    written_bytes: u64,
    read_bytes: u64,
}

/// The simulated volume. See the module doc.
pub struct SimStorage {
    state: Mutex<State>,
}

fn injected(what: &str, io: u64) -> Error {
    Error::Io(std::io::Error::other(format!(
        "injected fault: {what} at I/O {io}"
    )))
}

impl SimStorage {
    /// An empty volume; `seed` drives the fault choices made while running (short write
    /// lengths).
    pub fn new(seed: u64) -> SimStorage {
        SimStorage::from_image(Image::default(), seed)
    }

    /// A volume whose durable (and visible) contents are `image`.
    pub fn from_image(image: Image, seed: u64) -> SimStorage {
        use rand::SeedableRng;
        SimStorage {
            state: Mutex::new(State {
                current: image.clone(),
                durable: image,
                pending: Vec::new(),
                io_count: 0,
                faults: Vec::new(),
                frozen: None,
                crash_thread: None,
                crash_in_thread: None,
                counted_thread: None,
                failing: false,
                faulted: Vec::new(),
                kinds: Vec::new(),
                rng: StdRng::seed_from_u64(seed),
                written_bytes: 0,
                read_bytes: 0,
            }),
        }
    }

    /// Arms a fault (several may be armed; each fires at most at its I/O number).
    pub fn arm(&self, fault: Fault) {
        self.state.lock().faults.push(fault);
    }

    /// Schedules power loss just before the I/O that makes `ios_first` I/Os issued by
    /// threads named `thread` (counted from now) go ahead; I/O of other threads does not
    /// count. Replaces an earlier such schedule that has not fired.
    pub fn arm_crash_in_thread(&self, thread: &str, ios_first: u64) {
        self.state.lock().crash_in_thread = Some((thread.to_string(), ios_first));
    }

    /// Counts the I/Os issued by threads named `thread` from now (`ios_in_thread`): how
    /// many crash points `arm_crash_in_thread` has in an operation that runs beside
    /// others' I/O.
    pub fn count_ios_in_thread(&self, thread: &str) {
        self.state.lock().counted_thread = Some((thread.to_string(), 0));
    }

    /// The I/Os counted since `count_ios_in_thread` (0 if it was not called).
    pub fn ios_in_thread(&self) -> u64 {
        self.state.lock().counted_thread.as_ref().map_or(0, |c| c.1)
    }

    /// Removes every armed fault that has not fired; a `FailFrom` that fired stays.
    pub fn disarm(&self) {
        let mut s = self.state.lock();
        s.faults.clear();
        s.crash_in_thread = None;
    }

    /// The name of the thread whose I/O a scheduled crash froze the storage at.
    pub fn crash_thread(&self) -> Option<String> {
        self.state.lock().crash_thread.clone()
    }

    /// How many I/Os of `kind` were issued so far.
    pub fn io_count_of(&self, kind: IoKind) -> u64 {
        self.state
            .lock()
            .kinds
            .iter()
            .filter(|k| **k == kind)
            .count() as u64
    }

    /// Number of I/Os issued so far (the next I/O gets this number).
    pub fn io_count(&self) -> u64 {
        self.state.lock().io_count
    }

    /// The kind of every I/O so far, indexed by I/O number.
    pub fn io_kinds(&self) -> Vec<IoKind> {
        self.state.lock().kinds.clone()
    }

    /// I/Os that a fault hit, with their kinds.
    pub fn faulted(&self) -> Vec<(u64, IoKind)> {
        self.state.lock().faulted.clone()
    }

    /// Whether a scheduled crash happened (the storage is frozen).
    pub fn crashed(&self) -> bool {
        self.state.lock().frozen.is_some()
    }

    /// Number of operations issued since the last successful sync (or up to the crash).
    pub fn pending_ops(&self) -> usize {
        let s = self.state.lock();
        match &s.frozen {
            Some((_, p)) => p.len(),
            None => s.pending.len(),
        }
    }

    /// What reads see now.
    pub fn current_image(&self) -> Image {
        self.state.lock().current.clone()
    }

    /// What survived the last successful sync (at the crash instant, once frozen).
    pub fn durable_image(&self) -> Image {
        let s = self.state.lock();
        match &s.frozen {
            Some((d, _)) => d.clone(),
            None => s.durable.clone(),
        }
    }

    /// Simulated power loss: a fresh storage holding the durable image plus an arbitrary
    /// subset of the pending operations (see the module doc). Uses the state at the
    /// crash instant if a scheduled crash froze the storage. Call it several times with
    /// different generators for several crash states of one instant.
    pub fn crash(&self, rng: &mut StdRng) -> SimStorage {
        let image = self.crash_image(rng);
        SimStorage::from_image(image, rng.random())
    }

    /// The post-crash image of `crash`.
    pub fn crash_image(&self, rng: &mut StdRng) -> Image {
        let (durable, pending) = {
            let s = self.state.lock();
            match &s.frozen {
                Some((d, p)) => (d.clone(), p.clone()),
                None => (s.durable.clone(), s.pending.clone()),
            }
        };
        crash_image(durable, &pending, rng)
    }

    /// Flips bit `bit` (0 = least significant) of the byte at `offset`, in the durable
    /// and the visible image alike (corruption at rest).
    pub fn flip_bit(&self, offset: u64, bit: u8) {
        let mut s = self.state.lock();
        let mut b = [0u8; 1];
        s.current.read(offset, &mut b);
        b[0] ^= 1 << (bit % 8);
        s.current.write(offset, &b);
        s.durable.write(offset, &b);
    }

    /// Zeroes block `block` in both images.
    pub fn zero_block(&self, block: u64) {
        let mut s = self.state.lock();
        s.current.zero(block * BLOCK_BYTES, BLOCK_BYTES);
        s.durable.zero(block * BLOCK_BYTES, BLOCK_BYTES);
    }

    /// Writes the bytes of block `from` over block `to` in both images: the result of a
    /// write meant for `from` that the device put at `to`.
    pub fn copy_block(&self, from: u64, to: u64) {
        let mut s = self.state.lock();
        let mut buf = vec![0u8; BLOCK_BYTES as usize];
        s.current.read(from * BLOCK_BYTES, &mut buf);
        s.current.write(to * BLOCK_BYTES, &buf);
        s.durable.write(to * BLOCK_BYTES, &buf);
    }

    /// Takes the next I/O number and decides its fate: `Ok(None)` to go ahead, `Ok(Some)`
    /// for a fault that changes a write, `Err` to fail it.
    fn begin(s: &mut State, kind: IoKind) -> Result<Option<Fault>> {
        let io = s.io_count;
        s.io_count += 1;
        s.kinds.push(kind);
        if s.frozen.is_some() {
            return Err(injected("power lost", io));
        }
        if let Some((name, ios)) = &mut s.counted_thread {
            if std::thread::current().name() == Some(name.as_str()) {
                *ios += 1;
            }
        }
        if let Some((name, left)) = &mut s.crash_in_thread {
            if std::thread::current().name() == Some(name.as_str()) {
                if *left == 0 {
                    s.crash_in_thread = None;
                    SimStorage::freeze(s);
                    return Err(injected("power lost", io));
                }
                *left -= 1;
            }
        }
        if let Some(i) = s.faults.iter().position(|f| fault_io(f) == io) {
            let fault = s.faults.swap_remove(i);
            match fault {
                Fault::Crash { .. } => {
                    SimStorage::freeze(s);
                    return Err(injected("power lost", io));
                }
                Fault::FailOnce { .. } => {
                    s.faulted.push((io, kind));
                    return Err(injected("failed I/O", io));
                }
                Fault::FailFrom { .. } => s.failing = true,
                Fault::ShortWrite { .. } | Fault::Misdirect { .. } => {
                    if kind == IoKind::Write {
                        s.faulted.push((io, kind));
                        return Ok(Some(fault));
                    }
                    if matches!(fault, Fault::ShortWrite { .. }) {
                        s.faulted.push((io, kind));
                        return Err(injected("failed I/O", io));
                    }
                }
            }
        }
        if s.failing {
            s.faulted.push((io, kind));
            return Err(injected("failed I/O (persistent)", io));
        }
        Ok(None)
    }

    /// Power loss now: keeps the durable image and the pending operations of this instant.
    fn freeze(s: &mut State) {
        s.frozen = Some((s.durable.clone(), std::mem::take(&mut s.pending)));
        s.crash_thread = std::thread::current().name().map(str::to_string);
    }

    fn push_write(s: &mut State, offset: u64, data: &[u8]) {
        s.current.write(offset, data);
        s.pending.push(Pending::Write {
            offset,
            data: Arc::from(data),
        });
    }
}

fn fault_io(f: &Fault) -> u64 {
    match *f {
        Fault::FailOnce { at_io }
        | Fault::FailFrom { at_io }
        | Fault::ShortWrite { at_io }
        | Fault::Misdirect { at_io, .. }
        | Fault::Crash { at_io } => at_io,
    }
}

/// The durable image plus a random subset of `pending`, in issue order or shuffled, with
/// at most one write torn at a sector boundary.
fn crash_image(mut image: Image, pending: &[Pending], rng: &mut StdRng) -> Image {
    // Vary how much survives: nothing, everything, or each op by a coin of random bias,
    // so both the "almost nothing" and the "almost everything" corners get visited.
    let keep_probability = match rng.random_range(0..6) {
        0 => 0.0,
        1 => 1.0,
        _ => rng.random_range(0.0..1.0),
    };
    let mut kept: Vec<Pending> = pending
        .iter()
        .filter(|_| rng.random_bool(keep_probability))
        .cloned()
        .collect();
    if rng.random_bool(0.5) {
        kept.shuffle(rng);
    }
    if rng.random_bool(0.3) {
        tear_one(&mut kept, rng);
    }
    let mut len = image.len_bytes();
    for op in &kept {
        if let Pending::Grow(l) = op {
            len = len.max(*l);
        }
    }
    image.grow(len);
    for op in &kept {
        image.apply(op);
    }
    image.truncate(len);
    image
}

/// Replaces one kept write that spans a sector boundary by its first or its last sectors.
fn tear_one(kept: &mut [Pending], rng: &mut StdRng) {
    let candidates: Vec<usize> = kept
        .iter()
        .enumerate()
        .filter_map(|(i, op)| match op {
            Pending::Write { offset, data } => {
                let first_cut = (offset / SECTOR_BYTES + 1) * SECTOR_BYTES;
                (first_cut < offset + data.len() as u64).then_some(i)
            }
            _ => None,
        })
        .collect();
    if candidates.is_empty() {
        return;
    }
    let i = candidates[rng.random_range(0..candidates.len())];
    let Pending::Write { offset, data } = &kept[i] else {
        unreachable!("candidates are writes")
    };
    let (offset, end) = (*offset, *offset + data.len() as u64);
    let first_cut = (offset / SECTOR_BYTES + 1) * SECTOR_BYTES;
    let last_cut = (end - 1) / SECTOR_BYTES * SECTOR_BYTES;
    let cut =
        first_cut + rng.random_range(0..=(last_cut - first_cut) / SECTOR_BYTES) * SECTOR_BYTES;
    let split = (cut - offset) as usize;
    kept[i] = if rng.random_bool(0.5) {
        Pending::Write {
            offset,
            data: Arc::from(&data[..split]),
        }
    } else {
        Pending::Write {
            offset: cut,
            data: Arc::from(&data[split..]),
        }
    };
}

impl Storage for SimStorage {
    fn len_bytes(&self) -> Result<u64> {
        Ok(self.state.lock().current.len_bytes())
    }

    fn grow(&self, len_bytes: u64) -> Result<()> {
        let mut s = self.state.lock();
        SimStorage::begin(&mut s, IoKind::Grow)?;
        if len_bytes > s.current.len_bytes() {
            s.current.grow(len_bytes);
            s.pending.push(Pending::Grow(len_bytes));
        }
        Ok(())
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let mut s = self.state.lock();
        SimStorage::begin(&mut s, IoKind::Read)?;
        let end = offset.checked_add(buf.len() as u64);
        if end.is_none_or(|e| e > s.current.len_bytes()) {
            return Err(Error::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!(
                    "read of {} bytes at {offset:#x} past the end of the simulated volume ({} bytes)",
                    buf.len(),
                    s.current.len_bytes()
                ),
            )));
        }
        s.current.read(offset, buf);
        s.read_bytes += buf.len() as u64;
        Ok(())
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        let mut s = self.state.lock();
        let len_bytes = s.current.len_bytes();
        // The engine writes only inside space it has grown: anything else is its bug.
        assert!(
            offset
                .checked_add(data.len() as u64)
                .is_some_and(|e| e <= len_bytes),
            "write of {} bytes at {offset:#x} past the end of the volume ({len_bytes} bytes)",
            data.len()
        );
        let io = s.io_count;
        match SimStorage::begin(&mut s, IoKind::Write)? {
            None => SimStorage::push_write(&mut s, offset, data),
            Some(Fault::ShortWrite { .. }) => {
                // Whole sectors, fewer than all of the data: always short.
                let most = (data.len() as u64).saturating_sub(1) / SECTOR_BYTES;
                let keep = (s.rng.random_range(0..=most) * SECTOR_BYTES) as usize;
                SimStorage::push_write(&mut s, offset, &data[..keep]);
                s.written_bytes += keep as u64;
                return Err(injected("short write", io));
            }
            Some(Fault::Misdirect { to_block, .. }) => {
                let blocks = len_bytes / BLOCK_BYTES;
                let span = (offset % BLOCK_BYTES + data.len() as u64).div_ceil(BLOCK_BYTES);
                let target = if blocks > span {
                    to_block % (blocks - span + 1)
                } else {
                    0
                };
                SimStorage::push_write(&mut s, target * BLOCK_BYTES + offset % BLOCK_BYTES, data);
            }
            Some(other) => unreachable!("begin returns only write faults, got {other:?}"),
        }
        s.written_bytes += data.len() as u64;
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        let mut s = self.state.lock();
        SimStorage::begin(&mut s, IoKind::Sync)?;
        let pending = std::mem::take(&mut s.pending);
        for op in &pending {
            s.durable.apply(op);
        }
        Ok(())
    }

    fn punch_hole(&self, offset: u64, len: u64) -> Result<()> {
        let mut s = self.state.lock();
        SimStorage::begin(&mut s, IoKind::Punch)?;
        s.current.zero(offset, len);
        s.pending.push(Pending::Punch { offset, len });
        Ok(())
    }

    fn io_bytes(&self) -> (u64, u64) {
        let s = self.state.lock();
        (s.written_bytes, s.read_bytes)
    }
}

#[cfg(test)]
mod tests;
