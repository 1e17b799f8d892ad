//! Guest physical address layout of a Domus domain (x86_64).
//!
//! ```text
//! 0x0000_0500  GDT                 0x0000_0520  IDT (empty)
//! 0x0000_7000  Linux zero page     0x0000_8ff0  boot stack top
//! 0x0000_9000  PML4, PDPT, PD      0x0002_0000  kernel command line
//! 0x0009_fc00  EBDA (not RAM)      0x000e_0000  ACPI: RSDP, XSDT, FADT, DSDT, MADT
//! 0x000f_fff0  reset vector: a jump to the i8042 reset (BIOS-style reboots)
//! 0x0010_0000  kernel (bzImage protected-mode part; vmlinux at its own address)
//! ...          initrd at the top of low RAM
//! 0xc000_0000  MMIO hole up to 4 GiB (IOAPIC, LAPIC, KVM's TSS)
//! 0x1_0000_0000 RAM above 3 GiB continues here
//! ```

pub const GDT_ADDR: u64 = 0x500;
pub const IDT_ADDR: u64 = 0x520;
pub const ZERO_PAGE_ADDR: u64 = 0x7000;
pub const BOOT_STACK: u64 = 0x8ff0;
pub const PML4_ADDR: u64 = 0x9000;
pub const PDPT_ADDR: u64 = 0xa000;
pub const PD_ADDR: u64 = 0xb000;
pub const CMDLINE_ADDR: u64 = 0x20000;
/// Linux's COMMAND_LINE_SIZE on x86, terminating NUL included.
pub const CMDLINE_MAX: usize = 2048;
pub const EBDA_START: u64 = 0x9fc00;
pub const ACPI_START: u64 = 0xe0000;
pub const ACPI_END: u64 = 0xf0000;
/// The VM generation ID (16 bytes), in the last page of the ACPI area (not
/// RAM in the e820 map, so the guest never uses it for anything else).
pub const VMGENID_ADDR: u64 = ACPI_END - 0x1000;
pub const HIMEM_START: u64 = 0x100000;
/// Where a CPU starts after reset (f000:fff0). Linux jumps here for a "BIOS"
/// reboot, its last resort on a hardware-reduced ACPI platform without EFI.
pub const RESET_VECTOR: u64 = 0xffff0;
/// Real-mode code at the reset vector: `mov al, 0xfe; out 0x64, al` (the
/// i8042 reset pulse), then `hlt` in a loop.
pub const RESET_VECTOR_CODE: [u8; 7] = [0xb0, 0xfe, 0xe6, 0x64, 0xf4, 0xeb, 0xfd];
pub const MMIO_GAP_START: u64 = 0xc000_0000;
pub const MMIO_GAP_END: u64 = 1 << 32;
/// The PCI root bridge's window for device BARs, at the start of the gap.
pub const PCI_MMIO_BASE: u32 = 0xc000_0000;
pub const PCI_MMIO_LEN: u32 = 0x2000_0000;
pub const IOAPIC_ADDR: u32 = 0xfec0_0000;
pub const LAPIC_ADDR: u32 = 0xfee0_0000;
/// Three pages KVM needs for its TSS on Intel; inside the MMIO hole.
pub const KVM_TSS_ADDR: u64 = 0xfffb_d000;
/// Smallest guest memory `domus run` accepts.
pub const MIN_MEMORY: u64 = 64 << 20;

/// Guest RAM as (start, size) ranges for `bytes` of memory: below the MMIO
/// hole first, the rest above 4 GiB.
pub fn ram_ranges(bytes: u64) -> Vec<(u64, u64)> {
    if bytes <= MMIO_GAP_START {
        vec![(0, bytes)]
    } else {
        vec![(0, MMIO_GAP_START), (MMIO_GAP_END, bytes - MMIO_GAP_START)]
    }
}

/// End of RAM below the MMIO hole.
pub fn low_ram_end(bytes: u64) -> u64 {
    bytes.min(MMIO_GAP_START)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_memory_is_one_range() {
        assert_eq!(ram_ranges(256 << 20), vec![(0, 256 << 20)]);
        assert_eq!(low_ram_end(256 << 20), 256 << 20);
    }

    #[test]
    fn large_memory_skips_the_mmio_hole() {
        let r = ram_ranges(4 << 30);
        assert_eq!(r, vec![(0, 3 << 30), (4 << 30, 1 << 30)]);
        assert_eq!(r.iter().map(|x| x.1).sum::<u64>(), 4 << 30);
        assert_eq!(low_ram_end(4 << 30), 3 << 30);
    }

    #[test]
    fn fixed_areas_do_not_overlap() {
        let areas = [
            (GDT_ADDR, 0x20),
            (IDT_ADDR, 8),
            (ZERO_PAGE_ADDR, 0x1000),
            (PML4_ADDR, 0x3000),
            (CMDLINE_ADDR, CMDLINE_MAX as u64),
            (ACPI_START, ACPI_END - ACPI_START),
            (RESET_VECTOR, RESET_VECTOR_CODE.len() as u64),
        ];
        for (i, a) in areas.iter().enumerate() {
            for b in &areas[i + 1..] {
                assert!(
                    a.0 + a.1 <= b.0 || b.0 + b.1 <= a.0,
                    "{a:x?} overlaps {b:x?}"
                );
            }
            assert!(a.0 + a.1 <= EBDA_START || a.0 >= ACPI_START);
            assert!(a.0 + a.1 <= HIMEM_START);
        }
        const { assert!(BOOT_STACK < PML4_ADDR && BOOT_STACK > ZERO_PAGE_ADDR + 0x1000) };
    }
}
