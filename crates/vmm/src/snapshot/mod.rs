//! Saving a running domain and starting it again from what was saved.
//!
//! The file format (envelope, summary, checks) is `domus_api::snapshot`;
//! this module holds the machine state only the VMM reads ([`Machine`]),
//! takes it from a running domain ([`Snapshotter::save`]) and gives the
//! pieces back to `vm.rs` for a restore. `docs/snapshot-format.md`
//! describes every field.
//!
//! Taking a snapshot: the vCPUs are paused, then every device is stopped
//! (each completes the requests it took from its queues, so a queue
//! resumes at its used ring's index), then each vCPU reads its own state on
//! its thread, then the VM's interrupt controllers, PIT and clock are read,
//! then memory and the state file are written. Devices stopped for the
//! snapshot start again if the domain goes on running.

#[cfg(test)]
mod compat;
#[cfg(test)]
mod fuzz;
pub mod kvm;
pub mod memory;
pub mod request;

use std::fs::File;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use domus_api::domain::DomainConfig;
use domus_api::snapshot::{MemoryImage, SnapshotBody, Summary};
use domus_api::spec::VmSpec;
use domus_devices::bus::lock;
use domus_devices::serial::{SerialDevice, SerialState};
use domus_virtio::pci::VirtioPciState;
use domus_virtio::Memory;
use kvm_ioctls::VmFd;
use serde::{Deserialize, Serialize};

use crate::pause::{Pause, PauseError};
use crate::registry::{self, DeviceSpec};
use kvm::{CpuidLeaf, VcpuState, VmState};

pub use domus_api::snapshot::SnapshotError as FileError;

/// How long the vCPUs get to stop, and to read their state.
const VCPU_TIMEOUT: Duration = Duration::from_secs(5);
/// How long writing a snapshot's files may take.
const WRITE_TIMEOUT: Duration = Duration::from_secs(600);

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error(transparent)]
    File(#[from] FileError),
    #[error("{0}: {1}")]
    Kvm(&'static str, #[source] kvm_ioctls::Error),
    #[error("{0}: {1}")]
    Io(&'static str, #[source] std::io::Error),
    #[error("the snapshot's machine state: {0}")]
    Machine(String),
    #[error("this host's KVM lacks CPU features the saved guest was given: {0}")]
    Cpu(String),
    #[error("the memory file is truncated or too long ({got} bytes, the snapshot has {want})")]
    MemoryTruncated { got: u64, want: u64 },
    #[error("the memory file is corrupt (CRC-32 {got:#010x}, saved {want:#010x})")]
    MemoryCorrupt { got: u32, want: u32 },
    #[error("stopping the vCPUs: {0}")]
    Pause(#[from] PauseError),
    #[error("a vCPU could not be saved: {0}")]
    Vcpu(String),
    #[error("{0}")]
    Device(String),
    #[error("a snapshot of this domain is already being taken")]
    Busy,
}

/// The machine state in a snapshot, beside its [`Summary`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Machine {
    /// The CPUID KVM offered when the domain was built, before each
    /// vCPU's topology leaves were filled in: a restore gives the guest
    /// this, not what the new host offers.
    pub cpuid: Vec<CpuidLeaf>,
    pub vcpus: Vec<VcpuState>,
    pub vm: VmState,
    pub serial: SerialState,
    /// Virtio devices by PCI slot.
    pub devices: Vec<PciDeviceState>,
}

/// One virtio device: where it is, what it is made of, its transport.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PciDeviceState {
    pub slot: usize,
    /// Its name in the API (vda, net0, ...).
    pub id: String,
    pub spec: DeviceSpec,
    pub transport: VirtioPciState,
}

pub type Body = SnapshotBody<Machine>;

/// Where a snapshot is written: the state file and the memory file, open
/// for writing (the caller made them; a jailed VMM is handed them).
pub struct Target {
    pub state: File,
    pub memory: File,
    /// The memory file's name beside the state file.
    pub memory_name: String,
}

/// What a save did, for the API's answer.
#[derive(Debug)]
pub struct Saved {
    pub memory_bytes: u64,
    pub pages_stored: u64,
    pub state_bytes: u64,
    /// How long the guest was stopped for the snapshot.
    pub paused: Duration,
}

/// What a running domain needs to be saved.
pub struct Snapshotter {
    pub vm: Arc<VmFd>,
    pub mem: Arc<Memory>,
    pub devices: Arc<Mutex<Vec<registry::Device>>>,
    pub serial: Arc<Mutex<SerialDevice>>,
    pub pause: Arc<Pause>,
    pub vcpus: u32,
    pub cpuid: Vec<CpuidLeaf>,
    pub msrs: Vec<u32>,
    /// The domain as it was given (devices are filled in at each save).
    pub spec: VmSpec,
    pub busy: Mutex<()>,
}

/// A domain stopped for its state to be read: its vCPUs paused, its
/// devices quiesced (each finished the requests it had taken).
pub(crate) struct Stopped {
    /// Whether the user had paused it before.
    pub was_paused: bool,
    /// Its devices, by slot.
    pub devices: Vec<registry::Device>,
    /// What each virtio function kept when it stopped, in `devices` order.
    pub kept: Vec<domus_virtio::DeviceState>,
    pub at: Instant,
}

impl Snapshotter {
    /// Saves the domain into `to`. Afterwards it stays paused, unless
    /// `resume` (and the user had not paused it). If anything fails, the
    /// domain goes on as it was.
    pub fn save(
        &self,
        to: Target,
        domain: Option<DomainConfig>,
        resume: bool,
    ) -> Result<Saved, SnapshotError> {
        let _one = self.busy.try_lock().map_err(|_| SnapshotError::Busy)?;
        let stopped = self.stop()?;
        let (devices, was_paused, t0) = (stopped.devices.clone(), stopped.was_paused, stopped.at);
        let r = self.write(stopped, to, domain);
        if r.is_err() || resume {
            self.go_on(&devices, was_paused);
        }
        let paused = t0.elapsed();
        r.map(|mut s| {
            s.paused = paused;
            s
        })
    }

    /// Pauses the vCPUs and stops every device, for its state to be read.
    pub(crate) fn stop(&self) -> Result<Stopped, SnapshotError> {
        let was_paused = self.pause.is_paused();
        let at = Instant::now();
        self.pause.pause(self.vcpus as usize, VCPU_TIMEOUT)?;
        let devices: Vec<registry::Device> = {
            let mut d = lock(&self.devices).clone();
            d.sort_by_key(|d| d.slot);
            d
        };
        let mut kept = Vec::new();
        for d in &devices {
            if let Some(f) = &d.function {
                kept.push(lock(&f.transport).quiesce());
            }
        }
        Ok(Stopped {
            was_paused,
            devices,
            kept,
            at,
        })
    }

    /// Starts again what [`Snapshotter::stop`] stopped: the devices, and
    /// the vCPUs unless the user had paused them.
    pub(crate) fn go_on(&self, devices: &[registry::Device], was_paused: bool) {
        // Restarted from vCPU 0's thread, as a driver starts them: the
        // threads a device starts inherit their starter's seccomp
        // filter, and the API's allows no disk I/O.
        let list = devices.to_vec();
        let restart = move || {
            for d in &list {
                if let Some(f) = &d.function {
                    if let Err(e) = lock(&f.transport).resume() {
                        eprintln!("domus: after the snapshot, {e}");
                    }
                }
            }
        };
        if let Err(e) = self.on_vcpu0(VCPU_TIMEOUT, restart) {
            eprintln!("domus: after the snapshot, devices not restarted: {e}");
        }
        if !was_paused {
            self.pause.resume();
        }
    }

    /// Runs `f` on vCPU 0's thread (the domain is paused) and returns
    /// what it returned. Files are written there: a vCPU thread's filter
    /// allows disk I/O, the API's does not.
    fn on_vcpu0<T: Send + 'static>(
        &self,
        timeout: Duration,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, SnapshotError> {
        type Slot<F, T> = Arc<Mutex<(Option<F>, Option<T>)>>;
        let slot: Slot<_, T> = Arc::new(Mutex::new((Some(f), None)));
        let s2 = slot.clone();
        self.pause.on_vcpus(
            Arc::new(move |id, _| {
                if id == 0 {
                    let f = lock(&s2).0.take();
                    if let Some(f) = f {
                        let r = f();
                        lock(&s2).1 = Some(r);
                    }
                }
            }),
            timeout,
        )?;
        let r = lock(&slot).1.take();
        r.ok_or_else(|| SnapshotError::Vcpu("vCPU 0 did not answer".into()))
    }

    /// The machine state of a stopped domain, and its spec with the
    /// devices it has now.
    pub(crate) fn machine(&self, stopped: Stopped) -> Result<(Machine, VmSpec), SnapshotError> {
        let states: Arc<Mutex<Vec<Result<VcpuState, String>>>> = Arc::default();
        let (out, msrs) = (states.clone(), self.msrs.clone());
        self.pause.on_vcpus(
            Arc::new(move |id, fd| {
                let r = kvm::save_vcpu(id, fd, &msrs).map_err(|e| format!("vCPU {id}: {e}"));
                lock(&out).push(r);
            }),
            VCPU_TIMEOUT,
        )?;
        let mut vcpus = std::mem::take(&mut *lock(&states))
            .into_iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(SnapshotError::Vcpu)?;
        vcpus.sort_by_key(|v| v.id);
        if vcpus.len() != self.vcpus as usize {
            return Err(SnapshotError::Vcpu(format!(
                "{} of {} vCPUs answered",
                vcpus.len(),
                self.vcpus
            )));
        }
        let vm = kvm::save_vm(&self.vm)?;
        let serial = lock(&self.serial).state();
        let mut pci = Vec::new();
        let mut spec = VmSpec {
            disks: Vec::new(),
            nets: Vec::new(),
            vsock_cid: None,
            rng: false,
            balloon: false,
            balloon_target_mib: None,
            api_socket: None,
            exit_file: None,
            jail: None,
            ..self.spec.clone()
        };
        let functions = stopped
            .devices
            .iter()
            .filter_map(|d| Some((d, d.function.as_ref()?)));
        for ((d, f), device) in functions.zip(stopped.kept) {
            match &f.spec {
                DeviceSpec::Block { disk } => spec.disks.push(disk.clone()),
                DeviceSpec::Net { net } => spec.nets.push(net.clone()),
                DeviceSpec::Vsock { cid } => spec.vsock_cid = Some(*cid),
                DeviceSpec::Rng => spec.rng = true,
                DeviceSpec::Balloon => spec.balloon = true,
            }
            pci.push(PciDeviceState {
                slot: d.slot,
                id: d.id.clone(),
                spec: f.spec.clone(),
                transport: lock(&f.transport).state(device),
            });
        }
        let machine = Machine {
            cpuid: self.cpuid.clone(),
            vcpus,
            vm,
            serial,
            devices: pci,
        };
        Ok((machine, spec))
    }

    /// The state file's bytes for `machine` and `spec`, whose memory is
    /// `memory`.
    pub(crate) fn state_file(
        machine: Machine,
        spec: VmSpec,
        domain: Option<DomainConfig>,
        paused: bool,
        memory: MemoryImage,
    ) -> Result<Vec<u8>, SnapshotError> {
        let body = Body {
            summary: Summary {
                domus: env!("CARGO_PKG_VERSION").into(),
                created: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
                spec,
                domain,
                paused,
                memory,
            },
            machine,
        };
        domus_api::snapshot::encode(&body).map_err(SnapshotError::Machine)
    }

    fn write(
        &self,
        stopped: Stopped,
        to: Target,
        domain: Option<DomainConfig>,
    ) -> Result<Saved, SnapshotError> {
        let was_paused = stopped.was_paused;
        let (machine, spec) = self.machine(stopped)?;
        let (mem, mfile) = (self.mem.clone(), to.memory);
        let m = self.on_vcpu0(WRITE_TIMEOUT, move || memory::save(&mem, &mfile))??;
        let image = MemoryImage {
            file: to.memory_name,
            bytes: m.bytes,
            crc32: m.crc32,
            pages_stored: m.pages_stored,
            regions: m.regions,
        };
        let bytes = Self::state_file(machine, spec, domain, was_paused, image)?;
        let (mut f, state) = (to.state, bytes.clone());
        self.on_vcpu0(WRITE_TIMEOUT, move || {
            f.set_len(0)
                .and_then(|()| f.write_all(&state))
                .and_then(|()| f.sync_all())
        })?
        .map_err(|e| SnapshotError::Io("writing the state file", e))?;
        Ok(Saved {
            memory_bytes: m.bytes,
            pages_stored: m.pages_stored,
            state_bytes: bytes.len() as u64,
            paused: Duration::ZERO,
        })
    }
}

/// The spec a restored domain runs with: the saved domain's devices and
/// machine, with what concerns only this VMM process (name, console, API
/// socket, exit file, jail, seccomp, prefault) from `given`. Taps and disk
/// paths may be renamed by `given` (a daemon's taps, a clone's disks):
/// when it lists disks or interfaces, it lists as many as were saved, in
/// order, and a saved MAC is kept unless `given` sets one.
pub fn restored_spec(saved: &VmSpec, given: &VmSpec) -> Result<VmSpec, String> {
    let mut s = VmSpec {
        name: given.name.clone(),
        console: given.console.clone(),
        api_socket: given.api_socket.clone(),
        exit_file: given.exit_file.clone(),
        jail: given.jail.clone(),
        seccomp: given.seccomp,
        prefault: given.prefault,
        mergeable: given.mergeable,
        // A clone takes a CID of its own; the guest reads it again at the
        // transport reset its vsock device sends when it starts.
        vsock_cid: given.vsock_cid.or(saved.vsock_cid),
        ..saved.clone()
    };
    // Renames come in full or not at all.
    let full = |what: &str, given: usize, saved: usize| match given {
        0 => Ok(false),
        n if n == saved => Ok(true),
        n => Err(format!("{n} {what} given, the snapshot has {saved}")),
    };
    if full("disks", given.disks.len(), saved.disks.len())? {
        for (d, g) in s.disks.iter_mut().zip(&given.disks) {
            d.path = g.path.clone();
            d.passed = g.passed;
        }
    }
    if full("interfaces", given.nets.len(), saved.nets.len())? {
        for (n, g) in s.nets.iter_mut().zip(&given.nets) {
            n.tap = g.tap.clone();
            n.passed = g.passed;
            if g.mac.is_some() {
                n.mac = g.mac.clone();
            }
        }
    }
    Ok(s)
}

/// The machine's device list with the renames of [`restored_spec`]
/// applied: the n-th disk (interface) of `spec` replaces the n-th saved
/// one's path (tap, MAC), and its vsock CID replaces the saved one.
pub fn renamed_devices(m: &Machine, spec: &VmSpec) -> Vec<PciDeviceState> {
    let (mut disks, mut nets) = (spec.disks.iter(), spec.nets.iter());
    m.devices
        .iter()
        .map(|d| {
            let mut d = d.clone();
            match &mut d.spec {
                DeviceSpec::Block { disk } => {
                    if let Some(g) = disks.next() {
                        *disk = g.clone();
                    }
                }
                DeviceSpec::Net { net } => {
                    if let Some(g) = nets.next() {
                        *net = g.clone();
                    }
                }
                DeviceSpec::Vsock { cid } => {
                    if let Some(c) = spec.vsock_cid {
                        *cid = c;
                    }
                }
                _ => {}
            }
            d
        })
        .collect()
}
