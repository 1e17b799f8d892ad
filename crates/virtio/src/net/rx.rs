//! The receive side's ring work: taking the guest's buffers for a frame
//! (one chain, or several with mergeable buffers), copying a frame into
//! them or handing them to the tap's read as I/O vectors, and waiting for
//! more when the guest offers too few.

use std::sync::atomic::Ordering;

use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::bitmap::Bitmap;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use crate::Memory;

/// Where a received frame goes: for each chain, its head and writable
/// (address, length) pieces.
pub type RxChains = Vec<(u16, Vec<(u64, u32)>)>;

/// Copies `frame` into the chains, setting the header's `num_buffers`;
/// returns each chain's head and the bytes written into it, or None if a
/// guest buffer is outside guest memory.
pub fn scatter_rx(mem: &Memory, frame: &mut [u8], chains: &RxChains) -> Option<Vec<(u16, u32)>> {
    let n = u16::try_from(chains.len()).ok()?;
    frame[10..12].copy_from_slice(&n.to_le_bytes());
    let mut done = 0usize;
    let mut used = Vec::with_capacity(chains.len());
    for (head, pieces) in chains {
        let mut in_chain = 0u32;
        for &(addr, len) in pieces {
            if done == frame.len() {
                break;
            }
            let take = (len as usize).min(frame.len() - done);
            mem.write_slice(&frame[done..done + take], GuestAddress(addr))
                .ok()?;
            done += take;
            in_chain += take as u32;
        }
        used.push((*head, in_chain));
    }
    Some(used)
}

/// Collects enough receive chains of `q` for a frame of `len` bytes (one
/// chain without mergeable buffers). None: not enough buffers, and the
/// chains stay in the ring; Some(Err): a chain was unusable (read-only, or
/// too small without mergeable buffers) and every chain taken went back
/// empty.
pub fn take_rx_chains(
    q: &mut Queue,
    mem: &Memory,
    len: usize,
    mrg: bool,
) -> Option<Result<RxChains, ()>> {
    match pop_chains(q, mem, len, mrg) {
        Popped::Enough(chains) => Some(Ok(chains)),
        Popped::RanOut => None,
        Popped::Capped(chains) => {
            for (head, _) in &chains {
                let _ = q.add_used(mem, *head, 0);
            }
            Some(Err(()))
        }
        Popped::Bad => Some(Err(())),
    }
}

/// Receive chains of `q` with room for `want` bytes, for a frame read
/// straight into them ([`rx_iovecs`]) before its length is known. None:
/// the ring holds less, and every chain stays in it; Some(Err): a chain
/// was unusable and every chain taken went back empty.
pub fn take_room(q: &mut Queue, mem: &Memory, want: usize) -> Option<Result<RxChains, ()>> {
    match pop_chains(q, mem, want, true) {
        Popped::Enough(chains) => Some(Ok(chains)),
        Popped::RanOut => None,
        Popped::Capped(chains) => {
            for _ in 0..chains.len() {
                q.go_to_previous_position();
            }
            None
        }
        Popped::Bad => Some(Err(())),
    }
}

enum Popped {
    /// Room for the bytes asked for.
    Enough(RxChains),
    /// The ring ran out first; the chains taken were put back.
    RanOut,
    /// Too little room in the most chains a frame may take (one without
    /// mergeable buffers, else the ring's size); the chains are still
    /// taken.
    Capped(RxChains),
    /// A chain had a read-only descriptor; every chain taken went back
    /// empty.
    Bad,
}

fn pop_chains(q: &mut Queue, mem: &Memory, want: usize, mrg: bool) -> Popped {
    let mut chains: RxChains = Vec::new();
    let mut room = 0usize;
    while room < want {
        let Some(chain) = q.pop_descriptor_chain(mem) else {
            for _ in 0..chains.len() {
                q.go_to_previous_position();
            }
            return Popped::RanOut;
        };
        let head = chain.head_index();
        let mut pieces = Vec::new();
        let mut bad = false;
        for d in chain {
            if !d.is_write_only() {
                bad = true;
                break;
            }
            room = room.saturating_add(d.len() as usize);
            pieces.push((d.addr().0, d.len()));
        }
        if bad {
            for (h, _) in &chains {
                let _ = q.add_used(mem, *h, 0);
            }
            let _ = q.add_used(mem, head, 0);
            return Popped::Bad;
        }
        chains.push((head, pieces));
        if !mrg || chains.len() >= usize::from(q.size()) {
            break;
        }
    }
    if room < want {
        Popped::Capped(chains)
    } else {
        Popped::Enough(chains)
    }
}

/// Out of room for the frame at hand: asks the guest to notify the device
/// when it adds any buffer past those it offers now, and says whether it
/// added some meanwhile (look again). Waiting instead for the buffers past
/// the ones taken (`enable_notification`'s `avail_event = next_avail`)
/// never ends when the guest offers some but fewer than a frame needs (a
/// 64 KiB TSO frame takes some 44 of Linux's 1.5 KiB mergeable buffers):
/// its later additions do not cross that index, so it sends no kick, and
/// `enable_notification` says "more" each time, so the device looked
/// again in a loop that never let the guest hear of the buffers already
/// used (bench/paper's iperf3 to the guest: a domain reachable no more).
pub fn wait_for_buffers(q: &mut Queue, mem: &Memory) -> bool {
    let Ok(offered) = q.avail_idx(mem, Ordering::Acquire) else {
        return false;
    };
    if q.event_idx_enabled() {
        let Some(addr) = q
            .used_ring()
            .checked_add(crate::avail_event_offset(q.size()))
        else {
            return false;
        };
        if mem
            .store(offered.0.to_le(), GuestAddress(addr), Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
    } else if q.enable_notification(mem).is_err() {
        return false;
    }
    // The store above before the load below (the driver's side pairs it).
    std::sync::atomic::fence(Ordering::SeqCst);
    q.avail_idx(mem, Ordering::Relaxed)
        .is_ok_and(|now| now != offered)
}

/// I/O vectors straight into the chains' writable pieces, in order, at
/// most `cap` bytes in all (the last one cut short), each inside guest
/// RAM; None if a piece is not.
pub fn rx_iovecs(mem: &Memory, chains: &RxChains, cap: usize) -> Option<Vec<libc::iovec>> {
    let mut iov = Vec::new();
    let mut total = 0usize;
    for (_, pieces) in chains {
        for &(addr, len) in pieces {
            let take = (len as usize).min(cap - total);
            if take == 0 {
                continue;
            }
            let slice = mem.get_slice(GuestAddress(addr), take).ok()?;
            iov.push(libc::iovec {
                iov_base: slice.ptr_guard_mut().as_ptr().cast(),
                iov_len: take,
            });
            total += take;
        }
    }
    Some(iov)
}

/// After a frame of `n` bytes was read straight into `chains`
/// ([`rx_iovecs`]): the chains it reached, each one's head and bytes (the
/// rest got nothing and go back to the ring). Their bytes are marked
/// dirty, since a write through the vectors bypasses the memory's own
/// log, and the header's `num_buffers` says how many there are. None if a
/// piece is outside guest memory.
pub fn finish_rx(mem: &Memory, chains: &RxChains, n: usize) -> Option<Vec<(u16, u32)>> {
    let mut used = Vec::new();
    let mut done = 0usize;
    for (head, pieces) in chains {
        if done == n {
            break;
        }
        let mut in_chain = 0u32;
        for &(addr, len) in pieces {
            let take = (len as usize).min(n - done);
            if take == 0 {
                continue;
            }
            mem.get_slice(GuestAddress(addr), take)
                .ok()?
                .bitmap()
                .mark_dirty(0, take);
            done += take;
            in_chain += take as u32;
        }
        used.push((*head, in_chain));
    }
    let count = u16::try_from(used.len()).ok()?;
    write_at(mem, chains, 10, &count.to_le_bytes())?;
    Some(used)
}

/// Writes `bytes` at offset `at` of the frame the chains hold.
fn write_at(mem: &Memory, chains: &RxChains, at: usize, bytes: &[u8]) -> Option<()> {
    let (mut pos, mut i) = (0usize, 0usize);
    for &(addr, len) in chains.iter().flat_map(|(_, p)| p) {
        let len = len as usize;
        while i < bytes.len() && at + i < pos + len {
            let off = (at + i - pos) as u64;
            mem.write_slice(&bytes[i..=i], GuestAddress(addr.checked_add(off)?))
                .ok()?;
            i += 1;
        }
        if i == bytes.len() {
            return Some(());
        }
        pos += len;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestMemoryMmap;

    fn mem() -> Memory {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap()
    }

    /// A queue of 256 at 0x10000 (descriptors), 0x20000 (avail), 0x30000
    /// (used) whose driver offers `offered` buffers.
    fn rx_queue(m: &Memory, event_idx: bool, offered: u16) -> Queue {
        let mut q = Queue::new(256).unwrap();
        q.set_size(256);
        q.set_desc_table_address(Some(0x10000), Some(0));
        q.set_avail_ring_address(Some(0x20000), Some(0));
        q.set_used_ring_address(Some(0x30000), Some(0));
        q.set_event_idx(event_idx);
        q.set_ready(true);
        assert!(q.is_valid(m));
        m.write_obj(offered.to_le(), GuestAddress(0x20002)).unwrap();
        q
    }

    #[test]
    fn a_device_short_of_buffers_waits_for_any_new_one() {
        let m = mem();
        // Five buffers offered, none taken, too few for the frame.
        let mut q = rx_queue(&m, true, 5);
        assert!(
            q.enable_notification(&m).unwrap(),
            "the crate's own call says 'more' whenever buffers are offered"
        );
        assert!(!wait_for_buffers(&mut q, &m), "none added meanwhile");
        let avail_event: u16 = m.read_obj(GuestAddress(0x30000 + 4 + 8 * 256)).unwrap();
        assert_eq!(avail_event, 5, "the next buffer added kicks");
        // Without event idx: the driver kicks on every buffer it adds.
        let mut q = rx_queue(&m, false, 5);
        m.write_obj(1u16.to_le(), GuestAddress(0x30000)).unwrap();
        assert!(!wait_for_buffers(&mut q, &m));
        let flags: u16 = m.read_obj(GuestAddress(0x30000)).unwrap();
        assert_eq!(flags, 0, "VRING_USED_F_NO_NOTIFY cleared");
    }

    #[test]
    fn rx_frames_spread_over_chains_with_num_buffers() {
        let m = mem();
        let mut frame: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
        let chains: RxChains = vec![
            (3, vec![(0x1000, 1500)]),
            (7, vec![(0x3000, 1000), (0x5000, 4096)]),
        ];
        let used = scatter_rx(&m, &mut frame, &chains).unwrap();
        assert_eq!(used, vec![(3, 1500), (7, 1500)]);
        let mut hdr = [0u8; 12];
        m.read_slice(&mut hdr, GuestAddress(0x1000)).unwrap();
        assert_eq!(u16::from_le_bytes([hdr[10], hdr[11]]), 2);
        let mut tail = [0u8; 500];
        m.read_slice(&mut tail, GuestAddress(0x5000)).unwrap();
        assert_eq!(&tail[..], &frame[2500..]);
        let outside: RxChains = vec![(1, vec![((1 << 20) - 10, 3000)])];
        assert!(scatter_rx(&m, &mut frame, &outside).is_none());
    }

    /// Writes descriptor `i` (address, length, write-only, next) and
    /// offers chain heads `heads` in the avail ring of `rx_queue`'s layout.
    fn desc(m: &Memory, i: u16, addr: u64, len: u32, write: bool, next: Option<u16>) {
        let base = 0x10000 + 16 * u64::from(i);
        let flags = u16::from(write) * 2 + u16::from(next.is_some());
        m.write_obj(addr.to_le(), GuestAddress(base)).unwrap();
        m.write_obj(len.to_le(), GuestAddress(base + 8)).unwrap();
        m.write_obj(flags.to_le(), GuestAddress(base + 12)).unwrap();
        m.write_obj(next.unwrap_or(0).to_le(), GuestAddress(base + 14))
            .unwrap();
    }

    fn offer(m: &Memory, heads: &[u16]) {
        for (k, h) in heads.iter().enumerate() {
            m.write_obj(h.to_le(), GuestAddress(0x20004 + 2 * k as u64))
                .unwrap();
        }
        m.write_obj((heads.len() as u16).to_le(), GuestAddress(0x20002))
            .unwrap();
    }

    #[test]
    fn room_for_a_frame_is_taken_whole_or_left_in_the_ring() {
        let m = mem();
        // Three 4 KiB buffers: room for 12 KiB, not for 16.
        for i in 0..3u16 {
            desc(&m, i, 0x40000 + 0x1000 * u64::from(i), 4096, true, None);
        }
        let mut q = rx_queue(&m, true, 0);
        offer(&m, &[0, 1, 2]);
        assert!(take_room(&mut q, &m, 16 << 10).is_none());
        assert_eq!(q.next_avail(), 0, "every chain put back");
        let chains = take_room(&mut q, &m, 9000).unwrap().unwrap();
        assert_eq!(chains.len(), 3);
        // A ring of 2 whose chains hold less than asked: put back too,
        // where the copying path gives them back empty.
        let mut small = Queue::new(2).unwrap();
        small.set_size(2);
        small.set_desc_table_address(Some(0x10000), Some(0));
        small.set_avail_ring_address(Some(0x20000), Some(0));
        small.set_used_ring_address(Some(0x30000), Some(0));
        small.set_ready(true);
        offer(&m, &[0, 1]);
        assert!(take_room(&mut small, &m, 16 << 10).is_none());
        assert_eq!(small.next_avail(), 0);
        // A read-only descriptor: the chains go back used and empty.
        desc(&m, 1, 0x41000, 4096, false, None);
        let mut q = rx_queue(&m, true, 0);
        offer(&m, &[0, 1, 2]);
        assert_eq!(take_room(&mut q, &m, 9000), Some(Err(())));
        let used: u16 = m.read_obj(GuestAddress(0x30002)).unwrap();
        assert_eq!(used, 2);
    }

    #[test]
    fn a_frame_read_into_the_vectors_fills_the_first_chains() {
        let m = mem();
        let chains: RxChains = vec![
            (3, vec![(0x1000, 8), (0x2000, 1492)]),
            (7, vec![(0x3000, 1500)]),
            (9, vec![(0x5000, 1500)]),
        ];
        let iov = rx_iovecs(&m, &chains, 2000).unwrap();
        let lens: Vec<usize> = iov.iter().map(|v| v.iov_len).collect();
        assert_eq!(lens, vec![8, 1492, 500], "cut at the cap");
        // A 2000-byte frame, as the tap's readv would leave it.
        let frame: Vec<u8> = (0..2000u32).map(|i| (i % 251) as u8).collect();
        let mut done = 0;
        for v in &iov {
            // SAFETY: rx_iovecs's vectors point into `m`'s mapping, which
            // outlives them, and nothing else touches it meanwhile.
            unsafe {
                std::ptr::copy_nonoverlapping(frame[done..].as_ptr(), v.iov_base.cast(), v.iov_len)
            };
            done += v.iov_len;
        }
        let used = finish_rx(&m, &chains, 2000).unwrap();
        assert_eq!(used, vec![(3, 1500), (7, 500)], "the third chain goes back");
        let mut hdr = [0u8; 12];
        m.read_slice(&mut hdr[..8], GuestAddress(0x1000)).unwrap();
        m.read_slice(&mut hdr[8..], GuestAddress(0x2000)).unwrap();
        assert_eq!(&hdr[..10], &frame[..10]);
        assert_eq!(
            u16::from_le_bytes([hdr[10], hdr[11]]),
            2,
            "num_buffers, across pieces"
        );
        let mut tail = [0u8; 500];
        m.read_slice(&mut tail, GuestAddress(0x3000)).unwrap();
        assert_eq!(&tail[..], &frame[1500..]);
        let outside: RxChains = vec![(1, vec![((1 << 20) - 10, 3000)])];
        assert!(rx_iovecs(&m, &outside, 3000).is_none());
        assert!(finish_rx(&m, &outside, 3000).is_none());
    }

    #[test]
    fn writes_through_the_vectors_are_logged_dirty() {
        let m = mem();
        let _ = crate::take_dirty(&m);
        let chains: RxChains = vec![(0, vec![(0x8000, 4096)]), (1, vec![(0xa000, 4096)])];
        finish_rx(&m, &chains, 5000).unwrap();
        let words = crate::take_dirty(&m).concat();
        let pages: Vec<usize> = (0..words.len() * 64)
            .filter(|p| words[p / 64] >> (p % 64) & 1 == 1)
            .collect();
        assert_eq!(pages, vec![8, 10]);
    }
}
