//! A primary and a backup joined by a real TCP connection on loopback, in one process:
//! shipping, acknowledgements, commits applied, promotion, and fencing of the old primary.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tucana::replication::LogPosition;
use tucana::{Database, Durability, Options};
use tucana_replication::frame::{Frame, RegionState};
use tucana_replication::{transport, Acceptor, Dialer};
use tucana_replication::{AckError, Backup, BackupConfig, Primary, PrimaryConfig};

fn options() -> Options {
    Database::builder()
        .commit_interval(None)
        .flush_interval(None)
        .log_segment_bytes(64 << 10)
}

fn start_backup(db: &Database, build_index: bool) -> Backup {
    Backup::start(
        db.clone(),
        "127.0.0.1:0",
        BackupConfig {
            id: "backup".into(),
            password: "secret".into(),
            build_index,
            acceptor: Acceptor::Tcp,
        },
    )
    .unwrap()
}

/// A primary shipping every commit's index as it is made.
fn start_primary(db: &Database, backup: &Backup, ack_timeout: Duration) -> Primary {
    start_primary_lagging(db, backup, ack_timeout, Duration::ZERO, 0)
}

fn start_primary_lagging(
    db: &Database,
    backup: &Backup,
    ack_timeout: Duration,
    index_lag_max: Duration,
    index_lag_max_bytes: u64,
) -> Primary {
    Primary::start(
        db.clone(),
        PrimaryConfig {
            index_lag_max,
            index_lag_max_bytes,
            ..primary_config(backup, ack_timeout)
        },
    )
    .unwrap()
}

/// A primary's configuration for `backup`: every commit's index shipped as it is made,
/// catch-up unpaced.
fn primary_config(backup: &Backup, ack_timeout: Duration) -> PrimaryConfig {
    primary_config_to(&backup.local_addr().to_string(), ack_timeout)
}

/// `primary_config` for a backup at `addr`.
fn primary_config_to(addr: &str, ack_timeout: Duration) -> PrimaryConfig {
    PrimaryConfig {
        id: "primary".into(),
        backups: vec![addr.to_owned()],
        password: "secret".into(),
        ack_durable: false,
        ack_timeout,
        catchup_bytes_per_sec: 0,
        index_lag_max: Duration::ZERO,
        index_lag_max_bytes: 0,
        dialer: Dialer::Tcp,
    }
}

fn contents(db: &Database, name: &str) -> BTreeMap<Vec<u8>, Vec<u8>> {
    db.open_keyspace(name)
        .unwrap()
        .range::<&[u8], _>(..)
        .map(|kv| kv.unwrap())
        .collect()
}

fn replica_contents(db: &Database, name: &str) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut out = BTreeMap::new();
    db.open_replica(name)
        .unwrap()
        .for_each(&mut |k, v| {
            out.insert(k.to_vec(), v.to_vec());
        })
        .unwrap();
    out
}

/// Waits until `done` holds, for at most 20 s.
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{what} never happened"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Writes `n` keys as a client of a replicated keyspace would: each synced locally and
/// acknowledged by the backup before the next.
fn acknowledged_writes(db: &Database, primary: &Primary, name: &str, from: u32, n: u32) {
    acknowledged_writes_to(db, primary, None, name, from, n)
}

fn acknowledged_writes_to(
    db: &Database,
    primary: &Primary,
    backup: Option<&Backup>,
    name: &str,
    from: u32,
    n: u32,
) {
    let ks = db.keyspace(name).unwrap();
    for i in from..from + n {
        ks.put_with(
            format!("key{i:06}").as_bytes(),
            format!("value {i}").as_bytes(),
            Durability::Sync,
        )
        .unwrap();
        if let Err(e) = primary.wait_acked(name, ks.log_position()) {
            panic!(
                "write {i}: {e:?}; {:?}; {:?}",
                primary.status(),
                backup.map(|b| b.counters())
            );
        }
    }
}

#[test]
fn a_backup_over_tcp_mirrors_commits_and_promotes_with_every_acknowledged_write() {
    let primary_db = options().open_in_memory().unwrap();
    primary_db.keyspace("db0").unwrap();
    let backup_db = options().open_in_memory().unwrap();
    let backup = start_backup(&backup_db, false);
    let primary = start_primary(&primary_db, &backup, Duration::from_secs(10));
    acknowledged_writes_to(&primary_db, &primary, Some(&backup), "db0", 0, 2000);
    primary_db.commit().unwrap();
    let epoch = primary_db.stats().commit_epoch;
    eventually("the backup applying the commit", || {
        backup_db
            .open_replica("db0")
            .is_some_and(|r| r.state().upstream_epoch >= epoch)
    });
    assert_eq!(
        replica_contents(&backup_db, "db0"),
        contents(&primary_db, "db0")
    );
    // Point reads of the applied commit (what a backup serves under READONLY).
    let replica = backup_db.open_replica("db0").unwrap();
    for (key, value) in contents(&primary_db, "db0") {
        assert_eq!(replica.get(&key).unwrap(), Some(value));
    }
    assert_eq!(replica.get(b"never written").unwrap(), None);
    backup_db.check().unwrap();
    // More acknowledged writes, shipped as log only; then the primary is gone.
    acknowledged_writes(&primary_db, &primary, "db0", 2000, 500);
    let expected = contents(&primary_db, "db0");
    primary.stop();
    primary_db.abandon();
    backup.stop();
    let promoted = backup_db.open_replica("db0").unwrap().promote(2).unwrap();
    let got: BTreeMap<Vec<u8>, Vec<u8>> = promoted
        .range::<&[u8], _>(..)
        .map(|kv| kv.unwrap())
        .collect();
    assert_eq!(
        got, expected,
        "every acknowledged write survives the primary"
    );
    backup_db.check().unwrap();
}

#[test]
fn an_old_primary_is_fenced_by_its_promoted_backup() {
    let primary_db = options().open_in_memory().unwrap();
    primary_db.keyspace("db0").unwrap();
    let backup_db = options().open_in_memory().unwrap();
    let backup = start_backup(&backup_db, false);
    let primary = start_primary(&primary_db, &backup, Duration::from_millis(500));
    acknowledged_writes(&primary_db, &primary, "db0", 0, 100);
    primary_db.commit().unwrap();
    let epoch = primary_db.stats().commit_epoch;
    eventually("the backup applying the commit", || {
        backup_db
            .open_replica("db0")
            .is_some_and(|r| r.state().upstream_epoch >= epoch)
    });
    // The operator promotes the backup while the primary still runs (as if it were
    // paused and resumed): the old primary's next connection is answered Superseded.
    backup.stop();
    backup_db.open_replica("db0").unwrap().promote(2).unwrap();
    let backup = start_backup_at(&backup_db, &primary);
    let ks = primary_db.open_keyspace("db0").unwrap();
    eventually("the old primary being fenced", || {
        ks.put(b"late", b"x")
            .is_err_and(|e| matches!(e, tucana::Error::Fenced { term: 2, .. }))
    });
    assert!(matches!(
        primary.wait_acked("db0", LogPosition::default()),
        Err(AckError::Fenced { term: 2 })
    ));
    drop(backup);
}

/// A backup listening where `primary` dials (its first backup's address).
fn start_backup_at(db: &Database, primary: &Primary) -> Backup {
    let addr = primary.status()[0].addr.clone();
    let mut tries = 0;
    loop {
        match Backup::start(
            db.clone(),
            &addr,
            BackupConfig {
                id: "backup".into(),
                password: "secret".into(),
                build_index: false,
                acceptor: Acceptor::Tcp,
            },
        ) {
            Ok(b) => return b,
            Err(e) if tries < 50 => {
                tries += 1;
                let _ = e;
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("listening again on {addr}: {e}"),
        }
    }
}

#[test]
fn without_its_backup_a_primary_acknowledges_nothing() {
    let primary_db = options().open_in_memory().unwrap();
    let ks = primary_db.keyspace("db0").unwrap();
    let backup_db = options().open_in_memory().unwrap();
    let backup = start_backup(&backup_db, false);
    let primary = start_primary(&primary_db, &backup, Duration::from_millis(300));
    backup.stop();
    ks.put(b"k", b"v").unwrap();
    assert!(matches!(
        primary.wait_acked("db0", ks.log_position()),
        Err(AckError::NoReplicas {
            acked: 0,
            needed: 1
        })
    ));
}

#[test]
fn a_build_index_backup_applies_every_record_to_its_own_keyspace() {
    let primary_db = options().open_in_memory().unwrap();
    primary_db.keyspace("db0").unwrap();
    let backup_db = options().open_in_memory().unwrap();
    let backup = start_backup(&backup_db, true);
    let primary = start_primary(&primary_db, &backup, Duration::from_secs(10));
    acknowledged_writes(&primary_db, &primary, "db0", 0, 1500);
    let ks = primary_db.keyspace("db0").unwrap();
    let mut batch = ks.batch();
    batch.delete(b"key000003").put(b"batched", b"yes");
    batch.commit().unwrap();
    primary.wait_acked("db0", ks.log_position()).unwrap();
    assert_eq!(contents(&backup_db, "db0"), contents(&primary_db, "db0"));
}

/// A primary that folds commits whose index costs more network than their log: the
/// backup applies the folded commits as one, once the log since its last commit passed
/// the byte bound, and then equals the primary; promoted from an older commit, it
/// replays the log of every commit it was not sent.
#[test]
fn folded_commits_reach_the_backup_as_one_and_promotion_replays_across_them() {
    let primary_db = options().open_in_memory().unwrap();
    primary_db.keyspace("db0").unwrap();
    let backup_db = options().open_in_memory().unwrap();
    let backup = start_backup(&backup_db, false);
    // An hour of lag allowed (never reached here); 1 MiB of log at most.
    let primary = start_primary_lagging(
        &primary_db,
        &backup,
        Duration::from_secs(10),
        Duration::from_secs(3600),
        1 << 20,
    );
    let start = primary_db.stats().commit_epoch;
    acknowledged_writes(&primary_db, &primary, "db0", 0, 1000);
    primary_db.commit().unwrap();
    // Commits of small overwrites: each rewrites leaves worth far more than a fifth of
    // its log, so each is folded.
    for round in 0..4u32 {
        acknowledged_writes(&primary_db, &primary, "db0", round * 250, 100);
        primary_db.commit().unwrap();
    }
    let folded = primary_db.stats().commit_epoch;
    let expected = contents(&primary_db, "db0");
    // Past the byte bound, the folded commits go as one, with no new commit.
    let ks = primary_db.keyspace("db0").unwrap();
    for i in 0..400u32 {
        ks.put(format!("big{i}").as_bytes(), &[i as u8; 4000])
            .unwrap();
    }
    acknowledged_writes(&primary_db, &primary, "db0", 5000, 1);
    eventually("the folded commits applied", || {
        backup_db
            .open_replica("db0")
            .is_some_and(|r| r.state().upstream_epoch >= folded)
    });
    assert_eq!(replica_contents(&backup_db, "db0"), expected);
    backup_db.check().unwrap();
    // One commit when the backup connected, then one for the folded ones (or more,
    // but fewer than the primary made).
    let applied = backup.counters().commits_applied;
    assert!(
        applied < 1 + folded - start,
        "{applied} commits applied for the {} the primary made: none was folded",
        1 + folded - start
    );
    // Commits folded again, then the primary is gone: promotion replays their log.
    for round in 0..3u32 {
        acknowledged_writes(&primary_db, &primary, "db0", 6000 + round * 100, 100);
        primary_db.commit().unwrap();
    }
    acknowledged_writes(&primary_db, &primary, "db0", 7000, 50);
    let expected = contents(&primary_db, "db0");
    let last = primary_db.stats().commit_epoch;
    primary.stop();
    primary_db.abandon();
    backup.stop();
    let replica = backup_db.open_replica("db0").unwrap();
    assert!(
        replica.state().upstream_epoch < last,
        "the last commits were folded"
    );
    let promoted = replica.promote(2).unwrap();
    let got: BTreeMap<Vec<u8>, Vec<u8>> = promoted
        .range::<&[u8], _>(..)
        .map(|kv| kv.unwrap())
        .collect();
    assert_eq!(got, expected);
    backup_db.check().unwrap();
}

/// Cluster mode's seam: the backups, and the keyspaces each carries at which term, are
/// set at run time (`Primary::set_backups`), and a write waits only for the backups of
/// its keyspace.
#[test]
fn backups_set_at_run_time_carry_only_their_keyspaces() {
    let primary_db = options().open_in_memory().unwrap();
    primary_db.keyspace("led").unwrap();
    let other = primary_db.keyspace("other").unwrap();
    let backup_db = options().open_in_memory().unwrap();
    let backup = start_backup(&backup_db, false);
    let primary = Primary::start(
        primary_db.clone(),
        PrimaryConfig {
            id: "primary".into(),
            backups: Vec::new(),
            password: "secret".into(),
            ack_durable: false,
            ack_timeout: Duration::from_millis(500),
            catchup_bytes_per_sec: 0,
            index_lag_max: Duration::ZERO,
            index_lag_max_bytes: 0,
            dialer: Dialer::Tcp,
        },
    )
    .unwrap();
    assert!(!primary.has_backups());
    let carried = BTreeMap::from([("led".to_string(), 7u64)]);
    let addr = backup.local_addr().to_string();
    primary.set_backups(&BTreeMap::from([(addr.clone(), carried.clone())]));
    assert!(primary.has_backups());

    acknowledged_writes(&primary_db, &primary, "led", 0, 50);
    let replica = backup_db.open_replica("led").expect("the carried keyspace");
    assert_eq!(replica.state().term, 7, "shipped at the term it was given");
    assert_eq!(primary_db.ship_source("led").unwrap().term(), 7);
    // A keyspace the backup does not carry is neither shipped nor waited for.
    other.put(b"k", b"v").unwrap();
    primary.wait_acked("other", other.log_position()).unwrap();
    assert!(backup_db.open_replica("other").is_none());

    // Setting the same backups again keeps the connection; an empty set retires it, and
    // writes then wait for nobody.
    primary.set_backups(&BTreeMap::from([(addr, carried)]));
    acknowledged_writes(&primary_db, &primary, "led", 50, 10);
    primary.set_backups(&BTreeMap::new());
    assert!(!primary.has_backups());
    backup.stop();
    let led = primary_db.open_keyspace("led").unwrap();
    led.put(b"alone", b"x").unwrap();
    primary.wait_acked("led", led.log_position()).unwrap();
}

/// The story: while a primary read and sent a backup its newest commit in full, the
/// commits it made meanwhile were neither queued nor folded for that backup. When the
/// next delta needed nothing they wrote, it applied, and the nodes they let go of stayed
/// in the backup's node map, allocated and referenced by nothing: `check` found them as
/// leaked blocks once the backup was promoted (M8, the cluster crash test). When it did
/// need them, the backup refused it (a node shipped twice, or one that does not
/// translate), dropped the connection and took another full index.
#[test]
fn commits_made_while_a_full_index_ships_reach_the_backup() {
    let primary_db = options().open_in_memory().unwrap();
    let ks = primary_db.keyspace("db0").unwrap();
    for i in 0..200_000u32 {
        ks.put(format!("key{i:06}").as_bytes(), &[7u8; 40]).unwrap();
    }
    primary_db.commit().unwrap();
    let backup_db = options().open_in_memory().unwrap();
    let backup = start_backup(&backup_db, false);
    // Its first commit goes in full, and again whenever it falls more than a few commits
    // behind, which the commits below make it do.
    // Catch-up paced, so the full index's log takes a while and commits land meanwhile.
    let primary = Primary::start(
        primary_db.clone(),
        PrimaryConfig {
            catchup_bytes_per_sec: 2 << 20,
            ..primary_config(&backup, Duration::from_secs(20))
        },
    )
    .unwrap();
    // Commits while it ships: each rewrites the same path from the root to one leaf and
    // lets the previous one go, so a delta after a gap still applies (it needs no node
    // the gap wrote) and only the news of what the gap let go of is missing.
    let started = Instant::now();
    let mut round = 0u32;
    while started.elapsed() < Duration::from_secs(3) {
        ks.put(b"key100000", format!("round {round}").as_bytes())
            .unwrap();
        primary_db.commit().unwrap();
        round += 1;
    }
    assert!(round > 5, "commits were made during the ship");
    acknowledged_writes(&primary_db, &primary, "db0", 0, 10);
    primary_db.commit().unwrap();
    let epoch = primary_db.stats().commit_epoch;
    eventually("the backup applying the newest commit", || {
        backup_db
            .open_replica("db0")
            .is_some_and(|r| r.state().upstream_epoch >= epoch)
    });
    assert_eq!(
        replica_contents(&backup_db, "db0"),
        contents(&primary_db, "db0")
    );
    // One connection all along: no commit was refused for lacking what a gap held
    // (a node shipped twice, or one that does not translate).
    let counters = backup.counters();
    assert_eq!(counters.last_error, None);
    assert_eq!(counters.connections, 1);
    backup_db.check().unwrap();
    primary.stop();
    backup.stop();
    backup_db.open_replica("db0").unwrap().promote(2).unwrap();
    backup_db.check().unwrap();
}

/// The acknowledged position of region `name` at the primary's only backup.
fn acked_position(primary: &Primary, name: &str) -> Option<LogPosition> {
    primary.status()[0]
        .regions
        .iter()
        .find(|r| r.name == name)
        .map(|r| r.acked)
}

/// The story: a cluster server led a region, its link to a backup went down (the backup
/// was killed), it lost the region in a failover and was handed it back later (a new
/// keyspace from its replica, at a higher term), and the link came back. The link kept
/// what it knew of the old incarnation: an acknowledged position in a segment order
/// above any of the new log's, so every later write counted as acknowledged by the
/// backup before it had it, and the backup was reported in sync at once. Killed, the
/// server's region went to that backup without its last second of buffered writes
/// (48,146 lost in the Redis Cluster side by side); M8 saw the link's lag stuck. A first
/// fix (6aa1e3d) announced the region again at its new term, which made backups drop
/// their copies while the map listed them in sync, and was reverted; now every `Hello`
/// starts the acknowledged position from nothing.
#[test]
fn a_region_led_again_while_its_link_was_down_is_acknowledged_afresh() {
    let primary_db = options().open_in_memory().unwrap();
    let backup_db = options().open_in_memory().unwrap();
    let backup = start_backup(&backup_db, false);
    let primary = Primary::start(
        primary_db.clone(),
        PrimaryConfig {
            backups: Vec::new(),
            ..primary_config(&backup, Duration::from_millis(2000))
        },
    )
    .unwrap();
    let addr = backup.local_addr().to_string();
    let carried =
        |term: u64| BTreeMap::from([(addr.clone(), BTreeMap::from([("led".to_string(), term)]))]);
    let ks = primary_db.keyspace("led").unwrap();
    primary.set_backups(&carried(7));
    // The first incarnation's log reaches several segments (64 KiB each), acknowledged.
    let value = vec![b'v'; 1024];
    for i in 0..300u32 {
        ks.put_with(format!("old{i:04}").as_bytes(), &value, Durability::Sync)
            .unwrap();
        primary.wait_acked("led", ks.log_position()).unwrap();
    }
    let old = acked_position(&primary, "led").unwrap();
    assert!(old.order > 2, "{old:?}");

    backup.stop();
    eventually("the link down", || !primary.status()[0].connected);
    drop(ks);
    primary_db.drop_keyspace("led").unwrap();
    let ks = primary_db.keyspace("led").unwrap();
    primary.set_backups(&carried(9));
    ks.put_with(b"new", b"1", Durability::Sync).unwrap();
    let end = primary_db.ship_source("led").unwrap().log_position();
    assert!(
        end < old,
        "the new log starts below the old one: {end:?} {old:?}"
    );

    // A server at the backup's address again (empty), and writes to the new incarnation:
    // acknowledged only once it has them, never beyond the log's end.
    let again_db = options().open_in_memory().unwrap();
    let _again = start_backup_at(&again_db, &primary);
    acknowledged_writes(&primary_db, &primary, "led", 0, 20);
    let end = primary_db.ship_source("led").unwrap().log_position();
    let acked = acked_position(&primary, "led").unwrap();
    assert!(
        acked <= end,
        "acknowledged {acked:?} past the log's end {end:?}"
    );
    let replica = again_db
        .open_replica("led")
        .expect("the region at the backup");
    assert_eq!(replica.state().term, 9);
}

/// A backup that answers the primary's `Open` saying it holds nothing of any region,
/// then takes every frame and acknowledges none; `shipped` is set at the first log bytes.
/// It takes every connection the primary opens.
fn start_mute_backup_at(addr: &str, shipped: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    start_counted_mute_backup_at(addr, shipped, Arc::default())
}

/// `start_mute_backup_at`, counting the connections it took in `connections`.
fn start_counted_mute_backup_at(
    addr: &str,
    shipped: Arc<AtomicBool>,
    connections: Arc<AtomicUsize>,
) -> std::thread::JoinHandle<()> {
    let mut tries = 0;
    let listener = loop {
        match std::net::TcpListener::bind(addr) {
            Ok(l) => break l,
            Err(e) if tries < 50 => {
                tries += 1;
                let _ = e;
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("listening again on {addr}: {e}"),
        }
    };
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                connections.fetch_add(1, Ordering::AcqRel);
                tokio::spawn(be_mute(stream, shipped.clone()));
            }
        });
    })
}

/// One connection of a mute backup (`start_mute_backup_at`).
async fn be_mute(stream: tokio::net::TcpStream, shipped: Arc<AtomicBool>) {
    let (mut reader, mut writer) = tokio::io::split(stream);
    let mut scratch = Vec::new();
    let Ok(Some(Frame::Open { regions, .. })) =
        transport::read_frame(&mut reader, &mut scratch).await
    else {
        return; // the primary gave up on this connection before opening it
    };
    let hello = Frame::Hello {
        backup: "mute".into(),
        wants_index: true,
        regions: regions
            .iter()
            .map(|r| RegionState {
                name: r.name.clone(),
                term: r.term,
                upstream_epoch: 0,
                node_map_current: false,
                segments: Vec::new(),
            })
            .collect(),
    };
    transport::write_frame(&mut writer, &hello, &mut scratch)
        .await
        .unwrap();
    while let Ok(Some(frame)) = transport::read_frame(&mut reader, &mut scratch).await {
        if matches!(frame, Frame::Log { .. }) {
            shipped.store(true, Ordering::Release);
        }
    }
}

/// The story: in the fault campaign (M10, seed 245) a slow link (`tc tbf`) between a
/// primary and its backup was healed, but their connection stayed silent (most likely in
/// TCP's retransmission backoff after the slow spell) with shipped log unacknowledged for
/// longer than a planned failover waits, and the failover gave up. Nothing in the link noticed. Now a link
/// that hears nothing from its backup while log it shipped waits for an acknowledgement
/// drops the connection and dials again; a mute backup (it takes frames and answers none)
/// stands in for the stalled connection.
#[test]
fn a_link_that_hears_nothing_with_log_unacknowledged_dials_again() {
    let primary_db = options().open_in_memory().unwrap();
    // Written before the primary starts, so that its `Open` lists the keyspace: the mute
    // backup answers that one `Hello` only, and a keyspace announced later would never be
    // shipped to it (a CI run created it after the connection opened).
    let ks = primary_db.keyspace("db0").unwrap();
    ks.put(b"k", b"v").unwrap();
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let (shipped, connections) = (Arc::new(AtomicBool::new(false)), Arc::default());
    let _mute = start_counted_mute_backup_at(&addr, shipped.clone(), Arc::clone(&connections));
    let _primary = Primary::start(
        primary_db.clone(),
        primary_config_to(&addr, Duration::from_secs(1)),
    )
    .unwrap();
    eventually("log shipped to the backup", || {
        shipped.load(Ordering::Acquire)
    });
    eventually("a second connection after the silence", || {
        connections.load(Ordering::Acquire) >= 2
    });
}

/// A primary (acknowledgement timeout `ack_timeout_ms`) whose backup acknowledged 100
/// writes of `db0` up to `end`, then stopped: the primary's database, the backup's (its
/// replica as it was), the primary, and `end`.
fn backup_gone_after_writes(ack_timeout_ms: u64) -> (Database, Database, Primary, LogPosition) {
    let primary_db = options().open_in_memory().unwrap();
    let backup_db = options().open_in_memory().unwrap();
    let backup = start_backup(&backup_db, false);
    let primary = start_primary(&primary_db, &backup, Duration::from_millis(ack_timeout_ms));
    acknowledged_writes(&primary_db, &primary, "db0", 0, 100);
    let end = primary_db.ship_source("db0").unwrap().log_position();
    assert_eq!(primary.acked_count("db0", end), 1);
    backup.stop();
    drop(backup);
    eventually("the link down", || !primary.status()[0].connected);
    (primary_db, backup_db, primary, end)
}

/// The story: a backup killed and restarted at once (before its lease ran out, so the
/// cluster map still listed it in sync) comes back holding only what its last commit
/// recorded, less than it had acknowledged. The primary's link kept the position
/// acknowledged before the restart, so a planned failover to that backup, which waits
/// until it has acknowledged the region's end, promoted it at once, without the writes
/// it had lost: the fault campaign (M10, seed 2579796793) lost 5,992 acknowledged writes.
/// An acknowledgement counts only on the connection it came on.
#[test]
fn a_backup_that_comes_back_holding_less_acknowledges_nothing_it_lacks() {
    let (_primary_db, _backup_db, primary, end) = backup_gone_after_writes(300);
    let addr = primary.status()[0].addr.clone();
    let shipped = Arc::new(AtomicBool::new(false));
    let _mute = start_mute_backup_at(&addr, shipped.clone());
    eventually("the log shipped to the backup that came back", || {
        shipped.load(Ordering::Acquire)
    });
    assert_eq!(
        primary.acked_count("db0", end),
        0,
        "a backup holding nothing counted as holding the region's end: {:?}",
        primary.status()
    );
    assert!(matches!(
        primary.wait_acked("db0", end),
        Err(AckError::NoReplicas { acked: 0, .. })
    ));
    assert!(!primary.in_sync(&addr, "db0"));
}

/// A backup that comes back holding everything says so without a new write: the primary
/// sends the newest segment's last byte again and the backup acknowledges the region's
/// end (a planned failover of an idle region must not wait for a write that never comes).
#[test]
fn a_backup_that_comes_back_holding_everything_acknowledges_the_end_without_new_writes() {
    let (_primary_db, backup_db, primary, end) = backup_gone_after_writes(10_000);
    let _again = start_backup_at(&backup_db, &primary);
    primary.wait_acked("db0", end).unwrap();
    assert_eq!(primary.acked_count("db0", end), 1);
}

/// The story: a planned failover promoted the backup, and the map made the old primary a
/// backup of the region in the same change. The old primary dropped its own copy (it
/// takes the promoted one's replica instead) while its shipper still carried the
/// keyspace, so the shipper announced `Dropped`; the backup, whose follower had not yet
/// promoted its replica, dropped it, then had nothing to promote and served the region
/// empty (M10, seed 2579796793: 44,619 of 54,584 acknowledged writes lost). A keyspace
/// the primary stops shipping first is gone without a word.
#[test]
fn a_keyspace_dropped_after_its_shipping_stopped_leaves_the_backups_replica_alone() {
    let primary_db = options().open_in_memory().unwrap();
    let backup_db = options().open_in_memory().unwrap();
    let backup = start_backup(&backup_db, false);
    let primary = start_primary(&primary_db, &backup, Duration::from_secs(5));
    let addr = backup.local_addr().to_string();
    let carried = BTreeMap::from([("kept".to_string(), 3u64), ("ended".to_string(), 3u64)]);
    primary.set_backups(&BTreeMap::from([(addr.clone(), carried)]));
    acknowledged_writes(&primary_db, &primary, "kept", 0, 40);
    acknowledged_writes(&primary_db, &primary, "ended", 0, 40);
    primary_db.commit().unwrap();
    eventually("both replicas applied a commit", || {
        ["kept", "ended"].iter().all(|name| {
            backup_db
                .open_replica(name)
                .is_some_and(|r| r.state().upstream_epoch > 0)
        })
    });

    // Handed over: shipping stops, then the old copy goes.
    primary.stop_shipping("kept");
    primary_db.drop_keyspace("kept").unwrap();
    // A keyspace dropped while still shipped (the region's end) is dropped at the backup
    // too, which also shows the shipper looked at the drops in between.
    primary_db.drop_keyspace("ended").unwrap();
    eventually("the ended keyspace's replica dropped", || {
        backup_db.open_replica("ended").is_none()
    });
    let replica = backup_db
        .open_replica("kept")
        .expect("the replica of the keyspace handed over stays");
    assert_eq!(replica_contents(&backup_db, "kept").len(), 40);
    replica.promote(4).unwrap();
    assert_eq!(contents(&backup_db, "kept").len(), 40);
}

/// A primary of `db` for `backup` (set later with `set_backups`) that folds commits for
/// up to an hour (the servers' default is a minute): promotions replay long logs.
fn folding_primary(db: &Database, backup: &Backup) -> Primary {
    Primary::start(
        db.clone(),
        PrimaryConfig {
            index_lag_max: Duration::from_secs(3600),
            index_lag_max_bytes: 256 << 20,
            backups: Vec::new(),
            ..primary_config(backup, Duration::from_secs(10))
        },
    )
    .unwrap()
}

/// Promotes `db`'s replica "r" at `term` and checks it holds exactly `expected`.
fn promote_holding(db: &Database, term: u64, expected: &BTreeMap<Vec<u8>, Vec<u8>>, what: &str) {
    let (promoted, replay) = db
        .open_replica("r")
        .unwrap()
        .promote_reporting(term)
        .unwrap();
    let got: BTreeMap<Vec<u8>, Vec<u8>> = promoted
        .range::<&[u8], _>(..)
        .map(|kv| kv.unwrap())
        .collect();
    let missing = expected.keys().filter(|k| !got.contains_key(*k)).count();
    assert_eq!(missing, 0, "{what}: {missing} keys missing; {replay}");
    assert_eq!(&got, expected, "{what}: {replay}");
}

/// Seeds 81 and 102 of M10: a backup (new, or back at the same term after a while away),
/// commits folded for a long time (the servers' default index lag is a minute), the
/// primary's garbage collection freeing and reusing segments meanwhile, then the primary
/// gone: the promoted backup must hold every write it acknowledged.
#[test]
fn a_backup_away_and_back_promotes_with_every_write_it_acknowledged() {
    // (away at all, away only briefly: the log's tail is the same segment on return)
    for (away, briefly) in [(false, false), (true, false), (true, true)] {
        let primary_db = options().open_in_memory().unwrap();
        primary_db.keyspace("r").unwrap();
        let backup_db = options().open_in_memory().unwrap();
        let backup = start_backup(&backup_db, false);
        let addr = backup.local_addr().to_string();
        let primary = folding_primary(&primary_db, &backup);
        let carried = BTreeMap::from([(addr.clone(), BTreeMap::from([("r".to_string(), 7u64)]))]);
        primary.set_backups(&carried);
        let ks = primary_db.keyspace("r").unwrap();
        let mut n = 0u32;
        let write_round = |acked: bool, n: &mut u32| {
            for i in 0..600u32 {
                let key = format!("key{:05}", i % 300);
                ks.put_with(key.as_bytes(), &[(*n % 251) as u8; 300], Durability::Sync)
                    .unwrap();
                if acked {
                    primary.wait_acked("r", ks.log_position()).unwrap();
                }
                let unique = format!("u{n:07}");
                ks.put_with(unique.as_bytes(), b"v", Durability::Sync)
                    .unwrap();
                if acked {
                    primary.wait_acked("r", ks.log_position()).unwrap();
                }
                *n += 1;
            }
        };
        write_round(true, &mut n);
        primary_db.commit().unwrap();
        write_round(true, &mut n);
        if away && briefly {
            primary.set_backups(&BTreeMap::new());
            for i in 0..20u32 {
                ks.put(format!("brief{i}").as_bytes(), b"x").unwrap();
            }
            primary_db.commit().unwrap();
            primary.set_backups(&carried);
        } else if away {
            // The backup leaves; the primary writes, commits and collects without it.
            primary.set_backups(&BTreeMap::new());
            for _ in 0..3 {
                write_round(false, &mut n);
                primary_db.commit().unwrap();
                primary_db.gc().unwrap();
                primary_db.commit().unwrap();
            }
            primary.set_backups(&carried);
        }
        for _ in 0..4 {
            write_round(true, &mut n);
            primary_db.commit().unwrap();
            primary_db.gc().unwrap();
            primary_db.commit().unwrap();
        }
        write_round(true, &mut n);
        let expected = contents(&primary_db, "r");
        primary.stop();
        primary_db.abandon();
        backup.stop();
        promote_holding(
            &backup_db,
            8,
            &expected,
            &format!("away {away}, briefly {briefly}"),
        );
        backup_db.check().unwrap();
    }
}

/// A backup's database whose replica "r" was promoted at term 5, its primary gone: it
/// took `committed` acknowledged writes and a commit, then `after` more.
fn promoted_backup(committed: u32, after: u32) -> Database {
    let first_db = options().open_in_memory().unwrap();
    first_db.keyspace("r").unwrap();
    let second_db = options().open_in_memory().unwrap();
    let second = start_backup(&second_db, false);
    let first = start_primary(&first_db, &second, Duration::from_secs(10));
    acknowledged_writes(&first_db, &first, "r", 0, committed);
    first_db.commit().unwrap();
    acknowledged_writes(&first_db, &first, "r", committed, after);
    first.stop();
    first_db.abandon();
    second.stop();
    second_db.open_replica("r").unwrap().promote(5).unwrap();
    second_db
}

/// As above, with the primary a promoted backup itself (so were the primaries of seeds
/// 81 and 102 when their backups lost writes): its log continues, at a new generation,
/// in segments that hold the old primary's records first.
#[test]
fn the_backup_of_a_promoted_backup_promotes_with_every_write_it_acknowledged() {
    let second_db = promoted_backup(2000, 700);

    let third_db = options().open_in_memory().unwrap();
    let third = start_backup(&third_db, false);
    let addr = third.local_addr().to_string();
    let primary = folding_primary(&second_db, &third);
    primary.set_backups(&BTreeMap::from([(
        addr,
        BTreeMap::from([("r".to_string(), 5u64)]),
    )]));
    for round in 0..5u32 {
        acknowledged_writes(&second_db, &primary, "r", 3000 + round * 700, 700);
        acknowledged_writes(&second_db, &primary, "r", round * 300, 300);
        second_db.commit().unwrap();
        second_db.gc().unwrap();
        second_db.commit().unwrap();
    }
    acknowledged_writes(&second_db, &primary, "r", 9000, 500);
    let expected = contents(&second_db, "r");
    primary.stop();
    second_db.abandon();
    third.stop();
    promote_holding(&third_db, 6, &expected, "");
    third_db.check().unwrap();
}

/// The story: `FLUSHALL` in cluster mode drops each region's keyspace, and the next write
/// creates it again. When both happened between two rounds of the shipper, it never saw
/// the keyspace gone: it kept the old keyspace's shipping state, whose acknowledged
/// position lay past everything the new keyspace had written, so writes to it were
/// acknowledged at once, shipped to nobody. A keyspace of another incarnation (its
/// records' seed) is a drop and a new keyspace.
#[test]
fn a_keyspace_dropped_and_created_again_between_rounds_is_shipped_anew() {
    let primary_db = options().open_in_memory().unwrap();
    let backup_db = options().open_in_memory().unwrap();
    let backup = start_backup(&backup_db, false);
    let primary = start_primary(&primary_db, &backup, Duration::from_secs(10));
    acknowledged_writes(&primary_db, &primary, "r", 0, 500);
    // Dropped and created again with no round in between: the shipper is busy with
    // another keyspace's writes, and the two happen under one hold of nothing it takes.
    primary_db.drop_keyspace("r").unwrap();
    let ks = primary_db.keyspace("r").unwrap();
    let old_seed = backup_db.open_replica("r").map(|r| r.state().seed);
    ks.put_with(b"after the flush", b"x", Durability::Sync)
        .unwrap();
    primary.wait_acked("r", ks.log_position()).unwrap();
    primary_db.commit().unwrap();
    acknowledged_writes(&primary_db, &primary, "r", 1000, 3);
    eventually("the new keyspace's replica applied a commit", || {
        backup_db
            .open_replica("r")
            .is_some_and(|r| Some(r.state().seed) != old_seed && r.state().upstream_epoch > 0)
    });
    primary.stop();
    primary_db.abandon();
    backup.stop();
    let promoted = backup_db.open_replica("r").unwrap().promote(9).unwrap();
    assert_eq!(
        promoted.get(b"after the flush").unwrap().as_deref(),
        Some(&b"x"[..])
    );
    assert!(promoted.get(b"key000001").unwrap().is_none(), "flushed");
    assert_eq!(promoted.len(), 4);
}

/// The story: two servers backing each other (server A the primary of one region and a
/// backup of the other, server B the reverse, as in every cluster of three). A backup
/// applies a commit by committing its own volume, and every commit of a volume was
/// shipped, for every keyspace it leads, to that keyspace's backups, changed or not. So
/// each applied commit was answered by a commit shipped back, applied, and answered
/// again: a thousand commits a second between idle servers, and the backups, never
/// done reading frames, stopped acknowledging writes for minutes (M10, seed 116). A
/// commit that changed nothing of a keyspace is no longer shipped.
#[test]
fn two_servers_backing_each_other_go_quiet() {
    let a_db = options().open_in_memory().unwrap();
    let b_db = options().open_in_memory().unwrap();
    let a_backup = start_backup(&a_db, false);
    let b_backup = start_backup(&b_db, false);
    let config = |backup: &Backup| PrimaryConfig {
        backups: Vec::new(),
        ..primary_config(backup, Duration::from_secs(10))
    };
    let a = Primary::start(a_db.clone(), config(&b_backup)).unwrap();
    let b = Primary::start(b_db.clone(), config(&a_backup)).unwrap();
    a.set_backups(&BTreeMap::from([(
        b_backup.local_addr().to_string(),
        BTreeMap::from([("led-by-a".to_string(), 1u64)]),
    )]));
    b.set_backups(&BTreeMap::from([(
        a_backup.local_addr().to_string(),
        BTreeMap::from([("led-by-b".to_string(), 1u64)]),
    )]));
    acknowledged_writes(&a_db, &a, "led-by-a", 0, 200);
    acknowledged_writes(&b_db, &b, "led-by-b", 0, 200);
    a_db.commit().unwrap();
    b_db.commit().unwrap();
    eventually("both replicas applied a commit", || {
        b_db.open_replica("led-by-a")
            .is_some_and(|r| r.state().upstream_epoch > 0)
            && a_db
                .open_replica("led-by-b")
                .is_some_and(|r| r.state().upstream_epoch > 0)
    });
    // Let what is in flight settle, then nothing more may happen.
    std::thread::sleep(Duration::from_millis(500));
    let before = (a_db.stats().commit_epoch, b_db.stats().commit_epoch);
    std::thread::sleep(Duration::from_millis(500));
    let after = (a_db.stats().commit_epoch, b_db.stats().commit_epoch);
    assert_eq!(
        before, after,
        "idle servers kept committing (commit epochs {before:?} then {after:?})"
    );
    // And they still ship what changes.
    acknowledged_writes(&a_db, &a, "led-by-a", 200, 5);
    a_db.commit().unwrap();
    let newest = a_db.stats().commit_epoch;
    eventually("the new commit applied", || {
        b_db.open_replica("led-by-a")
            .is_some_and(|r| r.state().upstream_epoch >= newest)
    });
    assert_eq!(replica_contents(&b_db, "led-by-a").len(), 205);
}

/// A primary killed and restarted while it stays the primary (its region had no backup in
/// sync to promote) comes back with a shorter log than a backup already received: what
/// it had shipped but not made durable is gone, and its next writes take those places.
/// The backup, holding the old bytes there, must not keep them and skip the new ones: it
/// would acknowledge the new writes, and its log would break where the old bytes end.
#[test]
fn a_backup_of_a_restarted_primary_keeps_nothing_the_primary_lost() {
    let storage = Arc::new(tucana::volume::MemStorage::new());
    let primary_db = options().open_storage(storage.clone()).unwrap();
    let backup_db = options().open_in_memory().unwrap();
    let backup = start_backup(&backup_db, false);
    let primary = start_primary(&primary_db, &backup, Duration::from_secs(10));
    acknowledged_writes(&primary_db, &primary, "r", 0, 200);
    primary_db.commit().unwrap();
    eventually("a commit applied", || {
        backup_db
            .open_replica("r")
            .is_some_and(|r| r.state().upstream_epoch > 0)
    });
    acknowledged_writes(&primary_db, &primary, "r", 200, 50);
    // Written and shipped, never made durable here: lost in the crash.
    let ks = primary_db.keyspace("r").unwrap();
    for i in 0..100u32 {
        ks.put_with(
            format!("lost{i:04}").as_bytes(),
            &[7u8; 200],
            Durability::Buffered,
        )
        .unwrap();
    }
    let shipped_to = ks.log_position();
    primary.notify_write();
    eventually("the unsynced writes received", || {
        backup_db.open_replica("r").is_some_and(|r| {
            r.state()
                .segments
                .iter()
                .any(|(order, _, held)| *order == shipped_to.order && *held >= shipped_to.offset)
        })
    });
    primary.stop();
    drop(ks);
    primary_db.abandon();

    let primary_db = options().open_storage(storage).unwrap();
    assert!(
        primary_db
            .open_keyspace("r")
            .unwrap()
            .get(b"lost0099")
            .unwrap()
            .is_none(),
        "the crash lost the unsynced writes"
    );
    let primary = start_primary(&primary_db, &backup, Duration::from_secs(10));
    // Past what the backup held, so that acknowledgements come again.
    let ks = primary_db.keyspace("r").unwrap();
    for i in 0..200u32 {
        ks.put_with(
            format!("new{i:04}").as_bytes(),
            &[9u8; 200],
            Durability::Sync,
        )
        .unwrap();
    }
    acknowledged_writes(&primary_db, &primary, "r", 1000, 100);
    let expected = contents(&primary_db, "r");
    primary.stop();
    primary_db.abandon();
    backup.stop();
    promote_holding(&backup_db, 5, &expected, "");
}

/// Writers never pause while a new backup of a promoted primary joins, the primary
/// commits, folds and collects: the promoted backup has every write it acknowledged.
/// (The shape of M10 seeds 81 and 102, with their concurrency.)
#[test]
fn a_backup_joining_under_load_promotes_with_every_write_it_acknowledged() {
    for round in 0..3u32 {
        let second_db = promoted_backup(1500, 300);

        let third_db = options().open_in_memory().unwrap();
        let third = start_backup(&third_db, false);
        let addr = third.local_addr().to_string();
        let primary = Arc::new(folding_primary(&second_db, &third));
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(parking_lot::Mutex::new(Vec::<Vec<u8>>::new()));
        let writers: Vec<_> = (0..3u32)
            .map(|w| {
                let (db, primary, stop, acked) = (
                    second_db.clone(),
                    primary.clone(),
                    stop.clone(),
                    acked.clone(),
                );
                std::thread::spawn(move || {
                    let ks = db.keyspace("r").unwrap();
                    let mut i = 0u32;
                    while !stop.load(Ordering::Acquire) {
                        let key = format!("w{w}-{i:06}").into_bytes();
                        ks.put_with(&key, &[(i % 250) as u8; 120], Durability::Sync)
                            .unwrap();
                        if primary.wait_acked("r", ks.log_position()).is_ok() {
                            acked.lock().push(key);
                        }
                        if i.is_multiple_of(97) {
                            ks.put_with(
                                format!("key{:06}", i % 500).as_bytes(),
                                b"over",
                                Durability::Sync,
                            )
                            .unwrap();
                        }
                        i += 1;
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(100 + 50 * u64::from(round)));
        primary.set_backups(&BTreeMap::from([(
            addr,
            BTreeMap::from([("r".to_string(), 5u64)]),
        )]));
        for _ in 0..6 {
            std::thread::sleep(Duration::from_millis(80));
            second_db.commit().unwrap();
            second_db.gc().unwrap();
        }
        std::thread::sleep(Duration::from_millis(100));
        stop.store(true, Ordering::Release);
        for w in writers {
            w.join().unwrap();
        }
        primary.stop();
        second_db.abandon();
        third.stop();
        let (promoted, replay) = third_db
            .open_replica("r")
            .unwrap()
            .promote_reporting(6)
            .unwrap();
        let acked = acked.lock();
        let missing: Vec<&Vec<u8>> = acked
            .iter()
            .filter(|k| promoted.get(k).unwrap().is_none())
            .collect();
        assert!(
            missing.is_empty(),
            "round {round}: {} of {} acknowledged writes missing (first {:?}); {replay}",
            missing.len(),
            acked.len(),
            String::from_utf8_lossy(missing[0])
        );
        third_db.check().unwrap();
    }
}

/// M10 seed 213 (and, by their pattern, seeds 81 and 102): garbage collection took out
/// a segment written after the newest commit's tail, whose records it had relocated,
/// before a new backup joined. The backup took that commit in full, then the log by
/// segment as the primary listed them; the retired segment was no longer listed, so its
/// bytes written after the commit, and the link to the next segment, never reached the
/// backup. It acknowledged everything after, and its promotion replayed nothing past
/// the commit's tail: every write since was lost. Garbage collection now leaves the
/// newest commit's replay window alone.
#[test]
fn a_backup_joining_after_gc_took_a_segment_past_the_commit_promotes_with_every_write() {
    let gc_options = || {
        options()
            .commit_interval(Some(Duration::from_secs(3600)))
            .commit_dirty_bytes(u64::MAX / 2)
            .flush_interval(Some(Duration::from_millis(20)))
            .gc_tick(Duration::from_millis(5))
            .gc_space_amp(1.05)
    };
    let db = gc_options().open_in_memory().unwrap();
    let ks = db.keyspace("r").unwrap();
    for i in 0..100u32 {
        ks.put(format!("a{i:05}").as_bytes(), &[1u8; 300]).unwrap();
    }
    db.commit().unwrap();
    // Segments past the commit's tail, nearly all dead: garbage collection's choice.
    for round in 0..40u32 {
        for i in 0..20u32 {
            ks.put(format!("hot{i:03}").as_bytes(), &[round as u8; 600])
                .unwrap();
        }
    }
    // Time for the background collector (every 5 ms) to take what it may: before the
    // fix it relocated the hot keys' records out of those segments and retired them.
    std::thread::sleep(Duration::from_millis(1000));
    let backup_db = options().open_in_memory().unwrap();
    let backup = start_backup(&backup_db, false);
    let addr = backup.local_addr().to_string();
    let primary = folding_primary(&db, &backup);
    primary.set_backups(&BTreeMap::from([(
        addr,
        BTreeMap::from([("r".to_string(), 5u64)]),
    )]));
    acknowledged_writes(&db, &primary, "r", 0, 300);
    let expected = contents(&db, "r");
    primary.stop();
    db.abandon();
    backup.stop();
    promote_holding(&backup_db, 6, &expected, "");
    backup_db.check().unwrap();
}
