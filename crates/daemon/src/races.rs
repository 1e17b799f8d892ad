//! The daemon's lifecycle without KVM: a stand-in VMM (a real child
//! process, with the VMM API served for it from a thread of the test)
//! through the [`Launcher`] seam, so creates racing destroys, a destroy
//! during a create and crash restarts run as unit tests. (Test-only.)

use std::process::{Child, Command};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use domus_api::daemon::State;
use domus_api::spec::VmSpec;
use domus_api::vmm::{DomainInfo, DomainState};
use domus_http::{Request, Response};

use crate::host::{alive, start_time};
use crate::{Daemon, Error, Launcher};

/// The stand-in processes started: pid and start time of each.
type Started = Arc<Mutex<Vec<(i64, Option<i64>)>>>;

/// A VMM stand-in: `sleep` (or `sh` exiting with a status after a while)
/// as the process, and just enough of the VMM API for the daemon.
struct StandIn {
    /// How long its API takes to answer after the start.
    delay: Duration,
    /// Ends by itself after this long with this exit status (None: runs
    /// until killed).
    ends: Option<(Duration, i32)>,
    /// Every process started: pid and start time.
    started: Started,
    launches: AtomicUsize,
}

impl StandIn {
    fn new(delay: Duration, ends: Option<(Duration, i32)>) -> Self {
        Self {
            delay,
            ends,
            started: Arc::default(),
            launches: AtomicUsize::new(0),
        }
    }
}

impl Launcher for StandIn {
    fn launch(&self, _cmd: &mut Command, spec: &VmSpec) -> std::io::Result<Child> {
        let child = match self.ends {
            // Long enough for any test; short, should a failed test leave it.
            None => Command::new("sleep").arg("120").spawn()?,
            Some((after, code)) => Command::new("sh")
                .arg("-c")
                .arg(format!("sleep {}; exit {code}", after.as_secs_f64()))
                .spawn()?,
        };
        let pid = i64::from(child.id());
        self.started.lock().unwrap().push((pid, start_time(pid)));
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
        let delay = self.delay;
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            let Ok(listener) = domus_http::bind(&sock) else {
                // Destroyed meanwhile (its directory is gone): a VMM that
                // cannot serve its API exits.
                // SAFETY: kill(2) on the stand-in this launcher started.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                return;
            };
            let body = serde_json::to_string(&info).unwrap_or_default();
            let handler = move |req: &Request| match (req.method.as_str(), req.path.as_str()) {
                ("GET", "/v1/domain") => Response::json(200, body.clone()),
                _ => Response::error(404, "not in the stand-in"),
            };
            let _ = domus_http::spawn_server("stand-in", listener, Arc::new(handler));
        });
        Ok(child)
    }
}

/// A daemon on a fresh state directory, without cgroups, starting
/// `stand_in`s.
fn daemon(name: &str, stand_in: StandIn) -> (Arc<Daemon>, std::path::PathBuf) {
    let state = std::env::temp_dir().join(format!("domus-races-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&state);
    let d = Daemon::open_with(
        state.clone(),
        "/bin/false".into(),
        0,
        None,
        Box::new(stand_in),
    )
    .unwrap();
    (d, state)
}

fn config(name: &str, extra: &str) -> String {
    format!("name = '{name}'\nkernel = '/k'\nmemory = 64\n{extra}")
}

/// Nothing of any domain is left: rows, live VMMs, directories, and every
/// stand-in process is gone.
fn assert_nothing_left(d: &Daemon, state: &std::path::Path, started: &[(i64, Option<i64>)]) {
    assert_eq!(d.list().unwrap().len(), 1, "only Domain-0");
    assert!(crate::lock(&d.live).is_empty(), "live VMMs left");
    assert_eq!(
        std::fs::read_dir(state.join("domains")).unwrap().count(),
        0,
        "domain directories left"
    );
    assert_eq!(d.used_mib(None).unwrap(), 0, "reservations left");
    for (pid, start) in started {
        assert!(!alive(*pid, *start), "VMM {pid} outlived its domain");
    }
}

#[test]
fn creates_racing_destroys_leave_nothing_behind() {
    let stand_in = StandIn::new(Duration::from_millis(30), None);
    let started = stand_in.started.clone();
    let (d, state) = daemon("churn", stand_in);
    let mut hs = Vec::new();
    for i in 0..20 {
        let dc = d.clone();
        hs.push(std::thread::spawn(move || {
            let text = config(&format!("c{i}"), "");
            dc.create("c.cfg", "/", &text, &[]).map(drop)
        }));
        let dd = d.clone();
        hs.push(std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5 * i));
            dd.destroy(&format!("c{i}"))
        }));
    }
    for h in hs {
        match h.join().unwrap() {
            // A create that lost to its destroy says so, however far it got.
            Ok(()) | Err(Error::NoSuchDomain(_)) => {}
            Err(e) => panic!("{e}"),
        }
    }
    for dom in d.list().unwrap().iter().filter(|x| x.id != 0) {
        d.destroy(&dom.name).unwrap();
    }
    assert_nothing_left(&d, &state, &started.lock().unwrap());
    let _ = std::fs::remove_dir_all(state);
}

#[test]
fn a_destroy_during_a_create_takes_the_new_vmm_down() {
    let stand_in = StandIn::new(Duration::from_millis(600), None);
    let started = stand_in.started.clone();
    let (d, state) = daemon("midway", stand_in);
    let dc = d.clone();
    let create = std::thread::spawn(move || dc.create("c.cfg", "/", &config("slow", ""), &[]));
    // Once the row is there the VMM is starting; destroy it then.
    let end = Instant::now() + Duration::from_secs(5);
    while d.find("slow").is_err() {
        assert!(Instant::now() < end, "the create never made its row");
        std::thread::sleep(Duration::from_millis(5));
    }
    d.destroy("slow").unwrap();
    let created = create.join().unwrap();
    assert!(
        matches!(&created, Err(Error::NoSuchDomain(m)) if m.contains("destroyed while")),
        "{created:?}"
    );
    assert_nothing_left(&d, &state, &started.lock().unwrap());
    let _ = std::fs::remove_dir_all(state);
}

#[test]
fn a_crashing_vmm_is_restarted_and_counted() {
    // The stand-in "crashes" (exit status 4) 200 ms after each start.
    let stand_in = StandIn::new(
        Duration::from_millis(10),
        Some((Duration::from_millis(200), 4)),
    );
    let started = stand_in.started.clone();
    let (d, state) = daemon("crash", stand_in);
    d.create("c.cfg", "/", &config("crashy", "on_crash = 'restart'"), &[])
        .unwrap();
    // The monitor, as the daemon runs it: the first restart comes 1 s
    // after the crash (its back-off).
    let end = Instant::now() + Duration::from_secs(15);
    while d.find("crashy").unwrap().restarts < 1 {
        assert!(Instant::now() < end, "never restarted");
        d.monitor_once();
        d.wait_for_change();
    }
    let log: Vec<String> = d.dmesg().unwrap().into_iter().map(|l| l.msg).collect();
    assert!(
        log.iter()
            .any(|l| l.contains("domain crashy crashed (exit status 4): restart")),
        "{log:?}"
    );
    assert!(
        log.iter().any(|l| l == "restarted domain crashy"),
        "{log:?}"
    );
    let r = d.find("crashy").unwrap();
    assert!(
        matches!(r.state, State::Running | State::Restarting),
        "{:?}",
        r.state
    );
    d.destroy("crashy").unwrap();
    assert_nothing_left(&d, &state, &started.lock().unwrap());
    let _ = std::fs::remove_dir_all(state);
}
