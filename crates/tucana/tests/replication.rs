//! Replication at the engine level (DESIGN.md, "Replication"): a primary database and a
//! backup database in one process, joined by a test link that does what the network
//! shipper does (log bytes by segment order, then each commit's delta) without a network.
//! At every shipped commit the backup's replica holds exactly what the primary held at
//! that commit, and passes `check`; a promoted replica holds everything shipped, commits
//! and replays included.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;
use proptest::prelude::*;
use tucana::replication::{
    CommitDelta, CommitObserver, Delta, FoldedCommits, ReplicaHandle, ShipSegment, ShipSource,
};
use tucana::volume::MemStorage;
use tucana::{Database, Options};

/// Collects every commit's delta, as a shipper's observer does.
#[derive(Default)]
struct Deltas(Mutex<Vec<CommitDelta>>);

impl CommitObserver for Deltas {
    fn committed(&self, delta: CommitDelta) {
        self.0.lock().push(delta);
    }
}

fn options() -> Options {
    Database::builder()
        .commit_interval(None)
        .flush_interval(None)
        .log_segment_bytes(64 << 10)
}

/// A primary and a backup of its keyspace `NAME`, and what has been shipped.
struct Link {
    primary: Database,
    deltas: Arc<Deltas>,
    backup_storage: Arc<MemStorage>,
    backup: Database,
    /// The primary's commit epochs the backup applied, in order.
    applied: Vec<u64>,
    /// Commits not applied yet, folded to go as one delta with the next applied one.
    folded: FoldedCommits,
    /// The term the primary ships at.
    term: u64,
}

const NAME: &str = "t";

/// Ships the bytes of `seg` from `from` to its ready end into `replica`, as the network
/// shipper's log frames do.
fn ship_segment(source: &ShipSource, replica: &ReplicaHandle, seg: &ShipSegment, from: u64) {
    let mut bytes = vec![0u8; (seg.ready_bytes - from) as usize];
    source.read(seg.base, from, &mut bytes).unwrap();
    replica
        .write_log(seg.base, seg.size_bytes, seg.order, from, &bytes)
        .unwrap();
}

impl Link {
    fn new() -> Link {
        let primary = options().open_in_memory().unwrap();
        primary.keyspace(NAME).unwrap();
        Link::from_primary(primary, 1)
    }

    /// A link from `primary`, which holds keyspace `NAME` below `term`, to a new backup
    /// (its first commit goes in full), shipping at `term`.
    fn from_primary(primary: Database, term: u64) -> Link {
        let deltas = Arc::new(Deltas::default());
        primary.set_commit_observer(Some(deltas.clone()));
        let source = primary.ship_source(NAME).unwrap();
        source.raise_term(term);
        let backup_storage = Arc::new(MemStorage::new());
        let backup = options().open_storage(backup_storage.clone()).unwrap();
        backup.replica(NAME, source.seed(), term).unwrap();
        Link {
            primary,
            deltas,
            backup_storage,
            backup,
            applied: Vec::new(),
            folded: FoldedCommits::default(),
            term,
        }
    }

    fn replica(&self) -> ReplicaHandle {
        self.backup.open_replica(NAME).unwrap()
    }

    /// Ships every log byte the backup lacks, then sets the primary's ship horizon: the
    /// lowest order of a segment still open or not shipped entirely, or any new one.
    fn ship_log(&self) {
        let source = self.primary.ship_source(NAME).unwrap();
        let replica = self.replica();
        // By order, not by offset: the primary reuses a retired segment's offset, and a
        // backup holds its copy of the retired one until a commit it applies says so.
        let have: HashMap<u64, u64> = replica
            .state()
            .segments
            .iter()
            .map(|(order, _, got)| (*order, *got))
            .collect();
        let segments = source.segments(0, usize::MAX);
        let mut horizon = segments.iter().map(|s| s.order + 1).max().unwrap_or(0);
        for seg in &segments {
            let from = have.get(&seg.order).copied().unwrap_or(0);
            if seg.ready_bytes > from {
                ship_segment(&source, &replica, seg, from);
            }
            if seg.open {
                horizon = horizon.min(seg.order);
            }
        }
        source.set_horizon(horizon);
    }

    /// Applies every commit the primary made since the last call (a full index first
    /// when the backup's node map is not current), one by one, or, with `fold`, folds
    /// them into `folded` without applying anything.
    fn take_commits(&mut self, fold: bool) {
        self.ship_log();
        let replica = self.replica();
        let deltas = std::mem::take(&mut *self.deltas.0.lock());
        for commit in deltas {
            let Some(region) = commit.regions.into_iter().find(|r| r.desc.name == NAME) else {
                continue;
            };
            if !replica.state().node_map_current {
                self.apply_full();
                continue;
            }
            if self.applied.last().is_some_and(|e| commit.epoch.0 <= *e) {
                continue;
            }
            if fold || !self.folded.is_empty() {
                self.folded.fold(
                    commit.epoch.0,
                    region.desc,
                    region.next_order,
                    region.nodes.into_iter().map(|(off, _)| off),
                    region.released_nodes,
                );
                continue;
            }
            replica
                .apply(Delta {
                    term: self.term,
                    upstream_epoch: commit.epoch.0,
                    full: false,
                    desc: region.desc,
                    next_order: region.next_order,
                    nodes: region.nodes,
                    released_nodes: region.released_nodes,
                })
                .unwrap();
            self.applied.push(commit.epoch.0);
        }
        if !fold && !self.folded.is_empty() {
            self.apply_folded();
        }
    }

    fn apply_commits(&mut self) {
        self.take_commits(false);
    }

    /// Applies the folded commits as one delta, read at the newest of them.
    fn apply_folded(&mut self) {
        let source = self.primary.ship_source(NAME).unwrap();
        let pinned = source.pin_newest_commit().unwrap().expect("a commit");
        let delta = self.folded.delta(&pinned, self.term).unwrap();
        self.folded = FoldedCommits::default();
        self.replica().apply(delta).unwrap();
        self.applied.push(pinned.epoch);
    }

    /// Commits the primary and ships the log, but folds the commit instead of applying it:
    /// the backup stays at its last applied commit.
    fn commit_folded(&mut self) {
        self.primary.commit().unwrap();
        self.take_commits(true);
    }

    /// Ships the primary's newest commit in full.
    fn apply_full(&mut self) {
        let source = self.primary.ship_source(NAME).unwrap();
        let pinned = source
            .pin_newest_commit()
            .unwrap()
            .expect("a commit lists the keyspace");
        let mut nodes = Vec::new();
        pinned
            .for_each_node(&mut |off, image| {
                nodes.push((off, image));
                Ok(())
            })
            .unwrap();
        self.ship_log();
        self.folded = FoldedCommits::default();
        self.replica()
            .apply(Delta {
                term: self.term,
                upstream_epoch: pinned.epoch,
                full: true,
                desc: pinned.desc.clone(),
                next_order: pinned.next_order,
                nodes,
                released_nodes: Vec::new(),
            })
            .unwrap();
        self.applied.push(pinned.epoch);
    }

    fn primary_contents(&self) -> BTreeMap<Vec<u8>, Vec<u8>> {
        contents(&self.primary.keyspace(NAME).unwrap())
    }

    fn replica_contents(&self) -> BTreeMap<Vec<u8>, Vec<u8>> {
        let mut out = BTreeMap::new();
        self.replica()
            .for_each(&mut |k, v| {
                out.insert(k.to_vec(), v.to_vec());
            })
            .unwrap();
        out
    }

    /// Commits the primary, ships and applies: the replica must now hold what the
    /// primary holds, and both volumes pass `check`.
    fn commit_and_compare(&mut self) {
        self.primary.commit().unwrap();
        let expected = self.primary_contents();
        self.apply_commits();
        assert_eq!(
            self.replica_contents(),
            expected,
            "replica after commit {:?}",
            self.applied.last()
        );
        self.backup.check().unwrap();
        self.primary.check().unwrap();
    }

    /// Reopens the backup as after a crash of its process (nothing it did not commit).
    fn crash_backup(&mut self) {
        let backup = std::mem::replace(&mut self.backup, options().open_in_memory().unwrap());
        backup.abandon();
        self.backup = options().open_storage(self.backup_storage.clone()).unwrap();
    }
}

/// Every pair of keyspace `ks`.
fn contents(ks: &tucana::Keyspace) -> BTreeMap<Vec<u8>, Vec<u8>> {
    ks.range::<&[u8], _>(..).map(|kv| kv.unwrap()).collect()
}

fn key(i: u32) -> Vec<u8> {
    format!("key{i:06}").into_bytes()
}

#[test]
fn a_backup_mirrors_every_shipped_commit_and_a_promoted_one_has_every_shipped_write() {
    let mut link = Link::new();
    let ks = link.primary.keyspace(NAME).unwrap();
    for round in 0..6u32 {
        for i in 0..3000u32 {
            if (i + round) % 7 == 0 {
                ks.delete(&key(i)).unwrap();
            } else {
                ks.put(&key(i), format!("value {round} {i}").repeat(3).as_bytes())
                    .unwrap();
            }
        }
        link.commit_and_compare();
        if round == 3 {
            link.primary.gc().unwrap();
            link.commit_and_compare();
        }
    }
    // Writes after the last commit reach the backup as log only; promotion replays them.
    for i in 0..500u32 {
        ks.put(&key(i), b"after the last commit").unwrap();
    }
    link.ship_log();
    let expected = link.primary_contents();
    let (promoted, replay) = link.replica().promote_reporting(2).unwrap();
    let got = contents(&promoted);
    assert_eq!(got, expected);
    assert_eq!(promoted.term(), 2);
    // Replay read every write after the last commit and stopped where the log ends
    // (zeroes, or bytes of the copy's space that are not a record).
    use tucana::replication::ReplayStop;
    assert!(
        matches!(
            replay.stop,
            ReplayStop::EndOfLog | ReplayStop::Invalid | ReplayStop::BadRecord { .. }
        ),
        "{replay}"
    );
    assert!(replay.records >= 500, "{replay}");
    assert_eq!(replay.unreplayed_bytes, 0, "{replay}");
    promoted.put(b"written on the new primary", b"x").unwrap();
    link.backup.check().unwrap();
    // The promoted keyspace is an ordinary one across a reopen.
    drop(promoted);
    link.backup.close().unwrap();
    let reopened = options().open_storage(link.backup_storage.clone()).unwrap();
    let ks = reopened.open_keyspace(NAME).unwrap();
    assert_eq!(
        ks.get(b"written on the new primary").unwrap().as_deref(),
        Some(&b"x"[..])
    );
    assert_eq!(ks.len(), expected.len() as u64 + 1);
    reopened.check().unwrap();
}

#[test]
fn a_restarted_backup_takes_a_full_index_and_carries_on() {
    let mut link = Link::new();
    let ks = link.primary.keyspace(NAME).unwrap();
    for i in 0..4000u32 {
        ks.put(&key(i), &[1; 100]).unwrap();
    }
    link.commit_and_compare();
    link.crash_backup();
    assert!(!link.replica().state().node_map_current);
    for i in (0..4000u32).step_by(3) {
        ks.put(&key(i), &[2; 100]).unwrap();
    }
    link.commit_and_compare();
    assert!(link.replica().state().node_map_current);
    for i in (0..4000u32).step_by(5) {
        ks.delete(&key(i)).unwrap();
    }
    link.commit_and_compare();
}

#[test]
fn a_promoted_backup_ships_to_a_new_backup_without_leaking_its_blocks() {
    let mut link = Link::new();
    let ks = link.primary.keyspace(NAME).unwrap();
    for round in 0..4u32 {
        for i in 0..3000u32 {
            ks.put(&key(i), format!("value {round} {i}").repeat(3).as_bytes())
                .unwrap();
        }
        link.commit_and_compare();
    }
    for i in 0..500u32 {
        ks.put(&key(i), b"after the last commit").unwrap();
    }
    link.ship_log();
    let promoted = link.replica().promote(2).unwrap();
    drop(promoted);
    link.backup.check().unwrap();
    let mut second = Link::from_primary(link.backup, 10);
    let ks = second.primary.open_keyspace(NAME).unwrap();
    for round in 0..12u32 {
        for i in 0..3000u32 {
            if (i * 7 + round) % 11 == 0 {
                ks.delete(&key(i)).unwrap();
            } else {
                ks.put(
                    &key(i),
                    format!("second {round} {i}")
                        .repeat(1 + (round as usize % 3))
                        .as_bytes(),
                )
                .unwrap();
            }
        }
        if round % 3 == 1 {
            second.ship_log();
            second.primary.gc().unwrap();
        }
        if round % 4 == 2 {
            second.commit_folded();
        } else {
            second.commit_and_compare();
        }
    }
    second.commit_and_compare();
    let promoted = second.replica().promote(20).unwrap();
    drop(promoted);
    second.backup.check().unwrap();
}

/// One step of a random workload.
#[derive(Clone, Debug)]
enum Step {
    Put(u16, u8),
    Delete(u16),
    Batch(Vec<(u16, Option<u8>)>),
    Commit,
    /// A commit the backup is not sent yet (folded into the next one it is sent).
    FoldedCommit,
    Gc,
    CrashBackup,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        20 => (any::<u16>(), any::<u8>()).prop_map(|(k, v)| Step::Put(k % 2000, v)),
        6 => any::<u16>().prop_map(|k| Step::Delete(k % 2000)),
        3 => proptest::collection::vec((any::<u16>(), proptest::option::of(any::<u8>())), 1..20)
            .prop_map(|ops| Step::Batch(ops.into_iter().map(|(k, v)| (k % 2000, v)).collect())),
        2 => Just(Step::Commit),
        2 => Just(Step::FoldedCommit),
        1 => Just(Step::Gc),
        1 => Just(Step::CrashBackup),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    /// Random operations with random commit points (some folded into later ones),
    /// garbage collection and backup restarts: at every applied commit the replica equals
    /// the primary and both pass `check`; promoted at the end, from its last applied
    /// commit or from one several commits and GC passes old (`fold_tail`), it holds
    /// everything shipped.
    #[test]
    fn replicas_equal_their_primary_at_every_shipped_commit(
        steps in proptest::collection::vec(step(), 1..120),
        fold_gc in any::<bool>(),
        fold_tail in any::<bool>(),
    ) {
        let mut link = Link::new();
        let ks = link.primary.keyspace(NAME).unwrap();
        let value = |k: u16, v: u8| vec![v; 20 + (k as usize * 7) % 300];
        for (n, step) in steps.into_iter().enumerate() {
            match step {
                Step::Put(k, v) => ks.put(&key(k.into()), &value(k, v)).unwrap(),
                Step::Delete(k) => {
                    ks.delete(&key(k.into())).unwrap();
                }
                Step::Batch(ops) => {
                    let mut batch = ks.batch();
                    for (k, v) in ops {
                        match v {
                            Some(v) => batch.put(&key(k.into()), &value(k, v)),
                            None => batch.delete(&key(k.into())),
                        };
                    }
                    batch.commit().unwrap();
                }
                Step::Commit => link.commit_and_compare(),
                Step::FoldedCommit => link.commit_folded(),
                Step::Gc => {
                    link.ship_log();
                    link.primary.gc().unwrap();
                    if fold_gc {
                        link.commit_folded();
                    } else {
                        link.commit_and_compare();
                    }
                }
                Step::CrashBackup => link.crash_backup(),
            }
            if n % 16 == 15 {
                // Bulk so that segments fill and switch between commits.
                for i in 0..300u32 {
                    ks.put(&key(i * 7 % 2000), &[n as u8; 150]).unwrap();
                }
                link.ship_log();
            }
        }
        // A backup promotes from a commit it applied: a new one gets its first in full.
        if fold_tail && !link.applied.is_empty() {
            link.commit_folded();
        } else {
            link.commit_and_compare();
        }
        for i in 0..50u32 {
            ks.put(&key(i), b"shipped as log only").unwrap();
        }
        link.ship_log();
        let expected = link.primary_contents();
        let promoted = link.replica().promote(2).unwrap();
        let got: BTreeMap<Vec<u8>, Vec<u8>> =
            promoted.range::<&[u8], _>(..).map(|kv| kv.unwrap()).collect();
        prop_assert_eq!(got, expected);
        link.backup.check().unwrap();
    }
}

/// The story (the fault campaign, M10, seed 11: 4,515 acknowledged writes lost, twice): a
/// backup whose primary folded its commits applied none for seconds, while the primary's
/// garbage collection freed log segments and new segments took their space. Promotion
/// replays the log received since the last applied commit, following each LINK record
/// to the copy of the segment it names by the primary's offset; where two segments of
/// that window had the same offset it took the newest copy, whose first record is out of
/// sequence, and replay stopped there: every write after it was gone. A link leads to
/// the copy whose first record follows in sequence.
#[test]
fn promotion_replays_past_segments_whose_space_the_primary_reused() {
    let mut link = Link::new();
    let ks = link.primary.keyspace(NAME).unwrap();
    for i in 0..3000u32 {
        ks.put(&key(i), b"first").unwrap();
    }
    link.commit_and_compare();
    // Every round overwrites every key (the segments before it become garbage); GC frees
    // them and the next round's segments take their space; no commit is applied.
    let mut reused = false;
    for round in 0..8u32 {
        for i in 0..3000u32 {
            ks.put(&key(i), format!("round {round} {i}").as_bytes())
                .unwrap();
        }
        link.commit_folded();
        link.primary.gc().unwrap();
        link.take_commits(true);
        let mut origins: Vec<u64> = link
            .replica()
            .state()
            .segments
            .iter()
            .map(|(_, origin, _)| origin.0)
            .collect();
        let copies = origins.len();
        origins.sort_unstable();
        origins.dedup();
        reused |= origins.len() < copies;
    }
    assert!(
        reused,
        "no segment's space was reused while commits were folded: the test shows nothing"
    );
    for i in 0..100u32 {
        ks.put(&key(i), b"after the last commit").unwrap();
    }
    link.ship_log();
    let expected = link.primary_contents();
    let promoted = link.replica().promote(2).unwrap();
    let got = contents(&promoted);
    assert_eq!(got.len(), expected.len());
    assert!(
        got == expected,
        "the promoted region lacks writes it had received"
    );
    link.backup.check().unwrap();
}

/// A replica that received bytes replay cannot take (past them lie writes the primary
/// shipped and may have acknowledged) is not promoted: the promotion is refused, says
/// why, and frees nothing. Bytes of a record cut off by the end of what was received are
/// only the end of the log. (Seeds 81 and 102 of M10 promoted replicas whose replay kept
/// nothing past their last commit, and lost every write after it without a word.)
#[test]
fn a_promotion_that_cannot_replay_what_the_replica_received_is_refused() {
    for cut_record in [false, true] {
        let mut link = Link::new();
        let ks = link.primary.keyspace(NAME).unwrap();
        for i in 0..200u32 {
            ks.put(&key(i), b"committed").unwrap();
        }
        link.primary.commit().unwrap();
        link.take_commits(false);
        for i in 200..260u32 {
            ks.put(&key(i), &[5u8; 300]).unwrap();
        }
        let source = link.primary.ship_source(NAME).unwrap();
        let tail = source
            .segments(0, usize::MAX)
            .into_iter()
            .rfind(|s| !s.relocation)
            .unwrap();
        let replica = link.replica();
        let held = replica
            .state()
            .segments
            .iter()
            .find(|(order, _, _)| *order == tail.order)
            .map_or(0, |(_, _, held)| *held);
        let mut bytes = vec![0u8; (tail.ready_bytes - held) as usize];
        source.read(tail.base, held, &mut bytes).unwrap();
        if cut_record {
            // All but the last 100 bytes: the last record arrives cut.
            bytes.truncate(bytes.len() - 100);
        } else {
            // A stretch the primary never wrote in the middle (bytes of a record start
            // overwritten), then the rest: replay stops there with writes past it.
            let middle = bytes.len() / 2;
            for b in &mut bytes[middle..middle + 64] {
                *b = 0xee;
            }
        }
        replica
            .write_log(tail.base, tail.size_bytes, tail.order, held, &bytes)
            .unwrap();
        let result = replica.promote_reporting(2);
        if cut_record {
            let (promoted, replay) = result.unwrap();
            assert!(!replay.stopped_short(), "{replay}");
            assert_eq!(
                promoted.get(&key(0)).unwrap().as_deref(),
                Some(&b"committed"[..])
            );
            assert_eq!(
                promoted.get(&key(258)).unwrap().as_deref(),
                Some(&[5u8; 300][..])
            );
            assert!(
                promoted.get(&key(259)).unwrap().is_none(),
                "its record came cut"
            );
        } else {
            let Err(e) = result else {
                panic!("promoted past bytes replay could not take")
            };
            assert!(e.to_string().contains("refused"), "{e}");
            // Still a replica, with what it received: a later promotion (once fixed, or
            // of another copy) finds it all.
            let state = link.replica().state();
            assert!(state.upstream_epoch > 0);
            assert!(link.backup.open_keyspace(NAME).is_err());
        }
        link.backup.check().unwrap();
    }
}

/// M10 seed 213: the end of the committed tail segment (with its link to the next) never
/// reached the backup, the segment after it did. Replay stops at the end of what it has
/// in the first, with nothing past it there; the copy it never reached begins with a
/// record of the log, so the promotion is refused rather than made without it.
#[test]
fn a_promotion_that_never_reaches_a_received_log_segment_is_refused() {
    let mut link = Link::new();
    let ks = link.primary.keyspace(NAME).unwrap();
    for i in 0..100u32 {
        ks.put(&key(i), b"committed").unwrap();
    }
    link.primary.commit().unwrap();
    link.take_commits(false);
    let source = link.primary.ship_source(NAME).unwrap();
    let committed_tail = source
        .segments(0, usize::MAX)
        .into_iter()
        .rfind(|s| !s.relocation)
        .unwrap();
    // Into the next segments (64 KiB each).
    for i in 100..600u32 {
        ks.put(&key(i), &[6u8; 300]).unwrap();
    }
    let replica = link.replica();
    for seg in source.segments(committed_tail.order + 1, usize::MAX) {
        ship_segment(&source, &replica, &seg, 0);
    }
    let Err(e) = replica.promote_reporting(2) else {
        panic!("promoted without a log segment it received")
    };
    assert!(e.to_string().contains("refused"), "{e}");
    assert!(e.to_string().contains("of the foreground log"), "{e}");
    link.backup.check().unwrap();
}

/// A backup used to acknowledge the highest foreground position it had received. When a
/// segment's bytes never reached it (session 16, seed 213: a segment garbage collection
/// retired before a new backup took its copy), it acknowledged the later segments
/// anyway, and promotion's replay, which follows the LINK chain, stopped at the gap: the
/// writes acknowledged past it were lost. It now acknowledges how far replay would
/// reach: up to the LINK into the missing segment, and to the end once it arrives.
#[test]
fn a_backup_acknowledges_only_as_far_as_replay_reaches() {
    let mut link = Link::new();
    let ks = link.primary.keyspace(NAME).unwrap();
    for i in 0..100u32 {
        ks.put(&key(i), b"committed").unwrap();
    }
    link.primary.commit().unwrap();
    link.take_commits(false);
    let replica = link.replica();
    let source = link.primary.ship_source(NAME).unwrap();
    let at_commit = replica.replayable_position().expect("a commit was applied");
    let end_at_commit = source.log_position();
    assert_eq!(
        at_commit,
        (end_at_commit.order, end_at_commit.offset),
        "everything the commit covers is replayable"
    );
    // Into the next segments (64 KiB each); every byte but the second new segment's.
    for i in 100..1000u32 {
        ks.put(&key(i), &[6u8; 300]).unwrap();
    }
    let end = source.log_position();
    let new: Vec<_> = source
        .segments(at_commit.0 + 1, usize::MAX)
        .into_iter()
        .filter(|s| !s.relocation)
        .collect();
    assert!(new.len() >= 3, "{new:?}");
    let missing = new[1].order;
    let ship = |seg, from| ship_segment(&source, &replica, seg, from);
    let tail_now = source
        .segments(at_commit.0, 1)
        .pop()
        .expect("the committed tail segment");
    ship(&tail_now, at_commit.1);
    for seg in new.iter().filter(|s| s.order != missing) {
        ship(seg, 0);
    }
    let (order, offset) = replica.replayable_position().unwrap();
    assert_eq!(
        order, new[0].order,
        "held back at the segment before the gap"
    );
    assert!(
        offset + 64 <= new[0].size_bytes && offset > 0,
        "at its LINK: {offset}"
    );
    assert!((order, offset) < (end.order, end.offset));
    // The missing segment arrives: replay reaches the end of the log.
    ship(&new[1], 0);
    assert_eq!(
        replica.replayable_position().unwrap(),
        (end.order, end.offset)
    );
    link.backup.check().unwrap();
}
