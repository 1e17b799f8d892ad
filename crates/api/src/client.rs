//! Typed clients of Domus's two APIs, over domus-http: [`VmmClient`] for
//! a VMM's own API (its Unix socket) and [`DaemonClient`] for the daemon's
//! (its Unix socket, or TCP with a bearer token). Each route is one method
//! that sends a typed body and decodes a typed answer.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::daemon::{
    AttachRequest, CloneRequest, Cloned, ConsoleChunk, CreateRequest, Created, DetachRequest,
    Domain, HostSched, HostSchedRequest, Info, LogLine, Maxmem, MaxmemRequest, MemoryRequest,
    MigrateRequest, NameOrNumber, PinRequest, RenameRequest, RestoreRequest, SaveRequest, Saved,
    Sched, SchedRequest, Vcpu,
};
use crate::vmm::{
    BalloonInfo, BalloonTarget, ConsoleInput, ConsoleTaken, DeviceInfo, DomainInfo,
    MigrationStatus, PlugRequest, Pressed, RateLimitUpdate, SnapshotInfo, SnapshotRequest,
    Unplugging, VcpuAffinity, VcpuPin,
};
use crate::ErrorBody;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The API could not be reached or the exchange failed.
    #[error("the API at {at}: {source}")]
    Transport {
        at: String,
        #[source]
        source: domus_http::HttpError,
    },
    /// The server answered with an error status and message.
    #[error("{message}")]
    Api { status: u16, message: String },
    /// The answer is not the body this route promises.
    #[error("{method} {path}: unexpected answer: {reason}")]
    Decode {
        method: String,
        path: String,
        reason: String,
    },
}

impl ClientError {
    /// The HTTP status of an error answer (404 for a device that is gone).
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// Where an API is served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// A Unix socket.
    Unix(PathBuf),
    /// TLS over TCP at host:port, the server verified by `verify`, each
    /// request carrying the bearer token.
    Tcp {
        addr: String,
        token: String,
        verify: domus_http::tls::Verify,
    },
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "{}", p.display()),
            Endpoint::Tcp { addr, .. } => write!(f, "tcp {addr}"),
        }
    }
}

/// One endpoint and how long to wait for each answer: what both clients
/// send their requests through.
#[derive(Clone, Debug)]
struct Conn {
    at: Endpoint,
    timeout: Duration,
}

impl Conn {
    /// Sends one request; the answer's text, or the server's error.
    fn text(&self, method: &str, path: &str, body: Option<&str>) -> Result<String, ClientError> {
        let answer = match &self.at {
            Endpoint::Unix(sock) => {
                domus_http::request_within(sock, method, path, body, self.timeout)
            }
            Endpoint::Tcp {
                addr,
                token,
                verify,
            } => {
                domus_http::tls::tls_request(addr, verify, token, method, path, body, self.timeout)
            }
        };
        let (status, text) = answer.map_err(|source| ClientError::Transport {
            at: self.at.to_string(),
            source,
        })?;
        if status >= 400 {
            let message = serde_json::from_str::<ErrorBody>(&text)
                .map(|e| e.error)
                .unwrap_or(text);
            return Err(ClientError::Api { status, message });
        }
        Ok(text)
    }

    /// Sends `body` (if any) as JSON and decodes the answer as `T`.
    fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, ClientError> {
        let decode = |reason: String| ClientError::Decode {
            method: method.into(),
            path: path.into(),
            reason,
        };
        let body = body
            .map(serde_json::to_string)
            .transpose()
            .map_err(|e| decode(e.to_string()))?;
        let text = self.text(method, path, body.as_deref())?;
        serde_json::from_str(&text).map_err(|e| decode(e.to_string()))
    }
}

/// The API of one VMM, at its Unix socket.
#[derive(Clone, Debug)]
pub struct VmmClient {
    conn: Conn,
}

impl VmmClient {
    /// A client that waits up to 30 s for each answer.
    pub fn new(socket: impl AsRef<Path>) -> Self {
        Self {
            conn: Conn {
                at: Endpoint::Unix(socket.as_ref().to_path_buf()),
                timeout: Duration::from_secs(30),
            },
        }
    }

    /// The same client, waiting at most `timeout` for each answer.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.conn.timeout = timeout;
        self
    }

    pub fn domain(&self) -> Result<DomainInfo, ClientError> {
        self.conn.call::<(), _>("GET", "/v1/domain", None)
    }

    pub fn pause(&self) -> Result<DomainInfo, ClientError> {
        self.conn.call::<(), _>("PUT", "/v1/domain/pause", None)
    }

    pub fn resume(&self) -> Result<DomainInfo, ClientError> {
        self.conn.call::<(), _>("PUT", "/v1/domain/resume", None)
    }

    /// Pins one vCPU or all; the answer is every vCPU's affinity after.
    pub fn pin_vcpus(&self, pin: &VcpuPin) -> Result<Vec<VcpuAffinity>, ClientError> {
        self.conn.call("PUT", "/v1/domain/vcpu-pin", Some(pin))
    }

    /// Saves the domain (`PUT /v1/domain/snapshot`).
    pub fn snapshot(&self, req: &SnapshotRequest) -> Result<SnapshotInfo, ClientError> {
        self.conn.call("PUT", "/v1/domain/snapshot", Some(req))
    }

    /// Presses the ACPI power button (the guest decides what to do).
    pub fn power_button(&self) -> Result<Pressed, ClientError> {
        self.conn
            .call::<(), _>("PUT", "/v1/domain/power-button", None)
    }

    pub fn devices(&self) -> Result<Vec<DeviceInfo>, ClientError> {
        self.conn.call::<(), _>("GET", "/v1/devices", None)
    }

    /// Every virtio queue's rings, last interrupt and vector.
    pub fn rings(&self) -> Result<Vec<crate::rings::RingInfo>, ClientError> {
        self.conn.call::<(), _>("GET", "/v1/domain/rings", None)
    }

    /// Types `text` at the serial console.
    pub fn console_input(&self, text: &str) -> Result<ConsoleTaken, ClientError> {
        self.conn.call(
            "PUT",
            "/v1/domain/console",
            Some(&ConsoleInput {
                text: text.to_string(),
            }),
        )
    }

    pub fn device(&self, id: &str) -> Result<DeviceInfo, ClientError> {
        self.conn
            .call::<(), _>("GET", &format!("/v1/devices/{id}"), None)
    }

    /// Hot-plugs a disk or an interface; the answer names it.
    pub fn plug(&self, what: &PlugRequest) -> Result<DeviceInfo, ClientError> {
        self.conn.call("POST", "/v1/devices", Some(what))
    }

    /// Asks the guest to let go of a disk or an interface.
    pub fn unplug(&self, id: &str) -> Result<Unplugging, ClientError> {
        self.conn
            .call::<(), _>("DELETE", &format!("/v1/devices/{id}"), None)
    }

    pub fn set_rate_limit(
        &self,
        id: &str,
        update: &RateLimitUpdate,
    ) -> Result<DeviceInfo, ClientError> {
        self.conn
            .call("PUT", &format!("/v1/devices/{id}/rate-limit"), Some(update))
    }

    pub fn balloon(&self) -> Result<BalloonInfo, ClientError> {
        self.conn.call::<(), _>("GET", "/v1/balloon", None)
    }

    /// Asks the guest to keep `target_mib` of its memory.
    pub fn set_balloon(&self, target_mib: u64) -> Result<BalloonInfo, ClientError> {
        self.conn
            .call("PUT", "/v1/balloon", Some(&BalloonTarget { target_mib }))
    }
}

/// The daemon's API. Domains are named by name or id (`dom`).
#[derive(Clone, Debug)]
pub struct DaemonClient {
    conn: Conn,
}

/// How long the verbs that start or write domains wait for their answer
/// (create, save, restore, clone, migrate): the daemon bounds each of
/// their steps itself (a VMM's start, a guest's unplug), but together,
/// for many clones or a large save on a busy host, they can take minutes.
const LONG_TIMEOUT: Duration = Duration::from_secs(600);

impl DaemonClient {
    /// A client of the daemon at `at` that waits up to 30 s for each answer
    /// (the verbs that start or write domains up to [`LONG_TIMEOUT`]).
    pub fn new(at: Endpoint) -> Self {
        Self {
            conn: Conn {
                at,
                timeout: Duration::from_secs(30),
            },
        }
    }

    /// Where this client sends its requests.
    pub fn endpoint(&self) -> &Endpoint {
        &self.conn.at
    }

    fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.conn.call::<(), _>("GET", path, None)
    }

    fn put<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, ClientError> {
        self.conn.call("PUT", path, body)
    }

    pub fn info(&self) -> Result<Info, ClientError> {
        self.get("/v1/info")
    }

    /// The daemon's log, oldest line first.
    pub fn dmesg(&self) -> Result<Vec<LogLine>, ClientError> {
        self.get("/v1/dmesg")
    }

    /// Domain-0 (the host) and every domain.
    pub fn list(&self) -> Result<Vec<Domain>, ClientError> {
        self.get("/v1/domains")
    }

    pub fn domain(&self, dom: &str) -> Result<Domain, ClientError> {
        self.get(&format!("/v1/domains/{dom}"))
    }

    /// The connection for a verb that may take long ([`LONG_TIMEOUT`]).
    fn long(&self) -> Conn {
        Conn {
            timeout: self.conn.timeout.max(LONG_TIMEOUT),
            ..self.conn.clone()
        }
    }

    pub fn create(&self, req: &CreateRequest) -> Result<Created, ClientError> {
        self.long().call("POST", "/v1/domains", Some(req))
    }

    /// save: the domain into `req.file`; destroyed afterwards, or paused.
    pub fn save(&self, dom: &str, req: &SaveRequest) -> Result<Saved, ClientError> {
        self.long()
            .call("PUT", &format!("/v1/domains/{dom}/save"), Some(req))
    }

    /// clone: `req.count` domains started from the snapshot `req.file`.
    pub fn clone_snapshot(&self, req: &CloneRequest) -> Result<Cloned, ClientError> {
        self.long().call("POST", "/v1/clone", Some(req))
    }

    /// migrate: sends domain `dom` live to another daemon (the answer
    /// comes once both ends agreed).
    pub fn migrate(&self, dom: &str, req: &MigrateRequest) -> Result<MigrationStatus, ClientError> {
        self.long()
            .call("POST", &format!("/v1/domains/{dom}/migrate"), Some(req))
    }

    /// The last live migration of `dom` sent from this daemon.
    pub fn migration(&self, dom: &str) -> Result<MigrationStatus, ClientError> {
        self.conn
            .call::<(), _>("GET", &format!("/v1/domains/{dom}/migration"), None)
    }

    /// migrate --cancel.
    pub fn cancel_migration(&self, dom: &str) -> Result<MigrationStatus, ClientError> {
        self.conn
            .call::<(), _>("DELETE", &format!("/v1/domains/{dom}/migration"), None)
    }

    /// restore: the domain saved in `req.file`, started again.
    pub fn restore(&self, req: &RestoreRequest) -> Result<Created, ClientError> {
        self.long().call("POST", "/v1/restore", Some(req))
    }

    pub fn destroy(&self, dom: &str) -> Result<(), ClientError> {
        self.conn
            .text("DELETE", &format!("/v1/domains/{dom}"), None)
            .map(drop)
    }

    pub fn pause(&self, dom: &str) -> Result<Domain, ClientError> {
        self.put::<(), _>(&format!("/v1/domains/{dom}/pause"), None)
    }

    pub fn unpause(&self, dom: &str) -> Result<Domain, ClientError> {
        self.put::<(), _>(&format!("/v1/domains/{dom}/unpause"), None)
    }

    /// Presses the guest's power button; its on_poweroff applies once it
    /// has stopped.
    pub fn shutdown(&self, dom: &str) -> Result<Domain, ClientError> {
        self.put::<(), _>(&format!("/v1/domains/{dom}/shutdown"), None)
    }

    /// Presses the power button and treats the power-off as a reboot.
    pub fn reboot(&self, dom: &str) -> Result<Domain, ClientError> {
        self.put::<(), _>(&format!("/v1/domains/{dom}/reboot"), None)
    }

    /// mem-set: the memory the guest keeps (its balloon's target).
    pub fn set_memory(&self, dom: &str, target_mib: u64) -> Result<BalloonInfo, ClientError> {
        let body = MemoryRequest { target_mib };
        self.put(&format!("/v1/domains/{dom}/memory"), Some(&body))
    }

    pub fn set_maxmem(&self, dom: &str, maxmem_mib: u64) -> Result<Maxmem, ClientError> {
        let body = MaxmemRequest { maxmem_mib };
        self.put(&format!("/v1/domains/{dom}/maxmem"), Some(&body))
    }

    pub fn rename(&self, dom: &str, name: &str) -> Result<Domain, ClientError> {
        let body = RenameRequest { name: name.into() };
        self.put(&format!("/v1/domains/{dom}/name"), Some(&body))
    }

    /// A running domain's devices, as its VMM shows them.
    pub fn devices(&self, dom: &str) -> Result<Vec<DeviceInfo>, ClientError> {
        self.get(&format!("/v1/domains/{dom}/devices"))
    }

    /// block-attach (`disk`) or network-attach (`network`): an xl disk or
    /// vif spec.
    pub fn attach(
        &self,
        dom: &str,
        kind: Attach,
        spec: Option<&str>,
    ) -> Result<DeviceInfo, ClientError> {
        let body = AttachRequest {
            spec: spec.map(str::to_string),
        };
        let verb = kind.verb();
        self.put(&format!("/v1/domains/{dom}/{verb}-attach"), Some(&body))
    }

    /// block-detach (`vdb`) or network-detach (an index or a MAC address).
    pub fn detach(
        &self,
        dom: &str,
        kind: Attach,
        id: NameOrNumber,
    ) -> Result<Unplugging, ClientError> {
        let verb = kind.verb();
        let body = DetachRequest { id };
        self.put(&format!("/v1/domains/{dom}/{verb}-detach"), Some(&body))
    }

    pub fn vcpus(&self, dom: &str) -> Result<Vec<Vcpu>, ClientError> {
        self.get(&format!("/v1/domains/{dom}/vcpus"))
    }

    /// vcpu-pin; the answer is the domain's vCPUs after it.
    pub fn pin(&self, dom: &str, req: &PinRequest) -> Result<Vec<Vcpu>, ClientError> {
        self.put(&format!("/v1/domains/{dom}/vcpu-pin"), Some(req))
    }

    pub fn sched(&self, dom: &str) -> Result<Sched, ClientError> {
        self.get(&format!("/v1/domains/{dom}/sched"))
    }

    pub fn set_sched(&self, dom: &str, req: &SchedRequest) -> Result<Sched, ClientError> {
        self.put(&format!("/v1/domains/{dom}/sched"), Some(req))
    }

    /// The host-wide scheduler settings (`sched-credit -s`).
    pub fn host_sched(&self) -> Result<HostSched, ClientError> {
        self.get("/v1/sched")
    }

    pub fn set_host_sched(&self, req: &HostSchedRequest) -> Result<HostSched, ClientError> {
        self.put("/v1/sched", Some(req))
    }

    /// The next piece of a domain's console log (see [`ConsoleChunk`]):
    /// `file` and `from` as the previous answer's `file` and `next`.
    pub fn console(
        &self,
        dom: &str,
        file: Option<u64>,
        from: u64,
    ) -> Result<ConsoleChunk, ClientError> {
        let file = file.map(|f| format!("file={f}&")).unwrap_or_default();
        self.get(&format!("/v1/domains/{dom}/console?{file}from={from}"))
    }

    /// Types `text` at domain `dom`'s serial console.
    pub fn console_input(&self, dom: &str, text: &str) -> Result<ConsoleTaken, ClientError> {
        self.conn.call(
            "POST",
            &format!("/v1/domains/{dom}/console"),
            Some(&ConsoleInput {
                text: text.to_string(),
            }),
        )
    }

    /// Accounting in Prometheus' text format.
    pub fn metrics(&self) -> Result<String, ClientError> {
        self.conn.text("GET", "/metrics", None)
    }
}

/// What block and network attach and detach act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attach {
    Block,
    Network,
}

impl Attach {
    fn verb(self) -> &'static str {
        match self {
            Attach::Block => "block",
            Attach::Network => "network",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vmm::DomainState;
    use domus_http::{Request, Response};
    use std::sync::Arc;

    /// A stand-in VMM API: a domain, a 404 with the API's error body, a
    /// body that is not what the route promises, and an echo of the plug.
    fn serve(dir: &Path) -> PathBuf {
        let sock = dir.join("api.sock");
        let handler = |req: &Request| match (req.method.as_str(), req.path.as_str()) {
            ("GET", "/v1/domain") => Response::json(
                200,
                r#"{"name":"a","state":"paused","pid":1,"vcpus":2,"memory_mib":256,
                    "uptime_s":0.5,"vcpu_tids":[3,4],"devices":["vda"]}"#,
            ),
            ("GET", "/v1/balloon") => Response::json(200, r#"{"target_mib": "lots"}"#),
            ("POST", "/v1/devices") => {
                let p: PlugRequest = crate::parse_body(&req.body).unwrap_or_default();
                let path = p.disk.map(|d| d.path.display().to_string());
                Response::json(
                    201,
                    format!(
                        r#"{{"id":"vdb","type":"block","info":{{"path":{:?}}},"counters":{{}},"rate_limit":null}}"#,
                        path.unwrap_or_default()
                    ),
                )
            }
            _ => Response::error(404, "no device 'vdq'"),
        };
        let listener = domus_http::bind(&sock).unwrap();
        domus_http::spawn_server("test-api", listener, Arc::new(handler)).unwrap();
        sock
    }

    #[test]
    fn answers_decode_and_errors_carry_the_servers_message() {
        let dir = std::env::temp_dir().join(format!("domus-api-client-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let api = VmmClient::new(serve(&dir));
        let d = api.domain().unwrap();
        assert_eq!((d.state, d.vcpu_tids), (DomainState::Paused, vec![3, 4]));
        let e = api.device("vdq").unwrap_err();
        assert_eq!(e.status(), Some(404));
        assert_eq!(e.to_string(), "no device 'vdq'");
        let e = api.balloon().unwrap_err();
        assert!(matches!(e, ClientError::Decode { .. }), "{e}");
        let plugged = api
            .plug(&PlugRequest {
                disk: Some(crate::spec::DiskSpec {
                    path: "/img/b".into(),
                    ..Default::default()
                }),
                net: None,
            })
            .unwrap();
        assert_eq!(
            (plugged.id.as_str(), plugged.kind.as_str()),
            ("vdb", "block")
        );
        assert_eq!(plugged.fact("path"), "/img/b");
        let gone = VmmClient::new(dir.join("nothing.sock"))
            .domain()
            .unwrap_err();
        assert!(matches!(gone, ClientError::Transport { .. }), "{gone}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
