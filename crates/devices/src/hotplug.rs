//! ACPI PCI hot-plug registers, as the DSDT's `\_SB.PCI0.PCNT` and the
//! slots' `_EJ0` methods use them: three dwords from [`PCI_HOTPLUG_PORT`].
//!
//! | offset | name | access |
//! | --- | --- | --- |
//! | 0 | PCIU | read: slots where a device arrived since the last read (clears) |
//! | 4 | PCID | read: slots whose device the host asks the guest to let go (clears) |
//! | 8 | PCEJ | write: slots the guest has let go (a slot's `_EJ0`) |
//!
//! The host side ([`PciHotplug::plugged`], [`PciHotplug::unplug_request`])
//! sets bits and raises the Generic Event Device's hot-plug event; the guest
//! writing PCEJ hands the slot to the `eject` callback, which takes the
//! device off the bus.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::platform::GedEvents;
use crate::{GuestEvent, PioDevice};

pub const PCI_HOTPLUG_PORT: u16 = 0x610;
pub const PCI_HOTPLUG_LEN: u16 = 12;

/// The Generic Event Device's bit for "look at the PCI hot-plug registers".
pub const GED_PCI_HOTPLUG: u8 = 2;

pub struct PciHotplug {
    up: AtomicU32,
    down: AtomicU32,
    events: Arc<GedEvents>,
    eject: Box<dyn Fn(usize) + Send + Sync>,
}

/// The bit of `slot`, for slots 1..=31 (slot 0 is the host bridge).
fn bit(slot: usize) -> Option<u32> {
    (1..32).contains(&slot).then(|| 1u32 << slot)
}

impl PciHotplug {
    pub fn new(events: Arc<GedEvents>, eject: Box<dyn Fn(usize) + Send + Sync>) -> Arc<Self> {
        Arc::new(Self {
            up: AtomicU32::new(0),
            down: AtomicU32::new(0),
            events,
            eject,
        })
    }

    /// A device now sits in `slot`: tell the guest to look.
    pub fn plugged(&self, slot: usize) -> std::io::Result<()> {
        let b = bit(slot).ok_or_else(|| std::io::Error::other("no such slot"))?;
        self.up.fetch_or(b, Ordering::SeqCst);
        self.events.raise(GED_PCI_HOTPLUG)
    }

    /// Ask the guest to let go of the device in `slot`; it is removed when
    /// the guest's `_EJ0` says so.
    pub fn unplug_request(&self, slot: usize) -> std::io::Result<()> {
        let b = bit(slot).ok_or_else(|| std::io::Error::other("no such slot"))?;
        self.down.fetch_or(b, Ordering::SeqCst);
        self.events.raise(GED_PCI_HOTPLUG)
    }
}

/// The guest's view: a port I/O device at [`PCI_HOTPLUG_PORT`].
pub struct HotplugPorts(pub Arc<PciHotplug>);

impl PioDevice for HotplugPorts {
    fn read(&mut self, offset: u16, data: &mut [u8]) {
        data.fill(0);
        let reg = match offset {
            0 => &self.0.up,
            4 => &self.0.down,
            _ => return,
        };
        // Whole-dword reads (the DSDT's DWordAcc fields) take and clear the
        // bitmap; anything else only peeks.
        let v = if data.len() == 4 {
            reg.swap(0, Ordering::SeqCst)
        } else {
            reg.load(Ordering::SeqCst)
        };
        let b = v.to_le_bytes();
        let n = data.len().min(4);
        data[..n].copy_from_slice(&b[..n]);
    }

    fn write(&mut self, offset: u16, data: &[u8]) -> Option<GuestEvent> {
        if offset != 8 || data.len() != 4 {
            return None;
        }
        let v = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
        for slot in 1..32 {
            if v & (1 << slot) != 0 {
                (self.0.eject)(slot);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use vmm_sys_util::eventfd::EventFd;

    #[test]
    fn plug_and_eject_go_through_the_ports() {
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let events = GedEvents::new(irq.try_clone().unwrap());
        let ejected = Arc::new(Mutex::new(Vec::new()));
        let e = ejected.clone();
        let hp = PciHotplug::new(events.clone(), Box::new(move |s| e.lock().unwrap().push(s)));
        let mut ports = HotplugPorts(hp.clone());
        hp.plugged(3).unwrap();
        assert_eq!(irq.read().unwrap(), 1, "the GED interrupt fired");
        let mut ged = crate::platform::Ged(events);
        let mut g = [0u8];
        ged.read(0, &mut g);
        assert_eq!(g[0], GED_PCI_HOTPLUG);
        let mut d = [0u8; 4];
        ports.read(0, &mut d);
        assert_eq!(u32::from_le_bytes(d), 1 << 3);
        ports.read(0, &mut d);
        assert_eq!(u32::from_le_bytes(d), 0, "a read clears");
        hp.unplug_request(3).unwrap();
        let mut b = [0u8; 1];
        ports.read(4, &mut b);
        assert_eq!(b[0], 1 << 3, "a byte read peeks");
        ports.read(4, &mut d);
        assert_eq!(u32::from_le_bytes(d), 1 << 3);
        // The guest's _EJ0; slot 0 (the host bridge) is never ejected.
        assert_eq!(ports.write(8, &(1u32 << 3 | 1).to_le_bytes()), None);
        ports.write(8, &[0xff]);
        assert_eq!(*ejected.lock().unwrap(), vec![3]);
        assert!(hp.plugged(0).is_err());
        assert!(hp.plugged(32).is_err());
    }
}
