//! A small HTTP/1.1 server and client over Unix sockets (and TCP, for a
//! daemon that also listens on the network), enough for the Domus REST
//! APIs: one request per connection (`Connection: close`),
//! `Content-Length` bodies only, hard limits on every size, and (in
//! `server`) one deadline per request and a cap on connections, so slow
//! or idle clients cannot hold the server's threads.
//!
//! A handler may take a connection over after its answer (`upgrade`: a
//! live migration's stream rides on the API's connections).
//!
//! Every byte a client sends is untrusted: the parser never panics and
//! answers anything it does not accept with a 4xx.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::Duration;

mod server;
pub mod tls;
pub mod upgrade;
pub use server::{
    accept_loop, serve_connection, spawn_server, spawn_server_with, Conn, Gate, Handler, Listen,
    Policy,
};
pub use upgrade::{Duplex, Upgrade};

/// The longest request line plus headers accepted.
pub const MAX_HEAD: usize = 16 << 10;
/// The largest request or response body accepted.
pub const MAX_BODY: usize = 1 << 20;
/// How long a client may take to send its whole request (the default
/// [`Policy::deadline`]).
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("malformed request: {0}")]
    Malformed(&'static str),
    #[error("request head longer than {MAX_HEAD} bytes")]
    HeadTooLong,
    #[error("body longer than {MAX_BODY} bytes")]
    BodyTooLong,
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("TLS: {0}")]
    Tls(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    /// The path without the query string.
    pub path: String,
    pub query: Option<String>,
    /// Header names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
    /// Takes the connection over once this answer is written
    /// ([`Response::upgraded`]).
    pub upgrade: Option<Upgrade>,
}

impl Response {
    pub fn json(status: u16, body: impl Into<Vec<u8>>) -> Self {
        Self {
            status,
            content_type: "application/json",
            body: body.into(),
            upgrade: None,
        }
    }

    pub fn text(status: u16, body: impl Into<Vec<u8>>) -> Self {
        Self {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.into(),
            upgrade: None,
        }
    }

    /// `{"error": message}` with `status`.
    pub fn error(status: u16, message: &str) -> Self {
        Self::json(status, format!("{{\"error\":{}}}", json_string(message)))
    }

    pub fn no_content() -> Self {
        Self::json(204, Vec::new())
    }
}

/// `s` as a JSON string literal.
pub fn json_string(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\r' => o.push_str("\\r"),
            '\t' => o.push_str("\\t"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Content Too Large",
        415 => "Unsupported Media Type",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        _ => "",
    }
}

/// Reads one line ending in `\n` (at most `budget` bytes in all).
fn read_line(r: &mut impl BufRead, budget: &mut usize) -> Result<String, HttpError> {
    let mut line = Vec::new();
    let n = r
        .by_ref()
        .take(*budget as u64 + 1)
        .read_until(b'\n', &mut line)?;
    if n > *budget {
        return Err(HttpError::HeadTooLong);
    }
    *budget -= n;
    if !line.ends_with(b"\n") {
        return Err(HttpError::Malformed("connection closed inside the head"));
    }
    line.pop();
    if line.ends_with(b"\r") {
        line.pop();
    }
    String::from_utf8(line).map_err(|_| HttpError::Malformed("head is not UTF-8"))
}

/// Reads and parses one request.
pub fn read_request(r: &mut impl BufRead) -> Result<Request, HttpError> {
    let mut req = read_head(r)?;
    read_body(r, &mut req)?;
    Ok(req)
}

/// Reads a request's line and headers (its body is left unread, so a
/// server can refuse the request before it takes the body in).
pub fn read_head(r: &mut impl BufRead) -> Result<Request, HttpError> {
    let mut budget = MAX_HEAD;
    let line = read_line(r, &mut budget)?;
    let mut parts = line.split(' ');
    let (method, target, version) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(m), Some(t), Some(v), None) if !m.is_empty() && !t.is_empty() => (m, t, v),
        _ => {
            return Err(HttpError::Malformed(
                "request line is not METHOD TARGET VERSION",
            ))
        }
    };
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err(HttpError::Malformed("not HTTP/1.0 or HTTP/1.1"));
    }
    if !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(HttpError::Malformed("bad method"));
    }
    if !target.starts_with('/') {
        return Err(HttpError::Malformed("target is not an absolute path"));
    }
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p.to_string(), Some(q.to_string())),
        None => (target.to_string(), None),
    };
    let mut headers = Vec::new();
    loop {
        let h = read_line(r, &mut budget)?;
        if h.is_empty() {
            break;
        }
        let (name, value) = h
            .split_once(':')
            .ok_or(HttpError::Malformed("header without ':'"))?;
        if name.is_empty() || name.contains(' ') {
            return Err(HttpError::Malformed("bad header name"));
        }
        headers.push((name.to_ascii_lowercase(), value.trim().to_string()));
    }
    let req = Request {
        method: method.to_string(),
        path,
        query,
        headers,
        body: Vec::new(),
    };
    if req.header("transfer-encoding").is_some() {
        return Err(HttpError::Malformed("chunked bodies are not supported"));
    }
    Ok(req)
}

/// Reads the body [`read_head`]'s `req` announces.
pub fn read_body(r: &mut impl BufRead, req: &mut Request) -> Result<(), HttpError> {
    if let Some(len) = req.header("content-length") {
        let len: usize = len
            .parse()
            .map_err(|_| HttpError::Malformed("bad Content-Length"))?;
        if len > MAX_BODY {
            return Err(HttpError::BodyTooLong);
        }
        let mut body = vec![0u8; len];
        r.read_exact(&mut body)?;
        req.body = body;
    }
    Ok(())
}

pub fn write_response(w: &mut impl Write, resp: &Response) -> std::io::Result<()> {
    let mut out = format!(
        "HTTP/1.1 {} {}\r\nServer: domus\r\nConnection: close\r\n",
        resp.status,
        reason(resp.status)
    );
    if resp.status != 204 {
        out.push_str(&format!(
            "Content-Type: {}\r\nContent-Length: {}\r\n",
            resp.content_type,
            resp.body.len()
        ));
    }
    out.push_str("\r\n");
    let mut bytes = out.into_bytes();
    if resp.status != 204 {
        bytes.extend_from_slice(&resp.body);
    }
    w.write_all(&bytes)?;
    w.flush()
}

/// Finds `method path` in a route table of (method, template) pairs, where
/// a template segment in braces (`{id}`) matches any one non-empty segment.
/// Returns the route's index and the value of its braced segment, or the
/// answer to give: 404 for an unknown path, 405 for a known path with
/// another method.
pub fn route<'a>(
    routes: &[(&str, &str)],
    method: &str,
    path: &'a str,
) -> Result<(usize, Option<&'a str>), Response> {
    let segs: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    let mut known = false;
    for (i, (m, tpl)) in routes.iter().enumerate() {
        let t: Vec<&str> = tpl.split('/').collect();
        if t.len() != segs.len() {
            continue;
        }
        let mut arg = None;
        let hit = t.iter().zip(&segs).all(|(t, s)| {
            if t.starts_with('{') {
                arg = Some(*s);
                !s.is_empty()
            } else {
                t == s
            }
        });
        if hit {
            known = true;
            if *m == method {
                return Ok((i, arg));
            }
        }
    }
    Err(if known {
        Response::error(405, &format!("{method} is not allowed on {path}"))
    } else {
        Response::error(404, &format!("no such resource: {path}"))
    })
}

/// Binds `path` (replacing a stale socket file, refusing anything else that
/// is in the way) with mode 0600.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "exists and is not a socket",
            ));
        }
        if UnixStream::connect(path).is_ok() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                "another process is serving this socket",
            ));
        }
        std::fs::remove_file(path)?;
    }
    let l = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

/// Whether `req` carries `Authorization: Bearer TOKEN` with this token
/// (compared in constant time).
pub fn bearer_ok(req: &Request, token: &str) -> bool {
    let Some(given) = req
        .header("authorization")
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return false;
    };
    let (a, b) = (given.trim().as_bytes(), token.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Sends one request to the server at `socket` and returns the status and
/// body.
pub fn request(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<(u16, String), HttpError> {
    request_within(socket, method, path, body, Duration::from_secs(30))
}

/// [`request`], giving up when the server has not answered within
/// `timeout`.
pub fn request_within(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&str>,
    timeout: Duration,
) -> Result<(u16, String), HttpError> {
    exchange(connect_unix(socket, timeout)?, method, path, body, None)
}

/// A connection to the server at `socket` whose reads and writes wait
/// `timeout` at most.
fn connect_unix(socket: &Path, timeout: Duration) -> std::io::Result<UnixStream> {
    let s = UnixStream::connect(socket)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    Ok(s)
}

/// [`request_within`] to a daemon listening on TCP at `addr` (host:port),
/// with its bearer token.
pub fn tcp_request(
    addr: &str,
    token: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
    timeout: Duration,
) -> Result<(u16, String), HttpError> {
    exchange(connect_tcp(addr, timeout)?, method, path, body, Some(token))
}

/// A TCP connection to `addr` whose reads and writes wait `timeout` at most.
fn connect_tcp(addr: &str, timeout: Duration) -> std::io::Result<TcpStream> {
    let s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    Ok(s)
}

/// A request's bytes: head and body.
pub fn request_bytes(method: &str, path: &str, body: Option<&str>, token: Option<&str>) -> Vec<u8> {
    let body = body.unwrap_or("");
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    if let Some(t) = token {
        req.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    if !body.is_empty() || method == "PUT" || method == "POST" {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    req.push_str("\r\n");
    req.push_str(body);
    req.into_bytes()
}

/// Writes one request on `s` and reads the answer.
fn exchange<S: Read + Write>(
    mut s: S,
    method: &str,
    path: &str,
    body: Option<&str>,
    token: Option<&str>,
) -> Result<(u16, String), HttpError> {
    let req = request_bytes(method, path, body, token);
    // A server that refuses the request from its head (413: the body is
    // too long) answers and closes before reading it all: the write then
    // fails, and the answer, if it came, says why.
    let written = s.write_all(&req);
    let mut r = BufReader::new(s);
    if let Err(e) = written {
        return read_answer(&mut r).map_err(|_| HttpError::Io(e));
    }
    read_answer(&mut r)
}

/// [`request_within`], the connection handed over when the answer's
/// status is `want` (see [`upgrade`]).
pub fn unix_upgrade(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&str>,
    want: u16,
    timeout: Duration,
) -> Result<crate::upgrade::Answer, HttpError> {
    let s = connect_unix(socket, timeout)?;
    let timer = s.try_clone()?;
    upgrade::upgrade_request(s, timer, &request_bytes(method, path, body, None), want)
}

/// Reads an answer's status and body.
pub(crate) fn read_answer<R: Read>(r: &mut BufReader<R>) -> Result<(u16, String), HttpError> {
    let mut budget = MAX_HEAD;
    let status_line = read_line(r, &mut budget)?;
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or(HttpError::Malformed("bad status line"))?;
    let mut len = None;
    loop {
        let h = read_line(r, &mut budget)?;
        if h.is_empty() {
            break;
        }
        if let Some((n, v)) = h.split_once(':') {
            if n.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse::<usize>().ok();
            }
        }
    }
    let mut body = Vec::new();
    match len {
        Some(n) if n > MAX_BODY => return Err(HttpError::BodyTooLong),
        Some(n) => {
            body.resize(n, 0);
            r.read_exact(&mut body)?;
        }
        None => {
            r.take(MAX_BODY as u64).read_to_end(&mut body)?;
        }
    }
    let body = String::from_utf8(body).map_err(|_| HttpError::Malformed("body is not UTF-8"))?;
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::sync::Arc;

    fn parse(s: &[u8]) -> Result<Request, HttpError> {
        read_request(&mut BufReader::new(s))
    }

    #[test]
    fn parses_a_request_with_a_body() {
        let r = parse(b"PUT /v1/x?a=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n{}").unwrap();
        assert_eq!(r.method, "PUT");
        assert_eq!(r.path, "/v1/x");
        assert_eq!(r.query.as_deref(), Some("a=1"));
        assert_eq!(r.header("HOST"), Some("h"));
        assert_eq!(r.body, b"{}");
    }

    #[test]
    fn rejects_bad_requests() {
        for bad in [
            &b""[..],
            b"GET\r\n\r\n",
            b"GET / HTTP/2\r\n\r\n",
            b"get / HTTP/1.1\r\n\r\n",
            b"GET x HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1 extra\r\n\r\n",
            b"GET / HTTP/1.1\r\nNoColon\r\n\r\n",
            b"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            b"GET / HTTP/1.1\r\nContent-Length: 5\r\n\r\nab",
            b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: \xff\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x",
        ] {
            assert!(parse(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn limits_hold() {
        let mut big = b"GET / HTTP/1.1\r\nX: ".to_vec();
        big.extend(std::iter::repeat_n(b'a', MAX_HEAD));
        big.extend(b"\r\n\r\n");
        assert!(matches!(parse(&big), Err(HttpError::HeadTooLong)));
        let body = format!("PUT / HTTP/1.1\r\nContent-Length: {}\r\n\r\n", MAX_BODY + 1);
        assert!(matches!(
            parse(body.as_bytes()),
            Err(HttpError::BodyTooLong)
        ));
    }

    #[test]
    fn routes_match_templates() {
        let r = [
            ("GET", "/v1/x"),
            ("GET", "/v1/x/{id}"),
            ("PUT", "/v1/x/{id}/go"),
        ];
        assert_eq!(route(&r, "GET", "/v1/x/").unwrap(), (0, None));
        assert_eq!(route(&r, "GET", "/v1/x/7").unwrap(), (1, Some("7")));
        assert_eq!(route(&r, "PUT", "/v1/x/a/go").unwrap(), (2, Some("a")));
        assert_eq!(route(&r, "PUT", "/v1/x").unwrap_err().status, 405);
        assert_eq!(route(&r, "GET", "/v1/y").unwrap_err().status, 404);
        assert_eq!(route(&r, "GET", "/v1/x//go").unwrap_err().status, 404);
    }

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_string("a\"b\\c\n\u{1}"), r#""a\"b\\c\n\u0001""#);
    }

    #[test]
    fn round_trip_over_a_socket() {
        let dir = std::env::temp_dir().join(format!("domus-http-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("api.sock");
        let l = bind(&sock).unwrap();
        let h: Arc<dyn Fn(&Request) -> Response + Send + Sync> = Arc::new(|r: &Request| {
            Response::json(
                200,
                format!(
                    "{{\"path\":{},\"len\":{}}}",
                    json_string(&r.path),
                    r.body.len()
                ),
            )
        });
        spawn_server("test-api", l, h).unwrap();
        let (s, b) = request(&sock, "PUT", "/v1/a", Some("{\"x\":1}")).unwrap();
        assert_eq!(s, 200);
        assert_eq!(b, r#"{"path":"/v1/a","len":7}"#);
        // A garbage request gets a 400 with a message.
        let mut raw = UnixStream::connect(&sock).unwrap();
        raw.write_all(b"NOT HTTP\r\n\r\n").unwrap();
        let mut out = String::new();
        raw.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 400 "), "{out}");
        assert!(out.contains("\"error\""), "{out}");
        // A body over the limit: the client gets the server's 413 even
        // though the server stopped reading (and the write failed).
        let big = "x".repeat(4 * MAX_BODY);
        let (s, b) = request(&sock, "PUT", "/v1/a", Some(&big)).unwrap();
        assert_eq!(s, 413, "{b}");
        assert!(b.contains("too long"), "{b}");
        // A second server on a live socket is refused; a stale one is replaced.
        assert!(bind(&sock).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn tcp_with_a_bearer_token() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let h: Arc<dyn Fn(&Request) -> Response + Send + Sync> = Arc::new(|r: &Request| {
            if bearer_ok(r, "s3cret") {
                Response::json(200, "{}")
            } else {
                Response::error(401, "bad token")
            }
        });
        spawn_server_with("test-tcp", l, Policy::default(), h).unwrap();
        let t = Duration::from_secs(5);
        assert_eq!(
            tcp_request(&addr, "s3cret", "GET", "/", None, t).unwrap().0,
            200
        );
        assert_eq!(
            tcp_request(&addr, "s3cre", "GET", "/", None, t).unwrap().0,
            401
        );
        assert_eq!(
            tcp_request(&addr, "s3cretx", "GET", "/", None, t)
                .unwrap()
                .0,
            401
        );
        let req = |auth: &str| Request {
            method: "GET".into(),
            path: "/".into(),
            query: None,
            headers: vec![("authorization".into(), auth.into())],
            body: Vec::new(),
        };
        assert!(bearer_ok(&req("Bearer s3cret"), "s3cret"));
        assert!(!bearer_ok(&req("Basic s3cret"), "s3cret"));
        assert!(!bearer_ok(&req("Bearer "), "s3cret"));
    }
}
