//! Does /dev/kvm run guest kernel-mode code at hardware speed? A tiny guest
//! runs a counted loop in 64-bit ring 0; on a VT-x/AMD-V host that takes well
//! under a nanosecond per iteration, on a software virtualizer hundreds.

use std::time::Instant;

use domus_boot::longmode;
use kvm_ioctls::{Kvm, VcpuExit};
use vm_memory::{Bytes, GuestAddress};

use crate::{kvm_err, Error, Result};

pub const ITERATIONS: u32 = 1_000_000;
/// Above this many nanoseconds per iteration, kernel code is not running
/// natively (hardware is around 0.3, nested hardware virtualization a few).
pub const NATIVE_LIMIT_NS: f64 = 20.0;

const CODE_ADDR: u64 = 0x4000;

pub struct ProbeResult {
    pub ns_per_iteration: f64,
    /// Set when KVM could not run the code at all.
    pub failure: Option<String>,
}

impl ProbeResult {
    pub fn native(&self) -> bool {
        self.failure.is_none() && self.ns_per_iteration < NATIVE_LIMIT_NS
    }
}

pub fn probe() -> Result<ProbeResult> {
    let kvm = Kvm::new().map_err(Error::OpenKvm)?;
    let vm = kvm.create_vm().map_err(kvm_err("KVM_CREATE_VM"))?;
    let mem: domus_virtio::Memory =
        crate::memory::allocate(&[(0, 2 << 20)]).map_err(|e| Error::Memory(2, e))?;
    // `vm` is dropped before `mem` at the end of this function.
    crate::vm::register_memory(&vm, &mem)?;
    let seg = longmode::setup(&mem)?;
    // mov ecx, ITERATIONS; 1: dec ecx; jnz 1b; hlt
    let mut code = vec![0xb9];
    code.extend_from_slice(&ITERATIONS.to_le_bytes());
    code.extend_from_slice(&[0xff, 0xc9, 0x75, 0xfc, 0xf4]);
    mem.write_slice(&code, GuestAddress(CODE_ADDR))?;
    let mut vcpu = vm.create_vcpu(0).map_err(kvm_err("KVM_CREATE_VCPU"))?;
    crate::vcpu::setup_long_mode(&vcpu, &seg, CODE_ADDR, 0)?;
    let start = Instant::now();
    let failure = loop {
        match vcpu.run() {
            Ok(VcpuExit::Hlt) => break None,
            Ok(VcpuExit::Intr) => continue,
            Ok(other) => break Some(format!("{other:?}")),
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => continue,
            Err(e) => break Some(e.to_string()),
        }
    };
    let ns = start.elapsed().as_nanos() as f64 / f64::from(ITERATIONS);
    drop(vcpu);
    drop(vm);
    Ok(ProbeResult {
        ns_per_iteration: ns,
        failure,
    })
}
