//! virtio-net (type 1) on a Linux tap device, in userspace.
//!
//! The tap is opened with `IFF_VNET_HDR` and a 12-byte header, so the
//! virtio-net header travels with each frame in both directions and the
//! kernel does the checksum and segmentation work the guest negotiated:
//! the guest may send unchecksummed and TSO frames (`HOST_*` features
//! need nothing from us), and `TUNSETOFFLOAD` tells the tap which of those
//! the guest accepts (`GUEST_*`). Receive buffers are mergeable
//! (`MRG_RXBUF`) unless the interface says not (`mrg_rxbuf`): a large
//! frame spreads over several chains and the header says how many;
//! without, each chain takes a whole frame. Frames from the tap are read
//! straight into the guest's buffers when those the device holds could
//! take the largest (`rx`).
//!
//! One thread per interface serves both queues and the tap. A token-bucket
//! limiter (bytes and packets per second) covers both directions together;
//! while it holds traffic back, transmit chains stay in the ring and the tap
//! is not read, so the back-pressure reaches both ends.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::timerfd::TimerFd;

use crate::epoll::Poller;
use crate::ratelimit::{Limits, Shared};
use crate::{ActivateError, Activation, DeviceThread, Interrupt, Memory, VirtioDevice};

mod rx;
mod tap;

pub use rx::{RxBuffers, Scatter, MAX_IOVECS};
pub use tap::{default_mac, format_mac, offload_flags, NetError, Tap};

use virtio_bindings::virtio_net as vn;

pub const F_CSUM: u64 = 1 << vn::VIRTIO_NET_F_CSUM;
pub const F_GUEST_CSUM: u64 = 1 << vn::VIRTIO_NET_F_GUEST_CSUM;
pub const F_MAC: u64 = 1 << vn::VIRTIO_NET_F_MAC;
pub const F_GUEST_TSO4: u64 = 1 << vn::VIRTIO_NET_F_GUEST_TSO4;
pub const F_GUEST_TSO6: u64 = 1 << vn::VIRTIO_NET_F_GUEST_TSO6;
pub const F_GUEST_ECN: u64 = 1 << vn::VIRTIO_NET_F_GUEST_ECN;
pub const F_HOST_TSO4: u64 = 1 << vn::VIRTIO_NET_F_HOST_TSO4;
pub const F_HOST_TSO6: u64 = 1 << vn::VIRTIO_NET_F_HOST_TSO6;
pub const F_HOST_ECN: u64 = 1 << vn::VIRTIO_NET_F_HOST_ECN;
pub const F_MRG_RXBUF: u64 = 1 << vn::VIRTIO_NET_F_MRG_RXBUF;

/// The virtio-net header of a VERSION_1 device (`virtio_net_hdr_v1`).
pub const HDR_LEN: usize = 12;
/// The largest frame (header included) either way: a 64 KiB GSO frame
/// plus headers.
pub const MAX_FRAME: usize = HDR_LEN + 65_550;
const QUEUE_SIZE: u16 = 256;
const RXQ: usize = 0;
const TXQ: usize = 1;

/// What `--net` asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetConfig {
    /// The tap device: opened if it exists, created otherwise.
    pub tap: String,
    pub mac: Option<[u8; 6]>,
    pub limits: Limits,
    /// The tag of a /dev/net/tun descriptor the supervisor passed (a
    /// jailed VMM cannot open it): see [`Net::with_tun`].
    pub passed: Option<u64>,
    /// Offer mergeable receive buffers (`VIRTIO_NET_F_MRG_RXBUF`).
    pub mrg_rxbuf: bool,
    /// Offer indirect descriptors (`VIRTIO_RING_F_INDIRECT_DESC`).
    pub indirect_desc: bool,
}

/// Per-interface counters.
#[derive(Debug, Default)]
pub struct Counters {
    pub rx_packets: AtomicU64,
    pub rx_bytes: AtomicU64,
    pub tx_packets: AtomicU64,
    pub tx_bytes: AtomicU64,
    /// Frames from the tap that no guest buffer could take.
    pub rx_dropped: AtomicU64,
    /// Guest frames the tap refused or that were malformed.
    pub tx_dropped: AtomicU64,
    /// Times traffic waited for the rate limiter.
    pub throttled: AtomicU64,
    /// Doorbells the guest rang on the receive and transmit queues (each
    /// one a VM exit), and interrupts sent to it: the costs of
    /// notification, per byte moved, that batching is meant to keep low.
    pub rx_kicks: AtomicU64,
    pub tx_kicks: AtomicU64,
    pub interrupts: AtomicU64,
    /// Received frames the tap's read wrote straight into guest buffers
    /// (of `rx_packets`; the others were copied from the device's own).
    pub rx_direct: AtomicU64,
}

impl crate::Stats for Counters {
    fn counters(&self) -> Vec<(&'static str, u64)> {
        [
            ("rx_packets", &self.rx_packets),
            ("rx_bytes", &self.rx_bytes),
            ("tx_packets", &self.tx_packets),
            ("tx_bytes", &self.tx_bytes),
            ("rx_dropped", &self.rx_dropped),
            ("tx_dropped", &self.tx_dropped),
            ("throttled", &self.throttled),
            ("rx_kicks", &self.rx_kicks),
            ("tx_kicks", &self.tx_kicks),
            ("interrupts", &self.interrupts),
            ("rx_direct", &self.rx_direct),
        ]
        .into_iter()
        .map(|(n, v)| (n, v.load(Ordering::Relaxed)))
        .collect()
    }
}

fn add(c: &AtomicU64, v: u64) {
    c.fetch_add(v, Ordering::Relaxed);
}

pub struct Net {
    tap: Arc<Tap>,
    mac: [u8; 6],
    counters: Arc<Counters>,
    limiter: Arc<Shared>,
    mrg_rxbuf: bool,
    indirect_desc: bool,
    running: Option<DeviceThread>,
}

impl Net {
    pub fn open(cfg: &NetConfig) -> Result<Self, NetError> {
        Self::with_tap(cfg, Tap::open(&cfg.tap)?)
    }

    /// The interface on `tun`, an open /dev/net/tun the caller was handed.
    pub fn with_tun(cfg: &NetConfig, tun: std::fs::File) -> Result<Self, NetError> {
        Self::with_tap(cfg, Tap::attach(tun, &cfg.tap)?)
    }

    fn with_tap(cfg: &NetConfig, tap: Tap) -> Result<Self, NetError> {
        let limiter = Shared::new(cfg.limits).map_err(|source| NetError::Tap {
            name: cfg.tap.clone(),
            what: "eventfd",
            source,
        })?;
        Ok(Self {
            tap: Arc::new(tap),
            mac: cfg.mac.unwrap_or_else(|| default_mac(&cfg.tap)),
            counters: Arc::default(),
            limiter: Arc::new(limiter),
            mrg_rxbuf: cfg.mrg_rxbuf,
            indirect_desc: cfg.indirect_desc,
            running: None,
        })
    }

    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    pub fn handles(&self) -> (Arc<Counters>, Arc<Shared>) {
        (self.counters.clone(), self.limiter.clone())
    }
}

/// A RARP request from `mac` (as QEMU announces a migrated guest), behind
/// the tap's zeroed 12-byte vnet header, padded to Ethernet's 60 bytes.
pub fn rarp(mac: &[u8; 6]) -> [u8; 12 + 60] {
    let mut f = [0u8; 12 + 60];
    let e = &mut f[12..];
    e[0..6].copy_from_slice(&[0xff; 6]);
    e[6..12].copy_from_slice(mac);
    e[12..14].copy_from_slice(&0x8035u16.to_be_bytes()); // RARP
    e[14..16].copy_from_slice(&1u16.to_be_bytes()); // Ethernet
    e[16..18].copy_from_slice(&0x0800u16.to_be_bytes()); // IPv4
    e[18] = 6;
    e[19] = 4;
    e[20..22].copy_from_slice(&3u16.to_be_bytes()); // request reverse
    e[22..28].copy_from_slice(mac); // sender: the guest, no address
    e[32..38].copy_from_slice(mac); // target: the guest, no address
    f
}

/// The frame (header included) of a transmit chain, as I/O vectors straight
/// into guest memory: readable descriptors only, each inside guest RAM, at
/// most [`MAX_FRAME`] bytes in all. Returns the vectors and the length, or
/// None if the chain is malformed. The guest may change the bytes while the
/// tap reads them; it only changes what it sends.
pub fn tx_iovecs(mem: &Memory, descs: &[(u64, u32, bool)]) -> Option<(Vec<libc::iovec>, usize)> {
    let mut iov = Vec::with_capacity(descs.len());
    let mut total = 0usize;
    for &(addr, len, write) in descs {
        if write {
            return None;
        }
        total = total.checked_add(len as usize)?;
        if total > MAX_FRAME {
            return None;
        }
        if len == 0 {
            continue;
        }
        let slice = mem.get_slice(GuestAddress(addr), len as usize).ok()?;
        iov.push(libc::iovec {
            iov_base: slice.ptr_guard_mut().as_ptr().cast(),
            iov_len: len as usize,
        });
    }
    (total >= HDR_LEN).then_some((iov, total))
}

struct Engine {
    mem: Arc<Memory>,
    tap: Arc<Tap>,
    irq: Interrupt,
    rx: Queue,
    tx: Queue,
    /// Receive chains taken and not yet used.
    bufs: RxBuffers,
    counters: Arc<Counters>,
    limiter: Arc<Shared>,
    /// A frame read from the tap into `rx_buf` that is waiting for guest
    /// buffers.
    rx_frame: Option<usize>,
    rx_buf: Vec<u8>,
    tap_watched: bool,
    timer_armed: bool,
}

const T_RX: u64 = 0;
const T_TX: u64 = 1;
const T_TAP: u64 = 2;
const T_KILL: u64 = 3;
const T_TIMER: u64 = 4;
const T_LIMITS: u64 = 5;

enum Rx {
    /// The tap has nothing more.
    Drained,
    /// The guest has no room: wait for it to add buffers.
    NoRoom,
    /// The limiter says wait.
    Throttled(Duration),
}

/// Out of room for the frame at hand, having taken every buffer the ring
/// held when it looked ([`rx::RxBuffers::fill`]): asks the guest to
/// notify the device when it adds any buffer past those it offers now
/// (avail_event = the driver's avail index), and says whether the ring
/// holds any buffer the device has not taken (look again).
///
/// Both halves were bugs once. Asking instead for the buffers past the
/// ones taken (`enable_notification`'s avail_event = next_avail) left a
/// device that had not taken the buffers offered (before `fill`) waiting
/// for a kick the guest never sent: its later additions did not cross
/// that index (bench/paper's iperf3 into the guest, 0404e9b). And looking
/// again only for buffers added after this call read the avail index
/// missed those the guest added between the device's last look and that
/// read: they came with no kick (the guest's avail_event lay behind), and
/// once they filled its ring the guest added no more, so the device held
/// its buffers unused for good (a ring of 256 buffers, 242 used, the
/// device asleep and the domain unreachable: bench/paper's VMM capture,
/// 2026-11-30). Since the device takes every buffer before it asks, one
/// it has not taken was added since, and looking again takes it.
pub fn wait_for_buffers(q: &mut Queue, mem: &Memory) -> bool {
    let Ok(offered) = q.avail_idx(mem, Ordering::Acquire) else {
        return false;
    };
    if q.event_idx_enabled() {
        let Some(addr) = q
            .used_ring()
            .checked_add(crate::avail_event_offset(q.size()))
        else {
            return false;
        };
        if mem
            .store(offered.0.to_le(), GuestAddress(addr), Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
    } else if q.enable_notification(mem).is_err() {
        return false;
    }
    // The store above before the load below (the driver's side pairs it).
    std::sync::atomic::fence(Ordering::SeqCst);
    q.avail_idx(mem, Ordering::Relaxed)
        .is_ok_and(|now| now.0 != q.next_avail())
}

impl Engine {
    /// Moves frames from the tap into the guest until one side runs out:
    /// straight into the guest's buffers when those held can take any
    /// frame, else through `rx_buf` (see [`rx`]).
    fn receive(&mut self) -> Rx {
        loop {
            let len = match self.rx_frame {
                Some(l) => l,
                None => {
                    let w = self.limiter.wait();
                    if !w.is_zero() {
                        return Rx::Throttled(w);
                    }
                    self.bufs.fill(&mut self.rx, &self.mem, MAX_FRAME);
                    if let Some(r) = self.receive_direct() {
                        match r {
                            Ok(()) => continue,
                            Err(r) => return r,
                        }
                    }
                    match (&self.tap.file).read(&mut self.rx_buf) {
                        Ok(n) if n >= HDR_LEN => n,
                        Ok(_) => continue,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(_) => return Rx::Drained,
                    }
                }
            };
            self.rx_frame = Some(len);
            self.bufs.fill(&mut self.rx, &self.mem, len);
            match self
                .bufs
                .scatter(&mut self.rx, &self.mem, &self.rx_buf[..len])
            {
                Scatter::Delivered(_) => self.received(len),
                Scatter::NoRoom => return Rx::NoRoom,
                Scatter::Dropped => add(&self.counters.rx_dropped, 1),
            }
            self.rx_frame = None;
        }
    }

    /// Reads one frame from the tap straight into the held buffers, if
    /// they could take the largest: None if they could not (read it into
    /// `rx_buf` instead); Some(Err) when the tap has nothing more.
    fn receive_direct(&mut self) -> Option<Result<(), Rx>> {
        if self.bufs.room() < MAX_FRAME {
            return None;
        }
        let iov = self.bufs.iovecs()?;
        // SAFETY: each vector lies inside a guest RAM mapping (checked when
        // its chain was taken, against `self.mem`, which this engine holds
        // and so keeps mapped), in buffers the driver gave the device to
        // write; readv writes only through them.
        let n = unsafe { libc::readv(self.tap.file.as_raw_fd(), iov.as_ptr(), iov.len() as i32) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return Some(match e.kind() {
                std::io::ErrorKind::Interrupted => Ok(()),
                _ => Err(Rx::Drained),
            });
        }
        let len = n as usize;
        if len >= HDR_LEN {
            match self.bufs.complete_read(&mut self.rx, &self.mem, len) {
                Some(_) => {
                    add(&self.counters.rx_direct, 1);
                    self.received(len)
                }
                None => add(&self.counters.rx_dropped, 1),
            }
        }
        Some(Ok(()))
    }

    /// Counts a frame of `len` bytes (header included) delivered.
    fn received(&mut self, len: usize) {
        add(&self.counters.rx_packets, 1);
        add(&self.counters.rx_bytes, (len - HDR_LEN) as u64);
        self.limiter.charge((len - HDR_LEN) as u64);
    }

    /// Sends the guest's frames to the tap. Returns a wait if throttled.
    fn transmit(&mut self) -> Option<Duration> {
        let mem = self.mem.clone();
        let mut throttled = None;
        'outer: loop {
            if self.tx.disable_notification(&*mem).is_err() {
                break;
            }
            while let Some(chain) = self.tx.pop_descriptor_chain(&*mem) {
                let head = chain.head_index();
                let descs: Vec<(u64, u32, bool)> = chain
                    .map(|d| (d.addr().0, d.len(), d.is_write_only()))
                    .collect();
                let Some((iov, len)) = tx_iovecs(&mem, &descs) else {
                    add(&self.counters.tx_dropped, 1);
                    let _ = self.tx.add_used(&*mem, head, 0);
                    continue;
                };
                let bytes = (len - HDR_LEN) as u64;
                if let Err(w) = self.limiter.consume(bytes) {
                    self.tx.go_to_previous_position();
                    throttled = Some(w);
                    break 'outer;
                }
                // SAFETY: each vector lies inside a guest RAM mapping
                // (checked by tx_iovecs), which lives as long as the VM;
                // writev only reads through them.
                let n = unsafe {
                    libc::writev(self.tap.file.as_raw_fd(), iov.as_ptr(), iov.len() as i32)
                };
                if n >= 0 {
                    add(&self.counters.tx_packets, 1);
                    add(&self.counters.tx_bytes, bytes);
                } else {
                    add(&self.counters.tx_dropped, 1);
                }
                let _ = self.tx.add_used(&*mem, head, 0);
                // Tell the guest now, while notifications are still off: the
                // frames it sends in reply land in a queue we are draining,
                // with no doorbell.
                if self.tx.needs_notification(&*mem).unwrap_or(true) {
                    add(&self.counters.interrupts, 1);
                    self.irq.queue(TXQ);
                }
            }
            match self.tx.enable_notification(&*mem) {
                Ok(true) if !crate::ring_corrupt(&self.tx, &mem) => continue,
                _ => break,
            }
        }
        if self.tx.needs_notification(&*mem).unwrap_or(true) {
            add(&self.counters.interrupts, 1);
            self.irq.queue(TXQ);
        }
        throttled
    }

    fn notify_rx(&mut self) {
        if self.rx.needs_notification(&*self.mem).unwrap_or(true) {
            add(&self.counters.interrupts, 1);
            self.irq.queue(RXQ);
        }
    }

    fn run(mut self, rx_evt: EventFd, tx_evt: EventFd, kill: EventFd) {
        let (Ok(mut poller), Ok(mut timer)) = (Poller::new(), TimerFd::new()) else {
            return crate::warn("virtio-net", format_args!("epoll/timerfd set-up failed"));
        };
        let added = poller
            .add(&rx_evt, T_RX)
            .and(poller.add(&tx_evt, T_TX))
            .and(poller.add(&self.tap.file, T_TAP))
            .and(poller.add(&kill, T_KILL))
            .and(poller.add(&timer, T_TIMER))
            .and(poller.add(&self.limiter.changed, T_LIMITS));
        if let Err(e) = added {
            return crate::warn("virtio-net", format_args!("epoll: {e}"));
        }
        self.tap_watched = true;
        loop {
            let Ok(tokens) = poller.wait(-1) else { return };
            let (mut do_rx, mut do_tx) = (false, false);
            for t in tokens {
                match t {
                    T_KILL => return,
                    T_RX => {
                        add(&self.counters.rx_kicks, rx_evt.read().unwrap_or(0));
                        do_rx = true;
                    }
                    T_TX => {
                        add(&self.counters.tx_kicks, tx_evt.read().unwrap_or(0));
                        do_tx = true;
                    }
                    T_TAP => do_rx = true,
                    T_TIMER => {
                        let _ = timer.wait();
                        self.timer_armed = false;
                        (do_rx, do_tx) = (true, true);
                    }
                    T_LIMITS => {
                        let _ = self.limiter.changed.read();
                        (do_rx, do_tx) = (true, true);
                    }
                    _ => {}
                }
            }
            let mut wait = None;
            if do_tx {
                wait = self.transmit();
            }
            if do_rx {
                let r = loop {
                    let r = self.receive();
                    // Out of buffers: ask the guest to kick us when it adds
                    // some, and look again in case it just did (the used
                    // ones are signalled below, so that it refills).
                    if matches!(r, Rx::NoRoom)
                        && wait_for_buffers(&mut self.rx, &self.mem)
                        && !crate::ring_corrupt(&self.rx, &self.mem)
                    {
                        continue;
                    }
                    break r;
                };
                self.notify_rx();
                let watch = match r {
                    Rx::Drained => true,
                    Rx::NoRoom => false,
                    Rx::Throttled(w) => {
                        wait = Some(wait.map_or(w, |x: Duration| x.min(w)));
                        false
                    }
                };
                if watch != self.tap_watched {
                    let _ = poller.set_watching(&self.tap.file, T_TAP, watch);
                    self.tap_watched = watch;
                }
            }
            if let Some(w) = wait {
                add(&self.counters.throttled, 1);
                if !self.timer_armed {
                    let _ = timer.reset(w.max(Duration::from_micros(50)), None);
                    self.timer_armed = true;
                }
            }
        }
    }
}

impl VirtioDevice for Net {
    fn device_type(&self) -> u32 {
        crate::TYPE_NET
    }

    fn pci_class(&self) -> u32 {
        0x02_0000 << 8 // network, ethernet
    }

    fn queue_max_sizes(&self) -> Vec<u16> {
        vec![QUEUE_SIZE; 2]
    }

    fn features(&self) -> u64 {
        let base = if self.indirect_desc {
            crate::BASE_FEATURES
        } else {
            crate::BASE_FEATURES & !crate::VIRTIO_RING_F_INDIRECT_DESC
        };
        base | F_CSUM
            | F_GUEST_CSUM
            | F_MAC
            | F_GUEST_TSO4
            | F_GUEST_TSO6
            | F_GUEST_ECN
            | F_HOST_TSO4
            | F_HOST_TSO6
            | F_HOST_ECN
            | if self.mrg_rxbuf { F_MRG_RXBUF } else { 0 }
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        crate::read_config_bytes(&self.mac, offset, data);
    }

    fn announce(&self) -> std::io::Result<()> {
        use std::io::Write;
        (&self.tap.file).write_all(&rarp(&self.mac)).map(drop)
    }

    fn activate(&mut self, a: Activation) -> Result<(), ActivateError> {
        let mut rx = None;
        let mut tx = None;
        for q in a.queues {
            match q.index {
                RXQ => rx = Some(q),
                TXQ => tx = Some(q),
                _ => {}
            }
        }
        let rx = rx.ok_or(ActivateError::MissingQueue(RXQ))?;
        let tx = tx.ok_or(ActivateError::MissingQueue(TXQ))?;
        self.tap.set_offload(offload_flags(a.features))?;
        let engine = Engine {
            mem: a.mem,
            tap: self.tap.clone(),
            irq: a.interrupt,
            rx: rx.queue,
            tx: tx.queue,
            bufs: RxBuffers::new(a.features & F_MRG_RXBUF != 0),
            counters: self.counters.clone(),
            limiter: self.limiter.clone(),
            rx_frame: None,
            rx_buf: vec![0; MAX_FRAME],
            tap_watched: false,
            timer_armed: false,
        };
        let (rx_evt, tx_evt) = (rx.event, tx.event);
        self.running = Some(DeviceThread::spawn("virtio-net", 256 << 10, move |kill| {
            engine.run(rx_evt, tx_evt, kill)
        })?);
        Ok(())
    }

    fn reset(&mut self) {
        if let Some(t) = self.running.take() {
            t.stop();
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestMemoryMmap;

    fn mem() -> Memory {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap()
    }

    #[test]
    fn the_announcement_is_a_rarp_request_from_the_guest() {
        let mac = [0x52, 0x54, 0, 1, 2, 3];
        let f = rarp(&mac);
        assert_eq!(f[..12], [0; 12], "a zeroed vnet header");
        let e = &f[12..];
        assert_eq!(e.len(), 60);
        assert_eq!((&e[0..6], &e[6..12]), (&[0xff; 6][..], &mac[..]));
        assert_eq!(e[12..14], [0x80, 0x35]);
        assert_eq!(e[20..22], [0, 3]);
        assert_eq!((&e[22..28], &e[32..38]), (&mac[..], &mac[..]));
    }

    #[test]
    fn tx_chains_are_checked() {
        let m = mem();
        let ok = [(0x1000, 12, false), (0x2000, 50, false), (0x3000, 0, false)];
        let (iov, len) = tx_iovecs(&m, &ok).unwrap();
        assert_eq!((iov.len(), len), (2, 62));
        let bad: [&[(u64, u32, bool)]; 6] = [
            &[(0x1000, 12, true)],
            &[(0x1000, 11, false)],
            &[((1 << 20) - 4, 12, false)],
            &[(0, 65_000, false), (0, 65_000, false)],
            &[(u64::MAX - 4, 12, false)],
            &[(0, u32::MAX, false)],
        ];
        for b in bad {
            assert!(tx_iovecs(&m, b).is_none(), "{b:?}");
        }
    }

    /// A queue of 256 at 0x10000 (descriptors), 0x20000 (avail), 0x30000
    /// (used) whose driver offers `offered` buffers.
    fn rx_queue(m: &Memory, event_idx: bool, offered: u16) -> Queue {
        let mut q = Queue::new(256).unwrap();
        q.set_size(256);
        q.set_desc_table_address(Some(0x10000), Some(0));
        q.set_avail_ring_address(Some(0x20000), Some(0));
        q.set_used_ring_address(Some(0x30000), Some(0));
        q.set_event_idx(event_idx);
        q.set_ready(true);
        assert!(q.is_valid(m));
        m.write_obj(offered.to_le(), GuestAddress(0x20002)).unwrap();
        q
    }

    #[test]
    fn a_device_short_of_buffers_waits_for_any_new_one() {
        let m = mem();
        // Five buffers offered, all taken, too few for the frame.
        let mut q = rx_queue(&m, true, 5);
        q.set_next_avail(5);
        assert!(!wait_for_buffers(&mut q, &m), "none added meanwhile");
        let avail_event: u16 = m.read_obj(GuestAddress(0x30000 + 4 + 8 * 256)).unwrap();
        assert_eq!(avail_event, 5, "the next buffer added kicks");
        // Without event idx: the driver kicks on every buffer it adds.
        let mut q = rx_queue(&m, false, 5);
        q.set_next_avail(5);
        m.write_obj(1u16.to_le(), GuestAddress(0x30000)).unwrap();
        assert!(!wait_for_buffers(&mut q, &m));
        let flags: u16 = m.read_obj(GuestAddress(0x30000)).unwrap();
        assert_eq!(flags, 0, "VRING_USED_F_NO_NOTIFY cleared");
    }

    #[test]
    fn buffers_added_before_the_device_asks_for_a_kick_are_taken() {
        let m = mem();
        // The device took three buffers and found them too few; the guest
        // added two more before the device asked for a kick, with no kick
        // of its own (its avail_event lay behind). With the ring full it
        // will add no more: the device must look again, not wait.
        for event_idx in [true, false] {
            let mut q = rx_queue(&m, event_idx, 5);
            q.set_next_avail(3);
            assert!(wait_for_buffers(&mut q, &m), "event idx {event_idx}");
        }
        // Across the indices' wrap past 65535: three not taken, then none.
        let mut q = rx_queue(&m, true, 1);
        q.set_next_avail(65534);
        assert!(wait_for_buffers(&mut q, &m));
        q.set_next_avail(1);
        assert!(!wait_for_buffers(&mut q, &m));
    }
}
