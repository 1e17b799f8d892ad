//! Platform devices of a Domus domain, each a plain state machine behind the
//! [`PioDevice`] trait, and the port I/O bus that routes vCPU exits to them.
//! Nothing here knows about KVM; interrupts go out through
//! [`serial::EventFdTrigger`] (an eventfd the VMM wires to an irqfd).

pub mod bus;
pub mod hotplug;
pub mod pci;
pub mod platform;
pub mod serial;

pub use bus::{PioBus, PioDevice};

/// What a guest asked the platform to do, reported by a device write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuestEvent {
    /// ACPI S5 (`poweroff`).
    PowerOff,
    /// A reset: ACPI reset register, i8042 pulse, port 0xcf9, or a triple fault.
    Reset,
    /// The kernel panicked and said so through pvpanic.
    Panic,
}
