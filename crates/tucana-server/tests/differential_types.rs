//! The collection commands (hashes, sorted sets, sets, lists, and the key commands on
//! typed keys) sent
//! alike to redis-server and to tucana over raw RESP: each reply must be the same bytes.
//! Replies whose order Redis does not define (HGETALL, HKEYS, HVALS, HSCAN, ZSCAN: Redis
//! answers small ones in insertion order, tucana in field order) are compared after
//! sorting their elements (`sort`, `scankeys`) or their pairs (`pairs`); random picks,
//! and OBJECT ENCODING (Redis names its compact encodings of small collections), are
//! compared by their size (`len`). Skipped, with a message, where `redis-server` is not installed
//! (`bash scripts/server-deps.sh --bench`).

mod common;

const SCRIPT: &str = "FLUSHALL
HSET h f1 v1 f2 v2
HSET h f1 x f3 v3 f3 v4
HGET h f1
HGET h f3
HGET h nope
HGET nokey f
HMGET h f1 nope f2
HMGET nokey a b
pairs HGETALL h
HGETALL nokey
sort HKEYS h
sort HVALS h
HLEN h
HLEN nokey
HEXISTS h f2
HEXISTS h nope
HSTRLEN h f1
HSTRLEN h nope
HSETNX h f1 y
HSETNX h f9 y
HMSET h a 1 b 2
HMSET h a
HSET h a
HSET h
HINCRBY h a 10
HINCRBY h new -5
HINCRBY h f1 1
HINCRBY h a x
HINCRBY h a 9223372036854775807
HINCRBYFLOAT h a 0.5
HINCRBYFLOAT h fl 10.5
HINCRBYFLOAT h fl 0.1
HINCRBYFLOAT h f1 1
HINCRBYFLOAT h fl abc
HINCRBYFLOAT h fl inf
HDEL h f1 f1 nope
HDEL nokey a
TYPE h
TYPE nokey
len OBJECT ENCODING h
EXISTS h nokey
len HRANDFIELD h
len HRANDFIELD h 3
len HRANDFIELD h 100
len HRANDFIELD h -20
len HRANDFIELD h 2 WITHVALUES
HRANDFIELD nokey
HRANDFIELD nokey 3
HRANDFIELD h 0
HRANDFIELD h x
HRANDFIELD h -9223372036854775808
HRANDFIELD h -9223372036854775807 WITHVALUES
HRANDFIELD h 9223372036854775807 WITHVALUES
pairs HSCAN h 0
pairs HSCAN h 0 MATCH f*
pairs HSCAN h 0 COUNT 100
HSCAN h x
HSCAN nokey 0
SET s str
HSET s a b
HGET s a
HGETALL s
HLEN s
GET h
STRLEN h
APPEND h x
INCR h
GETSET h x
GETDEL h
SET h x GET
MGET s h nokey
HDEL h a b new f2 f3 f9 fl
EXISTS h
TYPE h
HSET e only 1
HDEL e only
EXISTS e
HSET d a 1
DEL d
HGET d a
HSET d b 2
HGETALL d
HSET o a 1
SET o plain
GET o
TYPE o
ZADD z 1 a 2 b 3 c
ZADD z 1.5 a
ZADD z NX 9 a 4 d
ZADD z XX 9 a 10 nope
ZADD z CH 2 a 3 b 7 e
ZADD z GT 1 a
ZADD z LT 1 a
ZADD z GT CH 5 a
ZADD z INCR 0.25 a
ZADD z INCR NX 1 a
ZADD z XX INCR 1 nope
ZADD z NX XX 1 a
ZADD z NX GT 1 a
ZADD z GT LT 1 a
ZADD z INCR 1 a 2 b
ZADD z 1
ZADD z x a
ZADD z nan a
ZADD z inf top -inf bottom
ZADD z -0 negzero
ZSCORE z negzero
ZADD z INCR -0 incrzero
ZSCORE z incrzero
ZINCRBY z -0 incrzero2
ZADD z 0.1 negzero
ZADD z 0.1 negzero
ZADD z 0.1 tenth 1e20 big 3.14159 pi
ZSCORE z a
ZSCORE z tenth
ZSCORE z big
ZSCORE z top
ZSCORE z bottom
ZSCORE z nope
ZSCORE nokey a
ZMSCORE z a nope tenth
ZMSCORE nokey a
ZCARD z
ZCARD nokey
ZINCRBY z 2 b
ZINCRBY z 1 newm
ZINCRBY z x b
ZINCRBY z -inf top
ZRANGE z 0 -1
ZRANGE z 0 -1 WITHSCORES
ZRANGE z 2 4
ZRANGE z -3 -1 WITHSCORES
ZRANGE z 5 2
ZRANGE z 100 200
ZRANGE z -100 1
ZRANGE z 0 -1 REV
ZRANGE z 0 1 REV WITHSCORES
ZRANGE z 1 3 BYSCORE
ZRANGE z (1 3 BYSCORE WITHSCORES
ZRANGE z 1 (3 BYSCORE
ZRANGE z -inf +inf BYSCORE
ZRANGE z +inf -inf BYSCORE REV
ZRANGE z 5 1 BYSCORE REV WITHSCORES
ZRANGE z -inf +inf BYSCORE LIMIT 1 2
ZRANGE z -inf +inf BYSCORE LIMIT 1 -1
ZRANGE z -inf +inf BYSCORE LIMIT -1 2
ZRANGE z 0 -1 LIMIT 1 2
ZRANGE z - + BYLEX WITHSCORES
ZRANGE z x y BYSCORE
ZRANGE z a b
ZRANGE z 0 -1 FOO
ZRANGE nokey 0 -1
ZREVRANGE z 0 2
ZREVRANGE z 0 2 WITHSCORES
ZREVRANGE z 0 2 FOO
ZRANGEBYSCORE z -inf +inf
ZRANGEBYSCORE z 1 3 WITHSCORES
ZRANGEBYSCORE z (1 (3
ZRANGEBYSCORE z 3 1
ZRANGEBYSCORE z -inf +inf LIMIT 2 3
ZRANGEBYSCORE z -inf +inf WITHSCORES LIMIT 0 1
ZRANGEBYSCORE z a b
ZRANGEBYSCORE z 1 2 LIMIT 1
ZREVRANGEBYSCORE z +inf -inf
ZREVRANGEBYSCORE z 3 1 WITHSCORES
ZREVRANGEBYSCORE z (3 (1 LIMIT 0 1
ZCOUNT z -inf +inf
ZCOUNT z (1 3
ZCOUNT z x 1
ZCOUNT nokey 0 1
ZRANK z a
ZRANK z top
ZRANK z bottom
ZRANK z nope
ZREVRANK z a
ZREVRANK z bottom
ZRANK nokey a
ZREM z a nope a
ZREM nokey a
ZADD lex 0 a 0 b 0 c 0 d 0 e 0 f
ZRANGEBYLEX lex - +
ZRANGEBYLEX lex [b (e
ZRANGEBYLEX lex (b [e LIMIT 1 2
ZRANGEBYLEX lex + -
ZRANGEBYLEX lex [e [b
ZRANGEBYLEX lex b e
ZREVRANGEBYLEX lex + -
ZREVRANGEBYLEX lex [e (b
ZRANGE lex [b [d BYLEX
ZRANGE lex [d [b BYLEX REV
ZRANGE lex - + BYLEX LIMIT 2 2
ZLEXCOUNT lex - +
ZLEXCOUNT lex [b (d
ZREMRANGEBYLEX lex [a [b
ZRANGE lex 0 -1
ZREMRANGEBYRANK lex 0 0
ZREMRANGEBYRANK lex -1 -1
ZRANGE lex 0 -1
ZREMRANGEBYSCORE z -inf (1
ZRANGE z 0 -1 WITHSCORES
ZREMRANGEBYSCORE z x 1
ZREMRANGEBYRANK z x 1
ZPOPMIN z
ZPOPMAX z
ZPOPMIN z 2
ZPOPMAX z 0
ZPOPMIN z -1
ZPOPMIN nokey
ZPOPMIN z 100
EXISTS z
pairs ZSCAN lex 0
ZSCAN nokey 0
ZADD h 1 a
ZRANGE s 0 -1
ZSCORE s a
TYPE lex
len OBJECT ENCODING lex
HSET s2 a 1
ZADD s2 1 a
HGET lex a
ZADD big 1 m1 2 m2 3 m3
EXPIREAT big 4102444800
TTL big
ZADD big 4 m4
EXPIRETIME big
PERSIST big
TTL big
HSET hx a 1
EXPIRE hx -1
EXISTS hx
HGET hx a
HLEN hx
SADD st a b c a
SADD st c d
SADD st
SREM st a nope a
SREM nokey a
sort SMEMBERS st
SMEMBERS nokey
SISMEMBER st b
SISMEMBER st nope
SISMEMBER nokey a
SMISMEMBER st b nope c
SMISMEMBER nokey a b
SCARD st
SCARD nokey
len SPOP st
SCARD st
len SPOP st 5
EXISTS st
SPOP st
SPOP st 2
SPOP nokey
SPOP nokey 3
SADD st x y z
SPOP st -1
SPOP st 0
SPOP st x
len SRANDMEMBER st
len SRANDMEMBER st 2
len SRANDMEMBER st -7
len SRANDMEMBER st 100
SRANDMEMBER st 0
SRANDMEMBER nokey
SRANDMEMBER nokey 2
SRANDMEMBER st x
SRANDMEMBER st -9223372036854775808
scankeys SSCAN st 0 MATCH *
SSCAN nokey 0
SADD s1 a b c d
SADD s2 c d e
SADD s3 d e f
sort SINTER s1 s2
sort SINTER s1 s2 s3
SINTER s1 nokey
sort SUNION s1 s2 s3
sort SUNION s1 nokey
sort SDIFF s1 s2
sort SDIFF s1 s2 s3
SDIFF nokey s1
SINTER s1 h
SINTER s1 s
SINTERSTORE dst s1 s2
sort SMEMBERS dst
SUNIONSTORE dst s1 s3
SCARD dst
SDIFFSTORE dst s1 s1
EXISTS dst
SET dst str
SUNIONSTORE dst s1 s2
TYPE dst
SINTERSTORE s1 s1 s2
sort SMEMBERS s1
SINTERSTORE dst s1 s
SMOVE s2 s1 e
SMOVE s2 s1 nope
SMOVE nokey s1 a
SMOVE s2 s2 c
SMOVE s2 s c
SMOVE s2 newset c
sort SMEMBERS s2
SMEMBERS newset
SADD s 1
SCARD s
TYPE s1
len OBJECT ENCODING s1
RPUSH l a b c
LPUSH l z y
LPUSH l
RPUSHX l d
LPUSHX nokey x
RPUSHX nokey x
LLEN l
LLEN nokey
LRANGE l 0 -1
LRANGE l -2 -1
LRANGE l 1 2
LRANGE l 5 10
LRANGE l -100 100
LRANGE l 3 1
LRANGE l x 1
LRANGE nokey 0 -1
LINDEX l 0
LINDEX l -1
LINDEX l 100
LINDEX l -100
LINDEX l x
LINDEX nokey 0
LSET l 0 first
LSET l -1 last
LSET l 100 x
LSET nokey 0 x
LSET l x v
LRANGE l 0 -1
LPOP l
RPOP l
LPOP l 2
RPOP l 0
LPOP l -1
LPOP nokey
LPOP nokey 2
RPOP nokey 0
LRANGE l 0 -1
RPUSH r a b a c a d a
LREM r 2 a
LRANGE r 0 -1
LREM r -1 a
LRANGE r 0 -1
LREM r 0 a
LRANGE r 0 -1
LREM r 0 nope
LREM nokey 0 a
LREM r x a
LINSERT r BEFORE c x
LINSERT r AFTER d y
LINSERT r AFTER nope y
LINSERT r MIDDLE c y
LINSERT nokey BEFORE a b
LRANGE r 0 -1
RPUSH p a b c a b c a
LPOS p a
LPOS p b RANK 2
LPOS p a RANK -1
LPOS p a COUNT 0
LPOS p a COUNT 2
LPOS p a RANK -2 COUNT 5
LPOS p a MAXLEN 3 COUNT 0
LPOS p nope
LPOS p nope COUNT 2
LPOS p a RANK 0
LPOS p a COUNT -1
LPOS p a MAXLEN -1
LPOS p a FOO 1
LPOS p a RANK
LPOS nokey a
LPOS nokey a COUNT 1
LTRIM p 1 -2
LRANGE p 0 -1
LTRIM p -2 -1
LRANGE p 0 -1
LTRIM p 5 1
EXISTS p
LTRIM nokey 0 1
RPUSH m1 a b c
LMOVE m1 m2 LEFT RIGHT
LMOVE m1 m2 RIGHT LEFT
LRANGE m1 0 -1
LRANGE m2 0 -1
LMOVE m2 m2 LEFT RIGHT
LRANGE m2 0 -1
LMOVE m1 m1 RIGHT LEFT
LMOVE m1 m2 UP LEFT
LMOVE nokey m2 LEFT LEFT
LMOVE m2 s LEFT LEFT
LMOVE s m2 LEFT LEFT
RPOPLPUSH m2 m3
RPOPLPUSH m1 m3
EXISTS m1
LRANGE m3 0 -1
LPUSH s x
LRANGE s 0 -1
LPOP h
TYPE m3
len OBJECT ENCODING m3
RPUSH l2 a
LPOP l2
EXISTS l2
scankeys SCAN 0 TYPE hash COUNT 1000
scankeys SCAN 0 TYPE set COUNT 1000
scankeys SCAN 0 TYPE list COUNT 1000
scankeys SCAN 0 TYPE zset COUNT 1000
scankeys SCAN 0 TYPE string COUNT 1000
sort KEYS *
DBSIZE
WATCH wz
ZADD wz 1 a
MULTI
ZCARD wz
EXEC
WATCH wz
ZADD wz 1 a
SADD ws x
MULTI
ZCARD wz
SADD ws x
EXEC
WATCH wh ws
HSET wh f v
MULTI
HLEN wh
EXEC
WATCH ws
SREM ws nope
MULTI
SCARD ws
EXEC
WATCH wl
RPUSH wl a
MULTI
LPOP wl
HSET wh g w
EXEC
FLUSHDB
DBSIZE
HGETALL h
ZRANGE lex 0 -1";

#[test]
fn collection_replies_match_redis_server() {
    common::assert_same_replies(SCRIPT);
}

/// Hashes across tucana's packed-layout bounds (128 fields, 4096 bytes of fields and
/// values; DESIGN.md, "Packed small hashes"): the replies before and after a conversion,
/// in one HSET and field by field, inside MULTI, and back down to few fields.
#[test]
fn hashes_across_the_packed_bounds_match_redis_server() {
    let fields = |range: std::ops::Range<usize>| -> String {
        range.map(|i| format!(" f{i:03} v{i:03}")).collect()
    };
    let big = "x".repeat(2000);
    let mut script = vec![
        "FLUSHALL".to_string(),
        format!("HSET one{}", fields(0..129)),
        "HLEN one".into(),
        format!("HSET edge{}", fields(0..128)),
        "HLEN edge".into(),
        "HGET edge f127".into(),
        "HSETNX edge f000 no".into(),
        "HSETNX edge f128 yes".into(),
        "HLEN edge".into(),
        "HGET edge f128".into(),
        "pairs HGETALL edge".into(),
        format!("HSET multi{}", fields(0..127)),
        "MULTI".into(),
        "HSET multi f127 a f128 b".into(),
        "HLEN multi".into(),
        "HINCRBY multi n 5".into(),
        "HGET multi f128".into(),
        "EXEC".into(),
        format!("HSET bytes a {big} b {big}"),
        "HSTRLEN bytes b".into(),
        format!("HSET bytes c {}", "y".repeat(200)),
        "HLEN bytes".into(),
        "HSTRLEN bytes c".into(),
        "HINCRBYFLOAT bytes n 2.5".into(),
        "sort HKEYS bytes".into(),
    ];
    let mut del = "HDEL edge".to_string();
    for i in 1..129 {
        del.push_str(&format!(" f{i:03}"));
    }
    script.push(del);
    script.extend([
        "pairs HGETALL edge".into(),
        "HDEL edge f000".into(),
        "EXISTS edge".into(),
        "RENAME one moved".into(),
        "HGET moved f100".into(),
        "COPY bytes copied".into(),
        "HSTRLEN copied a".into(),
    ]);
    common::assert_same_replies(&script.join("\n"));
}
