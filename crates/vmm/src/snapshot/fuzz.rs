//! Hostile state files: the v1 fixture's body mutated where it is
//! structured (numbers set to edge values, strings and arrays emptied,
//! cut short or grown, fields dropped or added), given a valid header and
//! checksum so the mutation reaches the parsers and checks behind them,
//! then put through everything a restore does before it asks KVM:
//! decoding, CPUID checks, the memory layout check, COM1's state, every
//! KVM structure's size, and each device's transport restored on a device
//! of the fixture's shape, then its PCI config space and BAR read. Each
//! must refuse or accept; none may panic. (Test-only; deterministic, so a
//! failure reproduces.)

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use domus_api::snapshot::Header;
use domus_devices::pci::PciDevice;
use domus_devices::serial::SerialDevice;
use domus_virtio::fuzz::Rng;
use domus_virtio::Memory;
use kvm_bindings::{
    kvm_debugregs, kvm_irqchip, kvm_lapic_state, kvm_pit_state2, kvm_regs, kvm_sregs,
    kvm_vcpu_events, kvm_xcrs, kvm_xsave,
};
use serde_json::Value;
use vmm_sys_util::eventfd::EventFd;

use super::compat::{transport_of, FIXTURE};
use super::kvm::{check_cpuid, cpuid_from, time_away, unblob};
use super::Body;

const EDGES: [i128; 10] = [
    0,
    1,
    -1,
    255,
    256,
    65_535,
    65_536,
    u32::MAX as i128,
    i64::MAX as i128,
    u64::MAX as i128,
];

/// Mutates one node of `v`, reached by a random walk from the root.
fn mutate(rng: &mut Rng, v: &mut Value) {
    let mut node = v;
    for depth in 0.. {
        // Past the top levels, whose objects are all required fields.
        let stop = depth > 2 && rng.below(4) == 0;
        let next = match node {
            Value::Object(m) if !m.is_empty() && !stop => {
                let k = m.keys().nth(rng.below(m.len())).cloned();
                k.map(|k| (Some(k), None))
            }
            Value::Array(a) if !a.is_empty() && !stop => Some((None, Some(rng.below(a.len())))),
            _ => None,
        };
        match next {
            Some((Some(k), _)) => node = node.get_mut(&k).expect("a key just listed"),
            Some((None, Some(i))) => node = node.get_mut(i).expect("an index in range"),
            _ => break,
        }
    }
    match node {
        Value::Number(_) | Value::Bool(_) | Value::Null => {
            let e = EDGES[rng.below(EDGES.len())];
            // Mostly a number still (most fields are), so that the
            // mutation gets past the decoder to the checks behind it.
            *node = match rng.below(12) {
                0 => Value::Null,
                1 => Value::String("x".into()),
                2 => Value::Bool(true),
                _ => serde_json::from_str(&e.to_string()).expect("a number"),
            };
        }
        Value::String(s) => match rng.below(3) {
            0 => s.clear(),
            1 => s.push_str("../../etc/shadow"),
            _ => *node = Value::from(EDGES[rng.below(EDGES.len())] as i64),
        },
        Value::Array(a) => match rng.below(4) {
            0 => a.clear(),
            1 if !a.is_empty() => {
                let cut = rng.below(a.len());
                a.truncate(cut);
            }
            2 if !a.is_empty() => {
                let dup = a[rng.below(a.len())].clone();
                for _ in 0..1 + rng.below(300) {
                    a.push(dup.clone());
                }
            }
            _ => a.push(Value::from(EDGES[rng.below(EDGES.len())] as i64)),
        },
        Value::Object(m) => {
            if rng.below(2) == 0 && !m.is_empty() {
                let k = m
                    .keys()
                    .nth(rng.below(m.len()))
                    .cloned()
                    .expect("not empty");
                m.remove(&k);
            } else {
                m.insert("unknown".into(), Value::from(1));
            }
        }
    }
}

/// A state file of `body` with a valid header.
fn file_of(body: &Value) -> Vec<u8> {
    let b = serde_json::to_vec(body).expect("serialisable");
    let header = Header {
        format: "domus-snapshot".into(),
        version: 1,
        body_bytes: b.len() as u64,
        body_crc32: crc32fast::hash(&b),
    };
    let mut out = serde_json::to_vec(&header).expect("serialisable");
    out.push(b'\n');
    out.extend_from_slice(&b);
    out
}

/// Everything a restore does with a decoded body before KVM; refusals are
/// fine, panics are not.
fn restore_parts(body: &Body, shapes: &[(u32, usize)], mem: &Arc<Memory>, memfile: &Path) {
    let (s, m) = (&body.summary, &body.machine);
    if let Ok(c) = cpuid_from(&m.cpuid) {
        let _ = check_cpuid(&m.cpuid, &c);
    }
    let file = std::fs::File::open(memfile).expect("the memory file");
    let ranges = domus_boot::layout::ram_ranges(s.spec.memory_mib.saturating_mul(1 << 20));
    let _ = super::memory::check(&s.memory.regions, &ranges, &file, s.memory.bytes);
    let _ = domus_api::snapshot::memory_path(Path::new("/s/a.snap"), &s.memory);
    let _ = time_away(&m.vm);
    for v in &m.vcpus {
        let _ = unblob::<kvm_regs>("regs", &v.regs);
        let _ = unblob::<kvm_sregs>("sregs", &v.sregs);
        let _ = unblob::<kvm_xsave>("xsave", &v.xsave);
        let _ = unblob::<kvm_xcrs>("xcrs", &v.xcrs);
        let _ = unblob::<kvm_debugregs>("debug", &v.debug_regs);
        let _ = unblob::<kvm_lapic_state>("lapic", &v.lapic);
        let _ = unblob::<kvm_vcpu_events>("events", &v.events);
    }
    for b in [&m.vm.pic_master, &m.vm.pic_slave, &m.vm.ioapic] {
        let _ = unblob::<kvm_irqchip>("irqchip", b);
    }
    let _ = unblob::<kvm_pit_state2>("pit", &m.vm.pit);
    let irq = EventFd::new(libc::EFD_NONBLOCK).expect("an eventfd");
    if let Ok(mut serial) = SerialDevice::from_state(&m.serial, irq, Box::new(std::io::sink())) {
        use domus_devices::bus::PioDevice;
        for off in 0..8 {
            let mut b = [0u8];
            serial.read(off, &mut b);
        }
    }
    // Each saved transport on the device the fixture had in its place.
    for (d, shape) in m.devices.iter().zip(shapes) {
        let mut pci = transport_of(&d.id, *shape, mem);
        if pci.restore(&d.transport).is_ok() {
            for reg in 0..64 {
                let _ = pci.config_read(reg);
            }
            for off in (0..0x4000u64).step_by(0x3f7) {
                let mut b = [0u8; 4];
                pci.bar_read(0, off, &mut b);
            }
        }
    }
}

#[test]
fn hostile_state_files_are_refused_or_restored_never_a_panic() {
    let text = std::fs::read(FIXTURE).expect("the fixture");
    let at = text
        .iter()
        .position(|b| *b == b'\n')
        .expect("a header line");
    let body: Value = serde_json::from_slice(&text[at + 1..]).expect("the fixture's body");
    let fixture: Body = serde_json::from_value(body.clone()).expect("the fixture decodes");
    let shapes: Vec<(u32, usize)> = fixture
        .machine
        .devices
        .iter()
        .map(|d| (d.transport.device_type, d.transport.queues.len()))
        .collect();
    let mem = Arc::new(
        Memory::from_ranges(&[(vm_memory::GuestAddress(0), 1 << 20)]).expect("test memory"),
    );
    let dir = std::env::temp_dir().join(format!("domus-snapfuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let memfile = dir.join("a.snap.mem");
    std::fs::File::create(&memfile)
        .and_then(|f| f.set_len(fixture.summary.memory.bytes))
        .expect("a sparse memory file");
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut decoded, mut runs) = (0, 0);
    for _ in 0..3000 {
        let mut v = body.clone();
        for _ in 0..1 + rng.below(2) {
            mutate(&mut rng, &mut v);
        }
        let file = file_of(&v);
        runs += 1;
        // A panic here names the input: write it where it can be read.
        let dump = dir.join("last-input.state");
        std::fs::File::create(&dump)
            .and_then(|mut f| f.write_all(&file))
            .expect("writing the input");
        if let Ok(b) = domus_api::snapshot::decode::<super::Machine>(&file[..], &dump) {
            decoded += 1;
            restore_parts(&b, &shapes, &mem, &memfile);
        }
    }
    // The mutations must reach past the decoder often enough to mean
    // something.
    assert!(decoded > runs / 5, "only {decoded} of {runs} decoded");
    std::fs::remove_dir_all(&dir).expect("removing the scratch directory");
}
