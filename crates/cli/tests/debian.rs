//! A stock Debian 12 systemd guest under Domus: the guest users actually run,
//! not the busybox kit.
//!
//! Compiled only with `--features guest-tests`; `tools/test` runs it inside
//! `tools/kvm-host` with `$DOMUS_DEBIAN_GUEST` naming the directory that
//! `tools/debian-guest` made (Debian's cloud kernel and initramfs-tools initrd,
//! a 2 GiB ext4 root with systemd, and `root.img.tar.zst`, the same image as a
//! sparse tar). Its `domus-boot-check` unit prints one line once the boot has
//! finished: `domus-boot-check: state=running uptime=S failed=[UNITS]`.
#![cfg(feature = "guest-tests")]

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The boot's whole budget, and the longest silence on the console. A boot
/// took 30 to 60 s in a nested test host beside the other guest tests.
const BOOT_S: u64 = 420;
const SILENCE_S: u64 = 120;
/// From the power button to the VMM's exit (systemd stops every unit first).
const POWEROFF_S: u64 = 120;

fn image_dir() -> PathBuf {
    let dir = std::env::var_os("DOMUS_DEBIAN_GUEST")
        .map(PathBuf::from)
        .expect("DOMUS_DEBIAN_GUEST is not set: tools/test sets it from tools/debian-guest");
    for f in ["vmlinuz", "initrd.img", "root.img.tar.zst"] {
        assert!(
            dir.join(f).is_file(),
            "{} missing: run tools/debian-guest",
            dir.join(f).display()
        );
    }
    dir
}

/// The image, unpacked (sparse) into `dir`: the guest writes to its root.
fn root_copy(image: &Path, dir: &Path) -> PathBuf {
    let status = Command::new("sh")
        .arg("-c")
        .arg("zstd -dc \"$1\" | tar -xSf - -C \"$2\"")
        .arg("sh")
        .arg(image.join("root.img.tar.zst"))
        .arg(dir)
        .status()
        .expect("running zstd and tar");
    assert!(status.success(), "unpacking the Debian image: {status}");
    dir.join("root.img")
}

/// Kills the VMM if the test ends early, so a failed test does not leave a
/// guest running in the nested host.
struct Vmm(Child);

impl Drop for Vmm {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// What the guest's boot-check line says.
#[derive(Debug, PartialEq)]
struct BootCheck {
    state: String,
    failed: Vec<String>,
}

fn parse_check(line: &str) -> Option<BootCheck> {
    let rest = &line[line.find("domus-boot-check: ")? + "domus-boot-check: ".len()..];
    let state = rest.strip_prefix("state=")?.split(' ').next()?.to_string();
    let failed = rest.split("failed=[").nth(1)?.split(']').next()?;
    Some(BootCheck {
        state,
        failed: failed.split_whitespace().map(String::from).collect(),
    })
}

#[test]
fn boot_check_lines_parse() {
    assert_eq!(
        parse_check("\r[ 1.0] x domus-boot-check: state=running uptime=30.2 failed=[]\r"),
        Some(BootCheck {
            state: "running".into(),
            failed: vec![]
        })
    );
    assert_eq!(
        parse_check("domus-boot-check: state=degraded uptime=30.2 failed=[a.service b.mount]"),
        Some(BootCheck {
            state: "degraded".into(),
            failed: vec!["a.service".into(), "b.mount".into()]
        })
    );
    assert_eq!(parse_check("domus-boot-check: state=running"), None);
}

fn tail(lines: &[String]) -> String {
    lines[lines.len().saturating_sub(40)..].join("\n")
}

#[test]
fn debian_systemd_guest_boots_with_no_failed_unit_and_powers_off_on_the_button() {
    let image = image_dir();
    let dir = std::env::temp_dir().join(format!("domus-test-{}-debian", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let root = root_copy(&image, &dir);
    let sock = dir.join("api.sock");
    let mut child = Command::new(env!("CARGO_BIN_EXE_domus"))
        .arg("run")
        .arg("--seccomp")
        .arg("--kernel")
        .arg(image.join("vmlinuz"))
        .arg("--initrd")
        .arg(image.join("initrd.img"))
        .arg("--disk")
        .arg(&root)
        .args(["--vcpus", "2", "--memory", "1G", "--name", "debian"])
        .arg("--api-socket")
        .arg(&sock)
        .args(["--cmdline", "root=/dev/vda rw console=ttyS0 panic=-1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning domus run");
    let stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let mut vmm = Vmm(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });

    // Boot: wait for the check line, failing on a long silence.
    let start = Instant::now();
    let mut console = Vec::new();
    let check = loop {
        let left = Duration::from_secs(BOOT_S).saturating_sub(start.elapsed());
        assert!(
            !left.is_zero(),
            "no boot-check line after {BOOT_S} s; console:\n{}",
            tail(&console)
        );
        match rx.recv_timeout(left.min(Duration::from_secs(SILENCE_S))) {
            Ok(line) => {
                let check = parse_check(&line);
                console.push(line);
                if let Some(c) = check {
                    break c;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => panic!(
                "the console was silent for {SILENCE_S} s ({:.0} s into the boot)\n{}\nconsole:\n{}",
                start.elapsed().as_secs_f64(),
                common::stall_report(vmm.0.id(), &dir, &console.join("\n"), Some(&sock)),
                tail(&console)
            ),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = vmm.0.wait().unwrap();
                panic!(
                    "domus run exited ({status}) before the boot finished; console:\n{}\nstderr:\n{}",
                    tail(&console),
                    err_thread.join().unwrap()
                )
            }
        }
    };
    let booted = start.elapsed();
    assert!(
        check.failed.is_empty() && check.state == "running",
        "the boot finished {check:?}; console:\n{}",
        tail(&console)
    );

    // Shutdown: systemd-logind takes the ACPI power button and powers off.
    let (status, body) = domus_http::request(&sock, "PUT", "/v1/domain/power-button", None)
        .expect("PUT /v1/domain/power-button");
    // 202: the button is pressed; the guest decides what to do.
    assert_eq!(status, 202, "{body}");
    let pressed = Instant::now();
    loop {
        let left = Duration::from_secs(POWEROFF_S).saturating_sub(pressed.elapsed());
        match rx.recv_timeout(left) {
            Ok(line) => console.push(line),
            // The guest stopped on its way down: capture why, as for a
            // silent boot, so that tools/test can tell the nested host's
            // stall from Domus's.
            Err(mpsc::RecvTimeoutError::Timeout) => panic!(
                "still running {POWEROFF_S} s after the power button\n{}\nconsole:\n{}",
                common::stall_report(vmm.0.id(), &dir, &console.join("\n"), Some(&sock)),
                tail(&console)
            ),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = vmm.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the console closed but domus run did not exit"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let stderr = err_thread.join().unwrap();
    assert_eq!(
        status.code(),
        Some(0),
        "exit status after the power button; console:\n{}\nstderr:\n{stderr}",
        tail(&console)
    );
    let text = console.join("\n");
    assert!(
        text.contains("System is powering down") || text.contains("reboot: Power down"),
        "no clean power-off on the console:\n{}",
        tail(&console)
    );
    eprintln!(
        "debian guest: booted in {:.1} s ({} s of guest uptime), off {:.1} s after the power button",
        booted.as_secs_f64(),
        console
            .iter()
            .find_map(|l| l.split("uptime=").nth(1))
            .and_then(|u| u.split(' ').next())
            .unwrap_or("?"),
        pressed.elapsed().as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
