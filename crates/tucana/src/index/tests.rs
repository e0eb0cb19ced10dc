//! Tests of the index against a `BTreeMap` model, with a fake `Ctx`: keys in a vector
//! (log pointer = index + 1) and node images in a map.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use super::*;
use crate::error::Error;
use crate::types::{RegionId, TreeEpoch};

const REGION: RegionId = RegionId(7);

#[derive(Default)]
struct FakeCtx {
    keys: Vec<Vec<u8>>,
    images: HashMap<u64, Box<[u8; NODE_BYTES]>>,
    next_block: u64,
    /// Keys read through `key_cmp`/`key_into` (log reads, for a real region).
    key_reads: AtomicU64,
}

impl FakeCtx {
    /// Appends a "log record" for `key`; returns its pointer.
    fn add(&mut self, key: &[u8]) -> u64 {
        self.keys.push(key.to_vec());
        self.keys.len() as u64
    }

    fn key(&self, ptr: u64) -> &[u8] {
        &self.keys[(ptr - 1) as usize]
    }

    /// Persists `sealed` into `images`; returns the root offset and the number of images.
    fn persist(&mut self, tree: &Tree, sealed: Sealed) -> (DiskOffset, usize) {
        let mut next = self.next_block.max(2);
        let mut out = Vec::new();
        let root = tree
            .persist(
                sealed.root,
                REGION,
                &mut || {
                    next += 1;
                    Ok(DiskOffset(next * 4096))
                },
                &mut out,
            )
            .unwrap();
        self.next_block = next;
        let n = out.len();
        for (off, img) in out {
            assert!(self.images.insert(off.0, img).is_none(), "block reused");
        }
        (root, n)
    }
}

impl Ctx for FakeCtx {
    fn key_cmp(&self, ptr: u64, key: &[u8]) -> Result<std::cmp::Ordering> {
        self.key_reads.fetch_add(1, Relaxed);
        Ok(self.key(ptr).cmp(key))
    }

    fn key_into(&self, ptr: u64, out: &mut Vec<u8>) -> Result<()> {
        self.key_reads.fetch_add(1, Relaxed);
        out.clear();
        out.extend_from_slice(self.key(ptr));
        Ok(())
    }

    fn with_node<R>(&self, off: DiskOffset, f: impl FnOnce(&[u8]) -> Result<R>) -> Result<R> {
        match self.images.get(&off.0) {
            Some(img) => f(&img[..]),
            None => Err(Error::corruption("index node", off, "no such block")),
        }
    }
}

type Model = BTreeMap<Vec<u8>, u64>;

fn put(tree: &Tree, ctx: &mut FakeCtx, model: &mut Model, key: &[u8]) {
    let ptr = ctx.add(key);
    let old = tree.insert(ctx, key, ptr).unwrap();
    assert_eq!(old, model.insert(key.to_vec(), ptr), "insert {key:?}");
}

fn del(tree: &Tree, ctx: &FakeCtx, model: &mut Model, key: &[u8]) {
    let old = tree.remove(ctx, key).unwrap();
    assert_eq!(old, model.remove(key), "remove {key:?}");
}

fn get(tree: &Tree, ctx: &FakeCtx, root: Option<u64>, key: &[u8]) -> Option<u64> {
    let guard = crossbeam_epoch::pin();
    tree.get(ctx, root, key, &guard).unwrap()
}

/// Keys `>= from` in order, by walking leaves forward; checks every leaf against its fences.
fn scan_forward(
    tree: &Tree,
    ctx: &FakeCtx,
    root: Option<u64>,
    from: Option<&[u8]>,
) -> Vec<(Vec<u8>, u64)> {
    let guard = crossbeam_epoch::pin();
    let mut out = LeafCopy::default();
    let mut items = Vec::new();
    let mut seek_key: Option<Vec<u8>> = from.map(|k| k.to_vec());
    let mut leaves = 0;
    loop {
        let seek = match &seek_key {
            None => Seek::First,
            Some(k) => Seek::AtOrAfter(k),
        };
        tree.copy_leaf(ctx, root, seek, &guard, &mut out).unwrap();
        leaves += 1;
        assert!(leaves < 1_000_000, "forward walk does not end");
        check_fences(ctx, &out);
        if let (Some(k), Some(low)) = (&seek_key, &out.low) {
            assert!(low <= k, "AtOrAfter landed right of its key");
        }
        // A leaf may also hold keys below the seek key: the fence it was reached by can
        // vanish when an emptied leaf leaves the tree and a neighbour takes its range.
        for &p in &out.ptrs {
            let k = ctx.key(p);
            if seek_key.as_deref().is_none_or(|f| k >= f) {
                items.push((k.to_vec(), p));
            }
        }
        match out.high.clone() {
            None => return items,
            Some(h) => {
                if let Some(k) = &seek_key {
                    assert!(&h > k, "forward walk does not advance");
                }
                seek_key = Some(h);
            }
        }
    }
}

/// Keys `< before` in descending order, by walking leaves backward.
fn scan_backward(
    tree: &Tree,
    ctx: &FakeCtx,
    root: Option<u64>,
    before: Option<&[u8]>,
) -> Vec<(Vec<u8>, u64)> {
    let guard = crossbeam_epoch::pin();
    let mut out = LeafCopy::default();
    let mut items = Vec::new();
    let mut seek_key: Option<Vec<u8>> = before.map(|k| k.to_vec());
    let mut leaves = 0;
    loop {
        let seek = match &seek_key {
            None => Seek::Last,
            Some(k) => Seek::Before(k),
        };
        tree.copy_leaf(ctx, root, seek, &guard, &mut out).unwrap();
        leaves += 1;
        assert!(leaves < 1_000_000, "backward walk does not end");
        check_fences(ctx, &out);
        if let Some(k) = &seek_key {
            assert!(
                out.low.as_ref().is_none_or(|l| l < k),
                "Before landed at or right of its key"
            );
        }
        // As in `scan_forward`: skip keys at or above the seek key.
        for &p in out.ptrs.iter().rev() {
            let k = ctx.key(p);
            if seek_key.as_deref().is_none_or(|b| k < b) {
                items.push((k.to_vec(), p));
            }
        }
        match out.low.clone() {
            None => return items,
            Some(l) => seek_key = Some(l),
        }
    }
}

fn check_fences(ctx: &FakeCtx, out: &LeafCopy) {
    for w in out.ptrs.windows(2) {
        assert!(ctx.key(w[0]) < ctx.key(w[1]), "leaf not sorted");
    }
    for &p in &out.ptrs {
        let k = ctx.key(p);
        assert!(
            out.low.as_deref().is_none_or(|l| l <= k),
            "key below low fence"
        );
        assert!(
            out.high.as_deref().is_none_or(|h| k < h),
            "key at or above high fence"
        );
    }
    if let (Some(l), Some(h)) = (&out.low, &out.high) {
        assert!(l < h, "empty fence range");
    }
}

/// Everything the tree at `root` answers equals the model: point gets, both full walks,
/// partial walks from a few keys, and the structural check.
fn assert_matches(tree: &Tree, ctx: &FakeCtx, root: Option<u64>, model: &Model, rng: &mut StdRng) {
    for (k, &p) in model {
        assert_eq!(get(tree, ctx, root, k), Some(p), "get {k:?}");
    }
    let all: Vec<(Vec<u8>, u64)> = model.iter().map(|(k, &p)| (k.clone(), p)).collect();
    assert_eq!(scan_forward(tree, ctx, root, None), all);
    let mut rev = all.clone();
    rev.reverse();
    assert_eq!(scan_backward(tree, ctx, root, None), rev);
    let keys: Vec<&Vec<u8>> = model.keys().collect();
    for _ in 0..5 {
        let probe: Vec<u8> = if !keys.is_empty() && rng.random_bool(0.5) {
            keys[rng.random_range(0..keys.len())].clone()
        } else {
            random_key(rng, 12)
        };
        let fwd: Vec<_> = model
            .range(probe.clone()..)
            .map(|(k, &p)| (k.clone(), p))
            .collect();
        assert_eq!(scan_forward(tree, ctx, root, Some(&probe)), fwd);
        let bwd: Vec<_> = model
            .range(..probe.clone())
            .rev()
            .map(|(k, &p)| (k.clone(), p))
            .collect();
        assert_eq!(scan_backward(tree, ctx, root, Some(&probe)), bwd);
        if !model.contains_key(&probe) {
            assert_eq!(get(tree, ctx, root, &probe), None);
        }
    }
    let report = tree
        .check(ctx, root.unwrap_or_else(|| tree.root_word()))
        .unwrap();
    assert_eq!(report.keys, model.len() as u64);
}

fn random_key(rng: &mut StdRng, max_len: usize) -> Vec<u8> {
    let len = rng.random_range(0..=max_len);
    // A small alphabet makes shared prefixes and prefix ties common.
    (0..len).map(|_| b"ab\0z"[rng.random_range(0..4)]).collect()
}

#[test]
fn empty_tree_answers_nothing() {
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    assert_eq!(tree.root_word(), 0);
    assert_eq!(get(&tree, &ctx, None, b"a"), None);
    assert_eq!(tree.remove(&ctx, b"a").unwrap(), None);
    let guard = crossbeam_epoch::pin();
    let mut out = LeafCopy {
        ptrs: vec![1, 2],
        prefixes: vec![1, 2],
        stem: vec![7],
        low: Some(vec![1]),
        high: Some(vec![2]),
        cut: true,
    };
    tree.copy_leaf(&ctx, None, Seek::First, &guard, &mut out)
        .unwrap();
    assert_eq!(out, LeafCopy::default());
    let sealed = tree.seal();
    assert_eq!(
        sealed,
        Sealed {
            root: 0,
            epoch: TreeEpoch(1)
        }
    );
    assert_eq!(ctx.persist(&tree, sealed), (DiskOffset::NONE, 0));
    assert_eq!(tree.check(&ctx, 0).unwrap(), TreeCheck::default());
    assert_eq!(tree.heap_nodes(), 0);
}

#[test]
fn replace_returns_the_old_pointer() {
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let p1 = ctx.add(b"key");
    let p2 = ctx.add(b"key");
    assert_eq!(tree.insert(&ctx, b"key", p1).unwrap(), None);
    assert_eq!(tree.insert(&ctx, b"key", p2).unwrap(), Some(p1));
    assert_eq!(get(&tree, &ctx, None, b"key"), Some(p2));
    assert_eq!(tree.remove(&ctx, b"key").unwrap(), Some(p2));
    assert_eq!(tree.remove(&ctx, b"key").unwrap(), None);
    assert_eq!(get(&tree, &ctx, None, b"key"), None);
}

#[test]
fn random_operations_match_a_btreemap_to_height_three() {
    let mut rng = StdRng::seed_from_u64(0x7ca11a);
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    let mut inserted: Vec<Vec<u8>> = Vec::new();
    for round in 0..60_000u32 {
        let key = if rng.random_bool(0.8) {
            let mut k = rng.random::<u64>().to_be_bytes().to_vec();
            k.truncate(rng.random_range(1..=8));
            k.extend((0..rng.random_range(0..8)).map(|_| rng.random::<u8>()));
            k
        } else {
            random_key(&mut rng, 12)
        };
        if rng.random_bool(0.15) && !model.is_empty() {
            // Remove an existing key half of the time, a random one otherwise.
            let victim = if rng.random_bool(0.5) {
                inserted[rng.random_range(0..inserted.len())].clone()
            } else {
                key
            };
            del(&tree, &ctx, &mut model, &victim);
        } else {
            put(&tree, &mut ctx, &mut model, &key);
            inserted.push(key);
        }
        if round % 20_000 == 19_999 {
            assert_matches(&tree, &ctx, None, &model, &mut rng);
        }
    }
    assert_matches(&tree, &ctx, None, &model, &mut rng);
    let report = tree.check(&ctx, tree.root_word()).unwrap();
    assert!(report.height >= 3, "height {}", report.height);
    assert_eq!(report.heap_nodes, tree.heap_nodes());
    // The index stays within 32 bytes per key at the fill random inserts leave.
    let bytes_per_key = tree.heap_nodes() as f64 * NODE_BYTES as f64 / model.len() as f64;
    assert!(bytes_per_key <= 32.0, "{bytes_per_key} bytes per key");
}

#[test]
fn keys_sharing_long_prefixes() {
    let mut rng = StdRng::seed_from_u64(2);
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    // Every key starts with the same 8 bytes (all prefixes tie), zero bytes at the end of
    // short keys (prefix padding), and a few keys that are prefixes of others.
    for i in 0..6000u32 {
        let mut k = b"commonpr".to_vec();
        match i % 4 {
            0 => k.extend_from_slice(&rng.random::<u32>().to_be_bytes()),
            1 => k.extend(std::iter::repeat_n(0u8, rng.random_range(0..4))),
            2 => k.truncate(rng.random_range(0..9)),
            _ => k.extend_from_slice(format!("{:06}", rng.random_range(0..100_000)).as_bytes()),
        }
        put(&tree, &mut ctx, &mut model, &k);
    }
    for _ in 0..1500 {
        let nth = rng.random_range(0..model.len());
        let k = model.keys().nth(nth).cloned().unwrap();
        del(&tree, &ctx, &mut model, &k);
    }
    assert_matches(&tree, &ctx, None, &model, &mut rng);
}

#[test]
fn long_separators_go_inline_then_external() {
    // 200-byte shared prefix: separators of ~201 bytes, inline, so the key area (not the
    // pivot count) fills internal nodes. 300-byte prefix: separators longer than
    // MAX_INLINE_PIVOT, so pivots are EXTERNAL (full keys compared through the log).
    for (shared, n) in [(200usize, 4000u32), (300, 30_000)] {
        let mut rng = StdRng::seed_from_u64(shared as u64);
        let tree = Tree::new(REGION, TreeEpoch(1));
        let mut ctx = FakeCtx::default();
        let mut model = Model::new();
        let stem: Vec<u8> = (0..shared).map(|i| (i % 251) as u8).collect();
        for _ in 0..n {
            let mut k = stem.clone();
            k.extend_from_slice(&rng.random::<u64>().to_be_bytes());
            put(&tree, &mut ctx, &mut model, &k);
        }
        assert_matches(&tree, &ctx, None, &model, &mut rng);
        let report = tree.check(&ctx, tree.root_word()).unwrap();
        assert!(
            report.height >= 3,
            "shared {shared}: height {}",
            report.height
        );
        if shared > MAX_INLINE_PIVOT {
            assert_eq!(report.external_pivots, report.pivots);
        } else {
            assert_eq!(report.external_pivots, 0);
        }
        // Round trip through disk images as well.
        let sealed = tree.seal();
        let (root, _) = ctx.persist(&tree, sealed);
        let disk = Tree::from_disk(REGION, root, TreeEpoch(2));
        assert_matches(&disk, &ctx, None, &model, &mut rng);
    }
}

#[test]
fn keys_from_empty_to_64_kib() {
    let mut rng = StdRng::seed_from_u64(3);
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    put(&tree, &mut ctx, &mut model, b"");
    put(
        &tree,
        &mut ctx,
        &mut model,
        &vec![0xffu8; crate::types::MAX_KEY_BYTES],
    );
    for i in 0..1500u32 {
        let len = match i % 10 {
            0 => rng.random_range(4096..=crate::types::MAX_KEY_BYTES),
            1..=3 => rng.random_range(256..1024),
            _ => rng.random_range(0..40),
        };
        // Long runs of one byte make long shared prefixes between neighbours.
        let fill = [0u8, b'x', 0xff][rng.random_range(0..3)];
        let mut k = vec![fill; len];
        if len > 0 {
            let at = rng.random_range(0..len);
            k[at] = rng.random();
        }
        put(&tree, &mut ctx, &mut model, &k);
    }
    assert_matches(&tree, &ctx, None, &model, &mut rng);
    let sealed = tree.seal();
    let (root, _) = ctx.persist(&tree, sealed);
    let disk = Tree::from_disk(REGION, root, TreeEpoch(2));
    assert_matches(&disk, &ctx, None, &model, &mut rng);
}

#[test]
fn sequential_loads_fill_leaves() {
    let mut rng = StdRng::seed_from_u64(11);
    for descending in [false, true] {
        let tree = Tree::new(REGION, TreeEpoch(1));
        let mut ctx = FakeCtx::default();
        let mut model = Model::new();
        let n = 50_000u32;
        for i in 0..n {
            let i = if descending { n - 1 - i } else { i };
            put(
                &tree,
                &mut ctx,
                &mut model,
                format!("user{i:08}").as_bytes(),
            );
        }
        assert_matches(&tree, &ctx, None, &model, &mut rng);
        let bytes_per_key = tree.heap_nodes() as f64 * NODE_BYTES as f64 / n as f64;
        assert!(
            bytes_per_key <= 24.0,
            "descending {descending}: {bytes_per_key} bytes per key"
        );
    }
}

#[test]
fn removing_everything_prunes_empty_leaves_and_empties_the_tree() {
    let mut rng = StdRng::seed_from_u64(4);
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    for i in 0..5000u32 {
        put(&tree, &mut ctx, &mut model, format!("k{i:05}").as_bytes());
    }
    let leaves_full = tree.check(&ctx, tree.root_word()).unwrap().leaves;
    // Empty a band in the middle: its leaves leave the tree, the rest still reads right.
    for i in 1000..3000u32 {
        del(&tree, &ctx, &mut model, format!("k{i:05}").as_bytes());
    }
    assert_matches(&tree, &ctx, None, &model, &mut rng);
    let report = tree.check(&ctx, tree.root_word()).unwrap();
    assert!(
        report.leaves < leaves_full * 3 / 4,
        "{} of {leaves_full} leaves left after emptying 40% of the keys",
        report.leaves
    );
    // Writes into the emptied band land in a neighbour.
    for i in (1000..3000u32).step_by(50) {
        put(&tree, &mut ctx, &mut model, format!("k{i:05}").as_bytes());
    }
    assert_matches(&tree, &ctx, None, &model, &mut rng);
    let mut keys: Vec<Vec<u8>> = model.keys().cloned().collect();
    keys.shuffle(&mut rng);
    for k in keys {
        del(&tree, &ctx, &mut model, &k);
    }
    assert_matches(&tree, &ctx, None, &model, &mut rng);
    assert_eq!(tree.root_word(), 0, "an empty tree has no root");
    // Every node is retired; with no snapshot and no commit behind, all are freed.
    tree.reclaim(TreeEpoch(u64::MAX), None);
    assert_eq!(tree.heap_nodes(), 0);
    put(&tree, &mut ctx, &mut model, b"again");
    assert_matches(&tree, &ctx, None, &model, &mut rng);
}

#[test]
fn pruning_keeps_sealed_and_persisted_versions_intact() {
    let mut rng = StdRng::seed_from_u64(5);
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    for i in 0..3000u32 {
        put(&tree, &mut ctx, &mut model, format!("k{i:05}").as_bytes());
    }
    let sealed = tree.seal();
    let (root, _) = ctx.persist(&tree, sealed);
    let before = model.clone();
    for i in 500..2500u32 {
        del(&tree, &ctx, &mut model, format!("k{i:05}").as_bytes());
    }
    // The sealed root and its disk copy still hold every key.
    assert_matches(&tree, &ctx, Some(sealed.root), &before, &mut rng);
    let disk = Tree::from_disk(REGION, root, TreeEpoch(100));
    assert_matches(&disk, &ctx, None, &before, &mut rng);
    assert_matches(&tree, &ctx, None, &model, &mut rng);
    // Persisting the pruned tree gives a valid tree of the remaining keys.
    let (root2, _) = ctx.persist(&tree, tree.seal());
    let disk2 = Tree::from_disk(REGION, root2, TreeEpoch(100));
    assert_matches(&disk2, &ctx, None, &model, &mut rng);
    assert_eq!(disk2.check(&ctx, disk2.root_word()).unwrap().keys, 1000);
}

#[test]
fn readers_never_miss_a_key_while_the_writer_prunes_empty_leaves() {
    const BANDS: usize = 40;
    const BAND_KEYS: usize = 600;
    let stable: Vec<Vec<u8>> = (0..=BANDS)
        .map(|b| format!("k{b:03}s").into_bytes())
        .collect();
    let band_key = |b: usize, i: usize| format!("k{b:03}v{i:04}").into_bytes();
    let mut ctx = FakeCtx::default();
    let stable_ptrs: Vec<u64> = stable.iter().map(|k| ctx.add(k)).collect();
    let band_ptrs: Vec<Vec<u64>> = (0..BANDS)
        .map(|b| (0..BAND_KEYS).map(|i| ctx.add(&band_key(b, i))).collect())
        .collect();
    let tree = Tree::new(REGION, TreeEpoch(1));
    for (k, p) in stable.iter().zip(&stable_ptrs) {
        tree.insert(&ctx, k, *p).unwrap();
    }
    let done = AtomicBool::new(false);
    let (ctx, tree, stable, stable_ptrs) = (&ctx, &tree, &stable, &stable_ptrs);
    std::thread::scope(|s| {
        for r in 0..2u64 {
            let done = &done;
            s.spawn(move || {
                let mut rng = StdRng::seed_from_u64(200 + r);
                while !done.load(Acquire) {
                    let guard = crossbeam_epoch::pin();
                    for _ in 0..500 {
                        let i = rng.random_range(0..stable.len());
                        let got = tree.get(ctx, None, &stable[i], &guard).unwrap();
                        assert_eq!(got, Some(stable_ptrs[i]), "stable key {i} missed");
                    }
                    drop(guard);
                    let fwd: Vec<Vec<u8>> = scan_forward(tree, ctx, None, None)
                        .into_iter()
                        .map(|(k, _)| k)
                        .collect();
                    assert!(
                        fwd.windows(2).all(|w| w[0] < w[1]),
                        "forward walk not sorted"
                    );
                    let found = fwd.iter().filter(|k| k.ends_with(b"s")).count();
                    assert_eq!(found, stable.len(), "a forward walk missed a stable key");
                    let bwd: Vec<Vec<u8>> = scan_backward(tree, ctx, None, None)
                        .into_iter()
                        .map(|(k, _)| k)
                        .collect();
                    assert!(
                        bwd.windows(2).all(|w| w[0] > w[1]),
                        "backward walk not sorted"
                    );
                    let found = bwd.iter().filter(|k| k.ends_with(b"s")).count();
                    assert_eq!(found, stable.len(), "a backward walk missed a stable key");
                }
            });
        }
        let mut rng = StdRng::seed_from_u64(7);
        for round in 0..6 {
            // Fill every band (splits), then empty them in random order (prunes).
            for (b, ptrs) in band_ptrs.iter().enumerate() {
                for (i, p) in ptrs.iter().enumerate() {
                    tree.insert(ctx, &band_key(b, i), *p).unwrap();
                }
            }
            let mut order: Vec<usize> = (0..BANDS).collect();
            order.shuffle(&mut rng);
            for b in order {
                for i in 0..BAND_KEYS {
                    assert!(tree.remove(ctx, &band_key(b, i)).unwrap().is_some());
                }
            }
            if round % 2 == 1 {
                tree.seal();
            }
            tree.reclaim(TreeEpoch(u64::MAX), None);
        }
        done.store(true, Release);
    });
    let report = tree.check(ctx, tree.root_word()).unwrap();
    assert_eq!(report.keys as usize, stable.len());
    assert!(report.leaves <= stable.len() as u64, "{report:?}");
}

#[test]
fn a_sealed_root_keeps_reading_the_old_state() {
    let mut rng = StdRng::seed_from_u64(5);
    let tree = Tree::new(REGION, TreeEpoch(10));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    for _ in 0..20_000 {
        let k = random_key(&mut rng, 10);
        put(&tree, &mut ctx, &mut model, &k);
    }
    assert!(tree.dirty_nodes() >= tree.heap_nodes());
    let sealed = tree.seal();
    assert_eq!(sealed.epoch, TreeEpoch(10));
    assert_eq!(tree.running_epoch(), TreeEpoch(11));
    assert_eq!(tree.dirty_nodes(), 0);
    let old = model.clone();
    let nodes_before = tree.heap_nodes();
    // One replace copies its path, root to leaf: what the next commit would write.
    let (k, _) = model.iter().next().map(|(k, v)| (k.clone(), *v)).unwrap();
    put(&tree, &mut ctx, &mut model, &k);
    let height = tree.heap_nodes() - nodes_before;
    assert!(height >= 2, "{height}");
    assert_eq!(tree.dirty_nodes(), height);
    // Replace, remove and insert on top: every changed node is copied, not changed.
    for _ in 0..5000 {
        let k = random_key(&mut rng, 10);
        if rng.random_bool(0.3) {
            del(&tree, &ctx, &mut model, &k);
        } else {
            put(&tree, &mut ctx, &mut model, &k);
        }
    }
    assert!(tree.heap_nodes() > nodes_before);
    assert_matches(&tree, &ctx, Some(sealed.root), &old, &mut rng);
    assert_matches(&tree, &ctx, None, &model, &mut rng);
    // A second seal: both older roots still read their states.
    let sealed2 = tree.seal();
    let mid = model.clone();
    for _ in 0..2000 {
        let k = random_key(&mut rng, 10);
        put(&tree, &mut ctx, &mut model, &k);
    }
    assert_matches(&tree, &ctx, Some(sealed.root), &old, &mut rng);
    assert_matches(&tree, &ctx, Some(sealed2.root), &mid, &mut rng);
    assert_matches(&tree, &ctx, None, &model, &mut rng);
}

#[test]
fn persist_and_reopen_then_write_on_top_and_persist_again() {
    let mut rng = StdRng::seed_from_u64(6);
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    for _ in 0..30_000 {
        let k = rng.random::<u64>().to_be_bytes();
        put(&tree, &mut ctx, &mut model, &k);
    }
    let sealed = tree.seal();
    let (root1, written1) = ctx.persist(&tree, sealed);
    assert_eq!(written1 as u64, tree.heap_nodes());
    // Persisting the same sealed root again writes nothing new.
    assert_eq!(ctx.persist(&tree, sealed), (root1, 0));
    drop(tree);

    let disk = Tree::from_disk(REGION, root1, TreeEpoch(2));
    assert_eq!(disk.heap_nodes(), 0);
    assert_matches(&disk, &ctx, None, &model, &mut rng);
    let report = disk.check(&ctx, disk.root_word()).unwrap();
    assert_eq!(report.disk_nodes as usize, written1);
    let model1 = model.clone();

    // Writes on top copy the touched disk nodes into memory.
    for _ in 0..300 {
        let k = rng.random::<u64>().to_be_bytes();
        put(&disk, &mut ctx, &mut model, &k);
        let nth = rng.random_range(0..model.len());
        let victim = model.keys().nth(nth).cloned().unwrap();
        del(&disk, &ctx, &mut model, &victim);
    }
    let replaced = model.keys().next().cloned().unwrap();
    put(&disk, &mut ctx, &mut model, &replaced);
    assert!(disk.heap_nodes() > 0);
    assert_matches(&disk, &ctx, None, &model, &mut rng);
    let freed = disk.retired_disk_blocks(TreeEpoch(2));
    // Each copied disk node is retired; splits add heap nodes that replace nothing.
    assert!(!freed.is_empty() && freed.len() as u64 <= disk.heap_nodes());
    assert!(freed.iter().all(|b| ctx.images.contains_key(&b.0)));

    let sealed2 = disk.seal();
    let (root2, written2) = ctx.persist(&disk, sealed2);
    assert_eq!(
        written2 as u64,
        disk.heap_nodes(),
        "only copied nodes are written"
    );
    assert!(written2 < written1);
    let disk2 = Tree::from_disk(REGION, root2, TreeEpoch(3));
    assert_matches(&disk2, &ctx, None, &model, &mut rng);
    // The first commit's images are untouched: its root still reads the old state.
    let again = Tree::from_disk(REGION, root1, TreeEpoch(3));
    assert_matches(&again, &ctx, None, &model1, &mut rng);
    // And the in-memory tree reads the same through its sealed heap root.
    assert_matches(&disk, &ctx, Some(sealed2.root), &model, &mut rng);
}

#[test]
fn corrupt_images_are_errors_not_panics() {
    let mut rng = StdRng::seed_from_u64(7);
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    for _ in 0..20_000 {
        let k = rng.random::<u64>().to_be_bytes();
        put(&tree, &mut ctx, &mut model, &k);
    }
    let sealed = tree.seal();
    let (root, _) = ctx.persist(&tree, sealed);
    let clean = ctx.images.clone();
    let offsets: Vec<u64> = clean.keys().copied().collect();
    let probe: Vec<Vec<u8>> = model.keys().step_by(97).cloned().collect();
    let mut total_errors = 0;
    for round in 0..60 {
        ctx.images = clean.clone();
        let off = offsets[rng.random_range(0..offsets.len())];
        let what = round % 3;
        match what {
            0 => {
                let bit = rng.random_range(0..NODE_BYTES * 8);
                ctx.images.get_mut(&off).unwrap()[bit / 8] ^= 1 << (bit % 8);
            }
            // A misdirected write: another node's (valid) image at this block.
            1 => {
                let other = offsets.iter().find(|&&o| o != off).copied().unwrap();
                let img = clean[&other].clone();
                ctx.images.insert(off, img);
            }
            _ => {
                ctx.images.insert(off, Box::new([0u8; NODE_BYTES]));
            }
        }
        let bad_ctx = &ctx;
        let disk = Tree::from_disk(REGION, root, TreeEpoch(2));
        let mut errors = 0;
        for k in &probe {
            match disk.get(bad_ctx, None, k, &crossbeam_epoch::pin()) {
                Ok(found) => {
                    assert_eq!(found, model.get(k).copied(), "wrong answer, round {round}")
                }
                Err(Error::Corruption { offset, .. }) => {
                    assert_eq!(offset.0, off);
                    errors += 1;
                }
                Err(e) => panic!("unexpected error {e}"),
            }
        }
        // Every key written through the damaged node fails to copy it on write.
        for k in &probe {
            let ptr = model[k];
            match disk.insert(bad_ctx, k, ptr) {
                Ok(old) => assert_eq!(old, Some(ptr)),
                Err(Error::Corruption { offset, .. }) => {
                    assert_eq!(offset.0, off);
                    errors += 1;
                }
                Err(e) => panic!("unexpected error {e}"),
            }
        }
        let checked = disk.check(bad_ctx, disk.root_word());
        assert!(
            matches!(checked, Err(Error::Corruption { .. })),
            "check missed round {round}"
        );
        // The root is on every path; a leaf is on the path of ~1/100 of the probes.
        if off == root.0 {
            assert_eq!(errors, 2 * probe.len());
        }
        total_errors += errors;
    }
    assert!(total_errors > 0);
}

/// A tree of 10,000 random keys in epoch 1, sealed and persisted, whose every key was
/// then written again in epoch 2, so that every persisted node was copied and retired.
struct Replaced {
    rng: StdRng,
    tree: Tree,
    ctx: FakeCtx,
    model: Model,
    /// Heap nodes after epoch 1.
    live_before: u64,
    sealed: Sealed,
    /// Nodes the persist of epoch 1 wrote.
    written: usize,
}

fn every_node_replaced(seed: u64) -> Replaced {
    let mut rng = StdRng::seed_from_u64(seed);
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    for _ in 0..10_000 {
        let k = rng.random::<u64>().to_be_bytes();
        put(&tree, &mut ctx, &mut model, &k);
    }
    let live_before = tree.heap_nodes();
    let sealed = tree.seal();
    let (_, written) = ctx.persist(&tree, sealed);
    let keys: Vec<Vec<u8>> = model.keys().cloned().collect();
    for k in &keys {
        put(&tree, &mut ctx, &mut model, k);
    }
    Replaced {
        rng,
        tree,
        ctx,
        model,
        live_before,
        sealed,
        written,
    }
}

#[test]
fn reclaim_frees_retired_nodes_when_no_one_can_see_them() {
    let Replaced {
        mut rng,
        tree,
        ctx,
        model,
        live_before,
        written,
        ..
    } = every_node_replaced(8);
    assert_eq!(tree.heap_nodes(), 2 * live_before);
    assert_eq!(tree.retired_disk_blocks(TreeEpoch(2)).len(), written);
    assert!(tree.retired_disk_blocks(TreeEpoch(1)).is_empty());

    // Not durable yet, or a snapshot of epoch 1 still open: nothing is freed.
    assert!(tree.reclaim(TreeEpoch(1), None).is_empty());
    assert!(tree.reclaim(TreeEpoch(2), Some(TreeEpoch(1))).is_empty());
    assert_eq!(tree.heap_nodes(), 2 * live_before);
    // Durable and no older snapshot: the old version goes, with its disk blocks.
    let released = tree.reclaim(TreeEpoch(2), Some(TreeEpoch(2)));
    assert_eq!(tree.heap_nodes(), live_before);
    assert!(tree.retired_disk_blocks(TreeEpoch(9)).is_empty());
    assert_eq!(released.len(), written);
    assert_matches(&tree, &ctx, None, &model, &mut rng);
}

/// Before session 22 a node replaced by copy-on-write kept its 4 KiB of heap until the
/// second durable commit after its replacement, with its disk block: under random writes
/// the index held nearly every leaf twice (a larger-than-memory run's index grew from 93
/// to 196 MB). Its memory may go as soon as the commit of the last seal that holds it has
/// built its images and no snapshot of such a seal is open; its block still waits.
#[test]
fn free_young_heap_frees_replaced_nodes_once_persisted_and_keeps_their_blocks() {
    let Replaced {
        mut rng,
        tree,
        ctx,
        model,
        live_before,
        sealed,
        written,
    } = every_node_replaced(9);
    let held = tree.heap_nodes();
    let young = tree.young_heap_nodes();
    assert!(young >= live_before, "every persisted node was replaced");
    // The commit of epoch 1 may still be reading them: nothing goes.
    assert_eq!(tree.free_young_heap(None), 0);
    assert_eq!(tree.heap_nodes(), held);
    tree.mark_persisted(sealed.epoch);
    // A snapshot of epoch 1 still reads them: nothing goes.
    assert_eq!(tree.free_young_heap(Some(TreeEpoch(1))), 0);
    // Persisted and no older snapshot: the memory goes, the blocks stay retired.
    assert_eq!(tree.free_young_heap(Some(TreeEpoch(2))), young);
    assert_eq!(tree.heap_nodes(), held - young);
    assert_eq!(tree.young_heap_nodes(), 0);
    assert_eq!(tree.retired_disk_blocks(TreeEpoch(2)).len(), written);
    assert_matches(&tree, &ctx, None, &model, &mut rng);
    // The blocks are released by the commits' rule, as before.
    assert!(tree.reclaim(TreeEpoch(1), None).is_empty());
    assert_eq!(tree.reclaim(TreeEpoch(2), None).len(), written);
    assert!(!tree.has_retired());
    assert_eq!(tree.heap_nodes(), held - young);
    assert_matches(&tree, &ctx, None, &model, &mut rng);
}

/// A `Ctx` that calls back into the tree's writer: a misuse the writer check must catch.
struct ReentrantCtx<'a> {
    inner: FakeCtx,
    tree: &'a Tree,
}

impl Ctx for ReentrantCtx<'_> {
    fn key_cmp(&self, ptr: u64, key: &[u8]) -> Result<std::cmp::Ordering> {
        self.tree.seal();
        self.inner.key_cmp(ptr, key)
    }
    fn key_into(&self, ptr: u64, out: &mut Vec<u8>) -> Result<()> {
        self.inner.key_into(ptr, out)
    }
    fn with_node<R>(&self, off: DiskOffset, f: impl FnOnce(&[u8]) -> Result<R>) -> Result<R> {
        self.inner.with_node(off, f)
    }
}

#[test]
#[should_panic(expected = "two writer calls at once")]
fn overlapping_writers_panic() {
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut inner = FakeCtx::default();
    let p = inner.add(b"k");
    let ctx = ReentrantCtx { inner, tree: &tree };
    tree.insert(&ctx, b"k", p).unwrap();
    // The second insert of the same key compares full keys, and the compare re-enters.
    tree.insert(&ctx, b"k", p).unwrap();
}

#[test]
fn readers_never_miss_a_key_while_the_writer_splits_and_copies() {
    let mut rng = StdRng::seed_from_u64(9);
    let keys: Vec<Vec<u8>> = (0..60_000)
        .map(|_| {
            let mut k = rng.random::<u64>().to_be_bytes().to_vec();
            k.truncate(rng.random_range(2..=8));
            k.extend((0..rng.random_range(0..6)).map(|_| rng.random::<u8>()));
            k
        })
        .collect();
    readers_never_miss_a_key_while_writing(keys, rng);
}

/// As above with keys whose internal nodes get stems (`key:%012d`), and keys among them
/// that break the stems (other shapes, shorter, outside `key:`): readers descend while
/// the writer shrinks stems in place and splits give halves new ones, both inside the
/// node's seqlock.
#[test]
fn readers_never_miss_a_key_while_the_writer_changes_internal_stems() {
    let mut rng = StdRng::seed_from_u64(19);
    let keys: Vec<Vec<u8>> = (0..60_000)
        .map(|i| match i % 10 {
            0 => format!("key:{}", rng.random_range(0..100_000u32)).into_bytes(),
            1 => format!("kez{}", rng.random_range(0..100_000u32)).into_bytes(),
            2 => {
                let mut k = rng.random::<u64>().to_be_bytes().to_vec();
                k.truncate(rng.random_range(1..=8));
                k
            }
            _ => redis_key(rng.random_range(0..1_000_000)),
        })
        .collect();
    let report = readers_never_miss_a_key_while_writing(keys, rng);
    assert!(report.internal_stem_bytes > 0);
}

/// As above with collection-shaped keys whose internal stems reach past the header (so
/// readers take the stem's last bytes from pivot 0 of a node the writer is changing),
/// EXTERNAL separators among them that cut such stems back, and other keys.
#[test]
fn readers_never_miss_a_key_while_long_internal_stems_change() {
    let mut rng = StdRng::seed_from_u64(34);
    let shared = b"\xff\xfftucana\x00L\x00\x00\x00\x06mylist\0\0\0\0\0\0\0\x03";
    let keys: Vec<Vec<u8>> = (0..60_000)
        .map(|i| {
            let mut k = shared.to_vec();
            k.extend_from_slice(&((1u64 << 63) + rng.random_range(0..200_000u64)).to_be_bytes());
            match i % 10 {
                // Runs of long keys differing only past their 256th byte.
                0 => {
                    k.truncate(shared.len());
                    k.extend_from_slice(
                        &((1u64 << 63) + 5_000 * rng.random_range(0..40)).to_be_bytes(),
                    );
                    k.extend(std::iter::repeat_n(b'x', 270));
                    k.extend_from_slice(&rng.random::<u32>().to_be_bytes());
                }
                1 => k.truncate(rng.random_range(20..k.len())),
                2 => k = redis_key(rng.random_range(0..1_000_000)),
                _ => {}
            }
            k
        })
        .collect();
    let report = readers_never_miss_a_key_while_writing(keys, rng);
    let internal = report.heap_nodes + report.disk_nodes - report.leaves;
    assert!(report.external_pivots > 0, "{report:?}");
    assert!(report.internal_stem_bytes > 24 * internal, "{report:?}");
}

/// Readers get and scan the first third of `keys` (deduplicated) while the writer inserts
/// the rest, removes some, seals and a commit thread persists each sealed root.
fn readers_never_miss_a_key_while_writing(mut keys: Vec<Vec<u8>>, mut rng: StdRng) -> TreeCheck {
    let mut ctx = FakeCtx::default();
    keys.sort();
    keys.dedup();
    keys.shuffle(&mut rng);
    for k in &keys {
        ctx.add(k);
    }
    // The commit thread writes images to its own store; keys are shared.
    let mut commit_ctx = FakeCtx {
        keys: ctx.keys.clone(),
        ..FakeCtx::default()
    };
    let ptr_of = |i: usize| i as u64 + 1;
    let before = keys.len() / 3;
    let tree = Tree::new(REGION, TreeEpoch(1));
    for (i, k) in keys[..before].iter().enumerate() {
        tree.insert(&ctx, k, ptr_of(i)).unwrap();
    }
    let done = AtomicBool::new(false);
    let durable = AtomicU64::new(0);
    let (to_commit, commits) = std::sync::mpsc::channel::<Sealed>();
    let (ctx, keys, tree, durable) = (&ctx, &keys, &tree, &durable);
    std::thread::scope(|s| {
        for r in 0..2u64 {
            let done = &done;
            s.spawn(move || {
                let mut rng = StdRng::seed_from_u64(100 + r);
                let mut passes = 0;
                while !done.load(Acquire) || passes < 2 {
                    passes += 1;
                    let guard = crossbeam_epoch::pin();
                    for _ in 0..2000 {
                        let i = rng.random_range(0..before);
                        let got = tree.get(ctx, None, &keys[i], &guard).unwrap();
                        assert_eq!(
                            got,
                            Some(ptr_of(i)),
                            "key inserted before the reader started"
                        );
                    }
                    drop(guard);
                    let fwd = scan_forward(tree, ctx, None, None);
                    assert!(
                        fwd.windows(2).all(|w| w[0].0 < w[1].0),
                        "forward walk not sorted"
                    );
                    assert!(fwd.len() >= before);
                    let bwd = scan_backward(tree, ctx, None, None);
                    assert!(
                        bwd.windows(2).all(|w| w[0].0 > w[1].0),
                        "backward walk not sorted"
                    );
                    assert!(bwd.len() >= before);
                }
            });
        }
        s.spawn(move || {
            // Persists each sealed root beside the writer and readers, then proves the
            // images form a valid tree holding at least the keys inserted first.
            for sealed in commits {
                let (root, _) = commit_ctx.persist(tree, sealed);
                let disk = Tree::from_disk(REGION, root, TreeEpoch(u64::MAX));
                let report = disk.check(&commit_ctx, disk.root_word()).unwrap();
                assert!(report.keys as usize >= before);
                durable.store(sealed.epoch.0, Release);
            }
        });
        for i in before..keys.len() {
            tree.insert(ctx, &keys[i], ptr_of(i)).unwrap();
            if i.is_multiple_of(7) && i - 3 >= before {
                // Remove a key the readers do not check.
                tree.remove(ctx, &keys[i - 3]).unwrap();
            }
            if i.is_multiple_of(4000) {
                // Later writes copy nodes on write. Old copies are freed as soon as the
                // commit thread is past them; readers still on them hold guards.
                to_commit.send(tree.seal()).unwrap();
                tree.reclaim(TreeEpoch(durable.load(Acquire)), None);
            }
        }
        drop(to_commit);
        done.store(true, Release);
    });
    let report = tree.check(ctx, tree.root_word()).unwrap();
    assert!(report.height >= 3);
    report
}

/// `cargo test -p tucana --release --lib index::tests::bench -- --ignored --nocapture`
#[test]
#[ignore]
fn bench_one_million_random_16_byte_keys() {
    use std::time::Instant;
    const N: usize = 1_000_000;
    let mut rng = StdRng::seed_from_u64(10);
    let mut ctx = FakeCtx::default();
    let keys: Vec<[u8; 16]> = (0..N).map(|_| rng.random()).collect();
    for k in &keys {
        ctx.add(k);
    }
    let tree = Tree::new(REGION, TreeEpoch(1));
    let t = Instant::now();
    for (i, k) in keys.iter().enumerate() {
        tree.insert(&ctx, k, i as u64 + 1).unwrap();
    }
    let insert_ns = t.elapsed().as_nanos() as f64 / N as f64;
    let mut order: Vec<usize> = (0..N).collect();
    order.shuffle(&mut rng);
    let guard = crossbeam_epoch::pin();
    let t = Instant::now();
    for &i in &order {
        let got = tree.get(&ctx, None, &keys[i], &guard).unwrap();
        assert_eq!(got, Some(i as u64 + 1));
    }
    let get_ns = t.elapsed().as_nanos() as f64 / N as f64;
    drop(guard);
    let sealed = tree.seal();
    let t = Instant::now();
    let (disk_root, written) = ctx.persist(&tree, sealed);
    let persist_ns = t.elapsed().as_nanos() as f64 / written as f64;
    let disk = Tree::from_disk(REGION, disk_root, TreeEpoch(2));
    let guard = crossbeam_epoch::pin();
    let t = Instant::now();
    for &i in &order {
        let got = disk.get(&ctx, None, &keys[i], &guard).unwrap();
        assert_eq!(got, Some(i as u64 + 1));
    }
    let disk_get_ns = t.elapsed().as_nanos() as f64 / N as f64;
    let report = tree.check(&ctx, tree.root_word()).unwrap();
    println!(
        "index bench, {N} random 16-byte keys: insert {insert_ns:.0} ns, get {get_ns:.0} ns, \
         get from disk images {disk_get_ns:.0} ns, persist {persist_ns:.0} ns/node; \
         height {}, {} nodes, {:.1} index bytes/key",
        report.height,
        tree.heap_nodes(),
        tree.heap_nodes() as f64 * NODE_BYTES as f64 / N as f64
    );
}

/// Keys like redis-benchmark's (`key:` and 12 digits, mostly zeros in front): their first
/// 8 bytes are the same, so without leaf stems every prefix ties and an insert reads about
/// log2(200) keys from the log to place itself. Stems move the prefixes past the shared
/// bytes; inserts then read almost nothing.
#[test]
fn leaf_stems_keep_shared_beginnings_from_reading_the_log() {
    let mut rng = StdRng::seed_from_u64(11);
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    let key = |n: u64| format!("key:{n:012}").into_bytes();
    for _ in 0..30_000 {
        put(
            &tree,
            &mut ctx,
            &mut model,
            &key(rng.random_range(0..1_000_000)),
        );
    }
    let report = tree.check(&ctx, tree.root_word()).unwrap();
    assert!(
        report.stem_bytes >= 8 * report.leaves,
        "{} stem bytes over {} leaves",
        report.stem_bytes,
        report.leaves
    );
    let before = ctx.key_reads.load(Relaxed);
    let mut inserted = 0u64;
    while inserted < 2000 {
        let k = key(rng.random_range(0..1_000_000));
        if !model.contains_key(&k) {
            put(&tree, &mut ctx, &mut model, &k);
            inserted += 1;
        }
    }
    let per_insert = (ctx.key_reads.load(Relaxed) - before) as f64 / inserted as f64;
    // Splits read the keys of a half whose stem grows; everything else settles on prefixes.
    assert!(per_insert < 2.0, "{per_insert} log reads per new key");
    assert_matches(&tree, &ctx, None, &model, &mut rng);
}

/// The bug: a list pushed at its head (redis-benchmark's LPUSH) keeps its head elements
/// in the leaf that also holds the key just before them (the list's own metadata key).
/// Every split cut that leaf in the middle, so the half that took the pushes kept the
/// outsider and with it a stem too short to tell the elements apart; each push then read
/// 7.4 keys from the log to place itself, and each split read a half's keys to restem
/// the other half (about 1 more per push). Splits now cut at the end of the run of tied
/// prefixes, so the elements' half grows a stem over what they share.
#[test]
fn pushes_at_a_lists_head_beside_another_key_read_no_keys() {
    let mut rng = StdRng::seed_from_u64(23);
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    // The server's layout: the list's key, then its elements under a long shared prefix
    // with an 8-byte big-endian index, the head growing downwards from the middle.
    put(&tree, &mut ctx, &mut model, b"mylist");
    let element = |index: u64| {
        let mut k = b"\xff\xfftucana\x00L\x00\x00\x00\x06mylist".to_vec();
        k.extend_from_slice(&0x0123_4567u64.to_be_bytes());
        k.extend_from_slice(&index.to_be_bytes());
        k
    };
    let pushes = 20_000u64;
    for i in 0..pushes {
        put(&tree, &mut ctx, &mut model, &element((1 << 63) - i));
    }
    let per_push = ctx.key_reads.load(Relaxed) as f64 / pushes as f64;
    assert!(per_push < 0.2, "{per_push} log reads per push");
    assert_matches(&tree, &ctx, None, &model, &mut rng);
}

/// The server's sorted-set members (`rec:` and 12 digits, YCSB's record names) under
/// their collection's 31-byte prefix share 42 bytes. With stems of at most 32 bytes every
/// member's prefix was `ec:00000`: all of a leaf tied, so each new member read about
/// log2(200) keys to place itself. Stems reach 56 bytes now, past both; the long stems
/// must also survive the trip through disk images (bytes 32.. live in header words).
#[test]
fn members_sharing_more_than_32_bytes_get_stems_past_them() {
    let mut rng = StdRng::seed_from_u64(24);
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    let member = |n: u64| {
        let mut k = b"\xff\xfftucana\x00Z\x00\x00\x00\x09rec-index".to_vec();
        k.extend_from_slice(&7u64.to_be_bytes());
        k.extend_from_slice(format!("rec:{n:012}").as_bytes());
        k
    };
    assert_eq!(member(0).len() - "rec:000000000000".len(), 31);
    let mut numbers: Vec<u64> = (0..60_000).collect();
    numbers.shuffle(&mut rng);
    let (loaded, later) = numbers.split_at(50_000);
    for &n in loaded {
        put(&tree, &mut ctx, &mut model, &member(n));
    }
    let report = tree.check(&ctx, tree.root_word()).unwrap();
    assert!(
        report.stem_bytes > 40 * report.leaves,
        "{} stem bytes over {} leaves",
        report.stem_bytes,
        report.leaves
    );
    let before = ctx.key_reads.load(Relaxed);
    for &n in later {
        put(&tree, &mut ctx, &mut model, &member(n));
    }
    let per_insert = (ctx.key_reads.load(Relaxed) - before) as f64 / later.len() as f64;
    assert!(per_insert < 1.0, "{per_insert} log reads per new member");
    assert_matches(&tree, &ctx, None, &model, &mut rng);
    let heap_stem_bytes = tree.check(&ctx, tree.root_word()).unwrap().stem_bytes;
    let sealed = tree.seal();
    let (root, _) = ctx.persist(&tree, sealed);
    let disk = Tree::from_disk(REGION, root, TreeEpoch(2));
    assert_matches(&disk, &ctx, None, &model, &mut rng);
    let disk_stem_bytes = disk.check(&ctx, disk.root_word()).unwrap().stem_bytes;
    assert_eq!(disk_stem_bytes, heap_stem_bytes);
    // The header words a longer stem fills are checked like the rest of the image: a
    // byte past the stem, or a stem longer than 56 bytes, is corruption.
    let mut long_stems = 0;
    for (&off, clean) in &ctx.images {
        let (kind, len) = image_kind_and_stem_len(&clean[..]);
        if kind != 1 {
            continue;
        }
        long_stems += usize::from(len > 32);
        let past_stem = 40 + len.saturating_sub(32);
        type Damage = fn(&mut [u8], usize);
        let damages: [(&str, Damage); 2] = [
            ("a header byte past the stem", |img, at| img[at] = 1),
            ("a stem of 57 bytes", |img, _| {
                img[14..16].copy_from_slice(&57u16.to_le_bytes())
            }),
        ];
        for (name, damage) in damages {
            if past_stem == 64 && name.starts_with("a header byte") {
                continue;
            }
            let mut img = clean.clone();
            damage(&mut img[..], past_stem);
            restamp(&mut img[..]);
            assert!(
                matches!(
                    super::verify_image(&img[..], DiskOffset(off), REGION),
                    Err(Error::Corruption { .. })
                ),
                "{name} in a leaf with a {len}-byte stem"
            );
        }
    }
    assert!(long_stems > 0);
}

/// `Tree::write_counts` is what larger-than-memory loads are diagnosed with (issue 22):
/// every full key an insert reads is counted once, as a split's or as an insert's, and
/// every leaf split is counted (an insert-only tree has one leaf more than splits).
#[test]
fn write_counts_account_for_every_key_inserts_read() {
    let mut rng = StdRng::seed_from_u64(21);
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    // Tied prefixes (so inserts and splits both read keys), a few repeated keys.
    put_tied_keys(&tree, &mut ctx, &mut model, &mut rng);
    let c = tree.write_counts();
    assert_eq!(
        c.split_key_reads + c.insert_key_reads,
        ctx.key_reads.load(Relaxed),
        "{c:?}"
    );
    assert!(c.split_key_reads > 0 && c.insert_key_reads > 0, "{c:?}");
    assert!(c.restemmed_halves > 0, "dense ties grew no stem: {c:?}");
    let report = tree.check(&ctx, tree.root_word()).unwrap();
    assert_eq!(report.leaves, c.leaf_splits + 1, "{c:?}");
    assert_matches(&tree, &ctx, None, &model, &mut rng);
}

/// Issue 22: in a YCSB load larger than memory, a client waited on the region's writer
/// lock while the holder split a leaf, reading every key of a half from the log (page
/// faults on evicted pages) to give it a longer stem. The rule then was "grow when any
/// two neighbours tie on their prefix", and YCSB's keys (`user` + a decimal hash) tie a
/// few times in most halves: half of all leaf splits of a 3M load read ~100 keys each,
/// 0.4 key reads per insert. A few ties cost inserts a key read now and then and lookups
/// nothing, so a half with sparse ties now keeps its stem and the split reads no key.
#[test]
fn a_split_keeps_the_stem_of_a_half_whose_prefixes_tie_sparsely() {
    let mut rng = StdRng::seed_from_u64(22);
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    // 200 keys whose 8-byte prefixes (`k` and 7 digits: the root leaf has no stem) are
    // distinct but for one pair; the 200 fill the root leaf and the 201st splits it.
    let mut keys: Vec<Vec<u8>> = (0..200u32)
        .map(|i| format!("k{:07}0000", i * 37).into_bytes())
        .collect();
    keys.push(format!("k{:07}5555", 50 * 37).into_bytes());
    keys.shuffle(&mut rng);
    let (last, first) = keys.split_last().unwrap();
    for k in first {
        put(&tree, &mut ctx, &mut model, k);
    }
    assert_eq!(tree.write_counts().leaf_splits, 0);
    let before = ctx.key_reads.load(Relaxed);
    put(&tree, &mut ctx, &mut model, last);
    let c = tree.write_counts();
    assert_eq!(c.leaf_splits, 1, "{c:?}");
    assert_eq!(c.restemmed_halves, 0, "a sparse tie grew a stem: {c:?}");
    // At most: the split point and the separator when the inserted key or the boundary
    // entries sit in the tie, and the insert placing itself in it.
    let reads = ctx.key_reads.load(Relaxed) - before;
    assert!(reads <= 4, "{reads} key reads for one insert and its split");
    assert_matches(&tree, &ctx, None, &model, &mut rng);
    tree.check(&ctx, tree.root_word()).unwrap();
}

/// Stems grow at splits and shrink when a key outside them arrives (a leaf's range is
/// wider than the keys it holds so far); both, and the round trip through disk images,
/// must keep every lookup, scan and the structural check right.
#[test]
fn leaf_stems_shrink_for_keys_outside_them_and_survive_disk() {
    let mut rng = StdRng::seed_from_u64(12);
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    // Dense groups with long common beginnings, far apart: leaves get long stems.
    for g in 0..8u32 {
        for _ in 0..700 {
            let k = format!(
                "group{g}-common-beginning-{:08}",
                rng.random_range(0..1_000_000u32)
            );
            put(&tree, &mut ctx, &mut model, k.as_bytes());
        }
    }
    let stems_before = tree.check(&ctx, tree.root_word()).unwrap().stem_bytes;
    assert!(stems_before > 0);
    // Persist, continue on the disk tree: its leaves are copied with their stems.
    let sealed = tree.seal();
    let (root, _) = ctx.persist(&tree, sealed);
    let tree = Tree::from_disk(REGION, root, TreeEpoch(2));
    assert_matches(&tree, &ctx, None, &model, &mut rng);
    // Keys between the groups and inside them that break the stems: shorter keys,
    // keys differing inside the common part, prefixes of existing keys.
    for i in 0..3000u32 {
        let g = rng.random_range(0..8u32);
        let k = match i % 5 {
            0 => format!("group{g}-common-beginning-"),
            1 => format!("group{g}-common-beginnin{}", rng.random_range(0..10u32)),
            2 => format!("group{g}-comm"),
            3 => format!("group{g}{:04}", rng.random_range(0..10_000u32)),
            _ => format!(
                "group{g}-common-beginning-{:08}",
                rng.random_range(0..1_000_000u32)
            ),
        };
        put(&tree, &mut ctx, &mut model, k.as_bytes());
        if i % 7 == 0 {
            let nth = rng.random_range(0..model.len());
            let k = model.keys().nth(nth).cloned().unwrap();
            del(&tree, &ctx, &mut model, &k);
        }
    }
    assert_matches(&tree, &ctx, None, &model, &mut rng);
    let sealed = tree.seal();
    let (root, _) = ctx.persist(&tree, sealed);
    let disk = Tree::from_disk(REGION, root, TreeEpoch(3));
    assert_matches(&disk, &ctx, None, &model, &mut rng);
}

/// `LeafCopy::tie_span` against the keys themselves, for bounds inside, around and far
/// outside leaves with stems.
#[test]
fn tie_span_brackets_the_entries_equal_prefixes_cannot_order() {
    let mut rng = StdRng::seed_from_u64(13);
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    for _ in 0..5000 {
        let k = format!("user{:010}", rng.random_range(0..100_000u64) * 37);
        put(&tree, &mut ctx, &mut model, k.as_bytes());
    }
    let guard = crossbeam_epoch::pin();
    let mut leaf = LeafCopy::default();
    let mut stemmed = 0;
    for _ in 0..300 {
        let bound = match rng.random_range(0..4) {
            0 => format!("user{:010}", rng.random_range(0..4_000_000u64)).into_bytes(),
            1 => stored_key(&mut rng, &model),
            2 => format!("user{}", rng.random_range(0..1000u64)).into_bytes(),
            _ => [&b"a"[..], b"user", b"v", b""][rng.random_range(0..4)].to_vec(),
        };
        tree.copy_leaf(&ctx, None, Seek::AtOrAfter(&bound), &guard, &mut leaf)
            .unwrap();
        stemmed += usize::from(!leaf.stem.is_empty());
        let span = leaf.tie_span(&bound);
        for (i, &ptr) in leaf.ptrs.iter().enumerate() {
            let key = ctx.key(ptr);
            assert!(key.starts_with(&leaf.stem));
            if i < span.start {
                assert!(key < bound.as_slice(), "entry {i} before {span:?}");
            } else if i >= span.end {
                assert!(key > bound.as_slice(), "entry {i} after {span:?}");
            }
        }
    }
    assert!(stemmed > 0, "no leaf had a stem");
}

/// A key of `model` picked at random: a bound that lands on an entry exactly.
fn stored_key(rng: &mut StdRng, model: &Model) -> Vec<u8> {
    let at = rng.random_range(0..model.len());
    model
        .keys()
        .nth(at)
        .cloned()
        .expect("a key of a model that is not empty")
}

/// `Tree::copy_leaf_from` (a forward range's first leaf) against `copy_leaf`: the same
/// leaf and fences, its entries from the first one `tie_span` cannot place below the key,
/// so nothing at or above the key is left out.
#[test]
fn a_leaf_copied_from_a_key_is_the_leafs_tail_from_that_key() {
    let mut rng = StdRng::seed_from_u64(29);
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    for _ in 0..5000 {
        let k = format!("user{:010}", rng.random_range(0..100_000u64) * 37);
        put(&tree, &mut ctx, &mut model, k.as_bytes());
    }
    let guard = crossbeam_epoch::pin();
    let (mut whole, mut from) = (LeafCopy::default(), LeafCopy::default());
    let mut trimmed = 0;
    for _ in 0..300 {
        let bound = match rng.random_range(0..3) {
            0 => format!("user{:010}", rng.random_range(0..4_000_000u64)).into_bytes(),
            1 => stored_key(&mut rng, &model),
            _ => [&b"a"[..], b"user", b"v", b""][rng.random_range(0..4)].to_vec(),
        };
        tree.copy_leaf(&ctx, None, Seek::AtOrAfter(&bound), &guard, &mut whole)
            .unwrap();
        tree.copy_leaf_from(&ctx, None, &bound, usize::MAX, &guard, &mut from)
            .unwrap();
        let start = whole.tie_span(&bound).start;
        assert_eq!(from.ptrs, whole.ptrs[start..]);
        assert_eq!(from.prefixes, whole.prefixes[start..]);
        assert_eq!(
            (&from.stem, &from.low, &from.high),
            (&whole.stem, &whole.low, &whole.high)
        );
        assert!(whole.ptrs[..start]
            .iter()
            .all(|&p| ctx.key(p) < bound.as_slice()));
        trimmed += usize::from(start > 0);
    }
    assert!(trimmed > 100, "only {trimmed} copies left anything out");
}

/// `Tree::copy_leaf_from` with a cap (a range with a limit): the copy is the uncapped
/// copy's first entries, cut past every entry tied with the key and one further, with
/// the leaf's fences; going on from each cut copy's last key (and from the high fence
/// after a whole one) visits every key from the bound on, once, in order, even where
/// keys tie on the bytes a prefix holds. A copy for a sorted set's ten members copied
/// half a leaf before the cap (`ZRANGEBYSCORE … LIMIT 0 10`, session 28).
#[test]
fn a_capped_leaf_copy_ends_past_the_ties_and_goes_on_from_its_last_key() {
    let mut rng = StdRng::seed_from_u64(31);
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    for i in 0..6000u64 {
        // Half the keys come in groups of about 15 sharing 11 bytes after "user", so a
        // leaf holds several groups and each group's prefixes tie; half do not tie.
        let k = if i % 2 == 0 {
            format!("user{:010}", rng.random_range(0..100_000u64) * 37)
        } else {
            let group = rng.random_range(0..200u64);
            format!(
                "user{group:03}TIEDTIED{:08}",
                rng.random_range(0..1_000_000u64)
            )
        };
        put(&tree, &mut ctx, &mut model, k.as_bytes());
    }
    let guard = crossbeam_epoch::pin();
    let (mut whole, mut capped) = (LeafCopy::default(), LeafCopy::default());
    let (mut cut, mut cut_after_ties) = (0, 0);
    for round in 0..400 {
        let bound = match rng.random_range(0..3) {
            0 => format!("user{:010}", rng.random_range(0..4_000_000u64)).into_bytes(),
            1 => stored_key(&mut rng, &model),
            _ => format!(
                "user{:03}TIEDTIED{:08}",
                rng.random_range(0..200u64),
                rng.random_range(0..1_000_000u64)
            )
            .into_bytes(),
        };
        let cap = rng.random_range(0..24usize);
        tree.copy_leaf_from(&ctx, None, &bound, usize::MAX, &guard, &mut whole)
            .unwrap();
        tree.copy_leaf_from(&ctx, None, &bound, cap, &guard, &mut capped)
            .unwrap();
        assert!(!whole.cut);
        let n = capped.ptrs.len();
        assert_eq!(capped.ptrs, whole.ptrs[..n], "round {round}");
        assert_eq!(capped.prefixes, whole.prefixes[..n]);
        assert_eq!(
            (&capped.stem, &capped.low, &capped.high),
            (&whole.stem, &whole.low, &whole.high)
        );
        assert_eq!(capped.cut, n < whole.ptrs.len());
        if capped.cut {
            cut += 1;
            let span = whole.tie_span(&bound);
            assert!(
                n <= cap.max(1).max(span.end - span.start + 1),
                "{n} entries copied for a cap of {cap}"
            );
            cut_after_ties += usize::from(span.end - span.start > cap);
            let last = ctx.key(capped.ptrs[n - 1]);
            assert!(
                last > bound.as_slice(),
                "round {round}: a cut copy must move on"
            );
        }
        // Walk on: every key from the bound on, in order.
        if round % 20 == 0 {
            let mut seen: Vec<Vec<u8>> = Vec::new();
            let mut from = bound.clone();
            for copies in 0.. {
                assert!(
                    copies <= model.len(),
                    "round {round}: the walk does not move on"
                );
                tree.copy_leaf_from(&ctx, None, &from, cap, &guard, &mut capped)
                    .unwrap();
                for &p in &capped.ptrs {
                    let key = ctx.key(p).to_vec();
                    if key >= bound && seen.last().is_none_or(|last| key > *last) {
                        seen.push(key);
                    }
                }
                from = match (capped.cut, capped.high.take()) {
                    (true, _) => seen.last().expect("a cut copy moves on").clone(),
                    (false, Some(high)) => high,
                    (false, None) => break,
                };
            }
            let want: Vec<Vec<u8>> = model
                .range(bound.clone()..)
                .map(|(k, _)| k.clone())
                .collect();
            assert_eq!(seen, want, "round {round}: walk from {bound:?}, cap {cap}");
        }
    }
    assert!(cut > 200, "only {cut} copies were cut");
    assert!(
        cut_after_ties > 5,
        "only {cut_after_ties} copies had more ties than the cap"
    );
}

/// A leaf split whose boundary entries differ in their prefixes builds the separator from
/// the prefixes (stem + the right key's bytes up to the first differing one) instead of
/// reading both keys from the log: random keys load without a single log read. The
/// check verifies every separator against the keys on both sides of it.
#[test]
fn splits_of_leaves_with_distinct_prefixes_read_no_keys() {
    let mut rng = StdRng::seed_from_u64(13);
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    for _ in 0..20_000 {
        let mut k = vec![0u8; rng.random_range(9..24)];
        rng.fill(&mut k[..]);
        put(&tree, &mut ctx, &mut model, &k);
    }
    // Short keys too: a key that ends inside the prefix is zero-padded there.
    for _ in 0..2_000 {
        let mut k = vec![0u8; rng.random_range(1..8)];
        rng.fill(&mut k[..]);
        put(&tree, &mut ctx, &mut model, &k);
    }
    let reads = ctx.key_reads.load(Relaxed);
    // Reads are left only for the rare prefix ties among short keys (padding) and for
    // the overwrites the random short keys produce.
    assert!(reads < 200, "{reads} log reads for 22,000 inserts");
    let report = tree.check(&ctx, tree.root_word()).unwrap();
    assert!(report.leaves > 100, "{} leaves", report.leaves);
    assert_matches(&tree, &ctx, None, &model, &mut rng);
}

/// Puts 5,000 keys with shared beginnings and equal prefixes (so ties are searched),
/// some more than once; returns them in the order put.
fn put_tied_keys(
    tree: &Tree,
    ctx: &mut FakeCtx,
    model: &mut Model,
    rng: &mut StdRng,
) -> Vec<Vec<u8>> {
    let mut keys = Vec::new();
    for i in 0..5_000u32 {
        let k = format!("key:{:06}:{}", rng.random_range(0..3_000u32), i % 7).into_bytes();
        put(tree, ctx, model, &k);
        keys.push(k);
    }
    keys
}

/// `points_at` answers GC's liveness question from the index alone: true for the pointer
/// the key maps to, false for any other (an older record of the key, another key's record)
/// and for absent keys, with no log read (a read per dead record was a random cache miss
/// per record of every victim).
#[test]
fn points_at_tells_live_records_from_dead_without_reading_the_log() {
    let mut rng = StdRng::seed_from_u64(15);
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    let keys = put_tied_keys(&tree, &mut ctx, &mut model, &mut rng);
    let guard = crossbeam_epoch::pin();
    let before = ctx.key_reads.load(Relaxed);
    let mut live = 0;
    for k in &keys {
        let ptr = model[k];
        assert!(tree.points_at(&ctx, None, k, ptr, &guard).unwrap(), "{k:?}");
        live += 1;
        // The pointer of an older record of this key (every put appended a new record)
        // or of another key is not live for it.
        let other = model[&keys[rng.random_range(0..keys.len())]];
        assert_eq!(
            tree.points_at(&ctx, None, k, other, &guard).unwrap(),
            other == ptr,
            "{k:?}"
        );
        assert!(!tree.points_at(&ctx, None, k, ptr + 1, &guard).unwrap());
    }
    assert!(!tree.points_at(&ctx, None, b"absent", 42, &guard).unwrap());
    assert_eq!(
        ctx.key_reads.load(Relaxed),
        before,
        "points_at read the log"
    );
    assert_eq!(live, keys.len());
}

/// `replace_ptr` is GC's swap of a relocated record: it moves the key's entry from the
/// old record to the copy only if the entry still holds the old record, reads no log
/// record to find it, and copies on write like any writer change (a sealed root keeps
/// the old pointer).
#[test]
fn replace_ptr_swaps_only_the_entry_holding_the_old_record() {
    use crate::error::Result;
    let mut rng = StdRng::seed_from_u64(16);
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    let mut keys = put_tied_keys(&tree, &mut ctx, &mut model, &mut rng);
    keys.sort();
    keys.dedup();
    let sealed = tree.seal();
    let before = model.clone();
    let reads = ctx.key_reads.load(Relaxed);
    for (n, k) in keys.iter().enumerate() {
        let old = model[k];
        let copy = ctx.add(k);
        // A stale record of the key (or any other pointer): nothing changes, and no
        // copy is asked for.
        let never = || -> Result<u64> { panic!("a copy was asked for a dead record") };
        assert!(!tree.replace_ptr(&ctx, k, old + 100_000, never).unwrap());
        if n % 2 == 0 {
            assert!(
                tree.replace_ptr(&ctx, k, old, || Ok(copy)).unwrap(),
                "{k:?}"
            );
            model.insert(k.clone(), copy);
        }
    }
    assert!(!tree
        .replace_ptr(&ctx, b"absent", 1, || -> Result<u64> { panic!("absent") })
        .unwrap());
    assert_eq!(
        ctx.key_reads.load(Relaxed),
        reads,
        "replace_ptr read the log"
    );
    for k in &keys {
        assert_eq!(get(&tree, &ctx, None, k), Some(model[k]), "{k:?}");
        assert_eq!(
            get(&tree, &ctx, Some(sealed.root), k),
            Some(before[k]),
            "the sealed root changed for {k:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Internal stems

/// redis-benchmark's key shape: `key:` and 12 digits, so every key starts with the same
/// 8 bytes (`key:0000` below 10^8).
fn redis_key(n: u64) -> Vec<u8> {
    format!("key:{n:012}").into_bytes()
}

/// Full pivot comparisons (`search::cmp_pivot` past equal prefixes) made on this thread
/// while `f` runs.
fn full_pivot_compares<R>(f: impl FnOnce() -> R) -> (R, u64) {
    use super::search::FULL_PIVOT_COMPARES;
    let before = FULL_PIVOT_COMPARES.with(|c| c.get());
    let out = f();
    (out, FULL_PIVOT_COMPARES.with(|c| c.get()) - before)
}

/// Re-stamps a node image's checksum after a test damaged it (`node::image::image_crc`).
fn restamp(img: &mut [u8]) {
    let crc = crc32c::crc32c_append(crc32c::crc32c(&[0u8; 8]), &img[8..]);
    img[..4].copy_from_slice(&crc.to_le_bytes());
}

/// Kind byte and stem length of a node image (header word 1, see `node`).
fn image_kind_and_stem_len(img: &[u8]) -> (u8, usize) {
    (img[8], u16::from_le_bytes([img[14], img[15]]) as usize)
}

/// A fresh context over the same log as `ctx`, with `images` as its node blocks.
fn ctx_with_images(ctx: &FakeCtx, images: HashMap<u64, Box<[u8; NODE_BYTES]>>) -> FakeCtx {
    FakeCtx {
        keys: ctx.keys.clone(),
        images,
        next_block: ctx.next_block,
        key_reads: AtomicU64::new(0),
    }
}

/// With `key:%012d` keys every pivot of every internal node starts with `key:000000`, so
/// without internal stems all the pivot prefixes of a node are equal and each step of a
/// descent's binary search compared full pivots. Splits give each half the bytes its
/// pivots share (the first and last pivot's common beginning), after which the prefixes
/// (8 bytes after the stem) settle nearly every step.
#[test]
fn internal_stems_form_at_splits_of_tied_pivots() {
    let mut rng = StdRng::seed_from_u64(21);
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    for _ in 0..40_000 {
        put(
            &tree,
            &mut ctx,
            &mut model,
            &redis_key(rng.random_range(0..1_000_000)),
        );
    }
    let report = tree.check(&ctx, tree.root_word()).unwrap();
    assert!(report.height >= 3, "height {}", report.height);
    let stems = tree.internal_stems_for_test();
    assert_eq!(stems.len() as u64, report.heap_nodes - report.leaves);
    // Every separator of these keys starts with `key:000000`; nodes below the root hold
    // narrower ranges and share more.
    for (level, stem) in &stems {
        assert!(
            stem.starts_with(b"key:000000"),
            "level {level}: stem {:?}",
            String::from_utf8_lossy(stem)
        );
    }
    assert_eq!(
        report.internal_stem_bytes,
        stems.iter().map(|(_, s)| s.len() as u64).sum::<u64>()
    );
    let (_, compares) = full_pivot_compares(|| {
        for k in model.keys() {
            assert!(get(&tree, &ctx, None, k).is_some());
        }
    });
    let per_get = compares as f64 / model.len() as f64;
    assert!(per_get < 0.2, "{per_get} full pivot comparisons per get");
    assert_matches(&tree, &ctx, None, &model, &mut rng);
}

/// The same tree in both layouts: as written now, and rewritten the way volumes were
/// written before internal stems (stem length 0, prefixes the pivots' first 8 bytes).
/// Both read the same; the old layout compares full pivots at nearly every step of every
/// internal level, the new one almost never. The old layout also takes writes on top:
/// its nodes are copied with stem 0 and get stems when they split.
#[test]
fn full_pivot_comparisons_drop_with_internal_stems_and_old_layouts_still_read() {
    let mut rng = StdRng::seed_from_u64(22);
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    for _ in 0..40_000 {
        put(
            &tree,
            &mut ctx,
            &mut model,
            &redis_key(rng.random_range(0..1_000_000)),
        );
    }
    let sealed = tree.seal();
    let (root, _) = ctx.persist(&tree, sealed);
    let mut old_images = ctx.images.clone();
    let mut internal = 0;
    for img in old_images.values_mut() {
        if image_kind_and_stem_len(&img[..]).0 == 2 {
            internal += 1;
            super::node::image::destem_image(&mut img[..], |ptr| ctx.key(ptr).to_vec());
            assert_eq!(image_kind_and_stem_len(&img[..]).1, 0);
        }
    }
    assert!(internal >= 2);
    let mut old_ctx = ctx_with_images(&ctx, old_images);

    let count = |t: &Tree, c: &FakeCtx| {
        full_pivot_compares(|| {
            for (k, &p) in &model {
                assert_eq!(get(t, c, None, k), Some(p), "get {k:?}");
            }
        })
        .1 as f64
            / model.len() as f64
    };
    let new_disk = Tree::from_disk(REGION, root, TreeEpoch(2));
    let old_disk = Tree::from_disk(REGION, root, TreeEpoch(2));
    let (with, without) = (count(&new_disk, &ctx), count(&old_disk, &old_ctx));
    eprintln!(
        "full pivot comparisons per get, {} key:%012d keys: {without:.2} without internal stems, {with:.3} with",
        model.len()
    );
    // Two internal levels of ~log2(fanout) binary-search steps each, all tied.
    assert!(without > 8.0, "{without} without stems");
    assert!(with < 0.2, "{with} with stems");

    // The old layout passes every check, scans and seeks right, and takes writes.
    assert_matches(&old_disk, &old_ctx, None, &model, &mut rng);
    let report = old_disk.check(&old_ctx, old_disk.root_word()).unwrap();
    assert_eq!(report.internal_stem_bytes, 0);
    for _ in 0..20_000 {
        put(
            &old_disk,
            &mut old_ctx,
            &mut model,
            &redis_key(rng.random_range(0..1_000_000)),
        );
    }
    assert_matches(&old_disk, &old_ctx, None, &model, &mut rng);
    let report = old_disk.check(&old_ctx, old_disk.root_word()).unwrap();
    assert!(report.internal_stem_bytes > 0, "splits gave stems");
    let sealed = old_disk.seal();
    let (root2, _) = old_ctx.persist(&old_disk, sealed);
    let mixed = Tree::from_disk(REGION, root2, TreeEpoch(3));
    assert_matches(&mixed, &old_ctx, None, &model, &mut rng);
}

/// A node's stem only shrinks in place: a separator without it (a child at the node's
/// edge split outside the pivots so far) cuts it to what they share, and every prefix
/// takes the bytes given up in front. One internal node (the root), so its stem is
/// exactly what its pivots share: checked after each kind of key that breaks it.
#[test]
fn inserting_a_pivot_outside_the_stem_shrinks_it_and_lookups_stay_right() {
    let mut rng = StdRng::seed_from_u64(23);
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    let root_stem = |tree: &Tree| {
        let stems = tree.internal_stems_for_test();
        assert_eq!(stems.len(), 1, "one internal node");
        stems[0].1.clone()
    };
    let lcp_of_pivots = |tree: &Tree, ctx: &FakeCtx| {
        // The root's pivots are the fences of its children: walk them.
        let guard = crossbeam_epoch::pin();
        let mut out = LeafCopy::default();
        let mut fences: Vec<Vec<u8>> = Vec::new();
        tree.copy_leaf(ctx, None, Seek::First, &guard, &mut out)
            .unwrap();
        while let Some(h) = out.high.clone() {
            fences.push(h.clone());
            tree.copy_leaf(ctx, None, Seek::AtOrAfter(&h), &guard, &mut out)
                .unwrap();
        }
        let (first, last) = (&fences[0], fences.last().unwrap());
        let n = first.iter().zip(last).take_while(|(a, b)| a == b).count();
        first[..n.min(super::node::MAX_INT_STEM_BYTES)].to_vec()
    };
    // 3,000 keys in key order: one root over ~17 leaves; its pivots (separators up to the
    // first byte where neighbours differ) share `key:0000000`.
    for n in 0..3000u64 {
        put(&tree, &mut ctx, &mut model, &redis_key(n * 3));
    }
    let stem = root_stem(&tree);
    assert!(stem.starts_with(b"key:0000000"), "{stem:?}");
    assert_eq!(stem, lcp_of_pivots(&tree, &ctx));
    assert_matches(&tree, &ctx, None, &model, &mut rng);
    // Keys above every key so far: the last leaf splits at `key:0000010…`.
    for n in 0..400u64 {
        put(&tree, &mut ctx, &mut model, &redis_key(1_000_000 + n));
    }
    assert_eq!(root_stem(&tree), b"key:00000");
    assert_eq!(root_stem(&tree), lcp_of_pivots(&tree, &ctx));
    assert_matches(&tree, &ctx, None, &model, &mut rng);
    // Keys below every key so far, sharing only `k`: the first leaf splits there.
    for n in 0..400u64 {
        put(&tree, &mut ctx, &mut model, format!("kay{n:04}").as_bytes());
    }
    assert_eq!(root_stem(&tree), b"k");
    assert_matches(&tree, &ctx, None, &model, &mut rng);
    // And keys sharing nothing: the stem is gone, the layout is the stemless one.
    for n in 0..400u64 {
        put(&tree, &mut ctx, &mut model, format!("a{n:04}").as_bytes());
    }
    assert_eq!(root_stem(&tree), b"");
    assert_matches(&tree, &ctx, None, &model, &mut rng);
    let sealed = tree.seal();
    let (root, _) = ctx.persist(&tree, sealed);
    let disk = Tree::from_disk(REGION, root, TreeEpoch(2));
    assert_matches(&disk, &ctx, None, &model, &mut rng);
}

/// Keys below, above and inside an internal node's stem: below (smaller, or a proper
/// prefix of the stem) go to the first child, above to the last, without reading a
/// pivot; inside, by the prefixes after the stem. Gets, seeks in both directions and the
/// fences a range walk gets must all agree with the model, in memory and on disk.
#[test]
fn lookups_below_above_and_inside_an_internal_stem() {
    let mut rng = StdRng::seed_from_u64(24);
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    for _ in 0..5000 {
        let k = format!("tenant/table/{:08}", rng.random_range(0..100_000u32) * 7);
        put(&tree, &mut ctx, &mut model, k.as_bytes());
    }
    let stems = tree.internal_stems_for_test();
    assert_eq!(stems.len(), 1);
    let stem = stems[0].1.clone();
    assert!(stem.starts_with(b"tenant/table/00"), "{stem:?}");
    let mut probes: Vec<Vec<u8>> = [
        &b""[..],
        b"t",
        b"tenant/table",
        b"tenant/table/",
        b"tenant/table/0",
        b"tenant/tabld",
        b"tenant/table.",
        b"tenant/table/1",
        b"tenant/table0",
        b"tenant/tablf",
        b"u",
        b"\xff\xff",
    ]
    .iter()
    .map(|p| p.to_vec())
    .collect();
    // The stem itself, with a zero byte, shortened by one, one more byte each way, and
    // existing keys with their last digit moved.
    probes.push(stem.clone());
    let mut with_zero = stem.clone();
    with_zero.push(0);
    probes.push(with_zero);
    probes.push(stem[..stem.len() - 1].to_vec());
    let mut below = stem.clone();
    *below.last_mut().unwrap() -= 1;
    probes.push(below.clone());
    below.extend_from_slice(b"99999999");
    probes.push(below);
    let mut above = stem.clone();
    *above.last_mut().unwrap() += 1;
    probes.push(above);
    let keys: Vec<Vec<u8>> = model.keys().cloned().collect();
    for _ in 0..40 {
        let mut k = keys[rng.random_range(0..keys.len())].clone();
        match rng.random_range(0..3) {
            0 => *k.last_mut().unwrap() += 1,
            1 => {
                k.pop();
            }
            _ => k.push(b'5'),
        }
        probes.push(k);
    }
    let sealed = tree.seal();
    let (root, _) = ctx.persist(&tree, sealed);
    let disk = Tree::from_disk(REGION, root, TreeEpoch(2));
    for t in [&tree, &disk] {
        for p in &probes {
            assert_eq!(get(t, &ctx, None, p), model.get(p).copied(), "get {p:?}");
            let fwd: Vec<_> = model
                .range(p.clone()..)
                .map(|(k, &v)| (k.clone(), v))
                .collect();
            assert_eq!(scan_forward(t, &ctx, None, Some(p)), fwd, "from {p:?}");
            let bwd: Vec<_> = model
                .range(..p.clone())
                .rev()
                .map(|(k, &v)| (k.clone(), v))
                .collect();
            assert_eq!(scan_backward(t, &ctx, None, Some(p)), bwd, "before {p:?}");
        }
        // Keys outside the stem are placed by the stem alone.
        for p in [&b""[..], b"t", b"tenant/table/", b"u", b"\xff\xff"] {
            let (_, compares) = full_pivot_compares(|| get(t, &ctx, None, p));
            assert_eq!(compares, 0, "{p:?}");
        }
        assert_matches(t, &ctx, None, &model, &mut rng);
    }
}

/// 35,000 `key:%012d` keys interleaved with random keys (binary, short, a small alphabet
/// that ties often, and keys that share `key:` or `key:0000` only), some removed: the
/// stems shrink and regrow all the time. Everything must match a `BTreeMap`: gets,
/// ranges both ways from many seek points, the structural check, in memory and on disk,
/// and after more writes on the reopened tree.
/// Keys laid out as the server's collection sub-records (`R 'L' len key version index`):
/// 28 shared bytes, more than an internal node's stem holds, so internal pivots tie on
/// their prefix and `cmp_pivot` compares the bytes after it in chunks; the suffixes
/// differ in the first, second and third chunk, end early, or run past a chunk's end.
#[test]
fn keys_sharing_more_than_an_internal_stem_match_a_btreemap() {
    let mut rng = StdRng::seed_from_u64(31);
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    let shared: Vec<u8> = (0..28u8).map(|i| i.wrapping_mul(37) | 0x80).collect();
    for i in 0..12_000u64 {
        let mut k = shared.clone();
        match i % 5 {
            // A list's indexes: consecutive from the middle of the u64 range.
            0 | 1 => k.extend_from_slice(&((1u64 << 63) - i).to_be_bytes()),
            // Members: long, differing late, some prefixes of others.
            2 => {
                k.extend_from_slice(b"rec:00000000");
                k.extend_from_slice(format!("{:06}", rng.random_range(0..50_000)).as_bytes());
                k.truncate(28 + rng.random_range(8..=18));
            }
            3 => k.extend(
                (0..rng.random_range(0..30)).map(|_| b"\0\x01\xff"[rng.random_range(0..3)]),
            ),
            _ => k.truncate(rng.random_range(20..=28)),
        }
        put(&tree, &mut ctx, &mut model, &k);
    }
    for _ in 0..3000 {
        let nth = rng.random_range(0..model.len());
        let k = model.keys().nth(nth).cloned().unwrap();
        del(&tree, &ctx, &mut model, &k);
    }
    assert_matches(&tree, &ctx, None, &model, &mut rng);
    // And through disk images, whose key area is read by another view.
    let sealed = tree.seal();
    let (root, _) = ctx.persist(&tree, sealed);
    let disk = Tree::from_disk(REGION, root, TreeEpoch(2));
    assert_matches(&disk, &ctx, None, &model, &mut rng);
}

/// A list's elements under the server's 28-byte collection prefix (reserved tag, family,
/// key length, `mylist`, version) and an 8-byte index share 33 bytes or more one level up:
/// with stems of at most 24 bytes every pivot of the internal nodes above them had the
/// same prefix, and a lookup compared ~7 pivots past it at each such node (a third of
/// LPOP's index time). Stems past the header take their bytes from pivot 0.
#[test]
fn internal_stems_past_the_header_settle_collection_lookups_on_prefixes() {
    let mut rng = StdRng::seed_from_u64(32);
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    let element = |index: u64| {
        let mut k = b"\xff\xfftucana\x00L\x00\x00\x00\x06mylist".to_vec();
        k.extend_from_slice(&3u64.to_be_bytes());
        k.extend_from_slice(&index.to_be_bytes());
        k
    };
    let mut indexes: Vec<u64> = (0..60_000).map(|i| (1 << 63) - 30_000 + i).collect();
    indexes.shuffle(&mut rng);
    for &i in &indexes {
        put(&tree, &mut ctx, &mut model, &element(i));
    }
    let longest = tree
        .internal_stems_for_test()
        .iter()
        .map(|(_, stem)| stem.len())
        .max()
        .unwrap();
    assert!(longest > 24, "longest internal stem {longest} bytes");
    let per_get = full_pivot_compares(|| {
        for (k, &p) in &model {
            assert_eq!(get(&tree, &ctx, None, k), Some(p));
        }
    })
    .1 as f64
        / model.len() as f64;
    eprintln!("full pivot comparisons per get of a list element: {per_get:.3}");
    assert!(per_get < 0.5, "{per_get} full pivot comparisons per get");
    let sealed = tree.seal();
    let (root, _) = ctx.persist(&tree, sealed);
    let disk = Tree::from_disk(REGION, root, TreeEpoch(2));
    assert_matches(&disk, &ctx, None, &model, &mut rng);
    disk.check(&ctx, disk.root_word()).unwrap();
}

/// Stems past the header live in pivot 0, so every change of pivot 0 must keep one there
/// or cut the stem back to the header's 24 bytes: an EXTERNAL separator (a key over 256
/// bytes) arriving at index 0 of a node, pivot 0 removed with an EXTERNAL pivot after it
/// (pop from a list's head empties its first leaf), a split half whose first pivot is
/// EXTERNAL. Long keys, short ones and whole runs deleted from the front, with disk
/// round trips: everything must match a `BTreeMap` and pass the checker. (With this seed
/// each of the three cuts happens at least once: checked by instrumenting them.)
#[test]
fn long_internal_stems_survive_external_pivots_and_pruned_fronts() {
    let mut rng = StdRng::seed_from_u64(33);
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    let shared = b"\xff\xfftucana\x00Z\x00\x00\x00\x09rec-index\0\0\0\0\0\0\0\x05rec:0000000";
    // Long keys differ only past their 280th byte, so separators between them are
    // EXTERNAL (longer than 256 bytes).
    let key = |n: u64, long: Option<u64>| {
        let mut k = shared.to_vec();
        k.extend_from_slice(format!("{n:05}").as_bytes());
        if let Some(m) = long {
            k.extend(std::iter::repeat_n(b'x', 280));
            k.extend_from_slice(format!("{m:03}").as_bytes());
        }
        k
    };
    for round in 0..4u64 {
        for _ in 0..8_000 {
            let n = rng.random_range(0..2_000) * 50;
            let long = rng.random_ratio(1, 2).then(|| rng.random_range(0..400));
            put(&tree, &mut ctx, &mut model, &key(n, long));
        }
        // Empty the front: the first leaves go, and with them pivot 0 of their parents.
        let front: Vec<Vec<u8>> = model.keys().take(2_500).cloned().collect();
        for k in &front {
            del(&tree, &ctx, &mut model, k);
        }
        // And a scatter of removes elsewhere.
        for _ in 0..1_000 {
            let nth = rng.random_range(0..model.len());
            let k = model.keys().nth(nth).cloned().unwrap();
            del(&tree, &ctx, &mut model, &k);
        }
        assert_matches(&tree, &ctx, None, &model, &mut rng);
        tree.check(&ctx, tree.root_word()).unwrap();
        let sealed = tree.seal();
        let (root, _) = ctx.persist(&tree, sealed);
        let disk = Tree::from_disk(REGION, root, TreeEpoch(2 + round));
        assert_matches(&disk, &ctx, None, &model, &mut rng);
        disk.check(&ctx, disk.root_word()).unwrap();
    }
    let stems = tree.internal_stems_for_test();
    assert!(stems.iter().any(|(_, s)| s.len() > 24), "{stems:?}");
}

#[test]
fn tied_and_random_keys_interleaved_match_a_btreemap() {
    let mut rng = StdRng::seed_from_u64(25);
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    let mut tied = 0;
    let random_mix = |rng: &mut StdRng| -> Vec<u8> {
        match rng.random_range(0..5) {
            0 => {
                let mut k = rng.random::<u64>().to_be_bytes().to_vec();
                k.truncate(rng.random_range(1..=8));
                k
            }
            1 => random_key(rng, 12),
            2 => {
                let mut k = b"key:".to_vec();
                k.extend((0..rng.random_range(0..10)).map(|_| rng.random::<u8>()));
                k
            }
            3 => format!("key:0000{}", rng.random_range(0..100u32)).into_bytes(),
            _ => format!("key:{:012}", rng.random::<u64>() % 1_000_000_000_000).into_bytes(),
        }
    };
    while tied < 35_000 {
        if rng.random_bool(0.75) {
            put(
                &tree,
                &mut ctx,
                &mut model,
                &redis_key(rng.random_range(0..1_000_000)),
            );
            tied += 1;
        } else {
            let k = random_mix(&mut rng);
            put(&tree, &mut ctx, &mut model, &k);
        }
        if rng.random_bool(0.05) {
            let nth = rng.random_range(0..model.len());
            let k = model.keys().nth(nth).cloned().unwrap();
            del(&tree, &ctx, &mut model, &k);
        }
    }
    let seeks = |t: &Tree, ctx: &FakeCtx, model: &Model, rng: &mut StdRng| {
        let keys: Vec<&Vec<u8>> = model.keys().collect();
        for _ in 0..30 {
            let mut p = keys[rng.random_range(0..keys.len())].clone();
            match rng.random_range(0..4) {
                0 => p = random_mix(rng),
                1 => {
                    p.pop();
                }
                2 => p.push(0),
                _ => {}
            }
            let fwd: Vec<_> = model
                .range(p.clone()..)
                .map(|(k, &v)| (k.clone(), v))
                .collect();
            assert_eq!(scan_forward(t, ctx, None, Some(&p)), fwd, "from {p:?}");
            let bwd: Vec<_> = model
                .range(..p.clone())
                .rev()
                .map(|(k, &v)| (k.clone(), v))
                .collect();
            assert_eq!(scan_backward(t, ctx, None, Some(&p)), bwd, "before {p:?}");
            assert_eq!(get(t, ctx, None, &p), model.get(&p).copied());
        }
    };
    assert_matches(&tree, &ctx, None, &model, &mut rng);
    seeks(&tree, &ctx, &model, &mut rng);
    let report = tree.check(&ctx, tree.root_word()).unwrap();
    assert!(report.height >= 3 && report.internal_stem_bytes > 0);
    let sealed = tree.seal();
    let (root, _) = ctx.persist(&tree, sealed);
    let disk = Tree::from_disk(REGION, root, TreeEpoch(2));
    assert_matches(&disk, &ctx, None, &model, &mut rng);
    seeks(&disk, &ctx, &model, &mut rng);
    for _ in 0..5000 {
        let k = if rng.random_bool(0.5) {
            redis_key(rng.random_range(0..1_000_000))
        } else {
            random_mix(&mut rng)
        };
        put(&disk, &mut ctx, &mut model, &k);
    }
    assert_matches(&disk, &ctx, None, &model, &mut rng);
    seeks(&disk, &ctx, &model, &mut rng);
}

/// An internal node image whose stem is impossible (longer than 24 bytes, non-zero past
/// its length) or does not fit its pivots (a pivot not starting with it, or shorter), with
/// its checksum re-stamped so only the stem is wrong: reading through it is a corruption
/// error or (for damage a lookup cannot see) an answer, never a panic; copying it on write
/// and `check` always report it.
#[test]
fn damaged_internal_stems_are_corruption_not_a_panic() {
    let mut rng = StdRng::seed_from_u64(26);
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    for _ in 0..30_000 {
        put(
            &tree,
            &mut ctx,
            &mut model,
            &redis_key(rng.random_range(0..1_000_000)),
        );
    }
    let sealed = tree.seal();
    let (root, _) = ctx.persist(&tree, sealed);
    let clean = ctx.images.clone();
    let internal: Vec<u64> = clean
        .iter()
        .filter(|(_, img)| image_kind_and_stem_len(&img[..]).0 == 2)
        .map(|(&off, _)| off)
        .collect();
    assert!(internal.len() >= 2 && internal.contains(&root.0));
    let probe: Vec<Vec<u8>> = model.keys().step_by(37).cloned().collect();
    // Header word 5 starts the stem (byte 40); word 1's top 16 bits are its length.
    const STEM_AT: usize = 40;
    type Damage = fn(&mut [u8], usize) -> bool;
    let damages: [(&str, bool, Damage); 6] = [
        ("stem of 25 bytes", true, |img, _| {
            img[14..16].copy_from_slice(&25u16.to_le_bytes());
            true
        }),
        ("stem of 65535 bytes", true, |img, _| {
            img[14..16].copy_from_slice(&u16::MAX.to_le_bytes());
            true
        }),
        (
            "stem one byte shorter (a byte left past it)",
            true,
            |img, len| {
                img[14..16].copy_from_slice(&(len as u16 - 1).to_le_bytes());
                true
            },
        ),
        ("a stem byte past the 8th changed", false, |img, len| {
            img[STEM_AT + len - 1] ^= 0x40;
            len > 8
        }),
        ("stem one zero byte longer", false, |img, len| {
            img[14..16].copy_from_slice(&(len as u16 + 1).to_le_bytes());
            len >= 8
        }),
        ("a pivot shorter than the stem", false, |img, len| {
            // Pivot 0's descriptor (at 2120): length in its low 32 bits.
            img[2120..2124].copy_from_slice(&(len as u32 - 1).to_le_bytes());
            true
        }),
    ];
    for (name, header_damage, damage) in damages {
        let mut damaged = 0;
        for &off in &internal {
            let mut img = clean[&off].clone();
            let (_, len) = image_kind_and_stem_len(&img[..]);
            if len == 0 || !damage(&mut img[..], len) {
                continue;
            }
            damaged += 1;
            restamp(&mut img[..]);
            ctx.images = clean.clone();
            ctx.images.insert(off, img);
            let disk = Tree::from_disk(REGION, root, TreeEpoch(2));
            let mut errors = 0;
            for k in &probe {
                match disk.get(&ctx, None, k, &crossbeam_epoch::pin()) {
                    Ok(found) => {
                        // A stem the header cannot tell from a sound one may misroute.
                        assert!(!header_damage || found == model.get(k).copied(), "{name}");
                    }
                    Err(Error::Corruption { offset, .. }) => {
                        assert_eq!(offset.0, off, "{name}");
                        errors += 1;
                    }
                    Err(e) => panic!("{name}: unexpected error {e}"),
                }
            }
            if header_damage && off == root.0 {
                assert_eq!(errors, probe.len(), "{name}: every lookup passes the root");
            }
            assert!(
                matches!(
                    disk.check(&ctx, disk.root_word()),
                    Err(Error::Corruption { .. })
                ),
                "{name}: check missed it"
            );
            assert!(
                matches!(
                    super::verify_image(&ctx.images[&off][..], DiskOffset(off), REGION),
                    Err(Error::Corruption { .. })
                ),
                "{name}: verify_image missed it"
            );
            // A write through the node copies it, which verifies it completely.
            let mut wrote_through = false;
            for k in &probe {
                match disk.insert(&ctx, k, model[k]) {
                    Ok(old) => assert_eq!(old, Some(model[k]), "{name}"),
                    Err(Error::Corruption { offset, .. }) => {
                        assert_eq!(offset.0, off, "{name}");
                        wrote_through = true;
                    }
                    Err(e) => panic!("{name}: unexpected error {e}"),
                }
            }
            assert!(wrote_through, "{name}: no write passed the damaged node");
        }
        assert!(damaged >= 2, "{name}: damaged {damaged} nodes");
    }
}

// ---------------------------------------------------------------------------------------
// Fingers: a batch's writes in the leaf the previous one reached.

/// A list element's key as the server lays it out: a shared 30-byte beginning, then the
/// element's index (8 bytes, big-endian).
fn list_key(index: u64) -> Vec<u8> {
    let mut k =
        b"\xff\xfftucana\x00L\x00\x00\x00\x06mylist\x00\x00\x01\x02\x03\x04\x05\x06".to_vec();
    k.extend_from_slice(&index.to_be_bytes());
    k
}

fn put_near(tree: &Tree, finger: &mut Finger, ctx: &mut FakeCtx, model: &mut Model, key: &[u8]) {
    let ptr = ctx.add(key);
    let old = tree.insert_near(ctx, finger, key, ptr).unwrap();
    assert_eq!(old, model.insert(key.to_vec(), ptr), "insert_near {key:?}");
}

fn del_near(tree: &Tree, finger: &mut Finger, ctx: &FakeCtx, model: &mut Model, key: &[u8]) {
    let old = tree.remove_near(ctx, finger, key).unwrap();
    assert_eq!(old, model.remove(key), "remove_near {key:?}");
}

#[test]
fn a_run_of_pushes_and_pops_in_one_leaf_descends_once() {
    // A list of 10,000 elements among 20,000 other keys: a run of 16 pushes at its head
    // (each a new smallest element, below every entry of the leaf but inside its fences)
    // and then 16 pops from the head each land in the leaf the first one reached.
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    let mut rng = StdRng::seed_from_u64(0xf1);
    for i in 0..20_000u64 {
        put(&tree, &mut ctx, &mut model, &redis_key(i));
    }
    let head = 1u64 << 63;
    for i in 0..10_000 {
        put(&tree, &mut ctx, &mut model, &list_key(head + i));
    }
    let mut finger = Finger::default();
    for i in 1..=16 {
        put_near(
            &tree,
            &mut finger,
            &mut ctx,
            &mut model,
            &list_key(head - i),
        );
    }
    assert_eq!((finger.descents(), finger.hits()), (1, 15));
    let mut finger = Finger::default();
    for i in 0..16 {
        del_near(
            &tree,
            &mut finger,
            &ctx,
            &mut model,
            &list_key(head - 16 + i),
        );
    }
    assert_eq!((finger.descents(), finger.hits()), (1, 15));
    // A key of another leaf descends again; an absent key inside the leaf is absent.
    let mut finger = Finger::default();
    del_near(&tree, &mut finger, &ctx, &mut model, &list_key(head + 5));
    del_near(&tree, &mut finger, &ctx, &mut model, &list_key(head + 5));
    assert_eq!((finger.descents(), finger.hits()), (1, 1));
    del_near(&tree, &mut finger, &ctx, &mut model, &redis_key(7));
    assert_eq!(finger.descents(), 2);
    assert_matches(&tree, &ctx, None, &model, &mut rng);
}

#[test]
fn a_finger_goes_stale_at_a_seal_and_never_writes_a_sealed_node() {
    // A finger names nodes of the running epoch; after a seal they belong to a sealed
    // tree that readers and the commit may hold, so a write through the old finger would
    // change a snapshot. The seal is a change of shape: the next write descends (and
    // copies its path), and the sealed root still reads the state of the seal.
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    let mut rng = StdRng::seed_from_u64(0xf2);
    for i in 0..3_000u64 {
        put(&tree, &mut ctx, &mut model, &list_key(i * 2));
    }
    let mut finger = Finger::default();
    put_near(&tree, &mut finger, &mut ctx, &mut model, &list_key(101));
    let sealed_model = model.clone();
    let sealed = tree.seal();
    put_near(&tree, &mut finger, &mut ctx, &mut model, &list_key(103));
    del_near(&tree, &mut finger, &ctx, &mut model, &list_key(104));
    assert_eq!((finger.descents(), finger.hits()), (2, 1));
    assert_matches(&tree, &ctx, Some(sealed.root), &sealed_model, &mut rng);
    assert_matches(&tree, &ctx, None, &model, &mut rng);
}

#[test]
fn batches_through_fingers_match_a_btreemap() {
    // Random batches of sorted runs (list pushes at either end, pops), random keys and
    // removes of present and absent keys, each batch with its own finger, with seals
    // inside batches and leaves split and emptied by the writes: every answer and the
    // whole tree must match the model, and most run writes must skip the descent.
    let mut rng = StdRng::seed_from_u64(0xf3);
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    let (mut head, mut tail) = (1u64 << 40, 1u64 << 40);
    let (mut hits, mut descents) = (0, 0);
    for batch in 0..3_000u32 {
        let mut finger = Finger::default();
        // Mostly one kind of write per batch, as a server's run is, with strays.
        let kind = rng.random_range(0..10);
        for _ in 0..rng.random_range(1..=24) {
            let this = if rng.random_bool(0.8) {
                kind
            } else {
                rng.random_range(0..10)
            };
            match this {
                0..=2 => {
                    head -= 1;
                    put_near(&tree, &mut finger, &mut ctx, &mut model, &list_key(head));
                }
                3..=4 => {
                    put_near(&tree, &mut finger, &mut ctx, &mut model, &list_key(tail));
                    tail += 1;
                }
                5..=6 if head < tail => {
                    del_near(&tree, &mut finger, &ctx, &mut model, &list_key(head));
                    head += 1;
                }
                7 => {
                    let key = random_key(&mut rng, 12);
                    put_near(&tree, &mut finger, &mut ctx, &mut model, &key);
                }
                8 => {
                    let key = random_key(&mut rng, 12);
                    del_near(&tree, &mut finger, &ctx, &mut model, &key);
                }
                _ => {
                    let at = rng.random_range(head.saturating_sub(4)..tail + 4);
                    del_near(&tree, &mut finger, &ctx, &mut model, &list_key(at));
                }
            }
            if rng.random_bool(0.01) {
                tree.seal();
            }
        }
        hits += finger.hits();
        descents += finger.descents();
        if batch % 1_000 == 999 {
            assert_matches(&tree, &ctx, None, &model, &mut rng);
        }
    }
    assert_matches(&tree, &ctx, None, &model, &mut rng);
    assert!(
        hits > descents,
        "{hits} writes through fingers, {descents} descents"
    );
}

/// Between two batches of a model test of runs: a seal now and then (a change of shape
/// for the next batch's finger), and every 500 batches the whole tree against the model.
fn seal_or_check(tree: &Tree, ctx: &FakeCtx, model: &Model, rng: &mut StdRng, batch: u32) {
    if rng.random_bool(0.05) {
        tree.seal();
    }
    if batch % 500 == 499 {
        assert_matches(tree, ctx, None, model, rng);
    }
}

#[test]
fn runs_of_removes_leave_together_and_match_a_btreemap() {
    // `remove_run_near` takes keys that are neighbouring entries of the finger's leaf in
    // one shift. Runs here are a list's pops from its head (often more than a leaf holds,
    // so leaves empty and are pruned mid-run), with absent keys, a key given twice, keys
    // out of order and keys of other leaves mixed in, and seals between batches: every
    // answer and the whole tree must match the model.
    let mut rng = StdRng::seed_from_u64(0xf6);
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    for i in 0..5_000u64 {
        put(&tree, &mut ctx, &mut model, &redis_key(i));
    }
    let mut tail = 0u64;
    let mut head = 0u64;
    for batch in 0..2_000u32 {
        // Pushes at the tail keep the list long enough to pop from.
        let mut finger = Finger::default();
        for _ in 0..rng.random_range(0..=300) {
            put_near(&tree, &mut finger, &mut ctx, &mut model, &list_key(tail));
            tail += 1;
        }
        let mut keys = Vec::new();
        for _ in 0..rng.random_range(1..=250) {
            match rng.random_range(0..20) {
                0 => keys.push(list_key(head + rng.random_range(0..5))), // ahead, or twice
                1 => keys.push(list_key(head.saturating_sub(3))),        // popped before
                2 => keys.push(redis_key(rng.random_range(0..6_000))),
                _ => {
                    keys.push(list_key(head));
                    head += 1;
                }
            }
        }
        let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let mut olds = vec![Some(u64::MAX); keys.len()];
        let mut finger = Finger::default();
        tree.remove_run_near(&ctx, &mut finger, &keys, &mut olds)
            .unwrap();
        for (key, old) in keys.iter().zip(&olds) {
            assert_eq!(*old, model.remove(*key), "remove_run_near {key:?}");
        }
        seal_or_check(&tree, &ctx, &model, &mut rng, batch);
    }
    assert_matches(&tree, &ctx, None, &model, &mut rng);
}

#[test]
fn runs_of_inserts_go_in_together_and_match_a_btreemap() {
    // `insert_run_near` puts new keys that fall into one gap of the finger's leaf in with
    // one shift. Batches here are a list's pushes at its head (sorted ascending, as a
    // batch is, each below every element), appends at its tail (the gap at a leaf's end,
    // where the next key may belong to the next leaf), updates of present keys and
    // random keys mixed in, runs longer than a leaf holds, and seals between batches:
    // every answer and the whole tree must match the model.
    let mut rng = StdRng::seed_from_u64(0xf7);
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    for i in 0..5_000u64 {
        put(&tree, &mut ctx, &mut model, &redis_key(i * 2));
    }
    let (mut head, mut tail) = (1u64 << 40, 1u64 << 40);
    for batch in 0..1_500u32 {
        let mut keys = Vec::new();
        let pushes = rng.random_range(1..=250);
        match rng.random_range(0..3) {
            0 => {
                head -= pushes;
                keys.extend((head..head + pushes).map(list_key));
            }
            1 => {
                keys.extend((tail..tail + pushes).map(list_key));
                tail += pushes;
            }
            _ => keys.extend((0..pushes).map(|_| redis_key(rng.random_range(0..11_000)))),
        }
        for _ in 0..rng.random_range(0..4) {
            let stray = match rng.random_range(0..3) {
                0 => list_key(rng.random_range(head..tail.max(head + 1))),
                1 => redis_key(rng.random_range(0..11_000)),
                _ => random_key(&mut rng, 12),
            };
            keys.insert(rng.random_range(0..=keys.len()), stray);
        }
        let ptrs: Vec<u64> = keys.iter().map(|k| ctx.add(k)).collect();
        let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let mut olds = vec![Some(u64::MAX); keys.len()];
        let mut finger = Finger::default();
        tree.insert_run_near(&ctx, &mut finger, &keys, &ptrs, &mut olds)
            .unwrap();
        for ((key, ptr), old) in keys.iter().zip(&ptrs).zip(&olds) {
            assert_eq!(
                *old,
                model.insert(key.to_vec(), *ptr),
                "insert_run_near {key:?}"
            );
        }
        seal_or_check(&tree, &ctx, &model, &mut rng, batch);
    }
    assert_matches(&tree, &ctx, None, &model, &mut rng);
}

#[test]
fn a_remove_of_an_absent_key_leaves_the_finger_whole() {
    // The first version of `remove_near` lent the finger's path to the descent and took
    // it back only when the descent moved the finger. A remove of an absent key in
    // another leaf returns after the probe, before the descent: the finger kept its leaf
    // but lost its path, so it looked like a finger at a root leaf, every later key of the
    // batch "fell in its range", and a remove of a present key in a third leaf answered
    // absent (found by `batches_through_fingers_match_a_btreemap`).
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    let mut rng = StdRng::seed_from_u64(0xf4);
    for i in 0..20_000u64 {
        put(&tree, &mut ctx, &mut model, &redis_key(i));
    }
    let mut finger = Finger::default();
    put_near(&tree, &mut finger, &mut ctx, &mut model, &redis_key(20_000));
    del_near(&tree, &mut finger, &ctx, &mut model, b"key:000000010000x");
    del_near(&tree, &mut finger, &ctx, &mut model, &redis_key(3));
    del_near(&tree, &mut finger, &ctx, &mut model, &redis_key(4));
    assert_eq!((finger.descents(), finger.hits()), (3, 1));
    assert_matches(&tree, &ctx, None, &model, &mut rng);
}

#[test]
fn a_remove_copies_nothing_for_an_absent_key_behind_sealed_nodes() {
    // A remove searches a path already written since the last seal once, with no probe
    // first (nothing there needs a copy); a path with a sealed node on it is probed first,
    // so an absent key still copies nothing. Both answer as the model does.
    let tree = Tree::new(REGION, TreeEpoch(1));
    let mut ctx = FakeCtx::default();
    let mut model = Model::new();
    let mut rng = StdRng::seed_from_u64(0xf5);
    for i in 0..20_000u64 {
        put(&tree, &mut ctx, &mut model, &redis_key(i * 2));
    }
    tree.seal();
    assert_eq!(tree.dirty_nodes(), 0);
    del(&tree, &ctx, &mut model, &redis_key(3));
    assert_eq!(
        tree.dirty_nodes(),
        0,
        "an absent key behind sealed nodes copied them"
    );
    del(&tree, &ctx, &mut model, &redis_key(4));
    let copied = tree.dirty_nodes();
    assert!(copied >= 2, "the path to a present key is copied");
    del(&tree, &ctx, &mut model, &redis_key(5));
    del(&tree, &ctx, &mut model, &redis_key(6));
    assert_eq!(
        tree.dirty_nodes(),
        copied,
        "a written path is not copied again"
    );
    assert_matches(&tree, &ctx, None, &model, &mut rng);
}
