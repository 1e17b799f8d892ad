//! A domain's configuration as the daemon keeps it ([`DomainConfig`]):
//! what its xl.cfg file and the command line's `key=value` overrides said
//! (parsed once, by `domus-xlcfg`, when the domain is created; paths made
//! absolute), with the changes made since (mem-max, sched-credit,
//! block-attach and -detach, network-attach and -detach, rename). The
//! daemon stores it as JSON in its database and starts every VMM of the
//! domain from it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// What happens when the guest powers off, reboots or crashes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Destroy,
    Restart,
    Preserve,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Destroy => "destroy",
            Action::Restart => "restart",
            Action::Preserve => "preserve",
        }
    }
}

/// A disk from `disk = [...]` (or `block-attach`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Disk {
    pub path: PathBuf,
    #[serde(default, skip_serializing_if = "crate::spec::DiskFormat::is_raw")]
    pub format: crate::spec::DiskFormat,
    /// The virtual device name as written (xvda, hda, sda, vda, ...).
    pub vdev: String,
    #[serde(default)]
    pub read_only: bool,
}

/// An interface from `vif = [...]` (or `network-attach`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Vif {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bridge: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// Bytes per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<u64>,
    /// The virtual firewall-router's inbound rule: when `tcp` or `udp` is
    /// given, new inbound connections reach only the ports listed (of
    /// either protocol; replies to the domain's own connections always do).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<Vec<PortRange>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udp: Option<Vec<PortRange>>,
    /// No traffic between this interface and other domains' (the host and
    /// the outside world are still reached).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub isolated: bool,
    /// Whether the guest is offered mergeable receive buffers
    /// (`mrg_rxbuf=0|1`; see [`crate::spec::NetSpec::mrg_rxbuf`]); left
    /// out, the VMM's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mrg_rxbuf: Option<bool>,
    /// Whether the guest is offered indirect descriptors
    /// (`indirect_desc=0|1`; see [`crate::spec::NetSpec::indirect_desc`]);
    /// left out, the VMM's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub indirect_desc: Option<bool>,
}

impl Vif {
    /// The addresses of `ip=` (xl's: one or more, separated by spaces).
    pub fn addresses(&self) -> Result<Vec<std::net::IpAddr>, String> {
        self.ip
            .as_deref()
            .unwrap_or("")
            .split_whitespace()
            .map(|a| {
                a.parse()
                    .map_err(|_| format!("ip '{a}' is not an IP address"))
            })
            .collect()
    }

    /// Whether inbound connections are limited to listed ports.
    pub fn filters_ports(&self) -> bool {
        self.tcp.is_some() || self.udp.is_some()
    }
}

/// Ports `first` to `last`, both included.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    /// `22` or `8000-8080` (ports 1 to 65535, ascending).
    pub fn parse(s: &str) -> Result<Self, String> {
        let port = |p: &str| {
            p.parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| format!("'{p}' is not a port (1 to 65535)"))
        };
        let r = match s.split_once('-') {
            Some((a, b)) => PortRange {
                first: port(a)?,
                last: port(b)?,
            },
            None => {
                let p = port(s)?;
                PortRange { first: p, last: p }
            }
        };
        if r.first > r.last {
            return Err(format!("port range '{s}' runs backwards"));
        }
        Ok(r)
    }
}

impl std::fmt::Display for PortRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last)
        }
    }
}

/// A domain's configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DomainConfig {
    pub name: String,
    pub memory_mib: u64,
    pub maxmem_mib: u64,
    pub vcpus: u32,
    /// Host CPUs the vCPUs may run on, as a CPU list ("0-3,6").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<String>,
    /// Credit scheduler weight, 1 to 65535 (default 256).
    pub cpu_weight: u32,
    /// CPU cap in percent of one CPU (0: none).
    pub cap: u32,
    pub kernel: PathBuf,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ramdisk: Option<PathBuf>,
    pub cmdline: String,
    #[serde(default)]
    pub disks: Vec<Disk>,
    #[serde(default)]
    pub vifs: Vec<Vif>,
    /// A virtio-vsock device with this context id (`vsock = 'cid=N'`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vsock_cid: Option<u64>,
    /// Let the host's KSM merge this domain's identical memory pages with
    /// other pages (`mergeable = 1`; off by default: page sharing is a
    /// side channel between domains).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mergeable: bool,
    /// CPUID bits forced in every vCPU (`cpuid = ["LEAF:REG=BITS"]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cpuid: Vec<crate::cpuid::CpuidRule>,
    pub on_poweroff: Action,
    pub on_reboot: Action,
    pub on_crash: Action,
    /// `image = "NAME"`: booted from an image of `domus image build`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<crate::image::ImageUse>,
}

impl DomainConfig {
    /// Makes the kernel's, the ramdisk's and the disks' paths absolute,
    /// relative to `dir` (where the configuration file is).
    pub fn make_absolute(&mut self, dir: &Path) {
        // An empty kernel is one an image gives later.
        let abs = |p: &mut PathBuf| {
            if p.is_relative() && !p.as_os_str().is_empty() {
                *p = dir.join(&*p);
            }
        };
        abs(&mut self.kernel);
        if let Some(r) = self.ramdisk.as_mut() {
            abs(r);
        }
        for d in &mut self.disks {
            abs(&mut d.path);
        }
    }
}

/// Whether `name` may name a domain: 1 to 64 of `[A-Za-z0-9-_.]`, not all
/// digits (those are ids), and not `Domain-0` (the host), in any case.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.eq_ignore_ascii_case("Domain-0") {
        return Err(format!("'{name}' is the host's name (Domain-0)"));
    }
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && !name.bytes().all(|b| b.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "'{}' is not 1-64 of [A-Za-z0-9-_.] (and not all digits)",
            name.escape_debug()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> DomainConfig {
        DomainConfig {
            name: "web-1".into(),
            memory_mib: 256,
            maxmem_mib: 512,
            vcpus: 2,
            cpus: Some("0-1".into()),
            cpu_weight: 256,
            cap: 0,
            kernel: "k/vmlinuz".into(),
            ramdisk: Some("/k/initrd".into()),
            cmdline: "console=ttyS0".into(),
            disks: vec![Disk {
                path: "web.raw".into(),
                format: Default::default(),
                vdev: "xvda".into(),
                read_only: false,
            }],
            vifs: vec![Vif {
                mac: Some("52:54:00:00:00:01".into()),
                rate: Some(1_250_000),
                ..Vif::default()
            }],
            vsock_cid: Some(7),
            mergeable: false,
            cpuid: Vec::new(),
            on_poweroff: Action::Destroy,
            on_reboot: Action::Restart,
            on_crash: Action::Preserve,
            image: None,
        }
    }

    #[test]
    fn a_config_survives_json_and_refuses_unknown_fields() {
        let c = config();
        let j = serde_json::to_string(&c).unwrap();
        assert!(j.contains(r#""on_crash":"preserve""#), "{j}");
        assert_eq!(serde_json::from_str::<DomainConfig>(&j).unwrap(), c);
        let mut v: serde_json::Value = serde_json::from_str(&j).unwrap();
        v["disks"][0]["size"] = 1.into();
        let e = serde_json::from_value::<DomainConfig>(v).unwrap_err();
        assert!(e.to_string().contains("unknown field `size`"), "{e}");
    }

    #[test]
    fn paths_are_made_absolute_once() {
        let mut c = config();
        c.make_absolute(Path::new("/etc/domus"));
        assert_eq!(c.kernel, PathBuf::from("/etc/domus/k/vmlinuz"));
        assert_eq!(c.ramdisk, Some(PathBuf::from("/k/initrd")));
        assert_eq!(c.disks[0].path, PathBuf::from("/etc/domus/web.raw"));
        let again = c.clone();
        c.make_absolute(Path::new("/elsewhere"));
        assert_eq!(c, again);
    }

    #[test]
    fn names() {
        for good in ["a", "web-1", "x.y_z", "1a"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "123",
            "a b",
            "a\nb",
            "a'b",
            "Domain-0",
            "domain-0",
            &"x".repeat(65),
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_name("a\x1b[1m").unwrap_err().contains("\\u{1b}"));
    }
}
