//! A `tucana serve` process as the crash suites run it (M7's pairs, M8's clusters):
//! started on a port, waited for until it answers `PING`, signalled (`kill -9`,
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
    pub port: u16,
    pub args: Vec<String>,
    pub db: PathBuf,
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
            child: spawn(tucana, db, &args, failpoints, log)?,
            port,
            args,
            db: db.to_path_buf(),
        };
        server.wait_ready()?;
        Ok(server)
    }

    pub fn restart(&mut self, tucana: &Path, log: &Path) -> Result<(), String> {
        self.child = spawn(tucana, &self.db, &self.args, None, log)?;
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
        let client = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))?;
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

pub fn spawn(
    tucana: &Path,
    db: &Path,
    args: &[String],
    failpoints: Option<&str>,
    log: &Path,
) -> Result<Child, String> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| format!("{}: {e}", log.display()))?;
    let mut command = Command::new(tucana);
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
        .stderr(log)
        .spawn()
        .map_err(|e| format!("starting {}: {e}", tucana.display()))
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
