//! The VMM's seccomp filter (built with seccompiler): an allow-list of the
//! system calls `domus run`'s threads make once the domain is set up; any
//! other kills the whole process (SECCOMP_RET_KILL_PROCESS), so a guest that
//! takes over a device thread cannot exec, ptrace, mount, open sockets to
//! the network or load modules through it.
//!
//! The filter is installed on every thread at once (TSYNC) before the first
//! vCPU runs the guest's first instruction; threads made later (API
//! connections, device threads started when the guest's driver activates a
//! device, hot-plug) inherit it. The list comes from `strace -f` traces of
//! the whole guest test suite, folded by `tools/syscalls.py` (tools/NOTES.md,
//! "seccomp"); the `domus run --seccomp` guest tests hold it to that.

use std::collections::BTreeMap;

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};

/// What installing the filter can fail on.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("building the seccomp filter: {0}")]
    Build(#[from] seccompiler::BackendError),
    #[error("installing the seccomp filter: {0}")]
    Install(#[from] seccompiler::Error),
}

/// The system calls a running VMM makes: KVM and its eventfds, guest memory
/// (balloon, free page reporting), disk I/O (positioned and vectored, sync,
/// discard through fallocate), taps and vhost (ioctls, read/write), the
/// API socket (accept, per-connection threads), hot-plug (opening and
/// locking a disk, opening a tap), pausing and pinning vCPUs (tgkill,
/// sched_setaffinity), device threads and their stacks, rate-limit timers,
/// signals, rotating the console file (copied and truncated through its
/// descriptors), receiving passed descriptors (recvmsg), removing the API
/// socket and writing the exit file at the end.
/// Not in it: what only setting up does (execve, socket, bind, listen,
/// chmod, prlimit64), and anything that reaches beyond the process (no
/// connect, no new sockets, no ptrace, mount or module loading).
const ALLOWED: &[libc::c_long] = &[
    libc::SYS_accept4,
    libc::SYS_brk,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_clone3,
    libc::SYS_close,
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_wait,
    libc::SYS_eventfd2,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_fallocate,
    libc::SYS_fcntl,
    libc::SYS_fdatasync,
    libc::SYS_flock,
    libc::SYS_fstat,
    libc::SYS_fsync,
    libc::SYS_ftruncate,
    libc::SYS_futex,
    libc::SYS_getpid,
    libc::SYS_getrandom,
    libc::SYS_gettid,
    libc::SYS_ioctl,
    libc::SYS_lseek,
    libc::SYS_madvise,
    libc::SYS_mmap,
    libc::SYS_mprotect,
    libc::SYS_mremap,
    libc::SYS_munmap,
    libc::SYS_nanosleep,
    libc::SYS_newfstatat,
    libc::SYS_openat,
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_prctl,
    libc::SYS_pread64,
    libc::SYS_preadv,
    libc::SYS_pwrite64,
    libc::SYS_pwritev,
    libc::SYS_read,
    libc::SYS_readv,
    libc::SYS_recvfrom,
    libc::SYS_recvmsg,
    libc::SYS_restart_syscall,
    libc::SYS_rseq,
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_sched_getaffinity,
    libc::SYS_sched_setaffinity,
    libc::SYS_sched_yield,
    libc::SYS_sendmsg,
    libc::SYS_sendto,
    libc::SYS_set_robust_list,
    libc::SYS_setsockopt,
    libc::SYS_sigaltstack,
    libc::SYS_statx,
    libc::SYS_tgkill,
    libc::SYS_timerfd_create,
    libc::SYS_timerfd_settime,
    libc::SYS_unlink,
    libc::SYS_write,
    libc::SYS_writev,
];

/// The filter, compiled.
pub fn filter() -> Result<BpfProgram, SeccompError> {
    let rules: BTreeMap<i64, Vec<seccompiler::SeccompRule>> =
        ALLOWED.iter().map(|&n| (n, Vec::new())).collect();
    let f = SeccompFilter::new(
        rules,
        SeccompAction::KillProcess,
        SeccompAction::Allow,
        TargetArch::x86_64,
    )?;
    Ok(f.try_into()?)
}

/// Installs `prog` on every thread of this process (no_new_privs first,
/// which an unprivileged filter needs).
pub fn install(prog: &BpfProgram) -> Result<(), SeccompError> {
    seccompiler::apply_filter_all_threads(prog)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` in a forked child with the filter installed; returns the
    /// signal that ended it (None: it exited).
    fn in_filtered_child(f: fn()) -> Option<i32> {
        let prog = filter().unwrap();
        // SAFETY: the child only makes system calls (prctl, seccomp, then
        // `f`'s) on memory that exists before the fork, and exits with
        // _exit; the parent waits for it.
        unsafe {
            let pid = libc::fork();
            assert!(pid >= 0);
            if pid == 0 {
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
                let p = libc::sock_fprog {
                    len: prog.len() as u16,
                    filter: prog.as_ptr() as *mut libc::sock_filter,
                };
                if libc::syscall(libc::SYS_seccomp, 1, 0, &p as *const libc::sock_fprog) != 0 {
                    libc::_exit(99);
                }
                f();
                libc::_exit(0);
            }
            let mut status = 0;
            assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
            if libc::WIFSIGNALED(status) {
                Some(libc::WTERMSIG(status))
            } else {
                assert_eq!(libc::WEXITSTATUS(status), 0, "the filter did not install");
                None
            }
        }
    }

    fn getpid() {
        // SAFETY: getpid(2) takes no arguments.
        unsafe { libc::syscall(libc::SYS_getpid) };
    }

    fn exec() {
        let path = c"/bin/true";
        let argv = [path.as_ptr(), std::ptr::null()];
        // SAFETY: execve(2) on a NUL-terminated path and a NULL-ended argv
        // that live on this stack; an empty environment.
        unsafe { libc::execve(path.as_ptr(), argv.as_ptr(), std::ptr::null()) };
    }

    fn inet_socket() {
        // SAFETY: socket(2) with constant arguments.
        unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
    }

    #[test]
    fn forbidden_calls_kill_the_process_and_allowed_ones_do_not() {
        assert_eq!(in_filtered_child(getpid), None);
        assert_eq!(in_filtered_child(exec), Some(libc::SIGSYS));
        assert_eq!(in_filtered_child(inet_socket), Some(libc::SIGSYS));
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
            assert!(!ALLOWED.contains(&n), "{n} is allowed");
        }
    }
}
