//! The contract of Domus's control plane: one serde type for each request
//! and response body of its REST APIs, shared by the servers, their clients
//! and the tests. Every type refuses fields it does not know
//! (`deny_unknown_fields`), so a misspelt field is a 400 naming it, never a
//! silently ignored one.
//!
//! - [`vmm`]: the per-domain API a VMM serves (`domus run --api-socket`),
//!   documented in `api/domain.openapi.json`.
//! - [`client`]: a typed client of that API ([`client::VmmClient`]).
//! - [`daemon`]: the daemon's API (`domusd.sock`), documented in
//!   `api/daemon.openapi.json`, and its typed client
//!   ([`client::DaemonClient`]).
//! - [`domain`]: a domain's configuration as the daemon stores it
//!   ([`domain::DomainConfig`], parsed from xl.cfg by `domus-xlcfg`).
//! - [`spec`]: what a domain is made of ([`spec::VmSpec`], which
//!   `domus run --config` reads), its disks and interfaces, in JSON or in
//!   the command-line syntax, parsed and checked once.
//! - [`cpuid`]: CPUID bits a domain's configuration forces (xl's
//!   `cpuid = [...]`, the xend form).
//! - [`snapshot`]: the snapshot file's envelope and the checks made
//!   before it is trusted.
//! - [`migration`]: the live-migration stream between a source and a
//!   destination VMM, which the daemons relay (docs/migration.md).
//! - [`rings`]: the virtio queues' state a VMM reports for a stalled
//!   guest (`GET /v1/domain/rings`), and what it says.
//! - [`openapi`]: checks of both documents' schemas against these types.

pub mod client;
pub mod cpuid;
pub mod daemon;
pub mod domain;
pub mod image;
pub mod migration;
pub mod openapi;
pub mod rings;
pub mod snapshot;
pub mod spec;
pub mod vmm;

use serde::de::DeserializeOwned;

/// The body of every 4xx and 5xx answer: `{"error": "..."}`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorBody {
    pub error: String,
}

/// Parses a request body into `T`. The error is the message for a 400: an
/// empty body, bad JSON, a missing field, a wrong type or an unknown field,
/// each named.
pub fn parse_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err("a JSON object body is required".into());
    }
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("body is not valid JSON: {e}"))?;
    // serde would take a struct from an array of its fields, in order.
    if !v.is_object() {
        return Err("body must be a JSON object".into());
    }
    serde_json::from_value(v).map_err(|e| format!("bad request body: {e}"))
}

/// A server's request body of type `T`, or the 400 answer naming what is
/// wrong with it.
pub fn request_body<T: DeserializeOwned>(
    req: &domus_http::Request,
) -> Result<T, domus_http::Response> {
    parse_body(&req.body).map_err(|e| domus_http::Response::error(400, &e))
}
