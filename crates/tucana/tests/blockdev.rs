//! Raw block devices as volumes and members (DESIGN.md, "Raw block devices"), on real loop
//! devices over sparse files: a volume of one device, a device beside member files, the
//! refusals (a device with someone else's data, a swapped, duplicated or foreign device),
//! a full device, a crash without sync, unaligned direct writes and discards.
//!
//! Loop devices need root: without it (or without `losetup`) each test prints
//! "skipped: needs root and loop devices" and passes. Devices are found with
//! `losetup --find --show` (never a fixed number) and detached by a guard's `Drop`, so a
//! failing test detaches its devices too. The tests that use devices run one at a time
//! (`one_at_a_time`): see there why.
//!
//! The last test needs no device: freed ranges that read back as stale garbage after a
//! discard (as a device may return) are never taken for data.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tucana::volume::{BlockDevice, MemStorage, MemberSet, Storage};
use tucana::{Database, Error, Options};

const SLOT_BYTES: u64 = 128 << 20;

/// Held for the whole of every test that uses loop devices.
///
/// The story: CI failed once in ~20 runs with "/dev/loop0: the block device is busy" when
/// a test reopened a device it had just closed. The kernel's exclusive claim (`O_EXCL`)
/// belongs to the open file, and a test running `losetup` in parallel forks: between the
/// fork and the exec the child holds a copy of every descriptor of this process, ours
/// included (close-on-exec closes it only at the exec). Closing our descriptor then
/// left the claim alive for a moment, and the reopen was refused. Nothing in the engine
/// forks; only this test process mixes spawning with device claims, so its device tests
/// take turns.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static DEVICES: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // A failed test poisons the lock; the next one still runs.
    DEVICES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A loop device over a sparse file, detached when dropped.
struct LoopDevice {
    device: PathBuf,
    backing: PathBuf,
}

impl LoopDevice {
    /// A loop device over a new sparse file of `len_bytes` in `dir`, whose first bytes
    /// are `head`; `None` (after saying so) when this process cannot make one.
    fn new(dir: &Path, name: &str, len_bytes: u64, head: &[u8]) -> Option<LoopDevice> {
        // SAFETY: geteuid has no preconditions and touches no memory.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root and loop devices");
            return None;
        }
        let backing = dir.join(name);
        let file = std::fs::File::create(&backing).unwrap();
        file.set_len(len_bytes).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&file, head, 0).unwrap();
        file.sync_all().unwrap();
        // Another session may take the device `--find` picked: try again.
        for _ in 0..5 {
            let out = Command::new("losetup")
                .args(["--find", "--show"])
                .arg(&backing)
                .output();
            match out {
                Ok(out) if out.status.success() => {
                    let device = String::from_utf8(out.stdout).unwrap().trim().to_string();
                    return Some(LoopDevice {
                        device: PathBuf::from(device),
                        backing,
                    });
                }
                Ok(out) => eprintln!("losetup: {}", String::from_utf8_lossy(&out.stderr)),
                Err(e) => {
                    eprintln!("skipped: needs root and loop devices (losetup: {e})");
                    return None;
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        eprintln!("skipped: needs root and loop devices (no free loop device)");
        None
    }

    fn path(&self) -> &Path {
        &self.device
    }

    fn name(&self) -> String {
        self.device.display().to_string()
    }

    /// Every byte of the backing file (what the device holds, once synced).
    fn bytes(&self) -> Vec<u8> {
        std::fs::read(&self.backing).unwrap()
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.device).status();
    }
}

fn options() -> Options {
    Database::builder()
        .commit_interval(None)
        .flush_interval(None)
        .mapping_reservation_bytes(1 << 30)
}

fn key(i: u32) -> Vec<u8> {
    format!("key{i:08}").into_bytes()
}

fn value(i: u32) -> Vec<u8> {
    format!("value {i:08} {}", "x".repeat((i % 300) as usize)).into_bytes()
}

fn put_range(db: &Database, keys: std::ops::Range<u32>) {
    let ks = db.keyspace("ks").unwrap();
    for i in keys {
        ks.put(&key(i), &value(i)).unwrap();
    }
}

fn assert_range(db: &Database, keys: std::ops::Range<u32>, what: &str) {
    let ks = db.keyspace("ks").unwrap();
    for i in keys {
        assert_eq!(ks.get(&key(i)).unwrap(), Some(value(i)), "{what}: key {i}");
    }
}

#[test]
fn a_volume_of_one_device_refuses_foreign_data_then_formats_writes_and_reopens() {
    let _turn = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let foreign = b"somebody else's file system superblock";
    let Some(dev) = LoopDevice::new(dir.path(), "one", 64 << 20, foreign) else {
        return;
    };
    let before = dev.bytes();
    // Not formatted without being asked: the error names the device; nothing written.
    let Err(err) = options().open(dev.path()) else {
        panic!("opened a device holding someone else's data");
    };
    assert!(matches!(err, Error::NotAVolume(_)), "{err}");
    assert!(err.to_string().contains(&dev.name()), "{err}");
    assert!(err.to_string().contains("format"), "{err}");
    assert!(dev.bytes() == before, "the device was written");

    let db = options()
        .format_block_devices(true)
        .open(dev.path())
        .unwrap();
    put_range(&db, 0..5000);
    db.close().unwrap();
    // Reopened without the flag: it carries a volume now.
    let db = options().open(dev.path()).unwrap();
    assert_range(&db, 0..5000, "reopened");
    let report = db.check().unwrap();
    assert!(report.keys >= 5000, "{report:?}");
    // The flag never formats a device that carries a volume.
    db.close().unwrap();
    let db = options()
        .format_block_devices(true)
        .open(dev.path())
        .unwrap();
    assert_range(&db, 0..5000, "reopened with the flag");
    db.close().unwrap();
}

#[test]
fn a_device_beside_two_files_writes_reopens_checks_and_reports_its_kind() {
    let _turn = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let Some(dev) = LoopDevice::new(dir.path(), "m0", 2 * SLOT_BYTES, b"") else {
        return;
    };
    let paths = vec![
        dev.path().to_path_buf(),
        dir.path().join("m1"),
        dir.path().join("m2"),
    ];
    // A device with no volume is not formatted by a plain create.
    let err = options().open_members(&paths).map(|_| ()).unwrap_err();
    assert!(err.to_string().contains(&dev.name()), "{err}");
    assert!(!paths[1].exists() || std::fs::metadata(&paths[1]).unwrap().len() == 0);

    let db = options()
        .format_block_devices(true)
        .open_members(&paths)
        .unwrap();
    put_range(&db, 0..20_000);
    db.commit().unwrap();
    db.close().unwrap();
    let db = options().open_members(&paths).unwrap();
    for i in (0..20_000).step_by(97) {
        assert_range(&db, i..i + 1, "reopened");
    }
    let stats = db.stats();
    let kinds: Vec<&str> = stats.members.iter().map(|m| m.kind.as_str()).collect();
    assert_eq!(kinds, ["block-device", "file", "file"]);
    assert!(stats.members[0].bytes_read > 0 || stats.members[0].groups > 0);
    let report = db.check().unwrap();
    assert_eq!(report.members, 3);
    assert!(report.keys >= 20_000, "{report:?}");
    db.close().unwrap();
}

#[test]
fn a_swapped_duplicated_or_foreign_device_is_refused_by_name_and_nothing_written() {
    let _turn = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let Some(dev) = LoopDevice::new(dir.path(), "ours", SLOT_BYTES, b"") else {
        return;
    };
    let Some(other) = LoopDevice::new(dir.path(), "theirs", SLOT_BYTES, b"") else {
        return;
    };
    let files = [dir.path().join("f1"), dir.path().join("f2")];
    // The device is member 1, so each wrong set below fails first on the device.
    let ours = vec![files[0].clone(), dev.path().to_path_buf(), files[1].clone()];
    let db = options()
        .format_block_devices(true)
        .open_members(&ours)
        .unwrap();
    put_range(&db, 0..2000);
    db.close().unwrap();
    let theirs = vec![
        other.path().to_path_buf(),
        dir.path().join("g1"),
        dir.path().join("g2"),
    ];
    options()
        .format_block_devices(true)
        .open_members(&theirs)
        .unwrap()
        .close()
        .unwrap();

    let snapshot = || {
        let mut all = vec![dev.bytes(), other.bytes()];
        all.extend(files.iter().map(|f| std::fs::read(f).unwrap()));
        all
    };
    let before = snapshot();
    let refused = |paths: Vec<PathBuf>, names: &str, says: &str| {
        let err = options()
            .format_block_devices(true)
            .open_members(&paths)
            .map(|_| ())
            .unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, Error::Members(_)), "{text}");
        assert!(text.contains(names) && text.contains(says), "{text}");
    };
    // Swapped: the device given as member 0.
    refused(
        vec![dev.path().to_path_buf(), files[0].clone(), files[1].clone()],
        &dev.name(),
        "wrong position",
    );
    // Duplicated: the device twice.
    refused(
        vec![
            files[0].clone(),
            dev.path().to_path_buf(),
            dev.path().to_path_buf(),
        ],
        &dev.name(),
        "same file",
    );
    // Foreign: member 0 of another volume in place of ours.
    refused(
        vec![
            files[0].clone(),
            other.path().to_path_buf(),
            files[1].clone(),
        ],
        &other.name(),
        "another volume",
    );
    // Missing: the last member left out.
    refused(
        vec![files[0].clone(), dev.path().to_path_buf()],
        "member 2",
        "missing",
    );
    // The single-device path refuses a lone member, naming the missing ones.
    let err = options().open(dev.path()).map(|_| ()).unwrap_err();
    assert!(err.to_string().contains("missing"), "{err}");
    assert!(snapshot() == before, "a refused open wrote something");
    // And the right set still opens.
    let db = options().open_members(&ours).unwrap();
    assert_range(&db, 0..2000, "after the refusals");
    db.close().unwrap();
}

#[test]
fn a_full_device_passes_its_groups_to_another_member_or_fails_naming_itself() {
    let _turn = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let Some(a) = LoopDevice::new(dir.path(), "a", SLOT_BYTES, b"") else {
        return;
    };
    let Some(b) = LoopDevice::new(dir.path(), "b", SLOT_BYTES, b"") else {
        return;
    };
    // A device and a file: the device holds one slot, taken at creation.
    let paths = vec![a.path().to_path_buf(), dir.path().join("file")];
    let set = MemberSet::open_paths_formatting(&paths, true, true, 1 << 30).unwrap();
    set.grow(2 * SLOT_BYTES).unwrap();
    set.place_growth_on(Some(0));
    set.grow(4 * SLOT_BYTES).unwrap();
    set.place_growth_on(None);
    assert_eq!(set.member_of(0), Some(0));
    for group in 1..4 {
        assert_eq!(set.member_of(group * SLOT_BYTES), Some(1), "group {group}");
    }
    set.verify().unwrap();
    drop(set);

    // Two full devices: growth fails with an error naming them, and nothing panics.
    let paths = vec![b.path().to_path_buf(), dir.path().join("unused")];
    options()
        .format_block_devices(true)
        .open_members(&paths)
        .unwrap()
        .close()
        .unwrap();
    let b_before = b.bytes();
    drop(a);
    let Some(c) = LoopDevice::new(dir.path(), "c", SLOT_BYTES, b"") else {
        return;
    };
    let devices = vec![b.path().to_path_buf(), c.path().to_path_buf()];
    // `b` is member 0 of a committed volume: never formatted over; `c` is not its
    // member 1, and is named.
    let err = MemberSet::open_paths_formatting(&devices, true, true, 1 << 30)
        .map(|_| ())
        .unwrap_err();
    assert!(err.to_string().contains(&c.name()), "{err}");
    assert!(b.bytes() == b_before, "b was written");
    let Some(d) = LoopDevice::new(dir.path(), "d", SLOT_BYTES, b"") else {
        return;
    };
    let devices = vec![c.path().to_path_buf(), d.path().to_path_buf()];
    let set = MemberSet::open_paths_formatting(&devices, true, true, 1 << 30).unwrap();
    let err = set.grow(3 * SLOT_BYTES).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(&c.name()) && text.contains(&d.name()),
        "{text}"
    );
    assert!(text.contains("full"), "{text}");
    assert_eq!(set.len_bytes().unwrap(), 2 * SLOT_BYTES);
}

#[test]
fn a_volume_of_one_device_filled_up_fails_cleanly_and_keeps_what_was_synced() {
    let _turn = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let Some(dev) = LoopDevice::new(dir.path(), "small", 64 << 20, b"") else {
        return;
    };
    let db = options()
        .gc(false)
        .format_block_devices(true)
        .open(dev.path())
        .unwrap();
    let ks = db.keyspace("ks").unwrap();
    let big = vec![0x5a; 4000];
    let mut synced = 0u32;
    let mut failure = None;
    for i in 0..40_000u32 {
        if let Err(e) = ks.put(&key(i), &big) {
            failure = Some(e);
            break;
        }
        if i % 500 == 499 {
            match db.sync() {
                Ok(()) => synced = i + 1,
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
    }
    let failure = failure.expect("64 MiB took 160 MB of values");
    let text = failure.to_string();
    assert!(
        text.contains(&dev.name()) && text.contains("full"),
        "{text}"
    );
    assert!(
        synced > 1000,
        "only {synced} keys before the device was full"
    );
    drop(ks);
    db.abandon();
    let db = options().open(dev.path()).unwrap();
    let ks = db.keyspace("ks").unwrap();
    for i in 0..synced {
        assert_eq!(
            ks.get(&key(i)).unwrap().as_deref(),
            Some(&big[..]),
            "key {i}"
        );
    }
    drop(ks);
    db.check().unwrap();
    db.close().unwrap();
}

#[test]
fn a_volume_of_one_device_survives_a_crash_without_sync() {
    let _turn = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let Some(dev) = LoopDevice::new(dir.path(), "crash", 64 << 20, b"") else {
        return;
    };
    let db = options()
        .format_block_devices(true)
        .open(dev.path())
        .unwrap();
    put_range(&db, 0..3000);
    db.commit().unwrap();
    put_range(&db, 3000..6000);
    db.sync().unwrap();
    // Written, never synced nor committed: may be lost, must not break anything.
    put_range(&db, 6000..7000);
    db.abandon();
    let db = options().open(dev.path()).unwrap();
    assert_range(&db, 0..6000, "after the crash");
    db.check().unwrap();
    put_range(&db, 7000..8000);
    db.close().unwrap();
    let db = options().open(dev.path()).unwrap();
    assert_range(&db, 7000..8000, "written after recovery");
    db.close().unwrap();
}

/// The story: a device that held a Tucana volume, its start wiped (as DESIGN.md tells
/// users to do before reusing it) and formatted again, keeps the old volume's log
/// records wherever the new volume has not written yet. Run the same workload on both
/// and the same region id, log generation and sequence numbers land at the same offsets.
/// While a record's crc was seeded by the region id alone, a replay after a crash ran on
/// from the new volume's last record into the old volume's next one and brought back
/// keys the new volume never held (session 19's known gap of raw devices).
#[test]
fn a_reformatted_device_never_replays_the_old_volumes_records() {
    let _turn = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let Some(dev) = LoopDevice::new(dir.path(), "reformat", 64 << 20, b"") else {
        return;
    };
    for (volume, keys) in [("old", 0..3000), ("new", 0..10)] {
        let db = options()
            .format_block_devices(true)
            .open(dev.path())
            .unwrap_or_else(|e| panic!("format the {volume} volume: {e}"));
        put_range(&db, keys);
        db.sync().unwrap();
        db.abandon();
        if volume == "old" {
            let mut device = std::fs::OpenOptions::new()
                .write(true)
                .open(dev.path())
                .unwrap();
            std::io::Write::write_all(&mut device, &vec![0u8; 1 << 20]).unwrap();
            device.sync_all().unwrap();
        }
    }
    let db = options().open(dev.path()).unwrap();
    assert_range(&db, 0..10, "the new volume's synced keys");
    let ks = db.keyspace("ks").unwrap();
    let revived: Vec<u32> = (10..3000)
        .filter(|&i| ks.get(&key(i)).unwrap().is_some())
        .collect();
    assert!(
        revived.is_empty(),
        "{} keys of the old volume came back, the first {:?}",
        revived.len(),
        &revived[..revived.len().min(5)]
    );
    db.check().unwrap();
    db.close().unwrap();
}

#[test]
fn unaligned_writes_reach_the_device_and_discards_are_counted() {
    let _turn = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let Some(dev) = LoopDevice::new(dir.path(), "raw", 16 << 20, b"") else {
        return;
    };
    let device = BlockDevice::open(dev.path(), 1 << 30).unwrap();
    assert_eq!(device.len_bytes().unwrap(), 16 << 20);
    let mut model = vec![0u8; 64 << 10];
    // Aligned, unaligned inside a block, across blocks, and longer than a bounce buffer.
    let writes: [(u64, usize); 5] = [(0, 8192), (100, 50), (4000, 300), (8191, 9000), (12345, 33)];
    for (n, &(at, len)) in writes.iter().enumerate() {
        let bytes: Vec<u8> = (0..len).map(|i| (i * 7 + n * 13) as u8 | 1).collect();
        device.write_at(at, &bytes).unwrap();
        model[at as usize..at as usize + len].copy_from_slice(&bytes);
    }
    let long: Vec<u8> = (0..(3 << 20) + 17).map(|i| (i % 251) as u8).collect();
    device.write_at((1 << 20) + 5, &long).unwrap();
    device.sync().unwrap();
    let mut back = vec![0u8; model.len()];
    device.read_at(0, &mut back).unwrap();
    assert!(back == model, "read back differs");
    // SAFETY: nothing writes this range while the view lives.
    let view = unsafe { device.mapped(0, model.len()) }.unwrap();
    assert!(view == &model[..], "the mapping differs");
    let on_disk = dev.bytes();
    assert!(on_disk[..model.len()] == model[..], "the device differs");
    let start = (1 << 20) + 5;
    assert!(on_disk[start..start + long.len()] == long[..]);
    // Past the end: a clear error, not a short write.
    let err = device.grow(32 << 20).unwrap_err();
    assert!(err.to_string().contains(&dev.name()), "{err}");
    device.punch_hole(8 << 20, 1 << 20).unwrap();
    assert_eq!(device.discarded_bytes(), 1 << 20);
}

/// Memory storage whose hole punches leave the range as a device may after a discard:
/// its old bytes (odd punches) or garbage (even punches), never zeros.
struct StaleDiscards {
    inner: MemStorage,
    punches: AtomicU64,
}

impl Storage for StaleDiscards {
    fn len_bytes(&self) -> tucana::Result<u64> {
        self.inner.len_bytes()
    }
    fn grow(&self, len_bytes: u64) -> tucana::Result<()> {
        self.inner.grow(len_bytes)
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> tucana::Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> tucana::Result<()> {
        self.inner.write_at(offset, data)
    }
    fn sync(&self) -> tucana::Result<()> {
        self.inner.sync()
    }
    fn punch_hole(&self, offset: u64, len: u64) -> tucana::Result<()> {
        let n = self.punches.fetch_add(1, Ordering::Relaxed);
        if n.is_multiple_of(2) {
            let mut x = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            let garbage: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            self.inner.write_at(offset, &garbage)?;
        }
        Ok(())
    }
}

/// After a discard a device may return old bytes or garbage rather than zeros: reused
/// segments, replay of the log tail after a crash, and `check` must never take such bytes
/// for data. Freed segments are punched at once here (no background threads), so GC and
/// dropped keyspaces leave garbage in the ranges the next segments reuse.
#[test]
fn freed_ranges_reading_back_as_stale_garbage_are_never_taken_for_data() {
    let storage = Arc::new(StaleDiscards {
        inner: MemStorage::new(),
        punches: AtomicU64::new(0),
    });
    let opts = || options().log_segment_bytes(256 << 10);
    let mut model: std::collections::BTreeMap<Vec<u8>, Vec<u8>> = Default::default();
    for round in 0..6u32 {
        let db = opts().open_storage(storage.clone()).unwrap();
        db.check().unwrap();
        let ks = db.keyspace("ks").unwrap();
        for (k, v) in &model {
            assert_eq!(ks.get(k).unwrap().as_ref(), Some(v), "round {round}");
        }
        let doomed = db.keyspace("doomed").unwrap();
        for i in 0..3000u32 {
            let k = key((i * 31 + round * 7) % 2500);
            let v = format!("{round}:{i}:{}", "v".repeat((i % 200) as usize)).into_bytes();
            ks.put(&k, &v).unwrap();
            model.insert(k, v);
            doomed.put(&key(i), &value(i)).unwrap();
            if i % 1000 == 999 {
                db.commit().unwrap();
            }
        }
        drop(doomed);
        db.drop_keyspace("doomed").unwrap();
        db.gc().unwrap();
        db.commit().unwrap();
        db.commit().unwrap();
        // Appended after the last commit and synced: replay reads them back through
        // segments that may sit on garbage.
        for i in 0..500u32 {
            let k = key(5000 + i + round * 500);
            ks.put(&k, &value(i)).unwrap();
            model.insert(k, value(i));
        }
        db.sync().unwrap();
        drop(ks);
        db.abandon();
    }
    assert!(
        storage.punches.load(Ordering::Relaxed) > 10,
        "too few punches"
    );
    let db = opts().open_storage(storage.clone()).unwrap();
    db.check().unwrap();
    let ks = db.keyspace("ks").unwrap();
    let mut found = 0;
    for entry in ks.range::<&[u8], _>(..) {
        let (k, v) = entry.unwrap();
        assert_eq!(model.get(&k), Some(&v));
        found += 1;
    }
    assert_eq!(found, model.len());
}
