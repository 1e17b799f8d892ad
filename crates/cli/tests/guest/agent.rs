//! The guest agent in the tests: [`TestVm::agent`] boots a domain whose init
//! is `domus-guest agent` (added to the kit's initramfs, with a vsock
//! device for it), and [`Running`] runs commands in the booted guest,
//! each answered with its exit status and output as a typed
//! [`Reply`](domus_guest::agent::Reply), instead of a command line in
//! base64 and `key=value` lines scraped from the console.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use domus_guest::agent::{Client, ClientError, Reply};

use crate::*;

/// The vsock port the agent listens on.
pub(crate) const AGENT_PORT: u32 = 1024;

/// The kit's initramfs with the static `domus-guest` at /bin/domus-guest,
/// made once per test run.
pub(crate) fn agent_initrd() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let helper = std::fs::read(guest_helper()).unwrap();
        // In a directory of its own, which daemons under test serve.
        let dir = std::env::temp_dir().join(format!("domus-test-{}-agent", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("initramfs.cpio");
        domus_kit::extend_initrd(&kit().initrd, &[("bin/domus-guest", 0o755, &helper)], &out)
            .unwrap();
        out
    })
    .clone()
}

/// A vsock CID for a test's guest: unique in this run, and apart from the
/// range of the vsock test's (3 + pid % 100000).
pub(crate) fn next_cid() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    1_000_000 + (std::process::id() % 100_000) * 64 + NEXT.fetch_add(1, Ordering::SeqCst) % 64
}

impl TestVm {
    /// A domain whose init is the guest agent: start it with
    /// [`TestVm::start`], then run commands in it.
    pub(crate) fn agent() -> Self {
        let cid = next_cid();
        let mut vm = TestVm::new(&format!("domus-guest agent {AGENT_PORT}"))
            .args(["--vsock".to_string(), format!("cid={cid}")]);
        vm.initrd = agent_initrd();
        vm.agent_cid = Some(cid);
        vm
    }

    /// Boots the domain and waits until its agent answers.
    pub(crate) fn start(&self) -> Running {
        let cid = self
            .agent_cid
            .expect("TestVm::agent() makes a domain to start");
        Running::spawn(self.command(), cid, true)
    }
}

/// `domus run --restore FILE` of a domain whose init was the guest agent
/// (CID `cid`), under the seccomp filter, with `args` after it; stdin from
/// /dev/null, the console and stderr piped.
pub(crate) fn restore_command(file: &std::path::Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_domus"));
    c.args(["run", "--seccomp", "--restore"])
        .arg(file)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

impl Running {
    /// Starts `cmd` (a `domus run` of a domain whose agent has CID `cid`)
    /// and, if `wait`, waits until its agent answers.
    pub(crate) fn spawn(mut cmd: Command, cid: u32, wait: bool) -> Running {
        let api = crate::api_socket_of(&cmd);
        let child = cmd.spawn().expect("spawning domus run");
        let pid = child.id();
        let watched = api.clone();
        let done = std::thread::spawn(move || supervise(child, watched, |_| {}));
        // The guest's whole budget, as for TestVm::run: past it the console
        // reader's watchdog captures the VMM (a stall report) and kills it.
        let budget = Duration::from_secs(GUEST_TIMEOUT_S.into());
        let mut agent = Client::new(cid, AGENT_PORT);
        agent.timeout = budget;
        let mut vm = Running {
            pid,
            api,
            agent,
            done: Some(done),
        };
        if wait {
            vm.wait_agent();
        }
        vm
    }

    /// Waits until the agent answers (the guest booted, or was resumed).
    pub(crate) fn wait_agent(&mut self) {
        let budget = Duration::from_secs(GUEST_TIMEOUT_S.into());
        let done = &self.done;
        let running = || done.as_ref().is_some_and(|d| !d.is_finished());
        if let Err(e) = self.agent.wait(budget + Duration::from_secs(10), running) {
            self.fail(&format!("the guest agent never answered: {e}"));
        }
    }

    /// [`Running::wait_agent`] for a restored guest (see [`wait_restored`]).
    pub(crate) fn wait_restored(&mut self) {
        let budget = Duration::from_secs(GUEST_TIMEOUT_S.into()) + Duration::from_secs(10);
        let done = &self.done;
        let running = || done.as_ref().is_some_and(|d| !d.is_finished());
        if let Err(e) = wait_restored(&self.agent, budget, running) {
            self.fail(&format!("the restored guest's agent never answered: {e}"));
        }
    }

    /// Kills the VMM (a domain saved and left paused) and returns its run.
    pub(crate) fn kill(mut self) -> Run {
        self.stop()
    }
}

/// Waits for the agent of a restored guest. Its vsock device sends the
/// guest a transport reset as it starts, and a connection the host makes
/// before the guest has handled it is reset with the others (the agent
/// "closed without answering"). Such a first contact is tried again, at
/// most 3 times, each retry said on stderr; see issue 14's note (vhost could
/// start only once the guest has handled the reset).
pub(crate) fn wait_restored(
    agent: &Client,
    patience: Duration,
    running: impl Fn() -> bool,
) -> Result<(), ClientError> {
    for retry in 1.. {
        match agent.wait(patience, &running) {
            Err(ClientError::Reply(m)) if m.contains("closed without answering") && retry <= 3 => {
                eprintln!(
                    "domus-test: the restored guest reset the first connection (its vsock transport reset); retry {retry} of 3"
                );
            }
            r => return r,
        }
    }
    unreachable!("the loop returns")
}

/// A booted domain with its agent.
pub(crate) struct Running {
    pid: u32,
    /// Its API socket, if it serves one (read by a stall report).
    api: Option<PathBuf>,
    agent: Client,
    done: Option<std::thread::JoinHandle<Run>>,
}

impl Running {
    /// The guest's vsock CID.
    pub(crate) fn cid(&self) -> u32 {
        self.agent.cid
    }

    /// Runs `cmd` (a shell command line) in the guest.
    #[track_caller]
    pub(crate) fn run(&mut self, cmd: &str) -> Reply {
        match self.agent.run(cmd) {
            Ok(r) => r,
            Err(e) => self.fail(&format!("`{cmd}` in the guest: {e}")),
        }
    }

    /// Runs `cmd`, which must succeed, and gives its stdout without the
    /// trailing newline.
    #[track_caller]
    pub(crate) fn sh(&mut self, cmd: &str) -> String {
        let r = self.run(cmd);
        assert_eq!(r.status, 0, "`{cmd}` in the guest: {r:?}");
        r.out().to_string()
    }

    /// A request to this VMM's API socket `sock`; a VMM that no longer
    /// answers fails the test with what it printed.
    #[track_caller]
    pub(crate) fn api(
        &mut self,
        sock: &std::path::Path,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> (u16, serde_json::Value) {
        match domus_http::request(sock, method, path, body) {
            Ok((status, text)) if text.is_empty() => (status, serde_json::Value::Null),
            Ok((status, text)) => match serde_json::from_str(&text) {
                Ok(v) => (status, v),
                Err(e) => self.fail(&format!("{method} {path}: {e}: {text}")),
            },
            Err(e) => self.fail(&format!("{method} {path}: {e}")),
        }
    }

    /// Ends the agent, which powers the guest off, and returns the run.
    pub(crate) fn finish(mut self) -> Run {
        if let Err(e) = self.agent.exit() {
            self.fail(&format!("ending the guest agent: {e}"));
        }
        self.done
            .take()
            .expect("finished once")
            .join()
            .expect("the console reader")
    }

    /// Fails the test: the agent did not answer. A VMM still running is
    /// captured first, as the watchdog does a guest that runs past its
    /// time, so the message says whether the nested host stalled it
    /// (`domus-test: platform stall:`, which tools/test runs again) or
    /// Domus did.
    #[track_caller]
    pub(crate) fn fail(&mut self, what: &str) -> ! {
        let running = self.done.as_ref().is_some_and(|d| !d.is_finished());
        let report = if running {
            let dir = std::env::temp_dir().join(format!("domus-test-stall-{}", self.pid));
            let _ = std::fs::create_dir_all(&dir);
            common::stall_report(self.pid, &dir, "", self.api.as_deref())
        } else {
            String::new()
        };
        let run = self.stop();
        panic!("{what}\n{report}\n{run}")
    }

    /// Kills the VMM and returns what it printed.
    fn stop(&mut self) -> Run {
        let done = self.done.take().expect("stopped once");
        if !done.is_finished() {
            // SAFETY: kill(2) on the VMM this test started, which the
            // console reader has not reaped (it has not finished).
            unsafe { libc::kill(self.pid as i32, libc::SIGKILL) };
        }
        done.join().expect("the console reader")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.done.is_some() {
            self.stop();
        }
    }
}
