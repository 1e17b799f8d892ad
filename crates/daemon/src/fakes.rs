//! Stand-ins for what the daemon does to the host (test-only): a VMM that
//! is a real child process with just enough of the VMM API served for it
//! from a thread of the test ([`StandIn`]), taps ([`FakeTaps`]) and
//! cgroups ([`FakeGroups`]) kept in memory, each able to fail on demand.
//! `races` and `rollbacks` test the daemon through them, without KVM.

use std::collections::BTreeMap;
use std::process::Command;

use domus_jail::{Job, Process};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use domus_api::spec::VmSpec;
use domus_api::vmm::{DeviceInfo, DomainInfo, DomainState, PlugRequest, Unplugging};
use domus_http::{Request, Response};

use crate::cgroup::{Groups, Limits};
use crate::host::start_time;
use crate::network::Taps;
use crate::{Daemon, HostOps, Launcher};

/// The stand-in processes started: pid and start time of each.
pub type Started = Arc<Mutex<Vec<(i64, Option<i64>)>>>;

/// A VMM stand-in: `sleep` (or `sh` exiting with a status after a while)
/// as the process, and just enough of the VMM API for the daemon: the
/// domain, and hot-plug (which it refuses while `refuse_plug` is set).
pub struct StandIn {
    /// How long its API takes to answer after the start.
    pub delay: Duration,
    /// Ends by itself after this long with this exit status (None: runs
    /// until killed).
    pub ends: Option<(Duration, i32)>,
    /// Every process started: pid and start time.
    pub started: Started,
    pub launches: AtomicUsize,
    pub refuse_plug: Arc<AtomicBool>,
}

impl StandIn {
    pub fn new(delay: Duration, ends: Option<(Duration, i32)>) -> Self {
        Self {
            delay,
            ends,
            started: Arc::default(),
            launches: AtomicUsize::new(0),
            refuse_plug: Arc::default(),
        }
    }
}

/// The stand-in's answer to one API request; `devices` are its VMM's.
fn serve(
    req: &Request,
    info: &DomainInfo,
    devices: &Mutex<Vec<DeviceInfo>>,
    refuse_plug: &AtomicBool,
) -> Response {
    let path = req.path.as_str();
    match (req.method.as_str(), path) {
        ("GET", "/v1/domain") => json(200, info),
        ("GET", "/v1/devices") => json(200, &*devices.lock().unwrap()),
        ("POST", "/v1/devices") if refuse_plug.load(Ordering::SeqCst) => {
            Response::error(400, "the stand-in refuses hot-plug")
        }
        ("POST", "/v1/devices") => {
            let Ok(p) = domus_api::parse_body::<PlugRequest>(&req.body) else {
                return Response::error(400, "not a plug request");
            };
            let mut devs = devices.lock().unwrap();
            let n = devs.len();
            let dev = match (p.disk, p.net) {
                (Some(d), None) => DeviceInfo {
                    id: format!("vd{}", (b'a' + n as u8) as char),
                    kind: "block".into(),
                    info: serde_json::json!({"path": d.path, "read_only": d.read_only}),
                    counters: BTreeMap::new(),
                    rate_limit: None,
                },
                (None, Some(net)) => DeviceInfo {
                    id: format!("net{n}"),
                    kind: "net".into(),
                    info: serde_json::json!({"tap": net.tap, "mac": net.mac}),
                    counters: BTreeMap::new(),
                    rate_limit: None,
                },
                _ => return Response::error(400, "one device at a time"),
            };
            devs.push(dev.clone());
            json(201, &dev)
        }
        (method, _) if path.starts_with("/v1/devices/") => {
            let id = &path["/v1/devices/".len()..];
            let mut devs = devices.lock().unwrap();
            let Some(i) = devs.iter().position(|d| d.id == id) else {
                return Response::error(404, &format!("no device {id}"));
            };
            match method {
                "GET" => json(200, &devs[i]),
                "DELETE" => {
                    devs.remove(i);
                    json(
                        202,
                        &Unplugging {
                            unplugging: id.into(),
                            slot: i,
                        },
                    )
                }
                _ => Response::error(405, "not in the stand-in"),
            }
        }
        _ => Response::error(404, "not in the stand-in"),
    }
}

fn json<T: serde::Serialize>(code: u16, v: &T) -> Response {
    Response::json(code, serde_json::to_string(v).unwrap_or_default())
}

impl Launcher for StandIn {
    /// The stand-in's "host" runs no other VMs.
    fn vsock_cid_free(&self, _cid: u64) -> bool {
        true
    }

    fn launch(&self, _job: Job, spec: &VmSpec) -> std::io::Result<Process> {
        let child = match self.ends {
            // Long enough for any test; short, should a failed test leave it.
            None => Command::new("sleep").arg("120").spawn()?,
            Some((after, code)) => Command::new("sh")
                .arg("-c")
                .arg(format!("sleep {}; exit {code}", after.as_secs_f64()))
                .spawn()?,
        };
        let pid = i64::from(child.id());
        let started = start_time(pid);
        self.started.lock().unwrap().push((pid, started));
        self.launches.fetch_add(1, Ordering::SeqCst);
        let sock = spec
            .api_socket
            .clone()
            .expect("the daemon gives an API socket");
        let info = DomainInfo {
            name: spec.name.clone(),
            state: DomainState::Running,
            pid: child.id(),
            vcpus: spec.vcpus,
            memory_mib: spec.memory_mib,
            uptime_s: 0.0,
            vcpu_tids: vec![child.id() as i32; spec.vcpus as usize],
            devices: Vec::new(),
        };
        let (delay, refuse_plug) = (self.delay, self.refuse_plug.clone());
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            // The last VMM's socket goes with it (below), a moment later.
            let mut bound = domus_http::bind(&sock);
            for _ in 0..100 {
                match &bound {
                    Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                        std::thread::sleep(Duration::from_millis(10));
                        bound = domus_http::bind(&sock);
                    }
                    _ => break,
                }
            }
            let Ok(listener) = bound else {
                // Destroyed meanwhile (its directory is gone): a VMM that
                // cannot serve its API exits.
                // SAFETY: kill(2) on the stand-in this launcher started.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                return;
            };
            // A VMM's API ends with it: once the stand-in's process has
            // ended, its socket is removed (if it is still this one's).
            use std::os::unix::fs::MetadataExt;
            let ino = std::fs::metadata(&sock).map(|m| m.ino()).ok();
            let watched = sock.clone();
            std::thread::spawn(move || {
                while crate::host::alive(pid, started) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                if std::fs::metadata(&watched).map(|m| m.ino()).ok() == ino {
                    let _ = std::fs::remove_file(&watched);
                }
            });
            let devices = Mutex::new(Vec::new());
            // A VMM's API ends with it: a stand-in whose process was killed
            // answers nothing, so a restart's start waits for the new one's
            // (which would otherwise bind its socket late, into a directory
            // a destroy is removing).
            let handler = move |req: &Request| {
                if !crate::host::alive(pid, started) {
                    return Response::error(503, "the stand-in VMM has ended");
                }
                serve(req, &info, &devices, &refuse_plug)
            };
            let _ = domus_http::spawn_server("stand-in", listener, Arc::new(handler));
        });
        Ok(Process::adopt(child))
    }
}

/// Taps in memory, by name, with the bridge each is on. Bridges other than
/// `br0` do not exist.
#[derive(Default)]
pub struct FakeTaps {
    pub taps: Mutex<BTreeMap<String, Option<String>>>,
    /// The user and group each tap was made for.
    pub owners: Mutex<BTreeMap<String, (u32, u32)>>,
}

impl Taps for FakeTaps {
    fn add(
        &self,
        name: &str,
        bridge: Option<&str>,
        owner: Option<(u32, u32)>,
    ) -> std::io::Result<()> {
        if let Some(o) = owner {
            self.owners.lock().unwrap().insert(name.into(), o);
        }
        if let Some(b) = bridge.filter(|b| *b != "br0") {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("there is no bridge '{b}' on this host (tap {name})"),
            ));
        }
        let mut taps = self.taps.lock().unwrap();
        if taps.contains_key(name) {
            return Err(std::io::Error::other(format!("tap {name} exists")));
        }
        taps.insert(name.into(), bridge.map(String::from));
        Ok(())
    }

    fn remove(&self, name: &str) -> std::io::Result<()> {
        match self.taps.lock().unwrap().remove(name) {
            Some(_) => Ok(()),
            None => Err(std::io::Error::other(format!("no tap {name}"))),
        }
    }

    fn list(&self, prefix: &str) -> Vec<String> {
        self.taps
            .lock()
            .unwrap()
            .keys()
            .filter(|n| {
                n.strip_prefix(prefix)
                    .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
            })
            .cloned()
            .collect()
    }
}

/// cgroups in memory: each group's limits. `refuse_updates` makes
/// updates fail (a controller the host lacks); `busy_removes` removes fail
/// (tasks still inside) before one succeeds.
#[derive(Default)]
pub struct FakeGroups {
    pub groups: Mutex<BTreeMap<String, Limits>>,
    pub refuse_updates: AtomicBool,
    pub busy_removes: AtomicUsize,
}

impl Groups for FakeGroups {
    fn create(&self, name: &str, l: &Limits) -> std::io::Result<std::fs::File> {
        self.groups.lock().unwrap().insert(name.into(), l.clone());
        // What the VMM's fork writes its "0" to.
        std::fs::OpenOptions::new().write(true).open("/dev/null")
    }

    fn update(&self, name: &str, l: &Limits) -> std::io::Result<()> {
        if self.refuse_updates.load(Ordering::SeqCst) {
            return Err(std::io::Error::other("cpu.weight: Permission denied"));
        }
        match self.groups.lock().unwrap().get_mut(name) {
            Some(g) => {
                *g = l.clone();
                Ok(())
            }
            None => Err(std::io::Error::other(format!("no group {name}"))),
        }
    }

    fn kill(&self, _name: &str) {}

    fn remove(&self, name: &str, _patience: Duration) -> std::io::Result<()> {
        let busy = self
            .busy_removes
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if busy.is_ok() {
            return Err(std::io::Error::other(format!(
                "{name}: Device or resource busy"
            )));
        }
        self.groups.lock().unwrap().remove(name);
        Ok(())
    }

    fn list(&self, prefix: &str) -> Vec<String> {
        self.groups
            .lock()
            .unwrap()
            .keys()
            .filter(|n| n.starts_with(prefix))
            .cloned()
            .collect()
    }

    fn oom_kills(&self, _name: &str) -> Option<u64> {
        None
    }
}

/// The test keeps a handle on the groups it hands the daemon.
impl Groups for Arc<FakeGroups> {
    fn create(&self, name: &str, l: &Limits) -> std::io::Result<std::fs::File> {
        (**self).create(name, l)
    }
    fn update(&self, name: &str, l: &Limits) -> std::io::Result<()> {
        (**self).update(name, l)
    }
    fn kill(&self, name: &str) {
        (**self).kill(name)
    }
    fn remove(&self, name: &str, patience: Duration) -> std::io::Result<()> {
        (**self).remove(name, patience)
    }
    fn list(&self, prefix: &str) -> Vec<String> {
        (**self).list(prefix)
    }
    fn oom_kills(&self, name: &str) -> Option<u64> {
        (**self).oom_kills(name)
    }
}

/// A daemon on a fresh state directory (named after `name`), acting on the
/// host through `host`.
pub fn daemon(name: &str, host: HostOps) -> (Arc<Daemon>, std::path::PathBuf) {
    daemon_with(name, crate::Policy::any(), host)
}

/// [`daemon`] admitting domains by `policy`.
pub fn daemon_with(
    name: &str,
    policy: crate::Policy,
    host: HostOps,
) -> (Arc<Daemon>, std::path::PathBuf) {
    let state = std::env::temp_dir().join(format!("domus-fake-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&state);
    let d = Daemon::open(state.clone(), "/bin/false".into(), policy, host).unwrap();
    (d, state)
}

/// A daemon on `state` that acts on this host (no cgroups) and admits any
/// file: for tests that start no domain.
pub fn on_this_host(state: &std::path::Path) -> Arc<Daemon> {
    let host = HostOps::real(false).unwrap();
    Daemon::open(
        state.to_path_buf(),
        "/bin/false".into(),
        crate::Policy::any(),
        host,
    )
    .unwrap()
}

/// The daemon log's lines (`dmesg`), oldest first.
pub fn log_lines(d: &Daemon) -> Vec<String> {
    d.dmesg().unwrap().into_iter().map(|l| l.msg).collect()
}

/// `stand_in` and in-memory taps, without cgroups.
pub fn host(stand_in: StandIn) -> HostOps {
    HostOps {
        launcher: Box::new(stand_in),
        taps: Arc::new(FakeTaps::default()),
        groups: None,
        firewall: Some(Arc::new(FakeFirewall::default())),
    }
}

/// The virtual firewall-router's rules, kept in memory: what was applied,
/// by tap.
#[derive(Default)]
pub struct FakeFirewall {
    pub rules: Mutex<BTreeMap<String, crate::vfr::Policy>>,
    /// How long a removal takes (nft, slow on a busy host), in ms.
    pub remove_ms: std::sync::atomic::AtomicU64,
}

impl crate::vfr::Firewall for FakeFirewall {
    fn apply(&self, p: &crate::vfr::Policy) -> std::io::Result<()> {
        self.rules.lock().unwrap().insert(p.tap.clone(), p.clone());
        Ok(())
    }

    fn remove(&self, tap: &str) -> std::io::Result<()> {
        let ms = self.remove_ms.load(std::sync::atomic::Ordering::SeqCst);
        std::thread::sleep(std::time::Duration::from_millis(ms));
        self.rules.lock().unwrap().remove(tap);
        Ok(())
    }

    fn reconcile(&self, ps: &[crate::vfr::Policy]) -> std::io::Result<()> {
        *self.rules.lock().unwrap() = ps.iter().map(|p| (p.tap.clone(), p.clone())).collect();
        Ok(())
    }

    fn learn(&self, _tap: &str, _v4: &[std::net::Ipv4Addr]) -> std::io::Result<()> {
        Ok(())
    }

    fn counters(&self) -> crate::vfr::Counts {
        BTreeMap::new()
    }

    fn policies(&self) -> Vec<crate::vfr::Policy> {
        self.rules.lock().unwrap().values().cloned().collect()
    }
}

/// An xl.cfg for a 64 MiB domain `name`, with `extra` lines.
pub fn config(name: &str, extra: &str) -> String {
    format!("name = '{name}'\nkernel = '/k'\nmemory = 64\n{extra}")
}
