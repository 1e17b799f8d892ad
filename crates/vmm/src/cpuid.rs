//! CPUID for each vCPU: KVM's supported list (which carries the KVM
//! paravirtual leaves: kvmclock, PV EOI, steal time, PV TLB flush, ...) with
//! the topology made to match the domain: `n` single-threaded cores in one
//! package, APIC id = vCPU index; and the host's processor name, which KVM
//! leaves blank (a guest's `/proc/cpuinfo` and `lscpu` would otherwise call
//! the CPU by its family and model numbers, "06/06").

use domus_api::cpuid::{CpuidRule, Register};
use kvm_bindings::kvm_cpuid_entry2;

/// Bits needed to hold `n - 1` (the width of the core id field of an APIC id).
pub fn id_bits(n: u32) -> u32 {
    if n <= 1 {
        0
    } else {
        32 - (n - 1).leading_zeros()
    }
}

const LEAF1_ECX_TSC_DEADLINE: u32 = 1 << 24;
const LEAF1_ECX_HYPERVISOR: u32 = 1 << 31;
const LEAF1_EDX_HTT: u32 = 1 << 28;

/// The processor name leaves, 0x8000_0002 to 0x8000_0004: 48 bytes of
/// ASCII, four registers per leaf.
const BRAND_LEAVES: std::ops::RangeInclusive<u32> = 0x8000_0002..=0x8000_0004;

/// This host's processor name, as the brand leaves' registers (eax, ebx,
/// ecx, edx of each in turn); None where the CPU has none.
pub fn host_brand() -> Option<[u32; 12]> {
    let max = std::arch::x86_64::__cpuid(0x8000_0000).eax;
    if max < *BRAND_LEAVES.end() {
        return None;
    }
    let mut regs = [0u32; 12];
    for (i, leaf) in BRAND_LEAVES.enumerate() {
        let r = std::arch::x86_64::__cpuid(leaf);
        regs[i * 4..i * 4 + 4].copy_from_slice(&[r.eax, r.ebx, r.ecx, r.edx]);
    }
    Some(regs)
}

/// Rewrites the entries for vCPU `id` of `n`; `brand` (host_brand) fills
/// the processor name leaves where KVM left them blank.
pub fn patch(
    entries: &mut [kvm_cpuid_entry2],
    id: u32,
    n: u32,
    tsc_deadline: bool,
    brand: Option<&[u32; 12]>,
) {
    let shift = id_bits(n);
    for e in entries.iter_mut() {
        match e.function {
            f if BRAND_LEAVES.contains(&f) => {
                if let (Some(b), 0) = (brand, e.eax | e.ebx | e.ecx | e.edx) {
                    let i = (f - BRAND_LEAVES.start()) as usize * 4;
                    (e.eax, e.ebx, e.ecx, e.edx) = (b[i], b[i + 1], b[i + 2], b[i + 3]);
                }
            }
            1 => {
                e.ebx = (id << 24) | ((n.min(255)) << 16) | (8 << 8) | (e.ebx & 0xff);
                e.ecx |= LEAF1_ECX_HYPERVISOR;
                if tsc_deadline {
                    e.ecx |= LEAF1_ECX_TSC_DEADLINE;
                }
                if n > 1 {
                    e.edx |= LEAF1_EDX_HTT;
                } else {
                    e.edx &= !LEAF1_EDX_HTT;
                }
            }
            // Cores per package - 1 in bits 31..26; caches shared by one core.
            4 if e.eax & 0x1f != 0 => {
                e.eax = (e.eax & 0x3ff) | ((n - 1).min(63) << 26);
            }
            0xb | 0x1f => {
                e.edx = id;
                match e.index {
                    0 => {
                        e.eax = 0;
                        e.ebx = 1;
                        e.ecx = 1 << 8;
                    }
                    1 => {
                        e.eax = shift;
                        e.ebx = n;
                        e.ecx = (2 << 8) | 1;
                    }
                    i => {
                        e.eax = 0;
                        e.ebx = 0;
                        e.ecx = i;
                    }
                }
            }
            0x8000_0008 => {
                e.ecx = (e.ecx & !0xf0ff) | (shift << 12) | (n - 1).min(255);
            }
            0x8000_001e => {
                e.eax = id;
                e.ebx = id & 0xff;
                e.ecx = 0;
            }
            _ => {}
        }
    }
}

/// Forces the bits `rules` name (a domain's `cpuid = [...]`), after
/// [`patch`]; a rule for a leaf and subleaf that KVM's list lacks is
/// returned, since it would change nothing.
pub fn force(entries: &mut [kvm_cpuid_entry2], rules: &[CpuidRule]) -> Result<(), CpuidRule> {
    for r in rules {
        let e = entries
            .iter_mut()
            .find(|e| e.function == r.leaf && e.index == r.subleaf)
            .ok_or(*r)?;
        let reg = match r.register {
            Register::Eax => &mut e.eax,
            Register::Ebx => &mut e.ebx,
            Register::Ecx => &mut e.ecx,
            Register::Edx => &mut e.edx,
        };
        *reg = r.apply(*reg);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(function: u32, index: u32) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 {
            function,
            index,
            ..Default::default()
        }
    }

    #[test]
    fn rules_force_bits_of_the_leaf_and_subleaf_they_name() {
        let mut e = vec![entry(4, 0), entry(4, 3), entry(1, 0)];
        e[1].eax = 0xffff_ffff;
        e[2].ecx = 0x8000_0001;
        let rules = [
            domus_api::cpuid::parse_xend("4,3:eax=000000xxxxxxxxxxxxxxxxxxxxxxxxx1").unwrap(),
            domus_api::cpuid::parse_xend("1:ecx=0xxxxxxxxxxxxxxxxxxxxxxxxxxxxx10").unwrap(),
        ]
        .concat();
        force(&mut e, &rules).unwrap();
        assert_eq!((e[0].eax, e[1].eax), (0, 0x03ff_ffff));
        assert_eq!(e[2].ecx, 2);
        let missing =
            domus_api::cpuid::parse_xend("4,9:eax=0xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx").unwrap();
        assert_eq!(force(&mut e, &missing), Err(missing[0]));
    }

    #[test]
    fn id_bits_values() {
        assert_eq!(id_bits(1), 0);
        assert_eq!(id_bits(2), 1);
        assert_eq!(id_bits(3), 2);
        assert_eq!(id_bits(4), 2);
        assert_eq!(id_bits(5), 3);
        assert_eq!(id_bits(255), 8);
    }

    #[test]
    fn leaf1_has_apic_id_count_and_hypervisor_bit() {
        let mut e = vec![entry(1, 0)];
        patch(&mut e, 3, 4, true, None);
        assert_eq!(e[0].ebx >> 24, 3);
        assert_eq!((e[0].ebx >> 16) & 0xff, 4);
        assert_ne!(e[0].ecx & LEAF1_ECX_HYPERVISOR, 0);
        assert_ne!(e[0].ecx & LEAF1_ECX_TSC_DEADLINE, 0);
        assert_ne!(e[0].edx & LEAF1_EDX_HTT, 0);
        patch(&mut e, 0, 1, false, None);
        assert_eq!(e[0].edx & LEAF1_EDX_HTT, 0);
    }

    #[test]
    fn extended_topology_levels() {
        let mut e = vec![entry(0xb, 0), entry(0xb, 1), entry(0xb, 2)];
        patch(&mut e, 2, 4, false, None);
        assert_eq!((e[0].eax, e[0].ebx, e[0].ecx, e[0].edx), (0, 1, 0x100, 2));
        assert_eq!((e[1].eax, e[1].ebx, e[1].ecx, e[1].edx), (2, 4, 0x201, 2));
        assert_eq!((e[2].ebx, e[2].ecx & 0xff00), (0, 0));
    }

    #[test]
    fn amd_core_count() {
        let mut e = vec![entry(0x8000_0008, 0), entry(0x8000_001e, 0)];
        patch(&mut e, 1, 4, false, None);
        assert_eq!(e[0].ecx & 0xff, 3);
        assert_eq!((e[0].ecx >> 12) & 0xf, 2);
        assert_eq!(e[1].eax, 1);
    }

    #[test]
    fn blank_brand_leaves_get_the_host_name() {
        let name = b"Example CPU @ 2.00GHz";
        let mut bytes = [0u8; 48];
        bytes[..name.len()].copy_from_slice(name);
        let mut brand = [0u32; 12];
        for (r, c) in brand.iter_mut().zip(bytes.chunks(4)) {
            *r = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        let mut e = vec![
            entry(0x8000_0002, 0),
            entry(0x8000_0003, 0),
            entry(0x8000_0004, 0),
        ];
        e[2].eax = 7; // a leaf KVM filled stays as it is
        patch(&mut e, 0, 2, false, Some(&brand));
        let mut got = Vec::new();
        for x in &e[..2] {
            for r in [x.eax, x.ebx, x.ecx, x.edx] {
                got.extend_from_slice(&r.to_le_bytes());
            }
        }
        assert_eq!(&got[..], &bytes[..32]);
        assert_eq!((e[2].eax, e[2].ebx), (7, 0));
        // Without a host name the leaves stay blank.
        let mut e = vec![entry(0x8000_0002, 0)];
        patch(&mut e, 0, 2, false, None);
        assert_eq!(e[0].eax | e[0].ebx | e[0].ecx | e[0].edx, 0);
    }
}
