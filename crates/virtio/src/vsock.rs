//! virtio-vsock (type 19) on the host kernel's vhost-vsock.
//!
//! The data path is the kernel's: `/dev/vhost-vsock` gets the guest's
//! memory map and the rx and tx rings, reads the guest's kicks straight
//! from the queues' ioeventfds, and signals the queues' MSI-X irqfds itself
//! (a small relay thread stands in for a vector that is masked at
//! activation). Host programs talk to the guest with
//! ordinary `AF_VSOCK` sockets: connect to (guest CID, port), or listen on a
//! port and let the guest connect to CID 2. The event queue stays with
//! us: a device restored from a snapshot (a new vhost, whose host ends
//! know none of the guest's connections) sends the guest a transport
//! reset there when it starts, so the guest drops its old connections at
//! once and reads its CID again, instead of waiting on them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use vhost::vhost_kern::vsock::Vsock as KernelVsock;
use vhost::vsock::VhostVsock;
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use virtio_queue::{Queue, QueueT};
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;

use crate::epoll::Poller;
use crate::{ActivateError, Activation, DeviceThread, Interrupt, Memory, VirtioDevice};

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
        source: vhost::Error,
    },
    #[error("vsock cid {0} is in use by another domain")]
    CidInUse(u64),
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

/// An open vhost-vsock device (the rust-vmm `vhost` crate's) with its CID
/// claimed, over the guest's memory.
struct Vhost(KernelVsock<Arc<Memory>>);

fn vhost_err(cid: u64, what: &'static str) -> impl FnOnce(vhost::Error) -> VsockError {
    move |source| match &source {
        vhost::Error::IoctlError(e)
            if what == "VHOST_VSOCK_SET_GUEST_CID"
                && e.raw_os_error() == Some(libc::EADDRINUSE) =>
        {
            VsockError::CidInUse(cid)
        }
        vhost::Error::VhostOpen(_) => VsockError::Vhost {
            cid,
            what: "opening /dev/vhost-vsock (is the vhost_vsock module loaded?)",
            source,
        },
        _ => VsockError::Vhost { cid, what, source },
    }
}

impl Vhost {
    fn open(cid: u64, mem: Arc<Memory>) -> Result<Self, VsockError> {
        let v = KernelVsock::new(mem).map_err(vhost_err(cid, "opening"))?;
        v.set_owner().map_err(vhost_err(cid, "VHOST_SET_OWNER"))?;
        v.set_guest_cid(cid)
            .map_err(vhost_err(cid, "VHOST_VSOCK_SET_GUEST_CID"))?;
        Ok(Self(v))
    }
}

pub struct Vsock {
    cid: u64,
    mem: Arc<Memory>,
    vhost: Option<Vhost>,
    vhost_features: u64,
    counters: Arc<Counters>,
    running: Option<DeviceThread>,
    /// Restored from a snapshot: tell the guest at the next activation.
    reset_pending: bool,
}

/// The event queue's index, and its one event
/// (VIRTIO_VSOCK_EVENT_TRANSPORT_RESET, a little-endian u32 id of 0).
const EVENT_QUEUE: usize = 2;
const TRANSPORT_RESET: [u8; 4] = 0u32.to_le_bytes();

/// Puts a transport reset in the guest's event queue and interrupts it;
/// false if the guest left no buffer for it (or a bad one).
fn send_transport_reset(q: &mut Queue, mem: &Memory, irq: &Interrupt) -> bool {
    use vm_memory::Bytes;
    let Some(chain) = q.pop_descriptor_chain(mem) else {
        return false;
    };
    let head = chain.head_index();
    let written = chain
        .into_iter()
        .find(|d| d.is_write_only() && d.len() >= 4)
        .map(|d| mem.write_slice(&TRANSPORT_RESET, d.addr()).is_ok())
        .unwrap_or(false);
    let len = if written { 4 } else { 0 };
    let _ = q.add_used(mem, head, len);
    irq.queue(EVENT_QUEUE);
    written
}

impl Vsock {
    /// Claims `cid` on the host's vhost-vsock, for a guest with memory
    /// `mem`.
    pub fn new(cid: u64, mem: Arc<Memory>) -> Result<Self, VsockError> {
        if !(3..u64::from(u32::MAX)).contains(&cid) {
            return Err(VsockError::BadCid(cid));
        }
        let vhost = Vhost::open(cid, mem.clone())?;
        let vhost_features = vhost
            .0
            .get_features()
            .map_err(vhost_err(cid, "VHOST_GET_FEATURES"))?;
        Ok(Self {
            cid,
            mem,
            vhost: Some(vhost),
            vhost_features,
            counters: Arc::default(),
            running: None,
            reset_pending: false,
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
        let v = &v.0;
        let fail = |what: &'static str| move |e: vhost::Error| format!("{what}: {e}");
        v.set_features(a.features & self.vhost_features)
            .map_err(fail("VHOST_SET_FEATURES"))?;
        let regions: Vec<VhostUserMemoryRegionInfo> = a
            .mem
            .iter()
            .map(|r| VhostUserMemoryRegionInfo {
                guest_phys_addr: r.start_addr().0,
                memory_size: r.len(),
                userspace_addr: r.as_ptr() as u64,
                ..VhostUserMemoryRegionInfo::default()
            })
            .collect();
        v.set_mem_table(&regions)
            .map_err(fail("VHOST_SET_MEM_TABLE"))?;
        for q in a.queues.iter().filter(|q| q.index < VHOST_QUEUES) {
            let queue: &Queue = &q.queue;
            // The crate checks that each ring lies in guest memory.
            let rings = VringConfigData {
                queue_max_size: QUEUE_SIZE,
                queue_size: queue.size(),
                flags: 0,
                desc_table_addr: queue.desc_table(),
                used_ring_addr: queue.used_ring(),
                avail_ring_addr: queue.avail_ring(),
                log_addr: None,
            };
            v.set_vring_num(q.index, queue.size())
                .map_err(fail("VHOST_SET_VRING_NUM"))?;
            v.set_vring_base(q.index, queue.next_avail())
                .map_err(fail("VHOST_SET_VRING_BASE"))?;
            v.set_vring_addr(q.index, &rings)
                .map_err(fail("VHOST_SET_VRING_ADDR"))?;
            v.set_vring_kick(q.index, &q.event)
                .map_err(fail("VHOST_SET_VRING_KICK"))?;
            v.set_vring_call(q.index, &calls[q.index])
                .map_err(fail("VHOST_SET_VRING_CALL"))?;
        }
        v.start().map_err(fail("VHOST_VSOCK_SET_RUNNING"))
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
            None => Vhost::open(self.cid, self.mem.clone())
                .map_err(|e| std::io::Error::other(e.to_string()))?,
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
        let started = self.start(&vhost, &a, &calls);
        // Kept whatever happened: a jailed VMM cannot open another.
        self.vhost = Some(vhost);
        started.map_err(std::io::Error::other)?;
        if std::mem::take(&mut self.reset_pending) {
            let event = a.queues.into_iter().find(|q| q.index == EVENT_QUEUE);
            let sent = event
                .map(|mut q| send_transport_reset(&mut q.queue, &a.mem, &a.interrupt))
                .unwrap_or(false);
            if !sent {
                crate::warn(
                    "vsock",
                    format_args!("no event buffer for the transport reset"),
                );
            }
        }
        let (irq, counters) = (a.interrupt, self.counters.clone());
        self.running = Some(DeviceThread::spawn("vsock-irq", 128 << 10, move |kill| {
            relay(relayed, kill, irq, counters)
        })?);
        Ok(())
    }

    fn restore(&mut self, s: &crate::DeviceState) -> Result<(), String> {
        match s {
            crate::DeviceState::Stateless => {
                self.reset_pending = true;
                Ok(())
            }
            other => Err(format!("a device state of another kind: {other:?}")),
        }
    }

    fn release_host(&mut self) {
        // The CID is the host's: a destination on this same host claims
        // it next. The device keeps its descriptor (a jailed VMM could not
        // open another) under a stand-in CID from the top of the range.
        let Some(v) = &self.vhost else { return };
        let base = u64::from(u32::MAX) - 2 - u64::from(std::process::id() % 0x1000_0000);
        for stand_in in (0..64).map(|i| base - i * 0x10_0000) {
            if v.0.set_guest_cid(stand_in).is_ok() {
                return;
            }
        }
    }

    fn reclaim_host(&mut self) -> Result<(), String> {
        match &self.vhost {
            Some(v) => {
                v.0.set_guest_cid(self.cid)
                    .map_err(|e| format!("its CID {}: {e}", self.cid))
            }
            None => Ok(()),
        }
    }

    fn reset(&mut self) {
        if let Some(v) = &self.vhost {
            // Stopped, and kept open with its CID: the next activation sets
            // its rings up again. A jailed VMM could not open it again.
            let _ = v.0.stop();
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
        let mem = Arc::new(Memory::from_ranges(&[(vm_memory::GuestAddress(0), 1 << 16)]).unwrap());
        for cid in [0, 1, 2, u64::from(u32::MAX), u64::MAX] {
            assert!(
                matches!(Vsock::new(cid, mem.clone()), Err(VsockError::BadCid(_))),
                "{cid}"
            );
        }
    }
}
