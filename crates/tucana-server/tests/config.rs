//! CONFIG SET through a real client: the settings it changes take effect on a running
//! server (maxclients refuses the next connection, timeout closes an idle one), and the
//! settings the command line fixes are refused by name. Nothing is timed: a test waits
//! for the state it expects.

use std::io::Read;
use std::time::Duration;

use redis::Connection;
use tucana_server::RunningServer;

mod client;
use client::{connect, start};

fn config_set(con: &mut Connection, pairs: &[&str]) -> redis::RedisResult<()> {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("SET");
    for p in pairs {
        cmd.arg(*p);
    }
    cmd.query(con)
}

/// What a new raw connection reads before the server closes it (60 s at most).
fn read_until_closed(server: &RunningServer) -> String {
    let mut s = std::net::TcpStream::connect(server.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut got = String::new();
    s.read_to_string(&mut got)
        .expect("the server closes the connection");
    got
}

#[test]
fn maxclients_and_timeout_change_a_running_server() {
    let server = start();
    let mut con = connect(&server);
    config_set(&mut con, &["maxclients", "1"]).unwrap();
    assert!(read_until_closed(&server).contains("max number of clients reached"));
    config_set(&mut con, &["maxclients", "100", "timeout", "1"]).unwrap();
    // An idle connection is closed, having been answered nothing.
    assert_eq!(read_until_closed(&server), "");
    let got: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("timeout")
        .query(&mut connect(&server))
        .unwrap();
    assert_eq!(got, ["timeout", "1"]);
    server.stop().unwrap();
}

#[test]
fn fixed_settings_are_refused_by_name_and_nothing_changes() {
    let server = start();
    let mut con = connect(&server);
    let err = config_set(&mut con, &["timeout", "5", "port", "7000"]).unwrap_err();
    let text = err.to_string();
    // Redis's form ("CONFIG SET failed (possibly related to argument ...)"), which
    // clients and Redis's tests match, with the reason.
    assert!(
        text.contains("CONFIG SET failed (possibly related to argument 'port') - not supported"),
        "{text}"
    );
    assert!(text.contains("maxclients, timeout"), "{text}");
    let got: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("timeout")
        .query(&mut con)
        .unwrap();
    assert_eq!(got, ["timeout", "0"], "all or nothing");
    let err = config_set(&mut con, &["maxmemory", "100mb"]).unwrap_err();
    assert!(err.to_string().contains("only '0' is accepted"), "{err}");
    config_set(&mut con, &["appendonly", "yes"]).unwrap();
    server.stop().unwrap();
}
