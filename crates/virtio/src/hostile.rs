//! Hostile-driver tests: a fake driver programs a virtio-blk function
//! through its BAR exactly as a guest would, then puts malformed chains,
//! indices and addresses in the queue. Each case must end in an error
//! status, a zero-length completion or NEEDS_RESET, never a panic or a
//! hang, and the device must keep serving good requests afterwards.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use domus_devices::pci::PciDevice;
use vm_memory::{Address, Bytes, GuestAddress};

use crate::block::request::{S_IOERR, S_OK, T_IN, T_OUT};
use crate::block::{Block, DiskConfig};
use crate::msix::tests::{vectors, FakeHv};
use crate::pci::{VirtioPci, STATUS_DRIVER_OK, STATUS_NEEDS_RESET};
use crate::Memory;

const MEM: usize = 1 << 20;
const QSIZE: u16 = 16;
const DESC: u64 = 0x1000;
const AVAIL: u64 = 0x2000;
const USED: u64 = 0x3000;
const HDR: u64 = 0x4000;
const DATA: u64 = 0x8000;
const STATUS: u64 = 0x5000;
const NEXT: u16 = 1;
const WRITE: u16 = 2;
const INDIRECT: u16 = 4;

struct Driver {
    dev: VirtioPci,
    mem: Arc<Memory>,
    avail: u16,
    used_seen: u16,
    _dir: tempdir::Dir,
}

mod tempdir {
    pub struct Dir(pub std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn w16(d: &mut VirtioPci, off: u64, v: u16) {
    d.bar_write(0, off, &v.to_le_bytes());
}
fn w32(d: &mut VirtioPci, off: u64, v: u32) {
    d.bar_write(0, off, &v.to_le_bytes());
}

impl Driver {
    /// A disk of 64 sectors filled with 0x5a, driven up to DRIVER_OK with
    /// queue 0 at the given ring addresses (unless `enable` is false).
    fn new(desc: u64, enable: bool) -> Self {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "domus-hostile-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("disk.img");
        std::fs::File::create(&path)
            .unwrap()
            .write_all(&[0x5a; 64 * 512])
            .unwrap();
        let blk = Block::open(&DiskConfig {
            path,
            ..Default::default()
        })
        .unwrap();
        let mem = Arc::new(Memory::from_ranges(&[(GuestAddress(0), MEM)]).unwrap());
        let mut dev = VirtioPci::new(
            "test".into(),
            Box::new(blk),
            0xc000_0000,
            vectors(2),
            mem.clone(),
            Arc::new(FakeHv::default()),
        );
        let d = &mut dev;
        d.bar_write(0, 0x14, &[1 | 2]);
        w32(d, 0x08, 0);
        w32(d, 0x0c, 1 << 28 | 1 << 29);
        w32(d, 0x08, 1);
        w32(d, 0x0c, 1);
        d.bar_write(0, 0x14, &[1 | 2 | 8]);
        w16(d, 0x16, 0);
        w16(d, 0x18, QSIZE);
        w32(d, 0x20, desc as u32);
        w32(d, 0x24, (desc >> 32) as u32);
        w32(d, 0x28, AVAIL as u32);
        w32(d, 0x30, USED as u32);
        w16(d, 0x1a, 1);
        if enable {
            w16(d, 0x1c, 1);
        }
        d.bar_write(0, 0x14, &[1 | 2 | 8 | 4]);
        Driver {
            dev,
            mem,
            avail: 0,
            used_seen: 0,
            _dir: tempdir::Dir(dir),
        }
    }

    fn status(&mut self) -> u8 {
        let mut b = [0u8];
        self.dev.bar_read(0, 0x14, &mut b);
        b[0]
    }

    fn desc(&self, table: u64, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let at = GuestAddress(table + u64::from(i) * 16);
        self.mem.write_obj(addr, at).unwrap();
        self.mem.write_obj(len, at.unchecked_add(8)).unwrap();
        self.mem.write_obj(flags, at.unchecked_add(12)).unwrap();
        self.mem.write_obj(next, at.unchecked_add(14)).unwrap();
    }

    fn header(&self, ty: u32, sector: u64) {
        self.mem.write_obj(ty, GuestAddress(HDR)).unwrap();
        self.mem.write_obj(sector, GuestAddress(HDR + 8)).unwrap();
    }

    /// Publishes head `head` with avail idx advanced by `advance`.
    fn kick(&mut self, head: u16, advance: u16) {
        let slot = AVAIL + 4 + u64::from(self.avail % QSIZE) * 2;
        self.mem.write_obj(head, GuestAddress(slot)).unwrap();
        self.avail = self.avail.wrapping_add(advance);
        self.mem
            .write_obj(self.avail, GuestAddress(AVAIL + 2))
            .unwrap();
        self.dev.bar_write(0, 0x3000, &0u16.to_le_bytes());
    }

    /// Waits for the next used entry: (id, len).
    fn used(&mut self) -> Option<(u32, u32)> {
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            let idx: u16 = self.mem.read_obj(GuestAddress(USED + 2)).unwrap();
            if idx != self.used_seen {
                let e = USED + 4 + u64::from(self.used_seen % QSIZE) * 8;
                self.used_seen = self.used_seen.wrapping_add(1);
                let id: u32 = self.mem.read_obj(GuestAddress(e)).unwrap();
                let len: u32 = self.mem.read_obj(GuestAddress(e + 4)).unwrap();
                return Some((id, len));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        None
    }

    fn status_byte(&self) -> u8 {
        self.mem.read_obj(GuestAddress(STATUS)).unwrap()
    }

    /// A good 1-sector read must still complete with the disk's bytes.
    fn assert_serving(&mut self) {
        self.header(T_IN, 3);
        self.mem.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
        self.desc(DESC, 0, HDR, 16, NEXT, 1);
        self.desc(DESC, 1, DATA, 512, NEXT | WRITE, 2);
        self.desc(DESC, 2, STATUS, 1, WRITE, 0);
        self.kick(0, 1);
        assert_eq!(self.used(), Some((0, 513)), "good read after a bad one");
        assert_eq!(self.status_byte(), S_OK);
        let b: u8 = self.mem.read_obj(GuestAddress(DATA + 100)).unwrap();
        assert_eq!(b, 0x5a);
    }

    /// Sends a 3-descriptor request whose data descriptor is (addr, len, flags).
    fn request(&mut self, ty: u32, addr: u64, len: u32, flags: u16) -> Option<(u32, u32)> {
        self.header(ty, 0);
        self.mem.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
        self.desc(DESC, 0, HDR, 16, NEXT, 1);
        self.desc(DESC, 1, addr, len, NEXT | flags, 2);
        self.desc(DESC, 2, STATUS, 1, WRITE, 0);
        self.kick(0, 1);
        self.used()
    }
}

#[test]
fn good_requests_round_trip() {
    let mut d = Driver::new(DESC, true);
    d.assert_serving();
    d.mem.write_slice(&[7u8; 512], GuestAddress(DATA)).unwrap();
    assert_eq!(d.request(T_OUT, DATA, 512, 0), Some((0, 1)));
    assert_eq!(d.status_byte(), S_OK);
}

#[test]
fn loop_in_chain_completes_without_status() {
    let mut d = Driver::new(DESC, true);
    d.desc(DESC, 0, HDR, 16, NEXT, 1);
    d.desc(DESC, 1, DATA, 512, NEXT | WRITE, 0);
    d.kick(0, 1);
    // The walk stops after a queue's worth of descriptors; what it saw is
    // answered with an error status (or dropped if it has no status byte).
    let (id, len) = d.used().expect("completed");
    assert_eq!(id, 0);
    assert!(len <= 1, "{len}");
    if len == 1 {
        let st: u8 = d.mem.read_obj(GuestAddress(DATA + 511)).unwrap();
        assert_eq!(st, S_IOERR);
    }
    d.assert_serving();
}

#[test]
fn out_of_range_zero_huge_and_overlapping_buffers() {
    let mut d = Driver::new(DESC, true);
    for (addr, len) in [
        (MEM as u64 - 256, 512),  // crosses the end of memory
        (MEM as u64 + 4096, 512), // outside memory
        (u64::MAX - 511, 512),    // wraps around
    ] {
        assert_eq!(
            d.request(T_IN, addr, len, WRITE),
            Some((0, 1)),
            "{addr:#x}+{len}"
        );
        assert_eq!(d.status_byte(), S_IOERR, "{addr:#x}+{len}");
    }
    // A chain longer than 4 GiB ends at the huge buffer, which then has
    // to be the status descriptor: it is not in memory, so length 0.
    assert_eq!(d.request(T_IN, DATA, u32::MAX, WRITE), Some((0, 0)));
    // A zero-length data buffer carries no data: a zero-sector read is fine.
    assert_eq!(d.request(T_IN, DATA, 0, WRITE), Some((0, 1)));
    assert_eq!(d.status_byte(), S_OK);
    // A read into the descriptor table itself stays inside guest memory;
    // the device completes it and the chain it overwrote is not reused.
    let r = d.request(T_IN, DESC, 512, WRITE);
    assert_eq!(r.map(|u| u.0), Some(0));
    d.assert_serving();
}

#[test]
fn wrong_directions_get_ioerr() {
    let mut d = Driver::new(DESC, true);
    assert_eq!(d.request(T_IN, DATA, 512, 0), Some((0, 1)));
    assert_eq!(d.status_byte(), S_IOERR);
    assert_eq!(d.request(T_OUT, DATA, 512, WRITE), Some((0, 1)));
    assert_eq!(d.status_byte(), S_IOERR);
    // A device-writable header, a device-readable status.
    d.desc(DESC, 0, HDR, 16, NEXT | WRITE, 1);
    d.desc(DESC, 1, STATUS, 1, WRITE, 0);
    d.mem.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
    d.kick(0, 1);
    assert_eq!(d.used(), Some((0, 1)));
    assert_eq!(d.status_byte(), S_IOERR);
    d.desc(DESC, 0, HDR, 16, NEXT, 1);
    d.desc(DESC, 1, STATUS, 1, 0, 0);
    d.kick(0, 1);
    assert_eq!(d.used(), Some((0, 0)));
    d.assert_serving();
}

#[test]
fn bad_indices_and_indirect_tables() {
    let mut d = Driver::new(DESC, true);
    // Head index past the queue, next index past the queue.
    d.kick(QSIZE + 3, 1);
    let u = d.used();
    assert!(u.is_none() || u == Some((u32::from(QSIZE) + 3, 0)), "{u:?}");
    d.used_seen = d.mem.read_obj(GuestAddress(USED + 2)).unwrap();
    d.desc(DESC, 0, HDR, 16, NEXT, 999);
    d.kick(0, 1);
    assert_eq!(d.used(), Some((0, 0)));
    // Indirect tables: odd length, outside memory, nested.
    for (addr, len) in [(0x6000, 17), (MEM as u64, 48), (0x6000, 0)] {
        d.desc(DESC, 0, addr, len, INDIRECT, 0);
        d.kick(0, 1);
        assert_eq!(d.used(), Some((0, 0)), "indirect {addr:#x}+{len}");
    }
    d.desc(0x6000, 0, 0x6000, 32, INDIRECT, 0);
    d.desc(DESC, 0, 0x6000, 32, INDIRECT, 0);
    d.kick(0, 1);
    assert_eq!(d.used(), Some((0, 0)), "nested indirect");
    // A good indirect request works.
    d.header(T_IN, 1);
    d.desc(0x6000, 0, HDR, 16, NEXT, 1);
    d.desc(0x6000, 1, DATA, 512, NEXT | WRITE, 2);
    d.desc(0x6000, 2, STATUS, 1, WRITE, 0);
    d.desc(DESC, 0, 0x6000, 48, INDIRECT, 0);
    d.kick(0, 1);
    assert_eq!(d.used(), Some((0, 513)));
    d.assert_serving();
}

#[test]
fn a_request_of_seg_max_segments_through_an_indirect_table_is_served() {
    let mut d = Driver::new(DESC, true);
    let mut b = [0u8; 4];
    d.dev.bar_read(0, 0x2000 + 12, &mut b);
    let seg_max = u32::from_le_bytes(b);
    assert!(
        seg_max >= 256,
        "seg_max {seg_max}: a 1 MiB request of 4 KiB pages must fit"
    );
    // The whole 32 KiB disk in seg_max pieces, written then read back.
    let piece = 64 * 512 / seg_max;
    assert_eq!(piece * seg_max, 64 * 512);
    const TABLE: u64 = 0x20000;
    let chain = |d: &Driver, ty: u32, flags: u16| {
        d.header(ty, 0);
        d.mem.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
        d.desc(TABLE, 0, HDR, 16, NEXT, 1);
        for i in 0..seg_max as u16 {
            let at = DATA + u64::from(i) * u64::from(piece);
            d.desc(TABLE, i + 1, at, piece, NEXT | flags, i + 2);
        }
        d.desc(TABLE, seg_max as u16 + 1, STATUS, 1, WRITE, 0);
        d.desc(DESC, 0, TABLE, (seg_max + 2) * 16, INDIRECT, 0);
    };
    let pattern: Vec<u8> = (0..64 * 512).map(|i| (i % 251) as u8).collect();
    d.mem.write_slice(&pattern, GuestAddress(DATA)).unwrap();
    chain(&d, T_OUT, 0);
    d.kick(0, 1);
    assert_eq!(d.used(), Some((0, 1)));
    assert_eq!(d.status_byte(), S_OK);
    d.mem
        .write_slice(&vec![0u8; pattern.len()], GuestAddress(DATA))
        .unwrap();
    chain(&d, T_IN, WRITE);
    d.kick(0, 1);
    assert_eq!(d.used(), Some((0, 64 * 512 + 1)));
    assert_eq!(d.status_byte(), S_OK);
    let mut back = vec![0u8; pattern.len()];
    d.mem.read_slice(&mut back, GuestAddress(DATA)).unwrap();
    assert!(back == pattern, "the disk reads back as written");
}

#[test]
fn avail_index_far_ahead_does_not_hang_and_reset_recovers() {
    let mut d = Driver::new(DESC, true);
    d.desc(DESC, 0, HDR, 16, NEXT, 1);
    d.kick(0, 1000);
    assert_eq!(d.used(), None, "nothing is consumed from a corrupt ring");
    // The driver resets the device and sets it up again.
    d.dev.bar_write(0, 0x14, &[0]);
    assert_eq!(d.status(), 0);
    let mut d2 = Driver::new(DESC, true);
    d2.assert_serving();
}

#[test]
fn queues_never_set_up() {
    // DRIVER_OK without enabling queue 0: the device asks for a reset.
    let mut d = Driver::new(DESC, false);
    assert_ne!(d.status() & STATUS_NEEDS_RESET, 0);
    // Notifying queues that do not exist, or were never enabled, does nothing.
    for q in [0u64, 1, 7, 1000] {
        d.dev.bar_write(0, 0x3000 + q * 4, &[0, 0]);
    }
    // Rings outside guest memory: refused the same way.
    let mut d = Driver::new(MEM as u64 - 16, true);
    assert_ne!(d.status() & STATUS_NEEDS_RESET, 0);
    assert_eq!(d.status() & STATUS_DRIVER_OK, STATUS_DRIVER_OK);
}

#[test]
fn hostile_register_accesses() {
    let mut d = Driver::new(DESC, true);
    // Oversized, unaligned and out-of-BAR accesses are ignored.
    d.dev.bar_write(0, 0x14, &[0u8; 16]);
    d.dev.bar_write(0, 0x7fff, &[1, 2]);
    d.dev.bar_write(1, 0, &[1]);
    let mut big = [0u8; 16];
    d.dev.bar_read(0, 0, &mut big);
    d.dev.bar_read(0, u64::MAX - 1, &mut big[..4]);
    // Selecting a queue that does not exist reads size 0.
    w16(&mut d.dev, 0x16, 99);
    let mut s = [0u8; 2];
    d.dev.bar_read(0, 0x18, &mut s);
    assert_eq!(u16::from_le_bytes(s), 0);
    w16(&mut d.dev, 0x16, 0);
    d.assert_serving();
}
