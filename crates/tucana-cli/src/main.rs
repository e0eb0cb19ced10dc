//! `tucana`: use a Tucana volume from the shell.
//!
//! Owns argument parsing, the mapping of outcomes to exit codes, and the one rule every
//! command follows: open the volume, run, then close it (which commits), also after an
//! error, so that whatever a command changed is durable when the process exits. It owns
//! no storage logic: everything goes through the public API of the `tucana` crate.
//!
//! Single-threaded; one command per process (the `shell` command runs many against one
//! open volume). The volume is locked by the engine, so a second process gets a clear
//! error instead of sharing it.

mod cluster;
mod cluster_ops;
mod commands;
mod crash_writer;
mod escape;
mod load;
mod lock_holder;
mod output;
mod readonly;
mod replication;
mod serve;
mod shell;
mod target;

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tucana::Database;

/// Where the volume lives when `--db` is not given.
const DEFAULT_VOLUME_PATH: &str = "./tucana-data/volume.tucana";

const AFTER_HELP: &str = "\
Keys and values are bytes written as text: \\\\ is a backslash, \\t a tab, \\n a newline,
\\xNN any other byte; every other character stands for its own (UTF-8) bytes. `scan`
prints the same form, so its output can be fed back to `load`. Put `--` before a key
or value that starts with '-'.

Every command that changes data makes it durable before it exits.

Exit codes:
  0  success
  1  the key (get, del) was not present
  2  error (message on stderr), including a failed `check` and bad usage";

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(
    name = "tucana",
    version,
    about = "Use a Tucana key-value volume from the shell."
)]
#[command(after_help = AFTER_HELP)]
pub struct Cli {
    /// The volume file; commands that write create it (and its directory) if missing.
    #[arg(long, global = true, value_name = "PATH", default_value = DEFAULT_VOLUME_PATH)]
    db: PathBuf,

    /// A further member file of a volume over several, after --db (member 0), in the
    /// order given at creation; repeat for each. Refused with a message naming the member
    /// when one is missing, swapped, duplicated or of another volume.
    #[arg(long = "member", global = true, value_name = "PATH")]
    members: Vec<PathBuf>,

    /// How a volume over several members picks the member of each new log segment:
    /// round-robin, or least weighted queue length (`lwql`). Not stored in the volume:
    /// give it at each open.
    #[arg(long, global = true, value_enum, default_value_t = MemberDispatch::RoundRobin)]
    member_dispatch: MemberDispatch,

    /// Background segment writes last until the device has the bytes (writeback waited
    /// for), so least-weighted-queue dispatch sees each device's backlog
    /// (`Options::segment_writes_wait_for_device`).
    #[arg(long, global = true)]
    segment_writes_wait_for_device: bool,

    /// Format a block device given as --db or --member that carries no Tucana volume,
    /// erasing what it holds (`Options::format_block_devices`). Without it such a device
    /// is refused, naming it; a device carrying a Tucana volume is never formatted.
    #[arg(long, global = true)]
    format_device: bool,

    /// Address space reserved for each member's read mapping, in MiB (default 64 GiB;
    /// `Options::mapping_reservation_bytes`). It costs no memory, but tools that cap a
    /// process's address space (valgrind, `ulimit -v`) refuse the default; the mapping
    /// still grows past a smaller reservation with the volume.
    #[arg(long, global = true, value_name = "MIB")]
    mapping_reservation_mib: Option<u64>,

    /// The keyspace to work in; commands that write create it if missing.
    #[arg(long, global = true, value_name = "NAME", default_value = "default")]
    keyspace: String,

    #[command(subcommand)]
    command: Command,
}

/// `--member-dispatch`'s values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum MemberDispatch {
    RoundRobin,
    Lwql,
}

impl Cli {
    /// The volume options the member flags ask for, on top of `options`.
    fn volume_options(&self, options: tucana::Options) -> tucana::Options {
        let options = match self.mapping_reservation_mib {
            Some(mib) => options.mapping_reservation_bytes(mib.saturating_mul(1 << 20)),
            None => options,
        };
        volume_options(
            self.member_dispatch,
            self.segment_writes_wait_for_device,
            options.format_block_devices(self.format_device),
        )
    }
}

/// `options` with the member flags' settings.
fn volume_options(
    dispatch: MemberDispatch,
    wait_for_device: bool,
    options: tucana::Options,
) -> tucana::Options {
    let policy = match dispatch {
        MemberDispatch::RoundRobin => tucana::volume::DispatchPolicy::RoundRobin,
        MemberDispatch::Lwql => tucana::volume::DispatchPolicy::LeastWeightedQueue,
    };
    options
        .member_dispatch(policy)
        .segment_writes_wait_for_device(wait_for_device)
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Sets KEY to VALUE.
    Put { key: OsString, value: OsString },
    /// Prints the value of KEY and a newline; exit 1 when KEY is absent.
    Get { key: OsString },
    /// Removes KEY; exit 1 when it was absent.
    Del { key: OsString },
    /// Prints `key<TAB>value` lines of a key range, in key order.
    Scan {
        /// First key (inclusive).
        #[arg(long, value_name = "KEY")]
        from: Option<OsString>,
        /// End key (exclusive).
        #[arg(long, value_name = "KEY")]
        to: Option<OsString>,
        /// Only keys that start with PREFIX (combines with --from and --to).
        #[arg(long)]
        prefix: Option<OsString>,
        /// In descending key order.
        #[arg(long)]
        rev: bool,
        /// At most N pairs.
        #[arg(long, value_name = "N")]
        limit: Option<u64>,
    },
    /// Reads `key<TAB>value` lines from stdin, puts them, prints how many.
    ///
    /// A malformed line stops the load with an error naming its line number; the
    /// lines before it stay loaded (and durable), nothing after it is loaded.
    Load {
        /// Make each write durable before the next (slow); by default writes are
        /// buffered and made durable once at the end.
        #[arg(long)]
        sync: bool,
    },
    /// Prints engine statistics as JSON.
    Stats,
    /// Verifies every invariant and checksum of the volume; exit 2 naming what is wrong.
    Check,
    /// Lists the keyspaces, one per line.
    Keyspaces,
    /// Drops keyspace NAME and all its data.
    DropKeyspace { name: String },
    /// Commits: persists the index as a new epoch.
    Commit,
    /// Garbage-collects the log now (relocates live records out of segments with dead
    /// space, frees them, gives the bytes back to the file system) and prints what it did
    /// as JSON.
    Gc,
    /// Rewrites the records of every keyspace in key order where they are scattered (so
    /// that scans of data not in memory read the device sequentially), then
    /// garbage-collects, and prints what it did as JSON.
    Reorganise,
    /// Reads commands from stdin, one per line, and prints their results (`help` lists them).
    Shell,
    /// Writes a seeded random mix until killed, acknowledging each call on stdout; the
    /// victim of `tucana-crashtest kill9` (see `crash_writer.rs`).
    #[command(hide = true)]
    CrashWriter {
        #[arg(long)]
        seed: u64,
        /// Garbage-collection-heavy mode: 64 KiB segments, a dozen hot keys per keyspace,
        /// background GC stepping every few milliseconds, forced passes among the writes.
        #[arg(long)]
        gc: bool,
        /// Defer every update of an existing key (`DeferredUpdates::Always`).
        #[arg(long)]
        deferred_updates: bool,
    },
    /// Adds PATH as the next member of the (closed) volume over --db and --member, then
    /// checks the volume over every member; give PATH as the last --member from then on.
    ///
    /// PATH: an empty or missing file, or a block device with --format-device. Refused,
    /// naming it, when it is a member already, of another volume, or holds data; a
    /// single-file volume cannot take members. Interrupted, it can be run again.
    AddMember {
        /// The new member's file or block device.
        path: PathBuf,
    },
    /// Removes PATH, one of --db and --member, from the (closed) volume: copies the groups
    /// it holds onto the other members, marks it removed in the member table, then checks
    /// the volume over the others; leave PATH out of --member from then on.
    ///
    /// Refused, with nothing written: member 0 (--db: it holds the superblock and the
    /// table), a path not given, a removal that would leave one member, a volume open
    /// elsewhere. Interrupted, the volume is the old one or the new one, and the removal
    /// can be run again while it is the old one.
    RemoveMember {
        /// The member's file or block device, as given to --member.
        path: PathBuf,
    },
    /// Moves whole groups from the members holding the most to those holding the fewest
    /// until they differ by one at most (block devices of different sizes: until each is
    /// filled to about the same share of its capacity; a member's first group stays), so data written
    /// before a member was added is spread onto it; prints what moved and the groups per
    /// member, then checks the volume. The volume must be closed.
    ///
    /// Refused, with nothing written: a single-file volume, a volume open elsewhere, a
    /// wrong member set. Interrupted, the volume opens (each group on its old slot or its
    /// new one) and the rebalance can be run again. A balanced volume moves nothing.
    Rebalance,
    /// Serves the volume over RESP (the Redis protocol) until SIGINT, SIGTERM or SHUTDOWN.
    ///
    /// Redis clients, redis-cli and redis-benchmark work against it. SELECT 0 is the
    /// keyspace `default`, SELECT n the keyspace `dbN`; --keyspace is ignored.
    Serve(Box<serve::ServeArgs>),
    /// Shows or changes replication: of a running server (--server HOST:PORT) or of the
    /// volume at --db when no server holds it.
    ///
    /// `status` prints role, backups (lag in bytes and seconds) and replicas (term, the
    /// primary's commit last applied); `promote` makes every replica a keyspace that
    /// takes writes, at a higher term, so its old primary is refused from then on.
    Replication(replication::ReplicationArgs),
    /// Creates or shows a cluster of `tucana serve --cluster-etcd` servers, whose map is
    /// kept in etcd (`create`: split the slots over the named servers; `status`: print the
    /// map and which servers are live).
    Cluster(cluster::ClusterArgs),
}

impl Command {
    /// Whether the command may create the volume. Commands that only read (or that
    /// would have nothing to act on in a new volume) report a missing volume instead
    /// of creating an empty one as a side effect of a typo in `--db`.
    fn creates_volume(&self) -> bool {
        matches!(
            self,
            Command::Put { .. } | Command::Load { .. } | Command::Shell | Command::Serve(_)
        )
    }
}

impl Command {
    /// Whether the command only reads the volume: it opens it read-only (`readonly`),
    /// so the file is left as it was and may be on read-only media or another user's.
    fn only_reads(&self) -> bool {
        matches!(
            self,
            Command::Get { .. }
                | Command::Scan { .. }
                | Command::Stats
                | Command::Check
                | Command::Keyspaces
        )
    }
}

/// How a command that did not fail ended; decides the exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Done,
    /// The key asked for was not there (`get`, `del`).
    Absent,
    /// Some commands of a `shell` session failed; each printed its own error already.
    ShellErrors,
}

impl Outcome {
    fn exit_code(self) -> ExitCode {
        match self {
            Outcome::Done => ExitCode::from(EXIT_OK),
            Outcome::Absent => ExitCode::from(EXIT_ABSENT),
            Outcome::ShellErrors => ExitCode::from(EXIT_ERROR),
        }
    }
}

const EXIT_OK: u8 = 0;
const EXIT_ABSENT: u8 = 1;
/// Also what clap uses for usage errors.
const EXIT_ERROR: u8 = 2;

/// Why a command failed.
#[derive(Debug)]
pub enum CliError {
    /// Printed as `error: <message>`, exit 2.
    Message(String),
    /// Whoever read our stdout went away (`tucana scan | head`): stop quietly, since
    /// nobody is left to read the rest; the volume is still closed properly.
    StdoutClosed,
}

impl CliError {
    pub fn msg(message: impl Into<String>) -> CliError {
        CliError::Message(message.into())
    }

    /// Prefixes the message with what was being done.
    pub fn context(self, what: impl fmt::Display) -> CliError {
        match self {
            CliError::Message(message) => CliError::Message(format!("{what}: {message}")),
            CliError::StdoutClosed => CliError::StdoutClosed,
        }
    }
}

impl From<tucana::Error> for CliError {
    fn from(error: tucana::Error) -> CliError {
        CliError::Message(error.to_string())
    }
}

fn main() -> ExitCode {
    // Crash points armed by FAILPOINTS, in a binary built with the `failpoints` feature
    // (for `tucana-crashtest failover`).
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    let cli = Cli::parse();
    match run(cli) {
        Ok(outcome) => outcome.exit_code(),
        Err(CliError::StdoutClosed) => ExitCode::from(EXIT_OK),
        Err(CliError::Message(message)) => {
            eprintln!("error: {message}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

fn run(cli: Cli) -> Result<Outcome, CliError> {
    if let Command::CrashWriter {
        seed,
        gc,
        deferred_updates,
    } = cli.command
    {
        // Opens with its own options and never closes: it runs until it is killed.
        let mode = crash_writer::Mode {
            gc,
            deferred: deferred_updates,
        };
        return crash_writer::run(&cli.db, seed, mode);
    }
    if let Command::Serve(args) = &cli.command {
        // The server opens the volume with its own options and closes it itself.
        let options = |o| cli.volume_options(o);
        return serve::run(&cli.db, &cli.members, &options, args);
    }
    if let Command::Cluster(args) = &cli.command {
        // Speaks to etcd only; no volume.
        return cluster::run(args);
    }
    if let Command::Replication(args) = &cli.command {
        if let Some(addr) = &args.server {
            return replication::run_on_server(args, addr);
        }
    }
    if let Command::AddMember { path } = &cli.command {
        return add_member(&cli, path);
    }
    if let Command::RemoveMember { path } = &cli.command {
        return remove_member(&cli, path);
    }
    if let Command::Rebalance = &cli.command {
        return rebalance(&cli);
    }
    let db = if cli.command.only_reads() && cli.members.is_empty() {
        open_read_only(&cli.db, cli.volume_options(Database::builder()))?
    } else {
        open_members_with(
            &cli.db,
            &cli.members,
            cli.command.creates_volume(),
            cli.volume_options(Database::builder()),
        )?
    };
    let result = commands::run(&db, &cli.keyspace, cli.command);
    // Close even when the command failed: `load` promises that the lines before a bad
    // one are durable, and close is what commits them.
    let closed = db.close();
    match (result, closed) {
        (Ok(outcome), Ok(())) => Ok(outcome),
        (Err(error), Ok(())) => Err(error),
        // Even when nobody reads stdout any more, a failed close must be reported: the
        // command's changes may not be durable.
        (Ok(_) | Err(CliError::StdoutClosed), Err(close_error)) => {
            Err(CliError::from(close_error)
                .context("closing the volume (changes may not be durable)"))
        }
        (Err(CliError::Message(message)), Err(close_error)) => Err(CliError::msg(format!(
            "{message}; closing the volume failed too (changes may not be durable): {close_error}"
        ))),
    }
}

/// `add-member PATH`: adds it, prints what was added, then opens the volume over every
/// member and checks it.
fn add_member(cli: &Cli, new: &Path) -> Result<Outcome, CliError> {
    let mut paths = vec![cli.db.clone()];
    paths.extend(cli.members.iter().cloned());
    let options = cli.volume_options(Database::builder());
    let added = options.add_member(&paths, new).map_err(|e| {
        CliError::from(e).context(format_args!(
            "cannot add {} to the volume over {} members at {}",
            new.display(),
            paths.len(),
            cli.db.display()
        ))
    })?;
    println!(
        "added {} as member {} (uuid {}, group {}, member table generation {})",
        new.display(),
        added.index,
        added.uuid,
        added.group,
        added.generation
    );
    paths.push(new.to_path_buf());
    let db = open_members_with(&cli.db, &paths[1..], false, options)?;
    let checked = db.check().map_err(|e| {
        CliError::from(e).context("checking the volume over every member after the add")
    });
    let closed = db.close().map_err(CliError::from);
    checked?;
    closed?;
    println!("checked the volume over {} members", paths.len());
    Ok(Outcome::Done)
}

/// `remove-member PATH`: removes it, prints what moved, then opens the volume over the
/// members left and checks it.
fn remove_member(cli: &Cli, path: &Path) -> Result<Outcome, CliError> {
    let mut paths = vec![cli.db.clone()];
    paths.extend(cli.members.iter().cloned());
    let options = cli.volume_options(Database::builder());
    let removed = options.remove_member(&paths, path).map_err(|e| {
        CliError::from(e).context(format_args!(
            "cannot remove {} from the volume over {} members at {}",
            path.display(),
            paths.len(),
            cli.db.display()
        ))
    })?;
    println!(
        "removed {} (member {}): {} groups, {} bytes moved onto the other members; member table generation {}",
        path.display(),
        removed.index,
        removed.groups_moved,
        removed.bytes_moved,
        removed.generation
    );
    let left: Vec<PathBuf> = paths
        .iter()
        .filter(|p| !same_file(p, path))
        .cloned()
        .collect();
    let db = open_members_with(&cli.db, &left[1..], false, options)?;
    let checked = db.check().map_err(|e| {
        CliError::from(e).context("checking the volume over the members left after the removal")
    });
    let closed = db.close().map_err(CliError::from);
    checked?;
    closed?;
    println!("checked the volume over {} members", left.len());
    Ok(Outcome::Done)
}

/// `rebalance`: evens out the groups over the members, prints what moved and the groups
/// per member, then opens the volume and checks it.
fn rebalance(cli: &Cli) -> Result<Outcome, CliError> {
    let mut paths = vec![cli.db.clone()];
    paths.extend(cli.members.iter().cloned());
    let options = cli.volume_options(Database::builder());
    let done = options.rebalance(&paths).map_err(|e| {
        CliError::from(e).context(format_args!(
            "cannot rebalance the volume over {} members at {}",
            paths.len(),
            cli.db.display()
        ))
    })?;
    let groups: Vec<String> = done.groups.iter().map(u64::to_string).collect();
    println!(
        "rebalanced: {} groups, {} bytes moved; groups per member: {}",
        done.groups_moved,
        done.bytes_moved,
        groups.join(" ")
    );
    let db = open_members_with(&cli.db, &paths[1..], false, options)?;
    let checked = db
        .check()
        .map_err(|e| CliError::from(e).context("checking the volume after the rebalance"));
    let closed = db.close().map_err(CliError::from);
    checked?;
    closed?;
    println!("checked the volume over {} members", paths.len());
    Ok(Outcome::Done)
}

/// Whether two paths name one file (by identity, or spelled the same).
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => (x.dev(), x.ino(), x.rdev()) == (y.dev(), y.ino(), y.rdev()),
        _ => a == b,
    }
}

/// The volume at `path`, with its further members when there are any.
fn open_members_with(
    path: &Path,
    members: &[PathBuf],
    create: bool,
    options: tucana::Options,
) -> Result<Database, CliError> {
    if members.is_empty() {
        return open_volume_with(path, create, options);
    }
    let mut paths = vec![path.to_path_buf()];
    paths.extend(members.iter().cloned());
    if create {
        for parent in paths
            .iter()
            .filter_map(|p| p.parent())
            .filter(|p| !p.as_os_str().is_empty())
        {
            std::fs::create_dir_all(parent).map_err(|e| {
                CliError::msg(format!("cannot create directory {}: {e}", parent.display()))
            })?;
        }
    }
    options
        .create_if_missing(create)
        .open_members(&paths)
        .map_err(|e| {
            CliError::from(e).context(format_args!(
                "cannot open the volume over {} members at {}",
                paths.len(),
                path.display()
            ))
        })
}

fn open_volume_with(
    path: &Path,
    create: bool,
    options: tucana::Options,
) -> Result<Database, CliError> {
    if create {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| {
                CliError::msg(format!("cannot create directory {}: {e}", parent.display()))
            })?;
        }
    } else if !path.exists() {
        return Err(CliError::msg(format!(
            "no volume at {} (put, load and shell create one; --db names another)",
            path.display()
        )));
    }
    let opened = options.create_if_missing(create).open(path);
    opened.map_err(|e| open_error(path, e))
}

/// The volume at `path` opened read-only (`readonly`): nothing is written to its file.
fn open_read_only(path: &Path, options: tucana::Options) -> Result<Database, CliError> {
    if !path.exists() {
        return Err(CliError::msg(format!(
            "no volume at {} (put, load and shell create one; --db names another)",
            path.display()
        )));
    }
    readonly::open(path, options).map_err(|e| open_error(path, e))
}

/// Why the volume at `path` could not be opened; a lock names who holds it.
fn open_error(path: &Path, error: tucana::Error) -> CliError {
    let locked = matches!(error, tucana::Error::Locked);
    let mut message = CliError::from(error).context(format_args!("cannot open {}", path.display()));
    if locked {
        let holder = lock_holder::describe(path)
            .map(|h| format!("held by {h}"))
            .unwrap_or_else(|| "its holder could not be found in /proc/locks".into());
        message = CliError::msg(match message {
            CliError::Message(m) => format!(
                "{m}: {holder} (a `tucana serve` or another command on this volume; read-only \
                 commands share it with each other, not with a writer)"
            ),
            CliError::StdoutClosed => holder,
        });
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn global_flags_work_after_the_subcommand_and_defaults_apply() {
        let cli = Cli::try_parse_from(["tucana", "get", "k", "--keyspace", "users"]).unwrap();
        assert_eq!(cli.keyspace, "users");
        assert_eq!(cli.db, PathBuf::from(DEFAULT_VOLUME_PATH));
        assert!(matches!(cli.command, Command::Get { .. }));
    }

    #[test]
    fn a_value_starting_with_a_dash_needs_the_double_dash() {
        assert!(Cli::try_parse_from(["tucana", "put", "k", "-1"]).is_err());
        let cli = Cli::try_parse_from(["tucana", "put", "--", "k", "-1"]).unwrap();
        match cli.command {
            Command::Put { key, value } => {
                assert_eq!(key, "k");
                assert_eq!(value, "-1");
            }
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn only_writing_commands_create_the_volume() {
        let creates = |args: &[&str]| {
            let mut argv = vec!["tucana"];
            argv.extend_from_slice(args);
            Cli::try_parse_from(argv).unwrap().command.creates_volume()
        };
        assert!(creates(&["put", "k", "v"]));
        assert!(creates(&["load"]));
        assert!(creates(&["shell"]));
        assert!(!creates(&["get", "k"]));
        assert!(!creates(&["scan"]));
        assert!(!creates(&["check"]));
        assert!(!creates(&["del", "k"]));
    }

    #[test]
    fn help_documents_the_exit_codes() {
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("Exit codes:"), "{help}");
        assert!(help.contains("1  the key"), "{help}");
    }
}
