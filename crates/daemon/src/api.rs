//! The daemon's REST API (`domusd.sock`). Routes are listed once, in
//! [`ROUTES`], and checked against `api/daemon.openapi.json` by a test.

use domus_api::daemon::{
    AttachRequest, CloneRequest, CreateRequest, DetachRequest, HostSchedRequest, IncomingRequest,
    MaxmemRequest, MemoryRequest, MigrateRequest, PinRequest, RenameRequest, RestoreRequest,
    SaveRequest, SchedRequest,
};
use domus_api::request_body;
use domus_http::{Request, Response};
use serde::Serialize;

use crate::{Daemon, Error, Request as Stop};

pub const OPENAPI: &str = include_str!("../../../api/daemon.openapi.json");

pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/openapi.json"),
    ("GET", "/v1/info"),
    ("GET", "/v1/dmesg"),
    ("GET", "/v1/domains"),
    ("POST", "/v1/domains"),
    ("GET", "/v1/domains/{dom}"),
    ("DELETE", "/v1/domains/{dom}"),
    ("PUT", "/v1/domains/{dom}/pause"),
    ("PUT", "/v1/domains/{dom}/unpause"),
    ("PUT", "/v1/domains/{dom}/shutdown"),
    ("PUT", "/v1/domains/{dom}/reboot"),
    ("PUT", "/v1/domains/{dom}/memory"),
    ("PUT", "/v1/domains/{dom}/maxmem"),
    ("PUT", "/v1/domains/{dom}/name"),
    ("PUT", "/v1/domains/{dom}/save"),
    ("POST", "/v1/restore"),
    ("POST", "/v1/clone"),
    ("POST", "/v1/domains/{dom}/migrate"),
    ("GET", "/v1/domains/{dom}/migration"),
    ("DELETE", "/v1/domains/{dom}/migration"),
    ("POST", "/v1/migrations"),
    ("GET", "/v1/domains/{dom}/devices"),
    ("GET", "/v1/domains/{dom}/console"),
    ("POST", "/v1/domains/{dom}/console"),
    ("PUT", "/v1/domains/{dom}/block-attach"),
    ("PUT", "/v1/domains/{dom}/block-detach"),
    ("PUT", "/v1/domains/{dom}/network-attach"),
    ("PUT", "/v1/domains/{dom}/network-detach"),
    ("GET", "/v1/domains/{dom}/vcpus"),
    ("PUT", "/v1/domains/{dom}/vcpu-pin"),
    ("GET", "/v1/domains/{dom}/sched"),
    ("PUT", "/v1/domains/{dom}/sched"),
    ("GET", "/v1/sched"),
    ("PUT", "/v1/sched"),
    ("GET", "/metrics"),
];

/// A typed answer with `status`.
fn answer<T: Serialize>(status: u16, v: &T) -> Response {
    match serde_json::to_string(v) {
        Ok(body) => Response::json(status, body),
        Err(e) => Response::error(500, &format!("encoding the answer: {e}")),
    }
}

fn ok<T: Serialize>(v: T) -> Response {
    answer(200, &v)
}

fn err(e: &Error) -> Response {
    Response::error(e.status(), &e.to_string())
}

/// Finds the route for `method` and `path` in [`ROUTES`].
pub fn route<'a>(method: &str, path: &'a str) -> Result<(usize, Option<&'a str>), Response> {
    domus_http::route(ROUTES, method, path)
}

fn create(d: &Daemon, req: &Request) -> Result<Response, Response> {
    let c: CreateRequest = request_body(req)?;
    let file = c.file.as_deref().unwrap_or("config");
    let dir = c.dir.as_deref().unwrap_or("/");
    let overrides = c.overrides.unwrap_or_default();
    let text = c.config.as_str();
    let created = d.create(file, dir, text, &overrides).map_err(|e| err(&e))?;
    Ok(answer(201, &created))
}

/// The console route's query: `file=INODE` (optional) and `from=OFFSET`
/// (default 0); anything else is a 400.
fn console_query(req: &Request) -> Result<(Option<u64>, u64), Response> {
    let (mut file, mut from) = (None, 0);
    for pair in req.query.as_deref().unwrap_or("").split('&') {
        if pair.is_empty() {
            continue;
        }
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let n: u64 = v.parse().map_err(|_| {
            Response::error(400, &format!("'{k}' must be a whole number, not '{v}'"))
        })?;
        match k {
            "file" => file = Some(n),
            "from" => from = n,
            _ => {
                return Err(Response::error(
                    400,
                    &format!("unknown query parameter '{k}'"),
                ))
            }
        }
    }
    Ok((file, from))
}

pub fn handle(d: &std::sync::Arc<Daemon>, req: &Request) -> Response {
    let (i, dom) = match route(&req.method, &req.path) {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    let dom = dom.unwrap_or_default();
    let r: Result<Response, Response> = match (ROUTES[i].0, ROUTES[i].1) {
        (_, "/openapi.json") => Ok(Response::json(200, OPENAPI)),
        (_, "/v1/info") => Ok(ok(d.info())),
        (_, "/v1/dmesg") => d.dmesg().map(ok).map_err(|e| err(&e)),
        ("GET", "/v1/domains") => d.list().map(ok).map_err(|e| err(&e)),
        ("POST", "/v1/domains") => create(d, req),
        ("GET", "/v1/domains/{dom}") => {
            d.find(dom).map(|r| ok(d.describe(&r))).map_err(|e| err(&e))
        }
        ("DELETE", "/v1/domains/{dom}") => d
            .destroy(dom)
            .map(|()| Response::no_content())
            .map_err(|e| err(&e)),
        (_, "/v1/domains/{dom}/pause") => d
            .pause(dom, true)
            .and_then(|()| d.find(dom))
            .map(|r| ok(d.describe(&r)))
            .map_err(|e| err(&e)),
        (_, "/v1/domains/{dom}/unpause") => d
            .pause(dom, false)
            .and_then(|()| d.find(dom))
            .map(|r| ok(d.describe(&r)))
            .map_err(|e| err(&e)),
        (_, "/v1/domains/{dom}/shutdown" | "/v1/domains/{dom}/reboot") => {
            let what = if ROUTES[i].1.ends_with("reboot") {
                Stop::Reboot
            } else {
                Stop::PowerOff
            };
            d.shutdown(dom, what)
                .and_then(|()| d.find(dom))
                .map(|r| answer(202, &d.describe(&r)))
                .map_err(|e| err(&e))
        }
        (_, "/v1/domains/{dom}/maxmem") => request_body::<MaxmemRequest>(req)
            .and_then(|m| d.mem_max(dom, m.maxmem_mib).map(ok).map_err(|e| err(&e))),
        (_, "/v1/domains/{dom}/memory") => request_body::<MemoryRequest>(req)
            .and_then(|m| d.mem_set(dom, m.target_mib).map(ok).map_err(|e| err(&e))),
        (_, "/v1/domains/{dom}/name") => request_body::<RenameRequest>(req).and_then(|m| {
            d.rename(dom, &m.name)
                .and_then(|()| d.find(&m.name))
                .map(|r| ok(d.describe(&r)))
                .map_err(|e| err(&e))
        }),
        (_, "/v1/domains/{dom}/save") => request_body::<SaveRequest>(req)
            .and_then(|m| d.save(dom, &m).map(ok).map_err(|e| err(&e))),
        (_, "/v1/restore") => request_body::<RestoreRequest>(req)
            .and_then(|m| d.restore(&m).map(|c| answer(201, &c)).map_err(|e| err(&e))),
        (_, "/v1/clone") => request_body::<CloneRequest>(req).and_then(|m| {
            d.clone_snapshot(&m)
                .map(|c| answer(201, &c))
                .map_err(|e| err(&e))
        }),
        (_, "/v1/domains/{dom}/migrate") => request_body::<MigrateRequest>(req)
            .and_then(|m| d.migrate(dom, &m).map(ok).map_err(|e| err(&e))),
        ("GET", "/v1/domains/{dom}/migration") => d.migration(dom).map(ok).map_err(|e| err(&e)),
        ("DELETE", "/v1/domains/{dom}/migration") => {
            d.cancel_migration(dom).map(ok).map_err(|e| err(&e))
        }
        (_, "/v1/migrations") => {
            request_body::<IncomingRequest>(req).and_then(|m| d.incoming(m).map_err(|e| err(&e)))
        }
        ("POST", "/v1/domains/{dom}/console") => request_body::<domus_api::vmm::ConsoleInput>(req)
            .and_then(|m| d.console_input(dom, &m.text).map(ok).map_err(|e| err(&e))),
        (_, "/v1/domains/{dom}/console") => console_query(req)
            .and_then(|(file, from)| d.console(dom, file, from).map(ok).map_err(|e| err(&e))),
        (_, "/v1/domains/{dom}/devices") => d.devices(dom).map(ok).map_err(|e| err(&e)),
        (_, verb @ ("/v1/domains/{dom}/block-attach" | "/v1/domains/{dom}/network-attach")) => {
            request_body::<AttachRequest>(req).and_then(|m| {
                let spec = match m.spec.as_deref() {
                    Some(s) => s,
                    None if verb.ends_with("network-attach") => "",
                    None => {
                        return Err(Response::error(400, "'spec' (an xl disk spec) is required"))
                    }
                };
                let r = if verb.ends_with("block-attach") {
                    d.block_attach(dom, spec)
                } else {
                    d.network_attach(dom, spec)
                };
                r.map(|v| answer(201, &v)).map_err(|e| err(&e))
            })
        }
        (_, verb @ ("/v1/domains/{dom}/block-detach" | "/v1/domains/{dom}/network-detach")) => {
            request_body::<DetachRequest>(req).and_then(|m| {
                let id = m.id.to_string();
                let r = if verb.ends_with("block-detach") {
                    d.block_detach(dom, &id)
                } else {
                    d.network_detach(dom, &id)
                };
                r.map(|v| answer(202, &v)).map_err(|e| err(&e))
            })
        }
        (_, "/v1/domains/{dom}/vcpus") => d.vcpus(dom).map(ok).map_err(|e| err(&e)),
        (_, "/v1/domains/{dom}/vcpu-pin") => request_body::<PinRequest>(req).and_then(|m| {
            let vcpu = m.vcpu().map_err(|e| Response::error(400, &e))?;
            d.pin(dom, vcpu, &m.cpus)
                .and_then(|()| d.vcpus(dom))
                .map(ok)
                .map_err(|e| err(&e))
        }),
        ("GET", "/v1/domains/{dom}/sched") => d.sched(dom, None, None).map(ok).map_err(|e| err(&e)),
        ("PUT", "/v1/domains/{dom}/sched") => request_body::<SchedRequest>(req)
            .and_then(|m| d.sched(dom, m.weight, m.cap).map(ok).map_err(|e| err(&e))),
        ("GET", "/v1/sched") => d.host_sched().map(ok).map_err(|e| err(&e)),
        ("PUT", "/v1/sched") => request_body::<HostSchedRequest>(req)
            .and_then(|m| d.set_host_sched(&m).map(ok).map_err(|e| err(&e))),
        (_, "/metrics") => d
            .metrics()
            .map(|t| Response::text(200, t))
            .map_err(|e| err(&e)),
        _ => Err(Response::error(500, "route without a handler")),
    };
    r.unwrap_or_else(|e| e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use std::collections::BTreeSet;

    #[test]
    fn the_openapi_document_lists_exactly_the_routes() {
        let doc: Value = serde_json::from_str(OPENAPI).unwrap();
        let mut documented = BTreeSet::new();
        for (p, ops) in doc["paths"].as_object().unwrap() {
            for m in ops
                .as_object()
                .unwrap()
                .keys()
                .filter(|m| *m != "parameters")
            {
                documented.insert((m.to_uppercase(), p.clone()));
            }
        }
        let served: BTreeSet<_> = ROUTES
            .iter()
            .map(|(m, p)| (m.to_string(), p.to_string()))
            .collect();
        assert_eq!(documented, served);
    }

    #[test]
    fn routing() {
        assert_eq!(route("GET", "/v1/domains/web").unwrap(), (5, Some("web")));
        assert_eq!(route("PUT", "/v1/domains/3/pause").unwrap().1, Some("3"));
        assert_eq!(route("PATCH", "/v1/domains").unwrap_err().status, 405);
        assert_eq!(route("GET", "/v2").unwrap_err().status, 404);
    }

    #[test]
    fn a_daemon_refuses_bad_requests_and_changes_nothing() {
        let state = std::env::temp_dir().join(format!("domus-d-{}", std::process::id()));
        let d = crate::fakes::on_this_host(&state);
        let req = |m: &str, p: &str, b: &str| Request {
            method: m.into(),
            path: p.into(),
            query: None,
            headers: Vec::new(),
            body: b.as_bytes().to_vec(),
        };
        for (m, p, b, want) in [
            ("POST", "/v1/domains", "{}", 400),
            ("POST", "/v1/domains", "nope", 400),
            ("POST", "/v1/domains", r#"{"config": "name = 'x'"}"#, 400),
            (
                "POST",
                "/v1/domains",
                r#"{"config": "name='x'\nkernel='/k'\nmemory='lots'", "file": "x.cfg"}"#,
                400,
            ),
            (
                "POST",
                "/v1/domains",
                r#"{"config": "x", "colour": 1}"#,
                400,
            ),
            (
                "POST",
                "/v1/domains",
                r#"{"config": "name='x'\nkernel='/k'\nmemory=4000000"}"#,
                409,
            ),
            ("GET", "/v1/domains/ghost", "", 404),
            ("DELETE", "/v1/domains/ghost", "", 404),
            ("PUT", "/v1/domains/ghost/pause", "", 404),
            ("PUT", "/v1/domains/ghost/shutdown", "", 404),
            ("GET", "/v1/domains/ghost/devices", "", 404),
            (
                "PUT",
                "/v1/domains/ghost/block-attach",
                r#"{"spec": 3}"#,
                400,
            ),
            (
                "PUT",
                "/v1/domains/ghost/block-attach",
                r#"{"spec": "x,raw"}"#,
                404,
            ),
            (
                "PUT",
                "/v1/domains/ghost/block-detach",
                r#"{"id": "vda"}"#,
                404,
            ),
            (
                "PUT",
                "/v1/domains/ghost/network-detach",
                r#"{"idx": 0}"#,
                400,
            ),
            ("PUT", "/v1/domains/ghost/reboot", "", 404),
            (
                "PUT",
                "/v1/domains/ghost/maxmem",
                r#"{"maxmem_mib": -1}"#,
                400,
            ),
            (
                "PUT",
                "/v1/domains/ghost/memory",
                r#"{"target_mib": "x"}"#,
                400,
            ),
        ] {
            let r = handle(&d, &req(m, p, b));
            assert_eq!(
                r.status,
                want,
                "{m} {p} {b}: {}",
                String::from_utf8_lossy(&r.body)
            );
        }
        let r = handle(
            &d,
            &req(
                "POST",
                "/v1/domains",
                r#"{"config": "name='x'\nkernel='/k'\nmemory='lots'", "file": "x.cfg"}"#,
            ),
        );
        assert!(String::from_utf8_lossy(&r.body).contains("x.cfg:3: memory"));
        // A field the API does not know is named, and nothing is created.
        let r = handle(
            &d,
            &req(
                "POST",
                "/v1/domains",
                r#"{"config": "name='y'\nkernel='/k'", "colour": 1}"#,
            ),
        );
        assert_eq!(r.status, 400);
        assert!(String::from_utf8_lossy(&r.body).contains("unknown field `colour`"));
        let list = handle(&d, &req("GET", "/v1/domains", ""));
        let v: Vec<domus_api::daemon::Domain> = serde_json::from_slice(&list.body).unwrap();
        assert_eq!(v.len(), 1, "only Domain-0: {v:?}");
        assert_eq!((v[0].id, v[0].name.as_str()), (0, "Domain-0"));
        // The console of a domain that is not there, and a bad query.
        assert_eq!(
            handle(&d, &req("GET", "/v1/domains/ghost/console", "")).status,
            404
        );
        let q = Request {
            query: Some("from=x".into()),
            ..req("GET", "/v1/domains/ghost/console", "")
        };
        assert_eq!(handle(&d, &q).status, 400);
        let _ = std::fs::remove_dir_all(state);
    }
}
