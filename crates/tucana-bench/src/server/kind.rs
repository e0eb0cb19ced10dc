//! The servers a `server` run compares, and the programs that run them: each server's
//! name, command line and durability promise; where `tucana`, `redis-server` and
//! `redis-benchmark` are, and their versions.
//!
//! Owns the servers' flags; starting and stopping them is `process`'s. Thread-safe (plain
//! values).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use clap::ValueEnum;

use crate::Result;

/// The servers compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ServerKind {
    /// redis-server, appendonly yes, appendfsync everysec, no RDB snapshots.
    RedisEverysec,
    /// tucana serve --durability buffered --flush-interval-ms 1000.
    TucanaBuffered,
    /// tucana serve --durability sync (answered once durable; group commit).
    TucanaSync,
    /// tucana-buffered without busy polling (--busy-poll-us 0): what the spin is worth.
    TucanaBufferedNopoll,
}

impl ServerKind {
    /// The servers a run compares unless told otherwise.
    pub(super) const DEFAULT: [ServerKind; 3] = [
        ServerKind::RedisEverysec,
        ServerKind::TucanaBuffered,
        ServerKind::TucanaSync,
    ];
    pub(super) const ALL: [ServerKind; 4] = [
        ServerKind::RedisEverysec,
        ServerKind::TucanaBuffered,
        ServerKind::TucanaSync,
        ServerKind::TucanaBufferedNopoll,
    ];

    pub(super) fn name(self) -> &'static str {
        match self {
            ServerKind::RedisEverysec => "redis-everysec",
            ServerKind::TucanaBuffered => "tucana-buffered",
            ServerKind::TucanaSync => "tucana-sync",
            ServerKind::TucanaBufferedNopoll => "tucana-buffered-nopoll",
        }
    }

    pub(super) fn is_tucana(self) -> bool {
        self != ServerKind::RedisEverysec
    }

    /// The flags after the program name; `{dir}` and `{port}` as given.
    pub(super) fn flags(self, data_dir: &Path, port: u16) -> Vec<String> {
        let dir = data_dir.display().to_string();
        let port_arg = port.to_string();
        let strings = |flags: &[&str]| flags.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        match self {
            ServerKind::RedisEverysec => strings(&[
                "--port",
                &port_arg,
                "--bind",
                "127.0.0.1",
                "--dir",
                &dir,
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
                "--save",
                "",
                "--daemonize",
                "no",
                "--logfile",
                &format!("{dir}/redis.log"),
            ]),
            ServerKind::TucanaBuffered => strings(&[
                "--db",
                &format!("{dir}/volume.tucana"),
                "serve",
                "--port",
                &port_arg,
                "--durability",
                "buffered",
                "--flush-interval-ms",
                "1000",
            ]),
            ServerKind::TucanaBufferedNopoll => {
                let mut flags = ServerKind::TucanaBuffered.flags(data_dir, port);
                flags.extend(strings(&["--busy-poll-us", "0"]));
                flags
            }
            ServerKind::TucanaSync => strings(&[
                "--db",
                &format!("{dir}/volume.tucana"),
                "serve",
                "--port",
                &port_arg,
                "--durability",
                "sync",
            ]),
        }
    }

    /// What the server promises, for the document.
    pub(super) fn promise(self) -> &'static str {
        match self {
            ServerKind::RedisEverysec => {
                "every write appended to the AOF, fsync once a second (no RDB snapshots)"
            }
            ServerKind::TucanaBuffered => {
                "every write appended to the log, flushed and synced at least once a second: \
                 the same promise as everysec"
            }
            ServerKind::TucanaBufferedNopoll => {
                "as tucana-buffered; a connection thread sleeps as soon as it has nothing to \
                 run (no busy polling)"
            }
            ServerKind::TucanaSync => {
                "a write is answered only once durable (concurrent writers share an fsync); \
                 Redis would need appendfsync always for this"
            }
        }
    }
}

/// The programs the run uses.
pub(super) struct Programs {
    pub(super) tucana: PathBuf,
    /// `--threads` for `tucana serve`, if given.
    pub(super) tucana_threads: Option<u64>,
    pub(super) redis_server: PathBuf,
    pub(super) redis_benchmark: PathBuf,
}

impl Programs {
    pub(super) fn program(&self, kind: ServerKind) -> &Path {
        if kind.is_tucana() {
            &self.tucana
        } else {
            &self.redis_server
        }
    }
}

/// The first line `program --version` prints, or why it cannot run.
pub(crate) fn version_of(program: &Path) -> std::result::Result<String, String> {
    let output = Command::new(program)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
    if !output.status.success() {
        return Err(format!(
            "{} --version failed ({})",
            program.display(),
            output.status
        ));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    Ok(text.lines().next().unwrap_or("").trim().to_string())
}

/// `tucana` next to this program (cargo puts both in the same target directory), else PATH.
pub(crate) fn default_tucana() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("tucana")))
        .filter(|path| path.is_file())
        .unwrap_or_else(|| PathBuf::from("tucana"))
}

/// Whether redis-benchmark can run here: the smoke test skips the server run when not.
pub(crate) fn require(program: &Path, what: &str) -> Result<String> {
    version_of(program).map_err(|reason| {
        format!("{reason}: {what} (scripts/server-deps.sh --bench installs redis-server and redis-benchmark)").into()
    })
}
