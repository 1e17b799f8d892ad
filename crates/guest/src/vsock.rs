//! `AF_VSOCK` stream sockets (std has none): connect to (CID, port), or
//! listen on a port and accept connections.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

fn socket() -> std::io::Result<OwnedFd> {
    // SAFETY: socket(2) with constant arguments.
    let fd = unsafe { libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new socket nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn address(cid: u32, port: u32) -> libc::sockaddr_vm {
    // SAFETY: sockaddr_vm is plain data; all-zero is a valid value.
    let mut addr: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
    addr.svm_family = libc::AF_VSOCK as libc::sa_family_t;
    addr.svm_port = port;
    addr.svm_cid = cid;
    addr
}

const ADDR_LEN: libc::socklen_t = std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t;

/// `SO_VM_SOCKETS_CONNECT_TIMEOUT` of `<linux/vm_sockets.h>` (the libc
/// crate has none): its `_OLD` value, which takes a 64-bit `timeval` on
/// 64-bit Linux.
const SO_VM_SOCKETS_CONNECT_TIMEOUT: libc::c_int = 6;

fn timeval(t: Duration) -> libc::timeval {
    libc::timeval {
        tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_usec: libc::suseconds_t::from(t.subsec_micros() as i32),
    }
}

/// Sets the `timeval` socket option `opt` of `level` on `s` to `t`.
fn set_timeval(
    s: &impl AsRawFd,
    level: libc::c_int,
    opt: libc::c_int,
    t: Duration,
) -> std::io::Result<()> {
    let tv = timeval(t);
    // SAFETY: setsockopt(2) reads a timeval from the pointer, which points
    // at `tv` with its size.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            level,
            opt,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn set_connect_timeout(s: &OwnedFd, within: Duration) -> std::io::Result<()> {
    // Linux takes zero as no wait at all: connect(2) would time out at once.
    let within = within.max(Duration::from_millis(1));
    set_timeval(s, libc::AF_VSOCK, SO_VM_SOCKETS_CONNECT_TIMEOUT, within)
}

/// A stream connected to `port` of `cid` (2 is the host), waiting up to
/// `within` for the other side to answer. The kernel's own limit is 2 s,
/// which a guest that is busy, or starved by a loaded host, may take to
/// answer a connection request.
pub fn connect(cid: u32, port: u32, within: Duration) -> std::io::Result<File> {
    let s = socket()?;
    set_connect_timeout(&s, within)?;
    let addr = address(cid, port);
    // SAFETY: the pointer and length describe `addr`, which outlives the
    // call.
    let r = unsafe {
        libc::connect(
            s.as_raw_fd(),
            (&addr as *const libc::sockaddr_vm).cast(),
            ADDR_LEN,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(File::from(s))
}

/// A socket listening on a port, for any CID.
pub struct Listener(OwnedFd);

impl Listener {
    pub fn bind(port: u32) -> std::io::Result<Self> {
        let s = socket()?;
        let addr = address(libc::VMADDR_CID_ANY, port);
        // SAFETY: as for connect.
        let r = unsafe {
            libc::bind(
                s.as_raw_fd(),
                (&addr as *const libc::sockaddr_vm).cast(),
                ADDR_LEN,
            )
        };
        // SAFETY: listen(2) on our socket.
        if r < 0 || unsafe { libc::listen(s.as_raw_fd(), 8) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self(s))
    }

    /// The next connection.
    pub fn accept(&self) -> std::io::Result<File> {
        // SAFETY: accept4(2) on our listening socket; no address wanted.
        let c = unsafe {
            libc::accept4(
                self.0.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        if c < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `c` is a new connected socket nobody else owns.
        Ok(unsafe { File::from_raw_fd(c) })
    }
}

/// Makes reads and writes on `s` fail after `t` without progress.
pub fn set_timeout(s: &File, t: Duration) -> std::io::Result<()> {
    for opt in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
        set_timeval(s, libc::SOL_SOCKET, opt, t)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connect_timeout_is_what_the_kernel_keeps() {
        // Hosts without AF_VSOCK have nothing to check.
        let Ok(s) = socket() else { return };
        set_connect_timeout(&s, Duration::from_millis(30_250)).unwrap();
        let mut tv = timeval(Duration::ZERO);
        let mut len = std::mem::size_of::<libc::timeval>() as libc::socklen_t;
        // SAFETY: getsockopt(2) writes at most `len` bytes to `tv`.
        let r = unsafe {
            libc::getsockopt(
                s.as_raw_fd(),
                libc::AF_VSOCK,
                SO_VM_SOCKETS_CONNECT_TIMEOUT,
                (&mut tv as *mut libc::timeval).cast(),
                &mut len,
            )
        };
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
        // The kernel keeps it in jiffies: 30.25 s at any HZ of 100 or more.
        assert_eq!((tv.tv_sec, tv.tv_usec / 10_000), (30, 25));
    }
}
