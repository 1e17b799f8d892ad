//! `domus-guest osbench [SECONDS]`: operating-system microbenchmarks in the
//! manner of lmbench (which Debian no longer ships), for bench/paper's
//! Tables 3-5 of the Xen paper. Each is our own, named for what it does:
//!
//! * processes (Table 3): `null_call` (getppid), `null_read` / `null_write`
//!   (one byte from /dev/zero, to /dev/null), `stat`, `open_close` (of a
//!   file in the scratch directory), `sig_install` (sigaction),
//!   `sig_handle` (kill of oneself, handler run), `fork_exit`,
//!   `fork_exec` (this static helper, told to exit at once), `fork_sh`
//!   (`/bin/sh -c` running it);
//! * context switches (Table 4): `ctx_Np_KK`: N processes in a ring of
//!   pipes passing a token, each touching K KiB of its own memory per turn,
//!   less the cost of one process doing the same alone (lmbench's way);
//! * file and memory (Table 5): `file_create_0k` / `file_delete_0k` and
//!   `_10k`, `mmap` (map a 4 MiB file, touch each page, unmap),
//!   `prot_fault` (a write to a read-only page, its SIGSEGV handler making
//!   it writable), `page_fault` (the first write to each page of a fresh
//!   anonymous mapping, no huge pages: one zero-filled page per fault,
//!   its mapping and unmapping included),
//!   `select_100` (select on 100 pipe descriptors);
//! * bandwidth: `pipe_mbs`, `unix_mbs` (64 KiB writes through a pipe and an
//!   AF_UNIX stream socket pair to another process).
//!
//! Latencies are microseconds per operation (`_us`), each the best of 3
//! runs of about SECONDS/10 (default 2 s in all per benchmark group);
//! prints one `key=value` per line.

use std::ffi::CString;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Runs `op` in batches until `budget` has passed; microseconds per call.
fn per_op(budget: Duration, mut op: impl FnMut()) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        let mut n = 0u64;
        let mut batch = 1u64;
        while t.elapsed() < budget / 3 {
            for _ in 0..batch {
                op();
            }
            n += batch;
            batch = (batch * 2).min(1 << 16);
        }
        best = best.min(t.elapsed().as_secs_f64() * 1e6 / n as f64);
    }
    best
}

fn check(r: libc::c_int, what: &str) {
    if r < 0 {
        panic!("{what}: {}", std::io::Error::last_os_error());
    }
}

fn cstr(s: &str) -> CString {
    CString::new(s).expect("no NUL in paths")
}

fn open(path: &CString, flags: libc::c_int) -> RawFd {
    // SAFETY: `path` is a NUL-terminated string that outlives the call.
    let fd = unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC, 0o644) };
    check(fd, "open");
    fd
}

fn close(fd: RawFd) {
    // SAFETY: closing a descriptor this module opened and owns.
    unsafe { libc::close(fd) };
}

/// Forks; the child runs `child` and exits with status 0. The parent gets
/// the child's pid.
fn spawn(child: impl FnOnce()) -> libc::pid_t {
    // SAFETY: the helper is single-threaded here, so the child may run any
    // code; it leaves through _exit without running the parent's destructors.
    let pid = unsafe { libc::fork() };
    check(pid, "fork");
    if pid == 0 {
        child();
        // SAFETY: ends the child process.
        unsafe { libc::_exit(0) };
    }
    pid
}

fn wait(pid: libc::pid_t) {
    let mut status = 0;
    // SAFETY: waits for our own child; `status` is a live local.
    check(unsafe { libc::waitpid(pid, &mut status, 0) }, "waitpid");
}

fn pipe() -> (RawFd, RawFd) {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    check(
        unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) },
        "pipe",
    );
    (fds[0], fds[1])
}

fn read_full(fd: RawFd, buf: &mut [u8]) -> usize {
    // SAFETY: reads into a live buffer of the length given.
    let r = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    r.max(0) as usize
}

fn write_all(fd: RawFd, buf: &[u8]) {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: writes from a live buffer of the length given.
        let r = unsafe { libc::write(fd, buf[done..].as_ptr().cast(), buf.len() - done) };
        check(r as libc::c_int, "write");
        done += r as usize;
    }
}

static SIGNALS: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_usr1(_: libc::c_int) {
    SIGNALS.fetch_add(1, Ordering::Relaxed);
}

/// The page `prot_fault` makes writable again from its handler.
static PROT_PAGE: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_segv(_: libc::c_int) {
    let page = PROT_PAGE.load(Ordering::Relaxed) as *mut libc::c_void;
    // SAFETY: the page is the one prot_fault mapped and keeps mapped while
    // the handler is installed; mprotect is async-signal-safe.
    unsafe { libc::mprotect(page, 4096, libc::PROT_READ | libc::PROT_WRITE) };
}

fn handler(sig: libc::c_int, f: extern "C" fn(libc::c_int)) {
    // SAFETY: a zeroed sigaction is a valid empty one; its handler is a
    // function that only touches atomics or calls mprotect.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = f as usize;
        check(libc::sigaction(sig, &sa, std::ptr::null_mut()), "sigaction");
    }
}

fn processes(budget: Duration, scratch: &str, me: &str) {
    let null_call = per_op(budget, || {
        // SAFETY: getppid has no arguments and no effects.
        unsafe { libc::syscall(libc::SYS_getppid) };
    });
    println!("null_call_us={null_call:.3}");
    let zero = open(&cstr("/dev/zero"), libc::O_RDONLY);
    let null = open(&cstr("/dev/null"), libc::O_WRONLY);
    let mut b = [0u8; 1];
    println!(
        "null_read_us={:.3}",
        per_op(budget, || {
            read_full(zero, &mut b);
        })
    );
    println!(
        "null_write_us={:.3}",
        per_op(budget, || write_all(null, &b))
    );
    close(zero);
    close(null);
    let file = cstr(&format!("{scratch}/stat-me"));
    close(open(&file, libc::O_CREAT | libc::O_WRONLY));
    println!(
        "stat_us={:.3}",
        per_op(budget, || {
            // SAFETY: a zeroed stat buffer, filled by stat.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: `file` is NUL-terminated and `st` a live buffer.
            check(unsafe { libc::stat(file.as_ptr(), &mut st) }, "stat");
        })
    );
    println!(
        "open_close_us={:.3}",
        per_op(budget, || close(open(&file, libc::O_RDONLY)))
    );
    println!(
        "sig_install_us={:.3}",
        per_op(budget, || handler(libc::SIGUSR1, on_usr1))
    );
    handler(libc::SIGUSR1, on_usr1);
    println!(
        "sig_handle_us={:.3}",
        per_op(budget, || {
            // SAFETY: signals ourselves; the handler only counts.
            check(unsafe { libc::kill(libc::getpid(), libc::SIGUSR1) }, "kill");
        })
    );
    let fork_budget = budget.max(Duration::from_millis(300));
    println!(
        "fork_exit_us={:.1}",
        per_op(fork_budget, || wait(spawn(|| ())))
    );
    let exe = cstr(me);
    let nop = cstr("nop");
    println!(
        "fork_exec_us={:.1}",
        per_op(fork_budget, || {
            wait(spawn(|| {
                let argv = [exe.as_ptr(), nop.as_ptr(), std::ptr::null()];
                // SAFETY: argv is a NULL-terminated array of live C strings.
                unsafe { libc::execv(exe.as_ptr(), argv.as_ptr()) };
            }))
        })
    );
    let sh = cstr("/bin/sh");
    let dash_c = cstr("-c");
    let script = cstr(&format!("{me} nop"));
    println!(
        "fork_sh_us={:.1}",
        per_op(fork_budget, || {
            wait(spawn(|| {
                let argv = [
                    sh.as_ptr(),
                    dash_c.as_ptr(),
                    script.as_ptr(),
                    std::ptr::null(),
                ];
                // SAFETY: as above.
                unsafe { libc::execv(sh.as_ptr(), argv.as_ptr()) };
            }))
        })
    );
    // SAFETY: unlinks our own scratch file.
    unsafe { libc::unlink(file.as_ptr()) };
}

/// Touches `mem` (a process's working set between switches).
fn touch(mem: &mut [u8]) {
    for i in (0..mem.len()).step_by(64) {
        // SAFETY: a volatile access to a byte of a live buffer, so the
        // loop is not folded away.
        unsafe { std::ptr::write_volatile(&mut mem[i], mem[i].wrapping_add(1)) };
    }
}

/// Microseconds per switch among `n` processes each touching `kib` KiB.
fn ring(n: usize, kib: usize, rounds: usize) -> f64 {
    let pipes: Vec<(RawFd, RawFd)> = (0..n).map(|_| pipe()).collect();
    // Process i reads pipe i and writes pipe i+1; the parent is process 0.
    let mut kids = Vec::new();
    for i in 1..n {
        let (r, w) = (pipes[i].0, pipes[(i + 1) % n].1);
        let others: Vec<RawFd> = pipes
            .iter()
            .flat_map(|p| [p.0, p.1])
            .filter(|fd| *fd != r && *fd != w)
            .collect();
        // Allocated before the fork: the child of a threaded process (the
        // unit tests') must not call malloc.
        let mut mem = vec![0u8; kib << 10];
        kids.push(spawn(|| {
            // Only the parent may hold the ring's other ends: when it
            // closes them, each process in turn reads the end of its pipe.
            others.iter().for_each(|fd| close(*fd));
            let mut t = [0u8; 1];
            while read_full(r, &mut t) == 1 {
                touch(&mut mem);
                write_all(w, &t);
            }
        }));
    }
    let (r, w) = (pipes[0].0, pipes[1 % n].1);
    let mut mem = vec![0u8; kib << 10];
    let mut t = [0u8; 1];
    let start = Instant::now();
    for _ in 0..rounds {
        touch(&mut mem);
        write_all(w, &t);
        read_full(r, &mut t);
    }
    let us = start.elapsed().as_secs_f64() * 1e6 / (rounds * n) as f64;
    for (r, w) in pipes {
        close(r);
        close(w);
    }
    for k in kids {
        wait(k);
    }
    us
}

fn context_switches(budget: Duration) {
    // Calibrate the rounds on two processes, then time each case.
    let rounds = |n: usize| {
        let t = Instant::now();
        ring(2, 0, 200);
        let per = t.elapsed().as_secs_f64() / 400.0;
        ((budget.as_secs_f64() / 7.0 / per / n as f64) as usize).clamp(50, 100_000)
    };
    for (n, kib) in [
        (2, 0),
        (2, 16),
        (2, 64),
        (8, 16),
        (8, 64),
        (16, 16),
        (16, 64),
    ] {
        let rr = rounds(n);
        let alone = ring(1, kib, rr * n);
        let us = (1..=3).map(|_| ring(n, kib, rr)).fold(f64::MAX, f64::min);
        println!("ctx_{n}p_{kib}k_us={:.2}", (us - alone).max(0.0));
    }
}

fn files_and_memory(budget: Duration, scratch: &str) {
    for (kib, name) in [(0usize, "0k"), (10, "10k")] {
        let data = vec![7u8; kib << 10];
        let n = 1000;
        let names: Vec<CString> = (0..n).map(|i| cstr(&format!("{scratch}/f{i}"))).collect();
        let t = Instant::now();
        for p in &names {
            let fd = open(p, libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC);
            write_all(fd, &data);
            close(fd);
        }
        let create = t.elapsed().as_secs_f64() * 1e6 / n as f64;
        let t = Instant::now();
        for p in &names {
            // SAFETY: unlinks a file this benchmark made.
            check(unsafe { libc::unlink(p.as_ptr()) }, "unlink");
        }
        let delete = t.elapsed().as_secs_f64() * 1e6 / n as f64;
        println!("file_create_{name}_us={create:.1}\nfile_delete_{name}_us={delete:.1}");
    }

    // A 4 MiB file, cached, for the mapping benchmarks.
    const LEN: usize = 4 << 20;
    let path = cstr(&format!("{scratch}/map-me"));
    let fd = open(&path, libc::O_CREAT | libc::O_RDWR | libc::O_TRUNC);
    write_all(fd, &vec![1u8; LEN]);
    let map = |prot| {
        // SAFETY: maps the file we just wrote, LEN bytes, shared.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), LEN, prot, libc::MAP_SHARED, fd, 0) };
        assert!(
            p != libc::MAP_FAILED,
            "mmap: {}",
            std::io::Error::last_os_error()
        );
        p.cast::<u8>()
    };
    println!(
        "mmap_us={:.1}",
        per_op(budget, || {
            let p = map(libc::PROT_READ | libc::PROT_WRITE);
            for off in (0..LEN).step_by(4096) {
                // SAFETY: `off` < LEN, inside the mapping.
                unsafe { std::ptr::write_volatile(p.add(off), 1) };
            }
            // SAFETY: unmaps the mapping made above.
            unsafe { libc::munmap(p.cast(), LEN) };
        })
    );
    let pages = LEN / 4096;
    let page_fault = per_op(budget, || {
        // SAFETY: a fresh anonymous private mapping of LEN bytes.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert!(p != libc::MAP_FAILED, "mmap");
        // One fault per page: no transparent huge page for the range.
        // SAFETY: advice on the mapping made above.
        unsafe { libc::madvise(p, LEN, libc::MADV_NOHUGEPAGE) };
        let p = p.cast::<u8>();
        for off in (0..LEN).step_by(4096) {
            // SAFETY: inside the mapping.
            unsafe { std::ptr::write_volatile(p.add(off), 1) };
        }
        // SAFETY: unmaps the mapping made above.
        unsafe { libc::munmap(p.cast(), LEN) };
    }) / pages as f64;
    println!("page_fault_us={page_fault:.3}");
    // SAFETY: closes and removes our own file.
    unsafe {
        libc::close(fd);
        libc::unlink(path.as_ptr());
    }

    // SAFETY: one anonymous private page.
    let page = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert!(page != libc::MAP_FAILED, "mmap");
    PROT_PAGE.store(page as u64, Ordering::Relaxed);
    handler(libc::SIGSEGV, on_segv);
    let prot = per_op(budget, || {
        // SAFETY: the page stays mapped; the write faults and the handler
        // makes the page writable, so the write then completes.
        unsafe {
            libc::mprotect(page, 4096, libc::PROT_READ);
            std::ptr::write_volatile(page.cast::<u8>(), 1);
        }
    });
    // SAFETY: restores the default action, then unmaps the page.
    unsafe {
        libc::signal(libc::SIGSEGV, libc::SIG_DFL);
        libc::munmap(page, 4096);
    }
    println!("prot_fault_us={prot:.3}");

    let fds: Vec<(RawFd, RawFd)> = (0..50).map(|_| pipe()).collect();
    println!(
        "select_100_us={:.3}",
        per_op(budget, || {
            // SAFETY: a zeroed fd_set is empty; every descriptor is below
            // FD_SETSIZE (the helper has few open) and open.
            unsafe {
                let mut set: libc::fd_set = std::mem::zeroed();
                for (r, w) in &fds {
                    libc::FD_SET(*r, &mut set);
                    libc::FD_SET(*w, &mut set);
                }
                let mut tv = libc::timeval {
                    tv_sec: 0,
                    tv_usec: 0,
                };
                libc::select(
                    1 + fds.iter().map(|p| p.1.max(p.0)).max().unwrap_or(0),
                    &mut set,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    &mut tv,
                );
            }
        })
    );
    for (r, w) in fds {
        close(r);
        close(w);
    }
}

/// MB/s of 64 KiB writes from a child to us over (`r`, `w`).
fn stream(r: RawFd, w: RawFd, total: usize) -> f64 {
    let buf = vec![3u8; 64 << 10];
    let kid = spawn(|| {
        close(r);
        for _ in 0..total / buf.len() {
            write_all(w, &buf);
        }
    });
    close(w);
    let mut buf = buf;
    let t = Instant::now();
    let mut got = 0;
    while got < total {
        let n = read_full(r, &mut buf);
        if n == 0 {
            break;
        }
        got += n;
    }
    let mbs = got as f64 / t.elapsed().as_secs_f64() / 1e6;
    close(r);
    wait(kid);
    mbs
}

fn bandwidth() {
    let total = 256 << 20;
    let (r, w) = pipe();
    println!("pipe_mbs={:.0}", stream(r, w, total));
    let mut sv = [0; 2];
    // SAFETY: `sv` has room for the two descriptors socketpair writes.
    check(
        unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
                0,
                sv.as_mut_ptr(),
            )
        },
        "socketpair",
    );
    println!("unix_mbs={:.0}", stream(sv[0], sv[1], total));
}

/// `osbench [SECONDS]`; `nop` exits at once (what fork_exec runs).
pub fn main(args: &[String]) {
    let seconds: f64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(2.0);
    let budget = Duration::from_secs_f64(seconds / 10.0);
    let me = std::env::current_exe()
        .ok()
        .and_then(|p| p.to_str().map(str::to_owned))
        .unwrap_or_else(|| "/proc/self/exe".into());
    let scratch = std::env::temp_dir().join(format!("osbench-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).expect("scratch directory");
    let s = scratch.to_str().expect("a UTF-8 temporary directory");
    processes(budget, s, &me);
    context_switches(budget);
    files_and_memory(budget, s);
    bandwidth();
    let _ = std::fs::remove_dir_all(&scratch);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_of_processes_passes_its_token_and_every_process_ends() {
        for n in [1, 2, 4] {
            let us = ring(n, 4, 50);
            assert!(us > 0.0 && us.is_finite(), "{n} processes: {us} µs");
        }
    }

    #[test]
    fn a_stream_to_a_child_carries_everything_it_wrote() {
        let (r, w) = pipe();
        assert!(stream(r, w, 4 << 20) > 0.0);
    }

    #[test]
    fn per_op_times_each_call_of_the_operation() {
        let mut calls = 0u64;
        let us = per_op(Duration::from_millis(30), || calls += 1);
        assert!(
            calls > 0 && us > 0.0 && us < 1000.0,
            "{calls} calls, {us} µs"
        );
    }
}
