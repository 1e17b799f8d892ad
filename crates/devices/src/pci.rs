//! PCI configuration mechanism #1 (ports 0xcf8 address, 0xcfc..0xcff data)
//! with one device: the host bridge at 00:00.0. Every other slot reads as
//! absent (all ones), so the guest finds a PCI bus and an empty slot map;
//! virtio devices will be added here as further functions.

use crate::platform::ResetControl;
use crate::{GuestEvent, PioDevice};

pub const PCI_CONFIG_BASE: u16 = 0xcf8;
pub const PCI_CONFIG_LEN: u16 = 8;

/// Red Hat's vendor id and the "QEMU PCIe host bridge" device id are the
/// conventional values for a paravirtual host bridge; Linux binds nothing to it.
const VENDOR: u16 = 0x1b36;
const DEVICE: u16 = 0x0008;
const CLASS_HOST_BRIDGE: u32 = 0x0600_0000;

/// The config ports, and the reset control register that shares them: a
/// byte access to 0xcf9 is the reset register, as on PC chipsets.
pub struct PciConfigIo {
    address: u32,
    reset: ResetControl,
}

impl PciConfigIo {
    pub fn new() -> Self {
        Self {
            address: 0,
            reset: ResetControl::new(),
        }
    }

    /// The 32-bit config register at `reg` (dword-aligned offset) of
    /// bus/device/function, or all ones if there is no such function.
    fn config_dword(bus: u8, dev: u8, func: u8, reg: u8) -> u32 {
        if (bus, dev, func) != (0, 0, 0) {
            return 0xffff_ffff;
        }
        match reg {
            0x00 => u32::from(DEVICE) << 16 | u32::from(VENDOR),
            0x04 => 0x0000_0000,           // status, command
            0x08 => CLASS_HOST_BRIDGE | 1, // class, revision 1
            0x0c => 0x0000_0000,           // header type 0, single function
            0x2c => u32::from(VENDOR) << 16 | u32::from(VENDOR), // subsystem
            _ => 0,
        }
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

impl Default for PciConfigIo {
    fn default() -> Self {
        Self::new()
    }
}

impl PioDevice for PciConfigIo {
    fn read(&mut self, offset: u16, data: &mut [u8]) {
        if offset == 1 && data.len() == 1 {
            return self.reset.read(0, data);
        }
        match offset {
            0..=3 => copy_out(self.address, usize::from(offset), data),
            4..=7 => {
                let a = self.address;
                if a & 0x8000_0000 == 0 {
                    data.fill(0xff);
                    return;
                }
                let (bus, dev, func) = (
                    (a >> 16) as u8,
                    ((a >> 11) & 0x1f) as u8,
                    ((a >> 8) & 7) as u8,
                );
                let v = Self::config_dword(bus, dev, func, (a & 0xfc) as u8);
                copy_out(v, usize::from(offset - 4), data);
            }
            _ => data.fill(0xff),
        }
    }

    fn write(&mut self, offset: u16, data: &[u8]) -> Option<GuestEvent> {
        if offset == 1 && data.len() == 1 {
            return self.reset.write(0, data);
        }
        // Only full writes of the address register matter; the host bridge
        // has no writable registers yet.
        if offset == 0 && data.len() == 4 {
            let mut b = [0u8; 4];
            b.copy_from_slice(data);
            self.address = u32::from_le_bytes(b) & 0x80ff_fffc;
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
        let mut p = PciConfigIo::new();
        p.write(0, &0x8000_0000u32.to_le_bytes());
        let mut d = [0u8; 4];
        p.read(0, &mut d);
        assert_eq!(u32::from_le_bytes(d), 0x8000_0000);
    }

    #[test]
    fn host_bridge_at_00_00_0_and_nothing_else() {
        let mut p = PciConfigIo::new();
        assert_eq!(cfg_read(&mut p, 0, 0, 0, 0), 0x0008_1b36);
        assert_eq!(cfg_read(&mut p, 0, 0, 0, 8) >> 8, 0x060000);
        assert_eq!(cfg_read(&mut p, 0, 1, 0, 0), 0xffff_ffff);
        assert_eq!(cfg_read(&mut p, 0, 0, 1, 0), 0xffff_ffff);
        assert_eq!(cfg_read(&mut p, 1, 0, 0, 0), 0xffff_ffff);
    }

    #[test]
    fn byte_and_word_reads_of_data_port() {
        let mut p = PciConfigIo::new();
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
        let mut p = PciConfigIo::new();
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
        let mut p = PciConfigIo::new();
        p.write(0, &0u32.to_le_bytes());
        let mut d = [0u8; 4];
        p.read(4, &mut d);
        assert_eq!(d, [0xff; 4]);
        // Short or odd writes never panic.
        p.write(2, &[1]);
        p.write(0, &[1, 2]);
        p.read(9, &mut d);
    }
}
