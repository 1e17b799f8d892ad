//! `domus-guest webdyn PORT DIR`: the dynamic share of bench/paper's web
//! workload, the stand-in for SPECweb99's dynamic requests. nginx serves
//! the static pages itself and passes `/dyn` here (HTTP/1.1, kept-alive
//! upstream connections):
//!
//! - `GET /dyn?id=N` with a `user=U` cookie: a page of about 16 KiB made
//!   for this request (rows computed from the page id, and an "ad" chosen
//!   from the user and a running count, as SPECweb99's ad rotation does);
//! - `POST /dyn` with a form body `user=U&item=I`: the post appended to
//!   `DIR/post.log` (SPECweb99's POSTs write a log), and a short answer
//!   that sets the user's cookie.
//!
//! Only loopback listens (nginx is the client), but requests are still
//! bounded: lines of at most 8 KiB, 64 headers, bodies of 64 KiB.

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

const MAX_LINE: u64 = 8 << 10;
const MAX_HEADERS: usize = 64;
const MAX_BODY: usize = 64 << 10;
const PAGE_BYTES: usize = 16 << 10;

#[derive(Debug, PartialEq)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub cookie: Option<String>,
    pub body: Vec<u8>,
    /// The client asked to close the connection after this answer (or
    /// spoke HTTP/1.0).
    pub close: bool,
}

fn bad(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

/// One line, without its CRLF; None at the end of the stream.
fn line(r: &mut impl BufRead) -> io::Result<Option<String>> {
    let mut buf = Vec::new();
    r.by_ref().take(MAX_LINE + 1).read_until(b'\n', &mut buf)?;
    if buf.is_empty() {
        return Ok(None);
    }
    if buf.last() != Some(&b'\n') {
        return Err(bad("a line longer than 8 KiB, or cut short"));
    }
    buf.pop();
    if buf.last() == Some(&b'\r') {
        buf.pop();
    }
    String::from_utf8(buf)
        .map(Some)
        .map_err(|_| bad("a line that is not UTF-8"))
}

/// The next request on a connection; None when the client closed it
/// between requests.
pub fn read_request(r: &mut impl BufRead) -> io::Result<Option<Request>> {
    let Some(first) = line(r)? else {
        return Ok(None);
    };
    let mut parts = first.split(' ');
    let (Some(method), Some(path), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad("a request line that is not METHOD PATH VERSION"));
    };
    let mut req = Request {
        method: method.to_string(),
        path: path.to_string(),
        cookie: None,
        body: Vec::new(),
        close: version != "HTTP/1.1",
    };
    let mut length = 0usize;
    for n in 0.. {
        let Some(h) = line(r)? else {
            return Err(bad("the stream ended inside the headers"));
        };
        if h.is_empty() {
            break;
        }
        if n == MAX_HEADERS {
            return Err(bad("more than 64 headers"));
        }
        let Some((name, value)) = h.split_once(':') else {
            return Err(bad("a header line without a colon"));
        };
        let value = value.trim();
        match name.to_ascii_lowercase().as_str() {
            "content-length" => {
                length = value
                    .parse()
                    .ok()
                    .filter(|&l| l <= MAX_BODY)
                    .ok_or_else(|| bad("a Content-Length that is not a number up to 64 KiB"))?;
            }
            "cookie" => req.cookie = Some(value.to_string()),
            "connection" => req.close = value.eq_ignore_ascii_case("close"),
            "transfer-encoding" => return Err(bad("chunked bodies are not served")),
            _ => {}
        }
    }
    req.body = vec![0; length];
    r.read_exact(&mut req.body)?;
    Ok(Some(req))
}

/// The value of `key` in a `k=v` list split by `sep` (a query string, a
/// form body, a cookie header).
fn field<'a>(list: &'a str, sep: char, key: &str) -> Option<&'a str> {
    list.split(sep)
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

fn next(state: &mut u64) -> u64 {
    // xorshift64*: the page's rows, the same for the same page id.
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// The dynamic page `id` for `user`, the `count`th served.
pub fn page(id: u64, user: u64, count: u64) -> String {
    let ad = user.wrapping_mul(2_654_435_761).wrapping_add(count) % 360;
    let mut s = format!(
        "<html><head><title>page {id}</title></head><body>\n\
         <p>user {user}, ad {ad}, request {count}</p>\n<table>\n"
    );
    let mut state = id.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut row = 0;
    while s.len() < PAGE_BYTES {
        s += &format!(
            "<tr><td>{row}</td><td>{:016x}</td></tr>\n",
            next(&mut state)
        );
        row += 1;
    }
    s + "</table></body></html>\n"
}

struct Server {
    log: Mutex<File>,
    served: AtomicU64,
}

impl Server {
    /// The answer to `req`: status, extra header lines, body.
    fn answer(&self, req: &Request) -> io::Result<(&'static str, String, String)> {
        let (path, query) = req.path.split_once('?').unwrap_or((&req.path, ""));
        if path != "/dyn" {
            return Ok(("404 Not Found", String::new(), "not found\n".into()));
        }
        let count = self.served.fetch_add(1, Ordering::Relaxed);
        let user = |s: Option<&str>| s.and_then(|u| u.parse::<u64>().ok()).unwrap_or(0);
        match req.method.as_str() {
            "GET" => {
                let id = field(query, '&', "id")
                    .and_then(|i| i.parse().ok())
                    .unwrap_or(0);
                let u = user(req.cookie.as_deref().and_then(|c| field(c, ';', "user")));
                Ok(("200 OK", String::new(), page(id, u, count)))
            }
            "POST" => {
                let form = String::from_utf8_lossy(&req.body);
                let u = user(field(&form, '&', "user"));
                let item = field(&form, '&', "item").unwrap_or("");
                let item: String = item
                    .chars()
                    .filter(char::is_ascii_alphanumeric)
                    .take(32)
                    .collect();
                let mut log = self
                    .log
                    .lock()
                    .map_err(|_| bad("the post log's lock is poisoned"))?;
                writeln!(log, "{count} user={u} item={item}")?;
                Ok((
                    "200 OK",
                    format!("Set-Cookie: user={u}\r\n"),
                    format!("<html><body>post {count} of user {u} logged</body></html>\n"),
                ))
            }
            _ => Ok((
                "405 Method Not Allowed",
                String::new(),
                "GET or POST\n".into(),
            )),
        }
    }

    fn serve(&self, conn: TcpStream) -> io::Result<()> {
        let mut w = conn.try_clone()?;
        let mut r = BufReader::new(conn);
        loop {
            let req = match read_request(&mut r) {
                Ok(Some(req)) => req,
                Ok(None) => return Ok(()),
                Err(e) => {
                    let msg = format!("{e}\n");
                    write!(
                        w,
                        "HTTP/1.1 400 Bad Request\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{msg}",
                        msg.len()
                    )?;
                    return Ok(());
                }
            };
            let (status, headers, body) = self.answer(&req)?;
            let close = if req.close {
                "Connection: close\r\n"
            } else {
                ""
            };
            let head = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/html\r\nContent-Length: {}\r\n{headers}{close}\r\n",
                body.len()
            );
            // One write: the head alone would wait for the client's
            // delayed ACK (Nagle) before the body went.
            w.write_all((head + &body).as_bytes())?;
            if req.close {
                return Ok(());
            }
        }
    }
}

/// Serves on 127.0.0.1:`port`, a thread per connection, posts logged in
/// `dir`.
pub fn run(port: u16, dir: &Path) -> io::Result<()> {
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("post.log"))?;
    let server = Arc::new(Server {
        log: Mutex::new(log),
        served: AtomicU64::new(0),
    });
    let listener = TcpListener::bind(("127.0.0.1", port))?;
    for conn in listener.incoming() {
        let conn = conn?;
        let server = Arc::clone(&server);
        std::thread::spawn(move || {
            if let Err(e) = server.serve(conn) {
                eprintln!("domus-guest webdyn: {e}");
            }
        });
    }
    Ok(())
}

pub fn main(args: &[String]) {
    let (Some(port), Some(dir)) = (args.first().and_then(|p| p.parse().ok()), args.get(1)) else {
        eprintln!("usage: domus-guest webdyn PORT DIR");
        std::process::exit(2);
    };
    if let Err(e) = run(port, Path::new(dir)) {
        eprintln!("domus-guest webdyn: {e}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> io::Result<Option<Request>> {
        read_request(&mut text.as_bytes())
    }

    #[test]
    fn a_get_and_a_post_parse_with_their_cookie_and_body() {
        let r = parse("GET /dyn?id=7 HTTP/1.1\r\nHost: x\r\nCookie: a=1; user=42\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(
            (r.method.as_str(), r.path.as_str(), r.close),
            ("GET", "/dyn?id=7", false)
        );
        assert_eq!(field(r.cookie.as_deref().unwrap(), ';', "user"), Some("42"));
        let r = parse(
            "POST /dyn HTTP/1.1\r\ncontent-length: 14\r\nConnection: close\r\n\r\nuser=3&item=ab",
        )
        .unwrap()
        .unwrap();
        assert_eq!((r.body.as_slice(), r.close), (&b"user=3&item=ab"[..], true));
        assert!(parse("GET / HTTP/1.0\r\n\r\n").unwrap().unwrap().close);
        assert!(parse("").unwrap().is_none());
    }

    #[test]
    fn hostile_requests_are_refused_not_served() {
        for text in [
            "GET /dyn\r\n\r\n".to_string(),
            "GET /dyn HTTP/1.1\r\nContent-Length: 70000\r\n\r\n".into(),
            "GET /dyn HTTP/1.1\r\nContent-Length: -1\r\n\r\n".into(),
            "GET /dyn HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n".into(),
            "GET /dyn HTTP/1.1\r\nno colon\r\n\r\n".into(),
            "GET /dyn HTTP/1.1\r\nHost: x\r\n".into(),
            format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(9000)),
            format!("GET /dyn HTTP/1.1\r\n{}\r\n", "X: y\r\n".repeat(65)),
            "POST /dyn HTTP/1.1\r\nContent-Length: 10\r\n\r\nshort".into(),
        ] {
            assert!(parse(&text).is_err(), "{text:.60}");
        }
    }

    #[test]
    fn a_page_is_about_16_kib_fixed_by_its_id_with_the_ad_rotating() {
        let a = page(5, 9, 0);
        assert!(
            a.len() >= PAGE_BYTES && a.len() < PAGE_BYTES + 200,
            "{}",
            a.len()
        );
        assert!(a.ends_with("</html>\n"));
        let rows = |p: &str| p.split_once("<table>").unwrap().1.to_string();
        assert_eq!(rows(&a), rows(&page(5, 1, 3)));
        assert_ne!(rows(&a), rows(&page(6, 9, 0)));
        assert_ne!(a, page(5, 9, 1));
    }

    #[test]
    fn answers_go_by_path_and_method_and_posts_are_logged() {
        let dir = std::env::temp_dir().join(format!("domus-webdyn-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let server = Server {
            log: Mutex::new(File::create(dir.join("post.log")).unwrap()),
            served: AtomicU64::new(0),
        };
        let req = |method: &str, path: &str, body: &str| Request {
            method: method.into(),
            path: path.into(),
            cookie: None,
            body: body.as_bytes().to_vec(),
            close: false,
        };
        assert_eq!(
            server.answer(&req("GET", "/other", "")).unwrap().0,
            "404 Not Found"
        );
        assert_eq!(
            server.answer(&req("PUT", "/dyn", "")).unwrap().0,
            "405 Method Not Allowed"
        );
        let (status, _, body) = server.answer(&req("GET", "/dyn?id=3", "")).unwrap();
        assert_eq!((status, body.len() >= PAGE_BYTES), ("200 OK", true));
        let (_, headers, _) = server
            .answer(&req("POST", "/dyn", "user=8&item=x;rm"))
            .unwrap();
        assert_eq!(headers, "Set-Cookie: user=8\r\n");
        let log = std::fs::read_to_string(dir.join("post.log")).unwrap();
        assert_eq!(log, "2 user=8 item=xrm\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
