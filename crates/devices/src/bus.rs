//! The port I/O bus: port ranges mapped to devices.

use std::sync::{Arc, Mutex};

use crate::GuestEvent;

/// A device on the port I/O bus. `offset` is relative to the range's base.
pub trait PioDevice: Send {
    fn read(&mut self, offset: u16, data: &mut [u8]);
    fn write(&mut self, offset: u16, data: &[u8]) -> Option<GuestEvent>;
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("port range {base:#x}+{len} overlaps another device")]
pub struct Overlap {
    pub base: u16,
    pub len: u16,
}

type Entry = (u16, u16, Arc<Mutex<dyn PioDevice>>);

#[derive(Default, Clone)]
pub struct PioBus {
    ranges: Vec<Entry>,
}

impl PioBus {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn insert(
        &mut self,
        base: u16,
        len: u16,
        dev: Arc<Mutex<dyn PioDevice>>,
    ) -> Result<(), Overlap> {
        let end = u32::from(base) + u32::from(len);
        if len == 0
            || end > 0x1_0000
            || self.ranges.iter().any(|(b, l, _)| {
                u32::from(base) < u32::from(*b) + u32::from(*l) && u32::from(*b) < end
            })
        {
            return Err(Overlap { base, len });
        }
        self.ranges.push((base, len, dev));
        Ok(())
    }

    fn find(&self, port: u16) -> Option<(u16, &Arc<Mutex<dyn PioDevice>>)> {
        self.ranges
            .iter()
            .find(|(b, l, _)| port >= *b && u32::from(port) < u32::from(*b) + u32::from(*l))
            .map(|(b, _, d)| (port - b, d))
    }

    /// Reads from `port`; ports without a device read as all ones.
    pub fn read(&self, port: u16, data: &mut [u8]) {
        match self.find(port) {
            Some((off, dev)) => lock(dev).read(off, data),
            None => data.fill(0xff),
        }
    }

    /// Writes to `port`; writes to ports without a device are dropped.
    pub fn write(&self, port: u16, data: &[u8]) -> Option<GuestEvent> {
        let (off, dev) = self.find(port)?;
        lock(dev).write(off, data)
    }
}

/// Locks a device, recovering it if a thread panicked while holding it: a
/// device's state is a few registers, always consistent between accesses.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Reg(u8);
    impl PioDevice for Reg {
        fn read(&mut self, offset: u16, data: &mut [u8]) {
            data.fill(self.0 + offset as u8);
        }
        fn write(&mut self, _offset: u16, data: &[u8]) -> Option<GuestEvent> {
            self.0 = data[0];
            (data[0] == 0xfe).then_some(GuestEvent::Reset)
        }
    }

    #[test]
    fn routes_by_range_and_offset() {
        let mut bus = PioBus::new();
        bus.insert(0x10, 4, Arc::new(Mutex::new(Reg(0x40))))
            .unwrap();
        let mut b = [0u8; 1];
        bus.read(0x12, &mut b);
        assert_eq!(b, [0x42]);
        bus.read(0x14, &mut b);
        assert_eq!(b, [0xff]);
        assert_eq!(bus.write(0x10, &[7]), None);
        bus.read(0x10, &mut b);
        assert_eq!(b, [7]);
        assert_eq!(bus.write(0x13, &[0xfe]), Some(GuestEvent::Reset));
        assert_eq!(bus.write(0x20, &[0xfe]), None);
    }

    #[test]
    fn rejects_overlaps_and_bad_ranges() {
        let mut bus = PioBus::new();
        bus.insert(0x10, 4, Arc::new(Mutex::new(Reg(0)))).unwrap();
        assert!(bus.insert(0x13, 1, Arc::new(Mutex::new(Reg(0)))).is_err());
        assert!(bus.insert(0x0e, 3, Arc::new(Mutex::new(Reg(0)))).is_err());
        assert!(bus.insert(0xffff, 2, Arc::new(Mutex::new(Reg(0)))).is_err());
        assert!(bus.insert(0x20, 0, Arc::new(Mutex::new(Reg(0)))).is_err());
        bus.insert(0x14, 1, Arc::new(Mutex::new(Reg(0)))).unwrap();
        bus.insert(0xffff, 1, Arc::new(Mutex::new(Reg(0)))).unwrap();
    }
}
