//! The string, key and collection commands added after the first differential tests
//! (GETRANGE, SETRANGE, SETBIT, GETBIT, BITCOUNT, LCS, INCRBYFLOAT, RENAME, RENAMENX, COPY,
//! TOUCH, RANDOMKEY; ZUNION, ZINTER, ZDIFF and their STORE forms, ZRANGESTORE,
//! ZRANDMEMBER, SINTERCARD, ZMPOP, LMPOP) sent alike to redis-server and to tucana over
//! raw RESP, replies compared (`common`). Skipped, with a message, where `redis-server` is
//! not installed (`bash scripts/server-deps.sh --bench`).
//!
//! Left out of the scripts on purpose, being known differences (README): INCRBYFLOAT
//! results whose digits differ because Redis computes in 80-bit `long double` and prints
//! 17 decimals (tucana: `f64`, shortest form), and COPY's `DB` option (refused).

mod common;

const STRINGS: &str = "FLUSHALL
SET s hello_world
GETRANGE s 0 4
GETRANGE s -5 -1
GETRANGE s -1 -5
GETRANGE s 3 100
GETRANGE s -100 2
GETRANGE s 5 2
GETRANGE s 0 -1
GETRANGE s x 1
GETRANGE nokey 0 -1
SUBSTR s 1 3
SETRANGE s 6 WORLD
GET s
SETRANGE s 20 tail
GET s
STRLEN s
SETRANGE s 0 ''
SETRANGE nokey 0 ''
EXISTS nokey
SETRANGE nokey 3 x
GET nokey
SETRANGE s -1 x
SETRANGE s x x
SETRANGE s 536870911 xy
SETBIT b 7 1
GET b
SETBIT b 7 0
SETBIT b 100 1
STRLEN b
GETBIT b 100
GETBIT b 101
GETBIT b 100000
GETBIT nokey 0
SETBIT b 1 2
SETBIT b -1 1
SETBIT b 4294967296 1
GETBIT b x
SET bits foobar
BITCOUNT bits
BITCOUNT bits 0 0
BITCOUNT bits 1 1
BITCOUNT bits 1 -2
BITCOUNT bits -2 -1
BITCOUNT bits -1 -2
BITCOUNT bits 5 30 BIT
BITCOUNT bits 0 -1 BIT
BITCOUNT bits 1 1 BYTE
BITCOUNT bits 1 1 FOO
BITCOUNT bits 1
BITCOUNT bits x 1
BITCOUNT nokey
BITCOUNT nokey 0 1
SET f 10.50
INCRBYFLOAT f 0.1
INCRBYFLOAT f -5
INCRBYFLOAT f 5
SET g 10.5
INCRBYFLOAT g 1e3
INCRBYFLOAT g -0.25
INCRBYFLOAT f abc
INCRBYFLOAT newf 3
INCRBYFLOAT newf -3
SET notf abc
INCRBYFLOAT notf 1
SET k1 ohmytext
SET k2 mynewtext
LCS k1 k2
LCS k1 k2 LEN
LCS k1 k2 IDX
LCS k1 k2 IDX WITHMATCHLEN
LCS k1 k2 IDX MINMATCHLEN 4
LCS k1 k2 IDX MINMATCHLEN 4 WITHMATCHLEN
LCS k1 k2 LEN IDX
LCS k1 k2 FOO
LCS k1 nokey
LCS nokey nokey2 LEN
SET a1 ABCBDAB
SET a2 BDCABA
LCS a1 a2
LCS a1 a2 IDX WITHMATCHLEN
SET ex1 v EX 1000
INCRBYFLOAT ex1x 1
SET ex2 1 EX 1000
INCRBYFLOAT ex2 1
TTL ex2
SETRANGE ex1 0 w
TTL ex1
SETBIT ex1 0 1
TTL ex1
HSET h f v
GETRANGE h 0 1
SETRANGE h 0 x
GETBIT h 0
SETBIT h 0 1
BITCOUNT h
INCRBYFLOAT h 1
LCS h s
TOUCH s h nokey s
TOUCH nokey";

const KEYS: &str = "FLUSHALL
RANDOMKEY
SET only v
RANDOMKEY
SET a 1
SET b 2 EX 1000
RENAME a a2
GET a
GET a2
RENAME nokey x
RENAME a2 a2
RENAME nokey nokey
RENAMENX a2 a2
RENAMENX nokey x
RENAME b b2
TTL b2
EXISTS b
RENAME a2 b2
GET b2
TTL b2
SET c 3 EX 1000
RENAMENX b2 c
RENAMENX b2 d
GET d
EXISTS b2
HSET h f1 v1 f2 v2
EXPIRE h 1000
RENAME h h2
HGETALL h
pairs HGETALL h2
TTL h2
TYPE h2
HSET h2 f3 v3
HLEN h2
RPUSH l a b c
LPUSH l z
RENAME l l2
LRANGE l2 0 -1
RPUSH l2 d
LPOP l2
LRANGE l2 0 -1
ZADD z 1 a 2 b 3 c
RENAME z d
ZRANGE d 0 -1 WITHSCORES
TYPE d
SADD s x y z
RENAME s d
sort SMEMBERS d
SET str v
RENAME d str
sort SMEMBERS str
COPY str str2
sort SMEMBERS str2
SADD str2 w
SCARD str
SCARD str2
COPY str str2
COPY str str2 REPLACE
SCARD str2
COPY nokey x
COPY str str
COPY str x FOO
SET plain v PX 100000
COPY plain p2
GET p2
len PTTL p2
COPY l2 l3
LRANGE l3 0 -1
RPOP l3
LRANGE l2 0 -1
ZADD zz 1 one 2 two
COPY zz z3
ZADD z3 5 five
ZRANGE zz 0 -1 WITHSCORES
ZRANGE z3 0 -1 WITHSCORES
ZSCORE z3 two
ZRANK z3 five
DEL only a b c d h h2 l l2 l3 str str2 zz z3 plain p2 b2
DBSIZE
RANDOMKEY";

#[test]
fn string_edit_replies_match_redis_server() {
    common::assert_same_replies(STRINGS);
}

#[test]
fn key_move_replies_match_redis_server() {
    common::assert_same_replies(KEYS);
}

/// Issue 23's differences between redis-server and tucana in commands tucana already
/// served, found by differential testing and fixed here: glob patterns with an
/// unclosed `[` (a class of the rest of the pattern in Redis; tucana read a literal `[`)
/// or a range ending in `-` (`[a-]` is the range from `]` to `a`), `DECRBY` of
/// `i64::MIN` (Redis: `decrement would overflow`; tucana: not an integer), `AUTH
/// default x` with no password set (Redis: OK, the default user is `nopass`; tucana
/// refused it), `KEYS` and `DBSIZE` inside `MULTI` (Redis queues them; tucana refused
/// them), `SCAN -1` (a valid cursor to Redis's strtoul; tucana: invalid cursor).
const FORMER_DIFFERENCES: &str = "FLUSHALL
MSET a 1 b 2 c 3 [ 4 ] 5 ^ 6 _ 7 ` 8 x- 9 - 10 ab 11 [a 12 \\ 13 a\\ 14 xa[ 15 a[ 16
sort KEYS [abc
sort KEYS x[ab
sort KEYS [a-]
sort KEYS [^
sort KEYS [
sort KEYS [a-
sort KEYS [-a]
sort KEYS [\\
sort KEYS a\\
sort KEYS []
sort KEYS []a]
sort KEYS [!-]
sort KEYS **
sort KEYS [^]
sort KEYS [a-c
sort KEYS a[
sort KEYS \\
sort KEYS [\\]]
sort KEYS [z-a]
sort KEYS a*
scankeys SCAN 0 MATCH [abc COUNT 100
scankeys SCAN 0 MATCH [a-] COUNT 100
SET n 5
DECRBY n -9223372036854775808
DECRBY n 9223372036854775807
DECRBY n x
GET n
AUTH default x
AUTH x
AUTH other x
len HELLO 2 AUTH default x
HELLO 2 AUTH other x
MULTI
DBSIZE
SET n2 1
DEL a
KEYS n?
DBSIZE
EXEC
MULTI
SET n3 1
DBSIZE
EXEC
FLUSHALL
SCAN -1
SCAN -18446744073709551615
SCAN 18446744073709551616
SCAN 1x";

#[test]
fn former_differences_match_redis_server() {
    common::assert_same_replies(FORMER_DIFFERENCES);
}

/// The empty key, which a script line cannot spell: Redis's matcher never runs on it,
/// so only `*` (KEYS's and SCAN's match-all) and the empty pattern match it; `**`
/// and `?*` do not.
#[test]
fn the_empty_key_matches_only_star_as_at_redis_server() {
    let Some((_redis, port)) = common::start_redis_server() else {
        return;
    };
    let server = common::start_tucana_for_comparison();
    let mut theirs = common::Raw::connect(&format!("127.0.0.1:{port}"));
    let mut ours = common::Raw::connect(&server.addr.to_string());
    let words = |w: &[&str]| w.iter().map(|s| s.as_bytes().to_vec()).collect::<Vec<_>>();
    for command in [
        words(&["SET", "", "empty"]),
        words(&["SET", "k", "v"]),
        words(&["KEYS", "**"]),
        words(&["KEYS", "?*"]),
        words(&["KEYS", ""]),
        words(&["SCAN", "0", "MATCH", "**"]),
        words(&["DEL", "k"]),
        words(&["KEYS", "*"]),
        words(&["SCAN", "0", "MATCH", "*"]),
    ] {
        let (want, _) = theirs.call(&command);
        let (got, _) = ours.call(&command);
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&want),
            "{command:?}"
        );
    }
    server.stop().unwrap();
}

const ZSETS: &str = "FLUSHALL
ZADD za 1 a 2 b 3 c
ZADD zb 10 b 20 c 30 d
SADD sc c d e
ZUNION 2 za zb
ZUNION 2 za zb WITHSCORES
ZUNION 3 za zb sc WITHSCORES
ZUNION 2 za zb WEIGHTS 2 0.5 WITHSCORES
ZUNION 2 za zb AGGREGATE MIN WITHSCORES
ZUNION 2 za zb AGGREGATE MAX WITHSCORES
ZUNION 2 za zb WEIGHTS 1 WITHSCORES
ZUNION 2 za zb WEIGHTS 1 x
ZUNION 2 za zb AGGREGATE AVG
ZUNION 2 za zb FOO
ZUNION 0 za
ZUNION -1 za
ZUNION x za
ZUNION 3 za zb
ZUNION 2 za nokey WITHSCORES
ZINTER 2 za zb WITHSCORES
ZINTER 3 za zb sc WITHSCORES
ZINTER 2 za zb WEIGHTS 1 -1 AGGREGATE SUM WITHSCORES
ZINTER 2 za nokey
ZINTER 2 za zb AGGREGATE MIN
ZDIFF 2 za zb WITHSCORES
ZDIFF 2 zb sc WITHSCORES
ZDIFF 1 za
ZDIFF 2 za zb WEIGHTS 1 1
ZDIFF 2 za zb AGGREGATE MIN
ZDIFF 2 nokey za
ZADD zinf 1 a
ZADD zinf2 inf a -inf b
ZUNION 2 zinf zinf2 WEIGHTS 0 0 WITHSCORES
ZUNION 2 zinf2 zinf2 WITHSCORES
ZUNION 2 zinf2 zinf2 WEIGHTS 1 -1 WITHSCORES
ZUNIONSTORE dst 2 za zb
ZRANGE dst 0 -1 WITHSCORES
ZUNIONSTORE dst 2 za zb WITHSCORES
ZINTERSTORE dst 2 za zb WEIGHTS 2 3
ZRANGE dst 0 -1 WITHSCORES
ZINTERSTORE dst 2 za nokey
EXISTS dst
ZDIFFSTORE dst 2 za zb
ZRANGE dst 0 -1 WITHSCORES
SET str x
ZUNION 2 za str
ZUNIONSTORE dst 2 za str
ZUNIONSTORE str 2 za zb
TYPE str
ZINTERSTORE za 2 za zb
ZRANGE za 0 -1 WITHSCORES
ZINTERCARD 2 zb sc
ZINTERCARD 2 zb sc LIMIT 1
ZINTERCARD 2 zb sc LIMIT 0
ZINTERCARD 2 zb sc LIMIT -1
ZINTERCARD 0 zb
ZINTERCARD 3 zb sc
ZINTERCARD 1 zb FOO
SINTERCARD 1 sc
SADD sd d e f
SINTERCARD 2 sc sd
SINTERCARD 2 sc sd LIMIT 1
SINTERCARD 2 sc nokey
SINTERCARD 0 sc
SINTERCARD x sc
SINTERCARD 5 sc
SINTERCARD 1 sc LIMIT x
SINTERCARD 1 sc LIMIT
SINTERCARD 2 sc str
ZADD src 1 a 2 b 3 c 4 d 5 e
ZRANGESTORE rs src 1 3
ZRANGE rs 0 -1 WITHSCORES
ZRANGESTORE rs src (1 4 BYSCORE LIMIT 1 2
ZRANGE rs 0 -1 WITHSCORES
ZRANGESTORE rs src 4 1 BYSCORE REV
ZRANGE rs 0 -1 WITHSCORES
ZRANGESTORE rs src [b [d BYLEX
ZRANGE rs 0 -1
ZRANGESTORE rs src 0 -1 WITHSCORES
ZRANGESTORE rs src 10 20
EXISTS rs
ZRANGESTORE rs nokey 0 -1
ZRANGESTORE rs str 0 -1
ZRANGESTORE src src 0 1
ZRANGE src 0 -1 WITHSCORES
ZADD rm 1 a 2 b 3 c
len ZRANDMEMBER rm
len ZRANDMEMBER rm 2
len ZRANDMEMBER rm -5
len ZRANDMEMBER rm 10 WITHSCORES
len ZRANDMEMBER rm -4 WITHSCORES
ZRANDMEMBER rm 0
ZRANDMEMBER nokey
ZRANDMEMBER nokey 2
ZRANDMEMBER rm 1 FOO
ZRANDMEMBER rm x
SET strv x
ZRANDMEMBER strv
ZMPOP 1 strv MIN
LMPOP 1 strv LEFT
ZADD one 7 only
ZRANDMEMBER one -2 WITHSCORES
ZRANDMEMBER one 3 WITHSCORES
ZADD zp 1 a 2 b 3 c
ZMPOP 1 zp MIN
ZMPOP 2 nokey zp MAX COUNT 5
EXISTS zp
ZMPOP 2 nokey nokey2 MIN
ZMPOP 1 rm MIN COUNT 2
ZMPOP 1 rm LEFT
ZMPOP 0 rm MIN
ZMPOP x rm MIN
ZMPOP 1 rm MIN COUNT 0
ZMPOP 1 rm MIN COUNT x
ZMPOP 1 rm MIN COUNT 1 COUNT 2
ZMPOP 2 rm MIN
ZMPOP 1 str MIN
ZMPOP 2 nokey str MIN
RPUSH l1 a b c d
LMPOP 1 l1 LEFT
LMPOP 2 nokey l1 RIGHT COUNT 2
LMPOP 1 l1 RIGHT COUNT 10
EXISTS l1
LMPOP 1 l1 LEFT
LPOP l1 1 2
RPOP l1 1 2
LMPOP 1 l1 MIN
LMPOP 0 l1 LEFT
LMPOP 1 l1 LEFT COUNT -1
LMPOP 2 str l1 LEFT
LMPOP 5 l1 LEFT
LMPOP 1 l1";

#[test]
fn sorted_set_algebra_and_multi_pop_replies_match_redis_server() {
    common::assert_same_replies(ZSETS);
}

/// The blocking pops where they answer at once (something to pop, an error, inside
/// MULTI) or after a short timeout; being served by another client is `tests/blocking.rs`.
const BLOCKING: &str = "FLUSHALL
RPUSH l a b c
BLPOP nokey l 0
BRPOP l nokey 0
BLPOP nokey 0.01
BLPOP l -1
BLPOP l abc
BLPOP l
SET s str
BLPOP s l 0
BLPOP nokey s 0
ZADD z 1 a 2 b 3 c
BZPOPMIN z 0
BZPOPMAX nokey z 0
BZPOPMIN l 0
BZPOPMAX nokey 0.01
RPUSH m x y
BLMOVE m d RIGHT LEFT 0
BLMOVE m d UP LEFT 0
BLMOVE m d LEFT LEFT x
BLMOVE nokey d LEFT LEFT 0.01
BLMOVE s d LEFT LEFT 0
BRPOPLPUSH m d 0
BRPOPLPUSH m d 0.01
LRANGE d 0 -1
RPUSH lm a b c
BLMPOP 0 2 nokey lm LEFT COUNT 2
BLMPOP 0 1 lm RIGHT
BLMPOP 0.01 1 lm RIGHT
BLMPOP 0 0 lm RIGHT
BLMPOP -1 1 lm RIGHT
BLMPOP 0 1 lm MIN
BZMPOP 0 2 nokey z MIN COUNT 5
BZMPOP 0.01 1 z MAX
BZMPOP 0 1 z LEFT
BZMPOP 0 1 s MIN
MULTI
BLPOP nokey 0
BRPOP nokey 0
BLMOVE nokey d LEFT LEFT 0
BRPOPLPUSH nokey d 0
BZPOPMIN nokey 0
BLMPOP 0 1 nokey LEFT
BZMPOP 0 1 nokey MIN
RPUSH late v
BLPOP late 0
EXEC";

#[test]
fn blocking_pop_replies_match_redis_server() {
    common::assert_same_replies(BLOCKING);
}

/// CONFIG SET of the settings both servers change at run time (the others differ on
/// purpose: tucana refuses what its command line fixes, `tests/config.rs`).
const CONFIG: &str = "CONFIG SET timeout 0
CONFIG GET timeout
CONFIG SET timeout x
CONFIG SET timeout
CONFIG SET maxclients 0
CONFIG SET maxclients 1000 timeout 0
CONFIG GET maxclients
CONFIG SET hash-max-ziplist-value 16
CONFIG GET hash-max-ziplist-value
CONFIG SET hash-max-ziplist-value 64
CONFIG SET zset-max-ziplist-entries x";

#[test]
fn config_set_replies_match_redis_server() {
    common::assert_same_replies(CONFIG);
}

/// Sorted set replies in RESP3: scores as doubles, members with scores as pairs.
const RESP3: &str = "len HELLO 3
FLUSHALL
ZADD z 1 a 2.5 b 3 c
ZSCORE z b
ZSCORE z nope
ZMSCORE z a nope
ZINCRBY z 1 a
ZADD z INCR 1 a
ZRANGE z 0 -1 WITHSCORES
ZRANGE z 0 -1
ZRANGEBYSCORE z -inf +inf WITHSCORES
ZREVRANGE z 0 0 WITHSCORES
ZUNION 1 z WITHSCORES
ZPOPMIN z
ZPOPMAX z 1
ZADD z 1 a 2 b
ZPOPMIN z 5
ZADD z 1 a 2 b
ZMPOP 1 z MIN COUNT 1
BZPOPMAX z 0
ZADD inf inf a -inf b
ZRANGE inf 0 -1 WITHSCORES
ZADD one 7 x
ZRANDMEMBER one 1 WITHSCORES
HSET h f v
HRANDFIELD h 1 WITHVALUES
HINCRBYFLOAT h n 1.5
INCRBYFLOAT fl 2.5
len HELLO 2";

#[test]
fn resp3_sorted_set_replies_match_redis_server() {
    common::assert_same_replies(RESP3);
}

/// OBJECT ENCODING of collections: the encoding Redis 7.0 picks by size and content,
/// under thresholds CONFIG SET changes (a collection that shrinks is not compared:
/// Redis never converts back, tucana answers by the present size).
const ENCODINGS: &str = "FLUSHALL
HSET h a 1 b 2
OBJECT ENCODING h
HSET hv f 0123456789012345678901234567890123456789012345678901234567890123456789
OBJECT ENCODING hv
HSET hk 0123456789012345678901234567890123456789012345678901234567890123456789 v
OBJECT ENCODING hk
CONFIG SET hash-max-ziplist-entries 2
HSET h3 a 1 b 2 c 3
OBJECT ENCODING h3
CONFIG GET hash-max-listpack-entries
CONFIG SET hash-max-listpack-entries 512
SADD ints 1 2 -3
OBJECT ENCODING ints
SADD mixed 1 a
OBJECT ENCODING mixed
SADD notint 01
OBJECT ENCODING notint
CONFIG SET set-max-intset-entries 2
SADD ints3 1 2 3
OBJECT ENCODING ints3
ZADD z 1 a 2 b
OBJECT ENCODING z
ZADD zl 1 0123456789012345678901234567890123456789012345678901234567890123456789
OBJECT ENCODING zl
CONFIG SET zset-max-listpack-entries 1
ZADD z2 1 a 2 b
OBJECT ENCODING z2
RPUSH l a b
OBJECT ENCODING l";

#[test]
fn object_encoding_replies_match_redis_server() {
    common::assert_same_replies(ENCODINGS);
}

/// The connection and debugging commands Redis's test suite leans on: DEBUG PROTOCOL's
/// sample of each RESP3 type (and its RESP2 forms), RESET (leaves MULTI and RESP3),
/// OBJECT REFCOUNT, COPY's DB option given a non-number, CONFIG inside MULTI and an
/// unknown CONFIG subcommand, CLIENT UNBLOCK of no blocked client, and the digests of
/// nothing.
const CONNECTION_AND_DEBUG: &str = "FLUSHALL
len HELLO 3
DEBUG PROTOCOL bignum
DEBUG PROTOCOL true
DEBUG PROTOCOL false
DEBUG PROTOCOL verbatim
DEBUG PROTOCOL attrib
DEBUG PROTOCOL map
DEBUG PROTOCOL set
DEBUG PROTOCOL array
DEBUG PROTOCOL double
DEBUG PROTOCOL null
RESET
DEBUG PROTOCOL bignum
DEBUG PROTOCOL attrib
DEBUG PROTOCOL verbatim
DEBUG PROTOCOL true
DEBUG PROTOCOL double
MULTI
SET a 1
RESET
EXEC
GET a
SET s hello_world
OBJECT REFCOUNT s
OBJECT REFCOUNT nokey
COPY s t DB notanumber
CONFIG FOO
MULTI
CONFIG GET timeout
EXEC
CLIENT UNBLOCK 999999
CLIENT UNBLOCK 999999 ERROR
CLIENT UNBLOCK x
DEBUG SET-ACTIVE-EXPIRE 0
DEBUG SET-ACTIVE-EXPIRE 1
DEBUG QUICKLIST-PACKED-THRESHOLD 1b
DEBUG QUICKLIST-PACKED-THRESHOLD 0
DEBUG DIGEST-VALUE nokey
FLUSHALL
DEBUG DIGEST";

#[test]
fn connection_and_debug_replies_match_redis_server() {
    common::assert_same_replies(CONNECTION_AND_DEBUG);
}

/// SORT and SORT_RO on each type: numbers and ALPHA, DESC, LIMIT, BY and GET patterns
/// (strings and hash fields, missing weights), BY nosort, STORE (and an empty result
/// deleting the destination), ties, and the errors.
const SORT: &str = "FLUSHALL
RPUSH l 3 1 2 10
SORT l
SORT l DESC
SORT l LIMIT 1 2
SORT l LIMIT -5 2
SORT l LIMIT 2 -1
SORT l LIMIT 10 2
SORT l ALPHA
SORT l ALPHA DESC
RPUSH t 1.0 1 01
SORT t
SORT t DESC
RPUSH bad 1 x
SORT bad
SORT bad ALPHA
SADD s 5 3 9
SORT s
SORT s DESC LIMIT 0 2
ZADD z 1 a 5 b 2 c
SORT z BY nosort
SORT z BY nosort DESC
SORT z ALPHA
SORT l BY nosort
SORT l BY nosort DESC
SET w_1 30
SET w_2 10
SET w_3 20
SET w_10 5
SORT l BY w_*
SORT l BY w_* DESC GET # GET w_*
SORT l BY missing_*
SORT l BY w_* ALPHA
HSET h_1 f x
HSET h_2 f y
SORT l BY w_* GET h_*->f
SORT l BY h_*->f ALPHA GET #
SORT l BY w_* STORE dst
LRANGE dst 0 -1
TYPE dst
SORT l GET nothing_* STORE dst
LRANGE dst 0 -1
SORT empty STORE dst
EXISTS dst
SET str x
SORT str
HSET hash f v
SORT hash
SORT l STORE
SORT l LIMIT 1
SORT l LIMIT x 1
SORT l FOO
SORT_RO l DESC
SORT_RO l STORE dst";

#[test]
fn sort_replies_match_redis_server() {
    common::assert_same_replies(SORT);
}
