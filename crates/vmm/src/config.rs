//! What `domus run` is asked to boot, and the checks that turn bad input into
//! one clear error before anything is allocated.

use std::fs::File;
use std::path::{Path, PathBuf};

use domus_boot::layout::MIN_MEMORY;
use domus_virtio::block::DiskConfig;
use domus_virtio::net::NetConfig;

/// Where the guest's serial console goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Console {
    Stdout,
    File(PathBuf),
    None,
}

impl std::str::FromStr for Console {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "stdout" => Ok(Console::Stdout),
            "none" => Ok(Console::None),
            _ => match s.strip_prefix("file:") {
                Some(p) if !p.is_empty() => Ok(Console::File(PathBuf::from(p))),
                _ => Err(format!("'{s}' is not stdout, none or file:PATH")),
            },
        }
    }
}

#[derive(Clone, Debug)]
pub struct VmConfig {
    pub kernel: PathBuf,
    pub initrd: Option<PathBuf>,
    pub cmdline: String,
    pub vcpus: u32,
    /// Guest memory in bytes.
    pub memory: u64,
    pub console: Console,
    /// virtio-blk disks, in the order the guest sees them (vda, vdb, ...).
    pub disks: Vec<DiskConfig>,
    /// virtio-net interfaces on taps, in order (eth0, eth1, ...).
    pub nets: Vec<NetConfig>,
    /// A virtio-vsock device with this CID (on the host's vhost-vsock).
    pub vsock_cid: Option<u64>,
    /// A virtio-rng device fed from the host's getrandom.
    pub rng: bool,
    /// A virtio-balloon device (inflate/deflate, statistics, free page
    /// reporting).
    pub balloon: bool,
    /// Populate all guest memory, and KVM's page tables for it, before the
    /// guest runs ([`crate::memory::prefault`]).
    pub prefault: bool,
    /// Where to serve the domain's REST API.
    pub api_socket: Option<PathBuf>,
    /// The domain's name (shown by the API).
    pub name: String,
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

/// Parses a `--vsock` value: `cid=N` (3 or more).
pub fn parse_vsock(s: &str) -> Result<u64, String> {
    let v = s.strip_prefix("cid=").unwrap_or(s);
    let cid: u64 = v
        .parse()
        .map_err(|_| format!("'{s}': expected cid=N, N a whole number"))?;
    if !(3..u64::from(u32::MAX)).contains(&cid) {
        return Err(format!(
            "'{s}': CIDs 0, 1 and 2 are reserved (and 2^32 - 1)"
        ));
    }
    Ok(cid)
}

/// Parses a `--net` value: `tap=NAME[,mac=MAC][,bw=SIZE][,pps=N]`; `bw`
/// is bytes per second and `pps` packets per second, both directions
/// together.
pub fn parse_net(s: &str) -> Result<NetConfig, String> {
    let mut n = NetConfig::default();
    for p in s.split(',') {
        let (k, v) = p.split_once('=').unwrap_or((p, ""));
        match (k, v) {
            ("tap", v) if !v.is_empty() => n.tap = v.to_string(),
            ("mac", v) => {
                let m = domus_virtio::net::parse_mac(v)
                    .ok_or_else(|| format!("'{p}': a MAC is six hex pairs, 52:54:00:12:34:56"))?;
                if m[0] & 1 != 0 {
                    return Err(format!("'{p}': a multicast MAC cannot be an interface's"));
                }
                n.mac = Some(m);
            }
            ("bw", v) => {
                let bytes = parse_rate_size(v).map_err(|e| format!("'{p}': {e}"))?;
                n.limits.bytes_per_sec = Some(bytes);
            }
            ("pps", v) => {
                let r: u64 = v
                    .parse()
                    .map_err(|_| format!("'{p}': pps must be a whole number"))?;
                n.limits.ops_per_sec = Some(r);
            }
            _ => {
                return Err(format!(
                    "'{p}': unknown network option (known: tap=NAME, mac=MAC, bw=SIZE, pps=N)"
                ))
            }
        }
    }
    if n.tap.is_empty() {
        return Err(format!("'{s}': the interface needs tap=NAME"));
    }
    Ok(n)
}

/// Parses a `--disk` value: `PATH[,ro][,id=NAME][,bw=SIZE][,iops=N]`, where
/// `bw` is bytes per second (`bw=10M` is 10 MiB/s) and `iops` operations
/// per second.
pub fn parse_disk(s: &str) -> Result<DiskConfig, String> {
    let mut parts = s.split(',');
    let path = parts.next().unwrap_or_default();
    let path = path.strip_prefix("path=").unwrap_or(path);
    if path.is_empty() {
        return Err(format!(
            "'{s}': the disk needs a path (PATH[,ro][,id=NAME])"
        ));
    }
    let mut d = DiskConfig {
        path: PathBuf::from(path),
        ..Default::default()
    };
    for p in parts {
        let (k, v) = p.split_once('=').unwrap_or((p, ""));
        match (k, v) {
            ("ro", "") => d.read_only = true,
            ("rw", "") => d.read_only = false,
            ("id", v) => {
                if v.is_empty() || v.len() > 20 || !v.bytes().all(|b| b.is_ascii_graphic()) {
                    return Err(format!(
                        "'{p}': a disk id is 1 to 20 printable characters without spaces"
                    ));
                }
                d.id = Some(v.to_string());
            }
            ("bw", v) => {
                let bytes = parse_rate_size(v).map_err(|e| format!("'{p}': {e}"))?;
                d.limits.bytes_per_sec = Some(bytes);
            }
            ("iops", v) => {
                let n: u64 = v
                    .parse()
                    .map_err(|_| format!("'{p}': iops must be a whole number"))?;
                d.limits.ops_per_sec = Some(n);
            }
            _ => {
                return Err(format!(
                    "'{p}': unknown disk option (known: ro, rw, id=NAME, bw=SIZE, iops=N)"
                ))
            }
        }
    }
    Ok(d)
}

/// A byte count with an optional unit where plain numbers are bytes.
fn parse_rate_size(v: &str) -> Result<u64, String> {
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        return v.parse().map_err(|_| format!("'{v}' is too large"));
    }
    parse_size(v)
}

/// Parses a memory size: `256M`, `1G`, `512MiB`, `2048K`, or plain MiB (`512`).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size (examples: 256M, 1G, 512)"))?;
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "m" | "mb" | "mib" => 20,
        "k" | "kb" | "kib" => 10,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(format!("'{s}': unknown unit '{unit}' (use K, M, G or T)")),
    };
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("'{s}' is too large"))
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
    /// Checks everything that does not need KVM; `max_vcpus` comes from KVM.
    pub fn validate(&self, max_vcpus: u32, host_memory: u64) -> Result<(), ConfigError> {
        check_file("kernel", &self.kernel)?;
        if let Some(i) = &self.initrd {
            check_file("initrd", i)?;
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

    #[test]
    fn sizes() {
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("512"), Ok(512 << 20));
        assert_eq!(parse_size("2048k"), Ok(2 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("64MB"), Ok(64 << 20));
        assert!(parse_size("").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("12X").is_err());
        assert!(parse_size("-1G").is_err());
        assert!(parse_size("1.5G").is_err());
        assert!(parse_size("99999999999999999999").is_err());
        assert!(parse_size("17179869184T").is_err());
    }

    #[test]
    fn consoles() {
        assert_eq!("stdout".parse(), Ok(Console::Stdout));
        assert_eq!("none".parse(), Ok(Console::None));
        assert_eq!("file:/tmp/x".parse(), Ok(Console::File("/tmp/x".into())));
        assert!("file:".parse::<Console>().is_err());
        assert!("tty".parse::<Console>().is_err());
    }

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
            prefault: false,
            api_socket: None,
            name: "t".into(),
        }
    }

    #[test]
    fn net_specs() {
        let n = parse_net("tap=tap0,mac=52:54:00:00:00:01,bw=10M,pps=1000").unwrap();
        assert_eq!(n.tap, "tap0");
        assert_eq!(n.mac, Some([0x52, 0x54, 0, 0, 0, 1]));
        assert_eq!(n.limits.bytes_per_sec, Some(10 << 20));
        assert_eq!(n.limits.ops_per_sec, Some(1000));
        for bad in [
            "",
            "mac=52:54:00:00:00:01",
            "tap=",
            "tap=t,mac=01:00:00:00:00:00",
            "tap=t,mac=zz",
            "tap=t,pps=x",
            "tap=t,colour=red",
        ] {
            assert!(parse_net(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn disk_specs() {
        let d = parse_disk("/img/a.raw").unwrap();
        assert_eq!(d.path, PathBuf::from("/img/a.raw"));
        assert!(!d.read_only);
        let d = parse_disk("a.raw,ro,id=root,bw=10M,iops=500").unwrap();
        assert!(d.read_only);
        assert_eq!(d.id.as_deref(), Some("root"));
        assert_eq!(d.limits.bytes_per_sec, Some(10 << 20));
        assert_eq!(d.limits.ops_per_sec, Some(500));
        assert_eq!(
            parse_disk("a,bw=4096").unwrap().limits.bytes_per_sec,
            Some(4096)
        );
        for bad in [
            "",
            ",ro",
            "a,rox",
            "a,id=",
            "a,id=abcdefghijklmnopqrstu",
            "a,id=a b",
            "a,bw=fast",
            "a,iops=-1",
            "a,ro=1",
        ] {
            assert!(parse_disk(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn validation() {
        let exe = std::env::current_exe().unwrap();
        let c = cfg(&exe);
        assert_eq!(c.validate(4, 1 << 34), Ok(()));
        let e = cfg(Path::new("/nonexistent/vmlinuz"))
            .validate(4, 1 << 34)
            .unwrap_err();
        assert_eq!(e.to_string(), "kernel /nonexistent/vmlinuz: no such file");
        let e = cfg(Path::new("/")).validate(4, 1 << 34).unwrap_err();
        assert!(e.to_string().ends_with("is a directory"));
        let mut c2 = c.clone();
        c2.initrd = Some("/nonexistent/initrd".into());
        assert!(c2
            .validate(4, 1 << 34)
            .unwrap_err()
            .to_string()
            .starts_with("initrd "));
        let mut c2 = c.clone();
        c2.vcpus = 0;
        assert_eq!(c2.validate(4, 1 << 34), Err(ConfigError::NoVcpus));
        c2.vcpus = 5;
        assert_eq!(
            c2.validate(4, 1 << 34),
            Err(ConfigError::TooManyVcpus(5, 4))
        );
        let mut c2 = c.clone();
        c2.memory = 32 << 20;
        assert_eq!(
            c2.validate(4, 1 << 34),
            Err(ConfigError::TooLittleMemory(32))
        );
        c2.memory = 1 << 35;
        assert!(matches!(
            c2.validate(4, 1 << 34),
            Err(ConfigError::TooMuchMemory(32768, 16384))
        ));
    }

    #[test]
    fn host_memory_is_read() {
        assert!(host_memory().unwrap() > 64 << 20);
    }
}
