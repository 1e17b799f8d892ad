//! vCPU set-up for Linux's 64-bit boot protocol, and the exit loop that
//! routes port I/O to the platform devices.

use std::sync::mpsc::Sender;
use std::sync::Arc;

use domus_boot::layout::{BOOT_STACK, ZERO_PAGE_ADDR};
use domus_boot::longmode::{self, LongModeSegments, Segment};
use domus_devices::pci::PciBus;
use domus_devices::{GuestEvent, PioBus};
use kvm_bindings::{kvm_fpu, kvm_lapic_state, kvm_msr_entry, kvm_regs, kvm_segment, CpuId, Msrs};
use kvm_ioctls::{VcpuExit, VcpuFd};

use crate::pause::Pause;
use crate::{kvm_err, Result};

/// Why a vCPU stopped the domain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stop {
    Guest(GuestEvent),
    /// KVM could not run the guest (internal error, failed entry, ...).
    Fault(String),
    /// The user pressed `Ctrl-A x` on the console.
    Quit,
    /// The guest was migrated live and runs on the destination now.
    Migrated,
}

fn kvm_seg(s: &Segment) -> kvm_segment {
    kvm_segment {
        base: s.base,
        limit: s.limit,
        selector: s.selector,
        type_: s.type_,
        present: s.present,
        dpl: s.dpl,
        db: s.db,
        s: s.s,
        l: s.l,
        g: s.g,
        ..Default::default()
    }
}

const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
const MISC_ENABLE_FAST_STRING: u64 = 1;
const APIC_LVT0: usize = 0x350;
const APIC_LVT1: usize = 0x360;
const APIC_MODE_NMI: u32 = 4;
const APIC_MODE_EXTINT: u32 = 7;

fn set_lvt(lapic: &mut kvm_lapic_state, reg: usize, mode: u32) {
    let mut b = [0u8; 4];
    for (i, x) in b.iter_mut().enumerate() {
        *x = lapic.regs[reg + i] as u8;
    }
    let v = (u32::from_le_bytes(b) & !0x700) | (mode << 8);
    for (i, x) in v.to_le_bytes().iter().enumerate() {
        lapic.regs[reg + i] = *x as _;
    }
}

/// State every vCPU needs: CPUID, MSRs, local APIC LINT pins.
pub fn setup_common(vcpu: &VcpuFd, cpuid: &CpuId) -> Result<()> {
    vcpu.set_cpuid2(cpuid).map_err(kvm_err("KVM_SET_CPUID2"))?;
    let msrs = Msrs::from_entries(&[kvm_msr_entry {
        index: MSR_IA32_MISC_ENABLE,
        data: MISC_ENABLE_FAST_STRING,
        ..Default::default()
    }])
    .map_err(|_| crate::Error::Io("building MSR list", std::io::Error::other("fam")))?;
    vcpu.set_msrs(&msrs).map_err(kvm_err("KVM_SET_MSRS"))?;
    let mut lapic = vcpu.get_lapic().map_err(kvm_err("KVM_GET_LAPIC"))?;
    set_lvt(&mut lapic, APIC_LVT0, APIC_MODE_EXTINT);
    set_lvt(&mut lapic, APIC_LVT1, APIC_MODE_NMI);
    vcpu.set_lapic(&lapic).map_err(kvm_err("KVM_SET_LAPIC"))?;
    Ok(())
}

/// Puts a vCPU in 64-bit mode at `entry` with `rsi` = `rsi` (the boot vCPU;
/// the others wait for the guest's INIT/SIPI in the in-kernel APIC).
pub fn setup_long_mode(vcpu: &VcpuFd, seg: &LongModeSegments, entry: u64, rsi: u64) -> Result<()> {
    let mut sregs = vcpu.get_sregs().map_err(kvm_err("KVM_GET_SREGS"))?;
    sregs.cs = kvm_seg(&seg.code);
    let data = kvm_seg(&seg.data);
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = kvm_seg(&seg.tss);
    sregs.gdt.base = seg.gdt_base;
    sregs.gdt.limit = seg.gdt_limit;
    sregs.idt.base = seg.idt_base;
    sregs.idt.limit = seg.idt_limit;
    sregs.cr0 |= longmode::CR0_PE | longmode::CR0_ET | longmode::CR0_PG;
    sregs.cr3 = seg.cr3;
    sregs.cr4 |= longmode::CR4_PAE;
    sregs.efer |= longmode::EFER_LME | longmode::EFER_LMA;
    vcpu.set_sregs(&sregs).map_err(kvm_err("KVM_SET_SREGS"))?;
    let regs = kvm_regs {
        rflags: 2,
        rip: entry,
        rsp: BOOT_STACK,
        rbp: BOOT_STACK,
        rsi,
        ..Default::default()
    };
    vcpu.set_regs(&regs).map_err(kvm_err("KVM_SET_REGS"))?;
    let fpu = kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    };
    vcpu.set_fpu(&fpu).map_err(kvm_err("KVM_SET_FPU"))?;
    Ok(())
}

/// The boot vCPU's entry registers for Linux.
pub fn setup_boot_vcpu(vcpu: &VcpuFd, seg: &LongModeSegments, entry: u64) -> Result<()> {
    setup_long_mode(vcpu, seg, entry, ZERO_PAGE_ADDR)
}

/// Where a vCPU's port and memory-mapped I/O goes.
#[derive(Clone)]
pub struct Buses {
    pub pio: PioBus,
    pub pci: Arc<PciBus>,
}

/// Handles one exit; returns `Some` when the domain must stop.
pub fn handle_exit(exit: VcpuExit<'_>, bus: &Buses) -> Option<Stop> {
    match exit {
        VcpuExit::IoIn(port, data) => {
            bus.pio.read(port, data);
            None
        }
        VcpuExit::IoOut(port, data) => bus.pio.write(port, data).map(Stop::Guest),
        VcpuExit::MmioRead(addr, data) => {
            bus.pci.mmio_read(addr, data);
            None
        }
        VcpuExit::MmioWrite(addr, data) => {
            bus.pci.mmio_write(addr, data);
            None
        }
        VcpuExit::Intr | VcpuExit::IrqWindowOpen => None,
        // A triple fault: Linux's last way to reboot, and also how a guest
        // that has wrecked its own state ends; the log says it was one.
        VcpuExit::Shutdown => {
            eprintln!("domus: a vCPU triple-faulted (KVM_EXIT_SHUTDOWN); the guest resets");
            Some(Stop::Guest(GuestEvent::Reset))
        }
        VcpuExit::SystemEvent(kind, _) => Some(match kind {
            kvm_bindings::KVM_SYSTEM_EVENT_SHUTDOWN => Stop::Guest(GuestEvent::PowerOff),
            kvm_bindings::KVM_SYSTEM_EVENT_RESET => Stop::Guest(GuestEvent::Reset),
            _ => Stop::Guest(GuestEvent::Panic),
        }),
        VcpuExit::InternalError => {
            Some(Stop::Fault("KVM internal error (emulation failure)".into()))
        }
        VcpuExit::FailEntry(reason, cpu) => Some(Stop::Fault(format!(
            "KVM could not enter the guest on CPU {cpu} (hardware reason {reason:#x})"
        ))),
        other => Some(Stop::Fault(format!("unexpected vCPU exit {other:?}"))),
    }
}

/// Runs a vCPU until it or the guest stops the domain; reports to `stop`.
/// Between runs it parks while `pause` says so.
pub fn run_loop(id: u32, mut vcpu: VcpuFd, bus: Buses, stop: Sender<Stop>, pause: Arc<Pause>) {
    pause.register_current();
    pause.checkpoint(Some((id, &vcpu)));
    loop {
        let s = match vcpu.run() {
            Ok(exit) => handle_exit(exit, &bus),
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => None,
            Err(e) => Some(Stop::Fault(format!("KVM_RUN failed: {e}"))),
        };
        if let Some(s) = s {
            pause.unregister_current();
            let _ = stop.send(s);
            return;
        }
        pause.checkpoint(Some((id, &vcpu)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lvt_mode_is_set_and_other_bits_kept() {
        let mut l = kvm_lapic_state::default();
        l.regs[APIC_LVT0] = 0x20;
        l.regs[APIC_LVT0 + 2] = 0x01; // mask bit 16
        set_lvt(&mut l, APIC_LVT0, APIC_MODE_EXTINT);
        assert_eq!(l.regs[APIC_LVT0] as u8, 0x20);
        assert_eq!(l.regs[APIC_LVT0 + 1] as u8, 0x07);
        assert_eq!(l.regs[APIC_LVT0 + 2] as u8, 0x01);
    }

    #[test]
    fn port_exits_reach_the_bus() {
        use std::sync::Mutex;
        let mut pio = PioBus::new();
        pio.insert(
            0x60,
            5,
            Arc::new(Mutex::new(domus_devices::platform::I8042)),
        )
        .unwrap();
        let bus = Buses {
            pio,
            pci: Arc::new(PciBus::new()),
        };
        assert_eq!(
            handle_exit(VcpuExit::IoOut(0x64, &[0xfe]), &bus),
            Some(Stop::Guest(GuestEvent::Reset))
        );
        let mut d = [0u8; 1];
        assert_eq!(handle_exit(VcpuExit::IoIn(0x80, &mut d), &bus), None);
        assert_eq!(d, [0xff]);
        let mut m = [0u8; 4];
        assert_eq!(
            handle_exit(VcpuExit::MmioRead(0xc000_0000, &mut m), &bus),
            None
        );
        assert_eq!(m, [0xff; 4], "no device decodes it");
        assert_eq!(
            handle_exit(VcpuExit::MmioWrite(0xc000_0000, &m), &bus),
            None
        );
        assert_eq!(
            handle_exit(VcpuExit::Shutdown, &bus),
            Some(Stop::Guest(GuestEvent::Reset))
        );
        assert!(matches!(
            handle_exit(VcpuExit::InternalError, &bus),
            Some(Stop::Fault(_))
        ));
    }
}
