//! ACPI tables for a hardware-reduced ACPI platform: RSDP, XSDT, FADT, DSDT
//! and MADT. They tell the guest how many CPUs it has (MADT), how to power off
//! and reset (FADT sleep control/status and reset registers, `_S5_` in the
//! DSDT), where the pvpanic device is (DSDT, `QEMU0001`), and how the host
//! presses the power button: a Generic Event Device (`ACPI0013`) whose
//! interrupt makes the guest run `_EVT`, which reads the pending events from
//! an I/O port and notifies the power button device (`PNP0C0C`), and the VM
//! generation ID device (`VMGENCTR`, Linux's vmgenid driver: 16 bytes at
//! `ADDR`, notified when a restore or a clone changed them).

use crate::aml;
use crate::layout::{ACPI_START, IOAPIC_ADDR, LAPIC_ADDR, VMGENID_ADDR};

const OEM_ID: &[u8; 6] = b"DOMUS ";
const OEM_TABLE_ID: &[u8; 8] = b"DOMUSVMM";
const CREATOR_ID: &[u8; 4] = b"DOMU";

/// The platform's I/O ports the tables describe.
#[derive(Clone, Copy, Debug)]
pub struct AcpiConfig {
    pub vcpus: u8,
    pub sleep_control_port: u16,
    pub sleep_status_port: u16,
    pub reset_port: u16,
    pub reset_value: u8,
    pub pvpanic_port: u16,
    /// COM1's base port and ISA IRQ.
    pub serial_port: u16,
    pub serial_irq: u8,
    /// The PCI root bridge's config ports and its BAR window.
    pub pci_config_port: u16,
    pub pci_mmio_base: u32,
    pub pci_mmio_len: u32,
    /// The Generic Event Device's event port (read: pending events, cleared
    /// by the read) and its interrupt (edge-triggered GSI).
    pub ged_port: u16,
    pub ged_gsi: u32,
    /// The PCI hot-plug registers (PCIU, PCID, PCEJ: three dwords).
    pub pci_hotplug_port: u16,
}

/// Bits of the Generic Event Device's event port.
pub const GED_POWER_BUTTON: u8 = 1;
pub const GED_PCI_HOTPLUG: u8 = 2;
/// The VM generation ID changed (a restore): the guest reads it again
/// and reseeds its random number generator.
pub const GED_VMGENID: u8 = 4;

/// PCI slots 1..=31 can be hot-plugged.
const HOTPLUG_SLOTS: std::ops::RangeInclusive<u32> = 1..=31;

/// The root bridge's contents: its resources, and ACPI PCI hot-plug. Each
/// slot is a device with an `_EJ0`, so the guest's acpiphp driver manages
/// it. `PCNT` (run by the GED's `_EVT`) reads two bitmaps of slots from
/// the hot-plug ports, PCIU (a device arrived) and PCID (the host wants it
/// removed), and notifies those slots with Device Check (1) or Eject
/// Request (3). A slot's `_EJ0` writes its bit to PCEJ once the guest has
/// let go of the device.
fn pci0(cfg: &AcpiConfig) -> Vec<Vec<u8>> {
    let mut c = vec![
        aml::name("_HID", aml::string("PNP0A03")),
        aml::name("_UID", aml::integer(0)),
        aml::name("_SEG", aml::integer(0)),
        aml::name("_BBN", aml::integer(0)),
        aml::name(
            "_CRS",
            aml::pci_root_resources(cfg.pci_config_port, cfg.pci_mmio_base, cfg.pci_mmio_len),
        ),
        aml::io_region("PCHP", cfg.pci_hotplug_port, 12),
        aml::field(
            "PCHP",
            aml::DWORD_ACC,
            &[("PCIU", 32), ("PCID", 32), ("PCEJ", 32)],
        ),
    ];
    let slot = |s: u32| format!("S{s:02X}");
    let mut pcnt = vec![
        aml::store(aml::name_string("PCIU"), aml::local(0)),
        aml::store(aml::name_string("PCID"), aml::local(1)),
    ];
    for s in HOTPLUG_SLOTS {
        pcnt.push(aml::if_and(
            aml::local(0),
            1 << s,
            &[aml::notify(&slot(s), 1)],
        ));
        pcnt.push(aml::if_and(
            aml::local(1),
            1 << s,
            &[aml::notify(&slot(s), 3)],
        ));
    }
    c.push(aml::method("PCNT", 0, &pcnt));
    for s in HOTPLUG_SLOTS {
        c.push(aml::device(
            &slot(s),
            &[
                aml::name("_ADR", aml::integer(u64::from(s) << 16)),
                aml::name("_SUN", aml::integer(s.into())),
                aml::method(
                    "_EJ0",
                    1,
                    &[aml::store(aml::integer(1 << s), aml::name_string("PCEJ"))],
                ),
            ],
        ));
    }
    c
}

/// The `SLP_TYP` value `_S5_` announces; the guest writes it to the sleep
/// control register (bits 2..4, with `SLP_EN`, bit 5) to power off.
pub const S5_SLEEP_TYPE: u8 = 5;

/// Tables laid out from `ACPI_START`: `bytes[0]` is at `ACPI_START`, and the
/// RSDP, which Linux finds by scanning 0xe0000..0x100000, comes first.
pub struct AcpiTables {
    pub bytes: Vec<u8>,
    pub rsdp_addr: u64,
}

fn checksum(bytes: &[u8]) -> u8 {
    bytes
        .iter()
        .fold(0u8, |a, b| a.wrapping_add(*b))
        .wrapping_neg()
}

fn sdt(signature: &[u8; 4], revision: u8, body: &[u8]) -> Vec<u8> {
    let len = 36 + body.len();
    let mut t = Vec::with_capacity(len);
    t.extend_from_slice(signature);
    t.extend_from_slice(&(len as u32).to_le_bytes());
    t.push(revision);
    t.push(0); // checksum, below
    t.extend_from_slice(OEM_ID);
    t.extend_from_slice(OEM_TABLE_ID);
    t.extend_from_slice(&1u32.to_le_bytes());
    t.extend_from_slice(CREATOR_ID);
    t.extend_from_slice(&1u32.to_le_bytes());
    t.extend_from_slice(body);
    t[9] = checksum(&t);
    t
}

/// A Generic Address Structure for a byte-wide I/O port.
fn gas_io(port: u16) -> [u8; 12] {
    let mut g = [0u8; 12];
    g[0] = 1; // SystemIO
    g[1] = 8; // bit width
    g[3] = 1; // byte access
    g[4..12].copy_from_slice(&u64::from(port).to_le_bytes());
    g
}

fn fadt(cfg: &AcpiConfig, dsdt_addr: u64) -> Vec<u8> {
    let mut b = vec![0u8; 276 - 36];
    let at = |off: usize| off - 36;
    b[at(40)..at(44)].copy_from_slice(&(dsdt_addr as u32).to_le_bytes());
    // IAPC_BOOT_ARCH: VGA not present, CMOS RTC not present; no 8042, no
    // legacy devices.
    b[at(109)..at(111)].copy_from_slice(&((1u16 << 2) | (1 << 5)).to_le_bytes());
    // Flags: PWR_BUTTON and SLP_BUTTON absent, RESET_REG_SUP, HW_REDUCED_ACPI.
    let flags: u32 = (1 << 4) | (1 << 5) | (1 << 10) | (1 << 20);
    b[at(112)..at(116)].copy_from_slice(&flags.to_le_bytes());
    b[at(116)..at(128)].copy_from_slice(&gas_io(cfg.reset_port));
    b[at(128)] = cfg.reset_value;
    b[at(131)] = 5; // FADT minor version: ACPI 6.5
    b[at(140)..at(148)].copy_from_slice(&dsdt_addr.to_le_bytes());
    b[at(244)..at(256)].copy_from_slice(&gas_io(cfg.sleep_control_port));
    b[at(256)..at(268)].copy_from_slice(&gas_io(cfg.sleep_status_port));
    b[at(268)..at(276)].copy_from_slice(b"DOMUSVMM");
    sdt(b"FACP", 6, &b)
}

fn dsdt(cfg: &AcpiConfig) -> Vec<u8> {
    let mut aml = aml::name(
        "_S5",
        aml::package(&[aml::integer(S5_SLEEP_TYPE.into()), aml::integer(0)]),
    );
    // A hardware-reduced platform has no legacy PIC, so Linux maps no ISA
    // IRQs by itself: COM1's interrupt must come from its _CRS.
    aml.extend(aml::scope(
        "\\_SB",
        &[
            aml::device(
                "COM1",
                &[
                    aml::name("_HID", aml::string("PNP0501")),
                    aml::name("_UID", aml::integer(1)),
                    aml::name(
                        "_CRS",
                        aml::resource_template(cfg.serial_port, 8, Some(cfg.serial_irq)),
                    ),
                ],
            ),
            // The PCI root bridge: conventional PCI, config mechanism #1,
            // one bus. Devices use MSI-X only, so there is no _PRT.
            aml::device("PCI0", &pci0(cfg)),
            // The power button, notified by the GED's _EVT.
            aml::device(
                "PWRB",
                &[
                    aml::name("_HID", aml::string("PNP0C0C")),
                    aml::name("_UID", aml::integer(0)),
                ],
            ),
            aml::device(
                "GED0",
                &[
                    aml::name("_HID", aml::string("ACPI0013")),
                    aml::name("_UID", aml::integer(0)),
                    aml::name("_CRS", aml::edge_interrupt(cfg.ged_gsi)),
                    aml::io_region("GEDR", cfg.ged_port, 1),
                    aml::field("GEDR", aml::BYTE_ACC, &[("GEVT", 8)]),
                    aml::method(
                        "_EVT",
                        1,
                        &[
                            aml::store(aml::name_string("GEVT"), aml::local(0)),
                            aml::if_and(
                                aml::local(0),
                                GED_POWER_BUTTON.into(),
                                &[aml::notify("PWRB", 0x80)],
                            ),
                            aml::if_and(
                                aml::local(0),
                                GED_PCI_HOTPLUG.into(),
                                &[aml::call("\\_SB.PCI0.PCNT")],
                            ),
                            aml::if_and(
                                aml::local(0),
                                GED_VMGENID.into(),
                                &[aml::notify("VGEN", 0x80)],
                            ),
                        ],
                    ),
                ],
            ),
            // The VM generation ID: ADDR is its guest physical address as
            // (low, high) dwords.
            aml::device(
                "VGEN",
                &[
                    aml::name("_HID", aml::string("VMGENCTR")),
                    aml::name("_CID", aml::string("VM_Gen_Counter")),
                    aml::name("_DDN", aml::string("VM_Gen_Counter")),
                    aml::name(
                        "ADDR",
                        aml::package(&[
                            aml::integer(VMGENID_ADDR & 0xffff_ffff),
                            aml::integer(VMGENID_ADDR >> 32),
                        ]),
                    ),
                ],
            ),
            aml::device(
                "PEVT",
                &[
                    aml::name("_HID", aml::string("QEMU0001")),
                    aml::name("_CRS", aml::io_resource(cfg.pvpanic_port, 1)),
                ],
            ),
        ],
    ));
    sdt(b"DSDT", 6, &aml)
}

fn madt(cfg: &AcpiConfig) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&LAPIC_ADDR.to_le_bytes());
    b.extend_from_slice(&1u32.to_le_bytes()); // PCAT_COMPAT: there is an 8259
    for id in 0..cfg.vcpus {
        // Processor Local APIC: uid, APIC id, enabled.
        b.extend_from_slice(&[0, 8, id, id]);
        b.extend_from_slice(&1u32.to_le_bytes());
    }
    // I/O APIC 0 at its usual address, GSI base 0.
    b.extend_from_slice(&[1, 12, 0, 0]);
    b.extend_from_slice(&IOAPIC_ADDR.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    // Local APIC NMI on LINT1 of every processor.
    b.extend_from_slice(&[4, 6, 0xff, 0, 0, 1]);
    sdt(b"APIC", 5, &b)
}

fn align(v: &mut Vec<u8>, to: usize) {
    v.resize(v.len().div_ceil(to) * to, 0);
}

/// Builds all tables. Panics only if they outgrow the ACPI area, which the
/// vCPU limit (255) rules out.
pub fn build(cfg: &AcpiConfig) -> AcpiTables {
    let mut out = vec![0u8; 36]; // RSDP, filled in last
    align(&mut out, 64);
    let dsdt_off = out.len();
    out.extend(dsdt(cfg));
    align(&mut out, 16);
    let fadt_off = out.len();
    out.extend(fadt(cfg, ACPI_START + dsdt_off as u64));
    align(&mut out, 16);
    let madt_off = out.len();
    out.extend(madt(cfg));
    align(&mut out, 16);
    let xsdt_off = out.len();
    let mut entries = Vec::new();
    for off in [fadt_off, madt_off] {
        entries.extend_from_slice(&(ACPI_START + off as u64).to_le_bytes());
    }
    out.extend(sdt(b"XSDT", 1, &entries));
    assert!(
        out.len() as u64 <= VMGENID_ADDR - ACPI_START,
        "ACPI tables too large"
    );

    let mut rsdp = [0u8; 36];
    rsdp[0..8].copy_from_slice(b"RSD PTR ");
    rsdp[9..15].copy_from_slice(OEM_ID);
    rsdp[15] = 2; // ACPI 2.0+
    rsdp[20..24].copy_from_slice(&36u32.to_le_bytes());
    rsdp[24..32].copy_from_slice(&(ACPI_START + xsdt_off as u64).to_le_bytes());
    rsdp[8] = checksum(&rsdp[..20]);
    rsdp[32] = checksum(&rsdp);
    out[..36].copy_from_slice(&rsdp);
    AcpiTables {
        bytes: out,
        rsdp_addr: ACPI_START,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(vcpus: u8) -> AcpiConfig {
        AcpiConfig {
            vcpus,
            sleep_control_port: 0x600,
            sleep_status_port: 0x601,
            reset_port: 0x602,
            reset_value: 1,
            pvpanic_port: 0x505,
            serial_port: 0x3f8,
            serial_irq: 4,
            pci_config_port: 0xcf8,
            pci_mmio_base: 0xc000_0000,
            pci_mmio_len: 0x2000_0000,
            ged_port: 0x608,
            ged_gsi: 5,
            pci_hotplug_port: 0x610,
        }
    }

    fn sum(b: &[u8]) -> u8 {
        b.iter().fold(0u8, |a, x| a.wrapping_add(*x))
    }

    fn table_at(t: &AcpiTables, addr: u64) -> &[u8] {
        let off = (addr - ACPI_START) as usize;
        let len = u32::from_le_bytes(t.bytes[off + 4..off + 8].try_into().unwrap()) as usize;
        &t.bytes[off..off + len]
    }

    #[test]
    fn rsdp_checksums_and_points_to_xsdt() {
        let t = build(&cfg(2));
        assert_eq!(&t.bytes[0..8], b"RSD PTR ");
        assert_eq!(sum(&t.bytes[..20]), 0);
        assert_eq!(sum(&t.bytes[..36]), 0);
        let xsdt = u64::from_le_bytes(t.bytes[24..32].try_into().unwrap());
        assert_eq!(&table_at(&t, xsdt)[..4], b"XSDT");
    }

    #[test]
    fn every_table_checksums_to_zero() {
        let t = build(&cfg(4));
        let xsdt = table_at(&t, u64::from_le_bytes(t.bytes[24..32].try_into().unwrap()));
        assert_eq!(sum(xsdt), 0);
        let mut sigs = Vec::new();
        for e in xsdt[36..].chunks(8) {
            let tab = table_at(&t, u64::from_le_bytes(e.try_into().unwrap()));
            assert_eq!(sum(tab), 0, "{:?}", &tab[..4]);
            sigs.push(tab[..4].to_vec());
            if &tab[..4] == b"FACP" {
                assert_eq!(tab.len(), 276);
                let dsdt = u64::from_le_bytes(tab[140..148].try_into().unwrap());
                let d = table_at(&t, dsdt);
                assert_eq!(&d[..4], b"DSDT");
                assert_eq!(sum(d), 0);
            }
        }
        assert_eq!(sigs, vec![b"FACP".to_vec(), b"APIC".to_vec()]);
    }

    #[test]
    fn madt_lists_exactly_the_vcpus() {
        for n in [1u8, 2, 4, 255] {
            let t = build(&cfg(n));
            let xsdt = table_at(&t, u64::from_le_bytes(t.bytes[24..32].try_into().unwrap()));
            let madt = table_at(&t, u64::from_le_bytes(xsdt[44..52].try_into().unwrap()));
            let mut i = 44;
            let mut cpus = 0;
            while i < madt.len() {
                if madt[i] == 0 {
                    assert_eq!(madt[i + 3], cpus as u8, "APIC ids are 0..n");
                    cpus += 1;
                }
                i += madt[i + 1] as usize;
            }
            assert_eq!(i, madt.len());
            assert_eq!(cpus, n as usize);
        }
    }

    #[test]
    fn fadt_is_hardware_reduced_with_sleep_registers() {
        let t = build(&cfg(1));
        let xsdt = table_at(&t, u64::from_le_bytes(t.bytes[24..32].try_into().unwrap()));
        let fadt = table_at(&t, u64::from_le_bytes(xsdt[36..44].try_into().unwrap()));
        let flags = u32::from_le_bytes(fadt[112..116].try_into().unwrap());
        assert_ne!(flags & (1 << 20), 0);
        assert_eq!(&fadt[244..256], &gas_io(0x600));
        assert_eq!(&fadt[256..268], &gas_io(0x601));
        assert_eq!(&fadt[116..128], &gas_io(0x602));
        assert_eq!(fadt[128], 1);
    }

    #[test]
    fn dsdt_has_the_power_button_and_its_event_device() {
        let d = dsdt(&cfg(1));
        let has = |needle: &[u8]| d.windows(needle.len()).any(|w| w == needle);
        assert!(has(b"PNP0C0C\0"));
        assert!(has(b"ACPI0013\0"));
        // _EVT: one argument, serialized; Notify(PWRB, 0x80).
        assert!(has(b"_EVT\x09"));
        assert!(has(&[0x86, b'P', b'W', b'R', b'B', 0x0a, 0x80]));
        // Interrupt(ResourceConsumer, Edge, ActiveHigh, Exclusive) {5}.
        assert!(has(&[0x89, 0x06, 0x00, 0x03, 0x01, 5, 0, 0, 0]));
        // OperationRegion(GEDR, SystemIO, 0x608, 1).
        assert!(has(&[
            0x5b, 0x80, b'G', b'E', b'D', b'R', 1, 0x0b, 0x08, 0x06, 1
        ]));
        // The VM generation ID device Linux's vmgenid driver matches, and
        // its address: Name(ADDR, Package(2) {0xef000, 0}).
        assert!(has(b"VMGENCTR\0"));
        assert!(has(&[
            b'A', b'D', b'D', b'R', 0x12, 0x08, 2, 0x0c, 0x00, 0xf0, 0x0e, 0, 0x00
        ]));
    }
}
