//! Starting a VMM process, in new namespaces when it is to be jailed.
//!
//! `std::process::Command` cannot make a child in a new PID namespace (the
//! flag takes effect only for the caller's later children, and a process
//! whose children would land in another namespace cannot make threads), so
//! the child is made here with clone(2) and the namespace flags, then set
//! up and exec'd as `Command` would: between the clone and the exec it
//! makes only raw system calls on memory prepared before the clone, since
//! the parent (the daemon) has other threads that may hold locks.

use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;

/// A process to start.
pub struct Job {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    /// Its standard input (None: /dev/null), output and error.
    pub stdin: Option<OwnedFd>,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    /// A cgroup's `cgroup.procs`, opened for writing: the child joins that
    /// group before it execs, so nothing it runs escapes the group's
    /// limits.
    pub cgroup_procs: Option<OwnedFd>,
    /// New mount, PID, IPC and UTS namespaces: the child is the first
    /// process (PID 1) of its own PID namespace, and the jail
    /// ([`crate::enter`]) can change its root without touching the host's.
    pub namespaces: bool,
    /// Its limit on open descriptors (RLIMIT_NOFILE).
    pub max_files: u64,
    /// Killed (SIGKILL) when the caller dies: for a child that only lives
    /// for the caller (`domus run --jail`); the daemon's VMMs outlive it.
    pub dies_with_parent: bool,
}

/// The namespaces a jailed VMM gets.
const NAMESPACES: libc::c_int =
    libc::CLONE_NEWNS | libc::CLONE_NEWPID | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS;

/// Starts `job`: a new session (a terminal's signals do not reach it),
/// `no_new_privs` (no set-uid binary or file capability takes effect; the
/// seccomp filter needs it too), no core dumps (they would hold the guest's
/// memory), no descriptor of the caller's but the three standard ones.
/// Returns once the program runs, or with the error that stopped the exec.
pub fn spawn(job: Job) -> io::Result<Process> {
    let cstr =
        |b: &[u8]| CString::new(b).map_err(|_| io::Error::other("a NUL byte in an argument"));
    let program = cstr(job.program.as_os_str().as_bytes())?;
    let mut args = vec![program.clone()];
    for a in &job.args {
        args.push(cstr(a.as_bytes())?);
    }
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let env: Vec<CString> = std::env::vars_os()
        .filter_map(|(k, v)| {
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            CString::new(kv).ok()
        })
        .collect();
    let mut envp: Vec<*const libc::c_char> = env.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());
    let null = std::fs::File::open("/dev/null")?;
    let (report_r, report_w) = pipe()?;

    let flags = if job.namespaces { NAMESPACES } else { 0 };
    let setup = Setup {
        stdin: job
            .stdin
            .as_ref()
            .map_or(null.as_raw_fd(), AsRawFd::as_raw_fd),
        stdout: job.stdout.as_raw_fd(),
        stderr: job.stderr.as_raw_fd(),
        cgroup_procs: job.cgroup_procs.as_ref().map(AsRawFd::as_raw_fd),
        report: report_w.as_raw_fd(),
        max_files: job.max_files,
        // SAFETY: getpid(2) has no arguments.
        parent: job.dies_with_parent.then(|| unsafe { libc::getpid() }),
        program: program.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
    };
    // SAFETY: clone(2) without CLONE_VM and without a new stack behaves as
    // fork(2): the child gets a copy of this address space and returns 0
    // here. The child runs only `setup.exec()`, which makes raw system calls
    // on the memory prepared above and never returns.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            libc::c_ulong::try_from(flags | libc::SIGCHLD).unwrap_or(0),
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: in the child, see above.
        unsafe { setup.exec() }
    }
    let pid = pid as libc::pid_t;
    drop(report_w);
    // The report pipe closes at exec (close-on-exec): EOF means the program
    // runs; four bytes are the errno of the step that failed.
    let mut errno = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        // SAFETY: read(2) into the rest of `errno`.
        let n = unsafe {
            libc::read(
                report_r.as_raw_fd(),
                errno[got..].as_mut_ptr().cast(),
                4 - got,
            )
        };
        match n {
            0 => break,
            n if n > 0 => got += n as usize,
            _ if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
            _ => return Err(io::Error::last_os_error()),
        }
    }
    let mut process = Process { pid, status: None };
    if got == 4 {
        let _ = process.wait();
        return Err(io::Error::from_raw_os_error(i32::from_ne_bytes(errno)));
    }
    Ok(process)
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2(2) writes two descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both were just made and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Reports this thread's errno on `report` and exits 127.
///
/// # Safety
/// Only in the child of the clone in [`spawn`].
unsafe fn fail(report: RawFd) -> ! {
    // SAFETY: errno is this thread's; write(2) and _exit(2) are raw calls.
    unsafe {
        let b = (*libc::__errno_location()).to_ne_bytes();
        libc::write(report, b.as_ptr().cast(), 4);
        libc::_exit(127)
    }
}

/// What the child needs between clone and exec, as raw values.
struct Setup {
    stdin: RawFd,
    stdout: RawFd,
    stderr: RawFd,
    cgroup_procs: Option<RawFd>,
    report: RawFd,
    max_files: u64,
    /// With `dies_with_parent`: the caller's pid.
    parent: Option<libc::pid_t>,
    program: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
}

impl Setup {
    /// Sets the child up and execs the program; on a failure, reports the
    /// errno on the pipe and exits 127.
    ///
    /// # Safety
    /// Only in the child of the clone in [`spawn`], whose memory holds
    /// what the pointers point at.
    unsafe fn exec(&self) -> ! {
        // SAFETY: raw system calls on descriptors and memory that exist in
        // this copy of the parent's address space; none allocates or takes
        // a lock.
        unsafe {
            for (from, to) in [(self.stdin, 0), (self.stdout, 1), (self.stderr, 2)] {
                if libc::dup2(from, to) < 0 {
                    fail(self.report);
                }
            }
            libc::setsid();
            if let Some(parent) = self.parent {
                // Armed, then checked: the parent may have died before. In
                // a new PID namespace the parent has no pid here (getppid
                // is 0), and the check cannot be made.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    fail(self.report);
                }
                let ppid = libc::getppid();
                if ppid != 0 && ppid != parent {
                    *libc::__errno_location() = libc::ESRCH;
                    fail(self.report);
                }
            }
            if let Some(fd) = self.cgroup_procs {
                // "0": the writing process itself joins the group.
                if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    fail(self.report);
                }
            }
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                fail(self.report);
            }
            // Every descriptor from 3 up closes at exec (the report pipe
            // too, which is how the parent learns the exec worked).
            if libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            ) != 0
            {
                fail(self.report);
            }
            for (resource, n) in [
                (libc::RLIMIT_CORE, 0),
                (libc::RLIMIT_NOFILE, self.max_files),
            ] {
                let lim = libc::rlimit {
                    rlim_cur: n,
                    rlim_max: n,
                };
                if libc::setrlimit(resource, &lim) != 0 {
                    fail(self.report);
                }
            }
            libc::execve(self.program, self.argv, self.envp);
            fail(self.report)
        }
    }
}

/// A started process, as much of `std::process::Child` as the daemon uses.
#[derive(Debug)]
pub struct Process {
    pid: libc::pid_t,
    /// Its status, once reaped (its pid may then be another process's).
    status: Option<ExitStatus>,
}

impl Process {
    /// A child `Command` started.
    pub fn adopt(child: std::process::Child) -> Self {
        Self {
            pid: child.id() as libc::pid_t,
            status: None,
        }
    }

    pub fn id(&self) -> u32 {
        self.pid as u32
    }

    /// Its status if it has ended (reaping it), else None.
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        self.reap(libc::WNOHANG)
    }

    /// Waits for it to end.
    pub fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            match self.reap(0) {
                Ok(Some(s)) => return Ok(s),
                Ok(None) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// SIGKILL, unless it was reaped already.
    pub fn kill(&mut self) -> io::Result<()> {
        if self.status.is_some() {
            return Ok(());
        }
        // SAFETY: kill(2) on our unreaped child: the pid is still ours.
        if unsafe { libc::kill(self.pid, libc::SIGKILL) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn reap(&mut self, flags: libc::c_int) -> io::Result<Option<ExitStatus>> {
        if let Some(s) = self.status {
            return Ok(Some(s));
        }
        let mut st = 0;
        // SAFETY: waitpid(2) on our child, writing its status into `st`.
        match unsafe { libc::waitpid(self.pid, &mut st, flags) } {
            0 => Ok(None),
            p if p == self.pid => {
                let s = ExitStatus::from_raw(st);
                self.status = Some(s);
                Ok(Some(s))
            }
            _ => Err(io::Error::last_os_error()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(program: &str, args: &[&str], out: &std::path::Path) -> Job {
        let f = std::fs::File::create(out).unwrap();
        Job {
            program: program.into(),
            args: args.iter().map(OsString::from).collect(),
            stdin: None,
            stdout: f.try_clone().unwrap().into(),
            stderr: f.into(),
            cgroup_procs: None,
            namespaces: false,
            max_files: 64,
            dies_with_parent: false,
        }
    }

    fn scratch(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("domus-spawn-{name}-{}", std::process::id()))
    }

    #[test]
    fn runs_a_program_with_the_limits_and_reports_its_status() {
        let out = scratch("limits");
        let mut p = spawn(job(
            "/bin/sh",
            &[
                "-c",
                "echo nofile=$(ulimit -n) core=$(ulimit -c); grep NoNewPrivs /proc/self/status; ls /proc/self/fd; exit 7",
            ],
            &out,
        ))
        .unwrap();
        assert_eq!(p.wait().unwrap().code(), Some(7));
        assert_eq!(p.try_wait().unwrap().map(|s| s.code()), Some(Some(7)));
        p.kill().unwrap();
        let text = std::fs::read_to_string(&out).unwrap();
        let _ = std::fs::remove_file(&out);
        assert!(text.contains("nofile=64 core=0"), "{text}");
        assert!(text.contains("NoNewPrivs:\t1"), "{text}");
        // 0, 1, 2 and the one ls opened for /proc/self/fd: nothing of ours.
        let fds: Vec<&str> = text.lines().skip(2).collect();
        assert_eq!(fds, ["0", "1", "2", "3"], "{text}");
    }

    #[test]
    fn a_program_that_cannot_run_is_an_error_not_a_process() {
        let out = scratch("missing");
        let e = spawn(job("/nonexistent/domus", &[], &out)).unwrap_err();
        let _ = std::fs::remove_file(&out);
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
    }

    #[test]
    fn a_killed_process_reports_the_signal() {
        let out = scratch("kill");
        let mut p = spawn(job("/bin/sleep", &["30"], &out)).unwrap();
        assert!(p.try_wait().unwrap().is_none());
        p.kill().unwrap();
        assert_eq!(p.wait().unwrap().signal(), Some(libc::SIGKILL));
        let _ = std::fs::remove_file(&out);
    }
}
