//! The public handle of an open database, and opening one (`Options::open` and its
//! siblings, which return it).
//!
//! Owns: the API of a whole database (keyspaces by name, sync, commit, gc, stats, check,
//! close). Does not own: any of the work, which the engine does (`crate::engine`).
//!
//! Thread-safety: `Database` is a cheap `Clone + Send + Sync` handle over the engine.

use std::path::Path;
use std::sync::Arc;

use crate::check::CheckReport;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::keyspace::Keyspace;
use crate::options::Options;
use crate::stats::Stats;
use crate::volume::Storage;

impl Options {
    /// Opens (or creates) the volume in the file at `path`, locked against other processes.
    /// A path naming a block device opens the device (`crate::volume::BlockDevice`): one
    /// carrying no Tucana volume is refused, naming it, unless
    /// `Options::format_block_devices`.
    pub fn open(self, path: impl AsRef<Path>) -> Result<Database> {
        let path = path.as_ref();
        let storage: Arc<dyn Storage> = if crate::volume::blockdev::is_block_device(path) {
            Arc::new(crate::volume::blockdev::open_single(
                path,
                self.format_block_devices,
                self.mapping_reservation_bytes,
            )?)
        } else {
            Arc::new(crate::volume::FileStorage::open_with_min_reservation(
                path,
                self.create_if_missing,
                self.mapping_reservation_bytes,
            )?)
        };
        // A lone member of a volume over several is refused, naming the missing ones:
        // it would otherwise open as a volume whose groups are elsewhere.
        crate::volume::members::refuse_lone_member(storage.as_ref(), &path.display().to_string())?;
        self.open_storage(storage)
    }

    /// Opens (or, when every file is missing or empty and `create_if_missing`, creates) a
    /// volume over several member files, given in the same order each time (DESIGN.md,
    /// "Volumes over several devices"). One path is `open`. Refuses a missing, swapped,
    /// duplicated or foreign member with `Error::Members` naming it, writing nothing.
    pub fn open_members<P: AsRef<Path>>(self, paths: &[P]) -> Result<Database> {
        if let [path] = paths {
            return self.open(path);
        }
        let paths: Vec<std::path::PathBuf> =
            paths.iter().map(|p| p.as_ref().to_path_buf()).collect();
        let set = crate::volume::MemberSet::open_paths_formatting(
            &paths,
            self.create_if_missing,
            self.format_block_devices,
            self.mapping_reservation_bytes,
        )?
        .with_policy(self.member_dispatch);
        self.open_storage(Arc::new(set))
    }

    /// Adds `new` as the next member of the closed volume over `paths` (every current
    /// member, in order; DESIGN.md, "Adding a member"); open it afterwards with `new` last.
    /// A missing file is created; a block device is written only with
    /// `format_block_devices`. Errors: `MemberSet::add_member`'s (a single-file volume, a
    /// wrong member set, a new member that is someone's).
    pub fn add_member<P: AsRef<Path>>(
        &self,
        paths: &[P],
        new: &Path,
    ) -> Result<crate::volume::AddedMember> {
        let paths: Vec<std::path::PathBuf> =
            paths.iter().map(|p| p.as_ref().to_path_buf()).collect();
        crate::volume::MemberSet::add_member_paths(
            &paths,
            new,
            self.format_block_devices,
            self.mapping_reservation_bytes,
        )
    }

    /// Removes `remove`, one of `paths` (every current member, in order), from the closed
    /// volume over them (DESIGN.md, "Removing a member"): its groups are copied onto the
    /// other members, then the member table marks it removed; open the volume afterwards
    /// over the others, in the same order. Errors: `MemberSet::remove_member_paths`'s (a
    /// path not given, member 0, the last member but one, a volume open elsewhere, a
    /// wrong member set), each before anything is written; I/O errors (the removal may
    /// then be run again).
    pub fn remove_member<P: AsRef<Path>>(
        &self,
        paths: &[P],
        remove: &Path,
    ) -> Result<crate::volume::RemovedMember> {
        let paths: Vec<std::path::PathBuf> =
            paths.iter().map(|p| p.as_ref().to_path_buf()).collect();
        crate::volume::MemberSet::remove_member_paths(
            &paths,
            remove,
            self.mapping_reservation_bytes,
        )
    }

    /// Rebalances the closed volume over `paths` (every current member, in order;
    /// DESIGN.md, "Rebalancing onto a member"): groups move from the members holding the
    /// most to those holding the fewest until they differ by one at most (block devices
    /// of different sizes: until each holds groups in proportion to its capacity, to
    /// about a group), so data written before a member was added is spread onto it.
    /// Errors:
    /// `MemberSet::rebalance_paths`'s (a single file, a volume open elsewhere, a wrong
    /// member set), each before anything is written; I/O errors (the volume opens, and
    /// the rebalance may be run again).
    pub fn rebalance<P: AsRef<Path>>(&self, paths: &[P]) -> Result<crate::volume::Rebalanced> {
        let paths: Vec<std::path::PathBuf> =
            paths.iter().map(|p| p.as_ref().to_path_buf()).collect();
        crate::volume::MemberSet::rebalance_paths(&paths, self.mapping_reservation_bytes)
    }

    /// Opens a volume held in memory (lost when dropped); for tests and tools.
    pub fn open_in_memory(self) -> Result<Database> {
        self.open_storage(Arc::new(crate::volume::MemStorage::new()))
    }

    /// Opens the volume on any storage backend (e.g. a fault-injecting one).
    pub fn open_storage(self, storage: Arc<dyn Storage>) -> Result<Database> {
        self.validate()?;
        let engine = Arc::new(Engine::new(crate::recovery::open(self, storage)?));
        crate::background::start(&engine);
        Ok(Database { engine })
    }
}

/// A handle to an open database. Cheap to clone; `Send + Sync`.
#[derive(Clone)]
pub struct Database {
    pub(crate) engine: Arc<Engine>,
}

impl Database {
    pub fn builder() -> Options {
        Options::default()
    }

    /// Opens (or creates) the database file at `path` with default options.
    pub fn open(path: impl AsRef<Path>) -> Result<Database> {
        Options::default().open(path)
    }

    /// Opens the keyspace `name`, creating it (durably) if it does not exist.
    pub fn keyspace(&self, name: &str) -> Result<Keyspace> {
        let region = self.engine.create_region(name)?;
        Ok(Keyspace::new(self.engine.clone(), region))
    }

    /// Opens the keyspace `name`; `Error::KeyspaceNotFound` if it does not exist.
    pub fn open_keyspace(&self, name: &str) -> Result<Keyspace> {
        match self.engine.regions.get(name) {
            Some(region) => Ok(Keyspace::new(self.engine.clone(), region)),
            None => Err(Error::KeyspaceNotFound(name.to_string())),
        }
    }

    /// Names of all keyspaces, sorted.
    pub fn keyspace_names(&self) -> Vec<String> {
        self.engine.regions.names()
    }

    /// Drops a keyspace and all its data (durably); its space is freed by later commits.
    /// Handles to it still held report `Error::KeyspaceNotFound`.
    pub fn drop_keyspace(&self, name: &str) -> Result<()> {
        self.engine.drop_region(name)
    }

    /// Makes every write acknowledged so far durable (log flush + sync); group commit. On
    /// a backup, also every replica's received log: a commit when a replica received a
    /// segment since the last commit (only commits persist its segment map).
    pub fn sync(&self) -> Result<()> {
        self.engine.sync()
    }

    /// Persists the index: a new commit epoch. Implies `sync`.
    pub fn commit(&self) -> Result<()> {
        self.engine.commit()
    }

    /// Garbage-collects the log now, fully: relocates the live records of every log
    /// segment with dead space worth taking back, commits until the emptied segments are
    /// back in the allocator, and gives their bytes back to the file system. Segments that a
    /// snapshot or iterator opened before may still read are freed by a commit after it is
    /// dropped. Readers and writers keep going meanwhile; commits interleave.
    pub fn gc(&self) -> Result<()> {
        self.engine.gc_full()
    }

    /// Rewrites the live records of every keyspace in key order where they are scattered,
    /// then garbage-collects fully (as `gc`). The log is in write order, so a scan of data
    /// that is not in memory reads one random page per record; after this, a scan of what
    /// was reorganised reads the device sequentially until those keys are written again.
    /// Each record of a scattered leaf is copied once (the walk goes leaf by leaf; a leaf
    /// whose records already lie back to back is left alone). Readers and writers keep
    /// going meanwhile: a key written during the walk keeps its new value.
    pub fn reorganise(&self) -> Result<crate::gc::ReorganiseReport> {
        self.engine.reorganise()
    }

    /// Adds the file or block device at `path` as the next member of this open volume
    /// over several members, while readers and writers run (DESIGN.md, "Adding a
    /// member"); reopen it afterwards with `path` last. New segments and node runs reach
    /// it by dispatch; existing data stays where it is. A missing file is created; a block
    /// device is written only with `Options::format_block_devices`.
    ///
    /// Errors, nothing written: a single-file volume or one of `MEMBERS_MAX` members
    /// (`Error::InvalidArgument`); a path that is already a member, belongs to another
    /// volume or holds data (`Error::Members`, naming it); a poisoned or closed store. An
    /// I/O error of the member table's write poisons the store.
    pub fn add_member(&self, path: impl AsRef<Path>) -> Result<crate::volume::AddedMember> {
        let options = &self.engine.shared.options;
        let existing: Vec<String> = self
            .engine
            .shared
            .volume
            .storage()
            .members()
            .into_iter()
            .map(|m| m.name)
            .collect();
        if existing.is_empty() {
            // Refused before the new path is created or opened.
            return Err(Error::InvalidArgument(
                crate::volume::members::SINGLE_FILE.into(),
            ));
        }
        let (new, blank) = crate::volume::MemberSet::open_new_member(
            path.as_ref(),
            &existing,
            options.format_block_devices,
            options.mapping_reservation_bytes,
        )?;
        self.engine.add_member(new, blank)
    }

    /// As `add_member`, for any backend (simulated disks in tests): `name` for messages,
    /// `blank` whether it holds nothing and may be written.
    pub fn add_member_storage(
        &self,
        name: &str,
        storage: Arc<dyn Storage>,
        blank: bool,
    ) -> Result<crate::volume::AddedMember> {
        self.engine.add_member((name.to_string(), storage), blank)
    }

    /// Removes the member at `path` from this open volume over several members (DESIGN.md,
    /// "Removing a member", *to an open volume*): it stops taking segments, node runs and
    /// groups, each group it holds is copied to another member while writes go on (a
    /// write to a group being copied is written to both), then the member table marks it
    /// removed and the groups are read and written on their new slots. Open the volume
    /// afterwards without it. Errors (nothing written): a single-file volume, a path that
    /// is not a member, member 0, a member already removed, a removal that would leave
    /// one member, another removal running; no room on the others, I/O errors (the
    /// removal is undone); a failed write or sync of the table poisons the store (what is
    /// durable is then unknown; the next open decides, as after a crash).
    pub fn remove_member(&self, path: &Path) -> Result<crate::volume::RemovedMember> {
        self.engine.remove_member(&path.display().to_string())
    }

    /// Rebalances this open volume over several members (DESIGN.md, "Rebalancing onto a
    /// member"): groups move, one at a time and while reads and writes go on, from the
    /// members holding the most to those holding the fewest until they differ by one at
    /// most (devices of different sizes: in proportion to capacity; a member's first
    /// group stays), so data written before a member was added is
    /// spread onto it. A balanced volume moves nothing. Errors: a single-file volume, a
    /// removal or a rebalance already running (nothing written); I/O errors (a move not
    /// begun is undone); a failed write or sync of a moved group's header poisons the
    /// store (the next open decides which copy holds the group, as after a crash).
    pub fn rebalance(&self) -> Result<crate::volume::Rebalanced> {
        self.engine.rebalance()
    }

    /// Whether a write, sync or commit failed (the device refused it: disk full, an I/O
    /// error): the store then refuses every write and commit, and acknowledges nothing
    /// more, until it is opened again (recovery replays what was durable).
    pub fn is_poisoned(&self) -> bool {
        self.engine.is_poisoned()
    }

    pub fn stats(&self) -> Stats {
        self.engine.stats()
    }

    /// Commits, then walks the whole committed volume and verifies every invariant and
    /// checksum. Writers keep running meanwhile; commits wait.
    pub fn check(&self) -> Result<CheckReport> {
        self.engine.check()
    }

    /// Commits and closes. Dropping the last handle does the same, ignoring errors.
    /// Other clones of this handle (and keyspace handles) keep the volume open until they
    /// are dropped, but no longer commit in the background.
    pub fn close(self) -> Result<()> {
        self.engine.finish()
    }

    /// Drops the handle as a process crash would: no flush, no sync, no commit; the
    /// volume lock is released once every handle is gone. Bytes already written to the
    /// file stay (as after a process crash); buffered writes still in memory are lost.
    /// For tests and benchmarks.
    #[doc(hidden)]
    pub fn abandon(self) {
        self.engine.abandon()
    }
}
