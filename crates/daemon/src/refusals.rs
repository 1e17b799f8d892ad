//! What the daemon refuses before it reserves or starts anything, tested
//! without KVM through [`crate::fakes`]: memory it would overcommit (a
//! domain is admitted on its maxmem), host files it does not serve, and
//! limits it cannot enforce without cgroups. (Test-only.)

use std::sync::Arc;
use std::time::Duration;

use crate::fakes::{config, daemon, daemon_with, host, FakeGroups, FakeTaps, StandIn};
use crate::paths::Files;
use crate::races::assert_nothing_left;
use crate::{Error, HostOps, Policy};

fn stand_in() -> StandIn {
    StandIn::new(Duration::from_millis(5), None)
}

#[test]
fn admission_counts_maxmem_and_the_vmm_not_the_ballooned_memory() {
    let s = stand_in();
    let started = s.started.clone();
    let groups = Arc::new(FakeGroups::default());
    let (d, state) = daemon(
        "admit",
        HostOps {
            launcher: Box::new(s),
            taps: Arc::new(FakeTaps::default()),
            groups: Some(Box::new(groups)),
            firewall: None,
        },
    );
    let hostmem = crate::host_memory_mib();
    let vmm = crate::cgroup::VMM_ALLOWANCE_MIB;
    // 64 MiB now, but it may balloon up to half the host: that is what it
    // holds.
    let half = hostmem / 2;
    d.create("a.cfg", "/", &config("a", &format!("maxmem = {half}")), &[])
        .unwrap();
    assert_eq!(d.used_mib(None).unwrap(), half + vmm);
    // A second such promise does not fit beside it: refused with the
    // numbers, nothing started.
    let e = d
        .create("b.cfg", "/", &config("b", &format!("maxmem = {half}")), &[])
        .unwrap_err();
    assert!(
        matches!(e, Error::NoMemory { need, .. } if need == half + vmm),
        "{e}"
    );
    assert!(e.to_string().contains("maxmem"), "{e}");
    assert_eq!(e.status(), 409);
    assert!(d.find("b").is_err());
    assert_eq!(started.lock().unwrap().len(), 1);
    // mem-max raises are admitted the same way.
    d.create("c.cfg", "/", &config("c", ""), &[]).unwrap();
    let e = d.mem_max("c", half).unwrap_err();
    assert!(matches!(e, Error::NoMemory { .. }), "{e}");
    assert_eq!(d.find("c").unwrap().config.maxmem_mib, 64);
    d.mem_max("c", 128).unwrap();
    assert_eq!(d.used_mib(None).unwrap(), (half + vmm) + (128 + vmm));
    d.destroy("a").unwrap();
    d.destroy("c").unwrap();
    assert_eq!(d.used_mib(None).unwrap(), 0);
    assert_nothing_left(&d, &state, &started.lock().unwrap());
    let _ = std::fs::remove_dir_all(state);
}

#[test]
fn without_cgroups_every_limit_is_refused_and_nothing_changes() {
    let s = stand_in();
    let started = s.started.clone();
    let (d, state) = daemon("nocg", host(s));
    for extra in ["cpu_weight = 512", "cap = 10", "cpus = '0'"] {
        let e = d
            .create("n.cfg", "/", &config("n", extra), &[])
            .unwrap_err();
        assert!(matches!(e, Error::NoCgroups(_)), "{extra}: {e}");
        assert_eq!(e.status(), 409);
        assert!(e.to_string().contains("--no-cgroups"), "{e}");
    }
    assert!(started.lock().unwrap().is_empty());
    // A domain without limits runs; setting one afterwards is refused.
    d.create("n.cfg", "/", &config("n", "maxmem = 128"), &[])
        .unwrap();
    let e = d.sched("n", Some(512), None).unwrap_err();
    assert!(matches!(e, Error::NoCgroups(_)), "{e}");
    let e = d.mem_max("n", 96).unwrap_err();
    assert!(matches!(e, Error::NoCgroups(_)), "{e}");
    let c = d.find("n").unwrap().config;
    assert_eq!((c.cpu_weight, c.maxmem_mib), (256, 128), "nothing changed");
    d.destroy("n").unwrap();
    assert_nothing_left(&d, &state, &started.lock().unwrap());
    let _ = std::fs::remove_dir_all(state);
}

#[test]
fn host_files_outside_the_image_dirs_are_refused_before_anything_starts() {
    let images = std::env::temp_dir().join(format!("domus-refusals-{}", std::process::id()));
    std::fs::create_dir_all(&images).unwrap();
    let kernel = images.join("k");
    std::fs::write(&kernel, b"k").unwrap();
    let s = stand_in();
    let started = s.started.clone();
    let policy = Policy {
        reserve_mib: 0,
        files: Files::new(vec![images.clone()], Vec::new()),
        ..Policy::any()
    };
    let (d, state) = daemon_with("files", policy, host(s));
    let k = kernel.display();
    let ok = format!("name = 'ok'\nkernel = '{k}'\nmemory = 64\n");
    for (what, text) in [
        ("ramdisk", format!("{ok}ramdisk = '/etc/shadow'")),
        ("disk", format!("{ok}disk = ['/etc/passwd,raw,xvda,rw']")),
        ("kernel", config("x", "")),
    ] {
        let text = text.replace("kernel = '/k'", "kernel = '/etc/passwd'");
        let e = d.create("x.cfg", "/", &text, &[]).unwrap_err();
        assert_eq!(e.status(), 403, "{what}: {e}");
        assert!(e.to_string().starts_with(what), "{e}");
    }
    assert!(started.lock().unwrap().is_empty(), "a VMM was started");
    assert_eq!(d.list().unwrap().len(), 1, "a domain was kept");
    // Allowed files start; a hot-plugged disk is checked the same way.
    d.create("ok.cfg", "/", &ok, &[]).unwrap();
    let e = d.block_attach("ok", "/etc/shadow,raw,xvdb,ro").unwrap_err();
    assert_eq!(e.status(), 403, "{e}");
    assert!(d.find("ok").unwrap().config.disks.is_empty());
    // A kernel replaced by a link out of the image directory after the
    // create is refused at the next start (a crash restart here).
    std::fs::remove_file(&kernel).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", &kernel).unwrap();
    let e = d.start(&d.find("ok").unwrap()).unwrap_err();
    assert_eq!(e.status(), 403, "{e}");
    d.destroy("ok").unwrap();
    assert_nothing_left(&d, &state, &started.lock().unwrap());
    let _ = std::fs::remove_dir_all(state);
    let _ = std::fs::remove_dir_all(images);
}

#[test]
fn migrations_are_refused_before_anything_moves() {
    use domus_api::daemon::{IncomingRequest, MigrateRequest};
    use domus_api::vmm::MigrationState;
    let s = stand_in();
    let started = s.started.clone();
    let (d, state) = daemon("migrate", host(s));
    d.create("a.cfg", "/", &config("a", ""), &[]).unwrap();
    let req = |fingerprint: Option<&str>, ca: Option<&str>, downtime_ms| MigrateRequest {
        to: "127.0.0.1:1".into(),
        token: "t".into(),
        fingerprint: fingerprint.map(Into::into),
        ca_file: ca.map(Into::into),
        downtime_ms,
        max_rounds: 30,
    };
    // No certificate to check the destination by, or two; no downtime; no
    // such domain.
    for (r, what) in [
        (req(None, None, 300), "certificate"),
        (req(Some("SHA256:00"), Some("/ca.pem"), 300), "certificate"),
        (req(Some("SHA256:00"), None, 0), "at least 1"),
    ] {
        let e = d.migrate("a", &r).unwrap_err();
        assert!(e.to_string().contains(what), "{e}");
        assert_eq!(e.status(), 400);
    }
    let e = d
        .migrate("nope", &req(Some("SHA256:00"), None, 300))
        .unwrap_err();
    assert_eq!(e.status(), 404, "{e}");
    // A destination that is not there: refused, shown as failed, and the
    // domain goes on here.
    let e = d
        .migrate("a", &req(Some("SHA256:00"), None, 300))
        .unwrap_err();
    assert!(e.to_string().contains("127.0.0.1:1"), "{e}");
    let m = d.migration("a").unwrap();
    assert_eq!(m.state, MigrationState::Failed);
    assert!(m.error.unwrap_or_default().contains("127.0.0.1:1"));
    assert_eq!(
        d.find("a").unwrap().state,
        domus_api::daemon::State::Running
    );
    // The destination's side: a name it has is refused before it answers
    // (and so before any stream comes).
    let c = d.find("a").unwrap().config;
    let e = d
        .incoming(IncomingRequest {
            domain: c,
            paused: false,
        })
        .unwrap_err();
    assert!(matches!(e, Error::NameInUse(_)), "{e}");
    assert_eq!(started.lock().unwrap().len(), 1, "only a's VMM started");
    d.destroy("a").unwrap();
    assert_nothing_left(&d, &state, &started.lock().unwrap());
    let _ = std::fs::remove_dir_all(state);
}

#[test]
fn addresses_off_the_network_or_taken_are_refused_and_macs_are_given() {
    let s = stand_in();
    let started = s.started.clone();
    let (d, state) = daemon("addrs", host(s));
    // The fakes' taps take bridge br0 only: the default network is on it.
    let net = crate::NetSettings::parse("br0", "10.77.0.1/24").unwrap();
    assert!(d
        .network
        .set(crate::defnet::DefaultNet::stand_in(net))
        .is_ok());
    d.create(
        "a.cfg",
        "/",
        &config("a", "vif = ['ip=10.77.0.5', '']"),
        &[],
    )
    .unwrap();
    let a = d.find("a").unwrap().config;
    assert!(a.vifs.iter().all(|v| v.mac.is_some()), "MACs given: {a:?}");
    let vfr = d.host.firewall.as_ref().unwrap().policies();
    assert_eq!(vfr.len(), 2);
    assert!(vfr.iter().all(|p| p.dhcp));
    assert!(vfr
        .iter()
        .any(|p| p.v4 == crate::vfr::V4::Only(vec![std::net::Ipv4Addr::new(10, 77, 0, 5)])));
    assert!(vfr.iter().any(|p| p.v4 == crate::vfr::V4::Leased));
    let n = started.lock().unwrap().len();
    for (vif, why) in [
        ("vif = ['ip=10.77.0.5']", "is domain a's"),
        (
            "vif = ['ip=10.78.0.5']",
            "not a domain's address on the default network",
        ),
        (
            "vif = ['ip=10.77.0.1']",
            "not a domain's address on the default network",
        ),
        (
            "vif = ['ip=10.77.0.255']",
            "not a domain's address on the default network",
        ),
        (
            "vif = ['ip=10.77.0.6', 'ip=10.77.0.6']",
            "given to two of domain b's interfaces",
        ),
    ] {
        let e = d.create("b.cfg", "/", &config("b", vif), &[]).unwrap_err();
        assert!(
            matches!(e, Error::Invalid(_)) && e.to_string().contains(why),
            "{vif}: {e}"
        );
        assert!(d.find("b").is_err());
    }
    assert_eq!(started.lock().unwrap().len(), n, "nothing started");
    // The same address on another bridge is another network's.
    let e = d
        .create(
            "b.cfg",
            "/",
            &config("b", "vif = ['ip=10.77.0.5,bridge=br1']"),
            &[],
        )
        .unwrap_err();
    assert!(
        e.to_string().contains("no bridge 'br1'"),
        "refused only for its bridge: {e}"
    );
    // Hot-plug is checked as create is.
    let e = d.network_attach("a", "ip=10.77.0.5").unwrap_err();
    assert!(e.to_string().contains("given to two of domain a's"), "{e}");
    assert_eq!(d.find("a").unwrap().config.vifs.len(), 2);
    d.destroy("a").unwrap();
    assert!(d.host.firewall.as_ref().unwrap().policies().is_empty());
    assert_nothing_left(&d, &state, &started.lock().unwrap());
    let _ = std::fs::remove_dir_all(state);
}
