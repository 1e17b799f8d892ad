//! Which guest pages changed since the last look, for the rounds of a live
//! migration: KVM's dirty log holds what vCPUs wrote, and guest memory's
//! own bitmap (`domus_virtio::Memory`) what the VMM's devices wrote.
//! (vhost-vsock's writes, which the kernel makes, are not in either: a
//! migration resends its rings once the device is stopped.)

use kvm_bindings::KVM_MEM_LOG_DIRTY_PAGES;
use kvm_ioctls::VmFd;
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

use domus_virtio::Memory;

/// One bit per 4 KiB page of each RAM region, in 64-bit words: bit `b` of
/// word `w` of region `r` is that region's page `64 * w + b`.
pub type PageBitmap = Vec<Vec<u64>>;

#[derive(Debug, thiserror::Error)]
pub enum DirtyError {
    #[error("{0}: {1}")]
    Kvm(&'static str, #[source] kvm_ioctls::Error),
}

/// Dirty-page logging on a VM's memory, on from [`DirtyLog::start`] until
/// [`DirtyLog::stop`].
pub struct DirtyLog<'a> {
    vm: &'a VmFd,
    mem: &'a Memory,
}

impl<'a> DirtyLog<'a> {
    /// Turns KVM's dirty log on for every memory slot and clears the VMM's
    /// bitmap: from here on, every page written is seen by [`take`].
    ///
    /// [`take`]: DirtyLog::take
    pub fn start(vm: &'a VmFd, mem: &'a Memory) -> Result<Self, DirtyError> {
        crate::vm::register_memory_flags(vm, mem, KVM_MEM_LOG_DIRTY_PAGES)
            .map_err(|e| DirtyError::Kvm("KVM_SET_USER_MEMORY_REGION (dirty log on)", e))?;
        domus_virtio::take_dirty(mem);
        Ok(Self { vm, mem })
    }

    /// The pages written since [`DirtyLog::start`] or the last call, by
    /// vCPUs or devices; both logs are cleared as they are read.
    pub fn take(&self) -> Result<PageBitmap, DirtyError> {
        let vmm = domus_virtio::take_dirty(self.mem);
        let mut out = Vec::new();
        for ((slot, r), vmm) in self.mem.iter().enumerate().zip(&vmm) {
            let kvm = self
                .vm
                .get_dirty_log(slot as u32, r.len() as usize)
                .map_err(|e| DirtyError::Kvm("KVM_GET_DIRTY_LOG", e))?;
            out.push(merge(&kvm, vmm));
        }
        Ok(out)
    }

    /// Turns KVM's dirty log off again (the migration ended, one way or
    /// the other).
    pub fn stop(self) -> Result<(), DirtyError> {
        crate::vm::register_memory_flags(self.vm, self.mem, 0)
            .map_err(|e| DirtyError::Kvm("KVM_SET_USER_MEMORY_REGION (dirty log off)", e))
    }
}

/// The union of two page bitmaps of one region (the shorter is padded
/// with clean pages).
pub fn merge(a: &[u64], b: &[u64]) -> Vec<u64> {
    (0..a.len().max(b.len()))
        .map(|i| a.get(i).copied().unwrap_or(0) | b.get(i).copied().unwrap_or(0))
        .collect()
}

/// How many pages a bitmap marks.
pub fn count(b: &PageBitmap) -> u64 {
    b.iter().flatten().map(|w| u64::from(w.count_ones())).sum()
}

/// The runs of marked pages of one region's bitmap, as (first page, page
/// count), in order; a run is at most `max` pages.
pub fn runs(words: &[u64], max: u64) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (w, &word) in words.iter().enumerate() {
        let mut bits = word;
        while bits != 0 {
            let page = w as u64 * 64 + u64::from(bits.trailing_zeros());
            bits &= bits - 1;
            match out.last_mut() {
                Some((first, n)) if *first + *n == page && *n < max => *n += 1,
                _ => out.push((page, 1)),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestAddress};

    #[test]
    fn bitmaps_merge_count_and_run() {
        assert_eq!(merge(&[0b1010, 1], &[0b0101]), vec![0b1111, 1]);
        let b: PageBitmap = vec![vec![0b1110_0111, 0], vec![u64::MAX]];
        assert_eq!(count(&b), 6 + 64);
        assert_eq!(runs(&b[0], 256), vec![(0, 3), (5, 3)]);
        assert_eq!(runs(&b[0], 2), vec![(0, 2), (2, 1), (5, 2), (7, 1)]);
        // Runs go on across words.
        assert_eq!(runs(&[1 << 63, 1], 256), vec![(63, 2)]);
        assert_eq!(runs(&[0, 0], 256), vec![]);
    }

    #[test]
    fn the_vmms_writes_mark_guest_memory_dirty() {
        let mem = Memory::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        domus_virtio::take_dirty(&mem);
        mem.write_obj(7u32, GuestAddress(0x3004)).unwrap();
        mem.write_slice(&[1u8; 4098], GuestAddress(0x8fff)).unwrap();
        let words = domus_virtio::take_dirty(&mem);
        assert_eq!(runs(&words[0], 256), vec![(3, 1), (8, 3)]);
        // Read and cleared.
        assert_eq!(count(&domus_virtio::take_dirty(&mem)), 0);
        // A device's read of guest memory marks nothing.
        let _: u32 = mem.read_obj(GuestAddress(0x5000)).unwrap();
        assert_eq!(count(&domus_virtio::take_dirty(&mem)), 0);
    }
}
