//! Interrupt plumbing between the virtio transport and KVM: GSI numbers for
//! MSI-X vectors, the VM's GSI routing table (the in-kernel PIC and IOAPIC
//! pins plus one MSI route per vector), and notify ioeventfds.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use domus_devices::bus::lock;
use domus_virtio::msix::Vector;
use domus_virtio::Hypervisor;
use kvm_bindings::{
    kvm_irq_routing_entry, kvm_irq_routing_entry__bindgen_ty_1, kvm_irq_routing_irqchip,
    kvm_irq_routing_msi, KvmIrqRouting, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER,
    KVM_IRQCHIP_PIC_SLAVE, KVM_IRQ_ROUTING_IRQCHIP, KVM_IRQ_ROUTING_MSI,
};
use kvm_ioctls::{IoEventAddress, NoDatamatch, VmFd};
use vmm_sys_util::eventfd::EventFd;

/// GSIs below this are the IOAPIC's pins.
pub const FIRST_MSI_GSI: u32 = 24;

fn irqchip(gsi: u32, chip: u32, pin: u32) -> kvm_irq_routing_entry {
    kvm_irq_routing_entry {
        gsi,
        type_: KVM_IRQ_ROUTING_IRQCHIP,
        u: kvm_irq_routing_entry__bindgen_ty_1 {
            irqchip: kvm_irq_routing_irqchip { irqchip: chip, pin },
        },
        ..Default::default()
    }
}

/// KVM's default table: GSIs 0..15 on both PICs and the IOAPIC, 16..23 on
/// the IOAPIC. Setting any route replaces the whole table, so it is kept.
fn default_routes() -> Vec<kvm_irq_routing_entry> {
    let mut v = Vec::new();
    for gsi in 0..FIRST_MSI_GSI {
        if gsi < 8 {
            v.push(irqchip(gsi, KVM_IRQCHIP_PIC_MASTER, gsi));
        } else if gsi < 16 {
            v.push(irqchip(gsi, KVM_IRQCHIP_PIC_SLAVE, gsi - 8));
        }
        v.push(irqchip(gsi, KVM_IRQCHIP_IOAPIC, gsi));
    }
    v
}

pub struct KvmIrqs {
    vm: Arc<VmFd>,
    state: Mutex<State>,
}

struct State {
    next_gsi: u32,
    /// GSIs of unplugged devices, taken again before new ones.
    free: Vec<u32>,
    msi: BTreeMap<u32, (u64, u32)>,
}

impl KvmIrqs {
    pub fn new(vm: Arc<VmFd>) -> Self {
        Self {
            vm,
            state: Mutex::new(State {
                next_gsi: FIRST_MSI_GSI,
                free: Vec::new(),
                msi: BTreeMap::new(),
            }),
        }
    }

    /// `n` new MSI vectors, each a fresh GSI with an irqfd on it.
    pub fn vectors(&self, n: usize) -> std::io::Result<Vec<Vector>> {
        let mut st = lock(&self.state);
        let mut out = Vec::new();
        for _ in 0..n {
            let gsi = match st.free.pop() {
                Some(g) => g,
                None => {
                    st.next_gsi += 1;
                    st.next_gsi - 1
                }
            };
            let irqfd = EventFd::new(libc::EFD_NONBLOCK)?;
            self.vm
                .register_irqfd(&irqfd, gsi)
                .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
            out.push(Vector { gsi, irqfd });
        }
        Ok(out)
    }

    fn apply(&self, st: &State) -> std::io::Result<()> {
        let mut entries = default_routes();
        for (gsi, (addr, data)) in &st.msi {
            entries.push(kvm_irq_routing_entry {
                gsi: *gsi,
                type_: KVM_IRQ_ROUTING_MSI,
                u: kvm_irq_routing_entry__bindgen_ty_1 {
                    msi: kvm_irq_routing_msi {
                        address_lo: *addr as u32,
                        address_hi: (*addr >> 32) as u32,
                        data: *data,
                        ..Default::default()
                    },
                },
                ..Default::default()
            });
        }
        let table = KvmIrqRouting::from_entries(&entries)
            .map_err(|_| std::io::Error::other("too many interrupt routes"))?;
        self.vm
            .set_gsi_routing(&table)
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))
    }
}

impl Hypervisor for KvmIrqs {
    fn set_msi_route(&self, gsi: u32, addr: u64, data: u32) -> std::io::Result<()> {
        let mut st = lock(&self.state);
        st.msi.insert(gsi, (addr, data));
        self.apply(&st)
    }

    fn register_ioevent(&self, fd: &EventFd, addr: u64) -> std::io::Result<()> {
        self.vm
            .register_ioevent(fd, &IoEventAddress::Mmio(addr), NoDatamatch)
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))
    }

    fn unregister_ioevent(&self, fd: &EventFd, addr: u64) -> std::io::Result<()> {
        self.vm
            .unregister_ioevent(fd, &IoEventAddress::Mmio(addr), NoDatamatch)
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))
    }

    fn release_vector(&self, v: &Vector) -> std::io::Result<()> {
        let mut st = lock(&self.state);
        self.vm
            .unregister_irqfd(&v.irqfd, v.gsi)
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
        st.msi.remove(&v.gsi);
        st.free.push(v.gsi);
        self.apply(&st)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_table_matches_kvm() {
        let r = default_routes();
        // 16 GSIs on a PIC and the IOAPIC, 8 on the IOAPIC only.
        assert_eq!(r.len(), 16 * 2 + 8);
        assert!(r.iter().all(|e| e.type_ == KVM_IRQ_ROUTING_IRQCHIP));
        // SAFETY: these entries were built as irqchip routes.
        let (chip, pin) = unsafe { (r[2].u.irqchip.irqchip, r[2].u.irqchip.pin) };
        assert_eq!((r[2].gsi, chip, pin), (1, KVM_IRQCHIP_PIC_MASTER, 1));
        // SAFETY: as above.
        let last = unsafe { r[39].u.irqchip };
        assert_eq!(
            (r[39].gsi, last.irqchip, last.pin),
            (23, KVM_IRQCHIP_IOAPIC, 23)
        );
    }
}
