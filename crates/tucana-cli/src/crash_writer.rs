//! `tucana --db P crash-writer --seed S` (hidden): the victim of the kill -9 test (M3 in
//! RELIABILITY.md, driven by `tucana-crashtest kill9`).
//!
//! Owns: a seeded, endless stream of writes against one volume and the line protocol that
//! tells the driver, after each call returned, what was acknowledged and how durably. Does
//! not own: any checking (the driver reopens the volume and compares) nor stopping (it
//! writes until it is killed, or until stdout is closed).
//!
//! Protocol, one line per event on stdout, each written with a single flushed write so a
//! kill leaves at most a torn *last* line (which the driver ignores):
//!
//! ```text
//! open <options>                     the volume is open
//! ks <name>                          keyspace <name> exists (its creation is durable)
//! begin <id> <op>                    about to call the engine (the op may be in flight)
//! ack <id> <durability> <op>         the call returned Ok; durability is buffered or sync
//! ```
//!
//! where `<op>` is one of
//!
//! ```text
//! put <ks> <key> <tag> <len>                     value = value_bytes(tag, len)
//! del <ks> <key>
//! batch <ks> <n> (P <key> <tag> <len> | D <key>) × n
//! sync                                           Database::sync
//! commit                                         Database::commit
//! ```
//!
//! `sync` and `commit` are always acknowledged with durability `sync`: every write
//! acknowledged before them is durable. Keys and tags are printable ASCII without spaces.
//! A value is its tag followed by `/`, repeated and cut to `len` bytes (`value_bytes`;
//! the driver has the same function). An engine error prints `error <id> <message>` and
//! exits with status 2.
//!
//! Single-threaded (the engine runs its own background flusher and committer).

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use tucana::{Database, Durability, Keyspace};

use crate::{CliError, Outcome};

/// Keyspaces the writer spreads its writes over.
const KEYSPACES: [&str; 3] = ["ks0", "ks1", "ks2"];

/// The bytes of a value named by `tag` and `len` in the protocol.
pub fn value_bytes(tag: &str, len: usize) -> Vec<u8> {
    let unit: Vec<u8> = tag.bytes().chain(std::iter::once(b'/')).collect();
    unit.iter().copied().cycle().take(len).collect()
}

/// SplitMix64: tiny, seedable, and the same on every platform, so a seed replays.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0; the modulo bias is irrelevant here).
    fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

/// Stdout lines; a failed write means the driver is gone, and the writer stops.
struct Acks(std::io::Stdout);

impl Acks {
    fn line(&mut self, line: String) -> Result<(), CliError> {
        let mut bytes = line.into_bytes();
        bytes.push(b'\n');
        let mut out = self.0.lock();
        // One write for the whole line, then flush: the line reaches the pipe before the
        // next engine call starts, which is what makes an `ack` a promise.
        out.write_all(&bytes)
            .and_then(|()| out.flush())
            .map_err(|_| CliError::StdoutClosed)
    }
}

fn random_key(rng: &mut Rng) -> String {
    let n = rng.below(400);
    // Long keys sharing their first 8 bytes make leaf prefixes tie, which takes the
    // hash-and-compare path of the index.
    if rng.below(4) == 0 {
        format!("shared-prefix-{n:05}")
    } else {
        format!("k{n}")
    }
}

fn random_value_len(rng: &mut Rng) -> usize {
    match rng.below(200) {
        // Larger than the smallest log segment: gets a segment of its own.
        0 => 70_000 + rng.below(60_000) as usize,
        1..=20 => 200 + rng.below(4_000) as usize,
        _ => rng.below(200) as usize,
    }
}

fn durability(rng: &mut Rng, sync_in: u64) -> (Durability, &'static str) {
    if rng.below(sync_in) == 0 {
        (Durability::Sync, "sync")
    } else {
        (Durability::Buffered, "buffered")
    }
}

/// Runs until killed: see the module doc.
pub fn run(path: &Path, seed: u64) -> Result<Outcome, CliError> {
    let mut rng = Rng(seed);
    let mut acks = Acks(std::io::stdout());
    let segment_bytes = rng.pick(&[64u64 << 10, 128 << 10, 2 << 20]);
    let flush_ms = rng.pick(&[0u64, 1, 5, 50]);
    let commit_ms = rng.pick(&[0u64, 3, 20, 200]);
    let commit_dirty_bytes = rng.pick(&[64u64 << 10, 1 << 20, 256 << 20]);
    let ms = |m: u64| (m > 0).then(|| Duration::from_millis(m));
    let db = Database::builder()
        .log_segment_bytes(segment_bytes)
        .flush_interval(ms(flush_ms))
        .commit_interval(ms(commit_ms))
        .commit_dirty_bytes(commit_dirty_bytes)
        .open(path)
        .map_err(|e| CliError::from(e).context(format_args!("cannot open {}", path.display())))?;
    acks.line(format!(
        "open segment_bytes={segment_bytes} flush_ms={flush_ms} commit_ms={commit_ms} \
         commit_dirty_bytes={commit_dirty_bytes}"
    ))?;
    let mut keyspaces: Vec<Keyspace> = Vec::new();
    for name in KEYSPACES {
        keyspaces.push(db.keyspace(name)?);
        acks.line(format!("ks {name}"))?;
    }
    let mut id = 0u64;
    loop {
        let ks_index = rng.below(keyspaces.len() as u64) as usize;
        let ks = &keyspaces[ks_index];
        let ks_name = KEYSPACES[ks_index];
        let tag = format!("{seed:x}.{id}");
        let roll = rng.below(100);
        let (op_text, result, durability_text) = if roll < 70 {
            let key = random_key(&mut rng);
            let len = random_value_len(&mut rng);
            let (d, d_text) = durability(&mut rng, 8);
            let op = format!("put {ks_name} {key} {tag} {len}");
            acks.line(format!("begin {id} {op}"))?;
            let result = ks.put_with(key.as_bytes(), &value_bytes(&tag, len), d);
            (op, result, d_text)
        } else if roll < 82 {
            let key = random_key(&mut rng);
            let (d, d_text) = durability(&mut rng, 8);
            let op = format!("del {ks_name} {key}");
            acks.line(format!("begin {id} {op}"))?;
            let result = ks.delete_with(key.as_bytes(), d).map(|_| ());
            (op, result, d_text)
        } else if roll < 95 {
            let n = 1 + rng.below(8);
            let (d, d_text) = durability(&mut rng, 4);
            let mut batch = ks.batch();
            let mut op = format!("batch {ks_name} {n}");
            for i in 0..n {
                let key = random_key(&mut rng);
                if rng.below(5) == 0 {
                    batch.delete(key.as_bytes());
                    op.push_str(&format!(" D {key}"));
                } else {
                    let len = random_value_len(&mut rng);
                    let item_tag = format!("{tag}.{i}");
                    batch.put(key.as_bytes(), &value_bytes(&item_tag, len));
                    op.push_str(&format!(" P {key} {item_tag} {len}"));
                }
            }
            acks.line(format!("begin {id} {op}"))?;
            (op, batch.commit_with(d), d_text)
        } else if roll < 99 {
            acks.line(format!("begin {id} sync"))?;
            ("sync".to_string(), db.sync(), "sync")
        } else {
            acks.line(format!("begin {id} commit"))?;
            ("commit".to_string(), db.commit(), "sync")
        };
        if let Err(error) = result {
            acks.line(format!("error {id} {error}"))?;
            return Err(CliError::from(error).context(format_args!("crash-writer op {id}")));
        }
        acks.line(format!("ack {id} {durability_text} {op_text}"))?;
        id += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_bytes_repeat_the_tag_and_a_slash() {
        assert_eq!(value_bytes("ab", 7), b"ab/ab/a");
        assert_eq!(value_bytes("x", 0), b"");
    }

    #[test]
    fn the_rng_replays_from_its_seed() {
        let a: Vec<u64> = (0..4)
            .map({
                let mut r = Rng(7);
                move |_| r.next_u64()
            })
            .collect();
        let mut r = Rng(7);
        assert_eq!(a, (0..4).map(|_| r.next_u64()).collect::<Vec<_>>());
    }
}
