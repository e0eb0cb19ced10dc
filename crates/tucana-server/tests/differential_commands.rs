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
