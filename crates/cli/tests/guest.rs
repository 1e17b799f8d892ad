//! Guest-booting integration tests: real Debian kernels on real KVM.
//!
//! Compiled only with `--features guest-tests`; `tools/test` runs them inside
//! `tools/kvm-host`, which gives a /dev/kvm that runs stock kernels (directly on
//! a VT-x/AMD-V host, in a nested KVM host elsewhere). The kit comes from
//! `$DOMUS_KIT_DIR` or the default `domus kit` cache.
#![cfg(feature = "guest-tests")]

mod common;

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
    boot_full(kernel, &[], vcpus, memory, "", command)
}

/// Boots with extra `domus run` arguments and extra kernel parameters.
fn boot_full(
    kernel: &PathBuf,
    extra: &[String],
    vcpus: u32,
    memory: &str,
    params: &str,
    command: &str,
) -> Run {
    boot_watching(kernel, extra, vcpus, memory, params, command, |_| {})
}

/// [`boot_full`], handing each console line (trimmed) to `on_line` as it
/// arrives.
fn boot_watching(
    kernel: &PathBuf,
    extra: &[String],
    vcpus: u32,
    memory: &str,
    params: &str,
    command: &str,
    mut on_line: impl FnMut(&str),
) -> Run {
    let k = kit();
    let mut child = Command::new(env!("CARGO_BIN_EXE_domus"))
        .arg("run")
        .arg("--kernel")
        .arg(kernel)
        .arg("--initrd")
        .arg(&k.initrd)
        .args(["--vcpus", &vcpus.to_string(), "--memory", memory])
        .args(extra)
        .arg("--cmdline")
        .arg(format!(
            "console=ttyS0 quiet panic=-1 {params} domus.cmd={}",
            base64(command)
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning domus run");
    // A hung guest fails its test instead of hanging the run: after
    // GUEST_TIMEOUT_S the VMM is captured (common::stall_report) and killed,
    // and the run reports status 124, as coreutils' timeout would.
    let pid = child.id();
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        let limit = Duration::from_secs(GUEST_TIMEOUT_S.into());
        if finished.recv_timeout(limit) != Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
            return None;
        }
        let dir = std::env::temp_dir().join(format!("domus-test-stall-{pid}"));
        let _ = std::fs::create_dir_all(&dir);
        let report = common::stall_report(pid, &dir, "");
        // SAFETY: kill(2) on the child's pid, not yet reaped (the test waits
        // for it only after its console closes); no memory is involved.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        Some(report)
    });
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
        on_line(line.trim());
        stdout.push_str(&line);
        stdout.push('\n');
    }
    let status = child.wait().unwrap();
    let tail = last_line.elapsed();
    drop(done);
    let mut stderr = err_thread.join().unwrap();
    let mut code = status.code().unwrap_or(-1);
    if let Some(report) = watchdog.join().unwrap() {
        code = 124;
        stderr.push_str(&format!(
            "\nthe guest ran past {GUEST_TIMEOUT_S} s and was killed\n{report}"
        ));
    }
    Run {
        code,
        stdout,
        stderr,
        tail,
    }
}

/// Standard base64, for `domus.cmd=` (the kit's init decodes it).
fn base64(s: &str) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in s.as_bytes().chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
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
    assert_eq!(r.code, 0, "stdout:\n{}\nstderr:\n{}", r.stdout, r.stderr);
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

// ---- virtio devices ----

/// A scratch directory for one test, on the host's (or nested host's) /tmp.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("domus-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A sparse image of `mib` MiB.
fn image(dir: &std::path::Path, name: &str, mib: u64) -> PathBuf {
    let p = dir.join(name);
    let f = std::fs::File::create(&p).unwrap();
    f.set_len(mib << 20).unwrap();
    p
}

fn md5(path: &std::path::Path, bytes: u64) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("head -c {bytes} '{}' | md5sum", path.display()))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

fn disk_arg(spec: String) -> Vec<String> {
    vec!["--disk".into(), spec]
}

/// A word the guest printed after `key=` (not a number).
fn word(run: &Run, key: &str) -> String {
    let prefix = format!("{key}=");
    run.stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix(&prefix).map(str::to_string))
        .unwrap_or_else(|| {
            panic!(
                "no {key}= in guest output:\n{}\nstderr:\n{}",
                run.stdout, run.stderr
            )
        })
}

#[test]
fn disk_write_is_on_the_host_after_sync_even_after_sigkill() {
    let dir = scratch("sync");
    let img = image(&dir, "data.img", 128);
    let k = kit();
    // The guest writes 64 MiB of random data with O_DIRECT, syncs, reports
    // its checksum and then waits: the host kills the VMM right away.
    let cmd = "dd if=/dev/urandom of=/tmp/d bs=1M count=64 2>/dev/null; dd if=/tmp/d of=/dev/vda bs=1M oflag=direct 2>/dev/null; sync; echo sum=$(md5sum < /tmp/d); echo synced; sleep 600";
    let mut child = Command::new(env!("CARGO_BIN_EXE_domus"))
        .args(["run", "--memory", "512M", "--disk"])
        .arg(&img)
        .arg("--kernel")
        .arg(&k.kernel)
        .arg("--initrd")
        .arg(&k.initrd)
        .arg("--cmdline")
        .arg(format!(
            "console=ttyS0 quiet panic=-1 domus.cmd={}",
            base64(cmd)
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let watchdog = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(GUEST_TIMEOUT_S.into()));
        // SAFETY: kill(2) on the child's pid; no memory is involved.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    });
    let mut sum = String::new();
    let mut out = String::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap_or_default();
        out.push_str(&line);
        out.push('\n');
        if let Some(s) = line.trim().strip_prefix("sum=") {
            sum = s.split_whitespace().next().unwrap_or_default().to_string();
        }
        if line.trim() == "synced" {
            // SAFETY: as above.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            break;
        }
    }
    let status = child.wait().unwrap();
    drop(watchdog);
    assert!(out.contains("synced"), "guest never synced:\n{out}");
    assert_eq!(status.code(), None, "the VMM was killed, not exited");
    assert_eq!(sum.len(), 32, "{out}");
    assert_eq!(
        md5(&img, 64 << 20),
        sum,
        "image differs from what the guest wrote"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn read_only_disk_refuses_writes_and_stays_unchanged() {
    let dir = scratch("ro");
    let img = dir.join("ro.img");
    std::fs::write(
        &img,
        (0..(4u32 << 20))
            .map(|i| (i % 251) as u8)
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let before = md5(&img, 4 << 20);
    // Through the block layer (refused by Linux), then with the block
    // layer's read-only flag lifted so the write reaches the device.
    let cmd = "echo ro=$(cat /sys/block/vda/ro); dd if=/dev/zero of=/dev/vda bs=4k count=1 2>/dev/null; echo plain=$?; blockdev --setrw /dev/vda; dd if=/dev/zero of=/dev/vda bs=4k count=1 oflag=direct 2>/dev/null; echo direct=$?; head -c 3 /dev/vda | od -An -tu1 | tr -d ' ' | sed s/^/head=/";
    let r = boot_full(
        &k_kernel(),
        &disk_arg(format!("{},ro", img.display())),
        1,
        "256M",
        "",
        cmd,
    );
    assert_clean_poweroff(&r);
    assert_eq!(value(&r, "ro"), 1);
    assert_ne!(value(&r, "plain"), 0, "{}", r.stdout);
    assert_ne!(
        value(&r, "direct"),
        0,
        "the device accepted a write: {}",
        r.stdout
    );
    assert_eq!(word(&r, "head"), "012");
    assert_eq!(md5(&img, 4 << 20), before);
    let _ = std::fs::remove_dir_all(dir);
}

fn k_kernel() -> PathBuf {
    kit().kernel
}

#[test]
fn kit_rootfs_boots_as_root_on_vda() {
    let dir = scratch("root");
    let dir_kit = std::env::var_os("DOMUS_KIT_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(domus_kit::default_dir);
    let img = dir.join("root.img");
    std::fs::copy(dir_kit.join("rootfs.ext4"), &img).unwrap();
    let cmd = "echo rootdev=$(sed -n 's|^\\([^ ]*\\) / .*|\\1|p' /proc/mounts | tail -1); echo hello > /written; sync";
    let r = boot_full(
        &k_kernel(),
        &disk_arg(img.display().to_string()),
        1,
        "256M",
        "root=/dev/vda",
        cmd,
    );
    assert_clean_poweroff(&r);
    assert!(r.stdout.contains("domus-init: on /dev/vda"), "{}", r.stdout);
    assert_eq!(word(&r, "rootdev"), "/dev/vda");
    // The file is in the image: debugfs reads it back on the host.
    let out = Command::new("debugfs")
        .args(["-R", "cat /written"])
        .arg(&img)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "hello");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn disk_id_discard_and_entropy() {
    let dir = scratch("misc");
    let img = image(&dir, "d.img", 64);
    let cmd = "echo serial=$(cat /sys/block/vda/serial); dd if=/dev/urandom of=/dev/vda bs=1M count=8 oflag=direct 2>/dev/null; blkdiscard -o 0 -l 4194304 /dev/vda; echo discard=$?; echo rng=$(cat /sys/class/misc/hw_random/rng_current); echo rngbytes=$(head -c 4096 /dev/hwrng | wc -c)";
    let r = boot_full(
        &k_kernel(),
        &disk_arg(format!("{},id=scratch-7", img.display())),
        1,
        "256M",
        "",
        cmd,
    );
    assert_clean_poweroff(&r);
    assert_eq!(word(&r, "serial"), "scratch-7");
    assert_eq!(value(&r, "discard"), 0);
    assert_eq!(word(&r, "rng"), "virtio_rng.0");
    assert_eq!(value(&r, "rngbytes"), 4096);
    // The first 4 MiB are a hole again (zeroes); the next 4 MiB are data.
    let data = std::fs::read(&img).unwrap();
    assert!(
        data[..4 << 20].iter().all(|b| *b == 0),
        "discarded range is not zero"
    );
    assert!(data[4 << 20..8 << 20].iter().any(|b| *b != 0));
    use std::os::unix::fs::MetadataExt;
    let allocated = std::fs::metadata(&img).unwrap().blocks() * 512;
    assert!(allocated <= 5 << 20, "{allocated} bytes still allocated");
    let _ = std::fs::remove_dir_all(dir);
}

/// Reads COUNT blocks of BS bytes from /dev/DEV with O_DIRECT and prints
/// the guest's elapsed time in centiseconds (from /proc/uptime) as LABEL=.
const TIMED_READ: &str = "a=$(cut -d' ' -f1 /proc/uptime | tr -d .); dd if=/dev/DEV of=/dev/null bs=BS count=COUNT iflag=direct 2>/dev/null; b=$(cut -d' ' -f1 /proc/uptime | tr -d .); echo LABEL=$((b - a))";

fn timed_read(label: &str, dev: &str, bs: &str, count: u32) -> String {
    TIMED_READ
        .replace("LABEL", label)
        .replace("DEV", dev)
        .replace("BS", bs)
        .replace("COUNT", &count.to_string())
}

/// Checks a measured `rate` against `limit`, given the `free` rate the same
/// domain reached on an unlimited disk: the domain must be able to go well
/// past the limit (or the check proves nothing: the nested test host is
/// slow, one CI run's kit guest read only 224 IOPS under a 250 IOPS
/// limit), and the limited rate must be the limit within 10 % (the
/// bucket's first burst, the guest's clock).
fn assert_rate(what: &str, rate: f64, limit: f64, free: f64) -> String {
    let summary = format!("{what}: {rate:.1} under a limit of {limit}, {free:.1} unlimited");
    assert!(
        free >= limit * 1.25,
        "the limit is not exercised: {summary}"
    );
    assert!((rate / limit - 1.0).abs() <= 0.10, "{summary}");
    summary
}

// Rate tests run alone (tools/test runs `exclusive_*` tests after the rest,
// one at a time): on the 2-CPU test machine a parallel test's guest can
// starve this one's, and a rate limit is only measurable when the domain
// could go faster than it.
#[test]
fn exclusive_disk_rate_limits_hold_within_10_percent() {
    let dir = scratch("rate");
    // vda: 6 MiB/s; vdb: 100 operations/s; vdc: unlimited, the same reads
    // timed on it first.
    let mut disks = Vec::new();
    for (name, limit) in [
        ("bw.img", ",bw=6M"),
        ("iops.img", ",iops=100"),
        ("free.img", ""),
    ] {
        disks.extend(disk_arg(format!(
            "{}{limit}",
            image(&dir, name, 64).display()
        )));
    }
    // 24 MiB at 6 MiB/s is 4 s; 500 reads of 4 KiB at 100/s is 5 s
    // (the nested host's kit guest reads about 250 a second unlimited).
    let cmd = [
        timed_read("free_bw_cs", "vdc", "1M", 24),
        timed_read("bw_cs", "vda", "1M", 24),
        timed_read("free_iops_cs", "vdc", "4k", 500),
        timed_read("iops_cs", "vdb", "4k", 500),
    ]
    .join("; ");
    let r = boot_full(&k_kernel(), &disks, 1, "256M", "", &cmd);
    assert_clean_poweroff(&r);
    let per_sec = |amount: f64, key: &str| amount / (value(&r, key).max(1) as f64 / 100.0);
    let bw = assert_rate(
        "MiB/s",
        per_sec(24.0, "bw_cs"),
        6.0,
        per_sec(24.0, "free_bw_cs"),
    );
    let iops = assert_rate(
        "IOPS",
        per_sec(500.0, "iops_cs"),
        100.0,
        per_sec(500.0, "free_iops_cs"),
    );
    eprintln!("domus-test: {bw}; {iops}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Boots like [`boot_full`] (kit kernel, one vCPU) but hands each console
/// line to `on_line` as it arrives, so the test can act on the running
/// domain (through its API).
fn boot_live(extra: &[String], memory: &str, command: &str, on_line: impl FnMut(&str)) -> Run {
    boot_watching(&kit().kernel, extra, 1, memory, "", command, on_line)
}

fn api(
    sock: &std::path::Path,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> (u16, serde_json::Value) {
    let (status, text) = domus_http::request(sock, method, path, body)
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    let v = if text.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{method} {path}: {e}: {text}"))
    };
    (status, v)
}

/// CPU time (user + system, clock ticks) of thread `tid` of process `pid`.
fn thread_ticks(pid: u64, tid: u64) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).unwrap();
    let f: Vec<&str> = s[s.rfind(')').unwrap() + 2..].split(' ').collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

fn vm_rss_kib(pid: u64) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn api_pauses_resumes_counts_and_changes_limits() {
    let dir = scratch("api");
    let img = image(&dir, "d.img", 32);
    let sock = dir.join("api.sock");
    // Spin for 8 s of guest time, then write 4 MiB to the disk.
    let cmd = "echo phase=spin; end=$(( $(cut -d. -f1 /proc/uptime) + 8 )); while [ $(cut -d. -f1 /proc/uptime) -lt $end ]; do :; done; dd if=/dev/urandom of=/dev/vda bs=1M count=4 oflag=direct 2>/dev/null; echo phase=written; sleep 3";
    let mut extra = disk_arg(format!("{},bw=64M", img.display()));
    extra.extend([
        "--api-socket".into(),
        sock.display().to_string(),
        "--name".into(),
        "api-test".into(),
    ]);
    let mut checked = Vec::new();
    let r = boot_live(&extra, "256M", cmd, |line| match line {
        "phase=spin" => {
            let (s, info) = api(&sock, "GET", "/v1/domain", None);
            assert_eq!(s, 200, "{info}");
            assert_eq!(info["name"], "api-test");
            assert_eq!(info["state"], "running");
            assert_eq!(info["vcpus"], 1);
            assert_eq!(info["memory_mib"], 256);
            let pid = info["pid"].as_u64().unwrap();
            let tid = info["vcpu_tids"][0].as_u64().unwrap();
            let spent = |ms| {
                let a = thread_ticks(pid, tid);
                std::thread::sleep(Duration::from_millis(ms));
                thread_ticks(pid, tid) - a
            };
            assert!(spent(1000) >= 20, "the spinning vCPU used no CPU");
            let (s, v) = api(&sock, "PUT", "/v1/domain/pause", None);
            assert_eq!((s, v["state"].as_str()), (200, Some("paused")), "{v}");
            let paused = spent(1500);
            assert!(paused <= 2, "a paused vCPU used {paused} ticks");
            assert_eq!(api(&sock, "GET", "/v1/domain", None).1["state"], "paused");
            let (s, v) = api(&sock, "PUT", "/v1/domain/resume", None);
            assert_eq!((s, v["state"].as_str()), (200, Some("running")), "{v}");
            assert!(spent(1000) >= 20, "the resumed vCPU used no CPU");
            checked.push("pause");
        }
        "phase=written" => {
            let (s, d) = api(&sock, "GET", "/v1/devices/vda", None);
            assert_eq!(s, 200, "{d}");
            assert_eq!(d["type"], "block");
            assert!(
                d["counters"]["write_bytes"].as_u64().unwrap() >= 4 << 20,
                "{d}"
            );
            assert!(d["counters"]["write_ops"].as_u64().unwrap() >= 4, "{d}");
            assert_eq!(d["rate_limit"]["bandwidth"], 64 << 20);
            // Bad requests: a 4xx with a message, and nothing changes.
            for (m, p, b, want) in [
                (
                    "PUT",
                    "/v1/devices/vda/rate-limit",
                    "{\"bandwidth\": \"fast\"}",
                    400,
                ),
                ("PUT", "/v1/devices/vda/rate-limit", "{\"bw\": 1}", 400),
                ("PUT", "/v1/devices/vda/rate-limit", "not json", 400),
                ("PUT", "/v1/devices/vdq/rate-limit", "{\"iops\": 1}", 404),
                ("PUT", "/v1/devices/rng0/rate-limit", "{\"iops\": 1}", 409),
                ("DELETE", "/v1/domain", "", 405),
                ("GET", "/v1/balloon", "", 404),
                ("GET", "/nope", "", 404),
            ] {
                let (s, v) = api(&sock, m, p, (!b.is_empty()).then_some(b));
                assert_eq!(s, want, "{m} {p} {b}: {v}");
                assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{v}");
            }
            let (_, d) = api(&sock, "GET", "/v1/devices/vda", None);
            assert_eq!(
                d["rate_limit"]["bandwidth"],
                64 << 20,
                "changed by a bad request"
            );
            let (s, d) = api(
                &sock,
                "PUT",
                "/v1/devices/vda/rate-limit",
                Some("{\"bandwidth\": null, \"iops\": 500}"),
            );
            assert_eq!(s, 200, "{d}");
            assert_eq!(
                d["rate_limit"],
                serde_json::json!({"bandwidth": null, "iops": 500})
            );
            let (_, all) = api(&sock, "GET", "/v1/devices", None);
            let ids: Vec<&str> = all
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d["id"].as_str().unwrap())
                .collect();
            assert_eq!(ids, ["vda", "rng0"]);
            // The server serves the committed OpenAPI document.
            let (s, doc) = api(&sock, "GET", "/openapi.json", None);
            assert_eq!(s, 200);
            let committed: serde_json::Value =
                serde_json::from_str(include_str!("../../../api/domain.openapi.json")).unwrap();
            assert_eq!(doc, committed);
            checked.push("devices");
        }
        _ => {}
    });
    assert_clean_poweroff(&r);
    assert_eq!(checked, ["pause", "devices"], "{}", r.stdout);
    assert!(!sock.exists(), "the API socket outlived the domain");
    let _ = std::fs::remove_dir_all(dir);
}

/// `--prefault` commits all guest memory before the guest runs (a 256 MiB
/// guest that touches little holds 256 MiB), and says so when the kernel
/// cannot build KVM's page tables ahead (KVM_PRE_FAULT_MEMORY, Linux 6.10).
#[test]
fn prefault_commits_guest_memory_at_start() {
    let dir = scratch("prefault");
    let sock = dir.join("api.sock");
    let extra = vec![
        "--prefault".to_string(),
        "--api-socket".into(),
        sock.display().to_string(),
    ];
    let mut rss_mib = 0;
    let r = boot_live(&extra, "256M", "echo phase=up; sleep 5", |line| {
        if line == "phase=up" {
            let pid = api(&sock, "GET", "/v1/domain", None).1["pid"].as_u64();
            rss_mib = vm_rss_kib(pid.unwrap()) >> 10;
        }
    });
    assert_clean_poweroff(&r);
    assert!(rss_mib >= 256, "{rss_mib} MiB resident after --prefault");
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut v = release
        .split(['.', '-'])
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let tables = (v.next().unwrap_or(0), v.next().unwrap_or(0)) >= (6, 10);
    assert_eq!(
        !r.stderr.contains("cannot prefault its page tables"),
        tables,
        "kernel {release}: {}",
        r.stderr
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn balloon_returns_freed_memory_and_inflates_to_a_target() {
    let dir = scratch("balloon");
    let sock = dir.join("api.sock");
    // Fill 200 MiB of tmpfs, free it, then wait while the host checks.
    let cmd = "mount -t tmpfs -o size=300m none /mnt; dd if=/dev/zero of=/mnt/f bs=1M count=200 2>/dev/null; echo phase=filled; sleep 2; rm /mnt/f; echo phase=freed; sleep 40; echo memtotal=$(grep MemTotal /proc/meminfo | tr -s ' ' | cut -d' ' -f2)";
    let extra = vec![
        "--balloon".to_string(),
        "--api-socket".into(),
        sock.display().to_string(),
    ];
    let (mut filled_rss, mut lowest_rss, mut pid) = (0, u64::MAX, 0);
    let mut inflated = None;
    let r = boot_live(&extra, "512M", cmd, |line| match line {
        "phase=filled" => {
            pid = api(&sock, "GET", "/v1/domain", None).1["pid"]
                .as_u64()
                .unwrap();
            filled_rss = vm_rss_kib(pid);
        }
        "phase=freed" => {
            // Free page reporting runs about 2 s after pages are freed.
            let end = Instant::now() + Duration::from_secs(12);
            while Instant::now() < end && filled_rss.saturating_sub(lowest_rss) < 150 << 10 {
                std::thread::sleep(Duration::from_millis(250));
                lowest_rss = lowest_rss.min(vm_rss_kib(pid));
            }
            let (s, b) = api(&sock, "GET", "/v1/balloon", None);
            assert_eq!(s, 200, "{b}");
            assert!(b["reported_bytes"].as_u64().unwrap() >= 150 << 20, "{b}");
            assert!(
                b["statistics"]["total_memory"].as_u64().unwrap() > 256 << 20,
                "{b}"
            );
            // Inflate: the guest keeps 384 MiB of its 512.
            let (s, b) = api(&sock, "PUT", "/v1/balloon", Some("{\"target_mib\": 384}"));
            assert_eq!((s, b["target_mib"].as_u64()), (200, Some(384)), "{b}");
            let (s, _) = api(&sock, "PUT", "/v1/balloon", Some("{\"target_mib\": 4096}"));
            assert_eq!(s, 400);
            // The guest gives up 128 MiB a page-frame batch at a time; in
            // the nested test host that has taken over 10 s.
            let end = Instant::now() + Duration::from_secs(20);
            while Instant::now() < end {
                let b = api(&sock, "GET", "/v1/balloon", None).1;
                if b["balloon_actual_mib"].as_u64() == Some(128) {
                    inflated = Some(b);
                    break;
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        }
        _ => {}
    });
    assert_clean_poweroff(&r);
    assert!(filled_rss > 0, "{}", r.stdout);
    let dropped = filled_rss.saturating_sub(lowest_rss) >> 10;
    assert!(
        dropped >= 150,
        "RSS went from {} MiB to {} MiB: only {dropped} MiB back",
        filled_rss >> 10,
        lowest_rss >> 10
    );
    let b = inflated.expect("the balloon did not reach 128 MiB in 20 s");
    assert_eq!(b["actual_mib"], 384, "{b}");
    // The guest's memory shrank by the balloon (no deflate-on-OOM).
    assert!(value(&r, "memtotal") < 400 << 10, "{}", r.stdout);
    let _ = std::fs::remove_dir_all(dir);
}

/// The static guest helper (crates/guest), built by tools/test.
fn guest_helper() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/x86_64-unknown-linux-gnu/release/domus-guest");
    assert!(
        p.is_file(),
        "{} missing: build it with RUSTFLAGS='-C target-feature=+crt-static' cargo build --release -p domus-guest --target x86_64-unknown-linux-gnu",
        p.display()
    );
    p
}

/// A raw disk image holding the helper; returns the `domus run` arguments
/// and the guest command that copies it to /h (the disk must be vda).
fn helper_disk(dir: &std::path::Path) -> (Vec<String>, String) {
    let bin = std::fs::read(guest_helper()).unwrap();
    let img = dir.join("helper.img");
    let mut padded = bin.clone();
    padded.resize(bin.len().div_ceil(512) * 512, 0);
    std::fs::write(&img, padded).unwrap();
    (
        disk_arg(format!("{},ro", img.display())),
        format!("head -c {} /dev/vda > /h; chmod +x /h; ", bin.len()),
    )
}

/// Runs `ip ARGS`, panicking with its message on failure.
fn ip(args: &str) {
    let out = Command::new("ip")
        .args(args.split(' '))
        .output()
        .expect("running ip");
    assert!(
        out.status.success(),
        "ip {args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A bridge with taps, removed again on drop.
struct Bridge {
    links: Vec<String>,
}

impl Bridge {
    fn new(name: &str, addr: &str, taps: &[&str]) -> Self {
        let mut b = Bridge { links: Vec::new() };
        ip(&format!("link add {name} type bridge"));
        b.links.push(name.to_string());
        ip(&format!("addr add {addr} dev {name}"));
        ip(&format!("link set {name} up"));
        for t in taps {
            ip(&format!("tuntap add dev {t} mode tap"));
            b.links.push(t.to_string());
            ip(&format!("link set {t} master {name}"));
            ip(&format!("link set {t} up"));
        }
        b
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        for l in self.links.iter().rev() {
            let _ = Command::new("ip").args(["link", "del", l]).status();
        }
    }
}

/// Every value printed as `key=value` (several per line allowed).
fn all_words(run: &Run, key: &str) -> Vec<String> {
    let prefix = format!("{key}=");
    run.stdout
        .split_whitespace()
        .filter_map(|w| w.strip_prefix(&prefix).map(str::to_string))
        .collect()
}

/// Guest shell that waits (up to about a minute) until `ip` answers a ping.
fn until_reachable(ip: &str) -> String {
    format!("for i in $(seq 60); do ping -c 1 -W 1 {ip} >/dev/null && break; done; ")
}

#[test]
fn two_domains_on_a_bridge_ping_and_move_100_mib_and_reach_the_host() {
    let dir = scratch("net");
    let (helper_args, fetch) = helper_disk(&dir);
    let tag = std::process::id() % 100_000;
    let (br, ta, tb) = (
        format!("dbr{tag}"),
        format!("dta{tag}"),
        format!("dtb{tag}"),
    );
    let _bridge = Bridge::new(&br, "10.77.0.1/24", &[&ta, &tb]);
    // The host end of guest-to-host: the helper itself, on the bridge.
    let host_recv = Command::new(guest_helper())
        .args(["recv", "tcp", "5001"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let up = "ip link set lo up; ip link set eth0 up; ip addr add ADDR/24 dev eth0; ";
    // Each guest waits until it reaches the other (they boot side by side
    // and either may be first) before it counts pings or sends.
    let a_cmd = format!(
        "{fetch}{}/h recv tcp 5000 > /tmp/r & {}ping -c 3 -W 5 10.77.0.3 | grep -c ' bytes from' | sed 's/^/pings=/'; wait; cat /tmp/r",
        up.replace("ADDR", "10.77.0.2"),
        until_reachable("10.77.0.3")
    );
    let b_cmd = format!(
        "{fetch}{}{}sleep 2; /h send tcp 10.77.0.2 5000 100; /h send tcp 10.77.0.1 5001 10; cat /sys/class/net/eth0/address | sed 's/^/mac=/'",
        up.replace("ADDR", "10.77.0.3"),
        until_reachable("10.77.0.2")
    );
    let mut a_args = helper_args.clone();
    a_args.extend(["--net".into(), format!("tap={ta}")]);
    let mut b_args = helper_args.clone();
    b_args.extend(["--net".into(), format!("tap={tb},mac=52:54:00:12:34:56")]);
    let k = kit().kernel;
    let a = std::thread::spawn(move || boot_full(&k, &a_args, 1, "256M", "", &a_cmd));
    let k = kit().kernel;
    let b = std::thread::spawn(move || boot_full(&k, &b_args, 1, "256M", "", &b_cmd));
    let (a, b) = (a.join().unwrap(), b.join().unwrap());
    let host = host_recv.wait_with_output().unwrap();
    let host_out = String::from_utf8_lossy(&host.stdout).to_string();
    assert_clean_poweroff(&a);
    assert_clean_poweroff(&b);
    assert_eq!(value(&a, "pings"), 3, "{}", a.stdout);
    let sent = all_words(&b, "sent_hash");
    let sent_bytes = all_words(&b, "sent_bytes");
    assert_eq!(sent_bytes, ["104857600", "10485760"], "{}", b.stdout);
    assert_eq!(all_words(&a, "recv_bytes"), ["104857600"], "{}", a.stdout);
    assert_eq!(
        all_words(&a, "recv_hash"),
        [sent[0].clone()],
        "guest to guest"
    );
    assert!(
        host_out.contains(&format!("recv_hash={}", sent[1]))
            && host_out.contains("recv_bytes=10485760"),
        "guest to host: {host_out} vs {}",
        b.stdout
    );
    assert_eq!(word(&b, "mac"), "52:54:00:12:34:56");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn vsock_both_ways_with_10_mib_echoed_intact() {
    let dir = scratch("vsock");
    let (helper_args, fetch) = helper_disk(&dir);
    let cid = 3 + std::process::id() % 100_000;
    // Host to guest: the guest echoes on port 5000 and the host pings it
    // once it listens. Guest to host: the host listens on port 5001.
    let host_recv = Command::new(guest_helper())
        .args(["recv", "vsock", "5001"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let cmd = format!("{fetch}/h echo vsock 5000 > /tmp/e & sleep 1; echo phase=listening; wait; cat /tmp/e; /h send vsock 2 5001 10");
    let mut extra = helper_args;
    extra.extend(["--vsock".into(), format!("cid={cid}")]);
    let mut ping = None;
    let r = boot_live(&extra, "256M", &cmd, |line| {
        if line == "phase=listening" {
            let out = Command::new(guest_helper())
                .args(["ping", "vsock", &cid.to_string(), "5000", "10"])
                .output()
                .unwrap();
            ping = Some(
                String::from_utf8_lossy(&out.stdout).to_string()
                    + &String::from_utf8_lossy(&out.stderr),
            );
        }
    });
    let host = host_recv.wait_with_output().unwrap();
    let host_out = String::from_utf8_lossy(&host.stdout).to_string();
    assert_clean_poweroff(&r);
    let ping = ping.expect("the guest never listened");
    let field = |s: &str, k: &str| {
        s.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{k}=")).map(str::to_string))
            .unwrap_or_else(|| panic!("no {k} in {s}"))
    };
    assert_eq!(field(&ping, "sent_bytes"), "10485760", "{ping}");
    assert_eq!(field(&ping, "echoed_bytes"), "10485760", "{ping}");
    assert_eq!(
        field(&ping, "echoed_hash"),
        field(&ping, "sent_hash"),
        "host to guest and back"
    );
    assert_eq!(
        field(&r.stdout, "echo_hash"),
        field(&ping, "sent_hash"),
        "what the guest saw"
    );
    assert_eq!(
        field(&host_out, "recv_bytes"),
        "10485760",
        "{host_out}\n{}",
        r.stdout
    );
    assert_eq!(
        field(&host_out, "recv_hash"),
        field(&r.stdout, "sent_hash"),
        "guest to host"
    );
    let _ = std::fs::remove_dir_all(dir);
}

// Runs alone, like the disk rate test: beside the bridge test's 100 MiB
// transfer it measured 3.30 MB/s for the 4.19 MB/s limit.
#[test]
fn exclusive_net_rate_limit_holds_within_10_percent() {
    let dir = scratch("netrate");
    let (helper_args, fetch) = helper_disk(&dir);
    let tag = std::process::id() % 100_000;
    let (br, tap) = (format!("drb{tag}"), format!("drt{tag}"));
    let _bridge = Bridge::new(&br, "10.79.0.1/24", &[&tap]);
    let host_recv = Command::new(guest_helper())
        .args(["recv", "tcp", "5002"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // 16 MiB at 4 MiB/s is 4 s.
    let cmd = format!(
        "{fetch}ip link set eth0 up; ip addr add 10.79.0.2/24 dev eth0; {}/h send tcp 10.79.0.1 5002 16; echo phase=sent",
        until_reachable("10.79.0.1")
    );
    let sock = dir.join("api.sock");
    let mut extra = helper_args;
    extra.extend([
        "--net".into(),
        format!("tap={tap},bw=4M"),
        "--api-socket".into(),
        sock.display().to_string(),
    ]);
    let mut counters = None;
    let r = boot_live(&extra, "256M", &cmd, |line| {
        if line == "phase=sent" {
            counters = Some(api(&sock, "GET", "/v1/devices/net0", None).1["counters"].clone());
        }
    });
    // The interface counted the transfer, the limiter's waits, and the
    // notifications both ways.
    let c = counters.unwrap_or_else(|| panic!("the guest never sent\n{}", r.stdout));
    let n = |k: &str| c[k].as_u64().unwrap_or_else(|| panic!("no {k} in {c}"));
    assert!(n("tx_bytes") >= 16 << 20, "{c}");
    assert!(n("tx_packets") > 0 && n("rx_packets") > 0, "{c}");
    assert!(n("throttled") > 0, "{c}");
    assert!(
        n("tx_kicks") > 0 && n("rx_kicks") > 0 && n("interrupts") > 0,
        "{c}"
    );
    assert_eq!(n("tx_dropped"), 0, "{c}");
    let host = host_recv.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&host.stdout).to_string();
    assert_clean_poweroff(&r);
    let mbs: f64 = out
        .split_whitespace()
        .find_map(|w| w.strip_prefix("recv_mbs="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no rate in {out}\n{}", r.stdout));
    let limit = 4.0 * 1048576.0 / 1e6;
    assert!(
        (mbs / limit - 1.0).abs() <= 0.10,
        "{mbs:.2} MB/s for a {limit:.2} MB/s limit"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Runs `domus VERB ARGS...` against the daemon in `state`.
fn domus_cli(state: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_domus"))
        .args(args)
        .env("DOMUS_STATE_DIR", state)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// A daemon a test started. Its log (stderr) goes to `daemon.log` beside the
/// state directory, kept across restarts; a test that fails prints it, so
/// that CI shows what the daemon saw.
struct TestDaemon {
    child: std::process::Child,
    state: std::path::PathBuf,
    log: std::path::PathBuf,
}

impl std::ops::Deref for TestDaemon {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        &self.child
    }
}

impl std::ops::DerefMut for TestDaemon {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.child
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            eprintln!("---- the daemon's log ({}):\n{log}", self.log.display());
            // A failed test takes its daemon and domains down, so that they
            // do not slow the tests that run after it.
            let _ = self.child.kill();
            let _ = self.child.wait();
            let domains = self.state.join("domains");
            let _ = Command::new("pkill")
                .args(["-9", "-f", &format!("api-socket {}/", domains.display())])
                .status();
        }
    }
}

/// The domains a daemon's log names as having triple-faulted (and so
/// reset; see `Daemon::ended`).
fn triple_faulted(log: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("VMM log: domus: a vCPU triple-faulted"))
        .filter_map(|l| {
            l.strip_prefix("domusd: domain ")?
                .split(" VMM log")
                .next()
                .map(String::from)
        })
        .collect()
}

/// Whether process `pid` is running (not gone, not a zombie).
fn alive(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rfind(')').map(|i| !s[i + 2..].starts_with(['Z', 'X'])))
        .unwrap_or(false)
}

fn start_daemon(state: &std::path::Path) -> TestDaemon {
    let log = state.with_file_name("daemon.log");
    std::fs::create_dir_all(state.parent().unwrap()).unwrap();
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_domus"))
        .args(["daemon", "--state-dir"])
        .arg(state)
        .stderr(out)
        .spawn()
        .unwrap();
    let sock = state.join("domusd.sock");
    let end = Instant::now() + Duration::from_secs(10);
    while domus_http::request(&sock, "GET", "/v1/info", None).is_err() {
        assert!(Instant::now() < end, "the daemon did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
    TestDaemon {
        child,
        state: state.to_path_buf(),
        log,
    }
}

#[test]
fn daemon_creates_lists_pauses_survives_sigkill_and_destroys() {
    let dir = scratch("daemon");
    let state = dir.join("state");
    let k = kit();
    let mut daemon = start_daemon(&state);
    let tag = std::process::id() % 100_000;
    let br = format!("ddb{tag}");
    let _bridge = Bridge::new(&br, "10.80.0.1/24", &[]);
    // Eight domains, each with an interface on the bridge; dom-a spins (for
    // the pause check), the others idle.
    let names = [
        "dom-a", "dom-b", "dom-c", "dom-d", "dom-e", "dom-f", "dom-g", "dom-h",
    ];
    for n in names {
        let cmd = if n == "dom-a" {
            "while :; do :; done"
        } else {
            "while :; do sleep 1; done"
        };
        let cfg = domain_config(
            &dir,
            n,
            192,
            &format!("-- {cmd}"),
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

    let list = |state: &std::path::Path| -> Vec<serde_json::Value> {
        let (ok, out, err) = domus_cli(state, &["list", "--json"]);
        assert!(ok, "{err}");
        serde_json::from_str::<serde_json::Value>(&out)
            .unwrap()
            .as_array()
            .unwrap()
            .clone()
    };
    let l = list(&state);
    assert_eq!(l.len(), 9, "{l:?}");
    assert_eq!(l[0]["name"], "Domain-0");
    for (d, n) in l[1..].iter().zip(names) {
        assert_eq!(
            (d["name"].as_str(), d["state"].as_str()),
            (Some(n), Some("running")),
            "{d}"
        );
    }
    let pids: Vec<u64> = l[1..].iter().map(|d| d["pid"].as_u64().unwrap()).collect();

    // Pause stops the domain's CPU time; unpause lets it grow again.
    let cpu = |n: &str| {
        list(&state).iter().find(|d| d["name"] == n).unwrap()["vcpu_time_s"]
            .as_f64()
            .unwrap()
    };
    assert!(domus_cli(&state, &["pause", "dom-a"]).0);
    let a = cpu("dom-a");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(cpu("dom-a") - a < 0.05, "a paused domain ran");
    assert!(domus_cli(&state, &["unpause", "dom-a"]).0);
    let a = cpu("dom-a");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(cpu("dom-a") - a > 0.2, "an unpaused domain did not run");

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
        if l[1..].iter().all(|d| d["state"] == "running") || Instant::now() > end {
            break l;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(l[1..].iter().all(|d| d["state"] == "running"), "{l:?}");
    let again: Vec<u64> = l[1..].iter().map(|d| d["pid"].as_u64().unwrap()).collect();
    for ((n, p), q) in names.iter().zip(&pids).zip(&again) {
        assert!(
            p == q || reset().contains(&n.to_string()),
            "{n}: pid {p} before the daemon restart, {q} after"
        );
    }
    let pids = again;

    // mem-set moves the balloon.
    let (ok, _, err) = domus_cli(&state, &["mem-set", "dom-b", "160M"]);
    assert!(ok, "{err}");
    let (ok, _, err) = domus_cli(&state, &["mem-set", "dom-b", "4G"]);
    assert!(!ok && err.contains("maxmem"), "{err}");

    // Scheduling: weight and cap land in the domain's cgroup; pinning shows
    // in vcpu-list; top and /metrics account the vCPU and I/O threads apart.
    let (ok, _, err) = domus_cli(
        &state,
        &["sched-credit", "-d", "dom-c", "-w", "512", "-c", "25"],
    );
    assert!(ok, "{err}");
    let cg = std::path::Path::new("/sys/fs/cgroup/domus")
        .join(format!("{}-d3", domus_daemon::instance_tag(&state)));
    if cg.exists() {
        assert_eq!(
            std::fs::read_to_string(cg.join("cpu.weight"))
                .unwrap()
                .trim(),
            "512"
        );
        assert_eq!(
            std::fs::read_to_string(cg.join("cpu.max")).unwrap().trim(),
            "25000 100000"
        );
    }
    let (ok, _, err) = domus_cli(&state, &["sched-credit", "-d", "dom-c", "-w", "70000"]);
    assert!(!ok && err.contains("weight"), "{err}");
    assert!(domus_cli(&state, &["vcpu-pin", "dom-c", "0", "0"]).0);
    let (ok, out, err) = domus_cli(&state, &["vcpu-list", "dom-c", "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["affinity"], "0", "{v}");
    let (ok, _, err) = domus_cli(&state, &["vcpu-pin", "dom-c", "0", "99"]);
    assert!(!ok && err.contains("does not exist"), "{err}");
    let (ok, out, err) = domus_cli(&state, &["top", "--once", "--json"]);
    assert!(ok, "{err}");
    let top: serde_json::Value = serde_json::from_str(&out).unwrap();
    let a = top
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "dom-a")
        .unwrap();
    assert!(
        a["vcpu_pct"].as_f64().unwrap() > 5.0,
        "a spinning domain: {a}"
    );
    let (s, m) = domus_http::request(&state.join("domusd.sock"), "GET", "/metrics", None).unwrap();
    assert_eq!(s, 200);
    for n in names {
        assert!(
            m.contains(&format!("domus_domain_vcpu_seconds_total{{domain=\"{n}\"")),
            "{m}"
        );
    }
    let (ok, _, err) = domus_cli(&state, &["rename", "dom-c", "dom-b"]);
    assert!(!ok && err.contains("exists"), "{err}");
    assert!(domus_cli(&state, &["rename", "dom-c", "dom-z"]).0);
    let names = [
        "dom-a", "dom-b", "dom-z", "dom-d", "dom-e", "dom-f", "dom-g", "dom-h",
    ];
    let info = |state: &std::path::Path| -> serde_json::Value {
        let (ok, out, err) = domus_cli(state, &["info", "--json"]);
        assert!(ok, "{err}");
        serde_json::from_str(&out).unwrap()
    };
    assert_eq!(
        info(&state)["domain_memory_mib"],
        7 * 192 + 160,
        "mem-set dom-b to 160"
    );

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
    assert_eq!(info(&state)["domain_memory_mib"], 0, "reservations left");
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

/// No cgroup of the daemon on `state` is left. The kernel lets go of a
/// group a little after its last task ended; the daemon's monitor removes
/// the ones it could not at once, so this waits up to 15 s for it.
fn assert_no_cgroups_left(state: &std::path::Path) {
    let tag = domus_daemon::instance_tag(state);
    let left = || domus_daemon::cgroup::list(&domus_daemon::cgroup::root(), &tag);
    let end = Instant::now() + Duration::from_secs(15);
    while !left().is_empty() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(left().is_empty(), "cgroups left: {:?}", left());
}

/// Writes `dir/NAME.cfg`: a kit domain with `memory` MiB, `init` after the
/// kernel's console options on its command line (`-- CMD` or
/// `domus.cmd=BASE64`), and any further `settings` lines.
fn domain_config(
    dir: &std::path::Path,
    name: &str,
    memory: u32,
    init: &str,
    settings: &str,
) -> PathBuf {
    let k = kit();
    let cfg = dir.join(format!("{name}.cfg"));
    std::fs::write(
        &cfg,
        format!(
            "name = '{name}'\nmemory = {memory}\nkernel = '{}'\nramdisk = '{}'\nextra = 'console=ttyS0 quiet panic=-1 {init}'\n{settings}\n",
            k.kernel.display(),
            k.initrd.display()
        ),
    )
    .unwrap();
    cfg
}

fn spin_config(dir: &std::path::Path, name: &str, extra_settings: &str, cmd: &str) -> PathBuf {
    domain_config(dir, name, 128, &format!("-- {cmd}"), extra_settings)
}

#[test]
fn exclusive_daemon_weights_share_one_cpu_caps_hold_and_crashes_restart() {
    let dir = scratch("sched");
    let state = dir.join("state");
    let mut daemon = start_daemon(&state);
    let spin = "while :; do :; done";
    // Three CPU-bound domains on host CPU 1 with weights 1, 2 and 4.
    for (n, w) in [("w1", 1), ("w2", 2), ("w4", 4)] {
        let cfg = spin_config(&dir, n, &format!("cpus = '1'\ncpu_weight = {w}"), spin);
        let (ok, out, err) = domus_cli(&state, &["create", cfg.to_str().unwrap()]);
        assert!(ok, "{out}{err}");
    }
    // A capped domain on CPU 0.
    let cfg = spin_config(&dir, "capped", "cpus = '0'\ncap = 25", spin);
    assert!(domus_cli(&state, &["create", cfg.to_str().unwrap()]).0);
    // One that panics 2 s after boot, restarted by on_crash.
    let cfg = spin_config(
        &dir,
        "crashy",
        "on_crash = 'restart'",
        "sleep 2; echo c > /proc/sysrq-trigger",
    );
    assert!(domus_cli(&state, &["create", cfg.to_str().unwrap()]).0);
    let sample = || -> std::collections::HashMap<String, f64> {
        let (_, out, _) = domus_cli(&state, &["list", "--json"]);
        serde_json::from_str::<serde_json::Value>(&out)
            .unwrap()
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                (
                    d["name"].as_str().unwrap().to_string(),
                    d["vcpu_time_s"].as_f64().unwrap_or(0.0),
                )
            })
            .collect()
    };
    // Let them boot, then measure 20 s.
    std::thread::sleep(Duration::from_secs(5));
    let (a, t0) = (sample(), Instant::now());
    std::thread::sleep(Duration::from_secs(20));
    let (b, secs) = (sample(), t0.elapsed().as_secs_f64());
    let used = |n: &str| b[n] - a[n];
    let total: f64 = ["w1", "w2", "w4"].iter().map(|n| used(n)).sum();
    for (n, want) in [("w1", 1.0 / 7.0), ("w2", 2.0 / 7.0), ("w4", 4.0 / 7.0)] {
        let share = used(n) / total;
        assert!(
            (share - want).abs() <= 0.05,
            "{n}: share {share:.3}, want {want:.3} (used {:.2} s of {total:.2})",
            used(n)
        );
    }
    let capped = used("capped") / secs;
    assert!(
        (capped - 0.25).abs() <= 0.05,
        "capped at 25% but used {:.1}%",
        capped * 100.0
    );
    // The crashing domain has been restarted at least once.
    let (_, out, _) = domus_cli(&state, &["list", "--json"]);
    let l: serde_json::Value = serde_json::from_str(&out).unwrap();
    let c = l
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "crashy")
        .expect("crashy was not kept");
    assert!(c["restarts"].as_i64().unwrap() >= 1, "{c}");
    let (_, log, _) = domus_cli(&state, &["dmesg"]);
    assert!(
        log.contains("domain crashy crashed") && log.contains("restarted domain crashy"),
        "{log}"
    );
    for n in ["w1", "w2", "w4", "capped", "crashy"] {
        let (ok, _, err) = domus_cli(&state, &["destroy", n]);
        assert!(ok, "destroy {n}: {err}");
    }
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
    // 25 creates and 25 destroys of the same domains, all at once.
    let mut hs = Vec::new();
    for (i, cfg) in cfgs.into_iter().enumerate() {
        let s = sock.clone();
        hs.push(std::thread::spawn(move || {
            let body = serde_json::json!({"config": cfg, "file": format!("c{i}.cfg")}).to_string();
            domus_http::request(&s, "POST", "/v1/domains", Some(&body)).map(|r| r.0)
        }));
        let s = sock.clone();
        hs.push(std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20 * i as u64));
            domus_http::request(&s, "DELETE", &format!("/v1/domains/c{i}"), None).map(|r| r.0)
        }));
    }
    for h in hs {
        let status = h.join().unwrap().expect("the daemon answers every request");
        assert!([201, 204, 404, 500].contains(&status), "{status}");
    }
    // Whatever survived the race goes now.
    let (_, out, _) = domus_cli(&state, &["list", "--json"]);
    let l: serde_json::Value = serde_json::from_str(&out).unwrap();
    for d in l.as_array().unwrap().iter().filter(|d| d["id"] != 0) {
        let (ok, _, err) = domus_cli(&state, &["destroy", d["name"].as_str().unwrap()]);
        assert!(ok, "{err}");
    }
    std::thread::sleep(Duration::from_millis(500));
    let (_, out, _) = domus_cli(&state, &["list", "--json"]);
    let l: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(l.as_array().unwrap().len(), 1, "{l}");
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
    let (_, out, _) = domus_cli(&state, &["info", "--json"]);
    let info: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(info["domain_memory_mib"], 0);
    assert_no_cgroups_left(&state);
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

/// Waits until `path` contains `needle` `times` times; false after `secs`.
fn wait_for_text(path: &std::path::Path, needle: &str, times: usize, secs: u64) -> bool {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.matches(needle).count() >= times {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

#[test]
fn daemon_shutdown_reboot_mem_max_device_lists_and_create_console() {
    let dir = scratch("power");
    let state = dir.join("state");
    let mut daemon = start_daemon(&state);
    let console_of = |id: u64| state.join(format!("domains/{id}/console.log"));
    let describe = |dom: &str| -> serde_json::Value {
        let (ok, out, err) = domus_cli(&state, &["list", "--json"]);
        assert!(ok, "{err}");
        let l: serde_json::Value = serde_json::from_str(&out).unwrap();
        l.as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == dom)
            .cloned()
            .unwrap_or(serde_json::Value::Null)
    };

    // create -c follows the console until the domain goes away.
    let cfg = spin_config(&dir, "brief", "", "echo hello-from-the-console");
    let (ok, out, err) = domus_cli(&state, &["create", "-c", cfg.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("hello-from-the-console"), "{out}");
    assert!(
        describe("brief").is_null(),
        "on_poweroff=destroy removes it"
    );

    // shutdown -w: a guest that would run for ten minutes stops cleanly
    // (its power button handler runs) and the domain goes away.
    let long = "echo guest-up; sleep 600";
    let cfg = spin_config(&dir, "down", "", long);
    assert!(domus_cli(&state, &["create", cfg.to_str().unwrap()]).0);
    let id = describe("down")["id"].as_u64().unwrap();
    assert!(wait_for_text(&console_of(id), "guest-up", 1, 60));
    let t = Instant::now();
    let (ok, out, err) = domus_cli(&state, &["shutdown", "-w", "down"]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("has shut down"), "{out}");
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    assert!(describe("down").is_null());
    let (_, log, _) = domus_cli(&state, &["dmesg"]);
    assert!(log.contains("asked domain down to poweroff"), "{log}");
    assert!(log.contains("domain down powered off"), "{log}");

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
    let d = describe("again");
    let (id, pid) = (d["id"].as_u64().unwrap(), d["pid"].clone());
    let (ok, _, err) = domus_cli(&state, &["mem-max", "again", "100"]);
    assert!(
        !ok && err.contains("below") && err.contains("128 MiB"),
        "{err}"
    );
    let (ok, out, err) = domus_cli(&state, &["mem-max", "again", "192M"]);
    assert!(ok, "{err}");
    assert!(out.contains("until its next start"), "{out}");
    assert_eq!(describe("again")["maxmem_mib"], 192);
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
    assert!(wait_for_text(&console_of(id), "guest-up", 1, 60));
    let (ok, out, err) = domus_cli(&state, &["block-list", "again", "--json"]);
    assert!(ok, "{err}");
    let disks: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(disks.as_array().unwrap().len(), 1, "{disks}");
    assert_eq!(disks[0]["id"], "vda");
    assert!(
        disks[0]["counters"]["read_bytes"].as_u64().unwrap() >= 65536,
        "{disks}"
    );
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
    let d = describe("again");
    assert_eq!(d["state"], "running");
    assert_ne!(d["pid"], pid);
    assert_eq!(d["restarts"], 1);
    assert!(d["shutdown_requested"].is_null(), "{d}");
    assert!(
        wait_for_text(&console_of(id), "guest-up", 1, 60),
        "the guest boots again"
    );
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
    // The guest reports each second the disks it sees (with their first
    // bytes) and whether a ping to the host goes through eth0.
    let cmd =
        "while :; do for d in /dev/vd?; do [ -b $d ] && echo \"seen $d $(head -c 16 $d)\"; done; \
               if [ -e /sys/class/net/eth0 ]; then ip addr add 10.81.0.2/24 dev eth0 2>/dev/null; \
               ip link set eth0 up; ping -c1 -W1 10.81.0.1 >/dev/null 2>&1 && echo net-ok; fi; \
               echo tick; sleep 1; done";
    let cfg = domain_config(&dir, "hp", 128, &format!("domus.cmd={}", base64(cmd)), "");
    let (ok, out, err) = domus_cli(&state, &["create", cfg.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    let (_, l, _) = domus_cli(&state, &["list", "--json"]);
    let l: serde_json::Value = serde_json::from_str(&l).unwrap();
    let id = l[1]["id"].as_u64().unwrap();
    let console = state.join(format!("domains/{id}/console.log"));
    let fresh = || {
        // Only what the guest prints from now on counts.
        std::fs::read_to_string(&console).unwrap_or_default().len()
    };
    let seen_after = |from: usize, needle: &str, secs: u64| {
        let end = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < end {
            let t = std::fs::read_to_string(&console).unwrap_or_default();
            if t.get(from..).is_some_and(|t| t.contains(needle)) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        false
    };
    assert!(seen_after(0, "tick", 60), "the guest runs");

    // block-attach: the disk appears in the guest with its data, and in
    // block-list.
    let spec = format!("{},raw,xvda,ro", img.display());
    let (ok, out, err) = domus_cli(&state, &["block-attach", "hp", &spec]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("attached vda"), "{out}");
    assert!(
        seen_after(0, "seen /dev/vda domus-hotplug-ok", 30),
        "{}",
        std::fs::read_to_string(&console).unwrap_or_default()
    );
    let (_, out, _) = domus_cli(&state, &["block-list", "hp"]);
    assert!(out.contains("vda") && out.contains("ro"), "{out}");
    let (ok, _, err) = domus_cli(&state, &["block-attach", "hp", "relative.img,raw,xvdb,rw"]);
    assert!(!ok && err.contains("absolute"), "{err}");

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
    assert!(
        seen_after(0, "net-ok", 30),
        "the hot-plugged interface carries traffic"
    );
    let (_, out, _) = domus_cli(&state, &["network-list", "hp"]);
    assert!(out.contains("52:54:00:0a:0b:0c"), "{out}");

    // block-detach: the guest lets go and the disk leaves the guest, the
    // VMM and block-list.
    let (ok, out, err) = domus_cli(&state, &["block-detach", "hp", "vda"]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("detached vda"), "{out}");
    let from = fresh();
    assert!(seen_after(from, "tick", 10));
    let from = fresh();
    assert!(seen_after(from, "tick", 10));
    let t = std::fs::read_to_string(&console).unwrap();
    assert!(
        !t[from..].contains("seen /dev/vda"),
        "the guest still sees vda"
    );
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
    assert!(domus_cli(&state, &["destroy", "hp"]).0);
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

/// The VMM's resident memory (VmRSS) in MiB.
fn rss_mib(pid: u64) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0)
        >> 10
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
    let (_, l, _) = domus_cli(&state, &["list", "--json"]);
    let l: serde_json::Value = serde_json::from_str(&l).unwrap();
    let (id, pid) = (l[1]["id"].as_u64().unwrap(), l[1]["pid"].as_u64().unwrap());
    let console = state.join(format!("domains/{id}/console.log"));
    assert!(wait_for_text(&console, "memtotal=", 1, 90));
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
    // The guest gives up 256 MiB: its MemTotal and the VMM's RSS drop. The
    // balloon takes 1 MiB per round trip; beside the other tests on the
    // 2-CPU machine it once had taken 146 MiB after 60 s.
    let end = Instant::now() + Duration::from_secs(180);
    while (memtotal() + 200 > total_before || rss_mib(pid) + 150 > rss_before)
        && Instant::now() < end
    {
        std::thread::sleep(Duration::from_millis(500));
    }
    let (total_after, rss_after) = (memtotal(), rss_mib(pid));
    eprintln!(
        "mem-set 128M: guest MemTotal {total_before} -> {total_after} MiB, VMM RSS {rss_before} -> {rss_after} MiB"
    );
    assert!(
        total_after + 200 <= total_before,
        "guest MemTotal {total_before} -> {total_after} MiB"
    );
    assert!(
        rss_after + 150 <= rss_before,
        "VMM RSS {rss_before} -> {rss_after} MiB"
    );
    let (_, l, _) = domus_cli(&state, &["list", "--json"]);
    assert!(l.contains("\"memory_mib\": 128"), "{l}");
    assert!(domus_cli(&state, &["destroy", "m"]).0);
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}
