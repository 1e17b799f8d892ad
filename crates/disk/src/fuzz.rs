//! The fuzz target for hostile qcow2 images, run by `domus-fuzz` (in
//! domus-virtio) beside the virtio targets: the input is an image file,
//! opened from memory (a memfd), with every backing file refused, then
//! read, written, discarded and flushed. Errors are fine; a panic, a hang or
//! a huge allocation is a bug.

use std::fs::File;
use std::io::Write;
use std::os::fd::FromRawFd;
use std::path::Path;

use crate::{create, open, CreateOptions, Error, Format, Opener, Qcow2Image};

/// Hands out the input for link 0 and refuses every backing file (an input
/// must never make the fuzzer open host files).
struct Input(Option<File>);

impl Opener for Input {
    fn open(&mut self, path: &Path, _link: usize, _write: bool) -> Result<File, Error> {
        self.0.take().ok_or_else(|| Error::Refused {
            path: path.display().to_string(),
            reason: "the fuzzer opens no backing files".into(),
        })
    }
}

fn memfd(data: &[u8]) -> Option<File> {
    // SAFETY: memfd_create with a NUL-terminated name; the descriptor it
    // returns is new and ours.
    let fd = unsafe { libc::memfd_create(c"domus-fuzz-qcow2".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` was just created and is owned by nothing else.
    let mut f = unsafe { File::from_raw_fd(fd) };
    f.write_all(data).ok()?;
    Some(f)
}

/// Opens `data` as a writable qcow2 image and uses it.
pub fn qcow2(data: &[u8]) {
    let Some(f) = memfd(data) else { return };
    let Ok(chain) = open(
        Path::new("/fuzz.qcow2"),
        Format::Qcow2,
        true,
        &mut Input(Some(f)),
    ) else {
        return;
    };
    let Some(access) = chain.image else { return };
    let img = Qcow2Image::new(access, &chain.links[0].file);
    let size = img.size();
    let mut buf = vec![0u8; 8192];
    for at in [0, 4096, size / 2, size.saturating_sub(8192)] {
        let _ = img.read(&mut buf, at);
        let _ = img.write(&buf[..4096], at);
    }
    let _ = img.discard(0, size.min(1 << 20));
    let _ = img.write_zeroes(size / 3, 4096);
    let _ = img.flush();
}

/// A small well-formed image to start from: 512-byte clusters (so the
/// metadata lies in the first pages the fuzzer mutates most), one cluster
/// of data written.
pub fn seed() -> Vec<u8> {
    let p = std::env::temp_dir().join(format!("domus-fuzz-seed-{}.qcow2", std::process::id()));
    let _ = std::fs::remove_file(&p);
    let made = create(
        &p,
        &CreateOptions {
            cluster_size: Some(512),
            ..CreateOptions::size(64 << 10)
        },
    )
    .and_then(|()| {
        let c = open(&p, Format::Qcow2, true, &mut crate::ByPath)?;
        let img = Qcow2Image::new(c.image.expect("qcow2"), &c.links[0].file);
        img.write(&[0x5a; 512], 1024)
            .and_then(|()| img.flush())
            .map_err(|e| Error::io(&p, e))
    });
    let data = made
        .ok()
        .and_then(|()| std::fs::read(&p).ok())
        .unwrap_or_default();
    let _ = std::fs::remove_file(&p);
    data
}

/// Reads `data` as a disk's partition table (`domus image import`).
pub fn partitions(data: &[u8]) {
    let mut read = |buf: &mut [u8], at: u64| {
        let at = usize::try_from(at).map_err(|_| std::io::ErrorKind::InvalidInput)?;
        let src = at
            .checked_add(buf.len())
            .and_then(|end| data.get(at..end))
            .ok_or(std::io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(src);
        Ok(())
    };
    let _ = crate::partitions::partitions(&mut read, data.len() as u64);
}

/// A small disk with a GPT of two partitions, for the `partitions` target.
pub fn partition_seed() -> Vec<u8> {
    let mut d = vec![0u8; 64 << 10];
    crate::partitions::write_gpt(
        &mut d,
        &[
            (34, 63, crate::partitions::Kind::LINUX_ROOT_X86_64),
            (64, 127, [7u8; 16]),
        ],
    );
    d
}
