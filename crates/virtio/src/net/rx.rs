//! The receive queue's guest buffers, held between frames.
//!
//! Chains are taken off the receive queue ahead of need and held, in the
//! order the driver offered them, until frames fill them: then a frame
//! from the tap can be read straight into guest memory (one `readv`, the
//! kernel's copy only) when the held buffers could take the largest
//! frame, instead of into a buffer of ours and copied again. In this
//! project's nested host, where every copy the host makes is emulated, the
//! second copy cost as much as the first. When the held buffers are fewer
//! (a driver short of buffers, or one whose buffers are small and few),
//! the frame is read into the device's own buffer and copied
//! ([`RxBuffers::scatter`]) once it knows the frame's length.
//!
//! Chains are used in the order they were taken, so those held are always
//! the last ones taken: a stopped device resumes at the used ring's index
//! (`VirtioPci::resume`) and takes them again.

use std::collections::VecDeque;

use virtio_queue::{Queue, QueueT};
use vm_memory::bitmap::Bitmap;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use super::HDR_LEN;
use crate::Memory;

/// The most vectors one `readv` takes (Linux's UIO_MAXIOV).
pub const MAX_IOVECS: usize = 1024;

/// A writable buffer of a receive chain: its guest address, length, and
/// where it lies in the VMM's mapping of guest memory (found once, when
/// the chain is taken).
#[derive(Clone, Copy, Debug)]
struct Piece {
    addr: u64,
    len: u32,
    host: usize,
}

/// One receive chain: its head and buffers, each inside guest memory.
#[derive(Debug)]
struct Chain {
    head: u16,
    pieces: Vec<Piece>,
    room: usize,
}

/// What [`RxBuffers::scatter`] did with a frame.
#[derive(Debug, PartialEq, Eq)]
pub enum Scatter {
    /// Delivered, in this many chains.
    Delivered(usize),
    /// Not enough buffers held: take more, or wait for the driver.
    NoRoom,
    /// The frame cannot be delivered (larger than a chain without
    /// mergeable buffers, or a buffer outside guest memory): dropped.
    Dropped,
}

/// Receive chains taken off the queue and not yet used.
#[derive(Debug, Default)]
pub struct RxBuffers {
    held: VecDeque<Chain>,
    room: usize,
    /// Mergeable buffers (`VIRTIO_NET_F_MRG_RXBUF`): a frame may spread
    /// over several chains; without, each frame takes one chain.
    mrg: bool,
}

impl RxBuffers {
    pub fn new(mrg: bool) -> Self {
        Self {
            mrg,
            ..Self::default()
        }
    }

    /// Bytes the held chains can take (without mergeable buffers, only
    /// the first chain's count for one frame).
    pub fn room(&self) -> usize {
        if self.mrg {
            self.room
        } else {
            self.held.front().map_or(0, |c| c.room)
        }
    }

    /// Takes chains off `q` until the held ones can take a frame of
    /// `want` bytes ([`RxBuffers::room`]) or the ring has no more.
    /// Unusable chains (a read-only descriptor, a buffer outside guest
    /// memory) go back used and empty: returns how many.
    pub fn fill(&mut self, q: &mut Queue, mem: &Memory, want: usize) -> u64 {
        let mut bad = 0;
        loop {
            // Without mergeable buffers a frame takes one chain: hold one.
            let enough = if self.mrg {
                self.room >= want
            } else {
                !self.held.is_empty()
            };
            if enough {
                break;
            }
            let Some(chain) = q.pop_descriptor_chain(mem) else {
                break;
            };
            let head = chain.head_index();
            let mut pieces = Vec::new();
            let mut room = 0usize;
            let mut ok = true;
            for d in chain {
                let len = d.len() as usize;
                let slice = match mem.get_slice(d.addr(), len) {
                    Ok(s) if d.is_write_only() => s,
                    _ => {
                        ok = false;
                        break;
                    }
                };
                room = room.saturating_add(len);
                if len > 0 {
                    pieces.push(Piece {
                        addr: d.addr().0,
                        len: d.len(),
                        host: slice.ptr_guard_mut().as_ptr() as usize,
                    });
                }
            }
            if !ok {
                bad += 1;
                let _ = q.add_used(mem, head, 0);
                continue;
            }
            self.push(head, pieces, room);
        }
        bad
    }

    fn push(&mut self, head: u16, pieces: Vec<Piece>, room: usize) {
        self.room = self.room.saturating_add(room);
        self.held.push_back(Chain { head, pieces, room });
    }

    /// I/O vectors over the held buffers, in order (without mergeable
    /// buffers, the first chain's), for the tap to read a frame straight
    /// into. None if they are split into more pieces than one `readv`
    /// takes ([`MAX_IOVECS`]).
    pub fn iovecs(&self) -> Option<Vec<libc::iovec>> {
        let chains = if self.mrg { self.held.len() } else { 1 };
        let iov: Vec<libc::iovec> = self
            .held
            .iter()
            .take(chains)
            .flat_map(|c| &c.pieces)
            .map(|p| libc::iovec {
                iov_base: p.host as *mut libc::c_void,
                iov_len: p.len as usize,
            })
            .collect();
        (iov.len() <= MAX_IOVECS).then_some(iov)
    }

    /// The chains a frame of `len` bytes placed in order from the first
    /// held buffer fills, or None if they cannot take it.
    fn chains_for(&self, len: usize) -> Option<usize> {
        if !self.mrg {
            return (!self.held.is_empty() && self.room() >= len).then_some(1);
        }
        let mut left = len;
        for (i, c) in self.held.iter().enumerate() {
            if c.room >= left {
                return Some(i + 1);
            }
            left -= c.room;
        }
        None
    }

    /// A frame of `len` bytes now lies in the held buffers from the first
    /// on (the tap read it there, or [`RxBuffers::scatter`] copied it):
    /// sets its header's `num_buffers` and gives the chains it fills back
    /// used. Returns how many, or None if the header could not be written
    /// (the chains then go back used and empty).
    pub fn complete(&mut self, q: &mut Queue, mem: &Memory, len: usize) -> Option<usize> {
        let n = self.chains_for(len)?;
        let count = u16::try_from(n).ok()?.to_le_bytes();
        let written = self.write_at(mem, 10, &count);
        let mut left = len;
        for _ in 0..n {
            let Some(c) = self.held.pop_front() else {
                break;
            };
            self.room -= c.room;
            let take = c.room.min(left);
            left -= take;
            // `take` fits u32: a chain's room is a sum of u32 lengths
            // capped by the frame's.
            let put = if written { take as u32 } else { 0 };
            let _ = q.add_used(mem, c.head, put);
        }
        written.then_some(n)
    }

    /// As [`RxBuffers::complete`], for a frame the tap read straight into
    /// the held buffers: its bytes are first marked dirty in guest
    /// memory's bitmap (a migration's), which the tap's write went behind.
    pub fn complete_read(&mut self, q: &mut Queue, mem: &Memory, len: usize) -> Option<usize> {
        let mut left = len;
        for p in self.held.iter().flat_map(|c| &c.pieces) {
            if left == 0 {
                break;
            }
            let take = (p.len as usize).min(left);
            if let Ok(s) = mem.get_slice(GuestAddress(p.addr), take) {
                s.bitmap().mark_dirty(0, take);
            }
            left -= take;
        }
        self.complete(q, mem, len)
    }

    /// Writes `bytes` at `offset` into the first chain's buffers.
    fn write_at(&self, mem: &Memory, offset: usize, bytes: &[u8]) -> bool {
        let Some(c) = self.held.front() else {
            return false;
        };
        let mut skip = offset;
        let mut done = 0;
        for &Piece { addr, len, .. } in &c.pieces {
            let len = len as usize;
            if skip >= len {
                skip -= len;
                continue;
            }
            let take = (len - skip).min(bytes.len() - done);
            let Some(at) = addr.checked_add(skip as u64) else {
                return false;
            };
            if mem
                .write_slice(&bytes[done..done + take], GuestAddress(at))
                .is_err()
            {
                return false;
            }
            done += take;
            skip = 0;
            if done == bytes.len() {
                return true;
            }
        }
        false
    }

    /// Copies `frame` (its virtio-net header first) into the held buffers
    /// and completes it.
    pub fn scatter(&mut self, q: &mut Queue, mem: &Memory, frame: &[u8]) -> Scatter {
        if frame.len() < HDR_LEN {
            return Scatter::Dropped;
        }
        let Some(n) = self.chains_for(frame.len()) else {
            // Without mergeable buffers the first chain is all a frame may
            // have: one too small never will be larger. With them, once the
            // device holds the whole ring the driver can offer no more.
            let stuck = if self.mrg {
                self.held.len() >= usize::from(q.size())
            } else {
                !self.held.is_empty()
            };
            return if stuck {
                Scatter::Dropped
            } else {
                Scatter::NoRoom
            };
        };
        let mut done = 0usize;
        for c in self.held.iter().take(n) {
            for &Piece { addr, len, .. } in &c.pieces {
                if done == frame.len() {
                    break;
                }
                let take = (len as usize).min(frame.len() - done);
                if mem
                    .write_slice(&frame[done..done + take], GuestAddress(addr))
                    .is_err()
                {
                    self.drop_front(q, mem, n);
                    return Scatter::Dropped;
                }
                done += take;
            }
        }
        match self.complete(q, mem, frame.len()) {
            Some(n) => Scatter::Delivered(n),
            None => Scatter::Dropped,
        }
    }

    /// Gives the first `n` held chains back used and empty.
    fn drop_front(&mut self, q: &mut Queue, mem: &Memory, n: usize) {
        for _ in 0..n {
            if let Some(c) = self.held.pop_front() {
                self.room -= c.room;
                let _ = q.add_used(mem, c.head, 0);
            }
        }
    }

    /// How many chains are held.
    pub fn held(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestMemoryMmap;

    const WRITE: u16 = 2;
    const NEXT: u16 = 1;

    fn mem() -> Memory {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap()
    }

    /// A queue of 16 (descriptors at 0x10000, avail 0x20000, used 0x30000)
    /// whose driver offers one chain per entry of `chains`, each a list of
    /// (address, length, flags) descriptors.
    fn queue(m: &Memory, chains: &[&[(u64, u32, u16)]]) -> Queue {
        let mut q = Queue::new(16).unwrap();
        q.set_size(16);
        q.set_desc_table_address(Some(0x10000), Some(0));
        q.set_avail_ring_address(Some(0x20000), Some(0));
        q.set_used_ring_address(Some(0x30000), Some(0));
        q.set_ready(true);
        let mut d = 0u16;
        for (i, chain) in chains.iter().enumerate() {
            m.write_obj(d.to_le(), GuestAddress(0x20004 + 2 * i as u64))
                .unwrap();
            for (j, &(addr, len, flags)) in chain.iter().enumerate() {
                let at = 0x10000 + 16 * u64::from(d);
                let last = j + 1 == chain.len();
                m.write_obj(addr.to_le(), GuestAddress(at)).unwrap();
                m.write_obj(len.to_le(), GuestAddress(at + 8)).unwrap();
                let f = if last { flags } else { flags | NEXT };
                m.write_obj(f.to_le(), GuestAddress(at + 12)).unwrap();
                m.write_obj((d + 1).to_le(), GuestAddress(at + 14)).unwrap();
                d += 1;
            }
        }
        m.write_obj((chains.len() as u16).to_le(), GuestAddress(0x20002))
            .unwrap();
        assert!(q.is_valid(m));
        q
    }

    /// The used ring's index and its entries (head, length).
    fn used(m: &Memory) -> Vec<(u32, u32)> {
        let idx: u16 = m.read_obj(GuestAddress(0x30002)).unwrap();
        (0..u64::from(idx))
            .map(|i| {
                let at = 0x30004 + 8 * i;
                (
                    m.read_obj(GuestAddress(at)).unwrap(),
                    m.read_obj(GuestAddress(at + 4)).unwrap(),
                )
            })
            .collect()
    }

    fn num_buffers(m: &Memory, hdr: u64) -> u16 {
        m.read_obj(GuestAddress(hdr + 10)).unwrap()
    }

    #[test]
    fn a_frame_spreads_over_mergeable_chains_with_num_buffers() {
        let m = mem();
        let mut q = queue(
            &m,
            &[
                &[(0x1000, 1500, WRITE)],
                &[(0x3000, 1000, WRITE), (0x5000, 4096, WRITE)],
                &[(0x7000, 4096, WRITE)],
            ],
        );
        let mut b = RxBuffers::new(true);
        assert_eq!(b.fill(&mut q, &m, 3000), 0);
        assert_eq!(
            (b.held(), b.room()),
            (2, 6596),
            "taken until the frame fits"
        );
        let frame: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
        assert_eq!(b.scatter(&mut q, &m, &frame), Scatter::Delivered(2));
        assert_eq!(used(&m), vec![(0, 1500), (1, 1500)]);
        assert_eq!(num_buffers(&m, 0x1000), 2);
        let mut tail = [0u8; 500];
        m.read_slice(&mut tail, GuestAddress(0x5000)).unwrap();
        assert_eq!(&tail[..], &frame[2500..]);
        assert_eq!((b.held(), b.room()), (0, 0));
        // Short of buffers: the frame waits, nothing is used.
        b.fill(&mut q, &m, 5000);
        assert_eq!(b.scatter(&mut q, &m, &[0; 5000]), Scatter::NoRoom);
        assert_eq!((used(&m).len(), b.held()), (2, 1));
    }

    #[test]
    fn a_frame_read_straight_in_is_completed_in_order() {
        let m = mem();
        // The header split over two pieces: num_buffers straddles them.
        let mut q = queue(
            &m,
            &[
                &[(0x1000, 11, WRITE), (0x2000, 100, WRITE)],
                &[(0x3000, 100, WRITE)],
                &[(0x4000, 100, WRITE)],
            ],
        );
        let mut b = RxBuffers::new(true);
        b.fill(&mut q, &m, 1000);
        assert_eq!((b.held(), b.room()), (3, 311));
        let iov = b.iovecs().unwrap();
        let lens: Vec<usize> = iov.iter().map(|v| v.iov_len).collect();
        assert_eq!(lens, vec![11, 100, 100, 100]);
        let at = m.get_host_address(GuestAddress(0x2000)).unwrap();
        assert_eq!(
            iov[1].iov_base.cast::<u8>(),
            at,
            "the VMM's mapping of the buffer"
        );
        crate::take_dirty(&m);
        assert_eq!(b.complete_read(&mut q, &m, 150), Some(2));
        assert_eq!(used(&m), vec![(0, 111), (2, 39)]);
        // Pages 1, 2 and 3 were written (0x1000, 0x2000, 0x3000).
        assert_eq!(crate::take_dirty(&m)[0][0] & 0xffff, 0b1110, "marked dirty");
        let lo: u8 = m.read_obj(GuestAddress(0x1000 + 10)).unwrap();
        let hi: u8 = m.read_obj(GuestAddress(0x2000)).unwrap();
        assert_eq!(u16::from_le_bytes([lo, hi]), 2);
        assert_eq!((b.held(), b.room()), (1, 100), "the last one still held");
        assert_eq!(b.complete(&mut q, &m, 101), None, "more than is held");
    }

    #[test]
    fn a_frame_larger_than_the_whole_ring_is_dropped_not_waited_for() {
        let m = mem();
        let chains: Vec<[(u64, u32, u16); 1]> = (0..16)
            .map(|i| [(0x1000 + 0x100 * i, 100, WRITE)])
            .collect();
        let refs: Vec<&[(u64, u32, u16)]> = chains.iter().map(|c| &c[..]).collect();
        let mut q = queue(&m, &refs);
        let mut b = RxBuffers::new(true);
        b.fill(&mut q, &m, 1000);
        assert_eq!(b.held(), 10, "taken until the frame fits");
        assert_eq!(b.scatter(&mut q, &m, &[0; 2000]), Scatter::NoRoom);
        b.fill(&mut q, &m, 2000);
        assert_eq!((b.held(), b.room()), (16, 1600), "all the ring holds");
        assert_eq!(b.scatter(&mut q, &m, &[0; 2000]), Scatter::Dropped);
        assert_eq!(b.held(), 16, "kept for the frames that fit");
        assert_eq!(b.scatter(&mut q, &m, &[0; 150]), Scatter::Delivered(2));
    }

    #[test]
    fn without_mergeable_buffers_a_frame_takes_one_chain() {
        let m = mem();
        let mut q = queue(&m, &[&[(0x1000, 100, WRITE)], &[(0x2000, 4000, WRITE)]]);
        let mut b = RxBuffers::new(false);
        b.fill(&mut q, &m, 3000);
        assert_eq!((b.held(), b.room()), (1, 100), "one chain held");
        assert_eq!(b.scatter(&mut q, &m, &[7; 3000]), Scatter::Dropped);
        assert!(
            used(&m).is_empty(),
            "the small chain kept for a small frame"
        );
        assert_eq!(b.scatter(&mut q, &m, &[7; 60]), Scatter::Delivered(1));
        assert_eq!(used(&m), vec![(0, 60)]);
        assert_eq!(num_buffers(&m, 0x1000), 1);
        b.fill(&mut q, &m, 3000);
        assert_eq!(b.scatter(&mut q, &m, &[7; 3000]), Scatter::Delivered(1));
        assert_eq!(b.iovecs().map(|v| v.len()), Some(0), "none held");
    }

    #[test]
    fn unusable_chains_go_back_empty() {
        let m = mem();
        let mut q = queue(
            &m,
            &[
                &[(0x1000, 100, 0)],
                &[((1 << 20) - 10, 100, WRITE)],
                &[(0x3000, 100, WRITE)],
            ],
        );
        let mut b = RxBuffers::new(true);
        assert_eq!(b.fill(&mut q, &m, 100), 2, "read-only, outside memory");
        assert_eq!(used(&m), vec![(0, 0), (1, 0)]);
        assert_eq!((b.held(), b.room()), (1, 100));
        assert_eq!(
            b.scatter(&mut q, &m, &[1; 4]),
            Scatter::Dropped,
            "no header"
        );
    }

    #[test]
    fn a_frame_in_too_many_pieces_is_not_read_straight_in() {
        let mut b = RxBuffers::new(true);
        let piece = |i: u64| Piece {
            addr: 0x1000 + 64 * i,
            len: 64,
            host: 0,
        };
        b.push(
            0,
            (0..MAX_IOVECS as u64).map(piece).collect(),
            64 * MAX_IOVECS,
        );
        assert_eq!(b.iovecs().map(|v| v.len()), Some(MAX_IOVECS));
        b.push(1, vec![piece(0)], 64);
        assert!(b.iovecs().is_none(), "more than one readv takes");
    }
}
