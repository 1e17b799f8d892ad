//! A typed client of the per-domain VMM API, over domus-http's Unix-socket
//! client: each route is one method that sends a typed body and decodes a
//! typed answer.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::vmm::{
    BalloonInfo, BalloonTarget, DeviceInfo, DomainInfo, PlugRequest, Pressed, RateLimitUpdate,
    Unplugging,
};
use crate::ErrorBody;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The socket could not be reached or the exchange failed.
    #[error("the API at {socket}: {source}")]
    Transport {
        socket: String,
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

/// The API of one VMM, at its Unix socket.
#[derive(Clone, Debug)]
pub struct VmmClient {
    socket: PathBuf,
    timeout: Duration,
}

impl VmmClient {
    /// A client that waits up to 30 s for each answer.
    pub fn new(socket: impl AsRef<Path>) -> Self {
        Self {
            socket: socket.as_ref().to_path_buf(),
            timeout: Duration::from_secs(30),
        }
    }

    /// The same client, waiting at most `timeout` for each answer.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, ClientError> {
        let body =
            body.map(serde_json::to_string)
                .transpose()
                .map_err(|e| ClientError::Decode {
                    method: method.into(),
                    path: path.into(),
                    reason: e.to_string(),
                })?;
        let (status, text) =
            domus_http::request_within(&self.socket, method, path, body.as_deref(), self.timeout)
                .map_err(|source| ClientError::Transport {
                socket: self.socket.display().to_string(),
                source,
            })?;
        if status >= 400 {
            let message = serde_json::from_str::<ErrorBody>(&text)
                .map(|e| e.error)
                .unwrap_or(text);
            return Err(ClientError::Api { status, message });
        }
        serde_json::from_str(&text).map_err(|e| ClientError::Decode {
            method: method.into(),
            path: path.into(),
            reason: e.to_string(),
        })
    }

    pub fn domain(&self) -> Result<DomainInfo, ClientError> {
        self.call::<(), _>("GET", "/v1/domain", None)
    }

    pub fn pause(&self) -> Result<DomainInfo, ClientError> {
        self.call::<(), _>("PUT", "/v1/domain/pause", None)
    }

    pub fn resume(&self) -> Result<DomainInfo, ClientError> {
        self.call::<(), _>("PUT", "/v1/domain/resume", None)
    }

    /// Presses the ACPI power button (the guest decides what to do).
    pub fn power_button(&self) -> Result<Pressed, ClientError> {
        self.call::<(), _>("PUT", "/v1/domain/power-button", None)
    }

    pub fn devices(&self) -> Result<Vec<DeviceInfo>, ClientError> {
        self.call::<(), _>("GET", "/v1/devices", None)
    }

    pub fn device(&self, id: &str) -> Result<DeviceInfo, ClientError> {
        self.call::<(), _>("GET", &format!("/v1/devices/{id}"), None)
    }

    /// Hot-plugs a disk or an interface; the answer names it.
    pub fn plug(&self, what: &PlugRequest) -> Result<DeviceInfo, ClientError> {
        self.call("POST", "/v1/devices", Some(what))
    }

    /// Asks the guest to let go of a disk or an interface.
    pub fn unplug(&self, id: &str) -> Result<Unplugging, ClientError> {
        self.call::<(), _>("DELETE", &format!("/v1/devices/{id}"), None)
    }

    pub fn set_rate_limit(
        &self,
        id: &str,
        update: &RateLimitUpdate,
    ) -> Result<DeviceInfo, ClientError> {
        self.call("PUT", &format!("/v1/devices/{id}/rate-limit"), Some(update))
    }

    pub fn balloon(&self) -> Result<BalloonInfo, ClientError> {
        self.call::<(), _>("GET", "/v1/balloon", None)
    }

    /// Asks the guest to keep `target_mib` of its memory.
    pub fn set_balloon(&self, target_mib: u64) -> Result<BalloonInfo, ClientError> {
        self.call("PUT", "/v1/balloon", Some(&BalloonTarget { target_mib }))
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
                Response::json(
                    201,
                    format!(
                        r#"{{"id":"vdb","type":"block","info":{{"path":{:?}}},"counters":{{}},"rate_limit":null}}"#,
                        p.disk.unwrap_or_default()
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
                disk: Some("/img/b".into()),
                net: None,
            })
            .unwrap();
        assert_eq!(
            (plugged.id.as_str(), plugged.kind.as_str()),
            ("vdb", "block")
        );
        assert_eq!(plugged.info["path"], "/img/b");
        let gone = VmmClient::new(dir.join("nothing.sock"))
            .domain()
            .unwrap_err();
        assert!(matches!(gone, ClientError::Transport { .. }), "{gone}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
