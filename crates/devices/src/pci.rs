//! PCI: configuration mechanism #1 (ports 0xcf8 address, 0xcfc..0xcff
//! data), bus 0 with the host bridge at 00:00.0 and up to 31 device slots,
//! and the routing of MMIO accesses to the devices' memory BARs.
//!
//! Devices implement [`PciDevice`]; [`ConfigSpace`] gives them the standard
//! type-0 header with BAR sizing, so a device only adds its capabilities.

use std::sync::{Arc, Mutex, RwLock};

use crate::bus::lock;
use crate::platform::ResetControl;
use crate::{GuestEvent, PioDevice};

pub const PCI_CONFIG_BASE: u16 = 0xcf8;
pub const PCI_CONFIG_LEN: u16 = 8;

/// Red Hat's vendor id and the "QEMU PCIe host bridge" device id are the
/// conventional values for a paravirtual host bridge; Linux binds nothing to it.
const VENDOR: u16 = 0x1b36;
const DEVICE: u16 = 0x0008;
const CLASS_HOST_BRIDGE: u32 = 0x0600_0000;

/// Slots on bus 0 (slot 0 is the host bridge).
pub const SLOTS: usize = 32;
/// Config space size of a conventional PCI function.
pub const CONFIG_SIZE: usize = 256;

/// A PCI function on bus 0. Offsets are byte offsets into config space
/// (`reg` is dword-aligned) or into a BAR.
pub trait PciDevice: Send {
    /// The dword at `reg`.
    fn config_read(&mut self, reg: usize) -> u32;
    /// Writes `data` at `reg + offset` (an access never crosses the dword).
    fn config_write(&mut self, reg: usize, offset: usize, data: &[u8]);
    /// The memory BARs as (index, guest address, size), for MMIO routing.
    fn bars(&self) -> Vec<(usize, u64, u64)>;
    fn bar_read(&mut self, bar: usize, offset: u64, data: &mut [u8]);
    fn bar_write(&mut self, bar: usize, offset: u64, data: &[u8]);
    /// The function leaves the bus (hot-unplug): stop its work and let go
    /// of what it holds.
    fn unplug(&mut self) {}
}

type SharedDevice = Arc<Mutex<dyn PciDevice>>;

/// A 32-bit, non-prefetchable memory BAR of a power-of-two size.
#[derive(Clone, Copy, Debug, Default)]
struct Bar {
    addr: u32,
    size: u32,
}

/// Identity of a type-0 function.
#[derive(Clone, Copy, Debug)]
pub struct PciId {
    pub vendor: u16,
    pub device: u16,
    pub class: u32,
    pub revision: u8,
    pub subsystem_vendor: u16,
    pub subsystem: u16,
}

const REG_COMMAND: usize = 0x04;
const REG_BAR0: usize = 0x10;
const REG_CAP_PTR: usize = 0x34;
const STATUS_CAP_LIST: u32 = 1 << 20;
/// Command bits a guest may set: I/O, memory, bus master, INTx disable.
const COMMAND_WRITABLE: u32 = 0x0407;
/// Where the first capability goes.
pub const FIRST_CAP: usize = 0x40;

/// The config space of a type-0 function: a fixed header, BARs that answer
/// the sizing protocol, and a capability list. Bytes a device marks writable
/// (`set_writable`) take guest writes; all others are read-only.
pub struct ConfigSpace {
    bytes: [u8; CONFIG_SIZE],
    writable: [u8; CONFIG_SIZE],
    bars: [Option<Bar>; 6],
    next_cap: usize,
    last_cap_next: Option<usize>,
}

impl ConfigSpace {
    pub fn new(id: PciId) -> Self {
        let mut c = Self {
            bytes: [0; CONFIG_SIZE],
            writable: [0; CONFIG_SIZE],
            bars: [None; 6],
            next_cap: FIRST_CAP,
            last_cap_next: None,
        };
        c.put(0x00, &id.vendor.to_le_bytes());
        c.put(0x02, &id.device.to_le_bytes());
        c.put(0x08, &(id.class | u32::from(id.revision)).to_le_bytes());
        c.put(0x2c, &id.subsystem_vendor.to_le_bytes());
        c.put(0x2e, &id.subsystem.to_le_bytes());
        c.writable[0x3c] = 0xff; // interrupt line: scratch for the OS
        c
    }

    fn put(&mut self, at: usize, b: &[u8]) {
        self.bytes[at..at + b.len()].copy_from_slice(b);
    }

    /// Declares memory BAR `index` at `addr` with `size` bytes (a power of
    /// two of at least 16, `addr` aligned to it).
    pub fn add_bar(&mut self, index: usize, addr: u32, size: u32) {
        assert!(index < 6 && size.is_power_of_two() && size >= 16 && addr.is_multiple_of(size));
        self.bars[index] = Some(Bar { addr, size });
    }

    /// Appends a capability with id `id` and `body` (the bytes after the id
    /// and next pointer); returns its offset. `writable` lists (offset within
    /// the capability, bit mask) of the bits the guest may change.
    pub fn add_capability(&mut self, id: u8, body: &[u8], writable: &[(usize, u8)]) -> usize {
        let at = self.next_cap;
        let len = (2 + body.len() + 3) & !3;
        assert!(at + len <= CONFIG_SIZE, "config space full");
        self.bytes[at] = id;
        self.put(at + 2, body);
        for (off, mask) in writable {
            self.writable[at + off] = *mask;
        }
        match self.last_cap_next {
            None => {
                self.bytes[REG_CAP_PTR] = at as u8;
                let st = self.dword(REG_COMMAND) | STATUS_CAP_LIST;
                self.put(REG_COMMAND, &st.to_le_bytes());
            }
            Some(p) => self.bytes[p] = at as u8,
        }
        self.last_cap_next = Some(at + 1);
        self.next_cap = at + len;
        at
    }

    fn dword(&self, reg: usize) -> u32 {
        let mut b = [0u8; 4];
        b.copy_from_slice(&self.bytes[reg..reg + 4]);
        u32::from_le_bytes(b)
    }

    /// The raw bytes at `at..at + len` (for a device's own registers).
    pub fn get(&self, at: usize, len: usize) -> &[u8] {
        &self.bytes[at..at + len]
    }

    /// Sets bytes the device itself owns (for example a capability's state).
    pub fn set(&mut self, at: usize, b: &[u8]) {
        self.put(at, b);
    }

    pub fn read(&self, reg: usize) -> u32 {
        if reg >= CONFIG_SIZE {
            return 0xffff_ffff;
        }
        if (REG_BAR0..REG_BAR0 + 24).contains(&reg) {
            return match self.bars[(reg - REG_BAR0) / 4] {
                Some(b) => b.addr, // 32-bit memory, non-prefetchable: flag bits 0
                None => 0,
            };
        }
        self.dword(reg)
    }

    /// A guest write; returns true if it moved a BAR.
    pub fn write(&mut self, reg: usize, offset: usize, data: &[u8]) -> bool {
        if reg >= CONFIG_SIZE || offset + data.len() > 4 {
            return false;
        }
        if (REG_BAR0..REG_BAR0 + 24).contains(&reg) {
            let Some(bar) = self.bars[(reg - REG_BAR0) / 4].as_mut() else {
                return false;
            };
            let mut v = bar.addr.to_le_bytes();
            v[offset..offset + data.len()].copy_from_slice(data);
            // Sizing: writing all ones reads back the size mask.
            let new = u32::from_le_bytes(v) & !(bar.size - 1);
            let moved = new != bar.addr;
            bar.addr = new;
            return moved;
        }
        if reg == REG_COMMAND {
            let mut v = self.dword(reg).to_le_bytes();
            v[offset..offset + data.len()].copy_from_slice(data);
            let cmd = u32::from_le_bytes(v) & COMMAND_WRITABLE;
            let keep = self.dword(reg) & !COMMAND_WRITABLE & 0xffff_0000;
            self.put(reg, &(keep | cmd).to_le_bytes());
            return false;
        }
        for (i, b) in data.iter().enumerate() {
            let at = reg + offset + i;
            let m = self.writable[at];
            self.bytes[at] = (self.bytes[at] & !m) | (b & m);
        }
        false
    }

    /// The registers as a snapshot keeps them: the 256 bytes and where the
    /// guest put each BAR.
    pub fn state(&self) -> ConfigState {
        ConfigState {
            bytes: self.bytes.to_vec(),
            bars: self.bars.iter().map(|b| b.map(|b| b.addr)).collect(),
        }
    }

    /// Puts back what [`ConfigSpace::state`] saved over a function built the
    /// same way (same BARs and capabilities); anything else is refused.
    pub fn restore(&mut self, s: &ConfigState) -> Result<(), String> {
        if s.bytes.len() != CONFIG_SIZE || s.bars.len() != self.bars.len() {
            return Err("PCI config space: wrong size".into());
        }
        let fixed = |at: usize| self.writable[at] == 0;
        // The identity must match: the same device in the same place.
        if (0..REG_COMMAND).any(|at| fixed(at) && s.bytes[at] != self.bytes[at]) {
            return Err("PCI config space: another device's identity".into());
        }
        for (bar, addr) in self.bars.iter_mut().zip(&s.bars) {
            match (bar.as_mut(), addr) {
                (Some(b), Some(a)) => b.addr = a & !(b.size - 1),
                (None, None) => {}
                _ => return Err("PCI config space: other BARs".into()),
            }
        }
        self.bytes.copy_from_slice(&s.bytes);
        Ok(())
    }

    /// Memory BARs as (index, address, size).
    pub fn bars(&self) -> Vec<(usize, u64, u64)> {
        self.bars
            .iter()
            .enumerate()
            .filter_map(|(i, b)| b.map(|b| (i, u64::from(b.addr), u64::from(b.size))))
            .collect()
    }
}

/// A function's configuration registers in a snapshot.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigState {
    /// All 256 bytes (the BAR registers' own bytes are not used).
    pub bytes: Vec<u8>,
    /// Each BAR's address, or null where the function has no such BAR.
    pub bars: Vec<Option<u32>>,
}

/// One MMIO range of a device, as the bus routes it.
#[derive(Clone)]
struct Window {
    base: u64,
    len: u64,
    dev: SharedDevice,
    bar: usize,
}

/// Bus 0: devices by slot and the MMIO windows of their BARs. Slots can be
/// filled and emptied while the guest runs (hot-plug).
pub struct PciBus {
    slots: RwLock<Vec<Option<SharedDevice>>>,
    windows: RwLock<Vec<Window>>,
}

impl Default for PciBus {
    fn default() -> Self {
        Self::new()
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BusError {
    #[error("no free PCI slot (at most {} devices)", SLOTS - 1)]
    Full,
    #[error("PCI slot {0} is taken or does not exist")]
    Taken(usize),
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

impl PciBus {
    pub fn new() -> Self {
        Self {
            slots: RwLock::new(vec![None; SLOTS]),
            windows: RwLock::new(Vec::new()),
        }
    }

    /// The next free slot, if any.
    pub fn free_slot(&self) -> Option<usize> {
        let slots = read(&self.slots);
        (1..SLOTS).find(|s| slots[*s].is_none())
    }

    /// Puts `dev` in the next free slot and returns the slot number.
    pub fn add(&self, dev: SharedDevice) -> Result<usize, BusError> {
        let slot = {
            let mut slots = write(&self.slots);
            let slot = (1..SLOTS)
                .find(|s| slots[*s].is_none())
                .ok_or(BusError::Full)?;
            slots[slot] = Some(dev);
            slot
        };
        self.refresh();
        Ok(slot)
    }

    /// Puts `dev` in `slot` (a restored domain's devices go back where
    /// they were); refused if the slot is taken or out of range.
    pub fn add_at(&self, slot: usize, dev: SharedDevice) -> Result<(), BusError> {
        {
            let mut slots = write(&self.slots);
            match slots.get_mut(slot) {
                Some(s @ None) if slot > 0 => *s = Some(dev),
                _ => return Err(BusError::Taken(slot)),
            }
        }
        self.refresh();
        Ok(())
    }

    /// Rebuilds the MMIO windows from the devices' BARs (after a restore
    /// moved them).
    pub fn refresh_windows(&self) {
        self.refresh();
    }

    /// Takes the device out of `slot` (it stops answering at once) and
    /// unplugs it; returns whether there was one.
    pub fn remove(&self, slot: usize) -> bool {
        let dev = match write(&self.slots).get_mut(slot) {
            Some(s) if slot > 0 => s.take(),
            _ => None,
        };
        self.refresh();
        match dev {
            Some(d) => {
                lock(&d).unplug();
                true
            }
            None => false,
        }
    }

    /// Whether `slot` holds a device.
    pub fn occupied(&self, slot: usize) -> bool {
        read(&self.slots).get(slot).is_some_and(Option::is_some)
    }

    fn refresh(&self) {
        let mut w = Vec::new();
        for d in read(&self.slots).iter().flatten() {
            for (bar, base, len) in lock(d).bars() {
                // A BAR the guest parked at 0 (or is sizing) decodes nothing.
                if base != 0 {
                    w.push(Window {
                        base,
                        len,
                        dev: d.clone(),
                        bar,
                    });
                }
            }
        }
        *write(&self.windows) = w;
    }

    fn device(&self, dev: u8) -> Option<SharedDevice> {
        read(&self.slots).get(usize::from(dev)).cloned().flatten()
    }

    fn config_dword(&self, bus: u8, dev: u8, func: u8, reg: usize) -> u32 {
        if bus != 0 || func != 0 {
            return 0xffff_ffff;
        }
        if dev == 0 {
            return match reg {
                0x00 => u32::from(DEVICE) << 16 | u32::from(VENDOR),
                0x08 => CLASS_HOST_BRIDGE | 1,
                0x2c => u32::from(VENDOR) << 16 | u32::from(VENDOR),
                _ => 0,
            };
        }
        match self.device(dev) {
            Some(d) => lock(&d).config_read(reg),
            None => 0xffff_ffff,
        }
    }

    fn config_write(&self, bus: u8, dev: u8, func: u8, reg: usize, offset: usize, data: &[u8]) {
        if bus != 0 || func != 0 || dev == 0 {
            return;
        }
        if let Some(d) = self.device(dev) {
            lock(&d).config_write(reg, offset, data);
            if (REG_BAR0..REG_BAR0 + 24).contains(&reg) {
                self.refresh();
            }
        }
    }

    fn find(&self, addr: u64, len: usize) -> Option<(SharedDevice, usize, u64)> {
        read(&self.windows)
            .iter()
            .find(|w| addr >= w.base && addr + len as u64 <= w.base + w.len)
            .map(|w| (w.dev.clone(), w.bar, addr - w.base))
    }

    /// An MMIO read; addresses no BAR decodes read as all ones.
    pub fn mmio_read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.find(addr, data.len()) {
            Some((d, bar, off)) => {
                lock(&d).bar_read(bar, off, data);
                true
            }
            None => {
                data.fill(0xff);
                false
            }
        }
    }

    /// An MMIO write; writes no BAR decodes are dropped.
    pub fn mmio_write(&self, addr: u64, data: &[u8]) -> bool {
        match self.find(addr, data.len()) {
            Some((d, bar, off)) => {
                lock(&d).bar_write(bar, off, data);
                true
            }
            None => false,
        }
    }
}

/// The config ports, and the reset control register that shares them: a
/// byte access to 0xcf9 is the reset register, as on PC chipsets.
pub struct PciConfigIo {
    address: u32,
    reset: ResetControl,
    bus: Arc<PciBus>,
}

impl PciConfigIo {
    pub fn new(bus: Arc<PciBus>) -> Self {
        Self {
            address: 0,
            reset: ResetControl::new(),
            bus,
        }
    }

    fn target(&self) -> Option<(u8, u8, u8, usize)> {
        let a = self.address;
        (a & 0x8000_0000 != 0).then_some((
            (a >> 16) as u8,
            ((a >> 11) & 0x1f) as u8,
            ((a >> 8) & 7) as u8,
            (a & 0xfc) as usize,
        ))
    }
}

/// Bytes `offset..` of a little-endian register into `data`; bytes past the
/// register read as ones.
fn copy_out(reg: u32, offset: usize, data: &mut [u8]) {
    let v = reg.to_le_bytes();
    for (i, b) in data.iter_mut().enumerate() {
        *b = v.get(offset + i).copied().unwrap_or(0xff);
    }
}

impl PioDevice for PciConfigIo {
    fn read(&mut self, offset: u16, data: &mut [u8]) {
        if offset == 1 && data.len() == 1 {
            return self.reset.read(0, data);
        }
        match offset {
            0..=3 => copy_out(self.address, usize::from(offset), data),
            4..=7 => match self.target() {
                Some((bus, dev, func, reg)) => {
                    let v = self.bus.config_dword(bus, dev, func, reg);
                    copy_out(v, usize::from(offset - 4), data);
                }
                None => data.fill(0xff),
            },
            _ => data.fill(0xff),
        }
    }

    fn write(&mut self, offset: u16, data: &[u8]) -> Option<GuestEvent> {
        if offset == 1 && data.len() == 1 {
            return self.reset.write(0, data);
        }
        match offset {
            // Only full writes of the address register count.
            0 if data.len() == 4 => {
                let mut b = [0u8; 4];
                b.copy_from_slice(data);
                self.address = u32::from_le_bytes(b) & 0x80ff_fffc;
            }
            4..=7 => {
                let off = usize::from(offset - 4);
                if let Some((bus, dev, func, reg)) = self.target() {
                    if off + data.len() <= 4 {
                        self.bus.config_write(bus, dev, func, reg, off, data);
                    }
                }
            }
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg_read(p: &mut PciConfigIo, bus: u32, dev: u32, func: u32, reg: u32) -> u32 {
        let addr = 0x8000_0000 | bus << 16 | dev << 11 | func << 8 | reg;
        p.write(0, &addr.to_le_bytes());
        let mut d = [0u8; 4];
        p.read(4, &mut d);
        u32::from_le_bytes(d)
    }

    #[test]
    fn type1_probe_sees_the_address_register() {
        // Linux's pci_check_type1 writes 0x80000000 and reads it back.
        let mut p = PciConfigIo::new(Arc::new(PciBus::new()));
        p.write(0, &0x8000_0000u32.to_le_bytes());
        let mut d = [0u8; 4];
        p.read(0, &mut d);
        assert_eq!(u32::from_le_bytes(d), 0x8000_0000);
    }

    #[test]
    fn host_bridge_at_00_00_0_and_nothing_else() {
        let mut p = PciConfigIo::new(Arc::new(PciBus::new()));
        assert_eq!(cfg_read(&mut p, 0, 0, 0, 0), 0x0008_1b36);
        assert_eq!(cfg_read(&mut p, 0, 0, 0, 8) >> 8, 0x060000);
        assert_eq!(cfg_read(&mut p, 0, 1, 0, 0), 0xffff_ffff);
        assert_eq!(cfg_read(&mut p, 0, 0, 1, 0), 0xffff_ffff);
        assert_eq!(cfg_read(&mut p, 1, 0, 0, 0), 0xffff_ffff);
    }

    #[test]
    fn byte_and_word_reads_of_data_port() {
        let mut p = PciConfigIo::new(Arc::new(PciBus::new()));
        p.write(0, &0x8000_0000u32.to_le_bytes());
        let mut w = [0u8; 2];
        p.read(6, &mut w);
        assert_eq!(u16::from_le_bytes(w), 0x0008);
        let mut b = [0u8; 1];
        p.read(5, &mut b);
        assert_eq!(b[0], 0x1b);
    }

    #[test]
    fn byte_access_to_0xcf9_is_the_reset_register() {
        let mut p = PciConfigIo::new(Arc::new(PciBus::new()));
        p.write(0, &0x8000_0000u32.to_le_bytes());
        assert_eq!(p.write(1, &[0x06]), Some(GuestEvent::Reset));
        assert_eq!(p.write(1, &[0x02]), None);
        let mut a = [0u8; 4];
        p.read(0, &mut a);
        assert_eq!(
            u32::from_le_bytes(a),
            0x8000_0000,
            "address register untouched"
        );
    }

    #[test]
    fn disabled_address_reads_all_ones() {
        let mut p = PciConfigIo::new(Arc::new(PciBus::new()));
        p.write(0, &0u32.to_le_bytes());
        let mut d = [0u8; 4];
        p.read(4, &mut d);
        assert_eq!(d, [0xff; 4]);
        // Short or odd writes never panic.
        p.write(2, &[1]);
        p.write(0, &[1, 2]);
        p.read(9, &mut d);
    }

    struct Dev {
        cfg: ConfigSpace,
        last: Vec<(usize, u64, Vec<u8>)>,
    }

    impl PciDevice for Dev {
        fn config_read(&mut self, reg: usize) -> u32 {
            self.cfg.read(reg)
        }
        fn config_write(&mut self, reg: usize, offset: usize, data: &[u8]) {
            self.cfg.write(reg, offset, data);
        }
        fn bars(&self) -> Vec<(usize, u64, u64)> {
            self.cfg.bars()
        }
        fn bar_read(&mut self, bar: usize, offset: u64, data: &mut [u8]) {
            data.fill(bar as u8 + offset as u8);
        }
        fn bar_write(&mut self, bar: usize, offset: u64, data: &[u8]) {
            self.last.push((bar, offset, data.to_vec()));
        }
        fn unplug(&mut self) {
            self.last.push((99, 0, Vec::new()));
        }
    }

    fn dev_bus() -> (Arc<PciBus>, Arc<Mutex<Dev>>) {
        let mut cfg = ConfigSpace::new(PciId {
            vendor: 0x1af4,
            device: 0x1042,
            class: 0x0180_0000,
            revision: 1,
            subsystem_vendor: 0x1af4,
            subsystem: 0x40,
        });
        cfg.add_bar(0, 0xc000_0000, 0x8000);
        cfg.add_capability(0x09, &[4, 1, 2], &[]);
        cfg.add_capability(0x11, &[0, 0, 9, 9], &[(2, 0xff)]);
        let d = Arc::new(Mutex::new(Dev {
            cfg,
            last: Vec::new(),
        }));
        let bus = PciBus::new();
        assert_eq!(bus.add(d.clone()).unwrap(), 1);
        (Arc::new(bus), d)
    }

    fn cfg_write(p: &mut PciConfigIo, dev: u32, reg: u32, v: u32) {
        p.write(0, &(0x8000_0000 | dev << 11 | reg).to_le_bytes());
        p.write(4, &v.to_le_bytes());
    }

    #[test]
    fn device_header_and_capability_list() {
        let (bus, _) = dev_bus();
        let mut p = PciConfigIo::new(bus);
        assert_eq!(cfg_read(&mut p, 0, 1, 0, 0), 0x1042_1af4);
        assert_ne!(cfg_read(&mut p, 0, 1, 0, 4) & STATUS_CAP_LIST, 0);
        let first = cfg_read(&mut p, 0, 1, 0, 0x34) & 0xff;
        assert_eq!(first, 0x40);
        let c0 = cfg_read(&mut p, 0, 1, 0, first);
        assert_eq!(c0 & 0xff, 0x09);
        let second = (c0 >> 8) & 0xff;
        assert_eq!(second, 0x48);
        let c1 = cfg_read(&mut p, 0, 1, 0, second);
        assert_eq!((c1 & 0xff, (c1 >> 8) & 0xff), (0x11, 0), "list ends");
        // Only the marked byte of the second capability is writable.
        cfg_write(&mut p, 1, second, 0xffff_ffff);
        assert_eq!(cfg_read(&mut p, 0, 1, 0, second), 0x00ff_0011);
        assert_eq!(cfg_read(&mut p, 0, 2, 0, 0), 0xffff_ffff);
    }

    #[test]
    fn bar_sizing_and_moving_reroute_mmio() {
        let (bus, d) = dev_bus();
        let mut p = PciConfigIo::new(bus.clone());
        assert_eq!(cfg_read(&mut p, 0, 1, 0, 0x10), 0xc000_0000);
        let mut b = [0u8; 2];
        assert!(bus.mmio_read(0xc000_0004, &mut b));
        assert_eq!(b, [4, 4]);
        // Sizing: all ones reads back the size mask and decodes nothing.
        cfg_write(&mut p, 1, 0x10, 0xffff_ffff);
        assert_eq!(cfg_read(&mut p, 0, 1, 0, 0x10), !(0x8000 - 1));
        // Restoring it elsewhere moves the window.
        cfg_write(&mut p, 1, 0x10, 0xd000_0000);
        assert!(!bus.mmio_read(0xc000_0004, &mut b));
        assert_eq!(b, [0xff, 0xff]);
        assert!(bus.mmio_write(0xd000_7ffc, &[1, 2, 3, 4]));
        assert!(
            !bus.mmio_write(0xd000_7ffe, &[1, 2, 3, 4]),
            "crosses the end"
        );
        assert_eq!(lock(&d).last, vec![(0, 0x7ffc, vec![1, 2, 3, 4])]);
        // Unused BARs read 0 and ignore writes.
        cfg_write(&mut p, 1, 0x14, 0xffff_ffff);
        assert_eq!(cfg_read(&mut p, 0, 1, 0, 0x14), 0);
    }

    #[test]
    fn command_register_keeps_only_known_bits() {
        let (bus, _) = dev_bus();
        let mut p = PciConfigIo::new(bus);
        cfg_write(&mut p, 1, 0x04, 0xffff_ffff);
        let v = cfg_read(&mut p, 0, 1, 0, 0x04);
        assert_eq!(v & 0xffff, COMMAND_WRITABLE);
        assert_ne!(v & STATUS_CAP_LIST, 0, "status untouched");
    }

    #[test]
    fn a_full_bus_says_so() {
        let bus = PciBus::new();
        for _ in 1..SLOTS {
            bus.add(Arc::new(Mutex::new(Dev {
                cfg: ConfigSpace::new(PciId {
                    vendor: 1,
                    device: 1,
                    class: 0,
                    revision: 0,
                    subsystem_vendor: 0,
                    subsystem: 0,
                }),
                last: Vec::new(),
            })))
            .unwrap();
        }
        assert!(bus
            .add(Arc::new(Mutex::new(Dev {
                cfg: ConfigSpace::new(PciId {
                    vendor: 1,
                    device: 1,
                    class: 0,
                    revision: 0,
                    subsystem_vendor: 0,
                    subsystem: 0,
                }),
                last: Vec::new(),
            })))
            .is_err());
    }

    #[test]
    fn a_removed_device_is_unplugged_and_answers_nothing() {
        let (bus, d) = dev_bus();
        let mut p = PciConfigIo::new(bus.clone());
        assert!(bus.occupied(1));
        assert!(!bus.remove(0), "the host bridge stays");
        assert!(!bus.remove(2), "an empty slot");
        assert!(!bus.remove(SLOTS + 5), "no such slot");
        assert!(bus.remove(1));
        assert_eq!(lock(&d).last, vec![(99, 0, Vec::new())], "unplug ran");
        assert!(!bus.occupied(1));
        assert_eq!(cfg_read(&mut p, 0, 1, 0, 0), 0xffff_ffff);
        let mut b = [0u8; 2];
        assert!(!bus.mmio_read(0xc000_0004, &mut b));
        assert_eq!(bus.free_slot(), Some(1), "the slot is free again");
    }
}
