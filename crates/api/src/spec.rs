//! What a domain is made of: [`VmSpec`], which `domus run --config FILE`
//! reads and the daemon writes for each VMM it starts, and its disks
//! ([`DiskSpec`]) and interfaces ([`NetSpec`]), which hot-plug sends too.
//!
//! A disk or an interface is one type with two written forms: a JSON
//! object, and the command-line text of `domus run --disk` and `--net`
//! (`/img/a.raw,ro,bw=10M`, `tap=t0,mac=52:54:00:12:34:56`). Both are
//! parsed here, once, and checked the same way.

use std::path::{Component, PathBuf};
use std::str::FromStr;

use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer, Serialize};

use crate::vmm::RateLimit;

/// A size: `256M`, `1G`, `512MiB`, `2048K`, or plain MiB (`512`), in bytes.
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

/// A rate in bytes per second: plain numbers are bytes, `10M` is 10 MiB.
fn parse_rate(v: &str) -> Result<u64, String> {
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        return v.parse().map_err(|_| format!("'{v}' is too large"));
    }
    parse_size(v)
}

/// Sets a limit from option `p` (`KEY=v`): bytes per second (`bw`) or
/// operations per second (`iops`, `pps`).
fn set_rate(r: &mut RateLimit, bytes: bool, p: &str, v: &str) -> Result<(), String> {
    if bytes {
        r.bandwidth = Some(parse_rate(v).map_err(|e| format!("'{p}': {e}"))?);
    } else {
        let n = v
            .parse()
            .map_err(|_| format!("'{p}': a rate is a whole number per second"))?;
        r.iops = Some(n);
    }
    Ok(())
}

/// An on/off setting as xl writes it and as a command line might: `1`,
/// `yes`, `true`, `on` or `0`, `no`, `false`, `off`.
pub fn parse_switch(s: &str) -> Option<bool> {
    match s {
        "1" | "yes" | "true" | "on" => Some(true),
        "0" | "no" | "false" | "off" => Some(false),
        _ => None,
    }
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut m = [0u8; 6];
    let mut parts = s.split(':');
    for b in m.iter_mut() {
        let p = parts.next()?;
        if p.len() != 2 {
            return None;
        }
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(m)
}

/// Parses a vsock device: `cid=N` (or `N`), N from 3 (0, 1 and 2 are
/// reserved) to 2^32 - 2, as `domus run --vsock` and xl.cfg's `vsock`
/// take it.
pub fn parse_vsock(s: &str) -> Result<u64, String> {
    let v = s.trim();
    let v = v.strip_prefix("cid=").unwrap_or(v);
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

/// A type whose every value, however it was written, must pass a check.
pub trait Checked {
    fn check(&self) -> Result<(), String>;
}

/// A disk image's format (raw or qcow2), never probed from the file: a
/// raw disk whose guest wrote a qcow2 header into it stays raw.
pub use domus_disk::Format as DiskFormat;

/// A virtio-blk disk on a raw image file or a qcow2 image.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskSpec {
    pub path: PathBuf,
    #[serde(default, skip_serializing_if = "DiskFormat::is_raw")]
    pub format: DiskFormat,
    #[serde(default)]
    pub read_only: bool,
    /// The serial the guest sees: 1 to 20 printable characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Bytes and requests per second (none: unlimited).
    #[serde(default)]
    pub rate_limit: RateLimit,
    /// For a jailed VMM, which cannot open host files: the supervisor
    /// opened `path` and passed the descriptor on the VMM's descriptor
    /// socket (`JailSpec::fd_socket`) with this tag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passed: Option<u64>,
    /// The tags of the descriptors passed for a qcow2 disk's backing files,
    /// in chain order (with `passed`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub passed_backing: Vec<u64>,
}

impl Checked for DiskSpec {
    fn check(&self) -> Result<(), String> {
        if self.path.as_os_str().is_empty() {
            return Err("the disk needs a path".into());
        }
        if !self.passed_backing.is_empty() && self.passed.is_none() {
            return Err("passed_backing without passed".into());
        }
        if let Some(id) = &self.id {
            if id.is_empty() || id.len() > 20 || !id.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(format!(
                    "disk id '{id}': 1 to 20 printable characters without spaces"
                ));
            }
        }
        Ok(())
    }
}

impl FromStr for DiskSpec {
    type Err = String;

    /// `PATH[,format=raw|qcow2][,ro][,id=NAME][,bw=SIZE][,iops=N]`: `bw`
    /// in bytes per second (`bw=10M` is 10 MiB/s), `iops` in requests per
    /// second.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut parts = s.split(',');
        let path = parts.next().unwrap_or_default();
        let path = path.strip_prefix("path=").unwrap_or(path);
        if path.is_empty() {
            return Err(format!(
                "'{s}': the disk needs a path (PATH[,ro][,id=NAME])"
            ));
        }
        let mut d = DiskSpec {
            path: PathBuf::from(path),
            ..Default::default()
        };
        for p in parts {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            match (k, v) {
                ("ro", "") => d.read_only = true,
                ("rw", "") => d.read_only = false,
                ("id", v) => d.id = Some(v.to_string()),
                ("format", v) => d.format = v.parse().map_err(|e| format!("'{s}': {e}"))?,
                ("bw" | "iops", v) => set_rate(&mut d.rate_limit, k == "bw", p, v)?,
                _ => {
                    return Err(format!(
                        "'{p}': unknown disk option (known: format=raw|qcow2, ro, rw, id=NAME, bw=SIZE, iops=N)"
                    ))
                }
            }
        }
        d.check().map_err(|e| format!("'{s}': {e}"))?;
        Ok(d)
    }
}

/// A virtio-net interface on a tap device.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetSpec {
    /// The tap: opened if it exists (on a bridge), created otherwise.
    pub tap: String,
    /// `52:54:00:12:34:56`; left out, one is made from the tap's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// Bytes and packets per second, both directions together.
    #[serde(default)]
    pub rate_limit: RateLimit,
    /// For a jailed VMM, which cannot open /dev/net/tun: the supervisor
    /// opened it and passed the descriptor on the VMM's descriptor socket
    /// (`JailSpec::fd_socket`) with this tag; the tap must be the jail's
    /// user's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passed: Option<u64>,
    /// Whether the guest is offered mergeable receive buffers
    /// (`VIRTIO_NET_F_MRG_RXBUF`); left out, they are. Without them Linux
    /// posts each receive buffer as one large chain of pages (its "big
    /// packets" mode: a Debian 12 guest's ring held 8.4 MiB more of its
    /// memory, against 0.5 MiB with them) and takes a large frame in one
    /// buffer instead of spreading it over several.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mrg_rxbuf: Option<bool>,
    /// Whether the guest is offered indirect descriptors
    /// (`VIRTIO_RING_F_INDIRECT_DESC`); left out, they are. With them Linux
    /// sends a frame of many pieces (a 64 KiB TSO frame) in one slot of the
    /// transmit ring, which then never fills; without, each piece takes a
    /// slot (QEMU's `indirect_desc=off`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub indirect_desc: Option<bool>,
}

impl Checked for NetSpec {
    fn check(&self) -> Result<(), String> {
        if self.tap.is_empty() {
            return Err("the interface needs tap=NAME".into());
        }
        if let Some(mac) = &self.mac {
            let m = parse_mac(mac)
                .ok_or_else(|| format!("MAC '{mac}': six hex pairs, like 52:54:00:12:34:56"))?;
            if m[0] & 1 != 0 {
                return Err(format!(
                    "MAC '{mac}': a multicast MAC cannot be an interface's"
                ));
            }
        }
        Ok(())
    }
}

impl FromStr for NetSpec {
    type Err = String;

    /// `tap=NAME[,mac=MAC][,bw=SIZE][,pps=N][,mrg_rxbuf=on|off][,indirect_desc=on|off]`.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut n = NetSpec::default();
        for p in s.split(',') {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            match (k, v) {
                ("tap", v) if !v.is_empty() => n.tap = v.to_string(),
                ("mac", v) => n.mac = Some(v.to_lowercase()),
                ("bw" | "pps", v) => set_rate(&mut n.rate_limit, k == "bw", p, v)?,
                ("mrg_rxbuf", v) => {
                    n.mrg_rxbuf = Some(parse_switch(v).ok_or_else(|| {
                        format!("'{p}': mrg_rxbuf is on or off (1 or 0)")
                    })?)
                }
                ("indirect_desc", v) => {
                    n.indirect_desc = Some(parse_switch(v).ok_or_else(|| {
                        format!("'{p}': indirect_desc is on or off (1 or 0)")
                    })?)
                }
                _ => {
                    return Err(format!(
                        "'{p}': unknown network option (known: tap=NAME, mac=MAC, bw=SIZE, pps=N, mrg_rxbuf=on|off, indirect_desc=on|off)"
                    ))
                }
            }
        }
        n.check().map_err(|e| format!("'{s}': {e}"))?;
        Ok(n)
    }
}

/// Reads a [`DiskSpec`] or [`NetSpec`] written either way: its command-line
/// text, or an object (whose unknown fields are refused by name), checked.
fn either<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr<Err = String> + DeserializeOwned + Checked,
{
    match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(s) => s.parse().map_err(D::Error::custom),
        v => {
            let t: T = serde_json::from_value(v).map_err(D::Error::custom)?;
            t.check().map_err(D::Error::custom)?;
            Ok(t)
        }
    }
}

/// One value read by [`either`], for the containers below.
#[derive(Deserialize)]
#[serde(bound = "T: FromStr<Err = String> + DeserializeOwned + Checked")]
struct Either<T>(#[serde(deserialize_with = "either")] T);

/// [`either`] for an optional field.
pub(crate) fn either_opt<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr<Err = String> + DeserializeOwned + Checked,
{
    Ok(Option::<Either<T>>::deserialize(d)?.map(|e| e.0))
}

/// [`either`] for a list.
fn either_vec<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr<Err = String> + DeserializeOwned + Checked,
{
    Ok(Vec::<Either<T>>::deserialize(d)?
        .into_iter()
        .map(|e| e.0)
        .collect())
}

/// Where the serial console goes: `"stdout"`, `"none"`, or
/// `{"file": PATH}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum ConsoleSpec {
    #[default]
    Stdout,
    None,
    File(PathBuf),
}

impl FromStr for ConsoleSpec {
    type Err = String;

    /// `stdout`, `none` or `file:PATH`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "stdout" => Ok(ConsoleSpec::Stdout),
            "none" => Ok(ConsoleSpec::None),
            _ => match s.strip_prefix("file:") {
                Some(p) if !p.is_empty() => Ok(ConsoleSpec::File(PathBuf::from(p))),
                _ => Err(format!("'{s}' is not stdout, none or file:PATH")),
            },
        }
    }
}

fn default_cmdline() -> String {
    "console=ttyS0 panic=-1".into()
}

fn one() -> u32 {
    1
}

fn default_memory() -> u64 {
    256
}

fn yes() -> bool {
    true
}

fn default_name() -> String {
    "domain".into()
}

/// Everything `domus run` boots a domain from: what its flags say, as one
/// JSON document (`domus run --config FILE`). Left out, a field takes the
/// flag's default.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmSpec {
    /// The domain's name, as its API reports it.
    #[serde(default = "default_name")]
    pub name: String,
    /// A bzImage or an uncompressed ELF vmlinux.
    pub kernel: PathBuf,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd: Option<PathBuf>,
    #[serde(default = "default_cmdline")]
    pub cmdline: String,
    #[serde(default = "one")]
    pub vcpus: u32,
    #[serde(default = "default_memory")]
    pub memory_mib: u64,
    #[serde(default)]
    pub console: ConsoleSpec,
    /// In the order the guest sees them (vda, vdb, ...).
    #[serde(default, deserialize_with = "either_vec")]
    pub disks: Vec<DiskSpec>,
    /// In the order the guest sees them (eth0, eth1, ...).
    #[serde(default, deserialize_with = "either_vec")]
    pub nets: Vec<NetSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vsock_cid: Option<u64>,
    /// The virtio-rng entropy device.
    #[serde(default = "yes")]
    pub rng: bool,
    #[serde(default)]
    pub balloon: bool,
    /// The memory the guest keeps from the start (MiB): the balloon holds
    /// the rest of `memory_mib` before the guest's driver first looks, as
    /// xl starts a domain whose memory is below its maxmem. Needs
    /// `balloon`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balloon_target_mib: Option<u64>,
    #[serde(default)]
    pub prefault: bool,
    /// CPUID bits forced to 0 or 1 in every vCPU ([`crate::cpuid`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cpuid: Vec<crate::cpuid::CpuidRule>,
    /// Guest memory open to the host's KSM (MADV_MERGEABLE): identical
    /// pages of domains that allow it are shared. Off by default (a side
    /// channel between domains).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mergeable: bool,
    /// A seccomp filter on every VMM thread: the system calls a running
    /// VMM needs, any other kills it.
    #[serde(default)]
    pub seccomp: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_socket: Option<PathBuf>,
    /// Where to write the exit status and its reason on exit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_file: Option<PathBuf>,
    /// Confine the VMM once the domain is set up, before the guest runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jail: Option<JailSpec>,
}

/// The jail `domus run` enters once everything it needs is open and
/// before the guest's first instruction: a new root holding only
/// `devices`, an unprivileged user and group, no capabilities, rlimits and
/// Landlock. It must have been started in mount, PID, IPC and UTS
/// namespaces of its own (`domus daemon` and `domus run --jail` do that).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JailSpec {
    /// An empty directory the new root (a small read-only tmpfs) is
    /// mounted on.
    pub root: PathBuf,
    /// The user and group the VMM becomes (never 0).
    pub uid: u32,
    pub gid: u32,
    /// Device nodes bound into the new root at the same paths, under
    /// /dev (interface hot-plug opens /dev/net/tun).
    #[serde(default)]
    pub devices: Vec<PathBuf>,
    /// The largest file the VMM may write (RLIMIT_FSIZE, bytes): at least
    /// its largest disk.
    pub max_file_bytes: u64,
    /// The threads its user may have (RLIMIT_NPROC).
    pub max_threads: u64,
    /// A Unix socket, bound before the jail is entered, on which the
    /// supervisor passes descriptors of files the VMM can no longer open
    /// (hot-plugged disks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fd_socket: Option<PathBuf>,
}

impl Checked for JailSpec {
    fn check(&self) -> Result<(), String> {
        if !self.root.is_absolute() {
            return Err(format!(
                "jail root {}: give an absolute path",
                self.root.display()
            ));
        }
        if self.uid == 0 || self.gid == 0 || self.uid == u32::MAX || self.gid == u32::MAX {
            return Err("the jail's uid and gid must be neither 0 nor 4294967295".into());
        }
        for d in &self.devices {
            let ok = d.is_absolute()
                && d.starts_with("/dev")
                && d.components()
                    .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
            if !ok {
                return Err(format!(
                    "jail device {}: only paths under /dev, without . or ..",
                    d.display()
                ));
            }
        }
        if self.max_threads == 0 {
            return Err("the jail needs max_threads of at least 1".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_body;

    #[test]
    fn vsock_cids() {
        assert_eq!(parse_vsock("cid=3"), Ok(3));
        assert_eq!(parse_vsock("4294967294"), Ok(u64::from(u32::MAX) - 1));
        for bad in ["cid=2", "0", "cid=4294967295", "cid=x", "tap=1", ""] {
            assert!(parse_vsock(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("512"), Ok(512 << 20));
        assert_eq!(parse_size("2048k"), Ok(2 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("64MB"), Ok(64 << 20));
        for bad in [
            "",
            "M",
            "12X",
            "-1G",
            "1.5G",
            "99999999999999999999",
            "17179869184T",
        ] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn disks_in_either_form() {
        let d: DiskSpec = "a.raw,ro,id=root,bw=10M,iops=500".parse().unwrap();
        assert_eq!(
            d,
            DiskSpec {
                path: "a.raw".into(),
                format: DiskFormat::Raw,
                read_only: true,
                id: Some("root".into()),
                rate_limit: RateLimit {
                    bandwidth: Some(10 << 20),
                    iops: Some(500)
                },
                passed: None,
                passed_backing: Vec::new(),
            }
        );
        let q: DiskSpec = "o.qcow2,format=qcow2".parse().unwrap();
        assert_eq!(q.format, DiskFormat::Qcow2);
        assert_eq!(serde_json::to_value(&q).unwrap()["format"], "qcow2");
        assert!("o.qcow2,format=vmdk".parse::<DiskSpec>().is_err());
        assert_eq!(
            "a,bw=4096"
                .parse::<DiskSpec>()
                .unwrap()
                .rate_limit
                .bandwidth,
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
            assert!(bad.parse::<DiskSpec>().is_err(), "{bad}");
        }
        // The object form round-trips and is checked like the text.
        let json = serde_json::to_string(&d).unwrap();
        #[derive(Deserialize)]
        struct Holder {
            #[serde(deserialize_with = "either_opt")]
            disk: Option<DiskSpec>,
        }
        let h: Holder = serde_json::from_str(&format!(r#"{{"disk": {json}}}"#)).unwrap();
        assert_eq!(h.disk, Some(d));
        let h: Holder = serde_json::from_str(r#"{"disk": "/x,ro"}"#).unwrap();
        assert!(h.disk.unwrap().read_only);
        let e = serde_json::from_str::<Holder>(r#"{"disk": {"path": "/x", "size": 1}}"#)
            .err()
            .unwrap();
        assert!(e.to_string().contains("unknown field `size`"), "{e}");
        let e = serde_json::from_str::<Holder>(r#"{"disk": {"path": "/x", "id": "a b"}}"#)
            .err()
            .unwrap();
        assert!(e.to_string().contains("printable"), "{e}");
    }

    #[test]
    fn interfaces_in_either_form() {
        let n: NetSpec = "tap=tap0,mac=52:54:00:00:00:0A,bw=10M,pps=1000"
            .parse()
            .unwrap();
        assert_eq!(n.tap, "tap0");
        assert_eq!(n.mac.as_deref(), Some("52:54:00:00:00:0a"));
        assert_eq!(n.rate_limit.bandwidth, Some(10 << 20));
        assert_eq!(n.rate_limit.iops, Some(1000));
        assert_eq!(n.mrg_rxbuf, None, "the VMM's default unless asked");
        let n: NetSpec = "tap=t,mrg_rxbuf=off".parse().unwrap();
        assert_eq!(n.mrg_rxbuf, Some(false));
        assert_eq!(serde_json::to_value(&n).unwrap()["mrg_rxbuf"], false);
        assert_eq!(n.indirect_desc, None, "the VMM's default unless asked");
        let n: NetSpec = "tap=t,indirect_desc=0".parse().unwrap();
        assert_eq!(n.indirect_desc, Some(false));
        assert_eq!(serde_json::to_value(&n).unwrap()["indirect_desc"], false);
        for bad in [
            "",
            "tap=t,mrg_rxbuf=maybe",
            "tap=t,indirect_desc=",
            "mac=52:54:00:00:00:01",
            "tap=",
            "tap=t,mac=01:00:00:00:00:00",
            "tap=t,mac=zz",
            "tap=t,pps=x",
            "tap=t,colour=red",
        ] {
            assert!(bad.parse::<NetSpec>().is_err(), "{bad}");
        }
        assert_eq!(
            parse_mac("02:aB:00:ff:10:09"),
            Some([2, 0xab, 0, 0xff, 0x10, 9])
        );
        for bad in [
            "",
            "02:ab:00:ff:10",
            "02:ab:00:ff:10:09:01",
            "2:ab:00:ff:10:09",
            "zz:ab:00:ff:10:09",
        ] {
            assert_eq!(parse_mac(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_vm_spec_takes_the_flags_defaults_and_refuses_what_it_does_not_know() {
        let s: VmSpec = parse_body(
            br#"{"kernel": "/k", "disks": ["/a,ro", {"path": "/b"}], "nets": ["tap=t0"],
                 "console": {"file": "/c.log"}}"#,
        )
        .unwrap();
        assert_eq!((s.name.as_str(), s.vcpus, s.memory_mib), ("domain", 1, 256));
        assert_eq!(s.cmdline, "console=ttyS0 panic=-1");
        assert!(s.rng && !s.balloon && !s.prefault);
        assert_eq!(s.disks.len(), 2);
        assert!(s.disks[0].read_only && !s.disks[1].read_only);
        assert_eq!(s.console, ConsoleSpec::File("/c.log".into()));
        let back: VmSpec = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
        let e = parse_body::<VmSpec>(br#"{"kernel": "/k", "cpus": 2}"#).unwrap_err();
        assert!(e.contains("unknown field `cpus`"), "{e}");
        assert!(
            parse_body::<VmSpec>(br#"{"vcpus": 2}"#).is_err(),
            "no kernel"
        );
        assert!(parse_body::<VmSpec>(br#"{"kernel": "/k", "nets": ["mac=1"]}"#).is_err());
        assert_eq!("file:/x".parse(), Ok(ConsoleSpec::File("/x".into())));
        assert!("file:".parse::<ConsoleSpec>().is_err());
        assert!("tty".parse::<ConsoleSpec>().is_err());
    }
}
