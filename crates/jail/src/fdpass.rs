//! Descriptors for a jailed VMM: it cannot open host files (they are not in
//! its root, and it is no longer root), so for a disk hot-plugged into it the
//! supervisor opens the file and passes the descriptor over a Unix socket the
//! VMM bound before it entered the jail (SCM_RIGHTS), with a tag; the API
//! request that plugs the disk names the tag ([`domus_api::spec::DiskSpec`]'s
//! `passed`), and the VMM takes the descriptor from its [`Inbox`].

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Descriptors received and not yet taken, oldest first; more than this
/// and the oldest is closed (a supervisor whose plug failed before the VMM
/// took its descriptor leaves it here).
const PENDING: usize = 8;

/// Passes `fd` with `tag` to the VMM listening on `socket`.
pub fn send(socket: &Path, tag: u64, fd: BorrowedFd<'_>) -> io::Result<()> {
    let s = UnixStream::connect(socket)?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    let data = tag.to_ne_bytes();
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let mut cmsg = Cmsg::default();
    let msg = header(&mut iov, &mut cmsg);
    // SAFETY: CMSG_FIRSTHDR of a msghdr whose control buffer holds one
    // header and one descriptor (Cmsg's size is CMSG_SPACE of an int).
    unsafe {
        let h = libc::CMSG_FIRSTHDR(&msg);
        (*h).cmsg_level = libc::SOL_SOCKET;
        (*h).cmsg_type = libc::SCM_RIGHTS;
        (*h).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(h).cast::<RawFd>(), fd.as_raw_fd());
    }
    // SAFETY: sendmsg(2) reads `msg` and what it points at.
    let n = unsafe { libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != data.len() {
        return Err(io::Error::other("the VMM took part of the message"));
    }
    Ok(())
}

/// A control buffer for one descriptor, aligned as cmsghdr needs.
#[repr(C, align(8))]
struct Cmsg {
    buf: [u8; 24],
}

impl Default for Cmsg {
    fn default() -> Self {
        // CMSG_SPACE(sizeof(int)) on x86_64 is 24.
        debug_assert_eq!(
            // SAFETY: CMSG_SPACE only computes a size.
            unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize,
            24
        );
        Self { buf: [0; 24] }
    }
}

/// A message header over one I/O vector and a one-descriptor control
/// buffer; the caller keeps both alive while it uses the header.
fn header(iov: &mut libc::iovec, cmsg: &mut Cmsg) -> libc::msghdr {
    // SAFETY: a zeroed msghdr is valid (no name, no vectors, no control).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cmsg.buf.as_mut_ptr().cast();
    msg.msg_controllen = cmsg.buf.len();
    msg
}

/// The VMM's side: descriptors received, by tag.
#[derive(Default)]
pub struct Inbox {
    pending: Mutex<VecDeque<(u64, OwnedFd)>>,
    arrived: Condvar,
}

impl Inbox {
    /// Receives descriptors on `listener` on a thread of its own, which
    /// runs `confine` first (the VMM adds the thread's seccomp filter
    /// there) and ends at once if it fails: no descriptor is then taken.
    pub fn serve(
        listener: UnixListener,
        confine: impl FnOnce() -> io::Result<()> + Send + 'static,
    ) -> io::Result<Arc<Self>> {
        let inbox = Arc::new(Self::default());
        let me = inbox.clone();
        std::thread::Builder::new()
            .name("fd-inbox".into())
            .spawn(move || {
                if let Err(e) = confine() {
                    return eprintln!("domus: the descriptor inbox did not start: {e}");
                }
                for s in listener.incoming() {
                    let Ok(s) = s else { continue };
                    if let Ok((tag, fd)) = receive(&s) {
                        me.put(tag, fd);
                    }
                }
            })?;
        Ok(inbox)
    }

    fn put(&self, tag: u64, fd: OwnedFd) {
        let mut p = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        if p.len() >= PENDING {
            p.pop_front();
        }
        p.push_back((tag, fd));
        self.arrived.notify_all();
    }

    /// The descriptor passed with `tag`, waiting for it `within` at most.
    pub fn take(&self, tag: u64, within: Duration) -> Option<OwnedFd> {
        let end = Instant::now() + within;
        let mut p = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(i) = p.iter().position(|(t, _)| *t == tag) {
                return p.remove(i).map(|(_, fd)| fd);
            }
            let left = end.checked_duration_since(Instant::now())?;
            p = self
                .arrived
                .wait_timeout(p, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

/// One tag and one descriptor from a connection; anything else is dropped
/// (descriptors that came with it are closed).
fn receive(s: &UnixStream) -> io::Result<(u64, OwnedFd)> {
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut data = [0u8; 8];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    let mut cmsg = Cmsg::default();
    let mut msg = header(&mut iov, &mut cmsg);
    // SAFETY: recvmsg(2) writes into `data` and `cmsg` through `msg`.
    let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fd = None;
    // SAFETY: walking the control messages recvmsg wrote, within
    // msg_controllen, as CMSG_FIRSTHDR/CMSG_NXTHDR do.
    unsafe {
        let mut h = libc::CMSG_FIRSTHDR(&msg);
        while !h.is_null() {
            if (*h).cmsg_level == libc::SOL_SOCKET && (*h).cmsg_type == libc::SCM_RIGHTS {
                let len = (*h).cmsg_len - libc::CMSG_LEN(0) as usize;
                let data = libc::CMSG_DATA(h).cast::<RawFd>();
                for i in 0..len / std::mem::size_of::<RawFd>() {
                    // Each one is ours now: owned, so closed if not kept.
                    let got = OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i)));
                    if fd.is_none() {
                        fd = Some(got);
                    }
                }
            }
            h = libc::CMSG_NXTHDR(&msg, h);
        }
    }
    let truncated = msg.msg_flags & libc::MSG_CTRUNC != 0;
    match fd {
        Some(fd) if n as usize == data.len() && !truncated => Ok((u64::from_ne_bytes(data), fd)),
        _ => Err(io::Error::other("not one tag and one descriptor")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn a_passed_descriptor_is_taken_by_its_tag() {
        let dir = std::env::temp_dir().join(format!("domus-fdpass-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("fd.sock");
        let inbox = Inbox::serve(UnixListener::bind(&sock).unwrap(), || Ok(())).unwrap();
        let file = dir.join("disk");
        std::fs::write(&file, b"disk contents").unwrap();
        for tag in [7u64, 9] {
            let f = std::fs::File::open(&file).unwrap();
            send(&sock, tag, std::os::fd::AsFd::as_fd(&f)).unwrap();
        }
        assert!(inbox.take(8, Duration::from_millis(50)).is_none());
        let fd = inbox.take(9, Duration::from_secs(5)).unwrap();
        let mut text = String::new();
        std::fs::File::from(fd).read_to_string(&mut text).unwrap();
        assert_eq!(text, "disk contents");
        assert!(inbox.take(7, Duration::from_secs(5)).is_some());
        assert!(
            inbox.take(7, Duration::from_millis(50)).is_none(),
            "taken once"
        );

        // A client that sends no descriptor, or garbage, passes nothing.
        UnixStream::connect(&sock)
            .unwrap()
            .write_all(b"12345678")
            .unwrap();
        UnixStream::connect(&sock).unwrap().write_all(b"x").unwrap();
        assert!(inbox
            .take(u64::from_ne_bytes(*b"12345678"), Duration::from_millis(200))
            .is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn old_descriptors_left_behind_are_closed() {
        let inbox = Inbox::default();
        for tag in 0..(PENDING as u64 + 3) {
            inbox.put(tag, std::fs::File::open("/dev/null").unwrap().into());
        }
        assert!(inbox.take(0, Duration::ZERO).is_none());
        assert!(inbox.take(PENDING as u64 + 2, Duration::ZERO).is_some());
        assert_eq!(inbox.pending.lock().unwrap().len(), PENDING - 1);
    }
}
