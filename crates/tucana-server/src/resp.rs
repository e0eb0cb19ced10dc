//! The RESP wire format: decoding requests (RESP multibulk and inline commands) under
//! size limits, and encoding replies in RESP2 or RESP3.
//!
//! Owns only bytes: it knows nothing of commands, sessions or the engine. The decoder is
//! a pure function over a buffer, so a connection can call it again after every read and
//! the fuzz target can call it on anything; it never panics and never allocates more
//! than the limits allow for one request (a bulk length is checked before any buffer is
//! sized by it). Stateless; safe to use from any thread.
//!
//! Two decoding entry points: [`decode_into`] is what connections use: it records where
//! each argument lies in the read buffer ([`RequestSpans`]; the commands read them
//! through [`Requests`], the positions paired with that buffer), so a pipelined batch is
//! decoded without an allocation per request or argument (the vectors are reused across
//! batches). [`decode`] returns owned arguments (tests, the fuzz target) and is a thin
//! wrapper over it, so both see the same grammar and limits. Reply encoding likewise
//! writes into the connection's one output buffer, with no allocation per reply.

use std::fmt;

/// How large a request may be; checked while decoding, before anything is allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestLimits {
    /// Arguments in one request, the command name included.
    pub max_args: usize,
    /// Bytes of one argument.
    pub max_bulk_bytes: usize,
    /// Bytes of one request on the wire (headers and arguments).
    pub max_request_bytes: usize,
    /// Bytes of an inline command line (`PING\r\n`, as telnet sends).
    pub max_inline_bytes: usize,
}

impl RequestLimits {
    /// Generous limits for authenticated clients: a 64 MiB value (the engine's largest)
    /// plus its key fits.
    pub const DEFAULT: RequestLimits = RequestLimits {
        max_args: 1 << 20,
        max_bulk_bytes: (64 << 20) + (64 << 10),
        max_request_bytes: 256 << 20,
        max_inline_bytes: 64 << 10,
    };

    /// Strict limits before authentication (as Redis: a few short arguments), so that a
    /// client without the password cannot make the server buffer much.
    pub const PRE_AUTH: RequestLimits = RequestLimits {
        max_args: 10,
        max_bulk_bytes: 16 << 10,
        max_request_bytes: 64 << 10,
        max_inline_bytes: 16 << 10,
    };
}

/// A request that cannot be decoded; the connection answers with the error and closes,
/// since the position of the next request in the stream is unknown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProtocolError(pub String);

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Protocol error: {}", self.0)
    }
}

impl std::error::Error for ProtocolError {}

fn protocol_error(what: impl Into<String>) -> ProtocolError {
    ProtocolError(what.into())
}

/// A decoded request: the command name and its arguments. Empty when the client sent an
/// empty line or `*0`, which Redis ignores and so do we.
pub type Args = Vec<Vec<u8>>;

/// Owned copies of one request's arguments at a time (handlers take `&[Vec<u8>]`),
/// whose buffers the next request of the batch reuses: a pipeline of 16 HSETs of ten
/// fields copies its arguments into 22 buffers once, not 16 × 22 fresh allocations.
#[derive(Default)]
pub struct ArgsBuf {
    bufs: Args,
}

impl ArgsBuf {
    /// `from`, copied into the kept buffers.
    pub fn fill(&mut self, from: &[&[u8]]) -> &[Vec<u8>] {
        if self.bufs.len() < from.len() {
            self.bufs.resize_with(from.len(), Vec::new);
        }
        for (buf, arg) in self.bufs.iter_mut().zip(from) {
            if buf.capacity() < arg.len() {
                // A fresh copy: cheaper than growing the old buffer through `reserve`.
                *buf = arg.to_vec();
            } else {
                buf.clear();
                buf.extend_from_slice(arg);
            }
        }
        &self.bufs[..from.len()]
    }
}

/// Where one decoded argument lies: in the buffer that was decoded (the bytes as they
/// arrived), or in the [`RequestSpans`]' scratch bytes (an inline argument with quotes or
/// escapes, which is not verbatim on the wire).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    start: usize,
    end: usize,
    in_scratch: bool,
}

/// Where the requests of a pipelined batch lie in the connection's read buffer.
///
/// Filled by [`decode_into`]; read through [`RequestSpans::in_buffer`], which pairs the
/// positions with the buffer they point into. Keeping positions rather than copies is
/// what lets a batch be decoded without allocating; `clear` keeps the capacity for the
/// next batch.
#[derive(Debug, Default)]
pub struct RequestSpans {
    /// Per argument of every request, where it lies.
    args: Vec<Span>,
    /// Per request, `args[first..end]` are its arguments (none: an empty request).
    bounds: Vec<(usize, usize)>,
    scratch: Vec<u8>,
}

impl RequestSpans {
    pub fn clear(&mut self) {
        self.args.clear();
        self.bounds.clear();
        self.scratch.clear();
    }

    /// Requests decoded, empty ones included.
    pub fn len(&self) -> usize {
        self.bounds.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bounds.is_empty()
    }

    /// The requests, read from `wire`, the buffer they were decoded from.
    #[inline]
    pub fn in_buffer<'a>(&'a self, wire: &'a [u8]) -> Requests<'a> {
        Requests { spans: self, wire }
    }

    /// Forgets what a decode that did not finish a request pushed.
    fn truncate(&mut self, args: usize, scratch: usize) {
        self.args.truncate(args);
        self.scratch.truncate(scratch);
    }
}

/// The decoded requests of a pipelined batch together with the buffer they lie in: what
/// the commands read their arguments from. Cheap to copy (two references).
#[derive(Clone, Copy, Debug)]
pub struct Requests<'a> {
    spans: &'a RequestSpans,
    wire: &'a [u8],
}

impl<'a> Requests<'a> {
    /// Requests decoded, empty ones included.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// How many arguments request `i` has, the command name included.
    #[inline]
    pub fn arg_count(&self, i: usize) -> usize {
        let (first, end) = self.spans.bounds[i];
        end - first
    }

    /// Argument `n` of request `i`.
    #[inline]
    pub fn arg(&self, i: usize, n: usize) -> &'a [u8] {
        let (first, end) = self.spans.bounds[i];
        assert!(
            first + n < end,
            "argument {n} of a request with {}",
            end - first
        );
        self.resolve(self.spans.args[first + n])
    }

    /// Replaces the contents of `into` with the arguments of request `i`.
    #[inline]
    pub fn args_into(&self, i: usize, into: &mut Vec<&'a [u8]>) {
        into.clear();
        let (first, end) = self.spans.bounds[i];
        into.extend(self.spans.args[first..end].iter().map(|&s| self.resolve(s)));
    }

    #[inline]
    fn resolve(&self, span: Span) -> &'a [u8] {
        let from = if span.in_scratch {
            &self.spans.scratch
        } else {
            self.wire
        };
        &from[span.start..span.end]
    }
}

/// Decodes one request from the front of `buf`.
///
/// `Ok(Some((args, consumed)))` when a whole request is there, `Ok(None)` when more bytes
/// are needed (the caller checks `max_request_bytes` against its buffer then, see
/// [`check_incomplete`]), `Err` when the bytes can never become a valid request.
pub fn decode(buf: &[u8], limits: &RequestLimits) -> Result<Option<(Args, usize)>, ProtocolError> {
    let mut spans = RequestSpans::default();
    let Some(consumed) = decode_into(buf, 0, limits, &mut spans)? else {
        return Ok(None);
    };
    let mut args = Vec::new();
    spans.in_buffer(buf).args_into(0, &mut args);
    Ok(Some((args.iter().map(|a| a.to_vec()).collect(), consumed)))
}

/// Decodes one request from `buf[at..]` and appends it to `spans` (positions are
/// indices into `buf`). Returns the bytes consumed as [`decode`] does; on `Ok(None)` and
/// `Err` nothing is appended.
pub fn decode_into(
    buf: &[u8],
    at: usize,
    limits: &RequestLimits,
    spans: &mut RequestSpans,
) -> Result<Option<usize>, ProtocolError> {
    let (args, scratch) = (spans.args.len(), spans.scratch.len());
    let rest = &buf[at..];
    let decoded = match rest.first() {
        None => Ok(None),
        Some(b'*') => decode_multibulk(rest, at, limits, spans),
        Some(_) => decode_inline(rest, limits, spans),
    };
    match decoded {
        Ok(Some(consumed)) => {
            spans.bounds.push((args, spans.args.len()));
            Ok(Some(consumed))
        }
        other => {
            spans.truncate(args, scratch);
            other
        }
    }
}

/// Rejects an incomplete request that already exceeds what any complete one may be.
pub fn check_incomplete(
    buffered_bytes: usize,
    limits: &RequestLimits,
) -> Result<(), ProtocolError> {
    if buffered_bytes > limits.max_request_bytes {
        return Err(protocol_error(format!(
            "request larger than {} bytes",
            limits.max_request_bytes
        )));
    }
    Ok(())
}

/// Finds the `\r\n` ending the line that starts at `from`; the index of the `\r`.
fn line_end(buf: &[u8], from: usize) -> Option<usize> {
    let rest = buf.get(from..)?;
    rest.windows(2).position(|w| w == b"\r\n").map(|i| from + i)
}

/// Parses a decimal length as Redis does: optional '-', digits only, no overflow.
fn parse_len(digits: &[u8]) -> Option<i64> {
    let (negative, digits) = match digits.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, digits),
    };
    if digits.is_empty() || digits.len() > 18 {
        return None;
    }
    let mut n: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        n = n * 10 + i64::from(d - b'0');
    }
    Some(if negative { -n } else { n })
}

/// `buf` starts at the request; `at` is where it lies in the connection's buffer.
fn decode_multibulk(
    buf: &[u8],
    at: usize,
    limits: &RequestLimits,
    spans: &mut RequestSpans,
) -> Result<Option<usize>, ProtocolError> {
    // A header line longer than any valid one is garbage, not a slow client.
    const MAX_HEADER_BYTES: usize = 32;
    let Some(end) = line_end(buf, 1) else {
        if buf.len() > MAX_HEADER_BYTES {
            return Err(protocol_error("invalid multibulk length"));
        }
        return Ok(None);
    };
    let count =
        parse_len(&buf[1..end]).ok_or_else(|| protocol_error("invalid multibulk length"))?;
    let mut pos = end + 2;
    if count <= 0 {
        return Ok(Some(pos));
    }
    let count = usize::try_from(count).map_err(|_| protocol_error("invalid multibulk length"))?;
    if count > limits.max_args {
        // Redis's words first (clients and its tests match them), then ours.
        return Err(protocol_error(format!(
            "invalid multibulk length: too many arguments ({count} > {})",
            limits.max_args
        )));
    }
    // Reserve for what is already buffered at most: `count` is the client's word.
    spans.args.reserve(count.min(buf.len() / 4 + 1));
    for _ in 0..count {
        match buf.get(pos) {
            None => return Ok(None),
            Some(b'$') => {}
            Some(&other) => {
                return Err(protocol_error(format!(
                    "expected '$', got '{}'",
                    char::from(other).escape_default()
                )))
            }
        }
        let Some(end) = line_end(buf, pos + 1) else {
            if buf.len() - pos > MAX_HEADER_BYTES {
                return Err(protocol_error("invalid bulk length"));
            }
            return Ok(None);
        };
        let len = parse_len(&buf[pos + 1..end])
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| protocol_error("invalid bulk length"))?;
        if len > limits.max_bulk_bytes {
            return Err(protocol_error(format!(
                "invalid bulk length: argument of {len} bytes is larger than the limit of {} bytes",
                limits.max_bulk_bytes
            )));
        }
        let start = end + 2;
        let stop = start + len;
        if stop.saturating_add(2) > limits.max_request_bytes {
            return Err(protocol_error(format!(
                "request larger than {} bytes",
                limits.max_request_bytes
            )));
        }
        if buf.len() < stop + 2 {
            return Ok(None);
        }
        if &buf[stop..stop + 2] != b"\r\n" {
            return Err(protocol_error("bulk argument not followed by CRLF"));
        }
        spans.args.push(Span {
            start: at + start,
            end: at + stop,
            in_scratch: false,
        });
        pos = stop + 2;
    }
    Ok(Some(pos))
}

/// Inline commands are rare (telnet, scripts): their arguments are copied to the scratch
/// bytes, since unquoting changes them.
fn decode_inline(
    buf: &[u8],
    limits: &RequestLimits,
    spans: &mut RequestSpans,
) -> Result<Option<usize>, ProtocolError> {
    // Inline commands end at '\n' (a '\r' before it is optional, as in Redis).
    let Some(nl) = buf.iter().position(|&b| b == b'\n') else {
        if buf.len() > limits.max_inline_bytes {
            return Err(protocol_error("too big inline request"));
        }
        return Ok(None);
    };
    if nl > limits.max_inline_bytes {
        return Err(protocol_error("too big inline request"));
    }
    let line = buf[..nl].strip_suffix(b"\r").unwrap_or(&buf[..nl]);
    let args = split_inline(line)?;
    if let Some(long) = args.iter().find(|a| a.len() > limits.max_bulk_bytes) {
        return Err(protocol_error(format!(
            "argument of {} bytes is larger than the limit of {} bytes",
            long.len(),
            limits.max_bulk_bytes
        )));
    }
    if args.len() > limits.max_args {
        return Err(protocol_error(format!(
            "too many arguments ({} > {})",
            args.len(),
            limits.max_args
        )));
    }
    for arg in &args {
        let start = spans.scratch.len();
        spans.scratch.extend_from_slice(arg);
        spans.args.push(Span {
            start,
            end: spans.scratch.len(),
            in_scratch: true,
        });
    }
    Ok(Some(nl + 1))
}

fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Splits an inline command line into arguments like Redis's `sdssplitargs`: spaces
/// separate, `"..."` understands `\n \r \t \b \a \\ \" \xNN`, `'...'` only `\'`.
fn split_inline(line: &[u8]) -> Result<Args, ProtocolError> {
    let unbalanced = || protocol_error("unbalanced quotes in request");
    let mut args = Vec::new();
    let mut i = 0;
    loop {
        while i < line.len() && line[i].is_ascii_whitespace() {
            i += 1;
        }
        if i == line.len() {
            return Ok(args);
        }
        let mut arg = Vec::new();
        match line[i] {
            b'"' => {
                i += 1;
                loop {
                    match *line.get(i).ok_or_else(unbalanced)? {
                        b'"' => {
                            i += 1;
                            break;
                        }
                        b'\\'
                            if i + 3 < line.len()
                                && line[i + 1] == b'x'
                                && hex_digit(line[i + 2]).is_some()
                                && hex_digit(line[i + 3]).is_some() =>
                        {
                            let hi = hex_digit(line[i + 2]).unwrap_or(0);
                            let lo = hex_digit(line[i + 3]).unwrap_or(0);
                            arg.push(hi << 4 | lo);
                            i += 4;
                        }
                        b'\\' if i + 1 < line.len() => {
                            arg.push(match line[i + 1] {
                                b'n' => b'\n',
                                b'r' => b'\r',
                                b't' => b'\t',
                                b'b' => 8,
                                b'a' => 7,
                                other => other,
                            });
                            i += 2;
                        }
                        b => {
                            arg.push(b);
                            i += 1;
                        }
                    }
                }
                // A closing quote must be followed by a space or the end.
                if i < line.len() && !line[i].is_ascii_whitespace() {
                    return Err(unbalanced());
                }
            }
            b'\'' => {
                i += 1;
                loop {
                    match *line.get(i).ok_or_else(unbalanced)? {
                        b'\'' => {
                            i += 1;
                            break;
                        }
                        b'\\' if line.get(i + 1) == Some(&b'\'') => {
                            arg.push(b'\'');
                            i += 2;
                        }
                        b => {
                            arg.push(b);
                            i += 1;
                        }
                    }
                }
                if i < line.len() && !line[i].is_ascii_whitespace() {
                    return Err(unbalanced());
                }
            }
            _ => {
                while i < line.len() && !line[i].is_ascii_whitespace() {
                    arg.push(line[i]);
                    i += 1;
                }
            }
        }
        args.push(arg);
    }
}

/// Which RESP version a connection speaks (RESP3 after `HELLO 3`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Protocol {
    #[default]
    Resp2,
    Resp3,
}

/// A reply, encoded for the connection's protocol by [`Reply::encode`].
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    /// `+OK`.
    Ok,
    /// A simple string (no CR or LF in it).
    Status(String),
    /// An error line: the text starts with its code (`ERR ...`, `NOAUTH ...`).
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    /// The null bulk string (RESP2 `$-1`, RESP3 `_`).
    Nil,
    /// The null array (RESP2 `*-1`, RESP3 `_`), e.g. an aborted `EXEC`.
    NilArray,
    Array(Vec<Reply>),
    /// A map in RESP3; a flat array of keys and values in RESP2.
    Map(Vec<(Reply, Reply)>),
    /// A set in RESP3; an array in RESP2.
    Set(Vec<Reply>),
    /// A boolean in RESP3; 1 or 0 in RESP2.
    Bool(bool),
    /// A floating point number, already formatted (`1.5`, `inf`): a RESP3 double; a
    /// bulk string in RESP2.
    Double(String),
    /// Pairs that RESP3 answers as an array of two-element arrays and RESP2 as one flat
    /// array (a sorted set's members with their scores, as Redis 7 answers them).
    Pairs(Vec<(Reply, Reply)>),
    /// A number of any size, in decimal: a RESP3 big number; a bulk string in RESP2.
    BigNumber(String),
    /// Text with its 3-letter format (`txt`, `mkd`): a RESP3 verbatim string; a bulk
    /// string of the text in RESP2.
    Verbatim([u8; 3], Vec<u8>),
    /// A reply preceded by RESP3 attributes (out-of-band key-value pairs a client may
    /// ignore); RESP2 has no attributes, so only the reply is sent.
    WithAttributes(Vec<(Reply, Reply)>, Box<Reply>),
    /// An out-of-band message (Pub/Sub's): a RESP3 push frame; an array in RESP2.
    Push(Vec<Reply>),
    /// Several replies sent one after another for one request (`SUBSCRIBE a b` answers
    /// one frame per channel).
    Frames(Vec<Reply>),
    /// Bytes already encoded for the connection's protocol (Pub/Sub messages queued
    /// before a reply).
    Encoded(Vec<u8>),
}

impl Reply {
    pub fn error(text: impl Into<String>) -> Reply {
        let text = text.into();
        debug_assert!(!text.contains(['\r', '\n']), "error text is one line");
        Reply::Error(text)
    }

    pub fn bulk(bytes: impl Into<Vec<u8>>) -> Reply {
        Reply::Bulk(bytes.into())
    }

    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }

    /// Appends the encoding of the reply to `out`.
    pub fn encode(&self, protocol: Protocol, out: &mut Vec<u8>) {
        let resp3 = protocol == Protocol::Resp3;
        match self {
            Reply::Ok => out.extend_from_slice(b"+OK\r\n"),
            Reply::Status(s) => line(out, b'+', s.as_bytes()),
            Reply::Error(s) => encode_error(s, out),
            Reply::Int(n) => header(out, b':', *n as i128),
            Reply::Bulk(b) => encode_bulk(b, out),
            Reply::Nil => encode_nil(protocol, out),
            Reply::NilArray if resp3 => out.extend_from_slice(b"_\r\n"),
            Reply::NilArray => out.extend_from_slice(b"*-1\r\n"),
            Reply::Array(items) => {
                header(out, b'*', items.len() as i128);
                for item in items {
                    item.encode(protocol, out);
                }
            }
            Reply::Set(items) => {
                header(out, if resp3 { b'~' } else { b'*' }, items.len() as i128);
                for item in items {
                    item.encode(protocol, out);
                }
            }
            Reply::Map(pairs) => {
                if resp3 {
                    header(out, b'%', pairs.len() as i128);
                } else {
                    header(out, b'*', pairs.len() as i128 * 2);
                }
                for (k, v) in pairs {
                    k.encode(protocol, out);
                    v.encode(protocol, out);
                }
            }
            Reply::Bool(b) if resp3 => {
                out.extend_from_slice(if *b { b"#t\r\n" } else { b"#f\r\n" })
            }
            Reply::Bool(b) => out.extend_from_slice(if *b { b":1\r\n" } else { b":0\r\n" }),
            Reply::Double(text) if resp3 => line(out, b',', text.as_bytes()),
            Reply::Double(text) => encode_bulk(text.as_bytes(), out),
            Reply::Pairs(pairs) => {
                if resp3 {
                    header(out, b'*', pairs.len() as i128);
                } else {
                    header(out, b'*', pairs.len() as i128 * 2);
                }
                for (a, b) in pairs {
                    if resp3 {
                        out.extend_from_slice(b"*2\r\n");
                    }
                    a.encode(protocol, out);
                    b.encode(protocol, out);
                }
            }
            Reply::BigNumber(digits) if resp3 => line(out, b'(', digits.as_bytes()),
            Reply::BigNumber(digits) => encode_bulk(digits.as_bytes(), out),
            Reply::Verbatim(format, text) if resp3 => {
                header(out, b'=', text.len() as i128 + 4);
                out.extend_from_slice(format);
                out.push(b':');
                out.extend_from_slice(text);
                out.extend_from_slice(b"\r\n");
            }
            Reply::Verbatim(_, text) => encode_bulk(text, out),
            Reply::WithAttributes(attributes, reply) => {
                if resp3 {
                    header(out, b'|', attributes.len() as i128);
                    for (k, v) in attributes {
                        k.encode(protocol, out);
                        v.encode(protocol, out);
                    }
                }
                reply.encode(protocol, out);
            }
            Reply::Push(items) => {
                header(out, if resp3 { b'>' } else { b'*' }, items.len() as i128);
                for item in items {
                    item.encode(protocol, out);
                }
            }
            Reply::Frames(replies) => {
                for reply in replies {
                    reply.encode(protocol, out);
                }
            }
            Reply::Encoded(bytes) => out.extend_from_slice(bytes),
        }
    }
}

/// Appends a bulk string: the fast path of a `GET` encodes the value where it lies.
pub fn encode_bulk(bytes: &[u8], out: &mut Vec<u8>) {
    header(out, b'$', bytes.len() as i128);
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

/// Appends the null bulk string of `protocol`.
pub fn encode_nil(protocol: Protocol, out: &mut Vec<u8>) {
    out.extend_from_slice(match protocol {
        Protocol::Resp3 => b"_\r\n",
        Protocol::Resp2 => b"$-1\r\n",
    });
}

/// Appends an error line; `text` starts with its code (`ERR ...`).
pub fn encode_error(text: &str, out: &mut Vec<u8>) {
    out.push(b'-');
    // Keep the stream in sync even if a message carries a line break.
    out.extend(
        text.bytes()
            .map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
    );
    out.extend_from_slice(b"\r\n");
}

/// Appends `kind`, `n` in decimal and CRLF, without formatting machinery or allocation
/// (every bulk and integer reply has such a line). i128 holds every i64 and usize.
fn header(out: &mut Vec<u8>, kind: u8, n: i128) {
    let mut digits = [0u8; 40];
    let mut at = digits.len();
    let mut rest = n.unsigned_abs();
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    out.push(kind);
    if n < 0 {
        out.push(b'-');
    }
    out.extend_from_slice(&digits[at..]);
    out.extend_from_slice(b"\r\n");
}

fn line(out: &mut Vec<u8>, kind: u8, body: &[u8]) {
    out.push(kind);
    out.extend_from_slice(body);
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: RequestLimits = RequestLimits::DEFAULT;

    fn args(list: &[&str]) -> Args {
        list.iter().map(|s| s.as_bytes().to_vec()).collect()
    }

    fn encoded(reply: &Reply, protocol: Protocol) -> String {
        let mut out = Vec::new();
        reply.encode(protocol, &mut out);
        String::from_utf8(out).unwrap()
    }

    /// A batch's requests share one `ArgsBuf`: each gets exactly its own arguments, a
    /// shorter request after a longer one included, and a request no longer than an
    /// earlier one copies into the buffers that one left (no new allocation).
    #[test]
    fn argument_buffers_are_reused_request_after_request() {
        let mut buf = ArgsBuf::default();
        let long: [&[u8]; 4] = [b"HSET", b"h", b"field", b"a longer value"];
        assert_eq!(buf.fill(&long), long.map(<[u8]>::to_vec));
        let first_value = buf.bufs[3].as_ptr();
        let short: [&[u8]; 2] = [b"LPOP", b"l"];
        assert_eq!(buf.fill(&short), short.map(<[u8]>::to_vec));
        let again: [&[u8]; 4] = [b"HSET", b"k", b"f", b"short"];
        assert_eq!(buf.fill(&again), again.map(<[u8]>::to_vec));
        assert_eq!(
            buf.bufs[3].as_ptr(),
            first_value,
            "the value's buffer is reused"
        );
        assert_eq!(buf.fill(&[]), Vec::<Vec<u8>>::new());
    }

    #[test]
    fn resp3_only_types_fall_back_to_bulk_strings_in_resp2() {
        let big = Reply::BigNumber("1234567999999999999999999999999999999".into());
        assert_eq!(
            encoded(&big, Protocol::Resp3),
            "(1234567999999999999999999999999999999\r\n"
        );
        assert_eq!(
            encoded(&big, Protocol::Resp2),
            "$37\r\n1234567999999999999999999999999999999\r\n"
        );
        let text = Reply::Verbatim(*b"txt", b"a\nb".to_vec());
        assert_eq!(encoded(&text, Protocol::Resp3), "=7\r\ntxt:a\nb\r\n");
        assert_eq!(encoded(&text, Protocol::Resp2), "$3\r\na\nb\r\n");
        let with = Reply::WithAttributes(
            vec![(Reply::bulk("k"), Reply::Int(1))],
            Box::new(Reply::bulk("v")),
        );
        assert_eq!(
            encoded(&with, Protocol::Resp3),
            "|1\r\n$1\r\nk\r\n:1\r\n$1\r\nv\r\n"
        );
        assert_eq!(encoded(&with, Protocol::Resp2), "$1\r\nv\r\n");
    }

    #[test]
    fn decodes_a_multibulk_request_and_reports_what_it_consumed() {
        let wire = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\n*1\r\n$4\r\nPING\r\n";
        let (a, n) = decode(wire, &L).unwrap().unwrap();
        assert_eq!(a, args(&["SET", "k", "hello"]));
        let (b, m) = decode(&wire[n..], &L).unwrap().unwrap();
        assert_eq!(b, args(&["PING"]));
        assert_eq!(n + m, wire.len());
    }

    #[test]
    fn every_prefix_of_a_request_is_incomplete_not_an_error() {
        let wire = b"*2\r\n$3\r\nGET\r\n$10\r\n0123456789\r\n";
        for cut in 0..wire.len() {
            assert_eq!(decode(&wire[..cut], &L), Ok(None), "cut at {cut}");
        }
        assert!(decode(wire, &L).unwrap().is_some());
    }

    #[test]
    fn binary_arguments_keep_every_byte() {
        let wire = b"*2\r\n$3\r\nGET\r\n$4\r\n\r\n\x00\xff\r\n";
        let (a, _) = decode(wire, &L).unwrap().unwrap();
        assert_eq!(a[1], b"\r\n\x00\xff");
    }

    #[test]
    fn malformed_requests_are_errors() {
        for bad in [
            &b"*x\r\n"[..],
            b"*2\r\n:3\r\n",
            b"*1\r\n$-3\r\n",
            b"*1\r\n$3\r\nGETX\r\n",
            b"*1\r\n$abc\r\n",
            b"*99999999999999999999\r\n",
        ] {
            assert!(
                decode(bad, &L).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        // A header that never ends is garbage once it is longer than any valid one.
        assert!(decode(&[b'*'; 100], &L).is_err());
    }

    #[test]
    fn limits_are_checked_from_the_headers_before_the_bytes_arrive() {
        let limits = RequestLimits {
            max_args: 3,
            max_bulk_bytes: 10,
            max_request_bytes: 100,
            max_inline_bytes: 20,
        };
        assert!(decode(b"*4\r\n", &limits).is_err());
        assert!(decode(b"*1\r\n$11\r\n", &limits).is_err());
        assert_eq!(decode(b"*1\r\n$10\r\n", &limits), Ok(None));
        let small = RequestLimits {
            max_request_bytes: 40,
            ..limits
        };
        let three = b"*3\r\n$10\r\n0123456789\r\n$10\r\n0123456789\r\n$10\r\n";
        assert!(decode(three, &limits).unwrap().is_none());
        assert!(
            decode(three, &small).is_err(),
            "the third argument would pass 40 bytes"
        );
        assert!(decode(&[b'a'; 21], &limits).is_err());
        assert!(check_incomplete(101, &limits).is_err());
        assert!(check_incomplete(100, &limits).is_ok());
        // A huge announced length does not allocate: it is refused.
        assert!(decode(b"*1\r\n$999999999999\r\n", &L).is_err());
    }

    #[test]
    fn inline_commands_split_like_redis() {
        let (a, n) = decode(b"SET k \"a b\\x41\\n\" 'it\\'s'\r\nPING\n", &L)
            .unwrap()
            .unwrap();
        assert_eq!(
            a,
            vec![
                b"SET".to_vec(),
                b"k".to_vec(),
                b"a bA\n".to_vec(),
                b"it's".to_vec()
            ]
        );
        assert_eq!(n, 27);
        assert_eq!(decode(b"\r\n", &L), Ok(Some((vec![], 2))));
        assert!(decode(b"GET \"k\n", &L).is_err());
        assert!(decode(b"GET \"k\"x\n", &L).is_err());
        assert_eq!(decode(b"PING", &L), Ok(None));
    }

    #[test]
    fn empty_multibulk_is_an_empty_request() {
        assert_eq!(decode(b"*0\r\n", &L), Ok(Some((vec![], 4))));
        assert_eq!(decode(b"*-1\r\n", &L), Ok(Some((vec![], 5))));
    }

    /// The fuzz target's properties (fuzz/fuzz_targets/resp_decode.rs) on mutations of
    /// valid requests, so `cargo test` covers them without a fuzzer.
    #[test]
    fn decoder_survives_mutated_requests() {
        let seeds: [&[u8]; 4] = [
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\n",
            b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*1\r\n$4\r\nPING\r\n",
            b"SET k \"a\\x41 b\" 'c'\r\nPING\n",
            b"*0\r\n*-1\r\n\r\n",
        ];
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            // xorshift64*: deterministic, no dependency.
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            state.wrapping_mul(0x2545_f491_4f6c_dd1d)
        };
        let limits = RequestLimits {
            max_args: 4,
            max_bulk_bytes: 8,
            max_request_bytes: 64,
            max_inline_bytes: 32,
        };
        for round in 0..20_000 {
            let mut data = seeds[round % seeds.len()].to_vec();
            for _ in 0..1 + next() % 4 {
                let at = (next() as usize) % (data.len() + 1);
                match next() % 3 {
                    0 if at < data.len() => data[at] = next() as u8,
                    1 => data.insert(at, b"*$\r\n-0123456789"[(next() % 15) as usize]),
                    _ if at < data.len() => {
                        data.remove(at);
                    }
                    _ => {}
                }
            }
            for l in [L, limits] {
                let mut rest = data.as_slice();
                while let Ok(Some((args, consumed))) = decode(rest, &l) {
                    assert!(consumed > 0 && consumed <= rest.len());
                    assert!(args.len() <= l.max_args);
                    assert!(args.iter().all(|a| a.len() <= l.max_bulk_bytes));
                    rest = &rest[consumed..];
                }
            }
        }
    }

    #[test]
    fn decode_into_records_a_pipelined_batch_without_copying_it() {
        // Garbage before `at` is not looked at; positions are into the whole buffer.
        let wire = b"junk*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\nGET \"a b\" c\r\n*0\r\n*1\r\n$4\r\nPI";
        let mut spans = RequestSpans::default();
        let mut at = 4;
        while let Some(n) = decode_into(wire, at, &L, &mut spans).unwrap() {
            at += n;
        }
        let requests = spans.in_buffer(wire);
        assert_eq!(
            requests.len(),
            3,
            "the incomplete PING is not a request yet"
        );
        let mut args = Vec::new();
        requests.args_into(0, &mut args);
        assert_eq!(args, [&b"SET"[..], b"k", b"hello"]);
        requests.args_into(1, &mut args);
        assert_eq!(args, [&b"GET"[..], b"a b", b"c"]);
        assert_eq!(requests.arg_count(2), 0);
        assert_eq!(requests.arg(0, 2), b"hello");
        // The multibulk argument is where it arrived, not a copy.
        assert!(std::ptr::eq(requests.arg(0, 1), &wire[21..22]));
        drop(args);
        let mut args = Vec::new();
        // A failed or incomplete decode leaves what was decoded before as it was.
        assert_eq!(
            decode_into(b"*2\r\n$3\r\nGET\r\n", 0, &L, &mut spans),
            Ok(None)
        );
        assert!(decode_into(b"*2\r\n$3\r\nGET\r\n:1\r\n", 0, &L, &mut spans).is_err());
        assert_eq!(spans.len(), 3);
        assert_eq!(spans.args.len(), 6);
        spans.in_buffer(wire).args_into(1, &mut args);
        assert_eq!(args, [&b"GET"[..], b"a b", b"c"]);
        spans.clear();
        assert!(spans.is_empty());
    }

    #[test]
    fn integer_headers_cover_the_whole_range() {
        for n in [0, 7, -1, 10, 1234567890, i64::MAX, i64::MIN] {
            assert_eq!(enc(&Reply::Int(n), Protocol::Resp2), format!(":{n}\r\n"));
        }
        let mut out = Vec::new();
        encode_bulk(&[b'x'; 100], &mut out);
        assert!(out.starts_with(b"$100\r\nxx"));
    }

    fn enc(reply: &Reply, p: Protocol) -> String {
        let mut out = Vec::new();
        reply.encode(p, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn replies_encode_per_protocol() {
        use Protocol::*;
        assert_eq!(enc(&Reply::Nil, Resp2), "$-1\r\n");
        assert_eq!(enc(&Reply::Nil, Resp3), "_\r\n");
        assert_eq!(enc(&Reply::NilArray, Resp2), "*-1\r\n");
        let map = Reply::Map(vec![(Reply::bulk("a"), Reply::Int(1))]);
        assert_eq!(enc(&map, Resp2), "*2\r\n$1\r\na\r\n:1\r\n");
        assert_eq!(enc(&map, Resp3), "%1\r\n$1\r\na\r\n:1\r\n");
        assert_eq!(enc(&Reply::Bool(true), Resp2), ":1\r\n");
        assert_eq!(enc(&Reply::Bool(false), Resp3), "#f\r\n");
        assert_eq!(enc(&Reply::Set(vec![Reply::Ok]), Resp3), "~1\r\n+OK\r\n");
        assert_eq!(
            enc(&Reply::Error("ERR a\r\nb".into()), Resp2),
            "-ERR a  b\r\n"
        );
    }
}
