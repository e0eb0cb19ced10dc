//! A `tucana serve` process as the crash suites run it (M7's pairs, M8's clusters, the
//! fault campaign): started on a port (on loopback, or on an address of its own inside a
//! network namespace, with a password), waited for until it answers `PING`, signalled (`kill -9`,
//! `SIGSTOP`/`SIGCONT`), restarted on its volume with the same arguments, shut down; and
//! `tucana check` of a volume.
//!
//! Owns the child processes (killed when dropped); does not own what they are asked to
//! do. Not shared between threads: the suites drive processes from one thread.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `tucana serve` process.
pub struct Server {
    pub child: Child,
    /// Where it listens (`--bind`; loopback unless started with [`Server::start_at`]).
    pub host: String,
    pub port: u16,
    pub args: Vec<String>,
    pub db: PathBuf,
    /// Run inside this network namespace (`ip netns exec NAME`).
    pub netns: Option<String>,
    /// Its `--requirepass`, sent by [`Server::connect`].
    pub password: Option<String>,
}

/// Where a server listens and runs, for [`Server::start_at`].
pub struct Place {
    pub host: String,
    pub netns: Option<String>,
    pub password: Option<String>,
}

pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Server {
    /// Starts `tucana serve --port PORT EXTRA...`, with the crash points `failpoints`
    /// armed (`FAILPOINTS`) if given.
    pub fn start(
        tucana: &Path,
        db: &Path,
        port: u16,
        extra: &[String],
        failpoints: Option<&str>,
        log: &Path,
    ) -> Result<Server, String> {
        let mut args = vec!["serve".to_string(), "--port".into(), port.to_string()];
        args.extend_from_slice(extra);
        let mut server = Server {
            child: spawn(tucana, db, &args, failpoints, None, log)?,
            host: "127.0.0.1".into(),
            port,
            args,
            db: db.to_path_buf(),
            netns: None,
            password: None,
        };
        server.wait_ready()?;
        Ok(server)
    }

    /// Starts `tucana serve --bind HOST --port PORT [--requirepass P] EXTRA...` in
    /// `place` (its namespace, if any).
    pub fn start_at(
        tucana: &Path,
        db: &Path,
        place: Place,
        port: u16,
        extra: &[String],
        log: &Path,
    ) -> Result<Server, String> {
        let mut args = vec![
            "serve".to_string(),
            "--bind".into(),
            place.host.clone(),
            "--port".into(),
            port.to_string(),
        ];
        if let Some(p) = &place.password {
            args.extend(["--requirepass".to_string(), p.clone()]);
        }
        args.extend_from_slice(extra);
        let mut server = Server {
            child: spawn(tucana, db, &args, None, place.netns.as_deref(), log)?,
            host: place.host,
            port,
            args,
            db: db.to_path_buf(),
            netns: place.netns,
            password: place.password,
        };
        server.wait_ready()?;
        Ok(server)
    }

    /// `host:port`.
    pub fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    pub fn restart(&mut self, tucana: &Path, log: &Path) -> Result<(), String> {
        self.child = spawn(
            tucana,
            &self.db,
            &self.args,
            None,
            self.netns.as_deref(),
            log,
        )?;
        self.wait_ready()
    }

    pub fn wait_ready(&mut self) -> Result<(), String> {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if let Ok(mut c) = self.connect() {
                if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                    return Ok(());
                }
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!(
                    "tucana serve on port {} exited: {status}",
                    self.port
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(format!(
            "tucana serve on port {} never answered PING",
            self.port
        ))
    }

    pub fn connect(&self) -> redis::RedisResult<redis::Connection> {
        let url = match &self.password {
            Some(p) => format!("redis://:{p}@{}/", self.addr()),
            None => format!("redis://{}/", self.addr()),
        };
        let client = redis::Client::open(url)?;
        let c = client.get_connection_with_timeout(Duration::from_secs(5))?;
        c.set_read_timeout(Some(Duration::from_secs(20)))?;
        Ok(c)
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on a pid we started and have not reaped; no memory is touched.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, signal);
        }
    }

    pub fn kill9(&mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.child.wait();
    }

    /// `SHUTDOWN` and wait for the process to end (it commits first).
    pub fn shutdown(&mut self) {
        if let Ok(mut c) = self.connect() {
            let _ = redis::cmd("SHUTDOWN").query::<()>(&mut c);
        }
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill9();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill9();
        }
    }
}

/// Seconds since this run's clock started (the first call): the time servers' log lines
/// carry, so they can be read beside the nemesis's steps.
pub fn run_clock_s() -> f64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_secs_f64()
}

pub fn spawn(
    tucana: &Path,
    db: &Path,
    args: &[String],
    failpoints: Option<&str>,
    netns: Option<&str>,
    log: &Path,
) -> Result<Child, String> {
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| format!("{}: {e}", log.display()))?;
    // Each line the server logs goes to the shared log with the run's clock and the
    // server's volume name in front (servers share one log).
    let label = db.file_stem().map_or_else(
        || db.display().to_string(),
        |s| s.to_string_lossy().into_owned(),
    );
    // `ip netns exec` enters the namespace and execs the server: the child's pid is the
    // server's, so signals reach it.
    let mut command = match netns {
        Some(netns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", netns]).arg(tucana);
            c
        }
        None => Command::new(tucana),
    };
    command.env_remove("FAILPOINTS");
    if let Some(armed) = failpoints {
        command.env("FAILPOINTS", armed);
    }
    command
        .arg("--db")
        .arg(db)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = command
        .spawn()
        .map_err(|e| format!("starting {}: {e}", tucana.display()))?;
    if let Some(stderr) = child.stderr.take() {
        std::thread::spawn(move || {
            use std::io::{BufRead, Write};
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let _ = writeln!(log, "[{:9.3} s] {label} {line}", run_clock_s());
            }
        });
    }
    Ok(child)
}

/// Whether `tucana --db DB check` passes (its report goes to stderr).
pub fn check(tucana: &Path, db: &Path) -> bool {
    check_outcome(tucana, db) == Checked::Passed
}

/// What `tucana --db DB check` found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checked {
    Passed,
    /// Only that allocated blocks are referenced by nothing: space lost until a repair,
    /// no data wrong (the check's one finding of that kind).
    Leaked,
    Failed,
}

/// Runs `tucana --db DB check`, its error echoed to stderr, and sorts what it found.
pub fn check_outcome(tucana: &Path, db: &Path) -> Checked {
    let output = Command::new(tucana)
        .arg("--db")
        .arg(db)
        .arg("check")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .output();
    let Ok(output) = output else {
        return Checked::Failed;
    };
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprint!("{stderr}");
    if output.status.success() {
        Checked::Passed
    } else if stderr.contains("allocated blocks are referenced by nothing")
        && stderr.lines().filter(|l| l.contains("error")).count() == 1
    {
        Checked::Leaked
    } else {
        Checked::Failed
    }
}
