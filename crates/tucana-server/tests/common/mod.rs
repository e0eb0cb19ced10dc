//! The harness of the differential tests: the same script of commands sent over raw RESP
//! to a redis-server it starts and to an in-process tucana server, replies compared.
//!
//! A script line is an optional normalization word, then the command's words:
//! `sort` (elements compared as a set), `pairs` (field-value pairs compared as a set),
//! `len` (only the number of elements), `scankeys` (a SCAN reply's keys as a set);
//! otherwise the reply's bytes must be equal. [`run_script`] returns `None` (after a
//! message) where `redis-server` is not installed (`bash scripts/server-deps.sh --bench`).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tucana::Database;
use tucana_server::{spawn, ServerConfig};

pub struct RedisServer(Child);

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn free_port() -> u16 {
    // Below the ephemeral range: no server of another test, bound to port 0, can hold it.
    tucana_cluster::testing::free_port("127.0.0.1")
}

pub struct Raw {
    reader: BufReader<TcpStream>,
}

impl Raw {
    pub fn connect(addr: &str) -> Raw {
        let give_up = Instant::now() + Duration::from_secs(30);
        loop {
            match TcpStream::connect(addr) {
                Ok(s) => {
                    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                    return Raw {
                        reader: BufReader::new(s),
                    };
                }
                Err(e) if Instant::now() < give_up => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("cannot connect to {addr}: {e}"),
            }
        }
    }

    /// Sends one command and returns its reply's bytes, split into its top-level
    /// elements when it is an array (else one element).
    pub fn call(&mut self, args: &[Vec<u8>]) -> (Vec<u8>, Vec<Vec<u8>>) {
        let mut req = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            req.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            req.extend_from_slice(a);
            req.extend_from_slice(b"\r\n");
        }
        self.reader.get_mut().write_all(&req).unwrap();
        let mut whole = Vec::new();
        let mut line = Vec::new();
        self.reader.read_until(b'\n', &mut line).unwrap();
        whole.extend_from_slice(&line);
        let mut elements = Vec::new();
        if line[0] == b'|' {
            // RESP3 attributes, then the reply they come with: one element.
            self.read_attributed(&line, &mut whole);
            elements.push(whole.clone());
        } else if let Some(n) = aggregate_len(&line) {
            for _ in 0..n {
                let mut one = Vec::new();
                self.read_value(&mut one);
                whole.extend_from_slice(&one);
                elements.push(one);
            }
        } else {
            self.read_rest(&line, &mut whole);
            elements.push(whole.clone());
        }
        (whole, elements)
    }

    /// Sends every request in one write (one pipelined batch, as far as the server's
    /// reads take it so), then reads their replies: each one's bytes, in order.
    pub fn pipeline(&mut self, requests: &[Vec<Vec<u8>>]) -> Vec<Vec<u8>> {
        let mut wire = Vec::new();
        for args in requests {
            wire.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
            for a in args {
                wire.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
                wire.extend_from_slice(a);
                wire.extend_from_slice(b"\r\n");
            }
        }
        self.reader.get_mut().write_all(&wire).unwrap();
        (0..requests.len())
            .map(|_| {
                let mut one = Vec::new();
                self.read_value(&mut one);
                one
            })
            .collect()
    }

    fn read_value(&mut self, out: &mut Vec<u8>) {
        let mut line = Vec::new();
        self.reader.read_until(b'\n', &mut line).unwrap();
        out.extend_from_slice(&line);
        if line[0] == b'|' {
            self.read_attributed(&line, out);
        } else if let Some(n) = aggregate_len(&line) {
            for _ in 0..n {
                self.read_value(out);
            }
        } else {
            self.read_rest(&line, out);
        }
    }

    /// After a RESP3 attribute header `line` (`|n`): its n pairs and the reply after.
    fn read_attributed(&mut self, line: &[u8], out: &mut Vec<u8>) {
        let n: usize = std::str::from_utf8(&line[1..line.len() - 2])
            .unwrap()
            .parse()
            .unwrap();
        for _ in 0..2 * n + 1 {
            self.read_value(out);
        }
    }

    /// The body of a bulk (or RESP3 verbatim) string whose header is `line`.
    fn read_rest(&mut self, line: &[u8], out: &mut Vec<u8>) {
        if line[0] == b'$' || line[0] == b'=' {
            let n: i64 = std::str::from_utf8(&line[1..line.len() - 2])
                .unwrap()
                .parse()
                .unwrap();
            if n >= 0 {
                let mut body = vec![0; n as usize + 2];
                self.reader.read_exact(&mut body).unwrap();
                out.extend_from_slice(&body);
            }
        }
    }
}

/// How many values follow an aggregate's header line (arrays, RESP3 sets and pushes;
/// a RESP3 map's pairs count twice); `None` for any other reply.
fn aggregate_len(line: &[u8]) -> Option<usize> {
    let n = || -> i64 {
        std::str::from_utf8(&line[1..line.len() - 2])
            .unwrap()
            .parse()
            .unwrap()
    };
    match line[0] {
        b'*' | b'~' | b'>' => Some(n().max(0) as usize),
        b'%' => Some(n().max(0) as usize * 2),
        _ => None,
    }
}

/// A script line: an optional normalization word, then the command's words.
pub fn compare(theirs: &mut Raw, ours: &mut Raw, line: &str) -> Option<String> {
    let mut words: Vec<&str> = line.split_whitespace().collect();
    let mode = match words.first() {
        Some(&w @ ("sort" | "pairs" | "len" | "scankeys")) => {
            words.remove(0);
            w
        }
        _ => "exact",
    };
    let args: Vec<Vec<u8>> = words.iter().map(|w| w.as_bytes().to_vec()).collect();
    let (want_whole, mut want) = theirs.call(&args);
    let (got_whole, mut got) = ours.call(&args);
    let show = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let same = match mode {
        "exact" => got_whole == want_whole,
        "len" => got.len() == want.len(),
        "sort" => {
            want.sort();
            got.sort();
            got == want
        }
        "scankeys" => {
            // [cursor, [keys]]: the same cursor and the same keys in any order.
            let keys = |e: &[Vec<u8>]| {
                let text = String::from_utf8_lossy(&e[1]).into_owned();
                let mut keys: Vec<String> = text.split("\r\n").map(String::from).collect();
                keys.sort();
                (e[0].clone(), keys)
            };
            keys(&got) == keys(&want)
        }
        _ => {
            // A SCAN reply is [cursor, [k, v, ...]]: pairs of its second element.
            let pairs = |elements: &[Vec<u8>]| {
                let mut r = Raw::parse_flat(elements);
                r.sort();
                r
            };
            pairs(&got) == pairs(&want)
        }
    };
    (!same).then(|| {
        format!(
            "{line}\n  redis-server: {:?}\n  tucana:       {:?}",
            show(&want_whole),
            show(&got_whole)
        )
    })
}

impl Raw {
    /// Elements of a flat reply (or of a SCAN reply's list) grouped in pairs.
    fn parse_flat(elements: &[Vec<u8>]) -> Vec<(String, String)> {
        let text: Vec<String> = elements
            .iter()
            .map(|e| String::from_utf8_lossy(e).into_owned())
            .collect();
        let items: Vec<String> = if text.len() == 2 && text[0].starts_with("$1\r\n0") {
            // SCAN: cursor then an array; split the array's bulk strings.
            text[1]
                .split("\r\n")
                .skip(1)
                .collect::<Vec<_>>()
                .chunks(2)
                .filter(|c| c.len() == 2)
                .map(|c| c[1].to_string())
                .collect()
        } else {
            text
        };
        items
            .chunks(2)
            .map(|c| (c[0].clone(), c.get(1).cloned().unwrap_or_default()))
            .collect()
    }
}

/// A fresh redis-server on a free port, and that port (`None`, after a message: it is
/// not installed). Killed when the handle is dropped.
pub fn start_redis_server() -> Option<(RedisServer, u16)> {
    if Command::new("redis-server")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: redis-server is not installed (scripts/server-deps.sh --bench)");
        return None;
    }
    let port = free_port();
    let redis = RedisServer(
        Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
                // DEBUG is off by default since Redis 7 (tests compare some of it).
                "--enable-debug-command",
                "yes",
            ])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    Some((redis, port))
}

/// An in-process tucana over an in-memory database, configured as the differential
/// tests compare it (DEBUG served).
pub fn start_tucana_for_comparison() -> tucana_server::RunningServer {
    let db = Database::builder().open_in_memory().unwrap();
    spawn(
        db,
        ServerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            enable_debug_command: true,
            ..ServerConfig::default()
        },
    )
    .unwrap()
}

/// Runs `script` against a fresh redis-server and a fresh in-memory tucana; the lines
/// whose replies differ, with both replies (`None`: redis-server is not installed).
pub fn run_script(script: &str) -> Option<Vec<String>> {
    let (mut redis, port) = start_redis_server()?;
    let server = start_tucana_for_comparison();
    let mut theirs = Raw::connect(&format!("127.0.0.1:{port}"));
    // A redis-server that could not bind its port has exited, and whatever answered there
    // is not it.
    assert!(
        redis.0.try_wait().unwrap().is_none(),
        "redis-server exited (port {port} taken?)"
    );
    let mut ours = Raw::connect(&server.addr.to_string());
    let differences = script
        .lines()
        .filter(|line| !line.trim().is_empty())
        .filter_map(|line| compare(&mut theirs, &mut ours, line))
        .collect();
    server.stop().unwrap();
    Some(differences)
}

/// Asserts that no reply of `script` differs (skips where redis-server is missing).
pub fn assert_same_replies(script: &str) {
    let Some(differences) = run_script(script) else {
        return;
    };
    assert!(
        differences.is_empty(),
        "{} replies differ:\n{}",
        differences.len(),
        differences.join("\n")
    );
}
