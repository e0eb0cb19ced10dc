//! The command table: every supported command's name, arity, flags, key positions and
//! handler ([`Spec`]), and lookup by name.
//!
//! Owns what is known about a command before it runs: whether it is allowed before
//! `AUTH` or inside `MULTI`, whether it may block on I/O ([`may_block`]), and its index
//! (metrics count commands by it). It does not run commands (`batch`, `execute` in
//! `commands`) and holds no state beyond the table, built once.
//!
//! Thread-safety: the table and its name index are immutable statics, built on first use.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::OnceLock;

use crate::resp::Reply;

use super::admin::{
    cmd_addmember, cmd_bgrewriteaof, cmd_bgsave, cmd_command, cmd_config, cmd_rebalance,
    cmd_removemember, cmd_replicaof, cmd_save, cmd_shutdown, cmd_time, cmd_wait,
};
use super::blocking::{
    cmd_blmove, cmd_blmpop, cmd_blpop, cmd_brpop, cmd_brpoplpush, cmd_bzmpop, cmd_bzpopmax,
    cmd_bzpopmin,
};
use super::cluster::{cmd_cluster, cmd_readonly, cmd_readwrite};
use super::debug::cmd_debug;
use super::expire::{
    cmd_expire, cmd_expireat, cmd_expiretime, cmd_persist, cmd_pexpire, cmd_pexpireat,
    cmd_pexpiretime, cmd_pttl, cmd_ttl,
};
use super::hashes::{
    cmd_hdel, cmd_hexists, cmd_hget, cmd_hgetall, cmd_hincrby, cmd_hincrbyfloat, cmd_hkeys,
    cmd_hlen, cmd_hmget, cmd_hmset, cmd_hrandfield, cmd_hscan, cmd_hset, cmd_hsetnx, cmd_hstrlen,
    cmd_hvals,
};
use super::info::cmd_info;
use super::keys::{
    cmd_dbsize, cmd_flushall, cmd_flushdb, cmd_keys, cmd_randomkey, cmd_scan, cmd_tprefix,
    cmd_trange,
};
use super::kv::Kv;
use super::lists::{
    cmd_lindex, cmd_linsert, cmd_llen, cmd_lmove, cmd_lpop, cmd_lpos, cmd_lpush, cmd_lpushx,
    cmd_lrange, cmd_lrem, cmd_lset, cmd_ltrim, cmd_rpop, cmd_rpoplpush, cmd_rpush, cmd_rpushx,
};
use super::memory::cmd_memory;
use super::migrating::{cmd_asking, cmd_import};
use super::moves::{cmd_copy, cmd_rename, cmd_renamenx, cmd_touch};
use super::mpop::{cmd_lmpop, cmd_zmpop};
use super::pubsub::{
    cmd_psubscribe, cmd_publish, cmd_pubsub, cmd_punsubscribe, cmd_subscribe, cmd_unsubscribe,
};
use super::session::{
    cmd_auth, cmd_client, cmd_echo, cmd_hello, cmd_ping, cmd_quit, cmd_reset, cmd_select,
};
use super::sets::{
    cmd_sadd, cmd_scard, cmd_sdiff, cmd_sdiffstore, cmd_sinter, cmd_sintercard, cmd_sinterstore,
    cmd_sismember, cmd_smembers, cmd_smismember, cmd_smove, cmd_spop, cmd_srandmember, cmd_srem,
    cmd_sscan, cmd_sunion, cmd_sunionstore,
};
use super::sort::{cmd_sort, cmd_sort_ro};
use super::string_edits::{
    cmd_bitcount, cmd_getbit, cmd_getrange, cmd_incrbyfloat, cmd_lcs, cmd_setbit, cmd_setrange,
};
use super::strings::{
    cmd_append, cmd_decr, cmd_decrby, cmd_del, cmd_exists, cmd_get, cmd_getdel, cmd_getex,
    cmd_getset, cmd_incr, cmd_incrby, cmd_mget, cmd_mset, cmd_msetnx, cmd_object, cmd_psetex,
    cmd_set, cmd_setex, cmd_setnx, cmd_strlen, cmd_type,
};
use super::transaction::{cmd_discard, cmd_exec, cmd_multi, cmd_unwatch, cmd_watch};
use super::zset_algebra::{
    cmd_zdiff, cmd_zdiffstore, cmd_zinter, cmd_zintercard, cmd_zinterstore, cmd_zrandmember,
    cmd_zrangestore, cmd_zunion, cmd_zunionstore,
};
use super::zsets::{
    cmd_zadd, cmd_zcard, cmd_zcount, cmd_zincrby, cmd_zlexcount, cmd_zmscore, cmd_zpopmax,
    cmd_zpopmin, cmd_zrange, cmd_zrangebylex, cmd_zrangebyscore, cmd_zrank, cmd_zrem,
    cmd_zremrangebylex, cmd_zremrangebyrank, cmd_zremrangebyscore, cmd_zrevrange,
    cmd_zrevrangebylex, cmd_zrevrangebyscore, cmd_zrevrank, cmd_zscan, cmd_zscore,
};
use super::Call;

/// A string command's handler: runs on whichever [`Kv`] store the caller gives it.
pub(super) type KvFn = fn(&mut dyn Kv, &[Vec<u8>]) -> tucana::Result<Reply>;
/// Any other command's handler.
pub(super) type CallFn = fn(&mut Call<'_>, &[Vec<u8>]) -> tucana::Result<Reply>;

/// How a command runs, which decides the store its handler gets.
#[derive(Clone, Copy)]
pub(super) enum Run {
    /// A string command that only reads.
    Read(KvFn),
    /// A string command that writes (under the write lock).
    Write(KvFn),
    /// Anything else; `blocks` when it may wait on I/O (commit, drop, sync).
    Other { f: CallFn, blocks: bool },
}

/// Allowed before `AUTH`.
pub(super) const NOAUTH: u8 = 1;
/// Not allowed inside `MULTI` (works on the whole keyspace or on the connection).
pub(super) const NOMULTI: u8 = 2;
/// Runs at once inside `MULTI` instead of being queued (`EXEC`, `DISCARD`, `QUIT`, ...).
pub(super) const TXCTL: u8 = 4;
/// A blocking pop: outside `EXEC`, its timeout reply means "wait" (`blocking`), and it
/// ends its pipelined batch.
pub(super) const BLOCKS_CLIENT: u8 = 8;

/// One command of the table.
pub(super) struct Spec {
    /// Lower case, as `COMMAND` reports it.
    pub(super) name: &'static str,
    /// Redis convention: n > 0 exactly n arguments (with the name), n < 0 at least -n.
    pub(super) arity: i32,
    pub(super) flags: u8,
    /// Key positions, for `COMMAND` (cluster-aware clients read them).
    pub(super) keys: (i32, i32, i32),
    pub(super) run: Run,
}

macro_rules! spec {
    ($name:literal, $arity:expr, $flags:expr, $keys:expr, $run:expr) => {
        Spec {
            name: $name,
            arity: $arity,
            flags: $flags,
            keys: $keys,
            run: $run,
        }
    };
}

/// A `last` key position meaning "the keys follow a count" (see `routing::keys`).
pub(super) const NUMKEYS: i32 = i32::MIN;

impl Spec {
    /// The key positions `COMMAND` reports: Redis reports none (0, 0, 0) for commands
    /// whose keys follow a count, or the destination alone (1, 1, 1).
    pub(super) fn command_keys(&self) -> (i32, i32, i32) {
        match self.keys {
            (_, NUMKEYS, 1) => (1, 1, 1),
            (_, NUMKEYS, _) => NO_KEYS,
            keys => keys,
        }
    }
}

const NO_KEYS: (i32, i32, i32) = (0, 0, 0);
const KEY1: (i32, i32, i32) = (1, 1, 1);
const ALL_KEYS: (i32, i32, i32) = (1, -1, 1);

fn other(f: CallFn) -> Run {
    Run::Other { f, blocks: false }
}

fn blocking(f: CallFn) -> Run {
    Run::Other { f, blocks: true }
}

/// The commands of the collection types: hashes, sorted sets, sets, lists.
fn collection_specs() -> Vec<Spec> {
    let mut specs = hash_specs();
    specs.extend(zset_specs());
    specs.extend(set_and_list_specs());
    specs.extend(blocking_specs());
    specs
}

fn hash_specs() -> Vec<Spec> {
    vec![
        spec!("hset", -4, 0, KEY1, Run::Write(cmd_hset)),
        spec!("hmset", -4, 0, KEY1, Run::Write(cmd_hmset)),
        spec!("hsetnx", 4, 0, KEY1, Run::Write(cmd_hsetnx)),
        spec!("hget", 3, 0, KEY1, Run::Read(cmd_hget)),
        spec!("hmget", -3, 0, KEY1, Run::Read(cmd_hmget)),
        spec!("hgetall", 2, 0, KEY1, Run::Read(cmd_hgetall)),
        spec!("hkeys", 2, 0, KEY1, Run::Read(cmd_hkeys)),
        spec!("hvals", 2, 0, KEY1, Run::Read(cmd_hvals)),
        spec!("hlen", 2, 0, KEY1, Run::Read(cmd_hlen)),
        spec!("hexists", 3, 0, KEY1, Run::Read(cmd_hexists)),
        spec!("hstrlen", 3, 0, KEY1, Run::Read(cmd_hstrlen)),
        spec!("hdel", -3, 0, KEY1, Run::Write(cmd_hdel)),
        spec!("hincrby", 4, 0, KEY1, Run::Write(cmd_hincrby)),
        spec!("hincrbyfloat", 4, 0, KEY1, Run::Write(cmd_hincrbyfloat)),
        spec!("hrandfield", -2, 0, KEY1, Run::Read(cmd_hrandfield)),
        spec!("hscan", -3, 0, KEY1, Run::Read(cmd_hscan)),
    ]
}

fn zset_specs() -> Vec<Spec> {
    vec![
        spec!("zadd", -4, 0, KEY1, Run::Write(cmd_zadd)),
        spec!("zincrby", 4, 0, KEY1, Run::Write(cmd_zincrby)),
        spec!("zrem", -3, 0, KEY1, Run::Write(cmd_zrem)),
        spec!("zscore", 3, 0, KEY1, Run::Read(cmd_zscore)),
        spec!("zmscore", -3, 0, KEY1, Run::Read(cmd_zmscore)),
        spec!("zcard", 2, 0, KEY1, Run::Read(cmd_zcard)),
        spec!("zcount", 4, 0, KEY1, Run::Read(cmd_zcount)),
        spec!("zlexcount", 4, 0, KEY1, Run::Read(cmd_zlexcount)),
        spec!("zrank", -3, 0, KEY1, Run::Read(cmd_zrank)),
        spec!("zrevrank", -3, 0, KEY1, Run::Read(cmd_zrevrank)),
        spec!("zrange", -4, 0, KEY1, Run::Read(cmd_zrange)),
        spec!("zrevrange", -4, 0, KEY1, Run::Read(cmd_zrevrange)),
        spec!("zrangebyscore", -4, 0, KEY1, Run::Read(cmd_zrangebyscore)),
        spec!(
            "zrevrangebyscore",
            -4,
            0,
            KEY1,
            Run::Read(cmd_zrevrangebyscore)
        ),
        spec!("zrangebylex", -4, 0, KEY1, Run::Read(cmd_zrangebylex)),
        spec!("zrevrangebylex", -4, 0, KEY1, Run::Read(cmd_zrevrangebylex)),
        spec!(
            "zremrangebyscore",
            4,
            0,
            KEY1,
            Run::Write(cmd_zremrangebyscore)
        ),
        spec!(
            "zremrangebyrank",
            4,
            0,
            KEY1,
            Run::Write(cmd_zremrangebyrank)
        ),
        spec!("zremrangebylex", 4, 0, KEY1, Run::Write(cmd_zremrangebylex)),
        spec!("zpopmin", -2, 0, KEY1, Run::Write(cmd_zpopmin)),
        spec!("zpopmax", -2, 0, KEY1, Run::Write(cmd_zpopmax)),
        spec!("zscan", -3, 0, KEY1, Run::Read(cmd_zscan)),
        spec!("zunion", -3, 0, (1, NUMKEYS, 0), Run::Read(cmd_zunion)),
        spec!("zinter", -3, 0, (1, NUMKEYS, 0), Run::Read(cmd_zinter)),
        spec!("zdiff", -3, 0, (1, NUMKEYS, 0), Run::Read(cmd_zdiff)),
        spec!(
            "zintercard",
            -3,
            0,
            (1, NUMKEYS, 0),
            Run::Read(cmd_zintercard)
        ),
        spec!(
            "zunionstore",
            -4,
            0,
            (2, NUMKEYS, 1),
            Run::Write(cmd_zunionstore)
        ),
        spec!(
            "zinterstore",
            -4,
            0,
            (2, NUMKEYS, 1),
            Run::Write(cmd_zinterstore)
        ),
        spec!(
            "zdiffstore",
            -4,
            0,
            (2, NUMKEYS, 1),
            Run::Write(cmd_zdiffstore)
        ),
        spec!("zrangestore", -5, 0, (1, 2, 1), Run::Write(cmd_zrangestore)),
        spec!("zrandmember", -2, 0, KEY1, Run::Read(cmd_zrandmember)),
        spec!("zmpop", -4, 0, (1, NUMKEYS, 0), Run::Write(cmd_zmpop)),
    ]
}

fn set_and_list_specs() -> Vec<Spec> {
    vec![
        spec!("sadd", -3, 0, KEY1, Run::Write(cmd_sadd)),
        spec!("srem", -3, 0, KEY1, Run::Write(cmd_srem)),
        spec!("smembers", 2, 0, KEY1, Run::Read(cmd_smembers)),
        spec!("sismember", 3, 0, KEY1, Run::Read(cmd_sismember)),
        spec!("smismember", -3, 0, KEY1, Run::Read(cmd_smismember)),
        spec!("scard", 2, 0, KEY1, Run::Read(cmd_scard)),
        spec!("spop", -2, 0, KEY1, Run::Write(cmd_spop)),
        spec!("srandmember", -2, 0, KEY1, Run::Read(cmd_srandmember)),
        spec!("smove", 4, 0, (1, 2, 1), Run::Write(cmd_smove)),
        spec!("sscan", -3, 0, KEY1, Run::Read(cmd_sscan)),
        spec!("sinter", -2, 0, ALL_KEYS, Run::Read(cmd_sinter)),
        spec!("sunion", -2, 0, ALL_KEYS, Run::Read(cmd_sunion)),
        spec!("sdiff", -2, 0, ALL_KEYS, Run::Read(cmd_sdiff)),
        spec!("sinterstore", -3, 0, ALL_KEYS, Run::Write(cmd_sinterstore)),
        spec!("sunionstore", -3, 0, ALL_KEYS, Run::Write(cmd_sunionstore)),
        spec!("sdiffstore", -3, 0, ALL_KEYS, Run::Write(cmd_sdiffstore)),
        spec!(
            "sintercard",
            -3,
            0,
            (1, NUMKEYS, 0),
            Run::Read(cmd_sintercard)
        ),
        spec!("lpush", -3, 0, KEY1, Run::Write(cmd_lpush)),
        spec!("rpush", -3, 0, KEY1, Run::Write(cmd_rpush)),
        spec!("lpushx", -3, 0, KEY1, Run::Write(cmd_lpushx)),
        spec!("rpushx", -3, 0, KEY1, Run::Write(cmd_rpushx)),
        spec!("lpop", -2, 0, KEY1, Run::Write(cmd_lpop)),
        spec!("rpop", -2, 0, KEY1, Run::Write(cmd_rpop)),
        spec!("llen", 2, 0, KEY1, Run::Read(cmd_llen)),
        spec!("lindex", 3, 0, KEY1, Run::Read(cmd_lindex)),
        spec!("lset", 4, 0, KEY1, Run::Write(cmd_lset)),
        spec!("lrange", 4, 0, KEY1, Run::Read(cmd_lrange)),
        spec!("ltrim", 4, 0, KEY1, Run::Write(cmd_ltrim)),
        spec!("lrem", 4, 0, KEY1, Run::Write(cmd_lrem)),
        spec!("linsert", 5, 0, KEY1, Run::Write(cmd_linsert)),
        spec!("lpos", -3, 0, KEY1, Run::Read(cmd_lpos)),
        spec!("lmove", 5, 0, (1, 2, 1), Run::Write(cmd_lmove)),
        spec!("rpoplpush", 3, 0, (1, 2, 1), Run::Write(cmd_rpoplpush)),
        spec!("lmpop", -4, 0, (1, NUMKEYS, 0), Run::Write(cmd_lmpop)),
    ]
}

/// The blocking pops (`BLOCKS_CLIENT`).
fn blocking_specs() -> Vec<Spec> {
    const B: u8 = BLOCKS_CLIENT;
    vec![
        spec!("blpop", -3, B, (1, -2, 1), Run::Write(cmd_blpop)),
        spec!("brpop", -3, B, (1, -2, 1), Run::Write(cmd_brpop)),
        spec!("bzpopmin", -3, B, (1, -2, 1), Run::Write(cmd_bzpopmin)),
        spec!("bzpopmax", -3, B, (1, -2, 1), Run::Write(cmd_bzpopmax)),
        spec!("blmove", 6, B, (1, 2, 1), Run::Write(cmd_blmove)),
        spec!("brpoplpush", 4, B, (1, 2, 1), Run::Write(cmd_brpoplpush)),
        spec!("blmpop", -5, B, (2, NUMKEYS, 0), Run::Write(cmd_blmpop)),
        spec!("bzmpop", -5, B, (2, NUMKEYS, 0), Run::Write(cmd_bzmpop)),
    ]
}

/// Every supported command.
pub(super) fn table() -> &'static [Spec] {
    static TABLE: OnceLock<Vec<Spec>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = vec![
            spec!("get", 2, 0, KEY1, Run::Read(cmd_get)),
            spec!("mget", -2, 0, ALL_KEYS, Run::Read(cmd_mget)),
            spec!("exists", -2, 0, ALL_KEYS, Run::Read(cmd_exists)),
            spec!("strlen", 2, 0, KEY1, Run::Read(cmd_strlen)),
            spec!("type", 2, 0, KEY1, Run::Read(cmd_type)),
            spec!("ttl", 2, 0, KEY1, Run::Read(cmd_ttl)),
            spec!("pttl", 2, 0, KEY1, Run::Read(cmd_pttl)),
            spec!("expiretime", 2, 0, KEY1, Run::Read(cmd_expiretime)),
            spec!("pexpiretime", 2, 0, KEY1, Run::Read(cmd_pexpiretime)),
            spec!("expire", -3, 0, KEY1, Run::Write(cmd_expire)),
            spec!("pexpire", -3, 0, KEY1, Run::Write(cmd_pexpire)),
            spec!("expireat", -3, 0, KEY1, Run::Write(cmd_expireat)),
            spec!("pexpireat", -3, 0, KEY1, Run::Write(cmd_pexpireat)),
            spec!("persist", 2, 0, KEY1, Run::Write(cmd_persist)),
            spec!("setex", 4, 0, KEY1, Run::Write(cmd_setex)),
            spec!("psetex", 4, 0, KEY1, Run::Write(cmd_psetex)),
            spec!("getex", -2, 0, KEY1, Run::Write(cmd_getex)),
            spec!("set", -3, 0, KEY1, Run::Write(cmd_set)),
            spec!("setnx", 3, 0, KEY1, Run::Write(cmd_setnx)),
            spec!("getset", 3, 0, KEY1, Run::Write(cmd_getset)),
            spec!("getdel", 2, 0, KEY1, Run::Write(cmd_getdel)),
            spec!("mset", -3, 0, (1, -1, 2), Run::Write(cmd_mset)),
            spec!("msetnx", -3, 0, (1, -1, 2), Run::Write(cmd_msetnx)),
            spec!("del", -2, 0, ALL_KEYS, Run::Write(cmd_del)),
            spec!("unlink", -2, 0, ALL_KEYS, Run::Write(cmd_del)),
            spec!("append", 3, 0, KEY1, Run::Write(cmd_append)),
            spec!("incr", 2, 0, KEY1, Run::Write(cmd_incr)),
            spec!("decr", 2, 0, KEY1, Run::Write(cmd_decr)),
            spec!("incrby", 3, 0, KEY1, Run::Write(cmd_incrby)),
            spec!("decrby", 3, 0, KEY1, Run::Write(cmd_decrby)),
            spec!("object", -2, 0, (2, 2, 1), Run::Read(cmd_object)),
            spec!("getrange", 4, 0, KEY1, Run::Read(cmd_getrange)),
            spec!("substr", 4, 0, KEY1, Run::Read(cmd_getrange)),
            spec!("setrange", 4, 0, KEY1, Run::Write(cmd_setrange)),
            spec!("getbit", 3, 0, KEY1, Run::Read(cmd_getbit)),
            spec!("setbit", 4, 0, KEY1, Run::Write(cmd_setbit)),
            spec!("bitcount", -2, 0, KEY1, Run::Read(cmd_bitcount)),
            spec!("incrbyfloat", 3, 0, KEY1, Run::Write(cmd_incrbyfloat)),
            spec!("lcs", -3, 0, (1, 2, 1), Run::Read(cmd_lcs)),
            spec!("rename", 3, 0, (1, 2, 1), Run::Write(cmd_rename)),
            spec!("renamenx", 3, 0, (1, 2, 1), Run::Write(cmd_renamenx)),
            spec!("copy", -3, 0, (1, 2, 1), Run::Write(cmd_copy)),
            spec!("sort", -2, 0, (1, 1, 1), Run::Write(cmd_sort)),
            spec!("sort_ro", -2, 0, (1, 1, 1), Run::Read(cmd_sort_ro)),
            spec!("touch", -2, 0, ALL_KEYS, Run::Read(cmd_touch)),
            spec!("memory", -2, 0, (2, 2, 1), Run::Read(cmd_memory)),
            spec!("randomkey", 1, NOMULTI, NO_KEYS, other(cmd_randomkey)),
            spec!("scan", -2, NOMULTI, NO_KEYS, other(cmd_scan)),
            spec!("keys", 2, 0, NO_KEYS, other(cmd_keys)),
            spec!("trange", -3, NOMULTI, NO_KEYS, other(cmd_trange)),
            spec!("tprefix", -2, NOMULTI, NO_KEYS, other(cmd_tprefix)),
            spec!("dbsize", 1, 0, NO_KEYS, other(cmd_dbsize)),
            spec!("flushdb", -1, NOMULTI, NO_KEYS, blocking(cmd_flushdb)),
            spec!("flushall", -1, NOMULTI, NO_KEYS, blocking(cmd_flushall)),
            spec!("select", 2, NOMULTI, NO_KEYS, other(cmd_select)),
            spec!("multi", 1, TXCTL, NO_KEYS, other(cmd_multi)),
            spec!("exec", 1, TXCTL, NO_KEYS, blocking(cmd_exec)),
            spec!("discard", 1, TXCTL, NO_KEYS, other(cmd_discard)),
            // TXCTL: inside MULTI, WATCH answers its error instead of being queued.
            spec!("watch", -2, TXCTL, ALL_KEYS, other(cmd_watch)),
            spec!("unwatch", 1, 0, NO_KEYS, other(cmd_unwatch)),
            spec!("ping", -1, 0, NO_KEYS, other(cmd_ping)),
            spec!("echo", 2, 0, NO_KEYS, other(cmd_echo)),
            spec!("subscribe", -2, 0, NO_KEYS, other(cmd_subscribe)),
            spec!("unsubscribe", -1, 0, NO_KEYS, other(cmd_unsubscribe)),
            spec!("psubscribe", -2, 0, NO_KEYS, other(cmd_psubscribe)),
            spec!("punsubscribe", -1, 0, NO_KEYS, other(cmd_punsubscribe)),
            spec!("publish", 3, 0, NO_KEYS, other(cmd_publish)),
            spec!("pubsub", -2, 0, NO_KEYS, other(cmd_pubsub)),
            spec!("quit", -1, NOAUTH | TXCTL, NO_KEYS, other(cmd_quit)),
            spec!("reset", 1, NOAUTH | TXCTL, NO_KEYS, other(cmd_reset)),
            spec!("auth", -2, NOAUTH | NOMULTI, NO_KEYS, other(cmd_auth)),
            spec!("hello", -1, NOAUTH | NOMULTI, NO_KEYS, other(cmd_hello)),
            spec!("client", -2, NOMULTI, NO_KEYS, other(cmd_client)),
            spec!("command", -1, NOMULTI, NO_KEYS, other(cmd_command)),
            spec!("config", -2, 0, NO_KEYS, other(cmd_config)),
            // Not in MULTI: RELOAD takes every database's write lock, which EXEC holds.
            spec!("debug", -2, NOMULTI, NO_KEYS, blocking(cmd_debug)),
            spec!("info", -1, NOMULTI, NO_KEYS, other(cmd_info)),
            spec!("time", 1, 0, NO_KEYS, other(cmd_time)),
            spec!("save", 1, NOMULTI, NO_KEYS, blocking(cmd_save)),
            spec!("wait", 3, NOMULTI, NO_KEYS, blocking(cmd_wait)),
            spec!("replicaof", 3, NOMULTI, NO_KEYS, blocking(cmd_replicaof)),
            spec!("slaveof", 3, NOMULTI, NO_KEYS, blocking(cmd_replicaof)),
            spec!("bgsave", -1, NOMULTI, NO_KEYS, blocking(cmd_bgsave)),
            spec!(
                "bgrewriteaof",
                1,
                NOMULTI,
                NO_KEYS,
                blocking(cmd_bgrewriteaof)
            ),
            spec!("shutdown", -1, NOMULTI, NO_KEYS, other(cmd_shutdown)),
            spec!("cluster", -2, NOMULTI, NO_KEYS, other(cmd_cluster)),
            spec!("readonly", 1, NOMULTI, NO_KEYS, other(cmd_readonly)),
            spec!("readwrite", 1, NOMULTI, NO_KEYS, other(cmd_readwrite)),
            spec!("asking", 1, TXCTL, NO_KEYS, other(cmd_asking)),
            spec!("tucana.import", -5, NOMULTI, NO_KEYS, other(cmd_import)),
        ];
        table.extend(collection_specs());
        table.extend(member_specs());
        table
    })
}

/// The commands over the served volume's members, each served only when its `serve`
/// flag enables it (`admin`).
fn member_specs() -> Vec<Spec> {
    vec![
        spec!(
            "tucana.addmember",
            2,
            NOMULTI,
            NO_KEYS,
            blocking(cmd_addmember)
        ),
        spec!(
            "tucana.removemember",
            2,
            NOMULTI,
            NO_KEYS,
            blocking(cmd_removemember)
        ),
        spec!(
            "tucana.rebalance",
            1,
            NOMULTI,
            NO_KEYS,
            blocking(cmd_rebalance)
        ),
    ]
}

/// FNV-1a: command names are a few bytes and come from the table or a client that can
/// only pick among them, so the flooding resistance of the default hasher buys nothing
/// and its cost shows up once per command.
#[derive(Default)]
struct NameHasher(u64);

impl Hasher for NameHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for &b in bytes {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}

type NameIndex = HashMap<&'static [u8], usize, BuildHasherDefault<NameHasher>>;

fn index_by_name() -> &'static NameIndex {
    static INDEX: OnceLock<NameIndex> = OnceLock::new();
    INDEX.get_or_init(|| {
        table()
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name.as_bytes(), i))
            .collect()
    })
}

/// Number of commands in the table (metrics keep one counter per command).
pub fn command_count() -> usize {
    table().len()
}

/// Name of command `index` of the table.
pub fn command_name(index: usize) -> &'static str {
    table()[index].name
}

/// The table index of a command name, any case.
pub(super) fn lookup(name: &[u8]) -> Option<usize> {
    let mut lower = [0u8; 24];
    if name.len() > lower.len() {
        return None;
    }
    for (l, n) in lower.iter_mut().zip(name) {
        *l = n.to_ascii_lowercase();
    }
    index_by_name().get(&lower[..name.len()]).copied()
}

/// What a request may wait on, which decides where and how the connection runs it.
#[derive(Clone, Copy, Default)]
pub struct Blocking {
    /// It may wait on I/O: the connection runs its batch on a thread that may block,
    /// so the async workers keep serving other connections.
    ///
    /// Reads never block. Writes only take the keyspace's write lock (held for a log
    /// append by another writer) and append to the log buffer, so they run on the async
    /// worker too: a hop to the blocking pool costs more than they do. In sync mode the
    /// wait for the fsync that follows is asynchronous (`syncer`).
    pub device: bool,
    /// A blocking pop: it may wait for another client's write, so it ends its batch
    /// (see `blocking`).
    pub client: bool,
}

/// How a request named `name` may block (one table lookup for both answers).
pub fn may_block(name: &[u8]) -> Blocking {
    let Some(i) = lookup(name) else {
        return Blocking::default();
    };
    let spec = &table()[i];
    Blocking {
        device: matches!(spec.run, Run::Other { blocks: true, .. }),
        client: spec.flags & BLOCKS_CLIENT != 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_ignores_case_and_every_command_is_found() {
        assert!(lookup(b"gEt").is_some());
        assert!(lookup(b"nosuchcmd").is_none());
        assert!(lookup(b"averyveryverylongcommandname").is_none());
        for (i, spec) in table().iter().enumerate() {
            assert_eq!(lookup(spec.name.to_ascii_uppercase().as_bytes()), Some(i));
            assert_eq!(spec.name, spec.name.to_ascii_lowercase());
        }
    }
}
