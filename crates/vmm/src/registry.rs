//! The domain's devices as its control plane sees them: one [`Device`] entry
//! per device (name, PCI slot, kind, facts, counters, rate limiter), the
//! names the guest gives them, and the [`Hotplug`] interface the VMM
//! implements (`hotplug.rs`) and the API calls (`api.rs`). Both sides depend
//! on this module and not on each other.

use std::sync::Arc;

use std::sync::Mutex;

use domus_api::spec::{DiskSpec, NetSpec};
use domus_virtio::pci::VirtioPci;
use domus_virtio::ratelimit::Shared;
use domus_virtio::Stats;
use serde_json::Value;

/// One device as the control plane shows it.
#[derive(Clone)]
pub struct Device {
    /// The name in URLs: `vda`, `vdb`, ... for disks, `rng0`, `balloon0`.
    pub id: String,
    /// Its PCI slot.
    pub slot: usize,
    /// `block`, `rng`, `balloon`.
    pub kind: &'static str,
    /// Extra fixed facts (path, read-only, ...).
    pub info: Value,
    pub stats: Arc<dyn Stats>,
    pub limiter: Option<Arc<Shared>>,
    /// What a snapshot needs of it: how to build it again and its
    /// transport (None only for stand-ins in tests).
    pub function: Option<Function>,
}

/// A device's PCI function and what it was made from.
#[derive(Clone)]
pub struct Function {
    pub spec: DeviceSpec,
    pub transport: Arc<Mutex<VirtioPci>>,
}

/// What a device is made from, as a snapshot keeps it: a restore builds
/// the same device again from it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, tag = "kind", rename_all = "snake_case")]
pub enum DeviceSpec {
    Block { disk: DiskSpec },
    Net { net: NetSpec },
    Vsock { cid: u64 },
    Rng,
    Balloon,
}

/// A device to hot-plug, in the syntax of `domus run`'s options.
#[derive(Debug)]
pub enum Plug {
    Disk(DiskSpec),
    Net(NetSpec),
}

/// Adds devices to the running domain and asks the guest to let go of
/// them (the VMM implements it; see `hotplug.rs`).
pub trait Hotplug: Send + Sync {
    /// Plugs a device named `id`; returns its API entry (with its slot).
    fn plug(&self, id: String, what: &Plug) -> Result<Device, String>;
    /// Asks the guest to release the device in `slot`; it goes away when
    /// the guest has.
    fn unplug(&self, slot: usize) -> Result<(), String>;
}

/// The lowest name `prefix`N (or, for disks, vdX) no device has: the name
/// the guest's driver gives the new device too (it takes the lowest free
/// index).
pub fn free_name(devices: &[Device], disk: bool) -> String {
    (0..)
        .map(|i| {
            if disk {
                disk_name(i)
            } else {
                format!("net{i}")
            }
        })
        .find(|n| devices.iter().all(|d| &d.id != n))
        .unwrap_or_default()
}

/// The name the guest gives the `i`th virtio disk: vda, ..., vdz, vdaa, ...
pub fn disk_name(i: usize) -> String {
    let mut n = String::new();
    let mut i = i + 1;
    while i > 0 {
        i -= 1;
        n.insert(0, (b'a' + (i % 26) as u8) as char);
        i /= 26;
    }
    format!("vd{n}")
}
