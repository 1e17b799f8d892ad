//! A domain from `domus image build`'s Debian image, on the default
//! network: systemd boots to multi-user with no failed unit, DHCP gives it
//! an address on the daemon's bridge, the host reaches it by ping and by
//! SSH with the key the configuration gave, it resolves the host's name
//! through the daemon's DNS, and it powers off on `domus shutdown -w`,
//! taking its overlay and seed disk with it. A second test: a domain of a
//! cloud image as users bring them (tools/cloud-standin's, partitioned as
//! Debian's genericcloud images are, imported with `domus image import`)
//! boots to SSH the same way, its root on /dev/vda1.
//!
//! Their names start with `debian_`: tools/test runs them in the nested-host
//! platform where Debian guests boot cleanly (tools/NOTES.md).
//!
//! The image and the stand-in are made before the nested host starts (it
//! has no network) by tools/test, cached, into $DOMUS_TEST_IMAGES.

use super::*;

/// Where tools/test built the test image (named `domus-test`).
fn test_images() -> std::path::PathBuf {
    let d = std::env::var_os("DOMUS_TEST_IMAGES")
        .map(std::path::PathBuf::from)
        .expect(
            "DOMUS_TEST_IMAGES: the directory tools/test builds the test image into \
         (domus image build --dir DIR domus-test)",
        );
    assert!(
        d.join("domus-test/image.json").is_file(),
        "no image domus-test in {}",
        d.display()
    );
    d
}

/// Runs `cmd` on `ip` as the image's default user with `key`: whether it
/// succeeded, its stdout, and its stderr (ssh's own messages).
fn ssh(
    key: &std::path::Path,
    known: &std::path::Path,
    ip: &str,
    cmd: &str,
) -> (bool, String, String) {
    let out = Command::new("ssh")
        .arg("-i")
        .arg(key)
        .args([
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=5",
            // A guest that stops answering (the nested host triple-faults
            // guests, and the daemon then restarts the domain) sends no
            // RST to a connection that is only waiting for output: without
            // keepalives ssh would wait forever, and the test with it.
            "-o",
            "ServerAliveInterval=5",
            "-o",
            "ServerAliveCountMax=6",
            "-o",
            "StrictHostKeyChecking=accept-new",
        ])
        .arg("-o")
        .arg(format!("UserKnownHostsFile={}", known.display()))
        .arg(format!("debian@{ip}"))
        .arg(cmd)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A test's daemon on a default network of its own (bridge `bridge`,
/// `net`), serving the test images, and an SSH key pair for the domains:
/// the scratch directory, the state directory, the daemon, the private
/// key's path and the public key.
struct ImageSetup {
    dir: std::path::PathBuf,
    state: std::path::PathBuf,
    _daemon: TestDaemon,
    key: std::path::PathBuf,
    public: String,
}

fn image_setup(name: &str, bridge: &str, net: &str) -> ImageSetup {
    let images = test_images();
    let dir = scratch(name);
    let state = dir.join("state");
    let images_arg = images.display().to_string();
    let daemon = start_daemon_with(
        &state,
        &[
            "--image-dir",
            &images_arg,
            "--network-bridge",
            bridge,
            "--network",
            net,
        ],
    );
    let key = dir.join("id_ed25519");
    let made = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", ""])
        .arg("-f")
        .arg(&key)
        .status()
        .unwrap();
    assert!(made.success());
    let public = std::fs::read_to_string(dir.join("id_ed25519.pub")).unwrap();
    ImageSetup {
        dir,
        state,
        _daemon: daemon,
        key,
        public,
    }
}

/// A domain config of `image` on the default network, 2 vCPUs, 1 GiB.
fn image_config(dir: &std::path::Path, name: &str, image: &str, public: &str) -> PathBuf {
    let cfg = dir.join(format!("{name}.cfg"));
    std::fs::write(
        &cfg,
        format!(
            "name = '{name}'\nimage = '{image}'\nmemory = 1024\nvcpus = 2\nvif = ['']\nssh_keys = ['{}']\n",
            public.trim()
        ),
    )
    .unwrap();
    cfg
}

// The image domain and the imported cloud image are two tests, each with its
// own daemon and network, so that a guest the nested host triple-faults
// (tools/NOTES.md) costs tools/test one systemd boot again, not two.
#[test]
fn debian_image_domains_boot_get_addresses_and_answer_ssh_with_the_injected_key() {
    let ImageSetup {
        dir,
        state,
        _daemon,
        key,
        public,
    } = image_setup("image", "dtest0", "10.201.0.1/24");
    let cfg = image_config(&dir, "web", "domus-test", &public);
    // A name that is no image: refused, nothing made.
    let (ok, _, err) = domus_cli(&state, &["create", cfg.to_str().unwrap(), "image=nothing"]);
    assert!(!ok && err.contains("no image 'nothing'"), "{err}");
    let (ok, out, err) = domus_cli(&state, &["create", cfg.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    let started = Instant::now();
    let overlays = state.join("overlays");
    assert!(overlays.join("web.qcow2").is_file() && overlays.join("web.seed.img").is_file());
    // Its address, from the daemon's DHCP (network-list shows the lease).
    let ip = lease(&state, "web", 1, started);
    assert!(ip.starts_with("10.201.0."), "{ip}");
    let lease_s = started.elapsed().as_secs_f64();
    ping(&ip);
    // SSH with the injected key (sshd comes up after the lease).
    let known = dir.join("known_hosts");
    ssh_up(&key, &known, &ip, "web", started, &state);
    let ssh_s = started.elapsed().as_secs_f64();
    // systemd reached multi-user with no failed unit.
    // (Asked again while sshd is not answering: cloud-init may restart it
    // before the boot is done.)
    let (mut state_of, mut err) = (String::new(), String::new());
    for _ in 0..30 {
        let (_, out, e) = ssh(
            &key,
            &known,
            &ip,
            "timeout 300 systemctl is-system-running --wait; systemctl --failed --no-legend --plain",
        );
        (state_of, err) = (out, e);
        if !state_of.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    assert_eq!(state_of.trim(), "running", "{state_of}{err}");
    let running_s = started.elapsed().as_secs_f64();
    let (ok, out, err) = ssh(&key, &known, &ip, "getent hosts host.domus");
    assert!(ok && out.starts_with("10.201.0.1 "), "{out}{err}");
    // Another key is refused.
    let other = dir.join("other");
    Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", ""])
        .arg("-f")
        .arg(&other)
        .status()
        .unwrap();
    let (ok, _, _) = ssh(&other, &known, &ip, "true");
    assert!(!ok, "a key the domain was not given logs in");
    eprintln!(
        "image domain: lease after {lease_s:.1} s, SSH after {ssh_s:.1} s, \
         systemd running after {running_s:.1} s"
    );
    // The power button: systemd-logind powers it off.
    let (ok, out, err) = domus_cli(&state, &["shutdown", "-w", "web"]);
    assert!(ok, "{out}{err}");
    let left = find(&state, "web");
    assert!(
        left.is_none(),
        "web is still listed after its power-off: {left:?}"
    );
    eprintln!(
        "image domain: powered off after {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(
        !overlays.join("web.qcow2").exists() && !overlays.join("web.seed.img").exists(),
        "its overlay and seed go with it"
    );

    let _ = std::fs::remove_dir_all(dir);
}

/// A domain of a cloud image as users bring them: tools/cloud-standin laid
/// the test image out as Debian's genericcloud images are (a GPT, the root
/// on partition 1) and imported it (`domus image import`): booted from the
/// kernel and initrd taken out of it, its root found by UUID.
#[test]
fn debian_imported_cloud_image_boots_with_its_root_on_partition_1() {
    let rec = std::fs::read_to_string(test_images().join("cloud-standin/image.json"))
        .expect("tools/test imports the image cloud-standin");
    assert!(rec.contains("\"root\": \"UUID="), "{rec}");
    let ImageSetup {
        dir,
        state,
        _daemon,
        key,
        public,
    } = image_setup("cloud-image", "dtest1", "10.202.0.1/24");
    let cloud_cfg = image_config(&dir, "cloud", "cloud-standin", &public);
    let (ok, out, err) = domus_cli(&state, &["create", cloud_cfg.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    let cloud_started = Instant::now();
    let ip = lease(&state, "cloud", 1, cloud_started);
    assert!(ip.starts_with("10.202.0."), "{ip}");
    let known = dir.join("known_hosts_cloud");
    ssh_up(&key, &known, &ip, "cloud", cloud_started, &state);
    let (ok, out, err) = ssh(&key, &known, &ip, "findmnt -no SOURCE /");
    assert!(
        ok && out.trim() == "/dev/vda1",
        "the root is partition 1: {out}{err}"
    );
    eprintln!(
        "imported image domain: SSH after {:.1} s",
        cloud_started.elapsed().as_secs_f64()
    );
    let (ok, out, err) = domus_cli(&state, &["shutdown", "-w", "cloud"]);
    assert!(ok, "{out}{err}");
    assert!(find(&state, "cloud").is_none());
    let _ = std::fs::remove_dir_all(dir);
}

/// The address the daemon's DHCP leased to domain `name` (id `id`), as
/// `network-list` shows it; within 300 s of `started`. A domain the daemon
/// is restarting has none yet.
fn lease(state: &std::path::Path, name: &str, id: u32, started: Instant) -> String {
    loop {
        let (ok, out, err) = domus_cli(state, &["network-list", "--json", name]);
        if !ok && !err.contains("is restarting") {
            panic!("{err}");
        }
        let devs: Vec<domus_api::vmm::DeviceInfo> = if ok {
            serde_json::from_str(&out).unwrap()
        } else {
            Vec::new()
        };
        if let Some(ip) = devs
            .iter()
            .map(|d| d.fact("ip").to_string())
            .find(|i| !i.is_empty())
        {
            return ip;
        }
        if started.elapsed() > Duration::from_secs(300) {
            let console = std::fs::read_to_string(console_path(state, id)).unwrap_or_default();
            // A guest that stopped on the way (CI once saw its console end
            // mid-line 5 s into the kernel's boot) is captured as
            // expect_console's are, so that tools/test can tell the nested
            // host's stall from Domus's.
            let report = stall_capture(state, name, &console);
            panic!("{name}: no DHCP lease after 300 s\n{report}\nconsole:\n{console}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn ping(ip: &str) {
    let ping = Command::new("ping")
        .args(["-c", "1", "-W", "5", ip])
        .output()
        .unwrap();
    assert!(
        ping.status.success(),
        "{}",
        String::from_utf8_lossy(&ping.stdout)
    );
}

/// Waits (to 420 s after `started`) for an SSH login with `key` to `ip`,
/// whose hostname cloud-init must have set to `hostname`: domain
/// `hostname` of the daemon at `state`, whose VMM is captured as lease's
/// is when the login never comes (CI once saw a guest's second vCPU stop
/// answering, its console full of RCU stalls, after the lease).
fn ssh_up(
    key: &std::path::Path,
    known: &std::path::Path,
    ip: &str,
    hostname: &str,
    started: Instant,
    state: &std::path::Path,
) {
    let mut last = String::new();
    while started.elapsed() < Duration::from_secs(420) {
        let (ok, out, err) = ssh(key, known, ip, "hostname");
        if ok {
            assert_eq!(out.trim(), hostname, "cloud-init set the hostname");
            return;
        }
        last = err;
        std::thread::sleep(Duration::from_secs(2));
    }
    let console = find(state, hostname)
        .and_then(|d| std::fs::read_to_string(console_path(state, d.id)).ok())
        .unwrap_or_default();
    let report = stall_capture(state, hostname, &console);
    panic!("no SSH login to {hostname} within 420 s: {last}\n{report}");
}
