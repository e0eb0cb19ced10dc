//! What the integration tests that drive an in-process server through the `redis` crate
//! share: a server on a free loopback port, a connection with a read timeout (so a bug
//! hangs no run), and a command from its words.
#![allow(dead_code)]

use std::time::Duration;

use redis::{Connection, RedisResult};
use tucana::Database;
use tucana_server::{spawn, RunningServer, ServerConfig};

/// A server over `db` with the default configuration, on a free loopback port.
pub fn start_on(db: &Database) -> RunningServer {
    start_with(
        db,
        ServerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            ..ServerConfig::default()
        },
    )
}

/// A server over `db` with `config` (its `listen` as given).
pub fn start_with(db: &Database, config: ServerConfig) -> RunningServer {
    spawn(db.clone(), config).unwrap()
}

/// A server over an in-memory database.
pub fn start() -> RunningServer {
    start_on(&Database::builder().open_in_memory().unwrap())
}

pub fn connect(server: &RunningServer) -> Connection {
    let client = redis::Client::open(format!("redis://{}/", server.addr)).unwrap();
    let con = client.get_connection().unwrap();
    con.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    con
}

/// The command of `args` (its name first), answered as `T`.
pub fn try_query<T: redis::FromRedisValue>(con: &mut Connection, args: &[&str]) -> RedisResult<T> {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(con)
}

/// [`try_query`], which must succeed.
pub fn query<T: redis::FromRedisValue>(con: &mut Connection, args: &[&str]) -> T {
    try_query(con, args).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}
