//! What wakes the monitor: a VMM's exit (its pidfd turns readable), a
//! nudge from the daemon itself (a VMM started, a cgroup left to remove),
//! or the time a restart falls due. No polling while nothing happens.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// An eventfd the daemon writes to wake the monitor.
pub(crate) struct Waker(OwnedFd);

impl Waker {
    pub(crate) fn new() -> std::io::Result<Self> {
        // SAFETY: eventfd(2) with valid flags; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just made and is owned by nothing else.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Wakes the monitor (or makes its next wait return at once).
    pub(crate) fn wake(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to our eventfd. A full
        // counter (EAGAIN) means it is awake already.
        unsafe { libc::write(self.0.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }

    fn drain(&self) {
        let mut buf = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live buffer; EAGAIN (nothing
        // to drain) is fine.
        unsafe { libc::read(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    }
}

/// A pidfd for process `pid`, if the kernel has them (Linux 5.3 on).
pub(crate) fn pidfd(pid: i64) -> Option<OwnedFd> {
    let pid = libc::pid_t::try_from(pid).ok()?;
    // SAFETY: pidfd_open(2) takes a pid and flags; the result is checked.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = i32::try_from(fd).ok().filter(|fd| *fd >= 0)?;
    // SAFETY: `fd` was just made and is owned by nothing else.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Waits until one of the processes behind `pidfds` has ended, `waker` is
/// woken, or `timeout` has passed (None: no limit), then drains the waker.
pub(crate) fn wait(waker: &Waker, pidfds: &[OwnedFd], timeout: Option<Duration>) {
    let mut fds: Vec<libc::pollfd> = std::iter::once(&waker.0)
        .chain(pidfds)
        .map(|fd| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = timeout.map_or(-1, |t| {
        i32::try_from(t.as_millis().max(1)).unwrap_or(i32::MAX)
    });
    // SAFETY: poll(2) on a live array of `fds.len()` pollfds whose
    // descriptors stay open for the call (owned by the caller).
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    waker.drain();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_wait_ends_at_an_exit_a_wake_or_its_timeout() {
        let w = Waker::new().unwrap();
        let t = Instant::now();
        wait(&w, &[], Some(Duration::from_millis(50)));
        assert!(t.elapsed() >= Duration::from_millis(50));
        w.wake();
        let t = Instant::now();
        wait(&w, &[], Some(Duration::from_secs(10)));
        assert!(t.elapsed() < Duration::from_secs(5), "woken");
        // Drained: the next wait waits again.
        let t = Instant::now();
        wait(&w, &[], Some(Duration::from_millis(50)));
        assert!(t.elapsed() >= Duration::from_millis(50));
        let mut child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .unwrap();
        if let Some(fd) = pidfd(child.id().into()) {
            let t = Instant::now();
            wait(&w, &[fd], Some(Duration::from_secs(10)));
            assert!(t.elapsed() < Duration::from_secs(5), "the exit woke it");
        } // else a kernel without pidfds: the daemon polls instead
        let _ = child.wait();
    }
}
