//! Opening a member set by paths: each path a file (`FileStorage`) or a raw block device
//! (`BlockDevice`), duplicates refused by identity before anything is locked, and which
//! members are blank (may be written by a creation).
//!
//! Owns: turning paths into backends (a member to add to an open volume included). Does not own: the checks of the set
//! (`MemberSet::open_with_blank`, in `members.rs`).
//!
//! Thread-safety: runs once, on the opening thread.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::MemberSet;
use crate::error::{Error, Result};
use crate::volume::slot_header::MEMBERS_MAX;
use crate::volume::{FileStorage, Storage};

/// A member's name for messages and its backend.
pub type NamedStorage = (String, Arc<dyn Storage>);

impl MemberSet {
    /// Opens (or, when every member is empty and `create_if_missing`, creates) a volume
    /// over the member files at `paths`, in order. Each file is locked as `FileStorage`
    /// locks a single-file volume.
    ///
    /// Errors (nothing is written before every check passed): `Error::Members` naming the
    /// member for a duplicate path, a missing file, a member of another volume, a member
    /// given at another position, a member missing from the list or not in the table;
    /// `Error::InvalidArgument` for fewer than two or more than `MEMBERS_MAX` paths.
    pub fn open_paths(
        paths: &[PathBuf],
        create_if_missing: bool,
        min_reservation_bytes: u64,
    ) -> Result<MemberSet> {
        MemberSet::open_paths_formatting(paths, create_if_missing, false, min_reservation_bytes)
    }

    /// As `open_paths`; a path naming a block device opens it as one
    /// (`crate::volume::BlockDevice`), and `format_block_devices` lets creation format a
    /// device that carries nothing Tucana wrote (without it such a device is "not a
    /// member", never written). Errors also: a device under one slot (128 MiB).
    pub fn open_paths_formatting(
        paths: &[PathBuf],
        create_if_missing: bool,
        format_block_devices: bool,
        min_reservation_bytes: u64,
    ) -> Result<MemberSet> {
        if paths.len() < 2 || paths.len() > MEMBERS_MAX {
            return Err(Error::InvalidArgument(format!(
                "a volume over several members takes 2 to {MEMBERS_MAX} paths, not {}",
                paths.len()
            )));
        }
        let (members, blank) = MemberSet::open_storages(
            paths,
            create_if_missing,
            format_block_devices,
            min_reservation_bytes,
        )?;
        MemberSet::open_with_blank(members, &blank, create_if_missing)
    }

    /// The backends of `paths` (files created only when `create_if_missing` and none of
    /// them exists) and which are blank; a duplicate (by identity) is refused before
    /// anything is locked.
    pub(super) fn open_storages(
        paths: &[PathBuf],
        create_if_missing: bool,
        format_block_devices: bool,
        min_reservation_bytes: u64,
    ) -> Result<(Vec<NamedStorage>, Vec<bool>)> {
        // Duplicates first, by file identity (two spellings of one file, or a hard link),
        // before anything is locked: the second lock would only say "locked".
        let mut identities: Vec<(u64, u64)> = Vec::new();
        for (i, path) in paths.iter().enumerate() {
            let Some(id) = file_identity(path) else {
                continue;
            };
            if let Some(j) = identities.iter().position(|&other| other == id) {
                return Err(Error::Members(format!(
                    "member {i} ({}) is the same file as member {j} ({})",
                    path.display(),
                    paths[j].display()
                )));
            }
            identities.push(id);
        }
        // Files are created only when none exists; devices always exist.
        let any_file_exists = paths
            .iter()
            .any(|p| p.exists() && !crate::volume::blockdev::is_block_device(p));
        let mut members = Vec::with_capacity(paths.len());
        let mut blank = Vec::with_capacity(paths.len());
        for (i, path) in paths.iter().enumerate() {
            let name = path.display().to_string();
            let storage: Arc<dyn Storage> = if crate::volume::blockdev::is_block_device(path) {
                let device = crate::volume::BlockDevice::open(path, min_reservation_bytes)?;
                // Blank: formatting was asked for and nothing of ours is on it.
                blank.push(
                    format_block_devices
                        && !crate::volume::blockdev::carries_tucana(&device, &name)?,
                );
                Arc::new(device)
            } else {
                let file = FileStorage::open_with_min_reservation(
                    path,
                    create_if_missing && !any_file_exists,
                    min_reservation_bytes,
                )
                .map_err(|e| match e {
                    Error::Io(io) if io.kind() == std::io::ErrorKind::NotFound => {
                        Error::Members(format!("member {i} ({name}) is missing: {io}"))
                    }
                    other => other,
                })?;
                blank.push(file.len_bytes()? == 0);
                Arc::new(file)
            };
            members.push((name, storage));
        }
        Ok((members, blank))
    }
}

impl MemberSet {
    /// The backend of a member to add to an open volume whose members are named
    /// `existing` (their paths): the file is created if missing; a block device is
    /// opened as `open_paths_formatting` does. Returns it with its name and whether it is
    /// blank. Errors: a path that is one of `existing` (by identity: `Error::Members`,
    /// naming both, before anything is created or locked), or the open's.
    pub fn open_new_member(
        path: &Path,
        existing: &[String],
        format_block_devices: bool,
        min_reservation_bytes: u64,
    ) -> Result<(NamedStorage, bool)> {
        if let Some(id) = file_identity(path) {
            if let Some((j, name)) = existing
                .iter()
                .enumerate()
                .find(|(_, name)| file_identity(Path::new(name)) == Some(id))
            {
                return Err(Error::Members(format!(
                    "new member ({}) is the same file as member {j} ({name})",
                    path.display()
                )));
            }
        }
        create_if_missing(path)?;
        let (mut members, blank) = MemberSet::open_storages(
            &[path.to_path_buf()],
            false,
            format_block_devices,
            min_reservation_bytes,
        )?;
        Ok((members.pop().expect("one path, one member"), blank[0]))
    }
}

/// Creates an empty file at `path` for a new member, unless something is there (a file
/// or a device, which the open that follows judges).
pub(super) fn create_if_missing(path: &Path) -> Result<()> {
    if !path.exists() {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| {
                Error::Members(format!(
                    "new member ({}): cannot create: {e}",
                    path.display()
                ))
            })?;
    }
    Ok(())
}

/// (device, inode) of an existing file, or (`u64::MAX`, device number) of a block device
/// (two device nodes of one device are one member); `None` if it cannot be stat'ed.
pub(super) fn file_identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let metadata = std::fs::metadata(path).ok()?;
    if metadata.file_type().is_block_device() {
        return Some((u64::MAX, metadata.rdev()));
    }
    Some((metadata.dev(), metadata.ino()))
}
