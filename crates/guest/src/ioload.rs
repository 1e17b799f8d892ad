//! `domus-guest ioload PATH SECONDS [first-write]`: sequential read and write
//! (1 MiB blocks) and 4 KiB random read and write (one at a time) against a
//! file or block device, each for SECONDS, with O_DIRECT where the file
//! system allows it. Prints one `key=value` line per result, for bench/io.
//!
//! The timed tests go round the device (its first 256 MiB) as often as they
//! have time for, so a fast disk's sequential write rewrites what it wrote
//! a second before while a slow one writes only new space. `first-write`
//! first writes the whole of it once, timed (`first_write_mbs`): what a
//! write into space the disk has not held yet costs, the same bytes for
//! every disk (a thin image allocates them in the host as it goes); the
//! timed tests then run on written space.

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::time::{Duration, Instant};

const BIG: usize = 1 << 20;
const SMALL: usize = 4096;

/// A buffer aligned for O_DIRECT.
struct Aligned {
    ptr: *mut u8,
    len: usize,
}

impl Aligned {
    fn new(len: usize) -> Self {
        let layout = std::alloc::Layout::from_size_align(len, 4096).expect("layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory");
        Self { ptr, len }
    }
    fn slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` points to `len` bytes we allocated and own.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

fn open(path: &str) -> (File, bool) {
    let direct = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path);
    match direct {
        Ok(f) => (f, true),
        Err(_) => (
            OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .unwrap_or_else(|e| panic!("{path}: {e}")),
            false,
        ),
    }
}

/// xorshift64*.
pub fn next(s: &mut u64) -> u64 {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    s.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

fn run(secs: f64, mut op: impl FnMut(u64)) -> (u64, f64) {
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let mut n = 0;
    while Instant::now() < end {
        op(n);
        n += 1;
    }
    (n, start.elapsed().as_secs_f64())
}

pub fn main(args: &[String]) {
    let first_write = match (args.len(), args.get(2).map(String::as_str)) {
        (2, _) => false,
        (3, Some("first-write")) => true,
        _ => crate::usage(),
    };
    let secs: f64 = args[1].parse().expect("SECONDS");
    let (mut f, direct) = open(&args[0]);
    let size = f.seek(SeekFrom::End(0)).expect("size").min(256 << 20);
    let big_blocks = size / BIG as u64;
    let small_blocks = size / SMALL as u64;
    assert!(big_blocks > 0, "{} is smaller than 1 MiB", args[0]);
    let mut buf = Aligned::new(BIG);
    for (i, b) in buf.slice().iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    println!("direct={}", u8::from(direct));
    let sync = |f: &File| {
        if !direct {
            let _ = f.sync_data();
        }
    };

    if first_write {
        let start = Instant::now();
        for i in 0..big_blocks {
            f.write_all_at(buf.slice(), i * BIG as u64).expect("write");
        }
        sync(&f);
        let t = start.elapsed().as_secs_f64();
        println!(
            "first_write_mbs={:.1}",
            big_blocks as f64 * BIG as f64 / t / 1e6
        );
    }

    let (n, t) = run(secs, |i| {
        f.write_all_at(buf.slice(), (i % big_blocks) * BIG as u64)
            .expect("write");
    });
    sync(&f);
    println!("seq_write_mbs={:.1}", n as f64 * BIG as f64 / t / 1e6);

    let (n, t) = run(secs, |i| {
        f.read_exact_at(buf.slice(), (i % big_blocks) * BIG as u64)
            .expect("read");
    });
    println!("seq_read_mbs={:.1}", n as f64 * BIG as f64 / t / 1e6);

    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let (n, t) = run(secs, |_| {
        let at = next(&mut seed) % small_blocks * SMALL as u64;
        f.read_exact_at(&mut buf.slice()[..SMALL], at)
            .expect("read");
    });
    println!("rand_read_iops={:.0}", n as f64 / t);

    let (n, t) = run(secs, |_| {
        let at = next(&mut seed) % small_blocks * SMALL as u64;
        f.write_all_at(&buf.slice()[..SMALL], at).expect("write");
    });
    sync(&f);
    println!("rand_write_iops={:.0}", n as f64 / t);
}
