//! Fuzz targets: guest memory images, fully controlled by the input, run
//! through the same queue walking, request parsing and I/O code the
//! devices use. `domus-fuzz` (src/bin) runs them over a corpus and random
//! mutations of it; any panic is a bug.

use std::io::Write;
use std::sync::OnceLock;

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use crate::block::io::{self, Backend, Counters, Disk};
use crate::block::request::{self, Desc};
use crate::Memory;

/// xorshift64*: fast, and deterministic for a given seed (the fuzzers'
/// mutations).
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// A number below `n` (0 if `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

/// Guest memory of a fuzz case: the input, zero-padded.
pub const MEM_SIZE: usize = 64 << 10;
pub const DESC_TABLE: u64 = 0;
pub const AVAIL_RING: u64 = 0x1000;
pub const USED_RING: u64 = 0x2000;
/// Sectors of the fuzzed disk.
pub const CAPACITY: u64 = 64;

fn disk() -> &'static Disk {
    static DISK: OnceLock<Disk> = OnceLock::new();
    DISK.get_or_init(|| {
        let path = std::env::temp_dir().join(format!("domus-fuzz-{}.img", std::process::id()));
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .expect("fuzz disk");
        f.write_all(&[0u8; CAPACITY as usize * 512])
            .expect("fuzz disk");
        let _ = std::fs::remove_file(&path);
        Disk {
            locks: Vec::new(),
            backend: Backend::Raw(f),
            read_only: false,
            id: *b"fuzz-disk-0000000000",
            counters: Counters::default(),
        }
    })
}

/// Where the queue's own settings sit in the input (outside the rings).
pub const SETTINGS: usize = 0x2ff0;

/// Sets up a queue over `data`, which is guest memory: byte `SETTINGS`
/// picks the size (2..=256), bit 0 of the next one event idx.
fn setup(data: &[u8]) -> Option<(Memory, Queue)> {
    let mem = Memory::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).ok()?;
    let n = data.len().min(MEM_SIZE);
    mem.write_slice(&data[..n], GuestAddress(0)).ok()?;
    let size = 2u16 << (data.get(SETTINGS).copied().unwrap_or(0) % 8);
    let mut q = Queue::new(256).ok()?;
    q.set_size(size);
    q.set_desc_table_address(Some(DESC_TABLE as u32), Some(0));
    q.set_avail_ring_address(Some(AVAIL_RING as u32), Some(0));
    q.set_used_ring_address(Some(USED_RING as u32), Some(0));
    q.set_event_idx(data.get(SETTINGS + 1).is_some_and(|b| b & 1 == 1));
    q.set_ready(true);
    q.is_valid(&mem).then_some((mem, q))
}

/// The block device's path: pop, parse, execute, complete.
pub fn blk_queue(data: &[u8]) {
    blk_queue_ok(data);
}

/// [`blk_queue`], returning how many requests completed with status OK.
pub fn blk_queue_ok(data: &[u8]) -> usize {
    let mut ok = 0;
    let Some((mem, mut q)) = setup(data) else {
        return 0;
    };
    for _ in 0..2 {
        let _ = q.disable_notification(&mem);
        let mut n = 0;
        while let Some(chain) = q.pop_descriptor_chain(&mem) {
            let head = chain.head_index();
            let descs: Vec<Desc> = chain
                .map(|d| Desc {
                    addr: d.addr().0,
                    len: d.len(),
                    write: d.is_write_only(),
                })
                .collect();
            let len = match request::parse(&mem, &descs, CAPACITY) {
                Ok(req) => {
                    assert!(req.data.iter().all(|d| d.len > 0));
                    assert!(req.status.0 < MEM_SIZE as u64);
                    let status = io::execute(disk(), &mem, &req);
                    ok += usize::from(status == request::S_OK);
                    mem.write_obj(status, req.status).expect("status checked");
                    req.used_len()
                }
                Err(rej) => {
                    if let Some(at) = rej.status {
                        mem.write_obj(rej.error.status(), at)
                            .expect("status checked");
                    }
                    u32::from(rej.status.is_some())
                }
            };
            let _ = q.add_used(&mem, head, len);
            n += 1;
            assert!(
                n <= usize::from(q.size()),
                "more chains than the ring holds"
            );
        }
        let _ = q.needs_notification(&mem);
        if !matches!(q.enable_notification(&mem), Ok(true)) || crate::ring_corrupt(&q, &mem) {
            break;
        }
    }
    ok
}

/// The entropy device's path.
pub fn rng_queue(data: &[u8]) {
    if let Some((mem, mut q)) = setup(data) {
        crate::rng::process(&mem, &mut q, &Default::default());
    }
}

/// The network device's transmit path: every chain gathered into a frame.
pub fn net_tx(data: &[u8]) {
    let Some((mem, mut q)) = setup(data) else {
        return;
    };
    let mut n = 0;
    while let Some(chain) = q.pop_descriptor_chain(&mem) {
        let head = chain.head_index();
        let descs: Vec<(u64, u32, bool)> = chain
            .map(|d| (d.addr().0, d.len(), d.is_write_only()))
            .collect();
        if let Some((iov, len)) = crate::net::tx_iovecs(&mem, &descs) {
            assert!((crate::net::HDR_LEN..=crate::net::MAX_FRAME).contains(&len));
            let mut sum = 0usize;
            for v in &iov {
                // Every vector lies inside the fuzz memory's mapping.
                let at = mem.get_host_address(GuestAddress(0)).expect("mapped") as usize;
                let p = v.iov_base as usize;
                assert!(p >= at && p + v.iov_len <= at + MEM_SIZE);
                sum += v.iov_len;
            }
            assert_eq!(sum, len);
        }
        let _ = q.add_used(&mem, head, 0);
        n += 1;
        assert!(
            n <= usize::from(q.size()),
            "more chains than the ring holds"
        );
    }
}

/// The network device's receive path: frames (their size from the
/// settings) spread over the guest's buffers until they run out, copied
/// in or (a settings bit) read straight in through the I/O vectors the tap
/// would be given.
pub fn net_rx(data: &[u8]) {
    use crate::net::{RxBuffers, Scatter, HDR_LEN, MAX_FRAME, MAX_IOVECS};
    let Some((mem, mut q)) = setup(data) else {
        return;
    };
    let mrg = data.get(SETTINGS + 1).is_some_and(|b| b & 2 != 0);
    let direct = data.get(SETTINGS + 1).is_some_and(|b| b & 4 != 0);
    let len = HDR_LEN + usize::from(data.get(SETTINGS + 2).copied().unwrap_or(0)) * 300;
    let frame = vec![0xa5u8; len];
    let mut bufs = RxBuffers::new(mrg);
    let at = mem.get_host_address(GuestAddress(0)).expect("mapped") as usize;
    for _ in 0..usize::from(q.size()) + 1 {
        bufs.fill(&mut q, &mem, if direct { MAX_FRAME } else { len });
        assert!(
            bufs.held() <= usize::from(q.size()),
            "more held than the ring holds"
        );
        if direct && bufs.room() >= len {
            if let Some(iov) = bufs.iovecs() {
                assert!(iov.len() <= MAX_IOVECS);
                let mut sum = 0usize;
                for v in &iov {
                    // Every vector lies inside the fuzz memory's mapping.
                    let p = v.iov_base as usize;
                    assert!(p >= at && p + v.iov_len <= at + MEM_SIZE);
                    sum += v.iov_len;
                }
                assert_eq!(sum, bufs.room(), "every held buffer");
                let _ = bufs.complete_read(&mut q, &mem, len);
                continue;
            }
        }
        match bufs.scatter(&mut q, &mem, &frame) {
            Scatter::NoRoom => {
                // Short of buffers: the device asks for a kick (writes
                // avail_event through the guest's used ring address).
                let _ = crate::net::wait_for_buffers(&mut q, &mem);
                break;
            }
            Scatter::Dropped => {}
            Scatter::Delivered(n) => assert!(n >= 1 && (mrg || n == 1)),
        }
    }
}

/// The balloon's inflate and reporting paths: page numbers and ranges
/// dropped from guest memory (which must stay usable).
pub fn balloon_queue(data: &[u8]) {
    let Some((mem, mut q)) = setup(data) else {
        return;
    };
    let report = data.get(SETTINGS + 1).is_some_and(|b| b & 4 != 0);
    crate::balloon::drain(&mem, &mut q, |addr, len, _| {
        if report {
            crate::balloon::discard(&mem, addr, len.into());
        } else {
            crate::balloon::pfn_runs(&mem, addr, len, |pfn, count| {
                if let (Some(a), Some(l)) = (pfn.checked_mul(4096), count.checked_mul(4096)) {
                    crate::balloon::discard(&mem, a, l);
                }
            });
        }
    });
    // The memory is still there (zeroes where dropped).
    let _ = mem
        .read_obj::<u64>(GuestAddress(0))
        .expect("memory still mapped");
}

/// Seed inputs: well-formed requests of each kind, direct and indirect,
/// and a small qcow2 image.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let desc =
        |m: &mut Vec<u8>, table: usize, i: usize, addr: u64, len: u32, flags: u16, next: u16| {
            let at = table + i * 16;
            m[at..at + 8].copy_from_slice(&addr.to_le_bytes());
            m[at + 8..at + 12].copy_from_slice(&len.to_le_bytes());
            m[at + 12..at + 14].copy_from_slice(&flags.to_le_bytes());
            m[at + 14..at + 16].copy_from_slice(&next.to_le_bytes());
        };
    let kinds = [
        ("read", request::T_IN, 2u16),
        ("write", request::T_OUT, 0),
        ("flush", request::T_FLUSH, 0),
        ("get-id", request::T_GET_ID, 2),
        ("discard", request::T_DISCARD, 0),
        ("write-zeroes", request::T_WRITE_ZEROES, 0),
    ];
    for indirect in [false, true] {
        for (name, ty, dflags) in kinds {
            let mut m = vec![0u8; 0x4000];
            m[SETTINGS] = 3; // queue size 16
            let table = if indirect { 0x3800 } else { 0 };
            // Header at 0x3000, data at 0x3100, status at 0x3300.
            m[0x3000..0x3004].copy_from_slice(&ty.to_le_bytes());
            m[0x3008..0x3010].copy_from_slice(&2u64.to_le_bytes());
            let dlen = if ty == request::T_DISCARD || ty == request::T_WRITE_ZEROES {
                m[0x3100..0x3108].copy_from_slice(&4u64.to_le_bytes());
                m[0x3108..0x310c].copy_from_slice(&8u32.to_le_bytes());
                16
            } else {
                512
            };
            desc(&mut m, table, 0, 0x3000, 16, 1, 1);
            if ty == request::T_FLUSH {
                desc(&mut m, table, 1, 0x3300, 1, 2, 0);
            } else {
                desc(&mut m, table, 1, 0x3100, dlen, 1 | dflags, 2);
                desc(&mut m, table, 2, 0x3300, 1, 2, 0);
            }
            if indirect {
                desc(&mut m, 0, 0, 0x3800, 48, 4, 0);
            }
            // avail: flags 0, idx 1, ring[0] = 0.
            m[0x1002..0x1004].copy_from_slice(&1u16.to_le_bytes());
            let tag = if indirect { "indirect-" } else { "" };
            out.push((format!("{tag}{name}"), m));
        }
    }
    // virtio-net transmit: a header and a small frame in one chain.
    let mut m = vec![0u8; 0x4000];
    m[SETTINGS] = 3;
    desc(&mut m, 0, 0, 0x3000, 12 + 60, 0, 0);
    m[0x1002..0x1004].copy_from_slice(&1u16.to_le_bytes());
    out.push(("net-tx".into(), m));
    // virtio-net receive: three writable 1500-byte buffers, mergeable,
    // and a 1512-byte frame (settings + 2 = 5).
    let mut m = vec![0u8; 0x4000];
    m[SETTINGS] = 3;
    m[SETTINGS + 1] = 2;
    m[SETTINGS + 2] = 5;
    for i in 0..3u16 {
        desc(
            &mut m,
            0,
            i.into(),
            0x3000 + u64::from(i) * 0x600,
            1500,
            2,
            0,
        );
        let at = 0x1004 + usize::from(i) * 2;
        m[at..at + 2].copy_from_slice(&i.to_le_bytes());
    }
    m[0x1002..0x1004].copy_from_slice(&3u16.to_le_bytes());
    out.push(("net-rx".into(), m));
    // virtio-balloon inflate: four page numbers (3, 4, 5, 9).
    let mut m = vec![0u8; 0x4000];
    m[SETTINGS] = 3;
    for (i, pfn) in [3u32, 4, 5, 9].iter().enumerate() {
        m[0x3000 + i * 4..0x3004 + i * 4].copy_from_slice(&pfn.to_le_bytes());
    }
    desc(&mut m, 0, 0, 0x3000, 16, 0, 0);
    m[0x1002..0x1004].copy_from_slice(&1u16.to_le_bytes());
    out.push(("balloon-inflate".into(), m));
    out.push(("qcow2-image".into(), domus_disk::fuzz::seed()));
    out.push(("gpt-disk".into(), domus_disk::fuzz::partition_seed()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_run_and_complete() {
        for (name, s) in seeds() {
            if name.starts_with("qcow2") {
                assert!(s.starts_with(b"QFI\xfb"), "the qcow2 seed is an image");
                domus_disk::fuzz::qcow2(&s);
                continue;
            }
            if name.starts_with("gpt") {
                let mut read = |b: &mut [u8], at: u64| {
                    b.copy_from_slice(&s[at as usize..at as usize + b.len()]);
                    Ok(())
                };
                let p = domus_disk::partitions::partitions(&mut read, s.len() as u64);
                assert_eq!(p.unwrap().len(), 2, "the GPT seed has two partitions");
                continue;
            }
            let blk = !name.starts_with("net") && !name.starts_with("balloon");
            assert_eq!(blk_queue_ok(&s), usize::from(blk), "seed {name}");
            rng_queue(&s);
            net_tx(&s);
            net_rx(&s);
            balloon_queue(&s);
            // Run once more on the memory after processing: still no panic.
            let (mem, _) = setup(&s).unwrap();
            let mut after = vec![0u8; MEM_SIZE];
            mem.read_slice(&mut after, GuestAddress(0)).unwrap();
            blk_queue(&after);
        }
    }

    #[test]
    fn short_and_empty_inputs() {
        for n in [0, 1, 2, 100, 0x2000] {
            blk_queue(&vec![0xff; n]);
            rng_queue(&vec![0xff; n]);
            net_tx(&vec![0xff; n]);
            net_rx(&vec![0xff; n]);
            balloon_queue(&vec![0xff; n]);
        }
    }
}
