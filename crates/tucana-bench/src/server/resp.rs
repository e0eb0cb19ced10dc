//! A minimal RESP (Redis protocol) client: PING, INFO fields and the loader's pipelined
//! SETs of every key, in redis-benchmark's key names. The `replication` command uses it
//! too.
//!
//! Owns the wire format of what the harness itself sends; redis-benchmark speaks for
//! itself. The loader's connections run on scoped threads that share nothing but the
//! value.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::Result;

/// SETs per round trip of the loader: deep enough that the network is not the limit.
pub(super) const LOAD_PIPELINE: u64 = 256;

/// Connections of the loader, each loading a contiguous share of the keys.
pub(super) const LOAD_CONNECTIONS: u64 = 4;

/// `key:` and 12 digits, as redis-benchmark's `-r` writes its keys.
pub(crate) const KEY_BYTES: u64 = 16;

pub(crate) fn key(index: u64) -> String {
    format!("key:{index:012}")
}

pub(crate) fn connect(port: u16) -> std::io::Result<TcpStream> {
    let stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_nodelay(true)?;
    // A server that stops answering ends the run instead of hanging it.
    stream.set_read_timeout(Some(Duration::from_secs(300)))?;
    Ok(stream)
}

pub(crate) fn command(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

pub(crate) fn ping(port: u16) -> Result<()> {
    let mut stream = connect(port)?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(&command(&[b"PING"]))?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    // A server still loading answers -LOADING; only +PONG means ready.
    if line != "+PONG\r\n" {
        return Err(format!("PING answered {line:?}").into());
    }
    Ok(())
}

/// `field` of INFO `section` as a number, or `None` (no such field, no answer).
pub(super) fn info_field(port: u16, section: &str, field: &str) -> Option<u64> {
    let text = info(port, section)?;
    text.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| value.trim().parse().ok())
}

/// The text of INFO `section`, or `None` (no answer).
pub(crate) fn info(port: u16, section: &str) -> Option<String> {
    let mut stream = connect(port).ok()?;
    stream
        .write_all(&command(&[b"INFO", section.as_bytes()]))
        .ok()?;
    let mut reader = BufReader::new(stream);
    let mut header = String::new();
    reader.read_line(&mut header).ok()?;
    // RESP2 bulk string "$LEN\r\n" (RESP3 would be a verbatim string; we never say HELLO 3).
    let len: usize = header.strip_prefix('$')?.trim_end().parse().ok()?;
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body).ok()?;
    Some(String::from_utf8_lossy(&body).into_owned())
}

/// SETs every key `key:000000000000` .. of the keyspace once with a value of `value_bytes`
/// bytes ('x', like redis-benchmark's), over a few pipelined connections, checking every
/// reply.
pub(super) fn load(port: u16, keys: u64, value_bytes: u64) -> Result<()> {
    load_keys(port, 0..keys, &vec![b'x'; value_bytes as usize])
}

/// SETs every key of `keys` (redis-benchmark's names) to `value` over a few pipelined
/// connections, each a contiguous share, checking every reply.
pub(crate) fn load_keys(port: u16, keys: std::ops::Range<u64>, value: &[u8]) -> Result<()> {
    let count = keys.end.saturating_sub(keys.start);
    let share = count.div_ceil(LOAD_CONNECTIONS);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..LOAD_CONNECTIONS)
            .map(|c| {
                let at = |i: u64| keys.start + (i * share).min(count);
                let range = at(c)..at(c + 1);
                scope.spawn(move || load_range(port, range, value))
            })
            .collect();
        for worker in workers {
            worker.join().map_err(|_| "a loader thread panicked")??;
        }
        Ok(())
    })
}

fn load_range(port: u16, range: std::ops::Range<u64>, value: &[u8]) -> Result<()> {
    let set = |index: u64| command(&[b"SET", key(index).as_bytes(), value]);
    send_range(port, range, &set, &|line| line == "+OK\r\n")
}

/// Sends `request(i)` for every `i` of `indexes` over a few pipelined connections, each a
/// contiguous share; every reply must be one line that `ok` accepts (the loader of the
/// data-type tests: HSETs of records, ZADDs of an index).
pub(super) fn load_requests(
    port: u16,
    indexes: std::ops::Range<u64>,
    request: &(dyn Fn(u64) -> Vec<u8> + Sync),
    ok: &(dyn Fn(&str) -> bool + Sync),
) -> Result<()> {
    let count = indexes.end.saturating_sub(indexes.start);
    let share = count.div_ceil(LOAD_CONNECTIONS);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..LOAD_CONNECTIONS)
            .map(|c| {
                let at = |i: u64| indexes.start + (i * share).min(count);
                let range = at(c)..at(c + 1);
                scope.spawn(move || send_range(port, range, request, ok))
            })
            .collect();
        for worker in workers {
            worker.join().map_err(|_| "a loader thread panicked")??;
        }
        Ok(())
    })
}

fn send_range(
    port: u16,
    range: std::ops::Range<u64>,
    request: &(dyn Fn(u64) -> Vec<u8> + Sync),
    ok: &(dyn Fn(&str) -> bool + Sync),
) -> Result<()> {
    let stream = connect(port)?;
    let mut writer = std::io::BufWriter::with_capacity(1 << 20, stream.try_clone()?);
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    let mut next = range.start;
    while next < range.end {
        let batch_end = (next + LOAD_PIPELINE).min(range.end);
        for index in next..batch_end {
            writer.write_all(&request(index))?;
        }
        writer.flush()?;
        for index in next..batch_end {
            line.clear();
            reader.read_line(&mut line)?;
            if !ok(&line) {
                return Err(format!("the loader's request {index} was answered {line:?}").into());
            }
        }
        next = batch_end;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_redis_benchmarks() {
        assert_eq!(key(123_456), "key:000000123456");
        assert_eq!(key(0).len() as u64, KEY_BYTES);
        assert_eq!(
            command(&[b"SET", b"k", b"v"]),
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n".to_vec()
        );
    }
}
