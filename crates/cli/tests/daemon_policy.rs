//! What a daemon refuses before it starts anything: host files it does not
//! serve (403) and limits it could not enforce (`--no-cgroups`); and that it
//! does not start at all on a host without the cgroup controllers unless
//! told to. No guest is started, so this runs in the ordinary `cargo test`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("domus-policy-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.join("images")).unwrap();
    d
}

fn cli(state: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_domus"))
        .args(args)
        .env("DOMUS_STATE_DIR", state)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn daemon(state: &Path, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_domus"))
        .args(["daemon", "--state-dir"])
        .arg(state)
        .arg("--no-network")
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn wait_up(state: &Path) {
    let end = Instant::now() + Duration::from_secs(10);
    while !cli(state, &["list"]).0 {
        assert!(Instant::now() < end, "the daemon did not come up");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether this host has cgroup v2 with the controllers the daemon needs.
fn host_has_cgroups() -> bool {
    std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").is_ok_and(|t| {
        let have: Vec<&str> = t.split_whitespace().collect();
        ["cpu", "cpuset", "memory"].iter().all(|c| have.contains(c))
    })
}

#[test]
fn host_files_outside_the_image_dirs_and_unenforceable_limits_are_refused() {
    let dir = scratch("files");
    let state = dir.join("state");
    let images = dir.join("images");
    let kernel = images.join("vmlinuz");
    std::fs::write(&kernel, b"not a kernel").unwrap();
    let mut d = daemon(
        &state,
        &["--no-cgroups", "--image-dir", images.to_str().unwrap()],
    );
    wait_up(&state);
    let k = kernel.display();
    let cases = [
        (
            format!("kernel = '{k}'\nramdisk = '/etc/shadow'"),
            "ramdisk /etc/shadow is not in a directory the daemon serves",
        ),
        // Out through `..` from inside the image directory.
        (
            format!("kernel = '{}/../../../../../etc/shadow'", images.display()),
            "(that is /etc/shadow) is not in a directory",
        ),
        (
            format!("kernel = '{}/missing'", images.display()),
            "No such file",
        ),
        (
            format!("kernel = '{k}'\ncpu_weight = 512"),
            "cpu_weight needs cgroups",
        ),
    ];
    for (i, (settings, why)) in cases.iter().enumerate() {
        let cfg = dir.join(format!("d{i}.cfg"));
        std::fs::write(&cfg, format!("name = 'd{i}'\nmemory = 64\n{settings}\n")).unwrap();
        let (ok, out, err) = cli(&state, &["create", cfg.to_str().unwrap()]);
        assert!(!ok, "case {i} accepted: {out}");
        assert!(err.contains(why), "case {i}: {err}");
    }
    // Nothing was made: no domain, no domain directory.
    let (ok, out, err) = cli(&state, &["list", "--json"]);
    assert!(ok, "{err}");
    let doms: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(doms.len(), 1, "{out}");
    assert_eq!(std::fs::read_dir(state.join("domains")).unwrap().count(), 0);
    // The daemon said it runs without limits.
    let (_, log, _) = cli(&state, &["dmesg"]);
    assert!(log.contains("WITHOUT cgroups"), "{log}");
    d.kill().unwrap();
    d.wait().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn without_cgroup_controllers_the_daemon_starts_only_when_told_to() {
    let dir = scratch("cgroups");
    let state = dir.join("state");
    let mut d = daemon(&state, &[]);
    if host_has_cgroups() {
        // This host can enforce limits: the daemon starts (the guest tests'
        // nested host is such a host and checks the limits themselves).
        wait_up(&state);
        d.kill().unwrap();
        d.wait().unwrap();
    } else {
        let end = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(s) = d.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < end, "the daemon started without cgroups");
            std::thread::sleep(Duration::from_millis(50));
        };
        let out = d.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!status.success());
        assert!(
            err.contains("cgroup") && err.contains("--no-cgroups"),
            "{err}"
        );
        assert!(!state.join("domusd.sock").exists() || !cli(&state, &["list"]).0);
    }
    let _ = std::fs::remove_dir_all(dir);
}
