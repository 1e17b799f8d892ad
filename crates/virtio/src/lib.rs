//! Virtio 1.x devices for Domus domains: the modern virtio-pci transport
//! ([`pci::VirtioPci`]) and the devices behind it. Everything here is
//! KVM-free: the VMM hands in a [`Hypervisor`] for MSI routes and
//! ioeventfds, and interrupts leave through eventfds it wired to irqfds.
//!
//! Each activated device runs on its own thread (plus an I/O pool for
//! block), never on a vCPU thread. Queues are split virtqueues from the
//! `virtio-queue` crate, with `VIRTIO_RING_F_EVENT_IDX` and
//! `VIRTIO_RING_F_INDIRECT_DESC`. Everything a guest puts in a queue is
//! treated as hostile: see `block::request` and the fuzz harness.

pub mod balloon;
pub mod block;
pub mod epoll;
pub mod fuzz;
pub mod msix;
pub mod net;
pub mod pci;
pub mod ratelimit;
pub mod rings;
pub mod rng;
pub mod vsock;

use std::sync::Arc;

use virtio_queue::Queue;
use vm_memory::bitmap::AtomicBitmap;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

pub use msix::Interrupt;

/// Guest memory as every device sees it. Each region has a bitmap of the
/// pages the VMM wrote (a bit per 4 KiB page): writes through `vm-memory`
/// (used rings, received frames, entropy) mark it themselves, and a device
/// that writes guest memory behind its back (block reads by preadv,
/// balloon discards) marks what it wrote. A live migration reads and
/// clears it each round, beside KVM's dirty log of what vCPUs wrote.
pub type Memory = GuestMemoryMmap<AtomicBitmap>;

/// The pages the VMM wrote since the last call, per RAM region (a bit per
/// 4 KiB page, in 64-bit words); the bitmaps are cleared as they are read.
pub fn take_dirty(mem: &Memory) -> Vec<Vec<u64>> {
    use vm_memory::GuestMemoryBackend;
    // Each region's own AtomicBitmap (MmapRegion::bitmap, through Deref).
    mem.iter()
        .map(|r| std::ops::Deref::deref(r).bitmap().get_and_reset())
        .collect()
}

// Feature bits as masks, from the virtio headers' bit numbers
// (virtio-bindings).
pub const VIRTIO_F_VERSION_1: u64 = 1 << virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
pub const VIRTIO_RING_F_INDIRECT_DESC: u64 =
    1 << virtio_bindings::virtio_ring::VIRTIO_RING_F_INDIRECT_DESC;
pub const VIRTIO_RING_F_EVENT_IDX: u64 = 1 << virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
/// Features every Domus device offers.
pub const BASE_FEATURES: u64 =
    VIRTIO_F_VERSION_1 | VIRTIO_RING_F_INDIRECT_DESC | VIRTIO_RING_F_EVENT_IDX;

pub const TYPE_NET: u32 = 1;
pub const TYPE_BLOCK: u32 = 2;
pub const TYPE_RNG: u32 = 4;
pub const TYPE_BALLOON: u32 = 5;
pub const TYPE_VSOCK: u32 = 19;

/// A device's counters for the API, as (name, value) pairs.
pub trait Stats: Send + Sync {
    fn counters(&self) -> Vec<(&'static str, u64)>;
}

/// What the VMM does for the transport: MSI routes and notify doorbells.
pub trait Hypervisor: Send + Sync {
    /// Points `gsi` at the MSI message (`addr`, `data`).
    fn set_msi_route(&self, gsi: u32, addr: u64, data: u32) -> std::io::Result<()>;
    /// Makes guest writes to the MMIO address `addr` signal `fd`.
    fn register_ioevent(&self, fd: &EventFd, addr: u64) -> std::io::Result<()>;
    fn unregister_ioevent(&self, fd: &EventFd, addr: u64) -> std::io::Result<()>;
    /// The vector's device is gone (hot-unplug): detach its irqfd and free
    /// its GSI.
    fn release_vector(&self, _vector: &msix::Vector) -> std::io::Result<()> {
        Ok(())
    }
}

/// A queue the driver enabled, handed to the device at activation.
pub struct ActiveQueue {
    /// The queue's index in the device.
    pub index: usize,
    pub queue: Queue,
    /// Signalled when the driver notifies the queue.
    pub event: EventFd,
}

/// Everything a device needs to start serving its queues.
pub struct Activation {
    pub mem: Arc<Memory>,
    /// The features the driver accepted.
    pub features: u64,
    pub queues: Vec<ActiveQueue>,
    pub interrupt: Interrupt,
}

#[derive(Debug, thiserror::Error)]
pub enum ActivateError {
    #[error("queue {0} is required but the driver did not enable it")]
    MissingQueue(usize),
    #[error("starting the device thread: {0}")]
    Thread(std::io::Error),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// A device's serving thread and the eventfd that tells it to stop.
pub struct DeviceThread {
    kill: EventFd,
    handle: std::thread::JoinHandle<()>,
}

/// What every device thread does first, before it touches a queue: the
/// VMM confines the thread there (its seccomp filter for device threads).
/// An error ends the thread at once: a device left dead is better than a
/// device thread with more rights than it should have.
static THREAD_START: std::sync::OnceLock<fn(&str) -> std::io::Result<()>> =
    std::sync::OnceLock::new();

/// Sets what each device thread started from now on runs first, given
/// its name (once per process; a second call is ignored).
pub fn on_thread_start(f: fn(&str) -> std::io::Result<()>) {
    let _ = THREAD_START.set(f);
}

/// Starts a device thread called `name` running `f`, after the
/// [`on_thread_start`] hook.
pub fn spawn_thread(
    name: String,
    stack: usize,
    f: impl FnOnce() + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name(name.clone())
        .stack_size(stack)
        .spawn(move || {
            if let Some(start) = THREAD_START.get() {
                if let Err(e) = start(&name) {
                    return warn(&name, format_args!("not started: {e}"));
                }
            }
            f()
        })
}

impl DeviceThread {
    /// Runs `f` on a thread called `name` (see [`spawn_thread`]); `f` gets
    /// the kill eventfd and must return once it becomes readable.
    pub fn spawn(
        name: &str,
        stack: usize,
        f: impl FnOnce(EventFd) + Send + 'static,
    ) -> Result<Self, ActivateError> {
        let kill = EventFd::new(libc::EFD_NONBLOCK)?;
        let k2 = kill.try_clone()?;
        let handle =
            spawn_thread(name.into(), stack, move || f(k2)).map_err(ActivateError::Thread)?;
        Ok(Self { kill, handle })
    }

    /// Tells the thread to stop and waits until it has.
    pub fn stop(self) {
        let _ = self.kill.write(1);
        let _ = self.handle.join();
    }
}

/// What a device keeps beyond its queues and config registers, in a
/// snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, tag = "kind", rename_all = "snake_case")]
pub enum DeviceState {
    /// Nothing (block, net, rng, vsock: their configuration says it all).
    #[default]
    Stateless,
    /// The balloon's target and the driver's `actual`, in 4 KiB pages.
    Balloon {
        target_pages: u64,
        actual_pages: u64,
    },
}

/// A virtio device model behind the transport.
pub trait VirtioDevice: Send {
    fn device_type(&self) -> u32;
    /// The PCI class code (class, subclass, prog-if in bits 31..8).
    fn pci_class(&self) -> u32 {
        0xff_0000 << 8
    }
    /// The largest size of each queue; the length is the number of queues.
    fn queue_max_sizes(&self) -> Vec<u16>;
    /// Feature bits offered (including [`BASE_FEATURES`]).
    fn features(&self) -> u64;
    /// Reads the device-specific config space; bytes past its end read 0.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// Writes the device-specific config space; most devices ignore it.
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}
    /// Starts serving the queues (on DRIVER_OK).
    fn activate(&mut self, a: Activation) -> Result<(), ActivateError>;
    /// Stops serving and waits until no thread touches guest memory on the
    /// device's behalf, every request taken from a queue completed in the
    /// used ring (a snapshot resumes each queue at the used ring's index);
    /// the device can then be activated again.
    fn reset(&mut self);
    /// What the device keeps beyond its queues (see [`DeviceState`]).
    fn state(&self) -> DeviceState {
        DeviceState::Stateless
    }
    /// Lets go of what only one VMM may hold of the host (a writable
    /// disk's lock), so that a live migration's destination can take it;
    /// the device is stopped ([`VirtioDevice::reset`]).
    fn release_host(&mut self) {}
    /// Takes back what [`VirtioDevice::release_host`] let go (the
    /// migration failed); an error if another process holds it now.
    fn reclaim_host(&mut self) -> Result<(), String> {
        Ok(())
    }
    /// Tells the host's network where the guest is now (after a live
    /// migration): an interface sends a RARP frame from the guest's MAC,
    /// so that bridges and switches learn its new port.
    fn announce(&self) -> std::io::Result<()> {
        Ok(())
    }
    /// Puts back what [`VirtioDevice::state`] returned.
    fn restore(&mut self, s: &DeviceState) -> Result<(), String> {
        match s {
            DeviceState::Stateless => Ok(()),
            other => Err(format!("a device state of another kind: {other:?}")),
        }
    }
}

/// Where a split queue of `size` entries keeps `avail_event` (the device's
/// "kick me at this index", with event idx): the u16 after the used ring's
/// 4-byte header and 8-byte elements, as an offset from the used ring.
pub fn avail_event_offset(size: u16) -> u64 {
    4 + 8 * u64::from(size)
}

/// True if the driver's available index is further ahead of the device
/// than the queue holds: the ring is corrupt and nothing can be taken
/// from it (`virtio-queue` then yields no chains, so a device loop that
/// re-checks after enabling notifications must stop instead of spinning).
pub fn ring_corrupt(queue: &Queue, mem: &Memory) -> bool {
    use std::sync::atomic::Ordering;
    use virtio_queue::QueueT;
    match queue.avail_idx(mem, Ordering::Acquire) {
        Ok(idx) => (idx - std::num::Wrapping(queue.next_avail())).0 > queue.size(),
        Err(_) => true,
    }
}

/// Copies `src[offset..]` into `data`; bytes outside `src` read as 0.
pub fn read_config_bytes(src: &[u8], offset: u64, data: &mut [u8]) {
    for (i, b) in data.iter_mut().enumerate() {
        *b = usize::try_from(offset)
            .ok()
            .and_then(|o| o.checked_add(i))
            .and_then(|o| src.get(o))
            .copied()
            .unwrap_or(0);
    }
}

/// Logs a warning about a device, with the device as a field (the log
/// goes to stderr; the console is stdout).
pub(crate) fn warn(device: &str, msg: std::fmt::Arguments<'_>) {
    tracing::warn!(device, "{msg}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_reads_past_the_end_are_zero() {
        let src = [1u8, 2, 3];
        let mut d = [9u8; 4];
        read_config_bytes(&src, 1, &mut d);
        assert_eq!(d, [2, 3, 0, 0]);
        read_config_bytes(&src, u64::MAX, &mut d);
        assert_eq!(d, [0; 4]);
    }
}

#[cfg(test)]
mod hostile;
