//! Guest RAM: anonymous mappings aligned to 2 MiB and marked for transparent
//! huge pages, so KVM can map guest memory with 2 MiB pages (far fewer
//! second-level page faults while the guest boots and touches memory).

use vm_memory::{GuestAddress, GuestMemoryMmap, GuestRegionMmap, MmapRegion};

const HUGE: usize = 2 << 20;

#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error("mmap of {0} MiB failed")]
    Mmap(usize, #[source] std::io::Error),
    #[error("guest memory region")]
    Region(#[source] vm_memory::mmap::MmapRegionError),
    #[error("guest memory layout")]
    Layout(#[source] vm_memory::GuestRegionCollectionError),
}

/// One anonymous mapping of `size` bytes at a 2 MiB-aligned address. It lives
/// as long as the process: a domain's memory goes away with its VMM.
fn map_aligned(size: usize) -> Result<MmapRegion, MemoryError> {
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
    let padded = size + HUGE;
    // SAFETY: a fresh anonymous mapping; the result is checked below.
    let base = unsafe { libc::mmap(std::ptr::null_mut(), padded, prot, flags, -1, 0) };
    if base == libc::MAP_FAILED {
        return Err(MemoryError::Mmap(
            size >> 20,
            std::io::Error::last_os_error(),
        ));
    }
    let start = (base as usize).next_multiple_of(HUGE);
    let head = start - base as usize;
    let tail = padded - head - size;
    // SAFETY: both ranges lie inside the mapping made above and are not in use.
    unsafe {
        if head > 0 {
            libc::munmap(base, head);
        }
        if tail > 0 {
            libc::munmap((start + size) as *mut libc::c_void, tail);
        }
        // Advice only: without THP the guest still runs, with 4 KiB pages.
        libc::madvise(start as *mut libc::c_void, size, libc::MADV_HUGEPAGE);
    }
    // SAFETY: [start, start + size) is the mapping just made, with these
    // prot and flags, and nothing else refers to it.
    unsafe { MmapRegion::build_raw(start as *mut u8, size, prot, flags) }
        .map_err(MemoryError::Region)
}

/// Guest memory for `(guest address, size)` ranges.
pub fn allocate(ranges: &[(u64, u64)]) -> Result<GuestMemoryMmap, MemoryError> {
    let mut regions = Vec::with_capacity(ranges.len());
    for &(addr, size) in ranges {
        let region = map_aligned(size as usize)?;
        regions.push(GuestRegionMmap::new(region, GuestAddress(addr)).ok_or(
            MemoryError::Region(vm_memory::mmap::MmapRegionError::InvalidPointer),
        )?);
    }
    GuestMemoryMmap::from_regions(regions).map_err(MemoryError::Layout)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestMemoryBackend};

    #[test]
    fn regions_are_2mib_aligned_and_usable() {
        let mem = allocate(&[(0, 6 << 20), (1 << 32, 4 << 20)]).unwrap();
        for r in mem.iter() {
            assert_eq!(r.as_ptr() as usize % HUGE, 0);
        }
        mem.write_obj(0xdead_beefu32, GuestAddress((6 << 20) - 4))
            .unwrap();
        assert_eq!(
            mem.read_obj::<u32>(GuestAddress((6 << 20) - 4)).unwrap(),
            0xdead_beef
        );
        mem.write_obj(1u8, GuestAddress((1 << 32) + (4 << 20) - 1))
            .unwrap();
        assert!(mem.write_obj(1u8, GuestAddress(6 << 20)).is_err());
    }
}
