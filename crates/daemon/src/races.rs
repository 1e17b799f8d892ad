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
    let log = crate::fakes::log_lines(&d);
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

/// A second daemon on `state`, as after the first was killed.
fn reopen(state: &std::path::Path, stand_in: StandIn) -> std::sync::Arc<Daemon> {
    Daemon::open(
        state.to_path_buf(),
        "/bin/false".into(),
        crate::Policy::any(),
        host(stand_in),
    )
    .unwrap()
}

#[test]
fn a_daemon_killed_mid_create_leaves_its_successor_nothing_to_adopt() {
    // The stand-in's API answers only after 3 s: until then the row has
    // the VMM's pid but must not say running.
    let stand_in = StandIn::new(Duration::from_secs(3), None);
    let started = stand_in.started.clone();
    let (d, state) = daemon("midcreate", stand_in);
    let dc = d.clone();
    let create = std::thread::spawn(move || dc.create("c.cfg", "/", &config("half", ""), &[]));
    let end = Instant::now() + Duration::from_secs(5);
    while d.find("half").map_or(true, |r| r.pid.is_none()) {
        assert!(Instant::now() < end, "the create never recorded its VMM");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(d.find("half").unwrap().state, State::Creating);
    // The next daemon undoes the create instead of adopting its VMM.
    let d2 = reopen(&state, StandIn::new(Duration::ZERO, None));
    assert!(d2.find("half").is_err(), "adopted");
    let log = crate::fakes::log_lines(&d2);
    assert!(
        log.iter().any(|l| l == "removed half-created domain half"),
        "{log:?}"
    );
    assert!(create.join().unwrap().is_err(), "its VMM was killed");
    assert_nothing_left(&d2, &state, &started.lock().unwrap());
    let _ = std::fs::remove_dir_all(state);
}

#[test]
fn a_restart_under_way_when_the_daemon_died_is_made_again() {
    // Crashes (exit status 4) 200 ms after each start.
    let crashing = || {
        StandIn::new(
            Duration::from_millis(10),
            Some((Duration::from_millis(200), 4)),
        )
    };
    let stand_in = crashing();
    let started = stand_in.started.clone();
    let (d, state) = daemon("midrestart", stand_in);
    d.create("c.cfg", "/", &config("crashy", "on_crash = 'restart'"), &[])
        .unwrap();
    // The first daemon sees the crash and waits out its back-off (1 s),
    // and is "killed" then: it restarts nothing more.
    let end = Instant::now() + Duration::from_secs(5);
    while d.find("crashy").unwrap().state != State::Restarting {
        assert!(Instant::now() < end, "the crash was never seen");
        d.monitor_once();
        std::thread::sleep(Duration::from_millis(20));
    }
    let next = crashing();
    let started2 = next.started.clone();
    let d2 = reopen(&state, next);
    d2.monitor_once();
    assert_eq!(started2.lock().unwrap().len(), 1, "restarted at once");
    let r = d2.find("crashy").unwrap();
    assert_eq!((r.state, r.restarts), (State::Running, 1));
    d2.destroy("crashy").unwrap();
    let all: Vec<_> = started
        .lock()
        .unwrap()
        .iter()
        .chain(started2.lock().unwrap().iter())
        .copied()
        .collect();
    assert_nothing_left(&d2, &state, &all);
    let _ = std::fs::remove_dir_all(state);
}

#[test]
fn a_domain_restarted_too_often_is_left_crashed() {
    let stand_in = StandIn::new(
        Duration::from_millis(10),
        Some((Duration::from_millis(200), 4)),
    );
    let started = stand_in.started.clone();
    let (d, state) = daemon("loop", stand_in);
    d.create("c.cfg", "/", &config("loopy", "on_crash = 'restart'"), &[])
        .unwrap();
    // As if it had been restarted the limit's worth of times just now.
    let id = d.find("loopy").unwrap().id;
    crate::lock(&d.restart_log).insert(id, vec![Instant::now(); crate::supervise::RESTART_LIMIT]);
    let end = Instant::now() + Duration::from_secs(5);
    while d.find("loopy").unwrap().state != State::Crashed {
        assert!(Instant::now() < end, "not left crashed");
        d.monitor_once();
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = crate::fakes::log_lines(&d);
    assert!(
        log.iter()
            .any(|l| l.contains("was restarted 10 times in 10 minutes: left crashed")),
        "{log:?}"
    );
    assert_eq!(started.lock().unwrap().len(), 1, "restarted anyway");
    assert_eq!(
        d.used_mib(None).unwrap(),
        0,
        "a crashed domain holds no memory"
    );
    d.destroy("loopy").unwrap();
    assert_nothing_left(&d, &state, &started.lock().unwrap());
    let _ = std::fs::remove_dir_all(state);
}

#[test]
fn a_vmm_slower_than_the_start_timeout_is_stopped_and_a_patient_daemon_waits_for_it() {
    // The stand-in's API answers after 2 s.
    let slow = || StandIn::new(Duration::from_secs(2), None);
    for (timeout_s, ok) in [(1, false), (10, true)] {
        let stand_in = slow();
        let started = stand_in.started.clone();
        let policy = crate::Policy {
            start_timeout_s: timeout_s,
            ..crate::Policy::any()
        };
        let (d, state) =
            crate::fakes::daemon_with(&format!("timeout{timeout_s}"), policy, host(stand_in));
        let r = d.create("c.cfg", "/", &config("slow", ""), &[]);
        if ok {
            r.unwrap();
            assert_eq!(d.find("slow").unwrap().state, State::Running);
            d.destroy("slow").unwrap();
        } else {
            let e = r.unwrap_err().to_string();
            assert!(
                e.contains("did not answer within 1 s") && e.contains("--start-timeout"),
                "{e}"
            );
            assert!(d.find("slow").is_err(), "the failed create left its row");
        }
        assert_nothing_left(&d, &state, &started.lock().unwrap());
        let _ = std::fs::remove_dir_all(state);
    }
}
