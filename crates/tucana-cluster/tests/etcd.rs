//! The etcd store against a real etcd: each test starts its own `etcd` process on free
//! loopback ports and a fresh data directory, and kills it at the end.
//!
//! etcd must be installed (`scripts/cluster-deps.sh`; CI runs it): without it these tests
//! fail, saying so, rather than pass having proved nothing.
//!
//! Waits for events are bounded (`within`) so a bug hangs no run, but no test asserts
//! how long anything took.

use std::future::Future;
use std::time::{Duration, Instant};

use tucana_cluster::map::{ClusterMap, RegionId, ServerId, ServerInfo};
use tucana_cluster::testing::TestEtcd;
use tucana_cluster::{Error, MapEvent, ServerEvent, Store};

/// A bound on waits for something that should happen: generous, since the machine may be
/// busy; reaching it fails the test as a hang, not as slowness.
const PATIENCE: Duration = Duration::from_secs(60);

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: still waiting after {PATIENCE:?}"))
}

async fn connect(etcd: &TestEtcd, cluster: &str) -> Store {
    Store::connect(&[etcd.endpoint()], cluster).await.unwrap()
}

async fn raw_client(etcd: &TestEtcd) -> etcd_client::Client {
    etcd_client::Client::connect([etcd.endpoint()], None)
        .await
        .unwrap()
}

fn server(port: u16) -> ServerInfo {
    ServerInfo {
        id: ServerId::random(),
        client_addr: format!("127.0.0.1:{port}"),
        repl_addr: format!("127.0.0.1:{}", port + 10000),
    }
}

fn ids(servers: &[ServerInfo]) -> Vec<ServerId> {
    let mut ids: Vec<_> = servers.iter().map(|s| s.id.clone()).collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_are_listed_while_their_lease_lives() {
    let etcd = TestEtcd::start();
    let store = connect(&etcd, "c1").await;
    let (a, b) = (server(7001), server(7002));
    let long = store.register(&a, Duration::from_secs(10)).await.unwrap();
    // The shortest lease etcd grants with its default timing.
    let short = store.register(&b, Duration::from_secs(2)).await.unwrap();
    assert!(long.is_valid(Duration::from_secs(1)));
    assert_eq!(long.lease_ttl(), Duration::from_secs(10));

    let (listed, revision) = store.servers().await.unwrap();
    assert_eq!(ids(&listed), ids(&[a.clone(), b.clone()]));
    assert!(listed.contains(&a) && listed.contains(&b));
    // Another cluster on the same etcd sees none of them.
    assert!(connect(&etcd, "c2")
        .await
        .servers()
        .await
        .unwrap()
        .0
        .is_empty());

    // The same id again, while its lease lives: refused.
    let again = store.register(&a, Duration::from_secs(10)).await;
    assert!(matches!(again, Err(Error::AlreadyRegistered(id)) if id == a.id));
    assert!(matches!(
        store.register(&server(7003), Duration::ZERO).await,
        Err(Error::InvalidLeaseTtl { .. })
    ));

    // Keepalives push the deadline on.
    let first = short.status();
    let mut status = short.subscribe();
    within(
        "a keepalive",
        status.wait_for(|s| s.deadline > first.deadline),
    )
    .await
    .unwrap();
    assert!(short.status().keepalive_ok);

    let mut watch = store.watch_servers(Some(revision)).await.unwrap();
    long.revoke().await.unwrap();
    match within("a's key deleted", watch.next()).await.unwrap() {
        Some(ServerEvent::Down { id, .. }) => assert_eq!(id, a.id),
        other => panic!("expected a down, got {other:?}"),
    }
    assert_eq!(
        ids(&store.servers().await.unwrap().0),
        ids(std::slice::from_ref(&b))
    );

    // Dropping a registration stops its keepalive: etcd expires the lease by itself.
    drop(short);
    match within("b's lease expired", watch.next()).await.unwrap() {
        Some(ServerEvent::Down { id, .. }) => assert_eq!(id, b.id),
        other => panic!("expected a down, got {other:?}"),
    }
    assert!(store.servers().await.unwrap().0.is_empty());

    // A new registration is reported up.
    let c = server(7004);
    let _c = store.register(&c, Duration::from_secs(10)).await.unwrap();
    match within("c's key", watch.next()).await.unwrap() {
        Some(ServerEvent::Up { info, .. }) => assert_eq!(info, c),
        other => panic!("expected an up, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_revoked_behind_the_holders_back_is_lost() {
    let etcd = TestEtcd::start();
    let store = connect(&etcd, "c1").await;
    let registration = store
        .register(&server(7001), Duration::from_secs(3))
        .await
        .unwrap();
    let status = registration.status();
    assert!(!status.lost && status.keepalive_ok);
    assert!(status.valid_at(Instant::now(), Duration::from_millis(500)));
    // A margin as long as the lease leaves no time at all.
    assert!(!status.valid_at(Instant::now(), Duration::from_secs(3)));

    // Another client revokes the lease (as etcd does when it expires one).
    raw_client(&etcd)
        .await
        .lease_revoke(registration.lease_id())
        .await
        .unwrap();
    within("the keepalive noticing", registration.lost()).await;
    let status = registration.status();
    assert!(status.lost && !status.keepalive_ok);
    assert!(!registration.is_valid(Duration::ZERO));
    assert!(store.servers().await.unwrap().0.is_empty());
}

/// The story (the fault campaign, M10): etcd killed for longer than the leases' time to
/// live and restarted. Each server had given its lease up once the deadline passed and
/// registered again, first waiting for its old key to expire (etcd, restarted, had
/// extended it), and the coordinator, seeing the old keys go, failed over regions of
/// servers that never died. A lease etcd still holds is kept, with the same key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_etcd_still_holds_after_a_restart_is_valid_again() {
    let etcd = TestEtcd::start();
    let store = connect(&etcd, "c1").await;
    let a = server(7001);
    let registration = store.register(&a, Duration::from_secs(2)).await.unwrap();
    let etcd = std::sync::Arc::new(etcd);
    let down = {
        let etcd = etcd.clone();
        // Down for longer than the time to live: the holder's deadline passes.
        tokio::task::spawn_blocking(move || etcd.restart_after(Duration::from_secs(3)))
    };
    let mut status = registration.subscribe();
    within(
        "the lease invalid while etcd is down",
        status.wait_for(|s| !s.valid_at(Instant::now(), Duration::ZERO)),
    )
    .await
    .unwrap();
    down.await.unwrap();
    within(
        "the lease valid again",
        status.wait_for(|s| s.valid_at(Instant::now(), Duration::ZERO)),
    )
    .await
    .unwrap();
    assert!(!registration.status().lost);
    let store = connect(&etcd, "c1").await;
    assert_eq!(
        ids(&store.servers().await.unwrap().0),
        ids(std::slice::from_ref(&a))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_map_changes_by_compare_and_swap() {
    let etcd = TestEtcd::start();
    let store = connect(&etcd, "c1").await;
    assert!(store.map().await.unwrap().is_none());
    let servers: Vec<_> = (0..3).map(|_| ServerId::random()).collect();
    let map = ClusterMap::even(&servers[..2]).unwrap();
    let created = store.create_map(&map).await.unwrap();
    assert!(matches!(
        store.create_map(&map).await,
        Err(Error::MapExists { current }) if current == created
    ));
    assert_eq!(store.map().await.unwrap(), Some((map.clone(), created)));

    let mut watch = store.watch_map(Some(created)).await.unwrap();
    let next = map.assign_backup(RegionId(1), &servers[2]).unwrap();
    let updated = store.update_map(created, &next).await.unwrap();
    assert!(updated > created);
    // A change computed from the old map: refused, with the revision to read again.
    let stale = map.assign_backup(RegionId(2), &servers[2]).unwrap();
    match store.update_map(created, &stale).await {
        Err(Error::Conflict { expected, current }) => {
            assert_eq!(expected, created);
            assert_eq!(current, Some(updated));
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    match within("the update", watch.next()).await.unwrap() {
        Some(MapEvent::Updated { map, revision }) => {
            assert_eq!(map, next);
            assert_eq!(revision, updated);
        }
        other => panic!("expected the update, got {other:?}"),
    }
    assert_eq!(store.map().await.unwrap(), Some((next.clone(), updated)));

    // An invalid map is never written.
    let mut invalid = next.clone();
    invalid.regions[0].epoch = 0;
    assert!(matches!(
        store.update_map(updated, &invalid).await,
        Err(Error::InvalidMap(_))
    ));

    // Bytes that are not a valid map (written by hand) are an error, to readers and
    // watchers alike.
    raw_client(&etcd)
        .await
        .put(
            "/tucana/c1/map",
            r#"{"version":1,"config_epoch":0,"regions":[{}]}"#,
            None,
        )
        .await
        .unwrap();
    assert!(matches!(store.map().await, Err(Error::Decode { .. })));
    assert!(matches!(
        within("the garbage", watch.next()).await,
        Err(Error::Decode { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_coordinator_leads_and_hands_over() {
    let etcd = TestEtcd::start();
    let store = connect(&etcd, "c1").await;
    assert_eq!(store.leader().await.unwrap(), None);
    let (a, b) = (server(7001), server(7002));
    let reg_a = store.register(&a, Duration::from_secs(10)).await.unwrap();
    let reg_b = store.register(&b, Duration::from_secs(10)).await.unwrap();
    let map = ClusterMap::even(&[a.id.clone(), b.id.clone()]).unwrap();
    let mut revision = store.create_map(&map).await.unwrap();

    // Both campaign at once; each campaign ends when its server leads.
    let (sender, mut elected) = tokio::sync::mpsc::unbounded_channel();
    for registration in [reg_a, reg_b] {
        let (store, sender) = (store.clone(), sender.clone());
        tokio::spawn(async move {
            let leadership = store.campaign(&registration).await;
            let _ = sender.send((leadership, registration));
        });
    }
    let (leadership, _first_reg) = within("a leader", elected.recv()).await.unwrap();
    let leadership = leadership.unwrap();
    let leader = leadership.server_id().clone();
    assert_eq!(store.leader().await.unwrap(), Some(leader.clone()));
    assert!(elected.try_recv().is_err(), "two leaders at once");
    let mut observed = store.observe_leader().await.unwrap();
    assert_eq!(
        within("observe", observed.next()).await.unwrap(),
        Some(leader.clone())
    );

    // The leader's fenced map update goes through.
    let next = map.assign_backup(RegionId(1), &b.id).unwrap();
    revision = store
        .update_map_as(&leadership, revision, &next)
        .await
        .unwrap();

    // It resigns: the other campaigner leads.
    leadership.resign().await.unwrap();
    let (second_leadership, second_reg) = within("the handover", elected.recv()).await.unwrap();
    let second_leadership = second_leadership.unwrap();
    let second_leader = second_leadership.server_id().clone();
    assert_ne!(second_leader, leader);
    assert_eq!(store.leader().await.unwrap(), Some(second_leader.clone()));
    assert_eq!(
        within("observe the handover", observed.next())
            .await
            .unwrap(),
        Some(second_leader)
    );

    // Its lease revoked, it leads no more, and its fenced update is refused.
    second_reg.revoke().await.unwrap();
    assert_eq!(store.leader().await.unwrap(), None);
    assert!(matches!(
        store
            .update_map_as(&second_leadership, revision, &next)
            .await,
        Err(Error::NotLeader { .. })
    ));
    // The unfenced update at the right revision still works.
    store.update_map(revision, &next).await.unwrap();
}
