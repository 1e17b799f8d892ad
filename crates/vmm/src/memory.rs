//! Guest RAM: anonymous mappings aligned to 2 MiB and marked for transparent
//! huge pages, so KVM can map guest memory with 2 MiB pages (far fewer
//! second-level page faults while the guest boots and touches memory).
//! [`prefault`] populates all of it before the guest runs, on request.

use std::os::fd::AsRawFd;

use domus_virtio::Memory;
use vm_memory::{
    bitmap::AtomicBitmap, GuestAddress, GuestMemoryBackend, GuestMemoryRegion, GuestRegionMmap,
    MmapRegion,
};

const HUGE: usize = 2 << 20;

#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error("mmap of {0} MiB failed")]
    Mmap(usize, #[source] std::io::Error),
    #[error("guest memory region")]
    Region(#[source] vm_memory::mmap::MmapRegionError),
    #[error("guest memory layout")]
    Layout(#[source] vm_memory::GuestRegionCollectionError),
    #[error("populating {0} MiB of guest memory")]
    Populate(usize, #[source] std::io::Error),
    #[error("KVM_PRE_FAULT_MEMORY at guest address {0:#x}")]
    PreFault(u64, #[source] std::io::Error),
}

/// How far [`prefault`] got: the host pages only, or the second-level
/// page tables that map them as well.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prefaulted {
    HostPages,
    SecondLevel,
}

vmm_sys_util::ioctl_iowr_nr!(
    KVM_PRE_FAULT_MEMORY,
    kvm_bindings::KVMIO,
    0xd5,
    kvm_bindings::kvm_pre_fault_memory
);

/// Populates all of guest RAM before the guest runs: the host pages
/// (MADV_POPULATE_WRITE, huge pages where the host has them) and, when
/// `vcpu` is given (KVM has KVM_CAP_PRE_FAULT_MEMORY, Linux 6.10 and
/// later), the second-level page tables that map them. The guest then
/// takes no fault in the host when it first touches a page, and every
/// page is committed at start instead of on first use.
pub fn prefault(mem: &Memory, vcpu: Option<&impl AsRawFd>) -> Result<Prefaulted, MemoryError> {
    for r in mem.iter() {
        let len = r.len() as usize;
        // SAFETY: the range is one guest memory mapping, alive as long as
        // `mem`; populating it changes no contents (fresh anonymous memory
        // reads as zeroes before and after).
        let rc = unsafe {
            libc::madvise(
                r.as_ptr().cast::<libc::c_void>(),
                len,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if rc != 0 {
            return Err(MemoryError::Populate(
                len >> 20,
                std::io::Error::last_os_error(),
            ));
        }
    }
    let Some(vcpu) = vcpu else {
        return Ok(Prefaulted::HostPages);
    };
    for r in mem.iter() {
        let mut range = kvm_bindings::kvm_pre_fault_memory {
            gpa: r.start_addr().0,
            size: r.len(),
            ..Default::default()
        };
        // KVM does part of the range per call and says what is left; a
        // call that made no progress (a signal, a race) is tried again, a
        // bounded number of times in a row.
        let mut stalled = 0;
        while range.size > 0 {
            // SAFETY: KVM_PRE_FAULT_MEMORY reads and updates one
            // kvm_pre_fault_memory, which `range` is, on a vCPU fd.
            let rc = unsafe {
                vmm_sys_util::ioctl::ioctl_with_mut_ref(vcpu, KVM_PRE_FAULT_MEMORY(), &mut range)
            };
            if rc < 0 {
                let e = std::io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EINTR | libc::EAGAIN) if stalled < 1000 => stalled += 1,
                    _ => return Err(MemoryError::PreFault(range.gpa, e)),
                }
            } else {
                stalled = 0;
            }
        }
    }
    Ok(Prefaulted::SecondLevel)
}

/// Opens guest memory to the host's KSM (`mergeable = 1`): identical
/// pages are merged with those of other processes that allow it.
pub fn mergeable(mem: &Memory) -> std::io::Result<()> {
    for r in mem.iter() {
        // SAFETY: advice on a range that is one guest memory mapping, alive
        // as long as `mem`; it changes no contents.
        let rc = unsafe {
            libc::madvise(
                r.as_ptr().cast::<libc::c_void>(),
                r.len() as usize,
                libc::MADV_MERGEABLE,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// One anonymous mapping of `size` bytes at a 2 MiB-aligned address. It lives
/// as long as the process: a domain's memory goes away with its VMM.
fn map_aligned(size: usize) -> Result<MmapRegion<AtomicBitmap>, MemoryError> {
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
pub fn allocate(ranges: &[(u64, u64)]) -> Result<Memory, MemoryError> {
    let mut regions = Vec::with_capacity(ranges.len());
    for &(addr, size) in ranges {
        let region = map_aligned(size as usize)?;
        regions.push(GuestRegionMmap::new(region, GuestAddress(addr)).ok_or(
            MemoryError::Region(vm_memory::mmap::MmapRegionError::InvalidPointer),
        )?);
    }
    Memory::from_regions(regions).map_err(MemoryError::Layout)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::Bytes;

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

    #[test]
    fn host_pages_are_populated_and_still_zero() {
        let mem = allocate(&[(0, 4 << 20)]).unwrap();
        let none: Option<&std::fs::File> = None;
        assert_eq!(prefault(&mem, none).unwrap(), Prefaulted::HostPages);
        let r = mem.iter().next().unwrap();
        let mut resident = vec![0u8; (4 << 20) / 4096];
        // SAFETY: mincore reads the page table of this process for a
        // range it maps and writes one byte per page into `resident`.
        let rc = unsafe {
            libc::mincore(
                r.as_ptr().cast::<libc::c_void>(),
                4 << 20,
                resident.as_mut_ptr(),
            )
        };
        assert_eq!(rc, 0);
        assert!(resident.iter().all(|p| p & 1 == 1), "pages not resident");
        assert_eq!(mem.read_obj::<u64>(GuestAddress(3 << 20)).unwrap(), 0);
    }
}
