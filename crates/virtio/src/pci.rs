//! The modern virtio-pci transport (virtio 1.x, section 4.1): one 32-bit
//! memory BAR holding the common config, ISR, device config, notify and
//! MSI-X regions, described by vendor capabilities in config space.
//!
//! Queue notifications arrive on eventfds: through ioeventfds on the notify
//! region once the device is live, or through the MMIO exit path (which
//! signals the same eventfd) if the ioeventfd could not be registered.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use domus_devices::bus::lock;
use domus_devices::pci::{ConfigSpace, ConfigState, PciDevice, PciId};
use virtio_queue::{Queue, QueueT};
use vmm_sys_util::eventfd::EventFd;

use crate::msix::{self, Interrupt, Msix, MsixState, Vector, NO_VECTOR};
use crate::rings::Signals;
use crate::{Activation, ActiveQueue, DeviceState, Hypervisor, Memory, VirtioDevice};

pub const VENDOR_VIRTIO: u16 = 0x1af4;
/// Modern devices: 0x1040 + device type.
pub const DEVICE_ID_BASE: u16 = 0x1040;

/// BAR 0 layout.
pub const BAR_SIZE: u32 = 0x8000;
const COMMON: u64 = 0x0000;
const COMMON_LEN: u64 = 0x40;
const ISR: u64 = 0x1000;
const DEVICE_CFG: u64 = 0x2000;
const DEVICE_CFG_LEN: u64 = 0x1000;
const NOTIFY: u64 = 0x3000;
const NOTIFY_LEN: u64 = 0x1000;
/// Each queue's doorbell is `NOTIFY + index * NOTIFY_MULTIPLIER`.
pub const NOTIFY_MULTIPLIER: u32 = 4;
const MSIX_TABLE: u64 = 0x4000;
const MSIX_PBA: u64 = 0x5000;

const CAP_VENDOR: u8 = 0x09;
const CAP_MSIX: u8 = 0x11;
const CFG_COMMON: u8 = 1;
const CFG_NOTIFY: u8 = 2;
const CFG_ISR: u8 = 3;
const CFG_DEVICE: u8 = 4;
const CFG_PCI: u8 = 5;

use virtio_bindings::virtio_config as vc;

pub const STATUS_ACKNOWLEDGE: u8 = vc::VIRTIO_CONFIG_S_ACKNOWLEDGE as u8;
pub const STATUS_DRIVER: u8 = vc::VIRTIO_CONFIG_S_DRIVER as u8;
pub const STATUS_DRIVER_OK: u8 = vc::VIRTIO_CONFIG_S_DRIVER_OK as u8;
pub const STATUS_FEATURES_OK: u8 = vc::VIRTIO_CONFIG_S_FEATURES_OK as u8;
pub const STATUS_NEEDS_RESET: u8 = vc::VIRTIO_CONFIG_S_NEEDS_RESET as u8;
pub const STATUS_FAILED: u8 = vc::VIRTIO_CONFIG_S_FAILED as u8;

/// The state the driver programs through the common config.
struct Common {
    device_feature_select: u32,
    driver_feature_select: u32,
    driver_features: u64,
    msix_config: u16,
    status: u8,
    config_generation: u8,
    queue_select: u16,
    queues: Vec<Queue>,
    queue_vectors: Vec<u16>,
}

impl Common {
    fn new(sizes: &[u16]) -> Self {
        Self {
            device_feature_select: 0,
            driver_feature_select: 0,
            driver_features: 0,
            msix_config: NO_VECTOR,
            status: 0,
            config_generation: 0,
            queue_select: 0,
            // Queue::new only fails for sizes that are not a power of two
            // up to 32768; device models only use such sizes.
            queues: sizes
                .iter()
                .map(|s| Queue::new(*s).expect("valid queue size"))
                .collect(),
            queue_vectors: vec![NO_VECTOR; sizes.len()],
        }
    }

    fn selected(&self) -> Option<&Queue> {
        self.queues.get(usize::from(self.queue_select))
    }
}

/// Where the live device's doorbells are, and the used index at each
/// queue's last interrupt.
struct Live {
    events: Vec<(usize, EventFd, Option<u64>)>,
    signals: Arc<Signals>,
}

pub struct VirtioPci {
    name: String,
    cfg: ConfigSpace,
    msix_cap: usize,
    pci_cfg_cap: usize,
    device: Box<dyn VirtioDevice>,
    device_features: u64,
    common: Common,
    isr: Arc<AtomicU8>,
    msix: Arc<Mutex<Msix>>,
    mem: Arc<Memory>,
    hv: Arc<dyn Hypervisor>,
    live: Option<Live>,
}

/// `len` bytes of a little-endian value.
fn le(v: u64, len: usize) -> [u8; 8] {
    let mut b = v.to_le_bytes();
    b[len.min(8)..].fill(0);
    b
}

fn from_le(data: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = data.len().min(8);
    b[..n].copy_from_slice(&data[..n]);
    u64::from_le_bytes(b)
}

impl VirtioPci {
    /// Wraps `device` as a PCI function with BAR 0 at `bar_addr` and one
    /// MSI-X vector per queue plus one for config changes (`vectors`).
    pub fn new(
        name: String,
        device: Box<dyn VirtioDevice>,
        bar_addr: u32,
        vectors: Vec<Vector>,
        mem: Arc<Memory>,
        hv: Arc<dyn Hypervisor>,
    ) -> Self {
        let dtype = device.device_type();
        let sizes = device.queue_max_sizes();
        let mut cfg = ConfigSpace::new(PciId {
            vendor: VENDOR_VIRTIO,
            device: DEVICE_ID_BASE + dtype as u16,
            class: device.pci_class(),
            revision: 1,
            subsystem_vendor: VENDOR_VIRTIO,
            subsystem: 0x40,
        });
        cfg.add_bar(0, bar_addr, BAR_SIZE);
        let cap = |ty: u8, off: u64, len: u64, extra: &[u8]| {
            let mut b = vec![16 + extra.len() as u8, ty, 0, 0, 0, 0];
            b.extend_from_slice(&(off as u32).to_le_bytes());
            b.extend_from_slice(&(len as u32).to_le_bytes());
            b.extend_from_slice(extra);
            b
        };
        cfg.add_capability(CAP_VENDOR, &cap(CFG_COMMON, COMMON, COMMON_LEN, &[]), &[]);
        cfg.add_capability(
            CAP_VENDOR,
            &cap(
                CFG_NOTIFY,
                NOTIFY,
                NOTIFY_LEN,
                &NOTIFY_MULTIPLIER.to_le_bytes(),
            ),
            &[],
        );
        cfg.add_capability(CAP_VENDOR, &cap(CFG_ISR, ISR, 1, &[]), &[]);
        cfg.add_capability(
            CAP_VENDOR,
            &cap(CFG_DEVICE, DEVICE_CFG, DEVICE_CFG_LEN, &[]),
            &[],
        );
        // The PCI configuration access capability: bar, offset, length and
        // the 4-byte data window are the driver's to write.
        let mut pci_cfg_body = cap(CFG_PCI, 0, 0, &[0; 4]);
        pci_cfg_body[3] = 0;
        let w: Vec<(usize, u8)> = [4usize, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
            .iter()
            .map(|o| (*o, 0xff))
            .collect();
        let pci_cfg_cap = cfg.add_capability(CAP_VENDOR, &pci_cfg_body, &w);
        let n = vectors.len() as u16;
        let mut mx = Vec::new();
        mx.extend_from_slice(&(n - 1).to_le_bytes());
        mx.extend_from_slice(&(MSIX_TABLE as u32).to_le_bytes()); // BIR 0
        mx.extend_from_slice(&(MSIX_PBA as u32).to_le_bytes());
        // Message control bits 14 (function mask) and 15 (enable).
        let msix_cap = cfg.add_capability(CAP_MSIX, &mx, &[(3, 0xc0)]);
        Self {
            name,
            cfg,
            msix_cap,
            pci_cfg_cap,
            device_features: device.features(),
            device,
            common: Common::new(&sizes),
            isr: Arc::new(AtomicU8::new(0)),
            msix: Arc::new(Mutex::new(Msix::new(vectors, hv.clone()))),
            mem,
            hv,
            live: None,
        }
    }

    pub fn status(&self) -> u8 {
        self.common.status
    }

    fn bar0(&self) -> u64 {
        self.cfg
            .bars()
            .first()
            .map(|(_, a, _)| *a)
            .unwrap_or_default()
    }

    fn read_common(&self, offset: u64, data: &mut [u8]) {
        let c = &self.common;
        let q = c.selected();
        let sel = usize::from(c.queue_select);
        let feature_word = |v: u64, s: u32| match s {
            0 => v & 0xffff_ffff,
            1 => v >> 32,
            _ => 0,
        };
        let v: u64 = match offset {
            0x00 => c.device_feature_select.into(),
            0x04 => feature_word(self.device_features, c.device_feature_select),
            0x08 => c.driver_feature_select.into(),
            0x0c => feature_word(c.driver_features, c.driver_feature_select),
            0x10 => c.msix_config.into(),
            0x12 => c.queues.len() as u64,
            0x14 => c.status.into(),
            0x15 => c.config_generation.into(),
            0x16 => c.queue_select.into(),
            0x18 => q.map_or(0, |q| q.size().into()),
            0x1a => c
                .queue_vectors
                .get(sel)
                .copied()
                .unwrap_or(NO_VECTOR)
                .into(),
            0x1c => q.map_or(0, |q| q.ready().into()),
            0x1e => c.queue_select.into(), // notify offset = queue index
            0x20 => q.map_or(0, |q| q.desc_table()),
            0x24 => q.map_or(0, |q| q.desc_table() >> 32),
            0x28 => q.map_or(0, |q| q.avail_ring()),
            0x2c => q.map_or(0, |q| q.avail_ring() >> 32),
            0x30 => q.map_or(0, |q| q.used_ring()),
            0x34 => q.map_or(0, |q| q.used_ring() >> 32),
            _ => 0,
        };
        data.copy_from_slice(&le(v, data.len())[..data.len()]);
    }

    fn write_common(&mut self, offset: u64, data: &[u8]) {
        let v = from_le(data);
        let configurable = self.common.status & STATUS_DRIVER_OK == 0;
        let sel = usize::from(self.common.queue_select);
        let nvec = lock(&self.msix).len() as u64;
        let vector = |v: u64| if v < nvec { v as u16 } else { NO_VECTOR };
        let c = &mut self.common;
        match offset {
            0x00 => c.device_feature_select = v as u32,
            0x08 => c.driver_feature_select = v as u32,
            0x0c if c.status & STATUS_FEATURES_OK == 0 => {
                let v = v & 0xffff_ffff;
                match c.driver_feature_select {
                    0 => c.driver_features = (c.driver_features & !0xffff_ffff) | v,
                    1 => c.driver_features = (c.driver_features & 0xffff_ffff) | v << 32,
                    _ => {}
                }
            }
            0x10 => c.msix_config = vector(v),
            0x14 => self.write_status(v as u8),
            0x16 => c.queue_select = v as u16,
            0x1a => {
                if let Some(qv) = c.queue_vectors.get_mut(sel) {
                    *qv = vector(v);
                }
            }
            _ if !configurable => {}
            _ => {
                let Some(q) = c.queues.get_mut(sel) else {
                    return;
                };
                if q.ready() && offset != 0x1c {
                    return; // a live queue's layout is fixed
                }
                let (lo, hi) = (Some(v as u32), Some((v >> 32) as u32));
                let wide = data.len() == 8;
                match offset {
                    0x18 => q.set_size(v as u16),
                    0x1c => q.set_ready(v == 1),
                    0x20 => q.set_desc_table_address(lo, wide.then_some(hi).flatten()),
                    0x24 => q.set_desc_table_address(None, lo),
                    0x28 => q.set_avail_ring_address(lo, wide.then_some(hi).flatten()),
                    0x2c => q.set_avail_ring_address(None, lo),
                    0x30 => q.set_used_ring_address(lo, wide.then_some(hi).flatten()),
                    0x34 => q.set_used_ring_address(None, lo),
                    _ => {}
                }
            }
        }
    }

    fn write_status(&mut self, v: u8) {
        if v == 0 {
            self.reset();
            return;
        }
        let old = self.common.status;
        let mut new = v;
        if new & STATUS_FEATURES_OK != 0 && old & STATUS_FEATURES_OK == 0 {
            let f = self.common.driver_features;
            // Refuse features we did not offer, and legacy drivers.
            if f & !self.device_features != 0 || f & crate::VIRTIO_F_VERSION_1 == 0 {
                new &= !STATUS_FEATURES_OK;
            }
        }
        self.common.status = new | (old & STATUS_NEEDS_RESET);
        if new & STATUS_DRIVER_OK != 0 && old & STATUS_DRIVER_OK == 0 {
            if new & STATUS_FEATURES_OK == 0 {
                self.fail("DRIVER_OK without FEATURES_OK".into());
            } else if let Err(e) = self.activate() {
                self.fail(e);
            }
        }
    }

    /// The device cannot go on: tell the driver it must reset us.
    fn fail(&mut self, why: String) {
        crate::warn(&self.name, format_args!("{why}; needs a reset"));
        self.common.status |= STATUS_NEEDS_RESET;
        self.common.config_generation = self.common.config_generation.wrapping_add(1);
        Interrupt::new(
            self.msix.clone(),
            Vec::new(),
            self.common.msix_config,
            self.isr.clone(),
        )
        .config();
    }

    fn activate(&mut self) -> Result<(), String> {
        let event_idx = self.common.driver_features & crate::VIRTIO_RING_F_EVENT_IDX != 0;
        let bar = self.bar0();
        let mut queues = Vec::new();
        let mut events = Vec::new();
        for (i, q) in self.common.queues.iter_mut().enumerate() {
            if !q.ready() {
                continue;
            }
            if !q.is_valid(&*self.mem) {
                return Err(format!(
                    "queue {i} has an invalid size or ring address outside guest memory"
                ));
            }
            q.set_event_idx(event_idx);
            let event = EventFd::new(libc::EFD_NONBLOCK).map_err(|e| format!("eventfd: {e}"))?;
            let addr = bar + NOTIFY + i as u64 * u64::from(NOTIFY_MULTIPLIER);
            let doorbell = match self.hv.register_ioevent(&event, addr) {
                Ok(()) => Some(addr),
                Err(e) => {
                    crate::warn(
                        &self.name,
                        format_args!("no ioeventfd for queue {i} ({e}); notifications exit"),
                    );
                    None
                }
            };
            let dup = event.try_clone().map_err(|e| format!("eventfd: {e}"))?;
            // The device gets its own copy; ours keeps answering reads.
            let queue = Queue::try_from(q.state()).map_err(|e| format!("queue {i}: {e}"))?;
            events.push((i, dup, doorbell));
            queues.push(ActiveQueue {
                index: i,
                queue,
                event,
            });
        }
        let used_rings = self.common.queues.iter();
        let signals = Arc::new(Signals::new(
            self.mem.clone(),
            used_rings
                .map(|q| q.ready().then(|| q.used_ring()))
                .collect(),
        ));
        let interrupt = Interrupt::new(
            self.msix.clone(),
            self.common.queue_vectors.clone(),
            self.common.msix_config,
            self.isr.clone(),
        )
        .with_signals(signals.clone());
        self.live = Some(Live { events, signals });
        self.device
            .activate(Activation {
                mem: self.mem.clone(),
                features: self.common.driver_features,
                queues,
                interrupt,
            })
            .map_err(|e| e.to_string())
    }

    fn reset(&mut self) {
        self.device.reset();
        if let Some(live) = self.live.take() {
            for (_, fd, addr) in live.events {
                if let Some(a) = addr {
                    let _ = self.hv.unregister_ioevent(&fd, a);
                }
            }
        }
        let sizes = self.device.queue_max_sizes();
        self.common = Common::new(&sizes);
        self.isr.store(0, Ordering::SeqCst);
    }

    fn notify(&self, offset: u64) {
        let q = (offset / u64::from(NOTIFY_MULTIPLIER)) as usize;
        if let Some(live) = &self.live {
            if let Some((_, fd, _)) = live.events.iter().find(|(i, _, _)| *i == q) {
                let _ = fd.write(1);
            }
        }
    }

    /// The message control word of the MSI-X capability changed.
    fn sync_msix_control(&mut self) {
        let ctl = self.cfg.get(self.msix_cap + 3, 1)[0];
        lock(&self.msix).set_control(ctl & 0x80 != 0, ctl & 0x40 != 0);
    }

    /// The window of the PCI configuration access capability.
    fn pci_cfg_window(&self) -> (u8, u64, usize) {
        let c = self.pci_cfg_cap;
        let bar = self.cfg.get(c + 4, 1)[0];
        let off = from_le(self.cfg.get(c + 8, 4));
        let len = from_le(self.cfg.get(c + 12, 4)) as usize;
        (bar, off, len)
    }
}

/// A queue as the driver set it up, in a snapshot. Where the device is in
/// the ring is not kept: a paused device has completed everything it
/// took, so it resumes at the used ring's index.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueState {
    pub size: u16,
    pub ready: bool,
    pub desc_table: u64,
    pub avail_ring: u64,
    pub used_ring: u64,
    pub vector: u16,
}

/// A virtio PCI function in a snapshot: its PCI registers, what the
/// driver programmed through the common config, MSI-X, and the device's
/// own state.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VirtioPciState {
    pub device_type: u32,
    pub config: ConfigState,
    pub device_feature_select: u32,
    pub driver_feature_select: u32,
    pub driver_features: u64,
    pub msix_config: u16,
    pub status: u8,
    pub config_generation: u8,
    pub queue_select: u16,
    pub queues: Vec<QueueState>,
    pub isr: u8,
    pub msix: MsixState,
    pub device: DeviceState,
}

impl VirtioPci {
    /// Each live queue's rings, last interrupt and vector, as
    /// `GET /v1/domain/rings` reports them under the device id `id`.
    pub fn rings(&self, id: &str) -> Vec<domus_api::rings::RingInfo> {
        let Some(live) = &self.live else {
            return Vec::new();
        };
        crate::rings::report(
            id,
            &self.mem,
            &self.common.queues,
            &self.common.queue_vectors,
            self.common.driver_features & crate::VIRTIO_RING_F_EVENT_IDX != 0,
            &lock(&self.msix),
            &live.signals,
        )
    }

    /// See [`VirtioDevice::release_host`] (after [`VirtioPci::quiesce`]).
    pub fn release_host(&mut self) {
        self.device.release_host();
    }

    /// See [`VirtioDevice::announce`].
    pub fn announce(&self) -> std::io::Result<()> {
        self.device.announce()
    }

    /// See [`VirtioDevice::reclaim_host`].
    pub fn reclaim_host(&mut self) -> Result<(), String> {
        self.device.reclaim_host()
    }

    /// Stops the device for a snapshot: its threads end once every request
    /// they took from a queue is completed, and its doorbells are
    /// released; [`VirtioPci::resume`] starts it again. Returns what the
    /// device keeps beyond its queues, read before it stopped.
    pub fn quiesce(&mut self) -> DeviceState {
        let kept = self.device.state();
        self.device.reset();
        if let Some(live) = self.live.take() {
            for (_, fd, addr) in live.events {
                if let Some(a) = addr {
                    let _ = self.hv.unregister_ioevent(&fd, a);
                }
            }
        }
        kept
    }

    /// The function's state; `device` is what [`VirtioPci::quiesce`]
    /// returned.
    pub fn state(&self, device: DeviceState) -> VirtioPciState {
        let c = &self.common;
        VirtioPciState {
            device_type: self.device.device_type(),
            config: self.cfg.state(),
            device_feature_select: c.device_feature_select,
            driver_feature_select: c.driver_feature_select,
            driver_features: c.driver_features,
            msix_config: c.msix_config,
            status: c.status,
            config_generation: c.config_generation,
            queue_select: c.queue_select,
            queues: c
                .queues
                .iter()
                .zip(&c.queue_vectors)
                .map(|(q, v)| QueueState {
                    size: q.size(),
                    ready: q.ready(),
                    desc_table: q.desc_table(),
                    avail_ring: q.avail_ring(),
                    used_ring: q.used_ring(),
                    vector: *v,
                })
                .collect(),
            isr: self.isr.load(Ordering::SeqCst),
            msix: lock(&self.msix).state(),
            device,
        }
    }

    /// Puts a saved state on a stopped function built for the same device
    /// (call [`VirtioPci::resume`] next). Everything is checked against
    /// the device: a state that does not fit it is refused.
    pub fn restore(&mut self, s: &VirtioPciState) -> Result<(), String> {
        let sizes = self.device.queue_max_sizes();
        if s.device_type != self.device.device_type() || s.queues.len() != sizes.len() {
            return Err(format!(
                "{}: the snapshot holds another kind of device",
                self.name
            ));
        }
        if s.driver_features & !self.device_features != 0 {
            return Err(format!(
                "{}: the driver had features this device does not offer here ({:#x})",
                self.name,
                s.driver_features & !self.device_features
            ));
        }
        self.cfg
            .restore(&s.config)
            .map_err(|e| format!("{}: {e}", self.name))?;
        let nvec = lock(&self.msix).len();
        let vector = |v: u16| if usize::from(v) < nvec { v } else { NO_VECTOR };
        let mut c = Common::new(&sizes);
        for ((q, saved), max) in c.queues.iter_mut().zip(&s.queues).zip(&sizes) {
            if saved.size > *max {
                return Err(format!("{}: a queue larger than the device's", self.name));
            }
            q.set_size(saved.size);
            q.set_desc_table_address(
                Some(saved.desc_table as u32),
                Some((saved.desc_table >> 32) as u32),
            );
            q.set_avail_ring_address(
                Some(saved.avail_ring as u32),
                Some((saved.avail_ring >> 32) as u32),
            );
            q.set_used_ring_address(
                Some(saved.used_ring as u32),
                Some((saved.used_ring >> 32) as u32),
            );
            q.set_ready(saved.ready);
        }
        c.queue_vectors = s.queues.iter().map(|q| vector(q.vector)).collect();
        c.device_feature_select = s.device_feature_select;
        c.driver_feature_select = s.driver_feature_select;
        c.driver_features = s.driver_features;
        c.msix_config = vector(s.msix_config);
        c.status = s.status;
        c.config_generation = s.config_generation;
        c.queue_select = s.queue_select;
        self.common = c;
        self.isr.store(s.isr, Ordering::SeqCst);
        lock(&self.msix)
            .restore(&s.msix)
            .map_err(|e| format!("{}: {e}", self.name))?;
        self.device
            .restore(&s.device)
            .map_err(|e| format!("{}: {e}", self.name))
    }

    /// Starts a stopped device again if its driver had it running: each
    /// queue goes on from the used ring's index, and every queue is
    /// notified once, so requests the driver added while the device was
    /// stopped are seen.
    pub fn resume(&mut self) -> Result<(), String> {
        let st = self.common.status;
        if st & STATUS_DRIVER_OK == 0 || st & (STATUS_NEEDS_RESET | STATUS_FAILED) != 0 {
            return Ok(());
        }
        for (i, q) in self.common.queues.iter_mut().enumerate() {
            if !q.ready() {
                continue;
            }
            let used = q
                .used_idx(&*self.mem, std::sync::atomic::Ordering::Acquire)
                .map_err(|e| format!("{}: queue {i}: used ring: {e}", self.name))?;
            q.set_next_avail(used.0);
            q.set_next_used(used.0);
        }
        self.activate().map_err(|e| format!("{}: {e}", self.name))?;
        if let Some(live) = &self.live {
            for (_, fd, _) in &live.events {
                let _ = fd.write(1);
            }
        }
        Ok(())
    }
}

impl PciDevice for VirtioPci {
    fn unplug(&mut self) {
        self.reset();
        lock(&self.msix).release();
    }

    fn config_read(&mut self, reg: usize) -> u32 {
        if reg == self.pci_cfg_cap + 16 {
            let (bar, off, len) = self.pci_cfg_window();
            let mut b = [0u8; 4];
            if bar == 0 && matches!(len, 1 | 2 | 4) {
                self.bar_read(0, off, &mut b[..len]);
            }
            return u32::from_le_bytes(b);
        }
        self.cfg.read(reg)
    }

    fn config_write(&mut self, reg: usize, offset: usize, data: &[u8]) {
        if reg == self.pci_cfg_cap + 16 {
            let (bar, off, len) = self.pci_cfg_window();
            if bar == 0 && matches!(len, 1 | 2 | 4) && offset == 0 && data.len() >= len {
                self.bar_write(0, off, &data[..len]);
            }
            return;
        }
        self.cfg.write(reg, offset, data);
        if reg == self.msix_cap {
            self.sync_msix_control();
        }
    }

    fn bars(&self) -> Vec<(usize, u64, u64)> {
        self.cfg.bars()
    }

    fn bar_read(&mut self, bar: usize, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if bar != 0 || data.len() > 8 {
            return;
        }
        let end = offset.saturating_add(data.len() as u64);
        match offset {
            o if end <= COMMON + COMMON_LEN => self.read_common(o - COMMON, data),
            ISR => {
                // Reading the ISR clears it.
                data[0] = self.isr.swap(0, Ordering::SeqCst);
            }
            o if o >= DEVICE_CFG && end <= DEVICE_CFG + DEVICE_CFG_LEN => {
                self.device.read_config(o - DEVICE_CFG, data)
            }
            o if (MSIX_TABLE..MSIX_PBA).contains(&o) => {
                lock(&self.msix).table_read(o - MSIX_TABLE, data)
            }
            o if o >= MSIX_PBA && end <= MSIX_PBA + 8 => {
                lock(&self.msix).pba_read(o - MSIX_PBA, data)
            }
            _ => {}
        }
    }

    fn bar_write(&mut self, bar: usize, offset: u64, data: &[u8]) {
        if bar != 0 || data.is_empty() || data.len() > 8 {
            return;
        }
        let end = offset.saturating_add(data.len() as u64);
        match offset {
            o if end <= COMMON + COMMON_LEN => self.write_common(o - COMMON, data),
            o if o >= DEVICE_CFG && end <= DEVICE_CFG + DEVICE_CFG_LEN => {
                self.device.write_config(o - DEVICE_CFG, data)
            }
            o if o >= NOTIFY && end <= NOTIFY + NOTIFY_LEN => self.notify(o - NOTIFY),
            o if (MSIX_TABLE..MSIX_PBA).contains(&o) => {
                lock(&self.msix).table_write(o - MSIX_TABLE, data)
            }
            _ => {}
        }
    }
}

/// How many MSI-X vectors a device with `queues` queues gets.
pub fn vectors_for(queues: usize) -> usize {
    (queues + 1).min(msix::MAX_VECTORS)
}
