//! virtio-vsock (type 19) on the host kernel's vhost-vsock.
//!
//! The data path is the kernel's: `/dev/vhost-vsock` gets the guest's
//! memory map and the rx and tx rings, reads the guest's kicks straight
//! from the queues' ioeventfds, and signals the queues' MSI-X irqfds itself
//! (a small relay thread stands in for a vector that is masked at
//! activation). Host programs talk to the guest with
//! ordinary `AF_VSOCK` sockets: connect to (guest CID, port), or listen on a
//! port and let the guest connect to CID 2. The event queue (transport
//! resets, which only live migration needs) is left to the guest.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use virtio_queue::{Queue, QueueT};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;

use crate::epoll::Poller;
use crate::{ActivateError, Activation, DeviceThread, Interrupt, VirtioDevice};

const VHOST_GET_FEATURES: libc::c_ulong = 0x8008_af00;
const VHOST_SET_FEATURES: libc::c_ulong = 0x4008_af00;
const VHOST_SET_OWNER: libc::c_ulong = 0x0000_af01;
const VHOST_SET_MEM_TABLE: libc::c_ulong = 0x4008_af03;
const VHOST_SET_VRING_NUM: libc::c_ulong = 0x4008_af10;
const VHOST_SET_VRING_ADDR: libc::c_ulong = 0x4028_af11;
const VHOST_SET_VRING_BASE: libc::c_ulong = 0x4008_af12;
const VHOST_SET_VRING_KICK: libc::c_ulong = 0x4008_af20;
const VHOST_SET_VRING_CALL: libc::c_ulong = 0x4008_af21;
const VHOST_VSOCK_SET_GUEST_CID: libc::c_ulong = 0x4008_af60;
const VHOST_VSOCK_SET_RUNNING: libc::c_ulong = 0x4004_af61;

const QUEUE_SIZE: u16 = 256;
/// rx and tx go to vhost; the event queue stays with us.
const VHOST_QUEUES: usize = 2;

#[derive(Debug, thiserror::Error)]
pub enum VsockError {
    #[error("vsock cid {0}: must be 3 or more (0-2 are reserved) and below 2^32 - 1")]
    BadCid(u64),
    #[error("vsock cid {cid}: {what}: {source}")]
    Vhost {
        cid: u64,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("vsock cid {0} is in use by another domain")]
    CidInUse(u64),
}

#[repr(C)]
struct VringState {
    index: u32,
    num: u32,
}

#[repr(C)]
struct VringFile {
    index: u32,
    fd: i32,
}

#[repr(C)]
struct VringAddr {
    index: u32,
    flags: u32,
    desc: u64,
    used: u64,
    avail: u64,
    log: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct MemRegion {
    guest_phys_addr: u64,
    memory_size: u64,
    userspace_addr: u64,
    padding: u64,
}

/// Per-device counters (the data moves in the kernel; we count the
/// interrupts that went through the relay thread, not vhost's own).
#[derive(Debug, Default)]
pub struct Counters {
    pub interrupts: AtomicU64,
}

impl crate::Stats for Counters {
    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![("interrupts", self.interrupts.load(Ordering::Relaxed))]
    }
}

/// An open vhost-vsock device with its CID claimed.
struct Vhost {
    file: File,
}

fn ioctl_err(cid: u64, what: &'static str) -> VsockError {
    let source = std::io::Error::last_os_error();
    if what == "VHOST_VSOCK_SET_GUEST_CID" && source.raw_os_error() == Some(libc::EADDRINUSE) {
        return VsockError::CidInUse(cid);
    }
    VsockError::Vhost { cid, what, source }
}

impl Vhost {
    fn open(cid: u64) -> Result<Self, VsockError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open("/dev/vhost-vsock")
            .map_err(|source| VsockError::Vhost {
                cid,
                what: "opening /dev/vhost-vsock (is the vhost_vsock module loaded?)",
                source,
            })?;
        let v = Self { file };
        // SAFETY: VHOST_SET_OWNER takes no argument.
        if unsafe { libc::ioctl(v.fd(), VHOST_SET_OWNER as _) } < 0 {
            return Err(ioctl_err(cid, "VHOST_SET_OWNER"));
        }
        // SAFETY: reads one u64 from the pointer.
        if unsafe { libc::ioctl(v.fd(), VHOST_VSOCK_SET_GUEST_CID as _, &cid) } < 0 {
            return Err(ioctl_err(cid, "VHOST_VSOCK_SET_GUEST_CID"));
        }
        Ok(v)
    }

    fn fd(&self) -> i32 {
        self.file.as_raw_fd()
    }

    fn features(&self, cid: u64) -> Result<u64, VsockError> {
        let mut f = 0u64;
        // SAFETY: writes one u64 through the pointer.
        if unsafe { libc::ioctl(self.fd(), VHOST_GET_FEATURES as _, &mut f) } < 0 {
            return Err(ioctl_err(cid, "VHOST_GET_FEATURES"));
        }
        Ok(f)
    }
}

pub struct Vsock {
    cid: u64,
    vhost: Option<Vhost>,
    vhost_features: u64,
    counters: Arc<Counters>,
    running: Option<DeviceThread>,
}

impl Vsock {
    /// Claims `cid` on the host's vhost-vsock.
    pub fn new(cid: u64) -> Result<Self, VsockError> {
        if !(3..u64::from(u32::MAX)).contains(&cid) {
            return Err(VsockError::BadCid(cid));
        }
        let vhost = Vhost::open(cid)?;
        let vhost_features = vhost.features(cid)?;
        Ok(Self {
            cid,
            vhost: Some(vhost),
            vhost_features,
            counters: Arc::default(),
            running: None,
        })
    }

    pub fn cid(&self) -> u64 {
        self.cid
    }

    pub fn counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }

    /// Hands the memory map and rings to vhost and starts it.
    fn start(&self, v: &Vhost, a: &Activation, calls: &[EventFd]) -> Result<(), String> {
        let fail = |what: &str| format!("{what}: {}", std::io::Error::last_os_error());
        let features = a.features & self.vhost_features;
        // SAFETY: reads one u64.
        if unsafe { libc::ioctl(v.fd(), VHOST_SET_FEATURES as _, &features) } < 0 {
            return Err(fail("VHOST_SET_FEATURES"));
        }
        let regions: Vec<MemRegion> = a
            .mem
            .iter()
            .map(|r| MemRegion {
                guest_phys_addr: r.start_addr().0,
                memory_size: r.len(),
                userspace_addr: r.as_ptr() as u64,
                padding: 0,
            })
            .collect();
        // struct vhost_memory: u32 nregions, u32 padding, then the regions.
        let mut table = vec![0u64; 1 + regions.len() * 4];
        table[0] = regions.len() as u64;
        for (i, r) in regions.iter().enumerate() {
            table[1 + i * 4..5 + i * 4].copy_from_slice(&[
                r.guest_phys_addr,
                r.memory_size,
                r.userspace_addr,
                r.padding,
            ]);
        }
        // SAFETY: `table` is a vhost_memory header followed by nregions
        // regions, as the kernel reads it; it outlives the call.
        if unsafe { libc::ioctl(v.fd(), VHOST_SET_MEM_TABLE as _, table.as_ptr()) } < 0 {
            return Err(fail("VHOST_SET_MEM_TABLE"));
        }
        for q in a.queues.iter().filter(|q| q.index < VHOST_QUEUES) {
            let queue: &Queue = &q.queue;
            let index = q.index as u32;
            let host = |addr: u64, len: u64| -> Result<u64, String> {
                let s = a
                    .mem
                    .get_slice(GuestAddress(addr), len as usize)
                    .map_err(|_| format!("queue {index} ring outside guest memory"))?;
                Ok(s.ptr_guard().as_ptr() as u64)
            };
            let n = u64::from(queue.size());
            let addr = VringAddr {
                index,
                flags: 0,
                desc: host(queue.desc_table(), 16 * n)?,
                used: host(queue.used_ring(), 6 + 8 * n)?,
                avail: host(queue.avail_ring(), 6 + 2 * n)?,
                log: 0,
            };
            let num = VringState {
                index,
                num: u32::from(queue.size()),
            };
            let base = VringState {
                index,
                num: u32::from(queue.next_avail()),
            };
            let kick = VringFile {
                index,
                fd: q.event.as_raw_fd(),
            };
            let call = VringFile {
                index,
                fd: calls[q.index].as_raw_fd(),
            };
            // SAFETY: each ioctl reads the struct it is given, laid out as
            // the kernel's; the host addresses lie in guest RAM mappings
            // that live as long as the VM, and the fds are open.
            unsafe {
                if libc::ioctl(v.fd(), VHOST_SET_VRING_NUM as _, &num) < 0 {
                    return Err(fail("VHOST_SET_VRING_NUM"));
                }
                if libc::ioctl(v.fd(), VHOST_SET_VRING_BASE as _, &base) < 0 {
                    return Err(fail("VHOST_SET_VRING_BASE"));
                }
                if libc::ioctl(v.fd(), VHOST_SET_VRING_ADDR as _, &addr) < 0 {
                    return Err(fail("VHOST_SET_VRING_ADDR"));
                }
                if libc::ioctl(v.fd(), VHOST_SET_VRING_KICK as _, &kick) < 0 {
                    return Err(fail("VHOST_SET_VRING_KICK"));
                }
                if libc::ioctl(v.fd(), VHOST_SET_VRING_CALL as _, &call) < 0 {
                    return Err(fail("VHOST_SET_VRING_CALL"));
                }
            }
        }
        let running: libc::c_int = 1;
        // SAFETY: reads one int.
        if unsafe { libc::ioctl(v.fd(), VHOST_VSOCK_SET_RUNNING as _, &running) } < 0 {
            return Err(fail("VHOST_VSOCK_SET_RUNNING"));
        }
        Ok(())
    }
}

/// Turns vhost's call eventfds (for queues whose vector could not be
/// handed to vhost) into the queues' interrupts.
fn relay(calls: Vec<(usize, EventFd)>, kill: EventFd, irq: Interrupt, counters: Arc<Counters>) {
    let Ok(mut poller) = Poller::new() else {
        return;
    };
    let mut ok = poller.add(&kill, u64::MAX).is_ok();
    for (i, c) in &calls {
        ok &= poller.add(c, *i as u64).is_ok();
    }
    if !ok {
        return crate::warn("vsock", format_args!("epoll set-up failed"));
    }
    loop {
        let Ok(tokens) = poller.wait(-1) else { return };
        for t in tokens {
            if t == u64::MAX {
                return;
            }
            if let Some((q, c)) = calls.iter().find(|(q, _)| *q as u64 == t) {
                let _ = c.read();
                counters.interrupts.fetch_add(1, Ordering::Relaxed);
                irq.queue(*q);
            }
        }
    }
}

impl VirtioDevice for Vsock {
    fn device_type(&self) -> u32 {
        crate::TYPE_VSOCK
    }

    fn queue_max_sizes(&self) -> Vec<u16> {
        vec![QUEUE_SIZE; 3]
    }

    fn features(&self) -> u64 {
        crate::BASE_FEATURES & (self.vhost_features | crate::VIRTIO_F_VERSION_1)
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        crate::read_config_bytes(&self.cid.to_le_bytes(), offset, data);
    }

    fn activate(&mut self, a: Activation) -> Result<(), ActivateError> {
        for i in 0..VHOST_QUEUES {
            if !a.queues.iter().any(|q| q.index == i) {
                return Err(ActivateError::MissingQueue(i));
            }
        }
        let vhost = match self.vhost.take() {
            Some(v) => v,
            None => Vhost::open(self.cid).map_err(|e| std::io::Error::other(e.to_string()))?,
        };
        // vhost signals the queue's MSI-X irqfd itself where it can; else an
        // eventfd that the relay thread turns into the interrupt.
        let mut calls = Vec::new();
        let mut relayed = Vec::new();
        for i in 0..VHOST_QUEUES {
            match a.interrupt.queue_irqfd(i) {
                Some(fd) => calls.push(fd),
                None => {
                    let fd = EventFd::new(libc::EFD_NONBLOCK)?;
                    relayed.push((i, fd.try_clone()?));
                    calls.push(fd);
                }
            }
        }
        self.start(&vhost, &a, &calls)
            .map_err(std::io::Error::other)?;
        let (irq, counters) = (a.interrupt, self.counters.clone());
        self.running = Some(DeviceThread::spawn("vsock-irq", 128 << 10, move |kill| {
            relay(relayed, kill, irq, counters)
        })?);
        self.vhost = Some(vhost);
        Ok(())
    }

    fn reset(&mut self) {
        if let Some(v) = self.vhost.take() {
            let stopped: libc::c_int = 0;
            // SAFETY: reads one int.
            unsafe { libc::ioctl(v.fd(), VHOST_VSOCK_SET_RUNNING as _, &stopped) };
            // Closing the device releases the rings and the CID; the next
            // activation opens it again.
        }
        if let Some(t) = self.running.take() {
            t.stop();
        }
    }
}

impl Drop for Vsock {
    fn drop(&mut self) {
        self.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_cids_are_refused_before_opening_anything() {
        for cid in [0, 1, 2, u64::from(u32::MAX), u64::MAX] {
            assert!(
                matches!(Vsock::new(cid), Err(VsockError::BadCid(_))),
                "{cid}"
            );
        }
    }

    #[test]
    fn ioctl_structs_have_the_kernel_sizes() {
        assert_eq!(std::mem::size_of::<VringState>(), 8);
        assert_eq!(std::mem::size_of::<VringFile>(), 8);
        assert_eq!(std::mem::size_of::<VringAddr>(), 40);
        assert_eq!(std::mem::size_of::<MemRegion>(), 32);
    }
}
