//! KVM's share of a snapshot: each vCPU's registers and in-kernel state,
//! the in-kernel interrupt controllers, the PIT and the kvmclock.
//!
//! Each KVM structure is kept as its bytes in Linux's x86-64 uapi layout
//! (`struct kvm_regs`, `struct kvm_sregs`, ...), which the kernel never
//! changes, base64 in the JSON; MSRs as (index, value) pairs. Bytes of the
//! wrong length are refused before anything reaches KVM.

use base64::Engine as _;
use kvm_bindings::{
    kvm_clock_data, kvm_debugregs, kvm_irqchip, kvm_lapic_state, kvm_mp_state, kvm_msr_entry,
    kvm_pit_state2, kvm_regs, kvm_sregs, kvm_vcpu_events, kvm_xcrs, kvm_xsave, CpuId, Msrs,
    KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE,
};
use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use serde::{Deserialize, Serialize};
use zerocopy::{FromBytes, IntoBytes};

use super::SnapshotError;

/// Bytes, as base64 in the JSON.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blob(pub Vec<u8>);

impl Serialize for Blob {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for Blob {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(s)
            .map(Blob)
            .map_err(serde::de::Error::custom)
    }
}

fn blob<T: IntoBytes + zerocopy::Immutable>(t: &T) -> Blob {
    Blob(t.as_bytes().to_vec())
}

pub(crate) fn unblob<T: FromBytes>(what: &'static str, b: &Blob) -> Result<T, SnapshotError> {
    T::read_from_bytes(&b.0).map_err(|_| {
        SnapshotError::Machine(format!(
            "{what}: {} bytes, expected {}",
            b.0.len(),
            std::mem::size_of::<T>()
        ))
    })
}

/// One vCPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VcpuState {
    pub id: u32,
    pub regs: Blob,
    pub sregs: Blob,
    pub xsave: Blob,
    pub xcrs: Blob,
    pub debug_regs: Blob,
    pub lapic: Blob,
    pub events: Blob,
    pub mp_state: u32,
    /// Every MSR KVM saves (its KVM_GET_MSR_INDEX_LIST), kvmclock's and
    /// the paravirtual ones among them.
    pub msrs: Vec<(u32, u64)>,
    /// The TSC rate the guest saw, in kHz.
    pub tsc_khz: Option<u32>,
}

/// The VM: interrupt controllers, PIT, clock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmState {
    pub pic_master: Blob,
    pub pic_slave: Blob,
    pub ioapic: Blob,
    pub pit: Blob,
    /// kvmclock, in nanoseconds.
    pub clock_ns: u64,
    /// The host's wall clock (ns since the epoch) when `clock_ns` was
    /// read: a restore moves kvmclock and the TSCs on by the time since, so
    /// the guest's wall clock is right after the restore.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub realtime_ns: Option<u64>,
}

/// One CPUID leaf as the guest saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuidLeaf {
    pub function: u32,
    pub index: u32,
    pub flags: u32,
    pub eax: u32,
    pub ebx: u32,
    pub ecx: u32,
    pub edx: u32,
}

pub fn cpuid_leaves(c: &CpuId) -> Vec<CpuidLeaf> {
    c.as_slice()
        .iter()
        .map(|e| CpuidLeaf {
            function: e.function,
            index: e.index,
            flags: e.flags,
            eax: e.eax,
            ebx: e.ebx,
            ecx: e.ecx,
            edx: e.edx,
        })
        .collect()
}

pub fn cpuid_from(leaves: &[CpuidLeaf]) -> Result<CpuId, SnapshotError> {
    let entries: Vec<kvm_bindings::kvm_cpuid_entry2> = leaves
        .iter()
        .map(|l| kvm_bindings::kvm_cpuid_entry2 {
            function: l.function,
            index: l.index,
            flags: l.flags,
            eax: l.eax,
            ebx: l.ebx,
            ecx: l.ecx,
            edx: l.edx,
            ..Default::default()
        })
        .collect();
    CpuId::from_entries(&entries)
        .map_err(|_| SnapshotError::Machine(format!("{} CPUID leaves: too many", leaves.len())))
}

/// The feature words a restore compares: (leaf, subleaf, register index
/// 0..3 for eax..edx, what it is called).
const FEATURE_WORDS: &[(u32, u32, usize, &str)] = &[
    (1, 0, 2, "CPUID.1:ECX"),
    (1, 0, 3, "CPUID.1:EDX"),
    (7, 0, 1, "CPUID.7.0:EBX"),
    (7, 0, 2, "CPUID.7.0:ECX"),
    (7, 0, 3, "CPUID.7.0:EDX"),
    (7, 1, 0, "CPUID.7.1:EAX"),
    (0xd, 1, 0, "CPUID.D.1:EAX"),
    (0x8000_0001, 0, 2, "CPUID.80000001:ECX"),
    (0x8000_0001, 0, 3, "CPUID.80000001:EDX"),
];

/// Bits of `leaf` every guest sees whatever the host has (KVM emulates
/// them or the VMM sets them): the hypervisor bit and TSC-deadline.
fn emulated(leaf: u32, reg: usize) -> u32 {
    match (leaf, reg) {
        (1, 2) => (1 << 31) | (1 << 24),
        _ => 0,
    }
}

/// Refuses a restore on a host whose KVM lacks CPU features the saved
/// guest was given: the guest would fault on its first use of one.
pub fn check_cpuid(saved: &[CpuidLeaf], host: &CpuId) -> Result<(), SnapshotError> {
    let reg = |l: &CpuidLeaf, r: usize| [l.eax, l.ebx, l.ecx, l.edx][r];
    let mut missing = Vec::new();
    for (leaf, sub, r, name) in FEATURE_WORDS {
        let Some(s) = saved
            .iter()
            .find(|l| l.function == *leaf && l.index == *sub)
        else {
            continue;
        };
        let h = host
            .as_slice()
            .iter()
            .find(|e| e.function == *leaf && e.index == *sub)
            .map(|e| [e.eax, e.ebx, e.ecx, e.edx][*r])
            .unwrap_or(0);
        let lack = reg(s, *r) & !h & !emulated(*leaf, *r);
        if lack != 0 {
            missing.push(format!("{name} bits {lack:#010x}"));
        }
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(SnapshotError::Cpu(missing.join(", ")))
    }
}

fn kvm(what: &'static str) -> impl Fn(kvm_ioctls::Error) -> SnapshotError {
    move |e| SnapshotError::Kvm(what, e)
}

/// The MSRs a snapshot keeps: KVM's list of MSRs to save and restore.
pub fn msr_list(kvm_fd: &Kvm) -> Result<Vec<u32>, SnapshotError> {
    Ok(kvm_fd
        .get_msr_index_list()
        .map_err(kvm("KVM_GET_MSR_INDEX_LIST"))?
        .as_slice()
        .to_vec())
}

/// Reads a stopped vCPU's state (on the vCPU's own thread).
pub fn save_vcpu(id: u32, vcpu: &VcpuFd, msr_indices: &[u32]) -> Result<VcpuState, SnapshotError> {
    // Events first: KVM_GET_VCPU_EVENTS may complete a pending exception
    // that the registers read after it then reflect.
    let events = vcpu.get_vcpu_events().map_err(kvm("KVM_GET_VCPU_EVENTS"))?;
    let mp = vcpu.get_mp_state().map_err(kvm("KVM_GET_MP_STATE"))?;
    let regs = vcpu.get_regs().map_err(kvm("KVM_GET_REGS"))?;
    let sregs = vcpu.get_sregs().map_err(kvm("KVM_GET_SREGS"))?;
    let xsave = vcpu.get_xsave().map_err(kvm("KVM_GET_XSAVE"))?;
    let xcrs = vcpu.get_xcrs().map_err(kvm("KVM_GET_XCRS"))?;
    let debug = vcpu.get_debug_regs().map_err(kvm("KVM_GET_DEBUGREGS"))?;
    let lapic = vcpu.get_lapic().map_err(kvm("KVM_GET_LAPIC"))?;
    let mut msrs = Vec::new();
    // KVM_GET_MSRS stops at the first MSR it cannot read: read in chunks
    // and step over such an MSR.
    let mut at = 0;
    while at < msr_indices.len() {
        let chunk = &msr_indices[at..(at + 256).min(msr_indices.len())];
        let entries: Vec<kvm_msr_entry> = chunk
            .iter()
            .map(|i| kvm_msr_entry {
                index: *i,
                ..Default::default()
            })
            .collect();
        let mut m = Msrs::from_entries(&entries)
            .map_err(|_| SnapshotError::Machine("MSR list too long".into()))?;
        let n = vcpu.get_msrs(&mut m).map_err(kvm("KVM_GET_MSRS"))?;
        msrs.extend(m.as_slice()[..n].iter().map(|e| (e.index, e.data)));
        // Past the MSR KVM could not read, if it stopped at one.
        at += n + usize::from(n < chunk.len());
    }
    Ok(VcpuState {
        id,
        regs: blob(&regs),
        sregs: blob(&sregs),
        xsave: blob(&xsave),
        xcrs: blob(&xcrs),
        debug_regs: blob(&debug),
        lapic: blob(&lapic),
        events: blob(&events),
        mp_state: mp.mp_state,
        msrs,
        tsc_khz: vcpu.get_tsc_khz().ok(),
    })
}

const MSR_IA32_TSC: u32 = 0x10;

/// How far the guest's clocks move on at a restore: the host's wall-clock
/// time since the snapshot was taken (none if it did not record it, or the
/// host's clock went back).
pub fn time_away(s: &VmState) -> Option<std::time::Duration> {
    let then = std::time::Duration::from_nanos(s.realtime_ns?);
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .checked_sub(then)
}

/// Puts a saved state on a new vCPU that has its CPUID set. Its TSC moves
/// on by `away` (at the saved rate), as kvmclock does
/// ([`restore_vm`]): a guest whose clock source is the TSC keeps the
/// right time too.
pub fn restore_vcpu(
    vcpu: &VcpuFd,
    s: &VcpuState,
    away: Option<std::time::Duration>,
) -> Result<(), SnapshotError> {
    let tsc_ahead = match (away, s.tsc_khz) {
        (Some(d), Some(khz)) => (d.as_nanos() * u128::from(khz) / 1_000_000) as u64,
        _ => 0,
    };
    let regs: kvm_regs = unblob("regs", &s.regs)?;
    let sregs: kvm_sregs = unblob("sregs", &s.sregs)?;
    let xsave: kvm_xsave = unblob("xsave", &s.xsave)?;
    let xcrs: kvm_xcrs = unblob("xcrs", &s.xcrs)?;
    let debug: kvm_debugregs = unblob("debug_regs", &s.debug_regs)?;
    let lapic: kvm_lapic_state = unblob("lapic", &s.lapic)?;
    let events: kvm_vcpu_events = unblob("events", &s.events)?;
    if let Some(khz) = s.tsc_khz {
        if vcpu.get_tsc_khz().ok() != Some(khz) {
            vcpu.set_tsc_khz(khz).map_err(kvm(
                "KVM_SET_TSC_KHZ (this host's TSC cannot run at the saved rate)",
            ))?;
        }
    }
    vcpu.set_mp_state(kvm_mp_state {
        mp_state: s.mp_state,
    })
    .map_err(kvm("KVM_SET_MP_STATE"))?;
    vcpu.set_sregs(&sregs).map_err(kvm("KVM_SET_SREGS"))?;
    vcpu.set_regs(&regs).map_err(kvm("KVM_SET_REGS"))?;
    // SAFETY: a whole kvm_xsave, which is what KVM_SET_XSAVE reads.
    unsafe { vcpu.set_xsave(&xsave) }.map_err(kvm("KVM_SET_XSAVE"))?;
    vcpu.set_xcrs(&xcrs).map_err(kvm("KVM_SET_XCRS"))?;
    vcpu.set_debug_regs(&debug)
        .map_err(kvm("KVM_SET_DEBUGREGS"))?;
    vcpu.set_lapic(&lapic).map_err(kvm("KVM_SET_LAPIC"))?;
    for chunk in s.msrs.chunks(256) {
        let entries: Vec<kvm_msr_entry> = chunk
            .iter()
            .map(|(index, data)| kvm_msr_entry {
                index: *index,
                data: if *index == MSR_IA32_TSC {
                    data.wrapping_add(tsc_ahead)
                } else {
                    *data
                },
                ..Default::default()
            })
            .collect();
        let m = Msrs::from_entries(&entries)
            .map_err(|_| SnapshotError::Machine("MSR list too long".into()))?;
        let n = vcpu.set_msrs(&m).map_err(kvm("KVM_SET_MSRS"))?;
        if n < entries.len() {
            return Err(SnapshotError::Machine(format!(
                "KVM refused MSR {:#x} of vCPU {}",
                entries[n].index, s.id
            )));
        }
    }
    // Events last: they hold the pending exception and NMI state.
    vcpu.set_vcpu_events(&events)
        .map_err(kvm("KVM_SET_VCPU_EVENTS"))?;
    Ok(())
}

fn chip(vm: &VmFd, id: u32) -> Result<Blob, SnapshotError> {
    let mut c = kvm_irqchip {
        chip_id: id,
        ..Default::default()
    };
    vm.get_irqchip(&mut c).map_err(kvm("KVM_GET_IRQCHIP"))?;
    Ok(blob(&c))
}

pub fn save_vm(vm: &VmFd) -> Result<VmState, SnapshotError> {
    let pit = vm.get_pit2().map_err(kvm("KVM_GET_PIT2"))?;
    let clock = vm.get_clock().map_err(kvm("KVM_GET_CLOCK"))?;
    // KVM's own reading of the wall clock (KVM_CLOCK_REALTIME) is there
    // only on hosts whose clock source is the TSC: read it here instead.
    let realtime = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .and_then(|d| u64::try_from(d.as_nanos()).ok());
    Ok(VmState {
        pic_master: chip(vm, KVM_IRQCHIP_PIC_MASTER)?,
        pic_slave: chip(vm, KVM_IRQCHIP_PIC_SLAVE)?,
        ioapic: chip(vm, KVM_IRQCHIP_IOAPIC)?,
        pit: blob(&pit),
        clock_ns: clock.clock,
        realtime_ns: realtime,
    })
}

/// Puts the saved interrupt controllers, PIT and clock on a new VM that
/// has its irqchip and PIT. kvmclock moves on by the host's wall-clock
/// time since the save ([`time_away`]), so the guest's wall clock is
/// right; its uptime counts the time it spent saved, as a suspended
/// machine's does.
pub fn restore_vm(vm: &VmFd, s: &VmState) -> Result<(), SnapshotError> {
    let pit: kvm_pit_state2 = unblob("pit", &s.pit)?;
    for (what, b, id) in [
        ("pic_master", &s.pic_master, KVM_IRQCHIP_PIC_MASTER),
        ("pic_slave", &s.pic_slave, KVM_IRQCHIP_PIC_SLAVE),
        ("ioapic", &s.ioapic, KVM_IRQCHIP_IOAPIC),
    ] {
        let c: kvm_irqchip = unblob(what, b)?;
        if c.chip_id != id {
            return Err(SnapshotError::Machine(format!(
                "{what}: chip {}",
                c.chip_id
            )));
        }
        vm.set_irqchip(&c).map_err(kvm("KVM_SET_IRQCHIP"))?;
    }
    vm.set_pit2(&pit).map_err(kvm("KVM_SET_PIT2"))?;
    let away = time_away(s).map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(0));
    vm.set_clock(&kvm_clock_data {
        clock: s.clock_ns.saturating_add(away),
        ..Default::default()
    })
    .map_err(kvm("KVM_SET_CLOCK"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(function: u32, index: u32, ecx: u32) -> CpuidLeaf {
        CpuidLeaf {
            function,
            index,
            flags: 0,
            eax: 0,
            ebx: 0,
            ecx,
            edx: 0,
        }
    }

    #[test]
    fn a_guest_given_features_the_host_lacks_is_refused() {
        let host = cpuid_from(&[leaf(1, 0, 0b1011), leaf(7, 0, 0)]).unwrap();
        assert!(check_cpuid(&[leaf(1, 0, 0b0011)], &host).is_ok());
        // The hypervisor bit is every guest's, whatever the host says.
        assert!(check_cpuid(&[leaf(1, 0, 0b0011 | 1 << 31)], &host).is_ok());
        let e = check_cpuid(&[leaf(1, 0, 0b0111), leaf(7, 0, 0b100)], &host).unwrap_err();
        let m = e.to_string();
        assert!(m.contains("CPUID.1:ECX bits 0x00000004"), "{m}");
        assert!(m.contains("CPUID.7.0:ECX bits 0x00000004"), "{m}");
    }

    #[test]
    fn blobs_of_the_wrong_size_never_reach_kvm() {
        let r = kvm_regs {
            rip: 0x1234,
            ..Default::default()
        };
        let b = blob(&r);
        assert_eq!(b.0.len(), 144);
        let j = serde_json::to_string(&b).unwrap();
        let back: Blob = serde_json::from_str(&j).unwrap();
        assert_eq!(unblob::<kvm_regs>("regs", &back).unwrap().rip, 0x1234);
        assert!(unblob::<kvm_regs>("regs", &Blob(vec![0; 143])).is_err());
        assert!(unblob::<kvm_xsave>("xsave", &Blob(vec![0; 4097])).is_err());
        assert!(serde_json::from_str::<Blob>("\"not base64!\"").is_err());
    }
}
