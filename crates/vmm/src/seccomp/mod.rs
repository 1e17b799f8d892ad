//! The VMM's seccomp filters (built with seccompiler), in two layers. The
//! first is an allow-list of the system calls `domus run`'s threads make
//! once the domain is set up (every kind's calls), installed on every thread at once (TSYNC)
//! before the first vCPU runs the guest's first instruction; any other call
//! kills the whole process (SECCOMP_RET_KILL_PROCESS), so a guest that takes
//! over a thread cannot exec, ptrace, mount, open sockets to the network or
//! load modules through it. The second is a narrower filter per kind of
//! thread ([`kinds`]), which each thread adds for itself as it starts: a
//! vCPU cannot accept API connections or open files, a device thread cannot
//! run a vCPU or start threads, the API cannot run a vCPU or do disk I/O.
//!
//! The lists come from `strace -f` traces of the whole guest test suite,
//! folded by `tools/syscalls.py` (tools/NOTES.md, "seccomp"); the guest
//! tests run every VMM under them (`domus run --seccomp`, and the daemon's
//! default), and check that each thread has both layers.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, SeccompRule, TargetArch};

pub mod kinds;

pub use kinds::Kind;

/// What installing the filter can fail on.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("building the seccomp filter: {0}")]
    Build(#[from] seccompiler::BackendError),
    #[error("installing the seccomp filter: {0}")]
    Install(#[from] seccompiler::Error),
}

/// The system calls a running VMM makes: every call some kind of thread
/// may make ([`kinds`]), whatever the arguments. Not in it: what only
/// setting up does (execve, socket, bind, listen, chmod, prlimit64), and
/// anything that reaches beyond the process (no connect, no new sockets, no
/// ptrace, mount or module loading).
pub fn allowed() -> Vec<libc::c_long> {
    let mut all: Vec<_> = Kind::ALL.iter().flat_map(|&k| kinds::allowed(k)).collect();
    all.sort_unstable();
    all.dedup();
    all
}

/// Compiles `rules` for x86_64: a call they match gets `matched`, any
/// other `otherwise`.
fn compile(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    otherwise: SeccompAction,
    matched: SeccompAction,
) -> Result<BpfProgram, SeccompError> {
    let f = SeccompFilter::new(rules, otherwise, matched, TargetArch::x86_64)?;
    Ok(f.try_into()?)
}

/// The process's filter, compiled.
pub fn filter() -> Result<BpfProgram, SeccompError> {
    let rules = allowed().into_iter().map(|n| (n, Vec::new())).collect();
    compile(rules, SeccompAction::KillProcess, SeccompAction::Allow)
}

/// The process's filter and each kind's, compiled ([`prepare`]).
struct Compiled {
    process: BpfProgram,
    kinds: BTreeMap<Kind, Vec<BpfProgram>>,
}

static COMPILED: OnceLock<Compiled> = OnceLock::new();
/// Set once [`install`] has run: [`enter`] adds filters from then on.
static INSTALLED: OnceLock<()> = OnceLock::new();

/// Compiles the filters now (once), so that [`install`] only installs
/// them: a migration's destination does it while it waits for the
/// stream.
pub fn prepare() -> Result<(), SeccompError> {
    if COMPILED.get().is_none() {
        let kinds = Kind::ALL
            .iter()
            .map(|&k| Ok((k, kinds::filters(k)?)))
            .collect::<Result<BTreeMap<_, _>, SeccompError>>()?;
        let _ = COMPILED.set(Compiled {
            process: filter()?,
            kinds,
        });
    }
    Ok(())
}

/// Installs the process's filter on every thread (no_new_privs first,
/// which an unprivileged filter needs), compiles each kind's, and has
/// every device thread started from now on add the device threads' filter
/// ([`domus_virtio::on_thread_start`]).
pub fn install() -> Result<(), SeccompError> {
    prepare()?;
    let Some(c) = COMPILED.get() else {
        return Ok(());
    };
    seccompiler::apply_filter_all_threads(&c.process)?;
    let _ = INSTALLED.set(());
    domus_virtio::on_thread_start(|name| {
        enter(Kind::of_device_thread(name)).map_err(std::io::Error::other)
    });
    Ok(())
}

/// Adds `kind`'s filter to the calling thread (and so to the threads it
/// starts later); nothing when the filters are off ([`install`] has not
/// run).
pub fn enter(kind: Kind) -> Result<(), SeccompError> {
    if INSTALLED.get().is_none() {
        return Ok(());
    }
    let progs = COMPILED.get().and_then(|c| c.kinds.get(&kind));
    for prog in progs.into_iter().flatten() {
        seccompiler::apply_filter(prog)?;
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Runs `f` in a forked child with the filters `progs` installed, in
    /// order; returns the signal that ended it (None: it exited, with 0:
    /// `f` may exit otherwise to say that a call did not do what it
    /// expected).
    pub(crate) fn in_filtered_child(progs: &[&BpfProgram], f: fn()) -> Option<i32> {
        // SAFETY: the child only makes system calls (prctl, seccomp, then
        // `f`'s) on memory that exists before the fork, and exits with
        // _exit; the parent waits for it.
        unsafe {
            let pid = libc::fork();
            assert!(pid >= 0);
            if pid == 0 {
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
                for prog in progs {
                    let p = libc::sock_fprog {
                        len: prog.len() as u16,
                        filter: prog.as_ptr() as *mut libc::sock_filter,
                    };
                    let r = libc::syscall(libc::SYS_seccomp, 1, 0, &p as *const libc::sock_fprog);
                    if r != 0 {
                        libc::_exit(99);
                    }
                }
                f();
                libc::_exit(0);
            }
            let mut status = 0;
            assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
            if libc::WIFSIGNALED(status) {
                Some(libc::WTERMSIG(status))
            } else {
                assert_eq!(
                    libc::WEXITSTATUS(status),
                    0,
                    "the filter did not install (99), or the probe failed"
                );
                None
            }
        }
    }

    pub(crate) fn getpid() {
        // SAFETY: getpid(2) takes no arguments.
        unsafe { libc::syscall(libc::SYS_getpid) };
    }

    pub(crate) fn exec() {
        let path = c"/bin/true";
        let argv = [path.as_ptr(), std::ptr::null()];
        // SAFETY: execve(2) on a NUL-terminated path and a NULL-ended argv
        // that live on this stack; an empty environment.
        unsafe { libc::execve(path.as_ptr(), argv.as_ptr(), std::ptr::null()) };
    }

    pub(crate) fn inet_socket() {
        // SAFETY: socket(2) with constant arguments.
        unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
    }

    #[test]
    fn forbidden_calls_kill_the_process_and_allowed_ones_do_not() {
        let base = filter().unwrap();
        assert_eq!(in_filtered_child(&[&base], getpid), None);
        assert_eq!(in_filtered_child(&[&base], exec), Some(libc::SIGSYS));
        assert_eq!(in_filtered_child(&[&base], inet_socket), Some(libc::SIGSYS));
    }

    #[test]
    fn the_list_has_no_dangerous_calls() {
        for n in [
            libc::SYS_execve,
            libc::SYS_execveat,
            libc::SYS_ptrace,
            libc::SYS_mount,
            libc::SYS_socket,
            libc::SYS_connect,
            libc::SYS_init_module,
            libc::SYS_finit_module,
            libc::SYS_bpf,
            libc::SYS_process_vm_writev,
            libc::SYS_kexec_load,
        ] {
            assert!(!allowed().contains(&n), "{n} is allowed");
        }
    }
}
