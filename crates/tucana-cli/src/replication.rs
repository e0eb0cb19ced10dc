//! `tucana replication status|promote`: a server's replication state, or a volume's
//! when no server holds it.
//!
//! With `--server HOST:PORT` the command speaks RESP to a running `tucana serve`:
//! `status` prints its `INFO replication` fields, `promote` sends `REPLICAOF NO ONE`
//! (its replicas become keyspaces at a higher term, so their old primary is refused)
//! and prints the fields after. Without `--server` it opens the volume at `--db`
//! (which the engine's lock keeps any server off) and does the same through the
//! engine, using the server's own functions so both paths print and promote alike.
//!
//! Owns the subcommand's flags and output. Single-threaded.

use clap::{Args, Subcommand};
use tucana::Database;
use tucana_server::{promote_replicas, replica_info_lines};

use crate::output::Output;
use crate::{CliError, Outcome};

/// Flags of `tucana replication`.
#[derive(Debug, Args)]
pub struct ReplicationArgs {
    #[command(subcommand)]
    pub action: Action,
    /// A running server to ask (else the volume at --db, which must not be served).
    #[arg(long, value_name = "HOST:PORT", global = true)]
    pub server: Option<String>,
    /// The server's password (its --requirepass).
    #[arg(
        long,
        value_name = "PASSWORD",
        env = "TUCANA_REQUIREPASS",
        hide_env_values = true,
        global = true
    )]
    pub password: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum Action {
    /// Prints role, backups with their lag, and replicas with their terms and commits.
    Status,
    /// Makes every replica a keyspace that takes writes, at its term plus one.
    Promote,
}

/// Runs the subcommand against a server.
pub fn run_on_server(args: &ReplicationArgs, addr: &str) -> Result<Outcome, CliError> {
    let mut con = connect(addr, args.password.as_deref())?;
    if let Action::Promote = args.action {
        let _: String = redis::cmd("REPLICAOF")
            .arg("NO")
            .arg("ONE")
            .query(&mut con)
            .map_err(|e| CliError::msg(format!("REPLICAOF NO ONE on {addr}: {e}")))?;
    }
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query(&mut con)
        .map_err(|e| CliError::msg(format!("INFO replication on {addr}: {e}")))?;
    let mut out = Output::stdout();
    for line in info
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        out.line(line)?;
    }
    Ok(Outcome::Done)
}

/// Runs the subcommand on an open volume.
pub fn run_on_volume(db: &Database, args: &ReplicationArgs) -> Result<Outcome, CliError> {
    let mut out = Output::stdout();
    if let Action::Promote = args.action {
        for name in promote_replicas(db)? {
            out.line(&format!("promoted:{name}"))?;
        }
    }
    let replicas = replica_info_lines(db);
    let role = if replicas.is_empty() {
        "master"
    } else {
        "slave"
    };
    out.line(&format!("role:{role}"))?;
    for (key, value) in replicas {
        out.line(&format!("{key}:{value}"))?;
    }
    Ok(Outcome::Done)
}

fn connect(addr: &str, password: Option<&str>) -> Result<redis::Connection, CliError> {
    let unreachable = |e: redis::RedisError| CliError::msg(format!("cannot reach {addr}: {e}"));
    let mut info = redis::IntoConnectionInfo::into_connection_info(format!("redis://{addr}/"))
        .map_err(unreachable)?;
    if let Some(password) = password {
        let settings = info.redis_settings().clone().set_password(password);
        info = info.set_redis_settings(settings);
    }
    redis::Client::open(info)
        .and_then(|c| c.get_connection())
        .map_err(unreachable)
}
