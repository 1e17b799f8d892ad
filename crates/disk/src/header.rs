//! The qcow2 header, read by Domus itself with every bound checked before
//! imago sees the file: what the daemon needs (size, backing file and its
//! format) without running imago in its process, and the checks of what
//! imago 0.2.6 mishandles on a hostile image (found by `domus-fuzz`: a
//! feature-name table whose length is not a multiple of 48 panics it, and
//! a refcount table without blocks for the image's own metadata sends its
//! allocator into recursion without end). The layout is QEMU's
//! docs/interop/qcow2.txt.

use std::fs::File;
use std::os::unix::fs::FileExt;

use crate::QCOW2_MAGIC;

const EXT_END: u32 = 0;
const EXT_BACKING_FORMAT: u32 = 0xe279_2aca;
const EXT_FEATURE_NAMES: u32 = 0x6803_f857;
/// QEMU's limit on a backing file name.
const MAX_BACKING_NAME: u32 = 1023;

/// Incompatible feature bits.
const DIRTY: u64 = 1;
const CORRUPT: u64 = 1 << 1;
const DATA_FILE: u64 = 1 << 2;

/// What Domus reads of a qcow2 header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub version: u32,
    pub cluster_bits: u32,
    /// The disk's size in bytes.
    pub size: u64,
    pub backing_file: Option<String>,
    pub backing_format: Option<String>,
    /// Uses an external data file (incompatible feature bit 2).
    pub data_file: bool,
    l1_entries: u64,
    l1_offset: u64,
    rt_offset: u64,
    rt_clusters: u64,
    refcount_order: u32,
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be64(b: &[u8], at: usize) -> u64 {
    (u64::from(be32(b, at)) << 32) | u64::from(be32(b, at + 4))
}

impl Header {
    /// Reads and checks the header of `file` (already known to start with
    /// qcow2's magic); the error says what is wrong.
    pub fn read(file: &File) -> Result<Header, String> {
        let mut h = [0u8; 104];
        let n = read_some(file, &mut h, 0)?;
        if n < 72 || h[..4] != QCOW2_MAGIC {
            return Err("its header is cut short".into());
        }
        let version = be32(&h, 4);
        if !(2..=3).contains(&version) {
            return Err(format!("version {version} (Domus reads 2 and 3)"));
        }
        let cluster_bits = be32(&h, 20);
        if !(9..=21).contains(&cluster_bits) {
            return Err(format!("cluster_bits {cluster_bits} is not 9 to 21"));
        }
        let cluster = 1u64 << cluster_bits;
        if be32(&h, 32) != 0 {
            return Err("it is encrypted, which Domus does not support".into());
        }
        let (incompatible, refcount_order, header_len) = if version == 3 {
            if n < 104 {
                return Err("its version 3 header is cut short".into());
            }
            (be64(&h, 72), be32(&h, 96), be32(&h, 100))
        } else {
            (0, 4, 72)
        };
        if incompatible & DIRTY != 0 {
            return Err("it was not closed cleanly (the dirty bit is set): \
                        repair it with `qemu-img check -r all`"
                .into());
        }
        if incompatible & CORRUPT != 0 {
            return Err("it is marked corrupt: repair it with `qemu-img check -r all`".into());
        }
        if refcount_order > 6 {
            return Err(format!("refcount_order {refcount_order} is over 6"));
        }
        if u64::from(header_len) < 72 || u64::from(header_len) > cluster {
            return Err(format!(
                "header_length {header_len} is outside its first cluster"
            ));
        }
        let mut hd = Header {
            version,
            cluster_bits,
            size: be64(&h, 24),
            backing_file: None,
            backing_format: None,
            data_file: incompatible & DATA_FILE != 0,
            l1_entries: u64::from(be32(&h, 36)),
            l1_offset: be64(&h, 40),
            rt_offset: be64(&h, 48),
            rt_clusters: u64::from(be32(&h, 56)),
            refcount_order,
        };
        // The first cluster: extensions and the backing file name lie in it.
        let mut first = vec![0u8; cluster as usize];
        let got = read_some(file, &mut first, 0)?;
        first.truncate(got);
        let (name_at, name_len) = (be64(&h, 8), be32(&h, 16));
        if name_at != 0 {
            if name_len == 0 || name_len > MAX_BACKING_NAME {
                return Err(format!(
                    "its backing file name is {name_len} bytes long (1 to {MAX_BACKING_NAME})"
                ));
            }
            let name = first
                .get(name_at as usize..)
                .and_then(|b| b.get(..name_len as usize))
                .filter(|_| name_at < cluster)
                .ok_or("its backing file name lies outside its first cluster")?;
            let name =
                std::str::from_utf8(name).map_err(|_| "its backing file name is not UTF-8")?;
            hd.backing_file = Some(name.to_string());
        }
        let mut at = header_len as usize;
        loop {
            let Some(e) = first.get(at..at + 8) else {
                return Err("its header extensions run past its first cluster".into());
            };
            let (kind, len) = (be32(e, 0), be32(e, 4) as usize);
            if kind == EXT_END {
                break;
            }
            let data = first
                .get(at + 8..)
                .and_then(|d| d.get(..len))
                .ok_or("a header extension runs past its first cluster")?;
            match kind {
                EXT_BACKING_FORMAT => {
                    let f =
                        std::str::from_utf8(data).map_err(|_| "its backing format is not UTF-8")?;
                    hd.backing_format = Some(f.to_string());
                }
                EXT_FEATURE_NAMES if len % 48 != 0 => {
                    return Err(format!(
                        "its feature name table is {len} bytes, not entries of 48"
                    ));
                }
                _ => {}
            }
            at = at + 8 + len.next_multiple_of(8);
        }
        Ok(hd)
    }

    /// Whether the refcount table has blocks for the image's own metadata
    /// (the header, the L1 table and the refcount table), as every valid
    /// image has: imago's allocator, which writes, relies on it.
    pub fn check_refcounts(&self, file: &File) -> Result<(), String> {
        let bits = self.cluster_bits;
        let rb_bits = bits + 3 - self.refcount_order;
        let rt_entries = self.rt_clusters << (bits - 3);
        let entry = |cluster: u64| -> Result<(), String> {
            let i = cluster >> rb_bits;
            if i >= rt_entries {
                return Err(format!(
                    "its refcount table ({rt_entries} entries) does not reach its own cluster {cluster}"
                ));
            }
            let mut e = [0u8; 8];
            let at = self
                .rt_offset
                .checked_add(i * 8)
                .ok_or("its refcount table lies past 2^64")?;
            if read_some(file, &mut e, at)? < 8 || u64::from_be_bytes(e) == 0 {
                return Err(format!(
                    "its refcount table has no block for its own cluster {cluster} \
                     (`qemu-img check -r all` may repair it)"
                ));
            }
            Ok(())
        };
        // The first clusters of each (a table of thousands of clusters is
        // not walked whole: this is a guard, not qemu-img check).
        let clusters = |at: u64, bytes: u64| {
            let first = at >> bits;
            let last = at.saturating_add(bytes.max(1) - 1) >> bits;
            first..=last.min(first.saturating_add(64))
        };
        for c in std::iter::once(0)
            .chain(clusters(self.l1_offset, self.l1_entries * 8))
            .chain(clusters(self.rt_offset, self.rt_clusters << bits))
        {
            entry(c)?;
        }
        Ok(())
    }
}

/// Reads what there is of `buf.len()` bytes at `at` (less at the end of
/// the file).
fn read_some(file: &File, buf: &mut [u8], at: u64) -> Result<usize, String> {
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], at + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("reading its header: {e}")),
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{create, CreateOptions, Format};

    #[test]
    fn the_header_domus_reads_is_the_one_written_and_every_cut_or_flip_is_an_error_or_a_header() {
        let d = crate::test_dir("header");
        let base = d.join("base.img");
        std::fs::write(&base, [0u8; 512]).unwrap();
        let top = d.join("top.qcow2");
        create(&top, &CreateOptions::overlay(&base, Format::Raw, 1 << 30)).unwrap();
        let f = File::open(&top).unwrap();
        let h = Header::read(&f).unwrap();
        assert_eq!((h.version, h.cluster_bits, h.size), (3, 16, 1 << 30));
        assert_eq!(h.backing_file.as_deref(), base.to_str());
        assert_eq!(h.backing_format.as_deref(), Some("raw"));
        assert!(!h.data_file);
        h.check_refcounts(&f).unwrap();
        let good = std::fs::read(&top).unwrap();
        let bad = d.join("bad.qcow2");
        for cut in [0, 4, 71, 100] {
            std::fs::write(&bad, &good[..cut]).unwrap();
            assert!(
                Header::read(&File::open(&bad).unwrap()).is_err(),
                "cut at {cut}"
            );
        }
        for at in 0..1024 {
            for v in [0u8, 0xff, 0x30] {
                let mut b = good.clone();
                b[at] = v;
                std::fs::write(&bad, &b).unwrap();
                let f = File::open(&bad).unwrap();
                if let Ok(h) = Header::read(&f) {
                    let _ = h.check_refcounts(&f);
                }
            }
        }
        std::fs::remove_dir_all(d).unwrap();
    }
}
