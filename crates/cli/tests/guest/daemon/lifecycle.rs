//! Domain lifecycle through the daemon: create, list, destroy, a daemon
//! restart, shutdown and reboot, and many creates at once.

use super::*;
use domus_api::client::{ClientError, DaemonClient, Endpoint};
use domus_api::daemon::CreateRequest;

#[test]
fn daemon_finds_eight_domains_again_after_a_sigkill_and_destroy_releases_all() {
    let dir = scratch("daemon");
    let state = dir.join("state");
    let k = kit();
    let mut daemon = start_daemon(&state);
    let tag = std::process::id() % 100_000;
    let br = format!("ddb{tag}");
    let _bridge = Bridge::new(&br, "10.80.0.1/24", &[]);
    // Eight idle domains, each with an interface on the bridge.
    let names = [
        "dom-a", "dom-b", "dom-c", "dom-d", "dom-e", "dom-f", "dom-g", "dom-h",
    ];
    for n in names {
        let cfg = domain_config(
            &dir,
            n,
            192,
            "-- while :; do sleep 1; done",
            &format!("maxmem = 256\nvcpus = 1\nvif = ['bridge={br}']\non_crash = 'destroy'"),
        );
        let (ok, out, err) = domus_cli(&state, &["create", cfg.to_str().unwrap()]);
        assert!(ok, "create {n}: {out}{err}");
    }
    // A bad config is refused with its file, line and key, and changes nothing.
    let bad = dir.join("bad.cfg");
    std::fs::write(
        &bad,
        format!(
            "name = 'bad'\nkernel = '{}'\nvcpus = 'many'\n",
            k.kernel.display()
        ),
    )
    .unwrap();
    let (ok, _, err) = domus_cli(&state, &["create", bad.to_str().unwrap()]);
    assert!(!ok && err.contains("bad.cfg:3: vcpus"), "{err}");
    let (ok, _, err) = domus_cli(
        &state,
        &["create", bad.to_str().unwrap(), "vcpus=1", "name=dom-a"],
    );
    assert!(!ok && err.contains("exists"), "{err}");

    let l = list(&state);
    assert_eq!(l.len(), 9, "{l:?}");
    assert_eq!((l[0].id, l[0].name.as_str()), (0, "Domain-0"));
    // A guest the nested host triple-faulted is being restarted (see
    // below); every other one runs.
    for (d, n) in l[1..].iter().zip(names) {
        assert_eq!(d.name, n);
        let restarting =
            d.state == State::Restarting && triple_faulted(&daemon.log).contains(&n.to_string());
        assert!(d.state == State::Running || restarting, "{d:?}");
    }
    // Each holds its maxmem (256 MiB) and its VMM's allowance (64 MiB),
    // however little it uses now.
    assert_eq!(info(&state).domain_memory_mib, 8 * (256 + 64));
    let pids: Vec<u64> = l[1..].iter().map(|d| d.pid.unwrap() as u64).collect();
    assert_confined(pids[0], &state);

    // SIGKILL the daemon: the domains keep running and a new daemon finds
    // them. A guest that triple-faults resets, and the daemon restarts it
    // (on_reboot) in a new VMM; in the nested test host an idle guest has
    // been seen to do that now and then (README, "Known issues"). Such a
    // domain must have been logged as triple-faulted; every other domain
    // keeps its VMM.
    let log = daemon.log.clone();
    let reset = || triple_faulted(&log);
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    for (n, p) in names.iter().zip(&pids) {
        assert!(
            alive(*p) || reset().contains(&n.to_string()),
            "{n} (pid {p}) died with the daemon"
        );
    }
    let mut daemon = start_daemon(&state);
    let end = Instant::now() + Duration::from_secs(30);
    let l = loop {
        let l = list(&state);
        if l[1..].iter().all(|d| d.state == State::Running) || Instant::now() > end {
            break l;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(l[1..].iter().all(|d| d.state == State::Running), "{l:?}");
    let again: Vec<u64> = l[1..].iter().map(|d| d.pid.unwrap() as u64).collect();
    for ((n, p), q) in names.iter().zip(&pids).zip(&again) {
        assert!(
            p == q || reset().contains(&n.to_string()),
            "{n}: pid {p} before the daemon restart, {q} after"
        );
    }
    let pids = again;

    // Destroy releases everything.
    for n in names {
        let (ok, _, err) = domus_cli(&state, &["destroy", n]);
        assert!(ok, "destroy {n}: {err}");
    }
    for p in &pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{p}")).exists(),
            "VMM {p} outlived destroy"
        );
    }
    assert_eq!(list(&state).len(), 1);
    assert_eq!(info(&state).domain_memory_mib, 0, "reservations left");
    assert_eq!(
        std::fs::read_dir(state.join("domains")).unwrap().count(),
        0,
        "files left"
    );
    let links = Command::new("ip").args(["-o", "link"]).output().unwrap();
    let links = String::from_utf8_lossy(&links.stdout);
    let prefix = format!(": dm{}", domus_daemon::instance_tag(&state));
    assert!(!links.contains(&prefix), "taps left: {links}");
    assert_no_cgroups_left(&state);
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn daemon_50_concurrent_creates_and_destroys_leave_nothing_behind() {
    let dir = scratch("churn");
    let state = dir.join("state");
    let mut daemon = start_daemon(&state);
    let sock = state.join("domusd.sock");
    let cfgs: Vec<String> = (0..25)
        .map(|i| {
            std::fs::read_to_string(spin_config(
                &dir,
                &format!("c{i}"),
                "",
                "while :; do sleep 5; done",
            ))
            .unwrap()
        })
        .collect();
    // 25 creates and 25 destroys of the same domains, all at once, through
    // the typed client: each answer is a success or an API error with its
    // status, never a failed exchange.
    let client = DaemonClient::new(Endpoint::Unix(sock));
    let status = |r: Result<(), ClientError>| match r {
        Ok(()) => Ok(200),
        Err(e @ ClientError::Api { .. }) => Ok(e.status().unwrap_or(0)),
        Err(e) => Err(e.to_string()),
    };
    let mut hs = Vec::new();
    for (i, cfg) in cfgs.into_iter().enumerate() {
        let c = client.clone();
        hs.push(std::thread::spawn(move || {
            let req = CreateRequest {
                config: cfg,
                file: Some(format!("c{i}.cfg")),
                ..CreateRequest::default()
            };
            status(c.create(&req).map(drop))
        }));
        let c = client.clone();
        hs.push(std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20 * i as u64));
            status(c.destroy(&format!("c{i}")))
        }));
    }
    for h in hs {
        let status = h.join().unwrap().expect("the daemon answers every request");
        assert!([200, 404, 500].contains(&status), "{status}");
    }
    // Whatever survived the race goes now.
    for d in list(&state).iter().filter(|d| d.id != 0) {
        let (ok, _, err) = domus_cli(&state, &["destroy", &d.name]);
        assert!(ok, "{err}");
    }
    std::thread::sleep(Duration::from_millis(500));
    let l = list(&state);
    assert_eq!(l.len(), 1, "{l:?}");
    // No VMM, files, reservations or cgroups left.
    let ps = Command::new("pgrep")
        .args(["-f", &format!("api-socket {}", state.display())])
        .output()
        .unwrap();
    assert!(
        ps.stdout.is_empty(),
        "VMMs left: {}",
        String::from_utf8_lossy(&ps.stdout)
    );
    assert_eq!(
        std::fs::read_dir(state.join("domains")).unwrap().count(),
        0,
        "files left"
    );
    assert_eq!(info(&state).domain_memory_mib, 0);
    assert_no_cgroups_left(&state);
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn daemon_create_c_shows_the_console_and_shutdown_w_stops_the_guest() {
    let dir = scratch("power");
    let state = dir.join("state");
    let mut daemon = start_daemon(&state);
    let describe = |dom: &str| find(&state, dom);

    // create -c follows the console until the domain goes away.
    let cfg = spin_config(&dir, "brief", "", "echo hello-from-the-console");
    let (ok, out, err) = domus_cli(&state, &["create", "-c", cfg.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("hello-from-the-console"), "{out}");
    assert!(
        describe("brief").is_none(),
        "on_poweroff=destroy removes it"
    );

    // shutdown -w: a guest that would run for ten minutes stops cleanly
    // (its power button handler runs) and the domain goes away.
    let long = "echo guest-up; sleep 600";
    let cfg = spin_config(&dir, "down", "", long);
    assert!(domus_cli(&state, &["create", cfg.to_str().unwrap()]).0);
    expect_console(&state, "down", "guest-up", 1, 180);
    let t = Instant::now();
    let (ok, out, err) = domus_cli(&state, &["shutdown", "-w", "down"]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("has shut down"), "{out}");
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    assert!(describe("down").is_none());
    let (_, log, _) = domus_cli(&state, &["dmesg"]);
    assert!(log.contains("asked domain down to poweroff"), "{log}");
    assert!(log.contains("domain down powered off"), "{log}");

    // A guest that ignores the button (no acpid): -w says so, gives up,
    // and with -F destroys it when the wait ends.
    let deaf = "killall acpid; echo guest-up; sleep 600";
    let cfg = spin_config(&dir, "deaf", "", deaf);
    assert!(domus_cli(&state, &["create", cfg.to_str().unwrap()]).0);
    expect_console(&state, "deaf", "guest-up", 1, 180);
    let (ok, _, err) = domus_cli(&state, &["shutdown", "-w", "--timeout", "4", "deaf"]);
    assert!(!ok && err.contains("-F destroys it"), "{err}");
    assert!(err.contains("ignores the button"), "{err}");
    assert!(describe("deaf").is_some());
    let (ok, out, err) = domus_cli(&state, &["shutdown", "-w", "-F", "--timeout", "4", "deaf"]);
    assert!(ok && out.contains("destroyed (-F)"), "{out}{err}");
    assert!(describe("deaf").is_none());
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn daemon_mem_max_device_lists_and_reboot_w_in_a_fresh_vmm() {
    let dir = scratch("reboot");
    let state = dir.join("state");
    let mut daemon = start_daemon(&state);
    let console_of = |id: i64| console_path(&state, id);
    let describe = |dom: &str| find(&state, dom);
    let long = "echo guest-up; sleep 600";

    // mem-max: below the current memory is refused with the numbers; above
    // the guest's RAM applies from the next start, which a reboot is.
    let img = image(&dir, "again.img", 8);
    let cfg = spin_config(
        &dir,
        "again",
        &format!(
            "disk = ['{},raw,xvda,rw']\nvif = ['mac=52:54:00:12:34:56']",
            img.display()
        ),
        &format!("head -c 65536 /dev/vda > /dev/null; {long}"),
    );
    let (ok, out, err) = domus_cli(&state, &["create", cfg.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    let d = describe("again").unwrap();
    let (id, pid) = (d.id, d.pid);
    let (ok, _, err) = domus_cli(&state, &["mem-max", "again", "100"]);
    assert!(
        !ok && err.contains("below") && err.contains("128 MiB"),
        "{err}"
    );
    let (ok, out, err) = domus_cli(&state, &["mem-max", "again", "192M"]);
    assert!(ok, "{err}");
    assert!(out.contains("until its next start"), "{out}");
    assert_eq!(describe("again").unwrap().maxmem_mib, Some(192));
    let cg = std::path::Path::new("/sys/fs/cgroup/domus")
        .join(format!("{}-d{id}", domus_daemon::instance_tag(&state)));
    let memory_max = || {
        std::fs::read_to_string(cg.join("memory.max"))
            .map(|s| s.trim().parse::<u64>().unwrap() >> 20)
            .ok()
    };
    if cg.exists() {
        assert_eq!(
            memory_max(),
            Some(128 + 64),
            "the running guest's RAM bounds it"
        );
    }

    // block-list and network-list show the disk (the guest read 64 KiB of
    // it) and the interface.
    expect_console(&state, "again", "guest-up", 1, 180);
    let (ok, out, err) = domus_cli(&state, &["block-list", "again", "--json"]);
    assert!(ok, "{err}");
    let disks: Vec<domus_api::vmm::DeviceInfo> = serde_json::from_str(&out).unwrap();
    assert_eq!(disks.len(), 1, "{disks:?}");
    assert_eq!(disks[0].id, "vda");
    assert!(disks[0].counter("read_bytes") >= 65536, "{disks:?}");
    let (ok, out, _) = domus_cli(&state, &["block-list", "again"]);
    assert!(
        ok && out.contains("vda") && out.contains("again.img"),
        "{out}"
    );
    let (ok, out, _) = domus_cli(&state, &["network-list", "again"]);
    assert!(ok && out.contains("52:54:00:12:34:56"), "{out}");
    let (ok, _, err) = domus_cli(&state, &["block-list", "ghost"]);
    assert!(!ok && err.contains("ghost"), "{err}");

    // reboot -w: the guest powers off through its button and the domain
    // comes back at once in a fresh VMM (on_reboot = restart, the default),
    // now with 192 MiB of RAM.
    // The old VMM keeps writing to its unlinked file; the new one makes a
    // fresh file, so what is found there below comes from the new boot.
    std::fs::remove_file(console_of(id)).unwrap();
    let (ok, out, err) = domus_cli(&state, &["reboot", "-w", "again"]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("has rebooted"), "{out}");
    let d = describe("again").unwrap();
    assert_eq!(d.state, State::Running);
    assert_ne!(d.pid, pid);
    assert_eq!(d.restarts, 1);
    assert!(d.shutdown_requested.is_none(), "{d:?}");
    // The guest boots again.
    expect_console(&state, "again", "guest-up", 1, 180);
    let (ok, long, _) = domus_cli(&state, &["list", "-l"]);
    assert!(ok && long.contains("\"maxmem_mib\": 192"), "{long}");
    if cg.exists() {
        assert_eq!(memory_max(), Some(192 + 64));
    }
    // A domain that is not running cannot be asked to stop.
    let (ok, _, err) = domus_cli(&state, &["shutdown", "ghost"]);
    assert!(!ok && err.contains("ghost"), "{err}");
    assert!(domus_cli(&state, &["destroy", "again"]).0);
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

/// The VMM `pid` of the daemon in `state` cannot gain privileges, dumps no
/// core, and holds none of the daemon's descriptors (its database, its
/// socket).
fn assert_confined(pid: u64, state: &std::path::Path) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let core = limits
        .lines()
        .find(|l| l.starts_with("Max core file size"))
        .unwrap();
    assert!(core.split_whitespace().nth(4) == Some("0"), "{limits}");
    let nofile = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    assert!(nofile.split_whitespace().nth(3) == Some("4096"), "{limits}");
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap() {
        let target = std::fs::read_link(fd.unwrap().path()).unwrap_or_default();
        assert!(
            !target.starts_with(state) || target.starts_with(state.join("domains")),
            "the VMM holds the daemon's {}",
            target.display()
        );
    }
}
