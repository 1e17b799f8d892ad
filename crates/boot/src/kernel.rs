//! Loading the two kernel formats Debian ships: a bzImage (`/boot/vmlinuz-*`)
//! and the uncompressed ELF `vmlinux`. Both are entered through Linux's 64-bit
//! boot protocol: in long mode, with `%rsi` pointing at the zero page.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

use linux_loader::bootparam::setup_header;
use linux_loader::loader::{bzimage::BzImage, elf::Elf, KernelLoader};
use vm_memory::bitmap::Bitmap;
use vm_memory::{GuestAddress, GuestMemoryMmap};

use crate::layout::HIMEM_START;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read the kernel image")]
    Read(#[source] std::io::Error),
    #[error("not a Linux kernel: neither a bzImage nor an x86-64 ELF vmlinux")]
    NotAKernel,
    #[error("the bzImage has no 64-bit entry point (boot protocol {0:#x}, needs 2.12 and XLF_KERNEL_64)")]
    No64BitEntry(u16),
    #[error("the kernel does not fit in guest memory")]
    DoesNotFit(#[source] linux_loader::loader::Error),
}

pub type Result<T> = std::result::Result<T, Error>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelFormat {
    BzImage,
    Elf,
}

/// Recognizes a kernel from its first 0x260 bytes (or fewer, for short files).
pub fn detect(head: &[u8]) -> Option<KernelFormat> {
    if head.len() >= 20 && head[..4] == *b"\x7fELF" {
        // ELFCLASS64, little-endian, e_machine == EM_X86_64.
        let machine = u16::from_le_bytes([head[18], head[19]]);
        return (head[4] == 2 && head[5] == 1 && machine == 62).then_some(KernelFormat::Elf);
    }
    if head.len() >= 0x206 && head[0x202..0x206] == *b"HdrS" && head[0x1fe..0x200] == [0x55, 0xaa] {
        return Some(KernelFormat::BzImage);
    }
    None
}

/// Where the kernel landed and how to enter it.
#[derive(Clone, Copy, Debug)]
pub struct LoadedKernel {
    pub format: KernelFormat,
    /// Guest-physical address of the 64-bit entry point.
    pub entry: u64,
    /// First address above everything the kernel needs while it boots (for a
    /// bzImage, room to decompress itself); the initrd must go above.
    pub footprint_end: u64,
    /// The bzImage's setup header, to copy into the zero page.
    pub setup_header: Option<setup_header>,
}

const XLF_KERNEL_64: u16 = 1;
/// Linux's default LOAD_PHYSICAL_ADDR on x86_64, where a bzImage decompresses.
const LOAD_PHYSICAL_ADDR: u64 = 0x100_0000;

/// Checks the format without loading, so bad input is reported before any
/// guest memory is allocated.
pub fn probe(file: &mut File) -> Result<KernelFormat> {
    let mut head = vec![0u8; 0x260];
    file.seek(SeekFrom::Start(0)).map_err(Error::Read)?;
    let n = read_up_to(file, &mut head).map_err(Error::Read)?;
    head.truncate(n);
    let format = detect(&head).ok_or(Error::NotAKernel)?;
    if format == KernelFormat::BzImage {
        let version = u16::from_le_bytes([head[0x206], head[0x207]]);
        let xloadflags = u16::from_le_bytes([head[0x236], head[0x237]]);
        if version < 0x20c || xloadflags & XLF_KERNEL_64 == 0 {
            return Err(Error::No64BitEntry(version));
        }
    }
    Ok(format)
}

fn read_up_to(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Loads the kernel into guest memory.
pub fn load<B: Bitmap + 'static>(
    mem: &GuestMemoryMmap<B>,
    file: &mut File,
) -> Result<LoadedKernel> {
    let format = probe(file)?;
    file.seek(SeekFrom::Start(0)).map_err(Error::Read)?;
    match format {
        KernelFormat::BzImage => {
            let r = BzImage::load(mem, None, file, Some(GuestAddress(HIMEM_START)))
                .map_err(Error::DoesNotFit)?;
            let hdr = r.setup_header.ok_or(Error::NotAKernel)?;
            let init_size = u64::from(hdr.init_size);
            let pref = hdr.pref_address.max(LOAD_PHYSICAL_ADDR);
            Ok(LoadedKernel {
                format,
                // The 64-bit entry is 0x200 bytes into the protected-mode code.
                entry: r.kernel_load.0 + 0x200,
                footprint_end: r.kernel_end.max(pref + init_size),
                setup_header: Some(hdr),
            })
        }
        KernelFormat::Elf => {
            let r = Elf::load(mem, None, file, Some(GuestAddress(HIMEM_START)))
                .map_err(Error::DoesNotFit)?;
            Ok(LoadedKernel {
                format,
                entry: r.kernel_load.0,
                footprint_end: r.kernel_end,
                setup_header: None,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bz_head() -> Vec<u8> {
        let mut h = vec![0u8; 0x260];
        h[0x1fe] = 0x55;
        h[0x1ff] = 0xaa;
        h[0x202..0x206].copy_from_slice(b"HdrS");
        h
    }

    #[test]
    fn detects_bzimage() {
        assert_eq!(detect(&bz_head()), Some(KernelFormat::BzImage));
    }

    #[test]
    fn detects_x86_64_elf_only() {
        let mut e = vec![0u8; 64];
        e[..4].copy_from_slice(b"\x7fELF");
        e[4] = 2;
        e[5] = 1;
        e[18] = 62;
        assert_eq!(detect(&e), Some(KernelFormat::Elf));
        e[18] = 183; // aarch64
        assert_eq!(detect(&e), None);
        e[18] = 62;
        e[4] = 1; // 32-bit
        assert_eq!(detect(&e), None);
    }

    #[test]
    fn rejects_other_files() {
        assert_eq!(detect(b"#!/bin/sh\necho hi\n"), None);
        assert_eq!(detect(&[]), None);
        let mut h = bz_head();
        h[0x1fe] = 0;
        assert_eq!(detect(&h), None);
    }

    #[test]
    fn probe_rejects_bzimage_without_64bit_entry() {
        let dir = std::env::temp_dir().join(format!("domus-boot-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("old-bzimage");
        let mut h = bz_head();
        h[0x206..0x208].copy_from_slice(&0x20bu16.to_le_bytes());
        std::fs::write(&p, &h).unwrap();
        let err = probe(&mut File::open(&p).unwrap()).unwrap_err();
        assert!(matches!(err, Error::No64BitEntry(0x20b)));
        h[0x206..0x208].copy_from_slice(&0x20fu16.to_le_bytes());
        h[0x236] = 1;
        std::fs::write(&p, &h).unwrap();
        assert_eq!(
            probe(&mut File::open(&p).unwrap()).unwrap(),
            KernelFormat::BzImage
        );
        std::fs::write(&p, b"hello").unwrap();
        assert!(matches!(
            probe(&mut File::open(&p).unwrap()),
            Err(Error::NotAKernel)
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
