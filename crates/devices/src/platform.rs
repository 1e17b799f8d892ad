//! The small devices a stock kernel uses to stop: the ACPI sleep and reset
//! registers of a hardware-reduced platform, the i8042 reset line, the PCI
//! reset control register (0xcf9) and pvpanic; and the one the host uses to
//! ask it to stop: the ACPI Generic Event Device behind the power button.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use vmm_sys_util::eventfd::EventFd;

use crate::{GuestEvent, PioDevice};

/// Base of the ACPI power-management ports: sleep control, sleep status, reset.
pub const ACPI_PM_BASE: u16 = 0x600;
pub const ACPI_SLEEP_CONTROL: u16 = ACPI_PM_BASE;
pub const ACPI_SLEEP_STATUS: u16 = ACPI_PM_BASE + 1;
pub const ACPI_RESET: u16 = ACPI_PM_BASE + 2;
pub const ACPI_RESET_VALUE: u8 = 1;
pub const I8042_BASE: u16 = 0x60;
pub const PVPANIC_PORT: u16 = 0x505;
/// The Generic Event Device's event port and interrupt.
pub const GED_PORT: u16 = 0x608;
pub const GED_GSI: u32 = 5;

/// ACPI sleep control (offset 0), sleep status (1) and reset (2) registers.
pub struct AcpiPm {
    s5_type: u8,
}

impl AcpiPm {
    /// `s5_type` is the SLP_TYP the DSDT's `_S5_` object announces.
    pub fn new(s5_type: u8) -> Self {
        Self { s5_type }
    }
}

const SLP_EN: u8 = 1 << 5;
const WAK_STS: u8 = 1 << 7;

impl PioDevice for AcpiPm {
    fn read(&mut self, offset: u16, data: &mut [u8]) {
        data.fill(0);
        if offset == 1 {
            // Sleep status: WAK_STS set, so a guest that polls it after a
            // sleep request it does not expect to return from sees "woken".
            data[0] = WAK_STS;
        }
    }

    fn write(&mut self, offset: u16, data: &[u8]) -> Option<GuestEvent> {
        let v = data[0];
        match offset {
            0 if v & SLP_EN != 0 && (v >> 2) & 7 == self.s5_type => Some(GuestEvent::PowerOff),
            2 if v == ACPI_RESET_VALUE => Some(GuestEvent::Reset),
            _ => None,
        }
    }
}

/// The i8042 controller's ports 0x60..0x64, only as far as the reset line:
/// command 0xfe on the command port pulses the CPU reset.
pub struct I8042;

impl PioDevice for I8042 {
    fn read(&mut self, _offset: u16, data: &mut [u8]) {
        // Status 0: input buffer empty, so kb_wait() does not spin.
        data.fill(0);
    }

    fn write(&mut self, offset: u16, data: &[u8]) -> Option<GuestEvent> {
        (offset == 4 && data[0] == 0xfe).then_some(GuestEvent::Reset)
    }
}

/// Reset control register (0xcf9, inside the PCI config ports, see
/// [`crate::pci::PciConfigIo`]): bit 2 (RST_CPU) requests a reset.
pub struct ResetControl {
    value: u8,
}

impl ResetControl {
    pub fn new() -> Self {
        Self { value: 0 }
    }
}

impl Default for ResetControl {
    fn default() -> Self {
        Self::new()
    }
}

impl PioDevice for ResetControl {
    fn read(&mut self, _offset: u16, data: &mut [u8]) {
        data.fill(0);
        data[0] = self.value;
    }

    fn write(&mut self, _offset: u16, data: &[u8]) -> Option<GuestEvent> {
        self.value = data[0] & 0x0e;
        (data[0] & 0x04 != 0).then_some(GuestEvent::Reset)
    }
}

/// pvpanic (QEMU0001): reading gives the events supported, writing bit 0
/// reports a guest panic.
pub struct PvPanic;

pub const PVPANIC_PANICKED: u8 = 1;
pub const PVPANIC_CRASH_LOADED: u8 = 2;

impl PioDevice for PvPanic {
    fn read(&mut self, _offset: u16, data: &mut [u8]) {
        data.fill(0);
        data[0] = PVPANIC_PANICKED | PVPANIC_CRASH_LOADED;
    }

    fn write(&mut self, _offset: u16, data: &[u8]) -> Option<GuestEvent> {
        (data[0] & PVPANIC_PANICKED != 0).then_some(GuestEvent::Panic)
    }
}

/// The host's side of the Generic Event Device: it raises events (the
/// power button) for the guest's `_EVT` method to collect.
pub struct GedEvents {
    pending: AtomicU8,
    irq: EventFd,
}

impl GedEvents {
    /// `irq` is an eventfd wired to the GED's GSI (a KVM irqfd).
    pub fn new(irq: EventFd) -> Arc<Self> {
        Arc::new(Self {
            pending: AtomicU8::new(0),
            irq,
        })
    }

    /// Marks `events` (bits of the event port) pending and interrupts the
    /// guest.
    pub fn raise(&self, events: u8) -> std::io::Result<()> {
        self.pending.fetch_or(events, Ordering::SeqCst);
        self.irq.write(1)
    }
}

/// The Generic Event Device's event port: a read returns the pending events
/// and clears them; writes are ignored.
pub struct Ged(pub Arc<GedEvents>);

impl PioDevice for Ged {
    fn read(&mut self, offset: u16, data: &mut [u8]) {
        data.fill(0);
        if offset == 0 {
            data[0] = self.0.pending.swap(0, Ordering::SeqCst);
        }
    }

    fn write(&mut self, _offset: u16, _data: &[u8]) -> Option<GuestEvent> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acpi_s5_powers_off_only_with_slp_en_and_s5_type() {
        let mut pm = AcpiPm::new(5);
        assert_eq!(
            pm.write(0, &[(5 << 2) | SLP_EN]),
            Some(GuestEvent::PowerOff)
        );
        assert_eq!(pm.write(0, &[5 << 2]), None, "SLP_EN clear");
        assert_eq!(pm.write(0, &[(3 << 2) | SLP_EN]), None, "S3 is not S5");
        assert_eq!(pm.write(2, &[ACPI_RESET_VALUE]), Some(GuestEvent::Reset));
        assert_eq!(pm.write(2, &[0]), None);
        let mut b = [0u8];
        pm.read(1, &mut b);
        assert_eq!(b[0], WAK_STS);
    }

    #[test]
    fn i8042_resets_on_0xfe_to_command_port() {
        assert_eq!(I8042.write(4, &[0xfe]), Some(GuestEvent::Reset));
        assert_eq!(I8042.write(0, &[0xfe]), None);
        assert_eq!(I8042.write(4, &[0xd1]), None);
    }

    #[test]
    fn cf9_reset() {
        let mut r = ResetControl::new();
        assert_eq!(r.write(0, &[0x02]), None);
        let mut b = [0u8];
        r.read(0, &mut b);
        assert_eq!(b[0], 0x02);
        assert_eq!(r.write(0, &[0x06]), Some(GuestEvent::Reset));
    }

    #[test]
    fn pvpanic_reports_panics() {
        let mut b = [0u8];
        PvPanic.read(0, &mut b);
        assert_eq!(b[0] & PVPANIC_PANICKED, PVPANIC_PANICKED);
        assert_eq!(
            PvPanic.write(0, &[PVPANIC_PANICKED]),
            Some(GuestEvent::Panic)
        );
        assert_eq!(PvPanic.write(0, &[PVPANIC_CRASH_LOADED]), None);
    }

    #[test]
    fn ged_events_are_read_once_and_interrupt() {
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let events = GedEvents::new(irq.try_clone().unwrap());
        let mut ged = Ged(events.clone());
        let mut b = [0xffu8];
        ged.read(0, &mut b);
        assert_eq!(b[0], 0, "nothing pending");
        events.raise(1).unwrap();
        assert_eq!(irq.read().unwrap(), 1);
        ged.read(0, &mut b);
        assert_eq!(b[0], 1);
        ged.read(0, &mut b);
        assert_eq!(b[0], 0, "a read clears");
        assert_eq!(ged.write(0, &[1]), None);
    }
}
