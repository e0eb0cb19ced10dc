//! The measured phases of a cold-scan run and their checks: a full scan (every key, in
//! order, with the load's checksum), short scans (seek + nexts, as many items as the key's
//! rank allows), batches of gets or multi-gets (Tucana only); and the measurement around
//! each (open, time, record, close).
//!
//! Owns the checks and the records' figures; what the run does with the records is
//! `super::run_engine`'s. Single-threaded.

use std::ops::{Bound, ControlFlow};
use std::path::Path;

use rand::Rng;

use super::store::{Store, Variant};
use super::{Plan, GET_BATCH, MULTI_GET_BATCH, SEEK_NEXT};
use crate::engine::Direction;
use crate::measure::{Latencies, Measurement, PhaseTimer};
use crate::results::Record;
use crate::workload::{thread_rng, Generation, KeySet};
use crate::Result;

/// What one phase returns: operations, items read, user bytes read, latencies, checksum.
pub(super) struct PhaseOutput {
    pub(super) ops: u64,
    pub(super) items: u64,
    pub(super) user_bytes: u64,
    pub(super) latencies: Latencies,
    pub(super) checksum: u64,
}

/// Sorted key prefixes and the checksum of the whole data set.
pub(super) fn expected(keyset: &KeySet, keys: u64) -> (Vec<u64>, u64) {
    let (mut key, mut value) = (keyset.key_buf(), keyset.value_buf());
    let mut prefixes = Vec::with_capacity(usize::try_from(keys).unwrap_or(0));
    let mut checksum = 0u64;
    for i in 0..keys {
        keyset.key_into(i, &mut key);
        keyset.value_into(&key, Generation(0), &mut value);
        prefixes.push(prefix(&key));
        checksum = checksum.wrapping_add(item_checksum(&key, &value));
    }
    prefixes.sort_unstable();
    (prefixes, checksum)
}

/// The key's first (at most 8) bytes as a big-endian number: unique per key, and ordered as
/// the keys are.
fn prefix(key: &[u8]) -> u64 {
    let mut bytes = [0u8; 8];
    let n = key.len().min(8);
    bytes[8 - n..].copy_from_slice(&key[..n]);
    u64::from_be_bytes(bytes)
}

/// A hash of one pair that touches every byte of the value (so no engine can skip reading
/// it), summed with wrapping adds into a checksum that does not depend on scan order.
fn item_checksum(key: &[u8], value: &[u8]) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01B3;
    let mut hash = 0xCBF2_9CE4_8422_2325u64 ^ key.len() as u64;
    for part in [key, value] {
        let mut chunks = part.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            hash = (hash ^ u64::from_le_bytes(word)).wrapping_mul(PRIME);
        }
        for &byte in chunks.remainder() {
            hash = (hash ^ u64::from(byte)).wrapping_mul(PRIME);
        }
        hash = hash.rotate_left(29);
    }
    hash
}

/// Opens the store as `variant`, runs `phase`, measures it and closes; the record and
/// what the phase returned.
pub(super) fn measure_open(
    plan: &Plan,
    variant: Variant,
    dir: &Path,
    workload: &'static str,
    phase: &dyn Fn(&Store) -> Result<PhaseOutput>,
) -> Result<(Record, PhaseOutput)> {
    let store = Store::open(variant, dir, &plan.engine_config)?;
    let before = store.prefetch_counters();
    let timer = PhaseTimer::start();
    let output = phase(&store)?;
    let measurement = timer.finish(output.ops, std::slice::from_ref(&output.latencies));
    let after = store.prefetch_counters();
    store.close()?;

    let mut record = Record::measured(variant.engine_name(), workload, &measurement);
    record.set_io_amp(&measurement, output.user_bytes, 0);
    if output.latencies.count() == 0 {
        // Full scans time the whole scan, not each item.
        record.p50_us = None;
        record.p99_us = None;
        record.p999_us = None;
    }
    record.set("dataset", "cold");
    record.set("items", output.items);
    let seconds = measurement.elapsed.as_secs_f64().max(1e-9);
    record.set("items_per_sec", output.items as f64 / seconds);
    record.set("mb_per_sec", output.user_bytes as f64 / 1e6 / seconds);
    record.set("checksum", format!("{:#018x}", output.checksum));
    if let (Some(entries), Some(setting)) = (variant.prefetch_entries(), variant.prefetch_setting())
    {
        record.set("prefetch_entries", entries as u64);
        record.set("prefetch", setting);
    }
    if let (Some(before), Some(after)) = (before, after) {
        record.set("prefetch_calls", after.0 - before.0);
        record.set("prefetch_bytes", after.1 - before.1);
    }
    if workload == SEEK_NEXT {
        record.set("short_scan_len", plan.args.short_scan_len);
    }
    if workload == GET_BATCH || workload == MULTI_GET_BATCH {
        record.set("batch_keys", plan.args.batch_keys);
    }
    print_row(&variant, workload, &measurement, &output);
    Ok((record, output))
}

pub(super) fn full_scan(store: &Store, direction: Direction, plan: &Plan) -> Result<PhaseOutput> {
    let (mut items, mut bytes, mut checksum) = (0u64, 0u64, 0u64);
    let mut previous: Vec<u8> = Vec::new();
    let mut error: Option<String> = None;
    store.scan(Bound::Unbounded, direction, &mut |key, value| {
        let in_order = match direction {
            Direction::Forward => previous.as_slice() < key,
            Direction::Reverse => key < previous.as_slice(),
        };
        if items > 0 && !in_order {
            error = Some(format!(
                "a {direction:?} scan went out of order at item {items}"
            ));
            return ControlFlow::Break(());
        }
        previous.clear();
        previous.extend_from_slice(key);
        items += 1;
        bytes += (key.len() + value.len()) as u64;
        checksum = checksum.wrapping_add(item_checksum(key, value));
        ControlFlow::Continue(())
    })?;
    if let Some(error) = error {
        return Err(error.into());
    }
    if items != plan.args.keys || checksum != plan.load_checksum {
        return Err(format!(
            "a {direction:?} scan saw {items} of {} keys, checksum {checksum:#x} (the load's: {:#x})",
            plan.args.keys, plan.load_checksum
        )
        .into());
    }
    Ok(PhaseOutput {
        ops: items,
        items,
        user_bytes: bytes,
        latencies: Latencies::new(),
        checksum,
    })
}

/// Seeks to random keys, each followed by up to `short_scan_len` items.
pub(super) fn short_scans(store: &Store, plan: &Plan) -> Result<PhaseOutput> {
    let config = &plan.args;
    let mut rng = thread_rng(config.seed, "coldscan-short", 0);
    let mut key = plan.keyset.key_buf();
    let mut latencies = Latencies::new();
    let (mut items, mut bytes, mut checksum) = (0u64, 0u64, 0u64);
    for _ in 0..config.short_scans {
        plan.keyset
            .key_into(rng.random_range(0..config.keys), &mut key);
        let rank = plan.sorted_prefixes.partition_point(|&p| p < prefix(&key)) as u64;
        let expected = config.short_scan_len.min(config.keys - rank);
        let mut seen = 0u64;
        let mut first_ok = true;
        latencies.time(|| {
            store.scan(Bound::Included(&key), Direction::Forward, &mut |k, v| {
                if seen == 0 {
                    first_ok = k == key.as_slice();
                }
                seen += 1;
                bytes += (k.len() + v.len()) as u64;
                checksum = checksum.wrapping_add(item_checksum(k, v));
                if seen >= config.short_scan_len {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            })
        })?;
        if seen != expected || !first_ok {
            return Err(format!(
                "a short scan from key rank {rank} returned {seen} items, not {expected}{}",
                if first_ok {
                    ""
                } else {
                    ", not starting at its key"
                }
            )
            .into());
        }
        items += seen;
    }
    Ok(PhaseOutput {
        ops: config.short_scans,
        items,
        user_bytes: bytes,
        latencies,
        checksum,
    })
}

/// Batches of `batch_keys` random keys (all present), by one `multi_get` each or by
/// `get`s one at a time (Tucana only).
pub(super) fn batches(store: &Store, plan: &Plan, multi: bool) -> Result<PhaseOutput> {
    let Store::Tucana { keyspace: ks, .. } = store else {
        return Err("batches of gets are measured on Tucana only".into());
    };
    let config = &plan.args;
    let mut rng = thread_rng(config.seed, "coldscan-batches", 0);
    let mut latencies = Latencies::new();
    let (mut bytes, mut checksum, mut items) = (0u64, 0u64, 0u64);
    let mut keys: Vec<Vec<u8>> = (0..config.batch_keys)
        .map(|_| plan.keyset.key_buf())
        .collect();
    for _ in 0..config.batches {
        for key in keys.iter_mut() {
            plan.keyset.key_into(rng.random_range(0..config.keys), key);
        }
        let found = latencies.time(|| -> Result<u64> {
            let mut found = 0;
            if multi {
                for (key, value) in keys.iter().zip(ks.multi_get(&keys)?) {
                    if let Some(value) = value {
                        bytes += value.len() as u64;
                        checksum = checksum.wrapping_add(item_checksum(key, &value));
                        found += 1;
                    }
                }
            } else {
                for key in &keys {
                    if let Some(value) = ks.get(key)? {
                        bytes += value.len() as u64;
                        checksum = checksum.wrapping_add(item_checksum(key, &value));
                        found += 1;
                    }
                }
            }
            Ok(found)
        })?;
        if found != config.batch_keys {
            return Err(format!("a batch found {found} of {} keys", config.batch_keys).into());
        }
        items += found;
    }
    Ok(PhaseOutput {
        ops: config.batches,
        items,
        user_bytes: bytes,
        latencies,
        checksum,
    })
}

fn print_row(variant: &Variant, workload: &str, m: &Measurement, output: &PhaseOutput) {
    let seconds = m.elapsed.as_secs_f64().max(1e-9);
    let read_mib =
        m.io.process
            .map(|io| format!("{:.1}", io.read_bytes as f64 / (1 << 20) as f64))
            .unwrap_or_else(|| "?".into());
    let latency = if m.p50_us() > 0.0 {
        format!("  p50 {:.0} us  p99 {:.0} us", m.p50_us(), m.p99_us())
    } else {
        String::new()
    };
    println!(
        "{:<22} {:<21} {:>9} ops in {:>7.2} s = {:>9.0} ops/s {:>9.0} items/s {:>7.1} MB/s  read {:>8} MiB  cpu {:>6.2} s{}",
        variant.label(),
        workload,
        output.ops,
        seconds,
        m.ops_per_sec(),
        output.items as f64 / seconds,
        output.user_bytes as f64 / 1e6 / seconds,
        read_mib,
        m.cpu.as_secs_f64(),
        latency,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_reads_every_byte_and_ignores_order() {
        let a = item_checksum(b"key-a", &[1u8; 1000]);
        let mut changed = [1u8; 1000];
        changed[999] = 2;
        assert_ne!(a, item_checksum(b"key-a", &changed));
        assert_ne!(a, item_checksum(b"key-b", &[1u8; 1000]));
        let b = item_checksum(b"key-b", &[3u8; 7]);
        assert_eq!(a.wrapping_add(b), b.wrapping_add(a));
    }

    #[test]
    fn prefixes_order_like_keys() {
        assert!(prefix(b"\x00\x01zzzzzzzzz") < prefix(b"\x00\x02aaaaaaa"));
        assert_eq!(prefix(b"\x01"), 1);
    }
}
