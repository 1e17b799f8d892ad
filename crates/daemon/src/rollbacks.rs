//! What the daemon does to the host, and undoes when a step fails, tested
//! without KVM through [`crate::fakes`]: taps made and removed with the
//! interfaces the VMM takes or refuses, a start whose tap cannot be made,
//! cgroup limits kept only once enforced, and groups the kernel is slow to
//! let go of. (Test-only.)

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::fakes::{config, daemon, FakeGroups, FakeTaps, StandIn};
use crate::races::assert_nothing_left;
use crate::{Error, HostOps};

/// A stand-in VMM that answers at once and runs until killed, the taps and
/// cgroups it is given, and a daemon over them.
struct Bench {
    d: Arc<crate::Daemon>,
    state: std::path::PathBuf,
    taps: Arc<FakeTaps>,
    groups: Arc<FakeGroups>,
    vfr: Arc<crate::fakes::FakeFirewall>,
    started: crate::fakes::Started,
    refuse_plug: Arc<std::sync::atomic::AtomicBool>,
}

impl Bench {
    fn new(name: &str) -> Self {
        let stand_in = StandIn::new(Duration::from_millis(5), None);
        let (started, refuse_plug) = (stand_in.started.clone(), stand_in.refuse_plug.clone());
        let taps = Arc::new(FakeTaps::default());
        let groups = Arc::new(FakeGroups::default());
        let vfr = Arc::new(crate::fakes::FakeFirewall::default());
        let (d, state) = daemon(
            name,
            HostOps {
                launcher: Box::new(stand_in),
                taps: taps.clone(),
                groups: Some(Box::new(groups.clone())),
                firewall: Some(vfr.clone()),
            },
        );
        Self {
            d,
            state,
            taps,
            groups,
            vfr,
            started,
            refuse_plug,
        }
    }

    /// The taps there are, with their bridges; each has its VFR rules
    /// and no rules are left of a tap that is gone.
    fn taps(&self) -> Vec<(String, Option<String>)> {
        let taps: Vec<(String, Option<String>)> =
            self.taps.taps.lock().unwrap().clone().into_iter().collect();
        let ruled: Vec<String> = self.vfr.rules.lock().unwrap().keys().cloned().collect();
        let names: Vec<String> = taps.iter().map(|(t, _)| t.clone()).collect();
        assert_eq!(names, ruled, "the VFR's rules follow the taps");
        taps
    }

    fn done(self) {
        for dom in self.d.list().unwrap().iter().filter(|x| x.id != 0) {
            self.d.destroy(&dom.name).unwrap();
        }
        assert_nothing_left(&self.d, &self.state, &self.started.lock().unwrap());
        assert!(self.taps().is_empty(), "taps left: {:?}", self.taps());
        assert!(
            self.groups.groups.lock().unwrap().is_empty(),
            "cgroups left"
        );
        let _ = std::fs::remove_dir_all(&self.state);
    }
}

#[test]
fn an_interface_the_vmm_refuses_leaves_no_tap_and_no_vif() {
    let b = Bench::new("refused");
    b.d.create("n.cfg", "/", &config("n", ""), &[]).unwrap();
    b.refuse_plug.store(true, Ordering::SeqCst);
    let e = b.d.network_attach("n", "bridge=br0").unwrap_err();
    assert!(e.to_string().contains("refuses hot-plug"), "{e}");
    assert!(b.taps().is_empty(), "{:?}", b.taps());
    assert!(b.d.find("n").unwrap().config.vifs.is_empty());
    // A bridge that does not exist: the same, before the VMM is asked.
    b.refuse_plug.store(false, Ordering::SeqCst);
    let e = b.d.network_attach("n", "bridge=nobr").unwrap_err();
    assert!(e.to_string().contains("no bridge 'nobr'"), "{e}");
    assert_eq!(e.status(), 400, "the user's mistake");
    assert!(b.taps().is_empty() && b.d.find("n").unwrap().config.vifs.is_empty());
    b.done();
}

#[test]
fn attach_and_detach_keep_taps_and_the_configuration_in_step() {
    let b = Bench::new("attach");
    b.d.create("n.cfg", "/", &config("n", "vif = ['bridge=br0']"), &[])
        .unwrap();
    let id = b.d.find("n").unwrap().id;
    let tap = |i| b.d.tap_name(id, i);
    assert_eq!(b.taps(), [(tap(0), Some("br0".into()))]);

    let dev =
        b.d.network_attach("n", "mac=52:54:00:0A:0B:0C,rate=10Mb/s")
            .unwrap();
    assert_eq!(
        (dev.fact("tap"), dev.fact("mac")),
        (tap(1).as_str(), "52:54:00:0a:0b:0c")
    );
    assert_eq!(b.taps(), [(tap(0), Some("br0".into())), (tap(1), None)]);
    let vifs = b.d.find("n").unwrap().config.vifs;
    assert_eq!(vifs.len(), 2);
    assert_eq!(
        (vifs[1].mac.as_deref(), vifs[1].rate),
        (Some("52:54:00:0a:0b:0c"), Some(1_250_000))
    );

    // Detached by MAC: the vif leaves the configuration at once, its tap
    // once the VMM has let go of the device.
    b.d.network_detach("n", "52:54:00:0a:0b:0c").unwrap();
    assert_eq!(b.d.find("n").unwrap().config.vifs.len(), 1);
    let end = Instant::now() + Duration::from_secs(5);
    while b.taps().len() > 1 {
        assert!(
            Instant::now() < end,
            "tap {} stayed: {:?}",
            tap(1),
            b.taps()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(b.taps(), [(tap(0), Some("br0".into()))]);
    let e = b.d.network_detach("n", "5").unwrap_err();
    assert!(e.to_string().contains("net5"), "{e}");
    b.done();
}

/// A new interface attached while a detached one's tap is being removed
/// (the tap gone, its VFR rules not yet: nft is slow on a busy host) gets
/// a tap whose rules stay. Before, it took the free name and the removal
/// then deleted the new tap's rules (the bench's clones, whose restored
/// interface is detached and a new one attached at once, were left with
/// a lease the VFR could not learn).
#[test]
fn an_interface_attached_while_a_detached_ones_rules_go_keeps_its_own() {
    let b = Bench::new("reattach");
    b.d.create("n.cfg", "/", &config("n", ""), &[]).unwrap();
    let first = b.d.network_attach("n", "bridge=br0").unwrap();
    let old = first.fact("tap").to_string();
    assert_eq!(old, b.d.tap_name(b.d.find("n").unwrap().id, 0));
    b.vfr.remove_ms.store(500, Ordering::SeqCst);
    b.d.network_detach("n", first.fact("mac")).unwrap();
    // The tap goes first, then (500 ms later) its rules.
    let end = Instant::now() + Duration::from_secs(5);
    while b.taps.taps.lock().unwrap().contains_key(&old) {
        assert!(Instant::now() < end, "tap {old} stayed");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        b.vfr.rules.lock().unwrap().contains_key(&old),
        "the rules went first"
    );
    let dev = b.d.network_attach("n", "bridge=br0").unwrap();
    b.vfr.remove_ms.store(0, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(700));
    let new = dev.fact("tap").to_string();
    assert_eq!(b.taps(), [(new.clone(), Some("br0".into()))]);
    assert!(
        b.vfr.rules.lock().unwrap().contains_key(&new),
        "{new} lost its rules"
    );
    b.done();
}

#[test]
fn a_start_whose_tap_cannot_be_made_leaves_nothing() {
    let b = Bench::new("notap");
    let text = config("n", "vif = ['bridge=br0', 'bridge=nobr']");
    let e = b.d.create("n.cfg", "/", &text, &[]).unwrap_err();
    assert!(e.to_string().contains("no bridge 'nobr'"), "{e}");
    assert_eq!(e.status(), 400, "the user's mistake");
    assert!(b.d.find("n").is_err(), "the row stayed");
    assert!(b.taps().is_empty(), "the first tap stayed: {:?}", b.taps());
    assert_eq!(b.started.lock().unwrap().len(), 0, "a VMM was started");
    b.done();
}

#[test]
fn cpu_settings_are_kept_only_once_enforced() {
    let b = Bench::new("sched");
    let text = config("n", "cpu_weight = 128\non_crash = 'restart'");
    b.d.create("n.cfg", "/", &text, &[]).unwrap();
    let group = format!("{}-d{}", b.d.tag, b.d.find("n").unwrap().id);
    let weight = || b.groups.groups.lock().unwrap()[&group].weight;
    assert_eq!(weight(), 128);
    let s = b.d.sched("n", Some(512), Some(50)).unwrap();
    assert_eq!((s.weight, s.cap), (512, 50));
    assert_eq!(weight(), 512);

    b.groups.refuse_updates.store(true, Ordering::SeqCst);
    let e = b.d.sched("n", Some(1024), None).unwrap_err();
    assert!(matches!(e, Error::Io(_)), "{e}");
    let c = b.d.find("n").unwrap().config;
    assert_eq!((c.cpu_weight, c.cap), (512, 50), "kept though not enforced");
    assert!(b.d.mem_max("n", 128).is_err());
    assert_eq!(b.d.find("n").unwrap().config.maxmem_mib, 64);
    b.groups.refuse_updates.store(false, Ordering::SeqCst);

    // Kept across a restart: the VMM crashes and the new group gets them.
    b.d.mem_max("n", 128).unwrap();
    b.groups.groups.lock().unwrap().clear();
    let pid = b.d.find("n").unwrap().pid.unwrap();
    // SAFETY: kill(2) on the stand-in VMM this test's daemon started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let end = Instant::now() + Duration::from_secs(10);
    while b.d.find("n").unwrap().restarts < 1
        || !b.groups.groups.lock().unwrap().contains_key(&group)
    {
        assert!(Instant::now() < end, "never restarted");
        b.d.monitor_once();
        b.d.wait_for_change();
    }
    let g = b.groups.groups.lock().unwrap()[&group].clone();
    assert_eq!((g.weight, g.cap, g.maxmem_mib), (512, 50, 128));
    b.done();
}

#[test]
fn a_group_the_kernel_holds_on_to_is_removed_later() {
    let b = Bench::new("busy");
    b.d.create("n.cfg", "/", &config("n", ""), &[]).unwrap();
    b.groups.busy_removes.store(2, Ordering::SeqCst);
    b.d.destroy("n").unwrap();
    assert_eq!(b.groups.groups.lock().unwrap().len(), 1);
    let log = crate::fakes::log_lines(&b.d);
    assert!(
        log.iter().any(|l| l.contains("busy: removing it later")),
        "{log:?}"
    );
    // The monitor tries again each round.
    for _ in 0..2 {
        b.d.monitor_once();
    }
    assert!(b.groups.groups.lock().unwrap().is_empty());
    b.done();
}

#[test]
fn relative_paths_are_resolved_once_from_an_absolute_directory() {
    let b = Bench::new("paths");
    let text = config("p", "ramdisk = 'initrd'\ndisk = ['d.raw,raw,xvda,rw']");
    let e = b.d.create("p.cfg", "etc", &text, &[]).unwrap_err();
    assert!(e.to_string().contains("absolute"), "{e}");
    b.d.create("p.cfg", "/srv/vm", &text, &[]).unwrap();
    let c = b.d.find("p").unwrap().config;
    assert_eq!(c.kernel, std::path::Path::new("/k"));
    assert_eq!(
        c.ramdisk.as_deref(),
        Some(std::path::Path::new("/srv/vm/initrd"))
    );
    assert_eq!(c.disks[0].path, std::path::Path::new("/srv/vm/d.raw"));
    b.done();
}

#[test]
fn a_vsock_cid_in_use_is_refused_before_anything_is_made() {
    let b = Bench::new("cid");
    b.d.create("a.cfg", "/", &config("a", "vsock = 'cid=9'"), &[])
        .unwrap();
    let id = b.d.find("a").unwrap().id;
    let spec = std::fs::read_to_string(b.state.join(format!("domains/{id}/vm.json"))).unwrap();
    let spec: domus_api::spec::VmSpec = serde_json::from_str(&spec).unwrap();
    assert_eq!(spec.vsock_cid, Some(9), "the VMM gets the CID");
    let e =
        b.d.create("b.cfg", "/", &config("b", "vsock = 'cid=9'"), &[])
            .unwrap_err();
    assert!(
        matches!(&e, Error::CidInUse { cid: 9, name } if name == "a"),
        "{e}"
    );
    assert_eq!(e.status(), 409);
    assert!(b.d.find("b").is_err());
    assert_eq!(b.started.lock().unwrap().len(), 1);
    b.d.create("b.cfg", "/", &config("b", "vsock = 'cid=10'"), &[])
        .unwrap();
    b.done();
}

#[test]
fn a_configuration_the_vmm_refuses_is_a_400_and_leaves_nothing() {
    // `domus run` exits with status 2 for input it refuses (a missing
    // kernel, too little memory); the stand-in does so at once.
    let stand_in = StandIn::new(Duration::from_secs(5), Some((Duration::from_millis(10), 2)));
    let started = stand_in.started.clone();
    let (d, state) = daemon("refused-config", crate::fakes::host(stand_in));
    let e = d.create("r.cfg", "/", &config("r", ""), &[]).unwrap_err();
    assert!(matches!(e, Error::Refused { .. }), "{e}");
    assert_eq!(e.status(), 400);
    assert_nothing_left(&d, &state, &started.lock().unwrap());
    let _ = std::fs::remove_dir_all(state);
}

#[test]
fn the_state_directory_and_database_are_the_owners_alone() {
    use std::os::unix::fs::PermissionsExt;
    let b = Bench::new("private");
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&b.state), 0o700);
    assert_eq!(mode(&b.state.join("state.db")), 0o600);
    b.done();
}
