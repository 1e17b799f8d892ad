//! A tiny ACPI Machine Language encoder: just what the DSDT needs (names,
//! packages, devices, scopes, integers, strings, resource templates, and the
//! few statements of the Generic Event Device's `_EVT` method: an I/O
//! operation region with one field, `Store`, `And`, `If` and `Notify`).

/// Encodes a PkgLength for `content` bytes that follow it; the encoded
/// length counts the PkgLength bytes themselves (ACPI 6.4, 20.2.4).
pub fn pkg_length(content: usize) -> Vec<u8> {
    if content + 1 < 0x40 {
        return vec![(content + 1) as u8];
    }
    for extra in 1..=3usize {
        let total = content + 1 + extra;
        if total < 1 << (4 + 8 * extra) {
            let mut out = vec![((extra as u8) << 6) | (total & 0xf) as u8];
            for i in 0..extra {
                out.push((total >> (4 + 8 * i)) as u8);
            }
            return out;
        }
    }
    panic!("AML package too large: {content} bytes");
}

/// A 4-character name segment, padded with '_'.
pub fn name_seg(name: &str) -> [u8; 4] {
    assert!(
        name.len() <= 4 && !name.is_empty(),
        "bad AML name segment {name:?}"
    );
    let mut seg = [b'_'; 4];
    seg[..name.len()].copy_from_slice(name.as_bytes());
    seg
}

/// A NameString: an optional root prefix `\` and one or more name
/// segments separated by dots (`\_SB.PCI0.PCNT`).
pub fn name_string(path: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let rest = match path.strip_prefix('\\') {
        Some(rest) => {
            out.push(b'\\');
            rest
        }
        None => path,
    };
    let segs: Vec<&str> = rest.split('.').collect();
    match segs.len() {
        1 => {}
        2 => out.push(0x2e), // DualNamePrefix
        n => {
            out.push(0x2f); // MultiNamePrefix
            out.push(n as u8);
        }
    }
    for seg in segs {
        out.extend_from_slice(&name_seg(seg));
    }
    out
}

pub fn integer(v: u64) -> Vec<u8> {
    match v {
        0 => vec![0x00],
        1 => vec![0x01],
        2..=0xff => vec![0x0a, v as u8],
        0x100..=0xffff => {
            let mut o = vec![0x0b];
            o.extend_from_slice(&(v as u16).to_le_bytes());
            o
        }
        0x1_0000..=0xffff_ffff => {
            let mut o = vec![0x0c];
            o.extend_from_slice(&(v as u32).to_le_bytes());
            o
        }
        _ => {
            let mut o = vec![0x0e];
            o.extend_from_slice(&v.to_le_bytes());
            o
        }
    }
}

pub fn string(s: &str) -> Vec<u8> {
    let mut o = vec![0x0d];
    o.extend_from_slice(s.as_bytes());
    o.push(0);
    o
}

/// `Name(path, value)`.
pub fn name(path: &str, value: Vec<u8>) -> Vec<u8> {
    let mut o = vec![0x08];
    o.extend(name_string(path));
    o.extend(value);
    o
}

/// `Package() { elements }`.
pub fn package(elements: &[Vec<u8>]) -> Vec<u8> {
    let mut body = vec![elements.len() as u8];
    for e in elements {
        body.extend_from_slice(e);
    }
    let mut o = vec![0x12];
    o.extend(pkg_length(body.len()));
    o.extend(body);
    o
}

fn named_block(opcode: &[u8], path: &str, children: &[Vec<u8>]) -> Vec<u8> {
    let mut body = name_string(path);
    for c in children {
        body.extend_from_slice(c);
    }
    let mut o = opcode.to_vec();
    o.extend(pkg_length(body.len()));
    o.extend(body);
    o
}

/// `Scope(path) { children }`.
pub fn scope(path: &str, children: &[Vec<u8>]) -> Vec<u8> {
    named_block(&[0x10], path, children)
}

/// `Device(name) { children }`.
pub fn device(name: &str, children: &[Vec<u8>]) -> Vec<u8> {
    named_block(&[0x5b, 0x82], name, children)
}

/// `ResourceTemplate() { IO(Decode16, port, port, 1, len) }` as a Buffer.
pub fn io_resource(port: u16, len: u8) -> Vec<u8> {
    resource_template(port, len, None)
}

/// `ResourceTemplate() { IO(Decode16, port, port, 1, len) [IRQNoFlags() {irq}] }`:
/// an I/O range and, optionally, an ISA interrupt (edge, active high).
pub fn resource_template(port: u16, len: u8, irq: Option<u8>) -> Vec<u8> {
    let p = port.to_le_bytes();
    let mut data = vec![0x47, 0x01, p[0], p[1], p[0], p[1], 0x01, len];
    if let Some(irq) = irq {
        assert!(irq < 16, "ISA IRQ {irq}");
        let mask = (1u16 << irq).to_le_bytes();
        data.extend_from_slice(&[0x22, mask[0], mask[1]]);
    }
    template(data)
}

/// Wraps resource descriptors in `ResourceTemplate() { ... }` (a Buffer
/// with the end tag).
fn template(mut data: Vec<u8>) -> Vec<u8> {
    data.extend_from_slice(&[0x79, 0x00]); // end tag, checksum 0 = ignore
    let mut body = integer(data.len() as u64);
    body.extend(data);
    let mut o = vec![0x11];
    o.extend(pkg_length(body.len()));
    o.extend(body);
    o
}

/// The `_CRS` of a PCI root bridge: bus numbers 0..=0 (WordBusNumber), the
/// config ports (IO) and one 32-bit memory window for BARs (DWordMemory,
/// non-cacheable, read-write). All ranges are fixed and produced by the bridge.
pub fn pci_root_resources(config_port: u16, mmio_base: u32, mmio_len: u32) -> Vec<u8> {
    assert!(mmio_len > 0);
    let mut d = Vec::new();
    // Word address space descriptor, bus number range.
    d.extend_from_slice(&[0x88, 0x0d, 0x00, 0x02, 0x0c, 0x00]);
    for v in [0u16, 0, 0, 0, 1] {
        d.extend_from_slice(&v.to_le_bytes()); // granularity, min, max, translation, length
    }
    let p = config_port.to_le_bytes();
    d.extend_from_slice(&[0x47, 0x01, p[0], p[1], p[0], p[1], 0x01, 0x08]);
    // DWord address space descriptor, memory range.
    d.extend_from_slice(&[0x87, 0x17, 0x00, 0x00, 0x0c, 0x01]);
    for v in [0u32, mmio_base, mmio_base + (mmio_len - 1), 0, mmio_len] {
        d.extend_from_slice(&v.to_le_bytes());
    }
    template(d)
}

/// `ResourceTemplate() { Interrupt(ResourceConsumer, Edge, ActiveHigh,
/// Exclusive) { gsi } }`: one extended interrupt descriptor.
pub fn edge_interrupt(gsi: u32) -> Vec<u8> {
    let mut d = vec![0x89, 0x06, 0x00, 0x03, 0x01];
    d.extend_from_slice(&gsi.to_le_bytes());
    template(d)
}

/// `OperationRegion(name, SystemIO, port, len)`.
pub fn io_region(name: &str, port: u16, len: u8) -> Vec<u8> {
    let mut o = vec![0x5b, 0x80];
    o.extend(name_string(name));
    o.push(0x01); // SystemIO
    o.extend(integer(port.into()));
    o.extend(integer(len.into()));
    o
}

/// Field access widths.
pub const BYTE_ACC: u8 = 1;
pub const DWORD_ACC: u8 = 3;

/// `Field(region, access, NoLock, Preserve) { name, bits, ... }`: field
/// units one after the other from the start of the region.
pub fn field(region: &str, access: u8, units: &[(&str, u8)]) -> Vec<u8> {
    let mut body = name_string(region);
    body.push(access); // NoLock, Preserve: the other bits 0
    for (name, bits) in units {
        assert!(*bits < 0x40, "field unit of {bits} bits");
        body.extend_from_slice(&name_seg(name));
        body.push(*bits);
    }
    let mut o = vec![0x5b, 0x81];
    o.extend(pkg_length(body.len()));
    o.extend(body);
    o
}

/// `Method(name, args, Serialized) { body }`.
pub fn method(name: &str, args: u8, body: &[Vec<u8>]) -> Vec<u8> {
    assert!(args < 8);
    let mut b = name_string(name);
    b.push(args | 0x08); // serialized
    for s in body {
        b.extend_from_slice(s);
    }
    let mut o = vec![0x14];
    o.extend(pkg_length(b.len()));
    o.extend(b);
    o
}

/// `LocalN` as an operand.
pub fn local(n: u8) -> Vec<u8> {
    assert!(n < 8);
    vec![0x60 + n]
}

/// `Store(source, target)`; both are encoded terms (a name, a local, an
/// integer for the source).
pub fn store(source: Vec<u8>, target: Vec<u8>) -> Vec<u8> {
    let mut o = vec![0x70];
    o.extend(source);
    o.extend(target);
    o
}

/// `If (And(operand, mask)) { body }`.
pub fn if_and(operand: Vec<u8>, mask: u64, body: &[Vec<u8>]) -> Vec<u8> {
    let mut b = vec![0x7b];
    b.extend(operand);
    b.extend(integer(mask));
    b.push(0x00); // no target
    for s in body {
        b.extend_from_slice(s);
    }
    let mut o = vec![0xa0];
    o.extend(pkg_length(b.len()));
    o.extend(b);
    o
}

/// A call of a method that takes no arguments.
pub fn call(path: &str) -> Vec<u8> {
    name_string(path)
}

/// `Notify(object, value)`.
pub fn notify(object: &str, value: u8) -> Vec<u8> {
    let mut o = vec![0x86];
    o.extend(name_string(object));
    o.extend(integer(value.into()));
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pkg_length_one_byte() {
        assert_eq!(pkg_length(4), vec![5]);
        assert_eq!(pkg_length(0x3e), vec![0x3f]);
    }

    #[test]
    fn pkg_length_two_bytes() {
        // 0x3f content bytes + 2 length bytes = 0x41.
        assert_eq!(pkg_length(0x3f), vec![0x41, 0x04]);
        assert_eq!(pkg_length(0x100), vec![0x42, 0x10]);
    }

    #[test]
    fn pkg_length_three_bytes() {
        let enc = pkg_length(0x1000);
        assert_eq!(enc.len(), 3);
        let total = (enc[0] as usize & 0xf) | (enc[1] as usize) << 4 | (enc[2] as usize) << 12;
        assert_eq!(total, 0x1000 + 3);
    }

    #[test]
    fn s5_package_matches_iasl() {
        // iasl: Name (_S5, Package (0x02) { 0x05, Zero })
        let got = name("_S5", package(&[integer(5), integer(0)]));
        assert_eq!(
            got,
            vec![0x08, b'_', b'S', b'5', b'_', 0x12, 0x05, 0x02, 0x0a, 0x05, 0x00]
        );
    }

    #[test]
    fn integers_use_the_smallest_encoding() {
        assert_eq!(integer(0), vec![0]);
        assert_eq!(integer(1), vec![1]);
        assert_eq!(integer(0x505), vec![0x0b, 0x05, 0x05]);
        assert_eq!(integer(0x1_0000), vec![0x0c, 0, 0, 1, 0]);
        assert_eq!(integer(1 << 40)[0], 0x0e);
    }

    #[test]
    fn io_resource_is_a_buffer_with_end_tag() {
        let r = io_resource(0x505, 1);
        assert_eq!(
            r,
            vec![0x11, 0x0d, 0x0a, 0x0a, 0x47, 1, 5, 5, 5, 5, 1, 1, 0x79, 0]
        );
    }

    #[test]
    fn irq_descriptor_sets_the_mask_bit() {
        let r = resource_template(0x3f8, 8, Some(4));
        // Buffer(15) { IO..., IRQNoFlags {4}, EndTag }
        assert_eq!(&r[..4], &[0x11, 0x10, 0x0a, 0x0d]);
        assert_eq!(&r[12..15], &[0x22, 0x10, 0x00]);
        assert_eq!(&r[15..], &[0x79, 0x00]);
    }

    #[test]
    fn device_wraps_children() {
        let d = device("PEVT", &[name("_HID", string("QEMU0001"))]);
        assert_eq!(&d[..2], &[0x5b, 0x82]);
        assert_eq!(d[2] as usize, d.len() - 2);
        assert_eq!(&d[3..7], b"PEVT");
    }

    #[test]
    fn root_scope_name() {
        assert_eq!(name_string("\\_SB"), vec![b'\\', b'_', b'S', b'B', b'_']);
    }

    #[test]
    fn multi_segment_names() {
        assert_eq!(name_string("\\_SB.PCI0"), b"\\\x2e_SB_PCI0".to_vec());
        assert_eq!(
            name_string("\\_SB.PCI0.PCNT"),
            b"\\\x2f\x03_SB_PCI0PCNT".to_vec()
        );
        assert_eq!(name_string("S01"), b"S01_".to_vec());
    }

    #[test]
    fn pci_root_resources_layout() {
        let r = pci_root_resources(0xcf8, 0xc000_0000, 0x2000_0000);
        // Buffer { 16 (bus) + 8 (io) + 26 (memory) + 2 (end) = 52 bytes }.
        assert_eq!(&r[..4], &[0x11, 0x37, 0x0a, 52]);
        let d = &r[4..];
        assert_eq!(&d[..6], &[0x88, 0x0d, 0, 2, 0x0c, 0]);
        assert_eq!(&d[14..16], &[1, 0], "one bus");
        assert_eq!(&d[16..20], &[0x47, 1, 0xf8, 0x0c]);
        assert_eq!(&d[24..30], &[0x87, 0x17, 0, 0, 0x0c, 1]);
        assert_eq!(&d[34..38], &0xc000_0000u32.to_le_bytes());
        assert_eq!(&d[38..42], &0xdfff_ffffu32.to_le_bytes());
        assert_eq!(&d[46..50], &0x2000_0000u32.to_le_bytes());
        assert_eq!(&d[50..], &[0x79, 0]);
    }
}
