//! What `GET /v1/domain/rings` reports for a virtio-pci function: each
//! live queue's indexes as they stand in guest memory, the used index at
//! the device's last interrupt for it ([`Signals`], kept by
//! [`crate::msix::Interrupt::queue`]), and its MSI-X vector
//! ([`domus_api::rings`] says what the combination means).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use domus_api::rings::RingInfo;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};

use crate::msix::{Msix, NO_VECTOR};
use crate::Memory;

/// No interrupt yet.
const NEVER: u32 = u32::MAX;

/// The used index at each queue's last interrupt, since activation.
pub struct Signals {
    mem: Arc<Memory>,
    /// Each queue's used ring address, by queue index (None: not live).
    used_rings: Vec<Option<u64>>,
    at: Vec<AtomicU32>,
}

fn read_u16(mem: &Memory, addr: u64) -> Option<u16> {
    mem.read_obj::<u16>(GuestAddress(addr))
        .ok()
        .map(u16::from_le)
}

impl Signals {
    pub fn new(mem: Arc<Memory>, used_rings: Vec<Option<u64>>) -> Self {
        let at = used_rings.iter().map(|_| AtomicU32::new(NEVER)).collect();
        Self {
            mem,
            used_rings,
            at,
        }
    }

    /// Queue `q`'s device is about to interrupt: remember its used index.
    /// Threads that race keep the later index (block I/O threads signal
    /// the same queue).
    pub fn record(&self, q: usize) {
        let (Some(Some(ring)), Some(slot)) = (self.used_rings.get(q), self.at.get(q)) else {
            return;
        };
        let Some(used) = ring.checked_add(2).and_then(|a| read_u16(&self.mem, a)) else {
            return;
        };
        let _ = slot.fetch_update(Ordering::AcqRel, Ordering::Acquire, |old| {
            let newer = old == NEVER || {
                let d = used.wrapping_sub(old as u16);
                d != 0 && d < 0x8000
            };
            newer.then_some(u32::from(used))
        });
    }

    /// The used index at queue `q`'s last interrupt.
    pub fn last(&self, q: usize) -> Option<u16> {
        let v = self.at.get(q)?.load(Ordering::Acquire);
        (v != NEVER).then_some(v as u16)
    }
}

/// Each ready queue of `device`'s function; a ring outside guest memory
/// reads as 0 (the transport checked them at activation).
pub fn report(
    device: &str,
    mem: &Memory,
    queues: &[Queue],
    vectors: &[u16],
    event_idx: bool,
    msix: &Msix,
    signals: &Signals,
) -> Vec<RingInfo> {
    let at = |a: u64, off: u64| {
        a.checked_add(off)
            .and_then(|a| read_u16(mem, a))
            .unwrap_or(0)
    };
    queues
        .iter()
        .enumerate()
        .filter(|(_, q)| q.ready())
        .map(|(i, q)| {
            let size = u64::from(q.size());
            let (avail, used) = (q.avail_ring(), q.used_ring());
            let vector = vectors.get(i).copied().unwrap_or(NO_VECTOR);
            RingInfo {
                device: device.to_string(),
                queue: i as u16,
                size: q.size(),
                event_idx,
                avail_flags: at(avail, 0),
                avail_idx: at(avail, 2),
                used_event: at(avail, 4 + 2 * size),
                used_flags: at(used, 0),
                used_idx: at(used, 2),
                avail_event: at(used, crate::avail_event_offset(q.size())),
                signalled_at: signals.last(i),
                vector: msix.vector_info(vector),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem() -> Arc<Memory> {
        Arc::new(Memory::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap())
    }

    #[test]
    fn the_later_used_index_wins_across_the_wrap() {
        let m = mem();
        let s = Signals::new(m.clone(), vec![None, Some(0x1000)]);
        assert_eq!(s.last(1), None);
        m.write_obj(65534u16.to_le(), GuestAddress(0x1002)).unwrap();
        s.record(1);
        assert_eq!(s.last(1), Some(65534));
        m.write_obj(1u16.to_le(), GuestAddress(0x1002)).unwrap();
        s.record(1);
        assert_eq!(s.last(1), Some(1));
        // A thread that read the index earlier and records it late.
        m.write_obj(65535u16.to_le(), GuestAddress(0x1002)).unwrap();
        s.record(1);
        assert_eq!(s.last(1), Some(1));
        // Queues that are not live, or out of range, record nothing.
        s.record(0);
        s.record(7);
        assert_eq!(s.last(0), None);
    }
}
