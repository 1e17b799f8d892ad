//! qcow2 against raw, without a VM: where a qcow2 overlay's write cost
//! comes from (bench/io's "qcow2/Domus" rows measure it through a guest).
//!
//! `cargo run --release -p domus-disk --example qcow2_vs_raw -- DIR [MIB]`
//!
//! In DIR (on the file system the VMM's images are on: tmpfs in bench/io
//! by default, ext4 on the nested host's scratch disk, /var/tmp, with
//! STORE=disk) it makes a raw base of MIB MiB (default 256), a raw disk of the
//! same size, and qcow2 overlays on the base; then it writes each the way
//! bench/io's guest does (1 MiB sequential writes, 4 KiB random writes)
//! through Domus's own I/O paths: pwritev for raw, `Qcow2Image::write_from`
//! with one 4 KiB slice per guest page for qcow2. Rows: the raw disk, a
//! fresh overlay (every write allocates; 4 KiB ones copy the rest of their
//! 64 KiB cluster from the base), and the same overlay again (clusters
//! allocated); and 4 KiB random reads (preadv, `Qcow2Image::read_into`) of
//! the raw disk, of a fresh overlay (its base's data) and of the overlay
//! once every cluster is its own. Prints one line per row and a JSON line
//! at the end.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use domus_disk::{create, CreateOptions, Format, Qcow2Image};
use vm_memory::VolatileSlice;

const MIB: usize = 1 << 20;
const PAGE: usize = 4096;

/// A disk as the VMM's I/O threads reach it.
enum Disk {
    Raw(File),
    Qcow2(Qcow2Image),
}

impl Disk {
    /// Writes `buf` at `at`, one slice per 4 KiB page as a guest's
    /// scattered pages arrive.
    fn write(&self, buf: &mut [u8], at: u64) {
        self.transfer(buf, at, true);
    }

    /// Writes `buf` at `at` (or reads into it), one slice per 4 KiB page.
    fn transfer(&self, buf: &mut [u8], at: u64, write: bool) {
        match self {
            Disk::Raw(f) => {
                let iov: Vec<libc::iovec> = buf
                    .chunks_mut(PAGE)
                    .map(|c| libc::iovec {
                        iov_base: c.as_mut_ptr().cast(),
                        iov_len: c.len(),
                    })
                    .collect();
                let (fd, cnt) = (f.as_raw_fd(), iov.len() as libc::c_int);
                // SAFETY: every iovec points into `buf`, alive and not
                // otherwise borrowed for the call.
                let n = unsafe {
                    if write {
                        libc::pwritev(fd, iov.as_ptr(), cnt, at as libc::off_t)
                    } else {
                        libc::preadv(fd, iov.as_ptr(), cnt, at as libc::off_t)
                    }
                };
                assert_eq!(n as usize, buf.len(), "short raw transfer");
            }
            Disk::Qcow2(img) => {
                let slices: Vec<VolatileSlice<'_, ()>> =
                    buf.chunks_mut(PAGE).map(VolatileSlice::from).collect();
                if write {
                    img.write_from(&slices, at).expect("qcow2 write");
                } else {
                    img.read_into(&slices, at).expect("qcow2 read");
                }
            }
        }
    }
}

/// A small xorshift: the same offsets for every row.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn filled(path: &Path, mib: usize, byte: u8) {
    let f = File::create(path).expect("create");
    let chunk = vec![byte; MIB];
    for i in 0..mib {
        f.write_all_at(&chunk, (i * MIB) as u64).expect("fill");
    }
}

fn overlay(dir: &Path, name: &str, base: &Path, mib: usize) -> (PathBuf, Disk) {
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    create(
        &path,
        &CreateOptions::overlay(base, Format::Raw, (mib * MIB) as u64),
    )
    .expect("overlay");
    let img = Qcow2Image::open_path(&path, true).expect("open overlay");
    (path, Disk::Qcow2(img))
}

/// MB/s of 1 MiB sequential writes over the whole disk.
fn sequential(d: &Disk, mib: usize) -> f64 {
    let mut buf = vec![0x5au8; MIB];
    let t = Instant::now();
    for i in 0..mib {
        d.write(&mut buf, (i * MIB) as u64);
    }
    (mib * MIB) as f64 / t.elapsed().as_secs_f64() / 1e6
}

/// IOPS of `n` 4 KiB writes (or reads) at random 4 KiB-aligned offsets:
/// writes and reads each take their own fixed sequence of offsets.
fn random(d: &Disk, mib: usize, n: usize, write: bool) -> f64 {
    let (byte, seed) = if write {
        (0xa5u8, 0x9e37_79b9_7f4a_7c15)
    } else {
        (0, 0x2545_f491_4f6c_dd1d)
    };
    let mut buf = vec![byte; PAGE];
    let mut rng = Rng(seed);
    let pages = (mib * MIB / PAGE) as u64;
    let t = Instant::now();
    for _ in 0..n {
        d.transfer(&mut buf, (rng.next() % pages) * PAGE as u64, write);
    }
    n as f64 / t.elapsed().as_secs_f64()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().expect("usage: qcow2_vs_raw DIR [MIB]"));
    let mib: usize = args.next().map_or(256, |s| s.parse().expect("MIB"));
    let n = (mib * 8).max(256);
    std::fs::create_dir_all(&dir).expect("DIR");
    let base = dir.join("base.raw");
    let raw = dir.join("disk.raw");
    filled(&base, mib, 1);
    filled(&raw, mib, 1);
    let rawd = Disk::Raw(
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(&raw)
            .expect("raw"),
    );

    let mut rows = Vec::new();
    let raw_seq = sequential(&rawd, mib);
    let raw_rand = random(&rawd, mib, n, true);
    let raw_read = random(&rawd, mib, n, false);
    rows.push(("raw", raw_seq, raw_rand));
    rows.push(("raw random read (IOPS)", raw_read, raw_read));
    // A raw file made sparse: its writes allocate the file system's pages,
    // as an overlay's do.
    let sparse = dir.join("sparse.raw");
    let sparse_disk = || {
        let f = File::create(&sparse).expect("sparse");
        f.set_len((mib * MIB) as u64).expect("sparse size");
        Disk::Raw(f)
    };
    let sparse_seq = sequential(&sparse_disk(), mib);
    let sparse_rand = random(&sparse_disk(), mib, n, true);
    rows.push(("raw, sparse file", sparse_seq, sparse_rand));
    let (p1, seq_fresh, seq_again, read_base, read_used) = {
        let (p, d) = overlay(&dir, "seq.qcow2", &base, mib);
        // Reads of a fresh overlay go to its base.
        let base_read = random(&d, mib, n, false);
        let fresh = sequential(&d, mib);
        let again = sequential(&d, mib);
        // Every cluster is the overlay's own now.
        let used_read = random(&d, mib, n, false);
        rows.push(("qcow2 sequential, fresh / again", fresh, again));
        rows.push((
            "qcow2 random read, from base / used (IOPS)",
            base_read,
            used_read,
        ));
        (p, fresh, again, base_read, used_read)
    };
    let (p2, rand_fresh, rand_again) = {
        let (p, d) = overlay(&dir, "rand.qcow2", &base, mib);
        let fresh = random(&d, mib, n, true);
        let again = random(&d, mib, n, true);
        rows.push(("qcow2 random, fresh / again (IOPS)", fresh, again));
        (p, fresh, again)
    };
    println!("{:40} {:>10} {:>10}", "", "MB/s", "IOPS");
    for (name, a, b) in &rows {
        println!("{name:40} {a:10.1} {b:10.1}");
    }
    println!(
        "{{\"mib\":{mib},\"random_writes\":{n},\"raw_seq_mbs\":{raw_seq:.1},\"raw_rand_iops\":{raw_rand:.1},\
         \"sparse_seq_mbs\":{sparse_seq:.1},\"sparse_rand_iops\":{sparse_rand:.1},\
         \"qcow2_seq_fresh_mbs\":{seq_fresh:.1},\"qcow2_seq_again_mbs\":{seq_again:.1},\
         \"qcow2_rand_fresh_iops\":{rand_fresh:.1},\"qcow2_rand_again_iops\":{rand_again:.1},\
         \"raw_read_iops\":{raw_read:.1},\"qcow2_read_base_iops\":{read_base:.1},\
         \"qcow2_read_used_iops\":{read_used:.1}}}"
    );
    for p in [&base, &raw, &sparse, &p1, &p2] {
        let _ = std::fs::remove_file(p);
    }
}
