//! Carrying out parsed block requests against the image, straight between
//! the file and guest memory (preadv/pwritev into the guest's own pages for
//! a raw disk, imago's vectored I/O over the same pages for qcow2), on the
//! I/O pool's threads.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};

use vm_memory::bitmap::Bitmap;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use super::request::{Kind, Request, Segment, ID_BYTES, SECTOR_SIZE, S_IOERR, S_OK};
use crate::Memory;

/// Per-disk counters, readable while the device runs.
#[derive(Debug, Default)]
pub struct Counters {
    pub read_ops: AtomicU64,
    pub read_bytes: AtomicU64,
    pub write_ops: AtomicU64,
    pub write_bytes: AtomicU64,
    pub flush_ops: AtomicU64,
    pub discard_ops: AtomicU64,
    /// Requests answered with an error status (or dropped as unanswerable).
    pub errors: AtomicU64,
    /// Times a request had to wait for the rate limiter.
    pub throttled: AtomicU64,
}

/// How a disk's data is reached.
pub enum Backend {
    Raw(File),
    Qcow2(domus_disk::Qcow2Image),
}

/// What the I/O threads share.
pub struct Disk {
    pub backend: Backend,
    /// Every file of the disk's chain, and whether its lock is shared (the
    /// disk itself when read-only, and its backing files).
    pub locks: Vec<(File, bool)>,
    pub read_only: bool,
    pub id: [u8; ID_BYTES],
    pub counters: Counters,
}

impl crate::Stats for Disk {
    fn counters(&self) -> Vec<(&'static str, u64)> {
        let c = &self.counters;
        [
            ("read_ops", &c.read_ops),
            ("read_bytes", &c.read_bytes),
            ("write_ops", &c.write_ops),
            ("write_bytes", &c.write_bytes),
            ("flush_ops", &c.flush_ops),
            ("discard_ops", &c.discard_ops),
            ("errors", &c.errors),
            ("throttled", &c.throttled),
        ]
        .into_iter()
        .map(|(n, v)| (n, v.load(Ordering::Relaxed)))
        .collect()
    }
}

fn add(c: &AtomicU64, v: u64) {
    c.fetch_add(v, Ordering::Relaxed);
}

/// iovecs over the request's buffers (each checked to lie in one region).
/// Buffers the disk is read into (`into_guest`) are marked dirty in
/// guest memory's bitmap first: preadv writes them behind `vm-memory`'s
/// back.
fn iovecs(mem: &Memory, req: &Request, into_guest: bool) -> Option<Vec<libc::iovec>> {
    req.data
        .iter()
        .map(|d| {
            let s = mem.get_slice(GuestAddress(d.addr), d.len as usize).ok()?;
            if into_guest {
                s.bitmap().mark_dirty(0, s.len());
            }
            Some(libc::iovec {
                iov_base: s.ptr_guard_mut().as_ptr().cast(),
                iov_len: s.len(),
            })
        })
        .collect()
}

/// Runs preadv/pwritev until all of `iov` is transferred.
fn transfer(file: &File, mut iov: Vec<libc::iovec>, mut offset: u64, write: bool) -> bool {
    let fd = file.as_raw_fd();
    let mut first = 0;
    while first < iov.len() {
        let n = iov.len() - first;
        let cnt = n.min(1024) as libc::c_int;
        let ptr = iov[first..].as_ptr();
        // SAFETY: every iovec points into guest memory that stays mapped
        // for the life of the VM (checked by get_slice), and `ptr` and
        // `cnt` describe live entries of `iov`.
        let r = unsafe {
            if write {
                libc::pwritev(fd, ptr, cnt, offset as libc::off_t)
            } else {
                libc::preadv(fd, ptr, cnt, offset as libc::off_t)
            }
        };
        if r < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return false;
        }
        if r == 0 {
            return false; // end of file inside the disk: the image shrank
        }
        let mut done = r as usize;
        offset += done as u64;
        while done > 0 && first < iov.len() {
            let v = &mut iov[first];
            if done >= v.iov_len {
                done -= v.iov_len;
                first += 1;
            } else {
                // SAFETY: `done` < iov_len, so the new base stays inside
                // the same buffer.
                v.iov_base = unsafe { v.iov_base.cast::<u8>().add(done).cast() };
                v.iov_len -= done;
                done = 0;
            }
        }
    }
    true
}

fn zero_range(file: &File, seg: &Segment) -> bool {
    let off = seg.sector * SECTOR_SIZE;
    let len = u64::from(seg.sectors) * SECTOR_SIZE;
    if len == 0 {
        return true;
    }
    // SAFETY: fallocate on our own descriptor; no memory is involved.
    let r = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off as libc::off_t,
            len as libc::off_t,
        )
    };
    if r == 0 {
        return true;
    }
    // No hole punching here (some filesystems): write zeroes instead.
    let zeros = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < len {
        let n = (len - at).min(zeros.len() as u64) as usize;
        if std::os::unix::fs::FileExt::write_all_at(file, &zeros[..n], off + at).is_err() {
            return false;
        }
        at += n as u64;
    }
    true
}

/// Reads or writes a qcow2 disk; reads mark the guest pages they fill
/// dirty (imago's guard does, as the slices are let go).
fn qcow2_transfer(img: &domus_disk::Qcow2Image, mem: &Memory, req: &Request, write: bool) -> bool {
    // The request's buffers (each checked to lie in one region).
    let bufs: Option<Vec<_>> = req
        .data
        .iter()
        .map(|d| mem.get_slice(GuestAddress(d.addr), d.len as usize).ok())
        .collect();
    let Some(bufs) = bufs else {
        return false;
    };
    let at = req.sector * SECTOR_SIZE;
    let r = if write {
        img.write_from(&bufs, at)
    } else {
        img.read_into(&bufs, at)
    };
    if let Err(e) = &r {
        tracing::warn!(
            "qcow2 {} at sector {}: {e}",
            if write { "write" } else { "read" },
            req.sector
        );
    }
    r.is_ok()
}

fn rw(disk: &Disk, mem: &Memory, req: &Request, write: bool) -> bool {
    match &disk.backend {
        Backend::Raw(file) => iovecs(mem, req, !write)
            .is_some_and(|iov| transfer(file, iov, req.sector * SECTOR_SIZE, write)),
        Backend::Qcow2(img) => qcow2_transfer(img, mem, req, write),
    }
}

fn flush(disk: &Disk) -> bool {
    match &disk.backend {
        Backend::Raw(file) => file.sync_data().is_ok(),
        Backend::Qcow2(img) => img.flush().is_ok(),
    }
}

/// Discard and write-zeroes: the range reads as zeroes after.
fn zero(disk: &Disk, seg: &Segment) -> bool {
    match &disk.backend {
        Backend::Raw(file) => zero_range(file, seg),
        Backend::Qcow2(img) => {
            let off = seg.sector.saturating_mul(SECTOR_SIZE);
            let len = u64::from(seg.sectors) * SECTOR_SIZE;
            len == 0 || img.discard(off, len).is_ok()
        }
    }
}

/// Carries out `req`; returns the status byte for the guest.
pub fn execute(disk: &Disk, mem: &Memory, req: &Request) -> u8 {
    let c = &disk.counters;
    let ok = match req.kind {
        Kind::In => {
            add(&c.read_ops, 1);
            add(&c.read_bytes, req.data_len);
            rw(disk, mem, req, false)
        }
        Kind::Out if disk.read_only => false,
        Kind::Out => {
            add(&c.write_ops, 1);
            add(&c.write_bytes, req.data_len);
            rw(disk, mem, req, true)
        }
        Kind::Flush => {
            add(&c.flush_ops, 1);
            disk.read_only || flush(disk)
        }
        Kind::GetId => {
            let mut left = &disk.id[..];
            for d in &req.data {
                let n = left.len().min(d.len as usize);
                if mem.write_slice(&left[..n], GuestAddress(d.addr)).is_err() {
                    break;
                }
                left = &left[n..];
            }
            true
        }
        Kind::Discard | Kind::WriteZeroes if disk.read_only => false,
        Kind::Discard | Kind::WriteZeroes => {
            add(&c.discard_ops, 1);
            // Punched holes read as zeroes, so both requests punch holes
            // (write-zeroes without UNMAP is still correct: zeroes read back).
            req.segments.iter().all(|s| zero(disk, s))
        }
    };
    if ok {
        S_OK
    } else {
        add(&c.errors, 1);
        S_IOERR
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::request::Desc;

    fn request(kind: Kind, addr: u64, len: u32) -> Request {
        Request {
            kind,
            sector: 0,
            data: vec![Desc {
                addr,
                len,
                write: kind == Kind::In,
            }],
            data_len: u64::from(len),
            segments: Vec::new(),
            status: GuestAddress(0),
        }
    }

    #[test]
    fn a_disk_read_marks_the_guest_pages_it_filled_dirty_and_a_write_none() {
        let path = std::env::temp_dir().join(format!("domus-io-dirty-{}.img", std::process::id()));
        std::fs::write(&path, vec![5u8; 64 << 10]).unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let disk = Disk {
            locks: vec![(file.try_clone().unwrap(), false)],
            backend: Backend::Raw(file),
            read_only: false,
            id: [0; ID_BYTES],
            counters: Counters::default(),
        };
        let mem = Memory::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let bitmap = || crate::take_dirty(&mem)[0].clone();
        bitmap();
        // 3 pages from the middle of page 2: pages 2, 3, 4 and 5 are written.
        assert_eq!(
            execute(&disk, &mem, &request(Kind::In, 0x2800, 3 * 4096)),
            S_OK
        );
        assert_eq!(bitmap()[0], 0b11_1100);
        let mut b = [0u8; 4];
        mem.read_slice(&mut b, GuestAddress(0x2800)).unwrap();
        assert_eq!(b, [5; 4]);
        assert_eq!(
            execute(&disk, &mem, &request(Kind::Out, 0x8000, 4096)),
            S_OK
        );
        assert_eq!(bitmap()[0], 0, "a disk write only reads guest memory");
        std::fs::remove_file(&path).unwrap();
    }
}
