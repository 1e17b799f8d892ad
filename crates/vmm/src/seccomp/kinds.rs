//! A second filter per kind of thread, stacked on the process's allow-list
//! (the union of the kinds' lists, [`super::allowed`]): the kernel runs
//! every filter a thread has and the strictest answer wins, so each kind
//! may make only its own calls. A thread inherits its creator's filters;
//! so a kind that starts threads (vCPUs start device threads when the
//! guest's driver activates a device; the API thread starts one per
//! connection) lists what those threads need as well, and each device
//! thread then adds its own kind's.
//!
//! Opening a file is answered with EACCES rather than a kill on every kind
//! but the API's (a third filter, [`filters`]): glibc opens files of its
//! own accord on any thread (malloc reads /sys/devices/system/cpu/online
//! when a new thread first needs an arena), and a failed open is harmless
//! there where a killed VMM is not.
//!
//! What each kind may not do, among what the process may:
//! - vCPU threads: accept API connections, open files, take locks, remove
//!   files, send or receive on sockets, pin threads;
//! - a device's queue thread (virtio-blk, -net, -rng, -balloon, the vsock
//!   interrupt relay: the code that reads what the guest put in a queue):
//!   all of that, and start threads, create eventfds, do disk I/O, or make
//!   any ioctl but KVM_SET_GSI_ROUTING (an MSI-X route a trigger programs):
//!   no KVM_RUN, no vhost, no tap;
//! - the block I/O pool: only disk I/O on the descriptors it holds (no
//!   ioctl, no epoll, no reads but positioned ones);
//! - API threads: run a vCPU (KVM_RUN), do disk I/O (positioned and
//!   vectored reads and writes, sync, discard), wait in epoll (a snapshot's
//!   files are written by vCPU 0, and the devices a snapshot stopped are
//!   started again there: a thread inherits its starter's filters);
//! - the console reader: anything but read stdin;
//! - the descriptor inbox: anything but accept and receive descriptors;
//! - the main thread, once the domain runs: anything but wait for its end,
//!   remove the API socket, put the terminal back and write the exit file.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompRule,
};
use vmm_sys_util::ioctl::{ioctl_expr, _IOC_NONE, _IOC_WRITE};

const KVMIO: u32 = 0xae;
/// `_IO(KVMIO, 0x80)`.
pub const KVM_RUN: u64 = ioctl_expr(_IOC_NONE, KVMIO, 0x80, 0);
/// `_IOW(KVMIO, 0x6a, struct kvm_irq_routing)` (8 bytes: nr and flags).
pub const KVM_SET_GSI_ROUTING: u64 = ioctl_expr(_IOC_WRITE, KVMIO, 0x6a, 8);

/// The kinds of thread a running VMM has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Vcpu,
    /// A device's queue thread: virtio-blk, virtio-net, virtio-rng,
    /// virtio-balloon, vsock-irq.
    Queue,
    /// The block devices' I/O pool (blk-io).
    BlockIo,
    Api,
    Console,
    Inbox,
    Main,
}

impl Kind {
    /// The kind of the device thread called `name` ([`domus_virtio::spawn_thread`]).
    pub fn of_device_thread(name: &str) -> Kind {
        if name.starts_with("blk-io") {
            Kind::BlockIo
        } else {
            Kind::Queue
        }
    }

    pub const ALL: [Kind; 7] = [
        Kind::Vcpu,
        Kind::Queue,
        Kind::BlockIo,
        Kind::Api,
        Kind::Console,
        Kind::Inbox,
        Kind::Main,
    ];
}

/// When a call is allowed.
#[derive(Clone, Copy, Debug)]
enum When {
    Always,
    /// Argument `index` (its low 32 bits) is one of the values.
    OneOf(u8, &'static [u64]),
    /// Argument `index` (its low 32 bits) is not the value.
    Not(u8, u64),
}

use When::{Always, Not, OneOf};

/// What every thread does: memory (glibc sizes its malloc arenas by the
/// CPUs the thread may run on: sched_getaffinity, or a file it opens),
/// futexes, time, its own signals, writing to descriptors it holds (stderr,
/// eventfds), metadata of descriptors, and ending (a panic's abort
/// included). Opening is answered with EACCES but on API threads.
const COMMON: &[libc::c_long] = &[
    libc::SYS_brk,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_close,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_fstat,
    libc::SYS_futex,
    libc::SYS_getpid,
    libc::SYS_getrandom,
    libc::SYS_gettid,
    libc::SYS_madvise,
    libc::SYS_mmap,
    libc::SYS_mprotect,
    libc::SYS_mremap,
    libc::SYS_munmap,
    libc::SYS_nanosleep,
    libc::SYS_newfstatat,
    libc::SYS_openat,
    libc::SYS_restart_syscall,
    libc::SYS_rseq,
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_sched_getaffinity,
    libc::SYS_sched_yield,
    libc::SYS_sigaltstack,
    libc::SYS_statx,
    libc::SYS_tgkill,
    libc::SYS_write,
    libc::SYS_writev,
];

/// Starting a thread that names itself (and, for a device thread, adds its
/// own filter: seccompiler sets no_new_privs first).
const START_THREADS: &[(libc::c_long, When)] = &[
    (libc::SYS_clone3, Always),
    (libc::SYS_set_robust_list, Always),
    (
        libc::SYS_prctl,
        OneOf(
            0,
            &[libc::PR_SET_NAME as u64, libc::PR_SET_NO_NEW_PRIVS as u64],
        ),
    ),
    (
        libc::SYS_seccomp,
        OneOf(0, &[libc::SECCOMP_SET_MODE_FILTER as u64]),
    ),
];

/// What a device's queue thread does: wait on its eventfds and the rate
/// limiter's timer, read from its tap or eventfds (writes are in COMMON).
const EVENTS: &[(libc::c_long, When)] = &[
    (libc::SYS_epoll_create1, Always),
    (libc::SYS_epoll_ctl, Always),
    (libc::SYS_epoll_pwait, Always),
    (libc::SYS_epoll_wait, Always),
    (libc::SYS_fcntl, Always),
    (libc::SYS_read, Always),
    (libc::SYS_readv, Always),
    (libc::SYS_timerfd_create, Always),
    (libc::SYS_timerfd_settime, Always),
];

/// Raising an interrupt may program its MSI-X route; no other ioctl.
const ROUTE: &[(libc::c_long, When)] = &[(libc::SYS_ioctl, OneOf(1, &[KVM_SET_GSI_ROUTING]))];

/// The block I/O pool's disk I/O: positioned and vectored reads and
/// writes, sync, discard and write-zeroes (fallocate), and growing a qcow2
/// image's file where imago zeroes clusters past its end (ftruncate).
const DISK_IO: &[(libc::c_long, When)] = &[
    (libc::SYS_ftruncate, Always),
    (libc::SYS_fallocate, Always),
    (libc::SYS_fdatasync, Always),
    (libc::SYS_fsync, Always),
    (libc::SYS_lseek, Always),
    (libc::SYS_pread64, Always),
    (libc::SYS_preadv, Always),
    (libc::SYS_pwrite64, Always),
    (libc::SYS_pwritev, Always),
];

/// A vCPU's own calls beyond a device thread's: every KVM, vhost and tap
/// ioctl (running the guest, and activating devices: ioeventfds, vhost
/// rings, offloads), eventfds for activated queues, and the console file's
/// rotation (ftruncate).
const VCPU: &[(libc::c_long, When)] = &[
    (libc::SYS_eventfd2, Always),
    (libc::SYS_ftruncate, Always),
    (libc::SYS_ioctl, Always),
];

/// The API's threads: accepting and serving connections, pausing vCPUs
/// (tgkill, in COMMON) and pinning them, hot-plug (opening and locking a
/// disk, a tap, their eventfds and KVM registrations), and a snapshot's
/// files: created and renamed into place here (vCPU 0 writes them), or
/// removed when the save failed.
const API: &[(libc::c_long, When)] = &[
    (libc::SYS_accept4, Always),
    (libc::SYS_eventfd2, Always),
    (libc::SYS_fcntl, Always),
    (libc::SYS_flock, Always),
    // imago reads a hot-plugged qcow2 file's block size.
    (libc::SYS_fstatfs, Always),
    (libc::SYS_ioctl, Not(1, KVM_RUN)),
    (libc::SYS_lseek, Always),
    (libc::SYS_poll, Always),
    (libc::SYS_ppoll, Always),
    (libc::SYS_read, Always),
    (libc::SYS_readv, Always),
    (libc::SYS_recvfrom, Always),
    (libc::SYS_rename, Always),
    (libc::SYS_renameat, Always),
    (libc::SYS_renameat2, Always),
    (libc::SYS_sched_setaffinity, Always),
    (libc::SYS_sendmsg, Always),
    (libc::SYS_sendto, Always),
    (libc::SYS_setsockopt, Always),
    (libc::SYS_unlink, Always),
    (libc::SYS_unlinkat, Always),
];

const CONSOLE: &[(libc::c_long, When)] = &[(libc::SYS_read, Always)];

const INBOX: &[(libc::c_long, When)] = &[
    (libc::SYS_accept4, Always),
    (libc::SYS_recvmsg, Always),
    (libc::SYS_setsockopt, Always),
];

/// The main thread, once the domain runs: it waits, then tears down what
/// the vCPUs left (stopping vhost and device threads, releasing irqfds:
/// ioctls, but never KVM_RUN), puts the terminal back, removes the API
/// socket and writes the exit file.
const MAIN: &[(libc::c_long, When)] = &[
    (libc::SYS_fdatasync, Always),
    (libc::SYS_fsync, Always),
    (libc::SYS_ftruncate, Always),
    (libc::SYS_ioctl, Not(1, KVM_RUN)),
    (libc::SYS_lseek, Always),
    (libc::SYS_pwrite64, Always),
    (libc::SYS_unlink, Always),
];

/// The calls `kind` may make, each with when. A call listed twice is
/// allowed when either says so (the rules are alternatives).
fn calls(kind: Kind) -> Vec<(libc::c_long, When)> {
    let parts: &[&[(libc::c_long, When)]] = match kind {
        // What it starts (queue threads and the I/O pool) needs too.
        Kind::Vcpu => &[VCPU, EVENTS, ROUTE, DISK_IO, START_THREADS],
        Kind::Queue => &[EVENTS, ROUTE],
        Kind::BlockIo => &[DISK_IO],
        Kind::Api => &[API, START_THREADS],
        Kind::Console => &[CONSOLE],
        Kind::Inbox => &[INBOX],
        // Tearing down a qcow2 disk writes imago's cached metadata.
        Kind::Main => &[MAIN, DISK_IO],
    };
    COMMON
        .iter()
        .map(|&n| (n, Always))
        .chain(parts.iter().flat_map(|p| p.iter().copied()))
        .collect()
}

/// The system calls `kind` may make at all (whatever the arguments).
pub fn allowed(kind: Kind) -> Vec<libc::c_long> {
    let mut v: Vec<_> = calls(kind).into_iter().map(|(n, _)| n).collect();
    v.sort_unstable();
    v.dedup();
    v
}

fn cond(index: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompRule, seccompiler::BackendError> {
    SeccompRule::new(vec![SeccompCondition::new(
        index,
        SeccompCmpArgLen::Dword,
        op,
        value,
    )?])
}

/// Whether `kind` may open files (hot-plug of a VMM that is not jailed).
fn opens(kind: Kind) -> bool {
    kind == Kind::Api
}

/// The filters a thread of `kind` adds, in the order they go on: but for
/// the API's, one that answers every open with EACCES, then its list (a
/// call off it kills the process, so it goes last: most kinds may not
/// install a filter).
pub fn filters(kind: Kind) -> Result<Vec<BpfProgram>, super::SeccompError> {
    let mut progs = Vec::new();
    if !opens(kind) {
        progs.push(super::compile(
            [(libc::SYS_openat, Vec::new())].into_iter().collect(),
            SeccompAction::Allow,
            SeccompAction::Errno(libc::EACCES as u32),
        )?);
    }
    progs.push(filter(kind)?);
    Ok(progs)
}

/// `kind`'s list, compiled: a call off it kills the process.
fn filter(kind: Kind) -> Result<BpfProgram, super::SeccompError> {
    // Per call: None once any entry allows it whatever the arguments.
    let mut rules: BTreeMap<i64, Option<Vec<SeccompRule>>> = BTreeMap::new();
    for (n, when) in calls(kind) {
        let more = match when {
            Always => None,
            OneOf(i, values) => Some(
                values
                    .iter()
                    .map(|&v| cond(i, SeccompCmpOp::Eq, v))
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            Not(i, v) => Some(vec![cond(i, SeccompCmpOp::Ne, v)?]),
        };
        let entry = rules.entry(n).or_insert_with(|| Some(Vec::new()));
        match more {
            None => *entry = None,
            Some(more) => {
                if let Some(list) = entry {
                    list.extend(more);
                }
            }
        }
    }
    let rules = rules
        .into_iter()
        .map(|(n, r)| (n, r.unwrap_or_default()))
        .collect();
    super::compile(rules, SeccompAction::KillProcess, SeccompAction::Allow)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{exec, getpid, in_filtered_child};
    use super::*;

    // Each probe makes one call with arguments that fail harmlessly
    // (a bad descriptor, a null buffer) where it is allowed.

    /// Opens "/" (which any user may): exits 7 if that fails, 8 if it
    /// fails other than with EACCES.
    fn open_root() {
        // SAFETY: openat(2) on a NUL-terminated constant path; _exit(2)
        // ends the forked child.
        unsafe {
            if libc::openat(libc::AT_FDCWD, c"/".as_ptr(), libc::O_RDONLY) < 0 {
                let eacces = *libc::__errno_location() == libc::EACCES;
                libc::_exit(if eacces { 7 } else { 8 });
            }
        }
    }
    /// As open_root, but exits 0 on EACCES and 9 if the open worked.
    fn open_refused() {
        // SAFETY: as open_root.
        unsafe {
            if libc::openat(libc::AT_FDCWD, c"/".as_ptr(), libc::O_RDONLY) >= 0 {
                libc::_exit(9);
            }
            if *libc::__errno_location() != libc::EACCES {
                libc::_exit(8);
            }
        }
    }
    fn kvm_run() {
        // SAFETY: an ioctl on descriptor -1 fails with EBADF.
        unsafe { libc::ioctl(-1, KVM_RUN as _, 0) };
    }
    fn gsi_routing() {
        // SAFETY: as kvm_run.
        unsafe { libc::ioctl(-1, KVM_SET_GSI_ROUTING as _, 0) };
    }
    fn tap_ioctl() {
        // TUNSETIFF, which a device thread has no business making.
        // SAFETY: as kvm_run.
        unsafe { libc::ioctl(-1, 0x4004_54ca as _, 0) };
    }
    fn accept() {
        // SAFETY: accept4(2) on descriptor -1 fails with EBADF.
        unsafe { libc::accept4(-1, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
    }
    fn receive_descriptors() {
        // SAFETY: recvmsg(2) on descriptor -1 fails with EBADF.
        unsafe { libc::recvmsg(-1, std::ptr::null_mut(), 0) };
    }
    fn pin() {
        // SAFETY: a zero-sized, null CPU set is refused (EINVAL/EFAULT).
        unsafe { libc::sched_setaffinity(0, 0, std::ptr::null()) };
    }
    fn disk_write() {
        // SAFETY: pwrite64(2) on descriptor -1 fails with EBADF.
        unsafe { libc::pwrite64(-1, std::ptr::null(), 0, 0) };
    }
    fn epoll() {
        // SAFETY: epoll_create1(2) with no flags; the descriptor is left
        // to the child's exit.
        unsafe { libc::epoll_create1(0) };
    }
    fn start_thread() {
        // SAFETY: clone3(2) with no arguments fails with EINVAL before it
        // creates anything.
        unsafe { libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0) };
    }
    fn remove_file() {
        // SAFETY: unlink(2) on a NUL-terminated constant path that does
        // not exist.
        unsafe { libc::unlink(c"/nonexistent/domus-seccomp-probe".as_ptr()) };
    }
    fn read() {
        // SAFETY: read(2) on descriptor -1 fails with EBADF.
        unsafe { libc::read(-1, std::ptr::null_mut(), 0) };
    }

    /// A probe's name, the call it makes, and the kinds allowed to.
    type Probe = (&'static str, fn(), &'static [Kind]);

    #[test]
    fn each_kind_makes_only_its_own_calls() {
        use Kind::*;
        let base = super::super::filter().unwrap();
        let probes: [Probe; 15] = [
            ("getpid", getpid, &Kind::ALL),
            ("execve", exec, &[]),
            // Refused with EACCES, never killed, but on the API's threads.
            ("openat works", open_root, &[Api]),
            (
                "openat refused",
                open_refused,
                &[Vcpu, Queue, BlockIo, Console, Inbox, Main],
            ),
            ("ioctl KVM_RUN", kvm_run, &[Vcpu]),
            (
                "ioctl KVM_SET_GSI_ROUTING",
                gsi_routing,
                &[Vcpu, Queue, Api, Main],
            ),
            ("ioctl TUNSETIFF", tap_ioctl, &[Vcpu, Api, Main]),
            ("accept4", accept, &[Api, Inbox]),
            ("recvmsg", receive_descriptors, &[Inbox]),
            ("sched_setaffinity", pin, &[Api]),
            ("pwrite64", disk_write, &[Vcpu, BlockIo, Main]),
            ("epoll_create1", epoll, &[Vcpu, Queue]),
            ("clone3", start_thread, &[Vcpu, Api]),
            ("unlink", remove_file, &[Api, Main]),
            ("read", read, &[Vcpu, Queue, Api, Console]),
        ];
        for kind in Kind::ALL {
            let progs = filters(kind).unwrap();
            let all: Vec<&BpfProgram> = std::iter::once(&base).chain(&progs).collect();
            for (what, probe, allowed) in &probes {
                if what.starts_with("openat") {
                    // Never killed: it works or says EACCES (the probe
                    // exits non-zero where it did the other).
                    if allowed.contains(&kind) {
                        assert_eq!(in_filtered_child(&all, *probe), None, "{what} {kind:?}");
                    }
                    continue;
                }
                let want = (!allowed.contains(&kind)).then_some(libc::SIGSYS);
                assert_eq!(
                    in_filtered_child(&all, *probe),
                    want,
                    "{what} on a {kind:?} thread"
                );
            }
        }
    }
}
