//! Commands about the server rather than the data: COMMAND (the table as clients read
//! it), CONFIG GET and SET (the run-time settings are `settings`'), TIME, SAVE, BGSAVE,
//! BGREWRITEAOF, SHUTDOWN, TUCANA.ADDMEMBER, TUCANA.REMOVEMEMBER, TUCANA.REBALANCE (INFO has its own file,
//! `info`).
//!
//! Owns how the command table, the configuration and the engine's maintenance (commit,
//! garbage collection) are shown to Redis clients. SHUTDOWN only asks: the connection
//! stops the server once its reply is written.
//!
//! Thread-safety: handlers are plain functions; SAVE, BGSAVE and BGREWRITEAOF wait on
//! the device (the connection runs them on a thread that may block).

use std::time::{SystemTime, UNIX_EPOCH};

use crate::config::DurabilityMode;
use crate::glob::glob_match;
use crate::resp::{Protocol, Reply};

use super::table::{lookup, table, Run, Spec};
use super::{printable, syntax_error, wrong_args, Call};

/// One command as `COMMAND` describes it: name, arity, flags, first key, last key, step.
fn command_entry(spec: &Spec, protocol: Protocol) -> Reply {
    let write = matches!(spec.run, Run::Write(_)) || matches!(spec.name, "flushdb" | "flushall");
    let flag = if write { "write" } else { "readonly" };
    let flags = vec![Reply::Status(flag.into())];
    Reply::Array(vec![
        Reply::bulk(spec.name),
        Reply::Int(i64::from(spec.arity)),
        if protocol == Protocol::Resp3 {
            Reply::Set(flags)
        } else {
            Reply::Array(flags)
        },
        Reply::Int(i64::from(spec.command_keys().0)),
        Reply::Int(i64::from(spec.command_keys().1)),
        Reply::Int(i64::from(spec.command_keys().2)),
    ])
}

pub(super) fn cmd_command(call: &mut Call<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let protocol = call.session.protocol;
    let Some(sub) = args.get(1) else {
        return Ok(Reply::Array(
            table().iter().map(|s| command_entry(s, protocol)).collect(),
        ));
    };
    Ok(match sub.to_ascii_uppercase().as_slice() {
        b"COUNT" => Reply::Int(table().len() as i64),
        b"INFO" => Reply::Array(
            args[2..]
                .iter()
                .map(|n| lookup(n).map_or(Reply::Nil, |i| command_entry(&table()[i], protocol)))
                .collect(),
        ),
        // redis-cli asks for documentation to show hints; we have none to give.
        b"DOCS" => Reply::Map(vec![]),
        b"LIST" => Reply::Array(table().iter().map(|s| Reply::bulk(s.name)).collect()),
        _ => Reply::error(format!(
            "ERR unknown subcommand '{}'. Supported: COUNT INFO DOCS LIST",
            printable(sub, 32)
        )),
    })
}

/// CONFIG GET answers the parameters clients and tools ask about; CONFIG SET is refused
/// (the server is configured by its command line).
pub(super) fn cmd_config(call: &mut Call<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let sub = args[1].to_ascii_uppercase();
    match sub.as_slice() {
        b"GET" if args.len() >= 3 => Ok(config_get(call, &args[2..])),
        b"GET" => Ok(wrong_args("config|get")),
        b"SET" if args.len() >= 4 && args.len().is_multiple_of(2) => {
            let pairs: Vec<(&[u8], &[u8])> = args[2..]
                .chunks(2)
                .map(|p| (p[0].as_slice(), p[1].as_slice()))
                .collect();
            Ok(match call.state.settings.set(&pairs) {
                Ok(()) => Reply::Ok,
                Err(why) => Reply::error(format!("ERR {why}")),
            })
        }
        b"SET" => Ok(wrong_args("config|set")),
        b"RESETSTAT" | b"REWRITE" => Ok(Reply::error(format!(
            "ERR CONFIG {} is not supported: tucana serve is configured by its command line (CONFIG GET reads it, CONFIG SET changes {})",
            printable(&args[1], 32),
            crate::settings::SETTABLE
        ))),
        // Redis's words, which clients match.
        _ => Ok(Reply::error(format!(
            "ERR unknown subcommand '{}'. Try CONFIG HELP.",
            printable(&args[1], 32)
        ))),
    }
}

/// `CONFIG GET pattern...`: the command line's settings and the run-time ones.
fn config_get(call: &Call<'_>, patterns: &[Vec<u8>]) -> Reply {
    let config = &call.state.config;
    // The command line's, then the run-time ones, in the order clients saw before.
    let mut params: Vec<(String, String)> = vec![
        ("bind".into(), config.listen.ip().to_string()),
        ("port".into(), config.listen.port().to_string()),
        ("databases".into(), config.databases.to_string()),
    ];
    let mut settings = call.state.settings.values().into_iter();
    params.extend(settings.by_ref().take(3)); // maxclients, timeout, appendonly
    params.push((
        "appendfsync".into(),
        match config.durability {
            DurabilityMode::Sync => "always".into(),
            DurabilityMode::Buffered => "everysec".into(),
        },
    ));
    params.extend(settings.by_ref().take(2)); // save, maxmemory
    params.push(("maxmemory-policy".into(), "noeviction".into()));
    params.push((
        "proto-max-bulk-len".into(),
        config.request_limits.max_bulk_bytes.to_string(),
    ));
    params.extend(settings);
    let mut out = Vec::new();
    for (name, value) in &params {
        if patterns
            .iter()
            .any(|p| glob_match(&p.to_ascii_lowercase(), name.as_bytes()))
        {
            out.push((Reply::bulk(name.as_str()), Reply::bulk(value.as_str())));
        }
    }
    Reply::Map(out)
}

pub(super) fn cmd_time(_call: &mut Call<'_>, _args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Ok(Reply::Array(vec![
        Reply::Bulk(now.as_secs().to_string().into_bytes()),
        Reply::Bulk(now.subsec_micros().to_string().into_bytes()),
    ]))
}

/// SAVE: a commit (the index is persisted as a new epoch; the data was in the log).
pub(super) fn cmd_save(call: &mut Call<'_>, _args: &[Vec<u8>]) -> tucana::Result<Reply> {
    commit_and_ship_index(call)?;
    Ok(Reply::Ok)
}

/// A commit; a primary then ships its index to its backups without folding it into
/// later commits, so their indexes become current too.
fn commit_and_ship_index(call: &mut Call<'_>) -> tucana::Result<()> {
    call.state.store.db.commit()?;
    if let Some(replication) = &call.state.replication {
        replication.ship_index_now();
    }
    Ok(())
}

/// BGSAVE: the same commit, done before answering (it is quick: only the index changes).
pub(super) fn cmd_bgsave(call: &mut Call<'_>, _args: &[Vec<u8>]) -> tucana::Result<Reply> {
    commit_and_ship_index(call)?;
    Ok(Reply::Status("Background saving started".into()))
}

/// BGREWRITEAOF: a forced garbage collection of the log, Redis's way of compacting its
/// append-only file; done before answering, and INFO persistence counts what it gave back.
pub(super) fn cmd_bgrewriteaof(call: &mut Call<'_>, _args: &[Vec<u8>]) -> tucana::Result<Reply> {
    call.state.store.db.gc()?;
    Ok(Reply::Status(
        "Background append only file rewriting started".into(),
    ))
}

/// `TUCANA.ADDMEMBER path`: adds the file or block device at `path` (on the server's
/// machine; a missing file is created) as the next member of the served volume over
/// several members, while it serves (`Database::add_member`; DESIGN.md, "Adding a
/// member"). Replies `index=… uuid=… group=… generation=…`; a refusal is an `ERR` naming
/// why, with nothing written. Served only with `--enable-add-member-command`.
pub(super) fn cmd_addmember(call: &mut Call<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let enabled = call.state.config.enable_add_member_command;
    let path = match member_path(enabled, "ADDMEMBER", "add", &args[1]) {
        Ok(path) => path,
        Err(refused) => return Ok(refused),
    };
    Ok(match call.state.store.db.add_member(path) {
        Ok(added) => Reply::Bulk(
            format!(
                "index={} uuid={} group={} generation={}",
                added.index, added.uuid, added.group, added.generation
            )
            .into_bytes(),
        ),
        Err(e) => member_error("ADDMEMBER", &e),
    })
}

/// `TUCANA.REMOVEMEMBER path`: takes the member at `path` out of the served volume over
/// several members while it serves (`Database::remove_member`; DESIGN.md, "Removing a
/// member"): its groups are copied onto the other members, writes going on, then the
/// member table marks it removed. Replies `index=… groups_moved=… bytes_moved=…
/// rewritten_bytes=… generation=…`; a refusal (member 0, a path that is not a member,
/// the last member but one) is an `ERR` naming why, with nothing written. The copy runs
/// on a blocking thread; the next start must leave the member's `--member` out. Served
/// only with `--enable-remove-member-command`.
pub(super) fn cmd_removemember(call: &mut Call<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let enabled = call.state.config.enable_remove_member_command;
    let path = match member_path(enabled, "REMOVEMEMBER", "remove", &args[1]) {
        Ok(path) => path,
        Err(refused) => return Ok(refused),
    };
    Ok(match call.state.store.db.remove_member(path) {
        Ok(removed) => Reply::Bulk(
            format!(
                "index={} groups_moved={} bytes_moved={} rewritten_bytes={} generation={}",
                removed.index,
                removed.groups_moved,
                removed.bytes_moved,
                removed.rewritten_bytes,
                removed.generation
            )
            .into_bytes(),
        ),
        Err(e) => member_error("REMOVEMEMBER", &e),
    })
}

/// `TUCANA.REBALANCE`: moves whole groups between the members of the served volume,
/// one at a time while it serves, until they hold as many groups within one
/// (`Database::rebalance`; DESIGN.md, "Rebalancing onto a member"), so data written
/// before a member was added is spread onto it. Replies `groups_moved=… bytes_moved=…
/// rewritten_bytes=… groups=a,b,…` (groups per member after it); a refusal (a single
/// file, a removal or rebalance running) is an `ERR` naming why. The copies run on a
/// blocking thread. Served only with `--enable-rebalance-command`.
pub(super) fn cmd_rebalance(call: &mut Call<'_>, _args: &[Vec<u8>]) -> tucana::Result<Reply> {
    if !call.state.config.enable_rebalance_command {
        return Ok(Reply::error(
            "ERR TUCANA.REBALANCE not allowed: start the server with --enable-rebalance-command",
        ));
    }
    Ok(match call.state.store.db.rebalance() {
        Ok(done) => {
            let groups: Vec<String> = done.groups.iter().map(u64::to_string).collect();
            Reply::Bulk(
                format!(
                    "groups_moved={} bytes_moved={} rewritten_bytes={} groups={}",
                    done.groups_moved,
                    done.bytes_moved,
                    done.rewritten_bytes,
                    groups.join(",")
                )
                .into_bytes(),
            )
        }
        Err(e) => member_error("REBALANCE", &e),
    })
}

/// The path argument of `TUCANA.<name>` (`verb`: `add` or `remove`), or the refusal when
/// the server was started without `--enable-<verb>-member-command`.
fn member_path<'a>(
    enabled: bool,
    name: &str,
    verb: &str,
    arg: &'a [u8],
) -> Result<&'a std::path::Path, Reply> {
    use std::os::unix::ffi::OsStrExt;
    if !enabled {
        return Err(Reply::error(format!(
            "ERR TUCANA.{name} not allowed: start the server with --enable-{verb}-member-command"
        )));
    }
    Ok(std::path::Path::new(std::ffi::OsStr::from_bytes(arg)))
}

/// A member command's failure as one `ERR` line naming the command.
fn member_error(name: &str, e: &tucana::Error) -> Reply {
    Reply::error(format!("ERR TUCANA.{name}: {e}").replace(['\r', '\n'], " "))
}

/// `SHUTDOWN [NOSAVE|SAVE|NOW|FORCE|ABORT]`: stops the server as SIGTERM does (connections
/// finish their requests in flight, then a commit). NOSAVE is treated as SAVE: writes
/// were already acknowledged, and we never drop them.
pub(super) fn cmd_shutdown(call: &mut Call<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    for arg in &args[1..] {
        match arg.to_ascii_uppercase().as_slice() {
            b"NOSAVE" | b"SAVE" | b"NOW" | b"FORCE" => {}
            b"ABORT" => return Ok(Reply::error("ERR No shutdown in progress.")),
            _ => return Ok(syntax_error()),
        }
    }
    call.session.shutdown_requested = true;
    call.session.close_after_reply = true;
    Ok(Reply::Ok)
}

/// `WAIT numreplicas timeout`: blocks until `numreplicas` backups acknowledged this
/// connection's last write, or `timeout` milliseconds passed (0: no limit); answers how
/// many did. Without replication, or before any write, answers at once.
pub(super) fn cmd_wait(call: &mut Call<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let (Some(needed), Some(timeout_ms)) = (super::parse_i64(&args[1]), super::parse_i64(&args[2]))
    else {
        return Ok(super::not_an_integer());
    };
    if needed < 0 || timeout_ms < 0 {
        return Ok(Reply::error("ERR timeout is negative"));
    }
    let (Some(replication), Some((name, position))) =
        (&call.state.replication, call.session.last_write.clone())
    else {
        return Ok(Reply::Int(0));
    };
    let timeout = if timeout_ms == 0 {
        std::time::Duration::from_secs(365 * 24 * 3600)
    } else {
        std::time::Duration::from_millis(timeout_ms as u64)
    };
    let acked = replication.wait_count(&name, position, needed as usize, timeout);
    Ok(Reply::Int(acked as i64))
}

/// `REPLICAOF NO ONE` (and `SLAVEOF NO ONE`): every replica this server holds becomes a
/// keyspace of its own at a higher term (a promotion; its old primary is refused from
/// then on). Replication here is set up from the primary's side (`--backup`), so
/// `REPLICAOF host port` is refused with that explanation.
pub(super) fn cmd_replicaof(call: &mut Call<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let no_one = args[1].eq_ignore_ascii_case(b"no") && args[2].eq_ignore_ascii_case(b"one");
    if !no_one {
        return Ok(Reply::error(
            "ERR a primary ships to its backups here: start the primary with --backup HOST:PORT of this server's --repl-port",
        ));
    }
    let Some(replication) = &call.state.replication else {
        return Ok(Reply::Ok);
    };
    let promoted = replication.promote_all()?;
    for slot in call.state.store.slots() {
        if promoted.iter().any(|name| name == slot.name()) {
            slot.reload(&call.state.store.db);
        }
    }
    Ok(Reply::Ok)
}
