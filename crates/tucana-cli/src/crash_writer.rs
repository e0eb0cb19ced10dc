//! `tucana --db P crash-writer --seed S [--gc] [--deferred-updates]` (hidden): the victim of the kill -9 test
//! (M3 in docs/reliability.md, driven by `tucana-crashtest kill9`).
//!
//! Owns: a seeded, endless stream of writes against one volume and the line protocol that
//! tells the driver, after each call returned, what was acknowledged and how durably. Does
//! not own: any checking (the driver reopens the volume and compares) nor stopping (it
//! writes until it is killed, or until stdout is closed).
//!
//! With `--gc` the stream is made for garbage collection to run while the kill comes:
//! 64 KiB log segments, a dozen hot keys per keyspace (most writes leave the previous
//! record dead, so segments empty out), values of a few KiB, the background collector
//! stepping every 1 to 5 ms beside a committer every 1 to 20 ms (so commit pairs and
//! punches happen), and forced passes (`Database::gc`) among the writes. Kills then land
//! during relocation, retirement, commit pairs and hole punching.
//!
//! With `--deferred-updates` the engine defers every put that replaces a key
//! (`DeferredUpdates::Always`; by default it does so only while the data is out of
//! memory, which a small test volume never is): kills then land while updates are logged
//! and acknowledged but not yet in the index, and while a batch of them is applied.
//!
//! Protocol, one line per event on stdout, each written with a single flushed write so a
//! kill leaves at most a torn *last* line (which the driver ignores):
//!
//! ```text
//! open <options>                     the volume is open
//! ks <name>                          keyspace <name> exists (its creation is durable)
//! begin <id> <op>                    about to call the engine (the op may be in flight)
//! ack <id> <durability> <op>         the call returned Ok; durability is buffered or sync
//! gcstats <passes> <relocated> <reclaimed>
//!                                    this life's GC so far (`Stats::gc_passes`,
//!                                    `gc_relocated_bytes`, `gc_reclaimed_bytes`); only
//!                                    between an ack and the next begin, when they changed
//! deferstats <puts>                  this life's deferred puts so far (`Stats::deferred_puts`),
//!                                    with `--deferred-updates`, like gcstats
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
//! gc                                             Database::gc (only with --gc)
//! ```
//!
//! `sync`, `commit` and `gc` are always acknowledged with durability `sync`: every write
//! acknowledged before them is durable (a forced pass commits before it collects). Keys
//! and tags are printable ASCII without spaces. A value is its tag followed by `/`,
//! repeated and cut to `len` bytes (`value_bytes`; the driver has the same function). An
//! engine error prints `error <id> <message>` and exits with status 2.
//!
//! Single-threaded (the engine runs its own background flusher, committer and collector).

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use tucana::{Database, DeferredUpdates, Durability, Keyspace};

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

/// Keys per keyspace the plain mode draws from (some sharing an 8-byte prefix, so twice
/// as many names).
const PLAIN_KEYS: u64 = 400;
/// Keys per keyspace of `--gc`: so few that nearly every write overwrites a live record.
const GC_KEYS: u64 = 12;
/// One op in this many is a forced GC pass with `--gc`.
const GC_PASS_IN: u64 = 60;
/// With `--gc`, the GC stats are looked at every this many ops (and after every pass).
const GC_STATS_EVERY: u64 = 16;

fn random_key(rng: &mut Rng, keys: u64) -> String {
    let n = rng.below(keys);
    // Long keys sharing their first 8 bytes make leaf prefixes tie, which takes the
    // hash-and-compare path of the index.
    if rng.below(4) == 0 {
        format!("shared-prefix-{n:05}")
    } else {
        format!("k{n}")
    }
}

fn random_value_len(rng: &mut Rng, gc: bool) -> usize {
    if gc {
        // A 64 KiB segment holds a few dozen of these: segments fill and empty out fast.
        return match rng.below(100) {
            // Larger than a segment: a segment of its own, dead at the key's next write.
            0 => 70_000 + rng.below(30_000) as usize,
            1..=10 => 8_000 + rng.below(16_000) as usize,
            _ => rng.below(4_000) as usize,
        };
    }
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

/// This life's garbage collection so far: passes, bytes relocated, bytes reclaimed.
fn gc_stats(db: &Database) -> (u64, u64, u64) {
    let stats = db.stats();
    (
        stats.gc_passes,
        stats.gc_relocated_bytes,
        stats.gc_reclaimed_bytes,
    )
}

/// How the writer runs: `crash-writer`'s flags.
#[derive(Clone, Copy, Debug, Default)]
pub struct Mode {
    /// `--gc`: garbage-collection heavy (see the module doc).
    pub gc: bool,
    /// `--deferred-updates`: every update of an existing key is deferred.
    pub deferred: bool,
}

/// Opens the volume with options drawn from `rng` (the GC-heavy ones with `mode.gc`) and
/// announces them with the `open` line. Deferral draws nothing, so a seed's stream of
/// writes is the same with and without it.
fn open(path: &Path, mode: Mode, rng: &mut Rng, acks: &mut Acks) -> Result<Database, CliError> {
    let gc = mode.gc;
    let options = if gc {
        // The committer must run for the collector's commit pairs (and so for its punches).
        let segment_bytes = 64u64 << 10;
        let flush_ms = rng.pick(&[0u64, 1, 5]);
        let commit_ms = rng.pick(&[1u64, 3, 20]);
        let commit_dirty_bytes = rng.pick(&[64u64 << 10, 1 << 20]);
        let gc_tick_ms = rng.pick(&[1u64, 2, 5]);
        (
            segment_bytes,
            flush_ms,
            commit_ms,
            commit_dirty_bytes,
            gc_tick_ms,
        )
    } else {
        let segment_bytes = rng.pick(&[64u64 << 10, 128 << 10, 2 << 20]);
        let flush_ms = rng.pick(&[0u64, 1, 5, 50]);
        let commit_ms = rng.pick(&[0u64, 3, 20, 200]);
        let commit_dirty_bytes = rng.pick(&[64u64 << 10, 1 << 20, 256 << 20]);
        (segment_bytes, flush_ms, commit_ms, commit_dirty_bytes, 0)
    };
    let (segment_bytes, flush_ms, commit_ms, commit_dirty_bytes, gc_tick_ms) = options;
    let ms = |m: u64| (m > 0).then(|| Duration::from_millis(m));
    let mut builder = Database::builder()
        .log_segment_bytes(segment_bytes)
        .flush_interval(ms(flush_ms))
        .commit_interval(ms(commit_ms))
        .commit_dirty_bytes(commit_dirty_bytes);
    if gc {
        // The plain mode keeps the engine's default tick, as users get it.
        builder = builder.gc_tick(Duration::from_millis(gc_tick_ms));
    }
    if mode.deferred {
        builder = builder.deferred_updates(DeferredUpdates::Always);
    }
    let db = builder
        .open(path)
        .map_err(|e| CliError::from(e).context(format_args!("cannot open {}", path.display())))?;
    let gc_text = if gc {
        format!(" gc_heavy gc_tick_ms={gc_tick_ms}")
    } else {
        String::new()
    };
    let deferred_text = if mode.deferred {
        " deferred_updates=always"
    } else {
        ""
    };
    acks.line(format!(
        "open segment_bytes={segment_bytes} flush_ms={flush_ms} commit_ms={commit_ms} \
         commit_dirty_bytes={commit_dirty_bytes}{gc_text}{deferred_text}"
    ))?;
    Ok(db)
}

/// Runs until killed: see the module doc.
pub fn run(path: &Path, seed: u64, mode: Mode) -> Result<Outcome, CliError> {
    let gc = mode.gc;
    let mut rng = Rng(seed);
    let mut acks = Acks(std::io::stdout());
    let db = open(path, mode, &mut rng, &mut acks)?;
    let mut keyspaces: Vec<Keyspace> = Vec::new();
    for name in KEYSPACES {
        keyspaces.push(db.keyspace(name)?);
        acks.line(format!("ks {name}"))?;
    }
    let keys = if gc { GC_KEYS } else { PLAIN_KEYS };
    let mut reported = (0, 0, 0);
    let mut reported_deferred = 0;
    let mut id = 0u64;
    loop {
        let ks_index = rng.below(keyspaces.len() as u64) as usize;
        let ks = &keyspaces[ks_index];
        let ks_name = KEYSPACES[ks_index];
        let tag = format!("{seed:x}.{id}");
        // No draw in the plain mode: its streams stay what they were before `--gc`.
        let forced_gc = gc && rng.below(GC_PASS_IN) == 0;
        let roll = if forced_gc { 100 } else { rng.below(100) };
        let (op_text, result, durability_text) = if roll < 70 {
            let key = random_key(&mut rng, keys);
            let len = random_value_len(&mut rng, gc);
            let (d, d_text) = durability(&mut rng, 8);
            let op = format!("put {ks_name} {key} {tag} {len}");
            acks.line(format!("begin {id} {op}"))?;
            let result = ks.put_with(key.as_bytes(), &value_bytes(&tag, len), d);
            (op, result, d_text)
        } else if roll < 82 {
            let key = random_key(&mut rng, keys);
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
                let key = random_key(&mut rng, keys);
                if rng.below(5) == 0 {
                    batch.delete(key.as_bytes());
                    op.push_str(&format!(" D {key}"));
                } else {
                    let len = random_value_len(&mut rng, gc);
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
        } else if roll < 100 {
            acks.line(format!("begin {id} commit"))?;
            ("commit".to_string(), db.commit(), "sync")
        } else {
            acks.line(format!("begin {id} gc"))?;
            ("gc".to_string(), db.gc(), "sync")
        };
        if let Err(error) = result {
            acks.line(format!("error {id} {error}"))?;
            return Err(CliError::from(error).context(format_args!("crash-writer op {id}")));
        }
        acks.line(format!("ack {id} {durability_text} {op_text}"))?;
        id += 1;
        if gc && (forced_gc || id.is_multiple_of(GC_STATS_EVERY)) {
            let now = gc_stats(&db);
            if now != reported {
                reported = now;
                let (passes, relocated, reclaimed) = now;
                acks.line(format!("gcstats {passes} {relocated} {reclaimed}"))?;
            }
        }
        if mode.deferred && id.is_multiple_of(GC_STATS_EVERY) {
            let now = db.stats().deferred_puts;
            if now != reported_deferred {
                reported_deferred = now;
                acks.line(format!("deferstats {now}"))?;
            }
        }
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
