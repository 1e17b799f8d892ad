//! save and restore through the daemon: a jailed domain with a disk and
//! an interface saved, destroyed, and restored with its processes, disk,
//! MAC and network; `save -p` leaves it paused; a restore under a new name;
//! saves outside the served directories or over a file refused.

use super::*;

#[test]
fn daemon_saves_and_restores_a_jailed_domain() {
    let dir = scratch("dsave");
    let state = dir.join("state");
    let mut daemon = start_daemon(&state);
    let br = format!("dsv{}", std::process::id() % 100_000);
    let _bridge = Bridge::new(&br, "10.82.0.1/24", &[]);
    let img = image(&dir, "data.img", 16);
    let settings = format!(
        "disk = ['{},raw,xvda,rw']\nvif = ['bridge={br}']",
        img.display()
    );
    let (cfg, guest) = agent_config(&dir, "sv", 128, &settings);
    let (ok, out, err) = domus_cli(&state, &["create", cfg.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    agent_ready(&guest);
    let sh = |cmd: &str| guest_sh(&guest, cmd);
    let until = |cond: &str| {
        sh(&format!(
            "for i in $(seq 300); do {cond} && exit 0; sleep 0.1; done; exit 1"
        ))
    };
    sh("ip addr add 10.82.0.2/24 dev eth0 && ip link set eth0 up");
    until("ping -c1 -W1 10.82.0.1 >/dev/null");
    let mac = sh("cat /sys/class/net/eth0/address");
    sh("echo in-memory > /tmp/marker");
    sh("echo on-disk | dd of=/dev/vda bs=512 seek=5 conv=fsync 2>/dev/null");

    // Refused: outside the served directories, and over an existing file.
    let (ok, _, err) = domus_cli(&state, &["save", "sv", "/etc/sv.snap"]);
    assert!(
        !ok && err.contains("not in a directory the daemon serves"),
        "{err}"
    );
    let (ok, _, err) = domus_cli(&state, &["save", "sv", img.to_str().unwrap()]);
    assert!(!ok && err.contains("exists"), "{err}");

    // Saved and destroyed.
    let snap = dir.join("sv.snap");
    let (ok, out, err) = domus_cli(&state, &["save", "sv", snap.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("destroyed"), "{out}");
    assert!(find(&state, "sv").is_none(), "a saved domain is destroyed");
    assert!(snap.is_file() && dir.join("sv.snap.mem").is_file());

    // Restored: its memory, disk, MAC and network as they were.
    let (ok, out, err) = domus_cli(&state, &["restore", snap.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    assert_eq!(find(&state, "sv").expect("restored").state, State::Running);
    restored_ready(&guest);
    assert_eq!(sh("cat /tmp/marker"), "in-memory");
    assert_eq!(
        sh("dd if=/dev/vda bs=512 skip=5 count=1 2>/dev/null | head -n1"),
        "on-disk"
    );
    assert_eq!(sh("cat /sys/class/net/eth0/address"), mac);
    until("ping -c1 -W1 10.82.0.1 >/dev/null");
    // A second restore of the same snapshot while the first runs: its
    // name (and vsock CID) are taken.
    let (ok, _, err) = domus_cli(&state, &["restore", snap.to_str().unwrap()]);
    assert!(!ok && err.contains("sv"), "{err}");

    // save -p: saved and left paused; then restored under a new name
    // once the original is gone.
    let snap2 = dir.join("sv2.snap");
    let (ok, out, err) = domus_cli(&state, &["save", "-p", "sv", snap2.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    assert_eq!(find(&state, "sv").unwrap().state, State::Paused);
    assert!(domus_cli(&state, &["destroy", "sv"]).0);
    let (ok, out, err) = domus_cli(
        &state,
        &["restore", snap2.to_str().unwrap(), "name=sv-copy"],
    );
    assert!(ok, "{out}{err}");
    restored_ready(&guest);
    assert_eq!(sh("cat /tmp/marker"), "in-memory");
    let (ok, _, err) = domus_cli(&state, &["restore", snap2.to_str().unwrap(), "memory=64"]);
    assert!(!ok && err.contains("only change the name"), "{err}");
    assert!(domus_cli(&state, &["destroy", "sv-copy"]).0);

    // A configuration with `clone = "FILE"` (relative to it) makes one
    // clone: the saved memory, a CID of its own; nothing else may be set.
    let cfg = dir.join("svc.cfg");
    std::fs::write(&cfg, "name = 'sv-clone'\nclone = 'sv2.snap'\nmemory = 64\n").unwrap();
    let (ok, _, err) = domus_cli(&state, &["create", cfg.to_str().unwrap()]);
    assert!(!ok && err.contains("only its name and clone"), "{err}");
    std::fs::write(&cfg, "name = 'sv-clone'\nclone = 'sv2.snap'\n").unwrap();
    // The first free CID above the saved one is held by a VM the daemon
    // does not know (another test's, another VMM's): the clone passes it
    // over.
    let (held_cid, held) = hold_vsock_cid(u64::from(guest.cid) + 1);
    let (ok, out, err) = domus_cli(&state, &["create", cfg.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    drop(held);
    let d = find(&state, "sv-clone").expect("the clone");
    assert_eq!(d.state, State::Running);
    let cid = d.vsock_cid.expect("a vsock CID");
    assert!(
        cid > u64::from(guest.cid) && cid != held_cid,
        "the clone has a CID of its own, not one another VM holds: {cid}"
    );
    let clone = Client::new(cid as u32, agent::AGENT_PORT);
    restored_ready(&clone);
    assert_eq!(guest_sh(&clone, "cat /tmp/marker"), "in-memory");
    assert!(dir.join("data-sv-clone.img").is_file(), "its disk copy");
    assert!(domus_cli(&state, &["destroy", "sv-clone"]).0);
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    assert_no_cgroups_left(&state);
}

/// Claims the first vsock CID from `from` up that no VM holds, as a VM
/// would (a vhost-vsock of its own), until the file is dropped.
fn hold_vsock_cid(from: u64) -> (u64, std::fs::File) {
    use std::os::fd::AsRawFd;
    const VHOST_VSOCK_SET_GUEST_CID: libc::c_ulong = 0x4008_af60;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/vhost-vsock")
        .expect("/dev/vhost-vsock in the nested host");
    for cid in from..from + 64 {
        // SAFETY: the ioctl reads one u64 from a live local, on our own fd.
        if unsafe { libc::ioctl(f.as_raw_fd(), VHOST_VSOCK_SET_GUEST_CID as _, &cid) } == 0 {
            return (cid, f);
        }
        let e = std::io::Error::last_os_error();
        assert_eq!(
            e.raw_os_error(),
            Some(libc::EADDRINUSE),
            "holding vsock CID {cid}: {e}"
        );
    }
    panic!("no free vsock CID in {from}..{}", from + 64)
}
