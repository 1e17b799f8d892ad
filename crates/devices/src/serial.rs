//! COM1: vm-superio's 16550 state machine on the port bus, with its interrupt
//! raised through an eventfd, and guest input queued from the host.

use std::io::Write;

use vm_superio::{serial::NoEvents, Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use crate::{GuestEvent, PioDevice};

pub const COM1_BASE: u16 = 0x3f8;
pub const COM1_IRQ: u32 = 4;

/// Raises an interrupt by writing an eventfd (wired to a KVM irqfd).
pub struct EventFdTrigger(pub EventFd);

impl Trigger for EventFdTrigger {
    type E = std::io::Error;

    fn trigger(&self) -> std::io::Result<()> {
        self.0.write(1)
    }
}

pub type Output = Box<dyn Write + Send>;

pub struct SerialDevice {
    uart: Serial<EventFdTrigger, NoEvents, Output>,
}

impl SerialDevice {
    pub fn new(irq: EventFd, out: Output) -> Self {
        Self {
            uart: Serial::new(EventFdTrigger(irq), out),
        }
    }

    /// Queues host input for the guest; returns how many bytes fit in the
    /// receive FIFO (the caller retries the rest).
    pub fn enqueue_input(&mut self, bytes: &[u8]) -> usize {
        let n = bytes.len().min(self.uart.fifo_capacity());
        if n == 0 {
            return 0;
        }
        self.uart.enqueue_raw_bytes(&bytes[..n]).unwrap_or(0)
    }

    pub fn flush(&mut self) {
        let _ = self.uart.writer_mut().flush();
    }
}

/// The UART's registers and receive FIFO in a snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SerialState {
    pub baud_divisor_low: u8,
    pub baud_divisor_high: u8,
    pub interrupt_enable: u8,
    pub interrupt_identification: u8,
    pub line_control: u8,
    pub line_status: u8,
    pub modem_control: u8,
    pub modem_status: u8,
    pub scratch: u8,
    /// Bytes the guest has not read yet (at most the FIFO's 64).
    pub in_buffer: Vec<u8>,
}

impl SerialDevice {
    pub fn state(&self) -> SerialState {
        let s = self.uart.state();
        SerialState {
            baud_divisor_low: s.baud_divisor_low,
            baud_divisor_high: s.baud_divisor_high,
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            in_buffer: s.in_buffer,
        }
    }

    /// A UART in the saved state `s`; refused if its FIFO holds too much.
    pub fn from_state(s: &SerialState, irq: EventFd, out: Output) -> Result<Self, String> {
        let state = vm_superio::serial::SerialState {
            baud_divisor_low: s.baud_divisor_low,
            baud_divisor_high: s.baud_divisor_high,
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            in_buffer: s.in_buffer.clone(),
        };
        Serial::from_state(&state, EventFdTrigger(irq), NoEvents, out)
            .map(|uart| Self { uart })
            .map_err(|e| format!("serial: {e:?}"))
    }
}

impl PioDevice for SerialDevice {
    fn read(&mut self, offset: u16, data: &mut [u8]) {
        data.fill(0);
        if offset < 8 {
            data[0] = self.uart.read(offset as u8);
        }
    }

    fn write(&mut self, offset: u16, data: &[u8]) -> Option<GuestEvent> {
        if offset < 8 {
            // A failed console write or interrupt is not the guest's fault
            // and must not stop it; the byte is dropped.
            let _ = self.uart.write(offset as u8, data[0]);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn transmits_and_receives() {
        let sink = Sink::default();
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let mut s = SerialDevice::new(irq.try_clone().unwrap(), Box::new(sink.clone()));
        for b in b"hi\n" {
            s.write(0, &[*b]);
        }
        assert_eq!(&*sink.0.lock().unwrap(), b"hi\n");
        // Enable the receive-data interrupt, then queue input.
        s.write(1, &[1]);
        assert_eq!(s.enqueue_input(b"ls"), 2);
        assert!(irq.read().unwrap() >= 1);
        let mut b = [0u8];
        s.read(0, &mut b);
        assert_eq!(b[0], b'l');
    }

    #[test]
    fn input_beyond_the_fifo_is_left_for_later() {
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let mut s = SerialDevice::new(irq, Box::new(std::io::sink()));
        let big = vec![b'x'; 1000];
        let n = s.enqueue_input(&big);
        assert!(n > 0 && n < 1000);
        assert_eq!(s.enqueue_input(&big), 0);
    }
}
