//! Corruption (row M4 of `docs/reliability.md`): a committed volume (a workload drawn
//! from the seed, ending in a commit and a synced log tail past it) is corrupted and
//! reopened. Every outcome must be an `Err` naming what is corrupt, or an open whose
//! reads return a state some prefix of the history produced; never a wrong value, never
//! a panic.
//!
//! 1. Every single-bit flip of both superblock slots (the newest must fall back to the
//!    older slot's commit, which replays the log to the same contents).
//! 2. `count` random corruptions: a bit flip, a zeroed block, or another block's bytes
//!    written over it (a misdirected write at rest), aimed at an index node, a log block,
//!    a commit descriptor or a bitmap buddy, each either one the newest commit references
//!    (open and `check` read it: it must be detected) or an older one (of an earlier
//!    commit, or free: a sound volume may never read it); and misdirected writes while
//!    the workload runs (one of its writes lands on another block, the intended one
//!    keeps its old bytes). The figures line gives detected/recovered per target.
//!
//! Outcomes: *detected* (open, a read or `check` answered `Error::Corruption`, or
//! `NotAVolume`/`UnsupportedVersion` for a volume with no valid superblock), *recovered*
//! (reads equal a prefix state and `check` passes), *wrong* (a read returned data no
//! prefix has, or a keyspace vanished), *unnamed* (another error, e.g. plain I/O past the
//! end: not naming the corruption), *panics*. Wrong, unnamed and panics fail the suite.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use rand::Rng;
use tucana::alloc::buddy_offset;
use tucana::fuzzing::Descriptor;
use tucana::index::{image_contents, ImageContents};
use tucana::volume::superblock::Superblock;
use tucana::volume::Storage;
use tucana::{Database, Error};

use crate::model::{KeyspaceModel, State, Verdict};
use crate::sim::{Fault, Image, IoKind, SimStorage, BLOCK_BYTES};
use crate::workload::{self, Op};
use crate::{case_rng, catch, Report, RunArgs};

const KEYSPACES: usize = 2;
const OPS: u64 = 300;
/// Operations of the superblock sweep's volume (before its log tail).
const SWEEP_OPS: u64 = 20;

#[derive(Default)]
struct Tally {
    superblock_flips: u64,
    corruptions: u64,
    detected: u64,
    recovered: u64,
    wrong: u64,
    unnamed: u64,
    panics: u64,
    by_target: BTreeMap<&'static str, [u64; 2]>,
    failures: Vec<String>,
}

#[derive(Debug)]
enum Outcome {
    Detected,
    Recovered,
    Wrong(String),
    Unnamed(Error),
}

/// The committed volume and what was written to it.
struct Volume {
    image: Image,
    models: Vec<KeyspaceModel>,
    names: Vec<String>,
    sim_seed: u64,
}

/// Builds the volume; also returns the numbers of the workload's write I/Os (those a
/// misdirected write can hit: the same on every build of one seed, no background thread).
fn build(seed: u64, misdirect: Option<Fault>, op_count: u64) -> (Volume, Vec<u64>) {
    let mut rng = case_rng(seed, u64::MAX);
    let sim_seed = rng.random();
    let mut ops: Vec<Op> = (0..op_count)
        .map(|i| workload::random_op(&mut rng, KEYSPACES, i + 1))
        .collect();
    ops.push(Op::Commit);
    // A log tail past the last commit, synced: open must replay it.
    for i in 0..10 {
        ops.push(workload::random_op(&mut rng, KEYSPACES, op_count + 10 + i));
    }
    ops.push(Op::Sync);
    let sim = Arc::new(SimStorage::new(sim_seed));
    let storage: Arc<dyn Storage> = sim.clone();
    let db = workload::open(workload::options(false), &storage).expect("create a fresh volume");
    let names: Vec<String> = (0..KEYSPACES).map(|i| format!("ks{i}")).collect();
    let keyspaces: Vec<_> = names
        .iter()
        .map(|n| db.keyspace(n).expect("create a keyspace"))
        .collect();
    db.commit().expect("first commit");
    let base_io = sim.io_count();
    if let Some(f) = misdirect {
        sim.arm(f);
    }
    let mut models = vec![KeyspaceModel::default(); KEYSPACES];
    for op in &ops {
        // Without a fault nothing fails; with a misdirected write nothing reports it.
        let _ = workload::run_op(op, &db, &keyspaces, &mut models);
    }
    db.abandon();
    let image = sim.durable_image();
    let writes = (base_io..)
        .zip(&sim.io_kinds()[base_io as usize..])
        .filter(|(_, kind)| **kind == IoKind::Write)
        .map(|(io, _)| io)
        .collect();
    (
        Volume {
            image,
            models,
            names,
            sim_seed,
        },
        writes,
    )
}

/// Opens `image`, reads everything, compares with the model (any prefix is an allowed
/// earlier state), then runs `check`.
fn judge(image: Image, v: &Volume, with_check: bool) -> Outcome {
    let storage: Arc<dyn Storage> = Arc::new(SimStorage::from_image(image, 0));
    let db = match workload::open(workload::options(false), &storage) {
        Ok(db) => db,
        Err(e) => return classify_err(e),
    };
    let outcome = read_and_compare(&db, v);
    if !matches!(outcome, Outcome::Recovered) || !with_check {
        db.abandon();
        return outcome;
    }
    let r = db.check();
    db.abandon();
    match r {
        Ok(_) => Outcome::Recovered,
        Err(e) => classify_err(e),
    }
}

fn classify_err(e: Error) -> Outcome {
    match e {
        Error::Corruption { .. } | Error::NotAVolume(_) | Error::UnsupportedVersion { .. } => {
            Outcome::Detected
        }
        e => Outcome::Unnamed(e),
    }
}

fn read_and_compare(db: &Database, v: &Volume) -> Outcome {
    for (name, model) in v.names.iter().zip(&v.models) {
        let ks = match db.open_keyspace(name) {
            Ok(ks) => ks,
            Err(e @ Error::KeyspaceNotFound(_)) => return Outcome::Wrong(e.to_string()),
            Err(e) => return classify_err(e),
        };
        let state: State = match workload::read_state(&ks) {
            Ok(s) => s,
            Err(e) => return classify_err(e),
        };
        // Point reads take another path (prefix + hash search) than the scan.
        for key in model.latest().keys().chain(state.keys()) {
            match ks.get(key) {
                Ok(got) if got.as_ref() == state.get(key) => {}
                Ok(got) => {
                    return Outcome::Wrong(format!(
                        "keyspace {name} key {:?}: get returned {:?} bytes, the scan {:?}",
                        String::from_utf8_lossy(key),
                        got.map(|g| g.len()),
                        state.get(key).map(|s| s.len())
                    ))
                }
                Err(e) => return classify_err(e),
            }
        }
        match model.verify(&state) {
            Verdict::Prefix { .. } | Verdict::LostDurable { .. } => {}
            v @ Verdict::NonPrefix { .. } => {
                return Outcome::Wrong(format!("keyspace {name}: {v:?}"))
            }
        }
    }
    Outcome::Recovered
}

fn tally(t: &mut Tally, target: &'static str, where_: String, r: Result<Outcome, String>) {
    let slot = t.by_target.entry(target).or_default();
    match r {
        Ok(Outcome::Detected) => {
            t.detected += 1;
            slot[0] += 1;
        }
        Ok(Outcome::Recovered) => {
            t.recovered += 1;
            slot[1] += 1;
        }
        Ok(Outcome::Wrong(m)) => {
            t.wrong += 1;
            t.failures
                .push(format!("{where_}: wrong data returned: {m}"));
        }
        Ok(Outcome::Unnamed(e)) => {
            t.unnamed += 1;
            t.failures
                .push(format!("{where_}: error not naming the corruption: {e}"));
        }
        Err(p) => {
            t.panics += 1;
            t.failures.push(format!("{where_}: panic: {p}"));
        }
    }
}

pub fn run(args: &RunArgs) -> Report {
    let mut t = Tally::default();
    let built = catch(|| build(args.seed, None, OPS));
    let (v, write_ios) = match built {
        Ok(b) => b,
        Err(p) => {
            t.failures.push(format!(
                "corruption seed {}: building the volume panicked: {p}",
                args.seed
            ));
            return report(args, t);
        }
    };
    if args.case.is_none() {
        // A small volume: the sweep opens it 65,536 times.
        match catch(|| build(args.seed, None, SWEEP_OPS)) {
            Ok((small, _)) => superblock_sweep(args, &small, &mut t),
            Err(p) => t.failures.push(format!(
                "corruption seed {}: building the sweep volume panicked: {p}",
                args.seed
            )),
        }
    }
    let blocks = classify(&v.image);
    let cases: Vec<u64> = match args.case {
        Some(c) => vec![c],
        None => (0..args.count).collect(),
    };
    for case in cases {
        let mut rng = case_rng(args.seed, case);
        let where_ = format!("corruption seed {} case {case}", args.seed);
        t.corruptions += 1;
        if rng.random_range(0..10) == 0 {
            // A write misdirected while the workload runs: one of its writes (a fault
            // aimed at a read or sync would change nothing and count as recovered).
            let to_block = rng.random::<u64>();
            let at_io = write_ios[rng.random_range(0..write_ios.len())];
            let what = format!("{where_}: write at I/O {at_io} misdirected to block ~{to_block}");
            let r = catch(|| {
                let (bad, _) = build(args.seed, Some(Fault::Misdirect { at_io, to_block }), OPS);
                judge(bad.image.clone(), &bad, true)
            });
            if args.verbose {
                eprintln!("{what}: {r:?}");
            }
            tally(&mut t, "misdirected live write", what, r);
            continue;
        }
        let (target, list) = loop {
            let (target, list) = &blocks[rng.random_range(0..blocks.len())];
            if !list.is_empty() {
                break (*target, list);
            }
        };
        let block = list[rng.random_range(0..list.len())];
        let sim = SimStorage::from_image(v.image.clone(), v.sim_seed);
        let what = match rng.random_range(0..3) {
            0 => {
                let bit = rng.random_range(0..BLOCK_BYTES * 8);
                sim.flip_bit(block * BLOCK_BYTES + bit / 8, (bit % 8) as u8);
                format!("{where_}: bit {bit} of {target} block {block} flipped")
            }
            1 => {
                sim.zero_block(block);
                format!("{where_}: {target} block {block} zeroed")
            }
            _ => {
                let all = v.image.written_blocks();
                let from = all[rng.random_range(0..all.len())];
                sim.copy_block(from, block);
                format!("{where_}: block {from} written over {target} block {block}")
            }
        };
        let r = catch(|| judge(sim.current_image(), &v, true));
        if args.verbose {
            eprintln!("{what}: {r:?}");
        }
        tally(&mut t, target, what, r);
    }
    report(args, t)
}

fn report(args: &RunArgs, t: Tally) -> Report {
    let targets: Vec<String> = t
        .by_target
        .iter()
        .map(|(k, [d, r])| format!("{k} {d}/{r}"))
        .collect();
    Report {
        figures: format!(
            "M4 superblock bit flips: {}, random corruptions: {}, detected: {}, recovered: {}, wrong: {}, unnamed errors: {}, panics: {}, (detected/recovered by target: {}), seed: {}",
            t.superblock_flips,
            t.corruptions,
            t.detected,
            t.recovered,
            t.wrong,
            t.unnamed,
            t.panics,
            targets.join(", "),
            args.seed
        ),
        failures: t.failures,
    }
}

/// Every bit of both slots. The `check` walk runs on one flip in 64 (it commits and reads
/// the whole volume; the sweep's point is the superblock choice, which the reads cover).
fn superblock_sweep(args: &RunArgs, v: &Volume, t: &mut Tally) {
    for slot in 0..2u64 {
        for bit in 0..BLOCK_BYTES * 8 {
            t.superblock_flips += 1;
            let sim = SimStorage::from_image(v.image.clone(), v.sim_seed);
            sim.flip_bit(slot * BLOCK_BYTES + bit / 8, (bit % 8) as u8);
            let r = catch(|| judge(sim.current_image(), v, bit % 64 == 0));
            let where_ = format!(
                "corruption seed {} superblock slot {slot} bit {bit}",
                args.seed
            );
            tally(t, "superblock", where_, r);
        }
    }
}

/// Written blocks by what they hold, split into the structures of the newest commit (what
/// open reads: corruption there must be detected or, for a superblock slot, fall back)
/// and everything older (blocks of earlier commits, kept for the older slot or free, whose
/// corruption a sound volume may simply never read):
/// index nodes (the magic; newest: reachable from its roots), log (anything else written
/// past the reserved blocks; newest: inside its segments' written bytes), commit
/// descriptors (named by either slot), bitmap buddies (blocks 2..6 of group 0; newest:
/// the buddy its descriptor names).
fn classify(image: &Image) -> Vec<(&'static str, Vec<u64>)> {
    let sim = SimStorage::from_image(image.clone(), 0);
    let mut descriptors = Vec::new();
    for slot in 0..2u64 {
        let mut buf = vec![0u8; BLOCK_BYTES as usize];
        if sim.read_at(slot * BLOCK_BYTES, &mut buf).is_err() {
            continue;
        }
        if let Ok(sb) = Superblock::decode(&buf, slot as usize) {
            let first = sb.descriptor.0 / BLOCK_BYTES;
            descriptors.extend(first..first + sb.descriptor_bytes.div_ceil(BLOCK_BYTES));
        }
    }
    let newest = newest_structures(&sim);
    let (mut descriptor_newest, mut descriptor_older) = (Vec::new(), Vec::new());
    for b in descriptors {
        if newest.descriptor.contains(&b) {
            descriptor_newest.push(b);
        } else {
            descriptor_older.push(b);
        }
    }
    let (mut nodes_newest, mut nodes_older) = (Vec::new(), Vec::new());
    let (mut log_newest, mut log_older) = (Vec::new(), Vec::new());
    for b in image.written_blocks() {
        if b < 8 || descriptor_newest.contains(&b) || descriptor_older.contains(&b) {
            continue;
        }
        let mut buf = vec![0u8; BLOCK_BYTES as usize];
        if sim.read_at(b * BLOCK_BYTES, &mut buf).is_err() || buf.iter().all(|&x| x == 0) {
            continue;
        }
        match (
            &buf[4..8] == b"TNOD",
            newest.nodes.contains(&b),
            newest.log.contains(&b),
        ) {
            (true, true, _) => nodes_newest.push(b),
            (true, false, _) => nodes_older.push(b),
            (false, _, true) => log_newest.push(b),
            (false, _, false) => log_older.push(b),
        }
    }
    let (buddy_newest, buddy_older): (Vec<u64>, Vec<u64>) =
        (2..6).partition(|b| newest.buddy.contains(b));
    vec![
        ("index node (newest commit)", nodes_newest),
        ("index node (older)", nodes_older),
        ("log (newest commit)", log_newest),
        ("log (older)", log_older),
        ("descriptor (newest commit)", descriptor_newest),
        ("descriptor (older)", descriptor_older),
        ("bitmap buddy (newest commit)", buddy_newest),
        ("bitmap buddy (older)", buddy_older),
    ]
}

/// Blocks of the structures the newest commit references.
#[derive(Default)]
struct Newest {
    descriptor: HashSet<u64>,
    nodes: HashSet<u64>,
    log: HashSet<u64>,
    buddy: HashSet<u64>,
}

/// Reads the newest commit of a sound volume (the one `build` made; nothing is corrupt
/// yet): its descriptor, the nodes of its trees, its segments' written blocks and the
/// group 0 buddy it names.
fn newest_structures(sim: &SimStorage) -> Newest {
    let mut n = Newest::default();
    let Ok(Some(sb)) = tucana::volume::superblock::read_newest(sim) else {
        return n;
    };
    let first = sb.descriptor.0 / BLOCK_BYTES;
    n.descriptor
        .extend(first..first + sb.descriptor_bytes.div_ceil(BLOCK_BYTES));
    let mut bytes = vec![0u8; sb.descriptor_bytes as usize];
    if sim.read_at(sb.descriptor.0, &mut bytes).is_err() {
        return n;
    }
    let Ok(desc) = Descriptor::decode(&bytes, sb.descriptor) else {
        return n;
    };
    if let Some(&slot) = desc.bitmap_slots.first() {
        let at = buddy_offset(0, slot).0 / BLOCK_BYTES;
        n.buddy.extend([at, at + 1]);
    }
    let mut image = vec![0u8; BLOCK_BYTES as usize];
    for region in &desc.regions {
        for (off, stats) in &region.segments {
            let first = off.0 / BLOCK_BYTES;
            n.log
                .extend(first..first + stats.written_bytes.div_ceil(BLOCK_BYTES));
        }
        let mut todo = vec![region.root];
        while let Some(off) = todo.pop() {
            if off.is_none() || !n.nodes.insert(off.0 / BLOCK_BYTES) {
                continue;
            }
            if sim.read_at(off.0, &mut image).is_err() {
                continue;
            }
            if let Ok(ImageContents::Internal { children, .. }) =
                image_contents(&image, off, region.id)
            {
                todo.extend(children);
            }
        }
    }
    n
}
