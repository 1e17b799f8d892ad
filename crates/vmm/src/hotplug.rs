//! Putting virtio devices on the PCI bus: at boot for the configured ones,
//! and while the guest runs (hot-plug) for disks and interfaces added
//! through the API.
//!
//! A hot-added device goes into a free slot and the guest hears of it
//! through ACPI: the Generic Event Device's PCI hot-plug event makes it run
//! `\_SB.PCI0.PCNT`, which notifies the slot, and the guest's acpiphp
//! driver scans it. An unplug asks the guest to let go (Eject Request); the
//! device leaves the bus only when the guest's `_EJ0` says so, so a guest
//! never loses a device it is still using.

use std::sync::{Arc, Mutex};

use domus_boot::layout;
use domus_devices::bus::lock;
use domus_devices::hotplug::PciHotplug;
use domus_devices::pci::PciBus;
use domus_virtio::block::{Block, DiskConfig};
use domus_virtio::net::{Net, NetConfig};
use domus_virtio::pci::{vectors_for, VirtioPci, BAR_SIZE};
use domus_virtio::{Hypervisor, Memory, VirtioDevice};

use crate::irq::KvmIrqs;
use domus_jail::fdpass::Inbox;

/// The descriptor passed with `tag` for `what`.
fn passed(inbox: Option<&Inbox>, tag: u64, what: &str) -> Result<std::os::fd::OwnedFd> {
    let inbox = inbox.ok_or_else(|| {
        Error::Devices(format!(
            "{what}: a passed descriptor, but this VMM has no descriptor socket (JailSpec fd_socket)"
        ))
    })?;
    inbox
        .take(tag, PASSED_WAIT)
        .ok_or_else(|| Error::Devices(format!("{what}: no descriptor was passed with tag {tag}")))
}

/// How long a plug waits for the descriptor its request names.
const PASSED_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
use crate::registry::{self, Plug};
use crate::{Error, Result};

/// A disk's device and its API entry (`id` is its name, vda, vdb, ...).
/// A disk whose descriptor was passed (`d.passed`) is taken from `inbox`.
pub fn disk_device(
    d: &DiskConfig,
    id: String,
    inbox: Option<&Inbox>,
) -> Result<(Box<dyn VirtioDevice>, registry::Device)> {
    let b = match d.passed {
        None => Block::open(d)?,
        Some(tag) => {
            let what = format!("disk {}", d.path.display());
            Block::with_file(d, passed(inbox, tag, &what)?.into())?
        }
    };
    let (disk, limiter) = b.handles();
    let info = serde_json::json!({
        "path": d.path.display().to_string(),
        "read_only": d.read_only,
        "serial": d.id,
        "sectors": b.capacity(),
    });
    let a = registry::Device {
        id,
        slot: 0,
        kind: "block",
        info,
        stats: disk,
        limiter: Some(limiter),
    };
    Ok((Box::new(b), a))
}

/// An interface's device and its API entry (`id`: net0, net1, ...).
/// An interface whose /dev/net/tun descriptor was passed (`n.passed`) is
/// taken from `inbox`.
pub fn net_device(
    n: &NetConfig,
    id: String,
    inbox: Option<&Inbox>,
) -> Result<(Box<dyn VirtioDevice>, registry::Device)> {
    let net = match n.passed {
        None => Net::open(n)?,
        Some(tag) => Net::with_tun(n, passed(inbox, tag, &format!("tap {}", n.tap))?.into())?,
    };
    let (counters, limiter) = net.handles();
    let a = registry::Device {
        id,
        slot: 0,
        kind: "net",
        info: serde_json::json!({
            "tap": n.tap,
            "mac": domus_virtio::net::format_mac(&net.mac()),
            "backend": "userspace",
        }),
        stats: counters,
        limiter: Some(limiter),
    };
    Ok((Box::new(net), a))
}

/// Wraps `dev` as a virtio PCI function and puts it in the bus's next free
/// slot, with its BAR at the slot's place in the MMIO window (the guest
/// may move it) and its MSI-X vectors; returns the slot.
pub fn plug(
    bus: &PciBus,
    irqs: &Arc<KvmIrqs>,
    mem: &Arc<Memory>,
    name: String,
    dev: Box<dyn VirtioDevice>,
) -> Result<usize> {
    let slot = bus
        .free_slot()
        .ok_or_else(|| Error::Devices("no free PCI slot".into()))?;
    let bar = layout::PCI_MMIO_BASE + (slot as u32 - 1) * BAR_SIZE;
    let vectors = irqs
        .vectors(vectors_for(dev.queue_max_sizes().len()))
        .map_err(|e| Error::Io("setting up MSI-X vectors", e))?;
    let hv: Arc<dyn Hypervisor> = irqs.clone();
    let pci = VirtioPci::new(name, dev, bar, vectors, mem.clone(), hv);
    bus.add(Arc::new(Mutex::new(pci)))
        .map_err(|e| Error::Devices(e.to_string()))
}

/// Hot-plug for the API: adds devices to the running domain.
pub struct VmHotplug {
    pub bus: Arc<PciBus>,
    pub irqs: Arc<KvmIrqs>,
    pub mem: Arc<Memory>,
    pub ports: Arc<PciHotplug>,
    /// Serialises plugs, so a free slot found is still free when taken.
    pub plugging: Mutex<()>,
    /// Descriptors the supervisor passes a jailed VMM (hot-plugged disks).
    pub inbox: Option<Arc<Inbox>>,
}

impl registry::Hotplug for VmHotplug {
    fn plug(&self, id: String, what: &Plug) -> std::result::Result<registry::Device, String> {
        let _one = lock(&self.plugging);
        let (dev, mut entry) = match what {
            Plug::Disk(d) => disk_device(d, id.clone(), self.inbox.as_deref()),
            Plug::Net(n) => net_device(n, id.clone(), self.inbox.as_deref()),
        }
        .map_err(|e| e.to_string())?;
        let slot = plug(&self.bus, &self.irqs, &self.mem, id, dev).map_err(|e| e.to_string())?;
        entry.slot = slot;
        if let Err(e) = self.ports.plugged(slot) {
            self.bus.remove(slot);
            return Err(format!("telling the guest: {e}"));
        }
        Ok(entry)
    }

    fn unplug(&self, slot: usize) -> std::result::Result<(), String> {
        self.ports
            .unplug_request(slot)
            .map_err(|e| format!("telling the guest: {e}"))
    }
}

/// The eject callback: the guest let go of the device in `slot`.
pub fn ejected(bus: &PciBus, devices: &Mutex<Vec<registry::Device>>, slot: usize) {
    if bus.remove(slot) {
        lock(devices).retain(|d| d.slot != slot);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_dsdt_and_the_ports_agree_on_the_hotplug_event() {
        assert_eq!(
            domus_boot::acpi::GED_PCI_HOTPLUG,
            domus_devices::hotplug::GED_PCI_HOTPLUG
        );
    }
}
