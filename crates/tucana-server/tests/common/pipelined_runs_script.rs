// The pipeline both tests of pipelined runs send (`commands::runs`' unit test, against the
// one-at-a-time path, and `tests/pipelined_runs.rs`, against that path and redis-server):
// runs of collection writes mixed with what ends a run, pops past the end of a list,
// WRONGTYPE and a key changing type inside a run, errors of the general path, the expired
// keys `SETUP` makes, a key's metadata read and kept by a run and then changed in it, a run longer than `RUN_MAX_REQUESTS`, and reads of the results.
// Included (`include!`) by both, so it is one list.

/// The pipeline (see the file's comment).
fn script() -> Vec<String> {
    let mut lines: Vec<String> = [
        "LPUSH l a b c",
        "RPUSH l d",
        "LPOP l",
        "RPOP l",
        "LPOP l 2",
        "LPOP l",
        "LPOP l 3",
        "RPOP l",
        "RPUSH l e",
        "LPUSHX nope x",
        "RPUSHX l f",
        "ZADD l 1 m",
        "LPOP e",
        "RPUSH e x",
        "LPUSH ez y",
        "LLEN l",
        "ZADD z 1 a 2 b 3 c",
        "ZADD z 5 a",
        "ZADD z NX 9 a",
        "ZADD z XX CH 7 b",
        "ZADD z INCR 1 c",
        "ZINCRBY z 2.5 a",
        "ZADD z 1 x y",
        "ZREM z a b c",
        "ZADD z 1 q",
        "LPUSH z x",
        "ZREM z q",
        "LPUSH z x",
        "RPUSH z y",
        "HSET h f v g w",
        "HSETNX h f x",
        "HINCRBY h n 5",
        "HINCRBY h f 1",
        "HDEL h f g n",
        "HMSET h a 1",
        "SADD s a b a",
        "SREM s a",
        "SADD h x",
        "ZADD kept 1 a 2 b",
        "SET str v",
        "LPUSH str x",
        "SADD str x",
        "LPUSH",
        "LPOP l -1",
        "LPOP l",
        "DEL l",
        "LPOP l",
        "RPUSH l after-del",
        // `kept` was committed by the run before `SET str v`: its metadata is read from
        // the engine and kept by the run's store, then changed in the overlay, which must
        // win; emptied and created again in the same run.
        "ZADD kept 5 a",
        "ZADD kept 1 c",
        "ZADD kept 7 a",
        "ZREM kept a b c",
        "ZADD kept 2 z",
        "ZADD kept 3 z",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    lines.extend((0..300).map(|i| format!("RPUSH big {i}")));
    lines.extend((0..150).map(|_| "LPOP big".to_string()));
    lines.push("LPOP big 200".into());
    lines.extend((0..5).map(|_| "RPOP big".to_string()));
    lines.extend((0..40).map(|i| format!("ZADD rec-index {} m{}", (i * 7) % 23, i % 31)));
    lines.extend(
        [
            "LRANGE l 0 -1",
            "LRANGE e 0 -1",
            "LRANGE ez 0 -1",
            "LRANGE z 0 -1",
            "ZRANGE rec-index 0 -1 WITHSCORES",
            "ZRANGE kept 0 -1 WITHSCORES",
            "HGETALL h",
            "SMEMBERS s",
            "EXISTS big",
            "TYPE z",
            "DBSIZE",
        ]
        .map(String::from),
    );
    lines
}
