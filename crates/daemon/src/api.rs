//! The daemon's REST API (`domusd.sock`). Routes are listed once, in
//! [`ROUTES`], and checked against `api/daemon.openapi.json` by a test.

use domus_http::{object_body, Request, Response};
use serde_json::{json, Value};

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
    ("GET", "/v1/domains/{dom}/devices"),
    ("PUT", "/v1/domains/{dom}/block-attach"),
    ("PUT", "/v1/domains/{dom}/block-detach"),
    ("PUT", "/v1/domains/{dom}/network-attach"),
    ("PUT", "/v1/domains/{dom}/network-detach"),
    ("GET", "/v1/domains/{dom}/vcpus"),
    ("PUT", "/v1/domains/{dom}/vcpu-pin"),
    ("GET", "/v1/domains/{dom}/sched"),
    ("PUT", "/v1/domains/{dom}/sched"),
    ("GET", "/metrics"),
];

fn ok(v: Value) -> Response {
    Response::json(200, v.to_string())
}

fn err(e: &Error) -> Response {
    Response::error(e.status(), &e.to_string())
}

/// Finds the route for `method` and `path` in [`ROUTES`].
pub fn route<'a>(method: &str, path: &'a str) -> Result<(usize, Option<&'a str>), Response> {
    domus_http::route(ROUTES, method, path)
}

fn create(d: &Daemon, req: &Request) -> Result<Response, Response> {
    let m = object_body(req, &["config", "file", "dir", "overrides"])?;
    let text = m
        .get("config")
        .and_then(Value::as_str)
        .ok_or_else(|| Response::error(400, "'config' (the file's text) is required"))?;
    let file = m.get("file").and_then(Value::as_str).unwrap_or("config");
    let dir = m.get("dir").and_then(Value::as_str).unwrap_or("/");
    let overrides: Vec<String> = match m.get("overrides") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| Response::error(400, "'overrides' must be strings"))?,
        Some(_) => return Err(Response::error(400, "'overrides' must be a list")),
    };
    let (dom, warnings) = d.create(file, dir, text, &overrides).map_err(|e| err(&e))?;
    Ok(Response::json(
        201,
        json!({ "domain": dom, "warnings": warnings }).to_string(),
    ))
}

pub fn handle(d: &Daemon, req: &Request) -> Response {
    let (i, dom) = match route(&req.method, &req.path) {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    let dom = dom.unwrap_or_default();
    let r: Result<Response, Response> = match (ROUTES[i].0, ROUTES[i].1) {
        (_, "/openapi.json") => Ok(Response::json(200, OPENAPI)),
        (_, "/v1/info") => Ok(ok(d.info())),
        (_, "/v1/dmesg") => d
            .dmesg()
            .map(|l| {
                ok(json!(l
                    .into_iter()
                    .map(|(t, m)| json!({"at": t, "msg": m}))
                    .collect::<Vec<_>>()))
            })
            .map_err(|e| err(&e)),
        ("GET", "/v1/domains") => d.list().map(|l| ok(Value::Array(l))).map_err(|e| err(&e)),
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
                .map(|r| Response::json(202, d.describe(&r).to_string()))
                .map_err(|e| err(&e))
        }
        (_, "/v1/domains/{dom}/maxmem") => object_body(req, &["maxmem_mib"]).and_then(|m| {
            let t = m
                .get("maxmem_mib")
                .and_then(Value::as_u64)
                .ok_or_else(|| Response::error(400, "'maxmem_mib' must be a whole number"))?;
            d.mem_max(dom, t).map(ok).map_err(|e| err(&e))
        }),
        (_, "/v1/domains/{dom}/memory") => object_body(req, &["target_mib"]).and_then(|m| {
            let t = m
                .get("target_mib")
                .and_then(Value::as_u64)
                .ok_or_else(|| Response::error(400, "'target_mib' must be a whole number"))?;
            d.mem_set(dom, t).map(ok).map_err(|e| err(&e))
        }),
        (_, "/v1/domains/{dom}/name") => object_body(req, &["name"]).and_then(|m| {
            let n = m
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| Response::error(400, "'name' must be a string"))?;
            d.rename(dom, n)
                .and_then(|()| d.find(n))
                .map(|r| ok(d.describe(&r)))
                .map_err(|e| err(&e))
        }),
        (_, "/v1/domains/{dom}/devices") => d
            .devices(dom)
            .map(|list| ok(serde_json::to_value(list).unwrap_or(Value::Null)))
            .map_err(|e| err(&e)),
        (_, verb @ ("/v1/domains/{dom}/block-attach" | "/v1/domains/{dom}/network-attach")) => {
            object_body(req, &["spec"]).and_then(|m| {
                let spec = match m.get("spec") {
                    Some(Value::String(s)) => s.as_str(),
                    None | Some(Value::Null) if verb.ends_with("network-attach") => "",
                    _ => return Err(Response::error(400, "'spec' must be a string")),
                };
                let r = if verb.ends_with("block-attach") {
                    d.block_attach(dom, spec)
                } else {
                    d.network_attach(dom, spec)
                };
                r.map(|v| Response::json(201, v.to_string()))
                    .map_err(|e| err(&e))
            })
        }
        (_, verb @ ("/v1/domains/{dom}/block-detach" | "/v1/domains/{dom}/network-detach")) => {
            object_body(req, &["id"]).and_then(|m| {
                let id = match m.get("id") {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Number(n)) => n.to_string(),
                    _ => return Err(Response::error(400, "'id' must be a string or a number")),
                };
                let r = if verb.ends_with("block-detach") {
                    d.block_detach(dom, &id)
                } else {
                    d.network_detach(dom, &id)
                };
                r.map(|v| Response::json(202, v.to_string()))
                    .map_err(|e| err(&e))
            })
        }
        (_, "/v1/domains/{dom}/vcpus") => d
            .vcpus(dom)
            .map(|v| ok(Value::Array(v)))
            .map_err(|e| err(&e)),
        (_, "/v1/domains/{dom}/vcpu-pin") => object_body(req, &["vcpu", "cpus"]).and_then(|m| {
            let vcpu = match m.get("vcpu") {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) if s == "all" => None,
                Some(v) => Some(v.as_u64().ok_or_else(|| {
                    Response::error(400, "'vcpu' must be a vCPU number or \"all\"")
                })? as usize),
            };
            let cpus = m
                .get("cpus")
                .and_then(Value::as_str)
                .ok_or_else(|| Response::error(400, "'cpus' must be a CPU list like \"0-3\""))?;
            d.pin(dom, vcpu, cpus)
                .and_then(|()| d.vcpus(dom))
                .map(|v| ok(Value::Array(v)))
                .map_err(|e| err(&e))
        }),
        ("GET", "/v1/domains/{dom}/sched") => d.sched(dom, None, None).map(ok).map_err(|e| err(&e)),
        ("PUT", "/v1/domains/{dom}/sched") => object_body(req, &["weight", "cap"]).and_then(|m| {
            let num = |k: &str| -> Result<Option<u32>, Response> {
                match m.get(k) {
                    None | Some(Value::Null) => Ok(None),
                    Some(v) => v
                        .as_u64()
                        .and_then(|n| u32::try_from(n).ok())
                        .map(Some)
                        .ok_or_else(|| {
                            Response::error(400, &format!("'{k}' must be a whole number"))
                        }),
                }
            };
            let (w, c) = (num("weight")?, num("cap")?);
            d.sched(dom, w, c).map(ok).map_err(|e| err(&e))
        }),
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
        let d = Daemon::open(state.clone(), "/bin/false".into(), 0).unwrap();
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
        let list = handle(&d, &req("GET", "/v1/domains", ""));
        let v: Value = serde_json::from_slice(&list.body).unwrap();
        assert_eq!(v.as_array().unwrap().len(), 1, "only Domain-0: {v}");
        assert_eq!(v[0]["name"], "Domain-0");
        let _ = std::fs::remove_dir_all(state);
    }
}
