//! 64-bit mode for the boot vCPU: a flat GDT, an empty IDT, and identity-mapped
//! page tables covering the first GiB (2 MiB pages), as Linux's 64-bit boot
//! protocol expects.

use vm_memory::bitmap::Bitmap;
use vm_memory::{Bytes, GuestAddress, GuestMemoryError, GuestMemoryMmap};

use crate::layout::{GDT_ADDR, IDT_ADDR, PDPT_ADDR, PD_ADDR, PML4_ADDR};

/// A segment as the CPU caches it; the VMM turns it into `kvm_segment`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Segment {
    pub base: u64,
    pub limit: u32,
    pub selector: u16,
    pub type_: u8,
    pub present: u8,
    pub dpl: u8,
    pub db: u8,
    pub s: u8,
    pub l: u8,
    pub g: u8,
}

/// A GDT descriptor from its flags (the 0xF0FF part of bits 40..56), base and limit.
pub const fn gdt_entry(flags: u16, base: u32, limit: u32) -> u64 {
    ((base as u64 & 0xff00_0000) << 32)
        | ((flags as u64 & 0xf0ff) << 40)
        | ((limit as u64 & 0x000f_0000) << 32)
        | ((base as u64 & 0x00ff_ffff) << 16)
        | (limit as u64 & 0x0000_ffff)
}

/// Decodes a descriptor into the cached form.
pub fn segment(entry: u64, index: u16) -> Segment {
    Segment {
        base: ((entry >> 16) & 0xff_ffff) | (((entry >> 56) & 0xff) << 24),
        limit: ((entry & 0xffff) | (((entry >> 48) & 0xf) << 16)) as u32,
        selector: index * 8,
        type_: ((entry >> 40) & 0xf) as u8,
        present: ((entry >> 47) & 1) as u8,
        dpl: ((entry >> 45) & 3) as u8,
        db: ((entry >> 54) & 1) as u8,
        s: ((entry >> 44) & 1) as u8,
        l: ((entry >> 53) & 1) as u8,
        g: ((entry >> 55) & 1) as u8,
    }
}

/// null, 64-bit code, data, TSS.
pub const GDT: [u64; 4] = [
    gdt_entry(0, 0, 0),
    gdt_entry(0xa09b, 0, 0xfffff),
    gdt_entry(0xc093, 0, 0xfffff),
    gdt_entry(0x808b, 0, 0xfffff),
];

/// Segment registers and descriptor tables for 64-bit mode.
pub struct LongModeSegments {
    pub code: Segment,
    pub data: Segment,
    pub tss: Segment,
    pub gdt_base: u64,
    pub gdt_limit: u16,
    pub idt_base: u64,
    pub idt_limit: u16,
    pub cr3: u64,
}

pub const CR0_PE: u64 = 1;
pub const CR0_ET: u64 = 1 << 4;
pub const CR0_PG: u64 = 1 << 31;
pub const CR4_PAE: u64 = 1 << 5;
pub const EFER_LME: u64 = 1 << 8;
pub const EFER_LMA: u64 = 1 << 10;

/// Writes GDT, IDT and page tables into guest memory.
pub fn setup<B: Bitmap + 'static>(
    mem: &GuestMemoryMmap<B>,
) -> Result<LongModeSegments, GuestMemoryError> {
    for (i, e) in GDT.iter().enumerate() {
        mem.write_obj(*e, GuestAddress(GDT_ADDR + 8 * i as u64))?;
    }
    mem.write_obj(0u64, GuestAddress(IDT_ADDR))?;
    mem.write_obj(PDPT_ADDR | 0x03, GuestAddress(PML4_ADDR))?;
    mem.write_obj(PD_ADDR | 0x03, GuestAddress(PDPT_ADDR))?;
    for i in 0..512u64 {
        // present, writable, 2 MiB page
        mem.write_obj((i << 21) | 0x83, GuestAddress(PD_ADDR + i * 8))?;
    }
    Ok(LongModeSegments {
        code: segment(GDT[1], 1),
        data: segment(GDT[2], 2),
        tss: segment(GDT[3], 3),
        gdt_base: GDT_ADDR,
        gdt_limit: (std::mem::size_of_val(&GDT) - 1) as u16,
        idt_base: IDT_ADDR,
        idt_limit: 7,
        cr3: PML4_ADDR,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gdt_entries_match_the_usual_encodings() {
        assert_eq!(GDT[1], 0x00af_9b00_0000_ffff);
        assert_eq!(GDT[2], 0x00cf_9300_0000_ffff);
        assert_eq!(GDT[3], 0x008f_8b00_0000_ffff);
    }

    #[test]
    fn code_segment_is_64_bit() {
        let cs = segment(GDT[1], 1);
        assert_eq!(
            (cs.l, cs.db, cs.present, cs.s, cs.type_, cs.selector),
            (1, 0, 1, 1, 0xb, 8)
        );
        let ds = segment(GDT[2], 2);
        assert_eq!(
            (ds.l, ds.db, ds.type_, ds.selector, ds.limit),
            (0, 1, 3, 0x10, 0xfffff)
        );
    }

    #[test]
    fn identity_map_covers_first_gib() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let s = setup(&mem).unwrap();
        assert_eq!(s.cr3, PML4_ADDR);
        let pml4: u64 = mem.read_obj(GuestAddress(PML4_ADDR)).unwrap();
        assert_eq!(pml4 & !0xfff, PDPT_ADDR);
        let last: u64 = mem.read_obj(GuestAddress(PD_ADDR + 511 * 8)).unwrap();
        assert_eq!(last, (511 << 21) | 0x83);
    }
}
