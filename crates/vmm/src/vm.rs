//! Building and running one domain.

use std::fs::File;
use std::sync::mpsc::channel;
use std::sync::{Arc, Mutex};

use domus_api::snapshot::MemoryImage;
use domus_boot::acpi::{self, AcpiConfig};
use domus_boot::layout::{self, ACPI_START, CMDLINE_ADDR, KVM_TSS_ADDR, ZERO_PAGE_ADDR};
use domus_boot::{kernel, longmode, params};
use domus_devices::hotplug::{HotplugPorts, PciHotplug, PCI_HOTPLUG_LEN, PCI_HOTPLUG_PORT};
use domus_devices::pci::{self, PciBus};
use domus_devices::platform::{self, AcpiPm, Ged, GedEvents, PvPanic, I8042};
use domus_devices::serial::{SerialDevice, COM1_BASE, COM1_IRQ};
use domus_devices::{GuestEvent, PioBus};
use domus_virtio::balloon::BalloonHandle;
use domus_virtio::Memory;
use kvm_bindings::{
    kvm_pit_config, kvm_userspace_memory_region, KVM_MAX_CPUID_ENTRIES, KVM_PIT_SPEAKER_DUMMY,
};
use kvm_ioctls::{Cap, Kvm, VmFd};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;

use crate::api;
use crate::config::{host_memory, io_reason, ConfigError, VmConfig};
use crate::console;
use crate::cpuid;
use crate::hotplug::{self, Board};
use crate::irq::KvmIrqs;
use crate::pause::{self, Pause};
use crate::registry::{self, disk_name, DeviceSpec};
use crate::seccomp::{self, Kind};
use crate::snapshot::{self, SnapshotError};
use crate::vcpu::{self, Buses, Stop};
use crate::{kvm_err, Error, Result};

const VCPU_STACK: usize = 256 << 10;

/// How a domain ended. [`ExitReason::code`] is `domus run`'s exit status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExitReason {
    /// The guest powered off (ACPI S5).
    PowerOff,
    /// The guest rebooted.
    Reset,
    /// The guest kernel panicked (reported through pvpanic), or KVM could not
    /// run its code.
    Crash(String),
    /// The user ended the domain from the console (`Ctrl-A x`).
    Quit,
    /// The guest was migrated live: it runs on the destination now.
    Migrated,
}

pub const EXIT_POWEROFF: i32 = 0;
pub const EXIT_VMM_ERROR: i32 = 1;
pub const EXIT_BAD_INPUT: i32 = 2;
pub const EXIT_REBOOT: i32 = 3;
pub const EXIT_CRASH: i32 = 4;
pub const EXIT_MIGRATED: i32 = 5;
pub const EXIT_QUIT: i32 = 130;

impl ExitReason {
    /// The reason in words, for logs.
    pub fn describe(&self) -> String {
        match self {
            ExitReason::PowerOff => "the guest powered off".into(),
            ExitReason::Reset => "the guest reset (a reboot, or a triple fault)".into(),
            ExitReason::Crash(why) => format!("the guest crashed: {why}"),
            ExitReason::Quit => "ended from the console".into(),
            ExitReason::Migrated => "migrated: the guest runs on the destination".into(),
        }
    }

    pub fn code(&self) -> i32 {
        match self {
            ExitReason::PowerOff => EXIT_POWEROFF,
            ExitReason::Reset => EXIT_REBOOT,
            ExitReason::Crash(_) => EXIT_CRASH,
            ExitReason::Quit => EXIT_QUIT,
            ExitReason::Migrated => EXIT_MIGRATED,
        }
    }
}

/// The most vCPUs a domain may have here: KVM's limit, and 255 because the
/// MADT's local APIC ids are bytes (0xff is the broadcast id).
pub fn max_vcpus(kvm: &Kvm) -> u32 {
    (kvm.get_max_vcpus() as u32).min(255)
}

/// Gives `mem`'s regions to the VM as memory slots 0, 1, ...; `mem` must stay
/// mapped as long as the VM exists.
pub(crate) fn register_memory(vm: &VmFd, mem: &Memory) -> Result<()> {
    register_memory_flags(vm, mem, 0).map_err(kvm_err("KVM_SET_USER_MEMORY_REGION"))
}

/// Registers (or registers again, changing `flags`: the dirty log) each
/// RAM region of `mem` as the KVM memory slot of its index.
pub(crate) fn register_memory_flags(
    vm: &VmFd,
    mem: &Memory,
    flags: u32,
) -> std::result::Result<(), kvm_ioctls::Error> {
    for (slot, region) in mem.iter().enumerate() {
        let r = kvm_userspace_memory_region {
            slot: slot as u32,
            guest_phys_addr: region.start_addr().0,
            memory_size: region.len(),
            userspace_addr: region.as_ptr() as u64,
            flags,
        };
        // SAFETY: the mapping belongs to `mem`, which outlives the VM (both live
        // until the process exits), and the slots do not overlap.
        unsafe { vm.set_user_memory_region(r) }?;
    }
    Ok(())
}

fn open_checked(what: &'static str, path: &std::path::Path) -> Result<File> {
    File::open(path).map_err(|e| {
        Error::Config(ConfigError::File {
            what,
            path: path.display().to_string(),
            reason: io_reason(&e),
        })
    })
}

/// Writes everything the guest needs before its first instruction: kernel,
/// initrd, command line, ACPI tables, reset vector, zero page, long mode.
fn write_boot_data(
    cfg: &VmConfig,
    mem: &Memory,
    kernel_file: &mut File,
    cmdline: &[u8],
) -> Result<(kernel::LoadedKernel, longmode::LongModeSegments)> {
    let k = kernel::load(mem, kernel_file).map_err(|source| Error::Kernel {
        path: cfg.kernel.display().to_string(),
        source,
    })?;
    let initrd = match &cfg.initrd {
        Some(path) => {
            let mut f = open_checked("initrd", path)?;
            let ioerr = |source| Error::Initrd {
                path: path.display().to_string(),
                source,
            };
            let size = f.metadata().map_err(ioerr)?.len();
            let addr_max = k
                .setup_header
                .map_or(0x7fff_ffff, |h| u64::from(h.initrd_addr_max));
            let addr = params::initrd_addr(cfg.memory, k.footprint_end, size, addr_max)?;
            mem.read_exact_volatile_from(GuestAddress(addr), &mut f, size as usize)
                .map_err(|e| ioerr(std::io::Error::other(e.to_string())))?;
            Some((addr, size))
        }
        None => None,
    };
    if initrd.is_none() && k.footprint_end > layout::low_ram_end(cfg.memory) {
        return Err(params::Error::TooLittleMemory {
            memory: cfg.memory >> 20,
            needed: (k.footprint_end >> 20) + 16,
        }
        .into());
    }
    mem.write_slice(cmdline, GuestAddress(CMDLINE_ADDR))?;
    let tables = acpi::build(&AcpiConfig {
        vcpus: cfg.vcpus as u8,
        sleep_control_port: platform::ACPI_SLEEP_CONTROL,
        sleep_status_port: platform::ACPI_SLEEP_STATUS,
        reset_port: platform::ACPI_RESET,
        reset_value: platform::ACPI_RESET_VALUE,
        pvpanic_port: platform::PVPANIC_PORT,
        serial_port: COM1_BASE,
        serial_irq: COM1_IRQ as u8,
        pci_config_port: pci::PCI_CONFIG_BASE,
        pci_mmio_base: layout::PCI_MMIO_BASE,
        pci_mmio_len: layout::PCI_MMIO_LEN,
        ged_port: platform::GED_PORT,
        ged_gsi: platform::GED_GSI,
        pci_hotplug_port: PCI_HOTPLUG_PORT,
    });
    mem.write_slice(&tables.bytes, GuestAddress(ACPI_START))?;
    mem.write_slice(
        &layout::RESET_VECTOR_CODE,
        GuestAddress(layout::RESET_VECTOR),
    )?;
    let zp = params::zero_page(&params::ZeroPage {
        mem_bytes: cfg.memory,
        cmdline_len: cmdline.len() - 1,
        initrd,
        setup_header: k.setup_header.as_ref(),
        rsdp_addr: tables.rsdp_addr,
    });
    mem.write_obj(zp, GuestAddress(ZERO_PAGE_ADDR))?;
    let segments = longmode::setup(mem)?;
    Ok((k, segments))
}

/// Writes a new, random VM generation ID where the guest's vmgenid driver
/// reads it (`layout::VMGENID_ADDR`): at boot, and at every restore (each
/// restored copy of a snapshot is a new generation, whose random number
/// generator the guest reseeds when notified).
fn new_generation(mem: &Memory) -> Result<()> {
    let mut id = [0u8; 16];
    // SAFETY: getrandom(2) writes at most `id.len()` bytes into `id`.
    let n = unsafe { libc::getrandom(id.as_mut_ptr().cast(), id.len(), 0) };
    if n != id.len() as isize {
        return Err(Error::Io(
            "a VM generation ID",
            std::io::Error::last_os_error(),
        ));
    }
    mem.write_slice(&id, GuestAddress(layout::VMGENID_ADDR))?;
    Ok(())
}

/// The domain's virtio devices, plugged: their API entries and the
/// balloon's handle.
struct Devices {
    api: Vec<registry::Device>,
    balloon: Option<Arc<BalloonHandle>>,
}

/// The configured devices, from slot 1 in order: disks (vda, vdb, ...),
/// interfaces, vsock, the entropy device, the balloon.
fn boot_devices(cfg: &VmConfig, board: &Board<'_>) -> Result<Devices> {
    let mut specs: Vec<(DeviceSpec, String)> = Vec::new();
    for (i, d) in cfg.disks.iter().enumerate() {
        specs.push((DeviceSpec::Block { disk: d.clone() }, disk_name(i)));
    }
    for (i, n) in cfg.nets.iter().enumerate() {
        specs.push((DeviceSpec::Net { net: n.clone() }, format!("net{i}")));
    }
    if let Some(cid) = cfg.vsock_cid {
        specs.push((DeviceSpec::Vsock { cid }, "vsock0".into()));
    }
    if cfg.rng {
        specs.push((DeviceSpec::Rng, "rng0".into()));
    }
    if cfg.balloon {
        specs.push((DeviceSpec::Balloon, "balloon0".into()));
    }
    let mut out = Devices {
        api: Vec::new(),
        balloon: None,
    };
    for (spec, id) in specs {
        let p = hotplug::build_and_plug(&spec, id, None, board)?;
        if let Some(b) = &p.balloon {
            if let Some(keep) = cfg.balloon_target {
                // The balloon holds what the guest gives up, in 4 KiB pages.
                b.set_target_pages((cfg.memory - keep.min(cfg.memory)) >> 12);
            }
        }
        out.balloon = out.balloon.or(p.balloon);
        out.api.push(p.entry);
    }
    Ok(out)
}

/// A restored domain's devices, each in its saved slot with its saved
/// transport state (started later, by [`resume_devices`]).
fn restored_devices(saved: &[snapshot::PciDeviceState], board: &Board<'_>) -> Result<Devices> {
    let mut out = Devices {
        api: Vec::new(),
        balloon: None,
    };
    for d in saved {
        let p = hotplug::build_and_plug(&d.spec, d.id.clone(), Some(d.slot), board)?;
        if let Some(f) = &p.entry.function {
            domus_devices::bus::lock(&f.transport)
                .restore(&d.transport)
                .map_err(|e| Error::Snapshot(SnapshotError::Device(e)))?;
        }
        out.balloon = out.balloon.or(p.balloon);
        out.api.push(p.entry);
    }
    board.bus.refresh_windows();
    Ok(out)
}

/// Starts the restored devices the guest's drivers had running.
fn resume_devices(devices: &Mutex<Vec<registry::Device>>) -> Result<()> {
    for d in domus_devices::bus::lock(devices).iter() {
        if let Some(f) = &d.function {
            domus_devices::bus::lock(&f.transport)
                .resume()
                .map_err(|e| Error::Snapshot(SnapshotError::Device(e)))?;
        }
    }
    Ok(())
}

/// The port I/O bus with COM1 and the platform devices.
fn platform_bus(
    serial: Arc<Mutex<SerialDevice>>,
    events: Arc<GedEvents>,
    hotplug: Arc<PciHotplug>,
    pci: Arc<PciBus>,
) -> Result<PioBus> {
    let mut bus = PioBus::new();
    let s5 = acpi::S5_SLEEP_TYPE;
    let overlap = |e: domus_devices::bus::Overlap| Error::Io("port bus", std::io::Error::other(e));
    bus.insert(COM1_BASE, 8, serial).map_err(overlap)?;
    bus.insert(platform::I8042_BASE, 5, Arc::new(Mutex::new(I8042)))
        .map_err(overlap)?;
    bus.insert(
        platform::ACPI_PM_BASE,
        3,
        Arc::new(Mutex::new(AcpiPm::new(s5))),
    )
    .map_err(overlap)?;
    bus.insert(platform::PVPANIC_PORT, 1, Arc::new(Mutex::new(PvPanic)))
        .map_err(overlap)?;
    bus.insert(platform::GED_PORT, 1, Arc::new(Mutex::new(Ged(events))))
        .map_err(overlap)?;
    bus.insert(
        PCI_HOTPLUG_PORT,
        PCI_HOTPLUG_LEN,
        Arc::new(Mutex::new(HotplugPorts(hotplug))),
    )
    .map_err(overlap)?;
    bus.insert(
        pci::PCI_CONFIG_BASE,
        pci::PCI_CONFIG_LEN,
        Arc::new(Mutex::new(pci::PciConfigIo::new(pci))),
    )
    .map_err(overlap)?;
    Ok(bus)
}

/// A Unix socket bound at `path` if one is given (`what` names it in the
/// error).
fn bind(
    what: &'static str,
    path: Option<&std::path::Path>,
) -> Result<Option<std::os::unix::net::UnixListener>> {
    path.map(|path| {
        domus_http::bind(path).map_err(|e| {
            Error::Config(ConfigError::File {
                what,
                path: path.display().to_string(),
                reason: io_reason(&e),
            })
        })
    })
    .transpose()
}

/// What a restore starts from: the snapshot's machine state (its devices
/// already renamed as the restore asks, see
/// [`snapshot::renamed_devices`]), its memory image, and the memory: the
/// open memory file, or what a live migration brought.
pub struct Restore {
    pub machine: snapshot::Machine,
    pub memory: MemoryImage,
    /// The snapshot's memory file (None for a migration).
    pub memory_file: Option<File>,
    /// A live migration's memory, received already, and the stream on
    /// which the source waits to hear that the guest runs here.
    pub incoming: Option<(Memory, std::os::unix::net::UnixStream)>,
    /// The domain was paused when saved: it restores paused.
    pub paused: bool,
    /// The VM, made while the stream came ([`prepare`]).
    pub prepared: Option<Prepared>,
}

impl Restore {
    /// The guest restored from a snapshot is a new copy of it (a new VM
    /// generation); one migrated live is the same machine.
    fn is_copy(&self) -> bool {
        self.incoming.is_none()
    }
}

/// A VM made before its domain is known: KVM opened, the VM with its
/// in-kernel irqchip and PIT. A migration's destination makes it while it
/// waits for the stream, so that the guest's stop does not pay for it
/// (about 20 ms in the nested test host).
pub struct Prepared {
    kvm: Kvm,
    vm: VmFd,
}

/// Makes a [`Prepared`] VM.
pub fn prepare() -> Result<Prepared> {
    let kvm = Kvm::new().map_err(Error::OpenKvm)?;
    let vm = kvm.create_vm().map_err(kvm_err("KVM_CREATE_VM"))?;
    vm.set_tss_address(KVM_TSS_ADDR as usize)
        .map_err(kvm_err("KVM_SET_TSS_ADDR"))?;
    vm.create_irq_chip()
        .map_err(kvm_err("KVM_CREATE_IRQCHIP"))?;
    vm.create_pit2(kvm_pit_config {
        flags: KVM_PIT_SPEAKER_DUMMY,
        ..Default::default()
    })
    .map_err(kvm_err("KVM_CREATE_PIT2"))?;
    Ok(Prepared { kvm, vm })
}

/// Boots the domain, or restores it from a snapshot, and blocks until it
/// ends.
pub fn run(cfg: &VmConfig, mut restore: Option<Restore>) -> Result<ExitReason> {
    let started = std::time::Instant::now();
    // Input checks that need no KVM come first, so bad input is reported as
    // such even on a host without /dev/kvm.
    let host_mem = host_memory().unwrap_or(u64::MAX);
    let boot = restore.is_none();
    cfg.validate(u32::MAX, host_mem, boot)?;
    let kernel_file = if boot {
        let mut f = open_checked("kernel", &cfg.kernel)?;
        kernel::probe(&mut f).map_err(|source| Error::Kernel {
            path: cfg.kernel.display().to_string(),
            source,
        })?;
        Some(f)
    } else {
        None
    };
    let cmdline = params::cmdline_bytes(&cfg.cmdline)?;
    let api_listener = bind("API socket", cfg.api_socket.as_deref())?;
    // Bound now, served once jailed: the supervisor passes descriptors of
    // files the jailed VMM can no longer open.
    let fd_socket = cfg.jail.as_ref().and_then(|j| j.fd_socket.as_deref());
    let fd_listener = bind("descriptor socket", fd_socket)?;
    let prepared = restore.as_mut().and_then(|r| r.prepared.take());
    let (kvm, vm) = match prepared {
        Some(p) => (p.kvm, p.vm),
        None => {
            let p = prepare()?;
            (p.kvm, p.vm)
        }
    };
    cfg.validate(max_vcpus(&kvm), host_mem, boot)?;
    let supported = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(kvm_err("KVM_GET_SUPPORTED_CPUID"))?;
    // The guest keeps the CPUID it was given; refused here if this host
    // cannot offer it.
    let base_cpuid = match &restore {
        Some(r) => {
            snapshot::kvm::check_cpuid(&r.machine.cpuid, &supported)?;
            if r.machine.vcpus.len() != cfg.vcpus as usize {
                return Err(SnapshotError::Machine(format!(
                    "{} vCPUs saved, the domain has {}",
                    r.machine.vcpus.len(),
                    cfg.vcpus
                ))
                .into());
            }
            snapshot::kvm::cpuid_from(&r.machine.cpuid)?
        }
        None => supported,
    };

    let vm = Arc::new(vm);

    let ranges = layout::ram_ranges(cfg.memory);
    // Asked before the migration's memory is taken out of `restore`.
    let copy = restore.as_ref().is_some_and(|r| r.is_copy());
    let incoming = restore.as_mut().and_then(|r| r.incoming.take());
    let (received, answer) = incoming.unzip();
    let mem = Arc::new(match (&restore, received) {
        (Some(_), Some(m)) => {
            let got: Vec<(u64, u64)> = m.iter().map(|r| (r.start_addr().0, r.len())).collect();
            if got != ranges {
                return Err(SnapshotError::Machine(format!(
                    "memory regions {got:x?} came, a domain of this size has {ranges:x?}"
                ))
                .into());
            }
            m
        }
        (Some(r), None) => {
            let (m, file) = (&r.memory, r.memory_file.as_ref());
            let file = file.ok_or_else(|| SnapshotError::Machine("no memory file".into()))?;
            snapshot::memory::check(&m.regions, &ranges, file, m.bytes)?;
            snapshot::memory::map(&m.regions, file)?
        }
        (None, _) => {
            crate::memory::allocate(&ranges).map_err(|e| Error::Memory(cfg.memory >> 20, e))?
        }
    });
    register_memory(&vm, &mem)?;
    if cfg.mergeable {
        crate::memory::mergeable(&mem)
            .map_err(|e| Error::Io("MADV_MERGEABLE on guest memory", e))?;
    }

    let entry = match kernel_file {
        Some(mut f) => Some(write_boot_data(cfg, &mem, &mut f, &cmdline)?),
        None => None,
    };
    // Read before the VM's clock is set: the vCPUs' TSCs move on by as
    // much as kvmclock does.
    let away = restore
        .as_ref()
        .and_then(|r| snapshot::kvm::time_away(&r.machine.vm));
    if let Some(r) = &restore {
        snapshot::kvm::restore_vm(&vm, &r.machine.vm)?;
    }
    if restore.is_none() || copy {
        new_generation(&mem)?;
    }

    // Platform devices.
    let irq = EventFd::new(libc::EFD_NONBLOCK).map_err(|e| Error::Io("eventfd", e))?;
    vm.register_irqfd(&irq, COM1_IRQ)
        .map_err(kvm_err("KVM_IRQFD"))?;
    let out = console::output(&cfg.console)?;
    let serial = Arc::new(Mutex::new(match &restore {
        Some(r) => SerialDevice::from_state(&r.machine.serial, irq, out)
            .map_err(|e| Error::Snapshot(SnapshotError::Machine(e)))?,
        None => SerialDevice::new(irq, out),
    }));
    let ged_irq = EventFd::new(libc::EFD_NONBLOCK).map_err(|e| Error::Io("eventfd", e))?;
    vm.register_irqfd(&ged_irq, platform::GED_GSI)
        .map_err(kvm_err("KVM_IRQFD"))?;
    let events = GedEvents::new(ged_irq);
    let irqs = Arc::new(KvmIrqs::new(vm.clone()));
    let pci = Arc::new(PciBus::new());
    let board = Board {
        bus: &pci,
        irqs: &irqs,
        mem: &mem,
        inbox: None,
    };
    let devices = match &restore {
        Some(r) => restored_devices(&r.machine.devices, &board)?,
        None => boot_devices(cfg, &board)?,
    };
    let api_devices = Arc::new(Mutex::new(devices.api));
    let ports = {
        let (pci, list) = (pci.clone(), api_devices.clone());
        PciHotplug::new(
            events.clone(),
            Box::new(move |slot| hotplug::ejected(&pci, &list, slot)),
        )
    };
    let bus = Buses {
        pio: platform_bus(serial.clone(), events.clone(), ports.clone(), pci.clone())?,
        pci: pci.clone(),
    };

    // vCPUs.
    let tsc_deadline = kvm.check_extension(Cap::TscDeadlineTimer);
    let (stop_tx, stop_rx) = channel();
    let pause = Arc::new(Pause::default());
    pause::install_kick_handler().map_err(|e| Error::Io("installing the vCPU kick handler", e))?;
    let brand = cpuid::host_brand();
    let mut vcpus = Vec::new();
    for id in 0..cfg.vcpus {
        let vcpu = vm
            .create_vcpu(u64::from(id))
            .map_err(kvm_err("KVM_CREATE_VCPU"))?;
        let mut c = base_cpuid.clone();
        cpuid::patch(
            c.as_mut_slice(),
            id,
            cfg.vcpus,
            tsc_deadline,
            brand.as_ref(),
        );
        cpuid::force(c.as_mut_slice(), &cfg.cpuid).map_err(Error::CpuidLeaf)?;
        vcpu::setup_common(&vcpu, &c)?;
        match (&restore, &entry) {
            (Some(r), _) => {
                snapshot::kvm::restore_vcpu(&vcpu, &r.machine.vcpus[id as usize], away)?
            }
            (None, Some((k, segments))) if id == 0 => {
                vcpu::setup_boot_vcpu(&vcpu, segments, k.entry)?
            }
            _ => {}
        }
        vcpus.push(vcpu);
    }
    if cfg.prefault {
        match &restore {
            // A migration's memory is all here already.
            Some(_) if answer.is_some() => {}
            // The whole image is read now, and checked.
            Some(r) => {
                crate::memory::prefault(&mem, None::<&File>).map_err(Error::Prefault)?;
                snapshot::memory::load_and_verify(&mem, r.memory.crc32)?;
            }
            None => {
                // kvm-ioctls' Cap has no variant for this one.
                let tables =
                    vm.check_extension_raw(kvm_bindings::KVM_CAP_PRE_FAULT_MEMORY.into()) > 0;
                let how = crate::memory::prefault(&mem, vcpus.first().filter(|_| tables))
                    .map_err(Error::Prefault)?;
                if how == crate::memory::Prefaulted::HostPages {
                    eprintln!(
                        "domus: this kernel's KVM cannot prefault its page tables (KVM_PRE_FAULT_MEMORY, Linux 6.10): guest memory is populated, KVM maps it on first touch"
                    );
                }
            }
        }
    }
    let snapshots = Arc::new(snapshot::Snapshotter {
        vm: vm.clone(),
        mem: mem.clone(),
        devices: api_devices.clone(),
        serial: serial.clone(),
        pause: pause.clone(),
        vcpus: cfg.vcpus,
        cpuid: snapshot::kvm::cpuid_leaves(&base_cpuid),
        msrs: snapshot::kvm::msr_list(&kvm)?,
        spec: cfg.spec(),
        busy: Mutex::new(()),
    });
    // Everything is open: from here on the VMM holds descriptors, not
    // names, as an unprivileged user in a root of its own (one thread yet,
    // as the jail needs).
    if let Some(jail) = &cfg.jail {
        let e = domus_jail::enter(jail)?;
        eprintln!(
            "domus: jailed as uid {} gid {}: a root of its own, no capabilities, Landlock {}",
            jail.uid, jail.gid, e.landlock
        );
    }
    // From here on, every thread (and every one made later) may make only
    // the system calls a running VMM needs, and each thread started below
    // adds its own kind's narrower filter as it starts.
    if cfg.seccomp {
        seccomp::install()?;
    }
    let inbox = match fd_listener {
        Some(l) => Some(
            domus_jail::fdpass::Inbox::serve(l, || {
                seccomp::enter(Kind::Inbox).map_err(std::io::Error::other)
            })
            .map_err(|e| Error::Io("starting the descriptor thread", e))?,
        ),
        None => None,
    };
    if let Some(r) = &restore {
        // Started now, with their threads' filters, and before any vCPU
        // runs: the guest finds them as its drivers left them.
        resume_devices(&api_devices)?;
        if r.paused {
            pause.hold();
        }
    }
    for (id, vcpu) in vcpus.into_iter().enumerate() {
        let (bus, tx, p) = (bus.clone(), stop_tx.clone(), pause.clone());
        std::thread::Builder::new()
            .name(format!("vcpu{id}"))
            // Small stacks: the exit loop is shallow, and a 2 MiB stack could
            // be backed by a transparent huge page and cost 2 MiB of RSS.
            .stack_size(VCPU_STACK)
            .spawn(move || match seccomp::enter(Kind::Vcpu) {
                Ok(()) => vcpu::run_loop(id as u32, vcpu, bus, tx, p),
                Err(e) => {
                    let _ = tx.send(Stop::Fault(format!("vCPU {id}: {e}")));
                }
            })
            .map_err(|e| Error::Io("spawning a vCPU thread", e))?;
    }
    if let Some(mut s) = answer {
        // The source stops for good once it hears this; if it cannot, it
        // goes on there, and this copy must not.
        domus_api::migration::write_running(&mut s)
            .map_err(|e| Error::Io("telling the migration's source that the guest runs here", e))?;
        eprintln!(
            "domus: incoming: the guest runs here, {:.1} ms after its state came",
            started.elapsed().as_secs_f64() * 1000.0
        );
        // The guest's MACs are behind this host's taps now: tell the
        // bridges and switches.
        for d in domus_devices::bus::lock(&api_devices).iter() {
            if let Some(f) = &d.function {
                if let Err(e) = domus_devices::bus::lock(&f.transport).announce() {
                    eprintln!("domus: announcing {} after the migration: {e}", d.id);
                }
            }
        }
    }
    if copy {
        // The guest reads its new generation ID and reseeds its RNG.
        events
            .raise(domus_boot::acpi::GED_VMGENID)
            .map_err(|e| Error::Io("notifying the new VM generation", e))?;
    }

    if let Some(listener) = api_listener {
        let domain = api::Domain {
            name: cfg.name.clone(),
            vcpus: cfg.vcpus,
            memory: cfg.memory,
            started: std::time::Instant::now(),
            pause: pause.clone(),
            devices: api_devices,
            migration: Some(Arc::new(crate::migration::send::Migrator {
                snap: snapshots.clone(),
                status: Arc::default(),
                cancel: Arc::default(),
                stop: Mutex::new(stop_tx.clone()),
            })),
            snapshots: Some(snapshots),
            inbox: inbox.clone(),
            balloon: devices.balloon,
            events,
            serial: Some(serial.clone()),
            hotplug: Some(Arc::new(hotplug::VmHotplug {
                bus: pci,
                irqs: irqs.clone(),
                mem: mem.clone(),
                ports,
                plugging: Mutex::new(()),
                inbox,
            })),
        };
        // Started from a thread that has the API's filter, so that the API
        // thread and its connections' threads inherit it.
        std::thread::scope(|s| {
            s.spawn(|| {
                seccomp::enter(Kind::Api)?;
                domus_http::spawn_server("api", listener, Arc::new(move |r| domain.handle(r)))
                    .map_err(|e| Error::Io("starting the API thread", e))?;
                Ok::<(), Error>(())
            })
            .join()
            .unwrap_or_else(|_| {
                Err(Error::Io(
                    "starting the API thread",
                    std::io::Error::other("panicked"),
                ))
            })
        })?;
    }

    let _raw = if cfg.console == crate::Console::Stdout {
        let raw = console::RawTerminal::enter();
        let tx = stop_tx.clone();
        console::spawn_input(serial.clone(), move || {
            let _ = tx.send(Stop::Quit);
        })
        .map_err(|e| Error::Io("spawning the console thread", e))?;
        raw
    } else {
        None
    };
    drop(stop_tx);
    // Main now only waits for the end.
    seccomp::enter(Kind::Main)?;

    let stop = stop_rx
        .recv()
        .unwrap_or(Stop::Fault("all vCPU threads ended".into()));
    domus_devices::bus::lock(&serial).flush();
    if let Some(path) = &cfg.api_socket {
        let _ = std::fs::remove_file(path);
    }
    // The VM, its memory and the vCPU threads go away with the process.
    std::mem::forget(vm);
    std::mem::forget(mem);
    Ok(match stop {
        Stop::Guest(GuestEvent::PowerOff) => ExitReason::PowerOff,
        Stop::Guest(GuestEvent::Reset) => ExitReason::Reset,
        Stop::Guest(GuestEvent::Panic) => ExitReason::Crash("the guest kernel panicked".into()),
        Stop::Fault(why) => ExitReason::Crash(why),
        Stop::Quit => ExitReason::Quit,
        Stop::Migrated => ExitReason::Migrated,
    })
}
