//! The commands of `tucana` against an open database. `shell` hands stdin to module
//! `shell`; every command reaches its keyspace through module `target`.
//!
//! Owns what each command prints and which outcome it reports. Does not open or close
//! the volume (`main` does, so that closing happens on every path) and does not parse
//! arguments. Single-threaded.

use std::ffi::OsStr;
use std::io::{self, IsTerminal};

use tucana::{CheckReport, Database, Durability};

use crate::output::Output;
use crate::target::{delete, get, scan, ScanBounds, Target};
use crate::{escape, load, replication, shell, CliError, Command, Outcome};

pub fn run(db: &Database, keyspace: &str, command: Command) -> Result<Outcome, CliError> {
    let mut out = Output::stdout();
    let mut target = Target::new(db, keyspace);
    let outcome = match command {
        Command::Put { key, value } => {
            let key = arg_bytes(&key, "KEY")?;
            let value = arg_bytes(&value, "VALUE")?;
            target.for_write()?.put(&key, &value)?;
            Outcome::Done
        }
        Command::Get { key } => {
            let key = arg_bytes(&key, "KEY")?;
            match get(&mut target, &key)? {
                Some(value) => {
                    out.escaped_line(&value)?;
                    Outcome::Done
                }
                None => Outcome::Absent,
            }
        }
        Command::Del { key } => {
            let key = arg_bytes(&key, "KEY")?;
            if delete(&mut target, &key)? {
                Outcome::Done
            } else {
                Outcome::Absent
            }
        }
        Command::Scan {
            from,
            to,
            prefix,
            rev,
            limit,
        } => {
            let from = from.map(|k| arg_bytes(&k, "--from")).transpose()?;
            let to = to.map(|k| arg_bytes(&k, "--to")).transpose()?;
            let prefix = prefix.map(|k| arg_bytes(&k, "--prefix")).transpose()?;
            let bounds = ScanBounds::new(from, to, prefix.as_deref());
            scan(&mut target, &bounds, rev, limit, &mut out)?;
            Outcome::Done
        }
        Command::Load { sync } => {
            let durability = if sync {
                Durability::Sync
            } else {
                Durability::Buffered
            };
            let loaded = load::load_stdin(target.for_write()?, durability)?;
            out.line(&loaded.to_string())?;
            Outcome::Done
        }
        Command::Stats => {
            out.line(&db.stats().to_json())?;
            Outcome::Done
        }
        Command::Check => {
            let report = db
                .check()
                .map_err(|e| CliError::from(e).context("check failed"))?;
            print_check_report(&report, &mut out)?;
            Outcome::Done
        }
        Command::Keyspaces => {
            for name in db.keyspace_names() {
                out.line(&name)?;
            }
            Outcome::Done
        }
        Command::DropKeyspace { name } => {
            db.drop_keyspace(&name)?;
            Outcome::Done
        }
        Command::Commit => {
            db.commit()?;
            Outcome::Done
        }
        Command::Gc => {
            let before = db.stats();
            db.gc()?;
            let after = db.stats();
            out.line(&format!(
                "{{\"relocated_bytes\":{},\"reclaimed_bytes\":{},\"space_used_bytes_before\":{},\"space_used_bytes_after\":{}}}",
                after.gc_relocated_bytes - before.gc_relocated_bytes,
                after.gc_reclaimed_bytes - before.gc_reclaimed_bytes,
                before.space_used_bytes,
                after.space_used_bytes
            ))?;
            Outcome::Done
        }
        Command::Reorganise => {
            let report = db.reorganise()?;
            out.line(&format!(
                "{{\"leaves_seen\":{},\"leaves_rewritten\":{},\"records_copied\":{},\"bytes_taken\":{}}}",
                report.leaves_seen, report.leaves_rewritten, report.records_copied, report.bytes_taken
            ))?;
            Outcome::Done
        }
        Command::Shell => {
            let stdin = io::stdin();
            let interactive = stdin.is_terminal();
            shell::run(&mut target, stdin.lock(), interactive, &mut out)?
        }
        // `main` runs it before opening the volume: it opens with options of its own.
        Command::CrashWriter { .. } => {
            return Err(CliError::msg("crash-writer runs without an open volume"))
        }
        // `main` runs the server itself: it opens the volume with its own options.
        Command::Serve(_) => unreachable!("serve is dispatched by main"),
        Command::Cluster(_) => unreachable!("cluster is dispatched by main"),
        Command::AddMember { .. } => unreachable!("add-member is dispatched by main"),
        Command::RemoveMember { .. } => unreachable!("remove-member is dispatched by main"),
        Command::Rebalance => unreachable!("rebalance is dispatched by main"),
        Command::Replication(args) => replication::run_on_volume(db, &args)?,
    };
    out.flush()?;
    Ok(outcome)
}

fn print_check_report(report: &CheckReport, out: &mut Output) -> Result<(), CliError> {
    out.line("volume is sound")?;
    let CheckReport {
        commit_epoch,
        keyspaces,
        index_nodes,
        keys,
        log_segments,
        log_records,
        allocated_blocks,
        unreferenced_blocks,
        members,
    } = report;
    for (name, value) in [
        ("commit_epoch", commit_epoch),
        ("keyspaces", keyspaces),
        ("index_nodes", index_nodes),
        ("keys", keys),
        ("log_segments", log_segments),
        ("log_records", log_records),
        ("allocated_blocks", allocated_blocks),
        ("unreferenced_blocks", unreferenced_blocks),
        ("members", members),
    ] {
        out.line(&format!("{name}: {value}"))?;
    }
    Ok(())
}

/// The bytes an escaped command-line argument stands for.
fn arg_bytes(arg: &OsStr, what: &str) -> Result<Vec<u8>, CliError> {
    escape::unescape(&os_bytes(arg, what)?).map_err(|e| CliError::msg(format!("{what}: {e}")))
}

#[cfg(unix)]
fn os_bytes(arg: &OsStr, _what: &str) -> Result<Vec<u8>, CliError> {
    use std::os::unix::ffi::OsStrExt;
    Ok(arg.as_bytes().to_vec())
}

#[cfg(not(unix))]
fn os_bytes(arg: &OsStr, what: &str) -> Result<Vec<u8>, CliError> {
    arg.to_str()
        .map(|text| text.as_bytes().to_vec())
        .ok_or_else(|| {
            CliError::msg(format!(
                "{what} is not valid Unicode; write other bytes as \\xNN"
            ))
        })
}
