//! Devices through the daemon: hot-plug of disks and interfaces, and
//! memory set at run time.

use super::*;

#[test]
fn daemon_hot_plugs_disks_and_interfaces() {
    let dir = scratch("hotplug");
    let state = dir.join("state");
    let mut daemon = start_daemon(&state);
    let br = format!("dhp{}", std::process::id() % 100_000);
    let _bridge = Bridge::new(&br, "10.81.0.1/24", &[]);
    let img = dir.join("data.img");
    let mut data = b"domus-hotplug-ok".to_vec();
    data.resize(1 << 20, 0);
    std::fs::write(&img, &data).unwrap();
    let (cfg, guest) = agent_config(&dir, "hp", 128, "");
    let (ok, out, err) = domus_cli(&state, &["create", cfg.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    let id = find(&state, "hp").expect("hp is listed").id;
    agent_ready(&guest);
    let sh = |cmd: &str| guest_sh(&guest, cmd);
    // Waits in the guest (up to 30 s) until the shell test `cond` holds.
    let until = |cond: &str| {
        sh(&format!(
            "for i in $(seq 300); do {cond} && exit 0; sleep 0.1; done; exit 1"
        ))
    };

    // block-attach: the disk appears in the guest with its data, and in
    // block-list.
    let spec = format!("{},raw,xvda,ro", img.display());
    let (ok, out, err) = domus_cli(&state, &["block-attach", "hp", &spec]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("attached vda"), "{out}");
    until("[ -b /dev/vda ]");
    assert_eq!(sh("head -c 16 /dev/vda"), "domus-hotplug-ok");
    let (_, out, _) = domus_cli(&state, &["block-list", "hp"]);
    assert!(out.contains("vda") && out.contains("ro"), "{out}");
    let (ok, _, err) = domus_cli(&state, &["block-attach", "hp", "relative.img,raw,xvdb,rw"]);
    assert!(!ok && err.contains("absolute"), "{err}");
    // A host file the daemon does not serve (not under an --image-dir).
    let (ok, _, err) = domus_cli(&state, &["block-attach", "hp", "/etc/shadow,raw,xvdc,ro"]);
    assert!(
        !ok && err.contains("is not in a directory the daemon serves"),
        "{err}"
    );
    let (ok, _, err) = domus_cli(&state, &["block-attach", "hp", &spec]);
    assert!(!ok && err.contains("already has a disk xvda"), "{err}");

    // network-attach: eth0 appears and reaches the host over the bridge.
    let (ok, out, err) = domus_cli(
        &state,
        &[
            "network-attach",
            "hp",
            &format!("bridge={br}"),
            "mac=52:54:00:0a:0b:0c",
        ],
    );
    assert!(ok, "{out}{err}");
    until("[ -e /sys/class/net/eth0 ]");
    sh("ip addr add 10.81.0.2/24 dev eth0 && ip link set eth0 up");
    until("ping -c1 -W1 10.81.0.1 >/dev/null");
    let (_, out, _) = domus_cli(&state, &["network-list", "hp"]);
    assert!(out.contains("52:54:00:0a:0b:0c"), "{out}");

    // block-detach: the guest lets go and the disk leaves the guest, the
    // VMM and block-list.
    let (ok, out, err) = domus_cli(&state, &["block-detach", "hp", "vda"]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("detached vda"), "{out}");
    until("[ ! -b /dev/vda ]");
    let (_, out, _) = domus_cli(&state, &["block-list", "hp", "--json"]);
    assert_eq!(out.trim(), "[]");

    // network-detach by MAC: the interface and, soon after, its tap go.
    let (ok, out, err) = domus_cli(&state, &["network-detach", "hp", "52:54:00:0a:0b:0c"]);
    assert!(ok, "{out}{err}");
    let tap = format!("dm{}{id}n0", domus_daemon::instance_tag(&state));
    let end = Instant::now() + Duration::from_secs(10);
    while std::path::Path::new("/sys/class/net").join(&tap).exists() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        !std::path::Path::new("/sys/class/net").join(&tap).exists(),
        "tap {tap} left"
    );
    let (_, out, _) = domus_cli(&state, &["network-list", "hp", "--json"]);
    assert_eq!(out.trim(), "[]");
    let (ok, _, err) = domus_cli(&state, &["network-detach", "hp", "3"]);
    assert!(!ok && err.contains("net3"), "{err}");

    // After a reboot the configuration has neither (both were detached),
    // and a disk attached now comes back.
    let (ok, _, err) = domus_cli(&state, &["block-attach", "hp", &spec]);
    assert!(ok, "{err}");
    let (ok, out, err) = domus_cli(&state, &["reboot", "-w", "hp"]);
    assert!(ok, "{out}{err}");
    let (ok, out, err) = domus_cli(&state, &["block-list", "hp", "--json"]);
    assert!(ok, "{err}");
    let disks: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(disks.as_array().unwrap().len(), 1, "{disks}");
    let (_, out, _) = domus_cli(&state, &["network-list", "hp", "--json"]);
    assert_eq!(out.trim(), "[]");
    // The fresh VMM's guest has the disk, with its data.
    agent_ready(&guest);
    assert_eq!(guest_sh(&guest, "head -c 16 /dev/vda"), "domus-hotplug-ok");
    assert!(domus_cli(&state, &["destroy", "hp"]).0);
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn daemon_mem_set_shrinks_the_guest_and_the_vmm() {
    let dir = scratch("memset");
    let state = dir.join("state");
    let mut daemon = start_daemon(&state);
    // The guest fills its page cache with a 200 MiB disk: memory that is in
    // use (resident in the VMM), not free, so free page reporting cannot
    // give it back; only the balloon taking it from the guest can.
    let img = image(&dir, "fill.img", 200);
    let cmd = "cat /dev/vda > /dev/null; echo cached; \
               while :; do echo memtotal=$(sed -n 's/MemTotal: *\\([0-9]*\\).*/\\1/p' /proc/meminfo); sleep 1; done";
    let cfg = domain_config(
        &dir,
        "m",
        384,
        &format!("domus.cmd={}", base64(cmd)),
        &format!("disk = ['{},raw,xvda,ro']", img.display()),
    );
    let (ok, out, err) = domus_cli(&state, &["create", cfg.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    let d = find(&state, "m").expect("m is listed");
    let (id, pid) = (d.id, d.pid.expect("m runs") as u64);
    let console = console_path(&state, id);
    expect_console(&state, "m", "memtotal=", 1, 180);
    let memtotal = || -> u64 {
        std::fs::read_to_string(&console)
            .unwrap_or_default()
            .lines()
            .rev()
            .find_map(|l| l.trim().strip_prefix("memtotal="))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            >> 10
    };
    let (total_before, rss_before) = (memtotal(), rss_mib(pid));
    assert!(
        rss_before > 220,
        "the page cache is resident: {rss_before} MiB"
    );
    let (ok, _, err) = domus_cli(&state, &["mem-set", "m", "128M"]);
    assert!(ok, "{err}");
    // The guest gives up 256 MiB: its MemTotal falls by 200 MiB and more,
    // and the VMM's RSS by 150 MiB and more.
    let took = wait_balloon(|| {
        (memtotal() + 200).saturating_sub(total_before)
            + (rss_mib(pid) + 150).saturating_sub(rss_before)
    });
    let (total_after, rss_after) = (memtotal(), rss_mib(pid));
    eprintln!(
        "mem-set 128M: guest MemTotal {total_before} -> {total_after} MiB, VMM RSS {rss_before} -> {rss_after} MiB ({took:?})"
    );
    assert!(
        took.is_ok(),
        "guest MemTotal {total_before} -> {total_after} MiB, VMM RSS {rss_before} -> {rss_after} MiB: {took:?}"
    );
    let (_, l, _) = domus_cli(&state, &["list", "--json"]);
    assert!(l.contains("\"memory_mib\": 128"), "{l}");
    assert!(domus_cli(&state, &["destroy", "m"]).0);
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}
