//! Live migration between two daemons (docs/migration.md).
//!
//! The source daemon asks the destination daemon, over its TCP API (TLS,
//! token), to take the domain (`POST /v1/migrations`): the destination
//! checks it as a create, starts a VMM with `domus run --incoming` and
//! answers; that connection then carries the stream. The source daemon
//! then asks its VMM to send (`PUT /v1/domain/migrate`), which hands that
//! API connection over too, and relays frames between the two
//! connections, reading the rounds for progress. Each daemon relays on a
//! thread of its own; neither VMM reaches beyond its own socket.
//!
//! The source VMM ends with status 5 once the destination runs the
//! guest, and the monitor removes the domain here (`supervise::End`).
//! Anything that fails before that leaves it running here.

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use domus_api::daemon::{IncomingRequest, MigrateRequest};
use domus_api::migration::{self as stream, Round};
use domus_api::vmm::{MigrationState, MigrationStatus};
use domus_http::tls::Verify;
use domus_http::{Duplex, Response};

use crate::lifecycle::Start;
use crate::{domain_dir, lock, Daemon, Error, Result};

/// How long the two ends have to agree (each request's answer).
const AGREE: Duration = Duration::from_secs(30);
/// How long the relay waits for the next frame.
const IDLE: Duration = Duration::from_secs(120);
/// How long the destination waits for its VMM's socket.
const SOCKET_WAIT: Duration = Duration::from_secs(30);

/// The migrations this daemon sent, by domain name (the last of each).
pub(crate) type Migrations = Mutex<HashMap<String, Arc<Mutex<MigrationStatus>>>>;

fn vmm_failed(dom: &str, msg: String) -> Error {
    Error::Start {
        name: dom.to_string(),
        msg: format!("its VMM: {msg}"),
    }
}

fn refused(to: &str, status: u16, body: &str) -> Error {
    let msg = serde_json::from_str::<domus_api::ErrorBody>(body)
        .map(|e| e.error)
        .unwrap_or_else(|_| body.to_string());
    Error::Invalid(format!("the destination {to} refused ({status}): {msg}"))
}

impl Daemon {
    /// migrate: sends domain `dom` live to the daemon `req.to`; answers
    /// once both ends have agreed, then relays on a thread of its own.
    pub fn migrate(&self, dom: &str, req: &MigrateRequest) -> Result<MigrationStatus> {
        let r = self.find(dom)?;
        if req.downtime_ms == 0 || req.max_rounds == 0 {
            return Err(Error::Invalid(
                "downtime_ms and max_rounds must be at least 1".into(),
            ));
        }
        let verify = match (&req.fingerprint, &req.ca_file) {
            (Some(fp), None) => Verify::Fingerprint(fp.clone()),
            (None, Some(ca)) => Verify::CaFile(ca.into()),
            _ => {
                return Err(Error::Invalid(
                    "give the destination's certificate: fingerprint or ca_file".into(),
                ))
            }
        };
        let paused = match lock(&self.live).get(&r.id) {
            Some(l) if l.child.is_some() || l.pidfd.is_some() => l.paused,
            _ => return Err(Error::Invalid(format!("{dom} is not running"))),
        };
        let status = Arc::new(Mutex::new(MigrationStatus {
            state: MigrationState::Copying,
            ..MigrationStatus::default()
        }));
        {
            let mut all = lock(&self.migrations);
            if let Some(s) = all.get(&r.name) {
                if matches!(
                    lock(s).state,
                    MigrationState::Copying | MigrationState::Stopped
                ) {
                    return Err(Error::Invalid(format!("{dom} is being migrated already")));
                }
            }
            all.insert(r.name.clone(), status.clone());
        }
        let agreed = (|| -> Result<(Box<dyn Duplex>, Box<dyn Duplex>)> {
            let body = serde_json::to_string(&IncomingRequest {
                domain: r.config.clone(),
                paused,
            })
            .map_err(|e| Error::Invalid(e.to_string()))?;
            let (st, text, dest) = domus_http::tls::tls_upgrade(
                &req.to,
                &verify,
                &req.token,
                "POST",
                "/v1/migrations",
                Some(&body),
                200,
                AGREE,
            )
            .map_err(|e| Error::Invalid(format!("the destination {}: {e}", req.to)))?;
            let dest = dest.ok_or_else(|| refused(&req.to, st, &text))?;
            let body = serde_json::to_string(&domus_api::vmm::MigrateRequest {
                downtime_ms: req.downtime_ms,
                max_rounds: req.max_rounds,
            })
            .map_err(|e| Error::Invalid(e.to_string()))?;
            let api = domain_dir(&self.state, r.id).join("api.sock");
            let (st, text, vmm) = domus_http::unix_upgrade(
                &api,
                "PUT",
                "/v1/domain/migrate",
                Some(&body),
                200,
                AGREE,
            )
            .map_err(|e| vmm_failed(dom, e.to_string()))?;
            let vmm = vmm.ok_or_else(|| vmm_failed(dom, format!("refused ({st}): {text}")))?;
            Ok((dest, vmm))
        })();
        let (dest, vmm) = match agreed {
            Ok(x) => x,
            Err(e) => {
                let mut s = lock(&status);
                s.state = MigrationState::Failed;
                s.error = Some(e.to_string());
                return Err(e);
            }
        };
        self.log_domain(
            &r.name,
            false,
            &format!("migrating {} to {}", r.name, req.to),
        );
        let (st, to, name) = (status.clone(), req.to.clone(), r.name.clone());
        std::thread::Builder::new()
            .name("migrate-relay".into())
            .spawn(move || {
                let t0 = Instant::now();
                let r = relay_source(vmm, dest, &st);
                let mut s = lock(&st);
                match r {
                    Ok(downtime) => {
                        s.state = MigrationState::Completed;
                        s.downtime_ms = Some(downtime.as_secs_f64() * 1000.0);
                        tracing::info!(domain = %name, "migrated to {to} in {:.1} s", t0.elapsed().as_secs_f64());
                    }
                    Err(e) => {
                        s.state = MigrationState::Failed;
                        s.error = Some(e.clone());
                        tracing::warn!(domain = %name, "migration to {to} failed: {e}");
                    }
                }
            })
            .map_err(|e| vmm_failed(dom, format!("starting the relay: {e}")))?;
        let s = lock(&status).clone();
        Ok(s)
    }

    /// The last migration of `dom` this daemon sent.
    pub fn migration(&self, dom: &str) -> Result<MigrationStatus> {
        lock(&self.migrations)
            .get(dom)
            .map(|s| lock(s).clone())
            .ok_or_else(|| Error::NoSuchDomain(format!("{dom} (no migration of it from here)")))
    }

    /// migrate --cancel: the VMM stops before its next frame and goes on
    /// here (once the guest is stopped for the last copy it is too late).
    pub fn cancel_migration(&self, dom: &str) -> Result<MigrationStatus> {
        let r = self.find(dom)?;
        let api = domain_dir(&self.state, r.id).join("api.sock");
        let (st, text) =
            domus_http::request_within(&api, "DELETE", "/v1/domain/migration", None, AGREE)
                .map_err(|e| vmm_failed(dom, e.to_string()))?;
        if st >= 400 {
            return Err(vmm_failed(dom, format!("({st}) {text}")));
        }
        self.migration(dom)
    }

    /// POST /v1/migrations: takes a domain migrated from another daemon.
    /// Checked as a create before the answer; the stream then follows on
    /// the connection, relayed to a VMM started with `--incoming`.
    pub fn incoming(self: &Arc<Self>, req: IncomingRequest) -> Result<Response> {
        // The create's checks, so that a refusal is the answer; the
        // create makes them again.
        let c = req.domain;
        self.files.check_config(&c)?;
        self.check_limits(&c)?;
        crate::lifecycle::refuse_taken(&lock(&self.db).all()?, &c)?;
        self.admit(c.maxmem_mib, None)?;
        let me = self.clone();
        Ok(Response::upgraded(200, "{}", move |mut src| {
            let name = c.name.clone();
            let (tx, rx) = std::sync::mpsc::channel::<PathBuf>();
            let d = me.clone();
            let create = std::thread::Builder::new()
                .name("migrate-in".into())
                .spawn(move || d.create_config(&c, Vec::new(), Start::Incoming(&tx)));
            let Ok(create) = create else {
                return;
            };
            let relayed = rx
                .recv_timeout(SOCKET_WAIT)
                .map_err(|_| "its VMM did not start".to_string())
                .and_then(|sock| connect(&sock))
                .and_then(|vmm| relay_destination(&mut src, vmm));
            match (relayed, create.join()) {
                (Ok(()), Ok(Ok(created))) => {
                    if req.paused {
                        if let Some(l) = lock(&me.live).get_mut(&created.domain.id) {
                            l.paused = true;
                        }
                    }
                }
                (r, c) => {
                    let why = match (r, c) {
                        (_, Ok(Err(e))) => e.to_string(),
                        (Err(e), _) => e,
                        _ => "the create thread panicked".into(),
                    };
                    me.log_domain(&name, true, &format!("taking {name} failed: {why}"));
                    // The source goes on with the domain (if it still
                    // listens).
                    let _ = stream::write_abort(&mut src, &why).and_then(|()| src.flush());
                }
            }
        }))
    }
}

/// Connects to the incoming VMM's socket once it is there.
fn connect(sock: &std::path::Path) -> std::result::Result<UnixStream, String> {
    let until = Instant::now() + SOCKET_WAIT;
    loop {
        match UnixStream::connect(sock) {
            Ok(s) => return Ok(s),
            Err(_) if Instant::now() < until => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("{}: {e}", sock.display())),
        }
    }
}

/// Relays frames from the source VMM to the destination until the state
/// (or an abort) has gone, then the destination's answer back. Returns
/// the downtime as the relay saw it: from the last round to `Running`.
fn relay_source(
    mut vmm: Box<dyn Duplex>,
    mut dest: Box<dyn Duplex>,
    status: &Mutex<MigrationStatus>,
) -> std::result::Result<Duration, String> {
    let e = |e: stream::StreamError| e.to_string();
    vmm.set_read_timeout(Some(IDLE))
        .map_err(|e| e.to_string())?;
    dest.set_read_timeout(Some(IDLE))
        .map_err(|e| e.to_string())?;
    let mut last_round = Instant::now();
    let mut w = std::io::BufWriter::with_capacity(1 << 20, &mut dest);
    loop {
        let (kind, payload) = stream::read_raw(&mut vmm).map_err(e)?;
        let end = kind == stream::STATE || kind == stream::ABORT;
        if kind == stream::ROUND {
            if let Ok(r) = serde_json::from_slice::<Round>(&payload) {
                let mut s = lock(status);
                s.rounds = r.round;
                s.bytes_sent += r.bytes;
                s.dirty_pages = r.dirty_pages;
                if r.seconds > 0.0 {
                    s.mib_per_s = r.bytes as f64 / r.seconds / f64::from(1 << 20);
                }
                s.expected_downtime_ms = r.expected_downtime_ms;
            }
            last_round = Instant::now();
        } else if kind == stream::STATE {
            lock(status).state = MigrationState::Stopped;
        }
        let sent = stream::write_raw(&mut w, kind, &payload).and_then(|()| {
            if kind == stream::ROUND || end {
                w.flush()
            } else {
                Ok(())
            }
        });
        if let Err(e) = sent {
            // The destination hung up: it may have said why first.
            drop(w);
            let _ = dest.set_read_timeout(Some(Duration::from_secs(2)));
            return Err(match stream::read_raw(&mut dest) {
                Ok((stream::ABORT, why)) => {
                    format!("the destination gave up: {}", String::from_utf8_lossy(&why))
                }
                _ => format!("the destination: {e}"),
            });
        }
        if kind == stream::ABORT {
            return Err(String::from_utf8_lossy(&payload).into_owned());
        }
        if end {
            break;
        }
    }
    drop(w);
    let (kind, payload) = stream::read_raw(&mut dest).map_err(e)?;
    stream::write_raw(&mut vmm, kind, &payload)
        .and_then(|()| vmm.flush())
        .map_err(|e| format!("telling the VMM: {e}"))?;
    match stream::parse(kind, payload) {
        Ok(stream::Frame::Running) => Ok(last_round.elapsed()),
        Ok(_) => Err("the destination answered out of turn".into()),
        Err(e) => Err(format!("the destination: {e}")),
    }
}

/// Relays frames from the source daemon to the incoming VMM until the
/// state (or an abort) has gone, then the VMM's answer back.
fn relay_destination(
    src: &mut Box<dyn Duplex>,
    vmm: UnixStream,
) -> std::result::Result<(), String> {
    let e = |e: stream::StreamError| e.to_string();
    src.set_read_timeout(Some(IDLE))
        .map_err(|e| e.to_string())?;
    vmm.set_read_timeout(Some(IDLE))
        .map_err(|e| e.to_string())?;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, &vmm);
    loop {
        let (kind, payload) = stream::read_raw(src).map_err(e)?;
        stream::write_raw(&mut w, kind, &payload).map_err(|e| e.to_string())?;
        if kind == stream::ABORT {
            let _ = w.flush();
            return Err(format!(
                "the source gave up: {}",
                String::from_utf8_lossy(&payload)
            ));
        }
        if kind == stream::STATE {
            break;
        }
    }
    w.flush().map_err(|e| e.to_string())?;
    drop(w);
    let (kind, payload) = stream::read_raw(&mut &vmm).map_err(e)?;
    stream::write_raw(src, kind, &payload)
        .and_then(|()| src.flush())
        .map_err(|e| format!("telling the source: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// One end of a socket pair, as a handed-over connection.
    struct Sock(UnixStream);

    impl Read for Sock {
        fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
            self.0.read(b)
        }
    }

    impl Write for Sock {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.write(b)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Duplex for Sock {
        fn set_read_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
            self.0.set_read_timeout(t)
        }
    }

    fn pair() -> (UnixStream, Box<dyn Duplex>) {
        let (a, b) = UnixStream::pair().unwrap();
        (a, Box::new(Sock(b)))
    }

    #[test]
    fn the_source_relay_shows_the_rounds_and_passes_the_answer_back() {
        let (mut vmm, vmm_end) = pair();
        let (mut dest, dest_end) = pair();
        let status = Arc::new(Mutex::new(MigrationStatus::default()));
        let st = status.clone();
        let relay = std::thread::spawn(move || relay_source(vmm_end, dest_end, &st));
        stream::write_hello(&mut vmm, &[(0, 1 << 20)]).unwrap();
        let round = Round {
            round: 1,
            pages: 512,
            bytes: 2 << 20,
            seconds: 1.0,
            dirty_pages: 5,
            expected_downtime_ms: 3.0,
        };
        stream::write_round(&mut vmm, &round).unwrap();
        stream::write_state(&mut vmm, b"state").unwrap();
        // The destination gets the frames as sent, and answers.
        assert!(matches!(
            stream::read_frame(&mut dest),
            Ok(stream::Frame::Hello(_))
        ));
        assert_eq!(
            stream::read_frame(&mut dest).unwrap(),
            stream::Frame::Round(round)
        );
        assert_eq!(
            stream::read_frame(&mut dest).unwrap(),
            stream::Frame::State(b"state".to_vec())
        );
        stream::write_running(&mut dest).unwrap();
        assert_eq!(
            stream::read_frame(&mut vmm).unwrap(),
            stream::Frame::Running
        );
        assert!(relay.join().unwrap().is_ok());
        let s = lock(&status).clone();
        assert_eq!((s.rounds, s.bytes_sent, s.dirty_pages), (1, 2 << 20, 5));
        assert_eq!((s.mib_per_s, s.expected_downtime_ms), (2.0, 3.0));
        assert_eq!(s.state, MigrationState::Stopped);
    }

    #[test]
    fn an_abort_goes_through_either_way_and_fails_the_relay() {
        // The source VMM gives up.
        let (mut vmm, vmm_end) = pair();
        let (mut dest, dest_end) = pair();
        let status = Mutex::new(MigrationStatus::default());
        let relay = std::thread::spawn(move || relay_source(vmm_end, dest_end, &status));
        stream::write_abort(&mut vmm, "cancelled").unwrap();
        assert!(matches!(
            stream::read_frame(&mut dest),
            Err(stream::StreamError::Aborted(m)) if m == "cancelled"
        ));
        assert_eq!(relay.join().unwrap().unwrap_err(), "cancelled");

        // The destination gives up after the state: the VMM hears it.
        let (mut vmm, vmm_end) = pair();
        let (mut dest, dest_end) = pair();
        let status = Mutex::new(MigrationStatus::default());
        let relay = std::thread::spawn(move || relay_source(vmm_end, dest_end, &status));
        stream::write_state(&mut vmm, b"s").unwrap();
        let _ = stream::read_frame(&mut dest).unwrap();
        stream::write_abort(&mut dest, "disk missing").unwrap();
        assert!(matches!(
            stream::read_frame(&mut vmm),
            Err(stream::StreamError::Aborted(m)) if m == "disk missing"
        ));
        assert!(relay.join().unwrap().unwrap_err().contains("disk missing"));

        // The source daemon goes away: the destination's relay fails.
        let (src, mut src_end) = pair();
        let (vmm, mut vmm_end) = UnixStream::pair().unwrap();
        let relay = std::thread::spawn(move || relay_destination(&mut src_end, vmm));
        let mut src = src;
        stream::write_hello(&mut src, &[(0, 1 << 20)]).unwrap();
        drop(src);
        assert!(matches!(
            stream::read_frame(&mut vmm_end),
            Ok(stream::Frame::Hello(_))
        ));
        assert!(relay.join().unwrap().is_err());
    }

    #[test]
    fn the_destination_relay_passes_the_stream_and_the_answer() {
        let (mut src, mut src_end) = pair();
        let (mut vmm, vmm_end) = UnixStream::pair().unwrap();
        let relay = std::thread::spawn(move || relay_destination(&mut src_end, vmm_end));
        stream::write_pages(&mut src, 0x1000, &[3; 4096]).unwrap();
        stream::write_state(&mut src, b"s").unwrap();
        assert_eq!(
            stream::read_frame(&mut vmm).unwrap(),
            stream::Frame::Pages {
                gpa: 0x1000,
                data: vec![3; 4096]
            }
        );
        assert_eq!(
            stream::read_frame(&mut vmm).unwrap(),
            stream::Frame::State(b"s".to_vec())
        );
        stream::write_running(&mut vmm).unwrap();
        assert_eq!(
            stream::read_frame(&mut src).unwrap(),
            stream::Frame::Running
        );
        assert!(relay.join().unwrap().is_ok());
    }
}
