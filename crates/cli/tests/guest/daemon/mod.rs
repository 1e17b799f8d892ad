//! The daemon (`domus daemon` and the xl-style verbs) with real domains:
//! helpers shared by its tests.

mod clone;
mod console;
mod control;
mod devices;
mod image;
mod jail;
mod lifecycle;
mod migrate;
mod scheduling;
mod snapshot;
mod vfr;

use crate::*;
use domus_api::daemon::{Domain, Info, State};
use domus_guest::agent::Client;

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

/// `domus list --json`, read as the API's type (Domain-0 first).
fn list(state: &std::path::Path) -> Vec<Domain> {
    let (ok, out, err) = domus_cli(state, &["list", "--json"]);
    assert!(ok, "{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// The domain named `name` as `list` shows it, if it is there.
fn find(state: &std::path::Path, name: &str) -> Option<Domain> {
    list(state).into_iter().find(|d| d.name == name)
}

/// `domus info --json`, read as the API's type.
fn info(state: &std::path::Path) -> Info {
    let (ok, out, err) = domus_cli(state, &["info", "--json"]);
    assert!(ok, "{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
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
            // A test failing after one of its guests triple-faulted says so
            // first, at the start of a line, as a standalone VMM does
            // (tools/test counts it as the nested host's and runs it again;
            // CI of 2026-11-26: a fresh guest reset under the jailed save
            // test). No daemon test resets a guest on purpose.
            let reset = triple_faults_logged(&self.log);
            if !reset.is_empty() {
                eprintln!(
                    "\ndomus: a vCPU triple-faulted in this test's domain(s) {} (the daemon restarted them)",
                    reset.join(", ")
                );
            }
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            eprintln!("---- the daemon's log ({}):\n{log}", self.log.display());
            // And what each domain still there printed last.
            let dirs = std::fs::read_dir(self.state.join("domains"))
                .into_iter()
                .flatten();
            for d in dirs.flatten() {
                let console =
                    std::fs::read_to_string(d.path().join("console.log")).unwrap_or_default();
                let lines: Vec<&str> = console.lines().collect();
                let tail = lines[lines.len().saturating_sub(30)..].join("\n");
                eprintln!(
                    "---- {}/console.log, last lines:\n{tail}",
                    d.path().display()
                );
            }
            // A failed test takes its daemon and domains down, so that they
            // do not slow the tests that run after it.
            let domains = self.state.join("domains");
            let _ = Command::new("pkill")
                .args(["-9", "-f", &format!("api-socket {}/", domains.display())])
                .status();
        }
        // The daemon ends with its test, failed or not: it holds the test's
        // stdout, and a daemon left running keeps whatever reads that open
        // (a pipe in the nested host never ends).
        let _ = self.child.kill();
        let _ = self.child.wait();
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
            // "... domain NAME VMM log: ...", whatever the log line's prefix.
            let (before, _) = l.split_once(" VMM log: ")?;
            before.rsplit_once("domain ").map(|(_, n)| n.to_string())
        })
        .collect()
}

/// The domains whose triple faults the daemon's `log` names, for a test
/// that failed. A client can see a VMM's socket close a
/// moment before the daemon logs why the VMM ended (CI of 2026-11-26:
/// "Connection reset by peer", the triple fault logged after the panic),
/// so the log gets 10 s to show one.
fn triple_faults_logged(log: &std::path::Path) -> Vec<String> {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let found = triple_faulted(log);
        if !found.is_empty() || Instant::now() >= end {
            return found;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Whether process `pid` is running (not gone, not a zombie).
fn alive(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rfind(')').map(|i| !s[i + 2..].starts_with(['Z', 'X'])))
        .unwrap_or(false)
}

fn start_daemon(state: &std::path::Path) -> TestDaemon {
    start_daemon_with(state, &[])
}

/// [`start_daemon`] with more of `domus daemon`'s options.
fn start_daemon_with(state: &std::path::Path, extra: &[&str]) -> TestDaemon {
    let log = state.with_file_name("daemon.log");
    std::fs::create_dir_all(state.parent().unwrap()).unwrap();
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .unwrap();
    // It serves the test's own files, the kit and the agent's initrd.
    let agent = crate::agent::agent_initrd();
    let mut images = vec![state.parent().unwrap(), agent.parent().unwrap()];
    let kit = crate::kit().kernel;
    images.push(kit.parent().unwrap());
    let child = Command::new(env!("CARGO_BIN_EXE_domus"))
        .args(["daemon", "--state-dir"])
        .arg(state)
        .args(
            images
                .iter()
                .flat_map(|d| [std::path::Path::new("--image-dir"), d]),
        )
        // The default network only where a test asks for it (--network...):
        // tests run side by side, each with its own daemon.
        .args((!extra.iter().any(|a| a.starts_with("--network"))).then_some("--no-network"))
        .args(extra)
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

/// Writes `dir/NAME.cfg`: a kit domain with `memory` MiB whose init is the
/// guest agent, on a vsock device with a CID of its own, and any further
/// `settings` lines. Returns the file and the agent's client.
fn agent_config(
    dir: &std::path::Path,
    name: &str,
    memory: u32,
    settings: &str,
) -> (PathBuf, Client) {
    let cid = agent::next_cid();
    let cfg = dir.join(format!("{name}.cfg"));
    std::fs::write(
        &cfg,
        format!(
            "name = '{name}'\nmemory = {memory}\nkernel = '{}'\nramdisk = '{}'\nextra = 'console=ttyS0 quiet panic=-1 -- domus-guest agent {}'\nvsock = 'cid={cid}'\n{settings}\n",
            kit().kernel.display(),
            agent::agent_initrd().display(),
            agent::AGENT_PORT,
        ),
    )
    .unwrap();
    (cfg, Client::new(cid, agent::AGENT_PORT))
}

/// Waits until the agent of a daemon's domain answers.
fn agent_ready(guest: &Client) {
    if let Err(e) = guest.wait(Duration::from_secs(120), || true) {
        panic!("the guest agent never answered: {e}");
    }
}

/// Waits until the agent of a restored domain answers (see
/// `agent::wait_restored`).
fn restored_ready(guest: &Client) {
    if let Err(e) = crate::agent::wait_restored(guest, Duration::from_secs(120), || true) {
        panic!("the restored guest's agent never answered: {e}");
    }
}

/// Runs `cmd` in a daemon's domain through its agent; it must succeed.
/// Gives its stdout without the trailing newline.
#[track_caller]
fn guest_sh(guest: &Client, cmd: &str) -> String {
    let r = guest
        .run(cmd)
        .unwrap_or_else(|e| panic!("`{cmd}` in the guest: {e}"));
    assert_eq!(r.status, 0, "`{cmd}` in the guest: {r:?}");
    r.out().to_string()
}

fn spin_config(dir: &std::path::Path, name: &str, extra_settings: &str, cmd: &str) -> PathBuf {
    domain_config(dir, name, 128, &format!("-- {cmd}"), extra_settings)
}

/// Where the daemon at `state` keeps domain `id`'s console.
fn console_path(state: &std::path::Path, id: impl std::fmt::Display) -> std::path::PathBuf {
    state.join(format!("domains/{id}/console.log"))
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

/// Waits until domain `dom`'s console has shown `needle` `times` times.
/// When it has not after `secs`, the test fails with a capture of the
/// domain's VMM (common::stall_report), as the `domus run` tests' watchdog
/// does: the message's line `domus-test: platform stall:` is what tools/test
/// runs again in a fresh nested host, and anything else (a slow guest, one
/// the VMM stopped) fails the run.
#[track_caller]
fn expect_console(state: &std::path::Path, dom: &str, needle: &str, times: usize, secs: u64) {
    let d = find(state, dom).unwrap_or_else(|| panic!("domain {dom} is not listed"));
    let console = console_path(state, d.id);
    if wait_for_text(&console, needle, times, secs) {
        return;
    }
    let shown = std::fs::read_to_string(&console).unwrap_or_default();
    let tail: Vec<&str> = shown.lines().rev().take(20).collect();
    let tail = tail.into_iter().rev().collect::<Vec<_>>().join("\n");
    let report = stall_capture(state, dom, &shown);
    panic!(
        "domain {dom}'s console did not show {needle:?} {times} time(s) in {secs} s\n\
         {report}\n---- its console, last lines:\n{tail}"
    );
}

/// A capture (common::stall_report, its virtio rings included) of the VMM
/// that runs domain `dom` now (a restart may have replaced the first one),
/// whose console so far is `console`: its line `domus-test: platform
/// stall:` is what tools/test runs again in a fresh nested host.
fn stall_capture(state: &std::path::Path, dom: &str, console: &str) -> String {
    match find(state, dom).and_then(|d| Some((d.id, d.pid?))) {
        Some((id, pid)) => {
            let dir = std::env::temp_dir().join(format!("domus-test-stall-{pid}"));
            let _ = std::fs::create_dir_all(&dir);
            let api = state.join(format!("domains/{id}/api.sock"));
            crate::common::stall_report(pid as u32, &dir, console, Some(&api))
        }
        None => format!("domus-test: domain {dom} has no VMM running"),
    }
}

/// The VMM's resident memory (VmRSS) in MiB; 0 once it is gone.
fn rss_mib(pid: u64) -> u64 {
    domus_daemon::rss_bytes(pid as i64).unwrap_or(0) >> 20
}
