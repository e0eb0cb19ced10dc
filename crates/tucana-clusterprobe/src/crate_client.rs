//! The `redis` crate's own Redis Cluster client behind [`Client`], for the writers and
//! probes of a run that wants the client a Rust user would pick rather than
//! [`crate::Router`]: it refreshes its slot map and retries by itself (twice here, as
//! the cluster integration tests configure it), so a write it reports failed may have
//! been retried inside it, and its backoff is part of any time measured through it.
//! A connection whose request failed is dropped and a new one made from the seeds on the
//! next request (a fresh slot map), as those tests do.
//!
//! Owns one cluster connection; not shared between threads (each writer has its own).

use std::time::Duration;

use redis::cluster::{ClusterClientBuilder, ClusterConnection};

use crate::Client;

/// A `redis::cluster::ClusterConnection`, made on first use and after every failure.
pub struct CrateCluster {
    seeds: Vec<String>,
    conn: Option<ClusterConnection>,
}

impl CrateCluster {
    pub fn new(seeds: Vec<String>) -> CrateCluster {
        CrateCluster { seeds, conn: None }
    }

    fn conn(&mut self) -> Result<&mut ClusterConnection, String> {
        if self.conn.is_none() {
            let urls: Vec<String> = self.seeds.iter().map(|s| format!("redis://{s}/")).collect();
            let client = ClusterClientBuilder::new(urls)
                .retries(2)
                .connection_timeout(Duration::from_secs(2))
                .response_timeout(Duration::from_secs(30))
                .build()
                .map_err(|e| e.to_string())?;
            self.conn = Some(client.get_connection().map_err(|e| e.to_string())?);
        }
        Ok(self.conn.as_mut().expect("made above"))
    }

    fn query(&mut self, cmd: &redis::Cmd) -> Result<redis::Value, String> {
        let conn = self.conn()?;
        cmd.query::<redis::Value>(conn).map_err(|e| {
            self.conn = None;
            e.to_string()
        })
    }
}

impl Client for CrateCluster {
    fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        let mut cmd = redis::cmd("SET");
        cmd.arg(key).arg(value);
        match self.query(&cmd)? {
            redis::Value::Okay => Ok(()),
            other => Err(format!("{other:?}")),
        }
    }

    fn get(&mut self, key: &str) -> Result<Option<String>, String> {
        let mut cmd = redis::cmd("GET");
        cmd.arg(key);
        Ok(match self.query(&cmd)? {
            redis::Value::BulkString(bytes) => Some(String::from_utf8_lossy(&bytes).into_owned()),
            _ => None,
        })
    }
}
