//! Serving connections: one short-lived thread per connection, at most
//! [`Policy::max_connections`] at once, each with one deadline for its
//! whole request, and a gate that may refuse a request from its head
//! before its body is read (the TCP API's token).

use std::io::{BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{read_body, read_head, write_response, HttpError, Request, Response, READ_TIMEOUT};

/// What answers a request.
pub type Handler = Arc<dyn Fn(&Request) -> Response + Send + Sync>;

/// Looks at a request's head before its body is read: `Some(answer)`
/// refuses it with that answer.
pub type Gate = Arc<dyn Fn(&Request) -> Option<Response> + Send + Sync>;

/// How a server treats its clients.
#[derive(Clone)]
pub struct Policy {
    /// The most time a client has to send its whole request, head and body:
    /// a client that trickles bytes is cut off at it.
    pub deadline: Duration,
    /// The most connections served at once (each holds a thread); the
    /// next ones are answered 503 and closed at once.
    pub max_connections: usize,
    /// Refuses requests from their heads (see [`Gate`]).
    pub gate: Option<Gate>,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            deadline: READ_TIMEOUT,
            max_connections: 128,
            gate: None,
        }
    }
}

/// A stream a request comes in on: a Unix or a TCP socket.
pub trait Conn: Read + Write + Sized + Send + 'static {
    fn duplicate(&self) -> std::io::Result<Self>;
    fn read_timeout(&self, t: Duration) -> std::io::Result<()>;
    fn write_timeout(&self, t: Duration) -> std::io::Result<()>;
}

/// The std socket streams have the same inherent methods, but no trait
/// that names them.
macro_rules! conn_for {
    ($($stream:ty),*) => {$(
        impl Conn for $stream {
            fn duplicate(&self) -> std::io::Result<Self> {
                self.try_clone()
            }
            fn read_timeout(&self, t: Duration) -> std::io::Result<()> {
                self.set_read_timeout(Some(t))
            }
            fn write_timeout(&self, t: Duration) -> std::io::Result<()> {
                self.set_write_timeout(Some(t))
            }
        }
    )*};
}
conn_for!(UnixStream, TcpStream);

/// Reads from `inner` until `until`: each read may wait only for what is
/// left of the deadline (set on `timer`, a handle on the same socket).
struct Deadline<R, C> {
    inner: R,
    timer: C,
    until: Instant,
}

impl<R: Read, C: Conn> Read for Deadline<R, C> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        self.timer.read_timeout(left)?;
        self.inner.read(buf)
    }
}

/// Serves one connection: reads a request within the deadline, answers it,
/// closes. `stream` carries the bytes; `timer` is a handle on the same
/// socket (socket timeouts are the socket's, whichever handle sets them).
pub fn serve_connection<S: Read + Write + Send + 'static, C: Conn>(
    stream: S,
    timer: C,
    policy: &Policy,
    handler: &dyn Fn(&Request) -> Response,
) {
    let _ = timer.write_timeout(policy.deadline);
    let mut r = BufReader::new(Deadline {
        inner: stream,
        timer,
        until: Instant::now() + policy.deadline,
    });
    let answer = read_head(&mut r).and_then(|mut req| {
        if let Some(refusal) = policy.gate.as_ref().and_then(|g| g(&req)) {
            return Ok(refusal);
        }
        read_body(&mut r, &mut req)?;
        Ok(handler(&req))
    });
    let resp = match answer {
        Ok(resp) => resp,
        Err(HttpError::HeadTooLong) => Response::error(431, "request head too long"),
        Err(HttpError::BodyTooLong) => Response::error(413, "request body too long"),
        Err(HttpError::Io(e))
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            Response::error(408, "request not received in time")
        }
        Err(HttpError::Io(_)) => return,
        Err(e) => Response::error(400, &e.to_string()),
    };
    // Writing may read too (TLS): never for long once the request is in
    // or its time is up.
    let _ = r.get_ref().timer.read_timeout(Duration::from_millis(100));
    if write_response(&mut r.get_mut().inner, &resp).is_err() {
        return;
    }
    if let Some(takeover) = resp.upgrade.as_ref().and_then(|u| u.take()) {
        // The handler's from here: what the client sent past its request,
        // then the socket, with no deadline.
        let ahead = r.buffer().to_vec();
        let d = r.into_inner();
        let _ = d.timer.write_timeout(Duration::from_secs(30));
        takeover(Box::new(crate::upgrade::Handed {
            ahead,
            at: 0,
            inner: d.inner,
            timer: d.timer,
        }));
    }
}

/// Serves a connection on a plain socket (its duplicate keeps the time).
fn serve_plain<C: Conn>(s: C, p: &Policy, h: &Handler) {
    if let Ok(timer) = s.duplicate() {
        serve_connection(s, timer, p, &**h);
    }
}

/// Serves `listener` on a thread of its own, by [`Policy::default`].
pub fn spawn_server(
    name: &str,
    listener: UnixListener,
    handler: Handler,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    spawn_server_with(name, listener, Policy::default(), handler)
}

/// A listening socket: Unix or TCP.
pub trait Listen: Send + 'static {
    type Stream: Conn;
    fn accept_one(&self) -> std::io::Result<Self::Stream>;
}

impl Listen for UnixListener {
    type Stream = UnixStream;
    fn accept_one(&self) -> std::io::Result<UnixStream> {
        self.accept().map(|(s, _)| s)
    }
}

impl Listen for TcpListener {
    type Stream = TcpStream;
    fn accept_one(&self) -> std::io::Result<TcpStream> {
        self.accept().map(|(s, _)| s)
    }
}

/// [`spawn_server`] by `policy`, on any listening socket.
pub fn spawn_server_with<L: Listen>(
    name: &str,
    listener: L,
    policy: Policy,
    handler: Handler,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    accept_loop(
        name,
        move || listener.accept_one(),
        policy,
        serve_plain,
        handler,
    )
}

/// Counts a connection while it is served.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Accepts connections and serves each on a thread of its own with
/// `serve`, at most `policy.max_connections` at once.
pub fn accept_loop<C: Conn>(
    name: &str,
    mut accept: impl FnMut() -> std::io::Result<C> + Send + 'static,
    policy: Policy,
    serve: impl Fn(C, &Policy, &Handler) + Send + Sync + 'static,
    handler: Handler,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let live = Arc::new(AtomicUsize::new(0));
    let serve = Arc::new(serve);
    std::thread::Builder::new()
        .name(name.to_string())
        .stack_size(256 << 10)
        .spawn(move || loop {
            let Ok(mut stream) = accept() else {
                // Out of descriptors, say: let connections end first.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            };
            if live.fetch_add(1, Ordering::SeqCst) >= policy.max_connections {
                live.fetch_sub(1, Ordering::SeqCst);
                // Told at once, without a thread and without waiting on a
                // client that does not read.
                let _ = stream.write_timeout(Duration::from_millis(50));
                let _ = write_response(
                    &mut stream,
                    &Response::error(503, "too many connections; try again"),
                );
                continue;
            }
            let slot = Slot(live.clone());
            let (h, p, serve) = (handler.clone(), policy.clone(), serve.clone());
            let spawned = std::thread::Builder::new()
                .name("api-conn".into())
                .stack_size(256 << 10)
                .spawn(move || {
                    let _slot = slot;
                    serve(stream, &p, &h);
                });
            if spawned.is_err() {
                std::thread::sleep(Duration::from_millis(10));
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{bearer_ok, tcp_request};

    fn token_gate(token: &'static str) -> Gate {
        Arc::new(move |r: &Request| {
            (!bearer_ok(r, token)).then(|| Response::error(401, "bad token"))
        })
    }

    fn server(policy: Policy) -> (String, Arc<AtomicUsize>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let bodies = Arc::new(AtomicUsize::new(0));
        let b = bodies.clone();
        let h: Handler = Arc::new(move |r: &Request| {
            b.fetch_add(r.body.len(), Ordering::SeqCst);
            Response::json(200, "{}")
        });
        spawn_server_with("test-tcp", l, policy, h).unwrap();
        (addr, bodies)
    }

    fn answer(mut s: TcpStream) -> String {
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    #[test]
    fn the_gate_refuses_from_the_head_without_reading_the_body() {
        let (addr, bodies) = server(Policy {
            gate: Some(token_gate("s3cret")),
            ..Policy::default()
        });
        let t = Duration::from_secs(5);
        let ok = tcp_request(&addr, "s3cret", "PUT", "/", Some("{}"), t).unwrap();
        assert_eq!(ok.0, 200);
        assert_eq!(bodies.load(Ordering::SeqCst), 2);
        // A head with a wrong token and a body that never comes: refused at
        // once, not after the deadline.
        let mut s = TcpStream::connect(&addr).unwrap();
        s.write_all(
            b"PUT / HTTP/1.1\r\nAuthorization: Bearer nope\r\nContent-Length: 1000\r\n\r\n",
        )
        .unwrap();
        let at = Instant::now();
        let out = answer(s);
        assert!(out.starts_with("HTTP/1.1 401 "), "{out}");
        assert!(at.elapsed() < Duration::from_secs(2), "{:?}", at.elapsed());
        assert_eq!(bodies.load(Ordering::SeqCst), 2, "a refused body was read");
    }

    #[test]
    fn a_client_that_trickles_is_cut_off_at_the_deadline() {
        let deadline = Duration::from_millis(600);
        let (addr, _) = server(Policy {
            deadline,
            ..Policy::default()
        });
        let s = TcpStream::connect(&addr).unwrap();
        let mut w = s.try_clone().unwrap();
        let at = Instant::now();
        // One byte every 100 ms: each read is quick, the request never ends.
        let writer = std::thread::spawn(move || {
            for b in b"GET /a-very-long-path-sent-slowly HTTP/1.1\r\n"
                .iter()
                .cycle()
            {
                if w.write_all(&[*b]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let out = answer(s);
        let took = at.elapsed();
        assert!(out.starts_with("HTTP/1.1 408 "), "{out}");
        assert!(took >= deadline && took < deadline * 3, "{took:?}");
        drop(writer);
    }

    #[test]
    fn connections_past_the_cap_are_refused_and_served_again_once_freed() {
        let (addr, _) = server(Policy {
            deadline: Duration::from_millis(800),
            max_connections: 4,
            gate: None,
        });
        // Four idle clients take every slot.
        let idle: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(&addr).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(100));
        let out = answer(TcpStream::connect(&addr).unwrap());
        assert!(out.starts_with("HTTP/1.1 503 "), "{out}");
        // The deadline frees them (each gets its 408).
        for s in idle {
            assert!(answer(s).starts_with("HTTP/1.1 408 "));
        }
        std::thread::sleep(Duration::from_millis(50));
        let t = Duration::from_secs(5);
        assert_eq!(tcp_request(&addr, "", "GET", "/", None, t).unwrap().0, 200);
    }
}
