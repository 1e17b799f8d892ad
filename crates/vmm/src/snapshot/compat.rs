//! The compatibility promise of docs/snapshot-format.md, kept by a test: a
//! state file written by the first release of the format (version 1,
//! `tests/fixtures/snapshot-v1.state`, from a 2-vCPU kit domain with a
//! disk, an interface, vsock, rng and the balloon) is read by this release
//! and every part of it put back on fresh devices and KVM structures.
//! (Test-only.)

use std::path::Path;
use std::sync::Arc;

use domus_devices::serial::SerialDevice;
use domus_virtio::pci::{vectors_for, VirtioPci};
use domus_virtio::{ActivateError, Activation, DeviceState, Hypervisor, Memory, VirtioDevice};
use kvm_bindings::{
    kvm_clock_data, kvm_debugregs, kvm_irqchip, kvm_lapic_state, kvm_pit_state2, kvm_regs,
    kvm_sregs, kvm_vcpu_events, kvm_xcrs, kvm_xsave,
};
use vmm_sys_util::eventfd::EventFd;

use super::kvm::{cpuid_from, Blob};
use super::{Body, DeviceSpec};

pub(super) const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/snapshot-v1.state"
);

/// A device of the saved one's shape (type, queues), offering every
/// feature, keeping the balloon's state.
struct Shape {
    kind: u32,
    queues: usize,
    state: DeviceState,
}

impl VirtioDevice for Shape {
    fn device_type(&self) -> u32 {
        self.kind
    }
    fn queue_max_sizes(&self) -> Vec<u16> {
        vec![256; self.queues]
    }
    fn features(&self) -> u64 {
        u64::MAX
    }
    fn read_config(&self, _: u64, data: &mut [u8]) {
        data.fill(0);
    }
    fn activate(&mut self, _: Activation) -> Result<(), ActivateError> {
        Ok(())
    }
    fn reset(&mut self) {}
    fn state(&self) -> DeviceState {
        self.state.clone()
    }
    fn restore(&mut self, s: &DeviceState) -> Result<(), String> {
        self.state = s.clone();
        Ok(())
    }
}

struct NoHv;

impl Hypervisor for NoHv {
    fn set_msi_route(&self, _: u32, _: u64, _: u32) -> std::io::Result<()> {
        Ok(())
    }
    fn register_ioevent(&self, _: &EventFd, _: u64) -> std::io::Result<()> {
        Ok(())
    }
    fn unregister_ioevent(&self, _: &EventFd, _: u64) -> std::io::Result<()> {
        Ok(())
    }
}

/// A virtio PCI function named `id` on a [`Shape`] device of `(kind,
/// queues)`, in `mem`, with no hypervisor behind it.
pub(super) fn transport_of(id: &str, (kind, queues): (u32, usize), mem: &Arc<Memory>) -> VirtioPci {
    let dev = Shape {
        kind,
        queues,
        state: DeviceState::Stateless,
    };
    let vectors = (0..vectors_for(queues))
        .map(|i| domus_virtio::msix::Vector {
            gsi: 24 + i as u32,
            irqfd: EventFd::new(libc::EFD_NONBLOCK).expect("an eventfd"),
        })
        .collect();
    VirtioPci::new(
        id.to_string(),
        Box::new(dev),
        0xc000_0000,
        vectors,
        mem.clone(),
        Arc::new(NoHv),
    )
}

fn kernel<T: zerocopy::FromBytes>(b: &Blob) -> T {
    T::read_from_bytes(&b.0).unwrap_or_else(|_| panic!("{} bytes", b.0.len()))
}

#[test]
fn snapshot_v1_fixture_still_restores() {
    let text = std::fs::read(FIXTURE).unwrap();
    assert!(
        text.starts_with(br#"{"format":"domus-snapshot","version":1,"#),
        "the fixture is a version 1 snapshot"
    );
    let body: Body = domus_api::snapshot::read(Path::new(FIXTURE)).unwrap();
    let (s, m) = (&body.summary, &body.machine);

    // The summary: the domain and its memory.
    assert_eq!((s.spec.vcpus, s.spec.memory_mib), (2, 256));
    assert_eq!(s.spec.disks.len(), 1);
    assert_eq!(s.spec.nets[0].mac.as_deref(), Some("52:54:00:00:00:42"));
    assert_eq!(s.spec.vsock_cid, Some(777));
    assert!(s.spec.rng && s.spec.balloon && !s.paused);
    assert_eq!(s.memory.bytes, 256 << 20);
    assert_eq!(
        s.memory
            .regions
            .iter()
            .map(|r| (r.guest_addr, r.bytes))
            .collect::<Vec<_>>(),
        domus_boot::layout::ram_ranges(256 << 20)
    );
    assert!(s.memory.pages_stored > 0 && s.memory.pages_stored < (256 << 20) / 4096);

    // KVM's structures, each the size its uapi says.
    cpuid_from(&m.cpuid).unwrap();
    assert_eq!(m.vcpus.len(), 2);
    for v in &m.vcpus {
        let regs: kvm_regs = kernel(&v.regs);
        let sregs: kvm_sregs = kernel(&v.sregs);
        assert!(
            regs.rip >= 0xffff_ffff_8000_0000,
            "vCPU {} in the kernel",
            v.id
        );
        assert!(sregs.cr0 & 0x8000_0001 == 0x8000_0001, "paging on");
        let _: kvm_xsave = kernel(&v.xsave);
        let _: kvm_xcrs = kernel(&v.xcrs);
        let _: kvm_debugregs = kernel(&v.debug_regs);
        let _: kvm_lapic_state = kernel(&v.lapic);
        let _: kvm_vcpu_events = kernel(&v.events);
        assert!(v.msrs.iter().any(|(i, _)| *i == 0x10), "the TSC is saved");
        assert!(
            v.msrs.iter().any(|(i, _)| *i == 0x4b56_4d01),
            "kvmclock's system time MSR is saved"
        );
    }
    for b in [&m.vm.pic_master, &m.vm.pic_slave, &m.vm.ioapic] {
        let _: kvm_irqchip = kernel(b);
    }
    let _: kvm_pit_state2 = kernel(&m.vm.pit);
    let _ = kvm_clock_data {
        clock: m.vm.clock_ns,
        ..Default::default()
    };
    assert!(m.vm.realtime_ns.is_some());

    // COM1.
    let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    SerialDevice::from_state(&m.serial, irq, Box::new(std::io::sink())).unwrap();

    // Every device's transport, put back on a device of its shape.
    let mem = Arc::new(Memory::from_ranges(&[(vm_memory::GuestAddress(0), 1 << 20)]).unwrap());
    let mut kinds = Vec::new();
    for d in &m.devices {
        let shape = (d.transport.device_type, d.transport.queues.len());
        let mut pci = transport_of(&d.id, shape, &mem);
        pci.restore(&d.transport)
            .unwrap_or_else(|e| panic!("{}: {e}", d.id));
        assert_eq!(
            pci.status() & 0x4,
            0x4,
            "{}: its driver had it running",
            d.id
        );
        kinds.push(match &d.spec {
            DeviceSpec::Block { .. } => "block",
            DeviceSpec::Net { .. } => "net",
            DeviceSpec::Vsock { .. } => "vsock",
            DeviceSpec::Rng => "rng",
            DeviceSpec::Balloon => "balloon",
        });
    }
    assert_eq!(kinds, ["block", "net", "vsock", "rng", "balloon"]);
}
