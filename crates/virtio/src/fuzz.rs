//! Fuzz targets: guest memory images, fully controlled by the input, run
//! through the same queue walking, request parsing and I/O code the
//! devices use. `domus-fuzz` (src/bin) runs them over a corpus and random
//! mutations of it; any panic is a bug.

use std::io::Write;
use std::sync::OnceLock;

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};

use crate::block::io::{self, Counters, Disk};
use crate::block::request::{self, Desc};
use crate::Memory;

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
            file: f,
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

/// Seed inputs: well-formed requests of each kind, direct and indirect.
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
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_run_and_complete() {
        for (name, s) in seeds() {
            assert_eq!(blk_queue_ok(&s), 1, "seed {name} is not a good request");
            rng_queue(&s);
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
        }
    }
}
