//! Everything that must be in guest memory before the first vCPU instruction:
//! the kernel image, the initrd, the command line, the Linux zero page with its
//! e820 map, ACPI tables, and the GDT and page tables of 64-bit mode.
//!
//! Nothing here touches KVM: the crate writes bytes into a `GuestMemoryMmap` and
//! returns plain values the VMM turns into register state, so all of it can be
//! unit-tested without privileges.

pub mod acpi;
pub mod aml;
pub mod kernel;
pub mod layout;
pub mod longmode;
pub mod params;

pub use vm_memory::GuestMemoryMmap;
