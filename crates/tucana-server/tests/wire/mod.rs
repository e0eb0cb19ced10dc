//! A raw RESP connection for the tests that read what a subscriber receives (one command
//! may answer several frames, messages come unasked): [`Wire`], its decoded [`Frame`]s,
//! and [`words`] to write expected frames.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use tucana_server::RunningServer;

/// A raw RESP connection that sends commands and reads frames one at a time, as a
/// subscriber needs (one command may answer several frames, messages come unasked).
pub struct Wire {
    reader: BufReader<TcpStream>,
}

/// One decoded frame: a simple value's text (`+OK` → `OK`, `:3` → `3`, a null → `nil`),
/// or an aggregate's elements, with its kind (`*`, `>`, `%`).
#[derive(Debug, PartialEq, Eq, Clone)]
pub enum Frame {
    Simple(String),
    Error(String),
    Aggregate(char, Vec<Frame>),
}

impl Frame {
    /// An array (RESP2) or push (RESP3) of simple values, as text.
    pub fn words(&self) -> Vec<String> {
        match self {
            Frame::Aggregate(_, items) => items
                .iter()
                .map(|f| match f {
                    Frame::Simple(s) => s.clone(),
                    other => panic!("nested {other:?}"),
                })
                .collect(),
            other => panic!("not an aggregate: {other:?}"),
        }
    }

    pub fn kind(&self) -> char {
        match self {
            Frame::Aggregate(kind, _) => *kind,
            _ => ' ',
        }
    }
}

impl Wire {
    pub fn connect(server: &RunningServer) -> Wire {
        Wire::connect_to(&server.addr.to_string())
    }

    /// A connection to `addr` (a redis-server, for differential tests).
    pub fn connect_to(addr: &str) -> Wire {
        let stream = TcpStream::connect(addr).unwrap();
        // A hang guard, not a timing assertion.
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        Wire {
            reader: BufReader::new(stream),
        }
    }

    pub fn send(&mut self, args: &[&str]) {
        let mut req = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            req.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
        }
        self.reader.get_mut().write_all(&req).unwrap();
    }

    pub fn line(&mut self) -> String {
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        assert!(line.ends_with("\r\n"), "a cut frame: {line:?}");
        line.truncate(line.len() - 2);
        line
    }

    pub fn read(&mut self) -> Frame {
        let line = self.line();
        let (kind, rest) = line.split_at(1);
        match kind {
            "+" | ":" | "," | "#" => Frame::Simple(rest.to_string()),
            "-" => Frame::Error(rest.to_string()),
            "_" => Frame::Simple("nil".into()),
            "$" => {
                let n: i64 = rest.parse().unwrap();
                if n < 0 {
                    return Frame::Simple("nil".into());
                }
                let mut body = vec![0; n as usize + 2];
                self.reader.read_exact(&mut body).unwrap();
                body.truncate(n as usize);
                Frame::Simple(String::from_utf8(body).unwrap())
            }
            "*" | ">" | "%" | "~" => {
                let n: i64 = rest.parse().unwrap();
                let count = if kind == "%" { n * 2 } else { n };
                let items = (0..count.max(0)).map(|_| self.read()).collect();
                Frame::Aggregate(kind.chars().next().unwrap(), items)
            }
            other => panic!("unexpected frame {other}{rest}"),
        }
    }

    /// Reads until the server closes the connection (what it wrote before, then end of
    /// stream).
    pub fn read_to_end(&mut self) -> Vec<u8> {
        let mut rest = Vec::new();
        self.reader.read_to_end(&mut rest).unwrap();
        rest
    }

    /// Sends a command and reads its one frame.
    pub fn call(&mut self, args: &[&str]) -> Frame {
        self.send(args);
        self.read()
    }
}

pub fn words(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}
