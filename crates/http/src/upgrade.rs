//! A connection taken over after its answer: a handler that answers with
//! [`Response::upgraded`] gets the socket once the answer is written, and
//! from then on it carries whatever the two ends agreed (a live
//! migration's stream), with no HTTP framing and no deadline. The client's
//! side is [`upgrade_request`].

use std::io::{BufReader, Read, Write};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::server::Conn;
use crate::{HttpError, Response};

/// A connection handed over: the bytes already read past the HTTP
/// message, then the socket.
pub trait Duplex: Read + Write + Send {
    /// How long a read may wait (None: as long as it takes).
    fn set_read_timeout(&self, t: Option<Duration>) -> std::io::Result<()>;
}

/// An answer's status and body, and the connection when it was handed
/// over.
pub type Answer = (u16, String, Option<Box<dyn Duplex>>);

/// What takes a connection over.
pub type Takeover = Box<dyn FnOnce(Box<dyn Duplex>) + Send>;

/// A [`Takeover`] in a [`Response`] (which is cloned and compared, so it
/// is shared, and taken once).
#[derive(Clone)]
pub struct Upgrade(Arc<Mutex<Option<Takeover>>>);

impl Upgrade {
    pub fn new(f: impl FnOnce(Box<dyn Duplex>) + Send + 'static) -> Self {
        Self(Arc::new(Mutex::new(Some(Box::new(f)))))
    }

    /// The takeover, the first time it is asked for.
    pub fn take(&self) -> Option<Takeover> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

impl std::fmt::Debug for Upgrade {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Upgrade")
    }
}

impl PartialEq for Upgrade {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Upgrade {}

impl Response {
    /// A JSON answer after which `f` gets the connection.
    pub fn upgraded(
        status: u16,
        body: impl Into<Vec<u8>>,
        f: impl FnOnce(Box<dyn Duplex>) + Send + 'static,
    ) -> Self {
        Self {
            upgrade: Some(Upgrade::new(f)),
            ..Self::json(status, body)
        }
    }
}

/// A socket with bytes read ahead of it.
pub(crate) struct Handed<S, C> {
    pub ahead: Vec<u8>,
    pub at: usize,
    pub inner: S,
    /// A handle on the same socket, for its timeouts.
    pub timer: C,
}

impl<S: Read, C> Read for Handed<S, C> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.at < self.ahead.len() {
            let n = buf.len().min(self.ahead.len() - self.at);
            buf[..n].copy_from_slice(&self.ahead[self.at..self.at + n]);
            self.at += n;
            return Ok(n);
        }
        self.inner.read(buf)
    }
}

impl<S: Write, C> Write for Handed<S, C> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.inner.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

impl<S: Read + Write + Send, C: Conn> Duplex for Handed<S, C> {
    fn set_read_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        // A year stands for no limit: Conn's timeouts are durations.
        self.timer
            .read_timeout(t.unwrap_or(Duration::from_secs(365 * 86400)))
    }
}

/// Sends a request on `s` (`timer`: a handle on the same socket) and
/// reads its answer; when the status is `want`, the connection is the
/// caller's from then on. Returns the status, the body, and the
/// connection if it was handed over.
pub fn upgrade_request<S, C>(
    mut s: S,
    timer: C,
    request: &[u8],
    want: u16,
) -> Result<crate::upgrade::Answer, HttpError>
where
    S: Read + Write + Send + 'static,
    C: Conn,
{
    s.write_all(request)?;
    s.flush()?;
    let mut r = BufReader::new(s);
    let (status, body) = crate::read_answer(&mut r)?;
    if status != want {
        return Ok((status, body, None));
    }
    let ahead = r.buffer().to_vec();
    let handed = Handed {
        ahead,
        at: 0,
        inner: r.into_inner(),
        timer,
    };
    Ok((status, body, Some(Box::new(handed))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Handler, Request};
    use std::sync::Arc;

    /// Answers 200 and then echoes what comes, upper-cased, until EOF.
    fn echo() -> Handler {
        Arc::new(|r: &Request| {
            if r.path != "/up" {
                return Response::error(404, "no");
            }
            Response::upgraded(200, "{}", |mut s: Box<dyn Duplex>| {
                let mut buf = [0u8; 64];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    let up = buf[..n].to_ascii_uppercase();
                    if s.write_all(&up).and_then(|()| s.flush()).is_err() {
                        break;
                    }
                }
            })
        })
    }

    fn talk(mut s: Box<dyn Duplex>) -> String {
        s.write_all(b"hello").unwrap();
        s.flush().unwrap();
        let mut got = [0u8; 5];
        s.read_exact(&mut got).unwrap();
        String::from_utf8(got.to_vec()).unwrap()
    }

    #[test]
    fn a_connection_is_handed_over_after_its_answer() {
        let dir = std::env::temp_dir().join(format!("domus-upgrade-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("s");
        let l = crate::bind(&sock).unwrap();
        crate::spawn_server("t", l, echo()).unwrap();
        let t = Duration::from_secs(5);
        let (st, body, s) = crate::unix_upgrade(&sock, "PUT", "/up", Some("{}"), 200, t).unwrap();
        assert_eq!((st, body.as_str()), (200, "{}"));
        assert_eq!(talk(s.unwrap()), "HELLO");
        // Another status: no connection.
        let (st, _, s) = crate::unix_upgrade(&sock, "PUT", "/x", None, 200, t).unwrap();
        assert_eq!(st, 404);
        assert!(s.is_none());

        // Over TLS too.
        let id = crate::tls::load_or_make(
            &dir.join("c.pem"),
            &dir.join("k.pem"),
            &["localhost".into()],
        )
        .unwrap();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        crate::tls::spawn_tls_server("t", l, &id, crate::Policy::default(), echo()).unwrap();
        let v = crate::tls::Verify::Fingerprint(id.fingerprint.clone());
        let (st, _, s) =
            crate::tls::tls_upgrade(&addr, &v, "k", "PUT", "/up", None, 200, t).unwrap();
        assert_eq!(st, 200);
        assert_eq!(talk(s.unwrap()), "HELLO");
        let _ = std::fs::remove_dir_all(dir);
    }
}
