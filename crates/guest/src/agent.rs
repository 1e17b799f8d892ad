//! The guest agent: `domus-guest agent PORT` in a guest serves commands
//! over vsock, so a test (or a person, with `domus-guest exec CID PORT
//! CMD`) runs a command in the guest and gets its exit status and output
//! as typed JSON, instead of scraping the console.
//!
//! One connection per request: the host connects to (guest CID, port) and
//! sends one [`Request`] as a JSON line; the agent answers with one
//! [`Reply`] as a JSON line and closes. [`Request::Exit`] ends the agent
//! (and with it the kit's init, which then powers off).

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::vsock;

/// The most of a request the agent reads, and of each output it returns
/// (the rest is cut, and the reply says so).
pub const MAX_REQUEST: u64 = 64 << 10;
pub const MAX_OUTPUT: usize = 1 << 20;
/// The most of a reply the host reads.
pub const MAX_REPLY: u64 = 4 * MAX_OUTPUT as u64;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
pub enum Request {
    /// Runs `cmd` with `sh -c`, stdin from /dev/null.
    Run { cmd: String },
    /// Ends the agent after answering.
    Exit,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reply {
    /// The exit status; 128 + N for a command killed by signal N; 127
    /// when it could not be started (the reason in `stderr`).
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
    /// Whether an output was longer than [`MAX_OUTPUT`] and was cut.
    #[serde(default)]
    pub truncated: bool,
}

impl Reply {
    /// stdout without its trailing newline.
    pub fn out(&self) -> &str {
        self.stdout.trim_end_matches('\n')
    }
}

fn run(cmd: &str) -> Reply {
    let out = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .stdin(Stdio::null())
        .output();
    match out {
        Ok(o) => {
            let status = o.status.code().unwrap_or_else(|| {
                128 + std::os::unix::process::ExitStatusExt::signal(&o.status).unwrap_or(0)
            });
            let truncated = o.stdout.len() > MAX_OUTPUT || o.stderr.len() > MAX_OUTPUT;
            let text =
                |b: &[u8]| String::from_utf8_lossy(&b[..b.len().min(MAX_OUTPUT)]).into_owned();
            Reply {
                status,
                stdout: text(&o.stdout),
                stderr: text(&o.stderr),
                truncated,
            }
        }
        Err(e) => Reply {
            status: 127,
            stderr: format!("domus-guest agent: cannot run sh: {e}"),
            ..Reply::default()
        },
    }
}

/// A JSON object of type `T` (serde would also take a struct or a tagged
/// enum from an array of its fields, in order).
fn parse<T: serde::de::DeserializeOwned>(line: &str) -> Result<T, String> {
    let v: serde_json::Value = serde_json::from_str(line).map_err(|e| e.to_string())?;
    if !v.is_object() {
        return Err("not a JSON object".into());
    }
    serde_json::from_value(v).map_err(|e| e.to_string())
}

/// Reads one request line from `conn`, bounded.
fn read_request(conn: &std::fs::File) -> Result<Request, String> {
    let mut line = String::new();
    BufReader::new(conn.take(MAX_REQUEST))
        .read_line(&mut line)
        .map_err(|e| format!("reading the request: {e}"))?;
    parse(&line).map_err(|e| format!("bad request: {e}"))
}

/// Serves requests on vsock `port` until one asks it to exit.
pub fn serve(port: u32) -> std::io::Result<()> {
    let l = vsock::Listener::bind(port)?;
    println!("domus-guest agent: listening on vsock port {port}");
    loop {
        let conn = match l.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let (reply, exit) = match read_request(&conn) {
            Ok(Request::Run { cmd }) => (run(&cmd), false),
            Ok(Request::Exit) => (Reply::default(), true),
            Err(e) => (
                Reply {
                    status: 2,
                    stderr: e,
                    ..Reply::default()
                },
                false,
            ),
        };
        let mut text = serde_json::to_string(&reply).unwrap_or_default();
        text.push('\n');
        // A host that went away does not stop the agent.
        let _ = (&conn).write_all(text.as_bytes());
        if exit {
            return Ok(());
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("connecting to the agent at vsock {cid}:{port}: {source}")]
    Connect {
        cid: u32,
        port: u32,
        #[source]
        source: std::io::Error,
    },
    #[error("talking to the agent: {0}")]
    Io(#[from] std::io::Error),
    #[error("the agent's reply: {0}")]
    Reply(String),
}

/// The host's side: a guest's agent at (CID, port).
#[derive(Clone, Debug)]
pub struct Client {
    pub cid: u32,
    pub port: u32,
    /// How long one request may take.
    pub timeout: Duration,
    /// How long the guest's kernel may take to answer a connection request
    /// (the kernel's own default, 2 s, is short for a guest on a loaded or
    /// nested host).
    pub connect_timeout: Duration,
}

impl Client {
    pub fn new(cid: u32, port: u32) -> Self {
        Self {
            cid,
            port,
            timeout: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(30),
        }
    }

    /// Waits up to `patience` for the agent to listen (the guest is
    /// booting), asking `still_booting` between tries whether to go on.
    pub fn wait(
        &self,
        patience: Duration,
        still_booting: impl Fn() -> bool,
    ) -> Result<(), ClientError> {
        let end = Instant::now() + patience;
        loop {
            // A guest whose vsock driver is not up yet holds the request
            // until it is; wait no longer than the patience left.
            let left = end.saturating_duration_since(Instant::now());
            match self.call_within(&Request::Run { cmd: "true".into() }, left) {
                Ok(_) => return Ok(()),
                Err(ClientError::Connect { .. }) if Instant::now() < end && still_booting() => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Runs `cmd` in the guest.
    pub fn run(&self, cmd: &str) -> Result<Reply, ClientError> {
        self.call(&Request::Run { cmd: cmd.into() })
    }

    /// Ends the agent.
    pub fn exit(&self) -> Result<(), ClientError> {
        self.call(&Request::Exit).map(drop)
    }

    fn call(&self, req: &Request) -> Result<Reply, ClientError> {
        self.call_within(req, self.connect_timeout)
    }

    /// `call`, waiting at most `connect` (and `connect_timeout`) for the
    /// connection.
    fn call_within(&self, req: &Request, connect: Duration) -> Result<Reply, ClientError> {
        let within = connect.min(self.connect_timeout);
        let conn =
            vsock::connect(self.cid, self.port, within).map_err(|source| ClientError::Connect {
                cid: self.cid,
                port: self.port,
                source,
            })?;
        vsock::set_timeout(&conn, self.timeout)?;
        let mut text = serde_json::to_string(req).map_err(|e| ClientError::Reply(e.to_string()))?;
        text.push('\n');
        (&conn).write_all(text.as_bytes())?;
        let mut line = String::new();
        BufReader::new((&conn).take(MAX_REPLY)).read_line(&mut line)?;
        if line.is_empty() {
            return Err(ClientError::Reply(
                "the agent closed without answering".into(),
            ));
        }
        parse(&line).map_err(|e| ClientError::Reply(format!("{e}: {line}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_typed_and_strict() {
        let r: Request = parse(r#"{"op":"run","cmd":"nproc"}"#).unwrap();
        assert_eq!(
            r,
            Request::Run {
                cmd: "nproc".into()
            }
        );
        assert_eq!(
            serde_json::to_string(&Request::Exit).unwrap(),
            r#"{"op":"exit"}"#
        );
        for bad in [
            r#"{"op":"run"}"#,
            r#"{"op":"run","cmd":"x","user":"root"}"#,
            r#"{"op":"format"}"#,
            r#"["run","x"]"#,
        ] {
            assert!(parse::<Request>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn commands_report_status_output_and_signals() {
        let r = run("echo out; echo err >&2; exit 3");
        assert_eq!((r.status, r.out(), r.stderr.as_str()), (3, "out", "err\n"));
        assert!(!r.truncated);
        assert_eq!(run("kill -9 $$").status, 128 + 9);
        let big = run(&format!("head -c {} /dev/zero", MAX_OUTPUT + 10));
        assert!(big.truncated && big.stdout.len() == MAX_OUTPUT);
    }
}
