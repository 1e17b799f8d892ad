//! Guest-booting integration tests: real Debian kernels on real KVM.
//!
//! Compiled only with `--features guest-tests`; `tools/test` runs them inside
//! `tools/kvm-host`, which gives a /dev/kvm that runs stock kernels (directly on
//! a VT-x/AMD-V host, in a nested KVM host elsewhere). The kit comes from
//! `$DOMUS_KIT_DIR` or the default `domus kit` cache.
#![cfg(feature = "guest-tests")]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct Kit {
    kernel: PathBuf,
    vmlinux: PathBuf,
    initrd: PathBuf,
}

fn kit() -> Kit {
    let dir = std::env::var_os("DOMUS_KIT_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(domus_kit::default_dir);
    let k = Kit {
        kernel: dir.join("vmlinuz"),
        vmlinux: dir.join("vmlinux"),
        initrd: dir.join("initramfs.cpio"),
    };
    for p in [&k.kernel, &k.vmlinux, &k.initrd] {
        assert!(
            p.is_file(),
            "{} missing: run `domus kit` first",
            p.display()
        );
    }
    k
}

const GUEST_TIMEOUT_S: u32 = 180;

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
    /// Time from the guest's last line to the VMM's exit.
    tail: Duration,
}

fn boot_with(kernel: &PathBuf, vcpus: u32, memory: &str, command: &str) -> Run {
    let k = kit();
    // A hung guest fails its test instead of hanging the run: coreutils'
    // timeout ends it with status 124.
    let mut child = Command::new("timeout")
        .arg(GUEST_TIMEOUT_S.to_string())
        .arg(env!("CARGO_BIN_EXE_domus"))
        .arg("run")
        .arg("--kernel")
        .arg(kernel)
        .arg("--initrd")
        .arg(&k.initrd)
        .args(["--vcpus", &vcpus.to_string(), "--memory", memory])
        .arg("--cmdline")
        .arg(format!("console=ttyS0 quiet panic=-1 -- {command}"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning domus run");
    let stderr = child.stderr.take().unwrap();
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut s);
        s
    });
    let mut stdout = String::new();
    let mut last_line = Instant::now();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap_or_default();
        last_line = Instant::now();
        stdout.push_str(&line);
        stdout.push('\n');
    }
    let status = child.wait().unwrap();
    let tail = last_line.elapsed();
    Run {
        code: status.code().unwrap_or(-1),
        stdout,
        stderr: err_thread.join().unwrap(),
        tail,
    }
}

fn boot(vcpus: u32, memory: &str, command: &str) -> Run {
    boot_with(&kit().kernel, vcpus, memory, command)
}

/// The value printed as `key=value` by the guest command.
fn value(run: &Run, key: &str) -> u64 {
    let prefix = format!("{key}=");
    run.stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "no {key}= in guest output:\n{}\nstderr:\n{}",
                run.stdout, run.stderr
            )
        })
}

#[track_caller]
fn assert_clean_poweroff(run: &Run) {
    assert_eq!(
        run.code, 0,
        "exit status; stdout:\n{}\nstderr:\n{}",
        run.stdout, run.stderr
    );
    assert!(
        run.stdout.contains("domus-init: exit status 0"),
        "{}",
        run.stdout
    );
}

#[test]
fn bzimage_guest_sees_1_2_and_4_vcpus() {
    for n in [1, 2, 4] {
        let r = boot(n, "256M", "echo cpus=$(nproc)");
        assert_clean_poweroff(&r);
        assert_eq!(value(&r, "cpus"), u64::from(n));
    }
}

#[test]
fn elf_vmlinux_boots_with_smp() {
    let k = kit();
    let r = boot_with(&k.vmlinux, 2, "256M", "echo cpus=$(nproc)");
    assert_clean_poweroff(&r);
    assert_eq!(value(&r, "cpus"), 2);
}

/// The RAM the guest kernel found (the total of "Memory: availK/totalK
/// available", which counts every page of the firmware memory map) and MemTotal.
/// Linux takes at most 32 init arguments, so the command stays short.
const MEM_CMD: &str = "dmesg | grep Memory: ; grep MemTotal /proc/meminfo";

fn kib_after(run: &Run, marker: &str, before: &str) -> u64 {
    run.stdout
        .lines()
        .find_map(|l| {
            let rest = &l[l.find(marker)? + marker.len()..];
            rest[..rest.find(before)?].trim().parse().ok()
        })
        .unwrap_or_else(|| panic!("no '{marker}' in guest output:\n{}", run.stdout))
}

#[test]
fn guest_sees_the_memory_asked_for() {
    for (arg, bytes) in [
        ("256M", 256u64 << 20),
        ("1G", 1 << 30),
        ("3584", 3584 << 20),
    ] {
        let r = boot(1, arg, MEM_CMD);
        assert_clean_poweroff(&r);
        let ram = kib_after(&r, "K/", "K available") << 10;
        let diff = (ram as f64 - bytes as f64).abs() / bytes as f64;
        assert!(
            diff < 0.05,
            "{arg}: guest sees {ram} bytes of RAM ({:.1}% off)",
            diff * 100.0
        );
        // MemTotal is what is left after the kernel's own reservations.
        let total = kib_after(&r, "MemTotal:", "kB") << 10;
        assert!(
            total < bytes && total > bytes / 2,
            "{arg}: MemTotal {total}"
        );
    }
}

#[test]
fn poweroff_exits_0_within_a_second() {
    let r = boot(1, "256M", "true");
    assert_clean_poweroff(&r);
    assert!(
        r.tail < Duration::from_secs(1),
        "took {:?} after the guest's last line",
        r.tail
    );
}

#[test]
fn reboot_exits_3() {
    let r = boot(1, "256M", "echo rebooting; reboot -f");
    assert!(r.stdout.contains("rebooting"), "{}", r.stdout);
    assert_eq!(r.code, 3, "stdout:\n{}\nstderr:\n{}", r.stdout, r.stderr);
}

#[test]
fn panic_exits_4() {
    let r = boot(1, "256M", "echo c > /proc/sysrq-trigger");
    assert_eq!(r.code, 4, "stdout:\n{}\nstderr:\n{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("Kernel panic"), "{}", r.stdout);
    assert!(r.stderr.contains("guest crashed"), "{}", r.stderr);
}

#[test]
fn two_domains_side_by_side() {
    let a = std::thread::spawn(|| boot(2, "256M", "sleep 1; echo who=1"));
    let b = std::thread::spawn(|| boot(1, "384M", "sleep 1; echo who=2"));
    let (a, b) = (a.join().unwrap(), b.join().unwrap());
    assert_clean_poweroff(&a);
    assert_clean_poweroff(&b);
    assert_eq!(value(&a, "who"), 1);
    assert_eq!(value(&b, "who"), 2);
    assert!(!a.stdout.contains("who=2") && !b.stdout.contains("who=1"));
}

#[test]
fn guest_exit_status_is_reported() {
    let r = boot(1, "256M", "exit 7");
    assert_eq!(r.code, 0);
    assert!(
        r.stdout.contains("domus-init: exit status 7"),
        "{}",
        r.stdout
    );
}

#[test]
fn kvm_paravirtual_features_are_exposed() {
    let r = boot(2, "256M", "dmesg | grep -c -e kvm-clock -e 'PV spinlocks' | sed s/^/pvlines=/; echo clocksource=$(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)");
    assert_clean_poweroff(&r);
    assert!(r.stdout.contains("clocksource=kvm-clock"), "{}", r.stdout);
    assert!(value(&r, "pvlines") >= 2, "{}", r.stdout);
}
