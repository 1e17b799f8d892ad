//! The daemon's lifecycle without KVM: a stand-in VMM (a real child
//! process, with the VMM API served for it from a thread of the test,
//! [`crate::fakes`]) through the [`crate::Launcher`] seam, so creates racing
//! destroys, a destroy during a create and crash restarts run as unit
//! tests. (Test-only.)

use std::time::{Duration, Instant};

use domus_api::daemon::State;

use crate::fakes::{config, host, StandIn};
use crate::host::alive;
use crate::{Daemon, Error};

fn daemon(name: &str, stand_in: StandIn) -> (std::sync::Arc<Daemon>, std::path::PathBuf) {
    crate::fakes::daemon(name, host(stand_in))
}

/// Nothing of any domain is left: rows, live VMMs, directories, and every
/// stand-in process is gone.
pub(crate) fn assert_nothing_left(
    d: &Daemon,
    state: &std::path::Path,
    started: &[(i64, Option<i64>)],
) {
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
