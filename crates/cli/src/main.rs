//! `domus`: the command table. Each subcommand is a thin call into a crate.

use std::path::PathBuf;
use std::process::ExitCode;

mod jailed;
mod xl;

use clap::{Parser, Subcommand};
use domus_api::spec::{ConsoleSpec, DiskSpec, NetSpec, VmSpec};
use domus_vmm::config::io_reason;
use domus_vmm::vm::{EXIT_BAD_INPUT, EXIT_VMM_ERROR};
use domus_vmm::VmConfig;

#[derive(Parser)]
#[command(
    name = "domus",
    version,
    about = "Domus: isolated Linux domains on KVM"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

const RUN_AFTER_HELP: &str = "\
Exit status:
  0    the guest powered off (for example `poweroff -f`)
  1    the VMM failed (KVM or host error)
  2    bad input: options, kernel, initrd, disks, vCPU count, memory size
  3    the guest rebooted
  4    the guest crashed: its kernel panicked (reported through pvpanic; with
       panic=-1 it would otherwise reboot), or KVM could not run its code
  5    the guest was migrated live and runs on the destination now
  130  ended from the console with Ctrl-A x

On the console (--console stdout with a terminal on stdin), input goes to the
guest; Ctrl-A x ends the domain, Ctrl-A Ctrl-A sends Ctrl-A.

Example:
  eval \"$(domus kit --print)\"
  domus run --kernel \"$kernel\" --initrd \"$initrd\" --vcpus 2 --memory 512M \\
      --cmdline 'console=ttyS0 quiet -- nproc'
  domus run --kernel \"$kernel\" --initrd \"$initrd\" --disk \"$rootfs\" \\
      --cmdline 'console=ttyS0 root=/dev/vda -- cat /etc/os-release'";

#[derive(Subcommand)]
enum Command {
    /// Boot one domain in the foreground until its guest powers off, reboots or crashes.
    #[command(after_help = RUN_AFTER_HELP)]
    Run(RunArgs),
    /// Build the default guest (kernel, initramfs, rootfs) from Debian's packages.
    Kit(KitArgs),
    /// Bootable Debian images for `image = "NAME"` domains: build, list, rm.
    Image(xl::ImageArgs),
    /// The virtual firewall-router's rules on taps of `domus run` outside
    /// the daemon (anti-spoofing, ports, isolation; table bridge domus_run).
    Vfr(xl::VfrArgs),
    /// Tell whether /dev/kvm runs guest kernel code at hardware speed (exit 0 if so).
    #[command(name = "kvm-probe", hide = true)]
    KvmProbe,
    /// Run the control daemon (domusd) in the foreground.
    Daemon(xl::DaemonArgs),
    /// Create and start a domain from an xl.cfg-style file (through the daemon).
    Create(xl::CreateArgs),
    /// List Domain-0 and the domains.
    List(xl::ListArgs),
    /// Destroy a domain at once.
    Destroy(xl::DomArgs),
    /// Ask a domain's guest to shut down cleanly (ACPI power button); on_poweroff applies.
    Shutdown(xl::ShutdownArgs),
    /// Ask a domain's guest to reboot (power button, then on_reboot applies).
    Reboot(xl::ShutdownArgs),
    /// Pause a domain's vCPUs.
    Pause(xl::DomArgs),
    /// Let a paused domain run again.
    Unpause(xl::DomArgs),
    /// Save a domain to a snapshot, then destroy it (-p: leave it paused).
    Save(xl::SaveArgs),
    /// Start a saved domain again from where it stopped.
    Restore(xl::RestoreArgs),
    /// Start N domains from one snapshot, each with its own name, MACs, CID and disk copies.
    Clone(xl::CloneArgs),
    /// Send a running domain live to another host's daemon (or --cancel).
    Migrate(xl::MigrateArgs),
    /// Set the memory a domain keeps (its balloon takes the rest).
    #[command(name = "mem-set")]
    MemSet(xl::MemSetArgs),
    /// Set the most memory a domain may have (bounds mem-set and its cgroup).
    #[command(name = "mem-max")]
    MemMax(xl::MemMaxArgs),
    /// A running domain's disks with their counters.
    #[command(name = "block-list")]
    BlockList(xl::DeviceListArgs),
    /// Hot-plug a disk into a running domain (kept in its configuration).
    #[command(name = "block-attach")]
    BlockAttach(xl::AttachArgs),
    /// Hot-unplug a disk: the guest lets go of it, then it leaves.
    #[command(name = "block-detach")]
    BlockDetach(xl::DetachArgs),
    /// Hot-plug a network interface (a new tap on the vif's bridge).
    #[command(name = "network-attach")]
    NetworkAttach(xl::AttachArgs),
    /// Hot-unplug a network interface, by index or MAC.
    #[command(name = "network-detach")]
    NetworkDetach(xl::DetachArgs),
    /// A running domain's network interfaces with their counters.
    #[command(name = "network-list")]
    NetworkList(xl::DeviceListArgs),
    /// Host and daemon facts.
    Info(xl::InfoArgs),
    /// Give a domain a new name.
    Rename(xl::RenameArgs),
    /// Each vCPU's thread, host CPU, time and affinity.
    #[command(name = "vcpu-list")]
    VcpuList(xl::VcpuListArgs),
    /// Pin a vCPU (or all) to host CPUs.
    #[command(name = "vcpu-pin")]
    VcpuPin(xl::VcpuPinArgs),
    /// Show or set a domain's weight and cap.
    #[command(name = "sched-credit")]
    SchedCredit(xl::SchedArgs),
    /// Live CPU and memory use per domain, with the I/O threads' CPU apart.
    Top(xl::TopArgs),
    /// Log in to a domain over SSH, at its address on the default network.
    Ssh(xl::SshArgs),
    /// A domain's serial console: its output, and on a terminal what you
    /// type goes to the guest (Ctrl-] leaves).
    Console(xl::ConsoleArgs),
    /// The daemon's log.
    Dmesg(xl::StateArg),
}

#[derive(clap::Args)]
struct RunArgs {
    /// Everything below as one JSON document instead of flags: a VM spec
    /// (domus-api's VmSpec: kernel, initrd, cmdline, vcpus, memory_mib,
    /// console, disks, nets, vsock_cid, rng, balloon, balloon_target_mib,
    /// prefault, mergeable, cpuid, seccomp, api_socket,
    /// name, exit_file; disks and nets as objects or in the flags' syntax).
    /// An unknown field is refused by name.
    #[arg(long, value_name = "FILE", conflicts_with_all = [
        "kernel", "initrd", "cmdline", "vcpus", "memory", "console", "disk", "net", "vsock",
        "no_rng", "balloon", "balloon_target", "prefault", "seccomp", "api_socket", "name",
        "exit_file", "cpuid",
    ])]
    config: Option<PathBuf>,
    /// Start the domain saved in this snapshot (`domus save`, or the API's
    /// PUT /v1/domain/snapshot) instead of booting one: its machine and
    /// devices come from the snapshot; name, console, API socket, seccomp,
    /// jail, exit file and a new vsock CID (--vsock, for a second copy) from
    /// here (or --config, whose disks and
    /// interfaces, when it lists them, replace the saved ones' paths and
    /// taps in order). Memory is mapped from the snapshot's memory file and
    /// read as the guest touches it; with --prefault, all of it is read and
    /// checked first. See docs/snapshot-format.md.
    #[arg(long, value_name = "FILE", conflicts_with_all = [
        "kernel", "initrd", "cmdline", "vcpus", "memory", "disk", "net", "no_rng", "balloon",
        "balloon_target", "cpuid",
    ])]
    restore: Option<PathBuf>,
    /// Take a domain migrated live from another VMM instead of booting one
    /// (docs/migration.md): listen on this Unix socket, take the guest's
    /// memory and state from the one connection that comes (within 10
    /// minutes), check them as
    /// --restore does, and run the guest, telling the source. Its memory
    /// may be at most --memory (or the --config's). Name, console, API
    /// socket, seccomp, jail, disks and interfaces as with --restore.
    #[arg(long, value_name = "SOCKET", conflicts_with_all = [
        "restore", "kernel", "initrd", "cmdline", "vcpus", "no_rng", "balloon",
        "balloon_target", "jail", "cpuid",
    ])]
    incoming: Option<PathBuf>,
    /// Kernel: a bzImage (/boot/vmlinuz-*) or an uncompressed ELF vmlinux.
    #[arg(long, value_name = "PATH", required_unless_present_any = ["config", "restore", "incoming"])]
    kernel: Option<PathBuf>,
    /// Initial ramdisk (cpio archive, compressed or not).
    #[arg(long, value_name = "PATH")]
    initrd: Option<PathBuf>,
    /// Kernel command line; arguments after ` -- ` go to the guest's init.
    #[arg(long, value_name = "STRING", default_value = "console=ttyS0 panic=-1")]
    cmdline: String,
    /// Number of virtual CPUs.
    #[arg(long, value_name = "N", default_value_t = 1)]
    vcpus: u32,
    /// Guest memory: 256M, 1G, or plain MiB.
    #[arg(long, value_name = "SIZE", default_value = "256M", value_parser = domus_api::spec::parse_size)]
    memory: u64,
    /// Where the serial console goes: stdout, file:PATH or none.
    #[arg(long, value_name = "WHERE", default_value = "stdout")]
    console: ConsoleSpec,
    /// A virtio-blk disk on a raw image file (repeatable; the guest sees
    /// /dev/vda, /dev/vdb, ... in order). Options: ro (read-only), id=NAME
    /// (its serial, 20 characters at most), bw=SIZE (bytes per second, for
    /// example 10M), iops=N.
    #[arg(long, value_name = "PATH[,ro][,id=NAME][,bw=SIZE][,iops=N]")]
    disk: Vec<DiskSpec>,
    /// A virtio-net interface on a tap device (repeatable; the guest sees
    /// eth0, eth1, ... in order). The tap is opened if it exists (put it on
    /// a bridge first) and created otherwise. Options: mac=MAC (default
    /// 52:54:00 and a hash of the tap name), bw=SIZE (bytes per second),
    /// pps=N (packets per second), both directions together;
    /// mrg_rxbuf=off (no mergeable receive buffers: the guest posts one
    /// large buffer per frame; more guest memory, less work per frame);
    /// indirect_desc=off (no indirect descriptors: each piece of a frame
    /// takes a slot of the ring, as under Cloud Hypervisor).
    #[arg(
        long,
        value_name = "tap=NAME[,mac=MAC][,bw=SIZE][,pps=N][,mrg_rxbuf=on|off][,indirect_desc=on|off]"
    )]
    net: Vec<NetSpec>,
    /// A virtio-vsock device with this context id, on the host's
    /// vhost-vsock: host programs connect to (CID, port) with AF_VSOCK
    /// sockets, and the guest reaches host listeners at CID 2.
    #[arg(long, value_name = "cid=N", value_parser = domus_api::spec::parse_vsock)]
    vsock: Option<u64>,
    /// Leave out the virtio-rng entropy device (present by default, fed from
    /// the host's getrandom).
    #[arg(long)]
    no_rng: bool,
    /// Add a virtio-balloon device: the API can set a memory target, and
    /// memory the guest frees goes back to the host (free page reporting).
    #[arg(long)]
    balloon: bool,
    /// With --balloon: the memory the guest keeps from the start (256M,
    /// 1G, or plain MiB); the balloon holds the rest of --memory.
    #[arg(long, value_name = "SIZE", requires = "balloon", value_parser = domus_api::spec::parse_size)]
    balloon_target: Option<u64>,
    /// Populate all guest memory before the guest starts, and KVM's page
    /// tables for it where the kernel can (Linux 6.10 and later): no page
    /// faults in the host when the guest first touches memory, at the cost
    /// of committing all of it at start.
    #[arg(long)]
    prefault: bool,
    /// Let the host's KSM merge the guest's identical memory pages with
    /// those of other domains that allow it (MADV_MERGEABLE; the host must
    /// run KSM: /sys/kernel/mm/ksm/run). Off by default: which pages are
    /// shared can be timed by another guest, a side channel.
    #[arg(long)]
    mergeable: bool,
    /// Force CPUID bits in every vCPU, in xl's xend form:
    /// LEAF[,SUBLEAF]:REG=BITS[,REG=BITS], BITS being 32 characters, the
    /// most significant bit first, each 1, 0 or x (as Domus makes it);
    /// repeatable. `--cpuid 0x80000006:edx=00000000000000000000000000000000`
    /// hides the L3 cache. A restored domain keeps the saved ones.
    #[arg(long, value_name = "RULE", value_parser = cpuid_rules)]
    cpuid: Vec<CpuidRules>,
    /// Confine every VMM thread with a seccomp filter before the guest
    /// runs: only the system calls a running VMM makes are allowed, any
    /// other kills the process (exit by SIGSYS).
    #[arg(long)]
    seccomp: bool,
    /// Serve the domain's REST API on this Unix socket (mode 0600); see
    /// api/domain.openapi.json.
    #[arg(long, value_name = "PATH")]
    api_socket: Option<PathBuf>,
    /// The domain's name, as the API reports it [default: domain, or the
    /// saved one with --restore].
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
    /// Jail the VMM as domus daemon does (needs root): in new mount, PID,
    /// IPC and UTS namespaces, and once the domain is set up, before the
    /// guest runs, in a root of its own holding only /dev/net/tun, as user
    /// UID and group GID (default: UID) with no capabilities, limits on
    /// files, threads and file size, and Landlock. Give it --seccomp too.
    #[arg(long, value_name = "UID[:GID]", value_parser = jailed::parse_ids)]
    jail: Option<(u32, u32)>,
    /// On exit, write the exit status and its reason here ("3 the guest
    /// reset ..."), for a supervisor that is not this process's parent and
    /// so cannot wait for it (domus daemon, after a restart).
    #[arg(long, value_name = "PATH")]
    exit_file: Option<PathBuf>,
}

#[derive(clap::Args)]
struct KitArgs {
    /// Where to build and cache the kit [default: $XDG_CACHE_HOME/domus/kit]
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Print kernel=, vmlinux=, initrd= and rootfs= lines (building first if needed).
    #[arg(long)]
    print: bool,
    /// Rebuild even if the inputs have not changed.
    #[arg(long)]
    force: bool,
}

/// The rules of one `--cpuid`.
#[derive(Clone)]
struct CpuidRules(Vec<domus_api::cpuid::CpuidRule>);

fn cpuid_rules(s: &str) -> Result<CpuidRules, String> {
    domus_api::cpuid::parse_xend(s).map(CpuidRules)
}

/// The VM spec `domus run` was given: its --config file, or its flags.
fn run_spec(args: RunArgs) -> Result<VmSpec, String> {
    if let Some(path) = &args.config {
        let text =
            std::fs::read(path).map_err(|e| format!("{}: {}", path.display(), io_reason(&e)))?;
        return domus_api::parse_body(&text).map_err(|e| format!("{}: {e}", path.display()));
    }
    Ok(VmSpec {
        kernel: match (
            args.kernel,
            args.restore.is_some() || args.incoming.is_some(),
        ) {
            (Some(k), _) => k,
            // A restore runs no kernel: the snapshot's spec names it.
            (None, true) => PathBuf::new(),
            (None, false) => return Err("--kernel is needed (or --config)".into()),
        },
        initrd: args.initrd,
        cmdline: args.cmdline,
        vcpus: args.vcpus,
        memory_mib: args.memory.div_ceil(1 << 20),
        console: args.console,
        disks: args.disk,
        nets: args.net,
        vsock_cid: args.vsock,
        rng: !args.no_rng,
        balloon: args.balloon,
        balloon_target_mib: args.balloon_target.map(|b| b.div_ceil(1 << 20)),
        prefault: args.prefault,
        mergeable: args.mergeable,
        cpuid: args.cpuid.into_iter().flat_map(|r| r.0).collect(),
        seccomp: args.seccomp,
        api_socket: args.api_socket,
        name: args.name.unwrap_or_else(|| "domain".into()),
        exit_file: args.exit_file,
        jail: None,
    })
}

fn run(args: RunArgs) -> ExitCode {
    let jail = args.jail;
    let restore_from = args.restore.clone();
    let incoming_on = args.incoming.clone();
    // A restore keeps the saved name unless one is given.
    let named = args.name.is_some() || args.config.is_some();
    let spec = run_spec(args).and_then(|s| match (&restore_from, &incoming_on) {
        (Some(file), _) => restored(file, &s, named).map(|(s, r)| (s, Some(r))),
        (None, Some(socket)) => incoming(socket, &s, named).map(|(s, r)| (s, Some(r))),
        (None, None) => Ok((s, None)),
    });
    let spec_restore = match (spec, jail) {
        (Ok((mut s, r)), Some(ids)) => match jailed::child_jail(&s, ids) {
            Some(j) => {
                s.jail = Some(j);
                Ok((s, r))
            }
            // Checked here first, then started again in namespaces.
            None => match VmConfig::from_spec(&s) {
                Ok(_) => return jailed::respawn(),
                Err(e) => Err(e),
            },
        },
        (s, _) => s,
    };
    let Some((cfg, exit_file, restore)) = spec_restore
        .and_then(|(s, r)| VmConfig::from_spec(&s).map(|c| (c, s.exit_file, r)))
        .map_err(|e| eprintln!("domus: {e}"))
        .ok()
    else {
        return ExitCode::from(EXIT_BAD_INPUT as u8);
    };
    // Opened now: a jailed VMM can no longer reach it by name at the end.
    // Empty until then, which a reader takes as no status yet.
    let exit_file = match exit_file.as_deref().map(std::fs::File::create).transpose() {
        Ok(f) => f.map(|f| (f, exit_file.unwrap_or_default())),
        Err(e) => {
            eprintln!("domus: the exit file: {}", io_reason(&e));
            return ExitCode::from(EXIT_BAD_INPUT as u8);
        }
    };
    let (code, why) = match domus_vmm::run(&cfg, restore) {
        Ok(reason) => {
            if let domus_vmm::ExitReason::Crash(why) = &reason {
                eprintln!("domus: guest crashed: {why}");
            }
            (reason.code(), reason.describe())
        }
        Err(e) => {
            let why = chain(&e);
            eprintln!("domus: {why}");
            let code = if e.is_user_error() {
                EXIT_BAD_INPUT
            } else {
                EXIT_VMM_ERROR
            };
            (code, why)
        }
    };
    if let Some((mut f, path)) = exit_file {
        // One write: the supervisor reads it once this process has ended.
        if let Err(e) = std::io::Write::write_all(&mut f, format!("{code} {why}\n").as_bytes()) {
            eprintln!("domus: writing the exit file {}: {e}", path.display());
        }
    }
    ExitCode::from(code as u8)
}

/// The spec a restore runs with and what it restores, from the snapshot
/// `file` and what this invocation gave (`given`).
fn restored(
    file: &std::path::Path,
    given: &VmSpec,
    named: bool,
) -> Result<(VmSpec, domus_vmm::Restore), String> {
    use domus_vmm::snapshot::{self, Machine};
    let body = domus_api::snapshot::read::<Machine>(file).map_err(|e| e.to_string())?;
    let summary = body.summary;
    let mut spec = snapshot::restored_spec(&summary.spec, given)
        .map_err(|e| format!("snapshot {}: {e}", file.display()))?;
    if !named {
        spec.name = summary.spec.name.clone();
    }
    let mut machine = body.machine;
    machine.devices = snapshot::renamed_devices(&machine, &spec);
    let mem_path = domus_api::snapshot::memory_path(file, &summary.memory)
        .map_err(|e| format!("snapshot {}: {e}", file.display()))?;
    let memory_file = std::fs::File::open(&mem_path)
        .map_err(|e| format!("snapshot memory {}: {}", mem_path.display(), io_reason(&e)))?;
    Ok((
        spec,
        domus_vmm::Restore {
            machine,
            memory: summary.memory,
            memory_file: Some(memory_file),
            incoming: None,
            paused: summary.paused,
            prepared: None,
        },
    ))
}

/// The spec a migrated domain runs with and what it restores, from the
/// stream that comes on `socket` and what this invocation gave (`given`).
fn incoming(
    socket: &std::path::Path,
    given: &VmSpec,
    named: bool,
) -> Result<(VmSpec, domus_vmm::Restore), String> {
    use domus_vmm::migration::receive;
    use domus_vmm::snapshot;
    let l = domus_http::bind(socket).map_err(|e| {
        format!(
            "the migration socket {}: {}",
            socket.display(),
            io_reason(&e)
        )
    })?;
    eprintln!(
        "domus: waiting for a migration on {} (10 minutes at most)",
        socket.display()
    );
    // What needs no state is made while the stream comes (if it fails,
    // the run makes it again and says why).
    let prepared = domus_vmm::vm::prepare().ok();
    if given.seccomp {
        let _ = domus_vmm::seccomp::prepare();
    }
    let got = receive::receive(&l, socket, given.memory_mib << 20);
    let _ = std::fs::remove_file(socket);
    let got = got.map_err(|e| e.to_string())?;
    let summary = got.body.summary;
    let mut spec = snapshot::restored_spec(&summary.spec, given)
        .map_err(|e| format!("the migrated domain: {e}"))?;
    if !named {
        spec.name = summary.spec.name.clone();
    }
    let mut machine = got.body.machine;
    machine.devices = snapshot::renamed_devices(&machine, &spec);
    Ok((
        spec,
        domus_vmm::Restore {
            machine,
            memory: summary.memory,
            memory_file: None,
            incoming: Some((got.mem, got.stream)),
            paused: summary.paused,
            prepared,
        },
    ))
}

/// The log (`tracing`): one line per event on stderr, with its level and
/// fields (a domain's name, a device), filtered by `RUST_LOG` (default
/// `info`; `RUST_LOG=debug`, `RUST_LOG=domus_daemon=warn`, ...).
fn init_log() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false)
        .init();
}

/// An error and its sources on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        src = c.source();
    }
    s
}

fn kit(args: KitArgs) -> ExitCode {
    let dir = args.dir.unwrap_or_else(domus_kit::default_dir);
    match domus_kit::build(&dir, args.force) {
        Ok(kit) => {
            if args.print {
                print!("{}", kit.print());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("domus kit: {e:#}");
            ExitCode::from(EXIT_VMM_ERROR as u8)
        }
    }
}

fn kvm_probe() -> ExitCode {
    match domus_vmm::probe::probe() {
        Ok(r) => {
            let verdict = match (&r.failure, r.native()) {
                (Some(f), _) => format!("cannot run kernel code ({f})"),
                (None, true) => "hardware speed".to_string(),
                (None, false) => "emulated".to_string(),
            };
            eprintln!(
                "kvm-probe: ring-0 loop {:.2} ns/iteration: {verdict}",
                r.ns_per_iteration
            );
            if r.native() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("kvm-probe: {}", chain(&e));
            ExitCode::from(1)
        }
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                let _ = e.print();
                return ExitCode::from(
                    if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                        2
                    } else {
                        0
                    },
                );
            }
            // One line: clap's message up to its usage block.
            let text = e.render().to_string();
            let msg: Vec<&str> = text
                .lines()
                .take_while(|l| !l.trim().is_empty())
                .map(str::trim)
                .collect();
            let msg = msg.join(" ");
            let msg = msg.strip_prefix("error: ").unwrap_or(&msg);
            eprintln!("domus: {msg} (see domus --help)");
            return ExitCode::from(EXIT_BAD_INPUT as u8);
        }
    };
    init_log();
    match cli.command {
        Command::Run(a) => run(a),
        Command::Kit(a) => kit(a),
        Command::Image(a) => xl::image(a),
        Command::Vfr(a) => xl::vfr(a),
        Command::Ssh(a) => xl::ssh(a),
        Command::KvmProbe => kvm_probe(),
        Command::Daemon(a) => xl::daemon(a),
        Command::Create(a) => xl::create(a),
        Command::List(a) => xl::list(a),
        Command::Destroy(a) => xl::simple("destroy", a),
        Command::Shutdown(a) => xl::shutdown("shutdown", a),
        Command::Reboot(a) => xl::shutdown("reboot", a),
        Command::Pause(a) => xl::simple("pause", a),
        Command::Unpause(a) => xl::simple("unpause", a),
        Command::Save(a) => xl::save(a),
        Command::Restore(a) => xl::restore(a),
        Command::Clone(a) => xl::clone(a),
        Command::Migrate(a) => xl::migrate(a),
        Command::MemSet(a) => xl::mem_set(a),
        Command::MemMax(a) => xl::mem_max(a),
        Command::BlockList(a) => xl::device_list("block", a),
        Command::BlockAttach(a) => xl::attach("block-attach", a),
        Command::BlockDetach(a) => xl::detach("block-detach", a),
        Command::NetworkAttach(a) => xl::attach("network-attach", a),
        Command::NetworkDetach(a) => xl::detach("network-detach", a),
        Command::NetworkList(a) => xl::device_list("net", a),
        Command::Info(a) => xl::info(a),
        Command::Rename(a) => xl::rename(a),
        Command::VcpuList(a) => xl::vcpu_list(a),
        Command::VcpuPin(a) => xl::vcpu_pin(a),
        Command::SchedCredit(a) => xl::sched_credit(a),
        Command::Top(a) => xl::top(a),
        Command::Console(a) => xl::console(a),
        Command::Dmesg(a) => xl::dmesg(a),
    }
}
