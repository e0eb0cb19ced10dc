//! The YCSB driver's [`Engine`] over RESP: `SET`, `GET`, `DEL` and `SAVE` against a
//! `tucana serve` process, so that `ycsb::load_and_run` drives a primary (and, through
//! it, its backups) unchanged, checking every value it reads as it does on an engine.
//!
//! Owns the connections and the parsing of replies. A bulk load's batch is one pipelined
//! round trip (the server appends a run of plain SETs as one engine batch); every other
//! call is one request and its reply. Scans are not part of this benchmark and fail.
//!
//! Thread-safety: the engine keeps a pool of connections; a call takes one out for its
//! request and reply and puts it back, so each driver thread has a connection of its own
//! while it works. A connection whose call failed is dropped, not reused (its stream may
//! be in the middle of a reply).

use std::io::{BufRead, BufReader, BufWriter, Write};
use std::net::TcpStream;
use std::ops::Bound;
use std::path::Path;
use std::sync::{Mutex, PoisonError};

use serde_json::{json, Value};

use crate::engine::{Direction, Engine, EngineConfig, EngineKind, Footprint, Visit};
use crate::server::resp::connect;
use crate::Result;

/// Opens engines that talk to the server on `port`.
pub(super) struct RespKind {
    pub(super) port: u16,
}

impl EngineKind for RespKind {
    /// The driver's own lines on the terminal carry this name; the records get the
    /// setup's.
    fn name(&self) -> &'static str {
        "driver"
    }

    /// Ignores `dir` and `config`: the server's data directory and durability are the
    /// command's (`cluster`).
    fn open(&self, _dir: &Path, _config: &EngineConfig) -> Result<Box<dyn Engine>> {
        Ok(Box::new(RespEngine {
            port: self.port,
            pool: Mutex::new(Vec::new()),
        }))
    }

    fn configuration(&self, _config: &EngineConfig) -> Value {
        json!({
            "protocol": "RESP2 over TCP (loopback)",
            "put": "SET (answered once durable: the server's sync durability, and received by every backup)",
            "put_batch": "pipelined SETs, one round trip",
            "get": "GET",
        })
    }
}

/// A reply, as far as this client needs one.
#[derive(Debug, PartialEq)]
enum Reply {
    Simple(String),
    Error(String),
    Integer(i64),
    Bulk(Option<Vec<u8>>),
}

/// One connection: a buffered writer of requests and a buffered reader of replies.
struct Connection {
    reader: BufReader<TcpStream>,
    writer: BufWriter<TcpStream>,
}

impl Connection {
    fn open(port: u16) -> Result<Connection> {
        let stream = connect(port)?;
        Ok(Connection {
            writer: BufWriter::with_capacity(1 << 16, stream.try_clone()?),
            reader: BufReader::with_capacity(1 << 16, stream),
        })
    }

    /// Queues one request (an array of bulk strings); `flush` sends what is queued.
    fn send(&mut self, args: &[&[u8]]) -> std::io::Result<()> {
        write!(self.writer, "*{}\r\n", args.len())?;
        for arg in args {
            write!(self.writer, "${}\r\n", arg.len())?;
            self.writer.write_all(arg)?;
            self.writer.write_all(b"\r\n")?;
        }
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.writer.flush()
    }

    fn reply(&mut self) -> Result<Reply> {
        read_reply(&mut self.reader)
    }

    /// Sends one request and reads its reply.
    fn call(&mut self, args: &[&[u8]]) -> Result<Reply> {
        self.send(args)?;
        self.flush()?;
        self.reply()
    }
}

/// Reads one reply (no arrays: nothing this client sends is answered with one).
fn read_reply(reader: &mut impl BufRead) -> Result<Reply> {
    let mut line = Vec::new();
    reader.read_until(b'\n', &mut line)?;
    let text = line
        .strip_suffix(b"\r\n")
        .ok_or("the server closed the connection or sent a line without CRLF")?;
    let (kind, rest) = text.split_first().ok_or("an empty reply line")?;
    let rest = String::from_utf8_lossy(rest).into_owned();
    match kind {
        b'+' => Ok(Reply::Simple(rest)),
        b'-' => Ok(Reply::Error(rest)),
        b':' => Ok(Reply::Integer(rest.parse()?)),
        b'$' => {
            let len: i64 = rest.parse()?;
            if len < 0 {
                return Ok(Reply::Bulk(None));
            }
            let mut body = vec![0u8; len as usize + 2];
            reader.read_exact(&mut body)?;
            if !body.ends_with(b"\r\n") {
                return Err("a bulk string without its CRLF".into());
            }
            body.truncate(len as usize);
            Ok(Reply::Bulk(Some(body)))
        }
        other => Err(format!("unexpected reply type {:?}", *other as char).into()),
    }
}

/// `Ok` for `+OK`, the server's error otherwise (e.g. `NOREPLICAS`).
fn expect_ok(reply: Reply, what: &str) -> Result<()> {
    match reply {
        Reply::Simple(s) if s == "OK" => Ok(()),
        other => Err(format!("{what} answered {other:?}").into()),
    }
}

/// The client side of one server: a pool of connections to it.
struct RespEngine {
    port: u16,
    pool: Mutex<Vec<Connection>>,
}

impl RespEngine {
    /// Runs `f` on a connection of the pool (a new one when none is free), which goes
    /// back to the pool only if `f` succeeded.
    fn with_connection<T>(&self, f: impl FnOnce(&mut Connection) -> Result<T>) -> Result<T> {
        let free = self
            .pool
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let mut connection = match free {
            Some(c) => c,
            None => Connection::open(self.port)?,
        };
        let result = f(&mut connection);
        if result.is_ok() {
            self.pool
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(connection);
        }
        result
    }
}

impl Engine for RespEngine {
    fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.with_connection(|c| expect_ok(c.call(&[b"SET", key, value])?, "SET"))
    }

    fn put_batch(&self, pairs: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
        self.with_connection(|c| {
            for (key, value) in pairs {
                c.send(&[b"SET", key, value])?;
            }
            c.flush()?;
            // Every reply is read before an error is returned, so that the connection
            // could be reused; it is dropped anyway on error.
            let mut first_error = None;
            for _ in pairs {
                if let Err(error) = expect_ok(c.reply()?, "a pipelined SET") {
                    first_error.get_or_insert(error);
                }
            }
            first_error.map_or(Ok(()), Err)
        })
    }

    fn get(&self, key: &[u8], check: &mut dyn FnMut(&[u8]) -> bool) -> Result<Option<bool>> {
        self.with_connection(|c| match c.call(&[b"GET", key])? {
            Reply::Bulk(Some(value)) => Ok(Some(check(&value))),
            Reply::Bulk(None) => Ok(None),
            other => Err(format!("GET answered {other:?}").into()),
        })
    }

    fn delete(&self, key: &[u8]) -> Result<bool> {
        self.with_connection(|c| match c.call(&[b"DEL", key])? {
            Reply::Integer(n) => Ok(n > 0),
            other => Err(format!("DEL answered {other:?}").into()),
        })
    }

    fn scan(
        &self,
        _lower: Bound<&[u8]>,
        _upper: Bound<&[u8]>,
        _direction: Direction,
        _visit: &mut Visit<'_>,
    ) -> Result<()> {
        Err("scans are not part of the replication benchmark (YCSB Load and A only)".into())
    }

    /// Nothing to do: the server answers a SET only once it is durable (sync durability).
    fn sync(&self) -> Result<()> {
        Ok(())
    }

    fn commit(&self) -> Result<()> {
        self.with_connection(|c| expect_ok(c.call(&[b"SAVE"])?, "SAVE"))
    }

    fn footprint(&self) -> Footprint {
        Footprint::default()
    }

    fn close(self: Box<Self>) -> Result<()> {
        Ok(())
    }

    fn abandon(self: Box<Self>) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_parse() {
        let mut input: &[u8] = b"+OK\r\n-NOREPLICAS not enough\r\n:3\r\n$4\r\na\r\nb\r\n$-1\r\n";
        assert_eq!(read_reply(&mut input).unwrap(), Reply::Simple("OK".into()));
        assert_eq!(
            read_reply(&mut input).unwrap(),
            Reply::Error("NOREPLICAS not enough".into())
        );
        assert_eq!(read_reply(&mut input).unwrap(), Reply::Integer(3));
        assert_eq!(
            read_reply(&mut input).unwrap(),
            Reply::Bulk(Some(b"a\r\nb".to_vec()))
        );
        assert_eq!(read_reply(&mut input).unwrap(), Reply::Bulk(None));
        assert!(read_reply(&mut input).is_err(), "end of stream");
        assert!(expect_ok(Reply::Error("ERR".into()), "SET").is_err());
        assert!(expect_ok(Reply::Simple("OK".into()), "SET").is_ok());
    }
}
