//! Guest memory in a snapshot: written sparse (a page of zeroes becomes a
//! hole), and restored by mapping the file copy-on-write (`MAP_PRIVATE`):
//! nothing is read until the guest touches a page, the file is never
//! written, and domains restored from one file share its untouched pages
//! in the host's page cache.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

use domus_api::snapshot::MemoryRegion;
use domus_virtio::Memory;
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryRegion, GuestRegionMmap, MmapRegion};

use super::SnapshotError;

const PAGE: usize = 4096;
static ZERO: [u8; PAGE] = [0; PAGE];

/// What [`save`] wrote.
pub struct Saved {
    pub bytes: u64,
    pub crc32: u32,
    pub pages_stored: u64,
    pub regions: Vec<MemoryRegion>,
}

fn io(what: &'static str) -> impl Fn(std::io::Error) -> SnapshotError {
    move |e| SnapshotError::Io(what, e)
}

/// Writes all of `mem` into `file` (truncated first), each region after the
/// last, skipping pages of zeroes. Nothing may write guest memory
/// meanwhile: the vCPUs are paused and the devices stopped.
pub fn save(mem: &Memory, file: &File) -> Result<Saved, SnapshotError> {
    let total: u64 = mem.iter().map(|r| r.len()).sum();
    file.set_len(0).map_err(io("truncating the memory file"))?;
    file.set_len(total).map_err(io("sizing the memory file"))?;
    let mut crc = crc32fast::Hasher::new();
    let mut stored = 0u64;
    let mut regions = Vec::new();
    let mut offset = 0u64;
    for r in mem.iter() {
        let len = r.len() as usize;
        // SAFETY: the region's mapping is `len` bytes long and lives as
        // long as `mem`; while the domain is paused and its devices are
        // stopped nothing writes it, so reading it as bytes is sound.
        let bytes = unsafe { std::slice::from_raw_parts(r.as_ptr() as *const u8, len) };
        let mut run: Option<usize> = None;
        for (i, page) in bytes.chunks(PAGE).enumerate() {
            // Compared as a whole (memcmp), not byte by byte.
            let zero = page == &ZERO[..page.len()];
            if !zero {
                crc.update(page);
            }
            match (zero, run) {
                (false, None) => run = Some(i * PAGE),
                (true, Some(start)) => {
                    file.write_all_at(&bytes[start..i * PAGE], offset + start as u64)
                        .map_err(io("writing the memory file"))?;
                    run = None;
                }
                _ => {}
            }
            stored += u64::from(!zero);
        }
        if let Some(start) = run {
            file.write_all_at(&bytes[start..], offset + start as u64)
                .map_err(io("writing the memory file"))?;
        }
        regions.push(MemoryRegion {
            guest_addr: r.start_addr().0,
            bytes: r.len(),
            file_offset: offset,
        });
        offset += r.len();
    }
    file.sync_all().map_err(io("syncing the memory file"))?;
    Ok(Saved {
        bytes: total,
        crc32: crc.finalize(),
        pages_stored: stored,
        regions,
    })
}

/// Checks that the saved regions are the layout `expected` (guest address,
/// size) of a domain of this memory size, and that `file` holds them all.
pub fn check(
    regions: &[MemoryRegion],
    expected: &[(u64, u64)],
    file: &File,
    bytes: u64,
) -> Result<(), SnapshotError> {
    let layout: Vec<(u64, u64)> = regions.iter().map(|r| (r.guest_addr, r.bytes)).collect();
    if layout != expected {
        return Err(SnapshotError::Machine(format!(
            "memory regions {layout:x?}, but a domain of this size has {expected:x?}"
        )));
    }
    let mut at = 0u64;
    for r in regions {
        if r.file_offset != at || r.bytes % PAGE as u64 != 0 {
            return Err(SnapshotError::Machine(
                "memory regions do not follow each other in the file".into(),
            ));
        }
        at += r.bytes;
    }
    let len = file.metadata().map_err(io("the memory file"))?.len();
    if at != bytes || len != bytes {
        return Err(SnapshotError::MemoryTruncated {
            got: len,
            want: at.max(bytes),
        });
    }
    Ok(())
}

/// Maps the saved regions of `file` copy-on-write as guest memory.
pub fn map(regions: &[MemoryRegion], file: &File) -> Result<Memory, SnapshotError> {
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    let flags = libc::MAP_PRIVATE | libc::MAP_NORESERVE;
    let mut out = Vec::new();
    for r in regions {
        let len = usize::try_from(r.bytes)
            .map_err(|_| SnapshotError::Machine("a memory region too large".into()))?;
        let off = libc::off_t::try_from(r.file_offset)
            .map_err(|_| SnapshotError::Machine("a memory offset too large".into()))?;
        // SAFETY: a new private mapping of a file we hold open; the result
        // is checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                flags,
                file.as_raw_fd(),
                off,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(SnapshotError::Io(
                "mapping the memory file",
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: [p, p + len) is the mapping just made with these prot and
        // flags, and nothing else refers to it; it lives as long as the
        // process.
        let m = unsafe { MmapRegion::build_raw(p.cast::<u8>(), len, prot, flags) }
            .map_err(|e| SnapshotError::Machine(format!("memory region: {e}")))?;
        out.push(
            GuestRegionMmap::new(m, GuestAddress(r.guest_addr))
                .ok_or_else(|| SnapshotError::Machine("memory region overflows".into()))?,
        );
    }
    Memory::from_regions(out).map_err(|e| SnapshotError::Machine(format!("memory: {e}")))
}

/// Reads every page of a mapped image now (`--prefault`), and checks it
/// against the CRC-32 saved with it (of the pages that are not all
/// zeroes, in order: a page written that reads as zeroes now, or a hole
/// that does not, changes it too).
pub fn load_and_verify(mem: &Memory, crc32: u32) -> Result<(), SnapshotError> {
    let mut crc = crc32fast::Hasher::new();
    for r in mem.iter() {
        // SAFETY: as in `save`: the mapping is r.len() bytes, and nothing
        // runs in the guest yet.
        let bytes =
            unsafe { std::slice::from_raw_parts(r.as_ptr() as *const u8, r.len() as usize) };
        for page in bytes.chunks(PAGE) {
            if page != &ZERO[..page.len()] {
                crc.update(page);
            }
        }
    }
    let got = crc.finalize();
    if got != crc32 {
        return Err(SnapshotError::MemoryCorrupt { got, want: crc32 });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::Bytes;

    #[test]
    fn memory_saves_sparse_and_maps_back_copy_on_write() {
        let mem = crate::memory::allocate(&[(0, 1 << 20), (1 << 32, 64 << 10)]).unwrap();
        mem.write_obj(0xfeed_u64, GuestAddress(8192)).unwrap();
        mem.write_obj(7u8, GuestAddress((1 << 32) + 65535)).unwrap();
        let dir = std::env::temp_dir().join(format!("domus-snapmem-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m");
        let f = File::options()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let s = save(&mem, &f).unwrap();
        assert_eq!(s.pages_stored, 2);
        assert_eq!(s.bytes, (1 << 20) + (64 << 10));
        let layout = [(0, 1 << 20), (1 << 32, 64 << 10)];
        check(&s.regions, &layout, &f, s.bytes).unwrap();
        assert!(check(&s.regions, &[(0, 2 << 20)], &f, s.bytes).is_err());
        let back = map(&s.regions, &f).unwrap();
        load_and_verify(&back, s.crc32).unwrap();
        assert_eq!(back.read_obj::<u64>(GuestAddress(8192)).unwrap(), 0xfeed);
        assert_eq!(
            back.read_obj::<u8>(GuestAddress((1 << 32) + 65535))
                .unwrap(),
            7
        );
        // Writes stay in this process: the file is unchanged.
        back.write_obj(1u64, GuestAddress(8192)).unwrap();
        let mut b = [0u8; 8];
        f.read_exact_at(&mut b, 8192).unwrap();
        assert_eq!(u64::from_le_bytes(b), 0xfeed);
        assert!(load_and_verify(&back, s.crc32).is_err());
        // A truncated file is refused.
        f.set_len(s.bytes - 4096).unwrap();
        assert!(matches!(
            check(&s.regions, &layout, &f, s.bytes),
            Err(SnapshotError::MemoryTruncated { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
