use rand::SeedableRng;

use super::*;

fn read(s: &SimStorage, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    s.read_at(offset, &mut buf).unwrap();
    buf
}

fn image_bytes(image: Image, offset: u64, len: usize) -> Vec<u8> {
    read(&SimStorage::from_image(image, 0), offset, len)
}

#[test]
fn reads_see_unsynced_writes_but_only_synced_ones_are_durable() {
    let s = SimStorage::new(1);
    s.grow(4 * BLOCK_BYTES).unwrap();
    s.write_at(100, b"synced").unwrap();
    s.sync().unwrap();
    s.write_at(5000, b"volatile").unwrap();
    assert_eq!(read(&s, 100, 6), b"synced");
    assert_eq!(read(&s, 5000, 8), b"volatile");
    let durable = s.durable_image();
    assert_eq!(durable.len_bytes(), 4 * BLOCK_BYTES);
    assert_eq!(image_bytes(durable.clone(), 100, 6), b"synced");
    assert_eq!(image_bytes(durable, 5000, 8), [0u8; 8]);
    assert_eq!(s.pending_ops(), 1);
}

#[test]
fn writes_spanning_blocks_round_trip_and_reading_past_the_end_fails() {
    let s = SimStorage::new(1);
    s.grow(3 * BLOCK_BYTES).unwrap();
    let data: Vec<u8> = (0..6000u32).map(|i| i as u8).collect();
    s.write_at(4000, &data).unwrap();
    assert_eq!(read(&s, 4000, 6000), data);
    let mut buf = [0u8; 2];
    assert!(s.read_at(3 * BLOCK_BYTES - 1, &mut buf).is_err());
    assert_eq!(s.io_bytes(), (6000, 6000));
}

#[test]
fn crash_keeps_the_durable_bytes_and_only_pending_writes_vary() {
    let s = SimStorage::new(1);
    s.grow(16 * BLOCK_BYTES).unwrap();
    s.write_at(0, &[7u8; 4096]).unwrap();
    s.sync().unwrap();
    for i in 1..16u64 {
        s.write_at(i * BLOCK_BYTES, &[i as u8; 4096]).unwrap();
    }
    let mut rng = StdRng::seed_from_u64(9);
    let mut kept_counts = std::collections::BTreeSet::new();
    for _ in 0..200 {
        let c = s.crash(&mut rng);
        assert_eq!(read(&c, 0, 4096), [7u8; 4096], "durable bytes survive");
        let mut kept = 0;
        for i in 1..16u64 {
            let b = read(&c, i * BLOCK_BYTES, 4096);
            // Each block is old (zero), new, or torn at a sector boundary.
            for sector in b.chunks(SECTOR_BYTES as usize) {
                assert!(sector.iter().all(|&x| x == 0) || sector.iter().all(|&x| x == i as u8));
            }
            kept += usize::from(b.iter().all(|&x| x == i as u8));
        }
        kept_counts.insert(kept);
        assert_eq!(c.pending_ops(), 0, "a crashed volume starts clean");
    }
    // Subsets of every size show up, from nothing to everything.
    assert!(kept_counts.contains(&0) && kept_counts.contains(&15));
    assert!(kept_counts.len() > 8, "{kept_counts:?}");
}

#[test]
fn crash_may_apply_overlapping_writes_out_of_order_and_tear_one() {
    let s = SimStorage::new(1);
    s.grow(BLOCK_BYTES).unwrap();
    s.sync().unwrap();
    s.write_at(0, &[1u8; 4096]).unwrap();
    s.write_at(0, &[2u8; 4096]).unwrap();
    let mut rng = StdRng::seed_from_u64(3);
    let (mut old_wins, mut torn) = (false, false);
    for _ in 0..500 {
        let b = image_bytes(s.crash_image(&mut rng), 0, 4096);
        let ones = b.iter().filter(|&&x| x == 1).count();
        let twos = b.iter().filter(|&&x| x == 2).count();
        let zeros = b.iter().filter(|&&x| x == 0).count();
        assert_eq!(ones + twos + zeros, 4096);
        assert_eq!(
            ones % 512 + twos % 512 + zeros % 512,
            0,
            "tears fall on sectors"
        );
        old_wins |= ones == 4096;
        torn |= ones != 4096 && twos != 4096 && zeros != 4096;
    }
    assert!(old_wins && torn);
}

#[test]
fn an_unkept_grow_drops_the_bytes_written_past_the_old_length() {
    let s = SimStorage::new(1);
    s.grow(BLOCK_BYTES).unwrap();
    s.sync().unwrap();
    s.grow(2 * BLOCK_BYTES).unwrap();
    s.write_at(BLOCK_BYTES, &[5u8; 4096]).unwrap();
    let mut rng = StdRng::seed_from_u64(5);
    let mut lengths = std::collections::BTreeSet::new();
    for _ in 0..100 {
        let c = s.crash(&mut rng);
        let len = c.len_bytes().unwrap();
        lengths.insert(len);
        if len == BLOCK_BYTES {
            let mut buf = [0u8; 1];
            assert!(c.read_at(BLOCK_BYTES, &mut buf).is_err());
        }
    }
    assert_eq!(lengths.len(), 2);
}

#[test]
fn fail_once_fails_exactly_that_io_and_syncs_count() {
    let s = SimStorage::new(1);
    s.grow(BLOCK_BYTES).unwrap(); // I/O 0
    s.arm(Fault::FailOnce { at_io: 2 });
    s.write_at(0, b"a").unwrap(); // 1
    assert!(s.sync().is_err()); // 2
    assert_eq!(
        s.durable_image().len_bytes(),
        0,
        "a failed sync makes nothing durable"
    );
    s.sync().unwrap(); // 3
    assert_eq!(s.faulted(), vec![(2, IoKind::Sync)]);
    assert_eq!(
        s.io_kinds()[..4],
        [IoKind::Grow, IoKind::Write, IoKind::Sync, IoKind::Sync]
    );
}

#[test]
fn fail_from_fails_every_later_io() {
    let s = SimStorage::new(1);
    s.grow(BLOCK_BYTES).unwrap();
    s.arm(Fault::FailFrom { at_io: 1 });
    assert!(s.write_at(0, b"a").is_err());
    assert!(s.read_at(0, &mut [0u8; 1]).is_err());
    assert!(s.sync().is_err());
    assert_eq!(read_ok(&s), None);
}

fn read_ok(s: &SimStorage) -> Option<Vec<u8>> {
    let mut buf = [0u8; 1];
    s.read_at(0, &mut buf).ok().map(|_| buf.to_vec())
}

#[test]
fn short_write_writes_whole_sectors_of_a_prefix_then_fails() {
    for seed in 0..20 {
        let s = SimStorage::new(seed);
        s.grow(2 * BLOCK_BYTES).unwrap();
        s.arm(Fault::ShortWrite { at_io: 1 });
        assert!(s.write_at(0, &[9u8; 8192]).is_err());
        let b = read(&s, 0, 8192);
        let written = b.iter().take_while(|&&x| x == 9).count();
        assert_eq!(written % 512, 0);
        assert!(written < 8192);
        assert!(b[written..].iter().all(|&x| x == 0));
    }
}

#[test]
fn misdirected_write_lands_elsewhere_and_reports_success() {
    let s = SimStorage::new(1);
    s.grow(8 * BLOCK_BYTES).unwrap();
    s.arm(Fault::Misdirect {
        at_io: 1,
        to_block: 5,
    });
    s.write_at(BLOCK_BYTES + 10, b"meant for block 1").unwrap();
    assert_eq!(read(&s, BLOCK_BYTES + 10, 4), [0u8; 4]);
    assert_eq!(read(&s, 5 * BLOCK_BYTES + 10, 17), b"meant for block 1");
}

#[test]
fn a_scheduled_crash_freezes_the_state_of_that_instant() {
    let s = SimStorage::new(1);
    s.grow(2 * BLOCK_BYTES).unwrap(); // 0
    s.write_at(0, b"durable").unwrap(); // 1
    s.sync().unwrap(); // 2
    s.write_at(100, b"maybe").unwrap(); // 3
    s.arm(Fault::Crash { at_io: 4 });
    assert!(s.write_at(200, b"never").is_err()); // 4: power is gone
    assert!(s.sync().is_err());
    assert!(s.crashed());
    let mut rng = StdRng::seed_from_u64(1);
    let mut saw_maybe = false;
    for _ in 0..50 {
        let c = s.crash(&mut rng);
        assert_eq!(read(&c, 0, 7), b"durable");
        assert_eq!(read(&c, 200, 5), [0u8; 5]);
        saw_maybe |= read(&c, 100, 5) == b"maybe";
    }
    assert!(saw_maybe);
}

#[test]
fn a_crash_armed_in_a_thread_fires_at_that_threads_nth_io_only() {
    let s = Arc::new(SimStorage::new(1));
    s.grow(4 * BLOCK_BYTES).unwrap();
    s.write_at(0, b"durable").unwrap();
    s.sync().unwrap();
    s.arm_crash_in_thread("worker", 2);
    // I/O of other threads does not count.
    for _ in 0..5 {
        s.write_at(100, b"main").unwrap();
    }
    let worker = {
        let s = s.clone();
        std::thread::Builder::new()
            .name("worker".into())
            .spawn(move || {
                let ok: Vec<bool> = (0..4u64)
                    .map(|i| s.write_at(BLOCK_BYTES + i * 10, b"w").is_ok())
                    .collect();
                ok
            })
            .unwrap()
    };
    assert_eq!(worker.join().unwrap(), [true, true, false, false]);
    assert!(s.crashed());
    assert_eq!(s.crash_thread().as_deref(), Some("worker"));
    assert!(
        s.write_at(100, b"after").is_err(),
        "power is gone for everyone"
    );
    let mut rng = StdRng::seed_from_u64(3);
    for _ in 0..20 {
        let c = s.crash(&mut rng);
        assert_eq!(read(&c, 0, 7), b"durable");
        // The worker's third write never happened.
        assert_eq!(read(&c, BLOCK_BYTES + 20, 1), [0]);
    }
}

#[test]
fn a_punch_is_pending_until_a_sync_and_may_be_lost_in_a_crash() {
    let s = SimStorage::new(1);
    s.grow(4 * BLOCK_BYTES).unwrap();
    s.write_at(BLOCK_BYTES, &[5u8; 4096]).unwrap();
    s.sync().unwrap();
    s.punch_hole(BLOCK_BYTES, BLOCK_BYTES).unwrap();
    assert_eq!(read(&s, BLOCK_BYTES, 4096), [0u8; 4096]);
    assert_eq!(s.io_count_of(IoKind::Punch), 1);
    let mut rng = StdRng::seed_from_u64(4);
    let (mut kept, mut lost) = (false, false);
    for _ in 0..50 {
        let b = read(&s.crash(&mut rng), BLOCK_BYTES, 4096);
        kept |= b == [0u8; 4096];
        lost |= b == [5u8; 4096];
        assert!(b == [0u8; 4096] || b == [5u8; 4096]);
    }
    assert!(kept && lost);
    s.sync().unwrap();
    assert_eq!(
        image_bytes(s.durable_image(), BLOCK_BYTES, 4096),
        [0u8; 4096]
    );
}

#[test]
fn corruption_helpers_change_both_images() {
    let s = SimStorage::new(1);
    s.grow(4 * BLOCK_BYTES).unwrap();
    s.write_at(BLOCK_BYTES, &[0xAA; 4096]).unwrap();
    s.sync().unwrap();
    s.flip_bit(BLOCK_BYTES, 0);
    assert_eq!(read(&s, BLOCK_BYTES, 1), [0xAB]);
    assert_eq!(image_bytes(s.durable_image(), BLOCK_BYTES, 1), [0xAB]);
    s.copy_block(1, 3);
    assert_eq!(
        image_bytes(s.durable_image(), 3 * BLOCK_BYTES + 1, 1),
        [0xAA]
    );
    s.zero_block(1);
    assert_eq!(
        image_bytes(s.durable_image(), BLOCK_BYTES, 4096),
        [0u8; 4096]
    );
}

#[test]
fn the_same_seed_gives_the_same_crash_image() {
    let s = SimStorage::new(1);
    s.grow(8 * BLOCK_BYTES).unwrap();
    for i in 0..8u64 {
        s.write_at(i * BLOCK_BYTES + 3, &[i as u8 + 1; 3000])
            .unwrap();
    }
    let a = image_bytes(s.crash_image(&mut StdRng::seed_from_u64(77)), 0, 8 * 4096);
    let b = image_bytes(s.crash_image(&mut StdRng::seed_from_u64(77)), 0, 8 * 4096);
    assert_eq!(a, b);
}

#[test]
fn the_engine_runs_on_it() {
    let sim = Arc::new(SimStorage::new(1));
    let storage: Arc<dyn Storage> = sim.clone();
    let db = crate::workload::open(crate::workload::options(false), &storage).unwrap();
    let ks = db.keyspace("t").unwrap();
    ks.put_with(b"k", b"v", tucana::Durability::Sync).unwrap();
    ks.put(b"lost?", b"maybe").unwrap();
    db.abandon();
    let c: Arc<dyn Storage> = Arc::new(sim.crash(&mut StdRng::seed_from_u64(1)));
    let db = crate::workload::open(crate::workload::options(false), &c).unwrap();
    assert_eq!(
        db.open_keyspace("t").unwrap().get(b"k").unwrap().as_deref(),
        Some(&b"v"[..])
    );
    db.check().unwrap();
}
