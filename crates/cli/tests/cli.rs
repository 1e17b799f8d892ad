//! Bad input to `domus run`: one clear line on stderr, exit status 2, never a
//! panic. These need no guest (the checks come before any guest memory is
//! allocated), so they run in the ordinary `cargo test`.

use std::path::PathBuf;
use std::process::Command;

fn domus(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_domus"))
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("running domus");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn scratch(name: &str, data: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("domus-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    // Tests run in parallel and share these files: write a private copy and
    // rename it into place, so no test's domus ever reads a half-written one.
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.{n}"));
    std::fs::write(&tmp, data).unwrap();
    std::fs::rename(&tmp, &p).unwrap();
    p
}

/// A file that passes the kernel format check (a minimal bzImage header).
fn fake_kernel() -> PathBuf {
    let mut h = vec![0u8; 0x400];
    h[0x1fe] = 0x55;
    h[0x1ff] = 0xaa;
    h[0x202..0x206].copy_from_slice(b"HdrS");
    h[0x206..0x208].copy_from_slice(&0x20fu16.to_le_bytes());
    h[0x236] = 1;
    scratch("fake-bzimage", &h)
}

#[track_caller]
fn assert_bad_input(args: &[&str], expect: &str) {
    let (code, err) = domus(args);
    assert_eq!(code, 2, "exit status for {args:?}; stderr: {err}");
    assert_eq!(err.lines().count(), 1, "one line for {args:?}, got: {err}");
    assert!(err.starts_with("domus: "), "{err}");
    assert!(
        err.contains(expect),
        "{args:?}: expected '{expect}' in: {err}"
    );
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{err}"
    );
}

#[test]
fn missing_kernel() {
    assert_bad_input(
        &["run", "--kernel", "/nonexistent/vmlinuz"],
        "kernel /nonexistent/vmlinuz: no such file",
    );
}

#[test]
fn unreadable_kernel() {
    assert_bad_input(&["run", "--kernel", "/"], "kernel /: is a directory");
}

#[test]
fn not_a_kernel() {
    let p = scratch("not-a-kernel", b"#!/bin/sh\necho hello\n");
    assert_bad_input(
        &["run", "--kernel", p.to_str().unwrap()],
        "not a Linux kernel",
    );
}

#[test]
fn missing_initrd() {
    let k = fake_kernel();
    assert_bad_input(
        &[
            "run",
            "--kernel",
            k.to_str().unwrap(),
            "--initrd",
            "/nonexistent/initrd",
        ],
        "initrd /nonexistent/initrd: no such file",
    );
    assert_bad_input(
        &["run", "--kernel", k.to_str().unwrap(), "--initrd", "/tmp"],
        "is a directory",
    );
}

#[test]
fn zero_vcpus() {
    let k = fake_kernel();
    assert_bad_input(
        &["run", "--kernel", k.to_str().unwrap(), "--vcpus", "0"],
        "--vcpus must be at least 1",
    );
}

#[test]
fn too_many_vcpus() {
    let k = fake_kernel();
    assert_bad_input(
        &["run", "--kernel", k.to_str().unwrap(), "--vcpus", "100000"],
        "more than this host's KVM allows",
    );
    assert_bad_input(
        &["run", "--kernel", k.to_str().unwrap(), "--vcpus", "-1"],
        "'-1'",
    );
}

#[test]
fn too_little_memory() {
    let k = fake_kernel();
    assert_bad_input(
        &["run", "--kernel", k.to_str().unwrap(), "--memory", "16M"],
        "below the 64 MiB a kernel needs",
    );
}

#[test]
fn too_much_memory() {
    let k = fake_kernel();
    assert_bad_input(
        &["run", "--kernel", k.to_str().unwrap(), "--memory", "100T"],
        "more than this host has",
    );
}

#[test]
fn malformed_sizes_and_consoles() {
    let k = fake_kernel();
    assert_bad_input(
        &["run", "--kernel", k.to_str().unwrap(), "--memory", "12X"],
        "unknown unit",
    );
    assert_bad_input(
        &["run", "--kernel", k.to_str().unwrap(), "--console", "tty"],
        "not stdout, none or file:PATH",
    );
}

#[test]
fn unknown_options() {
    assert_bad_input(
        &["run", "--kernel", "/x", "--bogus"],
        "unexpected argument '--bogus'",
    );
    assert_bad_input(&["frobnicate"], "unrecognized subcommand");
    assert_bad_input(&["run"], "--kernel");
}

#[test]
fn a_config_file_is_checked_like_the_flags() {
    let dir = std::env::temp_dir().join(format!("domus-cli-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("vm.json");
    let arg = cfg.to_str().unwrap();
    let write = |text: &str| std::fs::write(&cfg, text).unwrap();
    assert_bad_input(&["run", "--config", "/nonexistent/vm.json"], "no such file");
    write(r#"{"kernel": "/x", "cpus": 2}"#);
    assert_bad_input(&["run", "--config", arg], "unknown field `cpus`");
    write(r#"{"kernel": "/x", "disks": [{"path": "/d", "size": 1}]}"#);
    assert_bad_input(&["run", "--config", arg], "unknown field `size`");
    write(r#"{"kernel": "/x", "nets": ["tap=t,mac=01:00:00:00:00:00"]}"#);
    assert_bad_input(&["run", "--config", arg], "multicast");
    write(r#"{"kernel": "/nonexistent/vmlinuz"}"#);
    assert_bad_input(
        &["run", "--config", arg],
        "kernel /nonexistent/vmlinuz: no such file",
    );
    write("[]");
    assert_bad_input(&["run", "--config", arg], "JSON object");
    assert_bad_input(
        &["run", "--config", arg, "--kernel", "/x"],
        "cannot be used with",
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn help_documents_exit_statuses() {
    let out = Command::new(env!("CARGO_BIN_EXE_domus"))
        .args(["run", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "0    the guest powered off",
        "2    bad input",
        "3    the guest rebooted",
        "4    the guest crashed",
    ] {
        assert!(help.contains(needle), "missing '{needle}' in help:\n{help}");
    }
}
