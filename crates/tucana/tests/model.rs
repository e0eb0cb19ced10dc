//! Model test: random operation sequences run against the engine and against a
//! `BTreeMap<Vec<u8>, Vec<u8>>` per keyspace, which must agree after every step.
//!
//! What it covers: put, delete, get (copying and in place), contains, len, ranges over
//! random bounds in both directions (including mixed `next`/`next_back` on one
//! iterator and iterators dropped half-way), prefix iteration, atomic batches,
//! snapshots read long after they were taken while writes continue, commit, sync,
//! close-and-reopen and abandon-and-reopen (a simulated crash, always right after a
//! completed `sync`, so the expected state is exact). Every reopen and the end of every
//! case run `Database::check`. Each case runs on a single-file volume, and (a third,
//! smaller set of cases) on a volume over three member files.
//!
//! Keys come from a small alphabet with shared heads, so the index's 8-byte key prefixes
//! tie often (and `"a"` vs `"a\0"`, keys ending in `0xff` and prefix scans of `0xff…` are
//! common), with the occasional key of up to 2 KiB; values are mostly short, sometimes
//! empty, sometimes up to 64 KiB.
//!
//! Case count is fixed so CI time is predictable; `TUCANA_MODEL_CASES=<n>` raises it for
//! long runs. A failing case is shrunk by proptest and printed as a list of operations;
//! keep it as a named regression test.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::path::PathBuf;
use std::time::Duration;

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, FileFailurePersistence};
use tucana::{Database, DeferredUpdates, Durability, Keyspace, Options, Range, Snapshot};

const KEYSPACES: [&str; 2] = ["alpha", "beta"];
const MAX_OPS: usize = 300;
/// Snapshots kept alive at once; the oldest is verified and dropped past this.
const MAX_LIVE_SNAPSHOTS: usize = 4;
const LONG_KEY_MAX_BYTES: usize = 2048;
const LARGE_VALUE_MAX_BYTES: usize = 64 * 1024;

type Model = BTreeMap<Vec<u8>, Vec<u8>>;
type Entry = (Vec<u8>, Vec<u8>);

// ---------------------------------------------------------------------------------------
// Operations and their strategies
// ---------------------------------------------------------------------------------------

/// A key named by an operation: a fresh one, or one that exists in the model when the
/// operation runs (so gets, deletes and bounds hit real keys often).
#[derive(Clone)]
enum KeyRef {
    New(Vec<u8>),
    Existing(Index),
}

// Shrunk failing cases print their keys short and readable.
impl std::fmt::Debug for KeyRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyRef::New(k) => write!(f, "New({})", show(k)),
            KeyRef::Existing(i) => write!(f, "Existing({i:?})"),
        }
    }
}

/// A value, generated lazily from its length and a seed so shrunk cases print short.
#[derive(Clone, Copy, Debug)]
struct Val {
    len_bytes: usize,
    seed: u8,
}

impl Val {
    fn bytes(self) -> Vec<u8> {
        (0..self.len_bytes)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(self.seed) ^ (i >> 8) as u8)
            .collect()
    }
}

#[derive(Clone, Copy, Debug)]
enum BoundKind {
    Included,
    Excluded,
    Unbounded,
}

/// How an iterator is consumed.
#[derive(Clone, Debug)]
enum Dir {
    /// `next` until exhausted or `limit` items (then the iterator is dropped half-way).
    Forward { limit: Option<usize> },
    /// Through `.rev()`.
    Reverse { limit: Option<usize> },
    /// `next_back` where the pattern says `true`, `next` otherwise, cycling, until the
    /// two ends meet.
    Mixed(Vec<bool>),
    /// `Range::limit(items)` (which caps the leaf copies of its forward side), then as
    /// `Mixed`: `items` pairs from the two ends together, then nothing.
    Limited { items: usize, pattern: Vec<bool> },
}

#[derive(Clone, Debug)]
struct Bounds {
    lo: (BoundKind, KeyRef),
    hi: (BoundKind, KeyRef),
}

#[derive(Clone, Debug)]
enum SnapRead {
    Get(KeyRef),
    Range(Bounds, Dir),
    Prefix(KeyRef, Index, Dir),
    Full,
}

#[derive(Clone, Debug)]
enum Op {
    Put {
        ks: usize,
        key: KeyRef,
        val: Val,
        durability: Durability,
    },
    Delete {
        ks: usize,
        key: KeyRef,
        durability: Durability,
    },
    Get {
        ks: usize,
        key: KeyRef,
        in_place: bool,
    },
    Contains {
        ks: usize,
        key: KeyRef,
    },
    Range {
        ks: usize,
        bounds: Bounds,
        dir: Dir,
    },
    /// Keys starting with the first `cut` bytes of `key`.
    Prefix {
        ks: usize,
        key: KeyRef,
        cut: Index,
        dir: Dir,
    },
    Batch {
        ks: usize,
        writes: Vec<(KeyRef, Option<Val>)>,
        durability: Durability,
    },
    TakeSnapshot {
        ks: usize,
    },
    ReadSnapshot {
        which: Index,
        read: SnapRead,
    },
    /// Full comparison of one keyspace and its `len`.
    Verify {
        ks: usize,
    },
    Commit,
    Sync,
    Reopen,
    AbandonAfterSync,
}

fn key_strategy() -> impl Strategy<Value = Vec<u8>> {
    let heads: Vec<&'static [u8]> = vec![
        b"",
        b"k",
        b"user:",
        b"aaaaaaa",
        b"aaaaaaaa",
        b"aaaaaaaaaaaaaaaa",
        b"\xff\xff\xff\xff\xff\xff\xff",
    ];
    let tail = || prop::collection::vec(prop::sample::select(vec![0u8, b'a', b'b', 0xff]), 1..=3);
    let short =
        (prop::sample::select(heads.clone()), tail()).prop_map(|(h, t)| [h, &t[..]].concat());
    let long = (
        prop::sample::select(heads),
        1..=LONG_KEY_MAX_BYTES - 32,
        tail(),
    )
        .prop_map(|(h, fill, t)| {
            let mut key = h.to_vec();
            key.resize(h.len() + fill, b'x');
            key.extend_from_slice(&t);
            key
        });
    prop_oneof![30 => short, 1 => long]
}

fn key_ref() -> impl Strategy<Value = KeyRef> {
    prop_oneof![
        3 => key_strategy().prop_map(KeyRef::New),
        2 => any::<Index>().prop_map(KeyRef::Existing),
    ]
}

fn val_strategy() -> impl Strategy<Value = Val> {
    let len = prop_oneof![
        2 => Just(0usize),
        25 => 1usize..48,
        3 => 48usize..=LARGE_VALUE_MAX_BYTES,
        1 => Just(LARGE_VALUE_MAX_BYTES),
    ];
    (len, any::<u8>()).prop_map(|(len_bytes, seed)| Val { len_bytes, seed })
}

fn durability_strategy() -> impl Strategy<Value = Durability> {
    // Sync writes are rarer than in real use: each costs an fsync, and the suite has a
    // time budget.
    prop_oneof![19 => Just(Durability::Buffered), 1 => Just(Durability::Sync)]
}

fn bound_strategy() -> impl Strategy<Value = (BoundKind, KeyRef)> {
    let kind = prop_oneof![
        3 => Just(BoundKind::Included),
        3 => Just(BoundKind::Excluded),
        1 => Just(BoundKind::Unbounded),
    ];
    (kind, key_ref())
}

fn bounds_strategy() -> impl Strategy<Value = Bounds> {
    (bound_strategy(), bound_strategy()).prop_map(|(lo, hi)| Bounds { lo, hi })
}

fn dir_strategy() -> impl Strategy<Value = Dir> {
    let limit = prop_oneof![3 => Just(None), 1 => (0usize..6).prop_map(Some)];
    prop_oneof![
        3 => limit.clone().prop_map(|limit| Dir::Forward { limit }),
        3 => limit.prop_map(|limit| Dir::Reverse { limit }),
        2 => prop::collection::vec(any::<bool>(), 1..8).prop_map(Dir::Mixed),
        2 => (0usize..40, prop::collection::vec(prop::bool::weighted(0.2), 1..6))
            .prop_map(|(items, pattern)| Dir::Limited { items, pattern }),
    ]
}

fn snap_read_strategy() -> impl Strategy<Value = SnapRead> {
    prop_oneof![
        3 => key_ref().prop_map(SnapRead::Get),
        3 => (bounds_strategy(), dir_strategy()).prop_map(|(b, d)| SnapRead::Range(b, d)),
        1 => (key_ref(), any::<Index>(), dir_strategy())
            .prop_map(|(k, c, d)| SnapRead::Prefix(k, c, d)),
        1 => Just(SnapRead::Full),
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let ks = || 0..KEYSPACES.len();
    let batch_write = (
        key_ref(),
        prop_oneof![3 => val_strategy().prop_map(Some), 1 => Just(None)],
    );
    prop_oneof![
        30 => (ks(), key_ref(), val_strategy(), durability_strategy())
            .prop_map(|(ks, key, val, durability)| Op::Put { ks, key, val, durability }),
        8 => (ks(), key_ref(), durability_strategy())
            .prop_map(|(ks, key, durability)| Op::Delete { ks, key, durability }),
        12 => (ks(), key_ref(), any::<bool>())
            .prop_map(|(ks, key, in_place)| Op::Get { ks, key, in_place }),
        4 => (ks(), key_ref()).prop_map(|(ks, key)| Op::Contains { ks, key }),
        6 => (ks(), bounds_strategy(), dir_strategy())
            .prop_map(|(ks, bounds, dir)| Op::Range { ks, bounds, dir }),
        4 => (ks(), key_ref(), any::<Index>(), dir_strategy())
            .prop_map(|(ks, key, cut, dir)| Op::Prefix { ks, key, cut, dir }),
        5 => (ks(), prop::collection::vec(batch_write, 1..8), durability_strategy())
            .prop_map(|(ks, writes, durability)| Op::Batch { ks, writes, durability }),
        3 => ks().prop_map(|ks| Op::TakeSnapshot { ks }),
        6 => (any::<Index>(), snap_read_strategy())
            .prop_map(|(which, read)| Op::ReadSnapshot { which, read }),
        2 => ks().prop_map(|ks| Op::Verify { ks }),
        3 => Just(Op::Commit),
        3 => Just(Op::Sync),
        2 => Just(Op::Reopen),
        1 => Just(Op::AbandonAfterSync),
    ]
}

fn ops_strategy() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(op_strategy(), 1..=MAX_OPS)
}

// ---------------------------------------------------------------------------------------
// Comparing engine output with the model
// ---------------------------------------------------------------------------------------

/// Short printable form of a key or value; full values can be 64 KiB.
fn show(bytes: &[u8]) -> String {
    let head: String = bytes
        .iter()
        .take(24)
        .map(|&b| {
            if b.is_ascii_graphic() && b != b'\\' {
                (b as char).to_string()
            } else {
                format!("\\x{b:02x}")
            }
        })
        .collect();
    if bytes.len() > 24 {
        format!("\"{head}…\" ({} bytes)", bytes.len())
    } else {
        format!("\"{head}\"")
    }
}

fn show_entry(entry: &Option<Entry>) -> String {
    match entry {
        None => "end".to_string(),
        Some((k, v)) => format!("{} => {}", show(k), show(v)),
    }
}

fn show_bound(bound: &Bound<Vec<u8>>) -> String {
    match bound {
        Bound::Included(k) => format!("Included({})", show(k)),
        Bound::Excluded(k) => format!("Excluded({})", show(k)),
        Bound::Unbounded => "Unbounded".to_string(),
    }
}

fn show_bounds((lo, hi): &(Bound<Vec<u8>>, Bound<Vec<u8>>)) -> String {
    format!("({}, {})", show_bound(lo), show_bound(hi))
}

fn show_value(value: &Option<Vec<u8>>) -> String {
    match value {
        None => "absent".to_string(),
        Some(v) => show(v),
    }
}

fn assert_value(what: &str, key: &[u8], got: Option<Vec<u8>>, want: Option<&Vec<u8>>) {
    if got.as_ref() != want {
        panic!(
            "{what} of {}: got {}, want {}",
            show(key),
            show_value(&got),
            show_value(&want.cloned())
        );
    }
}

fn resolve(key: &KeyRef, model: &Model) -> Vec<u8> {
    match key {
        KeyRef::New(k) => k.clone(),
        KeyRef::Existing(i) if !model.is_empty() => model
            .keys()
            .nth(i.index(model.len()))
            .expect("index < len")
            .clone(),
        // Nothing exists: any fixed key will do.
        KeyRef::Existing(_) => b"k\x00".to_vec(),
    }
}

fn resolve_bound(bound: &(BoundKind, KeyRef), model: &Model) -> Bound<Vec<u8>> {
    match bound.0 {
        BoundKind::Included => Bound::Included(resolve(&bound.1, model)),
        BoundKind::Excluded => Bound::Excluded(resolve(&bound.1, model)),
        BoundKind::Unbounded => Bound::Unbounded,
    }
}

fn bound_key(bound: &Bound<Vec<u8>>) -> Option<&Vec<u8>> {
    match bound {
        Bound::Included(k) | Bound::Excluded(k) => Some(k),
        Bound::Unbounded => None,
    }
}

/// Resolves random bounds to a range that is not inverted (start key <= end key): the
/// contract does not say what an inverted range does, so the model never asks. Equal
/// keys (empty ranges such as `(Excluded(a), Excluded(a))`) are kept and must be empty.
fn resolve_bounds(bounds: &Bounds, model: &Model) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    let mut lo = resolve_bound(&bounds.lo, model);
    let mut hi = resolve_bound(&bounds.hi, model);
    if let (Some(l), Some(h)) = (bound_key(&lo), bound_key(&hi)) {
        if l > h {
            let swap = |b: Bound<Vec<u8>>, k: Vec<u8>| match b {
                Bound::Included(_) => Bound::Included(k),
                Bound::Excluded(_) => Bound::Excluded(k),
                Bound::Unbounded => Bound::Unbounded,
            };
            let (l, h) = (l.clone(), h.clone());
            lo = swap(lo, h);
            hi = swap(hi, l);
        }
    }
    (lo, hi)
}

fn in_bounds(key: &[u8], (lo, hi): &(Bound<Vec<u8>>, Bound<Vec<u8>>)) -> bool {
    let above = match lo {
        Bound::Included(l) => key >= &l[..],
        Bound::Excluded(l) => key > &l[..],
        Bound::Unbounded => true,
    };
    let below = match hi {
        Bound::Included(h) => key <= &h[..],
        Bound::Excluded(h) => key < &h[..],
        Bound::Unbounded => true,
    };
    above && below
}

/// The model's answer for a range, computed by filtering (so equal-key exclusive bounds,
/// which `BTreeMap::range` rejects, simply give nothing).
fn model_range(model: &Model, bounds: &(Bound<Vec<u8>>, Bound<Vec<u8>>)) -> VecDeque<Entry> {
    model
        .iter()
        .filter(|(k, _)| in_bounds(k, bounds))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn model_prefix(model: &Model, prefix: &[u8]) -> VecDeque<Entry> {
    model
        .iter()
        .filter(|(k, _)| k.starts_with(prefix))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn prefix_of(key: &KeyRef, cut: &Index, model: &Model) -> Vec<u8> {
    let mut key = resolve(key, model);
    key.truncate(cut.index(key.len() + 1));
    key
}

fn item(what: &str, got: Option<tucana::Result<Entry>>) -> Option<Entry> {
    got.map(|r| r.unwrap_or_else(|e| panic!("{what}: iterator error: {e}")))
}

/// Consumes `it` as `dir` says and checks every item against `want`, in order.
fn drive(what: &str, it: Range, mut want: VecDeque<Entry>, dir: &Dir) {
    let check = |step: usize, side: &str, got: Option<Entry>, want: Option<Entry>| {
        if got != want {
            panic!(
                "{what}: step {step} ({side}): got {}, want {}",
                show_entry(&got),
                show_entry(&want)
            );
        }
        want.is_none()
    };
    match dir {
        Dir::Forward { limit } => {
            let mut it = it;
            for step in 0..limit.unwrap_or(usize::MAX) {
                if check(step, "next", item(what, it.next()), want.pop_front()) {
                    break;
                }
            }
        }
        Dir::Reverse { limit } => {
            let mut it = it.rev();
            for step in 0..limit.unwrap_or(usize::MAX) {
                if check(step, "rev", item(what, it.next()), want.pop_back()) {
                    break;
                }
            }
        }
        Dir::Mixed(pattern) => {
            let mut it = it;
            for (step, &back) in pattern.iter().cycle().enumerate() {
                let done = if back {
                    check(
                        step,
                        "next_back",
                        item(what, it.next_back()),
                        want.pop_back(),
                    )
                } else {
                    check(step, "next", item(what, it.next()), want.pop_front())
                };
                if done {
                    break;
                }
            }
        }
        Dir::Limited { items, pattern } => {
            let mut it = it.limit(*items);
            for (step, &back) in pattern.iter().cycle().enumerate() {
                let taken = step >= *items;
                let done = if back {
                    let want = if taken { None } else { want.pop_back() };
                    check(step, "limited next_back", item(what, it.next_back()), want)
                } else {
                    let want = if taken { None } else { want.pop_front() };
                    check(step, "limited next", item(what, it.next()), want)
                };
                if done {
                    break;
                }
            }
        }
    }
}

fn verify_keyspace(what: &str, ks: &Keyspace, model: &Model) {
    let want: VecDeque<Entry> = model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    drive(
        what,
        ks.range::<&[u8], _>(..),
        want,
        &Dir::Forward { limit: None },
    );
    assert_eq!(ks.len(), model.len() as u64, "{what}: len");
    assert_eq!(ks.is_empty(), model.is_empty(), "{what}: is_empty");
}

fn verify_snapshot(what: &str, snap: &Snapshot, model: &Model) {
    let want: VecDeque<Entry> = model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    drive(
        what,
        snap.range::<&[u8], _>(..),
        want,
        &Dir::Reverse { limit: None },
    );
}

// ---------------------------------------------------------------------------------------
// The harness
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Mode {
    /// No background commits or flushes: the test drives every commit and sync.
    Manual,
    /// Background commits and flushes on, at short intervals so they interleave with
    /// the operations of a case.
    Background,
    /// As `Manual`, on a volume over three member files (`Options::open_members`).
    Members,
    /// As `Manual` and as `Background`, with every put of an existing key deferred
    /// (`DeferredUpdates::Always`): applied to the index later, in batches.
    DeferredManual,
    DeferredBackground,
}

impl Mode {
    /// Member files of the case's volume.
    fn members(self) -> usize {
        match self {
            Mode::Members => 3,
            Mode::Manual | Mode::Background | Mode::DeferredManual | Mode::DeferredBackground => 1,
        }
    }
}

impl Mode {
    fn options(self) -> Options {
        match self {
            // Small log segments so values of up to 64 KiB also take the
            // "record larger than a segment" path.
            Mode::Manual | Mode::Members => Database::builder()
                .commit_interval(None)
                .flush_interval(None)
                .log_segment_bytes(64 * 1024),
            // The defaults, except that commits come often enough to happen within a
            // case of a few hundred operations (and not so often that fsyncs dominate).
            Mode::Background => Database::builder()
                .commit_interval(Some(Duration::from_millis(20)))
                .commit_dirty_bytes(256 * 1024),
            Mode::DeferredManual => Mode::Manual
                .options()
                .deferred_updates(DeferredUpdates::Always),
            Mode::DeferredBackground => Mode::Background
                .options()
                .deferred_updates(DeferredUpdates::Always),
        }
    }
}

struct Snap {
    ks: usize,
    snapshot: Snapshot,
    /// The keyspace's model when the snapshot was taken.
    model: Model,
}

struct Harness {
    mode: Mode,
    _dir: tempfile::TempDir,
    paths: Vec<PathBuf>,
    db: Option<Database>,
    keyspaces: Vec<Keyspace>,
    models: Vec<Model>,
    snapshots: Vec<Snap>,
    reopens: usize,
}

impl Harness {
    fn new(mode: Mode) -> Harness {
        let dir = tempfile::tempdir().expect("tempdir");
        let paths: Vec<PathBuf> = (0..mode.members())
            .map(|i| dir.path().join(format!("model.tucana.{i}")))
            .collect();
        let db = mode.options().open_members(&paths).expect("create volume");
        let keyspaces: Vec<Keyspace> = KEYSPACES
            .iter()
            .map(|name| db.keyspace(name).expect("create keyspace"))
            .collect();
        // Keyspaces are then durable whatever the case does next (even abandon right
        // after a sync), so every reopen can insist on `open_keyspace`.
        db.commit().expect("first commit");
        Harness {
            mode,
            _dir: dir,
            paths,
            db: Some(db),
            keyspaces,
            models: vec![Model::new(); KEYSPACES.len()],
            snapshots: Vec::new(),
            reopens: 0,
        }
    }

    fn db(&self) -> &Database {
        self.db.as_ref().expect("database open")
    }

    /// Checks every live snapshot against its model, then drops them all and every
    /// keyspace handle, and returns the database handle.
    fn release(&mut self) -> Database {
        for (i, snap) in self.snapshots.drain(..).enumerate() {
            verify_snapshot(
                &format!("snapshot {i} of {} before reopen", KEYSPACES[snap.ks]),
                &snap.snapshot,
                &snap.model,
            );
        }
        self.keyspaces.clear();
        self.db.take().expect("database open")
    }

    fn reopen_and_verify(&mut self, how: &str) {
        self.reopens += 1;
        let db = self
            .mode
            .options()
            .create_if_missing(false)
            .open_members(&self.paths)
            .unwrap_or_else(|e| panic!("reopen #{} after {how}: {e}", self.reopens));
        assert_eq!(
            db.keyspace_names(),
            KEYSPACES.to_vec(),
            "keyspace names after {how}"
        );
        self.keyspaces = KEYSPACES
            .iter()
            .map(|name| db.open_keyspace(name).expect("keyspace survives reopen"))
            .collect();
        for (i, ks) in self.keyspaces.iter().enumerate() {
            assert_eq!(ks.name(), KEYSPACES[i]);
            verify_keyspace(
                &format!("{} after {how}", KEYSPACES[i]),
                ks,
                &self.models[i],
            );
        }
        let report = db
            .check()
            .unwrap_or_else(|e| panic!("check after {how}: {e}"));
        assert_eq!(
            report.keyspaces,
            KEYSPACES.len() as u64,
            "check after {how}"
        );
        self.db = Some(db);
    }

    fn apply(&mut self, op: &Op) {
        match op {
            Op::Put {
                ks,
                key,
                val,
                durability,
            } => {
                let key = resolve(key, &self.models[*ks]);
                let value = val.bytes();
                self.keyspaces[*ks]
                    .put_with(&key, &value, *durability)
                    .unwrap_or_else(|e| panic!("put {}: {e}", show(&key)));
                self.models[*ks].insert(key, value);
            }
            Op::Delete {
                ks,
                key,
                durability,
            } => {
                let key = resolve(key, &self.models[*ks]);
                let was = self.keyspaces[*ks]
                    .delete_with(&key, *durability)
                    .unwrap_or_else(|e| panic!("delete {}: {e}", show(&key)));
                let want = self.models[*ks].remove(&key).is_some();
                assert_eq!(was, want, "delete {} reports presence", show(&key));
            }
            Op::Get { ks, key, in_place } => {
                let key = resolve(key, &self.models[*ks]);
                let ks_handle = &self.keyspaces[*ks];
                let got = if *in_place {
                    ks_handle.get_with(&key, |v| v.to_vec())
                } else {
                    ks_handle.get(&key)
                };
                let got = got.unwrap_or_else(|e| panic!("get {}: {e}", show(&key)));
                assert_value("get", &key, got, self.models[*ks].get(&key));
            }
            Op::Contains { ks, key } => {
                let key = resolve(key, &self.models[*ks]);
                let got = self.keyspaces[*ks].contains(&key).expect("contains");
                assert_eq!(
                    got,
                    self.models[*ks].contains_key(&key),
                    "contains {}",
                    show(&key)
                );
            }
            Op::Range { ks, bounds, dir } => {
                let model = &self.models[*ks];
                let bounds = resolve_bounds(bounds, model);
                let want = model_range(model, &bounds);
                let what = format!("range {} {dir:?}", show_bounds(&bounds));
                drive(&what, self.keyspaces[*ks].range(bounds), want, dir);
            }
            Op::Prefix { ks, key, cut, dir } => {
                let model = &self.models[*ks];
                let prefix = prefix_of(key, cut, model);
                let want = model_prefix(model, &prefix);
                let what = format!("prefix {} {dir:?}", show(&prefix));
                drive(&what, self.keyspaces[*ks].prefix(&prefix), want, dir);
            }
            Op::Batch {
                ks,
                writes,
                durability,
            } => {
                let mut batch = self.keyspaces[*ks].batch();
                // Resolve against the model as it changes, as the writes land in order.
                let mut after = self.models[*ks].clone();
                for (key, val) in writes {
                    let key = resolve(key, &after);
                    match val {
                        Some(val) => {
                            let value = val.bytes();
                            batch.put(&key, &value);
                            after.insert(key, value);
                        }
                        None => {
                            batch.delete(&key);
                            after.remove(&key);
                        }
                    }
                }
                assert_eq!(batch.len(), writes.len(), "batch len");
                assert!(!batch.is_empty());
                batch.commit_with(*durability).expect("batch commit");
                self.models[*ks] = after;
            }
            Op::TakeSnapshot { ks } => {
                if self.snapshots.len() == MAX_LIVE_SNAPSHOTS {
                    let oldest = self.snapshots.remove(0);
                    verify_snapshot("oldest snapshot", &oldest.snapshot, &oldest.model);
                }
                self.snapshots.push(Snap {
                    ks: *ks,
                    snapshot: self.keyspaces[*ks].snapshot().expect("snapshot"),
                    model: self.models[*ks].clone(),
                });
            }
            Op::ReadSnapshot { which, read } => {
                if self.snapshots.is_empty() {
                    return;
                }
                let snap = &self.snapshots[which.index(self.snapshots.len())];
                let (s, model) = (&snap.snapshot, &snap.model);
                match read {
                    SnapRead::Get(key) => {
                        let key = resolve(key, model);
                        let got = s.get(&key).expect("snapshot get");
                        assert_value("snapshot get", &key, got, model.get(&key));
                        let has = s.contains(&key).expect("snapshot contains");
                        assert_eq!(has, model.contains_key(&key), "snapshot contains");
                    }
                    SnapRead::Range(bounds, dir) => {
                        let bounds = resolve_bounds(bounds, model);
                        let want = model_range(model, &bounds);
                        let what = format!("snapshot range {} {dir:?}", show_bounds(&bounds));
                        drive(&what, s.range(bounds), want, dir);
                    }
                    SnapRead::Prefix(key, cut, dir) => {
                        let prefix = prefix_of(key, cut, model);
                        let want = model_prefix(model, &prefix);
                        let what = format!("snapshot prefix {} {dir:?}", show(&prefix));
                        drive(&what, s.prefix(&prefix), want, dir);
                    }
                    SnapRead::Full => verify_snapshot("snapshot", s, model),
                }
            }
            Op::Verify { ks } => {
                verify_keyspace(KEYSPACES[*ks], &self.keyspaces[*ks], &self.models[*ks]);
            }
            Op::Commit => self.db().commit().expect("commit"),
            Op::Sync => self.db().sync().expect("sync"),
            Op::Reopen => {
                self.release().close().expect("close");
                self.reopen_and_verify("close");
            }
            Op::AbandonAfterSync => {
                // Only right after a completed sync, so nothing acknowledged may be
                // missing and the expected state is exact.
                self.db().sync().expect("sync before abandon");
                self.release().abandon();
                self.reopen_and_verify("sync + abandon");
            }
        }
    }

    /// End of a case: everything agrees, the volume checks, and a final commit + check
    /// sees exactly the model's keys; then close cleanly.
    fn finish(mut self) {
        for (i, ks) in self.keyspaces.iter().enumerate() {
            verify_keyspace(&format!("{} at end", KEYSPACES[i]), ks, &self.models[i]);
        }
        let live_keys: u64 = self.models.iter().map(|m| m.len() as u64).sum();
        let db = self.release();
        db.commit().expect("final commit");
        let report = db.check().expect("final check");
        assert_eq!(report.keyspaces, KEYSPACES.len() as u64, "check: keyspaces");
        assert_eq!(report.keys, live_keys, "check: live keys after a commit");
        assert_eq!(db.stats().keys, live_keys, "stats: live keys");
        db.close().expect("final close");
    }
}

fn run(mode: Mode, ops: &[Op]) {
    let mut h = Harness::new(mode);
    for op in ops {
        h.apply(op);
    }
    h.finish();
}

fn config(default_cases: u32) -> Config {
    let cases = std::env::var("TUCANA_MODEL_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_cases);
    Config {
        cases,
        // Each case opens real files; bound the time a failure spends shrinking.
        max_shrink_iters: 2048,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..Config::default()
    }
}

proptest! {
    #![proptest_config(config(64))]

    /// The engine agrees with the model when the test drives every commit and sync
    /// (no background threads), across close/reopen and sync + abandon.
    #[test]
    fn model_with_explicit_commits(ops in ops_strategy()) {
        run(Mode::Manual, &ops);
    }
}

proptest! {
    #![proptest_config(config(24))]

    /// The same with background commits and flushes interleaving with the operations:
    /// a commit must never change what reads, ranges or snapshots return.
    #[test]
    fn model_with_background_commits(ops in ops_strategy()) {
        run(Mode::Background, &ops);
    }
}

proptest! {
    #![proptest_config(config(16))]

    /// The same as the first, on a volume over three member files: routing, growth onto
    /// members and reopening must not change what any operation returns.
    #[test]
    fn model_over_three_members(ops in ops_strategy()) {
        run(Mode::Members, &ops);
    }
}

proptest! {
    #![proptest_config(config(32))]

    /// The first with puts of existing keys deferred: a put the index has not taken yet
    /// must still be what every read, range, snapshot, commit and reopen sees.
    #[test]
    fn model_with_deferred_updates(ops in ops_strategy()) {
        run(Mode::DeferredManual, &ops);
    }
}

proptest! {
    #![proptest_config(config(16))]

    /// The same with background commits applying deferred puts while the case writes.
    #[test]
    fn model_with_deferred_updates_and_background_commits(ops in ops_strategy()) {
        run(Mode::DeferredBackground, &ops);
    }
}
