//! A small epoll loop for device threads: wait on a few file descriptors,
//! get back the tokens of the ready ones.

use std::os::fd::{AsRawFd, RawFd};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

pub struct Poller {
    epoll: Epoll,
    events: Vec<EpollEvent>,
}

impl Poller {
    pub fn new() -> std::io::Result<Self> {
        Ok(Self {
            epoll: Epoll::new()?,
            events: vec![EpollEvent::default(); 16],
        })
    }

    /// Watches `fd` for input; `token` comes back from [`Poller::wait`].
    pub fn add(&self, fd: &impl AsRawFd, token: u64) -> std::io::Result<()> {
        self.add_raw(fd.as_raw_fd(), token)
    }

    pub fn add_raw(&self, fd: RawFd, token: u64) -> std::io::Result<()> {
        self.epoll.ctl(
            ControlOperation::Add,
            fd,
            EpollEvent::new(EventSet::IN, token),
        )
    }

    /// Turns watching `fd` (added before) on or off.
    pub fn set_watching(&self, fd: &impl AsRawFd, token: u64, on: bool) -> std::io::Result<()> {
        let events = if on { EventSet::IN } else { EventSet::empty() };
        self.epoll.ctl(
            ControlOperation::Modify,
            fd.as_raw_fd(),
            EpollEvent::new(events, token),
        )
    }

    /// Blocks until something is ready (or `timeout_ms`, -1 for none);
    /// returns the ready tokens. Interrupted waits return no tokens.
    pub fn wait(&mut self, timeout_ms: i32) -> std::io::Result<Vec<u64>> {
        match self.epoll.wait(timeout_ms, &mut self.events) {
            Ok(n) => Ok(self.events[..n].iter().map(|e| e.data()).collect()),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }
}
