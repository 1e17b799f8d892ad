//! MSI-X: the vector table and pending bits a virtio-pci function exposes
//! in its BAR, and [`Interrupt`], the handle a device thread uses to raise
//! queue and config interrupts.
//!
//! Each vector has a GSI and an eventfd the VMM wired to it as an irqfd.
//! Delivery checks the masks here, in userspace: a masked vector's
//! interrupt is remembered in the pending bits and sent on unmask. The KVM
//! route of a vector is (re)programmed whenever its message changes while
//! it is unmasked, and on unmask.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use domus_api::rings::VectorInfo;
use domus_devices::bus::lock;
use vmm_sys_util::eventfd::EventFd;

use crate::rings::Signals;
use crate::Hypervisor;

/// "No vector" in the common config's vector registers.
pub const NO_VECTOR: u16 = 0xffff;
pub const ENTRY_SIZE: u64 = 16;
/// The most vectors a device has (the pending bits fit one u64).
pub const MAX_VECTORS: usize = 64;

/// ISR status bits (used when MSI-X is off, and read by some drivers).
pub const ISR_QUEUE: u8 = 1;
pub const ISR_CONFIG: u8 = 2;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Entry {
    addr_lo: u32,
    addr_hi: u32,
    data: u32,
    control: u32,
}

impl Entry {
    fn masked(&self) -> bool {
        self.control & 1 != 0
    }
    fn message(&self) -> (u64, u32) {
        (
            u64::from(self.addr_hi) << 32 | u64::from(self.addr_lo),
            self.data,
        )
    }
}

/// One vector's output: its GSI and the irqfd behind it.
pub struct Vector {
    pub gsi: u32,
    pub irqfd: EventFd,
}

pub struct Msix {
    entries: Vec<Entry>,
    /// The message last programmed into KVM for each vector.
    routed: Vec<Option<(u64, u32)>>,
    pending: u64,
    enabled: bool,
    function_masked: bool,
    vectors: Vec<Vector>,
    hv: Arc<dyn Hypervisor>,
    /// Interrupts sent on each vector (for `GET /v1/domain/rings`).
    fired: Vec<u64>,
}

impl Msix {
    /// Gives the vectors back to the hypervisor (the device was unplugged);
    /// nothing is signalled afterwards.
    pub fn release(&mut self) {
        for v in self.vectors.drain(..) {
            let _ = self.hv.release_vector(&v);
        }
        self.enabled = false;
    }

    pub fn new(vectors: Vec<Vector>, hv: Arc<dyn Hypervisor>) -> Self {
        assert!(!vectors.is_empty() && vectors.len() <= MAX_VECTORS);
        let n = vectors.len();
        Self {
            entries: vec![
                Entry {
                    control: 1,
                    ..Default::default()
                };
                n
            ],
            routed: vec![None; n],
            fired: vec![0; n],
            pending: 0,
            enabled: false,
            function_masked: false,
            vectors,
            hv,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The MSI-X capability's message control changed.
    pub fn set_control(&mut self, enabled: bool, function_masked: bool) {
        self.enabled = enabled;
        self.function_masked = function_masked;
        self.flush_pending();
    }

    fn route(&mut self, v: usize) {
        // No vector: released by an unplug.
        let Some(gsi) = self.vectors.get(v).map(|x| x.gsi) else {
            return;
        };
        let msg = self.entries[v].message();
        if self.routed[v] != Some(msg) {
            match self.hv.set_msi_route(gsi, msg.0, msg.1) {
                Ok(()) => self.routed[v] = Some(msg),
                Err(e) => crate::warn("msix", format_args!("routing vector {v}: {e}")),
            }
        }
    }

    fn deliverable(&self, v: usize) -> bool {
        self.enabled && !self.function_masked && !self.entries[v].masked()
    }

    fn flush_pending(&mut self) {
        for v in 0..self.entries.len() {
            if self.pending & (1 << v) != 0 && self.deliverable(v) {
                self.pending &= !(1 << v);
                self.fire(v);
            }
        }
    }

    fn fire(&mut self, v: usize) {
        self.route(v);
        match self.vectors.get(v).map(|x| x.irqfd.write(1)) {
            Some(Ok(())) => self.fired[v] += 1,
            Some(Err(e)) => crate::warn("msix", format_args!("signalling vector {v}: {e}")),
            None => {}
        }
    }

    /// Vector `v` as `GET /v1/domain/rings` shows it; None if out of range.
    pub fn vector_info(&self, v: u16) -> Option<VectorInfo> {
        let i = usize::from(v);
        let e = self.entries.get(i)?;
        Some(VectorInfo {
            index: v,
            enabled: self.enabled && !self.function_masked,
            masked: e.masked(),
            pending: self.pending & (1 << i) != 0,
            fired: self.fired[i],
            routed: self.routed[i] == Some(e.message()),
        })
    }

    /// The irqfd of vector `v`, with its route programmed now, for a backend
    /// that signals it itself (vhost); None if the vector cannot take
    /// interrupts now (out of range, MSI-X off, masked). Later changes of
    /// the entry re-program the route (see `table_write`); a backend that
    /// signals while the guest has the vector masked is not held back.
    pub fn direct_irqfd(&mut self, v: u16) -> Option<EventFd> {
        let v = usize::from(v);
        if v >= self.entries.len() || !self.deliverable(v) {
            return None;
        }
        self.route(v);
        self.vectors.get(v)?.irqfd.try_clone().ok()
    }

    /// Raises vector `v`; out-of-range vectors (and [`NO_VECTOR`]) do nothing.
    pub fn trigger(&mut self, v: u16) {
        let v = usize::from(v);
        if v >= self.entries.len() || !self.enabled {
            return;
        }
        if self.deliverable(v) {
            self.fire(v);
        } else {
            self.pending |= 1 << v;
        }
    }

    /// A read of the table (offset within it).
    pub fn table_read(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let (v, field) = ((offset / ENTRY_SIZE) as usize, offset % ENTRY_SIZE);
        let Some(e) = self.entries.get(v) else { return };
        if field % 4 != 0 || data.len() > 8 || field as usize + data.len() > 16 {
            return;
        }
        let words = [e.addr_lo, e.addr_hi, e.data, e.control];
        let mut bytes = [0u8; 16];
        for (i, w) in words.iter().enumerate() {
            bytes[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
        }
        let f = field as usize;
        data.copy_from_slice(&bytes[f..f + data.len()]);
    }

    /// A write to the table: only aligned 4- and 8-byte writes count.
    pub fn table_write(&mut self, offset: u64, data: &[u8]) {
        let (v, field) = (
            (offset / ENTRY_SIZE) as usize,
            (offset % ENTRY_SIZE) as usize,
        );
        if v >= self.entries.len() || field % 4 != 0 || !matches!(data.len(), 4 | 8) {
            return;
        }
        if field + data.len() > 16 {
            return;
        }
        let mut words = {
            let e = self.entries[v];
            [e.addr_lo, e.addr_hi, e.data, e.control]
        };
        for (i, chunk) in data.chunks(4).enumerate() {
            let mut b = [0u8; 4];
            b.copy_from_slice(chunk);
            words[field / 4 + i] = u32::from_le_bytes(b);
        }
        let was_masked = self.entries[v].masked();
        self.entries[v] = Entry {
            addr_lo: words[0],
            addr_hi: words[1],
            data: words[2],
            control: words[3] & 1,
        };
        if !self.entries[v].masked() {
            self.route(v);
            if was_masked {
                self.flush_pending();
            }
        }
    }

    /// What a snapshot keeps: the table, the pending bits and the
    /// capability's two control bits.
    pub fn state(&self) -> MsixState {
        MsixState {
            entries: self
                .entries
                .iter()
                .map(|e| [e.addr_lo, e.addr_hi, e.data, e.control])
                .collect(),
            pending: self.pending,
            enabled: self.enabled,
            function_masked: self.function_masked,
        }
    }

    /// Puts back what [`Msix::state`] saved and routes every vector the
    /// guest left unmasked; a table of another size is refused.
    pub fn restore(&mut self, s: &MsixState) -> Result<(), String> {
        if s.entries.len() != self.entries.len() {
            return Err(format!(
                "{} MSI-X vectors saved, the device has {}",
                s.entries.len(),
                self.entries.len()
            ));
        }
        for (e, w) in self.entries.iter_mut().zip(&s.entries) {
            *e = Entry {
                addr_lo: w[0],
                addr_hi: w[1],
                data: w[2],
                control: w[3] & 1,
            };
        }
        let all = if self.entries.len() >= 64 {
            u64::MAX
        } else {
            (1u64 << self.entries.len()) - 1
        };
        self.pending = s.pending & all;
        self.enabled = s.enabled;
        self.function_masked = s.function_masked;
        self.routed.fill(None);
        for v in 0..self.entries.len() {
            if !self.entries[v].masked() {
                self.route(v);
            }
        }
        Ok(())
    }

    /// A read of the pending bit array.
    pub fn pba_read(&self, offset: u64, data: &mut [u8]) {
        let bytes = self.pending.to_le_bytes();
        for (i, b) in data.iter_mut().enumerate() {
            *b = usize::try_from(offset)
                .ok()
                .and_then(|o| bytes.get(o.checked_add(i)?))
                .copied()
                .unwrap_or(0);
        }
    }
}

/// An MSI-X table as a snapshot keeps it: each entry as its four
/// 32-bit words (address low, address high, data, vector control).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MsixState {
    pub entries: Vec<[u32; 4]>,
    pub pending: u64,
    pub enabled: bool,
    pub function_masked: bool,
}

/// What a device thread raises interrupts through: the queues' vectors as
/// the driver set them at activation, the config vector and the ISR.
#[derive(Clone)]
pub struct Interrupt {
    msix: Arc<Mutex<Msix>>,
    queue_vectors: Arc<Vec<u16>>,
    config_vector: u16,
    isr: Arc<AtomicU8>,
    signals: Option<Arc<Signals>>,
}

impl Interrupt {
    pub fn new(
        msix: Arc<Mutex<Msix>>,
        queue_vectors: Vec<u16>,
        config_vector: u16,
        isr: Arc<AtomicU8>,
    ) -> Self {
        Self {
            msix,
            queue_vectors: Arc::new(queue_vectors),
            config_vector,
            isr,
            signals: None,
        }
    }

    /// The same, recording each queue interrupt's used index in `signals`.
    pub fn with_signals(mut self, signals: Arc<Signals>) -> Self {
        self.signals = Some(signals);
        self
    }

    /// The driver has used buffers to look at on queue `q`.
    pub fn queue(&self, q: usize) {
        if let Some(s) = &self.signals {
            s.record(q);
        }
        self.isr.fetch_or(ISR_QUEUE, Ordering::SeqCst);
        let v = self.queue_vectors.get(q).copied().unwrap_or(NO_VECTOR);
        lock(&self.msix).trigger(v);
    }

    /// The irqfd behind queue `q`'s vector, for a backend that raises the
    /// interrupt itself (see [`Msix::direct_irqfd`]).
    pub fn queue_irqfd(&self, q: usize) -> Option<EventFd> {
        let v = self.queue_vectors.get(q).copied().unwrap_or(NO_VECTOR);
        lock(&self.msix).direct_irqfd(v)
    }

    /// The device config (or the device status) changed.
    pub fn config(&self) {
        self.isr.fetch_or(ISR_CONFIG, Ordering::SeqCst);
        lock(&self.msix).trigger(self.config_vector);
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// Records routes; ioeventfds always succeed.
    #[derive(Default)]
    pub struct FakeHv {
        pub routes: Mutex<Vec<(u32, u64, u32)>>,
        pub ioevents: Mutex<Vec<u64>>,
    }

    impl Hypervisor for FakeHv {
        fn set_msi_route(&self, gsi: u32, addr: u64, data: u32) -> std::io::Result<()> {
            lock(&self.routes).push((gsi, addr, data));
            Ok(())
        }
        fn register_ioevent(&self, _fd: &EventFd, addr: u64) -> std::io::Result<()> {
            lock(&self.ioevents).push(addr);
            Ok(())
        }
        fn unregister_ioevent(&self, _fd: &EventFd, addr: u64) -> std::io::Result<()> {
            lock(&self.ioevents).retain(|a| *a != addr);
            Ok(())
        }
        fn release_vector(&self, v: &Vector) -> std::io::Result<()> {
            lock(&self.routes).retain(|r| r.0 != v.gsi);
            Ok(())
        }
    }

    pub fn vectors(n: usize) -> Vec<Vector> {
        (0..n)
            .map(|i| Vector {
                gsi: 24 + i as u32,
                irqfd: EventFd::new(libc::EFD_NONBLOCK).unwrap(),
            })
            .collect()
    }

    fn program(m: &mut Msix, v: u64, addr: u64, data: u32, masked: bool) {
        m.table_write(v * 16, &addr.to_le_bytes());
        m.table_write(v * 16 + 8, &data.to_le_bytes());
        m.table_write(v * 16 + 12, &u32::from(masked).to_le_bytes());
    }

    fn fired(m: &Msix, v: usize) -> bool {
        m.vectors[v].irqfd.read().is_ok()
    }

    #[test]
    fn unmasked_vector_fires_with_its_route() {
        let hv = Arc::new(FakeHv::default());
        let mut m = Msix::new(vectors(2), hv.clone());
        m.set_control(true, false);
        program(&mut m, 1, 0xfee0_0000, 0x4041, false);
        m.trigger(1);
        assert!(fired(&m, 1));
        assert!(!fired(&m, 0));
        assert_eq!(*lock(&hv.routes), vec![(25, 0xfee0_0000, 0x4041)]);
        // Same message again: no new route.
        m.trigger(1);
        assert_eq!(lock(&hv.routes).len(), 1);
    }

    #[test]
    fn vector_info_counts_what_was_sent_and_how_it_stands() {
        let hv = Arc::new(FakeHv::default());
        let mut m = Msix::new(vectors(2), hv);
        m.set_control(true, false);
        program(&mut m, 1, 0xfee0_0000, 0x41, false);
        m.trigger(1);
        m.trigger(1);
        let v = m.vector_info(1).unwrap();
        assert_eq!(
            (v.fired, v.masked, v.pending, v.routed),
            (2, false, false, true)
        );
        // Masked, then a new message: held back, and not routed as written.
        m.table_write(16 + 12, &1u32.to_le_bytes());
        program(&mut m, 1, 0xfee0_1000, 0x42, true);
        m.trigger(1);
        let v = m.vector_info(1).unwrap();
        assert_eq!(
            (v.fired, v.masked, v.pending, v.routed),
            (2, true, true, false)
        );
        assert_eq!(m.vector_info(0).map(|v| v.fired), Some(0));
        assert_eq!(m.vector_info(NO_VECTOR), None);
    }

    #[test]
    fn masked_vector_is_pending_until_unmasked() {
        let hv = Arc::new(FakeHv::default());
        let mut m = Msix::new(vectors(1), hv);
        m.set_control(true, false);
        program(&mut m, 0, 0xfee0_0000, 0x30, true);
        m.trigger(0);
        assert!(!fired(&m, 0));
        let mut pba = [0u8; 8];
        m.pba_read(0, &mut pba);
        assert_eq!(pba[0], 1);
        m.table_write(12, &0u32.to_le_bytes());
        assert!(fired(&m, 0));
        m.pba_read(0, &mut pba);
        assert_eq!(pba[0], 0);
    }

    #[test]
    fn function_mask_and_disable() {
        let hv = Arc::new(FakeHv::default());
        let mut m = Msix::new(vectors(1), hv);
        program(&mut m, 0, 0xfee0_0000, 0x30, false);
        m.trigger(0);
        assert!(!fired(&m, 0), "MSI-X disabled: no INTx either");
        m.set_control(true, true);
        m.trigger(0);
        assert!(!fired(&m, 0));
        m.set_control(true, false);
        assert!(fired(&m, 0));
    }

    #[test]
    fn hostile_table_accesses_are_ignored() {
        let hv = Arc::new(FakeHv::default());
        let mut m = Msix::new(vectors(2), hv);
        m.table_write(2 * 16, &[1, 2, 3, 4]); // past the table
        m.table_write(3, &[1, 2, 3, 4]); // unaligned
        m.table_write(12, &[1, 2, 3, 4, 5, 6, 7, 8]); // crosses entries
        m.table_write(0, &[1]); // byte write
        m.trigger(9);
        m.trigger(NO_VECTOR);
        let mut d = [0xaau8; 8];
        m.table_read(u64::MAX - 3, &mut d);
        assert_eq!(d, [0; 8]);
        m.table_read(12, &mut d);
        assert_eq!(d, [0; 8], "crossing read");
        let mut c = [0u8; 4];
        m.table_read(12, &mut c);
        assert_eq!(c, [1, 0, 0, 0], "entries start masked");
        m.pba_read(u64::MAX, &mut d);
    }

    #[test]
    fn released_vectors_signal_nothing() {
        let hv = Arc::new(FakeHv::default());
        let mut m = Msix::new(vectors(2), hv.clone());
        m.set_control(true, false);
        program(&mut m, 1, 0xfee0_0000, 0x41, false);
        m.trigger(1);
        assert_eq!(lock(&hv.routes).len(), 1);
        m.release();
        assert!(lock(&hv.routes).is_empty(), "routes given back");
        // A guest that keeps poking the table of an unplugged device.
        m.set_control(true, false);
        program(&mut m, 0, 0xfee0_0000, 0x42, false);
        m.trigger(0);
        m.trigger(1);
        assert!(m.direct_irqfd(0).is_none());
        assert!(lock(&hv.routes).is_empty());
    }
}
