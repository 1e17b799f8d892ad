//! A qcow2 disk served to several I/O threads at once.
//!
//! Reads, writes and write-zeroes run side by side (imago serialises what
//! must be); a discard, which may free clusters other requests are using,
//! runs alone. A flush writes imago's cached metadata and then syncs the
//! file, so a flushed write survives the VMM's death with the metadata that
//! finds it.
//!
//! imago (0.2.6) writes a new L2 table's L1 entry to the file at once but
//! keeps the refcount that makes the table's cluster used in its cache
//! until the next flush: a VMM killed in between leaves an image whose
//! refcounts are wrong (`qemu-img check`: "refcount=0 reference=1"), not
//! merely leaked clusters. So the first request that writes into each L1
//! entry's range (512 MiB with 64 KiB clusters) is followed by a write of
//! the cached metadata (no sync): after it, the file is consistent again.

use std::io;
use std::os::unix::fs::FileExt;
use std::sync::{Mutex, RwLock};

use imago::io_buffers::{IoVector, IoVectorMut};
use imago::FormatAccess;
use vm_memory::bitmap::BitmapSlice;
use vm_memory::VolatileSlice;

type Storage = imago::file::File;

pub struct Qcow2Image {
    access: RwLock<FormatAccess<Storage>>,
    size: u64,
    /// log2 of the guest bytes one L1 entry maps.
    l1_shift: u32,
    /// The L1 entries written into since this image was opened, and their
    /// metadata written out after it (see the module's documentation); a
    /// set, as the disk's size is the header's word.
    touched: Mutex<std::collections::HashSet<u64>>,
}

fn poisoned() -> io::Error {
    io::Error::other("an earlier request on this image panicked")
}

impl Qcow2Image {
    /// The image opened on `file` (its header gives the cluster size).
    pub fn new(access: FormatAccess<Storage>, file: &std::fs::File) -> Self {
        let size = access.size();
        // cluster_bits, at byte 20 of the header; imago has checked it lies
        // in 9..=21. Unreadable, the smallest ranges are assumed: more
        // metadata writes, never fewer.
        let mut b = [0u8; 4];
        let bits = match file.read_exact_at(&mut b, 20) {
            Ok(()) => u32::from_be_bytes(b).clamp(9, 21),
            Err(_) => 9,
        };
        // An L2 table is one cluster of 8-byte entries, each a cluster.
        Qcow2Image {
            access: RwLock::new(access),
            size,
            l1_shift: bits + bits - 3,
            touched: Mutex::new(Default::default()),
        }
    }

    /// The qcow2 image at `path` with its backing chain, each file opened
    /// by its path ([`crate::ByPath`]): for tools and tests; the VMM opens
    /// its disks through its own [`crate::Opener`].
    pub fn open_path(path: &std::path::Path, write: bool) -> Result<Self, crate::Error> {
        let chain = crate::open(path, crate::Format::Qcow2, write, &mut crate::ByPath)?;
        let access = chain.image.ok_or_else(|| crate::Error::Corrupt {
            path: path.display().to_string(),
            reason: "not opened as qcow2".into(),
        })?;
        Ok(Self::new(access, &chain.links[0].file))
    }

    /// After a request that wrote `len` bytes at `offset`: writes the
    /// cached metadata out if it was the first into an L1 entry's range.
    fn settle(&self, offset: u64, len: u64) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        // `check` kept offset + len within the disk.
        let range = (offset >> self.l1_shift)..=((offset + len - 1) >> self.l1_shift);
        let mut t = self.touched.lock().map_err(|_| poisoned())?;
        if range.clone().all(|i| t.contains(&i)) {
            return Ok(());
        }
        self.access.read().map_err(|_| poisoned())?.flush()?;
        t.extend(range);
        Ok(())
    }

    /// The disk's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    fn check(&self, offset: u64, len: u64) -> io::Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{len} bytes at {offset} lie beyond the disk's {} bytes",
                    self.size
                ),
            )),
        }
    }

    /// Reads the disk at `offset` into `bufs` (which the read marks dirty).
    pub fn read_into<B: BitmapSlice>(
        &self,
        bufs: &[VolatileSlice<'_, B>],
        offset: u64,
    ) -> io::Result<()> {
        let (v, _guard) = IoVectorMut::from_volatile_slice(bufs);
        self.check(offset, v.len())?;
        self.access.read().map_err(|_| poisoned())?.readv(v, offset)
    }

    /// Writes `bufs` to the disk at `offset`.
    pub fn write_from<B: BitmapSlice>(
        &self,
        bufs: &[VolatileSlice<'_, B>],
        offset: u64,
    ) -> io::Result<()> {
        let (v, _guard) = IoVector::from_volatile_slice(bufs);
        let len = v.len();
        self.check(offset, len)?;
        self.access
            .read()
            .map_err(|_| poisoned())?
            .writev(v, offset)?;
        self.settle(offset, len)
    }

    /// Reads into a plain buffer (tests and tools).
    pub fn read(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check(offset, buf.len() as u64)?;
        self.access
            .read()
            .map_err(|_| poisoned())?
            .read(buf, offset)
    }

    /// Writes a plain buffer (tests and tools).
    pub fn write(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.check(offset, buf.len() as u64)?;
        self.access
            .read()
            .map_err(|_| poisoned())?
            .write(buf, offset)?;
        self.settle(offset, buf.len() as u64)
    }

    /// Makes the range read as zeroes, keeping its allocation.
    pub fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check(offset, len)?;
        self.access
            .read()
            .map_err(|_| poisoned())?
            .write_zeroes(offset, len)?;
        self.settle(offset, len)
    }

    /// Makes the range read as zeroes and gives back the clusters it can
    /// (the file gets holes where they were).
    pub fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check(offset, len)?;
        self.access
            .write()
            .map_err(|_| poisoned())?
            .discard_to_zero(offset, len)?;
        self.settle(offset, len)
    }

    /// Writes cached metadata and syncs the file.
    pub fn flush(&self) -> io::Result<()> {
        let a = self.access.read().map_err(|_| poisoned())?;
        a.flush()?;
        a.sync()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{create, open, ByPath, CreateOptions, Format};

    use crate::test_dir as dir;

    fn image(path: &std::path::Path, write: bool) -> Qcow2Image {
        let c = open(path, Format::Qcow2, write, &mut ByPath).unwrap();
        Qcow2Image::new(c.image.unwrap(), &c.links[0].file)
    }

    #[test]
    fn two_overlays_on_one_base_see_only_their_own_writes_and_the_base_is_unchanged() {
        let d = dir("overlays");
        let base = d.join("base.img");
        let mut b = vec![0u8; 1 << 20];
        for (i, x) in b.iter_mut().enumerate() {
            *x = (i / 512) as u8;
        }
        std::fs::write(&base, &b).unwrap();
        let (o1, o2) = (d.join("o1.qcow2"), d.join("o2.qcow2"));
        for o in [&o1, &o2] {
            create(o, &CreateOptions::overlay(&base, Format::Raw, 1 << 20)).unwrap();
        }
        let (i1, i2) = (image(&o1, true), image(&o2, true));
        i1.write(&[0xaa; 4096], 8192).unwrap();
        i2.write(&[0xbb; 512], 8192 + 512).unwrap();
        i1.flush().unwrap();
        i2.flush().unwrap();
        let mut r = vec![0u8; 4096];
        i1.read(&mut r, 8192).unwrap();
        assert!(r.iter().all(|&x| x == 0xaa));
        i2.read(&mut r, 8192).unwrap();
        assert_eq!(
            &r[..512],
            &b[8192..8192 + 512],
            "o2 reads the base around its write"
        );
        assert!(r[512..1024].iter().all(|&x| x == 0xbb));
        assert_eq!(&r[1024..], &b[8192 + 1024..8192 + 4096]);
        assert_eq!(std::fs::read(&base).unwrap(), b, "the base is unchanged");
        drop((i1, i2));
        // Reopened, the writes are there.
        let again = image(&o1, false);
        again.read(&mut r, 8192).unwrap();
        assert!(r.iter().all(|&x| x == 0xaa));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn discard_reads_back_zeroes_over_a_base_and_requests_past_the_end_fail() {
        let d = dir("discard");
        let base = d.join("base.img");
        std::fs::write(&base, vec![0x11u8; 1 << 20]).unwrap();
        let o = d.join("o.qcow2");
        create(&o, &CreateOptions::overlay(&base, Format::Raw, 1 << 20)).unwrap();
        let i = image(&o, true);
        i.write(&[0x22; 65536], 0).unwrap();
        i.discard(0, 131072).unwrap();
        let mut r = vec![1u8; 131072];
        i.read(&mut r, 0).unwrap();
        assert!(
            r.iter().all(|&x| x == 0),
            "discarded clusters read as zeroes, not the base"
        );
        assert!(i.read(&mut r, (1 << 20) - 4096).is_err());
        assert!(i.write_zeroes(u64::MAX - 10, 20).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_read_only_image_refuses_writes() {
        let d = dir("ro");
        let q = d.join("q.qcow2");
        create(&q, &CreateOptions::size(1 << 20)).unwrap();
        let i = image(&q, false);
        assert!(i.write(&[1; 512], 0).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }
}

/// Interoperability with QEMU's own tool (qemu-img, from tools/setup).
#[cfg(test)]
mod qemu_img {
    use super::*;
    use crate::{create, open, ByPath, CreateOptions, Format};
    use std::path::Path;
    use std::process::Command;

    fn qemu_img(args: &[&str]) -> std::process::Output {
        let out = Command::new("qemu-img")
            .args(args)
            .output()
            .expect("qemu-img (tools/setup installs qemu-utils)");
        assert!(
            out.status.success(),
            "qemu-img {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    fn s(p: &Path) -> &str {
        p.to_str().unwrap()
    }

    #[test]
    fn an_overlay_qemu_img_made_is_written_by_domus_and_one_domus_made_passes_qemu_img_check() {
        let d = std::env::temp_dir().join(format!("domus-qemu-img-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let base = d.join("base.qcow2");
        let raw = d.join("base.raw");
        let mut b = vec![0u8; 4 << 20];
        for (i, x) in b.iter_mut().enumerate() {
            *x = (i / 4096) as u8 ^ 0x5a;
        }
        std::fs::write(&raw, &b).unwrap();
        // A qcow2 base of QEMU's making, and an overlay on it by qemu-img.
        qemu_img(&["convert", "-f", "raw", "-O", "qcow2", s(&raw), s(&base)]);
        let theirs = d.join("theirs.qcow2");
        qemu_img(&[
            "create",
            "-q",
            "-f",
            "qcow2",
            "-b",
            s(&base),
            "-F",
            "qcow2",
            s(&theirs),
        ]);
        // One of Domus's making on the same base.
        let ours = d.join("ours.qcow2");
        create(
            &ours,
            &CreateOptions::overlay(&base, Format::Qcow2, 4 << 20),
        )
        .unwrap();
        for (o, fill) in [(&theirs, 0xc3u8), (&ours, 0x3c)] {
            let c = open(o, Format::Qcow2, true, &mut ByPath).unwrap();
            assert_eq!(c.links.len(), 2);
            let img = Qcow2Image::new(c.image.unwrap(), &c.links[0].file);
            // Across a cluster boundary, and a whole cluster further on.
            img.write(&vec![fill; 8192], 65536 - 4096).unwrap();
            img.write(&vec![fill; 65536], 1 << 20).unwrap();
            img.discard(2 << 20, 65536).unwrap();
            img.flush().unwrap();
            drop(img);
            qemu_img(&["check", "-q", s(o)]);
            let out = d.join("out.raw");
            let _ = std::fs::remove_file(&out);
            qemu_img(&["convert", "-O", "raw", s(o), s(&out)]);
            let mut want = b.clone();
            want[65536 - 4096..65536 + 4096].fill(fill);
            want[1 << 20..(1 << 20) + 65536].fill(fill);
            want[2 << 20..(2 << 20) + 65536].fill(0);
            assert!(
                std::fs::read(&out).unwrap() == want,
                "{} reads back as written",
                o.display()
            );
        }
        // A VMM killed after unflushed writes (the image is never dropped,
        // so nothing more is written): clusters may leak (qemu-img check's
        // status 3) but no refcount may be wrong (2).
        let killed = d.join("killed.qcow2");
        create(
            &killed,
            &CreateOptions::overlay(&base, Format::Qcow2, 4 << 20),
        )
        .unwrap();
        let c = open(&killed, Format::Qcow2, true, &mut ByPath).unwrap();
        let img = Qcow2Image::new(c.image.unwrap(), &c.links[0].file);
        img.write(&[9u8; 4096], 12288).unwrap();
        img.write(&[9u8; 4096], 3 << 20).unwrap();
        std::mem::forget(img);
        let st = Command::new("qemu-img")
            .args(["check", "-q", s(&killed)])
            .output()
            .unwrap();
        assert!(
            matches!(st.status.code(), Some(0 | 3)),
            "{st:?}: {}",
            String::from_utf8_lossy(&st.stdout)
        );
        let info = qemu_img(&["info", s(&ours)]);
        let info = String::from_utf8_lossy(&info.stdout);
        assert!(info.contains("backing file format: qcow2"), "{info}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
