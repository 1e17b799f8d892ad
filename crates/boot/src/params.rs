//! The Linux zero page (`struct boot_params`): e820 map, command line, initrd.

use linux_loader::bootparam::{boot_e820_entry, boot_params, setup_header};

use crate::layout::{low_ram_end, ram_ranges, CMDLINE_ADDR, CMDLINE_MAX, EBDA_START, HIMEM_START};

pub const E820_RAM: u32 = 1;
pub const E820_RESERVED: u32 = 2;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("the kernel command line is {0} bytes; Linux takes at most {max}", max = CMDLINE_MAX - 1)]
    CmdlineTooLong(usize),
    #[error("the kernel command line contains a NUL byte")]
    CmdlineNul,
    #[error("{memory} MiB of guest memory is too little for this kernel and initrd (needs about {needed} MiB)")]
    TooLittleMemory { memory: u64, needed: u64 },
}

/// The guest's memory map: RAM below the EBDA, RAM from 1 MiB up to the MMIO
/// hole, and RAM above 4 GiB if there is more.
pub fn e820_map(mem_bytes: u64) -> Vec<(u64, u64, u32)> {
    let mut map = vec![(0, EBDA_START, E820_RAM)];
    for (start, size) in ram_ranges(mem_bytes) {
        if start == 0 {
            map.push((HIMEM_START, size - HIMEM_START, E820_RAM));
        } else {
            map.push((start, size, E820_RAM));
        }
    }
    map
}

/// Picks the initrd's address: page-aligned, as high as possible in low RAM
/// and below the kernel's `initrd_addr_max`, above the kernel's footprint.
pub fn initrd_addr(
    mem_bytes: u64,
    kernel_footprint_end: u64,
    initrd_size: u64,
    initrd_addr_max: u64,
) -> Result<u64, Error> {
    let top = low_ram_end(mem_bytes).min(initrd_addr_max.saturating_add(1));
    let addr = top.checked_sub(initrd_size).map(|a| a & !0xfff);
    match addr {
        Some(a) if a >= kernel_footprint_end => Ok(a),
        _ => Err(Error::TooLittleMemory {
            memory: mem_bytes >> 20,
            needed: (kernel_footprint_end + initrd_size + (16 << 20)).div_ceil(1 << 20),
        }),
    }
}

/// Checks a command line and returns its bytes with the terminating NUL.
pub fn cmdline_bytes(cmdline: &str) -> Result<Vec<u8>, Error> {
    if cmdline.as_bytes().contains(&0) {
        return Err(Error::CmdlineNul);
    }
    if cmdline.len() >= CMDLINE_MAX {
        return Err(Error::CmdlineTooLong(cmdline.len()));
    }
    let mut b = cmdline.as_bytes().to_vec();
    b.push(0);
    Ok(b)
}

pub struct ZeroPage<'a> {
    pub mem_bytes: u64,
    pub cmdline_len: usize,
    pub initrd: Option<(u64, u64)>,
    pub setup_header: Option<&'a setup_header>,
    pub rsdp_addr: u64,
}

const KERNEL_BOOT_FLAG_MAGIC: u16 = 0xaa55;
const KERNEL_HDR_MAGIC: u32 = 0x5372_6448;
const KERNEL_LOADER_OTHER: u8 = 0xff;
const KERNEL_MIN_ALIGNMENT_BYTES: u32 = 0x100_0000;

pub fn zero_page(z: &ZeroPage) -> boot_params {
    let mut p = boot_params::default();
    if let Some(h) = z.setup_header {
        p.hdr = *h;
    }
    p.hdr.type_of_loader = KERNEL_LOADER_OTHER;
    p.hdr.boot_flag = KERNEL_BOOT_FLAG_MAGIC;
    p.hdr.header = KERNEL_HDR_MAGIC;
    p.hdr.cmd_line_ptr = CMDLINE_ADDR as u32;
    p.hdr.cmdline_size = z.cmdline_len as u32;
    p.hdr.kernel_alignment = KERNEL_MIN_ALIGNMENT_BYTES;
    if let Some((addr, size)) = z.initrd {
        p.hdr.ramdisk_image = addr as u32;
        p.hdr.ramdisk_size = size as u32;
    }
    p.acpi_rsdp_addr = z.rsdp_addr;
    let map = e820_map(z.mem_bytes);
    for (i, (addr, size, type_)) in map.iter().enumerate() {
        p.e820_table[i] = boot_e820_entry {
            addr: *addr,
            size: *size,
            r#type: *type_,
        };
    }
    p.e820_entries = map.len() as u8;
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e820_covers_requested_memory_minus_legacy_hole() {
        for mib in [64u64, 256, 1024, 3072, 4096, 8192] {
            let bytes = mib << 20;
            let map = e820_map(bytes);
            let ram: u64 = map.iter().filter(|e| e.2 == E820_RAM).map(|e| e.1).sum();
            assert_eq!(ram, bytes - (HIMEM_START - EBDA_START), "{mib} MiB");
            for w in map.windows(2) {
                assert!(w[0].0 + w[0].1 <= w[1].0, "sorted, disjoint: {map:x?}");
            }
        }
    }

    #[test]
    fn initrd_goes_to_top_of_low_ram() {
        let a = initrd_addr(256 << 20, 40 << 20, 10 << 20, 0x7fff_ffff).unwrap();
        assert_eq!(a, (256 << 20) - (10 << 20));
        let a = initrd_addr(256 << 20, 40 << 20, (10 << 20) + 1, 0x7fff_ffff).unwrap();
        assert_eq!(a % 4096, 0);
        assert!(a + (10 << 20) < 256 << 20);
    }

    #[test]
    fn initrd_respects_addr_max_and_the_hole() {
        let a = initrd_addr(8 << 30, 40 << 20, 1 << 20, 0x7fff_ffff).unwrap();
        assert_eq!(a, 0x8000_0000 - (1 << 20));
        let a = initrd_addr(8 << 30, 40 << 20, 1 << 20, u64::MAX).unwrap();
        assert_eq!(a, crate::layout::MMIO_GAP_START - (1 << 20));
    }

    #[test]
    fn initrd_that_does_not_fit_is_an_error() {
        let e = initrd_addr(64 << 20, 60 << 20, 10 << 20, 0x7fff_ffff).unwrap_err();
        assert!(matches!(e, Error::TooLittleMemory { memory: 64, .. }));
        assert!(initrd_addr(64 << 20, 0, 128 << 20, 0x7fff_ffff).is_err());
    }

    #[test]
    fn cmdline_limits() {
        assert_eq!(cmdline_bytes("console=ttyS0").unwrap().last(), Some(&0));
        assert_eq!(
            cmdline_bytes(&"x".repeat(2048)),
            Err(Error::CmdlineTooLong(2048))
        );
        assert!(cmdline_bytes(&"x".repeat(2047)).is_ok());
        assert_eq!(cmdline_bytes("a\0b"), Err(Error::CmdlineNul));
    }

    #[test]
    fn zero_page_fields() {
        let p = zero_page(&ZeroPage {
            mem_bytes: 512 << 20,
            cmdline_len: 12,
            initrd: Some((0x1000_0000, 0x20_0000)),
            setup_header: None,
            rsdp_addr: 0xe0000,
        });
        let hdr = p.hdr;
        assert_eq!({ hdr.boot_flag }, 0xaa55);
        assert_eq!({ hdr.header }, 0x5372_6448);
        assert_eq!({ hdr.cmd_line_ptr }, CMDLINE_ADDR as u32);
        assert_eq!({ hdr.ramdisk_image }, 0x1000_0000);
        assert_eq!({ hdr.ramdisk_size }, 0x20_0000);
        assert_eq!(p.e820_entries, 2);
        assert_eq!({ p.acpi_rsdp_addr }, 0xe0000);
    }
}
