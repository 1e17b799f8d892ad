//! The host end of an interface: a Linux tap device opened with a vnet
//! header, the offloads it is told the guest accepts, and MAC addresses.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;

use super::{F_GUEST_CSUM, F_GUEST_ECN, F_GUEST_TSO4, F_GUEST_TSO6, HDR_LEN};

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
const TUNSETVNETHDRSZ: libc::c_ulong = 0x4004_54d8;
const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_VNET_HDR: libc::c_short = 0x4000;
const TUN_F_CSUM: u32 = 0x01;
const TUN_F_TSO4: u32 = 0x02;
const TUN_F_TSO6: u32 = 0x04;
const TUN_F_TSO_ECN: u32 = 0x08;

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("tap name '{0}' is not 1 to 15 characters of [A-Za-z0-9_.-]")]
    BadName(String),
    #[error("tap {name}: {what}: {source}")]
    Tap {
        name: String,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

pub fn format_mac(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// A stable, locally administered MAC for a tap without one: 52:54:00 and
/// three bytes of a hash of the tap name.
pub fn default_mac(tap: &str) -> [u8; 6] {
    let h = tap
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        })
        .to_le_bytes();
    [0x52, 0x54, 0x00, h[0], h[1], h[2]]
}

/// An open tap device.
pub struct Tap {
    pub(super) file: File,
    pub name: String,
}

#[repr(C)]
struct IfReq {
    name: [u8; 16],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// The error of step `what` on tap `name`.
fn tap_err<'a>(name: &'a str, what: &'static str) -> impl FnOnce(std::io::Error) -> NetError + 'a {
    move |source| NetError::Tap {
        name: name.into(),
        what,
        source,
    }
}

/// A tap's name: 1 to 15 letters, digits, `_`, `.` or `-`.
fn check_name(name: &str) -> Result<(), NetError> {
    let ok = !name.is_empty()
        && name.len() < 16
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(NetError::BadName(name.into()))
    }
}

impl Tap {
    /// Opens (or creates) the tap `name` with a 12-byte vnet header,
    /// non-blocking.
    pub fn open(name: &str) -> Result<Self, NetError> {
        check_name(name)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")
            .map_err(tap_err(name, "opening /dev/net/tun"))?;
        Self::attach(file, name)
    }

    /// The tap `name` on `file`, an open /dev/net/tun (made non-blocking
    /// here).
    pub fn attach(file: File, name: &str) -> Result<Self, NetError> {
        check_name(name)?;
        let err = |what| tap_err(name, what);
        // SAFETY: fcntl(2) on a descriptor we own, setting status flags.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) } < 0 {
            return Err(err("O_NONBLOCK")(std::io::Error::last_os_error()));
        }
        let mut req = IfReq {
            name: [0; 16],
            flags: IFF_TAP | IFF_NO_PI | IFF_VNET_HDR,
            _pad: [0; 22],
        };
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        // SAFETY: TUNSETIFF reads and writes an ifreq; `req` is one, laid
        // out as the kernel's (name, flags, padding to 40 bytes).
        if unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF as _, &mut req) } < 0 {
            return Err(err("TUNSETIFF")(std::io::Error::last_os_error()));
        }
        let size: libc::c_int = HDR_LEN as libc::c_int;
        // SAFETY: TUNSETVNETHDRSZ reads one int from the pointer.
        if unsafe { libc::ioctl(file.as_raw_fd(), TUNSETVNETHDRSZ as _, &size) } < 0 {
            return Err(err("TUNSETVNETHDRSZ")(std::io::Error::last_os_error()));
        }
        let tap = Self {
            file,
            name: name.into(),
        };
        tap.set_offload(0).map_err(err("TUNSETOFFLOAD"))?;
        Ok(tap)
    }

    /// Tells the tap which offloads the reader (the guest) accepts.
    pub fn set_offload(&self, flags: u32) -> std::io::Result<()> {
        // SAFETY: TUNSETOFFLOAD takes its argument by value.
        let r = unsafe {
            libc::ioctl(
                self.file.as_raw_fd(),
                TUNSETOFFLOAD as _,
                flags as libc::c_ulong,
            )
        };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

/// The TUN_F_* flags for the guest features the driver accepted.
pub fn offload_flags(features: u64) -> u32 {
    let mut f = 0;
    if features & F_GUEST_CSUM != 0 {
        f |= TUN_F_CSUM;
        if features & F_GUEST_TSO4 != 0 {
            f |= TUN_F_TSO4;
        }
        if features & F_GUEST_TSO6 != 0 {
            f |= TUN_F_TSO6;
        }
        if features & F_GUEST_ECN != 0 && f & (TUN_F_TSO4 | TUN_F_TSO6) != 0 {
            f |= TUN_F_TSO_ECN;
        }
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs() {
        assert_eq!(
            format_mac(&[2, 0xab, 0, 0xff, 0x10, 9]),
            "02:ab:00:ff:10:09"
        );
        let m = default_mac("tap0");
        assert_eq!(&m[..3], &[0x52, 0x54, 0]);
        assert_ne!(default_mac("tap1"), m);
    }

    #[test]
    fn offloads_follow_the_guest_features() {
        assert_eq!(offload_flags(0), 0);
        assert_eq!(offload_flags(F_GUEST_TSO4), 0, "TSO needs checksum offload");
        assert_eq!(
            offload_flags(F_GUEST_CSUM | F_GUEST_TSO4 | F_GUEST_TSO6 | F_GUEST_ECN),
            TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN
        );
    }

    #[test]
    fn tap_names_are_checked_before_any_syscall() {
        for bad in ["", "a/b", "this-name-is-too-long", "sp ace"] {
            assert!(matches!(Tap::open(bad), Err(NetError::BadName(_))), "{bad}");
        }
    }
}
