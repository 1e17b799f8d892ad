//! The per-domain REST API (`domus run --api-socket PATH`): domain info and
//! state, pause and resume, the ACPI power button, input to the serial
//! console, device counters and rate limits, disk and interface hot-plug,
//! the balloon, and the virtio queues' state for diagnosing a stalled guest.
//!
//! The routes are listed once, in [`ROUTES`]; the dispatcher matches
//! against that list and a unit test checks it against the committed
//! OpenAPI document (`api/domain.openapi.json`), so the two cannot drift.
//! Every request body is untrusted: anything malformed gets a 4xx with a
//! message and changes nothing.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use domus_devices::bus::lock;

use domus_api::request_body;
use domus_api::vmm::{
    BalloonInfo, BalloonTarget, ConsoleInput, ConsoleTaken, DeviceInfo, DomainInfo, DomainState,
    MigrateRequest, PlugRequest, Pressed, RateLimit, RateLimitUpdate, SnapshotRequest, Unplugging,
    VcpuAffinity, VcpuPin,
};
use domus_devices::platform::GedEvents;
use domus_http::{Request, Response};
use domus_virtio::balloon::BalloonHandle;
use domus_virtio::ratelimit::Limits;
use serde::Serialize;

use crate::pause::Pause;
use crate::registry::{free_name, Device, Hotplug, Plug};
use domus_boot::acpi::GED_POWER_BUTTON;

/// The OpenAPI document of this API, as committed.
pub const OPENAPI: &str = include_str!("../../../api/domain.openapi.json");

/// How long a pause may take before it is reported as failed.
const PAUSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Every route: (method, path template). `{id}` matches one path segment.
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/openapi.json"),
    ("GET", "/v1/domain"),
    ("PUT", "/v1/domain/pause"),
    ("PUT", "/v1/domain/resume"),
    ("PUT", "/v1/domain/power-button"),
    ("PUT", "/v1/domain/console"),
    ("PUT", "/v1/domain/vcpu-pin"),
    ("PUT", "/v1/domain/snapshot"),
    ("PUT", "/v1/domain/migrate"),
    ("GET", "/v1/domain/migration"),
    ("GET", "/v1/domain/rings"),
    ("DELETE", "/v1/domain/migration"),
    ("GET", "/v1/devices"),
    ("POST", "/v1/devices"),
    ("GET", "/v1/devices/{id}"),
    ("DELETE", "/v1/devices/{id}"),
    ("PUT", "/v1/devices/{id}/rate-limit"),
    ("GET", "/v1/balloon"),
    ("PUT", "/v1/balloon"),
];

/// What the API serves.
pub struct Domain {
    pub name: String,
    pub vcpus: u32,
    pub memory: u64,
    pub started: Instant,
    pub pause: Arc<Pause>,
    /// Shared with the hot-plug eject path, which removes entries.
    pub devices: Arc<Mutex<Vec<Device>>>,
    pub balloon: Option<Arc<BalloonHandle>>,
    /// Presses the ACPI power button.
    pub events: Arc<GedEvents>,
    /// The serial console, which `PUT /v1/domain/console` types at (None
    /// only in tests).
    pub serial: Option<Arc<Mutex<domus_devices::serial::SerialDevice>>>,
    pub hotplug: Option<Arc<dyn Hotplug>>,
    /// Saves the domain (None only in tests).
    pub snapshots: Option<Arc<crate::snapshot::Snapshotter>>,
    /// Migrates the domain live (None only in tests).
    pub migration: Option<Arc<crate::migration::send::Migrator>>,
    /// Descriptors the supervisor passes a jailed VMM.
    pub inbox: Option<Arc<domus_jail::fdpass::Inbox>>,
}

fn json<T: Serialize>(status: u16, v: &T) -> Response {
    match serde_json::to_string(v) {
        Ok(text) => Response::json(status, text),
        Err(e) => Response::error(500, &format!("writing the answer: {e}")),
    }
}

fn ok<T: Serialize>(v: &T) -> Response {
    json(200, v)
}

/// Finds the route for `method` and `path` in [`ROUTES`].
pub fn route<'a>(method: &str, path: &'a str) -> Result<(usize, Option<&'a str>), Response> {
    domus_http::route(ROUTES, method, path)
}

/// The balloon as the API shows it; asks the driver for fresh statistics
/// and waits briefly for them.
fn balloon_info(b: &BalloonHandle, memory: u64) -> BalloonInfo {
    let asked = Instant::now();
    let _ = b.statistics();
    b.wait_statistics(asked, Duration::from_millis(200));
    let (stats, age) = b.statistics();
    let statistics = stats
        .into_iter()
        .map(|(tag, v)| {
            let name = domus_virtio::balloon::stat_name(tag)
                .map(str::to_string)
                .unwrap_or_else(|| format!("tag_{tag}"));
            (name, v)
        })
        .collect();
    let mib = |pages: u64| pages >> (20 - 12);
    BalloonInfo {
        target_mib: (memory >> 20).saturating_sub(mib(b.target_pages())),
        balloon_target_mib: mib(b.target_pages()),
        balloon_actual_mib: mib(b.actual_pages()),
        actual_mib: (memory >> 20).saturating_sub(mib(b.actual_pages())),
        reported_bytes: b.reported_bytes.load(std::sync::atomic::Ordering::Relaxed),
        statistics,
        statistics_age_s: age.map(|a| a.as_secs_f64()),
    }
}

fn rate_limit(l: Limits) -> RateLimit {
    RateLimit {
        bandwidth: l.bytes_per_sec,
        iops: l.ops_per_sec,
    }
}

impl Domain {
    pub fn state(&self) -> DomainState {
        if self.pause.is_paused() {
            DomainState::Paused
        } else {
            DomainState::Running
        }
    }

    fn info(&self) -> DomainInfo {
        DomainInfo {
            name: self.name.clone(),
            state: self.state(),
            pid: std::process::id(),
            vcpus: self.vcpus,
            memory_mib: self.memory >> 20,
            uptime_s: self.started.elapsed().as_secs_f64(),
            vcpu_tids: self.pause.vcpu_tids(),
            devices: lock(&self.devices).iter().map(|d| d.id.clone()).collect(),
        }
    }

    fn device_info(d: &Device) -> DeviceInfo {
        DeviceInfo {
            id: d.id.clone(),
            kind: d.kind.to_string(),
            info: d.info.clone(),
            counters: d
                .stats
                .counters()
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            rate_limit: d.limiter.as_ref().map(|l| rate_limit(l.limits())),
        }
    }

    fn device(&self, id: &str) -> Result<Device, Response> {
        lock(&self.devices)
            .iter()
            .find(|d| d.id == id)
            .cloned()
            .ok_or_else(|| Response::error(404, &format!("no device '{id}'")))
    }

    fn hotplug(&self) -> Result<&Arc<dyn Hotplug>, Response> {
        self.hotplug
            .as_ref()
            .ok_or_else(|| Response::error(409, "this domain has no hot-plug"))
    }

    /// POST /v1/devices: `{"disk": "PATH[,ro][,id=][,bw=][,iops=]"}` or
    /// `{"net": "tap=NAME[,mac=][,bw=][,pps=]"}`, as `domus run` takes them.
    fn plug(&self, req: &Request) -> Result<Response, Response> {
        let hp = self.hotplug()?;
        let what = match request_body::<PlugRequest>(req)? {
            PlugRequest {
                disk: Some(d),
                net: None,
            } => Plug::Disk(d),
            PlugRequest {
                disk: None,
                net: Some(n),
            } => Plug::Net(n),
            _ => return Err(Response::error(400, "give exactly one of 'disk' or 'net'")),
        };
        // Held across the plug, so two plugs never pick the same name.
        let mut devices = lock(&self.devices);
        let id = free_name(&devices, matches!(what, Plug::Disk(_)));
        let d = hp.plug(id, &what).map_err(|e| Response::error(409, &e))?;
        let info = Self::device_info(&d);
        devices.push(d);
        Ok(json(201, &info))
    }

    /// PUT /v1/domain/snapshot: saves the domain (see `snapshot::request`).
    fn snapshot(&self, req: &Request) -> Result<Response, Response> {
        let r = request_body::<SnapshotRequest>(req)?;
        let snap = self
            .snapshots
            .as_ref()
            .ok_or_else(|| Response::error(409, "this domain cannot be saved"))?;
        crate::snapshot::request::handle(snap, self.inbox.as_deref(), r)
            .map(|info| ok(&info))
            .map_err(|(status, m)| Response::error(status, &m))
    }

    /// PUT /v1/domain/migrate: answers, then sends the domain live on the
    /// same connection; `GET /v1/domain/migration` follows it.
    fn migrate(&self, req: &Request) -> Result<Response, Response> {
        use crate::migration::send::Options;
        let r = request_body::<MigrateRequest>(req)?;
        let m = self.migrator()?.clone();
        if r.downtime_ms == 0 || r.max_rounds == 0 {
            return Err(Response::error(
                400,
                "downtime_ms and max_rounds must be at least 1",
            ));
        }
        let opts = Options {
            downtime: Duration::from_millis(r.downtime_ms),
            max_rounds: r.max_rounds,
        };
        m.begin().map_err(|e| Response::error(409, &e))?;
        let status = serde_json::to_string(&*lock(&m.status))
            .map_err(|e| Response::error(500, &e.to_string()))?;
        Ok(Response::upgraded(200, status, move |s| m.run(s, opts)))
    }

    fn migrator(&self) -> Result<&Arc<crate::migration::send::Migrator>, Response> {
        self.migration
            .as_ref()
            .ok_or_else(|| Response::error(409, "this domain cannot be migrated"))
    }

    /// DELETE /v1/devices/{id}: asks the guest to let go of a disk or an
    /// interface; the device goes away when it has.
    fn unplug(&self, id: &str) -> Result<Response, Response> {
        let hp = self.hotplug()?;
        let d = self.device(id)?;
        if d.kind != "block" && d.kind != "net" {
            return Err(Response::error(
                409,
                &format!("device '{id}' ({}) cannot be unplugged", d.kind),
            ));
        }
        hp.unplug(d.slot).map_err(|e| Response::error(500, &e))?;
        Ok(json(
            202,
            &Unplugging {
                unplugging: id.to_string(),
                slot: d.slot,
            },
        ))
    }

    fn set_rate_limit(&self, id: &str, req: &Request) -> Result<Response, Response> {
        let d = self.device(id)?;
        let Some(l) = &d.limiter else {
            return Err(Response::error(
                409,
                &format!("device '{id}' has no rate limiter"),
            ));
        };
        let update: RateLimitUpdate = request_body(req)?;
        let mut limits = l.limits();
        if let Some(bw) = update.bandwidth {
            limits.bytes_per_sec = bw.filter(|v| *v > 0);
        }
        if let Some(iops) = update.iops {
            limits.ops_per_sec = iops.filter(|v| *v > 0);
        }
        l.set_limits(limits);
        Ok(ok(&Self::device_info(&d)))
    }

    /// PUT /v1/domain/vcpu-pin: the vCPU threads' host CPUs (the VMM pins
    /// its own threads; the daemon only asks).
    fn pin_vcpus(&self, req: &Request) -> Result<Response, Response> {
        let pin: VcpuPin = request_body(req)?;
        let tids = self.pause.vcpu_tids();
        // SAFETY: sysconf has no preconditions.
        let host = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1) as u32;
        if pin.cpus.is_empty() {
            return Err(Response::error(400, "'cpus' names no host CPU"));
        }
        if let Some(bad) = pin.cpus.iter().find(|c| **c >= host) {
            return Err(Response::error(
                400,
                &format!("CPU {bad} does not exist (the host has {host})"),
            ));
        }
        let chosen: Vec<i32> = match pin.vcpu {
            None => tids.clone(),
            Some(v) => vec![*tids.get(v as usize).ok_or_else(|| {
                Response::error(
                    400,
                    &format!("vCPU {v} does not exist ({} vCPUs)", tids.len()),
                )
            })?],
        };
        for tid in chosen {
            crate::affinity::set(tid, &pin.cpus).map_err(|e| {
                Response::error(
                    409,
                    &format!("pinning thread {tid}: {e} (outside the domain's cpus?)"),
                )
            })?;
        }
        let now: Vec<VcpuAffinity> = tids
            .iter()
            .zip(0..)
            .map(|(tid, vcpu)| VcpuAffinity {
                vcpu,
                tid: *tid,
                cpus: crate::affinity::get(*tid).unwrap_or_default(),
            })
            .collect();
        Ok(ok(&now))
    }

    fn balloon(&self) -> Result<&BalloonHandle, Response> {
        self.balloon.as_deref().ok_or_else(|| {
            Response::error(404, "this domain has no balloon (start it with --balloon)")
        })
    }

    fn set_balloon(&self, req: &Request) -> Result<Response, Response> {
        let b = self.balloon()?;
        let target = request_body::<BalloonTarget>(req)?.target_mib;
        let mem_mib = self.memory >> 20;
        if target > mem_mib {
            return Err(Response::error(
                400,
                &format!("target_mib {target} is more than the domain's {mem_mib} MiB"),
            ));
        }
        // The balloon holds what the guest gives up.
        b.set_target_pages((mem_mib - target) << (20 - 12));
        Ok(ok(&balloon_info(b, self.memory)))
    }

    /// Answers one request.
    pub fn handle(&self, req: &Request) -> Response {
        let (i, id) = match route(&req.method, &req.path) {
            Ok(r) => r,
            Err(resp) => return resp,
        };
        let id = id.unwrap_or_default();
        let r = match ROUTES[i].1 {
            "/openapi.json" => Ok(Response::json(200, OPENAPI)),
            "/v1/domain" => Ok(ok(&self.info())),
            "/v1/domain/pause" => match self.pause.pause(self.vcpus as usize, PAUSE_TIMEOUT) {
                Ok(()) => Ok(ok(&self.info())),
                Err(e) => Err(Response::error(500, &e.to_string())),
            },
            "/v1/domain/resume" => {
                self.pause.resume();
                Ok(ok(&self.info()))
            }
            "/v1/domain/power-button" => match self.events.raise(GED_POWER_BUTTON) {
                Ok(()) => Ok(json(
                    202,
                    &Pressed {
                        pressed: "power-button".into(),
                    },
                )),
                Err(e) => Err(Response::error(
                    500,
                    &format!("interrupting the guest: {e}"),
                )),
            },
            "/v1/domain/console" => self.console_input(req),
            "/v1/domain/vcpu-pin" => self.pin_vcpus(req),
            "/v1/domain/snapshot" => self.snapshot(req),
            "/v1/domain/migrate" => self.migrate(req),
            "/v1/domain/migration" => self.migrator().map(|m| {
                if req.method == "DELETE" {
                    // Seen between two frames; once the guest is stopped
                    // for the last copy it is too late.
                    m.cancel.store(true, std::sync::atomic::Ordering::SeqCst);
                }
                ok(&*lock(&m.status))
            }),
            "/v1/domain/rings" => Ok(ok(&self.rings())),
            "/v1/devices" if req.method == "POST" => self.plug(req),
            "/v1/devices" => Ok(ok(&lock(&self.devices)
                .iter()
                .map(Self::device_info)
                .collect::<Vec<_>>())),
            "/v1/devices/{id}" if req.method == "DELETE" => self.unplug(id),
            "/v1/devices/{id}" => self.device(id).map(|d| ok(&Self::device_info(&d))),
            "/v1/devices/{id}/rate-limit" => self.set_rate_limit(id, req),
            "/v1/balloon" if req.method == "GET" => {
                self.balloon().map(|b| ok(&balloon_info(b, self.memory)))
            }
            "/v1/balloon" => self.set_balloon(req),
            _ => Err(Response::error(500, "route without a handler")),
        };
        r.unwrap_or_else(|e| e)
    }
}

impl Domain {
    /// `GET /v1/domain/rings`: every live virtio queue. The device list is
    /// let go before a transport is locked (a vCPU may hold one).
    fn rings(&self) -> Vec<domus_api::rings::RingInfo> {
        let functions: Vec<_> = lock(&self.devices)
            .iter()
            .filter_map(|d| Some((d.id.clone(), d.function.as_ref()?.transport.clone())))
            .collect();
        functions
            .iter()
            .flat_map(|(id, t)| lock(t).rings(id))
            .collect()
    }

    /// `PUT /v1/domain/console`: the text into the serial port's receive
    /// FIFO, as fast as the guest reads it, for a second at most.
    fn console_input(&self, req: &Request) -> Result<Response, Response> {
        let input: ConsoleInput = request_body(req)?;
        if input.text.len() > domus_api::vmm::CONSOLE_INPUT_MAX {
            return Err(Response::error(
                400,
                &format!(
                    "console input of {} bytes: at most {} at a time",
                    input.text.len(),
                    domus_api::vmm::CONSOLE_INPUT_MAX
                ),
            ));
        }
        let serial = self
            .serial
            .as_ref()
            .ok_or_else(|| Response::error(404, "this domain has no serial console"))?;
        let mut rest = input.text.as_bytes();
        let end = Instant::now() + Duration::from_secs(1);
        while !rest.is_empty() && Instant::now() < end {
            let k = lock(serial).enqueue_input(rest);
            rest = &rest[k..];
            if k == 0 {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        Ok(ok(&ConsoleTaken {
            taken: input.text.len() - rest.len(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use domus_api::vmm::{BalloonInfo, DeviceInfo, DomainInfo, DomainState, RateLimit};
    use domus_api::ErrorBody;
    use domus_virtio::ratelimit::Shared;
    use domus_virtio::Stats;
    use serde_json::{json, Value};
    use std::collections::BTreeSet;

    fn req(method: &str, path: &str, body: &str) -> Request {
        Request {
            method: method.into(),
            path: path.into(),
            query: None,
            headers: Vec::new(),
            body: body.as_bytes().to_vec(),
        }
    }

    fn domain() -> Domain {
        struct Fixed;
        impl Stats for Fixed {
            fn counters(&self) -> Vec<(&'static str, u64)> {
                vec![("read_ops", 3)]
            }
        }
        Domain {
            name: "t".into(),
            vcpus: 0,
            memory: 256 << 20,
            started: Instant::now(),
            pause: Arc::new(Pause::default()),
            devices: Arc::new(Mutex::new(vec![Device {
                id: "vda".into(),
                slot: 1,
                kind: "block",
                info: json!({"path": "/x"}),
                stats: Arc::new(Fixed),
                limiter: Some(Arc::new(Shared::new(Limits::default()).unwrap())),
                function: None,
            }])),
            balloon: Some(Arc::new(BalloonHandle::new().unwrap())),
            events: GedEvents::new(
                vmm_sys_util::eventfd::EventFd::new(libc::EFD_NONBLOCK).unwrap(),
            ),
            serial: Some(Arc::new(Mutex::new(
                domus_devices::serial::SerialDevice::new(
                    vmm_sys_util::eventfd::EventFd::new(libc::EFD_NONBLOCK).unwrap(),
                    Box::new(std::io::sink()),
                ),
            ))),
            hotplug: None,
            snapshots: None,
            migration: None,
            inbox: None,
        }
    }

    #[test]
    fn console_input_goes_to_the_serial_port_as_far_as_it_holds() {
        let d = domain();
        let r = d.handle(&req("PUT", "/v1/domain/console", r#"{"text": "root\r"}"#));
        assert_eq!(r.status, 200, "{}", error(&r));
        assert_eq!(body::<ConsoleTaken>(&r).taken, 5);
        // The receive FIFO (64 bytes) takes no more while the guest reads
        // nothing: the rest is not taken, after a second.
        let long = "x".repeat(100);
        let r = d.handle(&req(
            "PUT",
            "/v1/domain/console",
            &format!(r#"{{"text": "{long}"}}"#),
        ));
        assert_eq!(r.status, 200);
        assert!(body::<ConsoleTaken>(&r).taken < 100);
        let big = "x".repeat(domus_api::vmm::CONSOLE_INPUT_MAX + 1);
        let r = d.handle(&req(
            "PUT",
            "/v1/domain/console",
            &format!(r#"{{"text": "{big}"}}"#),
        ));
        assert_eq!(r.status, 400);
        assert!(error(&r).contains("at most 4096"), "{}", error(&r));
        let r = d.handle(&req("PUT", "/v1/domain/console", r#"{"txt": "a"}"#));
        assert_eq!(r.status, 400);
        assert!(error(&r).contains("unknown field `txt`"), "{}", error(&r));
    }

    /// The answer's body as the API type `T`.
    fn body<T: serde::de::DeserializeOwned>(r: &Response) -> T {
        serde_json::from_slice(&r.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&r.body)))
    }

    fn error(r: &Response) -> String {
        body::<ErrorBody>(r).error
    }

    /// Every (method, path) in the OpenAPI document, paths as written there.
    fn documented() -> BTreeSet<(String, String)> {
        let doc: Value = serde_json::from_str(OPENAPI).expect("the OpenAPI document is JSON");
        assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
        let mut out = BTreeSet::new();
        for (path, ops) in doc["paths"].as_object().unwrap() {
            for m in ops.as_object().unwrap().keys() {
                if m != "parameters" {
                    out.insert((m.to_uppercase(), path.clone()));
                }
            }
        }
        out
    }

    #[test]
    fn the_openapi_document_lists_exactly_the_routes() {
        let served: BTreeSet<(String, String)> = ROUTES
            .iter()
            .map(|(m, p)| (m.to_string(), p.to_string()))
            .collect();
        assert_eq!(documented(), served);
    }

    #[test]
    fn every_route_has_a_handler() {
        let d = domain();
        for (m, p) in ROUTES {
            let path = p.replace("{id}", "vda");
            let r = d.handle(&req(m, &path, "{}"));
            assert!(
                r.status != 404 && r.status != 405 && r.status != 500,
                "{m} {path}: {} {}",
                r.status,
                String::from_utf8_lossy(&r.body)
            );
        }
    }

    #[test]
    fn documented_response_fields_are_served() {
        let doc: Value = serde_json::from_str(OPENAPI).unwrap();
        let d = domain();
        for (schema, path) in [
            ("DomainInfo", "/v1/domain"),
            ("Device", "/v1/devices/vda"),
            ("Balloon", "/v1/balloon"),
        ] {
            let got: Value = body(&d.handle(&req("GET", path, "")));
            for f in doc["components"]["schemas"][schema]["required"]
                .as_array()
                .unwrap()
            {
                let f = f.as_str().unwrap();
                assert!(got.get(f).is_some(), "{path} lacks '{f}': {got}");
            }
        }
    }

    #[test]
    fn unknown_paths_and_methods() {
        let d = domain();
        assert_eq!(d.handle(&req("GET", "/v1/nope", "")).status, 404);
        assert_eq!(d.handle(&req("DELETE", "/v1/domain", "")).status, 405);
        assert_eq!(d.handle(&req("GET", "/v1/devices/vdz", "")).status, 404);
        assert_eq!(d.handle(&req("GET", "/v1/devices/", "")).status, 200);
    }

    #[test]
    fn rate_limits_change_and_bad_bodies_change_nothing() {
        let d = domain();
        let put = |b: &str| d.handle(&req("PUT", "/v1/devices/vda/rate-limit", b));
        let r = put(r#"{"bandwidth": 1048576}"#);
        assert_eq!(r.status, 200);
        let limit = |r: &Response| body::<DeviceInfo>(r).rate_limit.unwrap();
        assert_eq!(
            limit(&r),
            RateLimit {
                bandwidth: Some(1048576),
                iops: None
            }
        );
        let r = put(r#"{"iops": 100}"#);
        assert_eq!(limit(&r).bandwidth, Some(1048576), "kept");
        for bad in [
            "",
            "nope",
            "[]",
            r#"{"bandwidth": -1}"#,
            r#"{"bandwidth": "1M"}"#,
            r#"{"iops": 1.5}"#,
            r#"{"colour": 1}"#,
        ] {
            let r = put(bad);
            assert_eq!(r.status, 400, "{bad}");
            assert!(!error(&r).is_empty());
        }
        let l = lock(&d.devices)[0].limiter.as_ref().unwrap().limits();
        assert_eq!(l.bytes_per_sec, Some(1048576));
        assert_eq!(l.ops_per_sec, Some(100));
        let r = put(r#"{"bandwidth": null, "iops": 0}"#);
        assert_eq!(limit(&r), RateLimit::default());
    }

    #[test]
    fn balloon_target_is_checked() {
        let d = domain();
        let put = |b: &str| d.handle(&req("PUT", "/v1/balloon", b));
        assert_eq!(put(r#"{"target_mib": 257}"#).status, 400);
        assert_eq!(put(r#"{}"#).status, 400);
        let r = put(r#"{"target_mib": 200}"#);
        assert_eq!(r.status, 200);
        assert_eq!(body::<BalloonInfo>(&r).target_mib, 200);
        assert_eq!(d.balloon.as_ref().unwrap().target_pages(), 56 << 8);
    }

    #[test]
    fn pause_and_resume_report_the_state() {
        let d = domain();
        let r = d.handle(&req("PUT", "/v1/domain/pause", ""));
        assert_eq!(body::<DomainInfo>(&r).state, DomainState::Paused);
        let r = d.handle(&req("PUT", "/v1/domain/resume", ""));
        assert_eq!(body::<DomainInfo>(&r).state, DomainState::Running);
    }

    #[test]
    fn the_power_button_raises_a_guest_event() {
        let d = domain();
        let r = d.handle(&req("PUT", "/v1/domain/power-button", ""));
        assert_eq!(r.status, 202);
        let mut ged = domus_devices::platform::Ged(d.events.clone());
        let mut b = [0u8];
        domus_devices::PioDevice::read(&mut ged, 0, &mut b);
        assert_eq!(b[0], GED_POWER_BUTTON);
        assert_eq!(
            d.handle(&req("GET", "/v1/domain/power-button", "")).status,
            405
        );
    }

    #[test]
    fn hot_plug_requests_are_checked_and_named() {
        struct NoStats;
        impl Stats for NoStats {
            fn counters(&self) -> Vec<(&'static str, u64)> {
                Vec::new()
            }
        }
        struct Fake(Mutex<Vec<usize>>);
        impl Hotplug for Fake {
            fn plug(&self, id: String, what: &Plug) -> Result<Device, String> {
                let Plug::Disk(d) = what else {
                    return Err("only disks here".into());
                };
                Ok(Device {
                    id,
                    slot: 7,
                    kind: "block",
                    info: json!({"path": d.path.display().to_string()}),
                    stats: Arc::new(NoStats),
                    limiter: None,
                    function: None,
                })
            }
            fn unplug(&self, slot: usize) -> Result<(), String> {
                lock(&self.0).push(slot);
                Ok(())
            }
        }
        let mut d = domain();
        let post = |d: &Domain, b: &str| d.handle(&req("POST", "/v1/devices", b));
        assert_eq!(post(&d, r#"{"disk": "/x"}"#).status, 409, "no hot-plug");
        let fake = Arc::new(Fake(Mutex::new(Vec::new())));
        d.hotplug = Some(fake.clone());
        for bad in [
            "",
            "{}",
            r#"{"disk": 1}"#,
            r#"{"disk": "/x", "net": "tap=t"}"#,
            r#"{"disk": ",ro"}"#,
            r#"{"cdrom": "/x"}"#,
            r#"{"disk": "/x", "size": 1}"#,
        ] {
            assert_eq!(post(&d, bad).status, 400, "{bad}");
        }
        // An unknown field is named, and nothing is plugged.
        let r = post(&d, r#"{"disk": "/img/b", "size": 1}"#);
        let e = error(&r);
        assert!(e.contains("unknown field `size`"), "{e}");
        assert_eq!(lock(&d.devices).len(), 1);
        let r = post(&d, r#"{"disk": "/img/b"}"#);
        assert_eq!(r.status, 201);
        assert_eq!(body::<DeviceInfo>(&r).id, "vdb", "vda is taken");
        assert_eq!(post(&d, r#"{"net": "tap=t0"}"#).status, 409);
        assert_eq!(lock(&d.devices).len(), 2);
        let del = |d: &Domain, id: &str| d.handle(&req("DELETE", &format!("/v1/devices/{id}"), ""));
        assert_eq!(del(&d, "vdb").status, 202);
        assert_eq!(*lock(&fake.0), vec![7]);
        assert_eq!(del(&d, "nope").status, 404);
        lock(&d.devices)[0].kind = "rng";
        assert_eq!(del(&d, "vda").status, 409, "only disks and interfaces");
    }
}
