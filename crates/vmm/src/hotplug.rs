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

use domus_api::spec::{DiskSpec, NetSpec};
use domus_boot::layout;
use domus_devices::bus::lock;
use domus_devices::hotplug::PciHotplug;
use domus_devices::pci::PciBus;
use domus_virtio::balloon::{Balloon, BalloonHandle};
use domus_virtio::block::Block;
use domus_virtio::net::Net;
use domus_virtio::pci::{vectors_for, VirtioPci, BAR_SIZE};
use domus_virtio::rng::Rng;
use domus_virtio::vsock::Vsock;
use domus_virtio::{Hypervisor, Memory, VirtioDevice};

use crate::config::{disk_config, net_config};
use crate::irq::KvmIrqs;
use domus_jail::fdpass::Inbox;

/// The descriptor passed with `tag` for `what`.
pub(crate) fn passed(inbox: Option<&Inbox>, tag: u64, what: &str) -> Result<std::os::fd::OwnedFd> {
    let inbox = inbox.ok_or_else(|| {
        Error::Devices(format!(
            "{what}: a passed descriptor, but this VMM has no descriptor socket (JailSpec fd_socket)"
        ))
    })?;
    inbox
        .take(tag, PASSED_WAIT)
        .ok_or_else(|| Error::Devices(format!("{what}: no descriptor was passed with tag {tag}")))
}

/// A disk's chain from the descriptors the supervisor passed: link `i` is
/// the one tagged `tags[i]`.
struct PassedChain<'a> {
    inbox: Option<&'a Inbox>,
    tags: Vec<u64>,
}

impl domus_disk::Opener for PassedChain<'_> {
    fn open(
        &mut self,
        path: &std::path::Path,
        link: usize,
        _write: bool,
    ) -> std::result::Result<std::fs::File, domus_disk::Error> {
        let refused = |reason: String| domus_disk::Error::Refused {
            path: path.display().to_string(),
            reason,
        };
        let tag = *self.tags.get(link).ok_or_else(|| {
            refused(format!(
                "no descriptor was passed for link {link} of the chain (a jailed VMM opens no files)"
            ))
        })?;
        passed(self.inbox, tag, &format!("disk {}", path.display()))
            .map(Into::into)
            .map_err(|e| refused(e.to_string()))
    }
}

/// How long a plug waits for the descriptor its request names.
const PASSED_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
use crate::registry::{self, DeviceSpec, Function, Plug};
use crate::{Error, Result};

/// A device, its API entry, and the balloon's handle if it is the balloon.
type Built = (
    Box<dyn VirtioDevice>,
    registry::Device,
    Option<Arc<BalloonHandle>>,
);

/// A device built from its spec, and its API entry (`id` is its name:
/// vda, net0, rng0, ...; its slot and function are set when it is
/// plugged). A disk or tap whose descriptor was passed (`passed`) is taken
/// from `inbox`.
pub fn build(
    spec: &DeviceSpec,
    id: String,
    inbox: Option<&Inbox>,
    mem: &Arc<Memory>,
) -> Result<Built> {
    let entry = |kind, info, stats, limiter| registry::Device {
        id,
        slot: 0,
        kind,
        info,
        stats,
        limiter,
        function: None,
    };
    let (dev, e): (Box<dyn VirtioDevice>, _) = match spec {
        DeviceSpec::Block { disk } => {
            let d = disk_config(disk);
            let b = match d.passed {
                None => Block::open(&d)?,
                Some(tag) => {
                    let mut tags = vec![tag];
                    tags.extend(&d.passed_backing);
                    Block::open_with(&d, &mut PassedChain { inbox, tags })?
                }
            };
            let (stats, limiter) = b.handles();
            let info = serde_json::json!({
                "path": d.path.display().to_string(),
                "read_only": d.read_only,
                "serial": d.id,
                "sectors": b.capacity(),
            });
            let e = entry("block", info, stats, Some(limiter));
            (Box::new(b), e)
        }
        DeviceSpec::Net { net } => {
            let n = net_config(net);
            let dev = match n.passed {
                None => Net::open(&n)?,
                Some(tag) => {
                    Net::with_tun(&n, passed(inbox, tag, &format!("tap {}", n.tap))?.into())?
                }
            };
            let (stats, limiter) = dev.handles();
            let info = serde_json::json!({
                "tap": n.tap,
                "mac": domus_virtio::net::format_mac(&dev.mac()),
                "backend": "userspace",
            });
            let e = entry("net", info, stats, Some(limiter));
            (Box::new(dev), e)
        }
        DeviceSpec::Vsock { cid } => {
            let v = Vsock::new(*cid, mem.clone())?;
            let info = serde_json::json!({"cid": v.cid(), "backend": "vhost-vsock"});
            let e = entry("vsock", info, v.counters(), None);
            (Box::new(v), e)
        }
        DeviceSpec::Rng => {
            let r = Rng::new();
            let info = serde_json::json!({"source": "getrandom"});
            let e = entry("rng", info, r.counters(), None);
            (Box::new(r), e)
        }
        DeviceSpec::Balloon => {
            let b = Balloon::new().map_err(|e| Error::Io("creating the balloon", e))?;
            let info = serde_json::json!({"free_page_reporting": true, "statistics": true});
            let e = entry("balloon", info, b.handle(), None);
            let h = b.handle();
            return Ok((Box::new(b), e, Some(h)));
        }
    };
    Ok((dev, e, None))
}

/// The spec a snapshot keeps for a device: a tap's MAC is written out (a
/// restored guest keeps its address whatever its tap is called), and a
/// passed descriptor is not (a restore opens the path itself).
pub fn saved_spec(spec: &DeviceSpec, info: &serde_json::Value) -> DeviceSpec {
    match spec {
        DeviceSpec::Block { disk } => DeviceSpec::Block {
            disk: DiskSpec {
                passed: None,
                passed_backing: Vec::new(),
                ..disk.clone()
            },
        },
        DeviceSpec::Net { net } => DeviceSpec::Net {
            net: NetSpec {
                passed: None,
                mac: info["mac"].as_str().map(str::to_owned).or(net.mac.clone()),
                ..net.clone()
            },
        },
        other => other.clone(),
    }
}

/// Wraps `dev` as a virtio PCI function and puts it on the bus: in `slot`
/// if given (a restore), else the next free one, with its BAR at the
/// slot's place in the MMIO window (the guest may move it) and its MSI-X
/// vectors. Returns the slot and the function.
pub fn plug(
    bus: &PciBus,
    irqs: &Arc<KvmIrqs>,
    mem: &Arc<Memory>,
    name: String,
    dev: Box<dyn VirtioDevice>,
    slot: Option<usize>,
) -> Result<(usize, Arc<Mutex<VirtioPci>>)> {
    let slot = match slot {
        Some(s) => s,
        None => bus
            .free_slot()
            .ok_or_else(|| Error::Devices("no free PCI slot".into()))?,
    };
    let bar = layout::PCI_MMIO_BASE + (slot as u32).saturating_sub(1) * BAR_SIZE;
    let vectors = irqs
        .vectors(vectors_for(dev.queue_max_sizes().len()))
        .map_err(|e| Error::Io("setting up MSI-X vectors", e))?;
    let hv: Arc<dyn Hypervisor> = irqs.clone();
    let pci = Arc::new(Mutex::new(VirtioPci::new(
        name,
        dev,
        bar,
        vectors,
        mem.clone(),
        hv,
    )));
    bus.add_at(slot, pci.clone())
        .map_err(|e| Error::Devices(e.to_string()))?;
    Ok((slot, pci))
}

/// A device built, plugged and named: its API entry, and the balloon's
/// handle if it is the balloon.
pub struct Plugged {
    pub entry: registry::Device,
    pub balloon: Option<Arc<BalloonHandle>>,
}

/// Where devices are plugged.
pub struct Board<'a> {
    pub bus: &'a PciBus,
    pub irqs: &'a Arc<KvmIrqs>,
    pub mem: &'a Arc<Memory>,
    pub inbox: Option<&'a Inbox>,
}

/// Builds the device `spec` and plugs it (see [`build`] and [`plug`]).
pub fn build_and_plug(
    spec: &DeviceSpec,
    id: String,
    slot: Option<usize>,
    at: &Board<'_>,
) -> Result<Plugged> {
    let (dev, mut entry, balloon) = build(spec, id.clone(), at.inbox, at.mem)?;
    let (slot, transport) = plug(at.bus, at.irqs, at.mem, id, dev, slot)?;
    entry.slot = slot;
    entry.function = Some(Function {
        spec: saved_spec(spec, &entry.info),
        transport,
    });
    Ok(Plugged { entry, balloon })
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
        let spec = match what {
            Plug::Disk(d) => DeviceSpec::Block { disk: d.clone() },
            Plug::Net(n) => DeviceSpec::Net { net: n.clone() },
        };
        let board = Board {
            bus: &self.bus,
            irqs: &self.irqs,
            mem: &self.mem,
            inbox: self.inbox.as_deref(),
        };
        let entry = build_and_plug(&spec, id, None, &board)
            .map_err(|e| e.to_string())?
            .entry;
        if let Err(e) = self.ports.plugged(entry.slot) {
            self.bus.remove(entry.slot);
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
