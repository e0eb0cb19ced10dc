//! The database handle: opens a volume, owns its regions (keyspaces), the background
//! committer and the group-commit machinery.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::check::CheckReport;
use crate::error::Result;
use crate::keyspace::Keyspace;
use crate::stats::Stats;
use crate::volume::Storage;

/// How a database is opened. Built with `Database::builder()`.
#[derive(Clone, Debug)]
pub struct Options {
    /// Background commit at least this often while there are changes (`None`: never).
    pub commit_interval: Option<Duration>,
    /// Background commit once this many log bytes were written since the last commit.
    pub commit_dirty_bytes: u64,
    /// Buffered writes are flushed and synced at least this often (`None`: never).
    pub flush_interval: Option<Duration>,
    /// Size of a log segment; records larger than this get a segment of their own.
    pub log_segment_bytes: u64,
    /// Create the volume if the file does not exist.
    pub create_if_missing: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            commit_interval: Some(Duration::from_secs(5)),
            commit_dirty_bytes: 256 << 20,
            flush_interval: Some(Duration::from_millis(200)),
            log_segment_bytes: 2 << 20,
            create_if_missing: true,
        }
    }
}

impl Options {
    pub fn commit_interval(mut self, interval: Option<Duration>) -> Options {
        self.commit_interval = interval;
        self
    }

    pub fn commit_dirty_bytes(mut self, bytes: u64) -> Options {
        self.commit_dirty_bytes = bytes;
        self
    }

    pub fn flush_interval(mut self, interval: Option<Duration>) -> Options {
        self.flush_interval = interval;
        self
    }

    pub fn log_segment_bytes(mut self, bytes: u64) -> Options {
        self.log_segment_bytes = bytes;
        self
    }

    pub fn create_if_missing(mut self, create: bool) -> Options {
        self.create_if_missing = create;
        self
    }

    /// Opens (or creates) the volume in the file at `path`, locked against other processes.
    pub fn open(self, path: impl AsRef<Path>) -> Result<Database> {
        let storage = crate::volume::FileStorage::open(path.as_ref(), self.create_if_missing)?;
        self.open_storage(Arc::new(storage))
    }

    /// Opens a volume held in memory (lost when dropped); for tests and tools.
    pub fn open_in_memory(self) -> Result<Database> {
        self.open_storage(Arc::new(crate::volume::MemStorage::new()))
    }

    /// Opens the volume on any storage backend (e.g. a fault-injecting one).
    pub fn open_storage(self, storage: Arc<dyn Storage>) -> Result<Database> {
        let _ = storage;
        todo!("engine core")
    }
}

/// A handle to an open database. Cheap to clone; `Send + Sync`.
#[derive(Clone)]
pub struct Database {
    pub(crate) inner: Arc<DbInner>,
}

pub(crate) struct DbInner {}

impl Database {
    pub fn builder() -> Options {
        Options::default()
    }

    /// Opens (or creates) the database file at `path` with default options.
    pub fn open(path: impl AsRef<Path>) -> Result<Database> {
        Options::default().open(path)
    }

    /// Opens the keyspace `name`, creating it if it does not exist.
    pub fn keyspace(&self, name: &str) -> Result<Keyspace> {
        let _ = name;
        todo!()
    }

    /// Opens the keyspace `name`; `Error::KeyspaceNotFound` if it does not exist.
    pub fn open_keyspace(&self, name: &str) -> Result<Keyspace> {
        let _ = name;
        todo!()
    }

    /// Names of all keyspaces, sorted.
    pub fn keyspace_names(&self) -> Vec<String> {
        todo!()
    }

    /// Drops a keyspace and all its data; its space is freed by the next commit.
    pub fn drop_keyspace(&self, name: &str) -> Result<()> {
        let _ = name;
        todo!()
    }

    /// Makes every write acknowledged so far durable (log flush + sync); group commit.
    pub fn sync(&self) -> Result<()> {
        todo!()
    }

    /// Persists the index: a new commit epoch. Implies `sync`.
    pub fn commit(&self) -> Result<()> {
        todo!()
    }

    pub fn stats(&self) -> Stats {
        todo!()
    }

    /// Walks the whole volume and verifies every invariant and checksum.
    pub fn check(&self) -> Result<CheckReport> {
        todo!()
    }

    /// Commits and closes. Dropping the last handle does the same, ignoring errors.
    pub fn close(self) -> Result<()> {
        todo!()
    }

    /// Drops the handle as a process crash would: no flush, no sync, no commit; the
    /// volume lock is released. Bytes already written to the file stay (as after a
    /// process crash); buffered writes still in memory are lost. For tests and benchmarks.
    #[doc(hidden)]
    pub fn abandon(self) {
        todo!()
    }
}
