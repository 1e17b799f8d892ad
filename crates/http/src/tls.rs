//! TLS for the daemon's TCP API, with rustls (ring): the server's
//! certificate and key (a self-signed pair made on first start), its
//! SHA-256 fingerprint, a TLS server on [`crate::accept_loop`], and a client
//! that verifies the server by that fingerprint or by a CA file. There is
//! no plain-TCP mode: the bearer token never travels in clear.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    ClientConfig, ClientConnection, DigitallySignedStruct, ServerConfig, ServerConnection,
};

use crate::{accept_loop, connect_tcp, exchange, serve_connection, Handler, HttpError, Policy};

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn tls_error(what: impl std::fmt::Display) -> HttpError {
    HttpError::Tls(what.to_string())
}

/// A certificate's fingerprint as `SHA256:AB:CD:...` (what `domus info`
/// shows and `DOMUS_TLS_FINGERPRINT` gives).
pub fn fingerprint(cert_der: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, cert_der);
    let hex: Vec<String> = d.as_ref().iter().map(|b| format!("{b:02X}")).collect();
    format!("SHA256:{}", hex.join(":"))
}

/// Two fingerprints are the same one, whatever their case, colons or
/// `SHA256:` prefix.
fn same_fingerprint(a: &str, b: &str) -> bool {
    let norm = |s: &str| -> String {
        let s = s.trim();
        let s = s
            .strip_prefix("SHA256:")
            .or_else(|| s.strip_prefix("sha256:"))
            .unwrap_or(s);
        s.chars()
            .filter(|c| *c != ':')
            .collect::<String>()
            .to_ascii_uppercase()
    };
    let (a, b) = (norm(a), norm(b));
    a.len() == 64 && a == b
}

/// The server's side: its configuration and certificate fingerprint.
#[derive(Clone)]
pub struct Identity {
    pub config: Arc<ServerConfig>,
    pub fingerprint: String,
    /// Whether the pair was made now (first start).
    pub made: bool,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Identity({})", self.fingerprint)
    }
}

/// Loads the certificate and key at `cert` and `key` (PEM), or makes a
/// self-signed pair for `names` there when neither exists. The key must be
/// readable by its owner only.
pub fn load_or_make(cert: &Path, key: &Path, names: &[String]) -> Result<Identity, HttpError> {
    let made = match (cert.exists(), key.exists()) {
        (true, true) => false,
        (false, false) => {
            make(cert, key, names)?;
            true
        }
        (true, false) => {
            return Err(tls_error(format!(
                "{} has no key {}",
                cert.display(),
                key.display()
            )))
        }
        (false, true) => {
            return Err(tls_error(format!(
                "{} has no certificate {}",
                key.display(),
                cert.display()
            )))
        }
    };
    let mode = std::fs::metadata(key)
        .map_err(|e| tls_error(format!("{}: {e}", key.display())))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(tls_error(format!(
            "{}: a private key others can read (mode {:o}); chmod 600 it",
            key.display(),
            mode & 0o777
        )));
    }
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect())
        .map_err(|e| tls_error(format!("{}: {e}", cert.display())))?;
    let first = chain
        .first()
        .ok_or_else(|| tls_error(format!("{}: no certificate in it", cert.display())))?;
    let fp = fingerprint(first);
    let key_der = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| tls_error(format!("{}: {e}", key.display())))?;
    let config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(tls_error)?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .map_err(|e| tls_error(format!("{} and {}: {e}", cert.display(), key.display())))?;
    Ok(Identity {
        config: Arc::new(config),
        fingerprint: fp,
        made,
    })
}

/// A self-signed certificate for `names`, its key 0600 (made new: an
/// existing file is never overwritten).
fn make(cert: &Path, key: &Path, names: &[String]) -> Result<(), HttpError> {
    let pair = rcgen::generate_simple_self_signed(names.to_vec()).map_err(tls_error)?;
    let write = |path: &Path, mode: u32, text: &str| {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(path)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()
    };
    write(key, 0o600, &pair.key_pair.serialize_pem())
        .and_then(|()| write(cert, 0o644, &pair.cert.pem()))
        .map_err(|e| {
            tls_error(format!(
                "making {} and {}: {e}",
                cert.display(),
                key.display()
            ))
        })
}

/// A TLS connection the server closes with close_notify, so the client
/// knows the answer is whole.
struct Closing(rustls::StreamOwned<ServerConnection, TcpStream>);

impl Read for Closing {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for Closing {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

impl Drop for Closing {
    fn drop(&mut self) {
        self.0.conn.send_close_notify();
        let _ = self.0.conn.complete_io(&mut self.0.sock);
    }
}

/// Serves TLS on `listener` by `policy` (the handshake counts against the
/// request's deadline).
pub fn spawn_tls_server(
    name: &str,
    listener: TcpListener,
    identity: &Identity,
    policy: Policy,
    handler: Handler,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let config = identity.config.clone();
    accept_loop(
        name,
        move || listener.accept().map(|(s, _)| s),
        policy,
        move |s: TcpStream, p: &Policy, h: &Handler| {
            let (Ok(timer), Ok(conn)) = (s.try_clone(), ServerConnection::new(config.clone()))
            else {
                return;
            };
            serve_connection(Closing(rustls::StreamOwned::new(conn, s)), timer, p, &**h);
        },
        handler,
    )
}

/// How a client knows it reached the real server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verify {
    /// The server's certificate has this SHA-256 fingerprint.
    Fingerprint(String),
    /// The server's certificate chains to a CA in this PEM file and names
    /// the host the client connects to.
    CaFile(PathBuf),
}

/// Accepts exactly one certificate, by fingerprint (signatures are still
/// checked, so the server must hold its key).
#[derive(Debug)]
struct Pinned {
    fingerprint: String,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let got = fingerprint(end_entity);
        if same_fingerprint(&got, &self.fingerprint) {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(format!(
                "the server's certificate is {got}, not the expected {}",
                self.fingerprint
            )))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

fn client_config(verify: &Verify) -> Result<ClientConfig, HttpError> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(tls_error)?;
    let config = match verify {
        Verify::Fingerprint(fp) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Pinned {
                fingerprint: fp.clone(),
                provider: provider(),
            }))
            .with_no_client_auth(),
        Verify::CaFile(file) => {
            let mut roots = rustls::RootCertStore::empty();
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(file)
                .and_then(|it| it.collect())
                .map_err(|e| tls_error(format!("{}: {e}", file.display())))?;
            for c in certs {
                roots
                    .add(c)
                    .map_err(|e| tls_error(format!("{}: {e}", file.display())))?;
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
    };
    Ok(config)
}

/// The host part of `host:port` (an IPv6 address in brackets without them).
pub fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// [`crate::tcp_request`] over TLS, the server verified by `verify`.
pub fn tls_request(
    addr: &str,
    verify: &Verify,
    token: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
    timeout: Duration,
) -> Result<(u16, String), HttpError> {
    exchange(
        connect(addr, verify, timeout)?,
        method,
        path,
        body,
        Some(token),
    )
}

/// A TLS connection to `addr`, the server verified by `verify`, whose
/// reads and writes wait `timeout` at most.
fn connect(
    addr: &str,
    verify: &Verify,
    timeout: Duration,
) -> Result<rustls::StreamOwned<ClientConnection, TcpStream>, HttpError> {
    let config = Arc::new(client_config(verify)?);
    let name = ServerName::try_from(host_of(addr).to_string())
        .map_err(|e| tls_error(format!("{addr}: {e}")))?;
    let conn = ClientConnection::new(config, name).map_err(tls_error)?;
    Ok(rustls::StreamOwned::new(conn, connect_tcp(addr, timeout)?))
}

/// [`tls_request`], the connection handed over when the answer's status
/// is `want` (see [`crate::upgrade`]).
#[allow(clippy::too_many_arguments)]
pub fn tls_upgrade(
    addr: &str,
    verify: &Verify,
    token: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
    want: u16,
    timeout: Duration,
) -> Result<crate::upgrade::Answer, HttpError> {
    let s = connect(addr, verify, timeout)?;
    let timer = s.sock.try_clone()?;
    let req = crate::request_bytes(method, path, body, Some(token));
    crate::upgrade::upgrade_request(s, timer, &req, want)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Request, Response};

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("domus-tls-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn fingerprints_compare_by_their_bytes() {
        let fp = fingerprint(b"x");
        assert!(fp.starts_with("SHA256:") && fp.len() == 7 + 64 + 31, "{fp}");
        assert!(same_fingerprint(&fp, &fp.to_lowercase()));
        assert!(same_fingerprint(&fp, &fp[7..].replace(':', "")));
        assert!(!same_fingerprint(&fp, &fingerprint(b"y")));
        assert!(!same_fingerprint("", ""));
        assert_eq!(host_of("10.0.0.1:7000"), "10.0.0.1");
        assert_eq!(host_of("[::1]:7000"), "::1");
    }

    #[test]
    fn a_pair_is_made_once_and_a_readable_key_is_refused() {
        let d = scratch("pair");
        let (cert, key) = (d.join("tls/cert.pem"), d.join("tls/key.pem"));
        let names = ["localhost".to_string()];
        let a = load_or_make(&cert, &key, &names).unwrap();
        assert!(a.made);
        let mode = std::fs::metadata(&key).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let b = load_or_make(&cert, &key, &names).unwrap();
        assert!(!b.made);
        assert_eq!(a.fingerprint, b.fingerprint, "the same pair, kept");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = load_or_make(&cert, &key, &names).unwrap_err();
        assert!(e.to_string().contains("others can read"), "{e}");
        std::fs::remove_file(&key).unwrap();
        assert!(
            load_or_make(&cert, &key, &names).is_err(),
            "a certificate without its key"
        );
        let _ = std::fs::remove_dir_all(d);
    }

    #[test]
    fn clients_reach_the_server_only_when_they_verify_it() {
        let d = scratch("serve");
        let names = ["localhost".to_string()];
        let id = load_or_make(&d.join("c.pem"), &d.join("k.pem"), &names).unwrap();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let h: Handler =
            Arc::new(|r: &Request| Response::json(200, format!("{{\"n\":{}}}", r.body.len())));
        spawn_tls_server("test-tls", l, &id, Policy::default(), h).unwrap();
        let t = Duration::from_secs(5);
        let by_ip = format!("127.0.0.1:{port}");
        let pinned = Verify::Fingerprint(id.fingerprint.clone());
        let (s, b) = tls_request(&by_ip, &pinned, "t", "PUT", "/", Some("{}"), t).unwrap();
        assert_eq!((s, b.as_str()), (200, "{\"n\":2}"));
        // Another certificate's fingerprint: refused, saying both.
        let other = Verify::Fingerprint(fingerprint(b"another"));
        let e = tls_request(&by_ip, &other, "t", "GET", "/", None, t).unwrap_err();
        assert!(e.to_string().contains("not the expected"), "{e}");
        // The self-signed certificate as its own CA, by the name it carries.
        let ca = Verify::CaFile(d.join("c.pem"));
        let by_name = format!("localhost:{port}");
        assert_eq!(
            tls_request(&by_name, &ca, "t", "GET", "/", None, t)
                .unwrap()
                .0,
            200
        );
        assert!(
            tls_request(&by_ip, &ca, "t", "GET", "/", None, t).is_err(),
            "a name it does not carry"
        );
        // A plain-HTTP client gets no answer.
        assert!(crate::tcp_request(&by_ip, "t", "GET", "/", None, t).is_err());
        let _ = std::fs::remove_dir_all(d);
    }
}
