//! Guest-booting integration tests: real Debian kernels on real KVM.
//!
//! Compiled only with `--features guest-tests`; `tools/test` runs them inside
//! `tools/kvm-host`, which gives a /dev/kvm that runs stock kernels (directly on
//! a VT-x/AMD-V host, in a nested KVM host elsewhere). The kit comes from
//! `$DOMUS_KIT_DIR` or the default `domus kit` cache.
//!
//! One file per area (boot, block, net, memory, the domain's API, the
//! daemon); this one holds the harness they share: the kit, booting a guest
//! with a command, and reading what it printed.
#![cfg(feature = "guest-tests")]

#[path = "../common/mod.rs"]
mod common;

mod agent;
mod block;
mod boot;
mod daemon;
mod domain_api;
mod memory;
mod net;
mod snapshot;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
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

/// `domus-guest`, built static for guests (tools/test builds it).
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

const GUEST_TIMEOUT_S: u32 = 180;

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
    /// Time from the guest's last line to the VMM's exit.
    tail: Duration,
}

/// A finished run as a failure message shows it: the exit status, then the
/// console, then the VMM's stderr, each of whose lines keeps its start (so
/// tools/test can find the VMM's triple-fault line or a stall report there).
impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit status {}\nstdout:\n{}\nstderr:\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// A domain for a test: `domus run` on the kit's bzImage and initramfs,
/// whose init runs `command` (a shell command line, base64 on the kernel
/// command line) and then powers off. One vCPU and 256 MiB unless the test
/// says otherwise.
struct TestVm {
    kernel: PathBuf,
    initrd: PathBuf,
    /// The vsock CID of its guest agent (`TestVm::agent`).
    agent_cid: Option<u32>,
    vcpus: u32,
    memory: String,
    args: Vec<String>,
    params: String,
    command: String,
}

impl TestVm {
    fn new(command: &str) -> Self {
        let k = kit();
        Self {
            kernel: k.kernel,
            initrd: k.initrd,
            agent_cid: None,
            vcpus: 1,
            memory: "256M".into(),
            args: Vec::new(),
            params: String::new(),
            command: command.into(),
        }
    }

    /// Another kernel than the kit's bzImage (its ELF vmlinux).
    fn kernel(mut self, path: PathBuf) -> Self {
        self.kernel = path;
        self
    }

    fn vcpus(mut self, n: u32) -> Self {
        self.vcpus = n;
        self
    }

    /// `256M`, `1G`, ... as `--memory` takes it.
    fn memory(mut self, size: &str) -> Self {
        self.memory = size.into();
        self
    }

    /// A `--disk`, as `domus run` takes it: `PATH[,ro][,id=..][,bw=..][,iops=..]`.
    fn disk(mut self, spec: impl std::fmt::Display) -> Self {
        self.args.extend(["--disk".into(), spec.to_string()]);
        self
    }

    /// More `domus run` arguments.
    fn args<S: Into<String>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Serve the domain's API on `sock` (`--api-socket`).
    fn api_socket(self, sock: &std::path::Path) -> Self {
        self.args(["--api-socket".to_string(), sock.display().to_string()])
    }

    /// Kernel parameters before the command (`root=/dev/vda`).
    fn params(mut self, params: &str) -> Self {
        self.params = params.into();
        self
    }

    /// The `domus run` command, not started: stdin from /dev/null, stdout
    /// (the console) and stderr piped. It serves its API on a socket of
    /// its own unless the test gave one, so that a stall report can read
    /// its rings (common::stall_report).
    fn command(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_domus"));
        c.arg("run");
        if !self.args.iter().any(|a| a == "--api-socket") {
            static N: AtomicU32 = AtomicU32::new(0);
            let n = N.fetch_add(1, Ordering::Relaxed);
            let sock = format!("domus-test-{}-{n}.sock", std::process::id());
            c.arg("--api-socket").arg(std::env::temp_dir().join(sock));
        }
        // Every guest test runs its VMM under the seccomp filter, as the
        // daemon does.
        c.arg("--seccomp")
            .arg("--kernel")
            .arg(&self.kernel)
            .arg("--initrd")
            .arg(&self.initrd)
            .args(["--vcpus", &self.vcpus.to_string(), "--memory", &self.memory])
            .args(&self.args)
            .arg("--cmdline")
            .arg(format!(
                "console=ttyS0 quiet panic=-1 {} domus.cmd={}",
                self.params,
                base64(&self.command)
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// Boots the domain and waits for its VMM to exit.
    fn run(&self) -> Run {
        self.run_watching(|_| {})
    }

    /// [`TestVm::run`], handing each console line (trimmed) to `on_line` as
    /// it arrives, so the test can act on the running domain (through its
    /// API).
    fn run_watching(&self, on_line: impl FnMut(&str)) -> Run {
        let cmd = &mut self.command();
        let api = api_socket_of(cmd);
        supervise(cmd.spawn().expect("spawning domus run"), api, on_line)
    }
}

/// The `--api-socket` a `domus run` command was given.
fn api_socket_of(cmd: &Command) -> Option<PathBuf> {
    let mut args = cmd.get_args();
    args.find(|a| *a == "--api-socket")?;
    args.next().map(PathBuf::from)
}

/// Follows a started `domus run` (serving its API on `api`, if it does) to
/// its end, handing each console line (trimmed) to `on_line` as it
/// arrives.
fn supervise(
    mut child: std::process::Child,
    api: Option<PathBuf>,
    mut on_line: impl FnMut(&str),
) -> Run {
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
        let report = common::stall_report(pid, &dir, "", api.as_deref());
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

#[track_caller]
fn assert_clean_poweroff(run: &Run) {
    assert_eq!(run.code, 0, "{run}");
    assert!(run.stdout.contains("domus-init: exit status 0"), "{run}");
}

/// [`assert_clean_poweroff`] for guests that depend on one another (one
/// waits for what the other sends): when any run failed, the message shows
/// every run, labelled, so the cause (a peer that stalled in the nested
/// host's way, say) is seen beside its consequence and tools/test can find
/// a platform stall in any of them.
#[track_caller]
fn assert_all_clean_poweroff(runs: &[(&str, &Run)]) {
    let clean = |r: &Run| r.code == 0 && r.stdout.contains("domus-init: exit status 0");
    if runs.iter().all(|(_, r)| clean(r)) {
        return;
    }
    let shown: Vec<String> = runs
        .iter()
        .map(|(name, r)| {
            let state = if clean(r) { "clean" } else { "FAILED" };
            format!("==== guest {name} ({state}) ====\n{r}")
        })
        .collect();
    panic!("a guest did not power off cleanly\n{}", shown.join("\n"));
}

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

/// A word the guest printed after `key=` (not a number).
fn word(run: &Run, key: &str) -> String {
    let prefix = format!("{key}=");
    run.stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix(&prefix).map(str::to_string))
        .unwrap_or_else(|| panic!("no {key}= in the guest's output: {run}"))
}

/// Waits for a balloon to reach its target (or free page reporting to give
/// memory back). `left` says how far off it is, in MiB (0: there). The
/// guest gives memory up one batch of page frames per round trip, at the
/// pace of a guest that the nested test host runs: beside the other tests
/// as slow as 0.9 MiB/s (CI of 2026-12-02: 155 MiB in 180 s), alone in a
/// host 213 MiB in 13 s. So what fails is a balloon that stops: `left` not
/// lower for `STALL`, or not at 0 after `CAP`. Returns how long it took, or
/// why it failed.
fn wait_balloon(mut left: impl FnMut() -> u64) -> Result<Duration, String> {
    const STALL: Duration = Duration::from_secs(90);
    const CAP: Duration = Duration::from_secs(600);
    let start = Instant::now();
    let (mut best, mut moved) = (left(), start);
    while best > 0 {
        if moved.elapsed() >= STALL {
            return Err(format!(
                "stuck {best} MiB off for {} s ({} s in)",
                STALL.as_secs(),
                start.elapsed().as_secs()
            ));
        }
        if start.elapsed() >= CAP {
            return Err(format!("{best} MiB off after {} s", CAP.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(250));
        let now = left();
        if now < best {
            (best, moved) = (now, Instant::now());
        }
    }
    Ok(start.elapsed())
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
