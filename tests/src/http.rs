//! The HTTP/1.1 plumbing of the test servers (src/bin): heads parsed by httparse on
//! a connection that keeps its own read buffer, so that a server sees every byte
//! (the S3 relay forwards them unchanged) and decides itself when to drop the
//! connection, mid-request included.

use std::{
    io::{self, Read, Write},
    net::{Shutdown, TcpStream},
    time::Duration,
};

use httparse::{Status, EMPTY_HEADER};

const MAX_HEAD: usize = 64 * 1024;
const MAX_HEADERS: usize = 128;
const IDLE: Duration = Duration::from_secs(120);

/// A request or response head.
pub struct Head {
    /// As received.
    pub raw: Vec<u8>,
    /// Requests only.
    pub method: String,
    /// Requests only: path and query.
    pub target: String,
    /// Responses only.
    pub status: u16,
    pub reason: String,
    /// `x` of HTTP/1.x.
    pub minor: u8,
    /// Names as sent, values trimmed, in order.
    pub headers: Vec<(String, String)>,
}

impl Head {
    fn new(raw: Vec<u8>, minor: Option<u8>, headers: &[httparse::Header]) -> Head {
        Head {
            raw,
            method: String::new(),
            target: String::new(),
            status: 0,
            reason: String::new(),
            minor: minor.unwrap_or(1),
            headers: headers
                .iter()
                .map(|h| {
                    let v = String::from_utf8_lossy(h.value);
                    (h.name.to_string(), v.trim().to_string())
                })
                .collect(),
        }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Whether a comma-separated header lists `token`.
    pub fn has_token(&self, name: &str, token: &str) -> bool {
        self.headers.iter().any(|(k, v)| {
            k.eq_ignore_ascii_case(name)
                && v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token))
        })
    }

    /// Whether the connection ends after this exchange.
    pub fn closes(&self) -> bool {
        self.minor == 0 || self.has_token("connection", "close")
    }

    pub fn path(&self) -> &str {
        self.target.split_once('?').map_or(&self.target, |(p, _)| p)
    }

    pub fn query(&self) -> &str {
        self.target.split_once('?').map_or("", |(_, q)| q)
    }

    pub fn content_length(&self) -> io::Result<Option<usize>> {
        self.header("content-length")
            .map(|v| v.parse().map_err(|_| invalid("content-length")))
            .transpose()
    }
}

fn invalid(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// A connection with its own read buffer.
pub struct Conn {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    pub fn new(s: TcpStream) -> Conn {
        let _ = s.set_read_timeout(Some(IDLE));
        let _ = s.set_write_timeout(Some(IDLE));
        let _ = s.set_nodelay(true);
        Conn { s, buf: Vec::new() }
    }

    fn fill(&mut self) -> io::Result<usize> {
        let mut tmp = [0u8; 64 * 1024];
        let n = self.s.read(&mut tmp)?;
        self.buf.extend_from_slice(&tmp[..n]);
        Ok(n)
    }

    /// Reads until `parse` completes on the buffer; None on EOF before any byte.
    fn parse<T, E: std::fmt::Display>(
        &mut self,
        parse: impl Fn(&[u8]) -> Result<Status<T>, E>,
    ) -> io::Result<Option<T>> {
        loop {
            match parse(&self.buf).map_err(invalid)? {
                Status::Complete(t) => return Ok(Some(t)),
                Status::Partial if self.buf.len() > MAX_HEAD => {
                    return Err(invalid("head too long"))
                }
                Status::Partial => {}
            }
            if self.fill()? == 0 {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(io::ErrorKind::UnexpectedEof.into())
                };
            }
        }
    }

    fn take(&mut self, n: usize) -> Vec<u8> {
        self.buf.drain(..n).collect()
    }

    /// The next request head; None when the client closed between requests.
    pub fn read_request(&mut self) -> io::Result<Option<Head>> {
        let Some((n, mut h)) = self.parse(|b| -> httparse::Result<_> {
            let mut hs = [EMPTY_HEADER; MAX_HEADERS];
            let mut r = httparse::Request::new(&mut hs);
            Ok(match r.parse(b)? {
                Status::Complete(n) => {
                    let mut h = Head::new(Vec::new(), r.version, r.headers);
                    h.method = r.method.unwrap_or_default().to_string();
                    h.target = r.path.unwrap_or_default().to_string();
                    Status::Complete((n, h))
                }
                Status::Partial => Status::Partial,
            })
        })?
        else {
            return Ok(None);
        };
        h.raw = self.take(n);
        Ok(Some(h))
    }

    pub fn read_response(&mut self) -> io::Result<Head> {
        let (n, mut h) = self
            .parse(|b| -> httparse::Result<_> {
                let mut hs = [EMPTY_HEADER; MAX_HEADERS];
                let mut r = httparse::Response::new(&mut hs);
                Ok(match r.parse(b)? {
                    Status::Complete(n) => {
                        let mut h = Head::new(Vec::new(), r.version, r.headers);
                        h.status = r.code.unwrap_or_default();
                        h.reason = r.reason.unwrap_or_default().to_string();
                        Status::Complete((n, h))
                    }
                    Status::Partial => Status::Partial,
                })
            })?
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        h.raw = self.take(n);
        Ok(h)
    }

    pub fn read_n(&mut self, n: usize) -> io::Result<Vec<u8>> {
        while self.buf.len() < n {
            if self.fill()? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
        Ok(self.take(n))
    }

    /// The body after `h`: (the bytes as received, chunk framing included; the
    /// payload).
    pub fn read_body(&mut self, h: &Head) -> io::Result<(Vec<u8>, Vec<u8>)> {
        if !h.has_token("transfer-encoding", "chunked") {
            let b = self.read_n(h.content_length()?.unwrap_or(0))?;
            return Ok((b.clone(), b));
        }
        let (mut raw, mut data) = (Vec::new(), Vec::new());
        loop {
            let eof = || io::Error::from(io::ErrorKind::UnexpectedEof);
            let (n, size) = self.parse(httparse::parse_chunk_size)?.ok_or_else(eof)?;
            raw.extend(self.take(n));
            if size == 0 {
                let n = self
                    .parse(|b| -> httparse::Result<_> {
                        let mut hs = [EMPTY_HEADER; MAX_HEADERS];
                        Ok(match httparse::parse_headers(b, &mut hs)? {
                            Status::Complete((n, _)) => Status::Complete(n),
                            Status::Partial => Status::Partial,
                        })
                    })?
                    .ok_or_else(eof)?;
                raw.extend(self.take(n));
                return Ok((raw, data));
            }
            let size = usize::try_from(size).map_err(invalid)?;
            let chunk = self.read_n(size + 2)?;
            if !chunk.ends_with(b"\r\n") {
                return Err(invalid("chunk not followed by CRLF"));
            }
            data.extend_from_slice(&chunk[..size]);
            raw.extend(chunk);
        }
    }

    pub fn read_to_close(&mut self) -> io::Result<Vec<u8>> {
        while self.fill()? > 0 {}
        Ok(std::mem::take(&mut self.buf))
    }

    pub fn write(&mut self, b: &[u8]) -> io::Result<()> {
        self.s.write_all(b)?;
        self.s.flush()
    }

    pub fn close(&self) {
        let _ = self.s.shutdown(Shutdown::Both);
    }
}

pub fn reason(code: u16) -> &'static str {
    match code {
        100 => "Continue",
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Content Too Large",
        415 => "Unsupported Media Type",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}

/// A whole response: `headers`, then content-length and, when `close`,
/// `connection: close`.
pub fn response(code: u16, headers: &[(&str, &str)], body: &[u8], close: bool) -> Vec<u8> {
    let mut r = format!("HTTP/1.1 {code} {}\r\n", reason(code));
    for (k, v) in headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    r.push_str(&format!("content-length: {}\r\n", body.len()));
    if close {
        r.push_str("connection: close\r\n");
    }
    r.push_str("\r\n");
    let mut r = r.into_bytes();
    r.extend_from_slice(body);
    r
}
