//! What `domus run` is asked to boot, and the checks that turn bad input into
//! one clear error before anything is allocated.

use std::fs::File;
use std::path::{Path, PathBuf};

use domus_api::cpuid::CpuidRule;
use domus_api::spec::{Checked, DiskSpec, JailSpec, NetSpec, VmSpec};
use domus_api::vmm::RateLimit;
use domus_boot::layout::MIN_MEMORY;
use domus_virtio::block::DiskConfig;
use domus_virtio::net::NetConfig;
use domus_virtio::ratelimit::Limits;

pub use domus_api::spec::parse_size;

/// Where the guest's serial console goes (`stdout`, `none`, `file:PATH`).
pub type Console = domus_api::spec::ConsoleSpec;

#[derive(Clone, Debug)]
pub struct VmConfig {
    pub kernel: PathBuf,
    pub initrd: Option<PathBuf>,
    pub cmdline: String,
    pub vcpus: u32,
    /// Guest memory in bytes.
    pub memory: u64,
    pub console: Console,
    /// virtio-blk disks, in the order the guest sees them (vda, vdb, ...),
    /// checked.
    pub disks: Vec<DiskSpec>,
    /// virtio-net interfaces on taps, in order (eth0, eth1, ...), checked.
    pub nets: Vec<NetSpec>,
    /// A virtio-vsock device with this CID (on the host's vhost-vsock).
    pub vsock_cid: Option<u64>,
    /// A virtio-rng device fed from the host's getrandom.
    pub rng: bool,
    /// A virtio-balloon device (inflate/deflate, statistics, free page
    /// reporting).
    pub balloon: bool,
    /// The memory the guest keeps from the start, in bytes (the balloon's
    /// first target).
    pub balloon_target: Option<u64>,
    /// The seccomp filter ([`crate::seccomp`]) on every thread.
    pub seccomp: bool,
    /// Populate all guest memory, and KVM's page tables for it, before the
    /// guest runs ([`crate::memory::prefault`]).
    pub prefault: bool,
    /// Guest memory open to KSM (MADV_MERGEABLE).
    pub mergeable: bool,
    /// CPUID bits forced in every vCPU, checked ([`crate::cpuid::force`]).
    pub cpuid: Vec<CpuidRule>,
    /// Where to serve the domain's REST API.
    pub api_socket: Option<PathBuf>,
    /// The domain's name (shown by the API).
    pub name: String,
    /// The jail entered once the domain is set up ([`domus_jail::enter`]).
    pub jail: Option<JailSpec>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("{what} {path}: {reason}")]
    File {
        what: &'static str,
        path: String,
        reason: String,
    },
    #[error("--vcpus must be at least 1")]
    NoVcpus,
    #[error("--vcpus {0} is more than this host's KVM allows ({1})")]
    TooManyVcpus(u32, u32),
    #[error("--memory {0} MiB is below the {min} MiB a kernel needs", min = MIN_MEMORY >> 20)]
    TooLittleMemory(u64),
    #[error("--memory {0} MiB is more than this host has ({1} MiB)")]
    TooMuchMemory(u64, u64),
}

/// Parses a `--net` value: `tap=NAME[,mac=MAC][,bw=SIZE][,pps=N]`; `bw`
/// is bytes per second and `pps` packets per second, both directions
/// together.
pub fn parse_net(s: &str) -> Result<NetConfig, String> {
    s.parse::<NetSpec>().map(|n| net_config(&n))
}

/// Parses a `--disk` value: `PATH[,ro][,id=NAME][,bw=SIZE][,iops=N]`, where
/// `bw` is bytes per second (`bw=10M` is 10 MiB/s) and `iops` operations
/// per second.
pub fn parse_disk(s: &str) -> Result<DiskConfig, String> {
    s.parse::<DiskSpec>().map(|d| disk_config(&d))
}

fn limits(r: &RateLimit) -> Limits {
    Limits {
        bytes_per_sec: r.bandwidth.filter(|v| *v > 0),
        ops_per_sec: r.iops.filter(|v| *v > 0),
    }
}

/// The device configuration of a disk spec (checked when it was read).
pub fn disk_config(d: &DiskSpec) -> DiskConfig {
    DiskConfig {
        path: d.path.clone(),
        format: d.format,
        read_only: d.read_only,
        id: d.id.clone(),
        limits: limits(&d.rate_limit),
        passed: d.passed,
        passed_backing: d.passed_backing.clone(),
    }
}

/// The device configuration of an interface spec (checked when it was
/// read, so its MAC parses).
pub fn net_config(n: &NetSpec) -> NetConfig {
    NetConfig {
        tap: n.tap.clone(),
        mac: n.mac.as_deref().and_then(domus_api::spec::parse_mac),
        limits: limits(&n.rate_limit),
        passed: n.passed,
        mrg_rxbuf: n.mrg_rxbuf.unwrap_or(true),
        indirect_desc: n.indirect_desc.unwrap_or(true),
    }
}

fn check_file(what: &'static str, path: &Path) -> Result<(), ConfigError> {
    let err = |reason: String| ConfigError::File {
        what,
        path: path.display().to_string(),
        reason,
    };
    let meta = std::fs::metadata(path).map_err(|e| err(io_reason(&e)))?;
    if meta.is_dir() {
        return Err(err("is a directory".into()));
    }
    File::open(path).map_err(|e| err(io_reason(&e)))?;
    Ok(())
}

/// An io::Error as a short phrase without the "(os error N)" suffix.
pub fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => {
            let s = e.to_string();
            s.split(" (os error").next().unwrap_or(&s).to_string()
        }
    }
}

/// Host memory in bytes, from /proc/meminfo's MemTotal.
pub fn host_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib << 10)
}

impl VmConfig {
    /// The configuration a [`VmSpec`] describes (its `exit_file` is the
    /// caller's), each disk and interface checked again: a spec built in
    /// code has not been through a parser.
    pub fn from_spec(s: &VmSpec) -> Result<VmConfig, String> {
        for d in &s.disks {
            d.check()
                .map_err(|e| format!("disk {}: {e}", d.path.display()))?;
        }
        for n in &s.nets {
            n.check().map_err(|e| format!("interface {}: {e}", n.tap))?;
        }
        if let Some(j) = &s.jail {
            j.check().map_err(|e| format!("jail: {e}"))?;
        }
        let memory = s
            .memory_mib
            .checked_mul(1 << 20)
            .ok_or_else(|| format!("memory_mib {} is too large", s.memory_mib))?;
        Ok(VmConfig {
            kernel: s.kernel.clone(),
            initrd: s.initrd.clone(),
            cmdline: s.cmdline.clone(),
            vcpus: s.vcpus,
            memory,
            console: s.console.clone(),
            disks: s.disks.clone(),
            nets: s.nets.clone(),
            vsock_cid: s.vsock_cid,
            rng: s.rng,
            balloon: s.balloon,
            balloon_target: match s.balloon_target_mib {
                Some(_) if !s.balloon => {
                    return Err("balloon_target_mib needs the balloon (balloon: true)".into())
                }
                Some(t) if t > s.memory_mib => {
                    return Err(format!(
                        "balloon_target_mib {t} is more than memory_mib {}",
                        s.memory_mib
                    ))
                }
                t => t.map(|t| t << 20),
            },
            prefault: s.prefault,
            mergeable: s.mergeable,
            cpuid: {
                for r in &s.cpuid {
                    r.check()?;
                }
                s.cpuid.clone()
            },
            seccomp: s.seccomp,
            api_socket: s.api_socket.clone(),
            name: s.name.clone(),
            jail: s.jail.clone(),
        })
    }

    /// The spec this configuration came from, less what only concerns
    /// the VMM process (API socket, exit file, jail): what a snapshot
    /// keeps of the domain.
    pub fn spec(&self) -> VmSpec {
        VmSpec {
            name: self.name.clone(),
            kernel: self.kernel.clone(),
            initrd: self.initrd.clone(),
            cmdline: self.cmdline.clone(),
            vcpus: self.vcpus,
            memory_mib: self.memory >> 20,
            console: self.console.clone(),
            disks: self.disks.clone(),
            nets: self.nets.clone(),
            vsock_cid: self.vsock_cid,
            rng: self.rng,
            balloon: self.balloon,
            balloon_target_mib: self.balloon_target.map(|b| b >> 20),
            prefault: self.prefault,
            mergeable: self.mergeable,
            cpuid: self.cpuid.clone(),
            seccomp: self.seccomp,
            api_socket: None,
            exit_file: None,
            jail: None,
        }
    }

    /// Checks everything that does not need KVM; `max_vcpus` comes from KVM.
    /// A restored domain (`boot` false) needs no kernel or initrd.
    pub fn validate(
        &self,
        max_vcpus: u32,
        host_memory: u64,
        boot: bool,
    ) -> Result<(), ConfigError> {
        if boot {
            check_file("kernel", &self.kernel)?;
            if let Some(i) = &self.initrd {
                check_file("initrd", i)?;
            }
        }
        if self.vcpus == 0 {
            return Err(ConfigError::NoVcpus);
        }
        if self.vcpus > max_vcpus {
            return Err(ConfigError::TooManyVcpus(self.vcpus, max_vcpus));
        }
        if self.memory < MIN_MEMORY {
            return Err(ConfigError::TooLittleMemory(self.memory >> 20));
        }
        if self.memory > host_memory {
            return Err(ConfigError::TooMuchMemory(
                self.memory >> 20,
                host_memory >> 20,
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(kernel: &Path) -> VmConfig {
        VmConfig {
            kernel: kernel.to_path_buf(),
            initrd: None,
            cmdline: String::new(),
            vcpus: 1,
            memory: 256 << 20,
            console: Console::None,
            disks: Vec::new(),
            nets: Vec::new(),
            vsock_cid: None,
            rng: false,
            balloon: false,
            balloon_target: None,
            seccomp: false,
            prefault: false,
            mergeable: false,
            cpuid: Vec::new(),
            api_socket: None,
            jail: None,
            name: "t".into(),
        }
    }

    #[test]
    fn a_balloon_target_needs_the_balloon_and_fits_the_memory() {
        let spec = |balloon, target| VmSpec {
            balloon,
            balloon_target_mib: target,
            ..domus_api::parse_body::<VmSpec>(br#"{"kernel": "/k", "memory_mib": 512}"#).unwrap()
        };
        let c = VmConfig::from_spec(&spec(true, Some(384))).unwrap();
        assert_eq!(c.balloon_target, Some(384 << 20));
        assert_eq!(
            VmConfig::from_spec(&spec(true, None))
                .unwrap()
                .balloon_target,
            None
        );
        let e = VmConfig::from_spec(&spec(false, Some(384))).unwrap_err();
        assert!(e.contains("needs the balloon"), "{e}");
        let e = VmConfig::from_spec(&spec(true, Some(513))).unwrap_err();
        assert!(e.contains("more than memory_mib 512"), "{e}");
    }

    #[test]
    fn flags_become_device_configurations() {
        // The text itself is parsed and checked in domus_api::spec.
        let d = parse_disk("a.raw,ro,id=root,bw=10M,iops=500").unwrap();
        assert_eq!((d.read_only, d.id.as_deref()), (true, Some("root")));
        assert_eq!(d.limits.bytes_per_sec, Some(10 << 20));
        assert_eq!(d.limits.ops_per_sec, Some(500));
        let n = parse_net("tap=tap0,mac=52:54:00:00:00:01,pps=1000").unwrap();
        assert_eq!(n.mac, Some([0x52, 0x54, 0, 0, 0, 1]));
        assert_eq!(
            (n.limits.bytes_per_sec, n.limits.ops_per_sec),
            (None, Some(1000))
        );
        assert!(parse_disk("a,ro=1").is_err() && parse_net("mac=52:54:00:00:00:01").is_err());
    }

    #[test]
    fn a_spec_becomes_a_configuration() {
        let spec: VmSpec = serde_json::from_str(
            r#"{"kernel": "/k", "memory_mib": 512, "disks": ["/a,ro,bw=1M"], "nets": ["tap=t0,mac=52:54:00:00:00:01"]}"#,
        )
        .unwrap();
        let c = VmConfig::from_spec(&spec).unwrap();
        assert_eq!(c.memory, 512 << 20);
        assert!(disk_config(&c.disks[0]).read_only);
        assert_eq!(disk_config(&c.disks[0]).limits.bytes_per_sec, Some(1 << 20));
        assert_eq!(net_config(&c.nets[0]).mac, Some([0x52, 0x54, 0, 0, 0, 1]));
        let mut bad = spec.clone();
        bad.nets[0].mac = Some("01:00:00:00:00:00".into());
        assert!(VmConfig::from_spec(&bad).unwrap_err().contains("multicast"));
        let mut bad = spec;
        bad.memory_mib = u64::MAX;
        assert!(VmConfig::from_spec(&bad).is_err());
    }

    #[test]
    fn validation() {
        let exe = std::env::current_exe().unwrap();
        let c = cfg(&exe);
        assert_eq!(c.validate(4, 1 << 34, true), Ok(()));
        let e = cfg(Path::new("/nonexistent/vmlinuz"))
            .validate(4, 1 << 34, true)
            .unwrap_err();
        assert_eq!(e.to_string(), "kernel /nonexistent/vmlinuz: no such file");
        let e = cfg(Path::new("/")).validate(4, 1 << 34, true).unwrap_err();
        assert!(e.to_string().ends_with("is a directory"));
        let mut c2 = c.clone();
        c2.initrd = Some("/nonexistent/initrd".into());
        assert!(c2
            .validate(4, 1 << 34, true)
            .unwrap_err()
            .to_string()
            .starts_with("initrd "));
        let mut c2 = c.clone();
        c2.vcpus = 0;
        assert_eq!(c2.validate(4, 1 << 34, true), Err(ConfigError::NoVcpus));
        c2.vcpus = 5;
        assert_eq!(
            c2.validate(4, 1 << 34, true),
            Err(ConfigError::TooManyVcpus(5, 4))
        );
        let mut c2 = c.clone();
        c2.memory = 32 << 20;
        assert_eq!(
            c2.validate(4, 1 << 34, true),
            Err(ConfigError::TooLittleMemory(32))
        );
        c2.memory = 1 << 35;
        assert!(matches!(
            c2.validate(4, 1 << 34, true),
            Err(ConfigError::TooMuchMemory(32768, 16384))
        ));
    }

    #[test]
    fn host_memory_is_read() {
        assert!(host_memory().unwrap() > 64 << 20);
    }
}
